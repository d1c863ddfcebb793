//! `oncebox serve --tools DIR --ledger L [--policy FILE] [--listen ADDR]`: one long-running host
//! for agents (MCP over streamable HTTP at `/mcp`, or over stdio with `--stdio`), orchestrators
//! (the HTTP API at `/v1`, described at `/openapi.json`) and operators (the console at `/`).
//! The server's parts are the `oncebox-serve` crate; this file reads the arguments, opens the
//! host and puts them together.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use oncebox::policy_file::PolicyFile;
use oncebox_serve::{App, Loaded};

use crate::cli::{Exit, Usage};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The directory of components (`*.wasm`); watched, so tools can be added, replaced and
    /// removed while serving.
    #[arg(long, value_name = "DIR")]
    pub tools: PathBuf,
    /// The ledger: a redb file (created if missing), or a PostgreSQL URL.
    #[arg(long)]
    pub ledger: oncebox::LedgerAt,
    /// The operator's policy file (oncebox.toml): grants, config, retries, downstream hosts.
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// Where to listen. Beyond loopback every request needs the operator's token.
    #[arg(long, default_value = "127.0.0.1:7420")]
    pub listen: SocketAddr,
    /// The URL browsers and clients reach this server at, when it is not `http://LISTEN` (behind a
    /// proxy, or listening on `0.0.0.0`): the console takes decisions only from this origin (and
    /// its own loopback address and port), and links to approvals name it.
    #[arg(long, value_name = "URL")]
    pub public_url: Option<url::Url>,
    /// Serve MCP over stdin and stdout instead of HTTP (an agent starts the server itself).
    #[arg(long)]
    pub stdio: bool,
    /// A file holding the operator's token (else `$ONCEBOX_TOKEN`, else one is made up and
    /// printed on stderr). Approving and settling always need it.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// A file holding the callers' token (else `$ONCEBOX_CALLER_TOKEN`; none by default): it may
    /// call tools, read (sensitive values masked) and reconcile, beyond loopback too, and decide
    /// nothing. Give it to agents and orchestrators instead of the operator's.
    #[arg(long, value_name = "FILE")]
    pub caller_token_file: Option<PathBuf>,
    /// On SIGINT or SIGTERM, how long running calls may take to finish; what still runs then is
    /// left to the recovery of the next start.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub grace: Duration,
    /// How long a claim holds without renewal (ms); a live server renews it while it works.
    #[arg(long, value_name = "MS")]
    pub lease_ms: Option<u64>,
    /// Do not deliver the outbox here. By default a server delivers the messages its tools
    /// enqueue to the policy file's `[outbox.TOPIC]` endpoints; on a ledger several servers share,
    /// each topic is sent by one of them at a time (a lease in the database).
    #[arg(long)]
    pub no_relay: bool,
    /// How many calls may run at once; more are refused (503) before anything is recorded.
    #[arg(long, default_value_t = oncebox_serve::MAX_CALLS)]
    pub max_calls: usize,
    /// The largest request body, in bytes, on every route (MCP included).
    #[arg(long, default_value_t = oncebox_serve::MAX_BODY)]
    pub max_body: usize,
    /// How long a request's head may take from the moment its connection is idle; it bounds an
    /// idle keep-alive connection too, so a proxy's upstream pool should idle for less.
    /// [default: 30s]
    #[arg(long, value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub header_timeout: Option<Duration>,
    /// How many connections may be open at once; one more is answered 503 and closed. The
    /// process's open-file limit is raised to its hard limit at start, and this is kept below it.
    #[arg(long, default_value_t = oncebox_serve::MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// How many MCP sessions may be open at once; a request that would open one more is answered
    /// 503. A session ends when its client closes it or after 5 minutes idle.
    #[arg(long, default_value_t = oncebox_serve::MAX_MCP_SESSIONS)]
    pub max_mcp_sessions: usize,
}

