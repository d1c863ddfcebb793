//! The same 64-caller workload on the two usual ways of building this by hand: one redb commit per
//! record, and an idempotency table in SQLite (WAL, synchronous=FULL, a unique key), the approach
//! of Lambda Powertools and DBOS. Each call writes what an oncebox call writes: the claim, the
//! effect with its KV write, and the completion with its attempt, each durable before the next,
//! around the tool's logic run natively. No wasm: this is the ledger's cost alone.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use redb::{Database, TableDefinition};

use crate::stats;

const OPS: TableDefinition<&str, &[u8]> = TableDefinition::new("operations");
const EFFECTS: TableDefinition<&str, &[u8]> = TableDefinition::new("effects");
const KV: TableDefinition<&str, &[u8]> = TableDefinition::new("kv");

/// A record about the size of oncebox's (JSON, a few hundred bytes).
fn record(key: &str, status: &str) -> Vec<u8> {
    format!(r#"{{"key":"{key}","status":"{status}","run_id":"bench","step_id":"{key}","tool":"panicky","fence":1}}"#)
        .into_bytes()
}

fn run_callers(
    callers: usize,
    each: usize,
    call: impl Fn(String) -> anyhow::Result<()> + Send + Sync + 'static,
) -> anyhow::Result<f64> {
    let call = Arc::new(call);
    let start = Instant::now();
    let threads: Vec<_> = (0..callers)
        .map(|c| {
            let call = call.clone();
            std::thread::spawn(move || (0..each).try_for_each(|i| call(format!("op-{c}-{i}"))))
        })
        .collect();
    for thread in threads {
        thread.join().map_err(|_| anyhow::anyhow!("a caller panicked"))??;
    }
    Ok(stats::rate(callers * each, start.elapsed()))
}

/// One durable redb transaction per record, callers contending for the single writer.
pub fn naive_redb(dir: &Path, callers: usize, each: usize) -> anyhow::Result<f64> {
    let path = dir.join("naive.redb");
    let _ = std::fs::remove_file(&path);
    let db = Arc::new(Database::create(&path)?);
    let write = {
        let db = db.clone();
        move |f: &dyn Fn(&redb::WriteTransaction) -> anyhow::Result<()>| -> anyhow::Result<()> {
            let txn = db.begin_write()?;
            f(&txn)?;
            txn.commit()?;
            Ok(())
        }
    };
    run_callers(callers, each, move |key| {
        write(&|txn| {
            txn.open_table(OPS)?.insert(key.as_str(), record(&key, "claimed").as_slice())?;
            Ok(())
        })?;
        std::hint::black_box(crate::baselines::native_call(1));
        write(&|txn| {
            txn.open_table(EFFECTS)?.insert(key.as_str(), record(&key, "completed").as_slice())?;
            txn.open_table(KV)?.insert(key.as_str(), b"written".as_slice())?;
            Ok(())
        })?;
        write(&|txn| {
            txn.open_table(OPS)?.insert(key.as_str(), record(&key, "completed").as_slice())?;
            Ok(())
        })
    })
}

/// SQLite in WAL mode with synchronous=FULL; a connection per caller, as a server would pool them.
pub fn sqlite(dir: &Path, callers: usize, each: usize) -> anyhow::Result<f64> {
    let path = dir.join("sqlite.db");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let setup = open(&path)?;
    setup.execute_batch(
        "CREATE TABLE operations (key TEXT PRIMARY KEY, record BLOB NOT NULL);
         CREATE TABLE effects (key TEXT PRIMARY KEY, record BLOB NOT NULL);
         CREATE TABLE kv (key TEXT PRIMARY KEY, value BLOB NOT NULL);",
    )?;
    let path = Arc::new(path);
    let connections: Arc<Vec<std::sync::Mutex<rusqlite::Connection>>> =
        Arc::new((0..callers).map(|_| open(&path).map(std::sync::Mutex::new)).collect::<Result<_, _>>()?);
    run_callers(callers, each, move |key| {
        let caller: usize = key.split('-').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        let mut conn = connections[caller].lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
        // The unique key is the claim: a second caller's insert fails.
        conn.execute("INSERT INTO operations (key, record) VALUES (?1, ?2)", (&key, record(&key, "claimed")))?;
        std::hint::black_box(crate::baselines::native_call(1));
        let txn = conn.transaction()?;
        txn.execute("INSERT INTO effects (key, record) VALUES (?1, ?2)", (&key, record(&key, "completed")))?;
        txn.execute("INSERT INTO kv (key, value) VALUES (?1, ?2)", (&key, b"written".as_slice()))?;
        txn.commit()?;
        conn.execute("UPDATE operations SET record = ?2 WHERE key = ?1", (&key, record(&key, "completed")))?;
        Ok(())
    })
}

fn open(path: &Path) -> anyhow::Result<rusqlite::Connection> {
    let conn = rusqlite::Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::from_secs(60))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    Ok(conn)
}
