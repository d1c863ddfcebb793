//! The harness for tool authors (`oncebox::testing`), against the example tools and the
//! deliberately broken `key-changer`: the real pipeline and ledger, crashed at every point, with
//! effects counted where they land (the script's own log of dispatches).

use oncebox::Grant;
use oncebox::Status;
use oncebox::testing::{Fault, Harness, Injection, Point, Script, Violation};

const BASE: &str = "http://downstream.test";

fn harness(component: &str, script: &str) -> Harness {
    Harness::new(component)
        .expect("harness")
        .config("base_url", BASE)
        .grant(Grant::Http(BASE.parse().expect("origin")))
        .script(Script::parse(script).expect("script"))
}

const PAYMENT: &str = r#"
[[effect]]
label = "charge"
status = 201
body = '{"id": "pay_1", "order_id": "o-1", "amount_cents": 500, "status": "succeeded"}'
"#;

fn charge_args() -> String {
    serde_json::json!({"order_id": "o-1", "amount_cents": 500, "currency": "eur", "payment_method": "pm_card"})
        .to_string()
}

#[tokio::test]
async fn every_crash_point_and_fault_of_a_charge_keeps_it_charged_at_most_once() {
    let report = harness(oncebox_artifacts::CHARGE, PAYMENT).explore(&charge_args()).await.expect("explore");
    assert!(report.passed(), "{report}");
    assert_eq!(report.baseline.status, "completed");
    assert_eq!((report.baseline.sent, report.baseline.landed), (1, 1));
    // One effect: four crash points and six faults, plus the one attempt's record.
    assert_eq!(report.rows.len(), 4 + 6 + 1, "{report}");
    for row in &report.rows {
        assert!(row.landed <= 1, "{report}");
        let crash =
            ["before-write-ahead", "after-write-ahead", "after-dispatch", "after-answer", "after-attempt-record"];
        if crash.contains(&row.point.as_str()) {
            assert!(row.crashed, "the host crashed at {}: {report}", row.point);
        }
    }
    let after_dispatch = report.rows.iter().find(|r| r.point == "after-dispatch").expect("row");
    // The charge landed before the crash; the restarted host resent it with its key (the script
    // honours keys) and got the commit replayed: one charge, the fault-free result.
    assert_eq!((after_dispatch.status.as_str(), after_dispatch.sent, after_dispatch.landed), ("completed", 2, 1));
    // A crash after the answer loses it as a killed process does (it rode with the next durable
    // commit, which never came): the same as after the dispatch.
    let after_answer = report.rows.iter().find(|r| r.point == "after-answer").expect("row");
    assert_eq!((after_answer.status.as_str(), after_answer.sent, after_answer.landed), ("completed", 2, 1));
    let permanent = report.rows.iter().find(|r| r.point == "permanent").expect("row");
    assert_eq!((permanent.status.as_str(), permanent.landed), ("failed", 0), "{report}");
}

/// After the dispatch, or after the answer (which rode with the next durable commit, and the
/// crash came first): either way the answer is lost with the host.
#[tokio::test]
async fn a_crash_after_dispatch_or_answer_at_a_downstream_without_keys_is_reconciled_never_resent() {
    let script = format!("[downstream]\nhonours_keys = false\n{PAYMENT}");
    for point in [Point::AfterDispatch, Point::AfterAnswer] {
        let run = harness(oncebox_artifacts::CHARGE, &script)
            .run(&charge_args(), Some(&Injection::crash(point, 0)))
            .await
            .expect("run");
        assert!(run.crashed, "{point:?}");
        assert_eq!(run.dispatches.len(), 1, "{point:?}: nothing was sent again: {:?}", run.dispatches);
        assert!(run.dispatches[0].landed && run.dispatches[0].in_doubt, "{point:?}: {:?}", run.dispatches);
        // Restarted, the step was unknown; the tool's reconcile looked the key up and found the charge.
        assert_eq!(run.outcome.status, Status::Completed, "{point:?}: {:?}", run.outcome);
        assert!(
            matches!(run.reconciles.first(), Some(oncebox::Reconciliation::Committed { .. })),
            "{point:?}: {:?}",
            run.reconciles
        );
        assert_eq!(run.outcome.output.as_ref().expect("output")["id"], "pay_1");
    }
}

#[tokio::test]
async fn a_permanent_refusal_fails_the_step_and_nothing_landed() {
    let run = harness(oncebox_artifacts::CHARGE, PAYMENT)
        .run(&charge_args(), Some(&Injection::fault(Fault::Permanent, 0)))
        .await
        .expect("run");
    assert_eq!(run.outcome.status, Status::Failed, "{:?}", run.outcome);
    assert_eq!(run.dispatches.len(), 1);
    assert!(!run.dispatches[0].landed);
}

