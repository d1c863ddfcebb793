//! Storage faults: the ledger over a storage backend that fails on command (an I/O error, a torn
//! write, a full disk, a failing fsync), on a real file that is reopened afterwards with a healthy
//! backend to read what reached the disk. Counted at the provider: nothing is dispatched without a
//! durable write-ahead, nothing acknowledged is lost, no step is reported completed or failed that
//! is not, and a host whose storage failed fails closed. And files that are not usable ledgers
//! (junk, truncated, overwritten in the middle): one line naming the file, exit 2, left as they were.

use std::fs::OpenOptions;
use std::io;
use std::ops::Bound;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use oncebox::ledger::{EffectStatus, OperationStatus};
use oncebox::{Call, CallError, Host, HostBuilder, Ledger, Outcome, Status};
use oncebox_example_provider::{Fault as ProviderFault, FaultKind, Provider, ProviderHandle, Route};
use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};
use serde_json::{Value, json};

use crate::support::{charge, configure, eventually, host_for, load_all, oncebox};

/// What becomes of the writes not yet made durable when the storage dies (a torn write) or an
/// fsync fails: they reached the disk anyway (the page cache wrote them back), or they are gone
/// (the power went; Linux drops dirty pages whose writeback failed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unsynced {
    Kept,
    Lost,
}

/// A storage fault, once armed and triggered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The next write fails with an I/O error and writes nothing; the storage itself stays usable.
    WriteError,
    /// The next write writes the first half of its bytes, and the machine dies: that write and
    /// every later I/O fail, and the unsynced writes before it are kept or lost.
    TornWrite(Unsynced),
    /// Every write, and every growth of the file, fails with `StorageFull` until healed.
    DiskFull,
    /// Every fsync (`sync_data`) fails with an I/O error until healed; the writes it was to make
    /// durable are kept or lost.
    SyncError(Unsynced),
    /// Every fsync succeeds, this many milliseconds late, until healed (a disk that stalls).
    SlowSync(u64),
}

/// When an armed fault takes effect.
#[derive(Debug, Clone, Copy)]
pub enum When {
    Now,
    /// Once `n` more writes went through.
    AfterWrites(u64),
    /// Once `n` more fsyncs succeeded.
    AfterSyncs(u64),
}

/// The control of a [`FaultyBackend`], shared with the test.
#[derive(Debug, Default)]
pub struct Storage {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// A fault and the write or sync count at which it takes effect.
    armed: Option<(Trigger, Fault)>,
    active: Option<Fault>,
    /// A torn write killed the machine: every I/O fails.
    dead: bool,
    /// Writes asked for (failed ones included), fsyncs that succeeded, I/O calls failed on purpose.
    writes: u64,
    syncs: u64,
    failures: u64,
    /// Writes since the last fsync, in order: in the "page cache", not on the disk yet. Reads see
    /// them; a successful fsync (or a clean close) writes them to the file.
    pending: Vec<(u64, Vec<u8>)>,
}

#[derive(Debug, Clone, Copy)]
enum Trigger {
    Writes(u64),
    Syncs(u64),
}

impl Storage {
    pub fn new() -> Arc<Storage> {
        Arc::default()
    }

    pub fn arm(&self, when: When, fault: Fault) {
        let mut state = self.state();
        match when {
            When::Now => state.active = Some(fault),
            When::AfterWrites(n) => state.armed = Some((Trigger::Writes(state.writes + n), fault)),
            When::AfterSyncs(n) => state.armed = Some((Trigger::Syncs(state.syncs + n), fault)),
        }
    }

    /// Disarms every fault (a dead machine stays dead).
    pub fn heal(&self) {
        let mut state = self.state();
        state.armed = None;
        state.active = None;
    }

    pub fn writes(&self) -> u64 {
        self.state().writes
    }

    pub fn syncs(&self) -> u64 {
        self.state().syncs
    }

    /// I/O calls failed on purpose so far.
    pub fn failures(&self) -> u64 {
        self.state().failures
    }

    fn state(&self) -> MutexGuard<'_, State> {
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let due = match state.armed {
            Some((Trigger::Writes(at), fault)) if state.writes >= at => Some(fault),
            Some((Trigger::Syncs(at), fault)) if state.syncs >= at => Some(fault),
            _ => None,
        };
        if let Some(fault) = due {
            state.armed = None;
            state.active = Some(fault);
        }
        state
    }
}

