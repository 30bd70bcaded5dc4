//! Large member calls split into chunks sized by what each chunk cost, so that no single
//! step (a Lua script on Redis, a turn of the lock in the embedded store) holds the store
//! for long, whatever the call's size.
//!
//! Each store keeps one [`ChunkSizer`] per member operation, and one for the background
//! sweep's steps (leases reclaimed plus members returned in one pool). Chunks are always
//! between [`MIN_CHUNK`] and [`MAX_CHUNK`] members and a whole multiple of
//! [`CHUNK_GRANULE`], and grow at most twofold from one to the next.
//!
//! On Redis the member operations' chunk scripts and the sweep's steps keep their own
//! bound: each looks at Redis's clock after every [`CHUNK_GRANULE`] members (or leases, or
//! returns) and stops at the first look past [`CHUNK_BOUND`], answering for what it
//! handled; the rest of a member chunk goes first in the next one (see
//! [`Chunks::stopped_after`]), and the sweep runs another step. The script's clock is the
//! measure of its cost, so a chunk that stopped gives the next one the size it reached, and
//! a chunk that ran whole doubles the next (see [`ChunkSizer::record_bounded`]). A round
//! trip would be a poor measure: on a loaded machine it is mostly the wait for a core and
//! the network, and sized by it chunks shrank to the smallest while Redis spent 5–10 µs a call on its
//! own fixed work. The embedded store's steps record how long they took under the lock, and
//! the next is sized so that it would take about [`CHUNK_BUDGET`], at most half or twice
//! the previous size (see [`ChunkSizer::record`]). Each chunk is atomic; a call of
//! several chunks is not: a reader may see the first chunks applied and not the rest, and
//! a store failure part-way leaves the earlier chunks written (running the call again
//! completes it).
//!
//! Between two chunks the store is left to everything else for a while, but only when
//! something else wants it: a chunk during which another call was waiting on the store is
//! contended, and a [`DutyCycle`], one per store and shared by all its large operations,
//! makes the next chunk (of the same call or of any other) wait until the store has had the
//! contended chunk's own cost times (1 − [`LARGE_WORK_SHARE`]) / [`LARGE_WORK_SHARE`] to
//! itself, so that under contention large operations together take at most that share of
//! its time. A chunk nobody waited through earns no rest: on an idle store a large
//! operation runs its chunks back to back. A call that finds the store rested starts at
//! once.
//!
//! What makes a chunk contended (see [`Traffic`] and [`RemoteLoad`]):
//! - this replica's own calls: the store counts its calls in flight (queued for a
//!   connection or the lock included), all but the chunks of large operations, and a chunk
//!   is contended when one was in flight as it started or ended, or started meanwhile;
//! - on Redis, other replicas' (and other clients') calls, which no counter here sees:
//!   at most every [`LOAD_SAMPLE_INTERVAL`] a large operation reads how many bytes Redis
//!   has received from all its clients, and the bytes others sent since the reading before
//!   (all of them less this replica's chunks, which it counts as it sends them) say
//!   whether others kept Redis busy: at [`BUSY_BYTES_PER_SECOND`] or more, every chunk
//!   rests until the next reading says otherwise. Redis's own count is the same whichever
//!   replica reads it, and no wait on this machine moves it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::domain::PoolId;

/// What one chunk should cost the store. Well under the 5 ms a step may take at most: on a
/// busy machine the same chunk's time varies severalfold from one call to the next. And
/// short enough that an assign of another pool which finds a chunk running waits less
/// than its own idle p99 (under a millisecond on Redis) for it to end.
pub const CHUNK_BUDGET: Duration = Duration::from_micros(500);

/// How long a Redis chunk script may run before it stops at its next look at the clock
/// (after a whole [`CHUNK_GRANULE`] members), whatever its size: the budget, so that every
/// chunk holds Redis for at most about this plus one granule's members, whether the
/// members cost what the chunks before them did or far more.
pub const CHUNK_BOUND: Duration = CHUNK_BUDGET;

/// Every chunk but a call's last holds a whole multiple of this many members, and a chunk
/// script looks at the clock after each such group. Small, so that the smallest chunk fits
/// the budget too: a disable or an enable costs Redis 5–10 µs a member on a 1,000,000-member
/// pool, and chunks of 100 took it 0.8–1 ms each.
pub const CHUNK_GRANULE: usize = 25;

/// The smallest chunk.
pub const MIN_CHUNK: usize = CHUNK_GRANULE;

