//! Clients that would take the service down or walk in: idle connections, connections
//! beyond the cap or one client's share of it (clients on distinct loopback addresses),
//! unauthenticated and trickling connections, slow bodies, a flood past the open-file
//! limit, and worker routes on a network address without a token. Each runs the real binary (metrics are per process)
//! or an application on its own Redis, so every count is exact.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinHandle;

use crate::helpers::{
    ADMIN, RedisServer, TestApp, command_calls, command_delta, test_config,
    without_background_traffic,
};
use crate::process::ServiceProcess;

const ASSIGN: &str = "POST /pools/p/assign HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n";

/// One HTTP/1.1 answer read off a raw connection.
#[derive(Debug)]
struct Answer {
    status: u16,
    head: String,
    body: Value,
}

/// A connection that sends requests one after another on the same socket, so a test can
/// tell that this very connection keeps being served.
struct RawClient {
    stream: TcpStream,
    pending: Vec<u8>,
}

impl RawClient {
    async fn connect(addr: &str) -> Self {
        Self {
            stream: TcpStream::connect(addr).await.expect("connected"),
            pending: Vec::new(),
        }
    }

    /// Sends `request` and reads its answer; `None` when the service closed the connection.
    async fn send(&mut self, request: &str) -> Option<Answer> {
        self.stream.write_all(request.as_bytes()).await.ok()?;
        read_answer(&mut self.stream, &mut self.pending).await
    }
}

/// Reads one answer (head and `content-length` body); `None` on a close before a whole one.
async fn read_answer(stream: &mut TcpStream, pending: &mut Vec<u8>) -> Option<Answer> {
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => pending.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&pending[..head_end]).to_ascii_lowercase();
    let status = head.get(9..12)?.parse().ok()?;
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .map_or(0, |n| n.trim().parse().unwrap_or(0));
    while pending.len() < head_end + length {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => pending.extend_from_slice(&chunk[..n]),
        }
    }
    let body: Vec<u8> = pending.drain(..head_end + length).skip(head_end).collect();
    Some(Answer {
        status,
        head,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    })
}

fn addr_of(base: &str) -> String {
    base.trim_start_matches("http://").to_owned()
}

/// The probe port's address from the service's log.
fn probe_addr(service: &ServiceProcess) -> String {
    let line = service
        .wait_lines("\"probes listening\"", 1)
        .pop()
        .expect("the probe port is logged");
    let value: Value = serde_json::from_str(&line).expect("a JSON line");
    value["addr"].as_str().expect("addr").to_owned()
}

/// The gateway's address from the service's log.
fn gateway_addr(service: &ServiceProcess) -> String {
    let line = service
        .wait_lines("\"gateway listening\"", 1)
        .pop()
        .expect("the gateway is logged");
    let value: Value = serde_json::from_str(&line).expect("a JSON line");
    value["addr"].as_str().expect("addr").to_owned()
}

/// A client that opens a new connection for every request, as orchestrators' probes do.
fn probe_client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .expect("a client")
}

/// The value of one series of the service's `/metrics`, e.g.
/// `pa_connections_refused_total{listener="api"}`; 0 when absent.
async fn metric(probe: &str, series: &str) -> f64 {
    let text = probe_client()
        .get(format!("http://{probe}/metrics"))
        .send()
        .await
        .expect("scraped")
        .text()
        .await
        .expect("text");
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |value| value.parse().expect("a number"))
}

