//! Group commit: the hot-path Store calls of many callers (`grouped.rs`) share one transaction,
//! so that one COMMIT, one WAL flush, carries them all, and each transaction is two round trips
//! whatever its size (`pipeline.rs`):
//!
//! 1. BEGIN, every job's locks (one statement, ascending), every job's reads, and the outbox
//!    counter if a job may enqueue;
//! 2. the jobs decide, in order (a take-over first draws its fence: one more round, rare);
//! 3. every write, in one statement (`combine.rs`, which refuses a row named twice), and COMMIT
//!    (or ROLLBACK, if nothing was decided to be written).
//!
//! A group whose writes all may ride (new operations' claims and effects' answers: `Decided`)
//! commits without waiting for its WAL flush: the next flushed COMMIT, this host's or another's,
//! carries it to disk. What that asks of the owners' next flushed writes: `riding.rs`.
//!
//! A job refused (fenced, a KV conflict, a finish the rule of evidence refuses) writes nothing and
//! so costs the others nothing. If the database refuses a statement (a checked write found its
//! row changed, a deadlock with some other writer, a lock waited for too long, a value it cannot
//! store), nothing of the transaction was committed, and each of its jobs runs again alone, so
//! that the failure is answered only to the job it belongs to. If the database cannot be reached,
//! every job is told so. If the connection fails after the COMMIT may have been sent, or the
//! COMMIT itself fails, whether the group was recorded is unknown, and every job that wrote is
//! answered so (one that decided to write nothing keeps its answer).
//!
//! One runner carries one group at a time on a connection of the pool ([`RUNNERS`]); a group takes
//! every job waiting when the runner comes free, so groups grow with the load and a lone caller's
//! group is its own job, sent at once (no waiting for company). Under load, a group gives way to
//! the callers a few times before it closes ([`YIELDS`]), so that those the last group answered
//! join it.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use deadpool_postgres::Pool;
use tokio::sync::{mpsc, oneshot};

use super::combine::{self, Check, Part};
use super::db::{describe, uint};
use super::grouped::{Answer, Decided, Decision, GUARD_FAILED, Job, Read, Reads};
use super::index::{self, After, IndexWrites};
use super::pipeline::{self, Sql, sql};
use super::riding::Riding;
use super::writes::Writes;
use crate::LedgerError;

/// Groups in flight at once, each on its own connection. One: while a group commits, the next
/// gathers every job that arrives meanwhile, and no group waits on another's locks (two groups
/// often share one: a KV key every call writes, say; the bench's workload does). Measured against
/// two and four at 64 callers (BENCHMARKS.md), one carried the most calls.
pub(super) const RUNNERS: usize = 1;
/// The most jobs in one group.
const MOST: usize = 256;
/// A group this large means callers are queuing: the next one waits for company a little.
const BUSY: usize = 8;
/// How many times a group under load gives way to the callers before it closes, when no job is
/// waiting. Measured at 64 callers (BENCHMARKS.md): none 6,382-7,075 calls/s, 8 8,147-9,144, 16
/// 7,586-9,000.
const YIELDS: usize = 8;

type Reply = oneshot::Sender<Result<Answer, LedgerError>>;

/// Where the store's hot-path calls wait for a group.
pub(super) struct Groups {
    jobs: mpsc::UnboundedSender<(Job, Reply)>,
    riding: Arc<Mutex<Riding>>,
}

/// What the runners share.
struct Shared {
    pool: Pool,
    store: String,
    commits: Arc<AtomicU64>,
    receiver: tokio::sync::Mutex<mpsc::UnboundedReceiver<(Job, Reply)>>,
    /// Jobs taken from the queue that shared a lock with a job already in the group: they go
    /// first in the next group.
    held_back: Mutex<Vec<(Job, Reply)>>,
    /// How many jobs the last group carried.
    last: AtomicUsize,
    /// The claims and answers that rode and are not yet flushed (`riding.rs`).
    riding: Arc<Mutex<Riding>>,
}

