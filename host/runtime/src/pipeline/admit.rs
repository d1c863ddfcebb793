//! The second stage: the approval gate and the ledger's verdict. The operation is this caller's
//! to run (a fresh claim, a take-over of a stalled owner's, or a reopened unknown whose effects may
//! be resent with their keys), or the call is answered here: from the record, as a conflict, as in
//! progress elsewhere, as expired, or as awaiting a person's approval.

use std::time::{Duration, Instant};

use crate::approvals::{self, Gate};
use crate::attempt_log;
use crate::call::{Outcome, Prepared, Status};
use crate::error::CallError;
use crate::ledger::{Claim, ClaimRequest, OperationStatus, SeenApproval, verdict};
use crate::policy::RetryPolicy;
use crate::redact::redact;
use crate::stage::{Entry, Stage};

/// What the second stage decided.
pub(super) enum Admitted {
    /// The operation is this caller's to run.
    Run(Owned),
    /// The call is answered without running anything.
    Answered(Outcome),
}

/// An operation this caller holds: its fence, how many attempts came before, and when the claim
/// was asked for (the lease the ledger granted can only end later than that says).
pub(super) struct Owned {
    pub fence: u64,
    pub previous_attempts: u32,
    pub claimed_at: u64,
}

/// Asks for approval where the policy needs it, then claims the operation; `wait` is how long a
/// caller that finds it in progress elsewhere waits for its result.
pub(super) async fn admit(
    host: &Stage,
    entry: &Entry,
    prepared: &Prepared,
    wait: Duration,
) -> Result<Admitted, CallError> {
    let (tool, policy) = (&entry.tool, &entry.policy);
    let name = tool.manifest.name.as_str();
    let class = tool.manifest.class;
    let redacted = redact(&prepared.args, &tool.manifest.sensitive);
    // Irreversible tools (and any a policy names): a person approves these exact params first.
    // The claim carries the approval's revision and this component's digest: the store claims a
    // new operation only while that approval stands for this code (`ledger::approval_stands`).
    let seen = |revision: Option<u32>| SeenApproval { revision: revision.unwrap_or(0), component: tool.digest.clone() };
    let mut approval = None;
    if policy.requires_approval {
        match approvals::gate(&host.shared, tool, prepared, &redacted).await? {
            Gate::Stop(outcome) => return Ok(Admitted::Answered(outcome)),
            Gate::Proceed { revision } => approval = Some(seen(revision)),
        }
    }
    let mut request = ClaimRequest {
        key: prepared.operation_key.clone(),
        fingerprint: prepared.fingerprint.clone(),
        older_fingerprints: prepared.older_fingerprints.clone(),
        args: redacted,
        sealed: crate::approvals::sealed_params(&host.shared, &tool.manifest.sensitive, prepared)?,
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
    let asked = Instant::now();
    let mut claimed = claim(host, &request, wait).await?;
    // A decision landed between the gate and the claim (the store checks the approval with the
    // claim): the gate decides again, on what the approval says now.
    for _ in 0..3 {
        if !matches!(claimed, Claim::ApprovalChanged) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        match approvals::gate(&host.shared, tool, prepared, &request.args).await? {
            Gate::Stop(outcome) => return Ok(Admitted::Answered(outcome)),
            Gate::Proceed { revision } => request.approval = Some(seen(revision)),
        }
        claimed_at = host.shared.ledger.now_ms();
        claimed = claim(host, &request, wait).await?;
    }
    if let Claim::Recorded(op) = &claimed
        && op.status == OperationStatus::Unknown
        && policy.redispatch_in_doubt
    {
        claimed = reopen(host, &request, policy).await?;
        // Reopened meanwhile by another caller (it is theirs now), or by a person's settlement
        // (nobody's until claimed): asked about again as any claim is, a caller that asked to
        // wait waiting what is left of its wait for the other caller's answer.
        if matches!(&claimed, Claim::Recorded(op) if op.status == OperationStatus::Claimed) {
            claimed_at = host.shared.ledger.now_ms();
            claimed = claim(host, &request, wait.saturating_sub(asked.elapsed())).await?;
        }
    }
    let answer = match claimed {
        Claim::Owned { fence, previous_attempts } => {
            return Ok(Admitted::Run(Owned { fence, previous_attempts, claimed_at }));
        }
        Claim::Recorded(op) if op.status != OperationStatus::Claimed => {
            attempt_log::replayed(&op.run_id, &op.step_id, &op.tool, &op.key, op.status.as_str());
            Outcome::replay(&op)
        }
        Claim::Conflict(op) => {
            let message = format!(
                "step `{}` of run `{}` was called before with different args; nothing was dispatched. \
                 Resolve the original operation first, or use a new step id for a new intent",
                op.step_id, op.run_id
            );
            Outcome::refused(&op, Status::Conflict, "conflict", message)
        }
        // Another caller runs it. (A record that says claimed is no answer: `claim` never gives
        // one, and one from `reopen` is asked about again above.)
        Claim::Recorded(op) | Claim::InProgress(op) => {
            let message = format!("operation {} is being run by {}; try again later", op.key, op.owner);
            Outcome::refused(&op, Status::InProgress, "in-progress", message)
        }
        Claim::Expired(tombstone) => crate::retention::expired(&tombstone),
        Claim::ApprovalChanged => {
            let message =
                "its approval kept changing while the call was made; nothing was dispatched: call again".into();
            Outcome::stopped(&prepared.operation_key, Status::AwaitingApproval, "awaiting-approval", message)
        }
    };
    Ok(Admitted::Answered(answer))
}

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
///
/// A caller that waits watches the operation's record, read without its lock, and claims only
/// when that record does not say in progress (by the one rule, [`verdict`]); one that does not
/// wait claims at once (one ask, no read added to the hot path). A claim decides under the
/// operation's lock, which the owner's lease renewal needs too: a crowd of waiting callers, each
/// claiming and holding the lock for a round trip of its own (slow when many processes share the
/// CPUs), queued the owner's renewal past its lease, and one of them took the step over from a
/// live owner (issue 35). A record read without the lock may be stale, but only toward "in
/// progress" (a lease only grows while its owner holds it, and a finish or a take-over wakes the
/// waiters): it makes a waiter wait longer, never take over.
async fn claim(host: &Stage, request: &ClaimRequest, wait: Duration) -> Result<Claim, CallError> {
    let until = Instant::now() + wait;
    let mut watching = !wait.is_zero();
    loop {
        let mut request = request.clone();
        request.now_ms = host.shared.ledger.now_ms();
        let seen = match watching {
            true => host.shared.ledger.operation(&request.key).await?,
            false => None,
        };
        let claim = match seen.and_then(|op| verdict(Some(&op), &request)) {
            Some(in_progress @ Claim::InProgress(_)) => in_progress,
            _ => host.shared.ledger.claim(&request).await?,
        };
        watching = true;
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
