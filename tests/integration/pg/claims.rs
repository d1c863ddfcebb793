//! Claims from several hosts: one owner however they race, the claim held by the database and
//! not by a host, a waiter woken by another host's end, a dropped connection failing one call at
//! most.

use std::time::{Duration, Instant};

use oncebox::ledger::{ApprovalState, Claim, ClaimRequest, Ledger, LedgerError};

use super::{approval, fresh_database, request};

/// Two hosts (two pools: to the database, two processes) claim the same keys at once: exactly
/// one of them owns each, and a take-over after the lease has a fence neither held.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hosts_racing_for_one_operation_never_both_own_it() {
    let url = fresh_database().await;
    let (a, b) = (Ledger::connect(&url).await.expect("a"), Ledger::connect(&url).await.expect("b"));
    for n in 0..20 {
        let key = format!("op-{n}");
        let (ra, rb) = (request(&key, "a", 1_000), request(&key, "b", 1_000));
        let (first, second) = tokio::join!(a.claim(&ra), b.claim(&rb));
        let owners: Vec<u64> = [first.expect("a claims"), second.expect("b claims")]
            .into_iter()
            .filter_map(|claim| match claim {
                Claim::Owned { fence, .. } => Some(fence),
                Claim::InProgress(_) => None,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(owners, [1], "{key}: exactly one owner, with fence 1");
        let (ra, rb) = (request(&key, "a", 2_000), request(&key, "b", 2_000));
        let (first, second) = tokio::join!(a.claim(&ra), b.claim(&rb));
        let fences: Vec<u64> = [first.expect("a"), second.expect("b")]
            .into_iter()
            .filter_map(|claim| if let Claim::Owned { fence, .. } = claim { Some(fence) } else { None })
            .collect();
        assert!(matches!(fences.as_slice(), [fence] if *fence > 1), "{key}: one take-over: {fences:?}");
    }
}

/// A decision on an approval and a claim under it, from two hosts at once: never both, and the
/// claim that wins is durable before the decision is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_approval_decision_and_a_claim_from_two_hosts_never_both_win() {
    let url = fresh_database().await;
    let (a, b) = (Ledger::connect(&url).await.expect("a"), Ledger::connect(&url).await.expect("b"));
    let (mut claimed, mut rejected) = (0, 0);
    for n in 0..20 {
        let key = format!("op-{n}");
        a.put_approval(&approval(&key, 1, ApprovalState::Approved)).await.expect("approve");
        let seen = oncebox::ledger::SeenApproval { revision: 1, component: "sha256:aaaa".into() };
        let req = ClaimRequest { approval: Some(seen), ..request(&key, "a", 1_000) };
        let reject = approval(&key, 2, ApprovalState::Rejected);
        let before = a.commits();
        let (claim, decision) = tokio::join!(a.claim(&req), b.put_approval(&reject));
        match (claim.expect("claim"), decision) {
            (Claim::Owned { .. }, Err(LedgerError::ApprovalClosed { .. })) => {
                // Flushed before it is answered, unlike a claim with no approval: the decision it
                // refused must not be refused on a claim a server crash could take back.
                assert_eq!(a.commits() - before, 1, "{key}: the claim under an approval waits for its flush");
                claimed += 1;
            }
            (Claim::ApprovalChanged, Ok(())) => rejected += 1,
            other => panic!("{key}: both or neither won: {other:?}"),
        }
    }
    assert_eq!(claimed + rejected, 20);
}

/// What one host claimed, another sees at once, and a host that reconnects still does: the
/// claim lives in the database, not in the memory of the host that made it.
#[tokio::test]
async fn a_claim_is_the_databases_not_a_hosts() {
    let url = fresh_database().await;
    let a = Ledger::connect(&url).await.expect("a");
    let Claim::Owned { fence, .. } = a.claim(&request("op", "a", 1_000)).await.expect("claim") else {
        panic!("a owns it")
    };
    drop(a);
    let b = Ledger::connect(&url).await.expect("b");
    assert!(matches!(b.claim(&request("op", "b", 1_050)).await, Ok(Claim::InProgress(_))));
    assert!(matches!(
        b.put_approval(&approval("op", 1, ApprovalState::Pending)).await,
        Err(LedgerError::ApprovalClosed { .. })
    ));
    let Claim::Owned { fence: later, .. } = b.claim(&request("op", "b", 1_200)).await.expect("take over") else {
        panic!("b takes it over")
    };
    assert!(later > fence);
    assert!(b.commits() >= 1);
}

