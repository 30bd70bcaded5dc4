//! `EmbeddedStore`: every pool in this process's memory, for a single replica, kept on disk
//! when it is given a data directory.
//!
//! It follows the Redis store rule for rule (the shared behavioural suite runs against
//! it in memory and on disk). One mutex guards all pools; every operation holds it for its
//! whole duration, which gives the same atomicity as one Lua script in Redis. The memory
//! is the source of truth: the disk only ever receives what operations changed.
//!
//! # On disk (`DATA_DIR`)
//! Each operation, still under the lock, appends the records of what it changed (see
//! [`codec`]: after-images of the pools, members and leases it touched, or the assign's
//! count update) to an in-memory buffer. A writer thread ([`journal`]) takes whole
//! buffers, so the log holds whole operations in the order they happened, writes each as
//! one checksummed frame ([`files`]) and fsyncs: at once when an operation waits for it
//! (changes of configuration and membership, leases issued, and every operation when
//! `FSYNC_INTERVAL_MS` is 0; operations waiting together share one fsync), otherwise every
//! `FSYNC_INTERVAL_MS`. An assign on a least-used pool makes no system call.
//!
//! A compactor thread ([`snapshot`]) starts a new log generation and writes every pool
//! into a snapshot, a few thousand entries per turn of the lock, while operations go on.
//! Recovery ([`recovery`]) loads the newest complete snapshot and replays the logs after
//! it; it needs no clock or randomness, since the records hold every time, lease id and
//! jitter draw the operations used.

mod bans;
mod buckets;
mod clients;
mod codec;
mod due;
mod exits;
mod files;
mod journal;
mod labelled;
mod recovery;
mod rests;
mod sessions;
mod snapshot;

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;

use super::{
    Applied, AssignRequest, Assignment, Batch, CHECK_CLAIM_HOLD, CheckRound, ClaimedSource,
    ClientRecord, Cursor, DisableReport, Done, DoneSummary, Effect, EnableReport, ExitSeen,
    FetchOutcome, Health, LastCheck, Lease, MAX_LABEL_CHECKS, MAX_PROBES_PER_ROUND, MemberPage,
    MemberState, MemberView, Origin, PRUNE_BATCH, PoolInfo, PoolPage, PoolStats, Pruned, PutClient,
    PutPool, RECLAIM_ON_ASSIGN, RETURN_ON_ASSIGN, RemoveReport, Renewed, Report, ReportSource,
    ReportSummary, Restored, SOURCE_CLAIM_HOLD, SWEEP_POOLS_PER_CALL, Seed, SeedOrigin, SeedReport,
    SessionAssignment, SessionPin, SessionRequest, SourceFetch, SourceState, StateFilter, Store,
    StoreError, StoreStatus, Swept,
};
use crate::domain::{
    AssignCount, ClientConfig, ClientId, Exclude, LabelFilter, LeaseId, LeaseTtl, MAX_SESSIONS,
    MemberId, OutcomeResult, Policy, PoolConfig, PoolId, RestorePolicy, SessionId, Target,
    Timestamp, TokenHash,
};

use self::codec::{MemberImage, PoolImage, Provenance, SourceBook};
use self::due::DueIndex;
use self::journal::{Buffer, Disk};
use super::chunks::{ChunkSizer, InFlight, MemberChunks};

/// The in-process store. Cloning is not needed: the application holds it behind an `Arc`.
#[derive(Debug, Default)]
pub struct EmbeddedStore {
    inner: Arc<Mutex<Inner>>,
    /// With a data directory: the writer and compactor threads and the durability waits.
    disk: Option<Disk>,
    /// The chunk sizes of the member operations, learned from their time under the lock.
    chunks: MemberChunks,
    /// The store's clock.
    clock: Clock,
}

/// The embedded store's clock: the process clock, or in this crate's tests one the test
/// sets, so that a test can give both stores the same time (`store/twins.rs`). Outside
/// tests it is [`Timestamp::now`] and nothing else.
#[derive(Debug, Default, Clone)]
pub(crate) struct Clock {
    /// Unix milliseconds the test has set.
    #[cfg(test)]
    set: Option<Arc<std::sync::atomic::AtomicU64>>,
}

impl Clock {
    fn now(&self) -> Timestamp {
        #[cfg(test)]
        if let Some(ms) = &self.set {
            return Timestamp(ms.load(std::sync::atomic::Ordering::SeqCst));
        }
        Timestamp::now()
    }
}

/// What the lock guards.
#[derive(Debug, Default)]
struct Inner {
    pools: BTreeMap<PoolId, Pool>,
    /// Every client, and which one each token opens.
    clients: self::clients::Clients,
    /// Pools by when their next lease expires or member returns: what the sweep visits.
    sweep_due: DueIndex,
    /// Pools with checks by when their next round is due: what the checker visits.
    checks_due: DueIndex,
    /// Pools with sources by when their next fetch may be due: what the fetcher visits.
    sources_due: DueIndex,
    /// With a data directory: records of whole operations not yet taken by the writer.
    journal: Option<Buffer>,
    /// Why every operation is refused from now on: the store was closed, or its disk
    /// failed and memory and disk can no longer be trusted to agree.
    refused: Option<Refused>,
}

#[derive(Debug, Clone)]
enum Refused {
    Closed,
    DiskFailed(String),
}

/// How a data directory is used.
#[derive(Debug, Clone)]
pub struct DataDirOptions {
    /// The directory; created when missing.
    pub dir: PathBuf,
    /// How often counts and outcome state are fsynced; zero fsyncs before every answer.
    pub fsync_interval: Duration,
    /// Longest time an operation waits for its fsync before answering 503.
    pub timeout: Duration,
    /// A compaction starts once the current log is larger than this and than half the
    /// last snapshot: replaying a log costs more per record than loading a snapshot, so the
    /// log is kept smaller than the snapshot to keep recovery short.
    pub compact_min_log_bytes: u64,
    /// Pools, members and leases one turn of the lock copies into a snapshot.
    pub snapshot_chunk: usize,
}

impl DataDirOptions {
    /// `dir` with the service's defaults: fsync every second, compaction past 8 MiB of
    /// log (and half the snapshot), 4,096 entries per turn of the lock.
    pub fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            fsync_interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            compact_min_log_bytes: 8 << 20,
            snapshot_chunk: 4096,
        }
    }
}

/// Why a data directory could not be opened. The store never starts on part of its state.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Another process holds the directory.
    #[error(
        "{} is in use by another process{}: only one process may open a data directory",
        dir.display(),
        holder.as_ref().map(|pid| format!(" (pid {pid})")).unwrap_or_default()
    )]
    Locked {
        /// The directory.
        dir: PathBuf,
        /// The pid the lock file names, when it names one.
        holder: Option<String>,
    },
    /// A file is damaged (other than a last record cut short by a crash, which is dropped).
    #[error(
        "{} is damaged at byte {offset}: {reason}; refusing to start on part of the data",
        path.display()
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Where its damaged frame starts.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
}

/// What an operation changed, so that its records can be written: the pool's own state,
/// and the members and leases whose after-images (or removals) the log needs. Marked where
/// the state changes, in the helpers below; taken when the operation ends.
#[derive(Debug, Default)]
struct Changes {
    pool: bool,
    members: Vec<MemberId>,
    leases: Vec<LeaseId>,
}

impl Changes {
    fn clear(&mut self) {
        self.pool = false;
        self.members.clear();
        self.leases.clear();
    }
}

#[derive(Debug)]
struct Pool {
    config: PoolConfig,
    created_at: Timestamp,
    total_assignments: u64,
    eligible: Ranked,
    ineligible: Ranked,
    taken_out: HashMap<MemberId, (String, Timestamp)>,
    abandoned: u64,
    /// Live leases per member, eligible or not; members without leases are absent.
    in_flight: HashMap<MemberId, u64>,
    leases: HashMap<LeaseId, (MemberId, Timestamp)>,
    /// Live leases by expiry, so that reclaiming reads only the expired ones.
    expiry: BTreeSet<(Timestamp, LeaseId)>,
    /// Least-in-flight pools only: eligible members by `(in_flight, assignments, id)`, the
    /// order assign chooses in. Kept in step by `unplace` before and `place` after every
    /// change to a member's count, lease count or eligibility.
    order: BTreeSet<(u64, u64, MemberId)>,
    /// Failure streaks and backoff; members with all zeros are absent.
    health: HashMap<MemberId, Health>,
    /// Decaying success rates and latencies (see `rules::quality`); members without any
    /// outcome counted are absent.
    quality: HashMap<MemberId, crate::store::Quality>,
    /// Members cooling down, by the time they come back; a member is cooling down exactly
    /// when it is here (and in `return_at`).
    returns: BTreeSet<(Timestamp, MemberId)>,
    return_at: HashMap<MemberId, Timestamp>,
    /// The last active check of each member.
    checks: HashMap<MemberId, LastCheck>,
    /// Members' labels and the indexes over them.
    labels: labelled::LabelIndex,
    /// Members whose label `country` differs from their `geo_country` (kept by
    /// `set_labels` and `drop_labels`).
    country_mismatches: u64,
    /// Each member's exit address and when a check saw it (see `exits.rs`).
    exits: HashMap<MemberId, (std::net::IpAddr, Timestamp)>,
    /// How many members exit at each address.
    exit_counts: HashMap<std::net::IpAddr, u64>,
    /// Addresses in `exit_counts` with two members or more.
    shared_exit_ips: u64,
    /// Bans per target (in memory only: see `bans.rs`).
    bans: bans::Bans,
    /// Resting members of a paced pool (in memory only: see `rests.rs`).
    rests: rests::Rests,
    /// Sticky sessions (in memory only: see `sessions.rs`).
    sessions: sessions::Sessions,
    /// Client rate limits (in memory only: see `buckets.rs`).
    buckets: buckets::Buckets,
    tripped: u64,
    recovered: u64,
    /// Until when the last check round holds the pool.
    check_round_until: Option<Timestamp>,
    /// Each source's schedule and last fetch, by URL. Not written to disk: after a
    /// restart every source is due at once, which costs one fetch each (its count of
    /// successful fetches is kept, in `book`).
    sources: HashMap<String, SourceState>,
    /// The ids given to sources and the current ones' successful fetches (on disk).
    book: SourceBook,
    /// Members' origins and pruning state; members with the default are absent.
    provenance: HashMap<MemberId, Provenance>,
    /// Members of sources by `(source id, last fetch that listed them)`, for pruning the
    /// absent ones: what Redis's `seen` set holds.
    seen_by: BTreeSet<(u64, u64, MemberId)>,
    /// Members due for removal, by when they were last looked at.
    prune_due: BTreeSet<(Timestamp, MemberId)>,
    /// Members removed by the prune rules.
    pruned: u64,
    /// What the operation under way changed (not part of the pool's state).
    changes: Changes,
}

/// Members ordered by `(count, id)`, the order Redis gives a sorted set, with a map for
/// looking a member's count up by id.
#[derive(Debug, Default)]
struct Ranked {
    order: BTreeSet<(u64, MemberId)>,
    counts: HashMap<MemberId, u64>,
}

impl Ranked {
    fn len(&self) -> u64 {
        self.counts.len() as u64
    }

    fn get(&self, member: &MemberId) -> Option<u64> {
        self.counts.get(member).copied()
    }

    fn set(&mut self, member: MemberId, count: u64) {
        // A member already here is updated in place: an insert would copy its id only for
        // the map to drop the copy again, and it runs on every assign.
        match self.counts.get_mut(&member) {
            Some(stored) => {
                let old = (std::mem::replace(stored, count), member);
                self.order.remove(&old);
                self.order.insert((count, old.1));
            }
            None => {
                self.counts.insert(member.clone(), count);
                self.order.insert((count, member));
            }
        }
    }

    /// `set` for a member of the pool, answering its id: the id it takes is its probe in the
    /// order and comes back, so an assign makes no copy of it.
    fn recount(&mut self, member: MemberId, count: u64) -> MemberId {
        let Some(stored) = self.counts.get_mut(&member) else {
            self.set(member.clone(), count);
            return member;
        };
        let probe = (std::mem::replace(stored, count), member);
        match self.order.take(&probe) {
            Some((_, kept)) => {
                self.order.insert((count, kept));
            }
            None => {
                self.order.insert((count, probe.1.clone()));
            }
        }
        probe.1
    }

    /// Adds a member known not to be here: one hash instead of two (recovery inserts a
    /// million of them).
    fn insert_absent(&mut self, member: MemberId, count: u64) {
        self.counts.insert(member.clone(), count);
        self.order.insert((count, member));
    }

    /// Adds one to the count of the first member (fewest, then lowest id) and returns it
    /// with its new count.
    fn add_one_to_first(&mut self) -> Option<(MemberId, u64)> {
        // Taken off the front and put back, without looking the member up in the order.
        let (count, member) = self.order.pop_first()?;
        if let Some(stored) = self.counts.get_mut(&member) {
            *stored = count + 1;
        }
        self.order.insert((count + 1, member.clone()));
        Some((member, count + 1))
    }

    fn remove(&mut self, member: &MemberId) -> Option<u64> {
        let count = self.counts.remove(member)?;
        self.order.remove(&(count, member.clone()));
        Some(count)
    }

    fn min(&self) -> Option<u64> {
        self.order.first().map(|(count, _)| *count)
    }

    fn max(&self) -> Option<u64> {
        self.order.last().map(|(count, _)| *count)
    }

    /// The members after `start` (from the first when `None`), `skip` of them passed over,
    /// then at most `limit`.
    fn page<'a>(
        &'a self,
        start: Option<&(u64, MemberId)>,
        skip: u64,
        limit: usize,
    ) -> impl Iterator<Item = &'a (u64, MemberId)> {
        self.after(start)
            .skip(usize::try_from(skip).unwrap_or(usize::MAX))
            .take(limit)
    }

    /// The member `n` (at least 1) places after `start` (counting from the first when
    /// `None`): where a page further on may start from. `None` when fewer follow.
    fn advance(&self, start: Option<&(u64, MemberId)>, n: u64) -> Option<(u64, MemberId)> {
        let n = usize::try_from(n).ok()?.checked_sub(1)?;
        self.after(start).nth(n).cloned()
    }

    fn after<'a>(
        &'a self,
        start: Option<&(u64, MemberId)>,
    ) -> impl Iterator<Item = &'a (u64, MemberId)> {
        use std::ops::Bound;
        let from = match start {
            Some(key) => Bound::Excluded(key.clone()),
            None => Bound::Unbounded,
        };
        self.order.range((from, Bound::Unbounded))
    }
}

