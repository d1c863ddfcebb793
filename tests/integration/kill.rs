//! Kill -9 with real processes: the `oncebox` binary is started for many steps against the example
//! provider and killed with SIGKILL at random moments (seeded; the seed is printed, and
//! `ONCEBOX_KILL_SEED=N` replays the same choices). Then every step is called again, what is
//! unknown is reconciled and called once more, and the provider's own counts are checked for every
//! step: never more than one commit; `completed` means exactly one; `failed` means none.
#![cfg(unix)]

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use oncebox_example_provider::{Counts, Fault, FaultKind, Provider, ProviderHandle, Route};
use serde_json::{Value, json};

use crate::support::{charge, oncebox};

/// Steps in one run: bounded, so the whole test takes seconds on two cores.
const STEPS: u64 = 16;
/// A kill lands this long after the spawn, at most.
const KILL_WINDOW_MS: u64 = 800;
/// The provider's timeout, in the policy file and `--timeout-ms`: shorter than the slowest faults.
const TIMEOUT_MS: u64 = 1_000;
/// The provider's settle window in the policy file: longer than any delayed commit armed below, so
/// a `not-committed` lookup after it is true.
const SETTLE_MS: u64 = 1_500;

/// splitmix64: a few lines, no dependency, the same sequence for the same seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform enough in `0..n` for a test.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high - low + 1)
    }
}

#[derive(Debug, Clone, Copy)]
enum Tool {
    Charge,
    Refund,
    Fulfill,
}

impl Tool {
    fn artifact(self) -> &'static str {
        match self {
            Tool::Charge => oncebox_artifacts::CHARGE,
            Tool::Refund => oncebox_artifacts::REFUND,
            Tool::Fulfill => oncebox_artifacts::FULFILL,
        }
    }

    fn route(self) -> Route {
        match self {
            Tool::Charge => Route::Payments,
            Tool::Refund => Route::Refunds,
            Tool::Fulfill => Route::Fulfillments,
        }
    }

    fn args(self, order: &str) -> Value {
        match self {
            Tool::Charge => charge(order),
            Tool::Refund => json!({"order_id": order, "amount_cents": 500}),
            Tool::Fulfill => {
                json!({"order_id": order, "address": "1 Main St", "items": [{"sku": "sku-1", "quantity": 1}]})
            }
        }
    }

    /// Whether the tool exports `reconcile` (charge and fulfill do; refund does not).
    fn reconciles(self) -> bool {
        !matches!(self, Tool::Refund)
    }

    /// The provider's own count of this tool's commits.
    fn commits(self, counts: &Counts) -> u64 {
        match self {
            Tool::Charge => counts.payments,
            Tool::Refund => counts.refunds,
            Tool::Fulfill => counts.fulfillments,
        }
    }
}

/// What the operator declared about the provider's keys, the same for every call of a step.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Declared {
    /// Nothing: keys are sent but not trusted, nothing in doubt is resent.
    Nothing,
    /// `--key-target HOST:PORT`.
    Flag,
    /// `honours_keys = true` in the policy file's `[hosts]` entry (with the same timeout and
    /// settle window as the undeclared one).
    Policy,
}

/// One step of the run, what was chosen for it and what was seen of it.
struct Step {
    step: String,
    order: String,
    tool: Tool,
    fault: Option<(FaultKind, u32)>,
    declared: Declared,
    kill_after_ms: u64,
    /// The kill was sent while the first process was still running.
    killed: bool,
    /// How long the first process ran (until it exited, or until the kill was reaped).
    ran_ms: u64,
    /// Every answer a process gave for the step, in order (`call:STATUS`, `reconcile:RESULT`).
    seen: Vec<String>,
    /// The statuses printed by calls (and the outcome of a `committed` reconciliation).
    statuses: Vec<String>,
    /// The provider's count right after a `not-committed` reconciliation: it said nothing landed.
    not_committed_at: Vec<u64>,
}

