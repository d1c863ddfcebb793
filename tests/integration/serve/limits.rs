//! What a connection, an MCP session and a log line may hold: slow and idle connections under a
//! lowered open-file limit, a cap on connections and on MCP sessions, sessions let go when they
//! close, and debug logs that carry no tool argument. Real sockets, real MCP sessions over the
//! streamable HTTP transport, the server's own log file.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::support::{Server, Setup, client};

/// The server's resident memory, in KiB (Linux).
fn resident_kib(server: &Server) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.pid())).expect("/proc/PID/status");
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS");
    line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).expect("a number")
}

/// A connection that sent half a request head and nothing more.
fn slow_connection(server: &Server) -> TcpStream {
    let addr = server.base_url.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.write_all(format!("GET /healthz HTTP/1.1\r\nhost: {addr}\r\nx-slow: ").as_bytes()).expect("write");
    stream
}

async fn healthz_within(server: &Server, within: Duration) -> Result<u16, String> {
    let http = reqwest::Client::builder().timeout(within).build().expect("client");
    match http.get(server.url("/healthz")).send().await {
        Ok(response) => Ok(response.status().as_u16()),
        Err(e) => Err(e.to_string()),
    }
}

/// Raises this process's soft open-file limit to its hard one (the 1,000 sockets below are this
/// process's too, beside the other tests'), and says when the hard one is too low for the test.
fn room_for_sockets() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let hard = limit.maximum.unwrap_or(u64::MAX);
    assert!(hard >= 4096, "this test needs a hard open-file limit of 4096 or more (`ulimit -Hn`), not {hard}");
    let _ = setrlimit(Resource::Nofile, Rlimit { current: limit.maximum, maximum: limit.maximum });
}

#[tokio::test(flavor = "multi_thread")]
async fn a_thousand_slow_connections_leave_the_server_answering_and_are_dropped_in_time() {
    room_for_sockets();
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let setup = Setup::new(&provider);
    // systemd's default soft limit, with room to raise it to the hard one; a short header timeout
    // so the test need not wait the default's 30 s.
    let timeout = Duration::from_secs(5);
    let server = setup.serve_as(&["--header-timeout", "5s"], "info", &["prlimit", "--nofile=1024:4096", "--"]);
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", server.pid())).expect("limits");
    let files = limits.lines().find(|l| l.starts_with("Max open files")).expect("Max open files").to_string();
    assert_eq!(files.split_whitespace().nth(3), Some("4096"), "the soft limit was raised to the hard one: {files}");

    let slow: Vec<TcpStream> = (0..1000).map(|_| slow_connection(&server)).collect();
    let started = Instant::now();
    let answered = healthz_within(&server, Duration::from_secs(5)).await;
    assert_eq!(answered, Ok(200), "/healthz under 1,000 slow connections\n{}", server.log());
    assert!(started.elapsed() < Duration::from_secs(5));

    // Past the header timeout, the server has closed every one of them.
    tokio::time::sleep(timeout + Duration::from_secs(3)).await;
    let closed = tokio::task::spawn_blocking(move || {
        slow.into_iter()
            .filter(|mut stream| {
                stream.set_read_timeout(Some(Duration::from_millis(200))).expect("timeout");
                let mut rest = Vec::new();
                // Closed: the read ends (an answer, then EOF, or a reset), rather than timing out.
                match stream.read_to_end(&mut rest) {
                    Ok(_) => true,
                    Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
                }
            })
            .count()
    })
    .await
    .expect("reader");
    assert_eq!(closed, 1000, "every slow connection is dropped after the header timeout");
}

/// Sends a request head declaring a body of `declared` bytes and only the first ten of them,
/// and reads what the server answers within two seconds (the body timeout is 30 s): the head of
/// its answer, lowercased, or `None` if it waited for the rest of the body.
fn head_then_silence(server: &Server, head: &str, declared: usize) -> Option<String> {
    let addr = server.base_url.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).expect("connect");
    let request = format!("{head}content-length: {declared}\r\nconnection: close\r\n\r\n{{\"run_id\":");
    stream.write_all(request.as_bytes()).expect("write");
    stream.set_read_timeout(Some(Duration::from_secs(2))).expect("timeout");
    let mut answer = [0u8; 1024];
    let n = stream.read(&mut answer).ok()?;
    let answer = String::from_utf8_lossy(&answer[..n]).to_ascii_lowercase();
    answer.split("\r\n\r\n").next().map(str::to_string)
}

