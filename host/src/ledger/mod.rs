//! The durable record of operations, effects and attempts: an embedded redb file.
//!
//! Every write goes through the group-commit writer (`writer.rs`): concurrent writes share one redb
//! transaction, committed with redb's default (immediate, fsync'd) durability, and each returns
//! only after that commit: nobody is told "recorded" before the record is on disk. Reads are redb
//! read transactions and see committed state. Writes for an operation carry the fencing token of
//! the claim that made them and are refused when a newer claim took the operation over.
//!
//! A new operation's claim lives in memory (`live`) until the operation's first durable write:
//! the write-ahead of its first remote effect, or its attempt's record. One process owns the
//! ledger, so memory is where claims race; what the disk must know before anything leaves the
//! host is on disk before it leaves. A call whose effects are all local therefore costs one commit:
//! its claim, its KV and outbox writes (staged by the effects, see [`Staged`]) and its result go
//! to disk together. After a crash nothing of such a call exists, which is the truth: nothing of
//! it left the process.
//!
//! Writes are async: the caller awaits the writer's answer. Reads are plain read transactions
//! (microseconds on a warm page cache), called directly.

mod error;
mod records;
mod tables;
mod writer;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use redb::{Database, ReadableDatabase, ReadableTable, Table, WriteTransaction};
use serde::Serialize;
use serde::de::DeserializeOwned;

pub use error::LedgerError;
pub use records::*;
use tables::*;

/// What a caller brings to claim an operation.
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    pub key: String,
    pub run_id: String,
    pub step_id: String,
    pub tool: String,
    pub class: crate::ReplayClass,
    pub fingerprint: String,
    pub args: serde_json::Value,
    pub owner: String,
    pub now_ms: u64,
    pub lease_ms: u64,
}

/// What the ledger says about an operation when a call arrives.
#[derive(Debug, Clone)]
pub enum Claim {
    /// This caller owns the operation now, with this token; `previous_attempts` were made before.
    Owned { fence: u64, previous_attempts: u32 },
    /// Completed, failed or unknown: answer from the record.
    Recorded(OperationRecord),
    /// The same step was called with different args.
    Conflict(OperationRecord),
    /// Another caller holds a live lease.
    InProgress(OperationRecord),
}

/// A local effect, applied in the same transaction as its record.
#[derive(Debug, Clone)]
pub enum LocalWrite {
    KvSet { namespace: String, key: String, value: Vec<u8> },
    KvDelete { namespace: String, key: String },
    Outbox { topic: String, payload: String },
}

/// What became of a local effect.
#[derive(Debug, Clone, PartialEq)]
pub enum LocalOutcome {
    Applied,
    /// Already recorded with the same request: not applied again.
    AlreadyApplied,
    /// Recorded with a different request: the tool diverged from its first run.
    Diverged(Box<EffectRecord>),
}

#[derive(Clone)]
pub struct Ledger {
    db: Arc<Database>,
    path: PathBuf,
    writer: Arc<writer::Writer>,
    /// Claims of operations that have no durable record yet, by operation key.
    live: Live,
}

/// Claims held in memory; the writer's jobs check fences against them too.
type Live = Arc<Mutex<HashMap<String, OperationRecord>>>;

/// Local effects an attempt made, to commit with its next durable write: (record, write) in order.
pub type Staged = Vec<(EffectRecord, LocalWrite)>;

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger").field("path", &self.path).finish()
    }
}

