//! The assign path costs Redis exactly one command (the EVALSHA) per assign in steady state:
//! no PING, UNWATCH or other per-request extra.
//!
//! `INFO commandstats` also counts the commands a script runs inside Redis (EXISTS, ZRANGE,
//! ZINCRBY, ...), which are not round trips. So the test reads both: commandstats for the
//! EVALSHA count and the absence of PING/UNWATCH, and `MONITOR`, which tags commands run by
//! scripts as `[0 lua]`, for the exact number of commands that arrived from clients.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::helpers::{
    NEVER_PER_ASSIGN, RedisServer, TestApp, command_calls, command_delta, redis_cli, test_config,
    without_background_traffic,
};

/// Runs `total` assigns from 16 concurrent clients.
async fn assign_concurrently(app: &Arc<TestApp>, total: u64) {
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let app = Arc::clone(app);
        tasks.push(tokio::spawn(async move {
            for _ in 0..total / 16 {
                app.assigned("p").await;
            }
        }));
    }
    for task in tasks {
        task.await.expect("assigner finished");
    }
}

async fn warm_app(redis: &RedisServer) -> Arc<TestApp> {
    let mut config = test_config(Some(redis.url()));
    without_background_traffic(&mut config);
    let app = Arc::new(TestApp::spawn_with(config).await);
    app.create_pool("p", json!({})).await;
    app.seed("p", &["a", "b", "c"], Some(0)).await;
    // Connections dialled and scripts loaded before anything is counted.
    for _ in 0..10 {
        app.assigned("p").await;
    }
    app
}

const ASSIGNS: u64 = 1_024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commandstats_show_one_evalsha_per_assign_and_no_ping_or_unwatch() {
    // A Redis of its own: the shared one sees other tests' traffic.
    let redis = RedisServer::start();
    let app = warm_app(&redis).await;

    let before = command_calls(&redis.url());
    assign_concurrently(&app, ASSIGNS).await;
    let seen = command_delta(&before, &command_calls(&redis.url()));

    assert_eq!(seen.get("evalsha"), Some(&ASSIGNS), "{seen:?}");
    for extra in NEVER_PER_ASSIGN {
        assert_eq!(seen.get(extra), None, "{extra} was sent: {seen:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_receives_exactly_one_command_per_assign_from_the_service() {
    let redis = RedisServer::start();
    let app = warm_app(&redis).await;

    let log = std::env::temp_dir().join(format!("pa-monitor-{}", rand::random::<u64>()));
    let mut monitor = Command::new("redis-cli")
        .args(["-p", &redis.port().to_string(), "monitor"])
        .stdout(std::fs::File::create(&log).expect("a log file"))
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-cli monitor starts");
    let marker = |name: &str| {
        redis_cli(&redis.url(), &["ECHO", name]);
    };
    // MONITOR reports what it sees from the moment it is attached; wait for that.
    wait_for_line(&log, "\"begin-count\"", || marker("begin-count"));

    assign_concurrently(&app, ASSIGNS).await;

    marker("end-count");
    wait_for_line(&log, "\"end-count\"", || {});
    let _ = monitor.kill();
    let _ = monitor.wait();
    let text = std::fs::read_to_string(&log).expect("the monitor log");
    let _ = std::fs::remove_file(&log);

    // The begin marker may have been sent more than once while waiting for MONITOR.
    let lines: Vec<&str> = text.lines().collect();
    let begin = lines
        .iter()
        .rposition(|l| l.contains("\"begin-count\""))
        .expect("the begin marker");
    let window: Vec<&str> = lines[begin + 1..]
        .iter()
        .copied()
        .take_while(|l| !l.contains("\"end-count\""))
        .collect();
    // Commands run by scripts are tagged `[0 lua]`; everything else came over a socket.
    let from_clients: Vec<&str> = window
        .iter()
        .copied()
        .filter(|l| !l.contains(" lua]"))
        .collect();
    // The test's own marker connection handshakes (HELLO / CLIENT SETINFO) before its ECHO.
    let handshake = from_clients
        .iter()
        .filter(|l| {
            l.contains("\"HELLO\"")
                || l.contains("\"hello\"")
                || l.to_ascii_lowercase().contains("\"client\"")
        })
        .count();
    let evalshas = from_clients
        .iter()
        .filter(|l| l.to_ascii_lowercase().contains("\"evalsha\""))
        .count();
    assert_eq!(evalshas as u64, ASSIGNS);
    assert_eq!(
        from_clients.len() - handshake,
        evalshas,
        "commands besides EVALSHA: {:?}",
        from_clients
            .iter()
            .filter(|l| !l.to_ascii_lowercase().contains("\"evalsha\""))
            .collect::<Vec<_>>()
    );
}

fn wait_for_line(log: &std::path::Path, needle: &str, mut poke: impl FnMut()) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        poke();
        if std::fs::read_to_string(log).is_ok_and(|t| t.contains(needle)) {
            return;
        }
        assert!(Instant::now() < deadline, "MONITOR never showed {needle}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
