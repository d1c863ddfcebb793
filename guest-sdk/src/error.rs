//! Constructors for the contract's `tool-error`, so a tool reads `ToolError::permanent("...")`.

use crate::ToolError;
use crate::bindings::oncebox::tool::types::RateLimit;

impl ToolError {
    /// Nothing took effect; another attempt may succeed.
    pub fn transient(message: impl Into<String>) -> Self {
        ToolError::Transient(message.into())
    }

    /// Invalid input, a rejected payment, a business rule: never retried.
    pub fn permanent(message: impl Into<String>) -> Self {
        ToolError::Permanent(message.into())
    }

    /// Nothing took effect; the downstream asked to wait `retry_after_ms`.
    pub fn rate_limited(retry_after_ms: u64, message: impl Into<String>) -> Self {
        ToolError::RateLimited(RateLimit { retry_after_ms, message: message.into() })
    }

    /// An effect may have committed: the host reconciles instead of retrying blindly.
    pub fn unknown_outcome(message: impl Into<String>) -> Self {
        ToolError::UnknownOutcome(message.into())
    }

    /// The downstream's answer does not say whether the work was done (a provider's 5xx, a
    /// `"status": "pending"` that never settles, a body cut short): the operation ends `unknown`
    /// and is reconciled through the tool's `reconcile` export, never retried blindly and never
    /// recorded as `failed`. The same as [`ToolError::unknown_outcome`], named for the case a tool
    /// author meets. (The host already treats 408, 409 and 5xx answers to HTTP effects this way,
    /// before the tool sees them.)
    pub fn may_have_committed(message: impl Into<String>) -> Self {
        ToolError::UnknownOutcome(message.into())
    }
}

impl From<serde_json::Error> for ToolError {
    /// A body the tool cannot parse is a contract breach by the downstream, not a blip.
    fn from(e: serde_json::Error) -> Self {
        ToolError::permanent(format!("invalid JSON: {e}"))
    }
}