impl Ledger {
    /// Opens (or creates) the ledger at `path` and recovers what a stopped host left behind:
    /// effects written ahead but never answered become `unknown`, operations holding one become
    /// `unknown`, and the other claims lose their lease so the next call takes them over.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, LedgerError> {
        let path = path.as_ref().to_path_buf();
        let db = Arc::new(Database::create(&path).map_err(|e| LedgerError::open(&path, e))?);
        init(&db, &path)?;
        recover(&db, crate::clock::now_ms())?;
        Ledger::serve(db, path)
    }

    /// A ledger that lives in memory and dies with the process: for `inspect` and for running a
    /// tool in isolation in a test.
    pub fn in_memory() -> Result<Self, LedgerError> {
        let db = Database::builder()
            .create_with_backend(redb::backends::InMemoryBackend::new())
            .map_err(|e| LedgerError::open(Path::new(":memory:"), e))?;
        let db = Arc::new(db);
        let path = PathBuf::from(":memory:");
        init(&db, &path)?;
        Ledger::serve(db, path)
    }

    fn serve(db: Arc<Database>, path: PathBuf) -> Result<Self, LedgerError> {
        let writer = Arc::new(writer::Writer::start(db.clone())?);
        Ok(Ledger { db, path, writer, live: Live::default() })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Durable write transactions committed since this ledger was opened. Concurrent writes share
    /// one, so under load this grows slower than the number of writes.
    pub fn commits(&self) -> u64 {
        self.writer.commits()
    }
}

/// Creates the tables and checks the schema version. Runs before the writer starts.
fn init(db: &Database, path: &Path) -> Result<(), LedgerError> {
    let txn = db.begin_write()?;
    {
        let mut meta = txn.open_table(META)?;
        let version = meta.get(SCHEMA_VERSION_KEY)?.map(|v| v.value());
        match version {
            None => {
                meta.insert(SCHEMA_VERSION_KEY, SCHEMA_VERSION)?;
            }
            Some(SCHEMA_VERSION) => {}
            Some(other) => {
                return Err(LedgerError::Corrupt {
                    what: format!(
                        "{}: schema version {other}, this oncebox reads version {SCHEMA_VERSION}",
                        path.display()
                    ),
                });
            }
        }
        // Create every table, so read transactions never meet a missing one.
        txn.open_table(RECORDS)?;
        txn.open_table(RUN_STEPS)?;
        txn.open_table(KV)?;
        txn.open_table(OUTBOX)?;
    }
    txn.commit()?;
    Ok(())
}

/// Effects written ahead but never answered become `unknown`, operations holding one become
/// `unknown`, and the other claims lose their lease. Runs at open, before the writer starts.
fn recover(db: &Database, now_ms: u64) -> Result<(), LedgerError> {
    let txn = db.begin_write()?;
    {
        let mut records = txn.open_table(RECORDS)?;
        let mut claimed = Vec::new();
        for entry in records.iter()? {
            let (key, value) = entry?;
            let (key, kind, _) = key.value();
            if kind != OPERATION {
                continue;
            }
            let op: OperationRecord = decode("operations", key, value.value())?;
            if op.status == OperationStatus::Claimed {
                claimed.push(op);
            }
        }
        for mut op in claimed {
            let mut in_doubt = None;
            for mut effect in effects_of(&records, &op.key)? {
                if effect.status == EffectStatus::Dispatched {
                    effect.status = EffectStatus::Unknown;
                    effect.error = Some("the host stopped before the answer arrived".into());
                    effect.updated_ms = now_ms;
                    put(&mut records, (op.key.as_str(), EFFECT, effect.key.as_str()), &effect)?;
                }
                if effect.status.in_doubt() {
                    in_doubt.get_or_insert(effect.key);
                }
            }
            if let Some(effect_key) = in_doubt {
                op.status = OperationStatus::Unknown;
                op.error = Some(ErrorRecord {
                    class: "unknown-outcome".into(),
                    message: format!(
                        "the host stopped while effect {effect_key} was in flight; reconcile before retrying"
                    ),
                });
            }
            op.lease_until_ms = 0;
            op.updated_ms = now_ms;
            put(&mut records, operation_id(&op.key), &op)?;
        }
    }
    txn.commit()?;
    Ok(())
}

