//! The simulated wall clock: the host's stamps, leases and settle windows ([`oncebox_runtime::clock`])
//! follow the paused tokio clock its timers run on, from a fixed epoch, so that a seed's records
//! carry the same stamps on every run and an hour of settle windows passes in no time.

use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};

use tokio::time::Instant;

/// 2026-01-01T00:00:00Z: every seed starts here.
pub const EPOCH_MS: u64 = 1_767_225_600_000;

/// Where the current seed's clock started, on the paused tokio clock.
static STARTED: Mutex<Option<Instant>> = Mutex::new(None);

/// How far the host's wall clock is off the world's (ms; a jump moves it, `jump`).
static OFFSET: AtomicI64 = AtomicI64::new(0);

tokio::task_local! {
    /// How far the wall clock of the host serving the current call is off the world's (ms), on
    /// several hosts (`--hosts`): set around each call a host serves, and around its connecting.
    static SKEW: i64;
}

fn now_ms() -> u64 {
    let skew = SKEW.try_with(|skew| *skew).unwrap_or(0);
    world_ms().saturating_add_signed(OFFSET.load(Ordering::SeqCst)).saturating_add_signed(skew)
}

/// Runs `work` with the host's wall clock `skew_ms` off the world's. Only what runs inside
/// `work`'s own task reads it so: a task the host spawns (the PostgreSQL store's measure of the
/// database's clock every 30 s) reads the world's. See the README (several hosts).
pub async fn skewed<T>(skew_ms: i64, work: impl std::future::Future<Output = T>) -> T {
    SKEW.scope(skew_ms, work).await
}

/// The world's time (the downstream's, the history's): the simulated clock without the host's
/// jumps. On PostgreSQL, where the seed's clock is not started, the real one (read from the
/// system: the host's clock, when installed, is this one skewed).
pub fn world_ms() -> u64 {
    let started = *STARTED.lock().unwrap_or_else(|p| p.into_inner());
    match started {
        Some(at) => EPOCH_MS + oncebox_runtime::clock::millis(Instant::now().saturating_duration_since(at)),
        None => {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, oncebox_runtime::clock::millis)
        }
    }
}

/// The host's wall clock steps by `delta_ms` (forward or back), as NTP stepping a clock or a
/// person setting it does; the world's time goes on as it was.
pub fn jump(delta_ms: i64) {
    OFFSET.fetch_add(delta_ms, Ordering::SeqCst);
}

/// Makes the simulated clock the host's, for this process. `false` if another was set first.
pub fn install() -> bool {
    oncebox_runtime::clock::simulate(now_ms)
}

/// Starts a seed's clock at [`EPOCH_MS`] (inside the seed's runtime, whose clock is paused).
pub fn start() -> u64 {
    *STARTED.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    OFFSET.store(0, Ordering::SeqCst);
    EPOCH_MS
}
