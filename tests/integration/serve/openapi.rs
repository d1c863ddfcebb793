//! Requests generated from `/openapi.json` by schemathesis (PyPI): every answer conforms to the
//! document (status, content type, schema) and none is a 5xx.

use oncebox_example_provider::Provider;

use super::support::{Setup, TOKEN, python};

#[tokio::test(flavor = "multi_thread")]
async fn requests_generated_from_the_openapi_document_find_no_5xx_and_no_undocumented_answer() {
    let provider = Provider::start().await.expect("provider");
    let setup = Setup::new(&provider);
    let server = setup.serve();
    let python = python();
    let report = setup.dir.path().join("schemathesis");
    let mut command = std::process::Command::new(python);
    command
        .args(["-m", "schemathesis.cli", "run"])
        .arg(server.url("/openapi.json"))
        // Every check but one: `positive_data_acceptance` expects any schema-valid body to be
        // accepted, but a call's `args` are checked against the called tool's own input schema,
        // which one document for every tool cannot state; those calls are rightly 400.
        .args(["--checks", "all", "--exclude-checks", "positive_data_acceptance"])
        .args(["--max-examples", "25", "--workers", "1", "--seed", "13", "--no-color"])
        .args(["-H", &format!("Authorization: Bearer {TOKEN}")])
        .arg("--report-dir")
        .arg(&report)
        // Its example cache (`.schemathesis/`, `.hypothesis/`) goes beside the report, not into
        // the source tree.
        .current_dir(setup.dir.path())
        .env("SCHEMATHESIS_HOOKS", "");
    // The provider answers on this runtime while schemathesis runs.
    let output = tokio::task::spawn_blocking(move || command.output()).await.expect("join").expect("run schemathesis");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "schemathesis found failures:\n{stdout}\n{}\nserver log:\n{}",
        String::from_utf8_lossy(&output.stderr),
        server.log()
    );
    assert!(stdout.contains("15/15"), "every operation was tested:\n{stdout}");
    assert_eq!(provider.totals().payments, 0, "no generated call charged anyone");
}
