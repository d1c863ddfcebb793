//! The HTTP API with a plain client.

use serde_json::json;

use super::support::{Setup, client};
use crate::support::charge;

#[tokio::test(flavor = "multi_thread")]
async fn a_call_is_answered_as_oncebox_call_prints_it_and_its_repeat_from_the_ledger() {
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let setup = Setup::new(&provider);
    let server = setup.serve();
    let http = client();
    let body = json!({ "run_id": "r1", "step_id": "charge-o1", "tool": "charge", "args": charge("o1") });
    let first = http.post(server.url("/v1/calls")).json(&body).send().await.expect("call");
    assert_eq!(first.status(), 200);
    assert_eq!(first.headers()["oncebox-source"], "fresh");
    let first: serde_json::Value = first.json().await.expect("json");
    assert_eq!(first["status"], "completed", "{first}");
    assert_eq!(first["replayed"], false);
    let again: serde_json::Value =
        http.post(server.url("/v1/calls")).json(&body).send().await.expect("call").json().await.expect("json");
    assert_eq!(again["status"], "completed");
    assert_eq!(again["replayed"], true);
    assert_eq!(again["output"], first["output"]);
    assert_eq!(provider.counts("o1").payments, 1, "one charge at the provider");
}
