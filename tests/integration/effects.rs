//! Effects through the guarded path, counted where they land.

use oncebox::Status;
use oncebox::ledger::{EffectSource, EffectStatus, OperationStatus};
use oncebox_example_provider::{Fault, FaultKind, Route};
use serde_json::json;

use crate::support::{Fixture, charge, host_for};

#[tokio::test]
async fn a_lost_response_is_retried_with_the_same_key_and_charges_once() {
    let f = Fixture::new().await;
    f.provider.arm(Fault::new(Route::Payments, FaultKind::LoseResponse).for_order("o-1"));

    let outcome = f.call("run-1", "charge", "charge", &charge("o-1")).await;
    assert_eq!(outcome.status, Status::Completed, "{outcome:?}");
    assert_eq!(outcome.attempts, 2);
    assert_eq!(f.provider.counts("o-1").payments, 1, "the provider committed exactly one charge");
    assert_eq!(f.provider.requests(), 2, "the second request was the same key, answered from the provider's record");

    let key = outcome.operation_key.expect("key");
    let effects = f.host.ledger().effects(&key).await.expect("effects");
    assert_eq!(effects.len(), 1, "both attempts used one effect key");
    assert_eq!(effects[0].dispatches, 2);
    assert_eq!(effects[0].status, EffectStatus::Completed);
    let attempts = f.host.ledger().attempts(&key).await.expect("attempts");
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[0].outcome, "unknown-outcome");
    assert_eq!(attempts[1].effects[0].source, EffectSource::Redispatched);
}

#[tokio::test]
async fn without_key_support_a_lost_response_stays_unknown() {
    let dir = tempfile::tempdir().expect("temp dir");
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let host = host_for(&dir.path().join("l.redb"), &provider, false).await;
    provider.arm(Fault::new(Route::Payments, FaultKind::LoseResponse).for_order("o-1"));

    let outcome =
        host.call(oncebox::Call::step("run-1", "charge", "charge", charge("o-1").to_string())).await.expect("call");
    assert_eq!(outcome.status, Status::Unknown, "{outcome:?}");
    assert_eq!(outcome.attempts, 1, "no blind retry");
    assert_eq!(outcome.error.expect("error").class, "unknown-outcome");
    assert_eq!(provider.counts("o-1").payments, 1);
    assert_eq!(provider.requests(), 1);

    let again =
        host.call(oncebox::Call::step("run-1", "charge", "charge", charge("o-1").to_string())).await.expect("call");
    assert_eq!(again.status, Status::Unknown);
    assert!(again.replayed);
    assert_eq!(provider.requests(), 1, "asking again dispatches nothing");
}

#[tokio::test]
async fn an_irreversible_tool_never_resends_even_where_keys_are_honoured() {
    let f = Fixture::new().await;
    f.provider.arm(Fault::new(Route::Fulfillments, FaultKind::LoseResponse).for_order("o-1"));
    let args = json!({"order_id": "o-1", "address": "1 Main St", "items": [{"sku": "sku-1", "quantity": 1}]});
    let call = oncebox::Call::step("run-1", "fulfill", "fulfill", args.to_string());
    let outcome = crate::support::approved_call(&f.host, call).await;
    assert_eq!(outcome.status, Status::Unknown, "{outcome:?}");
    assert_eq!(outcome.attempts, 1);
    assert_eq!(f.provider.counts("o-1").fulfillments, 1);
    assert_eq!(f.provider.requests(), 1);
}

#[tokio::test]
async fn a_rate_limit_and_a_5xx_from_a_key_honouring_host_are_retried_with_the_same_key() {
    let f = Fixture::new().await;
    f.provider.arm(Fault::new(Route::Payments, FaultKind::RateLimit { retry_after_ms: 20 }).for_order("o-1"));
    f.provider.arm(Fault::new(Route::Payments, FaultKind::ErrorBeforeCommit).for_order("o-1"));
    let outcome = f.call("run-1", "charge", "charge", &charge("o-1")).await;
    assert_eq!(outcome.status, Status::Completed, "{outcome:?}");
    assert_eq!(outcome.attempts, 3);
    assert_eq!(f.provider.counts("o-1").payments, 1);
    let key = outcome.operation_key.expect("key");
    let classes: Vec<String> =
        f.host.ledger().attempts(&key).await.expect("attempts").into_iter().map(|a| a.outcome).collect();
    // The 5xx proves nothing, so the effect was in doubt; the host honours keys, so it was resent.
    assert_eq!(classes, ["rate-limited", "unknown-outcome", "ok"]);
}

