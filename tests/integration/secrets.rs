//! Nothing secret leaves the host: not the card number the model passed (marked sensitive by the
//! manifest), not the bearer token the operator configured for the downstream. Checked where it
//! would show: every log line at debug level, every byte of the ledger file, every
//! line the CLI prints.

use std::process::Command;

use oncebox_example_provider::{Fault, FaultKind, Provider, Route};

const CARD: &str = "4111111111111111";
const TOKEN: &str = "sk_test_51SeCrEtToKeN";

// Multi-threaded: the provider keeps serving while this thread waits for the CLI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn card_numbers_and_bearer_tokens_appear_in_no_log_record_or_output() {
    let provider = Provider::start().await.expect("provider");
    // A lost answer and a rate limit: retries, unknown outcomes and resends all get logged.
    provider.arm(Fault::new(Route::Payments, FaultKind::LoseResponse));
    provider.arm(Fault::new(Route::Payments, FaultKind::RateLimit { retry_after_ms: 10 }));
    let dir = tempfile::tempdir().expect("dir");
    let ledger = dir.path().join("ledger.redb");
    let policy = dir.path().join("oncebox.toml");
    std::fs::write(
        &policy,
        format!(
            "[tools.charge]\ninitial_backoff = \"1ms\"\n\n[tools.charge.config]\nbase_url = \"{base}\"\n\n\
             [tools.charge.grants]\nhttp = [\"{base}\"]\n\n\
             [hosts.\"{addr}\"]\nhonours_keys = true\nkey_retention = \"24h\"\n\n\
             [hosts.\"{addr}\".headers]\nauthorization = \"Bearer {TOKEN}\"\n",
            base = provider.base_url(),
            addr = provider.addr(),
        ),
    )
    .expect("write policy");

    let args = format!(r#"{{"order_id":"o-1","amount_cents":1200,"currency":"eur","payment_method":"{CARD}"}}"#);
    let declined = r#"{"order_id":"o-2","amount_cents":1,"currency":"eur","payment_method":"card_declined"}"#;
    let ledger_arg = ledger.to_str().expect("utf8");
    let policy_arg = policy.to_str().expect("utf8");
    let mut printed = String::new();
    let run = |printed: &mut String, args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_oncebox"))
            // Everything at debug, but the engine's own compile chatter, which says nothing of calls.
            .env("ONCEBOX_LOG", "debug,wasmtime=warn,cranelift=warn")
            .args(args)
            .output()
            .expect("run oncebox");
        printed.push_str(&String::from_utf8_lossy(&output.stdout));
        printed.push_str(&String::from_utf8_lossy(&output.stderr));
        output.status.code()
    };
    let call = ["--log-format", "json", "call", "--ledger", ledger_arg, "--policy", policy_arg];
    let charge = oncebox_artifacts::CHARGE;
    assert_eq!(run(&mut printed, &[&call[..], &["--run", "r", "--step", "charge", charge, &args]].concat()), Some(0));
    assert_eq!(run(&mut printed, &[&call[..], &["--run", "r", "--step", "charge", charge, &args]].concat()), Some(0));
    assert_eq!(
        run(&mut printed, &[&call[..], &["--run", "r", "--step", "declined", charge, declined]].concat()),
        Some(1)
    );
    assert_eq!(run(&mut printed, &["--log-format", "json", "ledger", "list", "--ledger", ledger_arg]), Some(0));
    let key = printed
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find_map(|v| v["operation_key"].as_str().map(String::from))
        .expect("an operation key was printed");
    assert_eq!(run(&mut printed, &["ledger", "show", "--ledger", ledger_arg, &key]), Some(0));

    // The credential reached the downstream, and the charge happened once.
    assert_eq!(provider.last_authorization(), Some(format!("Bearer {TOKEN}")));
    assert_eq!(provider.counts("o-1").payments, 1);
    // The logs are there (so their silence about secrets means something), and they are JSON.
    let attempts = printed
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["fields"]["message"] == "attempt")
        .count();
    assert!(attempts >= 3, "expected attempt events in the JSON logs:\n{printed}");

    for secret in [CARD, TOKEN] {
        assert!(!printed.contains(secret), "`{secret}` was printed:\n{printed}");
        let bytes = std::fs::read(&ledger).expect("ledger file");
        assert!(!bytes.windows(secret.len()).any(|w| w == secret.as_bytes()), "`{secret}` is in the ledger file");
    }
}

