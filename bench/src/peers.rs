//! oncebox and its peers, Restate and DBOS, on one workload (`--peers`): one durable step that
//! makes one idempotent POST /payments to the example provider, its `Idempotency-Key` derived
//! from the step. Each system runs the same steps, in the same order: a warm-up, `n` one after
//! another (p50, p99), then 64 concurrent callers (steps per second). A step's latency is taken
//! from the caller's request to the durable answer, as each system's users call it: oncebox and
//! DBOS are libraries (the step is a call in the caller's process: `Host::call`, a DBOS workflow
//! function), Restate is a server (the step is an HTTP request to its ingress).
//!
//! One provider counts for all of them: after each system, every one of its steps must have been
//! charged exactly once, or the run fails. An fsync probe runs before each system, so that a run
//! says how busy the disk was for each.
//!
//! The peers are installed on first use under `<dir>/peers/` from the pins in `bench/peers/`,
//! before anything is measured; a peer whose toolchain is missing, whose install fails or whose
//! server cannot be set up is skipped, said in one line. `oncebox_api` is one more row: oncebox
//! behind its HTTP API, reached by the same client as Restate's ingress (`api.rs`).

mod api;
mod dbos;
mod report;
mod restate;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use oncebox_example_provider::ProviderHandle;
use serde::Serialize;

use crate::report::{Machine, PgSettings, Target};
use crate::stats::{self, Latency};
use crate::{baselines, host_runs};
pub use report::{PeersResults, print};

/// How many steps a system runs, and how.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    /// Steps before the measured ones, not timed (a peer's first steps load code and open pools).
    pub warmup: usize,
    /// Steps timed one after another.
    pub n: usize,
    /// Concurrent callers, each running `each` steps one after another.
    pub callers: usize,
    pub each: usize,
}

impl Workload {
    /// Every order id of a system's run, which is also its steps' ids (DBOS's workflow ids,
    /// Restate's idempotency keys, oncebox's step ids): `P-w{i}`, `P-s{i}`, `P-c{c}-{i}`.
    fn orders(&self, prefix: &str) -> Vec<String> {
        let warmup = (0..self.warmup).map(|i| format!("{prefix}-w{i}"));
        let sequential = (0..self.n).map(|i| format!("{prefix}-s{i}"));
        let concurrent = (0..self.callers).flat_map(|c| (0..self.each).map(move |i| format!("{prefix}-c{c}-{i}")));
        warmup.chain(sequential).chain(concurrent).collect()
    }
}

/// What one system measured: the sequential steps' latency (microseconds) and the steps per
/// second of the concurrent callers.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Measured {
    pub latency_us: Latency,
    pub steps_per_s: f64,
}

/// One system's row: what ran, with what, how busy the disk was just before, and what it measured
/// (`None`: skipped, with why).
#[derive(Debug, Serialize)]
pub struct System {
    pub name: &'static str,
    pub version: String,
    pub settings: String,
    /// The fsync probe (4 KiB write + fdatasync) run just before this system.
    pub fsync_us: Latency,
    pub measured: Option<Measured>,
    pub skipped: Option<String>,
}

