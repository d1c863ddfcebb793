//! A host that stops between the write-ahead record and the answer.

use oncebox::ledger::{EffectStatus, OperationStatus};
use oncebox::{Reconciliation, Status};
use oncebox_example_provider::{Fault, FaultKind, Provider, Route};

use crate::support::{charge, eventually, host_for};

#[tokio::test]
async fn a_host_dropped_after_dispatch_leaves_unknown_and_the_next_call_dispatches_nothing() {
    let dir = tempfile::tempdir().expect("dir");
    let ledger = dir.path().join("ledger.redb");
    let provider = Provider::start().await.expect("provider");
    // The provider commits, then holds the answer long enough for the host to die waiting.
    provider.arm(Fault::new(Route::Payments, FaultKind::Delay { delay_ms: 5_000 }).for_order("o-1"));

    // A downstream not declared to honour keys: nothing may be resent on the host's own account.
    let host = host_for(&ledger, &provider, false).await;
    let call = oncebox::Call::step("run-1", "charge", "charge", charge("o-1").to_string());
    let in_flight = tokio::spawn({
        let host = host.clone();
        async move { host.call(call).await }
    });
    eventually("the provider committed the charge", || provider.counts("o-1").payments == 1).await;
    // The process dies: the call is cancelled mid-dispatch and every handle on the ledger goes.
    in_flight.abort();
    assert!(in_flight.await.is_err_and(|e| e.is_cancelled()));
    drop(host);

    let restarted = host_for(&ledger, &provider, false).await;
    let requests = provider.requests();
    let outcome = restarted
        .call(oncebox::Call::step("run-1", "charge", "charge", charge("o-1").to_string()))
        .await
        .expect("call");
    assert_eq!(outcome.status, Status::Unknown, "{outcome:?}");
    assert!(outcome.replayed, "answered from the ledger");
    assert!(outcome.error.expect("error").message.contains("reconcile"));
    assert_eq!(provider.requests(), requests, "the next call dispatched nothing");
    assert_eq!(provider.counts("o-1").payments, 1);

    let key = outcome.operation_key.expect("key");
    let op = restarted.ledger().operation(&key).await.expect("read").expect("op");
    assert_eq!(op.status, OperationStatus::Unknown);
    let effects = restarted.ledger().effects(&key).await.expect("effects");
    assert_eq!(effects.len(), 1);
    assert_eq!(effects[0].status, EffectStatus::Unknown);

    // Reconciliation asks the provider by the effect key, and completes the step without a dispatch.
    let call = oncebox::Call::step("run-1", "charge", "charge", charge("o-1").to_string());
    let reconciled = restarted.reconcile(call.clone()).await.expect("reconcile");
    let Reconciliation::Committed { outcome } = reconciled else { panic!("expected committed, got {reconciled:?}") };
    assert_eq!(outcome.status, Status::Completed);
    assert_eq!(outcome.output.as_ref().expect("output")["order_id"], "o-1");
    let after = restarted.call(call).await.expect("call");
    assert!(after.replayed && after.is_completed(), "{after:?}");
    assert_eq!(after.output, outcome.output);
    assert_eq!(provider.requests(), requests, "reconciling and replaying dispatched nothing");
    assert_eq!(provider.counts("o-1").payments, 1);
}

/// The refund of run-1 to a host that honours keys, committed at the provider and left in doubt
/// by a host that died waiting for its answer.
fn refund() -> oncebox::Call {
    let refund = serde_json::json!({"order_id": "o-1", "amount_cents": 500}).to_string();
    oncebox::Call::step("run-1", "refund", "refund", refund)
}

async fn a_refund_left_in_doubt(ledger: &std::path::Path, provider: &oncebox_example_provider::ProviderHandle) {
    provider.arm(Fault::new(Route::Refunds, FaultKind::Delay { delay_ms: 5_000 }).for_order("o-1"));
    let host = host_for(ledger, provider, true).await;
    let in_flight = tokio::spawn({
        let host = host.clone();
        async move { host.call(refund()).await }
    });
    eventually("the provider committed the refund", || provider.counts("o-1").refunds == 1).await;
    in_flight.abort();
    let _ = in_flight.await;
}

