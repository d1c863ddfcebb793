//! The PostgreSQL backend: one ledger shared by many hosts, each a process of its own.
//!
//! Everything the contract asks a store to decide is decided by the database, in the transaction
//! that writes it: a claim, a take-over, every fence check, an approval's revision, a versioned
//! KV write (see `jobs.rs` for the locks and why READ COMMITTED is enough). Nothing is claimed in
//! one process's memory, as the redb backend does for speed: another host could not see it.
//! Fences beyond the first come from a database sequence, so no two hosts ever hand out the same
//! one (a new operation's fence is 1; the random token its row carries tells two such claims
//! apart, should a server crash lose the first: `riding.rs`). A Store call runs in one
//! transaction, its own or, for the hot path's claims, write-aheads and attempts, one shared with
//! other callers' (group commit: `group.rs`); its future resolves `Ok` only after the COMMIT
//! answered (the sessions run with `synchronous_commit = on`; a new operation's claim, with the
//! first fence and under no approval, and an effect's answer ride with the owner's next flushed
//! COMMIT instead, as on redb: `group.rs`, `riding.rs`), and a call that resolves `Err` wrote
//! nothing that was recorded. The exceptions say so: a connection lost after the
//! COMMIT may have been sent, a COMMIT that failed itself, and writers stopped while a group was
//! in flight (the host going away) leave unknown whether the write was recorded, as the redb
//! backend's failed batch does.
//!
//! Every transaction that changes a status or a request for approval also keeps the index of
//! open work and of ended operations (`index.rs`), which `Store::open_runs` and
//! `Store::ended_before` read (`open.rs`), so that background work and views follow the open work,
//! not the history.
//!
//! As in the redb backend, an operation claimed but not yet written to (no write-ahead, no
//! attempt) is not shown by reads; here its row exists all the same (`recorded = false`), since
//! the row is what other hosts' claims meet.
//!
//! # No recovery at connect
//!
//! Opening a redb file recovers what the previous process left (`redb/open.rs`): every effect
//! written ahead and never answered becomes `unknown` and every lease is dropped, because the
//! file has one process and the one before it is dead. A PostgreSQL ledger has many hosts at
//! once: a host connecting cannot tell a dead host's claim from a live one's, and marking a live
//! host's in-flight effects unknown, or dropping its lease, would hand its operation to a second
//! runner while the first is still sending. So connecting changes nothing. A dead host's claims
//! are taken over when their leases expire (their owners stop renewing them), and the pipeline's
//! effect guard already treats an inherited `dispatched` record as in doubt, as it does an
//! `unknown` one: the new owner reconciles or resends with the same key, never sends blind.

mod clock;
mod combine;
mod db;
mod group;
mod grouped;
mod index;
mod jobs;
mod name;
mod open;
mod options;
mod pipeline;
mod riding;
mod writes;

pub use name::without_password;
mod notify;
mod schema;

use crate::ReconcileNote;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use deadpool_postgres::tokio_postgres::types::ToSql;
use deadpool_postgres::tokio_postgres::{IsolationLevel, NoTls, Row};
use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod};

use super::{
    ApprovalRecord, AttemptRecord, BoxFuture, Claim, ClaimRequest, DeliveryAnswer, EffectRecord, EffectStatus, Finish,
    KvEntry, Ledger, LedgerError, OperationRecord, OutboxMessage, Removed, Resolution, Settlement, Staged,
    StaleApproval, Store, Tombstone,
};
use db::{Tx, column, describe, record, uint};
use jobs::Done;

/// Connections per host: the group runners' ([`group::RUNNERS`]), and the reads and the jobs off
/// the hot path of the calls in flight, side by side. The hot path's writes do not grow with the
/// callers (they wait in groups, not for connections), so more connections would only add
/// backends competing for the server's cores.
const POOL_SIZE: usize = 16;
/// How long connecting may take when the URL does not say (`connect_timeout`).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The PostgreSQL store: a pool of connections to one database shared with other hosts.
pub struct PostgresStore {
    pool: Pool,
    /// The URL without its password, for messages.
    name: String,
    path: PathBuf,
    commits: Arc<AtomicU64>,
    /// The hot path's calls, carried in groups (`group.rs`).
    groups: group::Groups,
    /// Wakes this host's waiters when another host's operation changes (`LISTEN`).
    listener: notify::Listener,
    /// The database's clock less this host's, in ms, as last measured (`clock.rs`).
    clock: Arc<clock::Offset>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore").field("name", &self.name).finish()
    }
}

