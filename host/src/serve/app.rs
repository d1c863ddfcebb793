//! What every front door of `oncebox serve` shares: the host, the calls in flight, the metrics,
//! the operator's token. HTTP, MCP and the console all call tools through [`App::call`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::{BoxFuture, Shared};
use oncebox::{Call, Host, Outcome};
use tokio::sync::Notify;

use super::auth::Auth;
use super::error::ApiError;
use super::metrics::Metrics;
use super::reload::Loaded;

/// How a call was answered, for the metrics and the `oncebox-source` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// This request ran the pipeline and its attempts.
    Fresh,
    /// The same call was already running in this server: this request shares its answer.
    Deduplicated,
    /// Answered from the ledger's record, nothing ran.
    Replayed,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Fresh => "fresh",
            Source::Deduplicated => "deduplicated",
            Source::Replayed => "replayed",
        }
    }
}

/// One call as a front door received it: identity from the orchestrator (never the model).
#[derive(Debug, Clone)]
pub struct CallRequest {
    pub run_id: Option<String>,
    pub step_id: Option<String>,
    pub tool: String,
    /// A JSON object.
    pub args: serde_json::Value,
    pub wait: Option<Duration>,
}

type Answer = Result<Outcome, Arc<ApiError>>;
type Running = Shared<BoxFuture<'static, Answer>>;

pub struct App {
    pub host: Host,
    pub auth: Auth,
    pub metrics: Metrics,
    /// What the tools directory holds, and what failed to load.
    pub loaded: Loaded,
    /// Where the console is reached, for links in answers (`http://127.0.0.1:7420`).
    #[expect(dead_code, reason = "the console's and MCP's links, which come next")]
    pub base_url: String,
    stopping: AtomicBool,
    /// Cancelled when the server stops taking calls: the HTTP server stops accepting and closes
    /// its connections once their requests are answered; MCP sessions end.
    pub shutdown: tokio_util::sync::CancellationToken,
    in_flight: AtomicUsize,
    idle: Notify,
    /// The calls running now, by their identity and exact args: a second request for the same
    /// call shares the first one's answer instead of meeting its claim.
    running: Mutex<HashMap<String, Running>>,
}

impl App {
    pub fn new(host: Host, auth: Auth, loaded: Loaded, base_url: String) -> Arc<App> {
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
        })
    }

    /// Runs a call to the end on a task of its own: a client that goes away does not cut an attempt
    /// short, and its re-sent request finds the answer recorded (or shares the one still running).
    pub async fn call(self: &Arc<Self>, request: CallRequest) -> Result<(Outcome, Source), Arc<ApiError>> {
        if self.stopping.load(Ordering::SeqCst) {
            return Err(Arc::new(ApiError::Stopping));
        }
        if !request.args.is_object() {
            return Err(Arc::new(ApiError::BadRequest("`args` must be a JSON object".into())));
        }
        let args = request.args.to_string();
        let tool = request.tool.clone();
        let call = match (request.run_id, request.step_id) {
            (Some(run), Some(step)) => Call::step(run, step, &request.tool, args),
            (None, None) => Call::unrecorded(&request.tool, args),
            _ => return Err(Arc::new(ApiError::BadRequest("`run_id` and `step_id` go together".into()))),
        };
        let call = match request.wait {
            Some(wait) => call.waiting(wait),
            None => call,
        };
        // Only a call with a run and a step is the same call when sent twice; two unrecorded reads
        // are two reads.
        let recorded = call.run_id.is_some();
        let identity = serde_json::json!([call.run_id, call.step_id, call.tool, call.args]).to_string();
        let (running, joined) = {
            let mut running = self.running.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            match running.get(&identity) {
                Some(shared) if recorded => (shared.clone(), true),
                _ => {
                    // The task removes the entry when it ends, under this same lock: never before it
                    // is inserted, and even if every requester has gone away.
                    let shared = self.start(call, identity.clone()).boxed().shared();
                    if recorded {
                        running.insert(identity.clone(), shared.clone());
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

    /// Spawns the call and counts it in flight until it ends.
    fn start(
        self: &Arc<Self>,
        call: Call,
        identity: String,
    ) -> impl std::future::Future<Output = Answer> + Send + 'static {
        let app = self.clone();
        app.in_flight.fetch_add(1, Ordering::SeqCst);
        let task = tokio::spawn(async move {
            let tool = call.tool.clone();
            let answer = app.host.call(call).await.map_err(|e| Arc::new(ApiError::from_call(e, &tool)));
            app.running.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(&identity);
            if app.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
                app.idle.notify_waiters();
            }
            answer
        });
        async move { task.await.unwrap_or_else(|e| Err(Arc::new(ApiError::Internal(format!("the call's task: {e}"))))) }
    }

    /// Stops taking calls; those running may finish.
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
