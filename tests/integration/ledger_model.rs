//! Model-based: the redb ledger (a real file, reopened after every "crash"), the PostgreSQL
//! ledger (a database of its own, connected to again after every "crash") and the reference model
//! (`ledger::reference`), driven with the same random sequences of claims, write-aheads, answers,
//! attempt records and finishes, renewals, lease expiries, reopenings, resolutions and crashes
//! from three workers, must give the same answer to every step and hold the same records after
//! it. Every worker behaves as the pipeline does, or as a stale one would: it writes with the
//! last fence it was given and the last state it read, however old.

use std::collections::HashMap;

use oncebox::ReplayClass;
use oncebox::ledger::reference::ReferenceStore;
use oncebox::ledger::{
    AttemptRecord, AttemptSource, Claim, ClaimRequest, EffectRecord, EffectStatus, Ledger, LedgerError, LocalWrite,
    OperationStatus, Resolution, Settlement,
};
use proptest::prelude::*;

const WORKERS: usize = 3;
const OPS: usize = 2;
const EFFECTS: usize = 2;
const LEASE_MS: u64 = 100;

#[derive(Debug, Clone)]
enum Step {
    /// A worker claims an operation (`other_args`: with a different fingerprint).
    Claim {
        worker: usize,
        op: usize,
        other_args: bool,
    },
    /// A worker reads an effect's record.
    Read {
        worker: usize,
        effect: usize,
    },
    /// A worker writes an effect ahead, with what it last read of it, and stages a KV write.
    WriteAhead {
        worker: usize,
        effect: usize,
        kv: bool,
    },
    /// A worker records the answer of an effect it wrote ahead.
    Answer {
        worker: usize,
        effect: usize,
        status: EffectStatus,
    },
    /// A worker records an attempt, maybe finishing the operation, maybe with a versioned KV write.
    Record {
        worker: usize,
        finish: Option<OperationStatus>,
        kv: Option<u64>,
    },
    Renew {
        worker: usize,
    },
    /// A worker asks to resend an unknown operation's effects (`all`: it judges them all resendable).
    Reopen {
        worker: usize,
        op: usize,
        all: bool,
    },
    /// A person settles an operation.
    Resolve {
        op: usize,
        committed: bool,
    },
    /// Time passes beyond every lease.
    Expire,
    /// The process dies and the ledger is opened again.
    Crash,
}

fn step() -> impl Strategy<Value = Step> {
    let worker = 0..WORKERS;
    let op = 0..OPS;
    let effect = 0..EFFECTS;
    let answer = prop_oneof![
        Just(EffectStatus::Completed),
        Just(EffectStatus::Refused),
        Just(EffectStatus::Retryable),
        Just(EffectStatus::Unknown),
    ];
    let finish = prop_oneof![
        Just(None),
        Just(Some(OperationStatus::Completed)),
        Just(Some(OperationStatus::Failed)),
        Just(Some(OperationStatus::Unknown)),
    ];
    prop_oneof![
        4 => (worker.clone(), op.clone(), prop::bool::weighted(0.1))
            .prop_map(|(worker, op, other_args)| Step::Claim { worker, op, other_args }),
        3 => (worker.clone(), effect.clone()).prop_map(|(worker, effect)| Step::Read { worker, effect }),
        3 => (worker.clone(), effect.clone(), any::<bool>())
            .prop_map(|(worker, effect, kv)| Step::WriteAhead { worker, effect, kv }),
        3 => (worker.clone(), effect, answer).prop_map(|(worker, effect, status)| Step::Answer { worker, effect, status }),
        3 => (worker.clone(), finish, prop::option::of(0..3u64))
            .prop_map(|(worker, finish, kv)| Step::Record { worker, finish, kv }),
        1 => worker.clone().prop_map(|worker| Step::Renew { worker }),
        1 => (worker, op.clone(), any::<bool>()).prop_map(|(worker, op, all)| Step::Reopen { worker, op, all }),
        1 => (op, any::<bool>()).prop_map(|(op, committed)| Step::Resolve { op, committed }),
        1 => Just(Step::Expire),
        1 => Just(Step::Crash),
    ]
}

/// What a worker holds: the operation and fence it was last given, and what it last read.
#[derive(Debug, Default, Clone)]
struct Worker {
    claim: Option<(usize, u64)>,
    seen: HashMap<usize, Option<(EffectStatus, u32)>>,
    attempt: u32,
}

