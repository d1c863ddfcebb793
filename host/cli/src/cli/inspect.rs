//! `oncebox inspect TOOL.wasm`

use std::path::PathBuf;

use oncebox::Host;

use super::{Exit, print_json};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The component file.
    pub tool: PathBuf,
}

pub async fn run(args: Args) -> anyhow::Result<Exit> {
    let host = super::cached(Host::builder_in_memory()).build().await?;
    let manifest = host.load(&args.tool).await?;
    let (imports, exports) = host.interface(&manifest.name).unwrap_or_default();
    print_json(&serde_json::json!({
        "name": manifest.name,
        "version": manifest.version,
        "description": manifest.description,
        "class": manifest.class,
        "compensated_by": manifest.compensated_by,
        "compensation_args": manifest.compensation_args.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
        "consequence": manifest.consequence,
        "sensitive": manifest.sensitive,
        "input_schema": manifest.input_schema,
        "imports": imports,
        "exports": exports,
    }))?;
    Ok(Exit::Ok)
}
