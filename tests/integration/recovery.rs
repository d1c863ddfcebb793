//! A host that stops between the write-ahead record and the answer.

use oncebox::Status;
use oncebox::ledger::{EffectStatus, OperationStatus};
use oncebox_example_provider::{Fault, FaultKind, Provider, Route};

use crate::support::{charge, eventually, host_for};

#[tokio::test]
async fn a_host_dropped_after_dispatch_leaves_unknown_and_the_next_call_dispatches_nothing() {
    let dir = tempfile::tempdir().expect("dir");
    let ledger = dir.path().join("ledger.redb");
    let provider = Provider::start().await.expect("provider");
    // The provider commits, then holds the answer long enough for the host to die waiting.
    provider
        .arm(Fault::new(Route::Payments, FaultKind::Delay { delay_ms: 5_000 }).for_order("o-1"));

    let host = host_for(&ledger, &provider, true).await;
    let call = oncebox::Call::step("run-1", "charge", "charge", charge("o-1").to_string());
    let in_flight = tokio::spawn({
        let host = host.clone();
        async move { host.call(call).await }
    });
    eventually("the provider committed the charge", || {
        provider.counts("o-1").payments == 1
    })
    .await;
    // The process dies: the call is cancelled mid-dispatch and every handle on the ledger goes.
    in_flight.abort();
    assert!(in_flight.await.is_err_and(|e| e.is_cancelled()));
    drop(host);

    let restarted = host_for(&ledger, &provider, true).await;
    let requests = provider.requests();
    let outcome = restarted
        .call(oncebox::Call::step(
            "run-1",
            "charge",
            "charge",
            charge("o-1").to_string(),
        ))
        .await
        .expect("call");
    assert_eq!(outcome.status, Status::Unknown, "{outcome:?}");
    assert!(outcome.replayed, "answered from the ledger");
    assert!(outcome.error.expect("error").message.contains("reconcile"));
    assert_eq!(
        provider.requests(),
        requests,
        "the next call dispatched nothing"
    );
    assert_eq!(provider.counts("o-1").payments, 1);

    let key = outcome.operation_key.expect("key");
    let op = restarted
        .ledger()
        .operation(&key)
        .expect("read")
        .expect("op");
    assert_eq!(op.status, OperationStatus::Unknown);
    let effects = restarted.ledger().effects(&key).expect("effects");
    assert_eq!(effects.len(), 1);
    assert_eq!(effects[0].status, EffectStatus::Unknown);
}

#[tokio::test]
async fn a_ledger_survives_a_restart_and_replays_from_disk() {
    let dir = tempfile::tempdir().expect("dir");
    let ledger = dir.path().join("ledger.redb");
    let provider = Provider::start().await.expect("provider");
    let first = {
        let host = host_for(&ledger, &provider, true).await;
        host.call(oncebox::Call::step(
            "run-1",
            "charge",
            "charge",
            charge("o-1").to_string(),
        ))
        .await
        .expect("call")
    };
    let host = host_for(&ledger, &provider, true).await;
    let again = host
        .call(oncebox::Call::step(
            "run-1",
            "charge",
            "charge",
            charge("o-1").to_string(),
        ))
        .await
        .expect("call");
    assert!(again.replayed);
    assert_eq!(again.output, first.output);
    assert_eq!(provider.counts("o-1").payments, 1);
}

#[tokio::test]
async fn a_second_host_on_an_open_ledger_gets_a_clear_error() {
    let dir = tempfile::tempdir().expect("dir");
    let ledger = dir.path().join("ledger.redb");
    let _first = oncebox::Host::builder(&ledger)
        .build()
        .await
        .expect("first");
    let err = oncebox::Host::builder(&ledger)
        .build()
        .await
        .expect_err("second must fail");
    let message = err.to_string();
    assert!(
        message.contains("open in another process") || message.contains("already open"),
        "{message}"
    );
}

#[tokio::test]
async fn a_corrupt_ledger_file_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().expect("dir");
    let ledger = dir.path().join("ledger.redb");
    std::fs::write(&ledger, vec![0x5a; 8192]).expect("write junk");
    let err = oncebox::Host::builder(&ledger)
        .build()
        .await
        .expect_err("junk is not a ledger");
    assert!(err.to_string().contains("ledger.redb"), "{err}");
    assert_eq!(
        std::fs::read(&ledger).expect("read"),
        vec![0x5a; 8192],
        "the file was left as it was"
    );
}
