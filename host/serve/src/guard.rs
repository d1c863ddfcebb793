//! Requests a browser was tricked into sending. On loopback the API takes calls without a token,
//! so a web page the operator visits must not be able to send one: a request whose `Host` is not
//! this server (DNS rebinding) or whose `Origin` is another site's (a cross-site form or fetch) is
//! refused (403) before anything runs, and a POST to the API must be `application/json`, which a
//! page cannot send cross-site without a preflight this server never grants. `Host` and
//! `Origin` are read strictly: where the allow-list is a list, `Host` must be given; a second
//! one of either, or one that is not ASCII, is refused, never skipped.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, HOST, ORIGIN, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::app::App;
use super::error::ApiError;

pub async fn same_site(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let path = request.uri().path();
    let mut response = match refusal(&app, request.method(), path, request.headers()) {
        // A console form sent with Basic credentials gone stale (a new token) is asked for them
        // again, as the sign-in page asks, rather than left at a refusal.
        Some(error @ ApiError::Unauthorized(_)) if !path.starts_with("/v1/") && !path.starts_with("/mcp") => {
            let mut response = error.into_response();
            response.headers_mut().insert(WWW_AUTHENTICATE, HeaderValue::from_static(super::console::CHALLENGE));
            response
        }
        Some(error) => error.into_response(),
        None => next.run(request).await,
    };
    // What this server answers is the ledger's state, and the operator's answers hold unsealed
    // params: no proxy or browser cache keeps any of it.
    response.headers_mut().entry(CACHE_CONTROL).or_insert(HeaderValue::from_static("no-store"));
    response
}

fn refusal(app: &App, method: &Method, path: &str, headers: &HeaderMap) -> Option<ApiError> {
    let host = match one(headers, HOST) {
        Ok(host) => host,
        Err(why) => return Some(why),
    };
    match host {
        Some(host) if !app.auth.is_own_host(host) => {
            return Some(ApiError::Forbidden(format!("`Host: {}` does not name this server", shown(host))));
        }
        // An HTTP/1.0 health check (HAProxy's `http-check`, a probe with `nc`) names no host;
        // `/healthz` answers it (its status only, past loopback), as it answers anyone.
        None if app.auth.requires_host() && path != "/healthz" => {
            return Some(ApiError::Forbidden("a request must name this server in its `Host` header".into()));
        }
        _ => {}
    }
    match one(headers, ORIGIN) {
        Err(why) => return Some(why),
        Ok(Some(origin)) if !app.auth.is_own_origin(origin, host) => {
            return Some(ApiError::Forbidden(format!(
                "a request from {} is refused: it is another site's",
                shown(origin)
            )));
        }
        Ok(_) => {}
    }
    let header = |name| headers.get(name).and_then(|v: &axum::http::HeaderValue| v.to_str().ok());
    let has_body = header(CONTENT_LENGTH).is_some_and(|n| n != "0") || headers.contains_key("transfer-encoding");
    let json =
        header(CONTENT_TYPE).is_some_and(|t| t.split(';').next().is_some_and(|t| t.trim() == "application/json"));
    if *method == Method::POST && path.starts_with("/v1/") && has_body && !json {
        return Some(ApiError::UnsupportedMedia(
            "a request body to the API must be `Content-Type: application/json`".into(),
        ));
    }
    // Beyond loopback, a stranger's body is refused before it is read (no route takes one from
    // a stranger: the console's sign-in is the browser's Basic credentials, a header).
    if has_body {
        return app.auth.may_send_body(headers).err();
    }
    None
}

/// A header that may appear once, as visible ASCII: a second one, or one that is not text, is
/// refused rather than skipped, so that no check is passed by a header it could not read.
fn one(headers: &HeaderMap, name: HeaderName) -> Result<Option<&str>, ApiError> {
    let mut values = headers.get_all(&name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ApiError::BadRequest(format!("a request may carry one `{name}` header, not several")));
    }
    value.to_str().map(Some).map_err(|_| ApiError::BadRequest(format!("the `{name}` header is not visible ASCII")))
}

/// A header's value as an answer quotes it: bounded, so a refusal never echoes a page of it.
fn shown(value: &str) -> String {
    const SHOWN: usize = 200;
    match value.char_indices().nth(SHOWN) {
        Some((at, _)) => format!("{}...", &value[..at]),
        None => value.to_string(),
    }
}
