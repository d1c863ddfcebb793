//! Replaces the values a manifest marks sensitive (JSON pointers) before anything is stored or
//! logged. Pure.

use std::cell::OnceCell;

use aho_corasick::{AhoCorasick, AhoCorasickKind};
use memchr::memmem;
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

/// The values at the sensitive pointers, to scrub from free text (a guest's error message or a
/// traceback may echo a card number). A value that is not a string is scrubbed as its compact
/// JSON and by each of its leaves too (strings and numbers), so that it is caught however the guest
/// printed it (Python's repr of a dict, a JS object, one field of it). Longest first (an order
/// for readers; masking replaces what overlapping values cover together); very short values are
/// left alone: scrubbing "1" would garble text.
pub fn sensitive_values(value: &Value, pointers: &[String]) -> Vec<String> {
    fn leaves(value: &Value, out: &mut Vec<String>) {
        match value {
            Value::String(s) => out.push(s.clone()),
            Value::Number(n) => out.push(n.to_string()),
            Value::Array(items) => items.iter().for_each(|v| leaves(v, out)),
            Value::Object(fields) => fields.values().for_each(|v| leaves(v, out)),
            Value::Bool(_) | Value::Null => {}
        }
    }
    let mut values = Vec::new();
    for found in pointers.iter().filter_map(|p| value.pointer(p)) {
        if !found.is_string() {
            values.push(found.to_string());
        }
        leaves(found, &mut values);
    }
    values.retain(|s| s.len() >= 4);
    values.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    values.dedup();
    values
}

/// Replaces every occurrence of a secret in `text`.
pub fn scrub(text: &str, secrets: &[String]) -> String {
    Finder::new(secrets).scrub(text).unwrap_or_else(|| text.to_string())
}

/// Patterns (secrets, or their forms) found in a text or bytes, every occurrence, overlapping
/// ones too: what overlapping matches cover together is replaced once, so no part of either is
/// left (a value and a leaf inside it, or two values sharing an end and a start). Built once per
/// value masked, asked for each of its strings.
///
/// Most strings hold no secret: each pattern's `memmem` searcher says so at the cost of a search.
/// Where one is found, an Aho-Corasick automaton (built then, once) lists every match, overlapping
/// ones included, in one pass: linear in the text and the matches whatever the patterns (a
/// search restarted after each overlapping match was quadratic in a long periodic value).
struct Finder {
    patterns: Vec<Vec<u8>>,
    searchers: Vec<memmem::Finder<'static>>,
    automaton: OnceCell<Option<AhoCorasick>>,
}

impl Finder {
    fn new<P: AsRef<[u8]>>(patterns: &[P]) -> Finder {
        let mut patterns: Vec<Vec<u8>> =
            patterns.iter().map(|p| p.as_ref().to_vec()).filter(|p| !p.is_empty()).collect();
        patterns.sort_unstable();
        patterns.dedup();
        let searchers = patterns.iter().map(|p| memmem::Finder::new(p).into_owned()).collect();
        Finder { patterns, searchers, automaton: OnceCell::new() }
    }

    /// `haystack` with every match replaced by [`REDACTED`], or `None` when nothing matched.
    fn replace(&self, haystack: &[u8]) -> Option<Vec<u8>> {
        if !self.searchers.iter().any(|searcher| searcher.find(haystack).is_some()) {
            return None;
        }
        // Building fails only past the automaton's size limits (gigabytes of patterns, far beyond
        // any args a host accepts): then nothing of the text is kept rather than some of a secret.
        let Some(automaton) = self.automaton.get_or_init(|| {
            // The kind quickest to build: a value's few forms are searched in one text or a few,
            // so building dominates (a DFA took about 40 us).
            AhoCorasick::builder().kind(Some(AhoCorasickKind::NoncontiguousNFA)).build(&self.patterns).ok()
        }) else {
            return Some(REDACTED.as_bytes().to_vec());
        };
        // Matches come in the order of their ends: each one swallows the spans it overlaps, so
        // the spans kept are disjoint and in order.
        let mut spans: Vec<(usize, usize)> = Vec::new();
        for found in automaton.find_overlapping_iter(haystack) {
            let (mut start, end) = (found.start(), found.end());
            while let Some(&(kept_start, kept_end)) = spans.last() {
                if start >= kept_end {
                    break;
                }
                start = start.min(kept_start);
                spans.pop();
            }
            spans.push((start, end));
        }
        let mut out = Vec::with_capacity(haystack.len());
        let mut from = 0;
        for (start, end) in spans {
            out.extend_from_slice(&haystack[from..start]);
            out.extend_from_slice(REDACTED.as_bytes());
            from = end;
        }
        out.extend_from_slice(&haystack[from..]);
        Some(out)
    }

