//! After something went wrong: approvals bound to exact params, a run's reconciliation, the saga's
//! compensation, recovery and retention, each counted at the example provider.

use std::time::Duration;

use oncebox::ledger::{ApprovalState, OperationStatus};
use oncebox::saga::SagaState;
use oncebox::{Call, Decision, Host, Reconciliation, ReplayClass, RetryPolicy, Status};
use oncebox_example_provider::{Fault, FaultKind, Route};
use serde_json::{Value, json};

use crate::support::{Fixture, approve, charge};

fn fulfill(address: &str) -> Value {
    json!({"order_id": "o-1", "address": address, "items": [{"sku": "sku-1", "quantity": 1}]})
}

fn step(run: &str, step: &str, tool: &str, args: &Value) -> Call {
    Call::step(run, step, tool, args.to_string())
}

fn reserve() -> Value {
    json!({"order_id": "o-1", "sku": "sku-1", "quantity": 2})
}

async fn reserved(f: &Fixture) -> u64 {
    let bytes = f.host.ledger().kv_get("reservations", "reserved/sku-1").await.expect("kv");
    bytes.map_or(0, |b| serde_json::from_slice(&b).expect("count"))
}

// Approvals

#[tokio::test]
async fn an_irreversible_call_without_approval_dispatches_nothing_and_records_the_request() {
    let f = Fixture::new().await;
    let outcome = f.host.call(step("r", "ship", "fulfill", &fulfill("1 Main St"))).await.expect("call");
    assert_eq!(outcome.status, Status::AwaitingApproval, "{outcome:?}");
    assert_eq!(f.provider.requests(), 0);
    let key = outcome.operation_key.clone().expect("key");
    assert!(f.host.ledger().operation(&key).await.expect("read").is_none(), "no operation exists yet");
    let view = outcome.approval.as_ref().expect("what to approve");
    assert_eq!(view.params["address"], oncebox::REDACTED, "the address is not shown in the clear");
    assert_eq!(view.params["order_id"], "o-1");
    assert!(view.consequence.as_deref().is_some_and(|c| c.contains("cannot be cancelled")), "{view:?}");
    assert!(view.approve.as_deref().is_some_and(|a| a.contains(outcome.fingerprint.as_deref().expect("fingerprint"))));

    // The request holds the address sealed: not in the ledger file, but the key's holder reads it.
    let record = f.host.ledger().approval(&key).await.expect("read").expect("request");
    assert_eq!(record.state, ApprovalState::Pending);
    let file = std::fs::read(f.dir.path().join("ledger.redb")).expect("ledger file");
    assert!(!file.windows(9).any(|w| w == b"1 Main St"), "the ledger file holds no address in the clear");
    assert_eq!(f.host.reveal(&record).expect("reveal")["address"], "1 Main St");

    // Asking again changes nothing.
    let again = f.host.call(step("r", "ship", "fulfill", &fulfill("1 Main St"))).await.expect("call");
    assert_eq!(again.status, Status::AwaitingApproval);
    assert_eq!(f.provider.requests(), 0);
}

#[tokio::test]
async fn an_approved_call_ships_once_and_every_later_call_is_a_replay() {
    let f = Fixture::new().await;
    let call = step("r", "ship", "fulfill", &fulfill("1 Main St"));
    let first = f.host.call(call.clone()).await.expect("call");
    approve(&f.host, &first).await;
    let shipped = f.host.call(call.clone()).await.expect("call");
    assert_eq!(shipped.status, Status::Completed, "{shipped:?}");
    for _ in 0..3 {
        let again = f.host.call(call.clone()).await.expect("call");
        assert!(again.replayed && again.status == Status::Completed, "{again:?}");
    }
    assert_eq!(f.provider.counts("o-1").fulfillments, 1);
    // The approval was used: deciding on it again is refused.
    let key = first.operation_key.as_deref().expect("key");
    let fingerprint = first.fingerprint.as_deref().expect("fingerprint");
    let refused = f.host.decide(key, fingerprint, Decision::Reject, "bob", None).await;
    assert!(refused.is_err_and(|e| e.to_string().contains("already ran")));
}

#[tokio::test]
async fn an_approval_of_other_params_approves_nothing() {
    let f = Fixture::new().await;
    let first = f.host.call(step("r", "ship", "fulfill", &fulfill("1 Main St"))).await.expect("call");
    approve(&f.host, &first).await;
    // The orchestrator sends the step with another address: not what was approved.
    let changed = f.host.call(step("r", "ship", "fulfill", &fulfill("9 Elsewhere Rd"))).await.expect("call");
    assert_eq!(changed.status, Status::Conflict, "{changed:?}");
    assert_eq!(f.provider.requests(), 0);
    // Approving with a fingerprint other than the request's is refused.
    let key = first.operation_key.as_deref().expect("key");
    let wrong = f.host.decide(key, "0".repeat(64).as_str(), Decision::Approve { expires_ms: None }, "a", None).await;
    assert!(wrong.is_err_and(|e| e.to_string().contains("fingerprint")));
    assert_eq!(f.provider.counts("o-1").fulfillments, 0);
}