/// redb's own file backend on a real file, failing as its [`Storage`] says. Writes stay "in the
/// page cache" (in memory, visible to reads) until an fsync writes them to the file, so a fault
/// can decide what of them reached the disk.
#[derive(Debug)]
pub struct FaultyBackend {
    file: FileBackend,
    storage: Arc<Storage>,
}

impl FaultyBackend {
    pub fn open(path: &Path, storage: Arc<Storage>) -> FaultyBackend {
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).expect("open");
        FaultyBackend { file: FileBackend::new(file).expect("file backend"), storage }
    }

    /// The machine dies: what was not synced is written (without a sync) or dropped.
    fn drop_pending(&self, state: &mut State, unsynced: Unsynced) {
        let pending = std::mem::take(&mut state.pending);
        if unsynced == Unsynced::Kept {
            for (offset, data) in pending {
                let _ = self.file.write(offset, &data);
            }
        }
    }

    fn write_back(&self, state: &mut State) -> io::Result<()> {
        for (offset, data) in std::mem::take(&mut state.pending) {
            self.file.write(offset, &data)?;
        }
        Ok(())
    }
}

fn eio(what: &str) -> io::Error {
    io::Error::other(format!("injected: input/output error ({what})"))
}

fn dead() -> io::Error {
    eio("the machine died at a torn write")
}

impl StorageBackend for FaultyBackend {
    fn len(&self) -> Result<u64, io::Error> {
        if self.storage.state().dead {
            return Err(dead());
        }
        self.file.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        let state = self.storage.state();
        if state.dead {
            return Err(dead());
        }
        self.file.read(offset, out)?;
        let end = offset + out.len() as u64;
        for (at, data) in &state.pending {
            let (from, to) = ((*at).max(offset), (at + data.len() as u64).min(end));
            if from < to {
                out[(from - offset) as usize..(to - offset) as usize]
                    .copy_from_slice(&data[(from - at) as usize..(to - at) as usize]);
            }
        }
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        let mut state = self.storage.state();
        if state.dead {
            return Err(dead());
        }
        if state.active == Some(Fault::DiskFull) && len > self.file.len()? {
            state.failures += 1;
            return Err(io::Error::new(io::ErrorKind::StorageFull, "injected: no space left on device"));
        }
        self.file.set_len(len)?;
        for (at, data) in &mut state.pending {
            data.truncate(len.saturating_sub(*at) as usize);
        }
        state.pending.retain(|(_, data)| !data.is_empty());
        Ok(())
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        let mut state = self.storage.state();
        if state.dead {
            return Err(dead());
        }
        if let Some(Fault::SyncError(unsynced)) = state.active {
            state.failures += 1;
            self.drop_pending(&mut state, unsynced);
            return Err(eio("fsync"));
        }
        if let Some(Fault::SlowSync(ms)) = state.active {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
        self.write_back(&mut state)?;
        self.file.sync_data()?;
        state.syncs += 1;
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        let mut state = self.storage.state();
        state.writes += 1;
        if state.dead {
            return Err(dead());
        }
        match state.active {
            Some(Fault::WriteError) => {
                state.active = None;
                state.failures += 1;
                Err(eio("write"))
            }
            Some(Fault::TornWrite(unsynced)) => {
                state.active = None;
                state.failures += 1;
                self.drop_pending(&mut state, unsynced);
                // Half of this write reached the platter when the power went.
                let _ = self.file.write(offset, &data[..data.len() / 2]);
                state.dead = true;
                Err(dead())
            }
            Some(Fault::DiskFull) => {
                state.failures += 1;
                Err(io::Error::new(io::ErrorKind::StorageFull, "injected: no space left on device"))
            }
            _ => {
                state.pending.push((offset, data.to_vec()));
                Ok(())
            }
        }
    }

    /// Releases the file's locks whatever happened (the process goes on and reopens the file);
    /// a live machine's page cache reaches the disk.
    fn close(&self) -> Result<(), io::Error> {
        let mut state = self.storage.state();
        if !state.dead {
            let _ = self.write_back(&mut state);
        }
        self.file.close()
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.file.try_lock_range(start, end)
    }

    fn try_lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.file.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.file.query_lock_range(start, end)
    }
}

