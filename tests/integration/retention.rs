//! Retention of the outbox (`retention::gc`), on every backend: delivered messages older than
//! the cutoff go with their notice keys, pending ones never, and a notification whose event may
//! still be noticed is kept with its key until its event's records are gone.

use oncebox::ReplayClass;
use oncebox::ledger::reference::ReferenceStore;
use oncebox::ledger::{Claim, ClaimRequest, EffectStatus, Ledger, LocalWrite, OperationStatus, Resolution, Settlement};
use std::time::Duration;

/// gc's window: a second.
const WINDOW: Duration = Duration::from_secs(1);

fn request(key: &str, run: &str) -> ClaimRequest {
    ClaimRequest {
        key: key.into(),
        run_id: run.into(),
        step_id: key.into(),
        tool: "charge".into(),
        class: ReplayClass::IdempotentWrite,
        fingerprint: "args".into(),
        older_fingerprints: Vec::new(),
        args: serde_json::Value::Null,
        sealed: None,
        owner: "host".into(),
        now_ms: 1_000,
        lease_ms: 100,
        approval: None,
    }
}

/// Records operation `key` of `run` ended `status` at 1_001, with one outbox message per topic.
async fn ended(ledger: &Ledger, key: &str, run: &str, status: OperationStatus, topics: &[&str]) {
    ended_as(ledger, request(key, run), status, topics).await;
}

/// [`ended`], for the claim `claim`.
async fn ended_as(ledger: &Ledger, claim: ClaimRequest, status: OperationStatus, topics: &[&str]) {
    let (key, run) = (claim.key.as_str(), claim.run_id.as_str());
    let Ok(Claim::Owned { fence, .. }) = ledger.claim(&claim).await else { panic!("not claimed") };
    let staged = topics
        .iter()
        .enumerate()
        .map(|(n, topic)| {
            let mut effect = super::conformance::effect(key, 50 + n as u32, EffectStatus::Completed, 1);
            effect.kind = "outbox".into();
            (effect, LocalWrite::Outbox { topic: topic.to_string(), payload: format!("{key} {n}") })
        })
        .collect();
    let attempt = oncebox::ledger::AttemptRecord {
        run_id: run.into(),
        step_id: claim.step_id.clone(),
        ..super::conformance::attempt(key, 1, fence)
    };
    ledger
        .record_attempt(fence, &attempt, Some((status, Some("{}".into()), None)), 1_001, staged)
        .await
        .expect("record");
}

/// The sequence number of the message on `topic` under `key` (an effect's or an event's).
async fn seq_of(ledger: &Ledger, topic: &str, payload_or_key: &str) -> u64 {
    let outbox = ledger.outbox().await.expect("read");
    let found =
        outbox.iter().find(|m| m.topic == topic && (m.payload == payload_or_key || m.effect_key == payload_or_key));
    found.map(|m| m.seq).unwrap_or_else(|| panic!("no message {payload_or_key} on {topic}: {outbox:?}"))
}

