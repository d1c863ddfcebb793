//! DBOS Transact for Python, from PyPI: a venv under `peers/dbos-venv` with the pinned
//! `bench/peers/dbos/requirements.txt`, running `bench/peers/dbos/peer.py`, which runs the workload
//! in its own process (DBOS is a library) and prints its samples; the percentiles and the rate are
//! computed here, as for every system.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::Context;
use serde::Deserialize;

use super::{Measured, Workload, execute, installed_from, mark_installed, sources, version_of};
use crate::stats::{self, Latency};

/// The venv's python, with DBOS installed.
pub struct Installed {
    python: PathBuf,
    cpython: String,
}

/// A venv with the pinned requirements, made once per requirements file.
pub fn install(peers: &Path) -> anyhow::Result<Installed> {
    let cpython = version_of("python3", "--version")?;
    let requirements = sources().join("dbos/requirements.txt");
    let pins = std::fs::read_to_string(&requirements).context("reading bench/peers/dbos/requirements.txt")?;
    let venv = peers.join("dbos-venv");
    let python = venv.join("bin/python");
    if !installed_from(&venv, &pins) {
        eprintln!("installing DBOS from PyPI into {} (once)...", venv.display());
        let _ = std::fs::remove_dir_all(&venv);
        execute(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
        execute(
            Command::new(&python)
                .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r"])
                .arg(&requirements),
        )?;
        mark_installed(&venv, &pins)?;
    }
    Ok(Installed { python, cpython })
}

/// What `peer.py` prints.
#[derive(Deserialize)]
struct Printed {
    version: String,
    samples_s: Vec<f64>,
    concurrent_s: f64,
    /// SQLite's `PRAGMA synchronous` on a new connection of the process (DBOS does not set it).
    sqlite_synchronous: Option<String>,
}

impl Installed {
    /// The workload on the system database at `db` (a SQLAlchemy URL); the version, the measures,
    /// and for SQLite its synchronous level. `peer.py`'s own output goes to `dir/PREFIX.log`.
    pub async fn measure(
        &self,
        db: &str,
        prefix: &str,
        provider: &str,
        w: &Workload,
        dir: &Path,
    ) -> anyhow::Result<(String, Measured, String)> {
        let log = dir.join(format!("{prefix}.log"));
        let mut command = Command::new(&self.python);
        command.arg(sources().join("dbos/peer.py")).args(["--db", db, "--provider", provider, "--prefix", prefix]);
        for (flag, value) in [("--warmup", w.warmup), ("--n", w.n), ("--callers", w.callers), ("--each", w.each)] {
            command.arg(flag).arg(value.to_string());
        }
        command.stderr(std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?);
        let out = tokio::task::spawn_blocking(move || command.output()).await?.context("running peer.py")?;
        let stderr = std::fs::read_to_string(&log).unwrap_or_default();
        let last = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default();
        anyhow::ensure!(out.status.success(), "DBOS ({prefix}) failed ({}): {last}", out.status);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let line = stdout.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default();
        let printed: Printed = serde_json::from_str(line).with_context(|| format!("peer.py printed {line:?}"))?;
        let seconds = |s: f64| Duration::try_from_secs_f64(s).with_context(|| format!("peer.py printed {s} s"));
        let samples = printed.samples_s.iter().map(|&s| seconds(s)).collect::<anyhow::Result<_>>()?;
        let measured = Measured {
            latency_us: Latency::of(samples),
            steps_per_s: stats::rate(w.callers * w.each, seconds(printed.concurrent_s)?),
        };
        let mut settings = String::new();
        if let Some(synchronous) = printed.sqlite_synchronous {
            settings = format!("synchronous={synchronous}");
        }
        Ok((format!("dbos {}, {}", printed.version, self.cpython), measured, settings))
    }
}

/// How SQLite keeps the system database durable: its journal mode as the file says, and the
/// synchronous level the process's SQLite gives a connection (`peer.py` reads it).
pub fn sqlite_settings(db: &Path, synchronous: &str) -> String {
    let journal = rusqlite::Connection::open(db)
        .and_then(|c| c.query_row("PRAGMA journal_mode", [], |row| row.get::<_, String>(0)))
        .unwrap_or_else(|e| format!("unknown ({e})"));
    format!(
        "a file in the bench's directory, journal_mode={journal}, {synchronous} (SQLite's default: DBOS sets neither), \
         busy_timeout=30 s, BEGIN IMMEDIATE transactions"
    )
}
