//! The `oncebox` binary: one JSON object per call, exit codes that tell success, tool failure and
//! usage error apart.

use std::process::Command;

use crate::support::{charge, oncebox, oncebox_with};

/// `oncebox call` on `ledger` with `charge` configured for, granted, and keyed at `provider`.
fn charge_flags(ledger: &std::path::Path, provider: &oncebox_example_provider::ProviderHandle) -> Vec<String> {
    let mut flags = crate::support::call_flags(ledger, provider);
    flags.extend(["--key-target".to_string(), provider.addr().to_string()]);
    flags
}

// Multi-threaded: the provider must keep serving while this thread blocks on the child process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_prints_the_outcome_and_replays_from_the_ledger_file() {
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let dir = tempfile::tempdir().expect("dir");
    let ledger = dir.path().join("l.redb");
    let flags = charge_flags(&ledger, &provider);
    let args = charge("o-1").to_string();
    let run = |extra: &[&str]| {
        let mut all: Vec<&str> = flags.iter().map(String::as_str).collect();
        all.extend_from_slice(extra);
        oncebox(&all)
    };
    let (code, first, stderr) = run(&["--run", "r1", "--step", "s1", oncebox_artifacts::CHARGE, &args]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(first["status"], "completed");
    assert_eq!(first["replayed"], false);
    assert_eq!(first["attempts"], 1);
    assert_eq!(first["operation_key"].as_str().map(str::len), Some(64));

    let (code, again, _) = run(&["--run", "r1", "--step", "s1", oncebox_artifacts::CHARGE, &args]);
    assert_eq!(code, 0);
    assert_eq!(again["replayed"], true);
    assert_eq!(again["output"], first["output"]);
    assert_eq!(provider.counts("o-1").payments, 1);

    let mut changed = charge("o-1");
    changed["amount_cents"] = 1.into();
    let (code, conflict, _) = run(&["--run", "r1", "--step", "s1", oncebox_artifacts::CHARGE, &changed.to_string()]);
    assert_eq!(code, 1, "a conflict is a tool outcome, not a usage error");
    assert_eq!(conflict["status"], "conflict");
    assert_eq!(conflict["error"]["class"], "conflict");

    let (code, _, stderr) = run(&[oncebox_artifacts::CHARGE, &args]);
    assert_eq!(code, 2);
    assert!(stderr.contains("--run and --step"), "{stderr}");
    let (code, _, stderr) = run(&["--run", "r1", "--step", "s2", oncebox_artifacts::CHARGE, "{oops"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("not valid JSON"), "{stderr}");

    let (code, listed, _) = oncebox(&["ledger", "list", "--ledger", ledger.to_str().expect("utf8"), "--run", "r1"]);
    assert_eq!(code, 0);
    assert_eq!(listed["status"], "completed");
    let key = first["operation_key"].as_str().expect("key");
    let (code, shown, _) = oncebox(&["ledger", "show", "--ledger", ledger.to_str().expect("utf8"), key]);
    assert_eq!(code, 0);
    assert_eq!(shown["operation"]["args"]["payment_method"], oncebox::REDACTED);
    assert_eq!(shown["effects"].as_array().map(Vec::len), Some(1));
    assert_eq!(shown["attempts"][0]["outcome"], "ok");

    // Naming what is not there gets one line that says so, not an answer about something else.
    let ledger_arg = ledger.to_str().expect("utf8");
    let (code, _, stderr) = oncebox(&["resolve", "--ledger", ledger_arg, "deadbeef", "--not-committed", "--by", "me"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("no operation with key deadbeef"), "{stderr}");
    let mut reconcile: Vec<&str> = flags.iter().map(String::as_str).collect();
    reconcile[0] = "reconcile";
    reconcile.extend(["--run", "r1", "--step", "nope", oncebox_artifacts::CHARGE, &args]);
    let (code, printed, stderr) = oncebox(&reconcile);
    assert_eq!((code, printed), (2, serde_json::Value::Null), "{stderr}");
    assert!(stderr.contains("no operation of this tool for run `r1` step `nope`"), "{stderr}");
    let (code, _, stderr) = run(&["--run", "r1", "--step", "s9", "/no/such/tool.wasm", &args]);
    assert_eq!(code, 2);
    assert_eq!(stderr.matches("No such file or directory").count(), 1, "said once: {stderr}");
}

#[test]
fn inspect_shows_the_manifest_and_refuses_a_liar() {
    let (code, m, _) = oncebox(&["inspect", oncebox_artifacts::FULFILL]);
    assert_eq!(code, 0);
    assert_eq!(m["name"], "fulfill");
    assert_eq!(m["class"], "irreversible");
    assert!(m["exports"].as_array().expect("exports").iter().any(|e| e == "oncebox:tool/reconcile@0.1.0"));
    assert!(m["input_schema"]["properties"]["items"].is_object());

    let (code, _, stderr) = oncebox(&["inspect", oncebox_artifacts::LYING_READER]);
    assert_eq!(code, 2);
    assert!(stderr.contains("oncebox:tool/effects@0.1.0"), "{stderr}");
}

#[test]
fn the_demo_charges_once_per_order_through_oncebox() {
    let output = Command::new(env!("CARGO_BIN_EXE_oncebox")).args(["demo", "--orders", "2"]).output().expect("demo");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let last = stdout.lines().last().expect("a summary line");
    assert_eq!(last, "demo: orders=2 naive_charges=4 oncebox_charges=2");
}

#[test]
fn policy_show_names_where_each_value_came_from() {
    let dir = tempfile::tempdir().expect("dir");
    let policy = dir.path().join("oncebox.toml");
    std::fs::write(
        &policy,
        "[tools.charge]\nmax_attempts = 4\n\n[tools.charge.grants]\nhttp = [\"https://api.example.com\"]\n\n\
         [tools.charge.limits]\nmemory = \"64MiB\"\n",
    )
    .expect("write");
    let policy = policy.to_str().expect("utf8");
    let (code, shown, stderr) = oncebox(&["policy", "show", oncebox_artifacts::CHARGE, "--policy", policy]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(shown["tool"], "charge");
    assert_eq!(shown["policy"]["max_attempts"], 4);
    assert_eq!(shown["sources"]["max_attempts"], format!("{policy}:2"));
    assert_eq!(shown["grants"]["http"], serde_json::json!(["https://api.example.com:443"]));
    assert_eq!(shown["grants"]["kv"], serde_json::json!([]));
    assert_eq!(shown["limits"]["memory_bytes"], 64 << 20);
    assert_eq!(shown["limits"]["effects_per_attempt"], oncebox::limits::DEFAULT_EFFECTS_PER_ATTEMPT);
    assert_eq!(shown["sources"]["initial_backoff"], "default for compensatable");

    // An impossible value anywhere in the file refuses the file, naming the line.
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[tools.charge]\nmax_attempts = 4\n\n[tools.refund]\nmax_attempts = 0\n").expect("write");
    let bad = bad.to_str().expect("utf8");
    let (code, _, stderr) = oncebox(&["policy", "show", oncebox_artifacts::CHARGE, "--policy", bad]);
    assert_eq!(code, 2);
    assert!(stderr.contains(&format!("{bad}:5")), "{stderr}");
}

// Multi-threaded: the provider keeps serving while this thread waits on child processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_killed_mid_dispatch_leaves_unknown_and_the_next_process_dispatches_nothing() {
    use oncebox_example_provider::{Fault, FaultKind, Route};
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    provider.arm(Fault::new(Route::Payments, FaultKind::Delay { delay_ms: 30_000 }).for_order("o-1"));
    let dir = tempfile::tempdir().expect("dir");
    let ledger = dir.path().join("l.redb");
    let args = charge("o-1").to_string();
    let mut call = charge_flags(&ledger, &provider);
    call.extend(
        ["--timeout-ms", "60000", "--run", "r1", "--step", "s1", oncebox_artifacts::CHARGE, &args].map(String::from),
    );
    let call: Vec<&str> = call.iter().map(String::as_str).collect();
    let mut child = Command::new(env!("CARGO_BIN_EXE_oncebox"))
        .args(&call)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn oncebox");
    crate::support::eventually("the provider committed the charge", || provider.counts("o-1").payments == 1).await;
    child.kill().expect("kill -9 the host mid-dispatch");
    child.wait().expect("reap");

    // Without `--key-target` nothing says the provider honours keys: the next process must not resend.
    let plain: Vec<&str> =
        call.iter().copied().filter(|a| *a != "--key-target" && *a != provider.addr().to_string()).collect();
    let (code, outcome, stderr) = oncebox(&plain);
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(outcome["status"], "unknown", "{outcome}");
    assert_eq!(outcome["replayed"], true);
    assert_eq!(provider.requests(), 1, "the second process dispatched nothing");
    assert_eq!(provider.counts("o-1").payments, 1);

    // With it, the host may resend with the same key: the provider answers from its key store.
    let (code, outcome, stderr) = oncebox(&call);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(outcome["status"], "completed", "{outcome}");
    assert_eq!(provider.requests(), 2, "one resend");
    assert_eq!(provider.counts("o-1").payments, 1, "still one charge");
}

#[test]
fn a_second_process_loads_the_compiled_component_from_the_disk_cache_and_a_corrupt_entry_is_recompiled() {
    let dir = tempfile::tempdir().expect("dir");
    let cache = dir.path().join("cache");
    let env = [("ONCEBOX_CACHE", cache.to_str().expect("utf8")), ("ONCEBOX_LOG", "oncebox=debug")];
    let inspect = || oncebox_with(&["inspect", oncebox_artifacts::CHARGE], &env);

    let (code, first, stderr) = inspect();
    assert_eq!(code, 0, "{stderr}");
    assert!(!stderr.contains("disk cache"), "nothing to load the first time: {stderr}");
    let entries: Vec<_> = std::fs::read_dir(&cache).expect("cache dir").map(|e| e.expect("entry").path()).collect();
    assert_eq!(entries.len(), 1, "{entries:?}");

    let (code, second, stderr) = inspect();
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("loaded from the disk cache"), "{stderr}");
    assert_eq!(first, second, "the cached component describes itself the same");

    // A flipped byte in the middle: the checksum refuses it, the component is compiled again.
    let mut bytes = std::fs::read(&entries[0]).expect("read entry");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&entries[0], &bytes).expect("corrupt entry");
    let (code, third, stderr) = inspect();
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("corrupt; compiling again"), "{stderr}");
    assert!(!stderr.contains("loaded from the disk cache"), "{stderr}");
    assert_eq!(first, third);
    // A truncated entry too; and the rewritten entry is good again.
    std::fs::write(&entries[0], &bytes[..10]).expect("truncate entry");
    let (_, _, stderr) = inspect();
    assert!(stderr.contains("corrupt; compiling again"), "{stderr}");
    let (_, _, stderr) = inspect();
    assert!(stderr.contains("loaded from the disk cache"), "rewritten after the recompile: {stderr}");
}

