//! One scenario: a call through the real host on a fresh ledger file, optionally crashed at a
//! point (the call and the host dropped, the ledger reopened and recovered, the call made again),
//! then reconciled through the tool's own export while its outcome is unknown.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use oncebox_runtime::HttpTarget;
use oncebox_runtime::Reconciliation;
use oncebox_runtime::capabilities::Grant;
use oncebox_runtime::hooks::{Exchange, HookFuture, Hooks, Outgoing, Point, Site};
use oncebox_runtime::ledger::EffectRecord;
use oncebox_runtime::policy_file::PolicyFile;
use oncebox_runtime::{Call, Outcome, Status};
use oncebox_runtime::{Host, HostBuilder, Ledger};

use super::HarnessError as Error;
use super::killable::Killable;
use super::script::{Dispatch, Downstream, Event, Fault, Script};

/// The run and step every scenario calls: keys are the same in every scenario, as they would be
/// for one step retried across crashes.
pub const RUN: &str = "harness-run";
pub const STEP: &str = "harness-step";

/// How many reconciles a scenario makes before it takes `unknown` as the answer.
const MAX_RECONCILES: u32 = 4;
/// The longest a scenario waits for a `not-committed` lookup to start counting.
const MAX_SETTLE_WAIT: Duration = Duration::from_secs(5);

/// Which effect an injection aims at: the `ordinal`-th distinct effect the tool sends (0 = the
/// first), in the order its effects first reach the downstream. Not its label: a tool whose label
/// changes between runs (the mistake exploration exists to catch) must still be hit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub ordinal: usize,
    /// `label#occurrence` as the fault-free run saw it, for the report.
    pub name: String,
}

/// What a scenario injects: a crash at a point, or a fault in the downstream's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Injection {
    /// Crash at `point` of the effect, the first time it gets there.
    Crash { point: Point, effect: Target },
    /// Crash once attempt `attempt`'s record is durable.
    CrashAfterAttempt { attempt: u32 },
    /// The effect's first dispatch is answered with `fault`.
    Fault { fault: Fault, effect: Target },
}

impl Injection {
    /// A crash at `point` of the `ordinal`-th effect.
    pub fn crash(point: Point, ordinal: usize) -> Self {
        Injection::Crash { point, effect: Target { ordinal, name: format!("effect {ordinal}") } }
    }

    /// `fault` in the first answer to the `ordinal`-th effect.
    pub fn fault(fault: Fault, ordinal: usize) -> Self {
        Injection::Fault { fault, effect: Target { ordinal, name: format!("effect {ordinal}") } }
    }

    pub fn point_name(&self) -> &'static str {
        match self {
            Injection::Crash { point, .. } => point.name(),
            Injection::CrashAfterAttempt { .. } => Point::AfterAttemptRecord.name(),
            Injection::Fault { fault, .. } => fault.name(),
        }
    }

    /// The effect's name, or the attempt.
    pub fn effect_name(&self) -> String {
        match self {
            Injection::Crash { effect, .. } | Injection::Fault { effect, .. } => effect.name.clone(),
            Injection::CrashAfterAttempt { attempt } => format!("(attempt {attempt})"),
        }
    }
}

/// What one scenario came to.
#[derive(Debug, Clone)]
pub struct Run {
    /// The last outcome, after the restart and any reconciles.
    pub outcome: Outcome,
    /// The scenario crashed the host (the point was reached).
    pub crashed: bool,
    /// How often the harness approved the call's exact params (irreversible tools ask for it).
    pub approvals: u32,
    /// What each reconcile answered, in order.
    pub reconciles: Vec<Reconciliation>,
    /// Every request that reached the script, in order.
    pub dispatches: Vec<Dispatch>,
    /// The ledger's effect records of the operation: every effect the tool attempted.
    pub effects: Vec<EffectRecord>,
    /// What the host refused because an attempt asked, under a new key, for a request that took
    /// place or may have (the tool diverged): the attempts' messages.
    pub diverged: Vec<String>,
    pub(crate) events: Vec<Event>,
}

