//! Background work follows what is due: the sweep and the checker find pools through the
//! stores' due indexes, so pools nobody assigns from get their leases and members back on
//! time, and an idle replica costs Redis the same few commands whatever the number of pools.

use std::collections::BTreeMap;
use std::time::Duration;

use proxy_allocator::domain::{MemberId, PoolConfig, PoolId};
use proxy_allocator::store::{
    RedisStore, RedisStoreOptions, RedisTopology, SAFETY_NET_POOLS_PER_SWEEP, Seed, Store,
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
    let store = RedisStore::connect(RedisStoreOptions {
        topology: RedisTopology::Standalone { url: redis.url() },
        key_prefix: "idle".to_owned(),
        timeout: Duration::from_secs(5),
        connections: 1,
    })
    .await
    .expect("a store");
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
    // Per sweep: one look into each index, and two scripts for each pool of the safety net.
    let per_sweep = 2 + 2 * u64::try_from(SAFETY_NET_POOLS_PER_SWEEP).expect("small");
    assert_eq!(many.get("evalsha"), Some(&(SWEEPS * per_sweep)), "{many:?}");
    for sent in ["smembers", "sscan", "zadd", "scan", "keys"] {
        assert_eq!(many.get(sent), None, "{sent}: {many:?}");
    }
}
