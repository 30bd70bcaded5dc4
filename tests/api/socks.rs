//! The gateway's SOCKS5 port (`GATEWAY_SOCKS_LISTEN`) with curl, with Python `requests`
//! (PySocks) and with SOCKS5 written by hand where the exact bytes matter, through real local upstream proxies (`proxies.rs`)
//! to local targets: the handshake and its refusals, attempts, sessions, leases, the
//! connection cap and deadlines, and the metric.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::gateway::{
    CaFile, HEALTHY, TOKEN, basic, gateway, health, http_proxy, member, proxy_pool,
};
use crate::helpers::{Backend, TestApp, backend_config};
use crate::proxies::{HttpProxy, TestCa, closed_port, socks5, target};

async fn spawn_on(
    backend: Backend,
    tune: impl FnOnce(&mut proxy_allocator::config::Config),
) -> TestApp {
    crate::gateway::spawn_on(backend, |config| {
        config.gateway_socks_listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
        tune(config);
    })
    .await
}

fn socks(app: &TestApp) -> SocketAddr {
    app.socks.expect("the SOCKS5 port listens")
}

/// curl through the SOCKS5 port as `user` with the worker token, `scheme` being `socks5`
/// (curl resolves the name and sends an address) or `socks5h` (curl sends the name).
async fn curl(app: &TestApp, scheme: &str, user: &str, url: &str) -> (i32, String) {
    let output = tokio::process::Command::new("curl")
        .args(["--silent", "--show-error", "--max-time", "20", "--proxy"])
        .arg(format!("{scheme}://{}", socks(app)))
        .arg("--proxy-user")
        .arg(format!("{user}:{TOKEN}"))
        .arg(url)
        .output()
        .await
        .expect("curl runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
    )
}

/// A SOCKS5 destination as a request carries it.
enum To<'a> {
    V4([u8; 4], u16),
    V6(std::net::Ipv6Addr, u16),
    Name(&'a str, u16),
}

impl To<'_> {
    fn bytes(&self) -> Vec<u8> {
        let (mut bytes, port) = match self {
            Self::V4(ip, port) => ([&[1][..], ip].concat(), port),
            Self::V6(ip, port) => ([&[4][..], &ip.octets()].concat(), port),
            Self::Name(name, port) => {
                let len = u8::try_from(name.len()).expect("a short name");
                ([&[3, len][..], name.as_bytes()].concat(), port)
            }
        };
        bytes.extend_from_slice(&port.to_be_bytes());
        bytes
    }
}

/// Reads exactly `N` bytes, or `None` when the gateway closed the connection first.
async fn read<const N: usize>(stream: &mut TcpStream) -> Option<[u8; N]> {
    let mut bytes = [0; N];
    tokio::time::timeout(Duration::from_secs(20), stream.read_exact(&mut bytes))
        .await
        .expect("answered in time")
        .ok()
        .map(|_| bytes)
}

/// Whether the gateway closed the connection and sent nothing more.
async fn closed(stream: &mut TcpStream) -> bool {
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut rest)).await;
    matches!(read, Ok(Ok(0)))
}

/// Greets and authenticates as `user` with `password`; the authentication's status.
async fn authenticate(stream: &mut TcpStream, user: &str, password: &str) -> u8 {
    stream.write_all(&[5, 1, 2]).await.expect("greeted");
    assert_eq!(
        read::<2>(stream).await,
        Some([5, 2]),
        "user and password chosen"
    );
    let mut auth = vec![1, u8::try_from(user.len()).expect("short")];
    auth.extend_from_slice(user.as_bytes());
    auth.push(u8::try_from(password.len()).expect("short"));
    auth.extend_from_slice(password.as_bytes());
    stream.write_all(&auth).await.expect("authenticated");
    let [version, status] = read::<2>(stream).await.expect("an authentication status");
    assert_eq!(version, 1);
    status
}

/// A request of `command` to `to` as `user`, on a fresh connection: the reply's code and
/// the connection (a tunnel when the code is 0).
async fn request(gateway: SocketAddr, user: &str, command: u8, to: &To<'_>) -> (u8, TcpStream) {
    let mut stream = TcpStream::connect(gateway).await.expect("connected");
    assert_eq!(
        authenticate(&mut stream, user, TOKEN).await,
        0,
        "authenticated"
    );
    let mut request = vec![5, command, 0];
    request.extend_from_slice(&to.bytes());
    stream.write_all(&request).await.expect("requested");
    let reply = read::<10>(&mut stream).await.expect("a reply");
    assert_eq!(
        (reply[0], reply[2], reply[3]),
        (5, 0, 1),
        "a reply with an IPv4 bound address: {reply:?}"
    );
    (reply[1], stream)
}

