//! `oncebox call --ledger PATH --run R --step S TOOL.wasm 'JSON'`

use std::path::PathBuf;
use std::time::Duration;

use oncebox::policy_file::PolicyFile;
use oncebox::{Call, Grant, Host, HttpTarget, Status};

use super::{Exit, Usage, print_json};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The ledger: a redb file (created if missing), or a PostgreSQL URL (`postgres://…`) that
    /// other hosts may share (they then need one key file: `$ONCEBOX_KEY_FILE`).
    #[arg(long)]
    pub ledger: oncebox::LedgerAt,
    /// The run id, from the orchestrator's durable state.
    #[arg(long)]
    pub run: Option<String>,
    /// The step id, stable across retries of this step.
    #[arg(long)]
    pub step: Option<String>,
    /// An operator setting for the tool, KEY=VALUE (repeatable).
    #[arg(long = "config", value_name = "KEY=VALUE")]
    pub config: Vec<String>,
    /// A capability for the tool (repeatable): http=ORIGIN, kv=NAMESPACE, outbox=TOPIC,
    /// provider=NAME or dir=HOST_DIR:GUEST_DIR[:ro|rw]. Nothing is granted by default.
    #[arg(long = "grant", value_name = "KIND=VALUE")]
    pub grants: Vec<String>,
    /// A downstream HOST:PORT that honours Idempotency-Key for 24 hours (repeatable), so an
    /// effect whose answer was lost may be resent with its key.
    #[arg(long = "key-target", value_name = "HOST:PORT")]
    pub key_targets: Vec<String>,
    /// The operator's policy file (oncebox.toml): retry settings and config per tool, key
    /// semantics per downstream host. Flags given here win over the file.
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// A PEM certificate to trust for HTTPS downstreams besides the system's roots (repeatable).
    #[arg(long = "tls-root", value_name = "PEM_FILE")]
    pub tls_roots: Vec<PathBuf>,
    /// How long this process's claim on the step holds without renewal before another host may
    /// take the step over (default 60000). A live process renews it while it works.
    #[arg(long, value_name = "MS")]
    pub lease_ms: Option<u64>,
    /// If another caller is running this step, wait up to this many seconds for its result.
    #[arg(long, value_name = "SECS")]
    pub wait: Option<f64>,
    /// How long to wait for a `--key-target`'s answer before the outcome is unknown (default: the
    /// policy file's `timeout` for that host, else 10 s).
    #[arg(long)]
    pub timeout_ms: Option<u64>,
    /// A directory of components to load besides TOOL (reconcile: every tool of a run).
    #[arg(long, value_name = "DIR")]
    pub tools: Option<PathBuf>,
    /// reconcile only: the one unknown operation to reconcile (with --tools DIR).
    #[arg(long, value_name = "KEY")]
    pub operation: Option<String>,
    /// The component file.
    pub tool: Option<PathBuf>,
    /// The args, as JSON.
    pub args: Option<String>,
}

pub async fn run(args: Args) -> anyhow::Result<Exit> {
    let (host, call) = open(args).await?;
    let outcome = host.call(call).await?;
    print_json(&outcome)?;
    Ok(if outcome.status == Status::Completed { Exit::Ok } else { Exit::ToolFailed })
}

/// Builds the host the flags describe, loads the tool and shapes the call.
pub async fn open(args: Args) -> anyhow::Result<(Host, Call)> {
    let mut builder = super::host_at(&args.ledger);
    let file = args.policy.as_deref().map(PolicyFile::load).transpose()?;
    if let Some(ms) = args.lease_ms {
        builder = builder.lease(Duration::from_millis(ms.max(1)));
    }
    let file_hosts: std::collections::HashMap<String, HttpTarget> =
        file.as_ref().map(|file| file.hosts().into_iter().collect()).unwrap_or_default();
    if let Some(file) = file {
        builder = builder.policy_file(file);
    }
    for path in &args.tls_roots {
        let pem = std::fs::read(path).map_err(|e| Usage(format!("--tls-root {}: {e}", path.display())))?;
        builder = builder.tls_root_certificate(pem);
    }
    for target in &args.key_targets {
        // The flag says the host honours keys; everything else the file says of it (its timeout,
        // settle window, credentials) still holds.
        let mut settings = file_hosts.get(target).cloned().unwrap_or_default();
        if !settings.honours_keys || settings.key_retention.is_zero() {
            settings.key_retention = Duration::from_secs(24 * 3600);
        }
        settings.honours_keys = true;
        if let Some(ms) = args.timeout_ms {
            settings.timeout = Duration::from_millis(ms);
        }
        builder = builder.http_target(target.clone(), settings);
    }
    let mut config = Vec::new();
    for pair in &args.config {
        let (key, value) =
            pair.split_once('=').ok_or_else(|| Usage(format!("--config expects KEY=VALUE, got `{pair}`")))?;
        config.push((key.to_string(), value.to_string()));
    }
    let grants = args
        .grants
        .iter()
        .map(|text| text.parse::<Grant>().map_err(|e| Usage(format!("--grant {e}"))))
        .collect::<Result<Vec<_>, _>>()?;
    let host = builder.build().await?;
    if let Some(dir) = &args.tools {
        host.load_dir(dir).await?;
    }
    let (Some(tool), Some(json)) = (args.tool.as_ref(), args.args.clone()) else {
        return Err(Usage("give the component file and its args as JSON: TOOL.wasm 'JSON'".into()).into());
    };
    let manifest = host.load_granting(tool, &grants).await?;
    host.set_tool_config(&manifest.name, config);
    let call = match (args.run, args.step) {
        (Some(run), Some(step)) => {
            let call = Call::step(run, step, &manifest.name, json);
            match args.wait {
                Some(secs) => call.waiting(
                    Duration::try_from_secs_f64(secs).map_err(|_| Usage(format!("--wait {secs}: not a duration")))?,
                ),
                None => call,
            }
        }
        (None, None) => Call::unrecorded(&manifest.name, json),
        _ => return Err(Usage("--run and --step go together".into()).into()),
    };
    // A script's trace context, as OpenTelemetry carries it in a child process's environment.
    let env = |name: &str| std::env::var(name).ok();
    let trace = oncebox::TraceContext::new(env("TRACEPARENT").as_deref(), env("TRACESTATE").as_deref());
    Ok((host, call.traced(trace)))
}
