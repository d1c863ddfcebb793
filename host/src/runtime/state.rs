//! One store's data, and the linker that gives a tool exactly the allowed imports: the oncebox
//! interfaces plus the WASI a Rust `std` guest needs to print, read clocks and panic (cli, io,
//! clocks, random). No filesystem, no sockets, no wasi:http: deny by default.

use wasmtime::ResourceLimiter;
use wasmtime::component::{HasData, Linker, ResourceTable};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::bindings::oncebox::tool;
use super::{MAX_MEMORY_BYTES, MAX_STDIO_BYTES, MAX_TABLE_ELEMENTS};
use crate::effects::{EffectCtx, HasEffects};

pub struct StoreState {
    wasi: WasiCtx,
    table: ResourceTable,
    pub effects: EffectCtx,
    limits: Limits,
    pub stdout: MemoryOutputPipe,
    pub stderr: MemoryOutputPipe,
}

impl StoreState {
    pub fn new(effects: EffectCtx) -> Self {
        let stdout = MemoryOutputPipe::new(MAX_STDIO_BYTES);
        let stderr = MemoryOutputPipe::new(MAX_STDIO_BYTES);
        // Empty environment and arguments, empty stdin, captured output, no preopens, no network.
        let wasi = WasiCtx::builder()
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        let limits = Limits { memory_bytes: MAX_MEMORY_BYTES, table_elements: MAX_TABLE_ELEMENTS };
        StoreState { wasi, table: ResourceTable::new(), effects, limits, stdout, stderr }
    }

    pub fn limiter(&mut self) -> &mut dyn ResourceLimiter {
        &mut self.limits
    }
}

/// A guest asked for more memory than an attempt may have. Raised as a trap (not a failed
/// `memory.grow`, which a Rust guest would turn into an abort that looks like any panic), so the
/// host can tell this failure apart.
#[derive(Debug, thiserror::Error)]
#[error("the tool tried to grow its memory to {desired} bytes, over the limit of {limit}")]
pub struct MemoryLimitExceeded {
    pub desired: usize,
    pub limit: usize,
}

struct Limits {
    memory_bytes: usize,
    table_elements: usize,
}

impl ResourceLimiter for Limits {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.memory_bytes {
            return Err(wasmtime::Error::new(MemoryLimitExceeded { desired, limit: self.memory_bytes }));
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= self.table_elements)
    }
}

impl WasiView for StoreState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

struct HasIo;

impl HasData for HasIo {
    type Data<'a> = &'a mut ResourceTable;
}

pub fn add_to_linker(linker: &mut Linker<StoreState>) -> wasmtime::Result<()> {
    use wasmtime_wasi::cli::{WasiCli, WasiCliView as _};
    use wasmtime_wasi::clocks::{WasiClocks, WasiClocksView as _};
    use wasmtime_wasi::p2::bindings::{cli, clocks, random};
    use wasmtime_wasi::random::WasiRandom;
    use wasmtime_wasi_io::bindings::wasi::io;

    let l = linker;
    io::error::add_to_linker::<StoreState, HasIo>(l, |t| &mut t.table)?;
    io::poll::add_to_linker::<StoreState, HasIo>(l, |t| &mut t.table)?;
    io::streams::add_to_linker::<StoreState, HasIo>(l, |t| &mut t.table)?;
    clocks::wall_clock::add_to_linker::<StoreState, WasiClocks>(l, StoreState::clocks)?;
    clocks::monotonic_clock::add_to_linker::<StoreState, WasiClocks>(l, StoreState::clocks)?;
    random::random::add_to_linker::<StoreState, WasiRandom>(l, |t| t.wasi.random())?;
    random::insecure::add_to_linker::<StoreState, WasiRandom>(l, |t| t.wasi.random())?;
    random::insecure_seed::add_to_linker::<StoreState, WasiRandom>(l, |t| t.wasi.random())?;
    cli::exit::add_to_linker::<StoreState, WasiCli>(l, StoreState::cli)?;
    cli::environment::add_to_linker::<StoreState, WasiCli>(l, StoreState::cli)?;
    cli::stdin::add_to_linker::<StoreState, WasiCli>(l, StoreState::cli)?;
    cli::stdout::add_to_linker::<StoreState, WasiCli>(l, StoreState::cli)?;
    cli::stderr::add_to_linker::<StoreState, WasiCli>(l, StoreState::cli)?;
    cli::terminal_input::add_to_linker::<StoreState, WasiCli>(l, StoreState::cli)?;
    cli::terminal_output::add_to_linker::<StoreState, WasiCli>(l, StoreState::cli)?;
    cli::terminal_stdin::add_to_linker::<StoreState, WasiCli>(l, StoreState::cli)?;
    cli::terminal_stdout::add_to_linker::<StoreState, WasiCli>(l, StoreState::cli)?;
    cli::terminal_stderr::add_to_linker::<StoreState, WasiCli>(l, StoreState::cli)?;

    tool::types::add_to_linker::<StoreState, HasEffects>(l, |s| &mut s.effects)?;
    tool::reads::add_to_linker::<StoreState, HasEffects>(l, |s| &mut s.effects)?;
    tool::config::add_to_linker::<StoreState, HasEffects>(l, |s| &mut s.effects)?;
    tool::effects::add_to_linker::<StoreState, HasEffects>(l, |s| &mut s.effects)?;
    Ok(())
}