/// Behind a proxy (`--public-url`), a stranger's body is refused before a byte of it is read,
/// on every route, so that strangers cannot make the server hold `--max-body` each for the body
/// timeout (the console's sign-in is a header, so no route takes a stranger's body).
#[tokio::test(flavor = "multi_thread")]
async fn behind_a_public_url_a_stranger_s_body_is_refused_before_it_is_read() {
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let setup = Setup::new(&provider);
    let server = setup.serve_with(&["--public-url", "https://ops.example"]);
    let host = "host: ops.example\r\n";
    // The console's routes also ask a browser for its sign-in again (its credentials may be stale).
    for (route, kind, console) in [
        ("/v1/calls", "application/json", false),
        ("/v1/runs/r/reconcile", "application/json", false),
        ("/approvals/k/approve", "application/x-www-form-urlencoded", true),
        ("/runs/r/reconcile", "application/x-www-form-urlencoded", true),
        // MCP's own token check refused this before the guard did; kept so the two agree.
        ("/mcp", "application/json", false),
        ("/login", "application/x-www-form-urlencoded", true),
    ] {
        let head = format!("POST {route} HTTP/1.1\r\n{host}content-type: {kind}\r\n");
        let answer = head_then_silence(&server, &head, 1_000_000);
        let answer = answer.unwrap_or_else(|| panic!("POST {route}: the server waited for the body"));
        assert!(answer.starts_with("http/1.1 401 "), "POST {route}: {answer}");
        assert_eq!(answer.contains("\r\nwww-authenticate: basic"), console, "POST {route}: {answer}");
    }
    // With the token, the same head is the operator's: the server waits for the body.
    let head = format!(
        "POST /v1/calls HTTP/1.1\r\n{host}content-type: application/json\r\nauthorization: Bearer {}\r\n",
        super::support::TOKEN
    );
    assert_eq!(head_then_silence(&server, &head, 1_000_000), None, "the operator's body is read");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_connection_beyond_the_cap_is_answered_503_and_the_next_one_is_served_once_a_slot_frees() {
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let setup = Setup::new(&provider);
    let server = setup.serve_with(&["--max-connections", "20"]);
    let idle: Vec<TcpStream> = (0..20).map(|_| slow_connection(&server)).collect();
    // The listener takes them in its own time: wait until the cap is reached.
    let deadline = Instant::now() + Duration::from_secs(10);
    let refused = loop {
        let response = client().get(server.url("/healthz")).send().await.expect("an answer, not a hang");
        if response.status() == 503 {
            break response.text().await.expect("body");
        }
        assert!(Instant::now() < deadline, "the 21st connection was never refused");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(refused.contains("--max-connections") && refused.contains("\"busy\""), "{refused}");
    drop(idle);
    let deadline = Instant::now() + Duration::from_secs(5);
    while healthz_within(&server, Duration::from_secs(2)).await != Ok(200) {
        assert!(Instant::now() < deadline, "a slot freed when the idle connections closed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One MCP session over the streamable HTTP transport, as a client SDK drives it.
struct Session<'a> {
    server: &'a Server,
    id: String,
    http: reqwest::Client,
}

/// The JSON-RPC message of an answer: the body itself, or the `data:` of its SSE event.
fn message_of(body: &str) -> Value {
    let json = body.lines().filter_map(|l| l.strip_prefix("data:")).map(str::trim).find(|d| d.starts_with('{'));
    serde_json::from_str(json.unwrap_or(body)).unwrap_or_else(|e| panic!("{body:?}: {e}"))
}

impl<'a> Session<'a> {
    /// `initialize` and `notifications/initialized`; `Err(status, body)` when refused.
    async fn open(server: &'a Server, http: &reqwest::Client) -> Result<Session<'a>, (u16, String)> {
        let init = json!({
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": { "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": { "name": "limits", "version": "1" } }
        });
        let response = Self::post(http, server, None, &init).await;
        let status = response.status().as_u16();
        let id = response.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(String::from);
        let body = response.text().await.expect("body");
        let Some(id) = id.filter(|_| status == 200) else {
            return Err((status, body));
        };
        let session = Session { server, id, http: http.clone() };
        let initialized = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
        let answer = Self::post(http, server, Some(&session.id), &initialized).await;
        assert_eq!(answer.status(), 202, "notifications/initialized");
        Ok(session)
    }

    async fn post(http: &reqwest::Client, server: &Server, id: Option<&str>, message: &Value) -> reqwest::Response {
        let mut request = http
            .post(server.url("/mcp"))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if let Some(id) = id {
            request = request.header("mcp-session-id", id).header("mcp-protocol-version", "2025-06-18");
        }
        request.body(message.to_string()).send().await.expect("post /mcp")
    }

    async fn request(&self, id: u64, method: &str, params: Value) -> Value {
        let message = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        let response = Self::post(&self.http, self.server, Some(&self.id), &message).await;
        message_of(&response.text().await.expect("body"))
    }

    async fn close(self) {
        let response =
            self.http.delete(self.server.url("/mcp")).header("mcp-session-id", &self.id).send().await.expect("delete");
        assert!(response.status().is_success(), "DELETE /mcp: {}", response.status());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn mcp_sessions_are_capped_and_let_go_when_they_close() {
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let setup = Setup::new(&provider);
    let server = setup.serve_with(&["--max-mcp-sessions", "5"]);
    let http = client();
    let mut open = Vec::new();
    for _ in 0..5 {
        open.push(Session::open(&server, &http).await.expect("within the cap"));
    }
    let (status, body) = Session::open(&server, &http).await.err().expect("the sixth is refused");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("--max-mcp-sessions"), "{body}");
    // An open session is still served, and a closed one makes room.
    let tools = open[0].request(2, "tools/list", json!({})).await;
    assert!(tools["result"]["tools"].as_array().is_some_and(|t| !t.is_empty()), "{tools}");
    open.pop().expect("one").close().await;
    let deadline = Instant::now() + Duration::from_secs(5);
    let again = loop {
        match Session::open(&server, &http).await {
            Ok(session) => break session,
            Err(refused) => {
                assert!(Instant::now() < deadline, "a closed session made no room: {refused:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    again.close().await;
    for session in open {
        session.close().await;
    }

    // Sessions opened and closed one after another: the server's memory stays flat (each used
    // to stay listed for notifications until the tool listing changed, ~12.5 KiB apiece).
    for _ in 0..300 {
        Session::open(&server, &http).await.expect("open").close().await;
    }
    let before = resident_kib(&server);
    for _ in 0..3000 {
        Session::open(&server, &http).await.expect("open").close().await;
    }
    let grown = resident_kib(&server).saturating_sub(before);
    eprintln!("3,000 sessions opened and closed: resident memory grew {grown} KiB");
    assert!(grown < 12 * 1024, "3,000 closed sessions grew the server by {grown} KiB");
}

#[tokio::test(flavor = "multi_thread")]
async fn debug_logs_carry_no_tool_argument() {
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let setup = Setup::new(&provider);
    let server = setup.serve_as(&[], "debug", &[]);
    let http = client();
    let session = Session::open(&server, &http).await.expect("session");
    let address = "221B Baker Street, sealed";
    let call = session
        .request(
            2,
            "tools/call",
            json!({
                "name": "fulfill",
                "arguments": { "order_id": "o-log", "address": address, "items": [{ "sku": "sku-1", "quantity": 1 }] },
                "_meta": { "oncebox/run-id": "r-log", "oncebox/step-id": "ship" },
            }),
        )
        .await;
    assert_eq!(call["result"]["_meta"]["oncebox/status"], "awaiting-approval", "{call}");
    session.close().await;
    let log = server.log();
    assert!(log.contains("DEBUG"), "the server logged at debug:\n{log}");
    assert!(!log.contains("221B Baker"), "a tool argument in the log:\n{log}");
}
