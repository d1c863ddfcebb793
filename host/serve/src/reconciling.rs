//! The server's background reconciler (`oncebox_runtime::reconciler`): on unless the policy file says
//! `[reconciler] enabled = false`; each try counted in `/metrics`
//! (`oncebox_reconcile_tries_total{tool,result}`) and logged by the reconciler itself.
//!
//! On a ledger several servers share, each runs one: the ledger's `resolve` is a compare-and-set,
//! so one settlement of an operation is recorded and the other servers' tries count as
//! `settled-elsewhere`, not as failures.

use std::sync::Arc;

use super::app::App;

/// Starts the reconciler beside the calls, until the server stops taking them.
pub fn spawn(app: &Arc<App>) {
    let settings = app.host.reconciler_settings();
    if !settings.enabled {
        tracing::info!("the reconciler is off ([reconciler] enabled = false): unknowns wait for `reconcile`");
        return;
    }
    // The observer holds the app for its metrics; the app holds nothing of the reconciler.
    let counted = app.clone();
    let reconciler = app.host.reconciler(settings).on_try(move |tried| {
        counted.metrics.reconcile_try(&tried.tool, tried.result);
    });
    let stop = app.shutdown.clone();
    tokio::spawn(reconciler.run(stop.cancelled_owned()));
}
