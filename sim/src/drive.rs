//! One seed, run: the host's lives (each crashed where the plan says, the ledger reopened for the
//! next), the callers working through their jobs as orchestrators would (a step called again until
//! it has an answer; a run compensated when a step fails), the operator beside them, then a last
//! pass in which the operator settles what is left, and the facts the checker reads.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::Notify;

use oncebox_runtime::hooks::{Exchange, HookFuture, Hooks, Outgoing, Point, Site};
use oncebox_runtime::ledger::{ApprovalState, OperationRecord, OperationStatus, Resolution};
use oncebox_runtime::policy_file::PolicyFile;
use oncebox_runtime::{
    Call, Decision, Grant, Host, HostBuilder, HttpTarget, Ledger, Relay, ReplayClass, RetryPolicy, Status,
};

use crate::check::Facts;
use crate::history::{Event, History};
use crate::paced::Paced;
use crate::plan::{Crash, Job, Plan, charge_args, fulfill_args, notify_args, percent};
use crate::world::{ORIGIN, World};

/// Which ledger the host runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LedgerKind {
    /// A redb file, on the simulated clock.
    Redb,
    /// A database of the throwaway PostgreSQL cluster, on the database's (real) clock.
    Postgres,
}

/// The caller that, in the last pass, calls again the steps callers left.
const LAST_PASS_CALLER: usize = 99;
/// How many times a caller asks for one step before it leaves it to the operator.
const MAX_ASKS: u32 = 60;
/// How long the last pass may take before what is open is reported: on the simulated clock (redb),
/// and on the database's real one (PostgreSQL).
const LAST_PASS: Duration = Duration::from_secs(3_600);
const LAST_PASS_REAL: Duration = Duration::from_secs(60);
/// The retention `gc` runs with: longer than a seed's lives, shorter than its last pass.
const GC_RETENTION: Duration = Duration::from_secs(600);
/// How long after its write-ahead a request may still leave (the host's send deadline): short, so
/// that an empty lookup can count as proof within a seed's lives.
const SEND_BY: Duration = Duration::from_secs(1);

/// What one seed's run hands the checker.
pub struct Ran {
    pub facts: Facts,
    pub history: History,
    pub operations: u64,
    pub faults: u64,
}

/// The state callers and the operator share, which outlives each life of the host (the
/// orchestrators' own durable state).
#[derive(Default)]
struct Shared {
    /// Per caller: the index (in its job list) of the first job not finished.
    next_job: Vec<usize>,
    /// Runs someone decided to compensate, until compensation is done.
    to_compensate: BTreeSet<String>,
    /// Runs whose compensation reported done: their orchestrators call none of their steps again.
    undone: BTreeSet<String>,
    /// Per operation: reconciles the operator made, and when the first was.
    reconciles: BTreeMap<String, (u32, u64)>,
    /// When the operator last reconciled (ledger ms).
    reconciled_ms: u64,
    /// Rejections a second person makes the moment the approved call is about to send (by
    /// operation key).
    armed: BTreeMap<String, oncebox_runtime::ledger::ApprovalRecord>,
    calls: u64,
}

/// The world, the plan, the history and where the ledger lives: what every life shares.
#[derive(Clone)]
struct Ctx {
    plan: Arc<Plan>,
    world: World,
    history: History,
    shared: Arc<Mutex<Shared>>,
    ledger: LedgerAt,
    cache: PathBuf,
    key_file: PathBuf,
    /// The seed's directory, as messages that name the ledger's path spell it.
    dir: String,
}

#[derive(Clone)]
enum LedgerAt {
    File(PathBuf),
    Database(String),
}

