//! Compensation (the saga, DESIGN section 7): undoes a run's completed compensatable steps in
//! reverse order, each by calling its `compensated-by` tool as an operation of its own.
//!
//! A compensation is bound to the operation it undoes, not to the tool that undoes it. Its step
//! id is derived from that operation (`compensate/OPERATION_KEY`), and its operation key from the
//! step alone (`keys::operation_key` leaves the tool out for a compensation's step): a
//! compensation run again, or resumed after a crash, is the same operation, answered from its
//! record once completed and deduplicated by the ledger while in flight, and its effects carry the
//! same keys downstream. A new version of the compensated tool that names another undo tool finds
//! the step's compensation on record: completed, it counts; begun and not completed, the new tool
//! is refused (a step is undone once, by the compensation it began with) and the report says how
//! to finish the one that began. That record is the saga's progress: running `compensate` again
//! resumes where it stopped. Its args come from the undone operation's recorded args and output
//! through the mapping the compensatable tool declares (`compensation-args`), never from a person
//! retyping them.
//!
//! A compensation that needs approval waits for it like any call: the first `compensate` records
//! the request and reports `awaiting-approval`, with the command that approves it and its page in
//! the console; once approved, the next `compensate` runs it, once. Rejected, nothing of it is
//! dispatched, and a person must undo the step by hand.
//!
//! It refuses to start while any step of the run is unknown, in progress or awaiting approval
//! (undoing half of what may have happened is a second guess), and names them. What counts is the
//! ledger's one rule of what keeps a run open (`ledger::run_state`), which sees claims in flight
//! too: a step claimed and not yet recorded, on this host or another, may be about to charge. A
//! step claimed by an owner that is gone (its lease ran out: a killed process, a claim reopened by
//! `resolve` or left by recovery) is not in progress: `compensate` takes it over and ends it,
//! failed when nothing of it took effect, so that no later call of it runs after its run was
//! undone, and unknown when something did (then a person settles it). It keeps completed
//! irreversible steps and reports them. It stops at the first compensation that does not complete (reverse order is
//! the contract) and reports what a person needs to do about it: approve it, settle an unknown
//! one, or undo by hand a step whose compensation failed or was rejected (a failed compensation is
//! recorded as such, and replayed, not tried again).
//!
//! A completed step whose record retention removed before the run was undone (`oncebox ledger
//! gc` removes a closed run's records once they are older than the retention, and a run with no
//! step open is closed) has no args or output left to make its compensation from. The saga reads
//! the run's tombstones (`Ledger::tombstones`, O(the run's)) and names each such compensatable
//! step `undo-by-hand`: never `Done` while its effect may stand.
//!
//! A person who undid a step by hand says so (`undone_by_hand`, `oncebox undone-by-hand`): the
//! word is recorded as the step's completed compensation, run by no tool, and the saga answers
//! the step `compensated` and goes on with the steps before it.

mod by_hand;
mod removed;

pub(crate) use by_hand::next_for_abandoned;
pub use by_hand::{UndoneByHand, undone_by_hand};

use std::collections::HashMap;
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

use crate::abandoned::{Closer, close_abandoned};
use crate::call::{Call, Outcome, Status};
use crate::clock::rfc3339 as time;
use crate::error::CallError;
pub use crate::keys::COMPENSATION_PREFIX;
use crate::ledger::{ApprovalRecord, ApprovalState, Open, OperationRecord, OperationStatus, Why, run_state};
use crate::policy::ReplayClass;
use crate::stage::{Entry, Stage};
use run_state::Undone;

// The compensation's identity (its step, bound to the operation it undoes) belongs to the rule of
// what keeps a run open, which the saga asks; re-exported for the saga's readers.
pub use crate::ledger::run_state::{compensation_step, is_compensation};

/// Where a run's compensation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SagaState {
    /// Every completed compensatable step is compensated.
    Done,
    /// Nothing was compensated: a step is unknown, in progress or awaiting approval.
    Blocked,
    /// A compensation awaits a person's approval (the step says how to give it); it and those
    /// after it remain. Run `compensate` again once it is approved.
    AwaitingApproval,
    /// A compensation did not complete; it and those after it remain.
    Outstanding,
}