/// Most members of a set one turn of the lock walks past on the way to a page deep in a
/// pool. A `BTreeSet` cannot find its n-th member but by walking to it: a page at the end
/// of a million members walked them all in one turn (about 50 ms more than the first page
/// on the shared development machine at a load average of 16, every other pool waiting).
const SKIP_STEP: u64 = 10_000;

/// Where a page of one set starts: after `from` (the front when `None`), `left` more on.
/// `None` when the set ended before.
type PageStart = Option<(Option<(u64, MemberId)>, u64)>;

/// Walks `start` on by up to [`SKIP_STEP`] members of `set`.
fn walk_on(set: &Ranked, start: &mut PageStart) {
    if let Some((from, left)) = start
        && *left > SKIP_STEP
    {
        *start = set
            .advance(from.as_ref(), SKIP_STEP)
            .map(|key| (Some(key), *left - SKIP_STEP));
    }
}

impl Pool {
    fn new(config: PoolConfig, created_at: Timestamp) -> Self {
        Self {
            config,
            created_at,
            total_assignments: 0,
            eligible: Ranked::default(),
            ineligible: Ranked::default(),
            taken_out: HashMap::new(),
            abandoned: 0,
            in_flight: HashMap::new(),
            leases: HashMap::new(),
            expiry: BTreeSet::new(),
            order: BTreeSet::new(),
            health: HashMap::new(),
            quality: HashMap::new(),
            returns: BTreeSet::new(),
            return_at: HashMap::new(),
            checks: HashMap::new(),
            labels: labelled::LabelIndex::default(),
            country_mismatches: 0,
            exits: HashMap::new(),
            exit_counts: HashMap::new(),
            shared_exit_ips: 0,
            bans: bans::Bans::default(),
            rests: rests::Rests::default(),
            buckets: buckets::Buckets::default(),
            sessions: sessions::Sessions::default(),
            tripped: 0,
            recovered: 0,
            check_round_until: None,
            sources: HashMap::new(),
            book: SourceBook::default(),
            provenance: HashMap::new(),
            seen_by: BTreeSet::new(),
            prune_due: BTreeSet::new(),
            pruned: 0,
            changes: Changes::default(),
        }
    }

    fn mark_member(&mut self, member: &MemberId) {
        self.changes.members.push(member.clone());
    }

    fn mark_lease(&mut self, lease: &LeaseId) {
        self.changes.leases.push(lease.clone());
    }

