//! The engine, the linker with exactly the allowed imports, component loading and verification,
//! and one attempt's invocation.

pub mod bindings;
mod invoke;
mod load;
mod state;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use wasmtime::component::Linker;
use wasmtime::{Config, Engine};

pub use invoke::Invocation;
pub use load::{LoadError, LoadedTool, ToolManifest};
pub use state::StoreState;

/// How often the epoch advances; an attempt's CPU deadline is counted in these ticks.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);
/// Linear memory one instance may grow to.
pub const MAX_MEMORY_BYTES: usize = 256 << 20;
/// Bytes of stdout and stderr kept per attempt (the rest is dropped).
pub const MAX_STDIO_BYTES: usize = 64 << 10;
/// The largest output (JSON) a tool may return.
pub const MAX_OUTPUT_BYTES: usize = 4 << 20;

pub struct Runtime {
    engine: Engine,
    linker: Linker<StoreState>,
    ticker_stop: Arc<AtomicBool>,
}

impl Runtime {
    pub fn new() -> Result<Self, LoadError> {
        let mut config = Config::new();
        config.wasm_component_model(true).epoch_interruption(true);
        let engine = Engine::new(&config).map_err(|e| LoadError::Engine(e.to_string()))?;
        let mut linker = Linker::new(&engine);
        state::add_to_linker(&mut linker).map_err(|e| LoadError::Engine(e.to_string()))?;

        // Epochs bound the CPU time of guests that never return to the host.
        let ticker_stop = Arc::new(AtomicBool::new(false));
        let stop = ticker_stop.clone();
        let ticking = engine.weak();
        std::thread::Builder::new()
            .name("oncebox-epoch".into())
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    match ticking.upgrade() {
                        Some(engine) => engine.increment_epoch(),
                        None => break,
                    }
                }
            })
            .map_err(|e| LoadError::Engine(format!("cannot start the epoch thread: {e}")))?;
        Ok(Runtime { engine, linker, ticker_stop })
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.ticker_stop.store(true, Ordering::Relaxed);
    }
}
