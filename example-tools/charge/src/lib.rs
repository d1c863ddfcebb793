//! `charge`: charges an order once. Compensatable (undone by `refund`), reconciles by effect key.

use oncebox_sdk::{Reconcile, Reconciliation, Tool, ToolError, config, http};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Args {
    order_id: String,
    amount_cents: u64,
    currency: String,
    payment_method: String,
}

#[derive(Serialize, Deserialize)]
pub struct Payment {
    id: String,
    order_id: String,
    amount_cents: u64,
    status: String,
}

pub struct Charge;

impl Tool for Charge {
    type Args = Args;
    type Output = Payment;
    const NAME: &'static str = "charge";
    const DESCRIPTION: &'static str = "Charges an order's payment method once.";
    const COMPENSATED_BY: Option<&'static str> = Some("refund");
    const COMPENSATION_ARGS: &'static [(&'static str, &'static str)] =
        &[("order_id", "/args/order_id"), ("amount_cents", "/output/amount_cents")];
    const SENSITIVE: &'static [&'static str] = &["/payment_method"];

    fn invoke(args: Args) -> Result<Payment, ToolError> {
        // The host sends `Idempotency-Key` and records the answer: a retry never charges twice.
        let response = http::post_json("charge", &format!("{}/payments", base_url()?), &args)?;
        match response.status {
            200..=299 => response.json(),
            402 => Err(ToolError::permanent("card declined")),
            status => Err(ToolError::permanent(format!("payments answered {status}"))),
        }
    }
}

impl Reconcile for Charge {
    fn reconcile(effect_key: &str, _args: Args) -> Reconciliation<Payment> {
        match base_url() {
            Ok(base) => Reconciliation::lookup(&format!("{base}/payments/by-key/{effect_key}")),
            Err(_) => Reconciliation::StillUnknown,
        }
    }
}

fn base_url() -> Result<String, ToolError> {
    config("base_url").ok_or_else(|| ToolError::permanent("config `base_url` is not set"))
}

oncebox_sdk::export!(Charge, class = compensatable);
