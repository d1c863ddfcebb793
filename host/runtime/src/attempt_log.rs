//! The attempt log: every attempt is one ledger record (written by the pipeline) and one
//! `tracing` event, emitted here with the same fields. Nothing secret reaches either: args are never
//! logged, keys are hashes, and messages are scrubbed of the manifest's sensitive values.

use crate::ledger::AttemptRecord;

/// Whether the downstream answered every effect definitively (`None` without effects).
pub fn downstream_accepted(record: &AttemptRecord) -> Option<bool> {
    (!record.effects.is_empty()).then(|| record.effects.iter().all(|e| e.status.answered()))
}

pub fn emit(record: &AttemptRecord) {
    let effect_keys: Vec<&str> = record.effects.iter().map(|e| e.key.as_str()).collect();
    tracing::info!(
        run = %record.run_id,
        step = %record.step_id,
        tool = %record.tool,
        operation_key = %record.operation_key,
        effect_keys = ?effect_keys,
        attempt = record.attempt,
        max_attempts = record.max_attempts,
        source = record.source.as_str(),
        downstream_accepted = record.downstream_accepted.map_or("no-effects", |a| if a { "yes" } else { "no" }),
        outcome = %record.outcome,
        duration_us = record.duration_us,
        error = record.message.as_deref().unwrap_or(""),
        "attempt"
    );
}

/// A call answered from the ledger: not an attempt, but worth a line.
pub fn replayed(run: &str, step: &str, tool: &str, operation_key: &str, status: &str) {
    tracing::info!(run, step, tool, operation_key, source = "replayed", status, "replayed from the ledger");
}
