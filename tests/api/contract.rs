//! The OpenAPI contract: `openapi.yaml` documents exactly the routes the router serves,
//! checked against the route table and against the running router itself.

use std::collections::BTreeSet;

use proxy_allocator::http::routes;
use reqwest::{Method, StatusCode};

use crate::helpers::{Backend, TestApp, concrete_path};

fn spec() -> serde_yaml::Value {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.yaml"))
        .expect("openapi.yaml at the crate root");
    serde_yaml::from_str(&text).expect("openapi.yaml is valid YAML")
}

fn documented() -> BTreeSet<(String, String)> {
    let spec = spec();
    let paths = spec["paths"].as_mapping().expect("a paths object");
    let mut operations = BTreeSet::new();
    for (path, item) in paths {
        let path = path.as_str().expect("path keys are strings");
        for (method, _) in item.as_mapping().expect("a path item") {
            let method = method.as_str().expect("method keys are strings");
            if ["get", "put", "post", "delete", "patch", "head", "options"].contains(&method) {
                operations.insert((path.to_owned(), method.to_uppercase()));
            }
        }
    }
    operations
}

#[test]
fn every_route_is_documented_and_every_documented_route_exists() {
    let served: BTreeSet<(String, String)> = routes()
        .iter()
        .map(|r| (r.path.to_owned(), r.method.to_string()))
        .collect();
    let documented = documented();
    let undocumented: Vec<_> = served.difference(&documented).collect();
    let missing: Vec<_> = documented.difference(&served).collect();
    assert!(
        undocumented.is_empty(),
        "served but not in openapi.yaml: {undocumented:?}"
    );
    assert!(
        missing.is_empty(),
        "in openapi.yaml but not served: {missing:?}"
    );
}

/// The routes the book's API page lists, as `(path, method)`: the code spans of the first
/// cell of each row of its tables that name a method and a path (`| \`GET /livez\`,
/// \`GET /readyz\` |`), the query left out.
fn in_the_book() -> BTreeSet<(String, String)> {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/src/api.md"))
        .expect("the book's API page");
    page.lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split_once(" |").map(|(cell, _)| cell))
        .flat_map(|cell| cell.split('`').step_by(2).collect::<Vec<_>>())
        .filter_map(|route| route.split_once(' '))
        .filter(|(method, _)| METHODS.contains(method))
        .map(|(method, target)| {
            let path = target.split_once('?').map_or(target, |(path, _)| path);
            (path.to_owned(), method.to_owned())
        })
        .collect()
}

#[test]
fn the_books_api_page_lists_exactly_the_routes_of_the_contract() {
    let documented = documented();
    let listed = in_the_book();
    let unlisted: Vec<_> = documented.difference(&listed).collect();
    let extra: Vec<_> = listed.difference(&documented).collect();
    assert!(
        unlisted.is_empty(),
        "in openapi.yaml but not on docs/src/api.md: {unlisted:?}"
    );
    assert!(
        extra.is_empty(),
        "on docs/src/api.md but not in openapi.yaml: {extra:?}"
    );
}

/// Methods the router is asked for on every documented path.
const METHODS: [&str; 5] = ["GET", "PUT", "POST", "DELETE", "PATCH"];

/// Asks the running service for each documented path under every method: a documented
/// operation is routed (whatever its answer, it is neither 405 nor the unknown-route 404),
/// and any other method on that path answers 405 `method_not_allowed`. This reads the
/// router, not the table, so a route routed under another method than the one documented
/// fails here.
#[tokio::test]
async fn the_router_serves_every_documented_operation_and_refuses_other_methods_with_405() {
    let app = TestApp::spawn(Backend::Embedded).await;
    let documented = documented();
    let paths: BTreeSet<&String> = documented.iter().map(|(path, _)| path).collect();
    let mut wrong = Vec::new();
    for path in paths {
        for method in METHODS {
            let response = app
                .admin(
                    Method::from_bytes(method.as_bytes()).expect("a method"),
                    &concrete_path(path),
                )
                .send()
                .await
                .expect("sent");
            let status = response.status();
            let text = response.text().await.expect("a body");
            let code = serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .and_then(|body| body["error"]["code"].as_str().map(str::to_owned));
            let routed = status != StatusCode::METHOD_NOT_ALLOWED
                && code.as_deref() != Some("not_found")
                && code.as_deref() != Some("method_not_allowed");
            let expected = documented.contains(&(path.clone(), method.to_owned()));
            let refused = status == StatusCode::METHOD_NOT_ALLOWED
                && code.as_deref() == Some("method_not_allowed");
            if (expected && !routed) || (!expected && !refused) {
                wrong.push(format!("{method} {path}: {status} {text}"));
            }
        }
    }
    assert_eq!(wrong, Vec::<String>::new());
    app.stop().await;
}

#[test]
fn the_contract_is_openapi_3_1_and_every_error_uses_the_shared_shape() {
    let spec = spec();
    assert_eq!(
        spec["openapi"].as_str().map(|v| v.starts_with("3.1")),
        Some(true)
    );
    for (path, item) in spec["paths"].as_mapping().expect("paths") {
        for (method, operation) in item.as_mapping().expect("a path item") {
            if method.as_str() == Some("parameters") {
                continue;
            }
            let responses = operation["responses"].as_mapping().expect("responses");
            for (status, response) in responses {
                let status = match status {
                    serde_yaml::Value::String(s) => s.clone(),
                    serde_yaml::Value::Number(n) => n.to_string(),
                    other => panic!("unexpected status key {other:?}"),
                };
                if status.starts_with('4') || status.starts_with('5') {
                    let reference = response["$ref"].as_str().unwrap_or_default();
                    let schema = response["content"]["application/json"]["schema"]["$ref"]
                        .as_str()
                        .unwrap_or_default();
                    assert!(
                        reference.starts_with("#/components/responses/")
                            || schema.ends_with("/Error")
                            || schema.ends_with("/NotReady"),
                        "{method:?} {path:?} {status} does not use the error shape"
                    );
                }
            }
        }
    }
}

