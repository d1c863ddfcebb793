//! The HTTP JSON API for orchestrators (`/v1/...`), `/healthz` and `/metrics`. Every answer is
//! JSON; every refusal is a 4xx with `{"error": {"kind", "message"}}` and records nothing.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use oncebox_runtime::TraceContext;
use oncebox_runtime::approvals::{ApprovalView, Decision};
use oncebox_runtime::ledger::{ApprovalRecord, ApprovalState, Resolution, Why};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::app::{App, CallRequest};
use super::error::ApiError;
use super::metrics::Outstanding;

/// The longest `wait` a call may ask for: a request is not a place to park for long.
pub const MAX_WAIT: Duration = Duration::from_secs(300);
/// The longest an approval may be limited to (366 days); longer is a typo, or no limit.
pub const MAX_APPROVAL: Duration = Duration::from_secs(366 * 24 * 3600);

pub fn routes() -> Router<Arc<App>> {
    Router::new()
        .route("/v1/calls", post(call))
        .route("/v1/tools", get(tools))
        .route("/v1/operations/{key}", get(operation))
        .route("/v1/operations/{key}/resolve", post(resolve))
        .route("/v1/operations/{key}/undone-by-hand", post(undone_by_hand))
        .route("/v1/runs", get(runs))
        .route("/v1/runs/{run_id}", get(run))
        .route("/v1/runs/{run_id}/reconcile", post(reconcile))
        .route("/v1/runs/{run_id}/compensate", post(compensate))
        .route("/v1/approvals", get(approvals))
        .route("/v1/approvals/{key}", get(approval))
        .route("/v1/approvals/{key}/approve", post(approve))
        .route("/v1/approvals/{key}/reject", post(reject))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
}

/// A JSON body, or a 4xx that says what is wrong with it (too large, not JSON, a field missing).
pub fn body<T: DeserializeOwned>(bytes: Result<Bytes, BytesRejection>) -> Result<T, ApiError> {
    let bytes = bytes.map_err(|e| match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::TooLarge(e.body_text()),
        _ => ApiError::BadRequest(e.body_text()),
    })?;
    serde_json::from_slice(&bytes).map_err(|e| ApiError::BadRequest(format!("the request body: {e}")))
}