    /// The pool's own state, as records and snapshots hold it.
    fn image(&self) -> PoolImage<'_> {
        PoolImage {
            config: Cow::Borrowed(&self.config),
            created_at: self.created_at,
            total_assignments: self.total_assignments,
            abandoned: self.abandoned,
            tripped: self.tripped,
            recovered: self.recovered,
            check_round_until: self.check_round_until,
            pruned: self.pruned,
            sources: Cow::Borrowed(&self.book),
        }
    }

    fn provenance_of(&self, member: &MemberId) -> Provenance {
        self.provenance.get(member).copied().unwrap_or_default()
    }

    /// Sets a member's provenance, keeping the two indexes over it in step.
    fn set_provenance(&mut self, member: &MemberId, provenance: Provenance) {
        let old = self.provenance_of(member);
        if let (Some(id), Some(fetch)) = (old.origin, old.seen) {
            self.seen_by.remove(&(id, fetch, member.clone()));
        }
        if let Some(at) = old.prune_due {
            self.prune_due.remove(&(at, member.clone()));
        }
        if let (Some(id), Some(fetch)) = (provenance.origin, provenance.seen) {
            self.seen_by.insert((id, fetch, member.clone()));
        }
        if let Some(at) = provenance.prune_due {
            self.prune_due.insert((at, member.clone()));
        }
        if provenance == Provenance::default() {
            self.provenance.remove(member);
        } else {
            self.provenance.insert(member.clone(), provenance);
        }
    }

    /// Forgets a member entirely but its leases (see `forget` in `scripts/health.lua`);
    /// whether it was a member.
    fn forget(&mut self, member: &MemberId) -> bool {
        self.drop_labels(member);
        self.unplace(member);
        let was_eligible = self.eligible.remove(member).is_some();
        let was_ineligible = self.ineligible.remove(member).is_some();
        self.taken_out.remove(member);
        self.health.remove(member);
        self.quality.remove(member);
        self.cancel_return(member);
        self.checks.remove(member);
        self.drop_exit(member);
        self.set_provenance(member, Provenance::default());
        self.mark_member(member);
        was_eligible || was_ineligible
    }

    /// A member's origin as listed.
    fn origin_of(&self, member: &MemberId) -> Origin {
        match self.provenance_of(member).origin {
            None => Origin::Manual,
            Some(0) => Origin::Import,
            Some(id) => Origin::Source(
                self.book
                    .urls
                    .get(&id)
                    .cloned()
                    .unwrap_or_else(|| format!("removed source #{id}")),
            ),
        }
    }

    /// Everything the pool keeps about `member`, given its count and set; see
    /// [`Pool::member_image`].
    fn member_image_with(
        &self,
        member: &MemberId,
        assignments: u64,
        eligible: bool,
    ) -> MemberImage<'_> {
        MemberImage {
            eligible,
            assignments,
            taken_out: self
                .taken_out
                .get(member)
                .map(|(reason, since)| (Cow::Borrowed(reason.as_str()), *since)),
            health: self.health_of(member),
            quality: self.quality_of(member),
            returns_at: self.return_at.get(member).copied(),
            last_check: self.checks.get(member).map(Cow::Borrowed),
            labels: Cow::Borrowed(self.labels.of.get(member).unwrap_or(&NO_LABELS)),
            provenance: self.provenance_of(member),
            exit: self.exits.get(member).copied(),
        }
    }

    /// Everything the pool keeps about `member`; `None` when it is not a member.
    fn member_image(&self, member: &MemberId) -> Option<MemberImage<'_>> {
        if let Some(count) = self.eligible.get(member) {
            return Some(self.member_image_with(member, count, true));
        }
        let count = self.ineligible.get(member)?;
        Some(self.member_image_with(member, count, false))
    }

    fn quality_of(&self, member: &MemberId) -> crate::store::Quality {
        self.quality.get(member).copied().unwrap_or_default()
    }

    /// Counts one outcome a worker or the gateway reported in the member's success rate
    /// and latency (see `count_outcome` in `scripts/report.lua`).
    fn count_outcome(&mut self, member: &MemberId, result: OutcomeResult, latency_ms: Option<u64>) {
        let quality = crate::rules::quality::record(
            self.quality_of(member),
            result == OutcomeResult::Ok,
            latency_ms,
        );
        self.mark_member(member);
        self.quality.insert(member.clone(), quality);
    }

    fn health_of(&self, member: &MemberId) -> Health {
        self.health.get(member).copied().unwrap_or_default()
    }

    fn set_health(&mut self, member: &MemberId, health: Health) {
        self.mark_member(member);
        if health.streak == 0 && health.trips == 0 {
            self.health.remove(member);
        } else {
            self.health.insert(member.clone(), health);
        }
    }

    /// Cancels a member's scheduled return; false when it was not cooling down.
    fn cancel_return(&mut self, member: &MemberId) -> bool {
        match self.return_at.remove(member) {
            Some(at) => {
                self.mark_member(member);
                self.returns.remove(&(at, member.clone()))
            }
            None => false,
        }
    }

    fn schedule_return(&mut self, member: &MemberId, at: Timestamp) {
        self.cancel_return(member);
        self.mark_member(member);
        self.return_at.insert(member.clone(), at);
        self.returns.insert((at, member.clone()));
    }

    /// Moves an eligible member to the ineligible set, keeping its count, with why and
    /// since when. False when the member is not eligible.
    fn take_out(&mut self, member: &MemberId, reason: &str, now: Timestamp) -> bool {
        self.unplace(member);
        let Some(count) = self.eligible.remove(member) else {
            return false;
        };
        self.mark_member(member);
        self.ineligible.set(member.clone(), count);
        self.taken_out
            .insert(member.clone(), (reason.to_owned(), now));
        true
    }

    /// Returns an ineligible member at the count `policy` gives it against `minimum`;
    /// cancels its scheduled return and clears its streak (the backoff stays until a
    /// success), as `restore` in `scripts/health.lua` does. `(kept, restored)`, or `None`
    /// when the member is not ineligible.
    fn restore(
        &mut self,
        member: &MemberId,
        policy: RestorePolicy,
        minimum: Option<u64>,
    ) -> Option<(u64, u64)> {
        let kept = self.ineligible.remove(member)?;
        self.mark_member(member);
        let restored = crate::rules::health::restored_count(policy, kept, minimum);
        self.taken_out.remove(member);
        self.eligible.set(member.clone(), restored);
        // It comes back with the leases it still holds.
        self.place(member);
        self.cancel_return(member);
        let health = self.health_of(member);
        self.set_health(
            member,
            Health {
                streak: 0,
                ..health
            },
        );
        Some((kept, restored))
    }

    /// Returns up to `limit` members whose cooldown ended by `now`, all against the
    /// minimum from before the first.
    fn return_due(&mut self, now: Timestamp, limit: u64) -> u64 {
        let due: Vec<MemberId> = self
            .returns
            .iter()
            .take_while(|(at, _)| *at <= now)
            .take(usize::try_from(limit).unwrap_or(usize::MAX))
            .map(|(_, member)| member.clone())
            .collect();
        let minimum = self.eligible.min();
        let policy = self.config.restore;
        let returned = due
            .iter()
            .filter(|member| {
                self.cancel_return(member);
                self.restore(member, policy, minimum).is_some()
            })
            .count() as u64;
        if returned > 0 {
            self.recovered += returned;
            self.changes.pool = true;
        }
        returned
    }

    /// How long until the earliest return, when nothing is eligible.
    /// When the pool's next lease expires, member returns or session ends, if ever.
    fn next_due(&self) -> Option<Timestamp> {
        let lease = self.expiry.first().map(|(at, _)| *at);
        let back = self.returns.first().map(|(at, _)| *at);
        let session = self.sessions.first_end();
        lease.into_iter().chain(back).chain(session).min()
    }

    fn next_return(&self, now: Timestamp) -> Option<Duration> {
        self.returns
            .first()
            .map(|(at, _)| Duration::from_millis(at.0.saturating_sub(now.0)))
    }

    /// Takes a member out for its next cooldown (a cooling one has its return pushed back).
    fn trip(&mut self, member: &MemberId, reason: &str, now: Timestamp, health: Health, draw: f64) {
        let trips = health.trips + 1;
        let cooldown_ms = crate::rules::health::cooldown_ms(&self.config.health, trips, draw);
        if !self.take_out(member, reason, now) {
            self.mark_member(member);
            self.taken_out
                .insert(member.clone(), (reason.to_owned(), now));
        }
        self.schedule_return(member, Timestamp(now.0.saturating_add(cooldown_ms)));
        self.set_health(
            member,
            Health {
                streak: health.streak,
                trips,
                cooldown_ms,
            },
        );
        self.tripped += 1;
        self.changes.pool = true;
    }

    /// One report, by the rules of `scripts/outcomes.lua`. `None` for an unknown member.
    /// A worker's report (not a check's) about a member the pool has also counts in its
    /// success rate and latency, whatever it did to its health.
    fn apply(
        &mut self,
        source: ReportSource,
        report: &Report,
        now: Timestamp,
        draw: f64,
    ) -> Option<(Effect, u64, Option<Timestamp>)> {
        let applied = self.apply_to_health(source, report, now, draw)?;
        if source != ReportSource::Check {
            self.count_outcome(&report.member, report.result, report.latency_ms);
        }
        Some(applied)
    }

    /// What one report does to its member's health.
    fn apply_to_health(
        &mut self,
        source: ReportSource,
        report: &Report,
        now: Timestamp,
        draw: f64,
    ) -> Option<(Effect, u64, Option<Timestamp>)> {
        let member = &report.member;
        let mut health = self.health_of(member);
        let eligible = self.eligible.get(member).is_some();
        let cooling = !eligible && self.return_at.contains_key(member);
        let check = source == ReportSource::Check;
        if let Some(target) = &report.target
            && report.result == OutcomeResult::Blocked
            && !check
        {
            if !eligible {
                self.ineligible.get(member)?;
            }
            return Some(
                match self.bans.ban(target, member, now, &self.config.health) {
                    bans::Banned::Now(until) => (Effect::Banned, health.streak, Some(until)),
                    bans::Banned::Already(until) => (Effect::Ignored, health.streak, Some(until)),
                    bans::Banned::Full => (Effect::Ignored, health.streak, None),
                },
            );
        }
        let effect = if !eligible && !cooling {
            self.ineligible.get(member)?;
            Effect::Ignored
        } else if cooling && !check {
            Effect::Ignored
        } else if report.result == OutcomeResult::Ok {
            health.streak = 0;
            if cooling {
                let minimum = self.eligible.min();
                self.restore(member, self.config.restore, minimum);
                self.recovered += 1;
                self.changes.pool = true;
                Effect::Returned
            } else {
                self.set_health(member, Health::default());
                Effect::Counted
            }
        } else {
            health.streak += 1;
            if cooling || health.streak >= u64::from(self.config.health.max_consecutive_failures) {
                let reason = match report.result {
                    OutcomeResult::Blocked => "blocked",
                    _ => "unhealthy",
                };
                self.trip(member, reason, now, health, draw);
                Effect::Tripped
            } else {
                self.set_health(member, health);
                Effect::Counted
            }
        };
        if check {
            self.mark_member(member);
            self.count_check(member, report.result, now);
            self.checks.insert(
                member.clone(),
                LastCheck {
                    at: now,
                    result: report.result,
                    detail: report.detail.clone(),
                    latency_ms: report.latency_ms,
                },
            );
        }
        Some((effect, health.streak, None))
    }

    /// Counts a check's result in the member's failed checks in a row, making it due for
    /// removal once they reach `prune.after_failed_checks` (see `scripts/outcomes.lua`).
    fn count_check(&mut self, member: &MemberId, result: OutcomeResult, now: Timestamp) {
        let mut provenance = self.provenance_of(member);
        if result == OutcomeResult::Ok {
            provenance.check_fails = 0;
        } else {
            provenance.check_fails += 1;
            let prune = self.config.prune.unwrap_or_default();
            if prune
                .after_failed_checks
                .is_some_and(|n| provenance.check_fails >= n)
                && (provenance.origin.is_some() || prune.manual)
                && provenance.prune_due.is_none()
            {
                provenance.prune_due = Some(now);
            }
        }
        self.set_provenance(member, provenance);
    }

    /// One batch of `prune.lua`'s rules.
    fn prune(&mut self, absent: Option<(u64, u64)>, now: Timestamp) -> Pruned {
        let batch = usize::try_from(PRUNE_BATCH).unwrap_or(usize::MAX);
        let mut more = false;
        if let Some((id, fetch)) = absent {
            let first = (id, 0, MemberId::from_stored(String::new()));
            let stale: Vec<MemberId> = self
                .seen_by
                .range(first..)
                .take_while(|(i, f, _)| *i == id && *f <= fetch)
                .take(batch)
                .map(|(_, _, member)| member.clone())
                .collect();
            more = stale.len() == batch;
            for member in &stale {
                let mut provenance = self.provenance_of(member);
                provenance.seen = None;
                provenance.prune_due = provenance.prune_due.or(Some(now));
                self.set_provenance(member, provenance);
                self.mark_member(member);
            }
        }
        let rules = self.config.prune.unwrap_or_default();
        let due: Vec<MemberId> = self
            .prune_due
            .iter()
            .take(batch)
            .map(|(_, member)| member.clone())
            .collect();
        let mut removed = Vec::new();
        for member in &due {
            let mut provenance = self.provenance_of(member);
            let by_checks = rules
                .after_failed_checks
                .is_some_and(|n| provenance.check_fails >= n)
                && (provenance.origin.is_some() || rules.manual);
            let by_absence = rules.absent_from_source_fetches.is_some()
                && provenance.origin.is_some_and(|id| id > 0)
                && provenance.seen.is_none();
            if self.eligible.get(member).is_none() && self.ineligible.get(member).is_none() {
                provenance.prune_due = None;
                self.set_provenance(member, provenance);
            } else if self.in_flight_of(member) > 0 {
                provenance.prune_due = Some(now);
                self.set_provenance(member, provenance);
                self.mark_member(member);
            } else if by_checks || by_absence {
                self.forget(member);
                self.pruned += 1;
                self.changes.pool = true;
                removed.push(member.clone());
            } else {
                provenance.prune_due = None;
                self.set_provenance(member, provenance);
                self.mark_member(member);
            }
        }
        more |= !removed.is_empty() && due.len() == batch;
        Pruned { removed, more }
    }

    /// A member's health fields for a listing.
    fn with_health(&self, mut view: MemberView) -> MemberView {
        let health = self.health_of(&view.member);
        view.origin = self.origin_of(&view.member);
        view.consecutive_failures = health.streak;
        view.last_cooldown_ms = (health.trips > 0).then_some(health.cooldown_ms);
        view.returns_at = self.return_at.get(&view.member).copied();
        view.last_check = self.checks.get(&view.member).cloned();
        view.set_labels(
            self.labels
                .of
                .get(&view.member)
                .cloned()
                .unwrap_or_default(),
        );
        (view.exit_ip, view.exit_ip_at) = self.exits.get(&view.member).copied().unzip();
        view.quality = self.quality_of(&view.member);
        view
    }

    fn in_flight_of(&self, member: &MemberId) -> u64 {
        self.in_flight.get(member).copied().unwrap_or(0)
    }

    fn order_key(&self, member: &MemberId) -> Option<(u64, u64, MemberId)> {
        let assignments = self.eligible.get(member)?;
        Some((self.in_flight_of(member), assignments, member.clone()))
    }

    /// Takes the member out of the choosing order and the label index, before its numbers
    /// change.
    fn unplace(&mut self, member: &MemberId) {
        self.unlabel(member);
        // Only least-in-flight pools have the order (a policy changes only while the pool
        // is empty), and building a key costs a copy of the id.
        if self.config.policy != Policy::LeastInFlight {
            return;
        }
        if let Some(key) = self.order_key(member) {
            self.order.remove(&key);
        }
    }

    /// Puts the member back into the choosing order (when the pool is least-in-flight) and
    /// the label index with its current numbers, when it is eligible.
    fn place(&mut self, member: &MemberId) {
        if self.config.policy == Policy::LeastInFlight
            && let Some(key) = self.order_key(member)
        {
            self.order.insert(key);
        }
        self.label(member);
    }

    fn lease_for(&mut self, member: &MemberId, now: Timestamp, ttl: LeaseTtl) -> Lease {
        let id = LeaseId::random();
        let expires_at = Timestamp(now.0.saturating_add(ttl.as_millis()));
        self.leases.insert(id.clone(), (member.clone(), expires_at));
        self.expiry.insert((expires_at, id.clone()));
        self.mark_lease(&id);
        Lease {
            id,
            expires_at,
            ttl_ms: ttl,
        }
    }

    /// Ends a lease, whatever the reason, and frees its place on its member. `None` when
    /// the lease had already ended: ending is idempotent, so nothing is decremented twice.
    fn end_lease(&mut self, id: &LeaseId) -> Option<MemberId> {
        let (member, expires_at) = self.leases.remove(id)?;
        self.expiry.remove(&(expires_at, id.clone()));
        self.mark_lease(id);
        self.unplace(&member);
        match self.in_flight.get_mut(&member) {
            Some(count) if *count > 1 => *count -= 1,
            _ => {
                self.in_flight.remove(&member);
            }
        }
        self.place(&member);
        Some(member)
    }

    /// The member of a lease that is still live at `now`.
    /// Applies a worker's `done`: releases its lease when live, then applies its report
    /// (about the lease's member when it names none), as assign_done.lua does.
    fn apply_done(&mut self, done: &Done, now: Timestamp, draw: f64) -> DoneSummary {
        let mut summary = DoneSummary::default();
        let mut member = done.report.as_ref().and_then(|r| r.member.clone());
        if let Some(lease) = &done.lease {
            // An expired lease not yet reclaimed still names its member.
            if member.is_none() {
                member = self.leases.get(lease).map(|(m, _)| m.clone());
            }
            if self.live_lease(lease, now).is_ok() {
                summary.released = self.end_lease(lease).is_some();
            }
        }
        if let Some(report) = &done.report {
            let applied = member.and_then(|member| {
                let report = Report {
                    member,
                    result: report.result,
                    detail: String::new(),
                    latency_ms: report.latency_ms,
                    target: report.target.clone(),
                };
                let (effect, streak, banned_until) =
                    self.apply(ReportSource::Worker, &report, now, draw)?;
                Some(Applied {
                    member: report.member,
                    result: report.result,
                    effect,
                    streak,
                    banned_until,
                })
            });
            summary.unknown = applied.is_none();
            summary.applied = applied;
        }
        summary
    }

    fn live_lease(&self, id: &LeaseId, now: Timestamp) -> Result<MemberId, StoreError> {
        match self.leases.get(id) {
            Some((member, expires_at)) if *expires_at > now => Ok(member.clone()),
            _ => Err(StoreError::LeaseNotFound),
        }
    }

    /// Reclaims up to `limit` leases expired at `now`, counting them as abandoned.
    fn reclaim_expired(&mut self, now: Timestamp, limit: u64) -> u64 {
        let expired: Vec<LeaseId> = self
            .expiry
            .iter()
            .take_while(|(expires_at, _)| *expires_at <= now)
            .take(usize::try_from(limit).unwrap_or(usize::MAX))
            .map(|(_, id)| id.clone())
            .collect();
        let reclaimed = expired
            .iter()
            .filter(|id| self.end_lease(id).is_some())
            .count() as u64;
        if reclaimed > 0 {
            self.abandoned += reclaimed;
            self.changes.pool = true;
        }
        reclaimed
    }

    /// How long until the earliest return, for an assign that found nothing. With a label
    /// filter, the first of the [`RETURNS_CHECKED`] soonest returns whose member carries
    /// the labels; when none of them does, the last of them, which no member carrying the
    /// labels can beat; none when fewer are cooling down (as `nothing_eligible` in
    /// assign.lua).
    fn wait_for(&self, labels: &LabelFilter, now: Timestamp) -> Option<Duration> {
        if labels.is_empty() {
            return self.next_return(now);
        }
        let soonest: Vec<&(Timestamp, MemberId)> =
            self.returns.iter().take(RETURNS_CHECKED).collect();
        let carrying = soonest.iter().find(|(_, member)| {
            self.labels
                .of
                .get(member)
                .is_some_and(|carried| carried.matches(labels))
        });
        let due = match carrying {
            Some((at, _)) => Some(*at),
            None if soonest.len() == RETURNS_CHECKED => soonest.last().map(|(at, _)| *at),
            None => None,
        };
        bans::wait_until(due, now)
    }

    /// The first entry of a choosing order whose member is free for the request (not
    /// banned for its target, not resting), checking at most [`MAX_LABEL_CHECKS`] held
    /// members (as `first_free` in `scripts/assign.lua`), with the earliest time one of the
    /// members skipped becomes eligible by itself (see [`Pool::wait_counts`]). `entry`
    /// gives an entry's live leases (0 in a least-used order) and member.
    fn first_free<'a, T: 'a>(
        &self,
        order: impl Iterator<Item = &'a T>,
        entry: impl Fn(&T) -> (u64, &MemberId),
        holds: &Holds<'_>,
    ) -> (Option<&'a T>, Option<Timestamp>) {
        let (mut found, earliest) = self.free_entries(order, entry, holds, 1);
        (found.pop(), earliest)
    }

    /// The first `wanted` entries of a choosing order whose members are free for the
    /// request, skipping at most [`MAX_LABEL_CHECKS`] held members, with the earliest time
    /// one of those skipped becomes eligible by itself (see [`Pool::wait_counts`]).
    fn free_entries<'a, T: 'a>(
        &self,
        order: impl Iterator<Item = &'a T>,
        entry: impl Fn(&T) -> (u64, &MemberId),
        holds: &Holds<'_>,
        wanted: usize,
    ) -> (Vec<&'a T>, Option<Timestamp>) {
        let mut found = Vec::new();
        let mut earliest: Option<Timestamp> = None;
        let mut held = 0u64;
        for item in order {
            if found.len() == wanted || held >= MAX_LABEL_CHECKS {
                break;
            }
            let (live, member) = entry(item);
            match self.held_until(holds, member) {
                Some(held_back) => {
                    if self.wait_counts(live) {
                        earliest = held_back.earliest(earliest);
                    }
                    held += 1;
                }
                None => found.push(item),
            }
        }
        (found, earliest)
    }

    /// Whether the end of a skipped member's hold (its ban for the target, its rest) makes
    /// it eligible by itself, so that a 204 waits for it: on a least-in-flight pool with
    /// `max_in_flight`, only when the member, with `live` leases, is below the cap (one at
    /// it is still at it when the hold ends). The rule of `waits_for` in
    /// `scripts/assign.lua`.
    pub(super) fn wait_counts(&self, live: u64) -> bool {
        self.config.policy != Policy::LeastInFlight
            || self.config.max_in_flight.is_none_or(|cap| live < cap.get())
    }

    /// What may hold members back for this request: the bans of its target, when it has
    /// live ones, the pacing scope that applies, and the members it excludes. `None` when
    /// nothing does: an assign then takes the plain path.
    fn holds<'a>(&self, request: &'a AssignRequest, now: Timestamp) -> Option<Holds<'a>> {
        let bans = request
            .target
            .as_ref()
            .filter(|target| self.bans.has_live(target, now));
        let rests = self.config.pacing.and_then(|pacing| {
            if pacing.per_target {
                request
                    .target
                    .as_ref()
                    .map(|target| (Some(target), pacing.min_interval_ms))
            } else {
                Some((None, pacing.min_interval_ms))
            }
        });
        let exclude = (!request.exclude.is_empty()).then_some(&request.exclude);
        (bans.is_some() || rests.is_some() || exclude.is_some()).then_some(Holds {
            bans,
            rests,
            exclude,
            now,
        })
    }

    /// Why `member` is held back for the request, `None` when it is free.
    pub(super) fn held_until(&self, holds: &Holds<'_>, member: &MemberId) -> Option<HeldBack> {
        if holds
            .exclude
            .is_some_and(|exclude| exclude.contains(member))
        {
            return Some(HeldBack::Excluded);
        }
        let banned = holds
            .bans
            .and_then(|target| self.bans.banned_until(target, member, holds.now));
        let resting = holds
            .rests
            .and_then(|(scope, _)| self.rests.resting_until(scope, member, holds.now));
        banned.max(resting).map(HeldBack::Until)
    }

    /// Rests the member just handed out, when the request is paced.
    fn rest(&mut self, holds: Option<&Holds<'_>>, member: &MemberId) {
        if let Some(Holds {
            rests: Some((scope, interval)),
            now,
            ..
        }) = holds
        {
            let until = Timestamp(now.0.saturating_add(*interval));
            self.rests.rest(*scope, member, until, *now);
        }
    }

    /// How long until the first of the cooling-down members or of `banned_until` comes
    /// back, for an assign that found nothing.
    fn wait_with_bans(
        &self,
        labels: &LabelFilter,
        banned_until: Option<Timestamp>,
        now: Timestamp,
    ) -> Option<Duration> {
        let cooling = self.wait_for(labels, now);
        let banned = bans::wait_until(banned_until, now);
        cooling.into_iter().chain(banned).min()
    }

    fn assign_least_used(
        &mut self,
        request: &AssignRequest,
        now: Timestamp,
    ) -> Result<Assignment, StoreError> {
        let labels = &request.labels;
        let holds = self.holds(request, now);
        let chosen = if labels.is_empty() {
            if self.labels.of.is_empty() && holds.is_none() {
                // No labels anywhere and no bans: the plain path, one pop and one insert.
                return Ok(match self.eligible.add_one_to_first() {
                    Some((member, assignments)) => {
                        self.total_assignments += 1;
                        Assignment::Assigned {
                            member,
                            assignments,
                        }
                    }
                    None => Assignment::Empty {
                        next_return: self.next_return(now),
                    },
                });
            }
            match &holds {
                Some(holds) => {
                    match self.first_free(self.eligible.order.iter(), |e| (0, &e.1), holds) {
                        (Some((_, member)), _) => Some(member.clone()),
                        (None, banned_until) => {
                            return Ok(Assignment::Empty {
                                next_return: self.wait_with_bans(labels, banned_until, now),
                            });
                        }
                    }
                }
                None => self
                    .eligible
                    .order
                    .first()
                    .map(|(_, member)| member.clone()),
            }
        } else if let Some(first) = holds
            .is_none()
            .then(|| self.first_labelled(labels))
            .flatten()
        {
            // One key, nothing held back: the first entry of its sets, no walk.
            match first {
                Some((_, _, member)) => Some(member.clone()),
                None => {
                    return Ok(Assignment::Empty {
                        next_return: self.wait_for(labels, now),
                    });
                }
            }
        } else {
            let (mut first, banned_until) = self.pick_labelled(labels, holds.as_ref(), 1)?;
            match first.pop() {
                Some((_, _, member)) => Some(member),
                None => {
                    return Ok(Assignment::Empty {
                        next_return: self.wait_with_bans(labels, banned_until, now),
                    });
                }
            }
        };
        let Some(member) = chosen else {
            return Ok(Assignment::Empty {
                next_return: self.wait_for(labels, now),
            });
        };
        Ok(self.count_one(member, holds.as_ref()))
    }

    /// Counts one more assignment for an eligible member, keeping its places in step, and
    /// rests it when the request is paced.
    fn count_one(&mut self, member: MemberId, holds: Option<&Holds<'_>>) -> Assignment {
        // A least-used pool: no choosing order besides `eligible`, and the label entries
        // move in place (see `recount_labels`), the id passed along rather than copied.
        let before = self.eligible.get(&member).unwrap_or(0);
        let assignments = before + 1;
        let member = if self.labels.of.is_empty() {
            member
        } else {
            self.recount_labels(member, before, assignments)
        };
        let member = self.eligible.recount(member, assignments);
        self.total_assignments += 1;
        self.rest(holds, &member);
        Assignment::Assigned {
            member,
            assignments,
        }
    }

    /// Leases an eligible member that has `in_flight` live leases, counting one more
    /// assignment for it and resting it when the request is paced.
    fn lease_one(
        &mut self,
        member: MemberId,
        in_flight: u64,
        now: Timestamp,
        ttl: LeaseTtl,
        holds: Option<&Holds<'_>>,
    ) -> Assignment {
        self.unplace(&member);
        let assignments = self.eligible.get(&member).unwrap_or(0) + 1;
        self.eligible.set(member.clone(), assignments);
        self.in_flight.insert(member.clone(), in_flight + 1);
        self.place(&member);
        self.total_assignments += 1;
        self.rest(holds, &member);
        let lease = self.lease_for(&member, now, ttl);
        Assignment::Leased {
            member,
            assignments,
            in_flight: in_flight + 1,
            lease,
        }
    }

    fn assign_least_in_flight(
        &mut self,
        request: &AssignRequest,
        now: Timestamp,
    ) -> Result<Assignment, StoreError> {
        self.reclaim_expired(now, RECLAIM_ON_ASSIGN);
        let holds = self.holds(request, now);
        let (first, banned_until) = if !request.labels.is_empty() {
            let (mut found, banned_until) =
                self.pick_labelled(&request.labels, holds.as_ref(), 1)?;
            (found.pop(), banned_until)
        } else if let Some(holds) = &holds {
            // The skipped members' earliest end is kept even when a free one is found: that
            // one may be at the cap, and then the 204 waits for them.
            let (entry, banned_until) = self.first_free(self.order.iter(), |e| (e.0, &e.2), holds);
            (entry.cloned(), banned_until)
        } else {
            (self.order.first().cloned(), None)
        };
        let Some((in_flight, _, member)) = first else {
            return Ok(Assignment::Empty {
                next_return: self.wait_with_bans(&request.labels, banned_until, now),
            });
        };
        // The first entry has the fewest live leases of all (the first not banned: of all
        // those not banned): if it is at the cap, so is every other; a member skipped before
        // it below the cap becomes eligible when its hold ends, and the 204 waits for that.
        if self
            .config
            .max_in_flight
            .is_some_and(|cap| in_flight >= cap.get())
        {
            return Ok(Assignment::Empty {
                next_return: bans::wait_until(banned_until, now),
            });
        }
        let ttl = request.ttl.unwrap_or(self.config.lease_ttl_ms);
        Ok(self.lease_one(member, in_flight, now, ttl, holds.as_ref()))
    }

    /// An assign in a session, by the rules of `assign.lua` (see `Store::assign_in_session`).
    fn assign_in_session(
        &mut self,
        request: &AssignRequest,
        session: &SessionRequest,
        now: Timestamp,
    ) -> Result<SessionAssignment, StoreError> {
        let lif = self.config.policy == Policy::LeastInFlight;
        if lif {
            self.reclaim_expired(now, RECLAIM_ON_ASSIGN);
        }
        self.sessions.clear_ended(now);
        let ttl = session.ttl.unwrap_or(self.config.session_ttl_ms);
        let until = Timestamp(now.0.saturating_add(ttl.as_millis()));
        let pinned = self.sessions.member(&session.id, now).cloned();
        if pinned.is_none() && self.sessions.len() >= MAX_SESSIONS {
            return Err(StoreError::TooManySessions);
        }
        if pinned.is_some() {
            self.sessions.slide(&session.id, until);
        }
        let pin = |repinned| SessionPin {
            id: session.id.clone(),
            expires_at: until,
            repinned,
        };
        if let Some(member) = pinned.filter(|m| self.still_fits(m, request, now)) {
            // Pacing does not hold the pinned member back; it rests all the same.
            let holds = self.holds(request, now);
            let assignment = if lif {
                let in_flight = self.in_flight_of(&member);
                let lease_ttl = request.ttl.unwrap_or(self.config.lease_ttl_ms);
                self.lease_one(member, in_flight, now, lease_ttl, holds.as_ref())
            } else {
                self.count_one(member, holds.as_ref())
            };
            return Ok(SessionAssignment {
                assignment,
                session: Some(pin(false)),
            });
        }
        let was_live = self.sessions.member(&session.id, now).is_some();
        let assignment = if lif {
            self.assign_least_in_flight(request, now)?
        } else {
            self.assign_least_used(request, now)?
        };
        let session = match &assignment {
            Assignment::Assigned { member, .. } | Assignment::Leased { member, .. } => {
                self.sessions.pin(&session.id, member.clone(), until);
                Some(pin(was_live))
            }
            Assignment::Empty { .. } => was_live.then(|| pin(false)),
        };
        Ok(SessionAssignment {
            assignment,
            session,
        })
    }

    /// Whether a session's member may still be handed out for `request`: eligible, not
    /// banned for its target, carrying its labels, not excluded, and on a capped
    /// least-in-flight pool below the cap.
    /// Takes `needed` tokens from the bucket of the request's client, when it has a rate.
    fn take_tokens(
        &mut self,
        request: &AssignRequest,
        now: Timestamp,
        needed: u64,
    ) -> Result<(), StoreError> {
        match &request.rate {
            Some(limit) => self.buckets.take(limit, now, needed),
            None => Ok(()),
        }
    }

    fn still_fits(&self, member: &MemberId, request: &AssignRequest, now: Timestamp) -> bool {
        let banned = request
            .target
            .as_ref()
            .is_some_and(|target| self.bans.banned_until(target, member, now).is_some());
        let labelled = request.labels.is_empty()
            || self
                .labels
                .of
                .get(member)
                .is_some_and(|labels| labels.matches(&request.labels));
        let below_cap = self.config.policy != Policy::LeastInFlight
            || self
                .config
                .max_in_flight
                .is_none_or(|cap| self.in_flight_of(member) < cap.get());
        self.eligible.get(member).is_some()
            && !banned
            && labelled
            && below_cap
            && !request.exclude.contains(member)
    }

    /// Up to `count` distinct members in the choosing order among those that fit
    /// `request` (labels; not banned for its target, not resting), each counted once (and
    /// leased on a least-in-flight pool, below the cap), as `assign.lua` does.
    fn assign_several(
        &mut self,
        request: &AssignRequest,
        count: AssignCount,
        now: Timestamp,
    ) -> Result<Batch, StoreError> {
        let lif = self.config.policy == Policy::LeastInFlight;
        if lif {
            self.reclaim_expired(now, RECLAIM_ON_ASSIGN);
        }
        let holds = self.holds(request, now);
        let wanted = count.get();
        // (live leases on a least-in-flight pool else 0, assignments, member), in order.
        let (chosen, banned_until): (Vec<labelled::OrderEntry>, Option<Timestamp>) =
            if !request.labels.is_empty() {
                self.pick_labelled(&request.labels, holds.as_ref(), wanted)?
            } else if lif {
                match &holds {
                    Some(holds) => {
                        let (found, earliest) =
                            self.free_entries(self.order.iter(), |e| (e.0, &e.2), holds, wanted);
                        (found.into_iter().cloned().collect(), earliest)
                    }
                    None => (self.order.iter().take(wanted).cloned().collect(), None),
                }
            } else {
                let (entries, earliest): (Vec<&(u64, MemberId)>, Option<Timestamp>) = match &holds {
                    Some(holds) => {
                        self.free_entries(self.eligible.order.iter(), |e| (0, &e.1), holds, wanted)
                    }
                    None => (self.eligible.order.iter().take(wanted).collect(), None),
                };
                (
                    entries
                        .into_iter()
                        .map(|(assignments, member)| (0, *assignments, member.clone()))
                        .collect(),
                    earliest,
                )
            };
        if chosen.is_empty() {
            return Ok(Batch {
                assigned: Vec::new(),
                next_return: self.wait_with_bans(&request.labels, banned_until, now),
            });
        }
        let ttl = request.ttl.unwrap_or(self.config.lease_ttl_ms);
        let cap = self.config.max_in_flight;
        let mut assigned = Vec::with_capacity(chosen.len());
        for (in_flight, _, member) in chosen {
            if !lif {
                assigned.push(self.count_one(member, holds.as_ref()));
                continue;
            }
            // The fewest live leases come first (of those not held): from the first at the
            // cap on, all are; a held one below it is waited for (see `Pool::wait_counts`).
            if cap.is_some_and(|cap| in_flight >= cap.get()) {
                break;
            }
            assigned.push(self.lease_one(member, in_flight, now, ttl, holds.as_ref()));
        }
        let next_return = if assigned.is_empty() {
            bans::wait_until(banned_until, now)
        } else {
            None
        };
        Ok(Batch {
            assigned,
            next_return,
        })
    }

    fn info(&self, pool: &PoolId) -> PoolInfo {
        PoolInfo {
            pool: pool.clone(),
            config: self.config.clone(),
            created_at: self.created_at,
            stats: PoolStats {
                eligible: self.eligible.len(),
                ineligible: self.ineligible.len(),
                min_assignments: self.eligible.min(),
                max_assignments: self.eligible.max(),
                total_assignments: self.total_assignments,
                in_flight: self.leases.len() as u64,
                abandoned: self.abandoned,
                tripped: self.tripped,
                recovered: self.recovered,
                pruned: self.pruned,
                shared_exit_ips: self.shared_exit_ips,
                country_mismatches: self.country_mismatches,
            },
        }
    }

    /// One page of a listing, bans left out (see `Store::members`).
    /// A page of the listing; without a label filter each set's page begins at its `starts`
    /// (where the cursor's offsets were walked to, see [`walk_on`]).
    fn listing_page(
        &self,
        filter: StateFilter,
        labels: &LabelFilter,
        limit: usize,
        cursor: Cursor,
        (eligible_start, ineligible_start): (&PageStart, &PageStart),
    ) -> MemberPage {
        if !labels.is_empty() {
            return self.labelled_page(filter, labels, limit, cursor);
        }
        // Take one more than a page from each set so that the merge knows whether
        // anything is left after this page.
        let eligible: Vec<MemberView> = match (filter, eligible_start) {
            (StateFilter::Ineligible, _) | (_, None) => Vec::new(),
            (_, Some((from, left))) => self
                .eligible
                .page(from.as_ref(), *left, limit + 1)
                .map(|(count, member)| self.view_eligible(member, *count))
                .collect(),
        };
        let ineligible: Vec<MemberView> = match (filter, ineligible_start) {
            (StateFilter::Eligible, _) | (_, None) => Vec::new(),
            (_, Some((from, left))) => self
                .ineligible
                .page(from.as_ref(), *left, limit + 1)
                .map(|(count, member)| self.view_ineligible(member, *count))
                .collect(),
        };
        super::merge_page(eligible, ineligible, limit, cursor)
    }

    fn view_eligible(&self, member: &MemberId, assignments: u64) -> MemberView {
        self.with_health(MemberView {
            member: member.clone(),
            origin: Origin::Manual,
            state: MemberState::Eligible,
            assignments,
            in_flight: self.in_flight_of(member),
            reason: None,
            since: None,
            consecutive_failures: 0,
            last_cooldown_ms: None,
            returns_at: None,
            last_check: None,
            exit_ip: None,
            exit_ip_at: None,
            labels: crate::domain::Labels::default(),
            geo_labels: crate::domain::Labels::default(),
            country_mismatch: false,
            banned_until: None,
            quality: crate::store::Quality::default(),
        })
    }

    fn view_ineligible(&self, member: &MemberId, assignments: u64) -> MemberView {
        let (reason, since) = self
            .taken_out
            .get(member)
            .map(|(reason, since)| (reason.clone(), *since))
            .unzip();
        self.with_health(MemberView {
            member: member.clone(),
            origin: Origin::Manual,
            state: MemberState::Ineligible,
            assignments,
            in_flight: self.in_flight_of(member),
            reason,
            since,
            consecutive_failures: 0,
            last_cooldown_ms: None,
            returns_at: None,
            last_check: None,
            exit_ip: None,
            exit_ip_at: None,
            labels: crate::domain::Labels::default(),
            geo_labels: crate::domain::Labels::default(),
            country_mismatch: false,
            banned_until: None,
            quality: crate::store::Quality::default(),
        })
    }
}