/// A host on `path` over a faulty backend, configured as the suite's hosts are.
async fn faulty_host(path: &Path, provider: &ProviderHandle, honours_keys: bool) -> (Arc<Storage>, Host) {
    let storage = Storage::new();
    let ledger = Ledger::open_on(FaultyBackend::open(path, storage.clone()), path).expect("open the ledger");
    let host = configure(HostBuilder::on_ledger(ledger), provider, honours_keys).build().await.expect("build host");
    load_all(&host).await;
    (storage, host)
}

/// A step of the case's own run: the cases of a test share a provider, and a key it saw before
/// with other args would be refused.
fn step(run: &str, step: &str, tool: &str, args: &Value) -> Call {
    Call::step(run, step, tool, args.to_string())
}

fn reserve(order: &str) -> Value {
    json!({"order_id": order, "sku": "sku-1", "quantity": 1})
}

async fn completed(host: &Host, call: Call) -> Outcome {
    let outcome = host.call(call).await.expect("call runs");
    assert!(outcome.is_completed(), "{outcome:?}");
    outcome
}

/// What a call on a host whose storage failed said: an error, or an outcome that must be neither
/// `completed` nor `failed` (neither is known: its record may not have reached the disk).
fn neither_completed_nor_failed(what: &str, result: &Result<Outcome, CallError>) {
    if let Ok(outcome) = result {
        assert!(
            !matches!(outcome.status, Status::Completed | Status::Failed),
            "{what}: reported {:?} though its record may not be on disk: {outcome:?}",
            outcome.status
        );
    }
}

/// The acknowledged calls, replayed on a healthy host after the reopen: from the ledger, as they
/// were answered.
async fn replayed_as_acknowledged(host: &Host, acknowledged: &[(Call, Outcome)]) {
    for (call, first) in acknowledged {
        let again = host.call(call.clone()).await.expect("replay");
        assert!(again.replayed && again.is_completed(), "an acknowledged call was lost: {first:?} -> {again:?}");
        assert_eq!(again.output, first.output, "an acknowledged call's output changed");
    }
}

const FAULTS: [Fault; 6] = [
    Fault::WriteError,
    Fault::TornWrite(Unsynced::Kept),
    Fault::TornWrite(Unsynced::Lost),
    Fault::DiskFull,
    Fault::SyncError(Unsynced::Kept),
    Fault::SyncError(Unsynced::Lost),
];

