//! The redb backend: the durable record of operations, effects and attempts in an embedded file.
//!
//! Every write goes through the group-commit writer (`writer.rs`): concurrent writes share one redb
//! transaction, committed with redb's default (immediate, fsync'd) durability, and each returns
//! only after that commit: nobody is told "recorded" before the record is on disk. The one
//! exception is an effect's answer ([`answer_may_ride`]), committed in memory and made durable by
//! the next durable commit, which nothing leaves the host without. Reads are redb
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

mod aged;
mod jobs;
mod open;
mod open_index;
mod outbox;
mod tables;
mod tombstones;
mod writer;

use crate::ReconcileNote;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use redb::{Database, ReadableDatabase, ReadableTable, Table};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::DeliveryAnswer;
use super::take_over;
use super::{ApprovalRecord, Removed, StaleApproval, Tombstone};
use super::{
    AttemptRecord, BoxFuture, Claim, ClaimRequest, EffectRecord, EffectStatus, ErrorRecord, Finish, KvEntry,
    LedgerError, LocalWrite, OpenRuns, OperationRecord, OperationStatus, OutboxMessage, Resolution, Settlement, Staged,
    Store, answer_may_ride, verdict,
};
use jobs::{
    claim, encode_staged, expire, note_reconcile, put_approval, put_effect, record_attempt, renew, reopen, resolve,
    take_over_live,
};
use open::{init, recover};
use tables::*;
use writer::Durability::{Now, Ride};

/// The redb store. One process owns its file.
pub struct RedbStore {
    db: Arc<Database>,
    path: PathBuf,
    writer: Arc<writer::Writer>,
    /// Claims of operations that have no durable record yet, by operation key.
    live: Live,
    /// Operation keys whose approval is being written: a claim of one waits (`ApprovalChanged`)
    /// until the decision is on disk, and a decision is refused while the key is claimed. Both
    /// are checked under the `live` lock, and a claim looks here before it opens its snapshot
    /// (`claim_in_memory`), so a claim and a decision never both win. Counted per key: two
    /// decisions on one key may be under way at once (an approval and a rejection racing), and the
    /// first to end must not unmark the key while the other is still being written.
    deciding: Arc<Mutex<HashMap<String, usize>>>,
    /// The next fence a take-over gets, in memory or on disk: one counter for the whole ledger,
    /// above every fence on disk when it was opened, so no token is ever handed out twice (an
    /// operation's fences grow, whichever path took it over).
    next_fence: Arc<AtomicU64>,
}

/// Marks a key in `deciding` while its approval write is under way, and unmarks it when the write
/// is over (or abandoned).
struct Deciding {
    set: Arc<Mutex<HashMap<String, usize>>>,
    key: String,
}

impl Deciding {
    /// Marks `key` in `set` (already locked as `held`).
    fn hold(set: &Arc<Mutex<HashMap<String, usize>>>, held: &mut HashMap<String, usize>, key: String) -> Deciding {
        *held.entry(key.clone()).or_insert(0) += 1;
        Deciding { set: set.clone(), key }
    }
}

impl Drop for Deciding {
    fn drop(&mut self) {
        let mut set = self.set.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(count) = set.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                set.remove(&self.key);
            }
        }
    }
}

/// How a claim was decided by [`RedbStore::claim_in_memory`].
enum Decided {
    Answer(Claim),
    Durable(OperationRecord),
    LiveExpired,
}

/// Claims held in memory; the writer's jobs check fences against them too.
type Live = Arc<Mutex<HashMap<String, OperationRecord>>>;

impl std::fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbStore").field("path", &self.path).finish()
    }
}

