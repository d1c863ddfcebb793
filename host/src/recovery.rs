//! Recovery after a restart (DESIGN section 7). Opening the ledger does the recovering (see
//! `ledger/redb/open.rs`): claims of stopped owners lose their lease, so the next call of their
//! step takes them over; effects written ahead without an answer become unknown, and so do the
//! operations holding one. Nothing is replayed from a run's first step: every completed step is
//! answered from its record when it is called again. This room reports, per run, what that
//! leaves: what completed, what is in doubt, what awaits approval, what compensation is
//! outstanding, and which of those a person must decide.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::ledger::{ApprovalState, Ledger, LedgerError, OperationStatus};

/// One step as recovery sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RecoveredStep {
    pub step_id: String,
    pub tool: String,
    pub operation_key: String,
    /// The effects still in doubt (for `in_doubt`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub effects_in_doubt: Vec<String>,
}

/// What a person must decide, and the command that does it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    pub step_id: String,
    pub what: String,
    pub command: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RunRecovery {
    pub completed: Vec<RecoveredStep>,
    /// Unknown: reconcile, or settle by hand.
    pub in_doubt: Vec<RecoveredStep>,
    /// Claimed by an owner that stopped: the next call of the step takes it over.
    pub available: Vec<RecoveredStep>,
    pub failed: Vec<RecoveredStep>,
    pub awaiting_approval: Vec<RecoveredStep>,
    /// Completed compensatable steps whose compensation started and did not complete.
    pub compensation_outstanding: Vec<RecoveredStep>,
    pub decide: Vec<Decision>,
}

/// The state of every run (or one) after the ledger was opened, i.e. recovered.
pub async fn report(ledger: &Ledger, run: Option<&str>) -> Result<BTreeMap<String, RunRecovery>, LedgerError> {
    let path = ledger.path().display().to_string();
    let ops = ledger.operations(run).await?;
    let mut runs: BTreeMap<String, RunRecovery> = BTreeMap::new();
    for op in &ops {
        let entry = runs.entry(op.run_id.clone()).or_default();
        let mut step = RecoveredStep {
            step_id: op.step_id.clone(),
            tool: op.tool.clone(),
            operation_key: op.key.clone(),
            effects_in_doubt: Vec::new(),
        };
        match op.status {
            OperationStatus::Completed => entry.completed.push(step),
            OperationStatus::Failed => entry.failed.push(step),
            OperationStatus::Claimed => entry.available.push(step),
            OperationStatus::Unknown => {
                step.effects_in_doubt =
                    ledger.effects(&op.key).await?.into_iter().filter(|e| e.status.in_doubt()).map(|e| e.key).collect();
                entry.decide.push(Decision {
                    step_id: op.step_id.clone(),
                    what: format!("`{}` may have taken effect: ask its authority, or settle it by hand", op.tool),
                    command: format!(
                        "oncebox reconcile --ledger {path} --run {} --tools DIR  |  oncebox resolve --ledger {path} {} \
                         (--committed 'OUTPUT' | --not-committed) --by NAME",
                        op.run_id, op.key
                    ),
                });
                entry.in_doubt.push(step);
            }
        }
    }
    for approval in ledger.approvals(run).await? {
        // Pending, or approved and not used yet (maybe expired): the saga waits for either.
        let open = matches!(approval.state, ApprovalState::Pending | ApprovalState::Approved);
        if !open || ops.iter().any(|op| op.key == approval.operation_key) {
            continue;
        }
        let entry = runs.entry(approval.run_id.clone()).or_default();
        entry.decide.push(Decision {
            step_id: approval.step_id.clone(),
            what: format!("`{}` awaits approval of its exact params", approval.tool),
            command: format!(
                "oncebox approvals show --ledger {path} {0}  then  oncebox approve --ledger {path} {0} --fingerprint {1} \
                 --by NAME",
                approval.operation_key, approval.fingerprint
            ),
        });
        entry.awaiting_approval.push(RecoveredStep {
            step_id: approval.step_id,
            tool: approval.tool,
            operation_key: approval.operation_key,
            effects_in_doubt: Vec::new(),
        });
    }
    for (run_id, entry) in runs.iter_mut() {
        let of_run: Vec<&crate::ledger::OperationRecord> = ops.iter().filter(|op| &op.run_id == run_id).collect();
        if !crate::saga::outstanding(&of_run) {
            continue;
        }
        for op in &of_run {
            let undone = of_run
                .iter()
                .any(|c| c.step_id == crate::saga::compensation_step(op) && c.status == OperationStatus::Completed);
            if op.class == crate::ReplayClass::Compensatable
                && op.status == OperationStatus::Completed
                && !crate::saga::is_compensation(op)
                && !undone
            {
                entry.compensation_outstanding.push(RecoveredStep {
                    step_id: op.step_id.clone(),
                    tool: op.tool.clone(),
                    operation_key: op.key.clone(),
                    effects_in_doubt: Vec::new(),
                });
            }
        }
        entry.decide.push(Decision {
            step_id: "*".into(),
            what: "the run's compensation is outstanding".into(),
            command: format!("oncebox compensate --ledger {path} --run {run_id} --tools DIR"),
        });
    }
    Ok(runs)
}