#[tokio::test]
async fn exploration_catches_a_tool_whose_effect_key_changes_between_attempts() {
    let script = "[[effect]]\nlabel = \"unused\"\n";
    let args = serde_json::json!({"order_id": "o-1", "amount_cents": 500}).to_string();
    let report = harness(oncebox_artifacts::KEY_CHANGER, script).explore(&args).await.expect("explore");
    assert!(!report.passed(), "the broken tool passed: {report}");
    // The host itself refuses the new key while the first effect took place or may have: nothing
    // lands twice, and the harness reports the divergence where the step ran again.
    let duplicates = report.violations().filter(|(_, v)| matches!(v, Violation::Duplicate { .. })).count();
    assert_eq!(duplicates, 0, "the host sent nothing twice: {report}");
    let diverged: Vec<_> = report
        .violations()
        .filter_map(|(row, v)| match v {
            Violation::Diverged(detail) => Some((row, detail)),
            _ => None,
        })
        .collect();
    for (row, detail) in &diverged {
        assert!(detail.contains("the tool diverged: effect `refund-"), "{detail}");
        assert!(detail.contains("nothing was sent"), "{detail}");
        assert_ne!(row.point, "before-write-ahead", "nothing was written or sent before that crash: {report}");
    }
    for row in report.rows.iter().filter(|row| row.point != "fault-free") {
        assert!(row.landed <= 1, "landed at most once: {report}");
    }
    // Caught where the first send's answer was lost (or its record survived a crash) and the step
    // ran again with a new key.
    for point in ["after-dispatch", "after-answer", "lost-response", "commit-then-5xx"] {
        assert!(diverged.iter().any(|(row, _)| row.point == point), "not caught at {point}: {report}");
    }
    let text = report.to_string();
    assert!(text.contains("diverged: the tool diverged: effect `refund-"), "{text}");
}

#[tokio::test]
async fn exploration_catches_a_tool_that_resends_its_own_lost_answer() {
    let script = "[[effect]]\nlabel = \"unused\"\n";
    let args = serde_json::json!({"order_id": "o-1", "amount_cents": 500}).to_string();
    let report = harness(oncebox_artifacts::SELF_RETRIER, script).explore(&args).await.expect("explore");
    assert!(!report.passed(), "the broken tool passed: {report}");
    let duplicates = report.violations().filter(|(_, v)| matches!(v, Violation::Duplicate { .. })).count();
    assert_eq!(duplicates, 0, "the host sent nothing twice: {report}");
    for row in report.rows.iter().filter(|row| row.point != "fault-free") {
        assert!(row.landed <= 1, "landed at most once: {report}");
    }
    // Caught in the attempt whose answer was lost, where the tool asked again itself.
    let diverged: Vec<_> = report
        .violations()
        .filter_map(|(row, v)| match v {
            Violation::Diverged(detail) => Some((row.point.clone(), detail.clone())),
            _ => None,
        })
        .collect();
    for point in ["lost-response", "commit-then-5xx"] {
        let caught = diverged.iter().find(|(at, _)| at == point);
        assert!(
            caught.is_some_and(|(_, detail)| detail.contains("earlier in this attempt")),
            "not caught at {point}: {report}"
        );
    }
}

#[test]
fn oncebox_test_explore_exits_nonzero_naming_the_effect_the_point_and_the_divergence() {
    let dir = tempfile::tempdir().expect("dir");
    let script = dir.path().join("script.toml");
    std::fs::write(&script, "[downstream]\nhonours_keys = true\n").expect("write");
    let args = r#"{"order_id":"o-1","amount_cents":500}"#;
    let grant = format!("http={BASE}");
    let config = format!("base_url={BASE}");
    let common = ["--script", script.to_str().expect("utf8"), "--grant", &grant, "--config", &config, "--args", args];
    let mut broken = vec!["test", oncebox_artifacts::KEY_CHANGER, "--explore"];
    broken.extend(common);
    let (code, _, stderr) = crate::support::oncebox(&broken);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("invariant broken: effect refund-"), "{stderr}");
    assert!(stderr.contains(" at after-dispatch: diverged: the tool diverged: effect `refund-"), "{stderr}");
    assert!(stderr.contains("A label must not change between attempts"), "{stderr}");

    // The same downstream and args, a tool whose key holds: every row passes, exit 0.
    let mut sound = vec!["test", oncebox_artifacts::REFUND, "--explore"];
    sound.extend(common);
    let (code, _, stderr) = crate::support::oncebox(&sound);
    assert_eq!(code, 0, "{stderr}");
}