#[tokio::test]
async fn after_a_crash_an_effect_in_doubt_at_a_key_honouring_host_is_resent_with_its_key_once() {
    let dir = tempfile::tempdir().expect("dir");
    let ledger = dir.path().join("ledger.redb");
    let provider = Provider::start().await.expect("provider");
    a_refund_left_in_doubt(&ledger, &provider).await;
    let call = refund;

    // Recovery left the operation unknown; the host honours keys within their retention, so the
    // next call takes it over and resends with the same key instead of waiting for a person.
    let restarted = host_for(&ledger, &provider, true).await;
    let outcome = restarted.call(call()).await.expect("call");
    assert_eq!(outcome.status, Status::Completed, "{outcome:?}");
    assert!(!outcome.replayed);
    assert_eq!(provider.counts("o-1").refunds, 1, "the resend was answered from the provider's key store");
    let key = outcome.operation_key.expect("key");
    let effects = restarted.ledger().effects(&key).await.expect("effects");
    assert_eq!((effects.len(), effects[0].dispatches), (1, 2), "one key, sent twice");
    assert!(restarted.call(call()).await.expect("call").replayed);
}

#[tokio::test]
async fn callers_racing_to_resend_an_unknown_wait_for_the_one_that_won() {
    let dir = tempfile::tempdir().expect("dir");
    let ledger = dir.path().join("ledger.redb");
    let provider = Provider::start().await.expect("provider");
    a_refund_left_in_doubt(&ledger, &provider).await;
    let call = || refund().waiting(std::time::Duration::from_secs(20));

    // Unknown after the restart, and resendable with its key: several callers arrive at once,
    // each reads the unknown, and one of them reopens it; its resend is held a moment.
    provider.arm(Fault::new(Route::Refunds, FaultKind::Delay { delay_ms: 600 }).for_order("o-1"));
    let restarted = host_for(&ledger, &provider, true).await;
    let callers: Vec<_> = (0..6)
        .map(|_| {
            let (host, call) = (restarted.clone(), call());
            tokio::spawn(async move { host.call(call).await })
        })
        .collect();
    let mut fresh = 0;
    for caller in callers {
        let outcome = caller.await.expect("joined").expect("call");
        // A caller that asked to wait and lost the race to reopen waits for the winner's answer
        // instead of being told to come back.
        assert_eq!(outcome.status, Status::Completed, "{outcome:?}");
        fresh += usize::from(!outcome.replayed);
    }
    assert_eq!(fresh, 1, "one caller resent, the others were answered from its record");
    assert_eq!(provider.counts("o-1").refunds, 1, "the resend was answered from the provider's key store");
}

/// A downstream that answers lookups with 404 but never answers a write: the write's outcome is
/// unknown, and reconciliation learns it never took place.
async fn black_hole() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let n = socket.read(&mut buf).await.unwrap_or(0);
                if buf[..n].starts_with(b"GET ") {
                    let body = r#"{"error":"not_found"}"#;
                    let head = format!(
                        "HTTP/1.1 404 Not Found\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = socket.write_all(format!("{head}{body}").as_bytes()).await;
                } else {
                    tokio::time::sleep(std::time::Duration::from_secs(30)).await;
                }
            });
        }
    });
    (addr, task)
}

