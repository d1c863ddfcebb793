//! Fault injection: what can go wrong on an effect route, and the board of armed faults.
//!
//! Faults model the failures that make "exactly once" hard for a client: a
//! response lost after the provider committed, a slow response, and refusals that
//! commit nothing. They are consumed only by requests that would be processed
//! fresh; a replayed idempotency key never reaches the board.

use std::sync::{Mutex, PoisonError};

use serde::{Deserialize, Serialize};

use crate::model::Route;

/// A fault armed against an effect route.
///
/// On the wire the kind is flattened into the fault, e.g.
/// `{"route": "payments", "order_id": "o-1", "kind": "delay", "delay_ms": 500, "times": 1}`.
/// `order_id` may be omitted (any order) and `times` defaults to 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    pub route: Route,
    /// `None` matches requests for any order.
    #[serde(default)]
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
    /// A fault for `route` on any order, applying once.
    pub fn new(route: Route, kind: FaultKind) -> Fault {
        Fault { route, order_id: None, kind, times: 1 }
    }

    /// Restricts the fault to requests for `order_id`.
    pub fn for_order(mut self, order_id: impl Into<String>) -> Fault {
        self.order_id = Some(order_id.into());
        self
    }

    /// Makes the fault apply to `times` matching requests.
    pub fn times(mut self, times: u32) -> Fault {
        self.times = times;
        self
    }

    fn matches(&self, route: Route, order_id: &str) -> bool {
        self.route == route && self.order_id.as_deref().is_none_or(|id| id == order_id)
    }
}

/// What an armed fault does to the request it applies to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum FaultKind {
    /// Commit the effect, then close the connection without sending any response.
    LoseResponse,
    /// Commit the effect, then wait `delay_ms` before responding.
    Delay { delay_ms: u64 },
    /// Commit nothing; respond 429 with `Retry-After` (seconds, rounded up) and
    /// `Retry-After-Ms` (exact).
    RateLimit { retry_after_ms: u64 },
    /// Commit nothing; respond 500.
    ErrorBeforeCommit,
}

impl FaultKind {
    /// Whether the provider commits the effect before the fault takes hold.
    pub fn commits(&self) -> bool {
        matches!(self, FaultKind::LoseResponse | FaultKind::Delay { .. })
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
    pub(crate) fn take(&self, route: Route, order_id: &str) -> Option<FaultKind> {
        let mut armed = self.lock();
        let index = armed.iter().position(|f| f.matches(route, order_id))?;
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
}
