//! A paused owner: a caller's task that stops dead at one of the pipeline's points (its process
//! stopped, its VM frozen, its thread starved), alive and not crashed, for longer than its lease,
//! while another worker of the orchestrator calls the same step, takes it over and carries on.
//! Then it resumes where it stopped and tries to go on: every write it makes with its old fence
//! must be refused, and nothing it had written ahead may leave (the send deadline, `late`).
//!
//! The whole call is frozen, not only the hook it stopped in: [`Frozen`] stops polling it, so its
//! lease renewals, its attempt deadline and its backoff stand still with it, as in a stopped
//! process. The store ([`crate::paced`]) tells [`Fences`] which fence each claim got and whose
//! task it went to, and what a resumed owner wrote or sent after another claimed its step: that
//! is what the checker judges (`taken-over-owner-wrote`, `taken-over-owner-sent`).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use oncebox_runtime::hooks::Site;

use crate::plan::{choice, percent};

tokio::task_local! {
    /// The owner a caller's task stands for, while it calls.
    static OWNER: Arc<Owner>;
}

/// One call of a step by one caller, which may be paused once.
pub struct Owner {
    id: u64,
    pub run: String,
    pub step: String,
    pub order: Option<String>,
    /// Until when it stands still, once paused.
    until: Mutex<Option<tokio::time::Instant>>,
    paused: AtomicBool,
    /// What it does the moment it is paused: another worker of its orchestrator, which calls the
    /// step once the lease has run out.
    on_pause: Mutex<Option<OnPause>>,
}

/// What a paused owner sets going: given how long until its lease has run out.
pub type OnPause = Box<dyn FnOnce(Duration) + Send>;

/// What a resumed owner did after another took its step over.
#[derive(Debug, Clone)]
pub struct Breach {
    pub run: String,
    pub step: String,
    pub order: Option<String>,
    /// `wrote` or `sent`.
    pub what: &'static str,
    pub detail: String,
}

/// The claims the store granted, and the breaches of paused owners. One per seed.
#[derive(Default)]
pub struct Fences {
    /// Per operation key: the latest fence granted, and to which owner (none: the operator, the
    /// saga, the reconciler).
    latest: Mutex<BTreeMap<String, (u64, Option<u64>)>>,
    breaches: Mutex<Vec<Breach>>,
    next_id: AtomicU64,
    /// Pauses so far, of each [`Stall`].
    pauses: [AtomicU64; 2],
}

/// At most this many owners are paused in one seed for each [`Stall`]: each pause costs a lease
/// of simulated time.
const MAX_PAUSES: u64 = 2;

/// Why an owner stops dead: the draw of any point it reaches (`Plan::pause_pct`), or of a point
/// an unfavourable answer just reached (`Plan::stall_after_fault_pct`). Drawn apart and counted
/// apart, so that one kind does not use up the other's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stall {
    Anywhere,
    AfterFault,
}

impl Stall {
    fn name(self) -> &'static str {
        match self {
            Stall::Anywhere => "pause",
            Stall::AfterFault => "stall-after-fault",
        }
    }
}