#[tokio::test]
async fn an_effect_the_authority_never_saw_is_sent_again_with_the_same_key() {
    let dir = tempfile::tempdir().expect("dir");
    let ledger = dir.path().join("ledger.redb");
    let (hole, hole_task) = black_hole().await;
    let call = oncebox::Call::step("run-1", "charge", "charge", charge("o-1").to_string());
    let first_key = {
        let host = oncebox::Host::builder(&ledger)
            .http_target(
                hole.to_string(),
                oncebox::HttpTarget {
                    timeout: std::time::Duration::from_millis(300),
                    settle_window: std::time::Duration::from_millis(700),
                    ..Default::default()
                },
            )
            .tool_config("charge", "base_url", format!("http://{hole}"))
            .grant("charge", oncebox::Grant::Http(format!("http://{hole}").parse().expect("origin")))
            .build()
            .await
            .expect("host");
        host.load(oncebox_artifacts::CHARGE).await.expect("load");
        let outcome = host.call(call.clone()).await.expect("call");
        assert_eq!(outcome.status, Status::Unknown, "{outcome:?}");
        // A 404 right after the request proves nothing: the downstream may still be working on it.
        let early = host.reconcile(call.clone()).await.expect("reconcile");
        let Reconciliation::StillUnknown { counts_from_ms: Some(from), .. } = early else {
            panic!("an early 404 is no proof: {early:?}")
        };
        assert_eq!(host.call(call.clone()).await.expect("call").status, Status::Unknown, "still unknown");
        let wait = from.saturating_sub(crate::support::now_ms()) + 50;
        tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
        // Once the settle window has passed, the same 404 is proof.
        let reconciled = host.reconcile(call.clone()).await.expect("reconcile");
        assert!(matches!(reconciled, Reconciliation::NotCommitted { .. }), "{reconciled:?}");
        let key = outcome.operation_key.expect("key");
        host.ledger().effects(&key).await.expect("effects")[0].key.clone()
    };
    hole_task.abort();
    let _ = hole_task.await;

    // The same address now answers (the downstream came back): the effect goes out again, with its
    // first key. (A different URL would be a different request: the guard would call it divergence.)
    let provider = Provider::start_on(hole.port()).await.expect("provider on the same port");
    let host = host_for(&ledger, &provider, true).await;
    let outcome = host.call(call).await.expect("call");
    assert_eq!(outcome.status, Status::Completed, "{outcome:?}");
    assert_eq!(provider.counts("o-1").payments, 1);
    let effects = host.ledger().effects(outcome.operation_key.as_deref().expect("key")).await.expect("effects");
    assert_eq!(effects.len(), 1);
    assert_eq!(effects[0].key, first_key, "the resend reused the effect key");
    let stored = reqwest::get(format!("{}/payments/by-key/{first_key}", provider.base_url())).await.expect("lookup");
    assert_eq!(stored.status(), 200, "the provider recorded the charge under the first key");
}

#[tokio::test]
async fn a_ledger_survives_a_restart_and_replays_from_disk() {
    let dir = tempfile::tempdir().expect("dir");
    let ledger = dir.path().join("ledger.redb");
    let provider = Provider::start().await.expect("provider");
    let first = {
        let host = host_for(&ledger, &provider, true).await;
        host.call(oncebox::Call::step("run-1", "charge", "charge", charge("o-1").to_string())).await.expect("call")
    };
    let host = host_for(&ledger, &provider, true).await;
    let again =
        host.call(oncebox::Call::step("run-1", "charge", "charge", charge("o-1").to_string())).await.expect("call");
    assert!(again.replayed);
    assert_eq!(again.output, first.output);
    assert_eq!(provider.counts("o-1").payments, 1);
}

#[tokio::test]
async fn a_second_host_on_an_open_ledger_gets_a_clear_error() {
    let dir = tempfile::tempdir().expect("dir");
    let ledger = dir.path().join("ledger.redb");
    let _first = oncebox::Host::builder(&ledger).build().await.expect("first");
    let err = oncebox::Host::builder(&ledger).build().await.expect_err("second must fail");
    let message = err.to_string();
    assert!(message.contains("open in another process") || message.contains("already open"), "{message}");
}

#[tokio::test]
async fn a_corrupt_ledger_file_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().expect("dir");
    let ledger = dir.path().join("ledger.redb");
    std::fs::write(&ledger, vec![0x5a; 8192]).expect("write junk");
    let err = oncebox::Host::builder(&ledger).build().await.expect_err("junk is not a ledger");
    assert!(err.to_string().contains("ledger.redb"), "{err}");
    assert_eq!(std::fs::read(&ledger).expect("read"), vec![0x5a; 8192], "the file was left as it was");
}

