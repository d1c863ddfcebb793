//! The downstream, in process: a payments, refunds and fulfillments service with idempotency
//! keys, and an inventory to read, that lies the ways real ones do (the seed's [`Answer`]s: it
//! commits then errs, commits after the client gave up, loses answers, lags in its lookups,
//! forgets keys after their retention, refuses, rate-limits, answers slowly). It lives across the
//! host's crashes, and its record of what it committed is the truth the checker judges by.
//!
//! It stands in for the network through the host's hooks (`oncebox_runtime::hooks`), so every
//! exchange is still judged by the host's own rule of evidence, and it keeps its contract with
//! the host: it honours keys only if the host is told so, forgets a key no sooner than the
//! retention the host is told, and commits late or shows a commit in a lookup no later than the
//! settle window the host is told.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::{Value, json};

use oncebox_runtime::HttpTarget;
use oncebox_runtime::hooks::{Exchange, Outgoing};

use crate::history::{Event, History};
use crate::plan::{Answer, Downstream, choice, percent};

/// The effect routes, as the example tools post to them.
pub const ROUTES: [&str; 3] = ["payments", "refunds", "fulfillments"];

/// One request that reached the downstream.
#[derive(Debug, Clone)]
pub struct Request {
    pub route: String,
    pub order: String,
    /// Its `Idempotency-Key`.
    pub key: String,
    pub body: Value,
    /// 1 for the first request about this route and order.
    pub nth: u32,
    /// What it met (a replay of a key's commit is `None`).
    pub answer: Option<Answer>,
    pub at_ms: u64,
}

impl Request {
    /// Whether any of it reached the downstream: a refused connection sent nothing (the host's
    /// attempt is recorded all the same).
    pub fn reached(&self) -> bool {
        self.answer != Some(Answer::NotConnected)
    }
}

/// One commit: the work done.
#[derive(Debug, Clone)]
pub struct Commit {
    pub route: String,
    pub order: String,
    pub key: String,
    pub response: Value,
    pub at_ms: u64,
}

/// How the key of a commit a person made at the dashboard begins ([`World::refund_by_hand`]).
const BY_HAND: &str = "by-hand/";

impl Commit {
    /// Whether a person made it at the dashboard, not the host: it counts as a refund, but is no
    /// operation's effect.
    pub fn by_hand(&self) -> bool {
        self.key.starts_with(BY_HAND)
    }
}

/// One outbox message that reached the topic's endpoint (and was taken by it: a 2xx, or an
/// answer lost after it took the message).
#[derive(Debug, Clone)]
pub struct Delivery {
    /// Its `Idempotency-Key` (the message's effect key).
    pub key: String,
    pub order: String,
    pub at_ms: u64,
}

#[derive(Debug, Default)]
struct KeyState {
    /// When it committed, and its answer.
    committed: Option<(u64, Value)>,
    /// Taken, not yet committed (a late commit on its way).
    pending: bool,
}

#[derive(Debug, Default)]
struct State {
    requests: Vec<Request>,
    commits: Vec<Commit>,
    keys: HashMap<(String, String), KeyState>,
    nth: HashMap<(String, String), u32>,
    lookups: HashMap<String, u32>,
    reads: u32,
    /// Answers that were not a prompt success: faulted requests, failed lookups and reads.
    faults: u64,
    deliveries: Vec<Delivery>,
    /// Per message (key): sends that reached the endpoint.
    sends: HashMap<String, u32>,
}

/// The downstream. Cheap to clone.
#[derive(Clone)]
pub struct World {
    seed: u64,
    settings: Arc<Downstream>,
    state: Arc<Mutex<State>>,
    history: History,
}

/// The origin the tools are configured with and granted; only the hooks ever "reach" it.
pub const ORIGIN: &str = "http://downstream.sim";

impl World {
    pub fn new(seed: u64, settings: Downstream, history: History) -> World {
        World { seed, settings: Arc::new(settings), state: Arc::default(), history }
    }

