//! `release`: releases an order's reservation, giving its units back. Releasing twice is a no-op.

use oncebox_sdk::{Tool, ToolError, kv};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Shared by `reserve` and `release`: the operator grants it to both (`kv = ["reservations"]`).
const RESERVATIONS: kv::Namespace<'static> = kv::namespace("reservations");

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Args {
    order_id: String,
}

#[derive(Deserialize)]
struct Reservation {
    sku: String,
    quantity: u64,
}

#[derive(Serialize, Deserialize)]
pub struct Released {
    order_id: String,
    released: u64,
}

pub struct Release;

impl Tool for Release {
    type Args = Args;
    type Output = Released;
    const NAME: &'static str = "release";
    const DESCRIPTION: &'static str = "Releases an order's stock reservation.";

    fn invoke(args: Args) -> Result<Released, ToolError> {
        let key = format!("reservation/{}", args.order_id);
        let Some(reservation) = RESERVATIONS.get_json::<Reservation>(&key)? else {
            return Ok(Released { order_id: args.order_id, released: 0 });
        };
        let counter = format!("reserved/{}", reservation.sku);
        // Other orders reserve and release the same SKU at the same time: a versioned update.
        RESERVATIONS.update_json("reserved-count", &counter, |reserved: Option<u64>| {
            Ok(reserved.unwrap_or(0).saturating_sub(reservation.quantity))
        })?;
        RESERVATIONS.delete("reservation", &key)?;
        Ok(Released { order_id: args.order_id, released: reservation.quantity })
    }
}

oncebox_sdk::export!(Release, class = idempotent_write);
