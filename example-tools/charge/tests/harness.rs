//! The harness (`oncebox::testing`) against `charge`: crashed at every point of its effect and
//! faulted in every answer, it charges at most once and ends completed, failed with nothing
//! charged, or honestly unknown.

use oncebox::Grant;
use oncebox::testing::{Harness, Script};

const BASE: &str = "http://downstream.test";

fn harness(script: &str) -> Harness {
    Harness::new(oncebox_artifacts::CHARGE)
        .expect("harness")
        .config("base_url", BASE)
        .grant(Grant::Http(BASE.parse().expect("origin")))
        .script(Script::parse(script).expect("script"))
}

const SCRIPT: &str = r#"
[[effect]]
label = "charge"
status = 201
body = '{"id": "pay_1", "order_id": "o-1", "amount_cents": 500, "status": "succeeded"}'
"#;

#[tokio::test]
async fn a_charge_lands_at_most_once_whatever_point_the_host_dies_at() {
    let args = r#"{"order_id": "o-1", "amount_cents": 500, "currency": "eur", "payment_method": "pm_card"}"#;
    let report = harness(SCRIPT).explore(args).await.expect("explore");
    assert!(report.passed(), "{report}");
    assert_eq!((report.baseline.status.as_str(), report.baseline.landed), ("completed", 1));
    assert!(report.rows.iter().all(|row| row.landed <= 1), "{report}");
    assert!(report.rows.iter().filter(|row| row.crashed).count() >= 5, "{report}");
}
