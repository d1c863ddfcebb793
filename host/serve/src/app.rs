//! What every front door of `oncebox serve` shares: the host, the calls in flight, the metrics,
//! the operator's token. HTTP, MCP and the console all call tools through [`App::call`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::{BoxFuture, Shared};
use oncebox_runtime::{Call, Host, Outcome, TraceContext};
use tokio::sync::Notify;

use super::auth::Auth;
use super::error::{ApiError, NOT_A_FAILURE};
use super::metrics::{Metrics, Source};
use super::reload::Loaded;

/// One call as a front door received it: identity from the orchestrator (never the model).
#[derive(Debug, Clone)]
pub struct CallRequest {
    pub run_id: Option<String>,
    pub step_id: Option<String>,
    pub tool: String,
    /// A JSON object.
    pub args: serde_json::Value,
    pub wait: Option<Duration>,
    /// The caller's W3C trace context (`traceparent`/`tracestate`: HTTP headers, MCP `_meta`).
    /// Not part of the call's identity: a second request that joins a running call shares its
    /// answer, and its trace.
    pub trace: Option<TraceContext>,
}

type Answer = Result<Outcome, Arc<ApiError>>;
type SharedAnswer = Shared<BoxFuture<'static, Answer>>;

/// How many calls may run at once by default; more are refused (503) before anything is recorded.
pub const MAX_CALLS: usize = 256;

pub struct App {
    pub(crate) host: Host,
    pub(crate) auth: Auth,
    pub(crate) metrics: Metrics,
    /// What the tools directory holds, and what failed to load.
    pub(crate) loaded: Loaded,
    /// Where the console is reached, for links in answers (`http://127.0.0.1:7420`).
    pub(crate) base_url: String,
    stopping: AtomicBool,
    /// Cancelled when the server stops taking calls: the HTTP server stops accepting and closes
    /// its connections once their requests are answered; MCP sessions end.
    pub(crate) shutdown: tokio_util::sync::CancellationToken,
    in_flight: AtomicUsize,
    idle: Notify,
    /// The calls running now, by their identity and exact args: a second request for the same
    /// call shares the first one's answer instead of meeting its claim.
    running: Mutex<HashMap<String, SharedAnswer>>,
    permits: Arc<tokio::sync::Semaphore>,
}

impl App {
    /// The server for an agent that started it over stdio: no HTTP request ever reaches it.
    ///
    /// Calls wait for `loaded`'s first scan ([`Loaded::ready`]): run [`crate::watch`] (or
    /// [`Loaded::scan`] once) beside it, as `oncebox serve` does.
    pub fn for_stdio(host: Host, token: String, loaded: Loaded, max_calls: usize) -> Arc<App> {
        App::new(host, Auth::new(token, None, None), loaded, String::new(), max_calls)
    }

    /// The server for HTTP at `addr`, the address it listens on, reached at `public_url` when
    /// given (calls wait for `loaded`'s first scan, as over stdio). Who may do what is judged from these two (`auth.rs`), so that nothing else can tell
    /// it that a server listening beyond loopback is on loopback. `caller`: a second token, that
    /// may call, read and reconcile but decide nothing, for agents beyond loopback.
    pub fn for_http(
        host: Host,
        token: String,
        caller: Option<String>,
        addr: std::net::SocketAddr,
        public_url: Option<&url::Url>,
        loaded: Loaded,
        max_calls: usize,
    ) -> Arc<App> {
        let base_url = public_url.map_or_else(|| format!("http://{addr}"), |url| url.origin().ascii_serialization());
        App::new(host, Auth::new(token, Some(addr), public_url).with_caller(caller), loaded, base_url, max_calls)
    }

    fn new(host: Host, auth: Auth, loaded: Loaded, base_url: String, max_calls: usize) -> Arc<App> {
        // The links in notifications point here, unless the policy file's `[notify]` says where.
        if let Some(notifier) = host.notifier() {
            notifier.console_at(&base_url);
        }
        Arc::new(App {
            host,
            auth,
            metrics: Metrics::default(),
            loaded,
            base_url,
            stopping: AtomicBool::new(false),
            shutdown: tokio_util::sync::CancellationToken::new(),
            in_flight: AtomicUsize::new(0),
            idle: Notify::new(),
            running: Mutex::new(HashMap::new()),
            permits: Arc::new(tokio::sync::Semaphore::new(max_calls.max(1))),
        })
    }

