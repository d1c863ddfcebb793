//! The retry matrix of DESIGN section 6, one test per cell: a real component, the example
//! provider's fault injection, and the provider's own count of what it committed.
//!
//! | class            | transient        | rate-limited    | unknown outcome                       | attempts | approval |
//! |------------------|------------------|-----------------|---------------------------------------|----------|----------|
//! | read-only        | retry            | wait, retry     | retry                                 | 3        | no       |
//! | idempotent-write | retry, same keys | wait, retry     | same key while the downstream keeps it | 3        | no       |
//! | compensatable    | retry            | wait, retry     | same key only with key support        | 3        | no       |
//! | irreversible     | no               | no              | unknown, reconcile                    | 1        | yes, bound to the fingerprint |
//!
//! "Transient" for an HTTP effect is what proves nothing was sent: a refused connection
//! ([`Cell::refused`]). A 5xx proves nothing of the kind, so it leaves the effect in doubt (the
//! "unknown outcome" column): resent with its key where the host honours keys, else `unknown`.

use oncebox::ledger::OperationStatus;
use oncebox::{Call, Host, Outcome, Status};
use oncebox_example_provider::{Counts, Fault, FaultKind, Provider, ProviderHandle, Route};
use serde_json::{Value, json};

use crate::support::{charge, host_for};

struct Cell {
    provider: ProviderHandle,
    host: Host,
    _dir: tempfile::TempDir,
}

impl Cell {
    async fn new(honours_keys: bool, faults: Vec<Fault>) -> Cell {
        let dir = tempfile::tempdir().expect("dir");
        let provider = Provider::start().await.expect("provider");
        provider.set_stock("sku-1", 7);
        for fault in faults {
            provider.arm(fault);
        }
        let host = host_for(&dir.path().join("l.redb"), &provider, honours_keys).await;
        Cell { provider, host, _dir: dir }
    }

    /// A cell whose tools' downstream refuses every connection: nothing is ever sent.
    async fn refused() -> Cell {
        let dir = tempfile::tempdir().expect("dir");
        let provider = Provider::start().await.expect("provider");
        let closed = crate::support::closed_origin().await;
        let mut builder = crate::support::builder_for(&dir.path().join("l.redb"), &provider, true);
        for tool in ["charge", "refund", "fulfill"] {
            builder = builder
                .tool_config(tool, "base_url", &closed)
                .grant(tool, oncebox::Grant::Http(closed.parse().expect("origin")));
        }
        let host = builder.build().await.expect("host");
        crate::support::load_all(&host).await;
        Cell { provider, host, _dir: dir }
    }

    /// Calls the tool for step 1; an irreversible one is approved first (its first call
    /// dispatches nothing: the approval column), then called again.
    async fn call(&self, tool: &str, args: &Value) -> Outcome {
        let call = Call::step("run-1", "step-1", tool, args.to_string());
        let outcome = self.host.call(call.clone()).await.expect("call");
        // The approval column: exactly the irreversible tool waits for one.
        let irreversible = self.host.manifest(tool).expect("loaded").class == oncebox::ReplayClass::Irreversible;
        assert_eq!(outcome.status == Status::AwaitingApproval, irreversible, "{tool}: {outcome:?}");
        if !irreversible {
            return outcome;
        }
        assert_eq!(self.provider.requests(), 0, "nothing is dispatched before the approval");
        crate::support::approve(&self.host, &outcome).await;
        self.host.call(call).await.expect("call")
    }

    /// The outcome classes of the attempts the ledger recorded.
    async fn attempts(&self, outcome: &Outcome) -> Vec<String> {
        let key = outcome.operation_key.as_deref().expect("key");
        self.host.ledger().attempts(key).await.expect("attempts").into_iter().map(|a| a.outcome).collect()
    }

    fn counts(&self) -> Counts {
        self.provider.counts("o-1")
    }
}

fn refund() -> Value {
    json!({"order_id": "o-1", "amount_cents": 500})
}

fn fulfill() -> Value {
    json!({"order_id": "o-1", "address": "1 Main St", "items": [{"sku": "sku-1", "quantity": 1}]})
}

fn stock() -> Value {
    json!({"sku": "sku-1"})
}