/// Loads a component into real hosts on temporary ledgers, with the script as every downstream.
#[derive(Debug, Clone)]
pub struct Harness {
    component: PathBuf,
    policy: Option<PathBuf>,
    config: Vec<(String, String)>,
    grants: Vec<Grant>,
    pub(crate) script: Arc<Script>,
    cache: Arc<tempfile::TempDir>,
}

impl Harness {
    /// A harness for the component at `component`, answering every effect 200 with its own body
    /// until a script says otherwise.
    pub fn new(component: impl AsRef<Path>) -> Result<Self, Error> {
        let cache = tempfile::tempdir().map_err(Error::TempDir)?;
        Ok(Harness {
            component: component.as_ref().to_path_buf(),
            policy: None,
            config: Vec::new(),
            grants: Vec::new(),
            script: Arc::new(Script::default()),
            cache: Arc::new(cache),
        })
    }

    /// The operator's policy file: the tool's config, grants, limits and retry settings (its
    /// `[hosts]` are the script's in the harness).
    pub fn policy_file(mut self, path: impl AsRef<Path>) -> Self {
        self.policy = Some(path.as_ref().to_path_buf());
        self
    }

    /// An operator setting the tool reads through `config`.
    pub fn config(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.config.push((key.into(), value.into()));
        self
    }

    /// A capability for the tool, besides the policy file's.
    pub fn grant(mut self, grant: Grant) -> Self {
        self.grants.push(grant);
        self
    }

    /// What the downstream answers.
    pub fn script(mut self, script: Script) -> Self {
        self.script = Arc::new(script);
        self
    }

    /// Runs `args` once, with `injection` (or none), on a fresh ledger.
    pub async fn run(&self, args: &str, injection: Option<&Injection>) -> Result<Run, Error> {
        let dir = tempfile::tempdir().map_err(Error::TempDir)?;
        let ledger = dir.path().join("ledger.redb");
        let fault = match injection {
            Some(Injection::Fault { fault, effect }) => Some((effect.ordinal, *fault)),
            _ => None,
        };
        let downstream = Downstream::new(self.script.clone(), fault);
        let crash = match injection {
            Some(Injection::Crash { point, effect }) => Some(Crash::Effect { point: *point, ordinal: effect.ordinal }),
            Some(Injection::CrashAfterAttempt { attempt }) => Some(Crash::Attempt(*attempt)),
            _ => None,
        };
        let hooks = Arc::new(ScriptHooks::new(downstream.clone(), crash));
        let (host, call) = self.host(&ledger, hooks.clone(), args).await?;
        let mut approvals = 0;
        loop {
            let mut task = tokio::spawn({
                let (host, call) = (host.clone(), call.clone());
                async move { host.call(call).await }
            });
            let finished = tokio::select! {
                joined = &mut task => Some(joined),
                () = hooks.crashed.notified() => None,
            };
            let Some(joined) = finished else {
                // The process died at the point (the hook cut it off from the file, so not even
                // the close that would make an answer riding with the next durable commit durable
                // reaches it): the call stops, and every handle on the ledger, every instance and
                // every claim held in memory goes with the host.
                task.abort();
                let _ = task.await;
                drop(host);
                let hooks = Arc::new(ScriptHooks::new(downstream.clone(), None));
                let (host, call) = self.host(&ledger, hooks, args).await?;
                // What the reopened ledger holds in doubt had its answer lost, whatever the point
                // (an answer still riding is lost with the host).
                for op in host.ledger().operations(Some(RUN)).await? {
                    for effect in host.ledger().effects(&op.key).await? {
                        if effect.status.in_doubt() {
                            downstream.answer_lost(&effect.key);
                        }
                    }
                }
                let outcome = approving(&host, &call, &mut approvals).await?;
                return self.settle(host, call, outcome, true, approvals, &downstream).await;
            };
            let outcome = joined.map_err(|e| Error::Panicked(e.to_string()))??;
            if outcome.status == Status::AwaitingApproval && approvals < MAX_APPROVALS {
                approve(&host, &outcome).await?;
                approvals += 1;
                continue;
            }
            return self.settle(host, call, outcome, false, approvals, &downstream).await;
        }
    }

