//! Reconciliation (DESIGN section 7): an operation whose outcome is unknown asks the tool's
//! authority, by effect key, what happened, and the rule of evidence (`failure::reconciled`) says
//! what the answer proves. `committed` completes it without a dispatch; `not-committed`, once the
//! downstream's settle window has passed, makes it safe to run again with the same keys; anything
//! else proves nothing and changes nothing. A person can settle it by hand ([`settle`]).

use std::sync::Arc;

use serde::Serialize;

use crate::call::{Call, Outcome};
use crate::effects::EffectCtx;
use crate::error::CallError;
use crate::failure::{self, Proven, Reported};
use crate::ledger::{Ledger, OperationStatus, Resolution, Settlement};
use crate::pipeline::prepare;
use crate::runtime::bindings::Reconciliation as Answer;
use crate::stage::{Entry, Stage};

/// What reconciling an operation found.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "result", rename_all = "kebab-case")]
pub enum Reconciliation {
    /// The effect took place; the operation is now completed with the authority's answer.
    Committed { outcome: Outcome },
    /// The authority has no trace of it: the next call for the step dispatches again, same key.
    NotCommitted { operation_key: String },
    /// Still in doubt; the reason says why (no `reconcile` export, several effects in doubt, the
    /// authority could not tell, or an empty lookup while the request could still commit). A
    /// later reconcile or a person decides. `counts_from_ms`: when a `not-committed` answer
    /// would start to count.
    StillUnknown {
        operation_key: String,
        reason: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        counts_from_ms: Option<u64>,
    },
    /// The operation's outcome is not unknown (or there is no such operation): nothing to do.
    NotUnknown { outcome: Option<Outcome> },
}

pub(crate) async fn reconcile(host: &Stage, entry: &Entry, call: Call) -> Result<Reconciliation, CallError> {
    let prepared = prepare(host, &entry.tool, call)?;
    let Some(op) = host.shared.ledger.operation(&prepared.operation_key).await? else {
        return Ok(Reconciliation::NotUnknown { outcome: None });
    };
    if !prepared.matches(&op.fingerprint) {
        return Ok(Reconciliation::NotUnknown { outcome: Some(Outcome::replay(&op)) });
    }
    reconcile_recorded(host, entry, &op, &prepared.canonical_args).await
}

/// One operation's answer in a run's reconciliation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunReconciliation {
    pub step_id: String,
    pub tool: String,
    pub operation_key: String,
    #[serde(flatten)]
    pub answer: Reconciliation,
    /// What a person can run when the answer proved nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub settle_by_hand: Option<String>,
}

/// Reconciles every unknown operation of run `run_id` (or only the one keyed `only`) whose tool is
/// loaded, from its record (the tool's reconcile gets the recorded args, sensitive values
/// redacted: lookups go by effect key).
pub(crate) async fn reconcile_run(
    host: &Stage,
    tools: &(dyn Fn(&str) -> Option<Arc<Entry>> + Sync),
    run_id: &str,
    only: Option<&str>,
) -> Result<Vec<RunReconciliation>, CallError> {
    let mut answers = Vec::new();
    for op in host.shared.ledger.operations(Some(run_id)).await? {
        if op.status != OperationStatus::Unknown || only.is_some_and(|key| key != op.key) {
            continue;
        }
        let answer = match tools(&op.tool) {
            Some(entry) => reconcile_recorded(host, &entry, &op, &crate::keys::canonical_json(&op.args)).await?,
            None => Reconciliation::StillUnknown {
                operation_key: op.key.clone(),
                reason: format!("`{}` is not loaded: put its component in --tools DIR", op.tool),
                counts_from_ms: None,
            },
        };
        let settle_by_hand = matches!(answer, Reconciliation::StillUnknown { .. })
            .then(|| resolve_command(host.shared.ledger.path().display(), &op.key));
        answers.push(RunReconciliation {
            step_id: op.step_id.clone(),
            tool: op.tool.clone(),
            operation_key: op.key.clone(),
            answer,
            settle_by_hand,
        });
    }
    Ok(answers)
}

