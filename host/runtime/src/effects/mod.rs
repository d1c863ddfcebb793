//! What a tool can reach: reads, config and effects, behind one narrow context per invocation.
//!
//! Every effect goes through the guarded path in `guard.rs`; the files beside it only say how to
//! perform one kind of effect and what its answer means. The context sees the ledger only through
//! the few methods the guarded path needs.

mod guard;
// Without the harness, nothing outside the pipeline constructs what only a harness answers.
#[cfg_attr(not(feature = "harness"), allow(dead_code))]
pub mod hooks;
mod http;
mod local;
mod provider;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

pub use guard::{DEFAULT_SEND_BY, DIVERGED};
pub use provider::{EffectProvider, ProviderOutcome};

pub(crate) use http::{retry_after, retry_after_in};
pub use oncebox_core::targets::{DEFAULT_SETTLE_WINDOW, HttpTarget, Targets};

use crate::capabilities::{Denied, Sandbox};
use crate::ledger::{AttemptEffect, EffectRecord, Ledger, LocalWrite, Staged};
use crate::limits;
use crate::runtime::bindings::{ToolError, oncebox::tool};

/// What every invocation of a host shares: the ledger, the HTTP client, the downstreams' settings
/// and the embedder's providers.
pub struct Shared {
    pub ledger: Ledger,
    /// Keys every fingerprint (of calls and of effects) with the ledger's secret.
    pub keying: crate::keys::FingerprintKey,
    pub http: reqwest::Client,
    pub targets: Targets,
    pub providers: HashMap<String, Arc<dyn EffectProvider>>,
    /// The test harness's hooks (`oncebox-testing`); `None` outside it.
    pub hooks: Option<Arc<dyn hooks::Hooks>>,
    /// How soon after its write-ahead's stamp an effect leaves, or is not sent at all
    /// ([`guard::late`]; [`DEFAULT_SEND_BY`]).
    pub send_by: std::time::Duration,
    /// Tells a person (`[notify]`); `None` when the policy file names nobody.
    pub notifier: Option<Arc<crate::notify::Notifier>>,
}

impl Shared {
    /// What the operator says about the downstream `host` (under the harness, the script's).
    pub fn target(&self, host: &str) -> HttpTarget {
        match &self.hooks {
            Some(hooks) => hooks.target(),
            None => self.targets.get(host),
        }
    }

    /// Lets the harness see (and crash at) `site`; nothing without it.
    pub async fn reached(&self, site: impl FnOnce() -> hooks::Site) {
        if let Some(hooks) = &self.hooks {
            hooks.at(site()).await;
        }
    }
}

impl Shared {
    /// Whether an effect whose outcome is unknown may be sent again with its key: the policy
    /// allows it, the downstream deduplicates by key, and it still remembers the key's first use.
    /// Local effects are never in doubt; unknown kinds are never resent.
    pub fn resendable(&self, effect: &EffectRecord, policy_allows: bool, now_ms: u64) -> bool {
        if !policy_allows {
            return false;
        }
        match effect.kind.as_str() {
            "http" => {
                let target = self.target(&effect.target);
                let age = Duration::from_millis(now_ms.saturating_sub(effect.first_dispatched_ms));
                // The resend may reach the downstream up to its timeout from now: the key must
                // still be remembered then, not only when it leaves.
                target.honours_keys && age.saturating_add(target.timeout) < target.key_retention
            }
            kind => kind
                .strip_prefix("provider:")
                .and_then(|name| self.providers.get(name))
                .is_some_and(|provider| provider.honours_keys()),
        }
    }
}

impl Shared {
    /// What the effect's downstream promises about looking it up: how long after its last
    /// dispatch it can still commit, and when it forgets the effect's key.
    pub fn lookup(&self, effect: &EffectRecord) -> crate::failure::Lookup {
        let send_by_ms = u64::try_from(self.send_by.as_millis()).unwrap_or(u64::MAX);
        match effect.kind.strip_prefix("provider:") {
            Some(name) => crate::failure::Lookup {
                sent_until_ms: effect.last_dispatch_ms().saturating_add(send_by_ms),
                settle_window: self
                    .providers
                    .get(name)
                    .map_or(DEFAULT_SETTLE_WINDOW, |provider| provider.settle_window()),
                forgotten_from_ms: None,
            },
            None => {
                let target = self.target(&effect.target);
                let retention_ms = u64::try_from(target.key_retention.as_millis()).unwrap_or(u64::MAX);
                let timeout_ms = u64::try_from(target.timeout.as_millis()).unwrap_or(u64::MAX);
                crate::failure::Lookup {
                    // The request may have left until `SEND_BY` after its write-ahead, and been on
                    // its way until the client gave up on it.
                    sent_until_ms: effect.last_dispatch_ms().saturating_add(send_by_ms).saturating_add(timeout_ms),
                    settle_window: target.settle_window,
                    forgotten_from_ms: target
                        .honours_keys
                        .then(|| effect.first_dispatched_ms.saturating_add(retention_ms)),
                }
            }
        }
    }
}

