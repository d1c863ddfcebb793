//! What to do after an attempt: `decide(failure, policy, attempt)`. Pure.

use std::time::Duration;

use crate::policy::RetryPolicy;

/// How an attempt failed, as the host sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Nothing took effect (the guest said so, or the host saw a trap with no effect in doubt).
    Transient,
    /// Nothing took effect; the downstream asked to wait.
    RateLimited { retry_after: Duration },
    /// Retrying cannot help.
    Permanent,
    /// An effect may have committed. `redispatchable` says whether every in-doubt effect may be
    /// sent again with its key (the downstream honours keys and its retention holds).
    UnknownOutcome { redispatchable: bool },
}

/// The next step of a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Retry {
        after: Duration,
    },
    Fail,
    /// Stop and record `unknown`: reconciliation decides, never a blind retry.
    Unknown,
}

/// `attempt` is the number of the attempt that just ended, starting at 1.
pub fn decide(failure: &Failure, policy: &RetryPolicy, attempt: u32) -> Decision {
    let attempts_left = attempt < policy.max_attempts;
    match failure {
        Failure::Permanent => Decision::Fail,
        Failure::UnknownOutcome { redispatchable } => {
            if *redispatchable && policy.redispatch_in_doubt && attempts_left {
                Decision::Retry { after: backoff(policy, attempt) }
            } else {
                Decision::Unknown
            }
        }
        _ if !attempts_left => Decision::Fail,
        Failure::Transient => Decision::Retry { after: backoff(policy, attempt) },
        Failure::RateLimited { retry_after } => Decision::Retry { after: *retry_after },
    }
}

/// Exponential backoff, capped. (Full jitter comes with the retry-matrix issue; a deterministic
/// delay keeps this function pure and testable.)
pub fn backoff(policy: &RetryPolicy, attempt: u32) -> Duration {
    let factor = 1u32.checked_shl(attempt.saturating_sub(1)).unwrap_or(u32::MAX);
    policy.initial_backoff.saturating_mul(factor).min(policy.max_backoff)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{ReplayClass, RetryPolicy};

    fn policy() -> RetryPolicy {
        RetryPolicy::for_class(ReplayClass::IdempotentWrite)
    }

    #[test]
    fn transient_retries_until_the_third_attempt() {
        assert!(matches!(decide(&Failure::Transient, &policy(), 1), Decision::Retry { .. }));
        assert!(matches!(decide(&Failure::Transient, &policy(), 2), Decision::Retry { .. }));
        assert_eq!(decide(&Failure::Transient, &policy(), 3), Decision::Fail);
    }

    #[test]
    fn permanent_never_retries() {
        assert_eq!(decide(&Failure::Permanent, &policy(), 1), Decision::Fail);
    }

    #[test]
    fn unknown_outcome_retries_only_when_redispatch_is_safe() {
        let safe = Failure::UnknownOutcome { redispatchable: true };
        let unsafe_ = Failure::UnknownOutcome { redispatchable: false };
        assert!(matches!(decide(&safe, &policy(), 1), Decision::Retry { .. }));
        assert_eq!(decide(&safe, &policy(), 3), Decision::Unknown);
        assert_eq!(decide(&unsafe_, &policy(), 1), Decision::Unknown);
        let irreversible = RetryPolicy::for_class(ReplayClass::Irreversible);
        assert_eq!(decide(&safe, &irreversible, 1), Decision::Unknown);
    }

    #[test]
    fn rate_limited_waits_the_given_delay() {
        let f = Failure::RateLimited { retry_after: Duration::from_millis(700) };
        assert_eq!(decide(&f, &policy(), 1), Decision::Retry { after: Duration::from_millis(700) });
    }

    #[test]
    fn one_attempt_disables_retries() {
        let p = RetryPolicy { max_attempts: 1, ..policy() };
        assert_eq!(decide(&Failure::Transient, &p, 1), Decision::Fail);
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let p = policy();
        assert_eq!(backoff(&p, 1), p.initial_backoff);
        assert_eq!(backoff(&p, 2), p.initial_backoff * 2);
        assert_eq!(backoff(&p, 40), p.max_backoff);
    }
}
