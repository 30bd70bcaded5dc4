//! Hostile input on every route: malformed bodies, odd pool ids, script-looking member ids,
//! huge headers and clients that trickle their request.

use std::time::{Duration, Instant};

use proxy_allocator::http::{RouteBody, routes};
use reqwest::{Method, StatusCode};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::{
    Backend, TestApp, assert_error, concrete_path, raw_request, read, test_config,
};

/// Method, concrete path and body kind of every route of the table that reads a body.
fn body_routes() -> Vec<(Method, String, RouteBody)> {
    routes()
        .iter()
        .filter(|route| route.body != RouteBody::Ignored)
        .map(|route| (route.method.clone(), concrete_path(route.path), route.body))
        .collect()
}

/// Method and path template of every route of the table with a pool id in its path.
fn pool_routes() -> Vec<(Method, &'static str)> {
    routes()
        .iter()
        .filter(|route| route.path.contains("{pool}"))
        .map(|route| (route.method.clone(), route.path))
        .collect()
}

#[tokio::test]
async fn malformed_json_on_every_body_route_answers_400_invalid_json() {
    let app = TestApp::spawn(Backend::Embedded).await;
    app.create_pool("p", json!({})).await;
    let nested = format!("{}1{}", "{\"a\":".repeat(5_000), "}".repeat(5_000));
    for (method, path, _) in body_routes() {
        for body in [
            "{",
            "[",
            "{\"members\": [1, 2]}",
            "\"text\"",
            "\u{0}",
            nested.as_str(),
            "{\"members\": []}{",
        ] {
            let response = app
                .admin(method.clone(), &path)
                .header("content-type", "application/json")
                .body(body.to_owned())
                .send()
                .await
                .expect("sent");
            let (status, answer) = read(response).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{method} {path}: {answer}");
            assert_error(status, &answer, StatusCode::BAD_REQUEST, "invalid_json");
        }
    }
}

#[tokio::test]
async fn a_json_array_on_every_route_that_takes_an_object_answers_400_invalid_json() {
    let app = TestApp::spawn(Backend::Embedded).await;
    app.create_pool("p", json!({})).await;
    // A proxy list may be a JSON array, and outcome reports a batch of objects; nothing
    // else may be read into a body's fields by position.
    let object_routes: Vec<_> = body_routes()
        .into_iter()
        .filter(|(_, _, body)| *body != RouteBody::List)
        .collect();
    assert!(object_routes.len() >= 8, "{object_routes:?}");
    for (method, path, _) in object_routes {
        for body in ["[null, null]", "[1, 2]", "7", "null"] {
            let response = app
                .admin(method.clone(), &path)
                .header("content-type", "application/json")
                .body(body.to_owned())
                .send()
                .await
                .expect("sent");
            let (status, answer) = read(response).await;
            assert_eq!(
                status,
                StatusCode::BAD_REQUEST,
                "{method} {path} {body}: {answer}"
            );
            assert_eq!(
                answer["error"]["code"], "invalid_json",
                "{method} {path} {body}"
            );
            let message = answer["error"]["message"].as_str().unwrap_or_default();
            assert!(
                message.starts_with("the body must be a JSON object"),
                "{method} {path} {body}: {answer}"
            );
        }
    }
}

#[tokio::test]
async fn an_empty_array_is_a_batch_of_no_outcomes_and_no_assign_at_all() {
    let app = TestApp::spawn(Backend::Embedded).await;
    app.create_pool("p", json!({})).await;
    for (path, status) in [
        ("/pools/p/outcomes", StatusCode::OK),
        ("/pools/p/assign", StatusCode::BAD_REQUEST),
    ] {
        let response = app
            .admin(Method::POST, path)
            .header("content-type", "application/json")
            .body("[]")
            .send()
            .await
            .expect("sent");
        let (got, answer) = read(response).await;
        assert_eq!(got, status, "{path}: {answer}");
    }
}

