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
    Assignment, Cursor, DisableReport, EnableReport, Lease, MemberPage, MemberState, MemberView,
    PoolInfo, PoolStats, PutPool, REAP_ON_ASSIGN, RemoveReport, Renewed, Restored, Seed,
    SeedReport, StateFilter, Store, StoreError, StoreStatus,
};
use crate::domain::{
    LeaseId, LeaseTtl, MemberId, Policy, PoolConfig, PoolId, RestorePolicy, Timestamp,
};

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
    abandoned: u64,
    /// Live leases per member, eligible or not; members without leases are absent.
    in_flight: HashMap<MemberId, u64>,
    leases: HashMap<LeaseId, (MemberId, Timestamp)>,
    /// Live leases by expiry, so that reaping reads only the expired ones.
    expiry: BTreeSet<(Timestamp, LeaseId)>,
    /// Least-in-flight pools only: eligible members by `(in_flight, assignments, id)`, the
    /// order assign chooses in. Kept in step by `unplace` before and `place` after every
    /// change to a member's count, lease count or eligibility.
    order: BTreeSet<(u64, u64, MemberId)>,
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
            abandoned: 0,
            in_flight: HashMap::new(),
            leases: HashMap::new(),
            expiry: BTreeSet::new(),
            order: BTreeSet::new(),
        }
    }

    fn in_flight_of(&self, member: &MemberId) -> u64 {
        self.in_flight.get(member).copied().unwrap_or(0)
    }

    fn order_key(&self, member: &MemberId) -> Option<(u64, u64, MemberId)> {
        let assignments = self.eligible.get(member)?;
        Some((self.in_flight_of(member), assignments, member.clone()))
    }

    /// Takes the member out of the choosing order, before its numbers change.
    fn unplace(&mut self, member: &MemberId) {
        if let Some(key) = self.order_key(member) {
            self.order.remove(&key);
        }
    }

    /// Puts the member back into the choosing order with its current numbers, when the
    /// pool is least-in-flight and the member eligible.
    fn place(&mut self, member: &MemberId) {
        if self.config.policy == Policy::LeastInFlight
            && let Some(key) = self.order_key(member)
        {
            self.order.insert(key);
        }
    }

    fn lease_for(&mut self, member: &MemberId, now: Timestamp, ttl: LeaseTtl) -> Lease {
        let id = LeaseId::random();
        let expires_at = Timestamp(now.0.saturating_add(ttl.as_millis()));
        self.leases.insert(id.clone(), (member.clone(), expires_at));
        self.expiry.insert((expires_at, id.clone()));
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
    fn live_lease(&self, id: &LeaseId, now: Timestamp) -> Result<MemberId, StoreError> {
        match self.leases.get(id) {
            Some((member, expires_at)) if *expires_at > now => Ok(member.clone()),
            _ => Err(StoreError::LeaseNotFound),
        }
    }

    /// Reclaims up to `limit` leases expired at `now`, counting them as abandoned.
    fn reap(&mut self, now: Timestamp, limit: u64) -> u64 {
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
        self.abandoned += reclaimed;
        reclaimed
    }

    fn assign_least_in_flight(&mut self, ttl: Option<LeaseTtl>) -> Assignment {
        let now = Timestamp::now();
        self.reap(now, REAP_ON_ASSIGN);
        let Some((in_flight, _, member)) = self.order.first().cloned() else {
            return Assignment::Empty;
        };
        // The first entry has the fewest live leases of all: if it is at the cap, so is
        // every other member.
        if self
            .config
            .max_in_flight
            .is_some_and(|cap| in_flight >= cap.get())
        {
            return Assignment::Empty;
        }
        self.unplace(&member);
        let assignments = self.eligible.get(&member).unwrap_or(0) + 1;
        self.eligible.set(member.clone(), assignments);
        self.in_flight.insert(member.clone(), in_flight + 1);
        self.place(&member);
        self.total_assignments += 1;
        let lease = self.lease_for(&member, now, ttl.unwrap_or(self.config.lease_ttl_ms));
        Assignment::Leased {
            member,
            assignments,
            in_flight: in_flight + 1,
            lease,
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
                in_flight: self.leases.len() as u64,
                abandoned: self.abandoned,
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
            in_flight: self.in_flight_of(member),
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
            primaries: None,
            master: None,
        })
    }

    async fn assign(&self, pool: &PoolId, ttl: Option<LeaseTtl>) -> Result<Assignment, StoreError> {
        self.with_pool(pool, |p| {
            if p.config.policy == Policy::LeastInFlight {
                return p.assign_least_in_flight(ttl);
            }
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

    async fn release(&self, pool: &PoolId, lease: &LeaseId) -> Result<(), StoreError> {
        self.with_pool(pool, |p| {
            p.live_lease(lease, Timestamp::now())?;
            p.end_lease(lease);
            Ok(())
        })?
    }

    async fn renew(
        &self,
        pool: &PoolId,
        lease: &LeaseId,
        ttl: Option<LeaseTtl>,
    ) -> Result<Renewed, StoreError> {
        self.with_pool(pool, |p| {
            let now = Timestamp::now();
            let member = p.live_lease(lease, now)?;
            // Re-issued under the same id: the old expiry entry goes, the new one comes.
            if let Some((_, expires_at)) = p.leases.remove(lease) {
                p.expiry.remove(&(expires_at, lease.clone()));
            }
            let ttl = ttl.unwrap_or(p.config.lease_ttl_ms);
            let expires_at = Timestamp(now.0.saturating_add(ttl.as_millis()));
            p.leases.insert(lease.clone(), (member.clone(), expires_at));
            p.expiry.insert((expires_at, lease.clone()));
            Ok(Renewed {
                member,
                lease: Lease {
                    id: lease.clone(),
                    expires_at,
                    ttl_ms: ttl,
                },
            })
        })?
    }

    async fn reap(&self) -> Result<u64, StoreError> {
        let now = Timestamp::now();
        Ok(self
            .lock()
            .values_mut()
            .map(|p| p.reap(now, u64::MAX))
            .sum())
    }

    async fn put_pool(&self, pool: &PoolId, config: &PoolConfig) -> Result<PutPool, StoreError> {
        let mut pools = self.lock();
        if let Some(existing) = pools.get_mut(pool) {
            let has_members = existing.eligible.len() + existing.ineligible.len() > 0;
            if existing.config.policy != config.policy && has_members {
                return Err(StoreError::PolicyChangeRequiresEmptyPool);
            }
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
                        ranked.set(member.clone(), start);
                        p.place(member);
                    }
                    report.existing.push(member.clone());
                } else if max.is_some_and(|max| size >= max) {
                    report.full.push(member.clone());
                } else {
                    if !seed.dry_run {
                        p.eligible.set(member.clone(), start);
                        p.place(member);
                    }
                    size += 1;
                    report.added.push(member.clone());
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
                        in_flight: p.in_flight_of(member),
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
                p.unplace(member);
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
                    // It comes back with the leases it still holds.
                    p.place(member);
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
            let removed: std::collections::HashSet<&MemberId> = members.iter().collect();
            let ended: Vec<LeaseId> = p
                .leases
                .iter()
                .filter(|(_, (member, _))| removed.contains(member))
                .map(|(id, _)| id.clone())
                .collect();
            for id in &ended {
                p.end_lease(id);
            }
            for member in members {
                p.unplace(member);
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
