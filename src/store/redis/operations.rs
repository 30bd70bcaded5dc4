//! The operations of the `Store` trait on Redis: each one builds its script's arguments,
//! runs it and turns its reply into the trait's types.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use redis::{Script, Value};

use super::RedisStore;
use super::keys::{DELETE_KEY_PARTS, POOL_INFO_KEY_PARTS, POOL_KEY_PARTS};
use super::reply::{
    self, AssignDoneReply, AssignReply, ClaimCheckReply, ClaimDueReply, ClaimSourcesReply,
    DeletePoolReply, DisableOutcome, DisableReply, DoneReply, EnableOutcome, EnableReply,
    EndSessionReply, ExitsReply, MembersReply, OutcomesReply, PoolInfoReply, PruneReply,
    PutPoolReply, RecordSourceReply, ReleaseReply, RemoveReply, RenewReply, SeedOutcome, SeedReply,
    SessionAssignReply, SourceStatesReply, SweepReply, WalkReply,
};
use crate::domain::{
    AssignCount, ClientConfig, ClientId, LabelFilter, LeaseId, LeaseTtl, MAX_SESSIONS, MemberId,
    OutcomeResult, PoolConfig, PoolId, RestorePolicy, SessionId, SessionTtl, Target, Timestamp,
    TokenHash,
};
use crate::store::chunks::Started;
use crate::store::{
    Applied, AssignRequest, Assignment, BAN_CLEANUP, Batch, CHUNK_GRANULE, CheckRound,
    ClaimedSource, ClientRecord, Cursor, DisableReport, Done, DoneSummary, EnableReport, ExitSeen,
    FetchOutcome, Lease, MAX_BAN_TARGETS, MAX_BUCKETS, MAX_LABEL_CHECKS, MAX_LISTING_SCAN,
    MAX_PROBES_PER_ROUND, MemberPage, PRUNE_BATCH, PoolInfo, PoolPage, Pruned, PutClient, PutPool,
    RECLAIM_ON_ASSIGN, RETURN_ON_ASSIGN, RemoveReport, Renewed, Report, ReportSource,
    ReportSummary, Restored, SAFETY_NET_POOLS_PER_SWEEP, SWEEP_POOLS_PER_CALL, Seed, SeedOrigin,
    SeedReport, SessionAssignment, SessionPin, SessionRequest, SourceState, StateFilter, Store,
    StoreError, StoreStatus, Swept,
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

/// The ban bounds every outcome report passes to its script: [`MAX_BAN_TARGETS`] and
/// [`BAN_CLEANUP`].
static BAN_LIMITS: std::sync::LazyLock<[String; 2]> =
    std::sync::LazyLock::new(|| [MAX_BAN_TARGETS.to_string(), BAN_CLEANUP.to_string()]);

/// Most members of each set one call of `members.lua` reads: a page of a listing takes as
/// many calls as it needs.
const LISTING_PIECE: usize = 250;

/// Most steps one sweep runs on one pool, so that a sweep always ends: at the smallest step
/// (25 leases, see chunks.rs) 16,000 leases, about the 64 steps of 256 of a sweep before
/// steps were sized by their cost.
const MAX_SWEEP_STEPS: u64 = 640;

/// Most pools one take from the sweep's due index hands out; a sweep takes again while
/// takes come back full, up to [`SWEEP_POOLS_PER_CALL`].
const DUE_TAKE: usize = 512;

/// A source member's place in the seen set (see `prune.lua`): the source's id, then the
/// fetch that last listed it, in one score exact in a double (ids below 2^21).
fn seen_place(id: u64, fetch: u64) -> String {
    (id.saturating_mul(1 << 32) + fetch.min((1 << 32) - 1)).to_string()
}

/// The eight arguments `assign_done.lua` takes after the assign's (see that script).
struct DoneArgs {
    member: String,
    latency: String,
    lease: String,
    draw: std::borrow::Cow<'static, str>,
    result: &'static str,
    targeted: &'static str,
}

impl DoneArgs {
    fn of(done: &Done) -> Self {
        let report = done.report.as_ref();
        Self {
            member: report
                .and_then(|r| r.member.as_ref())
                .map(|m| m.as_str().to_owned())
                .unwrap_or_default(),
            latency: report
                .and_then(|r| r.latency_ms)
                .map(|ms| ms.to_string())
                .unwrap_or_default(),
            lease: done
                .lease
                .as_ref()
                .map(|l| l.as_str().to_owned())
                .unwrap_or_default(),
            // Only a failure can trip its member, and only a trip draws its cooldown: an
            // `ok` (the steady worker's) skips drawing and writing a random number.
            draw: match report.map(|r| r.result) {
                Some(OutcomeResult::Ok) | None => "0".into(),
                Some(_) => crate::store::jitter_draw().to_string().into(),
            },
            result: report.map_or("", |r| r.result.as_str()),
            targeted: if report.is_some_and(|r| r.target.is_some()) {
                "1"
            } else {
                ""
            },
        }
    }

    fn as_args(&self) -> [&[u8]; 8] {
        let [max_targets, cleanup] = &*BAN_LIMITS;
        [
            self.member.as_bytes(),
            self.result.as_bytes(),
            self.lease.as_bytes(),
            self.targeted.as_bytes(),
            self.draw.as_bytes(),
            max_targets.as_bytes(),
            cleanup.as_bytes(),
            self.latency.as_bytes(),
        ]
    }
}

/// An assign's reply without its leases' due hint, and that hint: an assign carrying
/// `done` lowers the pool's entry in the due index once, for the report's trip and the
/// leases together.
fn without_due_hint(reply: AssignReply) -> (AssignReply, Option<u64>) {
    match reply {
        AssignReply::Leased {
            expires_at,
            ttl_ms,
            members,
            due_hint,
        } => (
            AssignReply::Leased {
                expires_at,
                ttl_ms,
                due_hint: None,
                members,
            },
            due_hint,
        ),
        other => (other, None),
    }
}

/// The earlier of two due hints, or the one there is.
fn earlier(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// What `done` did, from what `assign_done.lua` replied about it.
fn done_summary(done: &Done, reply: DoneReply) -> DoneSummary {
    let mut summary = DoneSummary {
        released: reply.released,
        ..DoneSummary::default()
    };
    if let Some(report) = &done.report {
        // The member is the lease's when the report named none: the script read it from
        // the lease.
        let member = report.member.clone().or(reply.member);
        match (member, reply.report) {
            (Some(member), Some(Some((effect, streak, banned_until)))) => {
                summary.applied = Some(Applied {
                    member,
                    result: report.result,
                    effect,
                    streak,
                    banned_until,
                });
            }
            _ => summary.unknown = true,
        }
    }
    summary
}

/// The answer of an assign in `session` from its batch of at most one and the session's
/// state as the script left it.
fn session_assignment(
    session: &SessionRequest,
    ends_at: Option<Timestamp>,
    repinned: bool,
    batch: Batch,
) -> SessionAssignment {
    let assignment = batch
        .assigned
        .into_iter()
        .next()
        .unwrap_or(Assignment::Empty {
            next_return: batch.next_return,
        });
    SessionAssignment {
        assignment,
        session: ends_at.map(|expires_at| SessionPin {
            id: session.id.clone(),
            expires_at,
            repinned,
        }),
    }
}

impl RedisStore {
    /// Runs `assign.lua` for up to `count` members (one script call whatever the count).
    async fn assign_batch(
        &self,
        pool: &PoolId,
        request: &AssignRequest,
        count: AssignCount,
    ) -> Result<Batch, StoreError> {
        let (value, ids) = self.run_assign(pool, request, count, None, None).await?;
        self.batch_of(pool, AssignReply::decode(value)?, ids).await
    }

    /// Runs `assign.lua` once, in `session` when there is one (then for one member), or with
    /// `done`, `assign_done.lua`: the same pick (in the session too) after the worker's last
    /// outcome, in the same call; answers its reply and the lease ids it was given.
    async fn run_assign(
        &self,
        pool: &PoolId,
        request: &AssignRequest,
        count: AssignCount,
        session: Option<&SessionRequest>,
        done: Option<&Done>,
    ) -> Result<(Value, Vec<LeaseId>), StoreError> {
        // The ids are drawn for every assign, used only on least-in-flight pools: deciding
        // here would need the pool's policy, which only the script reads.
        let ids: Vec<LeaseId> = (0..count.get()).map(|_| LeaseId::random()).collect();
        let id_arg = match &ids[..] {
            [one] => std::borrow::Cow::Borrowed(one.as_str()),
            many => std::borrow::Cow::Owned(
                many.iter()
                    .map(LeaseId::as_str)
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
        };
        let ttl_arg = request
            .ttl
            .map(|t| t.as_millis().to_string())
            .unwrap_or_default();
        let [reclaim, returns, checks] = &*ASSIGN_BATCHES;
        let count_arg = match (session, count.get()) {
            // The session's ttl (0: the pool's), bound and the ttl of pools that never set
            // one; see assign.lua.
            (Some(session), _) => std::borrow::Cow::Owned(format!(
                "session {} {MAX_SESSIONS} {}",
                session.ttl.map_or(0, SessionTtl::as_millis),
                SessionTtl::DEFAULT_MS
            )),
            (None, 1) => std::borrow::Cow::Borrowed("1"),
            (None, n) => std::borrow::Cow::Owned(n.to_string()),
        };
        let groups = request.labels.script_args();
        // The excluded members, after the label groups: one argument, a newline before each
        // id (no label group starts with one; see assign.lua).
        let exclude_arg: String = request
            .exclude
            .iter()
            .flat_map(|member| ["\n", member.as_str()])
            .collect();
        let mut args: Vec<&[u8]> = Vec::with_capacity(7 + groups.len());
        args.extend([
            id_arg.as_bytes(),
            ttl_arg.as_bytes(),
            reclaim.as_bytes(),
            returns.as_bytes(),
            checks.as_bytes(),
            count_arg.as_bytes(),
        ]);
        args.extend(groups.iter().map(|group| group.as_bytes()));
        if !exclude_arg.is_empty() {
            args.push(exclude_arg.as_bytes());
        }
        let mut extra = match &request.target {
            Some(target) => self.target_keys(pool, target),
            None => Vec::new(),
        };
        if let Some(session) = session {
            extra.extend(self.session_keys(pool, &session.id));
        }
        // `done`'s arguments and its target's ban hash go last: the script takes them off
        // before the pick, which sees the assign's own.
        let done_args = done.map(DoneArgs::of);
        let script = match (done, &done_args) {
            (Some(done), Some(done_args)) => {
                if let Some(target) = done.report.as_ref().and_then(|r| r.target.as_ref()) {
                    extra.extend(self.ban_keys(pool, &[target]));
                }
                args.extend(done_args.as_args());
                &self.scripts.assign_done
            }
            _ => &self.scripts.assign,
        };
        // The client's rate limit goes after everything, the pool's buckets the last key: rate.lua
        // takes both off first (see there). Without a client, the call is as it was.
        let rate_arg = request.rate.as_ref().map(|limit| {
            extra.push(self.buckets_key(pool));
            format!(
                "\trate {} {} {} {} {}",
                limit.rate.rate_per_second,
                limit.rate.burst,
                match session {
                    Some(_) => 1,
                    None => count.get(),
                },
                MAX_BUCKETS,
                limit.client
            )
        });
        if let Some(rate_arg) = &rate_arg {
            args.push(rate_arg.as_bytes());
        }
        let value = self.eval_assign(script, pool, &extra, &args).await?;
        Ok((reply::rate_limited(value)?, ids))
    }

    /// The batch an assign's reply hands out, the i-th lease under the i-th of `ids`; lowers
    /// the pool's entry in the due index when the leases moved its due time earlier.
    async fn batch_of(
        &self,
        pool: &PoolId,
        reply: AssignReply,
        ids: Vec<LeaseId>,
    ) -> Result<Batch, StoreError> {
        Ok(match reply {
            AssignReply::TooCostly => return Err(StoreError::FilterTooCostly),
            AssignReply::Empty { next_return } => Batch {
                assigned: Vec::new(),
                next_return,
            },
            AssignReply::Assigned(members) => Batch {
                assigned: members
                    .into_iter()
                    .map(|(member, assignments)| Assignment::Assigned {
                        member,
                        assignments,
                    })
                    .collect(),
                next_return: None,
            },
            AssignReply::Leased {
                expires_at,
                ttl_ms,
                due_hint,
                members,
            } => {
                self.hint_due(pool, due_hint).await?;
                Batch {
                    assigned: members
                        .into_iter()
                        .zip(ids)
                        .map(
                            |((member, assignments, in_flight), id)| Assignment::Leased {
                                member,
                                assignments,
                                in_flight,
                                lease: Lease {
                                    id,
                                    expires_at,
                                    ttl_ms,
                                },
                            },
                        )
                        .collect(),
                    next_return: None,
                }
            }
        })
    }

    /// Takes up to `limit` due pools from the index at `key`, holding them for `hold`
    /// (removing them with a zero hold).
    async fn take_due(
        &self,
        key: &str,
        limit: usize,
        hold: Duration,
    ) -> Result<Vec<PoolId>, StoreError> {
        let limit = limit.to_string();
        let hold = hold.as_millis().to_string();
        let value = self
            .eval_on(
                &self.scripts.claim_due,
                &[key],
                &[limit.as_bytes(), hold.as_bytes()],
            )
            .await?;
        ClaimDueReply::decode(value).map(|ClaimDueReply(pools)| pools)
    }

    /// Sets `pool`'s entry in the index at `key` to `at` with `flag` (`LT`: lower or add;
    /// `XX`: only when present; `NX`: only when absent).
    async fn index(&self, key: &str, flag: &str, pool: &PoolId, at: u64) -> Result<(), StoreError> {
        let mut zadd = redis::cmd("ZADD");
        zadd.arg(key).arg(flag).arg(at).arg(pool.as_str());
        self.command(zadd).await.map(drop)
    }

    /// Removes `pool` from the index at `key`.
    async fn unindex(&self, key: &str, pool: &PoolId) -> Result<(), StoreError> {
        let mut zrem = redis::cmd("ZREM");
        zrem.arg(key).arg(pool.as_str());
        self.command(zrem).await.map(drop)
    }

    /// Lowers `pool`'s entry in the sweep's due index to a script's hint.
    async fn hint_due(&self, pool: &PoolId, hint: Option<u64>) -> Result<(), StoreError> {
        match hint {
            Some(at) => self.index(&self.due_key(), "LT", pool, at).await,
            None => Ok(()),
        }
    }

    /// One step of the safety net: the next [`SAFETY_NET_POOLS_PER_SWEEP`] pools of the
    /// registry are swept (which writes their exact `due` and puts them into the due index)
    /// and, when they have checks or sources, put into the check or source index unless
    /// they are there already.
    async fn safety_net(&self) -> Result<Swept, StoreError> {
        let pools = self.next_walked_pools().await?;
        let mut swept = Swept::default();
        for pool in pools {
            swept = swept + self.sweep_pool(&pool).await?;
            match self.pool(&pool).await {
                Ok(info) => {
                    if info.config.health.check.is_some() {
                        self.index(&self.checks_due_key(), "NX", &pool, 0).await?;
                    }
                    if !info.config.sources.is_empty() {
                        self.index(&self.sources_due_key(), "NX", &pool, 0).await?;
                    }
                }
                Err(StoreError::PoolNotFound) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(swept)
    }

    /// The pools of this replica's turn of the registry walk, which every replica shares
    /// (`walk.lua`): the next [`SAFETY_NET_POOLS_PER_SWEEP`] in id order, or none while
    /// another replica's turn lasts.
    async fn next_walked_pools(&self) -> Result<Vec<PoolId>, StoreError> {
        let count = SAFETY_NET_POOLS_PER_SWEEP.to_string();
        let turn = self.walk_turn.as_millis().to_string();
        let value = self
            .eval_on(
                &self.scripts.walk,
                &[&self.registry_key(), &self.walk_key()],
                &[count.as_bytes(), turn.as_bytes()],
            )
            .await?;
        WalkReply::decode(value).map(|WalkReply(pools)| pools)
    }

    /// Up to `limit` registered pool ids starting with `prefix`, after `after` when given,
    /// in id order: one `ZRANGE ... BYLEX`.
    async fn registry_range(
        &self,
        prefix: &str,
        after: Option<&PoolId>,
        limit: usize,
    ) -> Result<Vec<PoolId>, StoreError> {
        let min = match after {
            Some(after) if after.as_str() >= prefix => format!("({after}"),
            _ => format!("[{prefix}"),
        };
        // Pool ids are ASCII: no id that starts with the prefix sorts after `prefix\xff`.
        let mut max = b"[".to_vec();
        max.extend_from_slice(prefix.as_bytes());
        max.push(0xff);
        let mut zrange = redis::cmd("ZRANGE");
        zrange
            .arg(self.registry_key())
            .arg(min)
            .arg(if prefix.is_empty() {
                b"+".to_vec()
            } else {
                max
            })
            .arg("BYLEX")
            .arg("LIMIT")
            .arg(0)
            .arg(limit);
        reply::pool_ids(self.command(zrange).await?)
    }

    /// Copies the registry of an earlier version (a set) into this one's and removes it,
    /// a thousand pools a command: pools created by replicas of that version are listed,
    /// walked and counted from then on.
    pub(super) async fn adopt_legacy_registry(&self) -> Result<(), StoreError> {
        let legacy = self.legacy_registry_key();
        let mut cursor = 0;
        loop {
            let mut sscan = redis::cmd("SSCAN");
            sscan.arg(&legacy).arg(cursor).arg("COUNT").arg(1_000);
            let (next, pools) = reply::registry_page(self.command(sscan).await?)?;
            if !pools.is_empty() {
                let mut zadd = redis::cmd("ZADD");
                zadd.arg(self.registry_key());
                for pool in &pools {
                    zadd.arg(0).arg(pool.as_str());
                }
                self.command(zadd).await?;
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
        let mut unlink = redis::cmd("UNLINK");
        unlink.arg(&legacy);
        self.command(unlink).await.map(drop)
    }

    /// Sweep steps on one pool until it has no expired lease and no due return left (or
    /// the step budget is spent; the next sweep goes on), then puts the pool back into the
    /// due index at its next due time.
    async fn sweep_pool(&self, pool: &PoolId) -> Result<Swept, StoreError> {
        let sizer = &self.chunks.sweep;
        let mut swept = Swept::default();
        let mut next_due = None;
        let bound = self.chunk_bound();
        let steps = self.for_chunks();
        let mut step = 0;
        for _ in 0..MAX_SWEEP_STEPS {
            // Each step sized by where the steps before it stopped (see chunks.rs).
            let size = sizer.size();
            let batch = size as u64;
            let limit = batch.to_string();
            let started = self.chunk_start(pool, &mut step).await;
            let sent = Instant::now();
            let value = steps
                .eval(
                    &self.scripts.sweep,
                    pool,
                    &[bound[0].as_bytes(), bound[1].as_bytes(), limit.as_bytes()],
                )
                .await?;
            let took = sent.elapsed();
            let step = match SweepReply::decode(value) {
                Ok(step) => step,
                // Deleted since it was indexed: it leaves the index.
                Err(StoreError::PoolNotFound) => return Ok(swept),
                Err(e) => return Err(e),
            };
            let full = step.swept.reclaimed == batch || step.swept.returned == batch;
            let done =
                usize::try_from(step.swept.reclaimed + step.swept.returned).unwrap_or(usize::MAX);
            if step.stopped {
                // The size it reached before its bound sizes the next step.
                self.chunks
                    .ran_bounded(started, sizer, (size, done.max(1)), took);
            } else if full {
                // Ran whole: the next may be twice as large.
                self.chunks.ran_bounded(started, sizer, (size, size), took);
            } else {
                // The pool's last step says nothing of the size.
                self.chunks.ran_piece(started, took);
            }
            swept = swept + step.swept;
            next_due = step.next_due;
            if !step.stopped && !full {
                break;
            }
        }
        // `LT`: a hint sent since the step may already have put an earlier time there.
        self.hint_due(pool, next_due).await?;
        Ok(swept)
    }

    /// A page of a listing with a label filter (see [`Store::members`]), with bans when
    /// `ban_keys` holds a target's.
    async fn labelled_members(
        &self,
        pool: &PoolId,
        filter: StateFilter,
        labels: &LabelFilter,
        ban_keys: &[String],
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
        let value = self
            .eval_keyed(&self.scripts.members, pool, None, ban_keys, &args)
            .await?;
        let page = MembersReply::decode(value, !ban_keys.is_empty())?;
        Ok(crate::store::labelled_page(
            page.eligible,
            page.ineligible,
            labels,
            page.next,
        ))
    }

    /// One chunk of a seeding: `members` (part of `seed.members`) with the starting count
    /// and pending adds the earlier chunks left; what it did and how long the script ran.
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
        // Each member is followed by its operator labels text when the call gives any, then
        // by its labels from the GeoIP file when the call gives any; a member the call
        // gives none for by `~` (keep what it has): see seed.lua.
        let texts_per_member: usize = if !seed.geo.is_empty() {
            2
        } else {
            usize::from(!seed.labels.is_empty())
        };
        let text_of = |given: &std::collections::HashMap<MemberId, crate::domain::Labels>,
                       member: &MemberId| {
            given
                .get(member)
                .map_or_else(|| "~".to_owned(), |l| l.script_text())
        };
        let texts: Vec<[String; 2]> = if texts_per_member > 0 {
            members
                .iter()
                .map(|m| [text_of(&seed.labels, m), text_of(&seed.geo, m)])
                .collect()
        } else {
            Vec::new()
        };
        let (origin, seen) = match seed.origin {
            SeedOrigin::Manual => (String::new(), String::new()),
            SeedOrigin::Import => ("i".to_owned(), String::new()),
            SeedOrigin::Source { id, fetch } => (format!("s{id}"), seen_place(id, fetch)),
        };
        let bound = self.chunk_bound();
        let texts_flag = texts_per_member.to_string();
        let mut args: Vec<&[u8]> = Vec::with_capacity(members.len() * 3 + 9);
        args.extend(bound.iter().map(|a| a.as_bytes()));
        args.push(start.as_bytes());
        args.push(flag(seed.reset));
        args.push(flag(seed.dry_run));
        args.push(pending.as_bytes());
        args.push(texts_flag.as_bytes());
        args.push(origin.as_bytes());
        args.push(seen.as_bytes());
        if texts_per_member > 0 {
            for (member, [labels, geo]) in members.iter().zip(&texts) {
                args.push(member.as_str().as_bytes());
                args.push(labels.as_bytes());
                if texts_per_member == 2 {
                    args.push(geo.as_bytes());
                }
            }
        } else {
            args.extend(members.iter().map(|m| m.as_str().as_bytes()));
        }
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

    /// Runs a chunk script (see `chunk.lua`) named `name` whose arguments after the bound
    /// are `first`, when given, then member ids; its reply.
    async fn member_script(
        &self,
        script: &Script,
        pool: &PoolId,
        first: Option<&[u8]>,
        members: &[MemberId],
    ) -> Result<Value, StoreError> {
        let bound = self.chunk_bound();
        let mut args: Vec<&[u8]> = Vec::with_capacity(members.len() + 3);
        args.extend(bound.iter().map(|a| a.as_bytes()));
        args.extend(first);
        args.extend(members.iter().map(|m| m.as_str().as_bytes()));
        self.eval(script, pool, &args).await
    }

    /// A handle for a large operation's chunks: the same store, whose calls do not count
    /// as calls in flight (see `chunks.rs`), so that a chunk is contended only by others.
    fn for_chunks(&self) -> Self {
        Self {
            foreground: false,
            ..self.clone()
        }
    }

    /// Waits out the rest the store is owed before the chunk `step` of a call on `pool`
    /// (counted from zero, and counted on), reads what Redis has received when a reading is
    /// due (see `RemoteLoad` in chunks.rs), and notes how the chunk starts.
    ///
    /// A call's first chunk reads nothing: most calls (a sweep of one pool, a small
    /// disable) are one chunk, and a reading before each would double their commands. A
    /// reading that fails (a Redis that refuses `INFO` to this user, say) leaves the chunk
    /// to this replica's own count: a large operation never fails for it.
    pub(super) async fn chunk_start(&self, pool: &PoolId, step: &mut usize) -> Started {
        let started = self.chunks.rest().await;
        let load = &self.chunks.load;
        let first = *step == 0;
        *step += 1;
        if !first && load.due(pool, tokio::time::Instant::now()) {
            match self.for_chunks().received(pool).await {
                Ok(received) => {
                    load.read(pool, tokio::time::Instant::now(), received);
                }
                Err(error) => {
                    tracing::debug!(pool = pool.as_str(), %error, "could not read what Redis received");
                }
            }
        }
        started.others_busy(load.busy(pool))
    }

    /// How many bytes the Redis that serves `pool` has received from all its clients.
    async fn received(&self, pool: &PoolId) -> Result<u64, StoreError> {
        let value = self
            .eval_parts(&self.scripts.received, pool, &[POOL_KEY_PARTS[0]], &[])
            .await?;
        reply::received(value)
    }

    /// The two arguments every chunk script starts with (see `chunk.lua`): how many
    /// microseconds it may run, and how many members it handles between two looks at the
    /// clock.
    fn chunk_bound(&self) -> [String; 2] {
        [
            self.chunks.bound().as_micros().to_string(),
            CHUNK_GRANULE.to_string(),
        ]
    }
}

#[async_trait]
impl Store for RedisStore {
    fn name(&self) -> &'static str {
        "redis"
    }

    async fn put_client(
        &self,
        id: &ClientId,
        config: &ClientConfig,
        token: TokenHash,
    ) -> Result<PutClient, StoreError> {
        self.put_client_record(id, config, token).await
    }

    async fn rotate_client_token(&self, id: &ClientId, token: TokenHash) -> Result<(), StoreError> {
        self.rotate_client_record(id, token).await
    }

    async fn client(&self, id: &ClientId) -> Result<ClientRecord, StoreError> {
        self.client_record(id).await
    }

    async fn clients(&self) -> Result<Vec<ClientRecord>, StoreError> {
        self.client_records().await
    }

    async fn delete_client(&self, id: &ClientId) -> Result<(), StoreError> {
        self.delete_client_record(id).await
    }

    async fn client_by_token(&self, token: TokenHash) -> Result<Option<ClientRecord>, StoreError> {
        self.client_record_by_token(token).await
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
        let batch = self.assign_batch(pool, request, AssignCount::ONE).await?;
        Ok(batch
            .assigned
            .into_iter()
            .next()
            .unwrap_or(Assignment::Empty {
                next_return: batch.next_return,
            }))
    }

    async fn assign_several(
        &self,
        pool: &PoolId,
        request: &AssignRequest,
        count: AssignCount,
    ) -> Result<Batch, StoreError> {
        self.assign_batch(pool, request, count).await
    }

    async fn assign_after_done(
        &self,
        pool: &PoolId,
        done: &Done,
        request: &AssignRequest,
        count: AssignCount,
    ) -> Result<(Batch, DoneSummary), StoreError> {
        let (value, ids) = self
            .run_assign(pool, request, count, None, Some(done))
            .await?;
        let AssignDoneReply { done: reply, pick } = AssignDoneReply::decode(value)?;
        let (pick, leases_due) = without_due_hint(pick);
        self.hint_due(pool, earlier(reply.due_hint, leases_due))
            .await?;
        let batch = self.batch_of(pool, pick, ids).await?;
        Ok((batch, done_summary(done, reply)))
    }

    async fn assign_in_session(
        &self,
        pool: &PoolId,
        request: &AssignRequest,
        session: &SessionRequest,
    ) -> Result<SessionAssignment, StoreError> {
        let (value, ids) = self
            .run_assign(pool, request, AssignCount::ONE, Some(session), None)
            .await?;
        match SessionAssignReply::decode(value)? {
            SessionAssignReply::TooManySessions => Err(StoreError::TooManySessions),
            SessionAssignReply::Answered {
                ends_at,
                repinned,
                reply,
            } => {
                let batch = self.batch_of(pool, reply, ids).await?;
                Ok(session_assignment(session, ends_at, repinned, batch))
            }
        }
    }

    async fn assign_in_session_after_done(
        &self,
        pool: &PoolId,
        done: &Done,
        request: &AssignRequest,
        session: &SessionRequest,
    ) -> Result<(SessionAssignment, DoneSummary), StoreError> {
        let (value, ids) = self
            .run_assign(pool, request, AssignCount::ONE, Some(session), Some(done))
            .await?;
        let AssignDoneReply { done: reply, pick } = AssignDoneReply::decode_in_session(value)?;
        let (pick, leases_due) = match pick {
            SessionAssignReply::TooManySessions => (None, None),
            SessionAssignReply::Answered {
                ends_at,
                repinned,
                reply,
            } => {
                let (reply, leases_due) = without_due_hint(reply);
                (Some((ends_at, repinned, reply)), leases_due)
            }
        };
        // Before a refusal too: `done` was applied, and a member it took out returns on
        // time only if the due index knows.
        self.hint_due(pool, earlier(reply.due_hint, leases_due))
            .await?;
        let (ends_at, repinned, pick) = pick.ok_or(StoreError::TooManySessions)?;
        let batch = self.batch_of(pool, pick, ids).await?;
        Ok((
            session_assignment(session, ends_at, repinned, batch),
            done_summary(done, reply),
        ))
    }

    async fn end_session(&self, pool: &PoolId, session: &SessionId) -> Result<(), StoreError> {
        let keys = self.session_keys(pool, session);
        let value = self
            .eval_keyed(&self.scripts.end_session, pool, None, &keys, &[])
            .await?;
        match EndSessionReply::decode(value)? {
            EndSessionReply { ended: true } => Ok(()),
            EndSessionReply { ended: false } => Err(StoreError::SessionNotFound),
        }
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
        // A shorter ttl moved the pool's due time earlier: its entry in the due index
        // follows, as after an assign, so that the sweep reclaims the lease on time.
        self.hint_due(pool, renewal.due_hint).await?;
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
        let key = self.due_key();
        let mut swept = Swept::default();
        let mut taken = 0;
        let mut failed = None;
        while taken < SWEEP_POOLS_PER_CALL {
            let limit = DUE_TAKE.min(SWEEP_POOLS_PER_CALL - taken);
            let pools = self.take_due(&key, limit, Duration::ZERO).await?;
            taken += pools.len();
            // Issued together so that they travel pipelined on the shared connection.
            let steps =
                futures_util::future::join_all(pools.iter().map(|pool| self.sweep_pool(pool)))
                    .await;
            for (pool, step) in pools.iter().zip(steps) {
                match step {
                    Ok(step) => swept = swept + step,
                    Err(error) => {
                        // Out of the index and not swept: put back as due now, so that the
                        // next sweep (of any replica) tries again.
                        let _ = self.index(&key, "LT", pool, 0).await;
                        failed.get_or_insert(error);
                    }
                }
            }
            if pools.len() < limit {
                break;
            }
        }
        if let Some(error) = failed {
            return Err(error);
        }
        Ok(swept + self.safety_net().await?)
    }

    async fn due_check_pools(&self, limit: usize) -> Result<Vec<PoolId>, StoreError> {
        self.take_due(
            &self.checks_due_key(),
            limit,
            crate::store::CHECK_CLAIM_HOLD,
        )
        .await
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
        // Each distinct target's ban hash is passed once, after the pool's keys; a report
        // names its target by the key's slot in KEYS (counted from 1).
        let mut targets: Vec<&Target> = Vec::new();
        let mut places: std::collections::HashMap<&Target, usize> =
            std::collections::HashMap::new();
        let slots: Vec<String> = reports
            .iter()
            .map(|report| {
                report
                    .target
                    .as_ref()
                    .map(|target| {
                        let at = *places.entry(target).or_insert_with(|| {
                            targets.push(target);
                            targets.len() - 1
                        });
                        (POOL_KEY_PARTS.len() + 1 + at).to_string()
                    })
                    .unwrap_or_default()
            })
            .collect();
        let extra = self.ban_keys(pool, &targets);
        let [max_targets, cleanup] = &*BAN_LIMITS;
        let mut args: Vec<&[u8]> = Vec::with_capacity(reports.len() * 5 + 4);
        args.push(source.as_str().as_bytes());
        args.push(draw.as_bytes());
        args.push(max_targets.as_bytes());
        args.push(cleanup.as_bytes());
        for ((report, latency), slot) in reports.iter().zip(&latencies).zip(&slots) {
            args.push(report.member.as_str().as_bytes());
            args.push(report.result.as_str().as_bytes());
            args.push(report.detail.as_bytes());
            args.push(latency.as_bytes());
            args.push(slot.as_bytes());
        }
        let value = self
            .eval_keyed(&self.scripts.outcomes, pool, None, &extra, &args)
            .await?;
        let OutcomesReply { outcomes, due_hint } = OutcomesReply::decode(value, reports.len())?;
        self.hint_due(pool, due_hint).await?;
        let mut summary = ReportSummary::default();
        for (report, outcome) in reports.iter().zip(outcomes) {
            match outcome {
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
        let ClaimCheckReply { round, next_round } = ClaimCheckReply::decode(value)?;
        // `XX`: a pool whose checks were switched off since it was taken stays out.
        self.index(&self.checks_due_key(), "XX", pool, next_round)
            .await?;
        Ok(round)
    }

    async fn due_source_pools(&self, limit: usize) -> Result<Vec<PoolId>, StoreError> {
        self.take_due(
            &self.sources_due_key(),
            limit,
            crate::store::SOURCE_CLAIM_HOLD,
        )
        .await
    }

    async fn claim_sources(
        &self,
        pool: &PoolId,
        urls: &[String],
        hold: Duration,
    ) -> Result<Vec<ClaimedSource>, StoreError> {
        let hold = hold.as_millis().max(1).to_string();
        let mut args: Vec<&[u8]> = Vec::with_capacity(urls.len() + 1);
        args.push(hold.as_bytes());
        args.extend(urls.iter().map(|url| url.as_bytes()));
        let value = self.eval(&self.scripts.claim_sources, pool, &args).await?;
        let ClaimSourcesReply { claimed, next } = ClaimSourcesReply::decode(value)?;
        // `XX`: a pool whose sources were all removed since it was taken stays out.
        match next {
            Some(next) => {
                self.index(&self.sources_due_key(), "XX", pool, next)
                    .await?
            }
            None => self.unindex(&self.sources_due_key(), pool).await?,
        }
        Ok(claimed)
    }

    async fn record_source_fetch(
        &self,
        pool: &PoolId,
        url: &str,
        outcome: &FetchOutcome,
        next_in: Duration,
    ) -> Result<(), StoreError> {
        let json = serde_json::to_vec(outcome).map_err(|e| StoreError::Unavailable(Box::new(e)))?;
        let ok: &[u8] = match outcome {
            FetchOutcome::Ok { .. } => b"1",
            FetchOutcome::Failed { .. } => b"0",
        };
        let next_in = next_in.as_millis().to_string();
        let args: [&[u8]; 4] = [url.as_bytes(), ok, next_in.as_bytes(), &json];
        let value = self.eval(&self.scripts.record_source, pool, &args).await?;
        // `LT`: an earlier entry (another source due sooner) stays.
        if let RecordSourceReply(Some(next)) = RecordSourceReply::decode(value)? {
            self.index(&self.sources_due_key(), "LT", pool, next)
                .await?;
        }
        Ok(())
    }

    async fn source_states(
        &self,
        pool: &PoolId,
    ) -> Result<std::collections::HashMap<String, SourceState>, StoreError> {
        let value = self.eval(&self.scripts.source_states, pool, &[]).await?;
        SourceStatesReply::decode(value).map(|SourceStatesReply(states)| states)
    }

    async fn prune(&self, pool: &PoolId, absent: Option<(u64, u64)>) -> Result<Pruned, StoreError> {
        let batch = PRUNE_BATCH.to_string();
        let (low, high) = match absent {
            Some((id, fetch)) => (seen_place(id, 0), seen_place(id, fetch)),
            None => (String::new(), String::new()),
        };
        let args: [&[u8]; 3] = [batch.as_bytes(), low.as_bytes(), high.as_bytes()];
        let value = self.eval(&self.scripts.prune, pool, &args).await?;
        PruneReply::decode(value).map(|PruneReply(pruned)| pruned)
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
        let prune = config
            .prune
            .map(|prune| prune.script_arg())
            .unwrap_or_default();
        let ban = config.health.target_ban_ms.to_string();
        let pacing = config
            .pacing
            .map(|pacing| pacing.script_arg())
            .unwrap_or_default();
        let session_ttl = config.session_ttl_ms.as_millis().to_string();
        let args: [&[u8]; 12] = [
            &json,
            config.restore.as_str().as_bytes(),
            start.as_bytes(),
            config.policy.as_str().as_bytes(),
            ttl.as_bytes(),
            cap.as_bytes(),
            max.as_bytes(),
            health.as_bytes(),
            prune.as_bytes(),
            ban.as_bytes(),
            pacing.as_bytes(),
            session_ttl.as_bytes(),
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
        // A crash in between leaves a pool that the listing does not show until its next PUT.
        let mut zadd = redis::cmd("ZADD");
        zadd.arg(self.registry_key()).arg(0).arg(pool.as_str());
        self.command(zadd).await?;
        // A pool with checks is due for a round now (a round already held keeps its claim:
        // see claim_check.lua); one without leaves the check index.
        if config.health.check.is_some() {
            self.index(&self.checks_due_key(), "LT", pool, 0).await?;
        } else {
            self.unindex(&self.checks_due_key(), pool).await?;
        }
        // Likewise for sources: those not due yet are left alone by their claim.
        if config.sources.is_empty() {
            self.unindex(&self.sources_due_key(), pool).await?;
        } else {
            self.index(&self.sources_due_key(), "LT", pool, 0).await?;
        }
        Ok(if created {
            PutPool::Created
        } else {
            PutPool::Updated
        })
    }

    async fn pool(&self, pool: &PoolId) -> Result<PoolInfo, StoreError> {
        let reply = self
            .eval_parts(&self.scripts.pool_info, pool, POOL_INFO_KEY_PARTS, &[])
            .await?;
        PoolInfoReply::decode(reply).map(|info| info.of(pool.clone()))
    }

    async fn pool_page(
        &self,
        prefix: &str,
        after: Option<&PoolId>,
        limit: usize,
    ) -> Result<PoolPage, StoreError> {
        // One more than a page tells whether more follow.
        let mut ids = self
            .registry_range(prefix, after, limit.saturating_add(1))
            .await?;
        let more = ids.len() > limit;
        ids.truncate(limit);
        let replies = self
            .eval_each(&self.scripts.pool_info, POOL_INFO_KEY_PARTS, &ids)
            .await?;
        let mut pools = Vec::with_capacity(replies.len());
        for (id, reply) in ids.iter().zip(replies) {
            match PoolInfoReply::decode(reply) {
                Ok(info) => pools.push(info.of(id.clone())),
                // Deleted between the listing and the read.
                Err(StoreError::PoolNotFound) => {}
                Err(e) => return Err(e),
            }
        }
        let next = if more { ids.pop() } else { None };
        Ok(PoolPage { pools, next })
    }

    async fn pool_count(&self) -> Result<u64, StoreError> {
        let mut zcard = redis::cmd("ZCARD");
        zcard.arg(self.registry_key());
        reply::pool_count(self.command(zcard).await?)
    }

    async fn delete_pool(&self, pool: &PoolId) -> Result<(), StoreError> {
        // The script only renames the pool's keys out of the way (see delete_pool.lua);
        // freeing them happens below, outside any script. A fresh token per call keeps a
        // graveyard name from ever naming a key that exists.
        let token = format!("{:016x}", rand::random::<u64>());
        let value = self
            .eval_parts_with(
                &self.scripts.delete_pool,
                pool,
                &DELETE_KEY_PARTS,
                Some(&token),
                &[],
            )
            .await?;
        let mut zrem = redis::cmd("ZREM");
        zrem.arg(self.registry_key()).arg(pool.as_str());
        self.command(zrem).await?;
        // Its entry in the sweep's index goes at its next sweep, which finds no pool.
        self.unindex(&self.checks_due_key(), pool).await?;
        self.unindex(&self.sources_due_key(), pool).await?;
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
        let steps = self.for_chunks();
        let mut chunks = sizer.chunks(&seed.members);
        let mut step = 0;
        while let Some(chunk) = chunks.next() {
            let started = self.chunk_start(pool, &mut step).await;
            let sent = Instant::now();
            let part = steps
                .seed_chunk(pool, seed, chunk, start, pending_adds)
                .await?;
            let handled = part.added.len() + part.existing.len() + part.full.len();
            self.chunks
                .ran_bounded(started, sizer, (chunk.len(), handled), sent.elapsed());
            if handled < chunk.len() {
                // Stopped at its bound: the rest goes first in the next chunk.
                chunks.stopped_after(handled);
            }
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
        labels: &LabelFilter,
        target: Option<&Target>,
        limit: usize,
        cursor: Cursor,
    ) -> Result<MemberPage, StoreError> {
        let extra = match target {
            Some(target) => self.ban_keys(pool, &[target]),
            None => Vec::new(),
        };
        if !labels.is_empty() {
            return self
                .labelled_members(pool, filter, labels, &extra, limit, cursor)
                .await;
        }
        // One more than a page from each set tells the merge whether more pages follow.
        let wanted = |on: bool| if on { limit + 1 } else { 0 };
        let (mut eligible_left, mut ineligible_left) = match filter {
            StateFilter::Eligible => (wanted(true), 0),
            StateFilter::Ineligible => (0, wanted(true)),
            StateFilter::All => (wanted(true), wanted(true)),
        };
        let mut eligible = Vec::with_capacity(eligible_left);
        let mut ineligible = Vec::with_capacity(ineligible_left);
        let steps = self.for_chunks();
        // A page is read in pieces of at most LISTING_PIECE members of each set, one script
        // call each, so that a page of 1,000 members with their health never makes one long
        // script. A page is a position, not a snapshot (see `Cursor`), so members moving
        // between two pieces are no different from members moving between two pages.
        let mut step = 0;
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
            // Paced like a large operation's chunks: a client paging through a large pool
            // sends piece after piece.
            let started = self.chunk_start(pool, &mut step).await;
            let sent = Instant::now();
            let value = steps
                .eval_keyed(&self.scripts.members, pool, None, &extra, &args)
                .await?;
            self.chunks.ran_piece(started, sent.elapsed());
            let piece = MembersReply::decode(value, target.is_some())?;
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

    async fn shared_exit_members(
        &self,
        pool: &PoolId,
        filter: StateFilter,
        target: Option<&Target>,
        limit: usize,
        cursor: Cursor,
    ) -> Result<MemberPage, StoreError> {
        let extra = match target {
            Some(target) => self.ban_keys(pool, &[target]),
            None => Vec::new(),
        };
        let flag = |on: bool| -> &'static [u8] { if on { b"1" } else { b"0" } };
        let (eligible, ineligible) = (cursor.eligible.to_string(), cursor.ineligible.to_string());
        let size = limit.to_string();
        let scan = MAX_LISTING_SCAN.to_string();
        let args: Vec<&[u8]> = vec![
            eligible.as_bytes(),
            ineligible.as_bytes(),
            flag(filter != StateFilter::Ineligible),
            flag(filter != StateFilter::Eligible),
            size.as_bytes(),
            scan.as_bytes(),
            b":shared",
        ];
        let value = self
            .eval_keyed(&self.scripts.members, pool, None, &extra, &args)
            .await?;
        let page = MembersReply::decode(value, target.is_some())?;
        let mut members = page.eligible;
        members.extend(page.ineligible);
        Ok(MemberPage {
            members,
            next: page.next_shared,
        })
    }

    async fn record_exits(&self, pool: &PoolId, exits: &[ExitSeen]) -> Result<u64, StoreError> {
        if exits.is_empty() {
            return Ok(0);
        }
        // The labels from the GeoIP file go along when the service reads one: then every
        // entry has them (possibly none), see `ExitSeen::geo`.
        let with_geo = exits.iter().any(|exit| exit.geo.is_some());
        let texts: Vec<(String, String)> = exits
            .iter()
            .map(|exit| {
                (
                    exit.ip.to_string(),
                    exit.geo
                        .as_ref()
                        .map(|g| g.script_text())
                        .unwrap_or_default(),
                )
            })
            .collect();
        let mut args: Vec<&[u8]> = Vec::with_capacity(1 + exits.len() * 3);
        args.push(if with_geo { b"1" } else { b"0" });
        for (exit, (ip, geo)) in exits.iter().zip(&texts) {
            args.push(exit.member.as_str().as_bytes());
            args.push(ip.as_bytes());
            if with_geo {
                args.push(geo.as_bytes());
            }
        }
        let value = self.eval(&self.scripts.exit_ip, pool, &args).await?;
        Ok(ExitsReply::decode(value)?.recorded)
    }

    async fn disable_members(
        &self,
        pool: &PoolId,
        members: &[MemberId],
        reason: &str,
    ) -> Result<DisableReport, StoreError> {
        let sizer = &self.chunks.disable;
        let mut report = DisableReport::default();
        let steps = self.for_chunks();
        let mut chunks = sizer.chunks(members);
        let mut step = 0;
        while let Some(chunk) = chunks.next() {
            let started = self.chunk_start(pool, &mut step).await;
            let sent = Instant::now();
            let value = steps
                .member_script(&self.scripts.disable, pool, Some(reason.as_bytes()), chunk)
                .await?;
            let took = sent.elapsed();
            let DisableReply(outcomes) = DisableReply::decode(value, chunk.len())?;
            self.chunks
                .ran_bounded(started, sizer, (chunk.len(), outcomes.len()), took);
            if outcomes.len() < chunk.len() {
                // Stopped at its bound: the rest goes first in the next chunk.
                chunks.stopped_after(outcomes.len());
            }
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
        let steps = self.for_chunks();
        let mut chunks = sizer.chunks(members);
        let mut step = 0;
        while let Some(chunk) = chunks.next() {
            let started = self.chunk_start(pool, &mut step).await;
            let sent = Instant::now();
            let value = steps
                .member_script(&self.scripts.enable, pool, Some(policy.as_bytes()), chunk)
                .await?;
            let took = sent.elapsed();
            let reply = EnableReply::decode(value, chunk.len())?;
            self.chunks
                .ran_bounded(started, sizer, (chunk.len(), reply.outcomes.len()), took);
            if reply.outcomes.len() < chunk.len() {
                // Stopped at its bound: the rest goes first in the next chunk.
                chunks.stopped_after(reply.outcomes.len());
            }
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
        let steps = self.for_chunks();
        let mut chunks = sizer.chunks(members);
        let mut step = 0;
        while let Some(chunk) = chunks.next() {
            let started = self.chunk_start(pool, &mut step).await;
            let sent = Instant::now();
            let value = steps
                .member_script(&self.scripts.remove, pool, None, chunk)
                .await?;
            let took = sent.elapsed();
            let RemoveReply(removed) = RemoveReply::decode(value, chunk.len())?;
            self.chunks
                .ran_bounded(started, sizer, (chunk.len(), removed.len()), took);
            if removed.len() < chunk.len() {
                // Stopped at its bound: the rest goes first in the next chunk.
                chunks.stopped_after(removed.len());
            }
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
