//! The jobs of a call's hot path (a claim, a write-ahead, an attempt), written so that many can
//! share one transaction (`group.rs`): each names its locks up front, decides from what the group
//! read for all its jobs at once ([`Read`]), and adds its writes to the group's ([`Writes`]), which
//! go to the database as one statement (a part per kind of row: `combine.rs`; a few past 16 MiB),
//! whatever the number of jobs (the server's cost per statement, not per row, bounds a busy
//! ledger). Each job mirrors its redb job
//! (`redb/jobs.rs`) and the reference model, decision for decision, through the shared rules of
//! `rules.rs`.
//!
//! Why deciding from reads sent before the decision is sound: a group takes every lock its jobs
//! need first (the operations' and the KV keys' advisory locks, in one ascending order, the order
//! every transaction takes them in: `jobs.rs`), then reads. In READ COMMITTED each read takes its
//! snapshot after the locks were granted, and nobody else may write what the locks cover until
//! the group commits, so what the reads returned still holds when the writes run. Two jobs of one
//! group never share a lock that either decides under (`Job::exclusive`; `group.rs` keeps such a
//! job for a later group), so no job's reads depend on another's writes. The outbox counter is
//! read `FOR UPDATE` with the reads and handed out in job order.
//!
//! The conditional writes still state their conditions to the database, and each such statement
//! checks that it changed exactly the rows it was given: were a lock ever missed, the statement
//! would fail and take the whole group's transaction with it (the writes and COMMIT are sent
//! together, and a COMMIT of a failed transaction rolls it back).

use std::collections::{BTreeMap, HashMap};

use deadpool_postgres::tokio_postgres::Row;

use super::db::{column, encode, int, kv_lock, operation_lock, record, uint};
use super::index;
use super::jobs::effect_status_str;
use super::pipeline::{Sql, sql};
use super::writes::{EffectRow, OperationRow, Writes};
use crate::{
    ApprovalRecord, AttemptRecord, Claim, ClaimRequest, EffectRecord, EffectStatus, Finish, LedgerError, LocalWrite,
    OperationRecord, OperationStatus, OutboxMessage, Staged, Tombstone, answer_may_ride, approval_stands, claim_lost,
    refused_finish, stamp, take_over, verdict,
};

/// One hot-path Store call, owned, waiting for its group.
pub(super) enum Job {
    /// A claim, with the random token a new operation's row is made with (`riding.rs`).
    Claim {
        req: ClaimRequest,
        token: i64,
    },
    PutEffect {
        fence: u64,
        effect: EffectRecord,
        expected: Option<(EffectStatus, u32)>,
        staged: Staged,
    },
    RecordAttempt {
        fence: u64,
        attempt: AttemptRecord,
        finish: Option<Finish>,
        now_ms: u64,
        staged: Staged,
    },
}

/// What a job answers its caller.
#[derive(Debug)]
pub(super) enum Answer {
    Claim(Box<Claim>),
    Written,
}

/// What a job decided: its answer, its writes (none: it wrote nothing), and whether they may ride
/// with the next durable commit instead of waiting for their own flush: an effect's answer with
/// nothing staged beside it ([`Job::may_ride`]), or the claim of a new operation with the first
/// fence and no approval. What each asks of the owner's next flushed write here, where the host
/// outlives a server crash: `riding.rs`.
pub(super) struct Decided {
    pub answer: Answer,
    pub writes: Writes,
    pub rides: bool,
}

impl Decided {
    fn claim(answer: Claim, writes: Writes, rides: bool) -> Decided {
        Decided { answer: Answer::Claim(Box::new(answer)), writes, rides }
    }
}

/// A decision, or `None`: a fence first. A take-over needs one from the ledger's sequence, and so
/// does a new claim here of an operation whose claim here rode and was lost (`riding.rs`, which
/// no other backend has); no other job draws one, so that otherwise fences follow the same course
/// in every backend.
pub(super) type Decision = Option<Result<Decided, LedgerError>>;

