//! The docs' Python orchestrator loop (`tests/serve/orchestrator.py`, quoted whole in
//! docs/serving.md), run for real against a server: it names the steps, stops at the approval, and run
//! again after it finishes the run without charging twice.

use oncebox_example_provider::Provider;
use serde_json::{Value, json};

use super::support::{Setup, TOKEN, client};

fn orchestrate(base: &str, order: &str) -> Vec<Value> {
    let script = crate::docs::root().join("tests/serve/orchestrator.py");
    let output = std::process::Command::new("python3").arg(script).args([base, order]).output().expect("python3");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).lines().map(|l| serde_json::from_str(l).expect("json line")).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_readme_orchestrator_runs_a_workflow_through_an_approval_without_doing_anything_twice() {
    let serving = std::fs::read_to_string(crate::docs::root().join("docs/serving.md")).expect("docs/serving.md");
    let script = std::fs::read_to_string(crate::docs::root().join("tests/serve/orchestrator.py")).expect("script");
    assert!(serving.contains(&script), "docs/serving.md quotes tests/serve/orchestrator.py whole");

    let provider = Provider::start().await.expect("provider");
    let setup = Setup::new(&provider);
    let server = setup.serve();
    let base = server.base_url.clone();
    let first = tokio::task::spawn_blocking({
        let base = base.clone();
        move || orchestrate(&base, "py-1")
    })
    .await
    .expect("join");
    assert_eq!(first[0], json!({ "step": "0-charge", "status": "completed", "replayed": false }), "{first:?}");
    assert_eq!(first[1]["status"], "awaiting-approval", "{first:?}");
    assert_eq!(provider.counts("py-1").fulfillments, 0);

    let (_, pending) = {
        let response = client().get(server.url("/v1/approvals?pending=true")).send().await.expect("get");
        (response.status(), response.json::<Value>().await.expect("json"))
    };
    let request = &pending["approvals"][0];
    let key = request["operation_key"].as_str().expect("key");
    let approve = client()
        .post(server.url(&format!("/v1/approvals/{key}/approve")))
        .bearer_auth(TOKEN)
        .json(&json!({ "fingerprint": request["fingerprint"], "component": request["component"], "by": "ops" }))
        .send()
        .await
        .expect("approve");
    assert_eq!(approve.status(), 200);

    let second = tokio::task::spawn_blocking(move || orchestrate(&base, "py-1")).await.expect("join");
    assert_eq!(second[0], json!({ "step": "0-charge", "status": "completed", "replayed": true }), "{second:?}");
    assert_eq!(second[1]["status"], "completed", "{second:?}");
    assert_eq!(second[2]["result"], "done");
    let counts = provider.counts("py-1");
    assert_eq!((counts.payments, counts.fulfillments), (1, 1), "charged once, shipped once");
}
