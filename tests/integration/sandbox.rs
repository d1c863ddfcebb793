//! Hostile tools (test-tools/hostile, dir-user, lying-reader) against the sandbox. Each test
//! asserts that the host survives and serves the next call, that the right failure class is
//! recorded and the operation is settled (never left claimed), and that no effect escapes: counted
//! at the provider, in the ledger, or on disk.

use std::time::Duration;

use oncebox::ledger::OperationStatus;
use oncebox::{Call, Error, Grant, Host, HostBuilder, LoadError, Outcome, ReplayClass, RetryPolicy, Status};
use oncebox_example_provider::{Provider, ProviderHandle};
use serde_json::{Value, json};

use crate::support::http_grant;

/// Fast retries and a short deadline, so the spinning tool costs two short attempts.
fn policy() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 2,
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(2),
        attempt_deadline: Duration::from_millis(300),
        call_deadline: Duration::from_secs(5),
        ..RetryPolicy::for_class(ReplayClass::IdempotentWrite)
    }
}

/// For the attacks that take real work before the limit stops them (1,000 effects, 100 MiB).
fn patient() -> RetryPolicy {
    RetryPolicy { attempt_deadline: Duration::from_secs(30), call_deadline: Duration::from_secs(60), ..policy() }
}

fn builder() -> HostBuilder {
    Host::builder_in_memory().retry_policy("hostile", policy())
}

async fn loaded(builder: HostBuilder) -> Host {
    let host = builder.build().await.expect("host");
    host.load(oncebox_artifacts::HOSTILE).await.expect("load hostile");
    host
}

/// Calls `hostile` as step `step` of run `r`.
async fn hostile(host: &Host, step: &str, args: Value) -> Outcome {
    host.call(Call::step("r", step, "hostile", args.to_string())).await.expect("the call runs")
}

/// The attempt failed with `class`, the operation is settled as failed, and the host still serves
/// a well-behaved call.
async fn failed_and_served(host: &Host, outcome: &Outcome, class: &str) -> String {
    assert_eq!(outcome.status, Status::Failed, "{outcome:?}");
    let error = outcome.error.clone().expect("an error");
    assert_eq!(error.class, class, "{}", error.message);
    let key = outcome.operation_key.as_deref().expect("recorded");
    let op = host.ledger().operation(key).await.expect("read").expect("operation");
    assert_eq!(op.status, OperationStatus::Failed, "settled, not left claimed");
    let next = hostile(host, &format!("after-{key}"), json!({"mode": "ok", "echo": "still here"})).await;
    assert_eq!(next.status, Status::Completed, "the host serves the next call: {next:?}");
    assert_eq!(next.output.expect("output")["echo"], "still here");
    error.message
}

#[tokio::test]
async fn an_infinite_loop_ends_at_its_deadline_each_attempt() {
    let host = loaded(builder()).await;
    let outcome = hostile(&host, "spin", json!({"mode": "spin"})).await;
    assert_eq!(outcome.attempts, 2, "a deadline is transient: retried up to max_attempts");
    failed_and_served(&host, &outcome, "deadline").await;
}

#[tokio::test]
async fn a_memory_bomb_hits_the_memory_limit_and_a_per_tool_override_lowers_it() {
    let host = loaded(builder()).await;
    let outcome = hostile(&host, "bomb", json!({"mode": "memory-bomb", "mib": 1024})).await;
    assert_eq!(outcome.attempts, 1, "retrying the same allocation cannot help");
    failed_and_served(&host, &outcome, "memory-limit").await;
    // 32 MiB fits the default, not an override of 16 MiB.
    let fits = hostile(&host, "fits", json!({"mode": "memory-bomb", "mib": 32})).await;
    assert_eq!(fits.status, Status::Completed, "{fits:?}");
    let small = oncebox::Limits { memory_bytes: 16 << 20, ..oncebox::Limits::default() };
    let strict = loaded(builder().limits("hostile", small)).await;
    let outcome = hostile(&strict, "bomb", json!({"mode": "memory-bomb", "mib": 32})).await;
    failed_and_served(&strict, &outcome, "memory-limit").await;
}

