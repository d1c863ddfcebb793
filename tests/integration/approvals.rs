//! Decisions racing calls: a rejection and a claim never both win. A step answered `rejected`
//! had nothing dispatched, and a rejection that was accepted was not outrun by a shipment;
//! counted at the example provider. On a redb file (one host) and on PostgreSQL (the call from
//! one host, the decisions from another).

use oncebox::{Call, Decision, Host, HostBuilder, Status};
use oncebox_example_provider::{Provider, ProviderHandle};
use serde_json::json;

use crate::support::{Fixture, configure, load_all};

const ROUNDS: usize = 400;

fn ship(n: usize) -> Call {
    let args =
        json!({"order_id": format!("race-{n}"), "address": "1 Main St", "items": [{"sku": "sku-1", "quantity": 1}]});
    Call::step("race", format!("ship-{n}"), "fulfill", args.to_string())
}

/// Two hosts on one fresh PostgreSQL database, sharing a key file, with the example tools.
async fn on_postgres(provider: &ProviderHandle, dir: &tempfile::TempDir) -> (Host, Host) {
    let url = crate::pg::fresh_database().await;
    let mut hosts = Vec::new();
    for _ in 0..2 {
        let ledger = oncebox::Ledger::connect(&url).await.expect("connect");
        let builder = HostBuilder::on_ledger(ledger).key_file(dir.path().join("hosts.key"));
        let host = configure(builder, provider, true).build().await.expect("host");
        load_all(&host).await;
        hosts.push(host);
    }
    let b = hosts.pop().expect("b");
    (hosts.pop().expect("a"), b)
}

/// Approved, then a call (on `caller`) and a rejection (on `decider`) at once, many times.
async fn a_rejection_and_a_call_never_both_win(
    caller: &Host,
    decider: &Host,
    provider: &ProviderHandle,
    rounds: usize,
) {
    provider.set_stock("sku-1", 100_000);
    let (mut shipped, mut rejected) = (0, 0);
    for n in 0..rounds {
        let first = caller.call(ship(n)).await.expect("call");
        assert_eq!(first.status, Status::AwaitingApproval, "{first:?}");
        let (key, fingerprint) = (first.operation_key.clone().expect("key"), first.fingerprint.clone().expect("fp"));
        let approve = Decision::Approve { expires_ms: None };
        decider.decide(&key, &fingerprint, approve, "ops", None).await.expect("approve");

        let (host, call) = (caller.clone(), ship(n));
        let calling = tokio::spawn(async move { host.call(call).await });
        let (host, k, fp) = (decider.clone(), key.clone(), fingerprint.clone());
        let rejecting = tokio::spawn(async move { host.decide(&k, &fp, Decision::Reject, "ops", None).await });
        let (called, decided) = (calling.await.expect("task"), rejecting.await.expect("task"));
        let called = called.expect("the call runs");
        provider.settled().await;
        let count = provider.counts(&format!("race-{n}")).fulfillments;
        match decided {
            Ok(_) => {
                rejected += 1;
                assert_ne!(called.status, Status::Completed, "round {n}: rejected, yet shipped: {called:?}");
                assert_eq!(count, 0, "round {n}: `reject` said nothing is ever dispatched; the provider shipped");
                let after = caller.call(ship(n)).await.expect("call");
                assert_eq!(after.status, Status::Rejected, "round {n}: {after:?}");
                // What it shows of the request offers no approval any more.
                let shown = after.approval.as_ref().expect("the request is shown");
                assert_eq!(shown.approve, None, "round {n}: a rejected request offers `approve`: {shown:?}");
            }
            Err(refused) => {
                shipped += 1;
                let why = refused.to_string();
                assert!(why.contains("started meanwhile") || why.contains("already ran"), "round {n}: {why}");
                assert_eq!(called.status, Status::Completed, "round {n}: {called:?}");
                assert_eq!(count, 1, "round {n}: shipped once");
            }
        }
    }
    eprintln!("{rounds} rounds: {shipped} shipped, {rejected} rejected");
    assert_eq!(shipped + rejected, rounds);
}

