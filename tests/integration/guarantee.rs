//! The guarantee, against downstreams worse than ours: each class of tool against each fault a real
//! downstream has (commit then 5xx, commit then answer after the client gave up, commit after the
//! client gave up, lost answers, lagging lookups, no key support, keys pruned), counted where the
//! effects land. Never more than one commit per step; `completed` means exactly one; `failed`
//! means none. And the three reports of the guarantee issue, reproduced with the CLI as a new user
//! would.

use std::time::Duration;

use oncebox::ledger::EffectStatus;
use oncebox::{Call, HttpTarget, Outcome, Reconciliation, ReplayClass, Status};
use oncebox_example_provider::{Fault, FaultKind, Provider, ProviderHandle, Route, Settings};
use serde_json::{Value, json};

use crate::support::{builder_for, charge, oncebox};

/// What the downstream is, and what the operator declared about it (truthfully).
#[derive(Debug, Clone, Copy)]
enum Downstream {
    /// Stripe-like: dedups by key for a day, exact lookups. Declared `honours_keys`.
    Keyed,
    /// Commits every request (no dedup), but can be looked up by the key it was sent with, after
    /// a lag. Not declared `honours_keys`.
    Unkeyed,
    /// No key support at all: no dedup, no lookup. A lookup would lie, so nothing reconciles.
    Keyless,
    /// Dedups by key, but forgets keys after 300 ms (declared: the operator knows the retention).
    Pruning,
}

const FAULTS: [Option<FaultKind>; 7] = [
    None,
    Some(FaultKind::ErrorBeforeCommit),
    Some(FaultKind::CommitThenError { status: 502 }),
    Some(FaultKind::LoseResponse),
    Some(FaultKind::Delay { delay_ms: 1_500 }),
    Some(FaultKind::CommitAfterDelay { delay_ms: 1_000 }),
    Some(FaultKind::RateLimit { retry_after_ms: 20 }),
];
const DOWNSTREAMS: [Downstream; 4] = [Downstream::Keyed, Downstream::Unkeyed, Downstream::Keyless, Downstream::Pruning];
/// The host's effect timeout: shorter than the slow faults, so they outlast the client.
const TIMEOUT: Duration = Duration::from_millis(600);
/// Longer than any lookup lag or delayed commit above: a `not-committed` after it is true.
const SETTLE: Duration = Duration::from_millis(1_500);
/// The hosts' send deadline: short, since the settle window counts from it and the test waits it
/// out.
const SEND_BY: Duration = Duration::from_millis(1_000);
const LOOKUP_LAG_MS: u64 = 200;

