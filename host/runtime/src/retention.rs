//! Retention (DESIGN section 7): records expire after a window (7 days by default), and
//! `oncebox ledger gc` removes the expired ones. Only what is over goes: completed and failed
//! operations, with their attempts, effects and approval, and rejected requests for approval
//! (leaving a tombstone, so the rejection stays final). Nothing a person, a later call or a saga
//! still needs goes: every record of a run that is open, by the ledger's one rule
//! (`ledger::run_state`: a step unknown or claimed, in flight included, a request awaiting a
//! decision or its use, compensation outstanding).
//!
//! Requests for approval lapse too: one nobody decided within the window (counted from when it was
//! last asked), and an approval nobody used within it (counted from the decision, or from its
//! expiry when that is later), are removed without a tombstone: nothing of the step ran, so a
//! later call of it records a new request, and a person decides again on the world as it is
//! then. A decision or a claim since gc looked keeps the request (`Store::expire`).
//!
//! A removed operation leaves a tombstone. A call of its step afterwards is answered `expired`
//! and dispatches nothing: its downstream's idempotency keys may have expired too (Stripe keeps
//! them 24 hours), so running it as new could repeat its effect with nobody the wiser. A new
//! intent takes a new step id.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::Serialize;

use crate::call::{Outcome, Status};
use crate::clock::rfc3339 as time;
use crate::ledger::{
    ApprovalRecord, ApprovalState, Ledger, LedgerError, Open, OperationRecord, OperationStatus, StaleApproval,
    Tombstone, Why, expirable,
};

/// How long records are kept by default.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// What a gc removed and what it kept for a reason.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct GcReport {
    pub removed_operations: usize,
    pub removed_approvals: usize,
    /// Expired by age but kept: (operation key, why).
    pub kept: Vec<(String, String)>,
}

/// The answer to a call of a step whose record expired.
pub(crate) fn expired(tombstone: &Tombstone) -> Outcome {
    let ended = if tombstone.rejected { "was rejected" } else { tombstone.status.as_str() };
    let message = format!(
        "step `{}` of run `{}` {} at {} and its record expired (removed at {}); its downstream's keys may \
         have expired too, so it is not run again as new. A new intent needs a new step id",
        tombstone.step_id,
        tombstone.run_id,
        if tombstone.rejected { ended.to_string() } else { format!("ended {ended}") },
        time(tombstone.ended_ms),
        time(tombstone.removed_ms)
    );
    Outcome::stopped(&tombstone.operation_key, Status::Expired, "expired", message)
}

/// Removes what expired before `now_ms - retention` (see the module's docs). Visits the operations
/// that ended before the cutoff (the ledger's index of them: O(expired) on redb) and the open ones
/// (the index of open work: O(open)), never the whole history of operations; requests for
/// approval are still read whole (O(requests), fewer than operations: only tools that need
/// approval make them).
pub async fn gc(ledger: &Ledger, retention: Duration, now_ms: u64) -> Result<GcReport, LedgerError> {
    let cutoff = now_ms.saturating_sub(retention.as_millis() as u64);
    // What keeps each run open, by the ledger's one rule (claims in flight included), read before
    // the records gc removes from, so that a step claimed before this look keeps its run.
    let open = ledger.open_runs(None, now_ms).await?;
    // The expired candidates: those that ended before the cutoff, and the open ones as old (kept,
    // and said why).
    let mut operations = ledger.ended_before(cutoff).await?;
    for key in open.values().flatten().map(|o| &o.operation_key).collect::<BTreeSet<_>>() {
        if let Some(op) = ledger.operation(key).await?
            && expirable(&op).is_err()
            && op.updated_ms < cutoff
        {
            operations.push(op);
        }
    }
    let approvals = ledger.approvals(None).await?;
    let mut report = GcReport::default();
    // Requests without an operation that this gc removes: rejected ones (with a tombstone), and
    // pending or approved ones that lapsed (see the module's docs).
    let mut without_operation = Vec::new();
    for approval in approvals.iter().filter(|a| last_written(a) < cutoff) {
        if ledger.operation(&approval.operation_key).await?.is_none() {
            without_operation.push(approval);
        }
    }
    let (rejected, lapsed): (Vec<&ApprovalRecord>, Vec<&ApprovalRecord>) =
        without_operation.into_iter().partition(|a| a.state == ApprovalState::Rejected);
    let lapsing: BTreeSet<&str> = lapsed.iter().map(|a| a.operation_key.as_str()).collect();
    // An open run keeps every record: a saga may still need them (its compensation cannot start
    // yet, and would find nothing to undo if the completed steps were gone). A request this gc
    // lets lapse keeps nothing: it goes too.
    let kept_runs: BTreeMap<&str, Vec<&Open>> = open
        .iter()
        .map(|(run, reasons)| {
            let reasons = reasons
                .iter()
                .filter(|o| {
                    !(matches!(o.why, Why::AwaitingApproval { .. }) && lapsing.contains(o.operation_key.as_str()))
                })
                .collect::<Vec<_>>();
            (run.as_str(), reasons)
        })
        .filter(|(_, reasons)| !reasons.is_empty())
        .collect();
    let mut tombstones = Vec::new();
    for op in &operations {
        if op.updated_ms >= cutoff {
            continue;
        }
        if let Some(reasons) = kept_runs.get(op.run_id.as_str()) {
            report.kept.push((op.key.clone(), kept_because(op, reasons)));
            continue;
        }
        tombstones.push(Tombstone::of(op, now_ms));
    }
    let mut stale = Vec::new();
    // A rejection stays final after its request goes: its tombstone refuses the step.
    for approval in rejected {
        stale.push(StaleApproval::of(approval));
        tombstones.push(Tombstone {
            operation_key: approval.operation_key.clone(),
            run_id: approval.run_id.clone(),
            step_id: approval.step_id.clone(),
            tool: approval.tool.clone(),
            fingerprint: approval.fingerprint.clone(),
            status: OperationStatus::Failed,
            ended_ms: last_written(approval),
            removed_ms: now_ms,
            rejected: true,
        });
    }
    stale.extend(lapsed.into_iter().map(StaleApproval::of));
    let removed = ledger.expire(&tombstones, &stale).await?;
    report.removed_operations = removed.operations;
    report.removed_approvals = removed.approvals;
    Ok(report)
}

/// Why gc keeps `op`, of a run kept open by `reasons`: its own reason if it has one, else the run's.
fn kept_because(op: &OperationRecord, reasons: &[&Open]) -> String {
    let own = reasons.iter().find(|o| o.operation_key == op.key && o.why != Why::CompensationOutstanding);
    match own.map(|o| &o.why) {
        Some(Why::Unknown) => "unknown: reconcile it or settle it by hand first".into(),
        Some(Why::InFlight { .. }) => "claimed: a caller may still be running it".into(),
        Some(Why::Abandoned { .. }) => "claimed by an owner that is gone: its next call takes it over".into(),
        _ => {
            let steps: Vec<String> = reasons.iter().map(|o| format!("{} ({})", o.step_id, o.why.as_str())).collect();
            format!("run `{}` is open: {}", op.run_id, steps.join(", "))
        }
    }
}

/// When a request for approval was last written to: asked (or asked again for a new component),
/// decided, or, for an approval with an expiry, the end of it (it stands until then).
fn last_written(approval: &ApprovalRecord) -> u64 {
    let decided = approval.decided_ms.unwrap_or(approval.requested_ms);
    decided.max(approval.requested_ms).max(approval.expires_ms.unwrap_or(0))
}
