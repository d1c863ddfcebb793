//! The background reconciler (DESIGN section 7): a server keeps asking, with backoff, about every
//! operation whose outcome is unknown and whose tool is loaded and exports `reconcile`, so that an
//! unknown whose proof exists settles without a person.
//!
//! Each try is [`Host::reconcile_operation`]: the rule of evidence (`failure::reconciled`: the
//! settle window, the key's retention) is applied there and only there. What this module adds is
//! when to ask: [`Schedule`] and [`next_try`] (`oncebox_core::reconcile_schedule`) are pure and
//! tested alone; [`Reconciler`] reads the
//! unknown operations from the ledger every `every`, sleeps until the next try is due (a timer,
//! never a poll loop), and reports each try to its observers (the server's `/metrics`, the CLI's
//! `reconcile --watch`) and to the log.
//!
//! On a ledger several hosts share, each host's reconciler may ask about the same operation. The
//! lookup is a read; what records its proof is the ledger's `resolve`, a compare-and-set on the
//! operation's state and on the effect's dispatches as the try read them, so at most one host's
//! settlement is recorded. The other is refused (`NotInDoubt`, `EffectChanged`), which here means
//! "someone else settled it": the operation leaves the schedule, and the next reading of the
//! ledger puts it back only if it is still unknown.

use std::future::Future;
use std::time::Duration;

use futures_util::FutureExt;
use serde::Serialize;

use crate::clock::millis;
use crate::error::{CallError, LedgerError};
use crate::host::Host;
use crate::ledger::{ApprovalStanding, OperationRecord, OperationStatus, ReconcileNote, Why, run_state};
use crate::reconcile::Reconciliation;

pub use oncebox_core::reconcile_schedule::{MAX_SCHEDULED, MAX_TRIES_PER_PASS, MIN_GAP, Schedule, Settings, next_try};
/// How long one host's try of an operation holds it on a shared ledger: longer than a try takes
/// (the tool's `reconcile` runs under its attempt deadline, 30 s by default).
const TRY_LEASE: Duration = Duration::from_secs(120);
/// How long the reconciler holds a gone owner's claim it takes over: only while it ends it (a
/// claim it finds nothing in doubt in under its own is let go, for the step's next call).
const ABANDONED_LEASE_MS: u64 = 10_000;

/// What one try found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TryResult {
    /// The effect took place: the operation is completed.
    Committed,
    /// Proven not taken: the operation reopened for its next call (an irreversible one failed).
    NotCommitted,
    /// Nothing proven: asked again later.
    StillUnknown,
    /// It was no longer unknown when asked, or another host's settlement won the ledger's
    /// compare-and-set: someone else settled it.
    SettledElsewhere,
    /// Another host sharing the ledger is asking about it now (it holds the operation's
    /// `reconcile/KEY` lease): asked again later, if still unknown.
    HeldElsewhere,
    /// The try could not be made (the ledger failed): asked again later.
    Error,
}

impl TryResult {
    /// As `/metrics` labels it.
    pub fn as_str(self) -> &'static str {
        match self {
            TryResult::Committed => "committed",
            TryResult::NotCommitted => "not-committed",
            TryResult::StillUnknown => "still-unknown",
            TryResult::SettledElsewhere => "settled-elsewhere",
            TryResult::HeldElsewhere => "held-elsewhere",
            TryResult::Error => "error",
        }
    }
}

/// One try of one operation, as the observers and the log see it. It holds no args and no
/// output: what was proven is in the ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Try {
    pub operation_key: String,
    pub tool: String,
    pub result: TryResult,
    /// The operation's tries so far, this one included.
    pub tries: u32,
    /// When it is asked again (ms since the epoch), if it is still unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_try_ms: Option<u64>,
    /// Why nothing was proven, or what failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

type Observer = Box<dyn Fn(&Try) + Send + Sync>;

