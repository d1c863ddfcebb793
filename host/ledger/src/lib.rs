//! The durable record of operations, effects and attempts, behind a narrow interface.
//!
//! [`Store`] is exactly what the call pipeline needs of a ledger: claim, reopen, renew, write an
//! effect ahead and record its answer, record an attempt (and finish the operation), resolve, and
//! read committed state. Nothing in it assumes that one process owns the store: a claim, a take-over
//! and every fence check are decided by the store. [`Ledger`] is the handle the host holds, cheap to
//! clone, over any store. Three backends implement it:
//!
//! - `redb/`: the embedded redb file (group commit, claims in memory until their first durable
//!   write: an optimisation one process owning the file allows, and that the trait does not see);
//! - `postgres/`: a PostgreSQL database shared by many hosts (every claim, take-over and fence
//!   decided by the database, in the transaction that writes it; nothing recovered at connect);
//! - `reference`: a plain in-memory model written to be obviously right, the oracle the conformance
//!   suite and the model-based test compare the other backends with.
//!
//! The rules every backend applies (who gets an operation, when a finish is refused) live here,
//! in [`verdict`] and [`refused_finish`], once; what keeps a run open is `run_state`'s.
//!
//! Beside the ledger: `secret`, the fingerprint key kept beside it, and its rotation; `seal`, an
//! approval's sensitive params sealed under that key. No wasmtime: the ledger knows records, not
//! components.

mod error;
mod latency;
mod location;
pub mod postgres;
mod records;
pub mod redb;
pub mod reference;
pub mod run_state;
pub mod seal;
pub mod secret;

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

pub use error::LedgerError;
pub use latency::{Latency, LatencySnapshot};
pub use location::LedgerAt;
pub use records::*;
pub use run_state::{Open, Why};

/// How often a caller waiting for another caller's operation looks again, on a store that
/// cannot announce changes ([`Store::changed`]).
pub const POLL: std::time::Duration = std::time::Duration::from_millis(25);

/// A boxed future, so that [`Store`] can be a trait object.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// An operation's final state, its output (JSON) and its error, recorded with its last attempt.
pub type Finish = (OperationStatus, Option<String>, Option<ErrorRecord>);

/// A KV key's committed value and version.
pub type KvEntry = (Vec<u8>, u64);

/// Local effects an attempt made, to commit with its next durable write: (record, write) in order.
pub type Staged = Vec<(EffectRecord, LocalWrite)>;

/// What a caller brings to claim an operation.
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    pub key: String,
    pub run_id: String,
    pub step_id: String,
    pub tool: String,
    pub class: oncebox_core::policy::ReplayClass,
    pub fingerprint: String,
    /// The same request's fingerprints under the ledger's older secrets (empty unless its key was
    /// rotated): an operation recorded under one of them is this request, not a conflict.
    pub older_fingerprints: Vec<String>,
    pub args: serde_json::Value,
    pub owner: String,
    pub now_ms: u64,
    pub lease_ms: u64,
    /// For a tool that needs approval: the approval the caller saw approve these params, and the
    /// component it will run. A new operation is claimed only while that approval still stands
    /// (same revision, not expired, bound to that component: [`approval_stands`]), checked by the
    /// store with the claim (`Claim::ApprovalChanged` otherwise).
    pub approval: Option<SeenApproval>,
}

/// What a caller of a tool that needs approval brings to its claim: the approval it saw let the
/// call through, and the code it is about to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenApproval {
    /// The approval's revision as the caller read it (0: none was needed, because the step is
    /// on record or expired, so no new operation may be claimed under it).
    pub revision: u32,
    /// The digest of the component the caller will run (`LoadedTool::digest`): the approval must
    /// be bound to it, so that a tool replaced since the decision does not run under it.
    pub component: String,
}

/// A request for approval that retention removes, as retention read it: removed only if it is
/// still at that revision (a decision since makes it another request) and its operation was not
/// claimed meanwhile (its approval then stays with it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleApproval {
    pub operation_key: String,
    pub revision: u32,
}

impl StaleApproval {
    pub fn of(record: &ApprovalRecord) -> Self {
        StaleApproval { operation_key: record.operation_key.clone(), revision: record.revision }
    }
}

/// What [`Store::expire`] removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Removed {
    /// Operations (with their attempts, effects and approvals).
    pub operations: usize,
    /// Requests for approval without an operation (of the [`StaleApproval`]s given).
    pub approvals: usize,
}

impl ClaimRequest {
    /// Whether an operation recorded with `fingerprint` was asked for with these args.
    pub fn matches(&self, fingerprint: &str) -> bool {
        self.fingerprint == fingerprint || self.older_fingerprints.iter().any(|older| older == fingerprint)
    }
}