impl Ledger {
    /// Decides, atomically, who runs an operation. A recorded result, a conflict or a live lease is
    /// answered from one read transaction, and a new operation is claimed in memory: no commit,
    /// no writer. Only taking over a durable claim whose lease expired is a durable write.
    pub async fn claim(&self, req: &ClaimRequest) -> Result<Claim, LedgerError> {
        let durable = match self.claim_in_memory(req)? {
            Ok(answer) => return Ok(answer),
            Err(durable) => durable,
        };
        if let Some(answer) = verdict(Some(&durable), req) {
            return Ok(answer);
        }
        let req = req.clone();
        self.writer.submit(move |txn| claim(txn, &req), |claim| matches!(claim, Claim::Owned { .. })).await
    }

    /// A claim decided in memory (`Ok(answer)`), or the durable record that decides it (`Err`).
    fn claim_in_memory(&self, req: &ClaimRequest) -> Result<Result<Claim, OperationRecord>, LedgerError> {
        let mut live = self.live();
        // Read under the lock: a job makes an operation durable before it drops its live claim,
        // so between the two, one of them is always visible here.
        if let Some(op) = self.operation(&req.key)? {
            live.remove(&req.key);
            return Ok(Err(op));
        }
        if let Some(answer) = verdict(live.get(&req.key), req) {
            return Ok(Ok(answer));
        }
        // A live claim here expired: its owner stalled before writing anything durable.
        let op = take_over(live.remove(&req.key), req);
        let claim = Claim::Owned { fence: op.fence, previous_attempts: op.attempts };
        live.insert(req.key.clone(), op);
        Ok(Ok(claim))
    }

    /// Records one attempt, the local effects it staged and, when the call is over, the
    /// operation's final state: one commit.
    pub async fn record_attempt(
        &self,
        fence: u64,
        attempt: &AttemptRecord,
        finish: Option<(OperationStatus, Option<String>, Option<ErrorRecord>)>,
        now_ms: u64,
        staged: Staged,
    ) -> Result<(), LedgerError> {
        // Records are encoded here, on the caller's task: the writer is one thread for every caller.
        let (encoded, staged, live) = (encode(attempt)?, encode_staged(staged)?, self.live.clone());
        let (key, number) = (attempt.operation_key.clone(), attempt.attempt);
        let job_key = key.clone();
        self.writer
            .submit(
                move |txn| record_attempt(txn, &live, fence, (&job_key, number, &encoded), &staged, finish, now_ms),
                |_| true,
            )
            .await?;
        self.settle(&key, fence);
        Ok(())
    }

    /// Writes an effect record (write-ahead `dispatched`, or its answer) for the owner of `fence`,
    /// with the local effects staged before it: they are on disk before the effect leaves.
    pub async fn put_effect(&self, fence: u64, effect: &EffectRecord, staged: Staged) -> Result<(), LedgerError> {
        let (encoded, staged, live) = (encode(effect)?, encode_staged(staged)?, self.live.clone());
        let (key, effect_key) = (effect.operation_key.clone(), effect.key.clone());
        let job_key = key.clone();
        self.writer
            .submit(move |txn| put_effect(txn, &live, fence, (&job_key, &effect_key, &encoded), &staged), |_| true)
            .await?;
        self.settle(&key, fence);
        Ok(())
    }

    /// What a local effect's key already holds: nothing (stage it), the same request (already
    /// applied by an earlier attempt), or another one (the tool diverged).
    pub fn local_effect_state(&self, effect: &EffectRecord) -> Result<LocalOutcome, LedgerError> {
        Ok(match self.effect(&effect.operation_key, &effect.key)? {
            None => LocalOutcome::Applied,
            Some(existing) if existing.fingerprint != effect.fingerprint => LocalOutcome::Diverged(Box::new(existing)),
            Some(_) => LocalOutcome::AlreadyApplied,
        })
    }

