//! What rides (a new operation's claim, an effect's answer: committed without waiting for the
//! WAL flush, `postgres/riding.rs`), and what the host does when a server crash loses it.

use std::time::Duration;

use oncebox::ledger::{Claim, Ledger, LedgerError};

use super::{claimed, connect, fresh_database, host_on, provider, request};

/// A charge step on the shared ledger: the write-ahead and the attempt's record are durable
/// commits; the claim before them and the answer between them are not (each rides with the next).
/// The answer is visible to another host at once, charged once, and the step replays from the
/// ledger without a commit. A local-only call is one durable commit here, its record, as on redb.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_step_is_two_durable_commits_its_claim_and_answer_riding_with_the_next() {
    use oncebox::{Call, Status};
    let (url, dir, provider) = (fresh_database().await, tempfile::tempdir().expect("dir"), provider().await);
    let host = host_on(&url, &dir, &provider, true, |builder| builder).await;
    let ledger = host.ledger();

    let before = ledger.commits();
    let charge = Call::step("run", "charge", "charge", crate::support::charge("o-1").to_string());
    let outcome = host.call(charge.clone()).await.expect("call");
    assert_eq!(outcome.status, Status::Completed, "{outcome:?}");
    assert_eq!(ledger.commits() - before, 2, "the write-ahead and the record; not the claim, not the answer");
    assert_eq!(provider.counts("o-1").payments, 1);

    // Another host sees the answer: committed, whatever its flush.
    let other = Ledger::connect(&url).await.expect("another host");
    let key = outcome.operation_key.clone().expect("key");
    let effects = other.effects(&key).await.expect("effects");
    assert_eq!(effects.len(), 1, "{effects:?}");
    assert_eq!(effects[0].status, oncebox::ledger::EffectStatus::Completed, "{effects:?}");
    assert!(effects[0].response.is_some(), "the answer is recorded: {effects:?}");

    let before = ledger.commits();
    let again = host.call(charge).await.expect("replay");
    assert!(again.replayed && again.status == Status::Completed, "{again:?}");
    assert_eq!(ledger.commits(), before, "a replay commits nothing");
    assert_eq!(provider.counts("o-1").payments, 1);

    let before = ledger.commits();
    let reserve = serde_json::json!({"order_id": "o-1", "sku": "sku-1", "quantity": 2});
    provider.set_stock("sku-1", 10);
    let reserved = host.call(Call::step("run", "reserve", "reserve", reserve.to_string())).await.expect("call");
    assert_eq!(reserved.status, Status::Completed, "{reserved:?}");
    assert_eq!(ledger.commits() - before, 1, "a local-only call: its record, its claim riding with it");
}

