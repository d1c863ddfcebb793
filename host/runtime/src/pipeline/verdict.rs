//! What one attempt amounted to: the guest's answer (or its trap, deadline or limit) mapped to a
//! verdict by the rule of evidence (`failure::attempt`), and what follows it.

use std::time::Duration;

use serde_json::Value;

use crate::call::{Outcome, Status};
use crate::effects::InDoubt;
use crate::failure::{self, End, GuestError};
use crate::ledger::{ErrorRecord, OperationStatus};
use crate::policy::ReplayClass;
use crate::redact::{mask_text, mask_value};
use crate::retry::Failure;
use crate::runtime::Invocation;
use crate::runtime::bindings::ToolError;

/// The domain of an attempt's jitter draws ([`crate::retry::jitter`]).
pub(super) const ATTEMPT_JITTER: &str = "oncebox/jitter";

/// What follows an attempt.
#[derive(Clone, Copy)]
pub(super) enum Next {
    Retry(Duration),
    Finish(OperationStatus),
}

/// What one attempt amounted to.
pub(super) enum Verdict {
    Ok(Value),
    Failed { failure: Failure, error: ErrorRecord },
}

impl Verdict {
    pub(super) fn class(&self) -> &str {
        match self {
            Verdict::Ok(_) => "ok",
            Verdict::Failed { error, .. } => &error.class,
        }
    }

    pub(super) fn output_json(&self) -> Option<String> {
        match self {
            Verdict::Ok(output) => Some(output.to_string()),
            Verdict::Failed { .. } => None,
        }
    }

    pub(super) fn error(&self) -> Option<ErrorRecord> {
        match self {
            Verdict::Ok(_) => None,
            Verdict::Failed { error, .. } => Some(error.clone()),
        }
    }

    pub(super) fn message(&self) -> Option<String> {
        match self {
            Verdict::Ok(_) => None,
            Verdict::Failed { error, .. } => Some(error.message.clone()),
        }
    }

    /// A failure that came after effects took place: the operation is unknown, not failed.
    pub(super) fn after_effects(self, taken: &[String]) -> Self {
        match self {
            Verdict::Failed { error, .. } => Verdict::Failed {
                failure: Failure::UnknownOutcome { redispatchable: false },
                error: ErrorRecord {
                    class: "failed-after-effect".into(),
                    message: format!(
                        "{}; but effect(s) {} took place, and the failure undid none of them: reconcile the operation or \
                         settle it by hand (oncebox resolve)",
                        error.message,
                        taken.join(", ")
                    ),
                },
            },
            ok => ok,
        }
    }

    /// The verdict with every sensitive value of the args masked (`redact::mask_value`), in the
    /// error's message and in the tool's output alike: what the ledger records and every caller is
    /// answered, fresh or replayed, so that a replay answers what the first call did.
    pub(super) fn scrubbed(self, secrets: &[String]) -> Self {
        match self {
            Verdict::Failed { failure, mut error } => {
                if let Some(masked) = mask_text(&error.message, secrets) {
                    error.message = masked;
                }
                Verdict::Failed { failure, error }
            }
            Verdict::Ok(output) => Verdict::Ok(mask_value(&output, secrets).unwrap_or(output)),
        }
    }

    pub(super) fn into_outcome(self, status: Status, attempts: u32, operation_key: Option<String>) -> Outcome {
        let (output, error) = match self {
            Verdict::Ok(output) => (Some(output), None),
            Verdict::Failed { error, .. } => (None, Some(error)),
        };
        Outcome { status, replayed: false, attempts, operation_key, output, error, fingerprint: None, approval: None }
    }
}

/// Maps an invocation to a verdict: the output, or the failure class (see `failure.rs`) with a
/// message for the records.
pub(super) fn classify(invocation: Invocation, in_doubt: &[InDoubt], class: ReplayClass) -> Verdict {
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
        Invocation::Interrupted(message) => (End::Interrupted, message, None),
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
