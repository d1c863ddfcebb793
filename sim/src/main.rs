//! `oncebox-sim --seeds N` runs seeds 1..=N (`--from` moves the start), `--seed S` runs one; each
//! prints its digest and what it found. A violation is shrunk (jobs and crashes left out while it
//! stays), then printed with the history of what it concerns and the command that replays it. The
//! last line is `sim: N seeds, M operations, F faults, V violations`; the exit status is 1 if any
//! seed broke an invariant, 2 if the simulation itself failed.

use std::collections::BTreeSet;
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::Duration;

use clap::Parser;

use oncebox_sim::{Cut, Entry, LedgerKind, SeedReport, Violation, run_seed, shrink};

#[derive(Debug, Parser)]
#[command(name = "oncebox-sim", about = "Seeded whole-system simulation of oncebox, every history checked")]
struct Args {
    /// How many seeds to run (from `--from`).
    #[arg(long, default_value_t = 30)]
    seeds: u64,
    /// The first seed of `--seeds`.
    #[arg(long, default_value_t = 1)]
    from: u64,
    /// Run this one seed (and print its whole history).
    #[arg(long)]
    seed: Option<u64>,
    /// The ledger the host runs on.
    #[arg(long, value_enum, default_value_t = LedgerKind::Redb)]
    ledger: LedgerKind,
    /// How many hosts share the ledger (more than one on PostgreSQL only): each its own pool,
    /// clock skew and crashes, the callers' calls spread over them.
    #[arg(long, default_value_t = 1)]
    hosts: usize,
    /// Stop at the first seed that breaks an invariant.
    #[arg(long)]
    stop: bool,
    /// Leave these jobs of the plan out (by index, comma-separated): a shrunk seed's replay.
    #[arg(long, value_delimiter = ',')]
    drop_jobs: Vec<usize>,
    /// Leave these crashes of the plan out (by index, comma-separated).
    #[arg(long, value_delimiter = ',')]
    drop_crashes: Vec<usize>,
    /// Print a violation as found, without shrinking it first.
    #[arg(long)]
    no_shrink: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.hosts == 0 || (args.hosts > 1 && args.ledger == LedgerKind::Redb) {
        eprintln!("sim: --hosts N (N > 1) needs --ledger postgres: a redb file has one process");
        return ExitCode::from(2);
    }
    // On PostgreSQL too: there the installed clock is the real one, skewed per host (`--hosts`).
    if !oncebox_sim::clock::install() {
        eprintln!("sim: the simulated clock could not be installed");
        return ExitCode::from(2);
    }
    if !oncebox_sim::race::install() {
        eprintln!("sim: the store's windows could not be watched");
        return ExitCode::from(2);
    }
    let cache = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("sim: cannot make a compile cache directory: {e}");
            return ExitCode::from(2);
        }
    };
    let cut = Cut {
        jobs: args.drop_jobs.iter().copied().collect::<BTreeSet<_>>(),
        crashes: args.drop_crashes.iter().copied().collect::<BTreeSet<_>>(),
    };
    let seeds: Vec<u64> = match args.seed {
        Some(seed) => vec![seed],
        None => (args.from..args.from + args.seeds).collect(),
    };
    let (mut operations, mut faults, mut violations, mut ran) = (0, 0, 0, 0);
    let beat = watchdog(args.ledger, replay_flags(&cut, args.ledger, args.hosts));
    for seed in seeds {
        let _ = beat.send(Some(seed));
        let report = run_seed(seed, &cut, args.ledger, args.hosts, cache.path());
        let _ = beat.send(None);
        let report = match report {
            Ok(report) => report,
            Err(e) => {
                eprintln!("sim: seed {seed}: the simulation failed: {e:#}");
                return ExitCode::from(2);
            }
        };
        ran += 1;
        operations += report.operations;
        faults += report.faults;
        violations += report.violations.len();
        println!(
            "seed {}: digest: {}, history: {}{}, {} operations, {} faults, {} violations",
            report.seed,
            report.digest,
            &report.history_digest()[..16],
            if report.free { " (free)" } else { "" },
            report.operations,
            report.faults,
            report.violations.len()
        );
        if args.seed.is_some() {
            show(report.history.iter(), "  ");
        }
        if let Some(first) = report.violations.first() {
            for violation in &report.violations {
                println!("  VIOLATION {violation}");
            }
            // Shrunk only when asked to: each try is a whole run (minutes on PostgreSQL).
            let shrunk = if args.no_shrink || !cut.is_empty() {
                None
            } else {
                match shrink(seed, first.invariant, args.ledger, args.hosts, cache.path()) {
                    Ok(shrunk) => shrunk,
                    Err(e) => {
                        eprintln!("sim: seed {seed}: shrinking failed: {e:#}");
                        None
                    }
                }
            };
            let (cut, report) = match &shrunk {
                Some((smaller, report)) => (smaller.clone(), report),
                None => (cut.clone(), &report),
            };
            explain(report, first.invariant, &cut, args.ledger, args.hosts);
        }
        if args.stop && !report.violations.is_empty() {
            break;
        }
    }
    println!("sim: {ran} seeds, {operations} operations, {faults} faults, {violations} violations");
    if violations > 0 { ExitCode::from(1) } else { ExitCode::SUCCESS }
}

