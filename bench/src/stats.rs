//! Medians and 99th percentiles, in microseconds.

use std::time::{Duration, Instant};

use serde::Serialize;

/// A latency distribution's middle and tail, in microseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Latency {
    pub p50: f64,
    pub p99: f64,
}

impl Latency {
    pub fn of(mut samples: Vec<Duration>) -> Latency {
        samples.sort_unstable();
        let at = |q: f64| {
            let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
            samples.get(i).map_or(f64::NAN, |d| d.as_secs_f64() * 1e6)
        };
        Latency { p50: at(0.5), p99: at(0.99) }
    }
}

/// Times `n` runs of `f`, one after another.
pub fn time(n: usize, mut f: impl FnMut(usize)) -> Latency {
    let samples = (0..n)
        .map(|i| {
            let start = Instant::now();
            f(i);
            start.elapsed()
        })
        .collect();
    Latency::of(samples)
}

/// Calls per second for `total` calls that took `elapsed`.
pub fn rate(total: usize, elapsed: Duration) -> f64 {
    total as f64 / elapsed.as_secs_f64()
}
