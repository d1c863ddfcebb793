//! Reads and writes files through std, so the component imports `wasi:filesystem`: without a
//! directory grant it sees no directory at all; with one, that directory and nothing else.

use oncebox_sdk::{Tool, ToolError};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Args {
    path: String,
    /// Writes this to `path` (then reads it back); without it, only reads.
    #[serde(default)]
    write: Option<String>,
}

#[derive(Serialize)]
pub struct Read {
    content: String,
}

pub struct DirUser;

impl Tool for DirUser {
    type Args = Args;
    type Output = Read;
    const NAME: &'static str = "dir-user";
    const DESCRIPTION: &'static str = "Reads (and optionally writes) one file.";

    fn invoke(args: Args) -> Result<Read, ToolError> {
        if let Some(text) = &args.write {
            std::fs::write(&args.path, text).map_err(|e| ToolError::permanent(format!("write {}: {e}", args.path)))?;
        }
        let content = std::fs::read_to_string(&args.path)
            .map_err(|e| ToolError::permanent(format!("read {}: {e}", args.path)))?;
        Ok(Read { content })
    }
}

oncebox_sdk::export!(DirUser, class = read_only);
