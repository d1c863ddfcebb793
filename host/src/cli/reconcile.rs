//! `oncebox reconcile --ledger PATH --run R --step S TOOL.wasm 'JSON'`: the same flags as `call`.

use oncebox::Reconciliation;

use super::{Exit, call, print_json};

pub async fn run(args: call::Args) -> anyhow::Result<Exit> {
    let ledger = args.ledger.clone();
    if args.step.is_none() && args.tool.is_none() {
        return run_wide(args).await;
    }
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

/// `oncebox reconcile --ledger L --run R --tools DIR [--policy F]`: every unknown step of a run.
async fn run_wide(args: call::Args) -> anyhow::Result<Exit> {
    let (Some(run), Some(dir)) = (args.run.clone(), args.tools.clone()) else {
        return Err(super::Usage(
            "reconcile a run with --run R --tools DIR, or a step with --run R --step S TOOL.wasm 'JSON'".into(),
        )
        .into());
    };
    let mut builder = super::cached(oncebox::Host::builder(&args.ledger));
    if let Some(policy) = &args.policy {
        builder = builder.policy_file(oncebox::policy_file::PolicyFile::load(policy)?);
    }
    let host = builder.build().await?;
    host.load_dir(&dir).await?;
    let answers = host.reconcile_run(&run).await?;
    let open = answers.iter().filter(|a| a.settle_by_hand.is_some()).count();
    print_json(&serde_json::json!({ "run_id": run, "reconciled": answers, "need_a_person": open }))?;
    Ok(if open == 0 { Exit::Ok } else { Exit::ToolFailed })
}
