//! What the integration tests need from the machine beyond rustup and cargo, each with how to tell
//! it is there and the Debian package that brings it. The one list: `.ci/run` and the README's
//! test command both come here, and the tests name the same packages when one is missing
//! (tests/integration/support.rs, `require`).

use std::path::Path;
use std::process::{Command, Stdio};

/// One thing a test needs from the machine.
struct Need {
    what: &'static str,
    /// The Debian packages that bring it.
    packages: &'static [&'static str],
    present: fn() -> bool,
}

const NEEDS: [Need; 6] = [
    // The PostgreSQL backend's tests start their own throwaway cluster (test-support/pg-cluster).
    Need { what: "PostgreSQL's server (initdb)", packages: &["postgresql"], present: postgres },
    // The console's test drives Debian's browser headless with playwright-core (no browser download).
    Need { what: "Chromium", packages: &["chromium"], present: chromium },
    // playwright-core, the MCP conformance suite and componentize-js (the JavaScript tools).
    Need { what: "Node.js and npm", packages: &["nodejs", "npm"], present: node },
    // The MCP SDK client, schemathesis and componentize-py (the Python tools) run in venvs.
    Need { what: "Python's venv (with ensurepip)", packages: &["python3-venv"], present: venv },
    // A host whose own clock runs ahead, against the shared ledger's clock (multihost.rs).
    Need { what: "libfaketime", packages: &["faketime"], present: faketime },
    // The PostgreSQL ledger behind a connection pooler in front of the throwaway cluster.
    Need { what: "PgBouncer", packages: &["pgbouncer"], present: pgbouncer },
];

/// Installs with apt-get what the tests need and this machine lacks. Where apt-get is not there,
/// says what is missing and carries on: the tests that need it stop with one line naming it.
pub fn install_missing() -> Result<(), String> {
    let missing: Vec<&Need> = NEEDS.iter().filter(|need| !(need.present)()).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let packages: Vec<&str> = missing.iter().flat_map(|need| need.packages.iter().copied()).collect();
    let what: Vec<&str> = missing.iter().map(|need| need.what).collect();
    if !on_path("apt-get") {
        eprintln!(
            "xtask: missing {} (Debian packages: {}); no apt-get here, so the tests that need them will fail naming them",
            what.join(", "),
            packages.join(" ")
        );
        return Ok(());
    }
    eprintln!("xtask: installing {} (apt-get install {})", what.join(", "), packages.join(" "));
    let root = Command::new("id").arg("-u").output().is_ok_and(|out| out.stdout.starts_with(b"0\n"));
    let apt = |args: &[&str]| {
        let mut command = if root { Command::new("apt-get") } else { Command::new("sudo") };
        if !root {
            command.arg("apt-get");
        }
        command.args(args).env("DEBIAN_FRONTEND", "noninteractive");
        command
    };
    if !root && !on_path("sudo") {
        return Err(format!("missing {}: run `apt-get install {}` as root", what.join(", "), packages.join(" ")));
    }
    crate::run(&mut apt(&["update", "-qq"]))?;
    // dpkg's progress is noise in a test run; its errors still reach stderr.
    crate::run(apt(&["install", "-y", "-qq", "--no-install-recommends"]).args(&packages).stdout(Stdio::null()))?;
    match NEEDS.iter().find(|need| !(need.present)()) {
        Some(need) => Err(format!("{} is still missing after apt-get install {}", need.what, need.packages.join(" "))),
        None => Ok(()),
    }
}

fn postgres() -> bool {
    on_path("initdb")
        || std::fs::read_dir("/usr/lib/postgresql")
            .is_ok_and(|versions| versions.flatten().any(|version| version.path().join("bin/initdb").is_file()))
}

fn chromium() -> bool {
    std::env::var_os("CHROMIUM")
        .map_or_else(|| Path::new("/usr/bin/chromium").is_file(), |path| Path::new(&path).is_file())
}

fn node() -> bool {
    on_path("node") && on_path("npm")
}

/// Debian's python3 has the `venv` module without `ensurepip`, and `python3 -m venv` then fails.
fn venv() -> bool {
    Command::new("python3").args(["-c", "import ensurepip, venv"]).output().is_ok_and(|out| out.status.success())
}

/// Debian puts it in /usr/sbin, which a user's `PATH` may lack.
fn pgbouncer() -> bool {
    PGBOUNCER.iter().any(|path| Path::new(path).is_file()) || on_path("pgbouncer")
}

/// Where Debian's package puts PgBouncer.
const PGBOUNCER: [&str; 2] = ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"];

fn faketime() -> bool {
    Path::new("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1").exists()
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}
