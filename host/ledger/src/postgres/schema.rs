//! The schema, created by the first host to connect and checked by every other: versioned in
//! `oncebox_meta`, as the redb file is in its `meta` table (`redb/open.rs`).
//!
//! The rows carry their invariants: keys are primary keys, an effect or an attempt cannot outlive
//! its operation (foreign keys), statuses are one of the four, fences and versions are never 0.
//! Each record is kept whole (serde JSON, exactly as redb encodes it) in a `bytea` column so that
//! reads return exactly the record types; the columns that decide anything (status, fence, lease,
//! dispatches, revision, version, delivered) are real columns, the ones the conditional writes
//! test. Text columns that order results use the "C" collation: byte order, as in redb and in
//! Rust, whatever the database's locale.

use super::db::{Tx, column, int, record, uint};
use super::index::{self, IndexWrites};
use crate::{ApprovalRecord, LedgerError, OperationRecord};

/// How many runs the migration to schema 2 reads at a time.
const RUNS_AT_ONCE: i64 = 1000;

/// 1: the first PostgreSQL schema. 2: the index of open work (`index.rs`), kept by every write
/// that changes a status: a host that reads version 1 would write without keeping it, so it is
/// refused a database of version 2.
pub(super) const SCHEMA_VERSION: u64 = 2;

/// The advisory lock (two-key form, a key space apart from the one-key locks of `db.rs`) that
/// makes one connecting host create the schema while the others wait: "oncebox", "schema".
const SCHEMA_LOCK: (i32, i32) = (0x6f6e_6365, 0x7363_6865);

const TABLES: &str = r#"
CREATE TABLE oncebox_operations (
    key text COLLATE "C" PRIMARY KEY,
    run_id text COLLATE "C" NOT NULL,
    step_id text COLLATE "C" NOT NULL,
    tool text COLLATE "C" NOT NULL,
    status text NOT NULL CHECK (status IN ('claimed', 'completed', 'failed', 'unknown')),
    fence bigint NOT NULL CHECK (fence > 0),
    lease_until_ms bigint NOT NULL,
    -- Whether anything of the operation was recorded beyond its claim (a write-ahead, an attempt,
    -- a settlement): reads show only these, as the redb backend shows no claim before its first
    -- durable write. The claim itself is a row all the same: it is what other hosts race on.
    recorded boolean NOT NULL,
    record bytea NOT NULL,
    -- The random token of the claim that made the row (0: none), which a claim committed without
    -- waiting for its flush is checked by (`riding.rs`).
    claim bigint NOT NULL DEFAULT 0
);
CREATE INDEX oncebox_operations_run ON oncebox_operations (run_id, step_id, tool);

CREATE TABLE oncebox_effects (
    operation_key text COLLATE "C" NOT NULL REFERENCES oncebox_operations (key) ON DELETE CASCADE,
    effect_key text COLLATE "C" NOT NULL,
    status text NOT NULL CHECK (status IN ('dispatched', 'completed', 'refused', 'retryable', 'unknown')),
    dispatches bigint NOT NULL,
    first_dispatched_ms bigint NOT NULL,
    label text COLLATE "C" NOT NULL,
    record bytea NOT NULL,
    PRIMARY KEY (operation_key, effect_key)
);

CREATE TABLE oncebox_attempts (
    operation_key text COLLATE "C" NOT NULL REFERENCES oncebox_operations (key) ON DELETE CASCADE,
    number bigint NOT NULL,
    record bytea NOT NULL,
    PRIMARY KEY (operation_key, number)
);

CREATE TABLE oncebox_kv (
    namespace text COLLATE "C" NOT NULL,
    key text COLLATE "C" NOT NULL,
    value bytea NOT NULL,
    -- 0 means absent: a stored key never has it.
    version bigint NOT NULL CHECK (version <> 0),
    PRIMARY KEY (namespace, key)
);

CREATE TABLE oncebox_approvals (
    operation_key text COLLATE "C" PRIMARY KEY,
    run_id text COLLATE "C" NOT NULL,
    revision bigint NOT NULL CHECK (revision > 0),
    record bytea NOT NULL
);
CREATE INDEX oncebox_approvals_run ON oncebox_approvals (run_id, operation_key);

-- The id of the fingerprint key the hosts share (`keys::FingerprintKey::ids`, never the key): one
-- row, so that a host given another key file is refused instead of seeing every replay conflict.
CREATE TABLE oncebox_key (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    id text NOT NULL
);