    /// Runs a call to the end on a task of its own: a client that goes away does not cut an attempt
    /// short, and its re-sent request finds the answer recorded (or shares the one still running).
    pub async fn call(self: &Arc<Self>, request: CallRequest) -> Result<(Outcome, Source), Arc<ApiError>> {
        // Counted before the check, so that a stop that finds nothing in flight admits nothing after.
        let _admitted = InFlight::enter(self);
        if self.stopping.load(Ordering::SeqCst) {
            return Err(Arc::new(ApiError::Stopping));
        }
        let call = shape(request).map_err(Arc::new)?;
        // A server still compiling its tools answers once they are loaded, not "no such tool".
        self.loaded.ready().await;
        let tool = call.tool.clone();
        // A tool whose compensation is not loaded takes no new step; a step it already took is
        // answered from its record as any other.
        if let Some(why) = self.loaded.unserved(&tool)
            && !self.recorded(&call).await.map_err(Arc::new)?
        {
            return Err(Arc::new(ApiError::Conflict(why)));
        }
        // Only a call with a run and a step is the same call when sent twice; two unrecorded reads
        // are two reads. `wait` is part of it: a caller that waits must not share an answer given
        // at once, nor one that does not wait be held by another's wait.
        let recorded = call.run_id.is_some();
        let identity =
            serde_json::json!([call.run_id, call.step_id, call.tool, call.args, call.wait.map(|w| w.as_millis())])
                .to_string();
        let (running, joined) = {
            let mut running = self.running.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            match running.get(&identity) {
                Some(shared) if recorded => (shared.clone(), true),
                _ => {
                    // Refused before anything is recorded when too many calls run already.
                    let permit = self.permits.clone().try_acquire_owned().map_err(|_| Arc::new(ApiError::Busy))?;
                    // The task removes the entry when it ends (or panics), under this same lock:
                    // never before it is inserted, and even if every requester has gone away.
                    let shared = self.start(call, identity.clone(), permit).boxed().shared();
                    if recorded {
                        running.insert(identity, shared.clone());
                    }
                    (shared, false)
                }
            }
        };
        let mut outcome = running.await?;
        let source = if joined {
            outcome.replayed = true;
            Source::Deduplicated
        } else if outcome.replayed {
            Source::Replayed
        } else {
            Source::Fresh
        };
        self.metrics.call(&tool, &outcome, source);
        Ok((outcome, source))
    }

    /// Whether the call's step is on record (any state): its answer is the ledger's.
    async fn recorded(&self, call: &Call) -> Result<bool, ApiError> {
        let (Some(run), Some(step)) = (call.run_id.as_deref(), call.step_id.as_deref()) else {
            return Ok(false);
        };
        let key = oncebox_runtime::keys::operation_key(run, step, &call.tool);
        Ok(self.host.ledger().operation(&key).await?.is_some())
    }

    /// Spawns the call; it counts in flight, and holds its entry in `running`, until it ends.
    fn start(
        self: &Arc<Self>,
        call: Call,
        identity: String,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) -> impl std::future::Future<Output = Answer> + Send + 'static {
        let running = Running { app: self.clone(), identity, _in_flight: InFlight::enter(self), _permit: permit };
        let task = tokio::spawn(async move {
            let tool = call.tool.clone();
            let answer = running.app.host.call(call).await.map_err(|e| Arc::new(ApiError::from_call(e, &tool)));
            drop(running);
            answer
        });
        async move {
            task.await.unwrap_or_else(|e| {
                tracing::error!(error = %e, "a call's task ended abnormally");
                Err(Arc::new(ApiError::Internal(format!("the call's task ended abnormally ({e}); {}", NOT_A_FAILURE))))
            })
        }
    }

    /// Stops taking calls; those running may finish.
    /// The tools directory as the server loaded it.
    pub fn loaded(&self) -> &Loaded {
        &self.loaded
    }

    /// Where the console is reached (`http://127.0.0.1:7420`, or the public URL's origin).
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// Cancelled when the server stops taking calls.
    pub fn shutdown(&self) -> tokio_util::sync::CancellationToken {
        self.shutdown.clone()
    }

    pub fn stop_taking_calls(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.shutdown.cancel();
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Waits until no call is running, or `grace` has passed; true if none is.
    pub async fn drained(&self, grace: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + grace;
        loop {
            let idle = self.idle.notified();
            if self.in_flight() == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                return self.in_flight() == 0;
            }
        }
    }
}

/// Checks a request's identity and args and makes the library's call of it.
fn shape(request: CallRequest) -> Result<Call, ApiError> {
    if !request.args.is_object() {
        return Err(ApiError::BadRequest("`args` must be a JSON object".into()));
    }
    // Refused before the ledger is read or anything logged (the host asks the same rule again).
    // An empty id is an unset template variable, which must not fold many intents into one step.
    for (what, id) in [("run", &request.run_id), ("step", &request.step_id)] {
        if let Some(reason) = id.as_deref().and_then(|id| oncebox_runtime::keys::id_refused(what, id)) {
            return Err(ApiError::BadRequest(reason));
        }
    }
    let args = request.args.to_string();
    let call = match (request.run_id, request.step_id) {
        (Some(run), Some(step)) => Call::step(run, step, &request.tool, args),
        (None, None) => Call::unrecorded(&request.tool, args),
        _ => return Err(ApiError::BadRequest("`run_id` and `step_id` go together".into())),
    };
    let call = call.traced(request.trace);
    Ok(match request.wait {
        Some(wait) => call.waiting(wait),
        None => call,
    })
}

/// One request or task in flight, counted until dropped (also by a panic's unwinding).
struct InFlight(Arc<App>);

impl InFlight {
    fn enter(app: &Arc<App>) -> InFlight {
        app.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(app.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// A running call's hold on its entry in `App::running`, released when its task ends or panics:
/// a resend then finds the ledger's record instead of a dead answer.
struct Running {
    app: Arc<App>,
    identity: String,
    _in_flight: InFlight,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.app.running.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(&self.identity);
    }
}
