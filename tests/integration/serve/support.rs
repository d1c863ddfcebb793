//! A real `oncebox serve` process for the `serve` tests: a tools directory with the example
//! components, a policy file that grants them the example provider, a ledger file, and the
//! address it printed. Killed (SIGKILL) when dropped.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use oncebox_example_provider::ProviderHandle;

/// The operator's token every test server is given.
pub const TOKEN: &str = "test-operator-token-0123456789";

/// The example tools a test server loads.
pub const TOOLS: [(&str, &str); 5] = [
    ("charge", oncebox_artifacts::CHARGE),
    ("refund", oncebox_artifacts::REFUND),
    ("fulfill", oncebox_artifacts::FULFILL),
    ("stock", oncebox_artifacts::STOCK),
    ("notify", oncebox_artifacts::NOTIFY),
];

/// A directory with the tools, the policy file and the ledger of one server (and of the server
/// restarted on the same files).
pub struct Setup {
    pub dir: tempfile::TempDir,
    /// A shared ledger (`postgres://…`) instead of the directory's file; its servers share the
    /// directory's key file.
    shared: Option<String>,
}

impl Setup {
    pub fn new(provider: &ProviderHandle) -> Setup {
        Setup::with_policy(provider, "")
    }

    /// `extra` is appended to the policy file (retry settings, `[hosts]` entries). The background
    /// reconciler is off: these servers' tests settle their unknowns themselves, and a reconciler
    /// settling one first would change what they see. `Setup::reconciling` leaves it on.
    pub fn with_policy(provider: &ProviderHandle, extra: &str) -> Setup {
        Setup::written(provider, &format!("{extra}\n[reconciler]\nenabled = false\n"))
    }

    /// Like [`Setup::with_policy`], with the server's background reconciler as `extra` sets it
    /// (a `[reconciler]` table), on by default.
    pub fn reconciling(provider: &ProviderHandle, extra: &str) -> Setup {
        Setup::written(provider, extra)
    }

    /// Like [`Setup::with_policy`], with every tool's downstream at `base` (a test's own server)
    /// instead of the example provider.
    pub fn downstream(base: &str, extra: &str) -> Setup {
        Setup::at(base, &format!("{extra}\n[reconciler]\nenabled = false\n"))
    }

    fn written(provider: &ProviderHandle, extra: &str) -> Setup {
        Setup::at(&provider.base_url(), extra)
    }

