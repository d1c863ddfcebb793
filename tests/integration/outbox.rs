//! Outbox delivery against a real HTTP endpoint on loopback that counts what it receives, by
//! `Idempotency-Key`: every message once, each topic in order, resends with the same key, a
//! refusal that stops its topic without skipping, the relay in-process beside a host's calls, and
//! a relay process killed with SIGKILL in the middle of a send and started again.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use oncebox::ledger::{
    AttemptRecord, AttemptSource, Claim, ClaimRequest, EffectRecord, EffectStatus, Ledger, LocalWrite, OperationStatus,
};
use oncebox::outbox::{Endpoint, Relay, TopicState};
use oncebox::{Call, ReplayClass};
use serde_json::json;

use crate::support::{closed_origin, eventually};

/// One request as the endpoint received it.
#[derive(Debug, Clone, PartialEq)]
pub struct Received {
    pub key: String,
    pub topic: String,
    pub seq: u64,
    pub body: String,
}

/// How the endpoint answers.
#[derive(Debug, Default)]
pub struct Behaviour {
    /// Answer this many requests with 503 (after reading them) before answering 200.
    fail_first: u32,
    /// Answer requests for these (topic, seq) with this status.
    refuse: Vec<(String, u64, u16)>,
    /// Wait this long before answering.
    delay: Duration,
}

#[derive(Debug, Default)]
struct SinkState {
    received: Vec<Received>,
    /// Requests received and not answered yet.
    in_flight: usize,
    behaviour: Behaviour,
}

/// The endpoint: records every request on arrival, before it answers (the serve tests use it too).
#[derive(Clone, Default)]
pub struct Sink {
    state: Arc<Mutex<SinkState>>,
}

impl Sink {
    pub async fn start(behaviour: Behaviour) -> (Sink, SocketAddr) {
        let sink = Sink { state: Arc::new(Mutex::new(SinkState { behaviour, ..SinkState::default() })) };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let served = sink.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let sink = served.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |request| {
                        let sink = sink.clone();
                        async move { Ok::<_, std::convert::Infallible>(sink.answer(request).await) }
                    });
                    let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                });
            }
        });
        (sink, addr)
    }

    fn state(&self) -> MutexGuard<'_, SinkState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    async fn answer(&self, request: Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
        let header = |name: &str| {
            request.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string).unwrap_or_default()
        };
        let (key, topic, seq) = (header("idempotency-key"), header("oncebox-topic"), header("oncebox-seq"));
        let seq = seq.parse().unwrap_or(0);
        let body = request.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        let body = String::from_utf8_lossy(&body).into_owned();
        let (status, delay) = {
            let mut state = self.state();
            state.received.push(Received { key, topic: topic.clone(), seq, body });
            state.in_flight += 1;
            let refused = state.behaviour.refuse.iter().find(|(t, s, _)| *t == topic && *s == seq).map(|r| r.2);
            let status = match refused {
                Some(status) => status,
                None if state.behaviour.fail_first > 0 => {
                    state.behaviour.fail_first -= 1;
                    503
                }
                None => 200,
            };
            (status, state.behaviour.delay)
        };
        tokio::time::sleep(delay).await;
        self.state().in_flight -= 1;
        let mut response = Response::new(Full::new(Bytes::from_static(b"{\"error\":\"no such mailbox\"}")));
        *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        response
    }

    pub fn received(&self) -> Vec<Received> {
        self.state().received.clone()
    }

    /// Received requests by key.
    fn counts(&self) -> HashMap<String, usize> {
        let mut counts = HashMap::new();
        for r in self.received() {
            *counts.entry(r.key).or_insert(0) += 1;
        }
        counts
    }
}

fn endpoint(addr: SocketAddr, path: &str) -> Endpoint {
    let url = format!("http://{addr}/{path}").parse().expect("url");
    Endpoint {
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(10),
        attempts_per_pass: 10,
        ..Endpoint::new(url)
    }
}