/// What may hold members back for one assign (see `Pool::holds`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Holds<'a> {
    /// The request's target, when it has live bans.
    bans: Option<&'a Target>,
    /// When the request is paced: its scope (`None` pool-wide, else the target) and the
    /// interval in milliseconds.
    rests: Option<(Option<&'a Target>, u64)>,
    /// The members the request excludes, when it names any.
    exclude: Option<&'a Exclude>,
    /// The time of the assign.
    now: Timestamp,
}

/// Why a member is held back for one request (see `Pool::held_until`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HeldBack {
    /// The request excludes it: nothing makes it free by itself, so it brings no wait.
    Excluded,
    /// Banned for the request's target or resting, until then.
    Until(Timestamp),
}

impl HeldBack {
    /// The earlier of `earliest` and when this member is free again.
    pub(super) fn earliest(self, earliest: Option<Timestamp>) -> Option<Timestamp> {
        match self {
            Self::Excluded => earliest,
            Self::Until(until) => Some(earliest.map_or(until, |e| e.min(until))),
        }
    }
}

/// How many of the soonest returns an assign with a label filter that found nothing looks
/// at for one carrying the labels (see `Pool::wait_for`).
const RETURNS_CHECKED: usize = 16;

/// The labels of a member that has none, for images that borrow.
static NO_LABELS: std::sync::LazyLock<crate::domain::Labels> =
    std::sync::LazyLock::new(crate::domain::Labels::default);

