//! The `oncebox` binary. Errors become `anyhow` here and nowhere else.

mod cli;

use std::process::ExitCode;

use clap::Parser;

/// A call allocates a few hundred small objects (JSON, records, wasmtime's per-instance state);
/// mimalloc serves them in ~13% fewer instructions per call than glibc (BENCHMARKS.md).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    cli::init_logging(args.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return cli::Exit::Host.into();
        }
    };
    runtime.block_on(cli::run(args.command)).into()
}
