//! The conformance suite: the same tests against every ledger backend (the redb file, the
//! reference model and PostgreSQL), each stating what the `ledger::Store` contract promises. A new
//! backend joins by adding one line to `conformance!` below.

use oncebox::ReplayClass;
use oncebox::ledger::reference::ReferenceStore;
use oncebox::ledger::{
    AttemptRecord, AttemptSource, Claim, ClaimRequest, EffectRecord, EffectStatus, Ledger, LedgerError, LocalWrite,
    OperationStatus, Removed, Resolution, SeenApproval, Settlement, StaleApproval,
};

const LEASE: u64 = 100;

pub(crate) fn request(key: &str, owner: &str, now_ms: u64) -> ClaimRequest {
    ClaimRequest {
        key: key.into(),
        run_id: "run".into(),
        step_id: key.into(),
        tool: "charge".into(),
        class: ReplayClass::Compensatable,
        fingerprint: "args".into(),
        older_fingerprints: Vec::new(),
        args: serde_json::Value::Null,
        owner: owner.into(),
        now_ms,
        lease_ms: LEASE,
        approval: None,
        sealed: None,
    }
}

pub(crate) fn effect(op: &str, n: u32, status: EffectStatus, dispatches: u32) -> EffectRecord {
    EffectRecord {
        key: format!("{:016x}{op}", 0xe000 + n),
        operation_key: op.into(),
        label: format!("e{n}"),
        occurrence: 0,
        kind: "http".into(),
        target: "bank:443".into(),
        fingerprint: "f".into(),
        status,
        response: status.answered().then(|| "{}".to_string()),
        sealed: None,
        error: None,
        dispatches,
        first_dispatched_ms: n.into(),
        last_dispatched_ms: n.into(),
        updated_ms: 0,
        resolution: None,
        attempt: 1,
    }
}

pub(crate) fn attempt(op: &str, number: u32, fence: u64) -> AttemptRecord {
    AttemptRecord {
        operation_key: op.into(),
        run_id: "run".into(),
        step_id: op.into(),
        tool: "charge".into(),
        attempt: number,
        max_attempts: 3,
        fence,
        started_ms: 0,
        duration_us: 0,
        outcome: "ok".into(),
        message: None,
        source: AttemptSource::Fresh,
        downstream_accepted: None,
        effects: Vec::new(),
    }
}

fn owned(claim: Claim) -> u64 {
    match claim {
        Claim::Owned { fence, .. } => fence,
        other => panic!("expected to own the operation, got {other:?}"),
    }
}

fn finish(status: OperationStatus) -> Option<oncebox::ledger::Finish> {
    Some((status, Some("{}".into()), None))
}

async fn a_claim_is_exclusive_until_its_lease_expires_and_fences_never_repeat(ledger: Ledger) {
    let first = owned(ledger.claim(&request("op", "a", 1_000)).await.expect("claim"));
    assert!(matches!(ledger.claim(&request("op", "b", 1_050)).await, Ok(Claim::InProgress(_))));
    let second = owned(ledger.claim(&request("op", "b", 1_000 + LEASE + 1)).await.expect("take over"));
    assert!(second > first, "{second} after {first}");
    // The stale owner's write is refused, the new owner's accepted.
    let refused = ledger.put_effect(first, &effect("op", 0, EffectStatus::Dispatched, 1), None, Vec::new()).await;
    assert!(matches!(refused, Err(LedgerError::Fenced { .. })), "{refused:?}");
    ledger.put_effect(second, &effect("op", 0, EffectStatus::Dispatched, 1), None, Vec::new()).await.expect("write");
    // A durable take-over gets yet another fence.
    let third = owned(ledger.claim(&request("op", "c", 1_000 + 3 * LEASE)).await.expect("take over"));
    assert!(third > second && third != first, "{third} after {second}");
}

/// A claim not yet recorded is invisible to reads of operations, but listed in flight (with its
/// run, owner and lease), so that what keeps a run open sees it; once recorded it is an ordinary
/// operation, and no longer in flight.
async fn a_claim_not_yet_recorded_is_in_flight_until_its_first_write(ledger: Ledger) {
    let fence = owned(ledger.claim(&request("op", "a", 1_000)).await.expect("claim"));
    let mut other_run = request("other", "b", 1_000);
    other_run.run_id = "elsewhere".into();
    owned(ledger.claim(&other_run).await.expect("claim"));
    assert!(ledger.operation("op").await.expect("read").is_none(), "not recorded yet");
    let flying = ledger.in_flight(Some("run")).await.expect("read");
    let seen: Vec<(&str, &str, OperationStatus, u64)> =
        flying.iter().map(|op| (op.key.as_str(), op.owner.as_str(), op.status, op.lease_until_ms)).collect();
    assert_eq!(seen, [("op", "a", OperationStatus::Claimed, 1_000 + LEASE)]);
    let all: Vec<String> = ledger.in_flight(None).await.expect("read").into_iter().map(|op| op.key).collect();
    assert_eq!(all, ["op", "other"]);
    let open = ledger.open_runs(Some("run"), 1_050).await.expect("open");
    assert!(
        matches!(
            open["run"][..],
            [oncebox::ledger::Open { why: oncebox::ledger::Why::InFlight { recorded: false, .. }, .. }]
        ),
        "{open:?}"
    );

    ledger.put_effect(fence, &effect("op", 0, EffectStatus::Dispatched, 1), None, Vec::new()).await.expect("ahead");
    assert!(ledger.in_flight(Some("run")).await.expect("read").is_empty(), "recorded: no longer in flight");
    let op = ledger.operation("op").await.expect("read").expect("recorded");
    assert_eq!((op.status, op.fence), (OperationStatus::Claimed, fence));
    let open = ledger.open_runs(Some("run"), 1_050).await.expect("open");
    assert!(
        matches!(
            open["run"][..],
            [oncebox::ledger::Open { why: oncebox::ledger::Why::InFlight { recorded: true, .. }, .. }]
        ),
        "{open:?}"
    );
    ledger
        .put_effect(
            fence,
            &effect("op", 0, EffectStatus::Completed, 1),
            Some((EffectStatus::Dispatched, 1)),
            Vec::new(),
        )
        .await
        .expect("answer");
    ledger
        .record_attempt(fence, &attempt("op", 1, fence), finish(OperationStatus::Completed), 1_010, Vec::new())
        .await
        .expect("record");
    assert!(ledger.open_runs(Some("run"), 1_050).await.expect("open").is_empty(), "the run's one step ended");
}

