//! HTTP: reads (GET/HEAD, no record) and effects (any method, guarded, with `Idempotency-Key`).
//!
//! What an answer means is the rule of evidence's (`failure::http`): a refused connection sent
//! nothing (retryable); 429 is a rate limit (retryable after the wait); a timeout, a broken
//! connection, 408, 409 or a 5xx leaves the effect in doubt (resent with its key only where the host
//! honours keys); anything else is definitive and recorded for the tool to interpret.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::failure::{self, HttpObservation, HttpVerdict};
use crate::retry::Failure;
use crate::runtime::bindings::{HttpRequest, HttpResponse, RateLimit, ToolError};

use super::guard::{Begin, Dispatched, Request};
use super::hooks::{Exchange, Outgoing, Point};
use super::{EffectCtx, HttpTarget, within};
use crate::limits::{MAX_HEADER_NAME_BYTES, MAX_HEADER_VALUE_BYTES, MAX_HEADERS, MAX_METHOD_BYTES, MAX_URL_BYTES};

/// The largest response body the host reads and records; longer bodies are cut here.
pub const MAX_RESPONSE_BYTES: usize = 1 << 20;

/// Response headers the ledger never keeps.
const SECRET_HEADERS: [&str; 4] = ["authorization", "proxy-authorization", "cookie", "set-cookie"];

/// Headers a tool may not set: the host owns routing, framing, the key and the trace context.
const RESERVED_HEADERS: [&str; 7] =
    ["host", "idempotency-key", "traceparent", "tracestate", "content-length", "transfer-encoding", "connection"];

/// An HTTP answer as the ledger keeps it.
#[derive(Debug, Serialize, Deserialize)]
struct RecordedResponse {
    status: u16,
    headers: Vec<(String, String)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    body: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    body_hex: Option<String>,
}

impl From<&HttpResponse> for RecordedResponse {
    fn from(r: &HttpResponse) -> Self {
        let (body, body_hex) = match std::str::from_utf8(&r.body) {
            Ok(text) => (Some(text.to_string()), None),
            Err(_) => (None, Some(hex::encode(&r.body))),
        };
        RecordedResponse { status: r.status, headers: r.headers.clone(), body, body_hex }
    }
}

impl RecordedResponse {
    fn into_response(self) -> Result<HttpResponse, ToolError> {
        let body = match (self.body, self.body_hex) {
            (Some(text), _) => text.into_bytes(),
            (None, Some(h)) => hex::decode(h).map_err(|e| ToolError::Permanent(format!("host: recorded body: {e}")))?,
            (None, None) => Vec::new(),
        };
        Ok(HttpResponse { status: self.status, headers: self.headers, body })
    }
}

/// `host:port` of an http(s) URL, or why the URL is unusable.
fn target_of(url: &reqwest::Url) -> Result<String, ToolError> {
    if !matches!(url.scheme(), "http" | "https") {
        return Err(ToolError::Permanent(format!("unsupported URL scheme `{}`: http or https", url.scheme())));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(ToolError::Permanent("URLs with credentials are refused: the host attaches credentials".into()));
    }
    let host = url.host_str().ok_or_else(|| ToolError::Permanent(format!("URL without a host: {url}")))?;
    let port = url.port_or_known_default().unwrap_or(if url.scheme() == "https" { 443 } else { 80 });
    Ok(format!("{host}:{port}"))
}

fn parse_url(url: &str) -> Result<reqwest::Url, ToolError> {
    reqwest::Url::parse(url).map_err(|e| ToolError::Permanent(format!("invalid URL `{url}`: {e}")))
}

