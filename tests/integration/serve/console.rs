//! The operator console: in the system's headless Chromium (Debian's `chromium`, driven by
//! `playwright-core` from `tests/serve/console`), a person signs in, reads the exact params of a
//! pending fulfillment and approves it, and the step then ships the order once; with a plain
//! client, a decision sent cross-site, without the CSRF token or without a session decides
//! nothing.

use std::path::{Path, PathBuf};
use std::process::Command;

use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, LOCATION, ORIGIN, SET_COOKIE, WWW_AUTHENTICATE};
use serde_json::{Value, json};

use super::support::{Server, Setup, TOKEN, client};
use crate::support::charge;

const RUN: &str = "r-console";

fn fulfill(order: &str) -> Value {
    json!({"order_id": order, "address": "1 Main St", "items": [{"sku": "sku-1", "quantity": 1}]})
}

fn setup(provider: &oncebox_example_provider::ProviderHandle) -> Setup {
    Setup::new(provider)
}

/// `tests/serve/console`, with its `node_modules` (`npm ci` on first use).
fn console_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/serve/console");
    let chromium = std::env::var_os("CHROMIUM").map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from);
    crate::support::require(&format!("Chromium ({})", chromium.display()), chromium.is_file(), "chromium");
    crate::support::require(
        "Node.js and npm",
        crate::support::on_path("node") && crate::support::on_path("npm"),
        "nodejs npm",
    );
    let _lock = NPM_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    if !dir.join("node_modules").join("playwright-core").is_dir() {
        let status = Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund"])
            .current_dir(&dir)
            .env("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
            .status()
            .expect("npm ci");
        assert!(status.success(), "npm ci in {} failed", dir.display());
    }
    dir
}

static NPM_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Calls a step through the API and returns its outcome.
async fn call(server: &Server, step: &str, tool: &str, args: &Value) -> Value {
    let body = json!({ "run_id": RUN, "step_id": step, "tool": tool, "args": args });
    let response = client().post(server.url("/v1/calls")).json(&body).send().await.expect("call");
    let status = response.status();
    let answer: Value = response.json().await.expect("json");
    assert_eq!(status, 200, "calling {tool}: {answer}\nserver log:\n{}", server.log());
    answer
}

async fn approval_state(server: &Server, key: &str) -> Value {
    let view: Value = client()
        .get(server.url(&format!("/v1/approvals/{key}")))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    view["state"].clone()
}

/// The pages the browser script screenshots, in its order.
const PAGES: [&str; 8] = ["overview", "approvals", "approval", "approved", "unknowns", "runs", "run", "tools"];

