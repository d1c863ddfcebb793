//! What keeps a run open (DESIGN section 7): one rule, asked by the saga (what blocks compensation),
//! retention (gc keeps every record of an open run), recovery's report, the API's run view and
//! the console. Pure: it is given a run's operations, its claims in flight (claimed and not yet
//! recorded: `Store::in_flight`), its requests for approval and the time, and answers the reasons,
//! each typed, so that every reader words them its own way but none decides them again.
//!
//! A run is open while any of these holds:
//!
//! - an operation is unknown (a person or a reconcile must settle it);
//! - an operation is claimed, recorded or still in flight: with a live lease its owner is running
//!   it (it may be about to charge), with an expired one its owner is gone (abandoned: the next
//!   call of its step, or `compensate`, takes it over);
//! - a request for approval has no operation yet: pending, or approved and not used (an expired
//!   approval too: it lets nothing through until a person decides again);
//! - its compensation started (some compensation operation exists, run by a tool: a person's
//!   word that they undid one step by hand undoes that step only, and starts nothing) and a
//!   completed compensatable step has no completed compensation.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::{ApprovalRecord, ApprovalStanding, ApprovalState, OperationRecord, OperationStatus, Tombstone};
use oncebox_core::keys::{BY_HAND, COMPENSATION_PREFIX};
use oncebox_core::policy::ReplayClass;

/// The step id of the compensation of `op`.
pub fn compensation_step(op: &OperationRecord) -> String {
    compensation_step_of(&op.key)
}

/// [`compensation_step`] by the undone operation's key: what a tombstone names.
pub fn compensation_step_of(operation_key: &str) -> String {
    format!("{COMPENSATION_PREFIX}{operation_key}")
}

/// Whether `op` is itself a compensation.
pub fn is_compensation(op: &OperationRecord) -> bool {
    step_ties_the_run(&op.step_id)
}

/// Whether `op` is a compensation run by a tool, which starts its run's compensation: not a
/// person's word that they undid one step by hand ([`by_hand`]), which asks nothing of the others.
fn started_compensation(op: &OperationRecord) -> bool {
    is_compensation(op) && op.tool != BY_HAND
}

/// Whether `op` is a step a compensation would undo: completed, compensatable, not itself a
/// compensation.
pub fn undoable(op: &OperationRecord) -> bool {
    !is_compensation(op) && op.status == OperationStatus::Completed && op.class == ReplayClass::Compensatable
}

/// Whether `tombstone` is what retention left of a completed step of its run: not a rejected
/// request (nothing of it ran), not a compensation.
pub fn removed_step(tombstone: &Tombstone) -> bool {
    !tombstone.rejected && tombstone.status == OperationStatus::Completed && !step_ties_the_run(&tombstone.step_id)
}

/// Whether `tombstone` is what retention left of a step a compensation would have undone
/// ([`undoable`]): a completed step ([`removed_step`]), compensatable, or of no class on record
/// (a tombstone an older release left: it may have been, so it is named rather than passed over).
pub fn undoable_removed(tombstone: &Tombstone) -> bool {
    removed_step(tombstone) && tombstone.class.is_none_or(|class| class == ReplayClass::Compensatable)
}

/// Whether `op` is undone: some operation of its compensation's step completed, whatever tool ran
/// it (a compensation is bound to the operation it undoes, not to the undo tool).
pub fn compensated(ops: &[&OperationRecord], op: &OperationRecord) -> bool {
    let step = compensation_step(op);
    ops.iter().any(|c| c.step_id == step && c.status == OperationStatus::Completed)
}

/// How the step of operation `operation_key` was undone, if it was: a completed compensation of
/// it on record (`ops`: the run's operations), or one whose record retention removed since
/// (`removed`: the run's tombstones). Whatever tool ran it, as [`compensated`].
pub fn undone_by<'a>(operation_key: &str, ops: &'a [OperationRecord], removed: &'a [Tombstone]) -> Option<Undone<'a>> {
    let step = compensation_step_of(operation_key);
    let completed = OperationStatus::Completed;
    ops.iter().find(|c| c.step_id == step && c.status == completed).map(Undone::Recorded).or_else(|| {
        removed.iter().find(|t| t.step_id == step && !t.rejected && t.status == completed).map(Undone::Removed)
    })
}

