//! Traces end to end: a real `oncebox serve` exporting OTLP (HTTP/protobuf) to a receiver of the
//! test's own on loopback, which decodes what it gets with the official protobuf definitions, and
//! the example provider, which records the `traceparent` each effect request came with. One trace
//! from the caller through the call, its attempt and its effect to the provider, over the HTTP
//! API's `traceparent` header and over MCP's `_meta`; a replay is a span and nothing more; no
//! sensitive value in any span.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use oncebox_example_provider::Provider;
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;
use serde_json::{Value, json};

use super::support::{Setup, client};

/// The sensitive `payment_method` of `charge`: it must appear in no span.
const CARD: &str = "pm_card_4000056655665556";

/// The caller's traces: over the HTTP API, its replay, and over MCP.
const HTTP_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const HTTP_PARENT: &str = "00f067aa0ba902b7";
const REPLAY_TRACE: &str = "5bf92f3577b34da6a3ce929d0e0e4737";
const MCP_TRACE: &str = "6bf92f3577b34da6a3ce929d0e0e4738";
const MCP_PARENT: &str = "10f067aa0ba902b8";

/// A span as received: ids in hex, attributes as text.
#[derive(Debug, Clone)]
struct Received {
    trace: String,
    id: String,
    parent: String,
    name: String,
    kind: i32,
    attributes: Vec<(String, String)>,
}

impl Received {
    fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

#[derive(Default)]
struct Receiver {
    spans: Mutex<Vec<Received>>,
    resources: Mutex<Vec<Vec<(String, String)>>>,
    /// Every request's content type, to check what the exporter sent.
    content_types: Mutex<Vec<String>>,
}

fn text(value: &Option<AnyValue>) -> String {
    match value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn pairs(attributes: &[KeyValue]) -> Vec<(String, String)> {
    attributes.iter().map(|kv| (kv.key.clone(), text(&kv.value))).collect()
}

/// An OTLP/HTTP traces receiver on loopback: `POST /v1/traces`, protobuf.
async fn receiver() -> (String, Arc<Receiver>) {
    async fn traces(State(receiver): State<Arc<Receiver>>, headers: HeaderMap, body: Bytes) -> (StatusCode, Vec<u8>) {
        let content_type = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default();
        receiver.content_types.lock().unwrap_or_else(|p| p.into_inner()).push(content_type.to_string());
        let Ok(request) = ExportTraceServiceRequest::decode(body) else {
            return (StatusCode::BAD_REQUEST, Vec::new());
        };
        for resource_spans in request.resource_spans {
            let resource = resource_spans.resource.map(|r| pairs(&r.attributes)).unwrap_or_default();
            receiver.resources.lock().unwrap_or_else(|p| p.into_inner()).push(resource);
            for span in resource_spans.scope_spans.into_iter().flat_map(|s| s.spans) {
                let received = Received {
                    trace: hex(&span.trace_id),
                    id: hex(&span.span_id),
                    parent: hex(&span.parent_span_id),
                    name: span.name.clone(),
                    kind: span.kind,
                    attributes: pairs(&span.attributes),
                };
                receiver.spans.lock().unwrap_or_else(|p| p.into_inner()).push(received);
            }
        }
        (StatusCode::OK, ExportTraceServiceResponse::default().encode_to_vec())
    }
    let receiver = Arc::new(Receiver::default());
    let app = axum::Router::new().route("/v1/traces", post(traces)).with_state(receiver.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), receiver)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn args(order: &str) -> Value {
    json!({"order_id": order, "amount_cents": 1200, "currency": "eur", "payment_method": CARD})
}

/// One MCP request over streamable HTTP; the JSON-RPC answer (from a JSON or an SSE body).
async fn mcp(http: &reqwest::Client, url: &str, session: Option<&str>, body: Value) -> (Option<String>, Value) {
    let mut request = http.post(url).header("accept", "application/json, text/event-stream").json(&body);
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

/// `charge` over MCP, with the caller's trace context in `_meta`.
async fn mcp_charge(http: &reqwest::Client, url: &str, traceparent: &str) -> Value {
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "traces-test", "version": "0"}}});
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
        "name": "charge", "arguments": args("o-mcp"),
        "_meta": {"oncebox/run-id": "r", "oncebox/step-id": "charge-mcp",
                  "traceparent": traceparent, "tracestate": "vendor=opaque"}}});
    let (_, answer) = mcp(http, url, Some(&session), call).await;
    answer["result"].clone()
}