impl Ledger {
    /// Connects to the PostgreSQL ledger at `url` (created in an empty database), shared with
    /// every other host connected to it. Nothing is recovered at connect: see the module docs.
    pub async fn connect(url: &str) -> Result<Ledger, LedgerError> {
        Ok(Ledger::on(PostgresStore::connect(url).await?))
    }
}

impl PostgresStore {
    /// Connects to the database at `url` (a `postgres://` URI or libpq key/value pairs), creates
    /// the schema if the database has none, and checks its version otherwise. Refused, with an
    /// error naming the store and what failed, if the server cannot be reached or the schema is
    /// of another version.
    pub async fn connect(url: &str) -> Result<PostgresStore, LedgerError> {
        let name = name::without_password(url);
        let fail = |what: String| LedgerError::Database { store: name.clone(), what };
        let mut config: deadpool_postgres::tokio_postgres::Config =
            url.parse().map_err(|e| fail(format!("not a PostgreSQL connection string: {}", describe(&e))))?;
        config.options(options::session(config.get_options()));
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("oncebox");
        }
        let listener = notify::Listener::new(config.clone());
        let manager = Manager::from_config(config, NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .build()
            .map_err(|e| fail(format!("cannot make a connection pool: {e}")))?;
        let clock = Arc::new(clock::Offset::default());
        let commits = Arc::new(AtomicU64::new(0));
        let groups = group::Groups::start(pool.clone(), name.clone(), commits.clone());
        let store = PostgresStore { pool, path: PathBuf::from(&name), name, commits, groups, listener, clock };
        let mut client = store.client().await?;
        let tx = store.begin(&mut client).await?;
        match schema::init(&tx).await {
            Ok(()) => tx.commit().await?,
            Err(e) => {
                tx.rollback().await;
                return Err(e);
            }
        }
        schema::index_records(&mut client, &store.name).await?;
        schema::keep_room_for_rewrites(&mut client).await;
        clock::measure(&client, &store.clock)
            .await
            .map_err(|e| store.fail(format!("reading its clock: {}", describe(&e))))?;
        drop(client);
        clock::keep_measuring(&store.pool, Arc::downgrade(&store.clock));
        Ok(store)
    }

