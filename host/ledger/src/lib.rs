//! The durable record of operations, effects and attempts, behind a narrow interface.
//!
//! [`Store`] is exactly what the call pipeline needs of a ledger: claim, reopen, renew, write an
//! effect ahead and record its answer, record an attempt (and finish the operation), resolve, and
//! read committed state. Nothing in it assumes that one process owns the store: a claim, a take-over
//! and every fence check are decided by the store. [`Ledger`] is the handle the host holds, cheap to
//! clone, over any store. Three backends implement it:
//!
//! - `redb/`: the embedded redb file (group commit, claims in memory until their first durable
//!   write: an optimisation one process owning the file allows, and that the trait does not see);
//! - `postgres/`: a PostgreSQL database shared by many hosts (every claim, take-over and fence
//!   decided by the database, in the transaction that writes it; nothing recovered at connect);
//! - `reference`: a plain in-memory model written to be obviously right, the oracle the conformance
//!   suite and the model-based test compare the other backends with.
//!
//! The rules every backend applies (who gets an operation, when a finish is refused) live here,
//! in [`verdict`] and [`refused_finish`], once; what keeps a run open is `run_state`'s. A
//! backend may keep an index of what that rule calls open with every state change
//! ([`Store::open_runs`]: redb's `open` table, PostgreSQL's `oncebox_open`), so that what runs in
//! the background or draws a view reads the open work or the page it asked for
//! ([`Store::runs_page`]), never the whole history; and retention reads what is older than its
//! cutoff through indexes by age ([`Store::ended_before`], [`Store::approvals_before`],
//! [`Store::delivered_before`]), each kept in the transaction of the write it follows.
//!
//! # Layout
//!
//! - `store`: the [`Store`] trait and what its callers bring and get (claims, local writes).
//! - `handle`: [`Ledger`], the handle over any store, and [`Journal`], an attempt's view of it.
//! - `rules`: what every backend decides the same way, written once.
//! - `records`: the records; `error`: [`LedgerError`]; `run_state`: what keeps a run open;
//!   `location`: where a ledger is ([`LedgerAt`]); `latency`: how long durable writes take.
//!
//! Beside the ledger: `secret`, the fingerprint key kept beside it, and its rotation; `seal`, an
//! approval's sensitive params sealed under that key. No wasmtime: the ledger knows records, not
//! components.

mod error;
mod handle;
mod latency;
mod location;
pub mod postgres;
mod records;
pub mod redb;
pub mod reference;
mod rules;
pub mod run_state;
pub mod seal;
pub mod secret;
mod store;

pub use error::LedgerError;
pub use handle::{Journal, Ledger};
pub use latency::{Latency, LatencySnapshot};
pub use location::LedgerAt;
pub use records::*;
pub use rules::*;
pub use run_state::{Open, Why};
pub use store::*;
