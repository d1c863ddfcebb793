//! Compensation waits for a step in flight: a run's step claimed and still running (recorded or
//! not yet, on this host or another) keeps the run open by the ledger's one rule, so `compensate`
//! does not undo step 1 while step 2 is about to charge. Refunds are counted at the provider.

use std::time::Duration;

use oncebox::saga::SagaState;
use oncebox::{Call, Host, HostBuilder, Status};
use oncebox_example_provider::{Fault, FaultKind, ProviderHandle, Route};
use serde_json::json;

use crate::support::{Fixture, charge, configure, eventually, load_all};

/// Long enough for `compensate` to look while the provider holds the request, short of the
/// host's effect timeout (`support::EFFECT_TIMEOUT`), so that the step completes.
const HELD: Duration = Duration::from_millis(1_000);

fn step(run: &str, step: &str, tool: &str, args: &serde_json::Value) -> Call {
    Call::step(run, step, tool, args.to_string())
}

/// Step 1 charges `o-1`; step 2 charges `o-2` on `runner` while the provider holds it;
/// `compensator` compensates meanwhile: blocked, naming step 2, no refund. After step 2 completes,
/// compensating refunds both, once each.
async fn the_second_charge_in_flight_blocks_compensation(runner: &Host, compensator: &Host, provider: &ProviderHandle) {
    let first = runner.call(step("r", "1-pay", "charge", &charge("o-1"))).await.expect("call");
    assert_eq!(first.status, Status::Completed, "{first:?}");
    provider.arm(Fault::new(Route::Payments, FaultKind::Delay { delay_ms: HELD.as_millis() as u64 }).for_order("o-2"));
    let second = tokio::spawn({
        let runner = runner.clone();
        async move { runner.call(step("r", "2-pay", "charge", &charge("o-2"))).await.expect("call") }
    });
    // Committed at the provider, its answer held back: the step is in flight.
    eventually("the second charge reached the provider", || provider.counts("o-2").payments == 1).await;
    let blocked = compensator.compensate("r").await.expect("compensate");
    assert_eq!(blocked.state, SagaState::Blocked, "{blocked:?}");
    let blocking: Vec<(&str, &str)> = blocked.steps.iter().map(|s| (s.step_id.as_str(), s.action)).collect();
    assert_eq!(blocking, [("2-pay", "blocking")], "{blocked:?}");
    assert!(blocked.steps[0].reason.as_deref().is_some_and(|r| r.contains("in progress")), "{blocked:?}");
    assert_eq!((provider.counts("o-1").refunds, provider.counts("o-2").refunds), (0, 0), "nothing refunded");
    assert!(!second.is_finished(), "the look happened while the charge was held");

    let second = second.await.expect("join");
    assert_eq!(second.status, Status::Completed, "{second:?}");
    let done = compensator.compensate("r").await.expect("compensate");
    assert_eq!(done.state, SagaState::Done, "{done:?}");
    let undone: Vec<(&str, &str)> = done.steps.iter().map(|s| (s.step_id.as_str(), s.action)).collect();
    assert_eq!(undone, [("2-pay", "compensated"), ("1-pay", "compensated")], "reverse order");
    let again = compensator.compensate("r").await.expect("compensate");
    assert_eq!(again.state, SagaState::Done, "{again:?}");
    assert_eq!((provider.counts("o-1").refunds, provider.counts("o-2").refunds), (1, 1), "each refunded once");
    assert_eq!((provider.counts("o-1").payments, provider.counts("o-2").payments), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_in_flight_blocks_compensation_until_it_completes_then_both_are_refunded_once() {
    let f = Fixture::new().await;
    the_second_charge_in_flight_blocks_compensation(&f.host, &f.host, &f.provider).await;
}

/// On PostgreSQL, across hosts: one host runs the charge, another compensates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_shared_ledger_another_host_s_charge_in_flight_blocks_compensation() {
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let (url, dir) = (crate::pg::fresh_database().await, tempfile::tempdir().expect("dir"));
    let host = |key: std::path::PathBuf| {
        let url = url.clone();
        let provider = provider.clone();
        async move {
            let ledger = oncebox::Ledger::connect(&url).await.expect("connect");
            let builder = configure(HostBuilder::on_ledger(ledger), &provider, true).key_file(key);
            let host = builder.build().await.expect("build host");
            load_all(&host).await;
            host
        }
    };
    let key = dir.path().join("hosts.key");
    let (runner, compensator) = (host(key.clone()).await, host(key).await);
    the_second_charge_in_flight_blocks_compensation(&runner, &compensator, &provider).await;
}

/// A step claimed and not yet recorded (a read holds it: reads write nothing, so its claim is in
/// memory only) keeps the run open all the same: compensation waits for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_claimed_and_not_yet_recorded_blocks_compensation() {
    let f = Fixture::new().await;
    assert_eq!(f.call("r", "1-pay", "charge", &charge("o-1")).await.status, Status::Completed);
    let delay_ms = HELD.as_millis() as u64;
    f.provider.arm(Fault::new(Route::Inventory, FaultKind::Delay { delay_ms }).for_sku("sku-1"));
    let reads = f.provider.reads();
    let look = tokio::spawn({
        let host = f.host.clone();
        async move { host.call(step("r", "2-look", "stock", &json!({"sku": "sku-1"}))).await.expect("call") }
    });
    eventually("the read reached the provider", || f.provider.reads() > reads).await;
    let key = oncebox::keys::operation_key("r", "2-look", "stock");
    assert!(f.host.ledger().operation(&key).await.expect("read").is_none(), "nothing of it is recorded");
    let flying = f.host.ledger().in_flight(Some("r")).await.expect("in flight");
    assert_eq!(flying.iter().map(|op| op.step_id.as_str()).collect::<Vec<_>>(), ["2-look"]);

    let blocked = f.host.compensate("r").await.expect("compensate");
    assert_eq!(blocked.state, SagaState::Blocked, "{blocked:?}");
    assert_eq!(blocked.steps.iter().map(|s| s.step_id.as_str()).collect::<Vec<_>>(), ["2-look"], "{blocked:?}");
    assert_eq!(f.provider.counts("o-1").refunds, 0);
    // The rule's other readers see it too: recovery's report and gc.
    let recovered = oncebox::recovery::report(f.host.ledger(), Some("r")).await.expect("report");
    assert_eq!(recovered["r"].in_progress.iter().map(|s| s.step_id.as_str()).collect::<Vec<_>>(), ["2-look"]);
    tokio::time::sleep(Duration::from_millis(5)).await;
    let gc = f.host.gc(Duration::ZERO).await.expect("gc");
    assert_eq!(gc.removed_operations, 0, "an open run keeps every record: {gc:?}");

    assert_eq!(look.await.expect("join").status, Status::Completed);
    let done = f.host.compensate("r").await.expect("compensate");
    assert_eq!(done.state, SagaState::Done, "{done:?}");
    assert_eq!(f.provider.counts("o-1").refunds, 1);
}

