//! `[notify]`: where a person is told that an approval is asked for, an unknown is left for them,
//! or a compensation is blocked.
//!
//! ```toml
//! [notify]
//! urls = ["https://hooks.example.com/oncebox"]   # each POSTed every notification, signed
//! secret = "at least 32 bytes, shared with the receivers"
//! unknown_after = "1m"                           # an unknown this old is left for a person
//! console_url = "https://oncebox.example.com"    # the link's base; else the server's address
//! ```
//!
//! Each notification goes through the outbox (`oncebox/notify URL` topics): retried with backoff
//! until a 2xx, kept in the ledger across a restart, sent with the event's key as
//! `Idempotency-Key` and signed (`crate::notice`). Keep the file readable by the operator only:
//! it holds the secret.

use std::time::Duration;

use serde::Deserialize;
use toml::{Spanned, Value};

use super::{Lines, PolicyError};
use crate::delivery::Endpoint;
use crate::notice::{MIN_SECRET_BYTES, SigningKey};

/// The default `unknown_after`: a minute, long enough for the reconciler's first tries.
pub const UNKNOWN_AFTER: Duration = Duration::from_secs(60);

/// The most `urls`: each is a topic the relay delivers.
pub const MAX_URLS: usize = 16;

/// The policy file's `[notify]`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// One endpoint per URL, each signing with the secret.
    pub endpoints: Vec<Endpoint>,
    /// How long an operation stays unknown before a person is told: the background reconciler
    /// may settle it meanwhile. Zero: at once.
    pub unknown_after: Duration,
    /// Where the console is, for the link in each notification; else the server's own address.
    pub console_url: Option<url::Url>,
}

impl Settings {
    /// Each endpoint with its outbox topic (`oncebox/notify URL`).
    pub fn topics(&self) -> Vec<(String, Endpoint)> {
        self.endpoints.iter().map(|endpoint| (crate::notice::topic(&endpoint.url), endpoint.clone())).collect()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNotify {
    urls: Option<Spanned<Value>>,
    secret: Option<Spanned<Value>>,
    unknown_after: Option<Spanned<Value>>,
    console_url: Option<Spanned<Value>>,
}

impl Lines<'_> {
    pub(super) fn notify(&self, raw: Option<Spanned<RawNotify>>) -> Result<Option<Settings>, PolicyError> {
        let Some(raw) = raw else { return Ok(None) };
        let section = raw.span();
        let raw = raw.into_inner();
        let Some(secret) = raw.secret else {
            return Err(self
                .invalid(section, "[notify] needs `secret = \"...\"`: what each notification is signed with".into()));
        };
        let span = secret.span();
        let secret = match secret.into_inner() {
            Value::String(text) if text.len() >= MIN_SECRET_BYTES => SigningKey::new(text.as_bytes()),
            Value::String(_) => {
                return Err(self.invalid(span, format!("[notify] `secret` must be at least {MIN_SECRET_BYTES} bytes")));
            }
            other => {
                return Err(self.invalid(span, format!("[notify] `secret` must be a string, not {}", other.type_str())));
            }
        };
        let mut endpoints = Vec::new();
        let urls = match raw.urls.map(|urls| (urls.span(), urls.into_inner())) {
            None => Vec::new(),
            Some((_, Value::Array(items))) => items,
            Some((span, _)) => return Err(self.invalid(span, "[notify] `urls` must be a list of URL strings".into())),
        };
        for url in urls {
            let url = self.endpoint_url(Spanned::new(section.clone(), url))?;
            let mut endpoint = Endpoint::new(url);
            // A receiver is asked to drop a repeated key (docs/operating.md); the relay sends a
            // notification whose answer was lost again either way.
            endpoint.honours_keys = true;
            endpoint.signing = Some(secret.clone());
            endpoints.push(endpoint);
        }
        if endpoints.is_empty() || endpoints.len() > MAX_URLS {
            return Err(self.invalid(section, format!("[notify] needs `urls`: 1 to {MAX_URLS} http or https URLs")));
        }
        let unknown_after = match raw.unknown_after {
            Some(value) => self.duration("unknown_after", value)?.value,
            None => UNKNOWN_AFTER,
        };
        let console_url = match raw.console_url {
            Some(value) => Some(self.endpoint_url(value)?),
            None => None,
        };
        Ok(Some(Settings { endpoints, unknown_after, console_url }))
    }
}
