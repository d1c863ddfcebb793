//! Provider state: committed effects per order, the idempotency-key store, the
//! lookup index, the settings and inventory.
//!
//! Everything lives behind one mutex that is never held across an `.await`, so each
//! operation here is atomic with respect to concurrent requests. In particular a
//! commit assigns the id, bumps the order's count and stores the response under the
//! idempotency key in one step: no observer can see an effect counted whose key is
//! not yet stored.
//!
//! Deduplication and lookup are kept apart on purpose. The key store answers
//! "was this request already made?" and exists only while keys are honoured; the
//! lookup index answers `GET /{route}/by-key/{key}` and is written by every keyed
//! commit, so [`Settings`] can take either promise away without the other.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use hyper::StatusCode;
use serde_json::Value;
use tokio::time::Instant;

use crate::model::{Counts, Route};
use crate::settings::Settings;

/// A response exactly as first sent, kept so a replayed key gets the same bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredResponse {
    pub(crate) status: StatusCode,
    pub(crate) body: Bytes,
}

/// A commit made under a key: its response, and when it happened, which is what
/// key retention and lookup lag are measured from.
#[derive(Debug, Clone)]
struct Committed {
    response: StoredResponse,
    at: Instant,
}

impl Committed {
    /// Whether at least `window` has passed since the commit (never, without a window).
    fn older_than(&self, window: Option<Duration>, now: Instant) -> bool {
        window.is_some_and(|window| now.saturating_duration_since(self.at) >= window)
    }
}

/// What an idempotency key's first request has got to.
#[derive(Debug)]
enum Progress {
    /// Claimed; nothing committed yet. Dropped again if the request ends without a commit.
    Processing,
    /// Committed, but the response is still on its way (or being lost) to the client.
    Responding(Committed),
    /// Committed and answered: later requests with the key get this replayed.
    Done(Committed),
}

impl Progress {
    fn committed(&self) -> Option<&Committed> {
        match self {
            Progress::Processing => None,
            Progress::Responding(committed) | Progress::Done(committed) => Some(committed),
        }
    }
}

#[derive(Debug)]
struct KeyEntry {
    route: Route,
    /// The parsed request body: comparing `Value`s ignores formatting and key order.
    request: Value,
    /// The claim that owns the entry. A key forgotten after its retention can be
    /// claimed afresh while its first request is still responding; the token keeps
    /// that first claim from settling the new owner's entry.
    owner: u64,
    progress: Progress,
}

/// The outcome of presenting an idempotency key with a request.
#[derive(Debug)]
pub(crate) enum Claim {
    /// The key is new (or not honoured): this request owns it until the claim is dropped.
    Fresh(KeyClaim),
    /// The key completed earlier with the same request: answer with this again.
    Replay(StoredResponse),
    /// The key was first used with a different route or body.
    Reused,
    /// The same request with this key is still being processed or answered.
    InUse,
}

/// Ownership of an idempotency key by the request processing it.
///
/// Dropping the claim settles the key: if nothing was committed the key is
/// forgotten, so a retry is processed fresh; if something was, the key becomes
/// replayable. Because this runs on drop it also covers a request abandoned
/// half-way, e.g. when the client disconnects during a delay. The claim owns a
/// handle on the store, so it can move into a task that commits later.
///
/// When keys are not honoured the claim reserves nothing: it only carries the key
/// so that the commit is still indexed for lookup.
#[derive(Debug)]
pub(crate) struct KeyClaim {
    store: Arc<Store>,
    route: Route,
    key: String,
    /// The token of the key entry this claim owns; `None` when keys are not honoured.
    owner: Option<u64>,
}

impl Drop for KeyClaim {
    fn drop(&mut self) {
        let Some(owner) = self.owner else {
            return;
        };
        let mut state = self.store.lock();
        let Some(entry) = state.keys.get_mut(&self.key).filter(|entry| entry.owner == owner) else {
            return;
        };
        match std::mem::replace(&mut entry.progress, Progress::Processing) {
            Progress::Processing => {
                state.keys.remove(&self.key);
            }
            Progress::Responding(committed) | Progress::Done(committed) => {
                entry.progress = Progress::Done(committed);
            }
        }
    }
}

/// The part of the state an effect may touch while it commits.
#[derive(Debug)]
pub(crate) struct Ledger<'a> {
    counts: &'a mut HashMap<String, Counts>,
    next_ids: &'a mut HashMap<Route, u64>,
}