fn op_key(op: usize) -> String {
    format!("op-{op}")
}

fn effect_key(op: usize, effect: usize) -> String {
    // 16 hex digits first: a KV write's version is stamped from its effect key.
    format!("{:016x}-op{op}-e{effect}", 0x1000 + op * 16 + effect)
}

fn request(op: usize, worker: usize, other_args: bool, now_ms: u64) -> ClaimRequest {
    ClaimRequest {
        key: op_key(op),
        run_id: "run".into(),
        step_id: format!("step-{op}"),
        tool: "charge".into(),
        class: ReplayClass::Compensatable,
        fingerprint: if other_args { "other".into() } else { "args".into() },
        older_fingerprints: Vec::new(),
        args: serde_json::Value::Null,
        owner: format!("worker-{worker}"),
        now_ms,
        lease_ms: LEASE_MS,
        approval: None,
        sealed: None,
    }
}

fn effect(op: usize, effect: usize, status: EffectStatus, dispatches: u32, now_ms: u64) -> EffectRecord {
    EffectRecord {
        key: effect_key(op, effect),
        operation_key: op_key(op),
        label: format!("e{effect}"),
        occurrence: 0,
        kind: "http".into(),
        target: "bank:443".into(),
        fingerprint: "f".into(),
        status,
        response: status.answered().then(|| "{}".to_string()),
        sealed: None,
        error: None,
        dispatches,
        first_dispatched_ms: 0,
        last_dispatched_ms: now_ms,
        updated_ms: now_ms,
        resolution: None,
        attempt: 1,
    }
}

/// A KV write staged by `op`'s attempt, as the pipeline stages one.
fn kv_write(op: usize, n: u32, expected: Option<u64>, now_ms: u64) -> (EffectRecord, LocalWrite) {
    let mut record = effect(op, 8 + n as usize, EffectStatus::Completed, 1, now_ms);
    record.kind = "kv-set".into();
    record.response = None;
    let write = LocalWrite::KvSet { namespace: "ns".into(), key: "counter".into(), value: vec![n as u8], expected };
    (record, write)
}

/// An answer, stripped of what is allowed to differ (timestamps, message wording).
fn answer<T: std::fmt::Debug>(result: &Result<T, LedgerError>, show: impl Fn(&T) -> String) -> String {
    match result {
        Ok(value) => format!("ok {}", show(value)),
        Err(e) => {
            let debug = format!("{e:?}");
            format!("err {}", debug.split([' ', '{', '(']).next().unwrap_or(&debug))
        }
    }
}

fn claim_answer(claim: &Claim) -> String {
    match claim {
        Claim::Owned { fence, previous_attempts } => format!("owned fence {fence} after {previous_attempts}"),
        Claim::Recorded(op) => format!("recorded {:?}", op.status),
        Claim::Conflict(_) => "conflict".into(),
        Claim::InProgress(op) => format!("in progress, fence {}", op.fence),
        Claim::Expired(_) => "expired".into(),
        Claim::ApprovalChanged => "approval changed".into(),
    }
}

/// Everything a caller can read of both operations, without timestamps or wording.
async fn records(ledger: &Ledger) -> String {
    let mut out = String::new();
    for op in 0..OPS {
        let key = op_key(op);
        match ledger.operation(&key).await {
            Ok(Some(r)) => out.push_str(&format!(
                "{key}: {:?} fence {} attempts {} lease {} output {:?} error {:?} owner {}\n",
                r.status,
                r.fence,
                r.attempts,
                r.lease_until_ms,
                r.output,
                r.error.map(|e| e.class),
                r.owner
            )),
            Ok(None) => out.push_str(&format!("{key}: none\n")),
            Err(e) => out.push_str(&format!("{key}: {e:?}\n")),
        }
        for e in ledger.effects(&key).await.unwrap_or_default() {
            out.push_str(&format!(
                "  {} {:?} x{} {:?}\n",
                e.key,
                e.status,
                e.dispatches,
                e.resolution.map(|r| r.verdict)
            ));
        }
        let attempts: Vec<u32> = ledger.attempts(&key).await.unwrap_or_default().iter().map(|a| a.attempt).collect();
        out.push_str(&format!("  attempts {attempts:?}\n"));
    }
    out.push_str(&format!("kv {:?}\n", ledger.kv_entry("ns", "counter").await.ok().flatten()));
    out
}

