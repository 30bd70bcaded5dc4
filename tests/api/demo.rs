//! `proxy-allocator demo`, run as a reader runs it: the lines it prints are copied into a
//! shell as they are, and do what they say.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};

use serde_json::Value;

use crate::helpers::{ADMIN, read};

/// The page the demo's local site answers.
const PAGE: &str = "hello from the proxy-allocator demo site\n";

/// The demo's process, killed when the test ends however it ends.
struct Demo {
    child: Child,
    /// The printed lines, by their label (`dashboard`, `assign`, ...).
    lines: BTreeMap<String, String>,
    headline: String,
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the demo on free ports and reads what it prints, up to its last line.
async fn start_demo() -> Demo {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_proxy-allocator"))
        .args([
            "demo",
            "--listen",
            "127.0.0.1:0",
            "--gateway-listen",
            "127.0.0.1:0",
            "--log-format",
            "json",
        ])
        .env_clear()
        .env("ADMIN_TOKEN", ADMIN)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the binary starts");
    let stdout = child.stdout.take().expect("stdout");
    let printed = tokio::task::spawn_blocking(move || {
        let mut printed = Vec::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            // The log lines are JSON; the demo's own are text.
            if line.starts_with('{') {
                continue;
            }
            let last = line.starts_with("Stop it");
            printed.push(line);
            if last {
                break;
            }
        }
        printed
    })
    .await
    .expect("the output was read");
    let mut demo = Demo {
        child,
        lines: BTreeMap::new(),
        headline: printed.first().cloned().unwrap_or_default(),
    };
    for line in &printed[1..printed.len().saturating_sub(1)] {
        let (label, text) = line.split_once(':').expect("a labelled line");
        demo.lines
            .insert(label.to_owned(), text.trim_start().to_owned());
    }
    demo
}

impl Demo {
    fn line(&self, label: &str) -> &str {
        self.lines.get(label).map_or("", String::as_str)
    }

    /// The API's base URL, read from the assign line.
    fn api(&self) -> String {
        let assign = self.line("assign");
        let url = assign.split(' ').next_back().unwrap_or_default();
        url.split("/pools/").next().unwrap_or_default().to_owned()
    }

    async fn members(&self) -> Vec<Value> {
        let response = reqwest::Client::new()
            .get(format!("{}/pools/demo/members", self.api()))
            .bearer_auth(ADMIN)
            .send()
            .await
            .expect("the API answers");
        let (status, body) = read(response).await;
        assert_eq!(status, reqwest::StatusCode::OK, "{body}");
        body["members"].as_array().cloned().unwrap_or_default()
    }
}

/// Runs `line` in a shell as a reader pasting it would, and returns what it printed.
async fn shell(line: &str) -> String {
    let output = tokio::process::Command::new("sh")
        .args(["-c", line])
        .env_remove("http_proxy")
        .env_remove("HTTP_PROXY")
        .output()
        .await
        .expect("sh runs");
    assert!(output.status.success(), "{line}: {output:?}");
    String::from_utf8(output.stdout).expect("UTF-8 output")
}

fn kind(member: &Value) -> &str {
    member["labels"]["kind"].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_prints_the_dashboard_with_its_token_and_lines_that_assign_and_fetch_through_the_gateway()
 {
    let demo = start_demo().await;
    assert_eq!(
        demo.headline,
        "proxy-allocator demo: pool \"demo\" with 4 local proxies (2 healthy, 1 slow, 1 failing)"
    );
    let api = demo.api();
    assert_eq!(
        demo.line("dashboard"),
        format!("{api}/ui  (admin token: {ADMIN})")
    );
    assert_eq!(
        demo.line("assign"),
        format!("curl -s -X POST {api}/pools/demo/assign")
    );
    let members = demo.members().await;
    let mut kinds: Vec<&str> = members.iter().map(kind).collect();
    kinds.sort_unstable();
    assert_eq!(kinds, ["failing", "healthy", "healthy", "slow"]);
    let ids: Vec<&str> = members
        .iter()
        .filter_map(|member| member["member"].as_str())
        .collect();

    let assigned: Value =
        serde_json::from_str(&shell(demo.line("assign")).await).expect("a JSON answer");
    assert_eq!(assigned["pool"], "demo");
    assert!(
        ids.contains(&assigned["proxy"].as_str().unwrap_or_default()),
        "{assigned} is a member of {ids:?}"
    );
    assert_eq!(assigned["assignments"], 1);

    let gateway = demo.line("gateway");
    assert!(
        gateway.starts_with("curl -x http://demo:any@127.0.0.1:"),
        "{gateway}"
    );
    assert_eq!(shell(gateway).await, PAGE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_s_failing_proxy_is_reported_and_taken_out_while_the_gateway_line_keeps_fetching()
{
    let demo = start_demo().await;
    let failing = |members: &[Value]| {
        members
            .iter()
            .find(|member| kind(member) == "failing")
            .cloned()
            .expect("a failing member")
    };
    // Least-used picks each member in turn, and two failures in a row trip one: within
    // twelve fetches (twelve assignments at the least) the failing proxy has been tried
    // twice. Every fetch succeeds all the same, through another member.
    let mut fetches = 0;
    while failing(&demo.members().await)["state"] == "eligible" && fetches < 12 {
        assert_eq!(shell(demo.line("gateway")).await, PAGE);
        fetches += 1;
    }
    let members = demo.members().await;
    let failing = failing(&members);
    assert_eq!(
        (&failing["state"], &failing["reason"]),
        (&Value::from("ineligible"), &Value::from("unhealthy")),
        "{failing}"
    );
    for member in members.iter().filter(|member| kind(member) != "failing") {
        assert_eq!(
            (&member["state"], &member["consecutive_failures"]),
            (&Value::from("eligible"), &Value::from(0)),
            "{member}"
        );
    }
}
