//! The index of open work on a shared ledger (`oncebox_open`, `oncebox_ended`): what it reads is
//! what the one rule computes from every record, across every kind of state change and across
//! hosts; a database made before it (schema 1) gets it once, at its first connect; and reading
//! what is open reads the open rows, not the history.

use std::time::{Duration, Instant};

use oncebox::ReplayClass;
use oncebox::ledger::{
    ApprovalState, Claim, ClaimRequest, EffectStatus, Ledger, OperationStatus, Resolution, Settlement, Tombstone,
};

use super::{approval, connect, fresh_database};

const LEASE: u64 = 100;

fn request(run: &str, step: &str, class: ReplayClass, now_ms: u64) -> ClaimRequest {
    ClaimRequest {
        key: format!("{run}/{step}"),
        run_id: run.into(),
        step_id: step.into(),
        tool: "charge".into(),
        class,
        fingerprint: "args".into(),
        older_fingerprints: Vec::new(),
        args: serde_json::Value::Null,
        owner: "host".into(),
        now_ms,
        lease_ms: LEASE,
        approval: None,
        sealed: None,
    }
}

fn attempt(req: &ClaimRequest, fence: u64) -> oncebox::ledger::AttemptRecord {
    let mut attempt = crate::conformance::attempt(&req.key, 1, fence);
    attempt.run_id = req.run_id.clone();
    attempt.step_id = req.step_id.clone();
    attempt
}

async fn claim(ledger: &Ledger, req: &ClaimRequest) -> u64 {
    match ledger.claim(req).await.expect("claim") {
        Claim::Owned { fence, .. } => fence,
        other => panic!("{}: {other:?}", req.key),
    }
}

async fn finish(ledger: &Ledger, req: &ClaimRequest, fence: u64, status: OperationStatus, now_ms: u64) {
    let finish = Some((status, Some("{}".to_string()), None));
    ledger.record_attempt(fence, &attempt(req, fence), finish, now_ms, Vec::new()).await.expect("finish");
}

/// What the index reads, all runs' and each run's, and the ended operations, against the scan; and
/// the index holds exactly the keys the rule names (a key missing from a run that has others
/// would not show in what it reads: the run is judged whole once it is being compensated).
async fn agrees(
    client: &tokio_postgres::Client,
    ledger: &Ledger,
    now_ms: u64,
    when: &str,
) -> std::collections::BTreeMap<String, Vec<oncebox::ledger::Open>> {
    let indexed = ledger.open_runs(None, now_ms).await.expect("indexed");
    assert_eq!(indexed, ledger.open_runs_scanned(None, now_ms).await.expect("scanned"), "{when}");
    for run in ["a", "b", "c"] {
        let indexed = ledger.open_runs(Some(run), now_ms).await.expect("indexed");
        assert_eq!(indexed, ledger.open_runs_scanned(Some(run), now_ms).await.expect("scanned"), "{when}: {run}");
    }
    let mut ended: Vec<(u64, String)> = ledger
        .operations(None)
        .await
        .expect("operations")
        .into_iter()
        .filter(|op| matches!(op.status, OperationStatus::Completed | OperationStatus::Failed))
        .map(|op| (op.updated_ms, op.key))
        .collect();
    ended.sort();
    let indexed: Vec<(u64, String)> =
        ledger.ended_before(u64::MAX).await.expect("ended").into_iter().map(|op| (op.updated_ms, op.key)).collect();
    assert_eq!(indexed, ended, "{when}: ended");
    let scanned = ledger.open_runs_scanned(None, now_ms).await.expect("scanned");
    let mut named: Vec<String> = scanned.values().flatten().map(|open| open.operation_key.clone()).collect();
    named.sort();
    named.dedup();
    let rows = client.query("SELECT key FROM oncebox_open ORDER BY key", &[]).await.expect("index");
    let held: Vec<String> = rows.iter().map(|row| row.get(0)).collect();
    assert_eq!(held, named, "{when}: the keys the index holds");
    indexed_open_runs(ledger, now_ms).await
}

async fn indexed_open_runs(
    ledger: &Ledger,
    now_ms: u64,
) -> std::collections::BTreeMap<String, Vec<oncebox::ledger::Open>> {
    ledger.open_runs(None, now_ms).await.expect("indexed")
}