impl Ctx {
    fn shared(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Runs `plan` against a fresh ledger in `dir`.
pub async fn run(
    plan: Plan,
    kind: LedgerKind,
    dir: &std::path::Path,
    cache: PathBuf,
    start_ms: u64,
) -> anyhow::Result<Ran> {
    let history = History::new(start_ms);
    let world = World::new(plan.seed, plan.downstream.clone(), history.clone());
    let ledger = match kind {
        LedgerKind::Redb => LedgerAt::File(dir.join("ledger.redb")),
        LedgerKind::Postgres => LedgerAt::Database(oncebox_pg_cluster::fresh_database().await),
    };
    let shared = Shared { next_job: vec![0; plan.callers], ..Shared::default() };
    // The fingerprint key, from the seed: fingerprints (and the messages that name them) are the
    // same on every run of the seed.
    let key_file = match &ledger {
        LedgerAt::File(path) => oncebox_runtime::secret::beside(path),
        LedgerAt::Database(_) => dir.join("hosts.key"),
    };
    let secret: [u8; 32] = Sha256::digest(format!("oncebox-sim key {}", plan.seed)).into();
    let key = oncebox_runtime::keys::FingerprintKey::new(vec![secret]).context("a fingerprint key")?;
    std::fs::write(&key_file, key.to_text()).context("write the fingerprint key")?;
    let ctx = Ctx {
        plan: Arc::new(plan),
        world,
        history,
        shared: Arc::new(Mutex::new(shared)),
        ledger,
        cache,
        key_file,
        dir: dir.display().to_string(),
    };
    let mut life = 0usize;
    let host = loop {
        let crash = ctx.plan.crashes.get(life).copied();
        let (racer, rejections) = tokio::sync::mpsc::unbounded_channel();
        let hooks = Arc::new(LifeHooks::new(&ctx, crash, racer));
        let host = build(&ctx, hooks.clone()).await?;
        let mut callers = tokio::task::JoinSet::new();
        for c in 0..ctx.plan.callers {
            callers.spawn(caller(ctx.clone(), host.clone(), c));
        }
        let operator = tokio::spawn(operator(ctx.clone(), host.clone()));
        let second_person = tokio::spawn(second_person(ctx.clone(), host.clone(), rejections));
        let timer = async {
            match crash {
                Some(Crash::AtTime { after_ms }) => tokio::time::sleep(Duration::from_millis(after_ms)).await,
                _ => std::future::pending().await,
            }
        };
        let done = async {
            while let Some(joined) = callers.join_next().await {
                joined?;
            }
            Ok::<(), tokio::task::JoinError>(())
        };
        let crashed = tokio::select! {
            joined = done => {
                joined.context("a caller of the simulation panicked")?;
                None
            }
            () = hooks.crashed.notified() => Some("at a crash point".to_string()),
            () = timer => Some("at a moment of the plan".to_string()),
        };
        // The process dies (or the orchestrators are done): no task of this life goes on.
        callers.abort_all();
        operator.abort();
        second_person.abort();
        let _ = second_person.await;
        while let Some(joined) = callers.join_next().await {
            if let Err(e) = joined
                && e.is_panic()
            {
                anyhow::bail!("a caller of the simulation panicked: {e}");
            }
        }
        if let Err(e) = operator.await
            && e.is_panic()
        {
            anyhow::bail!("the simulated operator panicked: {e}");
        }
        match crashed {
            None => break host,
            Some(how) => {
                let how = match hooks.site() {
                    Some(site) => format!("{how}: {site}"),
                    None => how,
                };
                ctx.history.push(Event::Crashed { how });
                drop(host);
                life += 1;
                ctx.history.next_life();
                ctx.history.push(Event::Restarted);
            }
        }
    };
    last_pass(&ctx, &host).await?;
    let compensating = ctx.shared().to_compensate.clone();
    let facts = Facts::gather(&ctx.plan, &ctx.world, &ctx.history, &host, compensating).await?;
    let shared = ctx.shared();
    let faults = ctx.world.faults() + life as u64;
    Ok(Ran { facts, history: ctx.history.clone(), operations: shared.calls, faults })
}

/// A host on the ledger, with every tool of the order workflow loaded, and `hooks` as its network.
async fn build(ctx: &Ctx, hooks: Arc<LifeHooks>) -> anyhow::Result<Host> {
    let mut tries = 0;
    let host = loop {
        let builder = match &ctx.ledger {
            LedgerAt::File(path) => match oncebox_runtime::ledger::redb::RedbStore::open(path) {
                Ok(store) => HostBuilder::on_ledger(Ledger::on(Paced { inner: store, free: ctx.plan.free })),
                Err(_) if tries < 200 => {
                    // A redb file stays locked until the last handle of the dead host is gone
                    // (a task of the dead host still finishing, such as a second person's
                    // rejection on its way): simulated time passes, and they end.
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                Err(e) => return Err(e).context("reopen the ledger after a crash"),
            },
            LedgerAt::Database(url) => {
                let ledger = Ledger::connect(url).await.context("connect to the simulation's database")?;
                HostBuilder::on_ledger(ledger).key_file(&ctx.key_file)
            }
        };
        break configure(builder, hooks.clone(), ctx)?.build().await.context("start the host")?;
    };
    for path in oncebox_artifacts::EXAMPLE_TOOLS {
        host.load(path).await.with_context(|| format!("load {path}"))?;
    }
    Ok(host)
}

fn configure(mut builder: HostBuilder, hooks: Arc<LifeHooks>, ctx: &Ctx) -> anyhow::Result<HostBuilder> {
    let origin: oncebox_runtime::capabilities::HttpGrant =
        ORIGIN.parse().map_err(|e: String| anyhow::anyhow!("the downstream's origin: {e}"))?;
    for tool in ["stock", "charge", "refund", "fulfill"] {
        builder = builder.tool_config(tool, "base_url", ORIGIN).grant(tool, Grant::Http(origin.clone()));
    }
    for tool in ["reserve", "release"] {
        builder = builder.grant(tool, Grant::Kv("reservations".into()));
    }
    builder = builder.grant("notify", Grant::Outbox("email".into()));
    for (tool, class) in [
        ("stock", ReplayClass::ReadOnly),
        ("reserve", ReplayClass::Compensatable),
        ("release", ReplayClass::IdempotentWrite),
        ("charge", ReplayClass::Compensatable),
        ("refund", ReplayClass::IdempotentWrite),
        ("fulfill", ReplayClass::Irreversible),
        ("notify", ReplayClass::IdempotentWrite),
    ] {
        let policy = RetryPolicy {
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(200),
            ..RetryPolicy::for_class(class)
        };
        builder = builder.retry_policy(tool, policy);
    }
    // The outbox topic's endpoint, in the downstream (through the hooks), as an operator
    // configures it.
    let policy = format!(
        "[outbox.email]\nendpoint = \"{ORIGIN}/email\"\nhonours_keys = {}\ntimeout = \"{}ms\"\n\
         initial_backoff = \"10ms\"\nmax_backoff = \"200ms\"\nattempts_per_pass = 3\n",
        ctx.plan.downstream.honours_keys, ctx.plan.downstream.timeout_ms
    );
    let policy =
        PolicyFile::parse(&policy, std::path::Path::new("sim.toml")).context("the simulation's policy file")?;
    Ok(builder.policy_file(policy).hooks(hooks).send_deadline(SEND_BY).compile_cache(ctx.cache.clone()))
}

/// The hooks of one life: the world as the network, and the plan's crash.
struct LifeHooks {
    world: World,
    shared: Arc<Mutex<Shared>>,
    /// Where an armed rejection goes when its call reaches the point before its write-ahead.
    racer: tokio::sync::mpsc::UnboundedSender<oncebox_runtime::ledger::ApprovalRecord>,
    crash: Option<Crash>,
    visits: AtomicU32,
    fired: AtomicBool,
    site: Mutex<Option<String>>,
    crashed: Notify,
}

impl LifeHooks {
    fn new(
        ctx: &Ctx,
        crash: Option<Crash>,
        racer: tokio::sync::mpsc::UnboundedSender<oncebox_runtime::ledger::ApprovalRecord>,
    ) -> LifeHooks {
        LifeHooks {
            world: ctx.world.clone(),
            shared: ctx.shared.clone(),
            racer,
            crash,
            visits: AtomicU32::new(0),
            fired: AtomicBool::new(false),
            site: Mutex::new(None),
            crashed: Notify::new(),
        }
    }

    fn site(&self) -> Option<String> {
        self.site.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Hooks for LifeHooks {
    fn at(&self, site: Site) -> HookFuture<'_, ()> {
        Box::pin(async move {
            if site.point == Point::BeforeWriteAhead {
                let armed = self.shared.lock().unwrap_or_else(|p| p.into_inner()).armed.remove(&site.operation_key);
                if let Some(record) = armed {
                    let _ = self.racer.send(record);
                }
            }
            // An await point, as a write to disk is in a host: whatever is ready runs here (the
            // racing rejection among them).
            for _ in 0..3 {
                tokio::task::yield_now().await;
            }
            let visit = self.visits.fetch_add(1, Ordering::SeqCst) + 1;
            let due = matches!(self.crash, Some(Crash::AtPoint { visit: at }) if at == visit);
            if !due || self.fired.swap(true, Ordering::SeqCst) {
                return;
            }
            let what = if site.label.is_empty() { format!("attempt {}", site.occurrence) } else { site.label.clone() };
            *self.site.lock().unwrap_or_else(|p| p.into_inner()) = Some(format!("{} of {what}", site.point.name()));
            self.crashed.notify_one();
            std::future::pending::<()>().await;
        })
    }

    fn http(&self, site: Site, request: Outgoing) -> HookFuture<'_, Exchange> {
        Box::pin(self.world.effect(site.key, request))
    }

    fn read(&self, request: Outgoing) -> HookFuture<'_, Exchange> {
        Box::pin(async move { self.world.read(&request) })
    }

    fn target(&self) -> HttpTarget {
        self.world.target()
    }

    fn deliver(&self, key: String, request: Outgoing) -> HookFuture<'_, Exchange> {
        Box::pin(self.world.deliver(key, request))
    }
}

/// One caller: its jobs, from the first it has not finished (after a crash it starts that one
/// again: its steps that completed are answered from the ledger).
async fn caller(ctx: Ctx, host: Host, c: usize) {
    let jobs: Vec<Job> = ctx.plan.jobs.iter().filter(|j| j.callers().contains(&c)).cloned().collect();
    let first = ctx.shared().next_job[c];
    for job in jobs.into_iter().skip(first) {
        match &job {
            Job::Order { .. } => order(&ctx, &host, c, &job).await,
            Job::Call { run, step, tool, args, repeats, conflicting, .. } => {
                for n in 0..*repeats {
                    let args = if *conflicting && n + 1 == *repeats { conflict(args) } else { args.clone() };
                    ask(&ctx, &host, c, Call::step(run, step, tool, args.to_string())).await;
                }
            }
        }
        ctx.shared().next_job[c] += 1;
    }
}

/// The order workflow, as an orchestrator runs it.
async fn order(ctx: &Ctx, host: &Host, c: usize, job: &Job) {
    let Job::Order { run, order, sku, quantity, amount_cents, cancel, .. } = job else {
        return;
    };
    let steps: Vec<(&str, &str, Value)> = vec![
        ("1-stock", "stock", json!({"sku": sku})),
        ("2-reserve", "reserve", json!({"order_id": order, "sku": sku, "quantity": quantity})),
        ("3-charge", "charge", charge_args(order, *amount_cents)),
        ("4-fulfill", "fulfill", fulfill_args(order, sku, *quantity)),
        ("5-notify", "notify", notify_args(order)),
    ];
    for (step, tool, args) in steps {
        // Once someone asked to undo the run, its orchestrators start none of its steps.
        if ctx.shared().to_compensate.contains(run) || ctx.shared().undone.contains(run) {
            return;
        }
        if *cancel && tool == "fulfill" {
            compensate(ctx, host, run, &format!("caller {c}")).await;
            return;
        }
        let status = ask(ctx, host, c, Call::step(run, step, tool, args.to_string())).await;
        match status {
            Some(Status::Completed) => {}
            // Nothing to undo before the first write.
            _ if tool == "stock" => return,
            _ => {
                compensate(ctx, host, run, &format!("caller {c}")).await;
                return;
            }
        }
    }
}

/// Calls a step until it has an answer a caller can act on: completed, failed, rejected, a
/// conflict, expired; or leaves it (unknown, awaiting, in progress) after [`MAX_ASKS`].
async fn ask(ctx: &Ctx, host: &Host, c: usize, call: Call) -> Option<Status> {
    let order = serde_json::from_str::<Value>(&call.args)
        .ok()
        .and_then(|a| a.get("order_id").and_then(Value::as_str).map(str::to_string));
    let (run, step) = (call.run_id.clone().unwrap_or_default(), call.step_id.clone().unwrap_or_default());
    let mut last = None;
    for _ in 0..MAX_ASKS {
        let undoing = {
            let shared = ctx.shared();
            shared.to_compensate.contains(&run) || shared.undone.contains(&run)
        };
        if undoing && c != LAST_PASS_CALLER {
            return last;
        }
        ctx.shared().calls += 1;
        let answered = host.call(call.clone()).await;
        let wait = match answered {
            Ok(outcome) => {
                ctx.history.push(Event::Called {
                    caller: format!("caller {c}"),
                    run: run.clone(),
                    step: step.clone(),
                    tool: call.tool.clone(),
                    order: order.clone(),
                    status: outcome.status,
                    replayed: outcome.replayed,
                    operation_key: outcome.operation_key.clone(),
                    output: outcome.output.clone(),
                    error: outcome.error.as_ref().map(|e| same_everywhere(ctx, &e.message)),
                });
                last = Some(outcome.status);
                match outcome.status {
                    Status::AwaitingApproval | Status::InProgress => {
                        Duration::from_millis(ctx.plan.operator.every_ms * 2)
                    }
                    Status::Unknown => Duration::from_millis(ctx.plan.downstream.settle_window_ms / 2),
                    _ => return last,
                }
            }
            Err(e) => {
                ctx.history.push(Event::CallError {
                    caller: format!("caller {c}"),
                    run: run.clone(),
                    step: step.clone(),
                    tool: call.tool.clone(),
                    error: same_everywhere(ctx, &e.to_string()),
                });
                Duration::from_millis(100)
            }
        };
        tokio::time::sleep(wait).await;
    }
    last
}

/// The same step with other args: a caller that re-plans under an old step id.
fn conflict(args: &Value) -> Value {
    let mut other = args.clone();
    if let Some(fields) = other.as_object_mut() {
        for (name, value) in fields.iter_mut() {
            match name.as_str() {
                "amount_cents" | "quantity" => *value = json!(value.as_u64().unwrap_or(0) + 1),
                "template" => *value = json!("cancelled"),
                "sku" => *value = json!(format!("{}-other", value.as_str().unwrap_or_default())),
                "address" => *value = json!("elsewhere"),
                _ => {}
            }
        }
    }
    other
}

async fn compensate(ctx: &Ctx, host: &Host, run: &str, by: &str) {
    ctx.shared().to_compensate.insert(run.to_string());
    let result = match host.compensate(run).await {
        Ok(report) => {
            // Done, or waiting for a person to undo a step by hand (which nobody here does).
            let by_hand = report.steps.iter().any(|s| s.action == "undo-by-hand");
            if report.state == oncebox_runtime::saga::SagaState::Done || by_hand {
                let mut shared = ctx.shared();
                shared.to_compensate.remove(run);
                shared.undone.insert(run.to_string());
            }
            let steps: Vec<String> = report.steps.iter().map(|s| format!("{} {}", s.step_id, s.action)).collect();
            format!("{:?} [{}]", report.state, steps.join(", "))
        }
        Err(e) => format!("error: {e}"),
    };
    ctx.history.push(Event::Compensated { run: run.to_string(), by: by.to_string(), result });
}

/// The operator, while the callers work: looks every `every_ms`.
async fn operator(ctx: Ctx, host: Host) {
    let mut looked = 0u64;
    let mut reloads = ctx.plan.operator.reloads.clone();
    let mut gcs = ctx.plan.operator.gcs.clone();
    let relay = host.outbox_relay();
    loop {
        tokio::time::sleep(Duration::from_millis(ctx.plan.operator.every_ms)).await;
        looked += 1;
        let into_life = looked * ctx.plan.operator.every_ms;
        look(&ctx, &host, false).await;
        relay_pass(&ctx, relay.as_ref().ok()).await;
        for (at, tool) in std::mem::take(&mut reloads) {
            if at > into_life {
                reloads.push((at, tool));
                continue;
            }
            let path = oncebox_artifacts::EXAMPLE_TOOLS.iter().find(|p| p.ends_with(&format!("{tool}.wasm")));
            let result = match path {
                Some(path) => host.reload(path).await.map_or_else(|e| format!("error: {e}"), |_| "reloaded".into()),
                None => "no such tool".into(),
            };
            ctx.history.push(Event::Reloaded { tool, result });
        }
        if gcs.iter().any(|at| *at <= into_life) {
            gcs.retain(|at| *at > into_life);
            let result = host.gc(GC_RETENTION).await.map_or_else(|e| format!("error: {e}"), |r| format!("{r:?}"));
            ctx.history.push(Event::Collected { result });
        }
        // A person undoing an order midway, racing its steps.
        for job in &ctx.plan.jobs {
            if let Job::Order { run, .. } = job
                && percent(ctx.plan.seed, &["midway", run, &looked.to_string()]) < ctx.plan.operator.compensate_pct
            {
                compensate(&ctx, &host, run, "operator").await;
            }
        }
    }
}

/// One look of the operator: decides requests for approval, reconciles what is unknown, settles
/// by hand what stays unknown, and (`last`) compensates the runs waiting for it.
async fn look(ctx: &Ctx, host: &Host, last: bool) {
    let ledger = host.ledger().clone();
    if let Ok(approvals) = ledger.approvals(None).await {
        for record in approvals.into_iter().filter(|a| a.state == ApprovalState::Pending) {
            decide(ctx, host, &record, last).await;
        }
    }
    let Ok(operations) = ledger.operations(None).await else {
        return;
    };
    let now = ledger.now_ms();
    let due = {
        let mut shared = ctx.shared();
        let due = last || now >= shared.reconciled_ms.saturating_add(ctx.plan.operator.reconcile_every_ms);
        if due {
            shared.reconciled_ms = now;
        }
        due
    };
    for op in operations.iter().filter(|op| due && op.status == OperationStatus::Unknown) {
        reconcile(ctx, host, op).await;
    }
    if last {
        let runs: Vec<String> = ctx.shared().to_compensate.iter().cloned().collect();
        for run in runs {
            compensate(ctx, host, &run, "operator").await;
        }
    }
}

/// Decides one request for approval of the params the operator sees, now and then with a second
/// person's rejection racing the approval's use.
async fn decide(ctx: &Ctx, host: &Host, record: &oncebox_runtime::ledger::ApprovalRecord, last: bool) {
    let seed = ctx.plan.seed;
    // Once the callers are done, a run being undone gets no new shipment.
    let ending = last && ctx.shared().to_compensate.contains(&record.run_id);
    let approve =
        !ending && percent(seed, &["reject", &record.run_id, &record.step_id]) >= ctx.plan.operator.reject_pct;
    let params = host.reveal(record).unwrap_or(Value::Null);
    let decision = if approve { Decision::Approve { expires_ms: None } } else { Decision::Reject };
    let key = record.operation_key.clone();
    let decided =
        host.decide_on(&key, &record.fingerprint, record.component.as_deref(), decision, "sim-operator", None).await;
    ctx.history.push(Event::Decided {
        run: record.run_id.clone(),
        step: record.step_id.clone(),
        approve,
        params: params.clone(),
        component: record.component.clone(),
        result: decided.as_ref().map_or_else(|e| format!("refused: {e}"), |r| r.state.as_str().to_string()),
    });
    if approve && percent(seed, &["race", &record.run_id, &record.step_id]) < ctx.plan.operator.racing_reject_pct {
        if percent(seed, &["race-when", &record.run_id, &record.step_id]) < 50 {
            // The second person rejects the moment the approved call is about to send.
            ctx.shared().armed.insert(record.operation_key.clone(), record.clone());
            return;
        }
        // The second person acts a few ms after the approval, before or while the caller uses it.
        let (ctx, host, record) = (ctx.clone(), host.clone(), record.clone());
        tokio::spawn(async move {
            let delay = percent(ctx.plan.seed, &["race-at", &record.run_id]) % 7;
            tokio::time::sleep(Duration::from_millis(delay)).await;
            let rejected = host
                .decide_on(
                    &record.operation_key,
                    &record.fingerprint,
                    record.component.as_deref(),
                    Decision::Reject,
                    "second-person",
                    None,
                )
                .await;
            ctx.history.push(Event::Decided {
                run: record.run_id.clone(),
                step: record.step_id.clone(),
                approve: false,
                params,
                component: record.component.clone(),
                result: rejected.as_ref().map_or_else(|e| format!("refused: {e}"), |r| r.state.as_str().to_string()),
            });
        });
    }
}

/// The second person: rejects each armed request the moment its call reaches the point before its
/// write-ahead (the hooks send it here, then yield so that this runs first).
async fn second_person(
    ctx: Ctx,
    host: Host,
    mut rejections: tokio::sync::mpsc::UnboundedReceiver<oncebox_runtime::ledger::ApprovalRecord>,
) {
    while let Some(record) = rejections.recv().await {
        let rejected = host
            .decide_on(
                &record.operation_key,
                &record.fingerprint,
                record.component.as_deref(),
                Decision::Reject,
                "second-person",
                None,
            )
            .await;
        ctx.history.push(Event::Decided {
            run: record.run_id.clone(),
            step: record.step_id.clone(),
            approve: false,
            params: host.reveal(&record).unwrap_or(Value::Null),
            component: record.component.clone(),
            result: rejected.as_ref().map_or_else(|e| format!("refused: {e}"), |r| r.state.as_str().to_string()),
        });
    }
}

/// The route of a tool's effect, where the downstream keeps the truth of it.
pub fn route_of(tool: &str) -> Option<&'static str> {
    match tool {
        "charge" => Some("payments"),
        "refund" => Some("refunds"),
        "fulfill" => Some("fulfillments"),
        _ => None,
    }
}