#[tokio::test]
async fn a_write_ahead_that_cannot_be_made_durable_sends_nothing_and_the_host_fails_closed() {
    let provider = Provider::start().await.expect("provider");
    for (n, fault) in FAULTS.into_iter().enumerate() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("ledger.redb");
        let (first, second) = (format!("o-{n}-1"), format!("o-{n}-2"));
        let run = format!("{fault:?}");
        let acknowledged = {
            let (storage, host) = faulty_host(&path, &provider, false).await;
            let call = step(&run, "charge-1", "charge", &charge(&first));
            let acknowledged = vec![(call.clone(), completed(&host, call).await)];

            // The claim is in memory: the call's first write is its effect's write-ahead.
            storage.arm(When::Now, fault);
            let requests = provider.requests();
            let result = host.call(step(&run, "charge-2", "charge", &charge(&second))).await;
            neither_completed_nor_failed(&format!("{fault:?}: the faulted charge"), &result);
            assert!(storage.failures() > 0, "{fault:?} was never hit");
            assert_eq!(provider.requests(), requests, "{fault:?}: a charge left without a durable write-ahead");

            // Fails closed, even once the disk is fine again: no call runs, nothing is sent.
            storage.heal();
            for (name, tool, args) in
                [("charge-3", "charge", charge(&format!("o-{n}-3"))), ("reserve-1", "reserve", reserve(&first))]
            {
                let result = host.call(step(&run, name, tool, &args)).await;
                assert!(result.is_err(), "{fault:?}: {name} ran on a failed ledger: {result:?}");
            }
            // A replay may still be answered from what redb holds in memory: the record is durable.
            if let Ok(replay) = host.call(acknowledged[0].0.clone()).await {
                assert!(replay.replayed && replay.output == acknowledged[0].1.output, "{fault:?}: {replay:?}");
            }
            assert_eq!(provider.requests(), requests, "{fault:?}: the failed host sent something");
            acknowledged
        };

        let host = host_for(&path, &provider, false).await;
        replayed_as_acknowledged(&host, &acknowledged).await;
        let again = host.call(step(&run, "charge-2", "charge", &charge(&second))).await.expect("call");
        match again.status {
            // Nothing of the faulted step reached the disk, and nothing of it left: it runs now, once.
            Status::Completed => {
                assert!(!again.replayed, "{fault:?}: {again:?}");
                assert_eq!(provider.counts(&second).payments, 1, "{fault:?}");
            }
            // The write-ahead reached the disk although its fsync failed (the page cache kept it):
            // after the restart nobody can tell whether the charge left, so it is in doubt (it
            // did not leave; reconciliation will say so), and nothing is sent on a guess.
            Status::Unknown => {
                assert_eq!(fault, Fault::SyncError(Unsynced::Kept), "{again:?}");
                assert!(again.replayed, "{fault:?}: {again:?}");
                assert_eq!(provider.counts(&second).payments, 0, "{fault:?}");
                let effects = host.ledger().effects(again.operation_key.as_deref().expect("key")).await.expect("read");
                assert_eq!(effects.len(), 1, "{fault:?}: {effects:?}");
                assert_eq!(effects[0].status, EffectStatus::Unknown, "{fault:?}");
            }
            status => panic!("{fault:?}: the step ended {status:?}: {again:?}"),
        }
        assert_eq!(provider.counts(&first).payments, 1, "{fault:?}");
    }
}

/// A write-ahead whose commit took longer than `SEND_BY` (a disk that stalled, a host paused or
/// starved between the two) is not sent: by then another host sharing the ledger may have taken
/// the step over and reconciled it. The step is in doubt and nothing reached the provider.
#[tokio::test]
async fn an_effect_whose_write_ahead_took_too_long_is_not_sent_and_is_in_doubt() {
    let provider = Provider::start().await.expect("provider");
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("ledger.redb");
    let storage = Storage::new();
    let ledger = Ledger::open_on(FaultyBackend::open(&path, storage.clone()), &path).expect("open the ledger");
    let send_by = std::time::Duration::from_millis(300);
    let builder = configure(HostBuilder::on_ledger(ledger), &provider, false).send_deadline(send_by);
    let host = builder.build().await.expect("build host");
    load_all(&host).await;
    storage.arm(When::Now, Fault::SlowSync(send_by.as_millis() as u64 + 400));
    let requests = provider.requests();
    let late = host.call(step("slow", "charge-1", "charge", &charge("o-slow"))).await.expect("call");
    storage.heal();
    assert_eq!(late.status, Status::Unknown, "{late:?}");
    assert_eq!(provider.requests(), requests, "a send that could not follow its write-ahead in time left anyway");
    let effects = host.ledger().effects(late.operation_key.as_deref().expect("key")).await.expect("read");
    assert!(effects.iter().all(|e| e.status.in_doubt()), "{effects:?}");
    assert_eq!(provider.counts("o-slow").payments, 0);
}

