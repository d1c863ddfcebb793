//! This host's wall clock, in ms since the epoch. Records, leases and settle windows are stamped
//! and judged by their ledger's clock (`Ledger::now_ms`), which is this one for a ledger file and
//! the database's for a ledger that hosts share.

use std::time::{SystemTime, UNIX_EPOCH};

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
