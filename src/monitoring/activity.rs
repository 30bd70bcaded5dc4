//! What happened in a pool second by second over the last minutes, on this replica: assigns,
//! 204s and outcome reports per second, for the dashboard's chart
//! (`GET /pools/{pool}/activity`).
//!
//! Requests count into atomics of the pool's [`Activity`] (found under the lock that
//! finding the pool's metric label already takes, so an assign pays one relaxed add and
//! nothing else); a sampler moves them, once a second, into a ring of the last
//! [`SECONDS`] seconds. Only pools with series of their own have one (see
//! [`super::PoolSnapshot`]), so the memory is bounded like the metrics: at most
//! `METRICS_MAX_POOLS` rings of 6 KB.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};

use serde::Serialize;

use crate::domain::{OutcomeResult, PoolId, Timestamp};

/// How many seconds a pool's ring holds: the last five minutes.
pub const SECONDS: usize = 300;

/// What a pool's activity counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// An assign answered with members (a batch counts once, as in `pa_assigns_total`).
    Assigned,
    /// An assign answered 204: no member to give.
    Empty,
    /// A report about a member of the pool, by its result.
    Reported(OutcomeResult),
}

/// The kinds, in the order of a ring's slot and of the answer's series.
const KINDS: usize = 5;

impl Event {
    fn index(self) -> usize {
        match self {
            Self::Assigned => 0,
            Self::Empty => 1,
            Self::Reported(OutcomeResult::Ok) => 2,
            Self::Reported(OutcomeResult::Failed) => 3,
            Self::Reported(OutcomeResult::Blocked) => 4,
        }
    }
}

/// One second's counts, by kind.
type Counts = [u32; KINDS];

/// One pool's activity: the counts of the second under way, and the seconds before it.
#[derive(Default)]
pub(super) struct Activity {
    current: [AtomicU32; KINDS],
    /// Only the sampler (once a second) and the activity route touch it, never a request
    /// that counts.
    ring: Mutex<Ring>,
}

