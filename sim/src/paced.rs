//! A ledger store whose calls hold the simulation still.
//!
//! redb commits on a writer thread of its own. Awaited the usual way, a commit lets the
//! simulation's one runtime thread run other tasks meanwhile, and which of them ran (and, with
//! the clock paused and nothing else to run, how far the clock jumped) would depend on how long
//! the disk took: the same seed would interleave differently from run to run. So by default each
//! call blocks the runtime thread until the store answers: the tasks interleave the same way on
//! every run, and simulated time stands still during a commit.
//!
//! A seed that runs `free` awaits the calls as a host does, so that other tasks run during a
//! commit and races inside the store can happen (a decision being written while a claim is
//! taken); the clock is still held (a blocking task, which tokio counts as work, lives as long as
//! the call), but the interleaving is the disk's. `changed` is a wait on a timer, left as it is.
//!
//! Only for a store whose calls need nothing else of the runtime to finish (redb's: its writer
//! thread answers on a channel); a PostgreSQL store talks over sockets the runtime drives.

use std::future::Future;
use std::path::Path;
use std::sync::{Arc, mpsc};
use std::task::{Context, Poll, Wake, Waker};

use oncebox_runtime::LedgerError;

use crate::pause::Fences;
use crate::race::Holds;
use oncebox_runtime::ledger::{
    ApprovalRecord, AttemptRecord, BoxFuture, Claim, ClaimRequest, DeliveryAnswer, EffectRecord, EffectStatus, Finish,
    KvEntry, OperationRecord, OutboxMessage, ReconcileNote, Removed, Resolution, Settlement, Staged, StaleApproval,
    Store, Tombstone,
};

/// `inner`, each call finished before anything else runs (or, `free`, awaited with the clock held);
/// a decision's write held back at the store's window when `holds` says so (`race.rs`).
pub struct Paced<S> {
    pub inner: Arc<S>,
    pub free: bool,
    pub holds: Option<Holds>,
    /// Told of every claim granted and every write accepted (`pause.rs`).
    pub fences: Option<Arc<Fences>>,
}

/// Wakes the thread that blocks on a store call.
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

impl<S> Paced<S> {
    pub fn new(inner: S, free: bool, holds: Option<Holds>) -> Paced<S> {
        Paced { inner: Arc::new(inner), free, holds, fences: None }
    }

    /// Tells `fences` of every claim granted and every write accepted.
    pub fn watched(mut self, fences: Arc<Fences>) -> Paced<S> {
        self.fences = Some(fences);
        self
    }

    fn claimed(&self, key: &str, claim: &Result<Claim, LedgerError>) {
        if let (Some(fences), Ok(Claim::Owned { fence, .. })) = (&self.fences, claim) {
            fences.claimed(key, *fence);
        }
    }

    fn wrote<T>(&self, key: &str, fence: u64, what: &str, out: &Result<T, LedgerError>) {
        if let (Some(fences), Ok(_)) = (&self.fences, out) {
            fences.wrote(key, fence, what);
        }
    }

    fn paced<'a, T: Send + 'a>(&self, call: BoxFuture<'a, T>) -> BoxFuture<'a, T> {
        if self.free { held(call) } else { blocking(call) }
    }
}

/// `call`, run to its end on this thread when first polled. Unconstrained by tokio's cooperative
/// budget: a spent budget would answer `Pending` to every poll of this loop. Also the operator's
/// reloads (`drive/operator.rs`): a compile on tokio's blocking pool would otherwise end while
/// whichever tasks happened to run, and a seed would not run the same way twice.
pub(crate) fn blocking<'a, T: Send + 'a>(call: BoxFuture<'a, T>) -> BoxFuture<'a, T> {
    Box::pin(async move {
        let mut call = std::pin::pin!(tokio::task::unconstrained(call));
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        loop {
            if let Poll::Ready(out) = call.as_mut().poll(&mut cx) {
                return out;
            }
            std::thread::park();
        }
    })
}

/// `call`, awaited, with a blocking task alive until it ends (the paused clock does not move while
/// one runs).
fn held<'a, T: Send + 'a>(call: BoxFuture<'a, T>) -> BoxFuture<'a, T> {
    Box::pin(async move {
        let (hold, held) = mpsc::channel::<()>();
        // Ends when `hold` is dropped: `recv` then fails.
        drop(tokio::task::spawn_blocking(move || {
            let _ = held.recv();
        }));
        let out = call.await;
        drop(hold);
        out
    })
}

impl<S: Store + 'static> Store for Paced<S> {
    fn name(&self) -> &Path {
        self.inner.name()
    }

    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, LedgerError>> {
        Box::pin(async move {
            let out = self.paced(self.inner.claim(req)).await;
            self.claimed(&req.key, &out);
            out
        })
    }

    fn reopen<'a>(
        &'a self,
        req: &'a ClaimRequest,
        resendable: Vec<String>,
    ) -> BoxFuture<'a, Result<Claim, LedgerError>> {
        Box::pin(async move {
            let out = self.paced(self.inner.reopen(req, resendable)).await;
            self.claimed(&req.key, &out);
            out
        })
    }