    /// Drops the live claim of `fence` once its operation is durable.
    fn settle(&self, key: &str, fence: u64) {
        let mut live = self.live();
        if live.get(key).is_some_and(|op| op.fence == fence) {
            live.remove(key);
        }
    }

    fn live(&self) -> MutexGuard<'_, HashMap<String, OperationRecord>> {
        self.live.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Applies what reconciliation learnt about an unknown operation's in-doubt effect.
    pub async fn resolve(
        &self,
        operation_key: &str,
        effect_key: &str,
        resolution: &Resolution,
        now_ms: u64,
    ) -> Result<OperationRecord, LedgerError> {
        let (op, effect, resolution) = (operation_key.to_string(), effect_key.to_string(), resolution.clone());
        self.writer.submit(move |txn| resolve(txn, &op, &effect, &resolution, now_ms), |_| true).await
    }
}

// The write jobs. Each decides before it writes (see `writer.rs`).

/// What an operation's record (or its absence) means for a caller that wants to run it.
/// `None`: the caller takes it (new, or its lease expired).
fn verdict(existing: Option<&OperationRecord>, req: &ClaimRequest) -> Option<Claim> {
    let op = existing?;
    if op.fingerprint != req.fingerprint {
        Some(Claim::Conflict(op.clone()))
    } else if op.status != OperationStatus::Claimed {
        Some(Claim::Recorded(op.clone()))
    } else if op.lease_until_ms > req.now_ms {
        Some(Claim::InProgress(op.clone()))
    } else {
        None
    }
}

fn claim(txn: &WriteTransaction, req: &ClaimRequest) -> Result<Claim, LedgerError> {
    let mut records = txn.open_table(RECORDS)?;
    let existing: Option<OperationRecord> = get(&records, operation_id(&req.key))?;
    if let Some(answer) = verdict(existing.as_ref(), req) {
        return Ok(answer);
    }
    // The lease expired: the previous owner stalled or died.
    let mut op = take_over(existing, req);
    op.status = OperationStatus::Claimed;
    put(&mut records, operation_id(&req.key), &op)?;
    index_step(txn, &op)?;
    Ok(Claim::Owned { fence: op.fence, previous_attempts: op.attempts })
}

/// The operation for `req`'s caller: an expired claim taken over with the next fence, or a new one.
fn take_over(expired: Option<OperationRecord>, req: &ClaimRequest) -> OperationRecord {
    match expired {
        Some(mut op) => {
            op.fence += 1;
            op.owner.clone_from(&req.owner);
            op.lease_until_ms = req.now_ms + req.lease_ms;
            op.updated_ms = req.now_ms;
            op
        }
        None => new_operation(req),
    }
}

fn new_operation(req: &ClaimRequest) -> OperationRecord {
    OperationRecord {
        key: req.key.clone(),
        run_id: req.run_id.clone(),
        step_id: req.step_id.clone(),
        tool: req.tool.clone(),
        class: req.class,
        fingerprint: req.fingerprint.clone(),
        args: req.args.clone(),
        status: OperationStatus::Claimed,
        owner: req.owner.clone(),
        lease_until_ms: req.now_ms + req.lease_ms,
        fence: 1,
        attempts: 0,
        output: None,
        error: None,
        created_ms: req.now_ms,
        updated_ms: req.now_ms,
    }
}

/// A local effect on its way to the writer, its record already encoded.
struct StagedWrite {
    effect: EffectRecord,
    bytes: Vec<u8>,
    write: LocalWrite,
}

fn encode_staged(staged: Staged) -> Result<Vec<StagedWrite>, LedgerError> {
    staged.into_iter().map(|(effect, write)| Ok(StagedWrite { bytes: encode(&effect)?, effect, write })).collect()
}

