//! `cargo run --release -p oncebox-bench [-- --json]`: oncebox against its physical limit (an
//! fsync), the tool's logic as plain Rust, and two hand-built alternatives, all in one run on the
//! same machine and filesystem; and oncebox on a PostgreSQL ledger (a throwaway local cluster,
//! `fsync=on`, `synchronous_commit=on`) when the server's binaries are installed. Prints a table (BENCHMARKS.md keeps the latest), or one JSON object.
//!
//! `-- --peers` measures oncebox beside its peers instead, Restate and DBOS, on one workload
//! (`peers.rs`; the peers' pinned apps are in `bench/peers/`).

mod alternatives;
mod baselines;
mod growth;
mod host_runs;
mod languages;
mod peers;
mod report;
mod serve_start;
mod stats;

use std::path::PathBuf;

use clap::Parser;

/// The allocator of the `oncebox` binary, so that the bench measures what the CLI runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(about = "Measure oncebox against an fsync, native code, naive redb and SQLite")]
struct Args {
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Where the ledgers and the fsync file live (a real disk, not tmpfs, for honest fsyncs).
    #[arg(long, default_value = "target/oncebox-bench")]
    dir: PathBuf,
    /// Fewer iterations: a smoke run, not a measurement.
    #[arg(long)]
    quick: bool,
    /// Calls per caller in `throughput_64`, `pg_throughput_64` and `http_throughput_64` (twice as
    /// many in the first two with `--only`; `throughput_1` and `throughput_8` make 8 and 4 times as
    /// many): larger for a ledger that has grown during the run, as a deployment's has.
    #[arg(long, default_value_t = 25)]
    each: usize,
    /// Measure only this (instantiate_us, replay_us, fresh_kv_us, fresh_http_us, throughput_64,
    /// http_throughput_64 (the `charge` tool), or on PostgreSQL pg_fresh_kv_us, pg_fresh_http_us or pg_throughput_64,
    /// or `languages`, or `growth`: the costs that should follow open work, at two sizes of
    /// history, `--growth SMALL,LARGE`, or `serve_start`: `oncebox serve` with ten Python tools,
    /// cold and warm, `--loads N` of each), for a profiler:
    /// `perf record -g -- target/release/oncebox-bench --only fresh_kv_us`.
    #[arg(long, value_name = "MEASURE")]
    only: Option<String>,
    /// `--only growth`: the two numbers of completed operations to compare.
    #[arg(long, value_name = "SMALL,LARGE", default_value = "10000,1000000", value_delimiter = ',')]
    growth: Vec<usize>,
    /// Skip the tools in Python and JavaScript (their toolchains come from PyPI and npm).
    #[arg(long)]
    no_languages: bool,
    /// How many first and warm loads (whole processes) to time per language; 0 skips them (a
    /// first load compiles the component: tens of seconds on a busy machine).
    #[arg(long, default_value_t = 3)]
    loads: usize,
    /// Measure oncebox beside its peers instead, Restate and DBOS (on SQLite and on PostgreSQL),
    /// on one workload: one durable step making one idempotent POST. The peers are installed from
    /// npm and PyPI into DIR/peers on first use; Restate runs in a network namespace (root).
    #[arg(long, conflicts_with = "only")]
    peers: bool,
    /// Internal: load this component in this process and exit (a first or warm load, timed by
    /// the parent).
    #[arg(long, hide = true, requires = "load_cache")]
    load_once: Option<PathBuf>,
    #[arg(long, hide = true)]
    load_cache: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let (Some(component), Some(cache)) = (&args.load_once, &args.load_cache) {
        return languages::load_once(component, cache).await;
    }
    // The workspace's reqwest has no built-in TLS provider; the host installs ring's when it builds
    // its client, but the provider's own client may come first.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let _ = std::fs::remove_dir_all(args.dir.join("run"));
    let dir = args.dir.join("run");
    std::fs::create_dir_all(&dir)?;
    let (slow, fast, each) = if args.quick { (20, 200, 4) } else { (300, 5_000, args.each) };

    let cache = args.dir.join("compile-cache");
    if args.only.as_deref() == Some("languages") {
        let results = languages::measure(&dir, fast / 10, args.loads).await?;
        if args.json {
            let mut named = report::polyglot(&results);
            named.insert("targets".into(), serde_json::to_value(report::language_targets(&results))?);
            named.insert("machine".into(), serde_json::to_value(report::Machine::here(&dir))?);
            println!("{}", serde_json::Value::Object(named));
        } else {
            report::print_languages(&results);
            println!();
            for t in report::language_targets(&results) {
                println!("{}: {} (measured {})", if t.met { "met" } else { "missed" }, t.target, t.measured);
            }
        }
        return Ok(());
    }
    if args.only.as_deref() == Some("serve_start") {
        let starts = serve_start::measure(&dir, args.loads, args.loads).await?;
        if args.json {
            println!("{}", serde_json::to_string(&starts)?);
        } else {
            serve_start::print(&starts);
        }
        return Ok(());
    }
    if args.only.as_deref() == Some("growth") {
        let [small, large] = args.growth[..] else { anyhow::bail!("--growth SMALL,LARGE: two numbers") };
        return growth::run(&dir, small, large, args.quick).await;
    }
    if args.peers {
        let results = peers::run(&args.dir, &dir, &cache, args.quick).await?;
        if args.json {
            println!("{}", serde_json::to_string(&results)?);
        } else {
            peers::print(&results);
        }
        return Ok(());
    }
    if let Some(only) = &args.only {
        const MEASURES: [&str; 9] = [
            "instantiate_us",
            "replay_us",
            "fresh_kv_us",
            "fresh_http_us",
            "throughput_64",
            "http_throughput_64",
            "pg_fresh_kv_us",
            "pg_fresh_http_us",
            "pg_throughput_64",
        ];
        anyhow::ensure!(MEASURES.contains(&only.as_str()), "--only {only}: one of {}", MEASURES.join(", "));
        let (b, name) = match only.strip_prefix("pg_") {
            Some(name) => {
                let Some(url) = postgres_database().await? else { return Ok(()) };
                (host_runs::start_postgres(&url, &dir, &cache).await?, name)
            }
            None => (host_runs::start(&dir, &cache).await?, only.as_str()),
        };
        if name == "throughput_64" {
            println!("{only}: {:.0} calls/s", host_runs::throughput(&b, 64, each * 2).await?);
            return Ok(());
        }
        if name == "http_throughput_64" {
            println!("{only}: {:.0} calls/s", host_runs::http_throughput(&b, 64, each).await?);
            return Ok(());
        }
        let latency = match name {
            "instantiate_us" => host_runs::instantiate(&b, fast).await?,
            "replay_us" => host_runs::replay(&b, fast).await?,
            "fresh_kv_us" => host_runs::fresh_kv(&b, slow).await?,
            _ => host_runs::fresh_http(&b, slow).await?,
        };
        println!("{only}: p50 {:.1} p99 {:.1}", latency.p50, latency.p99);
        return Ok(());
    }