#[tokio::test]
async fn a_ledger_of_another_schema_version_is_refused_with_both_versions_and_left_as_it_was() {
    let dir = tempfile::tempdir().expect("dir");
    let ledger = dir.path().join("ledger.redb");
    {
        // What a version-1 oncebox left: its schema version, under the same name.
        let db = redb::Database::create(&ledger).expect("create");
        let txn = db.begin_write().expect("write");
        txn.open_table(redb::TableDefinition::<&str, u64>::new("meta"))
            .expect("meta")
            .insert("schema_version", 1)
            .expect("insert");
        txn.commit().expect("commit");
    }
    let err = oncebox::Host::builder(&ledger).build().await.expect_err("another schema");
    let message = format!("{err:#}");
    assert!(message.contains("ledger.redb") && message.contains("schema version 1"), "{message}");
    assert!(message.contains("reads version 7"), "{message}");
    // Nothing was migrated or overwritten: the old version's records are still there.
    let db = redb::Database::open(&ledger).expect("still a redb file");
    let txn = redb::ReadableDatabase::begin_read(&db).expect("read");
    let meta = txn.open_table(redb::TableDefinition::<&str, u64>::new("meta")).expect("meta");
    assert_eq!(meta.get("schema_version").expect("get").map(|v| v.value()), Some(1));
    assert!(txn.open_table(redb::TableDefinition::<&str, &[u8]>::new("records")).is_err(), "no table was added");
}

#[tokio::test]
async fn a_schema_2_ledger_is_migrated_and_its_kv_values_keep_their_bytes() {
    let dir = tempfile::tempdir().expect("dir");
    let ledger = dir.path().join("ledger.redb");
    {
        // What schema 2 left: KV values without versions.
        let db = redb::Database::create(&ledger).expect("create");
        let txn = db.begin_write().expect("write");
        txn.open_table(redb::TableDefinition::<&str, u64>::new("meta"))
            .expect("meta")
            .insert("schema_version", 2)
            .expect("insert");
        txn.open_table(redb::TableDefinition::<(&str, &str), &[u8]>::new("kv"))
            .expect("kv")
            .insert(("reservations", "reserved/sku-1"), b"4".as_slice())
            .expect("insert");
        txn.commit().expect("commit");
    }
    let provider = Provider::start().await.expect("provider");
    let host = host_for(&ledger, &provider, true).await;
    assert_eq!(host.ledger().kv_entry("reservations", "reserved/sku-1").await.expect("kv"), Some((b"4".to_vec(), 1)));
    let args = serde_json::json!({"order_id": "o-9", "sku": "sku-1", "quantity": 1}).to_string();
    let outcome = host.call(oncebox::Call::step("r", "s", "reserve", args)).await.expect("call");
    assert_eq!(outcome.output.expect("output")["reserved_total"], 5, "the migrated count was read");
    let (value, version) = host.ledger().kv_entry("reservations", "reserved/sku-1").await.expect("kv").expect("entry");
    assert_eq!(value, b"5");
    assert_ne!(version, 1, "a write stamps a new version");
}

/// The owner of an irreversible step, as the host that takes it over finds it: it sent the
/// fulfillment once, heard 429 (proven not taken, and recorded, as a shared ledger records an
/// answer at once), and stopped before it recorded the attempt.
#[derive(Default)]
struct StopsAfterItsAnswer {
    sent: std::sync::atomic::AtomicU32,
    stopped: std::sync::atomic::AtomicBool,
}

impl oncebox_runtime::hooks::Hooks for StopsAfterItsAnswer {
    fn at(&self, site: oncebox_runtime::hooks::Site) -> oncebox_runtime::hooks::HookFuture<'_, ()> {
        Box::pin(async move {
            if site.point == oncebox_runtime::hooks::Point::AfterAnswer {
                self.stopped.store(true, std::sync::atomic::Ordering::SeqCst);
                std::future::pending::<()>().await;
            }
        })
    }

    fn http(
        &self,
        _site: oncebox_runtime::hooks::Site,
        _request: oncebox_runtime::hooks::Outgoing,
    ) -> oncebox_runtime::hooks::HookFuture<'_, oncebox_runtime::hooks::Exchange> {
        self.sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let headers = vec![("retry-after".to_string(), "1".to_string())];
        Box::pin(async move { oncebox_runtime::hooks::Exchange::Answered { status: 429, headers, body: Vec::new() } })
    }

    fn read(
        &self,
        _request: oncebox_runtime::hooks::Outgoing,
    ) -> oncebox_runtime::hooks::HookFuture<'_, oncebox_runtime::hooks::Exchange> {
        Box::pin(async { oncebox_runtime::hooks::Exchange::NotConnected })
    }

    fn target(&self) -> oncebox::HttpTarget {
        oncebox::HttpTarget::default()
    }
}