#[test]
fn a_file_that_is_not_a_component_gets_one_line_naming_the_file() {
    let dir = tempfile::tempdir().expect("dir");
    let ledger = dir.path().join("l.redb");
    let ledger = ledger.to_str().expect("utf8");
    let files: [(&str, &[u8], &str); 4] = [
        ("notes.wasm", b"these are my notes\nnot a tool\n", "it is text"),
        ("random.wasm", &[0x97, 0x1a, 0xf7, 0xa3, 0x00, 0xff, 0x10, 0x42, 0x07], "magic bytes"),
        ("core.wasm", b"\0asm\x01\0\0\0", "core module"),
        // A component header with a body the engine cannot parse: the engine's reason, on one line.
        ("torn.wasm", b"\0asm\x0d\0\x01\0garbage", "failed to parse"),
    ];
    for (name, bytes, why) in files {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).expect("write");
        let path = path.to_str().expect("utf8");
        for command in
            [vec!["inspect", path], vec!["call", "--ledger", ledger, "--run", "r", "--step", name, path, "{}"]]
        {
            let (code, _, stderr) = oncebox(&command);
            assert_eq!(code, 2, "{command:?}: {stderr}");
            assert_eq!(stderr.lines().count(), 1, "{command:?}: one line, got: {stderr}");
            let expected = format!("error: {path} is not a WebAssembly component: ");
            assert!(stderr.starts_with(&expected) && stderr.contains(why), "{command:?}: {stderr}");
        }
    }
}

