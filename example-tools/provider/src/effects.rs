//! The effect routes (`POST /payments`, `/refunds`, `/fulfillments`): request
//! shapes, the effects themselves, and the pipeline every effect request runs
//! through — idempotency key, then fault, then commit, then (maybe) a response.
//!
//! The order matters. The key is claimed before a fault is consumed, so a replay
//! or a conflicting request never uses up a fault. Faults that refuse the request
//! act before the commit and leave the key unclaimed, so a retry is processed
//! fresh. Faults that lose, delay or replace the response act after the commit,
//! while the claim is still held, so a concurrent request with the key gets 409
//! until the first one has finished. A `CommitAfterDelay` request holds its claim
//! through the wait as well, in a task of its own that owns the claim, so the
//! commit lands even if the client has gone by then.

use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::header::HeaderValue;
use hyper::{HeaderMap, Request, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::Provider;
use crate::faults::FaultKind;
use crate::http::{self, ApiError, Resp, stored_json, stored_response};
use crate::inflight::Accepted;
use crate::model::Route;
use crate::store::{Claim, KeyClaim, Ledger, Store, StoredResponse};

/// Longest accepted `Idempotency-Key`, as in Stripe's API.
const MAX_KEY_LEN: usize = 255;

/// The payment method that is always declined, so tests can provoke a decline.
const DECLINED_METHOD: &str = "card_declined";

/// What the connection does with the outcome of a request.
#[derive(Debug)]
pub(crate) enum Reply {
    Send(Resp),
    /// Close the connection without a response (the `LoseResponse` fault, on an
    /// effect route or an inventory read).
    Lose,
}

/// Runs one request on an effect route.
pub(crate) async fn handle(provider: &Provider, route: Route, request: Request<Incoming>) -> Reply {
    provider.store.note_effect_request();
    let authorization = request.headers().get("authorization").and_then(|v| v.to_str().ok()).map(String::from);
    provider.store.note_authorization(authorization);
    let traceparent = request.headers().get("traceparent").and_then(|v| v.to_str().ok()).map(String::from);
    provider.store.note_traceparent(traceparent);
    match process(provider, route, request).await {
        Ok(reply) => reply,
        Err(err) => Reply::Send(err.into_response()),
    }
}

async fn process(provider: &Provider, route: Route, request: Request<Incoming>) -> Result<Reply, ApiError> {
    let (parts, body) = request.into_parts();
    let key = idempotency_key(&parts.headers)?;
    let value = http::read_json(&parts.headers, body).await?;
    // Validate before claiming the key: a malformed request commits nothing and
    // must not tie up the key.
    let effect = EffectRequest::parse(route, value.clone())?;

    let claim = match key {
        None => None,
        Some(key) => match provider.store.claim(&key, route, &value) {
            Claim::Fresh(claim) => Some(claim),
            Claim::Replay(stored) => return Ok(Reply::Send(replayed(&stored))),
            Claim::Reused => {
                return Err(ApiError::bad_request(
                    "idempotency_key_reused",
                    format!("Idempotency-Key {key:?} was already used with a different request"),
                ));
            }
            Claim::InUse => {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "idempotency_key_in_use",
                    format!("a request with Idempotency-Key {key:?} is still in flight"),
                ));
            }
        },
    };

    let fault = provider.faults.take(route, effect.order_id());
    match &fault {
        Some(FaultKind::RateLimit { retry_after_ms }) => {
            return Ok(Reply::Send(http::rate_limited(*retry_after_ms)));
        }
        Some(FaultKind::ErrorBeforeCommit) => {
            return Err(ApiError::injected_failure("injected fault: failed before committing"));
        }
        Some(
            FaultKind::LoseResponse
            | FaultKind::Delay { .. }
            | FaultKind::CommitThenError { .. }
            | FaultKind::CommitAfterDelay { .. },
        )
        | None => {}
    }

    // Accepted: from here the request commits, unless it is abandoned first.
    let accepted = provider.in_flight.accept();
    if let Some(FaultKind::CommitAfterDelay { delay_ms }) = fault {
        let store = Arc::clone(&provider.store);
        return Ok(commit_after_delay(store, claim, accepted, effect, Duration::from_millis(delay_ms)).await);
    }
    let stored = provider.store.commit(claim.as_ref(), |ledger| effect.commit(ledger));
    drop(accepted);
    let reply = match fault {
        Some(FaultKind::LoseResponse) => Reply::Lose,
        Some(FaultKind::Delay { delay_ms }) => {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            Reply::Send(stored_response(&stored))
        }
        Some(FaultKind::CommitThenError { status }) => Reply::Send(http::gateway_error(status)),
        _ => Reply::Send(stored_response(&stored)),
    };
    // Settle the key now, before the response is written or the connection closed,
    // so a client that retries as soon as it hears back is answered from the store.
    drop(claim);
    Ok(reply)
}

