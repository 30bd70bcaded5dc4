//! The `Store` trait: the only seam between the HTTP layer and the pools' state.
//!
//! Two implementations pass the same behavioural suite (`tests/api`): [`RedisStore`], which
//! keeps every pool in Redis and does each operation in one Lua script, and
//! [`EmbeddedStore`], which keeps them in this process for a single replica. Handlers never
//! build keys or speak to Redis; they call these methods with already-parsed values.
//!
//! # Semantics both stores share
//! - A pool's eligible members are ordered by `(assignments, member bytes)`. Assign takes the
//!   first one and adds one to its count in the same atomic step, so two concurrent assigns
//!   can never both see the same minimum. Equal counts go to the member that sorts first
//!   byte-wise, which is Redis's own order for equal scores.
//! - The count is a count of assignments. Nothing here lowers it when a request fails.
//! - Ineligible members keep their count, the reason and the time they were taken out.
//!
//! # Leases (least-in-flight pools)
//! - Assign takes the eligible member with the fewest live leases, then the fewest
//!   assignments, then the lowest member bytes, skipping members at the pool's
//!   `max_in_flight`; it records a lease and counts one assignment, in one atomic step.
//! - A lease ends exactly once: released by its worker, reclaimed once it has expired
//!   (counted as `abandoned`), or dropped with its member or pool. Every ending is a step
//!   that first checks the lease still exists, so a retried release, two replicas' sweeps
//!   and an assign reclaiming at the same time can never decrement a member twice.
//! - An expired lease cannot be released or renewed; it counts as live until reclaimed.
//! - Time is the store's own clock: Redis `TIME` inside the scripts, the process clock in
//!   the embedded store. Callers never pass a time.
//! - A member keeps its live leases while it is taken out, and comes back with them.
//!
//! # Health
//! - Outcome reports ([`Store::report`]) move members between eligible and cooling down;
//!   they never change a count. The configuration is [`HealthConfig`](crate::domain::HealthConfig);
//!   the cooldown of a trip, the length of a ban and the count a member comes back at are
//!   [`crate::rules::health`], with their Lua twins beside them, the jitter drawn by the
//!   store for each call.
//! - A member is cooling down while its return is scheduled. Returns happen inside the
//!   stores' atomic steps (an assign returns a few due members of its own pool first; the
//!   background sweep returns the rest), each removing the schedule entry it acts on, so
//!   with several replicas every return happens once. A return applies the pool's restore
//!   policy, exactly as an enable does.
//! - A member taken out by an operator is never returned automatically; disabling a
//!   cooling-down member cancels its return, and enabling one brings it back at once.

mod chunks;
mod clients;
mod embedded;
mod redis;
#[cfg(test)]
mod twins;

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

pub use self::chunks::{CHUNK_BUDGET, CHUNK_GRANULE, LARGE_WORK_SHARE, MAX_CHUNK, MIN_CHUNK};
pub use self::clients::{ClientRecord, PutClient};
pub use self::embedded::{DataDirOptions, EmbeddedStore, OpenError};
pub use self::redis::{RedisStore, RedisStoreOptions, RedisTopology};
use crate::domain::{
    AssignCount, ClientConfig, ClientId, ClientRate, Exclude, LabelFilter, Labels, LeaseId,
    LeaseTtl, MemberId, OutcomeResult, PoolConfig, PoolId, RestorePolicy, SessionId, SessionTtl,
    Target, Timestamp, TokenHash,
};
pub use crate::rules::quality::Quality;

/// How many expired leases an assign reclaims before it chooses, at most. It keeps the
/// assign step short; the background sweep takes care of larger backlogs.
pub const RECLAIM_ON_ASSIGN: u64 = 16;

/// How many members whose cooldown has ended an assign returns before it chooses, at most.
/// It keeps the assign step short; the background sweep returns the rest.
pub const RETURN_ON_ASSIGN: u64 = 16;

/// Most pools one call of [`Store::sweep`] sweeps; pools due beyond that wait for the next
/// call, earliest first.
pub const SWEEP_POOLS_PER_CALL: usize = 4_096;

/// Registered pools one turn of the Redis store's safety net looks at (see the key layout
/// in `store/redis/keys.rs`): a walk of the registry at this pace, shared by the replicas
/// (one turn per sweep interval, whatever their number), repairs what a replica that died
/// between a script and its index update left behind. Each costs two scripts, so the
/// walk costs the same few commands whatever the number of pools and of replicas.
pub const SAFETY_NET_POOLS_PER_SWEEP: usize = 4;

/// How long a pool handed out by [`Store::due_check_pools`] is withheld from other
/// replicas: the time a replica has to claim its round, and the longest a replica that
/// died in between delays the pool's checks.
pub const CHECK_CLAIM_HOLD: Duration = Duration::from_secs(60);

/// How long a pool handed out by [`Store::due_source_pools`] is withheld from other
/// replicas: the time a replica has to claim its sources.
pub const SOURCE_CLAIM_HOLD: Duration = Duration::from_secs(60);

/// Most members one check round probes: a pool larger than this has the rest probed in
/// later rounds as members change places.
pub const MAX_PROBES_PER_ROUND: u64 = 10_000;

/// Most candidates an assign with a label filter over several keys checks before it gives
/// up with [`StoreError::FilterTooCostly`]: it walks the members carrying the key with the
/// fewest of them, least-used first, and stops at the first that carries the others too,
/// so the members it checks are the ones it skips. This bound keeps that walk short.
/// A filter on one key (with one value or several) reads one entry per value and is never
/// refused.
pub const MAX_LABEL_CHECKS: u64 = 2_000;

/// Most targets one pool keeps bans for at once. A ban for a further target is not
/// recorded (its report answers `ignored`) until the bans of some target are forgotten;
/// each target's bans are at most one per member. Together they bound a pool's ban memory
/// by what is live: a target's bans are forgotten, with no sweep, once its last ban ended
/// as long ago as it lasted.
pub const MAX_BAN_TARGETS: u64 = 100_000;

/// Most expired targets one ban report clears from a pool's index of targets: ending each
/// costs a step, and since every ban adds at most one target, clearing a few on each keeps
/// the index as small as what is live without ever reading all of it.
pub const BAN_CLEANUP: u64 = 16;

