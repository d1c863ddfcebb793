//! Telling a person (pure): the outbox topic each `[notify]` URL is delivered through
//! (`policy_file::notify` reads the settings), and the signature a receiver checks. What is noticed, and when, is the
//! runtime's (`oncebox_runtime::notify`); the delivery is the outbox relay's, with its retries,
//! its backoff and its record, so a restart loses nothing.
//!
//! Every notification is POSTed as JSON with these headers:
//!
//! - `Idempotency-Key`: the event's own key, the same on every send of it: a receiver that has
//!   seen the key drops the repeat (a send whose answer was lost is sent again);
//! - `Oncebox-Signature: t=UNIX_SECONDS,v1=HEX`: HMAC-SHA256 under the `[notify]` secret of the
//!   text `UNIX_SECONDS.BODY`, computed at each send, so a receiver refuses a body that was changed
//!   and, by the timestamp, one replayed long after it was sent ([`TOLERANCE`] is what we advise).

use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The prefix of the outbox topics notifications travel by: `oncebox/notify URL`. No tool can be
/// granted a topic under `oncebox/`, nor can an `[outbox.TOPIC]` be named so: a tool's message
/// must never go out signed as the host's.
pub const TOPIC_PREFIX: &str = "oncebox/notify ";

/// The reserved prefix of topic names (see [`TOPIC_PREFIX`]).
pub const RESERVED_TOPICS: &str = "oncebox/";

/// The header that carries the signature.
pub const SIGNATURE_HEADER: &str = "Oncebox-Signature";

/// How old a signature's timestamp a receiver should accept, as docs/operating.md advises.
pub const TOLERANCE: Duration = Duration::from_secs(5 * 60);

/// The fewest bytes of a `[notify]` secret: a short one can be guessed from a signed body.
pub const MIN_SECRET_BYTES: usize = 32;

/// The HMAC key notifications are signed with. Never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct SigningKey(Vec<u8>);

impl SigningKey {
    pub fn new(secret: &[u8]) -> SigningKey {
        SigningKey(secret.to_vec())
    }

    /// The `Oncebox-Signature` value for `body` sent at `unix_s`: `t=UNIX_S,v1=HEX`.
    pub fn sign(&self, unix_s: u64, body: &[u8]) -> String {
        format!("t={unix_s},v1={}", hex::encode(self.mac(unix_s, body)))
    }

    /// Whether `header` is a signature of `body` under this key made within `tolerance` of
    /// `now_s`: what a receiver does, here for the tests and for receivers written in Rust.
    pub fn verify(&self, header: &str, body: &[u8], now_s: u64, tolerance: Duration) -> bool {
        let mut stamp = None;
        let mut given = Vec::new();
        for part in header.split(',') {
            match part.split_once('=') {
                Some(("t", t)) => stamp = t.parse::<u64>().ok(),
                Some(("v1", v)) => given.extend(hex::decode(v).ok()),
                _ => {}
            }
        }
        let Some(stamp) = stamp else { return false };
        if now_s.abs_diff(stamp) > tolerance.as_secs() {
            return false;
        }
        given.iter().any(|mac| {
            let mut check = self.keyed();
            check.update(format!("{stamp}.").as_bytes());
            check.update(body);
            check.verify_slice(mac).is_ok()
        })
    }

    fn keyed(&self) -> Hmac<Sha256> {
        // HMAC takes a key of any length.
        <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC keys have no length limit"))
    }

    fn mac(&self, unix_s: u64, body: &[u8]) -> Vec<u8> {
        let mut mac = self.keyed();
        mac.update(format!("{unix_s}.").as_bytes());
        mac.update(body);
        mac.finalize().into_bytes().to_vec()
    }
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningKey([secret])")
    }
}

/// The outbox topic notifications to `url` travel by.
pub fn topic(url: &url::Url) -> String {
    format!("{TOPIC_PREFIX}{url}")
}

/// Whether a topic name is reserved for the host's own messages.
pub fn reserved(topic: &str) -> bool {
    topic.starts_with(RESERVED_TOPICS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_only_for_its_body_key_and_time() {
        let key = SigningKey::new(b"0123456789abcdef0123456789abcdef");
        let header = key.sign(1_700_000_000, b"{\"a\":1}");
        assert!(header.starts_with("t=1700000000,v1="), "{header}");
        assert!(key.verify(&header, b"{\"a\":1}", 1_700_000_100, TOLERANCE));
        assert!(!key.verify(&header, b"{\"a\":2}", 1_700_000_100, TOLERANCE), "another body");
        assert!(!SigningKey::new(b"another key, 32 bytes long......").verify(
            &header,
            b"{\"a\":1}",
            1_700_000_100,
            TOLERANCE
        ));
        assert!(!key.verify(&header, b"{\"a\":1}", 1_700_000_000 + 301, TOLERANCE), "too old");
        assert!(!key.verify("t=1700000000", b"{\"a\":1}", 1_700_000_000, TOLERANCE), "no signature");
        // Computed as a receiver in any language would: HMAC-SHA256("t.body"), hex.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(b"0123456789abcdef0123456789abcdef").expect("a key");
        mac.update(b"1700000000.{\"a\":1}");
        assert_eq!(header, format!("t=1700000000,v1={}", hex::encode(mac.finalize().into_bytes())));
        assert_eq!(format!("{key:?}"), "SigningKey([secret])");
    }

    #[test]
    fn topics_under_oncebox_are_reserved() {
        let url = url::Url::parse("https://hooks.example.com/x").expect("url");
        assert!(reserved(&topic(&url)));
        assert!(!reserved("email"));
    }
}
