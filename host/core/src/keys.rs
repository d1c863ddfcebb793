//! Operation keys, effect keys and fingerprints. Pure: no I/O, no wasmtime, no redb.
//!
//! Keys come from the orchestrator's durable ids (run, step) and the tool's name, never from
//! the model's output. Every input is length-prefixed and every hash is domain-separated, so no
//! two different tuples can produce the same bytes to hash (`("ab", "c")` vs `("a", "bc")`).

use serde_json::Value;
use sha2::{Digest, Sha256};

/// Identifies one operation: one tool run for one step of one run. A compensation's step
/// ([`COMPENSATION_PREFIX`]) is one operation whatever tool undoes it: its key leaves the tool
/// out, so that a new version of the compensated tool naming another undo tool finds the step's
/// compensation on record (a conflict, nothing dispatched) instead of starting a second one.
pub fn operation_key(run_id: &str, step_id: &str, tool: &str) -> String {
    if step_id.starts_with(COMPENSATION_PREFIX) {
        return hash("oncebox/compensation/v1", &[run_id.as_bytes(), step_id.as_bytes()]);
    }
    hash("oncebox/operation/v1", &[run_id.as_bytes(), step_id.as_bytes(), tool.as_bytes()])
}

/// How the step id of a compensation begins: `compensate/` and the key of the operation it
/// undoes (see `saga.rs`).
pub const COMPENSATION_PREFIX: &str = "compensate/";

/// The tool a person's word that they undid a step by hand is recorded under, as an operation of
/// the step's compensation (`saga/by_hand.rs`). No tool can be named so: a tool's name is
/// lowercase letters, digits, `-` and `_`.
pub const BY_HAND: &str = "oncebox:by-hand";

/// Where a person's word that they undid operation `operation_key` by hand is recorded when the
/// compensation's own key is taken (by a compensation that failed or was rejected, or by what
/// retention left of one): beside it, one key per undone step, so that a second word is
/// answered from the first.
pub fn undone_by_hand_key(run_id: &str, operation_key: &str) -> String {
    hash("oncebox/undone-by-hand/v1", &[run_id.as_bytes(), operation_key.as_bytes()])
}

/// The longest run or step id, in bytes. Ids are the orchestrator's names, logged and shown
/// wherever their operation is: a longer one is a mistake (a payload where a name belongs).
pub const MAX_ID_BYTES: usize = 512;

/// Why `id` (a run's or a step's, `what` says which) cannot name anything: empty, longer than
/// [`MAX_ID_BYTES`], or holding a control or invisible formatting character (a newline in an id
/// would print a log line that looks like the host's own; a bidirectional override would show it
/// as another id). Asked by every front door before anything is recorded.
pub fn id_refused(what: &str, id: &str) -> Option<String> {
    if id.trim().is_empty() {
        return Some(format!("the {what} id must not be empty"));
    }
    if id.len() > MAX_ID_BYTES {
        return Some(format!("the {what} id is {} bytes; ids are at most {MAX_ID_BYTES}", id.len()));
    }
    let control = id.chars().find(|c| crate::shown::forges(*c))?;
    Some(format!("the {what} id holds the control character {control:?}; ids are printable text"))
}

/// Identifies one effect of an operation: the `occurrence`-th use of `label` in an invocation.
/// Forwarded downstream as `Idempotency-Key`.
pub fn effect_key(operation_key: &str, label: &str, occurrence: u32) -> String {
    hash("oncebox/effect/v1", &[operation_key.as_bytes(), label.as_bytes(), &occurrence.to_be_bytes()])
}

/// The ledger's fingerprint secrets, newest first. Fingerprints are HMAC-SHA256 under the newest:
/// a plain hash of the args would let anyone holding the ledger file recover a short or guessable
/// sensitive value (a PIN, a card number's missing digits) by hashing guesses. Older secrets are
/// kept only so that operations fingerprinted before a rotation still match their replays.
#[derive(Clone)]
pub struct FingerprintKey {
    /// Never empty.
    secrets: std::sync::Arc<Vec<[u8; SECRET_BYTES]>>,
    /// An HMAC already keyed with each secret: keying hashes two blocks, done once here rather
    /// than on every fingerprint of the hot path.
    keyed: std::sync::Arc<Vec<Keyed>>,
}

type Keyed = hmac::Hmac<Sha256>;

/// The length of one fingerprint secret.
pub const SECRET_BYTES: usize = 32;

impl std::fmt::Debug for FingerprintKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FingerprintKey({} secret(s), redacted)", self.secrets.len())
    }
}

impl FingerprintKey {
    /// `secrets`, newest first; `None` if there is none.
    pub fn new(secrets: Vec<[u8; SECRET_BYTES]>) -> Option<Self> {
        use hmac::Mac;
        if secrets.is_empty() {
            return None;
        }
        // HMAC takes a key of any length, so keying cannot fail.
        let keyed = secrets.iter().filter_map(|secret| Keyed::new_from_slice(secret).ok()).collect();
        Some(FingerprintKey { secrets: std::sync::Arc::new(secrets), keyed: std::sync::Arc::new(keyed) })
    }