impl Step {
    fn summary(&self, commits: u64) -> String {
        let fault = match &self.fault {
            Some((kind, times)) => format!("{kind:?}x{times}"),
            None => "none".into(),
        };
        let killed = if self.killed { "killed mid-flight" } else { "finished first" };
        format!(
            "{} {:?} order={} fault={fault} keys={:?} kill@{}ms ({killed}, ran {}ms) seen={:?} commits={commits}",
            self.step, self.tool, self.order, self.declared, self.kill_after_ms, self.ran_ms, self.seen
        )
    }
}

/// A fault that keeps the downstream slow or lying, or none; most keep the process busy past the
/// kill window, so most kills land mid-dispatch.
fn pick_fault(rng: &mut Rng) -> Option<(FaultKind, u32)> {
    let kind = match rng.below(10) {
        0 => return None,
        // Commits at once, answers after the timeout (or never, for a killed client).
        1..=3 => FaultKind::Delay { delay_ms: rng.between(1_200, 3_000) },
        // Commits later, whether or not the client is still there; within the settle window.
        4..=6 => FaultKind::CommitAfterDelay { delay_ms: rng.between(300, SETTLE_MS - 200) },
        7 => FaultKind::LoseResponse,
        8 => FaultKind::CommitThenError { status: 502 },
        _ => FaultKind::ErrorBeforeCommit,
    };
    Some((kind, rng.between(1, 2) as u32))
}

/// The flags of `oncebox call` (and `reconcile`) for `step`, without the subcommand.
fn flags(step: &Step, ledger: &Path, policies: &Policies, provider: &ProviderHandle) -> Vec<String> {
    let base = provider.base_url();
    let policy = if step.declared == Declared::Policy { &policies.keyed } else { &policies.plain };
    let mut flags: Vec<String> = [
        "--ledger",
        path_str(ledger),
        "--run",
        "kill-run",
        "--step",
        &step.step,
        "--config",
        &format!("base_url={base}"),
        "--grant",
        &format!("http={base}"),
        "--timeout-ms",
        &TIMEOUT_MS.to_string(),
        "--policy",
        path_str(policy),
    ]
    .into_iter()
    .map(String::from)
    .collect();
    if step.declared == Declared::Flag {
        flags.extend(["--key-target".to_string(), provider.addr().to_string()]);
    }
    flags.push(step.tool.artifact().to_string());
    flags.push(step.tool.args(&step.order).to_string());
    flags
}

struct Policies {
    plain: PathBuf,
    keyed: PathBuf,
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf8 path")
}

/// What became of a process that was to be killed after a while.
struct Killed {
    /// The kill was sent while it was running and it died of it.
    mid_flight: bool,
    ran: Duration,
    /// Exit code, stdout's JSON and stderr, when it finished on its own.
    finished: Option<(i32, Value, String)>,
}

/// Runs `oncebox ARGS` and SIGKILLs it `after` the spawn if it is still running. Blocking.
fn run_and_kill(args: Vec<String>, stderr_path: PathBuf, after: Duration) -> Killed {
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("compile-cache");
    let stderr = std::fs::File::create(&stderr_path).expect("stderr file");
    let start = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_oncebox"))
        .args(&args)
        .env("ONCEBOX_CACHE", &cache)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(stderr))
        .spawn()
        .expect("spawn oncebox");
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if start.elapsed() >= after {
            child.kill().expect("kill -9");
            break child.wait().expect("reap");
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let ran = start.elapsed();
    let mut stdout = String::new();
    child.stdout.take().expect("stdout").read_to_string(&mut stdout).expect("read stdout");
    if status.signal() == Some(9) {
        return Killed { mid_flight: true, ran, finished: None };
    }
    let json = stdout.lines().next().and_then(|l| serde_json::from_str(l).ok()).unwrap_or(Value::Null);
    let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    Killed { mid_flight: false, ran, finished: Some((status.code().unwrap_or(-1), json, stderr)) }
}

