//! This host's wall clock, in ms since the epoch. Records, leases and settle windows are stamped
//! and judged by their ledger's clock (`Ledger::now_ms`), which is this one for a ledger file and
//! the database's for a ledger that hosts share.
//!
//! Built with the `simulate` feature (the runtime's `harness` turns it on; no host is built with
//! it), a process may replace it once ([`simulate`]): the whole-system simulator (`sim/`) runs the
//! host on a paused clock, so that its stamps, leases and settle windows follow the same simulated
//! time as its timers.

#[cfg(feature = "simulate")]
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The clock that replaces the system's, when one does.
#[cfg(feature = "simulate")]
static SIMULATED: OnceLock<fn() -> u64> = OnceLock::new();

pub fn now_ms() -> u64 {
    #[cfg(feature = "simulate")]
    if let Some(clock) = SIMULATED.get() {
        return clock();
    }
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, millis)
}

/// Makes `clock` this process's wall clock, for every later [`now_ms`]. Refused (`false`) once a
/// clock was set: two simulators in one process would each move the other's time.
#[cfg(feature = "simulate")]
#[doc(hidden)]
pub fn simulate(clock: fn() -> u64) -> bool {
    SIMULATED.set(clock).is_ok()
}

/// A duration in whole ms, saturating: stamps and deadlines are u64 ms.
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A stamp in ms since the epoch, as RFC 3339 to the second, for messages people read.
pub fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}