/// Runs the comparison: oncebox, then Restate, DBOS on SQLite and DBOS on PostgreSQL.
pub async fn run(root: &Path, dir: &Path, cache: &Path, quick: bool) -> anyhow::Result<PeersResults> {
    let w = if quick {
        Workload { warmup: 2, n: 20, callers: 64, each: 2 }
    } else {
        Workload { warmup: 20, n: 300, callers: 64, each: 25 }
    };
    let probes = if quick { 20 } else { 300 };
    let peers = root.join("peers");
    std::fs::create_dir_all(&peers).with_context(|| format!("creating {}", peers.display()))?;
    // Both peers are installed before anything is measured, and the installs' writes flushed, so
    // that a first run's downloads do not land on the disk under the measures.
    let restate = restate::install(&peers);
    let dbos = dbos::install(&peers);
    let _ = Command::new("sync").status();
    let mut systems = Vec::new();

    eprintln!("measuring oncebox...");
    let b = host_runs::start(dir, cache).await?;
    let provider = b.provider.clone();
    let fsync_us = baselines::fsync(dir, probes)?;
    let before = provider.totals().payments;
    let host = b.host.clone();
    let measured = drive(&w, "oncebox", move |order| {
        let host = host.clone();
        async move { host_runs::charge(&host, &order).await }
    })
    .await?;
    count(&provider, "oncebox", &w.orders("oncebox"), before)?;
    systems.push(System {
        name: "oncebox",
        version: format!("oncebox {}", env!("CARGO_PKG_VERSION")),
        settings: "the `charge` tool (Rust component) on a redb ledger file in the bench's directory, one host in the \
                   caller's process (`Host::call`), default engine settings"
            .into(),
        fsync_us,
        measured: Some(measured),
        skipped: None,
    });

    eprintln!("measuring oncebox behind its HTTP API...");
    let fsync_us = baselines::fsync(dir, probes)?;
    let before = provider.totals().payments;
    let base = api::serve(&b.host, dir).await?;
    let measured = api::measure(&base, &w, "oncebox-api").await?;
    count(&provider, "oncebox behind its API", &w.orders("oncebox-api"), before)?;
    systems.push(System {
        name: "oncebox_api",
        version: format!("oncebox {}", env!("CARGO_PKG_VERSION")),
        settings: "the same host behind `oncebox serve`'s router (`POST /v1/calls`) on loopback, in the bench's \
                   process; the client as Restate's"
            .into(),
        fsync_us,
        measured: Some(measured),
        skipped: None,
    });

    eprintln!("measuring Restate...");
    let fsync_us = baselines::fsync(dir, probes)?;
    let before = provider.totals().payments;
    systems.push(match &restate {
        Err(e) => skipped("restate", fsync_us, "cannot install Restate", e),
        Ok(installed) => match restate::Server::start(installed, dir, &provider.base_url()).await {
            Err(e) => skipped("restate", fsync_us, "cannot start Restate", &e),
            Ok(server) => {
                let measured = restate::measure(&server, &w, "restate").await;
                let (version, settings) = (server.version(), server.settings());
                drop(server);
                let measured = measured?;
                count(&provider, "Restate", &w.orders("restate"), before)?;
                System { name: "restate", version, settings, fsync_us, measured: Some(measured), skipped: None }
            }
        },
    });

    eprintln!("measuring DBOS on SQLite...");
    let fsync_us = baselines::fsync(dir, probes)?;
    let before = provider.totals().payments;
    systems.push(match &dbos {
        Err(e) => skipped("dbos_sqlite", fsync_us, "cannot install DBOS", e),
        Ok(installed) => {
            let db = dir.join("dbos.sqlite");
            let url = format!("sqlite:///{}", absolute(&db)?.display());
            let (version, measured, synchronous) =
                installed.measure(&url, "dbos-sqlite", &provider.base_url(), &w, dir).await?;
            count(&provider, "DBOS on SQLite", &w.orders("dbos-sqlite"), before)?;
            System {
                name: "dbos_sqlite",
                version,
                settings: format!("system database: SQLite ({})", dbos::sqlite_settings(&db, &synchronous)),
                fsync_us,
                measured: Some(measured),
                skipped: None,
            }
        }
    });

    let mut pg_settings = None;
    eprintln!("measuring DBOS on PostgreSQL...");
    let fsync_us = baselines::fsync(dir, probes)?;
    let before = provider.totals().payments;
    systems.push(match (&dbos, oncebox_pg_cluster::installed()) {
        (Err(e), _) => skipped("dbos_pg", fsync_us, "cannot install DBOS", e),
        (Ok(_), false) => {
            eprintln!("PostgreSQL is not installed (no initdb and postgres found): skipping DBOS on PostgreSQL");
            System::skipped("dbos_pg", fsync_us, "PostgreSQL is not installed".into())
        }
        (Ok(installed), true) => {
            let url = oncebox_pg_cluster::fresh_database().await;
            let settings = oncebox_pg_cluster::settings(&url).await?;
            let url = url.replacen("postgres://", "postgresql://", 1);
            let (version, measured, _) = installed.measure(&url, "dbos-pg", &provider.base_url(), &w, dir).await?;
            count(&provider, "DBOS on PostgreSQL", &w.orders("dbos-pg"), before)?;
            let system = System {
                name: "dbos_pg",
                version,
                settings: format!(
                    "system database: PostgreSQL {} (fsync={}, synchronous_commit={}, max_connections={}; the bench's \
                     throwaway local cluster on loopback), DBOS's defaults (a pool of 20 connections)",
                    settings.server_version, settings.fsync, settings.synchronous_commit, settings.max_connections
                ),
                fsync_us,
                measured: Some(measured),
                skipped: None,
            };
            pg_settings = Some(settings.into());
            system
        }
    });

    b.provider.shutdown().await;
    Ok(results(systems, pg_settings, w, dir))
}

