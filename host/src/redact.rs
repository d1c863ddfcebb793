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
}
