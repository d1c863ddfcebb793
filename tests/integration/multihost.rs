//! Many hosts, one ledger: separate `oncebox` processes on one PostgreSQL database (a throwaway
//! cluster, `pg/mod.rs`), each its own host with its own connection pool, sharing one key file. Every
//! effect is counted at the example provider, never where oncebox believes it went.
#![cfg(unix)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use oncebox_example_provider::{Fault, FaultKind, Provider, ProviderHandle, Route};
use serde_json::Value;

use crate::support::{charge, eventually};

/// A lease short enough that a test waits it out, long enough that a live process renews it.
const LEASE_MS: &str = "1500";

/// A database of the test cluster, the key file its hosts share, and the provider they charge.
struct Hosts {
    /// `--lease-ms` of every process (`LEASE_MS` unless a test gives its own).
    lease_ms: &'static str,
    url: String,
    key: PathBuf,
    provider: ProviderHandle,
    dir: tempfile::TempDir,
}

async fn hosts() -> Hosts {
    let dir = tempfile::tempdir().expect("dir");
    let provider = Provider::start().await.expect("provider");
    Hosts {
        lease_ms: LEASE_MS,
        url: crate::pg::fresh_database().await,
        key: dir.path().join("hosts.key"),
        provider,
        dir,
    }
}

impl Hosts {
    /// One `oncebox call` (or `reconcile`) of the charge tool for `step` of `order`, as a process.
    fn spawn(&self, command: &str, step: &str, order: &str, extra: &[&str]) -> Child {
        self.spawn_keyed(&self.key, command, step, order, extra)
    }

    /// The same, as a host given the key file `key`.
    fn spawn_keyed(&self, key: &Path, command: &str, step: &str, order: &str, extra: &[&str]) -> Child {
        let base = self.provider.base_url();
        let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("compile-cache");
        let mut args: Vec<String> =
            [command, "--ledger", &self.url, "--run", "multi", "--step", step, "--lease-ms", self.lease_ms]
                .into_iter()
                .map(String::from)
                .collect();
        args.extend(["--config".into(), format!("base_url={base}"), "--grant".into(), format!("http={base}")]);
        args.extend(extra.iter().map(|s| s.to_string()));
        args.extend([oncebox_artifacts::CHARGE.to_string(), charge(order).to_string()]);
        Command::new(env!("CARGO_BIN_EXE_oncebox"))
            .args(&args)
            .env("ONCEBOX_CACHE", &cache)
            .env("ONCEBOX_KEY_FILE", key)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn oncebox")
    }

    /// The same as a process whose own clock runs `skew` ahead (libfaketime; the monotonic clock
    /// left alone, so its timers are true).
    fn spawn_skewed(&self, skew: &str, command: &str, step: &str, order: &str) -> Child {
        let base = self.provider.base_url();
        let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("compile-cache");
        let library = Path::new("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1");
        crate::support::require(&format!("libfaketime ({})", library.display()), library.exists(), "faketime");
        Command::new(env!("CARGO_BIN_EXE_oncebox"))
            .args([command, "--ledger", &self.url, "--run", "multi", "--step", step, "--lease-ms", self.lease_ms])
            .args(["--config", &format!("base_url={base}"), "--grant", &format!("http={base}")])
            .args([oncebox_artifacts::CHARGE.to_string(), charge(order).to_string()])
            .env("LD_PRELOAD", library)
            .env("FAKETIME", skew)
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
            .env("ONCEBOX_CACHE", &cache)
            .env("ONCEBOX_KEY_FILE", &self.key)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn oncebox")
    }

    fn call(&self, step: &str, order: &str, extra: &[&str]) -> (i32, Value, String) {
        finish(self.spawn("call", step, order, extra))
    }

    /// The provider's own count of `order`'s charges.
    fn charges(&self, order: &str) -> u64 {
        self.provider.counts(order).payments
    }
}

/// Waits for a process; its exit code, the JSON it printed first and its stderr.
fn finish(child: Child) -> (i32, Value, String) {
    let output = child.wait_with_output().expect("wait for oncebox");
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    let json = stdout.lines().next().and_then(|l| serde_json::from_str(l).ok()).unwrap_or(Value::Null);
    (output.status.code().unwrap_or(-1), json, String::from_utf8_lossy(&output.stderr).to_string())
}

