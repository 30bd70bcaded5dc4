//! Tokens: admin routes need the admin token, worker routes the worker token when one is
//! configured, probes need nothing.

use proxy_allocator::http::{Access, routes};
use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::helpers::{ADMIN, TestApp, assert_error, concrete_path, read, test_config};

const WORKER: &str = "test-worker-token";

/// Method and concrete path of every route the table declares with `access`.
fn routes_for(access: Access) -> Vec<(Method, String)> {
    let found: Vec<(Method, String)> = routes()
        .iter()
        .filter(|route| route.access == access)
        .map(|route| (route.method.clone(), concrete_path(route.path)))
        .collect();
    assert!(!found.is_empty(), "no {access:?} route in the table");
    found
}

async fn spawn_with_worker_token() -> TestApp {
    let mut config = test_config(None);
    config.worker_token = Some(WORKER.to_owned());
    TestApp::spawn_with(config).await
}

/// Status and body of `method path` with `token` (none when `None`). No body: the token is
/// checked before the body is read, so it alone decides between 401, 403 and the rest.
async fn call(
    app: &TestApp,
    method: &Method,
    path: &str,
    token: Option<&str>,
) -> (StatusCode, Option<String>, String) {
    let mut request = app.anonymous(method.clone(), path);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("sent");
    let status = response.status();
    let challenge = response
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().expect("ascii").to_owned());
    (status, challenge, response.text().await.expect("a body"))
}

/// Whether an answer shows the token was taken: anything but 401 and 403.
fn let_through(status: StatusCode) -> bool {
    status != StatusCode::UNAUTHORIZED && status != StatusCode::FORBIDDEN
}

#[tokio::test]
async fn every_admin_route_answers_401_without_a_token_or_with_a_wrong_one() {
    let app = spawn_with_worker_token().await;
    for (method, path) in routes_for(Access::Admin) {
        for token in [None, Some("wrong"), Some(""), Some("test-admin-tokeN")] {
            let (status, challenge, text) = call(&app, &method, &path, token).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{method} {path}: {text}");
            let body = serde_json::from_str(&text).expect("a JSON body");
            assert_error(status, &body, StatusCode::UNAUTHORIZED, "unauthorized");
            assert_eq!(challenge.as_deref(), Some("Bearer"), "{method} {path}");
        }
    }
}

#[tokio::test]
async fn the_worker_token_on_an_admin_route_answers_403() {
    let app = spawn_with_worker_token().await;
    for (method, path) in routes_for(Access::Admin) {
        let (status, _, text) = call(&app, &method, &path, Some(WORKER)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {path}: {text}");
        let body = serde_json::from_str(&text).expect("a JSON body");
        assert_error(status, &body, StatusCode::FORBIDDEN, "forbidden");
    }
}

#[tokio::test]
async fn the_admin_token_is_let_through_on_every_admin_route() {
    let app = spawn_with_worker_token().await;
    for (method, path) in routes_for(Access::Admin) {
        let (status, _, text) = call(&app, &method, &path, Some(ADMIN)).await;
        assert!(let_through(status), "{method} {path}: {status} {text}");
    }
}

#[tokio::test]
async fn every_worker_route_answers_401_without_the_worker_token_when_one_is_set() {
    let app = spawn_with_worker_token().await;
    for (method, path) in routes_for(Access::Worker) {
        for token in [None, Some("wrong"), Some(""), Some("test-worker-tokeN")] {
            let (status, challenge, text) = call(&app, &method, &path, token).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{method} {path}: {text}");
            let body = serde_json::from_str(&text).expect("a JSON body");
            assert_error(status, &body, StatusCode::UNAUTHORIZED, "unauthorized");
            assert_eq!(challenge.as_deref(), Some("Bearer"), "{method} {path}");
        }
    }
}

#[tokio::test]
async fn every_worker_route_lets_the_worker_and_the_admin_token_through() {
    let app = spawn_with_worker_token().await;
    for (method, path) in routes_for(Access::Worker) {
        for token in [WORKER, ADMIN] {
            let (status, _, text) = call(&app, &method, &path, Some(token)).await;
            assert!(let_through(status), "{method} {path}: {status} {text}");
        }
    }
}

#[tokio::test]
async fn every_worker_route_is_open_when_no_worker_token_is_configured() {
    let app = TestApp::spawn(crate::helpers::Backend::Embedded).await;
    for (method, path) in routes_for(Access::Worker) {
        let (status, _, text) = call(&app, &method, &path, None).await;
        assert!(let_through(status), "{method} {path}: {status} {text}");
    }
}

#[tokio::test]
async fn every_open_route_needs_no_token_even_when_a_worker_token_is_set() {
    let app = spawn_with_worker_token().await;
    for (method, path) in routes_for(Access::Open) {
        let (status, _, text) = call(&app, &method, &path, None).await;
        assert_eq!(status, StatusCode::OK, "{method} {path}: {text}");
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
