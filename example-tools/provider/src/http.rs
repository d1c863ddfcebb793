//! HTTP plumbing shared by the handlers: JSON responses, the error shape, and
//! reading a request body safely.
//!
//! Everything a client can get wrong ends up as an [`ApiError`], which renders as
//! `{"error": "<code>", "message": "..."}`; handlers never panic on input.

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use hyper::{HeaderMap, Response, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::store::StoredResponse;

/// The response type of every handler.
pub(crate) type Resp = Response<Full<Bytes>>;

/// Largest request body accepted; anything bigger is refused with 413.
const MAX_BODY_BYTES: usize = 1024 * 1024;

/// How much of a refused body is read and discarded before giving up on it.
const MAX_DISCARD_BYTES: usize = 64 * 1024 * 1024;

/// A request the provider refuses, with the status and machine-readable code to send.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status} {code}: {message}")]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) code: &'static str,
    pub(crate) message: String,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, code, message: message.into() }
    }

    pub(crate) fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// The 500 an `ErrorBeforeCommit` fault answers with.
    pub(crate) fn injected_failure(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal_error", message)
    }

    /// The error as a serialized body, so it can be stored under an idempotency key.
    pub(crate) fn to_stored(&self) -> StoredResponse {
        let body = serde_json::json!({ "error": self.code, "message": self.message });
        StoredResponse { status: self.status, body: Bytes::from(body.to_string()) }
    }

    pub(crate) fn into_response(self) -> Resp {
        stored_response(&self.to_stored())
    }
}

/// Serializes `body` into a response stored for replay.
pub(crate) fn stored_json(status: StatusCode, body: &impl Serialize) -> StoredResponse {
    match serde_json::to_vec(body) {
        Ok(bytes) => StoredResponse { status, body: Bytes::from(bytes) },
        // Only reachable if a response type stops being serializable; answer rather than panic.
        Err(err) => {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", format!("could not serialize response: {err}"))
                .to_stored()
        }
    }
}

pub(crate) fn json_response(status: StatusCode, body: &impl Serialize) -> Resp {
    stored_response(&stored_json(status, body))
}

pub(crate) fn stored_response(stored: &StoredResponse) -> Resp {
    let mut response = Response::new(Full::new(stored.body.clone()));
    *response.status_mut() = stored.status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// The 429 a `RateLimit` fault answers with.
pub(crate) fn rate_limited(retry_after_ms: u64) -> Resp {
    let mut response = ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limited",
        format!("rate limited: retry after {retry_after_ms} ms"),
    )
    .into_response();
    // `Retry-After` only has whole seconds; round up so a client that obeys it
    // never comes back early. `Retry-After-Ms` carries the exact wait.
    let headers = response.headers_mut();
    headers.insert("retry-after", retry_after_ms.div_ceil(1000).into());
    headers.insert("retry-after-ms", retry_after_ms.into());
    response
}

/// The error a `CommitThenError` fault answers in place of the committed
/// response, shaped like any other error so the client cannot tell it from one
/// that committed nothing. A status that is not 4xx or 5xx is answered as 502.
pub(crate) fn gateway_error(status: u16) -> Resp {
    let status = StatusCode::from_u16(status)
        .ok()
        .filter(|status| status.is_client_error() || status.is_server_error())
        .unwrap_or(StatusCode::BAD_GATEWAY);
    let code = match status {
        StatusCode::INTERNAL_SERVER_ERROR => "internal_error",
        StatusCode::BAD_GATEWAY => "bad_gateway",
        StatusCode::SERVICE_UNAVAILABLE => "service_unavailable",
        StatusCode::GATEWAY_TIMEOUT => "gateway_timeout",
        _ => "upstream_error",
    };
    ApiError::new(status, code, format!("injected fault: the upstream answer was replaced by {status}")).into_response()
}

pub(crate) fn no_content() -> Resp {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = StatusCode::NO_CONTENT;
    response
}

