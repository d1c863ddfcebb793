//! What a person is shown of a request for approval: the call's exact params (sensitive values
//! redacted unless the operator's token or key unseals them), the component it would run, the
//! consequence the tool declares, its state as of now, and how to approve it.

use serde::Serialize;
use serde_json::Value;

use crate::ledger::{ApprovalRecord, ApprovalStanding, Ledger};

/// What a caller is shown of a request for approval: everything but the sealed values.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ApprovalView {
    /// Its state as of now: an approval past its expiry shows as `expired` (derived, not stored).
    pub state: ApprovalStanding,
    pub tool: String,
    /// The digest of the component the request is for (`sha256:HEX`): only that code runs under
    /// it. `None` for a request recorded before requests named their component (it needs a new
    /// approval).
    pub component: Option<String>,
    pub description: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consequence: Option<String>,
    pub run_id: String,
    pub step_id: String,
    /// The exact params, sensitive values redacted (`--reveal` shows them to the key's holder).
    pub params: Value,
    pub requested_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_ms: Option<u64>,
    /// How to approve it, while it may be: pending, or approved and expired unused (approved
    /// again). A rejected or a standing approval is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approve: Option<String>,
}

impl ApprovalView {
    pub fn of(record: &ApprovalRecord, ledger: &Ledger) -> Self {
        let state = record.standing(ledger.now_ms());
        ApprovalView {
            approve: matches!(state, ApprovalStanding::Pending | ApprovalStanding::Expired)
                .then(|| approve_command(record, ledger)),
            state,
            tool: record.tool.clone(),
            component: record.component.clone(),
            description: record.description.clone(),
            consequence: record.consequence.clone(),
            run_id: record.run_id.clone(),
            step_id: record.step_id.clone(),
            params: record.args.clone(),
            requested_ms: record.requested_ms,
            decided_by: record.decided_by.clone(),
            note: record.note.clone(),
            expires_ms: record.expires_ms,
        }
    }
}

/// The command that approves `record`'s exact params and component on this ledger.
pub fn approve_command(record: &ApprovalRecord, ledger: &Ledger) -> String {
    format!(
        "oncebox approve --ledger {} {} --fingerprint {}{} --by NAME",
        ledger.path().display(),
        record.operation_key,
        record.fingerprint,
        record.component.as_deref().map(|c| format!(" --component {c}")).unwrap_or_default()
    )
}