/// The largest chunk: the most members one call may name.
pub const MAX_CHUNK: usize = 10_000;

/// The size of a sizer's first chunk, before anything was measured: small, because the
/// first chunk of a call that is the first of its kind is sized blind (at 500 members a
/// first disable took Redis 3–5 ms, a first enable up to 17 ms); twofold growth reaches
/// the cheapest operation's size (seeding, about 3 µs a member) within three chunks.
const FIRST_CHUNK: usize = 100;

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

    /// Records that a Redis chunk script asked about `asked` members handled `handled`
    /// (fewer when it stopped at [`CHUNK_BOUND`]), and sizes the next chunk from it: the
    /// size it reached when it stopped, twice its size when it ran whole. A last chunk
    /// smaller than the size says nothing of the size, and is not counted.
    pub(crate) fn record_bounded(&self, asked: usize, handled: usize) {
        let current = self.size();
        let next = if handled < asked {
            handled
        } else if asked >= current {
            current * 2
        } else {
            return;
        };
        let next = (next / CHUNK_GRANULE * CHUNK_GRANULE).clamp(MIN_CHUNK, MAX_CHUNK);
        self.members.store(next, Ordering::Relaxed);
    }

    /// `items` in chunks of this sizer's current size, read anew before each chunk. An
    /// empty call is one empty chunk, so that the step still runs (and, for instance,
    /// answers that the pool does not exist).
    pub(crate) fn chunks<'a, T>(&'a self, items: &'a [T]) -> Chunks<'a, T> {
        Chunks {
            sizer: self,
            items,
            last: 0,
            next: 0,
            started: false,
        }
    }
}

/// The chunks of one call; see [`ChunkSizer::chunks`].
#[derive(Debug)]
pub(crate) struct Chunks<'a, T> {
    sizer: &'a ChunkSizer,
    items: &'a [T],
    /// Where the chunk handed out last starts.
    last: usize,
    /// Where the next chunk starts.
    next: usize,
    started: bool,
}

impl<T> Chunks<'_, T> {
    /// Says that the store handled only the first `handled` members of the chunk handed out
    /// last (its script stopped at [`CHUNK_BOUND`]): the next chunk starts with the rest.
    /// The store must have handled at least one member, or the call would never end.
    pub(crate) fn stopped_after(&mut self, handled: usize) {
        debug_assert!(
            handled > 0,
            "a chunk that stopped handled none of its members"
        );
        self.next = self.next.min(self.last + handled);
    }
}

impl<'a, T> Iterator for Chunks<'a, T> {
    type Item = &'a [T];

    fn next(&mut self) -> Option<&'a [T]> {
        let rest = &self.items[self.next..];
        if rest.is_empty() && self.started {
            return None;
        }
        self.started = true;
        let chunk = &rest[..self.sizer.size().min(rest.len())];
        self.last = self.next;
        self.next += chunk.len();
        Some(chunk)
    }
}

/// The largest share of the store's time that the chunks of large operations (seed,
/// import, disable, enable, remove, the sweep's steps, the pieces of a member listing) take
/// all together while other calls wait on the store (on an idle store they take all of
/// it: see the module doc). Every pool on a Redis shares its one thread, and so does every assign:
/// with chunks sent back to back Redis was busy three quarters of the time, an assign of
/// another pool often queued behind a chunk, and the assigns queued behind it had no time
/// to drain before the next one, which put their p99 at 1.4–5.9 × its idle figure
/// (`bench/slowlog.sh`). A rest of three times the chunk's cost lets that queue (16
/// assigns take Redis about half a millisecond, a chunk's budget) drain with room to spare.
/// A quarter rather than a third: with a third, a plain pool info repeated on a quiet
/// machine (calls far under a millisecond) already put the other pool's p99 at 1.84 × idle,
/// and seed and disable at 2.06 and 2.08 ×. The benchmark's assigns keep Redis busy, so what
/// they lose is throughput: they queue about 1 / (1 − share) as long, 1.5 × at a third and
/// 1.33 × at a quarter, whatever the length of the chunks. The price is a large operation
/// about four times as long as its chunks alone instead of three.
pub const LARGE_WORK_SHARE: f64 = 1.0 / 4.0;

/// How long the store rests after a chunk that took `took`, so that the chunk takes
/// [`LARGE_WORK_SHARE`] of the time from its start to the next chunk's.
pub(crate) fn rest_after(took: Duration) -> Duration {
    took.mul_f64((1.0 - LARGE_WORK_SHARE) / LARGE_WORK_SHARE)
}