/// Most label-index entries one page of a listing with a label filter reads. A page may
/// then hold fewer members than asked for while a next cursor is given.
pub const MAX_LISTING_SCAN: u64 = 2_000;

/// Most client rate limit buckets one pool keeps (one per client that has assigned from
/// it with a rate; see [`AssignRequest::rate`]). A bucket that has refilled is as good as
/// none: the embedded store drops those first when a new one needs room, then the one idle
/// longest; the Redis store, which cannot find them without reading every one, lets the
/// pool's buckets start over full. Either way a client gains at most one burst.
pub const MAX_BUCKETS: usize = 10_000;

/// What an assign asks for beyond the pool's own rule.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AssignRequest {
    /// On least-in-flight pools, the lease ttl (the pool's `lease_ttl_ms` when `None`).
    pub ttl: Option<LeaseTtl>,
    /// Only members whose labels pass this filter are candidates.
    pub labels: LabelFilter,
    /// The host the worker will contact: members banned for it are skipped (at most
    /// [`MAX_LABEL_CHECKS`] of them; see [`Store::assign`]).
    pub target: Option<Target>,
    /// Members this one assign must not hand out, as if they were ineligible for it; they
    /// bring no `Retry-After` (nothing makes them eligible by itself).
    pub exclude: Exclude,
    /// The rate limit of the client whose token the request carries, when it has one: the
    /// assign first takes a token per member asked for (`count`, else one) from the
    /// client's bucket in this pool, in the same atomic step as the pick, or fails with
    /// [`StoreError::ClientRateLimited`]. `None` (the worker token) costs nothing.
    pub rate: Option<ClientLimit>,
}

/// A client's rate limit as an assign carries it ([`AssignRequest::rate`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientLimit {
    /// Whose bucket: one per client and pool.
    pub client: ClientId,
    /// Its rate and burst.
    pub rate: ClientRate,
}

/// The sticky session an assign names (see [`Store::assign_in_session`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRequest {
    /// The caller's id for the session.
    pub id: SessionId,
    /// How long the session lives after this assign (the pool's `session_ttl_ms` when
    /// `None`).
    pub ttl: Option<SessionTtl>,
}

/// A session as an assign left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SessionPin {
    /// The session's id.
    pub id: SessionId,
    /// When it ends unless another assign names it (the store's clock).
    pub expires_at: Timestamp,
    /// Whether this assign moved the session to another member: its member was no longer
    /// eligible for the request. `false` when the session was new (or had expired).
    pub repinned: bool,
}

/// The answer to an assign in a session ([`Store::assign_in_session`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionAssignment {
    /// What the assign handed out; [`Assignment::Empty`] when nothing was eligible.
    pub assignment: Assignment,
    /// The session after the assign; `None` when nothing was handed out and no session
    /// was live (a new session starts only with a member to pin).
    pub session: Option<SessionPin>,
}

/// What went wrong in a store. Each variant maps to one documented HTTP answer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The pool does not exist.
    #[error("pool not found")]
    PoolNotFound,
    /// The pool has no such live lease: never issued, already released, expired, or gone
    /// with its member.
    #[error("lease not found")]
    LeaseNotFound,
    /// An assign's label filter over several keys would check more than
    /// [`MAX_LABEL_CHECKS`] candidates before finding one.
    #[error("the label filter would check more than {MAX_LABEL_CHECKS} members")]
    FilterTooCostly,
    /// The pool has no such live session: never started, ended, or expired.
    #[error("session not found")]
    SessionNotFound,
    /// The pool holds [`MAX_SESSIONS`](crate::domain::MAX_SESSIONS) live sessions: a new one
    /// is not started; nothing changed.
    #[error("the pool holds the most live sessions it keeps")]
    TooManySessions,
    /// A pool's policy can only change while it has no members.
    #[error("the policy of a pool can only change while it has no members")]
    PolicyChangeRequiresEmptyPool,
    /// The client does not exist.
    #[error("client not found")]
    ClientNotFound,
    /// The store keeps [`MAX_CLIENTS`](crate::domain::MAX_CLIENTS) clients: a new one is
    /// not created; nothing changed.
    #[error("the store keeps the most clients it may")]
    TooManyClients,
    /// The request's client has fewer tokens left in its bucket for this pool than the
    /// assign needs (see [`AssignRequest::rate`]): nothing changed, not even a `done` it
    /// carried. Enough tokens are back after the duration.
    #[error("the client is over its rate limit for {0:?}")]
    ClientRateLimited(Duration),
    /// The store did not answer within its configured timeout.
    #[error("the store did not answer within {0:?}")]
    Timeout(Duration),
    /// The store could not be reached or failed to run the operation.
    #[error("the store is unavailable: {0}")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// The answer to an assign.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Assignment {
    /// `member` was chosen; `assignments` is its count after this assignment.
    Assigned {
        /// The chosen member.
        member: MemberId,
        /// Its count including this assignment.
        assignments: u64,
    },
    /// On a least-in-flight pool: `member` was chosen and leased.
    Leased {
        /// The chosen member.
        member: MemberId,
        /// Its cumulative count including this assignment.
        assignments: u64,
        /// Its live leases including this one.
        in_flight: u64,
        /// The new lease.
        lease: Lease,
    },
    /// The pool exists but has no eligible member (or, on a least-in-flight pool, every
    /// eligible member is at `max_in_flight`).
    Empty {
        /// When no member is eligible and some are cooling down: how long until the first
        /// of them comes back.
        next_return: Option<Duration>,
    },
}

/// The answer to an assign of several members ([`Store::assign_several`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// The members handed out, in pick order, each an [`Assignment::Assigned`] or an
    /// [`Assignment::Leased`]; empty when none fits.
    pub assigned: Vec<Assignment>,
    /// When `assigned` is empty, no label filter was given and some members are cooling
    /// down: how long until the first of them comes back.
    pub next_return: Option<Duration>,
}

