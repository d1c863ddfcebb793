//! `[outbox.TOPIC]`: where the relay delivers a topic's messages.
//!
//! ```toml
//! [outbox.email]
//! endpoint = "http://127.0.0.1:9000/email"   # POSTed, each message with its key as Idempotency-Key
//! honours_keys = true                         # the endpoint deduplicates by that key
//! timeout = "10s"
//! initial_backoff = "100ms"
//! max_backoff = "30s"
//! attempts_per_pass = 5                       # sends of one message per `deliver --once`
//! ```
//!
//! The relay records a delivery after the endpoint acknowledged it, so a relay killed in between
//! sends the message again: an endpoint that does not honour `Idempotency-Key` may see a message
//! twice after a crash (see [`Endpoint`]). Credentials for the endpoint go where every downstream's
//! go, under `[hosts."HOST:PORT".headers]`.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::{Spanned, Value};

use super::{Lines, PolicyError, ordered};
use crate::delivery::{Endpoint, MAX_ATTEMPTS_PER_PASS};
use crate::limits::MAX_NAME_BYTES;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOutbox {
    endpoint: Option<Spanned<Value>>,
    honours_keys: Option<Spanned<Value>>,
    timeout: Option<Spanned<Value>>,
    initial_backoff: Option<Spanned<Value>>,
    max_backoff: Option<Spanned<Value>>,
    attempts_per_pass: Option<Spanned<Value>>,
}

/// Every `[outbox.TOPIC]`, checked.
pub(super) fn parse(
    lines: &Lines<'_>,
    raw: BTreeMap<Spanned<String>, RawOutbox>,
) -> Result<BTreeMap<String, Endpoint>, PolicyError> {
    let mut topics = BTreeMap::new();
    for (topic, section) in raw {
        let endpoint = lines.outbox(&topic, section)?;
        topics.insert(topic.into_inner(), endpoint);
    }
    Ok(topics)
}

impl Lines<'_> {
    fn outbox(&self, topic: &Spanned<String>, raw: RawOutbox) -> Result<Endpoint, PolicyError> {
        let name = topic.get_ref();
        if name.is_empty() || name.len() > MAX_NAME_BYTES {
            return Err(self.invalid(
                topic.span(),
                format!("outbox topic `{name}` must be 1 to {MAX_NAME_BYTES} bytes, as topics are granted"),
            ));
        }
        if crate::notice::reserved(name) {
            let reserved = crate::notice::RESERVED_TOPICS;
            return Err(self
                .invalid(topic.span(), format!("[outbox.\"{name}\"]: topics under `{reserved}` are the host's own")));
        }
        let Some(url) = raw.endpoint else {
            return Err(self.invalid(
                topic.span(),
                format!("[outbox.{name}] needs `endpoint = \"http://...\"`: where its messages are delivered"),
            ));
        };
        let mut endpoint = Endpoint::new(self.endpoint_url(url)?);
        if let Some(value) = raw.honours_keys {
            endpoint.honours_keys = self.boolean("honours_keys", value)?.value;
        }
        if let Some(value) = raw.timeout {
            endpoint.timeout = self.positive("timeout", value)?.value;
        }
        let initial = raw.initial_backoff.map(|v| self.positive("initial_backoff", v)).transpose()?;
        let max = raw.max_backoff.map(|v| self.positive("max_backoff", v)).transpose()?;
        ordered(self.path, ("initial_backoff", initial), ("max_backoff", max))?;
        if let Some(at) = initial {
            endpoint.initial_backoff = at.value;
        }
        if let Some(at) = max {
            endpoint.max_backoff = at.value;
        }
        // One given against the other's default: name the line that was written.
        if endpoint.initial_backoff > endpoint.max_backoff {
            let line = initial.or(max).map_or(1, |at| at.line);
            return Err(PolicyError::Invalid {
                path: self.path.to_path_buf(),
                line,
                reason: format!(
                    "`initial_backoff` ({}) exceeds `max_backoff` ({}, its default filled in)",
                    humantime::format_duration(endpoint.initial_backoff),
                    humantime::format_duration(endpoint.max_backoff)
                ),
            });
        }
        if let Some(value) = raw.attempts_per_pass {
            endpoint.attempts_per_pass = self.attempts_per_pass(value)?;
        }
        Ok(endpoint)
    }

    pub(super) fn endpoint_url(&self, value: Spanned<Value>) -> Result<url::Url, PolicyError> {
        let span = value.span();
        let Value::String(text) = value.into_inner() else {
            return Err(self.invalid(span, "`endpoint` must be a URL string, as in \"http://127.0.0.1:9000/x\"".into()));
        };
        let url =
            url::Url::parse(&text).map_err(|e| self.invalid(span.clone(), format!("`endpoint = \"{text}\"`: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(self.invalid(span, format!("`endpoint = \"{text}\"`: an http or https URL with a host")));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(self.invalid(
                span,
                "`endpoint` may not carry credentials: put them under [hosts.\"HOST:PORT\".headers]".into(),
            ));
        }
        Ok(url)
    }

    fn attempts_per_pass(&self, value: Spanned<Value>) -> Result<u32, PolicyError> {
        let span = value.span();
        match value.into_inner() {
            Value::Integer(n) => match u32::try_from(n) {
                Ok(n @ 1..=MAX_ATTEMPTS_PER_PASS) => Ok(n),
                _ => {
                    Err(self
                        .invalid(span, format!("`attempts_per_pass = {n}`: must be from 1 to {MAX_ATTEMPTS_PER_PASS}")))
                }
            },
            other => {
                Err(self.invalid(span, format!("`attempts_per_pass` must be an integer, not {}", other.type_str())))
            }
        }
    }
}
