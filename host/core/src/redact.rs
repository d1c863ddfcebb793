//! Replaces the values a manifest marks sensitive (JSON pointers) before anything is stored or
//! logged. Pure.

use serde_json::Value;

pub const REDACTED: &str = "[redacted]";

pub fn redact(value: &Value, pointers: &[String]) -> Value {
    let mut out = value.clone();
    for pointer in pointers {
        if let Some(slot) = out.pointer_mut(pointer) {
            *slot = Value::String(REDACTED.into());
        }
    }
    out
}

/// The string values at the sensitive pointers, to scrub from free text (a guest's error message
/// may echo a card number). Very short values are left alone: scrubbing "1" would garble text.
pub fn sensitive_values(value: &Value, pointers: &[String]) -> Vec<String> {
    pointers
        .iter()
        .filter_map(|p| value.pointer(p))
        .map(|v| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .filter(|s| s.len() >= 4)
        .collect()
}

/// Replaces every occurrence of a secret in `text`.
pub fn scrub(text: &str, secrets: &[String]) -> String {
    secrets.iter().fold(text.to_string(), |text, secret| text.replace(secret.as_str(), REDACTED))
}

/// The end of a guest's output as the host keeps it (in a trap's message): scrubbed of `secrets`,
/// then its last `max` bytes (cut forward to a char boundary) after a marker saying how much came
/// before. Only the end is scrubbed, from far enough back that a secret straddling the cut is
/// replaced whole: no start or end of a secret is left behind, and a flood of output costs no
/// more than its tail.
pub fn scrubbed_tail(output: &[u8], secrets: &[String], max: usize) -> String {
    let longest = secrets.iter().map(String::len).max().unwrap_or(0);
    let from = output.len().saturating_sub(max + longest);
    let scrubbed = scrub(&String::from_utf8_lossy(&output[from..]), secrets);
    let text = scrubbed.trim_end();
    if from == 0 && text.len() <= max {
        return text.to_string();
    }
    let mut start = text.len().saturating_sub(max);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("(the last {max} of {} bytes) …{}", output.len(), &text[start..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_tail_is_scrubbed_before_it_is_cut_and_keeps_the_end() {
        let secrets = vec!["s3cr3t-value".to_string()];
        assert_eq!(scrubbed_tail(b"short, s3cr3t-value\n", &secrets, 64), "short, [redacted]");
        // The secret straddles the cut: neither its start nor its end is left behind.
        for straddle in 1..12 {
            let output = format!("{}s3cr3t-value{}", "a".repeat(500), "b".repeat(20 - straddle));
            let tail = scrubbed_tail(output.as_bytes(), &secrets, 20);
            for part in ["s3cr", "cr3t", "t-va", "value", "lue"] {
                assert!(!tail.contains(part), "{straddle}: {tail}");
            }
            assert!(tail.starts_with(&format!("(the last 20 of {} bytes) …", output.len())), "{tail}");
            assert!(tail.ends_with('b'), "{tail}");
        }
        // A cut inside a character moves forward to the next boundary.
        assert!(scrubbed_tail("ééééé".as_bytes(), &[], 3).ends_with("…é"));
    }

    #[test]
    fn redacts_listed_pointers_only() {
        let args = json!({"order_id": "o1", "payment_method": "4242424242424242", "nested": {"token": "t"}});
        let out = redact(&args, &["/payment_method".into(), "/nested/token".into(), "/missing".into()]);
        assert_eq!(out, json!({"order_id": "o1", "payment_method": REDACTED, "nested": {"token": REDACTED}}));
    }

    #[test]
    fn scrubs_sensitive_values_from_free_text() {
        let args = json!({"payment_method": "4242424242424242", "pin": "12"});
        let secrets = sensitive_values(&args, &["/payment_method".into(), "/pin".into()]);
        assert_eq!(secrets, ["4242424242424242"]);
        assert_eq!(scrub("card 4242424242424242 declined", &secrets), "card [redacted] declined");
    }
}