/// The SQLSTATE of a checked write that did not change exactly the rows it was given (`1 / 0`).
pub(super) const GUARD_FAILED: &str = "22012";

static NOTHING_STAGED: Staged = Vec::new();

impl Job {
    pub fn operation_key(&self) -> &str {
        match self {
            Job::Claim { req, .. } => &req.key,
            Job::PutEffect { effect, .. } => &effect.operation_key,
            Job::RecordAttempt { attempt, .. } => &attempt.operation_key,
        }
    }

    /// Whether the job is an effect's answer with nothing staged beside it ([`answer_may_ride`]),
    /// which rides with the next durable commit as on redb.
    pub fn may_ride(&self) -> bool {
        matches!(self, Job::PutEffect { effect, expected, staged, .. } if answer_may_ride(effect, *expected, staged.len()))
    }

    fn staged(&self) -> &Staged {
        match self {
            Job::Claim { .. } => &NOTHING_STAGED,
            Job::PutEffect { staged, .. } | Job::RecordAttempt { staged, .. } => staged,
        }
    }

    /// The advisory locks the job decides or writes under: its operation's, and its KV keys'.
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
    /// one after the other would.
    pub fn exclusive(&self) -> Vec<i64> {
        let kv = versioned(self.staged()).map(|(namespace, key, _)| kv_lock(namespace, key));
        std::iter::once(operation_lock(self.operation_key())).chain(kv).collect()
    }

    /// The run whose lock the job takes, and whether exclusive (`index.rs`): a claim's, and an
    /// attempt's that ends its operation, the jobs that change a status. Each reindexes what it
    /// wrote ([`Writes::reindex`]).
    pub fn run_lock(&self) -> Option<(&str, bool)> {
        match self {
            Job::Claim { req, .. } => Some((&req.run_id, index::ties(&req.step_id))),
            Job::RecordAttempt { attempt, finish: Some(_), .. } => {
                Some((&attempt.run_id, index::ties(&attempt.step_id)))
            }
            Job::PutEffect { .. } | Job::RecordAttempt { .. } => None,
        }
    }

    /// Whether the job may enqueue outbox messages (the group then reads the counter).
    pub fn enqueues(&self) -> bool {
        self.staged().iter().any(|(_, write)| matches!(write, LocalWrite::Outbox { .. }))
    }

