//! Ending a claim whose owner is gone (its lease ran out) without running it: `compensate` ends
//! the steps of a run it undoes, a person's word ends a compensation they did by hand, and the
//! background reconciler ends a claim that left an effect in doubt (a host killed mid-send on a
//! ledger others share), so that it is reconciled and a person told whether or not its step is
//! ever called again. One rule for all: an effect in doubt or taken makes it unknown, and nothing
//! taken makes it failed, where ending it was asked for.

use crate::clock::rfc3339 as time;
use crate::error::CallError;
use crate::ledger::{
    AttemptRecord, AttemptSource, Claim, ClaimRequest, ErrorRecord, Ledger, LedgerError, OperationRecord,
    OperationStatus,
};

/// Who ends an abandoned claim ([`close_abandoned`]), and why it is ended rather than run.
pub(crate) struct Closer<'a> {
    pub owner: &'a str,
    pub lease_ms: u64,
    /// Why it is ended rather than run; `None`: ended only while an effect of it is in doubt (the
    /// reconciler, which leaves a claim that sent nothing, or whose sends were all answered, for
    /// its step's next call to take over and run).
    pub why: Option<&'a str>,
    /// What follows its settlement, said in its record (`, then compensate again`), or nothing.
    pub then: &'a str,
}

/// Takes over `op`, claimed by an owner that is gone (its lease ran out), and ends it: failed when
/// nothing of it took effect (its effects, if any, are proven not taken), so that no later call of
/// its step runs it after its run was undone; unknown when an effect of it took place or is in
/// doubt, for a person or a reconcile to settle. The rule of evidence is the ledger's to enforce:
/// it refuses a failed end while an effect is taken or in doubt. `None` when the ledger does not
/// hand it over (its owner is live, or it ended meanwhile). Else its end and why. `closer`: who
/// takes it over, for how long, and why it is ended rather than run (`compensate`, or a person's
/// word that they undid by hand the step it compensates, or the reconciler's finding an effect
/// of it in doubt).
pub(crate) async fn close_abandoned(
    ledger: &Ledger,
    closer: &Closer<'_>,
    op: &OperationRecord,
) -> Result<Option<(OperationStatus, String)>, CallError> {
    // Ended only for an effect in doubt: a claim with none is not taken over at all.
    if closer.why.is_none() && !ledger.effects(&op.key).await?.iter().any(|e| e.status.in_doubt()) {
        return Ok(None);
    }
    let now = ledger.now_ms();
    let request = ClaimRequest {
        key: op.key.clone(),
        run_id: op.run_id.clone(),
        step_id: op.step_id.clone(),
        tool: op.tool.clone(),
        class: op.class,
        fingerprint: op.fingerprint.clone(),
        older_fingerprints: Vec::new(),
        args: op.args.clone(),
        // A take-over of an existing operation: the record keeps what it has.
        sealed: op.sealed.clone(),
        owner: closer.owner.to_string(),
        now_ms: now,
        lease_ms: closer.lease_ms,
        // It exists: a take-over, which no approval decides (its own call was let through).
        approval: None,
    };
    let Claim::Owned { fence, previous_attempts } = ledger.claim(&request).await? else {
        return Ok(None);
    };
    let effects = ledger.effects(&op.key).await?;
    let in_doubt: Vec<&str> = effects.iter().filter(|e| e.status.in_doubt()).map(|e| e.key.as_str()).collect();
    let taken: Vec<&str> = effects.iter().filter(|e| e.status.taken()).map(|e| e.key.as_str()).collect();
    let gone = if op.lease_until_ms == 0 {
        // Recovery at a restart, and a settlement that reopens a step, leave it so.
        format!(
            "it was left claimed by {}, which no longer holds it (a restart, or a settlement, released it)",
            op.owner
        )
    } else {
        format!("its owner {} stopped (its lease ended at {})", op.owner, time(op.lease_until_ms))
    };
    // Kept in the operation's record, which any later call of the step is answered from (a
    // model's too, over MCP): the commands without the ledger's place on this machine.
    let settle = format!(
        "reconcile it (oncebox reconcile --operation {0}) or settle it (oncebox resolve {0}){1}",
        op.key, closer.then
    );
    // Every effect took place and none is in doubt: a lookup has nothing to prove, a person
    // settles it with the tool's output.
    let settle_taken =
        format!("settle it with its output (oncebox resolve {} --committed 'OUTPUT'){}", op.key, closer.then);
    let unknown =
        |why: String| (OperationStatus::Unknown, ErrorRecord { class: "unknown-outcome".into(), message: why });
    let (status, error) = if !in_doubt.is_empty() {
        unknown(format!("{gone} with effect(s) {} in doubt: {settle}", in_doubt.join(", ")))
    } else if closer.why.is_none() {
        // Nothing in doubt any more (read again under the claim, which no other caller could
        // have settled): this take-over lets it go, and its short lease runs out for the next
        // call of the step to take it over and run it.
        return Ok(None);
    } else if !taken.is_empty() {
        unknown(format!(
            "{gone} after effect(s) {} took place, before it recorded its end: {settle_taken}",
            taken.join(", ")
        ))
    } else {
        let message =
            format!("{gone} before anything of it took effect; ended failed by {}", closer.why.unwrap_or_default());
        (OperationStatus::Failed, ErrorRecord { class: "abandoned".into(), message })
    };
    let attempt = previous_attempts + 1;
    let mut record = AttemptRecord {
        operation_key: op.key.clone(),
        run_id: op.run_id.clone(),
        step_id: op.step_id.clone(),
        tool: op.tool.clone(),
        attempt,
        max_attempts: attempt,
        fence,
        started_ms: now,
        duration_us: 0,
        outcome: error.class.clone(),
        message: Some(error.message.clone()),
        source: AttemptSource::Fresh,
        downstream_accepted: None,
        // What the gone owner's attempt sent, by the take-over's rule: this record is that
        // attempt's.
        effects: crate::pipeline::stopped_sends(ledger, &op.key, &effects, previous_attempts).await?,
    };
    let ended =
        ledger.record_attempt(fence, &record, Some((status, None, Some(error.clone()))), ledger.now_ms(), Vec::new());
    let (status, error) = match ended.await {
        Ok(()) => (status, error),
        // An effect the read above did not see: the ledger's rule of evidence wins, unknown.
        Err(LedgerError::InDoubt { effect_key, .. } | LedgerError::EffectTaken { effect_key, .. }) => {
            let (status, error) = unknown(format!("{gone} with effect {effect_key} taken or in doubt: {settle}"));
            record.outcome = error.class.clone();
            record.message = Some(error.message.clone());
            let finish = Some((status, None, Some(error.clone())));
            ledger.record_attempt(fence, &record, finish, ledger.now_ms(), Vec::new()).await?;
            (status, error)
        }
        // Taken over by another caller meanwhile: theirs now.
        Err(e) if e.is_no_longer_owned() => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    crate::attempt_log::emit(&record);
    Ok(Some((status, error.message)))
}
