//! Tools written in Python (componentize-py) and JavaScript (componentize-js), built by their
//! authors' one command with this repository's SDKs (`oncebox-guest-langs`), and run by the same
//! host as the Rust ones. Their default builds load (wasi:filesystem and wasi:sockets linked,
//! denied); they do what their Rust twins do, counted at the provider; they charge at most once
//! whatever point the host dies at; a saga mixes languages; a Python tool that tries to leave the
//! sandbox reaches nothing, and its own bug shows its traceback.

use std::path::{Path, PathBuf};

use oncebox::saga::SagaState;
use oncebox::testing::{Harness, Script};
use oncebox::{Call, Grant, Host, ReplayClass, Status};
use oncebox_example_provider::Provider;
use oncebox_guest_langs::Lang;
use serde_json::json;

use crate::support::{charge, configure, fast, http_grant};

/// Where the toolchains and the built components stay between runs.
fn work() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("guest-langs")
}

fn built(lang: Lang, dir: &str) -> PathBuf {
    oncebox_guest_langs::build(lang, dir, &work()).unwrap_or_else(|e| panic!("building {dir}: {e:#}"))
}

/// A component takes seconds to compile; the tests here take turns, so that each is compiled once
/// (the engine's in-process cache) rather than by several tests at the same time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const TWINS: [(Lang, &str, &str); 4] = [
    (Lang::Python, "example-tools/python/stock", "stock-py"),
    (Lang::Python, "example-tools/python/charge", "charge-py"),
    (Lang::Js, "example-tools/js/stock", "stock-js"),
    (Lang::Js, "example-tools/js/charge", "charge-js"),
];

#[tokio::test]
async fn python_and_js_twins_of_stock_and_charge_do_what_the_rust_ones_do_once() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().expect("dir");
    let provider = Provider::start().await.expect("provider");
    provider.set_stock("sku-1", 7);
    let mut builder = configure(Host::builder(dir.path().join("ledger.redb")), &provider, true);
    for (_, _, tool) in TWINS {
        builder = builder.tool_config(tool, "base_url", provider.base_url()).grant(tool, http_grant(&provider));
    }
    let host = builder.build().await.expect("host");
    for rust in [oncebox_artifacts::STOCK, oncebox_artifacts::REFUND] {
        host.load(rust).await.expect("load");
    }
    for (lang, dir, tool) in TWINS {
        let manifest = host.load(built(lang, dir)).await.unwrap_or_else(|e| panic!("{tool}: {e}"));
        let (imports, exports) = host.interface(tool).expect("interface");
        // The default builds: a language runtime's WASI, which the host links denied.
        assert!(imports.iter().any(|i| i.starts_with("wasi:filesystem/")), "{tool}: {imports:?}");
        if lang == Lang::Python {
            assert!(imports.iter().any(|i| i.starts_with("wasi:sockets/")), "{tool}: {imports:?}");
        }
        if tool.starts_with("stock") {
            assert_eq!(manifest.class, ReplayClass::ReadOnly);
            assert!(!imports.iter().any(|i| i.starts_with("oncebox:tool/effects")), "{tool}: {imports:?}");
        } else {
            assert_eq!(manifest.class, ReplayClass::Compensatable);
            assert_eq!(manifest.compensated_by.as_deref(), Some("refund"));
            assert_eq!(manifest.sensitive, ["/payment_method"]);
            assert!(exports.iter().any(|e| e == "oncebox:tool/reconcile@0.1.0"), "{tool}: {exports:?}");
        }
    }

    let sku = json!({"sku": "sku-1"}).to_string();
    let rust = host.call(Call::unrecorded("stock", sku.clone())).await.expect("call");
    assert_eq!(rust.output, Some(json!({"sku": "sku-1", "available": 7})));
    for tool in ["stock-py", "stock-js"] {
        let twin = host.call(Call::unrecorded(tool, sku.clone())).await.expect("call");
        assert_eq!((twin.status, &twin.output), (Status::Completed, &rust.output), "{tool}: {twin:?}");
    }

    // A charge in each language, called twice (a retry of the step): charged once each, and the
    // second answer is the record of the first.
    for (tool, order) in [("charge-py", "o-py"), ("charge-js", "o-js")] {
        let call = || Call::step(order, "pay", tool, charge(order).to_string());
        let first = host.call(call()).await.expect("call");
        assert_eq!(first.status, Status::Completed, "{tool}: {first:?}");
        assert_eq!(first.output.as_ref().expect("output")["order_id"], order);
        let again = host.call(call()).await.expect("call");
        assert_eq!((again.status, again.replayed, &again.output), (Status::Completed, true, &first.output));
        assert_eq!(provider.counts(order).payments, 1, "{tool}");

        // The saga undoes it with the Rust `refund`, its args made from the Python or JS
        // operation's record: refunded once, and once again when compensation runs again.
        let report = host.compensate(order).await.expect("compensate");
        assert_eq!(report.state, SagaState::Done, "{tool}: {report:?}");
        host.compensate(order).await.expect("compensate again");
        assert_eq!(provider.counts(order).refunds, 1, "{tool}");
    }
    assert_eq!(provider.totals().payments, 2);
}

