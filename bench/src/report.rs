//! The results, the targets of issue 4 against them, and the machine they ran on.

use serde::Serialize;

use crate::stats::Latency;

#[derive(Debug, Serialize)]
pub struct Results {
    pub fsync_us: Latency,
    pub native_call_us: Latency,
    /// One redb commit shaped like a local-only call's (five small records): the floor under
    /// `fresh_kv_us` with this ledger layout. Not one of issue 4's names; here to explain them.
    pub redb_commit_us: Latency,
    pub instantiate_us: Latency,
    pub replay_us: Latency,
    pub fresh_kv_us: Latency,
    pub fresh_http_us: Latency,
    pub throughput_1: f64,
    pub throughput_8: f64,
    pub throughput_64: f64,
    pub naive_redb_64: f64,
    pub sqlite_64: f64,
    /// Durable ledger commits per call during `throughput_64`: what group commit saved.
    pub commits_per_call_64: f64,
    /// `fresh_kv_us`, `fresh_http_us`, `throughput_64` and its commits per call on a PostgreSQL
    /// ledger (the same tools and workload); `None` when PostgreSQL is not installed.
    pub pg_fresh_kv_us: Option<Latency>,
    pub pg_fresh_http_us: Option<Latency>,
    pub pg_throughput_64: Option<f64>,
    pub pg_commits_per_call_64: Option<f64>,
    /// What the PostgreSQL server said it runs with (`SHOW`).
    pub pg_settings: Option<PgSettings>,
    /// The same read-only tool in Rust, Python and JavaScript: size, loads, instantiation, a call.
    pub languages: Vec<crate::languages::LangLoad>,
    /// The same figures by name, `polyglot_{instantiate_us,call_us,first_load_ms,warm_load_ms}_LANG`.
    #[serde(flatten)]
    pub polyglot: serde_json::Map<String, serde_json::Value>,
    pub targets: Vec<Target>,
    pub machine: Machine,
}

/// The PostgreSQL measures of one run.
pub struct Postgres {
    pub settings: PgSettings,
    pub fresh_kv_us: Latency,
    pub fresh_http_us: Latency,
    pub throughput_64: f64,
    pub commits_per_call_64: f64,
}

#[derive(Debug, Serialize)]
pub struct PgSettings {
    pub server_version: String,
    pub fsync: String,
    pub synchronous_commit: String,
    pub max_connections: String,
}

