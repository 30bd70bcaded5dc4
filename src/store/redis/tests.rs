//! Every script run on a real Redis, each of its reply shapes decoded by its decoder in
//! `reply.rs`. The list of scripts comes from [`Scripts::all`]: a script added there
//! without a case here fails `every_script_s_replies_decode_from_a_real_redis`.
//!
//! State a reply reports is set up through the store's own operations where they reach
//! it, and written into the pool's keys directly where they would take long (an expired
//! lease, a due return), because what is tested here is the reply, not the rule.

use std::time::Duration;

use redis::Value;
use redis::aio::MultiplexedConnection;

use super::reply::{
    self, AssignDoneReply, AssignReply, ClaimCheckReply, ClaimDueReply, ClaimSourcesReply,
    DeletePoolReply, DisableOutcome, DisableReply, DoneReply, EnableOutcome, EnableReply,
    EndSessionReply, ExitsReply, MembersReply, OutcomesReply, PoolInfoReply, PruneReply,
    RecordSourceReply, ReleaseReply, RemoveReply, RenewReply, Renewal, SeedOutcome, SeedReply,
    SessionAssignReply, SourceStatesReply, SweepReply, WalkReply,
};
use super::{RedisStore, RedisStoreOptions, RedisTopology};
use crate::domain::{
    HealthConfig, Labels, LeaseTtl, MemberId, OutcomeResult, Policy, PoolConfig, PoolId,
    RestorePolicy, Timestamp,
};
use crate::store::chunks::MemberChunks;
use crate::store::{
    CheckRound, ClaimedSource, Cursor, DisableReport, Effect, EnableReport, FetchOutcome,
    ImportCounts, LastCheck, MemberState, MemberView, Origin, PoolStats, Pruned, PutPool, Quality,
    RemoveReport, Report, ReportSource, Restored, Seed, SeedReport, SourceFetch, SourceState,
    Store, StoreError, Swept,
};
use crate::test_redis::RedisServer;

const PREFIX: &str = "replies";

/// A Redis of its own and a store on it, with a side connection for reading and writing
/// the pool's keys directly.
struct TestRedis {
    store: RedisStore,
    side: MultiplexedConnection,
    _server: RedisServer,
}

impl TestRedis {
    async fn start() -> Self {
        let server = RedisServer::start();
        let store = RedisStore::connect(RedisStoreOptions {
            topology: RedisTopology::Standalone { url: server.url() },
            key_prefix: PREFIX.to_owned(),
            timeout: Duration::from_secs(5),
            connections: 1,
            walk_turn: Duration::ZERO,
        })
        .await
        .expect("a store on the test Redis");
        let side = redis::Client::open(server.url())
            .expect("a valid URL")
            .get_multiplexed_async_connection()
            .await
            .expect("a side connection");
        Self {
            store,
            side,
            _server: server,
        }
    }

    /// Runs the script `name` on `pool`'s keys with `args`.
    async fn eval(&self, name: &str, pool: &PoolId, args: &[&str]) -> Value {
        self.eval_keyed(name, pool, &[], args).await
    }

    /// Runs the chunk script `name` (see `chunk.lua`) on `pool`'s keys with `args`, under a
    /// bound it never reaches.
    async fn eval_chunk(&self, name: &str, pool: &PoolId, args: &[&str]) -> Value {
        self.eval_bounded(name, pool, ["60000000", "25"], args)
            .await
    }

    /// Runs the chunk script `name` with `bound` (its microseconds, then the members between
    /// two looks at the clock), then `args`; its reply.
    async fn eval_bounded(
        &self,
        name: &str,
        pool: &PoolId,
        bound: [&str; 2],
        args: &[&str],
    ) -> Value {
        let all: Vec<&str> = bound.iter().chain(args).copied().collect();
        self.eval(name, pool, &all).await
    }

    /// How many script calls by hash this Redis has run since the last
    /// [`TestRedis::reset_stats`].
    async fn evalsha_calls(&self) -> u64 {
        let info: String = self.side(&["INFO", "commandstats"]).await;
        info.lines()
            .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
            .map_or(0, |rest| {
                rest.split(',')
                    .next()
                    .and_then(|n| n.parse().ok())
                    .expect("a count of calls")
            })
    }

    async fn reset_stats(&self) {
        let () = self.side(&["CONFIG", "RESETSTAT"]).await;
    }

    /// [`TestRedis::eval`] with `extra` keys after the pool's.
    async fn eval_keyed(
        &self,
        name: &str,
        pool: &PoolId,
        extra: &[String],
        args: &[&str],
    ) -> Value {
        let (_, script) = self
            .store
            .scripts
            .all()
            .find(|(script, _)| *script == name)
            .expect("a script of that name");
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        self.store
            .eval_keyed(script, pool, None, extra, &args)
            .await
            .expect("the script runs")
    }

    async fn create(&self, pool: &PoolId, config: PoolConfig) {
        self.store
            .put_pool(pool, &config)
            .await
            .expect("the pool is created");
    }

    async fn seed(&self, pool: &PoolId, members: &[&str], assignments: u64) {
        let mut seed = Seed::new(members.iter().map(|m| member(m)).collect());
        seed.assignments = Some(assignments);
        self.store
            .add_members(pool, &seed)
            .await
            .expect("members are added");
    }

    async fn report(&self, pool: &PoolId, source: ReportSource, reports: &[(&str, OutcomeResult)]) {
        let reports: Vec<Report> = reports
            .iter()
            .map(|(m, result)| Report {
                member: member(m),
                result: *result,
                detail: "HTTP 200".to_owned(),
                latency_ms: Some(42),
                target: None,
            })
            .collect();
        self.store
            .report(pool, source, &reports)
            .await
            .expect("reports are applied");
    }

    fn key(pool: &PoolId, part: &str) -> String {
        format!("{PREFIX}:{{{}}}:{part}", pool.as_str())
    }

    /// A command on the side connection.
    async fn side<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        cmd.query_async(&mut self.side.clone())
            .await
            .expect("the side command succeeds")
    }

    /// Redis's clock, in milliseconds.
    async fn now_ms(&self) -> u64 {
        let (seconds, micros): (u64, u64) = self.side(&["TIME"]).await;
        seconds * 1000 + micros / 1000
    }
}

fn member(text: &str) -> MemberId {
    MemberId::parse(text).expect("a valid member id")
}

fn pool(text: &str) -> PoolId {
    PoolId::parse(text).expect("a valid pool id")
}

fn ttl(ms: u64) -> LeaseTtl {
    LeaseTtl::from_millis(ms).expect("a valid ttl")
}

/// A pool whose members trip on their `failures`-th failure in a row, for a minute exactly.
fn tripping_after(failures: u32) -> PoolConfig {
    PoolConfig {
        health: HealthConfig {
            max_consecutive_failures: failures,
            cooldown_ms: 60_000,
            jitter_percent: 0,
            ..HealthConfig::default()
        },
        ..PoolConfig::default()
    }
}

fn least_in_flight() -> PoolConfig {
    PoolConfig {
        policy: Policy::LeastInFlight,
        ..PoolConfig::default()
    }
}

fn assert_pool_not_found<T: std::fmt::Debug>(decoded: Result<T, StoreError>) {
    assert!(
        matches!(decoded, Err(StoreError::PoolNotFound)),
        "expected PoolNotFound, got {decoded:?}"
    );
}

#[tokio::test]
async fn every_script_s_replies_decode_from_a_real_redis() {
    let redis = TestRedis::start().await;
    let names: Vec<&str> = redis.store.scripts.all().map(|(name, _)| name).collect();
    for name in names {
        match name {
            "assign" => {
                assign(&redis).await;
                session_assign(&redis).await;
                rate_limited_assign(&redis, "assign").await;
            }
            "assign_done" => {
                assign_done(&redis).await;
                rate_limited_assign(&redis, "assign_done").await;
            }
            "put_pool" => put_pool(&redis).await,
            "pool_info" => pool_info(&redis).await,
            "delete_pool" => delete_pool(&redis).await,
            "end_session" => end_session(&redis).await,
            "seed" => seed(&redis).await,
            "members" => members(&redis).await,
            "exit_ip" => exit_ip(&redis).await,
            "disable" => disable(&redis).await,
            "enable" => enable(&redis).await,
            "remove" => remove(&redis).await,
            "release" => release(&redis).await,
            "renew" => renew(&redis).await,
            "sweep" => sweep(&redis).await,
            "outcomes" => outcomes(&redis).await,
            "claim_check" => claim_check(&redis).await,
            "claim_due" => claim_due(&redis).await,
            "claim_sources" => claim_sources(&redis).await,
            "record_source" => record_source(&redis).await,
            "source_states" => source_states(&redis).await,
            "prune" => prune(&redis).await,
            "walk" => walk(&redis).await,
            "received" => received(&redis).await,
            "put_client" | "rotate_client" | "delete_client" | "client_by_token" => {
                clients(&redis, name).await;
            }
            other => panic!("{other}.lua has no reply test: add its case to this match"),
        }
    }
}

/// Runs `assign_done.lua` for one member with the lease id `lease`, after `done`'s
/// member, result and lease (each `""` for none), with no target.
async fn run_assign_done(redis: &TestRedis, pool: &PoolId, lease: &str, done: [&str; 3]) -> Value {
    let [member, result, ended] = done;
    redis
        .eval(
            "assign_done",
            pool,
            &[
                lease, "", "16", "16", "2000", "1", member, result, ended, "", "0", "100000", "16",
                "",
            ],
        )
        .await
}

