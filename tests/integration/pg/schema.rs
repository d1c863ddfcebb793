//! The schema and the store's name: made once by hosts connecting together, refused in another
//! version, kept with room for rewrites; a store named without its password, in one line when it
//! is not there.

use std::time::Duration;

use oncebox::ledger::postgres::PostgresStore;
use oncebox::ledger::{Ledger, Store};

use super::{connect, connect_unmarked, fresh_database, request};
use oncebox::ledger::{ApprovalRecord, ApprovalState};

#[tokio::test]
async fn a_store_is_named_by_its_url_without_the_password() {
    let url = fresh_database().await;
    let with_password = url.replacen("postgres@", "postgres:hunter2@", 1);
    let store = PostgresStore::connect(&with_password).await.expect("connect (trust ignores the password)");
    let name = Store::name(&store).display().to_string();
    assert_eq!(name, url);
}

#[tokio::test]
async fn a_server_that_is_not_there_is_an_error_naming_the_store_in_one_line() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port").port();
    let url = format!("postgres://alice:hunter2@127.0.0.1:{port}/ledger");
    let error = Ledger::connect(&url).await.expect_err("nothing listens there").to_string();
    assert!(error.contains(&format!("postgres://alice@127.0.0.1:{port}/ledger")), "{error}");
    assert!(error.contains("cannot connect") && !error.contains("hunter2") && !error.contains('\n'), "{error}");
}

#[tokio::test]
async fn a_database_of_another_schema_version_is_refused_naming_both() {
    let url = fresh_database().await;
    drop(Ledger::connect(&url).await.expect("create the schema"));
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("connect");
    let connection = tokio::spawn(connection);
    client.batch_execute("UPDATE oncebox_meta SET value = 99 WHERE name = 'schema_version'").await.expect("update");
    drop(client);
    let _ = connection.await;
    let error = Ledger::connect(&url).await.expect_err("another version");
    assert!(error.is_unusable_ledger(), "{error:?}");
    let message = error.to_string();
    assert!(message.contains("schema version 99") && message.contains("version 2"), "{message}");
}