impl From<oncebox_pg_cluster::Settings> for PgSettings {
    fn from(s: oncebox_pg_cluster::Settings) -> PgSettings {
        PgSettings {
            server_version: s.server_version,
            fsync: s.fsync,
            synchronous_commit: s.synchronous_commit,
            max_connections: s.max_connections,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct Target {
    pub target: String,
    pub met: bool,
    pub measured: String,
}

#[derive(Debug, Serialize)]
pub struct Machine {
    pub cores: usize,
    pub cpu: String,
    pub os: String,
    pub dir: String,
}

impl Machine {
    pub fn here(dir: &std::path::Path) -> Machine {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|info| info.lines().find(|l| l.starts_with("model name")).map(|l| l.to_string()))
            .and_then(|line| line.split_once(':').map(|(_, model)| model.trim().to_string()))
            .unwrap_or_else(|| "unknown".into());
        Machine {
            cores: std::thread::available_parallelism().map_or(1, usize::from),
            cpu,
            os: format!("{} {}", std::env::consts::OS, std::env::consts::ARCH),
            dir: dir.display().to_string(),
        }
    }
}

/// Issue 4's targets for this machine, judged against the run.
pub fn targets(r: &Results) -> Vec<Target> {
    let t = |target: &str, met: bool, measured: String| Target { target: target.into(), met, measured };
    let kv_bound = 3.0 * r.fsync_us.p50 + 100.0;
    let mut targets = vec![
        t("replay_us p50 <= 10", r.replay_us.p50 <= 10.0, format!("{:.1}", r.replay_us.p50)),
        t("instantiate_us p50 <= 10", r.instantiate_us.p50 <= 10.0, format!("{:.1}", r.instantiate_us.p50)),
        t(
            "fresh_kv_us p50 <= 3 x fsync_us + 100",
            r.fresh_kv_us.p50 <= kv_bound,
            format!("{:.0} (bound {kv_bound:.0})", r.fresh_kv_us.p50),
        ),
        t("throughput_64 >= 20,000/s", r.throughput_64 >= 20_000.0, format!("{:.0}", r.throughput_64)),
        t(
            "throughput_64 >= 5 x naive_redb_64",
            r.throughput_64 >= 5.0 * r.naive_redb_64,
            format!("{:.1}x", r.throughput_64 / r.naive_redb_64),
        ),
        t(
            "throughput_64 >= 3 x sqlite_64",
            r.throughput_64 >= 3.0 * r.sqlite_64,
            format!("{:.1}x", r.throughput_64 / r.sqlite_64),
        ),
    ];
    // Issue 37: the shared ledger at half of redb's throughput, in the same run.
    if let Some(pg) = r.pg_throughput_64 {
        let ratio = pg / r.throughput_64;
        targets.push(t("pg_throughput_64 >= 0.5 x throughput_64", ratio >= 0.5, format!("{ratio:.2}x ({pg:.0})")));
    }
    targets.extend(language_targets(&r.languages));
    targets
}

/// The targets of issues 20 and 37 for the tool in each language, against Rust's figures of the
/// same run.
pub fn language_targets(languages: &[crate::languages::LangLoad]) -> Vec<Target> {
    let t = |target: String, met: bool, measured: String| Target { target, met, measured };
    let rust = languages.iter().find(|l| l.lang == "rust");
    let mut targets = Vec::new();
    for l in languages.iter().filter(|l| l.lang != "rust") {
        // Issue 20: a language runtime's component (about 20 MB) compiles once per version, within 10 s.
        if !l.first_load_ms.is_nan() {
            let target = format!("polyglot_first_load_ms_{} <= 10,000 ({:.1} MB)", l.lang, l.component_mb);
            targets.push(t(target, l.first_load_ms <= 10_000.0, format!("{:.0}", l.first_load_ms)));
        }
        // Issue 37: an instance within 3x Rust's; a call within 3x (JavaScript) or 5x (Python).
        let Some(rust) = rust else { continue };
        let instantiate = l.instantiate_us.p50 / rust.instantiate_us.p50;
        let target = format!("polyglot_instantiate_us_{} p50 <= 3 x rust's", l.lang);
        targets.push(t(target, instantiate <= 3.0, format!("{instantiate:.1}x ({:.1})", l.instantiate_us.p50)));
        let bound = if l.lang == "python" { 5.0 } else { 3.0 };
        let call = l.call_us.p50 / rust.call_us.p50;
        let target = format!("polyglot_call_us_{} p50 <= {bound} x rust's", l.lang);
        targets.push(t(target, call <= bound, format!("{call:.1}x ({:.1})", l.call_us.p50)));
    }
    targets
}

/// Each language's figures by name, as the JSON reports them: `polyglot_instantiate_us_python`
/// (p50 and p99), `polyglot_call_us_python`, `polyglot_first_load_ms_python`,
/// `polyglot_warm_load_ms_python` (the median load; NaN, written null, when no load was timed).
pub fn polyglot(languages: &[crate::languages::LangLoad]) -> serde_json::Map<String, serde_json::Value> {
    let mut named = serde_json::Map::new();
    for l in languages {
        let lang = l.lang;
        named.insert(format!("polyglot_instantiate_us_{lang}"), serde_json::json!(l.instantiate_us));
        named.insert(format!("polyglot_call_us_{lang}"), serde_json::json!(l.call_us));
        named.insert(format!("polyglot_first_load_ms_{lang}"), serde_json::json!(l.first_load_ms));
        named.insert(format!("polyglot_warm_load_ms_{lang}"), serde_json::json!(l.warm_load_ms));
    }
    named
}

/// The same tool in each language: its component, its loads, an instantiation and a call, each
/// also as a multiple of Rust's in the same run. (The full table lists the targets after it.)
pub fn print_languages(languages: &[crate::languages::LangLoad]) {
    let rust = languages.iter().find(|l| l.lang == "rust");
    let times = |value: f64, of: Option<f64>| of.map_or(String::new(), |of| format!(" ({:.1}x)", value / of));
    println!(
        "| polyglot_*_LANG | component MB | first_load_ms | warm_load_ms | instantiate_us p50 | instantiate_us p99 | \
         call_us p50 | call_us p99 |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for l in languages {
        println!(
            "| {} | {:.1} | {:.0} | {:.0} | {:.1}{} | {:.1} | {:.1}{} | {:.1} |",
            l.lang,
            l.component_mb,
            l.first_load_ms,
            l.warm_load_ms,
            l.instantiate_us.p50,
            times(l.instantiate_us.p50, rust.map(|r| r.instantiate_us.p50)),
            l.instantiate_us.p99,
            l.call_us.p50,
            times(l.call_us.p50, rust.map(|r| r.call_us.p50)),
            l.call_us.p99,
        );
    }
}

pub fn print_table(r: &Results) {
    println!("| measure | p50 | p99 |");
    println!("|---|---:|---:|");
    for (name, l) in [
        ("fsync_us", r.fsync_us),
        ("native_call_us", r.native_call_us),
        ("redb_commit_us", r.redb_commit_us),
        ("instantiate_us", r.instantiate_us),
        ("replay_us", r.replay_us),
        ("fresh_kv_us", r.fresh_kv_us),
        ("fresh_http_us", r.fresh_http_us),
    ] {
        println!("| {name} | {:.1} | {:.1} |", l.p50, l.p99);
    }
    println!();
    println!("| workload | calls/s |");
    println!("|---|---:|");
    for (name, rate) in [
        ("throughput_1", r.throughput_1),
        ("throughput_8", r.throughput_8),
        ("throughput_64", r.throughput_64),
        ("naive_redb_64", r.naive_redb_64),
        ("sqlite_64", r.sqlite_64),
    ] {
        println!("| {name} | {rate:.0} |");
    }
    println!("\nledger commits per call at 64 callers: {:.3}", r.commits_per_call_64);
    if !r.languages.is_empty() {
        println!();
        print_languages(&r.languages);
    }
    match (&r.pg_settings, r.pg_fresh_kv_us, r.pg_fresh_http_us, r.pg_throughput_64, r.pg_commits_per_call_64) {
        (Some(s), Some(kv), Some(http), Some(rate), Some(commits)) => {
            println!(
                "\n| ledger | fresh_kv_us p50 | fresh_kv_us p99 | fresh_http_us p50 | fresh_http_us p99 | throughput_64 \
                 calls/s |"
            );
            println!("|---|---:|---:|---:|---:|---:|");
            let (kv0, http0) = (r.fresh_kv_us, r.fresh_http_us);
            println!(
                "| redb (file) | {:.1} | {:.1} | {:.1} | {:.1} | {:.0} |",
                kv0.p50, kv0.p99, http0.p50, http0.p99, r.throughput_64
            );
            println!("| PostgreSQL | {:.1} | {:.1} | {:.1} | {:.1} | {rate:.0} |", kv.p50, kv.p99, http.p50, http.p99);
            println!("| SQLite alternative (no wasm) | | | | | {:.0} |", r.sqlite_64);
            println!(
                "\nPostgreSQL {}: fsync={}, synchronous_commit={}, max_connections={}, local cluster on loopback; \
                 ledger commits per call at 64 callers: {commits:.3}",
                s.server_version, s.fsync, s.synchronous_commit, s.max_connections
            );
        }
        _ => println!("\nPostgreSQL: not measured (not installed)"),
    }
    println!("\n| target | met | measured |");
    println!("|---|---|---|");
    for t in &r.targets {
        println!("| {} | {} | {} |", t.target, if t.met { "yes" } else { "no" }, t.measured);
    }
    let m = &r.machine;
    println!("\nmachine: {} cores, {}, {}, files in {}", m.cores, m.cpu, m.os, m.dir);
}