/// A `CONNECT` to `to` as `user`: the reply's code and the connection.
async fn connect(gateway: SocketAddr, user: &str, to: &To<'_>) -> (u8, TcpStream) {
    request(gateway, user, 1, to).await
}

/// A request for `/health` through an open tunnel to the plain-HTTP target, and its body.
async fn health_through(stream: &mut TcpStream) -> String {
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: target\r\nConnection: close\r\n\r\n")
        .await
        .expect("sent");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.expect("read");
    let text = String::from_utf8_lossy(&answer).into_owned();
    text.split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or(text)
}

async fn metrics(app: &TestApp) -> String {
    app.anonymous(reqwest::Method::GET, "/metrics")
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text")
}

/// The pool's `(in_flight, abandoned)` stats, once they are `expected` (a closed tunnel's
/// release is on its way), at most 10 s.
async fn leases_become(app: &TestApp, pool: &str, expected: (u64, u64)) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, info) = app.get(&format!("/pools/{pool}")).await;
        let stats = (
            info["stats"]["in_flight"].as_u64().expect("in_flight"),
            info["stats"]["abandoned"].as_u64().expect("abandoned"),
        );
        if stats == expected {
            return;
        }
        assert!(Instant::now() < deadline, "{stats:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_reaches_targets_through_http_and_socks5_members_with_names_and_addresses() {
    // Pools of names of their own: the metrics are the process's, shared by every test.
    for (backend, http, socks) in [
        (Backend::Embedded, "viahttp", "viasocks"),
        (Backend::Redis, "viahttp2", "viasocks2"),
    ] {
        let app = spawn_on(backend, |_| {}).await;
        let site = target(None).await;
        let proxy = http_proxy().await;
        let upstream = socks5(Some(("user", "s3cret"))).await;
        proxy_pool(&app, http).await;
        app.seed(http, &[&member("http", &proxy)], None).await;
        proxy_pool(&app, socks).await;
        app.seed(socks, &[&member("socks5h", &upstream)], None)
            .await;
        let by_address = format!("http://127.0.0.1:{}/health", site.port());
        let by_name = format!("http://localhost:{}/health", site.port());

        for (scheme, url) in [("socks5", &by_address), ("socks5h", &by_name)] {
            assert_eq!(
                curl(&app, scheme, http, url).await,
                (0, HEALTHY.to_owned()),
                "{backend:?} {scheme}"
            );
            assert_eq!(
                curl(&app, scheme, socks, url).await,
                (0, HEALTHY.to_owned()),
                "{backend:?} {scheme}"
            );
        }
        assert_eq!(
            proxy.seen(),
            vec![
                format!(
                    "CONNECT 127.0.0.1:{} HTTP/1.1 | Basic dXNlcjpzM2NyZXQ=",
                    site.port()
                ),
                format!(
                    "CONNECT localhost:{} HTTP/1.1 | Basic dXNlcjpzM2NyZXQ=",
                    site.port()
                ),
            ],
            "the member is handed the address or the name the client sent: {backend:?}"
        );
        assert_eq!(
            upstream.seen(),
            vec![
                format!("socks5 ip 127.0.0.1:{}", site.port()),
                format!("socks5 name localhost:{}", site.port()),
            ],
            "{backend:?}"
        );
        assert_eq!(
            health(&app, http).await,
            vec![(member("http", &proxy), 2, 0)]
        );
        let metrics = metrics(&app).await;
        let tunnels = format!(
            "pa_gateway_requests_total{{listener=\"socks5\",pool=\"{http}\",outcome=\"tunnel\"}} 2\n"
        );
        assert!(metrics.contains(&tunnels), "{metrics}");
        app.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_requests_reaches_http_and_https_targets_through_the_socks5_port_by_name_and_by_address()
 {
    // requests with PySocks (requests[socks]): socks5h:// sends the gateway the name,
    // socks5:// resolves it first and sends the address.
    let script = r#"
import sys, requests
gateway, ca = sys.argv[1], sys.argv[2]
for url in sys.argv[3:]:
    for scheme in ("socks5h", "socks5"):
        proxy = f"{scheme}://{gateway}"
        answer = requests.get(url, proxies={"http": proxy, "https": proxy}, verify=ca, timeout=20)
        print(scheme, answer.status_code, answer.text)
"#;
    let ca = TestCa::new();
    let ca_file = CaFile::new(&ca);
    // Pools of names of their own: the metrics are the process's, shared by every test.
    for (backend, pool) in [(Backend::Embedded, "pysocks"), (Backend::Redis, "pysocks2")] {
        let app = spawn_on(backend, |_| {}).await;
        let secure = target(Some(ca.acceptor(&["localhost", "127.0.0.1"]))).await;
        let plain = target(None).await;
        let proxy = http_proxy().await;
        proxy_pool(&app, pool).await;
        app.seed(pool, &[&member("http", &proxy)], None).await;
        let output = tokio::process::Command::new("python3")
            .arg("-c")
            .arg(script)
            .arg(format!("{pool}:{TOKEN}@{}", socks(&app)))
            .arg(&ca_file.0)
            .arg(format!("https://localhost:{}/health", secure.port()))
            .arg(format!("http://localhost:{}/health", plain.port()))
            .output()
            .await
            .expect("python3 runs");
        assert_eq!(
            String::from_utf8_lossy(&output.stdout),
            format!(
                "socks5h 200 {HEALTHY}\nsocks5 200 {HEALTHY}\nsocks5h 200 {HEALTHY}\nsocks5 200 {HEALTHY}\n"
            ),
            "{backend:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let (secure_port, plain_port) = (secure.port(), plain.port());
        assert_eq!(
            proxy.seen(),
            vec![
                format!("CONNECT localhost:{secure_port} HTTP/1.1 | Basic dXNlcjpzM2NyZXQ="),
                format!("CONNECT 127.0.0.1:{secure_port} HTTP/1.1 | Basic dXNlcjpzM2NyZXQ="),
                format!("CONNECT localhost:{plain_port} HTTP/1.1 | Basic dXNlcjpzM2NyZXQ="),
                format!("CONNECT 127.0.0.1:{plain_port} HTTP/1.1 | Basic dXNlcjpzM2NyZXQ="),
            ],
            "the member is handed the name or the address requests sent, with its own \
             credentials: {backend:?}"
        );
        for site in [&secure, &plain] {
            let agents: Vec<String> = site
                .seen()
                .iter()
                .map(|seen| {
                    seen.split(" | python-requests/")
                        .next()
                        .unwrap_or(seen)
                        .to_owned()
                })
                .collect();
            assert_eq!(agents, vec!["GET /health HTTP/1.1"; 2], "{:?}", site.seen());
        }
        assert_eq!(
            health(&app, pool).await,
            vec![(member("http", &proxy), 4, 0)],
            "{backend:?}"
        );
        let metrics = metrics(&app).await;
        let tunnels = format!(
            "pa_gateway_requests_total{{listener=\"socks5\",pool=\"{pool}\",outcome=\"tunnel\"}} 4\n"
        );
        assert!(metrics.contains(&tunnels), "{metrics}");
        app.stop().await;
    }
}

/// A metric's value in a `/metrics` text, 0 when the series is not there yet.
fn value(metrics: &str, series: &str) -> u64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnels_bytes_are_counted_by_port_and_direction_and_open_tunnels_in_a_gauge() {
    let app = spawn_on(Backend::Embedded, |_| {}).await;
    let site = target(None).await;
    let proxy = http_proxy().await;
    proxy_pool(&app, "counted").await;
    app.seed("counted", &[&member("http", &proxy)], None).await;
    let request = b"GET /health HTTP/1.1\r\nHost: target\r\nConnection: close\r\n\r\n";
    let series = |port: &str, direction: &str| {
        format!("pa_gateway_bytes_total{{listener=\"{port}\",direction=\"{direction}\"}}")
    };
    for port in ["http", "socks5"] {
        let before = metrics(&app).await;
        let mut stream = if port == "http" {
            let mut stream = TcpStream::connect(gateway(&app)).await.expect("connected");
            let authorization = basic("counted", TOKEN).expect("credentials");
            let connect = format!(
                "CONNECT 127.0.0.1:{0} HTTP/1.1\r\nHost: 127.0.0.1:{0}\r\n\
                 Proxy-Authorization: {authorization}\r\n\r\n",
                site.port()
            );
            stream.write_all(connect.as_bytes()).await.expect("sent");
            let mut head = Vec::new();
            while !head.ends_with(b"\r\n\r\n") {
                head.push(stream.read_u8().await.expect("the answer's head"));
            }
            assert!(head.starts_with(b"HTTP/1.1 200 "), "{head:?}");
            stream
        } else {
            let (reply, stream) =
                connect(socks(&app), "counted", &To::V4([127, 0, 0, 1], site.port())).await;
            assert_eq!(reply, 0);
            stream
        };
        let open = metrics(&app).await;
        assert!(
            open.lines()
                .any(|line| line.starts_with("pa_gateway_tunnels_open ")),
            "{open}"
        );
        stream.write_all(request).await.expect("sent");
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.expect("read");
        assert!(answer.ends_with(HEALTHY.as_bytes()), "{answer:?}");
        drop(stream);
        // Counted as the tunnel closes; other tests' tunnels may add to the same series.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let after = metrics(&app).await;
            let sent = value(&after, &series(port, "sent")) - value(&before, &series(port, "sent"));
            let received = value(&after, &series(port, "received"))
                - value(&before, &series(port, "received"));
            if sent >= request.len() as u64 && received >= answer.len() as u64 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{port}: {sent} sent, {received} received"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_or_a_malformed_user_name_fails_authentication_and_closes() {
    let app = spawn_on(Backend::Embedded, |_| {}).await;
    let proxy = http_proxy().await;
    proxy_pool(&app, "web").await;
    app.seed("web", &[&member("http", &proxy)], None).await;
    for (user, password) in [("web", "wrong"), ("web-session", TOKEN), ("", TOKEN)] {
        let mut stream = TcpStream::connect(socks(&app)).await.expect("connected");
        assert_eq!(
            authenticate(&mut stream, user, password).await,
            1,
            "{user}:{password}"
        );
        assert!(closed(&mut stream).await, "{user}:{password}");
    }
    assert_eq!(proxy.seen(), Vec::<String>::new());
    assert_eq!(
        health(&app, "web").await,
        vec![(member("http", &proxy), 0, 0)]
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bind_and_udp_associate_are_answered_7_and_an_unknown_address_type_8() {
    let app = spawn_on(Backend::Embedded, |_| {}).await;
    let proxy = http_proxy().await;
    proxy_pool(&app, "web").await;
    app.seed("web", &[&member("http", &proxy)], None).await;
    for command in [2, 3] {
        let (reply, mut stream) =
            request(socks(&app), "web", command, &To::V4([127, 0, 0, 1], 80)).await;
        assert_eq!(reply, 7, "command {command}");
        assert!(closed(&mut stream).await);
    }
    let mut stream = TcpStream::connect(socks(&app)).await.expect("connected");
    assert_eq!(authenticate(&mut stream, "web", TOKEN).await, 0);
    stream
        .write_all(&[5, 1, 0, 9, 1, 2, 3, 4])
        .await
        .expect("sent");
    assert_eq!(
        read::<10>(&mut stream).await,
        Some([5, 8, 0, 1, 0, 0, 0, 0, 0, 0])
    );
    assert!(closed(&mut stream).await);
    assert_eq!(proxy.seen(), Vec::<String>::new(), "nothing was dialled");
    assert_eq!(
        health(&app, "web").await,
        vec![(member("http", &proxy), 0, 0)]
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_greeting_of_another_version_or_without_user_and_password_is_refused_and_closed() {
    let app = spawn_on(Backend::Embedded, |_| {}).await;
    // SOCKS4, a SOCKS5 greeting offering only "no authentication", and one offering all
    // 255 methods but user and password, followed by garbage.
    let mut every_other: Vec<u8> = vec![5, 255];
    every_other.extend((0..=255u8).filter(|method| *method != 2));
    every_other.extend(vec![0xAB; 4096]);
    for greeting in [
        vec![4, 1, 0, 80, 127, 0, 0, 1, 0],
        vec![5, 1, 0],
        every_other,
    ] {
        let mut stream = TcpStream::connect(socks(&app)).await.expect("connected");
        let _ = stream.write_all(&greeting).await;
        assert_eq!(
            read::<2>(&mut stream).await,
            Some([5, 0xFF]),
            "{:?}",
            &greeting[..2]
        );
        assert!(closed(&mut stream).await);
    }
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_greeting_sent_byte_by_byte_is_closed_at_the_unauthenticated_timeout() {
    let app = spawn_on(Backend::Embedded, |config| {
        config.header_read_timeout_ms = 30_000;
        config.unauthenticated_timeout_ms = 1_000;
    })
    .await;
    let started = Instant::now();
    let mut stream = TcpStream::connect(socks(&app)).await.expect("connected");
    // A greeting announcing 200 methods, one byte every 200 ms: it never completes.
    stream.write_all(&[5, 200]).await.expect("sent");
    let mut gone = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if stream.write_all(&[0]).await.is_err() {
            gone = true;
            break;
        }
        let mut byte = [0u8; 1];
        if let Ok(Ok(0) | Err(_)) =
            tokio::time::timeout(Duration::from_millis(1), stream.read(&mut byte)).await
        {
            gone = true;
            break;
        }
    }
    let closed_after = started.elapsed();
    assert!(gone, "the connection was never closed");
    assert!(
        closed_after >= Duration::from_secs(1) && closed_after < Duration::from_secs(4),
        "closed after {closed_after:?}"
    );
    let metrics = metrics(&app).await;
    assert!(
        metrics.contains(
            "pa_connection_timeouts_total{listener=\"socks5\",kind=\"unauthenticated\"} 1\n"
        ),
        "{metrics}"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ipv6_literal_is_handed_to_the_member_in_brackets_and_the_tunnel_reaches_it() {
    let app = spawn_on(Backend::Embedded, |_| {}).await;
    let proxy = http_proxy().await;
    proxy_pool(&app, "web").await;
    app.seed("web", &[&member("http", &proxy)], None).await;
    let site = tokio::net::TcpListener::bind("[::1]:0")
        .await
        .expect("bound on ::1");
    let port = site.local_addr().expect("an address").port();
    tokio::spawn(async move {
        if let Ok((mut stream, _)) = site.accept().await {
            let mut head = [0u8; 1024];
            let _ = stream.read(&mut head).await;
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nv6")
                .await;
        }
    });
    let (reply, mut tunnel) = connect(
        socks(&app),
        "web",
        &To::V6(std::net::Ipv6Addr::LOCALHOST, port),
    )
    .await;
    assert_eq!(reply, 0);
    assert_eq!(health_through(&mut tunnel).await, "v6");
    assert_eq!(
        proxy.seen(),
        vec![format!(
            "CONNECT [::1]:{port} HTTP/1.1 | Basic dXNlcjpzM2NyZXQ="
        )]
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_member_is_tried_once_and_when_every_member_is_dead_the_reply_is_5() {
    for backend in [Backend::Embedded, Backend::Redis] {
        let app = spawn_on(backend, |_| {}).await;
        let site = target(None).await;
        let live = http_proxy().await;
        let dead = format!("http://127.0.0.1:{}", closed_port());
        proxy_pool(&app, "flaky").await;
        app.seed("flaky", &[&dead], Some(0)).await;
        app.seed("flaky", &[&member("http", &live)], Some(5)).await;
        let (reply, mut tunnel) =
            connect(socks(&app), "flaky", &To::Name("localhost", site.port())).await;
        assert_eq!(reply, 0, "{backend:?}");
        assert_eq!(health_through(&mut tunnel).await, HEALTHY, "{backend:?}");
        let mut expected = vec![(dead.clone(), 1, 1), (member("http", &live), 6, 0)];
        expected.sort();
        assert_eq!(health(&app, "flaky").await, expected, "{backend:?}");

        let dead: Vec<String> = (0..3)
            .map(|_| format!("http://127.0.0.1:{}", closed_port()))
            .collect();
        proxy_pool(&app, "dead").await;
        let ids: Vec<&str> = dead.iter().map(String::as_str).collect();
        app.seed("dead", &ids, Some(0)).await;
        let (reply, mut stream) = connect(socks(&app), "dead", &To::V4([127, 0, 0, 1], 443)).await;
        assert_eq!(reply, 5, "connection refused: {backend:?}");
        assert!(closed(&mut stream).await);
        let mut expected: Vec<(String, u64, u64)> =
            dead.iter().map(|id| (id.clone(), 1, 1)).collect();
        expected.sort();
        assert_eq!(
            health(&app, "dead").await,
            expected,
            "each tried once: {backend:?}"
        );
        app.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_pool_is_answered_2_and_an_empty_one_3() {
    let app = spawn_on(Backend::Embedded, |_| {}).await;
    let (reply, _) = connect(socks(&app), "nowhere", &To::V4([127, 0, 0, 1], 80)).await;
    assert_eq!(reply, 2, "not allowed: no such pool");
    proxy_pool(&app, "socksempty").await;
    let (reply, _) = connect(socks(&app), "socksempty", &To::V4([127, 0, 0, 1], 80)).await;
    assert_eq!(reply, 3, "network unreachable: nothing eligible");
    // Counted as the connection ends, which may be just after the client read the reply.
    let line = "pa_gateway_requests_total{listener=\"socks5\",pool=\"socksempty\",outcome=\"no_eligible_proxy\"} 1\n";
    let counted = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let metrics = metrics(&app).await;
            if metrics.contains(line) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(counted.is_ok(), "{}", metrics(&app).await);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_in_the_user_name_pins_one_member_over_socks5() {
    for backend in [Backend::Embedded, Backend::Redis] {
        let app = spawn_on(backend, |_| {}).await;
        let site = target(None).await;
        let proxy = HttpProxy::default().start().await;
        proxy_pool(&app, "web").await;
        let members: Vec<String> = (0..3)
            .map(|i| format!("http://u{i}:p@127.0.0.1:{}", proxy.port()))
            .collect();
        let ids: Vec<&str> = members.iter().map(String::as_str).collect();
        app.seed("web", &ids, Some(0)).await;
        let url = format!("http://127.0.0.1:{}/health", site.port());
        for user in [
            "web-session-abc",
            "web-session-abc",
            "web-session-abc",
            "web-session-xyz",
        ] {
            assert_eq!(
                curl(&app, "socks5", user, &url).await,
                (0, HEALTHY.to_owned()),
                "{backend:?}"
            );
        }
        let seen = proxy.seen();
        let credential = |line: &String| line.rsplit(" | ").next().unwrap_or_default().to_owned();
        assert_eq!(seen.len(), 4, "{backend:?}");
        assert!(
            seen[..3]
                .iter()
                .all(|line| credential(line) == credential(&seen[0])),
            "{seen:?}"
        );
        assert_ne!(
            credential(&seen[3]),
            credential(&seen[0]),
            "another session, another member"
        );
        app.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_in_flight_1_holds_with_50_concurrent_socks5_tunnels_and_closing_one_frees_its_member()
{
    for backend in [Backend::Embedded, Backend::Redis] {
        let app = spawn_on(backend, |_| {}).await;
        let site = target(None).await;
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
        let gateway = socks(&app);
        let to = To::V4([127, 0, 0, 1], site.port());
        let opened =
            futures_util::future::join_all((0..50).map(|_| connect(gateway, "busy", &to))).await;
        let mut replies: Vec<u8> = opened.iter().map(|(reply, _)| *reply).collect();
        replies.sort_unstable();
        let mut expected = vec![0; 5];
        expected.extend(vec![3; 45]);
        assert_eq!(replies, expected, "{backend:?}");
        assert_eq!(proxy.seen().len(), 5, "one tunnel per member: {backend:?}");
        leases_become(&app, "busy", (5, 0)).await;

        let mut tunnels: Vec<TcpStream> = opened
            .into_iter()
            .filter_map(|(reply, stream)| (reply == 0).then_some(stream))
            .collect();
        let mut first = tunnels.pop().expect("a tunnel");
        assert_eq!(health_through(&mut first).await, HEALTHY, "{backend:?}");
        drop(first);
        leases_become(&app, "busy", (4, 0)).await;
        let (reply, again) = connect(gateway, "busy", &to).await;
        assert_eq!(
            reply, 0,
            "the freed member takes a tunnel again: {backend:?}"
        );
        let (reply, _) = connect(gateway, "busy", &to).await;
        assert_eq!(reply, 3, "{backend:?}");
        drop(again);
        drop(tunnels);
        leases_become(&app, "busy", (0, 0)).await;
        app.stop().await;
    }
}

/// Two connections held open on the HTTP gateway port and a third on the SOCKS5 port,
/// which is served; a fourth on the SOCKS5 port is closed, for the reason `why`.
async fn fourth_connection_is_closed(app: &TestApp, why: &str) {
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(
            TcpStream::connect(crate::gateway::gateway(app))
                .await
                .expect("connected"),
        );
    }
    let mut third = TcpStream::connect(socks(app)).await.expect("connected");
    third.write_all(&[5, 1, 2]).await.expect("greeted");
    assert_eq!(
        read::<2>(&mut third).await,
        Some([5, 2]),
        "the third connection is served"
    );
    let mut fourth = TcpStream::connect(socks(app)).await.expect("connected");
    let _ = fourth.write_all(&[5, 1, 2]).await;
    assert_eq!(read::<2>(&mut fourth).await, None, "{why}");
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_socks5_port_counts_under_the_gateways_connection_cap_with_the_http_port() {
    let app = spawn_on(Backend::Embedded, |config| {
        config.gateway_max_connections = Some(3);
        config.gateway_max_connections_per_client = Some(10);
    })
    .await;
    fourth_connection_is_closed(&app, "the fourth is closed at the cap").await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_worker_token_the_socks5_port_starts_only_on_loopback() {
    let mut config = backend_config(Backend::Embedded);
    config.worker_token = None;
    config.gateway_socks_listen = Some(SocketAddr::from(([0, 0, 0, 0], 0)));
    let store = proxy_allocator::startup::store(&config)
        .await
        .expect("a store");
    let refused = proxy_allocator::startup::Application::with_store(config, store).await;
    let error = refused.err().expect("refused").to_string();
    assert!(
        error.starts_with(
            "refusing to start: GATEWAY_SOCKS_LISTEN 0.0.0.0:0 is not a loopback address"
        ),
        "{error}"
    );

    let app = spawn_on(Backend::Embedded, |config| {
        config.worker_token = None;
        config.gateway_listen = None;
    })
    .await;
    assert_eq!(app.gateway, None, "the SOCKS5 port alone");
    let site = target(None).await;
    let proxy = http_proxy().await;
    proxy_pool(&app, "web").await;
    app.seed("web", &[&member("http", &proxy)], None).await;
    let mut stream = TcpStream::connect(socks(&app)).await.expect("connected");
    assert_eq!(authenticate(&mut stream, "web", "anything").await, 0);
    let mut request = vec![5, 1, 0];
    request.extend_from_slice(&To::V4([127, 0, 0, 1], site.port()).bytes());
    stream.write_all(&request).await.expect("requested");
    assert_eq!(read::<10>(&mut stream).await.map(|reply| reply[1]), Some(0));
    assert_eq!(health_through(&mut stream).await, HEALTHY);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_share_of_connections_spans_the_http_and_socks5_ports() {
    let app = spawn_on(Backend::Embedded, |config| {
        config.gateway_max_connections = Some(100);
        config.gateway_max_connections_per_client = Some(3);
    })
    .await;
    fourth_connection_is_closed(&app, "over the share: closed").await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_open_socks5_tunnels_finish_and_closes_those_left_at_the_drain_timeout() {
    let site = target(None).await;
    let proxy = http_proxy().await;
    let (mut service, gateway) =
        crate::gateway::draining_service("GATEWAY_SOCKS_LISTEN", &proxy).await;
    let to = To::V4([127, 0, 0, 1], site.port());
    let (reply, mut busy) = connect(gateway, "web", &to).await;
    assert_eq!(reply, 0);
    let (reply, mut idle) = connect(gateway, "web", &to).await;
    assert_eq!(reply, 0);

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
        service.wait_exit(Duration::from_secs(10)).is_some(),
        "the service exits once the drain ends"
    );
    let mut closed: Vec<(String, String, String)> = service
        .wait_lines("gateway tunnel closed", 2)
        .iter()
        .map(|line| {
            let line: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
            (
                line["listener"].as_str().expect("listener").to_owned(),
                line["proxy"].as_str().expect("proxy").to_owned(),
                line["ended"].as_str().expect("ended").to_owned(),
            )
        })
        .collect();
    closed.sort();
    let masked = format!("http://***@127.0.0.1:{}", proxy.port());
    assert_eq!(
        closed,
        vec![
            ("socks5".to_owned(), masked.clone(), "closed".to_owned()),
            ("socks5".to_owned(), masked, "shutdown".to_owned()),
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