#[tokio::test]
async fn a_declined_card_is_permanent_and_not_retried() {
    let f = Fixture::new().await;
    let mut args = charge("o-1");
    args["payment_method"] = "card_declined".into();
    let outcome = f.call("run-1", "charge", "charge", &args).await;
    assert_eq!(outcome.status, Status::Failed);
    assert_eq!(outcome.attempts, 1);
    assert_eq!(outcome.error.expect("error").class, "permanent");
    assert_eq!(f.provider.requests(), 1);
}

#[tokio::test]
async fn a_reservation_is_made_once_however_often_it_is_asked_for() {
    let f = Fixture::new().await;
    let reserve = |order: &str| json!({"order_id": order, "sku": "sku-1", "quantity": 2});
    let first = f.call("run-1", "reserve", "reserve", &reserve("o-1")).await;
    assert_eq!(first.status, Status::Completed, "{first:?}");
    assert_eq!(first.output.as_ref().expect("output")["reserved_total"], 2);

    let replayed = f.call("run-1", "reserve", "reserve", &reserve("o-1")).await;
    assert!(replayed.replayed);
    // A new step for the same order finds the reservation and does not count it again.
    let new_step = f.call("run-1", "reserve-again", "reserve", &reserve("o-1")).await;
    assert_eq!(new_step.output.as_ref().expect("output")["reserved_total"], 2);
    let other = f.call("run-2", "reserve", "reserve", &reserve("o-2")).await;
    assert_eq!(other.output.as_ref().expect("output")["reserved_total"], 4);

    let stored = f.host.ledger().kv_get("reservations", "reserved/sku-1").await.expect("kv").expect("counter");
    assert_eq!(stored, b"4", "the ledger's own KV holds 2 + 2");

    let released = f.call("run-1", "release", "release", &json!({"order_id": "o-1"})).await;
    assert_eq!(released.output.as_ref().expect("output")["released"], 2);
    let released_again = f.call("run-1", "release-2", "release", &json!({"order_id": "o-1"})).await;
    assert_eq!(released_again.output.as_ref().expect("output")["released"], 0);
    assert_eq!(f.host.ledger().kv_get("reservations", "reserved/sku-1").await.expect("kv").expect("counter"), b"2");
}

#[tokio::test]
async fn an_outbox_message_is_enqueued_once() {
    let f = Fixture::new().await;
    let args = json!({"order_id": "o-1", "email": "a@example.com", "template": "receipt"});
    f.call("run-1", "notify", "notify", &args).await;
    f.call("run-1", "notify", "notify", &args).await;
    let outbox = f.host.ledger().outbox().await.expect("outbox");
    assert_eq!(outbox.len(), 1, "{outbox:?}");
    assert_eq!(outbox[0].topic, "email");
    assert!(outbox[0].payload.contains("receipt"));
}

#[tokio::test]
async fn the_local_writes_of_a_failed_attempt_are_discarded() {
    let f = Fixture::new().await;
    let args = json!({"mode": "transient", "write_first": true});
    let outcome = f.call("run-1", "flaky", "panicky", &args).await;
    assert_eq!(outcome.status, Status::Failed);
    assert_eq!(outcome.attempts, 3);
    let key = outcome.operation_key.expect("key");
    // `failed` means nothing of the operation took effect: not even its own KV write.
    assert!(f.host.ledger().kv_get("panicky", "panicky/last").await.expect("kv").is_none());
    assert!(f.host.ledger().effects(&key).await.expect("effects").is_empty());
    let attempts = f.host.ledger().attempts(&key).await.expect("attempts");
    assert!(attempts.iter().all(|a| a.effects.is_empty()), "{attempts:?}");
    assert_eq!(f.host.ledger().operation(&key).await.expect("op").expect("op").status, OperationStatus::Failed);

    // The same write in an attempt that completes lands once.
    let args = json!({"mode": "ok", "write_first": true});
    let outcome = f.call("run-1", "steady", "panicky", &args).await;
    assert_eq!(outcome.status, Status::Completed);
    assert_eq!(f.host.ledger().kv_get("panicky", "panicky/last").await.expect("kv").as_deref(), Some(&b"written"[..]));
}

