//! `EmbeddedStore`: every pool in this process's memory, for a single replica.
//!
//! It follows the Redis store rule for rule (the shared behavioural suite runs against
//! both), but its state is neither shared with other replicas nor persisted: a restart
//! starts from nothing. One mutex guards all pools; every operation holds it for its whole
//! duration, which gives the same atomicity as one Lua script in Redis.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;

use super::{
    Assignment, Cursor, DisableReport, EnableReport, MemberPage, MemberState, MemberView, PoolInfo,
    PoolStats, PutPool, RemoveReport, Restored, Seed, SeedReport, StateFilter, Store, StoreError,
    StoreStatus,
};
use crate::domain::{MemberId, PoolConfig, PoolId, RestorePolicy, Timestamp};

/// The in-process store. Cloning is not needed: the application holds it behind an `Arc`.
#[derive(Debug, Default)]
pub struct EmbeddedStore {
    pools: Mutex<BTreeMap<PoolId, Pool>>,
}

#[derive(Debug)]
struct Pool {
    config: PoolConfig,
    created_at: Timestamp,
    total_assignments: u64,
    eligible: Ranked,
    ineligible: Ranked,
    taken_out: HashMap<MemberId, (String, Timestamp)>,
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
        if let Some(old) = self.counts.insert(member.clone(), count) {
            self.order.remove(&(old, member.clone()));
        }
        self.order.insert((count, member));
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

    fn page(&self, offset: u64, limit: usize) -> impl Iterator<Item = &(u64, MemberId)> {
        self.order
            .iter()
            .skip(usize::try_from(offset).unwrap_or(usize::MAX))
            .take(limit)
    }
}

impl Pool {
    fn new(config: PoolConfig) -> Self {
        Self {
            config,
            created_at: Timestamp::now(),
            total_assignments: 0,
            eligible: Ranked::default(),
            ineligible: Ranked::default(),
            taken_out: HashMap::new(),
        }
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
            },
        }
    }

    fn view_ineligible(&self, member: &MemberId, assignments: u64) -> MemberView {
        let (reason, since) = self
            .taken_out
            .get(member)
            .map(|(reason, since)| (reason.clone(), *since))
            .unzip();
        MemberView {
            member: member.clone(),
            state: MemberState::Ineligible,
            assignments,
            reason,
            since,
        }
    }
}

impl EmbeddedStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<PoolId, Pool>> {
        // A panic while holding the lock cannot leave a pool half-updated in a way later
        // operations would trip on (each step keeps `order` and `counts` in step), so a
        // poisoned lock is still usable.
        self.pools.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn with_pool<T>(&self, pool: &PoolId, f: impl FnOnce(&mut Pool) -> T) -> Result<T, StoreError> {
        self.lock()
            .get_mut(pool)
            .map(f)
            .ok_or(StoreError::PoolNotFound)
    }
}