#[tokio::test]
async fn an_answer_that_cannot_be_recorded_leaves_the_step_in_doubt_and_it_is_not_sent_again() {
    let provider = Provider::start().await.expect("provider");
    for (n, fault) in FAULTS.into_iter().enumerate() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("ledger.redb");
        let (first, second) = (format!("o-{n}-1"), format!("o-{n}-2"));
        let run = format!("{fault:?}");
        let acknowledged = {
            // A downstream not declared to honour keys: nothing in doubt may be resent.
            let (storage, host) = faulty_host(&path, &provider, false).await;
            let call = step(&run, "charge-1", "charge", &charge(&first));
            let acknowledged = vec![(call.clone(), completed(&host, call).await)];

            // The provider commits the charge and holds its answer; the storage fails meanwhile.
            provider.arm(ProviderFault::new(Route::Payments, FaultKind::Delay { delay_ms: 300 }).for_order(&second));
            let in_flight = tokio::spawn({
                let host = host.clone();
                let call = step(&run, "charge-2", "charge", &charge(&second));
                async move { host.call(call).await }
            });
            eventually("the provider committed the charge", || provider.counts(&second).payments == 1).await;
            storage.arm(When::Now, fault);
            let result = in_flight.await.expect("the call ends");
            neither_completed_nor_failed(&format!("{fault:?}: the charge whose answer was not recorded"), &result);
            assert!(storage.failures() > 0, "{fault:?} was never hit");
            acknowledged
        };
        assert_eq!(provider.counts(&second).payments, 1, "{fault:?}");

        let host = host_for(&path, &provider, false).await;
        replayed_as_acknowledged(&host, &acknowledged).await;
        let requests = provider.requests();
        let again = host.call(step(&run, "charge-2", "charge", &charge(&second))).await.expect("call");
        assert_eq!(provider.requests(), requests, "{fault:?}: a charge in doubt was sent again: {again:?}");
        assert_eq!(provider.counts(&second).payments, 1, "{fault:?}");
        let key = again.operation_key.clone().expect("key");
        let effects = host.ledger().effects(&key).await.expect("effects");
        assert_eq!(effects.len(), 1, "{fault:?}: {effects:?}");
        match again.status {
            // What the disk kept was the write-ahead: recovery made it unknown.
            Status::Unknown => {
                assert!(again.replayed, "{fault:?}: {again:?}");
                assert_eq!(effects[0].status, EffectStatus::Unknown, "{fault:?}");
                let op = host.ledger().operation(&key).await.expect("read").expect("op");
                assert_eq!(op.status, OperationStatus::Unknown, "{fault:?}");
            }
            // The answer reached the disk after all (the fsync failed, the page cache did not):
            // the next attempt took it from the ledger.
            Status::Completed => {
                assert!(fault == Fault::SyncError(Unsynced::Kept), "{fault:?}: the answer survived: {again:?}");
                assert_eq!(effects[0].status, EffectStatus::Completed, "{fault:?}");
                assert_eq!(again.output.as_ref().expect("output")["order_id"], second.as_str());
            }
            status => panic!("{fault:?}: the step ended {status:?}: {again:?}"),
        }
    }
}

#[tokio::test]
async fn what_was_acknowledged_survives_a_fault_on_an_attempts_record() {
    let provider = Provider::start().await.expect("provider");
    for fault in FAULTS {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("ledger.redb");
        let run = format!("{fault:?}");
        let acknowledged = {
            let (storage, host) = faulty_host(&path, &provider, true).await;
            let mut acknowledged = Vec::new();
            for (name, tool, args) in [
                ("reserve-1", "reserve", reserve("o-1")),
                ("reserve-2", "reserve", reserve("o-2")),
                ("charge-1", "charge", charge(&format!("{fault:?}-1"))),
                (
                    "notify-1",
                    "notify",
                    json!({"order_id": "o-1", "email": "a@example.com", "template": "confirmation"}),
                ),
            ] {
                let call = step(&run, name, tool, &args);
                acknowledged.push((call.clone(), completed(&host, call).await));
            }

            // A reservation's claim, KV writes and attempt record are one commit.
            storage.arm(When::Now, fault);
            let result = host.call(step(&run, "reserve-3", "reserve", &reserve("o-3"))).await;
            neither_completed_nor_failed(&format!("{fault:?}: the faulted reservation"), &result);
            assert!(storage.failures() > 0, "{fault:?} was never hit");
            acknowledged
        };

        let host = host_for(&path, &provider, true).await;
        replayed_as_acknowledged(&host, &acknowledged).await;
        // The faulted reservation counted once or not at all: the count and the records agree.
        let again = completed(&host, step(&run, "reserve-3", "reserve", &reserve("o-3"))).await;
        if again.replayed {
            assert_eq!(fault, Fault::SyncError(Unsynced::Kept), "only a commit whose fsync failed can survive");
        }
        assert_eq!(again.output.as_ref().expect("output")["reserved_total"], 3, "{fault:?}: {again:?}");
        let (count, _) = host.ledger().kv_entry("reservations", "reserved/sku-1").await.expect("kv").expect("count");
        assert_eq!(count, b"3", "{fault:?}");
        assert_eq!(host.ledger().outbox().await.expect("outbox").len(), 1, "{fault:?}: the notification");
    }
}