/// Every kind of state change, by two hosts on one database, each followed by the check: a claim,
/// a write-ahead, a take-over of a dead host's claim, an unknown settled by hand and one reopened
/// to resend, a request for approval pending, approved, used and rejected, a compensation started
/// and finished, and retention's removals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_index_agrees_with_a_scan_across_every_state_change_and_host() {
    let url = fresh_database().await;
    let (one, two) = (Ledger::connect(&url).await.expect("one"), Ledger::connect(&url).await.expect("two"));
    let client = connect(&url).await;
    let mut now = 1_000;
    let charge = request("a", "charge", ReplayClass::Compensatable, now);
    let fence = claim(&one, &charge).await;
    let open = agrees(&client, &two, now, "a claim in flight").await;
    assert!(matches!(open["a"][0].why, oncebox::ledger::Why::InFlight { recorded: false, .. }), "{open:?}");
    let effect = crate::conformance::effect(&charge.key, 1, EffectStatus::Dispatched, 1);
    one.put_effect(fence, &effect, None, Vec::new()).await.expect("write-ahead");
    agrees(&client, &two, now, "a write-ahead").await;

    // The host dies; its lease runs out; the other takes over and ends it unknown.
    now += LEASE + 1;
    agrees(&client, &two, now, "abandoned").await;
    let taken = request("a", "charge", ReplayClass::Compensatable, now);
    let fence = claim(&two, &taken).await;
    agrees(&client, &one, now, "taken over").await;
    finish(&two, &taken, fence, OperationStatus::Unknown, now).await;
    let open = agrees(&client, &one, now, "unknown").await;
    assert!(matches!(open["a"][0].why, oncebox::ledger::Why::Unknown), "{open:?}");
    let settlement = Settlement { verdict: "committed".into(), by: "ops".into(), note: None, at_ms: now };
    let resolution = Resolution::Committed { output: "{}".into() };
    one.resolve(&charge.key, None, None, &resolution, &settlement).await.expect("settled");
    let open = agrees(&client, &two, now, "settled").await;
    assert!(!open.contains_key("a"), "{open:?}");

    // An unknown reopened to resend its effect with its key.
    let resend = request("b", "ship", ReplayClass::IdempotentWrite, now);
    let fence = claim(&one, &resend).await;
    let effect = crate::conformance::effect(&resend.key, 1, EffectStatus::Dispatched, 1);
    one.put_effect(fence, &effect, None, Vec::new()).await.expect("write-ahead");
    let mut doubt = effect.clone();
    doubt.status = EffectStatus::Unknown;
    one.put_effect(fence, &doubt, Some((EffectStatus::Dispatched, 1)), Vec::new()).await.expect("in doubt");
    finish(&one, &resend, fence, OperationStatus::Unknown, now).await;
    agrees(&client, &two, now, "unknown, to resend").await;
    let reopened = two.reopen(&resend, vec![effect.key.clone()]).await.expect("reopen");
    let Claim::Owned { fence, .. } = reopened else { panic!("{reopened:?}") };
    agrees(&client, &one, now, "reopened").await;
    let mut answered = doubt.clone();
    answered.status = EffectStatus::Completed;
    two.put_effect(fence, &answered, Some((EffectStatus::Unknown, 1)), Vec::new()).await.expect("answered");
    finish(&two, &resend, fence, OperationStatus::Completed, now).await;
    agrees(&client, &one, now, "completed").await;

    // A request for approval: pending, approved, used; another rejected.
    let mut asked = approval("b/fulfill", 1, ApprovalState::Pending);
    asked.run_id = "b".into();
    asked.step_id = "fulfill".into();
    one.put_approval(&asked).await.expect("asked");
    let open = agrees(&client, &two, now, "pending").await;
    assert_eq!(open["b"].len(), 1, "{open:?}");
    asked.state = ApprovalState::Approved;
    asked.revision = 2;
    two.put_approval(&asked).await.expect("approved");
    agrees(&client, &one, now, "approved").await;
    let mut under = request("b", "fulfill", ReplayClass::Irreversible, now);
    under.approval = Some(oncebox::ledger::SeenApproval { revision: 2, component: "sha256:aaaa".into() });
    let fence = claim(&one, &under).await;
    agrees(&client, &two, now, "used").await;
    finish(&one, &under, fence, OperationStatus::Completed, now).await;
    let mut rejected = approval("c/refund", 1, ApprovalState::Rejected);
    rejected.run_id = "c".into();
    rejected.step_id = "refund".into();
    two.put_approval(&rejected).await.expect("rejected");
    let open = agrees(&client, &one, now, "used and rejected").await;
    assert!(open.is_empty(), "{open:?}");

    // A compensation: started, the completed compensatable step is outstanding until undone.
    let undo = request(
        "a",
        &format!("{}{}", oncebox::keys::COMPENSATION_PREFIX, charge.key),
        ReplayClass::IdempotentWrite,
        now,
    );
    let fence = claim(&two, &undo).await;
    let open = agrees(&client, &one, now, "compensation started").await;
    let reasons: Vec<&str> = open["a"].iter().map(|o| o.why.as_str()).collect();
    assert_eq!(reasons, ["in-flight", "compensation-outstanding"], "{open:?}");
    finish(&two, &undo, fence, OperationStatus::Completed, now).await;
    let open = agrees(&client, &one, now, "compensated").await;
    assert!(open.is_empty(), "{open:?}");

    // Retention removes what ended, and the ended index forgets it.
    now += 1;
    let ended = one.ended_before(now).await.expect("ended");
    assert_eq!(ended.len(), 4, "{ended:?}");
    let tombstones: Vec<Tombstone> = ended.iter().map(|op| Tombstone::of(op, now)).collect();
    let stale = oncebox::ledger::StaleApproval::of(&rejected);
    two.expire(&tombstones, &[stale]).await.expect("expired");
    agrees(&client, &one, now, "expired").await;
    assert!(one.ended_before(u64::MAX).await.expect("ended").is_empty());
}