    /// How many secrets it holds (the newest signs, the others only match).
    pub fn len(&self) -> usize {
        self.secrets.len()
    }

    /// Always false: a key holds at least one secret.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Names each secret, newest first, without giving it away (an HMAC of a fixed text under
    /// it): hosts sharing a ledger prove to it that they hold the same key.
    pub fn ids(&self) -> Vec<String> {
        self.keyed.iter().map(|keyed| mac(keyed, "oncebox/key-id/v1", &[])[..16].to_string()).collect()
    }

    /// Identifies a request: the tool and its args in canonical form ([`canonical_json`]). Same
    /// step, different fingerprint: the caller changed its mind, a conflict, not a retry.
    pub fn fingerprint(&self, tool: &str, canonical_args: &str) -> String {
        mac(&self.keyed[0], "oncebox/fingerprint/v2", &[tool.as_bytes(), canonical_args.as_bytes()])
    }

    /// The same request's fingerprints under the older secrets (none, unless the key was
    /// rotated): an operation recorded before the rotation matches one of them.
    pub fn older_fingerprints(&self, tool: &str, canonical_args: &str) -> Vec<String> {
        let parts: [&[u8]; 2] = [tool.as_bytes(), canonical_args.as_bytes()];
        self.keyed[1..].iter().map(|keyed| mac(keyed, "oncebox/fingerprint/v2", &parts)).collect()
    }

    /// Identifies what an effect asked for (its bodies hold sensitive values too), so that a replay
    /// that asks for something else is caught.
    pub fn effect_fingerprint(&self, kind: &str, parts: &[&[u8]]) -> String {
        let mut all: Vec<&[u8]> = vec![kind.as_bytes()];
        all.extend_from_slice(parts);
        mac(&self.keyed[0], "oncebox/effect-request/v2", &all)
    }

    /// The keys that seal values for a person holding the key file (`seal.rs`), newest first: one
    /// derived from each secret, in a domain of its own, so no seal key is a fingerprint key.
    pub fn sealing_keys(&self) -> Vec<[u8; SECRET_BYTES]> {
        use hmac::Mac;
        self.keyed
            .iter()
            .map(|keyed| {
                let mut mac = keyed.clone();
                mac.update(b"oncebox/seal/v1");
                mac.finalize().into_bytes().into()
            })
            .collect()
    }

    /// The secrets as the key file holds them: one lower-case hex line each, newest first.
    pub fn to_text(&self) -> String {
        self.secrets.iter().map(|secret| format!("{}\n", hex::encode(secret))).collect()
    }

    /// Reads what [`FingerprintKey::to_text`] wrote (blank lines and `#` comments skipped).
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut secrets = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bytes = hex::decode(line).map_err(|_| format!("line {}: not hex", n + 1))?;
            let secret: [u8; SECRET_BYTES] =
                bytes.try_into().map_err(|_| format!("line {}: not {SECRET_BYTES} bytes", n + 1))?;
            secrets.push(secret);
        }
        FingerprintKey::new(secrets).ok_or_else(|| "no secret in it".to_string())
    }

    /// This key with a new newest secret in front of the others.
    pub fn rotated(&self, newest: [u8; SECRET_BYTES]) -> Self {
        let mut secrets = vec![newest];
        secrets.extend(self.secrets.iter().copied());
        FingerprintKey::new(secrets).unwrap_or_else(|| self.clone())
    }
}

/// HMAC-SHA256 (keyed by `keyed`) over the domain and the length-prefixed parts, in lower-case hex.
fn mac(keyed: &Keyed, domain: &str, parts: &[&[u8]]) -> String {
    use hmac::Mac;
    let mut mac = keyed.clone();
    for part in std::iter::once(domain.as_bytes()).chain(parts.iter().copied()) {
        mac.update(&(part.len() as u64).to_be_bytes());
        mac.update(part);
    }
    format!("{:x}", mac.finalize().into_bytes())
}

/// JSON with sorted object keys and no insignificant whitespace.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (key, value)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(value, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

