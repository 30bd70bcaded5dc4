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

mod embedded;
mod redis;

use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;

pub use self::embedded::EmbeddedStore;
pub use self::redis::{RedisStore, RedisStoreOptions};
use crate::domain::{MemberId, PoolConfig, PoolId, RestorePolicy, Timestamp};

/// What went wrong in a store. Each variant maps to one documented HTTP answer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The pool does not exist.
    #[error("pool not found")]
    PoolNotFound,
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
    /// The pool exists but has no eligible member.
    Empty,
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
        }
    }
}

/// What a seeding did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
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

/// One member as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemberView {
    /// The member.
    pub member: MemberId,
    /// Whether it is eligible.
    pub state: MemberState,
    /// Its count.
    pub assignments: u64,
    /// Why it was taken out (ineligible members only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When it was taken out (ineligible members only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<Timestamp>,
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
    /// How the store is laid out (`standalone`, `in-process`).
    pub topology: String,
}

/// The pools' state. Every method is atomic with respect to every other.
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

    /// Picks the eligible member with the fewest assignments and counts one more for it.
    async fn assign(&self, pool: &PoolId) -> Result<Assignment, StoreError>;

    /// Creates the pool or replaces its configuration.
    async fn put_pool(&self, pool: &PoolId, config: &PoolConfig) -> Result<PutPool, StoreError>;

    /// One pool's configuration and numbers.
    async fn pool(&self, pool: &PoolId) -> Result<PoolInfo, StoreError>;

    /// Every pool, ordered by id.
    async fn pools(&self) -> Result<Vec<PoolInfo>, StoreError>;

    /// Removes the pool and everything it holds.
    async fn delete_pool(&self, pool: &PoolId) -> Result<(), StoreError>;

    /// Adds members; see [`Seed`] for how their starting count is chosen.
    async fn add_members(&self, pool: &PoolId, seed: &Seed) -> Result<SeedReport, StoreError>;

    /// One page of the pool's members.
    async fn members(
        &self,
        pool: &PoolId,
        filter: StateFilter,
        limit: usize,
        cursor: Cursor,
    ) -> Result<MemberPage, StoreError>;

    /// Takes members out of the eligible set, keeping their counts.
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

    /// Forgets members entirely.
    async fn remove_members(
        &self,
        pool: &PoolId,
        members: &[MemberId],
    ) -> Result<RemoveReport, StoreError>;
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
