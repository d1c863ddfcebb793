//! What no ledger can beat: the disk's durable write, and the tool's logic as plain Rust.

use std::collections::HashMap;
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::stats::{self, Latency};

/// A 4 KiB write and `fdatasync`, the physical price of one durable record.
pub fn fsync(dir: &Path, n: usize) -> anyhow::Result<Latency> {
    let mut file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(dir.join("fsync.bin"))?;
    let block = [0x5au8; 4096];
    let mut failed = None;
    let latency = stats::time(n, |_| {
        let written =
            file.seek(SeekFrom::Start(0)).and_then(|_| file.write_all(&block)).and_then(|()| file.sync_data());
        if let Err(e) = written {
            failed.get_or_insert(e);
        }
    });
    match failed {
        Some(e) => Err(e.into()),
        None => Ok(latency),
    }
}

/// One redb commit shaped like a local-only call's: the operation, its attempt and its effect side
/// by side in one table, the run-step index, and the KV entry. The floor under `fresh_kv_us`.
pub fn redb_commit(dir: &Path, n: usize) -> anyhow::Result<Latency> {
    use redb::TableDefinition;
    const RECORDS: TableDefinition<(&str, u8, &str), &[u8]> = TableDefinition::new("records");
    const OTHERS: [TableDefinition<&str, &[u8]>; 2] = [TableDefinition::new("run_steps"), TableDefinition::new("kv")];
    let path = dir.join("commit-shape.redb");
    let _ = std::fs::remove_file(&path);
    let db = redb::Database::create(&path)?;
    let record = [0x7bu8; 300];
    let mut failed = None;
    let latency = stats::time(n, |i| {
        let commit = || -> anyhow::Result<()> {
            let txn = db.begin_write()?;
            let key = format!("{i:08}");
            {
                let mut records = txn.open_table(RECORDS)?;
                for (kind, id) in [(0, ""), (1, "0000000001"), (2, "effect")] {
                    records.insert((key.as_str(), kind, id), record.as_slice())?;
                }
            }
            for table in OTHERS {
                txn.open_table(table)?.insert(key.as_str(), record.as_slice())?;
            }
            txn.commit()?;
            Ok(())
        };
        if let Err(e) = commit() {
            failed.get_or_insert(e);
        }
    });
    failed.map_or(Ok(latency), Err)
}

#[derive(Deserialize)]
struct Args {
    echo: Option<String>,
    #[serde(default)]
    write_first: bool,
}

#[derive(Serialize)]
struct Echo {
    echo: Option<String>,
}

/// The benchmarked tool (`panicky` in `ok` mode with one KV write) as a plain function: parse the
/// args, write the key, answer.
pub fn native_call(n: usize) -> Latency {
    let mut kv: HashMap<String, Vec<u8>> = HashMap::new();
    stats::time(n, |i| {
        let text = format!(r#"{{"mode":"ok","write_first":true,"echo":"call-{i}"}}"#);
        let args: Args = serde_json::from_str(&text).unwrap_or(Args { echo: None, write_first: false });
        if args.write_first {
            kv.insert("panicky/last".into(), b"written".to_vec());
        }
        let out = serde_json::to_string(&Echo { echo: args.echo }).unwrap_or_default();
        std::hint::black_box(out);
    })
}