/// The operation an invocation works for.
#[derive(Debug, Clone)]
pub struct Scope {
    /// The operation's records, written with the attempt's fence.
    pub journal: crate::ledger::Journal,
    /// Whether the class and policy allow an in-doubt effect to be sent again with its key.
    pub redispatch_in_doubt: bool,
    /// The first attempt of a new operation's first claim: the ledger holds nothing of the
    /// operation but what this attempt writes, so its effects need no lookup (one read each
    /// fewer on the common path).
    pub first: bool,
    /// The sensitive values of the operation's args (`redact::sensitive_values`): an answer that
    /// echoes one is recorded masked, with its exact text sealed for the guest's replays
    /// (`seal::keep`). Empty for a tool whose manifest marks nothing sensitive: no work then.
    pub secrets: Arc<[String]>,
    /// The attempt's number, stamped on every effect it writes (`EffectRecord::attempt`).
    pub attempt: u32,
    /// The class is irreversible: an effect on record is never sent again (DESIGN section 7).
    pub once: bool,
    /// The attempt's span: the effects' spans are its children.
    pub(crate) trace: crate::telemetry::Span,
}

/// One invocation's view: its tool's sandbox, its operation, its config, and what its effects did.
pub struct EffectCtx {
    shared: Arc<Shared>,
    sandbox: Arc<Sandbox>,
    config: Arc<HashMap<String, String>>,
    scope: Option<Scope>,
    occurrences: HashMap<String, u32>,
    /// Effect imports called in this attempt, refused ones included.
    calls: u32,
    /// The effects of this attempt, in order.
    pub effects: Vec<AttemptEffect>,
    /// This attempt's effects that may have taken place: written ahead (or being written) and
    /// not answered, or answered in a way that proves nothing.
    pub in_doubt: Vec<InDoubt>,
    /// Set when a write-ahead failed: the local writes staged before it are lost with its job, so
    /// the attempt cannot complete, whatever the guest does with the error it got.
    pub broken: Option<String>,
    /// Set when a write-ahead was refused because a versioned KV write it carried found its key
    /// moved on: the attempt runs again from the start, uncounted, as for a conflict at its end.
    pub rerun: bool,
    /// KV and outbox writes not yet on disk: they go with the attempt's next durable write (a
    /// remote effect's write-ahead, or the attempt's record), in the same transaction.
    pub staged: Staged,
    /// Set when the attempt made more effect calls than its limit: the attempt fails with
    /// `effects-limit` whatever the guest does with the refusals.
    pub flooded: Option<String>,
}

/// An effect that may or may not have taken place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InDoubt {
    pub key: String,
    /// The downstream honours its key and still remembers it, and the policy allows a resend.
    pub resendable: bool,
}

impl EffectCtx {
    pub fn new(
        shared: Arc<Shared>,
        sandbox: Arc<Sandbox>,
        config: Arc<HashMap<String, String>>,
        scope: Option<Scope>,
    ) -> Self {
        EffectCtx {
            shared,
            sandbox,
            config,
            scope,
            occurrences: HashMap::new(),
            calls: 0,
            effects: Vec::new(),
            in_doubt: Vec::new(),
            staged: Vec::new(),
            broken: None,
            rerun: false,
            flooded: None,
        }
    }

    /// The sandbox of the tool this invocation runs.
    pub fn sandbox(&self) -> &Arc<Sandbox> {
        &self.sandbox
    }

    /// A refused capability: logged for the operator, returned to the guest as a permanent error
    /// that names the grant that would allow it.
    fn denied(&self, denied: Denied) -> ToolError {
        tracing::warn!(tool = %self.sandbox.tool, capability = denied.key, wanted = %denied.value, "capability denied");
        ToolError::Permanent(denied.message(&self.sandbox.tool))
    }

    /// Counts an effect call against the attempt's limit, and bounds its label and its payload.
    fn admit(&mut self, label: &str, what: &str, payload_len: usize) -> Result<(), ToolError> {
        self.calls = self.calls.saturating_add(1);
        let limit = self.sandbox.limits.effects_per_attempt;
        if self.calls > limit {
            let message = format!("the tool made more than {limit} effect calls in one attempt");
            self.flooded.get_or_insert_with(|| message.clone());
            return Err(ToolError::Permanent(message));
        }
        within("label", label.len(), limits::MAX_LABEL_BYTES)?;
        within(what, payload_len, self.sandbox.limits.effect_payload_bytes)
    }

    fn kv_namespace(&self, requested: Option<&str>) -> Result<String, ToolError> {
        within("KV namespace", requested.map_or(0, str::len), limits::MAX_NAME_BYTES)?;
        self.sandbox.grants.kv_namespace(&self.sandbox.tool, requested).map_err(|d| self.denied(d))
    }

    fn scope(&self) -> Result<&Scope, ToolError> {
        self.scope.as_ref().ok_or_else(|| {
            ToolError::Permanent("effects need an operation: call this tool with a run and a step".into())
        })
    }
}

/// Refuses a guest-supplied `what` of `len` bytes over `max` (see `limits.rs`), before anything is
/// recorded or sent. The refusal names the size, never the text.
fn within(what: &str, len: usize, max: usize) -> Result<(), ToolError> {
    if len > max {
        return Err(ToolError::Permanent(format!("the {what} is {len} bytes, over the limit of {max}")));
    }
    Ok(())
}

