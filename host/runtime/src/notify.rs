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
use crate::ledger::{ApprovalRecord, Ledger, LedgerError, OperationRecord};
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
                "link": format!("{console}/console/approvals/{}", r.operation_key),
            }),
            Event::Unknown(op) => json!({
                "event": "unknown",
                "run_id": op.run_id, "step_id": op.step_id, "tool": op.tool, "operation_key": op.key,
                "unknown_since": rfc3339(op.updated_ms),
                "link": format!("{console}/console/unknowns"),
            }),
            Event::CompensationStuck(report) => json!({
                "event": "compensation-blocked",
                "run_id": report.run_id,
                "state": state(report.state),
                "steps": report.steps.iter()
                    .filter(|s| !matches!(s.action, "compensated" | "kept" | "abandoned"))
                    .map(|s| json!({ "step_id": s.step_id, "tool": s.tool, "operation_key": s.operation_key, "action": s.action }))
                    .collect::<Vec<_>>(),
                "link": format!("{console}/console/runs/{}", report.run_id),
            }),
        };
        let mut body = base;
        if let (Some(body), Value::Object(event)) = (body.as_object_mut(), event) {
            body.extend(event);
        }
        body
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
