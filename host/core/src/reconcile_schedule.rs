//! When to ask again about an operation whose outcome is unknown: the policy file's
//! `[reconciler]` settings, the backoff between tries, and the schedule of what is due. Pure: no
//! ledger and no clock of its own; the background reconciler (`oncebox_runtime::reconciler`) reads
//! the ledger and sleeps until what this says is due.

use std::collections::HashMap;
use std::time::Duration;

use crate::clock::millis;

/// How a host's reconciler asks again: the policy file's `[reconciler]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Whether `oncebox serve` runs it (on by default).
    pub enabled: bool,
    /// How long after an unknown operation is found it is asked about the first time.
    pub first: Duration,
    /// The longest wait between two tries; the wait doubles from `first` up to this.
    pub max: Duration,
    /// How often the ledger is read for operations that became unknown (or stopped being).
    pub every: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            enabled: true,
            first: Duration::from_secs(1),
            max: Duration::from_secs(5 * 60),
            every: Duration::from_secs(2),
        }
    }
}

/// At most this many unknown operations are scheduled at once, so that a ledger full of unknowns
/// does not grow the schedule without end; the rest are scheduled as earlier ones settle.
pub const MAX_SCHEDULED: usize = 10_000;

/// At most this many tries per pass: the ledger is read again between passes, so operations
/// settled meanwhile (by a call, a person or another host) are not asked about.
pub const MAX_TRIES_PER_PASS: usize = 64;

/// The least time between two tries of one operation, and between two readings of the ledger,
/// whatever the settings say: a zero setting must not spin.
pub const MIN_GAP: Duration = Duration::from_millis(100);

/// How much of a wait jitter may take off (a fifth): hosts sharing a ledger that found an
/// operation at the same moment do not keep asking about it in step.
const JITTER_SPREAD: f64 = 0.2;

/// When to ask about an operation again after its `tries`-th try (1 after the first) ended at
/// `now_ms`: `first` doubled per try up to `max`, shortened by up to a fifth as `jitter` goes over
/// [0, 1), never sooner than [`MIN_GAP`], and never before `counts_from_ms` (the end of the settle
/// window, when a `not-committed` answer would start to count: asking earlier could not prove it).
pub fn next_try(settings: &Settings, tries: u32, now_ms: u64, counts_from_ms: Option<u64>, jitter: f64) -> u64 {
    let backoff = crate::retry::exponential(settings.first, settings.max, tries.saturating_add(1));
    let wait = backoff.mul_f64(1.0 - JITTER_SPREAD * jitter.clamp(0.0, 1.0)).max(MIN_GAP);
    let at = now_ms.saturating_add(millis(wait));
    counts_from_ms.map_or(at, |counts| at.max(counts))
}

/// The operations to ask about and when: pure, no ledger and no clock of its own.
#[derive(Debug, Default)]
pub struct Schedule {
    slots: HashMap<String, Slot>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Slot {
    tool: String,
    tries: u32,
    due_ms: u64,
}

impl Schedule {
    /// Makes the schedule hold the unknown operations given as `(operation key, tool)` and no
    /// others: one no longer among them is dropped (it settled, or its tool is gone), one newly
    /// among them is due `first` after `now_ms`, one already scheduled keeps its tries and its
    /// time. At most [`MAX_SCHEDULED`]: scheduled ones are kept first, then new ones in the order
    /// given. Returns how many were left out for now.
    pub fn refresh(
        &mut self,
        settings: &Settings,
        unknown: impl IntoIterator<Item = (String, String)>,
        now_ms: u64,
    ) -> usize {
        let mut kept = HashMap::with_capacity(self.slots.len());
        let mut new = Vec::new();
        for (key, tool) in unknown {
            match self.slots.remove(&key) {
                // The same key with another tool cannot happen (the key is derived from the tool),
                // but the tool named is the ledger's.
                Some(slot) => {
                    kept.insert(key, Slot { tool, ..slot });
                }
                None => new.push((key, tool)),
            }
        }
        let first = now_ms.saturating_add(millis(settings.first));
        let mut left_out = 0;
        for (key, tool) in new {
            if kept.len() >= MAX_SCHEDULED {
                left_out += 1;
                continue;
            }
            kept.entry(key).or_insert(Slot { tool, tries: 0, due_ms: first });
        }
        // A cap lowered under what was kept is not possible (it is a const), but the bound is the
        // invariant: never more than MAX_SCHEDULED.
        self.slots = kept;
        left_out
    }

    /// What is due at `now_ms`, `(operation key, tool)`, soonest first, at most `limit`.
    pub fn due(&self, now_ms: u64, limit: usize) -> Vec<(String, String)> {
        let mut due: Vec<(&String, &Slot)> = self.slots.iter().filter(|(_, slot)| slot.due_ms <= now_ms).collect();
        due.sort_by(|a, b| a.1.due_ms.cmp(&b.1.due_ms).then_with(|| a.0.cmp(b.0)));
        due.into_iter().take(limit).map(|(key, slot)| (key.clone(), slot.tool.clone())).collect()
    }

    /// When the next try is due, if anything is scheduled.
    pub fn next_due(&self) -> Option<u64> {
        self.slots.values().map(|slot| slot.due_ms).min()
    }

