//! The write jobs off the hot path: each runs in one transaction of its own (one Store call, one
//! transaction) and answers what it decided and whether it wrote. The hot path's jobs (a claim, a
//! write-ahead, an attempt) share transactions in groups (`grouped.rs`, `group.rs`), under the
//! same locks. Each mirrors its redb job (`redb/jobs.rs`) and
//! the reference model, decision for decision, through the shared rules of `rules.rs`.
//!
//! # Why READ COMMITTED is enough here
//!
//! Every decision is taken under a lock that every competing writer must take too, and is read by
//! statements issued after that lock was granted (in READ COMMITTED each statement reads a fresh
//! snapshot, which includes everything the previous holder committed):
//!
//! - everything about one operation (its row or its absence, its effects and attempts, its
//!   approval, its tombstone) is decided under the operation's advisory lock
//!   ([`super::db::operation_lock`]), taken first by every job that writes about it, and its row
//!   is read `FOR UPDATE` as well. A claim of a new operation and a decision on its approval, two
//!   claims of one key, a take-over and the old owner's write, an expiry and a claim: each pair
//!   is serialized by that one lock, across processes, whether or not the row exists yet (which a
//!   row lock alone could not do: there is no row to lock before the first claim);
//! - a KV key is decided under its own advisory lock ([`super::db::kv_lock`]), present or absent;
//! - outbox sequence numbers come from one counter row updated in the enqueuing transaction, so
//!   they are handed out in commit order, without gaps: a topic's relay never sees message n+1
//!   before message n (a sequence could: its numbers are taken before their transactions commit,
//!   in any order).
//!
//! Advisory locks are taken in one order, ascending by id (a group takes all its jobs' operation
//! and KV locks so; an expiry takes several operations' locks so; every other job takes one), and
//! only then row locks of what they cover and, last, the outbox counter, so transactions never
//! deadlock each other.
//! SERIALIZABLE would also be correct, but would refuse work under contention (40001) and need
//! retries whose bound someone must pick; these locks make a writer wait instead, never fail.
//!
//! The conditional writes (`UPDATE ... WHERE key = $1 AND fence = $2 AND status = 'claimed'`, an
//! effect's status and dispatches, an approval's revision) state the same condition once more to
//! the database: were a lock ever missed, a write would still find no row, and be refused.

use std::collections::{BTreeMap, BTreeSet};

use super::db::{Tx, column, encode, int, operation_lock, record, run_lock, uint};
use super::index;
use super::notify;
use crate::ReconcileNote;
use crate::{
    ApprovalRecord, Claim, ClaimRequest, DeliveryAnswer, EffectRecord, EffectStatus, LedgerError, OperationRecord,
    OperationStatus, OutboxMessage, Removed, Resolution, Settlement, StaleApproval, Tombstone, approval_follows,
    approval_lapses, claim_lost, expirable, settled, take_over,
};

/// An answer, and whether the job wrote (a transaction that wrote nothing is rolled back and
/// costs no commit).
pub(super) type Done<T> = Result<(T, bool), LedgerError>;

const OPERATION_FOR_UPDATE: &str = "SELECT record, recorded FROM oncebox_operations WHERE key = $1 FOR UPDATE";

/// The operation's record and whether it was recorded, locked for this transaction.
async fn operation_for_update(tx: &Tx<'_>, key: &str) -> Result<Option<(OperationRecord, bool)>, LedgerError> {
    match tx.opt(OPERATION_FOR_UPDATE, &[&key]).await? {
        Some(row) => {
            Ok(Some((record(&row, 0, "oncebox_operations")?, super::db::column(&row, 1, "oncebox_operations")?)))
        }
        None => Ok(None),
    }
}

