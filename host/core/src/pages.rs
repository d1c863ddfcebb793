//! Where the operator's console (`oncebox serve`, at `/`) shows a thing: the paths its router
//! serves, for every message and notification that sends a person there. Pure.

use std::fmt::Write as _;

/// The page of every request waiting for a person's approval.
pub const APPROVALS: &str = "/approvals";

/// The page of the request for approval of `operation_key`.
pub fn approval(operation_key: &str) -> String {
    format!("{APPROVALS}/{}", segment(operation_key))
}

/// The page of every unknown outcome waiting for a reconcile or a person.
pub const UNKNOWNS: &str = "/unknowns";

/// Where the unknowns page's form settles the unknown operation `operation_key` (`/settle`
/// after it); no page is served there.
pub fn unknown(operation_key: &str) -> String {
    format!("{UNKNOWNS}/{}", segment(operation_key))
}

/// Every run, by the page.
pub const RUNS: &str = "/runs";

/// The page of run `run_id`: its steps, what keeps it open, what compensation did.
pub fn run(run_id: &str) -> String {
    format!("{RUNS}/{}", segment(run_id))
}

/// `text` percent-encoded as one path segment or query value: run ids and step ids are the
/// orchestrator's and may hold `/`, `?` or spaces.
pub fn segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_s_path_holds_its_id_as_one_segment() {
        assert_eq!(run("r/1 ?x"), "/runs/r%2F1%20%3Fx");
        assert_eq!(approval("0cc652d1"), "/approvals/0cc652d1");
        assert_eq!(segment("Zürich"), "Z%C3%BCrich");
    }
}
