//! `fulfill`: ships an order. Irreversible: never retried automatically; reconciles by key.

use oncebox_sdk::{Reconcile, Reconciliation, Tool, ToolError, config, http};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Item {
    sku: String,
    #[schemars(range(min = 1))]
    quantity: u64,
}

#[derive(Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Args {
    order_id: String,
    address: String,
    #[schemars(length(min = 1))]
    items: Vec<Item>,
}

#[derive(Serialize, Deserialize)]
pub struct Shipment {
    id: String,
    order_id: String,
    status: String,
}

pub struct Fulfill;

impl Tool for Fulfill {
    type Args = Args;
    type Output = Shipment;
    const NAME: &'static str = "fulfill";
    const DESCRIPTION: &'static str = "Ships an order to its address.";
    const SENSITIVE: &'static [&'static str] = &["/address"];
    const CONSEQUENCE: Option<&'static str> =
        Some("The order leaves the warehouse for this address; a shipment cannot be cancelled or recalled.");

    fn invoke(args: Args) -> Result<Shipment, ToolError> {
        let response = http::post_json("ship", &format!("{}/fulfillments", base_url()?), &args)?;
        match response.status {
            200..=299 => response.json(),
            status => Err(ToolError::permanent(format!("fulfillment answered {status}"))),
        }
    }
}

impl Reconcile for Fulfill {
    fn reconcile(effect_key: &str, _args: Args) -> Reconciliation<Shipment> {
        match base_url() {
            Ok(base) => Reconciliation::lookup(&format!("{base}/fulfillments/by-key/{effect_key}")),
            Err(_) => Reconciliation::StillUnknown,
        }
    }
}

fn base_url() -> Result<String, ToolError> {
    config("base_url").ok_or_else(|| ToolError::permanent("config `base_url` is not set"))
}

oncebox_sdk::export!(Fulfill, class = irreversible);
