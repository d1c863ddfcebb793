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
//! This crate is the door: the library embedders use, and the `oncebox` binary (`main.rs`, the
//! CLI in `cli/`, one file per subcommand). The library gathers the crates that do the work under
//! one name:
//!
//! - `oncebox-core` (`host/core`): the pure rules: keys and fingerprints, the rule of evidence,
//!   replay classes and the retry matrix, redaction, limits, capabilities, the policy file.
//! - `oncebox-ledger` (`host/ledger`): the `Store` trait, records, the redb and PostgreSQL
//!   backends and the reference model. No wasmtime. (The conformance suite that holds every
//!   backend to the reference model is `tests/integration/conformance.rs`.)
//! - `oncebox-runtime` (`host/runtime`): the engine, loading, effects, the call pipeline,
//!   approvals, reconciliation, saga, recovery, retention, the outbox relay and [`Host`];
//!   re-exported here, so `oncebox::Host`, `oncebox::keys` and `oncebox::ledger` name its items
//!   and the rules it re-exports.
//! - `oncebox-testing` (`host/testing`): the harness for tool authors, as [`testing`].
//! - `oncebox-serve` (`host/serve`): `oncebox serve`'s API, MCP, console and metrics; used by the
//!   binary only.
//!
//! # Errors
//!
//! Inside, each operation has its own error enum ([`CallError`], [`LoadError`], [`LedgerError`]),
//! rolled into [`Error`]. A tool that fails is not an error: it is an [`Outcome`] with a status.
//! `anyhow` appears only in the binary.

// The API embedders and tool authors write against, named one by one (not a glob): the runtime's
// harness hooks are not part of it.
pub use oncebox_runtime::{Call, CallError, Ledger, LedgerAt, LedgerError};
pub use oncebox_runtime::{
    DEFAULT_LEASE, DEFAULT_SEND_BY, DEFAULT_SETTLE_WINDOW, Decision, EffectProvider, Error, Grant, Grants, Host,
    HostBuilder, HttpTarget, Limits, LoadError, MAX_COMPONENT_BYTES, Outcome, ProviderOutcome, REDACTED, Reconciler,
    Reconciliation, Relay, ReplayClass, RetryPolicy, RunReconciliation, Sandbox, Status, ToolManifest, TraceContext,
    install_crypto_provider, redact, resolve_command, settle,
};
pub use oncebox_runtime::{
    approvals, capabilities, failure, keys, ledger, limits, notice, notify, outbox, policy, policy_file, reconciler,
    recovery, retention, retry, saga, seal, secret, shown, telemetry,
};
pub use oncebox_testing as testing;
