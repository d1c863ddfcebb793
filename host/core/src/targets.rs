//! What the operator says about each downstream HTTP host.

use std::collections::HashMap;
use std::time::Duration;

/// How long, unless the operator says otherwise, a downstream may still commit a request after it
/// was sent: long enough for a slow handler or a retried queue, short enough that a person is not
/// kept waiting for a day. A `not-committed` lookup before it has passed proves nothing.
pub const DEFAULT_SETTLE_WINDOW: Duration = Duration::from_secs(300);

/// A downstream's settings, keyed by `host:port`.
#[derive(Clone, PartialEq, Eq)]
pub struct HttpTarget {
    /// Whether it deduplicates by `Idempotency-Key` (Stripe does; most APIs do not).
    pub honours_keys: bool,
    /// How long it remembers a key (Stripe: 24 h). Past this a resend is a new request.
    pub key_retention: Duration,
    /// How long to wait for an answer before the effect's outcome becomes unknown.
    pub timeout: Duration,
    /// How long a request it received can still commit (a slow handler, a queue, a lagging
    /// index): a `not-committed` lookup counts as proof only once this has passed since the
    /// effect was last sent. Defaults to [`DEFAULT_SETTLE_WINDOW`].
    pub settle_window: Duration,
    /// Credentials the host attaches to every request to this downstream (`authorization`, say).
    /// They never enter the sandbox, and no log, record or output shows their values.
    pub headers: Vec<(String, String)>,
}

impl std::fmt::Debug for HttpTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let header_names: Vec<&str> = self.headers.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("HttpTarget")
            .field("honours_keys", &self.honours_keys)
            .field("key_retention", &self.key_retention)
            .field("timeout", &self.timeout)
            .field("settle_window", &self.settle_window)
            .field("headers", &header_names)
            .finish()
    }
}

impl Default for HttpTarget {
    /// An unknown downstream: keys are sent but not trusted.
    fn default() -> Self {
        HttpTarget {
            honours_keys: false,
            key_retention: Duration::ZERO,
            timeout: Duration::from_secs(10),
            settle_window: DEFAULT_SETTLE_WINDOW,
            headers: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct Targets {
    pub by_host: HashMap<String, HttpTarget>,
}

impl Targets {
    pub fn get(&self, host: &str) -> HttpTarget {
        self.by_host.get(host).cloned().unwrap_or_default()
    }
}