impl Fences {
    pub fn breaches(&self) -> Vec<Breach> {
        self.breaches.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// A claim of `key` went to `fence`, in the task that asked.
    pub fn claimed(&self, key: &str, fence: u64) {
        let owner = OWNER.try_with(|o| o.id).ok();
        self.latest.lock().unwrap_or_else(|p| p.into_inner()).insert(key.to_string(), (fence, owner));
    }

    /// A write of `key` with `fence` was accepted: a breach if it came from a resumed owner
    /// whose step another has claimed since, with a later fence.
    pub fn wrote(&self, key: &str, fence: u64, what: &str) {
        let Ok(owner) = OWNER.try_with(Arc::clone) else { return };
        if !owner.paused.load(Ordering::SeqCst) {
            return;
        }
        let latest = self.latest.lock().unwrap_or_else(|p| p.into_inner()).get(key).copied();
        if let Some((current, by)) = latest
            && current > fence
            && by != Some(owner.id)
        {
            self.breach(&owner, "wrote", format!("{what} with fence {fence} accepted while fence {current} holds it"));
        }
    }

    /// A request of operation `key` is about to reach the downstream: a breach if it comes from
    /// a resumed owner whose step another has claimed since.
    pub fn sending(&self, key: &str) {
        let Ok(owner) = OWNER.try_with(Arc::clone) else { return };
        if !owner.paused.load(Ordering::SeqCst) {
            return;
        }
        let latest = self.latest.lock().unwrap_or_else(|p| p.into_inner()).get(key).copied();
        if let Some((current, by)) = latest
            && by != Some(owner.id)
        {
            self.breach(&owner, "sent", format!("a request sent after fence {current} took the step over"));
        }
    }

    fn breach(&self, owner: &Owner, what: &'static str, detail: String) {
        self.breaches.lock().unwrap_or_else(|p| p.into_inner()).push(Breach {
            run: owner.run.clone(),
            step: owner.step.clone(),
            order: owner.order.clone(),
            what,
            detail,
        });
    }

    /// A new owner for a caller's call of `run`/`step`.
    pub fn owner(&self, run: &str, step: &str, order: Option<String>, on_pause: OnPause) -> Arc<Owner> {
        Arc::new(Owner {
            id: self.next_id.fetch_add(1, Ordering::SeqCst) + 1,
            run: run.to_string(),
            step: step.to_string(),
            order,
            until: Mutex::new(None),
            paused: AtomicBool::new(false),
            on_pause: Mutex::new(Some(on_pause)),
        })
    }

    /// Pauses the owner calling through `site`, if the seed says so (`pct` of the sites an owner
    /// reaches, at most once per call and `MAX_PAUSES` per seed and [`Stall`]), for longer than
    /// `lease`. `Some((its run, what happened))` when it did; the caller then awaits
    /// [`yield_to_pause`].
    pub fn maybe_pause(
        &self,
        stall: Stall,
        site: &Site,
        seed: u64,
        pct: u64,
        lease: Duration,
    ) -> Option<(String, String)> {
        if pct == 0 {
            return None;
        }
        let owner = OWNER.try_with(Arc::clone).ok()?;
        if owner.paused.load(Ordering::SeqCst) {
            return None;
        }
        let draw = percent(
            seed,
            &[stall.name(), &site.operation_key, site.point.name(), &site.key, &site.occurrence.to_string()],
        );
        if draw >= pct || self.pauses[stall as usize].fetch_add(1, Ordering::SeqCst) >= MAX_PAUSES {
            return None;
        }
        let extra = Duration::from_millis(1_000 + choice(seed, &["pause-for", &site.operation_key]) % 3_000);
        let pause = lease + extra;
        owner.paused.store(true, Ordering::SeqCst);
        *owner.until.lock().unwrap_or_else(|p| p.into_inner()) = Some(tokio::time::Instant::now() + pause);
        if let Some(on_pause) = owner.on_pause.lock().unwrap_or_else(|p| p.into_inner()).take() {
            on_pause(lease + Duration::from_millis(500));
        }
        let after = if stall == Stall::AfterFault { " after an unfavourable answer" } else { "" };
        let what = format!("{}/{}{after} at {} for {} ms", owner.run, owner.step, site.point.name(), pause.as_millis());
        Some((owner.run.clone(), what))
    }
}

/// Lets the call's task reach [`Frozen`], which stands it still.
pub async fn yield_to_pause() {
    tokio::task::yield_now().await;
}

/// `call`, made by `owner`: polled only while the owner is not paused.
pub fn frozen<F: Future>(owner: Arc<Owner>, call: F) -> Frozen<impl Future<Output = F::Output>> {
    Frozen { owner: owner.clone(), sleep: None, call: Box::pin(OWNER.scope(owner, call)) }
}

pub struct Frozen<F> {
    owner: Arc<Owner>,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    call: Pin<Box<F>>,
}

impl<F: Future> Future for Frozen<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        loop {
            if let Some(sleep) = self.sleep.as_mut() {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.sleep = None;
            }
            let until = self.owner.until.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(until) = until {
                self.sleep = Some(Box::pin(tokio::time::sleep_until(until)));
                continue;
            }
            let polled = self.call.as_mut().poll(cx);
            let paused_now = self.owner.until.lock().unwrap_or_else(|p| p.into_inner()).is_some();
            if polled.is_ready() || !paused_now {
                return polled;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resumed_owner_is_judged_by_the_latest_claim_of_its_step() {
        let fences = Fences::default();
        let owner = fences.owner("run-1", "s-charge", Some("o-1".into()), Box::new(|_| {}));
        OWNER.sync_scope(owner.clone(), || fences.claimed("op", 1));
        owner.paused.store(true, Ordering::SeqCst);
        // Still its own: it may write and send.
        OWNER.sync_scope(owner.clone(), || {
            fences.wrote("op", 1, "a write");
            fences.sending("op");
        });
        assert!(fences.breaches().is_empty());
        // Another (here the saga, outside any caller's call) takes it over.
        fences.claimed("op", 2);
        OWNER.sync_scope(owner.clone(), || {
            fences.wrote("op", 1, "a write");
            fences.sending("op");
        });
        let what: Vec<&str> = fences.breaches().iter().map(|b| b.what).collect();
        assert_eq!(what, ["wrote", "sent"]);
    }
}
