//! SIGTERM with requests in flight: every request the service accepted before the signal
//! gets its answer, nothing answers 5xx, new connections are refused once the listener is
//! closed, and the process exits within its drain timeout.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::Mutex;

use crate::chaos::{ChaosProxy, Mode};
use crate::helpers::{ADMIN, RedisServer};
use crate::process::ServiceProcess;

/// How a request ended, as its worker saw it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Outcome {
    /// An answer with this status.
    Status(u16),
    /// The connection was refused: nobody listens any more.
    Refused,
    /// Any other failure, described.
    Failed(String),
}

async fn send(client: &reqwest::Client, url: &str) -> Outcome {
    match client.post(url).send().await {
        Ok(response) => {
            let status = response.status().as_u16();
            // The body is part of the answer: a connection cut mid-body is a failure.
            match response.bytes().await {
                Ok(_) => Outcome::Status(status),
                Err(error) => Outcome::Failed(format!("{status}, then {error}")),
            }
        }
        Err(error) if error.is_connect() => Outcome::Refused,
        Err(error) => Outcome::Failed(format!("{error:?}")),
    }
}

fn tally(outcomes: &[Outcome]) -> BTreeMap<Outcome, usize> {
    let mut counts = BTreeMap::new();
    for outcome in outcomes {
        *counts.entry(outcome.clone()).or_insert(0) += 1;
    }
    counts
}

const WORKERS: usize = 32;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_every_accepted_request_refuses_new_connections_and_exits_in_time() {
    let redis = RedisServer::start();
    let proxy = ChaosProxy::start(redis.addr()).await;
    let mut service = ServiceProcess::start(&[
        ("REDIS_URL", proxy.url()),
        ("STORE_TIMEOUT_MS", "5000".to_owned()),
        ("SHUTDOWN_TIMEOUT_MS", "3000".to_owned()),
        // No background work through the proxy: every EVALSHA it sees is a request's.
        ("SWEEP_INTERVAL_MS", "3600000".to_owned()),
        ("CHECK_TICK_MS", "3600000".to_owned()),
        ("METRICS_REFRESH_MS", "3600000".to_owned()),
    ]);
    let admin = reqwest::Client::new();
    let created = admin
        .put(format!("{}/pools/p", service.base))
        .bearer_auth(ADMIN)
        .json(&json!({}))
        .send()
        .await
        .expect("created");
    assert_eq!(created.status(), 201);
    let seeded = admin
        .post(format!("{}/pools/p/members", service.base))
        .bearer_auth(ADMIN)
        .json(&json!({"members": ["a", "b"]}))
        .send()
        .await
        .expect("seeded");
    assert_eq!(seeded.status(), 200);

    // Redis's answers are held back from now on, so the requests pile up in the service.
    let arrived_before = proxy.evalshas();
    proxy.set(Mode::Stall);
    let url = format!("{}/pools/p/assign", service.base);
    let before_signal = Arc::new(Mutex::new(Vec::new()));
    let after_signal = Arc::new(Mutex::new(Vec::new()));
    let mut workers = Vec::new();
    for _ in 0..WORKERS {
        let url = url.clone();
        let (before_signal, after_signal) = (Arc::clone(&before_signal), Arc::clone(&after_signal));
        workers.push(tokio::spawn(async move {
            let client = reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .expect("a client");
            // The first request is in the service before the signal (the test waits for
            // that); it cannot end before Redis answers, which is after the signal.
            let first = send(&client, &url).await;
            before_signal.lock().await.push(first);
            // Then the worker carries on as a worker would, until it is refused.
            loop {
                let outcome = send(&client, &url).await;
                let refused = outcome == Outcome::Refused;
                after_signal.lock().await.push(outcome);
                if refused {
                    break;
                }
            }
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while proxy.evalshas() < arrived_before + WORKERS {
        assert!(
            Instant::now() < deadline,
            "only {} of {WORKERS} requests reached the store",
            proxy.evalshas() - arrived_before
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let signalled = Instant::now();
    service.terminate();
    // Once the listener is closed, Redis answers again and the requests in flight end.
    let addr = service.base.trim_start_matches("http://").to_owned();
    while tokio::net::TcpStream::connect(&addr).await.is_ok() {
        assert!(
            signalled.elapsed() < Duration::from_secs(3),
            "the listener is still open 3 s after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    proxy.set(Mode::Pass);
    tokio::task::spawn_blocking(move || {
        let exited = service.wait_exit(Duration::from_secs(6));
        drop(service);
        exited
    })
    .await
    .expect("joined")
    .expect("the process exits");
    let exited_after = signalled.elapsed();
    for worker in workers {
        tokio::time::timeout(Duration::from_secs(10), worker)
            .await
            .expect("every worker ends once it is refused")
            .expect("worker finished");
    }

    let before_signal = tally(&before_signal.lock().await);
    let after_signal = tally(&after_signal.lock().await);
    let report = format!(
        "sent before the signal: {before_signal:?}; sent after it: {after_signal:?}; \
         exit {exited_after:?} after the signal"
    );
    assert_eq!(
        before_signal,
        BTreeMap::from([(Outcome::Status(200), WORKERS)]),
        "{report}"
    );
    // After the signal nothing is answered any more: each worker goes on until its
    // connection is refused by the closed listener, once. A request that went out on a
    // kept-alive connection as the service was closing it fails without an answer; that
    // request was sent after the signal, so it may (and it is counted apart).
    assert!(
        after_signal
            .keys()
            .all(|outcome| !matches!(outcome, Outcome::Status(_))),
        "an answer after the signal: {report}"
    );
    assert_eq!(
        after_signal.get(&Outcome::Refused),
        Some(&WORKERS),
        "{report}"
    );
    assert!(
        exited_after <= Duration::from_millis(3500),
        "SHUTDOWN_TIMEOUT_MS is 3000: {report}"
    );
    eprintln!("SIGTERM: {report}");
}
