//! Each invariant, on a history made by hand: one that keeps it, one that breaks it.

use super::*;
use crate::history::Entry;
use serde_json::json;

fn op(tool: &str, order: &str, status: &str, output: Option<Value>) -> OperationRecord {
    let record = json!({
        "key": format!("key-{tool}-{order}"), "run_id": "run-1", "step_id": format!("s-{tool}"), "tool": tool,
        "class": "compensatable", "fingerprint": "f", "args": {"order_id": order}, "status": status,
        "owner": "o", "lease_until_ms": 0, "fence": 1, "attempts": 1,
        "output": output.map(|o| o.to_string()), "error": null, "created_ms": 0, "updated_ms": 0,
    });
    serde_json::from_value(record).expect("an operation record")
}

fn commit(route: &str, order: &str, id: &str) -> Commit {
    Commit { route: route.into(), order: order.into(), key: format!("k-{id}"), response: json!({"id": id}), at_ms: 0 }
}

fn request(route: &str, order: &str, body: Value) -> Request {
    Request { route: route.into(), order: order.into(), key: "k".into(), body, nth: 1, answer: None, at_ms: 0 }
}

fn entry(event: Event) -> Entry {
    Entry { at_ms: 0, life: 0, event }
}

fn called(status: Status, key: &str, output: Option<Value>) -> Event {
    Event::Called {
        caller: "caller 0".into(),
        run: "run-1".into(),
        step: "s-charge".into(),
        tool: "charge".into(),
        order: Some("o-1".into()),
        status,
        replayed: false,
        operation_key: Some(key.into()),
        output,
        error: None,
    }
}

/// A person's decision on run-1's fulfill step, of `params`, for `component`.
fn decided(approve: bool, params: Value, component: &str, result: &str) -> Entry {
    entry(Event::Decided {
        run: "run-1".into(),
        step: "s-fulfill".into(),
        approve,
        params,
        component: Some(component.into()),
        result: result.into(),
    })
}

fn names(facts: &Facts) -> Vec<&'static str> {
    check(facts).into_iter().map(|v| v.invariant).collect()
}

#[test]
fn a_completed_charge_committed_once_and_acknowledged_is_clean() {
    let output = json!({"id": "pay_1"});
    let facts = Facts {
        commits: vec![commit("payments", "o-1", "pay_1")],
        operations: vec![op("charge", "o-1", "completed", Some(output.clone()))],
        history: vec![entry(called(Status::Completed, "key-charge-o-1", Some(output)))],
        ..Facts::default()
    };
    assert_eq!(names(&facts), Vec::<&str>::new());
}

#[test]
fn a_second_commit_for_one_operation_is_found() {
    let facts = Facts {
        commits: vec![commit("payments", "o-1", "pay_1"), commit("payments", "o-1", "pay_2")],
        ..Facts::default()
    };
    assert_eq!(names(&facts), ["committed-twice"]);
}

#[test]
fn failed_with_a_commit_at_the_downstream_is_found() {
    let facts = Facts {
        commits: vec![commit("payments", "o-1", "pay_1")],
        operations: vec![op("charge", "o-1", "failed", None)],
        ..Facts::default()
    };
    assert_eq!(names(&facts), ["failed-but-committed"]);
}

#[test]
fn completed_without_the_downstream_s_commit_is_found() {
    let facts =
        Facts { operations: vec![op("charge", "o-1", "completed", Some(json!({"id": "pay_9"})))], ..Facts::default() };
    assert_eq!(names(&facts), ["completed-without-effect"]);
}

#[test]
fn a_fulfillment_needs_an_approval_of_its_exact_params_and_component() {
    let body = json!({"order_id": "o-1", "address": "a"});
    let approved = |params: Value, component: &str| decided(true, params, component, "approved");
    let mut facts = Facts {
        requests: vec![request("fulfillments", "o-1", body.clone())],
        fulfill_digest: Some("sha256:1".into()),
        ..Facts::default()
    };
    assert_eq!(names(&facts), ["irreversible-without-approval"]);
    facts.history = vec![approved(json!({"order_id": "o-1", "address": "b"}), "sha256:1")];
    assert_eq!(names(&facts), ["irreversible-without-approval"], "other params");
    facts.history = vec![approved(body.clone(), "sha256:2")];
    assert_eq!(names(&facts), ["irreversible-without-approval"], "another component");
    facts.history = vec![approved(body, "sha256:1")];
    assert_eq!(names(&facts), Vec::<&str>::new());
}

