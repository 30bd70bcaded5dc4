//! The operations of the `Store` trait on Redis: each one builds its script's arguments,
//! runs it and turns its reply into the trait's types.

use std::time::Duration;

use async_trait::async_trait;
use redis::{Script, Value};

use super::RedisStore;
use super::reply::{
    self, AssignReply, ClaimCheckReply, DeletePoolReply, DisableOutcome, DisableReply,
    EnableOutcome, EnableReply, MembersReply, OutcomesReply, PoolInfoReply, PutPoolReply,
    ReleaseReply, RemoveReply, RenewReply, SeedOutcome, SeedReply, SweepReply,
};
use crate::domain::{LabelFilter, LeaseId, LeaseTtl, MemberId, PoolConfig, PoolId, RestorePolicy};
use crate::store::{
    AssignRequest, Assignment, CheckRound, Cursor, DisableReport, EnableReport, Lease,
    MAX_LABEL_CHECKS, MAX_LISTING_SCAN, MAX_PROBES_PER_ROUND, MemberPage, PoolInfo, PutPool,
    RECLAIM_ON_ASSIGN, RETURN_ON_ASSIGN, RemoveReport, Renewed, Report, ReportSource,
    ReportSummary, Restored, SWEEP_BATCH, Seed, SeedReport, StateFilter, Store, StoreError,
    StoreStatus, Swept,
};