async fn a_finished_operation_is_replayed_and_other_args_are_a_conflict(ledger: Ledger) {
    let fence = owned(ledger.claim(&request("op", "a", 1_000)).await.expect("claim"));
    ledger
        .record_attempt(fence, &attempt("op", 1, fence), finish(OperationStatus::Completed), 1_001, Vec::new())
        .await
        .expect("record");
    let again = ledger.claim(&request("op", "b", 5_000)).await.expect("claim");
    assert!(matches!(&again, Claim::Recorded(op) if op.status == OperationStatus::Completed), "{again:?}");
    let mut other = request("op", "b", 5_000);
    other.fingerprint = "other args".into();
    assert!(matches!(ledger.claim(&other).await, Ok(Claim::Conflict(_))));
    // Under a rotated key, the old fingerprint still matches.
    let mut rotated = request("op", "b", 5_000);
    rotated.fingerprint = "under the new key".into();
    rotated.older_fingerprints = vec!["args".into()];
    assert!(matches!(ledger.claim(&rotated).await, Ok(Claim::Recorded(_))));
    let op = ledger.operation("op").await.expect("read").expect("op");
    assert_eq!((op.status, op.attempts, op.output.as_deref()), (OperationStatus::Completed, 1, Some("{}")));
}

async fn a_write_ahead_is_a_compare_and_set(ledger: Ledger) {
    let fence = owned(ledger.claim(&request("op", "a", 1_000)).await.expect("claim"));
    let ahead = effect("op", 0, EffectStatus::Dispatched, 1);
    ledger.put_effect(fence, &ahead, None, Vec::new()).await.expect("write ahead");
    let twice = ledger.put_effect(fence, &ahead, None, Vec::new()).await;
    assert!(matches!(twice, Err(LedgerError::EffectChanged { .. })), "a second 'new' write-ahead: {twice:?}");
    let stale = ledger
        .put_effect(fence, &effect("op", 0, EffectStatus::Completed, 1), Some((EffectStatus::Unknown, 1)), Vec::new())
        .await;
    assert!(matches!(stale, Err(LedgerError::EffectChanged { .. })), "{stale:?}");
    let answered = effect("op", 0, EffectStatus::Completed, 1);
    ledger.put_effect(fence, &answered, Some((EffectStatus::Dispatched, 1)), Vec::new()).await.expect("answer");
    let recorded = ledger.effect("op", &answered.key).await.expect("read").expect("effect");
    assert_eq!((recorded.status, recorded.dispatches), (EffectStatus::Completed, 1));
}

async fn no_finish_the_rule_of_evidence_forbids_is_recorded(ledger: Ledger) {
    let fence = owned(ledger.claim(&request("op", "a", 1_000)).await.expect("claim"));
    ledger.put_effect(fence, &effect("op", 0, EffectStatus::Dispatched, 1), None, Vec::new()).await.expect("ahead");
    for status in [OperationStatus::Completed, OperationStatus::Failed] {
        let refused = ledger.record_attempt(fence, &attempt("op", 1, fence), finish(status), 1_001, Vec::new()).await;
        assert!(matches!(refused, Err(LedgerError::InDoubt { .. })), "{status:?} with an effect in doubt: {refused:?}");
    }
    let taken = effect("op", 0, EffectStatus::Completed, 1);
    ledger.put_effect(fence, &taken, Some((EffectStatus::Dispatched, 1)), Vec::new()).await.expect("answer");
    let refused = ledger
        .record_attempt(fence, &attempt("op", 1, fence), finish(OperationStatus::Failed), 1_002, Vec::new())
        .await;
    assert!(matches!(refused, Err(LedgerError::EffectTaken { .. })), "failed after a taken effect: {refused:?}");
    assert_eq!(
        ledger.operation("op").await.expect("read").expect("op").status,
        OperationStatus::Claimed,
        "nothing recorded"
    );
    ledger
        .record_attempt(fence, &attempt("op", 1, fence), finish(OperationStatus::Completed), 1_003, Vec::new())
        .await
        .expect("completed is fine");
}

async fn a_renewed_lease_keeps_its_owner(ledger: Ledger) {
    let fence = owned(ledger.claim(&request("op", "a", 1_000)).await.expect("claim"));
    ledger.renew("op", fence, 1_000 + 3 * LEASE).await.expect("renew in memory");
    assert!(matches!(ledger.claim(&request("op", "b", 1_000 + 2 * LEASE)).await, Ok(Claim::InProgress(_))));
    ledger.put_effect(fence, &effect("op", 0, EffectStatus::Dispatched, 1), None, Vec::new()).await.expect("ahead");
    ledger.renew("op", fence, 1_000 + 6 * LEASE).await.expect("renew on record");
    assert!(matches!(ledger.claim(&request("op", "b", 1_000 + 5 * LEASE)).await, Ok(Claim::InProgress(_))));
    let other = owned(ledger.claim(&request("op", "b", 1_000 + 7 * LEASE)).await.expect("take over"));
    let late = ledger.renew("op", fence, 1_000 + 9 * LEASE).await;
    assert!(matches!(late, Err(LedgerError::Fenced { .. })), "a taken-over owner cannot renew: {late:?}");
    assert_ne!(other, fence);
}

/// A take-over racing the first durable write of the claim it takes over leaves one owner: the
/// write lands and the take-over takes the durable claim (the old owner is fenced from then on),
/// or the take-over lands first and the write is refused. Never two callers that both hold the
/// operation, one of whom then finds its writes refused. A renewal racing that first write is
/// not lost either. Many rounds, so that the take-over falls into every window of the write.
async fn a_take_over_or_renewal_racing_the_owners_first_write_is_never_lost(ledger: Ledger) {
    use std::future::Future;
    for round in 0..48u32 {
        let key = format!("race-{round}");
        let first = owned(ledger.claim(&request(&key, "a", 1_000)).await.expect("claim"));
        let ahead = effect(&key, 0, EffectStatus::Dispatched, 1);
        let mut write = std::pin::pin!(ledger.put_effect(first, &ahead, None, Vec::new()));
        // Start the write (it is on its way to the store), then race it.
        let early = std::future::poll_fn(|cx| std::task::Poll::Ready(write.as_mut().poll(cx))).await;
        if round % 2 == 0 {
            let taken = ledger.claim(&request(&key, "b", 1_000 + 2 * LEASE)).await.expect("take over");
            let written = match early {
                std::task::Poll::Ready(done) => done,
                std::task::Poll::Pending => write.await,
            };
            let second = owned(taken);
            let mine = ledger.put_effect(second, &effect(&key, 1, EffectStatus::Dispatched, 1), None, Vec::new()).await;
            assert!(mine.is_ok(), "round {round}: the new owner's write lands: {mine:?}");
            let late = ledger.put_effect(first, &effect(&key, 2, EffectStatus::Dispatched, 1), None, Vec::new()).await;
            assert!(matches!(late, Err(LedgerError::Fenced { .. })), "round {round}: {late:?} after {written:?}");
            assert_eq!(ledger.operation(&key).await.expect("read").expect("op").fence, second, "round {round}");
        } else {
            ledger.renew(&key, first, 1_000 + 5 * LEASE).await.expect("renew");
            let written = match early {
                std::task::Poll::Ready(done) => done,
                std::task::Poll::Pending => write.await,
            };
            written.expect("the owner's write lands");
            let held = ledger.claim(&request(&key, "b", 1_000 + 3 * LEASE)).await.expect("claim");
            assert!(matches!(held, Claim::InProgress(_)), "round {round}: the renewal held: {held:?}");
        }
    }
}