#[tokio::test]
async fn deep_recursion_overflows_the_stack_and_is_not_retried() {
    let host = loaded(builder()).await;
    let outcome = hostile(&host, "recurse", json!({"mode": "recurse"})).await;
    assert_eq!(outcome.attempts, 1, "{outcome:?}");
    failed_and_served(&host, &outcome, "stack-overflow").await;
}

#[tokio::test]
async fn a_100_mib_output_is_refused_by_the_output_limit() {
    // Memory enough to build the output, so what stops it is the output limit, not the memory one.
    let roomy = oncebox::Limits { memory_bytes: 1 << 30, ..oncebox::Limits::default() };
    let slow =
        RetryPolicy { attempt_deadline: Duration::from_secs(30), call_deadline: Duration::from_secs(60), ..policy() };
    let host = loaded(builder().limits("hostile", roomy).retry_policy("hostile", slow)).await;
    let outcome = hostile(&host, "big", json!({"mode": "big-output", "mib": 100})).await;
    let message = failed_and_served(&host, &outcome, "output-limit").await;
    assert!(message.contains(&oncebox::limits::DEFAULT_OUTPUT_BYTES.to_string()), "{message}");
}

#[tokio::test]
async fn a_flood_of_effect_calls_stops_at_the_limit_even_when_the_tool_swallows_the_refusals() {
    let host = loaded(builder().retry_policy("hostile", patient())).await;
    let outcome = hostile(&host, "flood", json!({"mode": "flood", "count": 5000})).await;
    failed_and_served(&host, &outcome, "effects-limit").await;
    let key = outcome.operation_key.expect("key");
    // The attempt failed, so none of its writes landed: not the 1000 within the limit either.
    assert!(host.ledger().effects(&key).await.expect("effects").is_empty(), "nothing of a failed attempt is recorded");
    assert!(host.ledger().kv_get("hostile", "k999").await.expect("kv").is_none());
    assert!(host.ledger().kv_get("hostile", "k1000").await.expect("kv").is_none(), "the 1001st write never landed");
}

/// A provider, and a host whose `hostile` tool is granted `grants` only.
async fn with_provider(grants: &[Grant]) -> (ProviderHandle, Host) {
    let provider = Provider::start().await.expect("provider");
    let mut builder = builder();
    for grant in grants {
        builder = builder.grant("hostile", grant.clone());
    }
    (provider, loaded(builder).await)
}

#[tokio::test]
async fn http_to_a_host_not_granted_is_denied_naming_the_grant_and_nothing_is_sent() {
    let (provider, host) = with_provider(&[]).await;
    let url = format!("{}/payments", provider.base_url());
    let outcome = hostile(&host, "effect", json!({"mode": "http-effect", "url": url, "echo": "x"})).await;
    let message = failed_and_served(&host, &outcome, "permanent").await;
    assert!(message.contains("capability denied"), "{message}");
    assert!(message.contains(&format!("http = [\"{}\"]", provider.base_url())), "{message}");
    assert!(message.contains("[tools.hostile.grants]"), "{message}");
    let read = format!("{}/inventory/sku-1", provider.base_url());
    let outcome = hostile(&host, "read", json!({"mode": "http-read", "url": read})).await;
    failed_and_served(&host, &outcome, "permanent").await;
    assert_eq!((provider.requests(), provider.reads()), (0, 0), "nothing reached the provider");
    assert!(host.ledger().effects(&outcome.operation_key.expect("key")).await.expect("effects").is_empty());

    // A grant for another origin is no grant for this one; the granted origin is reachable.
    let (other, host) = with_provider(&[http_grant(&provider)]).await;
    let url = format!("{}/payments", other.base_url());
    let outcome = hostile(&host, "other", json!({"mode": "http-effect", "url": url, "echo": "x"})).await;
    failed_and_served(&host, &outcome, "permanent").await;
    let url = format!("{}/payments", provider.base_url());
    hostile(&host, "granted", json!({"mode": "http-effect", "url": url, "echo": "x"})).await;
    assert_eq!((other.requests(), provider.requests()), (0, 1));
}