/// Writes `op` over the row that held `fence` with `status`; refused (`Fenced`) if the row
/// does not hold them any more.
async fn update_operation(
    tx: &Tx<'_>,
    op: &OperationRecord,
    recorded: bool,
    (fence, status): (u64, OperationStatus),
) -> Result<(), LedgerError> {
    let changed = tx
        .exec(
            "UPDATE oncebox_operations SET status = $3, fence = $4, lease_until_ms = $5, recorded = $6, record = $7 \
             WHERE key = $1 AND fence = $2 AND status = $8",
            &[
                &op.key,
                &int(fence),
                &op.status.as_str(),
                &int(op.fence),
                &int(op.lease_until_ms),
                &recorded,
                &encode(op)?,
                &status.as_str(),
            ],
        )
        .await?;
    if changed == 0 {
        return Err(LedgerError::Fenced { operation_key: op.key.clone(), fence, current: op.fence });
    }
    Ok(())
}

/// A fence no owner of `op` ever held: from the ledger's sequence, and above the operation's own.
async fn fresh_fence(tx: &Tx<'_>) -> Result<u64, LedgerError> {
    let row = tx.opt("SELECT nextval('oncebox_fence')", &[]).await?;
    let row = row.ok_or_else(|| LedgerError::Corrupt { what: "nextval returned no row".into() })?;
    Ok(uint(super::db::column(&row, 0, "oncebox_fence")?))
}

/// Binds the ledger to the hosts' key ([`crate::Store::bind_key`]): the first host's
/// newest id is kept; a host whose older ids hold the kept one brings a rotation, which is kept
/// instead; any other host is refused. The row is locked, so two hosts binding at once are
/// decided one after the other.
pub(super) async fn bind_key(tx: &Tx<'_>, ids: &[String]) -> Done<()> {
    let Some(newest) = ids.first() else {
        return Err(LedgerError::Database { store: tx.store.to_string(), what: "no key id to bind".into() });
    };
    let inserted = tx.exec("INSERT INTO oncebox_key (id) VALUES ($1) ON CONFLICT (one) DO NOTHING", &[newest]).await?;
    if inserted == 1 {
        return Ok(((), true));
    }
    let row = tx.opt("SELECT id FROM oncebox_key FOR UPDATE", &[]).await?;
    let kept: String = match row.map(|row| row.try_get(0)) {
        Some(Ok(id)) => id,
        _ => return Err(LedgerError::Corrupt { what: format!("{}: the key table holds no key id", tx.store) }),
    };
    if &kept == newest {
        return Ok(((), false));
    }
    if ids[1..].contains(&kept) {
        tx.exec("UPDATE oncebox_key SET id = $1", &[newest]).await?;
        return Ok(((), true));
    }
    Err(LedgerError::KeyMismatch { store: tx.store.to_string(), host_key: newest.clone(), store_key: kept })
}

/// Reopens an unknown operation for `req`'s caller with a new fence, when every effect it has in
/// doubt may be resent with its key (`resendable`); anything else is answered as recorded.
pub(super) async fn reopen(tx: &Tx<'_>, req: &ClaimRequest, resendable: &[String]) -> Done<Claim> {
    // Drawn first, as the other backends do, so fences follow the same course in every backend.
    let fence = fresh_fence(tx).await?;
    tx.lock_modes(vec![(operation_lock(&req.key), true), index::lock_of(&req.run_id, &req.step_id)]).await?;
    let Some((op, true)) = operation_for_update(tx, &req.key).await? else {
        return Err(LedgerError::NotInDoubt { operation_key: req.key.clone() });
    };
    if !req.matches(&op.fingerprint) {
        return Ok((Claim::Conflict(op), false));
    }
    let in_doubt: Vec<EffectRecord> =
        effects_of(tx, &req.key).await?.into_iter().filter(|e| e.status.in_doubt()).collect();
    if op.status != OperationStatus::Unknown
        || in_doubt.is_empty()
        || !in_doubt.iter().all(|e| resendable.contains(&e.key))
    {
        return Ok((Claim::Recorded(op), false));
    }
    let held = op.fence;
    let mut op = take_over(Some(op), req, fence.max(held + 1));
    op.status = OperationStatus::Claimed;
    op.error = None;
    // Its run's lock was taken by the run and step the request names: the operation's own.
    if op.run_id != req.run_id || op.step_id != req.step_id {
        return Err(LedgerError::Database {
            store: tx.store.to_string(),
            what: format!("the request to reopen {} names another run or step than its operation", req.key),
        });
    }
    update_operation(tx, &op, true, (held, OperationStatus::Unknown)).await?;
    reindex_op(tx, &op).await?;
    notify::changed(tx, &req.key).await?;
    Ok((Claim::Owned { fence: op.fence, previous_attempts: op.attempts }, true))
}