async fn assign_done(redis: &TestRedis) {
    let used = pool("assign-done");
    assert_pool_not_found(AssignDoneReply::decode(
        run_assign_done(redis, &used, "l0", ["a", "ok", ""]).await,
    ));
    redis.create(&used, tripping_after(1)).await;
    redis.seed(&used, &["a"], 0).await;
    redis.seed(&used, &["b"], 3).await;
    // A report that trips `a`: the pick takes `b`, and the trip moved the pool's due time.
    let tripped =
        AssignDoneReply::decode(run_assign_done(redis, &used, "l0", ["a", "failed", ""]).await)
            .expect("decodes");
    let returns_at: u64 = redis
        .side(&["ZSCORE", &TestRedis::key(&used, "returns"), "a"])
        .await;
    assert_eq!(
        tripped,
        AssignDoneReply {
            done: DoneReply {
                report: Some(Some((Effect::Tripped, 1, None))),
                released: false,
                due_hint: Some(returns_at),
                member: Some(member("a")),
            },
            pick: AssignReply::Assigned(vec![(member("b"), 4)]),
        }
    );
    // An `ok` about an eligible member with a clean record changes nothing (the script's
    // head answers it before any helper exists).
    let clean = AssignDoneReply::decode(run_assign_done(redis, &used, "l0", ["b", "ok", ""]).await)
        .expect("decodes");
    assert_eq!(
        clean,
        AssignDoneReply {
            done: DoneReply {
                report: Some(Some((Effect::Counted, 0, None))),
                released: false,
                due_hint: None,
                member: Some(member("b")),
            },
            pick: AssignReply::Assigned(vec![(member("b"), 5)]),
        }
    );
    // A member the pool does not have; no report at all.
    let unknown =
        AssignDoneReply::decode(run_assign_done(redis, &used, "l0", ["nobody", "ok", ""]).await)
            .expect("decodes");
    assert_eq!(
        unknown.done,
        DoneReply {
            report: Some(None),
            released: false,
            due_hint: None,
            member: Some(member("nobody")),
        }
    );
    let none = AssignDoneReply::decode(run_assign_done(redis, &used, "l0", ["", "", ""]).await)
        .expect("decodes");
    assert_eq!(
        none.done,
        DoneReply {
            report: None,
            released: false,
            due_hint: None,
            member: None,
        }
    );
    assert_eq!(none.pick, AssignReply::Assigned(vec![(member("b"), 7)]));

    // A lease released and reported about through it, and the next one leased.
    let leased = pool("assign-done-leased");
    redis.create(&leased, least_in_flight()).await;
    redis.seed(&leased, &["a"], 0).await;
    run_assign(redis, &leased, "lease-1", "5000").await;
    let released = AssignDoneReply::decode(
        run_assign_done(redis, &leased, "lease-2", ["", "ok", "lease-1"]).await,
    )
    .expect("decodes");
    assert_eq!(
        released.done,
        DoneReply {
            report: Some(Some((Effect::Counted, 0, None))),
            released: true,
            due_hint: None,
            member: Some(member("a")),
        }
    );
    assert!(
        matches!(&released.pick, AssignReply::Leased { members, .. } if members == &[(member("a"), 2, 1)]),
        "{released:?}"
    );

    // In a session: the session's answer after what `done` did, `a` tripped by it and the
    // session re-pinned to `b`; a new session past the bound is refused after `done`.
    let pinned = pool("assign-done-session");
    redis.create(&pinned, tripping_after(1)).await;
    redis.seed(&pinned, &["a", "b"], 0).await;
    run_session_assign(redis, &pinned, "s", "10").await;
    let in_session = |id: &'static str, cap: &'static str, done: [&'static str; 3]| {
        let keys = session_keys(redis, &pinned, id);
        let session = format!("session 0 {cap} 600000");
        let pinned = &pinned;
        async move {
            let [member, result, lease] = done;
            let args = [
                "l0", "", "16", "16", "2000", &session, member, result, lease, "", "0", "100000",
                "16", "",
            ];
            redis.eval_keyed("assign_done", pinned, &keys, &args).await
        }
    };
    let repinned =
        AssignDoneReply::decode_in_session(in_session("s", "10", ["a", "failed", ""]).await)
            .expect("decodes");
    let returns_at: u64 = redis
        .side(&["ZSCORE", &TestRedis::key(&pinned, "returns"), "a"])
        .await;
    let SessionAssignReply::Answered {
        ends_at: Some(_),
        repinned: true,
        reply,
    } = &repinned.pick
    else {
        panic!("a re-pinned session, got {repinned:?}");
    };
    assert_eq!(
        (&repinned.done, reply),
        (
            &DoneReply {
                report: Some(Some((Effect::Tripped, 1, None))),
                released: false,
                due_hint: Some(returns_at),
                member: Some(member("a")),
            },
            &AssignReply::Assigned(vec![(member("b"), 1)])
        )
    );
    let refused = AssignDoneReply::decode_in_session(in_session("t", "1", ["b", "ok", ""]).await)
        .expect("decodes");
    assert_eq!(
        refused,
        AssignDoneReply {
            done: DoneReply {
                report: Some(Some((Effect::Counted, 0, None))),
                released: false,
                due_hint: None,
                member: Some(member("b")),
            },
            pick: SessionAssignReply::TooManySessions,
        }
    );
}

