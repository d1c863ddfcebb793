//! Group commit: the hot-path Store calls of many callers (`grouped.rs`) share one transaction,
//! so that one COMMIT, one WAL flush, carries them all, and each transaction is two round trips
//! whatever its size (`pipeline.rs`):
//!
//! 1. BEGIN, every job's locks (one statement, ascending), every job's reads, and the outbox
//!    counter if a job may enqueue;
//! 2. the jobs decide, in order (a take-over first draws its fence: one more round, rare);
//! 3. every write and COMMIT (or ROLLBACK, if nothing was decided to be written).
//!
//! A job refused (fenced, a KV conflict, a finish the rule of evidence refuses) writes nothing and
//! so costs the others nothing. If the database fails the transaction (a guarded write found its
//! row changed, a deadlock with some other writer, a statement's error), nothing of it was
//! committed, and each of its jobs runs again alone, so that the failure is answered only to the
//! job it belongs to. If the connection fails while the COMMIT may have been sent, whether the
//! group was recorded is unknown, and every job of it is answered so.
//!
//! A few runners each carry one group at a time on a connection of the pool; a group takes every
//! job waiting when its runner comes free, so groups grow with the load and a lone caller's group
//! is its own job, sent at once (no waiting for company).

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use deadpool_postgres::Pool;
use tokio::sync::{mpsc, oneshot};

use super::db::{describe, uint};
use super::grouped::{Answer, Decided, Decision, GUARD_FAILED, Job, Read, Writes};
use super::pipeline::{self, Sql, sql};
use crate::LedgerError;

/// Groups in flight at once, each on its own connection. One: while a group commits, the next
/// gathers every job that arrives meanwhile, and no group waits on another's locks (two groups
/// often share one: a KV key every call writes, say; the bench's workload does). Measured against
/// two and four at 64 callers (BENCHMARKS.md), one carried the most calls.
pub(super) const RUNNERS: usize = 1;
/// The most jobs in one group.
const MOST: usize = 256;

type Reply = oneshot::Sender<Result<Answer, LedgerError>>;

/// Where the store's hot-path calls wait for a group.
pub(super) struct Groups {
    jobs: mpsc::UnboundedSender<(Job, Reply)>,
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
}

impl Groups {
    /// Starts the runners; they stop once this is dropped and the queue is empty.
    pub fn start(pool: Pool, store: String, commits: Arc<AtomicU64>) -> Groups {
        let (jobs, receiver) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            pool,
            store,
            commits,
            receiver: tokio::sync::Mutex::new(receiver),
            held_back: Mutex::new(Vec::new()),
        });
        for _ in 0..RUNNERS {
            tokio::spawn(run(shared.clone()));
        }
        Groups { jobs }
    }

    /// Runs `job` in the next group and answers what it decided, once its group committed.
    pub async fn submit(&self, job: Job, store: &str) -> Result<Answer, LedgerError> {
        let stopped =
            || LedgerError::Database { store: store.to_string(), what: "the ledger's writers stopped".into() };
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
        while group.len() < MOST {
            match receiver.try_recv() {
                Ok(entry) => admit(entry, &mut group, &mut still_held),
                Err(_) => break,
            }
        }
    }
    if !still_held.is_empty() {
        shared.held_back.lock().unwrap_or_else(|e| e.into_inner()).extend(still_held);
    }
    Some(group)
}

/// How a group's transaction ended, when it did not commit.
enum Failed {
    /// The database refused it: nothing was committed.
    RolledBack(LedgerError),
    /// The connection failed after the COMMIT may have been sent: why.
    Unknown(String),
}

/// Runs `jobs` in one transaction and answers each; if the database refused the transaction,
/// runs each job alone (`alone`), so that one job's failure is answered to it only.
async fn carry(shared: &Shared, jobs: &[Job]) -> Vec<Result<Answer, LedgerError>> {
    match transaction(shared, jobs).await {
        Ok(answers) => answers,
        Err(Failed::Unknown(what)) => jobs
            .iter()
            .map(|_| Err(LedgerError::Database { store: shared.store.clone(), what: what.clone() }))
            .collect(),
        Err(Failed::RolledBack(e)) if jobs.len() == 1 => vec![Err(e)],
        Err(Failed::RolledBack(_)) => {
            let mut answers = Vec::with_capacity(jobs.len());
            for job in jobs {
                answers.push(match transaction(shared, std::slice::from_ref(job)).await {
                    Ok(mut answer) => answer.remove(0),
                    Err(Failed::RolledBack(e)) => Err(e),
                    Err(Failed::Unknown(what)) => Err(LedgerError::Database { store: shared.store.clone(), what }),
                });
            }
            answers
        }
    }
}

