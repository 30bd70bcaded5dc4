//! Large operations on a large pool stay atomic for readers while they are split into
//! short steps: a pool being deleted answers either whole or 404, never half; an import is
//! seen in whole chunks.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use proxy_allocator::http::MAX_MEMBERS_PER_CALL;
use proxy_allocator::store::CHUNK_GRANULE;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use crate::for_each_store;
use crate::helpers::{ADMIN, TestApp, read, redis_cli};
use crate::import::{import_text, public_list};

/// Members of the large pool: enough that freeing them, or writing them, takes many steps.
const LARGE: usize = 30_000;

/// How many readers race each operation.
const READERS: usize = 4;

/// An admin GET through `client`, for reader tasks that do not hold the app.
async fn get(client: &reqwest::Client, base: &str, path: &str) -> (StatusCode, Value) {
    let response = client
        .get(format!("{base}{path}"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("request sent");
    read(response).await
}

async fn readers_racing_the_deletion_of_a_large_pool_see_it_whole_or_not_at_all(app: TestApp) {
    app.create_pool("big", json!({})).await;
    let (status, body) = import_text(&app, "/pools/big/import", &public_list(LARGE)).await;
    assert_eq!((status, &body["added"]), (StatusCode::OK, &json!(LARGE)));
    let whole_once = Arc::new(Semaphore::new(0));
    let readers: Vec<_> = (0..READERS)
        .map(|_| {
            let (client, base) = (app.client.clone(), app.base.clone());
            let whole_once = whole_once.clone();
            tokio::spawn(async move {
                let (mut whole, mut gone) = (0_u64, false);
                // The last member of the listing, and the pool's numbers: both as before
                // the deletion, or both 404 once it is gone; never anything in between.
                let last = format!("/pools/big/members?limit=5&cursor={}.0", LARGE - 1);
                while !gone {
                    let info = get(&client, &base, "/pools/big").await;
                    let page = get(&client, &base, &last).await;
                    match (info.0, page.0) {
                        (StatusCode::OK, StatusCode::OK) => {
                            assert_eq!(info.1["stats"]["eligible"], json!(LARGE), "{}", info.1);
                            assert_eq!(page.1["members"].as_array().map(Vec::len), Some(1));
                            assert_eq!(page.1["next_cursor"], Value::Null);
                            whole += 1;
                            if whole == 1 {
                                whole_once.add_permits(1);
                            }
                        }
                        // Deleted between the two reads.
                        (StatusCode::OK, StatusCode::NOT_FOUND) => {
                            assert_eq!(info.1["stats"]["eligible"], json!(LARGE), "{}", info.1);
                            gone = true;
                        }
                        (StatusCode::NOT_FOUND, StatusCode::NOT_FOUND) => gone = true,
                        other => panic!("a reader saw {other:?}: {} {}", info.1, page.1),
                    }
                }
                // Gone for good: the next reads answer 404 too.
                assert_eq!(
                    get(&client, &base, "/pools/big").await.0,
                    StatusCode::NOT_FOUND
                );
                whole
            })
        })
        .collect();
    let permits = u32::try_from(READERS).expect("a few readers");
    drop(whole_once.acquire_many(permits).await.expect("open"));
    let response = app
        .admin(reqwest::Method::DELETE, "/pools/big")
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    for reader in readers {
        assert!(reader.await.expect("the reader finished") >= 1);
    }
    assert_eq!(
        app.get("/pools").await.1,
        json!({"pools": [], "next_cursor": null})
    );
    if let Some(url) = &app.redis_url {
        // Nothing is left behind, not even under the graveyard names.
        let pattern = format!("{}:{{big}}:*", app.key_prefix);
        assert_eq!(
            redis_cli(url, &["KEYS", &pattern]),
            redis::Value::Array(vec![])
        );
    }
}

/// Reads `stats.<field>` of `pool` over and over until `stop` is set; every value seen.
fn watch(
    app: &TestApp,
    pool: &str,
    field: &'static str,
    stop: Arc<AtomicBool>,
) -> JoinHandle<Vec<u64>> {
    let (client, base) = (app.client.clone(), app.base.clone());
    let path = format!("/pools/{pool}");
    tokio::spawn(async move {
        let mut seen = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            let (status, info) = get(&client, &base, &path).await;
            assert_eq!(status, StatusCode::OK, "{info}");
            seen.push(info["stats"][field].as_u64().expect("a count"));
        }
        seen
    })
}

/// Every value `seen` is a whole number of chunks (or the call's total, after its last
/// chunk), and some were seen part-way: the readers raced the call.
fn assert_whole_chunks(seen: &[u64], total: u64) {
    let granule = CHUNK_GRANULE as u64;
    let halves: Vec<u64> = seen
        .iter()
        .copied()
        .filter(|n| n % granule != 0 && *n != total)
        .collect();
    assert_eq!(halves, [] as [u64; 0], "counts between two chunks' ends");
    assert!(
        seen.iter().any(|n| 0 < *n && *n < total),
        "no reader saw the call part-way: {} reads",
        seen.len()
    );
}

async fn an_import_is_seen_by_readers_in_whole_chunks(app: TestApp) {
    app.create_pool("big", json!({})).await;
    // Not a whole number of chunks: only the last one may hold the rest.
    let total = LARGE + 50;
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..READERS)
        .map(|_| watch(&app, "big", "eligible", stop.clone()))
        .collect();
    let (status, body) = import_text(&app, "/pools/big/import", &public_list(total)).await;
    assert_eq!((status, &body["added"]), (StatusCode::OK, &json!(total)));
    stop.store(true, Ordering::SeqCst);
    let mut seen = Vec::new();
    for reader in readers {
        seen.extend(reader.await.expect("the reader finished"));
    }
    assert_whole_chunks(&seen, total as u64);
}