/// One step of `tool` against `downstream` with `fault` armed once: called, called again, then
/// (once the downstream has settled) reconciled where that proves anything, and called a third
/// time. Returns every outcome seen and the downstream's own count of commits for the step.
async fn case(tool: &str, route: Route, args: &Value, downstream: Downstream, fault: Option<FaultKind>) -> String {
    let dir = tempfile::tempdir().expect("dir");
    let provider = Provider::start().await.expect("provider");
    let (settings, honours_keys, retention) = match downstream {
        Downstream::Keyed => (Settings::default(), true, Duration::from_secs(86_400)),
        Downstream::Unkeyed => (
            Settings { honour_keys: false, lookup_lag_ms: LOOKUP_LAG_MS, ..Settings::default() },
            false,
            Duration::ZERO,
        ),
        Downstream::Keyless => {
            (Settings { honour_keys: false, lookup_by_key: false, ..Settings::default() }, false, Duration::ZERO)
        }
        Downstream::Pruning => {
            (Settings { key_retention_ms: Some(300), ..Settings::default() }, true, Duration::from_millis(300))
        }
    };
    provider.configure(settings);
    if let Some(kind) = fault.clone() {
        provider.arm(Fault::new(route, kind).for_order("o-1"));
    }
    let target = HttpTarget {
        honours_keys,
        key_retention: retention,
        timeout: TIMEOUT,
        settle_window: SETTLE,
        ..Default::default()
    };
    let host = builder_for(&dir.path().join("l.redb"), &provider, honours_keys)
        .http_target(provider.addr().to_string(), target)
        .send_deadline(SEND_BY)
        .compile_cache(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("compile-cache"))
        .build()
        .await
        .expect("host");
    host.load(artifact(tool)).await.expect("load");
    let call = || Call::step("run-1", "step-1", tool, args.to_string());

    let mut seen: Vec<Outcome> = Vec::new();
    seen.push(host.call(call()).await.expect("first call"));
    seen.push(host.call(call()).await.expect("the orchestrator retries the step"));
    provider.settled().await;
    // The settle window runs from the end of the last send (its write-ahead, plus the time it may
    // take to leave, plus the host's timeout).
    tokio::time::sleep(SEND_BY + SETTLE + TIMEOUT + Duration::from_millis(100)).await;
    let reconciles = host.manifest(tool).is_some_and(|m| m.class.reconciles());
    let lookups_tell_the_truth = !matches!(downstream, Downstream::Keyless);
    if seen.last().is_some_and(|o| o.status == Status::Unknown) && reconciles && lookups_tell_the_truth {
        match host.reconcile(call()).await.expect("reconcile") {
            Reconciliation::Committed { outcome } => seen.push(outcome),
            // A downstream that forgot the key cannot be asked: a person decides.
            Reconciliation::StillUnknown { reason, .. } => {
                assert!(matches!(downstream, Downstream::Pruning), "after the settle window a lookup decides: {reason}")
            }
            _ => {}
        }
    }
    seen.push(host.call(call()).await.expect("a third call"));
    provider.settled().await;

    let commits = count(&provider, route);
    let statuses: Vec<Status> = seen.iter().map(|o| o.status).collect();
    let case = format!("{tool} against {downstream:?} with {fault:?}: {statuses:?}, {commits} commit(s)");
    assert!(commits <= 1, "more than one commit for one step: {case}");
    for outcome in &seen {
        match outcome.status {
            Status::Completed => assert_eq!(commits, 1, "completed means exactly one: {case}; {outcome:?}"),
            Status::Failed => assert_eq!(commits, 0, "failed means none: {case}; {outcome:?}"),
            _ => {}
        }
    }
    case
}

fn count(provider: &ProviderHandle, route: Route) -> u64 {
    let counts = provider.counts("o-1");
    match route {
        Route::Payments => counts.payments,
        Route::Refunds => counts.refunds,
        Route::Fulfillments => counts.fulfillments,
        Route::Inventory => 0,
    }
}

fn artifact(tool: &str) -> &'static str {
    match tool {
        "charge" => oncebox_artifacts::CHARGE,
        "refund" => oncebox_artifacts::REFUND,
        _ => oncebox_artifacts::FULFILL,
    }
}