/// Reconciles an unknown operation; after a few tries that settle nothing, settles it by hand
/// from the downstream's own record (a person reading the provider's dashboard), once nothing of
/// it is still on its way.
async fn reconcile(ctx: &Ctx, host: &Host, op: &OperationRecord) {
    let answer = match host.reconcile_operation(&op.key).await {
        Ok(Some(answer)) => match answer.answer {
            oncebox_runtime::Reconciliation::Committed { outcome } => format!("committed: {}", outcome.status.as_str()),
            oncebox_runtime::Reconciliation::NotCommitted { .. } => "not-committed".into(),
            oncebox_runtime::Reconciliation::StillUnknown { reason, .. } => format!("still unknown: {reason}"),
            other => format!("{other:?}"),
        },
        Ok(None) => "no such operation".into(),
        Err(e) => format!("error: {e}"),
    };
    ctx.history.push(Event::Reconciled { run: op.run_id.clone(), operation_key: op.key.clone(), answer });
    let now = host.ledger().now_ms();
    let (tries, since) = {
        let mut shared = ctx.shared();
        let tries = shared.reconciles.entry(op.key.clone()).or_insert((0, now));
        tries.0 += 1;
        (tries.0, now.saturating_sub(tries.1))
    };
    let Some(route) = route_of(&op.tool) else {
        return;
    };
    let order = op.args.get("order_id").and_then(Value::as_str).unwrap_or_default();
    // A person settles by hand only what reconciling could not, given time to (past the point an
    // empty lookup counts as proof: the send deadline, the timeout and the settle window, twice
    // over), and once nothing of it is still on its way.
    let provable =
        oncebox_runtime::clock::millis(SEND_BY) + ctx.plan.downstream.timeout_ms + ctx.plan.downstream.settle_window_ms;
    if tries < 6 || since < 2 * provable || ctx.world.pending(route, order) {
        return;
    }
    let Ok(Some(now)) = host.ledger().operation(&op.key).await else {
        return;
    };
    if now.status != OperationStatus::Unknown {
        return;
    }
    let committed = ctx.world.commits().into_iter().find(|c| c.route == route && c.order == order);
    let resolution = match &committed {
        Some(commit) => Resolution::Committed { output: commit.response.to_string() },
        None => Resolution::NotCommitted,
    };
    let result = host
        .resolve(&op.key, None, &resolution, "sim-operator", Some("read the provider's own record"))
        .await
        .map_or_else(|e| format!("refused: {e}"), |o| o.status.as_str().to_string());
    ctx.history.push(Event::Settled {
        run: op.run_id.clone(),
        operation_key: op.key.clone(),
        committed: committed.is_some(),
        result,
    });
}

