//! Provider state: committed effects per order, the idempotency-key store and inventory.
//!
//! Everything lives behind one mutex that is never held across an `.await`, so each
//! operation here is atomic with respect to concurrent requests. In particular a
//! commit assigns the id, bumps the order's count and stores the response under the
//! idempotency key in one step: no observer can see an effect counted whose key is
//! not yet stored.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use hyper::StatusCode;
use serde_json::Value;

use crate::model::{Counts, Route};

/// A response exactly as first sent, kept so a replayed key gets the same bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredResponse {
    pub(crate) status: StatusCode,
    pub(crate) body: Bytes,
}

/// What an idempotency key's first request has got to.
#[derive(Debug)]
enum Progress {
    /// Claimed; nothing committed yet. Dropped again if the request ends without a commit.
    Processing,
    /// Committed, but the response is still on its way (or being lost) to the client.
    Responding(StoredResponse),
    /// Committed and answered: later requests with the key get this replayed.
    Done(StoredResponse),
}

#[derive(Debug)]
struct KeyEntry {
    route: Route,
    /// The parsed request body: comparing `Value`s ignores formatting and key order.
    request: Value,
    progress: Progress,
}

/// The outcome of presenting an idempotency key with a request.
#[derive(Debug)]
pub(crate) enum Claim<'a> {
    /// The key is new: this request owns it until the claim is dropped.
    Fresh(KeyClaim<'a>),
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
/// half-way, e.g. when the client disconnects during a delay.
#[derive(Debug)]
pub(crate) struct KeyClaim<'a> {
    store: &'a Store,
    key: String,
}

impl Drop for KeyClaim<'_> {
    fn drop(&mut self) {
        let mut state = self.store.lock();
        let Some(entry) = state.keys.get_mut(&self.key) else {
            return;
        };
        match std::mem::replace(&mut entry.progress, Progress::Processing) {
            Progress::Processing => {
                state.keys.remove(&self.key);
            }
            Progress::Responding(response) | Progress::Done(response) => {
                entry.progress = Progress::Done(response);
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
    keys: HashMap<String, KeyEntry>,
    counts: HashMap<String, Counts>,
    next_ids: HashMap<Route, u64>,
    inventory: HashMap<String, u64>,
}

#[derive(Debug, Default)]
pub(crate) struct Store {
    state: Mutex<State>,
    effect_requests: AtomicU64,
    reads: AtomicU64,
    /// The `Authorization` header of the latest effect request, so tests can check that the
    /// client's credentials arrived (a real service would verify them instead).
    last_authorization: Mutex<Option<String>>,
}

impl Store {
    /// Presents `key` for a request on `route` with body `request`.
    pub(crate) fn claim(&self, key: &str, route: Route, request: &Value) -> Claim<'_> {
        let mut state = self.lock();
        if let Some(entry) = state.keys.get(key) {
            // A mismatch is checked first: it is the client's bug whatever the timing.
            if entry.route != route || entry.request != *request {
                return Claim::Reused;
            }
            return match &entry.progress {
                Progress::Done(response) => Claim::Replay(response.clone()),
                Progress::Processing | Progress::Responding(_) => Claim::InUse,
            };
        }
        state.keys.insert(key.to_owned(), KeyEntry { route, request: request.clone(), progress: Progress::Processing });
        Claim::Fresh(KeyClaim { store: self, key: key.to_owned() })
    }

    /// Commits an effect and, for a keyed request, stores its response under the key.
    pub(crate) fn commit(
        &self,
        claim: Option<&KeyClaim<'_>>,
        effect: impl FnOnce(&mut Ledger<'_>) -> StoredResponse,
    ) -> StoredResponse {
        let mut guard = self.lock();
        let state = &mut *guard;
        let response = effect(&mut Ledger { counts: &mut state.counts, next_ids: &mut state.next_ids });
        if let Some(entry) = claim.and_then(|claim| state.keys.get_mut(&claim.key)) {
            entry.progress = Progress::Responding(response.clone());
        }
        response
    }

    /// The committed response stored under `key` for `route`, if any.
    pub(crate) fn by_key(&self, route: Route, key: &str) -> Option<StoredResponse> {
        let state = self.lock();
        let entry = state.keys.get(key).filter(|entry| entry.route == route)?;
        match &entry.progress {
            Progress::Responding(response) | Progress::Done(response) => Some(response.clone()),
            Progress::Processing => None,
        }
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

    #[test]
    fn uncommitted_claim_is_forgotten_on_drop() {
        let store = Store::default();
        let body = serde_json::json!({"a": 1});
        let claim = store.claim("k", Route::Payments, &body);
        assert!(matches!(claim, Claim::Fresh(_)));
        assert!(matches!(store.claim("k", Route::Payments, &body), Claim::InUse));
        drop(claim);
        assert!(matches!(store.claim("k", Route::Payments, &body), Claim::Fresh(_)));
    }

    #[test]
    fn committed_claim_is_in_use_until_dropped_then_replays() {
        let store = Store::default();
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
        let store = Store::default();
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
        let store = Store::default();
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
}