    /// [`Finder::replace`] for a text: a UTF-8 pattern found in UTF-8 text starts and ends on
    /// characters, so the result is UTF-8 too.
    fn scrub(&self, text: &str) -> Option<String> {
        let out = self.replace(text.as_bytes())?;
        Some(String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
    }
}

/// The one rule for what comes back: `value` (a tool's output, a downstream's answer) with every
/// sensitive value of the call's args masked, or `None` when it holds none. A string is scrubbed
/// wherever a secret occurs in it (an address inside a label's text too); an object key likewise;
/// any other value that is a secret whole (a card number sent as a number, a sensitive object
/// echoed back as it was sent) becomes the string `[redacted]`. The result is still JSON of the
/// same shape, so a reader that parses it keeps working. No secrets, no work.
///
/// A string may hold JSON text itself (a downstream's body, kept as the text it sent): it is
/// masked as JSON when it parses, so that however its writer escaped a value (`\u00df`,
/// `\u00DF`, `\/`) the value is found, at any depth (JSON in a string in a string doubles its
/// escapes at each level, so a text's depth is at most the logarithm of its length, and masking it
/// parses it that many times at most); any other string is scrubbed of each secret as it is and in
/// its JSON-escaped forms (a body quoting the value inside text).
pub fn mask_value(value: &Value, secrets: &[String]) -> Option<Value> {
    if secrets.is_empty() {
        return None;
    }
    let forms = escaped_forms(secrets);
    let (text, bytes) = (Finder::new(&forms), OnceCell::new());
    let composite = secrets.iter().any(|s| s.starts_with('{') || s.starts_with('['));
    let mut walk = Walk { secrets, forms: &forms, text: &text, bytes: &bytes, composite, changed: false };
    let masked = walk.walk(value);
    walk.changed.then_some(masked)
}

/// One walk of [`mask_value`] over a value.
struct Walk<'a> {
    secrets: &'a [String],
    /// The secrets and their JSON-escaped forms, and their finder, for strings that are not JSON
    /// themselves.
    forms: &'a [String],
    text: &'a Finder,
    /// The same forms' bytes, as UTF-8 and as Latin-1, for a body kept in hex (built when one is
    /// met).
    bytes: &'a OnceCell<Finder>,
    /// Some secret is a whole object or array: only then is each one compared whole.
    composite: bool,
    changed: bool,
}

impl Walk<'_> {
    fn scrubbed(&mut self, text: &str) -> String {
        if let Some(masked) = scrub_hex(text, || self.bytes.get_or_init(|| Finder::new(&hex_patterns(self.forms)))) {
            self.changed = true;
            // A secret of hex digits alone may stand in the string as it is, too.
            return self.text.scrub(&masked).unwrap_or(masked);
        }
        let trimmed = text.trim_start();
        if (trimmed.starts_with('{') || trimmed.starts_with('['))
            && let Ok(inner) = serde_json::from_str::<Value>(text)
        {
            let mut nested = Walk { changed: false, ..*self };
            let masked = nested.walk(&inner);
            if nested.changed {
                self.changed = true;
                return masked.to_string();
            }
            // Parsing may have lost a form the text still holds (a number read as a float, the
            // first of two equal keys): the text is scrubbed as text then.
        }
        match self.text.scrub(text) {
            Some(out) => {
                self.changed = true;
                out
            }
            None => text.to_string(),
        }
    }
    fn whole(&mut self, value: &Value) -> bool {
        let hit = self.secrets.contains(&value.to_string());
        self.changed |= hit;
        hit
    }
    fn walk(&mut self, value: &Value) -> Value {
        match value {
            Value::String(text) => Value::String(self.scrubbed(text)),
            Value::Number(_) if self.whole(value) => Value::String(REDACTED.into()),
            Value::Array(_) | Value::Object(_) if self.composite && self.whole(value) => Value::String(REDACTED.into()),
            Value::Array(items) => Value::Array(items.iter().map(|v| self.walk(v)).collect()),
            Value::Object(fields) => {
                Value::Object(fields.iter().map(|(k, v)| (self.scrubbed(k), self.walk(v))).collect())
            }
            other => other.clone(),
        }
    }
}

