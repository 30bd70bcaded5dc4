//! Test harness: Redis servers started on free loopback ports, the application spawned on
//! port 0, and a client that speaks to it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use proxy_allocator::config::Config;
use proxy_allocator::startup::Application;
use proxy_allocator::store::{DataDirOptions, EmbeddedStore, Store};
use reqwest::{Method, RequestBuilder, StatusCode};
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The admin token every test app is started with.
pub const ADMIN: &str = "test-admin-token";

/// How often test apps run the background sweep, in milliseconds: short, so that tests of
/// reclaiming wait little.
pub const SWEEP_INTERVAL_MS: u64 = 100;

/// How often test apps look for due check rounds, in milliseconds.
pub const CHECK_TICK_MS: u64 = 50;

#[path = "redis_server.rs"]
pub mod redis_server;

pub use self::redis_server::RedisServer;

/// Sends one command to a Redis and returns its reply (the tests' own side channel).
pub fn redis_cli(url: &str, args: &[&str]) -> redis::Value {
    let client = redis::Client::open(url).expect("a valid Redis URL");
    let mut conn = client
        .get_connection()
        .expect("a connection to the test Redis");
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query(&mut conn).expect("the command succeeds")
}

/// `cmdstat_<name>` -> calls, from `INFO commandstats` of the Redis at `url`.
pub fn command_calls(url: &str) -> BTreeMap<String, u64> {
    let info = match redis_cli(url, &["INFO", "commandstats"]) {
        redis::Value::BulkString(bytes) => String::from_utf8(bytes).expect("text"),
        redis::Value::VerbatimString { text, .. } => text,
        other => panic!("unexpected INFO reply {other:?}"),
    };
    info.lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .collect()
}

/// The commands whose call counts grew from `before` to `after`, with how much.
pub fn command_delta(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter_map(|(name, calls)| {
            let grown = calls - before.get(name).copied().unwrap_or(0);
            (grown > 0).then(|| (name.clone(), grown))
        })
        .collect()
}

/// The Redis shared by every test of this binary that does not stop its Redis. It lives as
/// long as the test process; each test isolates itself with its own key prefix.
pub fn shared_redis_url() -> String {
    static SHARED: OnceLock<String> = OnceLock::new();
    static SERVER: OnceLock<std::sync::Mutex<Option<RedisServer>>> = OnceLock::new();
    SHARED
        .get_or_init(|| {
            if let Ok(url) = std::env::var("TEST_REDIS_URL") {
                return url;
            }
            let server = RedisServer::start();
            let url = server.url();
            reap_with_parent(server.port());
            SERVER.get_or_init(|| std::sync::Mutex::new(Some(server)));
            url
        })
        .clone()
}

/// Statics are never dropped, so the shared Redis would outlive the test process. A small
/// watcher shell shuts it down as soon as this process is gone.
fn reap_with_parent(port: u16) {
    let script = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 0.5; done; \
         redis-cli -p {port} shutdown nosave >/dev/null 2>&1",
        pid = std::process::id()
    );
    let _ = Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
}

/// Which store an application runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The shared Redis, isolated by a random key prefix.
    Redis,
    /// The in-process store, in memory.
    Embedded,
    /// The in-process store in a data directory of its own.
    Durable,
}

/// A data directory of a test, removed when the last holder lets go of it.
#[derive(Debug)]
pub struct DataDir(pub PathBuf);

/// A fresh, not yet existing directory under the system's temporary directory.
pub fn fresh_data_dir() -> PathBuf {
    std::env::temp_dir().join(format!("pa-test-data-{:016x}", rand::random::<u64>()))
}

impl Drop for DataDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The durable store a test app runs on, kept by the harness to check what it wrote.
pub struct DurabilityCheck {
    store: Arc<EmbeddedStore>,
    options: DataDirOptions,
    _dir: Arc<DataDir>,
}

impl DurabilityCheck {
    /// Closes the store (as shutdown does) and checks that its directory recovers exactly
    /// the state it had: every change an operation made reached the log.
    pub async fn verify(self) {
        self.store.close().await;
        let live = self.store.state_lines();
        let recovered = tokio::task::spawn_blocking(move || {
            EmbeddedStore::open(self.options)
                .expect("the data directory reopens")
                .state_lines()
        })
        .await
        .expect("joined");
        assert_eq!(
            recovered, live,
            "the recovered state differs from the live one"
        );
    }
}

