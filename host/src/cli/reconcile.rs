//! `oncebox reconcile --ledger PATH --run R --step S TOOL.wasm 'JSON'`: the same flags as `call`.

use oncebox::Reconciliation;

use super::{Exit, call, print_json};

pub async fn run(args: call::Args) -> anyhow::Result<Exit> {
    let (host, call) = call::open(args).await?;
    let reconciliation = host.reconcile(call).await?;
    print_json(&reconciliation)?;
    Ok(match reconciliation {
        Reconciliation::StillUnknown { .. } => Exit::ToolFailed,
        _ => Exit::Ok,
    })
}
