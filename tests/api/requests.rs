//! Malformed requests: every rejection uses the one JSON error shape with a stable code.

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::helpers::{Backend, TestApp, assert_error, read, test_config};

#[tokio::test]
async fn unknown_routes_answer_404_not_found_in_the_error_shape() {
    let app = TestApp::spawn(Backend::Embedded).await;
    for path in ["/nope", "/pools/p/unknown", "/pools/p/members/x"] {
        let (status, body) = read(app.admin(Method::GET, path).send().await.expect("sent")).await;
        assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");
    }
}

#[tokio::test]
async fn wrong_methods_answer_405_in_the_error_shape() {
    let app = TestApp::spawn(Backend::Embedded).await;
    for (method, path) in [
        (Method::GET, "/pools/p/assign"),
        (Method::DELETE, "/livez"),
        (Method::POST, "/pools"),
        // PATCH /pools/{pool} is a route now (a merge patch); a pool's assign takes none.
        (Method::PATCH, "/pools/p/assign"),
    ] {
        let (status, body) = read(app.admin(method, path).send().await.expect("sent")).await;
        assert_error(
            status,
            &body,
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
        );
    }
}

#[tokio::test]
async fn malformed_json_answers_400_invalid_json() {
    let app = TestApp::spawn(Backend::Embedded).await;
    app.create_pool("p", json!({})).await;
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    for body in [
        "{",
        "{\"members\": [1]}",
        "{\"members\": \"a\"}",
        "null",
        deep.as_str(),
        "{\"members\": []} x",
    ] {
        let response = app
            .admin(Method::POST, "/pools/p/members")
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
            .await
            .expect("sent");
        let (status, body) = read(response).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_json");
    }
}

#[tokio::test]
async fn a_body_without_a_json_content_type_answers_415() {
    let app = TestApp::spawn(Backend::Embedded).await;
    app.create_pool("p", json!({})).await;
    for content_type in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
    ] {
        let mut request = app
            .admin(Method::POST, "/pools/p/members")
            .body(r#"{"members": ["a"]}"#);
        if let Some(ct) = content_type {
            request = request.header("content-type", ct);
        }
        let (status, body) = read(request.send().await.expect("sent")).await;
        assert_error(
            status,
            &body,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
        );
    }
    let response = app
        .admin(Method::POST, "/pools/p/members")
        .header("content-type", "application/json; charset=utf-8")
        .body(r#"{"members": ["a"]}"#)
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_body_over_the_limit_answers_413_payload_too_large() {
    let mut config = test_config(None);
    config.body_limit_bytes = 1024;
    let app = TestApp::spawn_with(config).await;
    app.create_pool("p", json!({})).await;
    let members: Vec<String> = (0..200).map(|i| format!("member-{i}")).collect();
    let (status, body) = app
        .post_json("/pools/p/members", json!({ "members": members }))
        .await;
    assert_error(
        status,
        &body,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
    );
    let (status, _) = app
        .post_json("/pools/p/members", json!({ "members": ["small"] }))
        .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn a_disable_reason_longer_than_256_bytes_answers_400_invalid_request() {
    let app = TestApp::spawn(Backend::Embedded).await;
    app.create_pool("p", json!({})).await;
    let (status, body) = app
        .post_json(
            "/pools/p/members/disable",
            json!({"members": ["a"], "reason": "r".repeat(257)}),
        )
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_request");
}

#[tokio::test]
async fn readyz_names_the_embedded_store() {
    let app = TestApp::spawn(Backend::Embedded).await;
    let (status, body) = app.probe("/readyz").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body,
        json!({"status": "ready", "store": "embedded", "topology": "in-process"})
    );
    let (status, body) = read(
        app.anonymous(Method::GET, "/livez")
            .send()
            .await
            .expect("sent"),
    )
    .await;
    assert_eq!((status, body), (StatusCode::OK, json!({"status": "ok"})));
}

#[tokio::test]
async fn stopping_the_app_lets_it_finish_and_closes_its_listener() {
    let app = TestApp::spawn(Backend::Embedded).await;
    let base = app.base.clone();
    app.stop().await;
    let refused = reqwest::Client::new()
        .get(format!("{base}/livez"))
        .send()
        .await;
    assert!(refused.is_err(), "the listener is closed after stop");
}

#[tokio::test]
async fn a_whole_float_in_an_assign_field_read_as_json_is_an_integer_too() {
    // `session_ttl_ms` reaches the handler as JSON; `5000.0` must arrive as 5000 there, as
    // it does in a typed integer field.
    let app = TestApp::spawn(Backend::Embedded).await;
    app.create_pool("p", json!({})).await;
    app.seed("p", &["a"], Some(0)).await;
    let (status, body) = app
        .post_json(
            "/pools/p/assign",
            json!({"session": "s", "session_ttl_ms": 5000.0}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["proxy"], json!("a"));
    let (status, body) = app
        .post_json(
            "/pools/p/assign",
            json!({"session": "t", "session_ttl_ms": 5000.5}),
        )
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_request");
}

#[tokio::test]
async fn whole_numbers_written_as_floats_are_integers_and_fractions_are_refused() {
    let app = TestApp::spawn(Backend::Embedded).await;
    app.create_pool("p", json!({})).await;
    let (status, body) = app
        .post_json(
            "/pools/p/members",
            json!({"members": ["a"], "assignments": 3.0}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["start_assignments"], json!(3));
    let (status, body) = app
        .post_json(
            "/pools/p/members",
            json!({"members": ["b"], "assignments": 3.5}),
        )
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_json");
}