/// A host of schema 1 still connected when its database is migrated to schema 2 would write
/// without keeping the index of open work: from the migration on, the database refuses its writes
/// to the tables the index follows, in one line that says what to do, while the hosts of schema 2
/// (and a session that says it writes schema 2) write as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_of_schema_1_still_connected_is_refused_its_writes_once_migrated() {
    let url = fresh_database().await;
    let ledger = Ledger::connect(&url).await.expect("create the schema");
    assert!(matches!(ledger.claim(&request("a", "h", 1_000)).await, Ok(oncebox::ledger::Claim::Owned { .. })));
    drop(ledger);
    // Make it a database of schema 1, with a host of schema 1 on it, writing.
    connect(&url)
        .await
        .batch_execute(
            "DROP TABLE oncebox_open; DROP TABLE oncebox_ended; \
             DROP TRIGGER IF EXISTS oncebox_schema_guard ON oncebox_operations; \
             DROP TRIGGER IF EXISTS oncebox_schema_guard ON oncebox_approvals; \
             DROP FUNCTION IF EXISTS oncebox_schema_guard(); \
             UPDATE oncebox_meta SET value = 1 WHERE name = 'schema_version'",
        )
        .await
        .expect("schema 1");
    let old = connect_unmarked(&url).await;
    let write = "UPDATE oncebox_operations SET lease_until_ms = lease_until_ms + 1 WHERE key = 'a'";
    assert_eq!(old.execute(write, &[]).await.expect("schema 1: the old host writes"), 1);
    let ledger = Ledger::connect(&url).await.expect("migrated");
    let error = old.execute(write, &[]).await.expect_err("the old host is refused");
    let message = error.as_db_error().map(|db| db.message().to_string()).unwrap_or_else(|| error.to_string());
    assert!(message.contains("schema version 2") && message.contains("stop the hosts"), "{message}");
    assert!(!message.contains('\n'), "{message}");
    let delete = "DELETE FROM oncebox_approvals WHERE operation_key = 'a'";
    assert!(old.execute(delete, &[]).await.is_err(), "approvals are guarded too");
    // This schema's hosts, and a session that says it writes it, write as before.
    assert!(matches!(ledger.claim(&request("b", "h", 1_000)).await, Ok(oncebox::ledger::Claim::Owned { .. })));
    assert_eq!(connect(&url).await.execute(write, &[]).await.expect("a session of schema 2 writes"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hosts_connecting_together_make_one_schema() {
    let url = fresh_database().await;
    let hosts = (0..4).map(|_| {
        let url = url.clone();
        tokio::spawn(async move { Ledger::connect(&url).await })
    });
    for host in hosts {
        host.await.expect("join").expect("every host connects");
    }
}

/// Every host leaves half of each page of the operations table free for the rows' rewrites
/// (`groups.rs` counts them), in a database made before too; a fillfactor an operator set is
/// theirs. A host that cannot have the table's lock soon (a VACUUM holds it), or whose role does
/// not own the table, connects without it.
#[tokio::test]
async fn the_operations_table_keeps_room_for_rewrites_unless_an_operator_chose_otherwise() {
    let url = fresh_database().await;
    let client = connect(&url).await;
    let fillfactor = async || -> Vec<String> {
        let sql = "SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = 'oncebox_operations'::regclass";
        client.query_one(sql, &[]).await.expect("reloptions").get(0)
    };
    drop(Ledger::connect(&url).await.expect("connect"));
    assert_eq!(fillfactor().await, ["fillfactor=50"]);
    client.batch_execute("ALTER TABLE oncebox_operations RESET (fillfactor)").await.expect("a database made before");
    client.batch_execute("BEGIN; LOCK TABLE oncebox_operations IN SHARE UPDATE EXCLUSIVE MODE").await.expect("lock");
    let held = tokio::time::timeout(Duration::from_secs(10), Ledger::connect(&url)).await;
    drop(held.expect("connected within 10 s while the lock is held").expect("connect while the lock is held"));
    assert_eq!(fillfactor().await, Vec::<String>::new(), "not set while the lock is held");
    client.batch_execute("COMMIT").await.expect("unlock");
    // A role that may use the tables but does not own them.
    let tenant: String = client.query_one("SELECT 'tenant_' || current_database()", &[]).await.expect("name").get(0);
    let grant = format!(
        "CREATE ROLE {tenant} LOGIN; GRANT CREATE, USAGE ON SCHEMA public TO {tenant}; \
         GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {tenant}; \
         GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO {tenant}"
    );
    client.batch_execute(&grant).await.expect("a role of its own");
    let as_tenant = url.replace("postgres://postgres@", &format!("postgres://{tenant}@"));
    assert_ne!(as_tenant, url, "{url}");
    drop(Ledger::connect(&as_tenant).await.expect("connect as a role that does not own the table"));
    assert_eq!(fillfactor().await, Vec::<String>::new(), "not set by a role that does not own the table");
    drop(Ledger::connect(&url).await.expect("connect"));
    assert_eq!(fillfactor().await, ["fillfactor=50"]);
    client.batch_execute("ALTER TABLE oncebox_operations SET (fillfactor = 80)").await.expect("an operator's");
    drop(Ledger::connect(&url).await.expect("connect"));
    assert_eq!(fillfactor().await, ["fillfactor=80"]);
}

/// A build of an index by age that did not finish (its host killed) is done again by the next
/// host to connect, which gives its lock back.
#[tokio::test]
async fn an_index_by_age_a_killed_build_left_invalid_is_built_again_at_the_next_connect() {
    let url = fresh_database().await;
    let ledger = Ledger::connect(&url).await.expect("create the schema");
    let asked = ApprovalRecord { requested_ms: 10, ..super::approval("asked", 1, ApprovalState::Pending) };
    ledger.put_approval(&asked).await.expect("ask");
    drop(ledger);
    // What a host killed during `CREATE INDEX CONCURRENTLY` leaves: the index there, not valid
    // (the planner never reads it, and `IF NOT EXISTS` alone would keep it so forever).
    let client = super::connect(&url).await;
    let valid = "SELECT indisvalid FROM pg_index WHERE indexrelid = 'oncebox_approvals_written'::regclass";
    client
        .batch_execute(
            "UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'oncebox_approvals_written'::regclass",
        )
        .await
        .expect("mark it unfinished (the tests' server role is a superuser)");
    assert!(!client.query_one(valid, &[]).await.expect("read").get::<_, bool>(0));
    let ledger = Ledger::connect(&url).await.expect("connect");
    assert!(client.query_one(valid, &[]).await.expect("read").get::<_, bool>(0), "built again");
    let keys: Vec<String> =
        ledger.approvals_before(11).await.expect("read").into_iter().map(|a| a.operation_key).collect();
    assert_eq!(keys, ["asked"]);
    // And no session lock is left on the pool's connection: another host can build next time.
    // The build's lock: the schema lock's keys (`postgres/schema.rs`), the second one above it.
    let held = "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database \
                WHERE d.datname = current_database() AND l.locktype = 'advisory' AND l.objsubid = 2 \
                AND l.classid = 1869505381 AND l.objid = 1935894630";
    assert_eq!(client.query_one(held, &[]).await.expect("read").get::<_, i64>(0), 0);
}

/// A database of the last release has no indexes by age: the first host of this release to
/// connect makes them, over what is there, without a new schema version (a host of the last
/// release keeps them by writing its records, as every host does). Then a request and a message
/// written before are found by age (the same as the scan of every record), and the reads gc makes
/// go through the indexes, not through every row.
#[tokio::test]
async fn the_indexes_by_age_are_made_over_a_database_of_the_last_release_and_read_by_gc() {
    let url = fresh_database().await;
    let ledger = Ledger::connect(&url).await.expect("create the schema");
    let mut decided = super::approval("decided", 1, ApprovalState::Pending);
    decided.requested_ms = 10;
    ledger.put_approval(&decided).await.expect("ask");
    let decided = ApprovalRecord { decided_ms: Some(30), ..super::approval("decided", 2, ApprovalState::Rejected) };
    ledger.put_approval(&decided).await.expect("reject");
    let expiring = ApprovalRecord {
        decided_ms: Some(20),
        expires_ms: Some(90),
        ..super::approval("expiring", 1, ApprovalState::Approved)
    };
    ledger.put_approval(&expiring).await.expect("approve");
    assert!(ledger.enqueue_once("notify", "unknown/k/1", "{}").await.expect("enqueue"));
    assert!(ledger.enqueue_once("notify", "unknown/k/2", "{}").await.expect("enqueue"));
    let first = ledger.outbox().await.expect("read")[0].seq;
    ledger.mark_delivered(first, 40).await.expect("deliver");
    // What retention left of two runs.
    let stone = |key: &str, run: &str| crate::support::tombstone(key, run, key, "charge");
    let stones = [stone("t2", "r"), stone("t1", "other"), stone("t0", "r")];
    ledger.expire(&stones, &[]).await.expect("expire");
    drop(ledger);
    // Make it a database of the last release: no indexes by age or of tombstones by run, no
    // functions.
    let client = super::connect(&url).await;
    client
        .batch_execute(
            "DROP INDEX oncebox_approvals_written; DROP INDEX oncebox_outbox_delivered; \
             DROP INDEX oncebox_tombstones_run; DROP FUNCTION oncebox_approval_written(bytea); \
             DROP FUNCTION oncebox_delivered_ms(bytea); DROP FUNCTION oncebox_tombstone_run(bytea)",
        )
        .await
        .expect("drop");
    let ledger = Ledger::connect(&url).await.expect("connect");
    // A run's tombstones, in key order, those left before the index too.
    assert_eq!(ledger.tombstones("r").await.expect("read"), [stones[2].clone(), stones[0].clone()]);
    assert_eq!(ledger.tombstones("other").await.expect("read"), [stones[1].clone()]);
    assert!(ledger.tombstones("nobody").await.expect("read").is_empty());
    let keys = |asked: Vec<ApprovalRecord>| asked.into_iter().map(|a| a.operation_key).collect::<Vec<_>>();
    for cutoff in [0, 30, 31, 90, 91, u64::MAX] {
        let indexed = ledger.approvals_before(cutoff).await.expect("indexed");
        assert_eq!(indexed, ledger.approvals_before_scanned(cutoff).await.expect("scanned"), "at {cutoff}");
        let delivered = ledger.delivered_before(cutoff).await.expect("indexed");
        assert_eq!(delivered, ledger.delivered_before_scanned(cutoff).await.expect("scanned"), "at {cutoff}");
    }
    assert_eq!(keys(ledger.approvals_before(31).await.expect("read")), ["decided"]);
    assert_eq!(keys(ledger.approvals_before(91).await.expect("read")), ["decided", "expiring"]);
    let delivered: Vec<u64> = ledger.delivered_before(41).await.expect("read").iter().map(|m| m.seq).collect();
    assert_eq!(delivered, [first], "the pending one is not");
    // The SQL restating the one rule says what it says of each request (a value too small would
    // only cost reads, the store re-judging by the rule; too large would miss a request).
    let sql = "SELECT operation_key, oncebox_approval_written(record)::bigint FROM oncebox_approvals ORDER BY 1";
    let said: Vec<(String, i64)> =
        client.query(sql, &[]).await.expect("read").iter().map(|row| (row.get(0), row.get(1))).collect();
    let ruled: Vec<(String, i64)> = ledger
        .approvals(None)
        .await
        .expect("read")
        .iter()
        .map(|a| (a.operation_key.clone(), i64::try_from(a.last_written()).expect("ms")))
        .collect();
    assert_eq!(said, ruled);
    assert_eq!(said, [("decided".to_string(), 30), ("expiring".to_string(), 90)]);
    // The plans (sequential scans off, as a table of millions of rows would make them): each read
    // is an index scan of its index.
    client.batch_execute("SET enable_seqscan = off").await.expect("set");
    for (sql, index) in [
        (
            "EXPLAIN SELECT record FROM oncebox_approvals WHERE oncebox_approval_written(record) < 31::bigint::numeric \
             ORDER BY oncebox_approval_written(record), operation_key",
            "oncebox_approvals_written",
        ),
        (
            "EXPLAIN SELECT record FROM oncebox_outbox WHERE delivered AND oncebox_delivered_ms(record) < 41::bigint::numeric \
             ORDER BY oncebox_delivered_ms(record), seq",
            "oncebox_outbox_delivered",
        ),
        (
            "EXPLAIN SELECT record FROM oncebox_tombstones WHERE oncebox_tombstone_run(record) COLLATE \"C\" = 'r' \
             ORDER BY operation_key",
            "oncebox_tombstones_run",
        ),
    ] {
        let plan: Vec<String> = client.query(sql, &[]).await.expect("explain").iter().map(|row| row.get(0)).collect();
        let plan = plan.join("\n");
        assert!(plan.contains(&format!("Index Scan using {index}")), "{plan}");
    }
}
