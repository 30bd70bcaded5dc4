//! What the gateway's answers say about how they were served: `Proxy-Status` (RFC 9209)
//! on every answer, with the error type and details of the gateway's own failures, and
//! `x-proxy-allocator-proxy` / `x-proxy-allocator-attempts` naming the member that served
//! (its credentials masked) and how many members were tried.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::gateway::{
    HEALTHY, TOKEN, basic, connect_fails_after, curl, dead_members, http_proxy, member, proxy_pool,
    raw, spawn, spawn_on,
};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{Backend, TestApp, assert_error, read};
use crate::proxies::{closed_port, target};

/// The value of `name` in a lower-cased answer head, every line of it joined by `, `.
fn header(head: &str, name: &str) -> String {
    head.lines()
        .filter_map(|line| line.strip_prefix(&format!("{name}: ")))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The member of a proxy server as the gateway names it: its credentials masked.
fn masked(id: &str) -> String {
    id.replace("user:s3cret@", "***@")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnels_200_names_the_gateway_the_member_and_the_attempts() {
    let app = spawn().await;
    let site = target(None).await;
    let live = http_proxy().await;
    let dead = format!("http://127.0.0.1:{}", closed_port());
    proxy_pool(&app, "web").await;
    app.seed("web", &[&dead], Some(0)).await;
    app.seed("web", &[&member("http", &live)], Some(5)).await;
    let (status, head, _) = raw(
        &app,
        &format!("CONNECT 127.0.0.1:{} HTTP/1.1", site.port()),
        basic("web", TOKEN),
    )
    .await;
    assert_eq!(status, 200, "{head}");
    assert_eq!(header(&head, "proxy-status"), "proxy-allocator");
    assert_eq!(
        header(&head, "x-proxy-allocator-proxy"),
        masked(&member("http", &live))
    );
    assert_eq!(header(&head, "x-proxy-allocator-attempts"), "2");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_shows_the_headers_of_the_connects_200() {
    let app = spawn().await;
    let site = target(None).await;
    let live = http_proxy().await;
    proxy_pool(&app, "web").await;
    app.seed("web", &[&member("http", &live)], None).await;
    let url = format!("http://127.0.0.1:{}/health", site.port());
    let (code, out) = curl(
        &app,
        "web",
        &["--proxytunnel", "--include", "--silent", &url],
    )
    .await;
    assert_eq!(code, 0, "{out}");
    let connect_head = out.split("\r\n\r\n").next().expect("the CONNECT's head");
    assert!(connect_head.starts_with("HTTP/1.1 200"), "{connect_head}");
    let lower = connect_head.to_ascii_lowercase();
    assert_eq!(header(&lower, "proxy-status"), "proxy-allocator");
    assert_eq!(header(&lower, "x-proxy-allocator-attempts"), "1");
    assert!(out.ends_with(HEALTHY), "{out}");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_response_carries_the_received_status_after_the_targets_headers() {
    let app = spawn().await;
    let site = target(None).await;
    let live = http_proxy().await;
    proxy_pool(&app, "web").await;
    app.seed("web", &[&member("http", &live)], None).await;
    for (path, status) in [("/health", 200), ("/limited", 429)] {
        let (answered, head, _) = raw(
            &app,
            &format!("GET http://127.0.0.1:{}{path} HTTP/1.1", site.port()),
            basic("web", TOKEN),
        )
        .await;
        assert_eq!(answered, status, "{head}");
        assert_eq!(
            header(&head, "proxy-status"),
            format!("proxy-allocator; received-status={status}")
        );
        assert_eq!(
            header(&head, "x-proxy-allocator-proxy"),
            masked(&member("http", &live))
        );
        assert_eq!(header(&head, "x-proxy-allocator-attempts"), "1");
    }
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_502_after_refused_connections_says_connection_refused_and_names_the_last_member() {
    let app = spawn_on(Backend::Embedded, |config| config.gateway_attempts = 3).await;
    let dead = dead_members(&app, &[0, 1, 2]).await;
    connect_fails_after(&app, 3).await;
    let (status, head, _) = raw(&app, "CONNECT 127.0.0.1:443 HTTP/1.1", basic("web", TOKEN)).await;
    assert_eq!(status, 502, "{head}");
    assert_eq!(
        header(&head, "proxy-status"),
        "proxy-allocator; error=connection_refused; details=\"3 member(s) tried, none could be \
         reached; the last: connecting to the proxy: connection refused\""
    );
    // Each member was tried once already, so counts tie at 2 3 4: the second round goes
    // in the same order, ending with the third.
    assert_eq!(header(&head, "x-proxy-allocator-proxy"), dead[2]);
    assert_eq!(header(&head, "x-proxy-allocator-attempts"), "3");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_refusing_the_connect_is_a_proxy_internal_response() {
    let app = spawn().await;
    let refusing = TcpListener::bind("127.0.0.1:0").await.expect("bound");
    let port = refusing.local_addr().expect("address").port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = refusing.accept().await {
            let mut request = [0_u8; 1024];
            let _ = stream.read(&mut request).await;
            let _ = stream
                .write_all(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
                .await;
        }
    });
    proxy_pool(&app, "web").await;
    let id = format!("http://127.0.0.1:{port}");
    app.seed("web", &[&id], None).await;
    let (status, head, _) = raw(&app, "CONNECT 127.0.0.1:443 HTTP/1.1", basic("web", TOKEN)).await;
    assert_eq!(status, 502, "{head}");
    assert_eq!(
        header(&head, "proxy-status"),
        "proxy-allocator; error=proxy_internal_response; details=\"1 member(s) tried, none \
         could be reached; the last: connect through the proxy: the proxy answered 503\""
    );
    assert_eq!(header(&head, "x-proxy-allocator-proxy"), id);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_that_never_answers_is_a_connection_timeout() {
    let app = spawn_on(Backend::Embedded, |config| {
        config.gateway_connect_timeout_ms = 200;
    })
    .await;
    let silent = TcpListener::bind("127.0.0.1:0").await.expect("bound");
    let port = silent.local_addr().expect("address").port();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            open.push(stream);
        }
    });
    proxy_pool(&app, "web").await;
    app.seed("web", &[&format!("http://127.0.0.1:{port}")], None)
        .await;
    let (status, head, _) = raw(&app, "CONNECT 127.0.0.1:443 HTTP/1.1", basic("web", TOKEN)).await;
    assert_eq!(status, 502, "{head}");
    assert_eq!(
        header(&head, "proxy-status"),
        "proxy-allocator; error=connection_timeout; details=\"1 member(s) tried, none could \
         be reached; the last: the proxy did not complete its handshake in time\""
    );
    held.abort();
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateways_own_refusals_carry_their_error_type_and_no_member() {
    let app = spawn().await;
    proxy_pool(&app, "empty").await;
    for (authorization, status, error) in [
        (basic("empty", "wrong-token"), 407, "http_request_denied"),
        (basic("missing", TOKEN), 404, "http_request_error"),
        (basic("empty", TOKEN), 503, "destination_unavailable"),
    ] {
        let (answered, head, _) = raw(&app, "CONNECT 127.0.0.1:443 HTTP/1.1", authorization).await;
        assert_eq!(answered, status, "{head}");
        let proxy_status = header(&head, "proxy-status");
        assert!(
            proxy_status.starts_with(&format!("proxy-allocator; error={error}; details=\"")),
            "{proxy_status}"
        );
        assert_eq!(header(&head, "x-proxy-allocator-proxy"), "");
        assert_eq!(header(&head, "x-proxy-allocator-attempts"), "0");
    }
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_id_cannot_inject_a_header_into_the_answer() {
    let app = spawn().await;
    let site = target(None).await;
    let live = http_proxy().await;
    proxy_pool(&app, "web").await;
    // A path that spells a header break, percent-encoded: ids are visible ASCII only, so it
    // stays text inside the one header.
    let id = format!("{}/%0d%0aX-Injected:%20yes", member("http", &live));
    let (status, body) = app
        .post_json("/pools/web/members", serde_json::json!({"members": [id]}))
        .await;
    assert_eq!(status, reqwest::StatusCode::OK, "{body}");
    let added = body["added"][0].as_str().expect("added").to_owned();
    let (status, head, _) = raw(
        &app,
        &format!("CONNECT 127.0.0.1:{} HTTP/1.1", site.port()),
        basic("web", TOKEN),
    )
    .await;
    assert_eq!(status, 200, "{head}");
    assert!(!head.contains("\r\nx-injected"), "{head}");
    assert_eq!(
        header(&head, "x-proxy-allocator-proxy"),
        masked(&added).to_ascii_lowercase()
    );
    app.stop().await;
}

/// A tunnel through `web` to the target, opened and closed: its ticket.
async fn ticket_of_a_closed_tunnel(app: &TestApp, port: u16) -> String {
    let (status, head, _) = raw(
        app,
        &format!("CONNECT 127.0.0.1:{port} HTTP/1.1"),
        basic("web", TOKEN),
    )
    .await;
    assert_eq!(status, 200, "{head}");
    let ticket = header(&head, "x-proxy-allocator-ticket");
    assert_eq!(ticket.len(), 32, "{head}");
    assert!(ticket.bytes().all(|b| b.is_ascii_hexdigit()), "{ticket}");
    ticket
}

/// A report with the admin token (the gateway's service has a worker token).
async fn report(app: &TestApp, pool: &str, body: Value) -> (StatusCode, Value) {
    read(
        app.admin(Method::POST, &format!("/pools/{pool}/outcomes"))
            .json(&body)
            .send()
            .await
            .expect("sent"),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_reported_after_the_tunnel_closed_bans_its_member_for_the_tunnels_target() {
    let app = spawn().await;
    let site = target(None).await;
    let live = http_proxy().await;
    proxy_pool(&app, "web").await;
    app.seed("web", &[&member("http", &live)], None).await;
    let ticket = ticket_of_a_closed_tunnel(&app, site.port()).await;
    let (status, body) = report(
        &app,
        "web",
        json!({"ticket": ticket, "result": "blocked", "status": 403}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let banned_until = body["outcomes"][0]["banned_until"].clone();
    assert!(banned_until.is_string(), "{body}");
    assert_eq!(
        body,
        json!({"pool": "web", "outcomes": [{
            "proxy": masked(&member("http", &live)), "ticket": ticket, "result": "blocked",
            "effect": "banned", "consecutive_failures": 0, "target": "127.0.0.1",
            "banned_until": banned_until}],
            "unknown": [], "rejected": []})
    );
    let (status, listed) = app.get("/pools/web/members?target=127.0.0.1").await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    assert_eq!(listed["members"][0]["banned_until"], banned_until);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_unknown_or_other_pools_ticket_is_listed_unknown_never_an_error() {
    let app = spawn_on(Backend::Embedded, |config| {
        config.gateway_ticket_ttl_ms = 1_000;
    })
    .await;
    let site = target(None).await;
    let live = http_proxy().await;
    proxy_pool(&app, "web").await;
    proxy_pool(&app, "other").await;
    app.seed("web", &[&member("http", &live)], None).await;
    let ticket = ticket_of_a_closed_tunnel(&app, site.port()).await;
    let made_up = "0123456789abcdef0123456789abcdef";
    let (status, body) = report(&app, "other", json!({"ticket": ticket, "result": "ok"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["unknown"], json!([ticket]));
    let (status, body) = report(&app, "web", json!({"ticket": made_up, "result": "ok"})).await;
    assert_eq!(
        (status, &body["unknown"]),
        (StatusCode::OK, &json!([made_up]))
    );
    // Valid after the tunnel closed, until the ticket ttl has passed since.
    let (_, body) = report(&app, "web", json!({"ticket": ticket, "result": "ok"})).await;
    assert_eq!(body["outcomes"][0]["effect"], json!("counted"), "{body}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (_, body) = report(&app, "web", json!({"ticket": ticket, "result": "ok"})).await;
        if body["unknown"] == json!([ticket]) {
            assert_eq!(body["outcomes"], json!([]));
            break;
        }
        assert!(std::time::Instant::now() < deadline, "still valid: {body}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_names_its_proxy_or_a_ticket_and_a_tickets_target_is_the_tunnels() {
    let app = spawn().await;
    proxy_pool(&app, "web").await;
    let ticket = "0123456789abcdef0123456789abcdef";
    for (body, message) in [
        (
            json!({"proxy": "a", "ticket": ticket, "result": "ok"}),
            "ticket: a report names its proxy or a gateway ticket, not both",
        ),
        (
            json!({"ticket": ticket, "result": "blocked", "target": "example.com"}),
            "target: a ticket's report is about its tunnel's target",
        ),
        (
            json!({"result": "ok"}),
            "proxy: a report names its proxy (or a gateway ticket)",
        ),
    ] {
        let (status, answer) = report(&app, "web", body).await;
        assert_error(status, &answer, StatusCode::BAD_REQUEST, "invalid_request");
        assert_eq!(answer["error"]["message"], json!(message));
    }
    app.stop().await;
}