// Multi-threaded: the provider must keep serving while this thread blocks on the child process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_target_keeps_what_the_policy_file_says_of_the_host() {
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let dir = tempfile::tempdir().expect("dir");
    let policy = dir.path().join("oncebox.toml");
    let host = provider.addr();
    std::fs::write(&policy, format!("[hosts.\"{host}\".headers]\nauthorization = \"Bearer sk_test_kept\"\n"))
        .expect("policy");
    let mut call = charge_flags(&dir.path().join("l.redb"), &provider);
    let args = charge("o-1").to_string();
    let policy = policy.to_str().expect("utf8").to_string();
    call.extend(
        ["--policy", &policy, "--run", "r1", "--step", "s1", oncebox_artifacts::CHARGE, &args].map(String::from),
    );
    let call: Vec<&str> = call.iter().map(String::as_str).collect();
    let (code, outcome, stderr) = oncebox(&call);
    assert_eq!(code, 0, "{outcome} {stderr}");
    assert_eq!(provider.last_authorization().as_deref(), Some("Bearer sk_test_kept"), "the file's credential was sent");
}

/// A reader that goes away (`oncebox ledger list | head -c 10`) ends the command quietly: exit 0,
/// no panic, as any filter in a pipe ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_goes_away_ends_the_command_quietly() {
    use std::io::Read;
    let f = crate::support::Fixture::new().await;
    // More lines than a pipe holds (64 KiB), so the command is still writing when the reader goes.
    for i in 0..400 {
        let done = f.call("pipe", &format!("s{i}"), "panicky", &serde_json::json!({"mode": "ok"})).await;
        assert!(done.is_completed(), "{done:?}");
    }
    let ledger = f.dir.path().join("ledger.redb");
    let crate::support::Fixture { dir, host, .. } = f;
    drop(host);
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_oncebox"))
        .args(["ledger", "list", "--ledger", ledger.to_str().expect("utf8")])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("oncebox ledger list");
    let mut first = [0u8; 10];
    child.stdout.take().expect("stdout").read_exact(&mut first).expect("ten bytes");
    let output = child.wait_with_output().expect("ends");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    drop(dir);
}