/// How a worker's previous use of a pool ended, sent with its next assign so that one call
/// does both ([`Store::assign_after_done`], in a session
/// [`Store::assign_in_session_after_done`]): an outcome report, a lease to release, or both.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Done {
    /// The outcome of the request, applied as [`Store::report`] applies a worker's report.
    pub report: Option<DoneReport>,
    /// On a least-in-flight pool: the lease of that request, released.
    pub lease: Option<LeaseId>,
}

/// The outcome a [`Done`] carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoneReport {
    /// The member it is about; `None` for the member of [`Done::lease`].
    pub member: Option<MemberId>,
    /// What was seen.
    pub result: OutcomeResult,
    /// The host the request went to, as in [`Report::target`].
    pub target: Option<Target>,
    /// How long the request took, in milliseconds, as in [`Report::latency_ms`].
    pub latency_ms: Option<u64>,
}

/// What a [`Done`] did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DoneSummary {
    /// What the report did, when there was one about a member the pool has.
    pub applied: Option<Applied>,
    /// The report named a member the pool does not have (or a lease without one); it
    /// changed nothing.
    pub unknown: bool,
    /// The lease was live and is now released. `false` for an unknown, ended or expired
    /// lease, which changes nothing (an expired one is left to be reclaimed).
    pub released: bool,
}

/// A live lease as its holder sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Lease {
    /// The lease's id, the holder's proof.
    pub id: LeaseId,
    /// When it expires unless renewed.
    pub expires_at: Timestamp,
    /// The ttl it was given.
    pub ttl_ms: LeaseTtl,
}

/// The answer to a renewal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Renewed {
    /// The leased member.
    pub member: MemberId,
    /// The lease with its new expiry.
    pub lease: Lease,
}

/// A pool's configuration together with its current numbers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PoolInfo {
    /// The pool.
    pub pool: PoolId,
    /// Its configuration, defaults filled in.
    pub config: PoolConfig,
    /// When it was created.
    pub created_at: Timestamp,
    /// Its numbers.
    pub stats: PoolStats,
}

/// The numbers an operator watches for one pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PoolStats {
    /// Members that assign may choose.
    pub eligible: u64,
    /// Members taken out (by an operator or by health), keeping their counts.
    pub ineligible: u64,
    /// The lowest count among eligible members (`null` when none is eligible).
    pub min_assignments: Option<u64>,
    /// The highest count among eligible members (`null` when none is eligible).
    pub max_assignments: Option<u64>,
    /// Assignments handed out by this pool since it was created. Starting counts given when
    /// seeding are not assignments and are not included.
    pub total_assignments: u64,
    /// Live leases: handed out, not yet released nor reclaimed (0 on least-used pools).
    pub in_flight: u64,
    /// Leases that expired without being released and were reclaimed.
    pub abandoned: u64,
    /// Times a member was taken out (or kept out longer) by its health.
    pub tripped: u64,
    /// Times a cooling-down member came back by itself (end of cooldown or a passing
    /// check); operator enables are not counted.
    pub recovered: u64,
    /// Members the pool removed by itself under its `prune` rules.
    pub pruned: u64,
    /// Exit addresses that two members or more share (as `exit_ip` checks saw them).
    pub shared_exit_ips: u64,
    /// Members whose operator label `country` differs from the `geo_country` the GeoIP
    /// file gives them.
    pub country_mismatches: u64,
}

/// One page of a pool listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolPage {
    /// Pools ordered by id.
    pub pools: Vec<PoolInfo>,
    /// The last pool of this page when more follow: the next page starts after it.
    pub next: Option<PoolId>,
}

/// Whether a pool was created or an existing one updated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutPool {
    /// The pool did not exist before.
    Created,
    /// The pool existed; its configuration was replaced.
    Updated,
}

/// A seeding request, members already parsed, checked against the pool's rules and
/// de-duplicated.
///
/// The pool's `rules.max_members` is applied by the store, in the same atomic step as the
/// writes: members already in the pool are never refused, and new members are refused as
/// [`SeedReport::full`], in request order, once the pool (eligible and ineligible members
/// together) holds `max_members`. A pool already above its bound keeps every member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seed {
    /// The members to add, in request order.
    pub members: Vec<MemberId>,
    /// An explicit starting count for new members; overrides the pool's `start_assignments`.
    pub assignments: Option<u64>,
    /// Whether members already in the pool are set to the starting count too.
    pub reset: bool,
    /// Report what would happen, and write nothing.
    pub dry_run: bool,
    /// In a dry run split into several calls: new members the earlier calls reported as
    /// added. They count against `max_members` as if they had been written.
    pub pending_adds: u64,
    /// Labels for members of this call: each one named here (new or existing, eligible or
    /// not) has its labels replaced by these, keeping its count and state. Members not
    /// named keep theirs (new ones have none).
    pub labels: std::collections::HashMap<MemberId, Labels>,
    /// Labels from the GeoIP file for members of this call whose own address is in it
    /// (keys `geo_...`): each one named here has its labels from the file replaced by
    /// these, unless a check recorded its exit address (whose labels win). Its operator
    /// labels stay.
    pub geo: std::collections::HashMap<MemberId, Labels>,
    /// Where the new members come from.
    pub origin: SeedOrigin,
}

impl Seed {
    /// Adds `members`, with the pool's starting count and nothing else asked for.
    pub fn new(members: Vec<MemberId>) -> Self {
        Self {
            members,
            assignments: None,
            reset: false,
            dry_run: false,
            pending_adds: 0,
            labels: std::collections::HashMap::new(),
            geo: std::collections::HashMap::new(),
            origin: SeedOrigin::Manual,
        }
    }
}

/// What a seeding did.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct SeedReport {
    /// Members that were not in the pool and now are eligible.
    pub added: Vec<MemberId>,
    /// Members that were already in the pool (eligible or not).
    pub existing: Vec<MemberId>,
    /// New members refused because the pool holds `max_members`.
    pub full: Vec<MemberId>,
    /// The count new members started at (and existing ones were reset to, with `reset`).
    pub start_assignments: u64,
}

/// Whether a member may currently be assigned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MemberState {
    /// Assign may choose it.
    Eligible,
    /// Taken out; it keeps its count.
    Ineligible,
}

/// Which members a listing shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StateFilter {
    /// Only eligible members.
    Eligible,
    /// Only ineligible members.
    Ineligible,
    /// Both.
    #[default]
    All,
}

