//! A sensitive arg that the downstream echoes in its answer (a shipping API echoes the address,
//! a payment API the payment method) is sealed wherever it travels: masked in the ledger file,
//! in `oncebox ledger show`, in the API's operation and run views with the token and without, in
//! MCP's results, on the console's pages and in the logs; and kept whole, sealed under the
//! ledger's key, for the guest's replays. The downstream here is a server of the test's own on
//! loopback that echoes every field it is sent.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use serde_json::{Value, json};

use super::support::{Setup, TOKEN, client};

/// The sensitive `payment_method` of `charge`, as the caller sends it.
const CARD: &str = "4000056655665556";

/// What the echo server answered: every body, exactly as it sent it, and each by the
/// `Idempotency-Key` it came with.
#[derive(Default)]
struct Echo {
    answered: Mutex<Vec<String>>,
    by_key: Mutex<HashMap<String, String>>,
}

type Answered = Arc<Echo>;

/// A downstream that answers `POST /payments` with every field it was sent, plus an id made from
/// the payment method (so the tool's output carries it too) and a status; and `GET
/// /payments/by-key/KEY` with what it answered for that key. An order named `lost` is taken and
/// answered 500, as a gateway that fails after its origin committed.
async fn echo_server() -> (String, Answered) {
    async fn payments(
        State(echo): State<Answered>,
        headers: HeaderMap,
        Json(sent): Json<Value>,
    ) -> (StatusCode, String) {
        let mut answer = sent.clone();
        let method = sent["payment_method"].as_str().unwrap_or_default();
        answer["id"] = format!("pay_{method}").into();
        answer["status"] = "succeeded".into();
        let body = answer.to_string();
        let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        echo.by_key.lock().unwrap_or_else(|p| p.into_inner()).insert(key, body.clone());
        if sent["order_id"] == "lost" {
            return (StatusCode::INTERNAL_SERVER_ERROR, "the gateway timed out".into());
        }
        echo.answered.lock().unwrap_or_else(|p| p.into_inner()).push(body.clone());
        (StatusCode::OK, body)
    }
    async fn by_key(State(echo): State<Answered>, Path(key): Path<String>) -> (StatusCode, String) {
        match echo.by_key.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            Some(body) => (StatusCode::OK, body.clone()),
            None => (StatusCode::NOT_FOUND, "{}".into()),
        }
    }
    let echo = Answered::default();
    let app = axum::Router::new()
        .route("/payments", post(payments))
        .route("/payments/by-key/{key}", get(by_key))
        .with_state(echo.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), echo)
}

fn args(order: &str) -> Value {
    json!({"order_id": order, "amount_cents": 1200, "currency": "eur", "payment_method": CARD})
}

fn assert_sealed(surface: &str, text: &str) {
    assert!(!text.contains(CARD), "{surface} shows the sensitive value in the clear:\n{text}");
}

/// One MCP request over streamable HTTP; the JSON-RPC answer (from a JSON or an SSE body).
async fn mcp(http: &reqwest::Client, url: &str, session: Option<&str>, body: Value) -> (Option<String>, Value) {
    let mut request = http
        .post(url)
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .json(&body);
    if let Some(session) = session {
        request = request.header("mcp-session-id", session).header("mcp-protocol-version", "2025-06-18");
    }
    let response = request.send().await.expect("mcp request");
    let session = response.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_string);
    let status = response.status();
    let text = response.text().await.expect("mcp body");
    assert!(status.is_success(), "MCP answered {status}: {text}");
    let answer = text
        .lines()
        .map(|line| line.strip_prefix("data:").unwrap_or(line).trim())
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|v| v.get("id").is_some())
        .unwrap_or(Value::Null);
    (session, answer)
}