/// A new operation's claim rides with its owner's next flushed write, and is lost if the server
/// crashes before then (the state a crash leaves: no row). Another host may then claim the
/// operation anew with the same first fence: the lost claim's owner is refused every write
/// (nothing is written or sent), and the new owner's go ahead. A claim that was not lost is
/// carried to disk by its owner's first write-ahead.
#[tokio::test]
async fn a_riding_claim_the_database_lost_refuses_its_owners_writes() {
    use crate::conformance::{attempt, effect};
    use oncebox::ledger::{EffectStatus, OperationStatus};
    let url = fresh_database().await;
    let (ledger, other) = (Ledger::connect(&url).await.expect("connect"), Ledger::connect(&url).await.expect("b"));
    let before = ledger.commits();
    let fences = claimed(&ledger, &["lost".to_string(), "kept".to_string()]).await;
    assert_eq!(fences, [1, 1]);
    assert_eq!(ledger.commits(), before, "the claims rode");

    lose_claim(&url, "lost").await;
    let theirs = other.claim(&request("lost", "b", 1_000)).await.expect("claim anew");
    assert!(matches!(theirs, Claim::Owned { fence: 1, .. }), "the same first fence: {theirs:?}");
    let ahead = effect("lost", 1, EffectStatus::Dispatched, 1);
    for _ in 0..2 {
        let refused = ledger.put_effect(1, &ahead, None, Vec::new()).await;
        assert!(matches!(refused, Err(LedgerError::ClaimLost { .. })), "{refused:?}");
    }
    let finish = Some((OperationStatus::Failed, None, None));
    let refused = ledger.record_attempt(1, &attempt("lost", 1, 1), finish, 2, Vec::new()).await;
    assert!(matches!(refused, Err(LedgerError::ClaimLost { .. })), "{refused:?}");
    assert!(ledger.effects("lost").await.expect("read").is_empty(), "nothing of the refused writes");
    other.put_effect(1, &ahead, None, Vec::new()).await.expect("the new owner's write-ahead");
    assert_eq!(ledger.effects("lost").await.expect("read").len(), 1);
    // Nor does it keep the new owner's lease alive.
    let lease = |op: Option<oncebox::ledger::OperationRecord>| op.expect("written ahead").lease_until_ms;
    let before = lease(other.operation("lost").await.expect("read"));
    let refused = ledger.renew("lost", 1, 9_000_000).await;
    assert!(matches!(refused, Err(LedgerError::ClaimLost { .. })), "{refused:?}");
    assert_eq!(lease(other.operation("lost").await.expect("read")), before);

    // The claim not lost: the owner's write-ahead is a flushed commit, and carries it.
    let before = ledger.commits();
    ledger.put_effect(1, &effect("kept", 1, EffectStatus::Dispatched, 1), None, Vec::new()).await.expect("kept");
    assert_eq!(ledger.commits() - before, 1);

    // Lost again, and claimed anew on this same host: the new owner holds a fence the first never
    // did, so the first is fenced (both would write with fence 1 from one host otherwise).
    claimed(&ledger, &["here".to_string()]).await;
    lose_claim(&url, "here").await;
    let gone = ledger.put_effect(1, &effect("here", 1, EffectStatus::Dispatched, 1), None, Vec::new()).await;
    assert!(matches!(gone, Err(LedgerError::ClaimLost { .. })), "with no row yet: {gone:?}");
    let again = ledger.claim(&request("here", "a", 2_000)).await.expect("claim anew here");
    let Claim::Owned { fence, .. } = again else { panic!("{again:?}") };
    assert!(fence > 1, "a drawn fence: {fence}");
    let stale = ledger.put_effect(1, &effect("here", 1, EffectStatus::Dispatched, 1), None, Vec::new()).await;
    assert!(matches!(stale, Err(LedgerError::Fenced { .. })), "{stale:?}");
    let mine = effect("here", 1, EffectStatus::Dispatched, 1);
    ledger.put_effect(fence, &mine, None, Vec::new()).await.expect("the new owner's write-ahead");
}

/// The same through the pipeline: a tool reads (the provider holds each read a second), then
/// charges. While it waits, its claim is lost as a server crash loses an unflushed one, and
/// another host claims the step anew and runs it. The first host's charge, while the second's
/// claim holds the row, is never sent; the second charges once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_whose_riding_claim_was_lost_sends_nothing() {
    use oncebox::{Call, Status};
    use oncebox_example_provider::{Fault, FaultKind, Route};
    let (url, dir, provider) = (fresh_database().await, tempfile::tempdir().expect("dir"), provider().await);
    let grant = crate::support::http_grant(&provider);
    let host = host_on(&url, &dir, &provider, true, |builder| builder.grant("panicky", grant.clone())).await;
    let second = host_on(&url, &dir, &provider, true, |builder| builder.grant("panicky", grant)).await;
    provider.arm(Fault::new(Route::Inventory, FaultKind::Delay { delay_ms: 1_000 }).for_sku("sku-1").times(2));
    let base = provider.base_url();
    let args = serde_json::json!({
        "mode": "ok",
        "then_get": format!("{base}/inventory/sku-1"),
        "then_post": {"url": format!("{base}/payments"), "body": crate::support::charge("o-1")},
    });
    let step = Call::step("run", "charge-after-read", "panicky", args.to_string());
    let call = {
        let (host, step) = (host.clone(), step.clone());
        tokio::spawn(async move { host.call(step).await })
    };
    crate::support::eventually("the tool's read reached the provider", || provider.reads() == 1).await;
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("connect");
    let _connection = tokio::spawn(connection);
    let key: String =
        client.query_one("SELECT key FROM oncebox_operations", &[]).await.expect("the claim's row").get(0);
    lose_claim(&url, &key).await;
    // The second host's read ends this long after the first's: the first writes ahead while the
    // second's claim holds the row.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let theirs = tokio::spawn(async move { second.call(step).await });
    // The first host's caller is told it no longer owns the step (as one taken over is), not
    // that the step failed or completed.
    let ours = call.await.expect("join").expect_err("the lost claim's owner has no outcome to give");
    assert!(matches!(ours, oncebox::CallError::Ledger(LedgerError::ClaimLost { .. })), "{ours}");
    assert_eq!(provider.counts("o-1").payments, 0, "nothing sent by the lost claim's owner");
    let theirs = theirs.await.expect("join").expect("the step on another host");
    assert_eq!(theirs.status, Status::Completed, "{theirs:?}");
    assert_eq!(provider.counts("o-1").payments, 1, "charged once, by the new owner");
    let op = host.ledger().operation(&key).await.expect("read").expect("recorded");
    assert_eq!(op.status, oncebox::ledger::OperationStatus::Completed, "the new owner's: {op:?}");
}

