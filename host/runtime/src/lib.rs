//! oncebox's host: the runtime that loads tool components and runs calls through the pipeline, so
//! that every side effect happens once, however many times an agent, a worker or a network
//! retries the call. The `oncebox` crate (`host/cli`) re-exports it whole, with the example.
//!
//! # Layout
//!
//! The pure rules are `oncebox-core`'s and the ledger is `oncebox-ledger`'s; both are re-exported
//! here under their old names (`keys`, `policy`, `failure`, `retry`, `capabilities`, `limits`,
//! `policy_file`, `ledger`, `secret`, `seal`), so that one path names each rule.
//!
//! - `call`: [`Call`], [`Outcome`], and a call's args validated with its keys (`Prepared`);
//!   `approval_view`: what a person is shown of a request for approval.
//! - `stage`: what the pipeline and its rooms need of the host, and nothing more, so that none of
//!   them reaches back into [`Host`]; one entry per loaded tool.
//! - `runtime/`: the engine (pooling allocator, epochs), the one `bindgen!`, the compile cache,
//!   loading and verifying components, the sandboxed store, one attempt.
//! - `effects/`: the guarded path, then one file per kind of effect; `effects::hooks`: where the
//!   harness (`oncebox-testing`) reaches into the pipeline. `http_client`: the one HTTP client.
//! - `pipeline/`: the call pipeline as named stages (prepare, admit, attempts); `lease`: the
//!   owner's lease kept live while it works; `attempt_log`: its tracing events; `telemetry`: the
//!   one room its stages report their spans to (OpenTelemetry), and the caller's trace context.
//! - `approvals`: asking a person, and binding the answer to the params and the component.
//! - `reconcile`: asking the authority about an unknown outcome, and a person settling one;
//!   `reconciler`: asking again in the background, with backoff, until the proof arrives;
//!   `abandoned`: ending a claim whose owner is gone without running it (for the reconciler,
//!   compensation and a person's word).
//! - `saga`, `recovery`, `retention`: undoing a run, what a restart left, what may be forgotten.
//! - `outbox/`: the relay that delivers outbox messages to their topics' endpoints, in order, at
//!   least once and keyed (its rules are `oncebox_core::delivery`; `send.rs`: one send).
//! - `host`: [`Host`] and [`HostBuilder`]. `error`: the error enums below.
//!
//! # Errors
//!
//! Inside, each operation has its own error enum ([`CallError`], [`LoadError`], [`LedgerError`]),
//! rolled into [`Error`]. A tool that fails is not an error: it is an [`Outcome`] with a status.
//! `anyhow` appears only in the binary.

mod abandoned;
mod approval_view;
pub mod approvals;
mod attempt_log;
mod call;
mod effects;
mod error;
mod host;
mod http_client;
mod lease;
pub mod notify;
pub mod outbox;
mod pipeline;
mod reconcile;
pub mod reconciler;
pub mod recovery;
pub mod retention;
mod runtime;
pub mod saga;
mod stage;
pub mod telemetry;

use oncebox_core::redact;
pub use oncebox_core::{
    capabilities, clock, failure, keys, limits, notice, pages, policy, policy_file, retry, shown, window,
};
pub use oncebox_ledger as ledger;
pub use oncebox_ledger::{seal, secret};

pub use approvals::Decision;
pub use call::{Call, Outcome, Status};
pub use capabilities::{Grant, Grants, Sandbox};
/// Where the harness for tool authors (`oncebox-testing`, re-exported as `oncebox::testing`)
/// reaches into the pipeline: its crash points and its scripted downstream. For the harness only,
/// behind the `harness` feature that it enables: a hook stands in for every downstream, so a host
/// running one keeps none of its promises about the real world. A host built without hooks has
/// none, and each point costs it one branch on `None`.
#[cfg(feature = "harness")]
#[doc(hidden)]
pub use effects::hooks;
pub use effects::{DEFAULT_SEND_BY, DEFAULT_SETTLE_WINDOW, DIVERGED, EffectProvider, HttpTarget, ProviderOutcome};
pub use error::{CallError, Error, LedgerError, LoadError};
pub use host::{DEFAULT_LEASE, Host, HostBuilder};
pub use http_client::install_crypto_provider;
pub use ledger::{Ledger, LedgerAt};
pub use limits::Limits;
pub use outbox::Relay;
pub use policy::{ReplayClass, RetryPolicy};
pub use reconcile::{Reconciliation, RunReconciliation, resolve_command, settle};
pub use reconciler::Reconciler;
pub use redact::{REDACTED, redact};
pub use runtime::{GuestClock, MAX_COMPONENT_BYTES, Origin, ToolManifest};
pub use telemetry::TraceContext;
