//! The service on a Redis Cluster of three primaries: pools spread over every primary, one
//! command per assign on the owning primary, and a primary's failover.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{
    NEVER_PER_ASSIGN, TestApp, abandoned_work_ends, assert_abandoned_work_ended_on_time,
    command_calls, command_delta, redis_cli, test_config, without_background_traffic,
};
use crate::topology::RedisCluster;

/// The service on `cluster`, with no background traffic (sweep, metrics refresh) that
/// would blur the counts of commands.
async fn app_on(cluster: &RedisCluster) -> TestApp {
    let mut config = test_config(None);
    config.redis_cluster_urls = Some(cluster.seeds());
    without_background_traffic(&mut config);
    TestApp::spawn_with(config).await
}

/// For each primary (in port order), the first pool `<stem>-<n>` whose hash slot it serves.
fn pool_per_primary(cluster: &RedisCluster, stem: &str) -> Vec<(String, u16)> {
    let primaries = cluster.primaries();
    let mut chosen: BTreeMap<u16, String> = BTreeMap::new();
    for n in 0.. {
        if chosen.len() == primaries.len() {
            break;
        }
        let pool = format!("{stem}-{n}");
        let owner = cluster.primary_for(cluster.slot(&pool));
        chosen.entry(owner).or_insert(pool);
    }
    chosen
        .into_iter()
        .map(|(port, pool)| (pool, port))
        .collect()
}