/// The memory redb keeps of the file's pages. Its default, a GiB, is what the integrity check at
/// open filled: it reads every page through the cache, so a start of `serve` on a ledger of a
/// million operations (1.2 GB) faulted in over a GiB of memory, took 14.7 s to answer
/// `/healthz` and held 66 MB a minute later. With 64 MiB: 2.2 s and 36 MB, and a replay's lookup
/// as fast (8.3 against 8.5 us; the kernel's page cache holds the file). 16 MiB made replays
/// slower (10.9 us), 256 MiB the start (4.9 s). BENCHMARKS.md, issue 39.
const CACHE_BYTES: usize = 64 << 20;

/// A redb builder with this ledger's settings.
fn builder() -> redb::Builder {
    let mut builder = Database::builder();
    builder.set_cache_size(CACHE_BYTES);
    builder
}

impl RedbStore {
    /// Opens (or creates) the ledger at `path` and recovers what a stopped host left behind:
    /// effects written ahead but never answered become `unknown`, operations holding one become
    /// `unknown`, and the other claims lose their lease so the next call takes them over.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, LedgerError> {
        let path = path.as_ref().to_path_buf();
        // Every page's checksum is verified at open: a file damaged outside redb is refused here,
        // left as it was, instead of trusted until a read of it panics (redb's plain open trusts
        // a cleanly closed file). A full read of the file, once per open.
        let db = builder().set_check_integrity_on_open(true).create(&path);
        let db = Arc::new(db.map_err(|e| LedgerError::open(&path, e))?);
        init(&db, &path)?;
        let highest_fence = recover(&db, oncebox_core::clock::now_ms())?;
        RedbStore::serve(db, path, highest_fence)
    }

    /// Opens (or creates) a ledger over any redb storage backend (`name` names it in messages),
    /// recovering as [`Ledger::open`](crate::Ledger::open) does: for a backend that fails on command in a test, or an
    /// embedder's own storage. Its page cache is the same 64 MiB, which assumes reads of the
    /// backend are cheap (as a file's are, from the kernel's cache).
    pub fn open_on(backend: impl redb::StorageBackend, name: impl AsRef<Path>) -> Result<Self, LedgerError> {
        let path = name.as_ref().to_path_buf();
        let db = builder()
            .set_check_integrity_on_open(true)
            .create_with_backend(backend)
            .map_err(|e| LedgerError::open(&path, e))?;
        let db = Arc::new(db);
        init(&db, &path)?;
        let highest_fence = recover(&db, oncebox_core::clock::now_ms())?;
        RedbStore::serve(db, path, highest_fence)
    }

    /// A ledger that lives in memory and dies with the process: for `inspect` and for running a
    /// tool in isolation in a test.
    pub fn in_memory() -> Result<Self, LedgerError> {
        let db = builder()
            .create_with_backend(redb::backends::InMemoryBackend::new())
            .map_err(|e| LedgerError::open(Path::new(":memory:"), e))?;
        let db = Arc::new(db);
        let path = PathBuf::from(":memory:");
        init(&db, &path)?;
        RedbStore::serve(db, path, 1)
    }

    fn serve(db: Arc<Database>, path: PathBuf, highest_fence: u64) -> Result<Self, LedgerError> {
        let writer = Arc::new(writer::Writer::start(db.clone())?);
        // New operations start at fence 1, so take-overs start above it.
        let next_fence = Arc::new(AtomicU64::new(highest_fence.max(1) + 1));
        Ok(RedbStore { db, path, writer, live: Live::default(), deciding: Arc::default(), next_fence })
    }

    /// A fence never handed out before.
    fn fresh_fence(&self) -> u64 {
        self.next_fence.fetch_add(1, Ordering::Relaxed)
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

impl RedbStore {
    /// Decides, atomically, who runs an operation. A recorded result, a conflict or a live lease is
    /// answered from one read transaction, and a new operation is claimed in memory: no commit,
    /// no writer. Only taking over a durable claim whose lease expired is a durable write.
    pub async fn claim(&self, req: &ClaimRequest) -> Result<Claim, LedgerError> {
        loop {
            let durable = match self.claim_in_memory(req)? {
                Decided::Answer(answer) => return Ok(answer),
                Decided::Durable(durable) => durable,
                Decided::LiveExpired => {
                    let (req, fence, live) = (req.clone(), self.fresh_fence(), self.live.clone());
                    let wrote = |claim: &Option<Claim>| matches!(claim, Some(Claim::Owned { .. }));
                    match self.writer.submit(move |txn| take_over_live(txn, &live, &req, fence), wrote, Now).await? {
                        Some(answer) => return Ok(answer),
                        // Settled or dropped meanwhile: look again.
                        None => continue,
                    }
                }
            };
            if let Some(answer) = verdict(Some(&durable), req) {
                return Ok(answer);
            }
            let (req, fence) = (req.clone(), self.fresh_fence());
            return self
                .writer
                .submit(move |txn| claim(txn, &req, fence), |claim| matches!(claim, Claim::Owned { .. }), Now)
                .await;
        }
    }

    /// Takes over an unknown operation to resend its in-doubt effects with their keys, if every one
    /// of them is `resendable`; otherwise answers with the record.
    pub async fn reopen(&self, req: &ClaimRequest, resendable: Vec<String>) -> Result<Claim, LedgerError> {
        let (req, fence) = (req.clone(), self.fresh_fence());
        self.writer
            .submit(move |txn| reopen(txn, &req, fence, &resendable), |claim| matches!(claim, Claim::Owned { .. }), Now)
            .await
    }

    /// Extends the lease of `fence`'s claim to `until_ms`, so that a live owner is not taken over;
    /// refused (`Fenced`) once another caller took the operation over.
    pub async fn renew(&self, key: &str, fence: u64, until_ms: u64) -> Result<(), LedgerError> {
        let (key, live) = (key.to_string(), self.live.clone());
        self.writer.submit(move |txn| renew(txn, &live, &key, fence, until_ms), |durable| *durable, Now).await.map(drop)
    }

    /// A claim decided in memory, the durable record that decides it, or a claim held in memory
    /// whose lease expired (taken over on the writer thread: [`take_over_live`]).
    fn claim_in_memory(&self, req: &ClaimRequest) -> Result<Decided, LedgerError> {
        let mut live = self.live();
        // Whether a decision is being written, asked BEFORE the snapshot is opened: a decision
        // that ends after this look committed before the snapshot below, which then sees it; one
        // that starts after it needs the `live` lock held here, and finds this claim (refused,
        // `ApprovalClosed`). Looked at after the snapshot, a decision could commit and leave
        // `deciding` in between, unseen by both: a rejection and a claim would both win.
        let deciding = req.approval.is_some()
            && self.deciding.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).contains_key(&req.key);
        // Read under the lock: a job makes an operation durable before it drops its live claim,
        // so between the two, one of them is always visible here.
        // One read transaction for the operation and, for a new one, its tombstone and approval.
        let txn = self.db.begin_read()?;
        oncebox_core::window::at(oncebox_core::window::Window::ClaimSnapshot, &req.key);
        let records = txn.open_table(RECORDS)?;
        if let Some(op) = get::<_, OperationRecord>(&records, operation_id(&req.key))? {
            live.remove(&req.key);
            return Ok(Decided::Durable(op));
        }
        if let Some(held) = live.get(&req.key) {
            return Ok(verdict(Some(held), req).map_or(Decided::LiveExpired, Decided::Answer));
        }
        if let Some(tombstone) = get(&records, (req.key.as_str(), TOMBSTONE, ""))? {
            return Ok(Decided::Answer(Claim::Expired(tombstone)));
        }
        if req.approval.is_some() {
            let stored: Option<ApprovalRecord> = get(&txn.open_table(APPROVALS)?, req.key.as_str())?;
            if deciding || !super::approval_stands(req, stored.as_ref()) {
                return Ok(Decided::Answer(Claim::ApprovalChanged));
            }
        }
        let op = take_over(None, req, 1);
        let claim = Claim::Owned { fence: op.fence, previous_attempts: op.attempts };
        live.insert(req.key.clone(), op);
        Ok(Decided::Answer(claim))
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
                Now,
            )
            .await?;
        self.settle(&key, fence);
        Ok(())
    }

    /// Writes an effect record (write-ahead `dispatched`, or its answer) for the owner of `fence`,
    /// with the local effects staged before it: they are on disk before the effect leaves.
    /// `expected`: the effect's (status, dispatches) as the writer last saw them, `None` if it
    /// must be new; a record that changed since is not overwritten (`EffectChanged`).
    /// An answer rides with the next durable commit ([`answer_may_ride`]): an HTTP step is then
    /// two fsyncs, its write-ahead and its attempt's record.
    pub async fn put_effect(
        &self,
        fence: u64,
        effect: &EffectRecord,
        expected: Option<(EffectStatus, u32)>,
        staged: Staged,
    ) -> Result<(), LedgerError> {
        let durability = if answer_may_ride(effect, expected, staged.len()) { Ride } else { Now };
        let (encoded, staged, live) = (encode(effect)?, encode_staged(staged)?, self.live.clone());
        let (key, effect_key) = (effect.operation_key.clone(), effect.key.clone());
        let job_key = key.clone();
        self.writer
            .submit(
                move |txn| put_effect(txn, &live, fence, (&job_key, &effect_key, &encoded), expected, &staged),
                |_| true,
                durability,
            )
            .await?;
        self.settle(&key, fence);
        Ok(())
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

    /// Settles an unknown operation's in-doubt effect (`effect_key`, or its only one) with what
    /// reconciliation or a person established, recorded with who and why. The operation completes
    /// (committed) or reopens for the next call (not committed) once nothing else is in doubt.
    pub async fn resolve(
        &self,
        operation_key: &str,
        effect_key: Option<&str>,
        seen: Option<u32>,
        resolution: &Resolution,
        settlement: &Settlement,
    ) -> Result<OperationRecord, LedgerError> {
        let (op, effect) = (operation_key.to_string(), effect_key.map(str::to_string));
        let (resolution, settlement) = (resolution.clone(), settlement.clone());
        self.writer
            .submit(move |txn| resolve(txn, &op, effect.as_deref(), seen, &resolution, &settlement), |_| true, Now)
            .await
    }
}

