//! Operation keys, effect keys and fingerprints. Pure: no I/O, no wasmtime, no redb.
//!
//! Keys come from the orchestrator's durable ids (run, step) and the tool's name, never from
//! the model's output. Every input is length-prefixed and every hash is domain-separated, so no
//! two different tuples can produce the same bytes to hash (`("ab", "c")` vs `("a", "bc")`).

use serde_json::Value;
use sha2::{Digest, Sha256};

/// Identifies one operation: one tool run for one step of one run.
pub fn operation_key(run_id: &str, step_id: &str, tool: &str) -> String {
    hash("oncebox/operation/v1", &[run_id.as_bytes(), step_id.as_bytes(), tool.as_bytes()])
}

/// Identifies one effect of an operation: the `occurrence`-th use of `label` in an invocation.
/// Forwarded downstream as `Idempotency-Key`.
pub fn effect_key(operation_key: &str, label: &str, occurrence: u32) -> String {
    hash("oncebox/effect/v1", &[operation_key.as_bytes(), label.as_bytes(), &occurrence.to_be_bytes()])
}

/// Identifies a request: the tool and its args in canonical form ([`canonical_json`]). Same step,
/// different fingerprint: the caller changed its mind, and that is a conflict, not a retry.
pub fn fingerprint(tool: &str, canonical_args: &str) -> String {
    hash("oncebox/fingerprint/v1", &[tool.as_bytes(), canonical_args.as_bytes()])
}

/// Identifies what an effect asked for, so a replay that asks for something else is caught.
pub fn effect_fingerprint(kind: &str, parts: &[&[u8]]) -> String {
    let mut all: Vec<&[u8]> = vec![kind.as_bytes()];
    all.extend_from_slice(parts);
    hash("oncebox/effect-request/v1", &all)
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
    use super::*;
    use serde_json::json;

    #[test]
    fn canonical_json_sorts_keys_at_every_depth_and_drops_whitespace() {
        let value: Value =
            serde_json::from_str(r#"{ "b": 1, "a": { "y": [1, {"d": 2, "c": 3}], "x": null } }"#).expect("valid json");
        assert_eq!(canonical_json(&value), r#"{"a":{"x":null,"y":[1,{"c":3,"d":2}]},"b":1}"#);
    }

    #[test]
    fn fingerprint_ignores_key_order_but_not_values() {
        let fingerprint = |tool, args: Value| fingerprint(tool, &canonical_json(&args));
        let a = fingerprint("charge", json!({"order_id": "o1", "amount_cents": 100}));
        let b = fingerprint("charge", json!({"amount_cents": 100, "order_id": "o1"}));
        let c = fingerprint("charge", json!({"amount_cents": 101, "order_id": "o1"}));
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, fingerprint("refund", json!({"order_id": "o1", "amount_cents": 100})));
    }

    #[test]
    fn keys_are_length_prefixed() {
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
}
