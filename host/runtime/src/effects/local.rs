//! KV and outbox effects: the write and its record commit in one transaction, so they happen
//! exactly once by construction and need no write-ahead. They are staged in the attempt's context
//! and committed with its next durable write, so a call whose effects are all local costs one commit.

use crate::ledger::{EffectRecord, EffectSource, EffectStatus, LocalOutcome, LocalWrite};
use crate::runtime::bindings::ToolError;

use super::EffectCtx;
use super::guard::host_error;

impl EffectCtx {
    /// Stages a local write; `Ok(false)`: a versioned KV write whose key has moved on since the
    /// guest read it (nothing staged, and the label's occurrence not used up, so the guest can
    /// read again and retry under the same key).
    pub(super) async fn local_effect(&mut self, label: String, write: LocalWrite) -> Result<bool, ToolError> {
        let (key, occurrence) = self.peek_key(&label)?;
        let scope = self.scope()?.clone();
        let (kind, target, fingerprint) = match &write {
            LocalWrite::KvSet { namespace, key, value, .. } => (
                "kv-set",
                namespace.clone(),
                self.shared.keying.effect_fingerprint("kv-set", &[namespace.as_bytes(), key.as_bytes(), value]),
            ),
            LocalWrite::KvDelete { namespace, key } => (
                "kv-delete",
                namespace.clone(),
                self.shared.keying.effect_fingerprint("kv-delete", &[namespace.as_bytes(), key.as_bytes()]),
            ),
            LocalWrite::Outbox { topic, payload } => (
                "outbox",
                topic.clone(),
                self.shared.keying.effect_fingerprint("outbox", &[topic.as_bytes(), payload.as_bytes()]),
            ),
        };
        let now = self.shared.ledger.now_ms();
        let record = EffectRecord {
            key,
            operation_key: scope.journal.operation_key().to_string(),
            label,
            occurrence,
            kind: kind.to_string(),
            target,
            fingerprint,
            status: EffectStatus::Completed,
            response: None,
            sealed: None,
            error: None,
            dispatches: 1,
            first_dispatched_ms: now,
            last_dispatched_ms: now,
            updated_ms: now,
            resolution: None,
            attempt: scope.attempt,
        };
        // Checked now, so the tool hears of a divergence at the call that diverged; checked again
        // when the staged write commits.
        let state = if scope.first {
            LocalOutcome::Applied
        } else {
            scope.journal.local_state(&record).await.map_err(host_error)?
        };
        match state {
            LocalOutcome::Applied => {
                if !scope.first {
                    let (label, key) = (record.label.clone(), record.key.clone());
                    self.diverged(&scope, &label, &key, &record.kind, &record.fingerprint, false).await?;
                }
                if let LocalWrite::KvSet { namespace, key, expected: Some(expected), .. } = &write {
                    // Checked against the committed state now, and again when the write commits.
                    let current = self.shared.ledger.kv_version(namespace, key).await.map_err(host_error)?;
                    if current != *expected {
                        return Ok(false);
                    }
                }
                self.advance(&record.label);
                self.note(&record, EffectSource::Fresh, None);
                self.staged.push((record, write));
            }
            LocalOutcome::AlreadyApplied => {
                self.advance(&record.label);
                self.note(&record, EffectSource::Deduplicated, None);
            }
            LocalOutcome::Diverged(recorded) => {
                return Err(ToolError::Permanent(format!(
                    "effect `{}` #{occurrence} asks for something other than what was recorded for its key {}; \
                     the tool diverged from its first run, nothing was written",
                    recorded.label, recorded.key
                )));
            }
        }
        Ok(true)
    }
}