/// A running application and a client for it.
pub struct TestApp {
    /// Base URL, `http://127.0.0.1:<port>`.
    pub base: String,
    /// The HTTP client.
    pub client: reqwest::Client,
    /// The gateway's address, `127.0.0.1:<port>`, when `GATEWAY_LISTEN` is set.
    pub gateway: Option<SocketAddr>,
    /// The gateway's SOCKS5 address, when `GATEWAY_SOCKS_LISTEN` is set.
    pub socks: Option<SocketAddr>,
    /// The Redis URL, when on Redis.
    pub redis_url: Option<String>,
    /// The key prefix, when on Redis.
    pub key_prefix: String,
    shutdown: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<std::io::Result<()>>>,
    /// On the durable store: the store itself and its directory.
    durable: Option<(Arc<EmbeddedStore>, DataDirOptions, Arc<DataDir>)>,
}

/// A configuration for tests: port 0, fixed tokens, nothing taken from the environment.
pub fn test_config(redis_url: Option<String>) -> Config {
    let mut config = Config::defaults();
    config.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    config.redis_url = redis_url;
    config.redis_cluster_urls = None;
    config.redis_sentinel_urls = None;
    config.redis_sentinel_master = None;
    config.key_prefix = format!("t{:016x}", rand::random::<u64>());
    config.admin_token = Some(ADMIN.to_owned());
    config.admin_token_file = None;
    config.worker_token = None;
    config.worker_token_file = None;
    config.allow_anonymous_workers = false;
    config.probe_listen = None;
    config.max_connections = None;
    config.store_timeout_ms = 1000;
    config.shutdown_timeout_ms = 5000;
    config.body_limit_bytes = 1024 * 1024;
    config.sweep_interval_ms = SWEEP_INTERVAL_MS;
    config.import_body_limit_bytes = 32 * 1024 * 1024;
    config.check_tick_ms = CHECK_TICK_MS;
    // Sources are fetched every second at the fastest in tests, not every minute.
    config.source_min_interval_ms = 1_000;
    config.source_fetch_timeout_ms = 2_000;
    config.data_dir = None;
    config.fsync_interval_ms = 1000;
    config
}

/// The test configuration for `backend` (the shared Redis, or the embedded store).
pub fn backend_config(backend: Backend) -> Config {
    let url = match backend {
        Backend::Redis => Some(shared_redis_url()),
        Backend::Embedded | Backend::Durable => None,
    };
    let mut config = test_config(url);
    if backend == Backend::Durable {
        config.data_dir = Some(fresh_data_dir());
    }
    config
}

/// Commands an assign must never cost: connection checks, topology reads, connection setup,
/// script loading in steady state, transactions. Tests that count what Redis received look
/// for each of them (`INFO commandstats` also counts what scripts run inside Redis, so
/// those tests name what must be absent rather than everything that may be present).
pub const NEVER_PER_ASSIGN: [&str; 12] = [
    "ping",
    "unwatch",
    "select",
    "hello",
    "cluster|slots",
    "cluster|nodes",
    "cluster|shards",
    "readonly",
    "script|load",
    "eval",
    "multi",
    "exec",
];

/// Puts the background tasks (lease and cooldown sweeps, check ticks, metrics refresh) an
/// hour apart, for tests that count the commands Redis receives: theirs are not part of
/// any request.
pub fn without_background_traffic(config: &mut Config) {
    config.sweep_interval_ms = 3_600_000;
    config.check_tick_ms = 3_600_000;
    config.metrics_refresh_ms = 3_600_000;
}

impl TestApp {
    /// Starts the application on `backend` with the test configuration.
    pub async fn spawn(backend: Backend) -> Self {
        Self::spawn_with(backend_config(backend)).await
    }

    /// Starts the application with a given configuration. With a data directory, the
    /// harness opens the store itself so that [`TestApp::durability_check`] can look at
    /// it, and removes the directory afterwards.
    pub async fn spawn_with(config: Config) -> Self {
        Self::spawn_with_store(config, |store| store).await
    }

