//! The second half of `oncebox demo`: the saga of an order whose later step goes wrong, counted
//! at a third example provider. Payment confirmed and fulfillment rejected: the refund and the
//! release run once each, however often compensation runs. Fulfillment unknown: the refund is
//! blocked until reconciliation says what happened. Fulfillment awaiting approval: approved with
//! its exact params, it ships once.

use anyhow::Context;
use oncebox::saga::SagaState;
use oncebox::{Call, Decision, Grant, Host, HttpTarget, Outcome, Status};
use oncebox_example_provider::{Fault, FaultKind, Provider, Route};
use serde_json::{Value, json};

/// What the saga part showed, counted at the provider (and the ledger, for the reservation).
pub struct SagaCounts {
    pub rejected_refunds: u64,
    pub rejected_released: bool,
    pub unknown_blocked: bool,
    pub unknown_reconciled: bool,
    pub unknown_refunds: u64,
    pub approved_shipments: u64,
}

pub async fn run(ledger: &std::path::Path, tools: &super::demo::Components) -> anyhow::Result<SagaCounts> {
    let provider = Provider::start().await.context("starting the example provider")?;
    provider.set_stock("sku-1", 100);
    let base = provider.base_url();
    let origin = || base.parse().map_err(anyhow::Error::msg);
    let target = HttpTarget {
        honours_keys: true,
        key_retention: std::time::Duration::from_secs(24 * 3600),
        ..Default::default()
    };
    let mut builder = super::cached(Host::builder(ledger)).http_target(provider.addr().to_string(), target);
    for tool in ["charge", "refund", "fulfill"] {
        builder = builder.tool_config(tool, "base_url", base.clone()).grant(tool, Grant::Http(origin()?));
    }
    for tool in ["reserve", "release"] {
        builder = builder.grant(tool, Grant::Kv("reservations".into()));
    }
    let host = builder.build().await?;
    for tool in ["reserve", "release", "charge", "refund", "fulfill"] {
        host.load(tools.path(tool)).await?;
    }
    for manifest in ["charge", "reserve"].iter().filter_map(|t| host.manifest(t)) {
        host.check_compensation(&manifest)?;
    }

    // 1. Paid, then the fulfillment is rejected by the approver: compensate (twice, as a retry would).
    let run = "saga-rejected";
    step(&host, run, "1-reserve", "reserve", json!({"order_id": "o-r", "sku": "sku-1", "quantity": 1})).await?;
    step(&host, run, "2-charge", "charge", charge("o-r")).await?;
    let ship = step(&host, run, "3-ship", "fulfill", fulfill("o-r")).await?;
    decide(&host, &ship, Decision::Reject).await?;
    for _ in 0..2 {
        host.compensate(run).await?;
    }
    let released = host.ledger().kv_get("reservations", "reservation/o-r").await?.is_none();

    // 2. Paid, then the shipment's answer is lost: the refund waits for reconciliation.
    let run = "saga-unknown";
    provider.arm(Fault::new(Route::Fulfillments, FaultKind::LoseResponse).for_order("o-u"));
    step(&host, run, "1-charge", "charge", charge("o-u")).await?;
    let ship = step(&host, run, "2-ship", "fulfill", fulfill("o-u")).await?;
    decide(&host, &ship, Decision::Approve { expires_ms: None }).await?;
    step(&host, run, "2-ship", "fulfill", fulfill("o-u")).await?;
    let blocked = host.compensate(run).await?.state == SagaState::Blocked && provider.counts("o-u").refunds == 0;
    let answers = host.reconcile_run(run).await?;
    let reconciled = !answers.is_empty()
        && answers.iter().all(|answer| matches!(answer.answer, oncebox::Reconciliation::Committed { .. }));
    // Reconciled (it shipped): the refund may run now, once, and the shipment is kept.
    host.compensate(run).await?;

    // 3. Awaiting approval, approved with its exact params: shipped once, however often it is asked.
    let run = "saga-approved";
    let ship = step(&host, run, "1-ship", "fulfill", fulfill("o-a")).await?;
    decide(&host, &ship, Decision::Approve { expires_ms: None }).await?;
    for _ in 0..3 {
        step(&host, run, "1-ship", "fulfill", fulfill("o-a")).await?;
    }

    let counts = SagaCounts {
        rejected_refunds: provider.counts("o-r").refunds,
        rejected_released: released,
        unknown_blocked: blocked,
        unknown_reconciled: reconciled,
        unknown_refunds: provider.counts("o-u").refunds,
        approved_shipments: provider.counts("o-a").fulfillments,
    };
    println!("The saga: a later step of an order goes wrong.\n");
    println!("  fulfillment rejected  -> refunds={} released={}", counts.rejected_refunds, counts.rejected_released);
    println!(
        "  fulfillment unknown   -> refund blocked={} reconciled committed={} then refunds={}",
        counts.unknown_blocked, counts.unknown_reconciled, counts.unknown_refunds
    );
    println!("  approved exact params -> shipments={}\n", counts.approved_shipments);
    Ok(counts)
}

async fn step(host: &Host, run: &str, step: &str, tool: &str, args: Value) -> anyhow::Result<Outcome> {
    Ok(host.call(Call::step(run, step, tool, args.to_string())).await?)
}

async fn decide(host: &Host, outcome: &Outcome, decision: Decision) -> anyhow::Result<()> {
    anyhow::ensure!(outcome.status == Status::AwaitingApproval, "expected awaiting-approval, got {:?}", outcome.status);
    let key = outcome.operation_key.as_deref().context("no operation key")?;
    let fingerprint = outcome.fingerprint.as_deref().context("no fingerprint")?;
    host.decide(key, fingerprint, decision, "demo-operator", None).await?;
    Ok(())
}

fn charge(order: &str) -> Value {
    json!({"order_id": order, "amount_cents": 4200, "currency": "eur", "payment_method": "pm_card_visa"})
}

fn fulfill(order: &str) -> Value {
    json!({"order_id": order, "address": "1 Main St", "items": [{"sku": "sku-1", "quantity": 1}]})
}
