//! The one `bindgen!`. The irreversible world imports and exports everything the contract has;
//! a component of a smaller world uses a subset, checked at load (see `load.rs`).
#![allow(missing_docs, clippy::all)]

wasmtime::component::bindgen!({
    path: "../../wit",
    world: "oncebox:tool/irreversible-tool",
    imports: { default: async },
    exports: { default: async },
});

pub use self::oncebox::tool::effects::HttpRequest;
pub use self::oncebox::tool::types::{HttpResponse, Manifest, RateLimit, ReplayClass as WitReplayClass, ToolError};
pub use exports::oncebox::tool::reconcile::{GuestIndices as ReconcileIndices, Reconciliation};
pub use exports::oncebox::tool::tool::GuestIndices as ToolIndices;