/// Pending: an approval, a call and a rejection at once. Whatever wins, the record and the
/// provider agree: rejected and nothing shipped, or shipped once under the approval.
async fn approve_call_and_reject_at_once(
    caller: &Host,
    decider: &Host,
    provider: &ProviderHandle,
    steps: std::ops::Range<usize>,
) {
    provider.set_stock("sku-1", 100_000);
    for n in steps {
        let first = caller.call(ship(n)).await.expect("call");
        let (key, fingerprint) = (first.operation_key.clone().expect("key"), first.fingerprint.clone().expect("fp"));
        let (host, k, fp) = (decider.clone(), key.clone(), fingerprint.clone());
        let approving =
            tokio::spawn(
                async move { host.decide(&k, &fp, Decision::Approve { expires_ms: None }, "alice", None).await },
            );
        let (host, call) = (caller.clone(), ship(n));
        let calling = tokio::spawn(async move { host.call(call).await });
        let (host, k, fp) = (decider.clone(), key.clone(), fingerprint.clone());
        let rejecting = tokio::spawn(async move { host.decide(&k, &fp, Decision::Reject, "bob", None).await });
        let _ = approving.await.expect("task");
        let called = calling.await.expect("task").expect("the call runs");
        let rejected = rejecting.await.expect("task").is_ok();
        provider.settled().await;
        let count = provider.counts(&format!("race-{n}")).fulfillments;
        if called.status == Status::Rejected || rejected {
            // Once `reject` said so, no later call ships either.
            let after = caller.call(ship(n)).await.expect("call");
            assert_eq!(count, 0, "round {n}: rejected ({called:?}), yet shipped");
            assert_ne!(after.status, Status::Completed, "round {n}: {after:?}");
        } else {
            assert!(count <= 1, "round {n}: shipped {count} times");
        }
        let record = caller.ledger().approval(&key).await.expect("read").expect("request");
        if count == 1 {
            assert_eq!(record.state, oncebox::ledger::ApprovalState::Approved, "round {n}: shipped under {record:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_redb_a_rejection_and_a_call_under_an_approval_never_both_win() {
    let f = Fixture::new().await;
    a_rejection_and_a_call_never_both_win(&f.host, &f.host, &f.provider, ROUNDS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_redb_approve_call_and_reject_at_once_leave_the_record_and_the_provider_agreeing() {
    let f = Fixture::new().await;
    approve_call_and_reject_at_once(&f.host, &f.host, &f.provider, 0..ROUNDS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_postgres_a_rejection_on_one_host_and_a_call_on_another_never_both_win() {
    let (provider, dir) = (Provider::start().await.expect("provider"), tempfile::tempdir().expect("dir"));
    let (a, b) = on_postgres(&provider, &dir).await;
    a_rejection_and_a_call_never_both_win(&a, &b, &provider, 100).await;
    approve_call_and_reject_at_once(&a, &b, &provider, 100..200).await;
}

/// Two people deciding one after the other: an approval that stands is not rewritten by a second
/// approval (not who approved, not until when), on one host or across two; a rejection may still
/// withdraw it before it is used, and says whose approval it ended.
async fn a_standing_approval_is_decided_once(first: &Host, second: &Host, provider: &ProviderHandle, n: usize) {
    provider.set_stock("sku-1", 100_000);
    let asked = first.call(ship(n)).await.expect("call");
    let (key, fp) = (asked.operation_key.clone().expect("key"), asked.fingerprint.clone().expect("fp"));
    let until = first.ledger().now_ms() + 3_600_000;
    first.decide(&key, &fp, Decision::Approve { expires_ms: Some(until) }, "carol", None).await.expect("carol");
    for expires_ms in [Some(until - 3_000_000), None] {
        let again = second.decide(&key, &fp, Decision::Approve { expires_ms }, "dave", None).await;
        let why = again.expect_err("a second approval is refused").to_string();
        assert!(why.contains("carol approved it at") && why.contains("it stands"), "{why}");
        assert!(!why.contains("  "), "one line of single spaces: {why}");
    }
    let kept = first.ledger().approval(&key).await.expect("read").expect("request");
    assert_eq!((kept.decided_by.as_deref(), kept.expires_ms), (Some("carol"), Some(until)), "{kept:?}");
    let standing = oncebox::approvals::ApprovalView::of(&kept, first.ledger());
    assert_eq!(standing.approve, None, "a standing approval offers no second one: {standing:?}");

    let withdrawn = second.decide(&key, &fp, Decision::Reject, "erin", Some("wrong address")).await.expect("reject");
    let note = withdrawn.note.clone().unwrap_or_default();
    assert!(note.starts_with("withdrew the approval carol gave at") && note.ends_with(": wrong address"), "{note}");
    let answered = first.call(ship(n)).await.expect("call");
    assert_eq!(answered.status, Status::Rejected, "{answered:?}");
    assert_eq!(provider.counts(&format!("race-{n}")).fulfillments, 0, "nothing shipped");
}

#[tokio::test]
async fn on_redb_a_standing_approval_is_not_rewritten_and_a_withdrawal_names_it() {
    let f = Fixture::new().await;
    a_standing_approval_is_decided_once(&f.host, &f.host, &f.provider, 0).await;
}

#[tokio::test]
async fn on_postgres_a_standing_approval_is_not_rewritten_from_another_host() {
    let (provider, dir) = (Provider::start().await.expect("provider"), tempfile::tempdir().expect("dir"));
    let (a, b) = on_postgres(&provider, &dir).await;
    a_standing_approval_is_decided_once(&a, &b, &provider, 0).await;
}

/// An approval not used before it expired is approved again, by the command the call hands back.
#[tokio::test]
async fn an_expired_approval_hands_back_the_command_that_approves_it_again() {
    let f = Fixture::new().await;
    f.provider.set_stock("sku-1", 100);
    let asked = f.host.call(ship(7)).await.expect("call");
    let (key, fp) = (asked.operation_key.clone().expect("key"), asked.fingerprint.clone().expect("fp"));
    let soon = f.host.ledger().now_ms() + 50;
    f.host.decide(&key, &fp, Decision::Approve { expires_ms: Some(soon) }, "carol", None).await.expect("approve");
    tokio::time::sleep(std::time::Duration::from_millis(120)).await;
    let expired = f.host.call(ship(7)).await.expect("call");
    assert_eq!(expired.status, Status::AwaitingApproval, "{expired:?}");
    let shown = expired.approval.as_ref().expect("the request is shown");
    assert!(shown.approve.as_deref().is_some_and(|c| c.contains(&fp)), "approve it again: {shown:?}");
    assert_eq!(f.provider.counts("race-7").fulfillments, 0);
}