/// A step's completed compensation ([`undone_by`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Undone<'a> {
    Recorded(&'a OperationRecord),
    Removed(&'a Tombstone),
}

impl Undone<'_> {
    /// The tool that undid it ([`BY_HAND`]: a person, by their word).
    pub fn tool(&self) -> &str {
        match self {
            Undone::Recorded(op) => &op.tool,
            Undone::Removed(stone) => &stone.tool,
        }
    }

    /// The key of the compensation's operation.
    pub fn key(&self) -> &str {
        match self {
            Undone::Recorded(op) => &op.key,
            Undone::Removed(stone) => &stone.operation_key,
        }
    }

    /// Whether a person's word undid it, not a compensation tool.
    pub fn by_hand(&self) -> bool {
        self.tool() == BY_HAND
    }
}

/// Where a person's word that they undid a step by hand is recorded ([`by_hand`]). It is recorded
/// as a completed operation of the step's compensation, run by no tool ([`BY_HAND`]): every rule
/// that asks whether a step is undone ([`compensated`], [`undone_by`], what keeps a run open,
/// retention's tombstones) counts it as it counts a compensation, and nothing else is dispatched
/// for the step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ByHand<'a> {
    /// A person's word is on record already (or what retention left of it): answered from it.
    Said(Undone<'a>),
    /// Nothing of the step's compensation exists: the word is recorded at the compensation's own
    /// key, where the ledger's claim decides between it and a compensation begun at the same
    /// time (one of them is refused), so the step is never undone twice.
    InPlace,
    /// The step's compensation was claimed by an owner that is gone (a killed process, a restart,
    /// or a settlement `not-committed` that reopened it), and nothing of it may be running: the
    /// word's writer takes it over first and ends it as `compensate` would (failed when nothing
    /// of it took effect: then the word goes beside it; unknown when an effect of it took place or
    /// is in doubt: then the word is refused), so that no later `compensate` resumes it.
    EndAbandoned(&'a OperationRecord),
    /// No compensation of the step will ever be dispatched: one ended without undoing it (failed,
    /// or its request rejected, that record kept or removed since), or the step's own record is
    /// gone (its compensation's args with it). The word is recorded beside
    /// ([`undone_by_hand_key`](oncebox_core::keys::undone_by_hand_key)).
    Beside,
}

/// Why a person's word that they undid a step by hand is refused ([`by_hand`]): a word recorded
/// while the step's compensation may still run, or may have run, could undo the step twice.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ByHandRefused {
    #[error("no step of the run has the key {0}")]
    NoStep(String),
    #[error("step `{step_id}` is {what}: there is nothing a compensation would undo")]
    NotUndoable { step_id: String, what: String },
    #[error("step `{step_id}` is undone already, by its compensation `{tool}` (operation {key})")]
    Compensated { step_id: String, tool: String, key: String },
    #[error(
        "the compensation of step `{step_id}` (`{tool}`, operation {key}) is {state}: {what}; a step undone by \
         hand as well would be undone twice"
    )]
    CompensationOpen { step_id: String, tool: String, key: String, state: &'static str, what: &'static str },
}

