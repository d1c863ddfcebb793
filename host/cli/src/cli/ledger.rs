//! `oncebox ledger list [--run R]`, `oncebox ledger show KEY` and `oncebox ledger rotate-key`

use super::{Exit, Usage, print_json};

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// One line of JSON per operation.
    List {
        #[arg(long)]
        ledger: oncebox::LedgerAt,
        /// Only this run's steps.
        #[arg(long)]
        run: Option<String>,
    },
    /// Put a new fingerprint secret in front of the ledger's key file (`LEDGER.key`); the old ones
    /// stay, so that operations recorded before still replay.
    RotateKey {
        #[arg(long)]
        ledger: oncebox::LedgerAt,
    },
    /// Remove completed and failed operations (with their attempts, effects and approvals) and
    /// rejected requests for approval older than the retention; never unknown, claimed,
    /// awaiting-approval or outstanding-compensation ones. A removed step leaves a tombstone: a
    /// call of it is answered `expired`, not run as new.
    Gc {
        #[arg(long)]
        ledger: oncebox::LedgerAt,
        /// The retention (default 7 days).
        #[arg(long, value_parser = humantime::parse_duration, default_value = "7d")]
        older_than: std::time::Duration,
    },
    /// An operation with its effects and attempts.
    Show {
        #[arg(long)]
        ledger: oncebox::LedgerAt,
        /// The operation key.
        key: String,
    },
}

pub async fn run(command: Command) -> anyhow::Result<Exit> {
    match command {
        Command::List { ledger, run } => {
            let ledger = super::open_ledger(&ledger).await?;
            for op in ledger.operations(run.as_deref()).await? {
                print_json(&serde_json::json!({
                    "operation_key": op.key,
                    "run": op.run_id,
                    "step": op.step_id,
                    "tool": op.tool,
                    "status": op.status,
                    "attempts": op.attempts,
                }))?;
            }
        }
        Command::RotateKey { ledger } => {
            // The ledger must exist (a typo must not create a key for nothing).
            super::open_ledger(&ledger).await?;
            let path = super::key_file_of(&ledger)?;
            let kept = oncebox::secret::rotate(&path)?;
            print_json(&serde_json::json!({ "key_file": path, "secrets": kept }))?;
        }
        Command::Gc { ledger, older_than } => {
            let ledger = super::open_ledger(&ledger).await?;
            let report = oncebox::retention::gc(&ledger, older_than, ledger.now_ms()).await?;
            print_json(&report)?;
        }
        Command::Show { ledger, key } => {
            let ledger = super::open_ledger(&ledger).await?;
            let op = ledger.operation(&key).await?.ok_or_else(|| Usage(format!("no operation with key {key}")))?;
            print_json(&serde_json::json!({
                "operation": op,
                "effects": ledger.effects(&key).await?,
                "attempts": ledger.attempts(&key).await?,
            }))?;
        }
    }
    Ok(Exit::Ok)
}
