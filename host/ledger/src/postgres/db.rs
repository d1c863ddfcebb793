//! The plumbing under the jobs: one transaction with its statements and locks, errors that name
//! the store, records in and out of their `bytea` columns, and numbers in and out of `bigint`.

use deadpool_postgres::tokio_postgres::types::ToSql;
use deadpool_postgres::tokio_postgres::{Error, Row};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

use crate::LedgerError;

/// Statement parameters.
pub(super) type Params<'p> = [&'p (dyn ToSql + Sync)];

/// One Store call's transaction (READ COMMITTED: see `jobs.rs` for why that is enough), with the
/// store's name for its errors. Dropped without [`Tx::commit`], it rolls back: nothing of it
/// was recorded.
pub(super) struct Tx<'c> {
    pub tx: deadpool_postgres::Transaction<'c>,
    pub store: &'c str,
}

impl Tx<'_> {
    pub async fn opt(&self, sql: &str, params: &Params<'_>) -> Result<Option<Row>, LedgerError> {
        let statement = self.tx.prepare_cached(sql).await.map_err(|e| failed(self.store, sql, &e))?;
        self.tx.query_opt(&statement, params).await.map_err(|e| failed(self.store, sql, &e))
    }

    pub async fn rows(&self, sql: &str, params: &Params<'_>) -> Result<Vec<Row>, LedgerError> {
        let statement = self.tx.prepare_cached(sql).await.map_err(|e| failed(self.store, sql, &e))?;
        self.tx.query(&statement, params).await.map_err(|e| failed(self.store, sql, &e))
    }

    /// Runs a statement; returns how many rows it changed.
    pub async fn exec(&self, sql: &str, params: &Params<'_>) -> Result<u64, LedgerError> {
        let statement = self.tx.prepare_cached(sql).await.map_err(|e| failed(self.store, sql, &e))?;
        self.tx.execute(&statement, params).await.map_err(|e| failed(self.store, sql, &e))
    }

    /// Waits for the transaction-scoped advisory lock `id`, held until COMMIT or ROLLBACK. A
    /// statement of its own: in READ COMMITTED every later statement takes its snapshot after the
    /// lock was granted, so it sees everything the previous holder committed.
    pub async fn lock(&self, id: i64) -> Result<(), LedgerError> {
        self.exec("SELECT pg_advisory_xact_lock($1)", &[&id]).await.map(|_| ())
    }

    /// Takes the locks of `locks` (id, exclusive: else shared) in ascending order of id, in one
    /// statement ([`LOCK_MODES`]).
    pub async fn lock_modes(&self, locks: Vec<(i64, bool)>) -> Result<(), LedgerError> {
        let (ids, exclusive) = ordered(locks);
        self.exec(LOCK_MODES, &[&ids, &exclusive]).await.map(drop)
    }

    /// Commits; `Ok` only once the database answered the COMMIT (durably: the session runs with
    /// `synchronous_commit = on`).
    pub async fn commit(self) -> Result<(), LedgerError> {
        let store = self.store;
        self.tx.commit().await.map_err(|e| {
            let what = if e.as_db_error().is_some() {
                format!("the write was not committed: {}", describe(&e))
            } else {
                format!(
                    "the connection failed during COMMIT ({}): whether the write was recorded is known only by \
                     reading the ledger again",
                    describe(&e)
                )
            };
            LedgerError::Database { store: store.to_string(), what }
        })
    }

    /// Ends a transaction that decided to write nothing. A failure here changes nothing (the
    /// server rolls back a transaction whose connection is gone), so it is not an error.
    pub async fn rollback(self) {
        let _ = self.tx.rollback().await;
    }
}

/// A statement that failed, in one line: what it was doing and what the database said.
pub(super) fn failed(store: &str, sql: &str, e: &Error) -> LedgerError {
    let head: Vec<&str> = sql.split_whitespace().take(6).collect();
    LedgerError::Database {
        store: store.to_string(),
        what: format!("`{} ...` failed: {}", head.join(" "), describe(e)),
    }
}

/// An error of the driver in one line: the server's message and SQLSTATE, or the driver's words
/// with their causes.
pub(super) fn describe(e: &Error) -> String {
    if let Some(db) = e.as_db_error() {
        let hint = pooler_hint(db.code().code(), db.message()).map(|hint| format!(": {hint}")).unwrap_or_default();
        return format!("{} (SQLSTATE {}){hint}", db.message(), db.code().code());
    }
    let mut out = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out.replace('\n', " ")
}

/// What an error from the server means when a connection pooler stands between the host and the
/// server: the ledger needs a session of its own (its settings sent at startup, its prepared
/// statements, `LISTEN`), which a pooler in transaction mode does not keep. Each error a pooler
/// leads to, named, with what to do (docs/backends.md, "Connection poolers").
pub(super) fn pooler_hint(code: &str, message: &str) -> Option<&'static str> {
    /// What the ledger needs, and where the docs say how.
    macro_rules! session {
        () => {
            "the ledger needs a PostgreSQL session of its own: connect to the server directly, or through a \
             pooler in session mode that keeps it (docs/backends.md, connection poolers)"
        };
    }
    match code {
        // PgBouncer refuses libpq's `options`, which carry the ledger's session settings.
        "08P01" if message.contains("unsupported startup parameter") => Some(concat!(
            "a connection pooler refused the session settings every connection of the ledger starts with; ",
            session!()
        )),
        // The schema guard found no `oncebox.schema`, which this host always sets at startup.
        "OBXSC" if message.contains("= unset") => Some(concat!(
            "this host sets it when it connects, so something on the way dropped its session settings (a \
             pooler's ignore_startup_parameters); ",
            session!()
        )),
        // Another client's prepared statements on this server connection: a pooler handing one
        // server session to several clients, a transaction at a time.
        "26000" | "42P05" if message.contains("prepared statement") => Some(session!()),
        _ => None,
    }
}

