//! `oncebox test TOOL.wasm --args JSON [--script FILE.toml] [--explore]`: the harness
//! (`oncebox::testing`) from the command line.

use std::path::PathBuf;

use oncebox::Grant;
use oncebox::testing::{Harness, HarnessError, Script};

use super::{Exit, Usage};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The component file.
    pub tool: PathBuf,
    /// The args of the call, as JSON.
    #[arg(long)]
    pub args: String,
    /// What the scripted downstream answers (see `oncebox::testing::Script`); without it every
    /// effect is answered 200 with its own body.
    #[arg(long)]
    pub script: Option<PathBuf>,
    /// Crash the host at every point of every effect (and fault every answer), restart, call
    /// again, reconcile, and check that nothing happened twice.
    #[arg(long)]
    pub explore: bool,
    /// The operator's policy file: the tool's config, grants, limits and retry settings.
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// An operator setting for the tool, KEY=VALUE (repeatable).
    #[arg(long = "config", value_name = "KEY=VALUE")]
    pub config: Vec<String>,
    /// A capability for the tool (repeatable), as for `oncebox call`.
    #[arg(long = "grant", value_name = "KIND=VALUE")]
    pub grants: Vec<String>,
}

/// The host's own errors keep their exit codes (a refused component is unusable input, 2).
fn unwrapped(e: HarnessError) -> anyhow::Error {
    match e {
        HarnessError::Host(e) => e.into(),
        HarnessError::Policy(e) => e.into(),
        HarnessError::Call(e) => e.into(),
        e => e.into(),
    }
}

pub async fn run(args: Args) -> anyhow::Result<Exit> {
    let mut harness = Harness::new(&args.tool).map_err(unwrapped)?;
    if let Some(path) = &args.script {
        harness = harness.script(Script::load(path).map_err(|e| Usage(format!("--script {e}")))?);
    }
    if let Some(path) = &args.policy {
        harness = harness.policy_file(path);
    }
    for pair in &args.config {
        let (key, value) =
            pair.split_once('=').ok_or_else(|| Usage(format!("--config expects KEY=VALUE, got `{pair}`")))?;
        harness = harness.config(key, value);
    }
    for text in &args.grants {
        harness = harness.grant(text.parse::<Grant>().map_err(|e| Usage(format!("--grant {e}")))?);
    }
    serde_json::from_str::<serde_json::Value>(&args.args).map_err(|e| Usage(format!("--args is not JSON: {e}")))?;

    if !args.explore {
        let run = harness.run(&args.args, None).await.map_err(unwrapped)?;
        crate::cli::print_json(&run.outcome)?;
        for dispatch in &run.dispatches {
            println!(
                "sent `{}`#{} {} {} -> {}{}",
                dispatch.label,
                dispatch.occurrence,
                dispatch.method,
                dispatch.url,
                dispatch.answer,
                if dispatch.landed { " (landed)" } else { "" }
            );
        }
        return Ok(if run.outcome.is_completed() { Exit::Ok } else { Exit::ToolFailed });
    }

    let report = harness.explore(&args.args).await.map_err(unwrapped)?;
    print!("{report}");
    if report.passed() {
        return Ok(Exit::Ok);
    }
    for (row, violation) in report.violations() {
        eprintln!("error: invariant broken: effect {} at {}: {violation}", row.effect, row.point);
    }
    Ok(Exit::ToolFailed)
}
