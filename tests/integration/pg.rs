//! The PostgreSQL ledger's own tests: what only a store shared between processes has to get right
//! (hosts racing on one key, connecting together, a schema of another version, a server that is
//! not there).
//!
//! The throwaway cluster they run on (started on first use, once per test process, stopped when
//! it is gone) is `oncebox-pg-cluster`'s, shared with the bench. Each test gets a database of its
//! own ([`fresh_database`]).

use std::time::{Duration, Instant};

pub use oncebox_pg_cluster::fresh_database;

use oncebox::ReplayClass;
use oncebox::ledger::postgres::PostgresStore;
use oncebox::ledger::{ApprovalRecord, ApprovalState, Claim, ClaimRequest, Ledger, LedgerError, Store};

fn request(key: &str, owner: &str, now_ms: u64) -> ClaimRequest {
    ClaimRequest {
        key: key.into(),
        run_id: "run".into(),
        step_id: key.into(),
        tool: "fulfill".into(),
        class: ReplayClass::Irreversible,
        fingerprint: "args".into(),
        older_fingerprints: Vec::new(),
        args: serde_json::Value::Null,
        owner: owner.into(),
        now_ms,
        lease_ms: 100,
        approval: None,
    }
}

fn approval(key: &str, revision: u32, state: ApprovalState) -> ApprovalRecord {
    ApprovalRecord {
        operation_key: key.into(),
        fingerprint: "args".into(),
        component: Some("sha256:aaaa".into()),
        run_id: "run".into(),
        step_id: key.into(),
        tool: "fulfill".into(),
        description: "Ships".into(),
        consequence: None,
        args: serde_json::Value::Null,
        sealed: None,
        requested_ms: 1,
        state,
        decided_by: None,
        decided_ms: None,
        note: None,
        expires_ms: None,
        revision,
    }
}

#[tokio::test]
async fn a_store_is_named_by_its_url_without_the_password() {
    let url = fresh_database().await;
    let with_password = url.replacen("postgres@", "postgres:hunter2@", 1);
    let store = PostgresStore::connect(&with_password).await.expect("connect (trust ignores the password)");
    let name = Store::name(&store).display().to_string();
    assert_eq!(name, url);
}

#[tokio::test]
async fn a_server_that_is_not_there_is_an_error_naming_the_store_in_one_line() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port").port();
    let url = format!("postgres://alice:hunter2@127.0.0.1:{port}/ledger");
    let error = Ledger::connect(&url).await.expect_err("nothing listens there").to_string();
    assert!(error.contains(&format!("postgres://alice@127.0.0.1:{port}/ledger")), "{error}");
    assert!(error.contains("cannot connect") && !error.contains("hunter2") && !error.contains('\n'), "{error}");
}

