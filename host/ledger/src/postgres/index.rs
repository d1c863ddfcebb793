//! The index of open work on PostgreSQL, kept in the transaction of every state change, as redb's
//! `OPEN` and `ENDED` tables are (`redb/open_index.rs`): `oncebox_open` holds the keys the one
//! rule names as keeping their run open (`run_state::open_keys`; here claims not yet recorded
//! too, since their rows are every host's), `oncebox_ended` the operations that ended, by their
//! end (what retention visits). What reads them: `open.rs`.
//!
//! What a change looks at: the rule makes each key open or not on its own (with the request for
//! approval of its key), except once its run's compensation started, when a completed
//! compensatable step stays open until its compensation completes (`run_state::ties_the_run`).
//! So a change is indexed from the records it touched alone, unless its run is being compensated
//! or the change is a compensation's: then from every record of the run ([`Whole`]).
//!
//! Why that stays right with many hosts writing at once: a job holds the lock of each operation
//! it writes, and a job that changes an operation's status or a request for approval also holds
//! its run's lock ([`super::db::run_lock`]): shared for an ordinary step, exclusive for a
//! compensation's. Whether a run is being compensated changes only under the exclusive lock
//! (a compensation's first claim), and so does the one other record an ordinary step's openness
//! depends on (its compensation's status): a shared holder reads both stable. A shared holder
//! writes only its own keys' rows; an exclusive holder, alone in its run, writes every key's.
//! What else writes an operation (a write-ahead, a renewal, a reconciler's note) changes no
//! status, and so nothing the rule reads.

use std::collections::{BTreeMap, BTreeSet};

use super::combine::{self, Check, Part, row};
use super::db::{Tx, int, record, run_lock};
use super::pipeline::{Sql, sql};
use crate::run_state::{self, open_keys};
use crate::{ApprovalRecord, LedgerError, OperationRecord, expirable};
use oncebox_core::keys::COMPENSATION_PREFIX;

/// The tables, created with the schema or by the migration to schema 2 (`schema.rs`). Each keyed
/// by the operation key, which its writes look rows up by; `oncebox_open` by run too, which its
/// reads look up. Neither is an index on `oncebox_operations`: a column of it that an operation's
/// end changes, indexed, would cost every end a new entry in each of its indexes (no HOT update).
pub(super) const TABLES: &str = r#"
CREATE TABLE oncebox_open (
    key text COLLATE "C" PRIMARY KEY,
    run_id text COLLATE "C" NOT NULL
);
CREATE INDEX oncebox_open_run ON oncebox_open (run_id, key);
CREATE TABLE oncebox_ended (
    ended_ms bigint NOT NULL,
    key text COLLATE "C" NOT NULL,
    PRIMARY KEY (ended_ms, key)
);
"#;

/// The range of step ids of compensations (`COMPENSATION_PREFIX` up to the prefix whose last byte
/// is one more), as `$1`/`$2` of the statements that ask whether a run is being compensated: the
/// run index (`oncebox_operations_run`) finds the first such step without reading the others.
pub(super) fn compensation_steps() -> (String, String) {
    let mut end = COMPENSATION_PREFIX.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    (COMPENSATION_PREFIX.to_string(), String::from_utf8_lossy(&end).into_owned())
}

/// Whether a change of `step` must look at its whole run and hold its run's lock alone.
pub(super) fn ties(step: &str) -> bool {
    run_state::step_ties_the_run(step)
}

/// The run lock a change of a step of `run` takes: (id, exclusive).
pub(super) fn lock_of(run: &str, step: &str) -> (i64, bool) {
    (run_lock(run), ties(step))
}

/// Every record of a run, as read under its lock before the change.
#[derive(Default)]
pub(super) struct Whole {
    pub ops: Vec<OperationRecord>,
    pub asked: Vec<ApprovalRecord>,
}

