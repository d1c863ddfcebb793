//! oncebox's pure rules: what every other crate asks and none restates. No wasmtime, no storage,
//! no async runtime; each module is tested alone.
//!
//! # Layout
//!
//! - `keys`: operation and effect keys, fingerprints, canonical JSON.
//! - `policy`: replay classes and their retry policies (the one class check).
//! - `failure`: the rule of evidence (what proves an effect was not taken), and every way an
//!   attempt or an HTTP exchange can end, mapped to a class.
//! - `retry`: `decide(failure, policy, attempt, elapsed, jitter)`.
//! - `capabilities`: what each tool is granted, and the denial that names the missing grant.
//! - `limits`: per-attempt resource limits, their defaults and ceilings.
//! - `redact`: sensitive values out of records and logs.
//! - `shown`: characters that hide from a reader, and stored text shown with them escaped.
//! - `targets`: what the operator says about each downstream HTTP host.
//! - `delivery`: the outbox relay's rules: what an endpoint's answer means, how long to wait.
//! - `reconcile_schedule`: when to ask again about an unknown operation.
//! - `policy_file/`: the operator's `oncebox.toml`, checked with file:line errors.
//! - `clock`: ms stamps: this host's wall clock (the one read of the system here; records are
//!   judged by their ledger's clock) and how they are shown.
//! - `window`: named moments inside a store's synchronous functions, where the whole-system
//!   simulator (and only it: the `simulate` feature) lets another thread's work finish.

pub mod capabilities;
pub mod clock;
pub mod delivery;
pub mod failure;
pub mod keys;
pub mod limits;
pub mod notice;
pub mod pages;
pub mod policy;
pub mod policy_file;
pub mod reconcile_schedule;
pub mod redact;
pub mod retry;
pub mod shown;
pub mod targets;
pub mod window;
