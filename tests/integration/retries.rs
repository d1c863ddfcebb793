//! The first retry loop: transient retried to 3 attempts, permanent stops, unknown stops; a trap
//! is the guest's failure, never the host's.

use oncebox::Status;
use oncebox::ledger::OperationStatus;
use serde_json::json;

use crate::support::Fixture;

#[tokio::test]
async fn transient_failures_are_retried_up_to_three_attempts() {
    let f = Fixture::new().await;
    let outcome = f.call("run-1", "s", "panicky", &json!({"mode": "transient"})).await;
    assert_eq!(outcome.status, Status::Failed);
    assert_eq!(outcome.attempts, 3);
    let key = outcome.operation_key.expect("key");
    let attempts = f.host.ledger().attempts(&key).await.expect("attempts");
    assert_eq!(attempts.iter().map(|a| a.attempt).collect::<Vec<_>>(), [1, 2, 3]);
    assert!(attempts.iter().all(|a| a.outcome == "transient" && a.max_attempts == 3));
}

#[tokio::test]
async fn permanent_failures_stop_at_once() {
    let f = Fixture::new().await;
    let outcome = f.call("run-1", "s", "panicky", &json!({"mode": "permanent"})).await;
    assert_eq!(outcome.status, Status::Failed);
    assert_eq!(outcome.attempts, 1);
    assert_eq!(outcome.error.expect("error").class, "permanent");
}

#[tokio::test]
async fn an_unknown_outcome_stops_and_is_recorded_unknown() {
    let f = Fixture::new().await;
    let outcome = f.call("run-1", "s", "panicky", &json!({"mode": "unknown"})).await;
    assert_eq!(outcome.status, Status::Unknown);
    assert_eq!(outcome.attempts, 1);
    let op = f.host.ledger().operation(&outcome.operation_key.expect("key")).await.expect("read").expect("op");
    assert_eq!(op.status, OperationStatus::Unknown);
}

#[tokio::test]
async fn a_trap_leaves_the_host_serving_the_next_call() {
    let f = Fixture::new().await;
    let trapped = f.call("run-1", "boom", "panicky", &json!({"mode": "trap"})).await;
    assert_eq!(trapped.status, Status::Failed);
    let error = trapped.error.expect("error");
    assert_eq!(error.class, "trap");
    assert!(error.message.contains("trapped"), "{}", error.message);
    // The author sees their bug: the end of the guest's stderr, where the panic's message is.
    assert!(
        error.message.contains("its stderr ended with") && error.message.contains("asked to trap"),
        "{}",
        error.message
    );

    let next = f.call("run-1", "fine", "panicky", &json!({"mode": "ok", "echo": "still here"})).await;
    assert_eq!(next.status, Status::Completed, "{next:?}");
    assert_eq!(next.output.expect("output")["echo"], "still here");
    let charged = f.call("run-1", "charge", "charge", &crate::support::charge("o-1")).await;
    assert!(charged.is_completed());
}

#[tokio::test]
async fn a_memory_bomb_is_stopped_at_the_limit_and_not_retried() {
    let f = Fixture::new().await;
    let outcome = f.call("run-1", "bomb", "panicky", &json!({"mode": "memory-bomb"})).await;
    assert_eq!(outcome.status, Status::Failed, "{outcome:?}");
    assert_eq!(outcome.attempts, 1, "the same code asks for the same memory again");
    let error = outcome.error.expect("error");
    assert_eq!(error.class, "memory-limit", "{}", error.message);
    let next = f.call("run-1", "after", "panicky", &json!({"mode": "ok"})).await;
    assert!(next.is_completed());
}

#[tokio::test]
async fn a_spinning_guest_is_interrupted_at_its_deadline() {
    let dir = tempfile::tempdir().expect("dir");
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let policy = oncebox::RetryPolicy {
        max_attempts: 2,
        attempt_deadline: std::time::Duration::from_millis(200),
        ..crate::support::fast(oncebox::ReplayClass::IdempotentWrite)
    };
    let host = crate::support::builder_for(&dir.path().join("l.redb"), &provider, true)
        .retry_policy("panicky", policy)
        .build()
        .await
        .expect("host");
    crate::support::load_all(&host).await;
    let outcome = host
        .call(oncebox::Call::step("r", "spin", "panicky", json!({"mode": "spin"}).to_string()))
        .await
        .expect("call");
    assert_eq!(outcome.status, Status::Failed, "{outcome:?}");
    assert_eq!(outcome.attempts, 2);
    assert_eq!(outcome.error.expect("error").class, "deadline");
    let op = host.ledger().operation(&outcome.operation_key.expect("key")).await.expect("read").expect("op");
    assert_eq!(op.status, OperationStatus::Failed, "never left claimed");
}
