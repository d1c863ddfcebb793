//! Approvals (DESIGN sections 4 and 6): an irreversible tool runs only with a person's approval
//! bound to its operation (run, step, tool) and its fingerprint (the exact params).
//!
//! The gate stands before the claim. An operation already on record (or removed by retention,
//! which leaves a tombstone) is answered from its record whatever anyone approved, so an approval
//! never authorises a second dispatch, least of all of an operation whose outcome is unknown. With nothing on record, the request for approval says
//! what happens next: none yet (it is recorded, pending, and the call returns
//! `awaiting-approval`), pending or expired (the same), rejected (the call returns `rejected`),
//! asked with other params (a conflict), or approved for these params (the call proceeds, once:
//! the operation it starts is recorded, and every later call of the step is answered from it).
//!
//! An approval binds the code that will run as well as the params: the request names the
//! component's digest (`LoadedTool::digest`), and a request pending, or approved and not used,
//! when the tool is replaced is superseded by a new pending request for the new component (a new
//! revision under the same operation key): the call says why, and a person approves again. The
//! store checks the digest once more with the claim (`ledger::approval_stands`).
//!
//! The approver must see what they approve, and some of it is sensitive (`fulfill`'s address).
//! The request holds the params redacted, as every record does, plus the sensitive values sealed
//! under the ledger's key file (`seal.rs`): `oncebox approvals show KEY --reveal`, run by someone
//! who can read the key file, shows them; the ledger file, its backups and the logs never hold
//! them in the clear. The fingerprint the approver names covers the exact values, sealed or not.

use serde_json::Value;

pub use crate::approval_view::ApprovalView;
use crate::call::Prepared;
use crate::call::{Outcome, Status};
use crate::clock::rfc3339 as time;
use crate::effects::Shared;
use crate::error::CallError;
use crate::ledger::{ApprovalRecord, ApprovalStanding, ApprovalState, Ledger, LedgerError};
use crate::runtime::LoadedTool;

/// How many times the gate reads the request again when another writer changed it between its
/// read and its write (another caller asking, a decision), before it tells the caller to call
/// again: each retry follows a write that succeeded, so it is bounded by how busy the step is.
const GATE_TRIES: usize = 4;

/// Why a call waits for a request nobody decided yet.
const ASK: &str = "a person must approve these exact params";

/// Tells a person (`[notify]`) that `record` waits for them.
async fn asked(shared: &Shared, record: &crate::ledger::ApprovalRecord) {
    if let Some(notifier) = &shared.notifier {
        notifier.notice_logged(crate::notify::Event::ApprovalRequested(record)).await;
    }
}

/// Whether a call may go on to its claim.
pub(crate) enum Gate {
    /// With the revision of the approval that lets it through (`None`: the step is on record or
    /// expired, and the claim answers from that).
    Proceed {
        revision: Option<u32>,
    },
    Stop(Outcome),
}