/// Waits `delay`, then commits, in a spawned task that owns the key claim and the
/// in-flight guard: this future is dropped when the client disconnects, and a
/// downstream that accepted a request does not undo it because the caller left.
async fn commit_after_delay(
    store: Arc<Store>,
    claim: Option<KeyClaim>,
    accepted: Accepted,
    effect: EffectRequest,
    delay: Duration,
) -> Reply {
    let commit = tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        let stored = store.commit(claim.as_ref(), |ledger| effect.commit(ledger));
        // Settle the key before leaving flight, so whoever waited for the provider
        // to settle finds the key replayable.
        drop(claim);
        drop(accepted);
        stored
    });
    match commit.await {
        Ok(stored) => Reply::Send(stored_response(&stored)),
        // Only if the runtime shuts down under the task; the claim and the guard
        // were dropped with it, so the request counts as abandoned.
        Err(err) => Reply::Send(
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", format!("the delayed commit was lost: {err}"))
                .into_response(),
        ),
    }
}

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let key = value
        .to_str()
        .map_err(|_| ApiError::bad_request("invalid_idempotency_key", "Idempotency-Key must be visible ASCII"))?;
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(ApiError::bad_request(
            "invalid_idempotency_key",
            format!("Idempotency-Key must be 1 to {MAX_KEY_LEN} characters"),
        ));
    }
    Ok(Some(key.to_owned()))
}

fn replayed(stored: &StoredResponse) -> Resp {
    let mut response = stored_response(stored);
    response.headers_mut().insert("idempotent-replayed", HeaderValue::from_static("true"));
    response
}

#[derive(Debug, Deserialize)]
struct PaymentRequest {
    order_id: String,
    amount_cents: u64,
    currency: String,
    payment_method: String,
}

#[derive(Debug, Deserialize)]
struct RefundRequest {
    order_id: String,
    amount_cents: u64,
}

#[derive(Debug, Deserialize)]
struct FulfillmentRequest {
    order_id: String,
    address: String,
    items: Vec<LineItem>,
}

#[derive(Debug, Deserialize)]
struct LineItem {
    sku: String,
    quantity: u64,
}

impl FulfillmentRequest {
    /// A shipment needs somewhere to go and something to ship.
    fn problem(&self) -> Option<&'static str> {
        if self.address.trim().is_empty() {
            Some("`address` must not be empty")
        } else if self.items.is_empty() {
            Some("`items` must not be empty")
        } else if self.items.iter().any(|item| item.sku.is_empty()) {
            Some("every item needs a non-empty `sku`")
        } else if self.items.iter().any(|item| item.quantity == 0) {
            Some("every item needs a `quantity` of at least 1")
        } else {
            None
        }
    }
}

/// A validated request on one of the effect routes.
#[derive(Debug)]
enum EffectRequest {
    Payment(PaymentRequest),
    Refund(RefundRequest),
    Fulfillment(FulfillmentRequest),
}

impl EffectRequest {
    fn parse(route: Route, value: Value) -> Result<EffectRequest, ApiError> {
        let request = match route {
            Route::Payments => EffectRequest::Payment(http::parse(value)?),
            Route::Refunds => EffectRequest::Refund(http::parse(value)?),
            Route::Fulfillments => EffectRequest::Fulfillment(http::parse(value)?),
            // Routing never sends a read here; refuse rather than panic if it did.
            Route::Inventory => return Err(ApiError::not_found("inventory is not an effect route")),
        };
        let problem = match &request {
            _ if request.order_id().is_empty() => Some("`order_id` must not be empty"),
            EffectRequest::Fulfillment(fulfillment) => fulfillment.problem(),
            EffectRequest::Payment(_) | EffectRequest::Refund(_) => None,
        };
        match problem {
            Some(problem) => Err(ApiError::bad_request("invalid_request", format!("invalid request: {problem}"))),
            None => Ok(request),
        }
    }

    fn order_id(&self) -> &str {
        match self {
            EffectRequest::Payment(r) => &r.order_id,
            EffectRequest::Refund(r) => &r.order_id,
            EffectRequest::Fulfillment(r) => &r.order_id,
        }
    }

    /// Performs the effect: runs inside the store's commit, so ids and counts are
    /// assigned atomically with storing the response under the key.
    fn commit(&self, ledger: &mut Ledger<'_>) -> StoredResponse {
        match self {
            EffectRequest::Payment(p) if p.payment_method == DECLINED_METHOD => {
                // A decline is a definitive answer, replayed like any other, but no
                // money moved, so it is not counted.
                ApiError::new(StatusCode::PAYMENT_REQUIRED, "card_declined", "the card was declined").to_stored()
            }
            EffectRequest::Payment(p) => {
                ledger.record(&p.order_id, Route::Payments);
                let id = ledger.next_id(Route::Payments);
                stored_json(
                    StatusCode::OK,
                    &json!({
                        "id": format!("pay_{id}"),
                        "order_id": p.order_id,
                        "amount_cents": p.amount_cents,
                        "currency": p.currency,
                        "status": "succeeded",
                    }),
                )
            }
            EffectRequest::Refund(r) => {
                ledger.record(&r.order_id, Route::Refunds);
                let id = ledger.next_id(Route::Refunds);
                stored_json(
                    StatusCode::OK,
                    &json!({
                        "id": format!("re_{id}"),
                        "order_id": r.order_id,
                        "amount_cents": r.amount_cents,
                        "status": "succeeded",
                    }),
                )
            }
            EffectRequest::Fulfillment(f) => {
                ledger.record(&f.order_id, Route::Fulfillments);
                let id = ledger.next_id(Route::Fulfillments);
                stored_json(
                    StatusCode::OK,
                    &json!({
                        "id": format!("ful_{id}"),
                        "order_id": f.order_id,
                        "status": "shipped",
                    }),
                )
            }
        }
    }
}
