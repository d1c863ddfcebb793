//! The server's edges, as an attacker and a careful operator meet them: a proxy in front of a
//! server started without `--public-url`, `Host` and `Origin` headers that are missing, doubled or
//! not ASCII, ids that would forge log lines, bodies past `--max-body` on every route, a lost
//! decision race. Effects are counted at the example provider; nothing here trusts an answer alone.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

use super::support::{Server, Setup, TOKEN, client};
use crate::support::charge;

/// A reverse proxy as an operator's nginx or Caddy is set up in front of a loopback server: it
/// writes the upstream's own address into `Host` and says who the client was in `X-Forwarded-For`,
/// `X-Real-IP` and `X-Forwarded-Proto`. Returns its base URL.
async fn forwarding_proxy(upstream: String) -> String {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (http, upstream) = (http.clone(), upstream.clone());
            tokio::spawn(async move {
                let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                    let (http, upstream) = (http.clone(), upstream.clone());
                    async move {
                        let (parts, body) = request.into_parts();
                        let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
                        let mut forwarded = http.request(parts.method.clone(), format!("{upstream}{path}"));
                        for (name, value) in &parts.headers {
                            if name != hyper::header::HOST {
                                forwarded = forwarded.header(name, value);
                            }
                        }
                        let answer = forwarded
                            .header("x-forwarded-for", "203.0.113.7")
                            .header("x-real-ip", "203.0.113.7")
                            .header("x-forwarded-proto", "https")
                            .body(body)
                            .send()
                            .await
                            .expect("the upstream answers");
                        let mut response = hyper::Response::builder().status(answer.status());
                        for (name, value) in answer.headers() {
                            response = response.header(name, value);
                        }
                        let bytes = answer.bytes().await.unwrap_or_default();
                        Ok::<_, std::convert::Infallible>(response.body(Full::new(bytes)).expect("response"))
                    }
                });
                let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    format!("http://{addr}")
}

