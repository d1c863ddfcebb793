//! The rules every backend applies, written once: who gets an operation, when a finish is
//! refused, when an approval stands or lapses, what settling an unknown makes of its records.

use crate::{
    ApprovalRecord, ApprovalState, AttemptEffect, AttemptRecord, AttemptSource, Claim, ClaimRequest, EffectRecord,
    EffectSource, EffectStatus, ErrorRecord, LedgerError, OperationRecord, OperationStatus, Resolution, Settlement,
    StaleApproval,
};

/// What an operation's record (or its absence) means for a caller that wants to run it.
/// `None`: the caller takes it (new, or its lease expired).
pub fn verdict(existing: Option<&OperationRecord>, req: &ClaimRequest) -> Option<Claim> {
    let op = existing?;
    if !req.matches(&op.fingerprint) {
        Some(Claim::Conflict(op.clone()))
    } else if op.status != OperationStatus::Claimed {
        Some(Claim::Recorded(op.clone()))
    } else if op.lease_until_ms > req.now_ms {
        Some(Claim::InProgress(op.clone()))
    } else {
        None
    }
}

/// The rule of evidence for an operation's end, whoever asks: an operation with an effect in
/// doubt is neither completed nor failed, and one with an effect that took place is not failed.
/// `effects` are every effect of the operation the finish would leave recorded.
pub fn refused_finish<'e>(
    operation_key: &str,
    status: OperationStatus,
    effects: impl IntoIterator<Item = &'e EffectRecord>,
) -> Option<LedgerError> {
    if !matches!(status, OperationStatus::Completed | OperationStatus::Failed) {
        return None;
    }
    let failing = status == OperationStatus::Failed;
    let effect = effects.into_iter().find(|e| e.status.in_doubt() || (failing && e.status.taken()))?;
    let (operation_key, effect_key) = (operation_key.to_string(), effect.key.clone());
    Some(if effect.status.in_doubt() {
        LedgerError::InDoubt { operation_key, effect_key }
    } else {
        LedgerError::EffectTaken { operation_key, effect_key }
    })
}

/// Whether an approval write may replace `stored`: its revision follows the stored one.
pub fn approval_follows(stored: Option<&ApprovalRecord>, record: &ApprovalRecord) -> Result<(), LedgerError> {
    if record.revision == stored.map_or(0, |s| s.revision) + 1 {
        Ok(())
    } else {
        Err(LedgerError::ApprovalChanged { operation_key: record.operation_key.clone() })
    }
}

/// Whether a new operation for `req` may be claimed, given its approval as stored: only while the
/// approval the caller saw still approves these params, run by the caller's component, at
/// `req.now_ms`. An approval bound to another component (the tool was replaced since the request,
/// or the request predates components: bound to none) lets nothing through.
pub fn approval_stands(req: &ClaimRequest, stored: Option<&ApprovalRecord>) -> bool {
    match &req.approval {
        None => true,
        Some(seen) => stored.is_some_and(|a| {
            a.revision == seen.revision
                && req.matches(&a.fingerprint)
                && a.binds(&seen.component)
                && a.state == ApprovalState::Approved
                && !a.expired(req.now_ms)
        }),
    }
}

/// Whether retention may remove the request for approval `stored` it read as `stale`: still at
/// that revision, and its operation (`claimed`: claimed or recorded, in memory included) not
/// started meanwhile.
pub fn approval_lapses(stale: &StaleApproval, stored: Option<&ApprovalRecord>, claimed: bool) -> bool {
    !claimed && stored.is_some_and(|a| a.revision == stale.revision)
}

/// Refuses to expire an operation that is not over: only completed and failed ones expire.
pub fn expirable(op: &OperationRecord) -> Result<(), LedgerError> {
    match op.status {
        OperationStatus::Completed | OperationStatus::Failed => Ok(()),
        status => Err(LedgerError::NotExpirable { operation_key: op.key.clone(), status: status.as_str() }),
    }
}

