//! Telling a person: what is noticed, when, and what the notification says. An approval asked
//! for, an unknown the background reconciler has not settled within `[notify] unknown_after`, a
//! compensation that cannot go on: each is an event with a key of its own, enqueued on each
//! `[notify]` URL's outbox topic with [`Ledger::enqueue_once`], so that noticing it again (the
//! next call that meets the same request, the reconciler's next reading, a restart, another host)
//! enqueues nothing more. The outbox relay delivers it, signed (`oncebox_core::notice`), with the
//! event's key as `Idempotency-Key`, retried until a 2xx, and kept in the ledger meanwhile.
//!
//! A notification carries names, keys, times and a link to the console page, never args, an
//! answer or an error's text: a sensitive value has no way into it. Whoever follows the link sees
//! what the console shows them (the exact params only with the operator's token).

use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{Value, json};

use crate::clock::rfc3339;
use crate::ledger::{ApprovalRecord, Ledger, LedgerError, OperationRecord, run_state};
use crate::saga::{SagaReport, SagaState};

/// What a person is told about.
#[derive(Debug, Clone, Copy)]
pub enum Event<'a> {
    /// A call waits for a person's approval of its exact params.
    ApprovalRequested(&'a ApprovalRecord),
    /// An operation's outcome is unknown and nothing has settled it for `unknown_after`.
    Unknown(&'a OperationRecord),
    /// A run's compensation cannot go on (a step is open, or a compensation did not complete).
    CompensationStuck(&'a SagaReport),
}

impl Event<'_> {
    /// The event's key: the same whenever the same event is noticed, another for another.
    fn key(&self) -> String {
        match self {
            Event::ApprovalRequested(r) => format!("approval-requested/{}/{}", r.operation_key, r.requested_ms),
            Event::Unknown(op) => format!("unknown/{}/{}", op.key, op.updated_ms),
            Event::CompensationStuck(report) => {
                let mut keys: Vec<&str> = report.steps.iter().map(|s| s.operation_key.as_str()).collect();
                keys.sort_unstable();
                let steps = hex::encode(&<sha2::Sha256 as sha2::Digest>::digest(keys.join("\n"))[..8]);
                format!("compensation-{}/{}/{steps}", state(report.state), report.run_id)
            }
        }
    }

    /// The notification's JSON: names, keys, times and the console's link only.
    fn body(&self, key: &str, console: &str, now_ms: u64) -> Value {
        let base = json!({ "id": key, "at": rfc3339(now_ms) });
        let event = match self {
            Event::ApprovalRequested(r) => json!({
                "event": "approval-requested",
                "run_id": r.run_id, "step_id": r.step_id, "tool": r.tool, "operation_key": r.operation_key,
                "requested_at": rfc3339(r.requested_ms),
                "link": format!("{console}{}", crate::pages::approval(&r.operation_key)),
            }),
            Event::Unknown(op) => json!({
                "event": "unknown",
                "run_id": op.run_id, "step_id": op.step_id, "tool": op.tool, "operation_key": op.key,
                "unknown_since": rfc3339(op.updated_ms),
                "link": format!("{console}{}", crate::pages::UNKNOWNS),
            }),
            Event::CompensationStuck(report) => json!({
                "event": "compensation-blocked",
                "run_id": report.run_id,
                "state": state(report.state),
                "steps": report.steps.iter()
                    .filter(|s| !matches!(s.action, "compensated" | "kept" | "abandoned"))
                    .map(|s| json!({ "step_id": s.step_id, "tool": s.tool, "operation_key": s.operation_key, "action": s.action }))
                    .collect::<Vec<_>>(),
                "link": format!("{console}{}", crate::pages::run(&report.run_id)),
            }),
        };
        let mut body = base;
        if let (Some(body), Value::Object(event)) = (body.as_object_mut(), event) {
            body.extend(event);
        }
        body
    }
}

/// What an event's key names ([`Event::key`] read back): the records from which the same event
/// can be noticed again.
#[derive(Debug, PartialEq, Eq)]
enum Subject<'k> {
    /// An approval asked for, an unknown: noticed from the operation's request or record.
    Operation(&'k str),
    /// A compensation that cannot go on: noticed from the run's records. `outstanding`: its
    /// state was (a compensation did not complete), rather than blocked or awaiting approval.
    Run { run: &'k str, outstanding: bool },
}

impl<'k> Subject<'k> {
    /// The subject of event key `key`, or `None` for a key no [`Event`] makes (an outbox
    /// effect's key: a hash, without a `/`).
    fn of(key: &'k str) -> Option<Subject<'k>> {
        let operation = |rest: &'k str| rest.rsplit_once('/').map(|(op, _)| Subject::Operation(op));
        if let Some(rest) = key.strip_prefix("approval-requested/") {
            return operation(rest);
        }
        if let Some(rest) = key.strip_prefix("unknown/") {
            return operation(rest);
        }
        let (state_of, rest) = key.strip_prefix("compensation-")?.split_once('/')?;
        let outstanding = state_of == state(SagaState::Outstanding);
        rest.rsplit_once('/').map(|(run, _steps)| Subject::Run { run, outstanding })
    }
}

/// Whether the event whose notice key is `key` may still be noticed, so that its key must stay
/// in the ledger: removing it lets a host that notices the same event again enqueue it again,
/// where [`Ledger::enqueue_once`] promises once, whenever. Retention asks it before it removes a
/// delivered notification with its key (`retention::gc`). An event is noticed from records: an
/// approval asked for from its request (a request asked again has another time, so another key),
/// an unknown from its operation's record; a compensation that cannot go on from its run's
/// records and tombstones (its steps' keys name the event). So: yes while the operation's record
/// or request is in the ledger, or the run has an operation or is open, or retention removed a
/// completed compensatable step of it that nothing undid and the key is of an outstanding
/// compensation (the saga names that step for a person every time it is asked, and answers
/// outstanding: `saga/removed.rs`, by `run_state::undoable_removed`); once they are
/// gone, nothing can notice the event again. A key no event makes (an outbox effect's message,
/// whose once is its effect record's): no. O(1) reads, O(the run's operations and tombstones)
/// for a run.
pub async fn may_be_noticed_again(ledger: &Ledger, key: &str, now_ms: u64) -> Result<bool, LedgerError> {
    match Subject::of(key) {
        None => Ok(false),
        Some(Subject::Operation(op)) => {
            Ok(ledger.operation(op).await?.is_some() || ledger.approval(op).await?.is_some())
        }
        Some(Subject::Run { run, outstanding }) => {
            let ops = ledger.operations(Some(run)).await?;
            if !ops.is_empty() || !ledger.open_runs(Some(run), now_ms).await?.is_empty() {
                return Ok(true);
            }
            // From tombstones alone a compensation can only be outstanding (`saga/removed.rs`): a
            // key of another state is never made again.
            if !outstanding {
                return Ok(false);
            }
            let removed = ledger.tombstones(run).await?;
            Ok(removed.iter().any(|stone| {
                run_state::undoable_removed(stone)
                    && run_state::undone_by(&stone.operation_key, &ops, &removed).is_none()
            }))
        }
    }
}

fn state(state: SagaState) -> &'static str {
    match state {
        SagaState::Done => "done",
        SagaState::Blocked => "blocked",
        SagaState::AwaitingApproval => "awaiting-approval",
        SagaState::Outstanding => "outstanding",
    }
}

/// Notices events and enqueues their notifications: one per host, from the policy file's
/// `[notify]`.
#[derive(Debug)]
pub struct Notifier {
    ledger: Ledger,
    topics: Vec<String>,
    unknown_after: Duration,
    /// The console's address for the links: the policy file's, or the server's, set when it starts.
    console: OnceLock<String>,
}

impl Notifier {
    pub(crate) fn new(ledger: Ledger, settings: &oncebox_core::policy_file::notify::Settings) -> Notifier {
        let console = OnceLock::new();
        if let Some(url) = &settings.console_url {
            let _ = console.set(url.as_str().trim_end_matches('/').to_string());
        }
        Notifier {
            ledger,
            topics: settings.topics().into_iter().map(|(topic, _)| topic).collect(),
            unknown_after: settings.unknown_after,
            console,
        }
    }

    /// Where the console's links point, unless the policy file said (the first call wins).
    pub fn console_at(&self, base_url: &str) {
        let _ = self.console.set(base_url.trim_end_matches('/').to_string());
    }

    /// Whether an unknown operation has waited long enough for a person, at `now_ms`.
    pub fn left_for_a_person(&self, op: &OperationRecord, now_ms: u64) -> bool {
        now_ms.saturating_sub(op.updated_ms) >= crate::clock::millis(self.unknown_after)
    }

    /// Enqueues `event`'s notification on every URL's topic, unless it was enqueued before:
    /// true if it was enqueued now (on any). A failure is the caller's to log: a notification is
    /// never a reason to fail a call.
    pub async fn notice(&self, event: Event<'_>) -> Result<bool, LedgerError> {
        let key = event.key();
        let console = self.console.get().map_or("", String::as_str);
        let body = event.body(&key, console, self.ledger.now_ms()).to_string();
        let mut enqueued = false;
        for topic in &self.topics {
            enqueued |= self.ledger.enqueue_once(topic, &key, &body).await?;
        }
        if enqueued {
            tracing::info!(notification = %key, "a person is notified");
        }
        Ok(enqueued)
    }

    /// [`Notifier::notice`], its failure logged.
    pub(crate) async fn notice_logged(&self, event: Event<'_>) {
        if let Err(e) = self.notice(event).await {
            tracing::warn!(error = %e, "could not enqueue a notification; it is enqueued when the event is noticed again");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{ApprovalState, OperationStatus};
    use crate::saga::SagaStep;

    /// Every key an event makes names its subject back, whatever the ids hold (a run id may hold
    /// `/`); an outbox effect's key names none.
    #[test]
    fn an_events_key_names_the_records_it_is_noticed_from() {
        let op: OperationRecord = serde_json::from_value(serde_json::json!({
            "key": "0123abcd", "run_id": "r/1", "step_id": "s", "tool": "t", "fingerprint": "f",
            "status": "unknown", "attempts": 1, "owner": "h", "fence": 1, "lease_until_ms": 0,
            "created_ms": 1, "updated_ms": 77, "class": "irreversible", "args": null, "output": null, "error": null
        }))
        .expect("an operation");
        assert_eq!(op.status, OperationStatus::Unknown);
        let key = Event::Unknown(&op).key();
        assert_eq!(Subject::of(&key), Some(Subject::Operation("0123abcd")));
        let asked: ApprovalRecord = serde_json::from_value(serde_json::json!({
            "operation_key": "0123abcd", "fingerprint": "f", "run_id": "r/1", "step_id": "s", "tool": "t",
            "description": "", "consequence": null, "args": null, "requested_ms": 5, "state": "pending", "revision": 1
        }))
        .expect("a request");
        assert_eq!(asked.state, ApprovalState::Pending);
        let key = Event::ApprovalRequested(&asked).key();
        assert_eq!(Subject::of(&key), Some(Subject::Operation("0123abcd")));
        let report = SagaReport {
            run_id: "r/1/x".into(),
            state: SagaState::Blocked,
            steps: vec![SagaStep {
                step_id: "s".into(),
                tool: "t".into(),
                operation_key: "0123abcd".into(),
                action: "blocking",
                compensation: None,
                reason: None,
                approve: None,
                console: None,
            }],
        };
        let key = Event::CompensationStuck(&report).key();
        assert_eq!(Subject::of(&key), Some(Subject::Run { run: "r/1/x", outstanding: false }));
        let outstanding = SagaReport { state: SagaState::Outstanding, ..report };
        let key = Event::CompensationStuck(&outstanding).key();
        assert_eq!(Subject::of(&key), Some(Subject::Run { run: "r/1/x", outstanding: true }));
        let effect = oncebox_core::keys::effect_key("0123abcd", "send", 0);
        assert_eq!(Subject::of(&effect), None);
    }
}