/// Appends the count update of every member `batch` handed out (`total` the pool's
/// assignments after it).
fn journal_batch(journal: Option<&mut Buffer>, pool: &PoolId, batch: &Batch, total: u64) {
    let Some(journal) = journal else {
        return;
    };
    for assignment in &batch.assigned {
        journal_assignment(journal, pool, assignment, total);
    }
}

/// Appends the count update of the member `assignment` handed out, if it handed one out.
/// It is the one record written on every assign: it carries only what changed, and costs
/// no lookup.
fn journal_assignment(journal: &mut Buffer, pool: &PoolId, assignment: &Assignment, total: u64) {
    if let Assignment::Assigned {
        member,
        assignments,
    }
    | Assignment::Leased {
        member,
        assignments,
        ..
    } = assignment
    {
        journal.assigned(pool, member, *assignments, total);
    }
}

/// When the answer of one assign waits for the disk: a lease issued is on disk before the
/// worker holds it.
fn assignment_change(assignment: Option<&Assignment>) -> Change {
    match assignment {
        Some(Assignment::Leased { .. }) => Change::Durable,
        _ => Change::Counts,
    }
}

/// When the answer of a batch waits for the disk: leases issued are on disk before the
/// worker holds them.
fn batch_change(batch: Option<&Batch>) -> Change {
    match batch {
        Some(batch)
            if batch
                .assigned
                .iter()
                .any(|a| matches!(a, Assignment::Leased { .. })) =>
        {
            Change::Durable
        }
        _ => Change::Counts,
    }
}

/// When an operation's answer waits for the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    /// Configuration, membership or a lease issued: on disk before the answer.
    Durable,
    /// Counts and outcome state: on disk within the fsync interval (before the answer when
    /// the interval is zero).
    Counts,
}

impl EmbeddedStore {
    /// An empty store in memory: nothing is kept across a restart.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store in memory whose clock reads `ms` (Unix milliseconds), which the test
    /// sets.
    #[cfg(test)]
    pub(crate) fn on_test_clock(ms: Arc<std::sync::atomic::AtomicU64>) -> Self {
        Self {
            inner: Arc::default(),
            disk: None,
            chunks: MemberChunks::default(),
            clock: Clock { set: Some(ms) },
        }
    }

    /// Opens (or creates) a data directory, recovers the state it holds and keeps every
    /// change there from now on.
    ///
    /// # Errors
    /// An [`OpenError`] when the directory cannot be read or written, another process
    /// holds it, or a file in it is damaged (other than a last record cut short by a
    /// crash, which is dropped with a warning).
    pub fn open(options: DataDirOptions) -> Result<Self, OpenError> {
        let recovered = recovery::recover(&options)?;
        let mut inner = Inner {
            pools: recovered.pools,
            clients: recovered.clients,
            ..Inner::default()
        };
        // The indexes are not on disk: one pass over the recovered pools rebuilds them.
        let now = Timestamp::now();
        for (id, p) in &inner.pools {
            inner.sweep_due.set(id, p.next_due());
            if p.config.health.check.is_some() {
                inner.checks_due.set(id, Some(now));
            }
            if !p.config.sources.is_empty() {
                inner.sources_due.set(id, Some(now));
            }
        }
        let inner = Arc::new(Mutex::new(inner));
        let disk = Disk::start(&inner, options, recovered.disk)?;
        Ok(Self {
            inner,
            disk: Some(disk),
            chunks: MemberChunks::default(),
            clock: Clock::default(),
        })
    }

    /// Whether this store keeps its state in a data directory.
    pub fn is_durable(&self) -> bool {
        self.disk.is_some()
    }

    /// Every pool, member and lease, one line each in a fixed order: the same state gives
    /// the same lines. For comparing a recovered store with the one it came from.
    pub fn state_lines(&self) -> Vec<String> {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        snapshot::describe(&inner.pools, &inner.clients)
    }

    /// The lock, for a call that counts as in flight (see [`Held`]).
    fn lock(&self) -> Result<Held<'_>, StoreError> {
        self.lock_as(true)
    }

    /// The lock; `foreground` counts the call in flight from before it queues for it until
    /// it lets go, as every call but a large operation's chunks does (a chunk counting
    /// itself would rest for nobody: see `chunks.rs`).
    fn lock_as(&self, foreground: bool) -> Result<Held<'_>, StoreError> {
        let in_flight = foreground.then(|| self.chunks.traffic.enter());
        // A panic while holding the lock cannot leave a pool half-updated in a way later
        // operations would trip on (each step keeps `order` and `counts` in step), so a
        // poisoned lock is still usable.
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        match &inner.refused {
            None => Ok(Held {
                inner,
                _in_flight: in_flight,
            }),
            Some(Refused::Closed) => Err(StoreError::Unavailable("the store is closed".into())),
            Some(Refused::DiskFailed(error)) => Err(StoreError::Unavailable(
                format!("the data directory failed ({error}); restart the service").into(),
            )),
        }
    }

    /// Runs `f` on the pool under the lock and records what it changed; returns its answer
    /// and the end of the log as the operation left it.
    fn with_pool<T>(
        &self,
        pool: &PoolId,
        f: impl FnOnce(&mut Pool, Option<&mut Buffer>) -> T,
    ) -> Result<(T, Option<u64>), StoreError> {
        self.with_pool_as(true, pool, f)
    }

    /// [`EmbeddedStore::with_pool`] for a call counted in flight when `foreground`, for a
    /// large operation's chunk when not (see [`EmbeddedStore::lock_as`]).
    fn with_pool_as<T>(
        &self,
        foreground: bool,
        pool: &PoolId,
        f: impl FnOnce(&mut Pool, Option<&mut Buffer>) -> T,
    ) -> Result<(T, Option<u64>), StoreError> {
        let mut inner = self.lock_as(foreground)?;
        let Inner {
            pools,
            journal,
            sweep_due,
            ..
        } = &mut *inner;
        let p = pools.get_mut(pool).ok_or(StoreError::PoolNotFound)?;
        let value = f(p, journal.as_mut());
        // Whatever the operation scheduled or ended, the sweep finds the pool at its time.
        sweep_due.set(pool, p.next_due());
        Ok((value, finish(journal.as_mut(), pool, p)))
    }

    /// Answers `value` once what it depends on is on disk as `change` requires.
    async fn settle<T>(
        &self,
        (value, end): (T, Option<u64>),
        change: Change,
    ) -> Result<T, StoreError> {
        if let (Some(disk), Some(end)) = (&self.disk, end)
            && (change == Change::Durable || disk.fsyncs_every_answer())
        {
            disk.wait(end).await?;
        }
        Ok(value)
    }
}

impl EmbeddedStore {
    /// Runs `step` on the pool once per chunk of `members`, each chunk in a turn of the
    /// lock of its own (timed for `sizer`, paced by the store's duty cycle), letting other
    /// operations in between; the end of the log as the last chunk left it. Each chunk is
    /// atomic, the call is not.
    async fn in_chunks<T: Sync>(
        &self,
        pool: &PoolId,
        sizer: &ChunkSizer,
        members: &[T],
        mut step: impl FnMut(&mut Pool, &[T]) + Send,
    ) -> Result<Option<u64>, StoreError> {
        let mut end = None;
        for chunk in sizer.chunks(members) {
            let started = self.chunks.rest().await;
            let ((), chunk_end) = self.with_pool_as(false, pool, |p, _| {
                let locked = std::time::Instant::now();
                step(p, chunk);
                // Under the lock still: a call waiting for it now is in flight.
                self.chunks
                    .ran(started, sizer, chunk.len(), locked.elapsed());
            })?;
            end = chunk_end.or(end);
            // The lock is free now; let the operations that waited for it run before the
            // next chunk takes it again.
            tokio::task::yield_now().await;
        }
        Ok(end)
    }
}

/// The store's lock, held by a call, with the count of that call in flight (none for a
/// large operation's chunk). The lock goes first, then the count, so that a call is in flight
/// for as long as it holds the lock.
struct Held<'a> {
    inner: MutexGuard<'a, Inner>,
    _in_flight: Option<InFlight<'a>>,
}

impl std::ops::Deref for Held<'_> {
    type Target = Inner;

    fn deref(&self) -> &Inner {
        &self.inner
    }
}

impl std::ops::DerefMut for Held<'_> {
    fn deref_mut(&mut self) -> &mut Inner {
        &mut self.inner
    }
}

/// Hands what the operation changed in `pool` to the journal (or forgets it, in memory);
/// the log's end afterwards.
fn finish(journal: Option<&mut Buffer>, id: &PoolId, pool: &mut Pool) -> Option<u64> {
    match journal {
        Some(journal) => {
            journal.record(id, pool);
            Some(journal.end())
        }
        None => {
            pool.changes.clear();
            None
        }
    }
}