fn hash(domain: &str, parts: &[&[u8]]) -> String {
    let mut hasher = Sha256::new();
    for part in std::iter::once(domain.as_bytes()).chain(parts.iter().copied()) {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part);
    }
    // Lower-case hex, written in one go (hex::encode collects char by char: slow on the hot path).
    format!("{:x}", hasher.finalize())
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_id_is_printable_bounded_text() {
        assert_eq!(super::id_refused("run", "order-42/charge"), None);
        assert_eq!(super::id_refused("step", "commande-été/日本"), None, "letters of any script are printable");
        assert_eq!(super::id_refused("step", &"s".repeat(super::MAX_ID_BYTES)), None);
        for bad in [
            "",
            "  ",
            "a\nINFO forged",
            "a\rb",
            "tab\there",
            "nul\0",
            "\u{85}next-line",
            "a\u{2028}b",
            "\u{202E}gpj.exe",
            "zero\u{200B}width",
        ] {
            assert!(super::id_refused("run", bad).is_some(), "{bad:?}");
        }
        let long = super::id_refused("step", &"s".repeat(super::MAX_ID_BYTES + 1)).expect("refused");
        assert!(long.contains("513 bytes"), "{long}");
    }

    use super::*;
    use serde_json::json;

    #[test]
    fn canonical_json_sorts_keys_at_every_depth_and_drops_whitespace() {
        let value: Value =
            serde_json::from_str(r#"{ "b": 1, "a": { "y": [1, {"d": 2, "c": 3}], "x": null } }"#).expect("valid json");
        assert_eq!(canonical_json(&value), r#"{"a":{"x":null,"y":[1,{"c":3,"d":2}]},"b":1}"#);
    }

    fn key(byte: u8) -> FingerprintKey {
        FingerprintKey::new(vec![[byte; SECRET_BYTES]]).expect("one secret")
    }

    #[test]
    fn fingerprint_ignores_key_order_but_not_values() {
        let key = key(7);
        let fingerprint = |tool, args: Value| key.fingerprint(tool, &canonical_json(&args));
        let a = fingerprint("charge", json!({"order_id": "o1", "amount_cents": 100}));
        let b = fingerprint("charge", json!({"amount_cents": 100, "order_id": "o1"}));
        let c = fingerprint("charge", json!({"amount_cents": 101, "order_id": "o1"}));
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, fingerprint("refund", json!({"order_id": "o1", "amount_cents": 100})));
    }

    #[test]
    fn keys_are_length_prefixed() {
        assert_ne!(undone_by_hand_key("ab", "c"), undone_by_hand_key("a", "bc"));
        let step = format!("{COMPENSATION_PREFIX}k");
        assert_ne!(undone_by_hand_key("r", "k"), operation_key("r", &step, BY_HAND));
        assert_ne!(operation_key("ab", "c", "t"), operation_key("a", "bc", "t"));
        assert_ne!(operation_key("r", "s", "t"), operation_key("r", "st", ""));
        assert_ne!(effect_key("k", "charge", 0), effect_key("k", "charge", 1));
    }

    #[test]
    fn keys_are_stable_and_domain_separated() {
        let op = operation_key("run-1", "step-1", "charge");
        assert_eq!(op, operation_key("run-1", "step-1", "charge"));
        assert_eq!(op.len(), 64);
        assert_ne!(op, hash("oncebox/effect/v1", &[b"run-1", b"step-1", b"charge"]));
    }

    #[test]
    fn fingerprints_depend_on_the_secret_and_survive_a_rotation() {
        let (old, other) = (key(1), key(2));
        let args = r#"{"pin":"1234"}"#;
        assert_ne!(old.fingerprint("t", args), other.fingerprint("t", args), "no secret, no guessing");
        // Not the unkeyed hash a dictionary attack would compute.
        assert_ne!(old.fingerprint("t", args), hash("oncebox/fingerprint/v2", &[b"t", args.as_bytes()]));
        let rotated = old.rotated([3; SECRET_BYTES]);
        assert_ne!(rotated.fingerprint("t", args), old.fingerprint("t", args), "the newest secret signs");
        assert_eq!(
            rotated.older_fingerprints("t", args),
            vec![old.fingerprint("t", args)],
            "the old one still matches"
        );
        assert!(old.older_fingerprints("t", args).is_empty());
        let reread = FingerprintKey::parse(&rotated.to_text()).expect("parses");
        assert_eq!(reread.fingerprint("t", args), rotated.fingerprint("t", args));
        assert!(FingerprintKey::parse("# nothing\n").is_err());
        assert!(FingerprintKey::parse("abcd\n").is_err());
        assert!(!format!("{rotated:?}").contains(&hex::encode([3u8; SECRET_BYTES])), "Debug shows no secret");
    }

    /// Keys reach downstream services as `Idempotency-Key`s and live in ledgers: they must not
    /// change between versions. Computed independently: SHA-256 over the domain and each part,
    /// each prefixed with its length as a big-endian u64, in lower-case hex.
    #[test]
    fn keys_match_their_published_derivation() {
        assert_eq!(
            operation_key("run-1", "step-1", "charge"),
            "378d270c7f7faeb26d5b82427b92e62e11027515883e790fef96331ed1f8a417"
        );
    }

    #[test]
    fn a_compensation_s_key_is_bound_to_the_step_it_undoes_not_to_its_tool() {
        let step = format!("{COMPENSATION_PREFIX}{}", operation_key("run-1", "pay", "charge"));
        assert_eq!(operation_key("run-1", &step, "refund"), operation_key("run-1", &step, "refund-v2"));
        assert_eq!(
            operation_key("run-1", &step, "refund"),
            hash("oncebox/compensation/v1", &[b"run-1", step.as_bytes()])
        );
        let other = format!("{COMPENSATION_PREFIX}{}", operation_key("run-1", "ship", "fulfill"));
        assert_ne!(operation_key("run-1", &step, "refund"), operation_key("run-1", &other, "refund"));
        assert_ne!(operation_key("run-1", &step, "refund"), operation_key("run-2", &step, "refund"));
        // Any other step keeps its tool in its key.
        assert_ne!(operation_key("run-1", "pay", "refund"), operation_key("run-1", "pay", "refund-v2"));
    }
}