/// The same losses from a real crash: every server process quits at once, as in a power cut, and
/// what rode and was not yet written out is gone (a claim's row, an answer), where the tests above
/// remove it themselves. The host outlives its server, its connections do not: a call may fail on
/// a dead one once. Then the owner whose claim was lost writes nothing, and the one whose answer
/// was lost sends nothing more, while another host claims the operation anew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_crash_loses_what_rode_and_the_host_that_outlives_it_acts_on_none_of_it() {
    use crate::conformance::effect;
    use oncebox::ledger::EffectStatus::{Completed, Dispatched};
    // The WAL writer writes out a commit that did not wait for its flush every 10 s (its longest
    // delay), or a WAL page once it is full: the last commit before a crash a few milliseconds
    // later is not written out.
    let mut cluster = oncebox_pg_cluster::Crashable::start(&[("wal_writer_delay", "10000ms")]);
    let url = cluster.fresh_database().await;
    let ledger = Ledger::connect(&url).await.expect("connect");
    let raw = |sql: &'static str, key: &'static str| {
        let url = url.clone();
        async move {
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("connect");
            let connection = tokio::spawn(connection);
            let n: i64 = client.query_one(sql, &[&key]).await.expect("count").get(0);
            drop(client);
            let _ = connection.await;
            n
        }
    };

    // A claim rides, and the server crashes.
    claimed(&ledger, &["claimed".to_string()]).await;
    cluster.crash_and_restart();
    assert_eq!(raw("SELECT count(*) FROM oncebox_operations WHERE key = $1", "claimed").await, 0, "the claim was lost");
    let other = Ledger::connect(&url).await.expect("another host");
    let theirs = other.claim(&request("claimed", "b", 1_000)).await.expect("claim anew");
    assert!(matches!(theirs, Claim::Owned { fence: 1, .. }), "{theirs:?}");
    let ahead = effect("claimed", 1, Dispatched, 1);
    let refused = past_dead_connections(|| ledger.put_effect(1, &ahead, None, Vec::new())).await;
    assert!(matches!(refused, Err(LedgerError::ClaimLost { .. })), "{refused:?}");
    other.put_effect(1, &ahead, None, Vec::new()).await.expect("the new owner's write-ahead");

    // An answer rides after its flushed write-ahead, and the server crashes.
    let fence = claimed(&ledger, &["answered".to_string()]).await[0];
    let ahead = effect("answered", 1, Dispatched, 1);
    ledger.put_effect(fence, &ahead, None, Vec::new()).await.expect("write-ahead");
    let answer = effect("answered", 1, Completed, 1);
    ledger.put_effect(fence, &answer, Some((Dispatched, 1)), Vec::new()).await.expect("answer");
    assert_eq!(ledger.effects("answered").await.expect("read")[0].status, Completed, "committed, seen");
    cluster.crash_and_restart();
    let sql = "SELECT count(*) FROM oncebox_effects WHERE operation_key = $1 AND status = 'dispatched'";
    assert_eq!(raw(sql, "answered").await, 1, "the write-ahead was kept, its answer lost");
    let next = effect("answered", 2, Dispatched, 1);
    let refused = past_dead_connections(|| ledger.put_effect(fence, &next, None, Vec::new())).await;
    assert!(matches!(refused, Err(LedgerError::AnswerLost { .. })), "{refused:?}");
    assert_eq!(raw("SELECT count(*) FROM oncebox_effects WHERE operation_key = $1", "answered").await, 1);
}

/// `write` until it is not refused by a connection that died with its server (at most a few
/// times: each such failure drops one dead connection from the pool).
async fn past_dead_connections<F: std::future::Future<Output = Result<(), LedgerError>>>(
    mut write: impl FnMut() -> F,
) -> Result<(), LedgerError> {
    for _ in 0..16 {
        match write().await {
            Err(LedgerError::Database { .. }) => continue,
            other => return other,
        }
    }
    write().await
}

