//! `oncebox compensate --ledger L --run R --tools DIR [--policy F]`, `oncebox undone-by-hand
//! --ledger L KEY --by NAME [--note TEXT]` and `oncebox recover --ledger L [--run R]`: what
//! happens after something went wrong.

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

/// Prints the saga's report. Exit 0 when every step is undone; 1 when it is blocked, awaits an
/// approval (`awaiting-approval`: approve it, then compensate again) or is outstanding: each step
/// says what a person must do.
pub async fn compensate(args: CompensateArgs) -> anyhow::Result<Exit> {
    if let Some(path) = args.ledger.file().filter(|path| !path.exists()) {
        return Err(Usage(format!("no ledger at {}", path.display())).into());
    }
    let mut builder = super::host_at(&args.ledger);
    if let Some(policy) = &args.policy {
        builder = builder.policy_file(PolicyFile::load(policy)?);
    }
    let host = builder.build().await?;
    load_skipping(&host, &args.tools).await?;
    let report = host.compensate(&args.run).await?;
    print_json(&report)?;
    Ok(if report.state == SagaState::Done { Exit::Ok } else { Exit::ToolFailed })
}

/// Loads the directory as `oncebox serve` does: a component that does not load is reported on
/// stderr and skipped, so an unrelated broken file does not stop a compensation. A step whose
/// tool or compensation is missing is reported by the saga itself, as outstanding.
async fn load_skipping(host: &oncebox::Host, dir: &std::path::Path) -> anyhow::Result<()> {
    let entries = std::fs::read_dir(dir).map_err(|e| Usage(format!("--tools {}: {e}", dir.display())))?;
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "wasm"))
        .collect();
    paths.sort();
    for path in paths {
        if let Err(e) = host.load(&path).await {
            eprintln!("oncebox compensate: skipped {}: {e}", path.display());
        }
    }
    Ok(())
}

#[derive(Debug, clap::Args)]
pub struct UndoneByHandArgs {
    #[arg(long)]
    ledger: oncebox::LedgerAt,
    /// The undone step's operation key (`compensate` names it, with `undo-by-hand`).
    key: String,
    /// Who undid it (recorded).
    #[arg(long)]
    by: String,
    /// How, and why (recorded): a refund's reference at the bank, say.
    #[arg(long)]
    note: Option<String>,
}

/// Records a person's word that they undid a step by hand, and prints it. Exit 2 when it is
/// refused (the step's compensation may still undo it, or did): the message says what to do.
pub async fn undone_by_hand(args: UndoneByHandArgs) -> anyhow::Result<Exit> {
    let ledger = super::open_ledger(&args.ledger).await?;
    // The key file opens the values the step sealed, to mask them in the note recorded.
    let keying = oncebox::secret::load_or_create(&super::key_file_of(&args.ledger)?)?;
    let said = oncebox::saga::undone_by_hand(&ledger, &keying, &args.key, &args.by, args.note.as_deref()).await?;
    print_json(&said)?;
    Ok(Exit::Ok)
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
