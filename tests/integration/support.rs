//! Fixtures: a provider, a ledger in a temp dir, a host with the example tools loaded.

use std::time::Duration;

use oncebox::{Call, Grant, Host, HostBuilder, HttpTarget, Outcome, ReplayClass, RetryPolicy};
use oncebox_example_provider::{Provider, ProviderHandle};
use serde_json::json;
use tempfile::TempDir;

/// How long the host waits for the provider before an effect's outcome is unknown.
pub const EFFECT_TIMEOUT: Duration = Duration::from_millis(1500);

pub struct Fixture {
    pub dir: TempDir,
    pub provider: ProviderHandle,
    pub host: Host,
}

impl Fixture {
    /// A provider that honours keys, and a host with every example tool and `panicky` loaded.
    pub async fn new() -> Fixture {
        Fixture::honouring_keys(true).await
    }

    /// Like [`Fixture::new`]; `honours_keys: false` also tells the provider to ignore keys, so
    /// that host and provider agree (a host told keys are honoured would resend).
    pub async fn honouring_keys(honours_keys: bool) -> Fixture {
        let dir = tempfile::tempdir().expect("temp dir");
        let provider = Provider::start().await.expect("start provider");
        provider.set_stock("sku-1", 10);
        if !honours_keys {
            provider.configure(oncebox_example_provider::Settings { honour_keys: false, ..Default::default() });
        }
        let host = host_for(&dir.path().join("ledger.redb"), &provider, honours_keys).await;
        Fixture { dir, provider, host }
    }

    pub async fn call(&self, run: &str, step: &str, tool: &str, args: &serde_json::Value) -> Outcome {
        self.host.call(Call::step(run, step, tool, args.to_string())).await.expect("call runs")
    }
}

/// A builder for a host on `ledger` talking to `provider`, with fast retries for the tests.
pub fn builder_for(ledger: &std::path::Path, provider: &ProviderHandle, honours_keys: bool) -> HostBuilder {
    configure(Host::builder(ledger), provider, honours_keys)
}

/// `builder` (on any ledger) talking to `provider`, configured as [`builder_for`] configures one.
pub fn configure(builder: HostBuilder, provider: &ProviderHandle, honours_keys: bool) -> HostBuilder {
    let target = HttpTarget {
        honours_keys,
        key_retention: Duration::from_secs(24 * 3600),
        timeout: EFFECT_TIMEOUT,
        ..Default::default()
    };
    let mut builder = builder.http_target(provider.addr().to_string(), target);
    for tool in ["stock", "charge", "refund", "fulfill"] {
        builder = builder.tool_config(tool, "base_url", provider.base_url()).grant(tool, http_grant(provider));
    }
    for tool in ["reserve", "release"] {
        builder = builder.grant(tool, Grant::Kv("reservations".into()));
    }
    builder = builder.grant("notify", Grant::Outbox("email".into())).grant("panicky", Grant::Provider("bank".into()));
    for (tool, class) in [
        ("stock", ReplayClass::ReadOnly),
        ("charge", ReplayClass::Compensatable),
        ("refund", ReplayClass::IdempotentWrite),
        ("fulfill", ReplayClass::Irreversible),
        ("panicky", ReplayClass::IdempotentWrite),
        ("reserve", ReplayClass::IdempotentWrite),
    ] {
        builder = builder.retry_policy(tool, fast(class));
    }
    builder
}

/// The grant of the provider's origin.
pub fn http_grant(provider: &ProviderHandle) -> Grant {
    Grant::Http(provider.base_url().parse().expect("the provider's base URL is an origin"))
}

pub async fn host_for(ledger: &std::path::Path, provider: &ProviderHandle, honours_keys: bool) -> Host {
    let host = builder_for(ledger, provider, honours_keys).build().await.expect("build host");
    load_all(&host).await;
    host
}

pub async fn load_all(host: &Host) {
    for tool in oncebox_artifacts::EXAMPLE_TOOLS.iter().chain([&oncebox_artifacts::PANICKY]) {
        host.load(tool).await.expect("load tool");
    }
}

/// The class's defaults with millisecond backoff, so retry tests stay quick.
pub fn fast(class: ReplayClass) -> RetryPolicy {
    RetryPolicy {
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(5),
        ..RetryPolicy::for_class(class)
    }
}

pub fn charge(order: &str) -> serde_json::Value {
    json!({"order_id": order, "amount_cents": 1200, "currency": "eur", "payment_method": "pm_card_visa"})
}

/// Polls `check` every 10 ms for up to 10 s; bounded so a broken test fails instead of hanging.
pub async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting until {what}");
}

/// `http://127.0.0.1:PORT` of a port nobody listens on: connections to it are refused, so a
/// request to it is proven never sent.
pub async fn closed_origin() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    format!("http://{addr}")
}

/// Runs the `oncebox` binary: (exit code, the first line of stdout as JSON, stderr).
/// `oncebox call` on `ledger` with an example tool's config and grant for `provider`: the flags
/// before the run, the step, the component and the args.
pub fn call_flags(ledger: &std::path::Path, provider: &ProviderHandle) -> Vec<String> {
    let (ledger, base) = (ledger.to_str().expect("utf8"), provider.base_url());
    ["call", "--ledger", ledger, "--config", &format!("base_url={base}"), "--grant", &format!("http={base}")]
        .into_iter()
        .map(String::from)
        .collect()
}