#[tokio::test]
async fn a_rejected_or_expired_approval_never_dispatches() {
    let f = Fixture::new().await;
    let rejected = f.host.call(step("r", "ship", "fulfill", &fulfill("1 Main St"))).await.expect("call");
    let (key, fingerprint) = (rejected.operation_key.clone().expect("key"), rejected.fingerprint.clone().expect("fp"));
    f.host.decide(&key, &fingerprint, Decision::Reject, "carol", Some("address unverified")).await.expect("reject");
    let after = f.host.call(step("r", "ship", "fulfill", &fulfill("1 Main St"))).await.expect("call");
    assert_eq!(after.status, Status::Rejected, "{after:?}");
    assert!(after.error.as_ref().is_some_and(|e| e.message.contains("address unverified")));
    let again = f.host.decide(&key, &fingerprint, Decision::Approve { expires_ms: None }, "dave", None).await;
    assert!(again.is_err_and(|e| e.to_string().contains("final")), "a rejection is final");

    let expiring = f.host.call(step("r", "ship-2", "fulfill", &fulfill("1 Main St"))).await.expect("call");
    let until = oncebox_now() + 50;
    let (key, fingerprint) = (expiring.operation_key.clone().expect("key"), expiring.fingerprint.clone().expect("fp"));
    f.host.decide(&key, &fingerprint, Decision::Approve { expires_ms: Some(until) }, "erin", None).await.expect("ok");
    while oncebox_now() <= until {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let late = f.host.call(step("r", "ship-2", "fulfill", &fulfill("1 Main St"))).await.expect("call");
    assert_eq!(late.status, Status::AwaitingApproval, "{late:?}");
    assert!(late.error.as_ref().is_some_and(|e| e.message.contains("expired")));
    assert_eq!(f.provider.requests(), 0);
}

#[tokio::test]
async fn an_approval_never_authorises_a_second_dispatch_of_an_unknown_shipment() {
    let f = Fixture::new().await;
    f.provider.arm(Fault::new(Route::Fulfillments, FaultKind::LoseResponse).for_order("o-1"));
    let call = step("r", "ship", "fulfill", &fulfill("1 Main St"));
    let first = f.host.call(call.clone()).await.expect("call");
    approve(&f.host, &first).await;
    let lost = f.host.call(call.clone()).await.expect("call");
    assert_eq!(lost.status, Status::Unknown, "{lost:?}");
    // A second confirmation is refused, and the next call ships nothing.
    let (key, fingerprint) = (first.operation_key.as_deref().expect("k"), first.fingerprint.as_deref().expect("f"));
    let again = f.host.decide(key, fingerprint, Decision::Approve { expires_ms: None }, "frank", None).await;
    assert!(again.is_err_and(|e| e.to_string().contains("unknown")));
    let replay = f.host.call(call).await.expect("call");
    assert_eq!((replay.status, replay.replayed), (Status::Unknown, true));
    assert_eq!(f.provider.counts("o-1").fulfillments, 1);
    assert_eq!(f.provider.requests(), 1);
}

#[tokio::test]
async fn tools_of_other_classes_need_no_approval() {
    let f = Fixture::new().await;
    let paid = f.host.call(step("r", "pay", "charge", &charge("o-1"))).await.expect("call");
    assert_eq!(paid.status, Status::Completed, "{paid:?}");
    assert!(paid.approval.is_none());
    assert!(f.host.ledger().approvals(None).await.expect("read").is_empty());
}

// Reconciliation of a run

#[tokio::test]
async fn a_run_s_lost_charge_is_reconciled_committed_and_never_charged_again() {
    let f = Fixture::honouring_keys(false).await;
    f.provider.arm(Fault::new(Route::Payments, FaultKind::LoseResponse).for_order("o-1"));
    let lost = f.host.call(step("r", "pay", "charge", &charge("o-1"))).await.expect("call");
    assert_eq!(lost.status, Status::Unknown, "{lost:?}");
    let answers = f.host.reconcile_run("r").await.expect("reconcile");
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert!(matches!(answers[0].answer, Reconciliation::Committed { .. }), "{answers:?}");
    assert!(answers[0].settle_by_hand.is_none());
    let again = f.host.call(step("r", "pay", "charge", &charge("o-1"))).await.expect("call");
    assert_eq!((again.status, again.replayed), (Status::Completed, true), "{again:?}");
    assert_eq!(f.provider.counts("o-1").payments, 1);
    assert_eq!(f.provider.totals().payments, 1);
}

// Compensation

#[tokio::test]
async fn fulfillment_rejected_so_the_refund_and_the_release_run_once_each() {
    let f = Fixture::new().await;
    assert_eq!(f.host.call(step("r", "1-reserve", "reserve", &reserve())).await.expect("c").status, Status::Completed);
    assert_eq!(reserved(&f).await, 2);
    assert_eq!(f.host.call(step("r", "2-pay", "charge", &charge("o-1"))).await.expect("c").status, Status::Completed);
    let ship = f.host.call(step("r", "3-ship", "fulfill", &fulfill("1 Main St"))).await.expect("call");
    let (key, fingerprint) = (ship.operation_key.clone().expect("k"), ship.fingerprint.clone().expect("f"));
    f.host.decide(&key, &fingerprint, Decision::Reject, "ops", Some("fraud check")).await.expect("reject");

    let report = f.host.compensate("r").await.expect("compensate");
    assert_eq!(report.state, SagaState::Done, "{report:?}");
    let actions: Vec<(&str, &str)> = report.steps.iter().map(|s| (s.tool.as_str(), s.action)).collect();
    assert_eq!(actions, [("charge", "compensated"), ("reserve", "compensated")], "reverse order");
    assert_eq!(f.provider.counts("o-1").refunds, 1);
    assert_eq!(reserved(&f).await, 0, "released");

    // Run again (a retry, a resume): answered from the record, nothing refunded twice.
    let again = f.host.compensate("r").await.expect("compensate");
    assert_eq!(again.state, SagaState::Done);
    assert!(again.steps.iter().all(|s| s.compensation.as_ref().is_some_and(|c| c.replayed)), "{again:?}");
    assert_eq!(f.provider.counts("o-1").refunds, 1);
    assert_eq!(reserved(&f).await, 0);
    assert_eq!(f.provider.counts("o-1").fulfillments, 0);
}

#[tokio::test]
async fn compensation_refuses_while_a_step_is_unknown_or_awaits_approval_and_keeps_what_shipped() {
    let f = Fixture::new().await;
    f.provider.arm(Fault::new(Route::Fulfillments, FaultKind::LoseResponse).for_order("o-1"));
    f.host.call(step("r", "1-pay", "charge", &charge("o-1"))).await.expect("call");
    let pending = f.host.call(step("r", "2-ship", "fulfill", &fulfill("1 Main St"))).await.expect("call");
    let blocked = f.host.compensate("r").await.expect("compensate");
    assert_eq!(blocked.state, SagaState::Blocked, "{blocked:?}");
    assert!(
        blocked
            .steps
            .iter()
            .any(|s| s.tool == "fulfill" && s.reason.as_deref().is_some_and(|r| r.contains("approval")))
    );

    approve(&f.host, &pending).await;
    let lost = f.host.call(step("r", "2-ship", "fulfill", &fulfill("1 Main St"))).await.expect("call");
    assert_eq!(lost.status, Status::Unknown);
    let blocked = f.host.compensate("r").await.expect("compensate");
    assert_eq!(blocked.state, SagaState::Blocked, "the refund waits for the shipment's truth");
    let reason = blocked.steps.iter().find(|s| s.tool == "fulfill").and_then(|s| s.reason.clone());
    let reason = reason.expect("the shipment's reason");
    // The command it prints runs as printed, once a person fills in what they know.
    assert!(
        reason.contains("unknown") && reason.contains("(--committed 'OUTPUT JSON' | --not-committed) --by NAME"),
        "{reason}"
    );
    assert_eq!(f.provider.counts("o-1").refunds, 0);

    // Reconciled (it shipped): the refund runs, and the shipment is kept and reported.
    let answers = f.host.reconcile_run("r").await.expect("reconcile");
    assert!(matches!(answers[0].answer, Reconciliation::Committed { .. }), "{answers:?}");
    let report = f.host.compensate("r").await.expect("compensate");
    assert_eq!(report.state, SagaState::Done, "{report:?}");
    assert!(report.steps.iter().any(|s| s.tool == "fulfill" && s.action == "kept"));
    assert_eq!(f.provider.counts("o-1").refunds, 1);
    assert_eq!(f.provider.counts("o-1").fulfillments, 1);
}

#[tokio::test]
async fn a_compensation_that_fails_stays_outstanding_and_resumes_once_fixed() {
    let f = Fixture::new().await;
    f.host.call(step("r", "1-pay", "charge", &charge("o-1"))).await.expect("call");
    // The refunds service answers 500 to everything for now: each answer leaves the refund in doubt.
    f.provider.arm(Fault::new(Route::Refunds, FaultKind::ErrorBeforeCommit).for_order("o-1").times(100));
    let report = f.host.compensate("r").await.expect("compensate");
    // Resent with its key, and still in doubt: outstanding.
    assert_eq!(report.state, SagaState::Outstanding, "{report:?}");
    assert!(report.steps[0].reason.as_deref().is_some_and(|r| r.contains("unknown")), "{report:?}");
    let recovered = oncebox::recovery::report(f.host.ledger(), Some("r")).await.expect("recover");
    assert_eq!(recovered["r"].compensation_outstanding.len(), 1, "{recovered:?}");
    // Compensating again resends the same refund (same key), nothing new.
    let again = f.host.compensate("r").await.expect("compensate");
    assert_eq!(again.state, SagaState::Outstanding);
    assert_eq!(f.provider.counts("o-1").refunds, 0);
    // gc keeps every record of a run whose compensation is outstanding.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let gc = f.host.gc(Duration::ZERO).await.expect("gc");
    assert_eq!(gc.removed_operations, 0, "{gc:?}");
    // The refunds service recovers: compensating again resends the same refund, and is done.
    f.provider.clear_faults();
    let done = f.host.compensate("r").await.expect("compensate");
    assert_eq!(done.state, SagaState::Done, "{done:?}");
    assert_eq!(f.provider.counts("o-1").refunds, 1);
}

// Retention

#[tokio::test]
async fn gc_removes_what_is_over_and_a_step_called_after_it_expired_is_not_run_as_new() {
    let f = Fixture::new().await;
    f.provider.arm(Fault::new(Route::Payments, FaultKind::ErrorBeforeCommit).for_order("o-2").times(100));
    // Run "done" is over; run "r" has a step unknown, so all of it stays but its request for
    // approval, which nobody decided within the window: it lapses.
    assert_eq!(
        f.host.call(step("done", "pay-1", "charge", &charge("o-1"))).await.expect("c").status,
        Status::Completed
    );
    assert_eq!(f.host.call(step("r", "pay-2", "charge", &charge("o-2"))).await.expect("c").status, Status::Unknown);
    let awaiting = f.host.call(step("r", "ship", "fulfill", &fulfill("1 Main St"))).await.expect("call");
    assert_eq!(awaiting.status, Status::AwaitingApproval);
    tokio::time::sleep(Duration::from_millis(5)).await;

    // Within the retention, nothing goes.
    assert_eq!(f.host.gc(Duration::from_secs(3600)).await.expect("gc").removed_operations, 0);
    let gc = f.host.gc(Duration::ZERO).await.expect("gc");
    assert_eq!(gc.removed_operations, 1, "only the completed charge: {gc:?}");
    let ops = f.host.ledger().operations(Some("r")).await.expect("read");
    assert_eq!(ops.iter().map(|op| op.status).collect::<Vec<_>>(), [OperationStatus::Unknown], "{ops:?}");
    assert_eq!(gc.removed_approvals, 1, "the request nobody decided: {gc:?}");
    assert!(f.host.ledger().approval(awaiting.operation_key.as_deref().expect("k")).await.expect("r").is_none());

    // The expired step is refused, not charged again.
    let requests = f.provider.requests();
    let after = f.host.call(step("done", "pay-1", "charge", &charge("o-1"))).await.expect("call");
    assert_eq!(after.status, Status::Expired, "{after:?}");
    assert!(after.error.as_ref().is_some_and(|e| e.message.contains("new step id")));
    assert_eq!(f.provider.requests(), requests);
    assert_eq!(f.provider.counts("o-1").payments, 1);
}

/// A run that is over (every step completed) is closed, so gc may remove its records before
/// anyone asks to undo it. Its compensation then has no args to make the refund and the release
/// from: it names both steps for a person (undo by hand, the run outstanding), dispatches
/// nothing, and never says done while the payment stands. A run compensated before its records
/// went stays done, answered from what retention left, with nothing refunded twice.
#[tokio::test]
async fn a_compensation_after_gc_removed_the_steps_names_them_for_a_person_and_never_says_done() {
    let f = Fixture::new().await;
    assert_eq!(f.host.call(step("r", "1-reserve", "reserve", &reserve())).await.expect("c").status, Status::Completed);
    assert_eq!(f.host.call(step("r", "2-pay", "charge", &charge("o-1"))).await.expect("c").status, Status::Completed);
    assert_eq!(f.host.call(step("u", "pay", "charge", &charge("o-2"))).await.expect("c").status, Status::Completed);
    assert_eq!(f.host.compensate("u").await.expect("compensate").state, SagaState::Done);
    assert_eq!(f.provider.counts("o-2").refunds, 1);
    tokio::time::sleep(Duration::from_millis(5)).await;
    let gc = f.host.gc(Duration::ZERO).await.expect("gc");
    assert_eq!(gc.removed_operations, 4, "both runs are closed: {gc:?}");

    let requests = f.provider.requests();
    let report = f.host.compensate("r").await.expect("compensate");
    assert_eq!(report.state, SagaState::Outstanding, "{report:?}");
    // Newest first, by when each ended (two ending in the same millisecond: either order).
    let mut actions: Vec<(&str, &str)> = report.steps.iter().map(|s| (s.tool.as_str(), s.action)).collect();
    actions.sort();
    assert_eq!(actions, [("charge", "undo-by-hand"), ("reserve", "undo-by-hand")], "{report:?}");
    assert!(
        report
            .steps
            .iter()
            .all(|s| s.reason.as_deref().is_some_and(|r| r.contains("expired") && r.contains("by hand"))),
        "{report:?}"
    );
    // Nothing dispatched, nothing released: the payment and the reservation stand, as reported.
    assert_eq!(f.provider.requests(), requests);
    assert_eq!(f.provider.counts("o-1").refunds, 0);
    assert_eq!(reserved(&f).await, 2);
    // Asked again, the same answer.
    assert_eq!(f.host.compensate("r").await.expect("compensate").state, SagaState::Outstanding);
    // A person undoes both by hand and says so: the run is done, and still nothing is sent.
    for step in &report.steps {
        let said = f.host.undone_by_hand(&step.operation_key, "ops", Some("by hand")).await.expect("said");
        assert!(said.recorded, "{said:?}");
    }
    let done = f.host.compensate("r").await.expect("compensate");
    assert_eq!(done.state, SagaState::Done, "{done:?}");
    assert!(done.steps.iter().all(|s| s.action == "compensated"), "{done:?}");
    assert_eq!(f.provider.requests(), requests);
    assert_eq!(reserved(&f).await, 2, "released by the person, not by the saga");

    // The run undone before gc: done, from its compensation's tombstone, and not refunded again.
    let undone = f.host.compensate("u").await.expect("compensate");
    assert_eq!(undone.state, SagaState::Done, "{undone:?}");
    let actions: Vec<(&str, &str)> = undone.steps.iter().map(|s| (s.tool.as_str(), s.action)).collect();
    assert_eq!(actions, [("charge", "compensated")], "{undone:?}");
    assert_eq!(f.provider.counts("o-2").refunds, 1);
    assert_eq!(f.provider.requests(), requests);
}

/// A tombstone an older release left has no class: its step may have been compensatable, so the
/// compensation names it for a person rather than passing it over. And a step still on record
/// whose completed compensation's record alone was removed is compensated: not refunded again.
#[tokio::test]
async fn a_tombstone_without_a_class_is_named_and_a_removed_compensation_still_counts() {
    let f = Fixture::new().await;
    let ledger = f.host.ledger();
    let old =
        oncebox::ledger::Tombstone { class: None, ..crate::support::tombstone("old-key", "old", "pay", "charge") };
    ledger.expire(&[old], &[]).await.expect("expire");
    let report = f.host.compensate("old").await.expect("compensate");
    assert_eq!(report.state, SagaState::Outstanding, "{report:?}");
    assert_eq!(report.steps.len(), 1, "{report:?}");
    assert_eq!(report.steps[0].action, "undo-by-hand", "{report:?}");
    assert!(report.steps[0].reason.as_deref().is_some_and(|r| r.contains("older release")), "{report:?}");

    assert_eq!(f.host.call(step("u", "pay", "charge", &charge("o-3"))).await.expect("c").status, Status::Completed);
    assert_eq!(f.host.compensate("u").await.expect("compensate").state, SagaState::Done);
    assert_eq!(f.provider.counts("o-3").refunds, 1);
    let ops = ledger.operations(Some("u")).await.expect("read");
    let refund = ops.iter().find(|op| oncebox::saga::is_compensation(op)).expect("the refund's record");
    let tombstone = oncebox::ledger::Tombstone::of(refund, oncebox_now());
    let removed = ledger.expire(&[tombstone], &[]).await.expect("expire");
    assert_eq!(removed.operations, 1, "the run is closed: the refund's record goes alone");
    let requests = f.provider.requests();
    let again = f.host.compensate("u").await.expect("compensate");
    assert_eq!(again.state, SagaState::Done, "{again:?}");
    assert_eq!(again.steps[0].action, "compensated", "{again:?}");
    assert!(again.steps[0].reason.as_deref().is_some_and(|r| r.contains("expired")), "{again:?}");
    assert_eq!(f.provider.requests(), requests, "nothing sent");
    assert_eq!(f.provider.counts("o-3").refunds, 1);
}

/// A compensation whose request for approval was rejected, under a key of the scheme before
/// compensations were keyed by their step alone (its tool in its key), the request since removed
/// by retention (rejected requests go even from an open run: their tombstones keep them final):
/// the step is named for a person, and its refund is not begun again under today's key.
#[tokio::test]
async fn a_rejected_compensation_whose_request_went_is_not_tried_again_under_another_key() {
    let f = Fixture::new().await;
    let ledger = f.host.ledger();
    let paid = f.host.call(step("r", "pay", "charge", &charge("o-4"))).await.expect("call");
    assert_eq!(paid.status, Status::Completed, "{paid:?}");
    let charged = ledger.operation(paid.operation_key.as_deref().expect("key")).await.expect("read").expect("op");
    let compensation = oncebox::saga::compensation_step(&charged);
    let rejected = oncebox::ledger::Tombstone {
        status: OperationStatus::Failed,
        rejected: true,
        class: None,
        ..crate::support::tombstone("old-refund-key", "r", &compensation, "refund")
    };
    ledger.expire(&[rejected], &[]).await.expect("expire");

    let requests = f.provider.requests();
    let report = f.host.compensate("r").await.expect("compensate");
    assert_eq!(report.state, SagaState::Outstanding, "{report:?}");
    assert_eq!(report.steps[0].action, "undo-by-hand", "{report:?}");
    assert!(report.steps[0].reason.as_deref().is_some_and(|r| r.contains("was rejected")), "{report:?}");
    assert_eq!(f.provider.requests(), requests, "no refund begun again");
    assert_eq!(f.provider.counts("o-4").refunds, 0);
}

fn oncebox_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis() as u64
}

