//! The third stage: the attempt loop under the class's retry policy. Each attempt runs in a
//! fresh instance, its effects through the guarded path; what it amounted to is judged under the
//! rule of evidence (an effect in doubt or taken keeps the operation from `failed`), and the
//! attempt, its local effects and, on the last one, the operation's end are recorded in one commit.

use std::time::{Duration, Instant};

use super::admit::Owned;
use super::verdict::{ATTEMPT_JITTER, Next, Verdict, classify};
use crate::attempt_log;
use crate::call::{Outcome, Prepared, Status};
use crate::effects::{EffectCtx, InDoubt, Scope};
use crate::error::CallError;
use crate::lease::Lease;
use crate::ledger::{
    AttemptEffect, AttemptRecord, AttemptSource, EffectRecord, ErrorRecord, LedgerError, OperationStatus,
};
use crate::policy::RetryPolicy;
use crate::redact::sensitive_values;
use crate::retry::{self, Decision, Failure};
use crate::runtime::Invocation;
use crate::stage::{Entry, Stage};

/// Runs the operation this caller holds until an attempt ends it, and says how it ended.
pub(super) async fn run(host: &Stage, entry: &Entry, prepared: Prepared, owned: Owned) -> Result<Outcome, CallError> {
    let (tool, policy) = (&entry.tool, &entry.policy);
    let name = tool.manifest.name.as_str();
    let class = tool.manifest.class;
    let Prepared { args, canonical_args: canonical, run_id, step_id, operation_key, trace, .. } = prepared;
    let secrets = sensitive_values(&args, &tool.manifest.sensitive);
    let shared_secrets: std::sync::Arc<[String]> = secrets.clone().into();
    let Owned { fence, previous_attempts, claimed_at } = owned;
    let call_started = Instant::now();
    let mut lease =
        Lease { host, key: operation_key.clone(), fence, until_ms: claimed_at + host.lease.as_millis() as u64 };
    let mut attempt = previous_attempts;
    // A take-over (a fresh claim has fence 1): the attempt its owner stopped in, if it sent
    // anything, is one of the class's attempts, judged first from what it left and never run again
    // under its number (DESIGN section 7). So an irreversible effect is never sent twice.
    let mut stopped = if fence == 1 { None } else { stopped_attempt(host, &operation_key, previous_attempts).await? };
    // Attempts run again because another step's KV write committed first (see below).
    let mut reruns = 0;
    loop {
        attempt += 1;
        let started_ms = host.shared.ledger.now_ms();
        let started = Instant::now();
        // A fresh claim's first attempt: nothing of the operation exists but what it writes.
        let first = fence == 1 && attempt == 1 && reruns == 0;
        let span = trace.attempt(attempt, policy.max_attempts);
        let scope = Scope {
            trace: span.clone(),
            journal: host.shared.ledger.journal(&operation_key, fence),
            redispatch_in_doubt: policy.redispatch_in_doubt,
            first,
            secrets: shared_secrets.clone(),
            attempt,
            once: class == crate::policy::ReplayClass::Irreversible,
        };
        let mut ctx = EffectCtx::new(host.shared.clone(), tool.sandbox.clone(), entry.config.clone(), Some(scope));
        let (mut invocation, mut ctx) = match stopped.take() {
            Some((why, sent)) => {
                ctx.effects = sent;
                (Invocation::Interrupted(why), ctx)
            }
            None => {
                let invoke = host.runtime.invoke(tool, ctx, &canonical, policy.attempt_deadline, &secrets);
                // The attempt's deadline bounds it (the store's timeout), with a moment to hand back.
                lease.over(policy.attempt_deadline + Duration::from_secs(1), invoke).await
            }
        };
        if ctx.rerun && reruns < MAX_KV_RERUNS {
            // A write-ahead carried a versioned KV write whose key another step wrote first: it was
            // refused, nothing of it left, and the attempt runs again from the start, uncounted.
            reruns += 1;
            attempt -= 1;
            let after = Duration::from_micros(200 << reruns.min(6)).mul_f64(retry::jitter(
                &operation_key,
                ATTEMPT_JITTER,
                reruns,
            ));
            lease.over(after, tokio::time::sleep(after)).await;
            continue;
        }
        if let (Invocation::Returned(_), Some(message)) = (&invocation, ctx.broken.take()) {
            // The guest swallowed a failed write-ahead (the local writes it staged before it are
            // gone) or a refused divergence: this attempt did not happen as the guest believes.
            invocation = Invocation::Unavailable(format!("the attempt cannot complete: {message}"));
        }
        // A fresh claim's first attempt made every effect the operation has: its own context knows
        // them all. Otherwise an earlier attempt, or an owner that lost its lease, may have left one.
        let (in_doubt, taken_before) = if first {
            (ctx.in_doubt.clone(), Vec::new())
        } else {
            standing(host, &operation_key, &ctx, policy).await?
        };
        let verdict = classify(invocation, &in_doubt, class).scrubbed(&secrets);
        let mut staged = std::mem::take(&mut ctx.staged);
        if !matches!(verdict, Verdict::Ok(_)) {
            // A failed attempt's local writes that no remote effect carried to disk are discarded:
            // the next attempt makes them again, and a failed operation leaves nothing behind.
            ctx.effects.retain(|e| !staged.iter().any(|(record, _)| record.key == e.key));
            staged.clear();
        }

        let taken = taken_effects(&ctx.effects, taken_before);
        let elapsed = call_started.elapsed();
        let (verdict, next) = what_follows(verdict, policy, attempt, elapsed, &operation_key, &taken);

        let mut record = AttemptRecord {
            operation_key: operation_key.clone(),
            run_id: run_id.clone(),
            step_id: step_id.clone(),
            tool: name.to_string(),
            attempt,
            max_attempts: policy.max_attempts,
            fence,
            started_ms,
            duration_us: started.elapsed().as_micros() as u64,
            outcome: verdict.class().to_string(),
            message: verdict.message(),
            source: AttemptSource::of(&ctx.effects),
            downstream_accepted: None,
            effects: ctx.effects,
        };
        record.downstream_accepted = attempt_log::downstream_accepted(&record);
        attempt_log::emit(&record);
        span.attempted(&record);
        // The attempt, its staged local effects, and the operation's final state when this was the
        // last one, in one commit.
        let finish = match next {
            Next::Finish(status) => Some((status, verdict.output_json(), verdict.error())),
            Next::Retry(_) => None,
        };
        match host.shared.ledger.record_attempt(fence, &record, finish, host.shared.ledger.now_ms(), staged).await {
            Ok(()) => host.shared.reached(|| crate::effects::hooks::Site::attempt(&operation_key, attempt)).await,
            // A versioned KV write found its key written by another step since the guest read it:
            // nothing of this attempt was recorded, so it runs again from the start under the same
            // number (it did not happen), reading the new value. Bounded, and spread out in time.
            Err(LedgerError::KvConflict { namespace, key }) if reruns < MAX_KV_RERUNS => {
                reruns += 1;
                attempt -= 1;
                tracing::debug!(%operation_key, %namespace, %key, reruns, "kv conflict; running the attempt again");
                let after = Duration::from_micros(200 << reruns.min(6)).mul_f64(retry::jitter(
                    &operation_key,
                    ATTEMPT_JITTER,
                    reruns,
                ));
                lease.over(after, tokio::time::sleep(after)).await;
                continue;
            }
            Err(LedgerError::KvConflict { namespace, key }) => {
                let error = ErrorRecord {
                    class: "kv-conflict".into(),
                    message: format!("kv {namespace}/{key} kept changing under concurrent writes; nothing was written"),
                };
                record.effects.clear();
                let failed = record_end(host, fence, &mut record, OperationStatus::Failed, error.clone()).await;
                return match failed {
                    Ok(()) => Ok(Verdict::Failed { failure: Failure::Transient, error }.into_outcome(
                        Status::Failed,
                        attempt,
                        Some(operation_key),
                    )),
                    // An earlier attempt's effect took place (or is in doubt): not failed, unknown.
                    Err(LedgerError::InDoubt { effect_key, .. } | LedgerError::EffectTaken { effect_key, .. }) => {
                        let message = format!("{}; effect {effect_key} may have taken place", error.message);
                        unknown(host, fence, &mut record, message, attempt, operation_key).await
                    }
                    Err(e) => Err(e.into()),
                };
            }
            // The ledger holds an effect in doubt (or taken) that this attempt did not account
            // for: the rule of evidence wins over the attempt's view, and the operation is unknown.
            Err(LedgerError::InDoubt { effect_key, .. } | LedgerError::EffectTaken { effect_key, .. }) => {
                tracing::error!(%operation_key, %effect_key, "an effect in doubt or taken was missed; recording unknown");
                let message = format!("effect {effect_key} may have taken place; reconcile it");
                return unknown(host, fence, &mut record, message, attempt, operation_key).await;
            }
            Err(e) => return Err(e.into()),
        }

        match next {
            Next::Retry(after) => lease.over(after, tokio::time::sleep(after)).await,
            Next::Finish(status) => return Ok(verdict.into_outcome(status.into(), attempt, Some(operation_key))),
        }
    }
}