pub fn oncebox(args: &[&str]) -> (i32, serde_json::Value, String) {
    // The suite's own compile cache, so the tests neither compile every component in every process
    // nor write to the home directory.
    let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("compile-cache");
    oncebox_with(args, &[("ONCEBOX_CACHE", cache.to_str().expect("utf8"))])
}

pub fn oncebox_with(args: &[&str], env: &[(&str, &str)]) -> (i32, serde_json::Value, String) {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_oncebox"));
    command.args(args);
    for (name, value) in env {
        command.env(name, value);
    }
    let output = command.output().expect("run oncebox");
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    let json = stdout.lines().next().and_then(|l| serde_json::from_str(l).ok()).unwrap_or(serde_json::Value::Null);
    (output.status.code().unwrap_or(-1), json, String::from_utf8_lossy(&output.stderr).to_string())
}

/// Approves, as "test", what `outcome` (an `awaiting-approval`) asks to approve.
pub async fn approve(host: &Host, outcome: &Outcome) {
    assert_eq!(outcome.status, oncebox::Status::AwaitingApproval, "{outcome:?}");
    let key = outcome.operation_key.as_deref().expect("operation key");
    let fingerprint = outcome.fingerprint.as_deref().expect("fingerprint");
    host.decide(key, fingerprint, oncebox::Decision::Approve { expires_ms: None }, "test", None)
        .await
        .expect("approve");
}

/// A call of a tool that needs approval: the first call dispatches nothing and awaits approval;
/// approved, the same call runs.
pub async fn approved_call(host: &Host, call: Call) -> Outcome {
    let first = host.call(call.clone()).await.expect("call");
    approve(host, &first).await;
    host.call(call).await.expect("call")
}

/// The CLI's `approve` for what a CLI call printed as `awaiting-approval`.
pub fn approve_cli(ledger: &std::path::Path, printed: &serde_json::Value) {
    assert_eq!(printed["status"], "awaiting-approval", "{printed}");
    let key = printed["operation_key"].as_str().expect("key");
    let fingerprint = printed["fingerprint"].as_str().expect("fingerprint");
    let component = printed["approval"]["component"].as_str().expect("the component digest");
    let ledger = ledger.to_str().expect("utf8");
    let approve = ["approve", "--ledger", ledger, key, "--fingerprint", fingerprint, "--component", component];
    let (code, _, stderr) = oncebox(&[&approve[..], &["--by", "test"]].concat());
    assert_eq!(code, 0, "{stderr}");
}

/// The wall clock as the ledger's records keep it (ms since the epoch).
/// What retention leaves of completed compensatable operation `key` (step `step`, tool `tool`)
/// of run `run`: the shape the tests write tombstones from, with their own fields over it.
pub fn tombstone(key: &str, run: &str, step: &str, tool: &str) -> oncebox::ledger::Tombstone {
    oncebox::ledger::Tombstone {
        operation_key: key.into(),
        run_id: run.into(),
        step_id: step.into(),
        tool: tool.into(),
        fingerprint: "f".into(),
        status: oncebox::ledger::OperationStatus::Completed,
        ended_ms: 5,
        removed_ms: 6,
        rejected: false,
        class: Some(ReplayClass::Compensatable),
    }
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Stops a test that cannot get what it needs from the machine (a browser, a program, a Debian
/// package) with one line saying what is missing and how to get it, instead of a stack of
/// unrelated errors further on. `cargo xtask test` (the README's test command) installs all of it on
/// Debian first: xtask/src/needs.rs is the list.
#[track_caller]
pub fn require(what: &str, present: bool, package: &str) {
    assert!(present, "missing {what}: run `cargo xtask test`, or `apt-get install {package}`");
}

/// Whether `program` is on the `PATH`.
pub fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

/// A virtual environment named `name` under the target directory with `install` pip-installed in
/// one call (`-r FILE` and directories alike), made on first use and made again when `wanted`
/// (what the install stands for: the requirements' text, the sources' hashes) changes; its
/// python. One test at a time makes one; the others wait.
pub fn venv(name: &str, install: &[&std::ffi::OsStr], wanted: &str) -> std::path::PathBuf {
    use std::process::Command;
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let venv = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let python = venv.join("bin").join("python");
    let stamp = venv.join("oncebox-installed");
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(wanted) {
        return python;
    }
    if !python.exists() {
        // Debian's python3 has `venv` without `ensurepip` (python3-venv), and then `-m venv` fails.
        let works =
            Command::new("python3").args(["-c", "import ensurepip, venv"]).output().is_ok_and(|o| o.status.success());
        require("Python's venv (with ensurepip)", works, "python3-venv");
        let status = Command::new("python3").args(["-m", "venv"]).arg(&venv).status().expect("python3 -m venv");
        assert!(status.success(), "python3 -m venv {} failed", venv.display());
    }
    let status = Command::new(&python)
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
        .args(install)
        .status()
        .expect("pip install");
    assert!(status.success(), "pip install {install:?} into {} failed", venv.display());
    std::fs::write(&stamp, wanted).expect("stamp");
    python
}
