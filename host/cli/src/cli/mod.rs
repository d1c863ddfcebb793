//! Subcommands, one file each. Exit codes: 0 the tool completed (or the command succeeded),
//! 1 the tool did not complete (failed, unknown, conflict, in progress), 2 the input was unusable
//! (bad flags, bad args, a refused component), 3 the host failed (ledger, engine).

mod approvals;
mod call;
mod compile;
#[cfg(feature = "demo")]
mod demo;
#[cfg(feature = "demo")]
mod demo_saga;
mod inspect;
mod ledger;
mod new;
mod outbox;
mod policy;
mod reconcile;
mod resolve;
mod saga;
mod serve;
pub mod telemetry;
mod test;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(name = "oncebox", version, about = "Run WebAssembly agent tools so that every side effect happens once")]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show a tool's manifest, imports and exports.
    Inspect(inspect::Args),
    /// Compile components into the compile cache ahead of their first load (all at once).
    Compile(compile::Args),
    /// Call a tool for one step of a run.
    Call(call::Args),
    /// Ask the tool's authority what became of a step whose outcome is unknown; with `--run R
    /// --tools DIR` and no step, every unknown step of the run; with `--watch --tools DIR`, every
    /// unknown operation, again and again with backoff, until stopped.
    Reconcile(reconcile::ReconcileArgs),
    /// Approve a call of an irreversible tool: its operation key and the fingerprint of its params.
    Approve(approvals::DecideArgs),
    /// Reject a call of an irreversible tool: nothing will be dispatched for that step.
    Reject(approvals::DecideArgs),
    /// Requests for approval.
    #[command(subcommand)]
    Approvals(approvals::Command),
    /// Undo a run's completed compensatable steps, in reverse order, each once.
    Compensate(saga::CompensateArgs),
    /// Record that a person undid a step by hand (one `compensate` names `undo-by-hand`, or one
    /// whose compensation has not begun): compensate counts it undone, and dispatches nothing for it.
    UndoneByHand(saga::UndoneByHandArgs),
    /// Report what a restart left, per run, and what a person must decide.
    Recover(saga::RecoverArgs),
    /// Settle by hand an operation whose outcome is unknown: it took place, or it did not.
    Resolve(resolve::Args),
    /// Show the effective retry policy of a tool.
    #[command(subcommand)]
    Policy(policy::Command),
    /// Read the ledger.
    #[command(subcommand)]
    Ledger(ledger::Command),
    /// Deliver outbox messages to their topics' endpoints, or list them with their delivery.
    #[command(subcommand)]
    Outbox(outbox::Command),
    /// Serve the tools of a directory to agents (MCP), orchestrators (HTTP API) and operators
    /// (the console at `/`), on one ledger, until stopped.
    Serve(serve::Args),
    /// Write a new tool crate: the tool, a policy file and a harness test.
    New(new::Args),
    /// Run a tool under the harness: a scripted downstream, and with --explore a crash at every
    /// point of every effect, checking that nothing happened twice.
    Test(test::Args),
    /// Lose the first charge response of a few orders: a naive retry loop charges twice, oncebox once.
    #[cfg(feature = "demo")]
    Demo(demo::Args),
}

/// A host builder for the ledger at `at`, with the CLI's compile cache and, from
/// `$ONCEBOX_KEY_FILE`, the fingerprint key that hosts sharing a ledger must all be given.
pub fn host_at(at: &oncebox::LedgerAt) -> oncebox::HostBuilder {
    let builder = cached(oncebox::HostBuilder::at(at.clone()));
    match key_file() {
        Some(file) => builder.key_file(file),
        None => builder,
    }
}

