//! SIGTERM under load: requests already accepted complete, nothing answers 5xx, and the
//! process exits within its drain timeout.

use std::time::Duration;

use serde_json::json;

use crate::chaos::{ChaosProxy, Mode};
use crate::helpers::{ADMIN, RedisServer};
use crate::load::{Load, tally};
use crate::process::ServiceProcess;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_completes_accepted_requests_with_no_5xx_and_exits_in_time() {
    let redis = RedisServer::start();
    // Every Redis answer takes 200 ms, so that many requests are in flight at the signal.
    let proxy = ChaosProxy::start(redis.addr()).await;
    let mut service = ServiceProcess::start(&[
        ("REDIS_URL", proxy.url()),
        ("STORE_TIMEOUT_MS", "3000".to_owned()),
        ("SHUTDOWN_TIMEOUT_MS", "3000".to_owned()),
    ]);
    let client = reqwest::Client::new();
    client
        .put(format!("{}/pools/p", service.base))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("created");
    client
        .post(format!("{}/pools/p/members", service.base))
        .bearer_auth(ADMIN)
        .json(&json!({"members": ["a", "b"]}))
        .send()
        .await
        .expect("seeded");
    proxy.set(Mode::Delay(Duration::from_millis(200)));

    let load = Load::start(std::slice::from_ref(&service.base), "p", 32);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let signalled_at = load.started.elapsed();
    service.terminate();
    let exited_after = tokio::task::spawn_blocking(move || {
        let took = service.wait_exit(Duration::from_secs(6));
        drop(service);
        took
    })
    .await
    .expect("joined")
    .expect("the process exits within its drain timeout");
    let answers = load.stop().await;

    assert!(
        exited_after <= Duration::from_secs(3) + Duration::from_millis(500),
        "{exited_after:?}"
    );
    let counts = tally(&answers);
    for status in counts.keys().flatten() {
        assert_eq!(*status, 200, "every answer is a 200: {counts:?}");
    }
    // Requests in flight at the signal were answered, not dropped: with 200 ms per answer
    // and 32 workers, answers arrive after the signal.
    let completed_after_signal = answers
        .iter()
        .filter(|a| {
            a.status == Some(200) && a.sent < signalled_at && a.sent + a.took > signalled_at
        })
        .count();
    assert!(
        completed_after_signal >= 16,
        "only {completed_after_signal} in-flight requests completed"
    );
    eprintln!(
        "SIGTERM: {completed_after_signal} in-flight requests completed; exit after {exited_after:?}; {counts:?}"
    );
}