fn fault(route: Route, kind: FaultKind, times: u32) -> Fault {
    let f = Fault::new(route, kind).times(times);
    if route == Route::Inventory { f.for_sku("sku-1") } else { f.for_order("o-1") }
}

fn rate_limit() -> FaultKind {
    FaultKind::RateLimit { retry_after_ms: 20 }
}

// read-only

#[tokio::test]
async fn read_only_transient_is_retried() {
    let cell = Cell::new(true, vec![fault(Route::Inventory, FaultKind::ErrorBeforeCommit, 1)]).await;
    let outcome = cell.call("stock", &stock()).await;
    assert_eq!(outcome.status, Status::Completed, "{outcome:?}");
    assert_eq!(cell.attempts(&outcome).await, ["transient", "ok"]);
    assert_eq!(cell.provider.reads(), 2);
    assert_eq!(outcome.output.expect("output")["available"], 7);
}

#[tokio::test]
async fn read_only_rate_limited_waits_and_retries() {
    let cell = Cell::new(true, vec![fault(Route::Inventory, rate_limit(), 1)]).await;
    let outcome = cell.call("stock", &stock()).await;
    assert_eq!(outcome.status, Status::Completed, "{outcome:?}");
    assert_eq!(cell.attempts(&outcome).await, ["rate-limited", "ok"]);
    assert_eq!(cell.provider.reads(), 2);
}

#[tokio::test]
async fn read_only_lost_answer_is_retried() {
    let cell = Cell::new(false, vec![fault(Route::Inventory, FaultKind::LoseResponse, 1)]).await;
    let outcome = cell.call("stock", &stock()).await;
    assert_eq!(outcome.status, Status::Completed, "{outcome:?}");
    assert_eq!(cell.attempts(&outcome).await.len(), 2, "a read changes nothing, so a lost answer is just retried");
    assert_eq!(cell.provider.reads(), 2);
}

#[tokio::test]
async fn read_only_stops_after_three_attempts() {
    let cell = Cell::new(true, vec![fault(Route::Inventory, FaultKind::ErrorBeforeCommit, 5)]).await;
    let outcome = cell.call("stock", &stock()).await;
    assert_eq!(outcome.status, Status::Failed);
    assert_eq!(cell.attempts(&outcome).await, ["transient", "transient", "transient"]);
    assert_eq!(cell.provider.reads(), 3);
}

// idempotent-write

#[tokio::test]
async fn idempotent_transient_is_retried_until_the_last_attempt() {
    let cell = Cell::refused().await;
    let outcome = cell.call("refund", &refund()).await;
    assert_eq!(outcome.status, Status::Failed, "{outcome:?}");
    assert_eq!(cell.attempts(&outcome).await, ["transient", "transient", "transient"]);
    let effects = cell.host.ledger().effects(outcome.operation_key.as_deref().expect("key")).await.expect("effects");
    assert_eq!((effects.len(), effects[0].dispatches), (1, 3), "one key, tried three times, never sent");
}

#[tokio::test]
async fn idempotent_5xx_from_a_key_honouring_host_is_resent_with_the_same_key() {
    let cell = Cell::new(true, vec![fault(Route::Refunds, FaultKind::ErrorBeforeCommit, 1)]).await;
    let outcome = cell.call("refund", &refund()).await;
    assert_eq!(outcome.status, Status::Completed, "{outcome:?}");
    assert_eq!(cell.attempts(&outcome).await, ["unknown-outcome", "ok"]);
    assert_eq!(cell.counts().refunds, 1);
    let effects = cell.host.ledger().effects(outcome.operation_key.as_deref().expect("key")).await.expect("effects");
    assert_eq!((effects.len(), effects[0].dispatches), (1, 2), "one key, sent twice");
}

#[tokio::test]
async fn idempotent_rate_limited_waits_and_retries() {
    let cell = Cell::new(true, vec![fault(Route::Refunds, rate_limit(), 1)]).await;
    let outcome = cell.call("refund", &refund()).await;
    assert_eq!(outcome.status, Status::Completed, "{outcome:?}");
    assert_eq!(cell.attempts(&outcome).await, ["rate-limited", "ok"]);
    assert_eq!(cell.counts().refunds, 1);
}

