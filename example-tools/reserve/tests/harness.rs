//! The harness against `reserve`: its effects are KV writes committed with their records, so a
//! crash after the attempt's record replays the reservation, never counts it twice.

use oncebox::Grant;
use oncebox::testing::{Harness, Script};

const BASE: &str = "http://downstream.test";

fn harness(script: &str) -> Harness {
    Harness::new(oncebox_artifacts::RESERVE)
        .expect("harness")
        .config("base_url", BASE)
        .grant(Grant::Http(BASE.parse().expect("origin")))
        .grant(Grant::Kv("reservations".into()))
        .script(Script::parse(script).expect("script"))
}

#[tokio::test]
async fn a_reservation_survives_a_crash_after_its_record() {
    let report = harness("").explore(r#"{"order_id": "o-1", "sku": "sku-1", "quantity": 2}"#).await.expect("explore");
    assert!(report.passed(), "{report}");
    assert_eq!(report.baseline.status, "completed");
    assert!(report.rows.iter().all(|row| row.crashed && row.status == "completed"), "{report}");
}