/// Runs SQL as the cluster's superuser on its maintenance database (not the ledger's, which the
/// statements may close).
async fn admin(url: &str, sql: &str) {
    let maintenance = url.rsplit_once('/').map(|(server, _)| format!("{server}/postgres")).expect("a database URL");
    let (client, connection) = tokio_postgres::connect(&maintenance, tokio_postgres::NoTls).await.expect("admin");
    let task = tokio::spawn(connection);
    client.batch_execute(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    drop(client);
    let _ = task.await;
}

fn database_name(url: &str) -> &str {
    url.rsplit_once('/').map(|(_, db)| db.split('?').next().unwrap_or(db)).expect("a database URL")
}

/// Refuses new connections to the ledger's database and ends the ones open: the host is cut off.
async fn cut_off(url: &str) {
    let db = database_name(url);
    admin(
        url,
        &format!(
            "ALTER DATABASE \"{db}\" ALLOW_CONNECTIONS false; \
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{db}';"
        ),
    )
    .await;
}

async fn reconnect(url: &str) {
    admin(url, &format!("ALTER DATABASE \"{}\" ALLOW_CONNECTIONS true;", database_name(url))).await;
}

/// 64 processes call one step at once while the first charge is held at the provider: one
/// charge lands, and every process answers with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_processes_calling_one_step_charge_once() {
    let mut h = hosts().await;
    // What this test asks is that 64 callers of one step make one charge and all get its answer,
    // from a live owner. A 1.5 s lease is a live owner's only while it is never off the CPU for a
    // second: with 64 processes starting beside the rest of the suite on 2 cores, the owner was,
    // and was taken over as a stalled owner (DESIGN section 7), seven times in one run; the
    // answer was then `unknown` (the charge in doubt, not sent again), rightly. A lease a process
    // on a loaded machine keeps is the test's premise, so it is given one; the 1.5 s leases stay
    // for the tests that wait one out.
    h.lease_ms = "10000";
    // One call first: the component is compiled into the cache once, not by 64 processes at once.
    let (code, warm, stderr) = h.call("warm", "o-warm", &[]);
    assert_eq!((code, warm["status"].as_str()), (0, Some("completed")), "{warm} {stderr}");
    // The first charge commits, then its answer is held while the others arrive.
    h.provider.arm(Fault::new(Route::Payments, FaultKind::Delay { delay_ms: 1_500 }).for_order("o-64"));
    let children: Vec<Child> = (0..64).map(|_| h.spawn("call", "charge", "o-64", &["--wait", "60"])).collect();
    let outcomes: Vec<(i32, Value, String)> =
        tokio::task::spawn_blocking(move || children.into_iter().map(finish).collect()).await.expect("join");
    let mut seen = std::collections::BTreeMap::<String, usize>::new();
    for (code, outcome, stderr) in &outcomes {
        let class = outcome["error"]["class"].as_str().unwrap_or("-");
        let line = stderr.lines().last().unwrap_or("");
        *seen.entry(format!("{code} {} {class} {line}", outcome["status"])).or_default() += 1;
    }
    for (code, outcome, stderr) in &outcomes {
        assert_eq!((*code, outcome["status"].as_str()), (0, Some("completed")), "{outcome} {stderr}\n{seen:#?}");
    }
    let fresh = outcomes.iter().filter(|(_, o, _)| o["replayed"] == false).count();
    assert_eq!(fresh, 1, "one process ran the step, 63 were answered from the ledger");
    let keys: std::collections::BTreeSet<&str> =
        outcomes.iter().filter_map(|(_, o, _)| o["output"]["id"].as_str()).collect();
    assert_eq!(keys.len(), 1, "every process answers with the same payment: {keys:?}");
    assert_eq!(h.charges("o-64"), 1, "one charge at the provider");
}

/// A process killed with SIGKILL while its charge is at the provider holds the step until its
/// lease ends; the next process then takes it over, finds the charge in doubt and says unknown
/// instead of charging again; reconciliation asks the provider and completes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_killed_mid_call_leaves_the_step_to_another_after_its_lease_never_charged_twice() {
    let h = hosts().await;
    h.provider.arm(Fault::new(Route::Payments, FaultKind::Delay { delay_ms: 20_000 }).for_order("o-kill"));
    let mut first = h.spawn("call", "charge", "o-kill", &["--timeout-ms", "30000"]);
    eventually("the first process's charge landed", || h.charges("o-kill") == 1).await;
    first.kill().expect("SIGKILL");
    let _ = first.wait();
    // Its lease still holds: another process is told the step is in progress, and dispatches nothing.
    let (_, busy, stderr) = h.call("charge", "o-kill", &[]);
    assert_eq!(busy["status"], "in-progress", "{busy} {stderr}");
    tokio::time::sleep(Duration::from_millis(1_700)).await;
    let (_, taken, stderr) = h.call("charge", "o-kill", &[]);
    assert_eq!(taken["status"], "unknown", "taken over, the charge in doubt is not sent again: {taken} {stderr}");
    assert_eq!(h.charges("o-kill"), 1);
    // The ledger commands read the shared ledger as they read a file.
    let (code, listed, stderr) = crate::support::oncebox(&["ledger", "list", "--ledger", &h.url, "--run", "multi"]);
    assert_eq!(
        (code, listed["step"].as_str(), listed["status"].as_str()),
        (0, Some("charge"), Some("unknown")),
        "{stderr}"
    );
    let (code, report, stderr) = crate::support::oncebox(&["recover", "--ledger", &h.url]);
    assert_eq!(code, 1, "a person (or reconcile) must decide the unknown charge: {report} {stderr}");
    let (code, reconciled, stderr) = finish(h.spawn("reconcile", "charge", "o-kill", &[]));
    assert_eq!(code, 0, "{reconciled} {stderr}");
    let (_, replay, _) = h.call("charge", "o-kill", &[]);
    assert_eq!((replay["status"].as_str(), replay["replayed"].as_bool()), (Some("completed"), Some(true)), "{replay}");
    assert_eq!(h.charges("o-kill"), 1, "one charge at the provider, after all of it");
}

