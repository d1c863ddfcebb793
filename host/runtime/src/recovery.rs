//! Recovery after a restart (DESIGN section 7). Opening the ledger does the recovering (see
//! `ledger/redb/open.rs`): claims of stopped owners lose their lease, so the next call of their
//! step takes them over; effects written ahead without an answer become unknown, and so do the
//! operations holding one. Nothing is replayed from a run's first step: every completed step is
//! answered from its record when it is called again. This room reports, per run, what that
//! leaves: what completed, what is in doubt, what awaits approval, what compensation is
//! outstanding, and which of those a person must decide.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::ledger::{Ledger, LedgerError, Open, OperationStatus, Why};

/// One step as recovery sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RecoveredStep {
    pub step_id: String,
    pub tool: String,
    pub operation_key: String,
    /// The effects still in doubt (for `in_doubt`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub effects_in_doubt: Vec<String>,
    /// What comes next for it, when nobody need decide (for `available`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
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
    /// Claimed by an owner whose lease is live (on this host or another; recorded or still in
    /// flight): let it finish.
    pub in_progress: Vec<RecoveredStep>,
    pub failed: Vec<RecoveredStep>,
    pub awaiting_approval: Vec<RecoveredStep>,
    /// Completed compensatable steps whose compensation started and did not complete.
    pub compensation_outstanding: Vec<RecoveredStep>,
    pub decide: Vec<Decision>,
    /// What keeps the run open, by the ledger's one rule (`ledger::run_state`); empty: closed.
    pub open: Vec<Open>,
}

fn recovered(step_id: &str, tool: &str, operation_key: &str) -> RecoveredStep {
    RecoveredStep {
        step_id: step_id.to_string(),
        tool: tool.to_string(),
        operation_key: operation_key.to_string(),
        effects_in_doubt: Vec::new(),
        next: None,
    }
}

/// The keys of operation `key`'s effects in doubt.
async fn in_doubt(ledger: &Ledger, key: &str) -> Result<Vec<String>, LedgerError> {
    Ok(ledger.effects(key).await?.into_iter().filter(|e| e.status.in_doubt()).map(|e| e.key).collect())
}

/// The state of every open run (or of `run`, open or not) after the ledger was opened, i.e.
/// recovered. What is open, and so what a person must decide, is the ledger's rule's to say; this
/// sorts it and says how. The whole ledger's report visits the open runs only, read from the
/// index of open work: O(open runs x their steps), never the completed history (a closed run has
/// nothing to recover; ask for it by `run` to see it).
pub async fn report(ledger: &Ledger, run: Option<&str>) -> Result<BTreeMap<String, RunRecovery>, LedgerError> {
    let path = ledger.path().display().to_string();
    let open = ledger.open_runs(run, ledger.now_ms()).await?;
    let ops = match run {
        Some(run) => ledger.operations(Some(run)).await?,
        None => {
            let mut ops = Vec::new();
            for run in open.keys() {
                ops.extend(ledger.operations(Some(run)).await?);
            }
            ops
        }
    };
    let mut runs: BTreeMap<String, RunRecovery> = BTreeMap::new();
    for op in &ops {
        let entry = runs.entry(op.run_id.clone()).or_default();
        match op.status {
            OperationStatus::Completed => entry.completed.push(recovered(&op.step_id, &op.tool, &op.key)),
            OperationStatus::Failed => entry.failed.push(recovered(&op.step_id, &op.tool, &op.key)),
            // Open: sorted below, from the rule.
            OperationStatus::Claimed | OperationStatus::Unknown => {}
        }
    }
    for (run_id, reasons) in open {
        let entry = runs.entry(run_id.clone()).or_default();
        let mut outstanding = false;
        for open in &reasons {
            let mut step = recovered(&open.step_id, &open.tool, &open.operation_key);
            match &open.why {
                Why::Unknown => {
                    step.effects_in_doubt = in_doubt(ledger, &open.operation_key).await?;
                    entry.decide.push(Decision {
                        step_id: open.step_id.clone(),
                        what: format!("`{}` may have taken effect: ask its authority, or settle it by hand", open.tool),
                        command: format!(
                            "oncebox reconcile --ledger {path} --run {run_id} --tools DIR  |  {}",
                            crate::reconcile::resolve_command(&path, &open.operation_key)
                        ),
                    });
                    entry.in_doubt.push(step);
                }
                Why::Abandoned { owner, .. } => {
                    // Nobody need decide: whichever comes first takes it over, and nothing of it
                    // is sent again blindly (an effect it may have sent makes it unknown).
                    // A compensation's claim, or a person's word: resumed by compensate, or said again.
                    step.effects_in_doubt = in_doubt(ledger, &open.operation_key).await?;
                    let runs_it = if step.effects_in_doubt.is_empty() {
                        "takes it over and runs it".to_string()
                    } else {
                        format!(
                            "takes it over and judges the effect(s) it left in doubt ({}) by the retry matrix: sent \
                             again with their keys only where the step's class and the downstream allow it, else it \
                             ends unknown (as a server's reconciler ends it by itself)",
                            step.effects_in_doubt.join(", ")
                        )
                    };
                    step.next = Some(crate::saga::next_for_abandoned(open, &run_id, &path).unwrap_or_else(|| {
                        format!(
                            "its owner {owner} is gone: the next call of step `{}` {runs_it}, or \
                             `oncebox compensate --ledger {path} --run {run_id} --tools DIR` takes it over and ends it",
                            open.step_id
                        )
                    }));
                    entry.available.push(step)
                }
                Why::InFlight { .. } => entry.in_progress.push(step),
                Why::AwaitingApproval { .. } => {
                    let request = ledger.approval(&open.operation_key).await?;
                    let fingerprint = request.as_ref().map(|a| a.fingerprint.clone());
                    let component = request.and_then(|a| a.component);
                    entry.decide.push(Decision {
                        step_id: open.step_id.clone(),
                        what: format!("`{}` awaits approval of its exact params", open.tool),
                        command: format!(
                            "oncebox approvals show --ledger {path} {0}  then  oncebox approve --ledger {path} {0} \
                             --fingerprint {1} --component {2} --by NAME",
                            open.operation_key,
                            fingerprint.as_deref().unwrap_or("FINGERPRINT"),
                            component.as_deref().unwrap_or("DIGEST")
                        ),
                    });
                    entry.awaiting_approval.push(step);
                }
                Why::CompensationOutstanding => {
                    outstanding = true;
                    entry.compensation_outstanding.push(step);
                }
            }
        }
        if outstanding {
            entry.decide.push(Decision {
                step_id: "*".into(),
                what: "the run's compensation is outstanding".into(),
                command: format!("oncebox compensate --ledger {path} --run {run_id} --tools DIR"),
            });
        }
        entry.open = reasons;
    }
    Ok(runs)
}