    /// The history it writes to.
    pub fn history(&self) -> &History {
        &self.history
    }

    /// The seed this world's choices are drawn from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn now(&self) -> u64 {
        crate::clock::world_ms()
    }

    /// What the host is told of this downstream.
    pub fn target(&self) -> HttpTarget {
        HttpTarget {
            honours_keys: self.settings.honours_keys,
            key_retention: Duration::from_millis(self.settings.key_retention_ms),
            timeout: Duration::from_millis(self.settings.timeout_ms),
            settle_window: Duration::from_millis(self.settings.settle_window_ms),
            ..HttpTarget::default()
        }
    }

    /// Every commit, in order.
    pub fn commits(&self) -> Vec<Commit> {
        self.state().commits.clone()
    }

    /// Every outbox message the endpoint took, in the order it took them.
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.state().deliveries.clone()
    }

    /// Every request that reached it, in order.
    pub fn requests(&self) -> Vec<Request> {
        self.state().requests.clone()
    }

    /// Whether a request about `route` and `order` was taken and has not committed yet.
    pub fn pending(&self, route: &str, order: &str) -> bool {
        let state = self.state();
        let keys: Vec<&String> =
            state.requests.iter().filter(|r| r.route == route && r.order == order).map(|r| &r.key).collect();
        keys.iter().any(|key| state.keys.get(&(route.to_string(), (*key).clone())).is_some_and(|k| k.pending))
    }

    /// How many answers were faults.
    pub fn faults(&self) -> u64 {
        self.state().faults
    }

    /// Whether anything is still to commit.
    pub fn any_pending(&self) -> bool {
        self.state().keys.values().any(|k| k.pending)
    }

    /// A key still remembered: committed within its retention, or pending.
    fn remembered(&self, state: &State, route: &str, key: &str, now: u64) -> Option<Result<Value, ()>> {
        let entry = state.keys.get(&(route.to_string(), key.to_string()))?;
        if entry.pending {
            return Some(Err(()));
        }
        let (at, response) = entry.committed.as_ref()?;
        (now < at.saturating_add(self.settings.key_retention_ms)).then(|| Ok(response.clone()))
    }

    /// Answers an effect (a POST with its key).
    pub async fn effect(&self, key: String, request: Outgoing) -> Exchange {
        let Some(route) = route_in(&request.url) else {
            return answered(404, json!({"error": "no such route"}));
        };
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        let order = body.get("order_id").and_then(Value::as_str).unwrap_or_default().to_string();
        let now = self.now();
        let timeout = Duration::from_millis(self.settings.timeout_ms);
        let (answer, nth) = {
            let mut state = self.state();
            let nth = {
                let n = state.nth.entry((route.clone(), order.clone())).or_insert(0);
                *n += 1;
                *n
            };
            let replay = if self.settings.honours_keys { self.remembered(&state, &route, &key, now) } else { None };
            let answer = match replay {
                None => Some(self.settings.answer(self.seed, &route, &order, nth)),
                Some(_) => None,
            };
            state.faults += u64::from(answer.is_some_and(Answer::is_fault));
            state.requests.push(Request {
                route: route.clone(),
                order: order.clone(),
                key: key.clone(),
                body: body.clone(),
                nth,
                answer,
                at_ms: now,
            });
            self.history.push(Event::Dispatch {
                route: route.clone(),
                order: order.clone(),
                nth,
                answer: answer.map_or("replayed for its key".into(), |a| format!("{a:?}")),
            });
            match replay {
                Some(Ok(_))
                    if percent(self.seed, &["resend-refused", &route, &order, &nth.to_string()])
                        < self.settings.resend_refused_pct =>
                {
                    return answered(400, json!({"error": "already processed"}));
                }
                Some(Ok(response)) => return answered(200, response),
                Some(Err(())) => return answered(409, json!({"error": "a request with this key is in flight"})),
                None => {}
            }
            (answer.unwrap_or(Answer::Ok), nth)
        };
        let commit = |state: &mut State| self.commit(state, &route, &order, &key, &body, nth);
        match answer {
            Answer::Ok => answered(200, commit(&mut self.state())),
            Answer::Slow => {
                let response = commit(&mut self.state());
                tokio::time::sleep(timeout / 2).await;
                answered(200, response)
            }
            Answer::CommitThen502 => {
                commit(&mut self.state());
                answered(502, json!({"error": "bad gateway"}))
            }
            Answer::LostResponse => {
                commit(&mut self.state());
                tokio::time::sleep(timeout).await;
                Exchange::SentNoAnswer("the response was lost".into())
            }
            Answer::CommitLate => {
                self.state().keys.entry((route.clone(), key.clone())).or_default().pending = true;
                // Later than the host waits, within the settle window it was told, less the lag of
                // a lookup, so that an empty lookup after the window is the truth.
                let latest = self.settings.settle_window_ms.saturating_sub(self.settings.lookup_lag_ms);
                let earliest = self.settings.timeout_ms + 1;
                let span = latest.saturating_sub(earliest).max(1);
                let after = earliest + choice(self.seed, &["late", &route, &order, &nth.to_string()]) % span;
                let world = self.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(after)).await;
                    let mut state = world.state();
                    state.keys.entry((route.clone(), key.clone())).or_default().pending = false;
                    world.commit(&mut state, &route, &order, &key, &body, nth);
                });
                tokio::time::sleep(timeout).await;
                Exchange::SentNoAnswer("answered after the host's timeout".into())
            }
            Answer::Fail503 => answered(503, json!({"error": "unavailable"})),
            Answer::RateLimited => Exchange::Answered {
                status: 429,
                headers: vec![("retry-after-ms".into(), "20".into())],
                body: br#"{"error":"slow down"}"#.to_vec(),
            },
            Answer::Refused if route == "payments" => answered(402, json!({"error": "card declined"})),
            Answer::Refused => answered(400, json!({"error": "refused"})),
            Answer::NotConnected => Exchange::NotConnected,
        }
    }

    /// The outbox topic's endpoint (`POST /email`): it takes a message, or fails as the seed says
    /// (a refusal is a 503 here: a 4xx stops a topic until a person restarts the relay).
    pub async fn deliver(&self, key: String, request: Outgoing) -> Exchange {
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        let order = body.get("order_id").and_then(Value::as_str).unwrap_or_default().to_string();
        let now = self.now();
        let answer = {
            let mut state = self.state();
            let nth = {
                let n = state.sends.entry(key.clone()).or_insert(0);
                *n += 1;
                *n
            };
            let answer = self.settings.answer(self.seed, "outbox", &order, nth);
            state.faults += u64::from(answer.is_fault());
            if answer.commits() {
                state.deliveries.push(Delivery { key: key.clone(), order: order.clone(), at_ms: now });
            }
            self.history.push(Event::Delivered { order, nth, answer: format!("{answer:?}"), taken: answer.commits() });
            answer
        };
        let timeout = Duration::from_millis(self.settings.timeout_ms);
        match answer {
            Answer::Ok | Answer::Slow => answered(200, json!({"ok": true})),
            Answer::CommitThen502 => answered(502, json!({"error": "bad gateway"})),
            Answer::LostResponse | Answer::CommitLate => {
                tokio::time::sleep(timeout).await;
                Exchange::SentNoAnswer("the response was lost".into())
            }
            Answer::Fail503 | Answer::Refused => answered(503, json!({"error": "unavailable"})),
            Answer::RateLimited => Exchange::Answered {
                status: 429,
                headers: vec![("retry-after-ms".into(), "20".into())],
                body: br#"{"error":"slow down"}"#.to_vec(),
            },
            Answer::NotConnected => Exchange::NotConnected,
        }
    }

    /// Does the work: records the commit and the key's answer.
    fn commit(&self, state: &mut State, route: &str, order: &str, key: &str, body: &Value, nth: u32) -> Value {
        let now = self.now();
        let mut response = body.clone();
        if let Some(fields) = response.as_object_mut() {
            // A real service does not echo a card or an address.
            fields.remove("payment_method");
            fields.remove("address");
            fields.remove("items");
            let prefix = &route[..3];
            fields.insert("id".into(), json!(format!("{prefix}_{order}_{nth}")));
            let status = if route == "fulfillments" { "shipped" } else { "succeeded" };
            fields.insert("status".into(), json!(status));
        }
        state.keys.entry((route.to_string(), key.to_string())).or_default().committed = Some((now, response.clone()));
        state.commits.push(Commit {
            route: route.to_string(),
            order: order.to_string(),
            key: key.to_string(),
            response: response.clone(),
            at_ms: now,
        });
        self.history.push(Event::Commit { route: route.to_string(), order: order.to_string() });
        response
    }

    /// A person refunds `order`'s payment at the dashboard, outside oncebox: a refund committed
    /// under no key of the host's.
    pub fn refund_by_hand(&self, order: &str) {
        let mut state = self.state();
        let nth = {
            let n = state.nth.entry(("refunds".into(), order.into())).or_insert(0);
            *n += 1;
            *n
        };
        let body = json!({ "order_id": order, "by": "a person, at the dashboard" });
        self.commit(&mut state, "refunds", order, &format!("{BY_HAND}{order}/{nth}"), &body, nth);
    }

    /// Answers a read: the inventory, or a lookup by key (reconcile's).
    pub fn read(&self, request: &Outgoing) -> Exchange {
        let path = path_of(&request.url);
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let now = self.now();
        let mut state = self.state();
        match segments.as_slice() {
            ["inventory", sku] => {
                state.reads += 1;
                if percent(self.seed, &["read", sku, &state.reads.to_string()]) < self.settings.read_fail_pct {
                    state.faults += 1;
                    return answered(503, json!({"error": "unavailable"}));
                }
                answered(200, json!({"sku": sku, "available": 100}))
            }
            [route, "by-key", key] => {
                let n = {
                    let n = state.lookups.entry((*key).to_string()).or_insert(0);
                    *n += 1;
                    *n
                };
                if percent(self.seed, &["lookup", key, &n.to_string()]) < self.settings.lookup_fail_pct {
                    state.faults += 1;
                    return answered(503, json!({"error": "unavailable"}));
                }
                let seen =
                    state.keys.get(&((*route).to_string(), (*key).to_string())).and_then(|k| k.committed.clone());
                // It forgets a key (in lookups too) only where it is said to honour keys: the
                // host is told of a retention only for such a downstream.
                let remembered =
                    |at: u64| !self.settings.honours_keys || now < at.saturating_add(self.settings.key_retention_ms);
                match seen {
                    Some((at, response)) if now >= at + self.settings.lookup_lag_ms && remembered(at) => {
                        answered(200, response)
                    }
                    _ => answered(404, json!({"error": "no such key"})),
                }
            }
            _ => answered(404, json!({"error": "no such route"})),
        }
    }
}

fn answered(status: u16, body: Value) -> Exchange {
    Exchange::Answered { status, headers: Vec::new(), body: body.to_string().into_bytes() }
}

fn path_of(url: &str) -> &str {
    url.strip_prefix(ORIGIN).unwrap_or(url)
}

/// The effect route a POST goes to.
fn route_in(url: &str) -> Option<String> {
    let path = path_of(url).trim_matches('/');
    ROUTES.contains(&path).then(|| path.to_string())
}

/// The route of a tool's effect, where the downstream keeps the truth of it.
pub fn route_of(tool: &str) -> Option<&'static str> {
    match tool {
        "charge" => Some("payments"),
        "refund" | "refun2" => Some("refunds"),
        "fulfill" => Some("fulfillments"),
        // A payment, by the tool that spins past its deadline after it (`plan::OVERRUN_TOOL`).
        "panicky" => Some("payments"),
        _ => None,
    }
}
