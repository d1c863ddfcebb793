//! Every table of the ledger, in one place. Values are JSON so that `oncebox ledger show` and a
//! person with a hex dump can read them; the schema version guards the layout.

use redb::TableDefinition;

/// (operation key, kind, id) -> an operation's `OperationRecord` (kind `OPERATION`, id ""), its
/// `AttemptRecord`s (`ATTEMPT`, the number as ten digits) and its `EffectRecord`s (`EFFECT`, the
/// effect key). One table, so that an operation's records sort together: a call's writes land on
/// one page of the tree rather than on one page in each of three tables, and a commit writes and
/// fsyncs every page it touched.
pub const RECORDS: TableDefinition<RecordKey, &[u8]> = TableDefinition::new("records");
pub type RecordKey = (&'static str, u8, &'static str);
pub const OPERATION: u8 = 0;
pub const ATTEMPT: u8 = 1;
pub const EFFECT: u8 = 2;
/// What retention left of a removed operation (`Tombstone`, id ""): its other records are gone.
pub const TOMBSTONE: u8 = 3;
/// (run id, step id, tool) -> operation key: a run's steps
pub const RUN_STEPS: TableDefinition<(&str, &str, &str), &str> = TableDefinition::new("run_steps");
/// (namespace, key) -> the key's version (8 bytes, little-endian) and then its value: the tools'
/// durable key-value state. The version sits in the value so that a versioned write touches no
/// other table (every table a commit touches is another page to write and fsync).
pub const KV: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("kv");
/// sequence number -> `OutboxMessage`
pub const OUTBOX: TableDefinition<u64, &[u8]> = TableDefinition::new("outbox");
/// operation key -> `ApprovalRecord`: requests for approval and their decisions
pub const APPROVALS: TableDefinition<&str, &[u8]> = TableDefinition::new("approvals");
/// (topic, sequence number) -> (): the outbox messages not delivered yet, a topic's in order.
/// Written with the message, removed when its delivery is recorded, so that the relay reads a
/// topic's head without scanning every message ever sent.
pub const OUTBOX_PENDING: TableDefinition<(&str, u64), ()> = TableDefinition::new("outbox_pending");
/// A message of the host's own (`Store::enqueue_once`): `TOPIC\nKEY` -> its sequence number in `OUTBOX`.
/// Made by the first such message (a ledger without it has none), so no schema version names it.
pub const NOTICES: TableDefinition<&str, u64> = TableDefinition::new("notices");
/// (run id, operation key) -> (): the index of open work. Every operation or request for approval
/// that the one rule (`run_state::open_reasons`) names as keeping its run open, kept in the
/// transaction of each state change (`open_index.rs`), so that what runs in the background or
/// draws a view reads what is open, never every operation ever recorded.
pub const OPEN: TableDefinition<(&str, &str), ()> = TableDefinition::new("open");
/// (last written, operation key) -> (): the completed and failed operations, oldest first, so that
/// retention visits what expired and nothing else. Written with the open index (an operation
/// that ended is written no more), removed with the operation.
pub const ENDED: TableDefinition<(u64, &str), ()> = TableDefinition::new("ended");
/// (last written, operation key) -> (): the requests for approval by when they were last written
/// (`ApprovalRecord::last_written`), oldest first, so that retention visits the requests older
/// than its cutoff and nothing else. Kept in the transaction of every write and removal of a
/// request (`aged.rs`).
pub const ASKED: TableDefinition<(u64, &str), ()> = TableDefinition::new("asked");
/// (delivered at, sequence number) -> (): the outbox messages delivered, by their delivery, so
/// that retention visits those delivered before its cutoff. Written with the delivery (which is
/// final), removed with the message (`aged.rs`).
pub const DELIVERED: TableDefinition<(u64, u64), ()> = TableDefinition::new("delivered");
/// The requests for approval of each run: (run id, operation key). What a run's page, its
/// compensation and `GET /v1/runs/R` read of its requests, O(the run's), instead of every request
/// ever kept. Kept with `ASKED`, in the transaction of each write and removal of a request.
pub const ASKED_BY_RUN: TableDefinition<(&str, &str), ()> = TableDefinition::new("asked_by_run");
/// The tombstones of each run: (run id, operation key) -> (). What a run's compensation reads to
/// find the steps whose records retention removed (`Store::tombstones`), O(the run's), instead of
/// every tombstone ever left. Written with the tombstone, in the transaction that removes the
/// operation; tombstones are never removed, so neither are their entries here.
pub const TOMBSTONES_BY_RUN: TableDefinition<(&str, &str), ()> = TableDefinition::new("tombstones_by_run");
/// name -> number: schema version, outbox sequence
pub const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

pub const SCHEMA_VERSION_KEY: &str = "schema_version";
/// 2: operations, attempts and effects in one table (`RECORDS`).
/// 3: KV values carry their version (`KV`); a schema 2 ledger is migrated at open.
/// 4: outbox messages carry their delivery, and the undelivered ones are indexed by topic
/// (`OUTBOX_PENDING`); a schema 2 or 3 ledger is migrated at open (every message pending).
/// 5: the index of open work (`OPEN`) and of ended operations (`ENDED`); an older ledger is
/// indexed at open, once.
/// 6: the requests for approval by age (`ASKED`) and by run (`ASKED_BY_RUN`), and the delivered
/// outbox messages by delivery (`DELIVERED`); an older ledger is indexed at open, once.
/// 7: the tombstones by run (`TOMBSTONES_BY_RUN`); an older ledger is indexed at open, once.
pub const SCHEMA_VERSION: u64 = 7;
pub const OUTBOX_SEQ_KEY: &str = "outbox_seq";
/// The highest fence a durable operation holds (`open::keep_fence`).
pub const HIGHEST_FENCE_KEY: &str = "highest_fence";

/// The key of an operation's own record.
pub fn operation_id(key: &str) -> (&str, u8, &str) {
    (key, OPERATION, "")
}

/// A KV entry as stored: the version, then the value.
pub fn kv_encode(version: u64, value: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(8 + value.len());
    bytes.extend_from_slice(&version.to_le_bytes());
    bytes.extend_from_slice(value);
    bytes
}

/// A stored KV entry's version and value; `None` for bytes too short to hold a version.
pub fn kv_decode(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let (version, value) = bytes.split_first_chunk::<8>()?;
    Some((u64::from_le_bytes(*version), value))
}

/// The id of an attempt: its number, padded so that attempts sort in order.
pub fn attempt_id(number: u32) -> String {
    format!("{number:010}")
}