/// The operation for `req`'s caller: an expired claim taken over with `fence`, or a new one
/// (whose fence is 1: no claim of it existed, so no token of it was ever handed out).
pub fn take_over(expired: Option<OperationRecord>, req: &ClaimRequest, fence: u64) -> OperationRecord {
    match expired {
        Some(mut op) => {
            op.fence = fence;
            op.owner.clone_from(&req.owner);
            op.lease_until_ms = req.now_ms + req.lease_ms;
            op.updated_ms = req.now_ms;
            op
        }
        None => new_operation(req),
    }
}

fn new_operation(req: &ClaimRequest) -> OperationRecord {
    OperationRecord {
        key: req.key.clone(),
        run_id: req.run_id.clone(),
        step_id: req.step_id.clone(),
        tool: req.tool.clone(),
        class: req.class,
        fingerprint: req.fingerprint.clone(),
        args: req.args.clone(),
        sealed: req.sealed.clone(),
        status: OperationStatus::Claimed,
        owner: req.owner.clone(),
        lease_until_ms: req.now_ms + req.lease_ms,
        fence: 1,
        attempts: 0,
        output: None,
        error: None,
        created_ms: req.now_ms,
        updated_ms: req.now_ms,
        reconciled: None,
    }
}

/// What settling an unknown operation makes of its records: the operation and the effects it
/// settles. `committed` is said of the whole operation (its output is the operation's): every
/// effect of it still in doubt is settled as taken and the operation completes, so that nothing
/// is left in doubt under a completed operation. `not-committed` is said of one effect in doubt
/// (`effect_key`, or the only one): it may be sent again, and once nothing else of the operation is
/// in doubt the operation reopens for the next call, which sends what was not taken (an
/// irreversible one fails instead: it is not sent again on anyone's word). `effects` are all of
/// the operation's effects.
pub fn settled(
    operation_key: &str,
    op: Option<OperationRecord>,
    effects: &[EffectRecord],
    effect_key: Option<&str>,
    seen: Option<u32>,
    resolution: &Resolution,
    settlement: &Settlement,
) -> Result<(OperationRecord, Vec<EffectRecord>), LedgerError> {
    let not_in_doubt = || LedgerError::NotInDoubt { operation_key: operation_key.to_string() };
    let mut op = op.ok_or_else(not_in_doubt)?;
    if op.status != OperationStatus::Unknown {
        let operation_key = format!("{operation_key} (it is {} now)", op.status.as_str());
        return Err(LedgerError::NotInDoubt { operation_key });
    }
    let in_doubt: Vec<&EffectRecord> = effects.iter().filter(|e| e.status.in_doubt()).collect();
    let any_taken = effects.iter().any(|e| e.status.taken());
    if let Some(wanted) = effect_key {
        let Some(effect) = in_doubt.iter().find(|e| e.key == wanted) else {
            return Err(LedgerError::NotInDoubt { operation_key: format!("{operation_key} (effect {wanted})") });
        };
        // What was asked about was one send; a later one may have committed since.
        if seen.is_some_and(|seen| seen != effect.dispatches) {
            let (operation_key, effect_key) = (operation_key.to_string(), wanted.to_string());
            return Err(LedgerError::EffectChanged { operation_key, effect_key });
        }
    }
    // The effects this settles. None in doubt: the tool itself reported the unknown outcome, and
    // the settlement is the operation's alone.
    let settled: Vec<&EffectRecord> = match (resolution, effect_key) {
        (Resolution::Committed { .. }, _) => in_doubt.clone(),
        (Resolution::NotCommitted, Some(wanted)) => in_doubt.iter().copied().filter(|e| e.key == wanted).collect(),
        (Resolution::NotCommitted, None) if in_doubt.len() > 1 => {
            let keys: Vec<&str> = in_doubt.iter().map(|e| e.key.as_str()).collect();
            return Err(LedgerError::Ambiguous { operation_key: operation_key.to_string(), effects: keys.join(", ") });
        }
        (Resolution::NotCommitted, None) => in_doubt.clone(),
    };
    let still_in_doubt = in_doubt.len() - settled.len();
    let now_ms = settlement.at_ms;
    op.updated_ms = now_ms;
    let effects = settled
        .into_iter()
        .cloned()
        .map(|mut effect| {
            effect.updated_ms = now_ms;
            effect.status = match resolution {
                Resolution::Committed { .. } => EffectStatus::Completed,
                Resolution::NotCommitted => EffectStatus::Retryable,
            };
            effect.resolution = Some(settlement.clone());
            effect
        })
        .collect();
    // Another effect still in doubt keeps the operation unknown: settle that one too.
    if still_in_doubt == 0 {
        op.lease_until_ms = 0;
        op.error = None;
        match resolution {
            Resolution::Committed { output } => {
                op.status = OperationStatus::Completed;
                op.output = Some(output.clone());
            }
            // An irreversible operation is not run again on anyone's word: its approval was for one
            // dispatch. Proven not taken, and nothing else of it taken, it failed: nothing of it
            // took effect. A new attempt is a new intent (a new step id, a new approval).
            Resolution::NotCommitted if op.class == oncebox_core::policy::ReplayClass::Irreversible => {
                if any_taken {
                    op.error = Some(ErrorRecord {
                        class: "unknown-outcome".into(),
                        message: "another effect of it took place: a person settles what it amounts to".into(),
                    });
                } else {
                    op.status = OperationStatus::Failed;
                    op.error = Some(ErrorRecord {
                        class: "not-committed".into(),
                        message: format!(
                            "proven not to have taken effect ({}); an irreversible step is not run again: a new \
                             intent needs a new step id and its own approval",
                            settlement.by
                        ),
                    });
                }
            }
            // Claimed with an expired lease: the next call takes it over and runs it again.
            Resolution::NotCommitted => op.status = OperationStatus::Claimed,
        }
    }
    Ok((op, effects))
}

