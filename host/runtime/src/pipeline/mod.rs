//! The call pipeline (DESIGN section 4), as named stages. This is the only place that sequences;
//! [`execute_keyed`] reads top to bottom:
//!
//! 1. `prepare`: the args validated, the keys derived from the orchestrator's ids;
//! 2. `admit`: the approval gate and the ledger's verdict: the operation is this caller's to run,
//!    or the call is answered (from the record, a conflict, in progress, awaiting approval);
//! 3. `attempts`: the attempt loop under the class's retry policy, each attempt judged
//!    (`verdict`) and recorded, the last with the operation's end.
//!
//! A read-only call outside any run skips the ledger altogether (`unrecorded`).

mod admit;
mod attempts;
mod prepare;
mod unrecorded;
mod verdict;

use crate::call::{Call, Outcome};
use crate::error::CallError;
use crate::keys;
use crate::redact::sensitive_values;
use crate::stage::{Entry, Stage};
use crate::telemetry::Span;
use admit::Admitted;
pub(crate) use attempts::stopped_sends;
pub(crate) use prepare::prepare;

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
    let span = Span::call(call.trace.as_ref(), &entry.tool.manifest.name, entry.tool.manifest.class);
    let result = stages(host, entry, call, operation_key, &span).await;
    span.called(&result);
    result
}

/// The stages, in order, under the call's span.
async fn stages(
    host: &Stage,
    entry: &Entry,
    call: Call,
    operation_key: Option<String>,
    span: &Span,
) -> Result<Outcome, CallError> {
    let tool = &entry.tool;
    if call.run_id.is_none() && call.step_id.is_none() && !tool.manifest.class.writes() {
        let args = prepare::validate(tool, &call.args)?;
        let secrets = sensitive_values(&args, &tool.manifest.sensitive);
        return Ok(unrecorded::run(host, entry, &keys::canonical_json(&args), &secrets).await);
    }
    let wait = call.wait.unwrap_or_default();
    let mut prepared = prepare(host, tool, call)?;
    if let Some(key) = operation_key {
        prepared.operation_key = key;
    }
    span.keyed(&prepared);
    prepared.trace = span.clone();
    let owned = match admit::admit(host, entry, &prepared, wait).await? {
        Admitted::Run(owned) => owned,
        Admitted::Answered(outcome) => return Ok(outcome),
    };
    attempts::run(host, entry, prepared, owned).await
}