    /// Starts the application with a given configuration and `wrap` around its store.
    pub async fn spawn_with_store(
        config: Config,
        wrap: impl FnOnce(Arc<dyn Store>) -> Arc<dyn Store>,
    ) -> Self {
        proxy_allocator::telemetry::init_for_tests();
        let redis_url = config.redis_url.clone();
        let key_prefix = config.key_prefix.clone();
        let (app, durable) = match &config.data_dir {
            Some(dir) => {
                let options = DataDirOptions {
                    fsync_interval: config.fsync_interval(),
                    timeout: config.store_timeout(),
                    ..DataDirOptions::new(dir.clone())
                };
                let dir = Arc::new(DataDir(dir.clone()));
                let store = Arc::new(
                    EmbeddedStore::open(options.clone()).expect("the data directory opens"),
                );
                let served: Arc<dyn Store> = wrap(store.clone());
                let app = Application::with_store(config, served).await;
                (app, Some((store, options, dir)))
            }
            None => {
                let store = proxy_allocator::startup::store(&config)
                    .await
                    .expect("the store is set up");
                (Application::with_store(config, wrap(store)).await, None)
            }
        };
        let app = app.expect("the application starts");
        let base = format!("http://{}", app.local_addr());
        let gateway = app.gateway_addr();
        let socks = app.gateway_socks_addr();
        let (tx, rx) = oneshot::channel();
        let handle = tokio::spawn(app.run_until_stopped(async move {
            let _ = rx.await;
        }));
        Self {
            base,
            client: reqwest::Client::builder()
                .pool_max_idle_per_host(64)
                .build()
                .expect("an HTTP client"),
            gateway,
            socks,
            redis_url,
            key_prefix,
            shutdown: Some(tx),
            handle: Some(handle),
            durable,
        }
    }

    /// On the durable store: what checks, once the test is done, that the directory
    /// recovers the state the app ended with.
    pub fn durability_check(&self) -> Option<DurabilityCheck> {
        self.durable
            .as_ref()
            .map(|(store, options, dir)| DurabilityCheck {
                store: Arc::clone(store),
                options: options.clone(),
                _dir: Arc::clone(dir),
            })
    }