CREATE TABLE oncebox_tombstones (
    operation_key text COLLATE "C" PRIMARY KEY,
    record bytea NOT NULL
);

CREATE TABLE oncebox_outbox (
    seq bigint PRIMARY KEY CHECK (seq > 0),
    topic text COLLATE "C" NOT NULL,
    delivered boolean NOT NULL,
    record bytea NOT NULL
);
CREATE INDEX oncebox_outbox_pending ON oncebox_outbox (topic, seq) WHERE NOT delivered;

-- Take-over fences: one sequence for the whole ledger, so no two hosts ever hand out the same
-- token. New operations have fence 1 (no token of them existed), so take-overs start above it.
CREATE SEQUENCE oncebox_fence START 2;
"#;

/// The setting by which a session says which schema it writes: every connection of the ledger
/// sets it to [`SCHEMA_VERSION`] in its startup options (`options.rs`), for nothing per statement.
pub(super) const SESSION_SCHEMA: &str = "oncebox.schema";

/// Refuses the writes of the tables whose changes the index of open work follows from a session
/// that has not said it writes this schema: a host of schema 1 still connected when the database
/// was migrated (it would write without keeping the index). Per statement, not per row: one
/// function call of a few microseconds per statement a group sends to these tables (two for an
/// `INSERT ... ON CONFLICT DO UPDATE`, which fires both), whatever its number of rows. An
/// operator writing these tables by hand says `SET oncebox.schema = '2'` (the version) first, and keeps the
/// index as the hosts do.
fn guard_sql() -> String {
    format!(
        r#"
CREATE OR REPLACE FUNCTION oncebox_schema_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('{setting}', true) IS DISTINCT FROM '{version}' THEN
        RAISE EXCEPTION 'oncebox: this ledger is at schema version {version} and this session writes another ({setting} = %): stop the hosts of an older oncebox and start this version''s', coalesce(current_setting('{setting}', true), 'unset')
            USING ERRCODE = 'OBXSC';
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER oncebox_schema_guard BEFORE INSERT OR UPDATE OR DELETE ON oncebox_operations
    FOR EACH STATEMENT EXECUTE FUNCTION oncebox_schema_guard();
CREATE TRIGGER oncebox_schema_guard BEFORE INSERT OR UPDATE OR DELETE ON oncebox_approvals
    FOR EACH STATEMENT EXECUTE FUNCTION oncebox_schema_guard();
"#,
        setting = SESSION_SCHEMA,
        version = SCHEMA_VERSION,
    )
}

/// Creates the schema in an empty database, or checks the version of the one there; one
/// transaction, under the schema lock, so that hosts connecting together neither race on the
/// DDL nor read a half-made schema.
pub(super) async fn init(tx: &Tx<'_>) -> Result<(), LedgerError> {
    tx.exec("SELECT pg_advisory_xact_lock($1, $2)", &[&SCHEMA_LOCK.0, &SCHEMA_LOCK.1]).await?;
    tx.exec("CREATE TABLE IF NOT EXISTS oncebox_meta (name text PRIMARY KEY, value bigint NOT NULL)", &[]).await?;
    let version = tx.opt("SELECT value FROM oncebox_meta WHERE name = 'schema_version'", &[]).await?;
    match version.map(|row| row.try_get::<_, i64>(0)).transpose() {
        Ok(None) => {
            tx.tx.batch_execute(TABLES).await.map_err(|e| super::db::failed(tx.store, "CREATE TABLE ...", &e))?;
            tx.tx
                .batch_execute(index::TABLES)
                .await
                .map_err(|e| super::db::failed(tx.store, "CREATE TABLE oncebox_open ...", &e))?;
            // `outbox_seq`: the last outbox sequence number handed out (see `jobs::apply_local`).
            tx.exec(
                "INSERT INTO oncebox_meta (name, value) VALUES ('schema_version', $1), ('outbox_seq', 0)",
                &[&int(SCHEMA_VERSION)],
            )
            .await?;
            guard(tx).await?;
            added(tx).await
        }
        // A database of this schema made by an earlier release has no guard, and is not given
        // one: its hosts (which say no `oncebox.schema`) keep the index, and a rolling upgrade
        // must not refuse their writes. The guard is for hosts of schema 1 left connected
        // through the migration (below), and is made with a new database.
        Ok(Some(version)) if uint(version) == SCHEMA_VERSION => added(tx).await,
        Ok(Some(1)) => {
            added(tx).await?;
            // Before the index is built: creating the triggers waits for the writes of the hosts
            // of schema 1 in flight and holds off their next ones until this commits, when the
            // triggers refuse them; the index is built from every write that got in before.
            guard(tx).await?;
            build_index(tx).await?;
            let sql = "UPDATE oncebox_meta SET value = $1 WHERE name = 'schema_version'";
            tx.exec(sql, &[&int(SCHEMA_VERSION)]).await.map(drop)
        }
        Ok(Some(other)) => Err(LedgerError::Corrupt {
            what: format!("{}: schema version {other}, this oncebox reads version {SCHEMA_VERSION}", tx.store),
        }),
        Err(e) => Err(LedgerError::Corrupt { what: format!("{}: unreadable schema version: {e}", tx.store) }),
    }
}

