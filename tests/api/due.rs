//! Background work follows what is due: the sweep and the checker find pools through the
//! stores' due indexes, so pools nobody assigns from get their leases and members back on
//! time, and an idle replica costs Redis the same few commands whatever the number of pools.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use proxy_allocator::domain::{LeaseTtl, MemberId, Policy, PoolConfig, PoolId};
use proxy_allocator::store::{
    AssignRequest, Assignment, EmbeddedStore, RedisStore, RedisStoreOptions, RedisTopology,
    SAFETY_NET_POOLS_PER_SWEEP, Seed, Store,
};
use serde_json::json;

use crate::for_each_store;
use crate::helpers::{
    RedisServer, TestApp, abandoned_work_ends, assert_abandoned_work_ended_on_time, command_calls,
    command_delta,
};

/// Idle pools around the two that have work: the sweep must not need to read them.
const IDLE_POOLS: usize = 200;

async fn leases_and_cooldowns_end_on_time_in_pools_nobody_assigns_from_among_idle_ones(
    app: TestApp,
) {
    for i in 0..IDLE_POOLS {
        let pool = format!("idle-{i}");
        app.create_pool(&pool, json!({})).await;
        app.seed(&pool, &["a"], Some(0)).await;
    }
    assert_abandoned_work_ended_on_time(abandoned_work_ends(&app, "leased", "cooling").await);
}

for_each_store!(leases_and_cooldowns_end_on_time_in_pools_nobody_assigns_from_among_idle_ones,);

/// Expired leases in one pool: several of the sweep's steps (the first holds 200).
const BACKLOG: usize = 600;

/// The backlog's lease ttl: longer than taking its leases, so that no assign reclaims any.
const BACKLOG_TTL_MS: u64 = 2_000;