/// The only span of `trace` named `name` whose parent is `parent`.
fn child<'a>(spans: &'a [Received], trace: &str, parent: &str, name: &str) -> &'a Received {
    let found: Vec<&Received> =
        spans.iter().filter(|s| s.trace == trace && s.parent == parent && s.name == name).collect();
    assert_eq!(found.len(), 1, "one `{name}` span under {parent} in trace {trace}; spans:\n{spans:#?}");
    found[0]
}

/// The call > attempt > effect tree of `trace` under the caller's span `parent`, and the provider's
/// `traceparent` for it: same trace, the effect span as parent.
fn assert_tree(spans: &[Received], received: &[Option<String>], trace: &str, parent: &str, step: &str) {
    let call = child(spans, trace, parent, "call");
    assert_eq!(call.kind, SpanKind::Server as i32, "{call:?}");
    for (key, value) in [
        ("oncebox.tool", "charge"),
        ("oncebox.class", "compensatable"),
        ("oncebox.run", "r"),
        ("oncebox.step", step),
        ("oncebox.source", "fresh"),
        ("oncebox.verdict", "completed"),
    ] {
        assert_eq!(call.attr(key), Some(value), "{key} of {call:?}");
    }
    assert!(call.attr("oncebox.operation_key").is_some_and(|k| !k.is_empty()), "{call:?}");
    let attempt = child(spans, trace, &call.id, "attempt");
    assert_eq!(attempt.attr("oncebox.attempt"), Some("1"), "{attempt:?}");
    assert_eq!(attempt.attr("oncebox.max_attempts"), Some("3"), "{attempt:?}");
    assert_eq!(attempt.attr("oncebox.source"), Some("fresh"), "{attempt:?}");
    assert_eq!(attempt.attr("oncebox.verdict"), Some("ok"), "{attempt:?}");
    let effect = child(spans, trace, &attempt.id, "effect");
    assert_eq!(effect.kind, SpanKind::Client as i32, "{effect:?}");
    assert_eq!(effect.attr("oncebox.effect.kind"), Some("http"), "{effect:?}");
    assert_eq!(effect.attr("oncebox.source"), Some("fresh"), "{effect:?}");
    assert_eq!(effect.attr("oncebox.verdict"), Some("completed"), "{effect:?}");
    assert!(effect.attr("oncebox.effect.key").is_some_and(|k| !k.is_empty()), "{effect:?}");
    let sent: Vec<&String> = received.iter().flatten().filter(|tp| tp.contains(trace)).collect();
    assert_eq!(sent, [&format!("00-{trace}-{}-01", effect.id)], "the provider got the effect span's context");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_its_attempt_and_its_effect_are_one_trace_from_the_caller_to_the_provider() {
    let (otlp, receiver) = receiver().await;
    let provider = Provider::start().await.expect("provider");
    let setup = Setup::new(&provider);
    let mut server = setup.serve_env(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &otlp),
        ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test"),
    ]);
    let http = client();

    // Over the HTTP API, with the caller's context in `traceparent`.
    let call = json!({"run_id": "r", "step_id": "charge-http", "tool": "charge", "args": args("o-http")});
    let first: Value = http
        .post(server.url("/v1/calls"))
        .header("traceparent", format!("00-{HTTP_TRACE}-{HTTP_PARENT}-01"))
        .json(&call)
        .send()
        .await
        .expect("call")
        .json()
        .await
        .expect("json");
    assert_eq!(first["status"], "completed", "{first}");
    // The same call again, in another trace: answered from the record, nothing sent.
    let requests = provider.requests();
    let again: Value = http
        .post(server.url("/v1/calls"))
        .header("traceparent", format!("00-{REPLAY_TRACE}-{HTTP_PARENT}-01"))
        .json(&call)
        .send()
        .await
        .expect("call")
        .json()
        .await
        .expect("json");
    assert_eq!(again["replayed"], true, "{again}");
    assert_eq!(provider.requests(), requests, "a replay sends nothing");
    // Over MCP, with the context in `_meta`.
    let result = mcp_charge(&http, &server.url("/mcp"), &format!("00-{MCP_TRACE}-{MCP_PARENT}-01")).await;
    assert_eq!(result["_meta"]["oncebox/status"], "completed", "{result}");

    // Stopped: the exporter's last batch goes out as the server exits (its batch delay is 5 s).
    let status = server.signal_and_wait("TERM", Duration::from_secs(15)).expect("serve exits");
    assert!(status.success(), "serve exited {status:?}:\n{}", server.log());
    let spans = receiver.spans.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let received = provider.traceparents();
    assert!(!spans.is_empty(), "no span received; the server's log:\n{}", server.log());

    assert_tree(&spans, &received, HTTP_TRACE, HTTP_PARENT, "charge-http");
    assert_tree(&spans, &received, MCP_TRACE, MCP_PARENT, "charge-mcp");

    // The replay: one span, source replayed, and no attempt or effect under it.
    let replay: Vec<&Received> = spans.iter().filter(|s| s.trace == REPLAY_TRACE).collect();
    assert_eq!(replay.len(), 1, "a replay is the call's span alone: {replay:#?}");
    assert_eq!(replay[0].name, "call");
    assert_eq!(replay[0].parent, HTTP_PARENT);
    assert_eq!(replay[0].attr("oncebox.source"), Some("replayed"), "{:?}", replay[0]);
    assert_eq!(replay[0].attr("oncebox.verdict"), Some("completed"), "{:?}", replay[0]);
    assert!(!received.iter().flatten().any(|tp| tp.contains(REPLAY_TRACE)), "{received:?}");

    // The resource: oncebox, its version, and what OTEL_RESOURCE_ATTRIBUTES adds.
    let resources = receiver.resources.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let resource = resources.first().expect("a resource");
    let get = |key: &str| resource.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
    assert_eq!(get("service.name"), Some("oncebox"), "{resource:?}");
    assert_eq!(get("service.version"), Some(env!("CARGO_PKG_VERSION")), "{resource:?}");
    assert_eq!(get("deployment.environment"), Some("test"), "{resource:?}");
    let content_types = receiver.content_types.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert!(content_types.iter().all(|c| c == "application/x-protobuf"), "{content_types:?}");

    // No sensitive value in any span's name or attribute, nor in the resource.
    for span in &spans {
        assert!(!span.name.contains(CARD), "{span:?}");
        for (key, value) in &span.attributes {
            assert!(!key.contains(CARD) && !value.contains(CARD), "a sensitive value in {span:?}");
        }
    }
    assert!(!format!("{resources:?}").contains(CARD));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_endpoint_nothing_is_exported_and_the_callers_context_still_reaches_the_provider() {
    let provider = Provider::start().await.expect("provider");
    let setup = Setup::new(&provider);
    let mut server = setup.serve();
    let traceparent = format!("00-{HTTP_TRACE}-{HTTP_PARENT}-01");
    let call = json!({"run_id": "r", "step_id": "charge-plain", "tool": "charge", "args": args("o-plain")});
    let answer: Value = client()
        .post(server.url("/v1/calls"))
        .header("traceparent", &traceparent)
        .json(&call)
        .send()
        .await
        .expect("call")
        .json()
        .await
        .expect("json");
    assert_eq!(answer["status"], "completed", "{answer}");
    // No span of its own to be the parent: the caller's context goes on unchanged.
    assert_eq!(provider.traceparents(), [Some(traceparent)]);
    let status = server.signal_and_wait("TERM", Duration::from_secs(15)).expect("serve exits");
    assert!(status.success(), "serve exited {status:?}");
}