#[tokio::test(flavor = "multi_thread")]
async fn a_person_approves_a_pending_fulfillment_in_chromium_and_it_ships_once() {
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let setup = setup(&provider);
    let server = setup.serve();
    let order = "o-console";
    let charged = call(&server, "charge", "charge", &charge(order)).await;
    assert_eq!(charged["status"], "completed", "{charged}");
    // A right-to-left letter beside digits: laid out by the Unicode bidi rules, the browser would
    // draw `Acct 5678 1234 א`, the digits in another order than the one bound.
    let mut args = fulfill(order);
    args["address"] = json!("Acct \u{5D0} 1234 5678");
    let waiting = call(&server, "fulfill", "fulfill", &args).await;
    assert_eq!(waiting["status"], "awaiting-approval", "{waiting}");
    let key = waiting["operation_key"].as_str().expect("operation_key").to_string();
    let fingerprint = waiting["fingerprint"].as_str().expect("fingerprint").to_string();
    assert_eq!(provider.counts(order).fulfillments, 0, "nothing ships before the approval");

    // A reader on loopback who has not signed in sees the sealed address masked.
    let html =
        client().get(server.url(&format!("/approvals/{key}"))).send().await.expect("page").text().await.expect("text");
    assert!(html.contains(&fingerprint), "the fingerprint is shown");
    assert!(!html.contains("1234 5678"), "the address stays redacted on the page");

    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("serve-screenshots");
    for page in PAGES {
        let _ = std::fs::remove_file(shots.join(format!("{page}.png")));
    }
    // Another process on another port of the same host, which the operator's browser visits
    // once signed in: it must receive nothing of the sign-in (a cookie would reach it: cookies
    // are the host's, whatever the port).
    let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("probe");
    let probe_url = format!("http://127.0.0.1:{}/report", probe.local_addr().expect("addr").port());
    let received = std::thread::spawn(move || {
        use std::io::{BufRead, Write};
        let (stream, _) = probe.accept().expect("the browser visits the probe");
        let mut reader = std::io::BufReader::new(stream);
        let mut head = String::new();
        while reader.read_line(&mut head).is_ok_and(|n| n > 2) {}
        let _ = reader.get_mut().write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok");
        head
    });
    let dir = console_dir();
    let output = Command::new("node")
        .arg(dir.join("approve.mjs"))
        .args([server.base_url.as_str(), TOKEN])
        .arg(&shots)
        .arg(RUN)
        .arg(&probe_url)
        .current_dir(&dir)
        .output()
        .expect("node approve.mjs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "approve.mjs failed:\n{stderr}\nserver log:\n{}", server.log());
    let stdout = String::from_utf8_lossy(&output.stdout);
    let saw: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("approve.mjs printed {stdout:?} ({e}); stderr:\n{stderr}"));
    eprintln!("the browser saw: {saw}");

    assert_eq!(saw["signed_in"], true, "{saw}");
    let head = received.join().expect("probe").to_ascii_lowercase();
    assert!(head.starts_with("get /report"), "{head}");
    assert!(
        !head.contains("\ncookie:") && !head.contains("\nauthorization:"),
        "a process on another port received the operator's sign-in:\n{head}"
    );
    assert_eq!(saw["key"], key.as_str(), "the browser opened the pending request");
    assert_eq!(saw["params"], args, "the signed-in operator sees exactly the params that will be sent");
    assert_eq!(saw["digits_drawn_in_stored_order"], true, "drawn as stored: {saw}");
    assert_eq!(saw["fingerprint"], fingerprint.as_str(), "the fingerprint shown is the one the API returned");
    assert_eq!(saw["form_fingerprint"], fingerprint.as_str(), "the form decides on the fingerprint shown");
    assert!(saw["consequence"].as_str().is_some_and(|c| c.contains("cannot be cancelled")), "{saw}");
    assert!(saw["flash"].as_str().is_some_and(|f| f.starts_with("Approved:")), "{saw}");
    assert_eq!(saw["state_after"], "approved", "{saw}");
    assert_eq!(saw["timeline_steps"], 1, "the run's one operation so far (the charge)");
    assert_eq!(approval_state(&server, &key).await, "approved");
    assert_eq!(provider.counts(order).fulfillments, 0, "approving ships nothing by itself");

    let shipped = call(&server, "fulfill", "fulfill", &args).await;
    assert_eq!(shipped["status"], "completed", "{shipped}");
    let again = call(&server, "fulfill", "fulfill", &args).await;
    assert_eq!(again["status"], "completed");
    assert_eq!(again["replayed"], true, "the step answers from its record");
    assert_eq!(provider.counts(order).fulfillments, 1, "the order shipped exactly once");

    for page in PAGES {
        let file = shots.join(format!("{page}.png"));
        let bytes = std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert!(bytes.len() > 1000, "{} is {} bytes", file.display(), bytes.len());
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{} is a PNG", file.display());
    }
}

/// A form body, urlencoded.
fn form(pairs: &[(&str, &str)]) -> String {
    url::form_urlencoded::Serializer::new(String::new()).extend_pairs(pairs).finish()
}

/// The console's sign-in as a browser answers its challenge: `Authorization: Basic`, any user
/// name, the token as the password. Checked against the sign-in page first: without it, 401 and
/// the challenge; with it, back to where the person was going.
async fn sign_in(http: &reqwest::Client, server: &Server) -> String {
    let asked = http.get(server.url("/login?next=/runs")).send().await.expect("sign in");
    assert_eq!(asked.status(), 401);
    let challenge = asked.headers()[WWW_AUTHENTICATE].to_str().expect("ascii").to_string();
    assert!(challenge.starts_with("Basic realm="), "{challenge}");
    let signed = basic(TOKEN);
    let response = http.get(server.url("/login?next=/runs")).header(AUTHORIZATION, &signed).send().await.expect("in");
    assert_eq!(response.status(), 303);
    assert_eq!(response.headers()[LOCATION], "/runs?flash=signed-in");
    assert!(response.headers().get(SET_COOKIE).is_none(), "no cookie, which every port of the host would receive");
    signed
}