/// The gate for a call of a tool that needs approval (see the module's docs). `tool` is the
/// component the call will run.
pub(crate) async fn gate(
    shared: &Shared,
    tool: &LoadedTool,
    prepared: &Prepared,
    redacted: &Value,
) -> Result<Gate, CallError> {
    let ledger = &shared.ledger;
    let key = &prepared.operation_key;
    // On record, or expired (a tombstone): the claim answers from that, whatever anyone approved.
    if ledger.operation(key).await?.is_some() || ledger.tombstone(key).await?.is_some() {
        return Ok(Gate::Proceed { revision: None });
    }
    let now = ledger.now_ms();
    for _ in 0..GATE_TRIES {
        let Some(record) = ledger.approval(key).await? else {
            let record = request(shared, tool, prepared, redacted, now, 1)?;
            match ledger.put_approval(&record).await {
                Ok(()) => {
                    tracing::info!(operation_key = %key, tool = %tool.manifest.name, "awaiting approval");
                    asked(shared, &record).await;
                    return Ok(Gate::Stop(awaiting(&record, ledger, ASK)));
                }
                // Another caller asked at the same moment: decide on what it recorded.
                Err(LedgerError::ApprovalChanged { .. }) => continue,
                // The step was claimed meanwhile: the claim answers from its record.
                Err(LedgerError::ApprovalClosed { .. }) => return Ok(Gate::Proceed { revision: None }),
                Err(e) => return Err(e.into()),
            }
        };
        if !prepared.matches(&record.fingerprint) {
            let message = format!(
                "step `{}` of run `{}` was submitted for approval with other params (fingerprint {}); nothing was \
                 dispatched. An approval covers exact params: use a new step id for a new intent",
                record.step_id, record.run_id, record.fingerprint
            );
            return Ok(Gate::Stop(stopped(&record, Status::Conflict, "conflict", message, ledger)));
        }
        // A request for other code (the tool was replaced since it was asked, or it predates
        // requests naming their component), pending or approved and not used: nothing of it
        // stands for this code. A new request for this component supersedes it, and a person
        // approves again. (A rejection is final whatever the code: it is answered below.)
        if record.state != ApprovalState::Rejected && !record.binds(&tool.digest) {
            let why = superseded(&record, &tool.digest, now);
            let renewed = request(shared, tool, prepared, redacted, now, record.revision + 1)?;
            match ledger.put_approval(&renewed).await {
                Ok(()) => {
                    tracing::info!(
                        operation_key = %key,
                        tool = %tool.manifest.name,
                        was = record.component.as_deref().unwrap_or("none"),
                        now = %tool.digest,
                        "the component changed: awaiting approval again"
                    );
                    asked(shared, &renewed).await;
                    return Ok(Gate::Stop(awaiting(&renewed, ledger, &why)));
                }
                Err(LedgerError::ApprovalChanged { .. }) => continue,
                Err(LedgerError::ApprovalClosed { .. }) => return Ok(Gate::Proceed { revision: None }),
                Err(e) => return Err(e.into()),
            }
        }
        return Ok(match record.state {
            ApprovalState::Approved if !record.expired(now) => Gate::Proceed { revision: Some(record.revision) },
            ApprovalState::Approved => {
                let message =
                    format!("the approval expired at {}; approve again", time(record.expires_ms.unwrap_or(0)));
                Gate::Stop(awaiting(&record, ledger, &message))
            }
            ApprovalState::Pending => {
                // Noticed again: enqueues nothing if it was before, and what a crash right after
                // the request was written lost if not.
                asked(shared, &record).await;
                Gate::Stop(awaiting(&record, ledger, ASK))
            }
            ApprovalState::Rejected => {
                let message = format!(
                    "rejected by {} at {}{}; nothing was dispatched, and nothing will be for this step",
                    record.decided_by.as_deref().unwrap_or("?"),
                    time(record.decided_ms.unwrap_or(0)),
                    record.note.as_deref().map(|n| format!(" ({n})")).unwrap_or_default()
                );
                Gate::Stop(stopped(&record, Status::Rejected, "rejected", message, ledger))
            }
        });
    }
    let message = "its request for approval kept changing while the call was made; nothing was dispatched: call \
                   again"
        .to_string();
    Ok(Gate::Stop(Outcome::stopped(key, Status::AwaitingApproval, "awaiting-approval", message)))
}

/// Why a request for other code no longer stands (for the call's answer).
fn superseded(record: &ApprovalRecord, digest: &str, now: u64) -> String {
    let was = match record.standing(now) {
        ApprovalStanding::Approved | ApprovalStanding::Expired => format!(
            "since {} approved it at {}",
            record.decided_by.as_deref().unwrap_or("?"),
            time(record.decided_ms.unwrap_or(0))
        ),
        _ => format!("since the request at {}", time(record.requested_ms)),
    };
    match &record.component {
        Some(old) => format!(
            "the component of `{}` changed from {old} to {digest} {was}; an approval covers the code that runs as \
             well as the params, so nothing was dispatched: approve again, for the new component",
            record.tool
        ),
        None => format!(
            "the request was recorded before requests named their component, and the code that would run now is \
             {digest}; nothing was dispatched: approve again, for this component"
        ),
    }
}

/// A request for approval, revision `revision`, for `tool`'s component: the params redacted,
/// their sensitive values sealed.
fn request(
    shared: &Shared,
    tool: &LoadedTool,
    prepared: &Prepared,
    redacted: &Value,
    now: u64,
    revision: u32,
) -> Result<ApprovalRecord, CallError> {
    let manifest = &tool.manifest;
    let sealed = sealed_params(shared, &manifest.sensitive, prepared)?;
    Ok(ApprovalRecord {
        operation_key: prepared.operation_key.clone(),
        fingerprint: prepared.fingerprint.clone(),
        component: Some(tool.digest.clone()),
        run_id: prepared.run_id.clone(),
        step_id: prepared.step_id.clone(),
        tool: manifest.name.clone(),
        description: manifest.description.clone(),
        consequence: manifest.consequence.clone(),
        args: redacted.clone(),
        sealed,
        requested_ms: now,
        state: ApprovalState::Pending,
        decided_by: None,
        decided_ms: None,
        note: None,
        expires_ms: None,
        revision,
    })
}

