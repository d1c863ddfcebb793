//! Reconciliation (DESIGN section 6): an operation whose outcome is unknown asks the tool's
//! authority, by effect key, what happened. `committed` completes it without a dispatch;
//! `not-committed` makes it safe to run again with the same keys; `still-unknown` proves nothing
//! and changes nothing.

use std::sync::Arc;

use serde::Serialize;

use crate::call::{Call, Outcome};
use crate::effects::EffectCtx;
use crate::error::CallError;
use crate::executor::prepare;
use crate::host::Inner;
use crate::ledger::{OperationStatus, Resolution};
use crate::runtime::LoadedTool;
use crate::runtime::bindings::Reconciliation as Answer;

/// What reconciling an operation found.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "result", rename_all = "kebab-case")]
pub enum Reconciliation {
    /// The effect took place; the operation is now completed with the authority's answer.
    Committed { outcome: Outcome },
    /// The authority has no trace of it: the next call for the step dispatches again, same key.
    NotCommitted { operation_key: String },
    /// Still in doubt; the reason says why (no `reconcile` export, several effects in doubt, the
    /// authority could not tell). A person decides.
    StillUnknown { operation_key: String, reason: String },
    /// The operation's outcome is not unknown (or there is no such operation): nothing to do.
    NotUnknown { outcome: Option<Outcome> },
}

pub(crate) async fn reconcile(host: &Inner, tool: &Arc<LoadedTool>, call: Call) -> Result<Reconciliation, CallError> {
    let prepared = prepare(tool, call)?;
    let key = prepared.operation_key.clone();
    let Some(op) = host.shared.ledger.operation(&key)? else {
        return Ok(Reconciliation::NotUnknown { outcome: None });
    };
    if op.status != OperationStatus::Unknown || op.fingerprint != prepared.fingerprint {
        return Ok(Reconciliation::NotUnknown { outcome: Some(Outcome::replay(&op)) });
    }
    let still = |reason: String| Ok(Reconciliation::StillUnknown { operation_key: key.clone(), reason });
    let in_doubt: Vec<_> = host.shared.ledger.effects(&key)?.into_iter().filter(|e| e.status.in_doubt()).collect();
    let effect = match in_doubt.as_slice() {
        [one] => one.clone(),
        [] => return still("no effect is in doubt: the tool itself reported the unknown outcome".into()),
        many => return still(format!("{} effects are in doubt; the tool can only vouch for one", many.len())),
    };

    let ctx = EffectCtx::new(
        host.shared.clone(),
        tool.sandbox.clone(),
        crate::executor::config_of(host, &tool.manifest.name),
        None,
    );
    let deadline = crate::executor::policy_of(host, tool).attempt_deadline;
    let answer = match host.runtime.reconcile(tool, ctx, &effect.key, &prepared.canonical_args, deadline).await {
        None => return still(format!("`{}` exports no reconcile", tool.manifest.name)),
        Some(Err(trap)) => return still(format!("reconcile failed: {trap}")),
        Some(Ok(answer)) => answer,
    };
    let resolution = match answer {
        Answer::StillUnknown => return still("the authority cannot tell".into()),
        Answer::Committed(output) => match serde_json::from_str::<serde_json::Value>(&output) {
            Ok(_) => Resolution::Committed { output },
            Err(e) => return still(format!("reconcile returned invalid JSON: {e}")),
        },
        Answer::NotCommitted => Resolution::NotCommitted,
    };
    tracing::info!(operation_key = %key, effect_key = %effect.key, ?resolution, "reconciled");
    let resolved = host.shared.ledger.resolve(&key, &effect.key, &resolution, crate::clock::now_ms()).await?;
    Ok(match resolved.status {
        OperationStatus::Completed => {
            Reconciliation::Committed { outcome: Outcome { replayed: false, ..Outcome::replay(&resolved) } }
        }
        _ => Reconciliation::NotCommitted { operation_key: key },
    })
}