#[async_trait]
impl Store for EmbeddedStore {
    fn name(&self) -> &'static str {
        "embedded"
    }

    async fn status(&self) -> Result<StoreStatus, StoreError> {
        drop(self.lock()?);
        Ok(StoreStatus {
            store: "embedded",
            topology: "in-process".to_owned(),
            primaries: None,
            master: None,
        })
    }

    async fn assign(
        &self,
        pool: &PoolId,
        request: &AssignRequest,
    ) -> Result<Assignment, StoreError> {
        let answer = self.with_pool(pool, |p, journal| {
            let now = self.clock.now();
            p.take_tokens(request, now, 1)?;
            p.return_due(now, RETURN_ON_ASSIGN);
            let assignment = if p.config.policy == Policy::LeastInFlight {
                p.assign_least_in_flight(request, now)
            } else {
                p.assign_least_used(request, now)
            };
            let assignment = assignment?;
            if let Some(journal) = journal {
                journal_assignment(journal, pool, &assignment, p.total_assignments);
            }
            Ok(assignment)
        })?;
        let change = assignment_change(answer.0.as_ref().ok());
        self.settle(answer, change).await?
    }

    async fn assign_several(
        &self,
        pool: &PoolId,
        request: &AssignRequest,
        count: AssignCount,
    ) -> Result<Batch, StoreError> {
        let answer = self.with_pool(pool, |p, journal| {
            let now = self.clock.now();
            p.take_tokens(request, now, count.get() as u64)?;
            p.return_due(now, RETURN_ON_ASSIGN);
            let batch = p.assign_several(request, count, now)?;
            journal_batch(journal, pool, &batch, p.total_assignments);
            Ok(batch)
        })?;
        let change = batch_change(answer.0.as_ref().ok());
        self.settle(answer, change).await?
    }

    async fn assign_after_done(
        &self,
        pool: &PoolId,
        done: &Done,
        request: &AssignRequest,
        count: AssignCount,
    ) -> Result<(Batch, DoneSummary), StoreError> {
        let draw = super::jitter_draw();
        let answer = self.with_pool(pool, |p, journal| {
            let now = self.clock.now();
            // The rate limit before everything, as rate.lua checks it at the head of the
            // script: a refused assign changes nothing, its `done` included.
            p.take_tokens(request, now, count.get() as u64)?;
            // `done` first, in the same turn of the lock as the pick, as assign_done.lua
            // does it in the same script: the pick sees what the report and the release did.
            let summary = p.apply_done(done, now, draw);
            p.return_due(now, RETURN_ON_ASSIGN);
            let batch = if count == AssignCount::ONE {
                let assignment = if p.config.policy == Policy::LeastInFlight {
                    p.assign_least_in_flight(request, now)
                } else {
                    p.assign_least_used(request, now)
                }?;
                match assignment {
                    Assignment::Empty { next_return } => Batch {
                        assigned: Vec::new(),
                        next_return,
                    },
                    assigned => Batch {
                        assigned: vec![assigned],
                        next_return: None,
                    },
                }
            } else {
                p.assign_several(request, count, now)?
            };
            journal_batch(journal, pool, &batch, p.total_assignments);
            Ok((batch, summary))
        })?;
        let change = batch_change(answer.0.as_ref().ok().map(|(batch, _)| batch));
        self.settle(answer, change).await?
    }

    async fn assign_in_session(
        &self,
        pool: &PoolId,
        request: &AssignRequest,
        session: &SessionRequest,
    ) -> Result<SessionAssignment, StoreError> {
        let answer = self.with_pool(pool, |p, journal| {
            let now = self.clock.now();
            p.take_tokens(request, now, 1)?;
            p.return_due(now, RETURN_ON_ASSIGN);
            let answer = p.assign_in_session(request, session, now)?;
            if let Some(journal) = journal {
                journal_assignment(journal, pool, &answer.assignment, p.total_assignments);
            }
            Ok(answer)
        })?;
        // Sessions themselves are not kept on disk.
        let change = assignment_change(answer.0.as_ref().ok().map(|a| &a.assignment));
        self.settle(answer, change).await?
    }

    async fn assign_in_session_after_done(
        &self,
        pool: &PoolId,
        done: &Done,
        request: &AssignRequest,
        session: &SessionRequest,
    ) -> Result<(SessionAssignment, DoneSummary), StoreError> {
        let draw = super::jitter_draw();
        let answer = self.with_pool(pool, |p, journal| {
            let now = self.clock.now();
            p.take_tokens(request, now, 1)?;
            // `done` first, in the same turn of the lock: the session's member is judged
            // after what the report and the release did to it.
            let summary = p.apply_done(done, now, draw);
            p.return_due(now, RETURN_ON_ASSIGN);
            let answer = p.assign_in_session(request, session, now)?;
            if let Some(journal) = journal {
                journal_assignment(journal, pool, &answer.assignment, p.total_assignments);
            }
            Ok((answer, summary))
        })?;
        let change = assignment_change(answer.0.as_ref().ok().map(|(a, _)| &a.assignment));
        self.settle(answer, change).await?
    }

    async fn end_session(&self, pool: &PoolId, session: &SessionId) -> Result<(), StoreError> {
        let (ended, _) = self.with_pool(pool, |p, _| p.sessions.end(session, self.clock.now()))?;
        if ended {
            Ok(())
        } else {
            Err(StoreError::SessionNotFound)
        }
    }

    async fn release(&self, pool: &PoolId, lease: &LeaseId) -> Result<(), StoreError> {
        let (released, end) = self.with_pool(pool, |p, _| {
            p.live_lease(lease, self.clock.now())?;
            p.end_lease(lease);
            Ok(())
        })?;
        // A release lost in a crash leaves a lease that is reclaimed when it expires.
        self.settle((released, end), Change::Counts).await?
    }

    async fn renew(
        &self,
        pool: &PoolId,
        lease: &LeaseId,
        ttl: Option<LeaseTtl>,
    ) -> Result<Renewed, StoreError> {
        // The twin of `renew.lua`. The new expiry, earlier or later, moves the pool's entry
        // in the due index as every operation does (`with_pool` sets it to `next_due`), so a
        // lease renewed shorter is reclaimed at its new expiry.
        let answer = self.with_pool(pool, |p, _| {
            let now = self.clock.now();
            let member = p.live_lease(lease, now)?;
            // Re-issued under the same id: the old expiry entry goes, the new one comes.
            if let Some((_, expires_at)) = p.leases.remove(lease) {
                p.expiry.remove(&(expires_at, lease.clone()));
            }
            let ttl = ttl.unwrap_or(p.config.lease_ttl_ms);
            let expires_at = Timestamp(now.0.saturating_add(ttl.as_millis()));
            p.leases.insert(lease.clone(), (member.clone(), expires_at));
            p.expiry.insert((expires_at, lease.clone()));
            p.mark_lease(lease);
            Ok(Renewed {
                member,
                lease: Lease {
                    id: lease.clone(),
                    expires_at,
                    ttl_ms: ttl,
                },
            })
        })?;
        // A renewed lease is issued anew: a worker relies on it as on a new one.
        self.settle(answer, Change::Durable).await?
    }

    async fn sweep(&self) -> Result<Swept, StoreError> {
        let now = self.clock.now();
        // Only the pools the index says are due, taken out of it; `with_pool` puts each back
        // at its next due time after every step.
        let due = self.lock()?.sweep_due.take_due(now, SWEEP_POOLS_PER_CALL);
        let mut swept = Swept::default();
        let mut end = None;
        // One pool at a time, in steps sized by their measured cost per turn of the lock,
        // as on Redis: a pool with a large backlog never holds the lock for long.
        let sizer = &self.chunks.sweep;
        for id in &due {
            loop {
                let batch = sizer.size() as u64;
                let started = self.chunks.rest().await;
                let step = match self.with_pool_as(false, id, |p, _| {
                    let locked = std::time::Instant::now();
                    let step = Swept {
                        reclaimed: p.reclaim_expired(now, batch),
                        returned: p.return_due(now, batch),
                    };
                    // Ended sessions go too, so that memory follows the live ones even in
                    // a pool nobody assigns from any more (assigns clear a few each).
                    let ended = p.sessions.clear_ended_up_to(now, batch);
                    let done = step.reclaimed + step.returned + ended;
                    self.chunks.ran(
                        started,
                        sizer,
                        usize::try_from(done).unwrap_or(usize::MAX),
                        locked.elapsed(),
                    );
                    (step, ended)
                }) {
                    Ok((step, step_end)) => {
                        end = step_end.or(end);
                        step
                    }
                    // Deleted since it was taken from the index.
                    Err(StoreError::PoolNotFound) => break,
                    Err(error) => return Err(error),
                };
                let (step, ended) = step;
                swept = swept + step;
                if step.reclaimed < batch && step.returned < batch && ended < batch {
                    break;
                }
                tokio::task::yield_now().await;
            }
        }
        self.settle((swept, end), Change::Counts).await
    }

    async fn report(
        &self,
        pool: &PoolId,
        source: ReportSource,
        reports: &[Report],
    ) -> Result<ReportSummary, StoreError> {
        let draw = super::jitter_draw();
        let answer = self.with_pool(pool, |p, _| {
            let now = self.clock.now();
            let mut summary = ReportSummary::default();
            for report in reports {
                match p.apply(source, report, now, draw) {
                    Some((effect, streak, banned_until)) => summary.applied.push(Applied {
                        member: report.member.clone(),
                        result: report.result,
                        effect,
                        streak,
                        banned_until,
                    }),
                    None => summary.unknown.push(report.member.clone()),
                }
            }
            summary
        })?;
        self.settle(answer, Change::Counts).await
    }

    async fn due_check_pools(&self, limit: usize) -> Result<Vec<PoolId>, StoreError> {
        let mut inner = self.lock()?;
        Ok(inner
            .checks_due
            .take_due_holding(self.clock.now(), limit, CHECK_CLAIM_HOLD))
    }

    async fn claim_check_round(
        &self,
        pool: &PoolId,
        interval: Duration,
    ) -> Result<Option<CheckRound>, StoreError> {
        let answer = self.with_pool(pool, |p, _| {
            let now = self.clock.now();
            if let Some(until) = p.check_round_until.filter(|until| *until > now) {
                return (None, until);
            }
            let millis = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
            let until = Timestamp(now.0.saturating_add(millis.max(1)));
            p.check_round_until = Some(until);
            p.changes.pool = true;
            let limit = usize::try_from(MAX_PROBES_PER_ROUND).unwrap_or(usize::MAX);
            let eligible: Vec<MemberId> = p
                .eligible
                .order
                .iter()
                .take(limit)
                .map(|(_, m)| m.clone())
                .collect();
            let cooling = p
                .returns
                .iter()
                .take(limit - eligible.len())
                .map(|(_, m)| m.clone())
                .collect();
            (Some(CheckRound { eligible, cooling }), until)
        })?;
        let ((round, next_round), end) = answer;
        {
            // Only a pool still indexed: one whose checks were switched off stays out.
            let mut inner = self.lock()?;
            if inner.checks_due.get(pool).is_some() {
                inner.checks_due.set(pool, Some(next_round));
            }
        }
        self.settle((round, end), Change::Counts).await
    }

    async fn due_source_pools(&self, limit: usize) -> Result<Vec<PoolId>, StoreError> {
        let mut inner = self.lock()?;
        Ok(inner
            .sources_due
            .take_due_holding(self.clock.now(), limit, SOURCE_CLAIM_HOLD))
    }

    async fn claim_sources(
        &self,
        pool: &PoolId,
        urls: &[String],
        hold: Duration,
    ) -> Result<Vec<ClaimedSource>, StoreError> {
        let ((claimed, next), end) = self.with_pool(pool, |p, _| {
            let now = self.clock.now();
            let hold = u64::try_from(hold.as_millis()).unwrap_or(u64::MAX).max(1);
            p.sources.retain(|url, _| urls.contains(url));
            let book = &mut p.book;
            let before = book.successes.len();
            book.successes
                .retain(|id, _| book.urls.get(id).is_some_and(|url| urls.contains(url)));
            if book.successes.len() != before {
                p.changes.pool = true;
            }
            let mut claimed = Vec::new();
            let mut earliest: Option<Timestamp> = None;
            for url in urls {
                let id = match p.book.current_id(url) {
                    Some(id) => id,
                    None => {
                        p.book.last_id += 1;
                        let id = p.book.last_id;
                        p.book.urls.insert(id, url.clone());
                        // The URLs of the last 256 ids only (and of the configured sources),
                        // as on Redis (claim_sources.lua).
                        if let Some(old) = id.checked_sub(256)
                            && !p.book.successes.contains_key(&old)
                        {
                            p.book.urls.remove(&old);
                        }
                        p.book.successes.insert(id, 0);
                        p.changes.pool = true;
                        id
                    }
                };
                let kept = p.book.successes.get(&id).copied().unwrap_or(0);
                let state = p.sources.entry(url.clone()).or_insert(SourceState {
                    next_fetch_at: Timestamp(0),
                    failures: 0,
                    successes: kept,
                    last_fetch: None,
                });
                if state.next_fetch_at <= now {
                    state.next_fetch_at = Timestamp(now.0.saturating_add(hold));
                    claimed.push(ClaimedSource {
                        url: url.clone(),
                        failures: state.failures,
                        successes: state.successes,
                        id,
                    });
                }
                earliest =
                    Some(earliest.map_or(state.next_fetch_at, |e| e.min(state.next_fetch_at)));
            }
            (claimed, earliest)
        })?;
        {
            let mut inner = self.lock()?;
            // Only a pool still indexed: one whose sources were all removed stays out.
            if inner.sources_due.get(pool).is_some() {
                inner.sources_due.set(pool, next);
            }
        }
        self.settle((claimed, end), Change::Counts).await
    }

    async fn record_source_fetch(
        &self,
        pool: &PoolId,
        url: &str,
        outcome: &FetchOutcome,
        next_in: Duration,
    ) -> Result<(), StoreError> {
        let (next, end) = self.with_pool(pool, |p, _| {
            let id = p.book.current_id(url);
            let state = p.sources.get_mut(url)?;
            let now = self.clock.now();
            match outcome {
                FetchOutcome::Ok { .. } => {
                    state.failures = 0;
                    state.successes += 1;
                    if let Some(kept) = id.and_then(|id| p.book.successes.get_mut(&id)) {
                        *kept = state.successes;
                        p.changes.pool = true;
                    }
                }
                FetchOutcome::Failed { .. } => state.failures += 1,
            }
            let millis = u64::try_from(next_in.as_millis()).unwrap_or(u64::MAX);
            state.next_fetch_at = Timestamp(now.0.saturating_add(millis));
            state.last_fetch = Some(SourceFetch {
                at: now,
                outcome: outcome.clone(),
            });
            Some(state.next_fetch_at)
        })?;
        if let Some(next) = next {
            let mut inner = self.lock()?;
            // Lowered only, as on Redis: another source may be due sooner.
            if let Some(at) = inner.sources_due.get(pool)
                && next < at
            {
                inner.sources_due.set(pool, Some(next));
            }
        }
        self.settle(((), end), Change::Counts).await
    }

    async fn source_states(
        &self,
        pool: &PoolId,
    ) -> Result<HashMap<String, SourceState>, StoreError> {
        Ok(self.with_pool(pool, |p, _| p.sources.clone())?.0)
    }

    async fn prune(&self, pool: &PoolId, absent: Option<(u64, u64)>) -> Result<Pruned, StoreError> {
        let answer = self.with_pool(pool, |p, _| p.prune(absent, self.clock.now()))?;
        self.settle(answer, Change::Durable).await
    }

    async fn put_pool(&self, pool: &PoolId, config: &PoolConfig) -> Result<PutPool, StoreError> {
        let answer = {
            let mut inner = self.lock()?;
            let Inner {
                pools,
                journal,
                checks_due,
                sources_due,
                ..
            } = &mut *inner;
            let put = if let Some(existing) = pools.get_mut(pool) {
                let has_members = existing.eligible.len() + existing.ineligible.len() > 0;
                if existing.config.policy != config.policy && has_members {
                    return Err(StoreError::PolicyChangeRequiresEmptyPool);
                }
                existing.config = config.clone();
                PutPool::Updated
            } else {
                pools.insert(pool.clone(), Pool::new(config.clone(), self.clock.now()));
                PutPool::Created
            };
            let p = pools.get_mut(pool).ok_or(StoreError::PoolNotFound)?;
            p.changes.pool = true;
            let end = finish(journal.as_mut(), pool, p);
            // A pool with checks is due for a round now; one without leaves the index.
            let round = config.health.check.as_ref().map(|_| self.clock.now());
            checks_due.set(pool, round);
            // Likewise for sources: those not due yet are left alone by their claim.
            let fetch = (!config.sources.is_empty()).then(|| self.clock.now());
            sources_due.set(pool, fetch);
            (put, end)
        };
        self.settle(answer, Change::Durable).await
    }

    async fn pool(&self, pool: &PoolId) -> Result<PoolInfo, StoreError> {
        Ok(self.with_pool(pool, |p, _| p.info(pool))?.0)
    }

    async fn pool_page(
        &self,
        prefix: &str,
        after: Option<&PoolId>,
        limit: usize,
    ) -> Result<PoolPage, StoreError> {
        use std::ops::Bound;
        let inner = self.lock()?;
        let start = match after {
            Some(after) if after.as_str() >= prefix => Bound::Excluded(after.as_str()),
            _ => Bound::Included(prefix),
        };
        let mut pools: Vec<PoolInfo> = inner
            .pools
            .range::<str, _>((start, Bound::Unbounded))
            .take_while(|(id, _)| id.as_str().starts_with(prefix))
            .take(limit.saturating_add(1))
            .map(|(id, p)| p.info(id))
            .collect();
        let next = if pools.len() > limit {
            pools.truncate(limit);
            pools.last().map(|info| info.pool.clone())
        } else {
            None
        };
        Ok(PoolPage { pools, next })
    }

    async fn pool_count(&self) -> Result<u64, StoreError> {
        Ok(u64::try_from(self.lock()?.pools.len()).unwrap_or(u64::MAX))
    }

    async fn delete_pool(&self, pool: &PoolId) -> Result<(), StoreError> {
        let (removed, end) = {
            let mut inner = self.lock()?;
            let removed = inner.pools.remove(pool).ok_or(StoreError::PoolNotFound)?;
            inner.sweep_due.set(pool, None);
            inner.checks_due.set(pool, None);
            inner.sources_due.set(pool, None);
            let end = inner.journal.as_mut().map(|journal| {
                journal.pool_deleted(pool);
                journal.end()
            });
            (removed, end)
        };
        // Taken out under the lock, so every reader sees it gone at once; freed outside
        // it, on a blocking thread: dropping a million members' maps takes far longer
        // than any step should hold the lock or a runtime worker.
        drop(tokio::task::spawn_blocking(move || drop(removed)));
        self.settle(((), end), Change::Durable).await
    }

    async fn add_members(&self, pool: &PoolId, seed: &Seed) -> Result<SeedReport, StoreError> {
        let mut report = SeedReport::default();
        // The first chunk settles the starting count; the later ones keep it, as on Redis.
        let mut start = seed.assignments;
        let mut pending_adds = seed.pending_adds;
        let end = self
            .in_chunks(pool, &self.chunks.seed, &seed.members, |p, chunk| {
                let count = *start.get_or_insert_with(|| {
                    p.config
                        .start_assignments
                        .unwrap_or_else(|| p.eligible.min().unwrap_or(0))
                });
                report.start_assignments = count;
                let max = p.config.rules.max_members;
                let mut size = p.eligible.len() + p.ineligible.len() + pending_adds;
                for member in chunk {
                    let eligible = p.eligible.get(member).is_some();
                    let ineligible = p.ineligible.get(member).is_some();
                    if eligible || ineligible {
                        if seed.reset && !seed.dry_run {
                            p.unplace(member);
                            let ranked = if eligible {
                                &mut p.eligible
                            } else {
                                &mut p.ineligible
                            };
                            ranked.set(member.clone(), count);
                            p.place(member);
                            p.mark_member(member);
                        }
                        // Labels from the file for its own address give way to those of
                        // its exit address (see seed.lua).
                        let geo = seed.geo.get(member).filter(|_| p.exit_of(member).is_none());
                        let labels = seed.labels.get(member);
                        if (labels.is_some() || geo.is_some()) && !seed.dry_run {
                            p.relabel(member, labels, geo);
                            p.mark_member(member);
                        }
                        // Seen again by its own source: no longer absent.
                        if let SeedOrigin::Source { id, fetch } = seed.origin
                            && !seed.dry_run
                        {
                            let mut provenance = p.provenance_of(member);
                            if provenance.origin == Some(id) {
                                provenance.seen = Some(fetch);
                                p.set_provenance(member, provenance);
                                p.mark_member(member);
                            }
                        }
                        report.existing.push(member.clone());
                    } else if max.is_some_and(|max| size >= max) {
                        report.full.push(member.clone());
                    } else {
                        if !seed.dry_run {
                            p.eligible.set(member.clone(), count);
                            p.place(member);
                            let (labels, geo) = (seed.labels.get(member), seed.geo.get(member));
                            if labels.is_some() || geo.is_some() {
                                p.relabel(member, labels, geo);
                            }
                            let (origin, seen) = match seed.origin {
                                SeedOrigin::Manual => (None, None),
                                SeedOrigin::Import => (Some(0), None),
                                SeedOrigin::Source { id, fetch } => (Some(id), Some(fetch)),
                            };
                            p.set_provenance(
                                member,
                                Provenance {
                                    origin,
                                    seen,
                                    ..Provenance::default()
                                },
                            );
                            p.mark_member(member);
                        } else {
                            pending_adds += 1;
                        }
                        size += 1;
                        report.added.push(member.clone());
                    }
                }
            })
            .await?;
        self.settle((report, end), Change::Durable).await
    }

    async fn members(
        &self,
        pool: &PoolId,
        filter: StateFilter,
        labels: &LabelFilter,
        target: Option<&Target>,
        limit: usize,
        cursor: Cursor,
    ) -> Result<MemberPage, StoreError> {
        // A page deep in a pool: each set walked to where the page starts, SKIP_STEP
        // members a turn of the lock. Like Redis's pieces, the page is a position, not a
        // snapshot: members that move meanwhile may shift it.
        let (eligible_skip, ineligible_skip) = match filter {
            StateFilter::Eligible => (cursor.eligible, 0),
            StateFilter::Ineligible => (0, cursor.ineligible),
            StateFilter::All => (cursor.eligible, cursor.ineligible),
        };
        let mut eligible_start: PageStart = Some((None, eligible_skip));
        let mut ineligible_start: PageStart = Some((None, ineligible_skip));
        let deep = |start: &PageStart| start.as_ref().is_some_and(|(_, left)| *left > SKIP_STEP);
        while labels.is_empty() && (deep(&eligible_start) || deep(&ineligible_start)) {
            // Paced like a large operation's chunks (see chunks.rs).
            let started = self.chunks.rest().await;
            self.with_pool_as(false, pool, |p, _| {
                let locked = std::time::Instant::now();
                walk_on(&p.eligible, &mut eligible_start);
                walk_on(&p.ineligible, &mut ineligible_start);
                self.chunks.ran_piece(started, locked.elapsed());
            })?;
            tokio::task::yield_now().await;
        }
        let (page, _) = self.with_pool(pool, |p, _| {
            let mut page = p.listing_page(
                filter,
                labels,
                limit,
                cursor,
                (&eligible_start, &ineligible_start),
            );
            if let Some(target) = target {
                let now = self.clock.now();
                for view in &mut page.members {
                    view.banned_until = Some(p.bans.banned_until(target, &view.member, now));
                }
            }
            page
        })?;
        Ok(page)
    }

    async fn shared_exit_members(
        &self,
        pool: &PoolId,
        filter: StateFilter,
        target: Option<&Target>,
        limit: usize,
        cursor: Cursor,
    ) -> Result<MemberPage, StoreError> {
        let (page, _) = self.with_pool(pool, |p, _| {
            let mut page = p.shared_exit_page(filter, limit, cursor);
            if let Some(target) = target {
                let now = self.clock.now();
                for view in &mut page.members {
                    view.banned_until = Some(p.bans.banned_until(target, &view.member, now));
                }
            }
            page
        })?;
        Ok(page)
    }

    async fn record_exits(&self, pool: &PoolId, exits: &[ExitSeen]) -> Result<u64, StoreError> {
        let answer = self.with_pool(pool, |p, _| {
            let now = Timestamp::now();
            let mut recorded = 0;
            for exit in exits {
                if p.eligible.get(&exit.member).is_none()
                    && p.ineligible.get(&exit.member).is_none()
                {
                    continue;
                }
                p.set_exit(&exit.member, exit.ip, now);
                if let Some(geo) = &exit.geo {
                    p.relabel(&exit.member, None, Some(geo));
                }
                p.mark_member(&exit.member);
                recorded += 1;
            }
            recorded
        })?;
        self.settle(answer, Change::Counts).await
    }

    async fn disable_members(
        &self,
        pool: &PoolId,
        members: &[MemberId],
        reason: &str,
    ) -> Result<DisableReport, StoreError> {
        let mut report = DisableReport::default();
        let end = self
            .in_chunks(pool, &self.chunks.disable, members, |p, chunk| {
                let now = self.clock.now();
                for member in chunk {
                    if p.take_out(member, reason, now) {
                        report.disabled.push(member.clone());
                    } else if p.cancel_return(member) {
                        // A cooling-down member is taken over by the operator.
                        p.taken_out.insert(member.clone(), (reason.to_owned(), now));
                        report.disabled.push(member.clone());
                    } else if p.ineligible.get(member).is_some() {
                        report.already_ineligible.push(member.clone());
                    } else {
                        report.unknown.push(member.clone());
                    }
                }
            })
            .await?;
        self.settle((report, end), Change::Durable).await
    }

    async fn enable_members(
        &self,
        pool: &PoolId,
        members: &[MemberId],
        restore: Option<RestorePolicy>,
    ) -> Result<EnableReport, StoreError> {
        let mut report: Option<EnableReport> = None;
        let end = self
            .in_chunks(pool, &self.chunks.enable, members, |p, chunk| {
                let report = report.get_or_insert_with(|| EnableReport {
                    restore: restore.unwrap_or(p.config.restore),
                    enabled: Vec::new(),
                    already_eligible: Vec::new(),
                    unknown: Vec::new(),
                });
                // Every member of one chunk is placed against the same minimum: the one
                // among members that were eligible before the chunk, as on Redis.
                let minimum = p.eligible.min();
                for member in chunk {
                    if let Some((kept, assignments)) = p.restore(member, report.restore, minimum) {
                        report.enabled.push(Restored {
                            member: member.clone(),
                            kept_assignments: kept,
                            assignments,
                        });
                    } else if p.eligible.get(member).is_some() {
                        report.already_eligible.push(member.clone());
                    } else {
                        report.unknown.push(member.clone());
                    }
                }
            })
            .await?;
        // There is always at least one chunk, which filled the report or failed above.
        let report = report.ok_or(StoreError::PoolNotFound)?;
        self.settle((report, end), Change::Durable).await
    }

    async fn remove_members(
        &self,
        pool: &PoolId,
        members: &[MemberId],
    ) -> Result<RemoveReport, StoreError> {
        let mut report = RemoveReport::default();
        let end = self
            .in_chunks(pool, &self.chunks.remove, members, |p, chunk| {
                // Leases are kept by id: the pool's are looked through only for a chunk
                // whose members hold some.
                if chunk.iter().any(|member| p.in_flight_of(member) > 0) {
                    let removed: std::collections::HashSet<&MemberId> = chunk.iter().collect();
                    let ended: Vec<LeaseId> = p
                        .leases
                        .iter()
                        .filter(|(_, (member, _))| removed.contains(member))
                        .map(|(id, _)| id.clone())
                        .collect();
                    for id in &ended {
                        p.end_lease(id);
                    }
                }
                for member in chunk {
                    if p.forget(member) {
                        report.removed.push(member.clone());
                    } else {
                        report.unknown.push(member.clone());
                    }
                }
            })
            .await?;
        self.settle((report, end), Change::Durable).await
    }

    async fn put_client(
        &self,
        id: &ClientId,
        config: &ClientConfig,
        token: TokenHash,
    ) -> Result<PutClient, StoreError> {
        let answer = {
            let mut inner = self.lock()?;
            let Inner {
                clients, journal, ..
            } = &mut *inner;
            let (put, record) = clients.put(id, config, token)?;
            (put, journal.as_mut().map(|journal| journal.client(record)))
        };
        self.settle(answer, Change::Durable).await
    }

    async fn rotate_client_token(&self, id: &ClientId, token: TokenHash) -> Result<(), StoreError> {
        let answer = {
            let mut inner = self.lock()?;
            let Inner {
                clients, journal, ..
            } = &mut *inner;
            let record = clients.rotate(id, token)?;
            ((), journal.as_mut().map(|journal| journal.client(record)))
        };
        self.settle(answer, Change::Durable).await
    }

    async fn client(&self, id: &ClientId) -> Result<ClientRecord, StoreError> {
        let inner = self.lock()?;
        inner
            .clients
            .get(id)
            .cloned()
            .ok_or(StoreError::ClientNotFound)
    }

    async fn clients(&self) -> Result<Vec<ClientRecord>, StoreError> {
        Ok(self.lock()?.clients.all().cloned().collect())
    }

    async fn delete_client(&self, id: &ClientId) -> Result<(), StoreError> {
        let answer = {
            let mut inner = self.lock()?;
            let Inner {
                clients, journal, ..
            } = &mut *inner;
            clients.delete(id)?;
            (
                (),
                journal.as_mut().map(|journal| journal.client_deleted(id)),
            )
        };
        self.settle(answer, Change::Durable).await
    }

    async fn client_by_token(&self, token: TokenHash) -> Result<Option<ClientRecord>, StoreError> {
        Ok(self.lock()?.clients.by_token(token).cloned())
    }

    async fn close(&self) {
        if let Some(disk) = &self.disk {
            disk.close(&self.inner);
        }
    }
}

