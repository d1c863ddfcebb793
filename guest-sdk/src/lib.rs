//! Write oncebox tools in plain Rust.
//!
//! A tool is a struct, one [`Tool`] impl with typed (serde) args and output, and one
//! [`export!`] naming its replay class. Effects are plain functions ([`http`], [`kv`],
//! [`outbox`], [`provider()`]); the host keys, records and deduplicates each of them, so the tool
//! itself never deals with idempotency. wit-bindgen stays behind this crate.
//!
//! # Depending on it
//!
//! A tool's `Cargo.toml` names this crate and nothing else: `serde`, `serde_json` and `schemars`
//! are re-exported ([`serde`], [`serde_json`], [`schemars`]) at the versions the SDK was built
//! with, and the contract's WIT travels inside the crate (`wit/`), so a path, git, vendored or
//! published dependency all work:
//!
//! ```toml
//! [package]
//! name = "charge"
//! edition = "2024"          # the SDK's edition; any edition of yours works
//! rust-version = "1.95"     # the SDK's MSRV: the toolchain CI builds and tests it with
//!
//! [lib]
//! crate-type = ["cdylib"]   # a component is a cdylib built for wasm32-wasip2
//!
//! [dependencies]
//! oncebox-sdk = { git = "https://github.com/oncebox/oncebox" }   # or { path = "../oncebox/guest-sdk" }
//! ```
//!
//! with `.cargo/config.toml` saying `[build] target = "wasm32-wasip2"`, so that `cargo build`
//! alone makes the component. `oncebox new NAME --class CLASS` writes such a crate, with a
//! harness test.
//!
//! The derives go through the re-exports when told where the crates are:
//! `#[serde(crate = "oncebox_sdk::serde")]` and `#[schemars(crate = "oncebox_sdk::schemars")]`.
//!
//! # Example: a payment that is charged once
//!
//! ```ignore
//! use oncebox_sdk::schemars::JsonSchema;
//! use oncebox_sdk::serde::{Deserialize, Serialize};
//! use oncebox_sdk::{Reconcile, Reconciliation, Tool, ToolError, config, http};
//!
//! #[derive(Serialize, Deserialize, JsonSchema)]
//! #[serde(crate = "oncebox_sdk::serde")]
//! #[schemars(crate = "oncebox_sdk::schemars")]
//! pub struct Args { order_id: String, amount_cents: u64, currency: String, payment_method: String }
//!
//! #[derive(Serialize, Deserialize)]
//! #[serde(crate = "oncebox_sdk::serde")]
//! pub struct Payment { id: String, order_id: String, amount_cents: u64, status: String }
//!
//! pub struct Charge;
//!
//! impl Tool for Charge {
//!     type Args = Args;
//!     type Output = Payment;
//!     const NAME: &'static str = "charge";
//!     const DESCRIPTION: &'static str = "Charges an order's payment method once.";
//!     const COMPENSATED_BY: Option<&'static str> = Some("refund");
//!     const SENSITIVE: &'static [&'static str] = &["/payment_method"];
//!
//!     fn invoke(args: Args) -> Result<Payment, ToolError> {
//!         let base = config("base_url").ok_or_else(|| ToolError::permanent("config base_url unset"))?;
//!         // The host sends `Idempotency-Key` and records the answer: a retry never charges twice.
//!         let response = http::post_json("charge", &format!("{base}/payments"), &args)?;
//!         match response.status {
//!             402 => Err(ToolError::permanent("card declined")),
//!             // Any 2xx is the payment; anything else is a refusal naming the status.
//!             _ => response.json_if_success(),
//!         }
//!     }
//! }
//!
//! impl Reconcile for Charge {
//!     // The effect's answer was lost: ask the provider whether it knows the key. `effect_key`
//!     // is the `Idempotency-Key` the host sent; the lookup is a GET, under the tool's http grant.
//!     fn reconcile(effect_key: &str, _args: Args) -> Reconciliation<Payment> {
//!         match config("base_url") {
//!             Some(base) => Reconciliation::lookup(&format!("{base}/payments/by-key/{effect_key}")),
//!             None => Reconciliation::StillUnknown,
//!         }
//!     }
//! }
//!
//! oncebox_sdk::export!(Charge, class = compensatable);
//! ```
//!
//! Build it with `cargo build --target wasm32-wasip2` (crate type `cdylib`) and load the `.wasm`
//! with `oncebox inspect` / `oncebox call`; `oncebox test TOOL.wasm --args JSON --explore` crashes
//! the host at every point of every effect and checks that nothing happened twice.
//!
//! # The mistakes the SDK makes hard
//!
//! - **Only 200 is success.** A downstream that answers 201 has done the work. Use
//!   [`HttpResponse::is_success`] or [`HttpResponse::json_if_success`] (any 2xx).
//! - **Calling a lost answer a failure.** When the downstream's answer does not say whether the
//!   work was done, return [`ToolError::may_have_committed`]: the operation ends `unknown` and is
//!   reconciled, never `failed` (which promises that nothing took effect) and never resent blindly.
//!   The host already does this for an HTTP effect's 408, 409, 5xx or lost connection.
//! - **A key that changes between attempts.** An effect's key comes from the operation, its
//!   `label` and how often the attempt used the label: a label built from the time, a random number
//!   or a counter kept outside the args changes the key, and the downstream sees a new request.
//!   Labels are constants ("charge", "send-receipt").
//!
//! # Reconcile
//!
//! `effect_key`, given to [`Reconcile::reconcile`], is the `Idempotency-Key` header the host sent
//! with the effect in doubt. The lookup is a read made with the tool's own grants: an HTTP lookup's
//! origin must be granted under `[tools.NAME.grants] http`, like the effect's.

#[doc(hidden)]
pub mod bindings;
mod effects;
mod error;
#[doc(hidden)]
pub mod __private {
    pub use crate::private::*;
}
mod private;
mod tool;

pub use bindings::oncebox::tool::types::{ReplayClass, ToolError};
pub use effects::{HttpRequest, HttpResponse, config, http, kv, operation_key, outbox, provider};
pub use oncebox_sdk_macros::export;
pub use tool::{Reconcile, Reconciliation, Tool};

// What a tool needs besides the SDK, at the versions the SDK uses: a tool's manifest names one
// dependency, and its derives say `#[serde(crate = "oncebox_sdk::serde")]`.
pub use schemars;
pub use serde;
pub use serde_json;