const PAYMENT: &str = r#"
[[effect]]
label = "charge"
status = 201
body = '{"id": "pay_1", "order_id": "o-1", "amount_cents": 500, "status": "succeeded"}'
"#;

#[tokio::test]
async fn a_python_or_js_charge_lands_at_most_once_whatever_point_the_host_dies_at() {
    let _turn = ONE_AT_A_TIME.lock().await;
    const BASE: &str = "http://downstream.test";
    let args = json!({"order_id": "o-1", "amount_cents": 500, "currency": "eur", "payment_method": "pm_card"});
    for (lang, dir) in [(Lang::Python, "example-tools/python/charge"), (Lang::Js, "example-tools/js/charge")] {
        let harness = Harness::new(built(lang, dir))
            .expect("harness")
            .config("base_url", BASE)
            .grant(Grant::Http(BASE.parse().expect("origin")))
            .script(Script::parse(PAYMENT).expect("script"));
        let report = harness.explore(&args.to_string()).await.expect("explore");
        assert!(report.passed(), "{dir}: {report}");
        assert_eq!((report.baseline.status.as_str(), report.baseline.landed), ("completed", 1), "{dir}");
        assert!(report.rows.iter().all(|row| row.landed <= 1), "{dir}: {report}");
        // One effect: four crash points and six faults, plus the attempt's record, as in Rust.
        assert_eq!(report.rows.len(), 4 + 6 + 1, "{dir}: {report}");
    }
}

