//! What the call pipeline needs of a ledger ([`Store`]), and what its callers bring and get.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;

use crate::{
    ApprovalRecord, AttemptRecord, DeliveryAnswer, EffectRecord, EffectStatus, ErrorRecord, LedgerError,
    OperationRecord, OperationStatus, OutboxMessage, ReconcileNote, Resolution, Settlement, Tombstone,
};

/// How often a caller waiting for another caller's operation looks again, on a store that
/// cannot announce changes ([`Store::changed`]).
pub const POLL: std::time::Duration = std::time::Duration::from_millis(25);

/// A boxed future, so that [`Store`] can be a trait object.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// An operation's final state, its output (JSON) and its error, recorded with its last attempt.
pub type Finish = (OperationStatus, Option<String>, Option<ErrorRecord>);

/// What keeps each open run open, by run id ([`Store::open_runs`]); a closed run is absent.
pub type OpenRuns = Result<std::collections::BTreeMap<String, Vec<crate::Open>>, LedgerError>;

/// A KV key's committed value and version.
pub type KvEntry = (Vec<u8>, u64);

/// Local effects an attempt made, to commit with its next durable write: (record, write) in order.
pub type Staged = Vec<(EffectRecord, LocalWrite)>;

/// What a caller brings to claim an operation.
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    pub key: String,
    pub run_id: String,
    pub step_id: String,
    pub tool: String,
    pub class: oncebox_core::policy::ReplayClass,
    pub fingerprint: String,
    /// The same request's fingerprints under the ledger's older secrets (empty unless its key was
    /// rotated): an operation recorded under one of them is this request, not a conflict.
    pub older_fingerprints: Vec<String>,
    pub args: serde_json::Value,
    /// The args' sensitive values, sealed (`seal::seal_params`); kept with a new operation.
    pub sealed: Option<String>,
    pub owner: String,
    pub now_ms: u64,
    pub lease_ms: u64,
    /// For a tool that needs approval: the approval the caller saw approve these params, and the
    /// component it will run. A new operation is claimed only while that approval still stands
    /// (same revision, not expired, bound to that component: [`approval_stands`](crate::approval_stands)), checked by the
    /// store with the claim (`Claim::ApprovalChanged` otherwise).
    pub approval: Option<SeenApproval>,
}

/// What a caller of a tool that needs approval brings to its claim: the approval it saw let the
/// call through, and the code it is about to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenApproval {
    /// The approval's revision as the caller read it (0: none was needed, because the step is
    /// on record or expired, so no new operation may be claimed under it).
    pub revision: u32,
    /// The digest of the component the caller will run (`LoadedTool::digest`): the approval must
    /// be bound to it, so that a tool replaced since the decision does not run under it.
    pub component: String,
}

/// A request for approval that retention removes, as retention read it: removed only if it is
/// still at that revision (a decision since makes it another request) and its operation was not
/// claimed meanwhile (its approval then stays with it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleApproval {
    pub operation_key: String,
    pub revision: u32,
}

impl StaleApproval {
    pub fn of(record: &ApprovalRecord) -> Self {
        StaleApproval { operation_key: record.operation_key.clone(), revision: record.revision }
    }
}

/// What [`Store::prune_outbox`] removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    /// Delivered outbox messages.
    pub messages: usize,
    /// Notice keys ([`Store::enqueue_once`]) that named one of them.
    pub notices: usize,
}

/// What [`Store::expire`] removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Removed {
    /// Operations (with their attempts, effects and approvals).
    pub operations: usize,
    /// Requests for approval without an operation (of the [`StaleApproval`]s given).
    pub approvals: usize,
}

impl ClaimRequest {
    /// Whether an operation recorded with `fingerprint` was asked for with these args.
    pub fn matches(&self, fingerprint: &str) -> bool {
        self.fingerprint == fingerprint || self.older_fingerprints.iter().any(|older| older == fingerprint)
    }
}