impl Groups {
    /// Starts the runners; they stop once this is dropped and the queue is empty.
    pub fn start(pool: Pool, store: String, commits: Arc<AtomicU64>) -> Groups {
        let (jobs, receiver) = mpsc::unbounded_channel();
        let riding = Arc::new(Mutex::new(Riding::default()));
        let shared = Arc::new(Shared {
            pool,
            store,
            commits,
            receiver: tokio::sync::Mutex::new(receiver),
            held_back: Mutex::new(Vec::new()),
            last: AtomicUsize::new(0),
            riding: riding.clone(),
        });
        for _ in 0..RUNNERS {
            tokio::spawn(run(shared.clone()));
        }
        Groups { jobs, riding }
    }

    /// The token of the claim of `operation` made here that rode, while its owner has not
    /// written since (`riding.rs`).
    pub fn ridden_claim(&self, operation: &str) -> Option<i64> {
        lock(&self.riding).ridden_claim(operation)
    }

    /// Runs `job` in the next group and answers what it decided, once its group committed.
    pub async fn submit(&self, job: Job, store: &str) -> Result<Answer, LedgerError> {
        let stopped = || LedgerError::Database {
            store: store.to_string(),
            what: "the ledger's writers stopped: whether this write was recorded is known only by reading the ledger \
                   again"
                .into(),
        };
        let (reply, answer) = oneshot::channel();
        self.jobs.send((job, reply)).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

async fn run(shared: Arc<Shared>) {
    while let Some(group) = next_group(&shared).await {
        let (jobs, replies): (Vec<Job>, Vec<Reply>) = group.into_iter().unzip();
        let answers = carry(&shared, &jobs).await;
        for (reply, answer) in replies.into_iter().zip(answers) {
            let _ = reply.send(answer);
        }
    }
}

/// The next group: the jobs held back first, then every job waiting (at least one, waited for),
/// leaving out any that shares a lock with one already in where either decides under it
/// (`Job::exclusive`); `None` once the store is gone.
async fn next_group(shared: &Shared) -> Option<Vec<(Job, Reply)>> {
    let mut group = Vec::new();
    // Every lock of the group's jobs, and those that one of them decides under.
    let (mut locks, mut exclusive) = (HashSet::new(), HashSet::new());
    let held_back = std::mem::take(&mut *shared.held_back.lock().unwrap_or_else(|e| e.into_inner()));
    let mut still_held = Vec::new();
    let mut admit = |entry: (Job, Reply), group: &mut Vec<(Job, Reply)>, still_held: &mut Vec<(Job, Reply)>| {
        // A caller that stopped waiting (its call was dropped, its process is going) gets no
        // write it would never hear of: as if its transaction had never been sent.
        if entry.1.is_closed() {
            return;
        }
        let (ids, own) = (entry.0.locks(), entry.0.exclusive());
        if group.len() >= MOST || own.iter().any(|id| locks.contains(id)) || ids.iter().any(|id| exclusive.contains(id))
        {
            still_held.push(entry);
        } else {
            locks.extend(ids);
            exclusive.extend(own);
            group.push(entry);
        }
    };
    for entry in held_back {
        admit(entry, &mut group, &mut still_held);
    }
    if group.is_empty() {
        let mut receiver = shared.receiver.lock().await;
        let first = receiver.recv().await?;
        admit(first, &mut group, &mut still_held);
        // Under load, the callers the last group answered are about to hand in their next jobs
        // (their tools run on this runtime): giving way to them a few times before closing the
        // group lets it carry them too. A lone caller's group goes at once.
        let mut left = if shared.last.load(Ordering::Relaxed) >= BUSY { YIELDS } else { 0 };
        while group.len() < MOST {
            match receiver.try_recv() {
                Ok(entry) => admit(entry, &mut group, &mut still_held),
                Err(_) if left > 0 => {
                    left -= 1;
                    tokio::task::yield_now().await;
                }
                Err(_) => break,
            }
        }
    }
    shared.last.store(group.len(), Ordering::Relaxed);
    if !still_held.is_empty() {
        shared.held_back.lock().unwrap_or_else(|e| e.into_inner()).extend(still_held);
    }
    Some(group)
}

/// How a group's transaction ended, when it did not commit.
enum Failed {
    /// The database refused a statement of it: nothing was committed, and each job may fare
    /// otherwise alone.
    RolledBack(LedgerError),
    /// The database could not be reached, or the connection failed, before the COMMIT could have
    /// been sent: nothing was committed, and running the jobs alone would meet the same.
    Unreachable(String),
    /// The connection failed, or the COMMIT itself failed, after the COMMIT may have been sent:
    /// why, and the answers of the jobs that decided to write nothing (theirs whatever became of
    /// the others').
    Unknown(String, Vec<Option<Result<Answer, LedgerError>>>),
}

/// The error of a job of a failed group.
fn database(shared: &Shared, what: &str) -> Result<Answer, LedgerError> {
    Err(LedgerError::Database { store: shared.store.clone(), what: what.to_string() })
}

/// Runs `jobs` in one transaction and answers each; if the database refused the transaction,
/// runs each job alone, all at once (one waiting for a lock does not hold up the others), so that
/// one job's failure is answered to it only.
async fn carry(shared: &Shared, jobs: &[Job]) -> Vec<Result<Answer, LedgerError>> {
    let alone = |failed: Failed| match failed {
        Failed::RolledBack(e) => vec![Err(e)],
        Failed::Unreachable(what) => vec![database(shared, &what)],
        Failed::Unknown(what, mut own) => vec![own.pop().flatten().unwrap_or_else(|| database(shared, &what))],
    };
    match transaction(shared, jobs).await {
        Ok(answers) => answers,
        Err(Failed::Unreachable(what)) => jobs.iter().map(|_| database(shared, &what)).collect(),
        Err(Failed::Unknown(what, own)) => {
            own.into_iter().map(|answer| answer.unwrap_or_else(|| database(shared, &what))).collect()
        }
        Err(failed) if jobs.len() == 1 => alone(failed),
        Err(Failed::RolledBack(_)) => {
            let each = jobs.iter().map(|job| async move {
                match transaction(shared, std::slice::from_ref(job)).await {
                    Ok(mut answer) => answer.pop().unwrap_or_else(|| database(shared, "a job was not answered")),
                    Err(failed) => alone(failed).pop().unwrap_or_else(|| database(shared, "a job was not answered")),
                }
            });
            futures_util::future::join_all(each).await
        }
    }
}

/// One transaction carrying `jobs`: their answers, or how it failed.
async fn transaction(shared: &Shared, jobs: &[Job]) -> Result<Vec<Result<Answer, LedgerError>>, Failed> {
    let fail = |what: String| LedgerError::Database { store: shared.store.clone(), what };
    let client = shared.pool.get().await.map_err(|e| Failed::Unreachable(format!("cannot connect: {e}")))?;
    let mut connection = Connection { client: Some(client), clean: false };
    let client = connection.client.as_ref().ok_or_else(|| Failed::Unreachable("no connection".into()))?;

    // Round 1: BEGIN, the locks, the reads.
    // Operations' and KV keys' locks exclusive; runs' as their jobs ask (`index.rs`).
    let mut locks: Vec<(i64, bool)> = jobs.iter().flat_map(Job::locks).map(|id| (id, true)).collect();
    locks.extend(jobs.iter().filter_map(Job::run_lock).map(|(run, tie)| (super::db::run_lock(run), tie)));
    // A group of several waits for a lock held elsewhere (another host's group, a stalled host's
    // write) a second at most, then its jobs run alone, each waiting for its own locks only: one
    // busy operation does not hold up every call of this host. A lone job waits as its session
    // does (without a bound, unless the URL says otherwise: `options.rs`, which also has the
    // sessions plan these statements generically).
    let mut first = vec![sql!("BEGIN ISOLATION LEVEL READ COMMITTED")];
    if jobs.len() > 1 {
        first.push(sql!("SET LOCAL lock_timeout = 1000"));
    }
    first.push(pipeline::lock_all(locks));
    let reads_from = first.len();
    let (kinds, reads): (Vec<Reads>, Vec<Sql>) = Read::statements(jobs).into_iter().unzip();
    first.extend(reads);
    let answers = read_round(shared, client, &first).await?;
    let read = kinds.into_iter().zip(answers[reads_from..].iter().map(Vec::as_slice));
    let ridden = riding(shared).ridden_claims(jobs.iter().map(Job::operation_key));
    let mut read = Read::of(read).map_err(Failed::RolledBack)?.with_ridden(ridden);
    let before = read.outbox_seq;

    // The decisions, in job order (outbox numbers are handed out in it).
    let mut decided = Vec::with_capacity(jobs.len());
    let mut need_fence = Vec::new();
    for (i, job) in jobs.iter().enumerate() {
        let seq = read.outbox_seq;
        let mut decision: Decision = job.decide(&shared.store, &mut read, None);
        // A write-ahead of an owner whose riding answer the database lost sends nothing
        // (`riding.rs`); it gives back the outbox numbers it took.
        if let Some(Ok(_)) = &decision
            && let Some(lost) = riding(shared).refusal(job, &read)
        {
            read.outbox_seq = seq;
            decision = Some(Err(lost));
        }
        if decision.is_none() {
            need_fence.push(i);
        }
        decided.push(decision);
    }
    if !need_fence.is_empty() {
        let draws: Vec<Sql> = need_fence.iter().map(|_| sql!("SELECT nextval('oncebox_fence')")).collect();
        let fences = read_round(shared, client, &draws).await?;
        for (i, rows) in need_fence.into_iter().zip(fences) {
            let fence = rows.first().map(|row| super::db::column::<i64>(row, 0, "oncebox_fence"));
            let fence = fence.transpose().map_err(Failed::RolledBack)?.map(uint);
            let Some(fence) = fence else { return Err(Failed::RolledBack(fail("nextval returned no row".into()))) };
            decided[i] = Some(
                jobs[i]
                    .decide(&shared.store, &mut read, Some(fence))
                    .unwrap_or_else(|| Err(fail("a take-over asked for a fence twice".into()))),
            );
        }
    }

    // Round 2: the writes and COMMIT.
    let mut writes = Writes::default();
    let mut results = Vec::with_capacity(jobs.len());
    // Whether each job has writes in the group (its answer then waits for the COMMIT's).
    let mut writing = Vec::with_capacity(jobs.len());
    // Whether every job that writes may ride with the next durable commit (`Decided::rides`).
    let mut rides = true;
    for decision in decided {
        match decision {
            Some(Ok(Decided { answer, writes: own, rides: own_rides })) => {
                rides &= own.is_empty() || own_rides;
                writing.push(!own.is_empty());
                writes.extend(own);
                results.push(Ok(answer));
            }
            Some(Err(e)) => {
                writing.push(false);
                results.push(Err(e));
            }
            None => {
                writing.push(false);
                results.push(Err(fail("a job was not decided".into())));
            }
        }
    }
    // The index of open work, from what the jobs wrote, by run (`index.rs`).
    let mut index = IndexWrites::default();
    let mut by_run: BTreeMap<String, Vec<After>> = BTreeMap::new();
    for op in std::mem::take(&mut writes.reindex) {
        by_run.entry(op.run_id.clone()).or_default().push(After::op(&op));
    }
    for (run, after) in &by_run {
        index::reindex(&shared.store, run, after, read.wholes.get(run), false, &mut index)
            .map_err(Failed::RolledBack)?;
    }
    if writes.is_empty() {
        // Nothing to write: no commit to pay for (the locks go with the transaction).
        if read_round(shared, client, &[sql!("ROLLBACK")]).await.is_ok() {
            connection.clean = true;
        }
        return Ok(results);
    }
    // A group of riders alone is committed without waiting for its WAL flush: visible at once,
    // to every host, and durable with the next commit that waits for its flush (whoever makes
    // it), since the server flushes its WAL in order. A server crash before then loses it.
    let mut second = Vec::new();
    if rides {
        second.push(sql!("SET LOCAL synchronous_commit = off"));
    }
    // Every write in one statement (`combine.rs`).
    let mut parts = writes.parts();
    parts.extend(index.parts());
    if let Some(seq) = read.outbox_seq
        && Some(seq) != before
    {
        let outbox_seq = sql!(OUTBOX_SEQ_SET, super::db::int(seq));
        parts.push(Part::of(outbox_seq, Check::None, vec![combine::row("oncebox_meta", &["outbox_seq"])], 64));
    }
    // A row named twice is a bug: nothing is written, and the jobs run again alone (the
    // connection, its transaction open, goes: `Connection`).
    let writes = combine::statements(parts).map_err(|twice| Failed::RolledBack(fail(twice.to_string())))?;
    second.extend(writes);
    second.push(sql!("COMMIT"));
    let answers = match pipeline::round(client, &second).await {
        Ok(answers) => answers,
        // Not sent, nor anything after it: no COMMIT. The transaction is left open, and the
        // connection goes with it (`Connection`), which rolls it back.
        Err((i, e)) if e.as_db_error().is_some() => {
            return Err(Failed::RolledBack(statement_failed(&shared.store, &second[i].text, &e)));
        }
        Err((_, e)) => return Err(Failed::Unreachable(format!("the connection failed: {}", describe(&e)))),
    };
    // A statement the server failed aborted the transaction, and the COMMIT after it rolled it
    // back: nothing was recorded. Otherwise, a connection that failed may have delivered the
    // COMMIT, and a COMMIT that failed itself may have been recorded before it failed (a server
    // shutting down, a standby's wait cancelled): whether it was is unknown.
    let last = second.len() - 1;
    let mut refused = None;
    for (i, (statement, answer)) in second.iter().zip(answers).enumerate() {
        let Err(e) = answer else { continue };
        if refused.is_none() && e.as_db_error().is_some() && i < last {
            refused = Some(statement_failed(&shared.store, &statement.text, &e));
        } else if refused.is_none() {
            connection.clean = e.as_db_error().is_some();
            let what = format!(
                "the COMMIT of this write failed ({}): whether it was recorded is known only by reading the ledger \
                 again",
                describe(&e)
            );
            let own = results.into_iter().zip(writing).map(|(answer, wrote)| (!wrote).then_some(answer)).collect();
            return Err(Failed::Unknown(what, own));
        }
    }
    connection.clean = true;
    if let Some(e) = refused {
        return Err(Failed::RolledBack(e));
    }
    if !rides {
        shared.commits.fetch_add(1, Ordering::Relaxed);
    }
    riding(shared).committed(jobs, &writing, rides);
    Ok(results)
}

fn riding(shared: &Shared) -> MutexGuard<'_, Riding> {
    lock(&shared.riding)
}

fn lock(riding: &Mutex<Riding>) -> MutexGuard<'_, Riding> {
    riding.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sets the last outbox sequence number handed out.
const OUTBOX_SEQ_SET: &str = "UPDATE oncebox_meta SET value = $1 WHERE name = 'outbox_seq'";

/// A round before anything was sent that could commit: any failure means nothing was recorded.
async fn read_round(
    shared: &Shared,
    client: &deadpool_postgres::Client,
    statements: &[Sql],
) -> Result<Vec<Vec<deadpool_postgres::tokio_postgres::Row>>, Failed> {
    // A database's refusal leaves the jobs to run alone; a connection's failure, to be told.
    let failed = |i: usize, e: &deadpool_postgres::tokio_postgres::Error| match e.as_db_error() {
        Some(_) => Failed::RolledBack(statement_failed(&shared.store, &statements[i].text, e)),
        None => Failed::Unreachable(format!("the connection failed: {}", describe(e))),
    };
    let answers = pipeline::round(client, statements).await.map_err(|(i, e)| failed(i, &e))?;
    let mut rows = Vec::with_capacity(statements.len());
    for (i, answer) in answers.into_iter().enumerate() {
        rows.push(answer.map_err(|e| failed(i, &e))?);
    }
    Ok(rows)
}

/// A statement that failed, in one line, naming the writes of a joined one (`combine.rs`); a
/// guarded write that found its row changed says so.
fn statement_failed(store: &str, sql: &str, e: &deadpool_postgres::tokio_postgres::Error) -> LedgerError {
    let heads = combine::heads(sql).into_iter().map(|head| format!("`{head} ...`")).collect::<Vec<_>>();
    let what = if e.as_db_error().is_some_and(|db| db.code().code() == GUARD_FAILED) {
        format!("one of {} found its row changed although its lock was held", heads.join(", "))
    } else if !heads.is_empty() {
        format!("the writes {} failed: {}", heads.join(", "), describe(e))
    } else {
        return super::db::failed(store, sql, e);
    };
    LedgerError::Database { store: store.to_string(), what }
}

/// A connection carrying a group's transaction: unless the transaction was ended (`clean`), the
/// connection leaves the pool when dropped, so that no later call meets a transaction left open
/// (a runner stopped mid-group, a failed round).
struct Connection {
    client: Option<deadpool_postgres::Client>,
    clean: bool,
}

impl Drop for Connection {
    fn drop(&mut self) {
        if !self.clean
            && let Some(client) = self.client.take()
        {
            drop(deadpool_postgres::Object::take(client));
        }
    }
}
