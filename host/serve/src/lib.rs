//! The parts of `oncebox serve`: one long-running host for agents (MCP over streamable HTTP at
//! `/mcp`, or over stdio), orchestrators (the HTTP API at `/v1`, described at `/openapi.json`) and
//! operators (the console at `/`). The `oncebox serve` subcommand (the binary's `cli/serve.rs`)
//! reads its arguments and puts these together.
//!
//! # Layout
//!
//! - `app`: what the front doors share, and the one way they call a tool.
//! - `api`, `openapi`: the HTTP API and its description. `mcp`: the MCP server. `console/`: the
//!   operator's pages. `metrics`: `/metrics`. `error`: refusals as JSON.
//! - `auth`: who may do what, from where (the operator's token, the one host/origin allow-list);
//!   `guard`: the middleware every front door passes. `listen`: connections, their timeouts and
//!   caps.
//! - `reload`: the tools directory, watched. `reconciling`: the background reconciler.

mod api;
mod app;
mod auth;
mod console;
mod error;
mod guard;
mod listen;
mod mcp;
mod metrics;
mod openapi;
mod page;
mod reconciling;
mod reload;

use std::sync::Arc;
use std::time::Duration;

pub use app::{App, MAX_CALLS};
pub use auth::generate as generate_token;
pub use listen::{BODY_TIMEOUT, ConnectionLimits, HEADER_TIMEOUT, MAX_BODY, MAX_CONNECTIONS, serve};
pub use mcp::{MAX_SESSIONS as MAX_MCP_SESSIONS, serve_stdio};
pub use reconciling::spawn as spawn_reconciler;
pub use reload::Loaded;

/// The HTTP front doors on one router: the API, the console and MCP, behind the one guard of
/// hosts and origins, with every request's body read within `limits` before a route sees it.
pub fn router(app: &Arc<App>, limits: ConnectionLimits, max_mcp_sessions: usize) -> axum::Router {
    api::routes()
        .merge(console::routes())
        // `listen::bounded_body` has read the body within `max_body` already.
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(axum::middleware::from_fn_with_state(limits, listen::bounded_body))
        // MCP reads its body after its own token check (`mcp::routes`), so that a stranger beyond
        // loopback is refused before anything of a body is held.
        .merge(mcp::routes(app.clone(), max_mcp_sessions, limits))
        .layer(axum::middleware::from_fn_with_state(app.clone(), guard::same_site))
        .with_state(app.clone())
}

/// Stops taking calls and lets the running ones finish within `grace`; how many still run then
/// (0: they all finished).
pub async fn finish(app: &Arc<App>, grace: Duration) -> usize {
    app.stop_taking_calls();
    if app.drained(grace).await {
        return 0;
    }
    app.in_flight().max(1)
}

/// Delivers the outbox beside the calls until the server stops: a server holds its ledger file,
/// so no `oncebox outbox deliver` could open it meanwhile. A send under way at the stop is
/// completed and recorded first (`Relay::run`).
pub fn relay(app: &Arc<App>) -> Result<(), oncebox_runtime::outbox::RelayError> {
    let relay = app.host.outbox_relay()?;
    let stop = app.shutdown.clone();
    tokio::spawn(async move {
        if let Err(e) = relay.run(stop.cancelled_owned()).await {
            tracing::error!(error = %e, "the outbox relay stopped; messages wait in the ledger for the next one");
        }
    });
    Ok(())
}

/// Keeps the tools directory loaded: at once (the first scan, which the server is `starting`
/// until), then every `SCAN_EVERY`, and at once on SIGHUP.
pub async fn watch(app: Arc<App>) {
    let loaded = app.loaded.scan(&app.host, false).await;
    tracing::info!(files = loaded, tools = app.host.tools().len(), dir = %app.loaded.dir().display(), "tools loaded");
    #[cfg(unix)]
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    loop {
        #[cfg(unix)]
        {
            let hup = async {
                match hangup.as_mut() {
                    Some(signal) => signal.recv().await,
                    None => std::future::pending().await,
                }
            };
            let hung_up = tokio::select! {
                _ = hup => true,
                () = tokio::time::sleep(reload::SCAN_EVERY) => false,
            };
            app.loaded.scan(&app.host, hung_up).await;
        }
        #[cfg(not(unix))]
        {
            tokio::time::sleep(reload::SCAN_EVERY).await;
            app.loaded.scan(&app.host, false).await;
        }
    }
}