fn builder(
    client: &reqwest::Client,
    method: &str,
    url: reqwest::Url,
    headers: &[(String, String)],
    target: &HttpTarget,
) -> Result<reqwest::RequestBuilder, ToolError> {
    bounded(method, headers)?;
    let method = reqwest::Method::from_bytes(method.to_ascii_uppercase().as_bytes())
        .map_err(|_| ToolError::Permanent(format!("invalid HTTP method `{method}`")))?;
    let mut request = client.request(method, url).timeout(target.timeout);
    for (name, value) in headers {
        // The operator's credentials for this downstream replace whatever the tool put there.
        if target.headers.iter().any(|(credential, _)| credential.eq_ignore_ascii_case(name)) {
            continue;
        }
        if RESERVED_HEADERS.iter().any(|r| name.eq_ignore_ascii_case(r)) {
            return Err(ToolError::Permanent(format!("a tool may not set the `{name}` header")));
        }
        let name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| ToolError::Permanent(format!("invalid header name `{name}`")))?;
        let value = reqwest::header::HeaderValue::from_str(value)
            .map_err(|_| ToolError::Permanent(format!("invalid value for header `{name}`")))?;
        request = request.header(name, value);
    }
    for (name, value) in &target.headers {
        let mut value = reqwest::header::HeaderValue::from_str(value)
            .map_err(|_| ToolError::Permanent(format!("host: the configured `{name}` header is not a valid value")))?;
        value.set_sensitive(true);
        request = request.header(name.as_str(), value);
    }
    Ok(request)
}

/// Refuses a method, a header count, or a header name or value over its limit (`limits.rs`).
fn bounded(method: &str, headers: &[(String, String)]) -> Result<(), ToolError> {
    within("HTTP method", method.len(), MAX_METHOD_BYTES)?;
    if headers.len() > MAX_HEADERS {
        return Err(ToolError::Permanent(format!(
            "the request has {} headers, over the limit of {MAX_HEADERS}",
            headers.len()
        )));
    }
    for (name, value) in headers {
        within("header name", name.len(), MAX_HEADER_NAME_BYTES)?;
        within("header value", value.len(), MAX_HEADER_VALUE_BYTES)?;
    }
    Ok(())
}

/// A header's value as text: UTF-8 where it is, else each byte as the Latin-1 character it
/// stands for (HTTP's historical header charset, as a browser's `fetch` reads it), so that no
/// character the downstream sent is lost, and a sensitive value it echoed in Latin-1 is found and
/// masked like any other.
fn header_text(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_string(),
        Err(_) => bytes.iter().map(|&b| char::from(b)).collect(),
    }
}

/// Sends, observes, and lets [`conclude`] say what the observation means.
async fn perform(request: reqwest::RequestBuilder, target: &str) -> Dispatched {
    let (observation, response) = match request.send().await {
        Err(e) if e.is_connect() => (HttpObservation::NotConnected, Err(format!("could not connect to {target}"))),
        Err(e) => (HttpObservation::SentNoAnswer, Err(format!("sent to {target}, no answer: {}", describe(&e)))),
        Ok(r) => {
            let observation =
                HttpObservation::Answered { status: r.status().as_u16(), retry_after: retry_after(r.headers()) };
            (observation, Ok(r))
        }
    };
    let (response, lost) = match response {
        Ok(response) => (Some(response), None),
        Err(message) => (None, Some(message)),
    };
    match (conclude(&observation, target, lost), response) {
        (Conclusion::Done(dispatched), _) => dispatched,
        (Conclusion::Read { status, taken }, Some(response)) => read_answer(response, status, target, taken).await,
        // An answer is read only from a response; there is none without one.
        (Conclusion::Read { status, .. }, None) => Dispatched::Unknown(format!("{target} answered {status}")),
    }
}

/// What an exchange means, by `failure::http`: the one mapping for a real exchange and a scripted
/// one. `lost`: why there was no answer, when there was none.
enum Conclusion {
    Done(Dispatched),
    /// A definitive answer, whose body is its record. `taken`: the downstream did it (else it
    /// refused).
    Read {
        status: u16,
        taken: bool,
    },
}