/// One transaction carrying `jobs`: their answers, or how it failed.
async fn transaction(shared: &Shared, jobs: &[Job]) -> Result<Vec<Result<Answer, LedgerError>>, Failed> {
    let fail = |what: String| LedgerError::Database { store: shared.store.clone(), what };
    let client = shared.pool.get().await.map_err(|e| Failed::RolledBack(fail(format!("cannot connect: {e}"))))?;
    let mut connection = Connection { client: Some(client), clean: false };
    let client = connection.client.as_ref().ok_or_else(|| Failed::RolledBack(fail("no connection".into())))?;

    // Round 1: BEGIN, the locks, the reads.
    let mut locks: Vec<i64> = jobs.iter().flat_map(Job::locks).collect();
    locks.sort_unstable();
    locks.dedup();
    // A group's statements take arrays of any length, and their best plan does not depend on
    // the values: planning them once per connection (a generic plan) instead of at every
    // execution saves a good part of the server's time per group.
    let mut first = vec![
        sql!("BEGIN ISOLATION LEVEL READ COMMITTED"),
        sql!("SET LOCAL plan_cache_mode = force_generic_plan"),
        pipeline::lock_all(locks),
    ];
    first.extend(Read::statements(jobs));
    let answers = read_round(shared, client, &first).await?;
    let mut read = Read::of(&answers[3..]).map_err(Failed::RolledBack)?;
    let before = read.outbox_seq;

    // The decisions, in job order (outbox numbers are handed out in it).
    let mut decided = Vec::with_capacity(jobs.len());
    let mut need_fence = Vec::new();
    for (i, job) in jobs.iter().enumerate() {
        let decision: Decision = job.decide(&shared.store, &mut read, None);
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
    for decision in decided {
        match decision {
            Some(Ok(Decided { answer, writes: own })) => {
                writes.extend(own);
                results.push(Ok(answer));
            }
            Some(Err(e)) => results.push(Err(e)),
            None => results.push(Err(fail("a job was not decided".into()))),
        }
    }
    if writes.is_empty() {
        // Nothing to write: no commit to pay for (the locks go with the transaction).
        if read_round(shared, client, &[sql!("ROLLBACK")]).await.is_ok() {
            connection.clean = true;
        }
        return Ok(results);
    }
    let mut second = writes.statements();
    if let Some(seq) = read.outbox_seq
        && Some(seq) != before
    {
        second.push(sql!(OUTBOX_SEQ_SET, super::db::int(seq)));
    }
    second.push(sql!("COMMIT"));
    let answers = match pipeline::round(client, &second).await {
        Ok(answers) => answers,
        // Not sent: the transaction is left open, and the connection with it (`Connection`).
        Err((i, e)) => return Err(Failed::RolledBack(statement_failed(&shared.store, second[i].text, &e))),
    };
    // A statement the server failed aborted the transaction, and the COMMIT after it rolled it
    // back: nothing was recorded. A connection that failed may have delivered the COMMIT.
    let mut refused = None;
    for (statement, answer) in second.iter().zip(answers) {
        if let Err(e) = answer {
            if e.as_db_error().is_none() {
                return Err(Failed::Unknown(format!(
                    "the connection failed during COMMIT ({}): whether the write was recorded is known only by \
                     reading the ledger again",
                    describe(&e)
                )));
            }
            if refused.is_none() {
                refused = Some(statement_failed(&shared.store, statement.text, &e));
            }
        }
    }
    connection.clean = true;
    if let Some(e) = refused {
        return Err(Failed::RolledBack(e));
    }
    shared.commits.fetch_add(1, Ordering::Relaxed);
    Ok(results)
}

/// Sets the last outbox sequence number handed out.
const OUTBOX_SEQ_SET: &str = "UPDATE oncebox_meta SET value = $1 WHERE name = 'outbox_seq'";

/// A round before anything was sent that could commit: any failure means nothing was recorded.
async fn read_round(
    shared: &Shared,
    client: &deadpool_postgres::Client,
    statements: &[Sql],
) -> Result<Vec<Vec<deadpool_postgres::tokio_postgres::Row>>, Failed> {
    let failed = |i: usize, e: &deadpool_postgres::tokio_postgres::Error| {
        Failed::RolledBack(statement_failed(&shared.store, statements[i].text, e))
    };
    let answers = pipeline::round(client, statements).await.map_err(|(i, e)| failed(i, &e))?;
    let mut rows = Vec::with_capacity(statements.len());
    for (statement, answer) in statements.iter().zip(answers) {
        match answer {
            Ok(answer) => rows.push(answer),
            Err(e) => return Err(Failed::RolledBack(statement_failed(&shared.store, statement.text, &e))),
        }
    }
    Ok(rows)
}

/// A statement that failed, in one line; a guarded write that found its row changed says so.
fn statement_failed(store: &str, sql: &str, e: &deadpool_postgres::tokio_postgres::Error) -> LedgerError {
    if e.as_db_error().is_some_and(|db| db.code().code() == GUARD_FAILED) {
        let head: Vec<&str> = sql.split_whitespace().skip(3).take(4).collect();
        return LedgerError::Database {
            store: store.to_string(),
            what: format!("`{} ...` found its row changed although its lock was held", head.join(" ")),
        };
    }
    super::db::failed(store, sql, e)
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