async fn disabling_ten_thousand_members_is_seen_by_readers_in_whole_chunks(app: TestApp) {
    app.create_pool("big", json!({})).await;
    let list = public_list(MAX_MEMBERS_PER_CALL);
    let (status, _) = import_text(&app, "/pools/big/import", &list).await;
    assert_eq!(status, StatusCode::OK);
    let members: Vec<String> = list.lines().map(str::to_owned).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..READERS)
        .map(|_| watch(&app, "big", "ineligible", stop.clone()))
        .collect();
    let (status, body) = app
        .post_json("/pools/big/members/disable", json!({ "members": members }))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body["disabled"].as_array().map(Vec::len),
        Some(MAX_MEMBERS_PER_CALL)
    );
    stop.store(true, Ordering::SeqCst);
    let mut seen = Vec::new();
    for reader in readers {
        seen.extend(reader.await.expect("the reader finished"));
    }
    assert_whole_chunks(&seen, MAX_MEMBERS_PER_CALL as u64);
}

async fn a_page_of_a_thousand_from_both_sets_lists_every_member_once_in_order(app: TestApp) {
    // Pages larger than what one step reads of each set (on Redis, 250 members).
    app.create_pool("big", json!({})).await;
    let list = public_list(1_200);
    let (status, _) = import_text(&app, "/pools/big/import", &list).await;
    assert_eq!(status, StatusCode::OK);
    let mut ids: Vec<String> = list.lines().map(|line| format!("http://{line}")).collect();
    let (status, _) = app
        .post_json(
            "/pools/big/members/disable",
            json!({ "members": ids.iter().step_by(2).collect::<Vec<_>>() }),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    // Every count is 0, so the order is the ids' byte order, both sets merged.
    ids.sort();
    let listed = |page: &Value| -> Vec<String> {
        page["members"]
            .as_array()
            .expect("members")
            .iter()
            .map(|m| m["member"].as_str().expect("member").to_owned())
            .collect()
    };
    let (_, first) = app.get("/pools/big/members?limit=1000").await;
    assert_eq!(listed(&first), ids[..1_000]);
    assert_eq!(first["next_cursor"], json!("500.500"));
    let (_, second) = app
        .get("/pools/big/members?limit=1000&cursor=500.500")
        .await;
    assert_eq!(listed(&second), ids[1_000..]);
    assert_eq!(second["next_cursor"], Value::Null);
}

async fn a_page_deep_in_both_sets_starts_where_its_cursor_says(app: TestApp) {
    // Deeper than the embedded store walks in one turn of its lock (10,000 members of a
    // set), in both sets.
    app.create_pool("big", json!({})).await;
    let list = public_list(LARGE);
    let (status, _) = import_text(&app, "/pools/big/import", &list).await;
    assert_eq!(status, StatusCode::OK);
    let ids: Vec<String> = list.lines().map(|line| format!("http://{line}")).collect();
    let disabled: Vec<&String> = ids[..24_000].iter().step_by(2).collect();
    let taken_out: std::collections::HashSet<&String> = disabled.iter().copied().collect();
    for call in disabled.chunks(MAX_MEMBERS_PER_CALL) {
        let (status, _) = app
            .post_json("/pools/big/members/disable", json!({ "members": call }))
            .await;
        assert_eq!(status, StatusCode::OK);
    }
    let (mut eligible, mut ineligible): (Vec<&String>, Vec<&String>) =
        ids.iter().partition(|id| !taken_out.contains(id));
    eligible.sort();
    ineligible.sort();
    let (skip_eligible, skip_ineligible) = (17_000, 11_500);
    // Every count is 0: the page is the rest of both sets merged in id order.
    let mut rest: Vec<(&String, bool)> = eligible[skip_eligible..]
        .iter()
        .map(|id| (*id, true))
        .chain(ineligible[skip_ineligible..].iter().map(|id| (*id, false)))
        .collect();
    rest.sort();
    let page = &rest[..1_000];
    let from_eligible = page.iter().filter(|(_, eligible)| *eligible).count();
    let (status, body) = app
        .get(&format!(
            "/pools/big/members?limit=1000&cursor={skip_eligible}.{skip_ineligible}"
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let listed: Vec<&str> = body["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| m["member"].as_str().expect("member"))
        .collect();
    let expected: Vec<&str> = page.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(listed, expected);
    assert_eq!(
        body["next_cursor"],
        json!(format!(
            "{}.{}",
            skip_eligible + from_eligible,
            skip_ineligible + 1_000 - from_eligible
        ))
    );
}

for_each_store!(
    readers_racing_the_deletion_of_a_large_pool_see_it_whole_or_not_at_all,
    a_page_deep_in_both_sets_starts_where_its_cursor_says,
    a_page_of_a_thousand_from_both_sets_lists_every_member_once_in_order,
    an_import_is_seen_by_readers_in_whole_chunks,
    disabling_ten_thousand_members_is_seen_by_readers_in_whole_chunks,
);