/// An attempt's view of the ledger, bound to its operation and its fence: the effects read and
/// write their own records through it, never another operation's, and every write carries the
/// fence without the effect having to know it.
#[derive(Debug, Clone)]
pub struct Journal {
    ledger: Ledger,
    operation_key: String,
    fence: u64,
}

impl Journal {
    pub fn operation_key(&self) -> &str {
        &self.operation_key
    }

    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// This operation's record of the effect `effect_key`.
    pub async fn effect(&self, effect_key: &str) -> Result<Option<EffectRecord>, LedgerError> {
        self.ledger.effect(&self.operation_key, effect_key).await
    }

    /// Writes one of this operation's effect records (see [`Store::put_effect`]).
    pub async fn write(
        &self,
        effect: &EffectRecord,
        expected: Option<(EffectStatus, u32)>,
        staged: Staged,
    ) -> Result<(), LedgerError> {
        if effect.operation_key != self.operation_key {
            let (operation_key, fence) = (effect.operation_key.clone(), self.fence);
            return Err(LedgerError::Fenced { operation_key, fence, current: 0 });
        }
        self.ledger.put_effect(self.fence, effect, expected, staged).await
    }

    /// Every effect this operation has on record.
    pub async fn effects(&self) -> Result<Vec<EffectRecord>, LedgerError> {
        self.ledger.effects(&self.operation_key).await
    }

    /// What a local effect's key already holds in this operation.
    pub async fn local_state(&self, effect: &EffectRecord) -> Result<LocalOutcome, LedgerError> {
        self.ledger.local_effect_state(effect).await
    }
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
    /// The operation's records expired and were removed (retention): running the step again
    /// could repeat its effect, so it is not run as new.
    Expired(Tombstone),
    /// The approval the caller saw changed (rejected, expired, decided again) or is being
    /// decided: nothing was claimed; look at the approval again.
    ApprovalChanged,
}

/// A local effect, applied in the same transaction as its record.
#[derive(Debug, Clone)]
pub enum LocalWrite {
    /// `expected`: write only if the key still has this version when the write commits (0: the
    /// key must not exist); else the write is refused (`KvConflict`).
    KvSet {
        namespace: String,
        key: String,
        value: Vec<u8>,
        expected: Option<u64>,
    },
    KvDelete {
        namespace: String,
        key: String,
    },
    Outbox {
        topic: String,
        payload: String,
    },
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

/// What the call pipeline needs of a ledger, and nothing more. Every write carries the fencing
/// token of the claim that makes it and is refused (`Fenced`) once another caller took the
/// operation over; every write is durable when its future resolves `Ok`, and nothing of a write
/// that resolves `Err` was recorded. Reads see committed state.
pub trait Store: Send + Sync + 'static {
    /// Names the store in messages (a file's path, `:memory:`).
    fn name(&self) -> &Path;

    /// Decides, atomically, who runs an operation ([`verdict`]); a new or expired claim goes to
    /// this caller with a fence no owner of the operation ever held.
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, LedgerError>>;

