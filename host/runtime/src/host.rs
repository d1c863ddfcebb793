//! `Host`: the ledger, the runtime and the loaded tools, shared by every caller.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::call::{Call, Outcome};
use crate::capabilities::{Grant, Grants, Sandbox};
use crate::effects::{EffectProvider, HttpTarget, Shared};
use crate::error::{CallError, Error};
use crate::ledger::{Ledger, LedgerAt};
use crate::limits::Limits;
use crate::policy::RetryPolicy;
use crate::policy_file::{PolicyFile, Source};
use crate::runtime::{GuestClock, Runtime, ToolManifest};
use crate::stage::{Entry, Stage};

/// How long a claim is held before another caller may take the operation over.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);

/// Where a host's ledger comes from.
enum LedgerSource {
    At(LedgerAt),
    InMemory,
    Opened(Ledger),
}

/// Configures a [`Host`].
pub struct HostBuilder {
    ledger: LedgerSource,
    targets: HashMap<String, HttpTarget>,
    config: HashMap<String, HashMap<String, String>>,
    providers: HashMap<String, Arc<dyn EffectProvider>>,
    policies: HashMap<String, RetryPolicy>,
    policy_file: PolicyFile,
    grants: HashMap<String, Grants>,
    limits: HashMap<String, Limits>,
    lease: Duration,
    /// PEM certificates trusted for HTTPS on top of the system's roots.
    tls_roots: Vec<Vec<u8>>,
    compile_cache: Option<PathBuf>,
    /// The fingerprint key's file, when it is not beside a ledger file.
    key_file: Option<PathBuf>,
    send_by: Duration,
    /// The test harness's hooks (`oncebox-testing`); `None` for every other host.
    hooks: Option<Arc<dyn crate::effects::hooks::Hooks>>,
    /// What guests' running time is counted on: real time, but in the simulator.
    guest_clock: GuestClock,
}

impl HostBuilder {
    /// A host whose ledger is the redb file at `ledger` (created if missing).
    pub fn new(ledger: impl AsRef<Path>) -> Self {
        Self::at(LedgerAt::File(ledger.as_ref().to_path_buf()))
    }

    /// A host whose ledger is at `ledger`: a redb file, or a PostgreSQL database that other hosts
    /// may share (they then need one key file between them: [`HostBuilder::key_file`]).
    pub fn at(ledger: LedgerAt) -> Self {
        HostBuilder { ledger: LedgerSource::At(ledger), ..Self::in_memory() }
    }

    /// A host on a ledger already opened (say with [`Ledger::open_on`], over a storage backend of
    /// the embedder's or a test's own).
    pub fn on_ledger(ledger: Ledger) -> Self {
        HostBuilder { ledger: LedgerSource::Opened(ledger), ..Self::in_memory() }
    }

    /// A host whose ledger lives in memory: nothing survives the process. For tests and `inspect`.
    pub fn in_memory() -> Self {
        HostBuilder {
            ledger: LedgerSource::InMemory,
            targets: HashMap::new(),
            config: HashMap::new(),
            providers: HashMap::new(),
            policies: HashMap::new(),
            policy_file: PolicyFile::empty(),
            grants: HashMap::new(),
            limits: HashMap::new(),
            lease: DEFAULT_LEASE,
            tls_roots: Vec::new(),
            compile_cache: None,
            key_file: None,
            send_by: crate::effects::DEFAULT_SEND_BY,
            hooks: None,
            guest_clock: GuestClock::Real,
        }
    }

    /// Runs the host under the test harness (`oncebox::testing`): its crash points and its
    /// scripted downstream. For the harness only: a hook sees and answers every request a tool
    /// makes, in place of the downstream.
    #[cfg(feature = "harness")]
    #[doc(hidden)]
    pub fn hooks(mut self, hooks: Arc<dyn crate::effects::hooks::Hooks>) -> Self {
        self.hooks = Some(hooks);
        self
    }