/// The head of both assign scripts (`rate.lua`): with a client's rate limit at the end of
/// ARGV and its bucket the last key, an assign takes a token, or answers `{-4, ms}` and
/// changes nothing; the bucket expires once it would be full again.
async fn rate_limited_assign(redis: &TestRedis, script: &str) {
    let limited = pool(&format!("rate-{script}"));
    let bucket = redis.store.buckets_key(&limited);
    let done: &[&str] = match script {
        // `done` about nobody: counted as unknown, changing nothing.
        "assign_done" => &["nobody", "ok", "", "", "0", "100000", "16", ""],
        _ => &[],
    };
    let mut args = vec!["l0", "", "16", "16", "2000", "1"];
    args.extend(done);
    args.push("\trate 1 1 1 10000 team-a");
    let run = || redis.eval_keyed(script, &limited, std::slice::from_ref(&bucket), &args);
    // No pool: no bucket either.
    assert_pool_not_found(
        reply::rate_limited(run().await).and_then(|value| match script {
            "assign_done" => AssignDoneReply::decode(value).map(drop),
            _ => AssignReply::decode(value).map(drop),
        }),
    );
    let exists: u64 = redis.side(&["EXISTS", &bucket]).await;
    assert_eq!(exists, 0);
    redis.create(&limited, PoolConfig::default()).await;
    redis.seed(&limited, &["a"], 0).await;
    let first = reply::rate_limited(run().await).expect("a token");
    let assignments = match script {
        "assign_done" => AssignDoneReply::decode(first).expect("decodes").pick,
        _ => AssignReply::decode(first).expect("decodes"),
    };
    assert_eq!(assignments, AssignReply::Assigned(vec![(member("a"), 1)]));
    let ttl: i64 = redis.side(&["PTTL", &bucket]).await;
    assert!((1..=1_000).contains(&ttl), "{ttl}");
    match reply::rate_limited(run().await) {
        Err(StoreError::ClientRateLimited(wait)) => {
            assert!(
                wait > Duration::ZERO && wait <= Duration::from_secs(1),
                "{wait:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    let count: String = redis
        .side(&["ZSCORE", &TestRedis::key(&limited, "eligible"), "a"])
        .await;
    assert_eq!(count, "1");
    // Past the most buckets a pool keeps (here 2), a new client's starts the hash over.
    for client in ["team-b", "team-c"] {
        let rate = format!("\trate 1 1 1 2 {client}");
        let mut args = args.clone();
        *args.last_mut().expect("the rate") = &rate;
        reply::rate_limited(
            redis
                .eval_keyed(script, &limited, std::slice::from_ref(&bucket), &args)
                .await,
        )
        .expect("a token");
    }
    let fields: Vec<String> = redis.side(&["HKEYS", &bucket]).await;
    assert_eq!(fields, ["team-c"]);
}

/// Runs `assign.lua` with a lease id and a ttl (`""` for the pool's).
async fn run_assign(redis: &TestRedis, pool: &PoolId, lease: &str, ttl: &str) -> Value {
    redis
        .eval("assign", pool, &[lease, ttl, "16", "16", "2000", "1"])
        .await
}

async fn assign(redis: &TestRedis) {
    let used = pool("assign-used");
    assert_pool_not_found(AssignReply::decode(
        run_assign(redis, &used, "l0", "").await,
    ));
    redis.create(&used, PoolConfig::default()).await;
    let empty = AssignReply::decode(run_assign(redis, &used, "l0", "").await);
    assert_eq!(
        empty.expect("decodes"),
        AssignReply::Empty { next_return: None }
    );
    redis.seed(&used, &["b"], 5).await;
    redis.seed(&used, &["a"], 0).await;
    let assigned = AssignReply::decode(run_assign(redis, &used, "l0", "").await);
    assert_eq!(
        assigned.expect("decodes"),
        AssignReply::Assigned(vec![(member("a"), 1)])
    );
    // Several: the first members of the order, each counted once.
    let several = redis
        .eval("assign", &used, &["l0", "", "16", "16", "2000", "3"])
        .await;
    assert_eq!(
        AssignReply::decode(several).expect("decodes"),
        AssignReply::Assigned(vec![(member("a"), 2), (member("b"), 6)])
    );
    // With label groups: the least-used member carrying them, or {-2} when a filter over
    // several keys would check more candidates than ARGV[5] allows.
    let labelled = pool("assign-labelled");
    redis.create(&labelled, PoolConfig::default()).await;
    let run = |args: &'static [&'static str]| redis.eval("assign", &labelled, args);
    run(&["l0", "", "16", "16", "2000", "1"]).await;
    redis
        .eval_chunk(
            "seed",
            &labelled,
            &[
                "0",
                "0",
                "0",
                "0",
                "1",
                "",
                "",
                "x",
                "country=de",
                "y",
                "country=fr\ntier=a",
                "z",
                "country=fr",
            ],
        )
        .await;
    let picked = run(&["l0", "", "16", "16", "2000", "1", "country fr"]).await;
    assert_eq!(
        AssignReply::decode(picked).expect("decodes"),
        AssignReply::Assigned(vec![(member("y"), 1)])
    );
    let costly = run(&["l0", "", "16", "16", "0", "1", "country fr", "tier a"]).await;
    assert_eq!(
        AssignReply::decode(costly).expect("decodes"),
        AssignReply::TooCostly
    );

    let cooling = pool("assign-cooling");
    redis.create(&cooling, tripping_after(1)).await;
    redis.seed(&cooling, &["a"], 0).await;
    redis
        .report(
            &cooling,
            ReportSource::Worker,
            &[("a", OutcomeResult::Failed)],
        )
        .await;
    match AssignReply::decode(run_assign(redis, &cooling, "l0", "").await) {
        Ok(AssignReply::Empty {
            next_return: Some(wait),
        }) => assert!(
            wait <= Duration::from_secs(60) && wait > Duration::from_secs(30),
            "the member returns after its one-minute cooldown, not in {wait:?}"
        ),
        other => panic!("expected the wait for a cooling member, got {other:?}"),
    }

    let leased = pool("assign-leased");
    redis
        .create(
            &leased,
            PoolConfig {
                max_in_flight: std::num::NonZeroU64::new(1),
                ..least_in_flight()
            },
        )
        .await;
    redis.seed(&leased, &["a"], 4).await;
    let lease = AssignReply::decode(run_assign(redis, &leased, "lease-1", "5000").await);
    let expiry = TestRedis::key(&leased, "lease_expiry");
    let expires_ms: u64 = redis.side(&["ZSCORE", &expiry, "lease-1"]).await;
    assert_eq!(
        lease.expect("decodes"),
        AssignReply::Leased {
            expires_at: Timestamp(expires_ms),
            ttl_ms: ttl(5000),
            due_hint: Some(expires_ms),
            members: vec![(member("a"), 5, 1)],
        }
    );
    // A lease expiring after the pool's earliest due work sends no hint.
    redis.seed(&leased, &["b"], 4).await;
    let later = AssignReply::decode(run_assign(redis, &leased, "lease-2", "60000").await);
    let later_ms: u64 = redis.side(&["ZSCORE", &expiry, "lease-2"]).await;
    assert_eq!(
        later.expect("decodes"),
        AssignReply::Leased {
            expires_at: Timestamp(later_ms),
            ttl_ms: ttl(60000),
            due_hint: None,
            members: vec![(member("b"), 5, 1)],
        }
    );
    let at_cap = AssignReply::decode(run_assign(redis, &leased, "lease-3", "").await);
    assert_eq!(
        at_cap.expect("decodes"),
        AssignReply::Empty { next_return: None }
    );
    // Several leases: the i-th member under the i-th id, all with one expiry.
    let two = pool("assign-two-leases");
    redis.create(&two, least_in_flight()).await;
    redis.seed(&two, &["a", "b"], 0).await;
    let both = redis
        .eval(
            "assign",
            &two,
            &["id-1 id-2", "5000", "16", "16", "2000", "2"],
        )
        .await;
    let expiry = TestRedis::key(&two, "lease_expiry");
    let expires_ms: u64 = redis.side(&["ZSCORE", &expiry, "id-2"]).await;
    assert_eq!(
        AssignReply::decode(both).expect("decodes"),
        AssignReply::Leased {
            expires_at: Timestamp(expires_ms),
            ttl_ms: ttl(5000),
            due_hint: Some(expires_ms),
            members: vec![(member("a"), 1, 1), (member("b"), 1, 1)],
        }
    );
    let leases = TestRedis::key(&two, "leases");
    let holder: String = redis.side(&["HGET", &leases, "id-1"]).await;
    assert_eq!(holder, "a");
}

async fn put_pool(redis: &TestRedis) {
    let id = pool("put-pool");
    let put = |config: PoolConfig| {
        let id = id.clone();
        async move { redis.store.put_pool(&id, &config).await }
    };
    assert_eq!(
        put(PoolConfig::default()).await.expect("created"),
        PutPool::Created
    );
    assert_eq!(
        put(PoolConfig::default()).await.expect("updated"),
        PutPool::Updated
    );
    redis.seed(&id, &["a"], 0).await;
    let refused = put(least_in_flight()).await;
    assert!(
        matches!(refused, Err(StoreError::PolicyChangeRequiresEmptyPool)),
        "got {refused:?}"
    );
}

async fn pool_info(redis: &TestRedis) {
    let id = pool("pool-info");
    assert_pool_not_found(PoolInfoReply::decode(
        redis.eval("pool_info", &id, &[]).await,
    ));
    let config = tripping_after(2);
    redis.create(&id, config.clone()).await;
    let meta = TestRedis::key(&id, "meta");
    let created_ms: u64 = redis.side(&["HGET", &meta, "created_ms"]).await;
    let fresh = PoolInfoReply::decode(redis.eval("pool_info", &id, &[]).await);
    assert_eq!(
        fresh.expect("decodes"),
        PoolInfoReply {
            config: config.clone(),
            created_at: Timestamp(created_ms),
            stats: PoolStats {
                eligible: 0,
                ineligible: 0,
                min_assignments: None,
                max_assignments: None,
                total_assignments: 0,
                in_flight: 0,
                abandoned: 0,
                tripped: 0,
                recovered: 0,
                pruned: 0,
                shared_exit_ips: 0,
                country_mismatches: 0,
            },
        }
    );

    redis.seed(&id, &["a"], 2).await;
    redis.seed(&id, &["b"], 7).await;
    redis.seed(&id, &["c"], 1).await;
    redis
        .store
        .disable_members(&id, &[member("c")], "maintenance")
        .await
        .expect("disabled");
    run_assign(redis, &id, "l0", "").await;
    // Every number its own value, so that two swapped in the reply cannot pass.
    let () = redis
        .side(&[
            "HSET",
            &meta,
            "abandoned",
            "4",
            "tripped",
            "5",
            "recovered",
            "6",
            "pruned",
            "7",
            "shared_exit_ips",
            "8",
            "country_mismatches",
            "9",
        ])
        .await;
    let expiry = TestRedis::key(&id, "lease_expiry");
    let () = redis
        .side(&["ZADD", &expiry, "1", "x", "2", "y", "3", "z"])
        .await;
    let busy = PoolInfoReply::decode(redis.eval("pool_info", &id, &[]).await);
    assert_eq!(
        busy.expect("decodes"),
        PoolInfoReply {
            config,
            created_at: Timestamp(created_ms),
            stats: PoolStats {
                eligible: 2,
                ineligible: 1,
                min_assignments: Some(3),
                max_assignments: Some(7),
                total_assignments: 1,
                in_flight: 3,
                abandoned: 4,
                tripped: 5,
                recovered: 6,
                pruned: 7,
                shared_exit_ips: 8,
                country_mismatches: 9,
            },
        }
    );
}

/// The keys of session `id` in `pool`.
fn session_keys(redis: &TestRedis, pool: &PoolId, id: &str) -> Vec<String> {
    let session = crate::domain::SessionId::parse("session", id).expect("a session id");
    redis.store.session_keys(pool, &session).to_vec()
}

/// Runs `assign.lua` in session `id` (its ttl 0: the pool's).
async fn run_session_assign(redis: &TestRedis, pool: &PoolId, id: &str, cap: &str) -> Value {
    let keys = session_keys(redis, pool, id);
    let session = format!("session 0 {cap} 600000");
    redis
        .eval_keyed(
            "assign",
            pool,
            &keys,
            &["l0", "", "16", "16", "2000", &session],
        )
        .await
}

async fn session_assign(redis: &TestRedis) {
    let id = pool("assign-session");
    assert_pool_not_found(SessionAssignReply::decode(
        run_session_assign(redis, &id, "s", "10").await,
    ));
    redis.create(&id, PoolConfig::default()).await;
    // Nothing to pin: no session starts.
    let empty = SessionAssignReply::decode(run_session_assign(redis, &id, "s", "10").await);
    assert_eq!(
        empty.expect("decodes"),
        SessionAssignReply::Answered {
            ends_at: None,
            repinned: false,
            reply: AssignReply::Empty { next_return: None },
        }
    );
    redis.seed(&id, &["a", "b"], 0).await;
    let first = SessionAssignReply::decode(run_session_assign(redis, &id, "s", "10").await);
    let Ok(SessionAssignReply::Answered {
        ends_at: Some(_),
        repinned: false,
        reply,
    }) = first
    else {
        panic!("a pinned answer, got {first:?}");
    };
    assert_eq!(reply, AssignReply::Assigned(vec![(member("a"), 1)]));
    // At the bound, a new session is refused; the live one is served.
    let full = SessionAssignReply::decode(run_session_assign(redis, &id, "t", "1").await);
    assert_eq!(full.expect("decodes"), SessionAssignReply::TooManySessions);
    let again = SessionAssignReply::decode(run_session_assign(redis, &id, "s", "1").await);
    assert!(
        matches!(
            again,
            Ok(SessionAssignReply::Answered {
                ends_at: Some(_),
                repinned: false,
                reply: AssignReply::Assigned(ref members),
            }) if members == &[(member("a"), 2)]
        ),
        "{again:?}"
    );
}

async fn end_session(redis: &TestRedis) {
    let id = pool("end-session");
    let end = |name: &'static str| {
        let keys = session_keys(redis, &id, name);
        let id = &id;
        async move { redis.eval_keyed("end_session", id, &keys, &[]).await }
    };
    assert_pool_not_found(EndSessionReply::decode(end("s").await));
    redis.create(&id, PoolConfig::default()).await;
    assert_eq!(
        EndSessionReply::decode(end("s").await).expect("decodes"),
        EndSessionReply { ended: false }
    );
    redis.seed(&id, &["a"], 0).await;
    run_session_assign(redis, &id, "s", "10").await;
    assert_eq!(
        EndSessionReply::decode(end("s").await).expect("decodes"),
        EndSessionReply { ended: true }
    );
    assert_eq!(
        EndSessionReply::decode(end("s").await).expect("decodes"),
        EndSessionReply { ended: false }
    );
}

async fn delete_pool(redis: &TestRedis) {
    let id = pool("delete-pool");
    let script = &redis.store.scripts.delete_pool;
    // The keys the store's delete passes: the pool's, then the session and pacing indexes.
    let delete = || async {
        redis
            .store
            .eval_parts_with(
                script,
                &id,
                &super::keys::DELETE_KEY_PARTS,
                Some("token"),
                &[],
            )
            .await
            .expect("the script runs")
    };
    let missing = DeletePoolReply::decode(delete().await);
    assert_eq!(
        missing.expect("decodes"),
        DeletePoolReply { graveyard: None }
    );
    redis.create(&id, PoolConfig::default()).await;
    redis.seed(&id, &["a"], 0).await;
    redis
        .store
        .report(
            &id,
            ReportSource::Worker,
            &[Report {
                member: member("a"),
                result: OutcomeResult::Blocked,
                detail: String::new(),
                latency_ms: None,
                target: Some(
                    crate::domain::Target::parse("target", "example.com").expect("a target"),
                ),
            }],
        )
        .await
        .expect("reported");
    // The pacing index, which only targeted assigns are given, is renamed too: the sets it
    // lists are then never read again.
    let _: u64 = redis
        .side(&[
            "ZADD",
            &TestRedis::key(&id, "paced_targets"),
            "99999999999999",
            "example.com",
        ])
        .await;
    let deleted = DeletePoolReply::decode(delete().await);
    let grave = |part: &str| TestRedis::key(&id, &format!("gone:token:{part}"));
    assert_eq!(
        deleted.expect("decodes"),
        DeletePoolReply {
            graveyard: Some(vec![
                grave("meta"),
                grave("eligible"),
                // The blocked report counted in the member's quality, kept in the health hash.
                grave("health"),
                grave("bans"),
                grave("paced_targets")
            ])
        }
    );
    let eligible = TestRedis::key(&id, "eligible");
    let left: u64 = redis
        .side(&["EXISTS", &TestRedis::key(&id, "meta"), &eligible])
        .await;
    assert_eq!(left, 0);
    let renamed: u64 = redis
        .side(&["EXISTS", &grave("meta"), &grave("eligible")])
        .await;
    assert_eq!(renamed, 2);
}

/// `exit_ip.lua` records addresses and their labels from the GeoIP file, counts the
/// shared ones, and `members.lua`'s `:shared` walk lists the members that share one.
async fn exit_ip(redis: &TestRedis) {
    let id = pool("exits");
    assert_pool_not_found(ExitsReply::decode(
        redis.eval("exit_ip", &id, &["0", "a", "192.0.2.1"]).await,
    ));
    redis.create(&id, PoolConfig::default()).await;
    redis.seed(&id, &["a", "b", "c"], 0).await;
    let recorded = ExitsReply::decode(
        redis
            .eval(
                "exit_ip",
                &id,
                &[
                    "1",
                    "a",
                    "192.0.2.1",
                    "geo_country=de",
                    "b",
                    "192.0.2.1",
                    "",
                    "gone",
                    "192.0.2.9",
                    "geo_asn=1",
                ],
            )
            .await,
    );
    assert_eq!(recorded.expect("decodes"), ExitsReply { recorded: 2 });
    let shared: u64 = redis
        .side(&["HGET", &TestRedis::key(&id, "meta"), "shared_exit_ips"])
        .await;
    assert_eq!(shared, 1);
    let labels: Option<String> = redis
        .side(&["HGET", &TestRedis::key(&id, "labels"), "a"])
        .await;
    assert_eq!(labels.as_deref(), Some("geo_country=de"));
    // A page of one, then the rest: `a`, then `b`, then the end (`c` exits nowhere).
    let walk = |args: &'static [&'static str]| redis.eval("members", &id, args);
    let first = MembersReply::decode(
        walk(&["0", "0", "1", "1", "1", "2000", ":shared"]).await,
        false,
    )
    .expect("decodes");
    assert_eq!(
        (first.eligible.len(), first.next_shared),
        (
            1,
            Some(Cursor {
                eligible: 1,
                ineligible: 0
            })
        )
    );
    assert_eq!(
        first.eligible[0].exit_ip,
        Some(std::net::IpAddr::from([192, 0, 2, 1]))
    );
    let rest = MembersReply::decode(
        walk(&["1", "0", "1", "1", "5", "2000", ":shared"]).await,
        false,
    )
    .expect("decodes");
    let listed: Vec<&str> = rest.eligible.iter().map(|v| v.member.as_str()).collect();
    assert_eq!((listed, rest.next_shared), (vec!["b"], None));
}

