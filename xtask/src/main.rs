//! `cargo xtask`: the project's own commands (the alias is in `.cargo/config.toml`), in the
//! matklad/cargo-xtask manner: Rust, so that a fresh machine needs only rustup and cargo.
//!
//! - `cargo xtask test [ARGS]`: every test. First what the tests need and a fresh machine lacks
//!   (`needs`: PostgreSQL's server, Chromium, Node.js, Python's venv, libfaketime) is installed with
//!   apt-get; then `cargo test --workspace [ARGS]` and the Python SDK's own unit tests. The venvs
//!   and `node_modules` the tests use are made by the tests themselves, on first use.
//! - `cargo xtask setup`: only the installing.
//!
//! The README prints `cargo xtask test`, and `.ci/run` runs that same command.

mod needs;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let command = args.next();
    let rest: Vec<String> = args.collect();
    let result = match command.as_deref() {
        Some("test") => needs::install_missing().and_then(|()| test(&rest)),
        Some("setup") => needs::install_missing(),
        _ => Err("usage: cargo xtask test [ARGS for cargo test] | cargo xtask setup".to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: {message}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace's root: this crate's parent.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// `cargo test --workspace ARGS`, then the Python SDK's glue outside a component (its behaviour
/// inside one is in tests/integration/languages.rs).
fn test(args: &[String]) -> Result<(), String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    run(Command::new(cargo).args(["test", "--workspace"]).args(args).current_dir(root()))?;
    run(Command::new("python3")
        .args(["-m", "unittest", "discover", "-s", "guest-sdk/python/tests"])
        .current_dir(root()))
}

/// Runs `command`, an error naming it unless it succeeds.
pub(crate) fn run(command: &mut Command) -> Result<(), String> {
    let shown = format!("{:?}", command).replace('"', "");
    match command.status() {
        Ok(status) if status.success() => Ok(()),
        Ok(status) => Err(format!("`{shown}` failed ({status})")),
        Err(error) => Err(format!("`{shown}` could not start: {error}")),
    }
}