/// `Authorization: Basic` with `password` and a user name, as reqwest encodes it.
fn basic(password: &str) -> String {
    let request = reqwest::Client::new().get("http://127.0.0.1/").basic_auth("operator", Some(password));
    let request = request.build().expect("a request");
    request.headers()[AUTHORIZATION].to_str().expect("ascii").to_string()
}

/// A console page as the signed-in operator reads it.
async fn page_as(http: &reqwest::Client, server: &Server, signed: &str, path: &str) -> String {
    http.get(server.url(path)).header(AUTHORIZATION, signed).send().await.expect("page").text().await.expect("html")
}

/// The CSRF token of the signed-in page's forms.
async fn csrf_of(http: &reqwest::Client, server: &Server, signed: &str, path: &str) -> String {
    let html = page_as(http, server, signed, path).await;
    let at = html.find("name=\"csrf\" value=\"").expect("a csrf field") + "name=\"csrf\" value=\"".len();
    html[at..].split('"').next().expect("value").to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_decision_sent_cross_site_without_csrf_or_without_the_sign_in_decides_nothing() {
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let setup = setup(&provider);
    let server = setup.serve();
    let order = "o-refused";
    let waiting = call(&server, "fulfill", "fulfill", &fulfill(order)).await;
    let key = waiting["operation_key"].as_str().expect("operation_key").to_string();
    let fingerprint = waiting["fingerprint"].as_str().expect("fingerprint").to_string();
    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");

    // Without a session a reader on loopback sees the request but no form, so no CSRF token.
    let anonymous = http.get(server.url(&format!("/approvals/{key}"))).send().await.expect("page");
    assert_eq!(anonymous.status(), 200);
    let anonymous = anonymous.text().await.expect("html");
    assert!(anonymous.contains(&fingerprint) && !anonymous.contains("name=\"csrf\""), "{anonymous}");

    let wrong = http
        .get(server.url("/login"))
        .header(AUTHORIZATION, basic("not-the-token-at-all"))
        .send()
        .await
        .expect("sign in");
    assert_eq!(wrong.status(), 401);
    assert!(wrong.headers().get(WWW_AUTHENTICATE).is_some(), "asked again");

    let signed = sign_in(&http, &server).await;
    let csrf = csrf_of(&http, &server, &signed, &format!("/approvals/{key}")).await;
    let approve = server.url(&format!("/approvals/{key}/approve"));
    let component = waiting["approval"]["component"].as_str().expect("the component digest").to_string();
    let body = |csrf: &str| {
        form(&[("fingerprint", fingerprint.as_str()), ("component", &component), ("by", "mallory"), ("csrf", csrf)])
    };
    let post =
        |url: &str, body: String| http.post(url).header(CONTENT_TYPE, "application/x-www-form-urlencoded").body(body);

    let refusals: Vec<(&str, reqwest::RequestBuilder, u16)> = vec![
        (
            "another site's Origin",
            post(&approve, body(&csrf)).header(AUTHORIZATION, &signed).header(ORIGIN, "http://evil.example"),
            403,
        ),
        (
            "Sec-Fetch-Site: cross-site",
            post(&approve, body(&csrf)).header(AUTHORIZATION, &signed).header("sec-fetch-site", "cross-site"),
            403,
        ),
        ("a wrong CSRF token", post(&approve, body("0123")).header(AUTHORIZATION, &signed), 403),
        (
            "no CSRF token",
            post(&approve, form(&[("fingerprint", fingerprint.as_str()), ("by", "mallory")]))
                .header(AUTHORIZATION, &signed),
            403,
        ),
        ("no session", post(&approve, body(&csrf)), 401),
        ("a wrong token", post(&approve, body(&csrf)).header(AUTHORIZATION, basic("forged-forged-forged")), 401),
        ("a reject without a session", post(&server.url(&format!("/approvals/{key}/reject")), body(&csrf)), 401),
        (
            "a settle without a session",
            post(
                &server.url(&format!("/unknowns/{key}/settle")),
                form(&[("verdict", "not-committed"), ("by", "m"), ("csrf", csrf.as_str())]),
            ),
            401,
        ),
        (
            "a reconcile without a session",
            post(&server.url(&format!("/runs/{RUN}/reconcile")), form(&[("csrf", csrf.as_str())])),
            401,
        ),
    ];
    for (what, request, status) in refusals {
        let response = request.send().await.expect("post");
        assert_eq!(response.status(), status, "{what}");
        assert!(response.headers().get(LOCATION).is_none(), "{what}: no redirect, a refusal");
        let html = response.headers().get("content-type").is_some_and(|t| t.as_bytes().starts_with(b"text/html"));
        let text = response.text().await.expect("body");
        if html {
            assert!(text.contains("data-testid=\"error\""), "{what}: an error page: {text}");
        } else {
            // Another site's Origin is refused by the server's same-site guard before the console
            // sees the request, with the API's JSON error.
            assert!(text.contains("\"kind\":\"forbidden\""), "{what}: {text}");
        }
    }
    assert_eq!(approval_state(&server, &key).await, "pending", "nothing was decided");
    let still = call(&server, "fulfill", "fulfill", &fulfill(order)).await;
    assert_eq!(still["status"], "awaiting-approval", "{still}");
    assert_eq!(provider.counts(order).fulfillments, 0);

    // The same form from the console itself decides: the refusals above were the checks', not a
    // broken form's.
    let response = post(&approve, body(&csrf))
        .header(AUTHORIZATION, &signed)
        .header(ORIGIN, server.base_url.as_str())
        .send()
        .await
        .expect("post");
    assert_eq!(response.status(), 303);
    let location = response.headers()[LOCATION].to_str().expect("ascii");
    assert!(location.ends_with("flash=approved"), "{location}");
    assert_eq!(approval_state(&server, &key).await, "approved");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_console_escapes_what_the_ledger_holds_and_shows_errors_as_pages() {
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let setup = setup(&provider);
    let server = setup.serve();
    let run = "<script>alert(1)</script>";
    let body = json!({ "run_id": run, "step_id": "s\"'<i>x", "tool": "charge", "args": charge("o-esc") });
    let response = client().post(server.url("/v1/calls")).json(&body).send().await.expect("call");
    assert_eq!(response.status(), 200);
    for path in ["/", "/runs", "/runs/%3Cscript%3Ealert%281%29%3C%2Fscript%3E"] {
        let page = client().get(server.url(path)).send().await.expect("page");
        assert_eq!(page.status(), 200, "{path}");
        let html = page.text().await.expect("html");
        assert!(!html.contains("<script>") && !html.contains("<i>"), "{path} holds raw markup:\n{html}");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "{path}");
    }
    let missing = client().get(server.url("/approvals/no-such-key")).send().await.expect("page");
    assert_eq!(missing.status(), 404);
    assert!(missing.text().await.expect("html").contains("no request for approval of no-such-key"));
    // A flash is a code the console's own redirects write: text from a link shows nothing.
    for forged in ["%3Cimg%20src%3Dx%3E", "Your%20session%20expired%3A%20sign%20in%20at%20evil.example"] {
        let page = client().get(server.url(&format!("/runs?flash={forged}"))).send().await.expect("page");
        let html = page.text().await.expect("html");
        assert!(
            !html.contains("class=\"flash\"") && !html.contains("evil.example") && !html.contains("img src"),
            "{html}"
        );
    }
    let page = client().get(server.url("/runs?flash=reconciled")).send().await.expect("page");
    assert!(page.text().await.expect("html").contains("class=\"flash\" role=\"status\">Reconciled:"));
}

/// A param holding a direction override would show the approver `Acct  5678-1234 end` where
/// `4321-8765` is bound and sent: every character that hides from a reader is shown as its JSON
/// escape, with a line saying so, to the operator and to a reader without a session alike; the
/// approval then ships the exact value, once.
#[tokio::test(flavor = "multi_thread")]
async fn an_approver_reads_characters_that_hide_as_their_escapes_and_approves_the_exact_value() {
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let setup = setup(&provider);
    let server = setup.serve();
    let order = "o-bidi";
    let address = "Acct \u{202E}4321-8765 \u{202C} end";
    let args = json!({"order_id": order, "address": address, "items": [{"sku": "sku\u{200B}-1", "quantity": 1}]});
    let waiting = call(&server, "fulfill", "fulfill", &args).await;
    assert_eq!(waiting["status"], "awaiting-approval", "{waiting}");
    let key = waiting["operation_key"].as_str().expect("operation_key").to_string();
    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");
    let hidden = |html: &str| html.chars().find(|c| ['\u{202E}', '\u{202C}', '\u{200B}'].contains(c));

    let signed = sign_in(&http, &server).await;
    for (who, signed) in [("the operator", Some(signed.as_str())), ("a reader not signed in", None)] {
        let mut request = http.get(server.url(&format!("/approvals/{key}")));
        if let Some(signed) = signed {
            request = request.header(AUTHORIZATION, signed);
        }
        let html = request.send().await.expect("page").text().await.expect("html");
        assert_eq!(hidden(&html), None, "{who}: a character that hides reached the page:\n{html}");
        assert!(html.contains("data-testid=\"hidden-characters\""), "{who}: no line says so:\n{html}");
        assert!(html.contains("sku\\u200b-1"), "{who}: the sku as stored:\n{html}");
        if signed.is_some() {
            assert!(html.contains("Acct \\u202e4321-8765 \\u202c end"), "{who}: the address as bound:\n{html}");
        }
    }

    // The API's raw answer too (an approval tool built on it, curl): escaped, and the exact value
    // to a JSON reader.
    let raw = client()
        .get(server.url(&format!("/v1/approvals/{key}")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("approval")
        .text()
        .await
        .expect("text");
    assert_eq!(hidden(&raw), None, "a character that hides reached the API's answer: {raw}");
    assert!(raw.contains("sku\\u200b-1"), "the sku as its escape: {raw}");
    let parsed: Value = serde_json::from_str(&raw).expect("JSON");
    assert!(parsed.to_string().contains("sku\u{200B}-1"), "the exact value to a JSON reader: {parsed}");

    let response = client()
        .post(server.url(&format!("/v1/approvals/{key}/approve")))
        .bearer_auth(TOKEN)
        .json(
            &json!({"fingerprint": waiting["fingerprint"], "component": waiting["approval"]["component"], "by": "ops"}),
        )
        .send()
        .await
        .expect("approve");
    assert_eq!(response.status(), 200, "{}", response.text().await.unwrap_or_default());
    let shipped = call(&server, "fulfill", "fulfill", &args).await;
    assert_eq!(shipped["status"], "completed", "{shipped}");
    assert_eq!(provider.counts(order).fulfillments, 1, "shipped once, the exact value approved");
}

/// A run's page says what keeps the run open, as the ledger's one rule (and the API's run view)
/// says it: here, a shipment awaiting approval; once rejected, nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_s_page_shows_what_keeps_it_open_by_the_ledger_s_rule() {
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let setup = setup(&provider);
    let server = setup.serve();
    assert_eq!(call(&server, "pay", "charge", &charge("o-open")).await["status"], "completed");
    let asked = call(&server, "ship", "fulfill", &fulfill("o-open")).await;
    assert_eq!(asked["status"], "awaiting-approval", "{asked}");
    let page = client().get(server.url(&format!("/runs/{RUN}"))).send().await.expect("page");
    let html = page.text().await.expect("html");
    assert!(html.contains("What keeps this run open"), "{html}");
    assert!(html.contains("data-reason=\"awaiting-approval\""), "{html}");
    let run = client().get(server.url(&format!("/v1/runs/{RUN}"))).send().await.expect("run");
    let run: Value = run.json().await.expect("json");
    assert_eq!(run["open"][0]["reason"], "awaiting-approval", "{run}");
    assert_eq!(run["open"][0]["standing"], "pending", "{run}");

    let key = asked["operation_key"].as_str().expect("key");
    let fingerprint = asked["fingerprint"].as_str().expect("fingerprint");
    let rejected = client()
        .post(server.url(&format!("/v1/approvals/{key}/reject")))
        .bearer_auth(TOKEN)
        .json(&json!({ "fingerprint": fingerprint, "by": "ops" }))
        .send()
        .await
        .expect("reject");
    assert_eq!(rejected.status(), 200);
    let html =
        client().get(server.url(&format!("/runs/{RUN}"))).send().await.expect("page").text().await.expect("html");
    assert!(html.contains("Nothing keeps this run open"), "{html}");
}

/// A run over is closed, so `oncebox ledger gc` may remove its records before anyone asks to
/// undo it. After a restart, the run's page and the API's run view still show it, with the
/// compensatable step whose record went named for a person; compensating it through the API
/// dispatches nothing and answers outstanding, the step `undo-by-hand`, never done while the
/// payment stands.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_whose_records_gc_removed_shows_what_must_be_undone_by_hand() {
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let setup = setup(&provider);
    let mut server = setup.serve();
    let paid = call(&server, "pay", "charge", &charge("o-gone")).await;
    assert_eq!(paid["status"], "completed", "{paid}");
    server.kill();
    std::thread::sleep(std::time::Duration::from_millis(5));
    let ledger = setup.ledger();
    let (code, gc, stderr) =
        crate::support::oncebox(&["ledger", "gc", "--ledger", ledger.to_str().expect("utf8"), "--older-than", "0s"]);
    assert_eq!((code, &gc["removed_operations"]), (0, &json!(1)), "{gc} {stderr}");

    let server = setup.serve();
    let html =
        client().get(server.url(&format!("/runs/{RUN}"))).send().await.expect("page").text().await.expect("html");
    let key = paid["operation_key"].as_str().expect("key");
    assert!(html.contains("Removed by retention") && !html.contains("nothing to undo"), "{html}");
    // The charge, named among the steps a person must undo; the form to record it is for the
    // operator alone.
    let named = format!(
        "<table class=\"expired\"><tr><th>Step</th><th>Tool</th><th>Ended</th><th>Record removed</th><th></th></tr>\
         <tr data-key=\"{key}\">"
    );
    assert!(html.contains(&named), "{html}");
    assert!(!html.contains("undone-by-hand"), "no form for a viewer not signed in: {html}");
    let run: Value =
        client().get(server.url(&format!("/v1/runs/{RUN}"))).send().await.expect("run").json().await.expect("json");
    assert_eq!(run["expired"][0]["tool"], "charge", "{run}");
    assert_eq!(run["expired"][0]["class"], "compensatable", "{run}");

    let requests = provider.requests();
    let compensate = || client().post(server.url(&format!("/v1/runs/{RUN}/compensate"))).bearer_auth(TOKEN).send();
    let report = compensate().await.expect("compensate");
    assert_eq!(report.status(), 200);
    let report: Value = report.json().await.expect("json");
    assert_eq!(report["state"], "outstanding", "{report}");
    assert_eq!(report["steps"][0]["action"], "undo-by-hand", "{report}");
    assert_eq!(provider.requests(), requests, "nothing dispatched");
    assert_eq!(provider.counts("o-gone").refunds, 0);
    assert_eq!(provider.counts("o-gone").payments, 1, "the payment stands, as the answer says");

    // A person refunds it at the provider's dashboard and says so: only with the operator's token.
    let word = json!({ "by": "ops", "note": "refunded by hand, ref R-1" });
    let said = server.url(&format!("/v1/operations/{key}/undone-by-hand"));
    let stranger = client().post(&said).json(&word).send().await.expect("post");
    assert_eq!(stranger.status(), 401);
    let recorded = client().post(&said).bearer_auth(TOKEN).json(&word).send().await.expect("post");
    assert_eq!(recorded.status(), 200);
    let recorded: Value = recorded.json().await.expect("json");
    assert_eq!((&recorded["recorded"], &recorded["by"]), (&json!(true), &json!("ops")), "{recorded}");
    let done: Value = compensate().await.expect("compensate").json().await.expect("json");
    assert_eq!(done["state"], "done", "{done}");
    assert!(done["steps"][0]["reason"].as_str().is_some_and(|r| r.contains("undone by hand by ops")), "{done}");
    assert_eq!(provider.requests(), requests, "nothing dispatched");
    assert_eq!(provider.counts("o-gone").refunds, 0);

    // A step on record whose compensation's rejected request went (under a key of the scheme
    // before compensations were keyed by their step alone): shown rejected, as the saga reads it.
    let mut server = server;
    let again = call(&server, "pay-2", "charge", &charge("o-kept")).await;
    assert_eq!(again["status"], "completed", "{again}");
    let kept = again["operation_key"].as_str().expect("key");
    server.kill();
    {
        let ledger = oncebox::ledger::Ledger::open(setup.ledger()).expect("open");
        let charged = ledger.operation(kept).await.expect("read");
        let compensation = oncebox::saga::compensation_step(&charged.expect("recorded"));
        let rejected = oncebox::ledger::Tombstone {
            status: oncebox::ledger::OperationStatus::Failed,
            rejected: true,
            class: None,
            ..crate::support::tombstone("old-refund-key", RUN, &compensation, "refund")
        };
        ledger.expire(&[rejected], &[]).await.expect("expire");
    }
    let server = setup.serve();
    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");
    let signed = sign_in(&http, &server).await;
    let page = format!("/runs/{RUN}");
    let html = page_as(&http, &server, &signed, &page).await;
    let row = format!(
        "<tr data-key=\"{kept}\"><td>pay-2</td><td>charge</td><td><span class=\"badge bad\">rejected</span></td>"
    );
    assert!(html.contains(&row), "{html}");
    let action = format!("/runs/{RUN}/undone-by-hand/{kept}");
    assert!(html.contains(&format!("action=\"{action}\"")), "the form to record it: {html}");
    // Recorded through the console's form: the step counts as undone, and nothing is sent for it.
    let csrf = csrf_of(&http, &server, &signed, &page).await;
    let post = |action: String, signed: Option<&str>, csrf: &str| {
        let mut request = http
            .post(server.url(&action))
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(ORIGIN, server.base_url.as_str());
        if let Some(signed) = signed {
            request = request.header(AUTHORIZATION, signed);
        }
        request.body(form(&[("by", "ops"), ("csrf", csrf)])).send()
    };
    // Without the operator's session, without the form's CSRF token, or under another run's page:
    // refused, and nothing recorded (the form is still there).
    assert_eq!(post(action.clone(), None, &csrf).await.expect("post").status(), 401);
    assert_eq!(post(action.clone(), Some(&signed), "forged").await.expect("post").status(), 403);
    let elsewhere = format!("/runs/another-run/undone-by-hand/{kept}");
    assert_eq!(post(elsewhere, Some(&signed), &csrf).await.expect("post").status(), 404);
    let html = page_as(&http, &server, &signed, &page).await;
    assert!(html.contains(&format!("action=\"{action}\"")), "nothing recorded: {html}");
    let response = http
        .post(server.url(&action))
        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header(AUTHORIZATION, &signed)
        .header(ORIGIN, server.base_url.as_str())
        .body(form(&[("by", "ops"), ("note", "refunded by hand"), ("csrf", &csrf)]))
        .send()
        .await
        .expect("post");
    assert_eq!(response.status(), 303);
    let html = page_as(&http, &server, &signed, &page).await;
    assert!(html.contains("undone by hand</span>") && !html.contains(&format!("action=\"{action}\"")), "{html}");
    let requests = provider.requests();
    let done: Value = client()
        .post(server.url(&format!("/v1/runs/{RUN}/compensate")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("compensate")
        .json()
        .await
        .expect("json");
    assert_eq!(done["state"], "done", "{done}");
    assert_eq!(provider.requests(), requests, "nothing dispatched");
    assert_eq!(provider.counts("o-kept").refunds, 0);
}

/// An approval that expired unused shows as expired, with the form to decide again; deciding
/// again lets the step run, once.
#[tokio::test(flavor = "multi_thread")]
async fn an_expired_approval_shows_as_expired_and_can_be_approved_again() {
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let setup = setup(&provider);
    let server = setup.serve();
    let order = "o-expired";
    let waiting = call(&server, "fulfill", "fulfill", &fulfill(order)).await;
    let key = waiting["operation_key"].as_str().expect("operation_key").to_string();
    let fingerprint = waiting["fingerprint"].as_str().expect("fingerprint").to_string();
    let component = waiting["approval"]["component"].as_str().expect("component").to_string();
    let decision = json!({ "fingerprint": fingerprint, "component": component, "by": "ops", "expires_in": 0.2 });
    let approved = client()
        .post(server.url(&format!("/v1/approvals/{key}/approve")))
        .bearer_auth(TOKEN)
        .json(&decision)
        .send()
        .await
        .expect("approve");
    assert_eq!(approved.status(), 200);
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    assert_eq!(approval_state(&server, &key).await, "expired");

    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");
    let signed = sign_in(&http, &server).await;
    let page = format!("/approvals/{key}");
    let html = page_as(&http, &server, &signed, &page).await;
    assert!(html.contains(&format!("action=\"/approvals/{key}/approve\"")), "the form to decide again: {html}");
    let csrf = csrf_of(&http, &server, &signed, &page).await;
    let again = form(&[("fingerprint", &fingerprint), ("component", &component), ("by", "ops"), ("csrf", &csrf)]);
    let response = http
        .post(server.url(&format!("/approvals/{key}/approve")))
        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header(AUTHORIZATION, &signed)
        .header(ORIGIN, server.base_url.as_str())
        .body(again)
        .send()
        .await
        .expect("post");
    assert_eq!(response.status(), 303);
    assert_eq!(approval_state(&server, &key).await, "approved");
    let shipped = call(&server, "fulfill", "fulfill", &fulfill(order)).await;
    assert_eq!(shipped["status"], "completed", "{shipped}");
    assert_eq!(provider.counts(order).fulfillments, 1);
}

/// Where the sensitive values of a request cannot be unsealed (its ledger's key file was lost, or
/// the ledger was restored without it), the operator's card says why, shows them masked, and
/// offers Reject alone: a person may refuse what they cannot read, never approve it. The
/// rejection decides, and nothing is charged.
#[tokio::test(flavor = "multi_thread")]
async fn a_request_whose_sensitive_values_cannot_be_unsealed_can_be_rejected_and_never_approved() {
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let setup = setup(&provider);
    let policy = std::fs::read_to_string(setup.policy()).expect("policy");
    let policy = policy.replace("[tools.charge]\n", "[tools.charge]\nrequires_approval = true\n");
    std::fs::write(setup.policy(), policy).expect("policy");
    let mut server = setup.serve();
    let order = "o-unreadable";
    let card = "pm_card_4000056655665556";
    let args = json!({"order_id": order, "amount_cents": 1200, "currency": "eur", "payment_method": card});
    let waiting = call(&server, "charge", "charge", &args).await;
    assert_eq!(waiting["status"], "awaiting-approval", "{waiting}");
    let key = waiting["operation_key"].as_str().expect("operation_key").to_string();
    let fingerprint = waiting["fingerprint"].as_str().expect("fingerprint").to_string();
    let component = waiting["approval"]["component"].as_str().expect("component").to_string();

    // The key file is lost; the server starts with a new one.
    server.kill();
    let key_file = setup.dir.path().join("hosts.key");
    std::fs::remove_file(&key_file).expect("remove the key file");
    let server = setup.serve();

    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");
    let signed = sign_in(&http, &server).await;
    let page = format!("/approvals/{key}");
    let html = page_as(&http, &server, &signed, &page).await;
    assert!(!html.contains(card), "the card in the clear:\n{html}");
    assert!(html.contains("[redacted]") && html.contains("could not be unsealed"), "masked, and why:\n{html}");
    assert!(html.contains("data-testid=\"no-approve\""), "says why there is no Approve:\n{html}");
    assert!(!html.contains("class=\"approve\""), "an Approve button beside params the approver cannot read:\n{html}");
    assert!(html.contains(&format!("action=\"/approvals/{key}/reject\"")), "the form rejects by default:\n{html}");
    assert!(html.contains(&format!("formaction=\"/approvals/{}/reject\"", key)), "a Reject button:\n{html}");

    let csrf = csrf_of(&http, &server, &signed, &page).await;
    let body = form(&[
        ("fingerprint", &fingerprint),
        ("component", &component),
        ("by", "ops"),
        ("note", "cannot read it"),
        ("csrf", &csrf),
    ]);
    // Approving it unread is refused wherever it comes from: the API here, the console's form
    // (the same decision), the CLI.
    let approved = client()
        .post(server.url(&format!("/v1/approvals/{key}/approve")))
        .bearer_auth(TOKEN)
        .json(&json!({"fingerprint": fingerprint, "component": component, "by": "ops"}))
        .send()
        .await
        .expect("approve");
    assert_eq!(approved.status(), 409);
    let refusal = approved.text().await.expect("body");
    assert!(refusal.contains("cannot be unsealed here") && !refusal.contains(card), "{refusal}");
    assert_eq!(approval_state(&server, &key).await, "pending");

    let response = http
        .post(server.url(&format!("/approvals/{key}/reject")))
        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header(AUTHORIZATION, &signed)
        .header(ORIGIN, server.base_url.as_str())
        .body(body)
        .send()
        .await
        .expect("post");
    assert_eq!(response.status(), 303);
    assert_eq!(approval_state(&server, &key).await, "rejected");
    assert_eq!(provider.counts(order).payments, 0, "nothing charged");
}