    eprintln!("measuring the baselines...");
    let fsync_us = baselines::fsync(&dir, slow)?;
    let native_call_us = baselines::native_call(fast);
    let redb_commit_us = baselines::redb_commit(&dir, slow)?;

    eprintln!("measuring oncebox...");
    let b = host_runs::start(&dir, &cache).await?;
    let instantiate_us = host_runs::instantiate(&b, fast).await?;
    let replay_us = host_runs::replay(&b, fast).await?;
    let fresh_kv_us = host_runs::fresh_kv(&b, slow).await?;
    let fresh_http_us = host_runs::fresh_http(&b, slow).await?;
    let throughput_1 = host_runs::throughput(&b, 1, each * 8).await?;
    let throughput_8 = host_runs::throughput(&b, 8, each * 4).await?;
    let commits_before = b.host.ledger().commits();
    let throughput_64 = host_runs::throughput(&b, 64, each).await?;
    let commits_per_call_64 = (b.host.ledger().commits() - commits_before) as f64 / (64 * each) as f64;

    // The same tools and workload on a PostgreSQL ledger: a throwaway cluster on this filesystem.
    let mut postgres = None;
    if let Some(url) = postgres_database().await? {
        eprintln!("measuring oncebox on PostgreSQL...");
        let settings = oncebox_pg_cluster::settings(&url).await?;
        let pg = host_runs::start_postgres(&url, &dir, &cache).await?;
        let fresh_kv_us = host_runs::fresh_kv(&pg, slow).await?;
        let fresh_http_us = host_runs::fresh_http(&pg, slow).await?;
        let commits_before = pg.host.ledger().commits();
        let throughput_64 = host_runs::throughput(&pg, 64, each).await?;
        let commits_per_call_64 = (pg.host.ledger().commits() - commits_before) as f64 / (64 * each) as f64;
        pg.provider.shutdown().await;
        postgres = Some(report::Postgres {
            settings: settings.into(),
            fresh_kv_us,
            fresh_http_us,
            throughput_64,
            commits_per_call_64,
        });
    }

    let languages =
        if args.no_languages { Vec::new() } else { languages::measure(&dir, fast / 10, args.loads).await? };

    eprintln!("measuring the alternatives...");
    let naive_redb_64 = alternatives::naive_redb(&dir, 64, (each / 2).max(2))?;
    let sqlite_64 = alternatives::sqlite(&dir, 64, (each / 2).max(2))?;

    let mut results = report::Results {
        fsync_us,
        native_call_us,
        redb_commit_us,
        instantiate_us,
        replay_us,
        fresh_kv_us,
        fresh_http_us,
        throughput_1,
        throughput_8,
        throughput_64,
        naive_redb_64,
        sqlite_64,
        commits_per_call_64,
        pg_fresh_kv_us: postgres.as_ref().map(|p| p.fresh_kv_us),
        pg_fresh_http_us: postgres.as_ref().map(|p| p.fresh_http_us),
        pg_throughput_64: postgres.as_ref().map(|p| p.throughput_64),
        pg_commits_per_call_64: postgres.as_ref().map(|p| p.commits_per_call_64),
        pg_settings: postgres.map(|p| p.settings),
        polyglot: report::polyglot(&languages),
        languages,
        targets: Vec::new(),
        machine: report::Machine::here(&dir),
    };
    results.targets = report::targets(&results);
    if args.json {
        println!("{}", serde_json::to_string(&results)?);
    } else {
        report::print_table(&results);
    }
    b.provider.shutdown().await;
    Ok(())
}

/// A new database on a throwaway PostgreSQL cluster (started on first use), or `None`, said in one
/// line, when the server's binaries are not installed: the PostgreSQL measures are then skipped.
async fn postgres_database() -> anyhow::Result<Option<String>> {
    if !oncebox_pg_cluster::installed() {
        eprintln!("PostgreSQL is not installed (no initdb and postgres found): skipping the PostgreSQL measures");
        return Ok(None);
    }
    Ok(Some(oncebox_pg_cluster::fresh_database().await))
}