/// Whether the owner holding `fence`, whose new operation's claim rode with token `ridden` (a
/// claim committed before its flush, which a database that crashes apart from its host can lose:
/// PostgreSQL's `riding.rs`), lost it: the operation's row, read under its lock as (fence,
/// claimed, token), is gone, or is another claim's with the same first fence. Its writes are then
/// refused (`ClaimLost`). A row with another fence or status is a take-over's or an end's: the
/// ownership check answers that (`Fenced`).
pub fn claim_lost(fence: u64, ridden: Option<i64>, row: Option<(u64, bool, i64)>) -> bool {
    match (ridden, row) {
        (Some(_), None) => fence == 1,
        (Some(token), Some((1, true, found))) => fence == 1 && found != token,
        _ => false,
    }
}

/// Whether writing an effect record may wait for the next durable write instead of a commit
/// of its own: only an answer (the record leaves `dispatched`) with no local effects staged
/// beside it. Losing such a write to a crash leaves the write-ahead, in doubt, which is what a
/// crash between the send and the answer leaves anyway; and no effect leaves the host, and no
/// caller hears of the answer, before the next durable write: the next effect's write-ahead, or
/// the attempt's record that the caller's answer waits for.
pub fn answer_may_ride(effect: &EffectRecord, expected: Option<(EffectStatus, u32)>, staged: usize) -> bool {
    staged == 0
        && effect.status != EffectStatus::Dispatched
        && expected.is_some_and(|(s, _)| s == EffectStatus::Dispatched)
}

/// The version a write stamps on its key: taken from its effect key, which no other write ever
/// has, so versions never repeat (and never come back after a delete). Never 0, which means absent.
pub fn stamp(effect_key: &str) -> u64 {
    let n = effect_key.get(..16).and_then(|hex| u64::from_str_radix(hex, 16).ok()).unwrap_or(1);
    n.max(1)
}

