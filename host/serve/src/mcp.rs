//! MCP, with the official Rust SDK (`rmcp`): streamable HTTP at `/mcp`, or stdio for an agent
//! that starts the server itself. The tools are the loaded components, listed afresh on every
//! `tools/list` (the directory is watched), and every `tools/call` goes through [`App::call`].
//!
//! Identity: a call's run and step come only from the request's `_meta` (`oncebox/run-id`,
//! `oncebox/step-id`), which the orchestrator sets and the model never sees; `run_id` or
//! `step_id` inside the arguments are arguments like any other. A write-class tool called without
//! them is answered with a tool error that says how to set them. A caller's trace context comes
//! in `_meta` too (`traceparent`, `tracestate`), as MCP's SEP-414 has it.
//!
//! Results: `structuredContent` is the outcome exactly as the HTTP API answers it, the content
//! repeats it as JSON text (after an explanation, where there is one), and the result's `_meta`
//! carries `oncebox/status`, `oncebox/replayed`, `oncebox/attempts`, `oncebox/operation-key` and
//! `oncebox/source`. `isError` is true when the call did not do what it was asked and will not
//! by itself: failed, conflict, rejected, expired, and `unknown` (reconcile first). A call
//! awaiting approval, or running under another caller, is not an error: nothing failed.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use oncebox_runtime::{Outcome, ReplayClass, Status, ToolManifest, TraceContext};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation, JsonObject, ListToolsResult,
    MetaObject, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, Peer, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Value, json};

use super::app::{App, CallRequest};
use super::error::ApiError;
use super::listen::{ConnectionLimits, bounded_body};
use super::metrics::Source;

/// The request `_meta` key of the orchestrator's run id.
pub const META_RUN: &str = "oncebox/run-id";
/// The request `_meta` key of the orchestrator's step id.
pub const META_STEP: &str = "oncebox/step-id";

const INSTRUCTIONS: &str = "oncebox runs each tool call at most once per step. The orchestrator, not the model, \
    names the step: every tools/call of a tool that can change the world carries `_meta: {\"oncebox/run-id\": RUN, \
    \"oncebox/step-id\": STEP}` from its durable state. The same run and step with the same arguments is answered \
    from the record (`oncebox/replayed` true in the result's `_meta`), never run twice. Read-only tools may be \
    called without them. `run_id` or `step_id` inside the arguments do not name the step. An `unknown` result \
    must be reconciled before anything else; an `awaiting-approval` result waits for a person.";

/// How often the listing is compared with the one last told, for `notifications/tools/list_changed`.
const LISTING_CHECKED_EVERY: Duration = Duration::from_secs(1);

/// One MCP connection's handler: every session shares the same [`App`] and listeners.
#[derive(Clone)]
pub struct Oncebox {
    app: Arc<App>,
    listeners: Arc<Listeners>,
}

/// The sessions to tell when the tools directory changes: those that completed `initialize`
/// (the 2026 revision's sessionless requests ask for notifications with `subscriptions/listen`,
/// which oncebox does not serve).
#[derive(Default)]
struct Listeners {
    peers: Mutex<Vec<Peer<RoleServer>>>,
}

impl Listeners {
    /// The peers of the sessions still open, those of ended sessions dropped.
    fn open(&self) -> std::sync::MutexGuard<'_, Vec<Peer<RoleServer>>> {
        let mut peers = self.peers.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        peers.retain(|peer| !peer.is_transport_closed());
        peers
    }
}

impl Oncebox {
    /// A handler, and the task that tells its sessions when the tools change.
    fn new(app: Arc<App>) -> Oncebox {
        let handler = Oncebox { app, listeners: Arc::default() };
        tokio::spawn(handler.clone().tell_listing_changes());
        handler
    }

