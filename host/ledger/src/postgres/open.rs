//! The open work of a shared ledger, read through partial indexes that PostgreSQL keeps in the
//! transaction of every write (`schema::open_indexes`): the runs that may be open, then the one
//! rule (`run_state`) over those runs' records only.
//!
//! A run is open only if it has a claimed or unknown operation, a request for approval no
//! operation answers, or a compensation operation: a superset the partial indexes find, which
//! the rule narrows to the runs it names. Grows with O(open + requests for approval + runs
//! compensated and not expired yet), never with the completed operations of other runs.

use std::collections::BTreeMap;

use super::PostgresStore;
use super::db::column;
use crate::{ApprovalRecord, OpenRuns, OperationRecord, run_state};

/// The runs that may be open (see the module's doc), each through its index. The step prefix is
/// `keys::COMPENSATION_PREFIX` (tested below), as in the partial index's predicate.
const CANDIDATES: &str = "SELECT run_id FROM oncebox_operations WHERE status IN ('claimed', 'unknown') \
     UNION SELECT run_id FROM oncebox_operations WHERE step_id LIKE 'compensate/%' \
     UNION SELECT a.run_id FROM oncebox_approvals a \
       WHERE NOT EXISTS (SELECT 1 FROM oncebox_operations o WHERE o.key = a.operation_key)";

/// One page of run ids after `after` (`""`: from the first), in key order: through the run indexes
/// of operations and of requests, each stopping after `limit`. O(page).
pub(super) async fn runs_page(
    store: &PostgresStore,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<String>, crate::LedgerError> {
    const PAGE: &str = "(SELECT DISTINCT run_id FROM oncebox_operations WHERE run_id > $1 ORDER BY run_id LIMIT $2) \
         UNION (SELECT DISTINCT run_id FROM oncebox_approvals WHERE run_id > $1 ORDER BY run_id LIMIT $2) \
         ORDER BY run_id LIMIT $2";
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = store.read(PAGE, &[&after.unwrap_or(""), &limit]).await?;
    rows.iter().map(|row| column::<String>(row, 0, "oncebox_operations")).collect()
}

pub(super) async fn open_runs(store: &PostgresStore, run: Option<&str>, now_ms: u64) -> OpenRuns {
    if let Some(run) = run {
        // One run: its own records, through the run's index.
        return crate::scan_open_runs(store, Some(run), now_ms).await;
    }
    let rows = store.read(CANDIDATES, &[]).await?;
    let runs = rows.iter().map(|row| column::<String>(row, 0, "oncebox_operations")).collect::<Result<Vec<_>, _>>()?;
    if runs.is_empty() {
        return Ok(BTreeMap::new());
    }
    // In flight first: a claim recorded in between is then read as the operation it became.
    let flying: Vec<OperationRecord> = store
        .records(
            "oncebox_operations",
            "SELECT record FROM oncebox_operations WHERE NOT recorded AND run_id = ANY($1) ORDER BY key",
            &[&runs],
        )
        .await?;
    let ops: Vec<OperationRecord> = store
        .records(
            "oncebox_operations",
            "SELECT record FROM oncebox_operations WHERE recorded AND run_id = ANY($1) ORDER BY key",
            &[&runs],
        )
        .await?;
    let asked: Vec<ApprovalRecord> = store
        .records(
            "oncebox_approvals",
            "SELECT record FROM oncebox_approvals WHERE run_id = ANY($1) ORDER BY operation_key",
            &[&runs],
        )
        .await?;
    Ok(run_state::open_runs(&ops, &flying, &asked, now_ms))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_candidates_and_the_partial_index_name_the_compensation_prefix() {
        let like = format!("LIKE '{}%'", oncebox_core::keys::COMPENSATION_PREFIX);
        assert!(super::CANDIDATES.contains(&like));
        assert!(super::super::schema::OPEN_INDEXES.contains(&like));
    }
}