/// What happened to one step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SagaStep {
    pub step_id: String,
    pub tool: String,
    pub operation_key: String,
    /// `compensated`, `kept` (irreversible, or nothing undoes it), `blocking`, `abandoned` (its
    /// owner was gone and nothing of it took effect: ended failed, nothing to undo),
    /// `awaiting-approval` (its compensation waits for a person), `outstanding` (its compensation
    /// did not complete), `undo-by-hand` (its compensation failed or was rejected, or its record
    /// expired before the run was undone: a person must undo the step) or `pending` (after one of
    /// those).
    pub action: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compensation: Option<Outcome>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// For `awaiting-approval`: the command that approves the compensation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approve: Option<String>,
    /// For `awaiting-approval`: the compensation's page in the console of an `oncebox serve` on
    /// this ledger (a path; [`SagaReport::served_at`] makes it a link).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub console: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SagaReport {
    pub run_id: String,
    pub state: SagaState,
    pub steps: Vec<SagaStep>,
}

impl SagaReport {
    /// The report as a server at `base_url` (`https://ops.example`) answers it: each console page
    /// a link on that server.
    pub fn served_at(mut self, base_url: &str) -> Self {
        let base = base_url.trim_end_matches('/');
        for step in &mut self.steps {
            if let Some(page) = step.console.as_mut().filter(|page| page.starts_with('/')) {
                *page = format!("{base}{page}");
            }
        }
        self
    }
}

fn step(op: &OperationRecord, action: &'static str, reason: Option<String>) -> SagaStep {
    SagaStep {
        step_id: op.step_id.clone(),
        tool: op.tool.clone(),
        operation_key: op.key.clone(),
        action,
        compensation: None,
        reason,
        approve: None,
        console: None,
    }
}

