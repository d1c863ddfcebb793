//! `key-changer`: a refund tool with the mistake the harness exists to catch. Its effect's label
//! carries the time of the attempt, so every attempt derives a new effect key: after a lost
//! answer, a resend would reach the downstream as a new request, and refund twice. The host
//! refuses it (the tool diverged: a new effect while the first took place or may have), and
//! `oncebox test --explore` must report the divergence.

use oncebox_sdk::schemars::JsonSchema;
use oncebox_sdk::serde::{Deserialize, Serialize};
use oncebox_sdk::{Tool, ToolError, config, http};

#[derive(Serialize, Deserialize, JsonSchema)]
#[serde(crate = "oncebox_sdk::serde", deny_unknown_fields)]
#[schemars(crate = "oncebox_sdk::schemars")]
pub struct Args {
    order_id: String,
    amount_cents: u64,
}

pub struct KeyChanger;

impl Tool for KeyChanger {
    type Args = Args;
    type Output = oncebox_sdk::serde_json::Value;
    const NAME: &'static str = "key-changer";
    const DESCRIPTION: &'static str = "Refunds an order, with a label that changes every attempt (broken on purpose).";

    fn invoke(args: Args) -> Result<Self::Output, ToolError> {
        let base = config("base_url").ok_or_else(|| ToolError::permanent("config `base_url` is not set"))?;
        // The bug: a label must be a constant. This one is new at every attempt.
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let label = format!("refund-{nanos}");
        http::post_json(&label, &format!("{base}/refunds"), &args)?.json_if_success()
    }
}

oncebox_sdk::export!(KeyChanger, class = idempotent_write);
