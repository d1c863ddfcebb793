//! A person's word that they undid a step by hand (`oncebox undone-by-hand`): what closes a step
//! the saga names `undo-by-hand` (its compensation failed or was rejected, or its record expired
//! before the run was undone), and any step whose compensation has not begun, which a person
//! chose to undo by other means.
//!
//! The word is recorded as a completed operation of the step's compensation, run by no tool
//! ([`BY_HAND`]), with who and why: every rule that asks whether a step is undone counts it (the
//! saga answers the step `compensated` and goes on, the run closes once nothing else keeps it
//! open, retention leaves a tombstone that still counts), and nothing is dispatched. Whether a
//! word may be recorded, and where, is the ledger's rule ([`run_state::by_hand`]): never while the
//! step's compensation is unknown, in progress or awaiting a decision, as it may undo the step
//! too; at the compensation's own key when nothing of it exists, so that the claim decides
//! between the word and a compensation begun at the same moment. A second word is answered from
//! the first.

use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};

use crate::abandoned::{Closer, close_abandoned};
use crate::clock::rfc3339 as time;
use crate::error::CallError;
use crate::keys::{BY_HAND, FingerprintKey, canonical_json, operation_key, undone_by_hand_key};
use crate::ledger::run_state::{self, ByHand, Undone};
use crate::ledger::{AttemptRecord, AttemptSource, Claim, ClaimRequest, Ledger, OperationRecord, OperationStatus};
use crate::policy::ReplayClass;

/// How long the word's claim is held: it is recorded at once, so a longer one only delays the
/// next word after a crash between the claim and its record.
const LEASE_MS: u64 = 30_000;

/// How long a word waits for the same word, said by someone else at the same moment, to be
/// recorded, and is then answered from it.
const WORD_WAIT: Duration = Duration::from_secs(2);

/// A person's word that they undid a step by hand, as recorded.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UndoneByHand {
    pub run_id: String,
    /// The undone step, its tool and its operation's key.
    pub step_id: String,
    pub tool: String,
    pub operation_key: String,
    /// The key of the word's own record (an operation of the step's compensation).
    pub recorded_as: String,
    /// Who undid it and why, as they said (`None` when that record expired: its tombstone keeps
    /// only that the step was undone).
    pub by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    pub at_ms: u64,
    /// `false`: a word was on record already, and this answer is that word (nothing written).
    pub recorded: bool,
}