/// DESIGN section 7: a take-over is an attempt when the stopped owner's attempt wrote an effect
/// ahead, judged from what it left and never run again under its number. So the host never sends
/// an irreversible effect twice, even one whose first send was proven not taken: the step fails,
/// and sending it again takes a new step and a new approval. Counted where the sends land.
#[tokio::test]
async fn a_take_over_never_sends_an_irreversible_effect_again_even_after_a_send_proven_not_taken() {
    let dir = tempfile::tempdir().expect("dir");
    let ledger = oncebox::Ledger::open(dir.path().join("ledger.redb")).expect("ledger");
    an_irreversible_step_taken_over_after_its_send_sends_nothing([ledger.clone(), ledger], dir).await;
}

/// The same on PostgreSQL, two hosts each with its own connections, where an answer is recorded
/// for every host at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_shared_ledger_a_take_over_never_sends_an_irreversible_effect_again() {
    let dir = tempfile::tempdir().expect("dir");
    let url = crate::pg::fresh_database().await;
    let first = oncebox::Ledger::connect(&url).await.expect("ledger");
    let second = oncebox::Ledger::connect(&url).await.expect("ledger");
    an_irreversible_step_taken_over_after_its_send_sends_nothing([first, second], dir).await;
}

/// Hosts on `ledgers` (the first stops), as the tests configure them, with a short lease.
fn take_over_hosts(
    ledger: &oncebox::Ledger,
    dir: &tempfile::TempDir,
    provider: &oncebox_example_provider::ProviderHandle,
) -> oncebox::HostBuilder {
    let on = oncebox::HostBuilder::on_ledger(ledger.clone()).key_file(dir.path().join("hosts.key"));
    crate::support::configure(on, provider, false).lease(TAKE_OVER_LEASE)
}

const TAKE_OVER_LEASE: std::time::Duration = std::time::Duration::from_millis(300);

/// Runs `call` on a host whose send is answered 429 and which stops right after recording it,
/// then waits out its lease: what the next host finds. A tool that needs approval is approved
/// first (its request's key is returned).
async fn stopped_after_a_429(
    ledger: &oncebox::Ledger,
    dir: &tempfile::TempDir,
    provider: &oncebox_example_provider::ProviderHandle,
    call: &oncebox::Call,
) -> (std::sync::Arc<StopsAfterItsAnswer>, Option<String>) {
    use std::sync::atomic::Ordering;
    let owner = std::sync::Arc::new(StopsAfterItsAnswer::default());
    let first = take_over_hosts(ledger, dir, provider).hooks(owner.clone()).build().await.expect("host");
    crate::support::load_all(&first).await;
    let mut key = None;
    if first.manifest(&call.tool).expect("loaded").class == oncebox::ReplayClass::Irreversible {
        let asked = first.call(call.clone()).await.expect("call");
        crate::support::approve(&first, &asked).await;
        key = asked.operation_key;
    }
    let running = tokio::spawn({
        let (first, call) = (first.clone(), call.clone());
        async move { first.call(call).await }
    });
    eventually("the owner stopped after its answer", || owner.stopped.load(Ordering::SeqCst)).await;
    running.abort();
    assert!(running.await.is_err_and(|e| e.is_cancelled()));
    drop(first);
    tokio::time::sleep(TAKE_OVER_LEASE * 2).await;
    (owner, key)
}

