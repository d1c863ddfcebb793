//! Opening a ledger file: the schema check, and the recovery of what a stopped host left behind.
//! Both run before the writer starts.

use std::path::Path;

use redb::{Database, ReadableTable};

use super::tables::*;
use super::{AttemptRecord, EffectStatus, ErrorRecord, LedgerError, OperationRecord, OperationStatus, effects_of, put};

/// Creates the tables and checks the schema version. Runs before the writer starts.
pub(super) fn init(db: &Database, path: &Path) -> Result<(), LedgerError> {
    let txn = db.begin_write()?;
    {
        let mut meta = txn.open_table(META)?;
        let version = meta.get(SCHEMA_VERSION_KEY)?.map(|v| v.value());
        match version {
            None => {
                meta.insert(SCHEMA_VERSION_KEY, SCHEMA_VERSION)?;
            }
            Some(SCHEMA_VERSION) => {}
            Some(older @ 2..=4) => {
                if older == 2 {
                    migrate_kv_versions(&txn)?;
                }
                if older <= 3 {
                    super::outbox::migrate_pending(&txn)?;
                }
                let (read, highest_fence) = super::open_index::build(&txn)?;
                meta.insert(HIGHEST_FENCE_KEY, highest_fence)?;
                meta.insert(SCHEMA_VERSION_KEY, SCHEMA_VERSION)?;
                tracing::info!(
                    ledger = %path.display(),
                    from = older,
                    to = SCHEMA_VERSION,
                    records = read,
                    "built the ledger's index of open work, once: from now on what is open is read from it"
                );
            }
            Some(other) => {
                return Err(LedgerError::Corrupt {
                    what: format!(
                        "{}: schema version {other}, this oncebox reads version {SCHEMA_VERSION}",
                        path.display()
                    ),
                });
            }
        }
        // Create every table, so read transactions never meet a missing one.
        txn.open_table(RECORDS)?;
        txn.open_table(RUN_STEPS)?;
        txn.open_table(KV)?;
        txn.open_table(OUTBOX)?;
        // Added to schema 3 without a change of layout: a file without it gets it here.
        txn.open_table(APPROVALS)?;
        txn.open_table(OUTBOX_PENDING)?;
        txn.open_table(OPEN)?;
        txn.open_table(ENDED)?;
    }
    txn.commit()?;
    Ok(())
}

/// Schema 2 to 3: every KV value gains a version (1: written before versions existed; later
/// writes stamp versions derived from their effect keys, never 1 in practice and never 0).
fn migrate_kv_versions(txn: &redb::WriteTransaction) -> Result<(), LedgerError> {
    let mut kv = txn.open_table(KV)?;
    let mut entries = Vec::new();
    for entry in kv.iter()? {
        let (key, value) = entry?;
        let (namespace, key) = key.value();
        entries.push((namespace.to_string(), key.to_string(), value.value().to_vec()));
    }
    for (namespace, key, value) in entries {
        kv.insert((namespace.as_str(), key.as_str()), kv_encode(1, &value).as_slice())?;
    }
    Ok(())
}

/// Keeps the highest fence a durable operation holds in `META`, so that opening the ledger finds
/// it without reading every operation. New operations hold fence 1, drawn from no counter; a
/// job that writes an operation with a drawn fence (a take-over, a reopen, the first write of a
/// claim taken over in memory) keeps it here, in its transaction.
pub(super) fn keep_fence(txn: &redb::WriteTransaction, fence: u64) -> Result<(), LedgerError> {
    if fence <= 1 {
        return Ok(());
    }
    let mut meta = txn.open_table(META)?;
    let kept = meta.get(HIGHEST_FENCE_KEY)?.map_or(0, |v| v.value());
    if fence > kept {
        meta.insert(HIGHEST_FENCE_KEY, fence)?;
    }
    Ok(())
}

/// Effects written ahead but never answered become `unknown`, operations holding one become
/// `unknown`, and the other claims lose their lease. Runs at open, before the writer starts.
/// Returns the highest fence on disk, above which new take-overs draw theirs.
/// O(open): a claimed operation keeps its run open, so the index of open work lists every one
/// (`open_index.rs`), and the highest fence is kept (`keep_fence`).
pub(super) fn recover(db: &Database, now_ms: u64) -> Result<u64, LedgerError> {
    let txn = db.begin_write()?;
    let mut highest_fence = txn.open_table(META)?.get(HIGHEST_FENCE_KEY)?.map_or(0, |v| v.value());
    {
        let mut records = txn.open_table(RECORDS)?;
        let mut claimed = Vec::new();
        for key in super::open_index::all_keys(&txn)? {
            let Some(op) = super::get::<_, OperationRecord>(&records, operation_id(&key))? else { continue };
            highest_fence = highest_fence.max(op.fence);
            if op.status == OperationStatus::Claimed {
                claimed.push(op);
            }
        }
        for mut op in claimed {
            let mut in_doubt = None;
            let mut effects = effects_of(&records, &op.key)?;
            for effect in &mut effects {
                if effect.status == EffectStatus::Dispatched {
                    effect.status = EffectStatus::Unknown;
                    effect.error = Some("the host stopped before the answer arrived".into());
                    effect.updated_ms = now_ms;
                    put(&mut records, (op.key.as_str(), EFFECT, effect.key.as_str()), &*effect)?;
                }
                if effect.status.in_doubt() {
                    in_doubt.get_or_insert(effect.key.clone());
                }
            }
            if let Some(effect_key) = in_doubt {
                let error = ErrorRecord {
                    class: "unknown-outcome".into(),
                    message: format!(
                        "the host stopped while effect {effect_key} was in flight; reconcile before retrying"
                    ),
                };
                // The stopped attempt is one of the operation's attempts, as a take-over judges it
                // on a shared ledger (DESIGN section 7): recorded, so that a settlement that reopens
                // the step later does not count it again.
                let sent = crate::rules::unrecorded_sends(&effects, op.attempts);
                if !sent.is_empty() {
                    let number = op.attempts + 1;
                    let attempt = AttemptRecord {
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
                        source: crate::AttemptSource::Fresh,
                        downstream_accepted: Some(false),
                        effects: crate::rules::sent_by_stopped(&sent),
                    };
                    put(&mut records, (op.key.as_str(), ATTEMPT, attempt_id(number).as_str()), &attempt)?;
                    op.attempts = number;
                }
                op.status = OperationStatus::Unknown;
                op.error = Some(error);
            }
            op.lease_until_ms = 0;
            op.updated_ms = now_ms;
            put(&mut records, operation_id(&op.key), &op)?;
        }
    }
    txn.commit()?;
    Ok(highest_fence)
}