async fn seed(redis: &TestRedis) {
    let id = pool("seed");
    let run = |args: &'static [&'static str]| redis.eval_chunk("seed", &id, args);
    assert_pool_not_found(SeedReply::decode(
        run(&["", "0", "0", "0", "0", "", "", "a"]).await,
        1,
    ));
    let mut config = PoolConfig::default();
    config.rules.max_members = Some(2);
    redis.create(&id, config).await;
    let first = SeedReply::decode(
        run(&["", "0", "0", "0", "0", "", "", "a", "b", "c"]).await,
        3,
    );
    assert_eq!(
        first.expect("decodes"),
        SeedReply {
            start_assignments: 0,
            outcomes: vec![SeedOutcome::Added, SeedOutcome::Added, SeedOutcome::Full],
        }
    );
    let second = SeedReply::decode(run(&["4", "0", "0", "0", "0", "", "", "a", "d"]).await, 2);
    assert_eq!(
        second.expect("decodes"),
        SeedReply {
            start_assignments: 4,
            outcomes: vec![SeedOutcome::Existing, SeedOutcome::Full],
        }
    );
    // Labels follow each member: replaced on `a`, kept (`~`) on `b`.
    let labelled = run(&[
        "",
        "0",
        "0",
        "0",
        "1",
        "",
        "",
        "a",
        "country=de\ntier=a",
        "b",
        "~",
    ])
    .await;
    assert_eq!(
        SeedReply::decode(labelled, 2).expect("decodes"),
        SeedReply {
            start_assignments: 0,
            outcomes: vec![SeedOutcome::Existing, SeedOutcome::Existing],
        }
    );
    let stored: Option<String> = redis
        .side(&["HGET", &TestRedis::key(&id, "labels"), "a"])
        .await;
    assert_eq!(stored.as_deref(), Some("country=de\ntier=a"));
    let kept: Option<String> = redis
        .side(&["HGET", &TestRedis::key(&id, "labels"), "b"])
        .await;
    assert_eq!(kept, None);
    // Past its bound at its first look at the clock, after two members: `e` is not added.
    let stopped = redis
        .eval_bounded(
            "seed",
            &id,
            ["0", "2"],
            &["", "0", "0", "0", "0", "", "", "a", "b", "e"],
        )
        .await;
    assert_eq!(
        SeedReply::decode(stopped, 3).expect("decodes"),
        SeedReply {
            start_assignments: 0,
            outcomes: vec![SeedOutcome::Existing, SeedOutcome::Existing],
        }
    );
    let e: Option<f64> = redis
        .side(&["ZSCORE", &TestRedis::key(&id, "eligible"), "e"])
        .await;
    assert_eq!(e, None);
}

async fn members(redis: &TestRedis) {
    let id = pool("members");
    let page = |counts: &'static [&'static str]| redis.eval("members", &id, counts);
    assert_pool_not_found(MembersReply::decode(
        page(&["0", "0", "10", "10"]).await,
        false,
    ));
    redis
        .create(
            &id,
            PoolConfig {
                policy: Policy::LeastInFlight,
                ..tripping_after(2)
            },
        )
        .await;
    redis.seed(&id, &["a"], 0).await;
    redis.seed(&id, &["b", "c", "d"], 3).await;
    // Origins: `b` imported, `d` from the source with id 4 (whose URL the sources hash keeps).
    let () = redis
        .side(&["HSET", &TestRedis::key(&id, "origins"), "b", "i", "d", "s4"])
        .await;
    let () = redis
        .side(&["HSET", &TestRedis::key(&id, "sources"), "u:4", LIST_A])
        .await;
    let before = redis.now_ms().await;
    run_assign(redis, &id, "lease-1", "").await;
    redis
        .report(&id, ReportSource::Check, &[("a", OutcomeResult::Ok)])
        .await;
    redis
        .report(
            &id,
            ReportSource::Worker,
            &[
                ("b", OutcomeResult::Failed),
                ("d", OutcomeResult::Blocked),
                ("d", OutcomeResult::Blocked),
            ],
        )
        .await;
    redis
        .store
        .disable_members(&id, &[member("c")], "maintenance")
        .await
        .expect("disabled");
    let after = redis.now_ms().await;

    let decoded =
        MembersReply::decode(page(&["0", "0", "10", "10"]).await, false).expect("decodes");
    // The times are the store's; each must lie within the setup, and is then compared as
    // read back.
    let within = |time: Option<Timestamp>| {
        let time = time.expect("a time");
        assert!(
            (before..=after).contains(&time.0),
            "{time:?} outside the setup"
        );
        time
    };
    let a_checked = within(decoded.eligible[0].last_check.as_ref().map(|c| c.at));
    let c_since = within(decoded.ineligible[0].since);
    let d_since = within(decoded.ineligible[1].since);
    let d_returns = decoded.ineligible[1].returns_at.expect("a return time");
    assert_eq!(d_returns, Timestamp(d_since.0 + 60_000));
    let view = |member_id: &str, state, assignments| MemberView {
        member: member(member_id),
        origin: Origin::Manual,
        state,
        assignments,
        in_flight: 0,
        reason: None,
        since: None,
        consecutive_failures: 0,
        last_cooldown_ms: None,
        returns_at: None,
        last_check: None,
        exit_ip: None,
        exit_ip_at: None,
        labels: Labels::default(),
        geo_labels: Labels::default(),
        country_mismatch: false,
        banned_until: None,
        quality: Quality::default(),
    };
    // Workers' reports count in the quality, whatever they did to the health; checks' do not.
    // (The reports here carry 42 ms each.)
    let failed = |outcomes| Quality {
        outcomes,
        success_ppm: 0,
        latencies: outcomes,
        latency_us: 42_000,
    };
    assert_eq!(
        decoded,
        MembersReply {
            eligible: vec![
                MemberView {
                    in_flight: 1,
                    last_check: Some(LastCheck {
                        at: a_checked,
                        result: OutcomeResult::Ok,
                        detail: "HTTP 200".to_owned(),
                        latency_ms: Some(42),
                    }),
                    ..view("a", MemberState::Eligible, 1)
                },
                MemberView {
                    consecutive_failures: 1,
                    origin: Origin::Import,
                    quality: failed(1),
                    ..view("b", MemberState::Eligible, 3)
                },
            ],
            ineligible: vec![
                MemberView {
                    reason: Some("maintenance".to_owned()),
                    since: Some(c_since),
                    ..view("c", MemberState::Ineligible, 3)
                },
                MemberView {
                    reason: Some("blocked".to_owned()),
                    since: Some(d_since),
                    consecutive_failures: 2,
                    last_cooldown_ms: Some(60_000),
                    returns_at: Some(d_returns),
                    origin: Origin::Source(LIST_A.to_owned()),
                    quality: failed(2),
                    ..view("d", MemberState::Ineligible, 3)
                },
            ],
            next: None,
            next_shared: None,
        }
    );
    let eligible_only =
        MembersReply::decode(page(&["0", "0", "10", "0"]).await, false).expect("decodes");
    assert_eq!(eligible_only.eligible, decoded.eligible);
    assert_eq!(eligible_only.ineligible, []);
    // With a label filter: the walk's members, their labels, and where the next page starts
    // (here after one entry, the page size).
    redis
        .eval_chunk(
            "seed",
            &id,
            &["", "0", "0", "0", "1", "", "", "a", "tier=a", "c", "tier=a"],
        )
        .await;
    let filtered = MembersReply::decode(
        page(&["0", "0", "1", "1", "1", "100", "tier a"]).await,
        false,
    )
    .expect("decodes");
    let tier_a = Labels::from_script_text("tier=a");
    assert_eq!(filtered.eligible.len(), 1);
    assert_eq!(filtered.eligible[0].member, member("a"));
    assert_eq!(filtered.eligible[0].labels, tier_a);
    assert_eq!(filtered.ineligible, []);
    assert_eq!(filtered.next, Some(1));
    let rest = MembersReply::decode(
        page(&["1", "0", "1", "1", "1", "100", "tier a"]).await,
        false,
    )
    .expect("decodes");
    assert_eq!(rest.eligible, []);
    assert_eq!(rest.ineligible.len(), 1);
    assert_eq!(rest.ineligible[0].member, member("c"));
    assert_eq!(rest.ineligible[0].labels, tier_a);
    assert_eq!(rest.next, None);
    // For a target: each member's ban for it, 0 read as none.
    let site = crate::domain::Target::parse("target", "example.com").expect("a target");
    let blocked = Report {
        member: member("c"),
        result: OutcomeResult::Blocked,
        detail: String::new(),
        latency_ms: None,
        target: Some(site.clone()),
    };
    let c_until = redis
        .store
        .report(&id, ReportSource::Worker, std::slice::from_ref(&blocked))
        .await
        .expect("reported")
        .applied[0]
        .banned_until;
    let keys = redis.store.ban_keys(&id, &[&site]);
    let banned = MembersReply::decode(
        redis
            .eval_keyed("members", &id, &keys, &["0", "0", "10", "10"])
            .await,
        true,
    )
    .expect("decodes");
    let bans = |views: &[MemberView]| -> Vec<(String, Option<Option<Timestamp>>)> {
        views
            .iter()
            .map(|v| (v.member.as_str().to_owned(), v.banned_until))
            .collect()
    };
    assert!(c_until.is_some());
    assert_eq!(
        bans(&banned.eligible),
        [("a".to_owned(), Some(None)), ("b".to_owned(), Some(None))]
    );
    assert_eq!(
        bans(&banned.ineligible),
        [
            ("c".to_owned(), Some(c_until)),
            ("d".to_owned(), Some(None))
        ]
    );
}