/// Asks again about every unknown operation of a host whose tool can reconcile, with backoff
/// ([`Host::reconciler`]). [`Reconciler::run`] until stopped; [`Reconciler::pass`] once.
pub struct Reconciler {
    host: Host,
    settings: Settings,
    schedule: Schedule,
    /// When the ledger was last read for unknown operations.
    refreshed_ms: Option<u64>,
    /// Keeps this reconciler's jitter apart from another host's.
    jitter_domain: String,
    observers: Vec<Observer>,
    /// The unknown operations a person was told about by this reconciler (`[notify]`), so that
    /// each reading of the ledger does not write the notification again; a restart forgets them,
    /// and the ledger enqueues nothing more for them (`enqueue_once`).
    told: std::collections::HashSet<String>,
    /// The requests for approval this reconciler made sure a person was told of: each one the
    /// call that made it may not have (it notifies after its request is written, and a crash may
    /// come between), or made while `[notify]` was not set.
    told_pending: std::collections::HashSet<String>,
    /// The claims whose owner is gone that this reconciler found nothing in doubt in: when it
    /// looked, and the fence and lease it read (see [`Reconciler::end_abandoned`]).
    left_abandoned: std::collections::HashMap<String, (u64, (u64, u64))>,
}

impl std::fmt::Debug for Reconciler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reconciler")
            .field("settings", &self.settings)
            .field("scheduled", &self.schedule.len())
            .finish_non_exhaustive()
    }
}

impl Host {
    /// A reconciler for this host's unknown operations: run it beside the calls
    /// (`Reconciler::run`), or one pass at a time (`Reconciler::pass`).
    pub fn reconciler(&self, settings: Settings) -> Reconciler {
        Reconciler::new(self.clone(), settings)
    }
}

impl Reconciler {
    pub(crate) fn new(host: Host, settings: Settings) -> Self {
        // Jitter is derived, not drawn (`retry::jitter`); the process and its start keep two
        // hosts' draws for the same operation apart.
        // It also names this reconciler in the leases of a shared ledger: with random bytes, since
        // two machines' processes may share a pid and a start.
        let mut nonce = [0u8; 8];
        let nonce = getrandom::fill(&mut nonce).map(|()| hex::encode(nonce)).unwrap_or_default();
        let jitter_domain = format!("oncebox/reconciler/{}-{}-{nonce}", std::process::id(), crate::clock::now_ms());
        Reconciler {
            host,
            settings,
            schedule: Schedule::default(),
            refreshed_ms: None,
            jitter_domain,
            observers: vec![],
            told: std::collections::HashSet::new(),
            told_pending: std::collections::HashSet::new(),
            left_abandoned: std::collections::HashMap::new(),
        }
    }

