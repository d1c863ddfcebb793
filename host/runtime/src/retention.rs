//! Retention (DESIGN section 7): records expire after a window (7 days by default), and
//! `oncebox ledger gc` removes the expired ones. Only what is over goes: completed and failed
//! operations, with their attempts, effects and approval, and rejected requests for approval
//! (leaving a tombstone, so the rejection stays final). Every record of a run that is open stays,
//! by the ledger's one rule (`ledger::run_state`: a step unknown or claimed, in flight included, a
//! request awaiting a decision or its use, compensation outstanding), but its rejected requests:
//! nothing of their steps ran, and their tombstones keep them final, so nothing needs more of
//! them. A closed run's records go once expired, compensatable steps included: a compensation
//! asked for later finds them by their tombstones and names them for a person to undo by hand
//! (`saga`), since the args their compensations would be made from went with them.
//!
//! Requests for approval lapse too: one nobody decided within the window (counted from when it was
//! last asked), and an approval nobody used within it (counted from the decision, or from its
//! expiry when that is later), are removed without a tombstone: nothing of the step ran, so a
//! later call of it records a new request, and a person decides again on the world as it is
//! then. A decision or a claim since gc looked keeps the request (`Store::expire`).
//!
//! Delivered outbox messages go too, once delivered before the cutoff, each with the notice key
//! that names it (`Ledger::enqueue_once`); a pending message, refused included, never goes. A
//! notification whose event may still be noticed (its operation's record or request, or its
//! run, is still in the ledger, or the run's outstanding compensation names a removed
//! compensatable step that nothing undid: `notify::may_be_noticed_again`) is kept, message and key, and
//! goes at the first gc after its event's records did: removing its key earlier would let a host
//! that notices the same event again enqueue it a second time, where `enqueue_once` promises
//! once, whenever. Keeping keys forever and removing only bodies would keep that promise too, but
//! would grow with every notification ever sent; this way what the outbox keeps follows what the
//! ledger keeps.
//!
//! How gc grows: it visits the operations that ended before the cutoff (`Ledger::ended_before`)
//! and the open ones, the requests last written before the cutoff (`Ledger::approvals_before`),
//! and the messages delivered before it (`Ledger::delivered_before`, notifications kept for a
//! live event included): O(expired + open), each read through an index on redb and PostgreSQL,
//! never the whole history.
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
    ApprovalRecord, ApprovalState, Ledger, LedgerError, Open, OperationRecord, OperationStatus, Pruned, StaleApproval,
    Tombstone, Why, expirable,
};

/// How long records are kept by default.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// What a gc removed and what it kept for a reason.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct GcReport {
    pub removed_operations: usize,
    pub removed_approvals: usize,
    /// Outbox messages delivered before the cutoff, removed.
    pub removed_messages: usize,
    /// Notice keys removed with their messages: their events can no longer be noticed.
    pub removed_notices: usize,
    /// Notifications delivered before the cutoff but kept, with their keys: their events may
    /// still be noticed (see the module's docs).
    pub kept_notifications: usize,
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

/// How many delivered messages one removal names (one transaction each).
const PRUNE_AT_ONCE: usize = 1000;

/// Removes what expired before `now_ms - retention` (see the module's docs). Visits the operations
/// that ended before the cutoff (the ledger's index of them), the open ones (the index of open
/// work), the requests last written before the cutoff and the messages delivered before it (their
/// indexes by age): O(expired + open), never the whole history.
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
    let approvals = ledger.approvals_before(cutoff).await?;
    let mut report = GcReport::default();
    // Requests without an operation that this gc removes: rejected ones (with a tombstone), and
    // pending or approved ones that lapsed (see the module's docs).
    let mut without_operation = Vec::new();
    for approval in &approvals {
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
            ended_ms: approval.last_written(),
            removed_ms: now_ms,
            rejected: true,
            class: None,
        });
    }
    stale.extend(lapsed.into_iter().map(StaleApproval::of));
    let removed = ledger.expire(&tombstones, &stale).await?;
    report.removed_operations = removed.operations;
    report.removed_approvals = removed.approvals;
    // After the records: a notification whose event's records this gc removed goes now.
    let (pruned, kept) = prune_outbox(ledger, cutoff, now_ms).await?;
    report.removed_messages = pruned.messages;
    report.removed_notices = pruned.notices;
    report.kept_notifications = kept;
    Ok(report)
}

/// Removes the outbox messages delivered before `cutoff` whose event, if they are notifications,
/// can no longer be noticed (see the module's docs). Answers what went, and how many
/// notifications were kept. O(messages delivered before the cutoff).
async fn prune_outbox(ledger: &Ledger, cutoff: u64, now_ms: u64) -> Result<(Pruned, usize), LedgerError> {
    let mut removable = Vec::new();
    let mut kept = 0;
    for message in ledger.delivered_before(cutoff).await? {
        if crate::notify::may_be_noticed_again(ledger, &message.effect_key, now_ms).await? {
            kept += 1;
        } else {
            removable.push(message.seq);
        }
    }
    let mut pruned = Pruned::default();
    for seqs in removable.chunks(PRUNE_AT_ONCE) {
        let now = ledger.prune_outbox(seqs).await?;
        pruned.messages += now.messages;
        pruned.notices += now.notices;
    }
    Ok((pruned, kept))
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