async fn readyz(app: &TestApp) -> (StatusCode, Value) {
    app.probe("/readyz").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_on_every_primary_seed_assign_disable_enable_and_lease() {
    let cluster = RedisCluster::start();
    let app = app_on(&cluster).await;
    let used = pool_per_primary(&cluster, "used");
    let leased = pool_per_primary(&cluster, "leased");
    assert_eq!(used.len(), 3);

    for (pool, port) in &used {
        app.create_pool(pool, json!({})).await;
        app.seed(pool, &["a", "b", "c"], Some(0)).await;
        // The pool's keys live on the primary its hash slot belongs to.
        let meta = format!("{}:{{{pool}}}:meta", app.key_prefix);
        assert_eq!(
            redis_cli(&cluster.url(*port), &["EXISTS", &meta]),
            redis::Value::Int(1)
        );
        assert_eq!(app.assigned(pool).await, ("a".to_owned(), 1));
        let (status, body) = app
            .post_json(
                &format!("/pools/{pool}/members/disable"),
                json!({"members": ["b"], "reason": "slow"}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["disabled"], json!(["b"]));
        assert_eq!(app.assigned(pool).await, ("c".to_owned(), 1));
        let (status, body) = app
            .post_json(
                &format!("/pools/{pool}/members/enable"),
                json!({"members": ["b"]}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        // Back at the minimum of the eligible members (the default restore policy).
        assert_eq!(
            body["enabled"],
            json!([{"member": "b", "kept_assignments": 0, "assignments": 1}])
        );
        assert_eq!(app.assigned(pool).await, ("a".to_owned(), 2));
    }
    for (pool, _) in &leased {
        app.create_pool(pool, json!({"policy": "least-in-flight"}))
            .await;
        app.seed(pool, &["x", "y"], Some(0)).await;
        let (status, body) = app.assign(pool).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(
            (&body["proxy"], &body["in_flight"]),
            (&json!("x"), &json!(1))
        );
        let lease = body["lease"]["id"].as_str().expect("a lease id");
        let (status, _) = app
            .post_json(&format!("/pools/{pool}/leases/{lease}/release"), json!({}))
            .await;
        assert_eq!(status, StatusCode::NO_CONTENT);
        let (status, body) = app
            .post_json(&format!("/pools/{pool}/leases/{lease}/release"), json!({}))
            .await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    }

    let (status, body) = app.get("/pools").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let mut listed: Vec<&str> = body["pools"]
        .as_array()
        .expect("pools")
        .iter()
        .map(|p| p["pool"].as_str().expect("a pool id"))
        .collect();
    listed.sort_unstable();
    let mut expected: Vec<&str> = used
        .iter()
        .chain(&leased)
        .map(|(pool, _)| pool.as_str())
        .collect();
    expected.sort_unstable();
    assert_eq!(listed, expected);

    // Primaries that lost their script cache (a restart, SCRIPT FLUSH) load it again, for
    // a page of the listing (one call per pool, each on its pool's primary) as for assigns.
    for port in cluster.primaries() {
        redis_cli(&cluster.url(port), &["SCRIPT", "FLUSH"]);
    }
    assert_eq!(app.get("/pools").await, (StatusCode::OK, body));
    for (pool, _) in &used {
        assert_eq!(app.assigned(pool).await, ("b".to_owned(), 2));
    }
    assert_eq!(
        readyz(&app).await,
        (
            StatusCode::OK,
            json!({"status": "ready", "store": "redis", "topology": "cluster", "primaries": 3})
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bans_and_rests_for_a_target_live_on_the_pool_s_primary_and_steer_its_assigns() {
    let cluster = RedisCluster::start();
    let app = app_on(&cluster).await;
    for (pool, port) in pool_per_primary(&cluster, "banned") {
        app.create_pool(&pool, json!({})).await;
        app.seed(&pool, &["a", "b"], Some(0)).await;
        let (status, body) = app
            .post_json(
                &format!("/pools/{pool}/outcomes"),
                json!({"proxy": "a", "result": "blocked", "target": "shop.example.com"}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["outcomes"][0]["effect"], json!("banned"), "{body}");
        // The ban index and the target's hash are in the pool's slot, on its primary.
        for key in ["bans", "bans:shop.example.com"] {
            let key = format!("{}:{{{pool}}}:{key}", app.key_prefix);
            assert_eq!(
                redis_cli(&cluster.url(port), &["EXISTS", &key]),
                redis::Value::Int(1),
                "{key}"
            );
        }
        for _ in 0..2 {
            let (status, body) = app
                .post_json(
                    &format!("/pools/{pool}/assign"),
                    json!({"target": "shop.example.com"}),
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{body}");
            assert_eq!(body["proxy"], json!("b"), "{body}");
        }
        let (status, body) = app
            .get(&format!("/pools/{pool}/members?target=shop.example.com"))
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["members"][0]["member"], json!("a"), "{body}");
        assert!(body["members"][0]["banned_until"].is_string(), "{body}");
        assert_eq!(body["members"][1]["banned_until"], Value::Null, "{body}");
        // Pacing per target rests the member handed out in the same slot.
        app.configure(
            &pool,
            &json!({"pacing": {"min_interval_ms": 60000, "per_target": true}}),
        )
        .await;
        let (status, body) = app
            .post_json(
                &format!("/pools/{pool}/assign"),
                json!({"target": "news.example.org"}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let rests = format!("{}:{{{pool}}}:paced:news.example.org", app.key_prefix);
        assert_eq!(
            redis_cli(&cluster.url(port), &["EXISTS", &rests]),
            redis::Value::Int(1),
            "{rests}"
        );
        let (status, body) = app
            .post_json(
                &format!("/pools/{pool}/assign"),
                json!({"target": "news.example.org"}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let (status, _) = app
            .post_json(
                &format!("/pools/{pool}/assign"),
                json!({"target": "news.example.org"}),
            )
            .await;
        assert_eq!(status, StatusCode::NO_CONTENT);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_live_on_the_pool_s_primary_and_keep_its_assigns_on_one_member() {
    let cluster = RedisCluster::start();
    let app = app_on(&cluster).await;
    for (pool, port) in pool_per_primary(&cluster, "sticky") {
        app.create_pool(&pool, json!({})).await;
        app.seed(&pool, &["a", "b", "c"], Some(0)).await;
        // An id with braces of its own: the key's hash tag is still the pool's.
        let session = json!({"session": "{other}:login"});
        for assignments in 1..=3 {
            let (status, body) = app
                .post_json(&format!("/pools/{pool}/assign"), session.clone())
                .await;
            assert_eq!(status, StatusCode::OK, "{body}");
            assert_eq!(
                (
                    &body["proxy"],
                    &body["assignments"],
                    &body["session"]["repinned"]
                ),
                (&json!("a"), &json!(assignments), &json!(false)),
                "{body}"
            );
        }
        // The session index and the session's key are in the pool's slot, on its primary.
        for key in ["sessions", "sessions:{other}:login"] {
            let key = format!("{}:{{{pool}}}:{key}", app.key_prefix);
            assert_eq!(
                redis_cli(&cluster.url(port), &["EXISTS", &key]),
                redis::Value::Int(1),
                "{key}"
            );
        }
        app.post_json(
            &format!("/pools/{pool}/members/disable"),
            json!({"members": ["a"]}),
        )
        .await;
        let (status, body) = app
            .post_json(&format!("/pools/{pool}/assign"), session.clone())
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(
            (&body["proxy"], &body["session"]["repinned"]),
            (&json!("b"), &json!(true)),
            "{body}"
        );
        let (status, _) = app
            .anonymous(
                reqwest::Method::DELETE,
                &format!("/pools/{pool}/sessions/%7Bother%7D:login"),
            )
            .send()
            .await
            .map(|r| (r.status(), ()))
            .expect("sent");
        assert_eq!(status, StatusCode::NO_CONTENT);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_assign_carrying_done_is_one_evalsha_on_the_pool_s_primary_and_bans_in_its_slot() {
    let cluster = RedisCluster::start();
    let app = app_on(&cluster).await;
    let primaries = cluster.primaries();
    for (pool, owner) in pool_per_primary(&cluster, "done") {
        app.create_pool(&pool, json!({})).await;
        app.seed(&pool, &["a", "b"], Some(0)).await;
        // Scripts loaded before anything is counted.
        app.assigned(&pool).await;
        let before: Vec<_> = primaries
            .iter()
            .map(|port| command_calls(&cluster.url(*port)))
            .collect();
        let (status, body) = app
            .post_json(
                &format!("/pools/{pool}/assign"),
                json!({"target": "shop.example.com",
                       "done": {"proxy": "a", "result": "blocked", "target": "shop.example.com"}}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(
            (&body["proxy"], &body["done"]["effect"]),
            (&json!("b"), &json!("banned")),
            "{body}"
        );
        for (port, before) in primaries.iter().zip(&before) {
            let seen = command_delta(before, &command_calls(&cluster.url(*port)));
            let evalshas = (*port == owner).then_some(1);
            assert_eq!(
                seen.get("evalsha").copied(),
                evalshas,
                "port {port}: {seen:?}"
            );
        }
        let key = format!("{}:{{{pool}}}:bans:shop.example.com", app.key_prefix);
        assert_eq!(
            redis_cli(&cluster.url(owner), &["EXISTS", &key]),
            redis::Value::Int(1),
            "{key}"
        );
    }
}

const ASSIGNS: u64 = 512;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_assign_costs_one_evalsha_on_the_owning_primary_and_nothing_on_the_others() {
    let cluster = RedisCluster::start();
    let app = Arc::new(app_on(&cluster).await);
    let (pool, owner) = pool_per_primary(&cluster, "p").swap_remove(0);
    app.create_pool(&pool, json!({})).await;
    app.seed(&pool, &["a", "b", "c"], Some(0)).await;
    // Connections dialled and scripts loaded before anything is counted.
    for _ in 0..10 {
        app.assigned(&pool).await;
    }
    let primaries = cluster.primaries();
    let before: Vec<_> = primaries
        .iter()
        .map(|port| command_calls(&cluster.url(*port)))
        .collect();

    let mut clients = Vec::new();
    for _ in 0..16 {
        let app = Arc::clone(&app);
        let pool = pool.clone();
        clients.push(tokio::spawn(async move {
            for _ in 0..ASSIGNS / 16 {
                app.assigned(&pool).await;
            }
        }));
    }
    for client in clients {
        client.await.expect("client finished");
    }

    for (port, before) in primaries.iter().zip(&before) {
        let seen = command_delta(before, &command_calls(&cluster.url(*port)));
        let evalshas = (*port == owner).then_some(ASSIGNS);
        assert_eq!(
            seen.get("evalsha").copied(),
            evalshas,
            "port {port}: {seen:?}"
        );
        for extra in NEVER_PER_ASSIGN {
            assert_eq!(
                seen.get(extra),
                None,
                "{extra} reached port {port}: {seen:?}"
            );
        }
    }
}

/// Every answer one client got on one pool: when it arrived (since the kill) and its status.
type Answers = Vec<(Duration, StatusCode)>;

/// Assigns on `pool` in a loop until `stop` flips, recording every answer.
fn assign_until_stopped(
    app: &Arc<TestApp>,
    pool: &str,
    since: Instant,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<Answers> {
    let (app, pool, stop) = (Arc::clone(app), pool.to_owned(), stop.clone());
    tokio::spawn(async move {
        let mut answers = Vec::new();
        while !*stop.borrow() {
            let (status, body) = app.assign(&pool).await;
            if status != StatusCode::OK {
                assert_eq!(body["error"]["code"], "store_unavailable", "{body}");
            }
            answers.push((since.elapsed(), status));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        answers
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_a_primary_dies_only_its_pools_answer_503_until_its_replica_takes_over() {
    let mut cluster = RedisCluster::start();
    let app = Arc::new(app_on(&cluster).await);
    let pools = pool_per_primary(&cluster, "f");
    for (pool, _) in &pools {
        app.create_pool(pool, json!({})).await;
        app.seed(pool, &["a", "b", "c", "d"], Some(0)).await;
        for _ in 0..6 {
            app.assigned(pool).await;
        }
    }
    let (victim, victim_port) = pools[0].clone();
    let heir = cluster.replica_of(victim_port);
    // Every acknowledged write has reached the replica, so nothing is lost to asynchronous
    // replication; and the replica forgets its scripts, as a restarted node would, so that
    // its first script call after the promotion answers NOSCRIPT.
    assert_eq!(
        redis_cli(&cluster.url(victim_port), &["WAIT", "1", "2000"]),
        redis::Value::Int(1)
    );
    redis_cli(&cluster.url(heir), &["SCRIPT", "FLUSH"]);

    let killed = Instant::now();
    cluster.kill(victim_port);
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let clients: Vec<_> = pools
        .iter()
        .map(|(pool, _)| assign_until_stopped(&app, pool, killed, &stopping))
        .collect();
    let deadline = Duration::from_secs(20);
    let recovered = loop {
        let (status, _) = app.assign(&victim).await;
        if status == StatusCode::OK {
            break killed.elapsed();
        }
        assert!(
            killed.elapsed() < deadline,
            "no failover within {deadline:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Some more traffic on the new primary before stopping.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _ = stop.send(true);
    let mut answers = Vec::new();
    for client in clients {
        answers.push(client.await.expect("client finished"));
    }
    println!(
        "cluster failover: pool {victim} served again {} ms after its primary was killed",
        recovered.as_millis()
    );

    let statuses = |answers: &Answers| -> Vec<StatusCode> {
        let mut seen: Vec<StatusCode> = answers.iter().map(|(_, status)| *status).collect();
        seen.dedup();
        seen
    };
    // The victim's pool: unavailable, then served again, never back and forth.
    assert_eq!(
        statuses(&answers[0]),
        [StatusCode::SERVICE_UNAVAILABLE, StatusCode::OK]
    );
    // The other primaries' pools never noticed.
    for (other, answers) in pools.iter().zip(&answers).skip(1) {
        assert_eq!(statuses(answers), [StatusCode::OK], "pool {}", other.0);
    }
    assert_eq!(cluster.primary_for(cluster.slot(&victim)), heir);

    // Every assignment answered 200 is counted once, on the promoted replica.
    let answered_ok = 6
        + 1
        + answers[0]
            .iter()
            .filter(|(_, status)| *status == StatusCode::OK)
            .count() as u64;
    let counted: u64 = app
        .counts(&victim)
        .await
        .iter()
        .map(|(_, assignments, _)| assignments)
        .sum();
    assert_eq!(counted, answered_ok);
    assert_eq!(
        readyz(&app).await,
        (
            StatusCode::OK,
            json!({"status": "ready", "store": "redis", "topology": "cluster", "primaries": 3})
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_and_cooldowns_end_on_time_in_pools_on_every_primary_nobody_assigns_from() {
    let cluster = RedisCluster::start();
    // The background sweep runs, unlike in `app_on`: it is what this test is about.
    let mut config = test_config(None);
    config.redis_cluster_urls = Some(cluster.seeds());
    let app = TestApp::spawn_with(config).await;
    let leased = pool_per_primary(&cluster, "leased");
    let cooling = pool_per_primary(&cluster, "cooling");
    // Each pool's keys live on its own primary; the due index lives on whichever serves
    // its slot, so every index update crosses to another primary for two of the three.
    for ((leased, _), (cooling, _)) in leased.iter().zip(&cooling) {
        assert_abandoned_work_ended_on_time(abandoned_work_ends(&app, leased, cooling).await);
    }
}
