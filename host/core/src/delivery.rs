//! What the relay decides, without doing any of it (pure): an endpoint's settings, what one send's
//! answer means for its message (by the rule of evidence, `failure::http`), and how long to wait
//! before the next send.

use std::time::Duration;

use crate::failure::{self, HttpObservation, HttpVerdict};
use crate::notice::SigningKey;
use crate::retry::Failure;

/// The most sends of one message in one pass (`oncebox outbox deliver --once`).
pub const MAX_ATTEMPTS_PER_PASS: u32 = 1_000;

/// Where a topic's messages go, as the operator configured it under `[outbox.TOPIC]`.
///
/// Every message is POSTed with its effect key as `Idempotency-Key`, and resent with the same key
/// until the endpoint acknowledges it (a 2xx). The relay records the acknowledgement after it
/// arrives, so a relay killed between the two sends the message again when it restarts: **an
/// endpoint that does not honour `Idempotency-Key` may see a message twice after a crash** (or
/// after a send whose answer was lost: a timeout, a reset, a 5xx). Delivery is at least once;
/// it is exactly once only where the endpoint deduplicates by the key.
#[derive(Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `http` or `https`, without credentials in it.
    pub url: url::Url,
    /// Whether the endpoint deduplicates by `Idempotency-Key`. It changes nothing of what the
    /// relay sends (a message in doubt is always sent again, with its key: dropping it would lose
    /// it); it says whether a resend can reach the endpoint's consumer twice, and the relay warns
    /// about every such resend to an endpoint that does not.
    pub honours_keys: bool,
    /// How long to wait for an answer; past it, the send is in doubt and the message is resent.
    pub timeout: Duration,
    /// The wait after a message's first failed send, doubled after each further one.
    pub initial_backoff: Duration,
    /// The longest wait between two sends of one message (and the longest `Retry-After` obeyed).
    pub max_backoff: Duration,
    /// Sends of one message in one pass (`--once`) before the pass leaves its topic pending; a
    /// relay that keeps running never gives up on a message.
    pub attempts_per_pass: u32,
    /// Credentials attached to every send, from the policy file's `[hosts."HOST:PORT".headers]`
    /// for the endpoint's host; never logged, recorded or printed.
    pub headers: Vec<(String, String)>,
    /// The key each send is signed with (`Oncebox-Signature`): a `[notify]` endpoint's.
    pub signing: Option<SigningKey>,
}

impl Endpoint {
    /// An endpoint at `url` with the defaults: keys not trusted, a 10 s timeout, backoff from
    /// 100 ms to 30 s, 5 sends per pass.
    pub fn new(url: url::Url) -> Endpoint {
        Endpoint {
            url,
            honours_keys: false,
            timeout: Duration::from_secs(10),
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(30),
            attempts_per_pass: 5,
            headers: Vec::new(),
            signing: None,
        }
    }

    /// `host:port` of the endpoint, as `[hosts]` keys are written.
    pub fn host_port(&self) -> String {
        let host = self.url.host_str().unwrap_or_default();
        let port = self.url.port_or_known_default().unwrap_or(80);
        format!("{host}:{port}")
    }
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let header_names: Vec<&str> = self.headers.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("Endpoint")
            .field("url", &self.url.as_str())
            .field("honours_keys", &self.honours_keys)
            .field("timeout", &self.timeout)
            .field("initial_backoff", &self.initial_backoff)
            .field("max_backoff", &self.max_backoff)
            .field("attempts_per_pass", &self.attempts_per_pass)
            .field("headers", &header_names)
            .field("signed", &self.signing.is_some())
            .finish()
    }
}

/// What one send's answer means for its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Acknowledged: record it delivered, go on to the topic's next message.
    Delivered,
    /// Not acknowledged, and another send may get through: send it again (with the same key)
    /// after the wait. `in_doubt`: the endpoint may have acted on this send (a 5xx, 408, 409, a
    /// timeout), so the next send may be a duplicate for an endpoint that ignores keys.
    Again { in_doubt: bool, retry_after: Option<Duration> },
    /// A definitive no: the topic stops at this message, which stays pending.
    Refused,
}

/// The verdict on one send: the rule of evidence (`failure::http`) says what the exchange proves,
/// and only a 2xx acknowledges a message. A 3xx the rule counts as taken is, for a relay that
/// never follows redirects, an endpoint that is not where the file says: refused, so that the
/// topic stops until the operator fixes the URL instead of losing the message as delivered.
pub fn judge(observation: &HttpObservation) -> Verdict {
    match (failure::http(observation), observation) {
        (HttpVerdict::Taken, HttpObservation::Answered { status: 200..=299, .. }) => Verdict::Delivered,
        (HttpVerdict::Taken | HttpVerdict::Refused, _) => Verdict::Refused,
        (HttpVerdict::NotTaken(Failure::RateLimited { retry_after }), _) => {
            Verdict::Again { in_doubt: false, retry_after: Some(retry_after) }
        }
        (HttpVerdict::NotTaken(_), _) => Verdict::Again { in_doubt: false, retry_after: None },
        (HttpVerdict::InDoubt, _) => Verdict::Again { in_doubt: true, retry_after: None },
    }
}