    /// Calls `observer` after every try (counting them, printing them). It runs on the
    /// reconciler's task: keep it short.
    pub fn on_try(mut self, observer: impl Fn(&Try) + Send + Sync + 'static) -> Self {
        self.observers.push(Box::new(observer));
        self
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// How many operations are scheduled now.
    pub fn scheduled(&self) -> usize {
        self.schedule.len()
    }

    /// One pass: reads the unknown operations from the ledger, then asks about those due now (at
    /// most [`MAX_TRIES_PER_PASS`]). With `first = 0` everything found is due at once. An error
    /// reading the ledger is returned; a try's error is in its [`Try`].
    pub async fn pass(&mut self) -> Result<Vec<Try>, LedgerError> {
        self.refresh().await?;
        let stop = std::pin::pin!(std::future::pending::<()>());
        Ok(self.try_due(stop).await)
    }

    /// Keeps asking until `stop` resolves: reads the ledger every `every`, sleeps until the next
    /// try or reading is due. A try under way when `stop` resolves is finished (a lookup and at
    /// most one ledger write, within the tool's attempt deadline); no other starts after it. An
    /// error reading the ledger is logged and the reading tried again after `every`.
    pub async fn run(mut self, stop: impl Future<Output = ()>) {
        let mut stop = std::pin::pin!(stop);
        let every = millis(self.settings.every.max(MIN_GAP));
        tracing::info!(
            first = ?self.settings.first, max = ?self.settings.max, every = ?self.settings.every,
            "the reconciler runs"
        );
        loop {
            let now = self.host.ledger().now_ms();
            let read_at = self.refreshed_ms.map_or(now, |at| at.saturating_add(every));
            let wake = self.schedule.next_due().map_or(read_at, |due| due.min(read_at));
            let wait = Duration::from_millis(wake.saturating_sub(now));
            if wait.is_zero() {
                if stop.as_mut().now_or_never().is_some() {
                    return;
                }
            } else {
                tokio::select! {
                    () = stop.as_mut() => return,
                    () = tokio::time::sleep(wait) => {}
                }
            }
            if self.refreshed_ms.is_none_or(|at| self.host.ledger().now_ms() >= at.saturating_add(every))
                && let Err(e) = self.refresh().await
            {
                tracing::warn!(error = %e, "the reconciler could not read the ledger; it reads again shortly");
            }
            self.try_due(stop.as_mut()).await;
        }
    }

    /// Reads the unknown operations whose tool is loaded and exports `reconcile` into the schedule,
    /// from the ledger's index of open work, O(open), whatever the history; and tells a person
    /// (`[notify]`) of every unknown one, whatever its tool, left unsettled for `unknown_after`.
    ///
    /// First it ends, unknown, every claim whose owner is gone with an effect in doubt: a host
    /// killed while it sent, on a ledger others share, leaves its step claimed, and until its next
    /// call takes it over (which may never come: the orchestrator may have died too) nothing would
    /// ask the downstream or tell a person of an effect that may have taken place. A claim with
    /// nothing in doubt is left for its next call to take over and run.
    async fn refresh(&mut self) -> Result<(), LedgerError> {
        let now = self.host.ledger().now_ms();
        // Marked read even when it fails, so that a failing ledger is read again after `every`,
        // not at once.
        self.refreshed_ms = Some(now);
        let open = self.host.ledger().open_operations(now, |why| matches!(why, Why::Unknown | Why::Abandoned { .. }));
        let (mut all_unknown, mut abandoned): (Vec<_>, Vec<_>) =
            open.await?.into_iter().partition(|op| op.status == OperationStatus::Unknown);
        // Read from the index, then each record: one that ended meanwhile is neither.
        abandoned.retain(|op| op.status == OperationStatus::Claimed);
        all_unknown.extend(self.end_abandoned(abandoned, now).await);
        if let Some(notifier) = self.host.notifier() {
            let unknown_now: std::collections::HashSet<&str> = all_unknown.iter().map(|op| op.key.as_str()).collect();
            self.told.retain(|key| unknown_now.contains(key.as_str()));
            for op in &all_unknown {
                if !self.told.contains(&op.key) && notifier.left_for_a_person(op, now) {
                    match notifier.notice(crate::notify::Event::Unknown(op)).await {
                        Ok(_) => {
                            self.told.insert(op.key.clone());
                        }
                        Err(e) => {
                            tracing::warn!(operation_key = %op.key, error = %e, "could not enqueue a notification; tried again at the next reading")
                        }
                    }
                }
            }
        }
        if let Some(notifier) = self.host.notifier()
            && let Err(e) = tell_pending(self.host.ledger(), notifier, &mut self.told_pending, now).await
        {
            // Telling a person never holds up the reconciling: tried again at the next reading.
            tracing::warn!(error = %e, "could not read the pending requests for approval to tell of them");
        }
        let unknown: Vec<(String, String)> =
            all_unknown.into_iter().filter(|op| self.host.reconciles(&op.tool)).map(|op| (op.key, op.tool)).collect();
        let left_out = self.schedule.refresh(&self.settings, unknown, now);
        if left_out > 0 {
            tracing::warn!(
                left_out,
                scheduled = self.schedule.len(),
                "more unknown operations than the reconciler schedules at once; the rest wait for these to settle"
            );
        }
        Ok(())
    }

    /// Ends, unknown, each of the `abandoned` claims (owner gone, read from the index of open
    /// work) that holds an effect in doubt ([`crate::abandoned::close_abandoned`]: a take-over,
    /// fenced, as the step's next call would make); answers the operations it ended. Not before
    /// one lease (this host's) has passed since the owner's ran out: an owner paused or slow to
    /// record its end is not fenced out for a step that a lookup could settle no sooner anyway.
    /// A claim found with nothing in doubt is read again once a lease has passed, or when it
    /// changes hands or renews.
    async fn end_abandoned(&mut self, abandoned: Vec<OperationRecord>, now: u64) -> Vec<OperationRecord> {
        let ledger = self.host.ledger().clone();
        let grace = u64::try_from(self.host.lease().as_millis()).unwrap_or(u64::MAX);
        let current: std::collections::HashSet<&str> = abandoned.iter().map(|op| op.key.as_str()).collect();
        self.left_abandoned.retain(|key, _| current.contains(key.as_str()));
        let mut ended = Vec::new();
        for op in &abandoned {
            let seen = (op.fence, op.lease_until_ms);
            let looked = self.left_abandoned.get(&op.key);
            if now < op.lease_until_ms.saturating_add(grace)
                || looked.is_some_and(|(at, then)| *then == seen && now < at.saturating_add(grace))
            {
                continue;
            }
            let then = if run_state::is_compensation(op) { ", then compensate again" } else { "" };
            let closer =
                crate::abandoned::Closer { owner: &self.jitter_domain, lease_ms: ABANDONED_LEASE_MS, why: None, then };
            match crate::abandoned::close_abandoned(&ledger, &closer, op).await {
                Ok(Some((status, why))) => {
                    tracing::warn!(
                        operation_key = %op.key, tool = %op.tool, status = status.as_str(), %why,
                        "a claim whose owner is gone held an effect in doubt: ended, for a reconcile or a person"
                    );
                    self.left_abandoned.remove(&op.key);
                    match ledger.operation(&op.key).await {
                        Ok(Some(now_unknown)) if now_unknown.status == OperationStatus::Unknown => {
                            ended.push(now_unknown)
                        }
                        _ => {}
                    }
                }
                Ok(None) => {
                    self.left_abandoned.insert(op.key.clone(), (now, seen));
                }
                Err(e) => tracing::warn!(
                    operation_key = %op.key, error = %e,
                    "could not end a claim whose owner is gone; tried again at the next reading"
                ),
            }
        }
        ended
    }

    /// Asks about what is due, soonest first, until `stop` resolves between two tries.
    async fn try_due(&mut self, mut stop: std::pin::Pin<&mut impl Future<Output = ()>>) -> Vec<Try> {
        let mut tries = Vec::new();
        for (key, tool) in self.schedule.due(self.host.ledger().now_ms(), MAX_TRIES_PER_PASS) {
            if stop.as_mut().now_or_never().is_some() {
                break;
            }
            let attempt = self.try_one(key, tool).await;
            for observer in &self.observers {
                observer(&attempt);
            }
            tries.push(attempt);
        }
        tries
    }

    async fn try_one(&mut self, key: String, tool: String) -> Try {
        // On a shared ledger one host at a time asks about an operation: the others see its lease
        // and look again later. (Two asking would both be safe, the settlement being a
        // compare-and-set, but the downstream would be asked twice.)
        let ledger = self.host.ledger().clone();
        let lease = format!("reconcile/{key}");
        let held =
            if ledger.is_shared() { ledger.lease(&lease, &self.jitter_domain, TRY_LEASE).await } else { Ok(true) };
        let answer = match held {
            Ok(true) => {
                let answer = self.host.reconcile_operation(&key).await;
                if ledger.is_shared()
                    && let Err(e) = ledger.release(&lease, &self.jitter_domain).await
                {
                    tracing::warn!(operation_key = %key, error = %e, "could not give up the reconcile lease; it runs out");
                }
                Some(answer)
            }
            Ok(false) => None,
            Err(e) => Some(Err(CallError::Ledger(e))),
        };
        let (result, counts_from_ms, reason) = match answer {
            None => (TryResult::HeldElsewhere, None, None),
            Some(answer) => match answer {
                Ok(Some(answer)) => match answer.answer {
                    Reconciliation::Committed { .. } => (TryResult::Committed, None, None),
                    Reconciliation::NotCommitted { .. } => (TryResult::NotCommitted, None, None),
                    Reconciliation::StillUnknown { reason, counts_from_ms, .. } => {
                        (TryResult::StillUnknown, counts_from_ms, Some(reason))
                    }
                    Reconciliation::NotUnknown { .. } => (TryResult::SettledElsewhere, None, None),
                },
                // No longer unknown (a call, a person or another host settled it), or gone.
                Ok(None) => (TryResult::SettledElsewhere, None, None),
                // The ledger's compare-and-set refused this settlement: another host's (or a
                // person's) came first, or the effect was sent again since this try read it. Either
                // way not this loop's failure; the next reading of the ledger says what is left.
                Err(CallError::Ledger(LedgerError::NotInDoubt { .. } | LedgerError::EffectChanged { .. })) => {
                    (TryResult::SettledElsewhere, None, None)
                }
                Err(e) => (TryResult::Error, None, Some(e.to_string())),
            },
        };
        let now = self.host.ledger().now_ms();
        let (next_try_ms, tries) = match result {
            TryResult::StillUnknown | TryResult::Error | TryResult::HeldElsewhere => {
                let tries = self.schedule.tries(&key);
                let jitter = crate::retry::jitter(&key, &self.jitter_domain, tries);
                match self.schedule.tried(&key, &self.settings, now, counts_from_ms, jitter) {
                    Some((due, tries)) => (Some(due), tries),
                    None => (None, tries.saturating_add(1)),
                }
            }
            _ => (None, self.schedule.settled(&key).unwrap_or(0).saturating_add(1)),
        };
        // Each try that left it unknown is recorded on the operation, for the run's timeline (one
        // that settled it is the operation's settlement). Not being able to write it stops nothing.
        if matches!(result, TryResult::StillUnknown | TryResult::Error) {
            let note = ReconcileNote { tries, last_ms: now, result: result.as_str().into(), reason: reason.clone() };
            if let Err(e) = ledger.note_reconcile(&key, &note).await {
                tracing::warn!(operation_key = %key, error = %e, "could not record the reconciler's try");
            }
        }
        let attempt = Try { operation_key: key, tool, result, tries, next_try_ms, reason };
        let next_in = next_try_ms.map(|at| Duration::from_millis(at.saturating_sub(now)));
        match attempt.result {
            TryResult::Error => tracing::warn!(
                operation_key = %attempt.operation_key, tool = %attempt.tool, tries, ?next_in,
                error = attempt.reason.as_deref().unwrap_or_default(), "reconciler: the try failed"
            ),
            result => tracing::info!(
                operation_key = %attempt.operation_key, tool = %attempt.tool, result = result.as_str(), tries,
                ?next_in, "reconciler: tried"
            ),
        }
        attempt
    }
}

/// Makes sure a person was told of every request for approval still pending, from the index of
/// open work: a reading of it (O(open)), and each pending request read once per reconciler
/// (`told`, kept to those still pending). The notification's key is the request's, so one that its call enqueued is not
/// enqueued again (`Ledger::enqueue_once`).
async fn tell_pending(
    ledger: &crate::ledger::Ledger,
    notifier: &crate::notify::Notifier,
    told: &mut std::collections::HashSet<String>,
    now_ms: u64,
) -> Result<(), LedgerError> {
    let pending: std::collections::HashSet<String> = ledger
        .open_runs(None, now_ms)
        .await?
        .into_values()
        .flatten()
        .filter(|open| matches!(open.why, Why::AwaitingApproval { standing: ApprovalStanding::Pending }))
        .map(|open| open.operation_key)
        .collect();
    told.retain(|key| pending.contains(key));
    for key in pending {
        if told.contains(&key) {
            continue;
        }
        let Some(request) = ledger.approval(&key).await? else { continue };
        match notifier.notice(crate::notify::Event::ApprovalRequested(&request)).await {
            Ok(_) => {
                told.insert(key);
            }
            Err(e) => {
                tracing::warn!(operation_key = %key, error = %e, "could not enqueue a notification; tried again at the next reading")
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_are_labelled_for_metrics() {
        let labels: Vec<&str> = [
            TryResult::Committed,
            TryResult::NotCommitted,
            TryResult::StillUnknown,
            TryResult::SettledElsewhere,
            TryResult::Error,
        ]
        .into_iter()
        .map(TryResult::as_str)
        .collect();
        assert_eq!(labels, ["committed", "not-committed", "still-unknown", "settled-elsewhere", "error"]);
        let json = serde_json::to_value(TryResult::SettledElsewhere).expect("json");
        assert_eq!(json, "settled-elsewhere");
    }
}