#[tokio::test]
async fn a_tool_cannot_set_the_key_or_the_host_header_or_hide_credentials_in_the_url() {
    let provider = Provider::start().await.expect("provider");
    let granted = loaded(builder().grant("hostile", http_grant(&provider))).await;
    let url = format!("{}/payments", provider.base_url());
    for (step, header, value) in [("key", "Idempotency-Key", "mine"), ("host", "Host", "evil.example")] {
        let args = json!({"mode": "set-header", "url": url, "header": header, "value": value});
        let outcome = hostile(&granted, step, args).await;
        let message = failed_and_served(&granted, &outcome, "permanent").await;
        assert!(message.contains(&format!("`{header}`")), "{message}");
    }
    let sneaky = provider.base_url().replace("http://", "http://user:pw@");
    let args = json!({"mode": "http-effect", "url": format!("{sneaky}/payments"), "echo": "x"});
    let outcome = hostile(&granted, "userinfo", args).await;
    let message = failed_and_served(&granted, &outcome, "permanent").await;
    assert!(message.contains("credentials"), "{message}");
    assert_eq!(provider.requests(), 0, "no forged request left the host");
}

#[tokio::test]
async fn kv_namespaces_outbox_topics_and_providers_need_grants() {
    let host = loaded(builder().grant("hostile", Grant::Kv("shared".into()))).await;
    for (step, args, grant) in [
        ("kv", json!({"mode": "kv-other", "target": "reservations"}), "kv = [\"reservations\"]"),
        ("kv-read", json!({"mode": "kv-read-other", "target": "reservations"}), "kv = [\"reservations\"]"),
        ("outbox", json!({"mode": "outbox", "target": "payments", "echo": "x"}), "outbox = [\"payments\"]"),
        ("provider", json!({"mode": "provider", "target": "bank", "echo": "x"}), "providers = [\"bank\"]"),
    ] {
        let outcome = hostile(&host, step, args).await;
        let message = failed_and_served(&host, &outcome, "permanent").await;
        assert!(message.contains(grant), "{message}");
    }
    assert!(host.ledger().kv_get("reservations", "stolen").await.expect("kv").is_none());
    assert!(host.ledger().outbox().await.expect("outbox").is_empty());
    // The granted namespace works.
    let ok = hostile(&host, "shared", json!({"mode": "kv-other", "target": "shared"})).await;
    assert_eq!(ok.status, Status::Completed, "{ok:?}");
    assert_eq!(host.ledger().kv_get("shared", "stolen").await.expect("kv").as_deref(), Some(&b"yes"[..]));
}

/// Runs the `oncebox` binary with logs at `level` and the suite's compile cache; returns the exit
/// code, stdout and stderr. Logs are checked in a child process: a process-wide subscriber is the
/// only reliable way to see every event while other tests run on other threads.
fn oncebox_cli(args: &[&str], level: &str) -> (Option<i32>, String, String) {
    let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("compile-cache");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_oncebox"))
        .args(args)
        .env("ONCEBOX_LOG", level)
        .env("ONCEBOX_CACHE", cache)
        .output()
        .expect("run oncebox");
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (output.status.code(), text(&output.stdout), text(&output.stderr))
}

#[test]
fn a_secret_the_tool_prints_is_scrubbed_from_the_logs_and_kept_out_of_the_ledger() {
    const SECRET: &str = "sk_live_51HxTopSecret";
    let dir = tempfile::tempdir().expect("dir");
    let ledger = dir.path().join("ledger.redb");
    let args = json!({"mode": "print-secret", "secret": SECRET}).to_string();
    let ledger_arg = ledger.to_str().expect("utf8");
    let call = ["call", "--ledger", ledger_arg, "--run", "r", "--step", "print", oncebox_artifacts::HOSTILE, &args];
    let (code, stdout, stderr) = oncebox_cli(&call, "oncebox=debug");
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("the secret is"), "the guest's output was logged: {stderr}");
    assert!(!stderr.contains(SECRET) && !stdout.contains(SECRET), "the secret leaked: {stdout}{stderr}");
    let ledger = oncebox::Ledger::open(&ledger).expect("open the ledger");
    let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    let records = format!("{:?}", runtime.block_on(ledger.operations(None)).expect("operations"));
    assert!(records.contains("print") && !records.contains(SECRET), "{records}");
}

