//! The traits a tool author implements.

use schemars::JsonSchema;
use serde::{Serialize, de::DeserializeOwned};

use crate::ToolError;

/// A tool: typed args in, typed output out. The host validates the args against the schema
/// derived from `Args` before the tool ever runs, and decides retries from the export's class.
pub trait Tool {
    /// What the model (through the orchestrator) passes. Its JSON Schema becomes the manifest's
    /// input schema.
    type Args: DeserializeOwned + JsonSchema;
    /// What the tool returns, serialized to JSON and recorded in the ledger.
    type Output: Serialize;

    /// The tool's name, unique within a host.
    const NAME: &'static str;
    /// One sentence for the model and the operator.
    const DESCRIPTION: &'static str;
    /// The tool that undoes this one (compensatable tools).
    const COMPENSATED_BY: Option<&'static str> = None;
    /// How the `COMPENSATED_BY` tool's args are made from this operation's, as pairs of (its arg
    /// name, a JSON pointer into `{"args": ..., "output": ...}`): for `charge` undone by `refund`,
    /// `&[("order_id", "/args/order_id"), ("amount_cents", "/output/amount_cents")]`. The host
    /// builds them when it compensates, so nobody retypes them. Pointers may not reach a
    /// `SENSITIVE` arg: the ledger keeps those redacted.
    const COMPENSATION_ARGS: &'static [(&'static str, &'static str)] = &[];
    /// For irreversible tools: what running it does that cannot be taken back, in words, shown to
    /// the person asked to approve a call ("The shipment leaves the warehouse and cannot be
    /// cancelled").
    const CONSEQUENCE: Option<&'static str> = None;
    /// JSON pointers into the args whose values never appear in logs or records (`/payment_method`).
    const SENSITIVE: &'static [&'static str] = &[];

    /// Runs the tool once. Effects go through [`crate::http`], [`crate::kv`], [`crate::outbox`]
    /// and [`crate::provider`]; the host keys and records each of them.
    fn invoke(args: Self::Args) -> Result<Self::Output, ToolError>;
}

/// What the authority says about an effect whose response was lost.
///
/// The tool reports what the authority shows; the host decides what it proves (the rule of
/// evidence). In particular `NotCommitted` is only "no record of it *now*": a downstream still
/// processing the request, or one whose index lags, shows nothing for a charge that will commit.
/// The host counts it as proof only once the downstream's `settle_window` (the operator's setting
/// per host, 5 minutes by default) has passed since the effect's last send ended; before that the
/// operation stays unknown, and the reconcile answer says from when a `NotCommitted` would count.
#[derive(Debug, Clone, PartialEq)]
pub enum Reconciliation<T> {
    /// It took place; `T` is the output the tool would have returned.
    Committed(T),
    /// The authority has no record of it (yet: see above).
    NotCommitted,
    /// The authority cannot tell. Not proof of anything.
    StillUnknown,
}

impl<T: serde::de::DeserializeOwned> Reconciliation<T> {
    /// Asks an authority that looks effects up by their key (as Stripe-like APIs do): 200 with the
    /// output is committed; 404 is "no record of it now", which the host counts as not committed
    /// only after the host's settle window; anything else (an error, a 5xx, a body that does not
    /// parse) proves nothing. `effect_key` given to [`Reconcile::reconcile`] is the
    /// `Idempotency-Key` the host sent with the effect. The lookup is a read: its URL's origin must
    /// be granted to the tool like its effects' (`[tools.NAME.grants] http`).
    pub fn lookup(url: &str) -> Self {
        match crate::http::get(url) {
            Ok(r) if r.status == 200 => r.json().map_or(Reconciliation::StillUnknown, Reconciliation::Committed),
            Ok(r) if r.status == 404 => Reconciliation::NotCommitted,
            _ => Reconciliation::StillUnknown,
        }
    }
}

/// Compensatable and irreversible tools also answer "did this effect happen?" by its key.
///
/// The host calls it (`oncebox reconcile`, [`Host::reconcile`] in the host crate) for an operation
/// whose outcome is unknown, once per effect in doubt.
///
/// - `effect_key` is exactly the `Idempotency-Key` header the host sent with that effect (for a
///   provider effect, the key the provider was given): look the effect up by it.
/// - The lookup runs with the tool's own grants: an HTTP lookup is a read (`http::get`), and its
///   URL's origin must be granted to the tool under `[tools.NAME.grants] http`, like its effects.
///   A lookup it may not make fails, and the effect stays in doubt.
/// - It runs outside any operation, so an effect it tries is refused: its answer is evidence, not
///   an action (see [`Reconciliation`] for what the host makes of each answer).
///
/// [`Host::reconcile`]: https://docs.rs/oncebox
pub trait Reconcile: Tool {
    /// Asks the authority about the effect sent with `effect_key` (its `Idempotency-Key`) for
    /// these args.
    fn reconcile(effect_key: &str, args: Self::Args) -> Reconciliation<Self::Output>;
}