async fn disable(redis: &TestRedis) {
    let id = pool("disable");
    let run = |args: &'static [&'static str]| redis.eval_chunk("disable", &id, args);
    assert_pool_not_found(DisableReply::decode(run(&["why", "a"]).await, 1));
    redis.create(&id, tripping_after(1)).await;
    redis.seed(&id, &["a", "b"], 0).await;
    redis
        .report(&id, ReportSource::Worker, &[("b", OutcomeResult::Failed)])
        .await;
    let disabled = DisableReply::decode(run(&["why", "a", "b", "z"]).await, 3);
    assert_eq!(
        disabled.expect("decodes"),
        DisableReply(vec![
            DisableOutcome::Disabled,
            DisableOutcome::Disabled,
            DisableOutcome::Unknown
        ])
    );
    let again = DisableReply::decode(run(&["why", "a"]).await, 1);
    assert_eq!(
        again.expect("decodes"),
        DisableReply(vec![DisableOutcome::AlreadyIneligible])
    );
    // Past its bound at its first look at the clock, after two members: `c` stays eligible.
    redis.seed(&id, &["c"], 0).await;
    let stopped = redis
        .eval_bounded("disable", &id, ["0", "2"], &["why", "a", "z", "c"])
        .await;
    assert_eq!(
        DisableReply::decode(stopped, 3).expect("decodes"),
        DisableReply(vec![
            DisableOutcome::AlreadyIneligible,
            DisableOutcome::Unknown
        ])
    );
    let c: Option<f64> = redis
        .side(&["ZSCORE", &TestRedis::key(&id, "eligible"), "c"])
        .await;
    assert_eq!(c, Some(0.0));
}

async fn enable(redis: &TestRedis) {
    let id = pool("enable");
    let run = |args: &'static [&'static str]| redis.eval_chunk("enable", &id, args);
    assert_pool_not_found(EnableReply::decode(run(&["", "a"]).await, 1));
    redis.create(&id, PoolConfig::default()).await;
    redis.seed(&id, &["a", "c"], 3).await;
    redis.seed(&id, &["b"], 5).await;
    redis
        .store
        .disable_members(&id, &[member("a"), member("c")], "maintenance")
        .await
        .expect("disabled");
    let enabled = EnableReply::decode(run(&["", "a", "b", "z"]).await, 3);
    assert_eq!(
        enabled.expect("decodes"),
        EnableReply {
            restore: RestorePolicy::Minimum,
            outcomes: vec![
                EnableOutcome::Enabled {
                    kept_assignments: 3,
                    assignments: 5
                },
                EnableOutcome::AlreadyEligible,
                EnableOutcome::Unknown,
            ],
        }
    );
    let zero = EnableReply::decode(run(&["zero", "c"]).await, 1);
    assert_eq!(
        zero.expect("decodes"),
        EnableReply {
            restore: RestorePolicy::Zero,
            outcomes: vec![EnableOutcome::Enabled {
                kept_assignments: 3,
                assignments: 0
            }],
        }
    );
    // Past its bound at its first look at the clock, after two members: `d` stays out.
    redis.seed(&id, &["d"], 4).await;
    redis
        .store
        .disable_members(&id, &[member("d")], "maintenance")
        .await
        .expect("disabled");
    let stopped = redis
        .eval_bounded("enable", &id, ["0", "2"], &["zero", "a", "z", "d"])
        .await;
    assert_eq!(
        EnableReply::decode(stopped, 3).expect("decodes"),
        EnableReply {
            restore: RestorePolicy::Zero,
            outcomes: vec![EnableOutcome::AlreadyEligible, EnableOutcome::Unknown],
        }
    );
    let d: Option<f64> = redis
        .side(&["ZSCORE", &TestRedis::key(&id, "ineligible"), "d"])
        .await;
    assert_eq!(d, Some(4.0));
}

async fn remove(redis: &TestRedis) {
    let id = pool("remove");
    let run = |args: &'static [&'static str]| redis.eval_chunk("remove", &id, args);
    assert_pool_not_found(RemoveReply::decode(run(&["a"]).await, 1));
    redis.create(&id, PoolConfig::default()).await;
    redis.seed(&id, &["a"], 0).await;
    let removed = RemoveReply::decode(run(&["a", "z"]).await, 2);
    assert_eq!(removed.expect("decodes"), RemoveReply(vec![true, false]));
    // Past its bound at its first look at the clock, after two members: `c` stays.
    redis.seed(&id, &["b", "c"], 0).await;
    let stopped = redis
        .eval_bounded("remove", &id, ["0", "2"], &["z", "b", "c"])
        .await;
    assert_eq!(
        RemoveReply::decode(stopped, 3).expect("decodes"),
        RemoveReply(vec![false, true])
    );
    let c: Option<f64> = redis
        .side(&["ZSCORE", &TestRedis::key(&id, "eligible"), "c"])
        .await;
    assert_eq!(c, Some(0.0));
}

async fn release(redis: &TestRedis) {
    let id = pool("release");
    let run = || redis.eval("release", &id, &["lease-1"]);
    assert_pool_not_found(ReleaseReply::decode(run().await));
    redis.create(&id, least_in_flight()).await;
    redis.seed(&id, &["a"], 0).await;
    run_assign(redis, &id, "lease-1", "").await;
    let released = ReleaseReply::decode(run().await);
    assert_eq!(released.expect("decodes"), ReleaseReply { released: true });
    let again = ReleaseReply::decode(run().await);
    assert_eq!(again.expect("decodes"), ReleaseReply { released: false });
}

async fn renew(redis: &TestRedis) {
    let id = pool("renew");
    let run = |args: &'static [&'static str]| redis.eval("renew", &id, args);
    assert_pool_not_found(RenewReply::decode(run(&["lease-1", ""]).await));
    redis.create(&id, least_in_flight()).await;
    let unknown = RenewReply::decode(run(&["lease-1", ""]).await);
    assert_eq!(unknown.expect("decodes"), RenewReply(None));
    redis.seed(&id, &["a"], 0).await;
    run_assign(redis, &id, "lease-1", "").await;
    let expiry = TestRedis::key(&id, "lease_expiry");
    // The shorter ttl moves the pool's due time earlier and answers it as the hint; the
    // longer one after it leaves the due time at the earlier expiry, with no hint.
    let asked: [(&'static [&'static str], u64, bool); 2] = [
        (&["lease-1", "7000"], 7000, true),
        (&["lease-1", ""], LeaseTtl::DEFAULT_MS, false),
    ];
    let meta = TestRedis::key(&id, "meta");
    let mut shorter_expiry = 0;
    for (args, given, hinted) in asked {
        let renewed = RenewReply::decode(run(args).await).expect("decodes");
        let expires_ms: u64 = redis.side(&["ZSCORE", &expiry, "lease-1"]).await;
        if hinted {
            shorter_expiry = expires_ms;
        }
        assert_eq!(
            renewed,
            RenewReply(Some(Renewal {
                member: member("a"),
                expires_at: Timestamp(expires_ms),
                ttl_ms: ttl(given),
                due_hint: hinted.then_some(expires_ms),
            }))
        );
        let due: u64 = redis.side(&["HGET", &meta, "due"]).await;
        assert_eq!(due, shorter_expiry);
    }
}

async fn sweep(redis: &TestRedis) {
    let id = pool("sweep");
    let run = || redis.eval_chunk("sweep", &id, &["256"]);
    assert_pool_not_found(SweepReply::decode(run().await));
    redis
        .create(
            &id,
            PoolConfig {
                policy: Policy::LeastInFlight,
                ..tripping_after(1)
            },
        )
        .await;
    redis.seed(&id, &["a", "b"], 0).await;
    run_assign(redis, &id, "lease-1", "").await;
    run_assign(redis, &id, "lease-2", "").await;
    redis
        .report(&id, ReportSource::Worker, &[("b", OutcomeResult::Failed)])
        .await;
    // A third lease, not expired: the pool's next due work.
    run_assign(redis, &id, "lease-3", "60000").await;
    let expiry = TestRedis::key(&id, "lease_expiry");
    let next: u64 = redis.side(&["ZSCORE", &expiry, "lease-3"]).await;
    // Due long ago: two leases expired and the cooldown ended.
    let () = redis
        .side(&["ZADD", &expiry, "1", "lease-1", "1", "lease-2"])
        .await;
    let () = redis
        .side(&["ZADD", &TestRedis::key(&id, "returns"), "1", "b"])
        .await;
    // Past its bound at its first look at the clock, after one lease: the other lease and
    // the return are left, due at once.
    let stopped = SweepReply::decode(redis.eval_bounded("sweep", &id, ["0", "1"], &["256"]).await);
    assert_eq!(
        stopped.expect("decodes"),
        SweepReply {
            swept: Swept {
                reclaimed: 1,
                returned: 0
            },
            next_due: Some(1),
            stopped: true,
        }
    );
    let swept = SweepReply::decode(run().await);
    assert_eq!(
        swept.expect("decodes"),
        SweepReply {
            swept: Swept {
                reclaimed: 1,
                returned: 1
            },
            next_due: Some(next),
            stopped: false,
        }
    );
    let () = redis.side(&["ZADD", &expiry, "1", "lease-3"]).await;
    let last = SweepReply::decode(run().await);
    assert_eq!(
        last.expect("decodes"),
        SweepReply {
            swept: Swept {
                reclaimed: 1,
                returned: 0
            },
            next_due: None,
            stopped: false,
        }
    );
}

