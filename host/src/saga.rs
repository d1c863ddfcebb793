//! Compensation (the saga, DESIGN section 7): undoes a run's completed compensatable steps in
//! reverse order, each by calling its `compensated-by` tool as an operation of its own.
//!
//! A compensation's step id is derived from the operation it undoes (`compensate/OPERATION_KEY`),
//! so its operation key is too: a compensation run again, or resumed after a crash, is the same
//! operation, answered from its record once completed and deduplicated by the ledger while in
//! flight, and its effects carry the same keys downstream. That record is the saga's progress:
//! running `compensate` again resumes where it stopped. Its args come from the undone
//! operation's recorded args and output through the mapping the compensatable tool declares
//! (`compensation-args`), never from a person retyping them.
//!
//! It refuses to start while any step of the run is unknown, in progress or awaiting approval
//! (undoing half of what may have happened is a second guess), and names them. It keeps completed
//! irreversible steps and reports them. It stops at the first compensation that does not complete
//! (reverse order is the contract) and reports what a person needs to do about it: settle an
//! unknown one, or undo by hand a step whose compensation failed (a failed compensation is
//! recorded as such, and replayed, not tried again).

use serde::Serialize;
use serde_json::Value;

use std::sync::Arc;

use crate::call::{Call, Outcome, Status};
use crate::error::CallError;
use crate::ledger::{ApprovalState, OperationRecord, OperationStatus};
use crate::policy::ReplayClass;
use crate::stage::{Entry, Stage};

/// The step id of the compensation of `op`.
pub fn compensation_step(op: &OperationRecord) -> String {
    format!("{COMPENSATION_PREFIX}{}", op.key)
}

const COMPENSATION_PREFIX: &str = "compensate/";

/// Whether `op` is itself a compensation.
pub fn is_compensation(op: &OperationRecord) -> bool {
    op.step_id.starts_with(COMPENSATION_PREFIX)
}

/// Whether a run's compensation started and is not done: some compensation of it exists, and
/// some completed compensatable step of it has no completed compensation.
pub fn outstanding(ops: &[&OperationRecord]) -> bool {
    let started = ops.iter().any(|op| is_compensation(op));
    started && ops.iter().any(|op| undoable(op) && !compensated(ops, op))
}

fn undoable(op: &OperationRecord) -> bool {
    !is_compensation(op) && op.status == OperationStatus::Completed && op.class == ReplayClass::Compensatable
}

fn compensated(ops: &[&OperationRecord], op: &OperationRecord) -> bool {
    let step = compensation_step(op);
    ops.iter().any(|c| c.step_id == step && c.status == OperationStatus::Completed)
}

/// Where a run's compensation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SagaState {
    /// Every completed compensatable step is compensated.
    Done,
    /// Nothing was compensated: a step is unknown, in progress or awaiting approval.
    Blocked,
    /// A compensation did not complete; it and those after it remain.
    Outstanding,
}

/// What happened to one step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SagaStep {
    pub step_id: String,
    pub tool: String,
    pub operation_key: String,
    /// `compensated`, `kept` (irreversible, or nothing undoes it), `blocking`, `outstanding`
    /// (its compensation did not complete) or `pending` (after an outstanding one).
    pub action: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compensation: Option<Outcome>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SagaReport {
    pub run_id: String,
    pub state: SagaState,
    pub steps: Vec<SagaStep>,
}

fn step(op: &OperationRecord, action: &'static str, reason: Option<String>) -> SagaStep {
    SagaStep {
        step_id: op.step_id.clone(),
        tool: op.tool.clone(),
        operation_key: op.key.clone(),
        action,
        compensation: None,
        reason,
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
    let ops = ledger.operations(Some(run_id)).await?;
    let mut steps = Vec::new();
    for op in ops.iter().filter(|op| !is_compensation(op)) {
        let why = match op.status {
            OperationStatus::Unknown => Some(format!(
                "unknown: reconcile it (oncebox reconcile --run {run_id}) or settle it (oncebox resolve {})",
                op.key
            )),
            OperationStatus::Claimed => Some("in progress: let it finish, or let its lease run out".to_string()),
            _ => None,
        };
        if let Some(why) = why {
            steps.push(step(op, "blocking", Some(why)));
        }
    }
    for approval in ledger.approvals(Some(run_id)).await? {
        let awaiting = matches!(approval.state, ApprovalState::Pending | ApprovalState::Approved);
        if awaiting && !ops.iter().any(|op| op.key == approval.operation_key) {
            steps.push(SagaStep {
                step_id: approval.step_id.clone(),
                tool: approval.tool.clone(),
                operation_key: approval.operation_key.clone(),
                action: "blocking",
                compensation: None,
                reason: Some(format!(
                    "awaiting approval: approve or reject it first (oncebox approvals show {})",
                    approval.operation_key
                )),
            });
        }
    }
    if !steps.is_empty() {
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
        if state == SagaState::Outstanding {
            steps.push(step(op, "pending", Some("waits for the outstanding compensation before it".into())));
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
        let call = Call::step(run_id, compensation_step(op), &undoing.tool.manifest.name, args.to_string());
        let outcome = crate::executor::execute(stage, &undoing, call).await?;
        let reason = match outcome.status {
            Status::Completed => None,
            Status::Unknown => Some(format!(
                "the compensation's outcome is unknown: reconcile it, or settle it with oncebox resolve {}",
                outcome.operation_key.as_deref().unwrap_or("?")
            )),
            Status::InProgress => Some("the compensation is running elsewhere; run compensate again later".into()),
            // Failed: nothing of the compensation took effect, and its step is recorded failed for
            // good (a replay answers the same), so a person undoes this step by other means.
            _ => Some(format!(
                "the compensation ended {}: {}; nothing of it took effect, and it is not tried again: a person must \
                 undo this step by hand",
                serde_json::to_value(outcome.status)
                    .ok()
                    .and_then(|v| v.as_str().map(String::from))
                    .unwrap_or_default(),
                outcome.error.as_ref().map_or("", |e| e.message.as_str())
            )),
        };
        let action = if reason.is_none() { "compensated" } else { "outstanding" };
        if reason.is_some() {
            state = SagaState::Outstanding;
        }
        steps.push(SagaStep { compensation: Some(outcome), ..step(op, action, reason) });
    }
    Ok(SagaReport { run_id: run_id.to_string(), state, steps })
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