async fn an_irreversible_step_taken_over_after_its_send_sends_nothing(
    [first, second]: [oncebox::Ledger; 2],
    dir: tempfile::TempDir,
) {
    use std::sync::atomic::Ordering;
    let provider = Provider::start().await.expect("provider");
    let args =
        serde_json::json!({"order_id": "o-1", "address": "1 Main St", "items": [{"sku": "sku-1", "quantity": 1}]});
    let call = oncebox::Call::step("run-1", "ship", "fulfill", args.to_string());
    let (owner, key) = stopped_after_a_429(&first, &dir, &provider, &call).await;
    let key = key.expect("the request's key");
    let effects = second.effects(&key).await.expect("effects");
    assert_eq!(effects.len(), 1, "{effects:?}");
    assert_eq!((effects[0].status, effects[0].dispatches), (EffectStatus::Retryable, 1), "{effects:?}");

    let host = take_over_hosts(&second, &dir, &provider).build().await.expect("host");
    crate::support::load_all(&host).await;
    let outcome = host.call(call.clone()).await.expect("call");
    assert_eq!(outcome.status, Status::Failed, "{outcome:?}");
    assert_eq!(owner.sent.load(Ordering::SeqCst), 1, "the stopped owner's one send");
    assert_eq!(provider.requests(), 0, "the host that took the step over sent nothing");
    let attempts = second.attempts(&key).await.expect("attempts");
    let outcomes: Vec<(u32, &str)> = attempts.iter().map(|a| (a.attempt, a.outcome.as_str())).collect();
    assert_eq!(outcomes, [(1, "interrupted")], "the stopped attempt counts: {attempts:?}");
    assert_eq!(attempts[0].effects.len(), 1, "{attempts:?}");
    let error = outcome.error.expect("why");
    assert!(error.message.contains("stopped"), "{error:?}");

    // Asked again: the record answers. The same intent is a new step, with an approval of its own.
    let again = host.call(call).await.expect("call");
    assert!(again.replayed && again.status == Status::Failed, "{again:?}");
    let anew = host.call(oncebox::Call::step("run-1", "ship-again", "fulfill", args.to_string())).await;
    assert_eq!(anew.expect("call").status, Status::AwaitingApproval);
    assert_eq!((provider.requests(), provider.counts("o-1").fulfillments), (0, 0));
}

/// A compensatable step taken over after the same stop: the stopped attempt is attempt 1 (nothing
/// of it was taken), and attempt 2 sends the charge with its key: charged once, in two attempts.
#[tokio::test]
async fn a_take_over_counts_the_stopped_attempt_and_retries_within_the_class_budget() {
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().expect("dir");
    let ledger = oncebox::Ledger::open(dir.path().join("ledger.redb")).expect("ledger");
    let provider = Provider::start().await.expect("provider");
    let call = oncebox::Call::step("run-1", "charge", "charge", charge("o-1").to_string());
    let (owner, _) = stopped_after_a_429(&ledger, &dir, &provider, &call).await;
    let host = take_over_hosts(&ledger, &dir, &provider).build().await.expect("host");
    crate::support::load_all(&host).await;
    let outcome = host.call(call).await.expect("call");
    assert_eq!(outcome.status, Status::Completed, "{outcome:?}");
    assert_eq!(outcome.attempts, 2, "{outcome:?}");
    let key = outcome.operation_key.expect("key");
    let attempts = ledger.attempts(&key).await.expect("attempts");
    let outcomes: Vec<&str> = attempts.iter().map(|a| a.outcome.as_str()).collect();
    assert_eq!(outcomes, ["interrupted", "ok"], "{attempts:?}");
    assert_eq!(owner.sent.load(Ordering::SeqCst), 1);
    provider.settled().await;
    assert_eq!((provider.requests(), provider.counts("o-1").payments), (1, 1));
}