/// A string of hex digits may be bytes the host could not keep as text (an answer's body that is
/// not UTF-8, or cut inside a character, is kept as `body_hex`): the secrets' forms are looked
/// for in those bytes (`bytes`, from [`hex_patterns`]) and replaced there; the masked bytes, in
/// hex again, or `None` when none was there.
fn scrub_hex<'f>(text: &str, bytes: impl FnOnce() -> &'f Finder) -> Option<String> {
    if text.len() < 8 || !text.len().is_multiple_of(2) || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    bytes().replace(&hex::decode(text).ok()?).map(hex::encode)
}

/// Each form as UTF-8 and, where every character fits a byte, as Latin-1.
fn hex_patterns(forms: &[String]) -> Vec<Vec<u8>> {
    let mut patterns = Vec::with_capacity(forms.len() * 2);
    for form in forms {
        patterns.push(form.as_bytes().to_vec());
        if !form.is_ascii()
            && let Some(latin1) = form.chars().map(|c| u8::try_from(u32::from(c)).ok()).collect::<Option<Vec<u8>>>()
        {
            patterns.push(latin1);
        }
    }
    patterns
}

/// [`mask_value`] for a text: JSON text is masked as JSON (and stays JSON); any other text (an
/// error, a plain-text body) is scrubbed as text, the secrets' JSON-escaped forms included.
/// `None` when the text holds no secret.
pub fn mask_text(text: &str, secrets: &[String]) -> Option<String> {
    if secrets.is_empty() {
        return None;
    }
    match serde_json::from_str::<Value>(text) {
        // Parsing may have lost a form the text holds (a number too long for an integer read as a
        // float): a text whose value masks nothing is scrubbed as text too.
        Ok(value) => mask_value(&value, secrets)
            .map(|masked| masked.to_string())
            .or_else(|| Finder::new(&escaped_forms(secrets)).scrub(text)),
        Err(_) => Finder::new(&escaped_forms(secrets)).scrub(text),
    }
}

