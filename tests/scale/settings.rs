//! The service refuses contradictory Redis settings at startup, saying which.

use std::process::{Command, Stdio};

#[test]
fn the_service_refuses_to_start_when_two_ways_to_reach_redis_are_set() {
    let output = Command::new(env!("CARGO_BIN_EXE_proxy-allocator"))
        .env_clear()
        .env("LISTEN_ADDR", "127.0.0.1:0")
        .env("ADMIN_TOKEN", "token")
        .env("LOG_FORMAT", "json")
        .env("REDIS_URL", "redis://127.0.0.1:6379")
        .env("REDIS_SENTINEL_URLS", "redis://127.0.0.1:26379")
        .env("REDIS_SENTINEL_MASTER", "main")
        .stdin(Stdio::null())
        .output()
        .expect("the service binary runs");

    assert_eq!(output.status.code(), Some(1));
    let logged = String::from_utf8_lossy(&output.stdout);
    let line: serde_json::Value = logged
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|line| line["message"] == "cannot start")
        .unwrap_or_else(|| panic!("a \"cannot start\" line in {logged}"));
    assert_eq!(
        line["error"],
        "invalid Redis settings: REDIS_URL and REDIS_SENTINEL_URLS are set, but only one of \
         REDIS_URL, REDIS_CLUSTER_URLS and REDIS_SENTINEL_URLS may be: they are alternative \
         ways to reach Redis",
        "{logged}"
    );
}
