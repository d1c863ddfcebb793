//! Races inside the store, on the seed's schedule.
//!
//! A host runs on many threads: while one holds a claim's snapshot open inside a synchronous
//! function of the store, another may finish a decision on the same request (its write committed,
//! its mark dropped). The simulation's one thread never stops inside a synchronous function, so
//! such a race would happen only on a `free` seed, by luck. Here a decision on a request for
//! approval can be held back at the store's window after its mark and before its write
//! ([`Window::DecisionMarked`]), or after its commit and before its mark is dropped
//! ([`Window::DecisionWritten`]), on a thread of its own, while the simulation goes on; it is let
//! go, and waited for, at the moment a claim of its step has opened its snapshot
//! ([`Window::ClaimSnapshot`]), or else when its time is up (up to a few of the operator's
//! looks, simulated). Only one thread runs at a time (the other waits on it), so a seed still
//! runs the same way every time.
//!
//! Which decisions are held, and for how long, is drawn from the seed and the request
//! ([`plan::choice`](crate::plan::choice)), never from arrival order.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::JoinHandle;
use std::time::Duration;

use oncebox_runtime::LedgerError;
use oncebox_runtime::ledger::{ApprovalRecord, Store};
use oncebox_runtime::window::Window;

use crate::plan::choice;

thread_local! {
    /// On a thread that carries a held decision: where it says it reached its window, and what
    /// lets it go on.
    static GATE: RefCell<Option<Gate>> = const { RefCell::new(None) };
}

struct Gate {
    /// Where it is held.
    at: Window,
    reached: mpsc::Sender<()>,
    /// `true`: the write goes on; `false` (or the sender gone): the host died here.
    release: mpsc::Receiver<bool>,
}

/// What unwinds a held decision's thread when its host died while it was held: nothing of it
/// was handed to the writer, so nothing of it is written.
struct Abandoned;

/// Held decisions, by operation key (one seed at a time runs in a process).
static HELD: Mutex<BTreeMap<String, Vec<Arc<Hold>>>> = Mutex::new(BTreeMap::new());

fn held() -> std::sync::MutexGuard<'static, BTreeMap<String, Vec<Arc<Hold>>>> {
    HELD.lock().unwrap_or_else(|p| p.into_inner())
}

/// One decision held at its window.
struct Hold {
    /// Where it is held.
    at: Window,
    release: Mutex<Option<mpsc::Sender<bool>>>,
    finished: Mutex<bool>,
    ended: Condvar,
    /// Tells the decision's caller it was let go and is over.
    woken: tokio::sync::Notify,
}

impl Hold {
    /// Lets the decision go on (`go`) or die where it is, and waits until it is over (its mark
    /// dropped).
    fn release_and_wait(&self, go: bool) {
        if let Some(release) = self.release.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = release.send(go);
        }
        let mut finished = self.finished.lock().unwrap_or_else(|p| p.into_inner());
        while !*finished {
            finished = self.ended.wait(finished).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn finish(&self) {
        *self.finished.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.ended.notify_all();
    }
}

/// Installs the watcher of the store's windows, for this process. `false` if another was first.
pub fn install() -> bool {
    oncebox_runtime::window::watch(at)
}

fn at(window: Window, key: &str) {
    match window {
        Window::DecisionMarked | Window::DecisionWritten => {
            let gate = GATE.with(|gate| {
                let mut gate = gate.borrow_mut();
                if gate.as_ref().is_some_and(|g| g.at == window) { gate.take() } else { None }
            });
            if let Some(gate) = gate {
                let _ = gate.reached.send(());
                if gate.release.recv() != Ok(true) {
                    // Its host died while it was held: unwound without a panic's message.
                    std::panic::resume_unwind(Box::new(Abandoned));
                }
            }
        }
        Window::ClaimSnapshot => {
            let holds = held().remove(key).unwrap_or_default();
            for hold in holds {
                hold.release_and_wait(true);
                hold.woken.notify_one();
            }
        }
        _ => {}
    }
}

/// When decisions are held: a seed's percent of them, each up to `max_ms` (simulated).
#[derive(Debug)]
pub struct Holds {
    pub seed: u64,
    pub pct: u64,
    pub max_ms: u64,
    /// Decisions seen per key: the n-th decision on a key is drawn apart from the others.
    seen: Mutex<BTreeMap<String, u32>>,
}

impl Holds {
    pub fn new(seed: u64, pct: u64, max_ms: u64) -> Holds {
        Holds { seed, pct, max_ms, seen: Mutex::default() }
    }