/// Reindexes operation `op` as just written (`index.rs`): the transaction holds its lock and its
/// run's, exclusive if it is a compensation.
async fn reindex_op(tx: &Tx<'_>, op: &OperationRecord) -> Result<(), LedgerError> {
    let touched = (crate::run_state::ties_the_run(op), vec![index::After::op(op)]);
    index::reindex_in(tx, [(op.run_id.clone(), touched)].into()).await
}

/// Writes the reconciler's note on operation `key` if it is unknown (see `Store::note_reconcile`).
pub(super) async fn note_reconcile(tx: &Tx<'_>, key: &str, note: &ReconcileNote) -> Done<bool> {
    tx.lock(operation_lock(key)).await?;
    let Some((mut op, true)) = operation_for_update(tx, key).await? else { return Ok((false, false)) };
    if op.status != OperationStatus::Unknown {
        return Ok((false, false));
    }
    op.reconciled = Some(note.clone());
    update_operation(tx, &op, true, (op.fence, OperationStatus::Unknown)).await?;
    Ok((true, true))
}

/// Extends the lease of the owner of `fence`, while it still owns the operation; of one whose
/// claim rode with token `ridden` (`riding.rs`), only while the row is still that claim's: not
/// another claimant's lease after a server crash lost the claim.
pub(super) async fn renew(tx: &Tx<'_>, key: &str, fence: u64, until_ms: u64, ridden: Option<i64>) -> Done<()> {
    tx.lock(operation_lock(key)).await?;
    if ridden.is_some() {
        let sql = "SELECT fence, status = 'claimed', claim FROM oncebox_operations WHERE key = $1";
        let row = match tx.opt(sql, &[&key]).await? {
            Some(row) => {
                let fence: i64 = column(&row, 0, "oncebox_operations")?;
                Some((uint(fence), column(&row, 1, "oncebox_operations")?, column(&row, 2, "oncebox_operations")?))
            }
            None => None,
        };
        if claim_lost(fence, ridden, row) {
            return Err(LedgerError::ClaimLost { operation_key: key.to_string() });
        }
    }
    let (mut op, recorded) = owned(tx, key, fence).await?;
    op.lease_until_ms = op.lease_until_ms.max(until_ms);
    update_operation(tx, &op, recorded, (fence, OperationStatus::Claimed)).await?;
    Ok(((), true))
}

/// The operation and whether it was recorded, if `fence` owns it (claimed with that fence);
/// `Fenced` otherwise.
async fn owned(tx: &Tx<'_>, key: &str, fence: u64) -> Result<(OperationRecord, bool), LedgerError> {
    match operation_for_update(tx, key).await? {
        Some((op, recorded)) if op.fence == fence && op.status == OperationStatus::Claimed => Ok((op, recorded)),
        other => Err(LedgerError::Fenced {
            operation_key: key.to_string(),
            fence,
            current: other.map_or(0, |(op, _)| op.fence),
        }),
    }
}

/// Writes an effect record, whatever was there.
async fn upsert_effect(tx: &Tx<'_>, operation_key: &str, effect: &EffectRecord) -> Result<u64, LedgerError> {
    tx.exec(
        "INSERT INTO oncebox_effects \
         (operation_key, effect_key, status, dispatches, first_dispatched_ms, label, record) \
         VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (operation_key, effect_key) DO UPDATE SET \
         status = excluded.status, dispatches = excluded.dispatches, \
         first_dispatched_ms = excluded.first_dispatched_ms, label = excluded.label, record = excluded.record",
        &[
            &operation_key,
            &effect.key,
            &effect_status_str(effect.status),
            &i64::from(effect.dispatches),
            &int(effect.first_dispatched_ms),
            &effect.label,
            &encode(effect)?,
        ],
    )
    .await
}