impl Activity {
    /// Counts `n` events. Relaxed: the counts are independent and read only by the
    /// sampler, which takes them with a swap, so none is lost or counted twice.
    pub(super) fn count(&self, event: Event, n: u32) {
        if n > 0 {
            self.current[event.index()].fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Moves the counts since the last sample into the ring, as the counts of `second`
    /// (Unix seconds).
    pub(super) fn sample(&self, second: u64) {
        let counts: Counts =
            std::array::from_fn(|kind| self.current[kind].swap(0, Ordering::Relaxed));
        // A quiet second costs nothing: the ring reads the seconds it was not given as 0.
        if counts != [0; KINDS] {
            // A poisoned lock only means a panic while the ring was written: its seconds
            // are still numbers, at worst one second's counts are off.
            self.ring
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .record(second, counts);
        }
    }

    /// The [`SECONDS`] seconds that end at `until` (exclusive), oldest first.
    pub(super) fn series(&self, until: u64) -> [Vec<u32>; KINDS] {
        self.ring
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .series(until)
    }
}

/// The counts of the last [`SECONDS`] seconds with activity, each second in the slot of its
/// number modulo [`SECONDS`]; a second is the one its slot holds only while it is within
/// [`SECONDS`] of the newest one, so seconds never recorded read as 0.
#[derive(Default)]
struct Ring {
    /// Empty until the first second with activity: a pool that stays quiet costs no ring.
    slots: Vec<Counts>,
    /// The newest second recorded.
    newest: Option<u64>,
}

impl Ring {
    fn slot(second: u64) -> usize {
        // The remainder is below SECONDS, a usize.
        usize::try_from(second % SECONDS as u64).unwrap_or(0)
    }

    /// Adds `counts` to `second`. A second older than the ring holds is dropped.
    fn record(&mut self, second: u64, counts: Counts) {
        if self.slots.is_empty() {
            self.slots = vec![[0; KINDS]; SECONDS];
        }
        match self.newest {
            Some(newest) if second <= newest => {
                if newest - second >= SECONDS as u64 {
                    return;
                }
            }
            newest => {
                // The seconds between the newest one and this one had no activity: their
                // slots still hold counts from a lap ago.
                let start = newest.map_or(second, |n| {
                    (n + 1).max(second.saturating_sub(SECONDS as u64 - 1))
                });
                for quiet in start..=second {
                    self.slots[Self::slot(quiet)] = [0; KINDS];
                }
                self.newest = Some(second);
            }
        }
        let slot = &mut self.slots[Self::slot(second)];
        for (total, n) in slot.iter_mut().zip(counts) {
            *total = total.saturating_add(n);
        }
    }

    /// The counts of the seconds `until - SECONDS .. until`, oldest first, by kind.
    fn series(&self, until: u64) -> [Vec<u32>; KINDS] {
        let mut series: [Vec<u32>; KINDS] = std::array::from_fn(|_| Vec::with_capacity(SECONDS));
        let first = until.saturating_sub(SECONDS as u64);
        for second in first..until {
            let counts = match self.newest {
                Some(newest) if second <= newest && newest - second < SECONDS as u64 => {
                    self.slots[Self::slot(second)]
                }
                _ => [0; KINDS],
            };
            for (values, n) in series.iter_mut().zip(counts) {
                values.push(n);
            }
        }
        // Before the clock's first SECONDS seconds (never outside tests): zeros in front.
        for values in &mut series {
            while values.len() < SECONDS {
                values.insert(0, 0);
            }
        }
        series
    }
}

/// The answer of `GET /pools/{pool}/activity`.
#[derive(Debug, Serialize)]
pub struct ActivityView {
    /// The pool.
    pub pool: PoolId,
    /// How long each value covers: one second.
    pub interval_ms: u64,
    /// The end of the last second counted (a whole second); the series end there.
    pub until: Timestamp,
    /// Whether this replica counts the pool: only pools with series of their own (at most
    /// `METRICS_MAX_POOLS`) are counted, the others answer empty series.
    pub counted: bool,
    /// Assigns answered with members, per second, oldest first.
    pub assigns: Vec<u32>,
    /// Assigns answered 204.
    pub empty: Vec<u32>,
    /// Reports with result `ok`.
    pub ok: Vec<u32>,
    /// Reports with result `failed`.
    pub failed: Vec<u32>,
    /// Reports with result `blocked`.
    pub blocked: Vec<u32>,
}

impl ActivityView {
    /// The view of `series` (as [`Activity::series`] gives them, or `None` for a pool not
    /// counted) ending at `until`, in Unix seconds.
    pub(super) fn new(pool: PoolId, until: u64, series: Option<[Vec<u32>; KINDS]>) -> Self {
        let counted = series.is_some();
        let [assigns, empty, ok, failed, blocked] = series.unwrap_or_default();
        Self {
            pool,
            interval_ms: 1000,
            until: Timestamp(until.saturating_mul(1000)),
            counted,
            assigns,
            empty,
            ok,
            failed,
            blocked,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ASSIGNED: usize = 0;
    const FAILED: usize = 3;

    /// One second with `assigns` assigns and nothing else.
    fn counts(assigns: u32) -> Counts {
        let mut counts = [0; KINDS];
        counts[ASSIGNED] = assigns;
        counts
    }

    fn nonzero(values: &[u32], until: u64) -> Vec<(u64, u32)> {
        let first = until - SECONDS as u64;
        (first..until)
            .zip(values.iter().copied())
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    #[test]
    fn seconds_without_activity_read_as_zeros_and_every_series_is_full_length() {
        let mut ring = Ring::default();
        ring.record(1_000, counts(3));
        ring.record(1_004, counts(2));
        let series = ring.series(1_010);
        assert!(series.iter().all(|values| values.len() == SECONDS));
        assert_eq!(nonzero(&series[ASSIGNED], 1_010), [(1_000, 3), (1_004, 2)]);
        assert!(series[FAILED].iter().all(|n| *n == 0));
        // Nothing recorded at all: zeros, and no ring allocated.
        let quiet = Ring::default();
        assert!(quiet.series(1_010)[ASSIGNED].iter().all(|n| *n == 0));
        assert!(quiet.slots.is_empty());
    }

    #[test]
    fn the_ring_wraps_around_and_forgets_seconds_older_than_it_holds() {
        let mut ring = Ring::default();
        let start = 10_000;
        ring.record(start, counts(1));
        ring.record(start + 1, counts(2));
        // Exactly a lap later: the slot of `start` now holds this second, and `start + 1`
        // (whose slot comes next) is still within the window.
        let lap = start + SECONDS as u64;
        ring.record(lap, counts(5));
        assert_eq!(
            nonzero(&ring.series(lap + 1)[ASSIGNED], lap + 1),
            [(start + 1, 2), (lap, 5)]
        );
        // Several laps of silence: everything older is gone, though no sample cleared it.
        let later = lap + 3 * SECONDS as u64 + 7;
        ring.record(later, counts(4));
        assert_eq!(
            nonzero(&ring.series(later + 1)[ASSIGNED], later + 1),
            [(later, 4)]
        );
        // Read long after the newest second: the window has moved past it.
        assert!(
            ring.series(later + SECONDS as u64 + 1)[ASSIGNED]
                .iter()
                .all(|n| *n == 0)
        );
    }

    #[test]
    fn a_gap_shorter_than_a_lap_clears_only_the_seconds_in_it() {
        let mut ring = Ring::default();
        for second in 0..SECONDS as u64 {
            ring.record(second, counts(1));
        }
        // Ten quiet seconds, then one with activity: ten old seconds made room, the other
        // 289 are still there.
        let next = SECONDS as u64 + 10;
        ring.record(next, counts(9));
        let series = ring.series(next + 1);
        assert_eq!(
            series[ASSIGNED].iter().filter(|n| **n == 1).count(),
            SECONDS - 11
        );
        assert_eq!(series[ASSIGNED][SECONDS - 1], 9);
        assert_eq!(series[ASSIGNED][SECONDS - 2], 0);
    }

    #[test]
    fn a_late_sample_adds_to_its_second_and_one_older_than_the_ring_is_dropped() {
        let mut ring = Ring::default();
        ring.record(500, counts(1));
        ring.record(499, counts(2));
        ring.record(500, counts(3));
        ring.record(500 - SECONDS as u64, counts(7));
        assert_eq!(
            nonzero(&ring.series(501)[ASSIGNED], 501),
            [(499, 2), (500, 4)]
        );
    }

    #[test]
    fn counts_move_from_the_current_second_into_the_ring_by_kind() {
        let activity = Activity::default();
        activity.count(Event::Assigned, 1);
        activity.count(Event::Assigned, 1);
        activity.count(Event::Reported(OutcomeResult::Failed), 3);
        activity.sample(2_000);
        activity.sample(2_001);
        activity.count(Event::Empty, 1);
        activity.sample(2_002);
        let [assigns, empty, ok, failed, blocked] = activity.series(2_003);
        assert_eq!(nonzero(&assigns, 2_003), [(2_000, 2)]);
        assert_eq!(nonzero(&empty, 2_003), [(2_002, 1)]);
        assert_eq!(nonzero(&failed, 2_003), [(2_000, 3)]);
        assert!(ok.iter().chain(&blocked).all(|n| *n == 0));
    }
}
