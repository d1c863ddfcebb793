//! `--only growth`: how the costs that should follow open work grow with history. The same figures
//! on two redb ledgers that differ only in how many completed operations they hold (the open work
//! is the same: a few unknown operations and pending requests for approval; one completed step in
//! ten ran under an approval, whose request stays as long as its operation), and their ratio: the
//! goal is at most 1.2 each.
//!
//! The ledgers are filled directly through the ledger's API (a claim and a finished attempt per
//! operation, many at once so that the group commit batches them), not through tool calls: a
//! million calls through the API would take hours. The figures are the ledger's side of what a
//! server does: what `/metrics` and the background reconciler read (the open runs), the
//! console's unknowns and first page of runs, opening the file (`serve`'s startup before it
//! listens), a whole-ledger `recover`, `gc` with nothing expired, a fresh operation's commit and a
//! replay's lookup, and the file's bytes per operation. Then the same ledger served: an
//! `oncebox serve` process (the binary beside the bench's) on it, with no tools, timed from its
//! spawn to `/healthz` answering `ok`, its CPU while idle (from `/proc`, over `idle`), its resident
//! memory after that, and the medians of `GET /metrics`, the console's first page and its
//! unknowns page.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;

use oncebox::ReplayClass;
use oncebox::ledger::{
    ApprovalRecord, ApprovalState, AttemptRecord, AttemptSource, Claim, ClaimRequest, Ledger, OperationStatus, Why,
};

use crate::stats::Latency;

/// Operations each side keeps open: the same at every size.
const UNKNOWN: usize = 10;
const PENDING: usize = 5;
/// One completed step in this many was approved first: history holds requests too.
const APPROVED_EVERY: usize = 10;
/// Operations filled at once (the writer batches up to 512 per commit).
const AT_ONCE: usize = 512;

/// The figures of one ledger.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Figures {
    pub completed: usize,
    pub fill_s: f64,
    pub startup_ms: f64,
    pub open_runs_us: f64,
    pub unknowns_us: f64,
    pub first_page_us: f64,
    pub recover_ms: f64,
    pub gc_ms: f64,
    pub fresh_us: f64,
    pub replay_us: f64,
    pub bytes_per_operation: f64,
    pub served: Served,
}

/// The figures of `oncebox serve` on one ledger.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Served {
    pub ready_ms: f64,
    pub idle_cpu_percent: f64,
    pub rss_mb: f64,
    pub metrics_ms: f64,
    pub console_ms: f64,
    pub unknowns_ms: f64,
}

/// The operator's token the served measure gives the server (and sends with each request).
const TOKEN: &str = "growth-bench-operator-token";

/// `oncebox serve` on the ledger at `path` (no other process may have it open).
async fn served(dir: &Path, path: &Path, n: usize, idle: Duration) -> anyhow::Result<Served> {
    let server = crate::serve_start::server_binary()?;
    let tools = dir.join("growth-no-tools");
    std::fs::create_dir_all(&tools)?;
    let began = Instant::now();
    let (child, base) = {
        let (server, tools, path) = (server.clone(), tools.clone(), path.to_owned());
        tokio::task::spawn_blocking(move || {
            crate::serve_start::spawn(&server, &tools, &path, &[("ONCEBOX_TOKEN", TOKEN), ("ONCEBOX_CACHE", "off")])
        })
        .await??
    };
    let client = reqwest::Client::new();
    let get = |route: &str| client.get(format!("{base}{route}")).bearer_auth(TOKEN).send();
    loop {
        anyhow::ensure!(began.elapsed() < Duration::from_secs(3600), "serve not ready after an hour");
        if get("/healthz").await.is_ok_and(|answer| answer.status().is_success()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let ready_ms = began.elapsed().as_secs_f64() * 1e3;
    let pid = child.0.id();
    // Idle: nothing asked of it for `idle`; what its background work (the reconciler's reading of
    // open work, the relay, the watch of the tools directory) costs.
    let (ticks_before, at) = (cpu_ticks(pid)?, Instant::now());
    tokio::time::sleep(idle).await;
    let idle_cpu_percent = (cpu_ticks(pid)? - ticks_before) as f64 / TICKS_PER_S / at.elapsed().as_secs_f64() * 100.0;
    let rss_mb = rss_kb(pid)? as f64 / 1024.0;
    let page = |route: &'static str, must: &'static str| {
        let get = &get;
        async move {
            let answer = get(route).await?;
            anyhow::ensure!(answer.status().is_success(), "{route}: {}", answer.status());
            let body = answer.text().await?;
            anyhow::ensure!(body.contains(must), "{route}: no {must:?} in the page");
            Ok(())
        }
    };
    let metrics_ms = median(n, |_| page("/metrics", "oncebox_")).await? / 1e3;
    let console_ms = median(n, |_| page("/", "open-0")).await? / 1e3;
    let unknowns_ms = median(n, |_| page("/unknowns", "open-9")).await? / 1e3;
    drop(child);
    Ok(Served { ready_ms, idle_cpu_percent, rss_mb, metrics_ms, console_ms, unknowns_ms })
}

/// Linux's clock ticks per second in `/proc` (`USER_HZ`, 100 on every architecture Linux ships).
const TICKS_PER_S: f64 = 100.0;

/// The process's user and system CPU time so far, in clock ticks (`/proc/PID/stat`, fields 14, 15).
fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // After the command's name in parentheses (which may hold spaces): state is field 3.
    let fields: Vec<&str> = stat.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
    match (field(14), field(15)) {
        (Some(user), Some(system)) => Ok(user + system),
        _ => anyhow::bail!("/proc/{pid}/stat: {stat}"),
    }
}

/// The process's resident memory in kB (`VmRSS` of `/proc/PID/status`).
fn rss_kb(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("/proc/{pid}/status: no VmRSS"))
}

