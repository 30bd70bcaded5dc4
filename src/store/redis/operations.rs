//! The operations of the `Store` trait on Redis: each one builds its script's arguments,
//! runs it and turns its reply into the trait's types.

use std::time::Duration;

use async_trait::async_trait;
use redis::{Script, Value};

use super::RedisStore;
use super::reply::{self, SetPage, lease_found, lease_times, member_views, unexpected};
use crate::domain::{LeaseId, LeaseTtl, MemberId, PoolConfig, PoolId, RestorePolicy, Timestamp};
use crate::store::{
    Assignment, CheckRound, Cursor, DisableReport, Effect, EnableReport, Lease,
    MAX_PROBES_PER_ROUND, MemberPage, PoolInfo, PoolStats, PutPool, REAP_BATCH, REAP_ON_ASSIGN,
    RETURN_ON_ASSIGN, RemoveReport, Renewed, Report, ReportSource, ReportSummary, Restored, Seed,
    SeedReport, StateFilter, Store, StoreError, StoreStatus, Swept,
};

/// The batch sizes every assign passes to its script, written out once rather than on
/// every call of the hot path.
static ASSIGN_BATCHES: std::sync::LazyLock<[String; 2]> =
    std::sync::LazyLock::new(|| [REAP_ON_ASSIGN.to_string(), RETURN_ON_ASSIGN.to_string()]);

/// Most reaper steps one sweep runs on one pool, so that a sweep always ends.
const MAX_REAP_STEPS: u64 = 64;

impl RedisStore {
    /// Every registered pool id, in id order.
    async fn pool_ids(&self) -> Result<Vec<PoolId>, StoreError> {
        let mut smembers = redis::cmd("SMEMBERS");
        smembers.arg(self.registry_key());
        let ids = reply::array(self.command(smembers).await?)?;
        let mut ids: Vec<PoolId> = ids
            .into_iter()
            .filter_map(|v| reply::string(v).ok())
            .filter_map(|s| PoolId::parse(&s).ok())
            .collect();
        ids.sort();
        Ok(ids)
    }

    /// Sweep steps on one pool until it has no expired lease and no due return left (or
    /// the step budget is spent; the next sweep goes on).
    async fn sweep_pool(&self, pool: &PoolId) -> Result<Swept, StoreError> {
        let batch = REAP_BATCH.to_string();
        let mut swept = Swept::default();
        for _ in 0..MAX_REAP_STEPS {
            let value = self
                .eval(&self.scripts.reap, pool, &[batch.as_bytes()])
                .await?;
            let (reclaimed, returned) = match reply::pool_status(value) {
                Ok(mut items) => (
                    reply::count(&reply::next(&mut items)?)?,
                    reply::count(&reply::next(&mut items)?)?,
                ),
                // Deleted between the listing and the step.
                Err(StoreError::PoolNotFound) => (0, 0),
                Err(e) => return Err(e),
            };
            swept = swept
                + Swept {
                    reclaimed,
                    returned,
                };
            if reclaimed < REAP_BATCH && returned < REAP_BATCH {
                break;
            }
        }
        Ok(swept)
    }

