//! Redis killed, its script cache flushed, slowed, stalled and cut off — under load.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;

use crate::chaos::{ChaosProxy, Mode};
use crate::helpers::{RedisServer, TestApp, redis_cli, test_config};
use crate::load::{Load, tally};

const STORE_TIMEOUT: Duration = Duration::from_millis(500);
/// Scheduling slack on a shared 2-core machine, on top of the store timeout.
const SLACK: Duration = Duration::from_millis(400);

async fn app_on(url: String, timeout: Duration) -> TestApp {
    let mut config = test_config(Some(url));
    config.store_timeout_ms = u64::try_from(timeout.as_millis()).expect("small");
    TestApp::spawn_with(config).await
}

async fn seeded(app: &TestApp, members: &[&str]) {
    app.create_pool("p", json!({})).await;
    app.seed("p", members, Some(0)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_under_load_gives_quick_503s_then_recovers_and_no_200_is_lost() {
    let mut redis = RedisServer::start_with_aof();
    let app = app_on(redis.url(), STORE_TIMEOUT).await;
    seeded(&app, &["a", "b", "c", "d"]).await;

    let load = Load::start(std::slice::from_ref(&app.base), "p", 32);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let killed_at = load.started.elapsed();
    redis.kill();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let restarting_at = load.started.elapsed();
    redis.restart(); // returns once Redis answers PING, data reloaded from the AOF
    let back_at = load.started.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let answers = load.stop().await;

    let counts = tally(&answers);
    for status in counts.keys() {
        assert!(
            matches!(status, Some(200 | 503)),
            "unexpected answers: {counts:?}"
        );
    }
    for answer in answers.iter().filter(|a| a.status == Some(503)) {
        assert_eq!(answer.code.as_deref(), Some("store_unavailable"));
        assert!(answer.retry_after, "503 without Retry-After");
        assert!(
            answer.took <= STORE_TIMEOUT + SLACK,
            "a 503 took {:?}",
            answer.took
        );
    }
    let outage: Vec<_> = answers
        .iter()
        .filter(|a| {
            a.sent > killed_at + Duration::from_millis(100) && a.sent + a.took < restarting_at
        })
        .collect();
    assert!(
        outage.len() > 100,
        "only {} requests ran during the outage",
        outage.len()
    );
    assert!(
        outage.iter().all(|a| a.status == Some(503)),
        "a 200 while Redis was down"
    );
    // Every request sent more than 1 s after Redis is back succeeds.
    let late: Vec<_> = answers
        .iter()
        .filter(|a| a.sent > back_at + Duration::from_secs(1))
        .collect();
    assert!(!late.is_empty());
    assert!(
        late.iter().all(|a| a.status == Some(200)),
        "failures after recovery"
    );
    let first_success = answers
        .iter()
        .filter(|a| a.status == Some(200) && a.sent >= back_at)
        .map(|a| a.sent + a.took)
        .min()
        .expect("a success after Redis came back");
    eprintln!(
        "outage: killed at {killed_at:?}, accepting again at {back_at:?}, first 200 {:?} later",
        first_success.saturating_sub(back_at)
    );
    assert!(first_success <= back_at + Duration::from_secs(1));

    // Every 200 is counted. A script that ran just before the kill may have lost only its
    // reply (the worker saw a 503), so the stored total may exceed the 200s by at most the
    // requests that were in flight at that moment: one per client.
    let ok = u64::try_from(counts[&Some(200)]).expect("small");
    let (_, info) = app.get("/pools/p").await;
    let total = info["stats"]["total_assignments"].as_u64().expect("total");
    let stored: u64 = app.counts("p").await.iter().map(|(_, c, _)| c).sum();
    assert_eq!(stored, total, "member counts and the pool total agree");
    assert!(total >= ok && total <= ok + 32, "total {total}, 200s {ok}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushing_the_script_cache_under_load_fails_no_request() {
    let redis = RedisServer::start();
    // This test is about NOSCRIPT, not timeouts: a generous timeout keeps a busy machine
    // from turning slow answers into failures.
    let app = app_on(redis.url(), Duration::from_secs(3)).await;
    seeded(&app, &["a", "b", "c"]).await;
    let load = Load::start(std::slice::from_ref(&app.base), "p", 32);
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        redis_cli(&redis.url(), &["SCRIPT", "FLUSH"]);
    }
    let answers = load.stop().await;
    let counts = tally(&answers);
    assert_eq!(counts.len(), 1, "{counts:?}");
    let ok = counts[&Some(200)] as u64;
    let (_, info) = app.get("/pools/p").await;
    assert_eq!(info["stats"]["total_assignments"], json!(ok));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_redis_gets_503_at_the_timeout_and_the_pool_recovers_when_it_speeds_up() {
    let redis = RedisServer::start();
    let proxy = ChaosProxy::start(redis.addr()).await;
    let timeout = Duration::from_millis(300);
    let app = app_on(proxy.url(), timeout).await;
    seeded(&app, &["a", "b"]).await;
    assert_eq!(app.assign("p").await.0, StatusCode::OK);

    for mode in [Mode::Delay(Duration::from_secs(2)), Mode::Stall] {
        proxy.set(mode);
        let mut slow = Vec::new();
        for _ in 0..8 {
            let app_base = app.base.clone();
            slow.push(tokio::spawn(async move {
                let started = Instant::now();
                let response = reqwest::Client::new()
                    .post(format!("{app_base}/pools/p/assign"))
                    .send()
                    .await
                    .expect("an answer");
                (response.status(), started.elapsed())
            }));
        }
        for request in slow {
            let (status, took) = request.await.expect("finished");
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{mode:?}");
            assert!(
                took >= timeout && took <= timeout + SLACK,
                "{mode:?}: took {took:?}"
            );
        }
        proxy.set(Mode::Pass);
        // The timed-out connection was retired: the next requests go out on a new one.
        for _ in 0..5 {
            let started = Instant::now();
            assert_eq!(app.assign("p").await.0, StatusCode::OK, "after {mode:?}");
            assert!(started.elapsed() < timeout, "{:?}", started.elapsed());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_connections_are_cut_the_next_requests_succeed_on_fresh_connections() {
    let redis = RedisServer::start();
    let proxy = ChaosProxy::start(redis.addr()).await;
    let app = app_on(proxy.url(), STORE_TIMEOUT).await;
    seeded(&app, &["a", "b"]).await;
    for _ in 0..5 {
        assert_eq!(app.assign("p").await.0, StatusCode::OK);
    }
    let mut ok = 5;
    for round in 0..5 {
        proxy.cut();
        // A request that reaches the service before it has noticed the closed socket
        // fails (503): the service never resends an assign that may have reached Redis.
        // Only the first one can; from the first success on, all succeed.
        let mut statuses = Vec::new();
        for _ in 0..10 {
            statuses.push(app.assign("p").await.0.as_u16());
        }
        let first_ok = statuses.iter().position(|s| *s == 200).expect("a success");
        assert!(first_ok <= 1, "round {round}: {statuses:?}");
        assert!(
            statuses[..first_ok].iter().all(|s| *s == 503),
            "round {round}: {statuses:?}"
        );
        assert!(
            statuses[first_ok..].iter().all(|s| *s == 200),
            "round {round}: {statuses:?}"
        );
        ok += 10 - first_ok;
    }
    let (_, info) = app.get("/pools/p").await;
    assert_eq!(info["stats"]["total_assignments"], json!(ok));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_cut_in_the_middle_of_requests_fail_only_those_requests() {
    let redis = RedisServer::start();
    let proxy = ChaosProxy::start(redis.addr()).await;
    let app = app_on(proxy.url(), STORE_TIMEOUT).await;
    seeded(&app, &["a", "b", "c"]).await;
    let load = Load::start(std::slice::from_ref(&app.base), "p", 32);
    // After each cut (and before the first), the next cut waits until 25 requests sent at
    // least 100 ms after it have been answered: the answers after a moment include at most
    // one request per client sent before it, so 32 more are waited for on top.
    let settled = async |load: &Load| {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let answered = load.answered();
        load.await_answers(answered + 32 + 25, Duration::from_secs(30))
            .await;
    };
    let mut cuts = Vec::new();
    for _ in 0..5 {
        settled(&load).await;
        cuts.push(load.started.elapsed());
        proxy.cut();
    }
    settled(&load).await;
    let answers = load.stop().await;
    let counts = tally(&answers);
    assert!(
        counts.keys().all(|s| matches!(s, Some(200 | 503))),
        "{counts:?}"
    );
    let failed = counts.get(&Some(503)).copied().unwrap_or(0);
    // At most the requests in flight at each cut (one per client) plus the ones that raced
    // with noticing it.
    assert!(
        failed <= cuts.len() * 32,
        "{failed} failures for {} cuts",
        cuts.len()
    );
    // Between cuts, the service is back to serving: every request sent 100 ms or more
    // after a cut and answered before the next one succeeded.
    let mut checked = 0;
    for answer in &answers {
        let after = cuts.iter().rev().find(|c| **c <= answer.sent);
        let next = cuts.iter().find(|c| **c > answer.sent);
        let settled = after.is_some_and(|c| answer.sent - *c >= Duration::from_millis(100));
        let untouched = next.is_none_or(|c| answer.sent + answer.took < *c);
        if settled && untouched {
            assert_eq!(answer.status, Some(200), "{answer:?} (cuts at {cuts:?})");
            checked += 1;
        }
    }
    assert!(checked > 100, "only {checked} requests between cuts");
    let ok = counts[&Some(200)] as u64;
    let (_, info) = app.get("/pools/p").await;
    let total = info["stats"]["total_assignments"].as_u64().expect("total");
    assert!(
        total >= ok && total <= ok + failed as u64,
        "total {total}, 200s {ok}, 503s {failed}"
    );
}
