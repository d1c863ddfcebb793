//! The write jobs: each runs on the writer thread inside a batch's transaction (`writer.rs`), and
//! each decides everything before it writes, so that a refusal leaves the shared transaction as it
//! found it.

use crate::ReconcileNote;
use redb::{ReadableTable, Table, WriteTransaction};

use super::open::keep_fence;
use super::open_index::reindex;
use super::tables::*;
use super::{
    Claim, ClaimRequest, EffectRecord, EffectStatus, ErrorRecord, LedgerError, Live, LocalWrite, OperationRecord,
    OperationStatus, OutboxMessage, Resolution, Settlement, Staged, encode, get, put, verdict,
};
use crate::{
    ApprovalRecord, Removed, StaleApproval, Tombstone, approval_follows, approval_lapses, expirable, refused_finish,
    settled, take_over,
};

/// Takes over an expired durable claim with `fence`, a token the ledger never handed out before.
pub(super) fn claim(txn: &WriteTransaction, req: &ClaimRequest, fence: u64) -> Result<Claim, LedgerError> {
    let mut records = txn.open_table(RECORDS)?;
    let existing: Option<OperationRecord> = get(&records, operation_id(&req.key))?;
    if let Some(answer) = verdict(existing.as_ref(), req) {
        return Ok(answer);
    }
    // The lease expired: the previous owner stalled or died.
    let mut op = take_over(existing, req, fence);
    op.status = OperationStatus::Claimed;
    put(&mut records, operation_id(&req.key), &op)?;
    drop(records);
    index_step(txn, &op)?;
    reindex(txn, &op.run_id, &[&req.key])?;
    keep_fence(txn, op.fence)?;
    Ok(Claim::Owned { fence: op.fence, previous_attempts: op.attempts })
}

/// Reopens an unknown operation for `req`'s caller with a new `fence`, when every effect it has
/// in doubt may be resent with its key (`resendable`, decided by the caller, who knows the
/// downstreams): the same-key resend the matrix allows. Anything else is answered as recorded.
pub(super) fn reopen(
    txn: &WriteTransaction,
    req: &ClaimRequest,
    fence: u64,
    resendable: &[String],
) -> Result<Claim, LedgerError> {
    let mut records = txn.open_table(RECORDS)?;
    let Some(op) = get::<_, OperationRecord>(&records, operation_id(&req.key))? else {
        return Err(LedgerError::NotInDoubt { operation_key: req.key.clone() });
    };
    if !req.matches(&op.fingerprint) {
        return Ok(Claim::Conflict(op));
    }
    let in_doubt: Vec<EffectRecord> =
        super::effects_of(&records, &req.key)?.into_iter().filter(|e| e.status.in_doubt()).collect();
    if op.status != OperationStatus::Unknown
        || in_doubt.is_empty()
        || !in_doubt.iter().all(|e| resendable.contains(&e.key))
    {
        return Ok(Claim::Recorded(op));
    }
    let mut op = take_over(Some(op), req, fence);
    op.status = OperationStatus::Claimed;
    op.error = None;
    put(&mut records, operation_id(&req.key), &op)?;
    drop(records);
    reindex(txn, &op.run_id, &[&req.key])?;
    keep_fence(txn, op.fence)?;
    Ok(Claim::Owned { fence: op.fence, previous_attempts: op.attempts })
}

/// Takes over a claim held in memory whose lease expired, on the writer thread so that it is
/// ordered with its owner's writes: the owner's first write reads the claim from memory here and
/// makes it durable, so if that write ran first (in this batch or an earlier one) the claim is
/// taken over as the durable one it became, and if not, the owner's write finds the new fence
/// and is refused. `None`: the claim is neither in memory nor durable any more; decide afresh.
pub(super) fn take_over_live(
    txn: &WriteTransaction,
    live: &Live,
    req: &ClaimRequest,
    fence: u64,
) -> Result<Option<Claim>, LedgerError> {
    if txn.open_table(RECORDS)?.get(operation_id(&req.key))?.is_some() {
        return claim(txn, req, fence).map(Some);
    }
    let mut live = live.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let Some(held) = live.get(&req.key) else { return Ok(None) };
    if let Some(answer) = verdict(Some(held), req) {
        return Ok(Some(answer));
    }
    let op = take_over(live.remove(&req.key), req, fence);
    let claim = Claim::Owned { fence: op.fence, previous_attempts: op.attempts };
    live.insert(req.key.clone(), op);
    Ok(Some(claim))
}