/// Removing a compensation (retention's `expire`) re-judges its run's other keys: in a run whose
/// two compensatable steps were both undone (closed), removing the first one's compensation alone
/// leaves a run still being compensated (the second's compensation stands) with a completed step
/// no compensation undid: open, by the one rule, which the index must say too. And while a run's
/// compensation is outstanding, its compensation is not removed at all (the run is open). Failed
/// before `reindex` took the change's tie flag (the run was read whole after the removal, so the
/// change did not look like a compensation's, and only the removed key's row was written).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_a_compensation_rejudges_its_run() {
    let url = fresh_database().await;
    let (one, two) = (Ledger::connect(&url).await.expect("one"), Ledger::connect(&url).await.expect("two"));
    let client = connect(&url).await;
    let now = 1_000;
    let mut undos = Vec::new();
    for step in ["s1", "s2"] {
        let req = request("a", step, ReplayClass::Compensatable, now);
        let fence = claim(&one, &req).await;
        finish(&one, &req, fence, OperationStatus::Completed, now).await;
        let compensation = format!("{}{}", oncebox::keys::COMPENSATION_PREFIX, req.key);
        undos.push(request("a", &compensation, ReplayClass::IdempotentWrite, now));
    }
    let tombstone_of = |ledger: Ledger, key: String| async move {
        let op = ledger.operation(&key).await.expect("read").expect("recorded");
        Tombstone::of(&op, now + 1)
    };
    // s1 undone, s2 not yet: the run is open, and its compensation stays.
    let fence = claim(&two, &undos[0]).await;
    finish(&two, &undos[0], fence, OperationStatus::Completed, now).await;
    let open = agrees(&client, &one, now, "s1 compensated").await;
    let reasons: Vec<&str> = open["a"].iter().map(|o| o.why.as_str()).collect();
    assert_eq!(reasons, ["compensation-outstanding"], "{open:?}");
    let first = tombstone_of(one.clone(), undos[0].key.clone()).await;
    let removed = two.expire(std::slice::from_ref(&first), &[]).await.expect("expire");
    assert_eq!(removed.operations, 0, "the run is open: its compensation is kept");
    agrees(&client, &one, now, "the compensation kept").await;

    // Both undone: closed. Removing the first compensation alone reopens s1 by the rule.
    let fence = claim(&two, &undos[1]).await;
    finish(&two, &undos[1], fence, OperationStatus::Completed, now).await;
    let open = agrees(&client, &one, now, "both compensated").await;
    assert!(open.is_empty(), "{open:?}");
    let removed = two.expire(&[first], &[]).await.expect("expire");
    assert_eq!(removed.operations, 1);
    let open = agrees(&client, &one, now + 1, "the first compensation removed").await;
    let reasons: Vec<(&str, &str)> = open["a"].iter().map(|o| (o.operation_key.as_str(), o.why.as_str())).collect();
    assert_eq!(reasons, [("a/s1", "compensation-outstanding")], "{open:?}");
}