/// Whether a person may record that they undid step `operation_key` of a run by hand, and where:
/// given the run's records (`ops`), its claims in flight, its requests for approval and its
/// tombstones, at `now_ms`. Only a step a compensation would undo ([`undoable`], or
/// [`undoable_removed`]), not undone yet, whose compensation is not unknown, in progress or
/// awaiting a decision: those may still undo it. A compensation that failed, or whose request was
/// rejected, is over for good (a failed compensation is replayed, never tried again), so a word
/// beside it races nothing; one whose owner is gone is ended first ([`ByHand::EndAbandoned`]).
pub fn by_hand<'a>(
    operation_key: &str,
    ops: &'a [OperationRecord],
    in_flight: &'a [OperationRecord],
    approvals: &[ApprovalRecord],
    removed: &'a [Tombstone],
    now_ms: u64,
) -> Result<ByHand<'a>, ByHandRefused> {
    let not_undoable = |step_id: &str, what: String| ByHandRefused::NotUndoable { step_id: step_id.into(), what };
    // The step, on record (`kept`) or as retention left it.
    let recorded = ops.iter().find(|op| op.key == operation_key);
    let (step_id, kept) = match (recorded, removed.iter().find(|t| t.operation_key == operation_key)) {
        (Some(op), _) if undoable(op) => (op.step_id.clone(), true),
        (Some(op), _) if is_compensation(op) => return Err(not_undoable(&op.step_id, "itself a compensation".into())),
        (Some(op), _) if op.status != OperationStatus::Completed => {
            let what = match op.status {
                OperationStatus::Unknown => "unknown: settle it first (if it took effect, compensate undoes it)",
                OperationStatus::Claimed => "in progress: let it end first",
                _ => "failed: nothing of it took effect",
            };
            return Err(not_undoable(&op.step_id, what.into()));
        }
        (Some(op), _) => return Err(not_undoable(&op.step_id, format!("{}, not compensatable", op.class.as_str()))),
        (None, Some(stone)) if undoable_removed(stone) => (stone.step_id.clone(), false),
        (None, Some(stone)) => {
            let what = "a step retention removed that no compensation would undo".into();
            return Err(not_undoable(&stone.step_id, what));
        }
        (None, None) => return Err(ByHandRefused::NoStep(operation_key.into())),
    };
    match undone_by(operation_key, ops, removed) {
        Some(undone) if undone.by_hand() => return Ok(ByHand::Said(undone)),
        Some(undone) => {
            let (tool, key) = (undone.tool().into(), undone.key().into());
            return Err(ByHandRefused::Compensated { step_id, tool, key });
        }
        None => {}
    }
    let compensation = compensation_step_of(operation_key);
    let open = |c: &OperationRecord, state, what| ByHandRefused::CompensationOpen {
        step_id: step_id.clone(),
        tool: c.tool.clone(),
        key: c.key.clone(),
        state,
        what,
    };
    // A word of a person's being recorded (claimed, not yet completed) is not a compensation:
    // the claim of the same key decides it.
    // A claim read both in flight and recorded is the recorded one (read last).
    let recorded: BTreeSet<&str> = ops.iter().map(|op| op.key.as_str()).collect();
    let flying = in_flight.iter().filter(|c| !recorded.contains(c.key.as_str()));
    let begun: Vec<&OperationRecord> =
        ops.iter().chain(flying).filter(|c| c.step_id == compensation && c.tool != BY_HAND).collect();
    // An abandoned claim is ended only once nothing else of the compensation may undo the step.
    let mut abandoned = None;
    for c in &begun {
        match c.status {
            OperationStatus::Unknown => {
                return Err(open(c, "unknown", "it may have undone the step: reconcile or settle it first"));
            }
            OperationStatus::Claimed if c.lease_until_ms > now_ms => {
                return Err(open(c, "in progress", "let it end (compensate takes it over once its owner is gone)"));
            }
            OperationStatus::Claimed => abandoned = abandoned.or(Some(*c)),
            OperationStatus::Failed | OperationStatus::Completed => {}
        }
    }
    let claimed: BTreeSet<&str> = ops.iter().chain(in_flight).map(|op| op.key.as_str()).collect();
    let asked: Vec<&ApprovalRecord> =
        approvals.iter().filter(|a| a.step_id == compensation && !claimed.contains(a.operation_key.as_str())).collect();
    if let Some(waiting) = asked.iter().find(|a| a.state != ApprovalState::Rejected) {
        return Err(ByHandRefused::CompensationOpen {
            step_id,
            tool: waiting.tool.clone(),
            key: waiting.operation_key.clone(),
            state: "awaiting approval",
            what: "reject its request first (an approval would let it run)",
        });
    }
    if let Some(abandoned) = abandoned {
        return Ok(ByHand::EndAbandoned(abandoned));
    }
    let ended = !begun.is_empty() || !asked.is_empty() || removed.iter().any(|t| t.step_id == compensation);
    Ok(if ended || !kept { ByHand::Beside } else { ByHand::InPlace })
}

/// One thing that keeps a run open: the step it is about, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Open {
    pub step_id: String,
    pub tool: String,
    pub operation_key: String,
    #[serde(flatten)]
    pub why: Why,
}

/// Why a step keeps its run open.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "kebab-case")]
pub enum Why {
    /// Its outcome is unknown: reconcile it or settle it by hand.
    Unknown,
    /// Claimed by an owner whose lease is live: it is running, and may be about to take effect.
    /// `recorded: false`: nothing of it is on record yet (a claim in flight).
    InFlight { owner: String, lease_until_ms: u64, recorded: bool },
    /// Claimed by an owner whose lease ran out (a killed process, a restart, a settlement that
    /// reopened it): the next call of its step, or `compensate`, takes it over.
    Abandoned { owner: String, lease_until_ms: u64, recorded: bool },
    /// A request for approval no operation answers yet: pending, or approved and not used
    /// (`standing`; an expired approval awaits a new decision).
    AwaitingApproval { standing: ApprovalStanding },
    /// A completed compensatable step whose run's compensation started and that is not undone.
    CompensationOutstanding,
}

