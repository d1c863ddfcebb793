//! What a person is shown is what is stored. Some characters change how the text around them is
//! displayed without showing themselves: bidirectional overrides and isolates (a value shown in
//! another order than it is sent), zero-width and other format characters, line and paragraph
//! separators, controls, private-use and unassigned code points, variation selectors and blank
//! fillers. Ids may not hold those that forge a line (`forges`); stored text that holds any is shown
//! with each one written as an escape wherever a person reads it to decide (the console, the
//! CLI's JSON), so that an approver reads the value the fingerprint binds.

use std::borrow::Cow;
use std::fmt::Write as _;

use unicode_general_category::{GeneralCategory, get_general_category};

/// Whether `c` hides from a reader: shown as nothing, as a blank, or by changing its neighbours.
pub fn hides(c: char) -> bool {
    use GeneralCategory::*;
    forges(c)
        || matches!(
            get_general_category(c),
            Control | Format | LineSeparator | ParagraphSeparator | PrivateUse | Surrogate | Unassigned
        )
        || matches!(
            c,
            // Marks that draw nothing: the combining grapheme joiner, Khmer's invisible vowels,
            // Mongolian and standard variation selectors.
            '\u{034F}' | '\u{17B4}' | '\u{17B5}' | '\u{180B}'..='\u{180F}' | '\u{FE00}'..='\u{FE0F}'
            | '\u{E0100}'..='\u{E01EF}'
            // Letters and symbols drawn as blanks: Hangul fillers, the braille blank, a null notehead.
            | '\u{115F}' | '\u{1160}' | '\u{3164}' | '\u{FFA0}' | '\u{2800}' | '\u{1D159}'
        )
}

/// Whether `c` would forge what a line says: a control (a new line forges a log line), a line or
/// paragraph separator (a new line in many log viewers), a bidirectional override or isolate
/// (text shown in another order than stored), a zero-width character or the BOM. Ids may not
/// hold these (`keys::id_refused`); the wider [`hides`] is what is escaped where a person reads
/// stored text. (Ids are refused by the narrower rule so that an id accepted before, with an
/// emoji's variation selector say, still names its records.)
pub fn forges(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200B}'..='\u{200F}' | '\u{2028}'..='\u{202E}' | '\u{2060}'..='\u{2069}' | '\u{FEFF}')
}

/// `text` with every hiding character but the new line written as a JSON escape (`\u202e`). In
/// serde_json's text of a value, that is the same value to any JSON reader, shown as stored:
/// serde_json escapes the controls below U+0020 inside strings itself, so a new line there is
/// layout. In plain text (a note, a description), it is what a person reads instead of nothing.
pub fn reveal(text: &str) -> Cow<'_, str> {
    if !text.chars().any(|c| c != '\n' && hides(c)) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if c != '\n' && hides(c) {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                let _ = write!(out, "\\u{unit:04x}");
            }
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_hides_and_what_does_not() {
        for c in ['\u{202E}', '\u{2066}', '\u{200B}', '\u{200D}', '\u{FEFF}', '\u{00AD}', '\u{2028}', '\u{E0041}'] {
            assert!(hides(c), "{c:?} hides");
        }
        for c in ['\u{0007}', '\u{007F}', '\u{0085}', '\u{E000}', '\u{FE0F}', '\u{3164}', '\u{17B4}', '\u{2800}'] {
            assert!(hides(c), "{c:?} hides");
        }
        for c in ['\u{202E}', '\u{200B}', '\n', '\u{2028}', '\u{FEFF}'] {
            assert!(forges(c), "{c:?} forges a line");
        }
        for c in ['\u{FE0F}', '\u{00AD}', '\u{E000}', 'é'] {
            assert!(!forges(c), "{c:?}: an id may hold it, as before");
        }
        for c in ['a', ' ', 'é', 'ß', '中', '€', '😀', '\u{0301}'] {
            assert!(!hides(c), "{c:?} shows");
        }
    }

    #[test]
    fn a_revealed_value_reads_back_as_the_same_value_with_nothing_hidden() {
        let value = serde_json::json!({
            "address": "Acct \u{202E}4321-8765 \u{202C} end",
            "zero\u{200B}width": ["tag \u{E0041}", "line\u{2028}sep", "del \u{7F}", "plain é 中 😀"],
        });
        let text = serde_json::to_string_pretty(&value).expect("json");
        let shown = reveal(&text);
        assert!(shown.contains("Acct \\u202e4321-8765 \\u202c end"), "{shown}");
        assert!(shown.contains("\\udb40\\udc41"), "an astral character as its surrogate pair: {shown}");
        assert!(shown.contains("plain é 中 😀"), "what shows is left as it is: {shown}");
        assert!(!shown.chars().any(|c| c != '\n' && hides(c)), "{shown}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&shown).expect("the shown text is JSON"), value);
    }

    #[test]
    fn text_with_nothing_hidden_is_not_copied() {
        let text = serde_json::to_string_pretty(&serde_json::json!({"a": "b\nc", "d": [1, 2]})).expect("json");
        assert!(matches!(reveal(&text), Cow::Borrowed(_)));
    }
}
