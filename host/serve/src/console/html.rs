//! The console's HTML: the one `escape` every value passes through, the shared style, the page
//! frame, and small renderers (times, durations, JSON, badges). Nothing here reads the ledger.

use std::fmt::Write;
use std::time::{Duration, UNIX_EPOCH};

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
/// Where each page is: named once, for the console's links as for every message that sends a
/// person here.
pub use oncebox_runtime::pages as paths;

/// Who is looking: signed in (the browser's Basic credentials, or the bearer token) or not. Only a signed-in
/// viewer is shown the decision forms, and so the CSRF token they carry.
#[derive(Debug, Clone, Default)]
pub struct Viewer {
    pub csrf: Option<String>,
}

impl Viewer {
    pub fn signed_in(&self) -> bool {
        self.csrf.is_some()
    }
}

/// Escapes text for HTML content and for quoted attribute values, its hiding characters shown.
pub fn escape(text: &str) -> String {
    // What the ledger holds is shown as it is: a character that would hide from the reader (a
    // direction override in a note, a zero-width one in a description: `shown`) as its escape.
    let text = oncebox_runtime::shown::reveal(text);
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Percent-encodes a path segment or query value (`pages::segment`, the one rule).
pub fn encode(text: &str) -> String {
    oncebox_runtime::pages::segment(text)
}

/// A link to `href` (a path from [`paths`]) whose text is `text` (escaped).
pub fn link(href: &str, text: &str) -> String {
    format!("<a href=\"{}\">{}</a>", escape(href), escape(text))
}

/// A time from the ledger (ms since the epoch), in UTC; 0 is "never".
pub fn time(ms: u64) -> String {
    if ms == 0 {
        return "—".into();
    }
    let at = UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_millis(at).to_string().replace('T', " ").replace('Z', " UTC")
}

/// A duration in microseconds, short.
pub fn micros(us: u64) -> String {
    match us {
        0..1_000 => format!("{us} µs"),
        1_000..1_000_000 => format!("{:.1} ms", us as f64 / 1_000.0),
        _ => format!("{:.2} s", us as f64 / 1_000_000.0),
    }
}

/// JSON, pretty, in a `<pre>`; `class` names what it is for (and what a test reads). A character
/// that would hide from the reader (a bidi override, a zero-width one: `shown`) is written as its
/// JSON escape, and a line above says so; and the block is laid out left to right in stored order
/// (the style's `bidi-override`), so that right-to-left letters cannot reorder the digits beside
/// them: an approver reads the value the fingerprint binds.
pub fn json_pre(class: &str, value: &serde_json::Value) -> String {
    let text = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    let shown = oncebox_runtime::shown::reveal(&text);
    let warning = match shown {
        std::borrow::Cow::Borrowed(_) => "",
        std::borrow::Cow::Owned(_) => {
            "<p class=\"warn hidden-characters\" data-testid=\"hidden-characters\">These values hold characters \
             that change how text is shown without showing themselves (a direction override, a zero-width or \
             format character): each is written below as its escape, <code>\\uXXXX</code>.</p>"
        }
    };
    format!("{warning}<pre class=\"json {}\">{}</pre>", escape(class), escape(&shown))
}

/// Recorded JSON text (an output, a response) pretty when it parses, as is otherwise (but as a
/// JSON string, its hiding characters escaped, where it holds any).
pub fn json_text_pre(class: &str, text: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(value) => json_pre(class, &value),
        Err(_) if text.chars().any(|c| c != '\n' && oncebox_runtime::shown::hides(c)) => {
            json_pre(class, &serde_json::Value::String(text.to_string()))
        }
        Err(_) => format!("<pre class=\"json {}\">{}</pre>", escape(class), escape(text)),
    }
}

/// A status as a coloured label.
pub fn badge(status: &str) -> String {
    let tone = match status {
        "completed" | "approved" | "compensated" | "done" | "ok" => "good",
        "unknown" | "pending" | "awaiting-approval" | "dispatched" | "outstanding" | "blocked" => "warn",
        "failed" | "rejected" | "refused" => "bad",
        _ => "plain",
    };
    format!("<span class=\"badge {tone}\">{}</span>", escape(status))
}

/// The hidden CSRF field every POST form carries.
pub fn csrf_field(viewer: &Viewer) -> String {
    viewer.csrf.as_deref().map_or_else(String::new, |token| hidden("csrf", token))
}