/// A charge's attempt record (its second fsync, after the write-ahead) fails. The answer rode
/// with it ([`oncebox::ledger::answer_may_ride`]): if the disk kept it, the step completes from it
/// after the restart; if not, the step is in doubt, as after a crash between the send and the
/// answer. Either way without a request: a charge in doubt is never sent again blindly.
#[tokio::test]
async fn a_charge_whose_attempt_record_fails_completes_from_its_answer_if_the_disk_kept_it_else_is_in_doubt() {
    let provider = Provider::start().await.expect("provider");
    // A charge on a fresh ledger is two fsyncs: its write-ahead, and its attempt record with the
    // answer that rode on it.
    let syncs = {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("ledger.redb");
        let (storage, host) = faulty_host(&path, &provider, false).await;
        let before = storage.syncs();
        completed(&host, step("probe", "charge-1", "charge", &charge("probe-1"))).await;
        storage.syncs() - before
    };
    assert_eq!(syncs, 2, "a write-ahead, and an attempt record carrying the answer");
    let mut seen = Vec::new();
    for fault in FAULTS {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("ledger.redb");
        let (run, order) = (format!("{fault:?}"), format!("record-{fault:?}"));
        {
            let (storage, host) = faulty_host(&path, &provider, false).await;
            storage.arm(When::AfterSyncs(1), fault);
            let result = host.call(step(&run, "charge-1", "charge", &charge(&order))).await;
            neither_completed_nor_failed(&format!("{fault:?}: the charge whose record failed"), &result);
            assert!(storage.failures() > 0, "{fault:?} was never hit");
        }
        assert_eq!(provider.counts(&order).payments, 1, "{fault:?}");
        let requests = provider.requests();

        let host = host_for(&path, &provider, false).await;
        let again = host.call(step(&run, "charge-1", "charge", &charge(&order))).await.expect("call");
        assert_eq!(provider.requests(), requests, "{fault:?}: the charge was sent again: {again:?}");
        assert_eq!(provider.counts(&order).payments, 1, "{fault:?}");
        let key = again.operation_key.clone().expect("key");
        let effects = host.ledger().effects(&key).await.expect("effects");
        assert_eq!(effects.len(), 1, "{fault:?}: {effects:?}");
        match again.status {
            Status::Completed => {
                assert_eq!(effects[0].status, EffectStatus::Completed, "{fault:?}");
                assert_eq!(again.output.as_ref().expect("output")["order_id"], order.as_str(), "{fault:?}");
            }
            Status::Unknown => {
                assert!(again.replayed, "{fault:?}: {again:?}");
                assert_eq!(effects[0].status, EffectStatus::Unknown, "{fault:?}");
            }
            status => panic!("{fault:?}: the step ended {status:?}: {again:?}"),
        }
        seen.push((fault, again.status));
    }
    // Whichever fault: the fsync that failed carried the answer, so where the unsynced writes
    // are lost the answer is too, and where they are kept it survives.
    for (fault, status) in seen {
        match fault {
            Fault::SyncError(Unsynced::Lost) => {
                assert_eq!(status, Status::Unknown, "{fault:?}: the answer rode with it")
            }
            Fault::SyncError(Unsynced::Kept) => assert_eq!(status, Status::Completed, "{fault:?}: the disk kept it"),
            _ => {}
        }
    }
}