/// The attempt (operation key, number, encoded record), its staged local effects and, when it was
/// the last, the operation's final state.
fn record_attempt(
    txn: &WriteTransaction,
    live: &Live,
    fence: u64,
    (key, number, attempt): (&str, u32, &[u8]),
    staged: &[StagedWrite],
    finish: Option<(OperationStatus, Option<String>, Option<ErrorRecord>)>,
    now_ms: u64,
) -> Result<(), LedgerError> {
    let mut records = txn.open_table(RECORDS)?;
    let (mut op, first_write) = owned(&records, live, key, fence)?;
    let fresh = unapplied(&records, key, staged)?;
    // Decided; from here on only writes.
    op.attempts = op.attempts.max(number);
    op.updated_ms = now_ms;
    if let Some((status, output, error)) = finish {
        op.status = status;
        op.output = output;
        op.error = error;
        op.lease_until_ms = 0;
    }
    put(&mut records, operation_id(key), &op)?;
    if first_write {
        index_step(txn, &op)?;
    }
    apply_local(txn, &mut records, key, fresh)?;
    records.insert((key, ATTEMPT, attempt_id(number).as_str()), attempt)?;
    Ok(())
}

/// An effect record (operation key, effect key, encoded record) and the local effects staged
/// before it.
fn put_effect(
    txn: &WriteTransaction,
    live: &Live,
    fence: u64,
    (key, effect_key, effect): (&str, &str, &[u8]),
    staged: &[StagedWrite],
) -> Result<(), LedgerError> {
    let mut records = txn.open_table(RECORDS)?;
    let (op, first_write) = owned(&records, live, key, fence)?;
    let fresh = unapplied(&records, key, staged)?;
    // Decided; from here on only writes.
    if first_write {
        put(&mut records, operation_id(key), &op)?;
        index_step(txn, &op)?;
    }
    apply_local(txn, &mut records, key, fresh)?;
    records.insert((key, EFFECT, effect_key), effect)?;
    Ok(())
}

/// The operation, if `fence` owns it: durable and claimed with that fence (`false`), or claimed in
/// memory with it (`true`: this transaction is its first durable write, and must write it).
fn owned(
    records: &impl ReadableTable<RecordKey, &'static [u8]>,
    live: &Live,
    key: &str,
    fence: u64,
) -> Result<(OperationRecord, bool), LedgerError> {
    if let Some(op) = get::<_, OperationRecord>(records, operation_id(key))? {
        if op.fence != fence || op.status != OperationStatus::Claimed {
            return Err(LedgerError::Fenced { operation_key: key.to_string(), fence, current: op.fence });
        }
        return Ok((op, false));
    }
    let held = live.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(key).cloned();
    match held {
        Some(op) if op.fence == fence => Ok((op, true)),
        held => {
            Err(LedgerError::Fenced { operation_key: key.to_string(), fence, current: held.map_or(0, |op| op.fence) })
        }
    }
}

/// The run's index entry for the operation's step.
fn index_step(txn: &WriteTransaction, op: &OperationRecord) -> Result<(), LedgerError> {
    txn.open_table(RUN_STEPS)?.insert((op.run_id.as_str(), op.step_id.as_str(), op.tool.as_str()), op.key.as_str())?;
    Ok(())
}

/// The staged local effects whose keys hold nothing yet (an earlier attempt may have applied the
/// others); refuses them all if a key holds another request (the tool diverged). Writes nothing.
fn unapplied<'s>(
    records: &impl ReadableTable<RecordKey, &'static [u8]>,
    key: &str,
    staged: &'s [StagedWrite],
) -> Result<Vec<&'s StagedWrite>, LedgerError> {
    let mut fresh = Vec::with_capacity(staged.len());
    for write in staged {
        match get::<_, EffectRecord>(records, (key, EFFECT, write.effect.key.as_str()))? {
            None => fresh.push(write),
            Some(existing) if existing.fingerprint == write.effect.fingerprint => {}
            Some(_) => {
                let (operation_key, effect_key) = (key.to_string(), write.effect.key.clone());
                return Err(LedgerError::Diverged { operation_key, effect_key });
            }
        }
    }
    Ok(fresh)
}