// Multi-threaded: the provider keeps serving while this thread waits on the child process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_is_logged_for_the_operator() {
    let provider = Provider::start().await.expect("provider");
    let dir = tempfile::tempdir().expect("dir");
    let ledger = dir.path().join("ledger.redb");
    let args = json!({"mode": "http-effect", "url": format!("{}/payments", provider.base_url()), "echo": "x"});
    let args = args.to_string();
    let ledger_arg = ledger.to_str().expect("utf8");
    let call = ["call", "--ledger", ledger_arg, "--run", "r", "--step", "deny", oncebox_artifacts::HOSTILE, &args];
    let (code, stdout, stderr) = oncebox_cli(&call, "warn");
    assert_eq!(code, Some(1), "the tool did not complete: {stdout}{stderr}");
    assert!(stderr.contains("WARN") && stderr.contains("capability denied"), "{stderr}");
    assert!(stderr.contains("capability=\"http\"") && stderr.contains("tool=hostile"), "{stderr}");
    assert_eq!(provider.requests(), 0);
}

#[tokio::test]
async fn a_stdout_flood_ends_the_attempt_with_the_stdio_limit() {
    let host = loaded(builder()).await;
    let outcome = hostile(&host, "flood", json!({"mode": "stdout-flood", "mib": 1})).await;
    assert_eq!(outcome.attempts, 1, "{outcome:?}");
    failed_and_served(&host, &outcome, "stdio-limit").await;
}

#[tokio::test]
async fn a_new_instance_cannot_read_what_the_previous_one_left_in_memory() {
    let host = loaded(builder()).await;
    let secret = "left-behind-by-the-previous-instance";
    // The scanner works: within one instance it finds what it left.
    let control = hostile(&host, "control", json!({"mode": "leave-and-scan", "secret": secret})).await;
    assert_eq!(control.output.as_ref().expect("output")["found"], true, "{control:?}");
    for round in 0..3 {
        let left = hostile(&host, &format!("leave-{round}"), json!({"mode": "leave", "secret": secret})).await;
        assert_eq!(left.status, Status::Completed);
        let scan = hostile(&host, &format!("scan-{round}"), json!({"mode": "scan", "secret": secret})).await;
        let output = scan.output.expect("output");
        assert_eq!(output["found"], false, "instance {round} saw its predecessor's memory");
        assert!(output["scanned_bytes"].as_u64().expect("bytes") >= 1 << 16, "it scanned its memory");
    }
}

#[tokio::test]
async fn a_tool_whose_manifest_lies_about_its_class_is_refused_at_load() {
    let host = builder().build().await.expect("host");
    let err = host.load(oncebox_artifacts::LYING_READER).await.expect_err("refused");
    assert!(matches!(&err, Error::Load(LoadError::ClassMismatch { .. })), "{err}");
    assert!(err.to_string().contains("oncebox:tool/effects@0.1.0"), "{err}");
    host.load(oncebox_artifacts::HOSTILE).await.expect("the host loads the next tool");
}

