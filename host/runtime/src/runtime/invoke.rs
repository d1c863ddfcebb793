//! One attempt: a fresh instance from the `InstancePre`, the invocation under a deadline, and what
//! the guest left in its effect context.

use std::time::Duration;

use wasmtime::{Store, UpdateDeadline};

use super::bindings::{RateLimit, Reconciliation, ToolError};
use super::state::LimitExceeded;
use super::{EPOCH_TICK, LoadedTool, Runtime, StoreState};
use crate::effects::EffectCtx;
use crate::failure::Limit;
use crate::limits::{MAX_ERROR_MESSAGE_BYTES, cut_message};

/// How an invocation ended, before any policy looked at it.
#[derive(Debug)]
pub enum Invocation {
    Returned(String),
    Failed(ToolError),
    /// The guest trapped (a panic, an out-of-bounds access, a limit); the host is fine.
    Trapped(String),
    /// The attempt ran out of time.
    DeadlineExceeded,
    /// The attempt went past one of its tool's limits.
    LimitExceeded(Limit, String),
    /// The host could not set the attempt up (a granted directory is gone); the guest never ran.
    Unavailable(String),
    /// Not run here: the attempt of an earlier owner that wrote effects ahead and stopped before
    /// recording its end (`failure::End::Interrupted`), judged by whoever took the operation over.
    Interrupted(String),
}

/// What a guest's running time is counted on against its attempt's deadline. Whichever it is,
/// a guest stopped by it traps with `Trap::Interrupt`, read as `Invocation::DeadlineExceeded`
/// (`trapped`), and a guest waiting on the host is stopped by the attempt's timeout, a tokio
/// timer: the deadline is one rule, only the clock that spends it differs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GuestClock {
    /// Real time: the engine's epochs, which a thread advances every `EPOCH_TICK`; a guest
    /// traps once its deadline's worth of ticks has passed. Every host but the simulator's.
    #[default]
    Real,
    /// The tokio clock (paused, in the whole-system simulator), moved on by the guest's own
    /// running: a guest that runs wasm for `SPIN_GRACE_TICKS` ticks of the real epoch without
    /// calling the host is spinning, and from then on each epoch check its code passes (a loop's
    /// back edge, a function's entry) moves the clock on by `step` (it sleeps `step` on it, so
    /// that every other task due meanwhile runs), until the clock reaches the attempt's
    /// deadline, where it traps. On a paused clock a spinning guest would otherwise hold the one
    /// thread with the clock standing still, and trap when real time says. What it costs in real
    /// time: the grace, 20 to 30 ms per spinning attempt, and a task switch per step, whatever
    /// the deadline. A guest that calls the host or returns within the grace (every well-behaved
    /// tool) moves the clock only by what it awaits, as under [`GuestClock::Real`]. Not seen
    /// spinning: a guest that loops on host calls that return at once (a config read), which
    /// holds the thread until it returns, as a spinning one did before this clock.
    Simulated {
        /// The simulated time one step of a spinning guest stands for (more than zero).
        step: Duration,
    },
}

/// Ticks of the real epoch a guest may run wasm without calling the host before the simulated
/// clock counts it as spinning ([`GuestClock::Simulated`]). More than two: a guest's run between
/// two host calls that happens to straddle a tick of the real clock (or begins just after one
/// that fell while it waited on the host) is not spinning, and moving the simulated clock for
/// it would make a seed's history depend on where real ticks fell.
pub const SPIN_GRACE_TICKS: u32 = 3;

/// The epoch callback of a store on [`GuestClock::Simulated`]: called at each tick of the real
/// epoch while the guest runs wasm, and at each epoch check once it spins.
struct Spinning {
    /// The attempt's deadline on the tokio clock.
    until: tokio::time::Instant,
    step: Duration,
    /// The store's count of host calls when last asked, and the times asked since it changed.
    calls: u64,
    ticks: u32,
}

impl Spinning {
    fn tick(&mut self, calls: u64) -> UpdateDeadline {
        if calls != self.calls {
            // It called the host since the last tick: that run of wasm is over.
            (self.calls, self.ticks) = (calls, 0);
        }
        self.ticks = self.ticks.saturating_add(1);
        if self.ticks <= SPIN_GRACE_TICKS {
            // Asked again at the next tick of the real epoch.
            return UpdateDeadline::Continue(1);
        }
        // Judged only here, once it spins, so that whether and when a guest traps follows from
        // the simulated clock alone (a guest that is not spinning is stopped by the attempt's
        // timeout, on the same clock).
        let now = tokio::time::Instant::now();
        if now >= self.until {
            return UpdateDeadline::Interrupt;
        }
        // Never past the deadline: it traps at the deadline itself. A deadline of no ticks
        // beyond the current epoch asks again at the guest's next epoch check, not at the next
        // real tick: the steps follow the guest's progress, at no cost in real time.
        let sleep = self.step.min(self.until - now);
        UpdateDeadline::YieldCustom(0, Box::pin(tokio::time::sleep(sleep)))
    }
}