/// Enqueues `messages` (topic, payload) in order, as one completed operation `op` of the ledger,
/// the way a tool's outbox effects commit: with the operation's attempt, in one write.
async fn enqueue(ledger: &Ledger, op: &str, messages: &[(&str, String)]) {
    let now = crate::support::now_ms();
    let request = ClaimRequest {
        key: op.into(),
        run_id: "run".into(),
        step_id: op.into(),
        tool: "notify".into(),
        class: ReplayClass::IdempotentWrite,
        fingerprint: "f".into(),
        older_fingerprints: Vec::new(),
        args: serde_json::Value::Null,
        owner: "test".into(),
        now_ms: now,
        lease_ms: 60_000,
        approval: None,
        sealed: None,
    };
    let Claim::Owned { fence, .. } = ledger.claim(&request).await.expect("claim") else { panic!("not owned") };
    let staged = messages
        .iter()
        .enumerate()
        .map(|(n, (topic, payload))| {
            let record = EffectRecord {
                key: format!("{op}-key-{n}"),
                operation_key: op.into(),
                label: "send".into(),
                occurrence: n as u32,
                kind: "outbox".into(),
                target: topic.to_string(),
                fingerprint: format!("f{n}"),
                status: EffectStatus::Completed,
                response: Some("null".into()),
                sealed: None,
                error: None,
                dispatches: 1,
                first_dispatched_ms: now,
                last_dispatched_ms: now,
                updated_ms: now,
                resolution: None,
                attempt: 1,
            };
            (record, LocalWrite::Outbox { topic: topic.to_string(), payload: payload.clone() })
        })
        .collect();
    let attempt = AttemptRecord {
        operation_key: op.into(),
        run_id: "run".into(),
        step_id: op.into(),
        tool: "notify".into(),
        attempt: 1,
        max_attempts: 3,
        fence,
        started_ms: now,
        duration_us: 0,
        outcome: "ok".into(),
        message: None,
        source: AttemptSource::Fresh,
        downstream_accepted: None,
        effects: Vec::new(),
    };
    let finish = Some((OperationStatus::Completed, Some("{}".into()), None));
    ledger.record_attempt(fence, &attempt, finish, now, staged).await.expect("enqueue");
}

fn messages(topic: &str, n: usize) -> Vec<(&str, String)> {
    (1..=n).map(|i| (topic, json!({"n": i, "topic": topic}).to_string())).collect()
}

/// The keys in the order the endpoint first saw them, for one topic.
fn first_seen(received: &[Received], topic: &str) -> Vec<String> {
    let mut seen = HashSet::new();
    received.iter().filter(|r| r.topic == topic && seen.insert(r.key.clone())).map(|r| r.key.clone()).collect()
}

/// The ledger's keys of a topic, in sequence order.
async fn keys_in_order(ledger: &Ledger, topic: &str) -> Vec<String> {
    let mut outbox: Vec<_> = ledger.outbox().await.expect("outbox").into_iter().filter(|m| m.topic == topic).collect();
    outbox.sort_by_key(|m| m.seq);
    outbox.into_iter().map(|m| m.effect_key).collect()
}

/// The sequence numbers the endpoint saw for `topic`, in arrival order, never going back: a resend
/// repeats the latest, no message arrives before an earlier one was acknowledged.
fn assert_never_reordered(received: &[Received], topic: &str) {
    let seqs: Vec<u64> = received.iter().filter(|r| r.topic == topic).map(|r| r.seq).collect();
    assert!(seqs.windows(2).all(|w| w[0] <= w[1]), "{topic} arrived out of order: {seqs:?}");
}

#[tokio::test]
async fn every_message_is_delivered_once_in_order_per_topic_with_its_key() {
    let (sink, addr) = Sink::start(Behaviour::default()).await;
    let ledger = Ledger::in_memory().expect("ledger");
    // Two topics, interleaved across two operations.
    enqueue(&ledger, "a", &[messages("email", 3), messages("sms", 2)].concat()).await;
    enqueue(&ledger, "b", &[messages("sms", 1), messages("email", 2)].concat()).await;
    let relay = Relay::new(
        ledger.clone(),
        [("email".to_string(), endpoint(addr, "email")), ("sms".to_string(), endpoint(addr, "sms"))],
        &[],
    )
    .expect("relay");

    let summary = relay.deliver_pending().await.expect("pass");
    assert!(summary.all_delivered(), "{summary:?}");
    assert_eq!(summary.delivered(), 8);
    let received = sink.received();
    assert_eq!(received.len(), 8, "one send each: {received:?}");
    assert!(sink.counts().values().all(|&n| n == 1), "{:?}", sink.counts());
    for topic in ["email", "sms"] {
        assert_eq!(first_seen(&received, topic), keys_in_order(&ledger, topic).await, "{topic} in order");
        assert_never_reordered(&received, topic);
    }
    // Each request carried its message: the key, the topic and the payload as enqueued.
    for message in ledger.outbox().await.expect("outbox") {
        let got = received.iter().find(|r| r.key == message.effect_key).expect("received");
        assert_eq!((&got.topic, got.seq, &got.body), (&message.topic, message.seq, &message.payload));
        assert_eq!((message.delivery.state(), message.delivery.attempts), ("delivered", 1));
    }
    // Nothing is pending, so another pass sends nothing.
    let again = relay.deliver_pending().await.expect("pass");
    assert_eq!((again.delivered(), sink.received().len()), (0, 8));
}