/// `oncebox call` takes the caller's context from `TRACEPARENT`, and sends its spans as it exits:
/// its batch would wait 5 s, the process is gone long before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oncebox_call_joins_the_trace_in_traceparent_and_sends_its_spans_before_it_exits() {
    let (otlp, receiver) = receiver().await;
    let provider = Provider::start().await.expect("provider");
    let dir = tempfile::tempdir().expect("dir");
    let ledger = dir.path().join("l.redb");
    let base = provider.base_url();
    let (config, grant) = (format!("base_url={base}"), format!("http={base}"));
    let addr = provider.addr().to_string();
    let args = args("o-cli").to_string();
    let traceparent = format!("00-{HTTP_TRACE}-{HTTP_PARENT}-01");
    let cache = super::support::cache();
    let (code, outcome, stderr) = crate::support::oncebox_with(
        &[
            "call",
            "--ledger",
            ledger.to_str().expect("utf8"),
            "--config",
            &config,
            "--grant",
            &grant,
            "--key-target",
            &addr,
            "--run",
            "r",
            "--step",
            "charge-cli",
            oncebox_artifacts::CHARGE,
            &args,
        ],
        &[
            ("ONCEBOX_CACHE", cache.to_str().expect("utf8")),
            ("TRACEPARENT", &traceparent),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &format!("{otlp}/v1/traces")),
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(outcome["status"], "completed", "{outcome}");
    let spans = receiver.spans.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert!(!spans.is_empty(), "no span received before `oncebox call` exited:\n{stderr}");
    assert_tree(&spans, &provider.traceparents(), HTTP_TRACE, HTTP_PARENT, "charge-cli");
}

