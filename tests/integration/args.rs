//! Bad input gets a clear error and leaves no record.

use oncebox::{Call, CallError};

use crate::support::Fixture;

#[tokio::test]
async fn malformed_json_is_refused_and_nothing_is_recorded() {
    let f = Fixture::new().await;
    let err = f.host.call(Call::step("run-1", "s", "charge", "{not json")).await.expect_err("refused");
    match &err {
        CallError::InvalidArgs { tool, reason } => {
            assert_eq!(tool, "charge");
            assert!(reason.contains("not valid JSON"), "{reason}");
        }
        other => panic!("expected invalid args, got {other:?}"),
    }
    assert!(f.host.ledger().operations(None).await.expect("list").is_empty());
    assert_eq!(f.provider.requests(), 0);
}

#[tokio::test]
async fn schema_invalid_args_name_every_problem_and_record_nothing() {
    let f = Fixture::new().await;
    let args = r#"{"order_id": 7, "amount_cents": 100, "currency": "eur"}"#;
    let err = f.host.call(Call::step("run-1", "s", "charge", args)).await.expect_err("refused");
    let message = err.to_string();
    assert!(message.contains("/order_id"), "{message}");
    assert!(message.contains("payment_method"), "{message}");
    assert!(f.host.ledger().operations(None).await.expect("list").is_empty());
    assert_eq!(f.provider.requests(), 0);
    // The same step with good args then runs normally: the refusal left no trace to conflict with.
    let ok = f.call("run-1", "s", "charge", &crate::support::charge("o-1")).await;
    assert!(ok.is_completed(), "{ok:?}");
}

/// A model may well send a card number as a number: the refusal names where and why, and quotes
/// no sensitive value, neither at its own path nor inside the object an error at the root quotes.
#[tokio::test]
async fn a_refusal_of_a_sensitive_arg_quotes_no_value() {
    let f = Fixture::new().await;
    for args in [
        r#"{"order_id": "o-1", "amount_cents": 100, "currency": "eur", "payment_method": 4242424242424242}"#,
        r#"{"order_id": "o-1", "amount_cents": "x", "currency": "eur", "payment_method": "pm_card_4242424242424242", "extra": 1}"#,
    ] {
        let err = f.host.call(Call::step("run-1", "s", "charge", args)).await.expect_err("refused");
        let message = err.to_string();
        assert!(message.contains("does not match the input schema"), "{message}");
        assert!(!message.contains("4242424242424242"), "a sensitive value in the refusal: {message}");
    }
    let err = f
        .host
        .call(Call::step(
            "run-1",
            "s",
            "charge",
            r#"{"order_id": "o-1", "amount_cents": 100, "currency": "eur", "payment_method": 4242424242424242}"#,
        ))
        .await
        .expect_err("refused");
    assert!(err.to_string().contains("/payment_method [redacted] is not of type"), "{err}");
    assert!(f.host.ledger().operations(None).await.expect("list").is_empty());
}

#[tokio::test]
async fn a_write_tool_needs_a_run_and_a_step() {
    let f = Fixture::new().await;
    let err =
        f.host.call(Call::unrecorded("charge", crate::support::charge("o-1").to_string())).await.expect_err("refused");
    assert!(matches!(err, CallError::StepRequired { .. }), "{err:?}");
    assert!(err.to_string().contains("--run and --step"), "{err}");
    assert_eq!(f.provider.requests(), 0);
}

#[tokio::test]
async fn an_unknown_tool_is_named() {
    let f = Fixture::new().await;
    let err = f.host.call(Call::step("r", "s", "teleport", "{}")).await.expect_err("refused");
    assert!(err.to_string().contains("teleport"), "{err}");
}

#[tokio::test]
async fn oversized_args_are_refused_before_parsing() {
    let f = Fixture::new().await;
    let huge = format!(r#"{{"mode":"ok","echo":"{}"}}"#, "x".repeat(oncebox::limits::DEFAULT_ARGS_BYTES));
    let err = f.host.call(Call::step("run-1", "s", "panicky", huge)).await.expect_err("refused");
    assert!(matches!(err, CallError::InvalidArgs { .. }), "{err:?}");
    assert!(err.to_string().contains("over the limit"), "{err}");
    assert!(f.host.ledger().operations(None).await.expect("list").is_empty());
}