/// A position in a member listing: how many eligible and how many ineligible members were
/// already returned. It is a position, not a snapshot: members whose counts change while
/// an operator pages may move across pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cursor {
    /// Eligible members already listed.
    pub eligible: u64,
    /// Ineligible members already listed.
    pub ineligible: u64,
}

/// One page of a member listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberPage {
    /// Members ordered by assignments, then by id.
    pub members: Vec<MemberView>,
    /// Where the next page starts, when there is one.
    pub next: Option<Cursor>,
}

/// Where a member came from: how it was first added.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Origin {
    /// Added by hand (`POST /pools/{pool}/members`), or before origins were kept. Never
    /// pruned unless the pool's `prune.manual` is set.
    #[default]
    Manual,
    /// Added by `POST /pools/{pool}/import`.
    Import,
    /// Added by a fetch of the pool's source with this URL.
    Source(String),
}

impl Serialize for Origin {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(match self {
            Self::Manual => "manual",
            Self::Import => "import",
            Self::Source(url) => url,
        })
    }
}

/// Where the members of one seeding come from. Members already in the pool keep their
/// origin; those already from the same source are marked seen by this fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SeedOrigin {
    /// `POST /pools/{pool}/members`.
    #[default]
    Manual,
    /// `POST /pools/{pool}/import`.
    Import,
    /// A fetch of a source: the source's id (see [`ClaimedSource::id`]) and the fetch's
    /// number (its successful fetches so far, this one included).
    Source {
        /// The source's id in its pool.
        id: u64,
        /// This fetch's number.
        fetch: u64,
    },
}

/// Most members one call of [`Store::prune`] moves or removes of each kind; the caller
/// calls again while [`Pruned::more`] says so.
pub const PRUNE_BATCH: u64 = 256;

/// What one call of [`Store::prune`] did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Pruned {
    /// Members removed.
    pub removed: Vec<MemberId>,
    /// Whether a batch was full: another call may do more.
    pub more: bool,
}

/// One member as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemberView {
    /// The member.
    pub member: MemberId,
    /// Where it came from: `manual`, `import` or the URL of the source that added it.
    pub origin: Origin,
    /// Whether it is eligible.
    pub state: MemberState,
    /// Its count.
    pub assignments: u64,
    /// Its live leases (0 on least-used pools).
    pub in_flight: u64,
    /// Why it was taken out (ineligible members only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When it was taken out (ineligible members only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<Timestamp>,
    /// Failures reported in a row since its last success (or its last return).
    pub consecutive_failures: u64,
    /// How long its last cooldown was, in milliseconds, while the backoff is in effect
    /// (until a success). Not the time left: that is [`MemberView::returns_at`], which only
    /// a member cooling down has.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_cooldown_ms: Option<u64>,
    /// When it comes back by itself (members cooling down only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub returns_at: Option<Timestamp>,
    /// The result of the last active check, when the pool has checks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_check: Option<LastCheck>,
    /// The exit address the last `exit_ip` check that read one saw.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_ip: Option<std::net::IpAddr>,
    /// When that check ended (the store's clock).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_ip_at: Option<Timestamp>,
    /// The labels its operator gave it (left out when it has none).
    #[serde(skip_serializing_if = "Labels::is_empty")]
    pub labels: Labels,
    /// The labels the GeoIP file gives its exit address, or its own address before a
    /// check saw one (`geo_country`, `geo_asn`, `geo_org`; left out when none).
    #[serde(skip_serializing_if = "Labels::is_empty")]
    pub geo_labels: Labels,
    /// Its label `country` differs from its `geo_country` (left out when not).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub country_mismatch: bool,
    /// For a listing that names a target: until when the member is banned for it (`null`
    /// when it is not). Left out of listings without a target.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub banned_until: Option<Option<Timestamp>>,
    /// Its decaying success rate and latency, shown as `outcomes`, `success_rate` and
    /// `latency_ms_ewma` (see [`crate::rules::quality`]).
    #[serde(flatten, serialize_with = "serialize_quality")]
    pub quality: Quality,
}

/// A member's [`Quality`] as a listing shows it: `outcomes` (how many were counted),
/// `success_rate` (0 to 1, `null` before any outcome) and `latency_ms_ewma` (milliseconds,
/// `null` before any outcome with a latency), both with the store's precision (millionths
/// and microseconds).
fn serialize_quality<S: serde::Serializer>(q: &Quality, serializer: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeStruct;
    let mut out = serializer.serialize_struct("Quality", 3)?;
    out.serialize_field("outcomes", &q.outcomes)?;
    out.serialize_field(
        "success_rate",
        &(q.outcomes > 0).then(|| q.success_ppm as f64 / crate::rules::quality::SUCCESS_ONE as f64),
    )?;
    out.serialize_field(
        "latency_ms_ewma",
        &(q.latencies > 0).then(|| q.latency_us as f64 / 1000.0),
    )?;
    out.end()
}

impl MemberView {
    /// Sets its labels from those a store keeps (the operator's and the GeoIP file's
    /// together), shown apart.
    pub fn set_labels(&mut self, all: Labels) {
        self.country_mismatch = all.country_mismatch();
        (self.labels, self.geo_labels) = all.split_geo();
    }

    /// The value of the label `key`, the operator's or the GeoIP file's.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).or_else(|| self.geo_labels.get(key))
    }
}

/// An exit address an `exit_ip` check saw, to record ([`Store::record_exits`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitSeen {
    /// The member probed.
    pub member: MemberId,
    /// The address the target saw.
    pub ip: std::net::IpAddr,
    /// With a GeoIP file: the labels it gives that address (none when it does not list
    /// it), replacing the member's labels from the file. `None` without a file: they stay.
    pub geo: Option<Labels>,
}

/// A member's health numbers as a store keeps them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Health {
    /// Failures in a row.
    pub streak: u64,
    /// Trips in a row without a success; the next cooldown grows with it.
    pub trips: u64,
    /// The cooldown of the last trip, in milliseconds.
    pub cooldown_ms: u64,
}