/// Records `record` as the operation's last attempt, ending it `status` with `error`.
async fn record_end(
    host: &Stage,
    fence: u64,
    record: &mut AttemptRecord,
    status: OperationStatus,
    error: ErrorRecord,
) -> Result<(), LedgerError> {
    record.outcome = error.class.clone();
    record.message = Some(error.message.clone());
    host.shared
        .ledger
        .record_attempt(fence, record, Some((status, None, Some(error))), host.shared.ledger.now_ms(), Vec::new())
        .await
}

/// Ends the operation `unknown` (an effect of it may have taken place), and says so.
async fn unknown(
    host: &Stage,
    fence: u64,
    record: &mut AttemptRecord,
    message: String,
    attempt: u32,
    operation_key: String,
) -> Result<Outcome, CallError> {
    let error = ErrorRecord { class: "unknown-outcome".into(), message };
    record_end(host, fence, record, OperationStatus::Unknown, error.clone()).await?;
    let failure = Failure::UnknownOutcome { redispatchable: false };
    Ok(Verdict::Failed { failure, error }.into_outcome(Status::Unknown, attempt, Some(operation_key)))
}

/// How often one call runs an attempt again after a KV conflict before it gives up.
const MAX_KV_RERUNS: u32 = 64;

/// The attempt an earlier owner of the operation stopped in, if it wrote anything (DESIGN section
/// 7): why it ended, and the effects it wrote, as its record lists them. `recorded`: the attempts
/// on record, whose number the stopped one's effects are stamped above.
async fn stopped_attempt(
    host: &Stage,
    operation_key: &str,
    recorded: u32,
) -> Result<Option<(String, Vec<AttemptEffect>)>, CallError> {
    let effects = host.shared.ledger.effects(operation_key).await?;
    let sent = stopped_sends(&host.shared.ledger, operation_key, &effects, recorded).await?;
    if sent.is_empty() {
        return Ok(None);
    }
    let keys: Vec<&str> = sent.iter().map(|e| e.key.as_str()).collect();
    let why = format!(
        "its owner stopped (a crash, or a stall past its lease) after writing effect(s) {} and before recording \
         the attempt's end; taken over, that attempt counts and is not run again",
        keys.join(", ")
    );
    Ok(Some((why, sent)))
}

