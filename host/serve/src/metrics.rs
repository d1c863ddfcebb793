//! `GET /metrics`: Prometheus text format, version 0.0.4. Counters are kept here as calls end;
//! what is outstanding (unknowns, approvals) and the ledger's write latency are read at scrape.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

/// How a call was answered, for the metrics and the `oncebox-source` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// This request ran the pipeline and its attempts.
    Fresh,
    /// The same call was already running in this server: this request shares its answer.
    Deduplicated,
    /// Answered from the ledger's record, nothing ran.
    Replayed,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Fresh => "fresh",
            Source::Deduplicated => "deduplicated",
            Source::Replayed => "replayed",
        }
    }
}

use oncebox_runtime::Outcome;

#[derive(Debug, Default)]
pub struct Metrics {
    /// (tool, status, source) → calls.
    calls: Mutex<BTreeMap<(String, String, &'static str), u64>>,
    /// tool → attempts made by calls that ran here.
    attempts: Mutex<BTreeMap<String, u64>>,
    /// (tool, result) → the background reconciler's tries.
    reconcile_tries: Mutex<BTreeMap<(String, &'static str), u64>>,
}

/// What is read from the ledger when scraped.
#[derive(Debug, Default)]
pub struct Outstanding {
    pub unknown: u64,
    pub approvals_pending: u64,
}

impl Metrics {
    pub fn call(&self, tool: &str, outcome: &Outcome, source: Source) {
        let tool = tool.to_string();
        let status = outcome.status.as_str().to_string();
        let mut calls = self.calls.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        *calls.entry((tool.clone(), status, source.as_str())).or_default() += 1;
        drop(calls);
        if source == Source::Fresh {
            let mut attempts = self.attempts.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            *attempts.entry(tool).or_default() += u64::from(outcome.attempts);
        }
    }

    /// One try of the background reconciler (`reconciler.rs`).
    pub fn reconcile_try(&self, tool: &str, result: oncebox_runtime::reconciler::TryResult) {
        let mut tries = self.reconcile_tries.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        *tries.entry((tool.to_string(), result.as_str())).or_default() += 1;
    }

    /// The text of one scrape.
    pub fn render(&self, outstanding: &Outstanding, latency: &oncebox_runtime::ledger::LatencySnapshot) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# HELP oncebox_calls_total Calls answered, by tool, outcome and source.");
        let _ = writeln!(out, "# TYPE oncebox_calls_total counter");
        for ((tool, status, source), n) in self.calls.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let _ = writeln!(
                out,
                "oncebox_calls_total{{tool=\"{}\",outcome=\"{}\",source=\"{source}\"}} {n}",
                label(tool),
                label(status)
            );
        }
        let _ = writeln!(out, "# HELP oncebox_attempts_total Attempts run by calls that ran in this server.");
        let _ = writeln!(out, "# TYPE oncebox_attempts_total counter");
        for (tool, n) in self.attempts.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let _ = writeln!(out, "oncebox_attempts_total{{tool=\"{}\"}} {n}", label(tool));
        }
        let name = "oncebox_reconcile_tries_total";
        let _ = writeln!(out, "# HELP {name} The background reconciler's tries, by tool and result.");
        let _ = writeln!(out, "# TYPE {name} counter");
        for ((tool, result), n) in self.reconcile_tries.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let _ = writeln!(out, "{name}{{tool=\"{}\",result=\"{result}\"}} {n}", label(tool));
        }
        let _ = writeln!(out, "# HELP oncebox_unknown_operations Operations whose outcome is unknown: reconcile them.");
        let _ = writeln!(out, "# TYPE oncebox_unknown_operations gauge");
        let _ = writeln!(out, "oncebox_unknown_operations {}", outstanding.unknown);
        let _ = writeln!(out, "# HELP oncebox_approvals_pending Requests for approval awaiting a decision.");
        let _ = writeln!(out, "# TYPE oncebox_approvals_pending gauge");
        let _ = writeln!(out, "oncebox_approvals_pending {}", outstanding.approvals_pending);
        let name = "oncebox_ledger_commit_seconds";
        let _ = writeln!(out, "# HELP {name} Time to commit a ledger write (effects, attempts, decisions).");
        let _ = writeln!(out, "# TYPE {name} histogram");
        for (le, n) in &latency.buckets {
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {n}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", latency.count);
        let _ = writeln!(out, "{name}_sum {}", latency.sum_seconds);
        let _ = writeln!(out, "{name}_count {}", latency.count);
        out
    }
}

/// A label value with `\`, `"` and newlines escaped, as the text format asks.
fn label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}
