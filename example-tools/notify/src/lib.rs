//! `notify`: enqueues an order e-mail in the outbox. Delivery may come later; the record may not.

use oncebox_sdk::{Tool, ToolError, outbox};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Args {
    order_id: String,
    email: String,
    template: String,
}

#[derive(Serialize, Deserialize)]
pub struct Queued {
    order_id: String,
    topic: String,
}

pub struct Notify;

impl Tool for Notify {
    type Args = Args;
    type Output = Queued;
    const NAME: &'static str = "notify";
    const DESCRIPTION: &'static str = "Queues an e-mail about an order.";
    const SENSITIVE: &'static [&'static str] = &["/email"];

    fn invoke(args: Args) -> Result<Queued, ToolError> {
        let topic = "email";
        outbox::send("email", topic, &args)?;
        Ok(Queued { order_id: args.order_id, topic: topic.into() })
    }
}

oncebox_sdk::export!(Notify, class = idempotent_write);