impl Ledger<'_> {
    /// The next id number for `route`, starting at 1.
    pub(crate) fn next_id(&mut self, route: Route) -> u64 {
        let next = self.next_ids.entry(route).or_insert(0);
        *next += 1;
        *next
    }

    /// Counts one committed effect on `route` for `order_id`.
    pub(crate) fn record(&mut self, order_id: &str, route: Route) {
        self.counts.entry(order_id.to_owned()).or_default().record(route);
    }
}

#[derive(Debug, Default)]
struct State {
    settings: Settings,
    /// Keys that deduplicate, while [`Settings::honour_keys`] is on.
    keys: HashMap<String, KeyEntry>,
    /// The latest commit made with each key on each route, for `by-key` lookups.
    lookups: HashMap<(Route, String), Committed>,
    /// The last owner token handed to a [`KeyClaim`].
    last_owner: u64,
    counts: HashMap<String, Counts>,
    next_ids: HashMap<Route, u64>,
    inventory: HashMap<String, u64>,
}

impl State {
    fn retention(&self) -> Option<Duration> {
        self.settings.key_retention_ms.map(Duration::from_millis)
    }
}

/// How many `traceparent` headers the provider keeps (the latest): a long demo stays bounded.
const MAX_TRACEPARENTS: usize = 1024;

#[derive(Debug, Default)]
pub(crate) struct Store {
    state: Mutex<State>,
    effect_requests: AtomicU64,
    reads: AtomicU64,
    /// The `Authorization` header of the latest effect request, so tests can check that the
    /// client's credentials arrived (a real service would verify them instead).
    last_authorization: Mutex<Option<String>>,
    /// The `traceparent` header of every effect request, in order (`None` where it had none), so
    /// tests can check that the client's trace context arrived.
    traceparents: Mutex<Vec<Option<String>>>,
}

impl Store {
    /// Presents `key` for a request on `route` with body `request`.
    pub(crate) fn claim(self: &Arc<Self>, key: &str, route: Route, request: &Value) -> Claim {
        let mut state = self.lock();
        let fresh = |owner| Claim::Fresh(KeyClaim { store: Arc::clone(self), route, key: key.to_owned(), owner });
        if !state.settings.honour_keys {
            return fresh(None);
        }
        let retention = state.retention();
        let now = Instant::now();
        if let Some(entry) = state.keys.get(key)
            && !entry.progress.committed().is_some_and(|committed| committed.older_than(retention, now))
        {
            // A mismatch is checked first: it is the client's bug whatever the timing.
            if entry.route != route || entry.request != *request {
                return Claim::Reused;
            }
            return match &entry.progress {
                Progress::Done(committed) => Claim::Replay(committed.response.clone()),
                Progress::Processing | Progress::Responding(_) => Claim::InUse,
            };
        }
        // New, or forgotten after its retention: either way the request is fresh.
        state.last_owner += 1;
        let owner = state.last_owner;
        let entry = KeyEntry { route, request: request.clone(), owner, progress: Progress::Processing };
        state.keys.insert(key.to_owned(), entry);
        fresh(Some(owner))
    }