    /// Where to hold this write of `record` back (before it is handed to the writer, or after its
    /// commit and before its mark is dropped), and how long, if at all.
    fn draw(&self, record: &ApprovalRecord) -> Option<(Window, Duration)> {
        let nth = {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            let nth = seen.entry(record.operation_key.clone()).or_insert(0);
            *nth += 1;
            *nth
        };
        let parts = [record.operation_key.as_str(), record.state.as_str(), &nth.to_string()];
        let pick = choice(self.seed, &[&["hold"][..], &parts[..]].concat());
        let at = if (pick / 100).is_multiple_of(2) { Window::DecisionMarked } else { Window::DecisionWritten };
        (pick % 100 < self.pct).then(|| (at, Duration::from_millis(1 + (pick / 200) % self.max_ms.max(1))))
    }
}

/// Marks its hold over when dropped.
struct Over(Arc<Hold>);

impl Drop for Over {
    fn drop(&mut self) {
        self.0.finish();
    }
}

/// A held decision as its caller holds it: dropped (its host crashed), it dies where it is held,
/// unwritten, and is waited for, so that no thread of a dead host outlives it.
struct Held {
    key: String,
    hold: Arc<Hold>,
    thread: Option<JoinHandle<Result<(), LedgerError>>>,
}

impl Held {
    fn end(mut self) -> Result<(), LedgerError> {
        self.hold.release_and_wait(true);
        let thread = self.thread.take();
        let stopped = || LedgerError::Writer { reason: "a held decision's thread panicked".into() };
        thread.map_or_else(|| Err(stopped()), |t| t.join().unwrap_or_else(|_| Err(stopped())))
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(list) = held().get_mut(&self.key) {
            list.retain(|h| !Arc::ptr_eq(h, &self.hold));
        }
        self.hold.release_and_wait(false);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// `store.put_approval(record)`, held back at its window when the seed says so.
///
/// Holds follow from each other as a writer's batches do: a decision on a request whose other
/// decision is held committed with its mark not yet dropped (`DecisionWritten`) is the next
/// batch's. It is held marked and unwritten (`DecisionMarked`) for as long as a hold may last,
/// and the one before it then goes on (its mark dropped) at once: the request has one decision
/// written and another marked, which only a claim of its step lets go.
pub async fn put_approval<S: Store + 'static>(
    holds: &Holds,
    store: &Arc<S>,
    record: &ApprovalRecord,
) -> Option<Result<(), LedgerError>> {
    let before = held()
        .get(&record.operation_key)
        .and_then(|list| list.iter().find(|h| h.at == Window::DecisionWritten).cloned());
    let (at, wait) = match &before {
        Some(_) => (Window::DecisionMarked, Duration::from_millis(holds.max_ms.max(1))),
        None => holds.draw(record)?,
    };
    let (reached, reaching) = mpsc::channel();
    let (release, released) = mpsc::channel();
    let hold = Arc::new(Hold {
        at,
        release: Mutex::new(Some(release)),
        finished: Mutex::new(false),
        ended: Condvar::new(),
        woken: tokio::sync::Notify::new(),
    });
    let (inner, owned, ours) = (store.clone(), record.clone(), hold.clone());
    let thread = std::thread::Builder::new().name("sim-decision".into()).spawn(move || {
        // Over when this thread is, unwound or not (after its write, and its mark, are dropped).
        let _over = Over(ours);
        GATE.with(|gate| *gate.borrow_mut() = Some(Gate { at, reached, release: released }));
        let out = park_on(inner.put_approval(&owned));
        // Refused before its window (a claim already live): nothing to hold.
        GATE.with(|gate| gate.borrow_mut().take());
        out
    });
    let thread = match thread {
        Ok(thread) => thread,
        Err(e) => return Some(Err(LedgerError::Writer { reason: format!("cannot start a held decision: {e}") })),
    };
    // The other thread runs alone until it holds at its window, or ends.
    let reached = reaching.recv().is_ok();
    let key = record.operation_key.clone();
    if let Some(before) = before.filter(|_| reached) {
        // Its batch is written: the decision before it goes on, and drops its mark.
        if let Some(list) = held().get_mut(&key) {
            list.retain(|h| !Arc::ptr_eq(h, &before));
        }
        before.release_and_wait(true);
        before.woken.notify_one();
    }
    held().entry(key.clone()).or_default().push(hold.clone());
    let held = Held { key, hold: hold.clone(), thread: Some(thread) };
    tokio::select! {
        () = tokio::time::sleep(wait) => {}
        () = hold.woken.notified() => {}
    }
    Some(held.end())
}

/// Wakes the thread that waits on a future.
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// `future`, run to its end on this thread.
fn park_on<T>(future: impl Future<Output = T>) -> T {
    let mut future = std::pin::pin!(future);
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}
