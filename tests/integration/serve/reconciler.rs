//! The server's background reconciler: an unknown whose proof exists settles without anyone
//! calling reconcile, under the rule of evidence, counted at the provider and in `/metrics`.

use std::time::{Duration, Instant};

use oncebox_example_provider::{Fault, FaultKind, Provider, Route, Settings};
use serde_json::{Value, json};

use super::support::{Server, Setup, client};
use crate::support::charge;

/// Charges `order` for step `charge-ORDER` of run `run` through `server`: the answer.
async fn charge_through(server: &Server, run: &str, order: &str) -> Value {
    let body = json!({ "run_id": run, "step_id": format!("charge-{order}"), "tool": "charge", "args": charge(order) });
    let response = client().post(server.url("/v1/calls")).json(&body).send().await.expect("call");
    assert_eq!(response.status(), 200);
    response.json().await.expect("json")
}

/// The operation's status as `GET /v1/operations/KEY` answers it.
async fn status_of(server: &Server, key: &str) -> String {
    let response = client().get(server.url(&format!("/v1/operations/{key}"))).send().await.expect("get");
    let body: Value = response.json().await.expect("json");
    body["operation"]["status"].as_str().unwrap_or_default().to_string()
}

/// Polls the operation every 100 ms for up to `within`: every status seen, with when (since
/// `since`), until it is no longer `unknown`.
async fn watch(server: &Server, key: &str, since: Instant, within: Duration) -> Vec<(Duration, String)> {
    let mut seen = Vec::new();
    while since.elapsed() < within {
        let status = status_of(server, key).await;
        seen.push((since.elapsed(), status.clone()));
        if status != "unknown" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    seen
}

/// `oncebox_reconcile_tries_total{tool="charge",result=RESULT}` in the server's `/metrics`.
async fn tries(server: &Server, result: &str) -> u64 {
    let text = client().get(server.url("/metrics")).send().await.expect("get").text().await.expect("text");
    let prefix = format!("oncebox_reconcile_tries_total{{tool=\"charge\",result=\"{result}\"}} ");
    text.lines().find_map(|line| line.strip_prefix(&prefix)).and_then(|n| n.parse().ok()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_charge_committed_then_answered_502_completes_by_itself_with_one_payment() {
    let provider = Provider::start().await.expect("provider");
    provider.arm(Fault::new(Route::Payments, FaultKind::CommitThenError { status: 502 }).for_order("auto1"));
    // No [reconciler] table: the server's defaults, on.
    let setup = Setup::reconciling(&provider, "");
    let server = setup.serve();
    let started = Instant::now();
    let first = charge_through(&server, "auto", "auto1").await;
    assert_eq!(first["status"], "unknown", "the gateway's 502 after the commit: {first}");
    let key = first["operation_key"].as_str().expect("key");

    // Nobody calls reconcile: the server's reconciler asks the provider's lookup by itself.
    let seen = watch(&server, key, started, Duration::from_secs(20)).await;
    let (at, last) = seen.last().cloned().expect("polled");
    assert_eq!(last, "completed", "{seen:?}\n{}", server.log());
    assert!(at < Duration::from_secs(10), "settled within a few seconds: {seen:?}");
    assert!(seen.iter().all(|(_, s)| s == "unknown" || s == "completed"), "{seen:?}");
    assert_eq!(tries(&server, "committed").await, 1, "the try is counted");
    let again = charge_through(&server, "auto", "auto1").await;
    assert_eq!((again["status"].as_str(), again["replayed"].as_bool()), (Some("completed"), Some(true)), "{again}");
    provider.settled().await;
    assert_eq!(provider.counts("auto1").payments, 1, "one payment, proven by the lookup, never resent");
    assert!(server.log().contains("reconciler: tried"), "logged:\n{}", server.log());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lagging_lookup_keeps_it_unknown_until_the_settle_window_has_passed_never_failed() {
    let provider = Provider::start().await.expect("provider");
    // The lookup index lags the commit by 3 s; the operator declared a settle window for it.
    provider.configure(Settings { lookup_lag_ms: 3_000, ..Settings::default() });
    provider.arm(Fault::new(Route::Payments, FaultKind::CommitThenError { status: 502 }).for_order("lag1"));
    let host = provider.addr();
    let setup = Setup::reconciling(
        &provider,
        &format!(
            "[hosts.\"{host}\"]\ntimeout = \"300ms\"\nsettle_window = \"1s\"\n\
             [reconciler]\nfirst = \"200ms\"\nmax = \"1s\"\nevery = \"200ms\"\n"
        ),
    );
    let server = setup.serve();
    let started = Instant::now();
    let first = charge_through(&server, "lag", "lag1").await;
    assert_eq!(first["status"], "unknown", "{first}");
    let key = first["operation_key"].as_str().expect("key");

    let seen = watch(&server, key, started, Duration::from_secs(40)).await;
    let (at, last) = seen.last().cloned().expect("polled");
    assert_eq!(last, "completed", "{seen:?}\n{}", server.log());
    assert!(seen.iter().all(|(_, s)| s != "failed"), "never failed: {seen:?}");
    // The empty lookups of the first seconds proved nothing, and a `not-committed` counts only
    // once the last send could have ended (10 s send deadline + 300 ms timeout after its
    // write-ahead) and the settle window (1 s) passed: not asked again before then.
    assert!(at >= Duration::from_secs(11), "still unknown until the settle window passed: {seen:?}");
    assert!(tries(&server, "still-unknown").await >= 1, "the early empty lookup was a try");
    assert_eq!(tries(&server, "committed").await, 1);
    assert_eq!(tries(&server, "not-committed").await, 0);
    // The tries that proved nothing are recorded on the operation, and the run's page shows them.
    let op: Value = client()
        .get(server.url(&format!("/v1/operations/{key}")))
        .send()
        .await
        .expect("operation")
        .json()
        .await
        .expect("json");
    assert!(op["operation"]["reconciled"]["tries"].as_u64().is_some_and(|n| n >= 1), "{op}");
    assert_eq!(op["operation"]["reconciled"]["result"], "still-unknown", "{op}");
    let run = op["operation"]["run_id"].as_str().expect("run").to_string();
    let page = client().get(server.url(&format!("/runs/{run}"))).send().await.expect("page");
    assert!(page.text().await.expect("html").contains("The reconciler asked"), "the run's timeline shows the tries");
    provider.settled().await;
    assert_eq!(provider.counts("lag1").payments, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn two_servers_on_one_database_settle_an_unknown_once_and_neither_counts_an_error() {
    let provider = Provider::start().await.expect("provider");
    provider.arm(Fault::new(Route::Payments, FaultKind::CommitThenError { status: 502 }).for_order("pg-auto"));
    // Both ask often, so that both are likely to ask about it at once.
    let setup = Setup::reconciling(&provider, "[reconciler]\nfirst = \"100ms\"\nevery = \"100ms\"\n")
        .on_shared(crate::pg::fresh_database().await);
    let servers = [setup.serve(), setup.serve()];
    let started = Instant::now();
    let first = charge_through(&servers[0], "pg-auto", "pg-auto").await;
    assert_eq!(first["status"], "unknown", "{first}");
    let key = first["operation_key"].as_str().expect("key");
    let seen = watch(&servers[1], key, started, Duration::from_secs(20)).await;
    assert_eq!(seen.last().map(|(_, s)| s.as_str()), Some("completed"), "{seen:?}");
    // Let the other server's try, if it made one, end.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut committed = 0;
    for server in &servers {
        committed += tries(server, "committed").await;
        assert_eq!(tries(server, "error").await, 0, "a refused double settlement is no error:\n{}", server.log());
    }
    assert_eq!(committed, 1, "one settlement recorded over both servers");
    provider.settled().await;
    assert_eq!(provider.counts("pg-auto").payments, 1);
}

/// A server killed while its charge was at the provider, on a database two servers share: the
/// step stays claimed by a dead owner, and nobody calls it again (the orchestrator died too). The
/// other server's reconciler ends the claim unknown once its lease has run out (and one of its own
/// has passed), asks the provider, and completes it: the charge is never invisible, and never
/// made twice.
#[tokio::test(flavor = "multi_thread")]
async fn a_charge_left_by_a_killed_server_is_settled_by_the_other_without_another_call() {
    let provider = Provider::start().await.expect("provider");
    provider.arm(Fault::new(Route::Payments, FaultKind::Delay { delay_ms: 20_000 }).for_order("gone1"));
    let setup = Setup::reconciling(&provider, "[reconciler]\nfirst = \"100ms\"\nevery = \"200ms\"\n")
        .on_shared(crate::pg::fresh_database().await);
    // Short leases: the survivor waits one of its own past the dead owner's before it takes over.
    let mut dying = setup.serve_with(&["--lease-ms", "1000"]);
    let survivor = setup.serve_with(&["--lease-ms", "4000"]);
    let body = json!({ "run_id": "gone", "step_id": "charge-gone1", "tool": "charge", "args": charge("gone1") });
    let sent = tokio::spawn(client().post(dying.url("/v1/calls")).json(&body).send());
    crate::support::eventually("the provider committed the charge", || provider.counts("gone1").payments == 1).await;
    dying.kill();
    let killed = Instant::now();
    let _ = sent.await;

    let run: Value = client().get(survivor.url("/v1/runs/gone")).send().await.expect("get").json().await.expect("json");
    let key = run["operations"][0]["key"].as_str().unwrap_or_else(|| panic!("the step's operation: {run}")).to_string();
    // The dead owner's lease ran out a second after the kill; the survivor leaves the claim to it
    // for one of its own leases more (an owner only paused would still finish its step).
    tokio::time::sleep(Duration::from_millis(2_500).saturating_sub(killed.elapsed())).await;
    assert_eq!(status_of(&survivor, &key).await, "claimed", "not taken over within the grace:\n{}", survivor.log());
    let seen = watch_until(&survivor, &key, "completed", Duration::from_secs(20)).await;
    assert_eq!(seen.last().map(String::as_str), Some("completed"), "{seen:?}\n{}", survivor.log());
    assert!(seen.iter().all(|s| s == "claimed" || s == "unknown" || s == "completed"), "never failed: {seen:?}");
    assert!(survivor.log().contains("a claim whose owner is gone held an effect in doubt"), "{}", survivor.log());
    assert_eq!(provider.counts("gone1").payments, 1, "one charge, found by the lookup, never sent again");
    let again = charge_through(&survivor, "gone", "gone1").await;
    assert_eq!((again["status"].as_str(), again["replayed"].as_bool()), (Some("completed"), Some(true)), "{again}");
    assert_eq!(provider.counts("gone1").payments, 1);
}

/// Polls the operation every 100 ms for up to `within`: every status seen, until `wanted`.
async fn watch_until(server: &Server, key: &str, wanted: &str, within: Duration) -> Vec<String> {
    let since = Instant::now();
    let mut seen: Vec<String> = Vec::new();
    while since.elapsed() < within {
        let status = status_of(server, key).await;
        if seen.last() != Some(&status) {
            seen.push(status.clone());
        }
        if status == wanted {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    seen
}