    /// The URL without its password.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn fail(&self, what: String) -> LedgerError {
        LedgerError::Database { store: self.name.clone(), what }
    }

    async fn client(&self) -> Result<deadpool_postgres::Client, LedgerError> {
        self.pool.get().await.map_err(|e| {
            let why = match &e {
                PoolError::Backend(e) => describe(e),
                other => other.to_string(),
            };
            self.fail(format!("cannot connect: {why}"))
        })
    }

    async fn begin<'c>(&'c self, client: &'c mut deadpool_postgres::Client) -> Result<Tx<'c>, LedgerError> {
        let tx = client
            .build_transaction()
            .isolation_level(IsolationLevel::ReadCommitted)
            .start()
            .await
            .map_err(|e| self.fail(format!("cannot begin a transaction: {}", describe(&e))))?;
        Ok(Tx { tx, store: &self.name })
    }

    /// Commits what the job decided to write (and counts the commit), or rolls back.
    async fn end<T>(&self, tx: Tx<'_>, done: Done<T>) -> Result<T, LedgerError> {
        match done {
            Ok((answer, true)) => {
                tx.commit().await?;
                self.commits.fetch_add(1, Ordering::Relaxed);
                Ok(answer)
            }
            Ok((answer, false)) => {
                tx.rollback().await;
                Ok(answer)
            }
            Err(e) => {
                tx.rollback().await;
                Err(e)
            }
        }
    }

    /// One statement outside any transaction: a read of committed state.
    async fn read(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>, LedgerError> {
        let client = self.client().await?;
        let rows = match client.prepare_cached(sql).await {
            Ok(statement) => client.query(&statement, params).await,
            Err(e) => Err(e),
        }
        .map_err(|e| db::failed(&self.name, sql, &e));
        forget_if_broken(client, &rows);
        rows
    }

    async fn records<T: serde::de::DeserializeOwned>(
        &self,
        table: &str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<T>, LedgerError> {
        self.read(sql, params).await?.iter().map(|row| record(row, 0, table)).collect()
    }

    async fn one<T: serde::de::DeserializeOwned>(
        &self,
        table: &str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<T>, LedgerError> {
        Ok(self.records(table, sql, params).await?.into_iter().next())
    }
}

/// Drops a connection from the pool after the database failed a call on it (`Database`, not a
/// refusal such as `Fenced`): it may be one the server closed, which the pool would otherwise
/// hand to the next call before it noticed. A new one is made when needed.
fn forget_if_broken<T>(client: deadpool_postgres::Client, ended: &Result<T, LedgerError>) {
    if matches!(ended, Err(LedgerError::Database { .. })) {
        drop(deadpool_postgres::Object::take(client));
    }
}

/// Runs `job` on the transaction `tx` of a fresh connection, then commits or rolls back.
macro_rules! transaction {
    ($store:expr, |$tx:ident| $job:expr) => {{
        let store = $store;
        let mut client = store.client().await?;
        let ended = match store.begin(&mut client).await {
            Ok($tx) => {
                let done = $job.await;
                store.end($tx, done).await
            }
            Err(e) => Err(e),
        };
        forget_if_broken(client, &ended);
        ended
    }};
}

impl Store for PostgresStore {
    fn name(&self) -> &Path {
        &self.path
    }

    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, LedgerError>> {
        Box::pin(async move {
            let job = grouped::Job::Claim { req: req.clone(), token: riding::token().map_err(|e| self.fail(e))? };
            match self.groups.submit(job, &self.name).await? {
                grouped::Answer::Claim(claim) => Ok(*claim),
                grouped::Answer::Written => Err(self.fail("a claim was answered as a write".into())),
            }
        })
    }

    fn reopen<'a>(
        &'a self,
        req: &'a ClaimRequest,
        resendable: Vec<String>,
    ) -> BoxFuture<'a, Result<Claim, LedgerError>> {
        Box::pin(async move { transaction!(self, |tx| jobs::reopen(&tx, req, &resendable)) })
    }

    fn renew<'a>(&'a self, key: &'a str, fence: u64, until_ms: u64) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(async move {
            let ridden = self.groups.ridden_claim(key).filter(|_| fence == 1);
            transaction!(self, |tx| jobs::renew(&tx, key, fence, until_ms, ridden))
        })
    }

    fn put_effect<'a>(
        &'a self,
        fence: u64,
        effect: &'a EffectRecord,
        expected: Option<(EffectStatus, u32)>,
        staged: Staged,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        let job = grouped::Job::PutEffect { fence, effect: effect.clone(), expected, staged };
        Box::pin(async move { self.groups.submit(job, &self.name).await.map(drop) })
    }

    fn record_attempt<'a>(
        &'a self,
        fence: u64,
        attempt: &'a AttemptRecord,
        finish: Option<Finish>,
        now_ms: u64,
        staged: Staged,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        let job = grouped::Job::RecordAttempt { fence, attempt: attempt.clone(), finish, now_ms, staged };
        Box::pin(async move { self.groups.submit(job, &self.name).await.map(drop) })
    }

    fn resolve<'a>(
        &'a self,
        operation_key: &'a str,
        effect_key: Option<&'a str>,
        seen: Option<u32>,
        resolution: &'a Resolution,
        settlement: &'a Settlement,
    ) -> BoxFuture<'a, Result<OperationRecord, LedgerError>> {
        Box::pin(async move {
            transaction!(self, |tx| jobs::resolve(&tx, operation_key, effect_key, seen, resolution, settlement))
        })
    }

    fn operation<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<OperationRecord>, LedgerError>> {
        Box::pin(async move {
            let sql = "SELECT record FROM oncebox_operations WHERE key = $1 AND recorded";
            self.one("oncebox_operations", sql, &[&key]).await
        })
    }

    fn operations<'a>(&'a self, run_id: Option<&'a str>) -> BoxFuture<'a, Result<Vec<OperationRecord>, LedgerError>> {
        Box::pin(async move {
            match run_id {
                None => {
                    let sql = "SELECT record FROM oncebox_operations WHERE recorded ORDER BY key";
                    self.records("oncebox_operations", sql, &[]).await
                }
                // A run's steps in step order, as the redb backend's run index keeps them.
                Some(run) => {
                    let sql = "SELECT record FROM oncebox_operations WHERE run_id = $1 AND recorded \
                               ORDER BY step_id, tool, key";
                    self.records("oncebox_operations", sql, &[&run]).await
                }
            }
        })
    }

    fn in_flight<'a>(&'a self, run_id: Option<&'a str>) -> BoxFuture<'a, Result<Vec<OperationRecord>, LedgerError>> {
        // Every host's: the rows claimed and not yet written to (`recorded = false`). Read from
        // the table itself, not the index of open work: `scan_open_runs`, the oracle the index is
        // held to, reads them here. (`open_runs` reads them through the index.)
        // One statement each way: the sessions plan generically, and a generic plan of `$1 IS NULL
        // OR run_id = $1` could not use the run's index.
        Box::pin(async move {
            match run_id {
                None => {
                    let sql = "SELECT record FROM oncebox_operations WHERE NOT recorded ORDER BY key";
                    self.records("oncebox_operations", sql, &[]).await
                }
                Some(run) => {
                    let sql = "SELECT record FROM oncebox_operations WHERE NOT recorded AND run_id = $1 ORDER BY key";
                    self.records("oncebox_operations", sql, &[&run]).await
                }
            }
        })
    }

    fn effect<'a>(
        &'a self,
        operation_key: &'a str,
        effect_key: &'a str,
    ) -> BoxFuture<'a, Result<Option<EffectRecord>, LedgerError>> {
        Box::pin(async move {
            let sql = "SELECT record FROM oncebox_effects WHERE operation_key = $1 AND effect_key = $2";
            self.one("oncebox_effects", sql, &[&operation_key, &effect_key]).await
        })
    }

    fn effects<'a>(&'a self, operation_key: &'a str) -> BoxFuture<'a, Result<Vec<EffectRecord>, LedgerError>> {
        Box::pin(async move { self.records("oncebox_effects", jobs::EFFECTS_OF, &[&operation_key]).await })
    }

    fn attempts<'a>(&'a self, operation_key: &'a str) -> BoxFuture<'a, Result<Vec<AttemptRecord>, LedgerError>> {
        Box::pin(async move {
            let sql = "SELECT record FROM oncebox_attempts WHERE operation_key = $1 ORDER BY number";
            self.records("oncebox_attempts", sql, &[&operation_key]).await
        })
    }

    fn kv_entry<'a>(&'a self, namespace: &'a str, key: &'a str) -> BoxFuture<'a, Result<Option<KvEntry>, LedgerError>> {
        Box::pin(async move {
            let sql = "SELECT value, version FROM oncebox_kv WHERE namespace = $1 AND key = $2";
            let rows = self.read(sql, &[&namespace, &key]).await?;
            let Some(row) = rows.first() else { return Ok(None) };
            let value: Vec<u8> = column(row, 0, "oncebox_kv")?;
            let version: i64 = column(row, 1, "oncebox_kv")?;
            Ok(Some((value, uint(version))))
        })
    }

    fn outbox(&self) -> BoxFuture<'_, Result<Vec<OutboxMessage>, LedgerError>> {
        Box::pin(
            async move { self.records("oncebox_outbox", "SELECT record FROM oncebox_outbox ORDER BY seq", &[]).await },
        )
    }

    fn approval<'a>(&'a self, operation_key: &'a str) -> BoxFuture<'a, Result<Option<ApprovalRecord>, LedgerError>> {
        Box::pin(async move {
            let sql = "SELECT record FROM oncebox_approvals WHERE operation_key = $1";
            self.one("oncebox_approvals", sql, &[&operation_key]).await
        })
    }

    fn approvals<'a>(&'a self, run_id: Option<&'a str>) -> BoxFuture<'a, Result<Vec<ApprovalRecord>, LedgerError>> {
        // One statement each way, as in `in_flight`.
        Box::pin(async move {
            match run_id {
                None => {
                    let sql = "SELECT record FROM oncebox_approvals ORDER BY operation_key";
                    self.records("oncebox_approvals", sql, &[]).await
                }
                Some(run) => {
                    let sql = "SELECT record FROM oncebox_approvals WHERE run_id = $1 ORDER BY operation_key";
                    self.records("oncebox_approvals", sql, &[&run]).await
                }
            }
        })
    }

    fn put_approval<'a>(&'a self, record: &'a ApprovalRecord) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(async move { transaction!(self, |tx| jobs::put_approval(&tx, record)) })
    }

    fn tombstone<'a>(&'a self, operation_key: &'a str) -> BoxFuture<'a, Result<Option<Tombstone>, LedgerError>> {
        Box::pin(async move {
            let sql = "SELECT record FROM oncebox_tombstones WHERE operation_key = $1";
            self.one("oncebox_tombstones", sql, &[&operation_key]).await
        })
    }

    fn tombstones<'a>(&'a self, run_id: &'a str) -> BoxFuture<'a, Result<Vec<Tombstone>, LedgerError>> {
        Box::pin(async move {
            // `oncebox_tombstones_run` answers it (`schema::RECORD_INDEXES`), in its collation.
            let sql = "SELECT record FROM oncebox_tombstones WHERE oncebox_tombstone_run(record) COLLATE \"C\" = $1 \
                       ORDER BY operation_key";
            self.records("oncebox_tombstones", sql, &[&run_id]).await
        })
    }

    fn expire<'a>(
        &'a self,
        tombstones: &'a [Tombstone],
        approvals: &'a [StaleApproval],
    ) -> BoxFuture<'a, Result<Removed, LedgerError>> {
        Box::pin(async move { transaction!(self, |tx| jobs::expire(&tx, tombstones, approvals)) })
    }

    fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    fn runs_page<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<String>, LedgerError>> {
        Box::pin(open::runs_page(self, after, limit))
    }

    fn open_runs<'a>(&'a self, run: Option<&'a str>, now_ms: u64) -> BoxFuture<'a, super::OpenRuns> {
        Box::pin(open::open_runs(self, run, now_ms))
    }

    fn ended_before<'a>(&'a self, cutoff_ms: u64) -> BoxFuture<'a, Result<Vec<OperationRecord>, LedgerError>> {
        Box::pin(open::ended_before(self, cutoff_ms))
    }

    fn approvals_before<'a>(&'a self, cutoff_ms: u64) -> BoxFuture<'a, Result<Vec<ApprovalRecord>, LedgerError>> {
        Box::pin(open::approvals_before(self, cutoff_ms))
    }

    fn delivered_before<'a>(&'a self, cutoff_ms: u64) -> BoxFuture<'a, Result<Vec<OutboxMessage>, LedgerError>> {
        Box::pin(open::delivered_before(self, cutoff_ms))
    }

    fn prune_outbox<'a>(&'a self, seqs: &'a [u64]) -> BoxFuture<'a, Result<crate::Pruned, LedgerError>> {
        Box::pin(async move { transaction!(self, |tx| jobs::prune_outbox(&tx, seqs)) })
    }

    fn is_shared(&self) -> bool {
        true
    }

    fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    fn bind_key<'a>(&'a self, ids: &'a [String]) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(async move { transaction!(self, |tx| jobs::bind_key(&tx, ids)) })
    }

    fn changed<'a>(&'a self, key: &'a str, timeout: Duration) -> BoxFuture<'a, ()> {
        Box::pin(self.listener.wait(key, timeout))
    }

    fn outbox_pending<'a>(
        &'a self,
        topic: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<OutboxMessage>, LedgerError>> {
        Box::pin(async move {
            let sql = "SELECT record FROM oncebox_outbox WHERE topic = $1 AND NOT delivered ORDER BY seq LIMIT $2";
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            self.records("oncebox_outbox", sql, &[&topic, &limit]).await
        })
    }

    fn record_delivery<'a>(
        &'a self,
        seq: u64,
        answer: &'a DeliveryAnswer,
    ) -> BoxFuture<'a, Result<OutboxMessage, LedgerError>> {
        Box::pin(async move { transaction!(self, |tx| jobs::record_delivery(&tx, seq, answer)) })
    }

    fn enqueue_once<'a>(
        &'a self,
        topic: &'a str,
        key: &'a str,
        payload: &'a str,
    ) -> BoxFuture<'a, Result<bool, LedgerError>> {
        Box::pin(async move {
            let now = self.now_ms();
            transaction!(self, |tx| jobs::enqueue_once(&tx, topic, key, payload, now))
        })
    }

    fn note_reconcile<'a>(&'a self, key: &'a str, note: &'a ReconcileNote) -> BoxFuture<'a, Result<bool, LedgerError>> {
        Box::pin(async move { transaction!(self, |tx| jobs::note_reconcile(&tx, key, note)) })
    }

    fn lease<'a>(&'a self, name: &'a str, owner: &'a str, lease_ms: u64) -> BoxFuture<'a, Result<bool, LedgerError>> {
        Box::pin(async move { transaction!(self, |tx| jobs::lease(&tx, name, owner, lease_ms)) })
    }

    fn release<'a>(&'a self, name: &'a str, owner: &'a str) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(async move { transaction!(self, |tx| jobs::release(&tx, name, owner)) })
    }
}