// The saga from the CLI, killed mid-refund and resumed

/// A directory holding the components of `charge` and `refund`, and a policy file granting them
/// the provider, which honours keys.
fn tools_dir(dir: &std::path::Path, provider: &oncebox_example_provider::ProviderHandle) -> (String, String) {
    let tools = dir.join("tools");
    std::fs::create_dir_all(&tools).expect("tools dir");
    for (name, path) in [("charge", oncebox_artifacts::CHARGE), ("refund", oncebox_artifacts::REFUND)] {
        std::fs::copy(path, tools.join(format!("{name}.wasm"))).expect("copy component");
    }
    let base = provider.base_url();
    let mut policy =
        format!("[hosts.\"{}\"]\nhonours_keys = true\nkey_retention = \"24h\"\ntimeout = \"500ms\"\n", provider.addr());
    for tool in ["charge", "refund"] {
        policy.push_str(&format!(
            "[tools.{tool}]\ninitial_backoff = \"1ms\"\nmax_backoff = \"5ms\"\n[tools.{tool}.config]\nbase_url = \"{base}\"\n\
             [tools.{tool}.grants]\nhttp = [\"{base}\"]\n"
        ));
    }
    let file = dir.join("oncebox.toml");
    std::fs::write(&file, policy).expect("policy");
    (tools.to_str().expect("utf8").to_string(), file.to_str().expect("utf8").to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compensation_killed_after_the_refund_was_sent_is_resumed_with_one_refund() {
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let dir = tempfile::tempdir().expect("dir");
    let (tools, policy) = tools_dir(dir.path(), &provider);
    let ledger = dir.path().join("l.redb");
    let ledger_arg = ledger.to_str().expect("utf8").to_string();
    let pay = ["call", "--ledger", &ledger_arg, "--policy", &policy, "--run", "r", "--step", "pay"];
    let args = charge("o-1").to_string();
    let mut flags: Vec<&str> = pay.to_vec();
    flags.extend([oncebox_artifacts::CHARGE, args.as_str()]);
    let (code, paid, stderr) = crate::support::oncebox(&flags);
    assert_eq!((code, paid["status"].as_str()), (0, Some("completed")), "{paid} {stderr}");

    // The refunds service commits 2 s after it accepts; the compensate process is killed meanwhile.
    provider.arm(Fault::new(Route::Refunds, FaultKind::CommitAfterDelay { delay_ms: 2_000 }).for_order("o-1"));
    let compensate = ["compensate", "--ledger", &ledger_arg, "--run", "r", "--tools", &tools, "--policy", &policy];
    let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("compile-cache");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_oncebox"))
        .args(compensate)
        .env("ONCEBOX_CACHE", &cache)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    crate::support::eventually("the refund is in flight", || provider.in_flight() > 0).await;
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    provider.settled().await;
    assert_eq!(provider.counts("o-1").refunds, 1, "the refund landed after the kill");

    // Resumed: the refund's write-ahead says it was sent; resent with its key, answered from the
    // provider's record. One refund.
    let (code, report, stderr) = crate::support::oncebox(&compensate);
    assert_eq!((code, report["state"].as_str()), (0, Some("done")), "{report} {stderr}");
    assert_eq!(report["steps"][0]["action"], "compensated", "{report}");
    assert_eq!(provider.counts("o-1").refunds, 1);
    let (code, again, _) = crate::support::oncebox(&compensate);
    assert_eq!((code, again["steps"][0]["compensation"]["replayed"].as_bool()), (0, Some(true)), "{again}");
    assert_eq!(provider.counts("o-1").refunds, 1);
}

// From the CLI: approvals, recovery and gc as an operator runs them

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_sees_the_exact_params_with_reveal_approves_them_and_the_shipment_goes_once() {
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let dir = tempfile::tempdir().expect("dir");
    let ledger = dir.path().join("l.redb");
    let ledger_arg = ledger.to_str().expect("utf8");
    let base = provider.base_url();
    let (config, grant) = (format!("base_url={base}"), format!("http={base}"));
    let args = fulfill("1 Main St").to_string();
    let ship = [
        "call",
        "--ledger",
        ledger_arg,
        "--config",
        &config,
        "--grant",
        &grant,
        "--run",
        "r",
        "--step",
        "ship",
        oncebox_artifacts::FULFILL,
        &args,
    ];
    let (code, awaiting, stderr) = crate::support::oncebox(&ship);
    assert_eq!((code, awaiting["status"].as_str()), (1, Some("awaiting-approval")), "{awaiting} {stderr}");
    assert_eq!(provider.requests(), 0);
    let key = awaiting["operation_key"].as_str().expect("key");
    assert!(!stderr.contains("1 Main St"), "no log shows the address: {stderr}");

    let (code, listed, _) = crate::support::oncebox(&["approvals", "list", "--ledger", ledger_arg, "--pending"]);
    assert_eq!((code, listed["operation_key"].as_str()), (0, Some(key)), "{listed}");
    let (_, shown, _) = crate::support::oncebox(&["approvals", "show", "--ledger", ledger_arg, key]);
    assert_eq!(shown["params"]["address"], oncebox::REDACTED, "{shown}");
    let (code, revealed, stderr) =
        crate::support::oncebox(&["approvals", "show", "--ledger", ledger_arg, key, "--reveal"]);
    assert_eq!((code, revealed["params"]["address"].as_str()), (0, Some("1 Main St")), "{revealed} {stderr}");
    assert!(revealed["consequence"].as_str().is_some_and(|c| c.contains("cannot be cancelled")), "{revealed}");
    let (_, ledger_show, _) = crate::support::oncebox(&["ledger", "list", "--ledger", ledger_arg]);
    assert!(ledger_show.is_null(), "no operation exists before the approval: {ledger_show}");

    // Without the key that opens the address, approving is refused: the person could not have
    // read what they approve.
    let key_file = oncebox::secret::beside(&ledger);
    let away = dir.path().join("away.key");
    std::fs::rename(&key_file, &away).expect("move the key file away");
    let fingerprint = awaiting["fingerprint"].as_str().expect("fingerprint");
    let component = awaiting["approval"]["component"].as_str().expect("component");
    let approve = ["approve", "--ledger", ledger_arg, key, "--fingerprint", fingerprint, "--component", component];
    let (code, _, stderr) = crate::support::oncebox(&[&approve[..], &["--by", "ops"]].concat());
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("cannot be unsealed here") && !stderr.contains("1 Main St"), "{stderr}");
    // It says why: the key file it looked for, and what reading it said.
    assert!(stderr.contains(&key_file.display().to_string()), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    std::fs::rename(&away, &key_file).expect("the key file back");

    crate::support::approve_cli(&ledger, &awaiting);
    let (code, shipped, stderr) = crate::support::oncebox(&ship);
    assert_eq!((code, shipped["status"].as_str()), (0, Some("completed")), "{shipped} {stderr}");
    let (_, again, _) = crate::support::oncebox(&ship);
    assert_eq!(again["replayed"], true);
    assert_eq!(provider.counts("o-1").fulfillments, 1);

    // Nothing left to decide: recover says so (the whole ledger's report lists the open runs, of
    // which there is none; the run asked by name shows its steps), and gc (with a zero retention)
    // removes the shipment, after which the step is refused as expired, not shipped again.
    let (code, recovered, _) = crate::support::oncebox(&["recover", "--ledger", ledger_arg]);
    assert_eq!((code, &recovered["runs"]), (0, &serde_json::json!({})), "{recovered}");
    let (code, recovered, _) = crate::support::oncebox(&["recover", "--ledger", ledger_arg, "--run", "r"]);
    assert_eq!((code, recovered["runs"]["r"]["completed"][0]["tool"].as_str()), (0, Some("fulfill")), "{recovered}");
    std::thread::sleep(Duration::from_millis(5));
    let (code, gc, _) = crate::support::oncebox(&["ledger", "gc", "--ledger", ledger_arg, "--older-than", "0s"]);
    assert_eq!((code, gc["removed_operations"].as_u64()), (0, Some(1)), "{gc}");
    let (code, expired, _) = crate::support::oncebox(&ship);
    assert_eq!((code, expired["status"].as_str()), (1, Some("expired")), "{expired}");
    assert_eq!(provider.counts("o-1").fulfillments, 1);
}

#[tokio::test]
async fn recovery_reports_what_a_person_must_decide_after_a_restart() {
    let f = Fixture::honouring_keys(false).await;
    f.provider.arm(Fault::new(Route::Payments, FaultKind::LoseResponse).for_order("o-1"));
    f.host.call(step("r", "pay", "charge", &charge("o-1"))).await.expect("call");
    f.host.call(step("r", "ship", "fulfill", &fulfill("1 Main St"))).await.expect("call");
    let ledger_path = f.dir.path().join("ledger.redb");
    drop(f.host);
    // A restart: the ledger reopened from its file.
    let ledger = oncebox::Ledger::open(&ledger_path).expect("reopen");
    let runs = oncebox::recovery::report(&ledger, None).await.expect("report");
    let run = &runs["r"];
    assert_eq!(run.in_doubt.iter().map(|s| s.tool.as_str()).collect::<Vec<_>>(), ["charge"]);
    assert_eq!(run.in_doubt[0].effects_in_doubt.len(), 1);
    assert_eq!(run.awaiting_approval.iter().map(|s| s.tool.as_str()).collect::<Vec<_>>(), ["fulfill"]);
    assert_eq!(run.decide.len(), 2, "{run:?}");
    assert!(run.decide.iter().any(|d| d.command.contains("oncebox resolve")));
    assert!(run.decide.iter().any(|d| d.command.contains("oncebox approve")));
}

#[tokio::test]
async fn loading_a_directory_checks_that_each_compensation_exists_and_takes_the_mapped_args() {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::copy(oncebox_artifacts::CHARGE, dir.path().join("charge.wasm")).expect("copy");
    let host = oncebox::Host::builder_in_memory().build().await.expect("host");
    let missing = host.load_dir(dir.path()).await;
    assert!(missing.is_err_and(|e| e.to_string().contains("`refund`, which is not loaded")));
    std::fs::copy(oncebox_artifacts::REFUND, dir.path().join("refund.wasm")).expect("copy");
    let host = oncebox::Host::builder_in_memory().build().await.expect("host");
    let loaded = host.load_dir(dir.path()).await.expect("both load");
    assert_eq!(loaded.len(), 2);
}

#[tokio::test]
async fn a_policy_may_ask_approval_of_any_write_but_never_waive_it_for_an_irreversible_tool() {
    let dir = tempfile::tempdir().expect("dir");
    let policy = dir.path().join("oncebox.toml");
    std::fs::write(&policy, "[tools.charge]\nrequires_approval = true\n").expect("policy");
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let file = oncebox::policy_file::PolicyFile::load(&policy).expect("policy file");
    let builder = crate::support::configure(oncebox::Host::builder(dir.path().join("l.redb")), &provider, true);
    // The test fixture's own charge policy would win over the file: set it here instead.
    let builder = builder.retry_policy(
        "charge",
        oncebox::RetryPolicy { requires_approval: true, ..crate::support::fast(oncebox::ReplayClass::Compensatable) },
    );
    let host = builder.policy_file(file).build().await.expect("host");
    host.load(oncebox_artifacts::CHARGE).await.expect("load");
    let outcome = host.call(step("r", "pay", "charge", &charge("o-1"))).await.expect("call");
    assert_eq!(outcome.status, Status::AwaitingApproval, "{outcome:?}");
    assert_eq!(provider.requests(), 0);

    std::fs::write(&policy, "[tools.fulfill]\nrequires_approval = false\n").expect("policy");
    let file = oncebox::policy_file::PolicyFile::load(&policy).expect("parses");
    let host = oncebox::Host::builder_in_memory().policy_file(file).build().await.expect("host");
    let refused = host.load(oncebox_artifacts::FULFILL).await;
    assert!(refused.is_err_and(|e| e.to_string().contains("requires_approval")));
}

#[tokio::test]
async fn gc_keeps_a_run_a_saga_still_needs_and_a_rejection_stays_final_after_its_request_goes() {
    let f = Fixture::new().await;
    // Run "rejected": the shipment was rejected.
    let ship = f.host.call(step("rejected", "ship", "fulfill", &fulfill("2 Main St"))).await.expect("call");
    let (key, fingerprint) = (ship.operation_key.clone().expect("k"), ship.fingerprint.clone().expect("f"));
    f.host.decide(&key, &fingerprint, Decision::Reject, "ops", None).await.expect("reject");
    tokio::time::sleep(Duration::from_millis(5)).await;
    // Run "blocked", later: the charge completed, the shipment awaits approval. Its compensation
    // cannot start yet, and must find the charge when it can.
    f.host.call(step("blocked", "1-pay", "charge", &charge("o-1"))).await.expect("call");
    let blocked = f.host.call(step("blocked", "2-ship", "fulfill", &fulfill("1 Main St"))).await.expect("call");
    let asked = f.host.ledger().approval(blocked.operation_key.as_deref().expect("k")).await.expect("r").expect("r");

    // A window that ends when the shipment was asked for: the rejection is past it, the request
    // is not (a request nobody decided within the window lapses: `approval_binding.rs`).
    let window = Duration::from_secs(3600);
    let gc = oncebox::retention::gc(f.host.ledger(), window, asked.requested_ms + 3_600_000).await.expect("gc");
    assert_eq!((gc.removed_operations, gc.removed_approvals), (0, 1), "{gc:?}");
    assert_eq!(f.host.ledger().operations(Some("blocked")).await.expect("read").len(), 1, "the charge is kept");
    // The rejected step stays refused: not a fresh request that someone could approve.
    let again = f.host.call(step("rejected", "ship", "fulfill", &fulfill("2 Main St"))).await.expect("call");
    assert_eq!(again.status, Status::Expired, "{again:?}");
    assert!(again.error.as_ref().is_some_and(|e| e.message.contains("was rejected")), "{again:?}");
    assert!(f.host.ledger().approval(&key).await.expect("read").is_none());
    assert_eq!(f.provider.counts("o-1").fulfillments, 0);
}

#[tokio::test]
async fn an_irreversible_step_proven_not_committed_fails_and_is_not_shipped_again_without_a_person() {
    let f = Fixture::new().await;
    // The shipment fails before it commits (500), so it is in doubt; nobody resends it.
    f.provider.arm(Fault::new(Route::Fulfillments, FaultKind::ErrorBeforeCommit).for_order("o-1"));
    let call = step("r", "ship", "fulfill", &fulfill("1 Main St"));
    let first = f.host.call(call.clone()).await.expect("call");
    approve(&f.host, &first).await;
    let lost = f.host.call(call.clone()).await.expect("call");
    assert_eq!(lost.status, Status::Unknown, "{lost:?}");
    let key = lost.operation_key.as_deref().expect("key");
    // A person looked: it did not ship. The step fails (nothing took effect) and is not run again.
    let settled = f
        .host
        .resolve(key, None, &oncebox::ledger::Resolution::NotCommitted, "ops", Some("not in the warehouse system"))
        .await
        .expect("settle");
    assert_eq!(settled.status, Status::Failed, "{settled:?}");
    let again = f.host.call(call).await.expect("call");
    assert_eq!((again.status, again.replayed), (Status::Failed, true), "{again:?}");
    assert_eq!(f.provider.counts("o-1").fulfillments, 0);
    assert_eq!(f.provider.requests(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_charge_is_reconciled_from_the_cli_by_run_and_by_operation_key() {
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    provider.configure(oncebox_example_provider::Settings { honour_keys: false, ..Default::default() });
    let dir = tempfile::tempdir().expect("dir");
    let (tools, policy) = tools_dir(dir.path(), &provider);
    // This downstream ignores keys: the policy must not say otherwise.
    let policy_text = std::fs::read_to_string(&policy)
        .expect("read")
        .replace("honours_keys = true\nkey_retention = \"24h\"\n", "honours_keys = false\n");
    std::fs::write(&policy, policy_text).expect("write");
    let ledger = dir.path().join("l.redb");
    let ledger_arg = ledger.to_str().expect("utf8");
    provider.arm(Fault::new(Route::Payments, FaultKind::LoseResponse).for_order("o-1"));
    let args = charge("o-1").to_string();
    let pay = [
        "call",
        "--ledger",
        ledger_arg,
        "--policy",
        &policy,
        "--run",
        "r",
        "--step",
        "pay",
        oncebox_artifacts::CHARGE,
        &args,
    ];
    let (code, lost, _) = crate::support::oncebox(&pay);
    assert_eq!((code, lost["status"].as_str()), (1, Some("unknown")), "{lost}");
    let key = lost["operation_key"].as_str().expect("key");

    let by_key = ["reconcile", "--ledger", ledger_arg, "--policy", &policy, "--operation", key, "--tools", &tools];
    let (code, answer, stderr) = crate::support::oncebox(&by_key);
    assert_eq!((code, answer["reconciled"][0]["result"].as_str()), (0, Some("committed")), "{answer} {stderr}");
    let by_run = ["reconcile", "--ledger", ledger_arg, "--policy", &policy, "--run", "r", "--tools", &tools];
    let (code, answer, _) = crate::support::oncebox(&by_run);
    assert_eq!(
        (code, answer["reconciled"].as_array().map(Vec::len)),
        (0, Some(0)),
        "nothing unknown is left: {answer}"
    );
    let (code, again, _) = crate::support::oncebox(&pay);
    assert_eq!((code, again["replayed"].as_bool()), (0, Some(true)), "{again}");
    assert_eq!(provider.counts("o-1").payments, 1);
}

/// `compensate --tools DIR` loads the directory as `serve` does: an unrelated component that does
/// not load is reported and skipped, and the refund still goes out, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compensate_skips_an_unrelated_broken_component_as_serve_does() {
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let dir = tempfile::tempdir().expect("dir");
    let (tools, policy) = tools_dir(dir.path(), &provider);
    std::fs::write(std::path::Path::new(&tools).join("broken.wasm"), b"\0asm not really").expect("broken");
    let ledger = dir.path().join("l.redb");
    let ledger_arg = ledger.to_str().expect("utf8").to_string();
    let args = charge("o-b").to_string();
    let pay = ["call", "--ledger", &ledger_arg, "--policy", &policy, "--run", "rb", "--step", "pay"];
    let mut flags: Vec<&str> = pay.to_vec();
    flags.extend([oncebox_artifacts::CHARGE, args.as_str()]);
    let (code, paid, stderr) = crate::support::oncebox(&flags);
    assert_eq!((code, paid["status"].as_str()), (0, Some("completed")), "{paid} {stderr}");

    let compensate = ["compensate", "--ledger", &ledger_arg, "--run", "rb", "--tools", &tools, "--policy", &policy];
    let (code, report, stderr) = crate::support::oncebox(&compensate);
    assert_eq!(code, 0, "{report} {stderr}");
    assert_eq!(report["state"], "done", "{report}");
    assert!(stderr.contains("broken.wasm"), "the skipped file is named: {stderr}");
    provider.settled().await;
    assert_eq!(provider.counts("o-b").refunds, 1, "refunded once");
}

// Sagas that finish, or say who must act

/// A policy file (from [`tools_dir`]) under which every refund needs a person's approval.
fn refunds_need_approval(policy: &str) {
    let text = std::fs::read_to_string(policy).expect("read policy");
    let text = text.replace("[tools.refund]\n", "[tools.refund]\nrequires_approval = true\n");
    assert!(text.contains("requires_approval = true"), "{text}");
    std::fs::write(policy, text).expect("write policy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compensation_that_needs_approval_waits_for_it_then_refunds_once() {
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let dir = tempfile::tempdir().expect("dir");
    let (tools, policy) = tools_dir(dir.path(), &provider);
    refunds_need_approval(&policy);
    let ledger = dir.path().join("l.redb");
    let ledger_arg = ledger.to_str().expect("utf8");
    let args = charge("o-1").to_string();
    let pay =
        ["call", "--ledger", ledger_arg, "--policy", &policy, "--run", "r", "--step", "pay", oncebox_artifacts::CHARGE];
    let mut flags = pay.to_vec();
    flags.push(&args);
    let (code, paid, stderr) = crate::support::oncebox(&flags);
    assert_eq!((code, paid["status"].as_str()), (0, Some("completed")), "{paid} {stderr}");

    // The refund's request is recorded, and the report says who must act and how.
    let compensate = ["compensate", "--ledger", ledger_arg, "--run", "r", "--tools", &tools, "--policy", &policy];
    let (code, report, stderr) = crate::support::oncebox(&compensate);
    assert_eq!((code, report["state"].as_str()), (1, Some("awaiting-approval")), "{report} {stderr}");
    let waiting = &report["steps"][0];
    assert_eq!(waiting["action"], "awaiting-approval", "{report}");
    let key = waiting["compensation"]["operation_key"].as_str().expect("the compensation's key");
    assert!(
        waiting["approve"].as_str().is_some_and(|c| c.starts_with("oncebox approve") && c.contains(key)),
        "{report}"
    );
    assert_eq!(waiting["console"].as_str(), Some(format!("/approvals/{key}").as_str()), "{report}");
    assert_eq!(provider.counts("o-1").refunds, 0, "nothing is refunded before the approval");

    // Asked again before anyone decided: the same request, still nothing sent.
    let (code, again, _) = crate::support::oncebox(&compensate);
    assert_eq!((code, again["state"].as_str()), (1, Some("awaiting-approval")), "{again}");
    assert_eq!(again["steps"][0]["compensation"]["operation_key"].as_str(), Some(key));
    let (_, pending, _) = crate::support::oncebox(&["approvals", "list", "--ledger", ledger_arg, "--pending"]);
    assert_eq!(pending["operation_key"].as_str(), Some(key), "one request: {pending}");
    assert_eq!(provider.requests(), 1, "only the charge reached the provider");

    // Approved: the next compensate refunds, once; every later one answers from the record.
    crate::support::approve_cli(&ledger, &waiting["compensation"]);
    let (code, done, stderr) = crate::support::oncebox(&compensate);
    assert_eq!((code, done["state"].as_str()), (0, Some("done")), "{done} {stderr}");
    assert_eq!(done["steps"][0]["action"], "compensated", "{done}");
    assert_eq!(provider.counts("o-1").refunds, 1);
    let (code, replayed, _) = crate::support::oncebox(&compensate);
    assert_eq!((code, replayed["steps"][0]["compensation"]["replayed"].as_bool()), (0, Some(true)), "{replayed}");
    assert_eq!(provider.counts("o-1").refunds, 1);
    assert_eq!(provider.counts("o-1").payments, 1);
}

/// A host on `ledger` with the example tools, whose refunds need a person's approval.
async fn approving_refunds(ledger: &std::path::Path, provider: &oncebox_example_provider::ProviderHandle) -> Host {
    let refund = RetryPolicy { requires_approval: true, ..crate::support::fast(ReplayClass::IdempotentWrite) };
    let host =
        crate::support::builder_for(ledger, provider, true).retry_policy("refund", refund).build().await.expect("host");
    crate::support::load_all(&host).await;
    host
}

#[tokio::test]
async fn a_rejected_compensation_sends_nothing_and_names_the_step_to_undo_by_hand() {
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let dir = tempfile::tempdir().expect("dir");
    let host = approving_refunds(&dir.path().join("l.redb"), &provider).await;
    assert_eq!(host.call(step("r", "pay", "charge", &charge("o-1"))).await.expect("call").status, Status::Completed);
    let report = host.compensate("r").await.expect("compensate");
    assert_eq!(report.state, SagaState::AwaitingApproval, "{report:?}");
    // Served, the console's page is a link on the server.
    let served = report.clone().served_at("https://ops.example/");
    let waiting = report.steps[0].compensation.as_ref().expect("the refund's request");
    let key = waiting.operation_key.as_deref().expect("key");
    assert_eq!(served.steps[0].console.as_deref(), Some(format!("https://ops.example/approvals/{key}").as_str()));

    let fingerprint = waiting.fingerprint.as_deref().expect("fingerprint");
    host.decide(key, fingerprint, Decision::Reject, "ops", Some("refund by bank transfer")).await.expect("reject");
    let report = host.compensate("r").await.expect("compensate");
    assert_eq!(report.state, SagaState::Outstanding, "{report:?}");
    assert_eq!(report.steps[0].action, "undo-by-hand", "{report:?}");
    assert!(report.steps[0].reason.as_deref().is_some_and(|r| r.contains("by hand")), "{report:?}");
    assert_eq!(provider.counts("o-1").refunds, 0);
    assert_eq!(provider.requests(), 1, "only the charge");

    // The person who refunded it by bank transfer says so from the command line.
    drop(host);
    let ledger = dir.path().join("l.redb");
    let ledger = ledger.to_str().expect("utf8");
    let step_key = report.steps[0].operation_key.as_str();
    let said = ["undone-by-hand", "--ledger", ledger, step_key, "--by", "ops", "--note", "bank transfer T-1"];
    let (code, word, stderr) = crate::support::oncebox(&said);
    assert_eq!((code, &word["recorded"], &word["by"]), (0, &json!(true), &json!("ops")), "{word} {stderr}");
    let (code, _, stderr) =
        crate::support::oncebox(&["undone-by-hand", "--ledger", ledger, "no-such-key", "--by", "ops"]);
    assert_eq!(code, 2, "refused, and says why: {stderr}");
    assert!(stderr.contains("no operation no-such-key"), "{stderr}");
    let host = approving_refunds(&dir.path().join("l.redb"), &provider).await;
    assert_eq!(host.compensate("r").await.expect("compensate").state, SagaState::Done);
    assert_eq!(provider.requests(), 1, "only the charge");
}

/// A step whose compensation a person rejected is undone by hand and said so: the saga then
/// answers it compensated, having sent nothing; a second word is answered from the first; and
/// after gc removed the word's record, its tombstone still counts.
#[tokio::test]
async fn a_step_a_person_undid_by_hand_is_compensated_and_nothing_is_ever_sent_for_it() {
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let dir = tempfile::tempdir().expect("dir");
    let host = approving_refunds(&dir.path().join("l.redb"), &provider).await;
    let paid = host.call(step("r", "pay", "charge", &charge("o-1"))).await.expect("call");
    let key = paid.operation_key.clone().expect("key");
    let report = host.compensate("r").await.expect("compensate");
    assert_eq!(report.state, SagaState::AwaitingApproval, "{report:?}");
    // While the refund awaits a decision it may still run: a word now would undo the step twice.
    let early = host.undone_by_hand(&key, "ops", None).await;
    let why = early.as_ref().err().map(ToString::to_string).unwrap_or_default();
    assert!(why.contains("awaiting approval") && why.contains("reject"), "{early:?}");

    let waiting = report.steps[0].compensation.as_ref().expect("the refund's request");
    let (refund, fingerprint) = (waiting.operation_key.as_deref().expect("k"), waiting.fingerprint.as_deref());
    host.decide(refund, fingerprint.expect("fp"), Decision::Reject, "ops", None).await.expect("reject");
    assert_eq!(host.compensate("r").await.expect("compensate").steps[0].action, "undo-by-hand");
    let said = host.undone_by_hand(&key, "ops", Some("refunded by bank transfer T-9")).await.expect("said");
    assert!(said.recorded, "{said:?}");
    assert_eq!(said.recorded_as, oncebox::keys::undone_by_hand_key("r", &key), "beside the rejected request");
    let done = host.compensate("r").await.expect("compensate");
    assert_eq!(done.state, SagaState::Done, "{done:?}");
    assert_eq!(done.steps[0].action, "compensated", "{done:?}");
    let reason = done.steps[0].reason.as_deref().unwrap_or_default();
    assert!(reason.contains("undone by hand by ops") && reason.contains("T-9"), "{done:?}");
    // Another word is the first one's: not recorded again.
    let again = host.undone_by_hand(&key, "someone-else", None).await.expect("said");
    assert_eq!((again.recorded, again.by.as_deref()), (false, Some("ops")), "{again:?}");
    // Nothing keeps the run open, so gc removes it; the word's tombstone still counts.
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert!(host.ledger().open_runs(Some("r"), host.ledger().now_ms()).await.expect("open").is_empty());
    assert!(host.gc(Duration::ZERO).await.expect("gc").removed_operations >= 2);
    let after = host.compensate("r").await.expect("compensate");
    assert_eq!(after.state, SagaState::Done, "{after:?}");
    assert!(after.steps[0].reason.as_deref().is_some_and(|r| r.contains("undone by hand")), "{after:?}");
    assert!(!host.undone_by_hand(&key, "x", None).await.expect("said").recorded, "the first word stands");
    assert_eq!((provider.counts("o-1").refunds, provider.requests()), (0, 1), "only the charge was ever sent");
}

/// A word that a step was undone by hand is refused while its compensation's outcome is unknown
/// (the refund may have gone), for no step, and without who said it. With nothing of
/// its compensation begun it is recorded at the compensation's own key, so a compensation later
/// finds the step undone and sends nothing.
#[tokio::test]
async fn undoing_by_hand_is_refused_while_the_compensation_may_undo_the_step_and_takes_its_place_before() {
    let f = Fixture::new().await;
    let paid = f.call("r", "pay", "charge", &charge("o-1")).await;
    let key = paid.operation_key.clone().expect("key");
    f.provider.arm(Fault::new(Route::Refunds, FaultKind::ErrorBeforeCommit).for_order("o-1").times(100));
    assert_eq!(f.host.compensate("r").await.expect("compensate").state, SagaState::Outstanding);
    let refused = f.host.undone_by_hand(&key, "ops", None).await;
    assert!(
        matches!(&refused, Err(oncebox::CallError::ByHand { reason, .. }) if reason.contains("unknown")),
        "{refused:?}"
    );
    let missing = f.host.undone_by_hand("no-such-key", "ops", None).await;
    assert!(matches!(&missing, Err(oncebox::CallError::ByHand { reason, .. }) if reason.contains("no operation")));
    assert!(f.host.undone_by_hand(&key, " ", None).await.is_err(), "who undid it is recorded");

    // Nothing of its compensation begun: the word takes the compensation's key.
    assert_eq!(f.call("q", "1-pay", "charge", &charge("o-3")).await.status, Status::Completed);
    let other = f.call("q", "pay", "charge", &charge("o-2")).await;
    let other_key = other.operation_key.clone().expect("key");
    let said = f.host.undone_by_hand(&other_key, "ops", Some("refunded at the till")).await.expect("said");
    let charged = f.host.ledger().operation(&other_key).await.expect("read").expect("op");
    let compensation = oncebox::keys::operation_key("q", &oncebox::saga::compensation_step(&charged), "refund");
    assert_eq!(said.recorded_as, compensation, "{said:?}");
    // One step undone by hand starts no compensation of the run's others: the run stays closed.
    let open = f.host.ledger().open_runs(Some("q"), f.host.ledger().now_ms()).await.expect("open");
    assert!(open.is_empty(), "{open:?}");
    let requests = f.provider.requests();
    let done = f.host.compensate("q").await.expect("compensate");
    assert_eq!(done.state, SagaState::Done, "{done:?}");
    assert_eq!(f.provider.requests(), requests + 1, "only the other charge's refund sent");
    assert_eq!((f.provider.counts("o-2").refunds, f.provider.counts("o-3").refunds), (0, 1));
}

/// Two people say at the same moment that they undid the same step by hand: both are answered,
/// one word is recorded and the other answered from it, and nothing is sent for the step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_word_said_by_two_people_at_once_is_recorded_once_and_both_are_answered() {
    let f = Fixture::new().await;
    let paid = f.call("r", "pay", "charge", &charge("o-1")).await;
    let key = paid.operation_key.clone().expect("key");
    let requests = f.provider.requests();
    for round in 0..5 {
        let step = format!("pay-{round}");
        let key = if round == 0 {
            key.clone()
        } else {
            f.call("r", &step, "charge", &charge(&format!("o-{round}-b"))).await.operation_key.expect("key")
        };
        let (a, b) = tokio::join!(f.host.undone_by_hand(&key, "ana", None), f.host.undone_by_hand(&key, "bo", None));
        let (a, b) = (a.expect("ana answered"), b.expect("bo answered"));
        assert_eq!(a.recorded_as, b.recorded_as, "{a:?} {b:?}");
        assert!(a.recorded != b.recorded, "exactly one recorded: {a:?} {b:?}");
        assert_eq!(a.by, b.by, "the second is answered with the first's word");
    }
    let requests_after = f.provider.requests();
    let done = f.host.compensate("r").await.expect("compensate");
    assert_eq!(done.state, SagaState::Done, "{done:?}");
    assert_eq!(f.provider.requests(), requests_after, "no refund sent");
    assert!(requests_after > requests);
    assert_eq!(f.provider.totals().refunds, 0);
}

/// A refund in doubt that a person settles `not-committed` is reopened, for compensate to resume
/// (and send again). A person who refunded by hand instead says so: the word ends the reopened
/// refund (failed: nothing of it took effect) and is recorded beside it, so no compensate sends
/// it. What they typed is masked by the values the charge sealed.
#[tokio::test]
async fn a_compensation_reopened_by_a_settlement_is_ended_by_a_person_s_word_and_never_sent() {
    let f = Fixture::honouring_keys(false).await;
    let paid = f.call("r", "pay", "charge", &charge("o-1")).await;
    let key = paid.operation_key.clone().expect("key");
    f.provider.arm(Fault::new(Route::Refunds, FaultKind::ErrorBeforeCommit).for_order("o-1").times(100));
    let report = f.host.compensate("r").await.expect("compensate");
    assert_eq!(report.state, SagaState::Outstanding, "{report:?}");
    let refund = report.steps[0].compensation.as_ref().and_then(|c| c.operation_key.clone()).expect("refund");
    let settled = f
        .host
        .resolve(&refund, None, &oncebox::ledger::Resolution::NotCommitted, "ops", Some("not at the bank"))
        .await
        .expect("settle");
    assert_eq!(settled.status, Status::InProgress, "reopened for compensate: {settled:?}");
    f.provider.clear_faults();
    let requests = f.provider.requests();

    let note = "refunded pm_card_visa at the dashboard";
    let said = f.host.undone_by_hand(&key, "ops", Some(note)).await.expect("said");
    assert!(said.recorded, "{said:?}");
    assert_eq!(said.recorded_as, oncebox::keys::undone_by_hand_key("r", &key), "beside the ended refund");
    let ended = f.host.ledger().operation(&refund).await.expect("read").expect("refund");
    assert_eq!(ended.status, OperationStatus::Failed, "{ended:?}");
    assert!(ended.error.as_ref().is_some_and(|e| e.message.contains("undid step")), "{ended:?}");
    let recorded = f.host.ledger().operation(&said.recorded_as).await.expect("read").expect("word");
    assert!(!recorded.args.to_string().contains("pm_card_visa"), "the note is masked: {recorded:?}");
    assert!(said.note.as_deref().is_some_and(|n| n.contains("at the dashboard") && !n.contains("pm_card")));

    let done = f.host.compensate("r").await.expect("compensate");
    assert_eq!(done.state, SagaState::Done, "{done:?}");
    assert!(done.steps[0].reason.as_deref().is_some_and(|r| r.contains("undone by hand by ops")), "{done:?}");
    assert!(!format!("{done:?}").contains("pm_card_visa"), "{done:?}");
    assert_eq!(f.provider.requests(), requests, "nothing sent after the word");
    assert_eq!(f.provider.counts("o-1").refunds, 0);
}

/// A new version of `charge` that names another refund tool, `refun2`, and that tool: the
/// example components with those names changed in place. A name of the same length keeps every
/// offset, so the components stay valid; loading them reads the new names from their manifests.
fn version_two(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    fn renamed(from: &str, to: &std::path::Path, keep: impl Fn(&[u8], usize) -> bool) {
        let mut bytes = std::fs::read(from).expect("component");
        let mut renamed = 0;
        let mut at = 0;
        while let Some(found) = bytes[at..].windows(6).position(|w| w == b"refund") {
            let i = at + found;
            if !keep(&bytes, i) {
                bytes[i..i + 6].copy_from_slice(b"refun2");
                renamed += 1;
            }
            at = i + 6;
        }
        assert!(renamed > 0, "no name to change in {from}");
        std::fs::write(to, bytes).expect("write component");
    }
    let (charge, refund) = (dir.join("charge-v2.wasm"), dir.join("refun2.wasm"));
    // `charge` says `refund` only where it names its compensation.
    renamed(oncebox_artifacts::CHARGE, &charge, |_, _| false);
    // `refund` says it in its name and its effect's label, and in the path it posts to
    // (`/refunds`), which stays.
    renamed(oncebox_artifacts::REFUND, &refund, |bytes, i| i > 0 && bytes[i - 1] == b'/');
    (charge, refund)
}

/// A host on `ledger` with version two of `charge` and its `refun2`.
async fn host_v2(
    ledger: &std::path::Path,
    provider: &oncebox_example_provider::ProviderHandle,
    dir: &std::path::Path,
) -> Host {
    let (charge_v2, refund_v2) = version_two(dir);
    let host = crate::support::builder_for(ledger, provider, true)
        .tool_config("refun2", "base_url", provider.base_url())
        .grant("refun2", crate::support::http_grant(provider))
        .retry_policy("refun2", crate::support::fast(ReplayClass::IdempotentWrite))
        .build()
        .await
        .expect("host");
    let manifest = host.load(&charge_v2).await.expect("charge v2");
    assert_eq!((manifest.name.as_str(), manifest.compensated_by.as_deref()), ("charge", Some("refun2")));
    assert_eq!(host.load(&refund_v2).await.expect("refun2").name, "refun2");
    host.check_compensation(&manifest).expect("refun2 takes charge's mapped args");
    host
}

#[tokio::test]
async fn a_new_version_of_charge_naming_another_refund_tool_never_refunds_twice() {
    let Fixture { dir, provider, host } = Fixture::new().await;
    let ledger = dir.path().join("ledger.redb");
    assert_eq!(host.call(step("r", "pay", "charge", &charge("o-1"))).await.expect("call").status, Status::Completed);
    let report = host.compensate("r").await.expect("compensate");
    assert_eq!(report.state, SagaState::Done, "{report:?}");
    assert_eq!(provider.counts("o-1").refunds, 1);
    drop(host);

    // Upgraded: `charge` now names `refun2`. The step was undone (by `refund`), and that counts.
    let host = host_v2(&ledger, &provider, dir.path()).await;
    let report = host.compensate("r").await.expect("compensate");
    assert_eq!(report.state, SagaState::Done, "{report:?}");
    assert_eq!(report.steps[0].action, "compensated", "{report:?}");
    let compensation = report.steps[0].compensation.as_ref().expect("from the record");
    assert!(compensation.replayed, "{report:?}");
    assert_eq!(provider.counts("o-1").refunds, 1, "one refund, whatever tool the new version names");
    assert_eq!(provider.totals().refunds, 1);
}

#[tokio::test]
async fn a_compensation_begun_by_one_refund_tool_is_never_run_again_by_another() {
    let Fixture { dir, provider, host } = Fixture::new().await;
    let ledger = dir.path().join("ledger.redb");
    host.call(step("r", "pay", "charge", &charge("o-1"))).await.expect("call");
    // The refunds service answers 500 for now: `refund` is left in doubt.
    provider.arm(Fault::new(Route::Refunds, FaultKind::ErrorBeforeCommit).for_order("o-1").times(100));
    let report = host.compensate("r").await.expect("compensate");
    assert_eq!(report.state, SagaState::Outstanding, "{report:?}");
    drop(host);
    let sent = provider.requests();

    // Version two names `refun2`: refused, with what to do, and nothing sent.
    let v2 = host_v2(&ledger, &provider, dir.path()).await;
    let report = v2.compensate("r").await.expect("compensate");
    assert_eq!(report.state, SagaState::Outstanding, "{report:?}");
    let why = report.steps[0].reason.as_deref().unwrap_or_default();
    assert!(why.contains("began as `refund`") && why.contains("undone once"), "{report:?}");
    assert_eq!(provider.requests(), sent, "refun2 sent nothing");
    // Even called by hand on the compensation's step, `refun2` finds the step's compensation on
    // record: the key is the step's, not the tool's.
    let args = json!({"order_id": "o-1", "amount_cents": 1200});
    let key = report.steps[0].operation_key.clone();
    let by_hand = v2.call(step("r", &format!("compensate/{key}"), "refun2", &args)).await;
    assert!(matches!(by_hand, Err(oncebox::CallError::ReservedStep { .. })), "only the saga names it: {by_hand:?}");
    assert_eq!(provider.requests(), sent);
    drop(v2);

    // The refunds service recovers; the compensation is finished by the tool it began with, once.
    provider.clear_faults();
    let host = crate::support::host_for(&ledger, &provider, true).await;
    assert_eq!(host.compensate("r").await.expect("compensate").state, SagaState::Done);
    drop(host);
    let v2 = host_v2(&ledger, &provider, dir.path()).await;
    assert_eq!(v2.compensate("r").await.expect("compensate").state, SagaState::Done);
    assert_eq!(provider.counts("o-1").refunds, 1);
}

#[tokio::test]
async fn a_step_reopened_by_a_settlement_does_not_block_compensation_and_is_never_charged_after_it() {
    let f = Fixture::honouring_keys(false).await;
    assert_eq!(f.call("r", "1-pay", "charge", &charge("o-1")).await.status, Status::Completed);
    // The second charge's answer is a 500: in doubt. A person looks: it did not go through.
    f.provider.arm(Fault::new(Route::Payments, FaultKind::ErrorBeforeCommit).for_order("o-2"));
    let lost = f.call("r", "2-pay", "charge", &charge("o-2")).await;
    assert_eq!(lost.status, Status::Unknown, "{lost:?}");
    let key = lost.operation_key.as_deref().expect("key");
    let settled = f
        .host
        .resolve(key, None, &oncebox::ledger::Resolution::NotCommitted, "ops", Some("not at the bank"))
        .await
        .expect("settle");
    // Reopened: claimed, with no owner's lease, for the next call of the step to run.
    assert_eq!(settled.status, Status::InProgress, "{settled:?}");

    // The run is undone instead: the reopened step is ended (nothing of it took effect), so that
    // no later call charges it, and the first charge is refunded.
    let report = f.host.compensate("r").await.expect("compensate");
    assert_eq!(report.state, SagaState::Done, "{report:?}");
    let actions: Vec<(&str, &str)> = report.steps.iter().map(|s| (s.step_id.as_str(), s.action)).collect();
    assert_eq!(actions, [("2-pay", "abandoned"), ("1-pay", "compensated")], "{report:?}");
    assert_eq!(f.provider.counts("o-1").refunds, 1);
    let again = f.call("r", "2-pay", "charge", &charge("o-2")).await;
    assert_eq!((again.status, again.replayed), (Status::Failed, true), "{again:?}");
    assert_eq!(f.provider.counts("o-2").payments, 0);
    assert_eq!(f.provider.counts("o-2").refunds, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_left_by_a_killed_process_does_not_block_compensation_forever() {
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let dir = tempfile::tempdir().expect("dir");
    let (tools, policy) = tools_dir(dir.path(), &provider);
    let ledger = dir.path().join("l.redb");
    let ledger_arg = ledger.to_str().expect("utf8");
    let pay = |step: &'static str, order: &str| {
        let args = charge(order).to_string();
        let flags = ["call", "--ledger", ledger_arg, "--policy", &policy, "--run", "r", "--step", step];
        let mut flags: Vec<String> = flags.iter().map(|s| s.to_string()).collect();
        flags.extend([oncebox_artifacts::CHARGE.to_string(), args]);
        flags
    };
    let first = pay("1-pay", "o-1");
    let (code, paid, stderr) = crate::support::oncebox(&first.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!((code, paid["status"].as_str()), (0, Some("completed")), "{paid} {stderr}");

    // The second charge is rate limited for 30 s: its first attempt is recorded, and the process
    // waits to try again. It is killed meanwhile, holding the step.
    provider.arm(Fault::new(Route::Payments, FaultKind::RateLimit { retry_after_ms: 30_000 }).for_order("o-2"));
    let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("compile-cache");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_oncebox"))
        .args(pay("2-pay", "o-2"))
        .env("ONCEBOX_CACHE", &cache)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    crate::support::eventually("the second charge was refused for now", || provider.requests() >= 2).await;
    // Its attempt is recorded right after the answer.
    tokio::time::sleep(Duration::from_millis(500)).await;
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    let (_, recovered, _) = crate::support::oncebox(&["recover", "--ledger", ledger_arg]);
    assert_eq!(recovered["runs"]["r"]["available"][0]["step_id"], "2-pay", "left claimed: {recovered}");
    let next = recovered["runs"]["r"]["available"][0]["next"].as_str().unwrap_or_default();
    assert!(next.contains("takes it over") && next.contains("oncebox compensate"), "recover names what to do: {next}");

    // Compensating takes the abandoned step over and ends it (nothing of it took effect), then
    // refunds the first charge, once.
    let compensate = ["compensate", "--ledger", ledger_arg, "--run", "r", "--tools", &tools, "--policy", &policy];
    let (code, report, stderr) = crate::support::oncebox(&compensate);
    assert_eq!((code, report["state"].as_str()), (0, Some("done")), "{report} {stderr}");
    assert_eq!(report["steps"][0]["step_id"], "2-pay", "{report}");
    assert_eq!(report["steps"][0]["action"], "abandoned", "{report}");
    assert_eq!(report["steps"][1]["action"], "compensated", "{report}");
    assert_eq!(provider.counts("o-1").refunds, 1);
    // The orchestrator's retry of the abandoned step charges nothing after its run was undone.
    provider.clear_faults();
    let second = pay("2-pay", "o-2");
    let (code, again, _) = crate::support::oncebox(&second.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(
        (code, again["status"].as_str(), again["replayed"].as_bool()),
        (1, Some("failed"), Some(true)),
        "{again}"
    );
    assert_eq!(provider.counts("o-2").payments, 0);
    let (code, _, _) = crate::support::oncebox(&compensate);
    assert_eq!(code, 0);
    assert_eq!(provider.counts("o-1").refunds, 1);
}
