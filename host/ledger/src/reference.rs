//! The reference model: the ledger's behaviour in the fewest, plainest lines, as the oracle that
//! the conformance suite and the model-based test hold the redb backend to. One mutex around a
//! few maps; every operation decided and applied under it, in the order the trait documents.
//!
//! It models what a caller of the redb backend can observe, no more: an operation claimed but not
//! yet written is invisible to reads and gone after a crash (redb keeps such claims in memory),
//! fences come from one counter for the whole ledger, and [`ReferenceStore::crash`] is what
//! reopening a redb file after a kill does. Its timestamps are the callers', so it has no clock.

use crate::ReconcileNote;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use super::DeliveryAnswer;
use super::{
    ApprovalRecord, Removed, StaleApproval, Tombstone, approval_follows, approval_lapses, approval_stands, expirable,
};
use super::{
    AttemptRecord, BoxFuture, Claim, ClaimRequest, EffectRecord, EffectStatus, Finish, KvEntry, LedgerError,
    LocalWrite, OperationRecord, OperationStatus, OutboxMessage, Resolution, Settlement, Staged, Store, refused_finish,
    settled, take_over, verdict,
};

#[derive(Debug, Default)]
pub struct ReferenceStore {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// Every operation, with whether anything of it was written yet.
    operations: BTreeMap<String, (OperationRecord, bool)>,
    /// (operation key, effect key) -> record.
    effects: BTreeMap<(String, String), EffectRecord>,
    /// (operation key, attempt number) -> record.
    attempts: BTreeMap<(String, u32), AttemptRecord>,
    /// (namespace, key) -> (value, version).
    kv: BTreeMap<(String, String), (Vec<u8>, u64)>,
    outbox: Vec<OutboxMessage>,
    /// The last outbox sequence number handed out (messages pruned keep theirs used).
    outbox_seq: u64,
    /// (topic, key) -> the sequence number of the notice enqueued under it (`enqueue_once`).
    notices: BTreeMap<(String, String), u64>,
    approvals: BTreeMap<String, ApprovalRecord>,
    tombstones: BTreeMap<String, Tombstone>,
    next_fence: u64,
}

impl Default for State {
    fn default() -> Self {
        State {
            operations: BTreeMap::new(),
            effects: BTreeMap::new(),
            attempts: BTreeMap::new(),
            kv: BTreeMap::new(),
            outbox: Vec::new(),
            outbox_seq: 0,
            notices: BTreeMap::new(),
            approvals: BTreeMap::new(),
            tombstones: BTreeMap::new(),
            next_fence: 2,
        }
    }
}

impl ReferenceStore {
    pub fn new() -> Self {
        ReferenceStore::default()
    }