    async fn member_script(
        &self,
        script: &Script,
        pool: &PoolId,
        first: &[u8],
        members: &[MemberId],
    ) -> Result<std::vec::IntoIter<Value>, StoreError> {
        let mut args: Vec<&[u8]> = Vec::with_capacity(members.len() + 1);
        args.push(first);
        args.extend(members.iter().map(|m| m.as_str().as_bytes()));
        let value = self.eval(script, pool, &args).await?;
        reply::pool_status(value)
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
        let [reap, returns] = &*ASSIGN_BATCHES;
        let args: [&[u8]; 4] = [
            id.as_str().as_bytes(),
            ttl_arg.as_bytes(),
            reap.as_bytes(),
            returns.as_bytes(),
        ];
        let value = self.eval(&self.scripts.assign, pool, &args).await?;
        let mut items = reply::array(value)?.into_iter();
        let status = reply::int(&reply::next(&mut items)?)?;
        if status == -1 {
            return Err(StoreError::PoolNotFound);
        }
        if status == 0 {
            // The wait can be 0 or below when more members are due than one assign returns.
            let next_return = items
                .next()
                .map(|ms| reply::int(&ms))
                .transpose()?
                .map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0)));
            return Ok(Assignment::Empty { next_return });
        }
        let member = MemberId::from_stored(reply::string(reply::next(&mut items)?)?);
        let assignments = reply::count(&reply::next(&mut items)?)?;
        if status == 1 {
            return Ok(Assignment::Assigned {
                member,
                assignments,
            });
        }
        let in_flight = reply::count(&reply::next(&mut items)?)?;
        let (expires_at, ttl_ms) = lease_times(&mut items)?;
        Ok(Assignment::Leased {
            member,
            assignments,
            in_flight,
            lease: Lease {
                id,
                expires_at,
                ttl_ms,
            },
        })
    }

    async fn release(&self, pool: &PoolId, lease: &LeaseId) -> Result<(), StoreError> {
        let value = self
            .eval(&self.scripts.release, pool, &[lease.as_str().as_bytes()])
            .await?;
        let mut items = reply::pool_status(value)?;
        lease_found(&mut items)
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
        let mut items = reply::pool_status(value)?;
        lease_found(&mut items)?;
        let member = MemberId::from_stored(reply::string(reply::next(&mut items)?)?);
        let (expires_at, ttl_ms) = lease_times(&mut items)?;
        Ok(Renewed {
            member,
            lease: Lease {
                id: lease.clone(),
                expires_at,
                ttl_ms,
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
        let mut args: Vec<&[u8]> = Vec::with_capacity(reports.len() * 3 + 2);
        args.push(source.as_str().as_bytes());
        args.push(draw.as_bytes());
        for report in reports {
            args.push(report.member.as_str().as_bytes());
            args.push(report.result.as_str().as_bytes());
            args.push(report.detail.as_bytes());
        }
        let value = self.eval(&self.scripts.outcomes, pool, &args).await?;
        let mut items = reply::pool_status(value)?;
        let outcomes = reply::array(reply::next(&mut items)?)?;
        let mut summary = ReportSummary::default();
        for (report, outcome) in reports.iter().zip(outcomes.chunks(2)) {
            let [effect, streak] = outcome else {
                return Err(unexpected("outcome too short"));
            };
            let effect = match reply::int(effect)? {
                0 => {
                    summary.unknown.push(report.member.clone());
                    continue;
                }
                1 => Effect::Counted,
                2 => Effect::Tripped,
                3 => Effect::Ignored,
                _ => Effect::Returned,
            };
            summary.applied.push((
                report.member.clone(),
                report.result,
                effect,
                reply::count(streak)?,
            ));
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
        let mut items = reply::pool_status(value)?;
        if reply::int(&reply::next(&mut items)?)? == 0 {
            return Ok(None);
        }
        let members = |value: Value| -> Result<Vec<MemberId>, StoreError> {
            reply::array(value)?
                .into_iter()
                .map(|m| reply::string(m).map(MemberId::from_stored))
                .collect()
        };
        Ok(Some(CheckRound {
            eligible: members(reply::next(&mut items)?)?,
            cooling: members(reply::next(&mut items)?)?,
        }))
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
        let created = match reply::int(&value)? {
            -2 => return Err(StoreError::PolicyChangeRequiresEmptyPool),
            status => status == 1,
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
        let mut items = reply::pool_status(value)?;
        let config_json = reply::string(reply::next(&mut items)?)?;
        let config: PoolConfig = serde_json::from_str(&config_json)
            .map_err(|_| unexpected("pool configuration is not valid JSON"))?;
        let created_ms = reply::optional_count(&reply::next(&mut items)?)?.unwrap_or(0);
        let total_assignments = reply::optional_count(&reply::next(&mut items)?)?.unwrap_or(0);
        let eligible = reply::count(&reply::next(&mut items)?)?;
        let ineligible = reply::count(&reply::next(&mut items)?)?;
        let min_assignments = reply::optional_count(&reply::next(&mut items)?)?;
        let max_assignments = reply::optional_count(&reply::next(&mut items)?)?;
        let in_flight = reply::count(&reply::next(&mut items)?)?;
        let abandoned = reply::optional_count(&reply::next(&mut items)?)?.unwrap_or(0);
        let tripped = reply::optional_count(&reply::next(&mut items)?)?.unwrap_or(0);
        let recovered = reply::optional_count(&reply::next(&mut items)?)?.unwrap_or(0);
        Ok(PoolInfo {
            pool: pool.clone(),
            config,
            created_at: Timestamp(created_ms),
            stats: PoolStats {
                eligible,
                ineligible,
                min_assignments,
                max_assignments,
                total_assignments,
                in_flight,
                abandoned,
                tripped,
                recovered,
            },
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
        if reply::int(&value)? == 1 {
            Ok(())
        } else {
            Err(StoreError::PoolNotFound)
        }
    }

    async fn add_members(&self, pool: &PoolId, seed: &Seed) -> Result<SeedReport, StoreError> {
        let start = seed.assignments.map(|n| n.to_string()).unwrap_or_default();
        let flag = |on: bool| -> &'static [u8] { if on { b"1" } else { b"0" } };
        let pending = seed.pending_adds.to_string();
        let mut args: Vec<&[u8]> = Vec::with_capacity(seed.members.len() + 4);
        args.push(start.as_bytes());
        args.push(flag(seed.reset));
        args.push(flag(seed.dry_run));
        args.push(pending.as_bytes());
        args.extend(seed.members.iter().map(|m| m.as_str().as_bytes()));
        let value = self.eval(&self.scripts.seed, pool, &args).await?;
        let mut items = reply::pool_status(value)?;
        let start_assignments = reply::count(&reply::next(&mut items)?)?;
        let flags = reply::array(reply::next(&mut items)?)?;
        let mut report = SeedReport {
            added: Vec::new(),
            existing: Vec::new(),
            full: Vec::new(),
            start_assignments,
        };
        for (member, flag) in seed.members.iter().zip(flags) {
            match reply::int(&flag)? {
                1 => report.added.push(member.clone()),
                2 => report.full.push(member.clone()),
                _ => report.existing.push(member.clone()),
            }
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
        let mut items = reply::pool_status(value)?;
        let mut next = || reply::next(&mut items);
        let (eligible_pairs, ineligible_pairs) = (next()?, next()?);
        let infos = reply::array(next()?)?;
        let (eligible_live, ineligible_live) = (next()?, next()?);
        let (eligible_health, ineligible_health) = (next()?, next()?);
        let returns = next()?;
        let (eligible_checks, ineligible_checks) = (next()?, next()?);
        let eligible = member_views(
            SetPage {
                pairs: eligible_pairs,
                live: eligible_live,
                health: eligible_health,
                returns: None,
                checks: eligible_checks,
            },
            None,
        )?;
        let ineligible = member_views(
            SetPage {
                pairs: ineligible_pairs,
                live: ineligible_live,
                health: ineligible_health,
                returns: Some(returns),
                checks: ineligible_checks,
            },
            Some(infos),
        )?;
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
        let mut items = self
            .member_script(&self.scripts.disable, pool, reason.as_bytes(), members)
            .await?;
        let outcomes = reply::array(reply::next(&mut items)?)?;
        let mut report = DisableReport::default();
        for (member, outcome) in members.iter().zip(outcomes) {
            match reply::int(&outcome)? {
                1 => report.disabled.push(member.clone()),
                2 => report.already_ineligible.push(member.clone()),
                _ => report.unknown.push(member.clone()),
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
        let mut items = self
            .member_script(&self.scripts.enable, pool, policy.as_bytes(), members)
            .await?;
        let applied = reply::string(reply::next(&mut items)?)?;
        let restore = RestorePolicy::from_name(&applied)
            .ok_or_else(|| unexpected("unknown restore policy"))?;
        let outcomes = reply::array(reply::next(&mut items)?)?;
        let mut report = EnableReport {
            restore,
            enabled: Vec::new(),
            already_eligible: Vec::new(),
            unknown: Vec::new(),
        };
        for (member, outcome) in members.iter().zip(outcomes.chunks(3)) {
            let [status, kept, restored] = outcome else {
                return Err(unexpected("enable outcome too short"));
            };
            match reply::int(status)? {
                1 => report.enabled.push(Restored {
                    member: member.clone(),
                    kept_assignments: reply::count(kept)?,
                    assignments: reply::count(restored)?,
                }),
                2 => report.already_eligible.push(member.clone()),
                _ => report.unknown.push(member.clone()),
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
        let mut items = reply::pool_status(value)?;
        let outcomes = reply::array(reply::next(&mut items)?)?;
        let mut report = RemoveReport::default();
        for (member, outcome) in members.iter().zip(outcomes) {
            if reply::int(&outcome)? == 1 {
                report.removed.push(member.clone());
            } else {
                report.unknown.push(member.clone());
            }
        }
        Ok(report)
    }
}