async fn an_unknown_operation_is_settled_and_reopened_only_as_proven(ledger: Ledger) {
    let fence = owned(ledger.claim(&request("op", "a", 1_000)).await.expect("claim"));
    let doubt = effect("op", 0, EffectStatus::Unknown, 1);
    ledger.put_effect(fence, &doubt, None, Vec::new()).await.expect("in doubt");
    ledger
        .record_attempt(fence, &attempt("op", 1, fence), finish(OperationStatus::Unknown), 1_001, Vec::new())
        .await
        .expect("unknown");
    // Not every effect in doubt may be resent: it stays recorded.
    let kept = ledger.reopen(&request("op", "b", 2_000), Vec::new()).await.expect("reopen");
    assert!(matches!(kept, Claim::Recorded(_)), "{kept:?}");
    let settlement =
        Settlement { verdict: "committed".into(), by: "alice".into(), note: Some("checked".into()), at_ms: 2_001 };
    let output = Resolution::Committed { output: r#"{"id":"pay_1"}"#.into() };
    // An answer about one send does not settle an effect that was sent again since.
    // The reconciler's tries are recorded on it while it is unknown, and nothing else changes.
    let note = oncebox::ledger::ReconcileNote {
        tries: 2,
        last_ms: 2_000,
        result: "still-unknown".into(),
        reason: Some("an empty lookup inside the settle window".into()),
    };
    assert!(ledger.note_reconcile("op", &note).await.expect("note"), "written while unknown");
    let noted = ledger.operation("op").await.expect("read").expect("op");
    assert_eq!((noted.status, noted.reconciled.as_ref()), (OperationStatus::Unknown, Some(&note)));
    let stale = ledger.resolve("op", Some(&doubt.key), Some(doubt.dispatches + 1), &output, &settlement).await;
    assert!(matches!(stale, Err(LedgerError::EffectChanged { .. })), "{stale:?}");
    let settled = ledger.resolve("op", None, None, &output, &settlement).await.expect("resolve");
    assert_eq!((settled.status, settled.output.as_deref()), (OperationStatus::Completed, Some(r#"{"id":"pay_1"}"#)));
    let recorded = ledger.effect("op", &doubt.key).await.expect("read").expect("effect");
    assert_eq!(recorded.resolution.map(|r| r.by).as_deref(), Some("alice"));
    let again = ledger.resolve("op", None, None, &output, &settlement).await;
    assert!(matches!(again, Err(LedgerError::NotInDoubt { .. })), "{again:?}");
    // Settled, it keeps its tries as history and takes no more.
    assert_eq!(settled.reconciled.as_ref(), Some(&note));
    assert!(!ledger.note_reconcile("op", &note).await.expect("note"), "not unknown any more");
    assert!(!ledger.note_reconcile("nothing", &note).await.expect("note"), "no such operation");

    // Another operation whose effect may be resent is reopened with a new fence.
    let fence = owned(ledger.claim(&request("op2", "a", 3_000)).await.expect("claim"));
    let doubt = effect("op2", 0, EffectStatus::Unknown, 1);
    ledger.put_effect(fence, &doubt, None, Vec::new()).await.expect("in doubt");
    ledger
        .record_attempt(fence, &attempt("op2", 1, fence), finish(OperationStatus::Unknown), 3_001, Vec::new())
        .await
        .expect("unknown");
    let reopened = owned(ledger.reopen(&request("op2", "b", 4_000), vec![doubt.key.clone()]).await.expect("reopen"));
    assert!(reopened > fence);
}

async fn local_writes_apply_once_and_a_versioned_write_sees_other_writers(ledger: Ledger) {
    let kv = |n: u32, op: &str, expected: Option<u64>| {
        let mut record = effect(op, 10 + n, EffectStatus::Completed, 1);
        record.kind = "kv-set".into();
        (record, LocalWrite::KvSet { namespace: "ns".into(), key: "k".into(), value: vec![n as u8], expected })
    };
    let a = owned(ledger.claim(&request("a", "a", 1_000)).await.expect("claim"));
    let b = owned(ledger.claim(&request("b", "b", 1_000)).await.expect("claim"));
    // Both read "absent" and write on that basis: the first to commit wins, the second is refused.
    ledger
        .record_attempt(a, &attempt("a", 1, a), finish(OperationStatus::Completed), 1_001, vec![kv(1, "a", Some(0))])
        .await
        .expect("first writer");
    let (value, version) = ledger.kv_entry("ns", "k").await.expect("read").expect("entry");
    assert_eq!(value, vec![1]);
    assert_ne!(version, 0);
    let lost = ledger
        .record_attempt(b, &attempt("b", 1, b), finish(OperationStatus::Completed), 1_002, vec![kv(2, "b", Some(0))])
        .await;
    assert!(matches!(lost, Err(LedgerError::KvConflict { .. })), "{lost:?}");
    assert_eq!(ledger.operation("b").await.expect("read"), None, "nothing of the refused attempt was written");
    // Reading the new version, the second writer succeeds.
    ledger
        .record_attempt(
            b,
            &attempt("b", 1, b),
            finish(OperationStatus::Completed),
            1_003,
            vec![kv(2, "b", Some(version))],
        )
        .await
        .expect("second writer");
    assert_eq!(ledger.kv_get("ns", "k").await.expect("read"), Some(vec![2]));
    // The same staged write again (a retried attempt's) is not applied twice.
    let c = owned(ledger.claim(&request("c", "c", 1_000)).await.expect("claim"));
    let write = kv(3, "c", None);
    ledger.record_attempt(c, &attempt("c", 1, c), None, 1_004, vec![write.clone()]).await.expect("first");
    ledger.record_attempt(c, &attempt("c", 2, c), None, 1_005, vec![write]).await.expect("again");
    assert_eq!(ledger.effects("c").await.expect("read").len(), 1);
}

/// A write-ahead that stages a local effect under its own key (no host does; the contract still
/// says what becomes of it): the staged write applies once, and the record kept is the
/// write-ahead's, written after its staged ones, on every backend. On PostgreSQL the two records
/// are one row: the group writes the write-ahead's alone (one statement writing a row twice
/// would keep either, and is refused).
async fn a_write_ahead_staging_its_own_key_applies_the_write_and_keeps_its_own_record(ledger: Ledger) {
    let a = owned(ledger.claim(&request("a", "a", 1_000)).await.expect("claim"));
    let ahead = effect("a", 1, EffectStatus::Dispatched, 1);
    let mut staged = ahead.clone();
    staged.kind = "kv-set".into();
    staged.status = EffectStatus::Completed;
    let write = LocalWrite::KvSet { namespace: "ns".into(), key: "own".into(), value: vec![7], expected: None };
    ledger.put_effect(a, &ahead, None, vec![(staged, write)]).await.expect("write-ahead");
    assert_eq!(ledger.kv_get("ns", "own").await.expect("read"), Some(vec![7]), "the staged write applied");
    let effects = ledger.effects("a").await.expect("read");
    assert_eq!(effects.len(), 1, "{effects:?}");
    assert_eq!(
        (effects[0].status, effects[0].kind.as_str()),
        (EffectStatus::Dispatched, "http"),
        "the write-ahead's own"
    );
}

async fn an_outbox_message_is_enqueued_with_its_record_in_order(ledger: Ledger) {
    let fence = owned(ledger.claim(&request("op", "a", 1_000)).await.expect("claim"));
    let message = |n: u32| {
        let mut record = effect("op", 20 + n, EffectStatus::Completed, 1);
        record.kind = "outbox".into();
        (record, LocalWrite::Outbox { topic: "email".into(), payload: format!("m{n}") })
    };
    ledger
        .record_attempt(
            fence,
            &attempt("op", 1, fence),
            finish(OperationStatus::Completed),
            1_001,
            vec![message(1), message(2)],
        )
        .await
        .expect("record");
    let outbox = ledger.outbox().await.expect("read");
    let payloads: Vec<(u64, &str)> = outbox.iter().map(|m| (m.seq, m.payload.as_str())).collect();
    assert_eq!(payloads, [(1, "m1"), (2, "m2")]);
    assert!(ledger.operations(Some("run")).await.expect("read").iter().any(|op| op.key == "op"));
}

/// The component the approvals below are for.
const COMPONENT: &str = "sha256:aaaa";

/// What a caller running `component` brings to its claim, having seen approval `revision`.
fn seen(revision: u32, component: &str) -> Option<SeenApproval> {
    Some(SeenApproval { revision, component: component.into() })
}

fn approval(key: &str, revision: u32, state: oncebox::ledger::ApprovalState) -> oncebox::ledger::ApprovalRecord {
    oncebox::ledger::ApprovalRecord {
        operation_key: key.into(),
        fingerprint: "args".into(),
        component: Some(COMPONENT.into()),
        run_id: "run".into(),
        step_id: key.into(),
        tool: "fulfill".into(),
        description: "Ships".into(),
        consequence: None,
        args: serde_json::json!({"address": "[redacted]"}),
        sealed: Some("v1:00:00".into()),
        requested_ms: 1,
        state,
        decided_by: None,
        decided_ms: None,
        note: None,
        expires_ms: None,
        revision,
    }
}

async fn an_approval_is_written_as_a_compare_and_set_on_its_revision(ledger: Ledger) {
    use oncebox::ledger::ApprovalState::*;
    ledger.put_approval(&approval("op", 1, Pending)).await.expect("new");
    // A second request for the same operation, or a stale decision, is refused and changes nothing.
    let again = ledger.put_approval(&approval("op", 1, Pending)).await;
    assert!(matches!(again, Err(LedgerError::ApprovalChanged { .. })), "{again:?}");
    let stale = ledger.put_approval(&approval("op", 3, Approved)).await;
    assert!(matches!(stale, Err(LedgerError::ApprovalChanged { .. })), "{stale:?}");
    ledger.put_approval(&approval("op", 2, Approved)).await.expect("decided");
    let stored = ledger.approval("op").await.expect("read").expect("record");
    assert_eq!((stored.state, stored.revision), (Approved, 2));
    ledger.put_approval(&approval("other", 1, Pending)).await.expect("new");
    let mut elsewhere = approval("elsewhere", 1, Pending);
    elsewhere.run_id = "run-2".into();
    ledger.put_approval(&elsewhere).await.expect("new");
    let keys = |records: Vec<oncebox::ledger::ApprovalRecord>| -> Vec<String> {
        records.into_iter().map(|r| r.operation_key).collect()
    };
    assert_eq!(keys(ledger.approvals(Some("run")).await.expect("read")), ["op", "other"]);
    assert_eq!(keys(ledger.approvals(None).await.expect("read")).len(), 3);
}

async fn a_new_operation_is_claimed_only_under_the_approval_its_caller_saw_and_then_it_is_closed(ledger: Ledger) {
    use oncebox::ledger::ApprovalState::*;
    let approved = |revision: u32, expires_ms: Option<u64>| oncebox::ledger::ApprovalRecord {
        expires_ms,
        ..approval("op", revision, Approved)
    };
    ledger.put_approval(&approval("op", 1, Pending)).await.expect("request");
    let with =
        |revision: u32, now_ms: u64| ClaimRequest { approval: seen(revision, COMPONENT), ..request("op", "a", now_ms) };
    // Pending: no approval stands, whatever the caller saw.
    assert!(matches!(ledger.claim(&with(1, 1_000)).await, Ok(Claim::ApprovalChanged)));
    ledger.put_approval(&approved(2, Some(2_000))).await.expect("approve");
    // Decided again since the caller looked (a rejection, a new expiry): nothing is claimed.
    assert!(matches!(ledger.claim(&with(1, 1_000)).await, Ok(Claim::ApprovalChanged)));
    // Expired by the time of the claim.
    assert!(matches!(ledger.claim(&with(2, 2_000)).await, Ok(Claim::ApprovalChanged)));
    let mut other_args = with(2, 1_000);
    other_args.fingerprint = "other args".into();
    assert!(matches!(ledger.claim(&other_args).await, Ok(Claim::ApprovalChanged)));
    let fence = owned(ledger.claim(&with(2, 1_000)).await.expect("claim"));
    // Claimed (in memory or on disk): its approval can no longer change.
    let reject = oncebox::ledger::ApprovalRecord { ..approval("op", 3, Rejected) };
    assert!(matches!(ledger.put_approval(&reject).await, Err(LedgerError::ApprovalClosed { .. })));
    ledger
        .record_attempt(fence, &attempt("op", 1, fence), finish(OperationStatus::Completed), 1_001, Vec::new())
        .await
        .expect("record");
    assert!(matches!(ledger.put_approval(&reject).await, Err(LedgerError::ApprovalClosed { .. })));
    assert_eq!(ledger.approval("op").await.expect("read").expect("record").state, Approved);
}

async fn an_approval_lets_only_the_component_it_names_claim_its_operation(ledger: Ledger) {
    use oncebox::ledger::ApprovalState::*;
    ledger.put_approval(&approval("op", 1, Pending)).await.expect("request");
    ledger.put_approval(&approval("op", 2, Approved)).await.expect("approve");
    let running = |component: &str| ClaimRequest { approval: seen(2, component), ..request("op", "a", 1_000) };
    // The tool was replaced after the decision: a caller running the new component claims nothing,
    // though the revision, the params and the state are the ones approved.
    let replaced = ledger.claim(&running("sha256:bbbb")).await;
    assert!(matches!(replaced, Ok(Claim::ApprovalChanged)), "{replaced:?}");
    assert!(ledger.operation("op").await.expect("read").is_none());
    // A request recorded before requests named their component is bound to no component at all.
    let unbound =
        |revision, state| oncebox::ledger::ApprovalRecord { component: None, ..approval("old", revision, state) };
    ledger.put_approval(&unbound(1, Pending)).await.expect("request");
    ledger.put_approval(&unbound(2, Approved)).await.expect("approve");
    let old = ClaimRequest { approval: seen(2, COMPONENT), ..request("old", "a", 1_000) };
    assert!(matches!(ledger.claim(&old).await, Ok(Claim::ApprovalChanged)));
    // The component it names: claimed, once.
    let fence = owned(ledger.claim(&running(COMPONENT)).await.expect("claim"));
    assert!(matches!(ledger.claim(&running(COMPONENT)).await, Ok(Claim::InProgress(_))));
    ledger
        .record_attempt(fence, &attempt("op", 1, fence), finish(OperationStatus::Completed), 1_001, Vec::new())
        .await
        .expect("record");
}

async fn a_request_lapses_only_as_retention_read_it(ledger: Ledger) {
    use oncebox::ledger::ApprovalState::*;
    let stale = |key: &str, revision| StaleApproval { operation_key: key.into(), revision };
    ledger.put_approval(&approval("asked", 1, Pending)).await.expect("request");
    // Read by retention at revision 1, decided since.
    ledger.put_approval(&approval("decided", 1, Pending)).await.expect("request");
    ledger.put_approval(&approval("decided", 2, Approved)).await.expect("approve");
    // Approved and claimed since (in memory, not recorded yet): its call runs under it.
    ledger.put_approval(&approval("used", 1, Pending)).await.expect("request");
    ledger.put_approval(&approval("used", 2, Approved)).await.expect("approve");
    let used = ClaimRequest { approval: seen(2, COMPONENT), ..request("used", "a", 1_000) };
    let fence = owned(ledger.claim(&used).await.expect("claim"));

    let stale = [stale("asked", 1), stale("decided", 1), stale("used", 2), stale("never", 1)];
    let removed = ledger.expire(&[], &stale).await.expect("expire");
    assert_eq!(removed, Removed { operations: 0, approvals: 1 });
    assert!(ledger.approval("asked").await.expect("read").is_none());
    assert!(ledger.tombstone("asked").await.expect("read").is_none(), "nothing ran: a later call asks again");
    assert_eq!(ledger.approval("decided").await.expect("read").expect("kept").state, Approved);
    assert_eq!(ledger.approval("used").await.expect("read").expect("kept").state, Approved);
    ledger
        .record_attempt(fence, &attempt("used", 1, fence), finish(OperationStatus::Completed), 1_001, Vec::new())
        .await
        .expect("the claim under it still runs");
    // A lapsed request's step is asked about anew.
    ledger.put_approval(&approval("asked", 1, Pending)).await.expect("a new request");
}

/// Retention read a run closed (a done step, and an approved request no one used, lapsing); then
/// the request's step is claimed under it. The removal keeps the request (its call runs under it)
/// and so the done step too: the run is open by a key the removal does not take.
async fn a_request_claimed_after_retention_read_its_run_keeps_the_run(ledger: Ledger) {
    use oncebox::ledger::ApprovalState::*;
    let done = owned(ledger.claim(&request("done", "a", 1_000)).await.expect("claim"));
    ledger
        .record_attempt(done, &attempt("done", 1, done), finish(OperationStatus::Completed), 1_001, Vec::new())
        .await
        .expect("record");
    ledger.put_approval(&approval("ship", 1, Pending)).await.expect("request");
    ledger.put_approval(&approval("ship", 2, Approved)).await.expect("approve");
    // What retention read: `done` expired, the request unused.
    let op = ledger.operation("done").await.expect("read").expect("recorded");
    let (tombstone, stale) =
        (oncebox::ledger::Tombstone::of(&op, 9_000), StaleApproval::of(&approval("ship", 2, Approved)));
    // Then the step runs under the request.
    let ship = ClaimRequest { approval: seen(2, COMPONENT), ..request("ship", "a", 2_000) };
    owned(ledger.claim(&ship).await.expect("claim"));
    let removed = ledger.expire(&[tombstone], &[stale]).await.expect("expire");
    assert_eq!(removed, Removed { operations: 0, approvals: 0 }, "the run is open by `ship`");
    assert!(ledger.operation("done").await.expect("read").is_some());
    assert!(ledger.tombstone("done").await.expect("read").is_none());
    assert_eq!(ledger.approval("ship").await.expect("read").expect("kept").state, Approved);
}

async fn only_what_is_over_expires_and_an_expired_step_is_not_claimed_again(ledger: Ledger) {
    let tombstone = |key: &str| oncebox::ledger::Tombstone {
        ended_ms: 1_001,
        removed_ms: 9_000,
        ..crate::support::tombstone(key, "run", key, "charge")
    };
    ledger.put_approval(&approval("done", 1, oncebox::ledger::ApprovalState::Approved)).await.expect("approval");
    let done = owned(ledger.claim(&request("done", "a", 1_000)).await.expect("claim"));
    ledger.put_effect(done, &effect("done", 1, EffectStatus::Dispatched, 1), None, Vec::new()).await.expect("ahead");
    ledger
        .put_effect(
            done,
            &effect("done", 1, EffectStatus::Completed, 1),
            Some((EffectStatus::Dispatched, 1)),
            Vec::new(),
        )
        .await
        .expect("answer");
    ledger
        .record_attempt(done, &attempt("done", 1, done), finish(OperationStatus::Completed), 1_001, Vec::new())
        .await
        .expect("record");
    let open = owned(ledger.claim(&request("open", "a", 1_000)).await.expect("claim"));
    ledger.record_attempt(open, &attempt("open", 1, open), None, 1_001, Vec::new()).await.expect("record");
    ledger.put_approval(&approval("gone", 1, oncebox::ledger::ApprovalState::Rejected)).await.expect("approval");

    // An operation still claimed refuses the whole expiry: nothing is removed.
    let refused = ledger.expire(&[tombstone("done"), tombstone("open")], &[]).await;
    assert!(matches!(refused, Err(LedgerError::NotExpirable { .. })), "{refused:?}");
    assert!(ledger.operation("done").await.expect("read").is_some());
    assert!(ledger.tombstone("done").await.expect("read").is_none());
    assert!(ledger.tombstones("run").await.expect("read").is_empty());

    // While a step of its run is claimed, what ended of the run is kept (retention read the run
    // closed before that claim, say): a saga or a repeat of the run may still need it.
    let gone = StaleApproval { operation_key: "gone".into(), revision: 1 };
    let removed = ledger.expire(&[tombstone("done")], &[gone]).await.expect("expire");
    assert_eq!(removed, Removed { operations: 0, approvals: 1 }, "the run is open: `done` is kept");
    assert!(ledger.operation("done").await.expect("read").is_some());
    assert!(ledger.tombstone("done").await.expect("read").is_none());
    assert!(ledger.approval("gone").await.expect("read").is_none());
    ledger
        .record_attempt(open, &attempt("open", 2, open), finish(OperationStatus::Completed), 1_002, Vec::new())
        .await
        .expect("record");

    // The run closed: it goes.
    let removed = ledger.expire(&[tombstone("done")], &[]).await.expect("expire");
    assert_eq!(removed, Removed { operations: 1, approvals: 0 });
    assert!(ledger.operation("done").await.expect("read").is_none());
    assert!(ledger.effects("done").await.expect("read").is_empty());
    assert!(ledger.attempts("done").await.expect("read").is_empty());
    assert!(ledger.approval("done").await.expect("read").is_none());
    assert!(ledger.approval("gone").await.expect("read").is_none());
    assert_eq!(ledger.operations(Some("run")).await.expect("read").len(), 1, "the one not expired stays");
    assert_eq!(ledger.tombstone("done").await.expect("read"), Some(tombstone("done")));
    // Found by its run too (what a compensation of the run reads), and by no other.
    assert_eq!(ledger.tombstones("run").await.expect("read"), [tombstone("done")]);
    assert!(ledger.tombstones("done").await.expect("read").is_empty());
    let claim = ledger.claim(&request("done", "b", 10_000)).await.expect("claim");
    assert!(matches!(claim, Claim::Expired(ref t) if t.operation_key == "done"), "{claim:?}");
}

/// Enqueues one outbox message per (topic, payload), in order, as one completed operation.
async fn enqueue(ledger: &Ledger, op: &str, messages: &[(&str, &str)]) {
    let fence = owned(ledger.claim(&request(op, "a", 1_000)).await.expect("claim"));
    let staged = messages
        .iter()
        .enumerate()
        .map(|(n, (topic, payload))| {
            let mut record = effect(op, 40 + n as u32, EffectStatus::Completed, 1);
            record.kind = "outbox".into();
            (record, LocalWrite::Outbox { topic: topic.to_string(), payload: payload.to_string() })
        })
        .collect();
    ledger
        .record_attempt(fence, &attempt(op, 1, fence), finish(OperationStatus::Completed), 1_001, staged)
        .await
        .expect("record");
}

async fn pending_payloads(ledger: &Ledger, topic: &str, limit: usize) -> Vec<String> {
    ledger.outbox_pending(topic, limit).await.expect("read").into_iter().map(|m| m.payload).collect()
}

async fn a_topics_pending_messages_are_its_undelivered_ones_in_order(ledger: Ledger) {
    enqueue(&ledger, "op", &[("email", "e1"), ("sms", "s1"), ("email", "e2"), ("email", "e3")]).await;
    assert_eq!(pending_payloads(&ledger, "email", 10).await, ["e1", "e2", "e3"]);
    assert_eq!(pending_payloads(&ledger, "email", 2).await, ["e1", "e2"], "at most the limit, from the head");
    assert_eq!(pending_payloads(&ledger, "sms", 10).await, ["s1"]);
    assert!(pending_payloads(&ledger, "nobody", 10).await.is_empty());
    // A topic whose name is another's prefix is another topic.
    assert!(pending_payloads(&ledger, "emai", 10).await.is_empty());

    let head = ledger.outbox_pending("email", 1).await.expect("read").remove(0);
    assert_eq!(head.delivery, oncebox::ledger::Delivery::default(), "nothing recorded yet");
    let failed = ledger.record_delivery_failure(head.seq, 2_000, "503 from the endpoint", false).await.expect("record");
    assert_eq!((failed.delivery.attempts, failed.delivery.state()), (1, "pending"));
    assert_eq!(failed.delivery.last_error.as_deref(), Some("503 from the endpoint"));
    assert_eq!(pending_payloads(&ledger, "email", 10).await, ["e1", "e2", "e3"], "a failed send stays at the head");
    let refused = ledger.record_delivery_failure(head.seq, 2_001, "400 from the endpoint", true).await.expect("record");
    assert_eq!((refused.delivery.attempts, refused.delivery.state()), (2, "refused"));
    assert_eq!(pending_payloads(&ledger, "email", 1).await, ["e1"], "a refused message still holds its topic");

    let delivered = ledger.mark_delivered(head.seq, 3_000).await.expect("record");
    assert_eq!(delivered.delivery.delivered_ms, Some(3_000));
    assert_eq!((delivered.delivery.attempts, delivered.delivery.state()), (3, "delivered"));
    assert_eq!(pending_payloads(&ledger, "email", 10).await, ["e2", "e3"]);
    // Delivery is final: a later answer about the same message changes nothing.
    let again = ledger.record_delivery_failure(head.seq, 4_000, "late", true).await.expect("record");
    assert_eq!(again.delivery, delivered.delivery);
    assert_eq!(ledger.mark_delivered(head.seq, 5_000).await.expect("record").delivery, delivered.delivery);
    // The whole outbox keeps every message with its delivery.
    let all = ledger.outbox().await.expect("read");
    assert_eq!(all.len(), 4);
    assert_eq!(all.iter().find(|m| m.seq == head.seq).map(|m| m.delivery.clone()), Some(delivered.delivery));
    let unknown = ledger.mark_delivered(999, 1).await;
    assert!(matches!(unknown, Err(LedgerError::NoSuchMessage { seq: 999 })), "{unknown:?}");
}

async fn a_notice_is_enqueued_once_per_key_whenever_it_is_noticed_again(ledger: Ledger) {
    enqueue(&ledger, "op", &[("notify", "a tool's")]).await;
    let mut relay_woken = ledger.outbox_enqueued();
    relay_woken.mark_unchanged();
    assert!(ledger.enqueue_once("notify", "approval/k1", "{\"n\":1}").await.expect("enqueue"));
    assert!(relay_woken.has_changed().expect("watch"), "an enqueued notice wakes the relay");
    // Noticed again (a restart, another host): nothing more, even with another payload.
    assert!(!ledger.enqueue_once("notify", "approval/k1", "{\"n\":2}").await.expect("enqueue"));
    // Each topic (a receiver) gets it once.
    assert!(ledger.enqueue_once("elsewhere", "approval/k1", "{\"n\":3}").await.expect("enqueue"));
    assert!(!ledger.enqueue_once("elsewhere", "approval/k1", "{\"n\":3}").await.expect("enqueue"));
    assert!(ledger.enqueue_once("notify", "unknown/k2", "{\"n\":4}").await.expect("enqueue"));
    assert_eq!(pending_payloads(&ledger, "notify", 10).await, ["a tool's", "{\"n\":1}", "{\"n\":4}"]);
    assert_eq!(pending_payloads(&ledger, "elsewhere", 10).await, ["{\"n\":3}"]);
    let notice = ledger.outbox_pending("notify", 10).await.expect("read").remove(1);
    assert_eq!(notice.effect_key, "approval/k1", "the key is the Idempotency-Key the relay sends");
    // Delivered, and noticed again: still once.
    ledger.mark_delivered(notice.seq, 2_000).await.expect("record");
    assert!(!ledger.enqueue_once("notify", "approval/k1", "{\"n\":5}").await.expect("enqueue"));
    assert_eq!(pending_payloads(&ledger, "notify", 10).await, ["a tool's", "{\"n\":4}"]);
    // Numbered with the tools' messages, after them.
    let seqs: Vec<u64> = ledger.outbox().await.expect("read").iter().map(|m| m.seq).collect();
    assert_eq!(seqs, [1, 2, 3, 4]);
}

/// The keys of the requests `approvals_before(cutoff)` answers, checked against the scan of every
/// request (`Ledger::approvals_before_scanned`, the oracle) at every cutoff that matters.
async fn aged_requests(ledger: &Ledger, cutoff: u64) -> Vec<String> {
    let indexed = ledger.approvals_before(cutoff).await.expect("indexed");
    let scanned = ledger.approvals_before_scanned(cutoff).await.expect("scanned");
    assert_eq!(indexed, scanned, "at cutoff {cutoff}: the index and the scan of every request disagree");
    indexed.into_iter().map(|a| a.operation_key).collect()
}

/// Every cutoff around the times the case below writes.
const CUTOFFS: [u64; 12] = [0, 10, 11, 20, 21, 30, 31, 40, 41, 60, 61, u64::MAX];

/// The index of requests by age answers what the one rule (`ApprovalRecord::last_written`) says of
/// every request, after each is asked, asked again, decided (with and without an expiry), lapsed
/// and removed with its operation: a request decided after the cutoff is not among those before it.
async fn requests_are_found_by_when_they_were_last_written(ledger: Ledger) {
    use oncebox::ledger::ApprovalState::*;
    // `decided` runs in a run of its own, which closes when it ends (the others keep `run` open).
    let at = |key: &str, revision, state, requested_ms, decided_ms: Option<u64>, expires_ms: Option<u64>| {
        let run_id = if key == "decided" { "its-own" } else { "run" }.to_string();
        oncebox::ledger::ApprovalRecord {
            requested_ms,
            decided_ms,
            expires_ms,
            run_id,
            ..approval(key, revision, state)
        }
    };
    ledger.put_approval(&at("asked", 1, Pending, 10, None, None)).await.expect("ask");
    ledger.put_approval(&at("again", 1, Pending, 10, None, None)).await.expect("ask");
    ledger.put_approval(&at("decided", 1, Pending, 10, None, None)).await.expect("ask");
    ledger.put_approval(&at("expiring", 1, Pending, 10, None, None)).await.expect("ask");
    ledger.put_approval(&at("rejected", 1, Pending, 10, None, None)).await.expect("ask");
    for cutoff in CUTOFFS {
        aged_requests(&ledger, cutoff).await;
    }
    assert_eq!(aged_requests(&ledger, 11).await, ["again", "asked", "decided", "expiring", "rejected"]);
    assert!(aged_requests(&ledger, 10).await.is_empty());
    // Asked again (a new component), decided, decided with an expiry, rejected: each moves.
    ledger.put_approval(&at("again", 2, Pending, 40, None, None)).await.expect("ask again");
    ledger.put_approval(&at("decided", 2, Approved, 10, Some(30), None)).await.expect("approve");
    ledger.put_approval(&at("expiring", 2, Approved, 10, Some(20), Some(60))).await.expect("approve");
    ledger.put_approval(&at("rejected", 2, Rejected, 10, Some(20), None)).await.expect("reject");
    for cutoff in CUTOFFS {
        aged_requests(&ledger, cutoff).await;
    }
    assert_eq!(aged_requests(&ledger, 11).await, ["asked"], "every other one was written since");
    assert_eq!(aged_requests(&ledger, 21).await, ["asked", "rejected"], "oldest first");
    assert_eq!(aged_requests(&ledger, 31).await, ["asked", "rejected", "decided"]);
    assert_eq!(aged_requests(&ledger, 60).await, ["asked", "rejected", "decided", "again"]);
    assert_eq!(aged_requests(&ledger, 61).await, ["asked", "rejected", "decided", "again", "expiring"]);
    // Lapsed (retention read it at revision 1), and removed with its operation.
    let stale = StaleApproval { operation_key: "asked".into(), revision: 1 };
    assert_eq!(ledger.expire(&[], &[stale]).await.expect("lapse"), Removed { operations: 0, approvals: 1 });
    let ran = ClaimRequest { approval: seen(2, COMPONENT), run_id: "its-own".into(), ..request("decided", "a", 35) };
    let fence = owned(ledger.claim(&ran).await.expect("claim"));
    let done = oncebox::ledger::AttemptRecord { run_id: "its-own".into(), ..attempt("decided", 1, fence) };
    ledger.record_attempt(fence, &done, finish(OperationStatus::Completed), 36, Vec::new()).await.expect("record");
    assert_eq!(aged_requests(&ledger, 31).await, ["rejected", "decided"], "used: still the operation's");
    let op = ledger.operation("decided").await.expect("read").expect("recorded");
    let tombstone = oncebox::ledger::Tombstone::of(&op, 100);
    assert_eq!(ledger.expire(&[tombstone], &[]).await.expect("expire"), Removed { operations: 1, approvals: 0 });
    for cutoff in CUTOFFS {
        aged_requests(&ledger, cutoff).await;
    }
    assert_eq!(aged_requests(&ledger, u64::MAX).await, ["rejected", "again", "expiring"]);
    // Asked anew after it lapsed: found by its new time.
    ledger.put_approval(&at("asked", 1, Pending, 50, None, None)).await.expect("a new request");
    assert_eq!(aged_requests(&ledger, 51).await, ["rejected", "again", "asked"]);
}

/// The messages `delivered_before(cutoff)` answers (their sequence numbers), checked against the
/// scan of the whole outbox.
async fn aged_messages(ledger: &Ledger, cutoff: u64) -> Vec<u64> {
    let indexed = ledger.delivered_before(cutoff).await.expect("indexed");
    let scanned = ledger.delivered_before_scanned(cutoff).await.expect("scanned");
    assert_eq!(indexed, scanned, "at cutoff {cutoff}: the index and the scan of the outbox disagree");
    indexed.into_iter().map(|m| m.seq).collect()
}

/// A delivered message older than the cutoff is found and removed; a pending one (refused
/// included) is never found, and a removal that names it leaves it; a message delivered after
/// the cutoff is not found.
async fn a_delivered_message_is_found_by_its_delivery_and_removed_and_a_pending_one_kept(ledger: Ledger) {
    enqueue(&ledger, "op", &[("email", "e1"), ("email", "e2"), ("sms", "s1"), ("email", "e3"), ("sms", "s2")]).await;
    let seqs: Vec<u64> = ledger.outbox().await.expect("read").iter().map(|m| m.seq).collect();
    let [e1, e2, s1, e3, s2] = seqs[..] else { panic!("five messages: {seqs:?}") };
    ledger.mark_delivered(e1, 20).await.expect("deliver");
    ledger.mark_delivered(s1, 10).await.expect("deliver");
    ledger.mark_delivered(e2, 40).await.expect("deliver");
    ledger.record_delivery_failure(e3, 5, "400", true).await.expect("refused");
    for cutoff in [0, 10, 11, 20, 21, 40, 41, u64::MAX] {
        aged_messages(&ledger, cutoff).await;
    }
    assert_eq!(aged_messages(&ledger, 21).await, [s1, e1], "by delivery, not by number");
    assert_eq!(aged_messages(&ledger, u64::MAX).await, [s1, e1, e2], "never a pending one");
    // A removal that names every message removes the delivered ones before the cutoff it was
    // given, and leaves what is pending, whatever it is told.
    let pruned = ledger.prune_outbox(&[s1, e1, e3, s2, 999]).await.expect("prune");
    assert_eq!(pruned, oncebox::ledger::Pruned { messages: 2, notices: 0 });
    let left: Vec<u64> = ledger.outbox().await.expect("read").iter().map(|m| m.seq).collect();
    assert_eq!(left, [e2, e3, s2]);
    assert_eq!(pending_payloads(&ledger, "email", 10).await, ["e3"]);
    assert_eq!(pending_payloads(&ledger, "sms", 10).await, ["s2"]);
    assert_eq!(aged_messages(&ledger, u64::MAX).await, [e2]);
    // Numbers are never handed out again.
    enqueue(&ledger, "later", &[("email", "e4")]).await;
    let last = ledger.outbox().await.expect("read").iter().map(|m| m.seq).max();
    assert_eq!(last, Some(s2 + 1));
}

/// A notice key goes only with the message it names: kept while its message is (delivered or
/// not), so the event is enqueued once; removed with it, so the same event noticed again is
/// enqueued again (which is why retention removes it only once the event cannot be noticed).
async fn a_notice_key_goes_only_with_the_message_it_names(ledger: Ledger) {
    assert!(ledger.enqueue_once("notify", "approval-requested/k1/1", "{}").await.expect("enqueue"));
    assert!(ledger.enqueue_once("notify", "unknown/k2/1", "{}").await.expect("enqueue"));
    assert!(ledger.enqueue_once("elsewhere", "approval-requested/k1/1", "{}").await.expect("enqueue"));
    let outbox = ledger.outbox().await.expect("read");
    let seq = |topic: &str, key: &str| {
        outbox.iter().find(|m| m.topic == topic && m.effect_key == key).map(|m| m.seq).expect("enqueued")
    };
    let (k1, k2, k1_elsewhere) = (
        seq("notify", "approval-requested/k1/1"),
        seq("notify", "unknown/k2/1"),
        seq("elsewhere", "approval-requested/k1/1"),
    );
    ledger.mark_delivered(k1, 10).await.expect("deliver");
    ledger.mark_delivered(k1_elsewhere, 10).await.expect("deliver");
    // A pending notice is not removed, nor its key.
    let pruned = ledger.prune_outbox(&[k2]).await.expect("prune");
    assert_eq!(pruned, oncebox::ledger::Pruned::default());
    assert!(!ledger.enqueue_once("notify", "unknown/k2/1", "{}").await.expect("enqueue"), "still once");
    // Delivered and removed on one topic: its key there goes with it, the other topic's stays.
    let pruned = ledger.prune_outbox(&[k1]).await.expect("prune");
    assert_eq!(pruned, oncebox::ledger::Pruned { messages: 1, notices: 1 });
    assert!(!ledger.enqueue_once("elsewhere", "approval-requested/k1/1", "{}").await.expect("enqueue"));
    assert!(ledger.enqueue_once("notify", "approval-requested/k1/1", "{}").await.expect("enqueue"), "released");
    assert!(!ledger.enqueue_once("notify", "approval-requested/k1/1", "{}").await.expect("enqueue"));
}

/// The backends, each a fresh ledger (and what must live as long as it).
async fn redb() -> (Ledger, Option<tempfile::TempDir>) {
    let dir = tempfile::tempdir().expect("dir");
    (Ledger::open(dir.path().join("l.redb")).expect("open"), Some(dir))
}

async fn reference() -> (Ledger, Option<tempfile::TempDir>) {
    (Ledger::on(ReferenceStore::new()), None)
}

/// A database of its own in the test cluster (`pg/mod.rs`).
async fn postgres() -> (Ledger, Option<tempfile::TempDir>) {
    let url = super::pg::fresh_database().await;
    (Ledger::connect(&url).await.expect("connect"), None)
}

macro_rules! conformance {
    ($($test:ident),* $(,)?) => {
        macro_rules! backend {
            ($backend:ident) => {
                mod $backend {
                    $(
                        #[tokio::test]
                        async fn $test() {
                            let (ledger, _dir) = super::$backend().await;
                            super::$test(ledger).await;
                        }
                    )*
                }
            };
        }
        backend!(redb);
        backend!(reference);
        backend!(postgres);
    };
}

conformance!(
    a_claim_is_exclusive_until_its_lease_expires_and_fences_never_repeat,
    a_claim_not_yet_recorded_is_in_flight_until_its_first_write,
    a_finished_operation_is_replayed_and_other_args_are_a_conflict,
    a_write_ahead_is_a_compare_and_set,
    no_finish_the_rule_of_evidence_forbids_is_recorded,
    a_renewed_lease_keeps_its_owner,
    a_take_over_or_renewal_racing_the_owners_first_write_is_never_lost,
    an_unknown_operation_is_settled_and_reopened_only_as_proven,
    local_writes_apply_once_and_a_versioned_write_sees_other_writers,
    a_write_ahead_staging_its_own_key_applies_the_write_and_keeps_its_own_record,
    an_outbox_message_is_enqueued_with_its_record_in_order,
    an_approval_is_written_as_a_compare_and_set_on_its_revision,
    only_what_is_over_expires_and_an_expired_step_is_not_claimed_again,
    a_new_operation_is_claimed_only_under_the_approval_its_caller_saw_and_then_it_is_closed,
    an_approval_lets_only_the_component_it_names_claim_its_operation,
    a_request_lapses_only_as_retention_read_it,
    a_request_claimed_after_retention_read_its_run_keeps_the_run,
    a_topics_pending_messages_are_its_undelivered_ones_in_order,
    a_notice_is_enqueued_once_per_key_whenever_it_is_noticed_again,
    requests_are_found_by_when_they_were_last_written,
    a_delivered_message_is_found_by_its_delivery_and_removed_and_a_pending_one_kept,
    a_notice_key_goes_only_with_the_message_it_names,
);