#[tokio::test]
async fn sensitive_args_never_reach_the_ledger_file() {
    let f = Fixture::new().await;
    let card = "4242424242424242";
    let mut args = charge("o-1");
    args["payment_method"] = card.into();
    let outcome = f.call("run-1", "charge", "charge", &args).await;
    assert_eq!(outcome.status, Status::Completed);
    let op =
        f.host.ledger().operation(outcome.operation_key.as_deref().expect("key")).await.expect("read").expect("op");
    assert_eq!(op.args["payment_method"], oncebox::REDACTED);
    drop(f.host);
    let bytes = std::fs::read(f.dir.path().join("ledger.redb")).expect("read ledger file");
    assert!(!bytes.windows(card.len()).any(|w| w == card.as_bytes()), "the card number is in the ledger file");
}

#[tokio::test]
async fn a_read_only_tool_runs_without_a_step_and_records_nothing() {
    let f = Fixture::new().await;
    let outcome = f.host.call(oncebox::Call::unrecorded("stock", r#"{"sku":"sku-1"}"#)).await.expect("call");
    assert_eq!(outcome.status, Status::Completed, "{outcome:?}");
    assert_eq!(outcome.output.expect("output")["available"], 10);
    assert_eq!(outcome.operation_key, None);
    assert!(f.host.ledger().operations(None).await.expect("list").is_empty());
}

/// An embedder's effect that counts what reaches it.
#[derive(Default)]
struct CountingBank {
    keys: std::sync::Mutex<Vec<String>>,
}

impl oncebox::EffectProvider for CountingBank {
    fn call<'a>(
        &'a self,
        effect_key: &'a str,
        request: &'a str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = oncebox::ProviderOutcome> + Send + 'a>> {
        Box::pin(async move {
            self.keys.lock().expect("lock").push(effect_key.to_string());
            oncebox::ProviderOutcome::Committed(format!(r#"{{"seen":{request}}}"#))
        })
    }
}

#[tokio::test]
async fn an_embedder_provider_gets_keys_and_deduplication_for_free() {
    let dir = tempfile::tempdir().expect("dir");
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let bank = std::sync::Arc::new(CountingBank::default());
    let host = crate::support::builder_for(&dir.path().join("l.redb"), &provider, true)
        .provider("bank", bank.clone())
        .build()
        .await
        .expect("host");
    crate::support::load_all(&host).await;
    let call = |step: &str, args: serde_json::Value| oncebox::Call::step("run-1", step, "panicky", args.to_string());

    // Three attempts, one provider call: the later attempts are answered from the ledger.
    let flaky =
        host.call(call("flaky", json!({"mode": "transient", "provider": "bank", "echo": "a"}))).await.expect("call");
    assert_eq!(flaky.attempts, 3);
    assert_eq!(bank.keys.lock().expect("lock").len(), 1);
    // The bank did it, then the tool failed: that is not `failed` (nothing took effect) but unknown.
    assert_eq!(flaky.status, Status::Unknown, "{flaky:?}");
    assert_eq!(flaky.error.as_ref().expect("error").class, "failed-after-effect");

    let ok = host.call(call("ok", json!({"mode": "ok", "provider": "bank", "echo": "b"}))).await.expect("call");
    assert_eq!(ok.output.as_ref().expect("output")["provided"], json!({"seen": "b"}));
    let again = host.call(call("ok", json!({"mode": "ok", "provider": "bank", "echo": "b"}))).await.expect("call");
    assert!(again.replayed);
    let keys = bank.keys.lock().expect("lock").clone();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert_ne!(keys[0], keys[1], "each operation's effect has its own key");
    let recorded = host.ledger().effects(ok.operation_key.as_deref().expect("key")).await.expect("effects");
    assert_eq!(recorded[0].key, keys[1], "the provider saw the ledger's effect key");

    let missing = host.call(call("missing", json!({"mode": "ok", "provider": "nobody"}))).await.expect("call");
    assert_eq!(missing.status, Status::Failed);
    assert!(missing.error.expect("error").message.contains("nobody"));
}

/// An embedder's effect whose answer is always lost, at a provider that deduplicates by key.
struct LosingBank;

impl oncebox::EffectProvider for LosingBank {
    fn call<'a>(
        &'a self,
        _effect_key: &'a str,
        _request: &'a str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = oncebox::ProviderOutcome> + Send + 'a>> {
        Box::pin(async { oncebox::ProviderOutcome::Unknown("the answer was lost".into()) })
    }

    fn honours_keys(&self) -> bool {
        true
    }
}

#[tokio::test]
async fn an_effect_left_in_doubt_keeps_the_operation_from_completing_even_if_a_later_attempt_skips_it() {
    let dir = tempfile::tempdir().expect("dir");
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let host = crate::support::builder_for(&dir.path().join("l.redb"), &provider, true)
        .provider("bank", std::sync::Arc::new(LosingBank))
        .build()
        .await
        .expect("host");
    crate::support::load_all(&host).await;
    // Attempt 1 calls the bank and loses the answer; later attempts take another path and "succeed".
    let args = json!({"mode": "flip", "provider": "bank", "echo": "x"});
    let outcome = host.call(oncebox::Call::step("run-1", "flip", "panicky", args.to_string())).await.expect("call");
    assert_eq!(outcome.status, Status::Unknown, "{outcome:?}");
    let error = outcome.error.expect("error");
    assert_eq!(error.class, "unknown-outcome");
    let key = outcome.operation_key.expect("key");
    let op = host.ledger().operation(&key).await.expect("read").expect("op");
    assert_eq!(op.status, OperationStatus::Unknown, "never completed while the bank's effect is in doubt");
    assert!(op.output.is_none());
    // The KV write made before the bank's call went to disk with its write-ahead, before the call left.
    assert_eq!(host.ledger().kv_get("panicky", "panicky/flipped").await.expect("kv").as_deref(), Some(&b"yes"[..]));
}

/// A tool that catches its refund's unknown outcome and sends the same request again itself:
/// the host refuses the second send (a new key for a request of this attempt in doubt), so the
/// provider refunds once, whether or not it honours keys.
#[tokio::test]
async fn a_tool_that_resends_its_own_lost_answer_is_refused_and_the_refund_lands_once() {
    for honours_keys in [false, true] {
        let dir = tempfile::tempdir().expect("dir");
        let provider = oncebox_example_provider::Provider::start().await.expect("provider");
        let host = crate::support::builder_for(&dir.path().join("l.redb"), &provider, honours_keys)
            .tool_config("self-retrier", "base_url", provider.base_url())
            .grant("self-retrier", crate::support::http_grant(&provider))
            .build()
            .await
            .expect("host");
        host.load(oncebox_artifacts::SELF_RETRIER).await.expect("load");
        provider.arm(Fault::new(Route::Refunds, FaultKind::CommitThenError { status: 502 }).for_order("o-1"));
        let refund = json!({"order_id": "o-1", "amount_cents": 500}).to_string();
        let call = || oncebox::Call::step("run-1", "refund", "self-retrier", refund.clone());
        let outcome = host.call(call()).await.expect("call");
        assert_eq!(provider.counts("o-1").refunds, 1, "honours_keys={honours_keys}: refunded once: {outcome:?}");
        let key = outcome.operation_key.clone().expect("key");
        let attempts = host.ledger().attempts(&key).await.expect("attempts");
        let refused = attempts[0].message.clone().unwrap_or_default();
        assert!(
            refused.contains("the tool diverged") && refused.contains("earlier in this attempt"),
            "honours_keys={honours_keys}: the second send refused: {refused}"
        );
        if honours_keys {
            // The next attempt resends the first request with its own key: answered from the
            // provider's record.
            assert_eq!(outcome.status, Status::Completed, "{outcome:?}");
        } else {
            assert_eq!(outcome.status, Status::Unknown, "{outcome:?}");
        }
        host.call(call()).await.expect("again");
        assert_eq!(provider.counts("o-1").refunds, 1, "honours_keys={honours_keys}: still once");
    }
}