    /// Reconciles an unknown outcome through the tool's own export, and calls again after a
    /// `not-committed`, as an operator following `oncebox reconcile` would.
    async fn settle(
        &self,
        host: Host,
        call: Call,
        mut outcome: Outcome,
        crashed: bool,
        mut approvals: u32,
        downstream: &Downstream,
    ) -> Result<Run, Error> {
        let mut reconciles = Vec::new();
        for _ in 0..MAX_RECONCILES {
            if outcome.status != Status::Unknown {
                break;
            }
            let answer = host.reconcile(call.clone()).await?;
            reconciles.push(answer.clone());
            match answer {
                Reconciliation::Committed { outcome: settled } => outcome = settled,
                Reconciliation::NotCommitted { .. } => {
                    downstream.note(Event::ProvenNotTaken);
                    outcome = approving(&host, &call, &mut approvals).await?;
                }
                Reconciliation::StillUnknown { counts_from_ms: Some(from), .. } => {
                    let wait = Duration::from_millis(from.saturating_sub(oncebox_runtime::clock::now_ms()));
                    if wait > MAX_SETTLE_WAIT {
                        break;
                    }
                    tokio::time::sleep(wait + Duration::from_millis(5)).await;
                }
                Reconciliation::StillUnknown { .. } | Reconciliation::NotUnknown { .. } => break,
            }
        }
        let (effects, attempts) = match &outcome.operation_key {
            Some(key) => (host.ledger().effects(key).await?, host.ledger().attempts(key).await?),
            None => (Vec::new(), Vec::new()),
        };
        let diverged =
            attempts.into_iter().filter_map(|a| a.message).filter(|m| m.contains(oncebox_runtime::DIVERGED)).collect();
        Ok(Run {
            outcome,
            crashed,
            approvals,
            reconciles,
            dispatches: downstream.dispatches(),
            effects,
            diverged,
            events: downstream.events(),
        })
    }

    /// A host on `ledger` under `hooks`, with the tool loaded, and the call. Once the hooks kill
    /// it, nothing more of this host reaches the ledger file.
    async fn host(&self, ledger: &Path, hooks: Arc<ScriptHooks>, args: &str) -> Result<(Host, Call), Error> {
        // Opening recovers (and, after a kill, repairs) the file: blocking work, off the runtime.
        let (path, killed) = (ledger.to_path_buf(), hooks.killed.clone());
        let opened = tokio::task::spawn_blocking(move || -> Result<Ledger, Error> {
            let file = Killable::open(&path, killed).map_err(Error::LedgerFile)?;
            Ok(Ledger::open_on(file, &path)?)
        })
        .await
        .map_err(|e| Error::Panicked(e.to_string()))??;
        // The script answers in this process, right after the write-ahead: a short send deadline
        // keeps the reconciles that wait it out short, and a long stall still counts as one.
        let mut builder =
            HostBuilder::on_ledger(opened).compile_cache(self.cache.path()).hooks(hooks).send_deadline(SEND_BY);
        if let Some(path) = &self.policy {
            builder = builder.policy_file(PolicyFile::load(path)?);
        }
        let host = builder.build().await?;
        let manifest = host.load_granting(&self.component, &self.grants).await?;
        host.set_tool_config(&manifest.name, self.config.clone());
        Ok((host.clone(), Call::step(RUN, STEP, &manifest.name, args)))
    }
}

