//! oncebox itself: a host on a ledger file in the benchmark's directory (or on a PostgreSQL
//! database), the real components, and the example provider on loopback.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use oncebox::{Call, Grant, Host, HostBuilder, HttpTarget, LedgerAt, Status};
use oncebox_example_provider::{Provider, ProviderHandle};
use serde_json::json;

use crate::stats::{self, Latency};

pub struct Bench {
    pub host: Host,
    pub provider: ProviderHandle,
}

/// A host on a ledger file in `dir`, keeping compiled components in `cache` (kept between runs).
pub async fn start(dir: &Path, cache: &Path) -> anyhow::Result<Bench> {
    start_on(Host::builder(dir.join("ledger.redb")), cache).await
}

/// A host on the PostgreSQL ledger at `url`, its key file in `dir` (a shared ledger needs one).
pub async fn start_postgres(url: &str, dir: &Path, cache: &Path) -> anyhow::Result<Bench> {
    start_on(HostBuilder::at(LedgerAt::Postgres(url.into())).key_file(dir.join("postgres.key")), cache).await
}

/// The host of `builder`, with the benchmark's tools and the example provider on loopback.
async fn start_on(builder: HostBuilder, cache: &Path) -> anyhow::Result<Bench> {
    let provider = Provider::start().await?;
    let target = HttpTarget {
        honours_keys: true,
        key_retention: Duration::from_secs(24 * 3600),
        timeout: Duration::from_secs(10),
        ..Default::default()
    };
    let host = builder
        .http_target(provider.addr().to_string(), target)
        .tool_config("charge", "base_url", provider.base_url())
        .grant("charge", Grant::Http(provider.base_url().parse().map_err(anyhow::Error::msg)?))
        .compile_cache(cache)
        .build()
        .await?;
    host.load(oncebox_artifacts::PANICKY).await?;
    host.load(oncebox_artifacts::CHARGE).await?;
    Ok(Bench { host, provider })
}

/// A durable call of `panicky` with one KV effect, as step `step` of run `run`.
fn kv_call(run: &str, step: usize) -> Call {
    let args = json!({"mode": "ok", "write_first": true, "echo": "bench"});
    Call::step(run, format!("s{step}"), "panicky", args.to_string())
}

async fn completed(host: &Host, call: Call) -> anyhow::Result<()> {
    let outcome = host.call(call).await?;
    if outcome.status != Status::Completed {
        bail!("a benchmark call did not complete: {outcome:?}");
    }
    Ok(())
}

/// Times `n` runs of `f`, one after another, failing on the first error.
pub async fn timed<F: std::future::Future<Output = anyhow::Result<()>>>(
    n: usize,
    mut f: impl FnMut(usize) -> F,
) -> anyhow::Result<Latency> {
    let mut samples = Vec::with_capacity(n);
    for i in 0..n {
        let start = Instant::now();
        f(i).await?;
        samples.push(start.elapsed());
    }
    Ok(Latency::of(samples))
}

pub async fn instantiate(b: &Bench, n: usize) -> anyhow::Result<Latency> {
    timed(n, |_| async { Ok(b.host.instantiate("panicky").await?) }).await
}

pub async fn replay(b: &Bench, n: usize) -> anyhow::Result<Latency> {
    completed(&b.host, kv_call("replay", 0)).await?;
    timed(n, |_| async {
        let outcome = b.host.call(kv_call("replay", 0)).await?;
        anyhow::ensure!(outcome.replayed, "not a replay: {outcome:?}");
        Ok(())
    })
    .await
}

pub async fn fresh_kv(b: &Bench, n: usize) -> anyhow::Result<Latency> {
    timed(n, |i| completed(&b.host, kv_call("fresh-kv", i))).await
}

/// The order every system of the bench charges: the body of `charge`'s POST /payments, and the
/// `charge` tool's args.
pub fn order(order_id: &str) -> serde_json::Value {
    json!({"order_id": order_id, "amount_cents": 100, "currency": "eur", "payment_method": "pm_card"})
}

/// One durable step of the `charge` tool (one idempotent POST /payments to the example provider)
/// for order `order_id`, the order id also being the step's id: the workload oncebox shares with
/// its peers (`peers.rs`).
pub async fn charge(host: &Host, order_id: &str) -> anyhow::Result<()> {
    completed(host, Call::step("charge", order_id, "charge", order(order_id).to_string())).await
}

pub async fn fresh_http(b: &Bench, n: usize) -> anyhow::Result<Latency> {
    let before = b.provider.totals();
    let latency = timed(n, |i| {
        let args = order(&format!("o{i}")).to_string();
        completed(&b.host, Call::step("fresh-http", format!("charge-{i}"), "charge", args))
    })
    .await?;
    let charged = b.provider.totals().payments - before.payments;
    anyhow::ensure!(charged == n as u64, "the provider counted {charged} charges for {n} calls");
    Ok(latency)
}

/// Durable fresh calls per second with `callers` concurrent callers, `each` calls apiece.
pub async fn throughput(b: &Bench, callers: usize, each: usize) -> anyhow::Result<f64> {
    let host = Arc::new(b.host.clone());
    let run = format!("throughput-{callers}");
    let start = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|c| {
            let (host, run) = (host.clone(), run.clone());
            tokio::spawn(async move {
                for i in 0..each {
                    completed(&host, kv_call(&run, c * each + i)).await?;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for task in tasks {
        task.await.context("a caller panicked")??;
    }
    Ok(stats::rate(callers * each, start.elapsed()))
}

/// Durable `charge` steps per second with `callers` concurrent callers, `each` steps apiece; the
/// provider must have counted one payment for each.
pub async fn http_throughput(b: &Bench, callers: usize, each: usize) -> anyhow::Result<f64> {
    let host = Arc::new(b.host.clone());
    let before = b.provider.totals();
    let start = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|c| {
            let host = host.clone();
            tokio::spawn(async move {
                for i in 0..each {
                    charge(&host, &format!("http-throughput-{callers}-c{c}-{i}")).await?;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for task in tasks {
        task.await.context("a caller panicked")??;
    }
    let rate = stats::rate(callers * each, start.elapsed());
    let charged = b.provider.totals().payments - before.payments;
    anyhow::ensure!(
        charged == (callers * each) as u64,
        "the provider counted {charged} charges for {} calls",
        callers * each
    );
    Ok(rate)
}
