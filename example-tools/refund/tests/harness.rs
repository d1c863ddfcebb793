//! The harness against `refund` (idempotent-write): its key survives every crash, so a resend is
//! answered by the downstream's record of the first, never refunded twice.

use oncebox::Grant;
use oncebox::testing::{Harness, Script};

const BASE: &str = "http://downstream.test";

fn harness(script: &str) -> Harness {
    Harness::new(oncebox_artifacts::REFUND)
        .expect("harness")
        .config("base_url", BASE)
        .grant(Grant::Http(BASE.parse().expect("origin")))
        .script(Script::parse(script).expect("script"))
}

const SCRIPT: &str = r#"
[[effect]]
label = "refund"
status = 201
body = '{"id": "re_1", "order_id": "o-1", "amount_cents": 500, "status": "succeeded"}'
"#;

#[tokio::test]
async fn a_refund_lands_at_most_once_whatever_point_the_host_dies_at() {
    let report = harness(SCRIPT).explore(r#"{"order_id": "o-1", "amount_cents": 500}"#).await.expect("explore");
    assert!(report.passed(), "{report}");
    assert!(report.rows.iter().all(|row| row.landed <= 1), "{report}");
    // Restarted after the dispatch, the host resent the refund with its key (the script honours
    // keys) and completed with the first refund's answer.
    let row = report.rows.iter().find(|row| row.point == "after-dispatch").expect("row");
    assert_eq!((row.status.as_str(), row.sent, row.landed), ("completed", 2, 1), "{report}");
}
