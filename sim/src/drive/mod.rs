//! One seed, run: the host's lives (each crashed where the plan says, the ledger reopened for the
//! next), the callers working through their jobs as orchestrators would (a step called again until
//! it has an answer; a run compensated when a step fails), the operator beside them, then a last
//! pass in which the operator settles what is left, and the facts the checker reads.
//!
//! Here: the lives, the host each one builds and the hooks it runs under; `caller`: the
//! orchestrators; `operator`: the people, and the last pass.

mod caller;
mod hosts;
mod operator;
mod upgrade;

use caller::caller;
use hosts::Hosts;
use operator::{last_pass, operator, relay_pass, second_person};
use upgrade::{Builds, REFUN2};

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use sha2::{Digest, Sha256};
use tokio::sync::Notify;

use oncebox_runtime::hooks::{Exchange, HookFuture, Hooks, Outgoing, Point, Site};
use oncebox_runtime::policy_file::PolicyFile;
use oncebox_runtime::{Grant, GuestClock, Host, HostBuilder, HttpTarget, Ledger, ReplayClass, RetryPolicy};

use crate::check::Facts;
use crate::history::{Event, History};
use crate::paced::Paced;
use crate::pause::{Fences, Stall};
use crate::plan::{Crash, OVERRUN_TOOL, Plan, percent};
use crate::race::Holds;
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
/// The caller that takes over the step of a paused call (`pause.rs`): another worker of the
/// same orchestrator.
const OTHER_WORKER: usize = 98;
/// How many times a caller asks for one step before it leaves it to the operator.
const MAX_ASKS: u32 = 60;
/// How long the last pass may take before what is open is reported: on the simulated clock (redb),
/// and on the database's real one (PostgreSQL).
const LAST_PASS: Duration = Duration::from_secs(3_600);
const LAST_PASS_REAL: Duration = Duration::from_secs(60);
/// The lease of a host on PostgreSQL: a claim a crashed host left in the database is taken over
/// only once it expires, on the database's real clock, so it must be well inside the last pass
/// (the default, 60 s, is as long as the whole pass). On redb a crash takes its claims with it.
const LEASE_REAL: Duration = Duration::from_secs(10);
/// The lease of a host on redb: a paused owner stands still longer (`pause.rs`). Shorter than
/// the host's default (60 s), so that the lives a pause stretches cost less of the operator's
/// looks; still far longer than any attempt of the example tools on the simulated clock.
const LEASE: Duration = Duration::from_secs(10);
/// A retention longer than a seed's lives, shorter than its last pass: a gc run with it collects
/// nothing within the lives. Most seeds' (`Plan::gc_retention_ms`).
const GC_RETENTION: Duration = Duration::from_secs(600);
/// How long after its write-ahead a request may still leave (the host's send deadline): short, so
/// that an empty lookup can count as proof within a seed's lives.
const SEND_BY: Duration = Duration::from_secs(1);
/// The attempt deadline of the tool that runs past it (`plan::OVERRUN_TOOL`): short, as the
/// simulated clock spends it (the others keep the default, 30 s, which none of them nears).
const OVERRUN_DEADLINE: Duration = Duration::from_secs(1);
/// The simulated time one step of a spinning guest stands for (`GuestClock::Simulated`): a tenth
/// of [`OVERRUN_DEADLINE`], so that the other tasks run at ten moments of each spinning attempt
/// (a step costs a task switch; the attempt, the grace: 20 to 30 ms of real time).
const GUEST_STEP: Duration = Duration::from_millis(100);
/// The largest clock skew of a host on several hosts (ms), either way: the same bound as the
/// clock steps on redb (`plan::MAX_JUMP_MS`), inside the rule of evidence's margin.
const MAX_SKEW_MS: i64 = 400;

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
    /// Steps whose payment a person refunded by hand (by operation key): never twice, whatever
    /// becomes of their word.
    refunded_by_hand: BTreeSet<String>,
    /// Runs whose compensation reported done: their orchestrators start none of their steps (a
    /// stale retry may call again one they started: `call_again_after_undo`).
    undone: BTreeSet<String>,
    /// Per run: the steps its orchestrators started and did not see completed (a crash, an
    /// answer they could not act on), which a stale retry may call again once the run is undone.
    left: BTreeMap<String, Vec<oncebox_runtime::Call>>,
    /// Per operation: reconciles the operator made, and when the first was.
    reconciles: BTreeMap<String, (u32, u64)>,
    /// When the operator last reconciled (ledger ms).
    reconciled_ms: u64,
    /// Rejections a second person makes the moment the approved call is about to send (by
    /// operation key).
    armed: BTreeMap<String, oncebox_runtime::ledger::ApprovalRecord>,
    /// The build of `charge` deployed (1 or 2, see `upgrade.rs`; 0 until another than the first
    /// is): what each life's host loads.
    charge_build: u8,
    calls: u64,
    /// The workers of this life that took over a paused owner's step (they die with the life).
    workers: Vec<tokio::task::AbortHandle>,
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
    /// The second builds of `charge` and its refund tool.
    builds: Builds,
    /// The claims the store granted, and what paused owners did after a take-over.
    fences: Arc<Fences>,
    /// On several hosts (`--hosts N`): the hosts the callers' calls spread over.
    hosts: Option<Arc<Hosts>>,
}

