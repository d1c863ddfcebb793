//! Every table of the ledger, in one place. Values are JSON so that `oncebox ledger show` and a
//! person with a hex dump can read them; the schema version guards the layout.

use redb::TableDefinition;

/// operation key -> `OperationRecord`
pub const OPERATIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("operations");
/// (operation key, effect key) -> `EffectRecord`
pub const EFFECTS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("effects");
/// (operation key, attempt number) -> `AttemptRecord`
pub const ATTEMPTS: TableDefinition<(&str, u32), &[u8]> = TableDefinition::new("attempts");
/// (run id, step id, tool) -> operation key: a run's steps
pub const RUN_STEPS: TableDefinition<(&str, &str, &str), &str> = TableDefinition::new("run_steps");
/// (namespace, key) -> value: the tools' durable key-value state
pub const KV: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("kv");
/// sequence number -> `OutboxMessage`
pub const OUTBOX: TableDefinition<u64, &[u8]> = TableDefinition::new("outbox");
/// name -> number: schema version, outbox sequence
pub const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

pub const SCHEMA_VERSION_KEY: &str = "schema_version";
pub const SCHEMA_VERSION: u64 = 1;
pub const OUTBOX_SEQ_KEY: &str = "outbox_seq";
