//! The index of open work, on every backend: after every step of a random sequence of claims,
//! write-aheads, finishes, settlements, requests for approval and their decisions, compensations,
//! expiries of leases and of records, and (redb) crashes, what the store reads from its index
//! (`Store::open_runs`) is exactly what the one rule computes from a scan of every record
//! (`ledger::scan_open_runs`), for all runs and for each.

use oncebox::ReplayClass;
use oncebox::ledger::reference::ReferenceStore;
use oncebox::ledger::{
    ApprovalRecord, ApprovalState, AttemptRecord, AttemptSource, Claim, ClaimRequest, EffectRecord, EffectStatus,
    Ledger, OperationStatus, Resolution, Settlement, Tombstone,
};
use proptest::prelude::*;

const LEASE: u64 = 100;
const RUNS: usize = 2;
/// Steps 0 and 1 run compensatable tools, step 2 needs approval; 3 and 4 undo steps 0 and 1.
const STEPS: usize = 5;

#[derive(Debug, Clone)]
enum Step {
    Claim { run: usize, step: usize },
    WriteAhead { run: usize, step: usize },
    Finish { run: usize, step: usize, status: OperationStatus },
    Settle { run: usize, step: usize },
    Ask { run: usize, state: ApprovalState },
    Lapse { run: usize },
    Gc { run: usize, step: usize },
    Time,
    Crash,
}

fn step() -> impl Strategy<Value = Step> {
    let (run, step) = (0..RUNS, 0..STEPS);
    let status =
        prop_oneof![Just(OperationStatus::Completed), Just(OperationStatus::Failed), Just(OperationStatus::Unknown),];
    let state = prop_oneof![Just(ApprovalState::Pending), Just(ApprovalState::Approved), Just(ApprovalState::Rejected)];
    prop_oneof![
        4 => (run.clone(), step.clone()).prop_map(|(run, step)| Step::Claim { run, step }),
        2 => (run.clone(), step.clone()).prop_map(|(run, step)| Step::WriteAhead { run, step }),
        4 => (run.clone(), step.clone(), status).prop_map(|(run, step, status)| Step::Finish { run, step, status }),
        1 => (run.clone(), step.clone()).prop_map(|(run, step)| Step::Settle { run, step }),
        2 => (run.clone(), state).prop_map(|(run, state)| Step::Ask { run, state }),
        1 => run.clone().prop_map(|run| Step::Lapse { run }),
        1 => (run, step).prop_map(|(run, step)| Step::Gc { run, step }),
        1 => Just(Step::Time),
        1 => Just(Step::Crash),
    ]
}

fn key(run: usize, step: usize) -> String {
    format!("r{run}-s{step}")
}

fn step_id(run: usize, step: usize) -> String {
    match step {
        3 | 4 => format!("{}{}", oncebox::keys::COMPENSATION_PREFIX, key(run, step - 3)),
        _ => format!("s{step}"),
    }
}

fn request(run: usize, step: usize, now_ms: u64) -> ClaimRequest {
    ClaimRequest {
        key: key(run, step),
        run_id: format!("r{run}"),
        step_id: step_id(run, step),
        tool: if step < 2 { "charge".into() } else { "refund".into() },
        class: if step < 2 { ReplayClass::Compensatable } else { ReplayClass::IdempotentWrite },
        fingerprint: "args".into(),
        older_fingerprints: Vec::new(),
        args: serde_json::Value::Null,
        sealed: None,
        owner: "host".into(),
        now_ms,
        lease_ms: LEASE,
        approval: None,
    }
}