/// The last active check of a member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LastCheck {
    /// When it ended (the store's clock).
    pub at: Timestamp,
    /// What it concluded.
    pub result: OutcomeResult,
    /// What the probe saw (`status 200`, `timeout`, `connection refused`).
    pub detail: String,
    /// How long the probe took, in milliseconds, when it got an answer (none for a refused
    /// connection or a timeout).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<u64>,
}

/// Who reports an outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportSource {
    /// A worker, about a request it made through the member. Ignored for members that are
    /// not eligible: the request may have started before the member was taken out.
    Worker,
    /// The service's own active check. Also applies to members cooling down: a pass brings
    /// one back at once, a failure keeps it out for another, longer cooldown.
    Check,
}

impl ReportSource {
    /// The name used in the Redis scripts and in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Worker => "worker",
            Self::Check => "check",
        }
    }
}

/// One outcome about one member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The member.
    pub member: MemberId,
    /// What was seen.
    pub result: OutcomeResult,
    /// For checks: what the probe saw, shown as the member's last check. Visible ASCII and
    /// spaces only.
    pub detail: String,
    /// How long the request took, in milliseconds (at most
    /// [`crate::rules::quality::MAX_LATENCY_MS`]): for checks that got an answer, the
    /// probe's time, shown with the last check; for workers and the gateway, counted in
    /// the member's decaying latency.
    pub latency_ms: Option<u64>,
    /// The host the request went to. A `blocked` report with a target bans the member for
    /// that target only and leaves its failure streak alone; other results ignore it.
    pub target: Option<Target>,
}

/// What one report did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// The member's streak was updated (or cleared); it stays eligible.
    Counted,
    /// The member was taken out to cool down (or, by a check, kept out longer).
    Tripped,
    /// The member is not eligible; the report changed nothing.
    Ignored,
    /// A passing check brought a cooling-down member back.
    Returned,
    /// A `blocked` report with a target banned the member for that target (or, banned
    /// already, for longer).
    Banned,
}

/// What one report about a known member did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// The member.
    pub member: MemberId,
    /// Its result.
    pub result: OutcomeResult,
    /// What it did.
    pub effect: Effect,
    /// The member's failure streak afterwards.
    pub streak: u64,
    /// For [`Effect::Banned`]: until when the member is banned for the report's target.
    pub banned_until: Option<Timestamp>,
}

/// What a report call did, in request order; unknown members are listed apart.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReportSummary {
    /// Each report about a known member, in order.
    pub applied: Vec<Applied>,
    /// Members the pool does not have (each listed once per report).
    pub unknown: Vec<MemberId>,
}

/// What one background sweep did across all pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Swept {
    /// Expired leases reclaimed.
    pub reclaimed: u64,
    /// Members returned at the end of their cooldown.
    pub returned: u64,
}

impl std::ops::Add for Swept {
    type Output = Self;

    fn add(self, other: Self) -> Self {
        Self {
            reclaimed: self.reclaimed + other.reclaimed,
            returned: self.returned + other.returned,
        }
    }
}

/// The members one check round probes, when the round is this replica's.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CheckRound {
    /// Eligible members.
    pub eligible: Vec<MemberId>,
    /// Members cooling down, soonest return first.
    pub cooling: Vec<MemberId>,
}

/// The counts of one import, as a source's last fetch shows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ImportCounts {
    /// Distinct candidates that passed the rules: `added` + `existing`.
    pub accepted: u64,
    /// Accepted candidates that were not in the pool and now are.
    pub added: u64,
    /// Accepted candidates already in the pool.
    pub existing: u64,
    /// Lines that repeated a candidate seen earlier in the same list.
    pub duplicates: u64,
    /// Rejected lines, every reason together.
    pub rejected: u64,
}

/// What one fetch of a source came to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum FetchOutcome {
    /// The list was fetched and imported.
    Ok {
        /// What the import did.
        counts: ImportCounts,
    },
    /// The fetch (or the import of what it fetched) failed.
    Failed {
        /// Why, in a short text without credentials.
        error: String,
    },
}

/// One fetch of a source, as its listing shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SourceFetch {
    /// When it ended (the store's clock).
    pub at: Timestamp,
    /// What it came to.
    #[serde(flatten)]
    pub outcome: FetchOutcome,
}

/// What the store keeps about one source of a pool, by its URL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SourceState {
    /// When it is next fetched (or, while a replica fetches it, when that claim ends).
    pub next_fetch_at: Timestamp,
    /// Failed fetches since the last successful one.
    pub failures: u64,
    /// Successful fetches so far.
    pub successes: u64,
    /// Its last fetch, once there has been one.
    pub last_fetch: Option<SourceFetch>,
}

/// A source claimed by this replica, to be fetched now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimedSource {
    /// Its URL.
    pub url: String,
    /// Failed fetches since its last successful one, for the backoff.
    pub failures: u64,
    /// Its successful fetches so far.
    pub successes: u64,
    /// Its id in the pool, given when it was first claimed and never reused: the members
    /// it adds are marked with it (see [`SeedOrigin::Source`]).
    pub id: u64,
}

/// What a disable did, member by member.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct DisableReport {
    /// Members moved out of the eligible set now.
    pub disabled: Vec<MemberId>,
    /// Members that were already ineligible (their reason and time are left as they were).
    pub already_ineligible: Vec<MemberId>,
    /// Members the pool does not have.
    pub unknown: Vec<MemberId>,
}

/// A member returned to the eligible set and the count it restarts at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Restored {
    /// The member.
    pub member: MemberId,
    /// The count it kept while it was away.
    pub kept_assignments: u64,
    /// The count it restarts at.
    pub assignments: u64,
}

/// What an enable did, member by member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EnableReport {
    /// The policy that was applied.
    pub restore: RestorePolicy,
    /// Members returned to the eligible set.
    pub enabled: Vec<Restored>,
    /// Members that were already eligible (left untouched).
    pub already_eligible: Vec<MemberId>,
    /// Members the pool does not have.
    pub unknown: Vec<MemberId>,
}

/// What a removal did.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct RemoveReport {
    /// Members forgotten, history included.
    pub removed: Vec<MemberId>,
    /// Members the pool does not have.
    pub unknown: Vec<MemberId>,
}