/// A charge call, torn at its `n`th write (each of them in turn, for both fates of the writes
/// not yet synced): whatever reached the disk, nothing acknowledged is lost, and a charge that
/// left the host is known to the ledger after the restart, so it is never sent twice.
#[tokio::test]
async fn a_torn_write_anywhere_in_a_call_loses_nothing_acknowledged_and_sends_nothing_twice() {
    let provider = Provider::start().await.expect("provider");
    // How many writes a charge takes on this ledger (its write-ahead, then its answer and attempt
    // record, made durable together).
    let writes = {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("ledger.redb");
        let (storage, host) = faulty_host(&path, &provider, false).await;
        let run = "probe";
        completed(&host, step(run, "charge-1", "charge", &charge("probe-1"))).await;
        let before = storage.writes();
        completed(&host, step(run, "charge-2", "charge", &charge("probe-2"))).await;
        storage.writes() - before
    };
    assert!(writes >= 2, "a charge is two durable commits: {writes} writes");
    let mut seen = std::collections::BTreeMap::<String, u32>::new();
    for unsynced in [Unsynced::Kept, Unsynced::Lost] {
        for n in 0..writes {
            let dir = tempfile::tempdir().expect("dir");
            let path = dir.path().join("ledger.redb");
            let (first, second) = (format!("{unsynced:?}-{n}-1"), format!("{unsynced:?}-{n}-2"));
            let case = format!("torn at write {n} of {writes}, unsynced writes {unsynced:?}");
            let run = case.clone();
            let acknowledged = {
                let (storage, host) = faulty_host(&path, &provider, false).await;
                let call = step(&run, "charge-1", "charge", &charge(&first));
                let acknowledged = vec![(call.clone(), completed(&host, call).await)];
                storage.arm(When::AfterWrites(n), Fault::TornWrite(unsynced));
                let result = host.call(step(&run, "charge-2", "charge", &charge(&second))).await;
                neither_completed_nor_failed(&case, &result);
                assert_eq!(storage.failures(), 1, "{case}: the tear was never hit");
                acknowledged
            };
            let sent = provider.counts(&second).payments;

            let host = host_for(&path, &provider, false).await;
            replayed_as_acknowledged(&host, &acknowledged).await;
            let requests = provider.requests();
            let again = host.call(step(&run, "charge-2", "charge", &charge(&second))).await.expect("call");
            let after = provider.counts(&second).payments;
            // The provider dedups by key, so its count alone would hide a resend: count requests.
            let resent = provider.requests() - requests;
            match again.status {
                // Run now (nothing of it was on disk, so nothing had left), or completed from
                // the answer on disk without a request: charged once either way.
                Status::Completed => {
                    assert_eq!(after, 1, "{case}: sent {sent}, then {again:?}");
                    assert_eq!(resent, 1 - sent, "{case}: sent {sent}, then {resent} more: {again:?}");
                }
                // In doubt: the write-ahead reached the disk, and the charge left, or the tear
                // came after what the disk needed and before it was sent. Nothing is sent again.
                Status::Unknown => {
                    assert!(again.replayed, "{case}: {again:?}");
                    assert_eq!((after, resent), (sent, 0), "{case}: an unknown charge was sent again");
                }
                status => panic!("{case}: the step ended {status:?}: {again:?}"),
            }
            *seen.entry(format!("sent {sent}, then {:?} replayed {}", again.status, again.replayed)).or_default() += 1;
        }
    }
    eprintln!("torn writes over {writes} writes of a charge: {seen:?}");
}

/// A real ledger with a few acknowledged steps, closed cleanly.
async fn real_ledger(path: &Path) {
    let provider = Provider::start().await.expect("provider");
    let host = host_for(path, &provider, true).await;
    for n in 0..20 {
        completed(&host, step("run-1", &format!("reserve-{n}"), "reserve", &reserve(&format!("o-{n}")))).await;
        completed(&host, step("run-1", &format!("charge-{n}"), "charge", &charge(&format!("o-{n}")))).await;
    }
}

