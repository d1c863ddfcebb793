//! Restate: the server (`@restatedev/restate-server`, a native binary from npm) in a network
//! namespace of its own with no route to the internet (it calls out at every start), and the
//! service (`bench/peers/restate/service.mjs`, the TypeScript SDK from npm, on Node.js) beside the
//! bench. A veth pair joins the two: the server at `NS_ADDR`, the service and the bench's client at
//! `HOST_ADDR`, a /30 with no default route, so the server reaches the service and nothing else.
//! The service reaches the provider on the bench's loopback, as oncebox and DBOS do.

use std::fs::File;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Value, json};

use super::{Measured, Workload, drive, execute, installed_from, mark_installed, patiently, sources, version_of};

/// The namespace, the veth pair's two ends and their addresses.
const NS: &str = "oncebox-bench";
const HOST_IF: &str = "obench0";
const NS_IF: &str = "obench1";
const HOST_ADDR: &str = "10.231.7.1";
const NS_ADDR: &str = "10.231.7.2";

/// The npm project, installed: the server's binary, and what the service runs on.
pub struct Installed {
    dir: PathBuf,
    server: PathBuf,
    node: String,
}

/// `npm ci` of the pinned project into `peers/restate` (once per lock file), and the service.
pub fn install(peers: &Path) -> anyhow::Result<Installed> {
    let node = version_of("node", "--version")?;
    version_of("npm", "--version")?;
    let source = sources().join("restate");
    let dir = peers.join("restate");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut pins = String::new();
    for file in ["package.json", "package-lock.json", "service.mjs"] {
        std::fs::copy(source.join(file), dir.join(file)).with_context(|| format!("copying {file}"))?;
    }
    for file in ["package.json", "package-lock.json"] {
        pins += &std::fs::read_to_string(source.join(file)).with_context(|| format!("reading {file}"))?;
    }
    if !installed_from(&dir, &pins) {
        eprintln!("installing Restate from npm into {} (once)...", dir.display());
        // No install scripts: the server's package would run an analytics ping (`@scarf/scarf`).
        execute(
            Command::new("npm")
                .args(["ci", "--ignore-scripts", "--no-audit", "--no-fund"])
                .env("SCARF_ANALYTICS", "false")
                .current_dir(&dir),
        )?;
        mark_installed(&dir, &pins)?;
    }
    let arch = match std::env::consts::ARCH {
        "x86_64" => "x64",
        "aarch64" => "arm64",
        other => bail!("no restate-server binary on npm for {other}"),
    };
    let server =
        dir.join(format!("node_modules/@restatedev/restate-server-{}-{arch}/bin/restate-server", std::env::consts::OS));
    anyhow::ensure!(server.is_file(), "npm installed no {}", server.display());
    Ok(Installed { dir, server, node })
}

/// The server and the service, running; dropping it stops both and removes the namespace.
pub struct Server {
    server: Option<Child>,
    service: Option<Child>,
    client: reqwest::Client,
    version: String,
    sdk: String,
    node: String,
}

impl Server {
    /// Sets up the namespace (removing a previous run's first), starts the service and the server
    /// with a fresh data directory in `dir`, and registers the service with the admin API.
    pub async fn start(installed: &Installed, dir: &Path, provider: &str) -> anyhow::Result<Server> {
        version_of("ip", "-V").context("the `ip` command (iproute2) is needed for the network namespace")?;
        let version = version_of(&installed.server.display().to_string(), "--version")?;
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(30))
            .build()
            .context("building the HTTP client")?;
        remove_namespace();
        let mut started =
            Server { server: None, service: None, client, version, sdk: String::new(), node: installed.node.clone() };
        make_namespace().context("setting up the network namespace (this needs root)")?;

