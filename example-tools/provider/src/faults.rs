//! Fault injection: what can go wrong on a route, and the board of armed faults.
//!
//! Faults model the failures that make "exactly once" hard for a client: a
//! response lost after the provider committed, a slow response, a gateway error
//! in front of a commit, a commit that lands after the client gave up, and
//! refusals that commit nothing. On an effect route they are consumed only by
//! requests that would be processed fresh; a replayed idempotency key never
//! reaches the board. On the inventory read route ([`Route::Inventory`]) every
//! `GET /inventory/{sku}` consults the board, so a read-only client can be driven
//! through the same failures.
//!
//! Provider-wide misbehaviour (keys not honoured, forgotten, or looked up late)
//! is not a fault but a setting: see [`crate::Settings`].

use std::sync::{Mutex, PoisonError};

use serde::{Deserialize, Serialize};

use crate::model::Route;

/// A fault armed against a route.
///
/// On the wire the kind is flattened into the fault, e.g.
/// `{"route": "payments", "order_id": "o-1", "kind": "delay", "delay_ms": 500, "times": 1}`.
/// `order_id` may be omitted (any order) and `times` defaults to 1.
///
/// For [`Route::Inventory`] the `order_id` field names the SKU instead, since a
/// read has no order: `{"route": "inventory", "sku": "widget", "kind": "lose-response"}`.
/// On the wire `sku` is accepted as another name for `order_id` (giving both is
/// an error); in Rust, [`Fault::for_sku`] reads better than [`Fault::for_order`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    pub route: Route,
    /// The order the fault is restricted to or, for [`Route::Inventory`], the SKU.
    /// `None` matches requests for any order (or SKU).
    #[serde(default, alias = "sku")]
    pub order_id: Option<String>,
    #[serde(flatten)]
    pub kind: FaultKind,
    /// How many matching requests the fault applies to before it is spent.
    #[serde(default = "one")]
    pub times: u32,
}

fn one() -> u32 {
    1
}

impl Fault {
    /// A fault for `route` on any order (or SKU), applying once.
    pub fn new(route: Route, kind: FaultKind) -> Fault {
        Fault { route, order_id: None, kind, times: 1 }
    }

    /// Restricts the fault to requests for `order_id`.
    pub fn for_order(mut self, order_id: impl Into<String>) -> Fault {
        self.order_id = Some(order_id.into());
        self
    }

    /// Restricts a [`Route::Inventory`] fault to reads of `sku`. The same as
    /// [`Fault::for_order`]: both set `order_id`, which names the SKU for reads.
    pub fn for_sku(self, sku: impl Into<String>) -> Fault {
        self.for_order(sku)
    }

    /// Makes the fault apply to `times` matching requests.
    pub fn times(mut self, times: u32) -> Fault {
        self.times = times;
        self
    }

    /// `target` is the request's order id, or its SKU for an inventory read.
    fn matches(&self, route: Route, target: &str) -> bool {
        self.route == route && self.order_id.as_deref().is_none_or(|id| id == target)
    }
}

