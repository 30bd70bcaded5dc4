//! Active checks through every kind of proxy a member may be (`http`, `https`, `socks4`,
//! `socks5`, `socks5h`, with credentials) to HTTP and HTTPS targets, all real servers on
//! loopback (`proxies.rs`); and the pass rules: status, body, latency, headers, and the
//! target's certificate.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::helpers::{Backend, TestApp};
use crate::proxies::{HttpProxy, Server, TestCa, closed_port, socks4, socks5, target};

/// `user:s3cret` as a Basic credential.
const BASIC: &str = "Basic dXNlcjpzM2NyZXQ=";

/// One round a minute: within a test only the first round runs, so what each server saw
/// is exact.
fn check(url: &str, extra: Value) -> Value {
    let mut check = json!({"kind": "http", "url": url, "interval_ms": 60000,
                           "timeout_ms": 3000, "concurrency": 8});
    if let (Some(check), Some(extra)) = (check.as_object_mut(), extra.as_object()) {
        check.extend(extra.clone());
    }
    check
}

fn rules(allow_private: bool) -> Value {
    json!({"allow_private": allow_private,
           "schemes": ["http", "https", "socks4", "socks5", "socks5h"]})
}

/// Creates the pool, seeds `members`, then turns the check on (one member is tripped by
/// one failure, for ten minutes).
async fn start(app: &TestApp, check: Value, members: &[&str]) {
    app.create_pool("p", json!({"rules": rules(true)})).await;
    app.seed("p", members, Some(0)).await;
    let config = json!({
        "rules": rules(true),
        "health": {"max_consecutive_failures": 1, "cooldown_ms": 600000,
                   "jitter_percent": 0, "check": check},
    });
    app.configure("p", &config).await;
}

/// Waits until every member of `ids` has a last check; returns `(result, detail)` of each.
async fn last_checks(app: &TestApp, ids: &[&str]) -> Vec<(String, String)> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let members = app.members("p").await;
        let found: Vec<Option<(String, String)>> = ids
            .iter()
            .map(|id| {
                let entry = members.iter().find(|m| m["member"] == json!(id))?;
                let check = entry.get("last_check")?;
                Some((
                    check["result"].as_str()?.to_owned(),
                    check["detail"].as_str()?.to_owned(),
                ))
            })
            .collect();
        if found.iter().all(Option::is_some) {
            return found.into_iter().flatten().collect();
        }
        assert!(Instant::now() < deadline, "{members:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn ok() -> (String, String) {
    ("ok".to_owned(), "status 200".to_owned())
}

fn outcome(result: &str, detail: &str) -> (String, String) {
    (result.to_owned(), detail.to_owned())
}

/// Every proxy kind, each a real server on loopback, with the target's CA in the check.
struct Proxies {
    http: Server,
    https: Server,
    socks5: Server,
    socks5_auth: Server,
    socks4: Server,
}

impl Proxies {
    async fn start(ca: &TestCa) -> Self {
        Self {
            http: HttpProxy {
                authorization: Some(BASIC),
                ..HttpProxy::default()
            }
            .start()
            .await,
            https: HttpProxy {
                tls: Some(ca.acceptor(&["127.0.0.1"])),
                authorization: Some(BASIC),
                ..HttpProxy::default()
            }
            .start()
            .await,
            socks5: socks5(None).await,
            socks5_auth: socks5(Some(("user", "s3cret"))).await,
            socks4: socks4().await,
        }
    }