/// Of `effects`, the operation's on record, those its stopped owner's attempt sent and no
/// recorded attempt lists (`rules::unrecorded_sends`; `recorded`: the attempts on record), as a
/// record of that attempt lists them. The recorded attempts are read only when the rule needs
/// them. Asked by a take-over and by a saga closing a step whose owner is gone (`saga.rs`).
pub(crate) async fn stopped_sends(
    ledger: &crate::ledger::Ledger,
    operation_key: &str,
    effects: &[EffectRecord],
    recorded: u32,
) -> Result<Vec<AttemptEffect>, CallError> {
    let attempts = match crate::ledger::reads_attempts(effects) {
        true => ledger.attempts(operation_key).await?,
        false => Vec::new(),
    };
    Ok(crate::ledger::sent_by_stopped(&crate::ledger::unrecorded_sends(effects, recorded, &attempts)))
}

/// The attempt's own in-doubt effects, plus any that an earlier attempt (or a stopped owner) left
/// in doubt and this attempt did not settle: until each is settled, the operation cannot be called
/// done or failed, whatever the guest returned. And the effects on record that took place, which
/// keep it from being called failed.
async fn standing(
    host: &Stage,
    operation_key: &str,
    ctx: &EffectCtx,
    policy: &RetryPolicy,
) -> Result<(Vec<InDoubt>, Vec<String>), CallError> {
    let key = operation_key.to_string();
    let recorded = host.shared.ledger.effects(&key).await?;
    let now = host.shared.ledger.now_ms();
    let mut in_doubt = ctx.in_doubt.clone();
    let mut taken = Vec::new();
    for effect in &recorded {
        if effect.status.in_doubt() && !in_doubt.iter().any(|d| d.key == effect.key) {
            let resendable = host.shared.resendable(effect, policy.redispatch_in_doubt, now);
            in_doubt.push(InDoubt { key: effect.key.clone(), resendable });
        } else if effect.status.taken() {
            taken.push(effect.key.clone());
        }
    }
    Ok((in_doubt, taken))
}

/// The effects of the operation that took place: this attempt's and those on record before it.
fn taken_effects(effects: &[AttemptEffect], taken_before: Vec<String>) -> Vec<String> {
    let mut taken: Vec<String> = effects.iter().filter(|e| e.status.taken()).map(|e| e.key.clone()).collect();
    for key in taken_before {
        if !taken.contains(&key) {
            taken.push(key);
        }
    }
    taken
}

/// What follows an attempt judged `verdict`: the operation ends, or another attempt runs after a
/// wait, as the class's retry policy decides. `failed` means nothing of the operation took effect:
/// where an effect did (`taken`), and nothing undoes it, a failure ends the operation unknown
/// until reconciliation or a person says what it amounts to.
fn what_follows(
    verdict: Verdict,
    policy: &RetryPolicy,
    attempt: u32,
    elapsed: Duration,
    operation_key: &str,
    taken: &[String],
) -> (Verdict, Next) {
    let next = match &verdict {
        Verdict::Ok(_) => Next::Finish(OperationStatus::Completed),
        Verdict::Failed { failure, .. } => {
            let jitter = retry::jitter(operation_key, ATTEMPT_JITTER, attempt);
            match retry::decide(failure, policy, attempt, elapsed, jitter) {
                Decision::Retry { after } => Next::Retry(after),
                Decision::Fail => Next::Finish(OperationStatus::Failed),
                Decision::Unknown => Next::Finish(OperationStatus::Unknown),
            }
        }
    };
    match next {
        Next::Finish(OperationStatus::Failed) if !taken.is_empty() => {
            (verdict.after_effects(taken), Next::Finish(OperationStatus::Unknown))
        }
        next => (verdict, next),
    }
}
