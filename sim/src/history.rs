//! What happened in one seed, in order: every answer a caller was given, every decision, reconcile,
//! settlement and compensation of the operator, every crash, reload and `gc`, and every request
//! and commit at the downstream. The checker reads it beside the downstream's record; a violation
//! prints the part of it that concerns the violation's order.

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use oncebox_runtime::Status;

/// One thing that happened.
#[derive(Debug, Clone)]
pub enum Event {
    /// A caller was answered.
    Called {
        caller: String,
        run: String,
        step: String,
        tool: String,
        order: Option<String>,
        status: Status,
        replayed: bool,
        operation_key: Option<String>,
        output: Option<Value>,
        error: Option<String>,
    },
    /// A call ended in an error of the host's (not an outcome).
    CallError {
        caller: String,
        run: String,
        step: String,
        tool: String,
        error: String,
    },
    /// The operator decided a request for approval of the params they saw.
    Decided {
        run: String,
        step: String,
        approve: bool,
        params: Value,
        component: Option<String>,
        result: String,
    },
    Reconciled {
        run: String,
        operation_key: String,
        answer: String,
    },
    /// The operator settled an unknown operation by hand, from the downstream's own record.
    Settled {
        run: String,
        operation_key: String,
        committed: bool,
        result: String,
    },
    Compensated {
        run: String,
        by: String,
        result: String,
    },
    /// A person refunded a step's payment by hand, at the downstream's dashboard (once), and
    /// said so (`undone-by-hand`).
    UndoneByHand {
        run: String,
        operation_key: String,
        refunded: bool,
        result: String,
    },
    Crashed {
        how: String,
    },
    Restarted,
    Reloaded {
        tool: String,
        result: String,
    },
    Collected {
        result: String,
    },
    Dispatch {
        route: String,
        order: String,
        nth: u32,
        answer: String,
    },
    Commit {
        route: String,
        order: String,
    },
    /// A send of an outbox message reached the endpoint (`taken`: the endpoint has it).
    Delivered {
        order: String,
        nth: u32,
        answer: String,
        taken: bool,
    },
    /// The operator's relay made a pass.
    Relayed {
        result: String,
    },
    /// A caller's call stopped dead (its process paused), past its lease (`pause.rs`).
    Paused {
        run: String,
        what: String,
    },
    /// The host's wall clock stepped (forward or back).
    ClockJumped {
        delta_ms: i64,
    },
    /// The paused call goes on where it stopped.
    Resumed {
        run: String,
        what: String,
    },
}

impl Event {
    /// The run or order it concerns, if one.
    pub fn concerns(&self, run: &str, order: &str) -> bool {
        match self {
            Event::Called { run: r, order: o, .. } => r == run || o.as_deref() == Some(order),
            Event::CallError { run: r, .. }
            | Event::Decided { run: r, .. }
            | Event::Reconciled { run: r, .. }
            | Event::Settled { run: r, .. }
            | Event::Compensated { run: r, .. }
            | Event::UndoneByHand { run: r, .. }
            | Event::Paused { run: r, .. }
            | Event::Resumed { run: r, .. } => r == run,
            Event::Dispatch { order: o, .. } | Event::Commit { order: o, .. } | Event::Delivered { order: o, .. } => {
                o == order
            }
            Event::Crashed { .. } | Event::Restarted | Event::ClockJumped { .. } => true,
            Event::Reloaded { .. } | Event::Collected { .. } | Event::Relayed { .. } => false,
        }
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Called { caller, run, step, tool, status, replayed, output, error, .. } => {
                let replayed = if *replayed { " (replayed)" } else { "" };
                write!(f, "{caller}: {tool} {run}/{step} -> {}{replayed}", status.as_str())?;
                if let Some(output) = output {
                    write!(f, " {output}")?;
                }
                if let Some(error) = error {
                    write!(f, " [{error}]")?;
                }
                Ok(())
            }
            Event::CallError { caller, run, step, tool, error } => {
                write!(f, "{caller}: {tool} {run}/{step} -> error: {error}")
            }
            Event::Decided { run, step, approve, params, result, .. } => {
                let verb = if *approve { "approves" } else { "rejects" };
                write!(f, "operator {verb} {run}/{step} {params}: {result}")
            }
            Event::Reconciled { run, operation_key, answer } => {
                write!(f, "operator reconciles {run} ({operation_key}): {answer}")
            }
            Event::Settled { run, operation_key, committed, result } => {
                let verdict = if *committed { "committed" } else { "not-committed" };
                write!(f, "operator settles {run} ({operation_key}) as {verdict}: {result}")
            }
            Event::Compensated { run, by, result } => write!(f, "{by} compensates {run}: {result}"),
            Event::UndoneByHand { run, operation_key, refunded, result } => {
                let refunded = if *refunded { "refunds it by hand at the dashboard and " } else { "" };
                write!(f, "a person {refunded}says {run} ({operation_key}) is undone by hand: {result}")
            }
            Event::Crashed { how } => write!(f, "the host crashes ({how})"),
            Event::Restarted => write!(f, "the host restarts on the reopened ledger"),
            Event::Reloaded { tool, result } => write!(f, "operator reloads {tool}: {result}"),
            Event::Collected { result } => write!(f, "operator runs gc: {result}"),
            Event::Dispatch { route, order, nth, answer } => {
                write!(f, "downstream: request #{nth} to {route} for {order} meets {answer}")
            }
            Event::Commit { route, order } => write!(f, "downstream: COMMITS {route} for {order}"),
            Event::Delivered { order, nth, answer, taken } => {
                let taken = if *taken { ", TAKEN" } else { "" };
                write!(f, "endpoint: send #{nth} of {order}'s message meets {answer}{taken}")
            }
            Event::Relayed { result } => write!(f, "operator's relay: {result}"),
            Event::ClockJumped { delta_ms } => write!(f, "the host's clock steps by {delta_ms:+} ms"),
            Event::Paused { what, .. } => write!(f, "a caller's call stops dead (paused): {what}"),
            Event::Resumed { what, .. } => write!(f, "the paused call resumes: {what}"),
        }
    }
}

/// One entry: when (simulated ms into the seed), in which life of the host, what.
#[derive(Debug, Clone)]
pub struct Entry {
    pub at_ms: u64,
    pub life: u32,
    pub event: Event,
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:>8} ms  life {}  {}", self.at_ms, self.life, self.event)
    }
}

/// The history of one seed. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct History {
    entries: Arc<Mutex<Vec<Entry>>>,
    life: Arc<AtomicU32>,
    start_ms: u64,
}

impl History {
    pub fn new(start_ms: u64) -> History {
        History { start_ms, ..History::default() }
    }

    pub fn push(&self, event: Event) {
        let at_ms = crate::clock::world_ms().saturating_sub(self.start_ms);
        let life = self.life.load(Ordering::SeqCst);
        let entry = Entry { at_ms, life, event };
        // For a seed that hangs (and so prints nothing): its history as it is made.
        if std::env::var_os("ONCEBOX_SIM_TRACE").is_some() {
            eprintln!("{entry}");
        }
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).push(entry);
    }

    /// When the history began (world ms): its entries' `at_ms` count from here.
    pub fn start_ms(&self) -> u64 {
        self.start_ms
    }

    /// A new life of the host begins.
    pub fn next_life(&self) {
        self.life.fetch_add(1, Ordering::SeqCst);
    }

    pub fn entries(&self) -> Vec<Entry> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
