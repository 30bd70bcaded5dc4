//! Active checks against fake proxies on loopback: failing, hanging and blocked proxies
//! are cooled down, passing ones come back, a hung proxy costs at most the probe timeout,
//! and one replica runs a pool's round.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::for_each_store;
use crate::helpers::{TestApp, shared_redis_url, test_config};
use crate::spy::spawn_spied;

/// How a fake proxy answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Mode {
    Ok = 0,
    BadGateway = 1,
    Forbidden = 2,
    Hang = 3,
}

/// A tiny HTTP proxy on loopback whose answer the test switches.
struct FakeProxy {
    port: u16,
    mode: Arc<AtomicU8>,
    connections: Arc<AtomicUsize>,
    request_lines: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeProxy {
    async fn start(mode: Mode) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bound");
        let port = listener.local_addr().expect("an address").port();
        let shared = Arc::new(AtomicU8::new(mode as u8));
        let connections = Arc::new(AtomicUsize::new(0));
        let request_lines = Arc::new(Mutex::new(Vec::new()));
        let (m, c, r) = (
            Arc::clone(&shared),
            Arc::clone(&connections),
            Arc::clone(&request_lines),
        );
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                c.fetch_add(1, Ordering::SeqCst);
                let (m, r) = (Arc::clone(&m), Arc::clone(&r));
                tokio::spawn(async move {
                    let mut buf = [0u8; 2048];
                    let n = stream.read(&mut buf).await.unwrap_or(0);
                    let head = String::from_utf8_lossy(&buf[..n]).into_owned();
                    if let Some(line) = head.lines().next() {
                        r.lock().expect("lock").push(line.to_owned());
                    }
                    let status = match m.load(Ordering::SeqCst) {
                        0 => "200 OK",
                        1 => "502 Bad Gateway",
                        2 => "403 Forbidden",
                        _ => {
                            tokio::time::sleep(Duration::from_secs(60)).await;
                            return;
                        }
                    };
                    let answer = format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n");
                    let _ = stream.write_all(answer.as_bytes()).await;
                });
            }
        });
        Self {
            port,
            mode: shared,
            connections,
            request_lines,
            task,
        }
    }

    fn set(&self, mode: Mode) {
        self.mode.store(mode as u8, Ordering::SeqCst);
    }

    fn member(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for FakeProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A pool config with an http check of `http://target.test/health` through each member.
/// Members are fake proxies on 127.0.0.1, which the default rules refuse.
fn checked_pool(check: Value, health: Value) -> Value {
    let mut health = health;
    health["jitter_percent"] = json!(0);
    health["check"] = check;
    json!({ "health": health, "rules": {"allow_private": true} })
}

fn http_check(interval_ms: u64, timeout_ms: u64) -> Value {
    json!({"kind": "http", "url": "http://target.test/health",
           "interval_ms": interval_ms, "timeout_ms": timeout_ms, "concurrency": 4})
}

/// Creates the pool empty, seeds it, then turns checks on, so the first round sees every
/// member.
async fn start_checks(app: &TestApp, config: Value, members: &[&str]) {
    app.create_pool("p", json!({"rules": {"allow_private": true}}))
        .await;
    app.seed("p", members, Some(0)).await;
    app.configure("p", &config).await;
}

async fn member(app: &TestApp, id: &str) -> Value {
    app.members("p")
        .await
        .into_iter()
        .find(|m| m["member"] == json!(id))
        .unwrap_or_else(|| panic!("{id} is listed"))
}

/// Polls until `member` satisfies `done`; returns the entry.
async fn await_member(app: &TestApp, id: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let entry = member(app, id).await;
        if done(&entry) {
            return entry;
        }
        assert!(Instant::now() < deadline, "{entry}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn a_failing_proxy_is_cooled_down_and_a_passing_check_brings_it_back(app: TestApp) {
    let proxy = FakeProxy::start(Mode::BadGateway).await;
    let id = proxy.member();
    let health = json!({"max_consecutive_failures": 2, "cooldown_ms": 600000});
    start_checks(&app, checked_pool(http_check(150, 100), health), &[&id]).await;
    let out = await_member(&app, &id, |m| m["state"] == json!("ineligible")).await;
    assert_eq!(out["reason"], json!("unhealthy"), "{out}");
    assert_eq!(out["last_check"]["result"], json!("failed"), "{out}");
    assert_eq!(out["last_check"]["detail"], json!("status 502"), "{out}");
    // The cooldown is ten minutes: only a passing check can bring it back this soon.
    proxy.set(Mode::Ok);
    let back = await_member(&app, &id, |m| m["state"] == json!("eligible")).await;
    assert_eq!(back["last_check"]["detail"], json!("status 200"), "{back}");
    let lines = proxy.request_lines.lock().expect("lock").clone();
    assert!(
        lines
            .iter()
            .all(|l| l == "GET http://target.test/health HTTP/1.1"),
        "{lines:?}"
    );
    let (_, info) = app.get("/pools/p").await;
    assert_eq!(info["stats"]["recovered"], json!(1));
}

async fn a_members_last_check_keeps_its_latency_and_a_refused_one_has_none(app: TestApp) {
    let fine = FakeProxy::start(Mode::Ok).await;
    let closed = format!("http://127.0.0.1:{}", {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bound");
        listener.local_addr().expect("an address").port()
    });
    let health = json!({"max_consecutive_failures": 1, "cooldown_ms": 600000});
    start_checks(
        &app,
        checked_pool(http_check(60000, 2000), health),
        &[&fine.member(), &closed],
    )
    .await;
    let ok = await_member(&app, &fine.member(), |m| m.get("last_check").is_some()).await;
    let latency = ok["last_check"]["latency_ms"].as_u64().unwrap_or(u64::MAX);
    assert!(latency < 2000, "{ok}");
    let refused = await_member(&app, &closed, |m| m.get("last_check").is_some()).await;
    let mut keys: Vec<&String> = refused["last_check"]
        .as_object()
        .map(|check| check.keys().collect())
        .unwrap_or_default();
    keys.sort();
    assert_eq!(keys, ["at", "detail", "result"], "{refused}");
}

async fn a_proxy_answering_403_is_cooled_down_as_blocked(app: TestApp) {
    let proxy = FakeProxy::start(Mode::Forbidden).await;
    let id = proxy.member();
    let health = json!({"max_consecutive_failures": 1, "cooldown_ms": 600000});
    start_checks(&app, checked_pool(http_check(150, 100), health), &[&id]).await;
    let out = await_member(&app, &id, |m| m["state"] == json!("ineligible")).await;
    assert_eq!(
        (&out["reason"], &out["last_check"]["result"]),
        (&json!("blocked"), &json!("blocked")),
        "{out}"
    );
}

async fn a_hung_proxy_costs_at_most_the_probe_timeout(app: TestApp) {
    let hung = FakeProxy::start(Mode::Hang).await;
    let fine = FakeProxy::start(Mode::Ok).await;
    let (hung_id, fine_id) = (hung.member(), fine.member());
    let health = json!({"max_consecutive_failures": 1, "cooldown_ms": 600000});
    let started = Instant::now();
    start_checks(
        &app,
        checked_pool(http_check(60000, 300), health),
        &[&hung_id, &fine_id],
    )
    .await;
    let out = await_member(&app, &hung_id, |m| m.get("last_check").is_some()).await;
    let waited = started.elapsed();
    assert_eq!(out["last_check"]["detail"], json!("timeout"), "{out}");
    assert_eq!(out["state"], json!("ineligible"), "{out}");
    // One tick to start the round, the 300 ms timeout, and scheduling slack.
    assert!(waited < Duration::from_millis(1500), "{waited:?}");
    // The healthy proxy was not held up behind the hung one.
    let fine = member(&app, &fine_id).await;
    assert!(
        fine["last_check"]["at"].as_str() < out["last_check"]["at"].as_str(),
        "{fine} {out}"
    );
}

async fn a_tcp_check_fails_a_closed_port_and_passes_an_open_one(app: TestApp) {
    let open = FakeProxy::start(Mode::Ok).await;
    let closed_port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bound");
        listener.local_addr().expect("an address").port()
    };
    // Written without a scheme, as lists do; the pool stores it canonically.
    let closed = format!("http://127.0.0.1:{closed_port}");
    let check = json!({"kind": "tcp", "interval_ms": 150, "timeout_ms": 100});
    let health = json!({"max_consecutive_failures": 1, "cooldown_ms": 600000});
    start_checks(
        &app,
        checked_pool(check, health),
        &[&format!("127.0.0.1:{closed_port}"), &open.member()],
    )
    .await;
    let out = await_member(&app, &closed, |m| m["state"] == json!("ineligible")).await;
    assert_eq!(
        out["last_check"]["detail"],
        json!("connection refused"),
        "{out}"
    );
    let ok = await_member(&app, &open.member(), |m| m.get("last_check").is_some()).await;
    assert_eq!(
        (&ok["state"], &ok["last_check"]["result"]),
        (&json!("eligible"), &json!("ok"))
    );
}

async fn members_without_a_port_are_not_probed(app: TestApp) {
    let fine = FakeProxy::start(Mode::Ok).await;
    let check = json!({"kind": "tcp", "interval_ms": 150, "timeout_ms": 100});
    start_checks(
        &app,
        checked_pool(check, json!({})),
        &["opaque-proxy-id", &fine.member()],
    )
    .await;
    await_member(&app, &fine.member(), |m| m.get("last_check").is_some()).await;
    let opaque = member(&app, "opaque-proxy-id").await;
    assert_eq!(
        (&opaque["state"], opaque.get("last_check")),
        (&json!("eligible"), None)
    );
}

for_each_store!(
    a_failing_proxy_is_cooled_down_and_a_passing_check_brings_it_back,
    a_members_last_check_keeps_its_latency_and_a_refused_one_has_none,
    a_proxy_answering_403_is_cooled_down_as_blocked,
    a_hung_proxy_costs_at_most_the_probe_timeout,
    a_tcp_check_fails_a_closed_port_and_passes_an_open_one,
    members_without_a_port_are_not_probed,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_sharing_one_redis_run_a_pools_check_round_once() {
    let config = test_config(Some(shared_redis_url()));
    let (first, first_spy) = spawn_spied(config.clone()).await;
    let (second, second_spy) = spawn_spied(config).await;
    let proxy = FakeProxy::start(Mode::Ok).await;
    let id = proxy.member();
    // One round per minute: within this test only the first round can run.
    let check = json!({"kind": "tcp", "interval_ms": 60000, "timeout_ms": 100});
    start_checks(&first, checked_pool(check, json!({})), &[&id]).await;
    await_member(&second, &id, |m| m.get("last_check").is_some()).await;
    // Both instances tick every 50 ms: each looks for due rounds again after it ran, and
    // neither is handed the pool again, nor claims its round.
    let marks = (first_spy.check_ticks.mark(), second_spy.check_ticks.mark());
    first_spy
        .check_ticks
        .await_one_after(marks.0, "check tick of the first instance")
        .await;
    second_spy
        .check_ticks
        .await_one_after(marks.1, "check tick of the second instance")
        .await;
    let claims = first_spy.claims.mark() + second_spy.claims.mark();
    assert_eq!(claims, 1, "claims of the pool's round by the two instances");
    let rounds = first_spy.rounds.load(Ordering::SeqCst) + second_spy.rounds.load(Ordering::SeqCst);
    assert_eq!(rounds, 1, "check rounds the two instances won");
    assert_eq!(proxy.connections.load(Ordering::SeqCst), 1);
}