/// What the ledger says about an operation when a call arrives.
#[derive(Debug, Clone)]
pub enum Claim {
    /// This caller owns the operation now, with this token; `previous_attempts` were made before.
    Owned { fence: u64, previous_attempts: u32 },
    /// Completed, failed or unknown: answer from the record. From [`Store::reopen`], also an
    /// operation claimed since it was read: another caller reopened it first, or a person's
    /// settlement reopened it.
    Recorded(OperationRecord),
    /// The same step was called with different args.
    Conflict(OperationRecord),
    /// Another caller holds a live lease.
    InProgress(OperationRecord),
    /// The operation's records expired and were removed (retention): running the step again
    /// could repeat its effect, so it is not run as new.
    Expired(Tombstone),
    /// The approval the caller saw changed (rejected, expired, decided again) or is being
    /// decided: nothing was claimed; look at the approval again.
    ApprovalChanged,
}

/// A local effect, applied in the same transaction as its record.
#[derive(Debug, Clone)]
pub enum LocalWrite {
    /// `expected`: write only if the key still has this version when the write commits (0: the
    /// key must not exist); else the write is refused (`KvConflict`).
    KvSet {
        namespace: String,
        key: String,
        value: Vec<u8>,
        expected: Option<u64>,
    },
    KvDelete {
        namespace: String,
        key: String,
    },
    Outbox {
        topic: String,
        payload: String,
    },
}

/// What became of a local effect.
#[derive(Debug, Clone, PartialEq)]
pub enum LocalOutcome {
    Applied,
    /// Already recorded with the same request: not applied again.
    AlreadyApplied,
    /// Recorded with a different request: the tool diverged from its first run.
    Diverged(Box<EffectRecord>),
}