    /// Records a try of `key` that settled nothing and schedules the next ([`next_try`]). Returns
    /// when it is due and how many tries there have been, or `None` if `key` is not scheduled.
    pub fn tried(
        &mut self,
        key: &str,
        settings: &Settings,
        now_ms: u64,
        counts_from_ms: Option<u64>,
        jitter: f64,
    ) -> Option<(u64, u32)> {
        let slot = self.slots.get_mut(key)?;
        slot.tries = slot.tries.saturating_add(1);
        slot.due_ms = next_try(settings, slot.tries, now_ms, counts_from_ms, jitter);
        Some((slot.due_ms, slot.tries))
    }

    /// Drops `key`: it is settled. Returns its tries so far, if it was scheduled.
    pub fn settled(&mut self, key: &str) -> Option<u32> {
        self.slots.remove(key).map(|slot| slot.tries)
    }

    /// How many times `key` has been tried so far (0 if it is not scheduled).
    pub fn tries(&self, key: &str) -> u32 {
        self.slots.get(key).map_or(0, |slot| slot.tries)
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Whether `key` is scheduled.
    pub fn contains(&self, key: &str) -> bool {
        self.slots.contains_key(key)
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    const S: Settings = Settings {
        enabled: true,
        first: Duration::from_secs(1),
        max: Duration::from_secs(60),
        every: Duration::from_secs(2),
    };

    fn ops(keys: &[&str]) -> Vec<(String, String)> {
        keys.iter().map(|k| (k.to_string(), "charge".to_string())).collect()
    }

    #[test]
    fn a_new_unknown_is_due_first_after_it_is_found() {
        let mut schedule = Schedule::default();
        assert_eq!(schedule.refresh(&S, ops(&["a"]), 10_000), 0);
        assert!(schedule.due(10_999, 10).is_empty());
        assert_eq!(schedule.due(11_000, 10), ops(&["a"]));
        assert_eq!(schedule.next_due(), Some(11_000));
    }

    #[test]
    fn the_wait_doubles_from_first_up_to_max() {
        let waits: Vec<u64> = (1..=9).map(|tries| next_try(&S, tries, 0, None, 0.0)).collect();
        assert_eq!(waits, [2_000, 4_000, 8_000, 16_000, 32_000, 60_000, 60_000, 60_000, 60_000]);
        // Far past any shift: still the max, no overflow.
        assert_eq!(next_try(&S, u32::MAX, 0, None, 0.0), 60_000);
    }

    #[test]
    fn jitter_shortens_by_at_most_a_fifth_and_never_below_the_gap() {
        assert_eq!(next_try(&S, 1, 0, None, 0.999_999), 1_600);
        assert_eq!(next_try(&S, 1, 0, None, 0.5), 1_800);
        let zero = Settings { first: Duration::ZERO, max: Duration::ZERO, ..S };
        assert_eq!(next_try(&zero, 3, 5, None, 0.0), 5 + millis(MIN_GAP), "a zero setting does not spin");
    }

    #[test]
    fn not_before_the_settle_window_ends_when_that_is_what_kept_it_unknown() {
        assert_eq!(next_try(&S, 1, 1_000, Some(90_000), 0.0), 90_000);
        // A settle window already over does not bring the try forward.
        assert_eq!(next_try(&S, 1, 1_000, Some(500), 0.0), 3_000);
    }

    #[test]
    fn tries_are_counted_and_an_operation_no_longer_unknown_drops_out() {
        let mut schedule = Schedule::default();
        schedule.refresh(&S, ops(&["a", "b"]), 0);
        assert_eq!(schedule.tried("a", &S, 1_000, None, 0.0), Some((3_000, 1)));
        assert_eq!(schedule.tried("a", &S, 3_000, None, 0.0), Some((7_000, 2)));
        assert_eq!(schedule.tried("zz", &S, 3_000, None, 0.0), None, "not scheduled");
        // Read again: `a` keeps its tries and time, `b` settled meanwhile, `c` is new.
        schedule.refresh(&S, ops(&["a", "c"]), 4_000);
        assert!(!schedule.contains("b"));
        assert_eq!(schedule.due(5_000, 10), ops(&["c"]));
        assert_eq!(schedule.due(7_000, 10), ops(&["c", "a"]), "soonest first");
        assert_eq!(schedule.settled("a"), Some(2));
        assert_eq!(schedule.settled("a"), None);
        assert_eq!(schedule.len(), 1);
    }

    #[test]
    fn due_is_limited_and_in_order() {
        let mut schedule = Schedule::default();
        schedule.refresh(&S, ops(&["c", "b", "a"]), 0);
        assert_eq!(schedule.due(1_000, 2), ops(&["a", "b"]), "same time: key order");
    }

    #[test]
    fn the_schedule_is_bounded_keeping_what_it_has() {
        let mut schedule = Schedule::default();
        let many: Vec<(String, String)> =
            (0..MAX_SCHEDULED + 5).map(|i| (format!("k{i:06}"), "charge".to_string())).collect();
        schedule.refresh(&S, many.iter().skip(5).cloned(), 0);
        assert_eq!(schedule.len(), MAX_SCHEDULED);
        let left_out = schedule.refresh(&S, many.iter().cloned(), 1_000);
        assert_eq!((schedule.len(), left_out), (MAX_SCHEDULED, 5));
        assert!(schedule.contains(&many[MAX_SCHEDULED + 4].0) && !schedule.contains(&many[0].0), "kept first");
        // Once some settle, the others get in.
        schedule.refresh(&S, many.iter().take(10).cloned(), 2_000);
        assert_eq!(schedule.len(), 10);
    }
}
