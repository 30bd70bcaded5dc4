//! `EmbeddedStore`: every pool in this process's memory, for a single replica.
//!
//! It follows the Redis store rule for rule (the shared behavioural suite runs against
//! both), but its state is neither shared with other replicas nor persisted: a restart
//! starts from nothing. One mutex guards all pools; every operation holds it for its whole
//! duration, which gives the same atomicity as one Lua script in Redis.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;

use super::{
    Assignment, CheckRound, Cursor, DisableReport, Effect, EnableReport, Health, LastCheck, Lease,
    MAX_PROBES_PER_ROUND, MemberPage, MemberState, MemberView, PoolInfo, PoolStats, PutPool,
    RECLAIM_ON_ASSIGN, RETURN_ON_ASSIGN, RemoveReport, Renewed, Report, ReportSource,
    ReportSummary, Restored, Seed, SeedReport, StateFilter, Store, StoreError, StoreStatus, Swept,
};
use crate::domain::{
    LeaseId, LeaseTtl, MemberId, OutcomeResult, Policy, PoolConfig, PoolId, RestorePolicy,
    Timestamp,
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
    /// Live leases by expiry, so that reclaiming reads only the expired ones.
    expiry: BTreeSet<(Timestamp, LeaseId)>,
    /// Least-in-flight pools only: eligible members by `(in_flight, assignments, id)`, the
    /// order assign chooses in. Kept in step by `unplace` before and `place` after every
    /// change to a member's count, lease count or eligibility.
    order: BTreeSet<(u64, u64, MemberId)>,
    /// Failure streaks and backoff; members with all zeros are absent.
    health: HashMap<MemberId, Health>,
    /// Members cooling down, by the time they come back; a member is cooling down exactly
    /// when it is here (and in `return_at`).
    returns: BTreeSet<(Timestamp, MemberId)>,
    return_at: HashMap<MemberId, Timestamp>,
    /// The last active check of each member.
    checks: HashMap<MemberId, LastCheck>,
    tripped: u64,
    recovered: u64,
    /// Until when the last check round holds the pool.
    check_round_until: Option<Timestamp>,
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
            health: HashMap::new(),
            returns: BTreeSet::new(),
            return_at: HashMap::new(),
            checks: HashMap::new(),
            tripped: 0,
            recovered: 0,
            check_round_until: None,
        }
    }

    fn health_of(&self, member: &MemberId) -> Health {
        self.health.get(member).copied().unwrap_or_default()
    }

    fn set_health(&mut self, member: &MemberId, health: Health) {
        if health.streak == 0 && health.trips == 0 {
            self.health.remove(member);
        } else {
            self.health.insert(member.clone(), health);
        }
    }

    /// Cancels a member's scheduled return; false when it was not cooling down.
    fn cancel_return(&mut self, member: &MemberId) -> bool {
        match self.return_at.remove(member) {
            Some(at) => self.returns.remove(&(at, member.clone())),
            None => false,
        }
    }

    fn schedule_return(&mut self, member: &MemberId, at: Timestamp) {
        self.cancel_return(member);
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
        let restored = policy.restored_count(kept, minimum);
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
        self.recovered += returned;
        returned
    }

    /// How long until the earliest return, when nothing is eligible.
    fn next_return(&self, now: Timestamp) -> Option<Duration> {
        self.returns
            .first()
            .map(|(at, _)| Duration::from_millis(at.0.saturating_sub(now.0)))
    }

    /// Takes a member out for its next cooldown (a cooling one has its return pushed back).
    fn trip(&mut self, member: &MemberId, reason: &str, now: Timestamp, health: Health, draw: f64) {
        let trips = health.trips + 1;
        let cooldown_ms = self.config.health.cooldown_ms(trips, draw);
        if !self.take_out(member, reason, now) {
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
    }

    /// One report, by the rules of `scripts/outcomes.lua`. `None` for an unknown member.
    fn apply(
        &mut self,
        source: ReportSource,
        report: &Report,
        now: Timestamp,
        draw: f64,
    ) -> Option<(Effect, u64)> {
        let member = &report.member;
        let mut health = self.health_of(member);
        let eligible = self.eligible.get(member).is_some();
        let cooling = !eligible && self.return_at.contains_key(member);
        let check = source == ReportSource::Check;
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
            self.checks.insert(
                member.clone(),
                LastCheck {
                    at: now,
                    result: report.result,
                    detail: report.detail.clone(),
                },
            );
        }
        Some((effect, health.streak))
    }

    /// A member's health fields for a listing.
    fn with_health(&self, mut view: MemberView) -> MemberView {
        let health = self.health_of(&view.member);
        view.consecutive_failures = health.streak;
        view.cooldown_ms = (health.trips > 0).then_some(health.cooldown_ms);
        view.returns_at = self.return_at.get(&view.member).copied();
        view.last_check = self.checks.get(&view.member).cloned();
        view
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
        self.abandoned += reclaimed;
        reclaimed
    }

    fn assign_least_in_flight(&mut self, ttl: Option<LeaseTtl>, now: Timestamp) -> Assignment {
        self.reclaim_expired(now, RECLAIM_ON_ASSIGN);
        let Some((in_flight, _, member)) = self.order.first().cloned() else {
            return Assignment::Empty {
                next_return: self.next_return(now),
            };
        };
        // The first entry has the fewest live leases of all: if it is at the cap, so is
        // every other member.
        if self
            .config
            .max_in_flight
            .is_some_and(|cap| in_flight >= cap.get())
        {
            return Assignment::Empty { next_return: None };
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
                tripped: self.tripped,
                recovered: self.recovered,
            },
        }
    }

    fn view_ineligible(&self, member: &MemberId, assignments: u64) -> MemberView {
        let (reason, since) = self
            .taken_out
            .get(member)
            .map(|(reason, since)| (reason.clone(), *since))
            .unzip();
        self.with_health(MemberView {
            member: member.clone(),
            state: MemberState::Ineligible,
            assignments,
            in_flight: self.in_flight_of(member),
            reason,
            since,
            consecutive_failures: 0,
            cooldown_ms: None,
            returns_at: None,
            last_check: None,
        })
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
            let now = Timestamp::now();
            p.return_due(now, RETURN_ON_ASSIGN);
            if p.config.policy == Policy::LeastInFlight {
                return p.assign_least_in_flight(ttl, now);
            }
            let Some((member, assignments)) = p.eligible.add_one_to_first() else {
                return Assignment::Empty {
                    next_return: p.next_return(now),
                };
            };
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

    async fn sweep(&self) -> Result<Swept, StoreError> {
        let now = Timestamp::now();
        Ok(self.lock().values_mut().fold(Swept::default(), |sum, p| {
            sum + Swept {
                reclaimed: p.reclaim_expired(now, u64::MAX),
                returned: p.return_due(now, u64::MAX),
            }
        }))
    }

    async fn report(
        &self,
        pool: &PoolId,
        source: ReportSource,
        reports: &[Report],
    ) -> Result<ReportSummary, StoreError> {
        let draw = super::jitter_draw();
        self.with_pool(pool, |p| {
            let now = Timestamp::now();
            let mut summary = ReportSummary::default();
            for report in reports {
                match p.apply(source, report, now, draw) {
                    Some((effect, streak)) => {
                        summary
                            .applied
                            .push((report.member.clone(), report.result, effect, streak))
                    }
                    None => summary.unknown.push(report.member.clone()),
                }
            }
            summary
        })
    }

    async fn claim_check_round(
        &self,
        pool: &PoolId,
        interval: Duration,
    ) -> Result<Option<CheckRound>, StoreError> {
        self.with_pool(pool, |p| {
            let now = Timestamp::now();
            if p.check_round_until.is_some_and(|until| until > now) {
                return None;
            }
            let millis = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
            p.check_round_until = Some(Timestamp(now.0.saturating_add(millis.max(1))));
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
            Some(CheckRound { eligible, cooling })
        })
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
                    .map(|(count, member)| {
                        p.with_health(MemberView {
                            member: member.clone(),
                            state: MemberState::Eligible,
                            assignments: *count,
                            in_flight: p.in_flight_of(member),
                            reason: None,
                            since: None,
                            consecutive_failures: 0,
                            cooldown_ms: None,
                            returns_at: None,
                            last_check: None,
                        })
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
                if let Some((kept, assignments)) = p.restore(member, restore, minimum) {
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
                p.health.remove(member);
                p.cancel_return(member);
                p.checks.remove(member);
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