/// `$ONCEBOX_KEY_FILE`, if set.
pub fn key_file() -> Option<PathBuf> {
    std::env::var_os("ONCEBOX_KEY_FILE").filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// The fingerprint key's file of the ledger at `at`: `$ONCEBOX_KEY_FILE`, else beside a ledger
/// file; a shared ledger has no default (every host must be given the same file).
pub fn key_file_of(at: &oncebox::LedgerAt) -> anyhow::Result<PathBuf> {
    match (key_file(), at.file()) {
        (Some(file), _) => Ok(file),
        (None, Some(path)) => Ok(oncebox::secret::beside(path)),
        (None, None) => Err(Usage(format!("{at} is shared by hosts: set ONCEBOX_KEY_FILE to their key file")).into()),
    }
}

/// Opens an existing ledger for a command that reads or decides: a file that is not there is a
/// mistake in the command, not a ledger to create.
pub async fn open_ledger(at: &oncebox::LedgerAt) -> anyhow::Result<oncebox::Ledger> {
    if let Some(path) = at.file().filter(|path| !path.exists()) {
        return Err(Usage(format!("no ledger at {}", path.display())).into());
    }
    Ok(at.open().await?)
}

/// Gives a host the CLI's compile cache, so the second run of a command loads its component in
/// milliseconds: `$ONCEBOX_CACHE` (`off` for none), else `$XDG_CACHE_HOME/oncebox`, else
/// `$HOME/.cache/oncebox`.
pub fn cached(builder: oncebox::HostBuilder) -> oncebox::HostBuilder {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    let dir = match var("ONCEBOX_CACHE") {
        Some(dir) if dir.as_os_str() == "off" => None,
        Some(dir) => Some(dir),
        None => var("XDG_CACHE_HOME").or_else(|| var("HOME").map(|h| h.join(".cache"))).map(|d| d.join("oncebox")),
    };
    match dir {
        Some(dir) => builder.compile_cache(dir),
        None => builder,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Ok = 0,
    ToolFailed = 1,
    Usage = 2,
    Host = 3,
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> Self {
        ExitCode::from(e as u8)
    }
}

pub async fn run(command: Command) -> Exit {
    let result = match command {
        Command::Inspect(args) => inspect::run(args).await,
        Command::Compile(args) => compile::run(args).await,
        Command::Call(args) => call::run(args).await,
        Command::Reconcile(args) => reconcile::run(args).await,
        Command::Resolve(args) => resolve::run(args).await,
        Command::Approve(args) => approvals::decide_run(args, true).await,
        Command::Reject(args) => approvals::decide_run(args, false).await,
        Command::Approvals(command) => approvals::run(command).await,
        Command::Compensate(args) => saga::compensate(args).await,
        Command::UndoneByHand(args) => saga::undone_by_hand(args).await,
        Command::Recover(args) => saga::recover(args).await,
        Command::Ledger(command) => ledger::run(command).await,
        Command::Outbox(command) => outbox::run(command).await,
        Command::Policy(command) => policy::run(command).await,
        Command::Test(args) => test::run(args).await,
        Command::New(args) => new::run(args).await,
        Command::Serve(args) => serve::run(args).await,
        #[cfg(feature = "demo")]
        Command::Demo(args) => demo::run(args).await,
    };
    match result {
        Ok(exit) => exit,
        Err(e) => {
            eprintln!("error: {e:#}");
            exit_for(&e)
        }
    }
}

/// Blames the input or the host, from the error's type.
fn exit_for(e: &anyhow::Error) -> Exit {
    use oncebox::LedgerError;
    use oncebox::policy_file::PolicyError;
    use oncebox::{CallError, Error, LoadError};
    let usage = |e: &Error| {
        matches!(e, Error::Load(l) if !matches!(l, LoadError::Engine(_)))
            || matches!(e, Error::DuplicateTool { .. } | Error::Policy(_) | Error::PolicyRefused { .. })
            || matches!(e, Error::Ledger(l) if l.is_unusable_ledger())
    };
    let call_usage = |e: &CallError| match e {
        CallError::Ledger(l) => {
            l.is_unusable_ledger() || matches!(l, LedgerError::NotInDoubt { .. } | LedgerError::Ambiguous { .. })
        }
        _ => true,
    };
    // A file given as the ledger that is not a usable one is the caller's input.
    if e.downcast_ref::<Error>().is_some_and(usage)
        || e.downcast_ref::<CallError>().is_some_and(call_usage)
        || e.downcast_ref::<LedgerError>().is_some_and(LedgerError::is_unusable_ledger)
        || e.downcast_ref::<Usage>().is_some()
        || e.downcast_ref::<PolicyError>().is_some()
    {
        Exit::Usage
    } else {
        Exit::Host
    }
}

/// Resolves at the first SIGINT or SIGTERM (on other systems, Ctrl-C).
pub async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match (signal(SignalKind::interrupt()), signal(SignalKind::terminate())) {
            (Ok(mut interrupt), Ok(mut terminate)) => {
                tokio::select! {
                    _ = interrupt.recv() => {}
                    _ = terminate.recv() => {}
                }
            }
            // Without the handlers the default action (ending the process) still applies, and
            // what it stops survives that: the relay's answers and the server's records are on
            // disk, but for an effect's answer riding with the next durable write on redb, whose
            // loss leaves its effect in doubt.
            _ => std::future::pending::<()>().await,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// A usage error found by a subcommand rather than by clap.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Usage(pub String);

/// Crates whose logs below a level carry the payloads they move (rmcp logs every MCP request
/// and response at debug, a `tools/call`'s arguments among them), and that level: whatever
/// `ONCEBOX_LOG` asks, nothing more verbose of theirs is written, so no tool argument or answer
/// reaches a log through them (SECURITY.md).
const PAYLOAD_LOGGERS: [(&str, tracing::Level); 1] = [("rmcp", tracing::Level::INFO)];

pub fn init_logging(format: LogFormat) {
    use tracing_subscriber::prelude::*;
    let filter = tracing_subscriber::EnvFilter::try_from_env("ONCEBOX_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let quiet = tracing_subscriber::filter::filter_fn(|meta| {
        !PAYLOAD_LOGGERS.iter().any(|(krate, most)| {
            let target = meta.target();
            let theirs = target.strip_prefix(krate).is_some_and(|rest| rest.is_empty() || rest.starts_with("::"));
            // In tracing, a more verbose level is the greater one.
            theirs && meta.level() > most
        })
    });
    // Colours only for a person at a terminal: a file or a pipe gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(ansi);
    let layer: Box<dyn tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync> = match format {
        LogFormat::Text => Box::new(layer),
        LogFormat::Json => Box::new(layer.json()),
    };
    tracing_subscriber::registry().with(layer.with_filter(filter).with_filter(quiet)).init();
}

/// Prints a value as one line of JSON on stdout. A character that would hide from the reader (a bidi override in a param, say: `shown`) is
/// printed as its JSON escape: the same value to a JSON reader, and what a person reads at a
/// terminal is what is stored.
pub fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    use std::io::Write as _;
    let line = serde_json::to_string(value)?;
    match writeln!(std::io::stdout().lock(), "{}", oncebox::shown::reveal(&line)) {
        Ok(()) => Ok(()),
        // The reader went away (`| head`): nothing more to say to it, and nothing to complain of,
        // as any filter in a pipe ends.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    /// clap checks a command's definition only when it is parsed: a mistake (two flattened
    /// structs whose argument groups share a name, say) would otherwise show first to a user.
    #[test]
    fn every_subcommand_is_well_formed() {
        <super::Cli as clap::CommandFactory>::command().debug_assert();
    }
}
