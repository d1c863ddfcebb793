//! Why a request to the server was not answered with an outcome: each kind has its HTTP status
//! and a JSON body `{"error": {"kind", "message"}}`. A tool that fails is not an error here
//! either: it is an outcome, answered 200.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use oncebox_runtime::{CallError, LedgerError};

/// What a client is told when the host broke down during a call: not that it failed.
pub const NOT_A_FAILURE: &str = "this does not say the call failed: send the same call again (the same run, step, \
     tool and args) to learn from the ledger what became of it";

#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    UnsupportedMedia(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    TooLarge(String),
    #[error("the server is stopping and takes no new calls; send the call again to the next one")]
    Stopping,
    #[error("too many calls are running; nothing of this one was recorded or sent: send it again shortly")]
    Busy,
    /// The server is at one of its limits (connections, MCP sessions); nothing was done.
    #[error("{0}")]
    Full(String),
    #[error("{0}")]
    TimedOut(String),
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    /// A call's error: the caller's input (nothing recorded, nothing sent), or the host's. A
    /// ledger error is never a refusal here: it may come after a send, so it says how to learn more.
    pub fn from_call(error: CallError, tool: &str) -> ApiError {
        match error {
            CallError::UnknownTool { .. } => ApiError::NotFound(error.to_string()),
            CallError::StepRequired { class, .. } => ApiError::BadRequest(format!(
                "`{tool}` is {class}: it can change the world, so the call needs `run_id` and `step_id` from the \
                 orchestrator; without them a retry could not be told from a new intent"
            )),
            CallError::InvalidArgs { .. } | CallError::ReservedStep { .. } | CallError::InvalidId { .. } => {
                ApiError::BadRequest(error.to_string())
            }
            other => ApiError::Internal(format!("calling `{tool}`: {other}; {NOT_A_FAILURE}")),
        }
    }

    /// The error of a decision or a reading (approve, reject, settle, reconcile, compensate).
    pub fn from_operation(error: CallError, what: &str) -> ApiError {
        match error {
            CallError::UnknownTool { .. } => ApiError::NotFound(error.to_string()),
            CallError::InvalidArgs { .. }
            | CallError::StepRequired { .. }
            | CallError::InvalidResolution { .. }
            | CallError::InvalidId { .. } => ApiError::BadRequest(error.to_string()),
            CallError::Approval { .. }
            | CallError::ByHand { .. }
            | CallError::Ledger(LedgerError::NotInDoubt { .. } | LedgerError::Ambiguous { .. }) => {
                ApiError::Conflict(error.to_string())
            }
            other => ApiError::Internal(format!("{what}: {other}")),
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::UnsupportedMedia(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Stopping | ApiError::Busy | ApiError::Full(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::TimedOut(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            ApiError::BadRequest(_) => "bad-request",
            ApiError::NotFound(_) => "not-found",
            ApiError::Unauthorized(_) => "unauthorized",
            ApiError::Forbidden(_) => "forbidden",
            ApiError::UnsupportedMedia(_) => "unsupported-media-type",
            ApiError::Conflict(_) => "conflict",
            ApiError::TooLarge(_) => "too-large",
            ApiError::Stopping => "stopping",
            ApiError::Busy | ApiError::Full(_) => "busy",
            ApiError::TimedOut(_) => "timeout",
            ApiError::Internal(_) => "internal",
        }
    }

    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({ "error": { "kind": self.kind(), "message": self.to_string() } })
    }
}

impl From<LedgerError> for ApiError {
    fn from(error: LedgerError) -> Self {
        ApiError::Internal(format!("the ledger: {error}"))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        // A host's breakdown is logged; a refusal at a limit (503) is the limit working, and a
        // flood of them must not flood the log.
        if matches!(self, ApiError::Internal(_)) {
            tracing::error!(error = %self, "request failed");
        }
        (status, axum::Json(self.body())).into_response()
    }
}

impl IntoResponse for &ApiError {
    fn into_response(self) -> Response {
        (self.status(), axum::Json(self.body())).into_response()
    }
}
