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
//! Real downstreams are worse than an ideal Stripe, so it can also misbehave the
//! ways they do, for tests that prove a client never turns "maybe happened" into
//! "failed" or into a second commit:
//!
//! - [`FaultKind::CommitThenError`] commits, then answers an error status (502 by
//!   default) like a gateway that lost the origin's answer; a resend with the key
//!   is replayed when keys are honoured.
//! - [`FaultKind::CommitAfterDelay`] accepts, waits, and only then commits, even
//!   if the client has given up and gone; until then the key is in flight (409 on
//!   a resend, 404 on a lookup). [`FaultKind::Delay`] is the other order: commit,
//!   then answer late, which with a shorter client timeout is "committed, then
//!   answered after the client gave up".
//! - [`Settings`] ([`ProviderHandle::configure`], `POST /settings`) can stop it
//!   honouring keys (`honour_keys`), stop lookups by key (`lookup_by_key`), forget
//!   keys some time after their commit (`key_retention_ms`), and make lookups lag
//!   behind commits (`lookup_lag_ms`).
//!
//! Counts stay the truth throughout: every commit is counted, including one a
//! `CommitAfterDelay` makes after its client left. [`ProviderHandle::in_flight`]
//! and [`ProviderHandle::settled`] let a test wait for such commits before counting.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use oncebox_example_provider::{Fault, FaultKind, Provider, Route, Settings};
//!
//! let provider = Provider::start().await?;
//! provider.arm(Fault::new(Route::Payments, FaultKind::LoseResponse));
//! provider.arm(Fault::new(Route::Payments, FaultKind::CommitAfterDelay { delay_ms: 2000 }));
//! provider.configure(Settings { lookup_lag_ms: 300, ..Settings::default() });
//! // ... point the client at provider.base_url() and run it ...
//! provider.settled().await;
//! assert_eq!(provider.counts("order-1").payments, 1);
//! # Ok(()) }
//! ```
//!
//! The HTTP API (all bodies JSON; errors are `{"error": code, "message": text}`):
//!
//! | route | what it does |
//! | --- | --- |
//! | `POST /payments`, `/refunds`, `/fulfillments` | commit an effect; honour `Idempotency-Key` (unless [`Settings`] say not) |
//! | `GET /{payments,refunds,fulfillments}/by-key/{key}` | the latest response committed under a key, or 404 (also while in flight, lagging or forgotten) |
//! | `GET /inventory/{sku}` | read stock (faults on route `inventory` apply; nothing is committed) |
//! | `POST /inventory/{sku}` | set stock (an admin route, not an effect; never faulted) |
//! | `GET /counts`, `GET /counts/{order_id}` | committed effects, in total or for one order |
//! | `POST /faults`, `DELETE /faults` | arm a [`Fault`], or clear them all |
//! | `GET /settings`, `POST /settings` | the [`Settings`] in force, or replace them (omitted fields take defaults); both answer the settings |
//!
//! Faults over HTTP, for a test in another process, e.g.
//! `{"route": "payments", "kind": "commit-then-error", "status": 504}` or
//! `{"route": "refunds", "order_id": "o-1", "kind": "commit-after-delay", "delay_ms": 2000}`;
//! settings e.g. `{"honour_keys": false, "lookup_by_key": false}` or
//! `{"key_retention_ms": 500, "lookup_lag_ms": 300}`.
//!
//! Module map: `handle` is the Rust API, `server` accepts and
//! serves connections, `routes` dispatches requests, `effects` runs the effect
//! pipeline (key, fault, commit), `store` holds state, idempotency keys and the
//! lookup index, `settings` the provider-wide settings, `inflight` counts accepted
//! requests not yet committed, `faults` the armed faults, `http` the JSON and body
//! plumbing.

mod effects;
mod faults;
mod handle;
mod http;
mod inflight;
mod model;
mod routes;
mod server;
mod settings;
mod store;

pub use faults::{Fault, FaultKind};
pub use handle::{Provider, ProviderHandle};
pub use model::{Counts, Route};
pub use settings::Settings;
