//! `oncebox reconcile --ledger PATH --run R --step S TOOL.wasm 'JSON'` (the same flags as `call`),
//! or `--run R --tools DIR` for every unknown step of a run, or `--operation KEY --tools DIR`.

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
                ledger
            );
            Exit::ToolFailed
        }
        _ => Exit::Ok,
    })
}

/// `oncebox reconcile --ledger L (--run R | --operation KEY) --tools DIR [--policy F]`: every
/// unknown step of a run, or one operation, from the records.
async fn run_wide(args: call::Args) -> anyhow::Result<Exit> {
    let Some(dir) = args.tools.clone() else {
        return Err(super::Usage(
            "reconcile a run with --run R --tools DIR, an operation with --operation KEY --tools DIR, or a step \
             with --run R --step S TOOL.wasm 'JSON'"
                .into(),
        )
        .into());
    };
    let mut builder = super::host_at(&args.ledger);
    if let Some(policy) = &args.policy {
        builder = builder.policy_file(oncebox::policy_file::PolicyFile::load(policy)?);
    }
    let host = builder.build().await?;
    host.load_dir(&dir).await?;
    let (run, answers) = match (&args.operation, &args.run) {
        (Some(key), _) => {
            let answer = host.reconcile_operation(key).await?;
            let answer = answer.ok_or_else(|| super::Usage(format!("no operation with key {key}")))?;
            let run = host.ledger().operation(key).await?.map(|op| op.run_id).unwrap_or_default();
            (run, vec![answer])
        }
        (None, Some(run)) => (run.clone(), host.reconcile_run(run).await?),
        (None, None) => return Err(super::Usage("give --run R or --operation KEY".into()).into()),
    };
    let open = answers.iter().filter(|a| a.settle_by_hand.is_some()).count();
    print_json(&serde_json::json!({ "run_id": run, "reconciled": answers, "need_a_person": open }))?;
    Ok(if open == 0 { Exit::Ok } else { Exit::ToolFailed })
}
