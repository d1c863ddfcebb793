//! Effect providers an embedder registers in Rust: they get keys, write-ahead records and
//! deduplication for free, exactly like the built-in HTTP effect.

use std::future::Future;
use std::pin::Pin;

use crate::runtime::bindings::ToolError;

use super::EffectCtx;
use super::guard::{Begin, Dispatched, Request};

/// How a provider call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderOutcome {
    /// Took effect; the JSON answer is recorded and replayed.
    Committed(String),
    /// Refused definitively (nothing was done); the JSON answer is recorded and replayed.
    Refused(String),
    /// Nothing took effect; a later attempt may try again with the same key.
    Transient(String),
    /// May have taken effect; the answer is lost.
    Unknown(String),
}

/// An embedder's effect. `effect_key` is stable across retries: pass it to the downstream.
pub trait EffectProvider: Send + Sync + 'static {
    fn call<'a>(
        &'a self,
        effect_key: &'a str,
        request: &'a str,
    ) -> Pin<Box<dyn Future<Output = ProviderOutcome> + Send + 'a>>;

    /// Whether the provider deduplicates by `effect_key`, so an in-doubt call may be resent.
    fn honours_keys(&self) -> bool {
        false
    }

    /// How long a call it received can still take effect after it was made (see
    /// [`HttpTarget::settle_window`](crate::HttpTarget::settle_window)).
    fn settle_window(&self) -> std::time::Duration {
        super::DEFAULT_SETTLE_WINDOW
    }
}

impl EffectCtx {
    pub(super) async fn provider_effect(
        &mut self,
        label: String,
        name: String,
        request: String,
    ) -> Result<String, ToolError> {
        let provider = self.shared.providers.get(&name).cloned().ok_or_else(|| {
            ToolError::Permanent(format!("no effect provider named `{name}` is registered with this host"))
        })?;
        let fingerprint = self.shared.keying.effect_fingerprint("provider", &[name.as_bytes(), request.as_bytes()]);
        let kind = format!("provider:{name}");
        let begin = self.begin(Request { kind: &kind, label: &label, target: &name, fingerprint }).await?;
        let (record, source, was_in_doubt, span) = match begin {
            Begin::Replay(json) => return Ok(json),
            Begin::Dispatch { record, source, was_in_doubt, span } => (record, source, was_in_doubt, span),
        };
        if let Some(late) = super::guard::late(&record, self.shared.ledger.now_ms(), self.shared.send_by) {
            return self.finish(record, source, was_in_doubt, span, late).await;
        }
        let outcome = match provider.call(&record.key, &request).await {
            ProviderOutcome::Committed(json) => Dispatched::Committed(json),
            ProviderOutcome::Refused(json) => Dispatched::Refused(json),
            ProviderOutcome::Transient(m) => Dispatched::Retryable(ToolError::Transient(m)),
            ProviderOutcome::Unknown(m) => Dispatched::Unknown(m),
        };
        self.finish(record, source, was_in_doubt, span, outcome).await
    }
}
