//! `/metrics`: exact counter values after a scripted sequence, and bounded cardinality.
//! The recorder is process-wide, so these tests run the service as its own process.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use reqwest::{Client, Method, StatusCode};
use serde_json::json;

use crate::helpers::{ADMIN, RedisServer};
use crate::process::ServiceProcess;

/// `name{label="value",...}` (labels sorted) -> value.
fn parse(scrape: &str) -> BTreeMap<String, f64> {
    scrape
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let key = match series.split_once('{') {
                Some((name, labels)) => {
                    let mut labels: Vec<&str> = labels.trim_end_matches('}').split(',').collect();
                    labels.sort_unstable();
                    format!("{name}{{{}}}", labels.join(","))
                }
                None => series.to_owned(),
            };
            Some((key, value.parse().ok()?))
        })
        .collect()
}

async fn scrape(client: &Client, base: &str) -> (String, BTreeMap<String, f64>) {
    let response = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("scraped");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let text = response.text().await.expect("text");
    let parsed = parse(&text);
    (text, parsed)
}

async fn call(
    client: &Client,
    method: Method,
    url: String,
    body: Option<serde_json::Value>,
) -> StatusCode {
    let mut request = client.request(method, url).bearer_auth(ADMIN);
    if let Some(body) = body {
        request = request.json(&body);
    }
    request.send().await.expect("sent").status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_have_exact_values_after_a_scripted_sequence_and_pool_labels_stay_bounded() {
    let mut redis = RedisServer::start();
    let service = ServiceProcess::start(&[
        ("REDIS_URL", redis.url()),
        ("METRICS_REFRESH_MS", "100".to_owned()),
        ("STORE_TIMEOUT_MS", "500".to_owned()),
    ]);
    let base = service.base.clone();
    let client = Client::new();
    assert_eq!(
        call(&client, Method::PUT, format!("{base}/pools/web"), None).await,
        StatusCode::CREATED
    );
    assert_eq!(
        call(&client, Method::PUT, format!("{base}/pools/dry"), None).await,
        StatusCode::CREATED
    );
    call(
        &client,
        Method::POST,
        format!("{base}/pools/web/members"),
        Some(json!({"members": ["a", "b"]})),
    )
    .await;

    for _ in 0..3 {
        assert_eq!(
            call(
                &client,
                Method::POST,
                format!("{base}/pools/web/assign"),
                None
            )
            .await,
            StatusCode::OK
        );
    }
    for _ in 0..2 {
        assert_eq!(
            call(
                &client,
                Method::POST,
                format!("{base}/pools/dry/assign"),
                None
            )
            .await,
            StatusCode::NO_CONTENT
        );
    }
    // A flood of random pool ids must not create a series each.
    for _ in 0..200 {
        let pool = format!("random-{:016x}", rand::random::<u64>());
        assert_eq!(
            call(
                &client,
                Method::POST,
                format!("{base}/pools/{pool}/assign"),
                None
            )
            .await,
            StatusCode::NOT_FOUND
        );
    }
    assert_eq!(
        call(
            &client,
            Method::POST,
            format!("{base}/pools/bad%7Bid/assign"),
            None
        )
        .await,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        call(&client, Method::PUT, format!("{base}/pools/imp"), None).await,
        StatusCode::CREATED
    );
    let imported = client
        .post(format!("{base}/pools/imp/import"))
        .bearer_auth(ADMIN)
        .header("content-type", "text/plain")
        .body("8.8.8.8:80\n10.0.0.1:80\nhttp://8.8.8.8:80/\nnot a proxy\n")
        .send()
        .await
        .expect("imported");
    assert_eq!(imported.status(), StatusCode::OK);

    // The per-pool gauges appear once the refresher has read the pools (imp came last). Only
    // the pools assigned from have series of their own: imp was only imported into.
    let deadline = Instant::now() + Duration::from_secs(5);
    let (text, series) = loop {
        let (text, series) = scrape(&client, &base).await;
        if series.get("pa_pools") == Some(&3.0) || Instant::now() > deadline {
            break (text, series);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let expected = [
        ("pa_assigns_total{outcome=\"assigned\",pool=\"web\"}", 3.0),
        ("pa_assigns_total{outcome=\"empty\",pool=\"dry\"}", 2.0),
        (
            "pa_assigns_total{outcome=\"not_found\",pool=\"_other\"}",
            200.0,
        ),
        (
            "pa_assign_duration_seconds_count{outcome=\"assigned\"}",
            3.0,
        ),
        (
            "pa_http_requests_total{method=\"POST\",route=\"/pools/{pool}/assign\",status=\"200\"}",
            3.0,
        ),
        (
            "pa_http_requests_total{method=\"POST\",route=\"/pools/{pool}/assign\",status=\"204\"}",
            2.0,
        ),
        (
            "pa_http_requests_total{method=\"POST\",route=\"/pools/{pool}/assign\",status=\"404\"}",
            200.0,
        ),
        (
            "pa_http_requests_total{method=\"POST\",route=\"/pools/{pool}/assign\",status=\"400\"}",
            1.0,
        ),
        (
            "pa_http_requests_total{method=\"PUT\",route=\"/pools/{pool}\",status=\"201\"}",
            3.0,
        ),
        ("pa_pool_eligible_members{pool=\"web\"}", 2.0),
        ("pa_pool_ineligible_members{pool=\"web\"}", 0.0),
        ("pa_pool_min_assignments{pool=\"web\"}", 1.0),
        ("pa_pool_max_assignments{pool=\"web\"}", 2.0),
        ("pa_pool_assignments{pool=\"web\"}", 3.0),
        ("pa_pool_in_flight{pool=\"web\"}", 0.0),
        ("pa_pool_eligible_members{pool=\"dry\"}", 0.0),
        ("pa_pool_health_trips{pool=\"web\"}", 0.0),
        ("pa_pool_health_returns{pool=\"web\"}", 0.0),
        ("pa_import_lines_total{outcome=\"added\"}", 1.0),
        ("pa_import_lines_total{outcome=\"duplicate\"}", 1.0),
        ("pa_import_lines_total{outcome=\"private_address\"}", 1.0),
        ("pa_import_lines_total{outcome=\"unparsable\"}", 1.0),
        ("pa_pools", 3.0),
        ("pa_pools_with_series", 2.0),
    ];
    for (series_name, value) in expected {
        assert_eq!(
            series.get(series_name),
            Some(&value),
            "{series_name} in\n{text}"
        );
    }
    assert_eq!(
        series.get("pa_pool_min_assignments{pool=\"dry\"}"),
        None,
        "no minimum without members"
    );
    let mut pools: Vec<&str> = text
        .match_indices("pool=\"")
        .map(|(at, _)| {
            let rest = &text[at + 6..];
            &rest[..rest.find('"').unwrap_or(0)]
        })
        .collect();
    pools.sort_unstable();
    pools.dedup();
    assert_eq!(pools, ["_other", "dry", "web"]);

    // With Redis gone, the assign is an error, still labelled with its (known) pool.
    redis.kill();
    assert_eq!(
        call(
            &client,
            Method::POST,
            format!("{base}/pools/web/assign"),
            None
        )
        .await,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let (text, series) = scrape(&client, &base).await;
    assert_eq!(
        series.get("pa_assigns_total{outcome=\"error\",pool=\"web\"}"),
        Some(&1.0),
        "{text}"
    );
    assert!(
        series
            .get("pa_store_errors_total{kind=\"unavailable\"}")
            .is_some_and(|n| *n >= 1.0),
        "{text}"
    );
    assert!(
        series
            .get("pa_store_round_trip_seconds_count")
            .is_some_and(|n| *n >= 10.0),
        "{text}"
    );
}

#[tokio::test]
async fn every_response_carries_a_request_id_and_a_sane_one_is_kept() {
    let app = crate::helpers::TestApp::spawn(crate::helpers::Backend::Embedded).await;
    let response = app
        .anonymous(Method::GET, "/livez")
        .send()
        .await
        .expect("sent");
    let generated = response.headers()["x-request-id"]
        .to_str()
        .expect("text")
        .to_owned();
    assert_eq!(generated.len(), 32);
    assert!(generated.bytes().all(|b| b.is_ascii_hexdigit()));
    let response = app
        .anonymous(Method::GET, "/livez")
        .header("x-request-id", "worker-7/req-42")
        .send()
        .await
        .expect("sent");
    assert_eq!(response.headers()["x-request-id"], "worker-7/req-42");
    let response = app
        .anonymous(Method::GET, "/livez")
        .header("x-request-id", "x".repeat(129))
        .send()
        .await
        .expect("sent");
    assert_eq!(
        response.headers()["x-request-id"].len(),
        32,
        "an oversized id is replaced"
    );
}

#[tokio::test]
async fn the_contract_is_served_at_openapi_yaml() {
    let app = crate::helpers::TestApp::spawn(crate::helpers::Backend::Embedded).await;
    let response = app
        .anonymous(Method::GET, "/openapi.yaml")
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::OK);
    let served = response.text().await.expect("text");
    let on_disk = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.yaml"))
        .expect("read");
    assert_eq!(served, on_disk);
}

/// Pools in the scale test of `/metrics`, and how many of them are assigned from.
const MANY_POOLS: usize = 10_000;
const ASSIGNED_POOLS: usize = 150;
const MAX_POOLS: usize = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_at_ten_thousand_pools_have_series_for_a_hundred_and_stay_under_200_kb() {
    // The embedded store: the point is what the scrape holds, not where pools live.
    let service = ServiceProcess::start(&[("METRICS_REFRESH_MS", "100".to_owned())]);
    let base = service.base.clone();
    let client = Client::new();
    let created = futures_util::stream::iter(0..MANY_POOLS)
        .map(|i| call(&client, Method::PUT, format!("{base}/pools/p{i:05}"), None))
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    assert!(created.iter().all(|s| *s == StatusCode::CREATED));
    // The first pools assigned from take the hundred places; the last fifty count as _other.
    for i in 0..ASSIGNED_POOLS {
        let pool = format!("p{i:05}");
        call(
            &client,
            Method::POST,
            format!("{base}/pools/{pool}/members"),
            Some(json!({"members": ["a"]})),
        )
        .await;
        let assigned = call(
            &client,
            Method::POST,
            format!("{base}/pools/{pool}/assign"),
            None,
        );
        assert_eq!(assigned.await, StatusCode::OK);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let (text, series) = loop {
        let (text, series) = scrape(&client, &base).await;
        let refreshed = series.get("pa_pools_with_series") == Some(&100.0)
            && series.get("pa_pools") == Some(&10_000.0);
        if refreshed || Instant::now() > deadline {
            break (text, series);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(series.get("pa_pools"), Some(&10_000.0));
    assert_eq!(series.get("pa_pools_with_series"), Some(&100.0));
    let count = |prefix: &str| series.keys().filter(|k| k.starts_with(prefix)).count();
    for gauge in [
        "pa_pool_eligible_members{",
        "pa_pool_ineligible_members{",
        "pa_pool_in_flight{",
        "pa_pool_min_assignments{",
        "pa_pool_max_assignments{",
        "pa_pool_assignments{",
        "pa_pool_abandoned_leases{",
        "pa_pool_health_trips{",
        "pa_pool_health_returns{",
    ] {
        assert_eq!(count(gauge), MAX_POOLS, "{gauge}");
    }
    assert_eq!(count("pa_assigns_total{"), MAX_POOLS + 1);
    let other = f64::from(u32::try_from(ASSIGNED_POOLS - MAX_POOLS).expect("small"));
    assert_eq!(
        series.get("pa_assigns_total{outcome=\"assigned\",pool=\"_other\"}"),
        Some(&other)
    );
    assert!(text.len() < 200_000, "{} bytes", text.len());
}