/// Effects written by a release from before attempts were stamped (`attempt: 0`), left by a host
/// that stopped, met by the next open's recovery of a real ledger file: an unlisted one counts as
/// the stopped attempt's (recorded, listing it, its operation unknown), and one a recorded
/// attempt already lists is not counted again (`rules::unrecorded_sends`).
#[tokio::test]
async fn recovery_counts_an_older_release_s_unlisted_effect_as_the_stopped_attempt_s_once() {
    use oncebox::ledger::{AttemptEffect, Claim, EffectSource, EffectStatus, OperationStatus};
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("ledger.redb");
    let request = |key: &str| {
        let mut request = crate::conformance::request(key, "a-host-that-stops", 1_000);
        request.lease_ms = 60_000;
        request
    };
    let old = |op: &str, n: u32, status: EffectStatus| {
        let mut effect = crate::conformance::effect(op, n, status, 1);
        effect.attempt = 0;
        effect
    };
    {
        let ledger = oncebox::Ledger::open(&path).expect("ledger");
        // `a`: its one effect sent, nothing else recorded.
        let Claim::Owned { fence, .. } = ledger.claim(&request("a")).await.expect("claim") else { panic!() };
        ledger.put_effect(fence, &old("a", 1, EffectStatus::Dispatched), None, Vec::new()).await.expect("a1");
        // `b`: attempt 1 recorded listing b1; then b2 sent, and the host stops.
        let Claim::Owned { fence, .. } = ledger.claim(&request("b")).await.expect("claim") else { panic!() };
        let b1 = old("b", 1, EffectStatus::Completed);
        ledger.put_effect(fence, &b1, None, Vec::new()).await.expect("b1");
        let mut first = crate::conformance::attempt("b", 1, fence);
        first.effects = vec![AttemptEffect {
            key: b1.key.clone(),
            label: b1.label.clone(),
            source: EffectSource::Fresh,
            status: EffectStatus::Completed,
        }];
        ledger.record_attempt(fence, &first, None, 1_001, Vec::new()).await.expect("attempt 1");
        ledger.put_effect(fence, &old("b", 2, EffectStatus::Dispatched), None, Vec::new()).await.expect("b2");
    }

    let ledger = oncebox::Ledger::open(&path).expect("reopened");
    for (op, attempts, listed) in [
        ("a", 1, vec![old("a", 1, EffectStatus::Dispatched).key]),
        ("b", 2, vec![old("b", 2, EffectStatus::Dispatched).key]),
    ] {
        let record = ledger.operation(op).await.expect("read").expect("recorded");
        assert_eq!((record.status, record.attempts), (OperationStatus::Unknown, attempts), "{op}: {record:?}");
        let recorded = ledger.attempts(op).await.expect("attempts");
        let last = recorded.iter().max_by_key(|a| a.attempt).expect("an attempt");
        assert_eq!(last.attempt, attempts, "{op}: {recorded:?}");
        let keys: Vec<String> = last.effects.iter().map(|e| e.key.clone()).collect();
        assert_eq!(keys, listed, "{op}: the stopped attempt lists what it sent, and only that");
    }
}

/// An effect stamped attempt 0 (a release before attempts were stamped wrote it, the operation in
/// flight across the upgrade), met by a take-over on a shared ledger: no recorded attempt lists
/// it, so the stopped attempt counts (`rules::unrecorded_sends`) and is recorded listing it, and
/// the next attempt sends the charge with its key: charged once, in the class's budget. Counted
/// where the sends land.
#[tokio::test]
async fn a_take_over_counts_an_older_release_s_unlisted_send_as_the_stopped_attempt() {
    let dir = tempfile::tempdir().expect("dir");
    let ledger = oncebox::Ledger::open(dir.path().join("ledger.redb")).expect("ledger");
    an_older_release_s_send_taken_over_counts_once([ledger.clone(), ledger], dir).await;
}

/// The same on PostgreSQL, two hosts each with its own connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_shared_ledger_a_take_over_counts_an_older_release_s_unlisted_send() {
    let dir = tempfile::tempdir().expect("dir");
    let url = crate::pg::fresh_database().await;
    let first = oncebox::Ledger::connect(&url).await.expect("ledger");
    let second = oncebox::Ledger::connect(&url).await.expect("ledger");
    an_older_release_s_send_taken_over_counts_once([first, second], dir).await;
}