impl Why {
    /// The reason's name, as it is serialized (`in-flight`).
    pub fn as_str(&self) -> &'static str {
        match self {
            Why::Unknown => "unknown",
            Why::InFlight { .. } => "in-flight",
            Why::Abandoned { .. } => "abandoned",
            Why::AwaitingApproval { .. } => "awaiting-approval",
            Why::CompensationOutstanding => "compensation-outstanding",
        }
    }
}

impl Open {
    /// Whether the step is one of the run's compensations (the saga's own business).
    pub fn is_compensation(&self) -> bool {
        self.step_id.starts_with(COMPENSATION_PREFIX)
    }

    fn of(op: &OperationRecord, why: Why) -> Open {
        Open { step_id: op.step_id.clone(), tool: op.tool.clone(), operation_key: op.key.clone(), why }
    }
}

/// What keeps one run open at `now_ms`, given its recorded operations, its claims in flight and
/// its requests for approval (every one of them the run's). Empty: the run is closed. In order:
/// the operations' reasons in key order, then the requests', then the compensation's.
pub fn open_reasons(
    operations: &[OperationRecord],
    in_flight: &[OperationRecord],
    approvals: &[ApprovalRecord],
    now_ms: u64,
) -> Vec<Open> {
    // A claim that became recorded between the two reads is the recorded operation.
    let recorded: BTreeSet<&str> = operations.iter().map(|op| op.key.as_str()).collect();
    let flying = in_flight.iter().filter(|op| !recorded.contains(op.key.as_str()));
    let mut ops: Vec<(&OperationRecord, bool)> =
        operations.iter().map(|op| (op, true)).chain(flying.map(|op| (op, false))).collect();
    ops.sort_by(|(a, _), (b, _)| a.key.cmp(&b.key));
    let mut open = Vec::new();
    for (op, recorded) in &ops {
        let (owner, lease_until_ms, recorded) = (op.owner.clone(), op.lease_until_ms, *recorded);
        match op.status {
            OperationStatus::Unknown => open.push(Open::of(op, Why::Unknown)),
            OperationStatus::Claimed if op.lease_until_ms > now_ms => {
                open.push(Open::of(op, Why::InFlight { owner, lease_until_ms, recorded }))
            }
            OperationStatus::Claimed => open.push(Open::of(op, Why::Abandoned { owner, lease_until_ms, recorded })),
            OperationStatus::Completed | OperationStatus::Failed => {}
        }
    }
    let used: BTreeSet<&str> = ops.iter().map(|(op, _)| op.key.as_str()).collect();
    for approval in approvals.iter().filter(|a| !used.contains(a.operation_key.as_str())) {
        if approval.state == ApprovalState::Rejected {
            continue;
        }
        open.push(Open {
            step_id: approval.step_id.clone(),
            tool: approval.tool.clone(),
            operation_key: approval.operation_key.clone(),
            why: Why::AwaitingApproval { standing: approval.standing(now_ms) },
        });
    }
    let all: Vec<&OperationRecord> = ops.iter().map(|(op, _)| *op).collect();
    if all.iter().any(|op| started_compensation(op)) {
        for op in all.iter().filter(|op| undoable(op) && !compensated(&all, op)) {
            open.push(Open::of(op, Why::CompensationOutstanding));
        }
    }
    open
}

/// The keys (of operations, and of requests for approval without one) that keep their run open:
/// the keys [`open_reasons`] names. Which steps keep a run open never depends on the time (only
/// how they do: in flight or abandoned, approved or expired), so an index of these keys kept with
/// each state change stays right as time passes. And only compensation ties one record's
/// openness to the run's others: in a run with no compensation operation, each operation (with
/// the request for approval of its key) is open or not on its own, so an index need look at the
/// records a change touched, and at the whole run only once compensation started
/// ([`ties_the_run`]).
pub fn open_keys(operations: &[OperationRecord], approvals: &[ApprovalRecord]) -> BTreeSet<String> {
    open_reasons(operations, &[], approvals, 0).into_iter().map(|open| open.operation_key).collect()
}

/// Whether retention may remove an operation of a run whose open keys ([`open_keys`], read in the
/// removal's own transaction) are `open`, when the same removal takes `removed` (the operations
/// and requests for approval it removes): only if none of the others keeps the run open.
/// Retention judged the run closed before it wrote; a step claimed or asked for since keeps
/// every record of its run, which a repeat, a saga or a reconcile of the run may still need.
pub fn removable<'k>(open: impl IntoIterator<Item = &'k str>, removed: &BTreeSet<&str>) -> bool {
    open.into_iter().all(|key| removed.contains(key))
}