/// Calls `charge` over MCP for `step` of run `r`; the tools/call result.
async fn mcp_charge(http: &reqwest::Client, url: &str, step: &str, order: &str) -> Value {
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "sealed-test", "version": "0"}}});
    let (session, initialized) = mcp(http, url, None, init).await;
    assert!(initialized.get("result").is_some(), "{initialized}");
    let session = session.expect("a session id");
    let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let sent = http
        .post(url)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", "2025-06-18")
        .json(&note)
        .send()
        .await
        .expect("initialized");
    assert!(sent.status().is_success(), "{}", sent.status());
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "charge", "arguments": args(order),
        "_meta": {"oncebox/run-id": "r", "oncebox/step-id": step}}});
    let (_, answer) = mcp(http, url, Some(&session), call).await;
    answer["result"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sensitive_value_the_downstream_echoes_is_sealed_on_every_surface_and_exact_for_the_guest() {
    let (base, answered) = echo_server().await;
    let setup = Setup::downstream(&base, "");
    let mut server = setup.serve();
    let http = client();

    // The call: the answer to the caller is masked, fresh and replayed alike.
    let call = json!({"run_id": "r", "step_id": "charge", "tool": "charge", "args": args("o-1")});
    let first: Value =
        http.post(server.url("/v1/calls")).json(&call).send().await.expect("call").json().await.expect("json");
    assert_eq!(first["status"], "completed", "{first}");
    assert_eq!(first["output"]["id"], "pay_[redacted]", "the echoed value is masked in the output: {first}");
    assert_eq!(first["output"]["amount_cents"], 1200, "the rest of the output is as the tool returned it");
    let again: Value =
        http.post(server.url("/v1/calls")).json(&call).send().await.expect("call").json().await.expect("json");
    assert_eq!((again["replayed"].as_bool(), &again["output"]), (Some(true), &first["output"]), "{again}");
    assert_sealed("the call's answer", &first.to_string());
    assert_sealed("the replay's answer", &again.to_string());
    let key = first["operation_key"].as_str().expect("key").to_string();
    assert_eq!(answered.answered.lock().expect("answered").len(), 1, "charged once");

    // The API's views, without the token (loopback) and with it.
    for token in [None, Some(TOKEN)] {
        for path in [format!("/v1/operations/{key}"), "/v1/runs/r".to_string()] {
            let mut request = http.get(server.url(&path));
            if let Some(token) = token {
                request = request.bearer_auth(token);
            }
            let response = request.send().await.expect("get");
            assert!(response.status().is_success(), "{path}: {}", response.status());
            let text = response.text().await.expect("text");
            assert_sealed(&format!("{path} (token: {})", token.is_some()), &text);
            if path.starts_with("/v1/operations") {
                let view: Value = serde_json::from_str(&text).expect("json");
                let response = view["effects"][0]["response"].as_str().expect("a recorded answer");
                assert!(response.contains("[redacted]"), "the echo is masked, the answer kept: {response}");
                assert!(view["effects"][0]["sealed"].is_string(), "the exact answer is kept sealed: {view}");
            }
        }
    }

    // MCP: a fresh call of a new step, and the replay of the first.
    let mcp_url = server.url("/mcp");
    let fresh = mcp_charge(&http, &mcp_url, "mcp-charge", "o-2").await;
    assert_eq!(fresh["structuredContent"]["status"], "completed", "{fresh}");
    assert_eq!(fresh["structuredContent"]["output"]["id"], "pay_[redacted]", "{fresh}");
    assert_sealed("an MCP result", &fresh.to_string());
    let replayed = mcp_charge(&http, &mcp_url, "charge", "o-1").await;
    assert_eq!(replayed["_meta"]["oncebox/replayed"], true, "{replayed}");
    assert_sealed("a replayed MCP result", &replayed.to_string());

    // The console's pages.
    for path in ["/", "/runs", "/runs/r", "/unknowns"] {
        let page = http.get(server.url(path)).send().await.expect("page");
        assert!(page.status().is_success(), "{path}: {}", page.status());
        assert_sealed(&format!("the console's {path}"), &page.text().await.expect("html"));
    }
    let log = server.log();
    server.kill();
    assert!(log.contains("listening") || !log.is_empty(), "the server logged: {log}");
    assert_sealed("the server's log", &log);

    // `oncebox ledger show`, and the ledger file's bytes.
    let ledger = setup.ledger();
    let ledger_arg = ledger.to_str().expect("utf8");
    let shown = std::process::Command::new(env!("CARGO_BIN_EXE_oncebox"))
        .env("ONCEBOX_KEY_FILE", setup.dir.path().join("hosts.key"))
        .args(["ledger", "show", "--ledger", ledger_arg, &key])
        .output()
        .expect("ledger show");
    let printed = format!("{}{}", String::from_utf8_lossy(&shown.stdout), String::from_utf8_lossy(&shown.stderr));
    assert!(shown.status.success() && printed.contains(&key), "{printed}");
    assert_sealed("`oncebox ledger show`", &printed);
    let bytes = std::fs::read(&ledger).expect("ledger file");
    assert!(!bytes.windows(CARD.len()).any(|w| w == CARD.as_bytes()), "the ledger file holds the value in the clear");

    // The exact answer is there for the guest: sealed for this operation under the ledger's key,
    // it opens to the very bytes the downstream sent.
    let keying = oncebox::secret::load_or_create(&setup.dir.path().join("hosts.key")).expect("key file");
    let view: Value = serde_json::from_str(&printed[printed.find('{').expect("json")..]).expect("shown as JSON");
    let effect = &view["effects"][0];
    let sealed = effect["sealed"].as_str().expect("sealed");
    let exact = oncebox::seal::open(&keying, &key, sealed).expect("opens with the key file");
    let exact: Value = serde_json::from_slice(&exact).expect("the recorded answer");
    let sent = answered.answered.lock().expect("answered")[0].clone();
    assert_eq!(exact["body"].as_str(), Some(sent.as_str()), "exact, byte for byte");
    assert!(oncebox::seal::open(&keying, "another-operation", sealed).is_err(), "bound to its operation");
}

/// The answer lost (a 5xx after the charge went through): the step is unknown, and the run's
/// reconciliation, which works from the record (its args redacted), finds the payment by its key,
/// echoing the payment method. The operation's seal of its sensitive values lets the host mask it
/// there too, and in the output a person gives to settle such a step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_or_a_settlement_that_echoes_a_sensitive_value_is_masked() {
    let (base, _echo) = echo_server().await;
    let setup = Setup::downstream(&base, "");
    let server = setup.serve();
    let http = client();
    let call = json!({"run_id": "r", "step_id": "charge", "tool": "charge", "args": args("lost")});
    let first: Value =
        http.post(server.url("/v1/calls")).json(&call).send().await.expect("call").json().await.expect("json");
    assert_eq!(first["status"], "unknown", "{first}");
    let key = first["operation_key"].as_str().expect("key").to_string();

    let reconciled = http.post(server.url("/v1/runs/r/reconcile")).send().await.expect("reconcile");
    assert!(reconciled.status().is_success(), "{}", reconciled.status());
    let reconciled = reconciled.text().await.expect("text");
    assert!(reconciled.contains("pay_[redacted]"), "committed, its echo masked: {reconciled}");
    assert_sealed("the reconcile's answer", &reconciled);
    for path in [format!("/v1/operations/{key}"), "/v1/runs/r".to_string()] {
        let view =
            http.get(server.url(&path)).bearer_auth(TOKEN).send().await.expect("get").text().await.expect("text");
        assert_sealed(&path, &view);
    }
    let replay: Value =
        http.post(server.url("/v1/calls")).json(&call).send().await.expect("call").json().await.expect("json");
    assert_eq!(
        (replay["status"].as_str(), replay["output"]["id"].as_str()),
        (Some("completed"), Some("pay_[redacted]"))
    );

    // A person settles another such step, with the output copied from the processor's dashboard.
    let call = json!({"run_id": "r", "step_id": "by-hand", "tool": "charge", "args": args("lost")});
    let unknown: Value =
        http.post(server.url("/v1/calls")).json(&call).send().await.expect("call").json().await.expect("json");
    assert_eq!(unknown["status"], "unknown", "{unknown}");
    let key = unknown["operation_key"].as_str().expect("key");
    // Who and why are masked too: a note may quote the card.
    let settle = json!({
        "committed": {"id": format!("pay_{CARD}"), "card": CARD},
        "by": "ops",
        "note": format!("the dashboard shows {CARD} charged"),
    });
    let settled = http
        .post(server.url(&format!("/v1/operations/{key}/resolve")))
        .bearer_auth(TOKEN)
        .json(&settle)
        .send()
        .await
        .expect("resolve");
    assert!(settled.status().is_success(), "{}", settled.status());
    let settled = settled.text().await.expect("text");
    assert!(settled.contains("pay_[redacted]"), "{settled}");
    assert_sealed("a person's settlement", &settled);
    let view = http.get(server.url(&format!("/v1/operations/{key}"))).send().await.expect("get");
    let view = view.text().await.expect("text");
    assert_sealed("a settled operation", &view);
    assert!(view.contains("the dashboard shows [redacted] charged"), "the note, masked: {view}");

    assert_sealed("the server's log", &server.log());
    drop(server);
    let bytes = std::fs::read(setup.ledger()).expect("ledger file");
    assert!(!bytes.windows(CARD.len()).any(|w| w == CARD.as_bytes()), "the ledger file holds the value in the clear");
}