async fn an_older_release_s_send_taken_over_counts_once([first, second]: [oncebox::Ledger; 2], dir: tempfile::TempDir) {
    use std::sync::atomic::Ordering;
    let provider = Provider::start().await.expect("provider");
    let call = oncebox::Call::step("run-1", "charge", "charge", charge("o-1").to_string());
    let (owner, _) = stopped_after_a_429(&first, &dir, &provider, &call).await;
    // What an older host leaves: the same send, its record without the attempt's stamp.
    let ops = second.operations(Some("run-1")).await.expect("operations");
    let [op] = ops.as_slice() else { panic!("one operation: {ops:?}") };
    let [sent] = <[_; 1]>::try_from(second.effects(&op.key).await.expect("effects")).expect("one effect");
    assert_eq!((sent.status, sent.dispatches, sent.attempt), (EffectStatus::Retryable, 1, 1), "{sent:?}");
    let old = oncebox::ledger::EffectRecord { attempt: 0, ..sent.clone() };
    second.put_effect(op.fence, &old, Some((sent.status, sent.dispatches)), Vec::new()).await.expect("unstamped");

    let host = take_over_hosts(&second, &dir, &provider).build().await.expect("host");
    crate::support::load_all(&host).await;
    let outcome = host.call(call).await.expect("call");
    assert_eq!((outcome.status, outcome.attempts), (Status::Completed, 2), "the stopped attempt counts: {outcome:?}");
    let attempts = second.attempts(&op.key).await.expect("attempts");
    let record: Vec<(u32, &str, Vec<&str>)> = attempts
        .iter()
        .map(|a| (a.attempt, a.outcome.as_str(), a.effects.iter().map(|e| e.key.as_str()).collect()))
        .collect();
    assert_eq!(
        record,
        [(1, "interrupted", vec![sent.key.as_str()]), (2, "ok", vec![sent.key.as_str()])],
        "the stopped attempt lists what it sent: {attempts:?}"
    );
    assert_eq!(owner.sent.load(Ordering::SeqCst), 1, "the stopped owner's one send");
    provider.settled().await;
    assert_eq!((provider.requests(), provider.counts("o-1").payments), (1, 1), "charged once");
}

/// A person's word that they undid a step by hand, claimed and never recorded (what a crash
/// between its two writes leaves on a shared ledger, where a claim is durable): recovery names it
/// for what it is, with the command that says it again, and the same word said again takes the
/// claim over and records it, which closes the run.
#[tokio::test]
async fn a_word_undone_by_hand_left_claimed_is_named_by_recovery_and_recorded_when_said_again() {
    use oncebox::keys::{BY_HAND, FingerprintKey, canonical_json, operation_key};
    use oncebox::ledger::{AttemptRecord, Claim, ClaimRequest, Ledger};

    let dir = tempfile::tempdir().expect("dir");
    let ledger = Ledger::open(dir.path().join("l.redb")).expect("ledger");
    let keying = FingerprintKey::new(vec![[7; 32]]).expect("key");
    let paid = crate::conformance::request("paid", "host", 1_000);
    let Ok(Claim::Owned { fence, .. }) = ledger.claim(&paid).await else { panic!("not claimed") };
    let attempt = AttemptRecord { run_id: "run".into(), ..crate::conformance::attempt("paid", 1, fence) };
    let finish = Some((OperationStatus::Completed, Some("{}".into()), None));
    ledger.record_attempt(fence, &attempt, finish, 1_001, Vec::new()).await.expect("record");
    // The word's claim, as `undone_by_hand` makes it, its lease long over; its record never came.
    let step = format!("{}paid", oncebox::saga::COMPENSATION_PREFIX);
    let identity = canonical_json(&serde_json::json!({ "undoes": "paid" }));
    let word = ClaimRequest {
        key: operation_key("run", &step, BY_HAND),
        step_id: step,
        tool: BY_HAND.into(),
        class: oncebox::ReplayClass::IdempotentWrite,
        fingerprint: keying.fingerprint(BY_HAND, &identity),
        ..crate::conformance::request("word", &format!("{BY_HAND} (ops)"), 2_000)
    };
    assert!(matches!(ledger.claim(&word).await, Ok(Claim::Owned { .. })));

    let report = oncebox::recovery::report(&ledger, Some("run")).await.expect("report");
    let run = &report["run"];
    assert_eq!(run.available.len(), 1, "{run:?}");
    let next = run.available[0].next.as_deref().unwrap_or_default();
    assert!(
        next.contains("did not finish") && next.contains("oncebox undone-by-hand") && next.contains(" paid "),
        "{next}"
    );

    let said = oncebox::saga::undone_by_hand(&ledger, &keying, "paid", "ops", Some("refund R-1")).await.expect("said");
    assert!(said.recorded && said.recorded_as == word.key, "{said:?}");
    assert!(ledger.open_runs(Some("run"), ledger.now_ms()).await.expect("open").is_empty(), "the run closed");
}
