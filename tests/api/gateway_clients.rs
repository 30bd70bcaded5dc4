//! A client's token as the gateways' password (`PUT /clients/{client}`): it opens the
//! pools its client lists on the HTTP gateway and the SOCKS5 port, and no other, with curl
//! through a real local upstream proxy to a local target.

use std::net::SocketAddr;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::gateway::{HEALTHY, TOKEN, error, gateway, health, http_proxy, member, proxy_pool};
use crate::helpers::{Backend, TestApp, backend_config, read};
use crate::proxies::target;

/// curl through `proxy` as `user` with `password`: its exit code, the statuses it saw (the
/// target's, then the proxy's answer to a `CONNECT`: 000 for none) and the body.
async fn curl_as(
    proxy: &str,
    user: &str,
    password: &str,
    extra: &[&str],
    url: &str,
) -> (i32, String, String) {
    let output = tokio::process::Command::new("curl")
        .args([
            "--silent",
            "--max-time",
            "20",
            "--write-out",
            "\n%{http_code} %{http_connect}",
            "--proxy",
            proxy,
        ])
        .arg("--proxy-user")
        .arg(format!("{user}:{password}"))
        .args(extra)
        .arg(url)
        .output()
        .await
        .expect("curl runs");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
    (
        output.status.code().unwrap_or(-1),
        status.to_owned(),
        body.to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_token_is_the_gateways_password_for_the_pools_its_client_lists_and_no_other() {
    for (backend, web, other) in [
        (Backend::Embedded, "cweb", "cother"),
        (Backend::Redis, "cweb2", "cother2"),
    ] {
        let mut config = backend_config(backend);
        config.worker_token = Some(TOKEN.to_owned());
        config.gateway_listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
        config.gateway_socks_listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
        let app = TestApp::spawn_with(config).await;
        let site = target(None).await;
        let proxy = http_proxy().await;
        for pool in [web, other] {
            proxy_pool(&app, pool).await;
            app.seed(pool, &[&member("http", &proxy)], None).await;
        }
        let (status, created) = read(
            app.admin(Method::PUT, "/clients/team-a")
                .json(&json!({ "pools": [web] }))
                .send()
                .await
                .expect("sent"),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{created}");
        let token = created["token"].as_str().expect("a token").to_owned();
        let url = format!("http://127.0.0.1:{}/health", site.port());
        let http = format!("http://{}", gateway(&app));
        let socks = format!("socks5h://{}", app.socks.expect("the SOCKS5 port listens"));

        // Forwarded, tunnelled and over SOCKS5: the pool the client lists.
        for extra in [&[][..], &["--proxytunnel"][..]] {
            let connect = if extra.is_empty() { "000" } else { "200" };
            assert_eq!(
                curl_as(&http, web, &token, extra, &url).await,
                (0, format!("200 {connect}"), HEALTHY.to_owned()),
                "{backend:?} {extra:?}"
            );
        }
        assert_eq!(
            curl_as(&socks, web, &token, &[], &url).await,
            (0, "200 000".to_owned(), HEALTHY.to_owned()),
            "{backend:?} SOCKS5"
        );
        // Another pool: 403 on the HTTP gateway, a failed authentication over SOCKS5.
        for extra in [&[][..], &["--proxytunnel"][..]] {
            let (_, status, body) = curl_as(&http, other, &token, extra, &url).await;
            let expected = if extra.is_empty() {
                "403 000"
            } else {
                "000 403"
            };
            assert_eq!(status, expected, "{backend:?} {extra:?}");
            if extra.is_empty() {
                assert_eq!(
                    serde_json::from_str::<Value>(&body).expect("JSON"),
                    error(
                        "pool_not_allowed",
                        "this client's token is not for this pool"
                    )
                );
            }
        }
        let (code, _, _) = curl_as(&socks, other, &token, &[], &url).await;
        assert_eq!(
            code, 97,
            "{backend:?}: curl's code for a refused SOCKS5 login"
        );
        // A token nobody has: 407.
        let (_, status, _) = curl_as(&http, web, "not-a-token", &[], &url).await;
        assert_eq!(status, "407 000");
        // Three requests through the listed pool's member, none through the other's.
        assert_eq!(health(&app, web).await[0].1, 3, "{backend:?}");
        assert_eq!(health(&app, other).await[0].1, 0, "{backend:?}");
        app.stop().await;
    }
}