/// What the store reports about itself to the readiness probe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StoreStatus {
    /// `redis` or `embedded`.
    pub store: &'static str,
    /// How the store is laid out: `standalone`, `cluster`, `sentinel` or `in-process`.
    pub topology: String,
    /// On a Redis Cluster: the primaries that hold slots and are not marked failed.
    pub primaries: Option<usize>,
    /// Behind Sentinel: `host:port` of the primary the answering connection reaches.
    pub master: Option<String>,
}

impl StoreStatus {
    /// The Redis store in `topology`, with nothing more to report.
    pub fn redis(topology: &str) -> Self {
        Self {
            store: "redis",
            topology: topology.to_owned(),
            primaries: None,
            master: None,
        }
    }
}

/// The pools' state. Every method is atomic with respect to every other, except the
/// member calls (add, disable, enable, remove), which are atomic per chunk: the stores
/// split them into chunks sized to keep each step short (see [`CHUNK_BUDGET`]), and a
/// reader may see a call's first chunks applied before the rest. After a chunk that other
/// calls waited through the store rests, so that while they wait large operations take at
/// most [`LARGE_WORK_SHARE`] of its time; on an idle store chunks run back to back.
///
/// # Errors
/// Every method fails with [`StoreError::Timeout`] or [`StoreError::Unavailable`] when the
/// store cannot answer in time, and methods that name a pool fail with
/// [`StoreError::PoolNotFound`] when it does not exist.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// `redis` or `embedded`, for probes and logs.
    fn name(&self) -> &'static str;

    /// Checks that the store answers, for the readiness probe.
    async fn status(&self) -> Result<StoreStatus, StoreError>;

    /// Picks a member under the pool's policy, among those that pass the request's label
    /// filter and are not banned for its target, and counts one more assignment for it.
    /// Banned members are skipped in the choosing order, each costing one check: after
    /// [`MAX_LABEL_CHECKS`] banned members the answer is [`Assignment::Empty`] with the
    /// wait until the first of their bans ends, even if a member further down is free. On a least-in-flight pool it first
    /// reclaims up to [`RECLAIM_ON_ASSIGN`] expired leases of the pool, then leases the
    /// member for the request's ttl (the pool's `lease_ttl_ms` when `None`).
    ///
    /// # Errors
    /// [`StoreError::FilterTooCostly`] when a filter over several keys would check more
    /// than [`MAX_LABEL_CHECKS`] candidates; nothing changes.
    async fn assign(
        &self,
        pool: &PoolId,
        request: &AssignRequest,
    ) -> Result<Assignment, StoreError>;

    /// Hands out up to `count` distinct eligible members that fit the request, in the
    /// order an assign takes them (the first is the one [`Store::assign`] would choose),
    /// each counted once, in one atomic step; on a least-in-flight pool each gets its own
    /// lease, and only members below `max_in_flight` are taken. Fewer when fewer fit.
    ///
    /// # Errors
    /// As [`Store::assign`].
    async fn assign_several(
        &self,
        pool: &PoolId,
        request: &AssignRequest,
        count: AssignCount,
    ) -> Result<Batch, StoreError>;

    /// Applies `done` (first the release of its lease, then its report, as
    /// [`Store::release`] and [`Store::report`] would, from a worker), then assigns as
    /// [`Store::assign`] does (or, with `count`, as [`Store::assign_several`] does), all in
    /// one atomic step: a member the report takes out is not picked, and a lease released
    /// frees its place for this pick. An unknown member or lease in `done` is answered in
    /// the [`DoneSummary`] and never fails the assign. A single assign's answer is a batch
    /// of at most one.
    ///
    /// # Errors
    /// As [`Store::assign`]. When the pool does not exist nothing changes; when the pick is
    /// refused as [`StoreError::FilterTooCostly`], `done` was applied all the same (it is
    /// the first half of the same step).
    async fn assign_after_done(
        &self,
        pool: &PoolId,
        done: &Done,
        request: &AssignRequest,
        count: AssignCount,
    ) -> Result<(Batch, DoneSummary), StoreError>;

    /// An assign in a sticky session, in one atomic step. When the session is live and its
    /// member is still eligible for this request (eligible in the pool, not banned for its
    /// target, carrying its labels, and on a least-in-flight pool below `max_in_flight`),
    /// that member is handed out again, counted (and leased) as by [`Store::assign`];
    /// pacing does not hold it back, though it rests as any member handed out does.
    /// Otherwise the member is chosen exactly as [`Store::assign`] would and the session is
    /// pinned to it (`repinned` when the session was live). Every call slides the session's
    /// expiry to now + its ttl. When nothing is eligible the answer is
    /// [`Assignment::Empty`] and a live session keeps its member, so that it comes back to
    /// that member once it is eligible again; a new session is not started.
    ///
    /// Expired sessions are cleared a few at a time as assigns in sessions pass, never by a
    /// walk over all of them.
    ///
    /// # Errors
    /// As [`Store::assign`]; [`StoreError::TooManySessions`], changing nothing, when the
    /// session is new and the pool already holds
    /// [`MAX_SESSIONS`](crate::domain::MAX_SESSIONS) live ones.
    async fn assign_in_session(
        &self,
        pool: &PoolId,
        request: &AssignRequest,
        session: &SessionRequest,
    ) -> Result<SessionAssignment, StoreError>;

    /// Applies `done` as [`Store::assign_after_done`] does, then assigns in the sticky
    /// session as [`Store::assign_in_session`] does, all in one atomic step: the session's
    /// member is judged after the report and the release, so a report that takes it out
    /// (a trip, or a ban for the request's target) re-pins the session to a fresh pick, and
    /// a release frees its place for it again (on a least-in-flight pool at
    /// `max_in_flight`, the session keeps its member). An unknown member or lease in `done`
    /// is answered in the [`DoneSummary`] and never fails the assign.
    ///
    /// # Errors
    /// As [`Store::assign_in_session`]. When the pool does not exist nothing changes; when
    /// the pick is refused ([`StoreError::FilterTooCostly`],
    /// [`StoreError::TooManySessions`]), `done` was applied all the same.
    async fn assign_in_session_after_done(
        &self,
        pool: &PoolId,
        done: &Done,
        request: &AssignRequest,
        session: &SessionRequest,
    ) -> Result<(SessionAssignment, DoneSummary), StoreError>;

    /// Ends a live session; the next assign naming it starts it anew.
    ///
    /// # Errors
    /// [`StoreError::SessionNotFound`] when the pool has no such live session.
    async fn end_session(&self, pool: &PoolId, session: &SessionId) -> Result<(), StoreError>;

    /// Ends a live lease and frees its place on its member.
    ///
    /// # Errors
    /// [`StoreError::LeaseNotFound`], changing nothing, when the lease is unknown, already
    /// ended or expired.
    async fn release(&self, pool: &PoolId, lease: &LeaseId) -> Result<(), StoreError>;

    /// Extends a live lease to `ttl` from now (the pool's `lease_ttl_ms` when `None`).
    ///
    /// # Errors
    /// [`StoreError::LeaseNotFound`], changing nothing, when the lease is unknown, already
    /// ended or expired.
    async fn renew(
        &self,
        pool: &PoolId,
        lease: &LeaseId,
        ttl: Option<LeaseTtl>,
    ) -> Result<Renewed, StoreError>;

    /// Reclaims expired leases and returns members whose cooldown has ended, in the pools
    /// that have such work due, found through the store's due index rather than by reading
    /// every pool: at most [`SWEEP_POOLS_PER_CALL`] pools, plus on Redis the few pools of
    /// the safety net (see the key layout in `store/redis/keys.rs`). Run periodically so
    /// that pools nobody assigns from are kept too.
    async fn sweep(&self) -> Result<Swept, StoreError>;

    /// Applies outcome reports in order (see [`ReportSource`] for who may move what).
    /// Never changes an assignment count.
    async fn report(
        &self,
        pool: &PoolId,
        source: ReportSource,
        reports: &[Report],
    ) -> Result<ReportSummary, StoreError>;

    /// Pools with checks whose next round is due, at most `limit`, earliest first. Each is
    /// held for this replica for [`CHECK_CLAIM_HOLD`] (other replicas are not given it
    /// meanwhile) and rescheduled by [`Store::claim_check_round`]; pools whose checks were
    /// switched off are no longer listed. Reads only what is due, not every pool.
    async fn due_check_pools(&self, limit: usize) -> Result<Vec<PoolId>, StoreError>;

    /// Claims the pool's next check round for `interval`: `None` when another replica (or
    /// this one) already ran a round less than `interval` ago. Lists at most
    /// [`MAX_PROBES_PER_ROUND`] members. Either way the pool's next round is scheduled for
    /// when this claim (or the one that holds the round) ends.
    async fn claim_check_round(
        &self,
        pool: &PoolId,
        interval: Duration,
    ) -> Result<Option<CheckRound>, StoreError>;

    /// Pools with sources whose next fetch may be due, at most `limit`, earliest first.
    /// Each is held for this replica for [`SOURCE_CLAIM_HOLD`] and rescheduled by
    /// [`Store::claim_sources`]; pools whose sources were all removed are no longer
    /// listed. Reads only what is due, not every pool.
    async fn due_source_pools(&self, limit: usize) -> Result<Vec<PoolId>, StoreError>;

    /// Claims, among the pool's sources `urls` (its configured ones), those whose fetch is
    /// due: each claimed source is held for `hold` (no replica claims it again meanwhile,
    /// and a replica that dies mid-fetch delays it by no more) until
    /// [`Store::record_source_fetch`] schedules its next fetch. A source never fetched is
    /// due at once. What the store kept about sources no longer in `urls` is forgotten.
    /// Either way the pool's entry in the source index moves to its earliest next fetch.
    async fn claim_sources(
        &self,
        pool: &PoolId,
        urls: &[String],
        hold: Duration,
    ) -> Result<Vec<ClaimedSource>, StoreError>;

    /// Records the end of a fetch of the pool's source `url` and schedules the next one
    /// `next_in` from now. A success clears the source's failures and counts one more
    /// success; a failure counts one more failure. Nothing is recorded for a source that
    /// is no longer the pool's.
    async fn record_source_fetch(
        &self,
        pool: &PoolId,
        url: &str,
        outcome: &FetchOutcome,
        next_in: Duration,
    ) -> Result<(), StoreError>;

    /// What the store keeps about the pool's sources, by URL (sources never claimed are
    /// absent).
    async fn source_states(
        &self,
        pool: &PoolId,
    ) -> Result<std::collections::HashMap<String, SourceState>, StoreError>;

    /// Applies the pool's `prune` rules, a batch at a time (at most [`PRUNE_BATCH`] of
    /// each kind): with `absent`, `(source id, fetch number)`, the members of that source
    /// last seen at or before that fetch are due for removal; then due members without
    /// live leases are removed (and counted in `pruned`), those with leases kept until a
    /// later call finds them free. Members due because their last checks failed are
    /// marked so by [`Store::report`]. A member stops being due when it passes a check or
    /// is seen again by its source.
    async fn prune(&self, pool: &PoolId, absent: Option<(u64, u64)>) -> Result<Pruned, StoreError>;

    /// Creates the pool or replaces its configuration.
    ///
    /// # Errors
    /// [`StoreError::PolicyChangeRequiresEmptyPool`] when the configuration names another
    /// policy than the pool's and the pool has members.
    async fn put_pool(&self, pool: &PoolId, config: &PoolConfig) -> Result<PutPool, StoreError>;

    /// One pool's configuration and numbers.
    async fn pool(&self, pool: &PoolId) -> Result<PoolInfo, StoreError>;

    /// One page of pools ordered by id: at most `limit` of those whose id starts with
    /// `prefix` (every pool with `""`), after `after` when given. Reads only that page.
    async fn pool_page(
        &self,
        prefix: &str,
        after: Option<&PoolId>,
        limit: usize,
    ) -> Result<PoolPage, StoreError>;

    /// How many pools exist (one command on Redis, whatever the number).
    async fn pool_count(&self) -> Result<u64, StoreError>;

    /// Removes the pool and everything it holds.
    async fn delete_pool(&self, pool: &PoolId) -> Result<(), StoreError>;

    /// Adds members; see [`Seed`] for how their starting count is chosen.
    async fn add_members(&self, pool: &PoolId, seed: &Seed) -> Result<SeedReport, StoreError>;

    /// One page of the pool's members; with a target, each with its ban for that target
    /// ([`MemberView::banned_until`]). With a label filter, the page walks the members
    /// carrying the filter's first key, value by value in the filter's order and by id
    /// within a value, keeping those that pass the whole filter; `cursor.eligible` then
    /// counts the entries earlier pages passed, and a page reads at most
    /// [`MAX_LISTING_SCAN`] of them.
    async fn members(
        &self,
        pool: &PoolId,
        filter: StateFilter,
        labels: &LabelFilter,
        target: Option<&Target>,
        limit: usize,
        cursor: Cursor,
    ) -> Result<MemberPage, StoreError>;

    /// One page of the pool's members that share their exit address with another member
    /// (as `exit_ip` checks recorded them): the eligible ones in set order, then the
    /// ineligible ones, `cursor` counting the members of each set earlier pages walked
    /// past; a page walks at most [`MAX_LISTING_SCAN`] members, so it may hold fewer than
    /// `limit` while a next cursor is given.
    async fn shared_exit_members(
        &self,
        pool: &PoolId,
        filter: StateFilter,
        target: Option<&Target>,
        limit: usize,
        cursor: Cursor,
    ) -> Result<MemberPage, StoreError>;

    /// Records the exit address each `exit_ip` check saw, at the store's clock, with the
    /// labels the GeoIP file gives it (see [`ExitSeen::geo`]), in one atomic step per call.
    /// Members the pool no longer has are skipped; answers how many were recorded.
    async fn record_exits(&self, pool: &PoolId, exits: &[ExitSeen]) -> Result<u64, StoreError>;

    /// Takes members out of the eligible set, keeping their counts. Members cooling down
    /// are taken over: their return is cancelled and they count as disabled.
    async fn disable_members(
        &self,
        pool: &PoolId,
        members: &[MemberId],
        reason: &str,
    ) -> Result<DisableReport, StoreError>;

    /// Returns members to the eligible set under `restore` (the pool's policy when `None`).
    async fn enable_members(
        &self,
        pool: &PoolId,
        members: &[MemberId],
        restore: Option<RestorePolicy>,
    ) -> Result<EnableReport, StoreError>;

    /// Forgets members entirely, ending their live leases (not counted as abandoned).
    async fn remove_members(
        &self,
        pool: &PoolId,
        members: &[MemberId],
    ) -> Result<RemoveReport, StoreError>;

    /// Creates the client `id` with `config` and the token whose hash is `token`, or, when
    /// it exists, replaces its configuration and keeps its token (`token` is then unused).
    async fn put_client(
        &self,
        id: &ClientId,
        config: &ClientConfig,
        token: TokenHash,
    ) -> Result<PutClient, StoreError>;

    /// Gives the client `id` the token whose hash is `token`; the old one stops working
    /// at once.
    async fn rotate_client_token(&self, id: &ClientId, token: TokenHash) -> Result<(), StoreError>;

    /// The client `id`.
    async fn client(&self, id: &ClientId) -> Result<ClientRecord, StoreError>;

    /// Every client, by id.
    async fn clients(&self) -> Result<Vec<ClientRecord>, StoreError>;

    /// Deletes the client `id`; its token stops working at once.
    async fn delete_client(&self, id: &ClientId) -> Result<(), StoreError>;

    /// The client whose token hashes to `token`, if any.
    async fn client_by_token(&self, token: TokenHash) -> Result<Option<ClientRecord>, StoreError>;

    /// Called once at shutdown, after the requests have drained: makes everything
    /// answered so far durable and refuses what comes after. Nothing to do for a store
    /// whose state lives elsewhere.
    async fn close(&self) {}
}