    /// Counts guests' running time against their attempt deadlines on `clock`: for the
    /// whole-system simulator, whose tokio clock is paused, [`GuestClock::Simulated`], so that a
    /// guest spinning past its deadline traps at the deadline on that clock, with the clock moved
    /// on as it spins. Every other host counts real time ([`GuestClock::Real`], the default).
    #[cfg(feature = "harness")]
    #[doc(hidden)]
    pub fn guest_clock(mut self, clock: GuestClock) -> Self {
        self.guest_clock = clock;
        self
    }

    /// Declares what a downstream (`host:port`) does with idempotency keys.
    pub fn http_target(mut self, host: impl Into<String>, target: HttpTarget) -> Self {
        self.targets.insert(host.into(), target);
        self
    }

    /// An operator setting a tool reads through its `config` import.
    pub fn tool_config(mut self, tool: impl Into<String>, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.config.entry(tool.into()).or_default().insert(key.into(), value.into());
        self
    }

    /// Grants `tool` a capability (an HTTP origin, a KV namespace, an outbox topic, a provider, a
    /// directory), in addition to what the policy file grants it. Nothing is granted by default.
    pub fn grant(mut self, tool: impl Into<String>, grant: Grant) -> Self {
        self.grants.entry(tool.into()).or_default().add(grant);
        self
    }

    /// Sets `tool`'s per-attempt limits, over the policy file's `[tools.NAME.limits]`.
    pub fn limits(mut self, tool: impl Into<String>, limits: Limits) -> Self {
        self.limits.insert(tool.into(), limits);
        self
    }

    /// Registers an embedder's effect provider under `name`. Tools still need a grant to call it.
    pub fn provider(mut self, name: impl Into<String>, provider: Arc<dyn EffectProvider>) -> Self {
        self.providers.insert(name.into(), provider);
        self
    }

    /// The operator's policy file: per-tool retry settings and config, per-host key semantics.
    /// Settings given to this builder directly take precedence over the file's.
    pub fn policy_file(mut self, file: PolicyFile) -> Self {
        for (host, target) in file.hosts() {
            self.targets.entry(host).or_insert(target);
        }
        for tool in file.tool_names() {
            let config = self.config.entry(tool.clone()).or_default();
            for (key, value) in file.config(&tool) {
                config.entry(key).or_insert(value);
            }
        }
        self.policy_file = file;
        self
    }

    /// Overrides the retry policy for one tool (over the policy file and the class's defaults).
    /// Checked against the tool's class when the tool is loaded, like the policy file: loading
    /// an irreversible tool with retries or in-doubt resends is refused.
    pub fn retry_policy(mut self, tool: impl Into<String>, policy: RetryPolicy) -> Self {
        self.policies.insert(tool.into(), policy);
        self
    }