    /// Stops the application and waits for it to drain.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(handle) = self.handle.take() {
            let _ = handle.await;
        }
    }

    /// A request with the admin token.
    pub fn admin(&self, method: Method, path: &str) -> RequestBuilder {
        self.client
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(ADMIN)
    }

    /// A request without a token.
    pub fn anonymous(&self, method: Method, path: &str) -> RequestBuilder {
        self.client.request(method, format!("{}{path}", self.base))
    }

    /// Creates a pool with a configuration and checks it was created.
    pub async fn create_pool(&self, pool: &str, config: Value) {
        let response = self
            .admin(Method::PUT, &format!("/pools/{pool}"))
            .json(&config)
            .send()
            .await
            .expect("PUT /pools/{pool}");
        assert_eq!(response.status(), StatusCode::CREATED, "creating {pool}");
    }

    /// Changes an existing pool's configuration and checks it was accepted.
    pub async fn configure(&self, pool: &str, config: &Value) {
        let response = self
            .admin(Method::PUT, &format!("/pools/{pool}"))
            .json(config)
            .send()
            .await
            .expect("PUT /pools/{pool}");
        assert_eq!(response.status(), StatusCode::OK, "configuring {pool}");
    }

    /// Seeds members (optionally with a starting count) and returns the response body.
    pub async fn seed(&self, pool: &str, members: &[&str], assignments: Option<u64>) -> Value {
        let mut body = json!({ "members": members });
        if let Some(n) = assignments {
            body["assignments"] = json!(n);
        }
        self.post_json(&format!("/pools/{pool}/members"), body)
            .await
            .1
    }

    /// An admin POST with a JSON body; returns status and body (Null when empty).
    pub async fn post_json(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let response = self
            .admin(Method::POST, path)
            .json(&body)
            .send()
            .await
            .expect("request sent");
        read(response).await
    }

    /// An admin GET; returns status and body.
    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        read(
            self.admin(Method::GET, path)
                .send()
                .await
                .expect("request sent"),
        )
        .await
    }

    /// A GET without a token (probes, metrics); returns status and body.
    pub async fn probe(&self, path: &str) -> (StatusCode, Value) {
        read(
            self.anonymous(Method::GET, path)
                .send()
                .await
                .expect("request sent"),
        )
        .await
    }

    /// One assign; returns status and body (Null on 204).
    pub async fn assign(&self, pool: &str) -> (StatusCode, Value) {
        let response = self
            .anonymous(Method::POST, &format!("/pools/{pool}/assign"))
            .send()
            .await
            .expect("request sent");
        read(response).await
    }

    /// An assign with a JSON body: status, `Retry-After` and body (Null on 204).
    pub async fn assign_json(
        &self,
        pool: &str,
        body: &Value,
    ) -> (StatusCode, Option<String>, Value) {
        let response = self
            .anonymous(Method::POST, &format!("/pools/{pool}/assign"))
            .json(body)
            .send()
            .await
            .expect("request sent");
        let retry_after = response
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().expect("text").to_owned());
        let (status, body) = read(response).await;
        (status, retry_after, body)
    }

    /// The proxy of an assign that must succeed.
    pub async fn assigned(&self, pool: &str) -> (String, u64) {
        let (status, body) = self.assign(pool).await;
        assert_eq!(status, StatusCode::OK, "assign on {pool}: {body}");
        (
            body["proxy"].as_str().expect("proxy").to_owned(),
            body["assignments"].as_u64().expect("assignments"),
        )
    }

    /// Every member of a pool as listed (up to 1,000), in listing order.
    pub async fn members(&self, pool: &str) -> Vec<Value> {
        let (status, body) = self.get(&format!("/pools/{pool}/members?limit=1000")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body["members"].as_array().expect("members").clone()
    }

    /// Every member of a pool with its count, in listing order.
    pub async fn counts(&self, pool: &str) -> Vec<(String, u64, String)> {
        self.members(pool)
            .await
            .iter()
            .map(|m| {
                (
                    m["member"].as_str().expect("member").to_owned(),
                    m["assignments"].as_u64().expect("assignments"),
                    m["state"].as_str().expect("state").to_owned(),
                )
            })
            .collect()
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// A path of the route table with every `{param}` filled in with a valid sample: the pool
/// `p`, a well-formed lease id, the session `s`, the client `c`. A new kind of parameter needs a sample here; until it has
/// one, every test that walks the route table fails and says so.
pub fn concrete_path(template: &str) -> String {
    let mut path = String::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let close = rest[open..].find('}').expect("a closing brace") + open;
        path.push_str(&rest[..open]);
        path.push_str(match &rest[open + 1..close] {
            "pool" => "p",
            "lease" => "0123456789abcdef0123456789abcdef",
            "session" => "s",
            "client" => "c",
            other => panic!("no sample value for the path parameter {{{other}}} of {template}"),
        });
        rest = &rest[close + 1..];
    }
    path.push_str(rest);
    path
}

/// Sends `request` as raw bytes and returns the status and JSON body of the answer: for
/// paths an HTTP client would normalise (`/pools/../assign`) or headers it would refuse.
pub async fn raw_request(base: &str, request: &str) -> (StatusCode, Value) {
    use tokio::io::AsyncWriteExt;
    let addr = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connected");
    stream.write_all(request.as_bytes()).await.expect("sent");
    raw_answer(&mut stream).await
}

/// Status and JSON body (Null for an empty body) of the answer on `stream`, read to its
/// end (the request asked for `connection: close`).
pub async fn raw_answer(stream: &mut (impl tokio::io::AsyncRead + Unpin)) -> (StatusCode, Value) {
    use tokio::io::AsyncReadExt;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.expect("an answer");
    let text = String::from_utf8_lossy(&answer);
    let status: u16 = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("a status line in {text:?}"));
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let body = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(body).unwrap_or_else(|_| panic!("a JSON body in {text:?}"))
    };
    (StatusCode::from_u16(status).expect("a valid status"), body)
}

/// Status and JSON body of a response (Null for an empty body).
pub async fn read(response: reqwest::Response) -> (StatusCode, Value) {
    let status = response.status();
    let bytes = response.bytes().await.expect("a body");
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| panic!("a JSON body, got {:?}", String::from_utf8_lossy(&bytes)))
    };
    (status, body)
}

/// Asserts the one error shape with a given status and code.
pub fn assert_error(status: StatusCode, body: &Value, expected_status: StatusCode, code: &str) {
    assert_eq!(status, expected_status, "{body}");
    assert_eq!(body["error"]["code"], json!(code), "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert_eq!(
        body.as_object().map(|o| o.len()),
        Some(1),
        "only `error` at the top: {body}"
    );
}