#[test]
fn a_rejection_that_won_beside_a_dispatch_is_found() {
    let body = json!({"order_id": "o-1"});
    let decision = |approve: bool, result: &str| decided(approve, body.clone(), "sha256:1", result);
    let mut facts = Facts {
        requests: vec![request("fulfillments", "o-1", body.clone())],
        fulfill_digest: Some("sha256:1".into()),
        history: vec![decision(true, "approved"), decision(false, "refused: the approval was used")],
        ..Facts::default()
    };
    assert_eq!(names(&facts), Vec::<&str>::new(), "the rejection lost the race");
    facts.history.push(decision(false, "rejected"));
    assert_eq!(names(&facts), ["rejected-but-dispatched"]);
}

#[test]
fn an_acknowledged_answer_that_changed_or_left_the_ledger_is_found() {
    let output = json!({"id": "pay_1"});
    let mut facts = Facts {
        commits: vec![commit("payments", "o-1", "pay_1")],
        history: vec![entry(called(Status::Completed, "key-charge-o-1", Some(output.clone())))],
        ..Facts::default()
    };
    assert_eq!(names(&facts), ["acknowledged-lost"], "no record after the crash");
    facts.collected.insert("key-charge-o-1".into());
    assert_eq!(names(&facts), Vec::<&str>::new(), "gc removed it, leaving a tombstone");
    facts.collected.clear();
    facts.operations = vec![op("charge", "o-1", "completed", Some(output.clone()))];
    facts.history.push(entry(called(Status::Failed, "key-charge-o-1", None)));
    assert_eq!(names(&facts), ["acknowledged-rerun", "acknowledged-changed", "acknowledged-lost"]);
}

#[test]
fn an_acknowledged_operation_run_again_is_found() {
    let output = json!({"id": "pay_1"});
    let again = |replayed: bool| {
        let mut event = called(Status::Completed, "key-charge-o-1", Some(output.clone()));
        if let Event::Called { replayed: r, .. } = &mut event {
            *r = replayed;
        }
        entry(event)
    };
    let mut facts = Facts {
        commits: vec![commit("payments", "o-1", "pay_1")],
        operations: vec![op("charge", "o-1", "completed", Some(output.clone()))],
        history: vec![again(false), again(true)],
        ..Facts::default()
    };
    assert_eq!(names(&facts), Vec::<&str>::new());
    facts.history.push(again(false));
    assert_eq!(names(&facts), ["acknowledged-rerun"]);
}

#[test]
fn a_refund_without_a_charge_and_a_double_release_are_found() {
    let released = Some(json!({"order_id": "o-1", "released": 2}));
    let mut second = op("release", "o-1", "completed", released.clone());
    second.key = "another".into();
    let facts = Facts {
        commits: vec![commit("refunds", "o-1", "ref_1")],
        workflow_orders: ["o-1".to_string()].into(),
        operations: vec![op("release", "o-1", "completed", released), second],
        ..Facts::default()
    };
    assert_eq!(names(&facts), ["compensation-without-effect", "compensated-twice"]);
}

#[test]
fn a_counter_that_disagrees_with_the_reservations_is_found() {
    let facts = Facts {
        reservations: [("o-1".to_string(), ("sku-a".to_string(), 2))].into(),
        reserved: [("sku-a".to_string(), 4)].into(),
        ..Facts::default()
    };
    assert_eq!(names(&facts), ["kv-exactly-once"]);
}

#[test]
fn an_open_operation_its_run_does_not_name_is_stuck() {
    let mut facts = Facts { operations: vec![op("charge", "o-1", "claimed", None)], ..Facts::default() };
    assert_eq!(names(&facts), ["stuck-silently"]);
    facts.named_open.insert("key-charge-o-1".into());
    assert_eq!(names(&facts), Vec::<&str>::new());
}