#[tokio::test]
async fn a_python_tool_reaches_no_socket_and_no_file_and_its_own_bug_shows_its_traceback() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let addr = listener.local_addr().expect("addr");
    let outside = tempfile::tempdir().expect("dir");
    std::fs::write(outside.path().join("secret.txt"), "host file").expect("write");
    let provider = Provider::start().await.expect("provider");
    let ledger = outside.path().join("ledger.redb");
    let host = configure(Host::builder(&ledger), &provider, true)
        .tool_config("hostile-py", "base_url", provider.base_url())
        .grant("hostile-py", http_grant(&provider))
        .retry_policy("hostile-py", fast(ReplayClass::IdempotentWrite))
        .build()
        .await
        .expect("host");
    host.load(built(Lang::Python, "test-tools/python/hostile")).await.expect("loads with no directory granted");

    let file = outside.path().join("secret.txt").display().to_string();
    let written = outside.path().join("written.txt").display().to_string();
    let attempts = [
        json!({"mode": "connect", "target": addr.to_string()}),
        json!({"mode": "resolve", "target": "localhost"}),
        json!({"mode": "open", "target": file}),
        json!({"mode": "listdir", "target": "/"}),
        json!({"mode": "write", "target": written}),
    ];
    for (i, args) in attempts.into_iter().enumerate() {
        let outcome =
            host.call(Call::step("r", format!("reach-{i}"), "hostile-py", args.to_string())).await.expect("call");
        let output = outcome.output.clone().unwrap_or_else(|| panic!("{args}: {outcome:?}"));
        assert_eq!(output["reached"], false, "{args}: {output}");
        assert!(output["error"].as_str().is_some_and(|e| !e.is_empty()), "{args}: {output}");
    }
    assert!(listener.accept().is_err(), "the listener saw no connection");
    assert!(!outside.path().join("written.txt").exists(), "nothing was written");

    // Its own bug: an uncaught exception is a trap, like a Rust panic, and the author reads the
    // traceback, with the sensitive arg scrubbed.
    let args = json!({"mode": "raise", "secret": "s3cr3t-value"}).to_string();
    let outcome = host.call(Call::step("r", "raise", "hostile-py", args)).await.expect("call");
    assert_eq!(outcome.status, Status::Failed, "{outcome:?}");
    let error = outcome.error.expect("error");
    assert_eq!(error.class, "trap");
    for shown in ["Traceback (most recent call last)", "app.py", "ValueError: the tool's own bug"] {
        assert!(error.message.contains(shown), "{shown}: {}", error.message);
    }
    assert!(!error.message.contains("s3cr3t-value"), "{}", error.message);

    // The same bug after a charge went out and was answered: every retry answers the charge from
    // its record, and the operation ends unknown (an effect was taken), never failed.
    let args = json!({"mode": "charge-then-raise", "target": "o-bug"}).to_string();
    let outcome = host.call(Call::step("r", "bug", "hostile-py", args)).await.expect("call");
    assert_eq!(outcome.status, Status::Unknown, "{outcome:?}");
    let error = outcome.error.expect("error");
    assert_eq!(error.class, "failed-after-effect", "{}", error.message);
    assert!(error.message.contains("KeyError"), "{}", error.message);
    assert_eq!(provider.counts("o-bug").payments, 1, "charged once over every attempt");
}

/// A JavaScript tool's own bug, whatever it throws (an error, a string, an object shaped like a
/// tool-error, an error carrying its own payload), fails the attempt as a trap with what was
/// thrown in its message: never an answer such as `permanent`, which would promise nothing ran.
#[tokio::test]
async fn whatever_a_js_tool_throws_is_a_trap_that_shows_it() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let host = Host::builder_in_memory().build().await.expect("host");
    host.load(built(Lang::Js, "test-tools/js/thrower")).await.expect("load");
    for (thrown, shown) in [
        ("type-error", "TypeError"),
        ("string", "a thrown string"),
        ("object", "a plain object"),
        ("payload", "an error carrying a payload"),
    ] {
        let outcome = host.call(Call::unrecorded("thrower-js", json!({"throw": thrown}).to_string())).await;
        let outcome = outcome.expect("call");
        assert_eq!(outcome.status, Status::Failed, "{thrown}: {outcome:?}");
        let error = outcome.error.expect("error");
        assert_eq!(error.class, "trap", "{thrown}: {}", error.message);
        assert!(error.message.contains(shown), "{thrown}: {}", error.message);
    }
}

