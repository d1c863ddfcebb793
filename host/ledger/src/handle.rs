//! The host's handle on its ledger ([`Ledger`], over any [`Store`]) and an attempt's view of it
//! ([`Journal`]).

use std::path::Path;
use std::sync::Arc;

use crate::redb::RedbStore;
use crate::{
    ApprovalRecord, AttemptRecord, Claim, ClaimRequest, DeliveryAnswer, EffectRecord, EffectStatus, Finish, KvEntry,
    Latency, LatencySnapshot, LedgerError, LocalOutcome, LocalWrite, Open, OperationRecord, OutboxMessage,
    ReconcileNote, Removed, Resolution, Settlement, Staged, StaleApproval, Store, Tombstone,
};

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
        Ok(Ledger::on(RedbStore::open(path)?))
    }

    /// Opens (or creates) a redb ledger over any redb storage backend (`name` names it in
    /// messages), recovering as [`Ledger::open`] does: for a backend that fails on command in a
    /// test, or an embedder's own storage.
    pub fn open_on(backend: impl ::redb::StorageBackend, name: impl AsRef<Path>) -> Result<Self, LedgerError> {
        Ok(Ledger::on(RedbStore::open_on(backend, name)?))
    }

    /// A redb ledger that lives in memory and dies with the process: for `inspect` and for
    /// running a tool in isolation in a test.
    pub fn in_memory() -> Result<Self, LedgerError> {
        Ok(Ledger::on(RedbStore::in_memory()?))
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

    /// What keeps each run (or `run`) open at `now_ms`, by the one rule ([`run_state`](crate::run_state)); a closed
    /// run is absent. Read from the store's index of open work ([`Store::open_runs`]): O(open).
    pub async fn open_runs(
        &self,
        run: Option<&str>,
        now_ms: u64,
    ) -> Result<std::collections::BTreeMap<String, Vec<Open>>, LedgerError> {
        self.store.open_runs(run, now_ms).await
    }

    /// See [`Store::ended_before`].
    pub async fn ended_before(&self, cutoff_ms: u64) -> Result<Vec<OperationRecord>, LedgerError> {
        self.store.ended_before(cutoff_ms).await
    }

    /// See [`Store::approvals_before`].
    pub async fn approvals_before(&self, cutoff_ms: u64) -> Result<Vec<ApprovalRecord>, LedgerError> {
        self.store.approvals_before(cutoff_ms).await
    }

    /// [`Ledger::approvals_before`] computed from every request ([`crate::scan_approvals_before`]):
    /// for checks, as [`Ledger::open_runs_scanned`] is.
    pub async fn approvals_before_scanned(&self, cutoff_ms: u64) -> Result<Vec<ApprovalRecord>, LedgerError> {
        crate::scan_approvals_before(&*self.store, cutoff_ms).await
    }

    /// See [`Store::delivered_before`].
    pub async fn delivered_before(&self, cutoff_ms: u64) -> Result<Vec<OutboxMessage>, LedgerError> {
        self.store.delivered_before(cutoff_ms).await
    }

    /// [`Ledger::delivered_before`] computed from the whole outbox ([`crate::scan_delivered_before`]):
    /// for checks.
    pub async fn delivered_before_scanned(&self, cutoff_ms: u64) -> Result<Vec<OutboxMessage>, LedgerError> {
        crate::scan_delivered_before(&*self.store, cutoff_ms).await
    }

    /// See [`Store::prune_outbox`].
    pub async fn prune_outbox(&self, seqs: &[u64]) -> Result<crate::Pruned, LedgerError> {
        self.store.prune_outbox(seqs).await
    }

    /// One page of run ids in key order after `after` (the cursor: the last id of the previous
    /// page), at most `limit` ([`Store::runs_page`]).
    pub async fn runs_page(&self, after: Option<&str>, limit: usize) -> Result<Vec<String>, LedgerError> {
        self.store.runs_page(after, limit).await
    }

    /// [`Ledger::open_runs`] computed from every record instead of the store's index
    /// ([`crate::scan_open_runs`]): O(history). For checks: the conformance suite holds every
    /// backend's index to it.
    pub async fn open_runs_scanned(
        &self,
        run: Option<&str>,
        now_ms: u64,
    ) -> Result<std::collections::BTreeMap<String, Vec<Open>>, LedgerError> {
        crate::scan_open_runs(&*self.store, run, now_ms).await
    }

    /// The operations (recorded, not in flight) that are open at `now_ms` with `why` (e.g.
    /// unknown), in key order: read from the index, O(open).
    pub async fn open_operations(
        &self,
        now_ms: u64,
        why: impl Fn(&crate::Why) -> bool,
    ) -> Result<Vec<OperationRecord>, LedgerError> {
        let mut keys: Vec<String> = Vec::new();
        for reasons in self.open_runs(None, now_ms).await?.into_values() {
            keys.extend(reasons.into_iter().filter(|open| why(&open.why)).map(|open| open.operation_key));
        }
        keys.sort();
        keys.dedup();
        let mut ops = Vec::with_capacity(keys.len());
        for key in keys {
            if let Some(op) = self.operation(&key).await? {
                ops.push(op);
            }
        }
        Ok(ops)
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

    pub async fn tombstones(&self, run_id: &str) -> Result<Vec<Tombstone>, LedgerError> {
        self.store.tombstones(run_id).await
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

    /// See [`Store::enqueue_once`]; wakes the relay when it enqueued.
    pub async fn enqueue_once(&self, topic: &str, key: &str, payload: &str) -> Result<bool, LedgerError> {
        let enqueued = self.store.enqueue_once(topic, key, payload).await?;
        self.enqueued_if(enqueued);
        Ok(enqueued)
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
