//! The same read-only tool (`stock`) in Rust, Python and JavaScript: how big its component is,
//! its first load (a fresh process, an empty compile cache: what the first `oncebox call` of a new
//! version pays), its warm load (a fresh process, from the cache), one instantiation, and one call
//! (an HTTP read from the example provider), all in one run.
//!
//! The Python and JavaScript components are built by their SDKs' one command
//! (`oncebox-guest-langs`), whose toolchains come from PyPI and npm on first use; without python3
//! or npm those rows are skipped, said in one line.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use oncebox::{Call, Grant, Host, Status};
use oncebox_example_provider::Provider;
use oncebox_guest_langs::Lang;
use serde::Serialize;
use serde_json::json;

use crate::stats::Latency;

#[derive(Debug, Serialize)]
pub struct LangLoad {
    pub lang: &'static str,
    pub tool: &'static str,
    pub component_mb: f64,
    /// A fresh process loading the component with an empty compile cache: compiled.
    pub first_load_ms: f64,
    /// A fresh process loading it from the compile cache the first load wrote.
    pub warm_load_ms: f64,
    pub instantiate_us: Latency,
    pub call_us: Latency,
}

/// The tool in each language: (language, tool, how its component is built; none: oncebox-artifacts').
type Built = Option<(Lang, &'static str)>;
const LANGS: [(&str, &str, Built); 3] = [
    ("rust", "stock", None),
    ("python", "stock-py", Some((Lang::Python, "example-tools/python/stock"))),
    ("js", "stock-js", Some((Lang::Js, "example-tools/js/stock"))),
];

/// The three languages' rows; a language whose toolchain is missing is left out, said why.
/// `loads` first and warm loads each (whole processes; 0: none, their figures are then NaN).
pub async fn measure(dir: &Path, n: usize, loads: usize) -> anyhow::Result<Vec<LangLoad>> {
    let work = dir.parent().unwrap_or(dir).join("guest-langs");
    let mut rows = Vec::new();
    for (lang, tool, source) in LANGS {
        let component = match source {
            None => PathBuf::from(oncebox_artifacts::STOCK),
            Some((l, project)) => match oncebox_guest_langs::build(l, project, &work) {
                Ok(component) => component,
                Err(e) => {
                    let why = format!("{e:#}");
                    eprintln!("cannot build {tool} ({}): skipping it", why.lines().next().unwrap_or_default());
                    continue;
                }
            },
        };
        eprintln!("measuring {tool}...");
        rows.push(row(lang, tool, &component, dir, n, loads).await?);
    }
    Ok(rows)
}

async fn row(
    lang: &'static str,
    tool: &'static str,
    component: &Path,
    dir: &Path,
    n: usize,
    loads: usize,
) -> anyhow::Result<LangLoad> {
    let component_mb = std::fs::metadata(component)?.len() as f64 / 1e6;
    let mut first = Vec::new();
    let mut warm = Vec::new();
    for i in 0..loads {
        let cache = dir.join(format!("load-cache-{tool}-{i}"));
        let _ = std::fs::remove_dir_all(&cache);
        first.push(load_in_a_new_process(component, &cache)?);
        warm.push(load_in_a_new_process(component, &cache)?);
    }

    let provider = Provider::start().await?;
    provider.set_stock("sku-1", 7);
    // The compile cache kept between runs (beside `dir`, which each run empties): the code that runs
    // is the same either way, and a run does not compile each language again.
    let host = Host::builder_in_memory()
        .compile_cache(dir.parent().unwrap_or(dir).join("compile-cache"))
        .tool_config(tool, "base_url", provider.base_url())
        .grant(tool, Grant::Http(provider.base_url().parse().map_err(anyhow::Error::msg)?))
        .build()
        .await?;
    host.load(component).await?;
    let instantiate_us = crate::host_runs::timed(n, |_| async { Ok(host.instantiate(tool).await?) }).await?;
    let args = json!({"sku": "sku-1"}).to_string();
    let call_us = crate::host_runs::timed(n, |_| async {
        let outcome = host.call(Call::unrecorded(tool, args.clone())).await?;
        anyhow::ensure!(outcome.status == Status::Completed, "{tool}: {outcome:?}");
        Ok(())
    })
    .await?;
    provider.shutdown().await;
    Ok(LangLoad {
        lang,
        tool,
        component_mb,
        first_load_ms: median(first),
        warm_load_ms: median(warm),
        instantiate_us,
        call_us,
    })
}

fn median(mut samples: Vec<Duration>) -> f64 {
    samples.sort_unstable();
    samples.get(samples.len() / 2).map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
}

/// This bench's own binary, run as `--load-once COMPONENT --load-cache DIR`: a process that starts,
/// loads the component (compiling it unless the cache has it) and exits. Timed from outside.
fn load_in_a_new_process(component: &Path, cache: &Path) -> anyhow::Result<Duration> {
    let bench = std::env::current_exe().context("the bench's own path")?;
    let start = Instant::now();
    let output = Command::new(bench).arg("--load-once").arg(component).arg("--load-cache").arg(cache).output()?;
    let elapsed = start.elapsed();
    if !output.status.success() {
        bail!("loading {} failed: {}", component.display(), String::from_utf8_lossy(&output.stderr));
    }
    Ok(elapsed)
}

/// What `--load-once` runs in the child process.
pub async fn load_once(component: &Path, cache: &Path) -> anyhow::Result<()> {
    let host = Host::builder_in_memory().compile_cache(cache).build().await?;
    host.load(component).await?;
    Ok(())
}