/// A seed that does not end is a hang: some task waits for what never comes (on redb, simulated
/// time only stands still while every task waits on something other than a timer). The watchdog
/// reports it as a violation and ends the run, rather than leave CI waiting.
fn watchdog(ledger: LedgerKind, flags: String) -> mpsc::Sender<Option<u64>> {
    let limit = match ledger {
        LedgerKind::Redb => Duration::from_secs(300),
        LedgerKind::Postgres => Duration::from_secs(1_200),
    };
    let (beat, beats) = mpsc::channel::<Option<u64>>();
    std::thread::spawn(move || {
        let mut running = None;
        loop {
            match beats.recv_timeout(limit) {
                Ok(seed) => running = seed,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let Some(seed) = running else { continue };
                    println!("seed {seed}: VIOLATION hang: the seed did not end within {} s", limit.as_secs());
                    println!("  replay: cargo run --release -p oncebox-sim -- --seed {seed}{flags}");
                    println!("sim: a seed hung, 1 violations");
                    std::process::exit(1);
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        }
    });
    beat
}

/// Prints the (shrunk) violation: what it concerns in the history, and how to replay it.
fn explain(report: &SeedReport, invariant: &str, cut: &Cut, ledger: LedgerKind, hosts: usize) {
    let Some(violation) = report.violations.iter().find(|v| v.invariant == invariant) else {
        return;
    };
    if !cut.is_empty() {
        println!(
            "  shrunk: {} of the plan's jobs and crashes left out, it still breaks {invariant}",
            cut.jobs.len() + cut.crashes.len()
        );
    }
    println!("  {violation}");
    println!("  what it concerns, in order:");
    show(report.history.iter().filter(|e| concerns(violation, e)), "    ");
    println!(
        "  replay: cargo run --release -p oncebox-sim -- --seed {}{}",
        report.seed,
        replay_flags(cut, ledger, hosts)
    );
}

/// The flags that replay a seed as run: its cut, its ledger and its hosts.
fn replay_flags(cut: &Cut, ledger: LedgerKind, hosts: usize) -> String {
    let ledger = match ledger {
        LedgerKind::Redb => "",
        LedgerKind::Postgres => " --ledger postgres",
    };
    let hosts = if hosts > 1 { format!(" --hosts {hosts}") } else { String::new() };
    format!("{}{ledger}{hosts}", cut.flags())
}

/// Whether `entry` belongs to the history of `violation` (all of it, when the violation names no
/// run and no order).
fn concerns(violation: &Violation, entry: &Entry) -> bool {
    (violation.run.is_empty() && violation.order.is_empty()) || entry.event.concerns(&violation.run, &violation.order)
}

/// Prints entries, a run of the same event (a caller asking again and again) as its first line
/// and a count.
fn show<'a>(entries: impl Iterator<Item = &'a Entry>, indent: &str) {
    let mut last: Option<(String, u32)> = None;
    for entry in entries {
        let event = entry.event.to_string();
        match &mut last {
            Some((was, n)) if *was == event => *n += 1,
            _ => {
                if let Some((_, n)) = last.take().filter(|(_, n)| *n > 0) {
                    println!("{indent}  ... and {n} more like it");
                }
                println!("{indent}{entry}");
                last = Some((event, 0));
            }
        }
    }
    if let Some((_, n)) = last.filter(|(_, n)| *n > 0) {
        println!("{indent}  ... and {n} more like it");
    }
}
