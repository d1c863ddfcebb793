//! A throwaway PostgreSQL cluster, for oncebox's tests and its bench: one implementation for both.
//!
//! The cluster is started on first use, once per process: `initdb` in a temporary directory, then
//! `postgres` on a free loopback port with [`SETTINGS`] (durable commits: `fsync=on`,
//! `synchronous_commit=on`), as an unprivileged user (`nobody`) when the process runs as root
//! (PostgreSQL refuses to run as root). A watchdog process stops it and removes its directory when
//! the process is gone, however it ended. Each caller gets a database of its own
//! ([`fresh_database`]); [`settings`] reads back what the server runs with. A test that crashes its
//! server starts a cluster of its own ([`Crashable`]).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The server settings the cluster starts with (`-c name=value`), beside the loopback address:
/// every commit durable before it is answered, and connections enough for many hosts' pools (the
/// tests run 64 processes of 16 connections at most on one database, not all at once).
pub const SETTINGS: [(&str, &str); 3] = [("fsync", "on"), ("synchronous_commit", "on"), ("max_connections", "300")];

/// What a server says it runs with (`SHOW`), for a run to state its own settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub server_version: String,
    pub fsync: String,
    pub synchronous_commit: String,
    pub max_connections: String,
}

/// Whether the server's binaries (`initdb`, `postgres`) are installed: without them
/// [`fresh_database`] panics.
pub fn installed() -> bool {
    binaries().is_some()
}

/// What the server at `url` runs with, as a session there sees it.
pub async fn settings(url: &str) -> Result<Settings, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    let connection = tokio::spawn(connection);
    let mut values = Vec::new();
    for name in ["server_version", "fsync", "synchronous_commit", "max_connections"] {
        let row = client.query_one(&format!("SHOW {name}"), &[]).await?;
        values.push(row.get::<_, String>(0));
    }
    drop(client);
    let _ = connection.await;
    let [server_version, fsync, synchronous_commit, max_connections] =
        <[String; 4]>::try_from(values).unwrap_or_else(|_| unreachable!("four SHOWs"));
    Ok(Settings { server_version, fsync, synchronous_commit, max_connections })
}

/// The running cluster: where to connect.
struct Cluster {
    port: u16,
}

static CLUSTER: OnceLock<Cluster> = OnceLock::new();

/// A new, empty database of the cluster (started on first use); its URL. Panics, with what went
/// wrong, if the cluster cannot start (see [`installed`]).
pub async fn fresh_database() -> String {
    database(CLUSTER.get_or_init(start).port).await
}

/// Where the server's binaries are: `pg_config --bindir`, else the newest
/// `/usr/lib/postgresql/*/bin` (Debian), else `PATH`.
fn binaries() -> Option<PathBuf> {
    let complete = |dir: &Path| dir.join("initdb").is_file() && dir.join("postgres").is_file();
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output()
        && out.status.success()
    {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if complete(&dir) {
            return Some(dir);
        }
    }
    let mut debian: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| Some((entry.file_name().to_str()?.parse().ok()?, entry.path().join("bin"))))
        .filter(|(_, dir)| complete(dir))
        .collect();
    debian.sort();
    if let Some((_, dir)) = debian.pop() {
        return Some(dir);
    }
    std::env::split_paths(&std::env::var_os("PATH")?).find(|dir| complete(dir))
}

/// Starts the cluster; panics with what went wrong (the server's log included) if it cannot.
fn start() -> Cluster {
    // The shared cluster runs until the process is gone (the watchdog stops it then).
    Cluster { port: Server::init(&[]).port }
}

/// A cluster of the caller's own, which it may crash and start again on the same data: for the
/// tests of what a server crash loses (commits not yet flushed) and what a host that outlives it
/// then does. It starts with [`SETTINGS`] and `extra`, and is stopped when dropped (or, as the
/// shared one, once the process is gone).
pub struct Crashable {
    server: Server,
}

impl Crashable {
    /// Starts a cluster with `extra` settings beside [`SETTINGS`]; panics if it cannot.
    pub fn start(extra: &[(&str, &str)]) -> Crashable {
        Crashable { server: Server::init(extra) }
    }

    /// A new, empty database of this cluster; its URL.
    pub async fn fresh_database(&self) -> String {
        database(self.server.port).await
    }

    /// Crashes the server: every server process quits at once, writing nothing more (PostgreSQL's
    /// immediate shutdown), so what its WAL writer had not written out yet is lost, as in a
    /// power cut. Then starts it again on the same data, which replays what was written.
    pub fn crash_and_restart(&mut self) {
        self.server.crash();
        self.server.spawn();
    }
}

impl Drop for Crashable {
    fn drop(&mut self) {
        self.server.crash();
    }
}

/// A new, empty database of the cluster on `port`; its URL.
async fn database(port: u16) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = format!("t{}_{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
    let admin = format!("host=127.0.0.1 port={port} user=postgres dbname=postgres");
    let (client, connection) =
        tokio_postgres::connect(&admin, tokio_postgres::NoTls).await.expect("connect to the cluster");
    let connection = tokio::spawn(connection);
    client.batch_execute(&format!("CREATE DATABASE {name}")).await.expect("create a database");
    drop(client);
    let _ = connection.await;
    format!("postgres://postgres@127.0.0.1:{port}/{name}")
}

