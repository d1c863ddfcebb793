//! The jobs of a call's hot path (a claim, a write-ahead, an attempt), written so that many can
//! share one transaction (`group.rs`): each names its locks and its reads up front, decides from
//! what they returned, and answers the writes to send. Each mirrors its redb job (`redb/jobs.rs`)
//! and the reference model, decision for decision, through the shared rules of `rules.rs`.
//!
//! Why deciding from reads sent before the decision is sound: a group takes every lock its jobs
//! need first (the operations' and the KV keys' advisory locks, in one ascending order, the order
//! every transaction takes them in: `jobs.rs`), then reads. In READ COMMITTED each read takes its
//! snapshot after the locks were granted, and nobody else may write what the locks cover until
//! the group commits, so what the reads returned still holds when the writes run. Two jobs of one
//! group never share a lock that either decides under (`Job::exclusive`; `group.rs` keeps such a
//! job for a later group), so no job's reads depend on another's writes. The outbox counter is read `FOR UPDATE` with the reads and handed
//! out in job order.
//!
//! The conditional writes still state their conditions to the database ([`GUARDED_UPDATE`] and
//! the others): were a lock ever missed, the write would find no row, fail, and take the whole
//! group's transaction with it (the writes and COMMIT are sent together, and a COMMIT of a failed
//! transaction rolls it back).

use deadpool_postgres::tokio_postgres::Row;

use super::db::{column, encode, int, kv_lock, operation_lock, record, uint};
use super::jobs::{EFFECTS_OF, OPERATION_FOR_UPDATE, effect_status_str};
use super::notify;
use super::pipeline::{Sql, sql};
use crate::{
    AttemptRecord, Claim, ClaimRequest, EffectRecord, EffectStatus, Finish, LedgerError, LocalWrite, OperationRecord,
    OperationStatus, OutboxMessage, Staged, approval_stands, refused_finish, stamp, take_over, verdict,
};

/// One hot-path Store call, owned, waiting for its group.
pub(super) enum Job {
    Claim(ClaimRequest),
    PutEffect { fence: u64, effect: EffectRecord, expected: Option<(EffectStatus, u32)>, staged: Staged },
    RecordAttempt { fence: u64, attempt: AttemptRecord, finish: Option<Finish>, now_ms: u64, staged: Staged },
}

/// What a job answers its caller.
#[derive(Debug)]
pub(super) enum Answer {
    Claim(Claim),
    Written,
}

/// What a job decided: its answer and what to write for it (nothing: it wrote nothing).
pub(super) struct Decided {
    pub answer: Answer,
    pub writes: Vec<Sql>,
}

/// A decision, or a request for a fence first (a take-over needs one from the ledger's sequence,
/// and only a take-over may draw one, so that fences follow the same course in every backend).
pub(super) enum Decision {
    Made(Result<Decided, LedgerError>),
    NeedsFence,
}

/// A row's value in the outbox counter, handed out to the group's messages in job order.
pub(super) type OutboxSeq = Option<u64>;

/// Reads the last outbox sequence number handed out, locked until the commit.
pub(super) const OUTBOX_SEQ_FOR_UPDATE: &str = "SELECT value FROM oncebox_meta WHERE name = 'outbox_seq' FOR UPDATE";
pub(super) const OUTBOX_SEQ_SET: &str = "UPDATE oncebox_meta SET value = $1 WHERE name = 'outbox_seq'";

/// A new operation's row; fails unless inserted.
const GUARDED_INSERT: &str = "WITH w AS (INSERT INTO oncebox_operations \
     (key, run_id, step_id, tool, status, fence, lease_until_ms, recorded, record) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, false, $8) ON CONFLICT (key) DO NOTHING RETURNING 1) \
     SELECT 1 / count(*)::int FROM w";

/// An operation's row over the one that held a fence with a status; fails unless it did.
const GUARDED_UPDATE: &str = "WITH w AS (UPDATE oncebox_operations SET status = $3, fence = $4, lease_until_ms = $5, \
     recorded = $6, record = $7 WHERE key = $1 AND fence = $2 AND status = $8 RETURNING 1) \
     SELECT 1 / count(*)::int FROM w";

