//! The rule of evidence (DESIGN section 5), and every way an attempt can end, mapped to one
//! failure class. Pure: the runtime, the effects and reconciliation report what they observed;
//! this module alone says what it proves.
//!
//! An effect is *not taken* only on proof: the request never left (the connection failed before
//! any byte of it was written), or the downstream answered in a way that means "not executed"
//! (429). Everything else after the request left leaves it *in doubt*: a 5xx (a gateway can fail
//! after its origin committed), a 408 or a 409, a timeout, a reset, the attempt deadline, a trap, a
//! kill. An effect in doubt may be resent with its key only where the downstream honours keys and
//! still remembers the key (`effects::Shared::resendable`); otherwise the operation is `unknown`
//! until reconciliation or a person proves what happened ([`reconciled`]).

use std::time::Duration;

use crate::policy::ReplayClass;
use crate::retry::Failure;

/// What the host observed of one HTTP exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpObservation {
    /// The connection was refused or never established (DNS, TCP, TLS): no byte of the request
    /// was written.
    NotConnected,
    /// The request went out and no complete answer came back (a timeout, a reset, an EOF).
    SentNoAnswer,
    /// An answer. `retry_after` from `Retry-After-Ms` or `Retry-After`.
    Answered { status: u16, retry_after: Option<Duration> },
}

/// What an HTTP exchange means for its effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpVerdict {
    /// Taken: a definitive answer that the downstream did it (2xx; and 3xx, which after a write
    /// often means "created, see there"), recorded and handed to the tool.
    Taken,
    /// A definitive "no" (4xx other than 408/409/429: invalid, declined, forbidden), recorded and
    /// handed to the tool; nothing was done, and a resend gets the same answer.
    Refused,
    /// Proven not taken; another attempt may send it again.
    NotTaken(Failure),
    /// It may have taken effect.
    InDoubt,
}

/// How long to wait after a 429 that gave no `Retry-After`.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The rule of evidence for one HTTP exchange. Whether an in-doubt effect may be resent with its
/// key is the downstream's contract (`honours_keys`, its retention), decided where the targets
/// are known; what the exchange proves does not depend on it.
pub fn http(observation: &HttpObservation) -> HttpVerdict {
    match observation {
        HttpObservation::NotConnected => HttpVerdict::NotTaken(Failure::Transient),
        HttpObservation::SentNoAnswer => HttpVerdict::InDoubt,
        // Rate limiters answer before the work (Stripe documents it).
        HttpObservation::Answered { status: 429, retry_after } => {
            HttpVerdict::NotTaken(Failure::RateLimited { retry_after: retry_after.unwrap_or(DEFAULT_RETRY_AFTER) })
        }
        // 5xx: a gateway or a crashed handler can answer after the origin committed; 499 (nginx,
        // grpc-gateway: the client closed the request) is sent while the backend may go on. 408: the
        // server may have read and acted on the request before giving up on the connection. 409: a
        // request with this key is in flight, and it may commit. A key-honouring host replays a
        // commit to a same-key resend, which is what makes a resend to it safe.
        HttpObservation::Answered { status: 408 | 409 | 499 | 500..=599, .. } => HttpVerdict::InDoubt,
        HttpObservation::Answered { status: 400..=499, .. } => HttpVerdict::Refused,
        // 1xx is never final; anything else that is not an error may have done the work.
        HttpObservation::Answered { .. } => HttpVerdict::Taken,
    }
}

/// What a tool's `reconcile` export (or a provider's lookup) said about an effect in doubt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reported {
    /// The authority shows it committed; the payload is the operation's output (JSON).
    Committed(String),
    /// The authority has no trace of it.
    NotCommitted,
    /// The authority cannot tell.
    StillUnknown,
}

/// What an authority's answer proves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Proven {
    Taken(String),
    NotTaken,
    /// Nothing is proven. `counts_from_ms`: when a `not-committed` answer would start to count
    /// (the end of the settle window), if that is what kept it from counting.
    InDoubt {
        reason: String,
        counts_from_ms: Option<u64>,
    },
}

/// When a `not-committed` answer about an effect can count, by the downstream's contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lookup {
    /// When the effect's last send ended at the latest: its start plus the time the client waited
    /// for an answer. Until then the request may still have been on its way.
    pub sent_until_ms: u64,
    /// How long a request the downstream received can still commit.
    pub settle_window: Duration,
    /// When a downstream that forgets keys forgets this one (the first dispatch plus its key
    /// retention): a lookup by a forgotten key finds nothing whatever happened.
    pub forgotten_from_ms: Option<u64>,
}

impl Lookup {
    /// How long after `sent_until_ms` a send that ended at `ended_ms` ended, if it did. A send
    /// bounded by the client's timeout never does; one whose host was paused or starved while
    /// sending may have reached the downstream after another host could judge it.
    pub fn overrun_ms(&self, ended_ms: u64) -> Option<u64> {
        (ended_ms > self.sent_until_ms).then(|| ended_ms - self.sent_until_ms)
    }
}