/// Waits until `series` reads `expected` (at most 10 s); returns the last value read.
async fn await_metric(probe: &str, series: &str, expected: f64) -> f64 {
    let started = Instant::now();
    loop {
        let value = metric(probe, series).await;
        if (value - expected).abs() < f64::EPSILON || started.elapsed() > Duration::from_secs(10) {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A pool `p` with one member, created through a client that keeps no connection open.
async fn seed_pool(base: &str) {
    let client = probe_client();
    let created = client
        .put(format!("{base}/pools/p"))
        .bearer_auth(ADMIN)
        .json(&json!({}))
        .send()
        .await
        .expect("sent");
    assert_eq!(created.status(), StatusCode::CREATED);
    let seeded = client
        .post(format!("{base}/pools/p/members"))
        .bearer_auth(ADMIN)
        .json(&json!({"members": ["http://p1.example.net:3128"]}))
        .send()
        .await
        .expect("sent");
    assert_eq!(seeded.status(), StatusCode::OK);
}

/// Opens `n` connections one after another that never send anything; each task answers
/// how long after its connect began the service closed it, or `None` if it was still open
/// after `bound`. Timed from before the connect, so that the time is never shorter than
/// the service's own from accept, however late this task runs.
async fn idle_connections(
    addr: &str,
    n: usize,
    bound: Duration,
) -> Vec<JoinHandle<Option<Duration>>> {
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        let connecting = Instant::now();
        let mut stream = TcpStream::connect(addr).await.expect("connected");
        tasks.push(tokio::spawn(async move {
            let mut byte = [0u8; 1];
            let closed = tokio::time::timeout(bound, stream.read(&mut byte)).await;
            closed.ok().map(|_| connecting.elapsed())
        }));
    }
    tasks
}

#[tokio::test]
async fn idle_connections_are_closed_at_the_header_timeout_and_those_over_the_cap_at_once_while_an_open_client_keeps_assigning()
 {
    let header_timeout = Duration::from_secs(2);
    let slack = Duration::from_secs(2);
    let (cap, flood) = (50, 300);
    let service = ServiceProcess::start(&[
        ("MAX_CONNECTIONS", cap.to_string()),
        // One address floods: this is about the cap, not a client's share of it.
        ("MAX_CONNECTIONS_PER_CLIENT", cap.to_string()),
        (
            "HEADER_READ_TIMEOUT_MS",
            header_timeout.as_millis().to_string(),
        ),
        ("KEEP_ALIVE_TIMEOUT_MS", "30000".to_owned()),
        ("PROBE_LISTEN", "127.0.0.1:0".to_owned()),
    ]);
    let (api, probe) = (addr_of(&service.base), probe_addr(&service));
    seed_pool(&service.base).await;
    let mut worker = RawClient::connect(&api).await;
    let open = r#"pa_connections_open{listener="api"}"#;
    assert_eq!(
        await_metric(&probe, open, 1.0).await,
        1.0,
        "only the worker"
    );

    let idle = idle_connections(&api, flood, header_timeout + slack + slack).await;
    let mut assigns = 0;
    while !idle.iter().all(JoinHandle::is_finished) {
        let answer = worker
            .send(ASSIGN)
            .await
            .expect("the open connection is served");
        assert_eq!(answer.status, 200, "{answer:?}");
        assigns += 1;
        // A worker's pace, not a load test: the fault suite's other tests share the cores.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut refused = Vec::new();
    let mut timed_out = Vec::new();
    for task in idle {
        let closed = task
            .await
            .expect("joined")
            .expect("closed within the bound");
        // A connection under the cap cannot be closed before its header timeout, which the
        // service counts from accept, after the connect began: whatever closed sooner was
        // refused at the cap.
        if closed < header_timeout {
            refused.push(closed);
        } else {
            timed_out.push(closed);
        }
    }
    assert_eq!(
        (refused.len(), timed_out.len()),
        (flood - (cap - 1), cap - 1),
        "the worker holds one place under the cap"
    );
    let latest = timed_out.iter().max().expect("some timed out");
    assert!(
        *latest <= header_timeout + slack,
        "the last idle connection under the cap was closed after {latest:?}"
    );
    assert!(assigns > 0);

    let mut fresh = RawClient::connect(&api).await;
    assert_eq!(fresh.send(ASSIGN).await.expect("answered").status, 200);
    assert_eq!(
        metric(&probe, r#"pa_connections_refused_total{listener="api"}"#).await,
        (flood - (cap - 1)) as f64
    );
    assert_eq!(
        metric(
            &probe,
            r#"pa_connection_timeouts_total{listener="api",kind="header"}"#
        )
        .await,
        (cap - 1) as f64
    );
}

/// Opens a connection to a listener at its cap and asks for `/livez`: the connection is
/// closed, or answered 503 `too_many_connections` with `Retry-After`, at once — well before
/// any timeout of the service could have closed it. True when it was answered.
async fn refused_at_once(addr: &str) -> bool {
    let mut stream = TcpStream::connect(addr).await.expect("connected");
    let _ = stream
        .write_all(b"GET /livez HTTP/1.1\r\nhost: x\r\n\r\n")
        .await;
    let answer = tokio::time::timeout(
        Duration::from_secs(10),
        read_answer(&mut stream, &mut Vec::new()),
    )
    .await
    .expect("closed or answered at once, not held");
    let Some(answer) = answer else {
        return false;
    };
    assert_eq!(answer.status, 503, "{answer:?}");
    assert!(answer.head.contains("\r\nretry-after: 1\r\n"), "{answer:?}");
    assert_eq!(answer.body["error"]["code"], "too_many_connections");
    true
}

#[tokio::test]
async fn at_the_cap_new_connections_are_refused_at_once_and_the_probe_port_answers_within_100_ms() {
    let cap = 20;
    let service = ServiceProcess::start(&[
        ("MAX_CONNECTIONS", cap.to_string()),
        ("MAX_CONNECTIONS_PER_CLIENT", cap.to_string()),
        // Nothing times out while the test runs: every close it sees is a refusal.
        ("HEADER_READ_TIMEOUT_MS", "60000".to_owned()),
        ("KEEP_ALIVE_TIMEOUT_MS", "60000".to_owned()),
        ("PROBE_LISTEN", "127.0.0.1:0".to_owned()),
        // The end of a cap episode is an info line.
        (
            "RUST_LOG",
            "warn,proxy_allocator::startup=info,proxy_allocator::connections=info".to_owned(),
        ),
    ]);
    let (api, probe) = (addr_of(&service.base), probe_addr(&service));
    seed_pool(&service.base).await;
    let mut worker = RawClient::connect(&api).await;
    assert_eq!(worker.send(ASSIGN).await.expect("answered").status, 200);
    let idle = idle_connections(&api, cap - 1, Duration::from_secs(120)).await;
    let open = r#"pa_connections_open{listener="api"}"#;
    assert_eq!(await_metric(&probe, open, cap as f64).await, cap as f64);

    let probes = probe_client();
    let mut answered_503 = 0;
    for _ in 0..50 {
        if refused_at_once(&api).await {
            answered_503 += 1;
        }

        let started = Instant::now();
        let livez = probes
            .get(format!("http://{probe}/livez"))
            .send()
            .await
            .expect("the probe port answers");
        let took = started.elapsed();
        assert_eq!(livez.status(), StatusCode::OK);
        assert!(took < Duration::from_millis(100), "/livez took {took:?}");
    }
    println!("{answered_503} of 50 refused connections were answered 503 before the close");
    assert_eq!(
        metric(&probe, r#"pa_connections_refused_total{listener="api"}"#).await,
        50.0
    );
    let answer = worker.send(ASSIGN).await.expect("still served");
    assert_eq!(answer.status, 200, "{answer:?}");

    // The episode was logged once when it started, and ends with a line that counts it once
    // the flood is gone and a quiet second has passed.
    let reached = service.wait_lines("connection cap reached", 1);
    assert_eq!(reached.len(), 1, "{reached:#?}");
    for task in &idle {
        task.abort();
    }
    assert_eq!(await_metric(&probe, open, 1.0).await, 1.0);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let fresh = probe_client()
        .get(format!("{}/livez", service.base))
        .send()
        .await
        .expect("a fresh connection is served again");
    assert_eq!(fresh.status(), StatusCode::OK);
    let again = service.wait_lines("below the connection cap again", 1);
    assert_eq!(again.len(), 1, "{again:#?}");
    let again: Value = serde_json::from_str(&again[0]).expect("a JSON line");
    assert_eq!(again["refused"], 50);
    let about_the_cap = service
        .all_lines()
        .into_iter()
        .filter(|line| line.contains("connection cap"))
        .count();
    assert_eq!(
        about_the_cap, 2,
        "one line when it starts, one when it ends"
    );
}

#[tokio::test]
async fn the_probe_port_has_its_own_cap_and_a_full_probe_port_leaves_the_api_port_serving() {
    let service = ServiceProcess::start(&[
        ("PROBE_LISTEN", "127.0.0.1:0".to_owned()),
        ("PROBE_MAX_CONNECTIONS", "4".to_owned()),
        ("HEADER_READ_TIMEOUT_MS", "60000".to_owned()),
    ]);
    let probe = probe_addr(&service);
    let api = addr_of(&service.base);
    let _held = idle_connections(&probe, 4, Duration::from_secs(120)).await;
    let open = r#"pa_connections_open{listener="probe"}"#;
    assert_eq!(await_metric(&api, open, 4.0).await, 4.0);
    for _ in 0..10 {
        refused_at_once(&probe).await;
    }
    assert_eq!(
        metric(&api, r#"pa_connections_refused_total{listener="probe"}"#).await,
        10.0
    );
    assert_eq!(
        metric(&api, r#"pa_connections_refused_total{listener="api"}"#).await,
        0.0
    );
    seed_pool(&service.base).await;
    let mut worker = RawClient::connect(&api).await;
    assert_eq!(worker.send(ASSIGN).await.expect("answered").status, 200);
}

#[tokio::test]
async fn a_slow_body_is_counted_as_a_body_timeout_and_nothing_else() {
    let service = ServiceProcess::start(&[
        ("PROBE_LISTEN", "127.0.0.1:0".to_owned()),
        ("BODY_READ_TIMEOUT_MS", "300".to_owned()),
    ]);
    let probe = probe_addr(&service);
    let mut stream = TcpStream::connect(addr_of(&service.base))
        .await
        .expect("connected");
    stream
        .write_all(b"POST /pools/p/assign HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{")
        .await
        .expect("sent");
    let answer = read_answer(&mut stream, &mut Vec::new())
        .await
        .expect("an answer");
    assert_eq!(answer.status, 408, "{answer:?}");
    let body = r#"pa_connection_timeouts_total{listener="api",kind="body"}"#;
    assert_eq!(await_metric(&probe, body, 1.0).await, 1.0);
    for kind in ["header", "keep_alive"] {
        let series = format!(r#"pa_connection_timeouts_total{{listener="api",kind="{kind}"}}"#);
        assert_eq!(metric(&probe, &series).await, 0.0, "{kind}");
    }
}

/// How long after `since` the service closes `client`'s connection (at most 30 s).
async fn closed_after(client: &mut RawClient, since: Instant) -> Duration {
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(30), client.stream.read(&mut byte)).await;
    assert!(
        matches!(read, Ok(Ok(0) | Err(_))),
        "closed without an answer: {read:?}"
    );
    since.elapsed()
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_after_the_keep_alive_timeout_and_a_next_head_gets_the_header_timeout()
 {
    let (header, keep_alive) = (Duration::from_secs(1), Duration::from_secs(6));
    let slack = Duration::from_secs(2);
    let service = ServiceProcess::start(&[
        ("HEADER_READ_TIMEOUT_MS", header.as_millis().to_string()),
        ("KEEP_ALIVE_TIMEOUT_MS", keep_alive.as_millis().to_string()),
        ("PROBE_LISTEN", "127.0.0.1:0".to_owned()),
    ]);
    let (api, probe) = (addr_of(&service.base), probe_addr(&service));
    seed_pool(&service.base).await;
    let mut idle = RawClient::connect(&api).await;
    let mut started = RawClient::connect(&api).await;
    // Every time is taken before the event the service times from, so that it is never
    // shorter than the service's own, however late this test's task runs.
    let idle_since = Instant::now();
    assert_eq!(idle.send(ASSIGN).await.expect("answered").status, 200);
    let started_since = Instant::now();
    assert_eq!(started.send(ASSIGN).await.expect("answered").status, 200);
    // The next request's first bytes come 1.5 s into the idle time (once the deadline from
    // accept has passed and the keep-alive one is set), and never the rest of the head.
    let trickle = async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let first_byte = Instant::now();
        started
            .stream
            .write_all(b"POST /pools/p/as")
            .await
            .expect("sent");
        closed_after(&mut started, first_byte).await
    };
    let (idle_closed, trickle_closed) = tokio::join!(closed_after(&mut idle, idle_since), trickle);
    assert!(
        idle_closed >= keep_alive && idle_closed < keep_alive + slack,
        "the idle connection was closed after {idle_closed:?}"
    );
    assert!(
        trickle_closed >= header && trickle_closed < header + slack,
        "the started head was cut off {trickle_closed:?} after its first byte"
    );
    assert!(started_since.elapsed() < keep_alive + slack);
    let kind =
        |kind: &str| format!(r#"pa_connection_timeouts_total{{listener="api",kind="{kind}"}}"#);
    assert_eq!(metric(&probe, &kind("keep_alive")).await, 1.0);
    assert_eq!(metric(&probe, &kind("header")).await, 1.0);
}

#[tokio::test]
async fn the_probe_port_serves_the_probe_routes_and_nothing_else() {
    let service = ServiceProcess::start(&[("PROBE_LISTEN", "127.0.0.1:0".to_owned())]);
    let probe = probe_addr(&service);
    let client = probe_client();
    let routes = proxy_allocator::http::routes();
    assert_eq!(
        routes
            .iter()
            .filter(|route| route.probe)
            .map(|route| route.path)
            .collect::<Vec<_>>(),
        ["/livez", "/readyz", "/metrics"]
    );
    for route in routes {
        let path = route.path.replace("{pool}", "p").replace("{lease}", "0");
        let answer = client
            .request(route.method.clone(), format!("http://{probe}{path}"))
            .bearer_auth(ADMIN)
            .send()
            .await
            .expect("answered");
        let expected = if route.probe {
            StatusCode::OK
        } else {
            StatusCode::NOT_FOUND
        };
        assert_eq!(answer.status(), expected, "{} {path}", route.method);
        if !route.probe {
            let body: Value = answer.json().await.expect("JSON");
            assert_eq!(
                body["error"]["code"], "not_found",
                "{} {path}",
                route.method
            );
        }
    }
}

/// An application on a Redis of its own, so that its command counts are this test's.
async fn app_on_own_redis(body_ms: u64, import_ms: u64) -> (TestApp, RedisServer) {
    let redis = RedisServer::start();
    let mut config = test_config(Some(redis.url()));
    without_background_traffic(&mut config);
    config.body_read_timeout_ms = body_ms;
    config.import_body_read_timeout_ms = import_ms;
    let app = TestApp::spawn_with(config).await;
    app.create_pool("p", json!({})).await;
    app.seed("p", &["http://p1.example.net:3128"], None).await;
    (app, redis)
}

#[tokio::test]
async fn a_slow_body_gets_408_at_the_body_timeout_and_never_reaches_the_store() {
    let timeout = Duration::from_millis(500);
    let (app, redis) = app_on_own_redis(500, 60_000).await;
    for request in [
        "POST /pools/p/assign HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{",
        "POST /pools/p/members HTTP/1.1\r\nhost: x\r\nauthorization: Bearer test-admin-token\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"members\": [\"http://p2.example.net:3128\"",
    ] {
        let before = command_calls(&redis.url());
        let mut stream = TcpStream::connect(addr_of(&app.base))
            .await
            .expect("connected");
        let started = Instant::now();
        stream.write_all(request.as_bytes()).await.expect("sent");
        let answer = read_answer(&mut stream, &mut Vec::new())
            .await
            .expect("an answer");
        let took = started.elapsed();
        let after = command_calls(&redis.url());
        assert_eq!(answer.status, 408, "{answer:?}");
        assert_eq!(
            answer.body,
            json!({"error": {"code": "request_timeout", "message": "the request body did not arrive within 500 ms"}})
        );
        assert!(answer.head.contains("\r\nconnection: close\r\n"));
        assert!(
            took >= timeout,
            "answered after {took:?}, before the timeout"
        );
        assert!(
            took < timeout + Duration::from_secs(3),
            "answered after {took:?}"
        );
        let mut rest = Vec::new();
        assert_eq!(
            stream.read_to_end(&mut rest).await.map(|_| rest.len()).ok(),
            Some(0)
        );
        // `INFO commandstats` counts the INFO before as the only command in between.
        assert_eq!(
            command_delta(&before, &after),
            [("info".to_owned(), 1)].into_iter().collect(),
            "nothing reached the store"
        );
    }
    assert_eq!(
        app.counts("p").await,
        [(
            "http://p1.example.net:3128".to_owned(),
            0,
            "eligible".to_owned()
        )]
    );
}

#[tokio::test]
async fn the_import_route_waits_for_its_own_longer_body_timeout() {
    let (app, _redis) = app_on_own_redis(300, 10_000).await;
    let body = "http://p2.example.net:3128\n";
    for (path, status) in [("/pools/p/import", 200), ("/pools/p/members", 408)] {
        let content_type = if path.ends_with("import") {
            "text/plain"
        } else {
            "application/json"
        };
        let body = if path.ends_with("import") {
            body.to_owned()
        } else {
            json!({"members": ["http://p2.example.net:3128"]}).to_string()
        };
        let mut stream = TcpStream::connect(addr_of(&app.base))
            .await
            .expect("connected");
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {ADMIN}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        let (first, second) = body.split_at(body.len() / 2);
        stream.write_all(head.as_bytes()).await.expect("sent");
        stream.write_all(first.as_bytes()).await.expect("sent");
        // The client is slow on purpose: the second half comes after the short timeout.
        tokio::time::sleep(Duration::from_millis(600)).await;
        let _ = stream.write_all(second.as_bytes()).await;
        let answer = read_answer(&mut stream, &mut Vec::new())
            .await
            .expect("an answer");
        assert_eq!(answer.status, status, "{path}: {answer:?}");
    }
    let members: Vec<String> = app
        .counts("p")
        .await
        .into_iter()
        .map(|(m, _, _)| m)
        .collect();
    assert_eq!(
        members,
        ["http://p1.example.net:3128", "http://p2.example.net:3128"]
    );
}

#[tokio::test]
async fn accept_errors_during_a_flood_past_the_open_file_limit_are_logged_once_when_they_start_and_once_when_they_stop()
 {
    // A cap above what 128 open files allow, so that accepting runs out of files.
    let service = ServiceProcess::start_via(
        &["prlimit", "--nofile=128:128", "--"],
        &[
            ("MAX_CONNECTIONS", "10000".to_owned()),
            ("HEADER_READ_TIMEOUT_MS", "1000".to_owned()),
        ],
    );
    let api = addr_of(&service.base);
    let flood = idle_connections(&api, 400, Duration::from_secs(30)).await;
    for task in flood {
        assert!(
            task.await.expect("joined").is_some(),
            "every flooding connection is closed in the end"
        );
    }
    // The episode ends with the first accept a quiet second after the last failure.
    let client = probe_client();
    let started = Instant::now();
    while service
        .wait_lines("accepting connections again", 0)
        .is_empty()
    {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "never recovered"
        );
        let livez = client.get(format!("{}/livez", service.base)).send().await;
        assert_eq!(livez.expect("answered").status(), StatusCode::OK);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let about_accept: Vec<String> = service
        .all_lines()
        .into_iter()
        .filter(|line| line.contains("\"message\":\"accept"))
        .collect();
    assert_eq!(about_accept.len(), 2, "{about_accept:#?}");
    assert!(
        about_accept[0].contains("accept failing"),
        "{about_accept:#?}"
    );
    assert!(
        about_accept[0].contains("Too many open files"),
        "{about_accept:#?}"
    );
    let recovered: Value = serde_json::from_str(&about_accept[1]).expect("JSON");
    let errors = recovered["errors"].as_u64().expect("a count");
    assert!(errors > 0);
    let metrics = client
        .get(format!("{}/metrics", service.base))
        .send()
        .await
        .expect("scraped")
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains(&format!(
            "pa_accept_errors_total{{listener=\"api\"}} {errors}\n"
        )),
        "{errors} errors logged; {metrics}"
    );
}

#[tokio::test]
async fn without_max_connections_the_cap_is_half_of_what_the_raised_open_file_limit_leaves() {
    let service = ServiceProcess::start_via(
        &["prlimit", "--nofile=300:1000", "--"],
        &[("PROBE_LISTEN", "127.0.0.1:0".to_owned())],
    );
    let limit: Value = serde_json::from_str(
        &service
            .wait_lines("\"open-file limit\"", 1)
            .pop()
            .expect("logged"),
    )
    .expect("JSON");
    assert_eq!(
        (&limit["soft_at_start"], &limit["soft"], &limit["hard"]),
        (&json!(300), &json!(1000), &json!(1000))
    );
    let listening: Value = serde_json::from_str(
        &service
            .wait_lines("\"listening\"", 1)
            .pop()
            .expect("logged"),
    )
    .expect("JSON");
    // (1000 - 128 kept back - 32 for the probe port) / 2
    assert_eq!(listening["max_connections"], json!(420));
    assert_eq!(
        metric(
            &probe_addr(&service),
            r#"pa_connections_max{listener="api"}"#
        )
        .await,
        420.0
    );
}

/// Runs the binary with `env` until it exits (at most 10 s): its exit code and log lines.
fn run_to_exit(env: &[(&str, &str)]) -> (Option<i32>, Vec<String>) {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_proxy-allocator"));
    command
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("ADMIN_TOKEN", ADMIN)
        .env("LOG_FORMAT", "json")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    for (key, value) in env {
        command.env(key, value);
    }
    let mut child = command.spawn().expect("started");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waited") {
            break status;
        }
        if started.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the service did not exit within 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    let _ = std::io::Read::read_to_string(&mut child.stdout.take().expect("stdout"), &mut out);
    (status.code(), out.lines().map(str::to_owned).collect())
}

#[tokio::test]
async fn a_non_loopback_listen_address_without_a_worker_token_exits_non_zero_saying_why() {
    for env in [
        vec![("LISTEN_ADDR", "0.0.0.0:0")],
        vec![("LISTEN_ADDR", "[::]:0")],
        vec![
            ("LISTEN_ADDR", "0.0.0.0:0"),
            ("ALLOW_ANONYMOUS_WORKERS", "false"),
        ],
    ] {
        let (code, lines) = run_to_exit(&env);
        assert_eq!(code, Some(1), "{env:?}: {lines:#?}");
        let errors: Vec<&String> = lines.iter().filter(|l| l.contains("\"ERROR\"")).collect();
        assert_eq!(errors.len(), 1, "{lines:#?}");
        let error: Value = serde_json::from_str(errors[0]).expect("JSON");
        let reason = error["error"].as_str().expect("a reason");
        assert!(
            reason.starts_with("refusing to start: ")
                && reason.contains("is not a loopback address and no worker token is set")
                && reason.contains(
                    "set WORKER_TOKEN or WORKER_TOKEN_FILE, or ALLOW_ANONYMOUS_WORKERS=true"
                ),
            "{reason}"
        );
        assert!(
            !lines.iter().any(|l| l.contains("\"listening\"")),
            "never listened"
        );
    }
    // The book's API page shows the line as printed for 0.0.0.0:8080 (nothing is bound
    // before it).
    let (code, lines) = run_to_exit(&[("LISTEN_ADDR", "0.0.0.0:8080")]);
    assert_eq!((code, lines.len()), (Some(1), 1), "{lines:#?}");
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/src/api.md"))
        .expect("the book's API page");
    let shown = page
        .lines()
        .find(|line| line.contains("\"refusing to start: "))
        .expect("the API page shows the refusal");
    let without_time = |line: &str| {
        let mut value: Value = serde_json::from_str(line).expect("JSON");
        value["timestamp"] = Value::Null;
        value
    };
    assert_eq!(without_time(shown), without_time(&lines[0]));

    let (code, lines) = run_to_exit(&[("LISTEN_ADDR", "0.0.0.0:0"), ("WORKER_TOKEN", "  ")]);
    assert_eq!(code, Some(1));
    assert!(
        lines
            .iter()
            .any(|l| l.contains("WORKER_TOKEN is set but empty")),
        "{lines:#?}"
    );
}

/// The loopback URL of a service that listens on every interface.
fn on_loopback(service: &ServiceProcess) -> String {
    let port = service.base.rsplit(':').next().expect("a port");
    format!("http://127.0.0.1:{port}")
}

#[tokio::test]
async fn a_non_loopback_address_starts_with_allow_anonymous_workers_and_says_so() {
    let service = ServiceProcess::start(&[
        ("LISTEN_ADDR", "0.0.0.0:0".to_owned()),
        ("ALLOW_ANONYMOUS_WORKERS", "true".to_owned()),
    ]);
    let warned = service.wait_lines("ALLOW_ANONYMOUS_WORKERS: worker routes are open", 1);
    assert_eq!(warned.len(), 1);
    let answer = probe_client()
        .post(format!("{}/pools/p/assign", on_loopback(&service)))
        .send()
        .await
        .expect("answered");
    assert_eq!(
        answer.status(),
        StatusCode::NOT_FOUND,
        "open, and no pool p"
    );
}

#[tokio::test]
async fn a_worker_token_file_closes_worker_routes_and_allows_a_non_loopback_address() {
    let file = std::env::temp_dir().join(format!("pa-worker-token-{}", rand::random::<u64>()));
    std::fs::write(&file, "worker-from-file\n").expect("written");
    let service = ServiceProcess::start(&[
        ("LISTEN_ADDR", "0.0.0.0:0".to_owned()),
        ("WORKER_TOKEN_FILE", file.display().to_string()),
    ]);
    let base = on_loopback(&service);
    let client = probe_client();
    let anonymous = client.post(format!("{base}/pools/p/assign")).send().await;
    assert_eq!(
        anonymous.expect("answered").status(),
        StatusCode::UNAUTHORIZED
    );
    let worker = client
        .post(format!("{base}/pools/p/assign"))
        .bearer_auth("worker-from-file")
        .send()
        .await;
    assert_eq!(worker.expect("answered").status(), StatusCode::NOT_FOUND);
    let _ = std::fs::remove_file(file);
}

/// A connection from the loopback address `source` (127.0.0.2, 127.0.0.3, ...), so that one
/// test can be several clients.
async fn connect_from(source: &str, addr: &str) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("a socket");
    socket
        .bind(format!("{source}:0").parse().expect("an address"))
        .expect("bound to the source address");
    socket
        .connect(addr.parse().expect("an address"))
        .await
        .expect("connected")
}

/// `n` connections from `source` that send nothing, opened one after another.
async fn idle_from(source: &str, addr: &str, n: usize) -> Vec<TcpStream> {
    let mut streams = Vec::with_capacity(n);
    for _ in 0..n {
        streams.push(connect_from(source, addr).await);
    }
    streams
}

/// How many of `streams` the service has closed and how many it keeps open (those that
/// read nothing for 200 ms, once the test knows the closes have happened).
async fn closed_and_open(streams: &mut [TcpStream]) -> (usize, usize) {
    let mut closed = 0;
    for stream in streams.iter_mut() {
        let mut byte = [0u8; 1];
        match tokio::time::timeout(Duration::from_millis(200), stream.read(&mut byte)).await {
            Ok(Ok(0) | Err(_)) => closed += 1,
            Ok(Ok(_)) => panic!("an idle connection was answered"),
            Err(_) => {}
        }
    }
    (closed, streams.len() - closed)
}

/// A JSON log line's value.
fn json_line(line: &str) -> Value {
    serde_json::from_str(line).expect("a JSON line")
}

#[tokio::test]
async fn one_address_holding_far_more_idle_connections_than_its_share_cannot_make_a_request_from_another_address_fail()
 {
    let (cap, flood) = (40, 200);
    let service = ServiceProcess::start(&[
        ("MAX_CONNECTIONS", cap.to_string()),
        // Nothing times out while the test runs: every close it sees is a refusal.
        ("HEADER_READ_TIMEOUT_MS", "60000".to_owned()),
        ("UNAUTHENTICATED_TIMEOUT_MS", "60000".to_owned()),
        ("KEEP_ALIVE_TIMEOUT_MS", "60000".to_owned()),
        ("PROBE_LISTEN", "127.0.0.1:0".to_owned()),
    ]);
    let listening = json_line(&service.wait_lines("\"listening\"", 1)[0]);
    // No MAX_CONNECTIONS_PER_CLIENT: a quarter of the cap.
    let share = cap / 4;
    assert_eq!(listening["max_connections_per_client"], json!(share));
    let (api, probe) = (addr_of(&service.base), probe_addr(&service));
    seed_pool(&service.base).await;

    let mut attacker = idle_from("127.0.0.2", &api, flood).await;
    let per_client = r#"pa_connections_refused_per_client_total{listener="api"}"#;
    let refused = (flood - share) as f64;
    assert_eq!(await_metric(&probe, per_client, refused).await, refused);
    assert_eq!(closed_and_open(&mut attacker).await, (flood - share, share));

    // Another address: fresh connections for /livez, and a worker's keep-alive connection.
    let mut worker = connect_from("127.0.0.3", &api).await;
    let mut pending = Vec::new();
    for _ in 0..20 {
        let mut livez = connect_from("127.0.0.3", &api).await;
        livez
            .write_all(b"GET /livez HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .expect("sent");
        let answer = read_answer(&mut livez, &mut Vec::new())
            .await
            .expect("answered");
        assert_eq!(answer.status, 200, "{answer:?}");
        worker.write_all(ASSIGN.as_bytes()).await.expect("sent");
        let answer = read_answer(&mut worker, &mut pending)
            .await
            .expect("answered");
        assert_eq!(answer.status, 200, "{answer:?}");
    }

    // The attacker's next connection, request already sent, is told why.
    let mut more = connect_from("127.0.0.2", &api).await;
    more.write_all(b"GET /livez HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("sent");
    if let Some(answer) = read_answer(&mut more, &mut Vec::new()).await {
        assert_eq!(answer.status, 503, "{answer:?}");
        assert!(answer.head.contains("\r\nretry-after: 1\r\n"), "{answer:?}");
        assert_eq!(
            answer.body,
            json!({"error": {"code": "too_many_connections", "message": "this client address holds the most connections one client may; retry shortly"}})
        );
    }
    assert_eq!(metric(&probe, per_client).await, refused + 1.0);
    assert_eq!(
        metric(&probe, r#"pa_connections_refused_total{listener="api"}"#).await,
        0.0,
        "the port never reached its cap"
    );
    assert_eq!(
        metric(&probe, r#"pa_connections_max_per_client{listener="api"}"#).await,
        share as f64
    );
    // One line for the attacker however many it was refused, naming it.
    let logged = service.wait_lines("client at its share of connections", 1);
    assert_eq!(logged.len(), 1, "{logged:#?}");
    let logged = json_line(&logged[0]);
    assert_eq!(
        (
            &logged["listener"],
            &logged["client"],
            &logged["max_connections_per_client"]
        ),
        (&json!("api"), &json!("127.0.0.2"), &json!(share))
    );
    // Its places come back as its connections close.
    attacker.clear();
    let open = r#"pa_connections_open{listener="api"}"#;
    assert_eq!(
        await_metric(&probe, open, 1.0).await,
        1.0,
        "only the worker"
    );
    let mut back = connect_from("127.0.0.2", &api).await;
    back.write_all(b"GET /livez HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("sent");
    let answer = read_answer(&mut back, &mut Vec::new())
        .await
        .expect("answered");
    assert_eq!(answer.status, 200);
}

#[tokio::test]
async fn a_trusted_network_is_not_held_to_a_share_but_the_cap_still_applies() {
    let cap = 40;
    let service = ServiceProcess::start(&[
        ("MAX_CONNECTIONS", cap.to_string()),
        ("MAX_CONNECTIONS_PER_CLIENT", "5".to_owned()),
        (
            "TRUSTED_CLIENT_NETWORKS",
            "10.0.0.0/8,127.0.0.2/31".to_owned(),
        ),
        ("HEADER_READ_TIMEOUT_MS", "60000".to_owned()),
        ("UNAUTHENTICATED_TIMEOUT_MS", "60000".to_owned()),
        ("PROBE_LISTEN", "127.0.0.1:0".to_owned()),
    ]);
    let (api, probe) = (addr_of(&service.base), probe_addr(&service));
    // 127.0.0.2 and 127.0.0.3 are in 127.0.0.2/31: together past the share, up to the cap.
    let mut balancer = idle_from("127.0.0.2", &api, 30).await;
    balancer.extend(idle_from("127.0.0.3", &api, 20).await);
    let at_cap = r#"pa_connections_refused_total{listener="api"}"#;
    assert_eq!(await_metric(&probe, at_cap, 10.0).await, 10.0);
    assert_eq!(closed_and_open(&mut balancer).await, (10, cap));
    // 127.0.0.4 is not trusted: held to its share (and, the port being full, refused).
    let mut other = idle_from("127.0.0.4", &api, 3).await;
    assert_eq!(await_metric(&probe, at_cap, 13.0).await, 13.0);
    assert_eq!(closed_and_open(&mut other).await, (3, 0));
    balancer.truncate(cap - 10);
    let open = r#"pa_connections_open{listener="api"}"#;
    assert_eq!(
        await_metric(&probe, open, 30.0).await,
        30.0,
        "ten places free"
    );
    let mut other = idle_from("127.0.0.4", &api, 8).await;
    let per_client = r#"pa_connections_refused_per_client_total{listener="api"}"#;
    assert_eq!(await_metric(&probe, per_client, 3.0).await, 3.0);
    assert_eq!(closed_and_open(&mut other).await, (3, 5));
    assert_eq!(
        metric(&probe, at_cap).await,
        13.0,
        "none of these at the cap"
    );
}

/// Writes `head` one byte every 100 ms until the service closes the connection; how long
/// after the connect began that was, and the bytes sent.
async fn trickle(source: &str, addr: &str, head: &[u8]) -> (Duration, usize) {
    let connecting = Instant::now();
    let mut stream = connect_from(source, addr).await;
    let mut sent = 0;
    for byte in head.iter().cycle() {
        if stream.write_all(&[*byte]).await.is_err() {
            break;
        }
        sent += 1;
        let mut answer = [0u8; 1];
        match tokio::time::timeout(Duration::from_millis(100), stream.read(&mut answer)).await {
            Ok(Ok(0) | Err(_)) => break,
            Ok(Ok(_)) => panic!("a partial head was answered"),
            Err(_) => {}
        }
        assert!(
            connecting.elapsed() < Duration::from_secs(20),
            "never closed"
        );
    }
    (connecting.elapsed(), sent)
}

#[tokio::test]
async fn a_partial_head_sent_byte_by_byte_is_closed_at_the_unauthenticated_timeout_on_the_api_port_and_the_gateway()
 {
    let unauthenticated = Duration::from_secs(1);
    let slack = Duration::from_secs(2);
    let service = ServiceProcess::start(&[
        ("HEADER_READ_TIMEOUT_MS", "30000".to_owned()),
        ("KEEP_ALIVE_TIMEOUT_MS", "30000".to_owned()),
        (
            "UNAUTHENTICATED_TIMEOUT_MS",
            unauthenticated.as_millis().to_string(),
        ),
        ("PROBE_LISTEN", "127.0.0.1:0".to_owned()),
        ("GATEWAY_LISTEN", "127.0.0.1:0".to_owned()),
    ]);
    let (api, probe) = (addr_of(&service.base), probe_addr(&service));
    let gateway = gateway_addr(&service);
    let head = b"GET /livez HTTP/1.1\r\nhost: a-very-long-host-name-that-never-ends.example";
    let connect = b"CONNECT example.com:443 HTTP/1.1\r\nhost: example.com:443\r\nx-padding: ";
    let ((api_closed, api_sent), (gateway_closed, gateway_sent)) = tokio::join!(
        trickle("127.0.0.2", &api, head),
        trickle("127.0.0.3", &gateway, connect)
    );
    for (port, closed, sent) in [
        ("api", api_closed, api_sent),
        ("gateway", gateway_closed, gateway_sent),
    ] {
        assert!(
            closed >= unauthenticated && closed < unauthenticated + slack,
            "{port}: closed after {closed:?} and {sent} bytes"
        );
        assert!(sent >= 5, "{port}: {sent} bytes");
        let series =
            format!(r#"pa_connection_timeouts_total{{listener="{port}",kind="unauthenticated"}}"#);
        assert_eq!(await_metric(&probe, &series, 1.0).await, 1.0, "{port}");
    }
}
