//! The same step again: answered from the ledger, never dispatched twice.

use oncebox::Status;

use crate::support::{Fixture, charge};

#[tokio::test]
async fn a_completed_step_is_replayed_without_dispatch() {
    let f = Fixture::new().await;
    let first = f.call("run-1", "charge", "charge", &charge("o-1")).await;
    assert_eq!(first.status, Status::Completed, "{first:?}");
    assert!(!first.replayed);
    let requests = f.provider.requests();

    let again = f.call("run-1", "charge", "charge", &charge("o-1")).await;
    assert_eq!(again.status, Status::Completed);
    assert!(again.replayed, "a repeated step must be answered from the ledger");
    assert_eq!(again.output, first.output, "the replay returns the recorded output");
    assert_eq!(again.operation_key, first.operation_key);
    assert_eq!(f.provider.requests(), requests, "nothing reached the provider");
    assert_eq!(f.provider.counts("o-1").payments, 1);
}

#[tokio::test]
async fn key_order_and_whitespace_do_not_make_a_new_request() {
    let f = Fixture::new().await;
    f.call("run-1", "charge", "charge", &charge("o-1")).await;
    let reordered = r#"{ "payment_method":"pm_card_visa", "currency":"eur", "amount_cents":1200, "order_id":"o-1" }"#;
    let again = f.host.call(oncebox::Call::step("run-1", "charge", "charge", reordered)).await.expect("call");
    assert_eq!(again.status, Status::Completed);
    assert!(again.replayed);
    assert_eq!(f.provider.counts("o-1").payments, 1);
}

#[tokio::test]
async fn changed_args_for_the_same_step_are_a_conflict() {
    let f = Fixture::new().await;
    f.call("run-1", "charge", "charge", &charge("o-1")).await;
    let requests = f.provider.requests();

    let mut changed = charge("o-1");
    changed["amount_cents"] = 9900.into();
    let conflict = f.call("run-1", "charge", "charge", &changed).await;
    assert_eq!(conflict.status, Status::Conflict);
    assert!(!conflict.replayed);
    let error = conflict.error.expect("a conflict explains itself");
    assert_eq!(error.class, "conflict");
    assert!(error.message.contains("Resolve the original operation first"), "{}", error.message);
    assert_eq!(f.provider.requests(), requests, "a conflict dispatches nothing");
    assert_eq!(f.provider.counts("o-1").payments, 1);

    // The record still holds the first request's result.
    let op =
        f.host.ledger().operation(conflict.operation_key.as_deref().expect("key")).await.expect("read").expect("op");
    assert_eq!(op.args["amount_cents"], 1200);
}

#[tokio::test]
async fn a_new_step_id_is_a_new_effect() {
    let f = Fixture::new().await;
    let first = f.call("run-1", "charge-1", "charge", &charge("o-1")).await;
    let second = f.call("run-1", "charge-2", "charge", &charge("o-1")).await;
    assert_eq!(first.status, Status::Completed);
    assert_eq!(second.status, Status::Completed);
    assert!(!second.replayed);
    assert_ne!(first.operation_key, second.operation_key);
    assert_ne!(first.output, second.output, "two payments, two ids");
    assert_eq!(f.provider.counts("o-1").payments, 2, "a new intent is a new charge");
}

#[tokio::test]
async fn the_same_step_in_another_run_is_another_operation() {
    let f = Fixture::new().await;
    let a = f.call("run-a", "charge", "charge", &charge("o-1")).await;
    let b = f.call("run-b", "charge", "charge", &charge("o-1")).await;
    assert_ne!(a.operation_key, b.operation_key);
    assert_eq!(f.provider.counts("o-1").payments, 2);
    let run_a = f.host.ledger().operations(Some("run-a")).await.expect("list");
    assert_eq!(run_a.len(), 1);
    assert_eq!(run_a[0].run_id, "run-a");
}