#[test]
fn oncebox_new_writes_a_crate_of_every_class_and_prints_the_next_three_commands() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().to_str().expect("utf8");
    for (class, reconciles) in
        [("read-only", false), ("idempotent-write", false), ("compensatable", true), ("irreversible", true)]
    {
        let name = format!("my-{class}");
        let (code, _, stderr) = crate::support::oncebox(&["new", &name, "--class", class, "--path", path]);
        assert_eq!(code, 0, "{stderr}");
        let crate_dir = dir.path().join(&name);
        let manifest = std::fs::read_to_string(crate_dir.join("Cargo.toml")).expect("Cargo.toml");
        assert!(manifest.contains("oncebox-sdk = { path = "), "{manifest}");
        assert!(manifest.contains("[workspace]") && manifest.contains("cdylib"), "{manifest}");
        let config = std::fs::read_to_string(crate_dir.join(".cargo/config.toml")).expect("config");
        assert!(config.contains("wasm32-wasip2"));
        let tool = std::fs::read_to_string(crate_dir.join("src/lib.rs")).expect("lib.rs");
        assert!(tool.contains(&format!("const NAME: &'static str = \"{name}\"")), "{tool}");
        assert!(tool.contains(&format!("class = {}", class.replace('-', "_"))), "{tool}");
        assert_eq!(tool.contains("impl Reconcile for"), reconciles, "{class}");
        assert!(!tool.contains("{{"), "an unfilled placeholder: {tool}");
        assert!(crate_dir.join("oncebox.toml").exists() && crate_dir.join("harness.toml").exists());
        oncebox::testing::Script::load(&crate_dir.join("harness.toml")).expect("the harness script parses");
        oncebox::policy_file::PolicyFile::load(&crate_dir.join("oncebox.toml")).expect("the policy file parses");
    }
    // Python and JavaScript: the project of every class, its class where the build reads it, a
    // reconcile exactly where the class exports one, and the shared policy file and script.
    for (lang, tool_file, settings, reconcile) in
        [("python", "app.py", "pyproject.toml", "def reconcile("), ("js", "tool.js", "package.json", "reconcile(")]
    {
        for (class, reconciles) in
            [("read-only", false), ("idempotent-write", false), ("compensatable", true), ("irreversible", true)]
        {
            let name = format!("{lang}-{class}");
            let (code, _, stderr) =
                crate::support::oncebox(&["new", &name, "--class", class, "--lang", lang, "--path", path]);
            assert_eq!(code, 0, "{stderr}");
            let project = dir.path().join(&name);
            let tool = std::fs::read_to_string(project.join(tool_file)).expect("the tool");
            let settings = std::fs::read_to_string(project.join(settings)).expect("the build's settings");
            assert!(tool.contains(&name) && settings.contains(&format!("\"{class}\"")), "{lang} {class}: {settings}");
            assert_eq!(tool.contains(reconcile), reconciles, "{lang} {class}: {tool}");
            for placeholder in ["{{name}}", "{{class}}", "{{sdk}}", "{{args}}", "{{crate}}"] {
                assert!(!tool.contains(placeholder) && !settings.contains(placeholder), "{placeholder}: {tool}");
            }
            oncebox::testing::Script::load(&project.join("harness.toml")).expect("the harness script parses");
            oncebox::policy_file::PolicyFile::load(&project.join("oncebox.toml")).expect("the policy file parses");
        }
    }
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_oncebox"))
        .args(["new", "printed", "--class", "compensatable", "--path", path])
        .output()
        .expect("run oncebox");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let next: Vec<&str> = stdout.lines().skip_while(|l| *l != "next:").skip(1).map(str::trim).collect();
    assert_eq!(next.len(), 3, "{stdout}");
    assert!(next[0].starts_with("cd ") && next[0].ends_with("printed"), "{stdout}");
    assert_eq!(next[1], "cargo build --release");
    assert!(
        next[2].starts_with("oncebox test target/wasm32-wasip2/release/printed.wasm ")
            && next[2].ends_with("--explore")
    );
    // A second time: refused, nothing overwritten.
    let (code, _, stderr) = crate::support::oncebox(&["new", "my-read-only", "--class", "read-only", "--path", path]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("exists already"), "{stderr}");
    let (code, _, stderr) = crate::support::oncebox(&["new", "Bad_Name", "--class", "read-only", "--path", path]);
    assert_eq!(code, 2, "{stderr}");
}
