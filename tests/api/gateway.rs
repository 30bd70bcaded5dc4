//! The forward-proxy gateway (`GATEWAY_LISTEN`) with real clients (curl, and raw proxy
//! requests where the exact answer matters) through real local upstream proxies
//! (`proxies.rs`) to local targets: picking, the user-name grammar, auth, outcomes,
//! retries, bans, and each client address's share of the gateway's connections.

use std::net::SocketAddr;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::{Backend, TestApp, backend_config};
use crate::proxies::{HttpProxy, Server, TestCa, closed_port, socks4, socks5, target};

/// The worker token, which is the gateway's proxy password.
pub(crate) const TOKEN: &str = "gateway-test-token";

/// `user:s3cret` as a Basic credential: what the members' proxies require.
pub(crate) const MEMBER_BASIC: &str = "Basic dXNlcjpzM2NyZXQ=";

/// The page `/health` of the target answers.
pub(crate) const HEALTHY: &str = "<title>target</title> all is well";

pub(crate) async fn spawn_on(
    backend: Backend,
    tune: impl FnOnce(&mut proxy_allocator::config::Config),
) -> TestApp {
    let mut config = backend_config(backend);
    config.worker_token = Some(TOKEN.to_owned());
    config.gateway_listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
    tune(&mut config);
    TestApp::spawn_with(config).await
}

pub(crate) async fn spawn() -> TestApp {
    spawn_on(Backend::Embedded, |_| {}).await
}

pub(crate) fn gateway(app: &TestApp) -> SocketAddr {
    app.gateway.expect("the gateway listens")
}

/// A pool whose members may be loopback proxies of every kind.
pub(crate) async fn proxy_pool(app: &TestApp, pool: &str) {
    app.create_pool(
        pool,
        json!({"rules": {"allow_private": true,
                         "schemes": ["http", "https", "socks4", "socks5", "socks5h"]}}),
    )
    .await;
}

pub(crate) async fn http_proxy() -> Server {
    HttpProxy {
        authorization: Some(MEMBER_BASIC),
        ..HttpProxy::default()
    }
    .start()
    .await
}

pub(crate) fn member(scheme: &str, server: &Server) -> String {
    format!("{scheme}://user:s3cret@127.0.0.1:{}", server.port())
}

/// curl through the gateway as `user` with the worker token; its exit code and output.
pub(crate) async fn curl(app: &TestApp, user: &str, args: &[&str]) -> (i32, String) {
    let output = tokio::process::Command::new("curl")
        .args(["--silent", "--show-error", "--max-time", "20", "--proxy"])
        .arg(format!("http://{}", gateway(app)))
        .arg("--proxy-user")
        .arg(format!("{user}:{TOKEN}"))
        .args(args)
        .output()
        .await
        .expect("curl runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
    )
}

/// A proxy request written by hand (`CONNECT host:port` or an absolute-form GET) with
/// `authorization` as `Proxy-Authorization`; the answer's status, lower-cased head and
/// body as far as the gateway sends one.
pub(crate) async fn raw(
    app: &TestApp,
    line: &str,
    authorization: Option<String>,
) -> (u16, String, String) {
    let mut stream = TcpStream::connect(gateway(app)).await.expect("connected");
    let mut request = format!("{line}\r\nHost: x\r\n");
    if let Some(value) = authorization {
        request.push_str(&format!("Proxy-Authorization: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await.expect("sent");
    let mut answer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).await.expect("read");
        answer.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&answer).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(str::to_owned)
                })
                .and_then(|n| n.parse::<usize>().ok())
                .unwrap_or(0);
            if n == 0 || body.len() >= length {
                let status = head[9..12].parse().expect("a status");
                return (status, head.to_ascii_lowercase(), body.to_owned());
            }
        }
        assert!(n > 0, "the gateway closed before answering: {text:?}");
    }
}

pub(crate) fn basic(user: &str, password: &str) -> Option<String> {
    use base64::Engine;
    Some(format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    ))
}

/// Each member's `(id, assignments, consecutive_failures)`, sorted by id.
pub(crate) async fn health(app: &TestApp, pool: &str) -> Vec<(String, u64, u64)> {
    let mut members: Vec<(String, u64, u64)> = app
        .members(pool)
        .await
        .iter()
        .map(|m| {
            (
                m["member"].as_str().expect("member").to_owned(),
                m["assignments"].as_u64().expect("assignments"),
                m["consecutive_failures"].as_u64().expect("failures"),
            )
        })
        .collect();
    members.sort();
    members
}