/// A new effect record; fails if one is there.
const GUARDED_EFFECT_INSERT: &str = "WITH w AS (INSERT INTO oncebox_effects \
     (operation_key, effect_key, status, dispatches, first_dispatched_ms, label, record) \
     VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (operation_key, effect_key) DO NOTHING RETURNING 1) \
     SELECT 1 / count(*)::int FROM w";

/// An effect record over the one at a (status, dispatches); fails unless it was.
const GUARDED_EFFECT_UPDATE: &str = "WITH w AS (UPDATE oncebox_effects SET status = $3, dispatches = $4, \
     first_dispatched_ms = $5, label = $6, record = $7 \
     WHERE operation_key = $1 AND effect_key = $2 AND status = $8 AND dispatches = $9 RETURNING 1) \
     SELECT 1 / count(*)::int FROM w";

/// An effect record, whatever was there (a local effect applied with its record).
pub(super) const EFFECT_UPSERT: &str = "INSERT INTO oncebox_effects \
     (operation_key, effect_key, status, dispatches, first_dispatched_ms, label, record) \
     VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (operation_key, effect_key) DO UPDATE SET \
     status = excluded.status, dispatches = excluded.dispatches, \
     first_dispatched_ms = excluded.first_dispatched_ms, label = excluded.label, record = excluded.record";

const KV_VERSION: &str = "SELECT version FROM oncebox_kv WHERE namespace = $1 AND key = $2";
const TOMBSTONE: &str = "SELECT record FROM oncebox_tombstones WHERE operation_key = $1";
const APPROVAL_FOR_UPDATE: &str = "SELECT record FROM oncebox_approvals WHERE operation_key = $1 FOR UPDATE";

/// The SQLSTATE of a guarded write that changed no row (`1 / 0`).
pub(super) const GUARD_FAILED: &str = "22012";

static NOTHING_STAGED: Staged = Vec::new();

impl Job {
    pub fn operation_key(&self) -> &str {
        match self {
            Job::Claim(req) => &req.key,
            Job::PutEffect { effect, .. } => &effect.operation_key,
            Job::RecordAttempt { attempt, .. } => &attempt.operation_key,
        }
    }

    fn staged(&self) -> &Staged {
        match self {
            Job::Claim(_) => &NOTHING_STAGED,
            Job::PutEffect { staged, .. } | Job::RecordAttempt { staged, .. } => staged,
        }
    }

    /// The advisory locks the job decides under: its operation's, and its KV keys'.
    pub fn locks(&self) -> Vec<i64> {
        let kv = self.staged().iter().filter_map(|(_, write)| match write {
            LocalWrite::KvSet { namespace, key, .. } | LocalWrite::KvDelete { namespace, key } => {
                Some(kv_lock(namespace, key))
            }
            LocalWrite::Outbox { .. } => None,
        });
        std::iter::once(operation_lock(self.operation_key())).chain(kv).collect()
    }

    /// The locks no other job of its group may take: its operation's, and the KV keys it writes
    /// under a version it read (its decision reads them). Unversioned KV writes decide nothing
    /// from the key, so jobs writing one key so may share a group: they apply in job order, as
    /// one after the other.
    pub fn exclusive(&self) -> Vec<i64> {
        let kv = versioned(self.staged()).map(|(namespace, key, _)| kv_lock(namespace, key));
        std::iter::once(operation_lock(self.operation_key())).chain(kv).collect()
    }

    /// Whether the job may enqueue outbox messages (the group then reads the counter).
    pub fn enqueues(&self) -> bool {
        self.staged().iter().any(|(_, write)| matches!(write, LocalWrite::Outbox { .. }))
    }

    /// The statements whose answers the job decides from, in the order [`Job::decide`] reads them.
    pub fn reads(&self) -> Vec<Sql> {
        let key = self.operation_key().to_string();
        match self {
            Job::Claim(req) => {
                let mut reads = vec![sql!(OPERATION_FOR_UPDATE, key.clone()), sql!(TOMBSTONE, key.clone())];
                if req.approval.is_some() {
                    reads.push(sql!(APPROVAL_FOR_UPDATE, key));
                }
                reads
            }
            Job::PutEffect { staged, .. } | Job::RecordAttempt { staged, .. } => {
                let mut reads = vec![sql!(OPERATION_FOR_UPDATE, key.clone()), sql!(EFFECTS_OF, key)];
                reads.extend(
                    versioned(staged)
                        .map(|(namespace, kv_key, _)| sql!(KV_VERSION, namespace.to_string(), kv_key.to_string())),
                );
                reads
            }
        }
    }

