//! `oncebox resolve --ledger L KEY (--committed JSON | --not-committed) --by NAME [--note TEXT]`:
//! a person settles an operation whose outcome is unknown, recorded with who and why.

use oncebox::ledger::Resolution;

use super::{Exit, print_json};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[arg(long)]
    ledger: oncebox::LedgerAt,
    /// The unknown operation's key (`oncebox call` printed it; `oncebox ledger list` shows it).
    key: String,
    /// The effect in doubt that did not take place; needed with --not-committed when the
    /// operation has several.
    #[arg(long)]
    effect: Option<String>,
    /// The operation took place; JSON is its output, as the tool would have returned it. Every
    /// effect of it still in doubt is settled with it.
    #[arg(long, value_name = "JSON", conflicts_with = "not_committed", required_unless_present = "not_committed")]
    committed: Option<String>,
    /// It did not take place: the next call of the step runs it again, with the same keys.
    #[arg(long)]
    not_committed: bool,
    /// Who decides (recorded).
    #[arg(long)]
    by: String,
    /// Why (recorded).
    #[arg(long)]
    note: Option<String>,
}

pub async fn run(args: Args) -> anyhow::Result<Exit> {
    let ledger = super::open_ledger(&args.ledger).await?;
    let resolution = match args.committed {
        Some(output) => Resolution::Committed { output },
        None => Resolution::NotCommitted,
    };
    // The key file opens the values the operation sealed, to mask them in the output given.
    let keying = oncebox::secret::load_or_create(&super::key_file_of(&args.ledger)?)?;
    let (effect, note) = (args.effect.as_deref(), args.note.as_deref());
    let outcome = oncebox::settle(&ledger, &keying, &args.key, effect, &resolution, &args.by, note).await?;
    print_json(&outcome)?;
    Ok(Exit::Ok)
}
