//! `oncebox compensate --ledger L --run R --tools DIR [--policy F]` and
//! `oncebox recover --ledger L [--run R]`: what happens after something went wrong.

use std::path::PathBuf;

use oncebox::policy_file::PolicyFile;
use oncebox::saga::SagaState;

use super::{Exit, Usage, print_json};

#[derive(Debug, clap::Args)]
pub struct CompensateArgs {
    #[arg(long)]
    ledger: oncebox::LedgerAt,
    #[arg(long)]
    run: String,
    /// The directory of components: the run's compensatable tools and their compensations.
    #[arg(long, value_name = "DIR")]
    tools: PathBuf,
    #[arg(long)]
    policy: Option<PathBuf>,
}

pub async fn compensate(args: CompensateArgs) -> anyhow::Result<Exit> {
    if let Some(path) = args.ledger.file().filter(|path| !path.exists()) {
        return Err(Usage(format!("no ledger at {}", path.display())).into());
    }
    let mut builder = super::host_at(&args.ledger);
    if let Some(policy) = &args.policy {
        builder = builder.policy_file(PolicyFile::load(policy)?);
    }
    let host = builder.build().await?;
    host.load_dir(&args.tools).await?;
    let report = host.compensate(&args.run).await?;
    print_json(&report)?;
    Ok(if report.state == SagaState::Done { Exit::Ok } else { Exit::ToolFailed })
}

#[derive(Debug, clap::Args)]
pub struct RecoverArgs {
    #[arg(long)]
    ledger: oncebox::LedgerAt,
    #[arg(long)]
    run: Option<String>,
}

/// Opening the ledger recovers it; this prints what that left, per run. Exit 1 when a person
/// must decide something.
pub async fn recover(args: RecoverArgs) -> anyhow::Result<Exit> {
    let ledger = super::open_ledger(&args.ledger).await?;
    let runs = oncebox::recovery::report(&ledger, args.run.as_deref()).await?;
    let decide = runs.values().any(|run| !run.decide.is_empty());
    print_json(&serde_json::json!({ "runs": runs }))?;
    Ok(if decide { Exit::ToolFailed } else { Exit::Ok })
}