/// A database of schema 1 (no index) is given the index at its first connect by a host of schema
/// 2, built by the one rule from every record once; a host of schema 1 is then refused it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_made_before_the_index_is_indexed_at_its_first_connect() {
    let url = fresh_database().await;
    let now = 1_000;
    let before = {
        let ledger = Ledger::connect(&url).await.expect("connect");
        for n in 0..20 {
            let req = request(&format!("done-{n}"), "charge", ReplayClass::Compensatable, now);
            let fence = claim(&ledger, &req).await;
            finish(&ledger, &req, fence, OperationStatus::Completed, now + n).await;
        }
        let doubt = request("doubt", "charge", ReplayClass::Compensatable, now);
        let fence = claim(&ledger, &doubt).await;
        finish(&ledger, &doubt, fence, OperationStatus::Unknown, now).await;
        claim(&ledger, &request("flying", "charge", ReplayClass::Compensatable, now)).await;
        let mut asked = approval("asked/fulfill", 1, ApprovalState::Pending);
        asked.run_id = "asked".into();
        ledger.put_approval(&asked).await.expect("asked");
        let done = request(
            "done-3",
            &format!("{}done-3/charge", oncebox::keys::COMPENSATION_PREFIX),
            ReplayClass::IdempotentWrite,
            now,
        );
        let fence = claim(&ledger, &done).await;
        finish(&ledger, &done, fence, OperationStatus::Failed, now).await;
        let open = ledger.open_runs(None, now).await.expect("open");
        assert_eq!(open.keys().collect::<Vec<_>>(), ["asked", "done-3", "doubt", "flying"]);
        open
    };
    // Make it a database of schema 1.
    let client = connect(&url).await;
    client
        .batch_execute(
            "DROP TABLE oncebox_open; DROP TABLE oncebox_ended; \
             UPDATE oncebox_meta SET value = 1 WHERE name = 'schema_version'",
        )
        .await
        .expect("schema 1");
    let ledger = Ledger::connect(&url).await.expect("migrated");
    assert_eq!(agrees(&client, &ledger, now, "migrated").await, before);
    let version: i64 = client
        .query_one("SELECT value FROM oncebox_meta WHERE name = 'schema_version'", &[])
        .await
        .expect("version")
        .get(0);
    assert_eq!(version, 2);
    let rows: i64 = client.query_one("SELECT count(*) FROM oncebox_open", &[]).await.expect("rows").get(0);
    assert_eq!(rows, 4, "the open keys only: doubt, flying, asked, and done-3's step whose undo failed");
}