/// The sensitive values of a call's args (at `pointers`, the manifest's), sealed for its operation
/// (`seal::seal_params`): kept by its request for approval, for the approver, and by its operation,
/// so that the host can mask them where they come back after the call. `None` when there are none.
pub(crate) fn sealed_params(
    shared: &Shared,
    pointers: &[String],
    prepared: &Prepared,
) -> Result<Option<String>, CallError> {
    crate::seal::seal_params(&shared.keying, &prepared.operation_key, &prepared.args, pointers, || {
        let mut nonce = [0u8; crate::seal::NONCE_BYTES];
        getrandom::fill(&mut nonce).map_err(|e| crate::seal::SealError::NoRandomness(e.to_string()))?;
        Ok(nonce)
    })
    .map_err(|e| CallError::Seal { operation_key: prepared.operation_key.clone(), reason: e.to_string() })
}

/// What a person decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Lets the call with these params through once, until `expires_ms` if set.
    Approve { expires_ms: Option<u64> },
    /// Nothing is ever dispatched for this step.
    Reject,
}

/// Records a person's decision on the request for approval of `operation_key`. `fingerprint`
/// must be the request's: a decision is about the exact params the person saw. Refused once the
/// operation ran (an approval never authorises another dispatch) and after a rejection (final).
/// `keying` opens the request's sealed sensitive values (see [`decide_on`]).
/// See [`decide_on`] to bind the decision to the component the person saw as well.
pub async fn decide(
    ledger: &Ledger,
    keying: Result<&crate::keys::FingerprintKey, &str>,
    operation_key: &str,
    fingerprint: &str,
    decision: Decision,
    by: &str,
    note: Option<&str>,
) -> Result<ApprovalRecord, CallError> {
    decide_on(ledger, keying, operation_key, fingerprint, None, decision, by, note).await
}

