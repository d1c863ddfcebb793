//! `refund`: refunds an order's charge; the compensation of `charge`, run as its own operation.

use oncebox_sdk::{Tool, ToolError, config, http};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Args {
    order_id: String,
    amount_cents: u64,
}

#[derive(Serialize, Deserialize)]
pub struct Refund {
    id: String,
    order_id: String,
    amount_cents: u64,
    status: String,
}

pub struct RefundTool;

impl Tool for RefundTool {
    type Args = Args;
    type Output = Refund;
    const NAME: &'static str = "refund";
    const DESCRIPTION: &'static str = "Refunds an order's charge.";

    fn invoke(args: Args) -> Result<Refund, ToolError> {
        let base = config("base_url").ok_or_else(|| ToolError::permanent("config `base_url` is not set"))?;
        let response = http::post_json("refund", &format!("{base}/refunds"), &args)?;
        match response.status {
            200..=299 => response.json(),
            status => Err(ToolError::permanent(format!("refunds answered {status}"))),
        }
    }
}

oncebox_sdk::export!(RefundTool, class = idempotent_write);