/// The harness hosts' send deadline (`HostBuilder::send_deadline`).
const SEND_BY: Duration = Duration::from_secs(1);

/// How often a scenario approves an irreversible tool's call: once at first, and again after a
/// crash took the approval with it before anything was sent.
const MAX_APPROVALS: u32 = 3;

/// Approves the exact params an outcome awaits approval for, as the person asked would.
async fn approve(host: &Host, outcome: &Outcome) -> Result<(), Error> {
    let (Some(key), Some(fingerprint)) = (&outcome.operation_key, &outcome.fingerprint) else {
        return Ok(());
    };
    let decision = oncebox_runtime::approvals::Decision::Approve { expires_ms: None };
    host.decide(key, fingerprint, decision, "oncebox-harness", Some("the harness approves every call it makes"))
        .await?;
    Ok(())
}

/// Calls, approving the params first where the tool is irreversible and asks for it.
async fn approving(host: &Host, call: &Call, approvals: &mut u32) -> Result<Outcome, Error> {
    let mut outcome = host.call(call.clone()).await?;
    while outcome.status == Status::AwaitingApproval && *approvals < MAX_APPROVALS {
        approve(host, &outcome).await?;
        *approvals += 1;
        outcome = host.call(call.clone()).await?;
    }
    Ok(outcome)
}

/// Where a scenario crashes.
#[derive(Debug, Clone)]
enum Crash {
    Effect { point: Point, ordinal: usize },
    Attempt(u32),
}

/// The hooks a scenario's host runs under: the script, and the crash if one is due.
struct ScriptHooks {
    downstream: Downstream,
    crash: Option<Crash>,
    /// Effects (label, occurrence) in the order they first reached a point: their ordinals.
    seen: std::sync::Mutex<Vec<(String, u32)>>,
    fired: AtomicBool,
    crashed: Notify,
    /// Set the moment the host dies: from then on nothing of it reaches the ledger file.
    killed: Arc<AtomicBool>,
}

impl ScriptHooks {
    fn new(downstream: Downstream, crash: Option<Crash>) -> Self {
        ScriptHooks {
            downstream,
            crash,
            seen: Default::default(),
            fired: AtomicBool::new(false),
            crashed: Notify::new(),
            killed: Arc::default(),
        }
    }

    fn ordinal(&self, site: &Site) -> usize {
        let mut seen = self.seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let effect = (site.label.clone(), site.occurrence);
        seen.iter().position(|e| *e == effect).unwrap_or_else(|| {
            seen.push(effect);
            seen.len() - 1
        })
    }

    fn due(&self, site: &Site) -> bool {
        let hit = match &self.crash {
            None => false,
            Some(Crash::Attempt(attempt)) => site.point == Point::AfterAttemptRecord && site.occurrence == *attempt,
            Some(Crash::Effect { point, ordinal }) => {
                site.point != Point::AfterAttemptRecord && self.ordinal(site) == *ordinal && site.point == *point
            }
        };
        hit && !self.fired.swap(true, Ordering::SeqCst)
    }
}

impl Hooks for ScriptHooks {
    fn at(&self, site: Site) -> HookFuture<'_, ()> {
        Box::pin(async move {
            if !self.due(&site) {
                return;
            }
            self.killed.store(true, Ordering::SeqCst);
            if site.point == Point::AfterDispatch {
                self.downstream.answer_lost(&site.key);
            }
            self.crashed.notify_one();
            // The host is dead from here: nothing after this point runs.
            std::future::pending::<()>().await;
        })
    }

    fn http(&self, site: Site, request: Outgoing) -> HookFuture<'_, Exchange> {
        Box::pin(self.downstream.http(site.key, site.label, site.occurrence, request))
    }

    fn read(&self, request: Outgoing) -> HookFuture<'_, Exchange> {
        Box::pin(async move { self.downstream.read(&request) })
    }

    fn target(&self) -> HttpTarget {
        self.downstream.script.target()
    }
}