    /// Decides from what the group read, with `fence` drawn if it asked for one; hands out outbox
    /// numbers from `read.outbox_seq`.
    pub fn decide(&self, store: &str, read: &mut Read, fence: Option<u64>) -> Decision {
        // A job that fails after taking outbox numbers gives them back: no gap in the sequence.
        let seq = read.outbox_seq;
        let decided = match self {
            Job::Claim { req, token } => return claim(req, *token, read, fence),
            Job::PutEffect { fence, effect, expected, staged } => {
                put_effect(store, *fence, effect, *expected, staged, read)
            }
            Job::RecordAttempt { fence, attempt, finish, now_ms, staged } => {
                record_attempt(store, *fence, attempt, finish.clone(), *now_ms, staged, read)
            }
        };
        if decided.is_err() {
            read.outbox_seq = seq;
        }
        Some(decided)
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

/// What a group read for all its jobs, under all their locks.
#[derive(Default)]
pub(super) struct Read {
    /// Each operation's record and whether it was recorded (`FOR UPDATE`).
    operations: HashMap<String, (OperationRecord, bool)>,
    /// Each operation's claim token (0: none).
    claims: HashMap<String, i64>,
    /// The tokens of the claims of these operations this host let ride, while their owners have
    /// not written since (`riding.rs`); not read from the database.
    ridden: HashMap<String, i64>,
    tombstones: HashMap<String, Tombstone>,
    /// Requests for approval of the claims that came under one (`FOR UPDATE`).
    approvals: HashMap<String, ApprovalRecord>,
    /// The write jobs' operations' effects, each operation's in the order they were dispatched.
    effects: HashMap<String, Vec<EffectRecord>>,
    /// The versions of the keys of versioned KV writes (absent: not stored).
    kv: HashMap<(String, String), u64>,
    /// The last outbox sequence number handed out, if a job may enqueue (`FOR UPDATE`).
    pub outbox_seq: Option<u64>,
    /// Every record of each run the jobs change that is being compensated, or whose change is a
    /// compensation's (`index.rs`).
    pub wholes: BTreeMap<String, index::Whole>,
}

const OPERATIONS: &str =
    "SELECT key, record, recorded, claim FROM oncebox_operations WHERE key = ANY($1::text[]) FOR UPDATE";
const TOMBSTONES: &str = "SELECT operation_key, record FROM oncebox_tombstones WHERE operation_key = ANY($1::text[])";
const APPROVALS: &str =
    "SELECT operation_key, record FROM oncebox_approvals WHERE operation_key = ANY($1::text[]) FOR UPDATE";
const EFFECTS: &str = "SELECT operation_key, record FROM oncebox_effects WHERE operation_key = ANY($1::text[]) \
                       ORDER BY operation_key, first_dispatched_ms, label, effect_key";
/// Looks the keys up by the table's key whatever the table's size when planned (`writes.rs`).
const KV_VERSIONS: &str = "SELECT kv.namespace, kv.key, kv.version FROM oncebox_kv kv \
                           JOIN unnest($1::text[], $2::text[]) AS u(namespace, key) \
                           ON kv.namespace = u.namespace AND kv.key = u.key \
                           WHERE kv.namespace = ANY($1::text[]) AND kv.key = ANY($2::text[])";
/// Reads the last outbox sequence number handed out, locked until the commit.
const OUTBOX_SEQ_FOR_UPDATE: &str = "SELECT value FROM oncebox_meta WHERE name = 'outbox_seq' FOR UPDATE";

/// What a read statement of a group reads: its answers are taken by it.
#[derive(Clone, Copy)]
pub(super) enum Reads {
    Operations,
    Tombstones,
    Approvals,
    Effects,
    Kv,
    OutboxSeq,
    Runs,
}

impl Read {
    /// The status of effect `effect_key` of operation `operation_key` as read, if the group read
    /// that operation's effects (it reads those of every job that writes) and it is recorded.
    pub fn effect_status(&self, operation_key: &str, effect_key: &str) -> Option<EffectStatus> {
        self.effects.get(operation_key)?.iter().find(|e| e.key == effect_key).map(|e| e.status)
    }

    /// Adds what this host knows beside the database: the tokens of the claims of the group's
    /// operations it let ride (`riding.rs`).
    pub fn with_ridden(mut self, ridden: HashMap<String, i64>) -> Read {
        self.ridden = ridden;
        self
    }

    /// The statements that read what `jobs` decide from, each with what it reads. A statement
    /// that would look for nothing (no claim among the jobs, no versioned KV write) is not sent:
    /// a lone job's group is a few statements, not every kind of read.
    pub fn statements(jobs: &[Job]) -> Vec<(Reads, Sql)> {
        let keys: Vec<String> = jobs.iter().map(|job| job.operation_key().to_string()).collect();
        let claims = jobs.iter().filter_map(|job| if let Job::Claim { req, .. } = job { Some(req) } else { None });
        let tombstones: Vec<String> = claims.clone().map(|req| req.key.clone()).collect();
        let approvals: Vec<String> = claims.filter(|req| req.approval.is_some()).map(|req| req.key.clone()).collect();
        let writers: Vec<String> = jobs
            .iter()
            .filter(|job| !matches!(job, Job::Claim { .. }))
            .map(|job| job.operation_key().to_string())
            .collect();
        let (namespaces, kv_keys): (Vec<String>, Vec<String>) = jobs
            .iter()
            .flat_map(|job| versioned(job.staged()).map(|(namespace, key, _)| (namespace.to_string(), key.to_string())))
            .unzip();
        let mut reads = vec![(Reads::Operations, sql!(OPERATIONS, keys))];
        if !tombstones.is_empty() {
            reads.push((Reads::Tombstones, sql!(TOMBSTONES, tombstones)));
        }
        if !approvals.is_empty() {
            reads.push((Reads::Approvals, sql!(APPROVALS, approvals)));
        }
        if !writers.is_empty() {
            reads.push((Reads::Effects, sql!(EFFECTS, writers)));
        }
        if !namespaces.is_empty() {
            reads.push((Reads::Kv, sql!(KV_VERSIONS, namespaces, kv_keys)));
        }
        if jobs.iter().any(Job::enqueues) {
            reads.push((Reads::OutboxSeq, sql!(OUTBOX_SEQ_FOR_UPDATE)));
        }
        let mut runs: BTreeMap<String, bool> = BTreeMap::new();
        for (run, tie) in jobs.iter().filter_map(Job::run_lock) {
            *runs.entry(run.to_string()).or_default() |= tie;
        }
        if !runs.is_empty() {
            reads.push((Reads::Runs, index::whole_runs(runs)));
        }
        reads
    }

    /// What the answers to [`Read::statements`] say, each with what its statement read.
    pub fn of<'r>(answers: impl IntoIterator<Item = (Reads, &'r [Row])>) -> Result<Read, LedgerError> {
        let mut read = Read::default();
        for (reads, rows) in answers {
            match reads {
                Reads::Operations => {
                    for row in rows {
                        let key: String = column(row, 0, "oncebox_operations")?;
                        let op = (record(row, 1, "oncebox_operations")?, column(row, 2, "oncebox_operations")?);
                        read.claims.insert(key.clone(), column(row, 3, "oncebox_operations")?);
                        read.operations.insert(key, op);
                    }
                }
                Reads::Tombstones => {
                    for row in rows {
                        let tombstone = record(row, 1, "oncebox_tombstones")?;
                        read.tombstones.insert(column(row, 0, "oncebox_tombstones")?, tombstone);
                    }
                }
                Reads::Approvals => {
                    for row in rows {
                        let approval = record(row, 1, "oncebox_approvals")?;
                        read.approvals.insert(column(row, 0, "oncebox_approvals")?, approval);
                    }
                }
                Reads::Effects => {
                    for row in rows {
                        let key: String = column(row, 0, "oncebox_effects")?;
                        read.effects.entry(key).or_default().push(record(row, 1, "oncebox_effects")?);
                    }
                }
                Reads::Kv => {
                    for row in rows {
                        let version: i64 = column(row, 2, "oncebox_kv")?;
                        let key = (column(row, 0, "oncebox_kv")?, column(row, 1, "oncebox_kv")?);
                        read.kv.insert(key, uint(version));
                    }
                }
                Reads::OutboxSeq => {
                    if let Some(row) = rows.first() {
                        read.outbox_seq = Some(uint(column(row, 0, "oncebox_meta")?));
                    }
                }
                Reads::Runs => read.wholes = index::wholes(rows)?,
            }
        }
        Ok(read)
    }
}