/// The effects that an attempt which never recorded its end wrote (ahead of a send, or with a
/// local write): those stamped with an attempt number above the `recorded` attempts of their
/// operation. Asked by whoever takes an operation over, and by redb's recovery at open. Empty: its
/// owner stopped before any write-ahead, nothing of the attempt left the host, and the take-over is
/// not an attempt (DESIGN section 7); else the take-over counts it, and an irreversible effect is
/// never sent twice.
///
/// An effect stamped 0 was written by a host of a release before the stamp (an operation in
/// flight across the upgrade): which attempt wrote it is not known, so it is the stopped
/// attempt's unless one of the operation's recorded `attempts` lists it. Counting it may cost the
/// operation one attempt of its class's maximum; not counting it would let the operation run one
/// attempt more than its class allows (no effect leaves twice either way: the guarded path sends
/// an effect on record again only as its own status allows, and an irreversible one never). An
/// effect an old host resent after an attempt that lists it is still not counted (its record
/// says nothing more). Counting it by its `dispatches` above the attempts listing it as sent
/// would not be exact either: one attempt may send an effect twice (its rerun after a KV
/// conflict meets its own send and, but for an irreversible effect, sends it again), so that rule
/// would count attempts that never ran. `attempts` is read only for those ([`reads_attempts`]).
pub fn unrecorded_sends<'a>(
    effects: &'a [EffectRecord],
    recorded: u32,
    attempts: &[AttemptRecord],
) -> Vec<&'a EffectRecord> {
    let listed = |key: &str| attempts.iter().any(|attempt| attempt.effects.iter().any(|e| e.key == key));
    effects
        .iter()
        .filter(|effect| match effect.attempt {
            0 => !listed(&effect.key),
            attempt => attempt > recorded,
        })
        .collect()
}

/// Whether [`unrecorded_sends`] needs the operation's recorded attempts to judge `effects`: only
/// for an effect written before attempts were stamped, so a take-over of today's records reads
/// none.
pub fn reads_attempts(effects: &[EffectRecord]) -> bool {
    effects.iter().any(|effect| effect.attempt == 0)
}

/// Whether `earlier`, an effect recorded by an earlier attempt (or an earlier run of this one)
/// under another key, is the same request as one of `kind` and `fingerprint` asked anew, and
/// forbids sending it: it took place or may have; or the class sends an effect once, whatever its
/// first send met (`once`: irreversible, DESIGN section 7), a send proven not taken or refused
/// included. Its label changed, so its key did: sending would do again what was done, or, for an
/// irreversible effect, send it a second time under one approval. Asked by the guarded path.
pub fn repeats(earlier: &EffectRecord, kind: &str, fingerprint: &str, once: bool) -> bool {
    earlier.kind == kind
        && earlier.fingerprint == fingerprint
        && (once || earlier.status.in_doubt() || earlier.status.taken())
}

/// What a restart makes of an operation its stopped owner left claimed, with its `effects` on
/// record: the effects sent and never answered become unknown (`changed`); an operation holding
/// one in doubt becomes unknown, its stopped attempt recorded (`attempt`), as a take-over on a
/// shared ledger judges it; every other claim loses its lease, so the next call takes it over.
/// `attempts`: the operation's recorded attempts, when [`reads_attempts`] says they are needed.
/// Asked by redb's recovery at open and by the reference model's crash.
pub fn recovered(
    mut op: OperationRecord,
    effects: Vec<EffectRecord>,
    attempts: &[AttemptRecord],
    now_ms: u64,
) -> Recovered {
    let mut changed = Vec::new();
    let mut all = Vec::with_capacity(effects.len());
    for mut effect in effects {
        if effect.status == EffectStatus::Dispatched {
            effect.status = EffectStatus::Unknown;
            effect.error = Some("the host stopped before the answer arrived".into());
            effect.updated_ms = now_ms;
            changed.push(effect.clone());
        }
        all.push(effect);
    }
    let mut attempt = None;
    if let Some(effect_key) = all.iter().find(|e| e.status.in_doubt()).map(|e| e.key.clone()) {
        let error = ErrorRecord {
            class: "unknown-outcome".into(),
            message: format!("the host stopped while effect {effect_key} was in flight; reconcile before retrying"),
        };
        let sent = unrecorded_sends(&all, op.attempts, attempts);
        if !sent.is_empty() {
            let number = op.attempts + 1;
            attempt = Some(AttemptRecord {
                operation_key: op.key.clone(),
                run_id: op.run_id.clone(),
                step_id: op.step_id.clone(),
                tool: op.tool.clone(),
                attempt: number,
                max_attempts: number,
                fence: op.fence,
                started_ms: now_ms,
                duration_us: 0,
                outcome: error.class.clone(),
                message: Some(error.message.clone()),
                source: AttemptSource::Fresh,
                downstream_accepted: Some(false),
                effects: sent_by_stopped(&sent),
            });
            op.attempts = number;
        }
        op.status = OperationStatus::Unknown;
        op.error = Some(error);
    }
    op.lease_until_ms = 0;
    op.updated_ms = now_ms;
    Recovered { op, changed, attempt }
}

