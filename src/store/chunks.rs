//! Large member calls split into chunks sized by what each chunk cost, so that no single
//! step (a Lua script on Redis, a turn of the lock in the embedded store) holds the store
//! for long, whatever the call's size.
//!
//! Each store keeps one [`ChunkSizer`] per member operation, and one for the background
//! sweep's steps (leases reclaimed plus members returned in one pool). After every chunk it
//! records how many members the chunk held and how long it took (on Redis the script call's
//! round trip, which is an upper bound of the script's own time; in the embedded store the
//! time under the lock), and sizes the next chunk so that it would take about [`CHUNK_BUDGET`]:
//! at most twice or half the previous size, between [`MIN_CHUNK`] and [`MAX_CHUNK`], and
//! always a whole multiple of [`CHUNK_GRANULE`] members. Each chunk is atomic; a call of
//! several chunks is not: a reader may see the first chunks applied and not the rest, and
//! a store failure part-way leaves the earlier chunks written (running the call again
//! completes it).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// What one chunk should cost the store. Well under the 5 ms a step may take at most: on a
/// busy machine the same chunk's time varies severalfold from one call to the next.
pub const CHUNK_BUDGET: Duration = Duration::from_millis(1);

/// Every chunk but a call's last holds a whole multiple of this many members.
pub const CHUNK_GRANULE: usize = 100;

/// The smallest chunk.
pub const MIN_CHUNK: usize = CHUNK_GRANULE;

/// The largest chunk: the most members one call may name.
pub const MAX_CHUNK: usize = 10_000;

/// The size of a sizer's first chunk, before anything was measured.
const FIRST_CHUNK: usize = 500;

/// The chunk size of one member operation, learned from the chunks it ran. Shared by the
/// calls that run at the same time, so it reads and writes one atomic number.
#[derive(Debug)]
pub(crate) struct ChunkSizer {
    members: AtomicUsize,
}

impl Default for ChunkSizer {
    fn default() -> Self {
        Self {
            members: AtomicUsize::new(FIRST_CHUNK),
        }
    }
}

impl ChunkSizer {
    /// A sizer whose first chunk holds `members` (a whole multiple of [`CHUNK_GRANULE`]).
    pub(crate) fn starting_at(members: usize) -> Self {
        Self {
            members: AtomicUsize::new(members),
        }
    }

    /// How many members the next chunk holds.
    pub(crate) fn size(&self) -> usize {
        self.members.load(Ordering::Relaxed)
    }

    /// Records that a chunk of `members` took `took`, and sizes the next one from it.
    /// Chunks smaller than [`MIN_CHUNK`] say more about the step's fixed cost than about
    /// its cost per member, and are not counted.
    pub(crate) fn record(&self, members: usize, took: Duration) {
        if members < MIN_CHUNK {
            return;
        }
        let current = self.size() as f64;
        let per_member = took.as_secs_f64() / members as f64;
        let fits = if per_member > 0.0 {
            CHUNK_BUDGET.as_secs_f64() / per_member
        } else {
            MAX_CHUNK as f64
        };
        // Within [MIN_CHUNK, MAX_CHUNK], so the conversion cannot truncate.
        let next = fits.clamp(current / 2.0, current * 2.0) as usize;
        let next = (next / CHUNK_GRANULE * CHUNK_GRANULE).clamp(MIN_CHUNK, MAX_CHUNK);
        self.members.store(next, Ordering::Relaxed);
    }

    /// `items` in chunks of this sizer's current size, read anew before each chunk. An
    /// empty call is one empty chunk, so that the step still runs (and, for instance,
    /// answers that the pool does not exist).
    pub(crate) fn chunks<'a, T>(&'a self, items: &'a [T]) -> Chunks<'a, T> {
        Chunks {
            sizer: self,
            rest: items,
            started: false,
        }
    }
}