    /// Takes over an unknown operation to resend its in-doubt effects with their keys, if every
    /// one of them is in `resendable` (effect keys the caller judged resendable); otherwise
    /// answers with the record. The store checks the effects again itself.
    fn reopen<'a>(
        &'a self,
        req: &'a ClaimRequest,
        resendable: Vec<String>,
    ) -> BoxFuture<'a, Result<Claim, LedgerError>>;

    /// Extends the lease of `fence`'s claim to `until_ms` (never shortens it).
    fn renew<'a>(&'a self, key: &'a str, fence: u64, until_ms: u64) -> BoxFuture<'a, Result<(), LedgerError>>;

    /// Writes an effect record (write-ahead `dispatched`, or its answer) with the local effects
    /// staged before it, as a compare-and-set: `expected` is the effect's (status, dispatches) as
    /// the writer last saw them, `None` if it must be new (else `EffectChanged`).
    fn put_effect<'a>(
        &'a self,
        fence: u64,
        effect: &'a EffectRecord,
        expected: Option<(EffectStatus, u32)>,
        staged: Staged,
    ) -> BoxFuture<'a, Result<(), LedgerError>>;

    /// Records one attempt, the local effects it staged and, when the call is over, the
    /// operation's final state, together. A finish the rule of evidence forbids is refused
    /// ([`refused_finish`]); a versioned KV write whose key moved on is refused (`KvConflict`).
    fn record_attempt<'a>(
        &'a self,
        fence: u64,
        attempt: &'a AttemptRecord,
        finish: Option<Finish>,
        now_ms: u64,
        staged: Staged,
    ) -> BoxFuture<'a, Result<(), LedgerError>>;

    /// Settles an unknown operation ([`settled`]): `committed` completes it, settling every effect
    /// of it in doubt; `not-committed` settles one effect in doubt (`effect_key`, or the only one),
    /// and the operation reopens for the next call once nothing else of it is in doubt.
    /// `seen`: the named effect's dispatches as the caller read them (reconcile asked the
    /// authority about that send); a settlement of an effect sent again since is refused.
    fn resolve<'a>(
        &'a self,
        operation_key: &'a str,
        effect_key: Option<&'a str>,
        seen: Option<u32>,
        resolution: &'a Resolution,
        settlement: &'a Settlement,
    ) -> BoxFuture<'a, Result<OperationRecord, LedgerError>>;

    fn operation<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<OperationRecord>, LedgerError>>;

    /// All operations, or a run's, in key order.
    fn operations<'a>(&'a self, run_id: Option<&'a str>) -> BoxFuture<'a, Result<Vec<OperationRecord>, LedgerError>>;

    /// The claims not yet recorded (in flight), all or a run's, in key order: an operation
    /// claimed and not yet written to, which reads of operations do not show (redb keeps it in
    /// this process's memory; PostgreSQL keeps its row unrecorded, every host's). Once recorded,
    /// it is an ordinary operation and no longer listed. What keeps a run open counts them
    /// ([`run_state`]): a step about to take effect.
    fn in_flight<'a>(&'a self, run_id: Option<&'a str>) -> BoxFuture<'a, Result<Vec<OperationRecord>, LedgerError>>;

    fn effect<'a>(
        &'a self,
        operation_key: &'a str,
        effect_key: &'a str,
    ) -> BoxFuture<'a, Result<Option<EffectRecord>, LedgerError>>;

    /// An operation's effects, in the order they were first dispatched.
    fn effects<'a>(&'a self, operation_key: &'a str) -> BoxFuture<'a, Result<Vec<EffectRecord>, LedgerError>>;

    /// An operation's attempts, in order.
    fn attempts<'a>(&'a self, operation_key: &'a str) -> BoxFuture<'a, Result<Vec<AttemptRecord>, LedgerError>>;

    /// A KV key's committed value and version.
    fn kv_entry<'a>(&'a self, namespace: &'a str, key: &'a str) -> BoxFuture<'a, Result<Option<KvEntry>, LedgerError>>;

    /// Every outbox message, in the order enqueued.
    fn outbox(&self) -> BoxFuture<'_, Result<Vec<OutboxMessage>, LedgerError>>;

    /// The request for approval of an operation (by operation key), if any.
    fn approval<'a>(&'a self, operation_key: &'a str) -> BoxFuture<'a, Result<Option<ApprovalRecord>, LedgerError>>;

    /// All requests for approval, or a run's, in operation key order.
    fn approvals<'a>(&'a self, run_id: Option<&'a str>) -> BoxFuture<'a, Result<Vec<ApprovalRecord>, LedgerError>>;

    /// Writes a request for approval as a compare-and-set on its revision: `record.revision` must
    /// be the stored one plus 1 (1 for a new request), else `ApprovalChanged` and nothing written.
    /// Refused (`ApprovalClosed`) once the operation is claimed or recorded: what it ran under
    /// can no longer change. Atomic with [`Store::claim`]: a claim and a decision never both win.
    fn put_approval<'a>(&'a self, record: &'a ApprovalRecord) -> BoxFuture<'a, Result<(), LedgerError>>;

    /// What retention left of a removed operation, if it was removed.
    fn tombstone<'a>(&'a self, operation_key: &'a str) -> BoxFuture<'a, Result<Option<Tombstone>, LedgerError>>;

    /// Removes operations whose records expired, with their attempts, effects and approvals,
    /// leaving a tombstone for each (a later claim of it is answered `Expired`), and the
    /// requests for approval of `approvals` (keys without an operation) that are still at the
    /// revision given and whose operation is not claimed, not even in memory ([`StaleApproval`]):
    /// atomic with [`Store::claim`] and [`Store::put_approval`], as a decision is. Refuses all
    /// (`NotExpirable`) if one of the operations is not completed or failed. Answers how many
    /// operations and requests it removed.
    fn expire<'a>(
        &'a self,
        tombstones: &'a [Tombstone],
        approvals: &'a [StaleApproval],
    ) -> BoxFuture<'a, Result<Removed, LedgerError>>;

    /// Whether other hosts may use this store at the same time (a database), rather than one
    /// process owning it (a file).
    fn is_shared(&self) -> bool {
        false
    }

    /// The clock that stamps this store's records and judges its leases and settle windows (ms
    /// since the epoch): the host's own for a store one process owns; for one that hosts share,
    /// the database's, so that hosts whose clocks disagree still agree on when a lease ran out or
    /// a settle window passed.
    fn now_ms(&self) -> u64 {
        oncebox_core::clock::now_ms()
    }

    /// Binds the store to the hosts' fingerprint key, named by [`oncebox_core::keys::FingerprintKey::ids`]
    /// (newest first): a store shared by hosts remembers the newest id it was given, follows a
    /// rotation (a host whose older ids hold it), and refuses (`KeyMismatch`) a host with another
    /// key, whose fingerprints would never match the others'. A store of one process has its key
    /// file beside it and checks nothing.
    fn bind_key<'a>(&'a self, ids: &'a [String]) -> BoxFuture<'a, Result<(), LedgerError>> {
        let _ = ids;
        Box::pin(async { Ok(()) })
    }

    /// Durable commits so far, for a store that counts them (group commit shares them).
    fn commits(&self) -> u64 {
        0
    }

    /// Resolves when operation `key` may have changed (ended, settled, taken over), and at the
    /// latest after `timeout` (the caller's wait, or what is left of the owner's lease): a caller
    /// waiting for another caller's operation looks again as soon as that is worth it. A store
    /// that cannot tell polls: it resolves after [`POLL`] at most (cheap for a store in this
    /// process's memory; a store that many waiters poll over a network should announce changes).
    fn changed<'a>(&'a self, key: &'a str, timeout: std::time::Duration) -> BoxFuture<'a, ()> {
        let _ = key;
        Box::pin(tokio::time::sleep(timeout.min(POLL)))
    }

    // Outbox delivery: the relay (`crate::outbox`) reads a topic's head and records each send.

    /// Up to `limit` of `topic`'s undelivered messages, in the order they were enqueued (a
    /// refused message is still undelivered: it stays at the head).
    fn outbox_pending<'a>(
        &'a self,
        topic: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<OutboxMessage>, LedgerError>>;

    /// Records one send of message `seq` and its answer ([`Delivery::after`]): a delivered message
    /// leaves its topic's pending messages; an answer about a message already delivered changes
    /// nothing. Answers the message as recorded; `NoSuchMessage` for a sequence number never enqueued.
    fn record_delivery<'a>(
        &'a self,
        seq: u64,
        answer: &'a DeliveryAnswer,
    ) -> BoxFuture<'a, Result<OutboxMessage, LedgerError>>;

    /// Records the background reconciler's tries of operation `key` while it is unknown: true if
    /// written, false if it is not unknown any more (settled, reopened, or gone), which is no
    /// error. Nothing else of the record changes.
    fn note_reconcile<'a>(&'a self, key: &'a str, note: &'a ReconcileNote) -> BoxFuture<'a, Result<bool, LedgerError>>;

    /// Takes or renews `owner`'s lease named `name` for `lease_ms`, judged by the store's clock:
    /// true while `owner` holds it, false while another owner's lease is live. What hosts sharing
    /// a ledger must do one at a time holds one: a topic's outbox relay (`outbox/TOPIC`: two would
    /// each send its head), the reconciling of an operation (`reconcile/KEY`). A store that one
    /// process owns has one of each by construction, and answers true.
    fn lease<'a>(&'a self, name: &'a str, owner: &'a str, lease_ms: u64) -> BoxFuture<'a, Result<bool, LedgerError>> {
        let _ = (name, owner, lease_ms);
        Box::pin(async { Ok(true) })
    }

    /// Gives up `owner`'s lease named `name` (a clean stop, a try done), so another host takes
    /// it at once instead of after the lease.
    fn release<'a>(&'a self, name: &'a str, owner: &'a str) -> BoxFuture<'a, Result<(), LedgerError>> {
        let _ = (name, owner);
        Box::pin(async { Ok(()) })
    }
}