fn attempt(run: usize, step: usize, fence: u64) -> AttemptRecord {
    AttemptRecord {
        operation_key: key(run, step),
        run_id: format!("r{run}"),
        step_id: step_id(run, step),
        tool: "charge".into(),
        attempt: 1,
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

fn effect(run: usize, step: usize, status: EffectStatus) -> EffectRecord {
    let op = key(run, step);
    EffectRecord {
        key: format!("e-{op}"),
        operation_key: op,
        label: "e".into(),
        occurrence: 0,
        kind: "http".into(),
        target: "bank:443".into(),
        fingerprint: "f".into(),
        status,
        response: None,
        sealed: None,
        error: None,
        dispatches: 1,
        first_dispatched_ms: 1,
        last_dispatched_ms: 1,
        updated_ms: 0,
        resolution: None,
        attempt: 1,
    }
}

/// A request asked (`Pending`: at `now`) or decided at `now` (an approval, every other time, until
/// a little later), so that each write moves it in the index by age.
fn ask(run: usize, revision: u32, state: ApprovalState, now: u64) -> ApprovalRecord {
    let decided = state != ApprovalState::Pending;
    ApprovalRecord {
        operation_key: key(run, 2),
        fingerprint: "args".into(),
        component: Some("sha256:aa".into()),
        run_id: format!("r{run}"),
        step_id: step_id(run, 2),
        tool: "refund".into(),
        description: String::new(),
        consequence: None,
        args: serde_json::Value::Null,
        sealed: None,
        requested_ms: if decided { 1 } else { now },
        state,
        decided_by: None,
        decided_ms: decided.then_some(now),
        note: None,
        expires_ms: (state == ApprovalState::Approved && now.is_multiple_of(2)).then_some(now + 3 * LEASE),
        revision,
    }
}

/// One step, as a caller would take it; refusals are part of the sequence, not failures.
async fn apply(ledger: &Ledger, step: &Step, fences: &mut std::collections::HashMap<String, u64>, now: u64) {
    match *step {
        Step::Claim { run, step } => {
            if let Ok(Claim::Owned { fence, .. }) = ledger.claim(&request(run, step, now)).await {
                fences.insert(key(run, step), fence);
            }
        }
        Step::WriteAhead { run, step } => {
            let fence = fences.get(&key(run, step)).copied().unwrap_or(1);
            let _ = ledger.put_effect(fence, &effect(run, step, EffectStatus::Dispatched), None, Vec::new()).await;
        }
        Step::Finish { run, step, status } => {
            let fence = fences.get(&key(run, step)).copied().unwrap_or(1);
            let finish = Some((status, Some("{}".to_string()), None));
            let _ = ledger.record_attempt(fence, &attempt(run, step, fence), finish, now, Vec::new()).await;
        }
        Step::Settle { run, step } => {
            let resolution = Resolution::Committed { output: "{}".into() };
            let settlement = Settlement { verdict: "committed".into(), by: "test".into(), note: None, at_ms: now };
            let _ = ledger.resolve(&key(run, step), None, None, &resolution, &settlement).await;
        }
        Step::Ask { run, state } => {
            let revision = ledger.approval(&key(run, 2)).await.ok().flatten().map_or(0, |a| a.revision);
            let _ = ledger.put_approval(&ask(run, revision + 1, state, now)).await;
        }
        Step::Lapse { run } => {
            if let Ok(Some(request)) = ledger.approval(&key(run, 2)).await {
                let _ = ledger.expire(&[], &[oncebox::ledger::StaleApproval::of(&request)]).await;
            }
        }
        Step::Gc { run, step } => {
            if let Ok(Some(op)) = ledger.operation(&key(run, step)).await {
                let tombstone = Tombstone {
                    operation_key: op.key,
                    run_id: op.run_id,
                    step_id: op.step_id,
                    tool: op.tool,
                    fingerprint: op.fingerprint,
                    status: op.status,
                    ended_ms: now,
                    removed_ms: now,
                    rejected: false,
                    class: Some(op.class),
                };
                let _ = ledger.expire(&[tombstone], &[]).await;
            }
        }
        Step::Time | Step::Crash => {}
    }
}

async fn same_as_the_scan(ledger: &Ledger, now: u64) -> Result<(), String> {
    let indexed = ledger.open_runs(None, now).await.map_err(|e| e.to_string())?;
    let scanned = ledger.open_runs_scanned(None, now).await.map_err(|e| e.to_string())?;
    if indexed != scanned {
        return Err(format!("the index says {indexed:?}\nthe scan says {scanned:?}"));
    }
    // What retention visits: the operations that ended, oldest first, whichever index keeps them.
    let key_of = |op: &oncebox::ledger::OperationRecord| (op.updated_ms, op.key.clone());
    let mut ended: Vec<_> = ledger.operations(None).await.map_err(|e| e.to_string())?.iter().map(key_of).collect();
    let all = ledger.operations(None).await.map_err(|e| e.to_string())?;
    ended.retain(|(_, key)| {
        all.iter().any(|op| &op.key == key && matches!(op.status, OperationStatus::Completed | OperationStatus::Failed))
    });
    ended.sort();
    let indexed: Vec<_> = ledger.ended_before(u64::MAX).await.map_err(|e| e.to_string())?.iter().map(key_of).collect();
    if indexed != ended {
        return Err(format!("ended: the index says {indexed:?}\nthe scan says {ended:?}"));
    }
    // What retention visits of the requests: those last written before the cutoff, oldest first.
    for cutoff in [now.saturating_sub(2 * LEASE), now.saturating_sub(LEASE), now, u64::MAX] {
        let indexed = ledger.approvals_before(cutoff).await.map_err(|e| e.to_string())?;
        let scanned = ledger.approvals_before_scanned(cutoff).await.map_err(|e| e.to_string())?;
        if indexed != scanned {
            return Err(format!("requests before {cutoff}: the index says {indexed:?}\nthe scan says {scanned:?}"));
        }
    }
    for run in 0..RUNS {
        let run = format!("r{run}");
        let indexed = ledger.open_runs(Some(&run), now).await.map_err(|e| e.to_string())?;
        let scanned = ledger.open_runs_scanned(Some(&run), now).await.map_err(|e| e.to_string())?;
        if indexed != scanned {
            return Err(format!("{run}: the index says {indexed:?}\nthe scan says {scanned:?}"));
        }
        // A run's requests (its page, its compensation): by redb's index of them by run.
        let of_run = ledger.approvals(Some(&run)).await.map_err(|e| e.to_string())?;
        let mut scanned = ledger.approvals(None).await.map_err(|e| e.to_string())?;
        scanned.retain(|a| a.run_id == run);
        if of_run != scanned {
            return Err(format!("{run}'s requests: the index says {of_run:?}\nthe scan says {scanned:?}"));
        }
    }
    Ok(())
}

enum Backend {
    Redb(std::path::PathBuf),
    Reference,
    Postgres(String),
}

impl Backend {
    async fn open(&self) -> Ledger {
        match self {
            Backend::Redb(path) => Ledger::open(path).expect("open"),
            Backend::Reference => Ledger::on(ReferenceStore::new()),
            Backend::Postgres(url) => Ledger::connect(url).await.expect("connect"),
        }
    }
}

async fn run_on(backend: &Backend, steps: &[Step]) -> Result<(), String> {
    let mut ledger = Some(backend.open().await);
    let (mut fences, mut now) = (std::collections::HashMap::new(), 1_000u64);
    for (n, step) in steps.iter().enumerate() {
        let Some(current) = ledger.clone() else { return Err("no ledger".into()) };
        apply(&current, step, &mut fences, now).await;
        match step {
            Step::Time => now += LEASE + 1,
            // A crash of the process that holds a redb file (the others have nothing to lose).
            Step::Crash if matches!(backend, Backend::Redb(_)) => {
                drop(current);
                drop(ledger.take());
                ledger = Some(backend.open().await);
                fences.clear();
            }
            _ => now += 1,
        }
        let Some(current) = ledger.clone() else { return Err("no ledger".into()) };
        same_as_the_scan(&current, now).await.map_err(|e| format!("after step {n} {step:?}: {e}"))?;
        if let Backend::Postgres(url) = backend {
            holds_the_open_keys(url, &current, now).await.map_err(|e| format!("after step {n} {step:?}: {e}"))?;
        }
    }
    Ok(())
}

/// PostgreSQL's index holds exactly the keys the rule names (what it reads would not show a key
/// missing from a run being compensated: such a run is judged whole).
async fn holds_the_open_keys(url: &str, ledger: &Ledger, now: u64) -> Result<(), String> {
    let scanned = ledger.open_runs_scanned(None, now).await.map_err(|e| e.to_string())?;
    let mut named: Vec<String> = scanned.values().flatten().map(|open| open.operation_key.clone()).collect();
    named.sort();
    named.dedup();
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.map_err(|e| e.to_string())?;
    let connection = tokio::spawn(connection);
    let rows = client.query("SELECT key FROM oncebox_open ORDER BY key", &[]).await.map_err(|e| e.to_string())?;
    drop(client);
    let _ = connection.await;
    let held: Vec<String> = rows.iter().map(|row| row.get(0)).collect();
    if held != named {
        return Err(format!("the index holds {held:?}\nthe rule names {named:?}"));
    }
    Ok(())
}

fn check(backend: impl FnOnce() -> (Backend, Option<tempfile::TempDir>), steps: &[Step]) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let (backend, _dir) = backend();
    runtime.block_on(run_on(&backend, steps))
}

fn redb() -> (Backend, Option<tempfile::TempDir>) {
    let dir = tempfile::tempdir().expect("dir");
    (Backend::Redb(dir.path().join("open.redb")), Some(dir))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn redb_s_index_of_open_work_is_what_the_rule_computes_from_every_record(steps in proptest::collection::vec(step(), 1..50)) {
        if let Err(difference) = check(redb, &steps) {
            prop_assert!(false, "{}", difference);
        }
    }

    #[test]
    fn the_reference_model_s_open_work_is_what_the_rule_computes_from_every_record(steps in proptest::collection::vec(step(), 1..50)) {
        if let Err(difference) = check(|| (Backend::Reference, None), &steps) {
            prop_assert!(false, "{}", difference);
        }
    }
}

proptest! {
    // Each case is a database of its own (see `ledger_model.rs`).
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn postgres_s_open_work_is_what_the_rule_computes_from_every_record(steps in proptest::collection::vec(step(), 1..40)) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let outcome = runtime.block_on(async {
            let url = super::pg::fresh_database().await;
            run_on(&Backend::Postgres(url), &steps).await
        });
        if let Err(difference) = outcome {
            prop_assert!(false, "{}", difference);
        }
    }
}