#[tokio::test]
async fn an_endpoint_failing_with_503_then_recovering_gets_every_message_in_order_with_the_same_keys() {
    let (sink, addr) = Sink::start(Behaviour { fail_first: 3, ..Behaviour::default() }).await;
    let ledger = Ledger::in_memory().expect("ledger");
    enqueue(&ledger, "a", &messages("email", 4)).await;
    let relay = Relay::new(ledger.clone(), [("email".to_string(), endpoint(addr, "email"))], &[]).expect("relay");

    let summary = relay.deliver_pending().await.expect("pass");
    assert!(summary.all_delivered(), "{summary:?}");
    let report = &summary.topics[0];
    assert_eq!((report.delivered, report.sends, report.resent_in_doubt), (4, 7, 3));
    let keys = keys_in_order(&ledger, "email").await;
    let received: Vec<String> = sink.received().into_iter().map(|r| r.key).collect();
    // The head was sent four times with its own key before anything after it went out.
    let head = &keys[0];
    assert_eq!(received[..4], [head.clone(), head.clone(), head.clone(), head.clone()], "{received:?}");
    assert_eq!(received[4..], keys[1..], "then the rest, in order, once each");
    let head_record = ledger.outbox().await.expect("outbox").remove(0);
    assert_eq!(head_record.delivery.attempts, 4, "{head_record:?}");
    assert!(head_record.delivery.last_error.as_deref().is_some_and(|e| e.contains("503")), "{head_record:?}");
}

#[tokio::test]
async fn a_refusal_stops_its_topic_without_skipping_and_other_topics_go_on() {
    let refuse = vec![("email".to_string(), 2, 422)];
    let (sink, addr) = Sink::start(Behaviour { refuse, ..Behaviour::default() }).await;
    let ledger = Ledger::in_memory().expect("ledger");
    enqueue(&ledger, "a", &[messages("email", 3), messages("sms", 2)].concat()).await;
    let topics = [("email".to_string(), endpoint(addr, "email")), ("sms".to_string(), endpoint(addr, "sms"))];
    let relay = Relay::new(ledger.clone(), topics.clone(), &[]).expect("relay");

    let summary = relay.deliver_pending().await.expect("pass");
    assert!(!summary.all_delivered());
    let email = summary.topics.iter().find(|t| t.topic == "email").expect("email");
    let sms = summary.topics.iter().find(|t| t.topic == "sms").expect("sms");
    assert_eq!((email.state, email.delivered, email.sends), (TopicState::Stopped, 1, 2), "{email:?}");
    let head = email.head.as_ref().expect("the refused head");
    assert_eq!(head.seq, 2);
    assert!(head.last_error.as_deref().is_some_and(|e| e.contains("422") && e.contains("no such mailbox")), "{head:?}");
    assert_eq!((sms.state, sms.delivered), (TopicState::Idle, 2), "another topic is not held up: {sms:?}");
    // The message after the refused one never went out, and is still pending behind it.
    let email_seqs: Vec<u64> = sink.received().iter().filter(|r| r.topic == "email").map(|r| r.seq).collect();
    assert_eq!(email_seqs, [1, 2], "nothing past the refused message");
    let pending: Vec<u64> = ledger.outbox_pending("email", 10).await.expect("pending").iter().map(|m| m.seq).collect();
    assert_eq!(pending, [2, 3]);

    // The consumer is fixed; the next pass starts at the refused message, in order.
    sink.state().behaviour.refuse.clear();
    let summary = relay.deliver_pending().await.expect("pass");
    assert!(summary.all_delivered(), "{summary:?}");
    let received = sink.received();
    assert_eq!(first_seen(&received, "email"), keys_in_order(&ledger, "email").await);
    assert_never_reordered(&received, "email");
}

