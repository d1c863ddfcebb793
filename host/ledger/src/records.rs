//! What the ledger stores. Plain data: serde structs, no behaviour beyond small predicates.

use serde::{Deserialize, Serialize};

use oncebox_core::policy::ReplayClass;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OperationStatus {
    /// An attempt owns it (see `owner`, `lease_until_ms`, `fence`).
    Claimed,
    Completed,
    Failed,
    /// An effect may have committed and nobody knows: reconcile before anything else.
    Unknown,
}

impl OperationStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            OperationStatus::Claimed => "claimed",
            OperationStatus::Completed => "completed",
            OperationStatus::Failed => "failed",
            OperationStatus::Unknown => "unknown",
        }
    }
}

/// How a call ended, as recorded: the error class and a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorRecord {
    /// `transient`, `rate-limited`, `permanent`, `unknown-outcome`, `trap`, `deadline`, ...
    pub class: String,
    pub message: String,
}

/// One operation: one tool run for one step of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperationRecord {
    pub key: String,
    pub run_id: String,
    pub step_id: String,
    pub tool: String,
    pub class: ReplayClass,
    pub fingerprint: String,
    /// The args with the manifest's sensitive values redacted.
    pub args: serde_json::Value,
    /// Those sensitive values, sealed under the ledger's key for this operation
    /// (`seal::seal_params`): what lets the host mask them where they come back after the call (a
    /// reconcile's answer from the record), never shown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed: Option<String>,
    pub status: OperationStatus,
    pub owner: String,
    pub lease_until_ms: u64,
    /// Raised by every claim and takeover; a write carrying an older token is refused.
    pub fence: u64,
    pub attempts: u32,
    /// The tool's output, JSON text.
    pub output: Option<String>,
    pub error: Option<ErrorRecord>,
    pub created_ms: u64,
    pub updated_ms: u64,
    /// What the background reconciler found the last time it asked, while the operation was
    /// unknown (`Store::note_reconcile`); kept after it settles, as its history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconciled: Option<ReconcileNote>,
}

/// The background reconciler's tries of an unknown operation: how many, and the last one's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconcileNote {
    pub tries: u32,
    pub last_ms: u64,
    /// `still-unknown` or `error` (an answer that settled it is the operation's settlement).
    pub result: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EffectStatus {
    /// Written ahead of dispatch; no answer yet. After a crash this means `Unknown`.
    Dispatched,
    /// Taken: the downstream did it (or the local write committed); its answer is in `response`.
    Completed,
    /// The downstream answered definitively that it did not do it (a 4xx, a provider's refusal);
    /// the answer is in `response` and is replayed like any other.
    Refused,
    /// Proven not to have taken effect, every send of it (a refused connection, 429, a lookup's
    /// `not-committed` after the settle window, a person's word): may be sent again.
    Retryable,
    /// Sent, and the answer was lost.
    Unknown,
}

impl EffectStatus {
    /// The status as its record spells it (and a trace's effect span).
    pub fn as_str(self) -> &'static str {
        match self {
            EffectStatus::Dispatched => "dispatched",
            EffectStatus::Completed => "completed",
            EffectStatus::Refused => "refused",
            EffectStatus::Retryable => "retryable",
            EffectStatus::Unknown => "unknown",
        }
    }

    /// It may have taken place, and nobody knows.
    pub fn in_doubt(self) -> bool {
        matches!(self, EffectStatus::Dispatched | EffectStatus::Unknown)
    }

    /// A definitive answer is recorded (taken or refused): replayed, never dispatched again.
    pub fn answered(self) -> bool {
        matches!(self, EffectStatus::Completed | EffectStatus::Refused)
    }

    /// It took place: an operation holding one is not `failed`, whatever else went wrong.
    pub fn taken(self) -> bool {
        self == EffectStatus::Completed
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EffectRecord {
    pub key: String,
    pub operation_key: String,
    pub label: String,
    pub occurrence: u32,
    /// `http`, `kv-set`, `kv-delete`, `outbox`, `provider:NAME`
    pub kind: String,
    /// Where it went: `host:port` for HTTP, the provider's name, the KV namespace.
    pub target: String,
    pub fingerprint: String,
    pub status: EffectStatus,
    /// The recorded answer (JSON text), with every sensitive value of the operation's args masked
    /// (`seal::keep`): what any reader sees.
    pub response: Option<String>,
    /// The exact answer, sealed under the ledger's key for this operation, when `response` had a
    /// sensitive value masked: it is what the guest gets on a replay (`seal::exact`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed: Option<String>,
    pub error: Option<String>,
    pub dispatches: u32,
    pub first_dispatched_ms: u64,
    /// When it was last sent: the settle window of a `not-committed` answer runs from here.
    #[serde(default)]
    pub last_dispatched_ms: u64,
    pub updated_ms: u64,
    /// How it left doubt, when reconciliation or a person settled it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolution: Option<Settlement>,
    /// The number of the attempt that last wrote it (ahead of a send, or with a local write): one
    /// above the operation's recorded attempts means that attempt never recorded its end
    /// (`rules::unrecorded_sends`). 0 in records written before it was kept: then the recorded
    /// attempts that list it say whether it was the stopped attempt's.
    #[serde(default)]
    pub attempt: u32,
}

impl EffectRecord {
    /// When it was last sent (records written before `last_dispatched_ms` existed: the first).
    pub fn last_dispatch_ms(&self) -> u64 {
        self.last_dispatched_ms.max(self.first_dispatched_ms)
    }
}

/// Who settled an effect in doubt, how and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settlement {
    /// `committed` or `not-committed`.
    pub verdict: String,
    /// `reconcile` (the tool's authority) or the person's name.
    pub by: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    pub at_ms: u64,
}

