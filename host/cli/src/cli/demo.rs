//! `oncebox demo`: the double charge, and the same workflow through oncebox.
//!
//! Two identical example providers run on loopback, each told to commit the first charge of every
//! order and then lose the response. A naive loop retries the charge against one; oncebox runs the
//! order workflow (stock, reserve, charge, notify) against the other. The charge counts printed
//! are the providers' own.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use oncebox::{Call, Grant, Host, HttpTarget, Outcome};
use oncebox_example_provider::{Fault, FaultKind, Provider, ProviderHandle, Route};
use serde_json::json;

use super::Exit;

/// How long either client waits for the provider's answer.
const TIMEOUT: Duration = Duration::from_secs(2);
/// Attempts the naive loop makes, like oncebox's default for the charge's class.
const NAIVE_ATTEMPTS: u32 = 3;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// How many orders to run.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub orders: u32,
    /// Keep oncebox's ledger at this path (by default a temporary file, removed at the end).
    #[arg(long)]
    pub ledger: Option<PathBuf>,
}

struct Row {
    order: String,
    naive_attempts: u32,
    naive_charges: u64,
    outcome: Outcome,
    retry: Outcome,
    oncebox_charges: u64,
}

pub async fn run(args: Args) -> anyhow::Result<Exit> {
    let orders: Vec<String> = (1..=args.orders).map(|n| format!("order-{n}")).collect();
    let naive_provider = start_provider(&orders).await?;
    let oncebox_provider = start_provider(&orders).await?;

    let temp =
        args.ledger.is_none().then(|| std::env::temp_dir().join(format!("oncebox-demo-{}.redb", std::process::id())));
    let ledger = args.ledger.clone().or_else(|| temp.clone()).context("no ledger path")?;
    let tools = Components::write()?;
    let host = oncebox_host(&ledger, &oncebox_provider, &tools).await?;

    let client = reqwest::Client::builder().timeout(TIMEOUT).build()?;
    let mut rows = Vec::new();
    for order in &orders {
        let naive_attempts = naive_charge(&client, &naive_provider.base_url(), order).await;
        let (outcome, retry) = oncebox_order(&host, order).await?;
        rows.push(Row {
            order: order.clone(),
            naive_attempts,
            naive_charges: naive_provider.counts(order).payments,
            outcome,
            retry,
            oncebox_charges: oncebox_provider.counts(order).payments,
        });
    }
    drop(host);
    print_table(&rows);
    let saga_ledger = ledger.with_extension("saga.redb");
    let _ = std::fs::remove_file(&saga_ledger);
    let saga = super::demo_saga::run(&saga_ledger, &tools).await?;
    if let Some(temp) = temp {
        // A leftover temporary ledger is harmless; failing to remove it is not worth an error.
        for path in
            [temp.clone(), saga_ledger.clone(), oncebox::secret::beside(&temp), oncebox::secret::beside(&saga_ledger)]
        {
            let _ = std::fs::remove_file(path);
        }
    }

    let naive: u64 = rows.iter().map(|r| r.naive_charges).sum();
    let once: u64 = rows.iter().map(|r| r.oncebox_charges).sum();
    println!("demo: orders={} naive_charges={naive} oncebox_charges={once}", orders.len());
    let saga_once = saga.rejected_refunds == 1
        && saga.rejected_released
        && saga.unknown_blocked
        && saga.unknown_reconciled
        && saga.unknown_refunds == 1
        && saga.approved_shipments == 1;
    let exactly_once = rows.iter().all(|r| r.oncebox_charges == 1) && saga_once;
    Ok(if exactly_once { Exit::Ok } else { Exit::ToolFailed })
}

async fn start_provider(orders: &[String]) -> anyhow::Result<ProviderHandle> {
    let provider = Provider::start().await.context("starting the example provider")?;
    provider.set_stock("sku-1", 100);
    for order in orders {
        provider.arm(Fault::new(Route::Payments, FaultKind::LoseResponse).for_order(order.clone()));
    }
    Ok(provider)
}

fn charge_args(order: &str) -> serde_json::Value {
    json!({"order_id": order, "amount_cents": 4200, "currency": "eur", "payment_method": "pm_card_visa"})
}

/// What most agent loops do: call the API, and on a timeout or a dropped connection, call again.
async fn naive_charge(client: &reqwest::Client, base: &str, order: &str) -> u32 {
    let body = charge_args(order).to_string();
    for attempt in 1..=NAIVE_ATTEMPTS {
        let sent = client
            .post(format!("{base}/payments"))
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await;
        if sent.is_ok_and(|r| r.status().is_success()) {
            return attempt;
        }
    }
    NAIVE_ATTEMPTS
}