/// The keys a removal of `tombstones` takes with the requests for approval that `lapsed` (those
/// of the requests it was given that lapse now; one claimed or decided since stays, and keeps its
/// run open): the `removed` of [`removable`].
pub fn removing<'a>(tombstones: &'a [Tombstone], lapsed: impl IntoIterator<Item = &'a str>) -> BTreeSet<&'a str> {
    tombstones.iter().map(|t| t.operation_key.as_str()).chain(lapsed).collect()
}

/// Whether a run whose operations include `op` must be judged whole (see [`open_keys`]).
pub fn ties_the_run(op: &OperationRecord) -> bool {
    step_ties_the_run(&op.step_id)
}

/// Whether an operation of step `step_id` ties its run ([`ties_the_run`]), known before its
/// record is read: a compensation's step.
pub fn step_ties_the_run(step_id: &str) -> bool {
    step_id.starts_with(COMPENSATION_PREFIX)
}

/// [`open_reasons`] for every run the records name, each run's own records given to it: the runs
/// that are open, with their reasons (a closed run is absent). The records are sorted into their
/// runs in one pass, so this grows with the records (times the log of the runs), not with runs
/// times records.
pub fn open_runs(
    operations: &[OperationRecord],
    in_flight: &[OperationRecord],
    approvals: &[ApprovalRecord],
    now_ms: u64,
) -> BTreeMap<String, Vec<Open>> {
    #[derive(Default)]
    struct Records {
        operations: Vec<OperationRecord>,
        in_flight: Vec<OperationRecord>,
        approvals: Vec<ApprovalRecord>,
    }
    let mut runs: BTreeMap<&str, Records> = BTreeMap::new();
    for op in operations {
        runs.entry(op.run_id.as_str()).or_default().operations.push(op.clone());
    }
    for op in in_flight {
        runs.entry(op.run_id.as_str()).or_default().in_flight.push(op.clone());
    }
    for approval in approvals {
        runs.entry(approval.run_id.as_str()).or_default().approvals.push(approval.clone());
    }
    let mut open = BTreeMap::new();
    for (run, records) in runs {
        let reasons = open_reasons(&records.operations, &records.in_flight, &records.approvals, now_ms);
        if !reasons.is_empty() {
            open.insert(run.to_string(), reasons);
        }
    }
    open
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(key: &str, step: &str, status: OperationStatus, class: ReplayClass, lease_until_ms: u64) -> OperationRecord {
        OperationRecord {
            key: key.into(),
            run_id: "r".into(),
            step_id: step.into(),
            tool: "charge".into(),
            class,
            fingerprint: "f".into(),
            args: serde_json::Value::Null,
            sealed: None,
            status,
            owner: "host-a".into(),
            lease_until_ms,
            fence: 1,
            attempts: 1,
            output: None,
            error: None,
            created_ms: 0,
            updated_ms: 0,
            reconciled: None,
        }
    }

    fn charged(key: &str) -> OperationRecord {
        op(key, key, OperationStatus::Completed, ReplayClass::Compensatable, 0)
    }

    fn undoing(of: &OperationRecord, status: OperationStatus) -> OperationRecord {
        op(&format!("undo-{}", of.key), &compensation_step(of), status, ReplayClass::IdempotentWrite, 0)
    }

    fn request(key: &str, state: ApprovalState, expires_ms: Option<u64>) -> ApprovalRecord {
        ApprovalRecord {
            operation_key: key.into(),
            fingerprint: "f".into(),
            component: Some("sha256:aa".into()),
            run_id: "r".into(),
            step_id: key.into(),
            tool: "fulfill".into(),
            description: String::new(),
            consequence: None,
            args: serde_json::Value::Null,
            sealed: None,
            requested_ms: 0,
            state,
            decided_by: None,
            decided_ms: None,
            note: None,
            expires_ms,
            revision: 1,
        }
    }

    fn whys(open: &[Open]) -> Vec<(&str, &Why)> {
        open.iter().map(|o| (o.operation_key.as_str(), &o.why)).collect()
    }

    #[test]
    fn a_run_whose_steps_all_ended_is_closed() {
        let failed = op("b", "b", OperationStatus::Failed, ReplayClass::Compensatable, 0);
        assert!(
            open_reasons(&[charged("a"), failed], &[], &[request("c", ApprovalState::Rejected, None)], 10).is_empty()
        );
    }

    #[test]
    fn an_unknown_step_keeps_its_run_open() {
        let unknown = op("a", "a", OperationStatus::Unknown, ReplayClass::Compensatable, 0);
        assert_eq!(whys(&open_reasons(&[unknown], &[], &[], 10)), [("a", &Why::Unknown)]);
    }

    #[test]
    fn a_claim_in_flight_keeps_its_run_open_and_a_claim_past_its_lease_is_abandoned() {
        let live = op("a", "a", OperationStatus::Claimed, ReplayClass::Compensatable, 100);
        let gone = op("b", "b", OperationStatus::Claimed, ReplayClass::Compensatable, 0);
        let open = open_reasons(&[charged("c")], &[live, gone], &[], 50);
        let owner = "host-a".to_string();
        assert_eq!(
            whys(&open),
            [
                ("a", &Why::InFlight { owner: owner.clone(), lease_until_ms: 100, recorded: false }),
                ("b", &Why::Abandoned { owner, lease_until_ms: 0, recorded: false }),
            ]
        );
        // At its lease's end the owner is gone.
        assert!(matches!(
            open_reasons(&[], &[op("a", "a", OperationStatus::Claimed, ReplayClass::ReadOnly, 100)], &[], 100)[0].why,
            Why::Abandoned { .. }
        ));
    }

    #[test]
    fn a_claim_read_both_in_flight_and_recorded_is_the_recorded_operation() {
        let flying = op("a", "a", OperationStatus::Claimed, ReplayClass::Compensatable, 100);
        assert!(open_reasons(&[charged("a")], std::slice::from_ref(&flying), &[], 50).is_empty());
        let recorded = op("a", "a", OperationStatus::Claimed, ReplayClass::Compensatable, 100);
        let open = open_reasons(&[recorded], &[flying], &[], 50);
        assert_eq!(open.len(), 1);
        assert!(matches!(open[0].why, Why::InFlight { recorded: true, .. }), "{open:?}");
    }

    #[test]
    fn a_request_awaits_until_an_operation_answers_it_and_an_expired_approval_awaits_a_new_decision() {
        let asked = [
            request("p", ApprovalState::Pending, None),
            request("a", ApprovalState::Approved, None),
            request("e", ApprovalState::Approved, Some(5)),
            request("x", ApprovalState::Rejected, None),
            request("used", ApprovalState::Approved, None),
        ];
        let used = op("used", "used", OperationStatus::Completed, ReplayClass::Irreversible, 0);
        let open = open_reasons(&[used], &[], &asked, 10);
        let standing = |s| Why::AwaitingApproval { standing: s };
        assert_eq!(
            whys(&open),
            [
                ("p", &standing(ApprovalStanding::Pending)),
                ("a", &standing(ApprovalStanding::Approved)),
                ("e", &standing(ApprovalStanding::Expired)),
            ]
        );
        // A claim in flight uses its approval: the claim keeps the run open, not the request.
        let flying = op("p", "p", OperationStatus::Claimed, ReplayClass::Irreversible, 100);
        let open = open_reasons(&[], &[flying], &asked[..1], 10);
        assert!(matches!(whys(&open)[..], [("p", Why::InFlight { .. })]), "{open:?}");
    }

    #[test]
    fn compensation_is_outstanding_once_started_until_every_undoable_step_is_undone_by_any_tool() {
        let (a, b) = (charged("a"), charged("b"));
        let kept = op("k", "k", OperationStatus::Completed, ReplayClass::Irreversible, 0);
        assert!(open_reasons(&[a.clone(), b.clone(), kept.clone()], &[], &[], 10).is_empty(), "not started");
        let mut undone = undoing(&b, OperationStatus::Completed);
        undone.tool = "refund-v2".into();
        let ops = [a.clone(), b.clone(), kept, undone];
        assert_eq!(whys(&open_reasons(&ops, &[], &[], 10)), [("a", &Why::CompensationOutstanding)]);
        // A compensation in flight has started it too, and keeps the run open itself.
        let flying = op("undo-a", &compensation_step(&a), OperationStatus::Claimed, ReplayClass::IdempotentWrite, 99);
        let open = open_reasons(&[a, b], &[flying], &[], 10);
        assert_eq!(open.len(), 3, "{open:?}");
        assert!(open[0].is_compensation() && matches!(open[0].why, Why::InFlight { .. }), "{open:?}");
    }

    #[test]
    fn a_person_s_word_that_they_undid_one_step_by_hand_starts_no_compensation_of_the_others() {
        let (a, b) = (charged("a"), charged("b"));
        let mut said = undoing(&b, OperationStatus::Completed);
        said.tool = BY_HAND.into();
        assert!(open_reasons(&[a.clone(), b.clone(), said.clone()], &[], &[], 10).is_empty());
        assert!(open_keys(&[a.clone(), b.clone(), said.clone()], &[]).is_empty());
        // Once a compensation runs, the step the word undid counts as undone, the others not.
        let refunded = undoing(&a, OperationStatus::Failed);
        let ops = [a, b, said, refunded];
        assert_eq!(whys(&open_reasons(&ops, &[], &[], 10)), [("a", &Why::CompensationOutstanding)]);
    }

    #[test]
    fn a_step_is_said_undone_by_hand_only_once_its_compensation_cannot_undo_it() {
        let a = charged("a");
        let one = std::slice::from_ref(&a);
        fn word<'a>(
            ops: &'a [OperationRecord],
            flying: &'a [OperationRecord],
            asked: &[ApprovalRecord],
            gone: &'a [Tombstone],
        ) -> Result<ByHand<'a>, ByHandRefused> {
            by_hand("a", ops, flying, asked, gone, 10)
        }
        // Nothing of its compensation exists: at the compensation's own key.
        assert_eq!(word(one, &[], &[], &[]), Ok(ByHand::InPlace));
        // Its compensation failed, or its request was rejected (kept or removed): beside it.
        let failed = undoing(&a, OperationStatus::Failed);
        assert_eq!(word(&[a.clone(), failed.clone()], &[], &[], &[]), Ok(ByHand::Beside));
        let mut rejected = request("undo-a", ApprovalState::Rejected, None);
        rejected.step_id = compensation_step(&a);
        assert_eq!(word(one, &[], std::slice::from_ref(&rejected), &[]), Ok(ByHand::Beside));
        let went = Tombstone { rejected: true, ..Tombstone::of(&failed, 9) };
        assert_eq!(word(one, &[], &[], std::slice::from_ref(&went)), Ok(ByHand::Beside));
        // The step's own record is gone: beside, as nothing can be made to undo it.
        let stone = Tombstone::of(&a, 9);
        assert_eq!(word(&[], &[], &[], std::slice::from_ref(&stone)), Ok(ByHand::Beside));

        // Its compensation may still undo it, or may have: refused.
        let refused = |result: Result<ByHand, ByHandRefused>, state: &str| match result {
            Err(ByHandRefused::CompensationOpen { state: s, .. }) => assert_eq!(s, state),
            other => panic!("{state}: {other:?}"),
        };
        refused(word(&[a.clone(), undoing(&a, OperationStatus::Unknown)], &[], &[], &[]), "unknown");
        let mut running = undoing(&a, OperationStatus::Claimed);
        running.lease_until_ms = 11;
        refused(word(one, std::slice::from_ref(&running), &[], &[]), "in progress");
        // Its owner gone (or a settlement reopened it): ended first, then the word.
        running.lease_until_ms = 10;
        assert_eq!(word(one, std::slice::from_ref(&running), &[], &[]), Ok(ByHand::EndAbandoned(&running)));
        // Read in flight and since recorded failed: the record.
        assert_eq!(word(&[a.clone(), failed.clone()], std::slice::from_ref(&running), &[], &[]), Ok(ByHand::Beside));
        let mut pending = rejected.clone();
        pending.state = ApprovalState::Pending;
        refused(word(one, &[], &[pending], &[]), "awaiting approval");
        let mut approved = rejected.clone();
        approved.state = ApprovalState::Approved;
        // Asked under another key (one whose compensation failed under this one): it may still run.
        approved.operation_key = "undo-a-by-refund-v1".into();
        refused(word(&[a.clone(), failed.clone()], &[], &[approved], &[]), "awaiting approval");
        // Undone by its compensation: refused; by a person's word: answered from it.
        let undone = undoing(&a, OperationStatus::Completed);
        assert!(matches!(word(&[a.clone(), undone], &[], &[], &[]), Err(ByHandRefused::Compensated { .. })));
        let mut said = undoing(&a, OperationStatus::Completed);
        said.tool = BY_HAND.into();
        assert!(matches!(word(&[a.clone(), failed.clone(), said.clone()], &[], &[], &[]), Ok(ByHand::Said(_))));
        // A word being recorded (claimed) is not a compensation: its key's claim decides.
        said.status = OperationStatus::Claimed;
        assert_eq!(word(one, &[said], &[], &[]), Ok(ByHand::InPlace));
        // A word that retention removed still counts, so a step is never said undone twice.
        let mut said_gone = Tombstone::of(&undoing(&a, OperationStatus::Completed), 9);
        said_gone.tool = BY_HAND.into();
        assert!(matches!(word(one, &[], &[], &[said_gone]), Ok(ByHand::Said(Undone::Removed(_)))));

        // Only a step a compensation would undo.
        fn not<'a>(ops: &'a [OperationRecord], key: &str) -> Result<ByHand<'a>, ByHandRefused> {
            by_hand(key, ops, &[], &[], &[], 10)
        }
        let kept = op("k", "k", OperationStatus::Completed, ReplayClass::Irreversible, 0);
        assert!(matches!(not(&[kept], "k"), Err(ByHandRefused::NotUndoable { .. })));
        let lost = op("f", "f", OperationStatus::Failed, ReplayClass::Compensatable, 0);
        assert!(matches!(not(&[lost], "f"), Err(ByHandRefused::NotUndoable { .. })));
        let doubt = op("u", "u", OperationStatus::Unknown, ReplayClass::Compensatable, 0);
        let unknown = not(std::slice::from_ref(&doubt), "u");
        assert!(
            matches!(&unknown, Err(ByHandRefused::NotUndoable { what, .. }) if what.starts_with("unknown: settle"))
        );
        assert!(matches!(not(std::slice::from_ref(&failed), "undo-a"), Err(ByHandRefused::NotUndoable { .. })));
        assert_eq!(not(&[], "x"), Err(ByHandRefused::NoStep("x".into())));
    }

    #[test]
    fn a_reason_s_name_is_the_one_it_is_serialized_with() {
        let (owner, standing) = (String::new(), ApprovalStanding::Pending);
        for why in [
            Why::Unknown,
            Why::InFlight { owner: owner.clone(), lease_until_ms: 0, recorded: false },
            Why::Abandoned { owner, lease_until_ms: 0, recorded: true },
            Why::AwaitingApproval { standing },
            Why::CompensationOutstanding,
        ] {
            let open = Open { step_id: "s".into(), tool: "t".into(), operation_key: "k".into(), why: why.clone() };
            let json = serde_json::to_value(&open).expect("serialize");
            assert_eq!(json["reason"], why.as_str(), "{json}");
            assert_eq!(json["step_id"], "s", "{json}");
        }
    }

    #[test]
    fn which_keys_are_open_does_not_depend_on_the_time_and_without_compensation_each_record_alone_decides() {
        let claimed = op("c", "c", OperationStatus::Claimed, ReplayClass::Compensatable, 100);
        let unknown = op("u", "u", OperationStatus::Unknown, ReplayClass::Compensatable, 0);
        let ops = [charged("a"), claimed, unknown, op("f", "f", OperationStatus::Failed, ReplayClass::ReadOnly, 0)];
        let asked = [
            request("p", ApprovalState::Pending, None),
            request("e", ApprovalState::Approved, Some(5)),
            request("x", ApprovalState::Rejected, None),
            request("a", ApprovalState::Approved, None),
        ];
        for now in [0, 50, 100, 1_000] {
            let at: BTreeSet<String> =
                open_reasons(&ops, &[], &asked, now).into_iter().map(|o| o.operation_key).collect();
            assert_eq!(at, open_keys(&ops, &asked), "at {now}");
        }
        let mut alone = BTreeSet::new();
        for key in ["a", "c", "u", "f", "p", "e", "x"] {
            let op: Vec<_> = ops.iter().filter(|op| op.key == key).cloned().collect();
            let request: Vec<_> = asked.iter().filter(|a| a.operation_key == key).cloned().collect();
            alone.extend(open_keys(&op, &request));
        }
        assert_eq!(alone, open_keys(&ops, &asked));
        assert_eq!(alone.into_iter().collect::<Vec<_>>(), ["c", "e", "p", "u"]);
        // Once compensation started, a completed step's openness is its run's.
        let undo = undoing(&ops[0], OperationStatus::Claimed);
        assert!(ties_the_run(&undo) && !ties_the_run(&ops[0]));
        assert!(open_keys(&[ops[0].clone(), undo], &[]).contains("a"));
    }

    #[test]
    fn runs_are_judged_each_on_its_own_records() {
        let mut other = op("o", "o", OperationStatus::Unknown, ReplayClass::Compensatable, 0);
        other.run_id = "other".into();
        let runs = open_runs(&[charged("a"), other], &[], &[], 10);
        assert_eq!(runs.keys().collect::<Vec<_>>(), ["other"]);
    }
}