#[derive(Clone)]
enum LedgerAt {
    File(PathBuf),
    Database(String),
}

impl Ctx {
    /// On redb: the host's clock is the simulated one, which can be stepped.
    fn ledger_is_file(&self) -> bool {
        matches!(self.ledger, LedgerAt::File(_))
    }

    fn shared(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Runs `plan` against a fresh ledger in `dir`, on `hosts` hosts (more than one on PostgreSQL
/// only: a redb file has one process).
pub async fn run(
    plan: Plan,
    kind: LedgerKind,
    hosts: usize,
    dir: &std::path::Path,
    cache: PathBuf,
    start_ms: u64,
) -> anyhow::Result<Ran> {
    let seed = plan.seed;
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
        builds: Builds::write(dir)?,
        fences: Arc::new(Fences::default()),
        hosts: (kind == LedgerKind::Postgres && hosts > 1).then(|| Arc::new(Hosts::new(&skews(seed, hosts)))),
    };
    if let Some(hosts) = ctx.hosts.clone() {
        let (host, lives) = lives_on_hosts(&ctx, &hosts).await?;
        return finish(&ctx, &host, lives).await;
    }
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
        for worker in std::mem::take(&mut ctx.shared().workers) {
            worker.abort();
        }
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
            None => {
                // The lives are over: a crash planned for this one that it did not reach is not
                // for the last pass (nobody would restart the host).
                hooks.fired.store(true, Ordering::SeqCst);
                break host;
            }
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
    finish(&ctx, &host, life).await
}

/// The last pass, on `host`, and the facts the checker reads; `lives`: the crashes there were.
async fn finish(ctx: &Ctx, host: &Host, lives: usize) -> anyhow::Result<Ran> {
    last_pass(ctx, host).await?;
    let compensating = ctx.shared().to_compensate.clone();
    let mut facts =
        Facts::gather(&ctx.plan, &ctx.world, &ctx.history, host, compensating, ctx.fences.breaches()).await?;
    if ctx.hosts.is_some() {
        // Stamps of hosts whose clocks are skewed (`skews`), one against another's.
        facts.clock_slack_ms += 2 * MAX_SKEW_MS.unsigned_abs();
    }
    let shared = ctx.shared();
    let faults = ctx.world.faults() + lives as u64;
    Ok(Ran { facts, history: ctx.history.clone(), operations: shared.calls, faults })
}

/// Each host's clock skew on several hosts (ms): the first host on the world's clock, the
/// others up to [`MAX_SKEW_MS`] either way, drawn from the seed.
fn skews(seed: u64, hosts: usize) -> Vec<i64> {
    let span = 2 * MAX_SKEW_MS + 1;
    (0..hosts)
        .map(|k| match k {
            0 => 0,
            _ => (crate::plan::choice(seed, &["skew", &k.to_string()]) % span as u64) as i64 - MAX_SKEW_MS,
        })
        .collect()
}

/// The lives of several hosts on one database (`--hosts N`): the callers' calls spread over the
/// live hosts; the plan's crashes fall on one host each, in turn (the n-th on host n mod N), and
/// kill that host's calls only; the host starts again on its own while the others go on. The
/// operator (and the second person) work on one host, and start again on another when theirs
/// dies. Returns a live host, for the last pass, and how many crashes there were.
async fn lives_on_hosts(ctx: &Ctx, hosts: &Arc<Hosts>) -> anyhow::Result<(Host, usize)> {
    let n = hosts.len();
    let (racer, rejections) = tokio::sync::mpsc::unbounded_channel();
    let mut hooks = Vec::with_capacity(n);
    for k in 0..n {
        let crash = if k == 0 { ctx.plan.crashes.first().copied() } else { None };
        let h = Arc::new(LifeHooks::new(ctx, crash, racer.clone()));
        hosts.put(k, build_on(ctx, h.clone(), hosts, k).await?);
        hooks.push(h);
    }
    let first = hosts.live(0).map(|(_, host)| host).context("no host is up")?;
    let mut callers = tokio::task::JoinSet::new();
    for c in 0..ctx.plan.callers {
        callers.spawn(caller(ctx.clone(), first.clone(), c));
    }
    drop(first);
    // The people's host, and their tasks on it.
    let mut people = people_on(ctx, hosts, 0, rejections)?;
    let mut relays = relays(ctx, hosts);
    let mut crashes = 0usize;
    {
        let done = async {
            while let Some(joined) = callers.join_next().await {
                joined?;
            }
            Ok::<(), tokio::task::JoinError>(())
        };
        tokio::pin!(done);
        loop {
            let victim = crashes % n;
            let crash = ctx.plan.crashes.get(crashes).copied();
            let timer = async {
                match crash {
                    Some(Crash::AtTime { after_ms }) => tokio::time::sleep(Duration::from_millis(after_ms)).await,
                    _ => std::future::pending().await,
                }
            };
            let how = tokio::select! {
                joined = &mut done => {
                    joined.context("a caller of the simulation panicked")?;
                    break;
                }
                () = hooks[victim].crashed.notified() => "at a crash point".to_string(),
                () = timer => "at a moment of the plan".to_string(),
            };
            // Host `victim`'s process dies: its calls in flight with it; the other hosts go on.
            hosts.kill(victim);
            let how = match hooks[victim].site() {
                Some(site) => format!("host {victim} {how}: {site}"),
                None => format!("host {victim} {how}"),
            };
            if people.0 == victim {
                people.abort().await?;
            }
            ctx.history.push(Event::Crashed { how });
            crashes += 1;
            ctx.history.next_life();
            let h = Arc::new(LifeHooks::new(ctx, None, racer_of(&hooks)));
            hosts.put(victim, build_on(ctx, h.clone(), hosts, victim).await?);
            hooks[victim] = h;
            ctx.history.push(Event::Restarted);
            if let Some(crash) = ctx.plan.crashes.get(crashes).copied() {
                hooks[crashes % n].arm(crash);
            }
            if people.1.is_none() {
                let (racer, rejections) = tokio::sync::mpsc::unbounded_channel();
                for h in &hooks {
                    *h.racer.lock().unwrap_or_else(|p| p.into_inner()) = racer.clone();
                }
                people = people_on(ctx, hosts, victim + 1, rejections)?;
            }
        }
    }
    // The lives are over: a crash armed that no host reached is not for the last pass.
    for h in &hooks {
        h.fired.store(true, Ordering::SeqCst);
    }
    callers.abort_all();
    relays.abort_all();
    for worker in std::mem::take(&mut ctx.shared().workers) {
        worker.abort();
    }
    people.abort().await?;
    let (_, host) = hosts.live(0).context("no host is up for the last pass")?;
    Ok((host, crashes))
}

/// Each host's outbox relay, as each host process runs its own: a pass at every look of the
/// operator's, all at once, so that the hosts' passes meet (the topic's lease decides which one
/// sends); a pass that fails leaves its messages to the next, and two hosts then read the same
/// batch. A host that dies ends its pass with it; its relay goes on with the host that starts in
/// its place.
fn relays(ctx: &Ctx, hosts: &Arc<Hosts>) -> tokio::task::JoinSet<()> {
    let mut relays = tokio::task::JoinSet::new();
    for k in 0..hosts.len() {
        let (ctx, hosts) = (ctx.clone(), hosts.clone());
        let every = Duration::from_millis(ctx.plan.operator.every_ms);
        relays.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let ctx = &ctx;
                let pass = |host: Host| async move {
                    relay_pass(ctx, host.outbox_relay().ok().as_ref()).await;
                };
                let _ = hosts.on(k, pass).await;
            }
        });
    }
    relays
}

