//! `oncebox reconcile --ledger PATH --run R --step S TOOL.wasm 'JSON'` (the same flags as `call`),
//! or `--run R --tools DIR` for every unknown step of a run, or `--operation KEY --tools DIR`, or
//! `--watch --tools DIR` for every unknown operation, asked again with backoff until SIGINT or
//! SIGTERM (what `oncebox serve` runs in the background).

use std::io::Write;

use oncebox::Reconciliation;

use super::{Exit, call, print_json};

#[derive(Debug, clap::Args)]
pub struct ReconcileArgs {
    #[command(flatten)]
    pub call: call::Args,
    /// Keep reconciling every unknown operation whose tool is in --tools DIR and exports
    /// `reconcile`, asking again with backoff (the policy file's `[reconciler]`), until SIGINT or
    /// SIGTERM; one line of JSON per try. What `oncebox serve` does in the background.
    #[arg(long)]
    pub watch: bool,
}

pub async fn run(args: ReconcileArgs) -> anyhow::Result<Exit> {
    if args.watch {
        return watch(args.call).await;
    }
    let args = args.call;
    let ledger = args.ledger.clone();
    if args.step.is_none() && args.tool.is_none() {
        return run_wide(args).await;
    }
    let (run, step) = (args.run.clone().unwrap_or_default(), args.step.clone().unwrap_or_default());
    let (host, call) = call::open(args).await?;
    let reconciliation = host.reconcile(call).await?;
    if let Reconciliation::NotUnknown { outcome: None } = reconciliation {
        // Nothing on record for this step: not an answer to print as if it were one.
        return Err(super::Usage(format!(
            "no operation of this tool for run `{run}` step `{step}` in the ledger: nothing to reconcile"
        ))
        .into());
    }
    print_json(&reconciliation)?;
    Ok(match reconciliation {
        Reconciliation::StillUnknown { operation_key, .. } => {
            // What a person needs when no lookup can decide: the command that settles it by hand.
            eprintln!(
                "still unknown; once you know what happened, settle it by hand: {}",
                oncebox::resolve_command(&ledger, &operation_key)
            );
            Exit::ToolFailed
        }
        _ => Exit::Ok,
    })
}

/// `oncebox reconcile --ledger L (--run R | --operation KEY) --tools DIR [--policy F]`: every
/// unknown step of a run, or one operation, from the records.
async fn run_wide(args: call::Args) -> anyhow::Result<Exit> {
    let host = wide_host(&args).await?;
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

/// The host of `--tools DIR` (and `--policy F`) on the ledger, every component of DIR loaded.
async fn wide_host(args: &call::Args) -> anyhow::Result<oncebox::Host> {
    let Some(dir) = args.tools.clone() else {
        return Err(super::Usage(
            "reconcile a run with --run R --tools DIR, an operation with --operation KEY --tools DIR, a step \
             with --run R --step S TOOL.wasm 'JSON', or every unknown operation with --watch --tools DIR"
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
    Ok(host)
}

/// `oncebox reconcile --watch --ledger L --tools DIR [--policy F]`: the server's background
/// reconciler in the foreground, until SIGINT or SIGTERM. The policy file's `[reconciler]` sets
/// its pace; `enabled = false` there turns off a server's, not this one, which was asked for.
async fn watch(args: call::Args) -> anyhow::Result<Exit> {
    let narrowing = [
        ("--run", args.run.is_some()),
        ("--step", args.step.is_some()),
        ("--operation", args.operation.is_some()),
        ("TOOL.wasm", args.tool.is_some()),
    ];
    if let Some((flag, _)) = narrowing.iter().find(|(_, given)| *given) {
        let reason = format!("--watch reconciles every unknown operation whose tool is in --tools DIR: drop {flag}");
        return Err(super::Usage(reason).into());
    }
    let host = wide_host(&args).await?;
    let settings = host.reconciler_settings();
    eprintln!(
        "oncebox reconcile --watch: asking about every unknown operation of {} tools (first after {}, at most every \
         {}); stop with Ctrl-C",
        host.tools().len(),
        humantime::format_duration(settings.first),
        humantime::format_duration(settings.max)
    );
    let reconciler = host.reconciler(settings).on_try(|tried| {
        // Written, not `println!`ed: a closed stdout (the reader went away) is no reason to stop
        // settling what can be, nor to panic.
        if let Ok(line) = serde_json::to_string(tried) {
            let _ = writeln!(std::io::stdout().lock(), "{}", oncebox::shown::reveal(&line));
        }
    });
    reconciler.run(super::stop_signal()).await;
    Ok(Exit::Ok)
}
