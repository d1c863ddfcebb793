//! The HTTP API with a plain client: calls, refusals that record nothing, the operator's token,
//! many requests for one step, the watched tools directory, metrics.

use std::time::Duration;

use oncebox_example_provider::{Fault, FaultKind, Provider, Route, Settings};
use serde_json::{Value, json};

use super::support::{Setup, TOKEN, client};
use crate::support::charge;

async fn post(url: &str, body: &Value) -> (u16, Value) {
    let response = client().post(url).json(body).send().await.expect("request");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn get(url: &str) -> (u16, Value) {
    let response = client().get(url).send().await.expect("request");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

fn fulfill(order: &str) -> Value {
    json!({"order_id": order, "address": "1 Main St", "items": [{"sku": "sku-1", "quantity": 1}]})
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_is_answered_as_oncebox_call_prints_it_and_its_repeat_from_the_ledger() {
    let provider = Provider::start().await.expect("provider");
    let setup = Setup::new(&provider);
    let server = setup.serve();
    let http = client();
    let body = json!({ "run_id": "r1", "step_id": "charge-o1", "tool": "charge", "args": charge("o1") });
    let first = http.post(server.url("/v1/calls")).json(&body).send().await.expect("call");
    assert_eq!(first.status(), 200);
    assert_eq!(first.headers()["oncebox-source"], "fresh");
    let first: Value = first.json().await.expect("json");
    assert_eq!(first["status"], "completed", "{first}");
    assert_eq!(first["replayed"], false);
    let again = http.post(server.url("/v1/calls")).json(&body).send().await.expect("call");
    assert_eq!(again.headers()["oncebox-source"], "replayed");
    let again: Value = again.json().await.expect("json");
    assert_eq!(again["status"], "completed");
    assert_eq!(again["replayed"], true);
    assert_eq!(again["output"], first["output"]);
    assert_eq!(provider.counts("o1").payments, 1, "one charge at the provider");

    let key = first["operation_key"].as_str().expect("key");
    let (status, op) = get(&server.url(&format!("/v1/operations/{key}"))).await;
    assert_eq!(status, 200, "{op}");
    assert_eq!(op["operation"]["status"], "completed");
    assert_eq!(op["effects"].as_array().map(Vec::len), Some(1), "{op}");
    let (status, run) = get(&server.url("/v1/runs/r1")).await;
    assert_eq!(status, 200, "{run}");
    assert_eq!(run["operations"][0]["step_id"], "charge-o1", "{run}");
    assert_eq!(run["open"], json!([]), "every step ended: {run}");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_requests_get_a_json_4xx_and_record_nothing() {
    let provider = Provider::start().await.expect("provider");
    let setup = Setup::new(&provider);
    let server = setup.serve_with(&["--max-body", "4096"]);
    let url = server.url("/v1/calls");
    let http = client();
    let raw = |body: &'static str| {
        let http = http.clone();
        let url = url.clone();
        async move {
            let response =
                http.post(&url).header("content-type", "application/json").body(body).send().await.expect("request");
            (response.status().as_u16(), response.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let cases: Vec<(u16, Value)> = vec![
        raw("{not json").await,
        raw("[1, 2]").await,
        post(&url, &json!({ "run_id": "bad", "step_id": "s", "args": charge("b1") })).await,
        post(&url, &json!({ "run_id": "bad", "step_id": "s", "tool": "charge" })).await,
        post(&url, &json!({ "run_id": "bad", "step_id": "s", "tool": "charge", "args": [1] })).await,
        post(&url, &json!({ "run_id": "bad", "step_id": "s", "tool": "charge", "args": charge("b1"), "runId": "x" }))
            .await,
        post(&url, &json!({ "run_id": "bad", "tool": "charge", "args": charge("b1") })).await,
        post(&url, &json!({ "tool": "charge", "args": charge("b1") })).await,
        post(&url, &json!({ "run_id": "bad", "step_id": "s", "tool": "charge", "args": { "order_id": 7 } })).await,
        post(&url, &json!({ "run_id": "bad", "step_id": "s", "tool": "charge", "args": charge("b1"), "wait": -1 }))
            .await,
    ];
    for (i, (status, body)) in cases.iter().enumerate() {
        assert_eq!(*status, 400, "case {i}: {body}");
        assert!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "case {i}: {body}");
    }
    // A write without identity: the API's own field names, not the CLI's flags.
    let (status, body) = post(&url, &json!({ "tool": "charge", "args": charge("b1") })).await;
    assert_eq!(status, 400, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("`run_id` and `step_id`") && !message.contains("--run"), "{body}");
    let (status, body) = post(&url, &json!({ "run_id": "bad", "step_id": "s", "tool": "nope", "args": {} })).await;
    assert_eq!(status, 404, "{body}");
    assert!(body["error"]["message"].as_str().is_some_and(|m| m.contains("charge")), "names what is loaded: {body}");
    let big = json!({ "run_id": "bad", "step_id": "s", "tool": "charge", "args": { "pad": "x".repeat(8192) } });
    let (status, body) = post(&url, &big).await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["error"]["kind"], "too-large");
    let (status, body) = get(&server.url("/v1/runs/bad")).await;
    assert_eq!(status, 404, "nothing of run `bad` was recorded: {body}");
    assert_eq!(provider.totals().payments, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn sixty_four_concurrent_requests_for_one_step_give_one_charge_at_the_provider() {
    let provider = Provider::start().await.expect("provider");
    // Keys are not deduplicated there: a second send would be a second charge, and counted.
    provider.configure(Settings { honour_keys: false, ..Settings::default() });
    // The charge is slow, so the requests arrive while it is in flight.
    provider.arm(Fault::new(Route::Payments, FaultKind::CommitAfterDelay { delay_ms: 400 }).for_order("c64"));
    let setup = Setup::new(&provider);
    let server = setup.serve();
    let url = server.url("/v1/calls");
    let mut tasks = Vec::new();
    for i in 0..64 {
        let url = url.clone();
        // Half wait for the first caller's result; the others may be told it is in progress.
        let wait = if i % 2 == 0 { json!(30) } else { Value::Null };
        let body =
            json!({ "run_id": "r64", "step_id": "charge-c64", "tool": "charge", "args": charge("c64"), "wait": wait });
        tasks.push(tokio::spawn(async move {
            let response = client().post(&url).json(&body).send().await.expect("post");
            let source =
                response.headers().get("oncebox-source").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
            (response.status().as_u16(), response.json::<Value>().await.unwrap_or(Value::Null), source)
        }));
    }
    let mut statuses = Vec::new();
    for task in tasks {
        let (code, body, source) = task.await.expect("task");
        assert_eq!(code, 200, "{body}");
        statuses.push(format!("{}/{source}", body["status"].as_str().unwrap_or_default()));
    }
    provider.settled().await;
    assert_eq!(provider.counts("c64").payments, 1, "one charge, counted at the provider; statuses: {statuses:?}");
    assert_eq!(provider.requests(), 1, "one request reached the provider: {statuses:?}");
    assert!(statuses.iter().any(|s| s.ends_with("/deduplicated")), "requests shared the running call: {statuses:?}");
    assert!(
        statuses.iter().all(|s| s.starts_with("completed/") || s.starts_with("in-progress/")),
        "every answer is the charge or says it is in progress: {statuses:?}"
    );
    let (_, last) =
        post(&url, &json!({ "run_id": "r64", "step_id": "charge-c64", "tool": "charge", "args": charge("c64") })).await;
    assert_eq!(last["status"], "completed", "{last}");
    assert_eq!(last["replayed"], true);
    assert_eq!(provider.counts("c64").payments, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn approving_needs_the_operators_token_even_on_loopback_and_binds_to_the_fingerprint() {
    let provider = Provider::start().await.expect("provider");
    let setup = Setup::new(&provider);
    let server = setup.serve();
    let body = json!({ "run_id": "ra", "step_id": "ship-f1", "tool": "fulfill", "args": fulfill("f1") });
    let (_, first) = post(&server.url("/v1/calls"), &body).await;
    assert_eq!(first["status"], "awaiting-approval", "{first}");
    let mut shown = fulfill("f1");
    shown["address"] = json!("[redacted]");
    assert_eq!(first["approval"]["params"], shown, "the exact params, the sensitive address masked: {first}");
    let key = first["operation_key"].as_str().expect("key").to_string();
    let fingerprint = first["fingerprint"].as_str().expect("fingerprint").to_string();
    let approve = server.url(&format!("/v1/approvals/{key}/approve"));
    let component = first["approval"]["component"].as_str().expect("the component digest").to_string();
    let decision = json!({ "fingerprint": fingerprint, "component": component, "by": "ops" });
    // Approving names the component the person saw: without it, nothing is approved.
    let unbound = json!({ "fingerprint": fingerprint, "by": "ops" });
    let refused = client().post(&approve).bearer_auth(TOKEN).json(&unbound).send().await.expect("post");
    assert_eq!(refused.status(), 400, "an approval binds the component");

    let (status, refused) = post(&approve, &decision).await;
    assert_eq!(status, 401, "no token: {refused}");
    let wrong = client().post(&approve).bearer_auth("not-the-token-at-all").json(&decision).send().await.expect("post");
    assert_eq!(wrong.status(), 401);
    let other = json!({ "fingerprint": "0".repeat(64), "component": component, "by": "ops" });
    let mismatch = client().post(&approve).bearer_auth(TOKEN).json(&other).send().await.expect("post");
    assert_eq!(mismatch.status(), 409, "another fingerprint approves nothing");
    // The request names the component that will run; a decision on another one decides nothing.
    assert!(component.starts_with("sha256:"), "{first}");
    let stale = json!({ "fingerprint": fingerprint, "component": format!("sha256:{}", "0".repeat(64)), "by": "ops" });
    let refused = client().post(&approve).bearer_auth(TOKEN).json(&stale).send().await.expect("post");
    assert_eq!(refused.status(), 409, "another component approves nothing");
    let (_, pending) = get(&server.url("/v1/approvals?pending=true")).await;
    assert_eq!(pending["approvals"].as_array().map(Vec::len), Some(1), "still pending: {pending}");
    assert_eq!(pending["approvals"][0]["params"], shown, "without the token, the address masked: {pending}");
    assert_eq!(pending["approvals"][0]["params_exact"], false);
    // The operator decides about exactly what will be sent, so the operator sees it unsealed, and
    // no cache on the way keeps it.
    let exact = client().get(server.url(&format!("/v1/approvals/{key}"))).bearer_auth(TOKEN).send().await.expect("get");
    assert_eq!(exact.headers().get("cache-control").and_then(|v| v.to_str().ok()), Some("no-store"));
    let exact: Value = exact.json().await.expect("json");
    assert_eq!(exact["params"], fulfill("f1"), "the operator sees the exact params: {exact}");
    assert_eq!(exact["params_exact"], true);
    assert!(!server.log().contains(fulfill("f1")["address"].as_str().expect("address")), "no log holds the address");
    let (_, again) = post(&server.url("/v1/calls"), &body).await;
    assert_eq!(again["status"], "awaiting-approval");
    assert_eq!(provider.counts("f1").fulfillments, 0, "nothing shipped before the approval");

    let ok = client().post(&approve).bearer_auth(TOKEN).json(&decision).send().await.expect("post");
    assert_eq!(ok.status(), 200);
    let (_, shipped) = post(&server.url("/v1/calls"), &body).await;
    assert_eq!(shipped["status"], "completed", "{shipped}");
    let (_, replay) = post(&server.url("/v1/calls"), &body).await;
    assert_eq!(replay["replayed"], true);
    assert_eq!(provider.counts("f1").fulfillments, 1, "shipped once");
}

#[tokio::test(flavor = "multi_thread")]
async fn beyond_loopback_the_server_needs_a_token_and_every_request_carries_it() {
    let provider = Provider::start().await.expect("provider");
    let setup = Setup::new(&provider);
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_oncebox"))
        .args(setup.flags())
        .args(["--listen", "0.0.0.0:0"])
        .env_remove("ONCEBOX_TOKEN")
        .output()
        .expect("run");
    assert_eq!(output.status.code(), Some(2), "refused as usage");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("token"), "{stderr}");

    let server = setup.serve_with(&["--listen", "0.0.0.0:0"]);
    let port = server.base_url.rsplit(':').next().expect("port").to_string();
    let url = format!("http://127.0.0.1:{port}/v1/calls");
    let body = json!({ "run_id": "rt", "step_id": "s", "tool": "charge", "args": charge("t1") });
    let (status, _) = post(&url, &body).await;
    assert_eq!(status, 401);
    let (status, health) = get(&format!("http://127.0.0.1:{port}/healthz")).await;
    assert_eq!(status, 200, "{health}");
    let ok = client().post(&url).bearer_auth(TOKEN).json(&body).send().await.expect("post");
    assert_eq!(ok.status(), 200);
    assert_eq!(provider.counts("t1").payments, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_component_added_replaced_or_removed_is_picked_up_and_a_bad_one_stops_nothing() {
    let provider = Provider::start().await.expect("provider");
    let setup = Setup::new(&provider);
    std::fs::remove_file(setup.tools().join("notify.wasm")).expect("remove");
    let server = setup.serve();
    let names = || async {
        let (_, tools) = get(&server.url("/v1/tools")).await;
        let names: Vec<String> = tools["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["name"].as_str().map(String::from))
            .collect();
        (names, tools["load_errors"].clone())
    };
    assert!(!names().await.0.contains(&"notify".to_string()));

    std::fs::copy(oncebox_artifacts::NOTIFY, setup.tools().join("notify.wasm")).expect("add");
    std::fs::write(setup.tools().join("broken.wasm"), b"\0asm not really").expect("broken");
    let mut seen = (Vec::new(), Value::Null);
    for _ in 0..100 {
        seen = names().await;
        if seen.0.contains(&"notify".to_string()) && seen.1.as_array().is_some_and(|e| !e.is_empty()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(seen.0.contains(&"notify".to_string()), "added: {seen:?}");
    let errors = seen.1.to_string();
    assert!(errors.contains("broken.wasm"), "the bad one is reported with its file: {errors}");
    let body = json!({ "run_id": "rl", "step_id": "s", "tool": "charge", "args": charge("l1") });
    let (_, charged) = post(&server.url("/v1/calls"), &body).await;
    assert_eq!(charged["status"], "completed", "the others still serve: {charged}");

    std::fs::remove_file(setup.tools().join("refund.wasm")).expect("remove");
    for _ in 0..100 {
        if !names().await.0.contains(&"refund".to_string()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!names().await.0.contains(&"refund".to_string()), "removed");
    let (status, body) =
        post(&server.url("/v1/calls"), &json!({ "run_id": "rl", "step_id": "r", "tool": "refund", "args": {} })).await;
    assert_eq!(status, 404, "{body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_count_calls_by_tool_outcome_and_source_in_prometheus_text() {
    let provider = Provider::start().await.expect("provider");
    let setup = Setup::new(&provider);
    let server = setup.serve();
    let body = json!({ "run_id": "rm", "step_id": "s", "tool": "charge", "args": charge("m1") });
    post(&server.url("/v1/calls"), &body).await;
    post(&server.url("/v1/calls"), &body).await;
    post(
        &server.url("/v1/calls"),
        &json!({ "run_id": "rm", "step_id": "f", "tool": "fulfill", "args": fulfill("m1") }),
    )
    .await;
    let text = client().get(server.url("/metrics")).send().await.expect("get").text().await.expect("text");
    for line in [
        "oncebox_calls_total{tool=\"charge\",outcome=\"completed\",source=\"fresh\"} 1",
        "oncebox_calls_total{tool=\"charge\",outcome=\"completed\",source=\"replayed\"} 1",
        "oncebox_calls_total{tool=\"fulfill\",outcome=\"awaiting-approval\",source=\"fresh\"} 1",
        "oncebox_attempts_total{tool=\"charge\"} 1",
        "oncebox_approvals_pending 1",
        "oncebox_unknown_operations 0",
    ] {
        assert!(text.lines().any(|l| l == line), "missing `{line}` in:\n{text}");
    }
    let count: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("oncebox_ledger_commit_seconds_count "))
        .and_then(|n| n.parse().ok())
        .expect("the commit histogram's count");
    assert!(count >= 2, "the charge's write-ahead and its answer were committed: {count}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_server_delivers_what_its_tools_enqueue_once_with_the_effect_key() {
    let provider = Provider::start().await.expect("provider");
    let (sink, addr) = crate::outbox::Sink::start(crate::outbox::Behaviour::default()).await;
    let outbox = format!("[outbox.email]\nendpoint = \"http://{addr}/email\"\n");
    let setup = Setup::with_policy(&provider, &outbox);
    let server = setup.serve();
    let body = json!({ "run_id": "rn", "step_id": "mail-n1", "tool": "notify", "args": { "order_id": "n1", "email": "a@example.com", "template": "shipped" } });
    let (_, sent) = post(&server.url("/v1/calls"), &body).await;
    assert_eq!(sent["status"], "completed", "{sent}");
    post(&server.url("/v1/calls"), &body).await;
    crate::support::eventually("the message reaches the endpoint", || !sink.received().is_empty()).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let received = sink.received();
    assert_eq!(received.len(), 1, "once, though the step was called twice: {received:?}");
    assert_eq!(received[0].topic, "email");
    assert!(received[0].body.contains("n1"), "{received:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_web_page_cannot_make_the_loopback_server_call_or_compensate() {
    let provider = Provider::start().await.expect("provider");
    let setup = Setup::new(&provider);
    let server = setup.serve();
    let body = json!({ "run_id": "rx", "step_id": "s", "tool": "charge", "args": charge("x1") }).to_string();
    let http = client();
    let url = server.url("/v1/calls");
    // A cross-site fetch or form: the browser names the page's origin.
    let cross = http
        .post(&url)
        .header("origin", "http://evil.example")
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await
        .expect("post");
    assert_eq!(cross.status(), 403);
    // A `no-cors` fetch can only send text/plain (no preflight): refused as such.
    let plain = http.post(&url).header("content-type", "text/plain").body(body.clone()).send().await.expect("post");
    assert_eq!(plain.status(), 415);
    // DNS rebinding: the page's own name resolves to 127.0.0.1; the Host header gives it away.
    let rebound = http
        .post(&url)
        .header("host", "evil.example:80")
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await
        .expect("post");
    assert_eq!(rebound.status(), 403);
    let compensate = http
        .post(server.url("/v1/runs/rx/compensate"))
        .header("origin", "http://evil.example")
        .send()
        .await
        .expect("post");
    assert_eq!(compensate.status(), 403);
    let (_, run) = get(&server.url("/v1/runs/rx")).await;
    assert_eq!(run["error"]["kind"], "not-found", "nothing was recorded: {run}");
    // Its own origin is fine.
    let own = http
        .post(&url)
        .header("origin", server.base_url.clone())
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("post");
    assert_eq!(own.status(), 200);
    assert_eq!(provider.counts("x1").payments, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn empty_ids_are_refused_and_calls_past_the_limit_are_refused_before_anything_is_recorded() {
    let provider = Provider::start().await.expect("provider");
    provider.arm(Fault::new(Route::Payments, FaultKind::CommitAfterDelay { delay_ms: 600 }).for_order("slow"));
    let setup = Setup::new(&provider);
    let server = setup.serve_with(&["--max-calls", "1"]);
    let url = server.url("/v1/calls");
    let (status, body) =
        post(&url, &json!({ "run_id": " ", "step_id": "", "tool": "charge", "args": charge("e1") })).await;
    assert_eq!(status, 400, "{body}");
    let slow = {
        let url = url.clone();
        tokio::spawn(async move {
            post(&url, &json!({ "run_id": "rb", "step_id": "slow", "tool": "charge", "args": charge("slow") })).await
        })
    };
    crate::support::eventually("the slow charge reaches the provider", || provider.in_flight() > 0).await;
    let (status, busy) =
        post(&url, &json!({ "run_id": "rb", "step_id": "other", "tool": "charge", "args": charge("b2") })).await;
    assert_eq!(status, 503, "{busy}");
    assert_eq!(busy["error"]["kind"], "busy");
    // The run view says what keeps the run open, by the ledger's one rule: the charge in flight.
    let (_, run) = get(&server.url("/v1/runs/rb")).await;
    assert_eq!(
        (run["open"][0]["step_id"].as_str(), run["open"][0]["reason"].as_str()),
        (Some("slow"), Some("in-flight")),
        "{run}"
    );
    let (code, done) = slow.await.expect("task");
    assert_eq!((code, done["status"].as_str()), (200, Some("completed")), "{done}");
    let (_, run) = get(&server.url("/v1/runs/rb")).await;
    let steps: Vec<&str> =
        run["operations"].as_array().into_iter().flatten().filter_map(|o| o["step_id"].as_str()).collect();
    assert_eq!(steps, ["slow"], "the refused call left no record");
    assert_eq!(run["open"], json!([]), "{run}");
    assert_eq!(provider.counts("b2").payments, 0);
    assert_eq!(provider.totals().payments, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_component_with_work_in_doubt_is_not_replaced_until_it_is_settled() {
    let provider = Provider::start().await.expect("provider");
    // Committed at once, answered after the host's timeout: the charge is in doubt.
    provider.arm(Fault::new(Route::Payments, FaultKind::Delay { delay_ms: 1_500 }).for_order("d1"));
    let host = provider.addr();
    let setup = Setup::with_policy(&provider, &format!("[hosts.\"{host}\"]\ntimeout = \"300ms\"\n"));
    let mut server = setup.serve();
    let body = json!({ "run_id": "rd", "step_id": "charge-d1", "tool": "charge", "args": charge("d1") });
    let (_, first) = post(&server.url("/v1/calls"), &body).await;
    assert_eq!(first["status"], "unknown", "{first}");

    // A new file for the tool (a deploy): a new inode, the same name.
    let file = setup.tools().join("charge.wasm");
    let staged = setup.tools().join("charge.wasm.new");
    std::fs::copy(oncebox_artifacts::CHARGE, &staged).expect("copy");
    std::fs::rename(&staged, &file).expect("rename");
    let errors = || async {
        let (_, tools) = get(&server.url("/v1/tools")).await;
        tools["load_errors"].to_string()
    };
    let mut seen = String::new();
    for _ in 0..100 {
        seen = errors().await;
        if seen.contains("not replaced") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(seen.contains("not replaced") && seen.contains("charge.wasm"), "{seen}");
    let (_, again) = post(&server.url("/v1/calls"), &body).await;
    assert_eq!(again["status"], "unknown", "the old component still answers for it: {again}");

    // Settled by a person; then SIGHUP tries the file again and it is replaced.
    let key = first["operation_key"].as_str().expect("key");
    let settle = client()
        .post(server.url(&format!("/v1/operations/{key}/resolve")))
        .bearer_auth(TOKEN)
        .json(&json!({ "committed": { "id": "pay_1", "order_id": "d1", "amount_cents": 1200, "status": "succeeded" }, "by": "ops", "note": "seen in the provider's dashboard" }))
        .send()
        .await
        .expect("resolve");
    assert_eq!(settle.status(), 200);
    std::process::Command::new("kill").args(["-HUP", &server.pid().to_string()]).status().expect("kill -HUP");
    for _ in 0..100 {
        seen = errors().await;
        if seen == "[]" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(seen, "[]", "replaced once nothing of it is in doubt");
    let (_, settled) = post(&server.url("/v1/calls"), &body).await;
    assert_eq!(settled["status"], "completed", "{settled}");
    assert_eq!(provider.counts("d1").payments, 1);
    server.kill();
}

#[tokio::test(flavor = "multi_thread")]
async fn behind_a_proxy_the_public_url_names_the_server_and_any_other_name_is_refused() {
    let provider = Provider::start().await.expect("provider");
    let setup = Setup::new(&provider);
    let server = setup.serve_with(&["--public-url", "https://ops.example"]);
    let body = json!({ "run_id": "rp", "step_id": "s", "tool": "charge", "args": charge("p1") }).to_string();
    let send = |host: &'static str, origin: &'static str| {
        client()
            .post(server.url("/v1/calls"))
            .header("host", host)
            .header("origin", origin)
            .header("content-type", "application/json")
            // Behind a proxy every request needs the token: the proxy forwards strangers too.
            .bearer_auth(TOKEN)
            .body(body.clone())
            .send()
    };
    assert_eq!(send("evil.example", "https://evil.example").await.expect("post").status(), 403);
    assert_eq!(send("ops.example", "https://evil.example").await.expect("post").status(), 403);
    assert_eq!(provider.counts("p1").payments, 0);
    assert_eq!(send("ops.example", "https://ops.example").await.expect("post").status(), 200);
    assert_eq!(provider.counts("p1").payments, 1);
}

/// A request as a proxy forwards it: the public name in `Host`, the operator's token or not.
async fn proxied(
    method: reqwest::Method,
    url: &str,
    host: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> (u16, String) {
    let mut request = client().request(method, url).header("host", host);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(body);
    }
    let response = request.send().await.expect("request");
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

/// MCP's `initialize` sent to `url` under the name `host` with the bearer `token`, as a
/// streamable HTTP client sends it: its status and body.
async fn mcp_initialize(url: &str, host: &str, token: &str) -> (u16, String) {
    let response = client()
        .post(url)
        .header("host", host)
        .header("accept", "application/json, text/event-stream")
        .bearer_auth(token)
        .json(&initialize())
        .send()
        .await
        .expect("mcp");
    (response.status().as_u16(), response.text().await.unwrap_or_default())
}

/// MCP's `initialize`, as any client sends it first.
fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "edge-test", "version": "1"}}})
}

/// An agent beyond loopback holds the callers' token, not the operator's: it calls (MCP and the
/// API), reads with sensitive values masked and reconciles; it cannot approve, settle, undo by
/// hand, compensate, nor read the console, and the request it made stays pending until the
/// operator decides.
#[tokio::test(flavor = "multi_thread")]
async fn behind_a_public_url_the_callers_token_calls_and_decides_nothing() {
    use reqwest::Method;
    let provider = Provider::start().await.expect("provider");
    let setup = Setup::new(&provider);
    let caller = "caller-token-0123456789-abcdef";
    let file = setup.dir.path().join("caller-token");
    std::fs::write(&file, format!("{caller}\n")).expect("caller token file");
    let file = file.to_str().expect("utf-8");
    let server = setup.serve_with(&["--public-url", "https://ops.example", "--caller-token-file", file]);
    let host = "ops.example";
    let args = json!({"order_id": "ct-1", "address": "1 Main St", "items": [{"sku": "sku-1", "quantity": 1}]});
    let body = json!({ "run_id": "rc", "step_id": "ship", "tool": "fulfill", "args": args });
    let (status, said) = proxied(Method::POST, &server.url("/v1/calls"), host, Some(caller), Some(&body)).await;
    assert_eq!(status, 200, "{said}");
    let waiting: Value = serde_json::from_str(&said).expect("json");
    assert_eq!(waiting["status"], "awaiting-approval", "{waiting}");
    let key = waiting["operation_key"].as_str().expect("key").to_string();
    let (status, view) =
        proxied(Method::GET, &server.url(&format!("/v1/approvals/{key}")), host, Some(caller), None).await;
    assert_eq!(status, 200, "{view}");
    let view: Value = serde_json::from_str(&view).expect("json");
    assert_eq!((view["params"]["address"].as_str(), view["params_exact"].as_bool()), (Some("[redacted]"), Some(false)));
    let (status, said) = mcp_initialize(&server.url("/mcp"), host, caller).await;
    assert_eq!(status, 200, "MCP with the callers' token: {said}");
    let (status, said) = proxied(Method::POST, &server.url("/v1/runs/rc/reconcile"), host, Some(caller), None).await;
    assert_eq!(status, 200, "{said}");

    let decision =
        json!({"fingerprint": waiting["fingerprint"], "component": waiting["approval"]["component"], "by": "agent"});
    for (path, body) in [
        (format!("/v1/approvals/{key}/approve"), decision.clone()),
        (format!("/v1/approvals/{key}/reject"), decision.clone()),
        (format!("/v1/operations/{key}/resolve"), json!({"verdict": "committed", "by": "agent"})),
        (format!("/v1/operations/{key}/undone-by-hand"), json!({"by": "agent"})),
        ("/v1/runs/rc/compensate".to_string(), json!({})),
    ] {
        let (status, said) = proxied(Method::POST, &server.url(&path), host, Some(caller), Some(&body)).await;
        assert_eq!(status, 401, "POST {path} with the callers' token: {said}");
    }
    let console = client().get(server.url("/approvals")).header("host", host).bearer_auth(caller).send().await;
    let console = console.expect("console");
    assert!(console.url().path().starts_with("/login") || console.status() == 401, "the console is the operator's");
    let (_, view) = proxied(Method::GET, &server.url(&format!("/v1/approvals/{key}")), host, Some(TOKEN), None).await;
    let view: Value = serde_json::from_str(&view).expect("json");
    assert_eq!(view["state"], "pending", "nothing decided: {view}");
    assert_eq!(provider.counts("ct-1").fulfillments, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn behind_a_public_url_a_stranger_gets_nothing_but_healthz_and_the_operator_everything() {
    use reqwest::Method;
    let provider = Provider::start().await.expect("provider");
    let setup = Setup::new(&provider);
    // As docs/serving.md tells operators to run it behind a proxy: loopback, the proxy's public name.
    let server = setup.serve_with(&["--public-url", "https://ops.example"]);
    let host = "ops.example";
    let body = json!({ "run_id": "rp", "step_id": "charge-p1", "tool": "charge", "args": charge("p1") });

    // A stranger, forwarded by the proxy: refused before anything runs or is read.
    let (status, said) = proxied(Method::POST, &server.url("/v1/calls"), host, None, Some(&body)).await;
    assert_eq!(status, 401, "a stranger's call: {said}");
    assert_eq!(provider.counts("p1").payments, 0, "no charge for a stranger");
    for (method, path) in [
        (Method::POST, "/v1/runs/rp/compensate"),
        (Method::POST, "/v1/runs/rp/reconcile"),
        (Method::GET, "/v1/runs/rp"),
        (Method::GET, "/v1/tools"),
        (Method::GET, "/v1/approvals"),
        (Method::GET, "/metrics"),
        (Method::GET, "/openapi.json"),
    ] {
        let (status, said) = proxied(method.clone(), &server.url(path), host, None, None).await;
        assert_eq!(status, 401, "{method} {path} without the token: {said}");
    }
    // The console sends a stranger to its sign-in form, and shows nothing else.
    let no_redirects = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");
    let page = no_redirects.get(server.url("/approvals")).header("host", host).send().await.expect("page");
    assert_eq!(page.status().as_u16(), 303, "the console's pages need the operator");
    assert!(page.headers()["location"].to_str().is_ok_and(|l| l.starts_with("/login")));
    let (status, initialized) = proxied(Method::POST, &server.url("/mcp"), host, None, Some(&initialize())).await;
    assert_eq!(status, 401, "MCP without the token: {initialized}");
    let (status, health) = proxied(Method::GET, &server.url("/healthz"), host, None, None).await;
    assert_eq!(status, 200, "{health}");
    assert_eq!(serde_json::from_str::<Value>(&health).expect("json"), json!({"status": "ok"}), "its status only");

    // The operator, through the same proxy: the API and MCP under the public name.
    let (status, said) = proxied(Method::POST, &server.url("/v1/calls"), host, Some(TOKEN), Some(&body)).await;
    assert_eq!(status, 200, "{said}");
    assert_eq!(provider.counts("p1").payments, 1);
    let (status, said) = mcp_initialize(&server.url("/mcp"), host, TOKEN).await;
    assert_eq!(status, 200, "MCP under the public name with the token: {said}");
    assert!(said.contains("\"oncebox\""), "the server's info: {said}");

    // One allow-list for every front door: another name, or another site's origin, is refused.
    let (status, _) = proxied(Method::POST, &server.url("/v1/calls"), "evil.example", Some(TOKEN), Some(&body)).await;
    assert_eq!(status, 403, "a name the operator did not give");
    let (status, _) =
        proxied(Method::POST, &server.url("/mcp"), "evil.example", Some(TOKEN), Some(&initialize())).await;
    assert_eq!(status, 403, "MCP answers to the same names");
    let cross = client()
        .post(server.url("/v1/calls"))
        .header("host", host)
        .header("origin", "https://evil.example")
        .bearer_auth(TOKEN)
        .json(&body)
        .send()
        .await
        .expect("post");
    assert_eq!(cross.status().as_u16(), 403, "another site's origin");
    assert_eq!(provider.counts("p1").payments, 1, "still one charge");
}

#[tokio::test(flavor = "multi_thread")]
async fn on_loopback_compensating_needs_the_token_and_reconciling_does_not() {
    let provider = Provider::start().await.expect("provider");
    let setup = Setup::new(&provider);
    let server = setup.serve();
    let body = json!({ "run_id": "rc", "step_id": "charge-c1", "tool": "charge", "args": charge("c1") });
    let (_, charged) = post(&server.url("/v1/calls"), &body).await;
    assert_eq!(charged["status"], "completed", "{charged}");

    // Compensating sends refunds: a decision, which a process on the machine cannot take unasked.
    let (status, refused) = post(&server.url("/v1/runs/rc/compensate"), &json!({})).await;
    assert_eq!(status, 401, "{refused}");
    provider.settled().await;
    assert_eq!(provider.counts("c1").refunds, 0, "no refund without the operator");
    // Reconciling acts only on proof: open on loopback.
    let (status, reconciled) = post(&server.url("/v1/runs/rc/reconcile"), &json!({})).await;
    assert_eq!(status, 200, "{reconciled}");

    let ok = client().post(server.url("/v1/runs/rc/compensate")).bearer_auth(TOKEN).send().await.expect("post");
    assert_eq!(ok.status().as_u16(), 200);
    provider.settled().await;
    assert_eq!(provider.counts("c1").refunds, 1, "one refund, with the operator's token");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_compensatable_tool_whose_compensation_is_missing_is_not_served_until_it_loads() {
    let provider = Provider::start().await.expect("provider");
    let setup = Setup::new(&provider);
    std::fs::remove_file(setup.tools().join("refund.wasm")).expect("remove");
    let server = setup.serve();
    let body = json!({ "run_id": "rm", "step_id": "charge-m1", "tool": "charge", "args": charge("m1") });
    let (status, refused) = post(&server.url("/v1/calls"), &body).await;
    assert_eq!(status, 409, "a charge nothing could refund: {refused}");
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("not served until its compensation loads") && message.contains("refund"), "{refused}");
    assert_eq!(provider.counts("m1").payments, 0, "nothing charged");
    let (_, tools) = get(&server.url("/v1/tools")).await;
    assert!(tools["load_errors"].to_string().contains("refund"), "reported: {tools}");

    std::fs::copy(oncebox_artifacts::REFUND, setup.tools().join("refund.wasm")).expect("add");
    let mut answer = (0, Value::Null);
    for _ in 0..100 {
        answer = post(&server.url("/v1/calls"), &body).await;
        if answer.0 == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(answer.0, 200, "served once its compensation loaded: {}", answer.1);
    assert_eq!(answer.1["status"], "completed", "{}", answer.1);
    assert_eq!(provider.counts("m1").payments, 1);

    // The compensation goes again: a new step is refused, the step taken is answered from its record.
    std::fs::remove_file(setup.tools().join("refund.wasm")).expect("remove");
    for _ in 0..100 {
        let (_, tools) = get(&server.url("/v1/tools")).await;
        if tools["load_errors"].to_string().contains("refund") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let new_step = json!({ "run_id": "rm", "step_id": "charge-m2", "tool": "charge", "args": charge("m2") });
    let refused = post(&server.url("/v1/calls"), &new_step).await;
    assert_eq!(refused.0, 409, "{}", refused.1);
    let (status, replayed) = post(&server.url("/v1/calls"), &body).await;
    assert_eq!(status, 200, "a step on record is answered from it: {replayed}");
    assert_eq!((replayed["status"].as_str(), replayed["replayed"].as_bool()), (Some("completed"), Some(true)));
    assert_eq!(provider.counts("m1").payments + provider.counts("m2").payments, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_caller_cannot_name_a_step_the_way_the_saga_names_a_compensation() {
    let provider = Provider::start().await.expect("provider");
    let setup = Setup::new(&provider);
    let server = setup.serve();
    let body = json!({ "run_id": "rs", "step_id": "1-pay", "tool": "charge", "args": charge("s1") });
    let (_, paid) = post(&server.url("/v1/calls"), &body).await;
    let key = paid["operation_key"].as_str().expect("key").to_string();
    // A charge under the compensation's step would count as the refund of step 1-pay.
    let spoof =
        json!({ "run_id": "rs", "step_id": format!("compensate/{key}"), "tool": "charge", "args": charge("s2") });
    let (status, refused) = post(&server.url("/v1/calls"), &spoof).await;
    assert_eq!(status, 400, "{refused}");
    assert!(refused["error"]["message"].as_str().is_some_and(|m| m.contains("the saga's own")), "{refused}");
    assert_eq!(provider.counts("s2").payments, 0);
    let compensated =
        client().post(server.url("/v1/runs/rs/compensate")).bearer_auth(TOKEN).send().await.expect("post");
    assert_eq!(compensated.status().as_u16(), 200);
    provider.settled().await;
    assert_eq!(provider.counts("s1").refunds, 1, "step 1-pay is refunded, by the saga");
}