/// The backend held to the model, and how it comes back after a crash.
enum Backend {
    /// A redb file: reopened, which recovers it (`redb/open.rs`); the model crashes with it.
    Redb(std::path::PathBuf),
    /// A PostgreSQL database: connected to again, which recovers nothing (the database is shared
    /// by many hosts, and a live one's claims are not the reconnecting host's to touch; see
    /// `ledger/postgres/mod.rs`). So the model does not crash with it: every claim and every
    /// write-ahead stays as it was, and only the workers forget what they held.
    Postgres(String),
}

impl Backend {
    async fn open(&self) -> Result<Ledger, String> {
        match self {
            Backend::Redb(path) => Ledger::open(path).map_err(|e| e.to_string()),
            Backend::Postgres(url) => Ledger::connect(url).await.map_err(|e| e.to_string()),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Backend::Redb(_) => "redb",
            Backend::Postgres(_) => "postgres",
        }
    }
}

/// Runs `steps` against a redb file and the model; on the first difference, says which step and
/// how.
async fn run(steps: &[Step]) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    run_on(&Backend::Redb(dir.path().join("model.redb")), steps).await
}

/// Runs `steps` against `backend` and the model; on the first difference, says which step and
/// how.
async fn run_on(backend: &Backend, steps: &[Step]) -> Result<(), String> {
    let mut redb = Some(backend.open().await?);
    let reference = std::sync::Arc::new(ReferenceStore::new());
    let model = Ledger::on(ReferenceHandle(reference.clone()));
    let mut workers = vec![Worker::default(); WORKERS];
    let mut now = 1_000u64;
    for (n, step) in steps.iter().enumerate() {
        let Some(actual) = redb.clone() else { return Err("no ledger".into()) };
        // The workers move on with what the reference answered: both answered the same, or the
        // run stops here.
        let answers =
            [apply(&actual, step, &mut workers.clone(), now).await, apply(&model, step, &mut workers, now).await];
        match step {
            Step::Expire => now += LEASE_MS + 1,
            Step::Crash => {
                // Every handle goes, so the file closes before it is opened again.
                drop(actual);
                drop(redb.take());
                redb = Some(backend.open().await.map_err(|e| format!("reopen: {e}"))?);
                if let Backend::Redb(_) = backend {
                    reference.crash(now);
                }
                for worker in &mut workers {
                    *worker = Worker { attempt: worker.attempt, ..Worker::default() };
                }
            }
            _ => now += 1,
        }
        if answers[0] != answers[1] {
            let name = backend.name();
            return Err(format!("step {n} {step:?}: {name} answered {}, the reference {}", answers[0], answers[1]));
        }
        let Some(actual) = redb.clone() else { return Err("no ledger".into()) };
        let (left, right) = (records(&actual).await, records(&model).await);
        if left != right {
            let name = backend.name();
            return Err(format!("after step {n} {step:?}:\n{name}:\n{left}\nreference:\n{right}"));
        }
    }
    Ok(())
}

/// The reference shared with the test, which crashes it.
struct ReferenceHandle(std::sync::Arc<ReferenceStore>);

macro_rules! forward {
    ($($name:ident ( $($arg:ident : $ty:ty),* ) -> $out:ty;)*) => {$(
        fn $name<'a>(&'a self, $($arg: $ty),*) -> oncebox::ledger::BoxFuture<'a, $out> {
            self.0.$name($($arg),*)
        }
    )*};
}

