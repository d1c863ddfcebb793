//! The background reconciler (`oncebox::reconciler`): unknowns whose proof exists settle without
//! a person, under the rule of evidence, counted at the provider. In the library one pass at a
//! time; `oncebox reconcile --watch` as a process; the server's in `serve/reconciler.rs`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use oncebox::reconciler::{Settings, TryResult};
use oncebox::{Call, HttpTarget, Status};
use oncebox_example_provider::{Fault, FaultKind, Provider, Route, Settings as ProviderSettings};

use crate::support::{Fixture, charge, configure, load_all, now_ms};

/// Asks about everything found at once.
const AT_ONCE: Settings =
    Settings { enabled: true, first: Duration::ZERO, max: Duration::from_secs(60), every: Duration::from_secs(1) };

fn charge_call(order: &str) -> Call {
    Call::step("rec", format!("charge-{order}"), "charge", charge(order).to_string())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_charge_committed_then_answered_502_is_completed_by_one_pass_without_a_person() {
    let f = Fixture::honouring_keys(false).await;
    f.provider.arm(Fault::new(Route::Payments, FaultKind::CommitThenError { status: 502 }).for_order("g1"));
    let first = f.host.call(charge_call("g1")).await.expect("call");
    assert_eq!(first.status, Status::Unknown, "{first:?}");
    let key = first.operation_key.clone().expect("key");

    let mut reconciler = f.host.reconciler(AT_ONCE);
    let tries = reconciler.pass().await.expect("pass");
    assert_eq!(tries.len(), 1, "{tries:?}");
    assert_eq!((tries[0].result, tries[0].tries, tries[0].next_try_ms), (TryResult::Committed, 1, None));
    assert_eq!(tries[0].operation_key, key);
    assert_eq!(tries[0].tool, "charge");
    let op = f.host.ledger().operation(&key).await.expect("read").expect("recorded");
    assert_eq!(op.status, oncebox::ledger::OperationStatus::Completed);
    // Settled: it drops out, and nothing more is asked.
    assert!(reconciler.pass().await.expect("pass").is_empty());
    assert_eq!(reconciler.scheduled(), 0);
    let again = f.host.call(charge_call("g1")).await.expect("call");
    assert_eq!((again.status, again.replayed), (Status::Completed, true));
    f.provider.settled().await;
    assert_eq!(f.provider.counts("g1").payments, 1, "one charge, proven, never resent");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_empty_lookup_inside_the_settle_window_is_asked_again_only_after_it_and_never_fails() {
    let f = Fixture::honouring_keys(false).await;
    // The lookup index lags the writes by far longer than the test: every lookup answers 404.
    f.provider.configure(ProviderSettings { honour_keys: false, lookup_lag_ms: 600_000, ..Default::default() });
    f.provider.arm(Fault::new(Route::Payments, FaultKind::CommitThenError { status: 502 }).for_order("l1"));
    let first = f.host.call(charge_call("l1")).await.expect("call");
    assert_eq!(first.status, Status::Unknown, "{first:?}");
    let key = first.operation_key.clone().expect("key");

    let mut reconciler = f.host.reconciler(AT_ONCE);
    let before = now_ms();
    let tries = reconciler.pass().await.expect("pass");
    assert_eq!(tries.len(), 1, "{tries:?}");
    assert_eq!(tries[0].result, TryResult::StillUnknown, "{tries:?}");
    assert!(tries[0].reason.as_deref().is_some_and(|r| r.contains("settle window")), "{tries:?}");
    // Not before the settle window (5 min by default) has passed since the send ended: only then
    // could a `not-committed` count, and the backoff alone would have asked within 2 s.
    let next = tries[0].next_try_ms.expect("asked again");
    assert!(next >= before + oncebox::DEFAULT_SETTLE_WINDOW.as_millis() as u64, "next try at {next}, now {before}");
    assert!(reconciler.pass().await.expect("pass").is_empty(), "not due");
    assert_eq!(reconciler.scheduled(), 1);
    let op = f.host.ledger().operation(&key).await.expect("read").expect("recorded");
    assert_eq!(op.status, oncebox::ledger::OperationStatus::Unknown, "an empty lookup proves nothing yet");
    // The try is recorded on the operation, with why it proved nothing.
    let noted = op.reconciled.expect("the try is recorded");
    assert_eq!((noted.tries, noted.result.as_str()), (1, "still-unknown"));
    assert!(noted.reason.is_some_and(|r| r.contains("settle window")));
    f.provider.settled().await;
    assert_eq!(f.provider.counts("l1").payments, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn proven_not_taken_after_the_settle_window_reopens_the_step_whose_next_call_charges_once() {
    let dir = tempfile::tempdir().expect("dir");
    let provider = Provider::start().await.expect("provider");
    provider.configure(ProviderSettings { honour_keys: false, ..Default::default() });
    // A downstream whose lookups are exact once it answered, a short send deadline: a
    // `not-committed` counts 3 s after the send's write-ahead (two seconds to leave, one to be
    // answered). Not shorter: on a loaded machine (builds beside the suite) a send or a lookup
    // must still be answered within its timeout, or the step stays unknown and the next call is
    // not the one this test means.
    let target = HttpTarget { timeout: Duration::from_secs(1), settle_window: Duration::ZERO, ..HttpTarget::default() };
    let host = configure(oncebox::Host::builder(dir.path().join("ledger.redb")), &provider, false)
        .http_target(provider.addr().to_string(), target)
        .send_deadline(Duration::from_secs(2))
        .build()
        .await
        .expect("host");
    load_all(&host).await;
    provider.arm(Fault::new(Route::Payments, FaultKind::ErrorBeforeCommit).for_order("n1"));
    let first = host.call(charge_call("n1")).await.expect("call");
    assert_eq!(first.status, Status::Unknown, "a 500 from a host that does not honour keys: {first:?}");
    let key = first.operation_key.clone().expect("key");

    let mut reconciler = host.reconciler(AT_ONCE);
    let mut seen = Vec::new();
    // Passes until the lookup may count (3 s), with room for a loaded machine.
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while std::time::Instant::now() < until {
        let tries = reconciler.pass().await.expect("pass");
        seen.extend(tries.iter().map(|t| t.result));
        if seen.contains(&TryResult::NotCommitted) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(seen.last(), Some(&TryResult::NotCommitted), "{seen:?}");
    assert!(seen.iter().all(|r| matches!(r, TryResult::StillUnknown | TryResult::NotCommitted)), "{seen:?}");
    let op = host.ledger().operation(&key).await.expect("read").expect("recorded");
    assert_eq!(op.status, oncebox::ledger::OperationStatus::Claimed, "reopened for its next call");
    assert_eq!(provider.counts("n1").payments, 0);
    let again = host.call(charge_call("n1")).await.expect("call");
    assert_eq!(again.status, Status::Completed, "{again:?}");
    provider.settled().await;
    assert_eq!(provider.counts("n1").payments, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn two_reconcilers_racing_on_one_operation_record_one_settlement_and_neither_fails() {
    let f = Fixture::honouring_keys(false).await;
    for order in ["r1", "r2", "r3"] {
        f.provider.arm(Fault::new(Route::Payments, FaultKind::CommitThenError { status: 502 }).for_order(order));
        let first = f.host.call(charge_call(order)).await.expect("call");
        assert_eq!(first.status, Status::Unknown, "{first:?}");
    }
    let (mut a, mut b) = (f.host.reconciler(AT_ONCE), f.host.reconciler(AT_ONCE));
    // Racing passes until nothing is unknown. On a loaded machine a lookup can outlast the
    // effect timeout, and that try proves nothing (still unknown): the two ask again.
    let mut tries = Vec::new();
    for _ in 0..50 {
        let (ta, tb) = tokio::join!(a.pass(), b.pass());
        tries.extend(ta.expect("pass").into_iter().chain(tb.expect("pass")));
        let ops = f.host.ledger().operations(None).await.expect("read");
        if ops.iter().all(|op| op.status != oncebox::ledger::OperationStatus::Unknown) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for order in ["r1", "r2", "r3"] {
        let key = f.host.call(charge_call(order)).await.expect("call").operation_key.expect("key");
        let of: Vec<TryResult> = tries.iter().filter(|t| t.operation_key == key).map(|t| t.result).collect();
        // The ledger's resolve is a compare-and-set: the loser is told someone else settled it.
        assert_eq!(of.iter().filter(|r| **r == TryResult::Committed).count(), 1, "{order}: {of:?}");
        assert!(
            of.iter()
                .all(|r| matches!(r, TryResult::Committed | TryResult::SettledElsewhere | TryResult::StillUnknown)),
            "{of:?}"
        );
        assert_eq!(f.provider.counts(order).payments, 1);
    }
    assert!(a.pass().await.expect("pass").is_empty() && b.pass().await.expect("pass").is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn only_unknowns_of_loaded_tools_that_export_reconcile_are_asked_about() {
    let f = Fixture::honouring_keys(false).await;
    // `refund` is idempotent-write: no `reconcile` export. Its unknown waits for a person.
    f.provider.arm(Fault::new(Route::Refunds, FaultKind::CommitThenError { status: 502 }).for_order("x1"));
    let args = serde_json::json!({"order_id": "x1", "amount_cents": 1200}).to_string();
    let refund = f.host.call(Call::step("rec", "refund-x1", "refund", args)).await.expect("call");
    assert_eq!(refund.status, Status::Unknown, "{refund:?}");
    f.provider.arm(Fault::new(Route::Payments, FaultKind::CommitThenError { status: 502 }).for_order("x2"));
    let charged = f.host.call(charge_call("x2")).await.expect("call");
    assert_eq!(charged.status, Status::Unknown, "{charged:?}");

    // `charge` is not loaded any more: nothing is asked.
    assert!(f.host.unload("charge"));
    let mut reconciler = f.host.reconciler(AT_ONCE);
    assert!(reconciler.pass().await.expect("pass").is_empty());
    assert_eq!(reconciler.scheduled(), 0);
    // Loaded again: the charge is asked about, the refund still not.
    f.host.load(oncebox_artifacts::CHARGE).await.expect("load");
    let tries = reconciler.pass().await.expect("pass");
    assert_eq!(
        tries.iter().map(|t| (t.tool.as_str(), t.result)).collect::<Vec<_>>(),
        [("charge", TryResult::Committed)]
    );
    assert_eq!(reconciler.scheduled(), 0);
    let key = refund.operation_key.expect("key");
    let op = f.host.ledger().operation(&key).await.expect("read").expect("recorded");
    assert_eq!(op.status, oncebox::ledger::OperationStatus::Unknown);
}

/// `oncebox reconcile --watch`: started on a ledger with an unknown charge, it settles it, prints
/// the try as a line of JSON, and ends cleanly on SIGTERM.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn reconcile_watch_settles_an_unknown_prints_the_try_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().expect("dir");
    let provider = Provider::start().await.expect("provider");
    provider.arm(Fault::new(Route::Payments, FaultKind::CommitThenError { status: 502 }).for_order("w1"));
    let base = provider.base_url();
    let tools = dir.path().join("tools");
    std::fs::create_dir(&tools).expect("tools");
    for (name, artifact) in [("charge", oncebox_artifacts::CHARGE), ("refund", oncebox_artifacts::REFUND)] {
        std::fs::copy(artifact, tools.join(format!("{name}.wasm"))).expect("copy");
    }
    let policy = dir.path().join("oncebox.toml");
    let mut text = String::new();
    for tool in ["charge", "refund"] {
        text.push_str(&format!(
            "[tools.{tool}.config]\nbase_url = \"{base}\"\n[tools.{tool}.grants]\nhttp = [\"{base}\"]\n"
        ));
    }
    text.push_str("[reconciler]\nfirst = \"100ms\"\nevery = \"200ms\"\n");
    std::fs::write(&policy, text).expect("policy");
    let ledger = dir.path().join("ledger.redb");
    let path = |p: &std::path::Path| p.to_str().expect("utf8").to_string();
    let (ledger_s, policy_s, tools_s) = (path(&ledger), path(&policy), path(&tools));
    let charge_args = charge("w1").to_string();
    let (code, printed, stderr) = crate::support::oncebox(&[
        "call",
        "--ledger",
        &ledger_s,
        "--policy",
        &policy_s,
        "--run",
        "watch",
        "--step",
        "charge-w1",
        oncebox_artifacts::CHARGE,
        &charge_args,
    ]);
    assert_eq!((code, printed["status"].as_str()), (1, Some("unknown")), "{printed} {stderr}");
    let key = printed["operation_key"].as_str().expect("key").to_string();

    // Narrowing flags are refused: --watch is about every unknown.
    let (code, _, stderr) =
        crate::support::oncebox(&["reconcile", "--watch", "--ledger", &ledger_s, "--tools", &tools_s, "--run", "x"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("drop --run"), "{stderr}");

    let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("compile-cache");
    let mut child = Command::new(env!("CARGO_BIN_EXE_oncebox"))
        .args(["reconcile", "--watch", "--ledger", &ledger_s, "--tools", &tools_s, "--policy", &policy_s])
        .env("ONCEBOX_CACHE", &cache)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn oncebox reconcile --watch");
    let stdout = child.stdout.take().expect("stdout");
    let (lines, seen) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let mut tried = serde_json::Value::Null;
    while let Ok(line) = seen.recv_timeout(Duration::from_secs(30)) {
        tried = serde_json::from_str(&line).expect("a line of JSON");
        if tried["operation_key"] == key.as_str() && tried["result"] == "committed" {
            break;
        }
    }
    assert_eq!(tried["result"], "committed", "{tried}");
    assert_eq!(tried["tool"], "charge", "{tried}");
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("kill");
    assert!(status.success());
    let exited = child.wait_with_output().expect("wait");
    assert_eq!(exited.status.code(), Some(0), "{}", String::from_utf8_lossy(&exited.stderr));

    // The ledger is free again: the step answers completed from it, the charge was made once.
    let (code, printed, stderr) = crate::support::oncebox(&[
        "call",
        "--ledger",
        &ledger_s,
        "--policy",
        &policy_s,
        "--run",
        "watch",
        "--step",
        "charge-w1",
        oncebox_artifacts::CHARGE,
        &charge_args,
    ]);
    let answered = (code, printed["status"].as_str(), printed["replayed"].as_bool());
    assert_eq!(answered, (0, Some("completed"), Some(true)), "{printed} {stderr}");
    provider.settled().await;
    assert_eq!(provider.counts("w1").payments, 1);
}