#[tokio::test]
async fn a_database_of_another_schema_version_is_refused_naming_both() {
    let url = fresh_database().await;
    drop(Ledger::connect(&url).await.expect("create the schema"));
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("connect");
    let connection = tokio::spawn(connection);
    client.batch_execute("UPDATE oncebox_meta SET value = 99 WHERE name = 'schema_version'").await.expect("update");
    drop(client);
    let _ = connection.await;
    let error = Ledger::connect(&url).await.expect_err("another version");
    assert!(error.is_unusable_ledger(), "{error:?}");
    let message = error.to_string();
    assert!(message.contains("schema version 99") && message.contains("version 1"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hosts_connecting_together_make_one_schema() {
    let url = fresh_database().await;
    let hosts = (0..4).map(|_| {
        let url = url.clone();
        tokio::spawn(async move { Ledger::connect(&url).await })
    });
    for host in hosts {
        host.await.expect("join").expect("every host connects");
    }
}

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

/// An attempt that ends `op` with one KV write of `value` to `key` (`expected`: the version it read).
fn kv_attempt(
    op: &str,
    fence: u64,
    (namespace, key): (&str, &str),
    expected: Option<u64>,
) -> (oncebox::ledger::AttemptRecord, oncebox::ledger::Staged) {
    use oncebox::ledger::{EffectStatus, LocalWrite};
    // The conformance suite's records: attempt 1 under `fence`, and a completed effect (a KV set).
    let attempt = crate::conformance::attempt(op, 1, fence);
    let mut effect = crate::conformance::effect(op, 1, EffectStatus::Completed, 1);
    effect.kind = "kv-set".into();
    effect.target = namespace.into();
    let write =
        LocalWrite::KvSet { namespace: namespace.into(), key: key.into(), value: op.as_bytes().to_vec(), expected };
    (attempt, vec![(effect, write)])
}

/// Claims `ops` one after another and answers their fences.
async fn claimed(ledger: &Ledger, ops: &[String]) -> Vec<u64> {
    let mut fences = Vec::new();
    for op in ops {
        match ledger.claim(&request(op, "a", 1_000)).await.expect("claim") {
            Claim::Owned { fence, .. } => fences.push(fence),
            other => panic!("{op}: {other:?}"),
        }
    }
    fences
}

/// Ends each op of `ops` at once (one task each) with a KV write to the key `key_of` names, and
/// answers every result in order.
async fn end_at_once(
    ledger: &Ledger,
    ops: &[String],
    fences: &[u64],
    key_of: impl Fn(usize) -> (String, String, Option<u64>),
) -> Vec<Result<(), LedgerError>> {
    let tasks: Vec<_> = ops
        .iter()
        .zip(fences)
        .enumerate()
        .map(|(n, (op, fence))| {
            let (ledger, op, fence, (namespace, key, expected)) = (ledger.clone(), op.clone(), *fence, key_of(n));
            tokio::spawn(async move {
                let (attempt, staged) = kv_attempt(&op, fence, (&namespace, &key), expected);
                let finish = Some((oncebox::ledger::OperationStatus::Completed, Some("{}".into()), None));
                ledger.record_attempt(fence, &attempt, finish, 1_001, staged).await
            })
        })
        .collect();
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.expect("join"));
    }
    results
}

/// Many callers' writes share commits (group commit), yet each is decided alone: a write whose
/// versioned KV write lost the race is refused, a stale owner is fenced, and a write the database
/// cannot store fails, each without failing or undoing the others written beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_share_commits_and_one_refusal_fails_only_its_own() {
    let url = fresh_database().await;
    let ledger = Ledger::connect(&url).await.expect("connect");

    // 64 writers at once, half of them versioned writes to keys of their own, half unversioned
    // writes to one key: fewer commits than writes.
    let ops: Vec<String> = (0..64).map(|n| format!("own-{n}")).collect();
    let fences = claimed(&ledger, &ops).await;
    let before = ledger.commits();
    let results = end_at_once(&ledger, &ops, &fences, |n| match n % 2 {
        0 => ("ns".into(), format!("own-{n}"), Some(0)),
        _ => ("ns".into(), "last".into(), None),
    })
    .await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let commits = ledger.commits() - before;
    assert!(commits < 32, "64 writes in {commits} commits: few shared one");
    for n in (0..64).step_by(2) {
        let entry = ledger.kv_entry("ns", &format!("own-{n}")).await.expect("read");
        assert_eq!(entry.map(|(value, _)| value), Some(format!("own-{n}").into_bytes()));
    }
    let last = ledger.kv_entry("ns", "last").await.expect("read").map(|(value, _)| value);
    assert!(last.is_some_and(|value| (1..64).step_by(2).any(|n| value == format!("own-{n}").into_bytes())));

    // 16 writers of one key, each having read it absent, beside 16 of their own keys, a stale
    // owner and a key the database cannot store (text cannot hold a NUL).
    let ops: Vec<String> = (0..34).map(|n| format!("mixed-{n}")).collect();
    let mut fences = claimed(&ledger, &ops).await;
    fences[32] += 1000;
    let results = end_at_once(&ledger, &ops, &fences, |n| match n {
        0..16 => ("ns".into(), "shared".into(), Some(0)),
        16..32 => ("ns".into(), format!("mine-{n}"), Some(0)),
        32 => ("ns".into(), "stale".into(), Some(0)),
        _ => ("ns".into(), "nul\0".into(), None),
    })
    .await;
    let won: Vec<usize> = (0..16).filter(|n| results[*n].is_ok()).collect();
    assert_eq!(won.len(), 1, "one writer of the shared key wins: {results:?}");
    for (n, result) in results[..16].iter().enumerate().filter(|(n, _)| !won.contains(n)) {
        assert!(matches!(result, Err(LedgerError::KvConflict { .. })), "mixed-{n}: {result:?}");
    }
    assert!(results[16..32].iter().all(Result::is_ok), "{:?}", &results[16..32]);
    assert!(matches!(results[32], Err(LedgerError::Fenced { .. })), "{:?}", results[32]);
    assert!(matches!(results[33], Err(LedgerError::Database { .. })), "{:?}", results[33]);
    let winner = format!("mixed-{}", won[0]);
    let shared = ledger.kv_entry("ns", "shared").await.expect("read").map(|(value, _)| value);
    assert_eq!(shared, Some(winner.clone().into_bytes()), "the winner's value, once");
    for n in 0..34 {
        let op = format!("mixed-{n}");
        let recorded = ledger.operation(&op).await.expect("read");
        let ended = recorded.as_ref().map(|op| op.status) == Some(oncebox::ledger::OperationStatus::Completed);
        assert_eq!(ended, op == winner || (16..32).contains(&n), "{op}: {recorded:?}");
    }
    assert_eq!(ledger.kv_entry("ns", "stale").await.expect("read"), None, "the stale owner wrote nothing");
}