/// The host's handle on its ledger: cheap to clone, over any [`Store`].
#[derive(Clone)]
pub struct Ledger {
    store: Arc<dyn Store>,
    /// Counts commits that enqueued outbox messages through this handle (and its clones), so that
    /// an in-process relay waits for new messages instead of polling the store.
    enqueued: Arc<tokio::sync::watch::Sender<u64>>,
    /// How long this handle's durable writes took (effects, attempts, resolutions, approvals).
    latency: Arc<Latency>,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger").field("store", &self.store.name()).finish()
    }
}

impl Ledger {
    /// Opens (or creates) the redb ledger at `path` and recovers what a stopped host left behind:
    /// effects written ahead but never answered become `unknown`, operations holding one become
    /// `unknown`, and the other claims lose their lease so the next call takes them over.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, LedgerError> {
        Ok(Ledger::on(redb::RedbStore::open(path)?))
    }

    /// Opens (or creates) a redb ledger over any redb storage backend (`name` names it in
    /// messages), recovering as [`Ledger::open`] does: for a backend that fails on command in a
    /// test, or an embedder's own storage.
    pub fn open_on(backend: impl ::redb::StorageBackend, name: impl AsRef<Path>) -> Result<Self, LedgerError> {
        Ok(Ledger::on(redb::RedbStore::open_on(backend, name)?))
    }

    /// A redb ledger that lives in memory and dies with the process: for `inspect` and for
    /// running a tool in isolation in a test.
    pub fn in_memory() -> Result<Self, LedgerError> {
        Ok(Ledger::on(redb::RedbStore::in_memory()?))
    }

    /// A handle on `store`.
    pub fn on(store: impl Store) -> Self {
        Ledger {
            store: Arc::new(store),
            enqueued: Arc::new(tokio::sync::watch::Sender::new(0)),
            latency: Arc::new(Latency::default()),
        }
    }

    pub fn path(&self) -> &Path {
        self.store.name()
    }

    /// Whether other hosts may use this ledger at the same time ([`Store::is_shared`]).
    pub fn is_shared(&self) -> bool {
        self.store.is_shared()
    }

    /// The clock of this ledger's records, leases and settle windows (see [`Store::now_ms`]).
    pub fn now_ms(&self) -> u64 {
        self.store.now_ms()
    }

    /// See [`Store::bind_key`].
    pub async fn bind_key(&self, ids: &[String]) -> Result<(), LedgerError> {
        self.store.bind_key(ids).await
    }

    /// Durable write transactions committed since this ledger was opened, where the store counts
    /// them. Concurrent writes share one, so under load this grows slower than the number of writes.
    pub fn commits(&self) -> u64 {
        self.store.commits()
    }

    /// How long the durable writes through this handle (and its clones) took.
    pub fn commit_latency(&self) -> LatencySnapshot {
        self.latency.snapshot()
    }

    /// Times one durable write.
    async fn timed<T>(&self, write: impl std::future::Future<Output = T>) -> T {
        let started = std::time::Instant::now();
        let done = write.await;
        self.latency.record(started.elapsed());
        done
    }

    pub async fn claim(&self, req: &ClaimRequest) -> Result<Claim, LedgerError> {
        self.store.claim(req).await
    }

    /// See [`Store::changed`].
    pub async fn changed(&self, key: &str, timeout: std::time::Duration) {
        self.store.changed(key, timeout).await
    }

    /// The journal of the owner of `fence` for `operation_key`, for its effects.
    pub fn journal(&self, operation_key: &str, fence: u64) -> Journal {
        Journal { ledger: self.clone(), operation_key: operation_key.to_string(), fence }
    }

    /// See [`Store::reopen`]: `resendable` judges each in-doubt effect.
    pub async fn reopen(&self, req: &ClaimRequest, resendable: Vec<String>) -> Result<Claim, LedgerError> {
        self.store.reopen(req, resendable).await
    }

    pub async fn renew(&self, key: &str, fence: u64, until_ms: u64) -> Result<(), LedgerError> {
        self.store.renew(key, fence, until_ms).await
    }

    pub async fn put_effect(
        &self,
        fence: u64,
        effect: &EffectRecord,
        expected: Option<(EffectStatus, u32)>,
        staged: Staged,
    ) -> Result<(), LedgerError> {
        let enqueues = enqueues(&staged);
        self.timed(self.store.put_effect(fence, effect, expected, staged)).await?;
        self.enqueued_if(enqueues);
        Ok(())
    }

    pub async fn record_attempt(
        &self,
        fence: u64,
        attempt: &AttemptRecord,
        finish: Option<Finish>,
        now_ms: u64,
        staged: Staged,
    ) -> Result<(), LedgerError> {
        let enqueues = enqueues(&staged);
        self.timed(self.store.record_attempt(fence, attempt, finish, now_ms, staged)).await?;
        self.enqueued_if(enqueues);
        Ok(())
    }

    pub async fn resolve(
        &self,
        operation_key: &str,
        effect_key: Option<&str>,
        seen: Option<u32>,
        resolution: &Resolution,
        settlement: &Settlement,
    ) -> Result<OperationRecord, LedgerError> {
        self.timed(self.store.resolve(operation_key, effect_key, seen, resolution, settlement)).await
    }

    pub async fn operation(&self, key: &str) -> Result<Option<OperationRecord>, LedgerError> {
        self.store.operation(key).await
    }

    pub async fn operations(&self, run_id: Option<&str>) -> Result<Vec<OperationRecord>, LedgerError> {
        self.store.operations(run_id).await
    }

    /// See [`Store::in_flight`].
    pub async fn in_flight(&self, run_id: Option<&str>) -> Result<Vec<OperationRecord>, LedgerError> {
        self.store.in_flight(run_id).await
    }

    /// What keeps each run (or `run`) open at `now_ms`, by the one rule ([`run_state`]); a closed
    /// run is absent. The claims in flight are read before the operations: a claim recorded in
    /// between is then read as the operation it became, never missed by both reads.
    pub async fn open_runs(
        &self,
        run: Option<&str>,
        now_ms: u64,
    ) -> Result<std::collections::BTreeMap<String, Vec<Open>>, LedgerError> {
        let in_flight = self.in_flight(run).await?;
        let operations = self.operations(run).await?;
        let approvals = self.approvals(run).await?;
        Ok(run_state::open_runs(&operations, &in_flight, &approvals, now_ms))
    }

    pub async fn effect(&self, operation_key: &str, effect_key: &str) -> Result<Option<EffectRecord>, LedgerError> {
        self.store.effect(operation_key, effect_key).await
    }

    pub async fn effects(&self, operation_key: &str) -> Result<Vec<EffectRecord>, LedgerError> {
        self.store.effects(operation_key).await
    }

    pub async fn attempts(&self, operation_key: &str) -> Result<Vec<AttemptRecord>, LedgerError> {
        self.store.attempts(operation_key).await
    }

    pub async fn kv_entry(&self, namespace: &str, key: &str) -> Result<Option<KvEntry>, LedgerError> {
        self.store.kv_entry(namespace, key).await
    }

    pub async fn kv_get(&self, namespace: &str, key: &str) -> Result<Option<Vec<u8>>, LedgerError> {
        Ok(self.kv_entry(namespace, key).await?.map(|(value, _)| value))
    }

    /// A KV key's committed version (0: absent).
    pub async fn kv_version(&self, namespace: &str, key: &str) -> Result<u64, LedgerError> {
        Ok(self.kv_entry(namespace, key).await?.map_or(0, |(_, version)| version))
    }

    pub async fn outbox(&self) -> Result<Vec<OutboxMessage>, LedgerError> {
        self.store.outbox().await
    }

    pub async fn approval(&self, operation_key: &str) -> Result<Option<ApprovalRecord>, LedgerError> {
        self.store.approval(operation_key).await
    }

    pub async fn approvals(&self, run_id: Option<&str>) -> Result<Vec<ApprovalRecord>, LedgerError> {
        self.store.approvals(run_id).await
    }

    pub async fn put_approval(&self, record: &ApprovalRecord) -> Result<(), LedgerError> {
        self.timed(self.store.put_approval(record)).await
    }

    pub async fn tombstone(&self, operation_key: &str) -> Result<Option<Tombstone>, LedgerError> {
        self.store.tombstone(operation_key).await
    }

    pub async fn expire(&self, tombstones: &[Tombstone], approvals: &[StaleApproval]) -> Result<Removed, LedgerError> {
        self.store.expire(tombstones, approvals).await
    }

    /// Changes each time a commit through this ledger enqueued outbox messages: a relay marks
    /// what it has seen, reads the pending messages, and waits for the next change.
    pub fn outbox_enqueued(&self) -> tokio::sync::watch::Receiver<u64> {
        self.enqueued.subscribe()
    }

    fn enqueued_if(&self, enqueues: bool) {
        if enqueues {
            self.enqueued.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// See [`Store::outbox_pending`].
    pub async fn outbox_pending(&self, topic: &str, limit: usize) -> Result<Vec<OutboxMessage>, LedgerError> {
        self.store.outbox_pending(topic, limit).await
    }

    /// See [`Store::note_reconcile`].
    pub async fn note_reconcile(&self, key: &str, note: &ReconcileNote) -> Result<bool, LedgerError> {
        self.store.note_reconcile(key, note).await
    }

    /// See [`Store::lease`].
    pub async fn lease(&self, name: &str, owner: &str, lease: std::time::Duration) -> Result<bool, LedgerError> {
        let lease_ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
        self.store.lease(name, owner, lease_ms).await
    }

    /// See [`Store::release`].
    pub async fn release(&self, name: &str, owner: &str) -> Result<(), LedgerError> {
        self.store.release(name, owner).await
    }

    /// Records that the endpoint acknowledged message `seq` at `at_ms`.
    pub async fn mark_delivered(&self, seq: u64, at_ms: u64) -> Result<OutboxMessage, LedgerError> {
        self.store.record_delivery(seq, &DeliveryAnswer::Delivered { at_ms }).await
    }

    /// Records a send of message `seq` that did not deliver it: what was seen, and whether the
    /// endpoint refused it definitively.
    pub async fn record_delivery_failure(
        &self,
        seq: u64,
        at_ms: u64,
        error: &str,
        refused: bool,
    ) -> Result<OutboxMessage, LedgerError> {
        let answer = DeliveryAnswer::NotDelivered { at_ms, error: error.to_string(), refused };
        self.store.record_delivery(seq, &answer).await
    }

    /// What a local effect's key already holds: nothing (stage it), the same request (already
    /// applied by an earlier attempt), or another one (the tool diverged).
    pub async fn local_effect_state(&self, effect: &EffectRecord) -> Result<LocalOutcome, LedgerError> {
        Ok(match self.effect(&effect.operation_key, &effect.key).await? {
            None => LocalOutcome::Applied,
            Some(existing) if existing.fingerprint != effect.fingerprint => LocalOutcome::Diverged(Box::new(existing)),
            Some(_) => LocalOutcome::AlreadyApplied,
        })
    }
}

/// Whether a write carries outbox messages.
fn enqueues(staged: &Staged) -> bool {
    staged.iter().any(|(_, write)| matches!(write, LocalWrite::Outbox { .. }))
}

/// What an operation's record (or its absence) means for a caller that wants to run it.
/// `None`: the caller takes it (new, or its lease expired).
pub fn verdict(existing: Option<&OperationRecord>, req: &ClaimRequest) -> Option<Claim> {
    let op = existing?;
    if !req.matches(&op.fingerprint) {
        Some(Claim::Conflict(op.clone()))
    } else if op.status != OperationStatus::Claimed {
        Some(Claim::Recorded(op.clone()))
    } else if op.lease_until_ms > req.now_ms {
        Some(Claim::InProgress(op.clone()))
    } else {
        None
    }
}

/// The rule of evidence for an operation's end, whoever asks: an operation with an effect in
/// doubt is neither completed nor failed, and one with an effect that took place is not failed.
/// `effects` are every effect of the operation the finish would leave recorded.
pub fn refused_finish<'e>(
    operation_key: &str,
    status: OperationStatus,
    effects: impl IntoIterator<Item = &'e EffectRecord>,
) -> Option<LedgerError> {
    if !matches!(status, OperationStatus::Completed | OperationStatus::Failed) {
        return None;
    }
    let failing = status == OperationStatus::Failed;
    let effect = effects.into_iter().find(|e| e.status.in_doubt() || (failing && e.status.taken()))?;
    let (operation_key, effect_key) = (operation_key.to_string(), effect.key.clone());
    Some(if effect.status.in_doubt() {
        LedgerError::InDoubt { operation_key, effect_key }
    } else {
        LedgerError::EffectTaken { operation_key, effect_key }
    })
}

