//! Paths of the tool components, built by this crate's build script.
//!
//! The example tools (`STOCK`, `RESERVE`, `RELEASE`, `CHARGE`, `REFUND`, `FULFILL`, `NOTIFY`) form
//! the order workflow; `LYING_READER`, `SOCKET_USER`, `PANICKY`, `HOSTILE` and `DIR_USER` exist for the host's tests.

include!(concat!(env!("OUT_DIR"), "/artifacts.rs"));

/// The order-workflow tools, in the order a workflow uses them.
pub const EXAMPLE_TOOLS: [&str; 7] = [STOCK, RESERVE, RELEASE, CHARGE, REFUND, FULFILL, NOTIFY];