    async fn tell_listing_changes(self) {
        // A session's first listing waits for the first scan (`list_tools`): what it loads is no
        // change to anyone, and telling it would race a client's own listing.
        self.app.loaded.ready().await;
        let mut told = self.listing();
        loop {
            tokio::time::sleep(LISTING_CHECKED_EVERY).await;
            // Sessions that ended (closed, or idle past their keep-alive) are let go here, every
            // tick: memory follows the sessions open, not every session there ever was.
            drop(self.listeners.open());
            let listing = self.listing();
            if listing == told {
                continue;
            }
            told = listing;
            let peers = self.listeners.open().clone();
            for peer in peers {
                // A session that went away meanwhile is dropped at the next change.
                let _ = peer.notify_tool_list_changed().await;
            }
        }
    }

    /// Whether `tool` is loaded and of a write class (it needs the step identity).
    fn changes_the_world(&self, tool: &str) -> bool {
        self.app.host.tools().iter().any(|(m, _)| m.name == tool && m.class != ReplayClass::ReadOnly)
    }

    fn listing(&self) -> Vec<Tool> {
        let tools = self.app.host.tools();
        let served = tools.iter().filter(|(manifest, _)| self.app.loaded.unserved(&manifest.name).is_none());
        served.map(|(manifest, _)| tool_of(manifest)).collect()
    }
}

/// The MCP sessions open at once by default (`--max-mcp-sessions`); each holds a session worker
/// and its buffers until it is closed or idle for `SESSION_IDLE`.
pub const MAX_SESSIONS: usize = 1024;
/// How long an MCP session may sit idle before it ends (its client then opens another).
pub const SESSION_IDLE: Duration = Duration::from_secs(300);

pub fn routes(app: Arc<App>, max_sessions: usize, limits: ConnectionLimits) -> Router<Arc<App>> {
    let config = http_config();
    let handler = Oncebox::new(app.clone());
    let mut sessions = LocalSessionManager::default();
    sessions.session_config.keep_alive = Some(SESSION_IDLE);
    let sessions = Arc::new(sessions);
    let service = StreamableHttpService::new(move || Ok(handler.clone()), sessions.clone(), config);
    let cap = Cap { sessions, max: max_sessions.max(1) };
    Router::new()
        .route_service("/mcp", service)
        .layer(axum::middleware::from_fn(session_closed))
        .layer(axum::middleware::from_fn_with_state(cap, session_cap))
        .layer(axum::middleware::from_fn_with_state(limits, bounded_body))
        .layer(axum::middleware::from_fn_with_state(app, require_token))
}

/// The bound on open MCP sessions. The SDK removes a session from its manager when its worker
/// ends (closed by the client, or idle past its keep-alive), so the manager's count is the
/// sessions open now.
#[derive(Clone)]
struct Cap {
    sessions: Arc<LocalSessionManager>,
    max: usize,
}

/// Refuses (503) a request that would open a session (one without `Mcp-Session-Id`) while
/// `max` sessions are open; requests of open sessions go on.
async fn session_cap(State(cap): State<Cap>, request: Request, next: Next) -> Response {
    let opens = request.method() == axum::http::Method::POST && !request.headers().contains_key("mcp-session-id");
    if opens && cap.sessions.sessions.read().await.len() >= cap.max {
        let message = format!(
            "this server has {} MCP sessions open, its limit (--max-mcp-sessions): close one (DELETE /mcp with its \
             Mcp-Session-Id) or try again when one has ended",
            cap.max
        );
        return ApiError::Full(message).into_response();
    }
    next.run(request).await
}

/// A session closed by its client (`DELETE /mcp`) answers 204: the SDK answers 202, which the
/// official Python SDK takes for a failure (it accepts 200 and 204) and logs at every close.
async fn session_closed(request: Request, next: Next) -> Response {
    let deleting = request.method() == axum::http::Method::DELETE;
    let mut response = next.run(request).await;
    if deleting && response.status() == axum::http::StatusCode::ACCEPTED {
        *response.status_mut() = axum::http::StatusCode::NO_CONTENT;
    }
    response
}

/// The SDK's defaults (stateful sessions, SSE keep-alive), without its own `Host` check: the
/// server's one allow-list (`auth`, asked by the `guard` layer in front of every route, `/mcp`
/// included) decides which names and origins this server answers to, so that MCP works behind
/// `--public-url` exactly as the API and the console do.
fn http_config() -> StreamableHttpServerConfig {
    StreamableHttpServerConfig::default().disable_allowed_hosts().disable_allowed_origins()
}