/// Runs `oncebox ARGS` to its end, off the runtime's workers (the provider keeps serving).
async fn run_cli(args: Vec<String>) -> (i32, Value, String) {
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        oncebox(&args)
    })
    .await
    .expect("the CLI thread")
}

/// Records a `call`'s answer, or a problem if the process did not run as a call should.
fn record_call(step: &mut Step, phase: &str, (code, json, stderr): (i32, Value, String), problems: &mut Vec<String>) {
    let status = json["status"].as_str().map(str::to_string);
    match (code, status) {
        (0 | 1, Some(status)) => {
            if (code == 0) != (status == "completed") {
                problems.push(format!("{}: {phase} exit code {code} with status {status}: {json}", step.step));
            }
            step.seen.push(format!("{phase}:{status}"));
            step.statuses.push(status);
        }
        _ => {
            step.seen.push(format!("{phase}:exit-{code}"));
            problems.push(format!("{}: {phase} exited {code}, stdout {json}, stderr:\n{stderr}", step.step));
        }
    }
}

// Multi-threaded: the provider serves on the runtime while the CLI runs on blocking threads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_killed_at_random_moments_never_commit_a_step_twice() {
    let began = Instant::now();
    let seed = std::env::var("ONCEBOX_KILL_SEED")
        .ok()
        .map(|s| s.trim().parse::<u64>().expect("ONCEBOX_KILL_SEED is a u64"))
        .unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
        });
    eprintln!("kill: seed={seed} (replay the same choices with ONCEBOX_KILL_SEED={seed})");
    let mut rng = Rng(seed);

    let provider = Provider::start().await.expect("provider");
    provider.set_stock("sku-1", 1_000);
    let dir = tempfile::tempdir().expect("dir");
    let ledger = dir.path().join("ledger.redb");
    let host = provider.addr();
    let hosts = format!("[hosts.\"{host}\"]\ntimeout = \"{TIMEOUT_MS}ms\"\nsettle_window = \"{SETTLE_MS}ms\"\n");
    let policies = Policies { plain: dir.path().join("plain.toml"), keyed: dir.path().join("keyed.toml") };
    std::fs::write(&policies.plain, &hosts).expect("policy");
    std::fs::write(&policies.keyed, format!("{hosts}honours_keys = true\nkey_retention = \"24h\"\n")).expect("policy");

    // Compile the components into the cache first, so no kill lands in a compilation.
    for tool in [Tool::Charge, Tool::Refund, Tool::Fulfill] {
        let (code, _, stderr) = run_cli(vec!["inspect".into(), tool.artifact().into()]).await;
        assert_eq!(code, 0, "{stderr}");
    }

    let mut problems = Vec::new();
    let mut steps: Vec<Step> = (0..STEPS)
        .map(|i| {
            let tool = [Tool::Charge, Tool::Refund, Tool::Fulfill][rng.below(3) as usize];
            let declared = [Declared::Nothing, Declared::Flag, Declared::Policy][rng.below(3) as usize];
            Step {
                step: format!("step-{i}"),
                order: format!("o-{i}"),
                tool,
                fault: pick_fault(&mut rng),
                declared,
                kill_after_ms: rng.below(KILL_WINDOW_MS + 1),
                killed: false,
                ran_ms: 0,
                seen: Vec::new(),
                statuses: Vec::new(),
                not_committed_at: Vec::new(),
            }
        })
        .collect();

    // The killing phase: one process at a time (a redb ledger belongs to one process).
    for step in &mut steps {
        if let Some((kind, times)) = &step.fault {
            provider.arm(Fault::new(step.tool.route(), kind.clone()).for_order(&step.order).times(*times));
        }
        let mut args = vec!["call".to_string()];
        args.extend(flags(step, &ledger, &policies, &provider));
        let stderr_path = dir.path().join(format!("{}.stderr", step.step));
        let after = Duration::from_millis(step.kill_after_ms);
        let killed =
            tokio::task::spawn_blocking(move || run_and_kill(args, stderr_path, after)).await.expect("the kill thread");
        step.killed = killed.mid_flight;
        step.ran_ms = killed.ran.as_millis() as u64;
        match killed.finished {
            Some(finished) => record_call(step, "first", finished, &mut problems),
            None => step.seen.push("first:killed".into()),
        }
    }

    // The downstream recovers: nothing more is faulted, every delayed commit has landed, and the
    // settle window has passed, so a lookup that finds nothing is proof.
    provider.clear_faults();
    provider.settled().await;
    tokio::time::sleep(oncebox::DEFAULT_SEND_BY + Duration::from_millis(SETTLE_MS + TIMEOUT_MS + 100)).await;

    // The orchestrator calls every step again; what is unknown is reconciled and called once more.
    for step in &mut steps {
        let same = flags(step, &ledger, &policies, &provider);
        let call: Vec<String> = std::iter::once("call".to_string()).chain(same.iter().cloned()).collect();
        record_call(step, "again", run_cli(call.clone()).await, &mut problems);
        if step.statuses.last().map(String::as_str) != Some("unknown") {
            continue;
        }
        if step.tool.reconciles() {
            let reconcile = std::iter::once("reconcile".to_string()).chain(same.iter().cloned()).collect();
            let (code, json, stderr) = run_cli(reconcile).await;
            match (code, json["result"].as_str()) {
                (0 | 1, Some(result)) => {
                    // When a `not-committed` answer would start to count, if that is why it is still unknown.
                    let counts_in = json["counts_from_ms"].as_u64().map(|at| {
                        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
                        format!("(counts in {}ms)", at.saturating_sub(now.map_or(0, |d| d.as_millis() as u64)))
                    });
                    step.seen.push(format!("reconcile:{result}{}", counts_in.unwrap_or_default()));
                    if result == "committed" {
                        let status = json["outcome"]["status"].as_str().unwrap_or("?").to_string();
                        step.statuses.push(status);
                    }
                    if result == "not-committed" {
                        step.not_committed_at.push(step.tool.commits(&provider.counts(&step.order)));
                    }
                }
                _ => {
                    step.seen.push(format!("reconcile:exit-{code}"));
                    problems.push(format!("{}: reconcile exited {code}, stdout {json}, stderr:\n{stderr}", step.step));
                }
            }
        }
        record_call(step, "last", run_cli(call).await, &mut problems);
    }
    provider.settled().await;

    // The provider's counts, against the invariants, for every step.
    let mut mid_flight = 0;
    for step in &steps {
        let commits = step.tool.commits(&provider.counts(&step.order));
        let summary = step.summary(commits);
        eprintln!("kill: {summary}");
        mid_flight += u64::from(step.killed);
        if commits > 1 {
            problems.push(format!("more than one commit for one step: {summary}"));
        }
        if step.statuses.iter().any(|s| s == "completed") && commits != 1 {
            problems.push(format!("completed, but not exactly one commit: {summary}"));
        }
        if step.statuses.iter().any(|s| s == "failed") && commits != 0 {
            problems.push(format!("failed, but committed: {summary}"));
        }
        if step.not_committed_at.iter().any(|&n| n != 0) {
            problems.push(format!("reconciled not-committed while the provider had committed: {summary}"));
        }
    }
    let elapsed = began.elapsed();
    eprintln!("kill: seed={seed} steps={STEPS} killed_mid_flight={mid_flight} took={elapsed:?}");
    assert!(problems.is_empty(), "seed {seed}:\n{}", problems.join("\n"));
    assert!(mid_flight > 0, "seed {seed}: no kill landed while a process was running; the test tested nothing");
}

