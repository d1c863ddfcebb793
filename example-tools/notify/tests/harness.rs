//! The harness against `notify`: its outbox message is enqueued with its record, so a crash after
//! the attempt's record replays it, never enqueues it twice.

use oncebox::Grant;
use oncebox::testing::{Harness, Script};

const BASE: &str = "http://downstream.test";

fn harness(script: &str) -> Harness {
    Harness::new(oncebox_artifacts::NOTIFY)
        .expect("harness")
        .config("base_url", BASE)
        .grant(Grant::Http(BASE.parse().expect("origin")))
        .grant(Grant::Outbox("email".into()))
        .script(Script::parse(script).expect("script"))
}

#[tokio::test]
async fn a_notification_survives_a_crash_after_its_record() {
    let args = r#"{"order_id": "o-1", "email": "a@example.com", "template": "shipped"}"#;
    let report = harness("").explore(args).await.expect("explore");
    assert!(report.passed(), "{report}");
    assert_eq!(report.baseline.status, "completed");
    assert!(report.rows.iter().all(|row| row.crashed && row.status == "completed"), "{report}");
}
