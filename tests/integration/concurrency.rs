//! Many callers, one ledger: the claim decides who is first, atomically.

use oncebox::Status;
use oncebox_example_provider::{Fault, FaultKind, Route};

use crate::support::{Fixture, charge};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_callers_on_one_step_dispatch_once() {
    let f = Fixture::new().await;
    // Hold the charge long enough that every caller arrives while the first is still running.
    f.provider.arm(Fault::new(Route::Payments, FaultKind::Delay { delay_ms: 500 }).for_order("o-1"));
    let calls = (0..64).map(|_| {
        let host = f.host.clone();
        tokio::spawn(async move {
            host.call(oncebox::Call::step("run-1", "charge", "charge", charge("o-1").to_string())).await
        })
    });
    let mut statuses = Vec::new();
    for call in calls.collect::<Vec<_>>() {
        statuses.push(call.await.expect("task").expect("call").status);
    }
    let completed = statuses.iter().filter(|s| **s == Status::Completed).count();
    let in_progress = statuses.iter().filter(|s| **s == Status::InProgress).count();
    assert_eq!(completed, 1, "{statuses:?}");
    assert_eq!(in_progress, 63, "{statuses:?}");
    assert_eq!(f.provider.requests(), 1, "exactly one attempt dispatched");
    assert_eq!(f.provider.counts("o-1").payments, 1);

    // Once it is recorded, every caller gets the same answer from the ledger.
    let again = f.call("run-1", "charge", "charge", &charge("o-1")).await;
    assert!(again.replayed && again.is_completed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_asks_to_wait_gets_the_result_when_it_lands() {
    let f = Fixture::new().await;
    f.provider.arm(Fault::new(Route::Payments, FaultKind::Delay { delay_ms: 400 }).for_order("o-1"));
    let first = tokio::spawn({
        let host = f.host.clone();
        async move { host.call(oncebox::Call::step("run-1", "charge", "charge", charge("o-1").to_string())).await }
    });
    crate::support::eventually("the first call reached the provider", || f.provider.requests() == 1).await;
    let waiting = oncebox::Call::step("run-1", "charge", "charge", charge("o-1").to_string())
        .waiting(std::time::Duration::from_secs(10));
    let second = f.host.call(waiting).await.expect("call");
    let first = first.await.expect("task").expect("call");
    assert_eq!(first.status, Status::Completed);
    assert_eq!(second.status, Status::Completed, "{second:?}");
    assert!(second.replayed, "the waiting caller got the recorded result");
    assert_eq!(second.output, first.output);
    assert_eq!(f.provider.requests(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stalled_past_its_lease_is_fenced_out() {
    let dir = tempfile::tempdir().expect("dir");
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let host = crate::support::builder_for(&dir.path().join("l.redb"), &provider, true)
        .lease(std::time::Duration::from_millis(200))
        .build()
        .await
        .expect("host");
    crate::support::load_all(&host).await;
    // Busy: the guest never yields, so A's thread is stuck and cannot renew its lease.
    let args = serde_json::json!({"mode": "busy", "sleep_ms": 2000, "write_first": true, "echo": "done"}).to_string();
    let call = || oncebox::Call::step("run-1", "slow", "panicky", args.clone());

    // Worker A claims, stages its effect, then stalls far past its 200 ms lease.
    let stalled = tokio::spawn({
        let host = host.clone();
        let call = call();
        async move { host.call(call).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    // Worker B finds the lease expired and takes over with a new fencing token.
    let taken_over = host.call(call()).await.expect("the new owner's call");
    assert_eq!(taken_over.status, Status::Completed, "{taken_over:?}");

    // A wakes up: everything it tries to record is refused by token, and B's result stands.
    let fenced = stalled.await.expect("task");
    assert!(matches!(fenced, Err(oncebox::CallError::Ledger(oncebox::LedgerError::Fenced { .. }))), "{fenced:?}");
    let key = taken_over.operation_key.expect("key");
    let op = host.ledger().operation(&key).await.expect("read").expect("op");
    assert_eq!(op.fence, 2);
    assert_eq!(op.status, oncebox::ledger::OperationStatus::Completed);
    assert_eq!(op.output.as_deref().map(|o| o.contains("done")), Some(true));
    let effects = host.ledger().effects(&key).await.expect("effects");
    assert_eq!(effects.len(), 1, "the KV effect was written once, by B");
    let attempts = host.ledger().attempts(&key).await.expect("attempts");
    assert!(attempts.iter().all(|a| a.fence == 2), "nothing of A's was recorded after the takeover");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_slow_owner_renews_its_lease_and_a_waiting_caller_gets_its_result() {
    let dir = tempfile::tempdir().expect("dir");
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    // The lease is far shorter than the call: without renewal the waiter would take over. Long
    // enough that a renewal (every third of it) is not missed on a loaded machine.
    let host = crate::support::builder_for(&dir.path().join("l.redb"), &provider, true)
        .lease(std::time::Duration::from_millis(450))
        .build()
        .await
        .expect("host");
    crate::support::load_all(&host).await;
    let args = serde_json::json!({"mode": "sleep", "sleep_ms": 2000, "write_first": true, "echo": "slow"}).to_string();
    let call = || oncebox::Call::step("run-1", "slow", "panicky", args.clone());
    let owner = tokio::spawn({
        let (host, call) = (host.clone(), call());
        async move { host.call(call).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    let waiter = host.call(call().waiting(std::time::Duration::from_secs(10))).await.expect("waiting call");
    let owner = owner.await.expect("task").expect("the owner is never fenced out");
    assert_eq!(owner.status, Status::Completed, "{owner:?}");
    assert!(waiter.replayed && waiter.is_completed(), "the waiter got the owner's result: {waiter:?}");
    let key = owner.operation_key.expect("key");
    let attempts = host.ledger().attempts(&key).await.expect("attempts");
    assert_eq!(attempts.len(), 1, "one attempt, by the owner: {attempts:?}");
    assert_eq!(host.ledger().operation(&key).await.expect("read").expect("op").fence, 1, "never taken over");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_reservations_of_one_sku_lose_no_update() {
    let f = Fixture::new().await;
    let calls: Vec<_> = (0..16)
        .map(|i| {
            let host = f.host.clone();
            let args = serde_json::json!({"order_id": format!("o-{i}"), "sku": "sku-1", "quantity": 1}).to_string();
            tokio::spawn(async move {
                host.call(oncebox::Call::step("run-1", format!("reserve-{i}"), "reserve", args)).await
            })
        })
        .collect();
    let mut totals = Vec::new();
    for call in calls {
        let outcome = call.await.expect("task").expect("call");
        assert_eq!(outcome.status, Status::Completed, "{outcome:?}");
        totals.push(outcome.output.expect("output")["reserved_total"].as_u64().expect("total"));
    }
    totals.sort_unstable();
    assert_eq!(totals, (1..=16).collect::<Vec<u64>>(), "each reservation saw the ones before it, none lost");
    let stored = f.host.ledger().kv_get("reservations", "reserved/sku-1").await.expect("kv").expect("counter");
    assert_eq!(stored, b"16");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_reservations_never_reserve_more_than_the_cap() {
    let dir = tempfile::tempdir().expect("dir");
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let host = crate::support::builder_for(&dir.path().join("l.redb"), &provider, true)
        .tool_config("reserve", "max_per_sku", "10")
        .build()
        .await
        .expect("host");
    crate::support::load_all(&host).await;
    let calls: Vec<_> = (0..16)
        .map(|i| {
            let host = host.clone();
            let args = serde_json::json!({"order_id": format!("o-{i}"), "sku": "sku-1", "quantity": 1}).to_string();
            tokio::spawn(async move {
                host.call(oncebox::Call::step("run-1", format!("reserve-{i}"), "reserve", args)).await
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for call in calls {
        statuses.push(call.await.expect("task").expect("call").status);
    }
    let completed = statuses.iter().filter(|s| **s == Status::Completed).count();
    assert_eq!(completed, 10, "{statuses:?}");
    assert!(statuses.iter().all(|s| matches!(s, Status::Completed | Status::Failed)), "{statuses:?}");
    let stored = host.ledger().kv_get("reservations", "reserved/sku-1").await.expect("kv").expect("counter");
    assert_eq!(stored, b"10", "never oversold");
}

/// Take-overs of one operation, in memory (nothing durable yet) and on disk (after its first
/// write), racing the owners' write-aheads: every owner gets a fence no other owner ever held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_never_repeat_across_in_memory_and_durable_take_overs() {
    use oncebox::ledger::{Claim, ClaimRequest, EffectRecord, EffectStatus};
    let dir = tempfile::tempdir().expect("dir");
    let ledger = oncebox::Ledger::open(dir.path().join("l.redb")).expect("ledger");
    let request = |op: &str, owner: usize, now_ms: u64| ClaimRequest {
        key: op.into(),
        run_id: "run".into(),
        step_id: op.into(),
        tool: "charge".into(),
        class: oncebox::ReplayClass::Compensatable,
        fingerprint: "args".into(),
        older_fingerprints: Vec::new(),
        args: serde_json::Value::Null,
        owner: format!("owner-{owner}"),
        now_ms,
        lease_ms: 10,
        approval: None,
        sealed: None,
    };
    let effect = |op: &str, owner: usize| EffectRecord {
        key: format!("{op}-effect-{owner}"),
        operation_key: op.into(),
        label: "charge".into(),
        occurrence: owner as u32,
        kind: "http".into(),
        target: "bank:443".into(),
        fingerprint: "f".into(),
        status: EffectStatus::Dispatched,
        response: None,
        sealed: None,
        error: None,
        dispatches: 1,
        first_dispatched_ms: 0,
        last_dispatched_ms: 0,
        updated_ms: 0,
        resolution: None,
        attempt: 1,
    };
    for round in 0..50 {
        let op = format!("op-{round}");
        let mut fences = Vec::new();
        let mut writes = Vec::new();
        // Each owner claims after the previous lease ran out, then starts its write-ahead without
        // waiting for it: the next owner's claim races the commit.
        for owner in 0..4 {
            let now = 1_000 + owner as u64 * 100;
            if let Claim::Owned { fence, .. } = ledger.claim(&request(&op, owner, now)).await.expect("claim") {
                fences.push(fence);
                let (ledger, effect) = (ledger.clone(), effect(&op, owner));
                writes.push(tokio::spawn(async move { ledger.put_effect(fence, &effect, None, Vec::new()).await }));
                tokio::task::yield_now().await;
            }
        }
        for write in writes {
            let _ = write.await.expect("task");
        }
        let mut unique = fences.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), fences.len(), "round {round}: a fence was handed out twice: {fences:?}");
        // Whatever raced, at most one owner's write-ahead is on record per fence the op holds now.
        let held = ledger.operation(&op).await.expect("read").map(|op| op.fence);
        assert!(held.is_none_or(|fence| fences.contains(&fence)), "round {round}: {held:?} not among {fences:?}");
    }
}

#[tokio::test]
async fn a_second_process_on_the_same_ledger_gets_a_clear_error_and_the_file_stays_whole() {
    let dir = tempfile::tempdir().expect("dir");
    let ledger = dir.path().join("ledger.redb");
    let host = oncebox::Host::builder(&ledger).build().await.expect("first process");
    host.load(oncebox_artifacts::PANICKY).await.expect("load");
    let call = oncebox::Call::step("r", "s", "panicky", serde_json::json!({"mode": "ok", "echo": "kept"}).to_string());
    assert_eq!(host.call(call.clone()).await.expect("call").status, oncebox::Status::Completed);

    let second = std::process::Command::new(env!("CARGO_BIN_EXE_oncebox"))
        .args(["ledger", "list", "--ledger", ledger.to_str().expect("utf8")])
        .env("ONCEBOX_CACHE", "off")
        .output()
        .expect("run a second process");
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(3), "a host failure, not a hang: {stderr}");
    assert!(stderr.contains("open in another process"), "{stderr}");
    assert!(stderr.contains("serve it from that process, or use a shared backend"), "{stderr}");

    // The first process goes on, and after it closes the file, it opens with every record.
    let again = host.call(call.clone()).await.expect("call");
    assert!(again.replayed);
    drop(host);
    let reopened = oncebox::Host::builder(&ledger).build().await.expect("reopen after the first process closed");
    reopened.load(oncebox_artifacts::PANICKY).await.expect("load");
    let replay = reopened.call(call).await.expect("call");
    assert!(replay.replayed, "{replay:?}");
    assert_eq!(replay.output.expect("output")["echo"], "kept");
}

#[tokio::test]
async fn a_call_whose_effects_are_all_local_is_one_commit_and_a_remote_effect_adds_one() {
    let f = Fixture::new().await;
    let ledger = f.host.ledger();
    // reserve: two KV reads and two KV writes; the claim, the writes and the result in one commit.
    let before = ledger.commits();
    let reserve = serde_json::json!({"order_id": "o-1", "sku": "sku-1", "quantity": 2});
    let outcome = f.call("run-1", "reserve", "reserve", &reserve).await;
    assert_eq!(outcome.status, Status::Completed, "{outcome:?}");
    assert_eq!(ledger.commits() - before, 1, "one durable commit for a local-only call");
    assert_eq!(ledger.kv_get("reservations", "reserved/sku-1").await.expect("kv").as_deref(), Some(&b"2"[..]));
    let key = outcome.operation_key.expect("key");
    assert_eq!(ledger.effects(&key).await.expect("effects").len(), 2, "both writes recorded with their effects");

    // charge: the write-ahead, then the result with the answer riding on it.
    let before = ledger.commits();
    let outcome = f.call("run-1", "charge", "charge", &charge("o-1")).await;
    assert_eq!(outcome.status, Status::Completed, "{outcome:?}");
    assert_eq!(ledger.commits() - before, 2);
    assert_eq!(f.provider.counts("o-1").payments, 1);

    // A replay is answered from committed state: no commit at all.
    let before = ledger.commits();
    assert!(f.call("run-1", "reserve", "reserve", &reserve).await.replayed);
    assert_eq!(ledger.commits(), before);
}