async fn outcomes(redis: &TestRedis) {
    let id = pool("outcomes");
    let run = |args: &'static [&'static str]| redis.eval("outcomes", &id, args);
    assert_pool_not_found(OutcomesReply::decode(
        run(&["worker", "0", "10", "16", "a", "ok", "", "", ""]).await,
        1,
    ));
    redis.create(&id, tripping_after(2)).await;
    redis.seed(&id, &["a"], 0).await;
    let worker = &[
        "worker", "0", "10", "16", "a", "failed", "", "", "", "a", "failed", "", "", "", "z", "ok",
        "", "", "", "a", "ok", "", "", "",
    ];
    let applied = OutcomesReply::decode(run(worker).await, 4);
    let returns_at: u64 = redis
        .side(&["ZSCORE", &TestRedis::key(&id, "returns"), "a"])
        .await;
    assert_eq!(
        applied.expect("decodes"),
        OutcomesReply {
            outcomes: vec![
                Some((Effect::Counted, 1, None)),
                Some((Effect::Tripped, 2, None)),
                None,
                Some((Effect::Ignored, 2, None)),
            ],
            due_hint: Some(returns_at),
        }
    );
    let check = OutcomesReply::decode(
        run(&["check", "0", "10", "16", "a", "ok", "HTTP 200", "17", ""]).await,
        1,
    );
    assert_eq!(
        check.expect("decodes"),
        OutcomesReply {
            outcomes: vec![Some((Effect::Returned, 0, None))],
            due_hint: None,
        }
    );
    // A block on one target bans the member for it (default 600,000 ms) and leaves its
    // streak; the same report again changes nothing; a pool at its bound of targets
    // records no ban for a new one.
    let site = crate::domain::Target::parse("target", "example.com").expect("a target");
    let other = crate::domain::Target::parse("target", "example.org").expect("a target");
    let keys = redis.store.ban_keys(&id, &[&site, &other]);
    let before = redis.now_ms().await;
    let banned = OutcomesReply::decode(
        redis
            .eval_keyed(
                "outcomes",
                &id,
                &keys,
                &[
                    "worker", "0", "1", "16", "a", "blocked", "", "", "23", "a", "blocked", "", "",
                    "23", "a", "blocked", "", "", "24",
                ],
            )
            .await,
        3,
    )
    .expect("decodes");
    let after = redis.now_ms().await;
    let Some((Effect::Banned, 0, Some(until))) = banned.outcomes[0] else {
        panic!("banned: {banned:?}");
    };
    assert!((before + 600_000..=after + 600_000).contains(&until.0));
    assert_eq!(
        banned,
        OutcomesReply {
            outcomes: vec![
                Some((Effect::Banned, 0, Some(until))),
                Some((Effect::Ignored, 0, Some(until))),
                Some((Effect::Ignored, 0, None)),
            ],
            due_hint: None,
        }
    );
}

async fn claim_check(redis: &TestRedis) {
    let id = pool("claim-check");
    let run = || redis.eval("claim_check", &id, &["60000", "10"]);
    assert_pool_not_found(ClaimCheckReply::decode(run().await));
    redis.create(&id, tripping_after(1)).await;
    redis.seed(&id, &["b"], 1).await;
    redis.seed(&id, &["a", "d"], 0).await;
    redis
        .report(&id, ReportSource::Worker, &[("d", OutcomeResult::Failed)])
        .await;
    let before = redis.now_ms().await;
    let claimed = ClaimCheckReply::decode(run().await).expect("decodes");
    let after = redis.now_ms().await;
    assert_eq!(
        claimed.round,
        Some(CheckRound {
            eligible: vec![member("a"), member("b")],
            cooling: vec![member("d")],
        })
    );
    assert!(
        (before + 60_000..=after + 60_000).contains(&claimed.next_round),
        "the next round when the claim ends, not at {} (claimed between {before} and {after})",
        claimed.next_round
    );
    let taken = ClaimCheckReply::decode(run().await).expect("decodes");
    assert_eq!(taken.round, None);
    // When the claim that holds the round ends, to the millisecond PTTL rounds to.
    assert!(
        claimed.next_round.abs_diff(taken.next_round) <= 1,
        "{} against {}",
        taken.next_round,
        claimed.next_round
    );
}

const LIST_A: &str = "http://lists.example/a";
const LIST_B: &str = "http://lists.example/b";

async fn claim_sources(redis: &TestRedis) {
    let id = pool("claim-sources");
    let run = || redis.eval("claim_sources", &id, &["60000", LIST_A, LIST_B]);
    assert_pool_not_found(ClaimSourcesReply::decode(run().await));
    redis.create(&id, PoolConfig::default()).await;
    let before = redis.now_ms().await;
    let first = ClaimSourcesReply::decode(run().await).expect("decodes");
    let after = redis.now_ms().await;
    let fresh = |url: &str, id| ClaimedSource {
        url: url.to_owned(),
        failures: 0,
        successes: 0,
        id,
    };
    assert_eq!(first.claimed, [fresh(LIST_A, 1), fresh(LIST_B, 2)]);
    let next = first.next.expect("a next fetch");
    assert!((before + 60_000..=after + 60_000).contains(&next), "{next}");
    let held = ClaimSourcesReply::decode(run().await).expect("decodes");
    assert_eq!((held.claimed, held.next), (vec![], Some(next)));
    let none = ClaimSourcesReply::decode(redis.eval("claim_sources", &id, &["60000"]).await)
        .expect("decodes");
    assert_eq!((none.claimed, none.next), (vec![], None));
    // Three hundred URLs one after another beside LIST_A (id 3): the hash keeps the URLs of
    // the last 256 ids and of LIST_A, however old its id, and the current state only.
    for i in 0..300 {
        let url = format!("http://lists.example/{i}");
        redis
            .eval("claim_sources", &id, &["60000", LIST_A, &url])
            .await;
    }
    let sources = TestRedis::key(&id, "sources");
    let fields: Vec<String> = redis.side(&["HKEYS", &sources]).await;
    let urls = fields.iter().filter(|f| f.starts_with("u:")).count();
    assert_eq!((urls, fields.len()), (257, 259), "{fields:?}");
    let kept: Option<String> = redis.side(&["HGET", &sources, "u:3"]).await;
    assert_eq!(kept.as_deref(), Some(LIST_A));
}

async fn record_source(redis: &TestRedis) {
    let id = pool("record-source");
    let ok = serde_json::to_string(&FetchOutcome::Ok {
        counts: ImportCounts::default(),
    })
    .expect("serialises");
    let args = [LIST_A, "1", "5000", ok.as_str()];
    let run = || redis.eval("record_source", &id, &args);
    assert_pool_not_found(RecordSourceReply::decode(run().await));
    redis.create(&id, PoolConfig::default()).await;
    assert_eq!(
        RecordSourceReply::decode(run().await).expect("decodes"),
        RecordSourceReply(None)
    );
    redis.eval("claim_sources", &id, &["60000", LIST_A]).await;
    let before = redis.now_ms().await;
    let RecordSourceReply(next) = RecordSourceReply::decode(run().await).expect("decodes");
    let after = redis.now_ms().await;
    let next = next.expect("a next fetch");
    assert!((before + 5_000..=after + 5_000).contains(&next), "{next}");
}

async fn source_states(redis: &TestRedis) {
    let id = pool("source-states");
    let run = || redis.eval("source_states", &id, &[]);
    assert_pool_not_found(SourceStatesReply::decode(run().await));
    redis.create(&id, PoolConfig::default()).await;
    let SourceStatesReply(empty) = SourceStatesReply::decode(run().await).expect("decodes");
    assert!(empty.is_empty());
    redis
        .eval("claim_sources", &id, &["60000", LIST_A, LIST_B])
        .await;
    let failed = FetchOutcome::Failed {
        error: "status 404".to_owned(),
    };
    let json = serde_json::to_string(&failed).expect("serialises");
    redis
        .eval("record_source", &id, &[LIST_A, "0", "1000", &json])
        .await;
    let SourceStatesReply(states) = SourceStatesReply::decode(run().await).expect("decodes");
    let a = states.get(LIST_A).expect("a is kept").clone();
    let last = a.last_fetch.clone().expect("a was fetched");
    assert_eq!(
        a,
        SourceState {
            next_fetch_at: Timestamp(last.at.0 + 1_000),
            failures: 1,
            successes: 0,
            last_fetch: Some(SourceFetch {
                at: last.at,
                outcome: failed,
            }),
        }
    );
    assert_eq!(
        states.get(LIST_B).map(|b| b.last_fetch.is_none()),
        Some(true)
    );
}

async fn prune(redis: &TestRedis) {
    let id = pool("prune");
    let run = |args: &'static [&'static str]| redis.eval("prune", &id, args);
    assert_pool_not_found(PruneReply::decode(run(&["2", "", ""]).await));
    let config = PoolConfig {
        prune: Some(crate::domain::PruneConfig {
            after_failed_checks: None,
            absent_from_source_fetches: Some(1),
            manual: false,
        }),
        ..PoolConfig::default()
    };
    redis.create(&id, config).await;
    assert_eq!(
        PruneReply::decode(run(&["2", "", ""]).await).expect("decodes"),
        PruneReply(Pruned::default())
    );
    // Three members of source 1, last seen at fetches 1, 1 and 2: the first two are stale
    // up to fetch 1, and a batch of 2 is full, so more may follow.
    redis.seed(&id, &["a", "b", "c"], 0).await;
    let origins = TestRedis::key(&id, "origins");
    let () = redis
        .side(&["HSET", &origins, "a", "s1", "b", "s1", "c", "s1"])
        .await;
    let span: u64 = 1 << 32;
    let (one, two) = ((span + 1).to_string(), (span + 2).to_string());
    let () = redis
        .side(&[
            "ZADD",
            &TestRedis::key(&id, "seen"),
            &one,
            "a",
            &one,
            "b",
            &two,
            "c",
        ])
        .await;
    let (low, high) = (span.to_string(), (span + 1).to_string());
    let args = ["2", low.as_str(), high.as_str()];
    let value = redis.eval("prune", &id, &args).await;
    assert_eq!(
        PruneReply::decode(value).expect("decodes"),
        PruneReply(Pruned {
            removed: vec![member("a"), member("b")],
            more: true,
        })
    );
}

