//! A read-only call outside any run: retried under the policy, never recorded (no run, no step,
//! nothing to answer a repeat from).

use std::time::Instant;

use super::verdict::{ATTEMPT_JITTER, Verdict, classify};
use crate::call::{Outcome, Status};
use crate::effects::EffectCtx;
use crate::retry::{self, Decision};
use crate::stage::{Entry, Stage};

/// Runs it; `canonical` is its validated args, `secrets` their sensitive values.
pub(super) async fn run(host: &Stage, entry: &Entry, canonical: &str, secrets: &[String]) -> Outcome {
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
