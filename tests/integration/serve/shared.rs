//! Two servers on one PostgreSQL ledger (`--ledger postgres://…`, one key file): requests for
//! one step spread over both give one charge, counted at the provider.

use oncebox_example_provider::{Fault, FaultKind, Provider, Route, Settings};
use serde_json::{Value, json};

use super::support::{Setup, client};
use crate::support::charge;

#[tokio::test(flavor = "multi_thread")]
async fn sixty_four_requests_for_one_step_over_two_servers_on_one_database_give_one_charge() {
    let provider = Provider::start().await.expect("provider");
    provider.configure(Settings { honour_keys: false, ..Settings::default() });
    provider.arm(Fault::new(Route::Payments, FaultKind::CommitAfterDelay { delay_ms: 400 }).for_order("pg64"));
    let setup = Setup::new(&provider).on_shared(crate::pg::fresh_database().await);
    let servers = [setup.serve(), setup.serve()];
    let mut tasks = Vec::new();
    for i in 0..64 {
        let url = servers[i % 2].url("/v1/calls");
        let body =
            json!({ "run_id": "pg", "step_id": "charge-pg64", "tool": "charge", "args": charge("pg64"), "wait": 30 });
        tasks.push(tokio::spawn(async move {
            let response = client().post(&url).json(&body).send().await.expect("post");
            assert_eq!(response.status(), 200);
            response.json::<Value>().await.expect("json")
        }));
    }
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.expect("task")["status"].as_str().unwrap_or_default().to_string());
    }
    provider.settled().await;
    assert_eq!(provider.counts("pg64").payments, 1, "one charge over both servers: {statuses:?}");
    assert_eq!(provider.requests(), 1, "one request reached the provider");
    assert!(statuses.iter().all(|s| s == "completed"), "each waited for the one charge: {statuses:?}");
}
