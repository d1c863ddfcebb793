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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