pub fn hidden(name: &str, value: &str) -> String {
    format!("<input type=\"hidden\" name=\"{}\" value=\"{}\">", escape(name), escape(value))
}

/// The links of the navigation bar, by path and label.
const NAV: [(&str, &str); 6] = [
    ("/", "Overview"),
    (paths::APPROVALS, "Approvals"),
    (paths::UNKNOWNS, "Unknowns"),
    (paths::RUNS, "Runs"),
    ("/tools", "Tools"),
    ("/login", "Sign in"),
];

/// A whole page: the frame, the navigation, the flash message (escaped like the rest), the body.
pub fn page(title: &str, viewer: &Viewer, flash: Option<&str>, body: &str) -> String {
    let mut nav = String::new();
    for (path, label) in NAV {
        let label = if path == "/login" && viewer.signed_in() { "Signed in" } else { label };
        let _ = write!(nav, "<a href=\"{path}\">{label}</a>");
    }
    let flash = flash
        .filter(|f| !f.trim().is_empty())
        .map(|f| format!("<p class=\"flash\" role=\"status\">{}</p>", escape(f)))
        .unwrap_or_default();
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title} · oncebox</title><style>{CSS}</style></head>\
         <body><header><span class=\"brand\">oncebox</span><nav>{nav}</nav></header>\
         <main><h1>{title}</h1>{flash}{body}</main></body></html>",
        title = escape(title),
    )
}

/// An HTML answer, with the headers that keep the console's pages to themselves: no framing (a
/// decision button must not be clickjacked), no scripts, no caching of what the ledger says.
pub struct Page {
    pub status: StatusCode,
    pub html: String,
}

impl Page {
    pub fn ok(html: String) -> Page {
        Page { status: StatusCode::OK, html }
    }
}

pub const CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; form-action 'self'; \
                       frame-ancestors 'none'; base-uri 'none'";

impl IntoResponse for Page {
    fn into_response(self) -> Response {
        let mut response = (self.status, self.html).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
        headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
        headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
        headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
        // Not `no-referrer`: under it a browser sends `Origin: null` with a form, and the origin check
        // could not tell the console's own forms from anyone's.
        headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        response
    }
}

