//! Group commit: one thread owns every write transaction. Callers hand it jobs; it runs whatever
//! has queued up as one redb transaction, commits it (durably, but for the riders below), and only
//! then answers each caller.
//! While one batch is being written and fsync'd the next one queues, so the batch size follows the
//! load with no timer: one caller alone pays one commit, 64 callers share a handful.
//!
//! The rule for a job: decide first, then write. A job that refuses (a fenced write, a conflict)
//! must do so before it writes anything, so its refusal leaves the shared transaction as it found
//! it. A storage failure after writing may leave it half-done, so it fails the whole batch: every
//! caller in it is told its write was not committed. That is not "nothing reached the disk" (a
//! commit whose fsync failed may have written its pages): callers treat it as unknown, never as
//! proof that a write-ahead is absent, and only reopening the ledger tells.
//!
//! A job may ask only to ride with the next durable commit ([`Durability::Ride`]): a batch of such
//! jobs alone is committed without an fsync (redb's `Durability::None`), visible in this process
//! at once and made durable by the next commit that is, since redb keeps its commits in order. A
//! crash before then loses the batch, and every batch after it, whole.

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::thread::JoinHandle;

use redb::{Database, WriteTransaction};
use tokio::sync::oneshot;

use super::LedgerError;

/// The most jobs one transaction carries: bounds how long the first caller of a batch waits for
/// the last one's work.
const MAX_BATCH: usize = 512;

type Answer = Result<Box<dyn Any + Send>, LedgerError>;

/// Runs in the batch's transaction; returns the answer, and whether the job wrote anything.
type Run = Box<dyn FnOnce(&WriteTransaction) -> (Answer, bool) + Send>;

/// When a job's writes must be on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Durability {
    /// Before its caller hears back.
    Now,
    /// With the next durable commit: its caller hears back once they are committed in this
    /// process, and a crash before that commit loses them.
    Ride,
}

struct Job {
    run: Run,
    durability: Durability,
    reply: oneshot::Sender<Answer>,
}

pub(super) struct Writer {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    commits: Arc<AtomicU64>,
    /// Jobs handed over and not yet taken into a batch.
    queued: Arc<AtomicU64>,
}

impl Writer {
    pub fn start(db: Arc<Database>) -> Result<Writer, LedgerError> {
        let (jobs, queue) = mpsc::channel();
        let (commits, queued) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let counters = (commits.clone(), queued.clone());
        let thread = std::thread::Builder::new()
            .name("oncebox-ledger-writer".into())
            .spawn(move || run(&db, &queue, &counters.0, &counters.1))
            .map_err(|e| LedgerError::Writer { reason: format!("cannot start the writer thread: {e}") })?;
        Ok(Writer { jobs: Some(jobs), thread: Some(thread), commits, queued })
    }

    /// Durable transactions committed so far (each carries one batch, and the batches that rode
    /// with it): the fsyncs.
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// Runs `job` in the next batch and returns its answer once the batch is committed: durably,
    /// unless every job in it may ride with a later commit (`durability`). `wrote`
    /// says whether an answer means the job wrote (a refusal never does): a batch in which no job
    /// wrote is not committed, so answers that change nothing cost no fsync.
    /// The caller awaits the answer without holding a thread: callers are async tasks, and only
    /// the writer thread ever blocks (on the disk).
    pub async fn submit<R: Send + 'static>(
        &self,
        job: impl FnOnce(&WriteTransaction) -> Result<R, LedgerError> + Send + 'static,
        wrote: fn(&R) -> bool,
        durability: Durability,
    ) -> Result<R, LedgerError> {
        let stopped = || LedgerError::Writer { reason: "the writer thread has stopped".into() };
        let (reply, answer) = oneshot::channel();
        let run = Box::new(move |txn: &WriteTransaction| {
            let answer = job(txn);
            let wrote = answer.as_ref().is_ok_and(wrote);
            (answer.map(|r| Box::new(r) as Box<dyn Any + Send>), wrote)
        });
        self.queued.fetch_add(1, Ordering::Relaxed);
        self.jobs.as_ref().ok_or_else(stopped)?.send(Job { run, durability, reply }).map_err(|_| stopped())?;
        let answer = answer.await.map_err(|_| stopped())??;
        // The job above boxed an `R`; nothing else answers on this channel.
        answer.downcast::<R>().map(|r| *r).map_err(|_| LedgerError::Writer { reason: "mismatched answer".into() })
    }
}

impl Drop for Writer {
    /// Closes the queue and waits for the thread, so the database is closed when the last ledger
    /// handle is gone (and the file can be opened again at once).
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run(db: &Database, queue: &Receiver<Job>, commits: &AtomicU64, queued: &AtomicU64) {
    while let Ok(first) = queue.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        queued.fetch_sub(batch.len() as u64, Ordering::Relaxed);
        commit(db, batch, commits);
    }
}