    /// Decides from `rows` (the answers to [`Job::reads`]), with `fence` drawn if it asked for one;
    /// hands out outbox numbers from `seq`.
    pub fn decide(&self, store: &str, rows: &[Vec<Row>], fence: Option<u64>, seq: &mut OutboxSeq) -> Decision {
        let decided = match self {
            Job::Claim(req) => return claim(req, rows, fence),
            Job::PutEffect { fence, effect, expected, staged } => {
                put_effect(store, *fence, effect, *expected, staged, rows, seq)
            }
            Job::RecordAttempt { fence, attempt, finish, now_ms, staged } => {
                record_attempt(store, *fence, attempt, finish.clone(), *now_ms, staged, rows, seq)
            }
        };
        Decision::Made(decided)
    }
}

/// The staged versioned KV writes: (namespace, key, version expected).
fn versioned(staged: &Staged) -> impl Iterator<Item = (&str, &str, u64)> {
    staged.iter().filter_map(|(_, write)| match write {
        LocalWrite::KvSet { namespace, key, expected: Some(expected), .. } => {
            Some((namespace.as_str(), key.as_str(), *expected))
        }
        _ => None,
    })
}

/// The operation's record and whether it was recorded (the first read of every job).
fn operation(rows: &[Vec<Row>]) -> Result<Option<(OperationRecord, bool)>, LedgerError> {
    match rows.first().and_then(|rows| rows.first()) {
        Some(row) => Ok(Some((record(row, 0, "oncebox_operations")?, column(row, 1, "oncebox_operations")?))),
        None => Ok(None),
    }
}

/// The record in the first row of read `index`, if any.
fn first<T: serde::de::DeserializeOwned>(
    rows: &[Vec<Row>],
    index: usize,
    table: &str,
) -> Result<Option<T>, LedgerError> {
    rows.get(index).and_then(|rows| rows.first()).map(|row| record(row, 0, table)).transpose()
}

fn claim(req: &ClaimRequest, rows: &[Vec<Row>], drawn: Option<u64>) -> Decision {
    let decided = (|| {
        let existing = operation(rows)?;
        if let Some(answer) = verdict(existing.as_ref().map(|(op, _)| op), req) {
            return Ok(Some(Decided { answer: Answer::Claim(answer), writes: Vec::new() }));
        }
        let Some((expired, recorded)) = existing else {
            // A new operation: not one retention removed, and only under the approval its caller
            // saw (read under the operation's lock, which a decision on the approval holds too).
            if let Some(tombstone) = first(rows, 1, "oncebox_tombstones")? {
                return Ok(Some(Decided { answer: Answer::Claim(Claim::Expired(tombstone)), writes: Vec::new() }));
            }
            if req.approval.is_some() && !approval_stands(req, first(rows, 2, "oncebox_approvals")?.as_ref()) {
                return Ok(Some(Decided { answer: Answer::Claim(Claim::ApprovalChanged), writes: Vec::new() }));
            }
            let op = take_over(None, req, 1);
            let insert = sql!(
                GUARDED_INSERT,
                op.key.clone(),
                op.run_id.clone(),
                op.step_id.clone(),
                op.tool.clone(),
                op.status.as_str(),
                int(op.fence),
                int(op.lease_until_ms),
                encode(&op)?,
            );
            let answer = Claim::Owned { fence: op.fence, previous_attempts: op.attempts };
            return Ok(Some(Decided { answer: Answer::Claim(answer), writes: vec![insert] }));
        };
        // The lease expired: the previous owner stalled or died.
        let Some(drawn) = drawn else { return Ok(None) };
        let held = expired.fence;
        let mut op = take_over(Some(expired), req, drawn.max(held + 1));
        op.status = OperationStatus::Claimed;
        let answer = Claim::Owned { fence: op.fence, previous_attempts: op.attempts };
        let writes = vec![update(&op, recorded, (held, OperationStatus::Claimed))?, notify::changed_sql(&req.key)];
        Ok(Some(Decided { answer: Answer::Claim(answer), writes }))
    })();
    match decided {
        Ok(Some(decided)) => Decision::Made(Ok(decided)),
        Ok(None) => Decision::NeedsFence,
        Err(e) => Decision::Made(Err(e)),
    }
}

