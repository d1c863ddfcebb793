//! The ledger behind PgBouncer (Debian's package), as a platform's "pooled" URL puts it: in
//! transaction mode, which cannot keep the session the ledger needs, a host is refused with a line
//! that names the pooler and what to do, whether PgBouncer refuses the session's settings (its
//! default) or drops them; in session mode, with the settings given to the role as backends.md
//! says, a call is made once.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use oncebox::{Call, HostBuilder, Status};
use oncebox_example_provider::Provider;

use crate::support::{charge, configure, load_all};

/// A PgBouncer of this test's own in front of the cluster the database at `url` is on; stopped
/// when dropped.
struct Bouncer {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Bouncer {
    fn start(url: &str, pool_mode: &str, ignore_options: bool) -> Bouncer {
        let program =
            ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"].into_iter().find(|p| std::path::Path::new(p).exists());
        crate::support::require("PgBouncer", program.is_some(), "pgbouncer");
        let program = program.unwrap_or_default();
        // postgres://postgres@127.0.0.1:PORT/NAME
        let rest = url.strip_prefix("postgres://postgres@127.0.0.1:").expect("the cluster's URL");
        let (port, database) = rest.split_once('/').expect("port/database");
        let listen = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a port").port();
        let dir = tempfile::tempdir().expect("dir");
        let ignore = if ignore_options { "ignore_startup_parameters = options\n" } else { "" };
        let config = format!(
            "[databases]\n* = host=127.0.0.1 port={port} user=postgres\n[pgbouncer]\nlisten_addr = 127.0.0.1\n\
             listen_port = {listen}\nunix_socket_dir =\nauth_type = any\npool_mode = {pool_mode}\n\
             default_pool_size = 40\nmax_client_conn = 200\nlogfile =\npidfile =\n{ignore}"
        );
        let ini = dir.path().join("pgbouncer.ini");
        std::fs::write(&ini, config).expect("config");
        // PgBouncer refuses root: as root, it runs as `nobody` (which must read its config).
        let root = Command::new("id").arg("-u").output().is_ok_and(|out| out.stdout.starts_with(b"0\n"));
        let mut command = Command::new(program);
        if root {
            use std::os::unix::fs::PermissionsExt;
            for path in [dir.path(), ini.as_path()] {
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
            }
            command.args(["-u", "nobody"]);
        }
        let child = command.arg(&ini).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn();
        let child = child.expect("start pgbouncer");
        let bouncer = Bouncer { child, url: format!("postgres://postgres@127.0.0.1:{listen}/{database}"), _dir: dir };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", listen)).is_err() {
            assert!(std::time::Instant::now() < deadline, "pgbouncer did not listen on {listen}");
            std::thread::sleep(Duration::from_millis(50));
        }
        bouncer
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn transaction_pooling_is_refused_naming_the_pooler_and_session_pooling_charges_once() {
    let url = crate::pg::fresh_database().await;
    // Its default: the session's settings are refused at connect.
    let bouncer = Bouncer::start(&url, "transaction", false);
    let refused = oncebox::Ledger::connect(&bouncer.url).await.map(drop).expect_err("refused").to_string();
    assert!(refused.contains("connection pooler") && refused.contains("session mode"), "{refused}");
    assert_eq!(refused.lines().count(), 1, "one line: {refused}");
    drop(bouncer);

    // Told to drop them: every write is refused by the schema guard, which says why.
    let provider = Provider::start().await.expect("provider");
    let keys = tempfile::tempdir().expect("dir");
    let builder = |ledger| HostBuilder::on_ledger(ledger).key_file(keys.path().join("hosts.key"));
    let bouncer = Bouncer::start(&url, "transaction", true);
    let ledger = oncebox::Ledger::connect(&bouncer.url).await.expect("connects: reads need no settings");
    let host = configure(builder(ledger), &provider, false).build().await.expect("host");
    load_all(&host).await;
    let call = || Call::step("pooled", "charge", "charge", charge("pool-1").to_string());
    let refused = host.call(call()).await.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(refused.contains("dropped its session settings"), "{refused}");
    assert_eq!(provider.counts("pool-1").payments, 0, "nothing was sent");
    drop((host, bouncer));

    // Session mode, with the settings given to the role in this database as backends.md says.
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(connection);
    let database = url.rsplit('/').next().expect("database");
    for setting in [
        "oncebox.schema = '2'",
        "plan_cache_mode = force_generic_plan",
        "enable_seqscan = off",
        "idle_in_transaction_session_timeout = 60000",
        "lock_timeout = 0",
        "synchronous_commit = on",
    ] {
        client.batch_execute(&format!("ALTER ROLE postgres IN DATABASE {database} SET {setting}")).await.expect("set");
    }
    let bouncer = Bouncer::start(&url, "session", true);
    let ledger = oncebox::Ledger::connect(&bouncer.url).await.expect("connect");
    let host = configure(builder(ledger), &provider, false).build().await.expect("host");
    load_all(&host).await;
    let outcome = host.call(call()).await.expect("call");
    assert_eq!(outcome.status, Status::Completed, "{outcome:?}");
    assert!(host.call(call()).await.expect("call").replayed);
    assert_eq!(provider.counts("pool-1").payments, 1);
}
