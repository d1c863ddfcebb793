//! Decisions racing calls: a rejection and a claim never both win. A step answered `rejected`
//! had nothing dispatched, and a rejection that was accepted was not outrun by a shipment;
//! counted at the example provider.

use oncebox::{Call, Decision, Status};
use serde_json::json;

use crate::support::Fixture;

const ROUNDS: usize = 400;

fn ship(n: usize) -> Call {
    let args =
        json!({"order_id": format!("race-{n}"), "address": "1 Main St", "items": [{"sku": "sku-1", "quantity": 1}]});
    Call::step("race", format!("ship-{n}"), "fulfill", args.to_string())
}

/// Approved, then a call and a rejection at once, on many threads, many times.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rejection_and_a_call_under_an_approval_never_both_win() {
    let f = Fixture::new().await;
    f.provider.set_stock("sku-1", 100_000);
    let (mut shipped, mut rejected) = (0, 0);
    for n in 0..ROUNDS {
        let first = f.host.call(ship(n)).await.expect("call");
        assert_eq!(first.status, Status::AwaitingApproval, "{first:?}");
        let (key, fingerprint) = (first.operation_key.clone().expect("key"), first.fingerprint.clone().expect("fp"));
        let approve = Decision::Approve { expires_ms: None };
        f.host.decide(&key, &fingerprint, approve, "ops", None).await.expect("approve");

        let (host, call) = (f.host.clone(), ship(n));
        let calling = tokio::spawn(async move { host.call(call).await });
        let (host, k, fp) = (f.host.clone(), key.clone(), fingerprint.clone());
        let rejecting = tokio::spawn(async move { host.decide(&k, &fp, Decision::Reject, "ops", None).await });
        let (called, decided) = (calling.await.expect("task"), rejecting.await.expect("task"));
        let called = called.expect("the call runs");
        f.provider.settled().await;
        let count = f.provider.counts(&format!("race-{n}")).fulfillments;
        match decided {
            Ok(_) => {
                rejected += 1;
                assert_ne!(called.status, Status::Completed, "round {n}: rejected, yet shipped: {called:?}");
                assert_eq!(count, 0, "round {n}: `reject` said nothing is ever dispatched; the provider shipped");
                let after = f.host.call(ship(n)).await.expect("call");
                assert_eq!(after.status, Status::Rejected, "round {n}: {after:?}");
            }
            Err(refused) => {
                shipped += 1;
                let why = refused.to_string();
                assert!(why.contains("started meanwhile") || why.contains("already ran"), "round {n}: {why}");
                assert_eq!(called.status, Status::Completed, "round {n}: {called:?}");
                assert_eq!(count, 1, "round {n}: shipped once");
            }
        }
        assert!(count <= 1);
    }
    eprintln!("{ROUNDS} rounds: {shipped} shipped, {rejected} rejected");
    assert_eq!(shipped + rejected, ROUNDS);
}

/// Pending: an approval, a call and a rejection at once. Whatever wins, the record and the
/// provider agree: rejected and nothing shipped, or shipped once under the approval.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn approve_call_and_reject_at_once_leave_the_record_and_the_provider_agreeing() {
    let f = Fixture::new().await;
    f.provider.set_stock("sku-1", 100_000);
    for n in 0..ROUNDS {
        let first = f.host.call(ship(n)).await.expect("call");
        let (key, fingerprint) = (first.operation_key.clone().expect("key"), first.fingerprint.clone().expect("fp"));
        let (host, k, fp) = (f.host.clone(), key.clone(), fingerprint.clone());
        let approving =
            tokio::spawn(
                async move { host.decide(&k, &fp, Decision::Approve { expires_ms: None }, "alice", None).await },
            );
        let (host, call) = (f.host.clone(), ship(n));
        let calling = tokio::spawn(async move { host.call(call).await });
        let (host, k, fp) = (f.host.clone(), key.clone(), fingerprint.clone());
        let rejecting = tokio::spawn(async move { host.decide(&k, &fp, Decision::Reject, "bob", None).await });
        let _ = approving.await.expect("task");
        let called = calling.await.expect("task").expect("the call runs");
        let rejected = rejecting.await.expect("task").is_ok();
        f.provider.settled().await;
        let count = f.provider.counts(&format!("race-{n}")).fulfillments;
        if called.status == Status::Rejected || rejected {
            // Once `reject` said so, no later call ships either.
            let after = f.host.call(ship(n)).await.expect("call");
            assert_eq!(count, 0, "round {n}: rejected ({called:?}), yet shipped");
            assert_ne!(after.status, Status::Completed, "round {n}: {after:?}");
        } else {
            assert!(count <= 1, "round {n}: shipped {count} times");
        }
        let record = f.host.ledger().approval(&key).await.expect("read").expect("request");
        if count == 1 {
            assert_eq!(record.state, oncebox::ledger::ApprovalState::Approved, "round {n}: shipped under {record:?}");
        }
    }
}