impl RedbStore {
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

    /// The claims held in memory whose operation is not on disk yet, all or a run's, in key order.
    /// Looked at under the `live` lock, as a claim is decided: a job makes an operation durable
    /// before its claim leaves `live`, so a claim read here that is already on disk is left out
    /// (it is an ordinary operation now).
    pub fn in_flight(&self, run_id: Option<&str>) -> Result<Vec<OperationRecord>, LedgerError> {
        let live = self.live();
        let txn = self.db.begin_read()?;
        let records = txn.open_table(RECORDS)?;
        let mut out = Vec::new();
        for op in live.values().filter(|op| run_id.is_none_or(|run| op.run_id == run)) {
            if records.get(operation_id(&op.key))?.is_none() {
                out.push(op.clone());
            }
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
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
        attempts_of(&txn.open_table(RECORDS)?, operation_key)
    }

    /// A KV key's committed value and version.
    pub fn kv_entry(&self, namespace: &str, key: &str) -> Result<Option<KvEntry>, LedgerError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(KV)?;
        let Some(stored) = table.get((namespace, key))? else {
            return Ok(None);
        };
        let (version, value) = kv_decode(stored.value())
            .ok_or_else(|| LedgerError::Corrupt { what: format!("kv {namespace}/{key}: no version") })?;
        Ok(Some((value.to_vec(), version)))
    }