/// Compensates run `run_id` (see the module's docs). `tools` finds a loaded tool by name: the
/// run's compensatable tools and their compensations must be loaded.
pub(crate) async fn compensate(
    stage: &Stage,
    tools: &(dyn Fn(&str) -> Option<Arc<Entry>> + Sync),
    run_id: &str,
) -> Result<SagaReport, CallError> {
    let ledger = &stage.shared.ledger;
    let path = ledger.path().display().to_string();
    let mut steps = Vec::new();

    // Claims whose owner is gone are closed first, so that what follows sees what they amount to:
    // the rule of what keeps a run open names them (recorded or in flight), and the ledger decides
    // which are handed over (a live owner's claim is answered in progress and left alone). The
    // run's own compensations are resumed below, not closed.
    // Only when nothing else blocks the run: a blocked compensation changes nothing (closing a
    // step ends it failed for good, and the run may never be undone).
    let mut closed: HashMap<String, String> = HashMap::new();
    let first = open_of(stage, run_id).await?;
    let abandoned = |open: &Open| matches!(open.why, Why::Abandoned { .. }) && !open.is_compensation();
    let others_block = first
        .iter()
        .any(|open| !open.is_compensation() && open.why != Why::CompensationOutstanding && !abandoned(open));
    let abandoned: Vec<String> = if others_block {
        Vec::new()
    } else {
        first.into_iter().filter(abandoned).map(|open| open.operation_key).collect()
    };
    if !abandoned.is_empty() {
        let closer = Closer {
            owner: &stage.owner,
            lease_ms: stage.lease.as_millis() as u64,
            why: Some(
                "compensate, so that no later call of the step runs it after its run was undone (a new intent needs \
                 a new step id)",
            ),
            then: ", then compensate again",
        };
        let in_flight = ledger.in_flight(Some(run_id)).await?;
        let recorded = ledger.operations(Some(run_id)).await?;
        for key in &abandoned {
            let Some(op) = recorded.iter().chain(&in_flight).find(|op| &op.key == key) else { continue };
            if let Some((status, why)) = close_abandoned(ledger, &closer, op).await? {
                if status == OperationStatus::Failed {
                    steps.push(step(op, "abandoned", Some(why)));
                } else {
                    closed.insert(op.key.clone(), why);
                }
            }
        }
    }
    // What keeps the run open now. Read before the records the compensations are planned from, so
    // that a step claimed before this look is seen by it, in flight or recorded.
    let open = open_of(stage, run_id).await?;
    let ops = ledger.operations(Some(run_id)).await?;
    let approvals = ledger.approvals(Some(run_id)).await?;
    // What retention removed of the run, read after its records: an operation removed between
    // the two reads is in both, and one removed before in the tombstones, never in neither.
    let removed = ledger.tombstones(run_id).await?;

    // A step of the run that is not over blocks it: undoing half of what may have happened is a
    // second guess. The run's own compensations (in progress, unknown, awaiting approval) and its
    // outstanding compensation are the saga's business, below.
    let blocking: Vec<SagaStep> = open
        .into_iter()
        .filter(|open| !open.is_compensation() && open.why != Why::CompensationOutstanding)
        .map(|open| {
            let why = blocked_by(&open, &mut closed, &path, run_id);
            SagaStep {
                step_id: open.step_id,
                tool: open.tool,
                operation_key: open.operation_key,
                action: "blocking",
                compensation: None,
                reason: Some(why),
                approve: None,
                console: None,
            }
        })
        .collect();
    if !blocking.is_empty() {
        steps.extend(blocking);
        return Ok(SagaReport { run_id: run_id.to_string(), state: SagaState::Blocked, steps });
    }

    // Reverse order of execution: the last step that took effect is undone first.
    let mut done: Vec<&OperationRecord> =
        ops.iter().filter(|op| !is_compensation(op) && op.status == OperationStatus::Completed).collect();
    done.sort_by(|a, b| (b.created_ms, &b.key).cmp(&(a.created_ms, &a.key)));
    let mut state = SagaState::Done;
    for op in done {
        match op.class {
            ReplayClass::Irreversible => {
                steps.push(step(op, "kept", Some("irreversible: it cannot be undone, and was not".into())));
                continue;
            }
            ReplayClass::Compensatable => {}
            _ => continue,
        }
        if state != SagaState::Done {
            steps.push(step(op, "pending", Some("waits for the compensation before it".into())));
            continue;
        }
        let compensation = compensation_step(op);
        let begun: Vec<&OperationRecord> = ops.iter().filter(|c| c.step_id == compensation).collect();
        // Undone already, by whatever tool: answered from that record, whatever the compensated
        // tool names today.
        if let Some(undone) = begun.iter().find(|c| c.status == OperationStatus::Completed) {
            let reason = by_hand::reason(undone);
            steps.push(SagaStep { compensation: Some(Outcome::replay(undone)), ..step(op, "compensated", reason) });
            continue;
        }
        // Undone, and that record since removed by retention: never undone twice.
        if let Some(Undone::Removed(undone)) = run_state::undone_by(&op.key, &ops, &removed) {
            steps.push(step(op, "compensated", Some(removed::compensation_expired(undone))));
            continue;
        }
        // Begun, ended otherwise (failed, or its request rejected: anything else keeps the run
        // open, and so its records), and that record since removed: not begun again under
        // another key (one recorded before compensations were keyed by their step alone has its
        // tool in its key), as its record would not have been.
        if begun.is_empty()
            && let Some(ended) = removed.iter().find(|t| t.step_id == compensation)
        {
            steps.push(step(op, "undo-by-hand", Some(removed::compensation_ended(ended))));
            state = SagaState::Outstanding;
            continue;
        }
        let plan = tools(&op.tool)
            .ok_or_else(|| format!("`{}` is not loaded: put its component in --tools DIR", op.tool))
            .and_then(|entry| {
                let manifest = &entry.tool.manifest;
                let undo =
                    manifest.compensated_by.clone().ok_or_else(|| format!("`{}` names no compensated-by", op.tool))?;
                let Some(undoing) = tools(&undo) else {
                    return Err(format!("its compensation `{undo}` is not loaded: put its component in --tools DIR"));
                };
                Ok((undoing, compensation_args(&manifest.compensation_args, op)?))
            });
        let (undoing, args) = match plan {
            Ok(plan) => plan,
            Err(why) => {
                steps.push(step(op, "outstanding", Some(why)));
                state = SagaState::Outstanding;
                continue;
            }
        };
        let undo = undoing.tool.manifest.name.as_str();
        // Requests for approval of the compensation that no operation answers yet.
        let asked: Vec<&ApprovalRecord> = approvals
            .iter()
            .filter(|a| a.step_id == compensation && !begun.iter().any(|c| c.key == a.operation_key))
            .collect();
        if let Some((action, why)) = begun_otherwise(op, undo, &begun, &asked, &path) {
            steps.push(step(op, action, Some(why)));
            state = SagaState::Outstanding;
            continue;
        }
        // Resumed under the key it began with: a compensation recorded before compensations were
        // keyed by their step alone has its tool in its key.
        let key = begun.first().map(|c| c.key.clone()).or_else(|| asked.first().map(|a| a.operation_key.clone()));
        let call = Call::step(run_id, compensation, undo, args.to_string());
        let outcome = crate::pipeline::execute_keyed(stage, &undoing, call, key).await?;
        let key = outcome.operation_key.clone().unwrap_or_default();
        let message = outcome.error.as_ref().map_or("", |e| e.message.as_str()).to_string();
        let (action, reason) = match outcome.status {
            Status::Completed => ("compensated", None),
            Status::AwaitingApproval => {
                state = SagaState::AwaitingApproval;
                let page = crate::pages::approval(&key);
                let why = format!(
                    "its compensation `{undo}` needs a person's approval; nothing of it was dispatched: {message}, or \
                     approve it in the console of an `oncebox serve` on this ledger ({page}). Then run compensate \
                     again: it runs once, approved"
                );
                let approve = outcome.approval.as_ref().and_then(|view| view.approve.clone());
                steps.push(SagaStep {
                    approve,
                    console: Some(page),
                    compensation: Some(outcome),
                    ..step(op, "awaiting-approval", Some(why))
                });
                continue;
            }
            Status::Rejected => (
                "undo-by-hand",
                Some(format!(
                    "its compensation `{undo}` was rejected ({message}); nothing of it was dispatched, and nothing \
                     will be: a person must undo this step by hand"
                )),
            ),
            Status::Unknown => (
                "outstanding",
                Some(format!(
                    "the compensation's outcome is unknown: reconcile it (oncebox reconcile --ledger {path} --operation \
                     {key} --tools DIR), or settle it ({})",
                    crate::reconcile::resolve_command(&path, &key)
                )),
            ),
            Status::InProgress => {
                ("outstanding", Some("the compensation is running elsewhere; run compensate again later".into()))
            }
            Status::Conflict => (
                "outstanding",
                Some(format!(
                    "its compensation is on record with other params or another tool ({message}); nothing was \
                     dispatched: a step is undone once, by the compensation it began with"
                )),
            ),
            // Failed: nothing of the compensation took effect, and its step is recorded failed for
            // good (a replay answers the same), so a person undoes this step by other means.
            // Expired: its record is gone, so nothing says whether it ran: the same.
            Status::Failed | Status::Expired => (
                "undo-by-hand",
                Some(format!(
                    "the compensation ended {}: {message}; it is not tried again: a person must undo this step by hand",
                    outcome.status.as_str()
                )),
            ),
        };
        if reason.is_some() {
            state = SagaState::Outstanding;
        }
        steps.push(SagaStep { compensation: Some(outcome), ..step(op, action, reason) });
    }

    steps.extend(removed::report(&ops, &removed, &mut state));
    for step in steps.iter_mut().filter(|step| step.action == "undo-by-hand") {
        by_hand::ask(step, &path);
    }
    Ok(SagaReport { run_id: run_id.to_string(), state, steps })
}