impl oncebox::ledger::Store for ReferenceHandle {
    fn name(&self) -> &std::path::Path {
        self.0.name()
    }
    forward! {
        claim(req: &'a ClaimRequest) -> Result<Claim, LedgerError>;
        reopen(req: &'a ClaimRequest, resendable: Vec<String>) -> Result<Claim, LedgerError>;
        renew(key: &'a str, fence: u64, until_ms: u64) -> Result<(), LedgerError>;
        put_effect(fence: u64, effect: &'a EffectRecord, expected: Option<(EffectStatus, u32)>, staged: oncebox::ledger::Staged) -> Result<(), LedgerError>;
        record_attempt(fence: u64, attempt: &'a AttemptRecord, finish: Option<oncebox::ledger::Finish>, now_ms: u64, staged: oncebox::ledger::Staged) -> Result<(), LedgerError>;
        resolve(operation_key: &'a str, effect_key: Option<&'a str>, seen: Option<u32>, resolution: &'a Resolution, settlement: &'a Settlement) -> Result<oncebox::ledger::OperationRecord, LedgerError>;
        operation(key: &'a str) -> Result<Option<oncebox::ledger::OperationRecord>, LedgerError>;
        operations(run_id: Option<&'a str>) -> Result<Vec<oncebox::ledger::OperationRecord>, LedgerError>;
        in_flight(run_id: Option<&'a str>) -> Result<Vec<oncebox::ledger::OperationRecord>, LedgerError>;
        note_reconcile(key: &'a str, note: &'a oncebox::ledger::ReconcileNote) -> Result<bool, LedgerError>;
        enqueue_once(topic: &'a str, key: &'a str, payload: &'a str) -> Result<bool, LedgerError>;
        effect(operation_key: &'a str, effect_key: &'a str) -> Result<Option<EffectRecord>, LedgerError>;
        effects(operation_key: &'a str) -> Result<Vec<EffectRecord>, LedgerError>;
        attempts(operation_key: &'a str) -> Result<Vec<AttemptRecord>, LedgerError>;
        kv_entry(namespace: &'a str, key: &'a str) -> Result<Option<oncebox::ledger::KvEntry>, LedgerError>;
        outbox_pending(topic: &'a str, limit: usize) -> Result<Vec<oncebox::ledger::OutboxMessage>, LedgerError>;
        record_delivery(seq: u64, answer: &'a oncebox::ledger::DeliveryAnswer) -> Result<oncebox::ledger::OutboxMessage, LedgerError>;
        prune_outbox(seqs: &'a [u64]) -> Result<oncebox::ledger::Pruned, LedgerError>;
    }
    fn outbox(&self) -> oncebox::ledger::BoxFuture<'_, Result<Vec<oncebox::ledger::OutboxMessage>, LedgerError>> {
        self.0.outbox()
    }

    fn approval<'a>(
        &'a self,
        operation_key: &'a str,
    ) -> oncebox::ledger::BoxFuture<'a, Result<Option<oncebox::ledger::ApprovalRecord>, LedgerError>> {
        self.0.approval(operation_key)
    }

    fn approvals<'a>(
        &'a self,
        run_id: Option<&'a str>,
    ) -> oncebox::ledger::BoxFuture<'a, Result<Vec<oncebox::ledger::ApprovalRecord>, LedgerError>> {
        self.0.approvals(run_id)
    }

    fn put_approval<'a>(
        &'a self,
        record: &'a oncebox::ledger::ApprovalRecord,
    ) -> oncebox::ledger::BoxFuture<'a, Result<(), LedgerError>> {
        self.0.put_approval(record)
    }

    fn tombstone<'a>(
        &'a self,
        operation_key: &'a str,
    ) -> oncebox::ledger::BoxFuture<'a, Result<Option<oncebox::ledger::Tombstone>, LedgerError>> {
        self.0.tombstone(operation_key)
    }

    fn tombstones<'a>(
        &'a self,
        run_id: &'a str,
    ) -> oncebox::ledger::BoxFuture<'a, Result<Vec<oncebox::ledger::Tombstone>, LedgerError>> {
        self.0.tombstones(run_id)
    }

    fn expire<'a>(
        &'a self,
        tombstones: &'a [oncebox::ledger::Tombstone],
        approvals: &'a [oncebox::ledger::StaleApproval],
    ) -> oncebox::ledger::BoxFuture<'a, Result<oncebox::ledger::Removed, LedgerError>> {
        self.0.expire(tombstones, approvals)
    }
}

/// Applies `step` to `ledger` for the workers; returns the answer, normalised.
async fn apply(ledger: &Ledger, step: &Step, workers: &mut [Worker], now: u64) -> String {
    match step.clone() {
        Step::Claim { worker, op, other_args } => {
            let result = ledger.claim(&request(op, worker, other_args, now)).await;
            if let Ok(Claim::Owned { fence, .. }) = &result {
                workers[worker].claim = Some((op, *fence));
            }
            answer(&result, claim_answer)
        }
        Step::Read { worker, effect } => match workers[worker].claim {
            Some((op, _)) => {
                let result = ledger.effect(&op_key(op), &effect_key(op, effect)).await;
                if let Ok(seen) = &result {
                    workers[worker].seen.insert(effect, seen.as_ref().map(|e| (e.status, e.dispatches)));
                }
                answer(&result, |e| format!("{:?}", e.as_ref().map(|e| (e.status, e.dispatches))))
            }
            None => "no claim".into(),
        },
        Step::WriteAhead { worker, effect: n, kv } => match workers[worker].claim {
            Some((op, fence)) => {
                let seen = workers[worker].seen.get(&n).copied().flatten();
                let dispatches = seen.map_or(1, |(_, d)| d + 1);
                let record = effect(op, n, EffectStatus::Dispatched, dispatches, now);
                let staged = if kv { vec![kv_write(op, 4 + n as u32, None, now)] } else { Vec::new() };
                let result = ledger.put_effect(fence, &record, seen, staged).await;
                if result.is_ok() {
                    workers[worker].seen.insert(n, Some((EffectStatus::Dispatched, dispatches)));
                }
                answer(&result, |_| String::new())
            }
            None => "no claim".into(),
        },
        Step::Answer { worker, effect: n, status } => {
            match (workers[worker].claim, workers[worker].seen.get(&n).copied().flatten()) {
                (Some((op, fence)), Some((EffectStatus::Dispatched, dispatches))) => {
                    let record = effect(op, n, status, dispatches, now);
                    let result = ledger
                        .put_effect(fence, &record, Some((EffectStatus::Dispatched, dispatches)), Vec::new())
                        .await;
                    if result.is_ok() {
                        workers[worker].seen.insert(n, Some((status, dispatches)));
                    }
                    answer(&result, |_| String::new())
                }
                _ => "nothing dispatched".into(),
            }
        }
        Step::Record { worker, finish, kv } => match workers[worker].claim {
            Some((op, fence)) => {
                workers[worker].attempt += 1;
                let attempt = AttemptRecord {
                    operation_key: op_key(op),
                    run_id: "run".into(),
                    step_id: format!("step-{op}"),
                    tool: "charge".into(),
                    attempt: workers[worker].attempt,
                    max_attempts: 3,
                    fence,
                    started_ms: now,
                    duration_us: 0,
                    outcome: "ok".into(),
                    message: None,
                    source: AttemptSource::Fresh,
                    downstream_accepted: None,
                    effects: Vec::new(),
                };
                let finish = finish.map(|status| (status, Some("{}".to_string()), None));
                // A versioned write that expects a version the test cannot know is a conflict;
                // one that expects "absent" succeeds while the key is absent.
                let staged = match kv {
                    Some(0) => vec![kv_write(op, workers[worker].attempt, Some(0), now)],
                    Some(_) => vec![kv_write(op, workers[worker].attempt, None, now)],
                    None => Vec::new(),
                };
                let result = ledger.record_attempt(fence, &attempt, finish, now, staged).await;
                answer(&result, |_| String::new())
            }
            None => "no claim".into(),
        },
        Step::Renew { worker } => match workers[worker].claim {
            Some((op, fence)) => answer(&ledger.renew(&op_key(op), fence, now + 3 * LEASE_MS).await, |_| String::new()),
            None => "no claim".into(),
        },
        Step::Reopen { worker, op, all } => {
            let resendable = if all { (0..EFFECTS).map(|e| effect_key(op, e)).collect() } else { Vec::new() };
            let result = ledger.reopen(&request(op, worker, false, now), resendable).await;
            if let Ok(Claim::Owned { fence, .. }) = &result {
                workers[worker].claim = Some((op, *fence));
            }
            answer(&result, claim_answer)
        }
        Step::Resolve { op, committed } => {
            let resolution = if committed {
                Resolution::Committed { output: "{\"by\":\"hand\"}".into() }
            } else {
                Resolution::NotCommitted
            };
            let settlement =
                Settlement { verdict: resolution.verdict().into(), by: "test".into(), note: None, at_ms: now };
            answer(&ledger.resolve(&op_key(op), None, None, &resolution, &settlement).await, |op| {
                format!("{:?}", op.status)
            })
        }
        Step::Expire | Step::Crash => String::new(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn redb_answers_every_step_as_the_reference_model_does(steps in proptest::collection::vec(step(), 1..40)) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        if let Err(difference) = runtime.block_on(run(&steps)) {
            prop_assert!(false, "{}", difference);
        }
    }
}

proptest! {
    // Fewer cases than redb's: every case is a database of its own and every step a few round
    // trips to a server with fsync on, so 256 would take about a minute on two cores (64: about 15 s).
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn postgres_answers_every_step_as_the_reference_model_does(steps in proptest::collection::vec(step(), 1..40)) {
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