/// One touched key after a change.
pub(super) struct After {
    pub key: String,
    /// Its operation after the change (`None`: it has none).
    pub op: Option<OperationRecord>,
    /// Its request for approval, if the change wrote it (`Some(None)`: removed); `None`: the change
    /// did not touch it.
    pub asked: Option<Option<ApprovalRecord>>,
}

impl After {
    pub fn op(op: &OperationRecord) -> After {
        After { key: op.key.clone(), op: Some(op.clone()), asked: None }
    }
}

/// The tables' names, as [`row`] names their rows.
const OPEN: &str = "oncebox_open";
const ENDED: &str = "oncebox_ended";

/// The index rows a transaction writes, the last word per key.
#[derive(Default)]
pub(super) struct IndexWrites {
    /// (key, run) → open.
    open: BTreeMap<String, (String, bool)>,
    /// (ended ms, key) of operations that ended.
    ended: BTreeSet<(i64, String)>,
}

impl IndexWrites {
    pub fn is_empty(&self) -> bool {
        self.open.is_empty() && self.ended.is_empty()
    }

    /// The index of `ops` and `asked`, every record of some runs (a claim not yet recorded among
    /// the operations: its row is every host's, and it is open as any claim is): what the
    /// migration to schema 2 writes.
    pub fn built(ops: &[OperationRecord], asked: &[ApprovalRecord]) -> IndexWrites {
        let mut out = IndexWrites::default();
        for (run, reasons) in run_state::open_runs(ops, &[], asked, 0) {
            for reason in reasons {
                out.open.insert(reason.operation_key, (run.clone(), true));
            }
        }
        for op in ops.iter().filter(|op| expirable(op).is_ok()) {
            out.ended.insert((int(op.updated_ms), op.key.clone()));
        }
        out
    }

    /// A part per table (the keys looked up with `= ANY`, as `writes.rs` says why), for
    /// `combine.rs`; none when there is nothing to write.
    pub fn parts(self) -> Vec<Part> {
        let (mut closed, mut opened, mut runs) = (Vec::new(), Vec::new(), Vec::new());
        for (key, (run, open)) in self.open {
            if open {
                opened.push(key);
                runs.push(run);
            } else {
                closed.push(key);
            }
        }
        let (ended_ms, ended): (Vec<i64>, Vec<String>) = self.ended.into_iter().unzip();
        let mut out = Vec::new();
        let bytes = |keys: &[String]| keys.iter().map(|k| k.len() + 64).sum::<usize>();
        if !closed.is_empty() {
            let (names, size) = (closed.iter().map(|k| row(OPEN, &[k])).collect(), bytes(&closed));
            out.push(Part::of(
                sql!("DELETE FROM oncebox_open WHERE key = ANY($1::text[])", closed),
                Check::None,
                names,
                size,
            ));
        }
        if !opened.is_empty() {
            let (names, size) = (opened.iter().map(|k| row(OPEN, &[k])).collect(), bytes(&opened) + bytes(&runs));
            let statement = sql!(
                "INSERT INTO oncebox_open (key, run_id) SELECT * FROM unnest($1::text[], $2::text[]) \
                 ON CONFLICT (key) DO NOTHING",
                opened,
                runs,
            );
            out.push(Part::of(statement, Check::None, names, size));
        }
        if !ended.is_empty() {
            let names = ended_ms.iter().zip(&ended).map(|(ms, k)| row(ENDED, &[&ms.to_string(), k])).collect();
            let size = bytes(&ended);
            let statement = sql!(
                "INSERT INTO oncebox_ended (ended_ms, key) SELECT * FROM unnest($1::bigint[], $2::text[]) \
                 ON CONFLICT DO NOTHING",
                ended_ms,
                ended,
            );
            out.push(Part::of(statement, Check::None, names, size));
        }
        out
    }