/// Beyond loopback or behind `--public-url`, MCP needs a token (the callers', or the operator's) like
/// the rest of the API.
async fn require_token(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    match app.auth.may_call(request.headers()) {
        Ok(()) => next.run(request).await,
        Err(refused) => refused.into_response(),
    }
}

/// MCP over stdin and stdout until the client closes stdin. Logs go to stderr (stdout is the
/// protocol).
pub async fn serve_stdio(app: Arc<App>) -> anyhow::Result<()> {
    let running = Oncebox::new(app).serve(rmcp::transport::stdio()).await?;
    running.waiting().await?;
    Ok(())
}

impl ServerHandler for Oncebox {
    fn get_info(&self) -> ServerConfig {
        // `initialize` negotiates among every revision the SDK knows (the default of
        // `supported_protocol_versions`): the newest with a handshake, and those before it.
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_tool_list_changed().build())
            .with_server_info(Implementation::new("oncebox", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        // A server still compiling its tools lists them once they are loaded.
        self.app.loaded.ready().await;
        Ok(ListToolsResult::with_all_items(self.listing()))
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        self.listeners.open().push(context.peer);
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.app.host.tools().iter().find(|(manifest, _)| manifest.name == name).map(|(manifest, _)| tool_of(manifest))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // The SDK moves the request's `_meta` into the context; a `_meta` left on the params
        // (an SDK that does not) counts the same.
        let meta = request.meta.as_ref().map(|m| &m.0.0).filter(|m| !m.is_empty()).unwrap_or(&context.meta.0.0);
        let (run_id, step_id) = match identity(meta) {
            Ok(ids) => ids,
            Err(why) => return Ok(error_text(why).into()),
        };
        let tool = request.name.to_string();
        self.app.loaded.ready().await;
        // Decided here, before the args are validated, so that the answer names what is missing
        // even when the model also put a `run_id` among the args (which the schema may refuse).
        if run_id.is_none() && self.changes_the_world(&tool) {
            return Ok(error_text(step_identity_missing(&tool)).into());
        }
        let args = Value::Object(request.arguments.unwrap_or_default());
        let trace = trace_of(meta);
        let call = CallRequest { run_id: run_id.clone(), step_id, tool: tool.clone(), args, wait: None, trace };
        let result = match self.app.call(call).await {
            Ok((outcome, source)) => result_of(&self.app, &tool, run_id.as_deref(), &outcome, source),
            Err(refused) => return refusal(&tool, &refused).map(Into::into),
        };
        Ok(result.into())
    }
}

/// A call App refused to run: the caller's mistakes (bad args, say) are tool errors the model
/// can read; an unknown tool is a protocol error (invalid params), as the MCP spec has it.
fn refusal(tool: &str, refused: &ApiError) -> Result<CallToolResult, ErrorData> {
    match refused {
        ApiError::NotFound(message) => {
            Err(ErrorData::invalid_params(format!("Unknown tool: {tool}"), Some(json!({ "reason": message }))))
        }
        // A host breakdown during a call may come after a send: a tool result that says the outcome
        // is not known (clients show a protocol error as "the call failed").
        ApiError::Internal(message) => {
            let mut result = error_text(format!("the outcome of this call is not known: {message}"));
            let mut meta = MetaObject::new();
            meta.insert("oncebox/status".into(), json!("indeterminate"));
            result.meta = Some(meta);
            Ok(result)
        }
        other => Ok(error_text(other.to_string())),
    }
}

/// The caller's W3C trace context, from the request's `_meta` (`traceparent`, `tracestate`: the
/// convention of MCP's SEP-414). One that is not a string is ignored, as a malformed header is.
fn trace_of(meta: &JsonObject) -> Option<TraceContext> {
    let text = |key: &str| meta.get(key).and_then(Value::as_str);
    TraceContext::new(text("traceparent"), text("tracestate"))
}

/// The run and step of a call, from the request's `_meta`: both or neither, each a non-empty string.
fn identity(meta: &JsonObject) -> Result<(Option<String>, Option<String>), String> {
    let id = |key: &str| match meta.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if !s.trim().is_empty() => Ok(Some(s.clone())),
        Some(other) => Err(format!("`_meta.{key}` must be a non-empty string, got {other}")),
    };
    match (id(META_RUN)?, id(META_STEP)?) {
        (Some(run), Some(step)) => Ok((Some(run), Some(step))),
        (None, None) => Ok((None, None)),
        (run, _) => {
            let (given, missing) = if run.is_some() { (META_RUN, META_STEP) } else { (META_STEP, META_RUN) };
            Err(format!(
                "the step identity is incomplete: `_meta` has `{given}` but not `{missing}`. {}",
                how_to_name_the_step()
            ))
        }
    }
}