/// The `HasData` marker that hands bindings the narrow context instead of the whole store state.
pub struct HasEffects;

impl wasmtime::component::HasData for HasEffects {
    type Data<'a> = &'a mut EffectCtx;
}

impl tool::types::Host for EffectCtx {}

impl tool::config::Host for EffectCtx {
    async fn get(&mut self, key: String) -> Option<String> {
        self.config.get(&key).cloned()
    }
}

impl tool::reads::Host for EffectCtx {
    async fn http_get(
        &mut self,
        url: String,
        headers: Vec<(String, String)>,
    ) -> Result<tool::types::HttpResponse, ToolError> {
        self.http_read(&url, headers).await
    }

    async fn kv_get(
        &mut self,
        namespace: Option<String>,
        key: String,
    ) -> Result<Option<tool::types::KvEntry>, ToolError> {
        within("KV key", key.len(), limits::MAX_KV_KEY_BYTES)?;
        let namespace = self.kv_namespace(namespace.as_deref())?;
        // A read transaction takes microseconds: no need for the blocking pool.
        let committed = self.shared.ledger.kv_entry(&namespace, &key).await.map_err(guard::host_error)?;
        // The attempt reads its own staged writes first, the latest one winning, with the version
        // the key had when the attempt began: the one a versioned write must name.
        let version = committed.as_ref().map_or(0, |(_, version)| *version);
        let staged = self.staged.iter().rev().find_map(|(_, write)| match write {
            LocalWrite::KvSet { namespace: ns, key: k, value, .. } if *ns == namespace && *k == key => {
                Some(Some(value.clone()))
            }
            LocalWrite::KvDelete { namespace: ns, key: k } if *ns == namespace && *k == key => Some(None),
            _ => None,
        });
        let value = match staged {
            Some(value) => value,
            None => committed.map(|(value, _)| value),
        };
        Ok(value.map(|value| tool::types::KvEntry { value, version }))
    }
}

impl tool::effects::Host for EffectCtx {
    async fn http(
        &mut self,
        label: String,
        request: tool::effects::HttpRequest,
    ) -> Result<tool::types::HttpResponse, ToolError> {
        self.admit(&label, "HTTP body", request.body.len())?;
        self.http_effect(label, request).await
    }

    async fn kv_set(
        &mut self,
        label: String,
        namespace: Option<String>,
        key: String,
        value: Vec<u8>,
    ) -> Result<(), ToolError> {
        self.admit(&label, "KV value", value.len() + key.len())?;
        within("KV key", key.len(), limits::MAX_KV_KEY_BYTES)?;
        let namespace = self.kv_namespace(namespace.as_deref())?;
        self.local_effect(label, crate::ledger::LocalWrite::KvSet { namespace, key, value, expected: None }).await?;
        Ok(())
    }

    async fn kv_set_if(
        &mut self,
        label: String,
        namespace: Option<String>,
        key: String,
        value: Vec<u8>,
        expected: u64,
    ) -> Result<bool, ToolError> {
        self.admit(&label, "KV value", value.len() + key.len())?;
        within("KV key", key.len(), limits::MAX_KV_KEY_BYTES)?;
        let namespace = self.kv_namespace(namespace.as_deref())?;
        let write = crate::ledger::LocalWrite::KvSet { namespace, key, value, expected: Some(expected) };
        self.local_effect(label, write).await
    }

    async fn kv_delete(&mut self, label: String, namespace: Option<String>, key: String) -> Result<(), ToolError> {
        self.admit(&label, "KV key", key.len())?;
        within("KV key", key.len(), limits::MAX_KV_KEY_BYTES)?;
        let namespace = self.kv_namespace(namespace.as_deref())?;
        self.local_effect(label, crate::ledger::LocalWrite::KvDelete { namespace, key }).await?;
        Ok(())
    }

    async fn outbox(&mut self, label: String, topic: String, payload: Vec<u8>) -> Result<(), ToolError> {
        self.admit(&label, "outbox message", payload.len() + topic.len())?;
        within("outbox topic", topic.len(), limits::MAX_NAME_BYTES)?;
        self.sandbox.grants.check_outbox(&topic).map_err(|d| self.denied(d))?;
        let payload = String::from_utf8(payload)
            .map_err(|_| ToolError::Permanent("outbox payloads must be UTF-8 (the SDK sends JSON)".into()))?;
        self.local_effect(label, crate::ledger::LocalWrite::Outbox { topic, payload }).await?;
        Ok(())
    }

    async fn provider(&mut self, label: String, name: String, request: String) -> Result<String, ToolError> {
        self.admit(&label, "provider request", request.len())?;
        within("provider name", name.len(), limits::MAX_NAME_BYTES)?;
        self.sandbox.grants.check_provider(&name).map_err(|d| self.denied(d))?;
        self.provider_effect(label, name, request).await
    }

    async fn operation_key(&mut self) -> String {
        self.scope.as_ref().map(|s| s.journal.operation_key().to_string()).unwrap_or_default()
    }
}
