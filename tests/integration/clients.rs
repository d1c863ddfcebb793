//! The Python client (`clients/python`) and its LangGraph and DBOS helpers, run for real: a venv
//! made on first use from `clients/python/tests/requirements.txt` (pinned, from PyPI) with the
//! client installed from the checkout, a real `oncebox serve`, the real example provider, and the
//! scenario scripts of `clients/python/tests/`. Charges are counted at the provider; each
//! framework scenario runs a control without oncebox, which charges twice.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use oncebox_example_provider::{Fault, FaultKind, Provider, ProviderHandle, Route};
use serde_json::Value;

use crate::serve::support::{Server, Setup, TOKEN};

/// The venv's python, with the pinned requirements and the client as it is now (pip builds and
/// reinstalls a directory every time it is named).
fn python() -> PathBuf {
    let client = crate::docs::root().join("clients/python");
    let requirements = client.join("tests/requirements.txt");
    let wanted = format!(
        "{}\n{}",
        std::fs::read_to_string(&requirements).expect("clients/python/tests/requirements.txt"),
        sources(&client.join("src"))
    );
    crate::support::venv("clients-venv", &["-r".as_ref(), requirements.as_os_str(), client.as_os_str()], &wanted)
}

/// The client's source files, named and sized with their modification times: a change reinstalls it.
fn sources(dir: &Path) -> String {
    let mut files: Vec<String> = std::fs::read_dir(dir.join("oncebox"))
        .expect("clients/python/src/oncebox")
        .filter_map(Result::ok)
        .filter(|e| e.path().is_file())
        .map(|e| {
            let text = std::fs::read(e.path()).unwrap_or_default();
            format!("{} {:x}", e.file_name().to_string_lossy(), fnv(&text))
        })
        .collect();
    files.sort();
    files.join("\n")
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3))
}

/// A provider and a server on it, for one scenario.
struct Stage {
    provider: ProviderHandle,
    _setup: Setup,
    server: Server,
    work: tempfile::TempDir,
}

impl Stage {
    async fn new() -> Stage {
        Stage::with(|_| String::new()).await
    }

    /// A stage whose policy file ends with what `extra` says for this provider.
    async fn with(extra: impl FnOnce(&ProviderHandle) -> String) -> Stage {
        let provider = Provider::start().await.expect("provider");
        let setup = Setup::with_policy(&provider, &extra(&provider));
        let server = setup.serve();
        Stage { provider, _setup: setup, server, work: tempfile::tempdir().expect("tempdir") }
    }

    /// Runs `python clients/python/tests/SCRIPT ARGS` against this stage.
    async fn run(&self, script: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut command = Command::new(python());
        command
            .arg(crate::docs::root().join("clients/python/tests").join(script))
            .args(args)
            .env("ONCEBOX_URL", &self.server.base_url)
            .env("ONCEBOX_TOKEN", TOKEN)
            .env("PROVIDER_URL", self.provider.base_url())
            .env("WORK", self.work.path())
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .envs(env.iter().copied());
        tokio::task::spawn_blocking(move || command.output().expect("python")).await.expect("join")
    }