    /// Writes them in `tx` (a job's own transaction).
    pub async fn write(self, tx: &Tx<'_>) -> Result<(), LedgerError> {
        if self.is_empty() {
            return Ok(());
        }
        let statements = combine::statements(self.parts())
            .map_err(|twice| LedgerError::Database { store: tx.store.to_string(), what: twice.to_string() })?;
        for statement in statements {
            let params: Vec<&(dyn deadpool_postgres::tokio_postgres::types::ToSql + Sync)> =
                statement.params.iter().map(|p| p.as_ref() as _).collect();
            tx.exec(&statement.text, &params).await?;
        }
        Ok(())
    }
}

/// Adds to `out` the index rows of run `run` after a change of `touched` (all of that run), by
/// the one rule: from the touched records alone, or from `whole` (every record of the run before
/// the change, which the touched ones replace) if the run is being compensated or the change is
/// a compensation's. Refused if a compensation's change comes without `whole`: its lock and reads
/// were taken for another step than it changed. `tie`: the change is a compensation's though
/// neither the touched records nor `whole` show it (a removal, whose `whole` is read after it).
pub(super) fn reindex(
    store: &str,
    run: &str,
    touched: &[After],
    whole: Option<&Whole>,
    tie: bool,
    out: &mut IndexWrites,
) -> Result<(), LedgerError> {
    let keys: BTreeSet<&str> = touched.iter().map(|a| a.key.as_str()).collect();
    let before = whole.map_or(&[][..], |w| w.ops.as_slice()).iter().filter(|op| keys.contains(op.key.as_str()));
    let ties = tie || touched.iter().filter_map(|a| a.op.as_ref()).chain(before).any(run_state::ties_the_run);
    let (ops, asked): (Vec<OperationRecord>, Vec<ApprovalRecord>) = match whole {
        Some(whole) => {
            let asked_anew: BTreeSet<&str> =
                touched.iter().filter(|a| a.asked.is_some()).map(|a| a.key.as_str()).collect();
            let ops = whole.ops.iter().filter(|op| !keys.contains(op.key.as_str())).cloned();
            let asked = whole.asked.iter().filter(|a| !asked_anew.contains(a.operation_key.as_str())).cloned();
            (
                ops.chain(touched.iter().filter_map(|a| a.op.clone())).collect(),
                asked.chain(touched.iter().filter_map(|a| a.asked.clone().flatten())).collect(),
            )
        }
        None if ties => {
            return Err(LedgerError::Database {
                store: store.to_string(),
                what: format!("a compensation of run {run} was written without its run's lock; nothing was written"),
            });
        }
        None => (
            touched.iter().filter_map(|a| a.op.clone()).collect(),
            touched.iter().filter_map(|a| a.asked.clone().flatten()).collect(),
        ),
    };
    let open = open_keys(&ops, &asked);
    let mut written: BTreeSet<String> = keys.iter().map(|k| k.to_string()).collect();
    if ties {
        written.extend(ops.iter().map(|op| op.key.clone()));
        written.extend(asked.iter().map(|a| a.operation_key.clone()));
    }
    for key in written {
        let is_open = open.contains(&key);
        out.open.insert(key, (run.to_string(), is_open));
    }
    for op in touched.iter().filter_map(|a| a.op.as_ref()).filter(|op| expirable(op).is_ok()) {
        out.ended.insert((int(op.updated_ms), op.key.clone()));
    }
    Ok(())
}

