//! An owner's lease on its operation, kept live while it works (DESIGN section 7: a live owner is
//! never taken over; only a stalled or dead one is).

use std::time::Duration;

use crate::stage::Stage;

/// The owner's view of its lease: never later than what the ledger holds.
pub(crate) struct Lease<'h> {
    pub host: &'h Stage,
    pub key: String,
    pub fence: u64,
    pub until_ms: u64,
}

impl Lease<'_> {
    /// Runs `work`, which ends within `bound`, keeping the lease live throughout, so that a live
    /// owner is never taken over however long an attempt (or a wait between attempts) runs; only a
    /// stalled or dead one is. Work that ends well inside the lease needs nothing (the common case:
    /// no timer, no write); work that one renewal covers gets it first; longer work renews every
    /// third of the lease while it runs.
    pub async fn over<T>(&mut self, bound: Duration, work: impl Future<Output = T>) -> T {
        let lease = self.host.lease;
        let (lease_ms, bound_ms) = (lease.as_millis() as u64, u64::try_from(bound.as_millis()).unwrap_or(u64::MAX));
        let margin_ms = lease_ms / 3;
        let now = self.host.shared.ledger.now_ms();
        if now.saturating_add(bound_ms).saturating_add(margin_ms) <= self.until_ms {
            return work.await;
        }
        if bound_ms.saturating_add(margin_ms) <= lease_ms {
            self.renew(now).await;
            return work.await;
        }
        // Every third of the lease, the first once a third of what the ledger holds has passed
        // (counted from the lease's stamp, not from now: the claim, or the last renewal, may have
        // taken a while to come back).
        let every = (lease / 3).max(Duration::from_millis(10));
        let first = Duration::from_millis(self.until_ms.saturating_sub(now).saturating_sub(lease_ms - margin_ms));
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + first.min(every), every);
        tokio::pin!(work);
        loop {
            tokio::select! {
                out = &mut work => return out,
                _ = ticks.tick() => self.renew(self.host.shared.ledger.now_ms()).await,
            }
        }
    }

    async fn renew(&mut self, now: u64) {
        let until = now + self.host.lease.as_millis() as u64;
        match self.host.shared.ledger.renew(&self.key, self.fence, until).await {
            Ok(()) => self.until_ms = self.until_ms.max(until),
            // Taken over after all (the process stalled past its lease): every write of this owner
            // is refused from now on by its fence, so it can do no harm.
            Err(e) => tracing::warn!(operation_key = %self.key, fence = self.fence, error = %e, "lease not renewed"),
        }
    }
}