/// A group's statements are planned once per connection, perhaps while the tables are near empty,
/// and that plan is kept as they grow: each must find its rows by the tables' keys, or every group
/// reads whole tables (a hash join over a sequential scan, or over a whole index, planned for a
/// table of a few rows). And an operation's row, written again when it ends, is rewritten on its
/// own page (a HOT update, no new index entries). Counted by the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_group_finds_its_rows_by_key_and_rewrites_them_in_place() {
    const FILLER: i64 = 20_000;
    let url = fresh_database().await;
    let ledger = Ledger::connect(&url).await.expect("connect");
    let client = connect(&url).await;
    let rounds = 8;
    for round in 0..rounds {
        let ops: Vec<String> = (0..64).map(|n| format!("r{round}-{n}")).collect();
        let fences = claimed(&ledger, &ops).await;
        // Versioned writes (their versions read by key) to keys of their own: the KV table grows too.
        let results = end_at_once(&ledger, &ops, &fences, |n| ("ns".into(), format!("r{round}-{n}"), Some(0))).await;
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        if round == 0 {
            // The plans are made: now the table is large, as a deployment's becomes.
            let filler = format!(
                "INSERT INTO oncebox_operations (key, run_id, step_id, tool, status, fence, lease_until_ms, recorded, \
                 record) SELECT 'filler-' || n, 'filler', 'filler-' || n, 'fulfill', 'completed', 1, 0, true, '{{}}' \
                 FROM generate_series(1, {FILLER}) AS n"
            );
            client.batch_execute(&filler).await.expect("filler");
        }
    }
    drop(ledger);

    // The server counts a connection's reads when it is idle or closed, within about ten seconds.
    let sql = "SELECT relname::text, n_tup_ins, n_tup_upd, n_tup_upd - n_tup_hot_upd, seq_tup_read, idx_tup_fetch \
               FROM pg_stat_user_tables WHERE relname IN ('oncebox_operations', 'oncebox_kv') ORDER BY relname";
    // (table, rows inserted, rows updated, updates moving a row, rows read by sequential scans, by
    // index scans)
    type Counted = (String, i64, i64, i64, i64, i64);
    let calls = 64 * rounds;
    let deadline = Instant::now() + Duration::from_secs(30);
    let counted: Vec<Counted> = loop {
        let rows = client.query(sql, &[]).await.expect("statistics");
        let counted: Vec<Counted> =
            rows.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5))).collect();
        let written = counted.iter().map(|c| (c.1, c.2)).collect::<Vec<_>>();
        if written == [(calls, 0), (calls + FILLER, calls)] || Instant::now() > deadline {
            break counted;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let [kv, operations] = &counted[..] else { panic!("{counted:?}") };
    assert_eq!((kv.1, kv.2, kv.4), (calls, 0, 0), "the KV table (inserted, updated, read by sequential scans)");
    assert_eq!((operations.1, operations.2), (calls + FILLER, calls), "the operations table (inserted, updated)");
    assert_eq!(operations.3, 0, "updates of an operation that moved its row to another page");
    // A handful of rows per call (the claim's check, the record's lock and rewrite, the foreign
    // keys of its attempt and effect): far fewer than one read of the whole table.
    let read = operations.4 + operations.5;
    assert!(read < FILLER, "{read} rows of the operations table read for {calls} calls: {counted:?}");
}

