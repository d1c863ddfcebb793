//! One attempt: a fresh instance from the `InstancePre`, the invocation under a deadline, and what
//! the guest left in its effect context.

use std::time::Duration;

use wasmtime::Store;

use super::bindings::{Reconciliation, ToolError};
use super::{EPOCH_TICK, LoadedTool, MAX_OUTPUT_BYTES, MemoryLimitExceeded, Runtime, StoreState};
use crate::effects::EffectCtx;

/// How an invocation ended, before any policy looked at it.
#[derive(Debug)]
pub enum Invocation {
    Returned(String),
    Failed(ToolError),
    /// The guest trapped (a panic, an out-of-bounds access, a limit); the host is fine.
    Trapped(String),
    /// The attempt ran out of time.
    DeadlineExceeded,
    /// The guest tried to grow its memory past the limit.
    MemoryLimit(String),
    /// The guest returned more output than the host keeps.
    OutputTooLarge(usize),
}

/// Epoch ticks covering `d`, at least one.
pub(super) fn ticks(d: Duration) -> u64 {
    (d.as_millis() / EPOCH_TICK.as_millis()).max(1) as u64
}

impl Runtime {
    /// Runs `invoke(args)` once. Returns the context so the caller can read the attempt's effects.
    pub async fn invoke(
        &self,
        tool: &LoadedTool,
        effects: EffectCtx,
        args: &str,
        deadline: Duration,
    ) -> (Invocation, EffectCtx) {
        let mut store = self.store(effects, deadline);
        let run = async {
            let instance = tool.pre.instantiate_async(&mut store).await?;
            let guest = tool.tool.load(&mut store, &instance)?;
            guest.call_invoke(&mut store, args).await
        };
        // The epoch deadline stops guests that spin; this timeout stops ones waiting on the host.
        let outcome = match tokio::time::timeout(deadline, run).await {
            Err(_) => Invocation::DeadlineExceeded,
            Ok(Ok(Ok(output))) if output.len() > MAX_OUTPUT_BYTES => Invocation::OutputTooLarge(output.len()),
            Ok(Ok(Ok(output))) => Invocation::Returned(output),
            Ok(Ok(Err(error))) => Invocation::Failed(error),
            Ok(Err(trap)) if is_deadline(&trap) => Invocation::DeadlineExceeded,
            Ok(Err(trap)) if trap.downcast_ref::<MemoryLimitExceeded>().is_some() => {
                Invocation::MemoryLimit(format!("{trap}"))
            }
            Ok(Err(trap)) => Invocation::Trapped(format!("{trap:#}")),
        };
        let state = store.into_data();
        log_stdio(&tool.manifest.name, &state);
        (outcome, state.effects)
    }

    /// Asks a tool's `reconcile` export about an effect. `None` when the tool has none.
    pub async fn reconcile(
        &self,
        tool: &LoadedTool,
        effects: EffectCtx,
        effect_key: &str,
        args: &str,
        deadline: Duration,
    ) -> Option<Result<Reconciliation, String>> {
        let indices = tool.reconcile.as_ref()?;
        let mut store = self.store(effects, deadline);
        let run = async {
            let instance = tool.pre.instantiate_async(&mut store).await?;
            let guest = indices.load(&mut store, &instance)?;
            guest.call_reconcile(&mut store, effect_key, args).await
        };
        Some(match tokio::time::timeout(deadline, run).await {
            Err(_) => Err("reconcile ran out of time".into()),
            Ok(result) => result.map_err(|e| format!("{e:#}")),
        })
    }

    pub(super) fn store(&self, effects: EffectCtx, deadline: Duration) -> Store<StoreState> {
        let mut store = Store::new(&self.engine, StoreState::new(effects));
        store.limiter(|s| s.limiter());
        store.set_epoch_deadline(ticks(deadline));
        store.epoch_deadline_trap();
        store
    }
}

fn is_deadline(e: &wasmtime::Error) -> bool {
    matches!(e.downcast_ref::<wasmtime::Trap>(), Some(wasmtime::Trap::Interrupt))
}

fn log_stdio(tool: &str, state: &StoreState) {
    for (stream, pipe) in [("stdout", &state.stdout), ("stderr", &state.stderr)] {
        let bytes = pipe.contents();
        if !bytes.is_empty() {
            tracing::debug!(tool, stream, output = %String::from_utf8_lossy(&bytes), "guest output");
        }
    }
}