/// Like [`decide`]; with `component`, the digest of the component the person saw the request
/// name, refused if the request now names another (the tool was replaced and the request renewed
/// since they looked). Whatever is given here, an approval lets only the component the request
/// names run: a call of other code supersedes it (see the module's docs).
///
/// `keying` is the key of whoever decides (the host's, or the CLI's key file), or why there is
/// none (said in the refusal): an approval of a request whose sensitive values it cannot unseal
/// is refused, since the person could read only `[redacted]` where the values go, and a call
/// fingerprinted under that key would not match the request anyway. A rejection needs no key.
#[allow(clippy::too_many_arguments)]
pub async fn decide_on(
    ledger: &Ledger,
    keying: Result<&crate::keys::FingerprintKey, &str>,
    operation_key: &str,
    fingerprint: &str,
    component: Option<&str>,
    decision: Decision,
    by: &str,
    note: Option<&str>,
) -> Result<ApprovalRecord, CallError> {
    let refuse = |reason: String| CallError::Approval { operation_key: operation_key.to_string(), reason };
    if by.trim().is_empty() {
        return Err(refuse("say who decides (--by NAME)".into()));
    }
    let Some(mut record) = ledger.approval(operation_key).await? else {
        return Err(refuse("no call of it awaits approval (call the tool first; the call records the request)".into()));
    };
    if record.fingerprint != fingerprint {
        return Err(refuse(format!(
            "it awaits approval of params with fingerprint {}, not {fingerprint}: look at `oncebox approvals show \
             {operation_key}` and decide on what it shows",
            record.fingerprint
        )));
    }
    if let Some(seen) = component
        && !record.binds(seen)
    {
        return Err(refuse(format!(
            "it awaits approval for component {}, not {seen}: the tool was replaced since you looked. Look at \
             `oncebox approvals show {operation_key}` and decide on what it shows",
            record.component.as_deref().unwrap_or("(none named)")
        )));
    }
    if let Some(op) = ledger.operation(operation_key).await? {
        return Err(refuse(format!(
            "it already ran under its approval and is {}; an approval never authorises another dispatch{}",
            op.status.as_str(),
            if op.status == crate::ledger::OperationStatus::Unknown {
                " (reconcile it, or settle it with `oncebox resolve`)"
            } else {
                ""
            }
        )));
    }
    if ledger.tombstone(operation_key).await?.is_some() {
        return Err(refuse("its step ran and its record expired (retention): a new intent needs a new step id".into()));
    }
    if record.state == ApprovalState::Rejected {
        return Err(refuse(format!(
            "{} rejected it at {}; a rejection is final (a new intent needs a new step id)",
            record.decided_by.as_deref().unwrap_or("?"),
            time(record.decided_ms.unwrap_or(0))
        )));
    }
    let now = ledger.now_ms();
    // An approval that stands is not decided again by another approval: that would rewrite who
    // approved and until when, and the first approver would be told they won a race they lost.
    // A rejection may still withdraw it before it is used; the record keeps whose it ended.
    let withdrawn = match (&record.state, &decision) {
        (ApprovalState::Approved, _) if record.expired(now) => None,
        (ApprovalState::Approved, Decision::Approve { .. }) => {
            return Err(refuse(format!(
                "{} approved it at {}{}; it stands, and a second approval would rewrite it: to withdraw it, reject it (final)",
                record.decided_by.as_deref().unwrap_or("?"),
                time(record.decided_ms.unwrap_or(0)),
                record.expires_ms.map(|until| format!(" until {}", time(until))).unwrap_or_default()
            )));
        }
        (ApprovalState::Approved, Decision::Reject) => Some(format!(
            "withdrew the approval {} gave at {}",
            record.decided_by.as_deref().unwrap_or("?"),
            time(record.decided_ms.unwrap_or(0))
        )),
        _ => None,
    };
    record.state = match decision {
        Decision::Approve { expires_ms } => {
            if expires_ms.is_some_and(|until| until <= now) {
                return Err(refuse("the expiry given is already past".into()));
            }
            // Approving it would let nothing run (it is bound to no code): the next call of the
            // step renews it for the component loaded then, and that is what to approve.
            if record.component.is_none() {
                return Err(refuse(
                    "it was recorded before requests named their component, so approving it approves no code: call \
                     the step again (nothing is dispatched; the request is renewed for the component loaded now) \
                     and approve that"
                        .into(),
                ));
            }
            if record.sealed.is_some() {
                let opened = keying.map_err(str::to_string).and_then(|key| reveal(&record, key));
                if let Err(why) = opened {
                    return Err(refuse(format!(
                        "its sensitive values cannot be unsealed here ({why}), so what it would send cannot be \
                         read, and a call of the step fingerprinted under this key would not match it: reject it, \
                         and call with a new step id"
                    )));
                }
            }
            record.expires_ms = expires_ms;
            ApprovalState::Approved
        }
        Decision::Reject => {
            record.expires_ms = None;
            ApprovalState::Rejected
        }
    };
    record.decided_by = Some(by.to_string());
    record.decided_ms = Some(now);
    record.note = match (withdrawn, note) {
        (Some(withdrawn), Some(note)) => Some(format!("{withdrawn}: {note}")),
        (withdrawn, note) => withdrawn.or(note.map(str::to_string)),
    };
    record.revision += 1;
    match ledger.put_approval(&record).await {
        Ok(()) => {}
        // The call it approves started meanwhile: what it runs under can no longer change.
        Err(LedgerError::ApprovalClosed { .. }) => {
            return Err(refuse("a call of it started meanwhile; it runs under the approval it saw".into()));
        }
        // Another decision (or a renewal for new code) was written since this one read the
        // request: it won, and this one is refused with what it was, never written over it.
        Err(LedgerError::ApprovalChanged { .. }) => {
            let now = ledger.approval(operation_key).await?;
            let won = match now {
                Some(won) if won.state != ApprovalState::Pending => format!(
                    "{} {} it at {} meanwhile",
                    won.decided_by.as_deref().unwrap_or("?"),
                    won.state.as_str(),
                    time(won.decided_ms.unwrap_or(0))
                ),
                _ => "the request changed meanwhile (it was renewed for other code)".to_string(),
            };
            return Err(refuse(format!("{won}; this decision was not recorded: look at the request again")));
        }
        Err(e) => return Err(e.into()),
    }
    tracing::info!(%operation_key, state = record.state.as_str(), by, "approval decided");
    Ok(record)
}

/// The sealed sensitive values of a request, opened with the ledger's key (for the approver).
pub fn reveal(record: &ApprovalRecord, key: &crate::keys::FingerprintKey) -> Result<Value, String> {
    match &record.sealed {
        None => Ok(record.args.clone()),
        Some(sealed) => {
            crate::seal::open_params(key, &record.operation_key, &record.args, sealed).map_err(|e| e.to_string())
        }
    }
}

fn awaiting(record: &ApprovalRecord, ledger: &Ledger, why: &str) -> Outcome {
    let message = format!("{why}: {}", crate::approval_view::approve_command(record, ledger));
    stopped(record, Status::AwaitingApproval, "awaiting-approval", message, ledger)
}

fn stopped(record: &ApprovalRecord, status: Status, class: &str, message: String, ledger: &Ledger) -> Outcome {
    Outcome {
        fingerprint: Some(record.fingerprint.clone()),
        approval: Some(Box::new(ApprovalView::of(record, ledger))),
        ..Outcome::stopped(&record.operation_key, status, class, message)
    }
}