/// An answer that rode is lost if the server crashes before flushing it (the state a crash
/// leaves: the effect back at its write-ahead, `dispatched`). This host lives on, and its tool
/// holds that answer: the owner's next write-ahead is refused (nothing would be sent on an answer
/// the ledger no longer holds), and so is every later one until the attempt is recorded, which
/// cannot finish it either. Another operation's writes are untouched.
#[tokio::test]
async fn a_riding_answer_the_database_lost_stops_the_operations_next_write_ahead() {
    use crate::conformance::{attempt, effect};
    use oncebox::ledger::{EffectStatus, OperationStatus};
    let url = fresh_database().await;
    let ledger = Ledger::connect(&url).await.expect("connect");
    let ops: Vec<String> = ["lost", "kept"].map(String::from).into();
    let fences = claimed(&ledger, &ops).await;
    for (op, fence) in ops.iter().zip(&fences) {
        let ahead = effect(op, 1, EffectStatus::Dispatched, 1);
        ledger.put_effect(*fence, &ahead, None, Vec::new()).await.expect("write-ahead");
    }
    // Both answers ride, "lost" last (a crash that loses an answer loses every later one), and no
    // flushed COMMIT follows before the crash.
    for (op, fence) in ops.iter().zip(&fences).rev() {
        let answer = effect(op, 1, EffectStatus::Completed, 1);
        ledger.put_effect(*fence, &answer, Some((EffectStatus::Dispatched, 1)), Vec::new()).await.expect("answer");
    }
    // What a restart before the flush leaves of "lost": its effect as written ahead.
    lose_answer(&url, &effect("lost", 1, EffectStatus::Dispatched, 1)).await;

    let next = effect("lost", 2, EffectStatus::Dispatched, 1);
    for _ in 0..2 {
        let refused = ledger.put_effect(fences[0], &next, None, Vec::new()).await;
        assert!(
            matches!(refused, Err(LedgerError::AnswerLost { ref effect_key, .. }) if effect_key == &effect("lost", 1, EffectStatus::Dispatched, 1).key),
            "{refused:?}"
        );
    }
    assert_eq!(ledger.effects("lost").await.expect("read").len(), 1, "nothing of the refused write-ahead");
    let finish = |status| Some((status, Some("{}".to_string()), None));
    let completed = ledger
        .record_attempt(fences[0], &attempt("lost", 1, fences[0]), finish(OperationStatus::Completed), 2, Vec::new())
        .await;
    assert!(matches!(completed, Err(LedgerError::InDoubt { .. })), "{completed:?}");
    // The other operation's answer is still there: its next write-ahead goes ahead.
    let other = effect("kept", 2, EffectStatus::Dispatched, 1);
    ledger.put_effect(fences[1], &other, None, Vec::new()).await.expect("another operation's write-ahead");

    // The attempt recorded, unfinished, ends the refusal: the next attempt reads effect 1 in doubt
    // and may resend it with its key, which is written ahead.
    ledger
        .record_attempt(fences[0], &attempt("lost", 1, fences[0]), None, 3, Vec::new())
        .await
        .expect("the attempt, unfinished");
    let resend = effect("lost", 1, EffectStatus::Dispatched, 2);
    ledger
        .put_effect(fences[0], &resend, Some((EffectStatus::Dispatched, 1)), Vec::new())
        .await
        .expect("a same-key resend in the next attempt");

    // Its answer rides and is lost again; meanwhile another host takes the operation over (the
    // lease ran out). The stale owner's next write-ahead is fenced: the new owner's to decide.
    let answer = effect("lost", 1, EffectStatus::Completed, 2);
    ledger.put_effect(fences[0], &answer, Some((EffectStatus::Dispatched, 2)), Vec::new()).await.expect("answer");
    lose_answer(&url, &effect("lost", 1, EffectStatus::Dispatched, 2)).await;
    let other = Ledger::connect(&url).await.expect("another host");
    let taken = other.claim(&request("lost", "b", 1_000_000)).await.expect("take over");
    assert!(matches!(taken, Claim::Owned { fence, .. } if fence > fences[0]), "{taken:?}");
    let stale = ledger.put_effect(fences[0], &next, None, Vec::new()).await;
    assert!(matches!(stale, Err(LedgerError::Fenced { .. })), "{stale:?}");
}