/// The wait before the next send of a message whose `failures`-th send in a row (from 1) did not
/// deliver it: full jitter over the capped exponential backoff, or the endpoint's `Retry-After`
/// (capped too). `jitter` is in [0, 1).
pub fn wait(endpoint: &Endpoint, failures: u32, retry_after: Option<Duration>, jitter: f64) -> Duration {
    match retry_after {
        Some(after) => after.min(endpoint.max_backoff),
        None => crate::retry::exponential(endpoint.initial_backoff, endpoint.max_backoff, failures)
            .mul_f64(jitter.clamp(0.0, 1.0)),
    }
}

/// The jitter of send `send` of message `effect_key` ([`crate::retry::jitter`]).
pub fn jitter(effect_key: &str, send: u32) -> f64 {
    crate::retry::jitter(effect_key, "oncebox/outbox-jitter", send)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(status: u16) -> HttpObservation {
        HttpObservation::Answered { status, retry_after: None }
    }

    #[test]
    fn only_a_2xx_delivers() {
        for status in [200, 201, 202, 204] {
            assert_eq!(judge(&answered(status)), Verdict::Delivered, "{status}");
        }
        for status in [301, 302, 303, 307, 308] {
            assert_eq!(judge(&answered(status)), Verdict::Refused, "{status}: a redirect is not a delivery");
        }
    }

    #[test]
    fn a_definitive_4xx_stops_the_topic_and_what_may_pass_later_is_sent_again() {
        for status in [400, 401, 403, 404, 410, 422] {
            assert_eq!(judge(&answered(status)), Verdict::Refused, "{status}");
        }
        for status in [500, 502, 503, 504, 408, 409, 499] {
            assert_eq!(judge(&answered(status)), Verdict::Again { in_doubt: true, retry_after: None }, "{status}");
        }
        assert_eq!(judge(&HttpObservation::SentNoAnswer), Verdict::Again { in_doubt: true, retry_after: None });
        assert_eq!(judge(&HttpObservation::NotConnected), Verdict::Again { in_doubt: false, retry_after: None });
        let limited = HttpObservation::Answered { status: 429, retry_after: Some(Duration::from_secs(2)) };
        assert_eq!(judge(&limited), Verdict::Again { in_doubt: false, retry_after: Some(Duration::from_secs(2)) });
    }

    #[test]
    fn waits_grow_are_capped_and_jittered() {
        let url = url::Url::parse("http://127.0.0.1:9/x").expect("url");
        let endpoint = Endpoint {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
            ..Endpoint::new(url)
        };
        let almost_one = 0.999_999;
        assert!(wait(&endpoint, 1, None, almost_one) < Duration::from_millis(100));
        assert!(wait(&endpoint, 3, None, almost_one) > Duration::from_millis(399));
        assert!(wait(&endpoint, 3, None, almost_one) < Duration::from_millis(400));
        assert!(wait(&endpoint, 40, None, almost_one) < Duration::from_secs(1), "capped");
        assert_eq!(wait(&endpoint, 3, None, 0.0), Duration::ZERO);
        assert_eq!(wait(&endpoint, 1, Some(Duration::from_millis(250)), 0.5), Duration::from_millis(250));
        assert_eq!(wait(&endpoint, 1, Some(Duration::from_secs(60)), 0.5), Duration::from_secs(1), "capped too");
    }

    #[test]
    fn jitter_is_in_range_and_differs_between_sends() {
        let draws: Vec<f64> = (1..=20).map(|send| jitter("0123456789abcdef0123", send)).collect();
        assert!(draws.iter().all(|j| (0.0..1.0).contains(j)), "{draws:?}");
        assert!(draws.windows(2).any(|w| w[0] != w[1]), "{draws:?}");
        assert_eq!(jitter("k", 1), jitter("k", 1), "derived, not random");
    }

    #[test]
    fn an_endpoints_debug_names_its_credentials_never_their_values() {
        let url = url::Url::parse("https://hooks.example.com/email").expect("url");
        let endpoint =
            Endpoint { headers: vec![("authorization".into(), "Bearer sk_live".into())], ..Endpoint::new(url) };
        let debug = format!("{endpoint:?}");
        assert!(debug.contains("authorization") && !debug.contains("sk_live"), "{debug}");
        assert_eq!(endpoint.host_port(), "hooks.example.com:443");
    }
}