#[tokio::test]
async fn a_file_that_is_not_a_usable_ledger_gets_one_line_exit_2_and_is_left_as_it_was() {
    let dir = tempfile::tempdir().expect("dir");
    let real = dir.path().join("real.redb");
    real_ledger(&real).await;
    let bytes = std::fs::read(&real).expect("read");
    let junk: Vec<u8> = (0..64 * 1024u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let half = bytes[..bytes.len() / 2].to_vec();
    let mut overwritten = bytes.clone();
    let middle = bytes.len() / 2;
    overwritten[middle..middle + 4096].fill(0xa5);

    let reserve_args = reserve("o-new").to_string();
    let mut wrong = Vec::new();
    for (name, content) in [("junk.redb", junk), ("half.redb", half), ("overwritten.redb", overwritten)] {
        let path = dir.path().join(name);
        std::fs::write(&path, &content).expect("write");
        let file = path.to_str().expect("utf8");
        let commands: [Vec<&str>; 3] = [
            vec!["ledger", "list", "--ledger", file],
            vec!["ledger", "show", "--ledger", file, "no-such-key"],
            vec![
                "call",
                "--ledger",
                file,
                "--run",
                "r",
                "--step",
                "s",
                "--grant",
                "kv=reservations",
                oncebox_artifacts::RESERVE,
                &reserve_args,
            ],
        ];
        for command in commands {
            let (code, stdout, stderr) = oncebox(&command);
            let what = format!("{name}: {}", command[..2].join(" "));
            let expected = format!("error: {file} is not a usable oncebox ledger: ");
            let unchanged = std::fs::read(&path).expect("read") == content;
            eprintln!("{what}: exit {code}, unchanged {unchanged}, stdout {stdout}, stderr {stderr:?}");
            if stderr.contains("panicked")
                || stderr.trim_end().lines().count() != 1
                || !stderr.starts_with(&expected)
                || code != 2
                || stdout != Value::Null
                || !unchanged
            {
                wrong.push(what);
            }
            std::fs::write(&path, &content).expect("write");
        }
    }
    assert!(wrong.is_empty(), "not one line naming the file, exit 2, the file left as it was: {wrong:?}");
    // The real ledger itself was fine all along.
    let ledger = Ledger::open(&real).expect("open");
    assert_eq!(ledger.operations(None).await.expect("list").len(), 40);
}

/// Damage anywhere in a real ledger (64 bytes of each 4 KiB page overwritten in turn, or the file
/// cut at each page): the open refuses the file, naming it, and leaves it as it was, or (for a
/// page no tree uses) opens it with every record there. Never a panic, never a record lost.
#[tokio::test]
async fn damage_anywhere_in_a_ledger_is_refused_or_harmless_and_never_loses_a_record() {
    let dir = tempfile::tempdir().expect("dir");
    let real = dir.path().join("real.redb");
    real_ledger(&real).await;
    let bytes = std::fs::read(&real).expect("read");
    let path = real.clone();
    let expected = std::thread::spawn(move || operations(&path)).join().expect("no panic").expect("it opens");
    assert_eq!(expected.len(), 40);
    let copy = dir.path().join("copy.redb");
    let pages = bytes.len() / 4096;
    let mut seen = std::collections::BTreeMap::<String, u32>::new();
    for (n, damage) in (0..pages).map(|p| ("overwritten", p)).chain((0..pages).map(|p| ("cut", p))).enumerate() {
        let content = match damage {
            ("overwritten", page) => {
                let mut content = bytes.clone();
                content[page * 4096 + 64..page * 4096 + 128].fill(0xa5);
                content
            }
            (_, page) => bytes[..page * 4096 + 100].to_vec(),
        };
        std::fs::write(&copy, &content).expect("write");
        let what = format!("{} at page {} (case {n})", damage.0, damage.1);
        let path = copy.clone();
        let opened = std::thread::spawn(move || operations(&path)).join();
        let outcome = match opened {
            Err(_) => panic!("{what}: the open panicked"),
            Ok(Ok(found)) => {
                assert_eq!(found, expected, "{what}: opened with other records");
                "opened"
            }
            Ok(Err(e)) => {
                let message = e.to_string();
                assert!(e.is_unusable_ledger(), "{what}: {message}");
                assert!(message.starts_with(&format!("{} is not a usable oncebox ledger: ", copy.display())));
                assert!(std::fs::read(&copy).expect("read") == content, "{what}: the file was changed");
                "refused"
            }
        };
        *seen.entry(format!("{}: {outcome}", damage.0)).or_default() += 1;
    }
    eprintln!("damage over {pages} pages: {seen:?}");
}

/// Every operation of the ledger at `path` with its status, read by a plain open.
fn operations(path: &Path) -> Result<Vec<(String, OperationStatus)>, oncebox::LedgerError> {
    let ledger = Ledger::open(path)?;
    let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    let ops = runtime.block_on(ledger.operations(None))?;
    Ok(ops.into_iter().map(|op| (op.key, op.status)).collect())
}