/// What keeps run `run_id` open now, by the ledger's one rule.
async fn open_of(stage: &Stage, run_id: &str) -> Result<Vec<Open>, CallError> {
    let mut runs = stage.shared.ledger.open_runs(Some(run_id), stage.shared.ledger.now_ms()).await?;
    Ok(runs.remove(run_id).unwrap_or_default())
}

/// Why `open` blocks the run's compensation, and what to do about it. `closed`: why the steps this
/// compensate closed as unknown ended so.
fn blocked_by(open: &Open, closed: &mut HashMap<String, String>, path: &str, run_id: &str) -> String {
    let key = &open.operation_key;
    match &open.why {
        Why::Unknown => closed.remove(key).unwrap_or_else(|| {
            format!(
                "unknown: reconcile it (oncebox reconcile --ledger {path} --run {run_id} --tools DIR) or settle it \
                 ({})",
                crate::reconcile::resolve_command(path, key)
            )
        }),
        Why::InFlight { owner, lease_until_ms, recorded } => format!(
            "in progress{}: {owner} holds it until {}; let it finish, then compensate again (once its lease ends \
             without it, compensate takes it over)",
            if *recorded { "" } else { " (claimed, nothing of it recorded yet)" },
            time(*lease_until_ms)
        ),
        // Left as it is while something else blocks the run, or taken by another caller just now.
        Why::Abandoned { owner, .. } => format!(
            "claimed by {owner}, which no longer holds it: once nothing else blocks the run, compensate takes it \
             over and ends it (failed if nothing of it took effect)"
        ),
        Why::AwaitingApproval { standing } => format!(
            "awaiting approval ({}): approve or reject it first (oncebox approvals show --ledger {path} {key})",
            standing.as_str()
        ),
        Why::CompensationOutstanding => "its compensation is outstanding".into(),
    }
}

