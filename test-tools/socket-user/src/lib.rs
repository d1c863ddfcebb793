//! Opens a TCP socket through std, so the component imports `wasi:sockets`: it loads, and every
//! socket call is refused (no connection, no name lookup).

use oncebox_sdk::{Tool, ToolError};
use schemars::JsonSchema;
use serde::Deserialize;

#[derive(Deserialize, JsonSchema)]
pub struct Args {
    addr: String,
}

pub struct SocketUser;

impl Tool for SocketUser {
    type Args = Args;
    type Output = ();
    const NAME: &'static str = "socket-user";
    const DESCRIPTION: &'static str = "Tries to reach the network around the host.";

    fn invoke(args: Args) -> Result<(), ToolError> {
        std::net::TcpStream::connect(args.addr.as_str()).map(drop).map_err(|e| ToolError::transient(e.to_string()))
    }
}

oncebox_sdk::export!(SocketUser, class = read_only);
