//! What retention left of a run: its tombstones by run (`TOMBSTONES_BY_RUN`), kept in the
//! transaction that removes the operations, and what reads them.
//!
//! How each path grows:
//! - [`leave`], run by gc's removal: O(1) entries per tombstone;
//! - [`of_run`], what a run's compensation reads: O(the run's tombstones);
//! - [`build`], the one-time migration of a ledger of schema 6 or older: O(records), once.

use redb::{ReadableDatabase, ReadableTable, Table, WriteTransaction};

use super::tables::*;
use super::{LedgerError, Tombstone, decode, get, put};

/// Leaves `tombstone` for its operation, and its entry in the index by run.
pub(super) fn leave(
    records: &mut Table<RecordKey, &'static [u8]>,
    by_run: &mut Table<(&'static str, &'static str), ()>,
    tombstone: &Tombstone,
) -> Result<(), LedgerError> {
    let key = tombstone.operation_key.as_str();
    put(records, (key, TOMBSTONE, ""), tombstone)?;
    by_run.insert((tombstone.run_id.as_str(), key), ())?;
    Ok(())
}

/// Run `run_id`'s tombstones, in operation key order.
pub(super) fn of_run(db: &redb::Database, run_id: &str) -> Result<Vec<Tombstone>, LedgerError> {
    let txn = db.begin_read()?;
    let (by_run, records) = (txn.open_table(TOMBSTONES_BY_RUN)?, txn.open_table(RECORDS)?);
    let mut out = Vec::new();
    for entry in by_run.range((run_id, "")..)? {
        let (entry, _) = entry?;
        let (run, key) = entry.value();
        if run != run_id {
            break;
        }
        // An entry without its tombstone would be a torn write; none is made (one transaction).
        if let Some(tombstone) = get(&records, (key, TOMBSTONE, ""))? {
            out.push(tombstone);
        }
    }
    Ok(out)
}

/// Indexes the tombstones of a ledger made before the index (schema 6 and older): reads every
/// record once, since tombstones sit beside the operations' records. Runs at open, in the
/// migration's transaction. Answers how many records it read.
pub(super) fn build(txn: &WriteTransaction) -> Result<usize, LedgerError> {
    let records = txn.open_table(RECORDS)?;
    let mut by_run = txn.open_table(TOMBSTONES_BY_RUN)?;
    let mut read = 0;
    for entry in records.iter()? {
        let (key, value) = entry?;
        read += 1;
        let (operation_key, kind, _) = key.value();
        if kind != TOMBSTONE {
            continue;
        }
        let tombstone: Tombstone = decode("records", operation_key, value.value())?;
        by_run.insert((tombstone.run_id.as_str(), operation_key), ())?;
    }
    Ok(read)
}

#[cfg(test)]
mod tests {
    use redb::Database;

    use super::super::RedbStore;
    use super::*;
    use crate::{OperationStatus, Store};
    use oncebox_core::policy::ReplayClass;

    fn stone(key: &str, run: &str) -> Tombstone {
        Tombstone {
            operation_key: key.into(),
            run_id: run.into(),
            step_id: key.into(),
            tool: "charge".into(),
            fingerprint: "f".into(),
            status: OperationStatus::Completed,
            ended_ms: 5,
            removed_ms: 6,
            rejected: false,
            class: Some(ReplayClass::Compensatable),
        }
    }

    /// A ledger of the last release (schema 6: tombstones, no index of them by run) is indexed at
    /// its first open, so that a compensation of a run finds what retention removed of it before.
    #[tokio::test]
    async fn a_ledger_of_schema_6_has_its_tombstones_indexed_by_run_at_its_first_open() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("old.redb");
        let stones = [stone("t2", "r"), stone("t1", "other"), stone("t0", "r")];
        {
            let store = RedbStore::open(&path).expect("open");
            store.expire(&stones, &[]).await.expect("expire");
            assert_eq!(store.tombstones("r").expect("read"), [stones[2].clone(), stones[0].clone()]);
        }
        // Make it a schema 6 file.
        {
            let db = Database::create(&path).expect("open");
            let txn = db.begin_write().expect("write");
            txn.delete_table(TOMBSTONES_BY_RUN).expect("delete");
            txn.open_table(META).expect("meta").insert(SCHEMA_VERSION_KEY, 6).expect("version");
            txn.commit().expect("commit");
        }
        let store = RedbStore::open(&path).expect("reopen");
        assert_eq!(store.tombstones("r").expect("read"), [stones[2].clone(), stones[0].clone()]);
        assert_eq!(store.tombstones("other").expect("read"), [stones[1].clone()]);
        assert!(store.tombstones("nobody").expect("read").is_empty());
        assert!(store.tombstones("").expect("read").is_empty());
    }
}