/// When the next chunk of a store's large operations may start: after the last contended
/// chunk's end and the rest it earned. Shared by every large operation of the store, so
/// that two at once, or a caller sending one call after another, share one budget instead
/// of taking one each.
#[derive(Debug, Default)]
pub(crate) struct DutyCycle {
    /// The end of the rest owed; `None` before the first contended chunk.
    resume_at: Mutex<Option<Instant>>,
}

impl DutyCycle {
    /// How long a chunk ready to start at `now` waits first.
    pub(crate) fn wait_at(&self, now: Instant) -> Duration {
        self.resume()
            .map_or(Duration::ZERO, |at| at.saturating_duration_since(now))
    }

    /// Books a contended chunk that ended at `ended` and took `took`. Its rest follows the
    /// rest still owed when that ends later (chunks of two operations at once queue behind
    /// each other in the store, so their rests add up).
    pub(crate) fn book(&self, ended: Instant, took: Duration) {
        let mut resume_at = self
            .resume_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let from = resume_at.map_or(ended, |owed| owed.max(ended));
        *resume_at = Some(from + rest_after(took));
    }

    /// Waits until the store has rested from the chunks before (at once when it has).
    pub(crate) async fn rest(&self) {
        let wait = self.wait_at(Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }

    fn resume(&self) -> Option<Instant> {
        // A panic elsewhere cannot leave the instant half-written: it is one value.
        *self
            .resume_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One unit of [`Traffic`]'s count of calls started: the upper half of the word.
const STARTED: u64 = 1 << 32;

/// [`Traffic`]'s count of calls in flight: the lower half of the word.
const IN_FLIGHT: u64 = STARTED - 1;

/// The store calls of this replica in flight, all but the chunks of large operations: the
/// foreground a chunk may delay (the sweep's and the checks' own small calls count too;
/// they wait on the store as a request does). One word holds both the calls in flight
/// (lower half) and the calls started, wrapping (upper half), so that a call costs one
/// atomic add as it starts and one subtraction as it ends, and nothing else: no lock, no
/// allocation on the path of an assign.
#[derive(Debug, Default)]
pub(crate) struct Traffic {
    calls: AtomicU64,
}

impl Traffic {
    /// Counts a call in flight until the answer is dropped. Taken before the call queues
    /// (for a connection, for the lock), so that a call waiting behind a chunk counts.
    pub(crate) fn enter(&self) -> InFlight<'_> {
        // Relaxed: the count is a hint read between chunks, never a guard of other memory.
        self.calls.fetch_add(STARTED + 1, Ordering::Relaxed);
        InFlight(self)
    }

    /// The count as it stands, to compare with a later one.
    pub(crate) fn seen(&self) -> Seen {
        Seen(self.calls.load(Ordering::Relaxed))
    }
}

/// A call counted by [`Traffic::enter`], until dropped.
#[derive(Debug)]
pub(crate) struct InFlight<'a>(&'a Traffic);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.calls.fetch_sub(1, Ordering::Relaxed);
    }
}

/// [`Traffic`] at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seen(u64);

impl Seen {
    /// Whether a call was in flight at this moment or at `later`, or started between them.
    /// A call that started and ended between the two is seen by the count of starts, which
    /// only a few billion calls in one chunk could bring back to where it was.
    pub(crate) fn busy_until(self, later: Self) -> bool {
        self.0 & IN_FLIGHT != 0 || later.0 & IN_FLIGHT != 0 || self.0 >> 32 != later.0 >> 32
    }
}

/// How often, at most, a large operation on Redis reads how many bytes Redis has received
/// from all its clients (`INFO stats`, one short script in the pool's hash slot). Four reads
/// a second cost Redis about 80 µs; a load that starts between two reads is seen within
/// this long (this replica's own calls are seen at once, through [`Traffic`]).
pub(crate) const LOAD_SAMPLE_INTERVAL: Duration = Duration::from_millis(250);

/// Bytes per second that others (every client but this replica's large operations) send to
/// Redis at and above which a large operation rests after each chunk. About 25 plain
/// assigns a second (an `EVALSHA` with its 22 keys is 600–700 bytes), and 35 times what an
/// idle replica sends (its due-work polls: about 460 bytes a second). Below it, a call of
/// someone else rarely arrives during a chunk, and a rest would not lower its p99 anyway:
/// what one call meets is at most one chunk, rests or not; the rests are for a queue,
/// which only steady traffic builds.
pub(crate) const BUSY_BYTES_PER_SECOND: u64 = 16 * 1024;

