//! Large operations on a large pool stay atomic for readers while they are split into
//! short steps: a pool being deleted answers either whole or 404, never half; an import is
//! seen in whole chunks.

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

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
    let whole_once = std::sync::Arc::new(Semaphore::new(0));
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
    assert_eq!(app.get("/pools").await.1, json!({"pools": []}));
    if let Some(url) = &app.redis_url {
        // Nothing is left behind, not even under the graveyard names.
        let pattern = format!("{}:{{big}}:*", app.key_prefix);
        assert_eq!(
            redis_cli(url, &["KEYS", &pattern]),
            redis::Value::Array(vec![])
        );
    }
}

for_each_store!(readers_racing_the_deletion_of_a_large_pool_see_it_whole_or_not_at_all,);