fn how_to_name_the_step() -> String {
    format!(
        "The orchestrator (not the model) sets both on the tools/call request: `_meta: {{\"{META_RUN}\": RUN, \
         \"{META_STEP}\": STEP}}`, from its durable run and step ids; `run_id` or `step_id` in the arguments do not count."
    )
}

fn step_identity_missing(tool: &str) -> String {
    format!(
        "the step identity is missing: `{tool}` can change the world, so the call needs a run id and a step id, \
         or a retry could not be told from a new intent. {} Nothing was run.",
        how_to_name_the_step()
    )
}

fn error_text(text: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text)])
}

/// A manifest as MCP lists it: the replay class as annotations, and in `_meta`.
fn tool_of(manifest: &ToolManifest) -> Tool {
    let schema = match &manifest.input_schema {
        Value::Object(schema) => schema.clone(),
        // The loader insists on an object schema; a tool is never listed without one.
        _ => rmcp::object!({ "type": "object" }),
    };
    let mut meta = MetaObject::new();
    meta.insert("oncebox/class".into(), manifest.class.as_str().into());
    Tool::new(manifest.name.clone(), manifest.description.clone(), schema)
        .with_annotations(annotations(manifest.class))
        .with_meta(meta)
}

/// The hints a replay class stands for. `openWorldHint` is true for every class: even a read-only
/// tool may read from downstream hosts its grants name, and the hint does not depend on the
/// policy.
fn annotations(class: ReplayClass) -> ToolAnnotations {
    let (read_only, idempotent, destructive) = match class {
        ReplayClass::ReadOnly => (true, true, false),
        ReplayClass::IdempotentWrite => (false, true, false),
        ReplayClass::Compensatable | ReplayClass::Irreversible => (false, false, true),
    };
    ToolAnnotations::new().read_only(read_only).idempotent(idempotent).destructive(destructive).open_world(true)
}

/// An outcome as a tool result (see the module's docs).
fn result_of(app: &App, tool: &str, run_id: Option<&str>, outcome: &Outcome, source: Source) -> CallToolResult {
    let mut value = serde_json::to_value(outcome).unwrap_or_else(|e| json!({ "error": format!("the outcome: {e}") }));
    // The CLI's way to approve names the ledger's path on this machine: the model needs only
    // where a person approves, never where the ledger lives.
    if let Some(approve) = value.get_mut("approval").and_then(|a| a.get_mut("approve")) {
        let key = outcome.operation_key.as_deref().unwrap_or("KEY");
        let (console, api) = where_to_approve(app, key);
        *approve = format!("{console}, or {api}").into();
    }
    // An awaiting-approval outcome's message quotes that command too.
    if outcome.status == Status::AwaitingApproval
        && let Some(message) = value.get_mut("error").and_then(|e| e.get_mut("message"))
    {
        *message = awaiting_approval(app, tool, outcome).into();
    }
    let mut content = Vec::new();
    if let Some(explained) = explanation(app, tool, run_id, outcome) {
        content.push(ContentBlock::text(explained));
    }
    // The same JSON, its hiding characters escaped: the same value, and what a person reads if
    // the agent shows it. (`structuredContent`, for programs, is exact.)
    content.push(ContentBlock::text(oncebox_runtime::shown::reveal(&value.to_string()).into_owned()));
    let mut meta = MetaObject::new();
    meta.insert("oncebox/status".into(), value["status"].clone());
    meta.insert("oncebox/replayed".into(), outcome.replayed.into());
    meta.insert("oncebox/attempts".into(), outcome.attempts.into());
    meta.insert("oncebox/operation-key".into(), outcome.operation_key.clone().into());
    meta.insert("oncebox/source".into(), source.as_str().into());
    let result =
        if is_error(outcome.status) { CallToolResult::error(content) } else { CallToolResult::success(content) };
    let mut result = result.with_meta(Some(meta));
    result.structured_content = Some(value);
    result
}