/// Where an effect's answer came from in an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EffectSource {
    /// Dispatched for the first time.
    Fresh,
    /// Answered from the ledger without dispatch.
    Deduplicated,
    /// Sent again with the same key after an unknown or retryable outcome.
    Redispatched,
}

impl EffectSource {
    /// The source as its record spells it (and a trace's effect span).
    pub fn as_str(self) -> &'static str {
        match self {
            EffectSource::Fresh => "fresh",
            EffectSource::Deduplicated => "deduplicated",
            EffectSource::Redispatched => "redispatched",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptEffect {
    pub key: String,
    pub label: String,
    pub source: EffectSource,
    pub status: EffectStatus,
}

/// Where an attempt's effects came from, taken together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttemptSource {
    /// At least one effect went out (or the attempt had none).
    Fresh,
    /// Every effect was answered from the ledger.
    Deduplicated,
}

impl AttemptSource {
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptSource::Fresh => "fresh",
            AttemptSource::Deduplicated => "deduplicated",
        }
    }

    pub fn of(effects: &[AttemptEffect]) -> Self {
        if !effects.is_empty() && effects.iter().all(|e| e.source == EffectSource::Deduplicated) {
            AttemptSource::Deduplicated
        } else {
            AttemptSource::Fresh
        }
    }
}

/// One attempt of one operation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptRecord {
    pub operation_key: String,
    pub run_id: String,
    pub step_id: String,
    pub tool: String,
    pub attempt: u32,
    pub max_attempts: u32,
    pub fence: u64,
    pub started_ms: u64,
    pub duration_us: u64,
    /// `ok` or the failure class.
    pub outcome: String,
    pub message: Option<String>,
    pub source: AttemptSource,
    /// Whether every effect got a definitive answer; `None` when the attempt had no effect.
    pub downstream_accepted: Option<bool>,
    pub effects: Vec<AttemptEffect>,
}

/// A message enqueued by an `outbox` effect, or by the host itself (a notification, whose key is
/// the event's: [`OutboxMessage::notice`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutboxMessage {
    pub seq: u64,
    pub effect_key: String,
    pub topic: String,
    /// The payload as the tool sent it (JSON text when the tool used the SDK).
    pub payload: String,
    pub enqueued_ms: u64,
    /// What the relay made of it so far (records written before delivery existed: pending).
    #[serde(default)]
    pub delivery: Delivery,
}

impl OutboxMessage {
    /// The message an `outbox` effect enqueues as number `seq`, not delivered yet.
    pub fn enqueued(seq: u64, effect: &EffectRecord, topic: &str, payload: &str) -> Self {
        OutboxMessage {
            seq,
            effect_key: effect.key.clone(),
            topic: topic.to_string(),
            payload: payload.to_string(),
            enqueued_ms: effect.updated_ms,
            delivery: Delivery::default(),
        }
    }

    /// A message of the host's own (`Store::enqueue_once`) as number `seq`, under `key`.
    pub fn notice(seq: u64, key: &str, topic: &str, payload: &str, now_ms: u64) -> Self {
        OutboxMessage {
            seq,
            effect_key: key.to_string(),
            topic: topic.to_string(),
            payload: payload.to_string(),
            enqueued_ms: now_ms,
            delivery: Delivery::default(),
        }
    }
}

