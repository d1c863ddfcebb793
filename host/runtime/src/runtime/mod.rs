//! The engine, the linker with exactly the allowed imports, component loading and verification,
//! and one attempt's invocation.

pub mod bindings;
mod cache;
mod invoke;
mod load;
mod state;

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use wasmtime::component::Linker;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

pub use cache::Origin;
pub use invoke::{GuestClock, Invocation};
pub use load::{LoadError, LoadedTool, ToolManifest, check_grants};
// The reconciler asks only about tools that export it.
pub(crate) use load::RECONCILE_EXPORT;
pub use state::StoreState;

/// How often the epoch advances; an attempt's CPU deadline is counted in these ticks.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);
/// The largest component file the host will read.
pub const MAX_COMPONENT_BYTES: u64 = 64 << 20;

pub struct Runtime {
    engine: Engine,
    linker: Linker<StoreState>,
    /// Where compiled components are kept between processes (`cache.rs`), if anywhere.
    cache_dir: Option<PathBuf>,
    /// What a guest's running time is counted on against its attempt's deadline.
    guest_clock: GuestClock,
}

impl Runtime {
    pub fn new(cache_dir: Option<PathBuf>) -> Result<Self, LoadError> {
        let engine = shared_engine()?;
        let mut linker = Linker::new(&engine);
        state::add_to_linker(&mut linker).map_err(|e| LoadError::Engine(e.to_string()))?;
        Ok(Runtime { engine, linker, cache_dir, guest_clock: GuestClock::Real })
    }

    /// The same runtime, counting guests' running time on `clock` (the engine stays the
    /// process's one: only each store's epoch deadline is set another way).
    pub fn with_guest_clock(mut self, clock: GuestClock) -> Self {
        self.guest_clock = clock;
        self
    }
}

/// Pre-reserved slots for instances, memories, tables and async stacks: an attempt's instance
/// comes from a warm slot instead of fresh mappings. Sized so that every per-tool limit up to its
/// ceiling fits a slot; a slot is wiped before it is reused, so an instance never sees what the
/// previous one left (tests/integration/sandbox.rs checks).
fn pool() -> PoolingAllocationConfig {
    /// Instances (of components and of their core modules) alive at once across the process.
    const SLOTS: u32 = 1000;
    /// Slots whose memory is returned to the kernel together.
    const DECOMMIT_BATCH: usize = 32;
    // Per slot, how much of a memory (or table) the guest dirtied is wiped in place and kept,
    // rather than handed back to the kernel. A Rust guest dirties a few dozen pages per call.
    // Only where the kernel can say which pages those are: without PAGEMAP_SCAN, wasmtime would
    // memset the whole amount on every reuse, slower than handing the pages back.
    let keep_resident = if kernel_has_pagemap_scan() { 2 << 20 } else { 0 };
    let ceiling = crate::limits::CEILING;
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(SLOTS)
        .total_core_instances(SLOTS)
        .total_memories(SLOTS)
        .total_tables(SLOTS)
        .total_stacks(SLOTS)
        .max_memory_size(ceiling.memory_bytes)
        .table_elements(ceiling.table_elements)
        // Returning a slot's pages to the kernel is one madvise and a TLB shootdown across the
        // process's threads, and page faults when the next guest touches them again. Where the
        // kernel has PAGEMAP_SCAN (Linux 6.7+), the pages the guest dirtied are found and reset
        // to the memory's initial image in place instead, up to `keep_resident`; beyond that, and
        // on older kernels, pages are returned in batches.
        .decommit_batch_size(DECOMMIT_BATCH)
        .pagemap_scan(wasmtime::Enabled::Auto)
        .linear_memory_keep_resident(keep_resident)
        .table_keep_resident(keep_resident);
    pool
}

fn kernel_has_pagemap_scan() -> bool {
    cfg!(target_os = "linux")
        && std::fs::read_to_string("/proc/sys/kernel/osrelease").is_ok_and(|release| has_pagemap_scan(&release))
}

/// Whether a Linux release string ("6.18.0-1-cloud-amd64") names a kernel with the PAGEMAP_SCAN
/// ioctl, which came in 6.7.
fn has_pagemap_scan(release: &str) -> bool {
    let mut numbers = release.trim().split(|c: char| !c.is_ascii_digit()).map(|n| n.parse::<u32>().ok());
    match (numbers.next().flatten(), numbers.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor) >= (6, 7),
        _ => false,
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
    config.wasm_component_model(true).epoch_interruption(true).max_wasm_stack(crate::limits::WASM_STACK_BYTES);
    config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool()));
    // The pool reserves its address space up front; where that is refused (a tight `ulimit -v`),
    // instances are allocated on demand instead: slower to start, equally isolated.
    let engine = match Engine::new(&config) {
        Ok(engine) => engine,
        Err(e) => {
            tracing::warn!(error = %e, "cannot reserve the instance pool; allocating instances on demand");
            config.allocation_strategy(InstanceAllocationStrategy::OnDemand);
            Engine::new(&config).map_err(|e| LoadError::Engine(e.to_string()))?
        }
    };
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

#[cfg(test)]
mod tests {
    use super::has_pagemap_scan;

    #[test]
    fn pagemap_scan_is_recognised_from_6_7_on() {
        assert!(has_pagemap_scan("6.18.0-1-cloud-amd64\n"));
        assert!(has_pagemap_scan("6.7.0"));
        assert!(has_pagemap_scan("7.0.1"));
        assert!(!has_pagemap_scan("6.6.87.2-microsoft-standard-WSL2"));
        assert!(!has_pagemap_scan("5.15.0-105-generic"));
        assert!(!has_pagemap_scan("not a release"));
        assert!(!has_pagemap_scan(""));
    }
}
