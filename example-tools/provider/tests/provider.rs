//! End-to-end tests: a real provider on loopback, driven over HTTP with reqwest.

use std::time::Duration;

use oncebox_example_provider::{Counts, Fault, FaultKind, Provider, ProviderHandle, Route, Settings};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// A client for the tests. The workspace builds reqwest with rustls and no built-in crypto
/// provider (the host installs ring's), so a client outside the host installs it first.
fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

/// A running provider plus a client pointed at it.
struct Harness {
    provider: ProviderHandle,
    client: reqwest::Client,
}

/// A response read in full: status, the replay header, and the body as text and JSON.
#[derive(Debug)]
struct Reply {
    status: StatusCode,
    headers: reqwest::header::HeaderMap,
    replayed: bool,
    text: String,
    json: Value,
}

impl Harness {
    async fn start() -> Harness {
        let provider = Provider::start().await.expect("provider starts");
        Harness { provider, client: client() }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.provider.base_url())
    }

    /// POSTs `body` to `path`, with an `Idempotency-Key` if given; errors are the
    /// client's (e.g. a connection closed without a response).
    async fn try_post(&self, path: &str, key: Option<&str>, body: &Value) -> reqwest::Result<Reply> {
        let mut request =
            self.client.post(self.url(path)).header("content-type", "application/json").body(body.to_string());
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        read(request.send().await?).await
    }

    async fn post(&self, path: &str, key: Option<&str>, body: &Value) -> Reply {
        self.try_post(path, key, body).await.expect("provider answers")
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Reply {
        read(request.send().await.expect("provider answers")).await.expect("body is readable")
    }

    async fn get(&self, path: &str) -> Reply {
        self.send(self.client.get(self.url(path))).await
    }

    /// GETs `path`; errors are the client's (e.g. a connection closed without a response).
    async fn try_get(&self, path: &str) -> reqwest::Result<Reply> {
        read(self.client.get(self.url(path)).send().await?).await
    }

    /// Arms a fault over HTTP, as a test in another process would.
    async fn arm_over_http(&self, fault: Value) {
        let armed = self.send(self.client.post(self.url("/faults")).body(fault.to_string())).await;
        assert_eq!(armed.status, StatusCode::NO_CONTENT, "{}", armed.text);
    }

    /// Replaces the settings over HTTP and returns those the provider answers with.
    async fn configure_over_http(&self, settings: Value) -> Value {
        let set = self.send(self.client.post(self.url("/settings")).body(settings.to_string())).await;
        assert_eq!(set.status, StatusCode::OK, "{}", set.text);
        set.json
    }

    /// Waits (boundedly) until every accepted request has committed.
    async fn settled(&self) {
        let settled = tokio::time::timeout(Duration::from_secs(10), self.provider.settled()).await;
        assert!(settled.is_ok(), "the provider settles");
    }

    /// Polls until `ready` holds (bounded); for states with no notification of their own.
    async fn wait_until(&self, ready: impl Fn(&ProviderHandle) -> bool) {
        for _ in 0..500 {
            if ready(&self.provider) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("condition not reached within 5 s");
    }
}

async fn read(response: reqwest::Response) -> reqwest::Result<Reply> {
    let status = response.status();
    let headers = response.headers().clone();
    let replayed = response.headers().get("idempotent-replayed").is_some_and(|value| value == "true");
    let text = response.text().await?;
    let json = serde_json::from_str(&text).unwrap_or(Value::Null);
    Ok(Reply { status, headers, replayed, text, json })
}

fn payment(order_id: &str, amount_cents: u64) -> Value {
    json!({
        "order_id": order_id,
        "amount_cents": amount_cents,
        "currency": "eur",
        "payment_method": "pm_card_visa",
    })
}

fn payments(n: u64) -> Counts {
    Counts { payments: n, ..Counts::default() }
}

#[tokio::test]
async fn first_payment_succeeds_and_counts_one() {
    let h = Harness::start().await;
    let reply = h.post("/payments", Some("k1"), &payment("o-1", 1250)).await;

    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert!(!reply.replayed);
    assert_eq!(reply.json["id"], "pay_1");
    assert_eq!(reply.json["order_id"], "o-1");
    assert_eq!(reply.json["amount_cents"], 1250);
    assert_eq!(reply.json["currency"], "eur");
    assert_eq!(reply.json["status"], "succeeded");
    assert_eq!(h.provider.counts("o-1"), payments(1));
    assert_eq!(h.provider.counts("o-2"), Counts::default());
    assert_eq!(h.provider.requests(), 1);

    // The same count over HTTP, per order and in total.
    let counts = h.get("/counts/o-1").await;
    assert_eq!(counts.json, json!({"payments": 1, "refunds": 0, "fulfillments": 0}));
    assert_eq!(h.get("/counts").await.json["payments"], 1);
}

#[tokio::test]
async fn replayed_key_returns_the_first_response_without_a_new_effect() {
    let h = Harness::start().await;
    let first = h.post("/payments", Some("k1"), &payment("o-1", 500)).await;
    // Same request with its fields in another order: canonical JSON is equal.
    let reordered = json!({
        "payment_method": "pm_card_visa",
        "currency": "eur",
        "amount_cents": 500,
        "order_id": "o-1",
    });
    let second = h.post("/payments", Some("k1"), &reordered).await;

    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(second.status, StatusCode::OK);
    assert!(second.replayed, "a replay carries Idempotent-Replayed: true");
    assert_eq!(second.text, first.text, "the stored body is replayed byte for byte");
    assert_eq!(h.provider.counts("o-1"), payments(1));
    assert_eq!(h.provider.requests(), 2);
}

#[tokio::test]
async fn reused_key_with_another_body_or_route_is_refused() {
    let h = Harness::start().await;
    h.post("/payments", Some("k1"), &payment("o-1", 500)).await;

    let other_body = h.post("/payments", Some("k1"), &payment("o-1", 501)).await;
    assert_eq!(other_body.status, StatusCode::BAD_REQUEST);
    assert_eq!(other_body.json["error"], "idempotency_key_reused");

    let refund = json!({"order_id": "o-1", "amount_cents": 500});
    let other_route = h.post("/refunds", Some("k1"), &refund).await;
    assert_eq!(other_route.status, StatusCode::BAD_REQUEST);
    assert_eq!(other_route.json["error"], "idempotency_key_reused");

    assert_eq!(h.provider.counts("o-1"), payments(1));
}

#[tokio::test]
async fn requests_without_a_key_are_each_a_new_effect() {
    let h = Harness::start().await;
    let first = h.post("/payments", None, &payment("o-1", 500)).await;
    let second = h.post("/payments", None, &payment("o-1", 500)).await;

    assert_eq!(first.json["id"], "pay_1");
    assert_eq!(second.json["id"], "pay_2");
    assert!(!second.replayed);
    assert_eq!(h.provider.counts("o-1"), payments(2));
}

#[tokio::test]
async fn lost_response_is_committed_and_a_retry_gets_the_stored_answer() {
    let h = Harness::start().await;
    h.provider.arm(Fault::new(Route::Payments, FaultKind::LoseResponse));

    let lost = h.try_post("/payments", Some("k1"), &payment("o-1", 700)).await;
    let err = lost.expect_err("the connection closes without a response");
    assert!(!err.is_timeout(), "closed, not timed out: {err}");
    assert_eq!(h.provider.counts("o-1"), payments(1));
    // Exactly one request arrived: the client did not silently resend it.
    assert_eq!(h.provider.requests(), 1);

    let retry = h.post("/payments", Some("k1"), &payment("o-1", 700)).await;
    assert_eq!(retry.status, StatusCode::OK);
    assert!(retry.replayed);
    assert_eq!(retry.json["id"], "pay_1");
    assert_eq!(h.provider.counts("o-1"), payments(1));
}

#[tokio::test]
async fn rate_limit_commits_nothing_and_the_same_key_then_succeeds() {
    let h = Harness::start().await;
    h.provider.arm(Fault::new(Route::Payments, FaultKind::RateLimit { retry_after_ms: 1500 }));

    let response = h
        .client
        .post(h.url("/payments"))
        .header("idempotency-key", "k1")
        .body(payment("o-1", 300).to_string())
        .send()
        .await
        .expect("provider answers");
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let header = |name: &str| response.headers().get(name).and_then(|value| value.to_str().ok()).map(str::to_owned);
    assert_eq!(header("retry-after").as_deref(), Some("2"), "rounded up");
    assert_eq!(header("retry-after-ms").as_deref(), Some("1500"));
    assert_eq!(h.provider.counts("o-1"), Counts::default());

    let retry = h.post("/payments", Some("k1"), &payment("o-1", 300)).await;
    assert_eq!(retry.status, StatusCode::OK);
    assert!(!retry.replayed, "the key was not stored, so this is fresh");
    assert_eq!(h.provider.counts("o-1"), payments(1));
}

#[tokio::test]
async fn error_before_commit_commits_nothing() {
    let h = Harness::start().await;
    h.provider.arm(Fault::new(Route::Refunds, FaultKind::ErrorBeforeCommit));
    let refund = json!({"order_id": "o-1", "amount_cents": 300});

    let failed = h.post("/refunds", Some("r1"), &refund).await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(h.provider.counts("o-1"), Counts::default());
    assert_eq!(h.get("/refunds/by-key/r1").await.status, StatusCode::NOT_FOUND);

    let retry = h.post("/refunds", Some("r1"), &refund).await;
    assert_eq!(retry.status, StatusCode::OK);
    assert_eq!(retry.json["id"], "re_1");
    assert_eq!(h.provider.counts("o-1").refunds, 1);
}

#[tokio::test]
async fn same_key_while_the_first_request_is_delayed_gets_409() {
    let h = Harness::start().await;
    h.provider.arm(Fault::new(Route::Payments, FaultKind::Delay { delay_ms: 1500 }));

    let client = h.client.clone();
    let url = h.url("/payments");
    let body = payment("o-1", 900).to_string();
    let first = tokio::spawn(async move { client.post(url).header("idempotency-key", "k1").body(body).send().await });
    // The effect is committed before the delay starts, so once it is counted the
    // first request is certainly in flight.
    for _ in 0..500 {
        if h.provider.counts("o-1").payments == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(h.provider.counts("o-1"), payments(1));

    let concurrent = h.post("/payments", Some("k1"), &payment("o-1", 900)).await;
    assert_eq!(concurrent.status, StatusCode::CONFLICT);
    assert_eq!(concurrent.json["error"], "idempotency_key_in_use");

    let first = first.await.expect("task completes").expect("delayed response arrives");
    assert_eq!(first.status(), StatusCode::OK);
    let after = h.post("/payments", Some("k1"), &payment("o-1", 900)).await;
    assert!(after.replayed);
    assert_eq!(h.provider.counts("o-1"), payments(1));
}

#[tokio::test]
async fn lookup_by_key_finds_committed_responses_only() {
    let h = Harness::start().await;
    let fulfillment = json!({
        "order_id": "o-1",
        "address": "1 Main St",
        "items": [{"sku": "widget", "quantity": 2}],
    });
    let shipped = h.post("/fulfillments", Some("f1"), &fulfillment).await;
    assert_eq!(shipped.json["status"], "shipped");

    let found = h.get("/fulfillments/by-key/f1").await;
    assert_eq!(found.status, StatusCode::OK);
    assert_eq!(found.text, shipped.text);

    let unknown = h.get("/fulfillments/by-key/nope").await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(unknown.json["error"], "not_found");
    // A key is looked up under the route it was used on.
    assert_eq!(h.get("/payments/by-key/f1").await.status, StatusCode::NOT_FOUND);
    assert_eq!(h.provider.counts("o-1").fulfillments, 1);
}

#[tokio::test]
async fn bad_requests_get_400_naming_the_problem_and_commit_nothing() {
    let h = Harness::start().await;
    let malformed =
        h.send(h.client.post(h.url("/payments")).header("idempotency-key", "k1").body("{\"order_id\": ")).await;
    assert_eq!(malformed.status, StatusCode::BAD_REQUEST);
    assert_eq!(malformed.json["error"], "invalid_json");

    let missing = json!({"order_id": "o-1", "currency": "eur", "payment_method": "pm"});
    let missing = h.post("/payments", Some("k1"), &missing).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(missing.json["error"], "invalid_request");
    let message = missing.json["message"].as_str().unwrap_or_default();
    assert!(message.contains("amount_cents"), "{message}");

    // Neither stored the key: a valid request with it is processed fresh.
    let valid = h.post("/payments", Some("k1"), &payment("o-1", 100)).await;
    assert_eq!(valid.status, StatusCode::OK);
    assert!(!valid.replayed);
    assert_eq!(h.provider.totals(), payments(1));
}

#[tokio::test]
async fn declined_card_is_stored_and_replayed_but_not_counted() {
    let h = Harness::start().await;
    let mut declined = payment("o-1", 100);
    declined["payment_method"] = json!("card_declined");

    let first = h.post("/payments", Some("k1"), &declined).await;
    assert_eq!(first.status, StatusCode::PAYMENT_REQUIRED);
    assert_eq!(first.json["error"], "card_declined");
    let replay = h.post("/payments", Some("k1"), &declined).await;
    assert_eq!(replay.status, StatusCode::PAYMENT_REQUIRED);
    assert!(replay.replayed);
    assert_eq!(h.provider.counts("o-1"), Counts::default());
}

#[tokio::test]
async fn replays_do_not_consume_faults() {
    let h = Harness::start().await;
    h.post("/payments", Some("k1"), &payment("o-1", 100)).await;
    h.provider.arm(Fault::new(Route::Payments, FaultKind::ErrorBeforeCommit));

    let replay = h.post("/payments", Some("k1"), &payment("o-1", 100)).await;
    assert_eq!(replay.status, StatusCode::OK);
    assert!(replay.replayed);
    // The fault is still armed for the next fresh request.
    let fresh = h.post("/payments", None, &payment("o-1", 100)).await;
    assert_eq!(fresh.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(h.provider.counts("o-1"), payments(1));
}

#[tokio::test]
async fn faults_match_order_and_are_spent_after_times() {
    let h = Harness::start().await;
    h.provider.arm(Fault::new(Route::Payments, FaultKind::ErrorBeforeCommit).for_order("o-2").times(2));

    assert_eq!(h.post("/payments", None, &payment("o-1", 1)).await.status, StatusCode::OK);
    for _ in 0..2 {
        let failed = h.post("/payments", None, &payment("o-2", 1)).await;
        assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    }
    assert_eq!(h.post("/payments", None, &payment("o-2", 1)).await.status, StatusCode::OK);
    assert_eq!(h.provider.totals(), payments(2));
}

#[tokio::test]
async fn faults_can_be_armed_and_cleared_over_http() {
    let h = Harness::start().await;
    let fault = json!({"route": "refunds", "kind": "error-before-commit", "times": 5});
    let armed = h.send(h.client.post(h.url("/faults")).body(fault.to_string())).await;
    assert_eq!(armed.status, StatusCode::NO_CONTENT);

    let refund = json!({"order_id": "o-1", "amount_cents": 1});
    assert_eq!(h.post("/refunds", None, &refund).await.status, StatusCode::INTERNAL_SERVER_ERROR);
    let cleared = h.send(h.client.delete(h.url("/faults"))).await;
    assert_eq!(cleared.status, StatusCode::NO_CONTENT);
    assert_eq!(h.post("/refunds", None, &refund).await.status, StatusCode::OK);

    let bad = json!({"route": "nowhere", "kind": "lose-response"});
    let rejected = h.send(h.client.post(h.url("/faults")).body(bad.to_string())).await;
    assert_eq!(rejected.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn inventory_reads_and_sets_stock() {
    let h = Harness::start().await;
    let unknown = h.get("/inventory/widget").await;
    assert_eq!(unknown.json, json!({"sku": "widget", "available": 0}));

    h.provider.set_stock("widget", 7);
    assert_eq!(h.get("/inventory/widget").await.json["available"], 7);

    let set = h.send(h.client.post(h.url("/inventory/gadget")).body(json!({"available": 3}).to_string())).await;
    assert_eq!(set.status, StatusCode::OK);
    assert_eq!(h.provider.stock("gadget"), 3);
    // An admin route is not an effect request, nor a read.
    assert_eq!(h.provider.requests(), 0);
    assert_eq!(h.provider.reads(), 2);
}

fn header(reply: &Reply, name: &str) -> Option<String> {
    reply.headers.get(name).and_then(|value| value.to_str().ok()).map(str::to_owned)
}

#[tokio::test]
async fn inventory_lost_response_closes_the_connection_until_spent() {
    let h = Harness::start().await;
    h.provider.set_stock("widget", 4);
    h.provider.arm(Fault::new(Route::Inventory, FaultKind::LoseResponse).for_sku("widget").times(2));

    // Another SKU is not affected and does not use up the fault.
    assert_eq!(h.get("/inventory/gadget").await.status, StatusCode::OK);
    for _ in 0..2 {
        let lost = h.try_get("/inventory/widget").await;
        let err = lost.expect_err("the connection closes without a response");
        assert!(!err.is_timeout(), "closed, not timed out: {err}");
    }
    let read = h.get("/inventory/widget").await;
    assert_eq!(read.status, StatusCode::OK);
    assert_eq!(read.json, json!({"sku": "widget", "available": 4}));

    // Every read arrived exactly once (the client did not resend a lost one), and
    // none of them is an effect.
    assert_eq!(h.provider.reads(), 4);
    assert_eq!(h.provider.requests(), 0);
    assert_eq!(h.provider.totals(), Counts::default());
    assert_eq!(h.provider.stock("widget"), 4);
}

#[tokio::test]
async fn inventory_delay_waits_then_answers_with_the_stock_at_that_time() {
    let h = Harness::start().await;
    h.provider.set_stock("widget", 1);
    h.provider.arm(Fault::new(Route::Inventory, FaultKind::Delay { delay_ms: 1000 }));
    // Armed behind the delay: it only applies once the delay is spent.
    h.provider.arm(Fault::new(Route::Inventory, FaultKind::ErrorBeforeCommit));

    let client = h.client.clone();
    let url = h.url("/inventory/widget");
    let delayed = tokio::spawn(async move { client.get(url).send().await });
    // A read is counted on arrival, before the delay: then change the stock.
    for _ in 0..500 {
        if h.provider.reads() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(h.provider.reads(), 1);
    h.provider.set_stock("widget", 9);

    let delayed = delayed.await.expect("task completes").expect("delayed response arrives");
    let delayed = read(delayed).await.expect("body is readable");
    assert_eq!(delayed.status, StatusCode::OK);
    assert_eq!(delayed.json, json!({"sku": "widget", "available": 9}), "read after the wait");

    // The delay was used once: the next read meets the fault armed behind it.
    assert_eq!(h.get("/inventory/widget").await.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(h.get("/inventory/widget").await.status, StatusCode::OK);
    assert_eq!(h.provider.reads(), 3);
}

#[tokio::test]
async fn inventory_rate_limit_armed_over_http_answers_429_until_spent() {
    let h = Harness::start().await;
    h.provider.set_stock("widget", 2);
    let fault =
        json!({"route": "inventory", "sku": "widget", "kind": "rate-limit", "retry_after_ms": 1500, "times": 2});
    let armed = h.send(h.client.post(h.url("/faults")).body(fault.to_string())).await;
    assert_eq!(armed.status, StatusCode::NO_CONTENT, "{}", armed.text);

    for _ in 0..2 {
        let limited = h.get("/inventory/widget").await;
        assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(limited.json["error"], "rate_limited");
        assert_eq!(header(&limited, "retry-after").as_deref(), Some("2"), "rounded up");
        assert_eq!(header(&limited, "retry-after-ms").as_deref(), Some("1500"));
    }
    let read = h.get("/inventory/widget").await;
    assert_eq!(read.status, StatusCode::OK);
    assert_eq!(read.json["available"], 2);
    assert_eq!(h.provider.reads(), 3);
}

#[tokio::test]
async fn inventory_error_answers_500_for_the_matching_sku_once() {
    let h = Harness::start().await;
    // For inventory faults `order_id` names the SKU.
    h.provider.arm(Fault::new(Route::Inventory, FaultKind::ErrorBeforeCommit).for_order("widget"));

    assert_eq!(h.get("/inventory/gadget").await.status, StatusCode::OK);
    let failed = h.get("/inventory/widget").await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(failed.json["error"], "internal_error");
    assert_eq!(h.get("/inventory/widget").await.status, StatusCode::OK);
    assert_eq!(h.provider.reads(), 3);
}

#[tokio::test]
async fn inventory_and_effect_faults_do_not_cross() {
    let h = Harness::start().await;
    h.provider.arm(Fault::new(Route::Payments, FaultKind::ErrorBeforeCommit));
    assert_eq!(h.get("/inventory/widget").await.status, StatusCode::OK);
    h.provider.clear_faults();

    h.provider.arm(Fault::new(Route::Inventory, FaultKind::ErrorBeforeCommit));
    assert_eq!(h.post("/payments", None, &payment("o-1", 1)).await.status, StatusCode::OK);
    // Setting stock is an admin route, never faulted, and not a read.
    let set = h.send(h.client.post(h.url("/inventory/widget")).body(json!({"available": 3}).to_string())).await;
    assert_eq!(set.status, StatusCode::OK);
    assert_eq!(h.get("/inventory/widget").await.status, StatusCode::INTERNAL_SERVER_ERROR);

    // `inventory` is still not an effect route.
    assert_eq!(h.post("/inventory", None, &json!({})).await.status, StatusCode::NOT_FOUND);
    assert_eq!(h.get("/inventory/by-key/k1").await.status, StatusCode::NOT_FOUND);

    // A malformed read is still a read received.
    assert_eq!(h.get("/inventory/bad%zz").await.status, StatusCode::BAD_REQUEST);
    assert_eq!(h.provider.reads(), 3);
    assert_eq!(h.provider.requests(), 1);
    assert_eq!(h.provider.totals(), payments(1));
}

#[tokio::test]
async fn oversize_bodies_unknown_routes_and_wrong_methods_are_refused() {
    let h = Harness::start().await;
    // Both a body just over the limit and a much larger one (which the server
    // refuses from its Content-Length alone) get a readable 413.
    for size in [1024 * 1024 + 1, 8 * 1024 * 1024] {
        let huge = "x".repeat(size);
        let too_large = h.send(h.client.post(h.url("/payments")).body(huge)).await;
        assert_eq!(too_large.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(too_large.json["error"], "payload_too_large");
    }

    assert_eq!(h.get("/nowhere").await.status, StatusCode::NOT_FOUND);
    let wrong_method = h.get("/payments").await;
    assert_eq!(wrong_method.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(h.provider.totals(), Counts::default());
}

#[tokio::test]
async fn shutdown_releases_the_port() {
    let h = Harness::start().await;
    let url = h.url("/counts");
    assert_eq!(h.get("/counts").await.status, StatusCode::OK);

    h.provider.clone().shutdown().await;
    let after = client().get(url).send().await;
    assert!(after.is_err(), "nothing listens after shutdown");
}

#[tokio::test]
async fn binary_prints_its_address_and_serves() {
    use std::io::BufRead;
    use std::process::{Command, Stdio};

    let mut child = Command::new(env!("CARGO_BIN_EXE_oncebox-example-provider"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("binary starts");
    let mut line = String::new();
    if let Some(stdout) = child.stdout.take() {
        std::io::BufReader::new(stdout).read_line(&mut line).expect("address line is readable");
    }
    let answer = client().get(format!("{}/counts", line.trim())).send().await;
    // Stop the child before asserting, so a failure does not leave it running.
    child.kill().expect("child can be killed");
    child.wait().expect("child is reaped");

    assert!(line.starts_with("http://127.0.0.1:"), "{line:?}");
    let status = answer.map(|response| response.status());
    assert_eq!(status.ok(), Some(StatusCode::OK));
}

#[tokio::test]
async fn commit_then_error_answers_502_but_committed_and_a_resend_is_replayed() {
    let h = Harness::start().await;
    h.provider.arm(Fault::new(Route::Payments, FaultKind::CommitThenError { status: 502 }));

    let failed = h.post("/payments", Some("k1"), &payment("o-1", 800)).await;
    assert_eq!(failed.status, StatusCode::BAD_GATEWAY);
    assert_eq!(failed.json["error"], "bad_gateway");
    assert!(failed.json.get("id").is_none(), "the gateway's answer is not the committed one");
    assert_eq!(h.provider.counts("o-1"), payments(1), "committed despite the error");
    assert_eq!(h.get("/payments/by-key/k1").await.json["id"], "pay_1");

    let resend = h.post("/payments", Some("k1"), &payment("o-1", 800)).await;
    assert_eq!(resend.status, StatusCode::OK);
    assert!(resend.replayed);
    assert_eq!(resend.json["id"], "pay_1");
    assert_eq!(h.provider.counts("o-1"), payments(1));
}

#[tokio::test]
async fn commit_then_error_armed_over_http_commits_twice_when_keys_are_ignored() {
    let h = Harness::start().await;
    let settings = h.configure_over_http(json!({"honour_keys": false})).await;
    assert_eq!(settings["honour_keys"], false);
    assert_eq!(settings["lookup_by_key"], true, "omitted settings take their defaults");
    assert_eq!(h.provider.settings(), Settings { honour_keys: false, ..Settings::default() });
    h.arm_over_http(json!({"route": "payments", "order_id": "o-1", "kind": "commit-then-error", "status": 504})).await;

    let failed = h.post("/payments", Some("k1"), &payment("o-1", 800)).await;
    assert_eq!(failed.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(failed.json["error"], "gateway_timeout");
    assert_eq!(h.provider.counts("o-1"), payments(1));

    // Nothing deduplicates: the resend is a second payment.
    let resend = h.post("/payments", Some("k1"), &payment("o-1", 800)).await;
    assert_eq!(resend.status, StatusCode::OK);
    assert!(!resend.replayed);
    assert_eq!(resend.json["id"], "pay_2");
    assert_eq!(h.provider.counts("o-1"), payments(2));
    // Lookup by the key still works, and finds the latest commit.
    assert_eq!(h.get("/payments/by-key/k1").await.json["id"], "pay_2");

    // The status defaults to 502, and a status that is no error is refused.
    h.arm_over_http(json!({"route": "refunds", "kind": "commit-then-error"})).await;
    let refund = h.post("/refunds", None, &json!({"order_id": "o-1", "amount_cents": 1})).await;
    assert_eq!(refund.status, StatusCode::BAD_GATEWAY);
    assert_eq!(h.provider.counts("o-1").refunds, 1);
    let not_an_error = json!({"route": "refunds", "kind": "commit-then-error", "status": 200});
    let rejected = h.send(h.client.post(h.url("/faults")).body(not_an_error.to_string())).await;
    assert_eq!(rejected.status, StatusCode::BAD_REQUEST);
    assert!(rejected.json["message"].as_str().unwrap_or_default().contains("status"), "{}", rejected.text);
}

#[tokio::test]
async fn commit_after_delay_commits_after_the_client_gave_up() {
    let h = Harness::start().await;
    h.provider.arm(Fault::new(Route::Payments, FaultKind::CommitAfterDelay { delay_ms: 1500 }));

    let gave_up = h
        .client
        .post(h.url("/payments"))
        .header("idempotency-key", "k1")
        .body(payment("o-1", 900).to_string())
        .timeout(Duration::from_millis(200))
        .send()
        .await;
    let err = gave_up.expect_err("the client times out before the provider answers");
    assert!(err.is_timeout(), "{err}");

    // Accepted, not committed: the honest answers are "in use" and "not found yet".
    assert_eq!(h.provider.in_flight(), 1);
    assert_eq!(h.provider.counts("o-1"), Counts::default());
    let lookup = h.get("/payments/by-key/k1").await;
    assert_eq!(lookup.status, StatusCode::NOT_FOUND);
    let resend = h.post("/payments", Some("k1"), &payment("o-1", 900)).await;
    assert_eq!(resend.status, StatusCode::CONFLICT);
    assert_eq!(resend.json["error"], "idempotency_key_in_use");

    // With nobody listening any more, the commit still lands.
    h.settled().await;
    assert_eq!(h.provider.in_flight(), 0);
    assert_eq!(h.provider.counts("o-1"), payments(1));
    let lookup = h.get("/payments/by-key/k1").await;
    assert_eq!(lookup.status, StatusCode::OK);
    assert_eq!(lookup.json["id"], "pay_1");
    let resend = h.post("/payments", Some("k1"), &payment("o-1", 900)).await;
    assert!(resend.replayed);
    assert_eq!(resend.json["id"], "pay_1");
    assert_eq!(h.provider.counts("o-1"), payments(1));
}

#[tokio::test]
async fn commit_after_delay_armed_over_http_answers_a_client_that_waits() {
    let h = Harness::start().await;
    h.arm_over_http(json!({"route": "refunds", "kind": "commit-after-delay", "delay_ms": 500})).await;
    let refund = json!({"order_id": "o-1", "amount_cents": 300});

    let client = h.client.clone();
    let url = h.url("/refunds");
    let body = refund.to_string();
    let first = tokio::spawn(async move { client.post(url).header("idempotency-key", "r1").body(body).send().await });
    h.wait_until(|provider| provider.in_flight() == 1).await;
    assert_eq!(h.post("/refunds", Some("r1"), &refund).await.status, StatusCode::CONFLICT);
    assert_eq!(h.get("/refunds/by-key/r1").await.status, StatusCode::NOT_FOUND);
    assert_eq!(h.provider.counts("o-1"), Counts::default());

    let first = first.await.expect("task completes").expect("the delayed answer arrives");
    let first = read(first).await.expect("body is readable");
    assert_eq!(first.status, StatusCode::OK);
    assert!(!first.replayed);
    assert_eq!(first.json["id"], "re_1");
    assert_eq!(h.provider.in_flight(), 0, "committed before answering");
    assert_eq!(h.provider.counts("o-1").refunds, 1);
}

#[tokio::test]
async fn a_delayed_commit_lands_even_when_the_server_stops() {
    let h = Harness::start().await;
    h.provider.arm(Fault::new(Route::Payments, FaultKind::CommitAfterDelay { delay_ms: 500 }));
    let gave_up = h
        .client
        .post(h.url("/payments"))
        .body(payment("o-1", 900).to_string())
        .timeout(Duration::from_millis(100))
        .send()
        .await;
    assert!(gave_up.is_err());
    assert_eq!(h.provider.in_flight(), 1);

    h.provider.clone().shutdown().await;
    h.settled().await;
    assert_eq!(h.provider.counts("o-1"), payments(1));
}

#[tokio::test]
async fn a_lagging_lookup_answers_404_until_the_lag_has_passed() {
    let h = Harness::start().await;
    h.provider.configure(Settings { lookup_lag_ms: 300, ..Settings::default() });

    let paid = h.post("/payments", Some("k1"), &payment("o-1", 100)).await;
    assert_eq!(paid.status, StatusCode::OK);
    assert_eq!(h.get("/payments/by-key/k1").await.status, StatusCode::NOT_FOUND, "the index lags");
    // Deduplication does not lag.
    assert!(h.post("/payments", Some("k1"), &payment("o-1", 100)).await.replayed);

    tokio::time::sleep(Duration::from_millis(450)).await;
    let found = h.get("/payments/by-key/k1").await;
    assert_eq!(found.status, StatusCode::OK);
    assert_eq!(found.text, paid.text);
    assert_eq!(h.provider.counts("o-1"), payments(1));
}

#[tokio::test]
async fn a_key_past_its_retention_is_forgotten() {
    let h = Harness::start().await;
    h.configure_over_http(json!({"key_retention_ms": 300})).await;
    assert_eq!(h.provider.settings().key_retention_ms, Some(300));

    let first = h.post("/payments", Some("k1"), &payment("o-1", 100)).await;
    assert_eq!(first.json["id"], "pay_1");
    assert!(h.post("/payments", Some("k1"), &payment("o-1", 100)).await.replayed, "still retained");

    tokio::time::sleep(Duration::from_millis(450)).await;
    assert_eq!(h.get("/payments/by-key/k1").await.status, StatusCode::NOT_FOUND);
    let resend = h.post("/payments", Some("k1"), &payment("o-1", 100)).await;
    assert_eq!(resend.status, StatusCode::OK);
    assert!(!resend.replayed, "a forgotten key is processed fresh");
    assert_eq!(resend.json["id"], "pay_2");
    assert_eq!(h.provider.counts("o-1"), payments(2));
}

#[tokio::test]
async fn without_key_support_every_resend_commits_and_nothing_is_found() {
    let h = Harness::start().await;
    h.provider.configure(Settings { honour_keys: false, lookup_by_key: false, ..Settings::default() });

    let first = h.post("/payments", Some("k1"), &payment("o-1", 100)).await;
    let second = h.post("/payments", Some("k1"), &payment("o-1", 100)).await;
    assert_eq!(first.json["id"], "pay_1");
    assert_eq!(second.json["id"], "pay_2");
    assert!(!second.replayed);
    // Not even a different body with the same key is refused.
    assert_eq!(h.post("/payments", Some("k1"), &payment("o-1", 999)).await.status, StatusCode::OK);
    assert_eq!(h.provider.counts("o-1"), payments(3));
    assert_eq!(h.get("/payments/by-key/k1").await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn settings_round_trip_over_http() {
    let h = Harness::start().await;
    let defaults = json!({"honour_keys": true, "lookup_by_key": true, "key_retention_ms": null, "lookup_lag_ms": 0});
    assert_eq!(h.get("/settings").await.json, defaults);

    // Dedup without a lookup endpoint: replays work, lookups find nothing.
    let chosen = json!({"honour_keys": true, "lookup_by_key": false, "key_retention_ms": 60000, "lookup_lag_ms": 5});
    assert_eq!(h.configure_over_http(chosen.clone()).await, chosen);
    assert_eq!(h.get("/settings").await.json, chosen);
    h.post("/payments", Some("k1"), &payment("o-1", 100)).await;
    assert!(h.post("/payments", Some("k1"), &payment("o-1", 100)).await.replayed);
    assert_eq!(h.get("/payments/by-key/k1").await.status, StatusCode::NOT_FOUND);
    assert_eq!(h.provider.counts("o-1"), payments(1));

    // Settings made in Rust are what HTTP reports, and `{}` restores the defaults.
    h.provider.configure(Settings { lookup_lag_ms: 7, ..Settings::default() });
    assert_eq!(h.get("/settings").await.json["lookup_lag_ms"], 7);
    assert_eq!(h.configure_over_http(json!({})).await, defaults);
    assert_eq!(h.provider.settings(), Settings::default());

    let typo = h.send(h.client.post(h.url("/settings")).body(json!({"honor_keys": false}).to_string())).await;
    assert_eq!(typo.status, StatusCode::BAD_REQUEST);
    assert_eq!(h.provider.settings(), Settings::default(), "a refused request changes nothing");
    assert_eq!(h.send(h.client.delete(h.url("/settings"))).await.status, StatusCode::METHOD_NOT_ALLOWED);
}
