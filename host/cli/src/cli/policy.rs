//! `oncebox policy show TOOL.wasm [--policy FILE]`

use std::path::PathBuf;

use oncebox::Host;
use oncebox::policy_file::PolicyFile;

use super::{Exit, print_json};

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// The retry policy a tool would run under and where each value came from, and what the tool
    /// is granted and its limits.
    Show {
        /// The component file.
        tool: PathBuf,
        /// The operator's policy file.
        #[arg(long)]
        policy: Option<PathBuf>,
    },
}

pub async fn run(command: Command) -> anyhow::Result<Exit> {
    let Command::Show { tool, policy } = command;
    let file = policy.as_deref().map(PolicyFile::load).transpose()?.unwrap_or_else(PolicyFile::empty);
    let host = super::cached(Host::builder_in_memory()).policy_file(file).build().await?;
    let manifest = host.load(&tool).await?;
    let effective = host.policy(&manifest.name).ok_or_else(|| anyhow::anyhow!("{} has no policy", manifest.name))?;
    let mut json = effective.to_json();
    json["tool"] = manifest.name.clone().into();
    json["class"] = manifest.class.as_str().into();
    if let Some(sandbox) = host.sandbox(&manifest.name) {
        json["grants"] = sandbox.grants.to_json();
        json["limits"] = serde_json::to_value(sandbox.limits)?;
    }
    print_json(&json)?;
    Ok(Exit::Ok)
}