    /// Trusts this PEM certificate for HTTPS downstreams, besides the system's roots (a private
    /// CA, or a test server's self-signed certificate).
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_roots.push(pem.into());
        self
    }

    /// Keeps compiled components in `dir` (created if missing), so the next process that loads
    /// the same component with the same engine skips compiling it. Entries are checksummed; a
    /// corrupt or stale one is compiled again, never used.
    pub fn compile_cache(mut self, dir: impl Into<PathBuf>) -> Self {
        self.compile_cache = Some(dir.into());
        self
    }

    /// The file of the fingerprint key (created if missing): required for a ledger that hosts
    /// share, each of which must be given the same file; a file ledger's key is beside it by
    /// default (`LEDGER.key`).
    pub fn key_file(mut self, path: impl AsRef<Path>) -> Self {
        self.key_file = Some(path.as_ref().to_path_buf());
        self
    }

    /// How soon after its write-ahead an effect must leave, or be left in doubt unsent (default
    /// [`crate::DEFAULT_SEND_BY`]): a reconcile's settle window counts from there, so that a host
    /// paused between the two never sends after another host reconciled the step.
    pub fn send_deadline(mut self, send_by: Duration) -> Self {
        self.send_by = send_by;
        self
    }

    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Opens the ledger (recovering what a stopped host left) and starts the engine.
    pub async fn build(self) -> Result<Host, Error> {
        let ledger = match self.ledger {
            LedgerSource::Opened(ledger) => ledger,
            LedgerSource::InMemory => Ledger::in_memory()?,
            LedgerSource::At(at) => at.open().await?,
        };
        let keying = match (&self.key_file, ledger.path()) {
            (Some(file), _) => crate::secret::load_or_create(file)?,
            (None, name) if ledger.is_shared() => {
                return Err(crate::secret::KeyFileError {
                    path: name.to_path_buf(),
                    reason: "no key file given, and hosts that share a ledger need one between them: give every \
                             host the same file (HostBuilder::key_file, or ONCEBOX_KEY_FILE for the CLI)"
                        .into(),
                }
                .into());
            }
            // The fingerprint key lives beside a ledger file (created with it), and dies with a
            // ledger in memory.
            (None, path) if path == Path::new(":memory:") => crate::secret::random()?,
            (None, path) => crate::secret::load_or_create(&crate::secret::beside(path))?,
        };
        ledger.bind_key(&keying.ids()).await?;
        let notifier =
            self.policy_file.notify().map(|settings| Arc::new(crate::notify::Notifier::new(ledger.clone(), settings)));
        let shared = Arc::new(Shared {
            notifier,
            ledger,
            keying,
            http: crate::http_client::build(&self.tls_roots)?,
            targets: crate::effects::Targets { by_host: self.targets },
            providers: self.providers,
            hooks: self.hooks,
            send_by: self.send_by,
        });
        Ok(Host {
            inner: Arc::new(Inner {
                stage: Stage {
                    runtime: Runtime::new(self.compile_cache)?.with_guest_clock(self.guest_clock),
                    shared,
                    lease: self.lease,
                    owner: format!("{}-{}", std::process::id(), crate::clock::now_ms()),
                },
                tools: RwLock::new(HashMap::new()),
                config: RwLock::new(self.config),
                overrides: self.policies,
                policy_file: self.policy_file,
                grants: self.grants,
                limits: self.limits,
            }),
        })
    }
}

/// A host for tools. Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct Host {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    stage: Stage,
    /// One entry per loaded tool; a call takes its entry under the read lock and then reads it
    /// without any.
    tools: RwLock<HashMap<String, Arc<Entry>>>,
    /// Operator config by tool, as the builder and `set_tool_config` give it.
    config: RwLock<HashMap<String, HashMap<String, String>>>,
    /// Policies the embedder set in code; they win over the file.
    overrides: HashMap<String, RetryPolicy>,
    policy_file: PolicyFile,
    /// Grants and limits the embedder set in code, by tool; merged with the file's at load.
    grants: HashMap<String, Grants>,
    limits: HashMap<String, Limits>,
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let stage = &self.inner.stage;
        f.debug_struct("Host").field("ledger", &stage.shared.ledger).field("owner", &stage.owner).finish()
    }
}

impl Host {
    pub fn builder(ledger: impl AsRef<Path>) -> HostBuilder {
        HostBuilder::new(ledger)
    }

    /// A host whose ledger lives in memory (see [`HostBuilder::in_memory`]).
    pub fn builder_in_memory() -> HostBuilder {
        HostBuilder::in_memory()
    }

    /// Adds operator settings for a tool (the CLI learns the tool's name only after loading it).
    pub fn set_tool_config(&self, tool: &str, pairs: impl IntoIterator<Item = (String, String)>) {
        let mut config = self.inner.config.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        let merged = config.entry(tool.to_string()).or_default();
        merged.extend(pairs);
        let merged = Arc::new(merged.clone());
        // A loaded tool's entry is replaced whole: a call in flight keeps the entry it started with.
        let mut tools = self.inner.tools.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(entry) = tools.get(tool) {
            let entry = Entry { tool: entry.tool.clone(), policy: entry.policy.clone(), config: merged };
            tools.insert(tool.to_string(), Arc::new(entry));
        }
    }