fn conclude(observation: &HttpObservation, target: &str, lost: Option<String>) -> Conclusion {
    let status = match observation {
        HttpObservation::Answered { status, .. } => *status,
        _ => 0,
    };
    let message = lost.unwrap_or_else(|| format!("{target} answered {status}"));
    Conclusion::Done(match failure::http(observation) {
        HttpVerdict::NotTaken(Failure::RateLimited { retry_after }) => {
            Dispatched::Retryable(ToolError::RateLimited(RateLimit {
                retry_after_ms: u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX),
                message,
            }))
        }
        HttpVerdict::NotTaken(_) => {
            Dispatched::Retryable(ToolError::Transient(format!("{message}; nothing took effect")))
        }
        HttpVerdict::InDoubt => Dispatched::Unknown(message),
        HttpVerdict::Taken => return Conclusion::Read { status, taken: true },
        HttpVerdict::Refused => return Conclusion::Read { status, taken: false },
    })
}

/// Reads a definitive answer's body; losing the body loses the answer, so the outcome is unknown.
async fn read_answer(response: reqwest::Response, status: u16, target: &str, taken: bool) -> Dispatched {
    let headers =
        response.headers().iter().map(|(name, value)| (name.to_string(), header_text(value.as_bytes()))).collect();
    match response.bytes().await {
        Ok(body) => recorded(HttpResponse { status, headers, body: body.to_vec() }, target, taken),
        Err(e) => Dispatched::Unknown(format!("{target} answered {status} but the body was lost: {}", describe(&e))),
    }
}

/// A definitive answer as its record: bounded, and without credentials or cookies (which so never
/// reach the guest on a replay).
fn recorded(mut answer: HttpResponse, target: &str, taken: bool) -> Dispatched {
    answer.headers.retain(|(name, _)| !SECRET_HEADERS.contains(&name.to_ascii_lowercase().as_str()));
    answer.body.truncate(MAX_RESPONSE_BYTES);
    match serde_json::to_string(&RecordedResponse::from(&answer)) {
        Ok(json) if taken => Dispatched::Committed(json),
        Ok(json) => Dispatched::Refused(json),
        Err(e) => Dispatched::Unknown(format!("answer from {target} could not be encoded: {e}")),
    }
}

/// What a scripted exchange means, by the same rule as a real one ([`conclude`]).
fn judge(exchange: Exchange, target: &str) -> Dispatched {
    let observation = exchange.observation();
    let (lost, answer) = match exchange {
        Exchange::NotConnected => (Some(format!("could not connect to {target}")), None),
        Exchange::SentNoAnswer(why) => (Some(format!("sent to {target}, no answer: {why}")), None),
        Exchange::Answered { status, headers, body } => (None, Some(HttpResponse { status, headers, body })),
    };
    match (conclude(&observation, target, lost), answer) {
        (Conclusion::Done(dispatched), _) => dispatched,
        (Conclusion::Read { taken, .. }, Some(answer)) => recorded(answer, target, taken),
        (Conclusion::Read { status, .. }, None) => Dispatched::Unknown(format!("{target} answered {status}")),
    }
}

fn describe(e: &reqwest::Error) -> String {
    if e.is_timeout() { "timed out".into() } else { e.to_string() }
}

/// A rate limit's wait, from `Retry-After-Ms` or `Retry-After` (seconds). The outbox relay reads
/// its endpoints' answers with it too.
pub(crate) fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    retry_after_in(|name| headers.get(name).and_then(|v| v.to_str().ok()))
}

/// [`retry_after`] over any header lookup (by lowercase name).
pub(crate) fn retry_after_in<'h>(header: impl Fn(&str) -> Option<&'h str>) -> Option<Duration> {
    let get = |name: &str| header(name).and_then(|v| v.trim().parse::<u64>().ok());
    get("retry-after-ms").map(Duration::from_millis).or_else(|| get("retry-after").map(Duration::from_secs))
}

