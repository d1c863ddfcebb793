//! The harness against `fulfill` (irreversible): never sent twice, whatever point the host dies
//! at; a shipment in doubt is reconciled by its key, never resent.

use oncebox::Grant;
use oncebox::testing::{Harness, Script};

const BASE: &str = "http://downstream.test";

fn harness(script: &str) -> Harness {
    Harness::new(oncebox_artifacts::FULFILL)
        .expect("harness")
        .config("base_url", BASE)
        .grant(Grant::Http(BASE.parse().expect("origin")))
        .script(Script::parse(script).expect("script"))
}

const SCRIPT: &str = r#"
[[effect]]
label = "ship"
status = 201
body = '{"id": "shp_1", "order_id": "o-1", "status": "shipped"}'
"#;

#[tokio::test]
async fn a_shipment_is_sent_at_most_once_and_reconciled_when_in_doubt() {
    let args = r#"{"order_id": "o-1", "address": "1 Main St", "items": [{"sku": "sku-1", "quantity": 1}]}"#;
    let report = harness(SCRIPT).explore(args).await.expect("explore");
    assert!(report.passed(), "{report}");
    // Irreversible: no scenario sends the shipment twice, not even with its key.
    assert!(report.rows.iter().all(|row| row.sent <= 1), "{report}");
    let lost = report.rows.iter().find(|row| row.point == "lost-response").expect("row");
    assert_eq!((lost.status.as_str(), lost.reconciles), ("completed", 1), "{report}");
    // Written ahead, never sent: the lookup proves it not taken (once the request's timeout has
    // passed), and an irreversible step then fails rather than ship unapproved a second time.
    let unsent = report.rows.iter().find(|row| row.point == "after-write-ahead").expect("row");
    assert_eq!((unsent.status.as_str(), unsent.sent), ("failed", 0), "{report}");
}