/// What an armed fault does to the request it applies to.
///
/// On the inventory read route nothing is ever committed: `LoseResponse` just
/// closes the connection without a response, `Delay` and `CommitAfterDelay` wait
/// and then read and answer as usual, `CommitThenError` answers its error status,
/// and the other two refuse the read as they refuse an effect.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum FaultKind {
    /// Commit the effect, then close the connection without sending any response.
    LoseResponse,
    /// Commit the effect, then wait `delay_ms` before responding. (A read waits
    /// first, then reads the stock it answers with.) With a client timeout shorter
    /// than the delay, this is "committed, then answered after the client gave up".
    Delay { delay_ms: u64 },
    /// Commit nothing; respond 429 with `Retry-After` (seconds, rounded up) and
    /// `Retry-After-Ms` (exact).
    RateLimit { retry_after_ms: u64 },
    /// Commit nothing; respond 500.
    ErrorBeforeCommit,
    /// Commit the effect (counted, and stored under its key as usual), then answer
    /// `status` with an error body, as a gateway in front of the origin does when
    /// the origin's answer does not reach it. A resend with the key is answered
    /// from the store (200, `Idempotent-Replayed: true`) when keys are honoured.
    ///
    /// `status` defaults to 502 on the wire; one that is not 4xx or 5xx is refused
    /// by `POST /faults` and answered as 502 when armed from Rust.
    CommitThenError {
        #[serde(default = "bad_gateway")]
        status: u16,
    },
    /// Accept the request, wait `delay_ms`, and only then commit, whether or not
    /// the client is still connected; answer if it is. Until the commit the key is
    /// in flight: a resend with it gets 409 and a lookup by it 404. The wait and the
    /// commit run apart from the connection, so a client that gives up cannot cancel
    /// them; [`ProviderHandle::settled`](crate::ProviderHandle::settled) waits for them.
    CommitAfterDelay { delay_ms: u64 },
}

fn bad_gateway() -> u16 {
    502
}

impl FaultKind {
    /// Whether, on an effect route, the provider commits the effect (before or
    /// after the fault takes hold). (Reads never commit anything.)
    pub fn commits(&self) -> bool {
        matches!(
            self,
            FaultKind::LoseResponse
                | FaultKind::Delay { .. }
                | FaultKind::CommitThenError { .. }
                | FaultKind::CommitAfterDelay { .. }
        )
    }

    /// Why the fault cannot be armed as given, if it cannot.
    pub(crate) fn problem(&self) -> Option<String> {
        match self {
            FaultKind::CommitThenError { status } if !(400..=599).contains(status) => {
                Some(format!("`status` must be an error status (400 to 599), not {status}"))
            }
            _ => None,
        }
    }
}

/// The armed faults, in the order they were armed.
#[derive(Debug, Default)]
pub(crate) struct FaultBoard {
    armed: Mutex<Vec<Fault>>,
}

impl FaultBoard {
    pub(crate) fn arm(&self, fault: Fault) {
        // A fault for zero requests is already spent; keeping it would only make
        // `take` skip over it forever.
        if fault.times > 0 {
            self.lock().push(fault);
        }
    }

    pub(crate) fn clear(&self) {
        self.lock().clear();
    }

