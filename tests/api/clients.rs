//! Clients: tokens of their own for the pools they list (`PUT /clients/{client}`), on every
//! store, through the API.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{Backend, TestApp, assert_error, backend_config, read};

const WORKER: &str = "test-worker-token";

const BACKENDS: [Backend; 3] = [Backend::Embedded, Backend::Redis, Backend::Durable];

async fn spawn(backend: Backend) -> TestApp {
    let mut config = backend_config(backend);
    config.worker_token = Some(WORKER.to_owned());
    TestApp::spawn_with(config).await
}

async fn put_client(app: &TestApp, client: &str, body: &Value) -> (StatusCode, Value) {
    read(
        app.admin(Method::PUT, &format!("/clients/{client}"))
            .json(body)
            .send()
            .await
            .expect("sent"),
    )
    .await
}

/// A new client's token.
async fn token_of(app: &TestApp, client: &str, pools: &[&str]) -> String {
    let (status, body) = put_client(app, client, &json!({ "pools": pools })).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    body["token"].as_str().expect("a token").to_owned()
}

/// An assign on `pool` with `token`: its status and body.
async fn assign_with(app: &TestApp, pool: &str, token: &str) -> (StatusCode, Value) {
    read(
        app.anonymous(Method::POST, &format!("/pools/{pool}/assign"))
            .bearer_auth(token)
            .send()
            .await
            .expect("sent"),
    )
    .await
}

/// Pools with one member each.
async fn pools(app: &TestApp, ids: &[&str]) {
    for id in ids {
        app.create_pool(id, json!({})).await;
        app.seed(id, &[&format!("http://{id}.example:3128")], None)
            .await;
    }
}

#[tokio::test]
async fn a_client_is_created_with_a_token_shown_once_and_shown_without_it_afterwards() {
    for backend in BACKENDS {
        let app = spawn(backend).await;
        let (status, created) =
            put_client(&app, "team-a", &json!({"pools": ["web", "eu-*"]})).await;
        assert_eq!(status, StatusCode::CREATED);
        let token = created["token"].as_str().expect("a token");
        assert_eq!(token.len(), 43, "{backend:?}");
        assert_eq!(
            created,
            json!({"client": "team-a", "pools": ["web", "eu-*"], "token": token})
        );
        assert_eq!(
            app.get("/clients/team-a").await,
            (
                StatusCode::OK,
                json!({"client": "team-a", "pools": ["web", "eu-*"]})
            )
        );
        // Replaced: the pools change, the token stays and is not shown again.
        assert_eq!(
            put_client(&app, "team-a", &json!({"pools": ["web"]})).await,
            (
                StatusCode::OK,
                json!({"client": "team-a", "pools": ["web"]})
            )
        );
        token_of(&app, "team-b", &["*"]).await;
        assert_eq!(
            app.get("/clients").await,
            (
                StatusCode::OK,
                json!({"clients": [
                    {"client": "team-a", "pools": ["web"]},
                    {"client": "team-b", "pools": ["*"]},
                ]})
            )
        );
        let deleted = app
            .admin(Method::DELETE, "/clients/team-b")
            .send()
            .await
            .expect("sent");
        assert_eq!(deleted.status(), StatusCode::NO_CONTENT);
        let (status, body) = app.get("/clients/team-b").await;
        assert_error(status, &body, StatusCode::NOT_FOUND, "client_not_found");
        let again = app
            .admin(Method::DELETE, "/clients/team-b")
            .send()
            .await
            .expect("sent");
        let (status, body) = read(again).await;
        assert_error(status, &body, StatusCode::NOT_FOUND, "client_not_found");
        if let Some(check) = app.durability_check() {
            check.verify().await;
        }
        app.stop().await;
    }
}

