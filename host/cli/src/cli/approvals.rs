//! `oncebox approve`, `oncebox reject` and `oncebox approvals list|show`: a person decides on a
//! call of an irreversible tool, bound to its operation key, the fingerprint of its params and
//! the component that will run them (`--component`, required to approve; both as `approvals show`
//! shows them). The lists show each request's state as
//! of now: an approval past its expiry is `expired`.

use oncebox::approvals::{ApprovalView, Decision, decide_on, reveal};
use oncebox::ledger::ApprovalRecord;
use oncebox::{Ledger, keys::FingerprintKey};

use super::{Exit, Usage, print_json};

#[derive(Debug, clap::Args)]
pub struct DecideArgs {
    #[arg(long)]
    ledger: oncebox::LedgerAt,
    /// The operation key (`oncebox call` printed it with `awaiting-approval`).
    key: String,
    /// The fingerprint of the params you decide on, as `approvals show` shows it.
    #[arg(long)]
    fingerprint: String,
    /// The component you decide on (its digest, `sha256:...`, as `approvals show` shows it):
    /// refused if the request now names another, because the tool was replaced since you looked.
    /// Required to approve: a person approves what they saw, never whatever runs by then.
    #[arg(long)]
    component: Option<String>,
    /// Who decides (recorded).
    #[arg(long)]
    by: String,
    /// Why (recorded).
    #[arg(long)]
    note: Option<String>,
    /// Approve only for this long (say `30m`); unused by then, it lets nothing through.
    #[arg(long, value_parser = humantime::parse_duration)]
    expires_in: Option<std::time::Duration>,
}

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// One line of JSON per request for approval.
    List {
        #[arg(long)]
        ledger: oncebox::LedgerAt,
        #[arg(long)]
        run: Option<String>,
        /// Only those awaiting a decision.
        #[arg(long)]
        pending: bool,
    },
    /// A request with its exact params; `--reveal` opens its sealed sensitive values with the
    /// ledger's key file (they are never in the ledger or the logs in the clear).
    Show {
        #[arg(long)]
        ledger: oncebox::LedgerAt,
        key: String,
        #[arg(long)]
        reveal: bool,
    },
}

pub async fn decide_run(args: DecideArgs, approve: bool) -> anyhow::Result<Exit> {
    let ledger = super::open_ledger(&args.ledger).await?;
    let decision = if approve {
        let expires_ms = args.expires_in.map(|d| ledger.now_ms().saturating_add(d.as_millis() as u64));
        Decision::Approve { expires_ms }
    } else {
        Decision::Reject
    };
    if approve && args.component.is_none() {
        return Err(super::Usage(
            "approve needs --component (the digest `approvals show` shows): an approval binds the component that \
             will run"
                .into(),
        )
        .into());
    }
    let component = args.component.as_deref();
    // To approve sealed params is to have read them: with the key that opens them, as `approvals
    // show --reveal` does (the approval is refused without it; a rejection needs none).
    let keying = if approve { ledger_key(&args.ledger) } else { Err("a rejection reads none".into()) };
    let record = decide_on(
        &ledger,
        keying.as_ref().map_err(String::as_str),
        &args.key,
        &args.fingerprint,
        component,
        decision,
        &args.by,
        args.note.as_deref(),
    )
    .await?;
    print_json(&view(&record, &ledger))?;
    Ok(Exit::Ok)
}

pub async fn run(command: Command) -> anyhow::Result<Exit> {
    match command {
        Command::List { ledger: path, run, pending } => {
            let ledger = super::open_ledger(&path).await?;
            for record in ledger.approvals(run.as_deref()).await? {
                let used = ledger.operation(&record.operation_key).await?.is_some();
                if pending && (used || record.state != oncebox::ledger::ApprovalState::Pending) {
                    continue;
                }
                let mut line = view(&record, &ledger);
                line["used"] = used.into();
                print_json(&line)?;
            }
        }
        Command::Show { ledger: path, key, reveal: open_sealed } => {
            let ledger = super::open_ledger(&path).await?;
            let record =
                ledger.approval(&key).await?.ok_or_else(|| Usage(format!("no request for approval of {key}")))?;
            let mut shown = view(&record, &ledger);
            if open_sealed {
                let key = ledger_key(&path).map_err(|e| Usage(format!("--reveal needs {e}")))?;
                shown["params"] = reveal(&record, &key).map_err(|e| Usage(format!("cannot reveal: {e}")))?;
                shown["revealed"] = true.into();
            }
            print_json(&shown)?;
        }
    }
    Ok(Exit::Ok)
}

/// The key of the ledger at `path`, read (never created): the ledger's key file, or why not.
fn ledger_key(path: &oncebox::LedgerAt) -> Result<FingerprintKey, String> {
    let key_file = super::key_file_of(path).map_err(|e| format!("the ledger's key file ({e})"))?;
    let text =
        std::fs::read_to_string(&key_file).map_err(|e| format!("the ledger's key file {}: {e}", key_file.display()))?;
    FingerprintKey::parse(&text).map_err(|e| format!("the ledger's key file {}: {e}", key_file.display()))
}

fn view(record: &ApprovalRecord, ledger: &Ledger) -> serde_json::Value {
    let mut value = serde_json::to_value(ApprovalView::of(record, ledger)).unwrap_or_default();
    value["operation_key"] = record.operation_key.clone().into();
    value["fingerprint"] = record.fingerprint.clone().into();
    value
}
