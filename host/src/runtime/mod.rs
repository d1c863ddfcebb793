//! The engine, the linker with exactly the allowed imports, component loading and verification,
//! and one attempt's invocation.

pub mod bindings;
mod invoke;
mod load;
mod state;

use std::sync::OnceLock;
use std::time::Duration;

use wasmtime::component::Linker;
use wasmtime::{Config, Engine};

pub use invoke::Invocation;
pub use load::{LoadError, LoadedTool, ToolManifest};
pub use state::{MemoryLimitExceeded, StoreState};

/// How often the epoch advances; an attempt's CPU deadline is counted in these ticks.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);
/// Linear memory one instance may grow to.
pub const MAX_MEMORY_BYTES: usize = 256 << 20;
/// Elements a table of one instance may grow to.
pub const MAX_TABLE_ELEMENTS: usize = 100_000;
/// Bytes of stdout and stderr kept per attempt (the rest is dropped).
pub const MAX_STDIO_BYTES: usize = 64 << 10;
/// The largest component file the host will read.
pub const MAX_COMPONENT_BYTES: u64 = 64 << 20;
/// The largest args (JSON) a call may carry.
pub const MAX_ARGS_BYTES: usize = 1 << 20;
/// The largest output (JSON) a tool may return.
pub const MAX_OUTPUT_BYTES: usize = 4 << 20;

pub struct Runtime {
    engine: Engine,
    linker: Linker<StoreState>,
}

impl Runtime {
    pub fn new() -> Result<Self, LoadError> {
        let engine = shared_engine()?;
        let mut linker = Linker::new(&engine);
        state::add_to_linker(&mut linker).map_err(|e| LoadError::Engine(e.to_string()))?;
        Ok(Runtime { engine, linker })
    }
}

/// One engine per process, as wasmtime recommends: compiled components and the epoch clock are
/// shared by every host in the process.
fn shared_engine() -> Result<Engine, LoadError> {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    if let Some(engine) = ENGINE.get() {
        return Ok(engine.clone());
    }
    let mut config = Config::new();
    config.wasm_component_model(true).epoch_interruption(true);
    let engine = Engine::new(&config).map_err(|e| LoadError::Engine(e.to_string()))?;
    // Epochs bound the CPU time of guests that never return to the host. The thread holds the
    // engine weakly, so an engine that lost the race to initialise stops its ticker.
    let ticking = engine.weak();
    std::thread::Builder::new()
        .name("oncebox-epoch".into())
        .spawn(move || {
            while let Some(engine) = ticking.upgrade() {
                engine.increment_epoch();
                drop(engine);
                std::thread::sleep(EPOCH_TICK);
            }
        })
        .map_err(|e| LoadError::Engine(format!("cannot start the epoch thread: {e}")))?;
    Ok(ENGINE.get_or_init(|| engine).clone())
}