/// Leases are judged by the database's clock: a process whose own clock runs ten minutes ahead
/// does not take over a live owner's step (by its clock the lease ran out long ago); it is told
/// the step is in progress and charges nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_clock_runs_ahead_does_not_take_over_a_live_lease() {
    let h = hosts().await;
    h.provider.configure(oncebox_example_provider::Settings { honour_keys: false, ..Default::default() });
    h.provider.arm(Fault::new(Route::Payments, FaultKind::Delay { delay_ms: 20_000 }).for_order("o-skew"));
    let mut first = h.spawn("call", "charge", "o-skew", &["--timeout-ms", "30000"]);
    eventually("the first process's charge landed", || h.charges("o-skew") == 1).await;
    let (_, ahead, stderr) = finish(h.spawn_skewed("+10m", "call", "charge", "o-skew"));
    assert_eq!(ahead["status"], "in-progress", "the lease is live by the database's clock: {ahead} {stderr}");
    assert_eq!(h.provider.requests(), 1, "only the owner's charge reached the provider");
    assert_eq!(h.charges("o-skew"), 1);
    first.kill().expect("SIGKILL");
    let _ = first.wait();
}

/// A process that cannot reach its database dispatches nothing; one cut off while its charge is
/// at the provider cannot record the answer and stops there, and the step stays in doubt for the
/// others (never charged again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_cut_off_from_its_database_fails_closed() {
    let h = hosts().await;
    let (code, warm, stderr) = h.call("warm", "o-warm", &[]);
    assert_eq!((code, warm["status"].as_str()), (0, Some("completed")), "{warm} {stderr}");

    cut_off(&h.url).await;
    let (code, outcome, stderr) = h.call("before", "o-before", &[]);
    assert_eq!(code, 3, "the host failed, not the tool: {outcome} {stderr}");
    assert!(stderr.contains("postgres://"), "the error names the ledger: {stderr}");
    assert_eq!(h.charges("o-before"), 0, "nothing dispatched without a ledger");
    reconnect(&h.url).await;

    h.provider.arm(Fault::new(Route::Payments, FaultKind::Delay { delay_ms: 3_000 }).for_order("o-cut"));
    let midway = h.spawn("call", "cut", "o-cut", &["--timeout-ms", "10000"]);
    eventually("the charge landed", || h.charges("o-cut") == 1).await;
    cut_off(&h.url).await;
    let (code, outcome, stderr) = tokio::task::spawn_blocking(move || finish(midway)).await.expect("join");
    assert_ne!(
        outcome["status"], "completed",
        "an answer it could not record is not reported done: {outcome} {stderr}"
    );
    assert_ne!(code, 0, "{outcome} {stderr}");
    reconnect(&h.url).await;
    tokio::time::sleep(Duration::from_millis(1_700)).await;
    let (_, after, stderr) = h.call("cut", "o-cut", &[]);
    assert_eq!(after["status"], "unknown", "the charge written ahead is in doubt, not sent again: {after} {stderr}");
    assert_eq!(h.charges("o-cut"), 1, "one charge at the provider");
    assert_eq!(h.charges("o-before"), 0);
}

/// A host given another key file is refused by the database the others use: its fingerprints
/// would never match theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_with_another_key_file_is_refused() {
    let h = hosts().await;
    let (code, first, stderr) = finish(h.spawn_keyed(&h.dir.path().join("a.key"), "call", "one", "o-key", &[]));
    assert_eq!((code, first["status"].as_str()), (0, Some("completed")), "{first} {stderr}");
    let (code, other, stderr) = finish(h.spawn_keyed(&h.dir.path().join("b.key"), "call", "one", "o-key", &[]));
    assert_eq!(code, 3, "{other} {stderr}");
    assert!(stderr.contains("key file"), "the error says why: {stderr}");
    assert_eq!(h.charges("o-key"), 1);
}