    /// What a restart after a kill leaves, as `redb/open.rs` recovers it at `now_ms`: claims never
    /// written are gone; a written claim's effects that were sent and never answered become
    /// unknown, an operation holding one becomes unknown, and every other claim loses its lease.
    pub fn crash(&self, now_ms: u64) {
        let mut state = self.lock();
        state.operations.retain(|_, (_, written)| *written);
        let keys: Vec<String> = state.operations.keys().cloned().collect();
        for key in keys {
            if state.operations[&key].0.status != OperationStatus::Claimed {
                continue;
            }
            let effects = state.effects_of(&key);
            let attempts: Vec<AttemptRecord> = match crate::rules::reads_attempts(&effects) {
                true => state.attempts.iter().filter(|((op, _), _)| *op == key).map(|(_, a)| a.clone()).collect(),
                false => Vec::new(),
            };
            let recovered = crate::rules::recovered(state.operations[&key].0.clone(), effects, &attempts, now_ms);
            for effect in recovered.changed {
                state.effects.insert((key.clone(), effect.key.clone()), effect);
            }
            if let Some(attempt) = recovered.attempt {
                state.attempts.insert((key.clone(), attempt.attempt), attempt);
            }
            if let Some((op, _)) = state.operations.get_mut(&key) {
                *op = recovered.op;
            }
        }
        let highest = state.operations.values().map(|(op, _)| op.fence).max().unwrap_or(0);
        state.next_fence = highest.max(1) + 1;
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl State {
    fn fresh_fence(&mut self) -> u64 {
        let fence = self.next_fence;
        self.next_fence += 1;
        fence
    }

    /// The operation, if `fence` owns it (claimed with that fence).
    fn owned(&self, key: &str, fence: u64) -> Result<OperationRecord, LedgerError> {
        match self.operations.get(key) {
            Some((op, _)) if op.fence == fence && op.status == OperationStatus::Claimed => Ok(op.clone()),
            other => Err(LedgerError::Fenced {
                operation_key: key.to_string(),
                fence,
                current: other.map_or(0, |(op, _)| op.fence),
            }),
        }
    }

    fn effects_of(&self, key: &str) -> Vec<EffectRecord> {
        let mut effects: Vec<EffectRecord> =
            self.effects.iter().filter(|((op, _), _)| op == key).map(|(_, e)| e.clone()).collect();
        effects.sort_by(|a, b| a.first_dispatched_ms.cmp(&b.first_dispatched_ms).then(a.label.cmp(&b.label)));
        effects
    }

    /// The staged writes not recorded yet; refuses all if one diverged or its KV key moved on.
    fn unapplied(&self, key: &str, staged: &Staged) -> Result<Vec<(EffectRecord, LocalWrite)>, LedgerError> {
        let mut fresh = Vec::new();
        for (effect, write) in staged {
            match self.effects.get(&(key.to_string(), effect.key.clone())) {
                Some(existing) if existing.fingerprint == effect.fingerprint => {}
                Some(_) => {
                    return Err(LedgerError::Diverged {
                        operation_key: key.to_string(),
                        effect_key: effect.key.clone(),
                    });
                }
                None => {
                    if let LocalWrite::KvSet { namespace, key: kv_key, expected: Some(expected), .. } = write {
                        let found = self.kv.get(&(namespace.clone(), kv_key.clone())).map_or(0, |(_, v)| *v);
                        if found != *expected {
                            return Err(LedgerError::KvConflict { namespace: namespace.clone(), key: kv_key.clone() });
                        }
                    }
                    fresh.push((effect.clone(), write.clone()));
                }
            }
        }
        Ok(fresh)
    }

    fn apply(&mut self, key: &str, writes: Vec<(EffectRecord, LocalWrite)>) {
        for (effect, write) in writes {
            match write {
                LocalWrite::KvSet { namespace, key: kv_key, value, .. } => {
                    let version = super::stamp(&effect.key);
                    self.kv.insert((namespace, kv_key), (value, version));
                }
                LocalWrite::KvDelete { namespace, key: kv_key } => {
                    self.kv.remove(&(namespace, kv_key));
                }
                LocalWrite::Outbox { topic, payload } => {
                    self.outbox_seq += 1;
                    let seq = self.outbox_seq;
                    self.outbox.push(OutboxMessage::enqueued(seq, &effect, &topic, &payload));
                }
            }
            self.effects.insert((key.to_string(), effect.key.clone()), effect);
        }
    }

    fn write_operation(&mut self, op: OperationRecord) {
        self.operations.insert(op.key.clone(), (op, true));
    }
}

impl Store for ReferenceStore {
    fn name(&self) -> &Path {
        Path::new(":reference:")
    }

    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, LedgerError>> {
        Box::pin(async move {
            let mut state = self.lock();
            let existing = state.operations.get(&req.key).cloned();
            if let Some(answer) = verdict(existing.as_ref().map(|(op, _)| op), req) {
                return Ok(answer);
            }
            if existing.is_none()
                && let Some(tombstone) = state.tombstones.get(&req.key)
            {
                return Ok(Claim::Expired(tombstone.clone()));
            }
            if existing.is_none() && !approval_stands(req, state.approvals.get(&req.key)) {
                return Ok(Claim::ApprovalChanged);
            }
            let written = existing.as_ref().is_some_and(|(_, written)| *written);
            let fence = if existing.is_some() { state.fresh_fence() } else { 1 };
            let mut op = take_over(existing.map(|(op, _)| op), req, fence);
            op.status = OperationStatus::Claimed;
            let claim = Claim::Owned { fence: op.fence, previous_attempts: op.attempts };
            state.operations.insert(req.key.clone(), (op, written));
            Ok(claim)
        })
    }

    fn reopen<'a>(
        &'a self,
        req: &'a ClaimRequest,
        resendable: Vec<String>,
    ) -> BoxFuture<'a, Result<Claim, LedgerError>> {
        Box::pin(async move {
            let mut state = self.lock();
            let fence = state.fresh_fence();
            let op = match state.operations.get(&req.key) {
                Some((op, true)) => op.clone(),
                _ => return Err(LedgerError::NotInDoubt { operation_key: req.key.clone() }),
            };
            if !req.matches(&op.fingerprint) {
                return Ok(Claim::Conflict(op));
            }
            let in_doubt: Vec<EffectRecord> =
                state.effects_of(&req.key).into_iter().filter(|e| e.status.in_doubt()).collect();
            if op.status != OperationStatus::Unknown
                || in_doubt.is_empty()
                || !in_doubt.iter().all(|e| resendable.contains(&e.key))
            {
                return Ok(Claim::Recorded(op));
            }
            let mut op = take_over(Some(op), req, fence);
            op.status = OperationStatus::Claimed;
            op.error = None;
            let claim = Claim::Owned { fence: op.fence, previous_attempts: op.attempts };
            state.write_operation(op);
            Ok(claim)
        })
    }

