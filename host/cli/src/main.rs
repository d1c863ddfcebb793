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
    // Before the runtime, and shut down after it: the exporter batches on a thread of its own,
    // and its last batch is sent when the command is done (serve stopped, the call answered).
    let traces = cli::telemetry::init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            traces.shutdown();
            return cli::Exit::Host.into();
        }
    };
    let exit = runtime.block_on(cli::run(args.command));
    drop(runtime);
    traces.shutdown();
    exit.into()
}