fn call_body(run: &str, step: &str, order: &str) -> Value {
    json!({ "run_id": run, "step_id": step, "tool": "charge", "args": charge(order) })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_a_proxy_forwarded_to_a_loopback_server_needs_the_token() {
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let setup = Setup::new(&provider);
    let server = setup.serve();
    let proxy = forwarding_proxy(server.base_url.clone()).await;
    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");
    let order = "o-proxied";

    // A stranger through the proxy: every route but /healthz wants the token, and says how to
    // start the server behind a proxy.
    let charged = http.post(format!("{proxy}/v1/calls")).json(&call_body("r-proxy", "charge", order)).send().await;
    let charged = charged.expect("post");
    assert_eq!(charged.status(), 401);
    let refusal: Value = charged.json().await.expect("json");
    let message = refusal["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("--public-url") && message.contains("x-forwarded-for"), "{refusal}");
    for path in ["/v1/runs/r-proxy", "/v1/tools", "/metrics", "/v1/approvals", "/openapi.json"] {
        let response = http.get(format!("{proxy}{path}")).send().await.expect("get");
        assert_eq!(response.status(), 401, "{path}");
    }
    let mcp = http
        .post(format!("{proxy}/mcp"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(initialize().to_string())
        .send()
        .await
        .expect("mcp");
    assert_eq!(mcp.status(), 401, "MCP through the proxy");
    let console = http.get(format!("{proxy}/")).send().await.expect("console");
    assert_eq!(console.status(), 303, "the console sends a stranger to sign in");
    assert!(console.headers()["location"].to_str().unwrap_or_default().starts_with("/login"));
    let health: Value = http.get(format!("{proxy}/healthz")).send().await.expect("healthz").json().await.expect("json");
    assert_eq!(health, json!({ "status": "ok" }), "/healthz tells a stranger only that it serves");
    assert_eq!(provider.counts(order).payments, 0, "nothing was charged for the stranger");

    // The operator through the proxy, with the token: served, once.
    let with_token = http
        .post(format!("{proxy}/v1/calls"))
        .bearer_auth(TOKEN)
        .json(&call_body("r-proxy", "charge", order))
        .send()
        .await
        .expect("post");
    assert_eq!(with_token.status(), 200);
    // A process on the server's own machine, not through the proxy: served without the token.
    let direct = client().post(server.url("/v1/calls")).json(&call_body("r-proxy", "charge", order)).send().await;
    let direct: Value = direct.expect("post").json().await.expect("json");
    assert_eq!(direct["replayed"], true, "{direct}");
    assert_eq!(provider.counts(order).payments, 1);
}

/// Sends `request` as raw bytes and returns the status line's code and the whole answer.
fn raw(server: &Server, request: &[u8]) -> (u16, String) {
    let addr = server.base_url.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    stream.write_all(request).expect("write");
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer).to_string();
    let code = answer.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, answer)
}

#[tokio::test(flavor = "multi_thread")]
async fn host_and_origin_are_required_once_and_as_ascii_or_the_request_is_refused() {
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let setup = Setup::new(&provider);
    let server = setup.serve();
    let host = server.base_url.trim_start_matches("http://").to_string();
    let own = format!("http://{host}");
    let request = |headers: &[Vec<u8>]| {
        let mut bytes = b"GET /v1/tools HTTP/1.1\r\nconnection: close\r\n".to_vec();
        for header in headers {
            bytes.extend_from_slice(header);
            bytes.extend_from_slice(b"\r\n");
        }
        bytes.extend_from_slice(b"\r\n");
        bytes
    };
    let h = |text: &str| text.as_bytes().to_vec();
    let (ok, answer) = raw(&server, &request(&[h(&format!("host: {host}")), h(&format!("origin: {own}"))]));
    assert_eq!(ok, 200, "the control: one own Host and Origin\n{answer}");
    let refused: Vec<(&str, Vec<Vec<u8>>)> = vec![
        ("no Host", vec![]),
        ("two Hosts", vec![h(&format!("host: {host}")), h("host: evil.example")]),
        ("a Host that is not ASCII", vec![[b"host: ".as_slice(), "évil.example".as_bytes()].concat()]),
        (
            "two Origins",
            vec![h(&format!("host: {host}")), h(&format!("origin: {own}")), h("origin: http://evil.example")],
        ),
        (
            "an Origin that is not ASCII",
            vec![h(&format!("host: {host}")), [b"origin: http://".as_slice(), "évil.example".as_bytes()].concat()],
        ),
    ];
    for (what, headers) in refused {
        let (code, answer) = raw(&server, &request(&headers));
        assert!(code == 400 || code == 403, "{what}: {code}\n{answer}");
        assert!(!answer.contains("\"tools\""), "{what}: nothing of the API is answered\n{answer}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn ids_that_would_forge_log_lines_or_fill_them_are_refused_before_anything_is_recorded() {
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let setup = Setup::new(&provider);
    let server = setup.serve_as(&[], "debug", &[]);
    let forged = "x\n2026-12-04T00:00:00.000000Z  INFO oncebox: approval decided by=ceo";
    let long = "s".repeat(oncebox::keys::MAX_ID_BYTES + 1);
    for (what, run, step) in [("a newline", forged, "charge"), ("a long step", "r-ids", long.as_str())] {
        let order = format!("o-ids-{}", what.len());
        let body = json!({ "run_id": run, "step_id": step, "tool": "charge", "args": charge(&order) });
        let response = client().post(server.url("/v1/calls")).json(&body).send().await.expect("post");
        assert_eq!(response.status(), 400, "{what}");
        let answer: Value = response.json().await.expect("json");
        assert_eq!(answer["error"]["kind"], "bad-request", "{what}: {answer}");
        assert_eq!(provider.counts(&order).payments, 0, "{what}: nothing charged");
    }
    let runs: Value = client().get(server.url("/v1/runs/r-ids")).send().await.expect("get").json().await.expect("json");
    assert_eq!(runs["error"]["kind"], "not-found", "nothing was recorded: {runs}");
    let log = server.log();
    assert!(!log.contains("approval decided by=ceo"), "no forged line in the log:\n{log}");
    assert!(!log.contains(&long), "no 513-byte id in the log");
}

/// `initialize` of an MCP session (the 2025-06-18 revision, which has sessions).
fn initialize() -> Value {
    json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": { "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": { "name": "edges", "version": "1" } }
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn max_body_holds_on_every_route_mcp_included() {
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let setup = Setup::new(&provider);
    let server = setup.serve_with(&["--max-body", "65536"]);
    let padding = "p".repeat(100_000);
    let mut big = initialize();
    big["params"]["clientInfo"]["name"] = padding.clone().into();
    for (route, accept) in [("/mcp", "application/json, text/event-stream"), ("/v1/calls", "application/json")] {
        let response = client()
            .post(server.url(route))
            .header("content-type", "application/json")
            .header("accept", accept)
            .body(big.to_string())
            .send()
            .await
            .expect("post");
        assert_eq!(response.status(), 413, "{route}");
        let answer: Value = response.json().await.expect("json");
        assert!(answer["error"]["message"].as_str().is_some_and(|m| m.contains("--max-body")), "{route}: {answer}");
    }
    // A chunked body (no Content-Length) past the limit is refused as well.
    let host = server.base_url.trim_start_matches("http://").to_string();
    let mut chunked = format!(
        "POST /mcp HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\naccept: application/json, \
         text/event-stream\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    )
    .into_bytes();
    for chunk in big.to_string().as_bytes().chunks(10_000) {
        chunked.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        chunked.extend_from_slice(chunk);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let (code, answer) = raw(&server, &chunked);
    assert_eq!(code, 413, "a chunked body:\n{answer}");
    // Under the limit, MCP answers.
    let small = client()
        .post(server.url("/mcp"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(initialize().to_string())
        .send()
        .await
        .expect("post");
    assert_eq!(small.status(), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_loser_of_a_decision_race_is_told_409_with_what_won_and_nothing_is_written_over() {
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let setup = Setup::new(&provider);
    let server = setup.serve();
    let (mut lost, mut raced) = (0, 0);
    for round in 0..40 {
        let order = format!("o-race-{round}");
        let args = json!({"order_id": order, "address": "1 Main St", "items": [{"sku": "sku-1", "quantity": 1}]});
        let body = json!({ "run_id": "r-race", "step_id": format!("ship-{round}"), "tool": "fulfill", "args": args });
        let waiting: Value =
            client().post(server.url("/v1/calls")).json(&body).send().await.expect("call").json().await.expect("json");
        assert_eq!(waiting["status"], "awaiting-approval", "{waiting}");
        let key = waiting["operation_key"].as_str().expect("key").to_string();
        let decision = json!({
            "fingerprint": waiting["fingerprint"], "component": waiting["approval"]["component"], "by": "",
        });
        let decide = |verb: &'static str, by: &'static str| {
            let mut decision = decision.clone();
            decision["by"] = by.into();
            client().post(server.url(&format!("/v1/approvals/{key}/{verb}"))).bearer_auth(TOKEN).json(&decision).send()
        };
        let (approved, rejected) = tokio::join!(decide("approve", "alice"), decide("reject", "bob"));
        let (approved, rejected) = (approved.expect("approve"), rejected.expect("reject"));
        let statuses = (approved.status().as_u16(), rejected.status().as_u16());
        let (a, r): (Value, Value) = (approved.json().await.expect("json"), rejected.json().await.expect("json"));
        assert!(statuses.0 != 500 && statuses.1 != 500, "round {round}: a 5xx is sent again by clients: {a} {r}");
        let view: Value = client()
            .get(server.url(&format!("/v1/approvals/{key}")))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("get")
            .json()
            .await
            .expect("json");
        match statuses {
            (200, 200) => {} // one after the other: the later decision stands, as it would by hand
            (200, 409) | (409, 200) => {
                lost += 1;
                let (loser, winner) = if statuses.0 == 409 { (&a, "bob") } else { (&r, "alice") };
                let message = loser["error"]["message"].as_str().unwrap_or_default();
                // Lost the race ("... meanwhile; this decision was not recorded"), or came after a
                // rejection ("... a rejection is final"): either way the answer names what won.
                assert!(message.contains(winner), "round {round}: {loser}");
                raced += usize::from(message.contains("this decision was not recorded"));
                assert_eq!(view["decided_by"], winner, "the winner's decision stands: {view}");
            }
            other => panic!("round {round}: {other:?} {a} {r}"),
        }
    }
    eprintln!("{lost} of 40 rounds had a loser, answered 409; {raced} of them lost a race");
    // Both decisions read the request before either is written in most rounds (26 to 29 of 30
    // here): a run without one such race did not test the race.
    assert!(raced > 0, "no round raced: {lost} losers, none of a race");
}
