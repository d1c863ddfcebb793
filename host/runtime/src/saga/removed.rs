//! The steps of a run whose records retention removed before the run was undone: `oncebox ledger
//! gc` removes a closed run's records once they are older than the window, and a run with no step
//! open is closed (a run that ended, or whose compensation was refused, say). Their args and
//! output went with them, so no compensation can be made for them: each completed compensatable
//! one is named for a person to undo by hand, and the run is not done. Passed over, the saga would
//! say `Done` while their payments stand.

use super::{SagaState, SagaStep};
use crate::clock::rfc3339 as time;
use crate::ledger::run_state::{self, Undone};
use crate::ledger::{OperationRecord, Tombstone};
use crate::policy::ReplayClass;

/// What the compensation of a run says of the steps whose records retention removed (`removed`:
/// the run's tombstones, read after `ops`, its records), and how they leave its state: a step to
/// undo by hand makes a run that was done outstanding (a compensation awaiting approval or one
/// outstanding says more). Retention removes by age, so they ended before every step still on
/// record: they come last in reverse order, newest first. O(the run's tombstones x its records).
pub(super) fn report(ops: &[OperationRecord], removed: &[Tombstone], state: &mut SagaState) -> Vec<SagaStep> {
    // A record removed between the two reads is in both: it is the record's step.
    let mut gone: Vec<&Tombstone> = removed
        .iter()
        .filter(|t| run_state::removed_step(t) && !ops.iter().any(|op| op.key == t.operation_key))
        .collect();
    gone.sort_by(|a, b| (b.ended_ms, &b.operation_key).cmp(&(a.ended_ms, &a.operation_key)));
    let mut steps = Vec::new();
    for stone in gone {
        let ended = format!(
            "it ended at {} and its record expired (removed at {})",
            time(stone.ended_ms),
            time(stone.removed_ms)
        );
        if stone.class == Some(ReplayClass::Irreversible) {
            steps.push(named(stone, "kept", format!("irreversible: it cannot be undone, and was not; {ended}")));
            continue;
        }
        if !run_state::undoable_removed(stone) {
            continue;
        }
        match run_state::undone_by(&stone.operation_key, ops, removed) {
            Some(Undone::Recorded(undone)) => {
                let how = super::by_hand::reason(undone).unwrap_or_else(|| "its compensation completed".into());
                steps.push(named(stone, "compensated", format!("{how}; {ended}")));
            }
            Some(Undone::Removed(undone)) => steps.push(named(stone, "compensated", compensation_expired(undone))),
            None => {
                // Each one, whatever came before it: none will ever have a compensation to wait for.
                let class = stone
                    .class
                    .map_or("of a class its record, left by an older release, does not say", ReplayClass::as_str);
                let why = format!(
                    "a completed step ({class}); {ended} before its run was undone, so the args its compensation would \
                     be made from are gone and nothing was dispatched for it: a person must undo this step by hand"
                );
                steps.push(named(stone, "undo-by-hand", why));
                if *state == SagaState::Done {
                    *state = SagaState::Outstanding;
                }
            }
        }
    }
    steps
}

/// A step whose record retention removed, as the report names it.
fn named(stone: &Tombstone, action: &'static str, reason: String) -> SagaStep {
    SagaStep {
        step_id: stone.step_id.clone(),
        tool: stone.tool.clone(),
        operation_key: stone.operation_key.clone(),
        action,
        compensation: None,
        reason: Some(reason),
        approve: None,
        console: None,
    }
}

/// Why a step counts as compensated by a compensation whose own record retention removed.
pub(super) fn compensation_expired(undone: &Tombstone) -> String {
    if undone.tool == crate::keys::BY_HAND {
        let (at, removed) = (time(undone.ended_ms), time(undone.removed_ms));
        return format!("undone by hand at {at}; that record expired (removed at {removed})");
    }
    format!(
        "its compensation `{}` completed at {}; that record expired (removed at {})",
        undone.tool,
        time(undone.ended_ms),
        time(undone.removed_ms)
    )
}

/// Why a step is to be undone by hand whose compensation ended otherwise than completed (failed,
/// or its request rejected), that record since removed.
pub(super) fn compensation_ended(ended: &Tombstone) -> String {
    let how = if ended.rejected { "was rejected" } else { ended.status.as_str() };
    format!(
        "its compensation `{}` {} at {}, and that record expired (removed at {}); it is not tried again: a person \
         must undo this step by hand",
        ended.tool,
        if ended.rejected { how.to_string() } else { format!("ended {how}") },
        time(ended.ended_ms),
        time(ended.removed_ms)
    )
}