/// Reads the body (at most [`MAX_BODY_BYTES`]) and parses it as JSON.
pub(crate) async fn read_json(headers: &HeaderMap, mut body: Incoming) -> Result<Value, ApiError> {
    // A declared oversize body is refused without buffering any of it.
    let declared =
        headers.get(CONTENT_LENGTH).and_then(|value| value.to_str().ok()).and_then(|value| value.parse::<u64>().ok());
    let bytes =
        if declared.is_some_and(|len| len > MAX_BODY_BYTES as u64) { None } else { read_limited(&mut body).await? };
    let Some(bytes) = bytes else {
        discard(&mut body).await;
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("request body exceeds {MAX_BODY_BYTES} bytes"),
        ));
    };
    serde_json::from_slice(&bytes)
        .map_err(|err| ApiError::bad_request("invalid_json", format!("request body is not valid JSON: {err}")))
}

/// The whole body, or `None` as soon as it grows past [`MAX_BODY_BYTES`].
async fn read_limited(body: &mut Incoming) -> Result<Option<Bytes>, ApiError> {
    let mut buffer = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame
            .map_err(|err| ApiError::bad_request("invalid_body", format!("could not read the request body: {err}")))?;
        if let Some(data) = frame.data_ref() {
            if buffer.len() + data.len() > MAX_BODY_BYTES {
                return Ok(None);
            }
            buffer.extend_from_slice(data);
        }
    }
    Ok(Some(buffer.freeze()))
}

/// Reads and throws away the rest of a refused body (up to [`MAX_DISCARD_BYTES`]).
///
/// Closing a socket that still has unread data makes the kernel send a reset,
/// which can destroy the 413 before the client reads it; letting the client
/// finish sending avoids that for any body of sensible size.
async fn discard(body: &mut Incoming) {
    let mut discarded = 0;
    while discarded < MAX_DISCARD_BYTES {
        match body.frame().await {
            Some(Ok(frame)) => discarded += frame.data_ref().map_or(0, Bytes::len),
            Some(Err(_)) | None => break,
        }
    }
}

/// Interprets parsed JSON as a request type; the message names the missing or bad field.
pub(crate) fn parse<T: DeserializeOwned>(value: Value) -> Result<T, ApiError> {
    serde_json::from_value(value)
        .map_err(|err| ApiError::bad_request("invalid_request", format!("invalid request: {err}")))
}

/// Decodes `%XX` escapes in a path segment (keys and SKUs may contain reserved characters).
pub(crate) fn percent_decode(segment: &str) -> Result<String, ApiError> {
    let invalid =
        || ApiError::bad_request("invalid_path", format!("path segment {segment:?} has an invalid percent-escape"));
    let bytes = segment.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hi = bytes.get(i + 1).and_then(hex_digit).ok_or_else(invalid)?;
            let lo = bytes.get(i + 2).and_then(hex_digit).ok_or_else(invalid)?;
            decoded.push(hi << 4 | lo);
            i += 3;
        } else {
            decoded.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(decoded).map_err(|_| invalid())
}

fn hex_digit(byte: &u8) -> Option<u8> {
    char::from(*byte).to_digit(16).and_then(|d| u8::try_from(d).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decode_handles_escapes_and_rejects_bad_ones() {
        assert_eq!(percent_decode("a%2Fb%3Ac").ok().as_deref(), Some("a/b:c"));
        assert_eq!(percent_decode("plain").ok().as_deref(), Some("plain"));
        assert!(percent_decode("bad%2").is_err());
        assert!(percent_decode("bad%zz").is_err());
        assert!(percent_decode("bad%+1").is_err());
        assert!(percent_decode("%ff").is_err());
    }

    #[test]
    fn errors_render_code_and_message() {
        let stored = ApiError::bad_request("invalid_json", "nope").to_stored();
        let body: Value = serde_json::from_slice(&stored.body).unwrap_or_default();
        assert_eq!(stored.status, StatusCode::BAD_REQUEST);
        assert_eq!(body, serde_json::json!({"error": "invalid_json", "message": "nope"}));
    }

    #[test]
    fn gateway_errors_keep_error_statuses_only() {
        assert_eq!(gateway_error(504).status(), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(gateway_error(502).status(), StatusCode::BAD_GATEWAY);
        assert_eq!(gateway_error(200).status(), StatusCode::BAD_GATEWAY);
        assert_eq!(gateway_error(1000).status(), StatusCode::BAD_GATEWAY);
    }
}