pub async fn run(args: Args) -> anyhow::Result<Exit> {
    let mut builder = crate::cli::host_at(&args.ledger);
    let policy = args.policy.as_deref().map(PolicyFile::load).transpose()?;
    let topics = policy.as_ref().map_or(0, |file| file.outbox_endpoints().len());
    if let Some(file) = policy {
        builder = builder.policy_file(file);
    }
    if let Some(ms) = args.lease_ms {
        builder = builder.lease(Duration::from_millis(ms.max(1)));
    }
    if !args.tools.is_dir() {
        return Err(Usage(format!("--tools {}: not a directory", args.tools.display())).into());
    }
    let token = token(&args)?;
    let caller = caller_token(&args, &token)?;
    // Opening the ledger recovers what a stopped server left: this start is its recovery.
    let host = builder.build().await?;
    // The tools are loaded by the server's first scan, compiling them all at once while it
    // already answers (`starting` until then; a call waits for it).
    let loaded = Loaded::new(args.tools.clone());
    if args.stdio {
        let app = App::for_stdio(host, token, loaded, args.max_calls);
        tokio::spawn(oncebox_serve::watch(app.clone()));
        relay(&app, topics, args.no_relay)?;
        oncebox_serve::spawn_reconciler(&app);
        eprintln!("oncebox serve: MCP on stdio; tools from {}", args.tools.display());
        oncebox_serve::serve_stdio(app.clone()).await?;
        return Ok(finish(&app, args.grace).await);
    }
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| Usage(format!("--listen {}: {e}", args.listen)))?;
    let addr = listener.local_addr().context("the listening address")?;
    if let Some(why) = plain_http(addr, args.public_url.as_ref()) {
        tracing::warn!(listen = %addr, "oncebox serve: {why}");
    }
    let app = App::for_http(host, token, caller, addr, args.public_url.as_ref(), loaded, args.max_calls);
    let base_url = app.base_url().to_string();
    tokio::spawn(oncebox_serve::watch(app.clone()));
    relay(&app, topics, args.no_relay)?;
    oncebox_serve::spawn_reconciler(&app);
    let limits = oncebox_serve::ConnectionLimits {
        max_connections: connection_cap(args.max_connections),
        header_timeout: args.header_timeout.unwrap_or(oncebox_serve::HEADER_TIMEOUT),
        body_timeout: oncebox_serve::BODY_TIMEOUT,
        max_body: args.max_body,
    };
    let router = oncebox_serve::router(&app, limits, args.max_mcp_sessions);
    // The address on stdout as one line of JSON (port 0 picks a free one), for whoever started us.
    crate::cli::print_json(&serde_json::json!({
        "listening": format!("http://{addr}"), "mcp": format!("{base_url}/mcp"), "console": format!("{base_url}/"),
    }))?;
    eprintln!(
        "oncebox serve: {base_url} (MCP at /mcp, API at /v1, console at /); loading tools from {}",
        args.tools.display()
    );
    let shutdown = app.shutdown();
    let mut server = tokio::spawn(oncebox_serve::serve(listener, router, limits, shutdown));
    tokio::select! {
        () = crate::cli::stop_signal() => {}
        ended = &mut server => {
            ended.context("the server task")?.context("serving HTTP")?;
            return Ok(finish(&app, args.grace).await);
        }
    }
    // Answered requests are written out before the process ends: the listener closes each connection
    // once its request is answered, within the grace period.
    let started = tokio::time::Instant::now();
    app.stop_taking_calls();
    if tokio::time::timeout(args.grace, server).await.is_err() {
        eprintln!("oncebox serve: connections still open after {:?}; closing them", args.grace);
    }
    Ok(finish(&app, args.grace.saturating_sub(started.elapsed())).await)
}

/// Where the token and the console's sign-in (both sent with every request that needs them) would
/// cross a network in the clear, if they would.
fn plain_http(addr: SocketAddr, public: Option<&url::Url>) -> Option<&'static str> {
    match public {
        Some(url) if url.scheme() != "https" => Some(
            "the public URL is plain HTTP: the token and the console's sign-in cross the network in the clear; \
             give --public-url https://NAME behind a TLS proxy",
        ),
        _ if addr.ip().is_loopback() => None,
        None => Some(
            "listening beyond loopback in plain HTTP: the token and the console's sign-in cross the network in the \
             clear; put a TLS proxy in front and start with --public-url https://NAME",
        ),
        Some(_) => Some(
            "listening beyond loopback in plain HTTP: the hop from the TLS proxy to this listener carries the token \
             in the clear; keep it on a network you trust, or listen on loopback beside the proxy",
        ),
    }
}

/// A token from `file`, else from the variable `var`: at least 16 characters; `None` if neither.
fn given_token(file: Option<&PathBuf>, flag: &str, var: &str) -> anyhow::Result<Option<String>> {
    let (token, from) = if let Some(path) = file {
        let text = std::fs::read_to_string(path).map_err(|e| Usage(format!("{flag} {}: {e}", path.display())))?;
        (text.trim().to_string(), format!("{flag} {}", path.display()))
    } else if let Some(token) = std::env::var(var).ok().filter(|t| !t.trim().is_empty()) {
        (token.trim().to_string(), format!("${var}"))
    } else {
        return Ok(None);
    };
    if token.len() < 16 {
        return Err(Usage(format!("{from}: a token needs at least 16 characters")).into());
    }
    Ok(Some(token))
}

