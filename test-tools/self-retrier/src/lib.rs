//! `self-retrier`: a refund tool with a mistake no label rule catches. When its refund's answer
//! is lost (a timeout, a 5xx after the commit), it catches the unknown outcome and sends the same
//! request again itself, in the same attempt: the next occurrence of its label, a new effect key,
//! so a downstream that honours keys would refund twice as surely as one that does not. The host
//! refuses the second send (the tool diverged: it asked again for a request of this attempt whose
//! outcome is in doubt), and `oncebox test --explore` must report it.

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

pub struct SelfRetrier;

impl Tool for SelfRetrier {
    type Args = Args;
    type Output = oncebox_sdk::serde_json::Value;
    const NAME: &'static str = "self-retrier";
    const DESCRIPTION: &'static str =
        "Refunds an order, and resends the refund itself when its answer is lost (broken on purpose).";

    fn invoke(args: Args) -> Result<Self::Output, ToolError> {
        let base = config("base_url").ok_or_else(|| ToolError::permanent("config `base_url` is not set"))?;
        let url = format!("{base}/refunds");
        match http::post_json("refund", &url, &args) {
            // The bug: an unknown outcome is the host's to settle, never the tool's to retry.
            Err(ToolError::UnknownOutcome(_)) => http::post_json("refund", &url, &args)?.json_if_success(),
            answered => answered?.json_if_success(),
        }
    }
}

oncebox_sdk::export!(SelfRetrier, class = idempotent_write);