    /// A loaded tool's imports and exports, as the component declares them.
    pub fn interface(&self, tool: &str) -> Option<(Vec<String>, Vec<String>)> {
        self.entry(tool).ok().map(|e| (e.tool.imports.clone(), e.tool.exports.clone()))
    }

    /// Loads and verifies a component; refuses a second tool with the same name, and a policy the
    /// tool's class forbids. The tool gets what the policy file and the builder grant it.
    pub async fn load(&self, path: impl AsRef<Path>) -> Result<ToolManifest, Error> {
        self.load_granting(path, &[]).await
    }

    /// Like [`Host::load`], granting the tool `extra` too, whatever its name turns out to be (the
    /// CLI's `--grant`).
    pub async fn load_granting(&self, path: impl AsRef<Path>, extra: &[Grant]) -> Result<ToolManifest, Error> {
        self.install(path.as_ref(), extra, false).await
    }

    /// Compiles the component at `path` into the compile cache without loading it (`oncebox
    /// compile`; a server's first scan, all of a directory's at once): the load that follows, in
    /// this process or the next one with the same cache directory, takes it from there. Answers
    /// its digest (`sha256:HEX`) and where it came from. Refuses what loading refuses before
    /// compiling (not a component, an import outside the contract).
    pub async fn compile(&self, path: impl AsRef<Path>) -> Result<(String, crate::Origin), Error> {
        let compiled = self.inner.stage.runtime.compile(path.as_ref()).await?;
        Ok((compiled.digest, compiled.origin))
    }

    /// Loads a component again after its file changed (a server watching its directory): a tool of
    /// the same name loaded from the same path is replaced; a call in flight keeps the one it
    /// started with. A tool of that name from another path is still a duplicate.
    pub async fn reload(&self, path: impl AsRef<Path>) -> Result<ToolManifest, Error> {
        self.install(path.as_ref(), &[], true).await
    }

    /// Stops offering a loaded tool; calls in flight finish with it. False if none was loaded.
    pub fn unload(&self, tool: &str) -> bool {
        let mut tools = self.inner.tools.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        tools.remove(tool).is_some()
    }

    /// Every loaded tool's manifest and the file it came from, by name.
    pub fn tools(&self) -> Vec<(ToolManifest, PathBuf)> {
        let tools = self.inner.tools.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut listed: Vec<_> = tools.values().map(|e| (e.tool.manifest.clone(), e.tool.path.clone())).collect();
        listed.sort_by(|a, b| a.0.name.cmp(&b.0.name));
        listed
    }

    async fn install(&self, path: &Path, extra: &[Grant], replace: bool) -> Result<ToolManifest, Error> {
        let stage = &self.inner.stage;
        let mut tool = stage.runtime.load(path, stage.shared.clone()).await?;
        let manifest = tool.manifest.clone();
        let name = &manifest.name;
        let mut grants = self.inner.policy_file.grants(name);
        if let Some(granted) = self.inner.grants.get(name) {
            grants.merge(granted);
        }
        for grant in extra {
            grants.add(grant.clone());
        }
        let limits = self.inner.limits.get(name).copied().unwrap_or_else(|| self.inner.policy_file.limits(name));
        crate::runtime::check_grants(&tool, &grants)?;
        tool.sandbox = Arc::new(Sandbox { tool: name.clone(), grants, limits });
        let policy = match self.inner.overrides.get(&manifest.name) {
            Some(policy) => {
                // The builder passes the same class check as the policy file.
                policy.check(manifest.class).map_err(|violation| Error::PolicyRefused {
                    tool: manifest.name.clone(),
                    class: manifest.class,
                    violation,
                })?;
                policy.clone()
            }
            None => self.inner.policy_file.effective(&manifest.name, manifest.class)?.policy,
        };
        let config = {
            let config = self.inner.config.read().unwrap_or_else(|poisoned| poisoned.into_inner());
            Arc::new(config.get(name).cloned().unwrap_or_default())
        };
        let mut tools = self.inner.tools.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(existing) = tools.get(&manifest.name)
            && !(replace && existing.tool.path == tool.path)
        {
            let existing = existing.tool.path.display().to_string();
            return Err(Error::DuplicateTool { name: manifest.name, existing });
        }
        tools.insert(manifest.name.clone(), Arc::new(Entry { tool: Arc::new(tool), policy, config }));
        Ok(manifest)
    }