/// A short sensitive value (a PIN) cannot be recovered from the ledger file by hashing guesses:
/// fingerprints are keyed with a secret kept beside the ledger, readable by its owner only, and a
/// rotation of that secret keeps every recorded step replaying.
#[tokio::test]
async fn fingerprints_are_keyed_with_a_secret_beside_the_ledger_and_survive_its_rotation() {
    let dir = tempfile::tempdir().expect("dir");
    let ledger = dir.path().join("ledger.redb");
    let provider = Provider::start().await.expect("provider");
    let args = serde_json::json!({"mode": "ok", "echo": "1234"}).to_string();
    let call = || oncebox::Call::step("run-1", "pin", "panicky", args.clone());
    let fingerprint = {
        let host = crate::support::host_for(&ledger, &provider, true).await;
        let outcome = host.call(call()).await.expect("call");
        let op =
            host.ledger().operation(outcome.operation_key.as_deref().expect("key")).await.expect("read").expect("op");
        op.fingerprint
    };
    // What an attacker with the ledger file would compute for each guess: the unkeyed hash.
    let canonical = r#"{"echo":"1234","mode":"ok"}"#;
    for domain in ["oncebox/fingerprint/v1", "oncebox/fingerprint/v2"] {
        use sha2::Digest;
        let mut hasher = sha2::Sha256::new();
        for part in [domain.as_bytes(), b"panicky", canonical.as_bytes()] {
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part);
        }
        assert_ne!(fingerprint, format!("{:x}", hasher.finalize()), "the fingerprint is not a plain hash");
    }
    let key_file = oncebox::secret::beside(&ledger);
    let text = std::fs::read_to_string(&key_file).expect("a key file beside the ledger");
    let secret = text.lines().next().expect("one secret").to_string();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&key_file).expect("meta").permissions().mode();
        assert_eq!(mode & 0o077, 0, "owner-only: {mode:o}");
    }
    let file = std::fs::read(&ledger).expect("ledger bytes");
    assert!(!file.windows(secret.len()).any(|w| w == secret.as_bytes()), "the secret is not in the ledger");

    // Rotate: a new secret signs, the old one still matches the recorded step.
    let ledger_arg = ledger.to_str().expect("utf8");
    let (code, rotated, stderr) = crate::support::oncebox(&["ledger", "rotate-key", "--ledger", ledger_arg]);
    assert_eq!((code, rotated["secrets"].as_u64()), (0, Some(2)), "{rotated} {stderr}");
    let host = crate::support::host_for(&ledger, &provider, true).await;
    let replay = host.call(call()).await.expect("call");
    assert!(replay.replayed && replay.is_completed(), "the step recorded before the rotation replays: {replay:?}");
    let changed = host.call(oncebox::Call::step("run-1", "pin", "panicky", r#"{"mode":"ok","echo":"9999"}"#)).await;
    assert_eq!(changed.expect("call").status, oncebox::Status::Conflict, "other args are still a conflict");
    let new = host.call(oncebox::Call::step("run-1", "pin-2", "panicky", args.clone())).await.expect("call");
    let op = host.ledger().operation(new.operation_key.as_deref().expect("key")).await.expect("read").expect("op");
    assert_ne!(op.fingerprint, fingerprint, "a new step is fingerprinted under the new secret");
}

/// A downstream that echoes what it is sent: `POST /echo` answers `{"echoed": BODY}`; `GET
/// /attempts` counts the reads made of it and answers the count.
async fn echo_downstream() -> String {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    let reads = Arc::new(AtomicU32::new(0));
    let app = axum::Router::new()
        .route(
            "/echo",
            axum::routing::post(|body: String| async move {
                let sent: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
                serde_json::json!({ "echoed": sent, "note": format!("we received {sent}") }).to_string()
            }),
        )
        .route(
            "/attempts",
            axum::routing::get(move || {
                let reads = reads.clone();
                async move { (reads.fetch_add(1, Ordering::SeqCst) + 1).to_string() }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

/// An answer that echoes a sensitive arg is recorded masked, and the guest still gets it exactly
/// when its effect is answered from the ledger: the first attempt fails after the effect, the
/// second one is given the recorded answer and finds the value in it, as the downstream sent it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_echoed_secret_is_recorded_masked_and_the_guest_gets_the_exact_answer_on_a_rerun() {
    const SECRET: &str = "221B Baker Street, London";
    let base = echo_downstream().await;
    let dir = tempfile::tempdir().expect("dir");
    let ledger = dir.path().join("ledger.redb");
    let policy = oncebox::RetryPolicy {
        max_attempts: 3,
        initial_backoff: std::time::Duration::from_millis(1),
        max_backoff: std::time::Duration::from_millis(2),
        ..oncebox::RetryPolicy::for_class(oncebox::ReplayClass::IdempotentWrite)
    };
    let host = oncebox::Host::builder(&ledger)
        .retry_policy("hostile", policy)
        .grant("hostile", oncebox::Grant::Http(base.parse().expect("origin")))
        .build()
        .await
        .expect("host");
    host.load(oncebox_artifacts::HOSTILE).await.expect("load hostile");
    let args = serde_json::json!({
        "mode": "echo-again", "secret": SECRET, "url": format!("{base}/echo"), "target": format!("{base}/attempts"),
    });
    let outcome = host.call(oncebox::Call::step("r", "echo", "hostile", args.to_string())).await.expect("call");
    assert_eq!((outcome.status, outcome.attempts), (oncebox::Status::Completed, 2), "{outcome:?}");
    assert_eq!(outcome.output.as_ref().map(|o| &o["found"]), Some(&serde_json::json!(true)), "the exact answer");

    let key = outcome.operation_key.as_deref().expect("key");
    let effects = host.ledger().effects(key).await.expect("effects");
    let response = effects[0].response.as_deref().expect("an answer");
    assert!(!response.contains(SECRET), "recorded masked: {response}");
    assert!(response.contains("we received"), "the rest of the answer is kept: {response}");
    let attempts = host.ledger().attempts(key).await.expect("attempts");
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[1].effects[0].source, oncebox::ledger::EffectSource::Deduplicated, "answered from the ledger");
    drop(host);
    let bytes = std::fs::read(&ledger).expect("ledger file");
    assert!(!bytes.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()), "the ledger file holds it in the clear");
}