/// What the call pipeline needs of a ledger, and nothing more. Every write carries the fencing
/// token of the claim that makes it and is refused (`Fenced`) once another caller took the
/// operation over; every write is durable when its future resolves `Ok` (except an effect's
/// answer, which [`answer_may_ride`](crate::answer_may_ride) lets wait for the next durable write, and a new operation's
/// claim, which a backend need not make durable before the owner's first durable write: redb keeps
/// it in memory, PostgreSQL lets most ride and refuses the owner's writes with `ClaimLost` if a
/// server crash lost one), and nothing of a write that resolves `Err` was recorded. Reads see committed state.
pub trait Store: Send + Sync + 'static {
    /// Names the store in messages (a file's path, `:memory:`).
    fn name(&self) -> &Path;

    /// Decides, atomically, who runs an operation ([`verdict`](crate::verdict)); a new or expired claim goes to
    /// this caller with a fence no owner of the operation holds any more (a new operation's is 1;
    /// one whose claim a PostgreSQL crash lost may be claimed with 1 again, and its first owner is
    /// refused by the claim's token instead: `ClaimLost`).
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, LedgerError>>;

    /// Takes over an unknown operation to resend its in-doubt effects with their keys, if every
    /// one of them is in `resendable` (effect keys the caller judged resendable); otherwise
    /// answers with the record. The store checks the effects again itself.
    fn reopen<'a>(
        &'a self,
        req: &'a ClaimRequest,
        resendable: Vec<String>,
    ) -> BoxFuture<'a, Result<Claim, LedgerError>>;

    /// Extends the lease of `fence`'s claim to `until_ms` (never shortens it); refused as any
    /// write of that owner is (`Fenced`, `ClaimLost`).
    fn renew<'a>(&'a self, key: &'a str, fence: u64, until_ms: u64) -> BoxFuture<'a, Result<(), LedgerError>>;

    /// Writes an effect record (write-ahead `dispatched`, or its answer) with the local effects
    /// staged before it, as a compare-and-set: `expected` is the effect's (status, dispatches) as
    /// the writer last saw them, `None` if it must be new (else `EffectChanged`).
    fn put_effect<'a>(
        &'a self,
        fence: u64,
        effect: &'a EffectRecord,
        expected: Option<(EffectStatus, u32)>,
        staged: Staged,
    ) -> BoxFuture<'a, Result<(), LedgerError>>;

    /// Records one attempt, the local effects it staged and, when the call is over, the
    /// operation's final state, together. A finish the rule of evidence forbids is refused
    /// ([`refused_finish`](crate::refused_finish)); a versioned KV write whose key moved on is refused (`KvConflict`).
    fn record_attempt<'a>(
        &'a self,
        fence: u64,
        attempt: &'a AttemptRecord,
        finish: Option<Finish>,
        now_ms: u64,
        staged: Staged,
    ) -> BoxFuture<'a, Result<(), LedgerError>>;

    /// Settles an unknown operation ([`settled`](crate::settled)): `committed` completes it, settling every effect
    /// of it in doubt; `not-committed` settles one effect in doubt (`effect_key`, or the only one),
    /// and the operation reopens for the next call once nothing else of it is in doubt.
    /// `seen`: the named effect's dispatches as the caller read them (reconcile asked the
    /// authority about that send); a settlement of an effect sent again since is refused.
    fn resolve<'a>(
        &'a self,
        operation_key: &'a str,
        effect_key: Option<&'a str>,
        seen: Option<u32>,
        resolution: &'a Resolution,
        settlement: &'a Settlement,
    ) -> BoxFuture<'a, Result<OperationRecord, LedgerError>>;

    fn operation<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<OperationRecord>, LedgerError>>;

    /// All operations, or a run's, in key order.
    fn operations<'a>(&'a self, run_id: Option<&'a str>) -> BoxFuture<'a, Result<Vec<OperationRecord>, LedgerError>>;

    /// The claims not yet recorded (in flight), all or a run's, in key order: an operation
    /// claimed and not yet written to, which reads of operations do not show (redb keeps it in
    /// this process's memory; PostgreSQL keeps its row unrecorded, every host's). Once recorded,
    /// it is an ordinary operation and no longer listed. What keeps a run open counts them
    /// ([`run_state`](crate::run_state)): a step about to take effect.
    fn in_flight<'a>(&'a self, run_id: Option<&'a str>) -> BoxFuture<'a, Result<Vec<OperationRecord>, LedgerError>>;

    fn effect<'a>(
        &'a self,
        operation_key: &'a str,
        effect_key: &'a str,
    ) -> BoxFuture<'a, Result<Option<EffectRecord>, LedgerError>>;

    /// An operation's effects, in the order they were first dispatched.
    fn effects<'a>(&'a self, operation_key: &'a str) -> BoxFuture<'a, Result<Vec<EffectRecord>, LedgerError>>;

    /// An operation's attempts, in order.
    fn attempts<'a>(&'a self, operation_key: &'a str) -> BoxFuture<'a, Result<Vec<AttemptRecord>, LedgerError>>;

    /// A KV key's committed value and version.
    fn kv_entry<'a>(&'a self, namespace: &'a str, key: &'a str) -> BoxFuture<'a, Result<Option<KvEntry>, LedgerError>>;

    /// Every outbox message, in the order enqueued.
    fn outbox(&self) -> BoxFuture<'_, Result<Vec<OutboxMessage>, LedgerError>>;

    /// The request for approval of an operation (by operation key), if any.
    fn approval<'a>(&'a self, operation_key: &'a str) -> BoxFuture<'a, Result<Option<ApprovalRecord>, LedgerError>>;

    /// All requests for approval, or a run's, in operation key order.
    fn approvals<'a>(&'a self, run_id: Option<&'a str>) -> BoxFuture<'a, Result<Vec<ApprovalRecord>, LedgerError>>;

    /// Writes a request for approval as a compare-and-set on its revision: `record.revision` must
    /// be the stored one plus 1 (1 for a new request), else `ApprovalChanged` and nothing written.
    /// Refused (`ApprovalClosed`) once the operation is claimed or recorded: what it ran under
    /// can no longer change. Atomic with [`Store::claim`]: a claim and a decision never both win.
    fn put_approval<'a>(&'a self, record: &'a ApprovalRecord) -> BoxFuture<'a, Result<(), LedgerError>>;

    /// What retention left of a removed operation, if it was removed.
    fn tombstone<'a>(&'a self, operation_key: &'a str) -> BoxFuture<'a, Result<Option<Tombstone>, LedgerError>>;

    /// What retention left of run `run_id`'s removed operations and requests, in operation key
    /// order: what a compensation of the run can no longer undo from a record. redb and
    /// PostgreSQL keep an index of tombstones by run, so this reads O(the run's tombstones).
    fn tombstones<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<Tombstone>, LedgerError>>;

    /// Removes operations whose records expired, with their attempts, effects and approvals,
    /// leaving a tombstone for each (a later claim of it is answered `Expired`), and the
    /// requests for approval of `approvals` (keys without an operation) that are still at the
    /// revision given and whose operation is not claimed, not even in memory ([`StaleApproval`]):
    /// atomic with [`Store::claim`] and [`Store::put_approval`], as a decision is. Refuses all
    /// (`NotExpirable`) if one of the operations is not completed or failed. Keeps (does not
    /// remove, leaves no tombstone for) an operation whose run is open at the moment of the write
    /// by a key this call does not remove ([`run_state::removable`](crate::run_state::removable)):
    /// a step claimed or asked for after retention read the run closed. Answers how many
    /// operations and requests it removed.
    fn expire<'a>(
        &'a self,
        tombstones: &'a [Tombstone],
        approvals: &'a [StaleApproval],
    ) -> BoxFuture<'a, Result<Removed, LedgerError>>;

    /// What keeps each run (or `run`) open at `now_ms`, by the one rule
    /// ([`run_state::open_reasons`](crate::run_state::open_reasons)); a closed run is absent. A
    /// store that keeps an index of open work (redb's table) reads it: O(open), whatever the
    /// history. This default reads every record ([`scan_open_runs`]), O(history): the reference
    /// model's, and the oracle the conformance suite compares every index with.
    fn open_runs<'a>(&'a self, run: Option<&'a str>, now_ms: u64) -> BoxFuture<'a, OpenRuns> {
        Box::pin(scan_open_runs(self, run, now_ms))
    }

    /// The completed and failed operations last written before `cutoff_ms`, oldest first: what
    /// retention may remove (if their run is closed). redb and PostgreSQL keep an index of them
    /// (`ended`, `oncebox_ended`), so gc visits O(expired); this default reads every operation,
    /// O(history): the reference model's.
    fn ended_before<'a>(&'a self, cutoff_ms: u64) -> BoxFuture<'a, Result<Vec<OperationRecord>, LedgerError>> {
        Box::pin(async move {
            let mut ops: Vec<OperationRecord> = self.operations(None).await?;
            ops.retain(|op| crate::expirable(op).is_ok() && op.updated_ms < cutoff_ms);
            ops.sort_by(|a, b| (a.updated_ms, &a.key).cmp(&(b.updated_ms, &b.key)));
            Ok(ops)
        })
    }

    /// The requests for approval last written ([`ApprovalRecord::last_written`]) before
    /// `cutoff_ms`, oldest first (then in key order): what retention may let lapse, or remove
    /// with a tombstone when rejected. redb and PostgreSQL keep an index of them by that time (the
    /// `asked` table, the expression index `oncebox_approvals_written`), so gc visits O(requests
    /// older than the cutoff); this default reads every request ([`scan_approvals_before`]),
    /// O(requests ever kept): the reference model's, and the oracle the indexes are held to.
    fn approvals_before<'a>(&'a self, cutoff_ms: u64) -> BoxFuture<'a, Result<Vec<ApprovalRecord>, LedgerError>> {
        Box::pin(scan_approvals_before(self, cutoff_ms))
    }

    /// The outbox messages delivered before `cutoff_ms`, in the order of their delivery (then of
    /// their sequence numbers): what retention may remove ([`Store::prune_outbox`]). A pending
    /// message is never among them. redb and PostgreSQL keep an index of delivered messages by
    /// their delivery (the `delivered` table, the expression index `oncebox_outbox_delivered`),
    /// so gc visits O(messages delivered before the cutoff); this default reads the whole outbox
    /// ([`scan_delivered_before`]): the reference model's, and the oracle.
    fn delivered_before<'a>(&'a self, cutoff_ms: u64) -> BoxFuture<'a, Result<Vec<OutboxMessage>, LedgerError>> {
        Box::pin(scan_delivered_before(self, cutoff_ms))
    }

    /// Removes the outbox messages `seqs` that are delivered (a pending one, refused included, or
    /// a number not stored is left alone), each with the notice key that names it
    /// ([`Store::enqueue_once`]'s `TOPIC\nKEY`, if it names this message): after this, noticing
    /// the same event again enqueues it again, so the caller names only messages whose event can
    /// no longer be noticed (`oncebox_runtime::retention`). Atomic. Answers what it removed.
    fn prune_outbox<'a>(&'a self, seqs: &'a [u64]) -> BoxFuture<'a, Result<Pruned, LedgerError>>;

    /// One page of the runs the ledger knows (by their operations, or their requests for approval
    /// no operation answers yet), in key order (byte order of the run id): at most `limit`, each
    /// after `after` (the last run id of the previous page, the cursor). A store with a run index
    /// reads O(page) runs (redb's `run_steps` and open index, PostgreSQL's run indexes); this
    /// default reads every record, O(history): the reference model's.
    fn runs_page<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<String>, LedgerError>> {
        Box::pin(async move {
            let mut runs: Vec<String> = self.operations(None).await?.into_iter().map(|op| op.run_id).collect();
            runs.extend(self.approvals(None).await?.into_iter().map(|a| a.run_id));
            Ok(page_of(runs, after, limit))
        })
    }

    /// Whether other hosts may use this store at the same time (a database), rather than one
    /// process owning it (a file).
    fn is_shared(&self) -> bool {
        false
    }

    /// The clock that stamps this store's records and judges its leases and settle windows (ms
    /// since the epoch): the host's own for a store one process owns; for one that hosts share,
    /// the database's, so that hosts whose clocks disagree still agree on when a lease ran out or
    /// a settle window passed.
    fn now_ms(&self) -> u64 {
        oncebox_core::clock::now_ms()
    }

    /// Binds the store to the hosts' fingerprint key, named by [`oncebox_core::keys::FingerprintKey::ids`]
    /// (newest first): a store shared by hosts remembers the newest id it was given, follows a
    /// rotation (a host whose older ids hold it), and refuses (`KeyMismatch`) a host with another
    /// key, whose fingerprints would never match the others'. A store of one process has its key
    /// file beside it and checks nothing.
    fn bind_key<'a>(&'a self, ids: &'a [String]) -> BoxFuture<'a, Result<(), LedgerError>> {
        let _ = ids;
        Box::pin(async { Ok(()) })
    }

    /// Durable commits so far, for a store that counts them (group commit shares them).
    fn commits(&self) -> u64 {
        0
    }

    /// Resolves when operation `key` may have changed (ended, settled, taken over), and at the
    /// latest after `timeout` (the caller's wait, or what is left of the owner's lease): a caller
    /// waiting for another caller's operation looks again as soon as that is worth it. A store
    /// that cannot tell polls: it resolves after [`POLL`] at most (cheap for a store in this
    /// process's memory; a store that many waiters poll over a network should announce changes).
    fn changed<'a>(&'a self, key: &'a str, timeout: std::time::Duration) -> BoxFuture<'a, ()> {
        let _ = key;
        Box::pin(tokio::time::sleep(timeout.min(POLL)))
    }

    // Outbox delivery: the relay (`crate::outbox`) reads a topic's head and records each send.

    /// Up to `limit` of `topic`'s undelivered messages, in the order they were enqueued (a
    /// refused message is still undelivered: it stays at the head).
    fn outbox_pending<'a>(
        &'a self,
        topic: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<OutboxMessage>, LedgerError>>;

    /// Records one send of message `seq` and its answer ([`Delivery::after`](crate::Delivery::after)): a delivered message
    /// leaves its topic's pending messages; an answer about a message already delivered changes
    /// nothing. Answers the message as recorded; `NoSuchMessage` for a sequence number never enqueued.
    fn record_delivery<'a>(
        &'a self,
        seq: u64,
        answer: &'a DeliveryAnswer,
    ) -> BoxFuture<'a, Result<OutboxMessage, LedgerError>>;

    /// Enqueues a message of the host's own (a notification to a person: `oncebox_runtime::notify`)
    /// on `topic` under `key`, unless a message was enqueued on `topic` under `key` before,
    /// whenever: true if enqueued now. Durable when it resolves `Ok`. A host that
    /// notices the same event again (after a restart, or beside another host on a shared ledger)
    /// enqueues nothing more, so the event reaches its receiver through the relay once per key.
    fn enqueue_once<'a>(
        &'a self,
        topic: &'a str,
        key: &'a str,
        payload: &'a str,
    ) -> BoxFuture<'a, Result<bool, LedgerError>>;

    /// Records the background reconciler's tries of operation `key` while it is unknown: true if
    /// written, false if it is not unknown any more (settled, reopened, or gone), which is no
    /// error. Nothing else of the record changes.
    fn note_reconcile<'a>(&'a self, key: &'a str, note: &'a ReconcileNote) -> BoxFuture<'a, Result<bool, LedgerError>>;

    /// Takes or renews `owner`'s lease named `name` for `lease_ms`, judged by the store's clock:
    /// true while `owner` holds it, false while another owner's lease is live. What hosts sharing
    /// a ledger must do one at a time holds one: a topic's outbox relay (`outbox/TOPIC`: two would
    /// each send its head), the reconciling of an operation (`reconcile/KEY`). A store that one
    /// process owns has one of each by construction, and answers true.
    fn lease<'a>(&'a self, name: &'a str, owner: &'a str, lease_ms: u64) -> BoxFuture<'a, Result<bool, LedgerError>> {
        let _ = (name, owner, lease_ms);
        Box::pin(async { Ok(true) })
    }

    /// Gives up `owner`'s lease named `name` (a clean stop, a try done), so another host takes
    /// it at once instead of after the lease.
    fn release<'a>(&'a self, name: &'a str, owner: &'a str) -> BoxFuture<'a, Result<(), LedgerError>> {
        let _ = (name, owner);
        Box::pin(async { Ok(()) })
    }
}

