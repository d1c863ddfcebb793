//! One send of one message to its endpoint, and what the relay observed of it. The meaning of the
//! observation is `oncebox_core::delivery::judge`'s.

use crate::effects::hooks::{Exchange, Hooks, Outgoing};
use crate::failure::HttpObservation;
use crate::ledger::OutboxMessage;

use super::Endpoint;

/// How much of a refusal's body the relay keeps in the message's record, for the operator.
const MAX_BODY_IN_ERROR: usize = 512;

/// What one send observed, and a one-line description for the record and the log (never the
/// credentials, never the payload).
#[derive(Debug)]
pub(super) struct Sent {
    pub observation: HttpObservation,
    pub description: String,
}

/// POSTs `message` to `endpoint` with its effect key as `Idempotency-Key`, and its topic and
/// sequence number for the consumer's own ordering checks; signed where the endpoint signs (a
/// `[notify]` URL's: `Oncebox-Signature`).
pub(super) async fn post(client: &reqwest::Client, endpoint: &Endpoint, message: &OutboxMessage) -> Sent {
    let target = endpoint.host_port();
    let request = match request(client, endpoint, message) {
        Ok(request) => request,
        // Nothing was sent. Not reached in practice: `Relay::new` refuses such a credential.
        Err(description) => return Sent { observation: HttpObservation::NotConnected, description },
    };
    match request.send().await {
        Err(e) if e.is_connect() => {
            Sent { observation: HttpObservation::NotConnected, description: format!("could not connect to {target}") }
        }
        Err(e) => {
            let what = if e.is_timeout() { "timed out".to_string() } else { e.to_string() };
            Sent {
                observation: HttpObservation::SentNoAnswer,
                description: format!("sent to {target}, no answer: {what}"),
            }
        }
        Ok(response) => {
            let status = response.status().as_u16();
            let retry_after = crate::effects::retry_after(response.headers());
            let mut description = format!("{target} answered {status}");
            if !response.status().is_success()
                && let Some(body) = snippet(response).await
            {
                description = format!("{description}: {body}");
            }
            Sent { observation: HttpObservation::Answered { status, retry_after }, description }
        }
    }
}

/// Like [`post`], answered by the harness's hooks in the endpoint's place, within the endpoint's
/// timeout as a real send is. (The hooks are not given the headers `post` adds.)
pub(super) async fn through(hooks: &dyn Hooks, endpoint: &Endpoint, message: &OutboxMessage) -> Sent {
    let target = endpoint.host_port();
    let request =
        Outgoing { method: "POST".into(), url: endpoint.url.to_string(), body: message.payload.clone().into_bytes() };
    let exchange = tokio::time::timeout(endpoint.timeout, hooks.deliver(message.effect_key.clone(), request))
        .await
        .unwrap_or_else(|_| Exchange::SentNoAnswer("timed out".into()));
    let description = match &exchange {
        Exchange::NotConnected => format!("could not connect to {target}"),
        Exchange::SentNoAnswer(why) => format!("sent to {target}, no answer: {why}"),
        Exchange::Answered { status, .. } => format!("{target} answered {status}"),
    };
    Sent { observation: exchange.observation(), description }
}

fn request(
    client: &reqwest::Client,
    endpoint: &Endpoint,
    message: &OutboxMessage,
) -> Result<reqwest::RequestBuilder, String> {
    // The SDK sends JSON; a payload that is not JSON is sent as the text it is.
    let content_type = if serde_json::from_str::<serde::de::IgnoredAny>(&message.payload).is_ok() {
        "application/json"
    } else {
        "text/plain; charset=utf-8"
    };
    let mut request = client
        .post(endpoint.url.clone())
        .timeout(endpoint.timeout)
        .header("idempotency-key", message.effect_key.as_str())
        .header("oncebox-topic", message.topic.as_str())
        .header("oncebox-seq", message.seq.to_string())
        .header(reqwest::header::CONTENT_TYPE, content_type)
        .body(message.payload.clone());
    for (name, value) in &endpoint.headers {
        let mut value = reqwest::header::HeaderValue::from_str(value)
            .map_err(|_| format!("the configured `{name}` header for {} is not a valid value", endpoint.host_port()))?;
        value.set_sensitive(true);
        request = request.header(name.as_str(), value);
    }
    // Signed at each send, so that the timestamp a receiver checks is this send's.
    if let Some(key) = &endpoint.signing {
        let unix_s = oncebox_core::clock::now_ms() / 1000;
        request = request.header(oncebox_core::notice::SIGNATURE_HEADER, key.sign(unix_s, message.payload.as_bytes()));
    }
    Ok(request)
}

/// The start of an answer's body, on one line, cut at [`MAX_BODY_IN_ERROR`] bytes.
async fn snippet(mut response: reqwest::Response) -> Option<String> {
    let mut body = Vec::new();
    while body.len() < MAX_BODY_IN_ERROR {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            _ => break,
        }
    }
    body.truncate(MAX_BODY_IN_ERROR);
    let text = String::from_utf8_lossy(&body).split_whitespace().collect::<Vec<_>>().join(" ");
    (!text.is_empty()).then_some(text)
}
