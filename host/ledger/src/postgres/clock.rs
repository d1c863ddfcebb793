//! The database's clock, as every host sharing the ledger reads it. Leases and settle windows
//! are judged by one clock, not by each host's: a host whose clock runs ahead would otherwise
//! take over a live owner's claim, or count an empty lookup as proof before the window passed.
//!
//! Asking the database for every stamp would cost a round trip each; instead the offset of the
//! database's clock from this host's is measured when the store connects and again every
//! [`EVERY`], taken from the middle of the round trip (so its error is at most half of one,
//! well under a lease or a settle window), and added to this host's clock.

use std::sync::Weak;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use deadpool_postgres::tokio_postgres::{Client, Error};

/// How often the offset is measured again: clocks drift by milliseconds a day, and NTP steps are
/// seen within this.
const EVERY: Duration = Duration::from_secs(30);

/// The database's clock less this host's, in ms.
#[derive(Debug, Default)]
pub(super) struct Offset(AtomicI64);

impl Offset {
    /// This host's clock moved onto the database's.
    pub(super) fn now_ms(&self) -> u64 {
        shifted(oncebox_core::clock::now_ms(), self.0.load(Ordering::Relaxed))
    }
}

/// `host_ms` moved by `offset_ms`, within u64.
fn shifted(host_ms: u64, offset_ms: i64) -> u64 {
    if offset_ms >= 0 {
        host_ms.saturating_add(offset_ms.unsigned_abs())
    } else {
        host_ms.saturating_sub(offset_ms.unsigned_abs())
    }
}

/// The offset of a database clock read between `sent_ms` and `answered_ms` on this host.
fn offset(db_ms: i64, sent_ms: u64, answered_ms: u64) -> i64 {
    let middle = sent_ms / 2 + answered_ms / 2 + (sent_ms % 2 + answered_ms % 2) / 2;
    db_ms.saturating_sub(i64::try_from(middle).unwrap_or(i64::MAX))
}

/// Reads the database's clock over `client` and records its offset.
pub(super) async fn measure(client: &Client, into: &Offset) -> Result<(), Error> {
    let sent = oncebox_core::clock::now_ms();
    let row = client.query_one("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint", &[]).await?;
    let answered = oncebox_core::clock::now_ms();
    let db_ms: i64 = row.try_get(0)?;
    into.0.store(offset(db_ms, sent, answered), Ordering::Relaxed);
    Ok(())
}

/// Measures again every [`EVERY`] while the store lives; a failed reading keeps the last offset
/// (the store's own calls report a database that is gone).
pub(super) fn keep_measuring(pool: &deadpool_postgres::Pool, offset: Weak<Offset>) {
    // Neither kept alive by this task: a store dropped closes its connections at once, not at
    // the next measure.
    let pool = pool.weak();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(EVERY).await;
            let (Some(offset), Some(pool)) = (offset.upgrade(), pool.upgrade()) else { return };
            if let Ok(client) = pool.get().await
                && let Err(e) = measure(&client, &offset).await
            {
                tracing::warn!(error = %e, "could not read the database's clock; the last offset holds");
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offset_is_taken_from_the_middle_of_the_round_trip() {
        assert_eq!(offset(1_000_050, 1_000_000, 1_000_100), 0);
        assert_eq!(offset(2_000, 1_000, 1_002), 999, "the database runs ahead");
        assert_eq!(offset(500, 1_000, 1_000), -500, "or behind");
        assert_eq!(shifted(1_000, -500), 500);
        assert_eq!(shifted(1_000, 250), 1_250);
        assert_eq!(shifted(100, -500), 0, "never below the epoch");
    }
}