/// One server: its directory, how it is started, and the running postmaster.
struct Server {
    dir: PathBuf,
    bin: PathBuf,
    /// `setpriv ... --` when the process runs as root (PostgreSQL refuses root).
    as_user: Vec<String>,
    args: Vec<String>,
    port: u16,
    postmaster: Option<std::process::Child>,
}

impl Server {
    /// `initdb`, then the server on a free port, and a watchdog that stops it once this process
    /// is gone; panics with what went wrong (the server's log included) if it cannot.
    fn init(extra: &[(&str, &str)]) -> Server {
        let bin = binaries().unwrap_or_else(|| {
            panic!("PostgreSQL is not installed (no initdb and postgres found): install the `postgresql` package")
        });
        let dir = tempfile::Builder::new().prefix("oncebox-pg-").tempdir().expect("temp dir").keep();
        // PostgreSQL refuses root: as root, the cluster belongs to `nobody` and runs as `nobody`.
        let root = std::fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false);
        let mut as_user: Vec<String> = Vec::new();
        if root {
            let id = |flag: &str| -> u32 {
                let out = Command::new("id").args([flag, "nobody"]).output().expect("id nobody");
                String::from_utf8_lossy(&out.stdout).trim().parse().expect("nobody's id")
            };
            let (uid, gid) = (id("-u"), id("-g"));
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).expect("chown the cluster directory");
            as_user = vec![
                "setpriv".into(),
                format!("--reuid={uid}"),
                format!("--regid={gid}"),
                "--clear-groups".into(),
                "--".into(),
            ];
        }
        let data = dir.join("data").to_str().expect("utf-8 path").to_string();
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
        let sockets = dir.to_str().expect("utf-8 path").to_string();
        let mut args: Vec<String> =
            ["-D", &data, "-p", &port.to_string(), "-k", &sockets, "-c", "listen_addresses=127.0.0.1"]
                .map(String::from)
                .into();
        for (name, value) in SETTINGS.iter().chain(extra) {
            args.extend(["-c".to_string(), format!("{name}={value}")]);
        }
        let mut server = Server { dir, bin, as_user, args, port, postmaster: None };
        let initdb = ["-D", &data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-locale", "--no-sync"];
        let status = server.command("initdb", &initdb, "initdb.log").status().expect("run initdb");
        assert!(status.success(), "initdb failed: {}", server.log("initdb.log"));
        // The watchdog: once this process is gone, stop the server (immediate shutdown: its data
        // is thrown away, so no checkpoint; then kill) and remove its directory. It reads the
        // postmaster's pid from the data directory, so a server started again is stopped too. It
        // is never waited for: it outlives this process by design (init reaps it), so it is never
        // a zombie.
        #[allow(clippy::zombie_processes)]
        Command::new("sh")
            .arg("-c")
            .arg(
                r#"while kill -0 "$1" 2>/dev/null; do sleep 0.2; done
                   pid=$(head -n 1 "$2/data/postmaster.pid" 2>/dev/null)
                   if [ -n "$pid" ]; then
                     kill -QUIT "$pid" 2>/dev/null
                     i=0; while kill -0 "$pid" 2>/dev/null && [ "$i" -lt 50 ]; do sleep 0.1; i=$((i+1)); done
                     kill -KILL "$pid" 2>/dev/null
                   fi
                   rm -rf "$2""#,
            )
            .args(["oncebox-pg-watchdog", &std::process::id().to_string()])
            .arg(&server.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the watchdog");
        server.spawn();
        server
    }

    /// `program` of the server's binaries with `args`, as the server's user, in its directory,
    /// its output to `log` there.
    fn command(&self, program: &str, args: &[&str], log: &str) -> Command {
        let log = std::fs::File::create(self.dir.join(log)).expect("log file");
        let program = self.bin.join(program);
        let mut command = match self.as_user.split_first() {
            Some((setpriv, rest)) => {
                let mut command = Command::new(setpriv);
                command.args(rest).arg(program);
                command
            }
            None => Command::new(program),
        };
        command
            .args(args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        command
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(name)).unwrap_or_default()
    }

    /// Starts the postmaster and waits until it accepts connections.
    fn spawn(&mut self) {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        let mut postmaster = self.command("postgres", &args, "postgres.log").spawn().expect("start postgres");
        let port = self.port.to_string();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = postmaster.try_wait() {
                panic!("postgres exited ({status}): {}", self.log("postgres.log"));
            }
            let ready = Command::new(self.bin.join("pg_isready"))
                .args(["-q", "-h", "127.0.0.1", "-p", &port, "-U", "postgres"])
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                self.postmaster = Some(postmaster);
                return;
            }
            assert!(Instant::now() < deadline, "postgres did not start: {}", self.log("postgres.log"));
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Immediate shutdown (SIGQUIT: every server process exits at once, writing nothing), waited for.
    fn crash(&mut self) {
        if let Some(mut postmaster) = self.postmaster.take() {
            // The shell's own `kill`: no `kill` binary needed.
            let pid = postmaster.id().to_string();
            let _ = Command::new("sh").args(["-c", r#"kill -QUIT "$1""#, "kill", &pid]).status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(postmaster.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            // Not gone in time: killed outright.
            let _ = postmaster.kill();
            let _ = postmaster.wait();
        }
    }
}