#[tokio::test]
async fn a_pass_gives_an_unreachable_endpoint_its_sends_and_leaves_the_topic_pending() {
    let ledger = Ledger::in_memory().expect("ledger");
    enqueue(&ledger, "a", &messages("email", 2)).await;
    let closed = closed_origin().await;
    let endpoint =
        Endpoint { attempts_per_pass: 3, ..endpoint(closed.trim_start_matches("http://").parse().expect("addr"), "x") };
    let relay = Relay::new(ledger.clone(), [("email".to_string(), endpoint)], &[]).expect("relay");
    let summary = relay.deliver_pending().await.expect("pass");
    let report = &summary.topics[0];
    assert_eq!((report.state, report.sends, report.delivered), (TopicState::Retrying, 3, 0), "{report:?}");
    assert_eq!(report.resent_in_doubt, 0, "a refused connection sent nothing");
    let head = report.head.as_ref().expect("head");
    assert_eq!((head.seq, head.attempts), (1, 3));
    assert!(head.last_error.as_deref().is_some_and(|e| e.contains("could not connect")), "{head:?}");
    assert_eq!(ledger.outbox_pending("email", 10).await.expect("pending").len(), 2, "nothing lost, nothing skipped");
}

#[tokio::test]
async fn a_relay_beside_a_hosts_calls_delivers_what_they_enqueue_and_stops_when_asked() {
    let (sink, addr) = Sink::start(Behaviour::default()).await;
    let dir = tempfile::tempdir().expect("dir");
    let policy = dir.path().join("oncebox.toml");
    let text = format!(
        "[tools.notify.grants]\noutbox = [\"email\"]\n\n[outbox.email]\nendpoint = \"http://{addr}/email\"\n\
         honours_keys = true\ninitial_backoff = \"1ms\"\nmax_backoff = \"10ms\"\n"
    );
    std::fs::write(&policy, text).expect("write policy");
    let file = oncebox::policy_file::PolicyFile::load(&policy).expect("policy");
    let host = oncebox::Host::builder(dir.path().join("ledger.redb")).policy_file(file).build().await.expect("host");
    host.load(oncebox_artifacts::NOTIFY).await.expect("load notify");
    let relay = host.outbox_relay().expect("relay");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move { relay.run(async move { stopped.await.unwrap_or(()) }).await });

    for order in ["o-1", "o-2", "o-3"] {
        let args = json!({"order_id": order, "email": "a@example.com", "template": "receipt"}).to_string();
        let outcome = host.call(Call::step("run", format!("notify-{order}"), "notify", args)).await.expect("call");
        assert!(outcome.is_completed(), "{outcome:?}");
    }
    // The relay was waiting, not polling: each enqueue woke it.
    eventually("the endpoint got the three messages", || sink.received().len() == 3).await;
    let _ = stop.send(());
    let summary = running.await.expect("the relay task").expect("the relay");
    assert_eq!(summary.delivered(), 3);
    let received = sink.received();
    assert_eq!(first_seen(&received, "email"), keys_in_order(host.ledger(), "email").await);
    let orders: Vec<String> = received
        .iter()
        .map(|r| serde_json::from_str::<serde_json::Value>(&r.body).expect("json")["order_id"].to_string())
        .collect();
    assert_eq!(orders, ["\"o-1\"", "\"o-2\"", "\"o-3\""]);
    assert!(host.ledger().outbox_pending("email", 10).await.expect("pending").is_empty());
}

/// Runs `oncebox outbox deliver` in a process: its child handle.
fn spawn_relay(ledger: &Path, policy: &Path, once: bool) -> std::process::Child {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_oncebox"));
    command.args(["outbox", "deliver", "--ledger"]).arg(ledger).arg("--policy").arg(policy);
    if once {
        command.arg("--once");
    }
    command.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().expect("spawn oncebox")
}

