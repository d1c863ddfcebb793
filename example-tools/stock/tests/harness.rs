//! The harness against `stock` (read-only): it has no effects, so the only crash point is the
//! attempt's record, and a restart answers from the ledger.

use oncebox::Grant;
use oncebox::testing::{Harness, Script};

const BASE: &str = "http://downstream.test";

fn harness(script: &str) -> Harness {
    Harness::new(oncebox_artifacts::STOCK)
        .expect("harness")
        .config("base_url", BASE)
        .grant(Grant::Http(BASE.parse().expect("origin")))
        .script(Script::parse(script).expect("script"))
}

const SCRIPT: &str = r#"
[[read]]
url_contains = "/inventory/sku-1"
body = '{"sku": "sku-1", "available": 7}'
"#;

#[tokio::test]
async fn a_stock_read_survives_a_crash_after_its_record() {
    let report = harness(SCRIPT).explore(r#"{"sku": "sku-1"}"#).await.expect("explore");
    assert!(report.passed(), "{report}");
    assert_eq!((report.baseline.status.as_str(), report.baseline.sent), ("completed", 0));
    assert_eq!(report.rows.len(), 1, "{report}");
    assert!(report.rows[0].crashed && report.rows[0].status == "completed", "{report}");
}