/// What was added after schema 1 without a new version, where missing: a database made before
/// has it too, and a host that does not know it ignores it.
async fn added(tx: &Tx<'_>) -> Result<(), LedgerError> {
    leases(tx).await?;
    notices(tx).await?;
    claim_tokens(tx).await?;
    aged(tx).await
}

/// What retention visits, by age: the requests for approval by when they were last written and
/// the delivered outbox messages by their delivery (`open.rs`: `approvals_before`,
/// `delivered_before`). Expression indexes over the records themselves, not new columns: a host
/// of the last release (schema 2 too, and it does not know them) keeps them up to date by writing
/// the record, as every host does, so they need no new schema version and no rolling upgrade is
/// refused. `oncebox_approval_written` restates [`ApprovalRecord::last_written`] in SQL (the latest
/// of `requested_ms`, `decided_ms`, `expires_ms`; `greatest` skips the absent ones): the
/// conformance suite holds the two equal. Numeric, so that no stored number can fail the cast.
/// The cost: a write of `record` is never a HOT update on these two tables (a request is written
/// at its ask and its decision; a message at each delivery's answer), which is cheap next to
/// reading every request or message at each gc. `oncebox_tombstone_run` reads a tombstone's run,
/// for the tombstones by run (written when retention removes an operation or a rejected request;
/// indexed in the "C" collation, as every key of the schema, so that no change of the system's
/// collation rules can reorder the index under it). The
/// functions are made with the schema (they must be there before an index names them); the
/// indexes after it ([`index_records`]).
const AGED: &str = r#"
CREATE OR REPLACE FUNCTION oncebox_approval_written(record bytea) RETURNS numeric
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE r jsonb := convert_from(record, 'UTF8')::jsonb;
BEGIN
    RETURN greatest((r->>'requested_ms')::numeric, (r->>'decided_ms')::numeric, (r->>'expires_ms')::numeric);
END
$$;
CREATE OR REPLACE FUNCTION oncebox_delivered_ms(record bytea) RETURNS numeric
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
BEGIN
    RETURN (convert_from(record, 'UTF8')::jsonb -> 'delivery' ->> 'delivered_ms')::numeric;
END
$$;
CREATE OR REPLACE FUNCTION oncebox_tombstone_run(record bytea) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
BEGIN
    RETURN convert_from(record, 'UTF8')::jsonb ->> 'run_id';
END
$$;
"#;

