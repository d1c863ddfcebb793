//! What exploration found: one row per (effect, point), printed as a table.

use std::fmt;

use super::harness::{Injection, Run};

/// An invariant a scenario broke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// One request landed at the downstream more often than in the fault-free run.
    Duplicate { label: String, landed: usize, expected: usize, detail: String },
    /// An effect in doubt was sent again with its key, to a downstream that does not honour
    /// keys, with no reconcile proving in between that it had not been taken.
    SilentResend { label: String, key: String },
    /// The final result is neither the fault-free one nor an honest unknown.
    Result(String),
    /// An attempt asked again, under a new key, for a request that took place or may have: an
    /// earlier attempt's (its label, and so its key, changed between attempts), or its own whose
    /// answer was lost (the tool retried it itself). The host refused to send it (without that, it
    /// would have been a duplicate), and the step stays in doubt until reconciled.
    Diverged(String),
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Duplicate { label, detail, .. } => write!(f, "duplicate: effect `{label}` {detail}"),
            Violation::SilentResend { label, key } => write!(
                f,
                "silent resend: effect `{label}` (key {key}) was in doubt and was sent again to a downstream \
                 that does not honour keys, with no reconcile in between"
            ),
            Violation::Result(what) => write!(f, "result: {what}"),
            Violation::Diverged(what) => write!(f, "diverged: {what}"),
        }
    }
}

/// One scenario's line.
#[derive(Debug, Clone)]
pub struct Row {
    /// `label#occurrence`, or `(attempt N)`.
    pub effect: String,
    /// The crash point or the fault.
    pub point: String,
    /// Whether the host crashed there (the point was reached).
    pub crashed: bool,
    /// The final status, after the restart and reconciles.
    pub status: String,
    /// Requests that reached the script, and those that did the work.
    pub sent: usize,
    pub landed: usize,
    /// How many reconciles the scenario made.
    pub reconciles: usize,
    pub violations: Vec<Violation>,
}

impl Row {
    pub(crate) fn of(injection: &Injection, run: &Run, violations: Vec<Violation>) -> Row {
        Row {
            effect: injection.effect_name(),
            point: injection.point_name().to_string(),
            crashed: run.crashed,
            ..Row::baseline(run)
        }
        .with(violations)
    }

    pub(crate) fn baseline(run: &Run) -> Row {
        Row {
            effect: "(all)".into(),
            point: "fault-free".into(),
            crashed: false,
            status: run.outcome.status.as_str().to_string(),
            sent: run.dispatches.len(),
            landed: run.dispatches.iter().filter(|d| d.landed).count(),
            reconciles: run.reconciles.len(),
            violations: Vec::new(),
        }
    }

    fn with(mut self, violations: Vec<Violation>) -> Row {
        self.violations = violations;
        self
    }
}

/// The exploration's rows, with the fault-free run first.
#[derive(Debug, Clone)]
pub struct Report {
    pub baseline: Row,
    pub rows: Vec<Row>,
}

impl Report {
    /// Whether every scenario kept every invariant.
    pub fn passed(&self) -> bool {
        self.rows.iter().all(|row| row.violations.is_empty())
    }

    /// Every broken invariant, with the row it broke in.
    pub fn violations(&self) -> impl Iterator<Item = (&Row, &Violation)> {
        self.rows.iter().flat_map(|row| row.violations.iter().map(move |v| (row, v)))
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rows: Vec<&Row> = std::iter::once(&self.baseline).chain(&self.rows).collect();
        let width = |cell: fn(&Row) -> String, title: &str| {
            rows.iter().map(|r| cell(r).len()).max().unwrap_or(0).max(title.len())
        };
        let (e, p) = (width(|r| r.effect.clone(), "effect"), width(|r| r.point.clone(), "point"));
        let s = width(|r| r.status.clone(), "outcome");
        writeln!(
            f,
            "{:<e$}  {:<p$}  {:<7}  {:<s$}  {:>4}  {:>6}  {:>9}  check",
            "effect", "point", "crashed", "outcome", "sent", "landed", "reconcile"
        )?;
        for row in rows {
            let check =
                if row.violations.is_empty() { "ok".to_string() } else { format!("FAIL ({})", row.violations.len()) };
            let crashed = if row.crashed { "yes" } else { "-" };
            writeln!(
                f,
                "{:<e$}  {:<p$}  {:<7}  {:<s$}  {:>4}  {:>6}  {:>9}  {check}",
                row.effect, row.point, crashed, row.status, row.sent, row.landed, row.reconciles
            )?;
        }
        let broken: Vec<_> = self.violations().collect();
        writeln!(f, "{} scenarios, {} invariant(s) broken", self.rows.len(), broken.len())?;
        for (row, violation) in broken {
            writeln!(f, "  {} at {}: {violation}", row.effect, row.point)?;
        }
        Ok(())
    }
}