    fn at(base: &str, extra: &str) -> Setup {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("tools")).expect("tools dir");
        for (name, artifact) in TOOLS {
            std::fs::copy(artifact, dir.path().join("tools").join(format!("{name}.wasm"))).expect("copy component");
        }
        let mut policy = String::new();
        for (name, _) in TOOLS {
            // Quick retries, where the class allows them (an irreversible tool may not retry).
            if name != "fulfill" {
                policy.push_str(&format!(
                    "[tools.{name}]\nmax_attempts = 3\ninitial_backoff = \"10ms\"\nmax_backoff = \"50ms\"\n"
                ));
            }
            // notify enqueues to the outbox topic `email` (delivered where a test adds `[outbox.email]`).
            let outbox = if name == "notify" { "outbox = [\"email\"]\n" } else { "" };
            policy.push_str(&format!(
                "[tools.{name}.config]\nbase_url = \"{base}\"\n[tools.{name}.grants]\nhttp = [\"{base}\"]\n{outbox}\n"
            ));
        }
        policy.push_str(extra);
        std::fs::write(dir.path().join("oncebox.toml"), policy).expect("policy");
        Setup { dir, shared: None }
    }

    /// The same, on the shared ledger at `url`.
    pub fn on_shared(mut self, url: String) -> Setup {
        self.shared = Some(url);
        self
    }

    pub fn tools(&self) -> PathBuf {
        self.dir.path().join("tools")
    }

    pub fn ledger(&self) -> PathBuf {
        self.dir.path().join("ledger.redb")
    }

    pub fn policy(&self) -> PathBuf {
        self.dir.path().join("oncebox.toml")
    }

    /// The flags of `oncebox serve` on these files, without `--listen` or `--stdio`.
    pub fn flags(&self) -> Vec<String> {
        let path = |p: PathBuf| p.to_str().expect("utf8").to_string();
        vec![
            "serve".into(),
            "--tools".into(),
            path(self.tools()),
            "--ledger".into(),
            self.shared.clone().unwrap_or_else(|| path(self.ledger())),
            "--policy".into(),
            path(self.policy()),
        ]
    }

    /// `oncebox serve` on loopback, on a free port.
    pub fn serve(&self) -> Server {
        self.serve_with(&[])
    }

    pub fn serve_with(&self, extra: &[&str]) -> Server {
        self.serve_as(extra, "info", &[])
    }

    /// Like [`Setup::serve_with`], logging at `log` (`ONCEBOX_LOG`), started through `wrapper`
    /// (`["prlimit", "--nofile=1024:4096", "--"]`, say) when it is not empty.
    pub fn serve_as(&self, extra: &[&str], log: &str, wrapper: &[&str]) -> Server {
        self.spawn(extra, log, wrapper, &[])
    }

    /// `oncebox serve` on loopback with `env` set too (`OTEL_EXPORTER_OTLP_ENDPOINT`, say).
    pub fn serve_env(&self, env: &[(&str, &str)]) -> Server {
        self.spawn(&[], "info", &[], env)
    }

    fn spawn(&self, extra: &[&str], log: &str, wrapper: &[&str], env: &[(&str, &str)]) -> Server {
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(env!("CARGO_BIN_EXE_oncebox"));
                command
            }
            None => Command::new(env!("CARGO_BIN_EXE_oncebox")),
        };
        command
            .args(self.flags())
            .args(if extra.contains(&"--listen") { &[][..] } else { &["--listen", "127.0.0.1:0"][..] })
            .args(if extra.contains(&"--grace") { &[][..] } else { &["--grace", "5s"][..] })
            .args(extra)
            .env("ONCEBOX_TOKEN", TOKEN)
            .env("ONCEBOX_CACHE", cache())
            .env("ONCEBOX_LOG", log)
            .env("ONCEBOX_KEY_FILE", self.dir.path().join("hosts.key"))
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(std::fs::File::create(self.dir.path().join("serve.log")).expect("log file")));
        let mut child = command.spawn().expect("start oncebox serve");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).expect("read the address");
        let printed: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| {
            let log = std::fs::read_to_string(self.dir.path().join("serve.log")).unwrap_or_default();
            panic!("oncebox serve printed {line:?} ({e}); its log:\n{log}")
        });
        let base_url = printed["listening"].as_str().expect("listening").to_string();
        let server = Server { child: Some(child), base_url, log: self.dir.path().join("serve.log") };
        server.wait_ready();
        let log = server.log();
        assert!(!log.contains("refused; skipped"), "every example tool loads:\n{log}");
        server
    }
}

/// The suite's compile cache (the same as the CLI tests').
pub fn cache() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("compile-cache")
}

pub struct Server {
    child: Option<Child>,
    pub base_url: String,
    log: PathBuf,
}

impl Server {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    /// Waits up to a minute for `/healthz` to answer 200: the server printed its address at once,
    /// and answers `starting` while its first scan compiles the tools.
    pub fn wait_ready(&self) {
        use std::io::{Read, Write};
        let authority = self.base_url.trim_start_matches("http://").to_string();
        let status = || -> std::io::Result<String> {
            let mut stream = std::net::TcpStream::connect(&authority)?;
            stream.set_read_timeout(Some(Duration::from_secs(5)))?;
            write!(stream, "GET /healthz HTTP/1.1\r\nhost: {authority}\r\nconnection: close\r\n\r\n")?;
            let mut answer = String::new();
            stream.read_to_string(&mut answer)?;
            Ok(answer.lines().next().unwrap_or_default().to_string())
        };
        for _ in 0..600 {
            if status().is_ok_and(|line| line.starts_with("HTTP/1.1 200")) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("oncebox serve was not ready within a minute; its log:\n{}", self.log());
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// What the server wrote on stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL, and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends `signal` and waits up to `within` for the exit status.
    pub fn signal_and_wait(&mut self, signal: &str, within: Duration) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        let _ = Command::new("kill").args([&format!("-{signal}"), &child.id().to_string()]).status();
        let deadline = std::time::Instant::now() + within;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// An HTTP client for the tests (plain HTTP on loopback; TLS is never used).
pub fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder().timeout(Duration::from_secs(60)).build().expect("client")
}

/// A Python with the packages of `tests/serve/requirements.txt`: `$ONCEBOX_TEST_PYTHON`, else a
/// virtual environment under the target directory, made on first use.
pub fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("ONCEBOX_TEST_PYTHON") {
        return PathBuf::from(python);
    }
    let requirements = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/serve/requirements.txt");
    let wanted = std::fs::read_to_string(&requirements).expect("tests/serve/requirements.txt");
    crate::support::venv("serve-venv", &["-r".as_ref(), requirements.as_os_str()], &wanted)
}