/// The demo's tool components, written out from the bytes built into this binary, so that an
/// installed `oncebox` (`cargo install --path host/cli`) runs the demo with no checkout and no
/// target directory beside it. The directory goes when the demo ends.
pub(super) struct Components {
    dir: std::path::PathBuf,
}

impl Components {
    const ALL: [(&str, &[u8]); 7] = [
        ("stock", oncebox_artifacts::embedded::STOCK),
        ("reserve", oncebox_artifacts::embedded::RESERVE),
        ("release", oncebox_artifacts::embedded::RELEASE),
        ("charge", oncebox_artifacts::embedded::CHARGE),
        ("refund", oncebox_artifacts::embedded::REFUND),
        ("fulfill", oncebox_artifacts::embedded::FULFILL),
        ("notify", oncebox_artifacts::embedded::NOTIFY),
    ];

    fn write() -> anyhow::Result<Components> {
        let dir = std::env::temp_dir().join(format!("oncebox-demo-{}-tools", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let components = Components { dir };
        for (name, bytes) in Self::ALL {
            let path = components.path(name);
            std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(components)
    }

    /// The component of the tool `name`.
    pub(super) fn path(&self, name: &str) -> std::path::PathBuf {
        self.dir.join(format!("{name}.wasm"))
    }
}

impl Drop for Components {
    fn drop(&mut self) {
        // A leftover temporary directory is harmless; failing to remove it is not worth an error.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn oncebox_host(ledger: &std::path::Path, provider: &ProviderHandle, tools: &Components) -> anyhow::Result<Host> {
    let target = HttpTarget {
        honours_keys: true,
        key_retention: Duration::from_secs(24 * 3600),
        timeout: TIMEOUT,
        ..Default::default()
    };
    let base = provider.base_url();
    let host = super::cached(Host::builder(ledger))
        .http_target(provider.addr().to_string(), target)
        .tool_config("stock", "base_url", base.clone())
        .tool_config("charge", "base_url", base.clone())
        .grant("stock", Grant::Http(base.parse().map_err(anyhow::Error::msg)?))
        .grant("charge", Grant::Http(base.parse().map_err(anyhow::Error::msg)?))
        .grant("reserve", Grant::Kv("reservations".into()))
        .grant("notify", Grant::Outbox("email".into()))
        .build()
        .await?;
    for tool in ["stock", "reserve", "charge", "notify"] {
        host.load(tools.path(tool)).await?;
    }
    Ok(host)
}

/// The order workflow as an orchestrator runs it: one run per order, one step per tool. Then the
/// agent, unsure, asks for the charge step again.
async fn oncebox_order(host: &Host, order: &str) -> anyhow::Result<(Outcome, Outcome)> {
    let run = format!("checkout-{order}");
    let steps = [
        ("stock", json!({"sku": "sku-1"})),
        ("reserve", json!({"order_id": order, "sku": "sku-1", "quantity": 1})),
        ("charge", charge_args(order)),
        ("notify", json!({"order_id": order, "email": "buyer@example.com", "template": "receipt"})),
    ];
    let mut charge = None;
    for (tool, args) in steps {
        let call = if tool == "stock" {
            Call::unrecorded(tool, args.to_string())
        } else {
            Call::step(&run, format!("{tool}-1"), tool, args.to_string())
        };
        let outcome = host.call(call).await?;
        if tool == "charge" {
            charge = Some(outcome);
        }
    }
    let retry = host.call(Call::step(&run, "charge-1", "charge", charge_args(order).to_string())).await?;
    Ok((charge.context("the charge step did not run")?, retry))
}

fn print_table(rows: &[Row]) {
    println!("The provider commits the first charge of each order, then loses the response.\n");
    println!(
        "{:<10} | {:>13} {:>13} | {:>9} {:>8} {:>15} {:>15}",
        "order", "naive tries", "naive charges", "oncebox", "attempts", "oncebox charges", "step retried"
    );
    println!("{}", "-".repeat(94));
    for r in rows {
        let status =
            serde_json::to_value(r.outcome.status).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default();
        let retry = if r.retry.replayed { "replayed" } else { "ran again" };
        println!(
            "{:<10} | {:>13} {:>13} | {:>9} {:>8} {:>15} {:>15}",
            r.order, r.naive_attempts, r.naive_charges, status, r.outcome.attempts, r.oncebox_charges, retry
        );
    }
    println!();
}
