//! What retention visits, by age: the requests for approval by when they were last written
//! (`ASKED`, by [`ApprovalRecord::last_written`], the one rule; and by run, `ASKED_BY_RUN`, what a
//! run's views read) and the delivered outbox messages
//! by their delivery (`DELIVERED`), kept in the transaction of each write, and what reads them.
//! (The operations that ended are `ENDED`, kept with the index of open work: `open_index.rs`.)
//!
//! How each path grows:
//! - [`asked`], run by every job that writes or removes a request: O(1) entries;
//! - [`delivered`], run by a delivery's write: O(1);
//! - [`approvals_before`], [`delivered_before`]: O(entries before the cutoff);
//! - [`approvals_of_run`]: O(the run's requests);
//! - [`prune_outbox`]: O(messages named);
//! - [`build`], the one-time migration of a ledger of schema 5 or older: O(requests + messages), once.

use redb::{ReadableDatabase, ReadableTable, WriteTransaction};

use super::tables::*;
use super::{ApprovalRecord, LedgerError, OutboxMessage, decode, get};
use crate::Pruned;

/// Moves request `key`'s entries in `ASKED` and `ASKED_BY_RUN` from its record before the write
/// (`old`) to its record after it (`new`; `None`: removed). In the job's transaction.
pub(super) fn asked(
    txn: &WriteTransaction,
    key: &str,
    old: Option<&ApprovalRecord>,
    new: Option<&ApprovalRecord>,
) -> Result<(), LedgerError> {
    let (mut asked, mut by_run) = (txn.open_table(ASKED)?, txn.open_table(ASKED_BY_RUN)?);
    if let Some(old) = old {
        asked.remove((old.last_written(), key))?;
        by_run.remove((old.run_id.as_str(), key))?;
    }
    if let Some(new) = new {
        asked.insert((new.last_written(), key), ())?;
        by_run.insert((new.run_id.as_str(), key), ())?;
    }
    Ok(())
}

/// The requests for approval of `run`, in operation key order: O(the run's requests).
pub(super) fn approvals_of_run(db: &redb::Database, run: &str) -> Result<Vec<ApprovalRecord>, LedgerError> {
    let txn = db.begin_read()?;
    let (by_run, approvals) = (txn.open_table(ASKED_BY_RUN)?, txn.open_table(APPROVALS)?);
    let mut out = Vec::new();
    for entry in by_run.range((run, "")..)? {
        let (entry, _) = entry?;
        let (of, key) = entry.value();
        if of != run {
            break;
        }
        let request: ApprovalRecord = get(&approvals, key)?
            .ok_or_else(|| LedgerError::Corrupt { what: format!("request {key} is indexed by run but missing") })?;
        out.push(request);
    }
    Ok(out)
}

/// Indexes a message whose delivery was just recorded as done (a delivery is final: it is
/// written once).
pub(super) fn delivered(txn: &WriteTransaction, message: &OutboxMessage) -> Result<(), LedgerError> {
    if let Some(at) = message.delivery.delivered_ms {
        txn.open_table(DELIVERED)?.insert((at, message.seq), ())?;
    }
    Ok(())
}

/// The requests for approval last written before `cutoff_ms`, oldest first (then in key order).
pub(super) fn approvals_before(db: &redb::Database, cutoff_ms: u64) -> Result<Vec<ApprovalRecord>, LedgerError> {
    let txn = db.begin_read()?;
    let (asked, approvals) = (txn.open_table(ASKED)?, txn.open_table(APPROVALS)?);
    let mut out = Vec::new();
    for entry in asked.range(..(cutoff_ms, ""))? {
        let (key, _) = entry?;
        let key = key.value().1;
        let request: ApprovalRecord = get(&approvals, key)?
            .ok_or_else(|| LedgerError::Corrupt { what: format!("request {key} is indexed by age but missing") })?;
        out.push(request);
    }
    Ok(out)
}

/// The outbox messages delivered before `cutoff_ms`, in order of delivery.
pub(super) fn delivered_before(db: &redb::Database, cutoff_ms: u64) -> Result<Vec<OutboxMessage>, LedgerError> {
    let txn = db.begin_read()?;
    let (delivered, messages) = (txn.open_table(DELIVERED)?, txn.open_table(OUTBOX)?);
    let mut out = Vec::new();
    for entry in delivered.range(..(cutoff_ms, 0))? {
        let (key, _) = entry?;
        let seq = key.value().1;
        let message: OutboxMessage = get(&messages, seq)?
            .ok_or_else(|| LedgerError::Corrupt { what: format!("outbox message {seq} is delivered but missing") })?;
        out.push(message);
    }
    Ok(out)
}

/// The write job of `Store::prune_outbox`: each delivered message of `seqs`, its entry in
/// `DELIVERED`, and the notice key that names it.
pub(super) fn prune_outbox(txn: &WriteTransaction, seqs: &[u64]) -> Result<Pruned, LedgerError> {
    let mut messages = txn.open_table(OUTBOX)?;
    let mut delivered = txn.open_table(DELIVERED)?;
    let mut notices = txn.open_table(NOTICES)?;
    let mut pruned = Pruned::default();
    for &seq in seqs {
        let Some(message) = get::<_, OutboxMessage>(&messages, seq)? else { continue };
        let Some(at) = message.delivery.delivered_ms else { continue };
        messages.remove(seq)?;
        delivered.remove((at, seq))?;
        pruned.messages += 1;
        let noticed = format!("{}\n{}", message.topic, message.effect_key);
        if notices.get(noticed.as_str())?.is_some_and(|named| named.value() == seq) {
            notices.remove(noticed.as_str())?;
            pruned.notices += 1;
        }
    }
    Ok(pruned)
}