/// `oncebox serve` started on a fresh compile cache with a Python and a Rust tool:
/// it answers at once, `starting` and naming what compiles; a call made meanwhile waits and
/// completes (never "no such tool"); then it is `ok`. `oncebox compile` finds every component in
/// the cache the server's scan wrote, and fills a new cache for the next start.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_answers_while_its_language_tools_compile_and_oncebox_compile_fills_the_cache() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let provider = Provider::start().await.expect("provider");
    provider.set_stock("sku-1", 3);
    let dir = tempfile::tempdir().expect("dir");
    let tools = dir.path().join("tools");
    std::fs::create_dir(&tools).expect("tools");
    std::fs::copy(built(Lang::Python, "example-tools/python/charge"), tools.join("charge-py.wasm")).expect("copy");
    std::fs::copy(oncebox_artifacts::STOCK, tools.join("stock.wasm")).expect("copy");
    let base = provider.base_url();
    let policy = dir.path().join("oncebox.toml");
    std::fs::write(
        &policy,
        format!("[tools.stock.config]\nbase_url = \"{base}\"\n[tools.stock.grants]\nhttp = [\"{base}\"]\n"),
    )
    .expect("policy");
    let cache = dir.path().join("cache");
    let token = "languages-test-token-0123456789";
    let mut server = std::process::Command::new(env!("CARGO_BIN_EXE_oncebox"))
        .args(["serve", "--listen", "127.0.0.1:0", "--tools"])
        .arg(&tools)
        .arg("--ledger")
        .arg(dir.path().join("ledger.redb"))
        .arg("--policy")
        .arg(&policy)
        .env("ONCEBOX_CACHE", &cache)
        .env("ONCEBOX_TOKEN", token)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("oncebox serve");
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(server.stdout.take().expect("stdout")), &mut line)
        .expect("the address");
    let printed: serde_json::Value = serde_json::from_str(&line).expect("one JSON line");
    let url = printed["listening"].as_str().expect("listening").to_string();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let health = || async {
        let answer = http.get(format!("{url}/healthz")).bearer_auth(token).send().await.expect("healthz");
        (answer.status().as_u16(), answer.json::<serde_json::Value>().await.expect("json"))
    };

    // The scan starts beside the listener: asked again until it names what it compiles (the
    // Python tool takes seconds; the first answers may come before the scan began).
    let mut seen = Vec::new();
    for _ in 0..200 {
        let (status, answer) = health().await;
        let named = answer["compiling"].as_array().is_some_and(|c| c.iter().any(|f| f == "charge-py.wasm"));
        seen.push(answer);
        if status != 503 || named {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let starting = seen.last().expect("asked");
    assert_eq!(starting["status"], "starting", "503 starting until the scan is over: {seen:?}");
    assert!(
        starting["compiling"].as_array().is_some_and(|c| c.iter().any(|f| f == "charge-py.wasm")),
        "the Python tool is named while it compiles: {seen:?}"
    );
    let call = json!({ "tool": "stock", "args": {"sku": "sku-1"} });
    let answer = http.post(format!("{url}/v1/calls")).json(&call).send().await.expect("call");
    let status = answer.status().as_u16();
    let answer: serde_json::Value = answer.json().await.expect("json");
    assert_eq!(
        (status, answer["status"].as_str()),
        (200, Some("completed")),
        "a call made while starting waits: {answer}"
    );
    assert_eq!(answer["output"], json!({"sku": "sku-1", "available": 3}));
    let (status, ready) = health().await;
    assert_eq!((status, ready["status"].as_str(), ready["tools"].as_u64()), (200, Some("ok"), Some(2)), "{ready}");
    assert_eq!(ready["compiling"], json!([]), "{ready}");
    let _ = server.kill();
    let _ = server.wait();

    let compile = |what: &Path, cache: &Path| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_oncebox"))
            .arg("compile")
            .arg(what)
            .env("ONCEBOX_CACHE", cache)
            .output()
            .expect("oncebox compile");
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&output.stdout)
            .lines()
            .map(|line| serde_json::from_str(line).expect("a JSON line"))
            .collect();
        lines.iter().map(|l| l["from"].as_str().unwrap_or_default().to_string()).collect::<Vec<_>>()
    };
    assert_eq!(compile(&tools, &cache), ["disk"; 2], "the server's scan wrote each to the cache");
    // (The Rust tool alone from here: a language runtime's component costs seconds per compile.)
    let rust = tools.join("stock.wasm");
    let fresh = dir.path().join("fresh-cache");
    assert_eq!(compile(&rust, &fresh), ["compiled"]);
    assert_eq!(compile(&rust, &fresh), ["disk"], "the next start reads what `oncebox compile` wrote");
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_oncebox"))
        .args(["compile", "Cargo.toml"])
        .env("ONCEBOX_CACHE", &fresh)
        .output()
        .expect("oncebox compile");
    assert_eq!(refused.status.code(), Some(2), "not a component: refused as input");
}
