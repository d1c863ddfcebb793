//! Replay classes and the retry policy each implies (DESIGN section 6). Pure.
//!
//! This module holds the defaults and the one place that says what a class allows
//! ([`RetryPolicy::check`]): the policy file, `HostBuilder::retry_policy` and any later source of
//! policy pass the same check, so none can loosen what the class forbids.

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
    /// Whether a call runs only with a person's approval bound to its exact params (always, for
    /// an irreversible tool; a policy may ask it of any other write).
    pub requires_approval: bool,
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
            requires_approval: false,
            attempt_deadline: Duration::from_secs(30),
            call_deadline: Duration::from_secs(120),
        };
        match class {
            ReplayClass::ReadOnly | ReplayClass::IdempotentWrite | ReplayClass::Compensatable => base,
            ReplayClass::Irreversible => {
                RetryPolicy { max_attempts: 1, redispatch_in_doubt: false, requires_approval: true, ..base }
            }
        }
    }
}

/// The most attempts any policy may ask for. More is a loop, not a retry policy.
pub const MAX_ATTEMPTS_LIMIT: u32 = 100;

/// A policy that its tool's class, or plain sense, forbids. `field()` names the setting to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Violation {
    #[error("`max_attempts = {0}`: an irreversible tool is never retried automatically")]
    IrreversibleRetries(u32),
    #[error(
        "`redispatch_in_doubt = true`: an irreversible tool's unknown outcome is reconciled, then left to a \
         person, never sent again"
    )]
    IrreversibleRedispatch,
    #[error("`requires_approval = false`: an irreversible tool runs only with a person's approval of its exact params")]
    IrreversibleUnapproved,
    #[error("`requires_approval = true`: a read-only tool changes nothing there would be to approve")]
    ReadOnlyApproval,
    #[error("`max_attempts = {0}`: at least 1 (the first attempt counts) and at most {MAX_ATTEMPTS_LIMIT}")]
    Attempts(u32),
    #[error("`{small}` ({}) exceeds `{big}` ({})", humantime::format_duration(*small_value), humantime::format_duration(*big_value))]
    Order { small: &'static str, small_value: Duration, big: &'static str, big_value: Duration },
    #[error("`{0}` must be more than zero")]
    Zero(&'static str),
}

impl Violation {
    /// The setting the violation is about, as the policy file spells it.
    pub fn field(&self) -> &'static str {
        match self {
            Violation::IrreversibleRetries(_) | Violation::Attempts(_) => "max_attempts",
            Violation::IrreversibleRedispatch => "redispatch_in_doubt",
            Violation::IrreversibleUnapproved | Violation::ReadOnlyApproval => "requires_approval",
            Violation::Order { small, .. } => small,
            Violation::Zero(field) => field,
        }
    }
}

impl RetryPolicy {
    /// The one check of a policy against its tool's class (DESIGN section 6): no source of policy
    /// can give an irreversible tool automatic retries, in-doubt resends or a run without approval.
    pub fn check(&self, class: ReplayClass) -> Result<(), Violation> {
        if class == ReplayClass::Irreversible && self.max_attempts > 1 {
            return Err(Violation::IrreversibleRetries(self.max_attempts));
        }
        if class == ReplayClass::Irreversible && self.redispatch_in_doubt {
            return Err(Violation::IrreversibleRedispatch);
        }
        if class == ReplayClass::Irreversible && !self.requires_approval {
            return Err(Violation::IrreversibleUnapproved);
        }
        if class == ReplayClass::ReadOnly && self.requires_approval {
            return Err(Violation::ReadOnlyApproval);
        }
        if self.max_attempts == 0 || self.max_attempts > MAX_ATTEMPTS_LIMIT {
            return Err(Violation::Attempts(self.max_attempts));
        }
        for (field, value) in [
            ("initial_backoff", self.initial_backoff),
            ("attempt_deadline", self.attempt_deadline),
            ("call_deadline", self.call_deadline),
        ] {
            if value.is_zero() {
                return Err(Violation::Zero(field));
            }
        }
        let pairs = [
            ("initial_backoff", self.initial_backoff, "max_backoff", self.max_backoff),
            ("attempt_deadline", self.attempt_deadline, "call_deadline", self.call_deadline),
        ];
        for (small, small_value, big, big_value) in pairs {
            if small_value > big_value {
                return Err(Violation::Order { small, small_value, big, big_value });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_class_default_passes_its_own_check() {
        for class in
            [ReplayClass::ReadOnly, ReplayClass::IdempotentWrite, ReplayClass::Compensatable, ReplayClass::Irreversible]
        {
            assert_eq!(RetryPolicy::for_class(class).check(class), Ok(()), "{class}");
        }
    }

    #[test]
    fn no_policy_gives_an_irreversible_tool_retries_or_resends() {
        let class = ReplayClass::Irreversible;
        let base = RetryPolicy::for_class(class);
        let retries = RetryPolicy { max_attempts: 3, ..base.clone() };
        assert_eq!(retries.check(class), Err(Violation::IrreversibleRetries(3)));
        let resends = RetryPolicy { redispatch_in_doubt: true, ..base };
        assert_eq!(resends.check(class), Err(Violation::IrreversibleRedispatch));
        // The same policy is fine for a class that allows it.
        assert_eq!(retries.check(ReplayClass::Compensatable), Ok(()));
    }

    #[test]
    fn impossible_policies_are_refused_for_every_class() {
        let base = RetryPolicy::for_class(ReplayClass::ReadOnly);
        let zero = RetryPolicy { max_attempts: 0, ..base.clone() };
        assert_eq!(zero.check(ReplayClass::ReadOnly).map_err(|v| v.field()), Err("max_attempts"));
        let late = RetryPolicy { attempt_deadline: base.call_deadline * 2, ..base.clone() };
        assert_eq!(late.check(ReplayClass::ReadOnly).map_err(|v| v.field()), Err("attempt_deadline"));
        let spin = RetryPolicy { initial_backoff: Duration::ZERO, ..base };
        assert_eq!(spin.check(ReplayClass::ReadOnly).map_err(|v| v.field()), Err("initial_backoff"));
    }

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