#[tokio::test]
async fn idempotent_unknown_is_resent_with_the_same_key_while_the_downstream_keeps_it() {
    let cell = Cell::new(true, vec![fault(Route::Refunds, FaultKind::LoseResponse, 1)]).await;
    let outcome = cell.call("refund", &refund()).await;
    assert_eq!(outcome.status, Status::Completed, "{outcome:?}");
    assert_eq!(cell.attempts(&outcome).await, ["unknown-outcome", "ok"]);
    assert_eq!(cell.counts().refunds, 1);
    assert_eq!(cell.provider.requests(), 2);
}

#[tokio::test]
async fn idempotent_unknown_past_the_key_retention_waits_for_reconciliation() {
    let dir = tempfile::tempdir().expect("dir");
    let provider = Provider::start().await.expect("provider");
    provider.arm(fault(Route::Refunds, FaultKind::LoseResponse, 1));
    let target = oncebox::HttpTarget {
        honours_keys: true,
        key_retention: std::time::Duration::ZERO,
        timeout: crate::support::EFFECT_TIMEOUT,
        ..Default::default()
    };
    let host = crate::support::builder_for(&dir.path().join("l.redb"), &provider, true)
        .http_target(provider.addr().to_string(), target)
        .build()
        .await
        .expect("host");
    crate::support::load_all(&host).await;
    let outcome = host.call(Call::step("run-1", "step-1", "refund", refund().to_string())).await.expect("call");
    assert_eq!(outcome.status, Status::Unknown, "{outcome:?}");
    assert_eq!(outcome.attempts, 1);
    assert_eq!(provider.counts("o-1").refunds, 1);
    assert_eq!(provider.requests(), 1, "never a blind resend");
}

#[tokio::test]
async fn idempotent_5xx_on_every_attempt_ends_unknown_not_failed() {
    let cell = Cell::new(true, vec![fault(Route::Refunds, FaultKind::ErrorBeforeCommit, 5)]).await;
    let outcome = cell.call("refund", &refund()).await;
    assert_eq!(outcome.status, Status::Unknown, "a 5xx is no proof that nothing happened: {outcome:?}");
    assert_eq!(cell.attempts(&outcome).await, ["unknown-outcome", "unknown-outcome", "unknown-outcome"]);
    assert_eq!(cell.counts().refunds, 0);
    assert_eq!(cell.provider.requests(), 3);
}

// compensatable

#[tokio::test]
async fn compensatable_transient_is_retried() {
    let cell = Cell::refused().await;
    let outcome = cell.call("charge", &charge("o-1")).await;
    assert_eq!(outcome.status, Status::Failed, "{outcome:?}");
    assert_eq!(cell.attempts(&outcome).await, ["transient", "transient", "transient"]);
}

#[tokio::test]
async fn compensatable_5xx_is_resent_only_with_key_support() {
    let with = Cell::new(true, vec![fault(Route::Payments, FaultKind::ErrorBeforeCommit, 1)]).await;
    let outcome = with.call("charge", &charge("o-1")).await;
    assert_eq!(outcome.status, Status::Completed, "{outcome:?}");
    assert_eq!(with.attempts(&outcome).await, ["unknown-outcome", "ok"]);
    assert_eq!(with.counts().payments, 1);

    let without = Cell::new(false, vec![fault(Route::Payments, FaultKind::ErrorBeforeCommit, 1)]).await;
    let outcome = without.call("charge", &charge("o-1")).await;
    assert_eq!(outcome.status, Status::Unknown, "{outcome:?}");
    assert_eq!(without.attempts(&outcome).await, ["unknown-outcome"]);
    assert_eq!(without.provider.requests(), 1, "never a blind resend");
}

#[tokio::test]
async fn compensatable_rate_limited_waits_and_retries() {
    let cell = Cell::new(true, vec![fault(Route::Payments, rate_limit(), 1)]).await;
    let outcome = cell.call("charge", &charge("o-1")).await;
    assert_eq!(outcome.status, Status::Completed, "{outcome:?}");
    assert_eq!(cell.attempts(&outcome).await, ["rate-limited", "ok"]);
    assert_eq!(cell.counts().payments, 1);
}

