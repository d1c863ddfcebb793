//! Group commit: many callers' writes in one transaction, each decided alone; what a group writes
//! is what its jobs one after another would have; its statements find their rows by key.

use std::time::{Duration, Instant};

use oncebox::ledger::{Ledger, LedgerError};

use super::{claimed, connect, fresh_database};

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
    let mut index_pages_before = Vec::new();
    for round in 0..rounds {
        let ops: Vec<String> = (0..64).map(|n| format!("r{round}-{n}")).collect();
        let fences = claimed(&ledger, &ops).await;
        // Versioned writes (their versions read by key) to keys of their own: the KV table grows too.
        let results = end_at_once(&ledger, &ops, &fences, |n| ("ns".into(), format!("r{round}-{n}"), Some(0))).await;
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        if round == 0 {
            // The plans are made: now the table is large, as a deployment's becomes. Written by
            // a session of its own, which reports what it counted when it ends (below).
            let filler_client = connect(&url).await;
            let filler = format!(
                "INSERT INTO oncebox_operations (key, run_id, step_id, tool, status, fence, lease_until_ms, recorded, \
                 record) SELECT 'filler-' || n, 'filler', 'filler-' || n, 'fulfill', 'completed', 1, 0, true, '{{}}' \
                 FROM generate_series(1, {FILLER}) AS n"
            );
            filler_client.batch_execute(&filler).await.expect("filler");
            drop(filler_client);
            index_pages_before = index_pages_after_filler(&client, FILLER).await;
        }
    }
    drop(ledger);

    // A backend reports everything it counted when it exits: wait until the ledger's have (a
    // ledger dropped closes its connections: no task of its keeps one), then until the counts
    // arrived (a server before 15 hands them to its statistics process).
    super::others_closed(&client).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let sql = "SELECT relname::text, n_tup_ins, n_tup_upd, n_tup_upd - n_tup_hot_upd, seq_tup_read, idx_tup_fetch \
               FROM pg_stat_user_tables WHERE relname IN ('oncebox_operations', 'oncebox_kv') ORDER BY relname";
    // (table, rows inserted, rows updated, updates moving a row, rows read by sequential scans, by
    // index scans)
    type Counted = (String, i64, i64, i64, i64, i64);
    let calls = 64 * rounds;
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
    // Nor a whole index of it: a scan of an index that filters every entry out fetches no row.
    // Each call descends each index a few times; a read of a whole index per group would be its
    // pages (the filler's) per group. The claims are made one after another, a group each, so
    // such a read shows as the index's pages (215) per call.
    let after = index_pages(&client).await;
    let measured = 64 * (rounds - 1);
    for ((index, read, pages), (_, before, _)) in after.iter().zip(&index_pages_before) {
        let per_call = (read - before) / measured;
        assert!(per_call < 50, "{index}: {per_call} pages read per call after round 0 (the index has {pages})");
    }
}

/// Each index of the operations table: pages read (from the cache or not), and its size in pages.
async fn index_pages(client: &tokio_postgres::Client) -> Vec<(String, i64, i64)> {
    let sql = "SELECT indexrelname::text, idx_blks_hit + idx_blks_read, \
               pg_relation_size(indexrelid) / current_setting('block_size')::bigint \
               FROM pg_statio_user_indexes WHERE relname = 'oncebox_operations' ORDER BY indexrelname";
    client.query(sql, &[]).await.expect("statistics").iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect()
}

/// [`index_pages`] once the session that inserted `filler` rows ended and its counts arrived
/// (at most 30 s), so that the pages its inserts read are not counted against the calls.
async fn index_pages_after_filler(client: &tokio_postgres::Client, filler: i64) -> Vec<(String, i64, i64)> {
    let sql = "SELECT n_tup_ins FROM pg_stat_user_tables WHERE relname = 'oncebox_operations'";
    let deadline = Instant::now() + Duration::from_secs(30);
    while client.query_one(sql, &[]).await.expect("statistics").get::<_, i64>(0) < filler {
        assert!(Instant::now() < deadline, "the filler's session's counts did not arrive in 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    index_pages(client).await
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
