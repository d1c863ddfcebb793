//! A call and what became of it.

use serde::Serialize;
use serde_json::Value;

use crate::ledger::{ErrorRecord, OperationRecord, OperationStatus};

/// One request to run one tool. `run_id` and `step_id` come from the orchestrator's durable
/// state, never from the model; a write-class tool is refused without them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub run_id: Option<String>,
    pub step_id: Option<String>,
    pub tool: String,
    /// JSON text.
    pub args: String,
    /// When another caller is running this step: wait up to this long for its result instead of
    /// returning `in-progress` at once.
    pub wait: Option<std::time::Duration>,
    /// The caller's W3C trace context: the call's span is its child, and its effects carry the
    /// trace downstream (`telemetry`).
    pub trace: Option<crate::TraceContext>,
}

impl Call {
    /// A call for one step of one run: recorded, replayed, deduplicated.
    pub fn step(
        run_id: impl Into<String>,
        step_id: impl Into<String>,
        tool: impl Into<String>,
        args: impl Into<String>,
    ) -> Self {
        Call {
            run_id: Some(run_id.into()),
            step_id: Some(step_id.into()),
            tool: tool.into(),
            args: args.into(),
            wait: None,
            trace: None,
        }
    }

    /// A call outside any run: only read-only tools accept it, and nothing is recorded.
    pub fn unrecorded(tool: impl Into<String>, args: impl Into<String>) -> Self {
        Call { run_id: None, step_id: None, tool: tool.into(), args: args.into(), wait: None, trace: None }
    }

    /// Waits up to `wait` for another caller's result (see [`Call::wait`]).
    pub fn waiting(mut self, wait: std::time::Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Runs as a part of the caller's trace (see [`Call::trace`]).
    pub fn traced(mut self, trace: Option<crate::TraceContext>) -> Self {
        self.trace = trace;
        self
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    Completed,
    Failed,
    /// An effect may have taken place: reconcile before anything else.
    Unknown,
    /// The step was called before with different args; nothing was dispatched.
    Conflict,
    /// Another caller owns the operation right now.
    InProgress,
    /// An irreversible tool waits for a person to approve these exact params; nothing was
    /// dispatched. `approval` says what, and how to approve it.
    AwaitingApproval,
    /// A person refused these params; nothing was dispatched, and nothing will be for this step.
    Rejected,
    /// The step's record expired (retention) and its downstream keys may have too; it was not run
    /// as new. A new intent needs a new step id.
    Expired,
}

impl Status {
    /// The status as `oncebox call` prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Completed => "completed",
            Status::Failed => "failed",
            Status::Unknown => "unknown",
            Status::Conflict => "conflict",
            Status::InProgress => "in-progress",
            Status::AwaitingApproval => "awaiting-approval",
            Status::Rejected => "rejected",
            Status::Expired => "expired",
        }
    }
}

impl From<OperationStatus> for Status {
    fn from(status: OperationStatus) -> Self {
        match status {
            OperationStatus::Completed => Status::Completed,
            OperationStatus::Failed => Status::Failed,
            OperationStatus::Unknown => Status::Unknown,
            OperationStatus::Claimed => Status::InProgress,
        }
    }
}

/// What a call returns. Serialized as-is by `oncebox call`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    pub status: Status,
    /// Answered from the ledger, without creating an instance.
    pub replayed: bool,
    /// Attempts made for the operation so far (0 when none ran).
    pub attempts: u32,
    pub operation_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorRecord>,
    /// The request's fingerprint, where a person has to name it (approvals).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    /// What awaits approval (or was decided), for `awaiting-approval` and `rejected`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approval: Option<Box<crate::approval_view::ApprovalView>>,
}

impl Outcome {
    pub fn is_completed(&self) -> bool {
        self.status == Status::Completed
    }

    /// The outcome an operation's record stands for, as a replay.
    pub(crate) fn replay(op: &OperationRecord) -> Self {
        Outcome {
            status: op.status.into(),
            replayed: true,
            attempts: op.attempts,
            operation_key: Some(op.key.clone()),
            output: op.output.as_deref().and_then(|o| serde_json::from_str(o).ok()),
            error: op.error.clone(),
            fingerprint: None,
            approval: None,
        }
    }

    pub(crate) fn refused(op: &OperationRecord, status: Status, class: &str, message: String) -> Self {
        Outcome {
            status,
            replayed: false,
            attempts: op.attempts,
            operation_key: Some(op.key.clone()),
            output: None,
            error: Some(ErrorRecord { class: class.into(), message }),
            fingerprint: None,
            approval: None,
        }
    }

    /// Nothing ran and nothing of the operation exists: why, as a status and an error.
    pub(crate) fn stopped(operation_key: &str, status: Status, class: &str, message: String) -> Self {
        Outcome {
            status,
            replayed: false,
            attempts: 0,
            operation_key: Some(operation_key.to_string()),
            output: None,
            error: Some(ErrorRecord { class: class.into(), message }),
            fingerprint: None,
            approval: None,
        }
    }
}

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
    /// The call's span: its attempts are its children.
    pub trace: crate::telemetry::Span,
}

impl Prepared {
    /// Whether an operation recorded with `fingerprint` was asked for with these args.
    pub fn matches(&self, fingerprint: &str) -> bool {
        self.fingerprint == fingerprint || self.older_fingerprints.iter().any(|older| older == fingerprint)
    }
}
