//! This host's wall clock, in ms since the epoch. Records, leases and settle windows are stamped
//! and judged by their ledger's clock (`Ledger::now_ms`), which is this one for a ledger file and
//! the database's for a ledger that hosts share.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, millis)
}

/// A duration in whole ms, saturating: stamps and deadlines are u64 ms.
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A stamp in ms since the epoch, as RFC 3339 to the second, for messages people read.
pub fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}