/// Applies KV and outbox writes with their effect records (in the caller's transaction: exactly
/// once).
fn apply_local(
    txn: &WriteTransaction,
    records: &mut Table<RecordKey, &'static [u8]>,
    operation_key: &str,
    writes: Vec<&StagedWrite>,
) -> Result<(), LedgerError> {
    for StagedWrite { effect, bytes, write } in writes {
        match write {
            LocalWrite::KvSet { namespace, key, value } => {
                txn.open_table(KV)?.insert((namespace.as_str(), key.as_str()), value.as_slice())?;
            }
            LocalWrite::KvDelete { namespace, key } => {
                txn.open_table(KV)?.remove((namespace.as_str(), key.as_str()))?;
            }
            LocalWrite::Outbox { topic, payload } => {
                let mut meta = txn.open_table(META)?;
                let seq = meta.get(OUTBOX_SEQ_KEY)?.map_or(0, |v| v.value()) + 1;
                meta.insert(OUTBOX_SEQ_KEY, seq)?;
                let message = OutboxMessage {
                    seq,
                    effect_key: effect.key.clone(),
                    topic: topic.clone(),
                    payload: payload.clone(),
                    enqueued_ms: effect.updated_ms,
                };
                put(&mut txn.open_table(OUTBOX)?, seq, &message)?;
            }
        }
        records.insert((operation_key, EFFECT, effect.key.as_str()), bytes.as_slice())?;
    }
    Ok(())
}

fn resolve(
    txn: &WriteTransaction,
    operation_key: &str,
    effect_key: &str,
    resolution: &Resolution,
    now_ms: u64,
) -> Result<OperationRecord, LedgerError> {
    let mut records = txn.open_table(RECORDS)?;
    let not_in_doubt = || LedgerError::NotInDoubt { operation_key: operation_key.to_string() };
    let mut op: OperationRecord = get(&records, operation_id(operation_key))?.ok_or_else(not_in_doubt)?;
    let mut effect: EffectRecord = get(&records, (operation_key, EFFECT, effect_key))?.ok_or_else(not_in_doubt)?;
    if op.status != OperationStatus::Unknown || !effect.status.in_doubt() {
        return Err(not_in_doubt());
    }
    effect.updated_ms = now_ms;
    op.updated_ms = now_ms;
    op.lease_until_ms = 0;
    match resolution {
        Resolution::Committed { output } => {
            effect.status = EffectStatus::Completed;
            effect.error = Some("reconciled: the authority confirmed it took place".into());
            op.status = OperationStatus::Completed;
            op.output = Some(output.clone());
            op.error = None;
        }
        Resolution::NotCommitted => {
            // Claimed with an expired lease: the next call takes it over and resends.
            effect.status = EffectStatus::Retryable;
            effect.error = Some("reconciled: the authority has no record of it".into());
            op.status = OperationStatus::Claimed;
            op.error = None;
        }
    }
    put(&mut records, (operation_key, EFFECT, effect_key), &effect)?;
    put(&mut records, operation_id(operation_key), &op)?;
    Ok(op)
}

impl Ledger {
    pub fn operation(&self, key: &str) -> Result<Option<OperationRecord>, LedgerError> {
        let txn = self.db.begin_read()?;
        get(&txn.open_table(RECORDS)?, operation_id(key))
    }

    /// All operations, or a run's, in key order.
    pub fn operations(&self, run_id: Option<&str>) -> Result<Vec<OperationRecord>, LedgerError> {
        let txn = self.db.begin_read()?;
        let records = txn.open_table(RECORDS)?;
        let mut out = Vec::new();
        match run_id {
            None => {
                for entry in records.iter()? {
                    let (key, value) = entry?;
                    let (key, kind, _) = key.value();
                    if kind == OPERATION {
                        out.push(decode("operations", key, value.value())?);
                    }
                }
            }
            Some(run) => {
                let steps = txn.open_table(RUN_STEPS)?;
                for entry in steps.range((run, "", "")..)? {
                    let (key, op_key) = entry?;
                    if key.value().0 != run {
                        break;
                    }
                    if let Some(op) = get(&records, operation_id(op_key.value()))? {
                        out.push(op);
                    }
                }
            }
        }
        Ok(out)
    }

