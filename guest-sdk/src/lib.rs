//! Write oncebox tools in plain Rust.
//!
//! A tool is a struct, one [`Tool`] impl with typed (serde) args and output, and one
//! [`export!`] naming its replay class. Effects are plain functions ([`http`], [`kv`],
//! [`outbox`], [`provider()`]); the host keys, records and deduplicates each of them, so the tool
//! itself never deals with idempotency. wit-bindgen stays behind this crate.
//!
//! # Example: a payment that is charged once
//!
//! ```ignore
//! use oncebox_sdk::{Reconcile, Reconciliation, Tool, ToolError, config, http};
//! use schemars::JsonSchema;
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize, JsonSchema)]
//! pub struct Args { order_id: String, amount_cents: u64, currency: String, payment_method: String }
//!
//! #[derive(Serialize, Deserialize)]
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
//!             200 => response.json(),
//!             402 => Err(ToolError::permanent("card declined")),
//!             status => Err(ToolError::permanent(format!("payments answered {status}"))),
//!         }
//!     }
//! }
//!
//! impl Reconcile for Charge {
//!     // The effect's answer was lost: ask the provider whether it knows the key.
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
//! with `oncebox inspect` / `oncebox call`.

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
