//! The OpenAPI contract: `openapi.yaml` documents exactly the routes the router serves.

use std::collections::BTreeSet;

use proxy_allocator::http::routes;

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