/// The indexes by age, and the tombstones by run (what a run's compensation reads of what
/// retention removed: `Store::tombstones`, O(the run's) once built), each its own statement:
/// `CREATE INDEX CONCURRENTLY` runs outside any transaction. Until a build ends, those reads scan
/// their table, as before.
const RECORD_INDEXES: [(&str, &str); 3] = [
    (
        "oncebox_approvals_written",
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS oncebox_approvals_written \
         ON oncebox_approvals (oncebox_approval_written(record), operation_key)",
    ),
    (
        "oncebox_outbox_delivered",
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS oncebox_outbox_delivered \
         ON oncebox_outbox (oncebox_delivered_ms(record), seq) WHERE delivered",
    ),
    (
        "oncebox_tombstones_run",
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS oncebox_tombstones_run \
         ON oncebox_tombstones (oncebox_tombstone_run(record) COLLATE \"C\", operation_key)",
    ),
];

/// The functions of the indexes over records ([`AGED`]), where missing. Looked up first, as
/// [`claim_tokens`] says why.
async fn aged(tx: &Tx<'_>) -> Result<(), LedgerError> {
    let there = "SELECT to_regproc('oncebox_approval_written') IS NOT NULL \
                 AND to_regproc('oncebox_delivered_ms') IS NOT NULL \
                 AND to_regproc('oncebox_tombstone_run') IS NOT NULL";
    let found: bool = match tx.opt(there, &[]).await? {
        Some(row) => column(&row, 0, "pg_proc")?,
        None => false,
    };
    if found {
        return Ok(());
    }
    tx.tx
        .batch_execute(AGED)
        .await
        .map_err(|e| super::db::failed(tx.store, "CREATE FUNCTION oncebox_approval_written ...", &e))
}

/// The lock (a session's, a key apart from [`SCHEMA_LOCK`]) that one host at a time holds while it
/// builds the indexes over records, so that no host takes another's build in progress for one that
/// was left unfinished.
const AGED_LOCK: (i32, i32) = (SCHEMA_LOCK.0, SCHEMA_LOCK.1 + 1);

/// The indexes over records, by age and of tombstones by run ([`RECORD_INDEXES`]), where missing
/// or left invalid by a build that did not finish (a host killed during it). Built after the
/// schema's transaction, outside its lock, and `CONCURRENTLY`: the first host of this release to
/// connect to a database of the last one reads every request, message and tombstone once
/// (O(those), once, before its connect returns), while every other host goes on writing them. One
/// host at a time builds: a host that finds another building goes on without waiting, and until
/// the build ends gc and a run's compensation read those tables whole, as before. A build that fails fails the connect, with the statement named.
pub(super) async fn index_records(client: &mut deadpool_postgres::Client, store: &str) -> Result<(), LedgerError> {
    let failed = |what: &str, e: &deadpool_postgres::tokio_postgres::Error| super::db::failed(store, what, e);
    let valid = "SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass($1)";
    let mut missing = Vec::new();
    for (name, create) in RECORD_INDEXES {
        let row = client.query_opt(valid, &[&name]).await.map_err(|e| failed("SELECT indisvalid", &e))?;
        if !row.is_some_and(|row| row.get::<_, bool>(0)) {
            missing.push((name, create));
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    let lock = "SELECT pg_try_advisory_lock($1, $2)";
    let row = client.query_one(lock, &[&AGED_LOCK.0, &AGED_LOCK.1]).await.map_err(|e| failed(lock, &e))?;
    if !row.get::<_, bool>(0) {
        return Ok(());
    }
    let mut built = Ok(());
    for (name, create) in missing {
        // Under the lock, an index still there and invalid is one a build left unfinished.
        let drop = format!("DROP INDEX CONCURRENTLY IF EXISTS {name}");
        let again = match client.query_opt(valid, &[&name]).await {
            Ok(Some(row)) if row.get::<_, bool>(0) => continue,
            Ok(Some(_)) => client.batch_execute(&drop).await.map_err(|e| failed(&drop, &e)),
            Ok(None) => Ok(()),
            Err(e) => Err(failed("SELECT indisvalid", &e)),
        };
        built = again.and(client.batch_execute(create).await.map_err(|e| failed(create, &e)));
        if built.is_err() {
            break;
        }
    }
    // A session's lock outlives its use: given back before the connection goes back to the pool.
    let unlock = "SELECT pg_advisory_unlock($1, $2)";
    client.query_one(unlock, &[&AGED_LOCK.0, &AGED_LOCK.1]).await.map_err(|e| failed(unlock, &e))?;
    built
}

/// The keys of the host's own outbox messages (`jobs::enqueue_once`: notifications), `TOPIC\nKEY`,
/// so that an event noticed again, on any host, is enqueued once per topic.
async fn notices(tx: &Tx<'_>) -> Result<(), LedgerError> {
    let sql = "CREATE TABLE IF NOT EXISTS oncebox_notices (key text COLLATE \"C\" PRIMARY KEY, seq bigint NOT NULL)";
    tx.exec(sql, &[]).await.map(drop)
}

/// Half of each page of `oncebox_operations` kept free when rows are inserted: every operation is
/// written again after its claim (its write-ahead, its end), and a row rewritten on its own page
/// changes no index (a HOT update) where one moved to another page adds an entry to each. Set
/// where no fillfactor is (an operator's own is kept), on a database made before too, by a role
/// that owns the table. Its own transaction, after the schema's and outside its lock: its lock
/// blocks no reads or writes but waits for a VACUUM, an ANALYZE or an index build, a second at
/// most, so that hosts connecting meanwhile do not queue behind it. Past that second the host
/// connects without it, and a later connect sets it.
pub(super) async fn keep_room_for_rewrites(client: &mut deadpool_postgres::Client) {
    const UNSET: &str = "SELECT 1 FROM pg_class c WHERE c.oid = 'oncebox_operations'::regclass \
                         AND pg_has_role(c.relowner, 'USAGE') \
                         AND NOT EXISTS (SELECT 1 FROM unnest(c.reloptions) AS o WHERE o LIKE 'fillfactor=%')";
    let Ok(Some(_)) = client.query_opt(UNSET, &[]).await else { return };
    let Ok(tx) = client.transaction().await else { return };
    // The wait's bound for this transaction only; the session keeps the URL's own.
    let set = tx.batch_execute("SET LOCAL lock_timeout = 1000; ALTER TABLE oncebox_operations SET (fillfactor = 50)");
    if set.await.is_ok() {
        let _ = tx.commit().await;
    }
    // Otherwise the transaction rolls back as it is dropped: the table is as it was.
}

/// The schema guard ([`guard_sql`]), where missing: made with a new database and by the migration
/// from schema 1. Looked up first, as [`claim_tokens`] says why. (A migration to a later schema
/// must replace the function's body, which names the version.)
async fn guard(tx: &Tx<'_>) -> Result<(), LedgerError> {
    let there = "SELECT 1 FROM pg_trigger WHERE tgrelid = 'oncebox_approvals'::regclass \
                 AND tgname = 'oncebox_schema_guard'";
    if tx.opt(there, &[]).await?.is_some() {
        return Ok(());
    }
    tx.tx
        .batch_execute(&guard_sql())
        .await
        .map_err(|e| super::db::failed(tx.store, "CREATE TRIGGER oncebox_schema_guard ...", &e))
}

/// The claim token of each operation (`riding.rs`). A host that does not know it inserts 0, which
/// no ridden claim's token is, and never lets a claim ride. Looked up first: `ALTER TABLE` takes
/// the table's strongest lock even when there is nothing to add, and every host runs this.
async fn claim_tokens(tx: &Tx<'_>) -> Result<(), LedgerError> {
    let there = "SELECT 1 FROM pg_attribute WHERE attrelid = 'oncebox_operations'::regclass AND attname = 'claim' \
                 AND NOT attisdropped";
    if tx.opt(there, &[]).await?.is_some() {
        return Ok(());
    }
    tx.exec("ALTER TABLE oncebox_operations ADD COLUMN IF NOT EXISTS claim bigint NOT NULL DEFAULT 0", &[])
        .await
        .map(drop)
}

/// Leases of what hosts do one at a time (`jobs::lease`: a topic's outbox relay, the reconciling
/// of an operation), one row per name.
async fn leases(tx: &Tx<'_>) -> Result<(), LedgerError> {
    let sql = "CREATE TABLE IF NOT EXISTS oncebox_leases (name text COLLATE \"C\" PRIMARY KEY, \
               owner text NOT NULL, until_ms bigint NOT NULL)";
    tx.exec(sql, &[]).await.map(drop)
}

/// Builds the index of open work of a database of schema 1, in the migration's transaction: every
/// operation and request once, a page of runs at a time ([`RUNS_AT_ONCE`]), each run judged by the
/// one rule ([`crate::run_state::open_runs`]) as the redb migration does (`redb/open_index.rs`).
/// The other hosts wait for it on the schema lock; hosts of schema 1 still connected are refused
/// their writes from then on ([`guard_sql`]; operating.md: stop them first).
async fn build_index(tx: &Tx<'_>) -> Result<(), LedgerError> {
    tx.tx
        .batch_execute(index::TABLES)
        .await
        .map_err(|e| super::db::failed(tx.store, "CREATE TABLE oncebox_open ...", &e))?;
    let mut after = String::new();
    loop {
        let runs: Vec<String> = tx
            .rows(super::open::RUNS_PAGE, &[&after, &RUNS_AT_ONCE])
            .await?
            .iter()
            .map(|row| column(row, 0, "oncebox_operations"))
            .collect::<Result<_, _>>()?;
        let Some(last) = runs.last() else { return Ok(()) };
        after = last.clone();
        let ops: Vec<OperationRecord> = tx
            .rows("SELECT record FROM oncebox_operations WHERE run_id = ANY($1)", &[&runs])
            .await?
            .iter()
            .map(|row| record(row, 0, "oncebox_operations"))
            .collect::<Result<_, _>>()?;
        let asked: Vec<ApprovalRecord> = tx
            .rows("SELECT record FROM oncebox_approvals WHERE run_id = ANY($1)", &[&runs])
            .await?
            .iter()
            .map(|row| record(row, 0, "oncebox_approvals"))
            .collect::<Result<_, _>>()?;
        IndexWrites::built(&ops, &asked).write(tx).await?;
    }
}