/// Settles an unknown operation ([`settled`]).
pub(super) async fn resolve(
    tx: &Tx<'_>,
    operation_key: &str,
    effect_key: Option<&str>,
    seen: Option<u32>,
    resolution: &Resolution,
    settlement: &Settlement,
) -> Done<OperationRecord> {
    // The run and step of a key never change: read before the locks, to take the run's too.
    let step = "SELECT run_id, step_id FROM oncebox_operations WHERE key = $1";
    let mut locks = vec![(operation_lock(operation_key), true)];
    let mut held_run = None;
    if let Some(row) = tx.opt(step, &[&operation_key]).await? {
        let (run, step): (String, String) =
            (column(&row, 0, "oncebox_operations")?, column(&row, 1, "oncebox_operations")?);
        locks.push(index::lock_of(&run, &step));
        held_run = Some(run);
    }
    tx.lock_modes(locks).await?;
    let op = operation_for_update(tx, operation_key).await?.filter(|(_, recorded)| *recorded).map(|(op, _)| op);
    // A row made since the first read is as if the settlement had come first.
    let op = op.filter(|op| held_run.as_deref() == Some(op.run_id.as_str()));
    let held = op.as_ref().map(|op| (op.fence, op.status));
    let effects = match &op {
        Some(_) => effects_of(tx, operation_key).await?,
        None => Vec::new(),
    };
    let (op, effects) = settled(operation_key, op, &effects, effect_key, seen, resolution, settlement)?;
    let Some(held) = held else {
        return Err(LedgerError::NotInDoubt { operation_key: operation_key.to_string() });
    };
    // Decided; from here on only writes.
    for effect in &effects {
        upsert_effect(tx, operation_key, effect).await?;
    }
    update_operation(tx, &op, true, held).await?;
    reindex_op(tx, &op).await?;
    notify::changed(tx, operation_key).await?;
    Ok((op, true))
}

/// Writes a request for approval if its revision follows the stored one and its operation was
/// never claimed.
pub(super) async fn put_approval(tx: &Tx<'_>, approval: &ApprovalRecord) -> Done<()> {
    let key = approval.operation_key.as_str();
    tx.lock_modes(vec![(operation_lock(key), true), index::lock_of(&approval.run_id, &approval.step_id)]).await?;
    // Claimed (recorded or not) or recorded: what it ran under can no longer change.
    if tx.opt("SELECT 1 FROM oncebox_operations WHERE key = $1", &[&key]).await?.is_some() {
        return Err(LedgerError::ApprovalClosed { operation_key: key.to_string() });
    }
    let stored = approval_for_update(tx, key).await?;
    approval_follows(stored.as_ref(), approval)?;
    let written = match &stored {
        None => {
            tx.exec(
                "INSERT INTO oncebox_approvals (operation_key, run_id, revision, record) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (operation_key) DO NOTHING",
                &[&key, &approval.run_id, &i64::from(approval.revision), &encode(approval)?],
            )
            .await?
        }
        Some(stored) => {
            tx.exec(
                "UPDATE oncebox_approvals SET run_id = $2, revision = $3, record = $4 \
                 WHERE operation_key = $1 AND revision = $5",
                &[
                    &key,
                    &approval.run_id,
                    &i64::from(approval.revision),
                    &encode(approval)?,
                    &i64::from(stored.revision),
                ],
            )
            .await?
        }
    };
    if written == 0 {
        return Err(LedgerError::ApprovalChanged { operation_key: key.to_string() });
    }
    let after = index::After { key: key.to_string(), op: None, asked: Some(Some(approval.clone())) };
    let tie = index::ties(&approval.step_id);
    index::reindex_in(tx, [(approval.run_id.clone(), (tie, vec![after]))].into()).await?;
    Ok(((), true))
}

async fn approval_for_update(tx: &Tx<'_>, key: &str) -> Result<Option<ApprovalRecord>, LedgerError> {
    tx.opt("SELECT record FROM oncebox_approvals WHERE operation_key = $1 FOR UPDATE", &[&key])
        .await?
        .map(|row| record(&row, 0, "oncebox_approvals"))
        .transpose()
}