/// The batch sizes every assign passes to its script, written out once rather than on
/// every call of the hot path.
static ASSIGN_BATCHES: std::sync::LazyLock<[String; 3]> = std::sync::LazyLock::new(|| {
    [
        RECLAIM_ON_ASSIGN.to_string(),
        RETURN_ON_ASSIGN.to_string(),
        MAX_LABEL_CHECKS.to_string(),
    ]
});

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

    /// A page of a listing with a label filter (see [`Store::members`]).
    async fn labelled_members(
        &self,
        pool: &PoolId,
        filter: StateFilter,
        labels: &LabelFilter,
        limit: usize,
        cursor: Cursor,
    ) -> Result<MemberPage, StoreError> {
        let offset = cursor.eligible.to_string();
        let flag = |on: bool| -> &'static [u8] { if on { b"1" } else { b"0" } };
        let size = limit.to_string();
        let scan = MAX_LISTING_SCAN.to_string();
        let groups = labels.script_args();
        let mut args: Vec<&[u8]> = vec![
            offset.as_bytes(),
            b"0",
            flag(filter != StateFilter::Ineligible),
            flag(filter != StateFilter::Eligible),
            size.as_bytes(),
            scan.as_bytes(),
        ];
        args.extend(groups.iter().map(|group| group.as_bytes()));
        let value = self.eval(&self.scripts.members, pool, &args).await?;
        let page = MembersReply::decode(value)?;
        Ok(crate::store::labelled_page(
            page.eligible,
            page.ineligible,
            labels,
            page.next,
        ))
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

    async fn assign(
        &self,
        pool: &PoolId,
        request: &AssignRequest,
    ) -> Result<Assignment, StoreError> {
        // The id is drawn for every assign, used only on least-in-flight pools: deciding
        // here would need the pool's policy, which only the script reads.
        let id = LeaseId::random();
        let ttl_arg = request
            .ttl
            .map(|t| t.as_millis().to_string())
            .unwrap_or_default();
        let [reclaim, returns, checks] = &*ASSIGN_BATCHES;
        let groups = request.labels.script_args();
        let mut args: Vec<&[u8]> = Vec::with_capacity(5 + groups.len());
        args.extend([
            id.as_str().as_bytes(),
            ttl_arg.as_bytes(),
            reclaim.as_bytes(),
            returns.as_bytes(),
            checks.as_bytes(),
        ]);
        args.extend(groups.iter().map(|group| group.as_bytes()));
        let value = self.eval(&self.scripts.assign, pool, &args).await?;
        Ok(match AssignReply::decode(value)? {
            AssignReply::TooCostly => return Err(StoreError::FilterTooCostly),
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
        let value = self.eval(&self.scripts.delete_pool, pool, &[]).await?;
        let mut srem = redis::cmd("SREM");
        srem.arg(self.registry_key()).arg(pool.as_str());
        self.command(srem).await?;
        match DeletePoolReply::decode(value)? {
            DeletePoolReply { existed: true } => Ok(()),
            DeletePoolReply { existed: false } => Err(StoreError::PoolNotFound),
        }
    }

    async fn add_members(&self, pool: &PoolId, seed: &Seed) -> Result<SeedReport, StoreError> {
        let start = seed.assignments.map(|n| n.to_string()).unwrap_or_default();
        let flag = |on: bool| -> &'static [u8] { if on { b"1" } else { b"0" } };
        let pending = seed.pending_adds.to_string();
        let labelled = !seed.labels.is_empty();
        // Each member named in `labels` is followed by its labels text, every other one by
        // `~` (keep what it has): see seed.lua.
        let texts: Vec<String> = if labelled {
            seed.members
                .iter()
                .map(|m| {
                    seed.labels
                        .get(m)
                        .map_or_else(|| "~".to_owned(), |l| l.script_text())
                })
                .collect()
        } else {
            Vec::new()
        };
        let mut args: Vec<&[u8]> = Vec::with_capacity(seed.members.len() * 2 + 5);
        args.push(start.as_bytes());
        args.push(flag(seed.reset));
        args.push(flag(seed.dry_run));
        args.push(pending.as_bytes());
        args.push(flag(labelled));
        if labelled {
            for (member, text) in seed.members.iter().zip(&texts) {
                args.push(member.as_str().as_bytes());
                args.push(text.as_bytes());
            }
        } else {
            args.extend(seed.members.iter().map(|m| m.as_str().as_bytes()));
        }
        let value = self.eval(&self.scripts.seed, pool, &args).await?;
        let reply = SeedReply::decode(value, seed.members.len())?;
        let mut report = SeedReport {
            added: Vec::new(),
            existing: Vec::new(),
            full: Vec::new(),
            start_assignments: reply.start_assignments,
        };
        for (member, outcome) in seed.members.iter().zip(reply.outcomes) {
            match outcome {
                SeedOutcome::Added => report.added.push(member.clone()),
                SeedOutcome::Full => report.full.push(member.clone()),
                SeedOutcome::Existing => report.existing.push(member.clone()),
            }
        }
        Ok(report)
    }

    async fn members(
        &self,
        pool: &PoolId,
        filter: StateFilter,
        labels: &LabelFilter,
        limit: usize,
        cursor: Cursor,
    ) -> Result<MemberPage, StoreError> {
        if !labels.is_empty() {
            return self
                .labelled_members(pool, filter, labels, limit, cursor)
                .await;
        }
        // One more than a page from each set tells the merge whether more pages follow.
        let page = (limit + 1).to_string();
        let (eligible_count, ineligible_count) = match filter {
            StateFilter::Eligible => (page.as_str(), "0"),
            StateFilter::Ineligible => ("0", page.as_str()),
            StateFilter::All => (page.as_str(), page.as_str()),
        };
        let offsets = [cursor.eligible.to_string(), cursor.ineligible.to_string()];
        let args: [&[u8]; 4] = [
            offsets[0].as_bytes(),
            offsets[1].as_bytes(),
            eligible_count.as_bytes(),
            ineligible_count.as_bytes(),
        ];
        let value = self.eval(&self.scripts.members, pool, &args).await?;
        let page = MembersReply::decode(value)?;
        Ok(crate::store::merge_page(
            page.eligible,
            page.ineligible,
            limit,
            cursor,
        ))
    }

    async fn disable_members(
        &self,
        pool: &PoolId,
        members: &[MemberId],
        reason: &str,
    ) -> Result<DisableReport, StoreError> {
        let value = self
            .member_script(&self.scripts.disable, pool, reason.as_bytes(), members)
            .await?;
        let DisableReply(outcomes) = DisableReply::decode(value, members.len())?;
        let mut report = DisableReport::default();
        for (member, outcome) in members.iter().zip(outcomes) {
            match outcome {
                DisableOutcome::Disabled => report.disabled.push(member.clone()),
                DisableOutcome::AlreadyIneligible => report.already_ineligible.push(member.clone()),
                DisableOutcome::Unknown => report.unknown.push(member.clone()),
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
        let policy = restore.map(RestorePolicy::as_str).unwrap_or("");
        let value = self
            .member_script(&self.scripts.enable, pool, policy.as_bytes(), members)
            .await?;
        let reply = EnableReply::decode(value, members.len())?;
        let mut report = EnableReport {
            restore: reply.restore,
            enabled: Vec::new(),
            already_eligible: Vec::new(),
            unknown: Vec::new(),
        };
        for (member, outcome) in members.iter().zip(reply.outcomes) {
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
        Ok(report)
    }

    async fn remove_members(
        &self,
        pool: &PoolId,
        members: &[MemberId],
    ) -> Result<RemoveReport, StoreError> {
        let mut args: Vec<&[u8]> = Vec::with_capacity(members.len());
        args.extend(members.iter().map(|m| m.as_str().as_bytes()));
        let value = self.eval(&self.scripts.remove, pool, &args).await?;
        let RemoveReply(removed) = RemoveReply::decode(value, members.len())?;
        let mut report = RemoveReport::default();
        for (member, removed) in members.iter().zip(removed) {
            if removed {
                report.removed.push(member.clone());
            } else {
                report.unknown.push(member.clone());
            }
        }
        Ok(report)
    }
}
