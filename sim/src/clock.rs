//! The simulated wall clock: the host's stamps, leases and settle windows ([`oncebox_runtime::clock`])
//! follow the paused tokio clock its timers run on, from a fixed epoch, so that a seed's records
//! carry the same stamps on every run and an hour of settle windows passes in no time.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// 2026-01-01T00:00:00Z: every seed starts here.
pub const EPOCH_MS: u64 = 1_767_225_600_000;

/// Where the current seed's clock started, on the paused tokio clock.
static STARTED: Mutex<Option<Instant>> = Mutex::new(None);

fn now_ms() -> u64 {
    let started = *STARTED.lock().unwrap_or_else(|p| p.into_inner());
    let elapsed = started.map_or(Duration::ZERO, |at| Instant::now().saturating_duration_since(at));
    EPOCH_MS + oncebox_runtime::clock::millis(elapsed)
}

/// Makes the simulated clock the host's, for this process. `false` if another was set first.
pub fn install() -> bool {
    oncebox_runtime::clock::simulate(now_ms)
}

/// Starts a seed's clock at [`EPOCH_MS`] (inside the seed's runtime, whose clock is paused).
pub fn start() -> u64 {
    *STARTED.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    EPOCH_MS
}