/// One call of the sweep reclaims a backlog of many steps in one pool: steps are sized by
/// their cost and repeat while a step came back full.
async fn one_sweep_reclaims_a_backlog_of_many_steps(store: &dyn Store) {
    let pool = PoolId::parse("backlog").expect("a valid pool id");
    let config = PoolConfig {
        policy: Policy::LeastInFlight,
        lease_ttl_ms: LeaseTtl::from_millis(BACKLOG_TTL_MS).expect("a valid ttl"),
        ..PoolConfig::default()
    };
    store.put_pool(&pool, &config).await.expect("created");
    let members: Vec<MemberId> = (0..BACKLOG)
        .map(|i| MemberId::parse(&format!("m{i:04}.example.net:3128")).expect("a member"))
        .collect();
    store
        .add_members(&pool, &Seed::new(members))
        .await
        .expect("seeded");
    for _ in 0..BACKLOG {
        let leased = store
            .assign(&pool, &AssignRequest::default())
            .await
            .expect("assigned");
        assert!(matches!(leased, Assignment::Leased { .. }), "{leased:?}");
    }
    let info = store.pool(&pool).await.expect("the pool");
    assert_eq!(
        (info.stats.in_flight, info.stats.abandoned),
        (BACKLOG as u64, 0)
    );
    // Every lease expires BACKLOG_TTL_MS after it was taken, on the store's clock.
    tokio::time::sleep(Duration::from_millis(BACKLOG_TTL_MS + 200)).await;
    let swept = store.sweep().await.expect("swept");
    assert_eq!((swept.reclaimed, swept.returned), (BACKLOG as u64, 0));
    let info = store.pool(&pool).await.expect("the pool");
    assert_eq!(
        (info.stats.in_flight, info.stats.abandoned),
        (0, BACKLOG as u64)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sweep_on_redis_reclaims_a_backlog_of_many_steps() {
    let redis = RedisServer::start();
    let store = replica(&redis, "backlog", Duration::ZERO).await;
    one_sweep_reclaims_a_backlog_of_many_steps(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sweep_on_embedded_reclaims_a_backlog_of_many_steps() {
    one_sweep_reclaims_a_backlog_of_many_steps(&EmbeddedStore::new()).await;
}

/// The ttl a lease is renewed to, well below its first (the pool's 30 s).
const RENEWED_TTL_MS: u64 = 100;

/// A lease renewed to a shorter ttl is reclaimed by the sweep once that ttl is over: the
/// renewal moved the pool's due time (and its place in the due index) to the new expiry.
/// One pool and, on Redis, a walk of the registry spent before the lease is taken, so that
/// only the due index can bring the sweep to the pool.
async fn a_lease_renewed_shorter_is_reclaimed_at_its_new_expiry(store: &dyn Store) {
    let pool = PoolId::parse("renewed").expect("a valid pool id");
    let config = PoolConfig {
        policy: Policy::LeastInFlight,
        ..PoolConfig::default()
    };
    store.put_pool(&pool, &config).await.expect("created");
    let member = MemberId::parse("a").expect("a valid member");
    store
        .add_members(&pool, &Seed::new(vec![member.clone()]))
        .await
        .expect("seeded");
    // The walk's one turn is taken here, while the pool has nothing due.
    assert_eq!(store.sweep().await.expect("swept").reclaimed, 0);
    let leased = store
        .assign(&pool, &AssignRequest::default())
        .await
        .expect("assigned");
    let Assignment::Leased { lease, .. } = leased else {
        panic!("a lease, got {leased:?}");
    };
    assert_eq!(lease.ttl_ms.as_millis(), 30_000);
    let ttl = LeaseTtl::from_millis(RENEWED_TTL_MS).expect("a valid ttl");
    let renewed_at = Instant::now();
    let renewed = store
        .renew(&pool, &lease.id, Some(ttl))
        .await
        .expect("renewed");
    assert_eq!((renewed.member, renewed.lease.ttl_ms), (member, ttl));

    let deadline = renewed_at + Duration::from_secs(5);
    let mut reclaimed = 0;
    while reclaimed == 0 {
        assert!(
            Instant::now() < deadline,
            "the renewed lease was not reclaimed 5 s after its {RENEWED_TTL_MS} ms ttl began"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        reclaimed += store.sweep().await.expect("swept").reclaimed;
    }
    assert!(renewed_at.elapsed() >= Duration::from_millis(RENEWED_TTL_MS));
    assert_eq!(reclaimed, 1);
    let info = store.pool(&pool).await.expect("the pool");
    assert_eq!((info.stats.in_flight, info.stats.abandoned), (0, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_renewed_shorter_on_redis_is_reclaimed_at_its_new_expiry() {
    let redis = RedisServer::start();
    let store = replica(&redis, "renewed", LONG_TURN).await;
    a_lease_renewed_shorter_is_reclaimed_at_its_new_expiry(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_renewed_shorter_on_embedded_is_reclaimed_at_its_new_expiry() {
    a_lease_renewed_shorter_is_reclaimed_at_its_new_expiry(&EmbeddedStore::new()).await;
}

/// Sweeps (each followed by a check tick) measured per sample.
const SWEEPS: u64 = 20;

/// Creates pools `idle-<from>` .. `idle-<to>` with one member each, straight in the store.
async fn idle_pools(store: &RedisStore, from: usize, to: usize) {
    let member = MemberId::parse("a").expect("a valid member");
    for i in from..to {
        let pool = PoolId::parse(&format!("idle-{i}")).expect("a valid pool id");
        store
            .put_pool(&pool, &PoolConfig::default())
            .await
            .expect("created");
        store
            .add_members(&pool, &Seed::new(vec![member.clone()]))
            .await
            .expect("seeded");
    }
}

/// What Redis counted (`INFO commandstats`, commands scripts run included) during
/// [`SWEEPS`] idle sweeps and check ticks.
async fn idle_sweeps(store: &RedisStore, redis: &RedisServer) -> BTreeMap<String, u64> {
    let before = command_calls(&redis.url());
    for _ in 0..SWEEPS {
        let swept = store.sweep().await.expect("swept");
        assert_eq!((swept.reclaimed, swept.returned), (0, 0));
        assert_eq!(store.due_check_pools(256).await.expect("looked"), []);
    }
    let mut seen = command_delta(&before, &command_calls(&redis.url()));
    // The one command `command_calls` itself costs.
    seen.remove("info");
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_replica_sends_the_same_commands_with_2000_pools_as_with_100() {
    let redis = RedisServer::start();
    // Every sweep takes a turn of the safety net's walk.
    let store = replica(&redis, "idle", Duration::ZERO).await;
    // More pools than the safety net walks in the window (so that its walk does not start
    // over, which costs one more ZRANGE), and then twenty times as many.
    idle_pools(&store, 0, 100).await;
    let few = idle_sweeps(&store, &redis).await;
    idle_pools(&store, 100, 2_000).await;
    let many = idle_sweeps(&store, &redis).await;

    assert_eq!(
        few, many,
        "commands of {SWEEPS} idle sweeps and check ticks"
    );
    // Per sweep: one look into each index, the safety net's turn (every sweep has one here)
    // and two scripts for each pool it walks.
    let per_sweep = 3 + 2 * u64::try_from(SAFETY_NET_POOLS_PER_SWEEP).expect("small");
    assert_eq!(many.get("evalsha"), Some(&(SWEEPS * per_sweep)), "{many:?}");
    for sent in ["smembers", "sscan", "zadd", "scan", "keys"] {
        assert_eq!(many.get(sent), None, "{sent}: {many:?}");
    }
}

/// A replica's store on `redis`, its keys under `prefix`, with turns of the safety net's
/// walk lasting `walk_turn`.
async fn replica(redis: &RedisServer, prefix: &str, walk_turn: Duration) -> RedisStore {
    RedisStore::connect(RedisStoreOptions {
        topology: RedisTopology::Standalone { url: redis.url() },
        key_prefix: prefix.to_owned(),
        timeout: Duration::from_secs(5),
        connections: 1,
        walk_turn,
    })
    .await
    .expect("a store")
}

/// A turn of the walk no test outlasts.
const LONG_TURN: Duration = Duration::from_secs(600);

/// What Redis counted while each of `replicas` swept [`SWEEPS`] times, in turn.
async fn sweeps_of(replicas: &[RedisStore], redis: &RedisServer) -> BTreeMap<String, u64> {
    let before = command_calls(&redis.url());
    for _ in 0..SWEEPS {
        for replica in replicas {
            let swept = replica.sweep().await.expect("swept");
            assert_eq!((swept.reclaimed, swept.returned), (0, 0));
        }
    }
    let mut seen = command_delta(&before, &command_calls(&redis.url()));
    seen.remove("info");
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_replicas_share_one_walk_of_the_registry_however_many_they_are() {
    let redis = RedisServer::start();
    let one = replica(&redis, "one", LONG_TURN).await;
    idle_pools(&one, 0, 100).await;
    let three = [
        replica(&redis, "three", LONG_TURN).await,
        replica(&redis, "three", LONG_TURN).await,
        replica(&redis, "three", LONG_TURN).await,
    ];
    idle_pools(&three[0], 0, 100).await;

    let alone = sweeps_of(std::slice::from_ref(&one), &redis).await;
    let together = sweeps_of(&three, &redis).await;

    // Every sweep of every replica looks into the due index and asks for the walk's turn
    // (a script each, reading Redis's clock; the ask reads the walk, the look a range of the
    // index). Within one turn there is one walk whatever the number of replicas: two more
    // replicas cost their asks and nothing else.
    let ask = [("evalsha", 2), ("time", 2), ("hmget", 1), ("zrange", 1)];
    let mut expected = alone.clone();
    for (command, calls) in ask {
        *expected.entry(command.to_owned()).or_default() += 2 * SWEEPS * calls;
    }
    assert_eq!(together, expected);
    // One walk: one range of the registry and two scripts for each pool it hands out.
    let walked = 2 * u64::try_from(SAFETY_NET_POOLS_PER_SWEEP).expect("small");
    assert_eq!(
        alone.get("evalsha"),
        Some(&(SWEEPS * 2 + walked)),
        "{alone:?}"
    );
    assert_eq!(alone.get("hset"), Some(&1), "{alone:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_missing_from_the_due_index_is_repaired_by_the_replicas_after_one_stops() {
    let redis = RedisServer::start();
    let turn = Duration::from_millis(300);
    let first = replica(&redis, "lost", turn).await;
    // Four pools the first replica's turn walks, then the one whose entry gets lost.
    idle_pools(&first, 0, SAFETY_NET_POOLS_PER_SWEEP).await;
    let lost = PoolId::parse("lost").expect("a valid pool id");
    first
        .put_pool(
            &lost,
            &PoolConfig {
                policy: proxy_allocator::domain::Policy::LeastInFlight,
                ..PoolConfig::default()
            },
        )
        .await
        .expect("created");
    first
        .add_members(
            &lost,
            &Seed::new(vec![MemberId::parse("a").expect("a valid member")]),
        )
        .await
        .expect("seeded");
    assert_eq!(first.sweep().await.expect("swept").reclaimed, 0);
    let ttl = proxy_allocator::domain::LeaseTtl::from_millis(100).expect("a valid ttl");
    let request = proxy_allocator::store::AssignRequest {
        ttl: Some(ttl),
        ..Default::default()
    };
    let leased = first.assign(&lost, &request).await.expect("assigned");
    assert!(
        matches!(leased, proxy_allocator::store::Assignment::Leased { .. }),
        "{leased:?}"
    );
    // The hint that indexed the lease is lost, as when a replica dies right after its
    // script; the replica that walked stops too.
    crate::helpers::redis_cli(&redis.url(), &["ZREM", "lost:due", "lost"]);
    drop(first);

    let others = [
        replica(&redis, "lost", turn).await,
        replica(&redis, "lost", turn).await,
    ];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut reclaimed = 0;
    while reclaimed == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lease was never reclaimed"
        );
        for other in &others {
            reclaimed += other.sweep().await.expect("swept").reclaimed;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(reclaimed, 1);
}