/// Epoch ticks covering `d`, at least one.
pub(super) fn ticks(d: Duration) -> u64 {
    (d.as_millis() / EPOCH_TICK.as_millis()).max(1) as u64
}

impl Runtime {
    /// Runs `invoke(args)` once. Returns the context so the caller can read the attempt's effects.
    /// `secrets` (the args' sensitive values) are scrubbed from the guest's output before it is logged.
    pub async fn invoke(
        &self,
        tool: &LoadedTool,
        effects: EffectCtx,
        args: &str,
        deadline: Duration,
        secrets: &[String],
    ) -> (Invocation, EffectCtx) {
        let mut store = match self.store(effects, deadline) {
            Ok(store) => store,
            Err((message, effects)) => return (Invocation::Unavailable(message), *effects),
        };
        let limits = tool.sandbox.limits;
        let run = async {
            let instance = tool.pre.instantiate_async(&mut store).await?;
            let guest = tool.tool.load(&mut store, &instance)?;
            guest.call_invoke(&mut store, args).await
        };
        // The epoch deadline stops guests that spin; this timeout stops ones waiting on the host.
        let mut cause = String::new();
        let outcome = match tokio::time::timeout(deadline, run).await {
            Err(_) => Invocation::DeadlineExceeded,
            Ok(Ok(Ok(output))) if output.len() > limits.output_bytes => Invocation::LimitExceeded(
                Limit::Output,
                format!("the output is {} bytes, over the limit of {}", output.len(), limits.output_bytes),
            ),
            Ok(Ok(Ok(output))) => Invocation::Returned(output),
            Ok(Ok(Err(error))) => Invocation::Failed(kept(error, secrets)),
            Ok(Err(trap)) => {
                cause = trap.root_cause().to_string();
                trapped(&trap)
            }
        };
        let state = store.into_data();
        let outcome = match outcome {
            Invocation::Trapped(trap) => {
                Invocation::Trapped(with_stderr(trap, &cause, &state.stderr.contents(), secrets))
            }
            outcome => outcome,
        };
        log_stdio(&tool.manifest.name, &state, secrets);
        // A flood of effect calls or of output fails the attempt even if the guest swallowed the
        // refusals (a Rust guest panics when stdout is closed on it, a trap like any other).
        let stdio_full = [&state.stdout, &state.stderr].iter().any(|pipe| pipe.contents().len() >= limits.stdio_bytes);
        let outcome = match &state.effects.flooded {
            Some(message) => Invocation::LimitExceeded(Limit::Effects, message.clone()),
            None if stdio_full => Invocation::LimitExceeded(
                Limit::Stdio,
                format!("the tool wrote {} bytes or more to stdout or stderr, the limit", limits.stdio_bytes),
            ),
            None => outcome,
        };
        (outcome, state.effects)
    }

    /// Creates one instance and drops it: what every attempt pays before the guest runs.
    pub async fn instantiate(&self, tool: &LoadedTool, effects: EffectCtx) -> Result<(), String> {
        let mut store = self.store(effects, Duration::from_secs(5)).map_err(|(message, _)| message)?;
        tool.pre.instantiate_async(&mut store).await.map(drop).map_err(|e| format!("{e:#}"))
    }

    /// Asks a tool's `reconcile` export about an effect. `None` when the tool has none. `secrets`
    /// (the args' sensitive values) are scrubbed from what the guest wrote when it traps.
    pub async fn reconcile(
        &self,
        tool: &LoadedTool,
        effects: EffectCtx,
        effect_key: &str,
        args: &str,
        deadline: Duration,
        secrets: &[String],
    ) -> Option<Result<Reconciliation, String>> {
        let indices = tool.reconcile.as_ref()?;
        let mut store = match self.store(effects, deadline) {
            Ok(store) => store,
            Err((message, _)) => return Some(Err(message)),
        };
        let run = async {
            let instance = tool.pre.instantiate_async(&mut store).await?;
            let guest = indices.load(&mut store, &instance)?;
            guest.call_reconcile(&mut store, effect_key, args).await
        };
        let max = tool.sandbox.limits.output_bytes;
        let answer = match tokio::time::timeout(deadline, run).await {
            Err(_) => Err("reconcile ran out of time".into()),
            Ok(Ok(Reconciliation::Committed(output))) if output.len() > max => {
                Err(format!("its committed output is {} bytes, over the limit of {max}", output.len()))
            }
            Ok(Ok(answer)) => Ok(answer),
            // The tool's own bug: what it wrote to stderr says which.
            Ok(Err(trap)) => {
                let message = cut_message(&format!("{trap:#}"), MAX_ERROR_MESSAGE_BYTES);
                Err(with_stderr(message, &trap.root_cause().to_string(), &store.data().stderr.contents(), secrets))
            }
        };
        Some(answer)
    }