/// Whether an approval write may replace `stored`: its revision follows the stored one.
pub fn approval_follows(stored: Option<&ApprovalRecord>, record: &ApprovalRecord) -> Result<(), LedgerError> {
    if record.revision == stored.map_or(0, |s| s.revision) + 1 {
        Ok(())
    } else {
        Err(LedgerError::ApprovalChanged { operation_key: record.operation_key.clone() })
    }
}

/// Whether a new operation for `req` may be claimed, given its approval as stored: only while the
/// approval the caller saw still approves these params, run by the caller's component, at
/// `req.now_ms`. An approval bound to another component (the tool was replaced since the request,
/// or the request predates components: bound to none) lets nothing through.
pub fn approval_stands(req: &ClaimRequest, stored: Option<&ApprovalRecord>) -> bool {
    match &req.approval {
        None => true,
        Some(seen) => stored.is_some_and(|a| {
            a.revision == seen.revision
                && req.matches(&a.fingerprint)
                && a.binds(&seen.component)
                && a.state == ApprovalState::Approved
                && !a.expired(req.now_ms)
        }),
    }
}

/// Whether retention may remove the request for approval `stored` it read as `stale`: still at
/// that revision, and its operation (`claimed`: claimed or recorded, in memory included) not
/// started meanwhile.
pub fn approval_lapses(stale: &StaleApproval, stored: Option<&ApprovalRecord>, claimed: bool) -> bool {
    !claimed && stored.is_some_and(|a| a.revision == stale.revision)
}