/// A jitter draw in `[-1, 1]` for one report call. Drawn by the service, never inside a
/// Redis script, so that scripts stay deterministic.
fn jitter_draw() -> f64 {
    rand::random_range(-1.0..=1.0)
}

/// Merges one page of eligible and one of ineligible members (each already in
/// `(assignments, id)` order and holding up to `limit + 1` entries) into a page of `limit`,
/// and works out where the next page starts.
fn merge_page(
    eligible: Vec<MemberView>,
    ineligible: Vec<MemberView>,
    limit: usize,
    cursor: Cursor,
) -> MemberPage {
    let mut next = cursor;
    let mut members = Vec::with_capacity(limit.min(eligible.len() + ineligible.len()));
    let mut eligible = eligible.into_iter().peekable();
    let mut ineligible = ineligible.into_iter().peekable();
    while members.len() < limit {
        let take_eligible = match (eligible.peek(), ineligible.peek()) {
            (Some(e), Some(i)) => (e.assignments, &e.member) <= (i.assignments, &i.member),
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => break,
        };
        let view = if take_eligible {
            next.eligible += 1;
            eligible.next()
        } else {
            next.ineligible += 1;
            ineligible.next()
        };
        members.extend(view);
    }
    let more = eligible.peek().is_some() || ineligible.peek().is_some();
    MemberPage {
        members,
        next: more.then_some(next),
    }
}

/// A page of a listing with a label filter, from its eligible and ineligible members: in
/// the order of the walk (the filter's first key, value by value in the filter's order,
/// then by id), with the next page starting `next` entries into the walk.
fn labelled_page(
    eligible: Vec<MemberView>,
    ineligible: Vec<MemberView>,
    labels: &LabelFilter,
    next: Option<u64>,
) -> MemberPage {
    let mut members: Vec<MemberView> = eligible.into_iter().chain(ineligible).collect();
    if let Some((key, values)) = labels.groups().next() {
        let place = |view: &MemberView| {
            let value = view.label(key);
            values.iter().position(|v| Some(v.as_str()) == value)
        };
        members.sort_by(|a, b| (place(a), &a.member).cmp(&(place(b), &b.member)));
    }
    MemberPage {
        members,
        next: next.map(|entries| Cursor {
            eligible: entries,
            ineligible: 0,
        }),
    }
}
