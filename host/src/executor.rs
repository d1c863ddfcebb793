//! The call pipeline (DESIGN section 4), top to bottom. This is the only place that sequences:
//! validation, keys, the ledger's verdict, the attempt loop, the final record.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::approvals::{self, Gate};
use crate::attempt_log;
use crate::call::{Call, Outcome, Status};
use crate::effects::{EffectCtx, InDoubt, Scope};
use crate::error::CallError;
use crate::failure::{self, End, GuestError};
use crate::keys;
use crate::lease::Lease;
use crate::ledger::{
    AttemptRecord, AttemptSource, Claim, ClaimRequest, ErrorRecord, LedgerError, OperationStatus, SeenApproval,
};
use crate::policy::ReplayClass;
use crate::policy::RetryPolicy;
use crate::redact::{redact, scrub, sensitive_values};
use crate::retry::{self, Decision, Failure};
use crate::runtime::bindings::ToolError;
use crate::runtime::{Invocation, LoadedTool};
use crate::stage::{Entry, Stage};

/// A call's args validated and its keys derived.
pub(crate) struct Prepared {
    pub args: Value,
    pub canonical_args: String,
    pub run_id: String,
    pub step_id: String,
    pub operation_key: String,
    pub fingerprint: String,
    /// The fingerprints under the ledger's older secrets (see `keys::FingerprintKey`).
    pub older_fingerprints: Vec<String>,
}

impl Prepared {
    /// Whether an operation recorded with `fingerprint` was asked for with these args.
    pub fn matches(&self, fingerprint: &str) -> bool {
        self.fingerprint == fingerprint || self.older_fingerprints.iter().any(|older| older == fingerprint)
    }
}

/// Validates the args (bad input: a clear error, and nothing recorded) and derives the keys from
/// the orchestrator's ids.
pub(crate) fn prepare(host: &Stage, tool: &LoadedTool, call: Call) -> Result<Prepared, CallError> {
    let name = tool.manifest.name.as_str();
    let args = validate(tool, &call.args)?;
    let (Some(run_id), Some(step_id)) = (call.run_id, call.step_id) else {
        return Err(CallError::StepRequired { tool: name.to_string(), class: tool.manifest.class });
    };
    let canonical_args = keys::canonical_json(&args);
    Ok(Prepared {
        operation_key: keys::operation_key(&run_id, &step_id, name),
        fingerprint: host.shared.keying.fingerprint(name, &canonical_args),
        older_fingerprints: host.shared.keying.older_fingerprints(name, &canonical_args),
        canonical_args,
        args,
        run_id,
        step_id,
    })
}

pub(crate) async fn execute(host: &Stage, entry: &Entry, call: Call) -> Result<Outcome, CallError> {
    execute_keyed(host, entry, call, None).await
}