/// An exporter that drops what it is given: what spans cost the call, not their export.
#[derive(Debug)]
struct Discard;

impl opentelemetry_sdk::trace::SpanExporter for Discard {
    async fn export(&self, _batch: Vec<opentelemetry_sdk::trace::SpanData>) -> opentelemetry_sdk::error::OTelSdkResult {
        Ok(())
    }
}

/// The median of `n` calls made by `call`, in microseconds.
async fn median_us<F: std::future::Future<Output = ()>>(n: usize, mut call: impl FnMut(usize) -> F) -> f64 {
    let mut samples = Vec::with_capacity(n);
    for i in 0..n {
        let start = std::time::Instant::now();
        call(i).await;
        samples.push(start.elapsed());
    }
    samples.sort_unstable();
    samples[n / 2].as_secs_f64() * 1e6
}

/// What spans cost a call: the median of a fresh call with one KV effect (a call, an attempt and
/// an effect span) and of a replay (a call span), with no tracer, then with the SDK's (its batch
/// processor, an exporter that drops the spans). It installs a tracer for the whole process, so it
/// runs alone: `integration serve::traces::cost --ignored --nocapture` (a debug build: the
/// workspace's crates unoptimised, their dependencies at opt-level 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a timing, not a check; installs a process-wide tracer"]
async fn cost() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = oncebox::Host::builder(dir.path().join("ledger.redb"))
        .compile_cache(super::support::cache())
        .build()
        .await
        .expect("host");
    host.load(oncebox_artifacts::PANICKY).await.expect("load");
    let args = json!({"mode": "ok", "write_first": true, "echo": "bench"}).to_string();
    let call = |run: &str, step: usize| oncebox::Call::step(run, format!("s{step}"), "panicky", args.clone());
    let fresh = |run: &'static str| {
        let (host, call) = (&host, &call);
        move |i| async move {
            let outcome = host.call(call(run, i)).await.expect("call");
            assert!(outcome.is_completed() && !outcome.replayed, "{outcome:?}");
        }
    };
    let replay = |run: &'static str| {
        let (host, call) = (&host, &call);
        move |_| async move {
            let outcome = host.call(call(run, 0)).await.expect("call");
            assert!(outcome.replayed, "{outcome:?}");
        }
    };
    let n = 1000;
    median_us(200, fresh("warm")).await;
    let off = (median_us(n, fresh("off")).await, median_us(n, replay("off")).await);
    assert!(!oncebox::telemetry::enabled());
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().with_batch_exporter(Discard).build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    oncebox::telemetry::install(opentelemetry::global::tracer("oncebox"));
    let on = (median_us(n, fresh("on")).await, median_us(n, replay("on")).await);
    let _ = provider.shutdown();
    println!("fresh call with a KV effect: {:.1} us off, {:.1} us on", off.0, on.0);
    println!("replay: {:.1} us off, {:.1} us on", off.1, on.1);
}