/// Extends the lease of the owner of `fence`, while it still owns the operation: the durable
/// claim, or the one held in memory. On the writer thread for the same reason as
/// [`take_over_live`]: a renewal made in memory while the owner's first write was on its way
/// would be lost when that write made the claim durable with the lease it read.
/// Writes the reconciler's note on operation `key` if it is unknown (see `Store::note_reconcile`).
pub(super) fn note_reconcile(txn: &WriteTransaction, key: &str, note: ReconcileNote) -> Result<bool, LedgerError> {
    let mut records = txn.open_table(RECORDS)?;
    let op: Option<OperationRecord> = get(&records, operation_id(key))?;
    match op {
        Some(mut op) if op.status == OperationStatus::Unknown => {
            op.reconciled = Some(note);
            put(&mut records, operation_id(key), &op)?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

pub(super) fn renew(
    txn: &WriteTransaction,
    live: &Live,
    key: &str,
    fence: u64,
    until_ms: u64,
) -> Result<bool, LedgerError> {
    let fenced = |current: Option<u64>| LedgerError::Fenced {
        operation_key: key.to_string(),
        fence,
        current: current.unwrap_or(0),
    };
    let mut records = txn.open_table(RECORDS)?;
    let op: Option<OperationRecord> = get(&records, operation_id(key))?;
    match op {
        Some(mut op) if op.fence == fence && op.status == OperationStatus::Claimed => {
            op.lease_until_ms = op.lease_until_ms.max(until_ms);
            put(&mut records, operation_id(key), &op)?;
            Ok(true)
        }
        Some(op) => Err(fenced(Some(op.fence))),
        None => {
            let mut live = live.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            match live.get_mut(key) {
                Some(op) if op.fence == fence => {
                    op.lease_until_ms = op.lease_until_ms.max(until_ms);
                    Ok(false)
                }
                op => Err(fenced(op.map(|op| op.fence))),
            }
        }
    }
}

/// A local effect on its way to the writer, its record already encoded.
pub(super) struct StagedWrite {
    effect: EffectRecord,
    bytes: Vec<u8>,
    write: LocalWrite,
}

pub(super) fn encode_staged(staged: Staged) -> Result<Vec<StagedWrite>, LedgerError> {
    staged.into_iter().map(|(effect, write)| Ok(StagedWrite { bytes: encode(&effect)?, effect, write })).collect()
}

/// The attempt (operation key, number, encoded record), its staged local effects and, when it was
/// the last, the operation's final state.
pub(super) fn record_attempt(
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
    let fresh = unapplied(txn, &records, key, staged)?;
    // The rule of evidence, enforced whoever asks (`ledger::refused_finish`). A first write has
    // no effect on disk to look at, only the local ones it carries.
    if let Some((status, _, _)) = &finish {
        let on_disk = if first_write { Vec::new() } else { super::effects_of(&records, key)? };
        let carried = fresh.iter().map(|write| &write.effect);
        if let Some(refusal) = refused_finish(key, *status, on_disk.iter().chain(carried)) {
            return Err(refusal);
        }
    }
    // Decided; from here on only writes.
    op.attempts = op.attempts.max(number);
    op.updated_ms = now_ms;
    let changes = first_write || finish.is_some();
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
    if changes {
        drop(records);
        reindex(txn, &op.run_id, &[key])?;
        keep_fence(txn, op.fence)?;
    }
    Ok(())
}

/// An effect record (operation key, effect key, encoded record) and the local effects staged
/// before it. A compare-and-set: `expected` is the (status, dispatches) the writer last saw of the
/// effect, `None` for an effect that must not exist yet; anything else was written by someone
/// else since, and the write is refused.
pub(super) fn put_effect(
    txn: &WriteTransaction,
    live: &Live,
    fence: u64,
    (key, effect_key, effect): (&str, &str, &[u8]),
    expected: Option<(EffectStatus, u32)>,
    staged: &[StagedWrite],
) -> Result<(), LedgerError> {
    let mut records = txn.open_table(RECORDS)?;
    let (op, first_write) = owned(&records, live, key, fence)?;
    // A first write finds nothing of its operation on disk: no need to look.
    if !first_write || expected.is_some() {
        let current = get::<_, EffectRecord>(&records, (key, EFFECT, effect_key))?.map(|e| (e.status, e.dispatches));
        if current != expected {
            return Err(LedgerError::EffectChanged {
                operation_key: key.to_string(),
                effect_key: effect_key.to_string(),
            });
        }
    }
    let fresh = unapplied(txn, &records, key, staged)?;
    // Decided; from here on only writes.
    if first_write {
        put(&mut records, operation_id(key), &op)?;
        index_step(txn, &op)?;
    }
    apply_local(txn, &mut records, key, fresh)?;
    records.insert((key, EFFECT, effect_key), effect)?;
    if first_write {
        drop(records);
        reindex(txn, &op.run_id, &[key])?;
        keep_fence(txn, op.fence)?;
    }
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
/// others); refuses them all if a key holds another request (the tool diverged), or if a
/// versioned KV write finds its key at another version than it read (another step wrote it
/// first). Writes nothing.
fn unapplied<'s>(
    txn: &WriteTransaction,
    records: &impl ReadableTable<RecordKey, &'static [u8]>,
    key: &str,
    staged: &'s [StagedWrite],
) -> Result<Vec<&'s StagedWrite>, LedgerError> {
    let mut fresh = Vec::with_capacity(staged.len());
    for write in staged {
        match get::<_, EffectRecord>(records, (key, EFFECT, write.effect.key.as_str()))? {
            None => {
                if let LocalWrite::KvSet { namespace, key: kv_key, expected: Some(expected), .. } = &write.write {
                    let kv = txn.open_table(KV)?;
                    let found = kv
                        .get((namespace.as_str(), kv_key.as_str()))?
                        .and_then(|v| kv_decode(v.value()).map(|(version, _)| version))
                        .unwrap_or(0);
                    if found != *expected {
                        return Err(LedgerError::KvConflict { namespace: namespace.clone(), key: kv_key.clone() });
                    }
                }
                fresh.push(write);
            }
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
            LocalWrite::KvSet { namespace, key, value, .. } => {
                let stored = kv_encode(crate::stamp(&effect.key), value);
                txn.open_table(KV)?.insert((namespace.as_str(), key.as_str()), stored.as_slice())?;
            }
            LocalWrite::KvDelete { namespace, key } => {
                txn.open_table(KV)?.remove((namespace.as_str(), key.as_str()))?;
            }
            LocalWrite::Outbox { topic, payload } => {
                let mut meta = txn.open_table(META)?;
                let seq = meta.get(OUTBOX_SEQ_KEY)?.map_or(0, |v| v.value()) + 1;
                meta.insert(OUTBOX_SEQ_KEY, seq)?;
                let message = OutboxMessage::enqueued(seq, effect, topic, payload);
                put(&mut txn.open_table(OUTBOX)?, seq, &message)?;
                txn.open_table(OUTBOX_PENDING)?.insert((topic.as_str(), seq), ())?;
            }
        }
        records.insert((operation_key, EFFECT, effect.key.as_str()), bytes.as_slice())?;
    }
    Ok(())
}

pub(super) fn resolve(
    txn: &WriteTransaction,
    operation_key: &str,
    effect_key: Option<&str>,
    seen: Option<u32>,
    resolution: &Resolution,
    settlement: &Settlement,
) -> Result<OperationRecord, LedgerError> {
    let mut records = txn.open_table(RECORDS)?;
    let op: Option<OperationRecord> = get(&records, operation_id(operation_key))?;
    let effects = match &op {
        Some(_) => super::effects_of(&records, operation_key)?,
        None => Vec::new(),
    };
    let (op, effects) = settled(operation_key, op, &effects, effect_key, seen, resolution, settlement)?;
    // Decided; from here on only writes.
    for effect in effects {
        put(&mut records, (operation_key, EFFECT, effect.key.as_str()), &effect)?;
    }
    put(&mut records, operation_id(operation_key), &op)?;
    drop(records);
    reindex(txn, &op.run_id, &[operation_key])?;
    Ok(op)
}

/// Writes a request for approval if its revision follows the stored one.
pub(super) fn put_approval(txn: &WriteTransaction, record: &ApprovalRecord) -> Result<(), LedgerError> {
    let key = record.operation_key.as_str();
    let durable = get::<_, OperationRecord>(&txn.open_table(RECORDS)?, operation_id(key))?.is_some();
    if durable {
        return Err(LedgerError::ApprovalClosed { operation_key: key.to_string() });
    }
    let mut approvals = txn.open_table(APPROVALS)?;
    let stored: Option<ApprovalRecord> = get(&approvals, record.operation_key.as_str())?;
    approval_follows(stored.as_ref(), record)?;
    put(&mut approvals, record.operation_key.as_str(), record)?;
    drop(approvals);
    super::aged::asked(txn, key, stored.as_ref(), Some(record))?;
    reindex(txn, &record.run_id, &[key])
}

/// Removes expired operations with every record of theirs, leaving their tombstones, and the
/// requests for approval named that are still as retention read them; refuses all if one
/// operation is not over. `claimed`: keys claimed in memory (the caller holds them as deciding,
/// so no claim of them starts until this commits), whose requests stay with their calls.
pub(super) fn expire(
    txn: &WriteTransaction,
    tombstones: &[Tombstone],
    approvals: &[StaleApproval],
    claimed: &std::collections::HashSet<String>,
    live: &Live,
) -> Result<Removed, LedgerError> {
    let mut records = txn.open_table(RECORDS)?;
    let mut found = Vec::new();
    for tombstone in tombstones {
        if let Some(op) = get::<_, OperationRecord>(&records, operation_id(&tombstone.operation_key))? {
            expirable(&op)?;
            found.push(op);
        }
    }
    let mut approval_table = txn.open_table(APPROVALS)?;
    let mut lapsed = Vec::new();
    for stale in approvals {
        let key = stale.operation_key.as_str();
        let stored: Option<ApprovalRecord> = get(&approval_table, key)?;
        let durable = get::<_, OperationRecord>(&records, operation_id(key))?.is_some();
        if approval_lapses(stale, stored.as_ref(), durable || claimed.contains(key)) {
            lapsed.push(key);
        }
    }
    // An operation of a run that is open now, by a key this job does not remove (a request that
    // does not lapse is not removed) or a claim in memory (read here, in the writer's turn: a
    // claim made after it comes after this removal), is kept: retention read the run closed
    // before a step of it was claimed or asked.
    let removing = crate::run_state::removing(tombstones, lapsed.iter().copied());
    let flying: std::collections::HashSet<String> = {
        let live = live.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        live.values().map(|op| op.run_id.clone()).collect()
    };
    let mut kept = std::collections::BTreeSet::new();
    {
        let open = txn.open_table(OPEN)?;
        for op in &found {
            let indexed = super::open_index::indexed(&open, &op.run_id)?;
            if flying.contains(&op.run_id)
                || !crate::run_state::removable(indexed.iter().map(String::as_str), &removing)
            {
                kept.insert(op.key.clone());
            }
        }
    }
    found.retain(|op| !kept.contains(&op.key));
    // Decided; from here on only writes.
    let mut steps = txn.open_table(RUN_STEPS)?;
    let mut touched: Vec<(String, String)> = Vec::new();
    // The requests removed, to leave the index by age.
    let mut unasked: Vec<ApprovalRecord> = Vec::new();
    for key in &lapsed {
        if let Some(request) = approval_table.remove(*key)? {
            let request: ApprovalRecord = super::decode("approvals", key, request.value())?;
            touched.push((request.run_id.clone(), key.to_string()));
            unasked.push(request);
        }
    }
    for op in &found {
        let key = op.key.as_str();
        let mut ids = Vec::new();
        for entry in records.range((key, ATTEMPT, "")..(key, TOMBSTONE, ""))? {
            let (id, _) = entry?;
            let (_, kind, id) = id.value();
            ids.push((kind, id.to_string()));
        }
        for (kind, id) in ids {
            records.remove((key, kind, id.as_str()))?;
        }
        records.remove(operation_id(key))?;
        txn.open_table(ENDED)?.remove((op.updated_ms, key))?;
        steps.remove((op.run_id.as_str(), op.step_id.as_str(), op.tool.as_str()))?;
        if let Some(request) = approval_table.remove(key)? {
            unasked.push(super::decode("approvals", key, request.value())?);
        }
        touched.push((op.run_id.clone(), key.to_string()));
    }
    let mut by_run = txn.open_table(TOMBSTONES_BY_RUN)?;
    for tombstone in tombstones.iter().filter(|t| !kept.contains(&t.operation_key)) {
        super::tombstones::leave(&mut records, &mut by_run, tombstone)?;
    }
    drop(by_run);
    drop((records, approval_table, steps));
    for request in &unasked {
        super::aged::asked(txn, &request.operation_key, Some(request), None)?;
    }
    // O(expired): each removed key's run is reindexed for that key (and its open ones).
    for (run, key) in &touched {
        reindex(txn, run, &[key])?;
    }
    Ok(Removed { operations: found.len(), approvals: lapsed.len() })
}