/// A process SIGKILLed after an effect's answer came back and before its next durable write. On
/// redb the answer rides with that write (`ledger::answer_may_ride`), so the kill loses it and
/// the effect is in doubt, as after a kill between the send and the answer. Counted at the
/// provider, the step is charged once: with nothing declared of the provider's keys it ends
/// unknown without a request; declared to honour keys, it is resent with the same key (the
/// provider replays its commit) and completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_killed_between_an_answer_and_its_next_durable_write_leaves_the_effect_in_doubt() {
    let provider = Provider::start().await.expect("provider");
    let dir = tempfile::tempdir().expect("dir");
    let base = provider.base_url();
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("compile-cache");
    // Compiled once before anything is timed.
    let (code, _, stderr) = run_cli(vec!["inspect".into(), oncebox_artifacts::PANICKY.into()]).await;
    assert_eq!(code, 0, "{stderr}");
    for keyed in [false, true] {
        let ledger = dir.path().join(format!("keyed-{keyed}.redb"));
        let order = format!("rider-{keyed}");
        // The tool charges, reads (which the provider counts, and the ledger does not record), then
        // sleeps: once the read arrives the answer is recorded, and nothing durable follows it.
        let args = json!({
            "mode": "sleep",
            "sleep_ms": 3_000,
            "post": {"url": format!("{base}/payments"), "body": charge(&order)},
            "then_get": format!("{base}/inventory/sku-1"),
        });
        // A run of its own per case: the provider would refuse one key with another body.
        let run = format!("rider-{keyed}");
        let mut call: Vec<String> =
            ["call", "--ledger", path_str(&ledger), "--run", &run, "--step", "charge-then-sleep"]
                .into_iter()
                .map(String::from)
                .collect();
        call.extend(["--grant".into(), format!("http={base}")]);
        if keyed {
            call.extend(["--key-target".into(), provider.addr().to_string()]);
        }
        call.extend([oncebox_artifacts::PANICKY.to_string(), args.to_string()]);

        let mut child = Command::new(env!("CARGO_BIN_EXE_oncebox"))
            .args(&call[..])
            .env("ONCEBOX_CACHE", &cache)
            .stdin(Stdio::null())
            .stdout(Stdio::from(std::fs::File::create(dir.path().join("stdout")).expect("stdout file")))
            .stderr(Stdio::from(std::fs::File::create(dir.path().join("stderr")).expect("stderr file")))
            .spawn()
            .expect("spawn oncebox");
        let output = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap_or_default();
        let stderr = || format!("{}{}", output("stdout"), output("stderr"));
        let (start, reads) = (Instant::now(), provider.reads());
        while provider.reads() == reads {
            if child.try_wait().expect("try_wait").is_some() {
                panic!("keyed {keyed}: the process ended before its read: {}", stderr());
            }
            assert!(start.elapsed() < Duration::from_secs(30), "keyed {keyed}: no read within 30 s");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert!(child.try_wait().expect("try_wait").is_none(), "keyed {keyed}: the process ended before the kill");
        child.kill().expect("kill -9");
        assert_eq!(child.wait().expect("reap").signal(), Some(9));
        assert_eq!(provider.counts(&order).payments, 1);

        // What the disk kept: the write-ahead, not the answer.
        {
            let ledger = oncebox::Ledger::open(&ledger).expect("reopen the ledger");
            let ops = ledger.operations(Some(&run)).await.expect("operations");
            assert_eq!(ops.len(), 1, "{ops:?}");
            let effects = ledger.effects(&ops[0].key).await.expect("effects");
            assert_eq!(effects.len(), 1, "{effects:?}");
            assert!(effects[0].status.in_doubt(), "keyed {keyed}: the answer survived the kill: {effects:?}");
        }

        let requests = provider.requests();
        let (code, json, stderr) = run_cli(call).await;
        let status = json["status"].as_str().unwrap_or_default().to_string();
        if keyed {
            assert_eq!((code, status.as_str()), (0, "completed"), "{json} {stderr}");
            assert_eq!(provider.requests(), requests + 1, "resent once, with its key");
        } else {
            assert_eq!((code, status.as_str()), (1, "unknown"), "{json} {stderr}");
            assert_eq!(provider.requests(), requests, "an effect in doubt was sent again");
        }
        assert_eq!(provider.counts(&order).payments, 1, "keyed {keyed}: charged twice");
    }
}