/// What [`recovered`] makes of a stopped owner's operation: to write back.
pub struct Recovered {
    pub op: OperationRecord,
    pub changed: Vec<EffectRecord>,
    pub attempt: Option<AttemptRecord>,
}

/// The record an attempt that stopped without recording its end leaves, judged by whoever takes
/// its operation over (or recovers it): the effects it wrote, as an attempt lists them.
pub fn sent_by_stopped(sent: &[&EffectRecord]) -> Vec<AttemptEffect> {
    sent.iter()
        .map(|e| AttemptEffect {
            key: e.key.clone(),
            label: e.label.clone(),
            source: if e.dispatches > 1 { EffectSource::Redispatched } else { EffectSource::Fresh },
            status: e.status,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_that_rode_is_lost_when_its_row_is_gone_or_another_claims() {
        let claimed = |token| Some((1, true, token));
        assert!(claim_lost(1, Some(7), None), "the row is gone");
        assert!(claim_lost(1, Some(7), claimed(8)), "claimed anew with the same first fence");
        assert!(claim_lost(1, Some(7), claimed(0)), "by a host that writes no token");
        assert!(!claim_lost(1, Some(7), claimed(7)), "still its own");
        assert!(!claim_lost(1, None, claimed(8)), "a claim that waited for its flush is checked by its fence");
        assert!(!claim_lost(1, Some(7), Some((2, true, 8))), "taken over: fenced, not lost");
        assert!(!claim_lost(1, Some(7), Some((1, false, 7))), "ended: fenced, not lost");
        assert!(!claim_lost(3, Some(7), None), "a drawn fence never rode");
    }

    fn effect(status: EffectStatus) -> EffectRecord {
        EffectRecord {
            key: "k".into(),
            operation_key: "op".into(),
            label: "charge".into(),
            occurrence: 1,
            kind: "http".into(),
            target: "127.0.0.1:1".into(),
            fingerprint: "f".into(),
            status,
            response: None,
            sealed: None,
            error: None,
            dispatches: 1,
            first_dispatched_ms: 1,
            last_dispatched_ms: 1,
            updated_ms: 1,
            resolution: None,
            attempt: 1,
        }
    }

    #[test]
    fn an_irreversible_request_repeats_whatever_its_first_send_met_others_only_when_it_may_have_taken_place() {
        use EffectStatus::*;
        for status in [Dispatched, Completed, Refused, Retryable, Unknown] {
            let earlier = effect(status);
            assert!(repeats(&earlier, "http", "f", true), "{status:?}: an irreversible effect is sent once");
            let may_have = status.in_doubt() || status.taken();
            assert_eq!(repeats(&earlier, "http", "f", false), may_have, "{status:?}");
            // Another request (another kind or other params) is no repeat, whatever the class.
            assert!(!repeats(&earlier, "http", "g", true) && !repeats(&earlier, "kv-set", "f", true));
        }
    }

    #[test]
    fn only_an_answer_with_nothing_staged_rides() {
        use EffectStatus::*;
        for answer in [Completed, Refused, Retryable, Unknown] {
            assert!(answer_may_ride(&effect(answer), Some((Dispatched, 1)), 0), "{answer:?}");
            assert!(!answer_may_ride(&effect(answer), Some((Dispatched, 1)), 1), "{answer:?} beside a local write");
        }
        // A write-ahead, first or a resend from whatever its record said, is durable before it leaves.
        assert!(!answer_may_ride(&effect(Dispatched), None, 0));
        for before in [Dispatched, Completed, Refused, Retryable, Unknown] {
            assert!(!answer_may_ride(&effect(Dispatched), Some((before, 1)), 0), "a resend after {before:?}");
        }
        // A local effect's record is written as it is taken, never from `dispatched`.
        assert!(!answer_may_ride(&effect(Completed), None, 0));
    }

    #[test]
    fn what_an_attempt_above_the_recorded_ones_wrote_was_the_stopped_attempts() {
        let by = |key: &str, attempt: u32| EffectRecord { key: key.into(), attempt, ..effect(EffectStatus::Retryable) };
        let keys = |effects: &[EffectRecord], recorded: u32| -> Vec<String> {
            unrecorded_sends(effects, recorded, &[]).iter().map(|e| e.key.clone()).collect()
        };
        // No attempt recorded: what attempt 1 wrote, it never recorded.
        assert_eq!(keys(&[by("a", 1)], 0), ["a"]);
        assert_eq!(keys(&[by("a", 1)], 1), Vec::<String>::new(), "recorded");
        // A second attempt resent one and wrote another, then stopped.
        assert_eq!(keys(&[by("a", 2), by("b", 2), by("c", 1)], 1), ["a", "b"]);
        assert!(!reads_attempts(&[by("a", 2), by("b", 1)]), "stamped: no attempt is read");
        let sent = [by("a", 1), EffectRecord { dispatches: 2, ..by("b", 1) }];
        let listed = sent_by_stopped(&sent.iter().collect::<Vec<_>>());
        let sources: Vec<EffectSource> = listed.iter().map(|e| e.source).collect();
        assert_eq!(sources, [EffectSource::Fresh, EffectSource::Redispatched]);
    }

    #[test]
    fn an_effect_written_before_the_stamp_is_the_stopped_attempts_unless_an_attempt_lists_it() {
        let by = |key: &str, attempt: u32| EffectRecord { key: key.into(), attempt, ..effect(EffectStatus::Retryable) };
        let attempt = |number: u32, keys: &[&str]| AttemptRecord {
            operation_key: "op".into(),
            run_id: "run".into(),
            step_id: "step".into(),
            tool: "tool".into(),
            attempt: number,
            max_attempts: 3,
            fence: 1,
            started_ms: 0,
            duration_us: 0,
            outcome: "transient".into(),
            message: None,
            source: AttemptSource::Fresh,
            downstream_accepted: Some(false),
            effects: keys.iter().map(|k| sent_by_stopped(&[&by(k, 0)]).remove(0)).collect(),
        };
        let keys = |effects: &[EffectRecord], recorded: u32, attempts: &[AttemptRecord]| -> Vec<String> {
            unrecorded_sends(effects, recorded, attempts).iter().map(|e| e.key.clone()).collect()
        };
        let upgraded = [by("a", 0), by("b", 0)];
        assert!(reads_attempts(&upgraded));
        // An old host wrote `a` ahead and stopped before recording its first attempt: it counts.
        assert_eq!(keys(&upgraded[..1], 0, &[]), ["a"]);
        // Attempt 1 recorded `a`; `b` was written by the attempt that stopped after it.
        assert_eq!(keys(&upgraded, 1, &[attempt(1, &["a"])]), ["b"]);
        // Both recorded: the stopped attempt wrote nothing, and the take-over is not an attempt.
        assert_eq!(keys(&upgraded, 2, &[attempt(1, &["a"]), attempt(2, &["b"])]), Vec::<String>::new());
        // Recovery judges them the same way: the stopped attempt is recorded, `b` in it.
        let op = OperationRecord {
            key: "op".into(),
            run_id: "run".into(),
            step_id: "step".into(),
            tool: "tool".into(),
            class: oncebox_core::policy::ReplayClass::Irreversible,
            fingerprint: "f".into(),
            args: serde_json::Value::Null,
            sealed: None,
            status: OperationStatus::Claimed,
            owner: "stopped".into(),
            lease_until_ms: 1,
            fence: 1,
            attempts: 1,
            output: None,
            error: None,
            created_ms: 1,
            updated_ms: 1,
            reconciled: None,
        };
        let unknown = [EffectRecord { status: EffectStatus::Dispatched, ..by("b", 0) }, by("a", 0)];
        let recovered = recovered(op, unknown.to_vec(), &[attempt(1, &["a"])], 5);
        let stopped =
            recovered.attempt.map(|a| (a.attempt, a.effects.iter().map(|e| e.key.clone()).collect::<Vec<_>>()));
        assert_eq!(stopped, Some((2, vec!["b".to_string()])));
    }
}
