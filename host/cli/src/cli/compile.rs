//! `oncebox compile TOOL.wasm|DIR ...`: compiles components into the compile cache that `serve`,
//! `call` and the other commands read ($ONCEBOX_CACHE, else `$XDG_CACHE_HOME/oncebox`), all at
//! once, so that a server's first start (or a deploy's) loads them in milliseconds instead of
//! compiling a language runtime's component for seconds each. Nothing is loaded or run.

use std::path::PathBuf;

use oncebox::Host;

use super::{Exit, print_json};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Component files, or directories whose `.wasm` files are compiled.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
}

pub async fn run(args: Args) -> anyhow::Result<Exit> {
    let mut files = Vec::new();
    for path in &args.paths {
        if path.is_dir() {
            let listed = std::fs::read_dir(path).map_err(|e| super::Usage(format!("{}: {e}", path.display())))?;
            let mut wasm: Vec<PathBuf> = listed
                .flatten()
                .map(|entry| entry.path())
                .filter(|p| p.extension().is_some_and(|e| e == "wasm"))
                .collect();
            wasm.sort();
            files.extend(wasm);
        } else {
            files.push(path.clone());
        }
    }
    let host = super::cached(Host::builder_in_memory()).build().await?;
    let compile = |file: PathBuf| {
        let host = host.clone();
        async move {
            let started = std::time::Instant::now();
            let compiled = host.compile(&file).await;
            (file, compiled, started.elapsed())
        }
    };
    let mut exit = Exit::Ok;
    for (file, compiled, took) in futures_util::future::join_all(files.into_iter().map(compile)).await {
        match compiled {
            Ok((digest, from)) => print_json(&serde_json::json!({
                "file": file, "digest": digest, "from": from, "ms": took.as_millis(),
            }))?,
            Err(e) => {
                print_json(&serde_json::json!({ "file": file, "error": e.to_string() }))?;
                exit = Exit::Usage;
            }
        }
    }
    Ok(exit)
}