/// What keeps each run (or `run`) open, computed from every record the store holds (or the run's):
/// the claims in flight are read before the operations, so that a claim recorded in between is
/// read as the operation it became, never missed by both reads. O(history) for all runs.
pub async fn scan_open_runs<S: Store + ?Sized>(store: &S, run: Option<&str>, now_ms: u64) -> OpenRuns {
    let in_flight = store.in_flight(run).await?;
    let operations = store.operations(run).await?;
    let approvals = store.approvals(run).await?;
    Ok(crate::run_state::open_runs(&operations, &in_flight, &approvals, now_ms))
}

/// The requests for approval last written before `cutoff_ms`, oldest first, from every request
/// the store holds: O(requests). The oracle of [`Store::approvals_before`].
pub async fn scan_approvals_before<S: Store + ?Sized>(
    store: &S,
    cutoff_ms: u64,
) -> Result<Vec<ApprovalRecord>, LedgerError> {
    let mut asked = store.approvals(None).await?;
    asked.retain(|a| a.last_written() < cutoff_ms);
    asked.sort_by(|a, b| (a.last_written(), &a.operation_key).cmp(&(b.last_written(), &b.operation_key)));
    Ok(asked)
}

/// The outbox messages delivered before `cutoff_ms`, in order of delivery, from the whole outbox:
/// O(messages). The oracle of [`Store::delivered_before`].
pub async fn scan_delivered_before<S: Store + ?Sized>(
    store: &S,
    cutoff_ms: u64,
) -> Result<Vec<OutboxMessage>, LedgerError> {
    let mut delivered: Vec<(u64, OutboxMessage)> = store
        .outbox()
        .await?
        .into_iter()
        .filter_map(|m| m.delivery.delivered_ms.filter(|at| *at < cutoff_ms).map(|at| (at, m)))
        .collect();
    delivered.sort_by_key(|(at, m)| (*at, m.seq));
    Ok(delivered.into_iter().map(|(_, m)| m).collect())
}

/// The page of `runs` (any order, repeats allowed) after `after`, at most `limit`, in key order.
pub fn page_of(mut runs: Vec<String>, after: Option<&str>, limit: usize) -> Vec<String> {
    runs.retain(|run| after.is_none_or(|after| run.as_str() > after));
    runs.sort();
    runs.dedup();
    runs.truncate(limit);
    runs
}
