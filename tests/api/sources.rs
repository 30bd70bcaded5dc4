//! Sources: lists a pool fetches on a schedule from a local HTTP server, imported through
//! the pool's rules as the import route does, by one replica of several; a private source
//! is refused unless the pool allows it, and an oversized or slow one fails cleanly and
//! is retried.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proxy_allocator::store::{EmbeddedStore, Store};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::for_each_store;
use crate::helpers::{
    Backend, TestApp, assert_error, backend_config, shared_redis_url, test_config,
};
use crate::spy::{spawn_spied, spawn_spied_on};

/// A list server on loopback: answers every request with the current list, after the
/// current delay, and counts the requests.
pub struct ListServer {
    pub url: String,
    list: Arc<Mutex<String>>,
    delay: Arc<Mutex<Duration>>,
    requests: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl ListServer {
    pub async fn start(list: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bound");
        let url = format!(
            "http://{}/proxies.txt",
            listener.local_addr().expect("an address")
        );
        let list = Arc::new(Mutex::new(list.to_owned()));
        let delay = Arc::new(Mutex::new(Duration::ZERO));
        let requests = Arc::new(AtomicUsize::new(0));
        let (l, d, r) = (Arc::clone(&list), Arc::clone(&delay), Arc::clone(&requests));
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                r.fetch_add(1, Ordering::SeqCst);
                let body = l.lock().expect("lock").clone();
                let delay = *d.lock().expect("lock");
                tokio::spawn(async move {
                    let mut head = [0u8; 2048];
                    let _ = stream.read(&mut head).await;
                    tokio::time::sleep(delay).await;
                    let reply = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(reply.as_bytes()).await;
                });
            }
        });
        Self {
            url,
            list,
            delay,
            requests,
            task,
        }
    }

    pub fn serve(&self, list: &str) {
        *self.list.lock().expect("lock") = list.to_owned();
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

impl Drop for ListServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A pool whose members and sources may be on loopback, with one source.
fn sourced_pool(source: Value) -> Value {
    json!({
        "rules": {"allow_private": true, "allow_private_sources": true},
        "sources": [source],
    })
}

pub async fn sources(app: &TestApp, pool: &str) -> Vec<Value> {
    let (status, body) = app.get(&format!("/pools/{pool}/sources")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["sources"].as_array().expect("a list").clone()
}

/// Polls (at most 10 s) until the pool's first source satisfies `done`; returns it.
pub async fn await_source(app: &TestApp, pool: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let first = sources(app, pool).await.remove(0);
        if done(&first) {
            return first;
        }
        assert!(Instant::now() < deadline, "{first}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub fn fetched(times: u64) -> impl Fn(&Value) -> bool {
    move |source| {
        source["successes"].as_u64().unwrap_or(0) + source["failures"].as_u64().unwrap_or(0)
            >= times
    }
}

pub async fn member_ids(app: &TestApp, pool: &str) -> Vec<String> {
    let mut ids: Vec<String> = app
        .members(pool)
        .await
        .iter()
        .map(|m| m["member"].as_str().expect("an id").to_owned())
        .collect();
    ids.sort();
    ids
}

async fn a_source_is_fetched_on_schedule_and_its_members_appear(app: TestApp) {
    let server =
        ListServer::start("127.0.0.1:8080\n10.1.2.3:3128\nnot a proxy\n127.0.0.1:8080\n").await;
    app.create_pool(
        "p",
        sourced_pool(json!({"url": server.url, "interval_ms": 1000})),
    )
    .await;
    let first = await_source(&app, "p", fetched(1)).await;
    assert_eq!(first["url"], json!(server.url));
    assert_eq!(
        (
            &first["last_fetch"]["outcome"],
            &first["last_fetch"]["counts"]
        ),
        (
            &json!("ok"),
            &json!({"accepted": 2, "added": 2, "existing": 0, "duplicates": 1, "rejected": 1})
        )
    );
    assert_eq!(
        (first["successes"].clone(), first["failures"].clone()),
        (json!(1), json!(0))
    );
    assert_eq!(
        member_ids(&app, "p").await,
        ["http://10.1.2.3:3128", "http://127.0.0.1:8080"]
    );
    // A second later the list is fetched again: what is new is added, the rest exists.
    server.serve("127.0.0.1:8080\n127.0.0.1:9090\n");
    let second = await_source(&app, "p", fetched(2)).await;
    assert_eq!(
        second["last_fetch"]["counts"],
        json!({"accepted": 2, "added": 1, "existing": 1, "duplicates": 0, "rejected": 0})
    );
    assert!(
        second["last_fetch"]["at"].as_str() > first["last_fetch"]["at"].as_str(),
        "{first} then {second}"
    );
    assert_eq!(
        member_ids(&app, "p").await,
        [
            "http://10.1.2.3:3128",
            "http://127.0.0.1:8080",
            "http://127.0.0.1:9090"
        ]
    );
    assert_eq!(server.requests(), 2);
}

async fn a_json_source_is_read_as_an_array_with_its_default_scheme(app: TestApp) {
    let server = ListServer::start(r#"["127.0.0.1:1080", "http://127.0.0.1:8080"]"#).await;
    let mut config = sourced_pool(json!({"url": server.url, "interval_ms": 60000,
        "format": "json", "default_scheme": "socks5"}));
    config["rules"]["schemes"] = json!(["http", "socks5"]);
    app.create_pool("p", config).await;
    let source = await_source(&app, "p", fetched(1)).await;
    assert_eq!(source["last_fetch"]["counts"]["added"], json!(2));
    assert_eq!(
        member_ids(&app, "p").await,
        ["http://127.0.0.1:8080", "socks5://127.0.0.1:1080"]
    );
}

async fn a_source_on_a_private_address_is_refused_unless_the_pool_allows_it(app: TestApp) {
    let server = ListServer::start("127.0.0.1:8080\n").await;
    // Members on loopback are allowed; the list itself is not.
    app.create_pool(
        "p",
        json!({"rules": {"allow_private": true},
               "sources": [{"url": server.url, "interval_ms": 60000}]}),
    )
    .await;
    let refused = await_source(&app, "p", fetched(1)).await;
    assert_eq!(
        refused["last_fetch"],
        json!({"at": refused["last_fetch"]["at"], "outcome": "failed",
               "error": "private address refused"})
    );
    assert_eq!(
        (refused["failures"].clone(), refused["successes"].clone()),
        (json!(1), json!(0))
    );
    assert_eq!(server.requests(), 0, "nothing was dialled");
    assert_eq!(member_ids(&app, "p").await, Vec::<String>::new());
}

async fn sources_are_bounded_and_their_interval_is_at_least_the_services_minimum(app: TestApp) {
    let put = |config: Value| {
        let app = &app;
        async move {
            let response = app
                .admin(reqwest::Method::PUT, "/pools/p")
                .json(&config)
                .send()
                .await
                .expect("PUT /pools/p");
            crate::helpers::read(response).await
        }
    };
    let source = |i: usize, interval: u64| json!({"url": format!("https://lists.example/{i}.txt"), "interval_ms": interval});
    let (status, body) = put(json!({"sources": [source(0, 999)]})).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_json");
    let many: Vec<Value> = (0..17).map(|i| source(i, 60000)).collect();
    let (status, body) = put(json!({ "sources": many })).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_json");
    let (status, body) =
        put(json!({"sources": [{"url": "ftp://lists.example/p", "interval_ms": 60000}]})).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_json");
    let (status, body) = put(json!({"sources": [source(0, 60000)]})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(
        body["config"]["sources"],
        json!([{"url": "https://lists.example/0.txt", "interval_ms": 60000,
                "format": "lines", "default_scheme": "http"}])
    );
    let (status, body) = app.get("/pools/nope/sources").await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "pool_not_found");
}

for_each_store!(
    a_source_is_fetched_on_schedule_and_its_members_appear,
    a_json_source_is_read_as_an_array_with_its_default_scheme,
    a_source_on_a_private_address_is_refused_unless_the_pool_allows_it,
    sources_are_bounded_and_their_interval_is_at_least_the_services_minimum,
);

/// The service's own minimum (60 s unless the operator lowers it) is applied on top of
/// the domain's bounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_faster_than_the_services_minimum_is_refused() {
    let mut config = test_config(None);
    config.source_min_interval_ms = 60_000;
    let app = TestApp::spawn_with(config).await;
    let response = app
        .admin(reqwest::Method::PUT, "/pools/p")
        .json(&json!({"sources": [{"url": "https://lists.example/p.txt", "interval_ms": 59999}]}))
        .send()
        .await
        .expect("PUT /pools/p");
    let (status, body) = crate::helpers::read(response).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_request");
    assert_eq!(
        body["error"]["message"],
        json!(
            "sources[].interval_ms is at least 60000 on this service (https://lists.example/p.txt has 59999)"
        )
    );
    app.stop().await;
}

/// An oversized list and a slow one each fail with their own error, keep nothing, and are
/// retried (a second later here: the retry wait is capped at the interval).
async fn oversized_and_slow_sources_fail_cleanly_and_are_retried(backend: Backend) {
    let mut config = backend_config(backend);
    config.import_body_limit_bytes = 64;
    config.source_fetch_timeout_ms = 300;
    let app = TestApp::spawn_with(config).await;
    let big = ListServer::start(&"127.0.0.1:8080\n".repeat(5)).await;
    let slow = ListServer::start("127.0.0.1:8080\n").await;
    *slow.delay.lock().expect("lock") = Duration::from_secs(5);
    app.create_pool(
        "big",
        sourced_pool(json!({"url": big.url, "interval_ms": 1000})),
    )
    .await;
    app.create_pool(
        "slow",
        sourced_pool(json!({"url": slow.url, "interval_ms": 1000})),
    )
    .await;
    let too_large = await_source(&app, "big", fetched(2)).await;
    assert_eq!(
        too_large["last_fetch"]["error"],
        json!("larger than 64 bytes")
    );
    assert!(too_large["failures"].as_u64() >= Some(2), "{too_large}");
    let timed_out = await_source(&app, "slow", fetched(2)).await;
    assert_eq!(timed_out["last_fetch"]["error"], json!("timed out"));
    assert_eq!(member_ids(&app, "big").await, Vec::<String>::new());
    assert_eq!(member_ids(&app, "slow").await, Vec::<String>::new());
    // Once the list fits, the next retry imports it and clears the failures.
    big.serve("127.0.0.1:8080\n");
    let fixed = await_source(&app, "big", |s| s["successes"] == json!(1)).await;
    assert_eq!(fixed["failures"], json!(0));
    assert_eq!(member_ids(&app, "big").await, ["http://127.0.0.1:8080"]);
    let (_, metrics) = metrics_text(&app).await;
    for outcome in ["too_large", "timeout", "ok"] {
        assert!(
            metrics.contains(&format!("pa_source_fetches_total{{outcome=\"{outcome}\"}}")),
            "{outcome} is counted in {metrics}"
        );
    }
    app.stop().await;
}

async fn metrics_text(app: &TestApp) -> (StatusCode, String) {
    let response = app
        .anonymous(reqwest::Method::GET, "/metrics")
        .send()
        .await
        .expect("GET /metrics");
    let status = response.status();
    (status, response.text().await.expect("a text body"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_and_slow_sources_fail_cleanly_and_are_retried_on_redis() {
    oversized_and_slow_sources_fail_cleanly_and_are_retried(Backend::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_and_slow_sources_fail_cleanly_and_are_retried_on_embedded() {
    oversized_and_slow_sources_fail_cleanly_and_are_retried(Backend::Embedded).await;
}

/// Two replicas on one store: the source is fetched once, by one of them, however often
/// both look for due sources afterwards.
async fn two_replicas_fetch_a_source_once(
    (first, first_spy): (TestApp, Arc<crate::spy::Spy>),
    (second, second_spy): (TestApp, Arc<crate::spy::Spy>),
) {
    let server = ListServer::start("127.0.0.1:8080\n").await;
    // The answer takes several ticks of both replicas, each of which could claim the
    // source again if its claim did not hold it.
    *server.delay.lock().expect("lock") = Duration::from_millis(500);
    // One fetch a minute: within this test only the first can happen.
    first
        .create_pool(
            "p",
            sourced_pool(json!({"url": server.url, "interval_ms": 60000})),
        )
        .await;
    await_source(&second, "p", fetched(1)).await;
    assert_eq!(member_ids(&second, "p").await, ["http://127.0.0.1:8080"]);
    let marks = (
        first_spy.source_ticks.mark(),
        second_spy.source_ticks.mark(),
    );
    first_spy
        .source_ticks
        .await_one_after(marks.0, "source tick of the first replica")
        .await;
    second_spy
        .source_ticks
        .await_one_after(marks.1, "source tick of the second replica")
        .await;
    let claimed = first_spy.sources_claimed.load(Ordering::SeqCst)
        + second_spy.sources_claimed.load(Ordering::SeqCst);
    assert_eq!(claimed, 1, "sources claimed by the two replicas");
    assert_eq!(server.requests(), 1);
    first.stop().await;
    second.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_sharing_one_redis_fetch_a_source_once() {
    let config = test_config(Some(shared_redis_url()));
    let first = spawn_spied(config.clone()).await;
    let second = spawn_spied(config).await;
    two_replicas_fetch_a_source_once(first, second).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_sharing_one_embedded_store_fetch_a_source_once() {
    let store: Arc<dyn Store> = Arc::new(EmbeddedStore::new());
    let first = spawn_spied_on(test_config(None), Arc::clone(&store)).await;
    let second = spawn_spied_on(test_config(None), store).await;
    two_replicas_fetch_a_source_once(first, second).await;
}
