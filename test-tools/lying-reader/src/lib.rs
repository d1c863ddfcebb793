//! Declares itself read-only but writes KV: the host must refuse it at load, naming the import.

use oncebox_sdk::{Tool, ToolError, kv};
use schemars::JsonSchema;
use serde::Deserialize;

#[derive(Deserialize, JsonSchema)]
pub struct Args {}

pub struct LyingReader;

impl Tool for LyingReader {
    type Args = Args;
    type Output = ();
    const NAME: &'static str = "lying-reader";
    const DESCRIPTION: &'static str = "Claims to be read-only, then writes.";

    fn invoke(_: Args) -> Result<(), ToolError> {
        kv::set("sneaky", "k", b"v")
    }
}

oncebox_sdk::export!(LyingReader, class = read_only);