#[tokio::test]
async fn compensatable_unknown_is_resent_only_with_key_support() {
    let with = Cell::new(true, vec![fault(Route::Payments, FaultKind::LoseResponse, 1)]).await;
    let outcome = with.call("charge", &charge("o-1")).await;
    assert_eq!(outcome.status, Status::Completed, "{outcome:?}");
    assert_eq!(with.attempts(&outcome).await, ["unknown-outcome", "ok"]);
    assert_eq!(with.counts().payments, 1);

    let without = Cell::new(false, vec![fault(Route::Payments, FaultKind::LoseResponse, 1)]).await;
    let outcome = without.call("charge", &charge("o-1")).await;
    assert_eq!(outcome.status, Status::Unknown, "{outcome:?}");
    assert_eq!(without.attempts(&outcome).await, ["unknown-outcome"]);
    assert_eq!(without.counts().payments, 1);
    assert_eq!(without.provider.requests(), 1);
}

#[tokio::test]
async fn compensatable_stops_after_three_attempts() {
    let cell = Cell::new(true, vec![fault(Route::Payments, FaultKind::ErrorBeforeCommit, 5)]).await;
    let outcome = cell.call("charge", &charge("o-1")).await;
    assert_eq!(outcome.status, Status::Unknown, "{outcome:?}");
    assert_eq!(cell.attempts(&outcome).await.len(), 3);
    assert_eq!(cell.counts().payments, 0);
}

// irreversible

#[tokio::test]
async fn irreversible_transient_is_not_retried() {
    let cell = Cell::refused().await;
    let outcome = cell.call("fulfill", &fulfill()).await;
    assert_eq!(outcome.status, Status::Failed, "{outcome:?}");
    assert_eq!(cell.attempts(&outcome).await, ["transient"]);
}

#[tokio::test]
async fn irreversible_5xx_is_unknown_even_with_key_support() {
    let cell = Cell::new(true, vec![fault(Route::Fulfillments, FaultKind::ErrorBeforeCommit, 1)]).await;
    let outcome = cell.call("fulfill", &fulfill()).await;
    assert_eq!(outcome.status, Status::Unknown, "{outcome:?}");
    assert_eq!(cell.attempts(&outcome).await, ["unknown-outcome"]);
    assert_eq!(cell.provider.requests(), 1);
}

#[tokio::test]
async fn irreversible_rate_limited_is_not_retried() {
    let cell = Cell::new(true, vec![fault(Route::Fulfillments, rate_limit(), 1)]).await;
    let outcome = cell.call("fulfill", &fulfill()).await;
    assert_eq!(outcome.status, Status::Failed, "{outcome:?}");
    assert_eq!(cell.attempts(&outcome).await, ["rate-limited"]);
    assert_eq!(cell.provider.requests(), 1);
}

#[tokio::test]
async fn irreversible_unknown_goes_to_reconciliation_even_with_key_support() {
    let cell = Cell::new(true, vec![fault(Route::Fulfillments, FaultKind::LoseResponse, 1)]).await;
    let outcome = cell.call("fulfill", &fulfill()).await;
    assert_eq!(outcome.status, Status::Unknown, "{outcome:?}");
    assert_eq!(cell.attempts(&outcome).await, ["unknown-outcome"]);
    assert_eq!(cell.counts().fulfillments, 1);
    assert_eq!(cell.provider.requests(), 1);
    let reconciled = cell.host.reconcile(Call::step("run-1", "step-1", "fulfill", fulfill().to_string())).await;
    assert!(matches!(reconciled, Ok(oncebox::Reconciliation::Committed { .. })), "{reconciled:?}");
    assert_eq!(cell.provider.requests(), 1, "reconciliation only looked");
}

#[tokio::test]
async fn irreversible_makes_one_attempt() {
    let cell = Cell::refused().await;
    let outcome = cell.call("fulfill", &fulfill()).await;
    assert_eq!(outcome.attempts, 1);
    let op =
        cell.host.ledger().operation(outcome.operation_key.as_deref().expect("key")).await.expect("read").expect("op");
    assert_eq!(op.status, OperationStatus::Failed);
}

// approval: irreversible only, bound to the fingerprint of the exact params

impl Cell {
    /// One call of step 1, as it comes: no approval given.
    async fn call_once(&self, tool: &str, args: &Value) -> Outcome {
        self.host.call(Call::step("run-1", "step-1", tool, args.to_string())).await.expect("call")
    }

