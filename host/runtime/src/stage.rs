//! What the call pipeline and its rooms (approvals, reconciliation, compensation) need of the host
//! they run in, and nothing more: the engine, the state every effect shares (the ledger, the key,
//! the HTTP client, the downstreams), the lease a claim holds and the name its claims carry. And
//! one [`Entry`] per loaded tool, resolved once at load, which a call reads without a lock. The
//! pipeline takes these, never the host, so nothing of the pipeline reaches back into it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::effects::Shared;
use crate::policy::RetryPolicy;
use crate::runtime::{LoadedTool, Runtime};

pub(crate) struct Stage {
    pub runtime: Runtime,
    pub shared: Arc<Shared>,
    /// How long a claim is held before another caller may take the operation over.
    pub lease: Duration,
    /// Names this host's claims in the ledger.
    pub owner: String,
}

/// A loaded tool with everything a call of it needs, resolved at load: its component and
/// sandbox, its effective retry policy and its operator config. Replaced whole, never changed.
pub(crate) struct Entry {
    pub tool: Arc<LoadedTool>,
    pub policy: RetryPolicy,
    pub config: Arc<HashMap<String, String>>,
}