    /// Runs a call through the pipeline of DESIGN section 4.
    pub async fn call(&self, call: Call) -> Result<Outcome, CallError> {
        let entry = self.entry(&call.tool)?;
        for (what, id) in [("run", &call.run_id), ("step", &call.step_id)] {
            if let Some(reason) = id.as_deref().and_then(|id| crate::keys::id_refused(what, id)) {
                return Err(CallError::InvalidId { reason });
            }
        }
        // Only the saga runs a compensation (`saga.rs`, straight through the pipeline): a caller's
        // step under that name would count as the undo of a step nothing undid.
        if let Some(step_id) = call.step_id.as_deref().filter(|s| s.starts_with(crate::keys::COMPENSATION_PREFIX)) {
            return Err(CallError::ReservedStep { step_id: step_id.to_string() });
        }
        crate::pipeline::execute(&self.inner.stage, &entry, call).await
    }

    /// Asks the tool's authority what became of a step whose outcome is unknown. Takes the same
    /// call (the ledger keeps the args redacted; the tool needs them whole).
    pub async fn reconcile(&self, call: Call) -> Result<crate::Reconciliation, CallError> {
        let entry = self.entry(&call.tool)?;
        crate::reconcile::reconcile(&self.inner.stage, &entry, call).await
    }

    /// Records a person's word that they undid step `operation_key` by hand (`saga::undone_by_hand`):
    /// the saga then counts the step undone and dispatches nothing for it.
    pub async fn undone_by_hand(
        &self,
        operation_key: &str,
        by: &str,
        note: Option<&str>,
    ) -> Result<crate::saga::UndoneByHand, CallError> {
        crate::saga::undone_by_hand(self.ledger(), &self.inner.stage.shared.keying, operation_key, by, note).await
    }

    /// Settles an unknown operation by a person's word: `effect_key` names the effect in doubt
    /// (needed when there are several), `by` who decides and `note` why; both are recorded.
    pub async fn resolve(
        &self,
        operation_key: &str,
        effect_key: Option<&str>,
        resolution: &crate::ledger::Resolution,
        by: &str,
        note: Option<&str>,
    ) -> Result<Outcome, CallError> {
        let keying = &self.inner.stage.shared.keying;
        crate::reconcile::settle(self.ledger(), keying, operation_key, effect_key, resolution, by, note).await
    }

    /// Reconciles every unknown operation of a run whose tool is loaded (`oncebox reconcile --run`).
    pub async fn reconcile_run(&self, run_id: &str) -> Result<Vec<crate::reconcile::RunReconciliation>, CallError> {
        let tools = |name: &str| self.entry(name).ok();
        crate::reconcile::reconcile_run(&self.inner.stage, &tools, run_id, None).await
    }

    /// Reconciles one unknown operation, by its key, from its record (`oncebox reconcile
    /// --operation KEY`). `None` if there is no such operation.
    pub async fn reconcile_operation(
        &self,
        operation_key: &str,
    ) -> Result<Option<crate::reconcile::RunReconciliation>, CallError> {
        let Some(op) = self.ledger().operation(operation_key).await? else {
            return Ok(None);
        };
        let tools = |name: &str| self.entry(name).ok();
        let answers =
            crate::reconcile::reconcile_run(&self.inner.stage, &tools, &op.run_id, Some(operation_key)).await?;
        Ok(answers.into_iter().next())
    }

    /// Undoes a run's completed compensatable steps (see `saga.rs`).
    /// Compensates run `run_id` (`saga`); a person is told (`[notify]`) when it cannot go on.
    pub async fn compensate(&self, run_id: &str) -> Result<crate::saga::SagaReport, CallError> {
        let tools = |name: &str| self.entry(name).ok();
        let report = crate::saga::compensate(&self.inner.stage, &tools, run_id).await?;
        if matches!(report.state, crate::saga::SagaState::Blocked | crate::saga::SagaState::Outstanding)
            && let Some(notifier) = self.notifier()
        {
            notifier.notice_logged(crate::notify::Event::CompensationStuck(&report)).await;
        }
        Ok(report)
    }