    pub fn approval(&self, operation_key: &str) -> Result<Option<ApprovalRecord>, LedgerError> {
        let txn = self.db.begin_read()?;
        get(&txn.open_table(APPROVALS)?, operation_key)
    }

    pub fn approvals(&self, run_id: Option<&str>) -> Result<Vec<ApprovalRecord>, LedgerError> {
        if let Some(run) = run_id {
            return aged::approvals_of_run(&self.db, run);
        }
        let txn = self.db.begin_read()?;
        let table = txn.open_table(APPROVALS)?;
        let mut out = Vec::new();
        for entry in table.iter()? {
            let (key, value) = entry?;
            let record: ApprovalRecord = decode("approvals", key.value(), value.value())?;
            if run_id.is_none_or(|run| record.run_id == run) {
                out.push(record);
            }
        }
        Ok(out)
    }

    pub fn tombstone(&self, operation_key: &str) -> Result<Option<Tombstone>, LedgerError> {
        let txn = self.db.begin_read()?;
        get(&txn.open_table(RECORDS)?, (operation_key, TOMBSTONE, ""))
    }

    pub fn tombstones(&self, run_id: &str) -> Result<Vec<Tombstone>, LedgerError> {
        tombstones::of_run(&self.db, run_id)
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

/// The trait over the inherent methods above: writes await the writer, reads are plain read
/// transactions (microseconds on a warm page cache), answered as soon as they are polled.
impl Store for RedbStore {
    fn name(&self) -> &Path {
        &self.path
    }

    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, LedgerError>> {
        Box::pin(RedbStore::claim(self, req))
    }

    fn reopen<'a>(
        &'a self,
        req: &'a ClaimRequest,
        resendable: Vec<String>,
    ) -> BoxFuture<'a, Result<Claim, LedgerError>> {
        Box::pin(RedbStore::reopen(self, req, resendable))
    }

