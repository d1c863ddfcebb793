//! The public vocabulary shared by the Rust API and the wire format.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A route that faults can be armed against: one of the three effect routes
/// (the only routes that commit side effects and honour `Idempotency-Key`), or
/// the inventory read route `GET /inventory/{sku}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Route {
    Payments,
    Refunds,
    Fulfillments,
    /// `GET /inventory/{sku}`: a read, which commits nothing. Faults on it match
    /// the SKU where effect faults match the order (see [`crate::Fault`]).
    Inventory,
}

impl Route {
    /// The first path segment of the route, e.g. `"payments"` for `POST /payments`.
    pub fn segment(self) -> &'static str {
        match self {
            Route::Payments => "payments",
            Route::Refunds => "refunds",
            Route::Fulfillments => "fulfillments",
            Route::Inventory => "inventory",
        }
    }

    /// Whether this is an effect route (`POST /payments`, `/refunds`, `/fulfillments`)
    /// rather than the inventory read.
    pub fn is_effect(self) -> bool {
        !matches!(self, Route::Inventory)
    }

    /// Parses a first path segment back into a route.
    pub fn from_segment(segment: &str) -> Option<Route> {
        match segment {
            "payments" => Some(Route::Payments),
            "refunds" => Some(Route::Refunds),
            "fulfillments" => Some(Route::Fulfillments),
            "inventory" => Some(Route::Inventory),
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
    /// Adds one committed effect on `route`. Reads commit nothing, so an
    /// inventory route leaves the counts unchanged.
    pub(crate) fn record(&mut self, route: Route) {
        let slot = match route {
            Route::Payments => &mut self.payments,
            Route::Refunds => &mut self.refunds,
            Route::Fulfillments => &mut self.fulfillments,
            Route::Inventory => return,
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