/// One small stylesheet for every page.
const CSS: &str = "
:root{--fg:#1d2430;--muted:#5b6575;--line:#d9dee7;--bg:#f6f7f9;--card:#fff;--accent:#2450b2}
*{box-sizing:border-box}body{margin:0;font:15px/1.45 system-ui,sans-serif;color:var(--fg);background:var(--bg)}
header{display:flex;gap:2rem;align-items:center;padding:.6rem 1.5rem;background:#1d2430;color:#fff}
header .brand{font-weight:700;letter-spacing:.04em}header nav a{color:#dfe6f3;margin-right:1.1rem;text-decoration:none}
header nav a:hover{color:#fff;text-decoration:underline}
main{max-width:1100px;margin:0 auto;padding:1rem 1.5rem 3rem}h1{font-size:1.5rem;margin:.6rem 0 1rem}
h2{font-size:1.15rem;margin:1.6rem 0 .6rem}h3{font-size:1rem;margin:1rem 0 .4rem}
a{color:var(--accent)}code,pre{font:13px/1.4 ui-monospace,monospace}
pre{background:#f0f2f6;border:1px solid var(--line);padding:.6rem;overflow:auto;white-space:pre-wrap;word-break:break-all}
.card{background:var(--card);border:1px solid var(--line);border-radius:6px;padding:1rem 1.2rem;margin:0 0 1rem}
.counts{display:flex;flex-wrap:wrap;gap:.8rem;margin-bottom:1rem}
.counts a{flex:1 1 150px;background:var(--card);border:1px solid var(--line);border-radius:6px;padding:.7rem 1rem;text-decoration:none;color:var(--fg)}
.counts b{display:block;font-size:1.6rem}
table{width:100%;border-collapse:collapse;background:var(--card);margin:.3rem 0 1rem}
th,td{text-align:left;padding:.35rem .55rem;border-bottom:1px solid var(--line);vertical-align:top}
th{font-weight:600;color:var(--muted);font-size:.85rem}
dl{display:grid;grid-template-columns:max-content 1fr;gap:.25rem 1rem;margin:.4rem 0}dt{color:var(--muted)}dd{margin:0}
.badge{display:inline-block;padding:0 .45rem;border-radius:9px;font-size:.8rem;font-weight:600;background:#e6e9ef}
.badge.good{background:#d8f0de;color:#185c2a}.badge.warn{background:#fdebc8;color:#7a4b00}.badge.bad{background:#f8d7d7;color:#8a1c1c}
.consequence{border-left:4px solid #c0392b;background:#fdf0ef;padding:.5rem .8rem}
pre.json{unicode-bidi:bidi-override;direction:ltr}
.hidden-characters{border-left:4px solid #b07a00;background:#fdebc8;padding:.5rem .8rem}
.flash{background:#e4efff;border:1px solid #b7cdf5;padding:.6rem .9rem;border-radius:6px}
.error{background:#fdf0ef;border:1px solid #f0b6b0;padding:.6rem .9rem;border-radius:6px}
.muted{color:var(--muted)}form{margin:.6rem 0}label{display:block;margin:.35rem 0}
input[type=text],input[type=password],textarea,select{font:inherit;padding:.3rem .45rem;border:1px solid #b9c1ce;border-radius:4px;width:min(100%,32rem)}
button{font:inherit;padding:.4rem 1rem;border-radius:4px;border:1px solid #8792a3;background:#fff;cursor:pointer;margin-right:.5rem}
button.approve{background:#1f7a3a;border-color:#1f7a3a;color:#fff}button.reject{background:#b02a2a;border-color:#b02a2a;color:#fff}
button.primary{background:var(--accent);border-color:var(--accent);color:#fff}
ol.timeline{list-style:none;padding:0;border-left:3px solid var(--line);margin-left:.4rem}
ol.timeline>li{position:relative;margin:0 0 1rem 1rem}
ol.timeline>li::before{content:'';position:absolute;left:-1.5rem;top:1.1rem;width:.7rem;height:.7rem;border-radius:50%;background:var(--accent)}
";

/// A string field of an approval view (`api::approval_views`), empty when absent.
pub fn field<'v>(view: &'v serde_json::Value, name: &str) -> &'v str {
    view[name].as_str().unwrap_or_default()
}

/// Requests for approval, one row each, linking to the request.
pub fn approvals_table(views: &[serde_json::Value], empty: &str) -> String {
    if views.is_empty() {
        return format!("<p class=\"muted\">{}</p>", escape(empty));
    }
    let mut out =
        String::from("<table><tr><th>Tool</th><th>Run</th><th>Step</th><th>State</th><th>Requested</th><th></th></tr>");
    for view in views {
        let state = if view["used"] == true { "used" } else { field(view, "state") };
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(field(view, "tool")),
            link(&paths::run(field(view, "run_id")), field(view, "run_id")),
            escape(field(view, "step_id")),
            badge(state),
            time(view["requested_ms"].as_u64().unwrap_or_default()),
            link(&paths::approval(field(view, "operation_key")), "Review"),
        );
    }
    out.push_str("</table>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_leaves_no_markup() {
        assert_eq!(
            escape("<a href=\"x\" onclick='y'>&</a>"),
            "&lt;a href=&quot;x&quot; onclick=&#39;y&#39;&gt;&amp;&lt;/a&gt;"
        );
    }

    #[test]
    fn escape_shows_what_would_hide() {
        assert_eq!(escape("by \u{202E}ecila\u{200B}"), "by \\u202eecila\\u200b");
    }

    #[test]
    fn encode_keeps_a_segment_one_segment() {
        assert_eq!(encode("run 1/a?b"), "run%201%2Fa%3Fb");
        assert_eq!(encode("r-1_x.y~"), "r-1_x.y~");
    }

    #[test]
    fn recorded_text_that_is_not_json_shows_its_hiding_characters_as_escapes() {
        let shown = json_text_pre("output", "paid to \u{202E}4321\u{202C}");
        assert!(shown.contains("hidden-characters") && shown.contains("\\u202e4321\\u202c"), "{shown}");
        assert!(!shown.contains('\u{202E}'), "{shown}");
        let plain = json_text_pre("output", "plain text\nsecond line");
        assert!(!plain.contains("hidden-characters") && plain.contains("plain text\nsecond line"), "{plain}");
    }

    #[test]
    fn a_flash_is_escaped() {
        let html = page("T", &Viewer::default(), Some("<script>x</script>"), "");
        assert!(html.contains("&lt;script&gt;x&lt;/script&gt;"));
        assert!(!html.contains("<script>"));
    }
}