        let log = |name: &str| File::create(dir.join(name)).with_context(|| format!("creating {name}"));
        let mut service = Command::new("node")
            .arg("service.mjs")
            .args([HOST_ADDR, "0", provider])
            .current_dir(&installed.dir)
            .env("RESTATE_LOGGING", "WARN")
            // Held open by the `Child` until it is dropped: the service exits when it closes.
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log("restate-service.log")?)
            .spawn()
            .context("starting the Restate service (node service.mjs)")?;
        let stdout = service.stdout.take();
        started.service = Some(service);
        let port = first_line(stdout).await.context("the Restate service did not say its port")?;
        let port: u16 = port.trim().parse().with_context(|| format!("the Restate service printed {port:?}"))?;

        let server_log = log("restate-server.log")?;
        let server = Command::new("ip")
            .args(["netns", "exec", NS])
            .arg(&installed.server)
            .arg("--base-dir")
            .arg(super::absolute(&dir.join("restate-data"))?)
            .args(["--node-name", "bench", "--listen-mode", "tcp", "--no-logo"])
            .env("RESTATE_LOG_DISABLE_ANSI_CODES", "true")
            .stdin(Stdio::null())
            .stdout(server_log.try_clone().context("the server's log")?)
            .stderr(server_log)
            .spawn()
            .context("starting restate-server in the network namespace")?;
        started.server = Some(server);

        let admin = format!("http://{NS_ADDR}:9070");
        let health = format!("{admin}/health");
        patiently(Duration::from_secs(60), Duration::from_millis(100), || started.ok(&health))
            .await
            .context("restate-server's admin API did not come up (see restate-server.log)")?;
        let deployments = format!("{admin}/deployments");
        let body = json!({"uri": format!("http://{HOST_ADDR}:{port}")}).to_string();
        let registered = patiently(Duration::from_secs(30), Duration::from_millis(200), || async {
            let response = started
                .client
                .post(&deployments)
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await?;
            let status = response.status();
            let text = response.bytes().await?;
            anyhow::ensure!(status.is_success(), "{status}: {}", String::from_utf8_lossy(&text));
            Ok(serde_json::from_slice::<Value>(&text)?)
        })
        .await
        .context("registering the service with restate-server")?;
        started.sdk = registered["sdk_version"].as_str().unwrap_or("an unnamed SDK").to_string();
        Ok(started)
    }

    async fn ok(&self, url: &str) -> anyhow::Result<()> {
        let response = self.client.get(url).send().await?;
        anyhow::ensure!(response.status().is_success(), "{url}: {}", response.status());
        Ok(())
    }

    pub fn version(&self) -> String {
        format!("{}, {}, Node.js {}", self.version, self.sdk, self.node)
    }

    pub fn settings(&self) -> String {
        "restate-server's defaults (one node, 24 partitions, replication 1, the replicated loglet on the node's own \
         log-server with the RocksDB WAL fsynced: `rocksdb-disable-wal-fsync = false`), but a fresh `--base-dir` in \
         the bench's directory and `--listen-mode tcp`; in a network namespace without a route out, joined to the \
         bench by a veth pair; the service over HTTP/2 cleartext; the client sends the step's id as \
         `idempotency-key`"
            .into()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        for child in [self.server.take(), self.service.take()].into_iter().flatten() {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
        }
        remove_namespace();
    }
}

/// The workload, each step a request to the ingress: `POST /Bench/charge` with the order, the
/// step's id as Restate's `idempotency-key` (a resent request is the same invocation), answered
/// once the step's result is in Restate's log.
pub async fn measure(server: &Server, w: &Workload, prefix: &str) -> anyhow::Result<Measured> {
    let client = server.client.clone();
    drive(w, prefix, move |order| {
        let client = client.clone();
        async move {
            let body = crate::host_runs::order(&order);
            let response = client
                .post(format!("http://{NS_ADDR}:8080/Bench/charge"))
                .header("content-type", "application/json")
                .header("idempotency-key", &order)
                .body(body.to_string())
                .send()
                .await
                .with_context(|| format!("Restate, step {order}"))?;
            let status = response.status();
            let text = response.bytes().await?;
            anyhow::ensure!(
                status.is_success(),
                "Restate answered {status} to step {order}: {}",
                String::from_utf8_lossy(&text)
            );
            let payment: Value =
                serde_json::from_slice(&text).with_context(|| format!("Restate's answer to {order}"))?;
            anyhow::ensure!(payment["order_id"] == order.as_str(), "Restate answered step {order} with {payment}");
            Ok(())
        }
    })
    .await
}

/// The first line the process writes on `stdout`, within 30 s.
async fn first_line(stdout: Option<std::process::ChildStdout>) -> anyhow::Result<String> {
    let stdout = stdout.context("no stdout")?;
    let read = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        std::io::BufReader::new(stdout).read_line(&mut line).map(|_| line)
    });
    let line = tokio::time::timeout(Duration::from_secs(30), read).await.context("nothing within 30 s")???;
    anyhow::ensure!(!line.is_empty(), "it exited first");
    Ok(line)
}

/// The namespace with its loopback up, and the veth pair across, with no default route inside.
fn make_namespace() -> anyhow::Result<()> {
    let ns_addr = format!("{NS_ADDR}/30");
    let host_addr = format!("{HOST_ADDR}/30");
    let steps: [&[&str]; 8] = [
        &["netns", "add", NS],
        &["-n", NS, "link", "set", "lo", "up"],
        &["link", "add", HOST_IF, "type", "veth", "peer", "name", NS_IF],
        &["link", "set", NS_IF, "netns", NS],
        &["addr", "add", &host_addr, "dev", HOST_IF],
        &["link", "set", HOST_IF, "up"],
        &["-n", NS, "addr", "add", &ns_addr, "dev", NS_IF],
        &["-n", NS, "link", "set", NS_IF, "up"],
    ];
    for args in steps {
        if let Err(e) = execute(Command::new("ip").args(args)) {
            remove_namespace();
            return Err(e);
        }
    }
    Ok(())
}

/// Removes the namespace and the veth pair, stopping what a previous run left running inside.
fn remove_namespace() {
    if let Ok(out) = Command::new("ip").args(["netns", "pids", NS]).output() {
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let _ = Command::new("kill").args(["-KILL", pid]).status();
        }
    }
    for args in [["netns", "del", NS], ["link", "del", HOST_IF]] {
        let _ = Command::new("ip").args(args).stderr(Stdio::null()).status();
    }
}
