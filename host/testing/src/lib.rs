//! A harness for tool authors: "what happens if the host dies right after my effect was sent?"
//!
//! [`Harness`] loads a component and runs calls through the real pipeline (its stages, the
//! guarded effect path, the retry matrix of the tool's class and policy) on a real redb ledger in
//! a temporary directory. Only the downstream is replaced: a [`Script`] answers every HTTP effect
//! by label and occurrence (a response, a fault, a delay) and every read, and records each request
//! that reached it. [`Harness::run`] runs one scenario, with a crash at a [`Point`] or a [`Fault`]
//! in one effect's answer; a crash drops the call, the host and every in-memory state, cuts the
//! host off from its ledger file as a killed process is (so an answer riding with the next durable
//! commit is lost), reopens the file (which recovers as at a real restart: an effect written ahead
//! without an answer becomes unknown), calls again, and reconciles through the tool's own export while the outcome
//! is unknown. [`Harness::explore`] does that for every effect and every point and checks the
//! guarantee's invariants ([`Violation`]), one [`Row`] each.
//!
//! ```no_run
//! # async fn test() -> Result<(), oncebox_testing::HarnessError> {
//! // In a tool's tests: `use oncebox::testing::{Harness, Script};`
//! use oncebox_testing::{Harness, Script};
//! let script = Script::parse(r#"
//!     [[effect]]
//!     label = "charge"
//!     status = 201
//!     body = '{"id": "pay_1", "order_id": "o-1", "amount_cents": 500, "status": "succeeded"}'
//! "#)?;
//! let report = Harness::new("target/wasm32-wasip2/release/charge.wasm")?
//!     .policy_file("oncebox.toml")
//!     .script(script)
//!     .explore(r#"{"order_id": "o-1", "amount_cents": 500}"#)
//!     .await?;
//! assert!(report.passed(), "{report}");
//! # Ok(()) }
//! ```
//!
//! It drives the real pipeline through the hooks the host exposes for it
//! (`oncebox_runtime::hooks`: the crash points and the scripted downstream inside the effect path
//! and the pipeline). A host built without the harness has no hooks, and each point costs it one
//! branch on `None`. The `oncebox` crate re-exports this crate as `oncebox::testing`.
//!
//! # Layout
//!
//! - `harness`: [`Harness`], one scenario through the real host on a fresh ledger file.
//! - `script`: [`Script`], the downstream that answers by label and occurrence and records what
//!   reached it.
//! - `explore`: every effect, every crash point and fault, on a fresh ledger each.
//! - `report`: what exploration found ([`Report`], a [`Row`] each, the [`Violation`]s).

mod explore;
mod harness;
mod killable;
mod report;
mod script;

pub use harness::{Harness, Injection, RUN, Run, STEP, Target};
pub use oncebox_runtime::hooks::Point;
pub use report::{Report, Row, Violation};
pub use script::{Dispatch, Fault, ReadRule, Rule, Script, ScriptError, Settings};

/// Why the harness could not run a scenario (a tool that breaks an invariant is a [`Report`],
/// not an error).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HarnessError {
    #[error(transparent)]
    Host(#[from] oncebox_runtime::Error),
    #[error(transparent)]
    Call(#[from] oncebox_runtime::CallError),
    #[error(transparent)]
    Ledger(#[from] oncebox_runtime::LedgerError),
    #[error(transparent)]
    Policy(#[from] oncebox_runtime::policy_file::PolicyError),
    #[error(transparent)]
    Script(#[from] ScriptError),
    #[error("harness: cannot make a temporary directory: {0}")]
    TempDir(std::io::Error),
    #[error("harness: cannot open the scenario's ledger file: {0}")]
    LedgerFile(std::io::Error),
    #[error("harness: the call panicked: {0}")]
    Panicked(String),
}
