//! `stock`: how many units of a SKU are available. Read-only: it cannot even link an effect.

use oncebox_sdk::{Tool, ToolError, config, http};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Args {
    sku: String,
}

#[derive(Serialize, Deserialize)]
pub struct Stock {
    sku: String,
    available: u64,
}

pub struct StockTool;

impl Tool for StockTool {
    type Args = Args;
    type Output = Stock;
    const NAME: &'static str = "stock";
    const DESCRIPTION: &'static str = "Tells how many units of a SKU are available.";

    fn invoke(args: Args) -> Result<Stock, ToolError> {
        let base = config("base_url").ok_or_else(|| ToolError::permanent("config `base_url` is not set"))?;
        let response = http::get(&format!("{base}/inventory/{}", args.sku))?;
        match response.status {
            200..=299 => response.json(),
            status => Err(ToolError::transient(format!("inventory answered {status}"))),
        }
    }
}

oncebox_sdk::export!(StockTool, class = read_only);