/// The callers' token, if given: never the operator's (it would decide).
fn caller_token(args: &Args, operator: &str) -> anyhow::Result<Option<String>> {
    let caller = given_token(args.caller_token_file.as_ref(), "--caller-token-file", "ONCEBOX_CALLER_TOKEN")?;
    if caller.as_deref() == Some(operator) {
        return Err(Usage("the callers' token is the operator's: give callers a token of their own".into()).into());
    }
    Ok(caller)
}

/// The operator's token: `--token-file`, `$ONCEBOX_TOKEN`, or a new one printed on stderr.
fn token(args: &Args) -> anyhow::Result<String> {
    if let Some(token) = given_token(args.token_file.as_ref(), "--token-file", "ONCEBOX_TOKEN")? {
        return Ok(token);
    }
    if !args.stdio && !args.listen.ip().is_loopback() {
        return Err(Usage(format!(
            "--listen {} is beyond loopback: give the operator's token with --token-file or $ONCEBOX_TOKEN",
            args.listen
        ))
        .into());
    }
    let token = oncebox_serve::generate_token().map_err(|e| anyhow::anyhow!("a random token: {e}"))?;
    // On stdio no request could carry it (MCP decides nothing): printing it would only put a
    // credential in a log.
    if !args.stdio {
        eprintln!("oncebox serve: operator token (for approving, and the console's sign-in): {token}");
    }
    Ok(token)
}

/// File descriptors kept for what is not a connection: the ledger, the compile cache, the
/// tools directory, outbound requests to downstreams, PostgreSQL's pool.
const RESERVED_FILES: u64 = 256;

/// `wanted` connections, or fewer if the open-file limit cannot hold them beside what the
/// server needs otherwise: the soft limit is raised to the hard one first (systemd's default
/// soft limit, 1,024, is a fraction of what a server can hold), and a cap the limit cannot hold
/// is lowered, and said, so that a connection too many is answered 503 instead of the listener
/// failing to accept anything at all.
fn connection_cap(wanted: usize) -> usize {
    #[cfg(unix)]
    {
        use rustix::process::{Resource, getrlimit, setrlimit};
        let mut limit = getrlimit(Resource::Nofile);
        if limit.current < limit.maximum {
            let raised = rustix::process::Rlimit { current: limit.maximum, maximum: limit.maximum };
            match setrlimit(Resource::Nofile, raised) {
                Ok(()) => limit = getrlimit(Resource::Nofile),
                Err(e) => eprintln!("oncebox serve: the open-file limit stays at {:?} ({e})", limit.current),
            }
        }
        if let Some(files) = limit.current {
            let room = usize::try_from(files.saturating_sub(RESERVED_FILES)).unwrap_or(usize::MAX).max(1);
            if room < wanted {
                eprintln!(
                    "oncebox serve: the open-file limit ({files}) holds {room} connections beside the server's own \
                     files; --max-connections {wanted} is lowered to {room}"
                );
                return room;
            }
        }
        wanted
    }
    #[cfg(not(unix))]
    wanted
}

/// Stops taking calls and lets the running ones finish within `grace`: what still runs then is
/// left to the next start's recovery, and the exit says so.
async fn finish(app: &Arc<App>, grace: Duration) -> Exit {
    match oncebox_serve::finish(app, grace).await {
        0 => Exit::Ok,
        running => {
            eprintln!(
                "oncebox serve: {running} calls still running after the grace period; their steps are left to the next start's recovery"
            );
            Exit::ToolFailed
        }
    }
}

/// Delivers the outbox beside the calls until the server stops, unless told not to or no topic
/// has an endpoint.
fn relay(app: &Arc<App>, topics: usize, off: bool) -> anyhow::Result<()> {
    if off || topics == 0 {
        return Ok(());
    }
    oncebox_serve::relay(app).map_err(|e| Usage(format!("the outbox relay: {e}")).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_is_said_wherever_the_token_would_cross_a_network_in_the_clear() {
        let url = |u: &str| url::Url::parse(u).expect("url");
        let (loopback, anywhere) = ("127.0.0.1:7420".parse().expect("addr"), "0.0.0.0:7420".parse().expect("addr"));
        assert_eq!(plain_http(loopback, None), None);
        assert_eq!(plain_http(loopback, Some(&url("https://ops.example"))), None);
        assert!(plain_http(loopback, Some(&url("http://ops.example"))).is_some_and(|w| w.contains("public URL")));
        assert!(plain_http(anywhere, None).is_some_and(|w| w.contains("TLS proxy in front")));
        assert!(plain_http(anywhere, Some(&url("https://ops.example"))).is_some_and(|w| w.contains("hop")));
    }
}