    fn renew<'a>(&'a self, key: &'a str, fence: u64, until_ms: u64) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(async move {
            let out = self.paced(self.inner.renew(key, fence, until_ms)).await;
            self.wrote(key, fence, "a renewal of its lease", &out);
            out
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
            let out = self.paced(self.inner.put_effect(fence, effect, expected, staged)).await;
            self.wrote(&effect.operation_key, fence, "a write of an effect", &out);
            out
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
            let out = self.paced(self.inner.record_attempt(fence, attempt, finish, now_ms, staged)).await;
            self.wrote(&attempt.operation_key, fence, "an attempt's record", &out);
            out
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
        self.paced(self.inner.resolve(operation_key, effect_key, seen, resolution, settlement))
    }

    fn operation<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<OperationRecord>, LedgerError>> {
        self.paced(self.inner.operation(key))
    }

    fn operations<'a>(&'a self, run_id: Option<&'a str>) -> BoxFuture<'a, Result<Vec<OperationRecord>, LedgerError>> {
        self.paced(self.inner.operations(run_id))
    }

    fn in_flight<'a>(&'a self, run_id: Option<&'a str>) -> BoxFuture<'a, Result<Vec<OperationRecord>, LedgerError>> {
        self.paced(self.inner.in_flight(run_id))
    }

    fn effect<'a>(
        &'a self,
        operation_key: &'a str,
        effect_key: &'a str,
    ) -> BoxFuture<'a, Result<Option<EffectRecord>, LedgerError>> {
        self.paced(self.inner.effect(operation_key, effect_key))
    }

    fn effects<'a>(&'a self, operation_key: &'a str) -> BoxFuture<'a, Result<Vec<EffectRecord>, LedgerError>> {
        self.paced(self.inner.effects(operation_key))
    }

    fn attempts<'a>(&'a self, operation_key: &'a str) -> BoxFuture<'a, Result<Vec<AttemptRecord>, LedgerError>> {
        self.paced(self.inner.attempts(operation_key))
    }

    fn kv_entry<'a>(&'a self, namespace: &'a str, key: &'a str) -> BoxFuture<'a, Result<Option<KvEntry>, LedgerError>> {
        self.paced(self.inner.kv_entry(namespace, key))
    }

    fn outbox(&self) -> BoxFuture<'_, Result<Vec<OutboxMessage>, LedgerError>> {
        self.paced(self.inner.outbox())
    }

    fn approval<'a>(&'a self, operation_key: &'a str) -> BoxFuture<'a, Result<Option<ApprovalRecord>, LedgerError>> {
        self.paced(self.inner.approval(operation_key))
    }

    fn approvals<'a>(&'a self, run_id: Option<&'a str>) -> BoxFuture<'a, Result<Vec<ApprovalRecord>, LedgerError>> {
        self.paced(self.inner.approvals(run_id))
    }

    fn put_approval<'a>(&'a self, record: &'a ApprovalRecord) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(async move {
            if let Some(holds) = &self.holds
                && let Some(out) = crate::race::put_approval(holds, &self.inner, record).await
            {
                return out;
            }
            self.paced(self.inner.put_approval(record)).await
        })
    }

    fn tombstone<'a>(&'a self, operation_key: &'a str) -> BoxFuture<'a, Result<Option<Tombstone>, LedgerError>> {
        self.paced(self.inner.tombstone(operation_key))
    }

    fn tombstones<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<Tombstone>, LedgerError>> {
        self.paced(self.inner.tombstones(run_id))
    }

    fn expire<'a>(
        &'a self,
        tombstones: &'a [Tombstone],
        approvals: &'a [StaleApproval],
    ) -> BoxFuture<'a, Result<Removed, LedgerError>> {
        self.paced(self.inner.expire(tombstones, approvals))
    }

    fn is_shared(&self) -> bool {
        self.inner.is_shared()
    }

    fn now_ms(&self) -> u64 {
        self.inner.now_ms()
    }

    fn bind_key<'a>(&'a self, ids: &'a [String]) -> BoxFuture<'a, Result<(), LedgerError>> {
        self.paced(self.inner.bind_key(ids))
    }

    fn commits(&self) -> u64 {
        self.inner.commits()
    }

    fn changed<'a>(&'a self, key: &'a str, timeout: std::time::Duration) -> BoxFuture<'a, ()> {
        self.inner.changed(key, timeout)
    }

    fn outbox_pending<'a>(
        &'a self,
        topic: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<OutboxMessage>, LedgerError>> {
        self.paced(self.inner.outbox_pending(topic, limit))
    }

    fn record_delivery<'a>(
        &'a self,
        seq: u64,
        answer: &'a DeliveryAnswer,
    ) -> BoxFuture<'a, Result<OutboxMessage, LedgerError>> {
        self.paced(self.inner.record_delivery(seq, answer))
    }

    fn enqueue_once<'a>(
        &'a self,
        topic: &'a str,
        key: &'a str,
        payload: &'a str,
    ) -> BoxFuture<'a, Result<bool, LedgerError>> {
        self.paced(self.inner.enqueue_once(topic, key, payload))
    }

    fn prune_outbox<'a>(
        &'a self,
        seqs: &'a [u64],
    ) -> BoxFuture<'a, Result<oncebox_runtime::ledger::Pruned, LedgerError>> {
        self.paced(self.inner.prune_outbox(seqs))
    }

    fn note_reconcile<'a>(&'a self, key: &'a str, note: &'a ReconcileNote) -> BoxFuture<'a, Result<bool, LedgerError>> {
        self.paced(self.inner.note_reconcile(key, note))
    }

    fn lease<'a>(&'a self, name: &'a str, owner: &'a str, lease_ms: u64) -> BoxFuture<'a, Result<bool, LedgerError>> {
        self.paced(self.inner.lease(name, owner, lease_ms))
    }

    fn release<'a>(&'a self, name: &'a str, owner: &'a str) -> BoxFuture<'a, Result<(), LedgerError>> {
        self.paced(self.inner.release(name, owner))
    }
}