#[cfg(unix)]
#[tokio::test]
async fn a_relay_process_killed_mid_send_loses_nothing_reorders_nothing_and_resends_with_the_same_key() {
    const MESSAGES: usize = 6;
    let (sink, addr) = Sink::start(Behaviour { delay: Duration::from_millis(400), ..Behaviour::default() }).await;
    let dir = tempfile::tempdir().expect("dir");
    let (ledger_path, policy) = (dir.path().join("ledger.redb"), dir.path().join("oncebox.toml"));
    {
        let ledger = Ledger::open(&ledger_path).expect("ledger");
        enqueue(&ledger, "a", &messages("email", MESSAGES)).await;
        // Dropped here: the file is the relay process's from now on.
    }
    let text = format!(
        "# The endpoint honours no keys: after the kill it sees its latest message twice, with one key.\n\
         [outbox.email]\nendpoint = \"http://{addr}/email\"\ninitial_backoff = \"1ms\"\nmax_backoff = \"10ms\"\n"
    );
    std::fs::write(&policy, text).expect("write policy");

    // A relay that keeps running, killed while the endpoint holds its third send.
    let mut child = spawn_relay(&ledger_path, &policy, false);
    let ready = || {
        let state = sink.state();
        state.received.len() >= 3 && state.in_flight == 1
    };
    eventually("the relay's third send is in flight", ready).await;
    child.kill().expect("SIGKILL");
    let status = child.wait().expect("reaped");
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(9), "killed, not exited: {status:?}");
    let before_restart = sink.received().len();

    // Started again, with an endpoint that answers at once.
    sink.state().behaviour.delay = Duration::ZERO;
    let output = tokio::task::spawn_blocking(move || spawn_relay(&ledger_path, &policy, true).wait_with_output())
        .await
        .expect("join")
        .expect("the second relay");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "stdout: {stdout}\nstderr: {}", String::from_utf8_lossy(&output.stderr));
    let summary: serde_json::Value = serde_json::from_str(stdout.lines().next().unwrap_or("")).expect("summary JSON");
    assert_eq!(summary["all_delivered"], true, "{summary}");

    let received = sink.received();
    let keys = {
        let ledger = Ledger::open(dir.path().join("ledger.redb")).expect("reopen");
        assert!(
            ledger.outbox_pending("email", 100).await.expect("pending").is_empty(),
            "every message recorded delivered"
        );
        keys_in_order(&ledger, "email").await
    };
    // Nothing lost: every message reached the endpoint, under its own key, in order.
    let distinct: HashSet<&String> = received.iter().map(|r| &r.key).collect();
    assert_eq!(distinct.len(), MESSAGES, "{received:?}");
    assert_eq!(first_seen(&received, "email"), keys);
    assert_never_reordered(&received, "email");
    // The send the kill cut off was sent again, with the same key and the same payload.
    assert!(received.len() > MESSAGES, "the in-flight message was resent: {received:?}");
    let mut bodies: BTreeMap<&String, HashSet<&String>> = BTreeMap::new();
    for r in &received {
        bodies.entry(&r.key).or_default().insert(&r.body);
    }
    assert!(bodies.values().all(|b| b.len() == 1), "one key, one message: {bodies:?}");
    let cut_off = &received[before_restart - 1];
    assert_eq!(received[before_restart].key, cut_off.key, "the restart began with the message cut off");
}