fn claim(req: &ClaimRequest, token: i64, read: &Read, drawn: Option<u64>) -> Decision {
    let decided = (|| {
        let existing = read.operations.get(&req.key);
        if let Some(answer) = verdict(existing.map(|(op, _)| op), req) {
            return Ok(Some(Decided::claim(answer, Writes::default(), false)));
        }
        let mut writes = Writes::default();
        let Some((expired, recorded)) = existing else {
            // A new operation: not one retention removed, and only under the approval its caller
            // saw (read under the operation's lock, which a decision on the approval holds too).
            if let Some(tombstone) = read.tombstones.get(&req.key) {
                return Ok(Some(Decided::claim(Claim::Expired(tombstone.clone()), writes, false)));
            }
            if req.approval.is_some() && !approval_stands(req, read.approvals.get(&req.key)) {
                return Ok(Some(Decided::claim(Claim::ApprovalChanged, writes, false)));
            }
            let mut op = take_over(None, req, 1);
            // A claim of it made here rode and is gone (`riding.rs`): its owner may still write
            // with the first fence from this host, so this claim draws one that owner never held.
            if read.ridden.contains_key(&req.key) {
                let Some(drawn) = drawn else { return Ok(None) };
                op.fence = drawn;
            }
            // Rides with the owner's next flushed write, which checks that the row is still this
            // claim's (`riding.rs`). One with a drawn fence waits for its own flush, and so does
            // one under a person's approval: a decision on that approval is refused once a call of
            // it has started (`jobs::put_approval`), and the refusal should rest on a claim on
            // disk. (A redb claim lives in memory until its first durable write all the same; a
            // crash there takes the refusing process with it, and the approval then stands for
            // the call's retry, as the refusal said.)
            let rides = op.fence == 1 && req.approval.is_none();
            writes.inserted.push(OperationRow::of(&op)?.claimed_with(token));
            writes.reindex.push(op.clone());
            let answer = Claim::Owned { fence: op.fence, previous_attempts: op.attempts };
            return Ok(Some(Decided::claim(answer, writes, rides)));
        };
        // The lease expired: the previous owner stalled or died.
        let Some(drawn) = drawn else { return Ok(None) };
        let held = expired.fence;
        let mut op = take_over(Some(expired.clone()), req, drawn.max(held + 1));
        op.status = OperationStatus::Claimed;
        writes.updated.push((OperationRow::of(&op)?, *recorded, int(held), OperationStatus::Claimed.as_str()));
        let answer = Claim::Owned { fence: op.fence, previous_attempts: op.attempts };
        writes.reindex.push(op);
        writes.announce.push(req.key.clone());
        Ok(Some(Decided::claim(answer, writes, false)))
    })();
    decided.transpose()
}