    async fn approvals(&self) -> usize {
        self.host.ledger().approvals(None).await.expect("read").len()
    }
}

#[tokio::test]
async fn read_only_needs_no_approval() {
    let cell = Cell::new(true, vec![]).await;
    let outcome = cell.call_once("stock", &stock()).await;
    assert_eq!((outcome.status, cell.approvals().await), (Status::Completed, 0), "{outcome:?}");
}

#[tokio::test]
async fn idempotent_needs_no_approval() {
    let cell = Cell::new(true, vec![]).await;
    let outcome = cell.call_once("refund", &refund()).await;
    assert_eq!((outcome.status, cell.approvals().await), (Status::Completed, 0), "{outcome:?}");
    assert_eq!(cell.counts().refunds, 1);
}

#[tokio::test]
async fn compensatable_needs_no_approval() {
    let cell = Cell::new(true, vec![]).await;
    let outcome = cell.call_once("charge", &charge("o-1")).await;
    assert_eq!((outcome.status, cell.approvals().await), (Status::Completed, 0), "{outcome:?}");
    assert_eq!(cell.counts().payments, 1);
}

#[tokio::test]
async fn irreversible_needs_an_approval_bound_to_its_fingerprint() {
    let cell = Cell::new(true, vec![]).await;
    let first = cell.call_once("fulfill", &fulfill()).await;
    assert_eq!(first.status, Status::AwaitingApproval, "{first:?}");
    assert_eq!((cell.provider.requests(), cell.approvals().await), (0, 1));
    crate::support::approve(&cell.host, &first).await;
    let shipped = cell.call_once("fulfill", &fulfill()).await;
    assert_eq!(shipped.status, Status::Completed, "{shipped:?}");
    assert_eq!(cell.counts().fulfillments, 1);
}

// every class

#[tokio::test]
async fn permanent_is_never_retried() {
    let cell = Cell::new(true, vec![]).await;
    let mut declined = charge("o-1");
    declined["payment_method"] = "card_declined".into();
    let outcome = cell.call("charge", &declined).await;
    assert_eq!(outcome.status, Status::Failed);
    assert_eq!(cell.attempts(&outcome).await, ["permanent"]);
    assert_eq!(cell.provider.requests(), 1);
}

#[tokio::test]
async fn a_transport_retry_is_an_attempt_and_a_repeated_call_is_not() {
    let cell = Cell::new(true, vec![fault(Route::Payments, FaultKind::ErrorBeforeCommit, 1)]).await;
    let first = cell.call("charge", &charge("o-1")).await;
    assert_eq!((first.attempts, first.replayed), (2, false), "the transport retry counted as an attempt");
    let requests = cell.provider.requests();
    let again = cell.call("charge", &charge("o-1")).await;
    assert_eq!((again.attempts, again.replayed), (2, true), "the model asking again is answered from the ledger");
    assert_eq!(cell.attempts(&again).await.len(), 2, "and recorded no new attempt");
    assert_eq!(cell.provider.requests(), requests);
    assert_eq!(cell.counts().payments, 1);
}

// the policy file

/// A host configured only by a policy file (no overrides in code).
async fn host_with_policy(provider: &ProviderHandle, toml: &str) -> (Result<Host, oncebox::Error>, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("oncebox.toml");
    let text = format!(
        "{toml}\n[tools.charge.config]\nbase_url = \"{base}\"\n\n[tools.fulfill.config]\nbase_url = \"{base}\"\n\n\
         [tools.charge.grants]\nhttp = [\"{base}\"]\n\n[tools.fulfill.grants]\nhttp = [\"{base}\"]\n\n\
         [hosts.\"{addr}\"]\nhonours_keys = true\nkey_retention = \"24h\"\ntimeout = \"2s\"\n",
        base = provider.base_url(),
        addr = provider.addr(),
    );
    std::fs::write(&path, text).expect("write policy");
    let file = oncebox::policy_file::PolicyFile::load(&path).expect("a valid policy file");
    let host = Host::builder(dir.path().join("l.redb")).policy_file(file).build().await.expect("host");
    for tool in [oncebox_artifacts::CHARGE, oncebox_artifacts::FULFILL] {
        if let Err(e) = host.load(tool).await {
            return (Err(e), dir);
        }
    }
    (Ok(host), dir)
}

