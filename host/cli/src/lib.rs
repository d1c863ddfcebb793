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
//!   backends, the reference model and the conformance suite. No wasmtime.
//! - `oncebox-runtime` (`host/runtime`): the engine, loading, effects, the call pipeline,
//!   approvals, reconciliation, saga, recovery, retention, the outbox relay and [`Host`];
//!   re-exported here whole, so `oncebox::Host`, `oncebox::keys` and `oncebox::ledger` name its
//!   items and the rules it re-exports.
//! - `oncebox-testing` (`host/testing`): the harness for tool authors, as [`testing`].
//! - `oncebox-serve` (`host/serve`): `oncebox serve`'s API, MCP, console and metrics; used by the
//!   binary only.
//!
//! # Errors
//!
//! Inside, each operation has its own error enum ([`CallError`], [`LoadError`], [`LedgerError`]),
//! rolled into [`Error`]. A tool that fails is not an error: it is an [`Outcome`] with a status.
//! `anyhow` appears only in the binary.

pub use oncebox_runtime::*;
pub use oncebox_testing as testing;
