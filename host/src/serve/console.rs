//! The operator console (filled in by the console work).

use std::sync::Arc;

use axum::Router;

use super::app::App;

pub fn routes() -> Router<Arc<App>> {
    Router::new()
}