/// Every host leaves half of each page of the operations table free for the rows' rewrites (see
/// the test above), in a database made before too; a fillfactor an operator set is theirs. A host
/// that cannot have the table's lock soon (a VACUUM holds it) connects without it.
#[tokio::test]
async fn the_operations_table_keeps_room_for_rewrites_unless_an_operator_chose_otherwise() {
    let url = fresh_database().await;
    let client = connect(&url).await;
    let fillfactor = async || -> Vec<String> {
        let sql = "SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = 'oncebox_operations'::regclass";
        client.query_one(sql, &[]).await.expect("reloptions").get(0)
    };
    drop(Ledger::connect(&url).await.expect("connect"));
    assert_eq!(fillfactor().await, ["fillfactor=50"]);
    client.batch_execute("ALTER TABLE oncebox_operations RESET (fillfactor)").await.expect("a database made before");
    client.batch_execute("BEGIN; LOCK TABLE oncebox_operations IN SHARE UPDATE EXCLUSIVE MODE").await.expect("lock");
    let started = Instant::now();
    drop(Ledger::connect(&url).await.expect("connect while the lock is held"));
    assert!(started.elapsed() < Duration::from_secs(10), "waited {:?}", started.elapsed());
    assert_eq!(fillfactor().await, Vec::<String>::new(), "not set while the lock is held");
    client.batch_execute("COMMIT").await.expect("unlock");
    drop(Ledger::connect(&url).await.expect("connect"));
    assert_eq!(fillfactor().await, ["fillfactor=50"]);
    client.batch_execute("ALTER TABLE oncebox_operations SET (fillfactor = 80)").await.expect("an operator's");
    drop(Ledger::connect(&url).await.expect("connect"));
    assert_eq!(fillfactor().await, ["fillfactor=80"]);
}

/// A client of the database at `url`, its connection driven on a task of its own.
async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(connection);
    client
}