impl System {
    fn skipped(name: &'static str, fsync_us: Latency, why: String) -> System {
        System { name, version: String::new(), settings: String::new(), fsync_us, measured: None, skipped: Some(why) }
    }
}

/// A peer that could not be installed or set up: one line now, and a row that says why.
fn skipped(name: &'static str, fsync_us: Latency, what: &str, e: &anyhow::Error) -> System {
    let why = format!("{what}: {}", first_line(e));
    eprintln!("{why}: skipping it");
    System::skipped(name, fsync_us, why)
}

fn first_line(e: &anyhow::Error) -> String {
    format!("{e:#}").lines().next().unwrap_or_default().to_string()
}

/// Runs the workload with `step` as the step: the warm-up, `n` timed one after another, then
/// `callers` concurrent callers of `each` steps.
pub async fn drive<F, Fut>(w: &Workload, prefix: &str, step: F) -> anyhow::Result<Measured>
where
    F: Fn(String) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    // A server may take a moment to route its first request (Restate's ingress learns of the
    // deployment after the admin API answered). A warm-up step is retried meanwhile: every
    // system deduplicates a step by its id, and the provider counts what it committed.
    for i in 0..w.warmup {
        let id = format!("{prefix}-w{i}");
        patiently(Duration::from_secs(30), Duration::from_millis(100), || step(id.clone())).await?;
    }
    let latency_us = host_runs::timed(w.n, |i| step(format!("{prefix}-s{i}"))).await?;
    let start = Instant::now();
    let tasks: Vec<_> = (0..w.callers)
        .map(|c| {
            let (step, prefix, each) = (step.clone(), prefix.to_string(), w.each);
            tokio::spawn(async move {
                for i in 0..each {
                    step(format!("{prefix}-c{c}-{i}")).await?;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for task in tasks {
        task.await.context("a caller panicked")??;
    }
    Ok(Measured { latency_us, steps_per_s: stats::rate(w.callers * w.each, start.elapsed()) })
}

/// Counts at the provider: every one of `orders` charged exactly once, and no other payment since
/// `before`. A step committed twice fails the run.
fn count(provider: &ProviderHandle, system: &str, orders: &[String], before: u64) -> anyhow::Result<()> {
    let mut missing = Vec::new();
    for order in orders {
        match provider.counts(order).payments {
            1 => {}
            0 => missing.push(order.as_str()),
            n => bail!("{system} committed step {order} {n} times: the provider counted {n} payments for it"),
        }
    }
    if let Some(first) = missing.first() {
        bail!(
            "{system}: the provider counted no payment for {} of its {} steps (first: {first})",
            missing.len(),
            orders.len()
        );
    }
    let charged = provider.totals().payments - before;
    anyhow::ensure!(
        charged == orders.len() as u64,
        "{system}: the provider counted {charged} payments for {} steps",
        orders.len()
    );
    Ok(())
}

/// The JSON and the table: the keys, each system's row, and the goals judged.
fn results(systems: Vec<System>, pg_settings: Option<PgSettings>, w: Workload, dir: &Path) -> PeersResults {
    let of = |name: &str| systems.iter().find(|s| s.name == name).and_then(|s| s.measured);
    let p50 = |name: &str| of(name).map(|m| m.latency_us.p50 / 1000.0);
    let rate = |name: &str| of(name).map(|m| m.steps_per_s);
    // The goals, oncebox in the caller's process against each peer; and oncebox behind
    // its API against Restate, the two reached over HTTP.
    let mut goals = Vec::new();
    let pairs =
        [("oncebox", "restate"), ("oncebox", "dbos_sqlite"), ("oncebox", "dbos_pg"), ("oncebox_api", "restate")];
    for (ours, peer) in pairs {
        let (Some(o), Some(p)) = (of(ours), of(peer)) else { continue };
        let key = if ours == "oncebox" { "oncebox_http" } else { ours };
        let (ratio, below) = (o.steps_per_s / p.steps_per_s, p.latency_us.p50 / o.latency_us.p50);
        goals.push(Target {
            target: format!("{key}_64 >= 10 x peer_{peer}_64"),
            met: ratio >= 10.0,
            measured: format!("{ratio:.1}x"),
        });
        goals.push(Target {
            target: format!("{key}_p50_ms <= peer_{peer}_p50_ms / 3"),
            met: below >= 3.0,
            measured: format!("{below:.1}x below"),
        });
    }
    PeersResults {
        oncebox_http_p50_ms: p50("oncebox"),
        oncebox_http_64: rate("oncebox"),
        oncebox_api_p50_ms: p50("oncebox_api"),
        oncebox_api_64: rate("oncebox_api"),
        peer_restate_p50_ms: p50("restate"),
        peer_restate_64: rate("restate"),
        peer_dbos_sqlite_p50_ms: p50("dbos_sqlite"),
        peer_dbos_sqlite_64: rate("dbos_sqlite"),
        peer_dbos_pg_p50_ms: p50("dbos_pg"),
        peer_dbos_pg_64: rate("dbos_pg"),
        workload: format!(
            "{} warm-up steps, {} sequential steps (p50, p99), {} concurrent callers of {} steps each",
            w.warmup, w.n, w.callers, w.each
        ),
        systems,
        pg_settings,
        goals,
        machine: Machine::here(dir),
    }
}

/// Runs `command` to the end, its output kept for the error: what an install step needs.
fn execute(command: &mut Command) -> anyhow::Result<()> {
    let shown = format!("{command:?}");
    let out = command.output().with_context(|| format!("cannot run {shown}"))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default();
        bail!("{shown} failed ({}): {last}", out.status);
    }
    Ok(())
}

/// The first line a command prints, or why there is none (it is not installed).
fn version_of(program: &str, arg: &str) -> anyhow::Result<String> {
    let out = Command::new(program).arg(arg).output().with_context(|| format!("{program} is not installed"))?;
    anyhow::ensure!(out.status.success(), "`{program} {arg}` failed ({})", out.status);
    Ok(String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or_default().trim().to_string())
}

/// Where the pinned peers live in the source tree (`bench/peers/`).
fn sources() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("peers")
}

/// Whether the install under `dir` was made from `pins` (kept in `dir/.installed-from` after a
/// successful install), so that a changed pin installs again.
fn installed_from(dir: &Path, pins: &str) -> bool {
    std::fs::read_to_string(dir.join(".installed-from")).is_ok_and(|stamp| stamp == pins)
}

fn mark_installed(dir: &Path, pins: &str) -> anyhow::Result<()> {
    std::fs::write(dir.join(".installed-from"), pins).with_context(|| format!("writing the stamp in {}", dir.display()))
}

fn absolute(path: &Path) -> anyhow::Result<PathBuf> {
    std::path::absolute(path).with_context(|| format!("the absolute path of {}", path.display()))
}

/// Waits `every` between tries of `attempt` until it succeeds or `limit` has passed; the last
/// error then. For a server that is starting, which says nothing when it is ready.
async fn patiently<T, Fut: Future<Output = anyhow::Result<T>>>(
    limit: Duration,
    every: Duration,
    mut attempt: impl FnMut() -> Fut,
) -> anyhow::Result<T> {
    let deadline = Instant::now() + limit;
    loop {
        match attempt().await {
            Ok(value) => return Ok(value),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => tokio::time::sleep(every).await,
        }
    }
}