/// What reconciliation or a person established about an unknown operation's in-doubt effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// It took place; `output` (JSON) is the operation's result.
    Committed { output: String },
    /// It did not: the operation may run again, with the same keys.
    NotCommitted,
}

impl Resolution {
    pub fn verdict(&self) -> &'static str {
        match self {
            Resolution::Committed { .. } => "committed",
            Resolution::NotCommitted => "not-committed",
        }
    }
}

/// Where a request for approval stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ApprovalState {
    /// Asked for; nobody decided yet.
    Pending,
    /// A person approved these exact params (the fingerprint), until `expires_ms` if set.
    Approved,
    /// A person refused: the operation never dispatches.
    Rejected,
}

impl ApprovalState {
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalState::Pending => "pending",
            ApprovalState::Approved => "approved",
            ApprovalState::Rejected => "rejected",
        }
    }
}

/// Where a request for approval stands at a given moment, as people are shown it: its stored
/// state, except that an approval past its expiry is `expired`. Derived, never stored: expiry is a
/// matter of the clock, and an expired approval lets nothing through until a person approves
/// again (which `decide` allows: it is not a rejection).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ApprovalStanding {
    Pending,
    Approved,
    Expired,
    Rejected,
}

impl ApprovalStanding {
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalStanding::Pending => "pending",
            ApprovalStanding::Approved => "approved",
            ApprovalStanding::Expired => "expired",
            ApprovalStanding::Rejected => "rejected",
        }
    }
}

/// A call of a tool that needs a person's approval, and what they decided. Bound to one operation
/// (run, step, tool), one fingerprint (the exact params) and one component (the code that will
/// run them): an approval of other params, of another step or of other code approves nothing.
/// Used once: the operation it lets through is recorded, and every later call of the step is
/// answered from that record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRecord {
    pub operation_key: String,
    pub fingerprint: String,
    /// The digest of the component asked about (`sha256:HEX` of the component file's bytes, as
    /// the host loaded it when the request was recorded): only that code runs under the approval.
    /// Records written before requests named their component have none, and count as bound to
    /// no component at all, so they need a new approval: whoever approved them did not say which
    /// code, and assuming it was the code loaded now would let a replaced tool run unapproved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub component: Option<String>,
    pub run_id: String,
    pub step_id: String,
    pub tool: String,
    pub description: String,
    /// What cannot be taken back, in the tool's words.
    pub consequence: Option<String>,
    /// The params with their sensitive values redacted.
    pub args: serde_json::Value,
    /// The sensitive values, sealed under the ledger's key (`seal.rs`): the approver reveals them
    /// with the key file; the ledger and the logs never hold them in the clear.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed: Option<String>,
    pub requested_ms: u64,
    pub state: ApprovalState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// An approval not used by then lets nothing through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_ms: Option<u64>,
    /// Raised by every write: a write is a compare-and-set on the revision it read.
    pub revision: u32,
}

impl ApprovalRecord {
    /// Whether it lets a call with `fingerprint`, run by the component `component`, through at
    /// `now_ms`.
    pub fn approves(&self, fingerprint: &str, component: &str, now_ms: u64) -> bool {
        self.state == ApprovalState::Approved
            && self.fingerprint == fingerprint
            && self.binds(component)
            && !self.expired(now_ms)
    }

    /// Whether it is bound to the component with digest `component` (a record without a
    /// component is bound to none).
    pub fn binds(&self, component: &str) -> bool {
        self.component.as_deref() == Some(component)
    }

    /// Approved, but past its expiry.
    pub fn expired(&self, now_ms: u64) -> bool {
        self.state == ApprovalState::Approved && self.expires_ms.is_some_and(|until| now_ms >= until)
    }

    /// When it was last written to, as retention counts its age: asked (or asked again for a new
    /// component), decided, or, for an approval with an expiry, the end of it (it stands until
    /// then): the latest of the three. The one rule: gc asks it, every backend's index of
    /// requests by age is kept by it ([`Store::approvals_before`](crate::Store::approvals_before);
    /// PostgreSQL's expression index restates it in SQL, `postgres/schema.rs`, held equal to this
    /// by the conformance suite).
    pub fn last_written(&self) -> u64 {
        let decided = self.decided_ms.unwrap_or(self.requested_ms);
        decided.max(self.requested_ms).max(self.expires_ms.unwrap_or(0))
    }