/// Reading what is open touches the open rows and the runs being compensated, not the history:
/// 10^4 ended operations beside a few open ones cost the reads of the open ones. Counted by the
/// server, as `groups.rs` counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reading_what_is_open_does_not_grow_with_the_history() {
    const ENDED: i64 = 10_000;
    let url = fresh_database().await;
    let client = connect(&url).await;
    let now = 1_000;
    {
        let ledger = Ledger::connect(&url).await.expect("connect");
        for n in 0..5 {
            let req = request(&format!("open-{n}"), "charge", ReplayClass::Compensatable, now);
            let fence = claim(&ledger, &req).await;
            finish(&ledger, &req, fence, OperationStatus::Unknown, now).await;
        }
        let done = request("done", "charge", ReplayClass::Compensatable, now);
        let fence = claim(&ledger, &done).await;
        finish(&ledger, &done, fence, OperationStatus::Completed, now).await;
        // The history: copies of that ended operation's row.
        let history = format!(
            "INSERT INTO oncebox_operations (key, run_id, step_id, tool, status, fence, lease_until_ms, recorded, \
             record) SELECT 'h-' || n, 'h-' || n, 'charge', 'charge', 'completed', 1, 0, true, o.record \
             FROM generate_series(1, {ENDED}) AS n, oncebox_operations o WHERE o.key = 'done/charge'; ANALYZE"
        );
        client.batch_execute(&history).await.expect("history");
    }
    let before = operations_read(&client).await;
    {
        let ledger = Ledger::connect(&url).await.expect("connect");
        for _ in 0..10 {
            let open = ledger.open_runs(None, now).await.expect("open");
            assert_eq!(open.len(), 5);
            assert_eq!(ledger.open_runs(Some("open-0"), now).await.expect("open").len(), 1);
        }
    }
    let read = operations_read(&client).await - before;
    // 20 reads of at most 5 open rows each (and their runs' probes for a compensation).
    assert!(read < 20 * 12, "{read} rows of the operations table read for 20 readings of 5 open operations");
    // The measure sees a read of the history: the scan's, once.
    {
        let ledger = Ledger::connect(&url).await.expect("connect");
        assert_eq!(ledger.open_runs_scanned(None, now).await.expect("scanned").len(), 5);
    }
    let scanned = operations_read(&client).await - before - read;
    assert!(scanned >= ENDED, "the scan read {scanned} rows");
    eprintln!("open work read {read} rows in 20 readings; one scan read {scanned}");
}

/// Rows of `oncebox_operations` read so far by every session (sequential and index scans), once
/// every other session of the database ended and reported its counts.
async fn operations_read(client: &tokio_postgres::Client) -> i64 {
    super::others_closed(client).await;
    let sql = "SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) FROM pg_stat_user_tables \
               WHERE relname = 'oncebox_operations'";
    // The counts arrive a little after the sessions end: read until they stop moving.
    let mut last = -1;
    for _ in 0..20 {
        client.batch_execute("SELECT pg_stat_clear_snapshot()").await.expect("fresh statistics");
        let read: i64 = client.query_one(sql, &[]).await.expect("statistics").get(0);
        if read == last {
            return read;
        }
        last = read;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    last
}

/// Two hosts at once on the same runs: their steps end while their compensations start and undo
/// some of them, each host's writes in groups of their own. Whatever order the database takes
/// them in, the index ends as the rule computes from the records: the run's lock keeps a host
/// from judging a step by a compensation another host is writing (without it, a host that ends a
/// step reads the run as not compensated while the other starts its compensation, and drops the
/// step that just became outstanding).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hosts_ending_steps_while_a_compensation_starts_leave_the_index_right() {
    const RUNS: usize = 12;
    const STEPS: usize = 8;
    let url = fresh_database().await;
    let hosts = [Ledger::connect(&url).await.expect("one"), Ledger::connect(&url).await.expect("two")];
    let client = connect(&url).await;
    let now = 1_000;
    let mut steps = Vec::new();
    for run in 0..RUNS {
        for n in 0..STEPS {
            let step = request(&format!("r{run:02}"), &format!("s{n}"), ReplayClass::Compensatable, now);
            let fence = claim(&hosts[n % 2], &step).await;
            steps.push((run, n, step, fence));
        }
    }
    // Every step ends, on either host, while the compensations of the first two of its run are
    // claimed and finished on the other.
    let mut tasks = Vec::new();
    for (run, n, step, fence) in steps {
        let ledger = hosts[n % 2].clone();
        tasks.push(tokio::spawn(async move { finish(&ledger, &step, fence, OperationStatus::Completed, now).await }));
        if n < 2 {
            let ledger = hosts[(n + 1) % 2].clone();
            let run = format!("r{run:02}");
            let step = format!("{}{run}/s{n}", oncebox::keys::COMPENSATION_PREFIX);
            let undo = request(&run, &step, ReplayClass::IdempotentWrite, now);
            tasks.push(tokio::spawn(async move {
                let fence = claim(&ledger, &undo).await;
                let status = if n == 0 { OperationStatus::Completed } else { OperationStatus::Failed };
                finish(&ledger, &undo, fence, status, now).await
            }));
        }
    }
    for task in tasks {
        task.await.expect("join");
    }
    let open = agrees(&client, &hosts[0], now, "after the race").await;
    // Started: every completed step not undone is outstanding (the one whose undo failed too).
    for run in 0..RUNS {
        let reasons = &open[&format!("r{run:02}")];
        assert!(reasons.iter().all(|o| o.why.as_str() == "compensation-outstanding"), "{reasons:?}");
        assert_eq!(reasons.len(), STEPS - 1, "{reasons:?}");
    }
}