    /// The member ids, in the order of [`Proxies::servers`].
    fn members(&self) -> Vec<String> {
        vec![
            format!("http://user:s3cret@127.0.0.1:{}", self.http.port()),
            format!("https://user:s3cret@127.0.0.1:{}", self.https.port()),
            format!("socks5://127.0.0.1:{}", self.socks5.port()),
            format!("socks5://user:s3cret@127.0.0.1:{}", self.socks5_auth.port()),
            format!(
                "socks5h://user:s3cret@127.0.0.1:{}",
                self.socks5_auth.port()
            ),
            format!("socks4://127.0.0.1:{}", self.socks4.port()),
        ]
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_through_every_kind_of_proxy_reaches_an_https_target_and_dead_ones_fail() {
    let app = TestApp::spawn(Backend::Embedded).await;
    let ca = TestCa::new();
    let site = target(Some(ca.acceptor(&["127.0.0.1", "localhost"]))).await;
    let proxies = Proxies::start(&ca).await;
    let mut members = proxies.members();
    members.push(format!("http://127.0.0.1:{}", closed_port()));
    members.push(format!("socks5://127.0.0.1:{}", closed_port()));
    let ids: Vec<&str> = members.iter().map(String::as_str).collect();
    let url = format!("https://127.0.0.1:{}/health", site.port());
    start(&app, check(&url, json!({"ca_pem": ca.pem()})), &ids).await;

    let refused = outcome("failed", "connection refused");
    assert_eq!(
        last_checks(&app, &ids).await,
        vec![ok(), ok(), ok(), ok(), ok(), ok(), refused.clone(), refused]
    );
    let tunnel = format!("CONNECT 127.0.0.1:{} HTTP/1.1 | {BASIC}", site.port());
    assert_eq!(proxies.http.seen(), vec![tunnel.clone()]);
    assert_eq!(proxies.https.seen(), vec![tunnel]);
    let ip_target = format!("127.0.0.1:{}", site.port());
    assert_eq!(
        proxies.socks5.seen(),
        vec![format!("socks5 ip {ip_target}")]
    );
    // socks5 and socks5h through the same authenticating server, in either order.
    let mut through_auth = proxies.socks5_auth.seen();
    through_auth.sort();
    assert_eq!(
        through_auth,
        vec![
            format!("socks5 ip {ip_target}"),
            format!("socks5 ip {ip_target}")
        ]
    );
    assert_eq!(proxies.socks4.seen(), vec![format!("socks4 {ip_target}")]);
    assert_eq!(
        site.seen(),
        vec!["GET /health HTTP/1.1 | proxy-allocator-check"; 6]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5h_sends_the_target_name_to_the_proxy_and_socks5_resolves_it_first() {
    let app = TestApp::spawn(Backend::Embedded).await;
    let ca = TestCa::new();
    let site = target(Some(ca.acceptor(&["localhost"]))).await;
    let (named, resolved) = (socks5(None).await, socks5(None).await);
    let members = [
        format!("socks5h://127.0.0.1:{}", named.port()),
        format!("socks5://127.0.0.1:{}", resolved.port()),
    ];
    let ids: Vec<&str> = members.iter().map(String::as_str).collect();
    // The target listens on 127.0.0.1 only; `localhost` must resolve to it for the
    // resolving side, so the URL names it and the certificate is for it.
    let url = format!("https://localhost:{}/health", site.port());
    start(&app, check(&url, json!({"ca_pem": ca.pem()})), &ids).await;
    let results = last_checks(&app, &ids).await;
    assert_eq!(results[0], ok());
    assert_eq!(
        named.seen(),
        vec![format!("socks5 name localhost:{}", site.port())]
    );
    // The client-side lookup may give ::1 first, where nothing listens; what matters is
    // that the proxy was sent an address, not the name.
    let seen = resolved.seen();
    assert!(
        !seen.is_empty() && seen.iter().all(|line| line.starts_with("socks5 ip ")),
        "{seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_target_is_asked_in_absolute_form_through_http_proxies_and_relayed_by_socks() {
    let app = TestApp::spawn(Backend::Embedded).await;
    let ca = TestCa::new();
    let site = target(None).await;
    let proxies = Proxies::start(&ca).await;
    let members = proxies.members();
    let ids: Vec<&str> = members.iter().map(String::as_str).collect();
    let url = format!("http://127.0.0.1:{}/health", site.port());
    // The CA is still needed: the `https` proxy's own certificate is verified.
    start(&app, check(&url, json!({"ca_pem": ca.pem()})), &ids).await;
    assert_eq!(last_checks(&app, &ids).await, vec![ok(); 6]);
    let absolute = format!("GET {url} HTTP/1.1 | {BASIC}");
    assert_eq!(proxies.http.seen(), vec![absolute.clone()]);
    assert_eq!(proxies.https.seen(), vec![absolute]);
    assert_eq!(proxies.socks4.seen().len(), 1);
    assert_eq!(
        site.seen(),
        vec!["GET /health HTTP/1.1 | proxy-allocator-check"; 6]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_proxy_credentials_fail_the_check_without_showing_the_password() {
    let app = TestApp::spawn(Backend::Embedded).await;
    let ca = TestCa::new();
    let site = target(Some(ca.acceptor(&["127.0.0.1"]))).await;
    let proxies = Proxies::start(&ca).await;
    let members = [
        format!("http://user:wrong@127.0.0.1:{}", proxies.http.port()),
        format!(
            "socks5://user:wrong@127.0.0.1:{}",
            proxies.socks5_auth.port()
        ),
    ];
    let ids: Vec<&str> = members.iter().map(String::as_str).collect();
    let url = format!("https://127.0.0.1:{}/health", site.port());
    start(&app, check(&url, json!({"ca_pem": ca.pem()})), &ids).await;
    let results = last_checks(&app, &ids).await;
    assert_eq!(results[0].0, "failed", "{results:?}");
    assert_eq!(results[1].0, "failed", "{results:?}");
    for (_, detail) in &results {
        assert!(!detail.contains("wrong"), "{detail}");
    }
    assert_eq!(proxies.socks5_auth.seen(), vec!["socks5 bad credentials"]);
    assert!(site.seen().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_for_another_host_or_from_an_untrusted_ca_fails_the_check() {
    // The stranger CA's certificate is not in `ca_pem`, nor among the built-in roots.
    let app = TestApp::spawn(Backend::Embedded).await;
    let (ca, stranger) = (TestCa::new(), TestCa::new());
    let other_host = target(Some(ca.acceptor(&["other.test"]))).await;
    let untrusted = target(Some(stranger.acceptor(&["127.0.0.1"]))).await;
    let proxy = HttpProxy::default().start().await;
    let member = format!("http://127.0.0.1:{}", proxy.port());
    app.create_pool("p", json!({"rules": rules(true)})).await;
    app.seed("p", &[&member], Some(0)).await;
    for (site, expected) in [
        (
            &other_host,
            r#"tls: certificate not valid for name "127.0.0.1"; certificate is only valid for DnsName("other.test")"#,
        ),
        (&untrusted, "tls: UnknownIssuer"),
    ] {
        let url = format!("https://127.0.0.1:{}/health", site.port());
        let config = json!({"rules": rules(true), "health": {"check":
            check(&url, json!({"ca_pem": ca.pem(), "interval_ms": 100}))}});
        app.configure("p", &config).await;
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let members = app.members("p").await;
            if members[0]["last_check"]["detail"] == json!(expected) {
                assert_eq!(members[0]["last_check"]["result"], json!("failed"));
                break;
            }
            assert!(Instant::now() < deadline, "{members:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The handshake failed: no request reached the target.
        let seen = site.seen();
        assert!(
            !seen.is_empty() && seen.iter().all(|line| line == "tls refused"),
            "{seen:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_page_fails_expect_body_and_the_check_sends_its_headers() {
    let app = TestApp::spawn(Backend::Embedded).await;
    let ca = TestCa::new();
    let site = target(Some(ca.acceptor(&["127.0.0.1"]))).await;
    let proxy = HttpProxy::default().start().await;
    let member = format!("http://127.0.0.1:{}", proxy.port());
    let url = format!("https://127.0.0.1:{}/blocked", site.port());
    let extra = json!({"ca_pem": ca.pem(), "expect_body": "all is well",
                       "headers": {"User-Agent": "Mozilla/5.0 (check)"}});
    start(&app, check(&url, extra), &[&member]).await;
    assert_eq!(
        last_checks(&app, &[&member]).await,
        vec![outcome("blocked", "status 200 without the expected body")]
    );
    assert_eq!(
        site.seen(),
        vec!["GET /blocked HTTP/1.1 | Mozilla/5.0 (check)"]
    );
    let (_, members) = app.get("/pools/p/members").await;
    assert_eq!(
        members["members"][0]["reason"],
        json!("blocked"),
        "{members}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_proxy_fails_max_latency_ms_and_a_fast_one_passes() {
    let app = TestApp::spawn(Backend::Embedded).await;
    let ca = TestCa::new();
    let site = target(Some(ca.acceptor(&["127.0.0.1"]))).await;
    let slow = HttpProxy {
        delay: Duration::from_millis(400),
        ..HttpProxy::default()
    }
    .start()
    .await;
    let fast = HttpProxy::default().start().await;
    let members = [
        format!("http://127.0.0.1:{}", slow.port()),
        format!("http://127.0.0.1:{}", fast.port()),
    ];
    let ids: Vec<&str> = members.iter().map(String::as_str).collect();
    let url = format!("https://127.0.0.1:{}/health", site.port());
    let extra = json!({"ca_pem": ca.pem(), "expect_body": "all is well", "max_latency_ms": 300});
    start(&app, check(&url, extra), &ids).await;
    let results = last_checks(&app, &ids).await;
    assert_eq!(results[1], ok());
    let (result, detail) = &results[0];
    let took: u64 = detail
        .strip_prefix("status 200 after ")
        .and_then(|rest| rest.strip_suffix(" ms, over max_latency_ms 300"))
        .and_then(|ms| ms.parse().ok())
        .unwrap_or_else(|| panic!("{detail}"));
    assert_eq!(result, "failed");
    assert!((400..3000).contains(&took), "{detail}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_on_a_private_address_is_not_dialled_unless_the_rules_allow_it() {
    let app = TestApp::spawn(Backend::Embedded).await;
    let proxy = HttpProxy::default().start().await;
    let site = target(None).await;
    let members = [
        format!("http://127.0.0.1:{}", proxy.port()),
        format!("http://localhost:{}", proxy.port()),
    ];
    let ids: Vec<&str> = members.iter().map(String::as_str).collect();
    app.create_pool("p", json!({"rules": rules(true)})).await;
    app.seed("p", &ids, Some(0)).await;
    // The rules stop allowing private addresses after the members came in.
    let url = format!("http://127.0.0.1:{}/health", site.port());
    let config = json!({"rules": rules(false), "health": {"check": check(&url, json!({}))}});
    app.configure("p", &config).await;
    let refused = outcome("failed", "private address");
    assert_eq!(
        last_checks(&app, &ids).await,
        vec![refused.clone(), refused]
    );
    assert!(proxy.seen().is_empty());
    assert!(site.seen().is_empty());
}

#[tokio::test]
async fn check_targets_must_be_http_or_https_and_ca_pem_must_hold_certificates() {
    let app = TestApp::spawn(Backend::Embedded).await;
    let ca = TestCa::new();
    let mut refused = Vec::new();
    for check in [
        json!({"kind": "http", "url": "ftp://example.com/"}),
        json!({"kind": "http", "url": "https://example.com/", "ca_pem": "not a certificate"}),
        json!({"kind": "http", "url": "https://example.com/", "ca_pem": "x".repeat(65537)}),
        json!({"kind": "http", "url": "https://example.com/", "max_latency_ms": 60001}),
    ] {
        let response = app
            .admin(reqwest::Method::PUT, "/pools/p")
            .json(&json!({"health": {"check": check}}))
            .send()
            .await
            .expect("sent");
        refused.push(response.status().as_u16());
    }
    assert_eq!(refused, vec![400; 4]);
    let bundle = format!("{}{}", ca.pem(), TestCa::new().pem());
    let check = json!({"kind": "http", "url": "https://example.com/", "ca_pem": bundle});
    let response = app
        .admin(reqwest::Method::PUT, "/pools/p")
        .json(&json!({"health": {"check": check}}))
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), reqwest::StatusCode::CREATED);
    let (_, info) = app.get("/pools/p").await;
    assert_eq!(info["config"]["health"]["check"]["ca_pem"], json!(bundle));
}