#[tokio::test]
async fn a_directory_is_reachable_only_when_granted_and_read_only_unless_written_rw() {
    let data = tempfile::tempdir().expect("dir");
    std::fs::write(data.path().join("note.txt"), "granted content").expect("write");
    let dir = |access: &str| Grant::Dir(format!("{}:/data:{access}", data.path().display()).parse().expect("grant"));

    // No grant: the component, which imports wasi:filesystem, loads and sees no directory at all.
    let host = Host::builder_in_memory().build().await.expect("host");
    host.load(oncebox_artifacts::DIR_USER).await.expect("loads without a grant");
    let path = data.path().join("note.txt").display().to_string();
    for path in [path.as_str(), "/data/note.txt", "note.txt", "/etc/passwd"] {
        let outcome = host.call(Call::unrecorded("dir-user", json!({"path": path}).to_string())).await.expect("call");
        assert_eq!(outcome.status, Status::Failed, "{path}: {outcome:?}");
    }
    let target = data.path().join("ungranted.txt");
    let write = json!({"path": target.display().to_string(), "write": "x"}).to_string();
    let outcome = host.call(Call::unrecorded("dir-user", write)).await.expect("call");
    assert_eq!(outcome.status, Status::Failed, "{outcome:?}");
    assert!(!target.exists(), "nothing was written");

    let read_only = Host::builder_in_memory().grant("dir-user", dir("ro")).build().await.expect("host");
    read_only.load(oncebox_artifacts::DIR_USER).await.expect("load");
    let call = |args: Value| Call::unrecorded("dir-user", args.to_string());
    let read = read_only.call(call(json!({"path": "/data/note.txt"}))).await.expect("call");
    assert_eq!(read.output.expect("output")["content"], "granted content");
    let outside = read_only.call(call(json!({"path": "/etc/passwd"}))).await.expect("call");
    assert_eq!(outside.status, Status::Failed, "nothing outside the grant: {outside:?}");
    let escape = read_only.call(call(json!({"path": "/data/../../etc/passwd"}))).await.expect("call");
    assert_eq!(escape.status, Status::Failed, "no escape through `..`: {escape:?}");
    let write = read_only.call(call(json!({"path": "/data/new.txt", "write": "x"}))).await.expect("call");
    assert_eq!(write.status, Status::Failed, "{write:?}");
    assert!(!data.path().join("new.txt").exists(), "a read-only grant wrote nothing");

    let read_write = Host::builder_in_memory().grant("dir-user", dir("rw")).build().await.expect("host");
    read_write.load(oncebox_artifacts::DIR_USER).await.expect("load");
    let write = read_write.call(call(json!({"path": "/data/new.txt", "write": "written"}))).await.expect("call");
    assert_eq!(write.status, Status::Completed, "{write:?}");
    assert_eq!(std::fs::read_to_string(data.path().join("new.txt")).expect("on disk"), "written");
}

