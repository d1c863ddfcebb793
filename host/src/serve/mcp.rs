//! MCP (filled in by the MCP work).

use std::sync::Arc;

use axum::Router;

use super::app::App;

pub fn routes(_app: Arc<App>) -> Router<Arc<App>> {
    Router::new()
}

pub async fn serve_stdio(_app: Arc<App>) -> anyhow::Result<()> {
    anyhow::bail!("MCP over stdio is not built yet")
}