/// Each secret as it is, and as JSON text escapes it (quotes and backslashes escaped, as serde
/// writes it; every non-ASCII character as `\uxxxx`, as Python's `json.dumps` does, or as
/// `\uXXXX`; and `/` as `\/`, as PHP's `json_encode` does), so that a value quoted inside a
/// non-JSON text (an error that quotes a body) is caught too. Longest first.
fn escaped_forms(secrets: &[String]) -> Vec<String> {
    let mut forms = Vec::with_capacity(secrets.len());
    for secret in secrets {
        let mut own = vec![secret.clone()];
        let quoted = Value::String(secret.clone()).to_string();
        let inner = &quoted[1..quoted.len() - 1];
        if inner != secret {
            own.push(inner.to_string());
        }
        if !inner.is_ascii() {
            let (mut lower, mut upper) =
                (String::with_capacity(inner.len() * 2), String::with_capacity(inner.len() * 2));
            for c in inner.chars() {
                if c.is_ascii() {
                    lower.push(c);
                    upper.push(c);
                } else {
                    for unit in c.encode_utf16(&mut [0; 2]) {
                        lower.push_str(&format!("\\u{unit:04x}"));
                        upper.push_str(&format!("\\u{unit:04X}"));
                    }
                }
            }
            own.push(lower);
            own.push(upper);
            // Its UTF-8 bytes read as Latin-1: how a header that is not UTF-8 throughout shows it.
            own.push(secret.bytes().map(char::from).collect());
        }
        let slashed: Vec<String> = own.iter().filter(|f| f.contains('/')).map(|f| f.replace('/', "\\/")).collect();
        forms.extend(own);
        forms.extend(slashed);
    }
    forms.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    forms.dedup();
    forms
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
    fn a_sensitive_object_is_scrubbed_whole_and_by_each_of_its_leaves() {
        let args = json!({"card": {"number": "4242424242424242", "cvc": 123, "exp": [12, 2030]}, "memo": "ok"});
        let secrets = sensitive_values(&args, &["/card".to_string()]);
        assert_eq!(secrets[0], r#"{"cvc":123,"exp":[12,2030],"number":"4242424242424242"}"#);
        assert!(secrets.contains(&"4242424242424242".to_string()) && secrets.contains(&"2030".to_string()));
        assert!(!secrets.iter().any(|s| s == "123" || s == "12"), "short leaves are left: {secrets:?}");
        // As Python prints the dict, and as JSON: neither leaves the number behind.
        let python = "KeyError: {'number': '4242424242424242', 'cvc': 123}";
        assert_eq!(scrub(python, &secrets), "KeyError: {'number': '[redacted]', 'cvc': 123}");
        let json = args["card"].to_string();
        assert_eq!(scrub(&json, &secrets), REDACTED);
    }

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
    fn an_echoed_value_is_masked_wherever_it_comes_back_and_the_json_stays_json() {
        let args = json!({"payment_method": "4111111111111111", "card": {"number": 4242424242424242u64}, "memo": "ok"});
        let secrets = sensitive_values(&args, &["/payment_method".into(), "/card".into()]);
        let answer = json!({
            "id": "pay_1",
            "payment_method": "4111111111111111",
            "label": "card 4111111111111111 charged",
            "card": {"number": 4242424242424242u64},
            "number": 4242424242424242u64,
            "4111111111111111": true,
            "memo": "ok"
        });
        let masked = mask_value(&answer, &secrets).expect("it holds secrets");
        assert_eq!(
            masked,
            json!({
                "id": "pay_1",
                "payment_method": REDACTED,
                "label": format!("card {REDACTED} charged"),
                "card": REDACTED,
                "number": REDACTED,
                REDACTED: true,
                "memo": "ok"
            })
        );
        // As text: JSON stays JSON; other text is scrubbed, escaped forms too.
        // An array sent as a whole comes back masked whole, though its items are too short alone.
        let tags = sensitive_values(&json!({"tags": ["vip", "eu"]}), &["/tags".into()]);
        assert_eq!(mask_value(&json!({"tags": ["vip", "eu"], "n": 1}), &tags), Some(json!({"tags": REDACTED, "n": 1})));
        let text = mask_text(&answer.to_string(), &secrets).expect("masked");
        assert_eq!(serde_json::from_str::<Value>(&text).expect("still JSON"), masked);
        assert_eq!(mask_text(r#"{"id":"pay_1"}"#, &secrets), None, "nothing to mask");
        assert_eq!(mask_text("anything", &[]), None, "no secrets, no work");
        let address = sensitive_values(&json!({"a": "Bahnhofstraße 1 \"Hof\""}), &["/a".into()]);
        let quoted = r#"400: {"address":"Bahnhofstraße 1 \"Hof\""} or {"address":"Bahnhofstra\u00dfe 1 \"Hof\""}"#;
        assert_eq!(
            mask_text(quoted, &address).as_deref(),
            Some(r#"400: {"address":"[redacted]"} or {"address":"[redacted]"}"#)
        );
    }

    #[test]
    fn a_body_kept_as_text_is_masked_however_its_writer_escaped_the_value() {
        let secret = r#"Zürich "Hof" 4\5 / Straße"#;
        let secrets = sensitive_values(&json!({ "a": secret }), &["/a".into()]);
        let bodies = [
            // serde_json, JavaScript's JSON.stringify.
            r#"{"address":"Zürich \"Hof\" 4\\5 / Straße","id":"s_1"}"#,
            // Python's json.dumps: every non-ASCII character escaped.
            r#"{"address": "Z\u00fcrich \"Hof\" 4\\5 / Stra\u00dfe", "id": "s_1"}"#,
            // Upper-case hex digits.
            r#"{"address":"Z\u00FCrich \"Hof\" 4\\5 / Stra\u00DFe","id":"s_1"}"#,
            // PHP's json_encode: `/` escaped too.
            r#"{"address":"Z\u00fcrich \"Hof\" 4\\5 \/ Stra\u00dfe","id":"s_1"}"#,
            // Not JSON: text quoting the value as Python's json.dumps escaped it.
            r#"refused: address "Z\u00fcrich \"Hof\" 4\\5 \/ Stra\u00dfe" is unknown"#,
        ];
        for body in bodies {
            // As the ledger keeps an effect's answer: the downstream's body is a string in it.
            let recorded = json!({"status": 200, "headers": [["content-type", "application/json"]], "body": body});
            let masked = mask_value(&recorded, &secrets).map(|m| m.to_string()).unwrap_or_default();
            assert!(
                !masked.contains("Hof") && !masked.contains("rich") && masked.contains(REDACTED),
                "{body}: {masked}"
            );
            let text = mask_text(body, &secrets).unwrap_or_default();
            assert!(!text.contains("Hof") && !text.contains("rich"), "{body}: {text}");
        }
        // A body that is not UTF-8 is kept in hex: the value is found in its bytes, in Latin-1 too.
        let latin1: Vec<u8> = format!("address: {secret}!").chars().map(|c| c as u8).collect();
        let recorded = json!({"status": 200, "body_hex": hex::encode(&latin1)});
        let masked = mask_value(&recorded, &secrets).expect("masked");
        let bytes = hex::decode(masked["body_hex"].as_str().expect("hex")).expect("hex");
        assert_eq!(bytes, b"address: [redacted]!".to_vec());
        // A number JSON would read as a float, echoed whole, is still found in the text.
        let number = sensitive_values(&json!({"n": "123456789012345678901234"}), &["/n".into()]);
        let body = json!({"body": "{\"n\": 123456789012345678901234}"});
        assert!(!mask_value(&body, &number).expect("masked").to_string().contains("1234567890"));
        // A UTF-8 value in a header read as Latin-1 (one invalid byte elsewhere) is found too.
        let misread: String = format!("x\u{ff} {secret}").bytes().map(char::from).collect();
        let misread = mask_value(&json!({"headers": [["x-echo", misread]]}), &secrets).expect("masked");
        assert!(!misread.to_string().contains("Hof"), "{misread}");
        // A JSON body with no secret is left exactly as its writer wrote it.
        let plain = json!({"body": "{\"id\": \"s_1\"}"});
        assert_eq!(mask_value(&plain, &secrets), None);
    }

    #[test]
    fn overlapping_values_leave_nothing_of_either_and_a_hex_body_is_searched_for_escaped_forms() {
        // Two values sharing an end and a start: whichever is replaced first, nothing of the
        // other may be left.
        let secrets = vec!["abcd-1234".to_string(), "1234-wxyz".to_string()];
        assert_eq!(scrub("x abcd-1234-wxyz y", &secrets), "x [redacted] y");
        assert_eq!(scrub("x 1234-wxyz abcd-1234 y", &secrets), "x [redacted] [redacted] y");
        // A body cut inside a character is kept in hex: the value as JSON escaped it is found
        // there too, as are its plain UTF-8 and Latin-1 bytes.
        let secret = "Zürich Straße";
        let secrets = sensitive_values(&json!({ "a": secret }), &["/a".into()]);
        let mut body = br#"{"address":"Z\u00fcrich Stra\u00dfe","x":""#.to_vec();
        body.extend_from_slice(&"é".as_bytes()[..1]);
        let masked = mask_value(&json!({ "body_hex": hex::encode(&body) }), &secrets).expect("masked");
        let bytes = hex::decode(masked["body_hex"].as_str().expect("hex")).expect("hex");
        assert!(bytes.starts_with(br#"{"address":"[redacted]","x":""#), "{}", String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn json_nested_in_strings_is_masked_however_deep_and_a_long_periodic_value_costs_a_pass() {
        // A value with a quote, a backslash and a slash: escaped once more at every level.
        let secret = r#"p"w0rd\b/cdef"#;
        let secrets = sensitive_values(&json!({ "a": secret }), &["/a".into()]);
        let mut nested = json!({ "password": secret, "address": "Stra\u{df}e 1" });
        for depth in 0..8 {
            let masked = mask_value(&nested, &secrets).expect("masked").to_string();
            assert!(!masked.contains("w0rd") && !masked.contains("cdef"), "depth {depth}: {masked}");
            nested = json!({ "body": nested.to_string() });
        }
        // A number too long for an integer, echoed in a JSON text: found in the text.
        let account = sensitive_values(&json!({"n": "12345678901234567890123"}), &["/n".into()]);
        let text = mask_text(r#"{"account": 12345678901234567890123}"#, &account).expect("masked");
        assert!(!text.contains("1234567890"), "{text}");
        // A secret of hex digits in a string that also decodes as hex holding another.
        let secrets = vec!["12345678".to_string(), "ABCD".to_string()];
        let both = format!("{}12345678", hex::encode("ABCD"));
        let masked = mask_value(&json!({ "id": both }), &secrets).expect("masked").to_string();
        assert!(!masked.contains("12345678"), "{masked}");
        // A long value that repeats itself, in a long run of its character: every overlapping
        // match is listed in one pass, and all of it is masked.
        let run = "a".repeat(256 << 10);
        let secrets: Vec<String> = (0..50).map(|n| "a".repeat(4_000 + n)).collect();
        assert_eq!(scrub(&format!("x{run}y"), &secrets), format!("x{REDACTED}y"));
    }

    #[test]
    fn scrubs_sensitive_values_from_free_text() {
        let args = json!({"payment_method": "4242424242424242", "pin": "12"});
        let secrets = sensitive_values(&args, &["/payment_method".into(), "/pin".into()]);
        assert_eq!(secrets, ["4242424242424242"]);
        assert_eq!(scrub("card 4242424242424242 declined", &secrets), "card [redacted] declined");
    }
}