#[tokio::test]
async fn outbox_list_shows_each_message_with_its_delivery_state() {
    let (_sink, addr) = Sink::start(Behaviour { refuse: vec![("email".into(), 2, 400)], ..Behaviour::default() }).await;
    let dir = tempfile::tempdir().expect("dir");
    let (ledger_path, policy) = (dir.path().join("ledger.redb"), dir.path().join("oncebox.toml"));
    {
        let ledger = Ledger::open(&ledger_path).expect("ledger");
        enqueue(&ledger, "a", &messages("email", 3)).await;
    }
    std::fs::write(&policy, format!("[outbox.email]\nendpoint = \"http://{addr}/email\"\n")).expect("policy");
    let ledger_arg = ledger_path.to_str().expect("utf8").to_string();
    let args = ["outbox", "deliver", "--once", "--ledger", &ledger_arg, "--policy", policy.to_str().expect("utf8")]
        .map(str::to_string);
    // In a thread of its own: the endpoint answers on this test's runtime meanwhile.
    let (code, summary, stderr) = tokio::task::spawn_blocking(move || {
        crate::support::oncebox(&args.iter().map(String::as_str).collect::<Vec<_>>())
    })
    .await
    .expect("join");
    assert_eq!(code, 1, "a stopped topic leaves work undone: {summary} {stderr}");
    assert_eq!(summary["topics"][0]["state"], "stopped", "{summary}");

    let output = std::process::Command::new(env!("CARGO_BIN_EXE_oncebox"))
        .args(["outbox", "list", "--ledger", &ledger_arg])
        .output()
        .expect("list");
    assert!(output.status.success());
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    let states: Vec<&str> = lines.iter().map(|l| l["state"].as_str().unwrap_or("?")).collect();
    assert_eq!(states, ["delivered", "refused", "pending"]);
    assert!(lines.iter().all(|l| l.get("payload").is_none()), "payloads only when asked");
    assert_eq!(lines[1]["delivery"]["attempts"], 1);

    // gc (a zero retention) removes the delivered message and says so; the refused and the
    // pending ones stay, whatever their age.
    std::thread::sleep(Duration::from_millis(5));
    let (code, gc, _) = crate::support::oncebox(&["ledger", "gc", "--ledger", &ledger_arg, "--older-than", "0s"]);
    assert_eq!(code, 0, "{gc}");
    assert_eq!((gc["removed_messages"].as_u64(), gc["removed_notices"].as_u64()), (Some(1), Some(0)), "{gc}");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_oncebox"))
        .args(["outbox", "list", "--ledger", &ledger_arg])
        .output()
        .expect("list");
    let states: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).expect("a JSON line")["state"].to_string())
        .collect();
    assert_eq!(states, ["\"refused\"", "\"pending\""]);
}

#[tokio::test]
async fn a_schema_3_ledger_is_migrated_and_its_outbox_messages_are_pending_in_order() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("ledger.redb");
    {
        // What schema 3 left: outbox messages without deliveries, and no pending index.
        let db = redb::Database::create(&path).expect("create");
        let txn = db.begin_write().expect("write");
        {
            let mut meta = txn.open_table(redb::TableDefinition::<&str, u64>::new("meta")).expect("meta");
            meta.insert("schema_version", 3).expect("insert");
            meta.insert("outbox_seq", 3).expect("insert");
            let mut outbox = txn.open_table(redb::TableDefinition::<u64, &[u8]>::new("outbox")).expect("outbox");
            for (seq, topic) in [(1, "email"), (2, "sms"), (3, "email")] {
                let message = json!({"seq": seq, "effect_key": format!("k{seq}"), "topic": topic,
                                     "payload": format!("m{seq}"), "enqueued_ms": 1});
                outbox.insert(seq, message.to_string().as_bytes()).expect("insert");
            }
        }
        txn.commit().expect("commit");
    }
    let ledger = Ledger::open(&path).expect("a schema 3 ledger opens");
    let pending = |topic: &'static str| {
        let ledger = ledger.clone();
        async move {
            ledger.outbox_pending(topic, 10).await.expect("pending").into_iter().map(|m| m.seq).collect::<Vec<_>>()
        }
    };
    assert_eq!(pending("email").await, [1, 3]);
    assert_eq!(pending("sms").await, [2]);
    ledger.mark_delivered(1, 5).await.expect("deliver");
    assert_eq!(pending("email").await, [3]);
    // New messages continue the old sequence.
    enqueue(&ledger, "new", &messages("email", 1)).await;
    assert_eq!(pending("email").await, [3, 4]);
}