fn decode(json: &str) -> Result<HttpResponse, ToolError> {
    serde_json::from_str::<RecordedResponse>(json)
        .map_err(|e| ToolError::Permanent(format!("host: undecodable recorded response: {e}")))?
        .into_response()
}

impl EffectCtx {
    /// The URL parsed once, checked against the tool's grants, and its `host:port`. The request is
    /// sent to this parsed URL, so what was checked is what is reached.
    fn granted(&self, url: &str) -> Result<(reqwest::Url, String), ToolError> {
        within("URL", url.len(), MAX_URL_BYTES)?;
        let url = parse_url(url)?;
        let target = target_of(&url)?;
        self.sandbox.grants.check_http(&url).map_err(|d| self.denied(d))?;
        Ok((url, target))
    }

    /// A read: GET, never recorded.
    pub(super) async fn http_read(&self, url: &str, headers: Vec<(String, String)>) -> Result<HttpResponse, ToolError> {
        let (url, target) = self.granted(url)?;
        let settings = self.shared.target(&target);
        let request = builder(&self.shared.http, "GET", url.clone(), &headers, &settings)?;
        let answered = match &self.shared.hooks {
            Some(hooks) => {
                let outgoing = Outgoing { method: "GET".into(), url: url.to_string(), body: Vec::new() };
                judge(hooks.read(outgoing).await, &target)
            }
            None => perform(request, &target).await,
        };
        match answered {
            Dispatched::Committed(json) | Dispatched::Refused(json) => decode(&json),
            Dispatched::Retryable(e) => Err(e),
            // A read changed nothing, so a lost answer is only a transient failure.
            Dispatched::Unknown(message) => Err(ToolError::Transient(message)),
        }
    }

    pub(super) async fn http_effect(&mut self, label: String, request: HttpRequest) -> Result<HttpResponse, ToolError> {
        let (url, target) = self.granted(&request.url)?;
        let settings = self.shared.target(&target);
        // Validate everything the guest controls before the write-ahead record exists.
        let prepared = builder(&self.shared.http, &request.method, url.clone(), &request.headers, &settings)?;
        let fingerprint = self.shared.keying.effect_fingerprint(
            "http",
            &[request.method.to_ascii_uppercase().as_bytes(), request.url.as_bytes(), &request.body],
        );
        let begin = self.begin(Request { kind: "http", label: &label, target: &target, fingerprint }).await?;
        let (record, source, was_in_doubt, span) = match begin {
            Begin::Replay(json) => return decode(&json),
            Begin::Dispatch { record, source, was_in_doubt, span } => (record, source, was_in_doubt, span),
        };
        tracing::debug!(effect_key = %record.key, %target, %label, ?source, "dispatching http effect");
        let outcome = match &self.shared.hooks {
            _ if let Some(late) = super::guard::late(&record, self.shared.ledger.now_ms(), self.shared.send_by) => late,
            // Under the harness the script is the downstream; the rule of evidence still judges.
            Some(hooks) => {
                let site = super::guard::site(&record, Point::AfterWriteAhead);
                let outgoing =
                    Outgoing { method: request.method.to_ascii_uppercase(), url: url.to_string(), body: request.body };
                judge(hooks.http(site, outgoing).await, &target)
            }
            None => {
                let mut prepared = prepared.header("idempotency-key", record.key.as_str()).body(request.body);
                // The effect's trace context goes with its key (`telemetry`): the downstream's
                // spans are the effect span's children.
                for (name, value) in span.headers() {
                    prepared = prepared.header(name, value);
                }
                let answered = perform(prepared, &target).await;
                let lookup = self.shared.lookup(&record);
                super::guard::overran(&lookup, &record.key, &target, self.shared.ledger.now_ms());
                answered
            }
        };
        let json = self.finish(record, source, was_in_doubt, span, outcome).await?;
        decode(&json)
    }
}
