//! One store's data, and the linker that gives a tool exactly the allowed imports: the oncebox
//! interfaces plus the WASI a language runtime links by default (what componentize-py's and
//! componentize-js's default builds import, and a Rust `std` guest's print, clocks and panic):
//! cli, io, clocks, random; wasi:filesystem, which reaches nothing but the directories granted to
//! the tool (none by default); and wasi:sockets, linked so those builds load, with every use
//! refused (no TCP, no UDP, no name lookup, no address allowed). No wasi:http: a tool reaches out
//! only through the host's effects (recorded) and reads (granted), and a directory it is granted.

use wasmtime::ResourceLimiter;
use wasmtime::component::{HasData, Linker, ResourceTable};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxView, WasiView};

use super::bindings::oncebox::tool;
use crate::effects::{EffectCtx, HasEffects};

pub struct StoreState {
    wasi: WasiCtx,
    table: ResourceTable,
    pub effects: EffectCtx,
    limits: Limits,
    pub stdout: MemoryOutputPipe,
    pub stderr: MemoryOutputPipe,
    /// Calls the guest made into the oncebox interfaces and WASI's streams and polls (where it
    /// waits), counted so that the simulated guest clock can tell a guest that spins from one
    /// that works through the host (`invoke::Spinning`).
    host_calls: u64,
}

impl StoreState {
    /// A store for one attempt of the tool whose sandbox `effects` carries. Fails only when a
    /// granted directory cannot be opened, and then hands the context back.
    pub fn new(effects: EffectCtx) -> Result<Self, (String, Box<EffectCtx>)> {
        let sandbox = effects.sandbox().clone();
        let stdout = MemoryOutputPipe::new(sandbox.limits.stdio_bytes);
        let stderr = MemoryOutputPipe::new(sandbox.limits.stdio_bytes);
        // Empty environment and arguments, empty stdin, captured output, no network, and no
        // directory but the granted ones. The network is shut twice: each kind of socket is
        // refused, and so is every address (an explicit check that allows none).
        let mut wasi = WasiCtx::builder();
        wasi.stdout(stdout.clone())
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .socket_addr_check(|_, _| Box::pin(async { false }));
        for dir in &sandbox.grants.dirs {
            let perms = if dir.writable { FsPerms::ReadWrite } else { FsPerms::ReadOnly };
            if let Err(e) = wasi.preopened_dir(&dir.host, &dir.guest, perms) {
                let message = format!("cannot open the directory {} granted to the tool: {e}", dir.host.display());
                return Err((message, Box::new(effects)));
            }
        }
        let limits =
            Limits { memory_bytes: sandbox.limits.memory_bytes, table_elements: sandbox.limits.table_elements };
        Ok(StoreState {
            wasi: wasi.build(),
            table: ResourceTable::new(),
            effects,
            limits,
            stdout,
            stderr,
            host_calls: 0,
        })
    }

    /// How many calls the guest made into the host that can wait (see `host_calls`).
    pub(super) fn host_calls(&self) -> u64 {
        self.host_calls
    }

    /// The effect context, for one call of the guest into an oncebox interface.
    fn called_effects(&mut self) -> &mut EffectCtx {
        self.host_calls = self.host_calls.wrapping_add(1);
        &mut self.effects
    }

    /// The resource table, for one call of the guest into WASI's io.
    fn called_io(&mut self) -> &mut ResourceTable {
        self.host_calls = self.host_calls.wrapping_add(1);
        &mut self.table
    }

    pub fn limiter(&mut self) -> &mut dyn ResourceLimiter {
        &mut self.limits
    }
}

/// A guest asked for more linear memory or table space than an attempt may have. Raised as a
/// trap (not a failed `memory.grow`, which a Rust guest would turn into an abort that looks like
/// any panic), so the host can tell this failure apart.
#[derive(Debug, thiserror::Error)]
#[error("the tool tried to grow its {what} to {desired}, over the limit of {limit}")]
pub struct LimitExceeded {
    pub what: &'static str,
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
            let what = "memory (bytes)";
            return Err(wasmtime::Error::new(LimitExceeded { what, desired, limit: self.memory_bytes }));
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.table_elements {
            let what = "table (elements)";
            return Err(wasmtime::Error::new(LimitExceeded { what, desired, limit: self.table_elements }));
        }
        Ok(true)
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
    use wasmtime_wasi::filesystem::{WasiFilesystem, WasiFilesystemView as _};
    use wasmtime_wasi::p2::bindings::{cli, clocks, filesystem, random, sockets};
    use wasmtime_wasi::random::WasiRandom;
    use wasmtime_wasi::sockets::{WasiSockets, WasiSocketsView as _};
    use wasmtime_wasi_io::bindings::wasi::io;

    let l = linker;
    // Each call through the getters below is counted (`StoreState::host_calls`).
    io::error::add_to_linker::<StoreState, HasIo>(l, StoreState::called_io)?;
    io::poll::add_to_linker::<StoreState, HasIo>(l, StoreState::called_io)?;
    io::streams::add_to_linker::<StoreState, HasIo>(l, StoreState::called_io)?;
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
    // Linked for every tool; its store preopens the granted directories and nothing else: without
    // a grant there is no directory to name.
    filesystem::types::add_to_linker::<StoreState, WasiFilesystem>(l, StoreState::filesystem)?;
    filesystem::preopens::add_to_linker::<StoreState, WasiFilesystem>(l, StoreState::filesystem)?;
    // Linked so that a language runtime's default build loads; every call is refused by the
    // store's context (see `StoreState::new`), so a socket call gets an error, never a connection.
    let network = sockets::network::LinkOptions::default();
    sockets::network::add_to_linker::<StoreState, WasiSockets>(l, &network, StoreState::sockets)?;
    sockets::instance_network::add_to_linker::<StoreState, WasiSockets>(l, StoreState::sockets)?;
    sockets::ip_name_lookup::add_to_linker::<StoreState, WasiSockets>(l, StoreState::sockets)?;
    sockets::tcp::add_to_linker::<StoreState, WasiSockets>(l, StoreState::sockets)?;
    sockets::tcp_create_socket::add_to_linker::<StoreState, WasiSockets>(l, StoreState::sockets)?;
    sockets::udp::add_to_linker::<StoreState, WasiSockets>(l, StoreState::sockets)?;
    sockets::udp_create_socket::add_to_linker::<StoreState, WasiSockets>(l, StoreState::sockets)?;

    tool::types::add_to_linker::<StoreState, HasEffects>(l, StoreState::called_effects)?;
    tool::reads::add_to_linker::<StoreState, HasEffects>(l, StoreState::called_effects)?;
    tool::config::add_to_linker::<StoreState, HasEffects>(l, StoreState::called_effects)?;
    tool::effects::add_to_linker::<StoreState, HasEffects>(l, StoreState::called_effects)?;
    Ok(())
}