/// How old a pool's last reading may be and still be the start of the next one: older,
/// and the bytes between the two would say how busy Redis was long ago, so the next reading
/// starts afresh.
const LOAD_SAMPLE_STALE: u32 = 4;

/// What Redis received from others while this replica's large operations ran, read at most
/// every [`LOAD_SAMPLE_INTERVAL`]: the bytes Redis counts as received from every client,
/// less the bytes this replica's chunks sent it (counted exactly as they are written),
/// over the time between two readings. Kept per pool, because on a cluster each pool's
/// readings come from the node that serves its hash slot.
///
/// Why bytes: every call of every client crosses the network (a call's bytes, unlike its
/// commands, are not counted again for the commands a script runs), the count is Redis's
/// own and so is the same for every replica, and nothing on this machine (a core taken by
/// another process, a slow wake-up) changes it, where a round trip measured here did:
/// on two shared cores an idle import rested after more than half its steps for waits
/// that were the service's own.
#[derive(Debug)]
pub(crate) struct RemoteLoad {
    /// [`LOAD_SAMPLE_INTERVAL`], or in tests zero (a reading before every chunk) or none
    /// (no reading, for tests that count a large operation's calls).
    interval: Option<Duration>,
    pools: Mutex<HashMap<PoolId, Reading>>,
}

/// A pool's last reading, and this replica's bytes to Redis since it.
#[derive(Debug, Clone, Copy)]
struct Reading {
    at: Instant,
    /// `total_net_input_bytes` as Redis answered it.
    received: u64,
    /// What this replica's large operations on the pool have sent Redis since then,
    /// including the next reading's own call.
    own: u64,
    /// Whether others sent at least [`BUSY_BYTES_PER_SECOND`] between this reading and the
    /// one before it.
    busy: bool,
}

impl Default for RemoteLoad {
    fn default() -> Self {
        Self::every(Some(LOAD_SAMPLE_INTERVAL))
    }
}

impl RemoteLoad {
    fn every(interval: Option<Duration>) -> Self {
        Self {
            interval,
            pools: Mutex::default(),
        }
    }

    fn pools(&self) -> std::sync::MutexGuard<'_, HashMap<PoolId, Reading>> {
        // A panic elsewhere cannot leave a reading half-written: each is replaced whole.
        self.pools
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a chunk of `pool` starting at `now` should read Redis's count first.
    pub(crate) fn due(&self, pool: &PoolId, now: Instant) -> bool {
        self.interval.is_some_and(|interval| {
            self.pools()
                .get(pool)
                .is_none_or(|last| now.saturating_duration_since(last.at) >= interval)
        })
    }

    /// Counts `bytes` that a large operation of `pool` is about to send Redis. Bytes sent
    /// before the pool's first reading are in that reading already.
    pub(crate) fn sent(&self, pool: &PoolId, bytes: usize) {
        if let Some(last) = self.pools().get_mut(pool) {
            last.own = last.own.saturating_add(bytes as u64);
        }
    }

    /// Records that Redis answered at `now` that it had received `received` bytes in all,
    /// and says whether others are busy: they sent at least [`BUSY_BYTES_PER_SECOND`] since
    /// the reading before. The first reading (or one after a long pause) has nothing to
    /// compare with, and counts as idle.
    pub(crate) fn read(&self, pool: &PoolId, now: Instant, received: u64) -> bool {
        let mut pools = self.pools();
        // The map holds the pools with large work of late: forget the others.
        let stale = self.interval.unwrap_or_default().max(LOAD_SAMPLE_INTERVAL) * LOAD_SAMPLE_STALE;
        pools.retain(|_, last| now.saturating_duration_since(last.at) < stale);
        let busy = pools.get(pool).is_some_and(|last| {
            let others = received.saturating_sub(last.received.saturating_add(last.own));
            let elapsed = now.saturating_duration_since(last.at);
            // `others / elapsed >= BUSY_BYTES_PER_SECOND`, in integers: with readings
            // microseconds apart (tests read before every chunk), any byte of others counts.
            u128::from(others) * 1_000_000
                >= u128::from(BUSY_BYTES_PER_SECOND) * elapsed.as_micros()
                && others > 0
        });
        pools.insert(
            pool.clone(),
            Reading {
                at: now,
                received,
                own: 0,
                busy,
            },
        );
        busy
    }

    /// Whether the last reading of `pool` found others busy.
    pub(crate) fn busy(&self, pool: &PoolId) -> bool {
        self.pools().get(pool).is_some_and(|last| last.busy)
    }
}