/// A compensation claimed in a run nobody has called (no records yet): the run read whole is
/// empty, and the claim is answered as any other, alone or in a group with other callers' claims,
/// and indexed as the rule says (it was refused once: a run with no records read as not read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compensation_in_a_run_with_no_records_is_claimed_and_indexed() {
    let url = fresh_database().await;
    let ledger = Ledger::connect(&url).await.expect("connect");
    let client = connect(&url).await;
    let now = 1_000;
    let undo = |run: &str| {
        let step = format!("{}{run}/s0", oncebox::keys::COMPENSATION_PREFIX);
        request(run, &step, ReplayClass::IdempotentWrite, now)
    };
    // Alone.
    let fence = claim(&ledger, &undo("a")).await;
    agrees(&client, &ledger, now, "a lone compensation claimed").await;
    finish(&ledger, &undo("a"), fence, OperationStatus::Completed, now).await;
    // Among other callers' claims, all at once (they share groups).
    let mut tasks = Vec::new();
    for n in 0..16 {
        let ledger = ledger.clone();
        let req = if n == 8 { undo("b") } else { request("c", &format!("s{n}"), ReplayClass::Compensatable, now) };
        tasks.push(tokio::spawn(async move { claim(&ledger, &req).await }));
    }
    for task in tasks {
        task.await.expect("join");
    }
    let open = agrees(&client, &ledger, now, "a compensation claimed among others").await;
    assert!(!open.contains_key("a"), "{open:?}");
    assert!(open.contains_key("b") && open.contains_key("c"), "{open:?}");
}

/// The saga of a run nobody called, on the shared ledger: answered, nothing to undo, nothing
/// written; and again once another run's compensation is claimed beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_saga_of_a_run_nobody_called_answers_done() {
    let (url, dir, provider) = (fresh_database().await, tempfile::tempdir().expect("dir"), super::provider().await);
    let host = super::host_on(&url, &dir, &provider, true, |builder| builder).await;
    for _ in 0..2 {
        let report = host.compensate("nobody").await.expect("compensate");
        assert_eq!(report.state, oncebox::saga::SagaState::Done, "{report:?}");
        assert!(report.steps.is_empty(), "{report:?}");
    }
    let ledger = host.ledger();
    assert!(ledger.operations(Some("nobody")).await.expect("operations").is_empty());
    assert!(!ledger.open_runs(None, u64::MAX / 2).await.expect("open").contains_key("nobody"));
}

/// What the index costs the hot path: 64 callers each claiming and ending operations of runs of
/// their own (a claim and a finished attempt with one KV write each), in calls per second. A
/// timing, not a check: `cargo test ... pg::open_work::cost -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a timing, not a check"]
async fn cost() {
    let url = fresh_database().await;
    let ledger = Ledger::connect(&url).await.expect("connect");
    hot_path(&ledger).await;
}

/// What the schema guard (`schema.rs`: a trigger per statement on the operations and approvals)
/// costs the server in [`cost`]'s workload, counted by the server (`track_functions`): its calls
/// and their time, beside the transactions committed and the workload's time. A timing, not a
/// check: `cargo test ... pg::open_work::guard_cost -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a timing, not a check"]
async fn guard_cost() {
    let url = fresh_database().await;
    let client = connect(&url).await;
    let track = "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET track_functions = ''pl''', current_database()); \
                 END $$";
    client.batch_execute(track).await.expect("track");
    let ledger = Ledger::connect(&url).await.expect("connect");
    let commits = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()";
    let before: i64 = client.query_one(commits, &[]).await.expect("commits").get(0);
    let started = Instant::now();
    hot_path(&ledger).await;
    let elapsed = started.elapsed();
    drop(ledger);
    // A session's statistics reach the server's counters when it goes idle (within a second).
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    client.batch_execute("SELECT pg_stat_clear_snapshot()").await.expect("fresh statistics");
    let after: i64 = client.query_one(commits, &[]).await.expect("commits").get(0);
    let guard = "SELECT coalesce(sum(calls), 0)::bigint, coalesce(sum(total_time), 0)::float8 \
                 FROM pg_stat_user_functions WHERE funcname = 'oncebox_schema_guard'";
    let row = client.query_one(guard, &[]).await.expect("functions");
    let (calls, ms): (i64, f64) = (row.get(0), row.get(1));
    eprintln!(
        "guard: {calls} calls, {ms:.1} ms in all ({:.1} us each), {} transactions committed, {:.0} ms of workload",
        ms * 1000.0 / calls.max(1) as f64,
        after - before,
        elapsed.as_secs_f64() * 1000.0
    );
}

