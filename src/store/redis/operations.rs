//! The operations of the `Store` trait on Redis: each one builds its script's arguments,
//! runs it and turns its reply into the trait's types.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use redis::{Script, Value};

use super::RedisStore;
use super::reply::{
    self, AssignReply, ClaimCheckReply, DeletePoolReply, DisableOutcome, DisableReply,
    EnableOutcome, EnableReply, MembersReply, OutcomesReply, PoolInfoReply, PutPoolReply,
    ReleaseReply, RemoveReply, RenewReply, SeedOutcome, SeedReply, SweepReply,
};
use crate::domain::{LeaseId, LeaseTtl, MemberId, PoolConfig, PoolId, RestorePolicy};
use crate::store::{
    Assignment, CheckRound, Cursor, DisableReport, EnableReport, Lease, MAX_PROBES_PER_ROUND,
    MemberPage, PoolInfo, PutPool, RECLAIM_ON_ASSIGN, RETURN_ON_ASSIGN, RemoveReport, Renewed,
    Report, ReportSource, ReportSummary, Restored, SWEEP_BATCH, Seed, SeedReport, StateFilter,
    Store, StoreError, StoreStatus, Swept,
};

/// The batch sizes every assign passes to its script, written out once rather than on
/// every call of the hot path.
static ASSIGN_BATCHES: std::sync::LazyLock<[String; 2]> =
    std::sync::LazyLock::new(|| [RECLAIM_ON_ASSIGN.to_string(), RETURN_ON_ASSIGN.to_string()]);

/// Most members of each set one call of `members.lua` reads: a page of a listing takes as
/// many calls as it needs.
const LISTING_PIECE: usize = 250;

/// Most steps one sweep runs on one pool, so that a sweep always ends.
const MAX_SWEEP_STEPS: u64 = 64;

impl RedisStore {
    /// Every registered pool id, in id order.
    async fn pool_ids(&self) -> Result<Vec<PoolId>, StoreError> {
        let mut smembers = redis::cmd("SMEMBERS");
        smembers.arg(self.registry_key());
        reply::pool_ids(self.command(smembers).await?)
    }

    /// Sweep steps on one pool until it has no expired lease and no due return left (or
    /// the step budget is spent; the next sweep goes on).
    async fn sweep_pool(&self, pool: &PoolId) -> Result<Swept, StoreError> {
        let batch = SWEEP_BATCH.to_string();
        let mut swept = Swept::default();
        for _ in 0..MAX_SWEEP_STEPS {
            let value = self
                .eval(&self.scripts.sweep, pool, &[batch.as_bytes()])
                .await?;
            let step = match SweepReply::decode(value) {
                Ok(SweepReply(step)) => step,
                // Deleted between the listing and the step.
                Err(StoreError::PoolNotFound) => Swept::default(),
                Err(e) => return Err(e),
            };
            swept = swept + step;
            if step.reclaimed < SWEEP_BATCH && step.returned < SWEEP_BATCH {
                break;
            }
        }
        Ok(swept)
    }

    /// One chunk of a seeding: `members` (part of `seed.members`) with the starting count
    /// and pending adds the earlier chunks left.
    async fn seed_chunk(
        &self,
        pool: &PoolId,
        seed: &Seed,
        members: &[MemberId],
        start: Option<u64>,
        pending_adds: u64,
    ) -> Result<SeedReport, StoreError> {
        let start = start.map(|n| n.to_string()).unwrap_or_default();
        let flag = |on: bool| -> &'static [u8] { if on { b"1" } else { b"0" } };
        let pending = pending_adds.to_string();
        let mut args: Vec<&[u8]> = Vec::with_capacity(members.len() + 4);
        args.push(start.as_bytes());
        args.push(flag(seed.reset));
        args.push(flag(seed.dry_run));
        args.push(pending.as_bytes());
        args.extend(members.iter().map(|m| m.as_str().as_bytes()));
        let value = self.eval(&self.scripts.seed, pool, &args).await?;
        let reply = SeedReply::decode(value, members.len())?;
        let mut report = SeedReport {
            added: Vec::new(),
            existing: Vec::new(),
            full: Vec::new(),
            start_assignments: reply.start_assignments,
        };
        for (member, outcome) in members.iter().zip(reply.outcomes) {
            match outcome {
                SeedOutcome::Added => report.added.push(member.clone()),
                SeedOutcome::Full => report.full.push(member.clone()),
                SeedOutcome::Existing => report.existing.push(member.clone()),
            }
        }
        Ok(report)
    }

