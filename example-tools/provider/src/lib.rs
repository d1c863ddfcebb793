//! A real loopback HTTP/1.1 provider of payments, refunds, fulfillments and
//! inventory, used by oncebox's integration tests and demo as the downstream
//! that tools call.
//!
//! It behaves like a Stripe-style API with `Idempotency-Key` semantics, and it
//! can be told to misbehave (see [`FaultKind`]): lose a response after
//! committing, delay one, rate-limit, or fail before committing. The inventory
//! read `GET /inventory/{sku}` can be faulted too ([`Route::Inventory`], matched
//! by SKU), and [`ProviderHandle::reads`] counts the reads received. Above all it
//! counts the effects it actually committed, per order ([`Counts`]), so a test
//! can check that "exactly once" really was exactly once, whatever the client
//! believed.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use oncebox_example_provider::{Fault, FaultKind, Provider, Route};
//!
//! let provider = Provider::start().await?;
//! provider.arm(Fault::new(Route::Payments, FaultKind::LoseResponse));
//! // ... point the client at provider.base_url() and run it ...
//! assert_eq!(provider.counts("order-1").payments, 1);
//! # Ok(()) }
//! ```
//!
//! The HTTP API (all bodies JSON; errors are `{"error": code, "message": text}`):
//!
//! | route | what it does |
//! | --- | --- |
//! | `POST /payments`, `/refunds`, `/fulfillments` | commit an effect; honour `Idempotency-Key` |
//! | `GET /{payments,refunds,fulfillments}/by-key/{key}` | the response committed under a key, or 404 |
//! | `GET /inventory/{sku}` | read stock (faults on route `inventory` apply; nothing is committed) |
//! | `POST /inventory/{sku}` | set stock (an admin route, not an effect; never faulted) |
//! | `GET /counts`, `GET /counts/{order_id}` | committed effects, in total or for one order |
//! | `POST /faults`, `DELETE /faults` | arm a [`Fault`], or clear them all |
//!
//! Module map: `handle` is the Rust API, `server` accepts and
//! serves connections, `routes` dispatches requests, `effects` runs the effect
//! pipeline (key, fault, commit), `store` holds state and idempotency keys,
//! `faults` the armed faults, `http` the JSON and body plumbing.

mod effects;
mod faults;
mod handle;
mod http;
mod model;
mod routes;
mod server;
mod store;

pub use faults::{Fault, FaultKind};
pub use handle::{Provider, ProviderHandle};
pub use model::{Counts, Route};
