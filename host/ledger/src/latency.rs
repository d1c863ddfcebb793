//! How long the ledger's durable writes take, as a histogram a server exports (`/metrics`).
//! Counted in the `Ledger` handle around each write, whatever the backend: lock-free, a few atomic
//! adds per write. On redb an effect's answer is counted too, though it rides with the next
//! durable commit and waits for no fsync of its own.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the buckets, in seconds: 0.5 ms to 5 s, as fsync on a disk or a round trip to
/// a database spans them.
pub const BUCKETS: [f64; 12] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0];

#[derive(Debug, Default)]
pub struct Latency {
    /// Writes that took at most `BUCKETS[i]` and more than `BUCKETS[i-1]`.
    counts: [AtomicU64; BUCKETS.len()],
    over: AtomicU64,
    sum_micros: AtomicU64,
}

/// Cumulative counts, as Prometheus's `le` buckets are.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LatencySnapshot {
    pub buckets: Vec<(f64, u64)>,
    pub count: u64,
    pub sum_seconds: f64,
}

impl Latency {
    pub fn record(&self, took: Duration) {
        let seconds = took.as_secs_f64();
        match BUCKETS.iter().position(|&le| seconds <= le) {
            Some(i) => self.counts[i].fetch_add(1, Ordering::Relaxed),
            None => self.over.fetch_add(1, Ordering::Relaxed),
        };
        self.sum_micros.fetch_add(took.as_micros() as u64, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> LatencySnapshot {
        let mut running = 0;
        let buckets = BUCKETS
            .iter()
            .zip(&self.counts)
            .map(|(&le, count)| {
                running += count.load(Ordering::Relaxed);
                (le, running)
            })
            .collect();
        let count = running + self.over.load(Ordering::Relaxed);
        LatencySnapshot { buckets, count, sum_seconds: self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_and_the_slowest_count_only_in_the_total() {
        let latency = Latency::default();
        latency.record(Duration::from_micros(300));
        latency.record(Duration::from_millis(3));
        latency.record(Duration::from_secs(9));
        let snapshot = latency.snapshot();
        assert_eq!(snapshot.buckets[0], (0.0005, 1));
        assert_eq!(snapshot.buckets[3], (0.005, 2));
        assert_eq!(snapshot.buckets.last(), Some(&(5.0, 2)));
        assert_eq!(snapshot.count, 3);
        assert!((snapshot.sum_seconds - 9.0033).abs() < 1e-9);
    }
}