/// The chunks of one call; see [`ChunkSizer::chunks`].
#[derive(Debug)]
pub(crate) struct Chunks<'a, T> {
    sizer: &'a ChunkSizer,
    rest: &'a [T],
    started: bool,
}

impl<'a, T> Iterator for Chunks<'a, T> {
    type Item = &'a [T];

    fn next(&mut self) -> Option<&'a [T]> {
        if self.rest.is_empty() && self.started {
            return None;
        }
        self.started = true;
        let (chunk, rest) = self.rest.split_at(self.sizer.size().min(self.rest.len()));
        self.rest = rest;
        Some(chunk)
    }
}

/// One sizer per member operation of a store, and one for the sweep's steps.
#[derive(Debug)]
pub(crate) struct MemberChunks {
    /// Seeding and importing.
    pub(crate) seed: ChunkSizer,
    /// Disabling.
    pub(crate) disable: ChunkSizer,
    /// Enabling.
    pub(crate) enable: ChunkSizer,
    /// Removing.
    pub(crate) remove: ChunkSizer,
    /// The sweep's steps on one pool, counted in leases reclaimed plus members returned:
    /// a step reclaims and returns at most this many of each.
    pub(crate) sweep: ChunkSizer,
}

impl Default for MemberChunks {
    fn default() -> Self {
        Self {
            seed: ChunkSizer::default(),
            disable: ChunkSizer::default(),
            enable: ChunkSizer::default(),
            remove: ChunkSizer::default(),
            sweep: ChunkSizer::starting_at(SWEEP_FIRST_STEP),
        }
    }
}

/// The size of the sweep's first step, before anything was measured: about the fixed
/// batch of 256 it had before steps were sized, in whole hundreds.
const SWEEP_FIRST_STEP: usize = 200;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_grow_toward_the_budget_at_most_twofold_and_stay_whole_hundreds() {
        let sizer = ChunkSizer::default();
        // 0.5 µs a member: 2,000 fit in the 1 ms budget, reached in two steps from 500.
        sizer.record(500, Duration::from_micros(250));
        assert_eq!(sizer.size(), 1_000);
        sizer.record(1_000, Duration::from_micros(500));
        assert_eq!(sizer.size(), 2_000);
        sizer.record(2_000, Duration::from_micros(1_000));
        assert_eq!(sizer.size(), 2_000);
        // 3 µs a member: 333 fit, reached in two halvings and cut to whole hundreds.
        sizer.record(2_000, Duration::from_micros(6_000));
        assert_eq!(sizer.size(), 1_000);
        sizer.record(1_000, Duration::from_micros(3_000));
        assert_eq!(sizer.size(), 500);
        sizer.record(500, Duration::from_micros(1_500));
        assert_eq!(sizer.size(), 300);
    }

    #[test]
    fn chunks_stay_between_the_floor_and_the_ceiling_and_small_calls_are_not_counted() {
        let sizer = ChunkSizer::default();
        for _ in 0..10 {
            sizer.record(MIN_CHUNK, Duration::from_secs(1));
        }
        assert_eq!(sizer.size(), MIN_CHUNK);
        sizer.record(MIN_CHUNK - 1, Duration::ZERO);
        assert_eq!(sizer.size(), MIN_CHUNK);
        for _ in 0..10 {
            sizer.record(sizer.size(), Duration::ZERO);
        }
        assert_eq!(sizer.size(), MAX_CHUNK);
    }

    #[test]
    fn a_call_is_cut_at_the_size_read_before_each_chunk_and_an_empty_call_is_one_chunk() {
        let sizer = ChunkSizer::default();
        let items: Vec<u32> = (0..1_250).collect();
        let lengths: Vec<usize> = sizer.chunks(&items).map(<[u32]>::len).collect();
        assert_eq!(lengths, [500, 500, 250]);
        let none: [u32; 0] = [];
        assert_eq!(sizer.chunks(&none).count(), 1);
    }
}