async fn claim_due(redis: &TestRedis) {
    let index = format!("{PREFIX}:due-test");
    let take = |limit: &'static str, hold: &'static str| {
        let index = index.clone();
        async move {
            let (_, script) = redis
                .store
                .scripts
                .all()
                .find(|(name, _)| *name == "claim_due")
                .expect("the script");
            let value = redis
                .store
                .eval_on(script, &[&index], &[limit.as_bytes(), hold.as_bytes()])
                .await
                .expect("the script runs");
            ClaimDueReply::decode(value).expect("decodes")
        }
    };
    assert_eq!(take("10", "0").await, ClaimDueReply(vec![]));
    let () = redis
        .side(&[
            "ZADD",
            &index,
            "3",
            "c",
            "1",
            "a",
            "2",
            "b",
            "99999999999999",
            "later",
        ])
        .await;
    // Taken without a hold: out of the index.
    assert_eq!(take("1", "0").await, ClaimDueReply(vec![pool("a")]));
    let before = redis.now_ms().await;
    // Taken with a hold: moved to now + hold, so not taken again meanwhile.
    assert_eq!(
        take("10", "60000").await,
        ClaimDueReply(vec![pool("b"), pool("c")])
    );
    let held: u64 = redis.side(&["ZSCORE", &index, "b"]).await;
    assert!(held >= before + 60_000, "held until {held}");
    assert_eq!(take("10", "0").await, ClaimDueReply(vec![]));
    let left: Vec<String> = redis.side(&["ZRANGE", &index, "0", "-1"]).await;
    assert_eq!(left, ["b", "c", "later"]);
}

