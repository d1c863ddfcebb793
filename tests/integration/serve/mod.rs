//! `oncebox serve`, always as the real binary: the HTTP API with a plain client and with
//! requests generated from its OpenAPI document, MCP with the Python SDK and the official
//! conformance suite, the console in headless Chromium, and SIGKILL mid-call.

pub(crate) mod support;

mod api;
mod console;
mod edges;
mod kill;
mod limits;
mod mcp;
mod notifications;
mod openapi;
mod orchestrator;
mod reconciler;
mod sealed;
mod shared;
mod traces;