/// Removes expired operations with every record of theirs, leaving their tombstones, and the
/// requests for approval named that are still as retention read them and whose operation was not
/// claimed; refuses all if one operation is not over. A claim never recorded is left alone
/// (reads do not show it, so retention cannot have meant it), as in the other backends. Every
/// key's operation lock is held, as a claim and a decision hold it.
pub(super) async fn expire(tx: &Tx<'_>, tombstones: &[Tombstone], approvals: &[StaleApproval]) -> Done<Removed> {
    let keys: Vec<String> = tombstones
        .iter()
        .map(|t| t.operation_key.clone())
        .chain(approvals.iter().map(|a| a.operation_key.clone()))
        .collect();
    // The runs of the operations and of the requests, read before the locks to take theirs too (a
    // key's run and step never change), each alone: no step of them is claimed, asked for or
    // decided while this judges whether they are open and removes (and the index of a run being
    // compensated is written from what its lock holder read).
    let mut locks: Vec<(i64, bool)> = keys.iter().map(|key| (operation_lock(key), true)).collect();
    let mut runs = std::collections::HashMap::new();
    for row in tx.rows("SELECT key, run_id FROM oncebox_operations WHERE key = ANY($1)", &[&keys]).await? {
        let key: String = column(&row, 0, "oncebox_operations")?;
        let run: String = column(&row, 1, "oncebox_operations")?;
        locks.push((run_lock(&run), true));
        runs.insert(key, run);
    }
    for row in tx.rows("SELECT run_id FROM oncebox_approvals WHERE operation_key = ANY($1)", &[&keys]).await? {
        let run: String = column(&row, 0, "oncebox_approvals")?;
        locks.push((run_lock(&run), true));
    }
    tx.lock_modes(locks).await?;
    let mut lapsed = Vec::new();
    for stale in approvals {
        let key = stale.operation_key.as_str();
        let claimed = tx.opt("SELECT 1 FROM oncebox_operations WHERE key = $1", &[&key]).await?.is_some();
        let stored = approval_for_update(tx, key).await?;
        if approval_lapses(stale, stored.as_ref(), claimed) {
            lapsed.push(stale);
        }
    }
    // The runs open now by a key this does not remove (`run_state::removable`; a request that
    // does not lapse is not removed): their operations are kept.
    let run_ids: Vec<String> = runs.values().cloned().collect::<BTreeSet<_>>().into_iter().collect();
    let mut open: std::collections::HashMap<String, Vec<String>> = std::collections::HashMap::new();
    for row in tx.rows("SELECT run_id, key FROM oncebox_open WHERE run_id = ANY($1)", &[&run_ids]).await? {
        let run: String = column(&row, 0, "oncebox_open")?;
        open.entry(run).or_default().push(column(&row, 1, "oncebox_open")?);
    }
    let removing = crate::run_state::removing(tombstones, lapsed.iter().map(|stale| stale.operation_key.as_str()));
    let open_now = |run: &str| {
        let keys = open.get(run).map_or(&[][..], Vec::as_slice);
        !crate::run_state::removable(keys.iter().map(String::as_str), &removing)
    };
    let mut found = Vec::with_capacity(tombstones.len());
    for tombstone in tombstones {
        let op = operation_for_update(tx, &tombstone.operation_key).await?;
        if let Some((op, true)) = &op {
            expirable(op)?;
            // Made since the first read: its run's lock is not held. Retention read it ended, so
            // this is no operation retention meant.
            if runs.get(&op.key) != Some(&op.run_id) {
                return Err(LedgerError::NotExpirable { operation_key: op.key.clone(), status: "claimed" });
            }
        }
        // Kept: its run is open now (read as not written, as a claim never written is).
        let op = op.map(|(op, written)| {
            let keep = written && open_now(&op.run_id);
            (op, written && !keep)
        });
        found.push(op);
    }
    // Decided; from here on only writes.
    let mut removed = Removed::default();
    // What the index must forget: by run, (whether a compensation's, the keys after).
    let mut touched: BTreeMap<String, (bool, Vec<index::After>)> = BTreeMap::new();
    let gone = |key: &str| index::After { key: key.to_string(), op: None, asked: Some(None) };
    for stale in &lapsed {
        // The revision once more, to the database (see the module's docs).
        let sql = "DELETE FROM oncebox_approvals WHERE operation_key = $1 AND revision = $2 RETURNING run_id";
        for row in tx.rows(sql, &[&stale.operation_key, &i64::from(stale.revision)]).await? {
            removed.approvals += 1;
            let run: String = column(&row, 0, "oncebox_approvals")?;
            touched.entry(run).or_default().1.push(gone(&stale.operation_key));
        }
    }
    for (tombstone, op) in tombstones.iter().zip(found) {
        let key = tombstone.operation_key.as_str();
        match op {
            Some((_, false)) => continue,
            // Its effects and attempts go with it (ON DELETE CASCADE).
            Some((op, true)) => {
                removed.operations += tx.exec("DELETE FROM oncebox_operations WHERE key = $1", &[&key]).await? as usize;
                // Its end leaves the index of ended operations (`index.rs`).
                let sql = "DELETE FROM oncebox_ended WHERE ended_ms = $1 AND key = $2";
                tx.exec(sql, &[&int(op.updated_ms), &key]).await?;
                let run = touched.entry(op.run_id.clone()).or_default();
                // Removing a compensation changes what the run's other keys are: judged whole.
                run.0 |= crate::run_state::ties_the_run(&op);
                run.1.push(gone(key));
            }
            None => {
                let sql = "DELETE FROM oncebox_approvals WHERE operation_key = $1 RETURNING run_id";
                for row in tx.rows(sql, &[&key]).await? {
                    let run: String = column(&row, 0, "oncebox_approvals")?;
                    touched.entry(run).or_default().1.push(gone(key));
                }
            }
        }
        tx.exec("DELETE FROM oncebox_approvals WHERE operation_key = $1", &[&key]).await?;
        tx.exec(
            "INSERT INTO oncebox_tombstones (operation_key, record) VALUES ($1, $2) \
             ON CONFLICT (operation_key) DO UPDATE SET record = excluded.record",
            &[&key, &encode(tombstone)?],
        )
        .await?;
    }
    index::reindex_in(tx, touched).await?;
    let wrote = !tombstones.is_empty() || !lapsed.is_empty();
    Ok((removed, wrote))
}