fn is_error(status: Status) -> bool {
    match status {
        Status::Completed | Status::AwaitingApproval | Status::InProgress => false,
        Status::Failed | Status::Unknown | Status::Conflict | Status::Rejected | Status::Expired => true,
    }
}

/// What the model or its orchestrator must know about an outcome that is not plainly done.
fn explanation(app: &App, tool: &str, run_id: Option<&str>, outcome: &Outcome) -> Option<String> {
    let why = outcome.error.as_ref().map(|e| format!(" ({}: {})", e.class, e.message)).unwrap_or_default();
    let run = run_id.unwrap_or("RUN");
    let text = match outcome.status {
        Status::Completed => return None,
        Status::Failed => format!(
            "`{tool}` failed{why}. The failure is recorded: the same step answers it again; a new attempt needs a new step id."
        ),
        Status::Unknown => format!(
            "`{tool}`: the effect may have happened; it must be reconciled before anything else (POST \
             /v1/runs/{run}/reconcile or `oncebox reconcile`), do not call again as new.{why}"
        ),
        Status::Conflict => format!(
            "`{tool}`: this step was called before with different arguments; nothing was dispatched. Resolve the \
             original operation first, or name a new intent with a new step id.{why}"
        ),
        Status::Rejected => format!(
            "`{tool}`: a person rejected these exact params; nothing was dispatched, and nothing will be for this step.{why}"
        ),
        Status::Expired => format!(
            "`{tool}`: this step's record expired and was not run as new; a new intent needs a new step id.{why}"
        ),
        Status::InProgress => format!(
            "`{tool}`: another caller is running this step now; call again with the same `_meta` for its result.{why}"
        ),
        Status::AwaitingApproval => awaiting_approval(app, tool, outcome),
    };
    Some(text)
}

/// Where a person approves `key`: the console's page and the API's route.
fn where_to_approve(app: &App, key: &str) -> (String, String) {
    if app.base_url.is_empty() {
        (
            format!("the console of an `oncebox serve` on this ledger (/approvals/{key})"),
            format!("POST /v1/approvals/{key}/approve with the operator's token"),
        )
    } else {
        (
            format!("{}/approvals/{key}", app.base_url),
            format!("POST {}/v1/approvals/{key}/approve with the operator's token", app.base_url),
        )
    }
}

/// Where and how a person approves: the console's page and the API, both by operation key.
fn awaiting_approval(app: &App, tool: &str, outcome: &Outcome) -> String {
    let key = outcome.operation_key.as_deref().unwrap_or("KEY");
    let fingerprint = outcome.fingerprint.as_deref().unwrap_or("(see the approval)");
    let params = outcome.approval.as_ref().map(|a| a.params.to_string()).unwrap_or_else(|| "{}".into());
    let consequence =
        outcome.approval.as_ref().and_then(|a| a.consequence.as_deref()).map(|c| format!(" {c}")).unwrap_or_default();
    let (console, api) = where_to_approve(app, key);
    let text = format!(
        "`{tool}` awaits a person's approval of these exact params; nothing was dispatched.{consequence} Params: \
         {params}. Fingerprint: {fingerprint}. Approve at {console}, or with {api}; then call again with the same \
         `_meta` and arguments."
    );
    // The agent relays this to a person: a character that would hide from them (a direction
    // override in a param) is written as its escape, as the console and the CLI show it.
    oncebox_runtime::shown::reveal(&text).into_owned()
}
