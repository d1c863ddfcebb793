//! Several hosts on one PostgreSQL ledger (`--hosts N`): each its own `Ledger::connect` (its own
//! pool), its own clock skew and its own crashes. The orchestrators' calls reach them as behind a
//! load balancer: a call goes to a live host picked by who calls and how many times they asked, so
//! a retry may land on another host than the one that took the step. A host that dies takes its
//! calls in flight with it (the caller sees the connection drop, and asks again elsewhere); the
//! others go on, and take over its leases once they run out.

use std::future::Future;
use std::sync::Mutex;

use tokio::sync::watch;

use oncebox_runtime::Host;

/// One host's place behind the balancer: the host while it lives, and the signal its death sends
/// to the calls it is serving.
struct Slot {
    host: Option<Host>,
    down: watch::Sender<bool>,
    /// How far this host's wall clock is off the world's (ms): see `crate::clock::skewed`.
    skew_ms: i64,
}

/// The hosts of a seed on several hosts.
pub(super) struct Hosts {
    slots: Mutex<Vec<Slot>>,
}

/// A call that was in flight on a host when it died: nothing came back to the caller.
#[derive(Debug)]
pub(super) struct HostDied(pub usize);

impl std::fmt::Display for HostDied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "host {} went away mid-call (connection reset)", self.0)
    }
}

impl Hosts {
    /// `skews`: each host's clock skew, in ms; as many hosts as skews, none up yet.
    pub(super) fn new(skews: &[i64]) -> Hosts {
        let slots = skews.iter().map(|&skew_ms| Slot { host: None, down: watch::channel(false).0, skew_ms }).collect();
        Hosts { slots: Mutex::new(slots) }
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, Vec<Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn len(&self) -> usize {
        self.slots().len()
    }

    /// Host `k`'s clock skew (ms).
    pub(super) fn skew(&self, k: usize) -> i64 {
        self.slots().get(k).map_or(0, |s| s.skew_ms)
    }

    /// Host `k` is up (again), serving calls.
    pub(super) fn put(&self, k: usize, host: Host) {
        if let Some(slot) = self.slots().get_mut(k) {
            slot.host = Some(host);
            slot.down = watch::channel(false).0;
        }
    }

    /// Host `k` dies: every call it serves ends at once, with nothing said to its caller.
    pub(super) fn kill(&self, k: usize) {
        if let Some(slot) = self.slots().get_mut(k) {
            slot.host = None;
            slot.down.send_replace(true);
        }
    }

    /// The first live host from `pick` on (round the slots), with its number.
    pub(super) fn live(&self, pick: usize) -> Option<(usize, Host)> {
        let slots = self.slots();
        let n = slots.len().max(1);
        (0..n).map(|i| (pick + i) % n).find_map(|k| slots[k].host.clone().map(|h| (k, h)))
    }

    /// Runs `work` on the live host `pick` lands on (its clock skewed as that host's is), unless
    /// that host dies first. `None` when no host is up.
    pub(super) async fn on<T, F, Fut>(&self, pick: usize, work: F) -> Option<Result<T, HostDied>>
    where
        F: FnOnce(Host) -> Fut,
        Fut: Future<Output = T>,
    {
        let (k, host, mut down, skew) = {
            let slots = self.slots();
            let n = slots.len().max(1);
            let k = (0..n).map(|i| (pick + i) % n).find(|&k| slots[k].host.is_some())?;
            let slot = &slots[k];
            (k, slot.host.clone()?, slot.down.subscribe(), slot.skew_ms)
        };
        let work = crate::clock::skewed(skew, work(host));
        tokio::select! {
            done = work => Some(Ok(done)),
            _ = down.wait_for(|down| *down) => Some(Err(HostDied(k))),
        }
    }
}