/// One sizer per member operation of a store, one for the sweep's steps, and the duty
/// cycle they all share.
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
    /// The store's calls in flight, but for chunks: what a chunk may delay here.
    pub(crate) traffic: Traffic,
    /// The rests between contended chunks of all of them, and of the pieces of member
    /// listings.
    duty: DutyCycle,
    /// What Redis received from others of late, which tells of other replicas' calls.
    pub(crate) load: RemoteLoad,
    /// Chunks run, and those of them that earned a rest (contended): for tests, which
    /// count rests rather than time them.
    chunks_run: AtomicU64,
    rests_earned: AtomicU64,
    /// How long a Redis chunk script runs before it stops part-way: [`CHUNK_BOUND`].
    bound: Duration,
}

/// A chunk about to run: the store's traffic as it started, and whether others kept Redis
/// busy of late (see [`RemoteLoad`]).
#[derive(Debug, Clone, Copy)]
#[must_use = "a chunk's start is given back when it has run"]
pub(crate) struct Started {
    seen: Seen,
    others_busy: bool,
}

impl Started {
    /// This start, on a Redis whose last reading found others busy or not.
    pub(crate) fn others_busy(self, busy: bool) -> Self {
        Self {
            others_busy: busy,
            ..self
        }
    }
}

impl MemberChunks {
    /// Chunks whose scripts stop at `bound` instead of [`CHUNK_BOUND`]: with zero, every
    /// chunk stops at its first look at the clock, after [`CHUNK_GRANULE`] members.
    #[cfg(test)]
    pub(crate) fn bounded_at(bound: Duration) -> Self {
        Self {
            bound,
            ..Self::default()
        }
    }

    /// These chunks, reading Redis's count of received bytes every `interval` instead of
    /// every [`LOAD_SAMPLE_INTERVAL`] (with zero, before every chunk), or never.
    #[cfg(test)]
    pub(crate) fn reading_load_every(mut self, interval: Option<Duration>) -> Self {
        self.load = RemoteLoad::every(interval);
        self
    }

    /// How long a Redis chunk script may run before it stops part-way (see
    /// [`CHUNK_BOUND`]).
    pub(crate) fn bound(&self) -> Duration {
        self.bound
    }

    /// Waits out the rest the store is owed before a chunk (see [`DutyCycle`]), and notes
    /// the store's traffic as the chunk starts.
    pub(crate) async fn rest(&self) -> Started {
        self.duty.rest().await;
        Started {
            seen: self.traffic.seen(),
            others_busy: false,
        }
    }

    /// Records that a chunk of `members`, sized by `sizer`, that started as `started` just
    /// ended and took `took`: sizes the next chunk of `sizer` and books the rest it earned,
    /// if any.
    pub(crate) fn ran(&self, started: Started, sizer: &ChunkSizer, members: usize, took: Duration) {
        sizer.record(members, took);
        self.ran_piece(started, took);
    }

    /// Records that a Redis chunk script sized by `sizer`, asked about `asked` members, just
    /// ended having handled `handled` of them, and that its round trip took `took`: sizes
    /// the next chunk from the script's own bound (see [`ChunkSizer::record_bounded`]) and
    /// books the rest it earned, if any.
    pub(crate) fn ran_bounded(
        &self,
        started: Started,
        sizer: &ChunkSizer,
        (asked, handled): (usize, usize),
        took: Duration,
    ) {
        sizer.record_bounded(asked, handled);
        self.ran_piece(started, took);
    }

    /// Records that a step no sizer sizes (a piece of a member listing, a pool's last
    /// sweep step) that started as `started` just ended and took `took`: books the rest it
    /// earned, if any.
    ///
    /// A step is contended, and rests, when this replica's calls waited through it or
    /// others kept Redis busy of late. Counted in `/metrics` too (steps, and rests by what
    /// earned them), so that an operator can tell whether a long import rested and for
    /// whom; a step is a fraction of a millisecond, so the macros' lookup is nothing beside
    /// it.
    pub(crate) fn ran_piece(&self, started: Started, took: Duration) {
        self.chunks_run.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("pa_large_work_steps_total").increment(1);
        let local = started.seen.busy_until(self.traffic.seen());
        if started.others_busy || local {
            self.rests_earned.fetch_add(1, Ordering::Relaxed);
            // This replica's calls first: when both hold, the rest protected them for sure.
            let cause = if local { "local" } else { "remote" };
            metrics::counter!("pa_large_work_rests_total", "cause" => cause).increment(1);
            self.duty.book(Instant::now(), took);
        }
    }