/// [`execute`], under `operation_key` when given rather than the key the call derives: the saga
/// resumes a compensation under the key it was recorded with (one recorded before compensations
/// were keyed by the step they undo), never under a second one.
pub(crate) async fn execute_keyed(
    host: &Stage,
    entry: &Entry,
    call: Call,
    operation_key: Option<String>,
) -> Result<Outcome, CallError> {
    let (tool, policy) = (&entry.tool, &entry.policy);
    let name = tool.manifest.name.as_str();
    let class = tool.manifest.class;

    if call.run_id.is_none() && call.step_id.is_none() && !class.writes() {
        let args = validate(tool, &call.args)?;
        let secrets = sensitive_values(&args, &tool.manifest.sensitive);
        return Ok(run_unrecorded(host, entry, &keys::canonical_json(&args), &secrets).await);
    }
    let wait = call.wait.unwrap_or_default();
    let mut prepared = prepare(host, tool, call)?;
    if let Some(key) = operation_key {
        prepared.operation_key = key;
    }
    let redacted = redact(&prepared.args, &tool.manifest.sensitive);
    // Irreversible tools (and any a policy names): a person approves these exact params first.
    // The claim carries the approval's revision and this component's digest: the store claims a
    // new operation only while that approval stands for this code (`ledger::approval_stands`).
    let seen = |revision: Option<u32>| SeenApproval { revision: revision.unwrap_or(0), component: tool.digest.clone() };
    let mut approval = None;
    if policy.requires_approval {
        match approvals::gate(&host.shared, tool, &prepared, &redacted).await? {
            Gate::Stop(outcome) => return Ok(outcome),
            Gate::Proceed { revision } => approval = Some(seen(revision)),
        }
    }
    let mut request = ClaimRequest {
        key: prepared.operation_key.clone(),
        fingerprint: prepared.fingerprint.clone(),
        older_fingerprints: prepared.older_fingerprints.clone(),
        args: redacted,
        run_id: prepared.run_id.clone(),
        step_id: prepared.step_id.clone(),
        tool: name.to_string(),
        class,
        owner: host.owner.clone(),
        now_ms: host.shared.ledger.now_ms(),
        lease_ms: host.lease.as_millis() as u64,
        approval,
    };
    // Before the claim: the lease the ledger grants can only end later than this says.
    let mut claimed_at = host.shared.ledger.now_ms();
    let mut claimed = claim(host, &request, wait).await?;
    // A decision landed between the gate and the claim (the store checks the approval with the
    // claim): the gate decides again, on what the approval says now.
    for _ in 0..3 {
        if !matches!(claimed, Claim::ApprovalChanged) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        match approvals::gate(&host.shared, tool, &prepared, &request.args).await? {
            Gate::Stop(outcome) => return Ok(outcome),
            Gate::Proceed { revision } => request.approval = Some(seen(revision)),
        }
        claimed_at = host.shared.ledger.now_ms();
        claimed = claim(host, &request, wait).await?;
    }
    let Prepared { args, canonical_args: canonical, run_id, step_id, operation_key, .. } = prepared;
    let secrets = sensitive_values(&args, &tool.manifest.sensitive);
    if let Claim::Recorded(op) = &claimed
        && op.status == OperationStatus::Unknown
        && policy.redispatch_in_doubt
    {
        claimed = reopen(host, &request, policy).await?;
    }
    let (fence, previous_attempts) = match claimed {
        Claim::Owned { fence, previous_attempts } => (fence, previous_attempts),
        Claim::Recorded(op) => {
            attempt_log::replayed(&op.run_id, &op.step_id, &op.tool, &op.key, op.status.as_str());
            return Ok(Outcome::replay(&op));
        }
        Claim::Conflict(op) => {
            let message = format!(
                "step `{}` of run `{}` was called before with different args; nothing was dispatched. \
                 Resolve the original operation first, or use a new step id for a new intent",
                op.step_id, op.run_id
            );
            return Ok(Outcome::refused(&op, Status::Conflict, "conflict", message));
        }
        Claim::InProgress(op) => {
            let message = format!("operation {} is being run by {}; try again later", op.key, op.owner);
            return Ok(Outcome::refused(&op, Status::InProgress, "in-progress", message));
        }
        Claim::Expired(tombstone) => return Ok(crate::retention::expired(&tombstone)),
        Claim::ApprovalChanged => {
            let message =
                "its approval kept changing while the call was made; nothing was dispatched: call again".into();
            return Ok(Outcome::stopped(&operation_key, Status::AwaitingApproval, "awaiting-approval", message));
        }
    };

    let call_started = Instant::now();
    let mut lease =
        Lease { host, key: operation_key.clone(), fence, until_ms: claimed_at + host.lease.as_millis() as u64 };
    let mut attempt = previous_attempts;
    // Attempts run again because another step's KV write committed first (see below).
    let mut reruns = 0;
    loop {
        attempt += 1;
        let started_ms = host.shared.ledger.now_ms();
        let started = Instant::now();
        // A fresh claim's first attempt: nothing of the operation exists but what it writes.
        let first = fence == 1 && attempt == 1 && reruns == 0;
        let scope = Scope {
            journal: host.shared.ledger.journal(&operation_key, fence),
            redispatch_in_doubt: policy.redispatch_in_doubt,
            first,
        };
        let ctx = EffectCtx::new(host.shared.clone(), tool.sandbox.clone(), entry.config.clone(), Some(scope));
        let invoke = host.runtime.invoke(tool, ctx, &canonical, policy.attempt_deadline, &secrets);
        // The attempt's deadline bounds it (the store's timeout), with a moment to hand back.
        let (mut invocation, mut ctx) = lease.over(policy.attempt_deadline + Duration::from_secs(1), invoke).await;
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
        let mut verdict = classify(invocation, &in_doubt, class).scrubbed(&secrets);
        let mut staged = std::mem::take(&mut ctx.staged);
        if !matches!(verdict, Verdict::Ok(_)) {
            // A failed attempt's local writes that no remote effect carried to disk are discarded:
            // the next attempt makes them again, and a failed operation leaves nothing behind.
            ctx.effects.retain(|e| !staged.iter().any(|(record, _)| record.key == e.key));
            staged.clear();
        }

        let mut next = match &verdict {
            Verdict::Ok(_) => Next::Finish(OperationStatus::Completed),
            Verdict::Failed { failure, .. } => {
                match retry::decide(
                    failure,
                    policy,
                    attempt,
                    call_started.elapsed(),
                    retry::jitter(&operation_key, ATTEMPT_JITTER, attempt),
                ) {
                    Decision::Retry { after } => Next::Retry(after),
                    Decision::Fail => Next::Finish(OperationStatus::Failed),
                    Decision::Unknown => Next::Finish(OperationStatus::Unknown),
                }
            }
        };
        if let Next::Finish(OperationStatus::Failed) = next {
            // `failed` means nothing of the operation took effect. Something did (an effect this
            // or an earlier attempt completed), and nothing undoes it: the operation is unknown
            // until reconciliation or a person says what it amounts to.
            let mut taken: Vec<String> =
                ctx.effects.iter().filter(|e| e.status.taken()).map(|e| e.key.clone()).collect();
            for key in taken_before {
                if !taken.contains(&key) {
                    taken.push(key);
                }
            }
            if !taken.is_empty() {
                verdict = verdict.after_effects(&taken);
                next = Next::Finish(OperationStatus::Unknown);
            }
        }
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

/// The domain of an attempt's jitter draws ([`retry::jitter`]).
const ATTEMPT_JITTER: &str = "oncebox/jitter";

/// An unknown operation whose in-doubt effects may all be resent with their keys (their hosts
/// honour keys, within retention) is taken over to resend them; anything else stays as recorded.
async fn reopen(host: &Stage, request: &ClaimRequest, policy: &RetryPolicy) -> Result<Claim, CallError> {
    let now = host.shared.ledger.now_ms();
    let resendable: Vec<String> = host
        .shared
        .ledger
        .effects(&request.key)
        .await?
        .into_iter()
        .filter(|e| e.status.in_doubt() && host.shared.resendable(e, policy.redispatch_in_doubt, now))
        .map(|e| e.key)
        .collect();
    let mut request = request.clone();
    request.now_ms = now;
    // The job checks the effects again inside its transaction: what was read here may be stale.
    Ok(host.shared.ledger.reopen(&request, resendable).await?)
}

/// Asks the ledger who runs the operation; while another caller holds it and this one asked to
/// wait, asks again until the result lands, the lease expires (then this caller takes over), or
/// the wait is over.
async fn claim(host: &Stage, request: &ClaimRequest, wait: Duration) -> Result<Claim, CallError> {
    let until = Instant::now() + wait;
    loop {
        let mut request = request.clone();
        request.now_ms = host.shared.ledger.now_ms();
        let claim = host.shared.ledger.claim(&request).await?;
        let now = Instant::now();
        let owner_lease = match &claim {
            Claim::InProgress(op) if now < until => op.lease_until_ms.saturating_sub(request.now_ms),
            _ => return Ok(claim),
        };
        // Until the operation changes (its owner's finish, or a take-over), or its owner's lease
        // runs out (then it may be taken over), or this caller's wait ends. A store that cannot
        // announce changes polls instead (`Store::changed`).
        let bound = (until - now).min(Duration::from_millis(owner_lease.max(1)));
        host.shared.ledger.changed(&request.key, bound).await;
    }
}

/// A read-only call outside any run: retried under the policy, never recorded.
async fn run_unrecorded(host: &Stage, entry: &Entry, canonical: &str, secrets: &[String]) -> Outcome {
    let (tool, policy) = (&entry.tool, &entry.policy);
    let call_started = Instant::now();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let ctx = EffectCtx::new(host.shared.clone(), tool.sandbox.clone(), entry.config.clone(), None);
        let (invocation, ctx) = host.runtime.invoke(tool, ctx, canonical, policy.attempt_deadline, secrets).await;
        let verdict = classify(invocation, &ctx.in_doubt, tool.manifest.class).scrubbed(secrets);
        let decision = match &verdict {
            Verdict::Ok(_) => return verdict.into_outcome(Status::Completed, attempt, None),
            Verdict::Failed { failure, .. } => retry::decide(
                failure,
                policy,
                attempt,
                call_started.elapsed(),
                retry::jitter(canonical, ATTEMPT_JITTER, attempt),
            ),
        };
        match decision {
            Decision::Retry { after } => tokio::time::sleep(after).await,
            Decision::Fail | Decision::Unknown => {
                return verdict.into_outcome(Status::Failed, attempt, None);
            }
        }
    }
}

/// Parses and validates args against the manifest's schema.
fn validate(tool: &LoadedTool, args: &str) -> Result<Value, CallError> {
    let invalid = |reason: String| CallError::InvalidArgs { tool: tool.manifest.name.clone(), reason };
    let max = tool.sandbox.limits.args_bytes;
    if args.len() > max {
        return Err(invalid(format!("{} bytes, over the limit of {max}", args.len())));
    }
    let value: Value = serde_json::from_str(args).map_err(|e| invalid(format!("not valid JSON: {e}")))?;
    // The yes-or-no check is much cheaper than collecting every error; valid args are the rule.
    if tool.schema.is_valid(&value) {
        return Ok(value);
    }
    let problems: Vec<String> = tool
        .schema
        .iter_errors(&value)
        .map(|e| {
            let at = e.instance_path().to_string();
            format!("{} {e}", if at.is_empty() { "(root)".to_string() } else { at })
        })
        .collect();
    if !problems.is_empty() {
        return Err(invalid(format!("does not match the input schema: {}", problems.join("; "))));
    }
    Ok(value)
}

/// What follows an attempt.
#[derive(Clone, Copy)]
enum Next {
    Retry(Duration),
    Finish(OperationStatus),
}

/// What one attempt amounted to.
enum Verdict {
    Ok(Value),
    Failed { failure: Failure, error: ErrorRecord },
}

impl Verdict {
    fn class(&self) -> &str {
        match self {
            Verdict::Ok(_) => "ok",
            Verdict::Failed { error, .. } => &error.class,
        }
    }

    fn output_json(&self) -> Option<String> {
        match self {
            Verdict::Ok(output) => Some(output.to_string()),
            Verdict::Failed { .. } => None,
        }
    }

    fn error(&self) -> Option<ErrorRecord> {
        match self {
            Verdict::Ok(_) => None,
            Verdict::Failed { error, .. } => Some(error.clone()),
        }
    }

    fn message(&self) -> Option<String> {
        match self {
            Verdict::Ok(_) => None,
            Verdict::Failed { error, .. } => Some(error.message.clone()),
        }
    }

    /// A failure that came after effects took place: the operation is unknown, not failed.
    fn after_effects(self, taken: &[String]) -> Self {
        match self {
            Verdict::Failed { error, .. } => Verdict::Failed {
                failure: Failure::UnknownOutcome { redispatchable: false },
                error: ErrorRecord {
                    class: "failed-after-effect".into(),
                    message: format!(
                        "{}; but effect(s) {} took place, and nothing undoes them: reconcile the operation or \
                         settle it by hand (oncebox resolve)",
                        error.message,
                        taken.join(", ")
                    ),
                },
            },
            ok => ok,
        }
    }

    fn scrubbed(self, secrets: &[String]) -> Self {
        match self {
            Verdict::Failed { failure, mut error } => {
                error.message = scrub(&error.message, secrets);
                Verdict::Failed { failure, error }
            }
            ok => ok,
        }
    }

    fn into_outcome(self, status: Status, attempts: u32, operation_key: Option<String>) -> Outcome {
        let (output, error) = match self {
            Verdict::Ok(output) => (Some(output), None),
            Verdict::Failed { error, .. } => (None, Some(error)),
        };
        Outcome { status, replayed: false, attempts, operation_key, output, error, fingerprint: None, approval: None }
    }
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

/// Maps an invocation to a verdict: the output, or the failure class (see `failure.rs`) with a
/// message for the records.
fn classify(invocation: Invocation, in_doubt: &[InDoubt], class: ReplayClass) -> Verdict {
    let (end, message, output) = match invocation {
        Invocation::Returned(output) => match serde_json::from_str::<Value>(&output) {
            Ok(value) => (End::Returned, String::new(), Some(value)),
            Err(e) => (End::InvalidOutput, format!("the tool returned invalid JSON: {e}"), None),
        },
        Invocation::Failed(error) => {
            let guest = match &error {
                ToolError::Transient(_) => GuestError::Transient,
                ToolError::RateLimited(r) => {
                    GuestError::RateLimited { retry_after: Duration::from_millis(r.retry_after_ms) }
                }
                ToolError::Permanent(_) => GuestError::Permanent,
                ToolError::UnknownOutcome(_) => GuestError::UnknownOutcome,
            };
            (End::Guest(guest), tool_error_message(&error), None)
        }
        Invocation::Trapped(trap) => (End::Trap, format!("the tool trapped: {trap}"), None),
        Invocation::DeadlineExceeded => (End::Deadline, "the attempt ran out of time".into(), None),
        Invocation::LimitExceeded(limit, message) => (End::Limit(limit), message, None),
        // The guest never ran, so nothing happened: like a trap before any effect.
        Invocation::Unavailable(message) => (End::Trap, format!("host: {message}"), None),
    };
    let resendable: Vec<bool> = in_doubt.iter().map(|d| d.resendable).collect();
    match (failure::attempt(&end, &resendable, class), output) {
        (None, Some(output)) => Verdict::Ok(output),
        (None, None) => Verdict::Failed {
            failure: Failure::Permanent,
            error: ErrorRecord { class: "invalid-output".into(), message: "the tool returned no output".into() },
        },
        (Some(classified), _) => {
            let message = if in_doubt.is_empty() {
                message
            } else {
                let keys: Vec<&str> = in_doubt.iter().map(|d| d.key.as_str()).collect();
                let why = if message.is_empty() { "the tool returned".to_string() } else { message };
                format!("{why}; effect(s) {} may have taken place", keys.join(", "))
            };
            Verdict::Failed {
                failure: classified.failure,
                error: ErrorRecord { class: classified.name.into(), message },
            }
        }
    }
}

fn tool_error_message(error: &ToolError) -> String {
    match error {
        ToolError::Transient(m) | ToolError::Permanent(m) | ToolError::UnknownOutcome(m) => m.clone(),
        ToolError::RateLimited(r) => format!("{} (retry after {} ms)", r.message, r.retry_after_ms),
    }
}
