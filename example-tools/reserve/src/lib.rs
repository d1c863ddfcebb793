//! `reserve`: ensures one reservation exists for an order; undone by `release`. Idempotent: the reservation and the
//! SKU's reserved count are KV effects, so a replay answers from the ledger and never counts twice.
//! The count is a versioned update, so concurrent steps lose no update and never reserve more than
//! the operator's `max_per_sku`.

use oncebox_sdk::{Reconcile, Reconciliation, Tool, ToolError, config, kv};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Shared by `reserve` and `release`: the operator grants it to both (`kv = ["reservations"]`).
const RESERVATIONS: kv::Namespace<'static> = kv::namespace("reservations");

#[derive(Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Args {
    order_id: String,
    sku: String,
    #[schemars(range(min = 1))]
    quantity: u64,
}

#[derive(Serialize, Deserialize)]
pub struct Reservation {
    order_id: String,
    sku: String,
    quantity: u64,
    /// Units of the SKU reserved by all orders, this one included.
    reserved_total: u64,
}

pub struct Reserve;

impl Tool for Reserve {
    type Args = Args;
    type Output = Reservation;
    const NAME: &'static str = "reserve";
    const DESCRIPTION: &'static str = "Ensures one stock reservation exists for an order.";
    const COMPENSATED_BY: Option<&'static str> = Some("release");
    const COMPENSATION_ARGS: &'static [(&'static str, &'static str)] = &[("order_id", "/args/order_id")];

    fn invoke(args: Args) -> Result<Reservation, ToolError> {
        let key = format!("reservation/{}", args.order_id);
        let (existing, version) = RESERVATIONS.get_json_versioned::<Reservation>(&key)?;
        if let Some(existing) = existing {
            if existing.sku != args.sku || existing.quantity != args.quantity {
                return Err(ToolError::permanent(format!(
                    "order {} already holds a different reservation",
                    args.order_id
                )));
            }
            return Ok(existing);
        }
        // Other orders reserve the same SKU at the same time: a versioned update, never a plain
        // read-modify-write, so that no reservation goes missing from the count.
        let counter = format!("reserved/{}", args.sku);
        // The operator's cap on units reserved per SKU (`[tools.reserve.config] max_per_sku`), if any.
        let cap = config("max_per_sku")
            .map(|v| v.parse::<u64>())
            .transpose()
            .map_err(|_| ToolError::permanent("config `max_per_sku` must be a whole number"))?;
        let reserved_total = RESERVATIONS.update_json("reserved-count", &counter, |total: Option<u64>| {
            let total = total.unwrap_or(0) + args.quantity;
            match cap {
                Some(cap) if total > cap => {
                    Err(ToolError::permanent(format!("only {cap} units of {} may be reserved", args.sku)))
                }
                _ => Ok(total),
            }
        })?;
        let reservation =
            Reservation { order_id: args.order_id, sku: args.sku, quantity: args.quantity, reserved_total };
        if !RESERVATIONS.set_json_if("reservation", &key, &reservation, version)? {
            // Another step reserved this order meanwhile. Failing the attempt discards its count;
            // the next attempt finds that reservation.
            return Err(ToolError::transient("another step reserved this order at the same time"));
        }
        Ok(reservation)
    }
}

impl Reconcile for Reserve {
    /// Its effects are KV writes, committed with their records: never in doubt, so there is
    /// nothing an authority could add.
    fn reconcile(_effect_key: &str, _args: Args) -> Reconciliation<Reservation> {
        Reconciliation::StillUnknown
    }
}

// Compensatable: `release` undoes it when a later step of the run fails (`oncebox compensate`).
oncebox_sdk::export!(Reserve, class = compensatable);