pub(crate) fn error(code: &str, message: &str) -> Value {
    json!({"error": {"code": code, "message": message}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnels_follow_least_used_and_carry_the_members_own_credentials() {
    for backend in [Backend::Embedded, Backend::Redis] {
        let app = spawn_on(backend, |_| {}).await;
        let site = target(None).await;
        let (first, second) = (http_proxy().await, http_proxy().await);
        proxy_pool(&app, "web").await;
        app.seed("web", &[&member("http", &first)], Some(0)).await;
        app.seed("web", &[&member("http", &second)], Some(2)).await;
        let url = format!("http://127.0.0.1:{}/health", site.port());
        let connect = format!(
            "CONNECT 127.0.0.1:{} HTTP/1.1 | {MEMBER_BASIC}",
            site.port()
        );
        for round in 1..=2 {
            let answer = curl(&app, "web", &["--proxytunnel", &url]).await;
            assert_eq!(answer, (0, HEALTHY.to_owned()), "{backend:?}");
            assert_eq!(first.seen(), vec![connect.clone(); round], "{backend:?}");
            assert_eq!(second.seen(), Vec::<String>::new(), "{backend:?}");
        }
        for _ in 0..2 {
            let answer = curl(&app, "web", &["--proxytunnel", &url]).await;
            assert_eq!(answer, (0, HEALTHY.to_owned()), "{backend:?}");
        }
        assert_eq!(first.seen(), vec![connect.clone(); 3], "{backend:?}");
        assert_eq!(second.seen(), vec![connect.clone(); 1], "{backend:?}");
        let mut expected = vec![
            (member("http", &first), 3, 0),
            (member("http", &second), 3, 0),
        ];
        expected.sort();
        assert_eq!(health(&app, "web").await, expected, "{backend:?}");
        app.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_requests_go_through_http_and_socks5_members_with_their_credentials() {
    let app = spawn().await;
    let site = target(None).await;
    let proxy = http_proxy().await;
    let socks = socks5(Some(("user", "s3cret"))).await;
    proxy_pool(&app, "http").await;
    app.seed("http", &[&member("http", &proxy)], None).await;
    proxy_pool(&app, "socks").await;
    app.seed("socks", &[&member("socks5", &socks)], None).await;
    let url = format!("http://127.0.0.1:{}/health", site.port());

    assert_eq!(curl(&app, "http", &[&url]).await, (0, HEALTHY.to_owned()));
    assert_eq!(
        proxy.seen(),
        vec![format!("GET {url} HTTP/1.1 | {MEMBER_BASIC}")],
        "absolute form, the member's credentials and never the client's"
    );
    assert_eq!(curl(&app, "socks", &[&url]).await, (0, HEALTHY.to_owned()));
    assert_eq!(
        curl(&app, "socks", &["--proxytunnel", &url]).await,
        (0, HEALTHY.to_owned())
    );
    let through = format!("socks5 ip 127.0.0.1:{}", site.port());
    assert_eq!(socks.seen(), vec![through.clone(), through]);
    let seen = site.seen();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(
        seen.iter()
            .all(|line| line.starts_with("GET /health HTTP/1.1 | curl/")),
        "the target sees the client's requests in origin form: {seen:?}"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_reads_proxy_authorization_only_capitalised_gets_the_credentials() {
    let app = spawn().await;
    let site = target(None).await;
    let proxy = HttpProxy {
        authorization: Some(MEMBER_BASIC),
        case_sensitive: true,
        ..HttpProxy::default()
    }
    .start()
    .await;
    proxy_pool(&app, "strict").await;
    app.seed("strict", &[&member("http", &proxy)], None).await;
    let url = format!("http://127.0.0.1:{}/health", site.port());
    assert_eq!(curl(&app, "strict", &[&url]).await, (0, HEALTHY.to_owned()));
    assert_eq!(
        curl(&app, "strict", &["--proxytunnel", &url]).await,
        (0, HEALTHY.to_owned())
    );
    assert_eq!(
        proxy.seen(),
        vec![
            format!("GET {url} HTTP/1.1 | {MEMBER_BASIC}"),
            format!(
                "CONNECT 127.0.0.1:{} HTTP/1.1 | {MEMBER_BASIC}",
                site.port()
            ),
        ]
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_label_in_the_user_name_selects_the_members_carrying_it() {
    let app = spawn().await;
    let site = target(None).await;
    let (de, fr) = (http_proxy().await, http_proxy().await);
    proxy_pool(&app, "web").await;
    let (status, body) = app
        .post_json(
            "/pools/web/members",
            json!({"members": [
                {"member": member("http", &de), "labels": {"country": "de"}},
                {"member": member("http", &fr), "labels": {"country": "fr"}},
            ], "assignments": 0}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let url = format!("http://127.0.0.1:{}/health", site.port());
    for _ in 0..3 {
        assert_eq!(
            curl(&app, "web-country-fr", &[&url]).await,
            (0, HEALTHY.to_owned())
        );
    }
    assert_eq!(fr.seen().len(), 3);
    assert_eq!(de.seen(), Vec::<String>::new());
    let (status, head, body) = raw(
        &app,
        &format!("GET {url} HTTP/1.1"),
        basic("web-country-us", TOKEN),
    )
    .await;
    assert_eq!(status, 503, "{head}");
    assert!(
        head.contains("\r\nx-proxy-allocator: no-eligible-proxy"),
        "{head}"
    );
    assert_eq!(
        serde_json::from_str::<Value>(&body).expect("JSON"),
        error(
            "no_eligible_proxy",
            "the pool has no eligible member for this request"
        )
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_id_holding_a_dash_is_written_with_two() {
    let app = spawn().await;
    let site = target(None).await;
    let proxy = http_proxy().await;
    proxy_pool(&app, "eu-web").await;
    app.seed("eu-web", &[&member("http", &proxy)], None).await;
    let url = format!("http://127.0.0.1:{}/health", site.port());
    assert_eq!(
        curl(&app, "eu--web", &[&url]).await,
        (0, HEALTHY.to_owned())
    );
    assert_eq!(proxy.seen().len(), 1);
    let (status, _, body) = raw(&app, &format!("GET {url} HTTP/1.1"), basic("eu-web", TOKEN)).await;
    assert_eq!(status, 400, "eu-web is pool eu with a key and no value");
    assert!(body.contains("come in pairs"), "{body}");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_or_missing_token_is_answered_407_with_proxy_authenticate() {
    let app = spawn().await;
    let proxy = http_proxy().await;
    proxy_pool(&app, "web").await;
    app.seed("web", &[&member("http", &proxy)], None).await;
    for authorization in [
        None,
        basic("web", "wrong"),
        basic("web", ""),
        Some("Bearer x".to_owned()),
    ] {
        for line in [
            "CONNECT 127.0.0.1:443 HTTP/1.1",
            "GET http://127.0.0.1/ HTTP/1.1",
        ] {
            let (status, head, body) = raw(&app, line, authorization.clone()).await;
            assert_eq!(status, 407, "{line} {authorization:?}");
            assert!(
                head.contains("\r\nproxy-authenticate: basic realm=\"proxy-allocator\""),
                "{head}"
            );
            assert_eq!(
                serde_json::from_str::<Value>(&body).expect("JSON"),
                error(
                    "proxy_auth_required",
                    "proxy authentication required: the pool as user name, the worker token as password"
                )
            );
        }
    }
    assert_eq!(proxy.seen(), Vec::<String>::new(), "nothing was dialled");
    assert_eq!(health(&app, "web").await[0].1, 0, "nothing was assigned");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_with_nothing_eligible_answers_503_with_retry_after_the_marker_and_a_metric() {
    let app = spawn().await;
    proxy_pool(&app, "gw-empty").await;
    for line in [
        "CONNECT 127.0.0.1:443 HTTP/1.1",
        "GET http://127.0.0.1/ HTTP/1.1",
    ] {
        let (status, head, body) = raw(&app, line, basic("gw--empty", TOKEN)).await;
        assert_eq!(status, 503, "{line}");
        assert!(head.contains("\r\nretry-after: 1\r\n"), "{head}");
        assert!(
            head.contains("\r\nx-proxy-allocator: no-eligible-proxy\r\n"),
            "{head}"
        );
        assert_eq!(
            serde_json::from_str::<Value>(&body).expect("JSON"),
            error(
                "no_eligible_proxy",
                "the pool has no eligible member for this request"
            )
        );
    }
    let metrics = app
        .anonymous(reqwest::Method::GET, "/metrics")
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains(
            "pa_gateway_requests_total{listener=\"http\",pool=\"gw-empty\",outcome=\"no_eligible_proxy\"} 2\n"
        ),
        "{metrics}"
    );
    let (status, _, body) = raw(
        &app,
        "GET http://127.0.0.1/ HTTP/1.1",
        basic("gw--none", TOKEN),
    )
    .await;
    assert_eq!(
        (status, body),
        (404, error("pool_not_found", "pool not found").to_string())
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_is_not_a_proxy_address_is_answered_502_and_never_dialled() {
    let app = spawn().await;
    proxy_pool(&app, "names").await;
    app.seed("names", &["dc-fra-07"], None).await;
    let (status, head, body) = raw(
        &app,
        "CONNECT 127.0.0.1:443 HTTP/1.1",
        basic("names", TOKEN),
    )
    .await;
    assert_eq!(status, 502, "{head}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).expect("JSON"),
        error(
            "member_not_a_proxy",
            "the pool's member is not a proxy address the gateway can dial"
        )
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_on_a_private_address_is_not_dialled_unless_the_pool_allows_it() {
    let app = spawn().await;
    let proxy = http_proxy().await;
    proxy_pool(&app, "web").await;
    app.seed("web", &[&member("http", &proxy)], None).await;
    app.configure("web", &json!({"rules": {"allow_private": false}}))
        .await;
    let (status, _, body) = raw(&app, "CONNECT 127.0.0.1:443 HTTP/1.1", basic("web", TOKEN)).await;
    assert_eq!(status, 502);
    assert_eq!(
        serde_json::from_str::<Value>(&body).expect("JSON"),
        error(
            "private_address",
            "the pool's member has a non-public address and the pool does not allow private addresses"
        )
    );
    assert_eq!(proxy.seen(), Vec::<String>::new());
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_worker_token_the_gateway_starts_only_on_loopback() {
    let mut config = backend_config(Backend::Embedded);
    config.worker_token = None;
    config.gateway_listen = Some(SocketAddr::from(([0, 0, 0, 0], 0)));
    let store = proxy_allocator::startup::store(&config)
        .await
        .expect("a store");
    let refused = proxy_allocator::startup::Application::with_store(config, store).await;
    let error = refused.err().expect("refused").to_string();
    assert!(
        error.starts_with("refusing to start: GATEWAY_LISTEN 0.0.0.0:0 is not a loopback address"),
        "{error}"
    );

    let app = spawn_on(Backend::Embedded, |config| config.worker_token = None).await;
    let site = target(None).await;
    let proxy = http_proxy().await;
    proxy_pool(&app, "web").await;
    app.seed("web", &[&member("http", &proxy)], None).await;
    let url = format!("http://127.0.0.1:{}/health", site.port());
    let (status, _, body) = raw(
        &app,
        &format!("GET {url} HTTP/1.1"),
        basic("web", "anything"),
    )
    .await;
    assert_eq!((status, body.as_str()), (200, HEALTHY));
    let (status, _, _) = raw(&app, &format!("GET {url} HTTP/1.1"), None).await;
    assert_eq!(status, 407, "a user name still names the pool");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_member_is_reported_failed_and_the_next_pick_carries_the_request() {
    let app = spawn().await;
    let site = target(None).await;
    let live = http_proxy().await;
    let dead = format!("http://127.0.0.1:{}", closed_port());
    proxy_pool(&app, "web").await;
    // Equal counts: the dead member's id sorts first, so it is picked first each time, and
    // its failed attempt's assignment makes the live one the next pick.
    app.seed("web", &[&dead, &member("http", &live)], Some(0))
        .await;
    let url = format!("http://127.0.0.1:{}/health", site.port());
    assert_eq!(
        curl(&app, "web", &["--proxytunnel", &url]).await,
        (0, HEALTHY.to_owned())
    );
    assert_eq!(curl(&app, "web", &[&url]).await, (0, HEALTHY.to_owned()));
    assert_eq!(live.seen().len(), 2);
    let mut expected = vec![(dead.clone(), 2, 2), (member("http", &live), 2, 0)];
    expected.sort();
    assert_eq!(
        health(&app, "web").await,
        expected,
        "each attempt an assignment, each failure a report"
    );
    app.stop().await;
}

/// Dead members (closed ports) seeded into `web`, one per count, in that order.
pub(crate) async fn dead_members(app: &TestApp, counts: &[u64]) -> Vec<String> {
    proxy_pool(app, "web").await;
    let mut dead = Vec::new();
    for count in counts {
        let id = format!("http://127.0.0.1:{}", closed_port());
        app.seed("web", &[&id], Some(*count)).await;
        dead.push(id);
    }
    dead
}

/// A CONNECT through `web` that must fail: the 502's marker and its body, which says how
/// many members were tried.
pub(crate) async fn connect_fails_after(app: &TestApp, tried: usize) {
    let (status, head, body) =
        raw(app, "CONNECT 127.0.0.1:443 HTTP/1.1", basic("web", TOKEN)).await;
    assert_eq!(status, 502, "{head}");
    assert!(
        head.contains("\r\nx-proxy-allocator: upstream-failed\r\n"),
        "{head}"
    );
    assert_eq!(
        serde_json::from_str::<Value>(&body).expect("JSON"),
        error(
            "upstream_failed",
            &format!("{tried} member(s) tried, none could be reached")
        )
    );
}

/// `(id, assignments, consecutive_failures)` of each of `members`, sorted by id.
pub(crate) fn sorted(members: &[String], counts: &[(u64, u64)]) -> Vec<(String, u64, u64)> {
    let mut expected: Vec<(String, u64, u64)> = members
        .iter()
        .zip(counts)
        .map(|(id, (assignments, failures))| (id.clone(), *assignments, *failures))
        .collect();
    expected.sort();
    expected
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_stop_at_gateway_attempts_with_a_502() {
    let app = spawn_on(Backend::Embedded, |config| config.gateway_attempts = 2).await;
    let dead = dead_members(&app, &[0, 5, 10]).await;
    connect_fails_after(&app, 2).await;
    // The first stays the least used after its failed attempt, yet the retry moves on to
    // the next member: each attempt excludes the members tried before it.
    assert_eq!(
        health(&app, "web").await,
        sorted(&dead, &[(1, 1), (6, 1), (10, 0)])
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_member_at_the_lowest_count_is_tried_once_and_a_live_one_serves_on_every_store() {
    for backend in [Backend::Redis, Backend::Embedded, Backend::Durable] {
        let app = spawn_on(backend, |_| {}).await;
        let site = target(None).await;
        let live = http_proxy().await;
        let dead = format!("http://127.0.0.1:{}", closed_port());
        proxy_pool(&app, "flaky").await;
        app.seed("flaky", &[&dead], Some(0)).await;
        app.seed("flaky", &[&member("http", &live)], Some(5)).await;
        let url = format!("http://127.0.0.1:{}/health", site.port());
        assert_eq!(
            curl(&app, "flaky", &[&url]).await,
            (0, HEALTHY.to_owned()),
            "{backend:?}"
        );
        let mut expected = vec![(dead.clone(), 1, 1), (member("http", &live), 6, 0)];
        expected.sort();
        assert_eq!(health(&app, "flaky").await, expected, "{backend:?}");
        app.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_dead_members_and_three_attempts_try_each_once_then_answer_502() {
    let app = spawn_on(Backend::Redis, |config| config.gateway_attempts = 3).await;
    let dead = dead_members(&app, &[0, 1, 2]).await;
    connect_fails_after(&app, 3).await;
    assert_eq!(
        health(&app, "web").await,
        sorted(&dead, &[(1, 1), (2, 1), (3, 1)])
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_stop_early_when_only_members_already_tried_remain() {
    let app = spawn_on(Backend::Embedded, |config| config.gateway_attempts = 5).await;
    let dead = dead_members(&app, &[0, 0]).await;
    connect_fails_after(&app, 2).await;
    assert_eq!(health(&app, "web").await, sorted(&dead, &[(1, 1), (1, 1)]));
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_from_the_target_bans_that_member_for_that_target_only() {
    let app = spawn().await;
    let site = target(None).await;
    let (first, second) = (http_proxy().await, http_proxy().await);
    proxy_pool(&app, "web").await;
    app.seed("web", &[&member("http", &first)], Some(0)).await;
    app.seed("web", &[&member("http", &second)], Some(10)).await;
    let port = site.port();
    let limited = format!("http://127.0.0.1:{port}/limited");
    let (status, _, body) = raw(
        &app,
        &format!("GET {limited} HTTP/1.1"),
        basic("web", TOKEN),
    )
    .await;
    assert_eq!(
        (status, body.as_str()),
        (429, "slow down"),
        "the target's own answer"
    );
    assert_eq!(first.seen().len(), 1);
    // Banned for 127.0.0.1: the next request there goes to the other member although the
    // first is still the least used.
    let health_url = format!("http://127.0.0.1:{port}/health");
    assert_eq!(
        curl(&app, "web", &[&health_url]).await,
        (0, HEALTHY.to_owned())
    );
    assert_eq!((first.seen().len(), second.seen().len()), (1, 1));
    // Another target is not affected.
    let elsewhere = format!("http://localhost:{port}/health");
    assert_eq!(
        curl(&app, "web", &[&elsewhere]).await,
        (0, HEALTHY.to_owned())
    );
    assert_eq!((first.seen().len(), second.seen().len()), (2, 1));
    let (_, listing) = app.get("/pools/web/members?target=127.0.0.1").await;
    let banned: Vec<(String, bool)> = listing["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| {
            (
                m["member"].as_str().expect("id").to_owned(),
                !m["banned_until"].is_null(),
            )
        })
        .collect();
    let mut expected = vec![
        (member("http", &first), true),
        (member("http", &second), false),
    ];
    expected.sort();
    let mut banned = banned;
    banned.sort();
    assert_eq!(banned, expected);
    app.stop().await;
}

/// Opens a tunnel by hand; the status of the answer and, on 200, the open stream.
async fn open_tunnel(gateway: SocketAddr, user: &str, to: &str) -> (u16, Option<TcpStream>) {
    open_tunnel_from("127.0.0.1", gateway, user, to).await
}

/// A connection from the loopback address `source` (127.0.0.2, ...): one test, several
/// clients.
async fn connect_from(source: &str, to: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket
        .bind(format!("{source}:0").parse().expect("an address"))
        .expect("bound to the source address");
    socket.connect(to).await.expect("connected")
}

/// [`open_tunnel`] from the loopback address `source`; the status is 0 when the gateway
/// closed the connection without an answer.
async fn open_tunnel_from(
    source: &str,
    gateway: SocketAddr,
    user: &str,
    to: &str,
) -> (u16, Option<TcpStream>) {
    let mut stream = connect_from(source, gateway).await;
    let authorization = basic(user, TOKEN).expect("a credential");
    let request = format!(
        "CONNECT {to} HTTP/1.1\r\nHost: {to}\r\nProxy-Authorization: {authorization}\r\n\r\n"
    );
    // A connection refused at once may be gone before the request is written.
    let _ = stream.write_all(request.as_bytes()).await;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            _ if head.is_empty() => return (0, None),
            other => panic!("closed before the head ended ({other:?}): {head:?}"),
        }
    }
    let status: u16 = String::from_utf8_lossy(&head[9..12])
        .parse()
        .expect("a status");
    (status, (status == 200).then_some(stream))
}

/// A request for `/health` through an open tunnel to the plain-HTTP target, and its body.
async fn health_through(stream: &mut TcpStream) -> String {
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: target\r\n\r\n")
        .await
        .expect("sent");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.expect("read");
    let text = String::from_utf8_lossy(&answer).into_owned();
    text.split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or(text)
}

/// The pool's `(in_flight, abandoned)` stats.
async fn leases(app: &TestApp, pool: &str) -> (u64, u64) {
    let (_, info) = app.get(&format!("/pools/{pool}")).await;
    (
        info["stats"]["in_flight"].as_u64().expect("in_flight"),
        info["stats"]["abandoned"].as_u64().expect("abandoned"),
    )
}

/// Waits until the pool's stats are `expected` (the releases of closed tunnels are on their
/// way), at most 10 s.
async fn leases_become(app: &TestApp, pool: &str, expected: (u64, u64)) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while leases(app, pool).await != expected {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            leases(app, pool).await
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_in_flight_1_holds_with_50_concurrent_tunnels_and_closing_one_frees_its_member() {
    for backend in [Backend::Embedded, Backend::Redis] {
        let app = spawn_on(backend, |_| {}).await;
        let site = target(None).await;
        // One proxy server; five members that reach it with credentials of their own, so its
        // record says which member each tunnel went through.
        let proxy = HttpProxy::default().start().await;
        app.create_pool(
            "busy",
            json!({"policy": "least-in-flight", "max_in_flight": 1,
                   "rules": {"allow_private": true}}),
        )
        .await;
        let members: Vec<String> = (0..5)
            .map(|i| format!("http://u{i}:p@127.0.0.1:{}", proxy.port()))
            .collect();
        let ids: Vec<&str> = members.iter().map(String::as_str).collect();
        app.seed("busy", &ids, None).await;
        let to = format!("127.0.0.1:{}", site.port());
        let gateway = gateway(&app);
        let opened =
            futures_util::future::join_all((0..50).map(|_| open_tunnel(gateway, "busy", &to)))
                .await;
        let mut statuses: Vec<u16> = opened.iter().map(|(status, _)| *status).collect();
        statuses.sort_unstable();
        let mut expected = vec![200; 5];
        expected.extend(vec![503; 45]);
        assert_eq!(statuses, expected, "{backend:?}");
        let mut seen = proxy.seen();
        seen.sort();
        let mut each: Vec<String> = (0..5)
            .map(|i| {
                use base64::Engine;
                let credential =
                    base64::engine::general_purpose::STANDARD.encode(format!("u{i}:p"));
                format!("CONNECT {to} HTTP/1.1 | Basic {credential}")
            })
            .collect();
        each.sort();
        assert_eq!(seen, each, "one tunnel per member: {backend:?}");
        assert_eq!(leases(&app, "busy").await, (5, 0), "{backend:?}");

        let mut tunnels: Vec<TcpStream> = opened.into_iter().filter_map(|(_, s)| s).collect();
        let mut first = tunnels.pop().expect("a tunnel");
        assert_eq!(health_through(&mut first).await, HEALTHY, "{backend:?}");
        drop(first);
        leases_become(&app, "busy", (4, 0)).await;
        let (status, again) = open_tunnel(gateway, "busy", &to).await;
        assert_eq!(
            status, 200,
            "the freed member takes a tunnel again: {backend:?}"
        );
        let (status, _) = open_tunnel(gateway, "busy", &to).await;
        assert_eq!(status, 503, "{backend:?}");
        drop(again);
        drop(tunnels);
        leases_become(&app, "busy", (0, 0)).await;
        app.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_tunnel_keeps_its_lease_past_its_ttl_and_gives_it_back_when_it_closes() {
    let app = spawn().await;
    let site = target(None).await;
    let proxy = HttpProxy::default().start().await;
    app.create_pool(
        "busy",
        json!({"policy": "least-in-flight", "rules": {"allow_private": true}}),
    )
    .await;
    app.seed(
        "busy",
        &[&format!("http://127.0.0.1:{}", proxy.port())],
        None,
    )
    .await;
    let to = format!("127.0.0.1:{}", site.port());
    // A lease of 1.5 s, renewed every 500 ms while the tunnel is open; the sweep runs every
    // 100 ms and would reclaim it as abandoned once it expired.
    let (status, tunnel) = open_tunnel(gateway(&app), "busy-ttl-1500", &to).await;
    assert_eq!(status, 200);
    let mut tunnel = tunnel.expect("open");
    tokio::time::sleep(std::time::Duration::from_millis(4_500)).await;
    assert_eq!(
        leases(&app, "busy").await,
        (1, 0),
        "still held, never reclaimed"
    );
    assert_eq!(health_through(&mut tunnel).await, HEALTHY);
    drop(tunnel);
    leases_become(&app, "busy", (0, 0)).await;
    app.stop().await;
}

/// A service process whose gateway port `listen` (`GATEWAY_LISTEN` or
/// `GATEWAY_SOCKS_LISTEN`) serves a least-in-flight pool `web` of one member, `proxy`,
/// and whose drain on SIGTERM lasts 1.5 s, logging the gateway's lines; and that port.
pub(crate) async fn draining_service(
    listen: &str,
    proxy: &Server,
) -> (crate::process::ServiceProcess, SocketAddr) {
    let port = closed_port();
    let service = crate::process::ServiceProcess::start(&[
        ("WORKER_TOKEN", TOKEN.to_owned()),
        (listen, format!("127.0.0.1:{port}")),
        ("SHUTDOWN_TIMEOUT_MS", "1500".to_owned()),
        (
            "RUST_LOG",
            "warn,proxy_allocator::startup=info,proxy_allocator::gateway=info".to_owned(),
        ),
    ]);
    let client = reqwest::Client::new();
    let admin = |method, path: &str| {
        client
            .request(method, format!("{}{path}", service.base))
            .bearer_auth(crate::helpers::ADMIN)
    };
    let created = admin(reqwest::Method::PUT, "/pools/web")
        .json(&json!({"policy": "least-in-flight", "rules": {"allow_private": true}}))
        .send()
        .await
        .expect("created");
    assert_eq!(created.status(), 201);
    let seeded = admin(reqwest::Method::POST, "/pools/web/members")
        .json(&json!({"members": [member("http", proxy)]}))
        .send()
        .await
        .expect("seeded");
    assert_eq!(seeded.status(), 200);
    (service, SocketAddr::from(([127, 0, 0, 1], port)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_open_tunnels_finish_and_closes_those_left_at_the_drain_timeout() {
    let site = target(None).await;
    let proxy = http_proxy().await;
    let (mut service, gateway) = draining_service("GATEWAY_LISTEN", &proxy).await;
    let to = format!("127.0.0.1:{}", site.port());
    let (status, busy) = open_tunnel(gateway, "web", &to).await;
    assert_eq!(status, 200);
    let (status, idle) = open_tunnel(gateway, "web", &to).await;
    assert_eq!(status, 200);
    let (mut busy, mut idle) = (busy.expect("open"), idle.expect("open"));

    service.terminate();
    service.wait_lines("shutting down", 1);
    assert_eq!(
        health_through(&mut busy).await,
        HEALTHY,
        "a tunnel open at SIGTERM keeps working while the service drains"
    );
    drop(busy);
    let mut rest = Vec::new();
    let read = idle.read_to_end(&mut rest).await.map(|_| rest.len());
    assert!(
        matches!(read, Ok(0) | Err(_)),
        "closed at the drain timeout: {read:?}"
    );
    assert!(
        service
            .wait_exit(std::time::Duration::from_secs(10))
            .is_some(),
        "the service exits once the drain ends"
    );
    let warned = service.wait_lines("drain timeout reached", 1);
    assert_eq!(warned.len(), 1, "{:?}", service.all_lines());
    // One line per tunnel, with its bytes each way, and never the member's password.
    let mut closed: Vec<(String, String, u64, u64)> = service
        .wait_lines("gateway tunnel closed", 2)
        .iter()
        .map(|line| {
            let line: Value = serde_json::from_str(line).expect("a JSON line");
            assert!(line["duration_ms"].is_u64(), "{line}");
            (
                line["proxy"].as_str().expect("proxy").to_owned(),
                line["ended"].as_str().expect("ended").to_owned(),
                line["sent"].as_u64().expect("sent"),
                line["received"].as_u64().expect("received"),
            )
        })
        .collect();
    closed.sort();
    let masked = format!("http://***@127.0.0.1:{}", proxy.port());
    let answer = format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{HEALTHY}",
        HEALTHY.len()
    );
    let request = "GET /health HTTP/1.1\r\nHost: target\r\n\r\n";
    assert_eq!(
        closed,
        vec![
            (
                masked.clone(),
                "closed".to_owned(),
                request.len() as u64,
                answer.len() as u64
            ),
            (masked, "shutdown".to_owned(), 0, 0),
        ]
    );
    assert!(
        service
            .all_lines()
            .iter()
            .all(|line| !line.contains("s3cret")),
        "credentials never reach the log"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_max_connections_caps_the_open_tunnels() {
    let app = spawn_on(Backend::Embedded, |config| {
        config.gateway_max_connections = Some(2);
        // One address opens them all: this is about the cap, not a client's share of it.
        config.gateway_max_connections_per_client = Some(2);
    })
    .await;
    let site = target(None).await;
    let proxy = HttpProxy::default().start().await;
    proxy_pool(&app, "web").await;
    app.seed(
        "web",
        &[&format!("http://127.0.0.1:{}", proxy.port())],
        None,
    )
    .await;
    let to = format!("127.0.0.1:{}", site.port());
    let gateway = gateway(&app);
    let (first, one) = open_tunnel(gateway, "web", &to).await;
    let (second, two) = open_tunnel(gateway, "web", &to).await;
    assert_eq!((first, second), (200, 200));
    // The third connection is closed at once (with the API's 503 when its request had
    // already arrived), never dialled.
    let mut third = TcpStream::connect(gateway).await.expect("connected");
    let authorization = basic("web", TOKEN).expect("a credential");
    let _ = third
        .write_all(
            format!("CONNECT {to} HTTP/1.1\r\nProxy-Authorization: {authorization}\r\n\r\n")
                .as_bytes(),
        )
        .await;
    let mut answer = Vec::new();
    let _ = third.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 503 "),
        "{answer}"
    );
    assert_eq!(proxy.seen().len(), 2);
    drop(one);
    // The closed tunnel's place is free once its task has ended.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let mut probe = TcpStream::connect(gateway).await.expect("connected");
        let _ = probe
            .write_all(
                format!("CONNECT {to} HTTP/1.1\r\nProxy-Authorization: {authorization}\r\n\r\n")
                    .as_bytes(),
            )
            .await;
        let mut head = [0u8; 12];
        if probe.read_exact(&mut head).await.is_ok() && &head == b"HTTP/1.1 200" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the place never came back"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    drop(two);
    app.stop().await;
}

/// A file holding `ca`'s certificate, removed when dropped.
pub(crate) struct CaFile(pub(crate) std::path::PathBuf);

impl CaFile {
    pub(crate) fn new(ca: &TestCa) -> Self {
        let path =
            std::env::temp_dir().join(format!("gateway-ca-{:016x}.pem", rand::random::<u64>()));
        std::fs::write(&path, ca.pem()).expect("written");
        Self(path)
    }
}

impl Drop for CaFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_socks4_and_socks5h_members_are_dialled_by_their_scheme() {
    let ca = TestCa::new();
    let ca_file = CaFile::new(&ca);
    let trusted = ca_file.0.clone();
    let app = spawn_on(Backend::Embedded, move |config| {
        config.gateway_ca_file = Some(trusted)
    })
    .await;
    let site = target(None).await;
    let tls = HttpProxy {
        tls: Some(ca.acceptor(&["127.0.0.1"])),
        authorization: Some(MEMBER_BASIC),
        ..HttpProxy::default()
    }
    .start()
    .await;
    let four = socks4().await;
    let five = socks5(None).await;
    for (pool, id) in [
        ("tls", member("https", &tls)),
        ("four", format!("socks4://127.0.0.1:{}", four.port())),
        ("fiveh", format!("socks5h://127.0.0.1:{}", five.port())),
    ] {
        proxy_pool(&app, pool).await;
        app.seed(pool, &[&id], None).await;
    }
    let port = site.port();
    let url = format!("http://127.0.0.1:{port}/health");
    assert_eq!(
        curl(&app, "tls", &["--proxytunnel", &url]).await,
        (0, HEALTHY.to_owned())
    );
    assert_eq!(curl(&app, "tls", &[&url]).await, (0, HEALTHY.to_owned()));
    assert_eq!(
        tls.seen(),
        vec![
            format!("CONNECT 127.0.0.1:{port} HTTP/1.1 | {MEMBER_BASIC}"),
            format!("GET {url} HTTP/1.1 | {MEMBER_BASIC}"),
        ],
        "over TLS to the proxy, trusted through GATEWAY_CA_FILE"
    );
    assert_eq!(
        curl(&app, "four", &["--proxytunnel", &url]).await,
        (0, HEALTHY.to_owned())
    );
    assert_eq!(four.seen(), vec![format!("socks4 127.0.0.1:{port}")]);
    let by_name = format!("http://localhost:{port}/health");
    assert_eq!(
        curl(&app, "fiveh", &["--proxytunnel", &by_name]).await,
        (0, HEALTHY.to_owned())
    );
    assert_eq!(
        five.seen(),
        vec![format!("socks5 name localhost:{port}")],
        "socks5h leaves the name to the proxy"
    );
    app.stop().await;

    // Without the CA the proxy's certificate is refused: a failed attempt, reported.
    let app = spawn().await;
    proxy_pool(&app, "tls").await;
    app.seed("tls", &[&member("https", &tls)], None).await;
    let (status, _, body) = raw(
        &app,
        &format!("CONNECT 127.0.0.1:{port} HTTP/1.1"),
        basic("tls", TOKEN),
    )
    .await;
    assert_eq!(status, 502, "{body}");
    // Tried once: the pool's one member, excluded from the retries, leaves nothing to try.
    assert_eq!(
        health(&app, "tls").await,
        vec![(member("https", &tls), 1, 1)]
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_requests_reaches_http_and_https_targets_through_the_gateway() {
    let ca = TestCa::new();
    let ca_file = CaFile::new(&ca);
    let app = spawn().await;
    let secure = target(Some(ca.acceptor(&["127.0.0.1"]))).await;
    let plain = target(None).await;
    let proxy = http_proxy().await;
    proxy_pool(&app, "web").await;
    app.seed("web", &[&member("http", &proxy)], None).await;
    let script = r#"
import sys, requests
proxy, ca = sys.argv[1], sys.argv[2]
proxies = {"http": proxy, "https": proxy}
for url in sys.argv[3:]:
    answer = requests.get(url, proxies=proxies, verify=ca, timeout=20)
    print(answer.status_code, answer.text)
"#;
    let output = tokio::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(format!("http://web:{TOKEN}@{}", gateway(&app)))
        .arg(&ca_file.0)
        .arg(format!("https://127.0.0.1:{}/health", secure.port()))
        .arg(format!("http://127.0.0.1:{}/health", plain.port()))
        .output()
        .await
        .expect("python3 runs");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        format!("200 {HEALTHY}\n200 {HEALTHY}\n"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        proxy.seen(),
        vec![
            format!(
                "CONNECT 127.0.0.1:{} HTTP/1.1 | {MEMBER_BASIC}",
                secure.port()
            ),
            format!(
                "GET http://127.0.0.1:{}/health HTTP/1.1 | {MEMBER_BASIC}",
                plain.port()
            ),
        ]
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_proxy_refuses_its_credentials_is_reported_failed_not_passed_on() {
    let app = spawn().await;
    let site = target(None).await;
    let proxy = HttpProxy {
        authorization: Some("Basic b3RoZXI6Y3JlZGVudGlhbHM="),
        ..HttpProxy::default()
    }
    .start()
    .await;
    proxy_pool(&app, "web").await;
    app.seed("web", &[&member("http", &proxy)], None).await;
    let url = format!("http://127.0.0.1:{}/health", site.port());
    let (status, head, body) = raw(&app, &format!("GET {url} HTTP/1.1"), basic("web", TOKEN)).await;
    assert_eq!(status, 502, "{head}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).expect("JSON"),
        error(
            "upstream_failed",
            "1 member(s) tried, none could be reached"
        )
    );
    assert_eq!(
        health(&app, "web").await,
        vec![(member("http", &proxy), 1, 1)]
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_in_the_user_name_pins_one_upstream() {
    for backend in [Backend::Embedded, Backend::Redis] {
        let app = spawn_on(backend, |_| {}).await;
        let site = target(None).await;
        // One proxy server; three members reaching it with credentials of their own, so its
        // record says which member carried each request.
        let proxy = HttpProxy::default().start().await;
        proxy_pool(&app, "web").await;
        let members: Vec<String> = (0..3)
            .map(|i| format!("http://u{i}:p@127.0.0.1:{}", proxy.port()))
            .collect();
        let ids: Vec<&str> = members.iter().map(String::as_str).collect();
        app.seed("web", &ids, Some(0)).await;
        let url = format!("http://127.0.0.1:{}/health", site.port());
        for _ in 0..4 {
            assert_eq!(
                curl(&app, "web-session-abc", &[&url]).await,
                (0, HEALTHY.to_owned())
            );
        }
        for _ in 0..2 {
            let answer = curl(
                &app,
                "web-session-x--y-sessionttl-60000",
                &["--proxytunnel", &url],
            )
            .await;
            assert_eq!(answer, (0, HEALTHY.to_owned()));
        }
        let seen = proxy.seen();
        assert_eq!(seen.len(), 6, "{backend:?}");
        let credential = |line: &String| line.rsplit(" | ").next().unwrap_or_default().to_owned();
        let first = credential(&seen[0]);
        assert!(
            seen[..4].iter().all(|line| credential(line) == first),
            "{seen:?}"
        );
        let second = credential(&seen[4]);
        assert_eq!(credential(&seen[5]), second, "{seen:?}");
        assert_ne!(
            first, second,
            "the second session was pinned to a less-used member"
        );
        app.stop().await;
    }
}

/// An application whose gateway gives each client `share` of `cap` connections, with a
/// pool `web` whose one member is a local HTTP proxy, and the target behind it.
async fn shared_gateway(cap: u64, share: Option<u64>) -> (TestApp, Server, Server, String) {
    let app = spawn_on(Backend::Embedded, |config| {
        config.gateway_max_connections = Some(cap);
        config.gateway_max_connections_per_client = share;
        // Nothing times out while a test runs: every close it sees is a refusal.
        config.header_read_timeout_ms = 60_000;
        config.unauthenticated_timeout_ms = 60_000;
    })
    .await;
    let site = target(None).await;
    let proxy = HttpProxy::default().start().await;
    proxy_pool(&app, "web").await;
    app.seed(
        "web",
        &[&format!("http://127.0.0.1:{}", proxy.port())],
        None,
    )
    .await;
    let to = format!("127.0.0.1:{}", site.port());
    (app, site, proxy, to)
}

/// Whether the gateway closes `stream` (at once, the test allows 5 s) without a tunnel:
/// nothing, or a 503 in the error shape.
async fn refused(mut stream: TcpStream) -> bool {
    let mut answer = Vec::new();
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        stream.read_to_end(&mut answer),
    )
    .await;
    let answer = String::from_utf8_lossy(&answer);
    read.is_ok() && (answer.is_empty() || answer.starts_with("HTTP/1.1 503 "))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_holding_far_more_idle_connections_than_its_share_cannot_make_an_authenticated_connect_from_another_fail()
 {
    // No GATEWAY_MAX_CONNECTIONS_PER_CLIENT: a quarter of the cap, 10.
    let (app, _site, _proxy, to) = shared_gateway(40, None).await;
    let gateway = gateway(&app);
    let mut idle = Vec::new();
    for _ in 0..100 {
        idle.push(connect_from("127.0.0.2", gateway).await);
    }
    // Accepts follow the order of the connects: once one more is refused, all of these
    // have been accepted or refused.
    assert!(refused(connect_from("127.0.0.2", gateway).await).await);
    let mut held = Vec::new();
    for mut stream in idle {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(
            std::time::Duration::from_millis(200),
            stream.read(&mut byte),
        )
        .await;
        if read.is_err() {
            held.push(stream);
        }
    }
    assert_eq!(held.len(), 10, "the attacker holds its share and no more");
    for _ in 0..10 {
        let (status, tunnel) = open_tunnel_from("127.0.0.3", gateway, "web", &to).await;
        assert_eq!(status, 200);
        assert_eq!(health_through(&mut tunnel.expect("open")).await, HEALTHY);
    }
    drop(held);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authenticated_clients_open_tunnels_count_against_its_address_like_any_connection() {
    let (app, _site, _proxy, to) = shared_gateway(100, Some(3)).await;
    let gateway = gateway(&app);
    let mut tunnels = Vec::new();
    for _ in 0..3 {
        let (status, tunnel) = open_tunnel_from("127.0.0.4", gateway, "web", &to).await;
        assert_eq!(status, 200);
        tunnels.push(tunnel.expect("open"));
    }
    assert!(refused(connect_from("127.0.0.4", gateway).await).await);
    let (status, _) = open_tunnel_from("127.0.0.4", gateway, "web", &to).await;
    // Closed at once, never dialled: without an answer, or with the 503 when the request
    // had arrived by then.
    assert!(matches!(status, 0 | 503), "{status}");
    let (status, other) = open_tunnel_from("127.0.0.5", gateway, "web", &to).await;
    assert_eq!(
        status, 200,
        "another address is not held to this one's share"
    );
    // A tunnel that ends gives its place back once its task has ended.
    assert_eq!(
        health_through(&mut tunnels.pop().expect("a tunnel")).await,
        HEALTHY
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (status, tunnel) = open_tunnel_from("127.0.0.4", gateway, "web", &to).await;
        if status == 200 {
            tunnels.push(tunnel.expect("open"));
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the place never came back"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    drop((tunnels, other));
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unauthenticated_gateway_connection_is_closed_at_the_unauthenticated_timeout_and_an_authenticated_one_stays()
 {
    let unauthenticated = std::time::Duration::from_secs(1);
    let app = spawn_on(Backend::Embedded, |config| {
        config.header_read_timeout_ms = 30_000;
        config.keep_alive_timeout_ms = 30_000;
        config.unauthenticated_timeout_ms = 1_000;
    })
    .await;
    let site = target(None).await;
    let proxy = HttpProxy::default().start().await;
    proxy_pool(&app, "web").await;
    app.seed(
        "web",
        &[&format!("http://127.0.0.1:{}", proxy.port())],
        None,
    )
    .await;
    let to = format!("127.0.0.1:{}", site.port());
    let gateway = gateway(&app);
    let (status, tunnel) = open_tunnel(gateway, "web", &to).await;
    assert_eq!(status, 200);
    // A request without credentials is answered 407; the connection stays unauthenticated.
    let connecting = std::time::Instant::now();
    let mut anonymous = TcpStream::connect(gateway).await.expect("connected");
    anonymous
        .write_all(format!("CONNECT {to} HTTP/1.1\r\nHost: {to}\r\n\r\n").as_bytes())
        .await
        .expect("sent");
    let mut answer = Vec::new();
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        anonymous.read_to_end(&mut answer),
    )
    .await;
    let closed = connecting.elapsed();
    assert!(read.is_ok(), "closed");
    assert!(
        String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 407 "),
        "{answer:?}"
    );
    assert!(
        closed >= unauthenticated && closed < unauthenticated * 3,
        "closed after {closed:?}"
    );
    // The tunnel, opened before and so older than the timeout, still works.
    assert_eq!(health_through(&mut tunnel.expect("open")).await, HEALTHY);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_attempt_is_logged_with_the_kind_of_request_it_was() {
    use crate::process::ServiceProcess;
    let port = closed_port();
    let service = ServiceProcess::start(&[
        ("WORKER_TOKEN", TOKEN.to_owned()),
        ("GATEWAY_LISTEN", format!("127.0.0.1:{port}")),
        (
            "RUST_LOG",
            "warn,proxy_allocator::startup=info,proxy_allocator::gateway=info".to_owned(),
        ),
    ]);
    let client = reqwest::Client::new();
    let admin = |method, path: &str| {
        client
            .request(method, format!("{}{path}", service.base))
            .bearer_auth(crate::helpers::ADMIN)
    };
    let created = admin(reqwest::Method::PUT, "/pools/web")
        .json(&json!({"rules": {"allow_private": true}}))
        .send()
        .await
        .expect("created");
    assert_eq!(created.status(), 201);
    // Nothing listens on the member's port: every attempt fails before any answer.
    let dead = format!("http://127.0.0.1:{}", closed_port());
    let seeded = admin(reqwest::Method::POST, "/pools/web/members")
        .json(&json!({"members": [dead]}))
        .send()
        .await
        .expect("seeded");
    assert_eq!(seeded.status(), 200);
    let target = closed_port();
    for url in [
        format!("http://127.0.0.1:{target}/"),
        format!("https://127.0.0.1:{target}/"),
    ] {
        // The answer (a 502 for the forward, a refused CONNECT) is not what is checked here.
        tokio::process::Command::new("curl")
            .args(["--silent", "--max-time", "20", "--proxy"])
            .arg(format!("http://127.0.0.1:{port}"))
            .arg("--proxy-user")
            .arg(format!("web:{TOKEN}"))
            .arg(&url)
            .output()
            .await
            .expect("curl runs");
    }
    let logged: Vec<(Value, Value)> = service
        .wait_lines("reported failed", 2)
        .iter()
        .map(|line| {
            let line: Value = serde_json::from_str(line).expect("one JSON object");
            (line["kind"].clone(), line["message"].clone())
        })
        .collect();
    assert_eq!(
        logged,
        [
            (
                json!("forward"),
                json!("gateway: forward failed before the response head; reported failed")
            ),
            (
                json!("tunnel"),
                json!("gateway: tunnel failed before it was up; reported failed")
            ),
        ]
    );
}
