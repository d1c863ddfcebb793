//! A server killed with SIGKILL mid-call, and one stopped with SIGTERM: restarted on the same
//! ledger, it answers each step from its record or as unknown, never with a second dispatch,
//! counted at the provider.
#![cfg(unix)]

use std::time::Duration;

use oncebox_example_provider::{Fault, FaultKind, Provider, Route, Settings};
use serde_json::{Value, json};

use super::support::{Setup, client};
use crate::support::{charge, eventually};

async fn call(url: &str, body: &Value) -> Result<(u16, Value), reqwest::Error> {
    let response = client().post(url).json(body).send().await?;
    let status = response.status().as_u16();
    Ok((status, response.json().await?))
}

fn step(order: &str) -> Value {
    json!({ "run_id": "kill-run", "step_id": format!("charge-{order}"), "tool": "charge", "args": charge(order) })
}

/// Faults that leave a charge in flight at the provider when the server dies: committed and
/// answered late, committed after a delay whether or not anyone waits, or slow and then fine.
fn faults() -> Vec<(&'static str, FaultKind)> {
    vec![
        ("k-delay", FaultKind::Delay { delay_ms: 1_200 }),
        ("k-late-commit", FaultKind::CommitAfterDelay { delay_ms: 900 }),
        ("k-late-commit-2", FaultKind::CommitAfterDelay { delay_ms: 300 }),
        ("k-lost", FaultKind::LoseResponse),
        ("k-gateway", FaultKind::CommitThenError { status: 502 }),
        ("k-before", FaultKind::ErrorBeforeCommit),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_killed_mid_call_and_restarted_answers_from_the_ledger_or_unknown_never_dispatching_twice() {
    let provider = Provider::start().await.expect("provider");
    // Worse than we assume: keys are not deduplicated (a resend would charge again, and be
    // counted), and the lookup index lags the writes (shorter than the settle window below).
    provider.configure(Settings { honour_keys: false, lookup_lag_ms: 400, ..Settings::default() });
    // The provider's lookups count only after its settle window: longer than any delayed commit.
    let host = provider.addr();
    let setup =
        Setup::with_policy(&provider, &format!("[hosts.\"{host}\"]\ntimeout = \"3s\"\nsettle_window = \"2s\"\n"));
    let mut server = setup.serve();
    let url = server.url("/v1/calls");
    let mut calls = Vec::new();
    for (order, fault) in faults() {
        provider.arm(Fault::new(Route::Payments, fault).for_order(order));
        let url = url.clone();
        calls.push(tokio::spawn(async move { call(&url, &step(order)).await }));
    }
    // Killed while charges are at the provider (in flight there, or being answered late).
    eventually("charges reach the provider", || provider.in_flight() > 0 || provider.requests() >= 3).await;
    server.kill();
    // What each client was told before the kill (most saw their connection die).
    let mut told = Vec::new();
    for task in calls {
        told.push(task.await.expect("task").ok().and_then(|(_, body)| body["status"].as_str().map(String::from)));
    }
    provider.settled().await;

    let server = setup.serve();
    let url = server.url("/v1/calls");
    let mut unknown = 0;
    for ((order, _), before) in faults().iter().zip(&told) {
        let (code, answer) = call(&url, &step(order)).await.expect("call after restart");
        assert_eq!(code, 200, "{answer}");
        let status = answer["status"].as_str().unwrap_or_default();
        let now = provider.counts(order).payments;
        eprintln!("after restart: {order} {status} (charged {now}; told {before:?} before the kill)");
        assert!(now <= 1, "{order}: charged {now} times");
        match status {
            "completed" => assert_eq!(now, 1, "{order}: completed means one charge"),
            "failed" => assert_eq!(now, 0, "{order}: failed means none"),
            "unknown" => unknown += 1,
            other => panic!("{order}: {other}: {answer}"),
        }
        match before.as_deref() {
            Some("completed") => assert_eq!(now, 1, "{order}: told completed"),
            Some("failed") => assert_eq!(now, 0, "{order}: told failed"),
            _ => {}
        }
    }
    assert!(unknown > 0, "the kill left charges in doubt (else it landed too late to test anything)");
    // What is unknown is reconciled with the provider's lookup, then the step answers for good.
    let (code, reconciled) = call(&server.url("/v1/runs/kill-run/reconcile"), &json!({})).await.expect("reconcile");
    assert_eq!(code, 200, "{reconciled}");
    assert!(unknown == 0 || reconciled["reconciled"].as_array().is_some_and(|a| !a.is_empty()), "{reconciled}");
    for (order, _) in faults() {
        let (_, answer) = call(&url, &step(order)).await.expect("call");
        let status = answer["status"].as_str().unwrap_or_default();
        let charged = provider.counts(order).payments;
        eprintln!("after reconciling: {order} {status} (charged {charged})");
        assert!(charged <= 1, "{order}: charged {charged} times");
        match status {
            "completed" => assert_eq!(charged, 1, "{order}: {answer}"),
            "failed" => assert_eq!(charged, 0, "{order}: {answer}"),
            // A charge the lookup could not place stays in doubt: never retried blindly.
            "unknown" => {}
            other => panic!("{order}: {other}: {answer}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_lets_the_running_call_finish_refuses_new_ones_and_the_next_start_replays_it() {
    let provider = Provider::start().await.expect("provider");
    provider.arm(Fault::new(Route::Payments, FaultKind::CommitAfterDelay { delay_ms: 800 }).for_order("term-1"));
    let setup = Setup::new(&provider);
    let mut server = setup.serve();
    let url = server.url("/v1/calls");
    let running = {
        let url = url.clone();
        tokio::spawn(async move { call(&url, &step("term-1")).await })
    };
    eventually("the charge reaches the provider", || provider.in_flight() > 0).await;
    let pid = server.pid().to_string();
    std::process::Command::new("kill").args(["-TERM", &pid]).status().expect("kill -TERM");
    // Once it has taken the signal (its health check says so, or it no longer accepts
    // connections), a new call is refused: 503 on a connection still open, or no connection.
    let health = server.url("/healthz");
    for _ in 0..500 {
        match client().get(&health).send().await {
            Ok(response) if response.status() == 200 => tokio::time::sleep(Duration::from_millis(10)).await,
            _ => break,
        }
    }
    match call(&url, &step("term-2")).await {
        Ok((code, body)) => {
            assert_eq!(code, 503, "{body}");
            assert_eq!(body["error"]["kind"], "stopping", "{body}");
        }
        Err(e) => assert!(e.is_connect() || e.is_request(), "{e}"),
    }
    let (code, finished) = running.await.expect("task").expect("the running call is answered");
    assert_eq!(code, 200);
    assert_eq!(finished["status"], "completed", "{finished}");
    let status = server.signal_and_wait("TERM", Duration::from_secs(10)).expect("exits within the grace period");
    assert!(status.success(), "{status:?}\n{}", server.log());
    assert_eq!(provider.counts("term-2").payments, 0);

    let server = setup.serve();
    let (_, replay) = call(&server.url("/v1/calls"), &step("term-1")).await.expect("call");
    assert_eq!(replay["status"], "completed");
    assert_eq!(replay["replayed"], true);
    assert_eq!(provider.counts("term-1").payments, 1);
}

/// A server paused while its charge is at the provider (SIGSTOP: a frozen VM, a stopped
/// container), past the moment from which every send of the charge counts as ended (the send
/// deadline, 10 s, plus the host's timeout), says so on resuming: an error naming the effect's key,
/// since a request the kernel writes on resuming may reach a downstream after another host could
/// judge it, and no check in the process can stop that. A call that was not paused says nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_paused_while_sending_names_the_effect_key_to_check_at_the_downstream() {
    const SAID: &str = "was paused or starved while it sent an effect";
    let provider = Provider::start().await.expect("provider");
    let host = provider.addr();
    let setup = Setup::with_policy(&provider, &format!("[hosts.\"{host}\"]\ntimeout = \"2s\"\n"));
    let mut server = setup.serve();
    let url = server.url("/v1/calls");
    let (code, quick) = call(&url, &step("p-quick")).await.expect("call");
    assert_eq!((code, quick["status"].as_str()), (200, Some("completed")), "{quick}");
    assert!(!server.log().contains(SAID), "a call that was not paused: {}", server.log());

    provider.arm(Fault::new(Route::Payments, FaultKind::Delay { delay_ms: 1_000 }).for_order("p-paused"));
    let paused = tokio::spawn({
        let url = url.clone();
        async move { call(&url, &step("p-paused")).await }
    });
    eventually("the charge reached the provider", || provider.counts("p-paused").payments == 1).await;
    let pid = server.pid().to_string();
    let signal = |name: &str| std::process::Command::new("kill").args([name, &pid]).status().expect("kill");
    assert!(signal("-STOP").success());
    tokio::time::sleep(Duration::from_secs(13)).await;
    assert!(signal("-CONT").success());
    let (code, answer) = paused.await.expect("task").expect("the call ends");
    assert_eq!(code, 200, "{answer}");
    let key = answer["operation_key"].as_str().expect("operation_key");
    let effects: Value = client()
        .get(server.url(&format!("/v1/operations/{key}")))
        .send()
        .await
        .expect("operation")
        .json()
        .await
        .expect("json");
    let effect_key = effects["effects"][0]["key"].as_str().expect("an effect key");
    eventually("the server says so", || server.log().contains(SAID)).await;
    let log = server.log();
    let line = log.lines().find(|line| line.contains(SAID)).expect("the line");
    assert!(line.contains(effect_key), "the line names the effect's key {effect_key}: {line}");
    assert_eq!(provider.counts("p-paused").payments, 1);
    server.kill();
}