/// A message of the host's own on `topic` under `key`, unless one was enqueued there under it
/// before (`oncebox_notices` holds `TOPIC\nKEY`). The key's row is inserted first: a second host enqueueing the same key waits on it until the first
/// commits, then finds it and enqueues nothing.
pub(super) async fn enqueue_once(tx: &Tx<'_>, topic: &str, key: &str, payload: &str, now_ms: u64) -> Done<bool> {
    let noticed = format!("{topic}\n{key}");
    let new = "INSERT INTO oncebox_notices (key, seq) VALUES ($1, 0) ON CONFLICT DO NOTHING RETURNING key";
    if tx.opt(new, &[&noticed]).await?.is_none() {
        return Ok((false, false));
    }
    // The counter row is locked until the commit, as an outbox effect's numbering locks it.
    let last = tx.opt("SELECT value FROM oncebox_meta WHERE name = 'outbox_seq' FOR UPDATE", &[]).await?;
    let last: i64 = match last {
        Some(row) => column(&row, 0, "oncebox_meta")?,
        None => return Err(LedgerError::Corrupt { what: format!("{}: no outbox_seq in oncebox_meta", tx.store) }),
    };
    let seq = uint(last) + 1;
    let message = OutboxMessage::notice(seq, key, topic, payload, now_ms);
    tx.exec("UPDATE oncebox_meta SET value = $1 WHERE name = 'outbox_seq'", &[&int(seq)]).await?;
    tx.exec(
        "INSERT INTO oncebox_outbox (seq, topic, delivered, record) VALUES ($1, $2, false, $3)",
        &[&int(seq), &topic, &encode(&message)?],
    )
    .await?;
    tx.exec("UPDATE oncebox_notices SET seq = $2 WHERE key = $1", &[&noticed, &int(seq)]).await?;
    Ok((true, true))
}