/// Every answer of the API: its JSON with each character that would hide from a reader written as
/// its escape (`\u202e`, `oncebox_core::shown`), the same value to any JSON reader, and what a
/// person reading the raw answer (curl, a log, an approval tool's page built on it) sees as stored.
fn json_response(status: StatusCode, value: &impl serde::Serialize) -> Response {
    match serde_json::to_string(value) {
        Ok(text) => (
            status,
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            oncebox_runtime::shown::reveal(&text).into_owned(),
        )
            .into_response(),
        Err(e) => {
            (StatusCode::INTERNAL_SERVER_ERROR, format!("the answer could not be written as JSON: {e}")).into_response()
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CallBody {
    run_id: Option<String>,
    step_id: Option<String>,
    tool: String,
    args: Value,
    /// Seconds to wait for another caller's result of the same step.
    wait: Option<f64>,
}

/// Parses a `wait` in seconds.
pub fn wait_of(seconds: Option<f64>) -> Result<Option<Duration>, ApiError> {
    seconds
        .map(|s| match Duration::try_from_secs_f64(s) {
            Ok(wait) if wait <= MAX_WAIT => Ok(wait),
            _ => Err(ApiError::BadRequest(format!("`wait` must be 0 to {} seconds, got {s}", MAX_WAIT.as_secs()))),
        })
        .transpose()
}

/// The caller's W3C trace context, from its `traceparent` and `tracestate` headers.
fn trace_of(headers: &HeaderMap) -> Option<TraceContext> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    TraceContext::new(header("traceparent"), header("tracestate"))
}

async fn call(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    app.auth.may_call(&headers)?;
    let body: CallBody = body(bytes)?;
    let request = CallRequest {
        run_id: body.run_id,
        step_id: body.step_id,
        tool: body.tool,
        args: body.args,
        wait: wait_of(body.wait)?,
        trace: trace_of(&headers),
    };
    let (outcome, source) = app.call(request).await.map_err(|e| (*e).clone())?;
    let mut response = json_response(StatusCode::OK, &outcome);
    response.headers_mut().insert("oncebox-source", HeaderValue::from_static(source.as_str()));
    Ok(response)
}

async fn tools(State(app): State<Arc<App>>, headers: HeaderMap) -> Result<Response, ApiError> {
    app.auth.may_call(&headers)?;
    app.loaded.ready().await;
    let tools: Vec<Value> = app
        .host
        .tools()
        .into_iter()
        .map(|(manifest, path)| {
            let sandbox = app.host.sandbox(&manifest.name);
            json!({
                "name": manifest.name,
                "version": manifest.version,
                "description": manifest.description,
                "class": manifest.class,
                "input_schema": manifest.input_schema,
                "compensated_by": manifest.compensated_by,
                "consequence": manifest.consequence,
                "file": path,
                "grants": sandbox.as_ref().map(|s| s.grants.to_json()),
                "limits": sandbox.as_ref().map(|s| s.limits),
            })
        })
        .collect();
    Ok(json_response(StatusCode::OK, &json!({ "tools": tools, "load_errors": app.loaded.errors() })))
}

async fn operation(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(key): Path<String>,
) -> Result<Response, ApiError> {
    app.auth.may_call(&headers)?;
    let ledger = app.host.ledger();
    let op = ledger.operation(&key).await?.ok_or_else(|| ApiError::NotFound(format!("no operation with key {key}")))?;
    Ok(json_response(
        StatusCode::OK,
        &json!({ "operation": op, "effects": ledger.effects(&key).await?, "attempts": ledger.attempts(&key).await? }),
    ))
}

/// One page of runs in key order (`?limit=&after=`, `next` the cursor of the following page, null
/// on the last): O(page), whatever the history (`page.rs`).
async fn runs(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    query: Result<Query<crate::page::PageQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    app.auth.may_call(&headers)?;
    let Query(query) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    query.checked_limit().map_err(ApiError::BadRequest)?;
    let (runs, next) = crate::console::runs::summaries_page(&app, &query, false).await?;
    let runs: Vec<Value> = runs
        .iter()
        .map(|run| {
            json!({ "run_id": run.run_id, "steps": run.steps, "statuses": run.statuses,
                    "awaiting_approval": run.awaiting_approval, "last_ms": run.last_ms })
        })
        .collect();
    Ok(json_response(StatusCode::OK, &json!({ "runs": runs, "next": next })))
}

async fn run(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(run_id): Path<String>,
) -> Result<Response, ApiError> {
    app.auth.may_call(&headers)?;
    // What keeps the run open, by the ledger's one rule: read first, so that a step claimed
    // before it is seen, in flight or recorded.
    let report = oncebox_runtime::recovery::report(app.host.ledger(), Some(&run_id)).await?;
    let ops = app.host.ledger().operations(Some(&run_id)).await?;
    // What retention removed of the run (a compensation names its compensatable steps for a
    // person): which step, how and when it ended, and when it went. No params or answers were
    // ever in a tombstone; the view names its fields, so a field added to it is not served unseen.
    let expired: Vec<Value> = app
        .host
        .ledger()
        .tombstones(&run_id)
        .await?
        .into_iter()
        .map(|t| {
            json!({ "step_id": t.step_id, "tool": t.tool, "operation_key": t.operation_key, "class": t.class,
                    "status": if t.rejected { "rejected" } else { t.status.as_str() },
                    "ended_ms": t.ended_ms, "removed_ms": t.removed_ms })
        })
        .collect();
    let recovery = match report.get(&run_id) {
        Some(recovery) => recovery.clone(),
        None if !expired.is_empty() => Default::default(),
        None => return Err(ApiError::NotFound(format!("no run {run_id} in the ledger"))),
    };
    let body =
        json!({ "run_id": run_id, "operations": ops, "open": recovery.open, "recovery": recovery, "expired": expired });
    Ok(json_response(StatusCode::OK, &body))
}

async fn reconcile(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(run_id): Path<String>,
) -> Result<Response, ApiError> {
    app.auth.may_call(&headers)?;
    let answers = app.host.reconcile_run(&run_id).await.map_err(|e| ApiError::from_operation(e, "reconcile"))?;
    let open = answers.iter().filter(|a| a.settle_by_hand.is_some()).count();
    Ok(json_response(StatusCode::OK, &json!({ "run_id": run_id, "reconciled": answers, "need_a_person": open })))
}

async fn compensate(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(run_id): Path<String>,
) -> Result<Response, ApiError> {
    // Compensating sends refunds: a decision, like approving, wherever the request comes from.
    app.auth.operator(&headers)?;
    let report = app.host.compensate(&run_id).await.map_err(|e| ApiError::from_operation(e, "compensate"))?;
    Ok(json_response(StatusCode::OK, &report.served_at(&app.base_url)))
}

#[derive(Debug, Deserialize)]
struct ApprovalsQuery {
    run: Option<String>,
    pending: Option<bool>,
}

/// A request for approval as the API and the console show it: the view, its key and fingerprint,
/// and whether its call already went through. `exact`: the viewer is the operator, who sees the
/// sensitive values unsealed (they decide about exactly those); anyone else sees them masked.
pub async fn approval_views(app: &App, run: Option<&str>, pending: bool, exact: bool) -> Result<Vec<Value>, ApiError> {
    let mut views = Vec::new();
    let records = match (pending, run) {
        (true, None) => open_requests(app).await?,
        _ => app.host.ledger().approvals(run).await?,
    };
    for record in records {
        let view = approval_view(app, &record, exact).await?;
        if pending && (view["used"] == true || record.state != ApprovalState::Pending) {
            continue;
        }
        views.push(view);
    }
    Ok(views)
}

/// The requests for approval no operation answers yet, every run's, in key order: read from the
/// index of open work (such a request keeps its run open, by the one rule), O(open). A pending
/// one is among them; `approval_views` keeps those.
async fn open_requests(app: &App) -> Result<Vec<ApprovalRecord>, ApiError> {
    let ledger = app.host.ledger();
    let mut records = Vec::new();
    for open in ledger.open_runs(None, ledger.now_ms()).await?.into_values().flatten() {
        if let Why::AwaitingApproval { .. } = open.why
            && let Some(record) = ledger.approval(&open.operation_key).await?
        {
            records.push(record);
        }
    }
    records.sort_by(|a, b| a.operation_key.cmp(&b.operation_key));
    Ok(records)
}

/// One request for approval as the API and the console show it (see [`approval_views`]).
pub async fn approval_view(app: &App, record: &ApprovalRecord, exact: bool) -> Result<Value, ApiError> {
    let ledger = app.host.ledger();
    let used = ledger.operation(&record.operation_key).await?.is_some();
    let mut view = serde_json::to_value(ApprovalView::of(record, ledger)).unwrap_or_default();
    view["operation_key"] = record.operation_key.clone().into();
    view["fingerprint"] = record.fingerprint.clone().into();
    view["used"] = used.into();
    // Whether `params` holds the sensitive values themselves (`exact`) or `[redacted]` marks.
    let sealed = record.sealed.is_some();
    view["params_exact"] = (!sealed).into();
    if exact && sealed {
        match app.host.reveal(record) {
            Ok(params) => {
                view["params"] = params;
                view["params_exact"] = true.into();
            }
            // Another ledger's key, or a deleted secret: the masked params, and why.
            Err(why) => view["params_error"] = format!("the sensitive values could not be unsealed: {why}").into(),
        }
    }
    Ok(view)
}

async fn approvals(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    query: Result<Query<ApprovalsQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    app.auth.may_call(&headers)?;
    let exact = app.auth.operator(&headers).is_ok();
    let Query(query) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let views = approval_views(&app, query.run.as_deref(), query.pending.unwrap_or(false), exact).await?;
    Ok(json_response(StatusCode::OK, &json!({ "approvals": views })))
}

async fn approval(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(key): Path<String>,
) -> Result<Response, ApiError> {
    app.auth.may_call(&headers)?;
    let record = app
        .host
        .ledger()
        .approval(&key)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no request for approval of {key}")))?;
    let exact = app.auth.operator(&headers).is_ok();
    Ok(json_response(StatusCode::OK, &approval_view(&app, &record, exact).await?))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecideBody {
    /// The fingerprint of the params decided on, as the request for approval shows it.
    pub fingerprint: String,
    /// The digest of the component that will run, as the request shows it: a decision on a
    /// request whose component changed since is refused. Required to approve: a person
    /// approves what they saw, never whatever runs by then.
    pub component: Option<String>,
    pub by: String,
    pub note: Option<String>,
    /// Approve only for this many seconds.
    pub expires_in: Option<f64>,
}

/// Approves or rejects, bound to the fingerprint shown: the one decision path of the API and the
/// console.
pub async fn decide(app: &App, key: &str, body: DecideBody, approve: bool) -> Result<Value, ApiError> {
    if body.by.trim().is_empty() {
        return Err(ApiError::BadRequest("`by` names who decides, and is recorded".into()));
    }
    if approve && body.component.as_deref().is_none_or(str::is_empty) {
        return Err(ApiError::BadRequest(
            "`component` names the component you approve (its digest, as the request shows it): an approval binds \
             the code that will run"
                .into(),
        ));
    }
    let decision = if approve {
        let expires_ms = match body.expires_in {
            Some(secs) => {
                let d = Duration::try_from_secs_f64(secs).ok().filter(|d| *d <= MAX_APPROVAL).ok_or_else(|| {
                    ApiError::BadRequest(format!("`expires_in` must be 0 to 31622400 seconds, got {secs}"))
                })?;
                Some(app.host.ledger().now_ms().saturating_add(d.as_millis() as u64))
            }
            None => None,
        };
        Decision::Approve { expires_ms }
    } else {
        Decision::Reject
    };
    let record = app
        .host
        .decide_on(key, &body.fingerprint, body.component.as_deref(), decision, &body.by, body.note.as_deref())
        .await
        .map_err(|e| ApiError::from_operation(e, "decide"))?;
    // Only the operator decides, and sees what they decided on.
    approval_view(app, &record, true).await
}

async fn approve(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(key): Path<String>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    decided(&app, &headers, &key, bytes, true).await
}

async fn reject(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(key): Path<String>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    decided(&app, &headers, &key, bytes, false).await
}

/// A decision through the API: the operator's token, always.
async fn decided(
    app: &App,
    headers: &HeaderMap,
    key: &str,
    bytes: Result<Bytes, BytesRejection>,
    approve: bool,
) -> Result<Response, ApiError> {
    app.auth.operator(headers)?;
    let view = decide(app, key, body(bytes)?, approve).await?;
    Ok(json_response(StatusCode::OK, &view))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResolveBody {
    /// It took place: the operation's output, as the tool would have returned it.
    pub committed: Option<Value>,
    /// It did not take place: the next call of the step runs it again, with the same keys.
    #[serde(default)]
    pub not_committed: bool,
    /// The effect in doubt, when the operation has several.
    pub effect: Option<String>,
    pub by: String,
    pub note: Option<String>,
}

/// Settles an unknown operation by a person's word (API and console).
pub async fn settle(app: &App, key: &str, body: ResolveBody) -> Result<Value, ApiError> {
    let resolution = match (body.committed, body.not_committed) {
        (Some(output), false) => Resolution::Committed { output: output.to_string() },
        (None, true) => Resolution::NotCommitted,
        _ => {
            return Err(ApiError::BadRequest(
                "give exactly one of `committed` (the output) and `not_committed`".into(),
            ));
        }
    };
    if body.by.trim().is_empty() {
        return Err(ApiError::BadRequest("`by` names who decides, and is recorded".into()));
    }
    let op = app.host.ledger().operation(key).await?;
    if op.is_none() {
        return Err(ApiError::NotFound(format!("no operation with key {key}")));
    }
    let outcome = app
        .host
        .resolve(key, body.effect.as_deref(), &resolution, &body.by, body.note.as_deref())
        .await
        .map_err(|e| ApiError::from_operation(e, "resolve"))?;
    Ok(serde_json::to_value(outcome).unwrap_or_default())
}

async fn resolve(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(key): Path<String>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    app.auth.operator(&headers)?;
    let outcome = settle(&app, &key, body(bytes)?).await?;
    Ok(json_response(StatusCode::OK, &outcome))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UndoneBody {
    /// Who undid the step (recorded).
    pub by: String,
    /// How, and why (recorded).
    pub note: Option<String>,
}

/// Records a person's word that they undid step `key` by hand (API and console): the step's
/// compensation then counts it undone, and nothing is dispatched for it. `of_run`: the run the
/// caller named the step by (the console's page), which must be the step's.
pub async fn undone(app: &App, key: &str, of_run: Option<&str>, body: UndoneBody) -> Result<Value, ApiError> {
    if body.by.trim().is_empty() {
        return Err(ApiError::BadRequest("`by` names who undid the step, and is recorded".into()));
    }
    let ledger = app.host.ledger();
    let run = match ledger.operation(key).await? {
        Some(op) => Some(op.run_id),
        None => ledger.tombstone(key).await?.map(|stone| stone.run_id),
    };
    match (run, of_run) {
        (None, _) => return Err(ApiError::NotFound(format!("no operation with key {key}"))),
        (Some(run), Some(named)) if run != named => {
            return Err(ApiError::NotFound(format!("run {named} has no step with key {key}")));
        }
        _ => {}
    }
    let said = app
        .host
        .undone_by_hand(key, &body.by, body.note.as_deref())
        .await
        .map_err(|e| ApiError::from_operation(e, "undone-by-hand"))?;
    Ok(serde_json::to_value(said).unwrap_or_default())
}

async fn undone_by_hand(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(key): Path<String>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    // A word that closes a run's compensation: a decision, like settling.
    app.auth.operator(&headers)?;
    let said = undone(&app, &key, None, body(bytes)?).await?;
    Ok(json_response(StatusCode::OK, &said))
}

/// `ok`, `starting` (the first scan of the tools directory is compiling them: a call waits for
/// it) or `stopping`: 503 but when `ok`, so that a load balancer routes calls to a server ready
/// for them.
async fn healthz(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    let status = match (app.is_stopping(), app.loaded.is_ready()) {
        (true, _) => "stopping",
        (false, false) => "starting",
        (false, true) => "ok",
    };
    let code = if status == "ok" { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    // Anyone may ask whether it serves; what it serves from is for those who may call.
    if app.auth.may_call(&headers).is_err() {
        return json_response(code, &json!({ "status": status }));
    }
    json_response(
        code,
        &json!({
            "status": status,
            "tools": app.host.tools().len(),
            "compiling": app.loaded.compiling(),
            "load_errors": app.loaded.errors(),
            "in_flight": app.in_flight(),
            "ledger": app.host.ledger().path(),
        }),
    )
}

/// What is outstanding, read from the ledger.
pub async fn outstanding(app: &App) -> Result<Outstanding, ApiError> {
    let ledger = app.host.ledger();
    // O(open): the index of open work, never every operation (`Store::open_runs`).
    let open = ledger.open_runs(None, ledger.now_ms()).await?;
    let unknown = open.values().flatten().filter(|open| open.why == Why::Unknown).count();
    let approvals_pending = approval_views(app, None, true, false).await?.len();
    Ok(Outstanding { unknown: unknown as u64, approvals_pending: approvals_pending as u64 })
}

async fn metrics(State(app): State<Arc<App>>, headers: HeaderMap) -> Result<Response, ApiError> {
    app.auth.may_call(&headers)?;
    let text = app.metrics.render(&outstanding(&app).await?, &app.host.ledger().commit_latency());
    Ok(([("content-type", "text/plain; version=0.0.4")], text).into_response())
}

async fn openapi(State(app): State<Arc<App>>, headers: HeaderMap) -> Result<Response, ApiError> {
    // Beyond loopback or behind a proxy, only `/healthz` answers a stranger.
    app.auth.may_call(&headers)?;
    Ok(json_response(StatusCode::OK, &super::openapi::document()))
}
