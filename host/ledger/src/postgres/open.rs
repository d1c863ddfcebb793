//! Listing a shared ledger's runs by the page.
//!
//! What is open is not indexed here yet: the one rule is computed from a scan
//! (`Store::open_runs`'s default). A partial index on the status would find it, but a row whose
//! indexed column changes is not rewritten in place (no HOT update), and every operation's status
//! changes at its end: that costs each call a new index entry in every index of the table
//! (`pg::groups` measures it). An open-work table written in the transaction of each state change
//! is the way, and is left to do.

use super::PostgresStore;
use super::db::column;

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