/// Records that `by` undid step `operation_key` by hand (`note`: why, how), or answers the word
/// already on record. Refused, with what to do instead, when the step is not one a compensation
/// would undo, is undone already by its compensation, or its compensation may still undo it.
/// `keying`: the ledger's key, which masks in `note` any value the step sealed.
pub async fn undone_by_hand(
    ledger: &Ledger,
    keying: &FingerprintKey,
    operation_key: &str,
    by: &str,
    note: Option<&str>,
) -> Result<UndoneByHand, CallError> {
    let refused = |reason: String| CallError::ByHand { operation_key: operation_key.into(), reason };
    if by.trim().is_empty() {
        return Err(refused("say who undid it (--by NAME)".into()));
    }
    let step = ledger.operation(operation_key).await?;
    let (run_id, step_id, tool) = match (&step, ledger.tombstone(operation_key).await?) {
        (Some(op), _) => (op.run_id.clone(), op.step_id.clone(), op.tool.clone()),
        (None, Some(stone)) => (stone.run_id, stone.step_id, stone.tool),
        (None, None) => return Err(refused(format!("no operation {operation_key} in the ledger"))),
    };
    let compensation = run_state::compensation_step_of(operation_key);
    // An abandoned claim of the step's compensation is ended first (once), then the rule asked
    // again on what that left.
    let mut ended_abandoned = false;
    let (key, ops) = loop {
        // Claims in flight first, then the records: a compensation claimed before this look is
        // seen by it, in flight or recorded (as the saga reads them).
        let in_flight = ledger.in_flight(Some(&run_id)).await?;
        let ops = ledger.operations(Some(&run_id)).await?;
        let approvals = ledger.approvals(Some(&run_id)).await?;
        let removed = ledger.tombstones(&run_id).await?;
        let abandoned = match run_state::by_hand(operation_key, &ops, &in_flight, &approvals, &removed, ledger.now_ms())
        {
            Ok(ByHand::Said(undone)) => return Ok(said(undone, operation_key, &step_id, &tool, &run_id)),
            Ok(ByHand::InPlace) => break (operation_key_of_compensation(&run_id, operation_key), ops),
            Ok(ByHand::Beside) => break (undone_by_hand_key(&run_id, operation_key), ops),
            Ok(ByHand::EndAbandoned(_)) if ended_abandoned => {
                return Err(refused("its compensation's record changed meanwhile: look again".into()));
            }
            Ok(ByHand::EndAbandoned(claim)) => claim.clone(),
            Err(why) => return Err(refused(why.to_string())),
        };
        ended_abandoned = true;
        let why = format!("a person's word that they undid step `{step_id}` by hand, so that no compensate resumes it");
        let closer = Closer { owner: BY_HAND, lease_ms: LEASE_MS, why: Some(&why), then: ", then compensate again" };
        match close_abandoned(ledger, &closer, &abandoned).await? {
            Some((OperationStatus::Failed, _)) => continue,
            Some((_, why)) => {
                return Err(refused(format!(
                    "its compensation `{}` (operation {}) was left by its owner, and may have undone the step: {why}",
                    abandoned.tool, abandoned.key
                )));
            }
            // Ended or taken over by another caller meanwhile: looked at again (once).
            None => continue,
        }
    };
    // What a person typed is masked like any answer, by the values the step sealed, and those its
    // run's other records sealed (its compensation's args carry the step's, and outlive its record).
    let secrets: Vec<String> =
        step.iter().chain(&ops).flat_map(|op| crate::reconcile::recorded_secrets(keying, op)).collect();
    let by = mask(by, &secrets);
    let note = note.map(|n| mask(n, &secrets));
    let by = by.as_str();
    let args = json!({ "undoes": operation_key, "by": by, "note": note });
    // The word's identity is the step it undoes, not who said it: a second word is the first.
    let identity = canonical_json(&json!({ "undoes": operation_key }));
    let now = ledger.now_ms();
    let request = ClaimRequest {
        key: key.clone(),
        run_id: run_id.clone(),
        step_id: compensation,
        tool: BY_HAND.into(),
        class: ReplayClass::IdempotentWrite,
        fingerprint: keying.fingerprint(BY_HAND, &identity),
        older_fingerprints: keying.older_fingerprints(BY_HAND, &identity),
        args: args.clone(),
        sealed: None,
        owner: format!("{BY_HAND} ({by})"),
        now_ms: now,
        lease_ms: LEASE_MS,
        approval: None,
    };
    // A word said by two people at once is recorded once: the second waits for the first's record
    // (a moment: it is written right after its claim) and is answered from it.
    let patience = Instant::now() + WORD_WAIT;
    let (fence, previous_attempts) = loop {
        let mut request = request.clone();
        request.now_ms = ledger.now_ms();
        match ledger.claim(&request).await? {
            Claim::Owned { fence, previous_attempts } => break (fence, previous_attempts),
            Claim::Recorded(op) if op.tool == BY_HAND && op.status == OperationStatus::Completed => {
                return Ok(said(Undone::Recorded(&op), operation_key, &step_id, &tool, &run_id));
            }
            Claim::InProgress(op) if op.tool == BY_HAND && Instant::now() < patience => {
                let lease = Duration::from_millis(op.lease_until_ms.saturating_sub(request.now_ms).max(1));
                ledger.changed(&key, patience.saturating_duration_since(Instant::now()).min(lease)).await;
            }
            // Another word, left claimed by a crash between its two writes (or slower than the
            // wait): the same word again, once its claim's lease ends, records it.
            Claim::InProgress(op) if op.tool == BY_HAND => {
                return Err(refused(format!(
                    "a word that it was undone by hand is being recorded ({}, until {}): look again then, and if it \
                     is not on record, say it again",
                    op.owner,
                    time(op.lease_until_ms)
                )));
            }
            Claim::Recorded(op) | Claim::Conflict(op) | Claim::InProgress(op) => {
                return Err(refused(format!(
                    "its compensation `{}` (operation {}) began meanwhile and is {}: look again once it ends",
                    op.tool,
                    op.key,
                    op.status.as_str()
                )));
            }
            Claim::Expired(_) | Claim::ApprovalChanged => {
                return Err(refused("its compensation's record changed meanwhile: look again".into()));
            }
        }
    };
    let message = match &note {
        Some(note) => format!("undone by hand by {by}: {note}"),
        None => format!("undone by hand by {by}"),
    };
    let attempt = previous_attempts + 1;
    let record = AttemptRecord {
        operation_key: key.clone(),
        run_id: run_id.clone(),
        step_id: request.step_id.clone(),
        tool: BY_HAND.into(),
        attempt,
        max_attempts: attempt,
        fence,
        started_ms: now,
        duration_us: 0,
        outcome: "ok".into(),
        message: Some(message),
        source: AttemptSource::Fresh,
        downstream_accepted: None,
        effects: Vec::new(),
    };
    let finish = (OperationStatus::Completed, Some(args.to_string()), None);
    ledger.record_attempt(fence, &record, Some(finish), ledger.now_ms(), Vec::new()).await?;
    tracing::info!(%operation_key, recorded_as = %key, by, "undone by hand");
    let (by, at_ms) = (Some(by.to_string()), now);
    Ok(UndoneByHand {
        run_id,
        step_id,
        tool,
        operation_key: operation_key.into(),
        recorded_as: key,
        by,
        note,
        at_ms,
        recorded: true,
    })
}