    /// How long this host's claims last unless renewed (`HostBuilder::lease`).
    pub fn lease(&self) -> Duration {
        self.inner.stage.lease
    }

    /// Who tells a person about approvals, unknowns and stuck compensations (`[notify]`).
    pub fn notifier(&self) -> Option<&crate::notify::Notifier> {
        self.inner.stage.shared.notifier.as_deref()
    }

    /// Approves or rejects the request for approval of `operation_key`, bound to `fingerprint`
    /// and to whatever component the request names when the decision lands. An embedder that
    /// shows the request to a person decides with [`Host::decide_on`] and the digest it showed
    /// (as the server and the CLI do), so that a tool replaced meanwhile is not approved unseen.
    pub async fn decide(
        &self,
        operation_key: &str,
        fingerprint: &str,
        decision: crate::approvals::Decision,
        by: &str,
        note: Option<&str>,
    ) -> Result<crate::ledger::ApprovalRecord, CallError> {
        crate::approvals::decide(
            self.ledger(),
            Ok(&self.inner.stage.shared.keying),
            operation_key,
            fingerprint,
            decision,
            by,
            note,
        )
        .await
    }

    /// Like [`Host::decide`], bound to the component the person saw the request name as well
    /// (its digest): refused if the request now names another (see [`crate::approvals::decide_on`]).
    pub async fn decide_on(
        &self,
        operation_key: &str,
        fingerprint: &str,
        component: Option<&str>,
        decision: crate::approvals::Decision,
        by: &str,
        note: Option<&str>,
    ) -> Result<crate::ledger::ApprovalRecord, CallError> {
        crate::approvals::decide_on(
            self.ledger(),
            Ok(&self.inner.stage.shared.keying),
            operation_key,
            fingerprint,
            component,
            decision,
            by,
            note,
        )
        .await
    }

    /// A request for approval with its sealed sensitive values opened (for the approver).
    pub fn reveal(&self, record: &crate::ledger::ApprovalRecord) -> Result<serde_json::Value, String> {
        crate::approvals::reveal(record, &self.inner.stage.shared.keying)
    }

    /// Removes records that expired `retention` ago (see `retention.rs`).
    pub async fn gc(&self, retention: Duration) -> Result<crate::retention::GcReport, crate::LedgerError> {
        crate::retention::gc(self.ledger(), retention, self.ledger().now_ms()).await
    }