/// Reads every record of each of `runs` that is being compensated, or whose flag says its change
/// is a compensation's: ops and requests, by run, and one row naming each run so read (kind
/// NULL), so that a run with no records yet reads as read and empty, not as not read (a
/// compensation claimed in a run nobody has called is indexed from its empty whole).
/// `$1`/`$2`: [`compensation_steps`].
///
/// Whether a run has a compensation's step is asked by a `LATERAL` subquery with `LIMIT`, which
/// the planner runs per run on the index of (run, step): an `EXISTS` here was planned, on a
/// connection that made its plan while the table was small, as a hashed subplan scanning the
/// whole index for compensation steps of every run, once per group: O(operations ever kept) per
/// group, two fifths of the server's time after 50,000 calls of the bench (BENCHMARKS.md);
/// `pg::groups` counts the index's pages read.
pub(super) const WHOLE_RUNS: &str = "WITH w AS (SELECT u.r FROM unnest($3::text[], $4::bool[]) AS u(r, whole) \
     LEFT JOIN LATERAL (SELECT 1 AS found FROM oncebox_operations o WHERE o.run_id = u.r \
     AND o.step_id >= $1 AND o.step_id < $2 LIMIT 1) AS c ON true WHERE u.whole OR c.found IS NOT NULL) \
     SELECT NULL::bool, r, NULL::bytea FROM w \
     UNION ALL SELECT false, o.run_id, o.record FROM oncebox_operations o WHERE o.run_id = ANY(ARRAY(SELECT r FROM w)) \
     UNION ALL SELECT true, a.run_id, a.record FROM oncebox_approvals a WHERE a.run_id = ANY(ARRAY(SELECT r FROM w))";

/// The statement of [`WHOLE_RUNS`] for `runs` (run, whether its change is a compensation's).
pub(super) fn whole_runs(runs: BTreeMap<String, bool>) -> Sql {
    let (from, to) = compensation_steps();
    let (runs, whole): (Vec<String>, Vec<bool>) = runs.into_iter().unzip();
    sql!(WHOLE_RUNS, from, to, runs, whole)
}

/// What [`WHOLE_RUNS`] answered, by run.
pub(super) fn wholes(rows: &[deadpool_postgres::tokio_postgres::Row]) -> Result<BTreeMap<String, Whole>, LedgerError> {
    let mut out: BTreeMap<String, Whole> = BTreeMap::new();
    for row in rows {
        let kind: Option<bool> = super::db::column(row, 0, "oncebox_operations")?;
        let run: String = super::db::column(row, 1, "oncebox_operations")?;
        let whole = out.entry(run).or_default();
        match kind {
            // The run was read whole (it may have no records).
            None => {}
            Some(true) => whole.asked.push(record(row, 2, "oncebox_approvals")?),
            Some(false) => whole.ops.push(record(row, 2, "oncebox_operations")?),
        }
    }
    Ok(out)
}

/// [`wholes`] read in `tx`, for a job's own transaction, which holds the runs' locks.
pub(super) async fn read_wholes(
    tx: &Tx<'_>,
    runs: BTreeMap<String, bool>,
) -> Result<BTreeMap<String, Whole>, LedgerError> {
    let statement = whole_runs(runs);
    let params: Vec<&(dyn deadpool_postgres::tokio_postgres::types::ToSql + Sync)> =
        statement.params.iter().map(|p| p.as_ref() as _).collect();
    wholes(&tx.rows(&statement.text, &params).await?)
}

/// Reindexes, in `tx` (which holds the locks of the touched keys and of their runs, exclusive
/// where the flag says the change is a compensation's), each run of `touched`: run → (whether the
/// change is a compensation's, the keys after it). Reads the runs it must read whole, then writes.
pub(super) async fn reindex_in(tx: &Tx<'_>, touched: BTreeMap<String, (bool, Vec<After>)>) -> Result<(), LedgerError> {
    let mut out = IndexWrites::default();
    if !touched.is_empty() {
        let wholes = read_wholes(tx, touched.iter().map(|(run, (tie, _))| (run.clone(), *tie)).collect()).await?;
        for (run, (tie, after)) in &touched {
            reindex(tx.store, run, after, wholes.get(run), *tie, &mut out)?;
        }
    }
    out.write(tx).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_compensation_steps_are_the_prefix_s_range() {
        let (from, to) = compensation_steps();
        assert_eq!((from.as_str(), to.as_str()), ("compensate/", "compensate0"));
        let inside = format!("{COMPENSATION_PREFIX}zzz\u{10ffff}");
        assert!(from.as_str() <= inside.as_str() && inside.as_str() < to.as_str());
        assert!("compensate" < from.as_str() && "compensate0" >= to.as_str());
    }
}
