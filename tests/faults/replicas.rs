//! Several service processes sharing one Redis stay exact.

use std::collections::BTreeMap;

use serde_json::json;

use crate::helpers::{ADMIN, RedisServer};
use crate::load::{Load, tally};
use crate::process::ServiceProcess;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_on_one_redis_keep_counts_within_one_and_sum_to_the_200s() {
    let redis = RedisServer::start();
    let env = [
        ("REDIS_URL", redis.url()),
        ("KEY_PREFIX", "replicas".to_owned()),
    ];
    let services: Vec<ServiceProcess> = (0..3).map(|_| ServiceProcess::start(&env)).collect();
    let client = reqwest::Client::new();
    let admin = |method: reqwest::Method, path: &str| {
        client
            .request(method, format!("{}{path}", services[0].base))
            .bearer_auth(ADMIN)
    };
    admin(reqwest::Method::PUT, "/pools/p")
        .send()
        .await
        .expect("created");
    let members: Vec<String> = (0..5).map(|i| format!("m{i}")).collect();
    admin(reqwest::Method::POST, "/pools/p/members")
        .json(&json!({"members": members, "assignments": 0}))
        .send()
        .await
        .expect("seeded");

    let bases: Vec<String> = services.iter().map(|s| s.base.clone()).collect();
    let load = Load::start(&bases, "p", 64);
    // The load runs until the replicas have handed out 1000 assignments between them,
    // however long a busy machine takes (a fixed time measured the machine, not the code).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let info: serde_json::Value = admin(reqwest::Method::GET, "/pools/p")
            .send()
            .await
            .expect("pool info")
            .json()
            .await
            .expect("JSON");
        if info["stats"]["total_assignments"].as_u64() >= Some(1000) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no 1000 assigns in 120 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let answers = load.stop().await;
    let counts = tally(&answers);
    assert_eq!(
        counts.keys().collect::<Vec<_>>(),
        [&Some(200)],
        "{counts:?}"
    );
    let ok = counts[&Some(200)] as u64;
    assert!(ok >= 1000, "only {ok} assigns");

    let mut handed_out: BTreeMap<String, u64> = BTreeMap::new();
    for answer in &answers {
        *handed_out
            .entry(answer.proxy.clone().expect("a proxy"))
            .or_default() += 1;
    }
    // Read back through another replica than the one that seeded.
    let listing: serde_json::Value = client
        .get(format!("{}/pools/p/members", services[2].base))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("listed")
        .json()
        .await
        .expect("JSON");
    let stored: BTreeMap<String, u64> = listing["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| {
            (
                m["member"].as_str().expect("id").to_owned(),
                m["assignments"].as_u64().expect("n"),
            )
        })
        .collect();
    assert_eq!(stored, handed_out);
    assert_eq!(stored.values().sum::<u64>(), ok);
    let (min, max) = (
        stored.values().min().copied(),
        stored.values().max().copied(),
    );
    assert!(
        max.zip(min).is_some_and(|(max, min)| max - min <= 1),
        "{stored:?}"
    );
}
