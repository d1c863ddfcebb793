//! `oncebox outbox deliver` (the relay, once or until a signal) and `oncebox outbox list`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use oncebox::Ledger;
use oncebox::outbox::{Relay, Summary};
use oncebox::policy_file::PolicyFile;

use super::{Exit, Usage, print_json};

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Deliver the outbox to each topic's endpoint (`[outbox.TOPIC]` in the policy file), in order,
    /// each message with its key as Idempotency-Key. Prints a summary as one line of JSON; exits 0
    /// when none of its topics is left with a message pending, 1 otherwise (messages of topics
    /// without an endpoint are counted under `unconfigured`, and logged).
    Deliver {
        #[arg(long)]
        ledger: oncebox::LedgerAt,
        #[arg(long)]
        policy: PathBuf,
        /// Deliver what is pending and exit (else: keep delivering until SIGINT or SIGTERM).
        #[arg(long)]
        once: bool,
        /// Only this topic (repeatable); it must have an endpoint in the policy file.
        #[arg(long = "topic")]
        topics: Vec<String>,
        /// A PEM certificate to trust for HTTPS endpoints, besides the system's roots (repeatable).
        #[arg(long = "tls-root")]
        tls_roots: Vec<PathBuf>,
    },
    /// One line of JSON per outbox message, with its delivery state (payloads only when asked).
    List {
        #[arg(long)]
        ledger: oncebox::LedgerAt,
        /// Only this topic.
        #[arg(long)]
        topic: Option<String>,
        /// Only messages not delivered yet.
        #[arg(long)]
        pending: bool,
        /// Print each message's payload too (it may hold what a tool considers sensitive).
        #[arg(long)]
        payloads: bool,
    },
}

pub async fn run(command: Command) -> anyhow::Result<Exit> {
    match command {
        Command::Deliver { ledger, policy, once, topics, tls_roots } => {
            deliver(ledger, policy, once, topics, tls_roots).await
        }
        Command::List { ledger, topic, pending, payloads } => {
            let ledger = super::open_ledger(&ledger).await?;
            for message in ledger.outbox().await? {
                if topic.as_ref().is_some_and(|t| *t != message.topic) || (pending && message.delivery.is_delivered()) {
                    continue;
                }
                let mut line = serde_json::json!({
                    "seq": message.seq,
                    "topic": message.topic,
                    "effect_key": message.effect_key,
                    "enqueued_ms": message.enqueued_ms,
                    "state": message.delivery.state(),
                    "delivery": message.delivery,
                });
                if payloads {
                    line["payload"] = serde_json::Value::String(message.payload);
                }
                print_json(&line)?;
            }
            Ok(Exit::Ok)
        }
    }
}

async fn deliver(
    ledger: oncebox::LedgerAt,
    policy: PathBuf,
    once: bool,
    only: Vec<String>,
    tls_roots: Vec<PathBuf>,
) -> anyhow::Result<Exit> {
    let file = PolicyFile::load(&policy)?;
    let mut endpoints: BTreeMap<String, _> = file.outbox_endpoints().into_iter().collect();
    if endpoints.is_empty() {
        return Err(Usage(format!(
            "{} has no [outbox.TOPIC] with an endpoint: nothing to deliver to",
            policy.display()
        ))
        .into());
    }
    if !only.is_empty() {
        if let Some(missing) = only.iter().find(|topic| !endpoints.contains_key(*topic)) {
            return Err(
                Usage(format!("topic `{missing}` has no [outbox.{missing}] endpoint in {}", policy.display())).into()
            );
        }
        endpoints.retain(|topic, _| only.contains(topic));
    }
    let mut roots = Vec::new();
    for path in &tls_roots {
        roots.push(std::fs::read(path).map_err(|e| Usage(format!("cannot read {}: {e}", path.display())))?);
    }
    let ledger = super::open_ledger(&ledger).await?;
    let unconfigured = unconfigured(&ledger, &file).await?;
    for (topic, count) in &unconfigured {
        tracing::warn!(%topic, count, "outbox messages pending for a topic without an endpoint in the policy file");
    }
    let relay = Relay::new(ledger, endpoints, &roots)?;
    let summary = if once { relay.deliver_pending().await? } else { relay.run(super::stop_signal()).await? };
    print_json(&report(&summary, &unconfigured))?;
    Ok(if summary.all_delivered() { Exit::Ok } else { Exit::ToolFailed })
}

/// Pending messages of topics the policy file has no endpoint for, by topic.
async fn unconfigured(ledger: &Ledger, file: &PolicyFile) -> anyhow::Result<BTreeMap<String, u64>> {
    let configured: Vec<String> = file.outbox_endpoints().into_iter().map(|(topic, _)| topic).collect();
    let mut counts = BTreeMap::new();
    for message in ledger.outbox().await? {
        if !message.delivery.is_delivered() && !configured.contains(&message.topic) {
            *counts.entry(message.topic).or_insert(0) += 1;
        }
    }
    Ok(counts)
}

fn report(summary: &Summary, unconfigured: &BTreeMap<String, u64>) -> serde_json::Value {
    serde_json::json!({
        "delivered": summary.delivered(),
        "all_delivered": summary.all_delivered(),
        "topics": summary.topics,
        "unconfigured": unconfigured,
    })
}