/// The rule of evidence for reconciliation. An empty lookup proves nothing while the request can
/// still commit (a downstream still processing it, an index that lags): `not-committed` counts
/// only once `settle_window` has passed since the effect's last send ended, and only while the
/// downstream still remembers the key it was sent with.
pub fn reconciled(reported: Reported, lookup: Lookup, now_ms: u64) -> Proven {
    let Lookup { sent_until_ms, settle_window, forgotten_from_ms } = lookup;
    match reported {
        Reported::Committed(output) => Proven::Taken(output),
        Reported::StillUnknown => Proven::InDoubt { reason: "the authority cannot tell".into(), counts_from_ms: None },
        Reported::NotCommitted => {
            let settled_ms = sent_until_ms.saturating_add(u64::try_from(settle_window.as_millis()).unwrap_or(u64::MAX));
            if let Some(forgotten) =
                forgotten_from_ms.filter(|forgotten| now_ms >= *forgotten || settled_ms >= *forgotten)
            {
                let reason = if now_ms >= forgotten {
                    "the authority has no record of it, but it has forgotten the key it was sent with by now"
                } else {
                    "the authority has no record of it yet, and it forgets the key before the settle window ends"
                };
                return Proven::InDoubt { reason: reason.into(), counts_from_ms: None };
            }
            if now_ms >= settled_ms {
                Proven::NotTaken
            } else {
                // `sent_until_ms` is when the last send may have ended at the latest (its deadline
                // and the client's timeout included), which may be later than now: the reason says
                // how long is left, which is what a person waiting on it needs.
                let left = Duration::from_millis(settled_ms.saturating_sub(now_ms));
                Proven::InDoubt {
                    reason: format!(
                        "the authority has no record of it yet, but the request can still commit for another {} \
                         (the settle window, {}, counts from when its last send may have ended)",
                        humantime::format_duration(Duration::from_secs(left.as_secs().max(1))),
                        humantime::format_duration(settle_window)
                    ),
                    counts_from_ms: Some(settled_ms),
                }
            }
        }
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
    /// An earlier owner's attempt that wrote effects ahead and never recorded its end (it crashed,
    /// or stalled past its lease and was taken over): judged from its effects on record, never run
    /// again under its number (DESIGN section 7).
    Interrupted,
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
        // Every effect it sent is answered or proven not taken: like a trap after them.
        End::Interrupted => of(Failure::Transient, "interrupted"),
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
    fn a_send_overruns_only_past_the_moment_every_send_counts_as_ended() {
        let lookup = Lookup { sent_until_ms: 10_000, settle_window: Duration::from_secs(300), forgotten_from_ms: None };
        assert_eq!(lookup.overrun_ms(9_000), None);
        assert_eq!(lookup.overrun_ms(10_000), None);
        assert_eq!(lookup.overrun_ms(26_000), Some(16_000));
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
        for status in [500, 502, 503, 504, 408, 409, 499] {
            assert_eq!(answered(status, None), HttpVerdict::InDoubt, "{status}");
        }
        assert_eq!(answered(201, None), HttpVerdict::Taken);
        assert_eq!(answered(204, None), HttpVerdict::Taken);
        assert_eq!(answered(303, None), HttpVerdict::Taken);
        assert_eq!(answered(404, None), HttpVerdict::Refused);
        assert_eq!(answered(200, None), HttpVerdict::Taken);
        assert_eq!(answered(402, None), HttpVerdict::Refused);
    }

    #[test]
    fn not_committed_counts_only_after_the_settle_window() {
        let sent = 1_000_000;
        let lookup = Lookup { sent_until_ms: sent, settle_window: Duration::from_secs(60), forgotten_from_ms: None };
        let early = reconciled(Reported::NotCommitted, lookup, sent + 59_999);
        assert!(matches!(early, Proven::InDoubt { counts_from_ms: Some(at), .. } if at == sent + 60_000), "{early:?}");
        // Asked before the last send could even have ended: the reason says how long is left.
        let before = reconciled(Reported::NotCommitted, lookup, sent - 10_000);
        assert!(
            matches!(&before, Proven::InDoubt { reason, .. } if reason.contains("for another 1m 10s")),
            "{before:?}"
        );
        assert_eq!(reconciled(Reported::NotCommitted, lookup, sent + 60_000), Proven::NotTaken);
        assert!(matches!(reconciled(Reported::StillUnknown, lookup, sent + 10_000_000), Proven::InDoubt { .. }));
        assert_eq!(reconciled(Reported::Committed("{}".into()), lookup, sent), Proven::Taken("{}".into()));
    }

    #[test]
    fn not_committed_proves_nothing_once_the_key_is_forgotten() {
        let sent = 1_000_000;
        let day = Lookup {
            sent_until_ms: sent,
            settle_window: Duration::from_secs(60),
            forgotten_from_ms: Some(sent + 86_400_000),
        };
        assert_eq!(reconciled(Reported::NotCommitted, day, sent + 61_000), Proven::NotTaken);
        let late = reconciled(Reported::NotCommitted, day, sent + 86_400_000);
        assert!(matches!(late, Proven::InDoubt { counts_from_ms: None, .. }), "{late:?}");
        // A retention shorter than the settle window: no answer can ever count.
        let short = Lookup { forgotten_from_ms: Some(sent + 300), ..day };
        assert!(matches!(reconciled(Reported::NotCommitted, short, sent + 100), Proven::InDoubt { .. }));
        assert!(matches!(reconciled(Reported::NotCommitted, short, sent + 61_000), Proven::InDoubt { .. }));
        // Committed is proof at any time.
        assert_eq!(reconciled(Reported::Committed("{}".into()), short, sent + 61_000), Proven::Taken("{}".into()));
    }
}