    /// Consumes one application of the first armed fault matching the request,
    /// removing the fault once it is spent.
    /// `target` is the request's order id, or its SKU for an inventory read.
    pub(crate) fn take(&self, route: Route, target: &str) -> Option<FaultKind> {
        let mut armed = self.lock();
        let index = armed.iter().position(|f| f.matches(route, target))?;
        let fault = &mut armed[index];
        fault.times -= 1;
        let kind = fault.kind.clone();
        if fault.times == 0 {
            armed.remove(index);
        }
        Some(kind)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Fault>> {
        // The list is valid after any panic (every mutation is a single step), so a
        // poisoned lock is safe to keep using.
        self.armed.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_matching_fault_is_consumed_in_arming_order() {
        let board = FaultBoard::default();
        board.arm(Fault::new(Route::Payments, FaultKind::ErrorBeforeCommit).for_order("b"));
        board.arm(Fault::new(Route::Payments, FaultKind::LoseResponse).times(2));

        assert_eq!(board.take(Route::Refunds, "a"), None);
        assert_eq!(board.take(Route::Payments, "a"), Some(FaultKind::LoseResponse));
        assert_eq!(board.take(Route::Payments, "b"), Some(FaultKind::ErrorBeforeCommit));
        assert_eq!(board.take(Route::Payments, "b"), Some(FaultKind::LoseResponse));
        assert_eq!(board.take(Route::Payments, "b"), None);
    }

    #[test]
    fn zero_times_is_never_armed() {
        let board = FaultBoard::default();
        board.arm(Fault::new(Route::Payments, FaultKind::LoseResponse).times(0));
        assert_eq!(board.take(Route::Payments, "a"), None);
    }

    #[test]
    fn wire_format_flattens_the_kind() {
        let fault: Result<Fault, _> =
            serde_json::from_str(r#"{"route":"refunds","kind":"rate-limit","retry_after_ms":1500}"#);
        let expected = Fault::new(Route::Refunds, FaultKind::RateLimit { retry_after_ms: 1500 });
        assert_eq!(fault.ok(), Some(expected));
    }

    #[test]
    fn inventory_faults_match_the_sku() {
        let board = FaultBoard::default();
        board.arm(Fault::new(Route::Inventory, FaultKind::ErrorBeforeCommit).for_sku("widget"));

        assert_eq!(board.take(Route::Payments, "widget"), None);
        assert_eq!(board.take(Route::Inventory, "gadget"), None);
        assert_eq!(board.take(Route::Inventory, "widget"), Some(FaultKind::ErrorBeforeCommit));
        assert_eq!(board.take(Route::Inventory, "widget"), None);
    }

    #[test]
    fn wire_format_accepts_sku_for_order_id() {
        let expected = Fault::new(Route::Inventory, FaultKind::LoseResponse).for_sku("widget").times(2);
        for text in [
            r#"{"route":"inventory","sku":"widget","kind":"lose-response","times":2}"#,
            r#"{"route":"inventory","order_id":"widget","kind":"lose-response","times":2}"#,
        ] {
            let fault: Result<Fault, _> = serde_json::from_str(text);
            assert_eq!(fault.ok(), Some(expected.clone()), "{text}");
        }
        let both: Result<Fault, _> =
            serde_json::from_str(r#"{"route":"inventory","sku":"a","order_id":"b","kind":"lose-response"}"#);
        assert!(both.is_err(), "sku and order_id are the same field");
        // Serializing keeps the original field name, so older readers still understand it.
        let written = serde_json::to_value(&expected).ok();
        assert_eq!(written.as_ref().and_then(|v| v.get("order_id")), Some(&serde_json::json!("widget")));
    }

    #[test]
    fn new_kinds_on_the_wire() {
        let parse = |text: &str| serde_json::from_str::<Fault>(text).ok().map(|fault| fault.kind);
        assert_eq!(
            parse(r#"{"route":"payments","kind":"commit-then-error"}"#),
            Some(FaultKind::CommitThenError { status: 502 }),
            "the status defaults to 502"
        );
        assert_eq!(
            parse(r#"{"route":"payments","kind":"commit-then-error","status":504}"#),
            Some(FaultKind::CommitThenError { status: 504 })
        );
        assert_eq!(
            parse(r#"{"route":"payments","kind":"commit-after-delay","delay_ms":250}"#),
            Some(FaultKind::CommitAfterDelay { delay_ms: 250 })
        );
        assert_eq!(parse(r#"{"route":"payments","kind":"commit-after-delay"}"#), None, "the delay is required");
        let written = serde_json::to_value(Fault::new(Route::Refunds, FaultKind::CommitThenError { status: 503 }));
        assert_eq!(
            written.ok(),
            Some(
                serde_json::json!({"route": "refunds", "order_id": null, "kind": "commit-then-error", "status": 503, "times": 1})
            )
        );
    }

    #[test]
    fn commit_then_error_needs_an_error_status() {
        assert!(FaultKind::CommitThenError { status: 502 }.problem().is_none());
        assert!(FaultKind::CommitThenError { status: 404 }.problem().is_none());
        assert!(FaultKind::CommitThenError { status: 200 }.problem().is_some());
        assert!(FaultKind::CommitThenError { status: 600 }.problem().is_some());
        assert!(FaultKind::CommitAfterDelay { delay_ms: 1 }.commits());
        assert!(FaultKind::CommitThenError { status: 502 }.commits());
        assert!(!FaultKind::ErrorBeforeCommit.commits());
    }
}
