//! The PostgreSQL ledger's own tests: what only a store shared between processes has to get right,
//! one file per subject: the schema (`schema.rs`), hosts racing to claim (`claims.rs`), group
//! commit (`groups.rs`) and what rides with a later flush (`riding.rs`). Their helpers are here.
//!
//! The throwaway cluster they run on (started on first use, once per test process, stopped when
//! it is gone) is `oncebox-pg-cluster`'s, shared with the bench. Each test gets a database of its
//! own ([`fresh_database`]).

pub use oncebox_pg_cluster::fresh_database;

mod claims;
mod groups;
mod open_work;
mod poolers;
mod riding;
mod schema;

use oncebox::ReplayClass;
use oncebox::ledger::{ApprovalRecord, ApprovalState, Claim, ClaimRequest, Ledger};

fn request(key: &str, owner: &str, now_ms: u64) -> ClaimRequest {
    ClaimRequest {
        key: key.into(),
        run_id: "run".into(),
        step_id: key.into(),
        tool: "fulfill".into(),
        class: ReplayClass::Irreversible,
        fingerprint: "args".into(),
        older_fingerprints: Vec::new(),
        args: serde_json::Value::Null,
        owner: owner.into(),
        now_ms,
        lease_ms: 100,
        approval: None,
        sealed: None,
    }
}

fn approval(key: &str, revision: u32, state: ApprovalState) -> ApprovalRecord {
    ApprovalRecord {
        operation_key: key.into(),
        fingerprint: "args".into(),
        component: Some("sha256:aaaa".into()),
        run_id: "run".into(),
        step_id: key.into(),
        tool: "fulfill".into(),
        description: "Ships".into(),
        consequence: None,
        args: serde_json::Value::Null,
        sealed: None,
        requested_ms: 1,
        state,
        decided_by: None,
        decided_ms: None,
        note: None,
        expires_ms: None,
        revision,
    }
}

/// Claims `ops` one after another and answers their fences.
async fn claimed(ledger: &Ledger, ops: &[String]) -> Vec<u64> {
    let mut fences = Vec::new();
    for op in ops {
        match ledger.claim(&request(op, "a", 1_000)).await.expect("claim") {
            Claim::Owned { fence, .. } => fences.push(fence),
            other => panic!("{op}: {other:?}"),
        }
    }
    fences
}

/// A client of the database at `url`, its connection driven on a task of its own, writing as a
/// host of this schema does (`oncebox.schema`: the guard of `schema.rs` refuses others' writes).
/// Waits until every other session of `client`'s database ended (a ledger dropped closes its
/// connections), so that the statistics they counted are reported; at most 10 s.
async fn others_closed(client: &tokio_postgres::Client) {
    let others = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                  AND backend_type = 'client backend' AND pid <> pg_backend_pid()";
    let closed = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while client.query_one(others, &[]).await.expect("activity").get::<_, i64>(0) > 0 {
        assert!(std::time::Instant::now() < closed, "the dropped ledger's connections were not closed within 10 s");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

async fn connect(url: &str) -> tokio_postgres::Client {
    let client = connect_unmarked(url).await;
    client.batch_execute("SET oncebox.schema = '2'").await.expect("oncebox.schema");
    client
}

/// A client of the database at `url` that does not say which schema it writes: a host of an
/// older oncebox, or an operator's own session.
async fn connect_unmarked(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(connection);
    client
}

async fn provider() -> oncebox_example_provider::ProviderHandle {
    oncebox_example_provider::Provider::start().await.expect("provider")
}

/// A host on the ledger at `url` (its key file in `dir`), configured as the tests' hosts are for
/// `provider`, and then by `more`, with the example tools loaded.
async fn host_on(
    url: &str,
    dir: &tempfile::TempDir,
    provider: &oncebox_example_provider::ProviderHandle,
    honours_keys: bool,
    more: impl FnOnce(oncebox::HostBuilder) -> oncebox::HostBuilder,
) -> oncebox::Host {
    let builder =
        oncebox::HostBuilder::at(oncebox::LedgerAt::Postgres(url.into())).key_file(dir.path().join("hosts.key"));
    let host = more(crate::support::configure(builder, provider, honours_keys)).build().await.expect("host");
    crate::support::load_all(&host).await;
    host
}