impl Drop for EmbeddedStore {
    fn drop(&mut self) {
        // A store dropped without `close` (a test, a failed start) still writes what it
        // answered and lets go of its directory.
        if let Some(disk) = &self.disk {
            disk.close(&self.inner);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU64;

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::domain::{HealthConfig, OutcomeResult};

    /// A fresh directory, removed afterwards.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new() -> Self {
            let dir =
                std::env::temp_dir().join(format!("pa-embedded-{:016x}", rand::random::<u64>()));
            Self(dir)
        }

        fn options(&self, chunk: usize) -> DataDirOptions {
            DataDirOptions {
                timeout: Duration::from_secs(10),
                // Compactions only when a test asks for one.
                compact_min_log_bytes: u64::MAX,
                snapshot_chunk: chunk,
                ..DataDirOptions::new(self.0.clone())
            }
        }

        /// The state a store recovers from a copy of the directory as it is now.
        fn recovered_copy(&self) -> Vec<String> {
            let copy = TempDir::new();
            std::fs::create_dir_all(&copy.0).expect("a directory");
            for name in self.names().iter().filter(|name| *name != "LOCK") {
                std::fs::copy(self.0.join(name), copy.0.join(name)).expect("copied");
            }
            EmbeddedStore::open(copy.options(4096))
                .expect("the copy opens")
                .state_lines()
        }

        fn names(&self) -> Vec<String> {
            let mut names: Vec<String> = std::fs::read_dir(&self.0)
                .expect("listed")
                .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
                .collect();
            names.sort();
            names
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn pool(text: &str) -> PoolId {
        PoolId::parse(text).expect("a pool id")
    }

    fn member(i: u64) -> MemberId {
        MemberId::parse(&format!("http://p{i}.example.net:3128")).expect("a member id")
    }

    fn members(range: std::ops::Range<u64>) -> Vec<MemberId> {
        range.map(member).collect()
    }

    fn least_in_flight() -> PoolConfig {
        PoolConfig {
            policy: Policy::LeastInFlight,
            max_in_flight: NonZeroU64::new(50),
            health: HealthConfig {
                max_consecutive_failures: 2,
                cooldown_ms: 100,
                ..HealthConfig::default()
            },
            ..PoolConfig::default()
        }
    }

    /// One random operation of every kind the store has, on pools `a` (least-used) and
    /// `b` (least-in-flight), members `p0` to `p39`.
    async fn random_operation(store: &EmbeddedStore, rng: &mut StdRng, leases: &mut Vec<LeaseId>) {
        let (a, b) = (pool("a"), pool("b"));
        let some = |rng: &mut StdRng| {
            let first = rng.random_range(0..40);
            members(first..(first + rng.random_range(1..6)).min(40))
        };
        let target = if rng.random_bool(0.5) { &a } else { &b };
        let answer = match rng.random_range(0..100) {
            0..40 => store.assign(&a, &AssignRequest::default()).await.map(drop),
            40..55 => match store.assign(&b, &AssignRequest::default()).await {
                Ok(Assignment::Leased { lease, .. }) => {
                    leases.push(lease.id);
                    Ok(())
                }
                other => other.map(drop),
            },
            55..60 if !leases.is_empty() => {
                let lease = leases.swap_remove(rng.random_range(0..leases.len()));
                store.release(&b, &lease).await.or(Ok(()))
            }
            60..64 if !leases.is_empty() => {
                // Shorter and longer ttls, so that leases move both ways in expiry order.
                let lease = &leases[rng.random_range(0..leases.len())];
                let ttl = LeaseTtl::from_millis(rng.random_range(100..60_000)).ok();
                store.renew(&b, lease, ttl).await.map(drop).or(Ok(()))
            }
            64..72 => {
                let reports: Vec<Report> = some(rng)
                    .into_iter()
                    .map(|member| Report {
                        member,
                        result: [
                            OutcomeResult::Ok,
                            OutcomeResult::Failed,
                            OutcomeResult::Blocked,
                        ][rng.random_range(0..3)],
                        detail: "status 200".to_owned(),
                        latency_ms: rng.random_bool(0.5).then(|| rng.random_range(0..5000)),
                        target: None,
                    })
                    .collect();
                let source = if rng.random_bool(0.5) {
                    ReportSource::Worker
                } else {
                    ReportSource::Check
                };
                store.report(target, source, &reports).await.map(drop)
            }
            72..78 => store
                .disable_members(target, &some(rng), "timeouts")
                .await
                .map(drop),
            78..84 => {
                let restore = [
                    RestorePolicy::Minimum,
                    RestorePolicy::Zero,
                    RestorePolicy::History,
                ][rng.random_range(0..3)];
                store
                    .enable_members(target, &some(rng), Some(restore))
                    .await
                    .map(drop)
            }
            84..90 => {
                // Counts set lower and higher: members move back in the order too.
                let seed = Seed {
                    assignments: Some(rng.random_range(0..30)),
                    reset: rng.random_bool(0.5),
                    ..Seed::new(some(rng))
                };
                store.add_members(target, &seed).await.map(drop)
            }
            90..94 => store.remove_members(target, &some(rng)).await.map(drop),
            94..96 => store.sweep().await.map(drop),
            96..98 => store
                .claim_check_round(target, Duration::from_millis(50))
                .await
                .map(drop),
            _ => {
                // A whole pool goes and comes back.
                let config = if target == &a {
                    PoolConfig::default()
                } else {
                    least_in_flight()
                };
                if rng.random_bool(0.3) {
                    store.delete_pool(target).await.expect("deleted");
                    if target == &b {
                        leases.clear();
                    }
                }
                store.put_pool(target, &config).await.map(drop)
            }
        };
        answer.expect("the operation succeeds");
    }

    async fn seeded(store: &EmbeddedStore) {
        store
            .put_pool(&pool("a"), &PoolConfig::default())
            .await
            .expect("a");
        store
            .put_pool(&pool("b"), &least_in_flight())
            .await
            .expect("b");
        for p in ["a", "b"] {
            store
                .add_members(&pool(p), &Seed::new(members(0..40)))
                .await
                .expect("seeded");
        }
    }

    #[tokio::test]
    async fn the_sweep_clears_ended_sessions_of_a_pool_nobody_assigns_from() {
        let store = EmbeddedStore::new();
        store
            .put_pool(&pool("a"), &PoolConfig::default())
            .await
            .expect("a");
        let now = Timestamp::now();
        // 300 sessions that ended a moment ago and one that lives on, pinned as assigns
        // would have left them; with_pool puts the pool in the due index at the first end.
        store
            .with_pool(&pool("a"), |p, _| {
                for n in 0..300 {
                    let id = SessionId::parse("session", &format!("s{n}")).expect("id");
                    let ended = Timestamp(now.0 - 1);
                    p.sessions
                        .pin(&id, MemberId::from_stored("m".into()), ended);
                }
                let live = SessionId::parse("session", "live").expect("id");
                p.sessions.pin(
                    &live,
                    MemberId::from_stored("m".into()),
                    Timestamp(now.0 + 600_000),
                );
            })
            .expect("pinned");
        store.sweep().await.expect("swept");
        let inner = store.inner.lock().expect("lock");
        let p = inner.pools.get(&pool("a")).expect("the pool");
        assert_eq!(p.sessions.len(), 1);
        assert_eq!(
            inner.sweep_due.get(&pool("a")),
            Some(Timestamp(now.0 + 600_000))
        );
    }

    /// On a paused clock, which moves only while the store rests between chunks.
    #[tokio::test(start_paused = true)]
    async fn chunks_rest_only_while_another_call_is_in_flight() {
        let store = EmbeddedStore::new();
        store
            .put_pool(&pool("a"), &PoolConfig::default())
            .await
            .expect("a");
        let before = tokio::time::Instant::now();
        store
            .add_members(&pool("a"), &Seed::new(members(0..2_000)))
            .await
            .expect("seeded");
        // Several chunks, back to back: nobody waited on the store.
        let (idle, rested) = store.chunks.rests();
        assert!(idle > 1, "{idle} chunks");
        assert_eq!((rested, before.elapsed()), (0, Duration::ZERO));

        // Counted as `lock` counts a call: in flight from before it queues for the lock.
        let held = store.chunks.traffic.enter();
        store
            .add_members(&pool("a"), &Seed::new(members(2_000..4_000)))
            .await
            .expect("seeded");
        drop(held);
        let (all, rested) = store.chunks.rests();
        assert_eq!(rested, all - idle);
        assert!(before.elapsed() > Duration::ZERO);
    }

    /// A real call holding the lock as a chunk is about to take it (a call on another
    /// pool, on a thread of its own) makes that chunk rest; the chunks, which take the
    /// same lock, do not count themselves.
    #[tokio::test]
    async fn a_call_holding_the_lock_makes_the_chunk_waiting_for_it_rest() {
        let store = Arc::new(EmbeddedStore::new());
        for id in ["a", "other"] {
            store
                .put_pool(&pool(id), &PoolConfig::default())
                .await
                .expect("created");
        }
        let (locked, holding) = std::sync::mpsc::channel();
        let holder = {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let inner = store.lock().expect("the lock");
                assert!(inner.pools.contains_key(&pool("other")));
                locked.send(()).expect("the test waits");
                std::thread::sleep(Duration::from_millis(50));
            })
        };
        holding.recv().expect("the lock is held");
        store
            .add_members(&pool("a"), &Seed::new(members(0..10)))
            .await
            .expect("seeded");
        holder.join().expect("the holder ended");
        assert_eq!(store.chunks.rests(), (1, 1));
    }