/// The same through the pipeline: a tool charges one order, then (after a read the provider holds)
/// another. While it waits, the first charge's answer is lost as a server crash loses an
/// unflushed one. The second charge is never sent, the attempt's outcome is unknown (not failed:
/// the first charge took place), and the provider counts the one charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_whose_riding_answer_was_lost_sends_nothing_more_and_ends_unknown() {
    use oncebox::{Call, Status};
    use oncebox_example_provider::{Fault, FaultKind, Route};
    let (url, dir, provider) = (fresh_database().await, tempfile::tempdir().expect("dir"), provider().await);
    // The provider's keys are not declared: an effect in doubt is reconciled, never resent.
    let grant = crate::support::http_grant(&provider);
    let host = host_on(&url, &dir, &provider, false, |builder| builder.grant("panicky", grant)).await;
    // Held a second, within the read's timeout (`support::EFFECT_TIMEOUT`): the tool gets past it.
    provider.arm(Fault::new(Route::Inventory, FaultKind::Delay { delay_ms: 1_000 }).for_sku("sku-1"));
    let base = provider.base_url();
    let args = serde_json::json!({
        "mode": "ok",
        "post": {"url": format!("{base}/payments"), "body": crate::support::charge("o-1")},
        "then_get": format!("{base}/inventory/sku-1"),
        "then_post": {"url": format!("{base}/payments"), "body": crate::support::charge("o-2")},
    });
    let call = {
        let host = host.clone();
        tokio::spawn(async move { host.call(Call::step("run", "two-charges", "panicky", args.to_string())).await })
    };
    crate::support::eventually("the tool's read reached the provider", || provider.reads() == 1).await;

    // The first charge's answer is recorded and rode; a crash now would take it back.
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("connect");
    let _connection = tokio::spawn(connection);
    let rows = client
        .query("SELECT e.operation_key, e.record FROM oncebox_effects e WHERE e.status = 'completed'", &[])
        .await
        .expect("read the answer");
    assert_eq!(rows.len(), 1, "one answered effect");
    let operation_key: String = rows[0].get(0);
    let mut lost: oncebox::ledger::EffectRecord = serde_json::from_slice(rows[0].get(1)).expect("decode");
    lost.status = oncebox::ledger::EffectStatus::Dispatched;
    lost.response = None;
    lose_answer(&url, &lost).await;

    let outcome = call.await.expect("join").expect("call");
    assert_eq!(outcome.status, Status::Unknown, "{outcome:?}");
    // In its first attempt, by the lost answer (not by a read that timed out, then a retry).
    assert_eq!(outcome.attempts, 1, "{outcome:?}");
    let message = outcome.error.as_ref().map(|e| e.message.clone()).unwrap_or_default();
    assert!(message.contains("no longer recorded"), "{outcome:?}");
    assert_eq!(provider.counts("o-1").payments, 1, "the first charge, once");
    assert_eq!(provider.counts("o-2").payments, 0, "nothing sent on the lost answer");
    let effects = host.ledger().effects(&operation_key).await.expect("effects");
    assert_eq!(effects.len(), 1, "the second charge was never written ahead: {effects:?}");
    assert_eq!(effects[0].status, oncebox::ledger::EffectStatus::Dispatched, "in doubt: {effects:?}");
}

/// Removes operation `key`'s row: what a server crash leaves of a claim that rode and was not
/// flushed.
async fn lose_claim(url: &str, key: &str) {
    let client = connect(url).await;
    let sql = "DELETE FROM oncebox_operations WHERE key = $1 AND NOT recorded";
    let removed = client.execute(sql, &[&key]).await.expect("lose the claim");
    assert_eq!(removed, 1, "one claim lost");
}

/// Puts effect `ahead` back as it was written ahead, answer and all gone: what a server crash
/// leaves of an answer that rode and was not flushed.
async fn lose_answer(url: &str, ahead: &oncebox::ledger::EffectRecord) {
    let client = connect(url).await;
    let sql = "UPDATE oncebox_effects SET status = 'dispatched', record = $3 \
               WHERE operation_key = $1 AND effect_key = $2";
    let record = serde_json::to_vec(ahead).expect("encode");
    let reverted = client.execute(sql, &[&ahead.operation_key, &ahead.key, &record]).await.expect("lose the answer");
    assert_eq!(reverted, 1, "one answer lost");
}
