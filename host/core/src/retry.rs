//! What to do after an attempt: `decide(failure, policy, attempt, elapsed, jitter)`. Pure.

use std::time::Duration;

use crate::policy::RetryPolicy;

/// How an attempt failed, in the terms of the retry matrix (see `failure.rs` for how the host
/// gets there).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Nothing took effect.
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

/// `attempt` is the number of the attempt that just ended, starting at 1; `elapsed` the time
/// since the call began; `jitter` a number in [0, 1) that spreads the backoff of different
/// operations apart ("full jitter": the wait is uniform between zero and the exponential backoff).
pub fn decide(failure: &Failure, policy: &RetryPolicy, attempt: u32, elapsed: Duration, jitter: f64) -> Decision {
    let attempts_left = attempt < policy.max_attempts;
    // A wait that would end past the call's deadline is no retry at all.
    let fits = |after: Duration| elapsed.saturating_add(after) < policy.call_deadline;
    match failure {
        Failure::Permanent => Decision::Fail,
        Failure::UnknownOutcome { redispatchable } => {
            let after = full_jitter(policy, attempt, jitter);
            if *redispatchable && policy.redispatch_in_doubt && attempts_left && fits(after) {
                Decision::Retry { after }
            } else {
                Decision::Unknown
            }
        }
        _ if !attempts_left => Decision::Fail,
        Failure::Transient => {
            let after = full_jitter(policy, attempt, jitter);
            if fits(after) { Decision::Retry { after } } else { Decision::Fail }
        }
        Failure::RateLimited { retry_after } => {
            if fits(*retry_after) {
                Decision::Retry { after: *retry_after }
            } else {
                Decision::Fail
            }
        }
    }
}

/// Exponential backoff: `initial * 2^(attempt-1)`, capped at `max_backoff`.
pub fn backoff(policy: &RetryPolicy, attempt: u32) -> Duration {
    exponential(policy.initial_backoff, policy.max_backoff, attempt)
}

/// `initial * 2^(attempt-1)`, capped at `max`: the one backoff curve, for calls and for the
/// outbox relay alike.
pub fn exponential(initial: Duration, max: Duration, attempt: u32) -> Duration {
    let factor = 1u32.checked_shl(attempt.saturating_sub(1)).unwrap_or(u32::MAX);
    initial.saturating_mul(factor).min(max)
}

/// A draw in [0, 1) for the jitter of retry `n` of `key`, derived rather than random: the same on
/// every host and every run for the same retry (no RNG state to seed or share), spread over keys
/// so that callers retrying together do not stay in step. `domain` keeps the draws of different
/// retry loops (attempts, outbox sends) apart.
pub fn jitter(key: &str, domain: &str, n: u32) -> f64 {
    let digest = crate::keys::effect_key(key, domain, n);
    let bits = u64::from_str_radix(digest.get(..13).unwrap_or("0"), 16).unwrap_or(0);
    bits as f64 / (1u64 << 52) as f64
}

/// A wait uniform in [0, backoff) as `jitter` goes over [0, 1).
pub fn full_jitter(policy: &RetryPolicy, attempt: u32, jitter: f64) -> Duration {
    backoff(policy, attempt).mul_f64(jitter.clamp(0.0, 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{ReplayClass, RetryPolicy};

    const NOW: Duration = Duration::ZERO;

    fn policy() -> RetryPolicy {
        RetryPolicy::for_class(ReplayClass::IdempotentWrite)
    }

    #[test]
    fn transient_retries_until_the_last_attempt() {
        assert!(matches!(decide(&Failure::Transient, &policy(), 1, NOW, 0.5), Decision::Retry { .. }));
        assert!(matches!(decide(&Failure::Transient, &policy(), 2, NOW, 0.5), Decision::Retry { .. }));
        assert_eq!(decide(&Failure::Transient, &policy(), 3, NOW, 0.5), Decision::Fail);
    }

    #[test]
    fn permanent_never_retries() {
        assert_eq!(decide(&Failure::Permanent, &policy(), 1, NOW, 0.5), Decision::Fail);
    }

    #[test]
    fn unknown_outcome_retries_only_when_redispatch_is_safe() {
        let safe = Failure::UnknownOutcome { redispatchable: true };
        let unsafe_ = Failure::UnknownOutcome { redispatchable: false };
        assert!(matches!(decide(&safe, &policy(), 1, NOW, 0.5), Decision::Retry { .. }));
        assert_eq!(decide(&safe, &policy(), 3, NOW, 0.5), Decision::Unknown);
        assert_eq!(decide(&unsafe_, &policy(), 1, NOW, 0.5), Decision::Unknown);
        let irreversible = RetryPolicy::for_class(ReplayClass::Irreversible);
        assert_eq!(decide(&safe, &irreversible, 1, NOW, 0.5), Decision::Unknown);
    }

    #[test]
    fn rate_limited_waits_the_given_delay_when_it_fits_the_deadline() {
        let f = Failure::RateLimited { retry_after: Duration::from_millis(700) };
        assert_eq!(decide(&f, &policy(), 1, NOW, 0.5), Decision::Retry { after: Duration::from_millis(700) });
        let late = policy().call_deadline - Duration::from_millis(500);
        assert_eq!(decide(&f, &policy(), 1, late, 0.5), Decision::Fail);
    }

    #[test]
    fn no_retry_outlives_the_call_deadline() {
        let p = RetryPolicy { call_deadline: Duration::from_millis(100), ..policy() };
        assert_eq!(decide(&Failure::Transient, &p, 1, Duration::from_millis(100), 0.0), Decision::Fail);
        let safe = Failure::UnknownOutcome { redispatchable: true };
        assert_eq!(decide(&safe, &p, 1, Duration::from_millis(100), 0.0), Decision::Unknown);
    }

    #[test]
    fn one_attempt_disables_retries() {
        let p = RetryPolicy { max_attempts: 1, ..policy() };
        assert_eq!(decide(&Failure::Transient, &p, 1, NOW, 0.5), Decision::Fail);
        let f = Failure::RateLimited { retry_after: Duration::from_millis(1) };
        assert_eq!(decide(&f, &p, 1, NOW, 0.5), Decision::Fail);
    }

    #[test]
    fn backoff_doubles_and_caps_and_jitter_stays_below_it() {
        let p = policy();
        assert_eq!(backoff(&p, 1), p.initial_backoff);
        assert_eq!(backoff(&p, 2), p.initial_backoff * 2);
        assert_eq!(backoff(&p, 40), p.max_backoff);
        assert_eq!(full_jitter(&p, 3, 0.0), Duration::ZERO);
        assert_eq!(full_jitter(&p, 3, 0.5), backoff(&p, 3) / 2);
        assert!(full_jitter(&p, 3, 0.999) < backoff(&p, 3));
    }
}