fn message(seq: u64, order: &str) -> OutboxMessage {
    let record = json!({
        "seq": seq, "effect_key": format!("e-{seq}"), "topic": "email",
        "payload": json!({"order_id": order}).to_string(), "enqueued_ms": 0,
    });
    serde_json::from_value(record).expect("an outbox message")
}

fn delivery(seq: u64) -> Delivery {
    Delivery { key: format!("e-{seq}"), order: String::new(), at_ms: 0 }
}

#[test]
fn outbox_messages_reach_their_endpoint_in_order_and_none_is_lost() {
    let mut notified = op("notify", "o-1", "completed", None);
    notified.key = "n1".into();
    let mut other = op("notify", "o-2", "completed", None);
    other.key = "n2".into();
    let mut facts = Facts {
        operations: vec![notified, other],
        outbox: vec![message(1, "o-1"), message(2, "o-2")],
        deliveries: vec![delivery(1), delivery(1), delivery(2), delivery(2)],
        ..Facts::default()
    };
    assert_eq!(names(&facts), Vec::<&str>::new(), "the latest again after a lost answer is fine");
    facts.deliveries = vec![delivery(2), delivery(1)];
    assert_eq!(names(&facts), ["outbox-out-of-order"]);
    facts.deliveries = vec![delivery(1)];
    assert_eq!(names(&facts), ["outbox-lost"]);
}

#[test]
fn a_compensation_that_said_done_while_a_step_was_running_is_found() {
    let output = json!({"id": "pay_1"});
    let done = entry(Event::Compensated { run: "run-1".into(), by: "operator".into(), result: "Done []".into() });
    let mut facts = Facts {
        commits: vec![commit("payments", "o-1", "pay_1")],
        operations: vec![op("charge", "o-1", "completed", Some(output.clone()))],
        history: vec![entry(called(Status::Completed, "key-charge-o-1", Some(output))), done],
        workflow_orders: ["o-1".to_string()].into(),
        ..Facts::default()
    };
    assert_eq!(names(&facts), ["compensation-incomplete"], "a payment stands");
    facts.commits.push(commit("refunds", "o-1", "ref_1"));
    assert_eq!(names(&facts), Vec::<&str>::new());
    facts.reservations.insert("o-1".into(), ("sku-a".into(), 1));
    facts.reserved.insert("sku-a".into(), 1);
    assert_eq!(names(&facts), ["compensation-incomplete"], "a reservation is held");
}

#[test]
fn an_approval_made_after_the_request_left_does_not_count() {
    let body = json!({"order_id": "o-1"});
    let approved = decided(true, body.clone(), "sha256:1", "approved");
    let sent =
        entry(Event::Dispatch { route: "fulfillments".into(), order: "o-1".into(), nth: 1, answer: "Ok".into() });
    let mut facts = Facts {
        requests: vec![request("fulfillments", "o-1", body)],
        fulfill_digest: Some("sha256:1".into()),
        history: vec![sent.clone(), approved.clone()],
        ..Facts::default()
    };
    assert_eq!(names(&facts), ["irreversible-without-approval"]);
    facts.history = vec![approved, sent];
    assert_eq!(names(&facts), Vec::<&str>::new());
}

#[test]
fn a_failed_reserve_that_left_its_reservation_is_found() {
    let facts = Facts {
        operations: vec![op("reserve", "o-1", "failed", None)],
        reservations: [("o-1".to_string(), ("sku-a".to_string(), 1))].into(),
        reserved: [("sku-a".to_string(), 1)].into(),
        ..Facts::default()
    };
    assert_eq!(names(&facts), ["failed-but-committed"]);
}

#[test]
fn a_compensation_left_waiting_on_abandoned_claims_is_found() {
    let open = |why: Why| Open { step_id: "3-charge".into(), tool: "charge".into(), operation_key: "k".into(), why };
    let abandoned = Why::Abandoned { owner: "gone".into(), lease_until_ms: 0, recorded: true };
    let mut facts = Facts {
        compensating: ["run-1".to_string()].into(),
        open: [("run-1".to_string(), vec![open(abandoned)])].into(),
        ..Facts::default()
    };
    assert_eq!(names(&facts), ["compensation-stalled"]);
    facts.open = [("run-1".to_string(), vec![open(Why::Unknown)])].into();
    assert_eq!(names(&facts), Vec::<&str>::new(), "an unknown step waits for an answer, rightly");
}

