//! Replay classes and the retry policy each implies (DESIGN section 5). Pure.
//!
//! The full matrix, per-tool overrides and the policy file are their own issue; this module holds
//! the defaults and the one place that says what a class allows.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What a tool declares about repeating it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReplayClass {
    ReadOnly,
    IdempotentWrite,
    Compensatable,
    Irreversible,
}

impl ReplayClass {
    pub fn as_str(self) -> &'static str {
        match self {
            ReplayClass::ReadOnly => "read-only",
            ReplayClass::IdempotentWrite => "idempotent-write",
            ReplayClass::Compensatable => "compensatable",
            ReplayClass::Irreversible => "irreversible",
        }
    }

    /// Whether the tool may change the world (and so must be called with a run and a step).
    pub fn writes(self) -> bool {
        self != ReplayClass::ReadOnly
    }

    /// Whether the class's world exports `reconcile`.
    pub fn reconciles(self) -> bool {
        matches!(self, ReplayClass::Compensatable | ReplayClass::Irreversible)
    }
}

impl std::fmt::Display for ReplayClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the host retries one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts, the first included. 1 disables retries.
    pub max_attempts: u32,
    /// Backoff before the second attempt; doubled each time, capped at `max_backoff`.
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    /// Whether an effect whose outcome is unknown may be sent again with the same key (only where
    /// the downstream honours keys and its retention still holds).
    pub redispatch_in_doubt: bool,
    /// Wall-clock limit for one attempt.
    pub attempt_deadline: Duration,
    /// Wall-clock limit for the whole call, every attempt and wait included.
    pub call_deadline: Duration,
}

impl RetryPolicy {
    /// The defaults of DESIGN section 5.
    pub fn for_class(class: ReplayClass) -> Self {
        let base = RetryPolicy {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(2),
            redispatch_in_doubt: true,
            attempt_deadline: Duration::from_secs(30),
            call_deadline: Duration::from_secs(120),
        };
        match class {
            ReplayClass::ReadOnly | ReplayClass::IdempotentWrite | ReplayClass::Compensatable => base,
            ReplayClass::Irreversible => RetryPolicy { max_attempts: 1, redispatch_in_doubt: false, ..base },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn irreversible_tools_never_retry_and_never_redispatch() {
        let p = RetryPolicy::for_class(ReplayClass::Irreversible);
        assert_eq!(p.max_attempts, 1);
        assert!(!p.redispatch_in_doubt);
    }

    #[test]
    fn other_classes_get_three_attempts() {
        for class in [ReplayClass::ReadOnly, ReplayClass::IdempotentWrite, ReplayClass::Compensatable] {
            assert_eq!(RetryPolicy::for_class(class).max_attempts, 3, "{class}");
        }
    }

    #[test]
    fn only_read_only_does_not_write() {
        assert!(!ReplayClass::ReadOnly.writes());
        assert!(ReplayClass::Irreversible.writes() && ReplayClass::Compensatable.reconciles());
        assert!(!ReplayClass::IdempotentWrite.reconciles());
    }
}