    /// Loads every `.wasm` in `dir` (in name order), then checks that each `compensated-by` names a
    /// loaded tool whose input schema has the args the mapping makes. Returns the manifests.
    pub async fn load_dir(&self, dir: impl AsRef<Path>) -> Result<Vec<ToolManifest>, Error> {
        let dir = dir.as_ref();
        let io = |e: std::io::Error| Error::Load(crate::LoadError::Io { path: dir.to_path_buf(), error: e });
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(io)?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|path| path.extension().is_some_and(|ext| ext == "wasm"))
            .collect();
        paths.sort();
        let mut manifests = Vec::new();
        for path in paths {
            manifests.push(self.load(&path).await?);
        }
        for manifest in &manifests {
            self.check_compensation(manifest)?;
        }
        Ok(manifests)
    }

    /// A compensatable tool's `compensated-by` must be loaded, and accept the args its mapping makes.
    pub fn check_compensation(&self, manifest: &ToolManifest) -> Result<(), Error> {
        let Some(undo) = &manifest.compensated_by else {
            return Ok(());
        };
        let path = self.entry(&manifest.name).map(|e| e.tool.path.clone()).unwrap_or_default();
        let bad = |reason: String| Error::Load(crate::LoadError::BadManifest { path: path.clone(), reason });
        let Some(compensation) = self.manifest(undo) else {
            return Err(bad(format!(
                "`{}` is compensated by `{undo}`, which is not loaded (is it in the directory?)",
                manifest.name
            )));
        };
        if let Some(properties) = compensation.input_schema.get("properties").and_then(|p| p.as_object()) {
            for (arg, _) in &manifest.compensation_args {
                if !properties.contains_key(arg) {
                    return Err(bad(format!(
                        "`{}`'s compensation-args makes `{arg}`, which `{undo}`'s input schema does not have",
                        manifest.name
                    )));
                }
            }
        }
        Ok(())
    }

    /// Creates one instance of a loaded tool and drops it, running nothing: the cost every attempt
    /// pays before the guest runs (for benchmarks, and to warm the instance pool).
    pub async fn instantiate(&self, tool: &str) -> Result<(), Error> {
        let entry = self.entry(tool)?;
        let stage = &self.inner.stage;
        let effects = crate::effects::EffectCtx::new(
            stage.shared.clone(),
            entry.tool.sandbox.clone(),
            entry.config.clone(),
            None,
        );
        stage.runtime.instantiate(&entry.tool, effects).await.map_err(|e| Error::Load(crate::LoadError::Engine(e)))
    }

    /// What a loaded tool is granted, and its limits.
    pub fn sandbox(&self, tool: &str) -> Option<Sandbox> {
        self.entry(tool).ok().map(|e| (*e.tool.sandbox).clone())
    }

    /// A loaded tool's effective retry policy, and where each value came from.
    pub fn policy(&self, tool: &str) -> Option<crate::policy_file::Effective> {
        let manifest = self.manifest(tool)?;
        let mut effective = self.inner.policy_file.effective(tool, manifest.class).ok()?;
        if let Some(policy) = self.inner.overrides.get(tool) {
            effective.policy = policy.clone();
            effective.sources = effective.sources.into_iter().map(|(field, _)| (field, Source::Embedder)).collect();
        }
        Some(effective)
    }

    pub fn ledger(&self) -> &Ledger {
        &self.inner.stage.shared.ledger
    }

    /// A relay for the outbox topics of the host's policy file (`[outbox.TOPIC]`), over the
    /// host's ledger and HTTP client: run it beside the calls (`Relay::run`), and it wakes for
    /// every message they enqueue.
    pub fn outbox_relay(&self) -> Result<crate::Relay, crate::outbox::RelayError> {
        let shared = &self.inner.stage.shared;
        let topics = self.inner.policy_file.outbox_endpoints();
        crate::Relay::hooked(shared.ledger.clone(), shared.http.clone(), topics, shared.hooks.clone())
    }

    /// The policy file's `[reconciler]`, or the defaults when it has none.
    pub fn reconciler_settings(&self) -> oncebox_core::reconcile_schedule::Settings {
        self.inner.policy_file.reconciler()
    }

    /// Whether `tool` is loaded and exports `reconcile`: the reconciler asks only about these.
    pub(crate) fn reconciles(&self, tool: &str) -> bool {
        self.entry(tool).is_ok_and(|e| e.tool.exports.iter().any(|export| export == crate::runtime::RECONCILE_EXPORT))
    }

    pub fn manifest(&self, tool: &str) -> Option<ToolManifest> {
        self.entry(tool).ok().map(|e| e.tool.manifest.clone())
    }

    /// The digest of a loaded tool's component (`sha256:HEX` of its file as loaded): what an
    /// approval of a call of it is bound to.
    pub fn digest(&self, tool: &str) -> Option<String> {
        self.entry(tool).ok().map(|e| e.tool.digest.clone())
    }

    fn entry(&self, name: &str) -> Result<Arc<Entry>, CallError> {
        let tools = self.inner.tools.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        tools.get(name).cloned().ok_or_else(|| {
            let mut loaded: Vec<_> = tools.keys().cloned().collect();
            loaded.sort();
            CallError::UnknownTool { tool: name.to_string(), loaded: loaded.join(", ") }
        })
    }
}
