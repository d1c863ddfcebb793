//! The index of open work (`OPEN`): the keys the one rule names as keeping their run open
//! (`run_state::open_keys`), kept in the transaction of every state change, and what reads it.
//!
//! How each path grows:
//! - [`reindex`], run by every job that changes an operation's status or a request for approval:
//!   O(the keys it touched + the run's open keys), and O(the run's operations) once the run's
//!   compensation started (only compensation ties a record's openness to its run's others);
//! - [`open_runs`]: O(open keys + claims in flight), plus the operations of runs being compensated;
//! - [`build`], the one-time migration of an older ledger: O(history), once.

use std::collections::{BTreeMap, BTreeSet};

use redb::{ReadableTable, WriteTransaction};

use super::tables::*;
use super::{ApprovalRecord, LedgerError, OperationRecord, decode, get};
use crate::run_state::{self, Open};
use oncebox_core::keys::COMPENSATION_PREFIX;

/// Brings the index up to date for run `run` after a job changed the records of `touched` (its
/// keys: operations written or removed, requests for approval written or removed). Call it after
/// the job's own tables are closed, in the job's transaction.
pub(super) fn reindex(txn: &WriteTransaction, run: &str, touched: &[&str]) -> Result<(), LedgerError> {
    let records = txn.open_table(RECORDS)?;
    let approvals = txn.open_table(APPROVALS)?;
    let steps = txn.open_table(RUN_STEPS)?;
    let mut open = txn.open_table(OPEN)?;
    // What may change: the touched keys and what the index holds of the run (a step whose
    // compensation just completed leaves it); every step of a run being compensated.
    let mut keys: BTreeSet<String> = touched.iter().map(|key| key.to_string()).collect();
    keys.extend(indexed(&open, run)?);
    if compensating(&steps, run)? {
        keys.extend(run_keys(&steps, run)?);
    }
    let (ops, asked) = records_of(&records, &approvals, &keys)?;
    let mut ended = txn.open_table(ENDED)?;
    for op in ops.iter().filter(|op| crate::expirable(op).is_ok()) {
        ended.insert((op.updated_ms, op.key.as_str()), ())?;
    }
    let now_open = run_state::open_keys(&ops, &asked);
    for key in &keys {
        if now_open.contains(key) {
            open.insert((run, key.as_str()), ())?;
        } else {
            open.remove((run, key.as_str()))?;
        }
    }
    Ok(())
}

/// What keeps each run (or `run`) open at `now_ms`, read from the index and the claims in flight
/// (`flying`, read before this, so a claim recorded in between is read as the operation it became).
pub(super) fn open_runs(
    db: &redb::Database,
    flying: Vec<OperationRecord>,
    run: Option<&str>,
    now_ms: u64,
) -> Result<BTreeMap<String, Vec<Open>>, LedgerError> {
    use redb::ReadableDatabase;
    let txn = db.begin_read()?;
    let (records, approvals) = (txn.open_table(RECORDS)?, txn.open_table(APPROVALS)?);
    let (steps, open) = (txn.open_table(RUN_STEPS)?, txn.open_table(OPEN)?);
    let mut runs: BTreeMap<String, (BTreeSet<String>, Vec<OperationRecord>)> = BTreeMap::new();
    match run {
        Some(run) => {
            runs.entry(run.to_string()).or_default().0.extend(indexed(&open, run)?);
        }
        None => {
            for entry in open.iter()? {
                let (key, _) = entry?;
                let (run, key) = key.value();
                runs.entry(run.to_string()).or_default().0.insert(key.to_string());
            }
        }
    }
    for op in flying {
        runs.entry(op.run_id.clone()).or_default().1.push(op);
    }
    let mut out = BTreeMap::new();
    for (run, (mut keys, flying)) in runs {
        // The requests for approval that may keep the run open are indexed: a request stops
        // being open only by an operation of its key or a decision, both of which reindex it.
        let (_, asked) = records_of(&records, &approvals, &keys)?;
        if compensating(&steps, &run)? || flying.iter().any(run_state::ties_the_run) {
            keys.extend(run_keys(&steps, &run)?);
        }
        let (ops, _) = records_of(&records, &approvals, &keys)?;
        let reasons = run_state::open_reasons(&ops, &flying, &asked, now_ms);
        if !reasons.is_empty() {
            out.insert(run, reasons);
        }
    }
    Ok(out)
}