/// [`cost`]'s workload on `ledger`, its rate printed.
async fn hot_path(ledger: &Ledger) {
    const CALLERS: usize = 64;
    const EACH: usize = 50;
    let started = Instant::now();
    let callers: Vec<_> = (0..CALLERS)
        .map(|caller| {
            let ledger = ledger.clone();
            tokio::spawn(async move {
                for n in 0..EACH {
                    let req = request(&format!("c{caller}-{n}"), "charge", ReplayClass::IdempotentWrite, 1_000);
                    let fence = claim(&ledger, &req).await;
                    let (_, staged) = kv(&req.key);
                    let finish = Some((OperationStatus::Completed, Some("{}".to_string()), None));
                    ledger.record_attempt(fence, &attempt(&req, fence), finish, 1_001, staged).await.expect("end");
                }
            })
        })
        .collect();
    for caller in callers {
        caller.await.expect("join");
    }
    let rate = (CALLERS * EACH) as f64 / started.elapsed().as_secs_f64();
    eprintln!("{} calls (claim + attempt) at {CALLERS} callers: {rate:.0} calls/s", CALLERS * EACH);
}

fn kv(op: &str) -> ((), oncebox::ledger::Staged) {
    let mut effect = crate::conformance::effect(op, 1, EffectStatus::Completed, 1);
    effect.kind = "kv-set".into();
    let write = oncebox::ledger::LocalWrite::KvSet {
        namespace: "ns".into(),
        key: op.into(),
        value: b"v".to_vec(),
        expected: None,
    };
    ((), vec![(effect, write)])
}

/// A person's word that they undid a step by hand, beside its failed compensation, closes the run
/// on a shared ledger as on redb: the index of open work says so in the word's own transaction,
/// and a word from another host is the first one's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_undone_by_hand_closes_its_run_in_the_index() {
    let url = fresh_database().await;
    let (one, two) = (Ledger::connect(&url).await.expect("one"), Ledger::connect(&url).await.expect("two"));
    let client = connect(&url).await;
    let now = one.now_ms();
    let charge = request("a", "pay", ReplayClass::Compensatable, now);
    let fence = claim(&one, &charge).await;
    finish(&one, &charge, fence, OperationStatus::Completed, now).await;
    let compensation = format!("{}{}", oncebox::keys::COMPENSATION_PREFIX, charge.key);
    let undo = request("a", &compensation, ReplayClass::IdempotentWrite, now);
    let fence = claim(&two, &undo).await;
    finish(&two, &undo, fence, OperationStatus::Failed, now).await;
    let open = agrees(&client, &one, now, "its compensation failed").await;
    let reasons: Vec<&str> = open["a"].iter().map(|o| o.why.as_str()).collect();
    assert_eq!(reasons, ["compensation-outstanding"], "{open:?}");

    let keying = oncebox::keys::FingerprintKey::new(vec![[7; 32]]).expect("key");
    let said =
        oncebox::saga::undone_by_hand(&two, &keying, &charge.key, "ops", Some("refunded by hand")).await.expect("said");
    assert!(said.recorded, "{said:?}");
    assert_eq!(said.recorded_as, oncebox::keys::undone_by_hand_key("a", &charge.key), "beside the failed one");
    let open = agrees(&client, &one, one.now_ms(), "undone by hand").await;
    assert!(open.is_empty(), "{open:?}");
    let again = oncebox::saga::undone_by_hand(&one, &keying, &charge.key, "someone-else", None).await.expect("said");
    assert_eq!((again.recorded, again.by.as_deref()), (false, Some("ops")), "{again:?}");
}
