//! Every way an attempt can end, mapped to one failure class. Pure: the runtime and the effects
//! report what they observed; this module alone says what it means for the retry matrix.

use std::time::Duration;

use crate::policy::ReplayClass;
use crate::retry::Failure;

/// What the host observed of one HTTP exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpObservation {
    /// The connection was refused or never established: nothing was sent.
    NotConnected,
    /// The request went out and no complete answer came back (a timeout, a dropped connection).
    SentNoAnswer,
    /// An answer. `retry_after` from `Retry-After-Ms` or `Retry-After`.
    Answered { status: u16, retry_after: Option<Duration> },
}

/// What an HTTP exchange means for its effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpVerdict {
    /// A definitive answer, recorded and handed to the tool (2xx, and 4xx other than 408/409/429).
    Definitive,
    /// Nothing took effect; a resend with the same key is safe.
    NotTaken(Failure),
    /// It may have taken effect.
    InDoubt,
}

/// How long to wait after a 429 that gave no `Retry-After`.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

pub fn http(observation: &HttpObservation) -> HttpVerdict {
    match observation {
        HttpObservation::NotConnected => HttpVerdict::NotTaken(Failure::Transient),
        HttpObservation::SentNoAnswer => HttpVerdict::InDoubt,
        HttpObservation::Answered { status: 429, retry_after } => {
            HttpVerdict::NotTaken(Failure::RateLimited { retry_after: retry_after.unwrap_or(DEFAULT_RETRY_AFTER) })
        }
        // 408: the server gave up before processing; 409: a request with this key is in flight;
        // 5xx: the server failed before committing (a key-honouring server replays a commit).
        HttpObservation::Answered { status: 408 | 409 | 500..=599, .. } => HttpVerdict::NotTaken(Failure::Transient),
        HttpObservation::Answered { .. } => HttpVerdict::Definitive,
    }
}

/// How an invocation ended, as the runtime saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    Returned,
    /// The guest returned one of the contract's errors.
    Guest(GuestError),
    /// The guest trapped: a panic, an out-of-bounds access, an unreachable.
    Trap,
    /// The attempt's deadline passed (epoch interruption or the wall clock).
    Deadline,
    /// The attempt went past one of its limits (`limits.rs`).
    Limit(Limit),
    /// The guest returned something that is not the contract's JSON.
    InvalidOutput,
}

/// The limit an attempt went past.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Memory,
    Table,
    Stack,
    Stdio,
    Output,
    Effects,
}