    /// Like [`Stage::run`], for a script that must succeed: the JSON lines it printed.
    async fn lines(&self, script: &str, args: &[&str], env: &[(&str, &str)]) -> Vec<Value> {
        let output = self.run(script, args, env).await;
        assert!(
            output.status.success(),
            "{script} {args:?}: {}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        lines(&output)
    }

    fn payments(&self, order: &str) -> u64 {
        self.provider.counts(order).payments
    }
}

fn lines(output: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect()
}

/// The last line whose `"event"` is `event`.
fn event<'a>(lines: &'a [Value], event: &str) -> &'a Value {
    lines.iter().rev().find(|l| l["event"] == event).unwrap_or_else(|| panic!("no {event:?} in {lines:?}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_clients_unit_tests_pass_against_a_server_that_drops_answers() {
    let python = tokio::task::spawn_blocking(python).await.expect("join");
    let tests = crate::docs::root().join("clients/python/tests");
    let output = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .args(["-m", "unittest", "discover", "-v", "-p", "test_*.py", "-s"])
            .arg(&tests)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .output()
            .expect("python -m unittest")
    })
    .await
    .expect("join");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    for test in [
        "test_a_dropped_answer_is_sent_again_with_the_same_ids",
        "test_resending_is_bounded",
        "test_a_4xx_is_raised_and_not_resent",
        "test_a_step_undone_by_hand_is_said_with_who_and_why",
    ] {
        assert!(stderr.lines().any(|l| l.starts_with(test) && l.ends_with("... ok")), "{test}:\n{stderr}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_langgraph_node_that_charges_then_interrupts_charges_once_where_without_oncebox_it_charges_twice() {
    let stage = Stage::new().await;
    let lines = stage.lines("langgraph_scenarios.py", &["interrupt", "lg-1", "lg-plain-1"], &[]).await;
    let charged: Vec<&Value> = lines.iter().filter(|l| l["event"] == "charged").collect();
    assert_eq!(charged.len(), 2, "the node ran twice, from its first line: {lines:?}");
    assert_eq!((charged[0]["replayed"].clone(), charged[1]["replayed"].clone()), (false.into(), true.into()));
    assert_eq!(charged[0]["step_id"], charged[1]["step_id"], "the same durable identity in both runs");
    assert!(charged[0]["step_id"].as_str().is_some_and(|s| s.starts_with("pay:")), "{lines:?}");
    assert_eq!(charged[0]["payment"], charged[1]["payment"]);
    assert_eq!(lines.iter().filter(|l| l["event"] == "charged-plain").count(), 2, "{lines:?}");
    assert_eq!(stage.payments("lg-1"), 1, "with oncebox: one charge");
    assert_eq!(stage.payments("lg-plain-1"), 2, "the control, without oncebox: two charges");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_async_langgraph_node_with_the_async_client_charges_once_across_an_interrupt() {
    let stage = Stage::new().await;
    let lines = stage.lines("langgraph_scenarios.py", &["async", "lg-async-1"], &[]).await;
    let charged: Vec<&Value> = lines.iter().filter(|l| l["event"] == "charged").collect();
    assert_eq!(charged.len(), 2, "the node ran twice: {lines:?}");
    assert_eq!((charged[0]["replayed"].clone(), charged[1]["replayed"].clone()), (false.into(), true.into()));
    assert_eq!(event(&lines, "done")["payment"], charged[0]["payment"]);
    assert_eq!(stage.payments("lg-async-1"), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_langgraph_process_killed_after_the_charge_resumed_from_its_checkpoint_charges_once() {
    let stage = Stage::new().await;
    let killed =
        stage.run("langgraph_scenarios.py", &["kill", "lg-kill-1", "first"], &[("KILL_AFTER_CHARGE", "1")]).await;
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(killed.status.signal(), Some(9), "killed: {}", String::from_utf8_lossy(&killed.stderr));
    assert_eq!(event(&lines(&killed), "charged")["replayed"], false);
    assert_eq!(stage.payments("lg-kill-1"), 1);
    let resumed = stage.lines("langgraph_scenarios.py", &["kill", "lg-kill-1", "resume"], &[]).await;
    assert_eq!(event(&resumed, "resuming")["next"], serde_json::json!(["pay"]), "{resumed:?}");
    assert_eq!(event(&resumed, "charged")["replayed"], true, "{resumed:?}");
    assert_eq!(event(&resumed, "charged")["payment"], event(&lines(&killed), "charged")["payment"]);
    assert_eq!(stage.payments("lg-kill-1"), 1, "the resumed node's charge was answered from the ledger");
}

#[tokio::test(flavor = "multi_thread")]
async fn two_langgraph_threads_charge_twice_and_changed_args_on_a_rerun_are_a_conflict() {
    let stage = Stage::new().await;
    let threads = stage.lines("langgraph_scenarios.py", &["threads", "lg-threads-1"], &[]).await;
    assert_eq!(threads.iter().filter(|l| l["event"] == "charged" && l["replayed"] == false).count(), 2);
    assert_eq!(stage.payments("lg-threads-1"), 2, "two threads are two intents");

    let conflict = stage.lines("langgraph_scenarios.py", &["conflict", "lg-conflict-1"], &[]).await;
    let raised = event(&conflict, "conflict");
    assert_eq!((raised["error"].clone(), raised["status"].clone()), ("StepConflict".into(), "conflict".into()));
    assert!(raised["message"].as_str().is_some_and(|m| m.contains("other args")), "{raised}");
    assert_eq!(stage.payments("lg-conflict-1"), 1, "nothing charged twice");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_langgraph_graph_stops_for_approval_and_ships_once_after_a_person_approves() {
    let stage = Stage::new().await;
    let lines = stage.lines("langgraph_scenarios.py", &["approval", "lg-ship-1"], &[]).await;
    let waiting = &event(&lines, "awaiting")["value"];
    assert_eq!(waiting["oncebox"], "awaiting-approval", "{lines:?}");
    assert_eq!(event(&lines, "before-approval")["counts"]["fulfillments"], 0, "nothing shipped before the approval");
    assert_eq!(event(&lines, "approval")["exact"], true, "the operator sees the exact params");
    assert_eq!(event(&lines, "approval")["params"]["address"], "1 Main St");
    let shipped: Vec<&Value> = lines.iter().filter(|l| l["event"] == "shipped").collect();
    assert_eq!(shipped.len(), 1, "{lines:?}");
    assert_eq!((shipped[0]["status"].clone(), shipped[0]["replayed"].clone()), ("completed".into(), false.into()));
    assert_eq!(event(&lines, "again")["replayed"], true);
    assert_eq!(stage.provider.counts("lg-ship-1").fulfillments, 1, "shipped once");
}

/// Starts `workflow` for `order` in a process killed inside its charge step, after the provider's
/// commit and before DBOS records the step's output.
async fn killed_in_dbos(stage: &Stage, workflow: &str, order: &str) -> Vec<Value> {
    use std::os::unix::process::ExitStatusExt;
    let killed = stage.run("dbos_scenarios.py", &["start", workflow, order], &[("KILL_AFTER_CHARGE", "1")]).await;
    assert_eq!(killed.status.signal(), Some(9), "killed: {}", String::from_utf8_lossy(&killed.stderr));
    lines(&killed)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dbos_step_killed_between_the_charge_and_its_record_charges_once_on_recovery_where_without_oncebox_twice() {
    let stage = Stage::new().await;
    let first = killed_in_dbos(&stage, "pay", "dbos-1").await;
    assert_eq!(event(&first, "charged")["replayed"], false, "{first:?}");
    killed_in_dbos(&stage, "pay_plain", "dbos-plain-1").await;
    assert_eq!((stage.payments("dbos-1"), stage.payments("dbos-plain-1")), (1, 1));

    let recovered = stage.lines("dbos_scenarios.py", &["recover", "dbos-1", "dbos-plain-1"], &[]).await;
    let charged = event(&recovered, "charged");
    assert_eq!(charged["replayed"], true, "DBOS ran the step again; the ledger answered it: {recovered:?}");
    assert_eq!(
        (charged["run_id"].clone(), charged["step_id"].clone()),
        (first[0]["run_id"].clone(), first[0]["step_id"].clone())
    );
    assert_eq!(charged["run_id"], "dbos:wf-dbos-1");
    assert_eq!(recovered.iter().filter(|l| l["event"] == "recovered").count(), 2, "{recovered:?}");
    assert_eq!(stage.payments("dbos-1"), 1, "with oncebox: one charge");
    assert_eq!(stage.payments("dbos-plain-1"), 2, "the control, without oncebox: two charges");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dbos_workflow_killed_after_a_compensatable_charge_recovers_and_compensates_once() {
    let stage = Stage::new().await;
    killed_in_dbos(&stage, "pay_then_ship", "dbos-comp-1").await;
    let recovered = stage.lines("dbos_scenarios.py", &["recover", "dbos-comp-1"], &[]).await;
    let result = &event(&recovered, "recovered")["result"];
    assert_eq!(result["shipped"], false, "{recovered:?}");
    assert_eq!(event(&recovered, "charged")["replayed"], true);
    let counts = stage.provider.counts("dbos-comp-1");
    assert_eq!((counts.payments, counts.refunds), (1, 1), "charged once, refunded once: {result}");
}

#[tokio::test(flavor = "multi_thread")]
async fn langgraph_calls_oncebox_over_mcp_with_the_graphs_identity_in_meta_and_a_killed_tools_node_charges_once() {
    use std::os::unix::process::ExitStatusExt;
    let stage = Stage::new().await;
    let anonymous = stage.lines("mcp_scenario.py", &["mcp-anon-1", "anonymous"], &[]).await;
    // The adapters hand a tool's error result to the model as its answer (handle_tool_errors).
    let refused = event(&anonymous, "answered")["answer"].as_str().unwrap_or_default();
    assert!(refused.contains("the step identity is missing") && refused.contains("oncebox/run-id"), "{anonymous:?}");
    assert!(refused.contains("Nothing was run"), "{refused}");
    assert_eq!(stage.payments("mcp-anon-1"), 0, "a write tool without identity refuses");

    let killed = stage.run("mcp_scenario.py", &["mcp-1", "first"], &[("KILL_AFTER_CHARGE", "1")]).await;
    assert_eq!(killed.status.signal(), Some(9), "killed: {}", String::from_utf8_lossy(&killed.stderr));
    assert_eq!(stage.payments("mcp-1"), 1);
    let resumed = stage.lines("mcp_scenario.py", &["mcp-1", "resume"], &[]).await;
    let again = event(&resumed, "tool-result")["content"].as_str().unwrap_or_default();
    assert!(
        again.contains("mcp-1") && !again.contains("identity"),
        "the tools node ran again and was answered: {again}"
    );
    let steps = &event(&resumed, "run")["steps"];
    assert_eq!(steps.as_array().map(Vec::len), Some(1), "one step, from the graph's identity: {resumed:?}");
    let step = steps[0].as_str().unwrap_or_default();
    assert!(step.starts_with("tools:") && step.ends_with("/mcp:charge/0"), "{step}");
    assert!(!step.contains("call_from_the_model"), "never the model's tool-call id: {step}");
    assert_eq!(stage.payments("mcp-1"), 1, "the resumed tools node's charge was answered from the ledger");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_models_tool_call_through_the_langgraph_tool_wrapper_is_keyed_by_the_graph_and_charges_once_after_a_kill() {
    use std::os::unix::process::ExitStatusExt;
    let stage = Stage::new().await;
    let killed =
        stage.run("langgraph_scenarios.py", &["tool", "lg-tool-1", "first"], &[("KILL_AFTER_CHARGE", "1")]).await;
    assert_eq!(killed.status.signal(), Some(9), "killed: {}", String::from_utf8_lossy(&killed.stderr));
    assert_eq!(stage.payments("lg-tool-1"), 1);
    let resumed = stage.lines("langgraph_scenarios.py", &["tool", "lg-tool-1", "resume"], &[]).await;
    let again = event(&resumed, "tool-result")["content"].as_str().unwrap_or_default();
    assert!(again.contains("lg-tool-1"), "the tools node ran again and was answered: {again}");
    let steps = &event(&resumed, "run")["steps"];
    assert_eq!(steps.as_array().map(Vec::len), Some(1), "{resumed:?}");
    let step = steps[0].as_str().unwrap_or_default();
    assert!(step.starts_with("tools:") && step.ends_with("/tool:charge/0"), "{step}");
    assert!(!step.contains("call_from_the_model"), "never the model's tool-call id: {step}");
    assert_eq!(stage.payments("lg-tool-1"), 1, "the resumed tool call was answered from the ledger");
}

#[tokio::test(flavor = "multi_thread")]
async fn tool_calls_langgraph_runs_at_once_are_each_their_own_step_by_their_place_in_the_message() {
    let stage = Stage::new().await;
    let lines = stage.lines("langgraph_scenarios.py", &["parallel", "lg-par"], &[]).await;
    let steps: Vec<String> = event(&lines, "run")["steps"]
        .as_array()
        .map(|steps| steps.iter().filter_map(|s| s.as_str().map(String::from)).collect())
        .unwrap_or_default();
    // Three calls of `charge` in one message: three steps, numbered by their place among them
    // (a counter in the node's config gave all three step 0: a conflict, and a lost charge).
    assert_eq!(steps.len(), 3, "{lines:?}");
    for (n, step) in steps.iter().enumerate() {
        assert!(step.starts_with("tools:") && step.ends_with(&format!("/tool:charge/{n}")), "{steps:?}");
    }
    let results = event(&lines, "tool-results")["contents"].to_string();
    assert!(!results.contains("Conflict") && !results.contains("conflict"), "{results}");
    // The order asked twice is charged twice (two calls of the model's), the other once.
    assert_eq!((stage.payments("lg-par-a"), stage.payments("lg-par-b")), (2, 1), "{results}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_outcome_reaches_the_graph_as_a_typed_error_and_is_reconciled_not_sent_again() {
    // The provider commits, then holds its answer past the host's timeout for it.
    let stage = Stage::with(|p| format!("[hosts.\"{}\"]\ntimeout = \"300ms\"\n", p.addr())).await;
    stage.provider.arm(Fault::new(Route::Payments, FaultKind::Delay { delay_ms: 3_000 }).for_order("lg-unknown-1"));
    let lines = stage.lines("langgraph_scenarios.py", &["unknown", "lg-unknown-1"], &[]).await;
    let raised = event(&lines, "raised");
    assert_eq!(raised["error"], "OutcomeUnknown", "{lines:?}");
    assert!(raised["message"].as_str().is_some_and(|m| m.contains("reconcile")), "{raised}");
    assert_eq!(event(&lines, "again")["status"], "unknown", "the same ids again: still unknown, not sent anew");
    assert_eq!(event(&lines, "reconciled")["status"], "completed", "{lines:?}");
    assert_eq!(stage.payments("lg-unknown-1"), 1, "one charge: the one the provider committed");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_client_builds_as_a_wheel_that_carries_its_type_marker() {
    let python = tokio::task::spawn_blocking(python).await.expect("join");
    let out = tempfile::tempdir().expect("tempdir");
    let dir = out.path().to_path_buf();
    let output = tokio::task::spawn_blocking(move || {
        let built = Command::new(&python)
            .args(["-m", "pip", "wheel", "--quiet", "--disable-pip-version-check", "--no-deps", "-w"])
            .arg(&dir)
            .arg(crate::docs::root().join("clients/python"))
            .output()
            .expect("pip wheel");
        assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));
        let list = "import sys, zipfile, glob; print('\\n'.join(zipfile.ZipFile(glob.glob(sys.argv[1] + '/oncebox-*.whl')[0]).namelist()))";
        Command::new(&python).args(["-c", list]).arg(&dir).output().expect("python")
    })
    .await
    .expect("join");
    let names = String::from_utf8_lossy(&output.stdout);
    for file in ["oncebox/__init__.py", "oncebox/py.typed", "oncebox/langgraph.py", "oncebox/dbos.py"] {
        assert!(names.lines().any(|n| n == file), "the wheel lacks {file}: {names}");
    }
}