/// One pass of the outbox relay; whether every message is delivered.
async fn relay_pass(ctx: &Ctx, relay: Option<&Relay>) -> bool {
    let Some(relay) = relay else {
        ctx.history.push(Event::Relayed { result: "no relay".into() });
        return false;
    };
    match relay.deliver_pending().await {
        Ok(summary) => {
            let sends: u64 = summary.topics.iter().map(|t| t.sends).sum();
            if sends > 0 {
                let result = format!("{} delivered in {sends} sends", summary.delivered());
                ctx.history.push(Event::Relayed { result });
            }
            summary.all_delivered()
        }
        Err(e) => {
            ctx.history.push(Event::Relayed { result: format!("error: {e}") });
            false
        }
    }
}

/// After the callers are done: the operator settles and compensates until no run is open (or
/// [`LAST_PASS`] is over), and what is still on its way at the downstream lands.
async fn last_pass(ctx: &Ctx, host: &Host) -> anyhow::Result<()> {
    let step = Duration::from_millis(ctx.plan.downstream.settle_window_ms.max(ctx.plan.operator.every_ms));
    let budget = match ctx.ledger {
        LedgerAt::File(_) => LAST_PASS,
        LedgerAt::Database(_) => LAST_PASS_REAL,
    };
    let rounds = (budget.as_millis() / step.as_millis().max(1)) as u32;
    let relay = host.outbox_relay();
    for _ in 0..rounds.max(1) {
        look(ctx, host, true).await;
        let delivered = relay_pass(ctx, relay.as_ref().ok()).await;
        // Steps a caller left (unknown, awaiting): called again, as the orchestrator would.
        let open = host.ledger().open_runs(None, host.ledger().now_ms()).await?;
        if open.is_empty() && delivered && !ctx.world.any_pending() && ctx.shared().to_compensate.is_empty() {
            return Ok(());
        }
        for (run, steps) in &open {
            let undoing = {
                let shared = ctx.shared();
                shared.to_compensate.contains(run) || shared.undone.contains(run)
            };
            if undoing {
                continue;
            }
            for open in steps {
                if let Some(op) = host.ledger().operation(&open.operation_key).await?
                    && matches!(op.status, OperationStatus::Claimed)
                {
                    let call =
                        Call::step(run, &op.step_id, &op.tool, args_of(ctx, run, &op.step_id).unwrap_or_default());
                    if !call.args.is_empty() {
                        ask(ctx, host, LAST_PASS_CALLER, call).await;
                    }
                }
            }
        }
        tokio::time::sleep(step).await;
    }
    Ok(())
}

/// The args a run's step was called with, from the plan (the ledger keeps them redacted).
fn args_of(ctx: &Ctx, run_id: &str, step_id: &str) -> Option<String> {
    ctx.plan.jobs.iter().find_map(|job| match job {
        Job::Call { run, step, args, .. } if run == run_id && step == step_id => Some(args.to_string()),
        Job::Order { run, order, sku, quantity, amount_cents, .. } if run == run_id => {
            let args = match step_id {
                "1-stock" => json!({"sku": sku}),
                "2-reserve" => json!({"order_id": order, "sku": sku, "quantity": quantity}),
                "3-charge" => charge_args(order, *amount_cents),
                "4-fulfill" => fulfill_args(order, sku, *quantity),
                "5-notify" => notify_args(order),
                _ => return None,
            };
            Some(args.to_string())
        }
        _ => None,
    })
}

/// A host's message with what differs between processes (the process id in an owner's name, the
/// temporary directory in a ledger's path) taken out, so that a seed's history is the same on
/// every run.
fn same_everywhere(ctx: &Ctx, message: &str) -> String {
    message.replace(&format!("{}-", std::process::id()), "host-").replace(&ctx.dir, "SEED-DIR")
}