/// The operation and whether it was recorded, if `fence` owns it (claimed with that fence, and,
/// for a claim that rode, by that claim: `riding.rs`); `Fenced` or `ClaimLost` otherwise.
fn owned(read: &Read, key: &str, fence: u64) -> Result<(OperationRecord, bool), LedgerError> {
    let row = read
        .operations
        .get(key)
        .map(|(op, _)| (op.fence, op.status == OperationStatus::Claimed, read.claims.get(key).copied().unwrap_or(0)));
    if claim_lost(fence, read.ridden.get(key).copied(), row) {
        return Err(LedgerError::ClaimLost { operation_key: key.to_string() });
    }
    match read.operations.get(key) {
        Some((op, recorded)) if op.fence == fence && op.status == OperationStatus::Claimed => {
            Ok((op.clone(), *recorded))
        }
        other => Err(LedgerError::Fenced {
            operation_key: key.to_string(),
            fence,
            current: other.map_or(0, |(op, _)| op.fence),
        }),
    }
}

fn put_effect(
    store: &str,
    fence: u64,
    effect: &EffectRecord,
    expected: Option<(EffectStatus, u32)>,
    staged: &Staged,
    read: &mut Read,
) -> Result<Decided, LedgerError> {
    let key = effect.operation_key.as_str();
    let (op, recorded) = owned(read, key, fence)?;
    let on_record = read.effects.get(key).map_or(&[][..], Vec::as_slice);
    let current = on_record.iter().find(|e| e.key == effect.key).map(|e| (e.status, e.dispatches));
    if current != expected {
        return Err(LedgerError::EffectChanged { operation_key: key.to_string(), effect_key: effect.key.clone() });
    }
    let fresh = unapplied(key, staged, on_record, &read.kv)?;
    // Decided; from here on only writes.
    let mut writes = Writes::default();
    if !recorded {
        writes.updated.push((OperationRow::of(&op)?, true, int(fence), OperationStatus::Claimed.as_str()));
    }
    apply_local(store, key, fresh, &mut read.outbox_seq, &mut writes)?;
    match expected {
        None => writes.effects_new.push(EffectRow::of(key, effect)?),
        Some((status, dispatches)) => {
            writes.effects_changed.push((EffectRow::of(key, effect)?, effect_status_str(status), i64::from(dispatches)))
        }
    }
    let rides = answer_may_ride(effect, expected, staged.len());
    Ok(Decided { answer: Answer::Written, writes, rides })
}

