//! `oncebox reconcile --ledger PATH --run R --step S TOOL.wasm 'JSON'`: the same flags as `call`.

use oncebox::Reconciliation;

use super::{Exit, call, print_json};

pub async fn run(args: call::Args) -> anyhow::Result<Exit> {
    let ledger = args.ledger.clone();
    let (host, call) = call::open(args).await?;
    let reconciliation = host.reconcile(call).await?;
    print_json(&reconciliation)?;
    Ok(match reconciliation {
        Reconciliation::StillUnknown { operation_key, .. } => {
            // What a person needs when no lookup can decide: the command that settles it by hand.
            eprintln!(
                "still unknown; once you know what happened, settle it by hand: oncebox resolve --ledger {} {operation_key} \
                 (--committed 'OUTPUT JSON' | --not-committed) --by NAME [--note WHY]",
                ledger.display()
            );
            Exit::ToolFailed
        }
        _ => Exit::Ok,
    })
}