    /// Where it stands at `now_ms`, as people are shown it ([`ApprovalStanding`]).
    pub fn standing(&self, now_ms: u64) -> ApprovalStanding {
        match self.state {
            ApprovalState::Pending => ApprovalStanding::Pending,
            ApprovalState::Approved if self.expired(now_ms) => ApprovalStanding::Expired,
            ApprovalState::Approved => ApprovalStanding::Approved,
            ApprovalState::Rejected => ApprovalStanding::Rejected,
        }
    }
}

/// What is left of an operation that retention removed: enough to refuse a call of its step
/// instead of running it as new (its downstream keys may have expired too).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tombstone {
    pub operation_key: String,
    pub run_id: String,
    pub step_id: String,
    pub tool: String,
    pub fingerprint: String,
    pub status: OperationStatus,
    /// When the operation was last written (its end), or its request rejected.
    pub ended_ms: u64,
    pub removed_ms: u64,
    /// What was removed was a rejected request for approval (no operation ever ran).
    #[serde(default)]
    pub rejected: bool,
    /// The removed operation's replay class, so that a compensation of its run knows a completed
    /// compensatable step it can no longer undo (`saga`). `None`: a rejected request, or a
    /// tombstone an older release left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<ReplayClass>,
}

impl Tombstone {
    /// What retention leaves of `op`, removed at `removed_ms`.
    pub fn of(op: &OperationRecord, removed_ms: u64) -> Tombstone {
        Tombstone {
            operation_key: op.key.clone(),
            run_id: op.run_id.clone(),
            step_id: op.step_id.clone(),
            tool: op.tool.clone(),
            fingerprint: op.fingerprint.clone(),
            status: op.status,
            ended_ms: op.updated_ms,
            removed_ms,
            rejected: false,
            class: Some(op.class),
        }
    }
}

/// What became of an outbox message on its way to its topic's endpoint. The relay records a
/// send's answer after it arrives, so a relay killed in between sends the message again: the
/// endpoint may see it twice (with the same `Idempotency-Key`), never not at all.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    /// Sends whose answer was recorded (a send cut off by a kill is not counted).
    pub attempts: u32,
    /// When the endpoint acknowledged it (a 2xx); `None` while it is pending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivered_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attempt_ms: Option<u64>,
    /// What the last send that did not deliver it observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// The endpoint's last answer refused it definitively (a 4xx): its topic stops here until
    /// someone fixes the endpoint or the message's consumer, because delivering a later message
    /// past it would reorder the topic.
    #[serde(default)]
    pub refused: bool,
}

impl Delivery {
    pub fn is_delivered(&self) -> bool {
        self.delivered_ms.is_some()
    }

    /// `delivered`, `refused` or `pending`, as `oncebox outbox list` prints it.
    pub fn state(&self) -> &'static str {
        match (self.is_delivered(), self.refused) {
            (true, _) => "delivered",
            (false, true) => "refused",
            (false, false) => "pending",
        }
    }

    /// The delivery with one more send's answer recorded. A delivered message stays as it was,
    /// whatever a later send says: the endpoint acknowledged it once, and that is final.
    pub fn after(&self, answer: &DeliveryAnswer) -> Delivery {
        let mut next = self.clone();
        if next.is_delivered() {
            return next;
        }
        next.attempts = next.attempts.saturating_add(1);
        match answer {
            DeliveryAnswer::Delivered { at_ms } => {
                next.last_attempt_ms = Some(*at_ms);
                next.delivered_ms = Some(*at_ms);
                next.refused = false;
            }
            DeliveryAnswer::NotDelivered { at_ms, error, refused } => {
                next.last_attempt_ms = Some(*at_ms);
                next.last_error = Some(error.clone());
                next.refused = *refused;
            }
        }
        next
    }
}

/// The answer to one send of an outbox message, as the relay records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveryAnswer {
    /// The endpoint acknowledged it (a 2xx) at `at_ms`.
    Delivered { at_ms: u64 },
    /// It was not acknowledged: `error` says what was seen; `refused` when the endpoint said no
    /// definitively (a 4xx), rather than failing in a way another send may get past.
    NotDelivered { at_ms: u64, error: String, refused: bool },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_effects_status_and_source_are_spelled_as_their_records_spell_them() {
        for status in [
            EffectStatus::Dispatched,
            EffectStatus::Completed,
            EffectStatus::Refused,
            EffectStatus::Retryable,
            EffectStatus::Unknown,
        ] {
            assert_eq!(serde_json::to_value(status).ok(), Some(status.as_str().into()));
        }
        for source in [EffectSource::Fresh, EffectSource::Deduplicated, EffectSource::Redispatched] {
            assert_eq!(serde_json::to_value(source).ok(), Some(source.as_str().into()));
        }
    }
}
