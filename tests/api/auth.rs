//! Tokens: admin routes need the admin token, worker routes the worker token when one is
//! configured, probes need nothing.

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::helpers::{ADMIN, TestApp, assert_error, read, test_config};

const WORKER: &str = "test-worker-token";

/// Every admin route with a body that would be valid, so only the token decides.
fn admin_routes() -> Vec<(Method, &'static str, Option<serde_json::Value>)> {
    let members = Some(json!({"members": ["a"]}));
    vec![
        (Method::GET, "/pools", None),
        (Method::PUT, "/pools/p", Some(json!({}))),
        (Method::GET, "/pools/p", None),
        (Method::DELETE, "/pools/p", None),
        (Method::POST, "/pools/p/members", members.clone()),
        (Method::GET, "/pools/p/members", None),
        (Method::POST, "/pools/p/members/disable", members.clone()),
        (Method::POST, "/pools/p/members/enable", members.clone()),
        (Method::POST, "/pools/p/members/remove", members),
    ]
}

async fn spawn_with_worker_token() -> TestApp {
    let mut config = test_config(None);
    config.worker_token = Some(WORKER.to_owned());
    TestApp::spawn_with(config).await
}

#[tokio::test]
async fn every_admin_route_answers_401_without_a_token_or_with_a_wrong_one() {
    let app = spawn_with_worker_token().await;
    for (method, path, body) in admin_routes() {
        for token in [None, Some("wrong"), Some(""), Some("test-admin-tokeN")] {
            let mut request = app.anonymous(method.clone(), path);
            if let Some(token) = token {
                request = request.bearer_auth(token);
            }
            if let Some(body) = &body {
                request = request.json(body);
            }
            let response = request.send().await.expect("sent");
            let challenge = response.headers().get("www-authenticate").cloned();
            let (status, body) = read(response).await;
            assert_error(status, &body, StatusCode::UNAUTHORIZED, "unauthorized");
            assert_eq!(
                challenge.as_ref().map(|v| v.as_bytes()),
                Some(&b"Bearer"[..])
            );
        }
    }
}

#[tokio::test]
async fn the_worker_token_on_an_admin_route_answers_403() {
    let app = spawn_with_worker_token().await;
    for (method, path, body) in admin_routes() {
        let mut request = app.anonymous(method.clone(), path).bearer_auth(WORKER);
        if let Some(body) = &body {
            request = request.json(body);
        }
        let (status, body) = read(request.send().await.expect("sent")).await;
        assert_error(status, &body, StatusCode::FORBIDDEN, "forbidden");
    }
}

#[tokio::test]
async fn a_token_in_the_query_string_is_not_accepted() {
    let app = spawn_with_worker_token().await;
    for query in [format!("?token={ADMIN}"), format!("?access_token={ADMIN}")] {
        let (status, body) = read(
            app.anonymous(Method::GET, &format!("/pools{query}"))
                .send()
                .await
                .expect("sent"),
        )
        .await;
        assert_error(status, &body, StatusCode::UNAUTHORIZED, "unauthorized");
    }
}

#[tokio::test]
async fn assign_needs_the_worker_or_admin_token_when_a_worker_token_is_set() {
    let app = spawn_with_worker_token().await;
    app.create_pool("p", json!({})).await;
    app.seed("p", &["a"], None).await;
    let (status, body) = app.assign("p").await;
    assert_error(status, &body, StatusCode::UNAUTHORIZED, "unauthorized");
    for token in [WORKER, ADMIN] {
        let response = app
            .anonymous(Method::POST, "/pools/p/assign")
            .bearer_auth(token)
            .send()
            .await
            .expect("sent");
        assert_eq!(response.status(), StatusCode::OK);
    }
}

#[tokio::test]
async fn assign_is_open_when_no_worker_token_is_configured() {
    let app = TestApp::spawn(crate::helpers::Backend::Embedded).await;
    app.create_pool("p", json!({})).await;
    app.seed("p", &["a"], None).await;
    assert_eq!(app.assign("p").await.0, StatusCode::OK);
}

#[tokio::test]
async fn probes_need_no_token() {
    let app = spawn_with_worker_token().await;
    for path in ["/livez", "/readyz"] {
        let response = app.anonymous(Method::GET, path).send().await.expect("sent");
        assert_eq!(response.status(), StatusCode::OK, "{path}");
    }
}

#[tokio::test]
async fn the_admin_token_can_come_from_a_file() {
    let path = std::env::temp_dir().join(format!("pa-admin-token-{}", rand::random::<u64>()));
    std::fs::write(&path, "  from-a-file\n").expect("written");
    let mut config = test_config(None);
    config.admin_token = None;
    config.admin_token_file = Some(path.clone());
    let app = TestApp::spawn_with(config).await;
    let response = app
        .anonymous(Method::GET, "/pools")
        .bearer_auth("from-a-file")
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::OK);
    let _ = std::fs::remove_file(path);
}

#[tokio::test]
async fn without_any_admin_token_configured_admin_routes_stay_closed() {
    let mut config = test_config(None);
    config.admin_token = None;
    let app = TestApp::spawn_with(config).await;
    for token in ["", ADMIN] {
        let response = app
            .anonymous(Method::GET, "/pools")
            .bearer_auth(token)
            .send()
            .await
            .expect("sent");
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    }
}