#[test]
fn an_irreversible_request_sent_twice_is_found() {
    let body = json!({"order_id": "o-1"});
    let approved = decided(true, body.clone(), "sha256:1", "approved");
    let mut facts = Facts {
        requests: vec![request("fulfillments", "o-1", body.clone())],
        fulfill_digest: Some("sha256:1".into()),
        operations: vec![op("fulfill", "o-1", "failed", None)],
        history: vec![approved],
        ..Facts::default()
    };
    assert_eq!(names(&facts), Vec::<&str>::new());
    // A refused connection under another step's key sent nothing: a new step, a new approval.
    let mut refused = request("fulfillments", "o-1", body.clone());
    refused.answer = Some(crate::plan::Answer::NotConnected);
    refused.key = "an earlier step's".into();
    facts.requests.insert(0, refused);
    assert_eq!(names(&facts), Vec::<&str>::new(), "a refused connection sent nothing");
    let mut second = request("fulfillments", "o-1", body);
    second.key = "another step's".into();
    facts.requests.push(second);
    assert_eq!(names(&facts), ["irreversible-sent-twice"]);
}

#[test]
fn an_irreversible_request_sent_again_under_its_key_after_a_refused_connection_is_found() {
    let body = json!({"order_id": "o-1"});
    let approved = decided(true, body.clone(), "sha256:1", "approved");
    let mut refused = request("fulfillments", "o-1", body.clone());
    refused.answer = Some(crate::plan::Answer::NotConnected);
    let facts = Facts {
        requests: vec![refused, request("fulfillments", "o-1", body)],
        fulfill_digest: Some("sha256:1".into()),
        operations: vec![op("fulfill", "o-1", "failed", None)],
        history: vec![approved],
        ..Facts::default()
    };
    assert_eq!(names(&facts), ["irreversible-resent"]);
}

#[test]
fn a_completed_notify_enqueues_exactly_one_message() {
    let facts = Facts { operations: vec![op("notify", "o-1", "completed", None)], ..Facts::default() };
    assert_eq!(names(&facts), ["outbox"]);
}

#[test]
fn what_a_resumed_owner_did_after_a_take_over_is_found() {
    let breach = |what| Breach {
        run: "run-1".into(),
        step: "s-charge".into(),
        order: Some("o-1".into()),
        what,
        detail: "after fence 2 took it over".into(),
    };
    let facts = Facts { breaches: vec![breach("wrote"), breach("sent")], ..Facts::default() };
    assert_eq!(names(&facts), ["taken-over-owner-wrote", "taken-over-owner-sent"]);
}

#[test]
fn gc_removing_a_step_of_a_run_still_open_is_found() {
    let stone = Tombstone {
        operation_key: "key-charge-o-1".into(),
        run_id: "run-1".into(),
        step_id: "s-charge".into(),
        tool: "charge".into(),
        fingerprint: "f".into(),
        status: OperationStatus::Completed,
        ended_ms: 0,
        removed_ms: 10,
        rejected: false,
        class: None,
    };
    // Its run's other step, begun before the removal, still unknown: the run was open.
    let mut fulfill = op("fulfill", "o-1", "unknown", None);
    fulfill.created_ms = 5;
    let facts = Facts { tombstones: vec![stone.clone()], operations: vec![fulfill.clone()], ..Facts::default() };
    assert!(names(&facts).contains(&"collected-while-open"));
    // Ended before the removal: the run was over.
    fulfill.status = OperationStatus::Failed;
    fulfill.updated_ms = 8;
    let facts = Facts { tombstones: vec![stone.clone()], operations: vec![fulfill], ..Facts::default() };
    assert_eq!(names(&facts), Vec::<&str>::new());
    // Inside its retention.
    let facts = Facts { tombstones: vec![stone], gc_retention_ms: 60_000, ..Facts::default() };
    assert_eq!(names(&facts), ["collected-too-soon"]);
}