    /// Runs a script whose arguments are one value, then member ids.
    async fn member_script(
        &self,
        script: &Script,
        pool: &PoolId,
        first: &[u8],
        members: &[MemberId],
    ) -> Result<Value, StoreError> {
        let mut args: Vec<&[u8]> = Vec::with_capacity(members.len() + 1);
        args.push(first);
        args.extend(members.iter().map(|m| m.as_str().as_bytes()));
        self.eval(script, pool, &args).await
    }
}

#[async_trait]
impl Store for RedisStore {
    fn name(&self) -> &'static str {
        "redis"
    }

    async fn status(&self) -> Result<StoreStatus, StoreError> {
        self.run(|mut connection| async move { connection.status().await })
            .await
    }

    async fn assign(&self, pool: &PoolId, ttl: Option<LeaseTtl>) -> Result<Assignment, StoreError> {
        // The id is drawn for every assign, used only on least-in-flight pools: deciding
        // here would need the pool's policy, which only the script reads.
        let id = LeaseId::random();
        let ttl_arg = ttl.map(|t| t.as_millis().to_string()).unwrap_or_default();
        let [reclaim, returns] = &*ASSIGN_BATCHES;
        let args: [&[u8]; 4] = [
            id.as_str().as_bytes(),
            ttl_arg.as_bytes(),
            reclaim.as_bytes(),
            returns.as_bytes(),
        ];
        let value = self.eval(&self.scripts.assign, pool, &args).await?;
        Ok(match AssignReply::decode(value)? {
            AssignReply::Empty { next_return } => Assignment::Empty { next_return },
            AssignReply::Assigned {
                member,
                assignments,
            } => Assignment::Assigned {
                member,
                assignments,
            },
            AssignReply::Leased {
                member,
                assignments,
                in_flight,
                expires_at,
                ttl_ms,
            } => Assignment::Leased {
                member,
                assignments,
                in_flight,
                lease: Lease {
                    id,
                    expires_at,
                    ttl_ms,
                },
            },
        })
    }

    async fn release(&self, pool: &PoolId, lease: &LeaseId) -> Result<(), StoreError> {
        let value = self
            .eval(&self.scripts.release, pool, &[lease.as_str().as_bytes()])
            .await?;
        match ReleaseReply::decode(value)? {
            ReleaseReply { released: true } => Ok(()),
            ReleaseReply { released: false } => Err(StoreError::LeaseNotFound),
        }
    }

    async fn renew(
        &self,
        pool: &PoolId,
        lease: &LeaseId,
        ttl: Option<LeaseTtl>,
    ) -> Result<Renewed, StoreError> {
        let ttl_arg = ttl.map(|t| t.as_millis().to_string()).unwrap_or_default();
        let args: [&[u8]; 2] = [lease.as_str().as_bytes(), ttl_arg.as_bytes()];
        let value = self.eval(&self.scripts.renew, pool, &args).await?;
        let RenewReply(renewal) = RenewReply::decode(value)?;
        let renewal = renewal.ok_or(StoreError::LeaseNotFound)?;
        Ok(Renewed {
            member: renewal.member,
            lease: Lease {
                id: lease.clone(),
                expires_at: renewal.expires_at,
                ttl_ms: renewal.ttl_ms,
            },
        })
    }

    async fn sweep(&self) -> Result<Swept, StoreError> {
        let pools = self.pool_ids().await?;
        // Issued together so that they travel pipelined on the shared connection.
        let swept =
            futures_util::future::join_all(pools.iter().map(|pool| self.sweep_pool(pool))).await;
        swept
            .into_iter()
            .try_fold(Swept::default(), |sum, pool| Ok(sum + pool?))
    }

    async fn report(
        &self,
        pool: &PoolId,
        source: ReportSource,
        reports: &[Report],
    ) -> Result<ReportSummary, StoreError> {
        let draw = crate::store::jitter_draw().to_string();
        let latencies: Vec<String> = reports
            .iter()
            .map(|report| {
                report
                    .latency_ms
                    .map(|ms| ms.to_string())
                    .unwrap_or_default()
            })
            .collect();
        let mut args: Vec<&[u8]> = Vec::with_capacity(reports.len() * 4 + 2);
        args.push(source.as_str().as_bytes());
        args.push(draw.as_bytes());
        for (report, latency) in reports.iter().zip(&latencies) {
            args.push(report.member.as_str().as_bytes());
            args.push(report.result.as_str().as_bytes());
            args.push(report.detail.as_bytes());
            args.push(latency.as_bytes());
        }
        let value = self.eval(&self.scripts.outcomes, pool, &args).await?;
        let OutcomesReply(outcomes) = OutcomesReply::decode(value, reports.len())?;
        let mut summary = ReportSummary::default();
        for (report, outcome) in reports.iter().zip(outcomes) {
            match outcome {
                Some((effect, streak)) => {
                    summary
                        .applied
                        .push((report.member.clone(), report.result, effect, streak));
                }
                None => summary.unknown.push(report.member.clone()),
            }
        }
        Ok(summary)
    }

    async fn claim_check_round(
        &self,
        pool: &PoolId,
        interval: Duration,
    ) -> Result<Option<CheckRound>, StoreError> {
        let ms = interval.as_millis().max(1).to_string();
        let limit = MAX_PROBES_PER_ROUND.to_string();
        let value = self
            .eval(
                &self.scripts.claim_check,
                pool,
                &[ms.as_bytes(), limit.as_bytes()],
            )
            .await?;
        let ClaimCheckReply(round) = ClaimCheckReply::decode(value)?;
        Ok(round)
    }

    async fn put_pool(&self, pool: &PoolId, config: &PoolConfig) -> Result<PutPool, StoreError> {
        let json = serde_json::to_vec(config).map_err(|e| StoreError::Unavailable(Box::new(e)))?;
        let start = config
            .start_assignments
            .map(|n| n.to_string())
            .unwrap_or_default();
        let ttl = config.lease_ttl_ms.as_millis().to_string();
        let cap = config
            .max_in_flight
            .map(|n| n.to_string())
            .unwrap_or_default();
        let max = config
            .rules
            .max_members
            .map(|n| n.to_string())
            .unwrap_or_default();
        let health = config.health.script_arg();
        let args: [&[u8]; 8] = [
            &json,
            config.restore.as_str().as_bytes(),
            start.as_bytes(),
            config.policy.as_str().as_bytes(),
            ttl.as_bytes(),
            cap.as_bytes(),
            max.as_bytes(),
            health.as_bytes(),
        ];
        let value = self.eval(&self.scripts.put_pool, pool, &args).await?;
        let created = match PutPoolReply::decode(value)? {
            PutPoolReply::PolicyChangeRefused => {
                return Err(StoreError::PolicyChangeRequiresEmptyPool);
            }
            PutPoolReply::Created => true,
            PutPoolReply::Updated => false,
        };
        // The registry lives in another hash slot, so it is updated after the pool script.
        // A crash in between leaves a pool that `pools()` does not list until its next PUT.
        let mut sadd = redis::cmd("SADD");
        sadd.arg(self.registry_key()).arg(pool.as_str());
        self.command(sadd).await?;
        Ok(if created {
            PutPool::Created
        } else {
            PutPool::Updated
        })
    }

    async fn pool(&self, pool: &PoolId) -> Result<PoolInfo, StoreError> {
        let value = self.eval(&self.scripts.pool_info, pool, &[]).await?;
        let info = PoolInfoReply::decode(value)?;
        Ok(PoolInfo {
            pool: pool.clone(),
            config: info.config,
            created_at: info.created_at,
            stats: info.stats,
        })
    }

    async fn pools(&self) -> Result<Vec<PoolInfo>, StoreError> {
        let ids = self.pool_ids().await?;
        // Issued together so that they travel pipelined on the shared connection.
        let infos = futures_util::future::join_all(ids.iter().map(|id| self.pool(id))).await;
        let mut pools = Vec::with_capacity(infos.len());
        for info in infos {
            match info {
                Ok(info) => pools.push(info),
                // Deleted between the listing and the read.
                Err(StoreError::PoolNotFound) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(pools)
    }

    async fn delete_pool(&self, pool: &PoolId) -> Result<(), StoreError> {
        // The script only renames the pool's keys out of the way (see delete_pool.lua);
        // freeing them happens below, outside any script. A fresh token per call keeps a
        // graveyard name from ever naming a key that exists.
        let token = format!("{:016x}", rand::random::<u64>());
        let value = self
            .eval_with(&self.scripts.delete_pool, pool, Some(&token), &[])
            .await?;
        let mut srem = redis::cmd("SREM");
        srem.arg(self.registry_key()).arg(pool.as_str());
        self.command(srem).await?;
        let DeletePoolReply { graveyard } = DeletePoolReply::decode(value)?;
        let graveyard = graveyard.ok_or(StoreError::PoolNotFound)?;
        if !graveyard.is_empty() {
            // UNLINK takes a key out at once and leaves freeing a large value to Redis's
            // background thread. Every graveyard key shares the pool's hash slot, so one
            // command frees them all, on a cluster too.
            // The pool is gone for every reader already: a failure here leaves keys that
            // expire by themselves (see delete_pool.lua), not a half-deleted pool.
            let mut unlink = redis::cmd("UNLINK");
            unlink.arg(&graveyard);
            if let Err(error) = self.command(unlink).await {
                tracing::warn!(pool = pool.as_str(), %error, "could not free a deleted pool's keys; they expire within a day");
            }
        }
        Ok(())
    }

    async fn add_members(&self, pool: &PoolId, seed: &Seed) -> Result<SeedReport, StoreError> {
        let sizer = &self.chunks.seed;
        let mut report = SeedReport::default();
        // Every chunk after the first starts its new members at the count the first one
        // used, and a dry run's chunks count what the earlier ones would have added.
        let mut start = seed.assignments;
        let mut pending_adds = seed.pending_adds;
        for chunk in sizer.chunks(&seed.members) {
            let started = Instant::now();
            let part = self
                .seed_chunk(pool, seed, chunk, start, pending_adds)
                .await?;
            sizer.record(chunk.len(), started.elapsed());
            start = Some(part.start_assignments);
            if seed.dry_run {
                pending_adds += part.added.len() as u64;
            }
            report.start_assignments = part.start_assignments;
            report.added.extend(part.added);
            report.existing.extend(part.existing);
            report.full.extend(part.full);
        }
        Ok(report)
    }

    async fn members(
        &self,
        pool: &PoolId,
        filter: StateFilter,
        limit: usize,
        cursor: Cursor,
    ) -> Result<MemberPage, StoreError> {
        // One more than a page from each set tells the merge whether more pages follow.
        let wanted = |on: bool| if on { limit + 1 } else { 0 };
        let (mut eligible_left, mut ineligible_left) = match filter {
            StateFilter::Eligible => (wanted(true), 0),
            StateFilter::Ineligible => (0, wanted(true)),
            StateFilter::All => (wanted(true), wanted(true)),
        };
        let mut eligible = Vec::with_capacity(eligible_left);
        let mut ineligible = Vec::with_capacity(ineligible_left);
        // A page is read in pieces of at most LISTING_PIECE members of each set, one script
        // call each, so that a page of 1,000 members with their health never makes one long
        // script. A page is a position, not a snapshot (see `Cursor`), so members moving
        // between two pieces are no different from members moving between two pages.
        loop {
            let take = |left: usize| left.min(LISTING_PIECE);
            let (eligible_count, ineligible_count) = (take(eligible_left), take(ineligible_left));
            let args = [
                (cursor.eligible + eligible.len() as u64).to_string(),
                (cursor.ineligible + ineligible.len() as u64).to_string(),
                eligible_count.to_string(),
                ineligible_count.to_string(),
            ];
            let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
            let value = self.eval(&self.scripts.members, pool, &args).await?;
            let piece = MembersReply::decode(value)?;
            // A set that gave fewer than asked has nothing more.
            eligible_left = if piece.eligible.len() < eligible_count {
                0
            } else {
                eligible_left - eligible_count
            };
            ineligible_left = if piece.ineligible.len() < ineligible_count {
                0
            } else {
                ineligible_left - ineligible_count
            };
            eligible.extend(piece.eligible);
            ineligible.extend(piece.ineligible);
            if eligible_left == 0 && ineligible_left == 0 {
                break;
            }
        }
        Ok(crate::store::merge_page(
            eligible, ineligible, limit, cursor,
        ))
    }

    async fn disable_members(
        &self,
        pool: &PoolId,
        members: &[MemberId],
        reason: &str,
    ) -> Result<DisableReport, StoreError> {
        let sizer = &self.chunks.disable;
        let mut report = DisableReport::default();
        for chunk in sizer.chunks(members) {
            let started = Instant::now();
            let value = self
                .member_script(&self.scripts.disable, pool, reason.as_bytes(), chunk)
                .await?;
            sizer.record(chunk.len(), started.elapsed());
            let DisableReply(outcomes) = DisableReply::decode(value, chunk.len())?;
            for (member, outcome) in chunk.iter().zip(outcomes) {
                match outcome {
                    DisableOutcome::Disabled => report.disabled.push(member.clone()),
                    DisableOutcome::AlreadyIneligible => {
                        report.already_ineligible.push(member.clone());
                    }
                    DisableOutcome::Unknown => report.unknown.push(member.clone()),
                }
            }
        }
        Ok(report)
    }

    async fn enable_members(
        &self,
        pool: &PoolId,
        members: &[MemberId],
        restore: Option<RestorePolicy>,
    ) -> Result<EnableReport, StoreError> {
        let sizer = &self.chunks.enable;
        let policy = restore.map(RestorePolicy::as_str).unwrap_or("");
        let mut report: Option<EnableReport> = None;
        for chunk in sizer.chunks(members) {
            let started = Instant::now();
            let value = self
                .member_script(&self.scripts.enable, pool, policy.as_bytes(), chunk)
                .await?;
            sizer.record(chunk.len(), started.elapsed());
            let reply = EnableReply::decode(value, chunk.len())?;
            let report = report.get_or_insert_with(|| EnableReport {
                restore: reply.restore,
                enabled: Vec::new(),
                already_eligible: Vec::new(),
                unknown: Vec::new(),
            });
            for (member, outcome) in chunk.iter().zip(reply.outcomes) {
                match outcome {
                    EnableOutcome::Enabled {
                        kept_assignments,
                        assignments,
                    } => report.enabled.push(Restored {
                        member: member.clone(),
                        kept_assignments,
                        assignments,
                    }),
                    EnableOutcome::AlreadyEligible => report.already_eligible.push(member.clone()),
                    EnableOutcome::Unknown => report.unknown.push(member.clone()),
                }
            }
        }
        // The chunks always hold at least one step, which answered or failed above.
        report.ok_or(StoreError::PoolNotFound)
    }

    async fn remove_members(
        &self,
        pool: &PoolId,
        members: &[MemberId],
    ) -> Result<RemoveReport, StoreError> {
        let sizer = &self.chunks.remove;
        let mut report = RemoveReport::default();
        for chunk in sizer.chunks(members) {
            let args: Vec<&[u8]> = chunk.iter().map(|m| m.as_str().as_bytes()).collect();
            let started = Instant::now();
            let value = self.eval(&self.scripts.remove, pool, &args).await?;
            sizer.record(chunk.len(), started.elapsed());
            let RemoveReply(removed) = RemoveReply::decode(value, chunk.len())?;
            for (member, removed) in chunk.iter().zip(removed) {
                if removed {
                    report.removed.push(member.clone());
                } else {
                    report.unknown.push(member.clone());
                }
            }
        }
        Ok(report)
    }
}