/// Two servers' relays on one PostgreSQL ledger, both delivering one topic: the topic's lease
/// lets one send at a time, so every message arrives once and in order; the other takes over
/// when the first stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_relays_on_a_shared_ledger_never_send_a_topic_twice_or_out_of_order() {
    let (sink, addr) = Sink::start(Behaviour { delay: Duration::from_millis(15), ..Behaviour::default() }).await;
    let url = crate::pg::fresh_database().await;
    let (a, b) = (Ledger::connect(&url).await.expect("a"), Ledger::connect(&url).await.expect("b"));
    enqueue(&a, "first", &messages("email", 10)).await;
    let relay = |ledger: &Ledger| {
        Relay::new(ledger.clone(), [("email".to_string(), endpoint(addr, "email"))], &[]).expect("relay")
    };
    let (stop_a, stopped_a) = tokio::sync::oneshot::channel::<()>();
    let (stop_b, stopped_b) = tokio::sync::oneshot::channel::<()>();
    let (relay_a, relay_b) = (relay(&a), relay(&b));
    let running_a = tokio::spawn(async move { relay_a.run(async move { stopped_a.await.unwrap_or(()) }).await });
    let running_b = tokio::spawn(async move { relay_b.run(async move { stopped_b.await.unwrap_or(()) }).await });
    eventually("ten messages delivered", || sink.received().len() >= 10).await;

    // The relay that holds the topic stops; the other takes it over and delivers what comes next.
    let _ = stop_a.send(());
    let first = running_a.await.expect("task").expect("relay a");
    enqueue(&b, "second", &messages("email", 5)).await;
    eventually("fifteen messages delivered", || sink.received().len() >= 15).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _ = stop_b.send(());
    let second = running_b.await.expect("task").expect("relay b");

    let received = sink.received();
    assert!(sink.counts().values().all(|&n| n == 1), "a message was sent twice: {:?}", sink.counts());
    assert_eq!(received.len(), 15, "{received:?}");
    assert_eq!(first_seen(&received, "email"), keys_in_order(&a, "email").await, "in order");
    assert_never_reordered(&received, "email");
    assert_eq!(first.delivered() + second.delivered(), 15, "{first:?} {second:?}");
    assert!(a.outbox_pending("email", 10).await.expect("pending").is_empty());
}

/// A relay whose lease lapsed while it waited (a 429 with a long `Retry-After`) must not send the
/// messages it read before: another relay took the topic meanwhile and delivered them. Under the
/// lease it takes again, it reads the head again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_whose_lease_lapsed_while_it_waited_sends_nothing_another_delivered() {
    // The endpoint answers its first request 429, `Retry-After: 25` (longer than the lease), then 200.
    let seen: Arc<Mutex<Vec<u64>>> = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let served = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let seen = served.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                    let seen = seen.clone();
                    async move {
                        let seq = request.headers().get("oncebox-seq").and_then(|v| v.to_str().ok());
                        let seq: u64 = seq.and_then(|s| s.parse().ok()).unwrap_or(0);
                        let first = {
                            let mut seen = seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                            seen.push(seq);
                            seen.len() == 1
                        };
                        let mut response = Response::new(Full::new(Bytes::from_static(b"{}")));
                        if first {
                            *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                            response.headers_mut().insert("retry-after", hyper::header::HeaderValue::from_static("25"));
                        }
                        Ok::<_, std::convert::Infallible>(response)
                    }
                });
                let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    let url = crate::pg::fresh_database().await;
    let (a, b) = (Ledger::connect(&url).await.expect("a"), Ledger::connect(&url).await.expect("b"));
    enqueue(&a, "first", &messages("email", 3)).await;
    // A 100 ms timeout makes the topic's lease 10.2 s, shorter than the 25 s the endpoint asks for.
    let endpoint = Endpoint {
        timeout: Duration::from_millis(100),
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_secs(30),
        attempts_per_pass: 10,
        ..Endpoint::new(format!("http://{addr}/email").parse().expect("url"))
    };
    let relay =
        |ledger: &Ledger| Relay::new(ledger.clone(), [("email".to_string(), endpoint.clone())], &[]).expect("relay");
    let (stop_a, stopped_a) = tokio::sync::oneshot::channel::<()>();
    let (stop_b, stopped_b) = tokio::sync::oneshot::channel::<()>();
    let (relay_a, relay_b) = (relay(&a), relay(&b));
    let running_a = tokio::spawn(async move { relay_a.run(async move { stopped_a.await.unwrap_or(()) }).await });
    let running_b = tokio::spawn(async move { relay_b.run(async move { stopped_b.await.unwrap_or(()) }).await });
    // Past the 25 s: the relay that was told to wait has woken and looked again.
    tokio::time::sleep(Duration::from_secs(28)).await;
    let _ = (stop_a.send(()), stop_b.send(()));
    let _ = (running_a.await, running_b.await);
    let seen = seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
    assert_eq!(seen, [1, 1, 2, 3], "the 429, then each message once, in order");
    assert!(a.outbox_pending("email", 10).await.expect("pending").is_empty());
}