/// The operator and the second person, on host `.0`, while it lives.
struct People(usize, Option<(tokio::task::JoinHandle<()>, tokio::task::JoinHandle<()>)>);

impl People {
    /// They stop (their host died, or the lives are over).
    async fn abort(&mut self) -> anyhow::Result<()> {
        let Some((operator, second_person)) = self.1.take() else { return Ok(()) };
        operator.abort();
        second_person.abort();
        let _ = second_person.await;
        if let Err(e) = operator.await
            && e.is_panic()
        {
            anyhow::bail!("the simulated operator panicked: {e}");
        }
        Ok(())
    }
}

/// Starts the operator and the second person on the first live host from `pick`.
fn people_on(
    ctx: &Ctx,
    hosts: &Hosts,
    pick: usize,
    rejections: tokio::sync::mpsc::UnboundedReceiver<Act>,
) -> anyhow::Result<People> {
    let (k, host) = hosts.live(pick).context("no host is up for the operator")?;
    // On their host's clock, as its calls are.
    let skew = hosts.skew(k);
    let operator = tokio::spawn(crate::clock::skewed(skew, operator(ctx.clone(), host.clone())));
    let second_person = tokio::spawn(crate::clock::skewed(skew, second_person(ctx.clone(), host, rejections)));
    Ok(People(k, Some((operator, second_person))))
}

