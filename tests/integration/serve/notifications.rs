//! A person is told: an approval asked for, an unknown left unsettled, a compensation blocked,
//! each posted signed to the `[notify]` URL through the outbox, to a receiver written as
//! docs/operating.md shows it (`tests/serve/notify_receiver.py`), across a SIGKILL of the server.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use oncebox_example_provider::{Fault, FaultKind, Provider, Route};
use serde_json::{Value, json};

use super::support::{Server, Setup, TOKEN, client};
use crate::support::charge;

const SECRET: &str = "notify-secret-for-the-tests-0123456789";
const CONSOLE: &str = "https://ops.example";

/// The receiver of docs/operating.md on `port`: its new events, line by line, and its stderr.
struct Receiver {
    child: Child,
    events: mpsc::Receiver<Value>,
    stderr: std::path::PathBuf,
}

impl Receiver {
    fn start(port: u16, dir: &std::path::Path) -> Receiver {
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/serve/notify_receiver.py");
        let stderr = dir.join("receiver.err");
        let mut child = Command::new("python3")
            .arg(script)
            .arg(port.to_string())
            .env("ONCEBOX_NOTIFY_SECRET", SECRET)
            .stdout(Stdio::piped())
            .stderr(Stdio::from(std::fs::File::create(&stderr).expect("stderr file")))
            .spawn()
            .expect("python3 notify_receiver.py");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, events) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(serde_json::from_str(&line).unwrap_or(Value::String(line)));
            }
        });
        Receiver { child, events, stderr }
    }

    /// The events received within `within`, waiting for at least `want`, then a little more for
    /// any that should not come.
    fn collect(&self, want: usize, within: Duration) -> Vec<Value> {
        let mut got = Vec::new();
        let deadline = Instant::now() + within;
        while got.len() < want && Instant::now() < deadline {
            if let Ok(event) = self.events.recv_timeout(Duration::from_millis(100)) {
                got.push(event);
            }
        }
        while let Ok(event) = self.events.recv_timeout(Duration::from_secs(2)) {
            got.push(event);
        }
        got
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

async fn call(server: &Server, run: &str, step: &str, tool: &str, args: Value) -> Value {
    let body = json!({ "run_id": run, "step_id": step, "tool": tool, "args": args });
    let response = client().post(server.url("/v1/calls")).json(&body).send().await.expect("call");
    assert_eq!(response.status(), 200, "{}", server.log());
    response.json().await.expect("json")
}

/// Waits up to 10 s for the server to have logged `n` notifications enqueued.
async fn notified(server: &Server, n: usize) {
    for _ in 0..100 {
        if server.log().matches("a person is notified").count() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{n} notifications were not enqueued:\n{}", server.log());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_person_is_told_once_of_each_approval_unknown_and_blocked_compensation_across_a_sigkill() {
    let provider = Provider::start().await.expect("provider");
    // The charge commits, then its gateway answers 502: unknown. The reconciler's first try is an
    // hour away, so nothing settles it: it is left for a person at once (`unknown_after = "0s"`).
    provider.arm(Fault::new(Route::Payments, FaultKind::CommitThenError { status: 502 }).for_order("n1"));
    let port = free_port();
    let setup = Setup::reconciling(
        &provider,
        &format!(
            "[notify]\nurls = [\"http://127.0.0.1:{port}/hook\"]\nsecret = \"{SECRET}\"\nunknown_after = \"0s\"\n\
             console_url = \"{CONSOLE}\"\n[reconciler]\nfirst = \"1h\"\nmax = \"2h\"\nevery = \"200ms\"\n"
        ),
    );
    let mut server = setup.serve();
    let address = json!({"order_id": "n1", "address": "221B Baker Street", "items": [{"sku": "sku-1", "quantity": 1}]});
    let asked = call(&server, "rn", "ship-n1", "fulfill", address.clone()).await;
    assert_eq!(asked["status"], "awaiting-approval", "{asked}");
    let charged = call(&server, "rn", "charge-n1", "charge", charge("n1")).await;
    assert_eq!(charged["status"], "unknown", "{charged}");
    let compensate =
        client().post(server.url("/v1/runs/rn/compensate")).bearer_auth(TOKEN).send().await.expect("compensate");
    let report: Value = compensate.json().await.expect("json");
    assert_eq!(report["state"], "blocked", "the unknown charge blocks it: {report}");
    // Enqueued in the ledger while the receiver is down (connection refused: kept, retried).
    notified(&server, 3).await;
    server.kill();

    let receiver = Receiver::start(port, setup.dir.path());
    let server = setup.serve();
    // The same request met again after the restart: nothing more to tell.
    let again = call(&server, "rn", "ship-n1", "fulfill", address).await;
    assert_eq!(again["status"], "awaiting-approval", "{again}");
    let events = receiver.collect(3, Duration::from_secs(30));

    let kinds: Vec<&str> = events.iter().filter_map(|e| e["event"].as_str()).collect();
    let mut sorted = kinds.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, ["approval-requested", "compensation-blocked", "unknown"], "{events:#?}\n{}", server.log());
    let ids: std::collections::HashSet<&str> = events.iter().filter_map(|e| e["id"].as_str()).collect();
    assert_eq!(ids.len(), 3, "three events, each once: {events:#?}");
    assert!(!receiver.stderr().contains("repeat"), "no event was sent twice: {}", receiver.stderr());
    for event in &events {
        assert_eq!(event["run_id"], "rn", "{event}");
        let link = event["link"].as_str().unwrap_or_default();
        let page = link.strip_prefix(CONSOLE).unwrap_or_else(|| panic!("a link to the console: {event}"));
        // The page it links to is one the console serves.
        let served = client().get(server.url(page)).send().await.expect("the linked page");
        assert_eq!(served.status(), 200, "{link}: {}", served.text().await.unwrap_or_default());
        let text = event.to_string();
        for secret in ["221B Baker Street", "pm_card_visa", SECRET] {
            assert!(!text.contains(secret), "no sensitive value in a notification: {text}");
        }
    }
    let approval = events.iter().find(|e| e["event"] == "approval-requested").expect("approval");
    assert_eq!((approval["step_id"].as_str(), approval["tool"].as_str()), (Some("ship-n1"), Some("fulfill")));
    assert_eq!(approval["operation_key"], asked["operation_key"]);
    let unknown = events.iter().find(|e| e["event"] == "unknown").expect("unknown");
    assert_eq!(unknown["operation_key"], charged["operation_key"]);
    provider.settled().await;
    assert_eq!(provider.counts("n1").payments, 1, "telling a person sends nothing again");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_documented_receiver_refuses_a_notification_not_signed_with_the_secret() {
    let dir = tempfile::tempdir().expect("dir");
    let port = free_port();
    let _receiver = Receiver::start(port, dir.path());
    let url = format!("http://127.0.0.1:{port}/hook");
    let body = r#"{"event":"approval-requested","id":"forged"}"#;
    let now = crate::support::now_ms() / 1000;
    let forged = oncebox::notice::SigningKey::new(b"not the secret, but 32 bytes long");
    let good = oncebox::notice::SigningKey::new(SECRET.as_bytes());
    let stale = good.sign(now - 3_600, body.as_bytes());
    let mut answers = Vec::new();
    for signature in [forged.sign(now, body.as_bytes()), stale, good.sign(now, body.as_bytes())] {
        let mut status = 0;
        for _ in 0..50 {
            let sent = client()
                .post(&url)
                .header("Oncebox-Signature", &signature)
                .header("Idempotency-Key", "k")
                .body(body)
                .send()
                .await;
            if let Ok(response) = sent {
                status = response.status().as_u16();
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        answers.push(status);
    }
    assert_eq!(answers, [401, 401, 204], "another key and an hour-old stamp are refused");
}

/// A request for approval made while no `[notify]` was set (or written just before a crash, ahead
/// of its notification) is told by the server's background reading of open work, once, without
/// anyone calling the step again; the reading after it tells nothing more.
#[tokio::test(flavor = "multi_thread")]
async fn a_request_no_call_told_of_is_told_by_the_background_reading_once() {
    let provider = Provider::start().await.expect("provider");
    let reconciler = "[reconciler]\nfirst = \"1h\"\nmax = \"2h\"\nevery = \"200ms\"\n";
    let setup = Setup::reconciling(&provider, reconciler);
    let mut server = setup.serve();
    let address = json!({"order_id": "n2", "address": "10 Downing Street", "items": [{"sku": "sku-1", "quantity": 1}]});
    let asked = call(&server, "rp", "ship-n2", "fulfill", address).await;
    assert_eq!(asked["status"], "awaiting-approval", "{asked}");
    server.kill();

    let port = free_port();
    let mut policy = std::fs::read_to_string(setup.policy()).expect("policy");
    policy.push_str(&format!("[notify]\nurls = [\"http://127.0.0.1:{port}/hook\"]\nsecret = \"{SECRET}\"\n"));
    std::fs::write(setup.policy(), policy).expect("policy");
    let receiver = Receiver::start(port, setup.dir.path());
    let server = setup.serve();
    let events = receiver.collect(1, Duration::from_secs(30));
    // Several readings of the ledger passed while it collected (one every 200 ms).
    assert_eq!(events.len(), 1, "told once: {events:#?}\n{}", server.log());
    assert_eq!(events[0]["event"], "approval-requested", "{events:#?}");
    assert_eq!(events[0]["operation_key"], asked["operation_key"]);
    assert!(!events[0].to_string().contains("Downing"), "no sensitive value: {}", events[0]);
    assert!(!receiver.stderr().contains("repeat"), "{}", receiver.stderr());
    assert_eq!(server.log().matches("a person is notified").count(), 1, "{}", server.log());
    assert_eq!(provider.requests(), 0, "telling a person sends nothing");
}