impl Limit {
    /// The failure class name the records use.
    pub fn name(self) -> &'static str {
        match self {
            Limit::Memory => "memory-limit",
            Limit::Table => "table-limit",
            Limit::Stack => "stack-overflow",
            Limit::Stdio => "stdio-limit",
            Limit::Output => "output-limit",
            Limit::Effects => "effects-limit",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuestError {
    Transient,
    RateLimited { retry_after: Duration },
    Permanent,
    UnknownOutcome,
}

/// One attempt's failure: the class the retry matrix acts on, and the name the records use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Classified {
    pub failure: Failure,
    pub name: &'static str,
}

/// Classifies an attempt. `in_doubt` holds, for each effect of the attempt whose outcome is unknown,
/// whether it may be resent with its key. Any effect in doubt makes the attempt `unknown-outcome`,
/// whatever the guest said or did: if something may have happened, nothing else is proof.
pub fn attempt(end: &End, in_doubt: &[bool], class: ReplayClass) -> Option<Classified> {
    let of = |failure: Failure, name: &'static str| Some(Classified { failure, name });
    if !in_doubt.is_empty() {
        let redispatchable = in_doubt.iter().all(|resendable| *resendable);
        return of(Failure::UnknownOutcome { redispatchable }, "unknown-outcome");
    }
    match end {
        End::Returned => None,
        End::Guest(GuestError::Transient) => of(Failure::Transient, "transient"),
        End::Guest(GuestError::RateLimited { retry_after }) => {
            of(Failure::RateLimited { retry_after: *retry_after }, "rate-limited")
        }
        End::Guest(GuestError::Permanent) => of(Failure::Permanent, "permanent"),
        // A tool that has no effects cannot leave one in doubt: for a read-only tool, the guest's
        // "unknown" is only a read that failed, and reading again is safe.
        End::Guest(GuestError::UnknownOutcome) => {
            of(Failure::UnknownOutcome { redispatchable: class == ReplayClass::ReadOnly }, "unknown-outcome")
        }
        // Nothing was in doubt, so nothing happened: another attempt is safe.
        End::Trap => of(Failure::Transient, "trap"),
        End::Deadline => of(Failure::Transient, "deadline"),
        // The same code with the same args asks for the same memory, stack or output again:
        // retrying cannot help.
        End::Limit(limit) => of(Failure::Permanent, limit.name()),
        End::InvalidOutput => of(Failure::Permanent, "invalid-output"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ReplayClass::*;

    fn class_of(end: End) -> (Failure, &'static str) {
        let c = attempt(&end, &[], IdempotentWrite).expect("a failure");
        (c.failure, c.name)
    }

    #[test]
    fn guest_errors_keep_their_class() {
        assert_eq!(class_of(End::Guest(GuestError::Transient)), (Failure::Transient, "transient"));
        assert_eq!(class_of(End::Guest(GuestError::Permanent)), (Failure::Permanent, "permanent"));
        let ms = Duration::from_millis(250);
        assert_eq!(
            class_of(End::Guest(GuestError::RateLimited { retry_after: ms })),
            (Failure::RateLimited { retry_after: ms }, "rate-limited")
        );
        assert_eq!(
            class_of(End::Guest(GuestError::UnknownOutcome)),
            (Failure::UnknownOutcome { redispatchable: false }, "unknown-outcome")
        );
    }

    #[test]
    fn what_the_host_observes_has_a_class() {
        assert_eq!(class_of(End::Trap), (Failure::Transient, "trap"));
        assert_eq!(class_of(End::Deadline), (Failure::Transient, "deadline"));
        assert_eq!(class_of(End::Limit(Limit::Memory)), (Failure::Permanent, "memory-limit"));
        assert_eq!(class_of(End::Limit(Limit::Stack)), (Failure::Permanent, "stack-overflow"));
        assert_eq!(class_of(End::Limit(Limit::Effects)), (Failure::Permanent, "effects-limit"));
        assert_eq!(class_of(End::InvalidOutput), (Failure::Permanent, "invalid-output"));
        assert_eq!(attempt(&End::Returned, &[], Compensatable), None);
    }

    #[test]
    fn an_effect_in_doubt_makes_any_end_unknown() {
        for end in [End::Returned, End::Trap, End::Deadline, End::Guest(GuestError::Transient)] {
            let c = attempt(&end, &[true, false], Compensatable).expect("a failure");
            assert_eq!(c.failure, Failure::UnknownOutcome { redispatchable: false }, "{end:?}");
            let c = attempt(&end, &[true], Compensatable).expect("a failure");
            assert_eq!(c.failure, Failure::UnknownOutcome { redispatchable: true }, "{end:?}");
        }
    }

    #[test]
    fn a_read_only_unknown_is_safe_to_retry() {
        let c = attempt(&End::Guest(GuestError::UnknownOutcome), &[], ReadOnly).expect("a failure");
        assert_eq!(c.failure, Failure::UnknownOutcome { redispatchable: true });
    }

    #[test]
    fn http_observations() {
        assert_eq!(http(&HttpObservation::NotConnected), HttpVerdict::NotTaken(Failure::Transient));
        assert_eq!(http(&HttpObservation::SentNoAnswer), HttpVerdict::InDoubt);
        let answered = |status, retry_after| http(&HttpObservation::Answered { status, retry_after });
        assert_eq!(
            answered(429, Some(Duration::from_secs(3))),
            HttpVerdict::NotTaken(Failure::RateLimited { retry_after: Duration::from_secs(3) })
        );
        assert_eq!(
            answered(429, None),
            HttpVerdict::NotTaken(Failure::RateLimited { retry_after: DEFAULT_RETRY_AFTER })
        );
        assert_eq!(answered(503, None), HttpVerdict::NotTaken(Failure::Transient));
        assert_eq!(answered(409, None), HttpVerdict::NotTaken(Failure::Transient));
        assert_eq!(answered(200, None), HttpVerdict::Definitive);
        assert_eq!(answered(402, None), HttpVerdict::Definitive);
    }
}