/// What a group writes is what its writes one after another would have left: outbox numbers in
/// order without a gap where a refused job stood between two that enqueue, and rows too large for
/// one statement written whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_group_writes_what_its_jobs_would_one_after_another() {
    use oncebox::ledger::{EffectRecord, EffectStatus, LocalWrite, OperationStatus};
    let url = fresh_database().await;
    let ledger = Ledger::connect(&url).await.expect("connect");
    let ops: Vec<String> = (0..24).map(|n| format!("g-{n}")).collect();
    let mut fences = claimed(&ledger, &ops).await;
    fences[1] += 1000;
    let local = |op: &str, n: u32, write: LocalWrite| {
        let (_, mut staged) = kv_attempt(op, 1, ("ns", "unused"), None);
        let (mut effect, _): (EffectRecord, LocalWrite) = staged.remove(0);
        effect.key = format!("{:016x}{op}", 0xf000 + n);
        effect.kind = "outbox".into();
        effect.status = EffectStatus::Completed;
        (effect, write)
    };
    let big = vec![7u8; 7 << 20];
    let tasks: Vec<_> = ops
        .iter()
        .zip(&fences)
        .enumerate()
        .map(|(n, (op, fence))| {
            let (ledger, op, fence) = (ledger.clone(), op.clone(), *fence);
            let staged = match n {
                // Even ones enqueue; the stale owner (1) would, and is fenced.
                n if n % 2 == 0 || n == 1 => {
                    vec![local(&op, 1, LocalWrite::Outbox { topic: "t".into(), payload: op.clone() })]
                }
                // Three values of 7 MiB: more than one statement carries.
                7 | 9 | 11 => vec![local(
                    &op,
                    4,
                    LocalWrite::KvSet { namespace: "big".into(), key: op.clone(), value: big.clone(), expected: None },
                )],
                _ => Vec::new(),
            };
            tokio::spawn(async move {
                let (attempt, _) = kv_attempt(&op, fence, ("ns", "unused"), None);
                let finish = Some((OperationStatus::Completed, Some("{}".into()), None));
                ledger.record_attempt(fence, &attempt, finish, 1_001, staged).await
            })
        })
        .collect();
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.expect("join"));
    }
    assert!(matches!(results[1], Err(LedgerError::Fenced { .. })), "{:?}", results[1]);
    assert!(results.iter().enumerate().all(|(n, r)| n == 1 || r.is_ok()), "{results:?}");
    let outbox = ledger.outbox().await.expect("outbox");
    let seqs: Vec<u64> = outbox.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, (1..=12).collect::<Vec<u64>>(), "twelve messages, numbered without a gap");
    assert!(outbox.iter().all(|m| m.payload != "g-1"), "the fenced job enqueued nothing");
    for n in [7, 9, 11] {
        let entry = ledger.kv_entry("big", &format!("g-{n}")).await.expect("read");
        assert_eq!(entry.map(|(value, _)| value.len()), Some(7 << 20), "g-{n}'s value, whole");
    }
}

