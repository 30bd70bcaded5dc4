//! Exactness under concurrency: counts never lost, never doubled, never more than one
//! apart on a pool of equal members, whatever runs at the same time.

use std::collections::BTreeMap;
use std::sync::Arc;

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::for_each_store;
use crate::helpers::TestApp;

const CLIENTS: usize = 32;

/// Runs `CLIENTS` workers doing `per_client` assigns each; returns (status -> how many,
/// proxy -> how many 200s named it).
async fn hammer(
    app: &Arc<TestApp>,
    pool: &str,
    per_client: usize,
) -> (BTreeMap<u16, u64>, BTreeMap<String, u64>) {
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let app = Arc::clone(app);
        let pool = pool.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut statuses = BTreeMap::new();
            let mut proxies = BTreeMap::new();
            for _ in 0..per_client {
                let (status, body) = app.assign(&pool).await;
                *statuses.entry(status.as_u16()).or_insert(0u64) += 1;
                if status == StatusCode::OK {
                    let proxy = body["proxy"].as_str().expect("proxy").to_owned();
                    *proxies.entry(proxy).or_insert(0u64) += 1;
                }
            }
            (statuses, proxies)
        }));
    }
    let mut statuses = BTreeMap::new();
    let mut proxies = BTreeMap::new();
    for task in tasks {
        let (s, p) = task.await.expect("worker finished");
        for (k, v) in s {
            *statuses.entry(k).or_insert(0) += v;
        }
        for (k, v) in p {
            *proxies.entry(k).or_insert(0) += v;
        }
    }
    (statuses, proxies)
}

async fn concurrent_assigns_keep_equal_members_within_one_and_sum_to_the_200s(app: TestApp) {
    let app = Arc::new(app);
    app.create_pool("hot", json!({})).await;
    let members: Vec<String> = (0..7).map(|i| format!("proxy-{i}")).collect();
    let refs: Vec<&str> = members.iter().map(String::as_str).collect();
    app.seed("hot", &refs, Some(0)).await;

    let (statuses, handed_out) = hammer(&app, "hot", 100).await;
    assert_eq!(statuses, BTreeMap::from([(200, 3200)]));

    let counts = app.counts("hot").await;
    let stored: BTreeMap<String, u64> = counts.iter().map(|(m, c, _)| (m.clone(), *c)).collect();
    // What the store counted is exactly what the clients were handed, member by member,
    // and the pool's own total agrees.
    assert_eq!(stored, handed_out);
    let (_, info) = app.get("/pools/hot").await;
    assert_eq!(info["stats"]["total_assignments"], json!(3200));
    let min = stored.values().min().copied().unwrap_or(0);
    let max = stored.values().max().copied().unwrap_or(0);
    assert!(max - min <= 1, "counts differ by more than one: {stored:?}");
}

async fn enables_racing_with_assigns_never_lose_or_double_count(app: TestApp) {
    let app = Arc::new(app);
    app.create_pool("race", json!({"restore": "minimum"})).await;
    app.seed("race", &["a", "b", "c", "d"], Some(0)).await;
    app.post_json(
        "/pools/race/members/disable",
        json!({"members": ["c", "d"]}),
    )
    .await;

    let toggler = {
        let app = Arc::clone(&app);
        tokio::spawn(async move {
            // Bounce c and d in and out while the workers assign.
            let mut restored = 0u64;
            for round in 0..30 {
                let path = if round % 2 == 0 { "enable" } else { "disable" };
                let (status, body) = app
                    .post_json(
                        &format!("/pools/race/members/{path}"),
                        json!({"members": ["c", "d"]}),
                    )
                    .await;
                assert_eq!(status, StatusCode::OK, "{body}");
                restored += body["enabled"].as_array().map_or(0, |e| e.len() as u64);
            }
            restored
        })
    };
    let (statuses, handed_out) = hammer(&app, "race", 60).await;
    assert_eq!(toggler.await.expect("toggler finished"), 30);
    assert_eq!(statuses, BTreeMap::from([(200, 1920)]));

    // Restores move counts on purpose, so the sum of stored counts is not the number of
    // assignments; the pool's own total is, and it must match the 200s exactly.
    let (_, info) = app.get("/pools/race").await;
    assert_eq!(info["stats"]["total_assignments"], json!(1920));
    // a and b were eligible throughout, so they were handed out; the last toggle took c
    // and d out again.
    assert!(
        handed_out.contains_key("a") && handed_out.contains_key("b"),
        "{handed_out:?}"
    );
    let states: Vec<(String, String)> = app
        .counts("race")
        .await
        .into_iter()
        .map(|(member, _, state)| (member, state))
        .collect();
    let mut states = states;
    states.sort();
    assert_eq!(
        states,
        [
            ("a", "eligible"),
            ("b", "eligible"),
            ("c", "ineligible"),
            ("d", "ineligible")
        ]
        .map(|(m, s)| (m.to_owned(), s.to_owned()))
    );
}

async fn deleting_a_pool_while_assigns_run_yields_only_200_204_or_404(app: TestApp) {
    let app = Arc::new(app);
    app.create_pool("doomed", json!({})).await;
    app.seed("doomed", &["a", "b"], None).await;
    let deleter = {
        let app = Arc::clone(&app);
        tokio::spawn(async move {
            for round in 0..20 {
                tokio::task::yield_now().await;
                let response = app
                    .admin(Method::DELETE, "/pools/doomed")
                    .send()
                    .await
                    .expect("sent");
                assert!(matches!(response.status().as_u16(), 204 | 404));
                if round % 2 == 0 {
                    let _ = app
                        .admin(Method::PUT, "/pools/doomed")
                        .json(&json!({}))
                        .send()
                        .await
                        .expect("sent");
                    app.seed("doomed", &["a"], None).await;
                }
            }
        })
    };
    let (statuses, handed_out) = hammer(&app, "doomed", 40).await;
    deleter.await.expect("deleter finished");
    for status in statuses.keys() {
        assert!(
            matches!(status, 200 | 204 | 404),
            "unexpected status {status}: {statuses:?}"
        );
    }
    // Only members the pool ever had were handed out.
    for proxy in handed_out.keys() {
        assert!(proxy == "a" || proxy == "b", "{proxy}: {handed_out:?}");
    }
    // The last round deleted the pool: it is gone, and so is everything it held.
    assert_eq!(app.assign("doomed").await.0, StatusCode::NOT_FOUND);
    let (_, pools) = app.get("/pools").await;
    assert_eq!(pools["pools"], json!([]));
}

for_each_store!(
    concurrent_assigns_keep_equal_members_within_one_and_sum_to_the_200s,
    enables_racing_with_assigns_never_lose_or_double_count,
    deleting_a_pool_while_assigns_run_yields_only_200_204_or_404,
);