    fn note_reconcile<'a>(&'a self, key: &'a str, note: &'a ReconcileNote) -> BoxFuture<'a, Result<bool, LedgerError>> {
        Box::pin(async move {
            let mut state = self.lock();
            match state.operations.get_mut(key) {
                Some((op, true)) if op.status == OperationStatus::Unknown => {
                    op.reconciled = Some(note.clone());
                    Ok(true)
                }
                _ => Ok(false),
            }
        })
    }

    fn renew<'a>(&'a self, key: &'a str, fence: u64, until_ms: u64) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(async move {
            let mut state = self.lock();
            let mut op = state.owned(key, fence)?;
            op.lease_until_ms = op.lease_until_ms.max(until_ms);
            if let Some(entry) = state.operations.get_mut(key) {
                entry.0 = op;
            }
            Ok(())
        })
    }

    fn put_effect<'a>(
        &'a self,
        fence: u64,
        effect: &'a EffectRecord,
        expected: Option<(EffectStatus, u32)>,
        staged: Staged,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(async move {
            let mut state = self.lock();
            let key = effect.operation_key.as_str();
            let op = state.owned(key, fence)?;
            let current = state.effects.get(&(key.to_string(), effect.key.clone())).map(|e| (e.status, e.dispatches));
            if current != expected {
                let (operation_key, effect_key) = (key.to_string(), effect.key.clone());
                return Err(LedgerError::EffectChanged { operation_key, effect_key });
            }
            let fresh = state.unapplied(key, &staged)?;
            state.write_operation(op);
            state.apply(key, fresh);
            state.effects.insert((key.to_string(), effect.key.clone()), effect.clone());
            Ok(())
        })
    }

    fn record_attempt<'a>(
        &'a self,
        fence: u64,
        attempt: &'a AttemptRecord,
        finish: Option<Finish>,
        now_ms: u64,
        staged: Staged,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(async move {
            let mut state = self.lock();
            let key = attempt.operation_key.as_str();
            let mut op = state.owned(key, fence)?;
            let fresh = state.unapplied(key, &staged)?;
            if let Some((status, _, _)) = &finish {
                let on_record = state.effects_of(key);
                let carried = fresh.iter().map(|(effect, _)| effect);
                if let Some(refusal) = refused_finish(key, *status, on_record.iter().chain(carried)) {
                    return Err(refusal);
                }
            }
            op.attempts = op.attempts.max(attempt.attempt);
            op.updated_ms = now_ms;
            if let Some((status, output, error)) = finish {
                op.status = status;
                op.output = output;
                op.error = error;
                op.lease_until_ms = 0;
            }
            state.write_operation(op);
            state.apply(key, fresh);
            state.attempts.insert((key.to_string(), attempt.attempt), attempt.clone());
            Ok(())
        })
    }

    fn resolve<'a>(
        &'a self,
        operation_key: &'a str,
        effect_key: Option<&'a str>,
        seen: Option<u32>,
        resolution: &'a Resolution,
        settlement: &'a Settlement,
    ) -> BoxFuture<'a, Result<OperationRecord, LedgerError>> {
        Box::pin(async move {
            let mut state = self.lock();
            let op = match state.operations.get(operation_key) {
                Some((op, true)) => Some(op.clone()),
                _ => None,
            };
            let effects = state.effects_of(operation_key);
            let (op, effects) = settled(operation_key, op, &effects, effect_key, seen, resolution, settlement)?;
            for effect in effects {
                state.effects.insert((operation_key.to_string(), effect.key.clone()), effect);
            }
            state.write_operation(op.clone());
            Ok(op)
        })
    }

    fn operation<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<OperationRecord>, LedgerError>> {
        Box::pin(async move {
            Ok(self.lock().operations.get(key).filter(|(_, written)| *written).map(|(op, _)| op.clone()))
        })
    }

    fn operations<'a>(&'a self, run_id: Option<&'a str>) -> BoxFuture<'a, Result<Vec<OperationRecord>, LedgerError>> {
        Box::pin(async move {
            let state = self.lock();
            let mut ops: Vec<OperationRecord> = state
                .operations
                .values()
                .filter(|(op, written)| *written && run_id.is_none_or(|run| op.run_id == run))
                .map(|(op, _)| op.clone())
                .collect();
            // A run's steps in step order (its index's order); all operations in key order.
            if run_id.is_some() {
                ops.sort_by(|a, b| (&a.step_id, &a.tool).cmp(&(&b.step_id, &b.tool)));
            }
            Ok(ops)
        })
    }

    fn in_flight<'a>(&'a self, run_id: Option<&'a str>) -> BoxFuture<'a, Result<Vec<OperationRecord>, LedgerError>> {
        Box::pin(async move {
            let state = self.lock();
            Ok(state
                .operations
                .values()
                .filter(|(op, written)| !*written && run_id.is_none_or(|run| op.run_id == run))
                .map(|(op, _)| op.clone())
                .collect())
        })
    }

    fn effect<'a>(
        &'a self,
        operation_key: &'a str,
        effect_key: &'a str,
    ) -> BoxFuture<'a, Result<Option<EffectRecord>, LedgerError>> {
        Box::pin(
            async move { Ok(self.lock().effects.get(&(operation_key.to_string(), effect_key.to_string())).cloned()) },
        )
    }

    fn effects<'a>(&'a self, operation_key: &'a str) -> BoxFuture<'a, Result<Vec<EffectRecord>, LedgerError>> {
        Box::pin(async move { Ok(self.lock().effects_of(operation_key)) })
    }

    fn attempts<'a>(&'a self, operation_key: &'a str) -> BoxFuture<'a, Result<Vec<AttemptRecord>, LedgerError>> {
        Box::pin(async move {
            let state = self.lock();
            Ok(state.attempts.iter().filter(|((op, _), _)| op == operation_key).map(|(_, a)| a.clone()).collect())
        })
    }

    fn kv_entry<'a>(&'a self, namespace: &'a str, key: &'a str) -> BoxFuture<'a, Result<Option<KvEntry>, LedgerError>> {
        Box::pin(async move { Ok(self.lock().kv.get(&(namespace.to_string(), key.to_string())).cloned()) })
    }

    fn outbox(&self) -> BoxFuture<'_, Result<Vec<OutboxMessage>, LedgerError>> {
        Box::pin(async move { Ok(self.lock().outbox.clone()) })
    }

    fn approval<'a>(&'a self, operation_key: &'a str) -> BoxFuture<'a, Result<Option<ApprovalRecord>, LedgerError>> {
        Box::pin(async move { Ok(self.lock().approvals.get(operation_key).cloned()) })
    }

    fn approvals<'a>(&'a self, run_id: Option<&'a str>) -> BoxFuture<'a, Result<Vec<ApprovalRecord>, LedgerError>> {
        Box::pin(async move {
            let state = self.lock();
            Ok(state.approvals.values().filter(|a| run_id.is_none_or(|run| a.run_id == run)).cloned().collect())
        })
    }

    fn put_approval<'a>(&'a self, record: &'a ApprovalRecord) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(async move {
            let mut state = self.lock();
            if state.operations.contains_key(&record.operation_key) {
                return Err(LedgerError::ApprovalClosed { operation_key: record.operation_key.clone() });
            }
            approval_follows(state.approvals.get(&record.operation_key), record)?;
            state.approvals.insert(record.operation_key.clone(), record.clone());
            Ok(())
        })
    }

    fn tombstone<'a>(&'a self, operation_key: &'a str) -> BoxFuture<'a, Result<Option<Tombstone>, LedgerError>> {
        Box::pin(async move { Ok(self.lock().tombstones.get(operation_key).cloned()) })
    }

    fn tombstones<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<Tombstone>, LedgerError>> {
        Box::pin(async move {
            Ok(self.lock().tombstones.values().filter(|tombstone| tombstone.run_id == run_id).cloned().collect())
        })
    }

    fn expire<'a>(
        &'a self,
        tombstones: &'a [Tombstone],
        approvals: &'a [StaleApproval],
    ) -> BoxFuture<'a, Result<Removed, LedgerError>> {
        Box::pin(async move {
            let mut state = self.lock();
            let mut removed = Removed::default();
            for tombstone in tombstones {
                if let Some((op, true)) = state.operations.get(&tombstone.operation_key) {
                    expirable(op)?;
                }
            }
            // Requests first, each only as retention read it and while its operation is not
            // claimed (a claim in memory counts: its call runs under that approval).
            let mut lapsed = Vec::new();
            for stale in approvals {
                let key = &stale.operation_key;
                let claimed = state.operations.contains_key(key);
                if approval_lapses(stale, state.approvals.get(key), claimed) {
                    state.approvals.remove(key);
                    removed.approvals += 1;
                    lapsed.push(key.as_str());
                }
            }
            // What this call removes, and the runs open by another key (a claim in memory
            // included, and a request that did not lapse), judged before anything goes.
            let removed_keys = crate::run_state::removing(tombstones, lapsed);
            let mut kept = std::collections::BTreeSet::new();
            for tombstone in tombstones {
                let Some((op, true)) = state.operations.get(&tombstone.operation_key) else { continue };
                let run = &op.run_id;
                let ops: Vec<OperationRecord> =
                    state.operations.values().filter(|(o, _)| &o.run_id == run).map(|(o, _)| o.clone()).collect();
                let asked: Vec<ApprovalRecord> =
                    state.approvals.values().filter(|a| &a.run_id == run).cloned().collect();
                let open = crate::run_state::open_keys(&ops, &asked);
                if !crate::run_state::removable(open.iter().map(String::as_str), &removed_keys) {
                    kept.insert(tombstone.operation_key.clone());
                }
            }
            for tombstone in tombstones {
                let key = &tombstone.operation_key;
                // A claim never written is invisible, as in redb: it is not expired.
                if matches!(state.operations.get(key), Some((_, false))) || kept.contains(key) {
                    continue;
                }
                if state.operations.remove(key).is_some() {
                    removed.operations += 1;
                }
                state.effects.retain(|(op, _), _| op != key);
                state.attempts.retain(|(op, _), _| op != key);
                state.approvals.remove(key);
                state.tombstones.insert(key.clone(), tombstone.clone());
            }
            Ok(removed)
        })
    }

    // Outbox delivery: the messages are the list above, each carrying its own delivery.

    fn outbox_pending<'a>(
        &'a self,
        topic: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<OutboxMessage>, LedgerError>> {
        Box::pin(async move {
            let state = self.lock();
            let pending = state.outbox.iter().filter(|m| m.topic == topic && !m.delivery.is_delivered());
            Ok(pending.take(limit).cloned().collect())
        })
    }

    fn enqueue_once<'a>(
        &'a self,
        topic: &'a str,
        key: &'a str,
        payload: &'a str,
    ) -> BoxFuture<'a, Result<bool, LedgerError>> {
        Box::pin(async move {
            let mut state = self.lock();
            let noticed = (topic.to_string(), key.to_string());
            if state.notices.contains_key(&noticed) {
                return Ok(false);
            }
            state.outbox_seq += 1;
            let seq = state.outbox_seq;
            state.notices.insert(noticed, seq);
            state.outbox.push(OutboxMessage::notice(seq, key, topic, payload, oncebox_core::clock::now_ms()));
            Ok(true)
        })
    }

    fn prune_outbox<'a>(&'a self, seqs: &'a [u64]) -> BoxFuture<'a, Result<crate::Pruned, LedgerError>> {
        Box::pin(async move {
            let mut state = self.lock();
            let mut pruned = crate::Pruned::default();
            for seq in seqs {
                let Some(at) = state.outbox.iter().position(|m| m.seq == *seq && m.delivery.is_delivered()) else {
                    continue;
                };
                let message = state.outbox.remove(at);
                pruned.messages += 1;
                let noticed = (message.topic, message.effect_key);
                if state.notices.get(&noticed) == Some(seq) {
                    state.notices.remove(&noticed);
                    pruned.notices += 1;
                }
            }
            Ok(pruned)
        })
    }

    fn record_delivery<'a>(
        &'a self,
        seq: u64,
        answer: &'a DeliveryAnswer,
    ) -> BoxFuture<'a, Result<OutboxMessage, LedgerError>> {
        Box::pin(async move {
            let mut state = self.lock();
            let message = state.outbox.iter_mut().find(|m| m.seq == seq).ok_or(LedgerError::NoSuchMessage { seq })?;
            message.delivery = message.delivery.after(answer);
            Ok(message.clone())
        })
    }
}