fn racer_of(hooks: &[Arc<LifeHooks>]) -> tokio::sync::mpsc::UnboundedSender<Act> {
    hooks[0].racer.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Host `k` of several: its own connection to the database (its own pool), made on its own
/// skewed clock (the store measures the database's clock as it connects).
async fn build_on(ctx: &Ctx, hooks: Arc<LifeHooks>, hosts: &Hosts, k: usize) -> anyhow::Result<Host> {
    crate::clock::skewed(hosts.skew(k), build(ctx, hooks)).await
}

/// A host on the ledger, with every tool of the order workflow loaded, and `hooks` as its network.
async fn build(ctx: &Ctx, hooks: Arc<LifeHooks>) -> anyhow::Result<Host> {
    let mut tries = 0;
    let host = loop {
        let builder = match &ctx.ledger {
            LedgerAt::File(path) => match oncebox_runtime::ledger::redb::RedbStore::open(path) {
                Ok(store) => {
                    // Held up to a few of the operator's looks: long enough for the step's orchestrator to
                    // call it again meanwhile (a slow disk, a writer with a long queue).
                    let max_ms = 3 * ctx.plan.operator.every_ms;
                    let holds = Holds::new(ctx.plan.seed, ctx.plan.holds_pct, max_ms);
                    let store = Paced::new(store, ctx.plan.free, Some(holds)).watched(ctx.fences.clone());
                    HostBuilder::on_ledger(Ledger::on(store)).lease(LEASE)
                }
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
                HostBuilder::on_ledger(ledger).key_file(&ctx.key_file).lease(LEASE_REAL)
            }
        };
        break configure(builder, hooks.clone(), ctx)?.build().await.context("start the host")?;
    };
    for path in oncebox_artifacts::EXAMPLE_TOOLS {
        let path = if path == oncebox_artifacts::CHARGE { ctx.builds.charge.clone() } else { PathBuf::from(path) };
        host.load(&path).await.with_context(|| format!("load {}", path.display()))?;
    }
    host.load(&ctx.builds.refun2).await.context("load refun2")?;
    host.load(oncebox_artifacts::PANICKY).await.context("load the tool that overruns its deadline")?;
    Ok(host)
}

fn configure(mut builder: HostBuilder, hooks: Arc<LifeHooks>, ctx: &Ctx) -> anyhow::Result<HostBuilder> {
    let origin: oncebox_runtime::capabilities::HttpGrant =
        ORIGIN.parse().map_err(|e: String| anyhow::anyhow!("the downstream's origin: {e}"))?;
    for tool in ["stock", "charge", "refund", REFUN2, "fulfill"] {
        builder = builder.tool_config(tool, "base_url", ORIGIN).grant(tool, Grant::Http(origin.clone()));
    }
    builder = builder.grant(OVERRUN_TOOL, Grant::Http(origin.clone()));
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
        (REFUN2, ReplayClass::IdempotentWrite),
        ("fulfill", ReplayClass::Irreversible),
        ("notify", ReplayClass::IdempotentWrite),
        (OVERRUN_TOOL, ReplayClass::IdempotentWrite),
    ] {
        let mut policy = RetryPolicy {
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(200),
            ..RetryPolicy::for_class(class)
        };
        if tool == OVERRUN_TOOL {
            policy.attempt_deadline = OVERRUN_DEADLINE;
        }
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
    // A guest's running time is spent on the simulated clock: one that spins past its deadline
    // traps there, at a moment of the seed's, with the other tasks run meanwhile.
    let builder = builder.guest_clock(GuestClock::Simulated { step: GUEST_STEP });
    Ok(builder.policy_file(policy).hooks(hooks).send_deadline(SEND_BY).compile_cache(ctx.cache.clone()))
}

/// What the hooks ask a second person to do, the moment a call reaches a point.
enum Act {
    /// Reject this request for approval (its approved call is about to write ahead).
    Reject(Box<oncebox_runtime::ledger::ApprovalRecord>),
    /// Compensate the run of this operation (one of its requests is about to leave).
    Undo(String),
    /// Run `gc` now (a request is about to be written ahead, or was just answered).
    Collect,
}

/// The hooks of one life: the world as the network, and the plan's crash.
struct LifeHooks {
    world: World,
    /// The operator's `compensate_pct`, for the undoing that races a request about to leave.
    compensate_pct: u64,
    /// The plan's `pause_pct` and `stall_after_fault_pct`, and the fences the paused owners are
    /// judged by.
    pause_pct: u64,
    stall_after_fault_pct: u64,
    /// The effect keys whose latest exchange was unfavourable (anything but a 2xx), until the
    /// answer has passed the points where it reaches the host.
    faulted: Mutex<BTreeSet<String>>,
    fences: Arc<Fences>,
    /// The seed's gc collects within its lives: it may run at any of the pipeline's points.
    gc_at_any_moment: bool,
    shared: Arc<Mutex<Shared>>,
    /// Where an armed rejection goes when its call reaches the point before its write-ahead.
    /// (Replaced when the second person starts again on another host: several hosts.)
    racer: Mutex<tokio::sync::mpsc::UnboundedSender<Act>>,
    /// The crash this host is to meet (armed later on several hosts, one host at a time).
    crash: Mutex<Option<Crash>>,
    visits: AtomicU32,
    fired: AtomicBool,
    site: Mutex<Option<String>>,
    crashed: Notify,
}

impl LifeHooks {
    fn new(ctx: &Ctx, crash: Option<Crash>, racer: tokio::sync::mpsc::UnboundedSender<Act>) -> LifeHooks {
        LifeHooks {
            world: ctx.world.clone(),
            compensate_pct: ctx.plan.operator.compensate_pct,
            pause_pct: ctx.plan.pause_pct,
            stall_after_fault_pct: ctx.plan.stall_after_fault_pct,
            faulted: Mutex::new(BTreeSet::new()),
            gc_at_any_moment: ctx.plan.gc_retention_ms < GC_RETENTION.as_millis() as u64,
            fences: ctx.fences.clone(),
            shared: ctx.shared.clone(),
            racer: Mutex::new(racer),
            crash: Mutex::new(crash),
            visits: AtomicU32::new(0),
            fired: AtomicBool::new(false),
            site: Mutex::new(None),
            crashed: Notify::new(),
        }
    }

    /// This host is to meet `crash` next: its crash points are counted from now.
    fn arm(&self, crash: Crash) {
        *self.crash.lock().unwrap_or_else(|p| p.into_inner()) = Some(crash);
        self.visits.store(0, Ordering::SeqCst);
    }

    fn crash(&self) -> Option<Crash> {
        *self.crash.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands `act` to the second person.
    fn race(&self, act: Act) {
        let _ = self.racer.lock().unwrap_or_else(|p| p.into_inner()).send(act);
    }

    fn site(&self) -> Option<String> {
        self.site.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Hooks for LifeHooks {
    fn at(&self, site: Site) -> HookFuture<'_, ()> {
        Box::pin(async move {
            // Now and then the caller's whole call stops dead here, past its lease (`pause.rs`):
            // anywhere, and more often just as an unfavourable answer reaches the host.
            let answered = matches!(site.point, Point::AfterDispatch | Point::AfterAnswer);
            let faulted = answered && {
                let mut faulted = self.faulted.lock().unwrap_or_else(|p| p.into_inner());
                match site.point {
                    Point::AfterAnswer => faulted.remove(&site.key),
                    _ => faulted.contains(&site.key),
                }
            };
            let stall = match faulted {
                true => self.fences.maybe_pause(
                    Stall::AfterFault,
                    &site,
                    self.world.seed(),
                    self.stall_after_fault_pct,
                    LEASE,
                ),
                false => None,
            };
            let stall = stall
                .or_else(|| self.fences.maybe_pause(Stall::Anywhere, &site, self.world.seed(), self.pause_pct, LEASE));
            if let Some((run, what)) = stall {
                self.world.history().push(Event::Paused { run: run.clone(), what: what.clone() });
                crate::pause::yield_to_pause().await;
                self.world.history().push(Event::Resumed { run, what });
                // It goes on at once, as a resumed process does: nothing else runs first (its
                // attempt's deadline, long past, has not had a look in yet).
                return;
            }
            if site.point == Point::BeforeWriteAhead {
                let armed = self.shared.lock().unwrap_or_else(|p| p.into_inner()).armed.remove(&site.operation_key);
                if let Some(record) = armed {
                    self.race(Act::Reject(Box::new(record)));
                }
            }
            // Now and then a person undoes the run just as one of its requests is about to be
            // written ahead (its claim may still be in memory only).
            let undo = percent(self.world.seed(), &["undo-now", &site.operation_key, &site.key]);
            if site.point == Point::BeforeWriteAhead && undo < 3 * self.compensate_pct {
                self.race(Act::Undo(site.operation_key.clone()));
            }
            // And, on a seed whose gc collects, someone runs it at just this moment.
            let gc_now = percent(self.world.seed(), &["gc-now", &site.operation_key, &site.key, site.point.name()]);
            if self.gc_at_any_moment
                && matches!(site.point, Point::BeforeWriteAhead | Point::AfterDispatch | Point::AfterAttemptRecord)
                && gc_now < 10
            {
                self.race(Act::Collect);
            }
            // An await point, as a write to disk is in a host: whatever is ready runs here (the
            // racing rejection among them).
            for _ in 0..3 {
                tokio::task::yield_now().await;
            }
            let visit = self.visits.fetch_add(1, Ordering::SeqCst) + 1;
            let due = matches!(self.crash(), Some(Crash::AtPoint { visit: at }) if at == visit);
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
        self.fences.sending(&site.operation_key);
        Box::pin(async move {
            let exchange = self.world.effect(site.key.clone(), request).await;
            let favourable = matches!(exchange, Exchange::Answered { status: 200..=299, .. });
            let mut faulted = self.faulted.lock().unwrap_or_else(|p| p.into_inner());
            match favourable {
                true => faulted.remove(&site.key),
                false => faulted.insert(site.key),
            };
            exchange
        })
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

/// A host's message with what differs between processes (the process id in an owner's name, the
/// temporary directory in a ledger's path) taken out, so that a seed's history is the same on
/// every run.
fn same_everywhere(ctx: &Ctx, message: &str) -> String {
    message.replace(&format!("{}-", std::process::id()), "host-").replace(&ctx.dir, "SEED-DIR")
}

/// Compensates `run` (`by` a caller or the operator), and remembers whether it is done. On
/// several hosts, on whichever the balancer picks (the host that dies under it says nothing).
async fn compensate(ctx: &Ctx, host: &Host, run: &str, by: &str) {
    ctx.shared().to_compensate.insert(run.to_string());
    let Some(hosts) = ctx.hosts.clone() else {
        return compensate_on(ctx, host, run, by).await;
    };
    let pick = crate::plan::choice(ctx.plan.seed, &["compensate-on", run, by]) as usize;
    match hosts.on(pick, |host| async move { compensate_on(ctx, &host, run, by).await }).await {
        Some(Ok(())) => {}
        Some(Err(died)) => {
            ctx.history.push(Event::Compensated { run: run.into(), by: by.into(), result: format!("error: {died}") })
        }
        None => {
            ctx.history.push(Event::Compensated { run: run.into(), by: by.into(), result: "error: no host".into() })
        }
    }
}

async fn compensate_on(ctx: &Ctx, host: &Host, run: &str, by: &str) {
    let mut payments = Vec::new();
    // Now and then a person decides, at the same moment, to refund the charge themselves.
    let racing = percent(ctx.plan.seed, &["word-races-the-saga", run, by]) < 10;
    let (compensated, ()) = tokio::join!(host.compensate(run), async {
        if racing {
            word_racing_the_saga(ctx, host, run).await;
        }
    });
    let result = match compensated {
        Ok(report) => {
            let named = report.steps.iter().filter(|s| s.action == "undo-by-hand" && s.tool == "charge");
            payments = named.map(|s| s.operation_key.clone()).collect();
            // Done, or waiting for a person to undo a step by hand (a payment a person may refund
            // and say so: `undo_by_hand`; a reservation nobody here releases by hand).
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
    let done = result.starts_with("Done");
    ctx.history.push(Event::Compensated { run: run.to_string(), by: by.to_string(), result });
    if done {
        call_again_after_undo(ctx, host, run).await;
    } else if undo_by_hand_payments(ctx, host, run, payments).await {
        // Said undone: compensating again goes on with the steps before them.
        Box::pin(compensate_on(ctx, host, run, by)).await;
    }
}

/// A person who decides to refund a run's completed charge themselves while its compensation
/// runs: they say so first, and refund at the dashboard only if the word is taken (refused, the
/// saga has the refund). The host must take the word or run the refund, never both: a word
/// beside a refund the saga is starting is a second refund (`compensation-without-effect`).
async fn word_racing_the_saga(ctx: &Ctx, host: &Host, run: &str) {
    let Ok(ops) = host.ledger().operations(Some(run)).await else { return };
    let charged =
        ops.iter().find(|op| op.tool == "charge" && op.status == oncebox_runtime::ledger::OperationStatus::Completed);
    let Some(key) = charged.map(|op| op.key.clone()) else { return };
    word_then_refund(ctx, host, run, key, "refunding it myself").await;
}

/// A person who refunds charge `key` of `run` themselves: says so (`undone_by_hand`), and refunds
/// at the dashboard only if the word is taken, once per step. A word taken while the charge's
/// refund may still go is a second refund (`compensation-without-effect`).
async fn word_then_refund(ctx: &Ctx, host: &Host, run: &str, key: String, note: &str) {
    // Now and then a second person says the same at the same moment (and refunds too, if their
    // word is the one taken): one word is recorded, the other answered from it.
    if percent(ctx.plan.seed, &["two-people-say-it", run, &key]) < 25 {
        let other = key.clone();
        tokio::join!(
            Box::pin(one_word_then_refund(ctx, host, run, key, "a person", note)),
            Box::pin(one_word_then_refund(ctx, host, run, other, "a colleague", "refunded it too")),
        );
        return;
    }
    one_word_then_refund(ctx, host, run, key, "a person", note).await;
}

/// One person's [`word_then_refund`].
async fn one_word_then_refund(ctx: &Ctx, host: &Host, run: &str, key: String, who: &str, note: &str) {
    let (refunded, result) = match host.undone_by_hand(&key, who, Some(note)).await {
        Ok(word) => {
            let refunded = word.recorded && ctx.shared().refunded_by_hand.insert(key.clone());
            if refunded {
                ctx.world.refund_by_hand(&crate::check::order_of_run(run));
            }
            (refunded, format!("recorded as {} ({})", word.recorded_as, if word.recorded { "new" } else { "already" }))
        }
        Err(e) => (false, format!("refused: {}", same_everywhere(ctx, &e.to_string()))),
    };
    ctx.history.push(Event::UndoneByHand { run: run.into(), operation_key: key, refunded, result });
}

/// A person asked to undo a run's charges by hand (`payments`: the keys of those `compensate`
/// named `undo-by-hand`): now and then, refunds each payment at the downstream's dashboard (once
/// per step, whatever becomes of the word) and says so (`undone_by_hand`). Trusting the report:
/// a payment the host refunded too, or a word the host took while its refund could still go, is
/// a second refund (`compensation-without-effect`). Whether a new word was taken.
async fn undo_by_hand_payments(ctx: &Ctx, host: &Host, run: &str, payments: Vec<String>) -> bool {
    if payments.is_empty() || percent(ctx.plan.seed, &["undo-by-hand", run]) >= 50 {
        return false;
    }
    let mut said = false;
    for key in payments {
        let refunded = ctx.shared().refunded_by_hand.insert(key.clone());
        if refunded {
            ctx.world.refund_by_hand(&crate::check::order_of_run(run));
        }
        // Now and then a colleague who saw the refund says so at the same moment: one word is
        // recorded, the other answered from it.
        let colleague = percent(ctx.plan.seed, &["a-colleague-says-it-too", run, &key]) < 25;
        let (mine, theirs) =
            tokio::join!(host.undone_by_hand(&key, "a person", Some("refunded at the dashboard")), async {
                match colleague {
                    true => Some(host.undone_by_hand(&key, "a colleague", Some("saw it refunded")).await),
                    false => None,
                }
            });
        for (word, refunded) in std::iter::once((mine, refunded)).chain(theirs.map(|word| (word, false))) {
            let result = match word {
                Ok(word) => {
                    said |= word.recorded;
                    format!("recorded as {} ({})", word.recorded_as, if word.recorded { "new" } else { "already" })
                }
                Err(e) => format!("refused: {}", same_everywhere(ctx, &e.to_string())),
            };
            ctx.history.push(Event::UndoneByHand { run: run.into(), operation_key: key.clone(), refunded, result });
        }
    }
    said
}

/// An orchestrator whose retry outlived the compensation: once a run is undone, now and then
/// the steps its orchestrators started and never saw completed are called again, once each. The
/// run's record must answer them (completed, failed; an abandoned claim was ended by the
/// compensation), never run them. Only steps the ledger knows: one whose claim never became
/// durable left nothing, and a new call of it is a new step to the host.
async fn call_again_after_undo(ctx: &Ctx, host: &Host, run: &str) {
    if percent(ctx.plan.seed, &["call-again-after-undo", run]) >= 50 {
        return;
    }
    let left = ctx.shared().left.remove(run).unwrap_or_default();
    for call in left {
        let key = oncebox_runtime::keys::operation_key(run, call.step_id.as_deref().unwrap_or_default(), &call.tool);
        if !matches!(host.ledger().operation(&key).await, Ok(Some(_))) {
            continue;
        }
        ctx.shared().calls += 1;
        let order = serde_json::from_str::<serde_json::Value>(&call.args)
            .ok()
            .and_then(|a| crate::plan::order_in(&a).map(str::to_string));
        let event = match host.call(call.clone()).await {
            Ok(outcome) => Event::Called {
                caller: "an orchestrator, again after the compensation".into(),
                run: run.to_string(),
                step: call.step_id.clone().unwrap_or_default(),
                tool: call.tool.clone(),
                order,
                status: outcome.status,
                replayed: outcome.replayed,
                operation_key: outcome.operation_key.clone(),
                output: outcome.output.clone(),
                error: outcome.error.as_ref().map(|e| same_everywhere(ctx, &e.message)),
            },
            Err(e) => Event::CallError {
                caller: "an orchestrator, again after the compensation".into(),
                run: run.to_string(),
                step: call.step_id.clone().unwrap_or_default(),
                tool: call.tool.clone(),
                error: same_everywhere(ctx, &e.to_string()),
            },
        };
        ctx.history.push(event);
    }
}
