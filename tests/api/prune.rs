//! Pruning: members remember where they came from, and a pool with `prune` removes those
//! its checks keep failing or its source no longer lists, never one added by hand (unless
//! `prune.manual`), and never one with a live lease before the lease ends.

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::for_each_store;
use crate::helpers::{TestApp, read};
use crate::sources::{ListServer, await_source, fetched, member_ids};

/// A loopback port nothing listens on: connecting to it is refused at once.
async fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bound");
    listener.local_addr().expect("an address").port()
}

async fn import(app: &TestApp, pool: &str, list: &str) {
    let response = app
        .admin(Method::POST, &format!("/pools/{pool}/import"))
        .header("content-type", "text/plain")
        .body(list.to_owned())
        .send()
        .await
        .expect("POST import");
    let (status, body) = read(response).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

fn origins(members: &[Value]) -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> = members
        .iter()
        .map(|m| {
            (
                m["member"].as_str().expect("an id").to_owned(),
                m["origin"].as_str().expect("an origin").to_owned(),
            )
        })
        .collect();
    pairs.sort();
    pairs
}

async fn pruned(app: &TestApp, pool: &str) -> Value {
    let (status, body) = app.get(&format!("/pools/{pool}")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["stats"]["pruned"].clone()
}

/// Polls (at most 10 s) until the pool's members satisfy `done`.
async fn await_members(app: &TestApp, pool: &str, done: impl Fn(&[String]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ids = member_ids(app, pool).await;
        if done(&ids) {
            return;
        }
        assert!(Instant::now() < deadline, "{ids:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn a_member_absent_from_k_fetches_is_pruned_while_a_hand_added_one_stays(app: TestApp) {
    let server = ListServer::start("127.0.0.1:1001\n127.0.0.1:1002\n").await;
    // Fetches 2 s apart: time enough to look at the pool between two of them.
    app.create_pool(
        "p",
        json!({
            "rules": {"allow_private": true, "allow_private_sources": true},
            "sources": [{"url": server.url, "interval_ms": 2000}],
            "prune": {"absent_from_source_fetches": 2},
        }),
    )
    .await;
    app.seed("p", &["127.0.0.1:1003"], None).await;
    import(&app, "p", "127.0.0.1:1004\n").await;
    await_source(&app, "p", fetched(1)).await;
    assert_eq!(
        origins(&app.members("p").await),
        [
            ("http://127.0.0.1:1001".to_owned(), server.url.clone()),
            ("http://127.0.0.1:1002".to_owned(), server.url.clone()),
            ("http://127.0.0.1:1003".to_owned(), "manual".to_owned()),
            ("http://127.0.0.1:1004".to_owned(), "import".to_owned()),
        ]
    );
    // 1002 leaves the list: absent from one fetch, it stays; from two, it goes.
    server.serve("127.0.0.1:1001\n");
    await_source(&app, "p", fetched(2)).await;
    assert_eq!(
        member_ids(&app, "p").await,
        [
            "http://127.0.0.1:1001",
            "http://127.0.0.1:1002",
            "http://127.0.0.1:1003",
            "http://127.0.0.1:1004"
        ]
    );
    await_source(&app, "p", fetched(3)).await;
    assert_eq!(
        member_ids(&app, "p").await,
        [
            "http://127.0.0.1:1001",
            "http://127.0.0.1:1003",
            "http://127.0.0.1:1004"
        ]
    );
    assert_eq!(pruned(&app, "p").await, json!(1));
}

/// A pool with a TCP check every 100 ms that prunes after `n` failed checks.
fn checked(n: u64, manual: bool) -> Value {
    json!({
        "rules": {"allow_private": true},
        "health": {"jitter_percent": 0, "check": {"kind": "tcp", "interval_ms": 100, "timeout_ms": 50}},
        "prune": {"after_failed_checks": n, "manual": manual},
    })
}

async fn a_member_whose_last_n_checks_failed_is_pruned_and_a_hand_added_one_stays(app: TestApp) {
    let alive = TcpListener::bind("127.0.0.1:0").await.expect("bound");
    let alive = format!("http://{}", alive.local_addr().expect("an address"));
    let (dead, hand_added) = (closed_port().await, closed_port().await);
    let dead = format!("http://127.0.0.1:{dead}");
    let hand_added = format!("http://127.0.0.1:{hand_added}");
    app.create_pool("p", json!({"rules": {"allow_private": true}}))
        .await;
    import(&app, "p", &format!("{alive}\n{dead}\n")).await;
    app.seed("p", &[&hand_added], None).await;
    app.configure("p", &checked(2, false)).await;
    await_members(&app, "p", |ids| !ids.contains(&dead)).await;
    let members = app.members("p").await;
    let kept: Vec<&str> = members
        .iter()
        .map(|m| m["member"].as_str().expect("an id"))
        .collect();
    let mut expected = [alive.as_str(), hand_added.as_str()];
    expected.sort_unstable();
    let mut kept = kept;
    kept.sort_unstable();
    assert_eq!(kept, expected);
    let hand = members
        .iter()
        .find(|m| m["member"] == json!(hand_added))
        .expect("listed");
    assert_eq!(
        (&hand["origin"], &hand["last_check"]["result"]),
        (&json!("manual"), &json!("failed"))
    );
    assert_eq!(pruned(&app, "p").await, json!(1));
}

async fn with_prune_manual_a_hand_added_member_is_pruned_too(app: TestApp) {
    let hand_added = format!("http://127.0.0.1:{}", closed_port().await);
    app.create_pool("p", json!({"rules": {"allow_private": true}}))
        .await;
    app.seed("p", &[&hand_added], None).await;
    app.configure("p", &checked(1, true)).await;
    await_members(&app, "p", <[String]>::is_empty).await;
    assert_eq!(pruned(&app, "p").await, json!(1));
}

async fn a_leased_member_is_pruned_only_once_its_lease_ends(app: TestApp) {
    let dead = format!("http://127.0.0.1:{}", closed_port().await);
    app.create_pool(
        "p",
        json!({"policy": "least-in-flight", "rules": {"allow_private": true}}),
    )
    .await;
    import(&app, "p", &format!("{dead}\n")).await;
    let (status, body) = app.assign("p").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let lease = body["lease"]["id"].as_str().expect("a lease").to_owned();
    let mut config = checked(1, false);
    config["policy"] = json!("least-in-flight");
    app.configure("p", &config).await;
    // Three failed checks: the rounds after the first two have pruned (or kept) it.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let members = app.members("p").await;
        assert_eq!(members.len(), 1, "the leased member stays: {members:?}");
        if members[0]["consecutive_failures"].as_u64() >= Some(3) {
            break;
        }
        assert!(Instant::now() < deadline, "{members:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(pruned(&app, "p").await, json!(0));
    let response = app
        .anonymous(Method::POST, &format!("/pools/p/leases/{lease}/release"))
        .send()
        .await
        .expect("released");
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    await_members(&app, "p", <[String]>::is_empty).await;
    assert_eq!(pruned(&app, "p").await, json!(1));
}

async fn prune_counts_are_1_to_1000(app: TestApp) {
    let response = app
        .admin(Method::PUT, "/pools/p")
        .json(&json!({"prune": {"after_failed_checks": 0}}))
        .send()
        .await
        .expect("PUT");
    let (status, body) = read(response).await;
    crate::helpers::assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_json");
    app.create_pool("p", json!({"prune": {"absent_from_source_fetches": 3}}))
        .await;
    let (_, body) = app.get("/pools/p").await;
    assert_eq!(
        body["config"]["prune"],
        json!({"absent_from_source_fetches": 3, "manual": false})
    );
}

for_each_store!(
    a_member_absent_from_k_fetches_is_pruned_while_a_hand_added_one_stays,
    a_member_whose_last_n_checks_failed_is_pruned_and_a_hand_added_one_stays,
    with_prune_manual_a_hand_added_member_is_pruned_too,
    a_leased_member_is_pruned_only_once_its_lease_ends,
    prune_counts_are_1_to_1000,
);