    /// How many chunks ran, and how many of them earned a rest.
    #[cfg(test)]
    pub(crate) fn rests(&self) -> (u64, u64) {
        (
            self.chunks_run.load(Ordering::Relaxed),
            self.rests_earned.load(Ordering::Relaxed),
        )
    }
}

impl Default for MemberChunks {
    fn default() -> Self {
        Self {
            seed: ChunkSizer::default(),
            disable: ChunkSizer::default(),
            enable: ChunkSizer::default(),
            remove: ChunkSizer::default(),
            sweep: ChunkSizer::starting_at(SWEEP_FIRST_STEP),
            traffic: Traffic::default(),
            duty: DutyCycle::default(),
            load: RemoteLoad::default(),
            chunks_run: AtomicU64::new(0),
            rests_earned: AtomicU64::new(0),
            bound: CHUNK_BOUND,
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
    fn steps_and_their_rests_are_counted_in_the_metrics_by_what_earned_them() {
        // A recorder of this test's own: the process's one is shared by every test.
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let chunks = MemberChunks::default();
        metrics::with_local_recorder(&recorder, || {
            // Nobody waits: no rest.
            let idle = Started {
                seen: chunks.traffic.seen(),
                others_busy: false,
            };
            chunks.ran_piece(idle, Duration::from_micros(100));
            // One of this replica's calls is in flight through the step.
            let started = Started {
                seen: chunks.traffic.seen(),
                others_busy: false,
            };
            let call = chunks.traffic.enter();
            chunks.ran_piece(started, Duration::from_micros(100));
            drop(call);
            // A Redis step after a reading that found others busy.
            let started = Started {
                seen: chunks.traffic.seen(),
                others_busy: true,
            };
            chunks.ran_piece(started, Duration::from_micros(100));
        });
        let text = handle.render();
        let mut counted: Vec<&str> = text
            .lines()
            .filter(|line| line.starts_with("pa_large_work"))
            .collect();
        counted.sort_unstable();
        assert_eq!(
            counted,
            [
                "pa_large_work_rests_total{cause=\"local\"} 1",
                "pa_large_work_rests_total{cause=\"remote\"} 1",
                "pa_large_work_steps_total 3",
            ]
        );
    }

    #[test]
    fn chunks_grow_toward_the_budget_at_most_twofold_and_stay_whole_granules() {
        let sizer = ChunkSizer::default();
        // 0.125 µs a member: 4,000 fit in the 0.5 ms budget, reached in doublings from 100.
        assert_eq!(sizer.size(), 100);
        sizer.record(100, Duration::from_nanos(12_500));
        assert_eq!(sizer.size(), 200);
        sizer.record(200, Duration::from_micros(25));
        assert_eq!(sizer.size(), 400);
        sizer.record(400, Duration::from_micros(50));
        assert_eq!(sizer.size(), 800);
        sizer.record(800, Duration::from_micros(100));
        assert_eq!(sizer.size(), 1_600);
        sizer.record(1_600, Duration::from_micros(200));
        assert_eq!(sizer.size(), 3_200);
        sizer.record(3_200, Duration::from_micros(400));
        assert_eq!(sizer.size(), 4_000);
        sizer.record(4_000, Duration::from_micros(500));
        assert_eq!(sizer.size(), 4_000);
        // 3 µs a member: 166 fit, reached in halvings and cut to whole granules of 25.
        sizer.record(4_000, Duration::from_micros(12_000));
        assert_eq!(sizer.size(), 2_000);
        sizer.record(2_000, Duration::from_micros(6_000));
        assert_eq!(sizer.size(), 1_000);
        sizer.record(1_000, Duration::from_micros(3_000));
        assert_eq!(sizer.size(), 500);
        sizer.record(500, Duration::from_micros(1_500));
        assert_eq!(sizer.size(), 250);
        sizer.record(250, Duration::from_micros(750));
        assert_eq!(sizer.size(), 150);
        sizer.record(150, Duration::from_micros(450));
        assert_eq!(sizer.size(), 150);
    }

    #[test]
    fn a_chunk_that_stopped_at_its_bound_sizes_the_next_and_one_that_ran_whole_doubles_it() {
        let sizer = ChunkSizer::default();
        sizer.record_bounded(100, 100);
        assert_eq!(sizer.size(), 200);
        sizer.record_bounded(200, 75);
        assert_eq!(sizer.size(), 75);
        sizer.record_bounded(75, 75);
        assert_eq!(sizer.size(), 150);
        // A call's last chunk, smaller than the size, says nothing of it.
        sizer.record_bounded(40, 40);
        assert_eq!(sizer.size(), 150);
        for _ in 0..10 {
            sizer.record_bounded(sizer.size(), sizer.size());
        }
        assert_eq!(sizer.size(), MAX_CHUNK);
        sizer.record_bounded(MAX_CHUNK, CHUNK_GRANULE);
        assert_eq!(sizer.size(), MIN_CHUNK);
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
        let sizer = ChunkSizer::starting_at(500);
        let items: Vec<u32> = (0..1_250).collect();
        let lengths: Vec<usize> = sizer.chunks(&items).map(<[u32]>::len).collect();
        assert_eq!(lengths, [500, 500, 250]);
        let none: [u32; 0] = [];
        assert_eq!(sizer.chunks(&none).count(), 1);
    }

    #[test]
    fn the_members_a_stopped_chunk_left_come_first_in_the_next_one() {
        let sizer = ChunkSizer::default();
        let items: Vec<u32> = (0..250).collect();
        let mut chunks = sizer.chunks(&items);
        let mut seen = Vec::new();
        // The store stops the first chunk after 25 members and the second after 50, and
        // handles the rest whole (saying so changes nothing).
        for handled in [Some(25), Some(50), None, Some(75)] {
            let chunk = chunks.next().expect("a chunk");
            seen.push((chunk[0], chunk.len()));
            if let Some(handled) = handled {
                chunks.stopped_after(handled);
            }
        }
        assert_eq!(chunks.next(), None);
        assert_eq!(seen, [(0, 100), (25, 100), (75, 100), (175, 75)]);
    }

    #[test]
    fn a_chunk_earns_the_store_three_times_its_cost_of_rest() {
        assert_eq!(
            rest_after(Duration::from_millis(1)),
            Duration::from_millis(3)
        );
        assert_eq!(
            rest_after(Duration::from_micros(1_700)),
            Duration::from_micros(5_100)
        );
        assert_eq!(rest_after(Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn the_next_chunk_waits_out_the_rest_that_is_left_and_a_rested_store_none() {
        let duty = DutyCycle::default();
        let start = Instant::now();
        let at = |micros| start + Duration::from_micros(micros);
        assert_eq!(duty.wait_at(start), Duration::ZERO);
        // A chunk of 2 ms ending at 2 ms: the next may start at 8 ms.
        duty.book(at(2_000), Duration::from_millis(2));
        assert_eq!(duty.wait_at(at(2_000)), Duration::from_millis(6));
        assert_eq!(duty.wait_at(at(7_000)), Duration::from_millis(1));
        assert_eq!(duty.wait_at(at(8_000)), Duration::ZERO);
        assert_eq!(duty.wait_at(at(20_000)), Duration::ZERO);
        // Long after, a chunk of 1 ms earns 3 ms from its own end.
        duty.book(at(30_000), Duration::from_millis(1));
        assert_eq!(duty.wait_at(at(30_000)), Duration::from_millis(3));
    }

    #[test]
    fn the_rests_of_chunks_that_ran_at_once_add_up() {
        let duty = DutyCycle::default();
        let start = Instant::now();
        let at = |micros| start + Duration::from_micros(micros);
        // Two operations' chunks of 1 ms sent together, the second queued behind the first:
        // the first earns the store until 4 ms, the second 3 ms more.
        duty.book(at(1_000), Duration::from_millis(1));
        duty.book(at(2_000), Duration::from_millis(1));
        assert_eq!(duty.wait_at(at(2_000)), Duration::from_millis(5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_chunk_a_call_waited_through_earns_its_rest_and_the_first_chunk_waits_for_none() {
        let chunks = MemberChunks::default();
        let before = Instant::now();
        let started = chunks.rest().await;
        assert_eq!(before.elapsed(), Duration::ZERO);
        let call = chunks.traffic.enter();
        chunks.ran(started, &chunks.seed, 1_000, Duration::from_millis(1));
        drop(call);
        let ended = Instant::now();
        let _next = chunks.rest().await;
        assert_eq!(ended.elapsed(), Duration::from_millis(3));
        assert_eq!(chunks.rests(), (1, 1));
        // 1 µs a member: 500 fit, but a chunk grows at most twofold from the first, 100.
        assert_eq!(chunks.seed.size(), 200);
    }

    #[tokio::test(start_paused = true)]
    async fn a_chunk_nobody_waited_through_earns_no_rest() {
        let chunks = MemberChunks::default();
        for _ in 0..3 {
            let started = chunks.rest().await;
            chunks.ran(started, &chunks.seed, 1_000, Duration::from_millis(1));
        }
        let ended = Instant::now();
        let _next = chunks.rest().await;
        assert_eq!(ended.elapsed(), Duration::ZERO);
        assert_eq!(chunks.rests(), (3, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_in_flight_as_a_chunk_starts_or_begun_and_ended_during_it_earns_a_rest() {
        let chunks = MemberChunks::default();
        // In flight as the chunk starts, answered before it ends.
        let call = chunks.traffic.enter();
        let started = chunks.rest().await;
        drop(call);
        chunks.ran_piece(started, Duration::from_millis(1));
        assert_eq!(chunks.rests(), (1, 1));
        let _rested = chunks.rest().await;
        // Started and answered while the chunk ran.
        let started = chunks.rest().await;
        drop(chunks.traffic.enter());
        chunks.ran_piece(started, Duration::from_millis(1));
        assert_eq!(chunks.rests(), (2, 2));
    }

    #[test]
    fn traffic_tells_calls_in_flight_and_calls_that_came_and_went() {
        let traffic = Traffic::default();
        let idle = traffic.seen();
        assert!(!idle.busy_until(traffic.seen()));
        let call = traffic.enter();
        let busy = traffic.seen();
        assert!(idle.busy_until(busy));
        assert!(busy.busy_until(busy));
        drop(call);
        let after = traffic.seen();
        assert!(!after.busy_until(traffic.seen()));
        // Between `idle` and `after` a call started and ended.
        assert!(idle.busy_until(after));
    }

    #[test]
    fn others_are_busy_when_redis_received_more_than_this_replicas_chunks_sent_it() {
        let load = RemoteLoad::default();
        let web = PoolId::parse("web").expect("a pool id");
        let start = Instant::now();
        let at = |millis| start + Duration::from_millis(millis);
        // The first reading has nothing to compare with; bytes before it are in it.
        assert!(load.due(&web, at(0)));
        load.sent(&web, 500);
        assert!(!load.read(&web, at(0), 1_000_000));
        assert!(!load.due(&web, at(249)));
        assert!(load.due(&web, at(250)));
        // Redis received exactly what this replica's chunks (and the reading) sent.
        load.sent(&web, 40_000);
        load.sent(&web, 60);
        assert!(!load.read(&web, at(250), 1_040_060));
        assert!(!load.busy(&web));
        // 4,096 bytes of others in 250 ms: 16 KiB a second, busy.
        load.sent(&web, 60);
        assert!(load.read(&web, at(500), 1_040_060 + 60 + 4_096));
        assert!(load.busy(&web));
        // 4,095: just under, idle again.
        load.sent(&web, 60);
        assert!(!load.read(&web, at(750), 1_044_216 + 60 + 4_095));
        assert!(!load.busy(&web));
        // Another pool's readings are its own.
        let other = PoolId::parse("other").expect("a pool id");
        assert!(load.due(&other, at(750)));
        assert!(!load.busy(&other));
    }

    #[test]
    fn a_reading_long_after_the_last_starts_afresh() {
        let load = RemoteLoad::default();
        let web = PoolId::parse("web").expect("a pool id");
        let start = Instant::now();
        let at = |millis| start + Duration::from_millis(millis);
        assert!(!load.read(&web, at(0), 1_000));
        // A megabyte of others, but over a pause of four readings: not compared.
        assert!(!load.read(&web, at(1_000), 1_001_000));
        assert!(load.read(&web, at(1_250), 1_101_000));
    }

    #[tokio::test(start_paused = true)]
    async fn a_redis_chunk_after_a_reading_that_found_others_busy_earns_its_rest() {
        let chunks = MemberChunks::default();
        let ms = Duration::from_millis;
        let started = chunks.rest().await;
        chunks.ran_bounded(started, &chunks.seed, (100, 100), ms(1));
        assert_eq!(chunks.rests(), (1, 0));
        let started = chunks.rest().await.others_busy(true);
        chunks.ran_bounded(started, &chunks.seed, (200, 200), ms(2));
        assert_eq!(chunks.rests(), (2, 1));
        let ended = Instant::now();
        let _next = chunks.rest().await;
        assert_eq!(ended.elapsed(), ms(6));
    }
}