    /// A store under the tool's limits and `deadline`. On failure the context comes back, so the
    /// caller still holds what it needs to record the attempt.
    pub(super) fn store(
        &self,
        effects: EffectCtx,
        deadline: Duration,
    ) -> Result<Store<StoreState>, (String, Box<EffectCtx>)> {
        let mut store = Store::new(&self.engine, StoreState::new(effects)?);
        store.limiter(|s| s.limiter());
        match self.guest_clock {
            GuestClock::Real => {
                store.set_epoch_deadline(ticks(deadline));
                store.epoch_deadline_trap();
            }
            GuestClock::Simulated { step } => {
                // The callback is asked at the next tick of the real epoch, and spends the
                // deadline on the tokio clock instead. A step of zero would never move the clock
                // to the deadline.
                let step = step.max(Duration::from_millis(1));
                let mut spinning = Spinning { until: tokio::time::Instant::now() + deadline, step, calls: 0, ticks: 0 };
                store.set_epoch_deadline(1);
                store.epoch_deadline_callback(move |store| Ok(spinning.tick(store.data().host_calls())));
            }
        }
        Ok(store)
    }
}

/// What a trap means: a deadline, one of the limits, or the guest's own failure (a panic, an
/// out-of-bounds access).
fn trapped(trap: &wasmtime::Error) -> Invocation {
    match trap.downcast_ref::<wasmtime::Trap>() {
        Some(wasmtime::Trap::Interrupt) => return Invocation::DeadlineExceeded,
        Some(wasmtime::Trap::StackOverflow) => {
            let message = format!("the tool overflowed its wasm stack of {} bytes", crate::limits::WASM_STACK_BYTES);
            return Invocation::LimitExceeded(Limit::Stack, message);
        }
        _ => {}
    }
    if let Some(exceeded) = trap.downcast_ref::<LimitExceeded>() {
        let limit = if exceeded.what.starts_with("memory") { Limit::Memory } else { Limit::Table };
        return Invocation::LimitExceeded(limit, exceeded.to_string());
    }
    // The backtrace names the guest's functions, which the guest chose: bounded like its messages.
    Invocation::Trapped(cut_message(&format!("{trap:#}"), MAX_ERROR_MESSAGE_BYTES))
}

/// A trap's message with the end of what the guest wrote to stderr, where a language runtime
/// puts what went wrong (a Python traceback, a JS exception, a Rust panic's message): scrubbed of
/// the args' sensitive values before it is cut, then bounded. The wasm backtrace, which names
/// the runtime's functions rather than the author's, is kept only when stderr is empty.
fn with_stderr(trap: String, cause: &str, stderr: &[u8], secrets: &[String]) -> String {
    let tail = crate::redact::scrubbed_tail(stderr, secrets, crate::limits::STDERR_TAIL_BYTES);
    if tail.is_empty() {
        return trap;
    }
    cut_message(&format!("{cause}; its stderr ended with:\n{tail}"), MAX_ERROR_MESSAGE_BYTES)
}

/// A guest's error as the host keeps it (ledger, logs, CLI): its message scrubbed of the args'
/// sensitive values, then cut to [`MAX_ERROR_MESSAGE_BYTES`]. Scrubbed first, so that a cut
/// cannot leave the start of a secret behind.
fn kept(error: ToolError, secrets: &[String]) -> ToolError {
    let keep = |message: String| cut_message(&crate::redact::scrub(&message, secrets), MAX_ERROR_MESSAGE_BYTES);
    match error {
        ToolError::Transient(m) => ToolError::Transient(keep(m)),
        ToolError::Permanent(m) => ToolError::Permanent(keep(m)),
        ToolError::UnknownOutcome(m) => ToolError::UnknownOutcome(keep(m)),
        ToolError::RateLimited(r) => {
            ToolError::RateLimited(RateLimit { retry_after_ms: r.retry_after_ms, message: keep(r.message) })
        }
    }
}

/// The guest's stdout and stderr, at debug level. A tool may print anything it was given, so the
/// args' sensitive values are scrubbed first (credentials never reach the guest at all).
fn log_stdio(tool: &str, state: &StoreState, secrets: &[String]) {
    for (stream, pipe) in [("stdout", &state.stdout), ("stderr", &state.stderr)] {
        let bytes = pipe.contents();
        if !bytes.is_empty() {
            let output = crate::redact::scrub(&String::from_utf8_lossy(&bytes), secrets);
            tracing::debug!(tool, stream, %output, "guest output");
        }
    }
}