/// Removes the delivered messages of `seqs`, each with the notice key that names it (see
/// `Store::prune_outbox`). The rows are locked as a delivery's answer locks them.
pub(super) async fn prune_outbox(tx: &Tx<'_>, seqs: &[u64]) -> Done<crate::Pruned> {
    let seqs: Vec<i64> = seqs.iter().map(|seq| int(*seq)).collect();
    let sql = "DELETE FROM oncebox_outbox WHERE seq = ANY($1) AND delivered RETURNING seq, record";
    let mut pruned = crate::Pruned::default();
    for row in tx.rows(sql, &[&seqs]).await? {
        let seq: i64 = column(&row, 0, "oncebox_outbox")?;
        let message: OutboxMessage = record(&row, 1, "oncebox_outbox")?;
        pruned.messages += 1;
        let noticed = format!("{}\n{}", message.topic, message.effect_key);
        let sql = "DELETE FROM oncebox_notices WHERE key = $1 AND seq = $2";
        pruned.notices += tx.exec(sql, &[&noticed, &seq]).await? as usize;
    }
    let wrote = pruned.messages > 0;
    Ok((pruned, wrote))
}

/// Records one send's answer for outbox message `seq`.
pub(super) async fn record_delivery(tx: &Tx<'_>, seq: u64, answer: &DeliveryAnswer) -> Done<OutboxMessage> {
    let row = tx.opt("SELECT record FROM oncebox_outbox WHERE seq = $1 FOR UPDATE", &[&int(seq)]).await?;
    let mut message: OutboxMessage = match row {
        Some(row) => record(&row, 0, "oncebox_outbox")?,
        None => return Err(LedgerError::NoSuchMessage { seq }),
    };
    let delivery = message.delivery.after(answer);
    if delivery == message.delivery {
        return Ok((message, false));
    }
    message.delivery = delivery;
    tx.exec(
        "UPDATE oncebox_outbox SET delivered = $2, record = $3 WHERE seq = $1",
        &[&int(seq), &message.delivery.is_delivered(), &encode(&message)?],
    )
    .await?;
    Ok((message, true))
}

/// An operation's effects, in the order they were first dispatched.
pub(super) const EFFECTS_OF: &str = "SELECT record FROM oncebox_effects WHERE operation_key = $1 \
                                     ORDER BY first_dispatched_ms, label, effect_key";

async fn effects_of(tx: &Tx<'_>, key: &str) -> Result<Vec<EffectRecord>, LedgerError> {
    tx.rows(EFFECTS_OF, &[&key]).await?.iter().map(|row| record(row, 0, "oncebox_effects")).collect()
}

pub(super) fn effect_status_str(status: EffectStatus) -> &'static str {
    match status {
        EffectStatus::Dispatched => "dispatched",
        EffectStatus::Completed => "completed",
        EffectStatus::Refused => "refused",
        EffectStatus::Retryable => "retryable",
        EffectStatus::Unknown => "unknown",
    }
}

/// The database's clock in ms since the epoch, as SQL: leases of shared things are judged by the
/// one clock every host sees, not by each host's own.
const DB_NOW_MS: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// Takes or renews `owner`'s lease named `name` until the database's now plus `lease_ms`;
/// refused (false) while another owner's lease is live.
pub(super) async fn lease(tx: &Tx<'_>, name: &str, owner: &str, lease_ms: u64) -> Done<bool> {
    let sql = format!(
        "INSERT INTO oncebox_leases (name, owner, until_ms) VALUES ($1, $2, {DB_NOW_MS} + $3) \
         ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, until_ms = EXCLUDED.until_ms \
         WHERE oncebox_leases.owner = EXCLUDED.owner OR oncebox_leases.until_ms < {DB_NOW_MS}"
    );
    let held = tx.exec(&sql, &[&name, &owner, &int(lease_ms)]).await? == 1;
    Ok((held, held))
}

/// Gives up `owner`'s lease named `name`, if it holds it.
pub(super) async fn release(tx: &Tx<'_>, name: &str, owner: &str) -> Done<()> {
    let released = tx.exec("DELETE FROM oncebox_leases WHERE name = $1 AND owner = $2", &[&name, &owner]).await?;
    Ok(((), released == 1))
}