/// Runs each listed `async fn name(app: TestApp)` on Redis, on the embedded store in memory
/// and on the embedded store in a data directory, as `on_redis::name`, `on_embedded::name`
/// and `on_durable::name`. On the durable store the test is followed by a check that the
/// directory recovers exactly the state the test left.
#[macro_export]
macro_rules! for_each_store {
    ($($name:ident),* $(,)?) => {
        mod on_redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let app = $crate::helpers::TestApp::spawn($crate::helpers::Backend::Redis).await;
                    super::$name(app).await;
                }
            )*
        }
        mod on_embedded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let app = $crate::helpers::TestApp::spawn($crate::helpers::Backend::Embedded).await;
                    super::$name(app).await;
                }
            )*
        }
        mod on_durable {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let app = $crate::helpers::TestApp::spawn($crate::helpers::Backend::Durable).await;
                    let check = app.durability_check().expect("a durable store");
                    super::$name(app).await;
                    check.verify().await;
                }
            )*
        }
    };
}

/// How long the background sweep alone takes to end abandoned work in two pools nobody
/// assigns from, created here: in `leased` (least-in-flight, 300 ms leases) a worker takes
/// a lease and crashes, and in `cooling` a member trips for a 300 ms cooldown. Returns how
/// long after its start each ended: `(lease reclaimed, member back)`.
pub async fn abandoned_work_ends(
    app: &TestApp,
    leased: &str,
    cooling: &str,
) -> (Duration, Duration) {
    app.create_pool(
        leased,
        json!({"policy": "least-in-flight", "lease_ttl_ms": ABANDONED_WORK_MS}),
    )
    .await;
    app.seed(leased, &["a"], Some(0)).await;
    let cooldown = json!({"max_consecutive_failures": 1, "cooldown_ms": ABANDONED_WORK_MS,
        "jitter_percent": 0});
    app.create_pool(cooling, json!({ "health": cooldown }))
        .await;
    app.seed(cooling, &["a"], Some(0)).await;

    let leased_at = Instant::now();
    let (status, body) = app.assign(leased).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let tripped_at = Instant::now();
    let (status, body) = app
        .post_json(
            &format!("/pools/{cooling}/outcomes"),
            json!({"proxy": "a", "result": "failed"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["outcomes"][0]["effect"], json!("tripped"), "{body}");

    let stats = |pool: &str| {
        let path = format!("/pools/{pool}");
        async move {
            let (status, body) = app.get(&path).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            body["stats"].clone()
        }
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut reclaimed, mut returned) = (None, None);
    while reclaimed.is_none() || returned.is_none() {
        assert!(
            Instant::now() < deadline,
            "still waiting after 10 s: lease reclaimed {reclaimed:?}, member back {returned:?}"
        );
        if reclaimed.is_none() {
            let now = stats(leased).await;
            if (&now["in_flight"], &now["abandoned"]) == (&json!(0), &json!(1)) {
                reclaimed = Some(leased_at.elapsed());
            }
        }
        if returned.is_none() {
            let now = stats(cooling).await;
            if (&now["eligible"], &now["recovered"]) == (&json!(1), &json!(1)) {
                returned = Some(tripped_at.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (reclaimed.unwrap_or_default(), returned.unwrap_or_default())
}

/// The lease ttl and the cooldown of [`abandoned_work_ends`], in milliseconds.
pub const ABANDONED_WORK_MS: u64 = 300;

/// Asserts that what [`abandoned_work_ends`] measured is within the promise, a ttl (or
/// cooldown) plus one sweep interval, with slack for a loaded test machine.
pub fn assert_abandoned_work_ended_on_time((reclaimed, returned): (Duration, Duration)) {
    let promise = Duration::from_millis(ABANDONED_WORK_MS + SWEEP_INTERVAL_MS);
    let slack = Duration::from_millis(400);
    assert!(
        reclaimed >= Duration::from_millis(ABANDONED_WORK_MS) && reclaimed <= promise + slack,
        "the lease was reclaimed after {reclaimed:?}"
    );
    assert!(
        returned >= Duration::from_millis(ABANDONED_WORK_MS) && returned <= promise + slack,
        "the member came back after {returned:?}"
    );
}
