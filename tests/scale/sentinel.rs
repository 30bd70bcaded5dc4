//! The service behind Sentinel: it reaches the primary Sentinel names and follows a failover
//! to the promoted replica without a restart.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{TestApp, redis_cli, test_config};
use crate::topology::{MASTER_NAME, SentinelGroup};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_primary_dies_the_service_follows_sentinel_to_the_promoted_replica() {
    let mut group = SentinelGroup::start();
    let mut config = test_config(None);
    config.redis_sentinel_urls = Some(group.sentinel.url());
    config.redis_sentinel_master = Some(MASTER_NAME.to_owned());
    let app = TestApp::spawn_with(config).await;
    let readyz = async || app.probe("/readyz").await;

    app.create_pool("p", json!({})).await;
    app.seed("p", &["a", "b"], Some(0)).await;
    assert_eq!(app.assigned("p").await, ("a".to_owned(), 1));
    assert_eq!(app.assigned("p").await, ("b".to_owned(), 1));
    assert_eq!(
        readyz().await,
        (
            StatusCode::OK,
            json!({"status": "ready", "store": "redis", "topology": "sentinel",
                   "master": format!("127.0.0.1:{}", group.primary.port())})
        )
    );
    // Every acknowledged write has reached the replica, so the failover loses none.
    assert_eq!(
        redis_cli(&group.primary.url(), &["WAIT", "1", "2000"]),
        redis::Value::Int(1)
    );

    let killed = Instant::now();
    group.primary.kill();
    let deadline = Duration::from_secs(25);
    let mut unavailable = 0;
    let recovered = loop {
        let (status, body) = app.assign("p").await;
        if status == StatusCode::OK {
            assert_eq!(body["proxy"], "a", "{body}");
            break killed.elapsed();
        }
        assert_eq!(
            (status, &body["error"]["code"]),
            (StatusCode::SERVICE_UNAVAILABLE, &json!("store_unavailable")),
            "{body}"
        );
        unavailable += 1;
        assert!(
            killed.elapsed() < deadline,
            "no failover within {deadline:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    println!(
        "sentinel failover: served again {} ms after the primary was killed ({unavailable} \
         answers 503 meanwhile)",
        recovered.as_millis()
    );

    let promoted = format!("127.0.0.1:{}", group.replica.port());
    assert_eq!(group.master_addr(), promoted);
    assert_eq!(app.assigned("p").await, ("b".to_owned(), 2));
    assert_eq!(
        app.counts("p").await,
        [
            ("a".to_owned(), 2, "eligible".to_owned()),
            ("b".to_owned(), 2, "eligible".to_owned())
        ]
    );
    assert_eq!(
        readyz().await,
        (
            StatusCode::OK,
            json!({"status": "ready", "store": "redis", "topology": "sentinel",
                   "master": promoted})
        )
    );
}