/// A loopback server that answers every request with a redirect to `location`.
async fn redirector(location: String) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let location = location.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = stream.read(&mut buf).await;
                let reply = format!(
                    "HTTP/1.1 307 Temporary Redirect\r\nlocation: {location}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                );
                let _ = stream.write_all(reply.as_bytes()).await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn a_redirect_is_handed_to_the_tool_never_followed() {
    let provider = Provider::start().await.expect("provider");
    let redirect = redirector(format!("{}/payments", provider.base_url())).await;
    let origin = format!("http://{redirect}");
    // Even with both origins granted, the host does not follow: the effect was recorded as sent to
    // the redirector, and a 307 would resend its body, key and credentials somewhere else.
    let grants = [Grant::Http(origin.parse().expect("origin")), http_grant(&provider)];
    let mut builder = builder();
    for grant in grants {
        builder = builder.grant("hostile", grant);
    }
    let host = loaded(builder).await;
    let args = json!({"mode": "http-effect", "url": format!("{origin}/payments"), "echo": "x"});
    let outcome = hostile(&host, "redirect", args).await;
    assert_eq!(outcome.status, Status::Completed, "{outcome:?}");
    assert_eq!(outcome.output.expect("output")["status"], 307, "the tool sees the redirect itself");
    assert_eq!(provider.requests(), 0, "the redirect was not followed");
}

/// A refused call that recorded no effect; returns the refusal's message.
async fn refused_recording_nothing(host: &Host, step: &str, args: Value) -> String {
    let outcome = hostile(host, step, args).await;
    let key = outcome.operation_key.clone().expect("recorded");
    let message = failed_and_served(host, &outcome, "permanent").await;
    assert!(host.ledger().effects(&key).await.expect("effects").is_empty(), "{step}: nothing recorded");
    message
}

fn over(what: &str, len: usize, limit: usize) -> String {
    format!("the {what} is {len} bytes, over the limit of {limit}")
}

#[tokio::test]
async fn an_effect_label_over_its_limit_is_refused_and_nothing_is_recorded_or_sent() {
    let (provider, host) = with_provider_granted().await;
    let url = format!("{}/payments", provider.base_url());
    let limit = oncebox::limits::MAX_LABEL_BYTES;
    for (step, args) in [
        ("http", json!({"mode": "long-label", "size": limit + 1, "url": url, "echo": "x"})),
        ("kv", json!({"mode": "long-label", "size": limit + 1})),
    ] {
        let message = refused_recording_nothing(&host, step, args).await;
        assert!(message.contains(&over("label", limit + 1, limit)), "{message}");
    }
    assert_eq!(provider.requests(), 0, "nothing was sent");
    assert!(host.ledger().kv_get("hostile", "k").await.expect("kv").is_none(), "nothing was written");
    // At the limit, the same calls go through.
    let ok = hostile(&host, "at-limit", json!({"mode": "long-label", "size": limit, "url": url, "echo": "x"})).await;
    assert_eq!(ok.status, Status::Completed, "{ok:?}");
    let ok = hostile(&host, "kv-at-limit", json!({"mode": "long-label", "size": limit})).await;
    assert_eq!(ok.status, Status::Completed, "{ok:?}");
    assert_eq!(provider.requests(), 1);
}

/// A provider, and a host whose `hostile` tool is granted its origin.
async fn with_provider_granted() -> (ProviderHandle, Host) {
    let provider = Provider::start().await.expect("provider");
    let host = loaded(builder().grant("hostile", http_grant(&provider))).await;
    (provider, host)
}

#[tokio::test]
async fn an_oversize_url_too_many_headers_or_an_oversize_header_is_refused_before_the_write_ahead() {
    use oncebox::limits::{MAX_HEADER_NAME_BYTES, MAX_HEADER_VALUE_BYTES, MAX_HEADERS, MAX_URL_BYTES};
    let (provider, host) = with_provider_granted().await;
    let url = format!("{}/payments", provider.base_url());
    let long_url = format!("{url}?q={}", "q".repeat(MAX_URL_BYTES + 1 - url.len() - 3));
    assert_eq!(long_url.len(), MAX_URL_BYTES + 1);
    let name = format!("x-{}", "n".repeat(MAX_HEADER_NAME_BYTES - 1));
    let value = "v".repeat(MAX_HEADER_VALUE_BYTES + 1);
    let cases = [
        (
            "url",
            json!({"mode": "http-effect", "url": long_url, "echo": "x"}),
            over("URL", MAX_URL_BYTES + 1, MAX_URL_BYTES),
        ),
        ("read-url", json!({"mode": "http-read", "url": long_url}), over("URL", MAX_URL_BYTES + 1, MAX_URL_BYTES)),
        (
            "headers",
            json!({"mode": "many-headers", "url": url, "count": MAX_HEADERS + 1}),
            format!("the request has {} headers, over the limit of {MAX_HEADERS}", MAX_HEADERS + 1),
        ),
        (
            "name",
            json!({"mode": "set-header", "url": url, "header": name, "value": "v"}),
            over("header name", MAX_HEADER_NAME_BYTES + 1, MAX_HEADER_NAME_BYTES),
        ),
        (
            "value",
            json!({"mode": "set-header", "url": url, "header": "x-big", "value": value}),
            over("header value", MAX_HEADER_VALUE_BYTES + 1, MAX_HEADER_VALUE_BYTES),
        ),
    ];
    for (step, args, expected) in cases {
        let message = refused_recording_nothing(&host, step, args).await;
        assert!(message.contains(&expected), "{step}: {message}");
        assert!(message.len() < 400, "{step}: the refusal does not repeat what it refused: {message}");
    }
    assert_eq!((provider.requests(), provider.reads()), (0, 0), "nothing was sent");
    // At the limit: sent.
    let ok = hostile(&host, "64", json!({"mode": "many-headers", "url": url, "count": MAX_HEADERS})).await;
    assert_eq!(ok.status, Status::Completed, "{ok:?}");
    assert_eq!(provider.requests(), 1);
}

#[tokio::test]
async fn an_oversize_kv_key_namespace_outbox_topic_or_provider_name_is_refused() {
    use oncebox::limits::{MAX_KV_KEY_BYTES, MAX_NAME_BYTES};
    let host = loaded(builder()).await;
    let long_name = "t".repeat(MAX_NAME_BYTES + 1);
    let key = |how: &str| json!({"mode": "long-kv-key", "size": MAX_KV_KEY_BYTES + 1, "target": how});
    let key_over = over("KV key", MAX_KV_KEY_BYTES + 1, MAX_KV_KEY_BYTES);
    let name_over = |what: &str| over(what, MAX_NAME_BYTES + 1, MAX_NAME_BYTES);
    let cases = [
        ("set", key("set"), key_over.clone()),
        ("get", key("get"), key_over.clone()),
        ("delete", key("delete"), key_over),
        ("namespace", json!({"mode": "kv-other", "target": long_name}), name_over("KV namespace")),
        ("read-namespace", json!({"mode": "kv-read-other", "target": long_name}), name_over("KV namespace")),
        ("topic", json!({"mode": "outbox", "target": long_name, "echo": "x"}), name_over("outbox topic")),
        ("provider", json!({"mode": "provider", "target": long_name, "echo": "x"}), name_over("provider name")),
    ];
    for (step, args, expected) in cases {
        let message = refused_recording_nothing(&host, step, args).await;
        assert!(message.contains(&expected), "{step}: {message}");
        assert!(!message.contains(&long_name), "{step}: refused before the grant check, which would quote it");
    }
    assert!(host.ledger().outbox().await.expect("outbox").is_empty());
    let at_limit = json!({"mode": "long-kv-key", "size": MAX_KV_KEY_BYTES, "target": "set"});
    let ok = hostile(&host, "at-limit", at_limit).await;
    assert_eq!(ok.status, Status::Completed, "{ok:?}");
    let key = "k".repeat(MAX_KV_KEY_BYTES);
    assert!(host.ledger().kv_get("hostile", &key).await.expect("kv").is_some(), "a key at the limit is written");
}

#[tokio::test]
async fn a_huge_guest_error_message_is_cut_before_it_is_recorded() {
    use oncebox::limits::MAX_ERROR_MESSAGE_BYTES;
    let host = loaded(builder()).await;
    let outcome = hostile(&host, "huge", json!({"mode": "huge-error", "size": 1 << 20, "echo": "THE-END"})).await;
    let key = outcome.operation_key.clone().expect("key");
    let message = failed_and_served(&host, &outcome, "permanent").await;
    let marker = format!("… (cut at {MAX_ERROR_MESSAGE_BYTES} of {} bytes)", 1 << 20);
    assert!(message.ends_with(&marker) && !message.contains("THE-END"), "{}", &message[message.len() - 100..]);
    assert!(message.len() <= MAX_ERROR_MESSAGE_BYTES + marker.len(), "{} bytes", message.len());
    let op = host.ledger().operation(&key).await.expect("read").expect("operation");
    assert_eq!(op.error.expect("error").message, message, "the ledger keeps the cut message");
    let attempts = host.ledger().attempts(&key).await.expect("attempts");
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].message.as_deref(), Some(message.as_str()));

    // At the limit, a message is kept whole.
    let whole =
        hostile(&host, "whole", json!({"mode": "huge-error", "size": MAX_ERROR_MESSAGE_BYTES, "echo": "END"})).await;
    let message = whole.error.expect("error").message;
    assert!(message.len() == MAX_ERROR_MESSAGE_BYTES && message.ends_with("END"), "{} bytes", message.len());

    // Scrubbed before it is cut: a secret across the cut leaves no prefix of itself behind.
    let secret = "sk_live_0123456789abcdefghij";
    let across = json!({"mode": "huge-error", "size": MAX_ERROR_MESSAGE_BYTES + 10, "secret": secret});
    let message = hostile(&host, "across", across).await.error.expect("error").message;
    assert!(
        !message.contains("sk_live_") && message.ends_with(oncebox::REDACTED),
        "{}",
        &message[message.len() - 60..]
    );
}