#[tokio::test]
async fn wrong_content_types_on_every_body_route_answer_415() {
    let app = TestApp::spawn(Backend::Embedded).await;
    app.create_pool("p", json!({})).await;
    for (method, path, body) in body_routes() {
        for content_type in [
            "text/plain",
            "application/xml",
            "multipart/form-data",
            "application/jsonx",
        ] {
            // A proxy list may come as text.
            if body == RouteBody::List && content_type == "text/plain" {
                continue;
            }
            let response = app
                .admin(method.clone(), &path)
                .header("content-type", content_type)
                .body(r#"{"members": ["a"]}"#)
                .send()
                .await
                .expect("sent");
            let (status, answer) = read(response).await;
            assert_eq!(
                status,
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "{method} {path} as {content_type}: {answer}"
            );
            assert_error(
                status,
                &answer,
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
            );
        }
    }
}

#[tokio::test]
async fn bodies_over_the_limit_on_every_body_route_answer_413() {
    let mut config = test_config(None);
    config.body_limit_bytes = 4096;
    config.import_body_limit_bytes = 8192;
    let app = TestApp::spawn_with(config).await;
    app.create_pool("p", json!({})).await;
    let big = json!({ "members": vec!["x".repeat(100); 100] });
    for (method, path, _) in body_routes() {
        let response = app
            .admin(method.clone(), &path)
            .json(&big)
            .send()
            .await
            .expect("sent");
        let (status, answer) = read(response).await;
        assert_eq!(
            status,
            StatusCode::PAYLOAD_TOO_LARGE,
            "{method} {path}: {answer}"
        );
        assert_error(
            status,
            &answer,
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
        );
    }
}

/// The table's `RouteBody::Ignored` is true of the handler: a route declared to read no
/// body answers the same with malformed JSON attached as without it.
#[tokio::test]
async fn routes_that_read_no_body_ignore_one() {
    let app = TestApp::spawn(Backend::Embedded).await;
    // Each call finds the pool as it was: a DELETE must not leave the next call a 404.
    let fresh_pool = || async {
        let response = app
            .admin(Method::PUT, "/pools/p")
            .json(&json!({}))
            .send()
            .await;
        assert!(response.expect("sent").status().is_success());
    };
    for route in routes()
        .iter()
        .filter(|route| route.body == RouteBody::Ignored)
    {
        let path = concrete_path(route.path);
        fresh_pool().await;
        let plain = app
            .admin(route.method.clone(), &path)
            .send()
            .await
            .expect("sent")
            .status();
        fresh_pool().await;
        let with_body = app
            .admin(route.method.clone(), &path)
            .header("content-type", "application/json")
            .body("{")
            .send()
            .await
            .expect("sent")
            .status();
        assert_eq!(with_body, plain, "{} {path}", route.method);
        assert!(
            plain != StatusCode::BAD_REQUEST && plain != StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "{} {path}: {plain}",
            route.method
        );
    }
}

#[tokio::test]
async fn odd_pool_ids_on_every_pool_route_answer_400_invalid_pool_id() {
    let app = TestApp::spawn(Backend::Embedded).await;
    let long = "a".repeat(65);
    let ids = [
        "%7B",
        "%7D",
        "a%7Bb%7D",
        "*",
        "..",
        "%2e%2e",
        "%00",
        "caf%C3%A9",
        "%F0%9F%92%A9",
        long.as_str(),
        "-x",
        "a%20b",
        "a%0D%0AFLUSHALL",
    ];
    for (method, template) in pool_routes() {
        for id in ids {
            let path = concrete_path(&template.replace("{pool}", "@pool@")).replace("@pool@", id);
            let request = format!(
                "{method} {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {}\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{{}}",
                crate::helpers::ADMIN
            );
            let (status, body) = raw_request(&app.base, &request).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{method} {path}: {body}");
            assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_pool_id");
        }
    }
}

async fn script_looking_member_ids_are_stored_and_returned_byte_for_byte(app: TestApp) {
    app.create_pool("p", json!({})).await;
    let ids = [
        "*3$3DEL$1k",
        "redis.call('FLUSHALL')",
        "]];os.exit()--",
        "KEYS*",
        "{p}:eligible",
        "\"quoted\"\\slash",
        "%00%0d%0a",
        "pa:{p}:meta",
    ];
    let (status, body) = app
        .post_json(
            "/pools/p/members",
            json!({"members": ids, "assignments": 0}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["added"], json!(ids));
    let mut handed_out: Vec<String> = Vec::new();
    for _ in 0..ids.len() {
        handed_out.push(app.assigned("p").await.0);
    }
    let mut expected: Vec<String> = ids.iter().map(|s| (*s).to_owned()).collect();
    expected.sort();
    assert_eq!(handed_out, expected, "byte order, byte for byte");
    let (_, info) = app.get("/pools/p").await;
    assert_eq!(info["stats"]["eligible"], json!(ids.len()));
    let (status, body) = app
        .post_json(
            "/pools/p/members/disable",
            json!({"members": ["{p}:eligible"]}),
        )
        .await;
    assert_eq!(
        (status, &body["disabled"]),
        (StatusCode::OK, &json!(["{p}:eligible"]))
    );
}

crate::for_each_store!(script_looking_member_ids_are_stored_and_returned_byte_for_byte);

#[tokio::test]
async fn member_ids_with_control_characters_or_over_512_bytes_are_rejected_with_reasons() {
    let app = TestApp::spawn(Backend::Embedded).await;
    app.create_pool("p", json!({})).await;
    let long = "m".repeat(513);
    let (status, body) = app
        .post_json(
            "/pools/p/members",
            json!({"members": ["a b", "\r\n*3\r\n$3\r\nDEL", "\u{7f}", "é", long]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let reasons: Vec<&str> = body["rejected"]
        .as_array()
        .expect("rejected")
        .iter()
        .map(|r| r["reason"].as_str().expect("reason"))
        .collect();
    assert_eq!(
        reasons,
        [
            "invalid_characters",
            "invalid_characters",
            "invalid_characters",
            "invalid_characters",
            "too_long"
        ]
    );
    assert_eq!(body["added"], json!([]));
}

#[tokio::test]
async fn a_request_head_over_64_kib_is_refused_with_431() {
    let app = TestApp::spawn(Backend::Embedded).await;
    let response = app
        .anonymous(Method::GET, "/livez")
        .header("x-padding", "p".repeat(100 * 1024))
        .send()
        .await;
    // hyper refuses the head before any handler runs, so this answer has no JSON body.
    match response {
        Ok(response) => assert_eq!(
            response.status(),
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
        ),
        Err(error) => panic!("expected a 431 answer, got {error}"),
    }
    assert_eq!(
        app.anonymous(Method::GET, "/livez")
            .send()
            .await
            .expect("sent")
            .status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_client_trickling_its_headers_is_cut_off_and_does_not_block_others() {
    let mut config = test_config(None);
    config.header_read_timeout_ms = 500;
    let app = TestApp::spawn_with(config).await;
    app.create_pool("p", json!({})).await;
    app.seed("p", &["a"], None).await;
    let addr = app.base.trim_start_matches("http://").to_owned();
    let slow = tokio::spawn(async move {
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .expect("connected");
        let started = Instant::now();
        for byte in b"POST /pools/p/assign HTTP/1.1\r\nhost: x\r\n"
            .iter()
            .cycle()
            .take(400)
        {
            if stream.write_all(&[*byte]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest)).await;
        started.elapsed()
    });
    // Meanwhile everybody else is served at once.
    for _ in 0..20 {
        let started = Instant::now();
        assert_eq!(app.assign("p").await.0, StatusCode::OK);
        assert!(started.elapsed() < Duration::from_millis(200));
    }
    let held = slow.await.expect("finished");
    assert!(
        held < Duration::from_secs(4),
        "the trickling client was held for {held:?}"
    );
}