#[test]
fn every_operation_that_reads_a_body_documents_its_408_as_well_as_its_413() {
    let spec = spec();
    let mut checked = 0;
    for (path, item) in spec["paths"].as_mapping().expect("paths") {
        for (method, operation) in item.as_mapping().expect("a path item") {
            let responses = &operation["responses"];
            if responses.get("413").is_some() {
                assert!(
                    responses.get("408").is_some(),
                    "{method:?} {path:?} documents 413 but not 408"
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 9, "only {checked} operations with a body");
}

/// The contract's `Target` pattern and length bound accept exactly the texts the service
/// takes as targets, so that a client validating against the contract and the service never
/// disagree (schemathesis sends both sides of the pattern).
#[test]
fn the_target_pattern_accepts_exactly_what_the_service_takes_as_a_target() {
    let spec = spec();
    let schema = &spec["components"]["schemas"]["Target"];
    let pattern =
        regex::Regex::new(schema["pattern"].as_str().expect("a pattern")).expect("a regex");
    let max = schema["maxLength"].as_u64().expect("a maxLength") as usize;
    let label = "a".repeat(63);
    let longest = format!("{label}.{label}.{label}.{}", "b".repeat(61));
    for text in [
        "example.com",
        "Example.COM.",
        "shop_1.example-site.de",
        "localhost",
        "127.1",
        "0",
        "192.0.2.7",
        "01.2.3.4",
        "2001:db8::1",
        "[2001:db8::1]",
        "::",
        "::ffff:1.2.3.4",
        "1:2:3:4:5:6:7::",
        "1::2:3:4:5:6:7",
        longest.as_str(),
        "",
        ".",
        "a..b",
        "-a.com",
        "a-.com",
        "exa mple.com",
        "example.com:443",
        "https://example.com",
        "example.com/path",
        "exämple.com",
        "{pool}.com",
        ":::",
        "1:2:3:4:5:6:7:8:9",
        "[::1",
        "::1]",
        "[example.com]",
        "::1.2.3.04",
        &format!("{}.com", "c".repeat(64)),
    ] {
        let in_contract = text.chars().count() <= max && pattern.is_match(text);
        let taken = proxy_allocator::domain::Target::parse("target", text).is_ok();
        assert_eq!(
            in_contract, taken,
            "{text:?}: contract {in_contract}, service {taken}"
        );
    }
}

#[test]
fn the_contract_bounds_count_as_the_service_does_and_documents_the_batch_answer() {
    let spec = spec();
    let count = &spec["components"]["schemas"]["AssignRequest"]["properties"]["count"]["oneOf"][0];
    assert_eq!(
        (count["minimum"].as_u64(), count["maximum"].as_u64()),
        (
            Some(1),
            Some(u64::from(proxy_allocator::domain::AssignCount::MAX))
        )
    );
    let batch = &spec["components"]["schemas"]["Batch"];
    assert_eq!(
        batch["properties"]["assigned"]["maxItems"].as_u64(),
        Some(u64::from(proxy_allocator::domain::AssignCount::MAX))
    );
    let answers = &spec["paths"]["/pools/{pool}/assign"]["post"]["responses"]["200"]["content"]["application/json"]
        ["schema"]["anyOf"];
    assert!(
        answers
            .as_sequence()
            .is_some_and(|s| s.iter().any(|a| a["$ref"] == "#/components/schemas/Batch")),
        "the 200 answer of assign lists Batch: {answers:?}"
    );
}

/// Every list of fields an assign body may not give together (`not: {required: [...]}`),
/// anywhere in `AssignRequest`.
fn refused_together(schema: &serde_yaml::Value, found: &mut Vec<Vec<String>>) {
    match schema {
        serde_yaml::Value::Mapping(map) => {
            for (key, value) in map {
                if key == "not"
                    && let Some(required) = value["required"].as_sequence()
                {
                    found.push(
                        required
                            .iter()
                            .filter_map(|f| f.as_str().map(str::to_owned))
                            .collect(),
                    );
                }
                refused_together(value, found);
            }
        }
        serde_yaml::Value::Sequence(items) => {
            for item in items {
                refused_together(item, found);
            }
        }
        _ => {}
    }
}

#[test]
fn the_contract_refuses_only_count_with_session_so_a_session_carries_done() {
    let spec = spec();
    let schemas = &spec["components"]["schemas"];
    let mut found = Vec::new();
    refused_together(&schemas["AssignRequest"], &mut found);
    assert_eq!(found, [["count", "session"]]);
    for answer in ["Assigned", "Leased"] {
        let properties = &schemas[answer]["properties"];
        assert_eq!(
            (
                properties["session"]["$ref"].as_str(),
                properties["done"]["$ref"].as_str()
            ),
            (
                Some("#/components/schemas/Session"),
                Some("#/components/schemas/DoneAnswer")
            ),
            "{answer} carries both session and done"
        );
    }
}