/// The guarded write of `op` over the row that held `fence` with `status`.
fn update(op: &OperationRecord, recorded: bool, (fence, status): (u64, OperationStatus)) -> Result<Sql, LedgerError> {
    Ok(sql!(
        GUARDED_UPDATE,
        op.key.clone(),
        int(fence),
        op.status.as_str(),
        int(op.fence),
        int(op.lease_until_ms),
        recorded,
        encode(op)?,
        status.as_str(),
    ))
}

/// The operation and whether it was recorded, if `fence` owns it (claimed with that fence);
/// `Fenced` otherwise.
fn owned(rows: &[Vec<Row>], key: &str, fence: u64) -> Result<(OperationRecord, bool), LedgerError> {
    match operation(rows)? {
        Some((op, recorded)) if op.fence == fence && op.status == OperationStatus::Claimed => Ok((op, recorded)),
        other => Err(LedgerError::Fenced {
            operation_key: key.to_string(),
            fence,
            current: other.map_or(0, |(op, _)| op.fence),
        }),
    }
}

/// The operation's effects (the second read of a write job).
fn effects(rows: &[Vec<Row>]) -> Result<Vec<EffectRecord>, LedgerError> {
    rows.get(1).map_or(&[][..], |rows| rows.as_slice()).iter().map(|row| record(row, 0, "oncebox_effects")).collect()
}

fn put_effect(
    store: &str,
    fence: u64,
    effect: &EffectRecord,
    expected: Option<(EffectStatus, u32)>,
    staged: &Staged,
    rows: &[Vec<Row>],
    seq: &mut OutboxSeq,
) -> Result<Decided, LedgerError> {
    let key = effect.operation_key.as_str();
    let (op, recorded) = owned(rows, key, fence)?;
    let on_record = effects(rows)?;
    let current = on_record.iter().find(|e| e.key == effect.key).map(|e| (e.status, e.dispatches));
    if current != expected {
        return Err(LedgerError::EffectChanged { operation_key: key.to_string(), effect_key: effect.key.clone() });
    }
    let fresh = unapplied(key, staged, &on_record, rows)?;
    // Decided; from here on only writes.
    let mut writes = Vec::new();
    if !recorded {
        writes.push(update(&op, true, (fence, OperationStatus::Claimed))?);
    }
    apply_local(store, key, fresh, seq, &mut writes)?;
    let (text, condition) = match expected {
        None => (GUARDED_EFFECT_INSERT, None),
        Some(condition) => (GUARDED_EFFECT_UPDATE, Some(condition)),
    };
    let mut write = effect_row(text, key, effect)?;
    if let Some((status, dispatches)) = condition {
        write.params.push(Box::new(effect_status_str(status)));
        write.params.push(Box::new(i64::from(dispatches)));
    }
    writes.push(write);
    Ok(Decided { answer: Answer::Written, writes })
}

/// The statement `text` with an effect row's seven columns as its first parameters.
fn effect_row(text: &'static str, operation_key: &str, effect: &EffectRecord) -> Result<Sql, LedgerError> {
    Ok(sql!(
        text,
        operation_key.to_string(),
        effect.key.clone(),
        effect_status_str(effect.status),
        i64::from(effect.dispatches),
        int(effect.first_dispatched_ms),
        effect.label.clone(),
        encode(effect)?,
    ))
}

#[allow(clippy::too_many_arguments)]
fn record_attempt(
    store: &str,
    fence: u64,
    attempt: &AttemptRecord,
    finish: Option<Finish>,
    now_ms: u64,
    staged: &Staged,
    rows: &[Vec<Row>],
    seq: &mut OutboxSeq,
) -> Result<Decided, LedgerError> {
    let key = attempt.operation_key.as_str();
    let (mut op, _) = owned(rows, key, fence)?;
    let on_record = effects(rows)?;
    let fresh = unapplied(key, staged, &on_record, rows)?;
    // The rule of evidence, enforced whoever asks (`ledger::refused_finish`).
    if let Some((status, _, _)) = &finish {
        let carried = fresh.iter().map(|(effect, _)| *effect);
        if let Some(refusal) = refused_finish(key, *status, on_record.iter().chain(carried)) {
            return Err(refusal);
        }
    }
    // Decided; from here on only writes.
    op.attempts = op.attempts.max(attempt.attempt);
    op.updated_ms = now_ms;
    let ends = finish.is_some();
    if let Some((status, output, error)) = finish {
        op.status = status;
        op.output = output;
        op.error = error;
        op.lease_until_ms = 0;
    }
    let mut writes = vec![update(&op, true, (fence, OperationStatus::Claimed))?];
    if ends {
        writes.push(notify::changed_sql(key));
    }
    apply_local(store, key, fresh, seq, &mut writes)?;
    writes.push(sql!(
        "INSERT INTO oncebox_attempts (operation_key, number, record) VALUES ($1, $2, $3) \
         ON CONFLICT (operation_key, number) DO UPDATE SET record = excluded.record",
        key.to_string(),
        i64::from(attempt.attempt),
        encode(attempt)?,
    ));
    Ok(Decided { answer: Answer::Written, writes })
}