fn tombstone(tool: &str, removed_ms: u64, rejected: bool) -> Tombstone {
    Tombstone {
        operation_key: format!("key-{tool}-o-1"),
        run_id: "run-1".into(),
        step_id: format!("s-{tool}"),
        tool: tool.into(),
        fingerprint: "f".into(),
        status: if rejected { OperationStatus::Failed } else { OperationStatus::Completed },
        ended_ms: 0,
        removed_ms,
        rejected,
        class: None,
    }
}

#[test]
fn gc_excuses_a_fulfillment_without_a_known_approval_only_by_the_record_it_removed_after_the_send() {
    let sent = Request { at_ms: 100, ..request("fulfillments", "o-1", json!({"order_id": "o-1"})) };
    let mut facts = Facts {
        requests: vec![sent],
        fulfill_digest: Some("sha256:1".into()),
        tombstones: vec![tombstone("fulfill", 200, false)],
        ..Facts::default()
    };
    let unapproved = |facts: &Facts| names(facts).contains(&"irreversible-without-approval");
    assert!(!unapproved(&facts), "its approval may have gone with the operation gc removed");
    facts.tombstones = vec![tombstone("fulfill", 200, true)];
    assert!(unapproved(&facts), "a rejected request's tombstone: nothing ran under it");
    facts.tombstones = vec![tombstone("fulfill", 50, false)];
    assert!(unapproved(&facts), "removed before the request left: not what let it leave");
}

#[test]
fn a_compensation_that_said_done_while_a_payment_stands_is_found_whatever_gc_removed() {
    let done = Entry {
        at_ms: 100,
        life: 0,
        event: Event::Compensated { run: "run-1".into(), by: "operator".into(), result: "Done []".into() },
    };
    let mut facts = Facts {
        commits: vec![commit("payments", "o-1", "pay_1")],
        history: vec![entry(called(Status::Completed, "key-charge-o-1", Some(json!({"id": "pay_1"})))), done],
        workflow_orders: ["o-1".to_string()].into(),
        tombstones: vec![tombstone("charge", 50, false)],
        collected: ["key-charge-o-1".to_string()].into(),
        ..Facts::default()
    };
    // The saga names a step whose record gc removed (undo by hand) instead of saying done: a
    // `Done` with the payment standing is a broken promise, the charge removed before it or not.
    let incomplete = |facts: &Facts| names(facts).contains(&"compensation-incomplete");
    assert!(incomplete(&facts), "the charge was gone before the saga looked, and it said done");
    facts.tombstones = vec![tombstone("charge", 200, false)];
    assert!(incomplete(&facts), "removed after the saga said done: it was there to undo");
    facts.tombstones = vec![tombstone("reserve", 50, false)];
    assert!(incomplete(&facts), "another step's removal explains no standing payment");
}

#[test]
fn a_step_undone_by_two_operations_is_found_on_record_or_removed() {
    let compensation = |tool: &str, key: &str| {
        let mut undo = op(tool, "o-1", "completed", None);
        (undo.key, undo.step_id) =
            (key.into(), format!("{}key-charge-o-1", oncebox_runtime::saga::COMPENSATION_PREFIX));
        undo
    };
    let refund = compensation("release", "undo-1");
    let word = compensation(oncebox_runtime::keys::BY_HAND, "word-1");
    // One compensation, read both on record and as its tombstone: undone once.
    let mut facts = Facts {
        operations: vec![refund.clone()],
        tombstones: vec![oncebox_runtime::ledger::Tombstone::of(&refund, 9)],
        ..Facts::default()
    };
    assert_eq!(names(&facts), Vec::<&str>::new());
    // A person's word beside it, kept or removed: undone twice.
    facts.operations.push(word.clone());
    assert_eq!(names(&facts), ["undone-twice"]);
    facts.operations.pop();
    facts.tombstones.push(oncebox_runtime::ledger::Tombstone::of(&word, 9));
    assert_eq!(names(&facts), ["undone-twice"]);
}