#[tokio::test]
async fn a_client_token_opens_the_pools_its_client_lists_and_no_other() {
    for backend in BACKENDS {
        let app = spawn(backend).await;
        pools(&app, &["web", "eu-west", "us-east"]).await;
        let token = token_of(&app, "team-a", &["web", "eu-*"]).await;
        for pool in ["web", "eu-west"] {
            let (status, body) = assign_with(&app, pool, &token).await;
            assert_eq!(status, StatusCode::OK, "{backend:?} {pool}: {body}");
            assert_eq!(body["proxy"], json!(format!("http://{pool}.example:3128")));
        }
        let (status, body) = assign_with(&app, "us-east", &token).await;
        assert_error(status, &body, StatusCode::FORBIDDEN, "pool_not_allowed");
        // Outcome reports are worker routes too.
        let report = app
            .anonymous(Method::POST, "/pools/us-east/outcomes")
            .bearer_auth(&token)
            .json(&json!({"proxy": "http://us-east.example:3128", "result": "success"}))
            .send()
            .await
            .expect("sent");
        let (status, body) = read(report).await;
        assert_error(status, &body, StatusCode::FORBIDDEN, "pool_not_allowed");
        // The worker token still opens every pool; an unknown token none.
        let (status, _) = assign_with(&app, "us-east", WORKER).await;
        assert_eq!(status, StatusCode::OK);
        let (status, body) = assign_with(&app, "web", "not-a-client-token").await;
        assert_error(status, &body, StatusCode::UNAUTHORIZED, "unauthorized");
        // A client token is no admin token.
        let listing = app
            .anonymous(Method::GET, "/clients")
            .bearer_auth(&token)
            .send()
            .await
            .expect("sent");
        let (status, body) = read(listing).await;
        assert_error(status, &body, StatusCode::UNAUTHORIZED, "unauthorized");
        app.stop().await;
    }
}

#[tokio::test]
async fn a_rotated_token_replaces_the_old_one_at_once_and_a_deleted_client_opens_nothing() {
    for backend in BACKENDS {
        let app = spawn(backend).await;
        pools(&app, &["web"]).await;
        let old = token_of(&app, "team-a", &["web"]).await;
        let (status, rotated) = read(
            app.admin(Method::POST, "/clients/team-a/token")
                .send()
                .await
                .expect("sent"),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        let new = rotated["token"].as_str().expect("a token").to_owned();
        assert_eq!(rotated, json!({"client": "team-a", "token": new}));
        assert_ne!(new, old);
        let (status, body) = assign_with(&app, "web", &old).await;
        assert_error(status, &body, StatusCode::UNAUTHORIZED, "unauthorized");
        assert_eq!(assign_with(&app, "web", &new).await.0, StatusCode::OK);
        let (status, body) = read(
            app.admin(Method::POST, "/clients/nobody/token")
                .send()
                .await
                .expect("sent"),
        )
        .await;
        assert_error(status, &body, StatusCode::NOT_FOUND, "client_not_found");
        // Another client, whose token a restart must keep (the durable store's check).
        token_of(&app, "team-b", &["web"]).await;
        let deleted = app
            .admin(Method::DELETE, "/clients/team-a")
            .send()
            .await
            .expect("sent");
        assert_eq!(deleted.status(), StatusCode::NO_CONTENT);
        let (status, body) = assign_with(&app, "web", &new).await;
        assert_error(status, &body, StatusCode::UNAUTHORIZED, "unauthorized");
        if let Some(check) = app.durability_check() {
            check.verify().await;
        }
        app.stop().await;
    }
}

#[tokio::test]
async fn hostile_client_ids_and_bodies_are_refused_with_the_field_named() {
    let app = spawn(Backend::Embedded).await;
    for bad in ["-a", "a{b}", "a:b", &"x".repeat(65)] {
        let (status, body) = put_client(&app, bad, &json!({"pools": []})).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_client_id");
    }
    let many: Vec<String> = (0..10_000).map(|i| format!("p{i}")).collect();
    let (status, body) = put_client(&app, "team-a", &json!({ "pools": many })).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_request");
    assert_eq!(
        body["error"]["message"],
        json!("pools: at most 100 patterns, got 10000")
    );
    let (status, body) = put_client(&app, "team-a", &json!({"pools": ["web", "e*u"]})).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_request");
    assert!(
        body["error"]["message"]
            .as_str()
            .expect("a message")
            .starts_with("pools[1]: "),
        "{body}"
    );
    // A limit this version does not enforce is refused rather than silently ignored.
    let (status, body) = put_client(
        &app,
        "team-a",
        &json!({"pools": ["web"], "max_open_tunnels": 20}),
    )
    .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_json");
    let (status, body) = app.get("/clients").await;
    assert_eq!((status, body), (StatusCode::OK, json!({"clients": []})));
    app.stop().await;
}