/// One page of run ids after `after`, in key order, at most `limit`: from the run index (every run
/// with an operation) and the open index (a run whose only record is a request for approval is
/// open). O(limit x steps of a run).
pub(super) fn runs_page(db: &redb::Database, after: Option<&str>, limit: usize) -> Result<Vec<String>, LedgerError> {
    use redb::ReadableDatabase;
    let txn = db.begin_read()?;
    let (steps, open) = (txn.open_table(RUN_STEPS)?, txn.open_table(OPEN)?);
    // Every run id above `after` starts at or after `after` followed by the smallest char.
    let start = after.map(|after| format!("{after}\0")).unwrap_or_default();
    let mut runs: Vec<String> = Vec::new();
    for entry in steps.range((start.as_str(), "", "")..)? {
        let (step, _) = entry?;
        let run = step.value().0;
        if runs.last().is_some_and(|last| last == run) {
            continue;
        }
        if runs.len() == limit {
            break;
        }
        runs.push(run.to_string());
    }
    let mut asked: Vec<String> = Vec::new();
    for entry in open.range((start.as_str(), "")..)? {
        let (key, _) = entry?;
        let run = key.value().0;
        if asked.last().is_some_and(|last| last == run) {
            continue;
        }
        if asked.len() == limit {
            break;
        }
        asked.push(run.to_string());
    }
    runs.extend(asked);
    Ok(crate::page_of(runs, after, limit))
}

/// The completed and failed operations last written before `cutoff_ms`, oldest first: O(expired).
pub(super) fn ended_before(db: &redb::Database, cutoff_ms: u64) -> Result<Vec<OperationRecord>, LedgerError> {
    use redb::ReadableDatabase;
    let txn = db.begin_read()?;
    let (ended, records) = (txn.open_table(ENDED)?, txn.open_table(RECORDS)?);
    let mut ops = Vec::new();
    for entry in ended.range(..(cutoff_ms, ""))? {
        let (key, _) = entry?;
        if let Some(op) = get::<_, OperationRecord>(&records, operation_id(key.value().1))? {
            ops.push(op);
        }
    }
    Ok(ops)
}

/// The operation keys the index holds (of operations and of requests), every run's.
pub(super) fn all_keys(txn: &WriteTransaction) -> Result<Vec<String>, LedgerError> {
    let mut keys = Vec::new();
    for entry in txn.open_table(OPEN)?.iter()? {
        let (key, _) = entry?;
        keys.push(key.value().1.to_string());
    }
    Ok(keys)
}

/// Builds the index of a ledger made before it (schema 4 and older): reads every operation and
/// request once. Runs at open, in the migration's transaction. Answers how many records it read,
/// and the highest fence an operation holds.
pub(super) fn build(txn: &WriteTransaction) -> Result<(usize, u64), LedgerError> {
    let mut ops = Vec::new();
    for entry in txn.open_table(RECORDS)?.iter()? {
        let (key, value) = entry?;
        let (key, kind, _) = key.value();
        if kind == OPERATION {
            ops.push(decode::<OperationRecord>("operations", key, value.value())?);
        }
    }
    let mut asked = Vec::new();
    for entry in txn.open_table(APPROVALS)?.iter()? {
        let (key, value) = entry?;
        asked.push(decode::<ApprovalRecord>("approvals", key.value(), value.value())?);
    }
    let read = ops.len() + asked.len();
    let highest_fence = ops.iter().map(|op| op.fence).max().unwrap_or(0);
    let mut ended = txn.open_table(ENDED)?;
    for op in ops.iter().filter(|op| crate::expirable(op).is_ok()) {
        ended.insert((op.updated_ms, op.key.as_str()), ())?;
    }
    let mut open = txn.open_table(OPEN)?;
    for (run, reasons) in run_state::open_runs(&ops, &[], &asked, 0) {
        for reason in reasons {
            open.insert((run.as_str(), reason.operation_key.as_str()), ())?;
        }
    }
    Ok((read, highest_fence))
}

/// The keys the index holds for `run`.
pub(super) fn indexed(
    open: &impl ReadableTable<(&'static str, &'static str), ()>,
    run: &str,
) -> Result<Vec<String>, LedgerError> {
    let mut keys = Vec::new();
    for entry in open.range((run, "")..)? {
        let (key, _) = entry?;
        let (of, key) = key.value();
        if of != run {
            break;
        }
        keys.push(key.to_string());
    }
    Ok(keys)
}