    pub fn effect(&self, operation_key: &str, effect_key: &str) -> Result<Option<EffectRecord>, LedgerError> {
        let txn = self.db.begin_read()?;
        get(&txn.open_table(RECORDS)?, (operation_key, EFFECT, effect_key))
    }

    pub fn effects(&self, operation_key: &str) -> Result<Vec<EffectRecord>, LedgerError> {
        let txn = self.db.begin_read()?;
        effects_of(&txn.open_table(RECORDS)?, operation_key)
    }

    pub fn attempts(&self, operation_key: &str) -> Result<Vec<AttemptRecord>, LedgerError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(RECORDS)?;
        let mut out = Vec::new();
        for entry in table.range((operation_key, ATTEMPT, "")..(operation_key, EFFECT, ""))? {
            let (key, value) = entry?;
            out.push(decode("attempts", key.value().0, value.value())?);
        }
        Ok(out)
    }

    pub fn kv_get(&self, namespace: &str, key: &str) -> Result<Option<Vec<u8>>, LedgerError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(KV)?;
        Ok(table.get((namespace, key))?.map(|v| v.value().to_vec()))
    }

    pub fn outbox(&self) -> Result<Vec<OutboxMessage>, LedgerError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(OUTBOX)?;
        let mut out = Vec::new();
        for entry in table.iter()? {
            let (seq, value) = entry?;
            out.push(decode("outbox", &seq.value().to_string(), value.value())?);
        }
        Ok(out)
    }
}

fn effects_of(
    table: &impl ReadableTable<RecordKey, &'static [u8]>,
    operation_key: &str,
) -> Result<Vec<EffectRecord>, LedgerError> {
    let mut out: Vec<EffectRecord> = Vec::new();
    for entry in table.range((operation_key, EFFECT, "")..(operation_key, EFFECT + 1, ""))? {
        let (key, value) = entry?;
        out.push(decode("effects", key.value().2, value.value())?);
    }
    out.sort_by(|a, b| a.first_dispatched_ms.cmp(&b.first_dispatched_ms).then(a.label.cmp(&b.label)));
    Ok(out)
}

fn get<'k, K: redb::Key + 'static, T: DeserializeOwned>(
    table: &impl ReadableTable<K, &'static [u8]>,
    key: impl std::borrow::Borrow<K::SelfType<'k>> + std::fmt::Debug,
) -> Result<Option<T>, LedgerError> {
    let Some(value) = table.get(key.borrow())? else {
        return Ok(None);
    };
    // The key is formatted only for the error: this runs on every read.
    serde_json::from_slice(value.value())
        .map(Some)
        .map_err(|e| LedgerError::Corrupt { what: format!("key {key:?}: undecodable record: {e}") })
}

fn put<'k, K: redb::Key + 'static, T: Serialize>(
    table: &mut Table<K, &'static [u8]>,
    key: impl std::borrow::Borrow<K::SelfType<'k>>,
    value: &T,
) -> Result<(), LedgerError> {
    table.insert(key, encode(value)?.as_slice())?;
    Ok(())
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, LedgerError> {
    serde_json::to_vec(value).map_err(|e| LedgerError::Corrupt { what: format!("encoding a record: {e}") })
}

fn decode<T: DeserializeOwned>(table: &str, key: &str, bytes: &[u8]) -> Result<T, LedgerError> {
    serde_json::from_slice(bytes)
        .map_err(|e| LedgerError::Corrupt { what: format!("table {table}, key {key}: undecodable record: {e}") })
}
