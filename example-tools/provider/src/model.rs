//! The public vocabulary shared by the Rust API and the wire format.

use std::fmt;

use serde::{Deserialize, Serialize};

/// One of the three effect routes: the only routes that commit side effects,
/// honour `Idempotency-Key` and can have faults armed against them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Route {
    Payments,
    Refunds,
    Fulfillments,
}

impl Route {
    /// The first path segment of the route, e.g. `"payments"` for `POST /payments`.
    pub fn segment(self) -> &'static str {
        match self {
            Route::Payments => "payments",
            Route::Refunds => "refunds",
            Route::Fulfillments => "fulfillments",
        }
    }

    /// Parses a first path segment back into a route.
    pub fn from_segment(segment: &str) -> Option<Route> {
        match segment {
            "payments" => Some(Route::Payments),
            "refunds" => Some(Route::Refunds),
            "fulfillments" => Some(Route::Fulfillments),
            _ => None,
        }
    }
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.segment())
    }
}

/// Effects the provider actually committed: the ground truth that tests compare
/// against what the client believes happened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub payments: u64,
    pub refunds: u64,
    pub fulfillments: u64,
}

impl Counts {
    /// Adds one committed effect on `route`.
    pub(crate) fn record(&mut self, route: Route) {
        let slot = match route {
            Route::Payments => &mut self.payments,
            Route::Refunds => &mut self.refunds,
            Route::Fulfillments => &mut self.fulfillments,
        };
        *slot += 1;
    }

    /// Field-wise sum, for totals over all orders.
    pub(crate) fn add(self, other: Counts) -> Counts {
        Counts {
            payments: self.payments + other.payments,
            refunds: self.refunds + other.refunds,
            fulfillments: self.fulfillments + other.fulfillments,
        }
    }
}
