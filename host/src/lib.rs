//! oncebox: a WebAssembly component host for sandboxed agent tools in which every side effect
//! happens once, however many times an agent, a worker or a network retries the call.
//!
//! ```no_run
//! # async fn demo() -> Result<(), oncebox::Error> {
//! use oncebox::{Call, Host};
//! let host = Host::builder("ledger.redb").build().await?;
//! host.load("charge.wasm").await?;
//! let args = r#"{"order_id":"o1","amount_cents":1200,"currency":"eur","payment_method":"pm_card"}"#;
//! let outcome = host.call(Call::step("run-1", "charge-o1", "charge", args)).await?;
//! println!("{:?} replayed={}", outcome.status, outcome.replayed);
//! # Ok(()) }
//! ```
//!
//! # Layout
//!
//! - `call`: [`Call`] and [`Outcome`].
//! - `keys`: operation and effect keys, fingerprints, canonical JSON (pure).
//! - `policy`: replay classes and their retry policies (pure).
//! - `capabilities`: what each tool is granted, and the denial that names the missing grant (pure).
//! - `limits`: per-attempt resource limits, their defaults and ceilings (pure).
//! - `policy_file/`: the operator's `oncebox.toml`, checked with file:line errors (pure).
//! - `failure`: the rule of evidence (what proves an effect was not taken), and every way an
//!   attempt or an HTTP exchange can end, mapped to a class (pure).
//! - `retry`: `decide(failure, policy, attempt, elapsed, jitter)` (pure).
//! - `redact`: sensitive values out of records and logs (pure).
//! - `secret`: the fingerprint key kept beside the ledger, and its rotation.
//! - `ledger/`: the `Store` trait (exactly what the pipeline needs), the `Ledger` handle over
//!   any store, the `Journal` effects write through, the records and the rules every backend
//!   applies; `redb/` (tables, recovery, fencing, live claims, the group-commit writer),
//!   `postgres/` (the schema, the transactional jobs, LISTEN/NOTIFY; a ledger many hosts share)
//!   and `reference.rs` (the in-memory model the conformance suite and the model-based test
//!   compare the others with).
//! - `runtime/`: the engine (pooling allocator, epochs), the one `bindgen!`, the compile cache,
//!   loading and verifying components, the sandboxed store, one attempt.
//! - `effects/`: the guarded path, then one file per kind of effect.
//! - `executor`: the call pipeline, top to bottom; `lease`: the owner's lease kept live while it
//!   works; `attempt_log`: its tracing events.
//! - `reconcile`: asking the authority about an unknown outcome, and a person settling one;
//!   `reconciler`: asking again in the background, with backoff, until the proof arrives.
//! - `outbox/`: the relay that delivers outbox messages to their topics' endpoints, in order, at
//!   least once and keyed (`rules.rs`, pure: what an answer means, how long to wait; `send.rs`:
//!   one send).
//! - `host`: [`Host`] and [`HostBuilder`].
//! - `testing/`: the harness for tool authors: the real pipeline and ledger, a scripted
//!   downstream, crash points and exploration (its hooks are `effects/hooks.rs`).
//!
//! # Errors
//!
//! Inside, each operation has its own error enum ([`CallError`], [`LoadError`], [`LedgerError`]),
//! rolled into [`Error`]. A tool that fails is not an error: it is an [`Outcome`] with a status.
//! `anyhow` appears only in the binary.

pub mod approvals;
mod attempt_log;
mod call;
pub mod capabilities;
mod clock;
mod effects;
mod error;
mod executor;
pub mod failure;
mod host;
pub mod keys;
mod lease;
pub mod ledger;
pub mod limits;
pub mod outbox;
pub mod policy;
pub mod policy_file;
mod reconcile;
pub mod reconciler;
pub mod recovery;
mod redact;
pub mod retention;
pub mod retry;
mod runtime;
pub mod saga;
pub mod seal;
pub mod secret;
mod stage;
pub mod testing;

pub use approvals::Decision;
pub use call::{Call, Outcome, Status};
pub use capabilities::{Grant, Grants, Sandbox};
pub use effects::{DEFAULT_SEND_BY, DEFAULT_SETTLE_WINDOW, EffectProvider, HttpTarget, ProviderOutcome};
pub use error::{CallError, Error, LedgerError, LoadError};
pub use host::{DEFAULT_LEASE, Host, HostBuilder};
pub use ledger::{Ledger, LedgerAt};
pub use limits::Limits;
pub use outbox::Relay;
pub use policy::{ReplayClass, RetryPolicy};
pub use reconcile::{Reconciliation, RunReconciliation, settle};
pub use reconciler::Reconciler;
pub use redact::{REDACTED, redact};
pub use runtime::{MAX_COMPONENT_BYTES, ToolManifest};
