//! Request routing, and the handlers that are not effects: reconciliation
//! lookups, inventory, counts, and fault and settings administration.

use std::time::Duration;

use hyper::body::Incoming;
use hyper::header::{ALLOW, HeaderValue};
use hyper::{Method, Request, StatusCode};
use serde::Deserialize;
use serde_json::json;

use crate::Provider;
use crate::effects::{self, Reply};
use crate::faults::{Fault, FaultKind};
use crate::http::{self, ApiError, Resp, json_response, no_content, percent_decode};
use crate::model::Route;
use crate::settings::Settings;

/// Routes one request to its handler.
pub(crate) async fn dispatch(provider: &Provider, request: Request<Incoming>) -> Reply {
    let path = request.uri().path().to_owned();
    // The path always starts with '/', so the first split item is empty.
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    let method = request.method().clone();

    let result = match segments.as_slice() {
        ["counts"] => match method {
            Method::GET => Ok(json_response(StatusCode::OK, &provider.store.totals())),
            _ => Ok(method_not_allowed("GET")),
        },
        ["counts", order_id] => match method {
            Method::GET => percent_decode(order_id)
                .map(|order_id| json_response(StatusCode::OK, &provider.store.counts(&order_id))),
            _ => Ok(method_not_allowed("GET")),
        },
        ["faults"] => match method {
            Method::POST => arm_fault(provider, request).await,
            Method::DELETE => {
                provider.faults.clear();
                Ok(no_content())
            }
            _ => Ok(method_not_allowed("POST, DELETE")),
        },
        ["settings"] => match method {
            Method::GET => Ok(json_response(StatusCode::OK, &provider.store.settings())),
            Method::POST => configure(provider, request).await,
            _ => Ok(method_not_allowed("GET, POST")),
        },
        ["inventory", sku] => {
            if method == Method::GET {
                // Counted on arrival, so faulted and malformed reads count too.
                provider.store.note_read();
            }
            match percent_decode(sku) {
                Err(err) => Err(err),
                Ok(sku) => match method {
                    Method::GET => return read_stock(provider, &sku).await,
                    Method::POST => set_stock(provider, &sku, request).await,
                    _ => Ok(method_not_allowed("GET, POST")),
                },
            }
        }
        [name] => match effect_route(name) {
            Some(route) if method == Method::POST => {
                return effects::handle(provider, route, request).await;
            }
            Some(_) => Ok(method_not_allowed("POST")),
            None => Err(unknown_route(&path)),
        },
        [name, "by-key", key] => match effect_route(name) {
            Some(route) if method == Method::GET => by_key(provider, route, key),
            Some(_) => Ok(method_not_allowed("GET")),
            None => Err(unknown_route(&path)),
        },
        _ => Err(unknown_route(&path)),
    };
    Reply::Send(result.unwrap_or_else(ApiError::into_response))
}

/// `GET /{route}/by-key/{key}`: what the provider committed under a key, so a
/// client that lost a response can reconcile instead of guessing.
///
/// The stored status is returned with the stored body: 200 for a committed
/// effect, or e.g. 402 for a payment that was definitively declined. 404 means
/// only "not found now": nothing committed yet (possibly still in flight), or the
/// settings hide the commit (lookups off, an index that lags, a forgotten key).
fn by_key(provider: &Provider, route: Route, key: &str) -> Result<Resp, ApiError> {
    let key = percent_decode(key)?;
    provider
        .store
        .by_key(route, &key)
        .map(|stored| http::stored_response(&stored))
        .ok_or_else(|| ApiError::not_found(format!("no committed {route} request with key {key:?}")))
}

/// The effect route named by a first path segment; `inventory` is not one.
fn effect_route(segment: &str) -> Option<Route> {
    Route::from_segment(segment).filter(|route| route.is_effect())
}

/// `GET /inventory/{sku}`: reads the stock, unless a [`Route::Inventory`] fault
/// for the SKU intervenes. A read commits nothing, so every fault kind acts
/// before (or instead of) reading.
async fn read_stock(provider: &Provider, sku: &str) -> Reply {
    match provider.faults.take(Route::Inventory, sku) {
        None => Reply::Send(stock_response(provider, sku)),
        Some(FaultKind::LoseResponse) => Reply::Lose,
        Some(FaultKind::Delay { delay_ms } | FaultKind::CommitAfterDelay { delay_ms }) => {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            Reply::Send(stock_response(provider, sku))
        }
        Some(FaultKind::RateLimit { retry_after_ms }) => Reply::Send(http::rate_limited(retry_after_ms)),
        Some(FaultKind::CommitThenError { status }) => Reply::Send(http::gateway_error(status)),
        Some(FaultKind::ErrorBeforeCommit) => {
            Reply::Send(ApiError::injected_failure("injected fault: the read failed").into_response())
        }
    }
}

fn stock_response(provider: &Provider, sku: &str) -> Resp {
    json_response(StatusCode::OK, &json!({ "sku": sku, "available": provider.store.stock(sku) }))
}

#[derive(Debug, Deserialize)]
struct SetStock {
    available: u64,
}

/// `POST /inventory/{sku}`: an admin route for test setup, not an effect.
async fn set_stock(provider: &Provider, sku: &str, request: Request<Incoming>) -> Result<Resp, ApiError> {
    let (parts, body) = request.into_parts();
    let SetStock { available } = http::parse(http::read_json(&parts.headers, body).await?)?;
    provider.store.set_stock(sku, available);
    Ok(stock_response(provider, sku))
}

async fn arm_fault(provider: &Provider, request: Request<Incoming>) -> Result<Resp, ApiError> {
    let (parts, body) = request.into_parts();
    let fault: Fault = http::parse(http::read_json(&parts.headers, body).await?)?;
    if fault.times == 0 {
        // Over the Rust API such a fault is silently spent; over HTTP it is
        // almost certainly a mistake in the test that sent it.
        return Err(ApiError::bad_request("invalid_request", "invalid request: `times` must be at least 1"));
    }
    if let Some(problem) = fault.kind.problem() {
        return Err(ApiError::bad_request("invalid_request", format!("invalid request: {problem}")));
    }
    provider.faults.arm(fault);
    Ok(no_content())
}

/// `POST /settings`: replaces the settings (omitted fields take their defaults)
/// and answers with the settings now in force.
async fn configure(provider: &Provider, request: Request<Incoming>) -> Result<Resp, ApiError> {
    let (parts, body) = request.into_parts();
    let settings: Settings = http::parse(http::read_json(&parts.headers, body).await?)?;
    provider.store.configure(settings);
    Ok(json_response(StatusCode::OK, &provider.store.settings()))
}

fn method_not_allowed(allow: &'static str) -> Resp {
    let mut response =
        ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", format!("allowed methods: {allow}"))
            .into_response();
    response.headers_mut().insert(ALLOW, HeaderValue::from_static(allow));
    response
}

fn unknown_route(path: &str) -> ApiError {
    ApiError::not_found(format!("no route for {path}"))
}