/// A downstream that writes its JSON as Python's `json.dumps` does (every non-ASCII character as
/// `\u00fc`) and PHP's (`/` as `\/`), and echoes the payment method in a header in Latin-1 bytes:
/// the value comes back in none of the forms the caller sent, and is masked in every one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sensitive_value_the_downstream_escapes_its_own_way_is_masked_too() {
    const METHOD: &str = "Zyxwü \"Hofkeller\" 4\\5 / Straße";
    const FRAGMENTS: [&str; 2] = ["Hofkeller", "Zyxw"];
    async fn payments(Json(sent): Json<Value>) -> axum::response::Response {
        let mut answer = sent.clone();
        answer["id"] = "pay_1".into();
        answer["status"] = "succeeded".into();
        let mut body = String::new();
        for c in answer.to_string().chars() {
            match c {
                '/' => body.push_str("\\/"),
                c if c.is_ascii() => body.push(c),
                c => body.push_str(&format!("\\u{:04x}", u32::from(c))),
            }
        }
        let latin1: Vec<u8> = sent["payment_method"].as_str().unwrap_or_default().chars().map(|c| c as u8).collect();
        let mut response = axum::response::Response::new(axum::body::Body::from(body));
        let headers = response.headers_mut();
        headers.insert("content-type", axum::http::HeaderValue::from_static("application/json"));
        headers.insert("x-echo", axum::http::HeaderValue::from_bytes(&latin1).expect("obs-text"));
        response
    }
    let app = axum::Router::new().route("/payments", post(payments));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });

    let setup = Setup::downstream(&base, "");
    let mut server = setup.serve();
    let http = client();
    let mut args = args("o-escaped");
    args["payment_method"] = METHOD.into();
    let call = json!({"run_id": "r", "step_id": "charge", "tool": "charge", "args": args});
    let answer: Value =
        http.post(server.url("/v1/calls")).json(&call).send().await.expect("call").json().await.expect("json");
    assert_eq!(answer["status"], "completed", "{answer}");
    let key = answer["operation_key"].as_str().expect("key").to_string();
    let sealed = |surface: &str, text: &str| {
        for fragment in FRAGMENTS {
            assert!(!text.contains(fragment), "{surface} shows the sensitive value ({fragment}):\n{text}");
        }
    };
    sealed("the call's answer", &answer.to_string());
    for path in [format!("/v1/operations/{key}"), "/v1/runs/r".to_string()] {
        let text = http.get(server.url(&path)).send().await.expect("get").text().await.expect("text");
        sealed(&path, &text);
        assert!(text.contains("[redacted]"), "{path}: masked, not dropped: {text}");
    }
    server.kill();
    let shown = std::process::Command::new(env!("CARGO_BIN_EXE_oncebox"))
        .env("ONCEBOX_KEY_FILE", setup.dir.path().join("hosts.key"))
        .args(["ledger", "show", "--ledger", setup.ledger().to_str().expect("utf8"), &key])
        .output()
        .expect("ledger show");
    assert!(shown.status.success(), "{}", String::from_utf8_lossy(&shown.stderr));
    sealed("`oncebox ledger show`", &String::from_utf8_lossy(&shown.stdout));
    let bytes = std::fs::read(setup.ledger()).expect("ledger file");
    for fragment in FRAGMENTS {
        assert!(!bytes.windows(fragment.len()).any(|w| w == fragment.as_bytes()), "the ledger file holds {fragment}");
    }
}