/// A caller waiting for another host's operation is woken when that host records its end
/// (`LISTEN`/`NOTIFY`), not at the end of its wait; a store that cannot tell waits it out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_when_another_host_ends_the_operation() {
    let url = fresh_database().await;
    let (a, b) = (Ledger::connect(&url).await.expect("a"), Ledger::connect(&url).await.expect("b"));
    // b listens before a finishes: its first wait starts the listening connection.
    b.changed("other", Duration::from_millis(10)).await;
    // A waiter looks again after a second anyway (a notification may be lost): woken by the
    // finish means before that. Three rounds, one of which must wake early, so that a loaded
    // machine's slow commit does not fail the test; without NOTIFY none would.
    let mut woken = Vec::new();
    for round in 0..3u64 {
        let key = format!("op-{round}");
        let Claim::Owned { fence, .. } = a.claim(&request(&key, "a", 1_000)).await.expect("claim") else {
            panic!("a owns it")
        };
        let finisher = {
            let (a, key) = (a.clone(), key.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                let attempt = oncebox::ledger::AttemptRecord {
                    operation_key: key.clone(),
                    run_id: "run".into(),
                    step_id: key.clone(),
                    tool: "fulfill".into(),
                    attempt: 1,
                    max_attempts: 1,
                    fence,
                    started_ms: 1_000,
                    duration_us: 0,
                    outcome: "ok".into(),
                    message: None,
                    source: oncebox::ledger::AttemptSource::Fresh,
                    downstream_accepted: None,
                    effects: Vec::new(),
                };
                let finish = Some((oncebox::ledger::OperationStatus::Completed, Some("{}".to_string()), None));
                a.record_attempt(fence, &attempt, finish, 1_001, Vec::new()).await.expect("record");
            })
        };
        let started = Instant::now();
        b.changed(&key, Duration::from_secs(20)).await;
        woken.push(started.elapsed());
        finisher.await.expect("finisher");
        assert!(matches!(b.claim(&request(&key, "b", 1_050)).await, Ok(Claim::Recorded(_))));
    }
    assert!(woken.iter().any(|w| *w < Duration::from_millis(800)), "woken by the finish: {woken:?}");

    // A store that cannot announce polls.
    let reference = Ledger::on(oncebox::ledger::reference::ReferenceStore::new());
    let started = Instant::now();
    reference.changed("op", Duration::from_secs(5)).await;
    assert!(started.elapsed() < Duration::from_secs(5), "the default looks again after its poll");
}

/// The server drops every connection of the ledger (a restart, a failover, an operator): a call
/// made on a dropped connection fails, naming the store in one line, and records nothing; the
/// pool replaces the connection and the next call goes through.
#[tokio::test]
async fn a_dropped_connection_fails_one_call_at_most_and_is_replaced() {
    let url = fresh_database().await;
    let ledger = Ledger::connect(&url).await.expect("connect");
    ledger.claim(&request("first", "a", 1_000)).await.expect("claim");
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("connect");
    let connection = tokio::spawn(connection);
    let terminate = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE datname = current_database() AND pid <> pg_backend_pid()";
    client.batch_execute(terminate).await.expect("terminate");
    drop(client);
    let _ = connection.await;
    let mut failures = Vec::new();
    let owned = loop {
        match ledger.claim(&request("second", "a", 1_000)).await {
            Ok(claim) => break claim,
            Err(e) => failures.push(e.to_string()),
        }
        assert!(failures.len() <= 1, "{failures:#?}");
    };
    assert!(matches!(owned, Claim::Owned { fence: 1, .. }), "nothing of a failed call was recorded: {owned:?}");
    for failure in failures {
        assert!(failure.contains(&url) && !failure.contains('\n'), "{failure}");
    }
}