fn request(run: &str, step: &str, now_ms: u64) -> ClaimRequest {
    ClaimRequest {
        key: format!("{run}/{step}"),
        run_id: run.into(),
        step_id: step.into(),
        tool: "charge".into(),
        class: ReplayClass::IdempotentWrite,
        fingerprint: "f".into(),
        older_fingerprints: Vec::new(),
        args: serde_json::json!({"order": run}),
        sealed: None,
        owner: "bench".into(),
        now_ms,
        lease_ms: 60_000,
        approval: None,
    }
}

async fn finished(ledger: &Ledger, run: &str, step: &str, status: OperationStatus) -> anyhow::Result<()> {
    let now = ledger.now_ms();
    let req = request(run, step, now);
    let Claim::Owned { fence, .. } = ledger.claim(&req).await? else { anyhow::bail!("{run}/{step} not claimed") };
    let attempt = AttemptRecord {
        operation_key: req.key.clone(),
        run_id: run.into(),
        step_id: step.into(),
        tool: "charge".into(),
        attempt: 1,
        max_attempts: 3,
        fence,
        started_ms: now,
        duration_us: 100,
        outcome: "ok".into(),
        message: None,
        source: AttemptSource::Fresh,
        downstream_accepted: Some(true),
        effects: Vec::new(),
    };
    let finish = Some((status, Some(r#"{"charge":"ch_1"}"#.to_string()), None));
    ledger.record_attempt(fence, &attempt, finish, now, Vec::new()).await?;
    Ok(())
}

/// A ledger at `path` with `completed` completed operations (one per run) and the open work.
async fn fill(path: &Path, completed: usize) -> anyhow::Result<f64> {
    let _ = std::fs::remove_file(path);
    let ledger = Ledger::open(path)?;
    let start = Instant::now();
    let mut done = 0;
    while done < completed {
        let batch = (completed - done).min(AT_ONCE);
        let mut tasks = tokio::task::JoinSet::new();
        for n in done..done + batch {
            let ledger = ledger.clone();
            tasks.spawn(async move {
                let run = format!("run-{n:08}");
                // One step in ten ran under a person's approval (an irreversible tool's): its request
                // stays in the ledger as long as the operation, and gc must not read them all.
                if n % APPROVED_EVERY == 0 {
                    let mut asked = pending(&run, "charge", ledger.now_ms());
                    asked.state = ApprovalState::Approved;
                    asked.decided_by = Some("bench".into());
                    asked.decided_ms = Some(asked.requested_ms);
                    ledger.put_approval(&asked).await?;
                }
                finished(&ledger, &run, "charge", OperationStatus::Completed).await
            });
        }
        while let Some(joined) = tasks.join_next().await {
            joined??;
        }
        done += batch;
    }
    for n in 0..UNKNOWN {
        finished(&ledger, &format!("open-{n}"), "charge", OperationStatus::Unknown).await?;
    }
    for n in 0..PENDING {
        ledger.put_approval(&pending(&format!("asked-{n}"), "ship", ledger.now_ms())).await?;
    }
    Ok(start.elapsed().as_secs_f64())
}

/// A pending request for approval of `run`/`step` (the key [`request`] claims), asked at `now_ms`.
fn pending(run: &str, step: &str, now_ms: u64) -> ApprovalRecord {
    ApprovalRecord {
        operation_key: format!("{run}/{step}"),
        fingerprint: "f".into(),
        component: Some("sha256:aa".into()),
        run_id: run.into(),
        step_id: step.into(),
        tool: "fulfill".into(),
        description: String::new(),
        consequence: None,
        args: serde_json::Value::Null,
        sealed: None,
        requested_ms: now_ms,
        state: ApprovalState::Pending,
        decided_by: None,
        decided_ms: None,
        note: None,
        expires_ms: None,
        revision: 1,
    }
}

async fn median<F: std::future::Future<Output = anyhow::Result<()>>>(
    n: usize,
    mut f: impl FnMut(usize) -> F,
) -> anyhow::Result<f64> {
    let mut samples = Vec::with_capacity(n);
    for i in 0..n {
        let start = Instant::now();
        f(i).await?;
        samples.push(start.elapsed());
    }
    Ok(Latency::of(samples).p50)
}

async fn figures(dir: &Path, completed: usize, n: usize, idle: Duration) -> anyhow::Result<Figures> {
    let path = dir.join(format!("growth-{completed}.redb"));
    eprintln!("filling a ledger with {completed} completed operations...");
    let fill_s = fill(&path, completed).await?;
    let bytes = std::fs::metadata(&path)?.len() as f64;
    // Opening: the schema check and the recovery of what a stopped host left (serve does this
    // before it listens).
    let start = Instant::now();
    let ledger = Ledger::open(&path)?;
    let startup_ms = start.elapsed().as_secs_f64() * 1e3;
    let now = ledger.now_ms();
    let open_runs_us = median(n, |_| async {
        let open = ledger.open_runs(None, now).await?;
        anyhow::ensure!(open.len() == UNKNOWN + PENDING, "{} open runs", open.len());
        Ok(())
    })
    .await?;
    let unknowns_us = median(n, |_| async {
        let unknown = ledger.open_operations(now, |why| *why == Why::Unknown).await?;
        anyhow::ensure!(unknown.len() == UNKNOWN, "{} unknown", unknown.len());
        Ok(())
    })
    .await?;
    let first_page_us = median(n, |_| async {
        for run in ledger.runs_page(None, 50).await? {
            ledger.operations(Some(&run)).await?;
        }
        Ok(())
    })
    .await?;
    let start = Instant::now();
    let report = oncebox::recovery::report(&ledger, None).await?;
    let recover_ms = start.elapsed().as_secs_f64() * 1e3;
    anyhow::ensure!(report.len() == UNKNOWN + PENDING, "recover reported {} runs", report.len());
    let start = Instant::now();
    let gc = oncebox::retention::gc(&ledger, Duration::from_secs(7 * 86_400), now).await?;
    let gc_ms = start.elapsed().as_secs_f64() * 1e3;
    anyhow::ensure!(gc.removed_operations == 0, "gc removed {}", gc.removed_operations);
    let fresh_us = median(n, |i| {
        let ledger = ledger.clone();
        async move { finished(&ledger, &format!("fresh-{i}"), "charge", OperationStatus::Completed).await }
    })
    .await?;
    let replay_us = median(n * 10, |i| {
        let ledger = ledger.clone();
        async move {
            let run = format!("run-{:08}", (i * 7919) % completed.max(1));
            match ledger.claim(&request(&run, "charge", ledger.now_ms())).await? {
                Claim::Recorded(_) => Ok(()),
                other => anyhow::bail!("{run}: not replayed: {other:?}"),
            }
        }
    })
    .await?;
    drop(ledger);
    eprintln!("serving it...");
    let served = served(dir, &path, n.min(50), idle).await?;
    let _ = std::fs::remove_file(&path);
    Ok(Figures {
        completed,
        fill_s,
        startup_ms,
        open_runs_us,
        unknowns_us,
        first_page_us,
        recover_ms,
        gc_ms,
        fresh_us,
        replay_us,
        bytes_per_operation: bytes / (completed + UNKNOWN) as f64,
        served,
    })
}

/// The figures at `small` and `large` completed operations, printed with their ratios.
pub async fn run(dir: &Path, small: usize, large: usize, quick: bool) -> anyhow::Result<()> {
    let (n, idle) = if quick { (20, Duration::from_secs(5)) } else { (200, Duration::from_secs(60)) };
    let (a, b) = (figures(dir, small, n, idle).await?, figures(dir, large, n, idle).await?);
    println!(
        "growth: {small} vs {large} completed operations ({UNKNOWN} unknown, {PENDING} pending approval open in both)"
    );
    println!("{:<34} {:>14} {:>14} {:>8}", "figure", small, large, "ratio");
    let rows = [
        ("fill (s, through the ledger API)", a.fill_s, b.fill_s),
        ("startup: open + recover (ms)", a.startup_ms, b.startup_ms),
        ("open runs: /metrics, reconciler (us)", a.open_runs_us, b.open_runs_us),
        ("unknowns listing (us)", a.unknowns_us, b.unknowns_us),
        ("console first page of runs (us)", a.first_page_us, b.first_page_us),
        ("recover, whole ledger (ms)", a.recover_ms, b.recover_ms),
        ("gc, nothing expired (ms)", a.gc_ms, b.gc_ms),
        ("fresh operation p50 (us)", a.fresh_us, b.fresh_us),
        ("replay p50 (us)", a.replay_us, b.replay_us),
        ("bytes per operation", a.bytes_per_operation, b.bytes_per_operation),
        ("serve: spawn to /healthz ok (ms)", a.served.ready_ms, b.served.ready_ms),
        ("serve: idle CPU (%)", a.served.idle_cpu_percent, b.served.idle_cpu_percent),
        ("serve: resident memory (MB)", a.served.rss_mb, b.served.rss_mb),
        ("serve: GET /metrics p50 (ms)", a.served.metrics_ms, b.served.metrics_ms),
        ("serve: console / p50 (ms)", a.served.console_ms, b.served.console_ms),
        ("serve: console /unknowns p50 (ms)", a.served.unknowns_ms, b.served.unknowns_ms),
    ];
    for (name, x, y) in rows {
        println!("{name:<34} {x:>14.1} {y:>14.1} {:>8.2}", y / x);
    }
    Ok(())
}