/// The client scripts, each run through the store's own call of it, whose replies decode
/// into what the embedded store answers for the same calls.
async fn clients(redis: &TestRedis, name: &str) {
    use crate::domain::{ClientConfig, ClientId, TokenHash};
    use crate::store::{ClientRecord, PutClient};
    let store = &redis.store;
    let id = ClientId::parse(&format!("client-{name}")).expect("a client id");
    let web = ClientConfig::from_json(r#"{"pools":["web"]}"#).expect("valid");
    let every = ClientConfig::from_json(r#"{"pools":["*"]}"#).expect("valid");
    // Tokens of this case only: every token opens one client.
    let first = TokenHash::of(format!("{name} first").as_bytes());
    let second = TokenHash::of(format!("{name} second").as_bytes());
    let record = |config: &ClientConfig, token| ClientRecord {
        id: id.clone(),
        config: config.clone(),
        token,
    };
    match name {
        "put_client" => {
            assert_eq!(
                store.put_client(&id, &web, first).await.ok(),
                Some(PutClient::Created)
            );
            assert_eq!(
                store.put_client(&id, &every, second).await.ok(),
                Some(PutClient::Replaced)
            );
            assert_eq!(store.client(&id).await.ok(), Some(record(&every, first)));
            assert!(
                store
                    .clients()
                    .await
                    .expect("listed")
                    .contains(&record(&every, first))
            );
        }
        "rotate_client" => {
            store.put_client(&id, &web, first).await.expect("created");
            store
                .rotate_client_token(&id, second)
                .await
                .expect("rotated");
            assert_eq!(store.client_by_token(first).await.ok(), Some(None));
            let nobody = ClientId::parse("nobody").expect("a client id");
            assert!(matches!(
                store.rotate_client_token(&nobody, first).await,
                Err(StoreError::ClientNotFound)
            ));
        }
        "delete_client" => {
            store.put_client(&id, &web, first).await.expect("created");
            store.delete_client(&id).await.expect("deleted");
            assert!(matches!(
                store.delete_client(&id).await,
                Err(StoreError::ClientNotFound)
            ));
            assert!(matches!(
                store.client(&id).await,
                Err(StoreError::ClientNotFound)
            ));
        }
        _ => {
            store.put_client(&id, &web, first).await.expect("created");
            assert_eq!(
                store.client_by_token(first).await.ok(),
                Some(Some(record(&web, first)))
            );
            assert_eq!(store.client_by_token(second).await.ok(), Some(None));
        }
    }
}

/// `received.lua` answers Redis's count of bytes received, which a call of 10,000 bytes
/// from another client moves by at least that.
async fn received(redis: &TestRedis) {
    let id = pool("received");
    let read = || async {
        let (_, script) = redis
            .store
            .scripts
            .all()
            .find(|(name, _)| *name == "received")
            .expect("the script");
        let value = redis
            .store
            .eval_parts(script, &id, &["meta"], &[])
            .await
            .expect("the script runs");
        reply::received(value).expect("decodes")
    };
    let before = read().await;
    let info: String = redis.side(&["INFO", "stats"]).await;
    let counted: u64 = info
        .lines()
        .find_map(|line| line.strip_prefix("total_net_input_bytes:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("Redis counts the bytes it received");
    // The count as the script read it (its own call included), then the side's
    // `*2\r\n$4\r\nINFO\r\n$5\r\nstats\r\n` on top.
    assert_eq!(counted, before + 25);
    let () = redis.side(&["SET", "elsewhere", &"x".repeat(10_000)]).await;
    let after = read().await;
    assert!(after >= before + 10_000, "{after} after {before}");
    assert_eq!(reply::received(Value::Nil).ok(), None);
}

async fn walk(redis: &TestRedis) {
    let registry = format!("{PREFIX}:walk-test");
    let shared = format!("{{{registry}}}:walk");
    let turn = |count: &'static str, length: &'static str| {
        let (registry, shared) = (registry.clone(), shared.clone());
        async move {
            let (_, script) = redis
                .store
                .scripts
                .all()
                .find(|(name, _)| *name == "walk")
                .expect("the script");
            let value = redis
                .store
                .eval_on(
                    script,
                    &[&registry, &shared],
                    &[count.as_bytes(), length.as_bytes()],
                )
                .await
                .expect("the script runs");
            WalkReply::decode(value).expect("decodes")
        }
    };
    let pools = |ids: &[&str]| WalkReply(ids.iter().map(|id| pool(id)).collect());
    assert_eq!(turn("2", "0").await, pools(&[]));
    let () = redis
        .side(&["ZADD", &registry, "0", "c", "0", "a", "0", "b"])
        .await;
    assert_eq!(turn("2", "0").await, pools(&["a", "b"]));
    // At the end of the registry the walk starts over.
    assert_eq!(turn("2", "0").await, pools(&["c", "a"]));
    let before = redis.now_ms().await;
    assert_eq!(turn("2", "60000").await, pools(&["b", "c"]));
    // The turn lasts: nobody else walks meanwhile, and the position stays.
    assert_eq!(turn("2", "0").await, pools(&[]));
    let (last, next): (String, u64) = redis.side(&["HMGET", &shared, "last", "next"]).await;
    assert_eq!(last, "c");
    assert!(next >= before + 60_000, "the next turn at {next}");
}

fn text(value: &str) -> Value {
    Value::BulkString(value.as_bytes().to_vec())
}

/// The message of the store error a decoder returned.
fn refusal<T: std::fmt::Debug>(decoded: Result<T, StoreError>) -> String {
    match decoded {
        Err(StoreError::Unavailable(error)) => error.to_string(),
        other => panic!("expected the reply to be refused, got {other:?}"),
    }
}

#[test]
fn a_reply_longer_or_shorter_than_its_script_s_is_refused_naming_the_script() {
    let longer = Value::Array(vec![Value::Int(0), Value::Int(5), Value::Int(9)]);
    assert_eq!(
        refusal(AssignReply::decode(longer)),
        "unexpected reply to assign.lua: reply too long"
    );
    let half = Value::Array(vec![Value::Int(1), text("a"), Value::Int(1), text("b")]);
    assert_eq!(
        refusal(AssignReply::decode(half)),
        "unexpected reply to assign.lua: reply too short"
    );
    let shorter = Value::Array(vec![Value::Int(1)]);
    assert_eq!(
        refusal(ReleaseReply::decode(shorter)),
        "unexpected reply to release.lua: reply too short"
    );
}

#[test]
fn a_named_reply_with_another_name_in_its_place_is_refused() {
    let renamed = Value::Array(vec![Value::Int(1), text("eligibles"), Value::Array(vec![])]);
    assert_eq!(
        refusal(MembersReply::decode(renamed, false)),
        "unexpected reply to members.lua: expected the name `eligible`"
    );
}

#[test]
fn a_list_of_more_outcomes_than_members_asked_or_of_none_is_refused() {
    let two = Value::Array(vec![
        Value::Int(1),
        Value::Array(vec![Value::Int(1), Value::Int(0)]),
    ]);
    assert_eq!(
        refusal(DisableReply::decode(two, 1)),
        "unexpected reply to disable.lua: 2 outcomes for 1 members"
    );
    // A chunk that stopped at its bound answers for its first members, never for none.
    let none = Value::Array(vec![Value::Int(1), Value::Array(vec![])]);
    assert_eq!(
        refusal(DisableReply::decode(none, 2)),
        "unexpected reply to disable.lua: 0 outcomes for 2 members"
    );
    let first = Value::Array(vec![Value::Int(1), Value::Array(vec![Value::Int(1)])]);
    assert_eq!(
        DisableReply::decode(first, 2).expect("decodes"),
        DisableReply(vec![DisableOutcome::Disabled])
    );
}

#[test]
fn an_outcome_code_the_script_never_returns_is_refused() {
    let unknown = Value::Array(vec![
        Value::Int(1),
        Value::Array(vec![Value::Int(6), Value::Int(0), Value::Int(0)]),
        Value::Int(0),
    ]);
    assert_eq!(
        refusal(OutcomesReply::decode(unknown, 1)),
        "unexpected reply to outcomes.lua: unknown effect"
    );
}

/// Chunks whose scripts all stop at their first look at the clock (a bound of zero) still
/// make each large member call whole and exact: every script call handles one granule of
/// 25 members, the service sends the rest, and the reports are what one call would give.
#[tokio::test]
async fn member_calls_whose_chunks_stop_at_their_bound_still_handle_every_member_once() {
    let redis = TestRedis::start().await;
    let mut store = redis.store.clone();
    store.chunks =
        std::sync::Arc::new(MemberChunks::bounded_at(Duration::ZERO).reading_load_every(None));
    let id = pool("bounded");
    let mut config = PoolConfig::default();
    config.rules.max_members = Some(250);
    redis.create(&id, config).await;
    let names: Vec<MemberId> = (0..260).map(|i| member(&format!("m{i:03}"))).collect();
    let unknown = member("z");

    redis.reset_stats().await;
    let mut seed = Seed::new(names.clone());
    seed.assignments = Some(7);
    let seeded = store.add_members(&id, &seed).await.expect("seeded");
    assert_eq!(
        seeded,
        SeedReport {
            added: names[..250].to_vec(),
            existing: vec![],
            full: names[250..].to_vec(),
            start_assignments: 7,
        }
    );
    // 260 members, 25 a call: ten calls stopped at their bound and one for the last ten.
    assert_eq!(redis.evalsha_calls().await, 11);

    let mut asked = names[..130].to_vec();
    asked.push(unknown.clone());
    redis.reset_stats().await;
    let disabled = store
        .disable_members(&id, &asked, "maintenance")
        .await
        .expect("disabled");
    assert_eq!(
        disabled,
        DisableReport {
            disabled: names[..130].to_vec(),
            already_ineligible: vec![],
            unknown: vec![unknown.clone()],
        }
    );
    assert_eq!(redis.evalsha_calls().await, 6);

    let enabled = store
        .enable_members(&id, &asked, Some(RestorePolicy::Zero))
        .await
        .expect("enabled");
    assert_eq!(
        enabled,
        EnableReport {
            restore: RestorePolicy::Zero,
            enabled: names[..130]
                .iter()
                .map(|m| Restored {
                    member: m.clone(),
                    kept_assignments: 7,
                    assignments: 0,
                })
                .collect(),
            already_eligible: vec![],
            unknown: vec![unknown.clone()],
        }
    );

    let mut every = names[..250].to_vec();
    every.push(unknown.clone());
    let removed = store.remove_members(&id, &every).await.expect("removed");
    assert_eq!(
        removed,
        RemoveReport {
            removed: names[..250].to_vec(),
            unknown: vec![unknown],
        }
    );
    let left: u64 = redis
        .side(&["ZCARD", &TestRedis::key(&id, "eligible")])
        .await;
    assert_eq!(left, 0);
}

/// Sweep steps that all stop at their first look at the clock (a bound of zero) still make
/// one sweep reclaim every expired lease and return every due member, each once.
#[tokio::test]
async fn a_sweep_whose_steps_stop_at_their_bound_still_reclaims_every_lease_once() {
    let redis = TestRedis::start().await;
    let mut store = redis.store.clone();
    store.chunks =
        std::sync::Arc::new(MemberChunks::bounded_at(Duration::ZERO).reading_load_every(None));
    let id = pool("bounded-sweep");
    redis
        .create(
            &id,
            PoolConfig {
                policy: Policy::LeastInFlight,
                ..tripping_after(1)
            },
        )
        .await;
    let names: Vec<String> = (0..130).map(|i| format!("m{i:03}")).collect();
    let named: Vec<&str> = names.iter().map(String::as_str).collect();
    redis.seed(&id, &named, 0).await;
    // 30 members cooling down after a failure, and a lease on each of the other 100.
    let failures: Vec<(&str, OutcomeResult)> = named[100..]
        .iter()
        .map(|name| (*name, OutcomeResult::Failed))
        .collect();
    redis.report(&id, ReportSource::Worker, &failures).await;
    let leases: Vec<String> = (0..100).map(|i| format!("lease-{i:03}")).collect();
    for lease in &leases {
        run_assign(&redis, &id, lease, "").await;
    }
    // All of it due long ago.
    let expiry = TestRedis::key(&id, "lease_expiry");
    let mut expire = vec!["ZADD", expiry.as_str()];
    for lease in &leases {
        expire.extend(["1", lease.as_str()]);
    }
    let () = redis.side(&expire).await;
    let returns = TestRedis::key(&id, "returns");
    let mut end_cooldowns = vec!["ZADD", returns.as_str()];
    for name in &named[100..] {
        end_cooldowns.extend(["1", *name]);
    }
    let () = redis.side(&end_cooldowns).await;
    let () = redis
        .side(&["ZADD", &store.due_key(), "1", id.as_str()])
        .await;

    let swept = store.sweep().await.expect("swept");
    assert_eq!(
        swept,
        Swept {
            reclaimed: 100,
            returned: 30
        }
    );
    let info = store.pool(&id).await.expect("the pool");
    assert_eq!(
        (
            info.stats.in_flight,
            info.stats.abandoned,
            info.stats.eligible,
            info.stats.recovered
        ),
        (0, 100, 130, 30)
    );
}

/// A store whose chunks stop at their first look at the clock (25 members each) and which
/// reads what Redis received before every chunk, with a pool of `name`.
async fn rest_counting_store(redis: &TestRedis, name: &str) -> (RedisStore, PoolId) {
    let mut store = redis.store.clone();
    store.chunks = std::sync::Arc::new(
        MemberChunks::bounded_at(Duration::ZERO).reading_load_every(Some(Duration::ZERO)),
    );
    let id = pool(name);
    redis.create(&id, PoolConfig::default()).await;
    (store, id)
}

fn members_named(prefix: &str, count: usize) -> Seed {
    Seed::new(
        (0..count)
            .map(|i| member(&format!("{prefix}{i:03}")))
            .collect(),
    )
}

/// With no other call waiting on Redis, a large operation's chunks run back to back; with
/// a call of this replica in flight on another pool, each chunk is followed by its rest.
#[tokio::test]
async fn chunks_rest_only_while_another_call_is_in_flight() {
    let redis = TestRedis::start().await;
    let (store, id) = rest_counting_store(&redis, "rests").await;

    store
        .add_members(&id, &members_named("a", 250))
        .await
        .expect("seeded");
    assert_eq!(store.chunks.rests(), (10, 0));

    // Counted as `run` counts a call: in flight from before its checkout to its answer.
    let held = store.chunks.traffic.enter();
    store
        .add_members(&id, &members_named("b", 250))
        .await
        .expect("seeded");
    drop(held);
    assert_eq!(store.chunks.rests(), (20, 10));

    store
        .disable_members(&id, &members_named("a", 100).members, "why")
        .await
        .expect("disabled");
    assert_eq!(store.chunks.rests(), (24, 10));
}

/// A real call on another pool, held in flight while Redis runs another client's long
/// script, makes the chunk that starts meanwhile rest; the store's own chunks, which go
/// through the same `run`, do not count themselves.
#[tokio::test]
async fn a_call_on_another_pool_waiting_on_redis_makes_a_chunk_rest() {
    let redis = TestRedis::start().await;
    let (store, id) = rest_counting_store(&redis, "rests").await;
    let other = pool("other");
    redis.create(&other, PoolConfig::default()).await;

    // Another client keeps Redis busy for 300 ms: the pool info below waits behind it.
    let mut side = redis.side.clone();
    let busy = tokio::spawn(async move {
        let script = "local t = redis.call('TIME') \
            while true do local n = redis.call('TIME') \
            if (n[1] - t[1]) * 1000000 + (n[2] - t[2]) > 300000 then return 1 end end";
        let _: i64 = redis::cmd("EVAL")
            .arg(script)
            .arg(0)
            .query_async(&mut side)
            .await
            .expect("the busy script ran");
    });
    let reader = {
        let store = store.clone();
        let other = other.clone();
        tokio::spawn(async move { store.pool(&other).await.map(drop) })
    };
    // Until the pool info is in flight: counted before its checkout, so at its first poll
    // (a store that did not count it fails here rather than hanging).
    let idle = crate::store::chunks::Traffic::default().seen();
    tokio::time::timeout(Duration::from_secs(5), async {
        while store.chunks.traffic.seen() == idle {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the pool info counts as in flight");
    store
        .add_members(&id, &members_named("a", 50))
        .await
        .expect("seeded");
    reader
        .await
        .expect("joined")
        .expect("the pool info answered");
    busy.await.expect("joined");
    let (run, rested) = store.chunks.rests();
    assert_eq!(run, 2);
    assert!(rested >= 1, "{rested} of {run} chunks rested");
}

/// On a Redis nobody else talks to, the chunks of a large operation never rest, however
/// often they read what Redis received: what it received is exactly what they sent it,
/// readings included.
#[tokio::test]
async fn the_chunks_of_an_idle_redis_read_only_their_own_bytes_and_never_rest() {
    let redis = TestRedis::start().await;
    let (store, id) = rest_counting_store(&redis, "rests").await;
    store
        .add_members(&id, &members_named("a", 250))
        .await
        .expect("seeded");
    store
        .disable_members(&id, &members_named("a", 100).members, "why")
        .await
        .expect("disabled");
    store
        .enable_members(&id, &members_named("a", 100).members, None)
        .await
        .expect("enabled");
    store
        .remove_members(&id, &members_named("a", 250).members)
        .await
        .expect("removed");
    assert_eq!(store.chunks.rests(), (10 + 4 + 4 + 10, 0));
}

/// Bytes another client sends Redis between two readings make the next chunk rest; a
/// chunk with none since the reading before does not.
#[tokio::test]
async fn a_chunk_after_another_client_sent_redis_its_calls_rests() {
    let redis = TestRedis::start().await;
    let (store, id) = rest_counting_store(&redis, "rests").await;
    // A call's first chunk reads nothing; its second reads what Redis received so far.
    let mut step = 0;
    let first = store.chunk_start(&id, &mut step).await;
    let quiet = store.chunk_start(&id, &mut step).await;
    let value = "x".repeat(10_000);
    let () = redis.side(&["SET", "elsewhere", &value]).await;
    let busy = store.chunk_start(&id, &mut step).await;
    let quiet_again = store.chunk_start(&id, &mut step).await;
    store.chunks.ran_piece(first, Duration::from_micros(100));
    store.chunks.ran_piece(quiet, Duration::from_micros(100));
    assert_eq!(store.chunks.rests(), (2, 0));
    store.chunks.ran_piece(busy, Duration::from_micros(100));
    assert_eq!(store.chunks.rests(), (3, 1));
    store
        .chunks
        .ran_piece(quiet_again, Duration::from_micros(100));
    assert_eq!(store.chunks.rests(), (4, 1));
}

/// Another client sending Redis calls all along, which no count of this replica sees,
/// makes the chunks of a large operation rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_rest_while_another_client_keeps_sending_redis_calls() {
    let redis = TestRedis::start().await;
    let (store, id) = rest_counting_store(&redis, "rests").await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut side = redis.side.clone();
    let load = {
        let (stop, sent) = (stop.clone(), sent.clone());
        tokio::spawn(async move {
            let value = "x".repeat(10_000);
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let () = redis::cmd("SET")
                    .arg("elsewhere")
                    .arg(&value)
                    .query_async(&mut side)
                    .await
                    .expect("the other client's call ran");
                sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        })
    };
    // Until the other client's calls are flowing.
    while sent.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    store
        .add_members(&id, &members_named("b", 500))
        .await
        .expect("seeded");
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    load.await.expect("joined");
    let (run, rested) = store.chunks.rests();
    assert_eq!(run, 20);
    // The first chunk reads nothing and the second's reading has nothing to compare with;
    // a loaded machine may also stall the other client for the length of a chunk or two.
    assert!(rested >= 16, "{rested} of {run} rested");
}
