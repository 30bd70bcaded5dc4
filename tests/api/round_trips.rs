//! The assign path costs Redis exactly one command (the EVALSHA) per assign in steady state:
//! no PING, UNWATCH or other per-request extra.
//!
//! `INFO commandstats` also counts the commands a script runs inside Redis (EXISTS, ZRANGE,
//! ZINCRBY, ...), which are not round trips. So the test reads both: commandstats for the
//! EVALSHA count and the absence of PING/UNWATCH, and `MONITOR`, which tags commands run by
//! scripts as `[0 lua]` and every other command with its client's address, for the exact
//! commands that arrived from the service: a reconnect per assign (HELLO, CLIENT SETINFO)
//! would show there.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::helpers::{
    NEVER_PER_ASSIGN, RedisServer, TestApp, command_calls, command_delta, test_config,
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

    // One connection of the test's own sends the markers: opened (and its handshake done)
    // before MONITOR is attached, and told apart by its address, so that every other line
    // in the window is the service's.
    let mut markers = redis::Client::open(redis.url())
        .expect("a valid Redis URL")
        .get_connection()
        .expect("a connection to the test Redis");
    let info: String = redis::cmd("CLIENT")
        .arg("INFO")
        .query(&mut markers)
        .expect("CLIENT INFO");
    let own = info
        .split_whitespace()
        .find_map(|field| field.strip_prefix("addr="))
        .expect("an addr= field")
        .to_owned();
    let mut marker = |name: &str| {
        let _: String = redis::cmd("ECHO")
            .arg(name)
            .query(&mut markers)
            .expect("ECHO");
    };

    let log = std::env::temp_dir().join(format!("pa-monitor-{}", rand::random::<u64>()));
    let mut monitor = Command::new("redis-cli")
        .args(["-p", &redis.port().to_string(), "monitor"])
        .stdout(std::fs::File::create(&log).expect("a log file"))
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-cli monitor starts");
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
    // A line reads `<time> [<db> <client address>] "COMMAND" ...`; commands run by scripts
    // have `lua` for the address. Everything else in the window came from the service.
    let from_service: Vec<&str> = window
        .iter()
        .copied()
        .filter(|line| {
            let client = line
                .split_once('[')
                .and_then(|(_, rest)| rest.split_once(']'))
                .and_then(|(inside, _)| inside.split_whitespace().nth(1))
                .unwrap_or_else(|| panic!("a client in {line:?}"));
            client != "lua" && client != own
        })
        .collect();
    let others: Vec<&str> = from_service
        .iter()
        .copied()
        .filter(|line| !line.to_ascii_lowercase().contains("] \"evalsha\""))
        .collect();
    assert_eq!(others, Vec::<&str>::new(), "commands besides EVALSHA");
    assert_eq!(from_service.len() as u64, ASSIGNS);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_assign_naming_a_target_with_bans_is_one_evalsha_too() {
    let redis = RedisServer::start();
    let app = warm_app(&redis).await;
    let (status, body) = app
        .post_json(
            "/pools/p/outcomes",
            json!({"proxy": "a", "result": "blocked", "target": "example.com"}),
        )
        .await;
    assert_eq!(status.as_u16(), 200, "{body}");

    let before = command_calls(&redis.url());
    for _ in 0..64 {
        let (status, body) = app
            .post_json("/pools/p/assign", json!({"target": "example.com"}))
            .await;
        assert_eq!(status.as_u16(), 200, "{body}");
        assert_ne!(body["proxy"], json!("a"), "{body}");
    }
    let seen = command_delta(&before, &command_calls(&redis.url()));
    assert_eq!(seen.get("evalsha"), Some(&64), "{seen:?}");
    for extra in NEVER_PER_ASSIGN {
        assert_eq!(seen.get(extra), None, "{extra} was sent: {seen:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_assign_in_a_session_is_one_evalsha_too() {
    let redis = RedisServer::start();
    let app = warm_app(&redis).await;

    let before = command_calls(&redis.url());
    for n in 0..64 {
        // Half start sessions, half come back to one; every other one names a target.
        let session = if n % 2 == 0 {
            format!("new-{n}")
        } else {
            "kept".to_owned()
        };
        let body = if n % 4 < 2 {
            json!({"session": session})
        } else {
            json!({"session": session, "target": "example.com", "session_ttl_ms": 5000})
        };
        let (status, body) = app.post_json("/pools/p/assign", body).await;
        assert_eq!(status.as_u16(), 200, "{body}");
        assert_eq!(body["session"]["repinned"], json!(false), "{body}");
    }
    let seen = command_delta(&before, &command_calls(&redis.url()));
    assert_eq!(seen.get("evalsha"), Some(&64), "{seen:?}");
    for extra in NEVER_PER_ASSIGN {
        assert_eq!(seen.get(extra), None, "{extra} was sent: {seen:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_assign_carrying_done_is_one_evalsha_too() {
    let redis = RedisServer::start();
    let app = warm_app(&redis).await;
    let before = command_calls(&redis.url());
    let mut last = json!("a");
    for _ in 0..64 {
        let (status, body) = app
            .post_json(
                "/pools/p/assign",
                json!({"done": {"proxy": last, "result": "ok", "status": 200}}),
            )
            .await;
        assert_eq!(status.as_u16(), 200, "{body}");
        assert_eq!(body["done"]["effect"], json!("counted"), "{body}");
        last = body["proxy"].clone();
    }
    let seen = command_delta(&before, &command_calls(&redis.url()));
    assert_eq!(seen.get("evalsha"), Some(&64), "{seen:?}");
    for extra in NEVER_PER_ASSIGN {
        assert_eq!(seen.get(extra), None, "{extra} was sent: {seen:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_assign_in_a_session_carrying_done_is_one_evalsha_too() {
    let redis = RedisServer::start();
    let app = warm_app(&redis).await;
    let before = command_calls(&redis.url());
    let mut last = json!("a");
    for n in 0..64 {
        // Every other one names a target, and reports about it.
        let body = if n % 2 == 0 {
            json!({"session": "kept", "done": {"proxy": last, "result": "ok", "status": 200}})
        } else {
            json!({"session": "kept", "target": "example.com",
                   "done": {"proxy": last, "result": "ok", "target": "example.com"}})
        };
        let (status, body) = app.post_json("/pools/p/assign", body).await;
        assert_eq!(status.as_u16(), 200, "{body}");
        assert_eq!(
            (&body["done"]["effect"], &body["session"]["repinned"]),
            (&json!("counted"), &json!(false)),
            "{body}"
        );
        last = body["proxy"].clone();
    }
    let seen = command_delta(&before, &command_calls(&redis.url()));
    assert_eq!(seen.get("evalsha"), Some(&64), "{seen:?}");
    for extra in NEVER_PER_ASSIGN {
        assert_eq!(seen.get(extra), None, "{extra} was sent: {seen:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_client_token_adds_no_command_to_the_assign() {
    let redis = RedisServer::start();
    let mut config = test_config(Some(redis.url()));
    without_background_traffic(&mut config);
    config.worker_token = Some("worker".to_owned());
    let app = TestApp::spawn_with(config).await;
    app.create_pool("p", json!({})).await;
    app.seed("p", &["a", "b", "c"], Some(0)).await;
    let (status, created) = crate::helpers::read(
        app.admin(reqwest::Method::PUT, "/clients/team-a")
            .json(&json!({"pools": ["p"], "rate_per_second": 100000, "burst": 1000000}))
            .send()
            .await
            .expect("sent"),
    )
    .await;
    assert_eq!(status.as_u16(), 201, "{created}");
    let token = created["token"].as_str().expect("a token").to_owned();
    let assign = |body: serde_json::Value| {
        app.anonymous(reqwest::Method::POST, "/pools/p/assign")
            .bearer_auth(&token)
            .json(&body)
            .send()
    };
    for _ in 0..10 {
        assign(json!({})).await.expect("sent");
    }
    let before = command_calls(&redis.url());
    for n in 0..64 {
        // Plain, several, in a session, and carrying `done`: each path of the limit.
        let body = match n % 4 {
            0 => json!({}),
            1 => json!({"count": 2}),
            2 => json!({"session": "kept"}),
            _ => json!({"done": {"proxy": "a", "result": "ok"}}),
        };
        let response = assign(body).await.expect("sent");
        assert_eq!(response.status().as_u16(), 200);
    }
    let seen = command_delta(&before, &command_calls(&redis.url()));
    // Per assign, the lookup of the client's token (a script of its own, in the clients'
    // hash slot) and the assign, whose script takes from the bucket inside.
    assert_eq!(seen.get("evalsha"), Some(&128), "{seen:?}");
    for extra in NEVER_PER_ASSIGN {
        assert_eq!(seen.get(extra), None, "{extra} was sent: {seen:?}");
    }
    app.stop().await;
}