/// The advisory lock of everything about operation `key`: its row (or its absence), its
/// approval, its tombstone. Taken first by every write about the operation.
pub(super) fn operation_lock(key: &str) -> i64 {
    lock_id(&[b"operation", key.as_bytes()])
}

/// The advisory lock of a run, taken by every write that changes the status of one of its
/// operations or a request for approval of it: shared by an ordinary step's, exclusive by a
/// compensation's (`index.rs` says why).
pub(super) fn run_lock(run: &str) -> i64 {
    lock_id(&[b"run", run.as_bytes()])
}

/// Takes advisory locks in the order given, each row's before the next row is read (the
/// function scan of `unnest` yields them in array order): `$1` the ids, `$2` whether each is
/// exclusive (else shared).
pub(super) const LOCK_MODES: &str = "SELECT CASE WHEN x THEN pg_advisory_xact_lock(id) \
                                     ELSE pg_advisory_xact_lock_shared(id) END \
                                     FROM unnest($1::bigint[], $2::bool[]) AS u(id, x)";

/// `locks` in ascending order of id, each once: exclusive if any asked it so.
pub(super) fn ordered(mut locks: Vec<(i64, bool)>) -> (Vec<i64>, Vec<bool>) {
    locks.sort_unstable();
    let mut out: Vec<(i64, bool)> = Vec::with_capacity(locks.len());
    for (id, exclusive) in locks {
        match out.last_mut() {
            Some(last) if last.0 == id => last.1 |= exclusive,
            _ => out.push((id, exclusive)),
        }
    }
    out.into_iter().unzip()
}

/// The advisory lock of a KV key (present or absent).
pub(super) fn kv_lock(namespace: &str, key: &str) -> i64 {
    lock_id(&[b"kv", namespace.as_bytes(), key.as_bytes()])
}

/// A stable 64-bit id for a lock (the same in every process and every version of this host):
/// the first 8 bytes of a SHA-256 of the length-prefixed parts.
fn lock_id(parts: &[&[u8]]) -> i64 {
    let mut hash = Sha256::new();
    for part in parts {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part);
    }
    let digest = hash.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_le_bytes(first)
}

/// A `u64` in a `bigint` column: the same 64 bits (KV versions use all of them; equality is all
/// the database is asked about such values).
pub(super) fn int(value: u64) -> i64 {
    value as i64
}

pub(super) fn uint(value: i64) -> u64 {
    value as u64
}

pub(super) fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, LedgerError> {
    serde_json::to_vec(value).map_err(|e| LedgerError::Corrupt { what: format!("encoding a record: {e}") })
}

/// Column `index` of `row`, or why not.
pub(super) fn column<'r, T: deadpool_postgres::tokio_postgres::types::FromSql<'r>>(
    row: &'r Row,
    index: usize,
    table: &str,
) -> Result<T, LedgerError> {
    row.try_get(index).map_err(|e| LedgerError::Corrupt { what: format!("table {table}: column {index}: {e}") })
}

/// The record in column `index` of `row`.
pub(super) fn record<T: DeserializeOwned>(row: &Row, index: usize, table: &str) -> Result<T, LedgerError> {
    let bytes: &[u8] = column(row, index, table)?;
    serde_json::from_slice(bytes)
        .map_err(|e| LedgerError::Corrupt { what: format!("table {table}: undecodable record: {e}") })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_ids_are_stable_and_keep_their_parts_apart() {
        assert_eq!(operation_lock("op"), operation_lock("op"));
        assert_ne!(kv_lock("ab", "c"), kv_lock("a", "bc"));
        assert_ne!(operation_lock("k"), kv_lock("", "k"));
    }

    #[test]
    fn locks_are_taken_once_each_in_ascending_order_exclusive_if_any_asked_so() {
        let (ids, exclusive) = ordered(vec![(3, false), (1, true), (3, true), (2, false), (2, false)]);
        assert_eq!((ids, exclusive), (vec![1, 2, 3], vec![true, false, true]));
        assert_ne!(run_lock("op"), operation_lock("op"));
    }

    #[test]
    fn what_a_pooler_leads_to_is_named_and_nothing_else_is() {
        // As PgBouncer 1.18 and PostgreSQL word them (an outside try behind PgBouncer).
        let refused = pooler_hint("08P01", "unsupported startup parameter: options");
        assert!(refused.is_some_and(|h| h.contains("session settings") && h.contains("session mode")));
        let unset =
            "oncebox: this ledger is at schema version 2 and this session writes another (oncebox.schema = unset)";
        assert!(pooler_hint("OBXSC", unset).is_some_and(|h| h.contains("dropped")));
        assert!(pooler_hint("26000", "prepared statement \"s29\" does not exist").is_some());
        assert!(pooler_hint("42P05", "prepared statement \"s0\" already exists").is_some());
        // An older host's schema, or any other error, is what it says.
        assert_eq!(pooler_hint("OBXSC", "this session writes another (oncebox.schema = 1)"), None);
        assert_eq!(pooler_hint("08P01", "invalid message length"), None);
        assert_eq!(pooler_hint("40P01", "deadlock detected"), None);
    }

    #[test]
    fn u64_values_survive_a_bigint() {
        for value in [0, 1, u64::MAX, 1 << 63] {
            assert_eq!(uint(int(value)), value);
        }
    }
}
