//! Opening a ledger file: the schema check, and the recovery of what a stopped host left behind.
//! Both run before the writer starts.

use std::path::Path;

use redb::{Database, ReadableTable};

use super::tables::*;
use super::{LedgerError, OperationRecord, OperationStatus, effects_of, put};

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
            Some(older @ 2..=6) => {
                if older == 2 {
                    migrate_kv_versions(&txn)?;
                }
                if older <= 3 {
                    super::outbox::migrate_pending(&txn)?;
                }
                let mut read = 0;
                if older <= 4 {
                    let (records, highest_fence) = super::open_index::build(&txn)?;
                    meta.insert(HIGHEST_FENCE_KEY, highest_fence)?;
                    read += records;
                }
                if older <= 5 {
                    read += super::aged::build(&txn)?;
                }
                read += super::tombstones::build(&txn)?;
                meta.insert(SCHEMA_VERSION_KEY, SCHEMA_VERSION)?;
                tracing::info!(
                    ledger = %path.display(),
                    from = older,
                    to = SCHEMA_VERSION,
                    records = read,
                    "built the ledger's indexes of open work, of what retention visits and of what it left, once: from now on they are read"
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
        txn.open_table(ASKED)?;
        txn.open_table(ASKED_BY_RUN)?;
        txn.open_table(DELIVERED)?;
        txn.open_table(TOMBSTONES_BY_RUN)?;
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
        for op in claimed {
            let effects = effects_of(&records, &op.key)?;
            let attempts = match crate::rules::reads_attempts(&effects) {
                true => super::attempts_of(&records, &op.key)?,
                false => Vec::new(),
            };
            let recovered = crate::rules::recovered(op, effects, &attempts, now_ms);
            let key = recovered.op.key.as_str();
            for effect in &recovered.changed {
                put(&mut records, (key, EFFECT, effect.key.as_str()), effect)?;
            }
            if let Some(attempt) = &recovered.attempt {
                put(&mut records, (key, ATTEMPT, attempt_id(attempt.attempt).as_str()), attempt)?;
            }
            put(&mut records, operation_id(key), &recovered.op)?;
        }
    }
    txn.commit()?;
    Ok(highest_fence)
}
