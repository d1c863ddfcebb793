//! Reading a shared ledger's open work and runs: through the index of open work (`index.rs`),
//! never every operation.
//!
//! The index is two tables of its own, not a partial index on `oncebox_operations.status`: a row
//! whose indexed column changes is not rewritten in place (no HOT update), and every operation's
//! status changes at its end, which would cost each call a new entry in every index of the table
//! (`pg::groups` counts them).

use std::collections::BTreeMap;

use super::PostgresStore;
use super::db::{column, record};
use super::index::compensation_steps;
use crate::run_state::{self, Open};
use crate::{ApprovalRecord, LedgerError, OperationRecord, OutboxMessage, expirable};

/// One page of run ids after `after` (`""`: from the first), in key order: through the run indexes
/// of operations and of requests, each stopping after `limit`. O(page).
pub(super) async fn runs_page(
    store: &PostgresStore,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<String>, crate::LedgerError> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = store.read(RUNS_PAGE, &[&after.unwrap_or(""), &limit]).await?;
    rows.iter().map(|row| column::<String>(row, 0, "oncebox_operations")).collect()
}

pub(super) const RUNS_PAGE: &str = "(SELECT DISTINCT run_id FROM oncebox_operations WHERE run_id > $1 \
     ORDER BY run_id LIMIT $2) \
     UNION (SELECT DISTINCT run_id FROM oncebox_approvals WHERE run_id > $1 ORDER BY run_id LIMIT $2) \
     ORDER BY run_id LIMIT $2";

/// The records that may keep a run open, in one statement (one snapshot: a claim recorded
/// meanwhile is read once, as what it is): the operations and requests of the keys the index
/// holds, and every operation of the runs among them being compensated (where the rule judges the
/// run whole). Rows: (is a request, record, recorded). `$1`/`$2`: the compensation steps
/// (`index::compensation_steps`). Keys and runs are looked up as arrays (`= ANY`), so that the
/// plan each session keeps reads them by the tables' keys however large the tables grew
/// (`writes.rs`). Two statements, all runs' and one run's (`$3`), as `in_flight`
/// is (a generic plan of `$3 IS NULL OR ...` could not use the run index).
macro_rules! open_records {
    ($open:literal) => {
        concat!(
            "WITH x AS (",
            $open,
            "), c AS (SELECT r.run_id FROM (SELECT DISTINCT run_id FROM x) AS r WHERE EXISTS \
             (SELECT 1 FROM oncebox_operations o WHERE o.run_id = r.run_id AND o.step_id >= $1 AND o.step_id < $2)) \
             SELECT false, o.record, o.recorded FROM oncebox_operations o WHERE o.key = ANY(ARRAY(SELECT key FROM x)) \
             UNION ALL SELECT false, o.record, o.recorded FROM oncebox_operations o \
             WHERE o.run_id = ANY(ARRAY(SELECT run_id FROM c)) AND o.key <> ALL(ARRAY(SELECT key FROM x)) \
             UNION ALL SELECT true, a.record, true FROM oncebox_approvals a \
             WHERE a.operation_key = ANY(ARRAY(SELECT key FROM x))"
        )
    };
}
const OPEN_ALL: &str = open_records!("SELECT key, run_id FROM oncebox_open");
const OPEN_OF_RUN: &str = open_records!("SELECT key, run_id FROM oncebox_open WHERE run_id = $3");

/// What keeps each run (or `run`) open at `now_ms`: O(open keys), plus the operations of the
/// runs being compensated.
pub(super) async fn open_runs(
    store: &PostgresStore,
    run: Option<&str>,
    now_ms: u64,
) -> Result<BTreeMap<String, Vec<Open>>, LedgerError> {
    let (from, to) = compensation_steps();
    let rows = match run {
        None => store.read(OPEN_ALL, &[&from, &to]).await?,
        Some(run) => store.read(OPEN_OF_RUN, &[&from, &to, &run]).await?,
    };
    let (mut ops, mut flying, mut asked): (Vec<OperationRecord>, Vec<OperationRecord>, Vec<ApprovalRecord>) =
        Default::default();
    for row in &rows {
        let is_request: bool = column(row, 0, "oncebox_open")?;
        if is_request {
            asked.push(record(row, 1, "oncebox_approvals")?);
        } else if column(row, 2, "oncebox_operations")? {
            ops.push(record(row, 1, "oncebox_operations")?);
        } else {
            // A claim not yet recorded: what the other backends read as in flight.
            flying.push(record(row, 1, "oncebox_operations")?);
        }
    }
    Ok(run_state::open_runs(&ops, &flying, &asked, now_ms))
}

/// The completed and failed operations last written before `cutoff_ms`, oldest first: O(expired).
pub(super) async fn ended_before(store: &PostgresStore, cutoff_ms: u64) -> Result<Vec<OperationRecord>, LedgerError> {
    let sql = "SELECT o.record FROM oncebox_operations o \
               WHERE o.key = ANY(ARRAY(SELECT key FROM oncebox_ended WHERE ended_ms < $1))";
    let cutoff = i64::try_from(cutoff_ms).unwrap_or(i64::MAX);
    let mut ops: Vec<OperationRecord> = store.records("oncebox_operations", sql, &[&cutoff]).await?;
    // As the record says, should an entry be older than its record.
    let mut seen = std::collections::HashSet::new();
    ops.retain(|op| expirable(op).is_ok() && op.updated_ms < cutoff_ms && seen.insert(op.key.clone()));
    ops.sort_by(|a, b| (a.updated_ms, &a.key).cmp(&(b.updated_ms, &b.key)));
    Ok(ops)
}

/// The requests for approval last written before `cutoff_ms`, oldest first: through the
/// expression index by age (`schema.rs`), O(requests before the cutoff).
pub(super) async fn approvals_before(
    store: &PostgresStore,
    cutoff_ms: u64,
) -> Result<Vec<ApprovalRecord>, LedgerError> {
    let sql = "SELECT record FROM oncebox_approvals WHERE oncebox_approval_written(record) < $1::bigint::numeric \
               ORDER BY oncebox_approval_written(record), operation_key";
    let cutoff = i64::try_from(cutoff_ms).unwrap_or(i64::MAX);
    let mut asked: Vec<ApprovalRecord> = store.records("oncebox_approvals", sql, &[&cutoff]).await?;
    // As the one rule says, should the SQL ever say otherwise (the conformance suite checks it does not).
    asked.retain(|a| a.last_written() < cutoff_ms);
    asked.sort_by(|a, b| (a.last_written(), &a.operation_key).cmp(&(b.last_written(), &b.operation_key)));
    Ok(asked)
}

/// The outbox messages delivered before `cutoff_ms`, in order of delivery: through the partial
/// expression index of delivered messages (`schema.rs`), O(messages delivered before the cutoff).
pub(super) async fn delivered_before(store: &PostgresStore, cutoff_ms: u64) -> Result<Vec<OutboxMessage>, LedgerError> {
    let sql = "SELECT record FROM oncebox_outbox WHERE delivered AND oncebox_delivered_ms(record) < $1::bigint::numeric \
               ORDER BY oncebox_delivered_ms(record), seq";
    let cutoff = i64::try_from(cutoff_ms).unwrap_or(i64::MAX);
    let mut delivered: Vec<OutboxMessage> = store.records("oncebox_outbox", sql, &[&cutoff]).await?;
    delivered.retain(|m| m.delivery.delivered_ms.is_some_and(|at| at < cutoff_ms));
    Ok(delivered)
}