#[async_trait]
impl Store for EmbeddedStore {
    fn name(&self) -> &'static str {
        "embedded"
    }

    async fn status(&self) -> Result<StoreStatus, StoreError> {
        Ok(StoreStatus {
            store: "embedded",
            topology: "in-process".to_owned(),
        })
    }

    async fn assign(&self, pool: &PoolId) -> Result<Assignment, StoreError> {
        self.with_pool(pool, |p| {
            let Some((count, member)) = p.eligible.order.pop_first() else {
                return Assignment::Empty;
            };
            let assignments = count + 1;
            p.eligible.counts.insert(member.clone(), assignments);
            p.eligible.order.insert((assignments, member.clone()));
            p.total_assignments += 1;
            Assignment::Assigned {
                member,
                assignments,
            }
        })
    }

    async fn put_pool(&self, pool: &PoolId, config: &PoolConfig) -> Result<PutPool, StoreError> {
        let mut pools = self.lock();
        if let Some(existing) = pools.get_mut(pool) {
            existing.config = config.clone();
            Ok(PutPool::Updated)
        } else {
            pools.insert(pool.clone(), Pool::new(config.clone()));
            Ok(PutPool::Created)
        }
    }

    async fn pool(&self, pool: &PoolId) -> Result<PoolInfo, StoreError> {
        self.with_pool(pool, |p| p.info(pool))
    }

    async fn pools(&self) -> Result<Vec<PoolInfo>, StoreError> {
        Ok(self.lock().iter().map(|(id, p)| p.info(id)).collect())
    }

    async fn delete_pool(&self, pool: &PoolId) -> Result<(), StoreError> {
        self.lock()
            .remove(pool)
            .map(drop)
            .ok_or(StoreError::PoolNotFound)
    }

    async fn add_members(&self, pool: &PoolId, seed: &Seed) -> Result<SeedReport, StoreError> {
        self.with_pool(pool, |p| {
            let start = seed
                .assignments
                .or(p.config.start_assignments)
                .unwrap_or_else(|| p.eligible.min().unwrap_or(0));
            let mut report = SeedReport {
                added: Vec::new(),
                existing: Vec::new(),
                full: Vec::new(),
                start_assignments: start,
            };
            let max = p.config.rules.max_members;
            let mut size = p.eligible.len() + p.ineligible.len() + seed.pending_adds;
            for member in &seed.members {
                let holder = if p.eligible.get(member).is_some() {
                    Some(&mut p.eligible)
                } else if p.ineligible.get(member).is_some() {
                    Some(&mut p.ineligible)
                } else {
                    None
                };
                match holder {
                    Some(ranked) => {
                        if seed.reset && !seed.dry_run {
                            ranked.set(member.clone(), start);
                        }
                        report.existing.push(member.clone());
                    }
                    None if max.is_some_and(|max| size >= max) => {
                        report.full.push(member.clone());
                    }
                    None => {
                        if !seed.dry_run {
                            p.eligible.set(member.clone(), start);
                        }
                        size += 1;
                        report.added.push(member.clone());
                    }
                }
            }
            report
        })
    }

    async fn members(
        &self,
        pool: &PoolId,
        filter: StateFilter,
        limit: usize,
        cursor: Cursor,
    ) -> Result<MemberPage, StoreError> {
        self.with_pool(pool, |p| {
            // Take one more than a page from each set so that the merge knows whether
            // anything is left after this page.
            let eligible: Vec<MemberView> = match filter {
                StateFilter::Ineligible => Vec::new(),
                _ => p
                    .eligible
                    .page(cursor.eligible, limit + 1)
                    .map(|(count, member)| MemberView {
                        member: member.clone(),
                        state: MemberState::Eligible,
                        assignments: *count,
                        reason: None,
                        since: None,
                    })
                    .collect(),
            };
            let ineligible: Vec<MemberView> = match filter {
                StateFilter::Eligible => Vec::new(),
                _ => p
                    .ineligible
                    .page(cursor.ineligible, limit + 1)
                    .map(|(count, member)| p.view_ineligible(member, *count))
                    .collect(),
            };
            super::merge_page(eligible, ineligible, limit, cursor)
        })
    }

    async fn disable_members(
        &self,
        pool: &PoolId,
        members: &[MemberId],
        reason: &str,
    ) -> Result<DisableReport, StoreError> {
        self.with_pool(pool, |p| {
            let now = Timestamp::now();
            let mut report = DisableReport::default();
            for member in members {
                if let Some(count) = p.eligible.remove(member) {
                    p.ineligible.set(member.clone(), count);
                    p.taken_out.insert(member.clone(), (reason.to_owned(), now));
                    report.disabled.push(member.clone());
                } else if p.ineligible.get(member).is_some() {
                    report.already_ineligible.push(member.clone());
                } else {
                    report.unknown.push(member.clone());
                }
            }
            report
        })
    }

    async fn enable_members(
        &self,
        pool: &PoolId,
        members: &[MemberId],
        restore: Option<RestorePolicy>,
    ) -> Result<EnableReport, StoreError> {
        self.with_pool(pool, |p| {
            let restore = restore.unwrap_or(p.config.restore);
            // Every member of one call is placed against the same minimum: the one among
            // members that were eligible before the call.
            let minimum = p.eligible.min();
            let mut report = EnableReport {
                restore,
                enabled: Vec::new(),
                already_eligible: Vec::new(),
                unknown: Vec::new(),
            };
            for member in members {
                if let Some(kept) = p.ineligible.remove(member) {
                    let assignments = restore.restored_count(kept, minimum);
                    p.taken_out.remove(member);
                    p.eligible.set(member.clone(), assignments);
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
            report
        })
    }

    async fn remove_members(
        &self,
        pool: &PoolId,
        members: &[MemberId],
    ) -> Result<RemoveReport, StoreError> {
        self.with_pool(pool, |p| {
            let mut report = RemoveReport::default();
            for member in members {
                let was_eligible = p.eligible.remove(member).is_some();
                let was_ineligible = p.ineligible.remove(member).is_some();
                p.taken_out.remove(member);
                if was_eligible || was_ineligible {
                    report.removed.push(member.clone());
                } else {
                    report.unknown.push(member.clone());
                }
            }
            report
        })
    }
}