/// Indexes the requests and the delivered messages of a ledger made before these indexes
/// (schema 5 and older): reads each once. Runs at open, in the migration's transaction. Answers
/// how many records it read.
pub(super) fn build(txn: &WriteTransaction) -> Result<usize, LedgerError> {
    let mut read = 0;
    let (mut asked, mut by_run) = (txn.open_table(ASKED)?, txn.open_table(ASKED_BY_RUN)?);
    for entry in txn.open_table(APPROVALS)?.iter()? {
        let (key, value) = entry?;
        let request: ApprovalRecord = decode("approvals", key.value(), value.value())?;
        asked.insert((request.last_written(), request.operation_key.as_str()), ())?;
        by_run.insert((request.run_id.as_str(), request.operation_key.as_str()), ())?;
        read += 1;
    }
    let mut delivered = txn.open_table(DELIVERED)?;
    for entry in txn.open_table(OUTBOX)?.iter()? {
        let (seq, value) = entry?;
        let seq = seq.value();
        let message: OutboxMessage = decode("outbox", &seq.to_string(), value.value())?;
        if let Some(at) = message.delivery.delivered_ms {
            delivered.insert((at, seq), ())?;
        }
        read += 1;
    }
    Ok(read)
}

#[cfg(test)]
mod tests {
    use redb::{Database, ReadableTableMetadata};

    use super::super::RedbStore;
    use super::*;
    use crate::{ApprovalState, DeliveryAnswer, Store};

    fn request(key: &str, revision: u32, state: ApprovalState, requested_ms: u64) -> ApprovalRecord {
        ApprovalRecord {
            operation_key: key.into(),
            fingerprint: "f".into(),
            component: None,
            run_id: "run".into(),
            step_id: key.into(),
            tool: "ship".into(),
            description: String::new(),
            consequence: None,
            args: serde_json::Value::Null,
            sealed: None,
            requested_ms,
            state,
            decided_by: None,
            decided_ms: None,
            note: None,
            expires_ms: None,
            revision,
        }
    }

    fn entries(path: &std::path::Path) -> (usize, usize) {
        let db = Database::open(path).expect("open");
        let txn = db.begin_read().expect("read");
        let asked = txn.open_table(ASKED).expect("asked").len().expect("len");
        let by_run = txn.open_table(ASKED_BY_RUN).expect("asked by run").len().expect("len");
        assert_eq!(asked, by_run, "one entry by run for each by age");
        let delivered = txn.open_table(DELIVERED).expect("delivered").len().expect("len");
        (asked as usize, delivered as usize)
    }

    /// A ledger of the last release (schema 5: no index by age) is indexed at its first open, so
    /// that gc finds the requests and messages it holds; the index then holds one entry per
    /// request and per delivered message, whatever was rewritten.
    #[tokio::test]
    async fn a_ledger_of_schema_5_is_indexed_by_age_at_its_first_open() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("old.redb");
        {
            let store = RedbStore::open(&path).expect("open");
            store.put_approval(&request("a", 1, ApprovalState::Pending, 10)).await.expect("ask");
            store.put_approval(&request("a", 2, ApprovalState::Pending, 50)).await.expect("ask again");
            let decided = ApprovalRecord { decided_ms: Some(30), ..request("b", 2, ApprovalState::Rejected, 10) };
            store.put_approval(&request("b", 1, ApprovalState::Pending, 10)).await.expect("ask");
            store.put_approval(&decided).await.expect("reject");
            for key in ["n1", "n2"] {
                store.enqueue_once("notify", key, "{}").await.expect("enqueue");
            }
            store.record_delivery(1, &DeliveryAnswer::Delivered { at_ms: 40 }).await.expect("deliver");
        }
        assert_eq!(entries(&path), (2, 1), "kept with each write, the old entry of a rewrite gone");
        // Make it a schema 5 file.
        {
            let db = Database::create(&path).expect("open");
            let txn = db.begin_write().expect("write");
            txn.delete_table(ASKED).expect("delete");
            txn.delete_table(ASKED_BY_RUN).expect("delete");
            txn.delete_table(DELIVERED).expect("delete");
            txn.open_table(META).expect("meta").insert(SCHEMA_VERSION_KEY, 5).expect("version");
            txn.commit().expect("commit");
        }
        let store = RedbStore::open(&path).expect("reopen");
        for cutoff in [0, 30, 31, 50, 51, u64::MAX] {
            let indexed = Store::approvals_before(&store, cutoff).await.expect("indexed");
            assert_eq!(indexed, crate::scan_approvals_before(&store, cutoff).await.expect("scanned"), "at {cutoff}");
            let delivered = Store::delivered_before(&store, cutoff).await.expect("indexed");
            assert_eq!(delivered, crate::scan_delivered_before(&store, cutoff).await.expect("scanned"), "at {cutoff}");
        }
        let keys: Vec<String> =
            Store::approvals_before(&store, 51).await.expect("read").into_iter().map(|a| a.operation_key).collect();
        assert_eq!(keys, ["b", "a"]);
        let of_run = |run: &str| {
            store.approvals(Some(run)).map(|all| all.iter().map(|a| a.operation_key.clone()).collect::<Vec<_>>())
        };
        assert_eq!(of_run("run").expect("read"), ["a", "b"], "a run's requests, by its index");
        assert_eq!(of_run("other").expect("read"), Vec::<String>::new());
        assert_eq!(Store::delivered_before(&store, 41).await.expect("read").len(), 1);
        drop(store);
        assert_eq!(entries(&path), (2, 1));
    }
}
