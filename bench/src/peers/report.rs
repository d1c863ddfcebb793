//! What `--peers` answers: the keys, each system's row and the goals judged (JSON), or the
//! table.

use serde::Serialize;

use crate::report::{Machine, PgSettings, Target};

/// `--peers`: oncebox and its peers on one workload (`peers.rs`). The first keys are the issue's:
/// p50 in milliseconds, `_64` in steps per second at 64 callers; `null` for a peer skipped.
#[derive(Debug, Serialize)]
pub struct PeersResults {
    pub oncebox_http_p50_ms: Option<f64>,
    pub oncebox_http_64: Option<f64>,
    /// oncebox behind its HTTP API (`POST /v1/calls`), reached as Restate's ingress is.
    pub oncebox_api_p50_ms: Option<f64>,
    pub oncebox_api_64: Option<f64>,
    pub peer_restate_p50_ms: Option<f64>,
    pub peer_restate_64: Option<f64>,
    pub peer_dbos_sqlite_p50_ms: Option<f64>,
    pub peer_dbos_sqlite_64: Option<f64>,
    pub peer_dbos_pg_p50_ms: Option<f64>,
    pub peer_dbos_pg_64: Option<f64>,
    pub workload: String,
    /// Each system: version, settings, the fsync probe before it, p50 and p99, steps per second.
    pub systems: Vec<super::System>,
    /// What the PostgreSQL server under DBOS said it runs with (`SHOW`).
    pub pg_settings: Option<PgSettings>,
    pub goals: Vec<Target>,
    pub machine: Machine,
}

pub fn print(r: &PeersResults) {
    println!("| system | fsync_us p50 before | p50 ms | p99 ms | 64 callers, steps/s |");
    println!("|---|---:|---:|---:|---:|");
    for s in &r.systems {
        match (&s.measured, &s.skipped) {
            (Some(m), _) => println!(
                "| {} | {:.1} | {:.2} | {:.2} | {:.0} |",
                s.name,
                s.fsync_us.p50,
                m.latency_us.p50 / 1000.0,
                m.latency_us.p99 / 1000.0,
                m.steps_per_s
            ),
            (None, why) => {
                println!("| {} | {:.1} | skipped: {} | | |", s.name, s.fsync_us.p50, why.as_deref().unwrap_or("-"))
            }
        }
    }
    println!("\nworkload: {}", r.workload);
    for s in r.systems.iter().filter(|s| s.measured.is_some()) {
        println!("\n{}: {}\n  {}", s.name, s.version, s.settings);
    }
    println!("\n| goal | met | measured |");
    println!("|---|---|---|");
    for t in &r.goals {
        println!("| {} | {} | {} |", t.target, if t.met { "yes" } else { "no" }, t.measured);
    }
    let m = &r.machine;
    println!("\nmachine: {} cores, {}, {}, files in {}", m.cores, m.cpu, m.os, m.dir);
}