/// Why `op`'s compensation cannot be run by `undo`: it began (an operation, or a request for
/// approval) as another tool, or a person rejected it. `None`: `undo` may run it.
fn begun_otherwise(
    op: &OperationRecord,
    undo: &str,
    begun: &[&OperationRecord],
    asked: &[&ApprovalRecord],
    path: &str,
) -> Option<(&'static str, String)> {
    let once = format!(
        "`{}` now names `{undo}` to undo it, but a step is undone once, by the compensation it began with, never by a \
         second",
        op.tool
    );
    if let Some(other) = begun.iter().find(|c| c.tool != undo) {
        let key = &other.key;
        // A person's word that they undid it, claimed and not recorded (a crash between the two):
        // the same word again records it.
        if other.tool == crate::keys::BY_HAND {
            return Some((
                "outstanding",
                format!(
                    "a person's word that they undid it by hand was being recorded and did not finish: say it again \
                     ({})",
                    by_hand::command(path, &op.key)
                ),
            ));
        }
        return Some(match other.status {
            OperationStatus::Failed => (
                "undo-by-hand",
                format!(
                    "its compensation ran as `{}` and failed ({}); nothing of it took effect and it is not tried again, \
                     by `{}` or by `{undo}`: a person must undo this step by hand",
                    other.tool,
                    other.error.as_ref().map_or("", |e| e.message.as_str()),
                    other.tool
                ),
            ),
            OperationStatus::Unknown => (
                "outstanding",
                format!(
                    "its compensation began as `{}` (operation {key}) and its outcome is unknown. {once}: reconcile \
                     it with `{}` loaded (oncebox reconcile --ledger {path} --operation {key} --tools DIR) or settle \
                     it ({}), then compensate again",
                    other.tool,
                    other.tool,
                    crate::reconcile::resolve_command(path, key)
                ),
            ),
            _ => (
                "outstanding",
                format!(
                    "its compensation began as `{}` (operation {key}) and has not ended. {once}: compensate again with \
                     `{}` loaded and the version of `{}` that names it, which resumes it",
                    other.tool, other.tool, op.tool
                ),
            ),
        });
    }
    if let Some(rejected) = asked.iter().find(|a| a.state == ApprovalState::Rejected) {
        return Some((
            "undo-by-hand",
            format!(
                "{} rejected its compensation `{}`{}; nothing of it was dispatched, and nothing will be: a person must \
                 undo this step by hand",
                rejected.decided_by.as_deref().unwrap_or("a person"),
                rejected.tool,
                rejected.note.as_deref().map(|n| format!(" ({n})")).unwrap_or_default()
            ),
        ));
    }
    let other = asked.iter().find(|a| a.tool != undo)?;
    let key = &other.operation_key;
    Some((
        "outstanding",
        format!(
            "its compensation was submitted for approval as `{}` (operation {key}). {once}: approve that request and \
             compensate again with `{}` loaded and the version of `{}` that names it, or reject it (oncebox reject \
             --ledger {path} {key} --fingerprint {} --by NAME) and undo this step by hand",
            other.tool, other.tool, op.tool, other.fingerprint
        ),
    ))
}

/// The compensation's args: each pair's pointer read from `{"args": ..., "output": ...}` of the
/// undone operation (as recorded: sensitive values redacted, which loading keeps the mapping from).
pub fn compensation_args(mapping: &[(String, String)], op: &OperationRecord) -> Result<Value, String> {
    let output: Value = op.output.as_deref().and_then(|o| serde_json::from_str(o).ok()).unwrap_or(Value::Null);
    let source = serde_json::json!({ "args": op.args, "output": output });
    let mut args = serde_json::Map::new();
    for (name, pointer) in mapping {
        let value = source.pointer(pointer).ok_or_else(|| {
            format!("its compensation-args `{name}` reads `{pointer}`, which the operation does not have")
        })?;
        args.insert(name.clone(), value.clone());
    }
    Ok(Value::Object(args))
}