/// A compensation that is blocked changes nothing: a step whose owner is gone is taken over and
/// ended only once nothing else blocks the run (ended, it would answer `failed` for good to a run
/// that was never undone).
#[tokio::test]
async fn a_blocked_compensation_leaves_an_abandoned_step_as_it_was() {
    let f = Fixture::honouring_keys(false).await;
    assert_eq!(f.call("r", "1-pay", "charge", &charge("o-1")).await.status, Status::Completed);
    // 2-pay: its answer lost, then settled not committed by a person: reopened, claimed by nobody.
    f.provider.arm(Fault::new(Route::Payments, FaultKind::ErrorBeforeCommit).for_order("o-2"));
    let lost = f.call("r", "2-pay", "charge", &charge("o-2")).await;
    let key2 = lost.operation_key.clone().expect("key");
    f.host.resolve(&key2, None, &oncebox::ledger::Resolution::NotCommitted, "ops", None).await.expect("settle");
    // 3-pay: unknown, which blocks the run.
    f.provider.arm(Fault::new(Route::Payments, FaultKind::ErrorBeforeCommit).for_order("o-3"));
    assert_eq!(f.call("r", "3-pay", "charge", &charge("o-3")).await.status, Status::Unknown);

    let report = f.host.compensate("r").await.expect("compensate");
    assert_eq!(report.state, SagaState::Blocked, "{report:?}");
    assert!(report.steps.iter().all(|s| s.action == "blocking"), "nothing was done: {report:?}");
    f.provider.clear_faults();
    let retry = f.call("r", "2-pay", "charge", &charge("o-2")).await;
    assert_eq!(retry.status, Status::Completed, "the step still runs when called: {retry:?}");
    assert_eq!(f.provider.counts("o-2").payments, 1);
    assert_eq!(f.provider.totals().refunds, 0, "nothing refunded by a blocked compensation");
}

/// A step whose owner is gone after it sent a charge and before it recorded the attempt: the
/// compensation takes it over and ends it unknown (the charge may have gone through), and the
/// attempt it records for the gone owner lists that charge, by the take-over's rule
/// (`rules::unrecorded_sends`): the record says what the attempt sent.
#[tokio::test]
async fn a_compensation_closing_an_abandoned_step_records_what_its_attempt_sent() {
    use oncebox::ledger::{Claim, ClaimRequest, EffectStatus};
    let f = Fixture::new().await;
    let ledger = f.host.ledger();
    let key = oncebox::keys::operation_key("r", "2-pay", "charge");
    let gone = ClaimRequest {
        key: key.clone(),
        run_id: "r".into(),
        step_id: "2-pay".into(),
        tool: "charge".into(),
        class: oncebox::ReplayClass::Compensatable,
        fingerprint: "args".into(),
        older_fingerprints: Vec::new(),
        args: json!({}),
        owner: "a-host-that-is-gone".into(),
        // Its lease ended long ago.
        now_ms: ledger.now_ms() - 60_000,
        lease_ms: 1_000,
        approval: None,
        sealed: None,
    };
    let Claim::Owned { fence, .. } = ledger.claim(&gone).await.expect("claim") else { panic!("not owned") };
    // Its first attempt wrote the charge ahead and sent it; nothing else of it was recorded.
    let mut sent = crate::conformance::effect(&key, 1, EffectStatus::Dispatched, 1);
    sent.attempt = 1;
    ledger.put_effect(fence, &sent, None, Vec::new()).await.expect("write-ahead");

    let report = f.host.compensate("r").await.expect("compensate");
    // Closed unknown, it blocks the run until a person or a reconcile settles it.
    let steps: Vec<(&str, &str)> = report.steps.iter().map(|s| (s.step_id.as_str(), s.action)).collect();
    assert_eq!(steps, [("2-pay", "blocking")], "{report:?}");
    assert!(report.steps[0].reason.as_deref().is_some_and(|r| r.contains("in doubt")), "{report:?}");
    let op = ledger.operation(&key).await.expect("read").expect("recorded");
    assert_eq!(op.status, oncebox::ledger::OperationStatus::Unknown, "the charge may have gone through: {op:?}");
    let attempts = ledger.attempts(&key).await.expect("attempts");
    let listed: Vec<&str> = attempts.iter().flat_map(|a| a.effects.iter().map(|e| e.key.as_str())).collect();
    assert_eq!(listed, [sent.key.as_str()], "the gone owner's attempt lists its charge: {attempts:?}");
}
