//! The Rust API: starting a provider and controlling it from a test.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::faults::{Fault, FaultBoard};
use crate::inflight::InFlight;
use crate::model::Counts;
use crate::server::Server;
use crate::settings::Settings;
use crate::store::Store;

/// The provider's shared state: committed effects, idempotency keys, inventory,
/// settings and armed faults. Start one with [`Provider::start`].
///
/// The store and the in-flight counter are shared with the tasks that commit a
/// `CommitAfterDelay` request, which outlive the connection that accepted it.
#[derive(Debug, Default)]
pub struct Provider {
    pub(crate) store: Arc<Store>,
    pub(crate) faults: FaultBoard,
    pub(crate) in_flight: Arc<InFlight>,
}

impl Provider {
    /// Binds `127.0.0.1:0` and serves a fresh provider on the current tokio runtime.
    pub async fn start() -> std::io::Result<ProviderHandle> {
        Provider::start_on(0).await
    }

    /// Binds `127.0.0.1:port` and serves a fresh provider on the current tokio runtime.
    pub async fn start_on(port: u16) -> std::io::Result<ProviderHandle> {
        let provider = Arc::new(Provider::default());
        let server = Server::start(port, Arc::clone(&provider)).await?;
        Ok(ProviderHandle { provider, server: Arc::new(server) })
    }
}

/// Control of a running provider. Clones share the same provider.
///
/// The server stops when the last clone is dropped, or when any clone calls
/// [`ProviderHandle::shutdown`].
#[derive(Debug, Clone)]
pub struct ProviderHandle {
    provider: Arc<Provider>,
    server: Arc<Server>,
}

impl ProviderHandle {
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// `http://127.0.0.1:PORT`, without a trailing slash.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// Arms a fault after those already armed. A fault with `times == 0` is spent
    /// from the start and has no effect.
    pub fn arm(&self, fault: Fault) {
        self.provider.faults.arm(fault);
    }

    pub fn clear_faults(&self) {
        self.provider.faults.clear();
    }

    /// Replaces the provider-wide [`Settings`], from the next request on.
    pub fn configure(&self, settings: Settings) {
        self.provider.store.configure(settings);
    }

    /// The settings in force.
    pub fn settings(&self) -> Settings {
        self.provider.store.settings()
    }

    /// Effect requests accepted (validated, key claimed, not refused by a fault)
    /// that have neither committed nor been abandoned yet: in practice, those
    /// waiting out a `CommitAfterDelay`, whether or not their client is still there.
    pub fn in_flight(&self) -> usize {
        self.provider.in_flight.count()
    }

    /// Resolves once no request is [in flight](ProviderHandle::in_flight), so that
    /// [`counts`](ProviderHandle::counts) includes every commit the provider
    /// accepted. Resolves at once if none is, so call it after the request has
    /// reached the provider (e.g. after the client gave up on it).
    pub async fn settled(&self) {
        self.provider.in_flight.settled().await;
    }

    /// Effects committed for `order_id` (all zero for an unknown order).
    pub fn counts(&self, order_id: &str) -> Counts {
        self.provider.store.counts(order_id)
    }

    /// Effects committed over all orders.
    pub fn totals(&self) -> Counts {
        self.provider.store.totals()
    }

    /// The `Authorization` header of the latest effect request, if it had one.
    pub fn last_authorization(&self) -> Option<String> {
        self.provider.store.last_authorization()
    }

    /// The `traceparent` header of every effect request received (the latest 1024), in order
    /// (`None` for one without it): the W3C trace context its client sent.
    pub fn traceparents(&self) -> Vec<Option<String>> {
        self.provider.store.traceparents()
    }

    /// POST requests received on the effect routes, whatever became of them
    /// (replays, refusals and bad requests included).
    pub fn requests(&self) -> u64 {
        self.provider.store.effect_requests()
    }

    /// `GET /inventory/{sku}` requests received, whatever became of them (faulted
    /// and malformed ones included). Reads commit nothing, so they are not in [`Counts`].
    pub fn reads(&self) -> u64 {
        self.provider.store.reads()
    }

    /// Units of `sku` available, as `GET /inventory/{sku}` reports them.
    pub fn stock(&self, sku: &str) -> u64 {
        self.provider.store.stock(sku)
    }

    pub fn set_stock(&self, sku: &str, available: u64) {
        self.provider.store.set_stock(sku, available);
    }

    /// Stops the server for every clone of this handle: no new connections, open
    /// ones (including delayed responses) are aborted, and the port is released
    /// when this returns. A `CommitAfterDelay` commit already accepted still lands,
    /// as it would at a downstream whose front end went away: the state outlives
    /// the server, and [`settled`](ProviderHandle::settled) still waits for it.
    pub async fn shutdown(self) {
        self.server.shutdown().await;
    }
}
