//! `--only serve_start`: how long `oncebox serve` takes to be ready with ten Python tools in its
//! directory, cold (an empty compile cache: every component compiled, in parallel) and warm (the
//! cache the cold start wrote). A start is a whole `oncebox serve` process, timed from its spawn
//! to the line that says where it listens (it answers `/healthz` from then on, `starting` while
//! it compiles) and to `/healthz` answering `ok` with all ten tools loaded.
//!
//! The ten tools are the example `stock-py` under ten names (`stock-py-0` ...), each built by the
//! Python SDK's one command (`oncebox-guest-langs`); the server is the `oncebox` binary beside
//! this bench's (`cargo build --release -p oncebox`), or `$ONCEBOX_BIN`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use oncebox_guest_langs::Lang;
use serde::Serialize;

/// How many tools the server starts with.
pub const TOOLS: usize = 10;
/// How long a start may take before the measure gives up (a cold start on a loaded 2-core
/// machine compiles ~190 s of CPU).
const PATIENCE: Duration = Duration::from_secs(900);

#[derive(Debug, Serialize)]
pub struct Start {
    pub cache: &'static str,
    /// From the spawn to the line naming the address: the server answers from here on.
    pub listening_ms: f64,
    /// From the spawn to `/healthz` answering `ok` with every tool loaded.
    pub ready_ms: f64,
}

/// `cold` cold starts, each followed by `warm` warm ones from the cache it wrote.
pub async fn measure(dir: &Path, cold: usize, warm: usize) -> anyhow::Result<Vec<Start>> {
    let server = server_binary()?;
    let tools = dir.join("serve-start-tools");
    build_tools(dir, &tools)?;
    let client = reqwest::Client::new();
    let mut starts = Vec::new();
    for i in 0..cold.max(1) {
        let cache = dir.join(format!("serve-start-cache-{i}"));
        let _ = std::fs::remove_dir_all(&cache);
        starts.push(start(&server, &tools, &cache, &dir.join(format!("cold-{i}.redb")), "cold", &client).await?);
        for j in 0..warm {
            let ledger = dir.join(format!("warm-{i}-{j}.redb"));
            starts.push(start(&server, &tools, &cache, &ledger, "warm", &client).await?);
        }
    }
    Ok(starts)
}

/// The `oncebox` binary: `$ONCEBOX_BIN`, or the one beside this bench's.
pub fn server_binary() -> anyhow::Result<PathBuf> {
    if let Some(bin) = std::env::var_os("ONCEBOX_BIN").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(bin));
    }
    let bench = std::env::current_exe().context("the bench's own path")?;
    let beside = bench.with_file_name("oncebox");
    if !beside.exists() {
        bail!(
            "no oncebox binary at {}: build it in the same profile (cargo build --release -p oncebox) or set ONCEBOX_BIN",
            beside.display()
        );
    }
    Ok(beside)
}

/// Ten copies of `example-tools/python/stock` named `stock-py-N`, built and put in `tools`.
fn build_tools(dir: &Path, tools: &Path) -> anyhow::Result<()> {
    let source = oncebox_guest_langs::root().join("example-tools/python/stock");
    let app = std::fs::read_to_string(source.join("app.py")).context("read stock-py's app.py")?;
    anyhow::ensure!(app.contains("name = \"stock-py\""), "stock-py's app.py no longer names its tool `stock-py`");
    let _ = std::fs::remove_dir_all(tools);
    std::fs::create_dir_all(tools)?;
    let work = dir.parent().unwrap_or(dir).join("guest-langs");
    for n in 0..TOOLS {
        let project = dir.join(format!("serve-start-src/stock-py-{n}"));
        std::fs::create_dir_all(&project)?;
        for file in ["pyproject.toml", "README.md"] {
            std::fs::copy(source.join(file), project.join(file)).with_context(|| format!("copy {file}"))?;
        }
        std::fs::write(
            project.join("app.py"),
            app.replace("name = \"stock-py\"", &format!("name = \"stock-py-{n}\"")),
        )?;
        eprintln!("building stock-py-{n}...");
        let project = project.to_str().context("a UTF-8 path")?;
        let built = oncebox_guest_langs::build(Lang::Python, project, &work)?;
        std::fs::copy(&built, tools.join(format!("stock-py-{n}.wasm")))?;
    }
    Ok(())
}

/// An `oncebox serve` started on loopback with `tools` and `ledger`, `env` added to its
/// environment: the process (stopped when dropped) and its base URL, once it said where it listens.
pub fn spawn(server: &Path, tools: &Path, ledger: &Path, env: &[(&str, &str)]) -> anyhow::Result<(Stopped, String)> {
    let mut command = Command::new(server);
    command.args(["serve", "--listen", "127.0.0.1:0", "--tools"]).arg(tools).arg("--ledger").arg(ledger);
    for (name, value) in env {
        command.env(name, value);
    }
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("start {}", server.display()))?;
    let mut child = Stopped(child);
    let stdout = child.0.stdout.take().context("the server's stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let said: serde_json::Value = serde_json::from_str(&line).with_context(|| format!("the server said {line:?}"))?;
    let base = said["listening"].as_str().with_context(|| format!("no address in {line:?}"))?.to_string();
    Ok((child, base))
}

/// One server start, timed; the server is stopped after it.
async fn start(
    server: &Path,
    tools: &Path,
    cache: &Path,
    ledger: &Path,
    kind: &'static str,
    client: &reqwest::Client,
) -> anyhow::Result<Start> {
    let _ = std::fs::remove_file(ledger);
    let began = Instant::now();
    let (server, tools, ledger, cache) = (server.to_owned(), tools.to_owned(), ledger.to_owned(), cache.to_owned());
    let (_child, base) = tokio::task::spawn_blocking(move || {
        let cache = cache.to_str().context("a UTF-8 path")?.to_string();
        spawn(&server, &tools, &ledger, &[("ONCEBOX_CACHE", &cache)])
    })
    .await??;
    let listening_ms = began.elapsed().as_secs_f64() * 1e3;
    loop {
        if began.elapsed() > PATIENCE {
            bail!("{kind} start: not ready after {PATIENCE:?}");
        }
        // Loopback: the details (tools loaded, still compiling) without a token.
        if let Ok(answer) = client.get(format!("{base}/healthz")).send().await {
            let ready = answer.status().is_success();
            let body = answer.bytes().await.unwrap_or_default();
            let health: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            if ready {
                anyhow::ensure!(
                    health["tools"] == TOOLS && health["load_errors"].as_array().is_none_or(Vec::is_empty),
                    "{kind} start: ready with {health}"
                );
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ready_ms = began.elapsed().as_secs_f64() * 1e3;
    Ok(Start { cache: kind, listening_ms, ready_ms })
}

/// The server process, killed when the measure is done with it (or fails).
pub struct Stopped(pub Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn print(starts: &[Start]) {
    println!("| oncebox serve, {TOOLS} Python tools | listening ms | ready ms |");
    println!("|---|---:|---:|");
    for s in starts {
        println!("| {} | {:.0} | {:.0} |", s.cache, s.listening_ms, s.ready_ms);
    }
}