/// `text` with every one of `secrets` masked.
fn mask(text: &str, secrets: &[String]) -> String {
    crate::redact::mask_text(text, secrets).unwrap_or_else(|| text.to_string())
}

/// The key of the compensation of `operation_key`: the step's, whatever tool undoes it.
fn operation_key_of_compensation(run_id: &str, undone: &str) -> String {
    operation_key(run_id, &run_state::compensation_step_of(undone), BY_HAND)
}

/// The word on record, as [`undone_by_hand`] answers it.
fn said(undone: Undone<'_>, operation_key: &str, step_id: &str, tool: &str, run_id: &str) -> UndoneByHand {
    let (by, note, at_ms) = match undone {
        Undone::Recorded(op) => {
            let (by, note) = who(op);
            (by, note, op.updated_ms)
        }
        Undone::Removed(stone) => (None, None, stone.ended_ms),
    };
    UndoneByHand {
        run_id: run_id.into(),
        step_id: step_id.into(),
        tool: tool.into(),
        operation_key: operation_key.into(),
        recorded_as: undone.key().into(),
        by,
        note,
        at_ms,
        recorded: false,
    }
}

/// Who said a word on record, and why.
fn who(op: &OperationRecord) -> (Option<String>, Option<String>) {
    let text = |field: &str| op.args.get(field).and_then(Value::as_str).map(str::to_string);
    (text("by"), text("note"))
}

/// How the saga reports a step a person's word undid (`op`: the word's record).
pub(super) fn reason(op: &OperationRecord) -> Option<String> {
    (op.tool == BY_HAND).then(|| {
        let (by, note) = who(op);
        let by = by.unwrap_or_else(|| "a person".into());
        let note = note.map(|n| format!(": {n}")).unwrap_or_default();
        format!("undone by hand by {by} at {}{note}", time(op.updated_ms))
    })
}

/// What a step named `undo-by-hand` asks of a person besides the undo: to say so, with the
/// command that records it (on the ledger at `path`).
pub(super) fn ask(step: &mut super::SagaStep, path: &str) {
    let say = format!("once undone, say so: {}", command(path, &step.operation_key));
    step.reason = Some(match step.reason.take() {
        Some(why) => format!("{why}; {say}"),
        None => say,
    });
}

/// The command that records a person's word that they undid step `operation_key` by hand, on the
/// ledger at `path`.
pub(crate) fn command(path: &str, operation_key: &str) -> String {
    format!("oncebox undone-by-hand --ledger {path} {operation_key} --by NAME")
}

/// What comes next for a claim, in run `run_id`, of a person's word (`open`, abandoned: a crash between its two
/// writes) or of a compensation whose owner is gone, beside what the next call of its step does.
pub(crate) fn next_for_abandoned(open: &crate::ledger::Open, run_id: &str, path: &str) -> Option<String> {
    let undone = open.step_id.strip_prefix(crate::keys::COMPENSATION_PREFIX)?;
    Some(match open.tool == BY_HAND {
        true => format!(
            "a person's word that they undid step {undone} by hand was being recorded and did not finish: say it \
             again ({})",
            command(path, undone)
        ),
        false => format!(
            "`oncebox compensate --ledger {path} --run {} --tools DIR` resumes it; or, if a person undid the step \
             by hand, `{}` ends it (failed, when nothing of it took effect) and records that",
            run_id,
            command(path, undone)
        ),
    })
}