/// The staged local effects whose keys hold nothing yet (an earlier attempt may have applied the
/// others); refuses them all if a key holds another request (the tool diverged), or if a
/// versioned KV write finds its key at another version than it read (the versions are the reads
/// after the operation's two).
fn unapplied<'s>(
    key: &str,
    staged: &'s Staged,
    on_record: &[EffectRecord],
    rows: &[Vec<Row>],
) -> Result<Vec<(&'s EffectRecord, &'s LocalWrite)>, LedgerError> {
    let mut versions = rows.iter().skip(2);
    let mut fresh = Vec::with_capacity(staged.len());
    for (effect, write) in staged {
        // Read for every versioned write, in order, whether or not its effect is on record.
        let version = match write {
            LocalWrite::KvSet { expected: Some(_), .. } => {
                let read = versions.next().and_then(|rows| rows.first());
                Some(read.map(|row| column::<i64>(row, 0, "oncebox_kv")).transpose()?.map_or(0, uint))
            }
            _ => None,
        };
        match on_record.iter().find(|e| e.key == effect.key) {
            None => {
                if let (LocalWrite::KvSet { namespace, key: kv_key, expected: Some(expected), .. }, Some(found)) =
                    (write, version)
                    && found != *expected
                {
                    return Err(LedgerError::KvConflict { namespace: namespace.clone(), key: kv_key.clone() });
                }
                fresh.push((effect, write));
            }
            Some(existing) if existing.fingerprint != effect.fingerprint => {
                return Err(LedgerError::Diverged { operation_key: key.to_string(), effect_key: effect.key.clone() });
            }
            Some(_) => {}
        }
    }
    Ok(fresh)
}

/// The writes of KV and outbox effects with their effect records: exactly once, in the
/// transaction that records them.
fn apply_local(
    store: &str,
    operation_key: &str,
    fresh: Vec<(&EffectRecord, &LocalWrite)>,
    seq: &mut OutboxSeq,
    writes: &mut Vec<Sql>,
) -> Result<(), LedgerError> {
    for (effect, write) in fresh {
        match write {
            LocalWrite::KvSet { namespace, key, value, .. } => writes.push(sql!(
                "INSERT INTO oncebox_kv (namespace, key, value, version) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value, version = excluded.version",
                namespace.clone(),
                key.clone(),
                value.clone(),
                int(stamp(&effect.key)),
            )),
            LocalWrite::KvDelete { namespace, key } => writes.push(sql!(
                "DELETE FROM oncebox_kv WHERE namespace = $1 AND key = $2",
                namespace.clone(),
                key.clone()
            )),
            LocalWrite::Outbox { topic, payload } => {
                // The counter row is locked until the commit, so numbers are handed out in commit
                // order and a rolled-back transaction leaves no gap.
                let last = seq
                    .as_mut()
                    .ok_or_else(|| LedgerError::Corrupt { what: format!("{store}: no outbox_seq in oncebox_meta") })?;
                *last += 1;
                let message = OutboxMessage::enqueued(*last, effect, topic, payload);
                writes.push(sql!(
                    "INSERT INTO oncebox_outbox (seq, topic, delivered, record) VALUES ($1, $2, false, $3)",
                    int(*last),
                    topic.clone(),
                    encode(&message)?,
                ));
            }
        }
        writes.push(effect_row(EFFECT_UPSERT, operation_key, effect)?);
    }
    Ok(())
}