/// Refuses to expire an operation that is not over: only completed and failed ones expire.
pub fn expirable(op: &OperationRecord) -> Result<(), LedgerError> {
    match op.status {
        OperationStatus::Completed | OperationStatus::Failed => Ok(()),
        status => Err(LedgerError::NotExpirable { operation_key: op.key.clone(), status: status.as_str() }),
    }
}

/// The operation for `req`'s caller: an expired claim taken over with `fence`, or a new one
/// (whose fence is 1: no claim of it existed, so no token of it was ever handed out).
pub fn take_over(expired: Option<OperationRecord>, req: &ClaimRequest, fence: u64) -> OperationRecord {
    match expired {
        Some(mut op) => {
            op.fence = fence;
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
        reconciled: None,
    }
}

/// What settling an unknown operation makes of its records: the operation and the effects it
/// settles. `committed` is said of the whole operation (its output is the operation's): every
/// effect of it still in doubt is settled as taken and the operation completes, so that nothing
/// is left in doubt under a completed operation. `not-committed` is said of one effect in doubt
/// (`effect_key`, or the only one): it may be sent again, and once nothing else of the operation is
/// in doubt the operation reopens for the next call, which sends what was not taken (an
/// irreversible one fails instead: it is not sent again on anyone's word). `effects` are all of
/// the operation's effects.
pub fn settled(
    operation_key: &str,
    op: Option<OperationRecord>,
    effects: &[EffectRecord],
    effect_key: Option<&str>,
    seen: Option<u32>,
    resolution: &Resolution,
    settlement: &Settlement,
) -> Result<(OperationRecord, Vec<EffectRecord>), LedgerError> {
    let not_in_doubt = || LedgerError::NotInDoubt { operation_key: operation_key.to_string() };
    let mut op = op.ok_or_else(not_in_doubt)?;
    if op.status != OperationStatus::Unknown {
        return Err(not_in_doubt());
    }
    let in_doubt: Vec<&EffectRecord> = effects.iter().filter(|e| e.status.in_doubt()).collect();
    let any_taken = effects.iter().any(|e| e.status.taken());
    if let Some(wanted) = effect_key {
        let Some(effect) = in_doubt.iter().find(|e| e.key == wanted) else {
            return Err(LedgerError::NotInDoubt { operation_key: format!("{operation_key} (effect {wanted})") });
        };
        // What was asked about was one send; a later one may have committed since.
        if seen.is_some_and(|seen| seen != effect.dispatches) {
            let (operation_key, effect_key) = (operation_key.to_string(), wanted.to_string());
            return Err(LedgerError::EffectChanged { operation_key, effect_key });
        }
    }
    // The effects this settles. None in doubt: the tool itself reported the unknown outcome, and
    // the settlement is the operation's alone.
    let settled: Vec<&EffectRecord> = match (resolution, effect_key) {
        (Resolution::Committed { .. }, _) => in_doubt.clone(),
        (Resolution::NotCommitted, Some(wanted)) => in_doubt.iter().copied().filter(|e| e.key == wanted).collect(),
        (Resolution::NotCommitted, None) if in_doubt.len() > 1 => {
            let keys: Vec<&str> = in_doubt.iter().map(|e| e.key.as_str()).collect();
            return Err(LedgerError::Ambiguous { operation_key: operation_key.to_string(), effects: keys.join(", ") });
        }
        (Resolution::NotCommitted, None) => in_doubt.clone(),
    };
    let still_in_doubt = in_doubt.len() - settled.len();
    let now_ms = settlement.at_ms;
    op.updated_ms = now_ms;
    let effects = settled
        .into_iter()
        .cloned()
        .map(|mut effect| {
            effect.updated_ms = now_ms;
            effect.status = match resolution {
                Resolution::Committed { .. } => EffectStatus::Completed,
                Resolution::NotCommitted => EffectStatus::Retryable,
            };
            effect.resolution = Some(settlement.clone());
            effect
        })
        .collect();
    // Another effect still in doubt keeps the operation unknown: settle that one too.
    if still_in_doubt == 0 {
        op.lease_until_ms = 0;
        op.error = None;
        match resolution {
            Resolution::Committed { output } => {
                op.status = OperationStatus::Completed;
                op.output = Some(output.clone());
            }
            // An irreversible operation is not run again on anyone's word: its approval was for one
            // dispatch. Proven not taken, and nothing else of it taken, it failed: nothing of it
            // took effect. A new attempt is a new intent (a new step id, a new approval).
            Resolution::NotCommitted if op.class == oncebox_core::policy::ReplayClass::Irreversible => {
                if any_taken {
                    op.error = Some(ErrorRecord {
                        class: "unknown-outcome".into(),
                        message: "another effect of it took place: a person settles what it amounts to".into(),
                    });
                } else {
                    op.status = OperationStatus::Failed;
                    op.error = Some(ErrorRecord {
                        class: "not-committed".into(),
                        message: format!(
                            "proven not to have taken effect ({}); an irreversible step is not run again: a new \
                             intent needs a new step id and its own approval",
                            settlement.by
                        ),
                    });
                }
            }
            // Claimed with an expired lease: the next call takes it over and runs it again.
            Resolution::NotCommitted => op.status = OperationStatus::Claimed,
        }
    }
    Ok((op, effects))
}

/// The version a write stamps on its key: taken from its effect key, which no other write ever
/// has, so versions never repeat (and never come back after a delete). Never 0, which means absent.
pub fn stamp(effect_key: &str) -> u64 {
    let n = effect_key.get(..16).and_then(|hex| u64::from_str_radix(hex, 16).ok()).unwrap_or(1);
    n.max(1)
}