#[tokio::test]
async fn a_policy_file_gives_a_tool_more_attempts() {
    let provider = Provider::start().await.expect("provider");
    provider.arm(fault(Route::Payments, FaultKind::ErrorBeforeCommit, 4));
    let (host, _dir) = host_with_policy(
        &provider,
        "[tools.charge]\nmax_attempts = 5\ninitial_backoff = \"1ms\"\nmax_backoff = \"2ms\"\n",
    )
    .await;
    let host = host.expect("loads");
    let outcome = host.call(Call::step("r", "s", "charge", charge("o-1").to_string())).await.expect("call");
    assert_eq!(outcome.status, Status::Completed, "{outcome:?}");
    assert_eq!(outcome.attempts, 5);
    assert_eq!(provider.counts("o-1").payments, 1);
    assert_eq!(provider.requests(), 5);
    let effective = host.policy("charge").expect("policy");
    assert_eq!(
        effective.source("max_attempts").map(ToString::to_string).as_deref(),
        Some(&*format!("{}:2", _dir.path().join("oncebox.toml").display()))
    );
}

#[tokio::test]
async fn a_rate_limit_past_the_call_deadline_fails_as_rate_limited() {
    let provider = Provider::start().await.expect("provider");
    provider.arm(fault(Route::Payments, FaultKind::RateLimit { retry_after_ms: 60_000 }, 1));
    let (host, _dir) =
        host_with_policy(&provider, "[tools.charge]\nattempt_deadline = \"5s\"\ncall_deadline = \"10s\"\n").await;
    let host = host.expect("loads");
    let outcome = host.call(Call::step("r", "s", "charge", charge("o-1").to_string())).await.expect("call");
    assert_eq!(outcome.status, Status::Failed, "{outcome:?}");
    assert_eq!(outcome.attempts, 1, "waiting a minute would outlive the call's 10 s");
    assert_eq!(outcome.error.expect("error").class, "rate-limited");
    assert_eq!(provider.counts("o-1").payments, 0);
}

#[tokio::test]
async fn a_loosening_the_class_forbids_is_refused_at_load_with_file_and_line() {
    let provider = Provider::start().await.expect("provider");
    let (host, dir) = host_with_policy(&provider, "[tools.fulfill]\nmax_attempts = 3\n").await;
    let err = host.expect_err("an irreversible tool with retries is refused");
    let message = err.to_string();
    assert!(message.contains(&format!("{}:2", dir.path().join("oncebox.toml").display())), "{message}");
    assert!(message.contains("irreversible"), "{message}");
}

#[tokio::test]
async fn an_effect_timing_out_after_dispatch_is_in_doubt() {
    // The provider commits and then holds the answer past the host's 1.5 s effect timeout.
    let cell = Cell::new(false, vec![fault(Route::Payments, FaultKind::Delay { delay_ms: 5_000 }, 1)]).await;
    let outcome = cell.call("charge", &charge("o-1")).await;
    assert_eq!(outcome.status, Status::Unknown, "{outcome:?}");
    assert_eq!(cell.attempts(&outcome).await, ["unknown-outcome"]);
    let message = outcome.error.expect("error").message;
    assert!(message.contains("timed out"), "{message}");
    assert_eq!(cell.counts().payments, 1, "it did take effect: exactly why a blind retry would be wrong");
}

#[tokio::test]
async fn a_resend_that_is_rate_limited_leaves_the_first_send_in_doubt() {
    // The first send gets a 500 (no proof of anything); the resends with its key are rate-limited,
    // which proves only that they were not taken. The operation is unknown, never failed.
    let faults = vec![fault(Route::Refunds, FaultKind::ErrorBeforeCommit, 1), fault(Route::Refunds, rate_limit(), 2)];
    let cell = Cell::new(true, faults).await;
    let outcome = cell.call("refund", &refund()).await;
    assert_eq!(outcome.status, Status::Unknown, "{outcome:?}");
    assert_eq!(cell.attempts(&outcome).await, ["unknown-outcome", "unknown-outcome", "unknown-outcome"]);
}
