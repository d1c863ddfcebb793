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