fn record_attempt(
    store: &str,
    fence: u64,
    attempt: &AttemptRecord,
    finish: Option<Finish>,
    now_ms: u64,
    staged: &Staged,
    read: &mut Read,
) -> Result<Decided, LedgerError> {
    let key = attempt.operation_key.as_str();
    let (mut op, _) = owned(read, key, fence)?;
    // The run's lock was taken, and its records read, by the run and step the attempt names.
    if finish.is_some() && (op.run_id != attempt.run_id || op.step_id != attempt.step_id) {
        return Err(LedgerError::Database {
            store: store.to_string(),
            what: format!("the attempt of {key} names another run or step than its operation; nothing was written"),
        });
    }
    let on_record = read.effects.get(key).map_or(&[][..], Vec::as_slice);
    let fresh = unapplied(key, staged, on_record, &read.kv)?;
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
    let mut writes = Writes::default();
    if let Some((status, output, error)) = finish {
        op.status = status;
        op.output = output;
        op.error = error;
        op.lease_until_ms = 0;
        writes.announce.push(key.to_string());
        writes.reindex.push(op.clone());
    }
    writes.updated.push((OperationRow::of(&op)?, true, int(fence), OperationStatus::Claimed.as_str()));
    apply_local(store, key, fresh, &mut read.outbox_seq, &mut writes)?;
    writes.attempts.push((key.to_string(), i64::from(attempt.attempt), encode(attempt)?));
    Ok(Decided { answer: Answer::Written, writes, rides: false })
}

/// The staged local effects whose keys hold nothing yet (an earlier attempt may have applied the
/// others); refuses them all if a key holds another request (the tool diverged), or if a
/// versioned KV write finds its key at another version than it read.
fn unapplied<'s>(
    key: &str,
    staged: &'s Staged,
    on_record: &[EffectRecord],
    versions: &HashMap<(String, String), u64>,
) -> Result<Vec<(&'s EffectRecord, &'s LocalWrite)>, LedgerError> {
    let mut fresh = Vec::with_capacity(staged.len());
    for (effect, write) in staged {
        match on_record.iter().find(|e| e.key == effect.key) {
            None => {
                if let LocalWrite::KvSet { namespace, key: kv_key, expected: Some(expected), .. } = write {
                    let found = versions.get(&(namespace.clone(), kv_key.clone())).copied().unwrap_or(0);
                    if found != *expected {
                        return Err(LedgerError::KvConflict { namespace: namespace.clone(), key: kv_key.clone() });
                    }
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

/// KV and outbox writes with their effect records: exactly once, in the transaction that records
/// them.
fn apply_local(
    store: &str,
    operation_key: &str,
    fresh: Vec<(&EffectRecord, &LocalWrite)>,
    seq: &mut Option<u64>,
    writes: &mut Writes,
) -> Result<(), LedgerError> {
    for (effect, write) in fresh {
        match write {
            LocalWrite::KvSet { namespace, key, value, .. } => {
                writes.kv.push((namespace.clone(), key.clone(), Some((value.clone(), int(stamp(&effect.key))))))
            }
            LocalWrite::KvDelete { namespace, key } => writes.kv.push((namespace.clone(), key.clone(), None)),
            LocalWrite::Outbox { topic, payload } => {
                // The counter row is locked until the commit, so numbers are handed out in commit
                // order and a rolled-back transaction leaves no gap.
                let last = seq
                    .as_mut()
                    .ok_or_else(|| LedgerError::Corrupt { what: format!("{store}: no outbox_seq in oncebox_meta") })?;
                *last += 1;
                let message = OutboxMessage::enqueued(*last, effect, topic, payload);
                writes.outbox.push((int(*last), topic.clone(), encode(&message)?));
            }
        }
        writes.effects_applied.push(EffectRow::of(operation_key, effect)?);
    }
    Ok(())
}
