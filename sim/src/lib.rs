//! oncebox's whole-system simulator. Each seed makes a workload and a world: orders of the order
//! workflow (stock, reserve, charge, fulfill with its approval, notify; refund and release as
//! compensations) and single calls of every class, from several concurrent callers, over the real
//! host, the real components and a real ledger; a downstream in process that lies as the seed
//! says; an operator who approves, rejects (racing the call), reconciles, settles by hand,
//! compensates, reloads components and runs `gc`; and crashes of the host at the pipeline's crash
//! points or at any moment, the ledger reopened after each. Time is simulated (a paused clock), so
//! settle windows, leases and retention cost nothing, and a guest's running time is spent on it
//! (a guest spinning past its deadline traps at the deadline on that clock). A checker then
//! judges the history by the downstream's own record ([`check`](mod@check)).
//!
//! What is deterministic, and what is not: the workload and the fault schedule are a pure function
//! of the seed ([`plan::Plan::digest`]), and so is every choice the world and the operator make
//! (drawn from the seed and the names of what they concern, never from arrival order). On redb the
//! run is on one thread with the clock paused, the ledger's calls finish before another task runs
//! (`paced`), and the host's retry jitter is derived from operation keys: a seed runs the same way
//! every time ([`SeedReport::history_digest`]). Not so for a quarter of the seeds, which run
//! `free` (the ledger's calls awaited, so that races inside the store can happen), nor on
//! `--ledger postgres` (the database's real clock, over a socket), with one host or several
//! (`--hosts N`: each its own pool, clock skew and crashes, the callers' calls spread over them):
//! those replay the same workload and faults, not always the same interleaving. One process runs one seed at a time (the
//! simulated clock is the process's).
//!
//! # Layout
//!
//! - `plan`: the seed's workload, downstream, crashes and operator; its digest.
//! - `world`: the downstream (through the host's hooks), and its record of what it committed.
//! - `drive/`: the host's lives and their hooks; `caller`: the orchestrators; `operator`: the
//!   people, and the last pass; `hosts`: several hosts on one database, behind a balancer.
//! - `history`: what happened, in order.
//! - `check`: the invariants, over the facts a seed left (`check/tests.rs`: each on a history made
//!   by hand).
//! - `clock`: the simulated wall clock; `paced`: the ledger store whose calls finish before any
//!   other task runs; `race`: a decision held back inside the store until a claim of its step
//!   has opened its snapshot (races inside the store on the seed's schedule); `pause`: an owner
//!   stopped dead past its lease while another takes its step over, then resumed (fenced).

pub mod check;
pub mod clock;
pub mod drive;
pub mod history;
pub mod paced;
pub mod pause;
pub mod plan;
pub mod race;
pub mod world;

use std::path::Path;

pub use check::{Violation, check};
pub use drive::LedgerKind;
pub use history::Entry;
pub use plan::{Cut, Plan};

/// What one seed came to.
#[derive(Debug)]
pub struct SeedReport {
    pub seed: u64,
    /// The seed ran `free` (see [`plan::Plan::free`]): its interleaving is not the seed's.
    pub free: bool,
    pub digest: String,
    pub operations: u64,
    pub faults: u64,
    pub violations: Vec<Violation>,
    pub history: Vec<Entry>,
}

impl SeedReport {
    /// SHA-256 of the history as printed: equal on two runs of a seed when the run was
    /// deterministic.
    pub fn history_digest(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut hash = Sha256::new();
        for entry in &self.history {
            hash.update(entry.to_string().as_bytes());
            hash.update(b"\n");
        }
        hex::encode(hash.finalize())
    }
}

/// Runs seed `seed`, less `cut`, on a runtime of its own (one thread; the clock paused on redb),
/// with components compiled into `cache`, on `hosts` hosts (several on PostgreSQL only).
pub fn run_seed(seed: u64, cut: &Cut, kind: LedgerKind, hosts: usize, cache: &Path) -> anyhow::Result<SeedReport> {
    let plan = Plan::new(seed).without(cut);
    let digest = plan.digest();
    let free = plan.free;
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().start_paused(kind == LedgerKind::Redb).build()?;
    let dir = tempfile::tempdir()?;
    let ran = runtime.block_on(async {
        let start = match kind {
            LedgerKind::Redb => clock::start(),
            LedgerKind::Postgres => oncebox_runtime::clock::now_ms(),
        };
        drive::run(plan, kind, hosts, dir.path(), cache.to_path_buf(), start).await
    })?;
    // The host's background tasks end with their runtime.
    runtime.shutdown_background();
    let violations = check(&ran.facts);
    Ok(SeedReport {
        seed,
        free,
        digest,
        operations: ran.operations,
        faults: ran.faults,
        violations,
        history: ran.history.entries(),
    })
}

/// The smallest cut of seed `seed` found that still breaks `invariant`: jobs and crashes are left
/// out one at a time, each kept out while the violation stays, until none can go (a greedy
/// shrink, as property testers do; the runs are deterministic, so a cut replays). `None` if the
/// whole plan is the smallest.
pub fn shrink(
    seed: u64,
    invariant: &str,
    kind: LedgerKind,
    hosts: usize,
    cache: &Path,
) -> anyhow::Result<Option<(Cut, SeedReport)>> {
    let plan = Plan::new(seed);
    let mut cut = Cut::default();
    let mut best = None;
    loop {
        let mut smaller = false;
        let candidates = (0..plan.jobs.len())
            .filter(|n| !cut.jobs.contains(n))
            .map(|n| (n, true))
            .chain((0..plan.crashes.len()).filter(|n| !cut.crashes.contains(n)).map(|n| (n, false)));
        for (n, job) in candidates.collect::<Vec<_>>() {
            let mut tried = cut.clone();
            if job {
                tried.jobs.insert(n);
            } else {
                tried.crashes.insert(n);
            }
            let report = run_seed(seed, &tried, kind, hosts, cache)?;
            if report.violations.iter().any(|v| v.invariant == invariant) {
                cut = tried;
                best = Some(report);
                smaller = true;
            }
        }
        if !smaller {
            return Ok(best.map(|report| (cut, report)));
        }
    }
}