type StepKey = (&'static str, &'static str, &'static str);

/// Whether some operation of `run` is a compensation: its steps sort together under the prefix.
fn compensating(steps: &impl ReadableTable<StepKey, &'static str>, run: &str) -> Result<bool, LedgerError> {
    let first = steps.range((run, COMPENSATION_PREFIX, "")..)?.next().transpose()?;
    Ok(first.is_some_and(|(key, _)| {
        let (of, step, _) = key.value();
        of == run && step.starts_with(COMPENSATION_PREFIX)
    }))
}

/// The keys of every operation of `run`.
fn run_keys(steps: &impl ReadableTable<StepKey, &'static str>, run: &str) -> Result<Vec<String>, LedgerError> {
    let mut keys = Vec::new();
    for entry in steps.range((run, "", "")..)? {
        let (step, key) = entry?;
        if step.value().0 != run {
            break;
        }
        keys.push(key.value().to_string());
    }
    Ok(keys)
}

/// The operations and the requests for approval of `keys`, those that exist.
fn records_of(
    records: &impl ReadableTable<RecordKey, &'static [u8]>,
    approvals: &impl ReadableTable<&'static str, &'static [u8]>,
    keys: &BTreeSet<String>,
) -> Result<(Vec<OperationRecord>, Vec<ApprovalRecord>), LedgerError> {
    let (mut ops, mut asked) = (Vec::new(), Vec::new());
    for key in keys {
        if let Some(op) = get::<_, OperationRecord>(records, operation_id(key))? {
            ops.push(op);
        }
        if let Some(request) = get::<_, ApprovalRecord>(approvals, key.as_str())? {
            asked.push(request);
        }
    }
    Ok((ops, asked))
}

#[cfg(test)]
mod tests {
    use redb::{Database, ReadableDatabase};

    use super::super::RedbStore;
    use super::*;
    use crate::{AttemptRecord, AttemptSource, Claim, ClaimRequest, Store};

    fn request(run: &str, step: &str) -> ClaimRequest {
        ClaimRequest {
            key: format!("{run}/{step}"),
            run_id: run.into(),
            step_id: step.into(),
            tool: "charge".into(),
            class: oncebox_core::policy::ReplayClass::Compensatable,
            fingerprint: "f".into(),
            older_fingerprints: Vec::new(),
            args: serde_json::Value::Null,
            sealed: None,
            owner: "host".into(),
            now_ms: 1,
            lease_ms: 100,
            approval: None,
        }
    }

    async fn finished(store: &RedbStore, run: &str, step: &str, status: crate::OperationStatus) {
        let req = request(run, step);
        let Ok(Claim::Owned { fence, .. }) = store.claim(&req).await else { panic!("not claimed") };
        let attempt = AttemptRecord {
            operation_key: req.key.clone(),
            run_id: run.into(),
            step_id: step.into(),
            tool: "charge".into(),
            attempt: 1,
            max_attempts: 3,
            fence,
            started_ms: 1,
            duration_us: 0,
            outcome: "ok".into(),
            message: None,
            source: AttemptSource::Fresh,
            downstream_accepted: None,
            effects: Vec::new(),
        };
        store.record_attempt(fence, &attempt, Some((status, None, None)), 2, Vec::new()).await.expect("record");
    }

    fn indexed_keys(path: &std::path::Path) -> Vec<(String, String)> {
        let db = Database::open(path).expect("open");
        let txn = db.begin_read().expect("read");
        let open = txn.open_table(OPEN).expect("table");
        let mut keys = Vec::new();
        for entry in open.iter().expect("iter") {
            let (guard, _) = entry.expect("entry");
            let (run, key) = guard.value();
            keys.push((run.to_string(), key.to_string()));
        }
        keys
    }

    #[tokio::test]
    async fn a_ledger_made_before_the_index_is_indexed_at_its_first_open_and_holds_only_what_is_open() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("old.redb");
        {
            let store = RedbStore::open(&path).expect("open");
            for n in 0..20 {
                finished(&store, &format!("done-{n}"), "a", crate::OperationStatus::Completed).await;
            }
            finished(&store, "doubt", "a", crate::OperationStatus::Unknown).await;
            finished(&store, "doubt", "b", crate::OperationStatus::Completed).await;
        }
        assert_eq!(indexed_keys(&path), [("doubt".to_string(), "doubt/a".to_string())], "kept with each change");
        // Make it a schema 4 file: no index, no kept fence.
        {
            let db = Database::create(&path).expect("open");
            let txn = db.begin_write().expect("write");
            txn.delete_table(OPEN).expect("delete");
            {
                let mut meta = txn.open_table(META).expect("meta");
                meta.insert(SCHEMA_VERSION_KEY, 4).expect("version");
                meta.remove(HIGHEST_FENCE_KEY).expect("fence");
            }
            txn.commit().expect("commit");
        }
        let store = RedbStore::open(&path).expect("reopen");
        let now = store.now_ms();
        let indexed = Store::open_runs(&store, None, now).await.expect("indexed");
        assert_eq!(indexed, crate::scan_open_runs(&store, None, now).await.expect("scanned"));
        assert_eq!(indexed.keys().collect::<Vec<_>>(), ["doubt"]);
        drop(store);
        assert_eq!(indexed_keys(&path), [("doubt".to_string(), "doubt/a".to_string())]);
    }
}