/// Every downstream against every fault for one tool, eight cases at a time.
async fn every_case(tool: &'static str, route: Route, args: Value) {
    let mut cases = tokio::task::JoinSet::new();
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(8));
    for downstream in DOWNSTREAMS {
        for fault in FAULTS {
            let (args, gate) = (args.clone(), gate.clone());
            cases.spawn(async move {
                let _permit = gate.acquire_owned().await.expect("gate");
                case(tool, route, &args, downstream, fault).await
            });
        }
    }
    let mut ran = 0;
    while let Some(result) = cases.join_next().await {
        let case = result.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        eprintln!("{case}");
        ran += 1;
    }
    assert_eq!(ran, DOWNSTREAMS.len() * FAULTS.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_write_commits_at_most_once_against_every_downstream_and_fault() {
    every_case("refund", Route::Refunds, json!({"order_id": "o-1", "amount_cents": 500})).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compensatable_tool_commits_at_most_once_against_every_downstream_and_fault() {
    every_case("charge", Route::Payments, charge("o-1")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_irreversible_tool_commits_at_most_once_against_every_downstream_and_fault() {
    let args = json!({"order_id": "o-1", "address": "1 Main St", "items": [{"sku": "sku-1", "quantity": 1}]});
    every_case("fulfill", Route::Fulfillments, args).await;
}

/// `oncebox call` flags for `tool` at `provider`, with no claim that the provider honours keys.
fn call_flags(ledger: &std::path::Path, provider: &ProviderHandle) -> Vec<String> {
    let base = provider.base_url();
    let ledger = ledger.to_str().expect("utf8");
    ["call", "--ledger", ledger, "--config", &format!("base_url={base}"), "--grant", &format!("http={base}")]
        .into_iter()
        .map(String::from)
        .collect()
}

fn run_cli(mut flags: Vec<String>, rest: &[&str]) -> (i32, Value, String) {
    flags.extend(rest.iter().map(|s| s.to_string()));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    oncebox(&flags)
}

// Multi-threaded: the provider serves while this thread waits on the child processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_502_after_the_commit_is_unknown_and_never_sent_again_until_a_person_settles_it() {
    let provider = Provider::start().await.expect("provider");
    provider.configure(Settings { honour_keys: false, ..Settings::default() });
    provider.arm(Fault::new(Route::Payments, FaultKind::CommitThenError { status: 502 }).for_order("o-1"));
    let dir = tempfile::tempdir().expect("dir");
    let ledger = dir.path().join("l.redb");
    let args = charge("o-1").to_string();
    let step = ["--run", "r1", "--step", "s1", oncebox_artifacts::CHARGE, &args];

    let (code, outcome, stderr) = run_cli(call_flags(&ledger, &provider), &step);
    assert_eq!((code, outcome["status"].as_str()), (1, Some("unknown")), "{outcome} {stderr}");
    assert_eq!(outcome["error"]["class"], "unknown-outcome");
    assert_eq!(provider.counts("o-1").payments, 1, "the downstream did charge");
    assert_eq!(provider.requests(), 1, "and was asked once");
    let (_, again, _) = run_cli(call_flags(&ledger, &provider), &step);
    assert_eq!((again["status"].as_str(), again["replayed"].as_bool()), (Some("unknown"), Some(true)));
    assert_eq!(provider.requests(), 1, "a repeat never dispatches an effect in doubt");

    // A person who checked the dashboard settles it, with who and why.
    let key = outcome["operation_key"].as_str().expect("key");
    let ledger_arg = ledger.to_str().expect("utf8");
    let (code, settled, stderr) = oncebox(&[
        "resolve",
        "--ledger",
        ledger_arg,
        key,
        "--committed",
        r#"{"id":"pay_1","status":"succeeded"}"#,
        "--by",
        "alice",
        "--note",
        "seen in the payments dashboard",
    ]);
    assert_eq!((code, settled["status"].as_str()), (0, Some("completed")), "{settled} {stderr}");
    let (code, replay, _) = run_cli(call_flags(&ledger, &provider), &step);
    assert_eq!((code, replay["replayed"].as_bool()), (0, Some(true)));
    assert_eq!(replay["output"]["id"], "pay_1");
    assert_eq!(provider.counts("o-1").payments, 1);
    let (_, shown, _) = oncebox(&["ledger", "show", "--ledger", ledger_arg, key]);
    let resolution = &shown["effects"][0]["resolution"];
    assert_eq!((resolution["by"].as_str(), resolution["verdict"].as_str()), (Some("alice"), Some("committed")));
    assert_eq!(resolution["note"], "seen in the payments dashboard");
    // Settling again is refused: it is no longer in doubt.
    let (code, _, stderr) = oncebox(&["resolve", "--ledger", ledger_arg, key, "--not-committed", "--by", "bob"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("no longer in doubt") && stderr.contains("(it is completed now)"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attempt_deadline_during_a_slow_shipment_leaves_it_unknown_not_failed() {
    let provider = Provider::start().await.expect("provider");
    // The downstream takes 3 s and then ships, whether the client is still there or not.
    provider.arm(Fault::new(Route::Fulfillments, FaultKind::CommitAfterDelay { delay_ms: 3_000 }).for_order("o-1"));
    let dir = tempfile::tempdir().expect("dir");
    let policy = dir.path().join("oncebox.toml");
    std::fs::write(&policy, "[tools.fulfill]\nattempt_deadline = \"1s\"\n").expect("policy");
    let ledger = dir.path().join("l.redb");
    let args =
        json!({"order_id": "o-1", "address": "1 Main St", "items": [{"sku": "sku-1", "quantity": 1}]}).to_string();
    let policy = policy.to_str().expect("utf8");
    let step = ["--policy", policy, "--run", "r1", "--step", "ship", oncebox_artifacts::FULFILL, &args];

    let (code, awaiting, stderr) = run_cli(call_flags(&ledger, &provider), &step);
    assert_eq!(code, 1, "{stderr}");
    crate::support::approve_cli(&ledger, &awaiting);
    let (code, outcome, stderr) = run_cli(call_flags(&ledger, &provider), &step);
    assert_eq!((code, outcome["status"].as_str()), (1, Some("unknown")), "{outcome} {stderr}");
    assert_ne!(outcome["status"], "failed", "an orchestrator that trusts `failed` would ship again");
    provider.settled().await;
    assert_eq!(provider.counts("o-1").fulfillments, 1, "it shipped");
    let (_, again, _) = run_cli(call_flags(&ledger, &provider), &step);
    assert_eq!((again["status"].as_str(), again["replayed"].as_bool()), (Some("unknown"), Some(true)));
    assert_eq!(provider.requests(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_404_from_a_lookup_while_the_charge_is_in_flight_proves_nothing() {
    let provider = Provider::start().await.expect("provider");
    provider.arm(Fault::new(Route::Payments, FaultKind::CommitAfterDelay { delay_ms: 2_000 }).for_order("o-1"));
    let dir = tempfile::tempdir().expect("dir");
    let policy = dir.path().join("oncebox.toml");
    let host = provider.addr();
    std::fs::write(&policy, format!("[hosts.\"{host}\"]\ntimeout = \"300ms\"\nsettle_window = \"4s\"\n"))
        .expect("policy");
    let ledger = dir.path().join("l.redb");
    let args = charge("o-1").to_string();
    let policy = policy.to_str().expect("utf8");
    let step = ["--policy", policy, "--run", "r1", "--step", "pay", oncebox_artifacts::CHARGE, &args];

    let (code, outcome, stderr) = run_cli(call_flags(&ledger, &provider), &step);
    assert_eq!((code, outcome["status"].as_str()), (1, Some("unknown")), "{outcome} {stderr}");
    // The provider is still working on it: its lookup says 404.
    let mut reconcile = call_flags(&ledger, &provider);
    reconcile[0] = "reconcile".into();
    let (code, early, stderr) = run_cli(reconcile.clone(), &step);
    assert_eq!(early["result"], "still-unknown", "{early} {stderr}");
    assert!(early["counts_from_ms"].is_u64(), "{early}");
    assert_eq!(code, 1);
    let key = early["operation_key"].as_str().expect("key");
    assert!(stderr.contains(&format!("oncebox resolve --ledger {} {key}", ledger.display())), "{stderr}");
    let (_, again, _) = run_cli(call_flags(&ledger, &provider), &step);
    assert_eq!(again["status"], "unknown", "not resent on the strength of a 404: {again}");
    assert_eq!(provider.requests(), 1);

    // Once the charge has landed, the same lookup finds it.
    provider.settled().await;
    let (code, late, stderr) = run_cli(reconcile, &step);
    assert_eq!((code, late["result"].as_str()), (0, Some("committed")), "{late} {stderr}");
    assert_eq!(provider.counts("o-1").payments, 1);
    assert_eq!(provider.requests(), 1);
}

#[tokio::test]
async fn the_builder_cannot_give_an_irreversible_tool_retries_or_resends() {
    let provider = Provider::start().await.expect("provider");
    let dir = tempfile::tempdir().expect("dir");
    for policy in [
        oncebox::RetryPolicy { max_attempts: 3, ..oncebox::RetryPolicy::for_class(ReplayClass::Irreversible) },
        oncebox::RetryPolicy {
            redispatch_in_doubt: true,
            ..oncebox::RetryPolicy::for_class(ReplayClass::Irreversible)
        },
    ] {
        let host = builder_for(&dir.path().join("l.redb"), &provider, true)
            .retry_policy("fulfill", policy)
            .build()
            .await
            .expect("host");
        let refused = host.load(oncebox_artifacts::FULFILL).await.expect_err("refused at load");
        assert!(matches!(refused, oncebox::Error::PolicyRefused { .. }), "{refused}");
        assert!(refused.to_string().contains("irreversible"), "{refused}");
        drop(host);
    }
}

/// An embedder's bank that takes effect as soon as it is called, then answers 20 ms later (or
/// never, if the caller stopped waiting): it counts what took effect, by effect key.
#[derive(Default)]
struct SlowBank {
    committed: std::sync::Mutex<std::collections::HashMap<String, u32>>,
}

impl oncebox::EffectProvider for SlowBank {
    fn call<'a>(
        &'a self,
        effect_key: &'a str,
        request: &'a str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = oncebox::ProviderOutcome> + Send + 'a>> {
        Box::pin(async move {
            *self.committed.lock().expect("lock").entry(effect_key.to_string()).or_default() += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
            oncebox::ProviderOutcome::Committed(format!(r#"{{"seen":{request}}}"#))
        })
    }
}

/// Polls `future` `polls` times, a few milliseconds apart so that the ledger's writer and the bank
/// make progress in between, and drops it unless it finished: a call cancelled at whatever await
/// point it had reached.
async fn poll_then_drop<F: std::future::Future>(future: F, polls: usize) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    for _ in 0..polls {
        let polled = std::future::poll_fn(|cx| std::task::Poll::Ready(future.as_mut().poll(cx))).await;
        if let std::task::Poll::Ready(output) = polled {
            return Some(output);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    None
}

/// The guarded path cancelled at each of its await points in turn (the claim, the write-ahead,
/// the dispatch, the answer's record, the attempt's record): whatever point a dropped call reached,
/// nothing is dispatched without a durable write-ahead, and the step called again never sends a
/// second time what may have taken effect, nor calls it failed or completed without proof.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_cancelled_at_any_await_point_keeps_its_effect_in_doubt() {
    let dir = tempfile::tempdir().expect("dir");
    let provider = Provider::start().await.expect("provider");
    let bank = std::sync::Arc::new(SlowBank::default());
    let lease = Duration::from_millis(60);
    let host = builder_for(&dir.path().join("l.redb"), &provider, false)
        .provider("bank", bank.clone())
        .lease(lease)
        .build()
        .await
        .expect("host");
    host.load(oncebox_artifacts::PANICKY).await.expect("load");
    let mut phases = std::collections::BTreeSet::new();
    let count = |key: &str| bank.committed.lock().expect("lock").get(key).copied().unwrap_or(0);
    let total = || bank.committed.lock().expect("lock").values().sum::<u32>();
    let every = ["dropped after the write-ahead", "dropped while the bank answered", "finished"];
    // From one poll up, until the call finishes before it is dropped (how many polls that takes
    // depends on the machine's fsyncs): every await point in between gets its turn. Which point a
    // given number of polls reaches depends on the machine's load too, so the sweep is made again
    // (at most three times) until each phase was met once; every sweep checks every call.
    for sweep in 0..3 {
        if every.iter().all(|phase| phases.contains(phase)) {
            break;
        }
        let mut finished_runs = 0;
        for polls in 1..=200 {
            if finished_runs == 2 {
                break;
            }
            let step = format!("cancel-{sweep}-{polls}");
            let args = json!({"mode": "ok", "provider": "bank", "echo": step}).to_string();
            let call = || Call::step("run-1", &step, "panicky", args.clone());
            let before = total();
            let finished = poll_then_drop(host.call(call()), polls).await;
            // Let whatever the dropped call handed the writer land, and its lease run out.
            tokio::time::sleep(lease * 2).await;
            let key = oncebox::keys::operation_key("run-1", &step, "panicky");
            let recorded = host.ledger().effects(&key).await.expect("effects");
            let committed: u32 = recorded.iter().map(|e| count(&e.key)).sum();
            // Everything that reached the bank has its write-ahead on record.
            assert_eq!(total() - before, committed, "polls {polls}: the bank was called without a write-ahead");
            assert!(committed <= 1, "polls {polls}: {committed} commits");
            let phase = match (&finished, recorded.first().map(|e| e.status)) {
                (Some(_), _) => "finished",
                (None, None) => "dropped before the write-ahead",
                (None, Some(EffectStatus::Dispatched)) if committed == 0 => "dropped after the write-ahead",
                (None, Some(EffectStatus::Dispatched)) => "dropped while the bank answered",
                (None, Some(_)) => "dropped after the answer was recorded",
            };
            phases.insert(phase);
            finished_runs += usize::from(phase == "finished");

            // The step called again: replayed, taken over, or left unknown; never a second dispatch.
            let calling_again_ms = crate::support::now_ms();
            let again = host.call(call()).await.expect("call");
            let effects = host.ledger().effects(&key).await.expect("effects");
            let after: u32 = effects.iter().map(|e| count(&e.key)).sum();
            assert!(after <= 1, "polls {polls} ({phase}): the step was sent {after} times; {again:?}");
            match again.status {
                Status::Completed => {
                    assert_eq!(after, 1, "polls {polls} ({phase}): completed without its effect; {again:?}")
                }
                Status::Failed => assert_eq!(after, 0, "polls {polls} ({phase}): failed after its effect; {again:?}"),
                // Unknown only where something may have happened: the dropped call's write-ahead is on
                // record (on a loaded machine it may land after the look above; it was made before this
                // call began, which a write-ahead of this call's own could not be).
                Status::Unknown => assert!(
                    phase != "dropped before the write-ahead"
                        || effects.iter().any(|e| e.first_dispatched_ms < calling_again_ms),
                    "polls {polls}: unknown with nothing written ahead by the dropped call: {again:?}"
                ),
                other => panic!("polls {polls} ({phase}): {other:?}"),
            }
            eprintln!("sweep {sweep}, polls {polls}: {phase}, then {:?}, {after} commit(s)", again.status);
        }
    }
    for phase in every {
        assert!(phases.contains(phase), "never {phase} in three sweeps: {phases:?}");
    }
}

/// A gateway that commits the first request it gets, answers 502, and goes away: every later
/// connection is refused. Counts its commits.
async fn one_shot_gateway() -> (String, std::sync::Arc<std::sync::atomic::AtomicU32>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let origin = format!("http://{}", listener.local_addr().expect("addr"));
    let commits = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counted = commits.clone();
    tokio::spawn(async move {
        if let Ok((mut socket, _)) = listener.accept().await {
            let mut buf = [0u8; 8192];
            let _ = socket.read(&mut buf).await;
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let body = r#"{"error":"bad_gateway"}"#;
            let reply = format!(
                "HTTP/1.1 502 Bad Gateway\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = socket.write_all(reply.as_bytes()).await;
        }
        // The listener is dropped here: from now on connections are refused.
    });
    (origin, commits)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_resend_after_a_502_is_no_proof_that_nothing_happened() {
    let (origin, commits) = one_shot_gateway().await;
    let dir = tempfile::tempdir().expect("dir");
    let provider = Provider::start().await.expect("provider");
    let host_port = origin.trim_start_matches("http://").to_string();
    let target = HttpTarget {
        honours_keys: true,
        key_retention: Duration::from_secs(86_400),
        timeout: TIMEOUT,
        ..Default::default()
    };
    let host = builder_for(&dir.path().join("l.redb"), &provider, true)
        .http_target(host_port, target)
        .tool_config("refund", "base_url", &origin)
        .grant("refund", oncebox::Grant::Http(origin.parse().expect("origin")))
        .build()
        .await
        .expect("host");
    host.load(oncebox_artifacts::REFUND).await.expect("load");
    let args = json!({"order_id": "o-1", "amount_cents": 500}).to_string();
    let outcome = host.call(Call::step("run-1", "refund", "refund", args.clone())).await.expect("call");
    assert_eq!(commits.load(std::sync::atomic::Ordering::SeqCst), 1, "the gateway committed once");
    assert_eq!(outcome.status, Status::Unknown, "a refused resend proves nothing of the first send: {outcome:?}");
    let again = host.call(Call::step("run-1", "refund", "refund", args)).await.expect("call");
    assert_ne!(again.status, Status::Failed, "{again:?}");
}