    /// Commits an effect and, for a keyed request, stores its response under the
    /// key (if it deduplicates) and in the lookup index.
    pub(crate) fn commit(
        &self,
        claim: Option<&KeyClaim>,
        effect: impl FnOnce(&mut Ledger<'_>) -> StoredResponse,
    ) -> StoredResponse {
        let mut guard = self.lock();
        let state = &mut *guard;
        let response = effect(&mut Ledger { counts: &mut state.counts, next_ids: &mut state.next_ids });
        if let Some(claim) = claim {
            let committed = Committed { response: response.clone(), at: Instant::now() };
            if let Some(owner) = claim.owner
                && let Some(entry) = state.keys.get_mut(&claim.key).filter(|entry| entry.owner == owner)
            {
                entry.progress = Progress::Responding(committed.clone());
            }
            state.lookups.insert((claim.route, claim.key.clone()), committed);
        }
        response
    }

    /// The latest response committed under `key` for `route`, if a lookup can see
    /// it under the current settings: lookups are on, the index has caught up
    /// with the commit, and the key has not been forgotten.
    pub(crate) fn by_key(&self, route: Route, key: &str) -> Option<StoredResponse> {
        let state = self.lock();
        if !state.settings.lookup_by_key {
            return None;
        }
        let committed = state.lookups.get(&(route, key.to_owned()))?;
        let now = Instant::now();
        let lag = Some(Duration::from_millis(state.settings.lookup_lag_ms));
        let visible = committed.older_than(lag, now) && !committed.older_than(state.retention(), now);
        visible.then(|| committed.response.clone())
    }

    pub(crate) fn settings(&self) -> Settings {
        self.lock().settings.clone()
    }

    pub(crate) fn configure(&self, settings: Settings) {
        self.lock().settings = settings;
    }

    pub(crate) fn counts(&self, order_id: &str) -> Counts {
        self.lock().counts.get(order_id).copied().unwrap_or_default()
    }

    pub(crate) fn totals(&self) -> Counts {
        self.lock().counts.values().fold(Counts::default(), |sum, counts| sum.add(*counts))
    }

    pub(crate) fn note_authorization(&self, value: Option<String>) {
        *self.last_authorization.lock().unwrap_or_else(|p| p.into_inner()) = value;
    }

    pub(crate) fn note_traceparent(&self, value: Option<String>) {
        let mut traceparents = self.traceparents.lock().unwrap_or_else(|p| p.into_inner());
        if traceparents.len() >= MAX_TRACEPARENTS {
            traceparents.remove(0);
        }
        traceparents.push(value);
    }

    pub(crate) fn traceparents(&self) -> Vec<Option<String>> {
        self.traceparents.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn last_authorization(&self) -> Option<String> {
        self.last_authorization.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn note_effect_request(&self) {
        self.effect_requests.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn effect_requests(&self) -> u64 {
        self.effect_requests.load(Ordering::Relaxed)
    }

    pub(crate) fn note_read(&self) {
        self.reads.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    pub(crate) fn stock(&self, sku: &str) -> u64 {
        self.lock().inventory.get(sku).copied().unwrap_or(0)
    }

    pub(crate) fn set_stock(&self, sku: &str, available: u64) {
        self.lock().inventory.insert(sku.to_owned(), available);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every mutation completes under the lock in one step and none of them can
        // panic half-way, so the state behind a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(body: &'static str) -> StoredResponse {
        StoredResponse { status: StatusCode::OK, body: Bytes::from_static(body.as_bytes()) }
    }

    fn pay(ledger: &mut Ledger<'_>) -> StoredResponse {
        ledger.record("o-1", Route::Payments);
        ok("paid")
    }

    /// Claims `key` for a payment, expecting the claim to be fresh.
    fn fresh(store: &Arc<Store>, key: &str) -> KeyClaim {
        match store.claim(key, Route::Payments, &serde_json::json!({"a": 1})) {
            Claim::Fresh(claim) => claim,
            other => panic!("expected a fresh claim, got {other:?}"),
        }
    }

    fn configured(settings: Settings) -> Arc<Store> {
        let store = Arc::new(Store::default());
        store.configure(settings);
        store
    }

    #[test]
    fn uncommitted_claim_is_forgotten_on_drop() {
        let store = Arc::new(Store::default());
        let body = serde_json::json!({"a": 1});
        let claim = store.claim("k", Route::Payments, &body);
        assert!(matches!(claim, Claim::Fresh(_)));
        assert!(matches!(store.claim("k", Route::Payments, &body), Claim::InUse));
        drop(claim);
        assert!(matches!(store.claim("k", Route::Payments, &body), Claim::Fresh(_)));
    }

    #[test]
    fn committed_claim_is_in_use_until_dropped_then_replays() {
        let store = Arc::new(Store::default());
        let body = serde_json::json!({"a": 1});
        let Claim::Fresh(claim) = store.claim("k", Route::Payments, &body) else {
            panic!("a new key must be fresh");
        };
        store.commit(Some(&claim), pay);
        assert!(matches!(store.claim("k", Route::Payments, &body), Claim::InUse));
        assert_eq!(store.by_key(Route::Payments, "k"), Some(ok("paid")));
        drop(claim);
        match store.claim("k", Route::Payments, &body) {
            Claim::Replay(response) => assert_eq!(response, ok("paid")),
            other => panic!("expected a replay, got {other:?}"),
        }
        assert_eq!(store.counts("o-1").payments, 1);
    }

    #[test]
    fn key_reuse_is_detected_across_body_and_route() {
        let store = Arc::new(Store::default());
        let body = serde_json::json!({"a": 1, "b": 2});
        if let Claim::Fresh(claim) = store.claim("k", Route::Payments, &body) {
            store.commit(Some(&claim), pay);
        }
        let reordered = serde_json::json!({"b": 2, "a": 1});
        assert!(matches!(store.claim("k", Route::Payments, &reordered), Claim::Replay(_)));
        let other = serde_json::json!({"a": 2, "b": 2});
        assert!(matches!(store.claim("k", Route::Payments, &other), Claim::Reused));
        assert!(matches!(store.claim("k", Route::Refunds, &body), Claim::Reused));
        assert_eq!(store.by_key(Route::Refunds, "k"), None);
    }

    #[test]
    fn totals_sum_over_orders_and_ids_count_per_route() {
        let store = Arc::new(Store::default());
        let ids: Vec<u64> = (0..2)
            .map(|i| {
                let mut id = 0;
                store.commit(None, |ledger| {
                    id = ledger.next_id(Route::Refunds);
                    ledger.record(if i == 0 { "a" } else { "b" }, Route::Refunds);
                    ok("refunded")
                });
                id
            })
            .collect();
        assert_eq!(ids, vec![1, 2]);
        assert_eq!(store.totals().refunds, 2);
        assert_eq!(store.counts("a").refunds, 1);
        assert_eq!(store.counts("missing"), Counts::default());
    }

    #[test]
    fn unhonoured_keys_commit_afresh_and_the_latest_commit_is_looked_up() {
        let store = configured(Settings { honour_keys: false, ..Settings::default() });
        for body in ["first", "second"] {
            let claim = fresh(&store, "k");
            store.commit(Some(&claim), |ledger| {
                ledger.record("o-1", Route::Payments);
                ok(body)
            });
            // Not even a concurrent request with the key is refused.
            assert!(matches!(store.claim("k", Route::Payments, &serde_json::json!({"b": 2})), Claim::Fresh(_)));
        }
        assert_eq!(store.counts("o-1").payments, 2);
        assert_eq!(store.by_key(Route::Payments, "k"), Some(ok("second")));
        assert_eq!(store.by_key(Route::Refunds, "k"), None);
    }

    #[test]
    fn lookups_switch_off_without_touching_deduplication() {
        let store = configured(Settings { lookup_by_key: false, ..Settings::default() });
        let claim = fresh(&store, "k");
        store.commit(Some(&claim), pay);
        drop(claim);
        assert_eq!(store.by_key(Route::Payments, "k"), None);
        assert!(matches!(store.claim("k", Route::Payments, &serde_json::json!({"a": 1})), Claim::Replay(_)));

        store.configure(Settings { honour_keys: false, lookup_by_key: false, ..Settings::default() });
        assert_eq!(store.by_key(Route::Payments, "k"), None);
        drop(fresh(&store, "k"));
    }

    #[test]
    fn a_key_past_its_retention_is_fresh_again_and_not_found() {
        let store = configured(Settings { key_retention_ms: Some(60_000), ..Settings::default() });
        let claim = fresh(&store, "k");
        store.commit(Some(&claim), pay);
        drop(claim);
        assert!(matches!(store.claim("k", Route::Payments, &serde_json::json!({"a": 1})), Claim::Replay(_)));
        assert_eq!(store.by_key(Route::Payments, "k"), Some(ok("paid")));

        // With no retention at all every committed key is already forgotten, even
        // for a different body, which would otherwise be a reuse.
        store.configure(Settings { key_retention_ms: Some(0), ..Settings::default() });
        assert_eq!(store.by_key(Route::Payments, "k"), None);
        assert!(matches!(store.claim("k", Route::Payments, &serde_json::json!({"a": 2})), Claim::Fresh(_)));
    }

    #[test]
    fn a_lagging_lookup_hides_a_commit_until_the_lag_has_passed() {
        let store = configured(Settings { lookup_lag_ms: 60_000, ..Settings::default() });
        let claim = fresh(&store, "k");
        store.commit(Some(&claim), pay);
        drop(claim);
        assert_eq!(store.by_key(Route::Payments, "k"), None);
        // Deduplication does not lag.
        assert!(matches!(store.claim("k", Route::Payments, &serde_json::json!({"a": 1})), Claim::Replay(_)));
        store.configure(Settings::default());
        assert_eq!(store.by_key(Route::Payments, "k"), Some(ok("paid")));
    }

    #[test]
    fn a_claim_on_a_forgotten_key_is_not_settled_by_the_first_one() {
        let store = configured(Settings { key_retention_ms: Some(0), ..Settings::default() });
        let first = fresh(&store, "k");
        store.commit(Some(&first), pay);
        // Still responding, but past its retention: the key is up for grabs.
        let second = fresh(&store, "k");
        drop(first);
        assert!(
            matches!(store.claim("k", Route::Payments, &serde_json::json!({"a": 1})), Claim::InUse),
            "the first claim must not settle or forget the second one's entry"
        );
        drop(second);
        drop(fresh(&store, "k"));
    }
}