    #[tokio::test]
    async fn a_reopened_store_holds_exactly_the_state_it_was_closed_with() {
        let dir = TempDir::new();
        let store = EmbeddedStore::open(dir.options(4096)).expect("opened");
        seeded(&store).await;
        let mut rng = StdRng::seed_from_u64(1);
        let mut leases = Vec::new();
        for _ in 0..2000 {
            random_operation(&store, &mut rng, &mut leases).await;
        }
        store.close().await;
        let before = store.state_lines();
        let pools_before = store.inner.lock().expect("lock").pools.len();
        drop(store);

        let reopened = EmbeddedStore::open(dir.options(4096)).expect("reopened");
        assert_eq!(reopened.state_lines(), before);
        assert_eq!(pools_before, 2);
        assert!(
            before.len() > 40,
            "the state is not trivial: {}",
            before.len()
        );
        // It goes on where it stopped: the next assign counts on from the recovered count.
        let next = reopened
            .assign(&pool("a"), &AssignRequest::default())
            .await
            .expect("assigned");
        assert!(matches!(
            next,
            Assignment::Assigned { .. } | Assignment::Empty { .. }
        ));
    }

    #[tokio::test]
    async fn snapshots_copied_between_operations_recover_the_exact_state() {
        let dir = TempDir::new();
        let store = EmbeddedStore::open(dir.options(2)).expect("opened");
        let disk = store.disk.as_ref().expect("on disk");
        seeded(&store).await;
        let mut rng = StdRng::seed_from_u64(2);
        let mut leases = Vec::new();
        for _ in 0..6 {
            // Two entries per turn of the lock, and operations between the turns: members
            // move, go and come back while the snapshot is half copied.
            let mut compaction = disk.begin_compaction(&store.inner);
            while !compaction.step(&store.inner, 2).expect("a chunk") {
                for _ in 0..rng.random_range(0..4) {
                    random_operation(&store, &mut rng, &mut leases).await;
                }
            }
            disk.finish_compaction(compaction);
            // Snapshot and log as they are right after the compaction recover the live
            // state (a later compaction would copy it again from memory).
            let end = store
                .lock()
                .expect("open")
                .journal
                .as_ref()
                .expect("a log")
                .end();
            disk.wait(end).await.expect("fsynced");
            assert_eq!(dir.recovered_copy(), store.state_lines());
            for _ in 0..50 {
                random_operation(&store, &mut rng, &mut leases).await;
            }
        }
        store.close().await;
        let before = store.state_lines();
        drop(store);
        // The last compaction replaced everything before it.
        assert_eq!(dir.names(), ["LOCK", "log.000007", "snapshot.000007"]);

        let reopened = EmbeddedStore::open(dir.options(2)).expect("reopened");
        assert_eq!(reopened.state_lines(), before);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_compactor_thread_compacts_while_operations_go_on() {
        let dir = TempDir::new();
        let store = Arc::new(EmbeddedStore::open(dir.options(2)).expect("opened"));
        seeded(&store).await;
        let compactions = {
            let store = Arc::clone(&store);
            tokio::task::spawn_blocking(move || {
                (0..3)
                    .filter_map(|_| {
                        let disk = store.disk.as_ref().expect("on disk");
                        disk.compact_now(&store.inner)
                    })
                    .count()
            })
        };
        let mut rng = StdRng::seed_from_u64(3);
        let mut leases = Vec::new();
        while !compactions.is_finished() {
            random_operation(&store, &mut rng, &mut leases).await;
        }
        assert_eq!(compactions.await.expect("joined"), 3);
        store.close().await;
        let before = store.state_lines();
        drop(store);
        assert_eq!(dir.names(), ["LOCK", "log.000004", "snapshot.000004"]);
        let reopened = EmbeddedStore::open(dir.options(2)).expect("reopened");
        assert_eq!(reopened.state_lines(), before);
    }

    /// A directory after one compaction, closed: `snapshot.000002` and `log.000002`.
    async fn compacted_once() -> TempDir {
        let dir = TempDir::new();
        let store = EmbeddedStore::open(dir.options(4096)).expect("opened");
        seeded(&store).await;
        let disk = store.disk.as_ref().expect("on disk");
        assert!(disk.compact_now(&store.inner).is_some(), "a compaction ran");
        store.close().await;
        drop(store);
        assert_eq!(dir.names(), ["LOCK", "log.000002", "snapshot.000002"]);
        dir
    }

    fn refusal_of(dir: &TempDir) -> (PathBuf, u64, String) {
        match EmbeddedStore::open(dir.options(4096)) {
            Err(OpenError::Corrupt {
                path,
                offset,
                reason,
            }) => (path, offset, reason),
            Err(other) => panic!("a refusal naming the missing file expected, got {other:?}"),
            Ok(_) => panic!("a refusal naming the missing file expected, the store opened"),
        }
    }

    #[tokio::test]
    async fn a_snapshot_without_its_log_refuses_to_open_naming_the_missing_log() {
        let dir = compacted_once().await;
        std::fs::remove_file(dir.0.join("log.000002")).expect("removed");
        let (path, offset, reason) = refusal_of(&dir);
        assert_eq!(path, dir.0.join("log.000002"));
        assert_eq!(offset, 0);
        assert_eq!(
            reason,
            "this file is missing: the files of the data directory do not follow each other"
        );
        // The files are left as they were for the operator to look at.
        assert_eq!(dir.names(), ["LOCK", "snapshot.000002"]);
    }

    #[tokio::test]
    async fn a_log_without_the_snapshot_before_it_refuses_to_open_naming_the_first_missing_file() {
        let dir = compacted_once().await;
        std::fs::remove_file(dir.0.join("snapshot.000002")).expect("removed");
        let (path, _, reason) = refusal_of(&dir);
        // Without the snapshot the logs would have to start at the first generation.
        assert_eq!(path, dir.0.join("log.000001"));
        assert!(reason.starts_with("this file is missing"), "{reason}");
        assert_eq!(dir.names(), ["LOCK", "log.000002"]);
    }

    #[tokio::test]
    async fn a_second_store_on_one_directory_is_refused_until_the_first_closes() {
        let dir = TempDir::new();
        let first = EmbeddedStore::open(dir.options(4096)).expect("opened");
        match EmbeddedStore::open(dir.options(4096)) {
            Err(OpenError::Locked {
                dir: locked,
                holder,
            }) => {
                assert_eq!(locked, dir.0);
                assert_eq!(holder, Some(std::process::id().to_string()));
            }
            other => panic!("refused expected, got {other:?}"),
        }
        drop(first);
        EmbeddedStore::open(dir.options(4096)).expect("opened once the first is gone");
    }

    #[tokio::test]
    async fn a_pool_keeps_the_urls_of_its_last_256_source_ids_and_of_its_configured_ones() {
        let store = EmbeddedStore::new();
        let id = pool("p");
        store
            .put_pool(&id, &PoolConfig::default())
            .await
            .expect("created");
        let kept = "http://a.example/p".to_owned();
        for i in 0..300 {
            let urls = [kept.clone(), format!("http://lists.example/{i}")];
            store
                .claim_sources(&id, &urls, Duration::from_secs(60))
                .await
                .expect("claimed");
        }
        let inner = store.inner.lock().expect("not poisoned");
        let book = &inner.pools[&id].book;
        assert_eq!(book.urls.len(), 257);
        assert_eq!(book.urls.get(&1), Some(&kept));
        assert_eq!(book.successes.keys().copied().collect::<Vec<_>>(), [1, 301]);
    }

    #[tokio::test]
    async fn a_closed_store_refuses_operations() {
        let dir = TempDir::new();
        let store = EmbeddedStore::open(dir.options(4096)).expect("opened");
        store
            .put_pool(&pool("a"), &PoolConfig::default())
            .await
            .expect("created");
        store.close().await;
        assert!(matches!(
            store.assign(&pool("a"), &AssignRequest::default()).await,
            Err(StoreError::Unavailable(_))
        ));
    }
}
