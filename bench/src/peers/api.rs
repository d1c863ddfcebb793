//! oncebox behind its HTTP API: the `oncebox serve` router (`POST /v1/calls`) over the bench's
//! host, on loopback, driven by the same HTTP client as Restate's ingress. Not a key of the issue:
//! the row that compares oncebox and Restate through the same kind of front door, a server that
//! a client reaches over HTTP.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use oncebox::Host;
use oncebox_serve::{App, Loaded, MAX_CALLS};
use serde_json::{Value, json};

use super::{Measured, Workload, drive};

/// The API on a free loopback port, served until the process ends; its base URL.
pub async fn serve(host: &Host, dir: &Path) -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.context("binding the API's port")?;
    let addr = listener.local_addr().context("the API's address")?;
    // An empty tools directory, scanned once (so the server is ready) and never again: the host's
    // tools are loaded already.
    let tools = dir.join("api-tools");
    std::fs::create_dir_all(&tools).with_context(|| format!("creating {}", tools.display()))?;
    let token = oncebox_serve::generate_token().map_err(|e| anyhow::anyhow!("a token for the API: {e}"))?;
    let app = App::for_http(host.clone(), token, None, addr, None, Loaded::new(tools), MAX_CALLS);
    app.loaded().scan(host, false).await;
    // The server's own router and listener, with its default limits: what `oncebox serve` runs.
    let limits = oncebox_serve::ConnectionLimits::default();
    let router = oncebox_serve::router(&app, limits, oncebox_serve::MAX_MCP_SESSIONS);
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn(async move {
        if let Err(e) = oncebox_serve::serve(listener, router, limits, stop).await {
            eprintln!("the bench's oncebox API stopped: {e}");
        }
    });
    Ok(format!("http://{addr}"))
}

/// The workload, each step a `POST /v1/calls` of the `charge` tool with the order as the step.
pub async fn measure(base: &str, w: &Workload, prefix: &str) -> anyhow::Result<Measured> {
    let client =
        reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(30)).build().context("the HTTP client")?;
    let url = Arc::new(format!("{base}/v1/calls"));
    drive(w, prefix, move |order| {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let args = crate::host_runs::order(&order);
            let body = json!({"run_id": "charge-api", "step_id": order, "tool": "charge", "args": args});
            let response = client
                .post(url.as_str())
                .header("content-type", "application/json")
                .body(body.to_string())
                .send()
                .await
                .with_context(|| format!("oncebox's API, step {order}"))?;
            let status = response.status();
            let text = response.bytes().await?;
            anyhow::ensure!(
                status.is_success(),
                "oncebox's API answered {status} to step {order}: {}",
                String::from_utf8_lossy(&text)
            );
            let outcome: Value = serde_json::from_slice(&text).with_context(|| format!("the answer to {order}"))?;
            anyhow::ensure!(outcome["status"] == "completed", "oncebox's API answered step {order} with {outcome}");
            Ok(())
        }
    })
    .await
}