/// Asks the tool's authority about a recorded operation's effect in doubt, with `canonical_args`.
async fn reconcile_recorded(
    host: &Stage,
    entry: &Entry,
    op: &crate::ledger::OperationRecord,
    canonical_args: &str,
) -> Result<Reconciliation, CallError> {
    let key = op.key.clone();
    if op.status != OperationStatus::Unknown {
        return Ok(Reconciliation::NotUnknown { outcome: Some(Outcome::replay(op)) });
    }
    let still =
        |reason: String| Ok(Reconciliation::StillUnknown { operation_key: key.clone(), reason, counts_from_ms: None });
    let in_doubt: Vec<_> =
        host.shared.ledger.effects(&key).await?.into_iter().filter(|e| e.status.in_doubt()).collect();
    let effect = match in_doubt.as_slice() {
        [one] => one.clone(),
        [] => return still("no effect is in doubt: the tool itself reported the unknown outcome".into()),
        many => return still(format!("{} effects are in doubt; the tool can only vouch for one", many.len())),
    };

    let tool = &entry.tool;
    let ctx = EffectCtx::new(host.shared.clone(), tool.sandbox.clone(), entry.config.clone(), None);
    let deadline = entry.policy.attempt_deadline;
    // The caller's args carry the sensitive values (a run's reconciliation gets the record's,
    // redacted already, and the values from the record's seal): a trap's message and the answer
    // must not. A seal that does not open (another ledger's key) leaves only the caller's.
    let args = serde_json::from_str(canonical_args).unwrap_or_default();
    let mut secrets = crate::redact::sensitive_values(&args, &tool.manifest.sensitive);
    if op.sealed.is_some() {
        secrets.extend(recorded_secrets(&host.shared.keying, op));
        secrets.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        secrets.dedup();
    }
    let answer = match host.runtime.reconcile(tool, ctx, &effect.key, canonical_args, deadline, &secrets).await {
        None => return still(format!("`{}` exports no reconcile", tool.manifest.name)),
        Some(Err(trap)) => return still(format!("reconcile failed: {trap}")),
        Some(Ok(answer)) => answer,
    };
    let reported = match answer {
        Answer::StillUnknown => Reported::StillUnknown,
        // The authority's record echoes what it was sent (an address, a card): masked like any answer.
        Answer::Committed(output) => match serde_json::from_str::<serde_json::Value>(&output) {
            Ok(_) => Reported::Committed(crate::redact::mask_text(&output, &secrets).unwrap_or(output)),
            Err(e) => return still(format!("reconcile returned invalid JSON: {e}")),
        },
        Answer::NotCommitted => Reported::NotCommitted,
    };
    let now = host.shared.ledger.now_ms();
    let resolution = match failure::reconciled(reported, host.shared.lookup(&effect), now) {
        Proven::Taken(output) => Resolution::Committed { output },
        Proven::NotTaken => Resolution::NotCommitted,
        Proven::InDoubt { reason, counts_from_ms } => {
            tracing::info!(operation_key = %key, effect_key = %effect.key, %reason, "reconcile proved nothing");
            return Ok(Reconciliation::StillUnknown { operation_key: key.clone(), reason, counts_from_ms });
        }
    };
    // The verdict, never the output: logs hold no answer.
    tracing::info!(operation_key = %key, effect_key = %effect.key, verdict = resolution.verdict(), "reconciled");
    let settlement =
        Settlement { verdict: resolution.verdict().into(), by: "reconcile".into(), note: None, at_ms: now };
    let resolved =
        host.shared.ledger.resolve(&key, Some(&effect.key), Some(effect.dispatches), &resolution, &settlement).await?;
    Ok(match resolved.status {
        OperationStatus::Completed => {
            Reconciliation::Committed { outcome: Outcome { replayed: false, ..Outcome::replay(&resolved) } }
        }
        _ => Reconciliation::NotCommitted { operation_key: key },
    })
}

/// The command that settles operation `key` of the ledger at `ledger` by a person's word, as
/// every message that sends a person to settle one prints it.
pub fn resolve_command(ledger: impl std::fmt::Display, key: &str) -> String {
    format!(
        "oncebox resolve --ledger {ledger} {key} (--committed 'OUTPUT JSON' | --not-committed) --by NAME --note WHY"
    )
}

/// The sensitive values of a recorded operation's args, from the seal it keeps
/// (`seal::seal_params`), as `redact::sensitive_values` lists them: what is masked in what comes
/// back after the call, when the caller's args are gone (a reconcile from the record, a person's
/// settlement). None when it sealed none; none either when the seal does not open (another
/// ledger's key file), which is logged.
pub fn recorded_secrets(keying: &crate::keys::FingerprintKey, op: &crate::ledger::OperationRecord) -> Vec<String> {
    let Some(sealed) = &op.sealed else {
        return Vec::new();
    };
    let values = match crate::seal::open_values(keying, &op.key, sealed) {
        Ok(values) => values,
        Err(e) => {
            tracing::warn!(operation_key = %op.key, error = %e, "the sealed sensitive values did not open");
            return Vec::new();
        }
    };
    // Each value as the args held it, under a pointer of its own (the recorded pointers may
    // need escaping; the values are what matters).
    let values: Vec<serde_json::Value> = values.into_iter().map(|(_, value)| value).collect();
    let pointers: Vec<String> = (0..values.len()).map(|i| format!("/{i}")).collect();
    crate::redact::sensitive_values(&serde_json::Value::Array(values), &pointers)
}

/// Settles an unknown operation by a person's word (`oncebox resolve`): recorded with who and why.
/// This is how an operation of a tool without a `reconcile` export leaves `unknown`, besides a
/// same-key resend where its host honours keys.
pub async fn settle(
    ledger: &Ledger,
    keying: &crate::keys::FingerprintKey,
    operation_key: &str,
    effect_key: Option<&str>,
    resolution: &Resolution,
    by: &str,
    note: Option<&str>,
) -> Result<Outcome, CallError> {
    if let Resolution::Committed { output } = resolution {
        serde_json::from_str::<serde_json::Value>(output)
            .map_err(|e| CallError::InvalidResolution { reason: format!("the committed output is not JSON: {e}") })?;
    }
    if by.trim().is_empty() {
        return Err(CallError::InvalidResolution { reason: "say who settles it (--by NAME)".into() });
    }
    let Some(op) = ledger.operation(operation_key).await? else {
        return Err(CallError::InvalidResolution { reason: format!("no operation with key {operation_key}") });
    };
    // What the person copied or typed (a downstream's dashboard echoes the address too, a note
    // may quote the card) is masked like any answer, by the values the operation sealed.
    let secrets = recorded_secrets(keying, &op);
    let masked = |text: &str| crate::redact::mask_text(text, &secrets).unwrap_or_else(|| text.to_string());
    let masked_output;
    let resolution = match resolution {
        Resolution::Committed { output } => {
            masked_output = Resolution::Committed { output: masked(output) };
            &masked_output
        }
        _ => resolution,
    };
    let settlement = Settlement {
        verdict: resolution.verdict().into(),
        by: masked(by),
        note: note.map(masked),
        at_ms: ledger.now_ms(),
    };
    let resolved = ledger.resolve(operation_key, effect_key, None, resolution, &settlement).await?;
    tracing::info!(%operation_key, ?effect_key, verdict = settlement.verdict, by, "settled by hand");
    Ok(Outcome { replayed: false, ..Outcome::replay(&resolved) })
}