/// One transaction for the whole batch; every caller hears back after the commit (or its failure),
/// and after it was counted, so a caller that reads `commits` sees its own.
fn commit(db: &Database, batch: Vec<Job>, commits: &AtomicU64) {
    let mut txn = match db.begin_write() {
        Ok(txn) => txn,
        Err(e) => return fail_all(batch.into_iter().map(|job| job.reply), &e.to_string()),
    };
    let mut answered = Vec::with_capacity(batch.len());
    let (mut poisoned, mut wrote, mut durable) = (None, false, false);
    for job in batch {
        if poisoned.is_some() {
            answered.push((job.reply, None));
            continue;
        }
        let (answer, job_wrote) = (job.run)(&txn);
        wrote |= job_wrote;
        // A job that must be durable makes its batch durable whether or not it says it wrote: an
        // fsync too many is cheap, a write that should have been durable and was not is not.
        durable |= job.durability == Durability::Now;
        if let Err(e @ (LedgerError::Storage(_) | LedgerError::Corrupt { .. })) = &answer {
            poisoned = Some(e.to_string());
        }
        answered.push((job.reply, Some(answer)));
    }
    let committed = match poisoned {
        Some(reason) => {
            let _ = txn.abort();
            Err(reason)
        }
        // Only refusals and answers from committed state: nothing to make durable.
        None if !wrote => txn.abort().map_err(|e| e.to_string()),
        None => {
            // A batch of jobs that may all ride is committed without an fsync (if redb allows it:
            // else with one, which is never wrong).
            let rides = !durable && txn.set_durability(redb::Durability::None).is_ok();
            match txn.commit() {
                Ok(()) => {
                    if !rides {
                        commits.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(())
                }
                Err(e) => Err(e.to_string()),
            }
        }
    };
    match committed {
        Ok(()) => {
            for (reply, answer) in answered {
                if let Some(answer) = answer {
                    let _ = reply.send(answer);
                }
            }
        }
        Err(reason) => fail_all(answered.into_iter().map(|(reply, _)| reply), &reason),
    }
}

fn fail_all(replies: impl Iterator<Item = oneshot::Sender<Answer>>, reason: &str) {
    for reply in replies {
        let _ = reply.send(Err(LedgerError::BatchFailed { reason: reason.to_string() }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::{ReadableDatabase, TableDefinition};

    const T: TableDefinition<u64, u64> = TableDefinition::new("t");

    fn writer() -> (Arc<Database>, Arc<Writer>) {
        let db = Database::builder()
            .create_with_backend(redb::backends::InMemoryBackend::new())
            .map(Arc::new)
            .expect("in-memory database");
        let writer = Arc::new(Writer::start(db.clone()).expect("writer"));
        (db, writer)
    }

    /// Runs a future to completion on this (plain) thread.
    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread().build().expect("runtime").block_on(f)
    }

    fn insert(writer: &Writer, k: u64) -> Result<u64, LedgerError> {
        block_on(writer.submit(
            move |txn| {
                txn.open_table(T)?.insert(k, k)?;
                Ok(k)
            },
            |_| true,
            Durability::Now,
        ))
    }

    fn read(db: &Database, k: u64) -> Option<u64> {
        let txn = db.begin_read().expect("read");
        let table = txn.open_table(T).ok()?;
        table.get(k).expect("get").map(|v| v.value())
    }

    /// Waits (bounded) until `n` jobs are queued behind the running batch.
    fn until_queued(writer: &Writer, n: u64) {
        for _ in 0..1000 {
            if writer.queued.load(Ordering::Relaxed) == n {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("{n} jobs never queued up");
    }

    /// Holds the writer inside a batch until the returned sender is dropped.
    fn hold(writer: &Arc<Writer>) -> (mpsc::Sender<()>, std::thread::JoinHandle<()>) {
        let (release, held) = mpsc::channel::<()>();
        let (started, running) = mpsc::channel::<()>();
        let w = writer.clone();
        let holder = std::thread::spawn(move || {
            block_on(w.submit(
                move |txn| {
                    let _ = started.send(());
                    let _ = held.recv();
                    txn.open_table(T)?.insert(u64::MAX, 0)?;
                    Ok(())
                },
                |_| true,
                Durability::Now,
            ))
            .expect("the held job commits");
        });
        running.recv().expect("the writer runs the held job");
        (release, holder)
    }

    #[test]
    fn jobs_queued_during_a_commit_share_the_next_one_and_hear_back_only_after_it() {
        let (db, writer) = writer();
        let (release, holder) = hold(&writer);
        let callers: Vec<_> = (0..63)
            .map(|k| {
                let w = writer.clone();
                std::thread::spawn(move || insert(&w, k))
            })
            .collect();
        // Nobody is answered while the batch ahead of them is still open.
        until_queued(&writer, 63);
        assert!(callers.iter().all(|c| !c.is_finished()), "a caller was answered before its commit");
        assert_eq!(read(&db, 0), None);
        drop(release);
        holder.join().expect("holder");
        for (k, caller) in callers.into_iter().enumerate() {
            assert_eq!(caller.join().expect("caller").expect("recorded"), k as u64);
            assert_eq!(read(&db, k as u64), Some(k as u64), "answered, so durable and visible");
        }
        assert_eq!(writer.commits(), 2, "63 writes queued behind one batch commit together");
    }

    #[test]
    fn a_refusal_leaves_its_batch_alone_and_a_storage_failure_fails_the_batch() {
        let (db, writer) = writer();
        let (release, holder) = hold(&writer);
        let w = writer.clone();
        let refused = std::thread::spawn(move || {
            block_on(w.submit(
                |_| -> Result<(), LedgerError> {
                    Err(LedgerError::Fenced { operation_key: "op".into(), fence: 1, current: 2 })
                },
                |_| true,
                Durability::Now,
            ))
        });
        let w = writer.clone();
        let fine = std::thread::spawn(move || insert(&w, 7));
        until_queued(&writer, 2);
        drop(release);
        holder.join().expect("holder");
        assert!(matches!(refused.join().expect("thread"), Err(LedgerError::Fenced { .. })));
        assert_eq!(fine.join().expect("thread").expect("recorded"), 7);
        assert_eq!(read(&db, 7), Some(7));

        let (release, holder) = hold(&writer);
        let w = writer.clone();
        let doomed = std::thread::spawn(move || insert(&w, 8));
        let w = writer.clone();
        let poison = std::thread::spawn(move || {
            block_on(w.submit(
                |txn| -> Result<(), LedgerError> {
                    txn.open_table(T)?.insert(9, 9)?;
                    Err(LedgerError::Corrupt { what: "a write went wrong halfway".into() })
                },
                |_| true,
                Durability::Now,
            ))
        });
        until_queued(&writer, 2);
        drop(release);
        holder.join().expect("holder");
        assert!(matches!(doomed.join().expect("thread"), Err(LedgerError::BatchFailed { .. })));
        assert!(matches!(poison.join().expect("thread"), Err(LedgerError::BatchFailed { .. })));
        assert_eq!((read(&db, 8), read(&db, 9)), (None, None), "nothing of the failed batch was recorded");
        assert_eq!(insert(&writer, 10).expect("the writer goes on"), 10);
    }

    #[test]
    fn a_batch_of_riders_is_visible_at_once_and_costs_no_fsync_until_a_durable_commit() {
        let (db, writer) = writer();
        let before = writer.commits();
        let ride = |k: u64| {
            block_on(writer.submit(
                move |txn| {
                    txn.open_table(T)?.insert(k, k)?;
                    Ok(k)
                },
                |_| true,
                Durability::Ride,
            ))
        };
        assert_eq!(ride(1).expect("recorded"), 1);
        assert_eq!(ride(2).expect("recorded"), 2);
        assert_eq!((read(&db, 1), read(&db, 2)), (Some(1), Some(2)), "answered, so visible in this process");
        assert_eq!(writer.commits(), before, "riders alone are not fsync'd");
        insert(&writer, 3).expect("write");
        assert_eq!(writer.commits(), before + 1, "a durable commit carries the riders before it");

        // A rider in a batch with a job that must be durable makes the batch no less durable.
        let (release, holder) = hold(&writer);
        let w = writer.clone();
        let rider = std::thread::spawn(move || {
            block_on(w.submit(
                |txn| {
                    txn.open_table(T)?.insert(4, 4)?;
                    Ok(())
                },
                |_| true,
                Durability::Ride,
            ))
        });
        let w = writer.clone();
        let durable = std::thread::spawn(move || insert(&w, 5));
        until_queued(&writer, 2);
        drop(release);
        holder.join().expect("holder");
        rider.join().expect("thread").expect("recorded");
        durable.join().expect("thread").expect("recorded");
        assert_eq!(writer.commits(), before + 3, "the held batch, then the shared one: each fsync'd");
    }

    #[test]
    fn a_batch_that_wrote_nothing_is_not_committed() {
        let (_db, writer) = writer();
        let before = writer.commits();
        let answer = block_on(writer.submit(|_| Ok(5u8), |_| false, Durability::Now)).expect("answered");
        assert_eq!(answer, 5);
        assert_eq!(writer.commits(), before, "no fsync for an answer that changed nothing");
        insert(&writer, 1).expect("write");
        assert_eq!(writer.commits(), before + 1);
    }
}