    fn renew<'a>(&'a self, key: &'a str, fence: u64, until_ms: u64) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(RedbStore::renew(self, key, fence, until_ms))
    }

    fn note_reconcile<'a>(&'a self, key: &'a str, note: &'a ReconcileNote) -> BoxFuture<'a, Result<bool, LedgerError>> {
        let (key, note) = (key.to_string(), note.clone());
        Box::pin(
            async move { self.writer.submit(move |txn| note_reconcile(txn, &key, note), |wrote| *wrote, Now).await },
        )
    }

    fn put_effect<'a>(
        &'a self,
        fence: u64,
        effect: &'a EffectRecord,
        expected: Option<(EffectStatus, u32)>,
        staged: Staged,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(RedbStore::put_effect(self, fence, effect, expected, staged))
    }

    fn record_attempt<'a>(
        &'a self,
        fence: u64,
        attempt: &'a AttemptRecord,
        finish: Option<Finish>,
        now_ms: u64,
        staged: Staged,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(RedbStore::record_attempt(self, fence, attempt, finish, now_ms, staged))
    }

    fn resolve<'a>(
        &'a self,
        operation_key: &'a str,
        effect_key: Option<&'a str>,
        seen: Option<u32>,
        resolution: &'a Resolution,
        settlement: &'a Settlement,
    ) -> BoxFuture<'a, Result<OperationRecord, LedgerError>> {
        Box::pin(RedbStore::resolve(self, operation_key, effect_key, seen, resolution, settlement))
    }

    fn operation<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<OperationRecord>, LedgerError>> {
        Box::pin(async move { RedbStore::operation(self, key) })
    }

    fn operations<'a>(&'a self, run_id: Option<&'a str>) -> BoxFuture<'a, Result<Vec<OperationRecord>, LedgerError>> {
        Box::pin(async move { RedbStore::operations(self, run_id) })
    }

    fn in_flight<'a>(&'a self, run_id: Option<&'a str>) -> BoxFuture<'a, Result<Vec<OperationRecord>, LedgerError>> {
        Box::pin(async move { RedbStore::in_flight(self, run_id) })
    }

    fn effect<'a>(
        &'a self,
        operation_key: &'a str,
        effect_key: &'a str,
    ) -> BoxFuture<'a, Result<Option<EffectRecord>, LedgerError>> {
        Box::pin(async move { RedbStore::effect(self, operation_key, effect_key) })
    }

    fn effects<'a>(&'a self, operation_key: &'a str) -> BoxFuture<'a, Result<Vec<EffectRecord>, LedgerError>> {
        Box::pin(async move { RedbStore::effects(self, operation_key) })
    }

    fn attempts<'a>(&'a self, operation_key: &'a str) -> BoxFuture<'a, Result<Vec<AttemptRecord>, LedgerError>> {
        Box::pin(async move { RedbStore::attempts(self, operation_key) })
    }

    fn kv_entry<'a>(&'a self, namespace: &'a str, key: &'a str) -> BoxFuture<'a, Result<Option<KvEntry>, LedgerError>> {
        Box::pin(async move { RedbStore::kv_entry(self, namespace, key) })
    }

    fn outbox(&self) -> BoxFuture<'_, Result<Vec<OutboxMessage>, LedgerError>> {
        Box::pin(async move { RedbStore::outbox(self) })
    }

    fn approval<'a>(&'a self, operation_key: &'a str) -> BoxFuture<'a, Result<Option<ApprovalRecord>, LedgerError>> {
        Box::pin(async move { RedbStore::approval(self, operation_key) })
    }

    fn approvals<'a>(&'a self, run_id: Option<&'a str>) -> BoxFuture<'a, Result<Vec<ApprovalRecord>, LedgerError>> {
        Box::pin(async move { RedbStore::approvals(self, run_id) })
    }

    fn put_approval<'a>(&'a self, record: &'a ApprovalRecord) -> BoxFuture<'a, Result<(), LedgerError>> {
        let record = record.clone();
        Box::pin(async move {
            let key = record.operation_key.clone();
            // Claims of the key wait until the decision is on disk: the guard travels with the
            // job and is dropped with its answer, after the commit, even if this future is
            // dropped while the job waits in the queue.
            let deciding = {
                let live = self.live();
                if live.contains_key(&key) {
                    return Err(LedgerError::ApprovalClosed { operation_key: key });
                }
                let mut held = self.deciding.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                Deciding::hold(&self.deciding, &mut held, key)
            };
            let key = record.operation_key.clone();
            oncebox_core::window::at(oncebox_core::window::Window::DecisionMarked, &key);
            let written =
                self.writer.submit(move |txn| put_approval(txn, &record).map(|()| deciding), |_| true, Now).await;
            oncebox_core::window::at(oncebox_core::window::Window::DecisionWritten, &key);
            written.map(drop)
        })
    }

    fn tombstone<'a>(&'a self, operation_key: &'a str) -> BoxFuture<'a, Result<Option<Tombstone>, LedgerError>> {
        Box::pin(async move { RedbStore::tombstone(self, operation_key) })
    }

    fn tombstones<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<Tombstone>, LedgerError>> {
        Box::pin(async move { RedbStore::tombstones(self, run_id) })
    }

    fn expire<'a>(
        &'a self,
        tombstones: &'a [Tombstone],
        approvals: &'a [StaleApproval],
    ) -> BoxFuture<'a, Result<Removed, LedgerError>> {
        let (tombstones, approvals) = (tombstones.to_vec(), approvals.to_vec());
        Box::pin(async move {
            // Removing a request is a decision about it, held as `put_approval` holds one: a key
            // claimed in memory keeps its request (its call runs under it), as does a key being
            // decided (the decision makes it new); the others are held as deciding until the
            // removal is on disk, so that no claim under them starts in between.
            let (kept, held) = {
                let live = self.live();
                let mut deciding = self.deciding.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                let (mut kept, mut ours) = (std::collections::HashSet::new(), std::collections::HashSet::new());
                let mut held = Vec::new();
                for stale in &approvals {
                    let key = stale.operation_key.clone();
                    if ours.contains(&key) {
                        continue;
                    }
                    if live.contains_key(&key) || deciding.contains_key(&key) {
                        kept.insert(key);
                    } else {
                        ours.insert(key.clone());
                        held.push(Deciding::hold(&self.deciding, &mut deciding, key));
                    }
                }
                (kept, held)
            };
            // The guards travel with the job and are dropped with its answer, after the commit.
            // The claims in memory are read in the job (`expire`), in the writer's turn: a claim
            // made after that read comes after this removal.
            let live = self.live.clone();
            let job = move |txn: &redb::WriteTransaction| {
                expire(txn, &tombstones, &approvals, &kept, &live).map(|removed| (removed, held))
            };
            self.writer.submit(job, |_| true, Now).await.map(|(removed, _held)| removed)
        })
    }

    fn commits(&self) -> u64 {
        RedbStore::commits(self)
    }

    fn ended_before<'a>(&'a self, cutoff_ms: u64) -> BoxFuture<'a, Result<Vec<OperationRecord>, LedgerError>> {
        Box::pin(async move { open_index::ended_before(&self.db, cutoff_ms) })
    }

    fn runs_page<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<String>, LedgerError>> {
        Box::pin(async move { open_index::runs_page(&self.db, after, limit) })
    }

    fn approvals_before<'a>(&'a self, cutoff_ms: u64) -> BoxFuture<'a, Result<Vec<ApprovalRecord>, LedgerError>> {
        Box::pin(async move { aged::approvals_before(&self.db, cutoff_ms) })
    }

    fn delivered_before<'a>(&'a self, cutoff_ms: u64) -> BoxFuture<'a, Result<Vec<OutboxMessage>, LedgerError>> {
        Box::pin(async move { aged::delivered_before(&self.db, cutoff_ms) })
    }

    fn prune_outbox<'a>(&'a self, seqs: &'a [u64]) -> BoxFuture<'a, Result<crate::Pruned, LedgerError>> {
        let seqs = seqs.to_vec();
        Box::pin(async move {
            let job = move |txn: &redb::WriteTransaction| aged::prune_outbox(txn, &seqs);
            self.writer.submit(job, |pruned| pruned.messages > 0, Now).await
        })
    }

    fn open_runs<'a>(&'a self, run: Option<&'a str>, now_ms: u64) -> BoxFuture<'a, OpenRuns> {
        Box::pin(async move { open_index::open_runs(&self.db, RedbStore::in_flight(self, run)?, run, now_ms) })
    }

    // Outbox delivery (`outbox.rs`).

    fn outbox_pending<'a>(
        &'a self,
        topic: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<OutboxMessage>, LedgerError>> {
        Box::pin(async move { RedbStore::outbox_pending(self, topic, limit) })
    }

    fn record_delivery<'a>(
        &'a self,
        seq: u64,
        answer: &'a DeliveryAnswer,
    ) -> BoxFuture<'a, Result<OutboxMessage, LedgerError>> {
        Box::pin(RedbStore::record_delivery(self, seq, answer))
    }

    fn enqueue_once<'a>(
        &'a self,
        topic: &'a str,
        key: &'a str,
        payload: &'a str,
    ) -> BoxFuture<'a, Result<bool, LedgerError>> {
        Box::pin(RedbStore::enqueue_once(self, topic, key, payload))
    }
}

fn attempts_of(
    table: &impl ReadableTable<RecordKey, &'static [u8]>,
    operation_key: &str,
) -> Result<Vec<AttemptRecord>, LedgerError> {
    let mut out = Vec::new();
    for entry in table.range((operation_key, ATTEMPT, "")..(operation_key, EFFECT, ""))? {
        let (key, value) = entry?;
        out.push(decode("attempts", key.value().0, value.value())?);
    }
    Ok(out)
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
