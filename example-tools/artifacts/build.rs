//! Compiles every tool crate to a `wasm32-wasip2` component, so `cargo test` and `cargo run -- demo`
//! need no manual build step (the pattern of wasmtime's test-programs artifacts).
//!
//! The tools are built by a nested `cargo build` into their own target directory: the outer cargo
//! holds the lock on the usual one.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const TARGET: &str = "wasm32-wasip2";

/// (constant name, package, source directory relative to the workspace root)
const TOOLS: &[(&str, &str, &str)] = &[
    ("STOCK", "tool-stock", "example-tools/stock"),
    ("RESERVE", "tool-reserve", "example-tools/reserve"),
    ("RELEASE", "tool-release", "example-tools/release"),
    ("CHARGE", "tool-charge", "example-tools/charge"),
    ("REFUND", "tool-refund", "example-tools/refund"),
    ("FULFILL", "tool-fulfill", "example-tools/fulfill"),
    ("NOTIFY", "tool-notify", "example-tools/notify"),
    ("LYING_READER", "test-lying-reader", "test-tools/lying-reader"),
    ("SOCKET_USER", "test-socket-user", "test-tools/socket-user"),
    ("PANICKY", "test-panicky", "test-tools/panicky"),
    ("HOSTILE", "test-hostile", "test-tools/hostile"),
    ("DIR_USER", "test-dir-user", "test-tools/dir-user"),
    ("KEY_CHANGER", "test-key-changer", "test-tools/key-changer"),
    ("SELF_RETRIER", "test-self-retrier", "test-tools/self-retrier"),
];

fn main() {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = manifest_dir.join("../..").canonicalize().expect("workspace root exists");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    // OUT_DIR is <target>/<profile>/build/<pkg>-<hash>/out; keep the guests beside, in <target>/guests,
    // so every profile and every rebuild of this crate shares one warm guest build.
    let guest_target = out_dir.ancestors().nth(4).map_or_else(|| out_dir.join("guests"), |t| t.join("guests"));

    for dir in ["guest-sdk", "Cargo.toml", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    for (_, _, dir) in TOOLS {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }

    ensure_target();

    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.arg("build")
        .arg("--manifest-path")
        .arg(root.join("Cargo.toml"))
        .args(["--target", TARGET, "--profile", "guest"])
        .arg("--target-dir")
        .arg(&guest_target);
    for (_, package, _) in TOOLS {
        cmd.args(["-p", package]);
    }
    // What the outer build passes to its own rustc must not leak into the guest build.
    for var in
        ["CARGO_ENCODED_RUSTFLAGS", "RUSTFLAGS", "RUSTC_WORKSPACE_WRAPPER", "CARGO_TARGET_DIR", "CARGO_BUILD_TARGET"]
    {
        cmd.env_remove(var);
    }
    let status = cmd.status().expect("run cargo to build the tool components");
    assert!(status.success(), "building the tool components failed (see the cargo output above)");

    let mut consts = String::new();
    let mut embedded = String::from(
        "/// The components' bytes, for a binary that must work without this build's target directory.\npub mod embedded {\n",
    );
    for (name, package, _) in TOOLS {
        let file = guest_target.join(TARGET).join("guest").join(format!("{}.wasm", package.replace('-', "_")));
        assert!(file.exists(), "cargo built {package} but {} is missing", file.display());
        let path = format!("{:?}", file.display().to_string());
        consts.push_str(&format!("pub const {name}: &str = {path};\n"));
        embedded.push_str(&format!("    pub const {name}: &[u8] = include_bytes!({path});\n"));
    }
    consts.push_str(&embedded);
    consts.push_str("}\n");
    std::fs::write(out_dir.join("artifacts.rs"), consts).expect("write artifacts.rs");
}

/// Installs the wasm32-wasip2 target with rustup when it is missing, or stops with the command.
fn ensure_target() {
    if target_installed() {
        return;
    }
    println!("cargo:warning=installing the {TARGET} target with rustup");
    let added = Command::new("rustup").args(["target", "add", TARGET]).status().is_ok_and(|s| s.success());
    assert!(added && target_installed(), "the {TARGET} target is missing; install it with: rustup target add {TARGET}");
}

fn target_installed() -> bool {
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let Ok(output) = Command::new(rustc).args(["--print", "sysroot"]).output() else {
        return false;
    };
    let sysroot = String::from_utf8_lossy(&output.stdout).trim().to_string();
    Path::new(&sysroot).join("lib/rustlib").join(TARGET).exists()
}
