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
/// (run id, step id, tool) -> operation key: a run's steps
pub const RUN_STEPS: TableDefinition<(&str, &str, &str), &str> = TableDefinition::new("run_steps");
/// (namespace, key) -> value: the tools' durable key-value state
pub const KV: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("kv");
/// sequence number -> `OutboxMessage`
pub const OUTBOX: TableDefinition<u64, &[u8]> = TableDefinition::new("outbox");
/// name -> number: schema version, outbox sequence
pub const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

pub const SCHEMA_VERSION_KEY: &str = "schema_version";
/// 2: operations, attempts and effects in one table (`RECORDS`).
pub const SCHEMA_VERSION: u64 = 2;
pub const OUTBOX_SEQ_KEY: &str = "outbox_seq";

/// The key of an operation's own record.
pub fn operation_id(key: &str) -> (&str, u8, &str) {
    (key, OPERATION, "")
}

/// The id of an attempt: its number, padded so that attempts sort in order.
pub fn attempt_id(number: u32) -> String {
    format!("{number:010}")
}