/// A lone write waits for a lock another session holds for as long as it is held (a second is
/// only a group's bound), unless the URL bounds it: then it is refused in one line, and nothing
/// of it was written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_write_waits_for_a_lock_as_long_as_it_is_held_unless_the_url_bounds_it() {
    use oncebox::ledger::OperationStatus;
    let url = fresh_database().await;
    let ledger = Ledger::connect(&url).await.expect("connect");
    let ops: Vec<String> = ["held-long", "held-bounded"].map(String::from).into();
    let fences = claimed(&ledger, &ops).await;
    let (other, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("connect");
    let connection = tokio::spawn(connection);
    let hold = |key: &str| format!("BEGIN; SELECT 1 FROM oncebox_operations WHERE key = '{key}' FOR UPDATE");
    let finish = || Some((OperationStatus::Completed, Some("{}".to_string()), None));

    // Held for 1.5 s: the write waits it out, then is recorded.
    other.batch_execute(&hold("held-long")).await.expect("lock the row");
    let (attempt, staged) = kv_attempt("held-long", fences[0], ("ns", "long"), None);
    let writing = {
        let (ledger, fence) = (ledger.clone(), fences[0]);
        tokio::spawn(async move { ledger.record_attempt(fence, &attempt, finish(), 1_001, staged).await })
    };
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(!writing.is_finished(), "the write did not wait for the lock");
    other.batch_execute("COMMIT").await.expect("release the row");
    writing.await.expect("join").expect("the write, once the lock was released");
    let op = ledger.operation("held-long").await.expect("read").expect("recorded");
    assert_eq!(op.status, OperationStatus::Completed);

    // A URL that bounds lock waits to 200 ms: refused, and nothing written.
    let bounded = format!("{url}?options=-c%20lock_timeout%3D200");
    let impatient = Ledger::connect(&bounded).await.expect("connect with a bound");
    other.batch_execute(&hold("held-bounded")).await.expect("lock the row");
    let (attempt, staged) = kv_attempt("held-bounded", fences[1], ("ns", "bounded"), None);
    let refused = impatient.record_attempt(fences[1], &attempt, finish(), 1_001, staged);
    let refused = tokio::time::timeout(Duration::from_secs(5), refused).await.expect("refused within the bound");
    other.batch_execute("COMMIT").await.expect("release the row");
    let error = refused.expect_err("a lock held past the URL's bound").to_string();
    assert!(error.contains("lock timeout") && !error.contains('\n'), "{error}");
    assert_eq!(ledger.attempts("held-bounded").await.expect("read").len(), 0, "nothing of it was written");
    assert_eq!(ledger.kv_entry("ns", "bounded").await.expect("read"), None);
    drop(other);
    let _ = connection.await;
}

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
    let connection = tokio::spawn(connection);
    let key: String =
        client.query_one("SELECT key FROM oncebox_operations", &[]).await.expect("the claim's row").get(0);
    drop(client);
    let _ = connection.await;
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
    let connection = tokio::spawn(connection);
    let rows = client
        .query("SELECT e.operation_key, e.record FROM oncebox_effects e WHERE e.status = 'completed'", &[])
        .await
        .expect("read the answer");
    assert_eq!(rows.len(), 1, "one answered effect");
    let operation_key: String = rows[0].get(0);
    let mut lost: oncebox::ledger::EffectRecord = serde_json::from_slice(rows[0].get(1)).expect("decode");
    drop(client);
    let _ = connection.await;
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

async fn provider() -> oncebox_example_provider::ProviderHandle {
    oncebox_example_provider::Provider::start().await.expect("provider")
}

/// A host on the ledger at `url` (its key file in `dir`), configured as the tests' hosts are for
/// `provider`, and then by `more`, with the example tools loaded.
async fn host_on(
    url: &str,
    dir: &tempfile::TempDir,
    provider: &oncebox_example_provider::ProviderHandle,
    honours_keys: bool,
    more: impl FnOnce(oncebox::HostBuilder) -> oncebox::HostBuilder,
) -> oncebox::Host {
    let builder =
        oncebox::HostBuilder::at(oncebox::LedgerAt::Postgres(url.into())).key_file(dir.path().join("hosts.key"));
    let host = more(crate::support::configure(builder, provider, honours_keys)).build().await.expect("host");
    crate::support::load_all(&host).await;
    host
}

/// Removes operation `key`'s row: what a server crash leaves of a claim that rode and was not
/// flushed.
async fn lose_claim(url: &str, key: &str) {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("connect");
    let connection = tokio::spawn(connection);
    let sql = "DELETE FROM oncebox_operations WHERE key = $1 AND NOT recorded";
    let removed = client.execute(sql, &[&key]).await.expect("lose the claim");
    assert_eq!(removed, 1, "one claim lost");
    drop(client);
    let _ = connection.await;
}

/// Puts effect `ahead` back as it was written ahead, answer and all gone: what a server crash
/// leaves of an answer that rode and was not flushed.
async fn lose_answer(url: &str, ahead: &oncebox::ledger::EffectRecord) {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("connect");
    let connection = tokio::spawn(connection);
    let sql = "UPDATE oncebox_effects SET status = 'dispatched', record = $3 \
               WHERE operation_key = $1 AND effect_key = $2";
    let record = serde_json::to_vec(ahead).expect("encode");
    let reverted = client.execute(sql, &[&ahead.operation_key, &ahead.key, &record]).await.expect("lose the answer");
    assert_eq!(reverted, 1, "one answer lost");
    drop(client);
    let _ = connection.await;
}