async fn gc_keeps_a_notification_while_its_event_may_be_noticed_and_removes_what_was_delivered(ledger: Ledger) {
    // A closed run whose step sent two messages (one delivered, one not), and whose request was
    // notified; a run kept open by an unknown step, notified of it and of its stuck compensation.
    ended(&ledger, "done", "closed", OperationStatus::Completed, &["email", "email"]).await;
    ended(&ledger, "doubt", "stuck", OperationStatus::Unknown, &[]).await;
    // And a closed run whose compensatable step nothing undid: a compensation asked for after gc
    // removes the step names it for a person, as often as it is asked, and is notified once.
    let paid = ClaimRequest { class: ReplayClass::Compensatable, ..request("paid", "gone") };
    ended_as(&ledger, paid, OperationStatus::Completed, &[]).await;
    let gone = "compensation-outstanding/gone/8899aabbccddeeff";
    // Notified blocked once, a state that tombstones alone never give again.
    let blocked = "compensation-blocked/gone/0011223344556677";
    // And a closed run whose compensatable step was undone: nothing to name once both go.
    let undone = ClaimRequest { class: ReplayClass::Compensatable, ..request("paid-2", "undone") };
    ended_as(&ledger, undone, OperationStatus::Completed, &[]).await;
    let compensation = ClaimRequest {
        step_id: format!("{}paid-2", oncebox::saga::COMPENSATION_PREFIX),
        ..request("refund-2", "undone")
    };
    ended_as(&ledger, compensation, OperationStatus::Completed, &[]).await;
    let was_undone = "compensation-outstanding/undone/2233445566778899";
    for event in [gone, blocked, was_undone] {
        assert!(ledger.enqueue_once("notify", event, "{}").await.expect("enqueue"));
        let seq = seq_of(&ledger, "notify", event).await;
        ledger.mark_delivered(seq, 1_002).await.expect("deliver");
    }
    let events = ["approval-requested/done/5", "unknown/doubt/1001", "compensation-blocked/stuck/00112233aabbccdd"];
    for event in events {
        assert!(ledger.enqueue_once("notify", event, "{}").await.expect("enqueue"));
    }
    let sent = seq_of(&ledger, "email", "done 0").await;
    ledger.mark_delivered(sent, 1_002).await.expect("deliver");
    for event in events {
        let seq = seq_of(&ledger, "notify", event).await;
        ledger.mark_delivered(seq, 1_002).await.expect("deliver");
    }
    let unsent = seq_of(&ledger, "email", "done 1").await;

    // Nothing is older than the window yet.
    let gc = oncebox::retention::gc(&ledger, WINDOW, 1_500).await.expect("gc");
    assert_eq!((gc.removed_messages, gc.removed_notices, gc.kept_notifications), (0, 0, 0), "{gc:?}");

    let gc = oncebox::retention::gc(&ledger, WINDOW, 10_000).await.expect("gc");
    assert_eq!(gc.removed_operations, 4, "the closed runs' steps: {gc:?}");
    // The step's delivered message, and the notification of its request (whose records this gc
    // removed), with its key; the unknown's and the compensation's kept: their run is still
    // there; and the removed charge's run's, which names it as long as nothing undid it.
    // (The undone run's and the blocked key go.)
    assert_eq!((gc.removed_messages, gc.removed_notices, gc.kept_notifications), (4, 3, 3), "{gc:?}");
    assert!(!ledger.enqueue_once("notify", gone, "{}").await.expect("enqueue"), "still once");
    let left: Vec<u64> = ledger.outbox().await.expect("read").iter().map(|m| m.seq).collect();
    assert!(left.contains(&unsent) && !left.contains(&sent), "the pending message stays: {left:?}");
    assert_eq!(ledger.outbox_pending("email", 10).await.expect("read").len(), 1);
    // The unknown is noticed again (the reconciler's next reading): still once.
    assert!(!ledger.enqueue_once("notify", "unknown/doubt/1001", "{}").await.expect("enqueue"));
    assert!(!ledger.enqueue_once("notify", events[2], "{}").await.expect("enqueue"));
    // The request's key went with its records: nothing can notice that event any more (its step
    // is refused as expired), so a key given again is a new message.
    assert!(ledger.enqueue_once("notify", events[0], "{}").await.expect("enqueue"));

    // Settled by a person, then expired: its notifications go at the gc that removes it.
    let settlement = Settlement { verdict: "committed".into(), by: "ops".into(), note: None, at_ms: 20_000 };
    let committed = Resolution::Committed { output: "{}".into() };
    ledger.resolve("doubt", None, None, &committed, &settlement).await.expect("settle");
    let gc = oncebox::retention::gc(&ledger, WINDOW, 20_500).await.expect("gc");
    assert_eq!((gc.removed_operations, gc.removed_messages, gc.kept_notifications), (0, 0, 3), "{gc:?}");
    let gc = oncebox::retention::gc(&ledger, WINDOW, 30_000).await.expect("gc");
    assert_eq!(gc.removed_operations, 1, "{gc:?}");
    // The settled step was not compensatable: its run's notification goes with it.
    assert_eq!((gc.removed_messages, gc.removed_notices, gc.kept_notifications), (2, 2, 1), "{gc:?}");
    assert!(!ledger.enqueue_once("notify", gone, "{}").await.expect("enqueue"), "still once, whenever");
    let delivered = ledger.delivered_before(u64::MAX).await.expect("read");
    assert_eq!(delivered.iter().map(|m| m.effect_key.as_str()).collect::<Vec<_>>(), [gone], "only the kept one");
    assert_eq!(ledger.outbox_pending("email", 10).await.expect("read").len(), 1, "still pending");

    // A person undoes the removed charge by hand and says so. Once the word's record has gone too,
    // its tombstone still counts the step undone: nothing names it again, and the key goes.
    let keying = oncebox::keys::FingerprintKey::new(vec![[7; 32]]).expect("key");
    let said = oncebox::saga::undone_by_hand(&ledger, &keying, "paid", "ops", None).await.expect("said");
    assert!(said.recorded, "{said:?}");
    let later = ledger.now_ms() + 2 * WINDOW.as_millis() as u64;
    let gc = oncebox::retention::gc(&ledger, WINDOW, later).await.expect("gc");
    assert_eq!((gc.removed_operations, gc.removed_notices, gc.kept_notifications), (1, 1, 0), "{gc:?}");
    assert!(ledger.enqueue_once("notify", gone, "{}").await.expect("enqueue"), "the key went with the event");
}

#[tokio::test]
async fn gc_of_the_outbox_on_redb() {
    let dir = tempfile::tempdir().expect("dir");
    let ledger = Ledger::open(dir.path().join("l.redb")).expect("open");
    gc_keeps_a_notification_while_its_event_may_be_noticed_and_removes_what_was_delivered(ledger).await;
}

#[tokio::test]
async fn gc_of_the_outbox_on_the_reference_model() {
    let ledger = Ledger::on(ReferenceStore::new());
    gc_keeps_a_notification_while_its_event_may_be_noticed_and_removes_what_was_delivered(ledger).await;
}

#[tokio::test]
async fn gc_of_the_outbox_on_postgres() {
    let ledger = Ledger::connect(&super::pg::fresh_database().await).await.expect("connect");
    gc_keeps_a_notification_while_its_event_may_be_noticed_and_removes_what_was_delivered(ledger).await;
}
