//! The embedded store in a data directory, as a real process: restarted after SIGTERM and
//! after SIGKILL under load, started on logs cut short and on damaged logs, started twice
//! on one directory, and the book's restart replayed as printed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::{Client, Method};
use serde_json::{Value, json};

use crate::helpers::{ADMIN, DataDir, fresh_data_dir};
use crate::load::Load;
use crate::process::{ServiceProcess, run_to_exit};

/// The environment of a service on `dir`, plus `extra`.
fn on_dir(dir: &Path, extra: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("DATA_DIR", dir.display().to_string()),
        // The recovery's own lines too.
        (
            "RUST_LOG",
            "warn,proxy_allocator::startup=info,proxy_allocator::store=info".to_owned(),
        ),
    ];
    env.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
    env
}

async fn call(
    client: &Client,
    base: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = client
        .request(method, format!("{base}{path}"))
        .bearer_auth(ADMIN);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("an answer");
    let status = response.status().as_u16();
    let bytes = response.bytes().await.expect("a body");
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).expect("JSON")
    };
    (status, body)
}

async fn ok(client: &Client, base: &str, method: Method, path: &str, body: Value) -> Value {
    let (status, body) = call(client, base, method, path, Some(body)).await;
    assert!((200..300).contains(&status), "{path}: {status} {body}");
    body
}

async fn get(client: &Client, base: &str, path: &str) -> Value {
    let (status, body) = call(client, base, Method::GET, path, None).await;
    assert_eq!(status, 200, "{path}: {body}");
    body
}

/// What an operator sees: every pool with its stats, and every member of each.
async fn everything(client: &Client, base: &str) -> Vec<Value> {
    let pools = get(client, base, "/pools").await;
    let mut seen = vec![pools.clone()];
    for pool in pools["pools"].as_array().expect("pools") {
        let id = pool["pool"].as_str().expect("an id");
        seen.push(get(client, base, &format!("/pools/{id}/members?limit=1000")).await);
    }
    seen
}

fn terminate(service: &mut ServiceProcess) {
    service.terminate();
    service
        .wait_exit(Duration::from_secs(10))
        .expect("the service exits after SIGTERM");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_sigterm_a_restart_shows_the_same_pools_members_stats_and_leases() {
    let dir = DataDir(fresh_data_dir());
    let env = on_dir(&dir.0, &[]);
    let mut first = ServiceProcess::start(&env);
    let client = Client::new();
    let base = first.base.clone();
    ok(
        &client,
        &base,
        Method::PUT,
        "/pools/web",
        json!({"restore": "minimum"}),
    )
    .await;
    ok(
        &client,
        &base,
        Method::POST,
        "/pools/web/members",
        json!({"members": ["http://p1.example.net:3128", "http://p2.example.net:3128", "http://p3.example.net:3128"]}),
    )
    .await;
    ok(
        &client,
        &base,
        Method::PUT,
        "/pools/browsers",
        json!({"policy": "least-in-flight", "max_in_flight": 1, "lease_ttl_ms": 600000}),
    )
    .await;
    ok(
        &client,
        &base,
        Method::POST,
        "/pools/browsers/members",
        json!({"members": ["b1", "b2"]}),
    )
    .await;
    let mut leases = Vec::new();
    for _ in 0..2 {
        let leased = ok(
            &client,
            &base,
            Method::POST,
            "/pools/browsers/assign",
            json!({}),
        )
        .await;
        leases.push(leased["lease"]["id"].as_str().expect("a lease").to_owned());
    }
    ok(
        &client,
        &base,
        Method::POST,
        "/pools/web/members/disable",
        json!({"members": ["http://p3.example.net:3128"], "reason": "timeouts"}),
    )
    .await;
    // Last, what is fsynced only every FSYNC_INTERVAL_MS: counts and outcome state, which
    // SIGTERM must not lose either.
    for _ in 0..7 {
        ok(&client, &base, Method::POST, "/pools/web/assign", json!({})).await;
    }
    ok(
        &client,
        &base,
        Method::POST,
        "/pools/web/outcomes",
        json!({"proxy": "http://p1.example.net:3128", "result": "failed"}),
    )
    .await;
    let before = everything(&client, &base).await;
    terminate(&mut first);

    let second = ServiceProcess::start(&env);
    let base = second.base.clone();
    assert_eq!(everything(&client, &base).await, before);
    let recovered = second.wait_lines("recovered the data directory", 1);
    assert_eq!(recovered.len(), 1, "{:?}", second.all_lines());
    let line: Value = serde_json::from_str(&recovered[0]).expect("a JSON line");
    assert_eq!(
        (&line["pools"], &line["members"], &line["leases"]),
        (&json!(2), &json!(5), &json!(2))
    );
    // The leases taken before the restart are still held, and both members still busy.
    let (status, _) = call(&client, &base, Method::POST, "/pools/browsers/assign", None).await;
    assert_eq!(status, 204);
    for lease in &leases {
        let path = format!("/pools/browsers/leases/{lease}/release");
        assert_eq!(call(&client, &base, Method::POST, &path, None).await.0, 204);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_sigkill_under_load_acknowledged_changes_are_kept_and_counts_lie_between_fsynced_and_handed_out()
 {
    let dir = DataDir(fresh_data_dir());
    let env = on_dir(&dir.0, &[]);
    let mut first = ServiceProcess::start(&env);
    let client = Client::new();
    let base = first.base.clone();
    let members: Vec<String> = (0..20).map(|i| format!("m{i:02}")).collect();
    ok(&client, &base, Method::PUT, "/pools/p", json!({})).await;
    ok(
        &client,
        &base,
        Method::POST,
        "/pools/p/members",
        json!({"members": members}),
    )
    .await;
    ok(
        &client,
        &base,
        Method::PUT,
        "/pools/l",
        json!({"policy": "least-in-flight", "lease_ttl_ms": 600000}),
    )
    .await;
    ok(
        &client,
        &base,
        Method::POST,
        "/pools/l/members",
        json!({"members": ["l1", "l2", "l3"]}),
    )
    .await;

    let load = Load::start(std::slice::from_ref(&base), "p", 16);
    // Meanwhile, changes of membership and leases, each acknowledged only once on disk.
    // Markers start at a count no assign reaches, so they never take an assignment.
    let mut markers = Vec::new();
    let mut leases = Vec::new();
    let mut last_acknowledged_sent = None;
    for i in 0.. {
        if load.started.elapsed() > Duration::from_millis(2000) {
            break;
        }
        let sent = load.started.elapsed();
        let marker = format!("k{i:03}");
        let body = json!({"members": [&marker], "assignments": 1_000_000_000});
        let (status, _) = call(&client, &base, Method::POST, "/pools/p/members", Some(body)).await;
        assert_eq!(status, 200);
        markers.push(marker);
        last_acknowledged_sent = Some(sent);
        let (status, leased) = call(&client, &base, Method::POST, "/pools/l/assign", None).await;
        assert_eq!(status, 200);
        leases.push(leased["lease"]["id"].as_str().expect("a lease").to_owned());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    first.kill();
    let answers = load.stop().await;
    let fsynced_before = last_acknowledged_sent.expect("changes were acknowledged");

    // Per member: the highest count answered before the last acknowledged change was sent
    // (on disk: the log is a prefix of the operations) and the highest answered at all.
    let mut lower: BTreeMap<String, u64> = BTreeMap::new();
    let mut handed_out: BTreeMap<String, u64> = BTreeMap::new();
    for answer in answers.iter().filter(|a| a.status == Some(200)) {
        let member = answer.proxy.clone().expect("a proxy");
        let count = answer.assignments.expect("a count");
        let seen = handed_out.entry(member.clone()).or_default();
        *seen = (*seen).max(count);
        if answer.sent + answer.took < fsynced_before {
            let fsynced = lower.entry(member).or_default();
            *fsynced = (*fsynced).max(count);
        }
    }
    // Requests without an answer at the kill may have been counted.
    let unanswered = answers.iter().filter(|a| a.status.is_none()).count() as u64;
    // The kill came during the load: assigns were answered after the last change known to
    // be on disk, so there were counts at risk.
    let at_risk = answers
        .iter()
        .filter(|a| a.status == Some(200) && a.sent + a.took >= fsynced_before)
        .count();
    assert!(at_risk > 0, "no assign answered after {fsynced_before:?}");
    assert!(
        handed_out.values().sum::<u64>() >= 100,
        "a real load: {handed_out:?}"
    );

    let second = ServiceProcess::start(&env);
    let base = second.base.clone();
    let listing = get(&client, &base, "/pools/p/members?limit=1000").await;
    let listed: Vec<(String, u64)> = listing["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| {
            (
                m["member"].as_str().expect("id").to_owned(),
                m["assignments"].as_u64().expect("count"),
            )
        })
        .collect();
    let ids: BTreeSet<&String> = listed.iter().map(|(id, _)| id).collect();
    assert_eq!(ids.len(), listed.len(), "no member twice: {listed:?}");
    for marker in &markers {
        assert!(
            ids.contains(marker),
            "acknowledged {marker} is kept: {listed:?}"
        );
    }
    let counts: BTreeMap<&String, u64> = listed
        .iter()
        .filter(|(id, _)| members.contains(id))
        .map(|(id, count)| (id, *count))
        .collect();
    assert_eq!(counts.len(), members.len(), "every seeded member is kept");
    for (member, count) in &counts {
        let low = lower.get(*member).copied().unwrap_or(0);
        let high = handed_out.get(*member).copied().unwrap_or(0) + unanswered;
        assert!(
            (low..=high).contains(count),
            "{member}: {count} not within fsynced {low} and handed out {high}"
        );
    }
    // One state the store passed through: its total is the sum of its counts, and the
    // counts are as even as least-used keeps them at every step.
    let stats = get(&client, &base, "/pools/p").await["stats"].clone();
    assert_eq!(
        stats["total_assignments"].as_u64(),
        Some(counts.values().sum::<u64>())
    );
    let (min, max) = (counts.values().min(), counts.values().max());
    assert!(
        max.zip(min).is_some_and(|(max, min)| max - min <= 1),
        "{counts:?}"
    );
    // Every acknowledged lease is held; a lease whose answer was lost at the kill is there
    // too and is reclaimed when it expires.
    for lease in &leases {
        let path = format!("/pools/l/leases/{lease}/release");
        assert_eq!(
            call(&client, &base, Method::POST, &path, None).await.0,
            204,
            "{lease}"
        );
    }
    let in_flight = get(&client, &base, "/pools/l").await["stats"]["in_flight"].as_u64();
    assert!(in_flight.is_some_and(|n| n <= 1), "{in_flight:?}");
    eprintln!(
        "SIGKILL: {} answers, {unanswered} unanswered, {} markers and {} leases acknowledged; \
         counts: {} fsynced at least, {} recovered, {} handed out",
        answers.len(),
        markers.len(),
        leases.len(),
        lower.values().sum::<u64>(),
        counts.values().sum::<u64>(),
        handed_out.values().sum::<u64>(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_reach_the_disk_within_the_fsync_interval_with_no_later_change() {
    let dir = DataDir(fresh_data_dir());
    let env = on_dir(&dir.0, &[("FSYNC_INTERVAL_MS", "200")]);
    let mut first = ServiceProcess::start(&env);
    let client = Client::new();
    let base = first.base.clone();
    ok(&client, &base, Method::PUT, "/pools/p", json!({})).await;
    ok(
        &client,
        &base,
        Method::POST,
        "/pools/p/members",
        json!({"members": ["m1"]}),
    )
    .await;
    for expected in 1..=10 {
        let (status, answer) = call(&client, &base, Method::POST, "/pools/p/assign", None).await;
        assert_eq!(status, 200);
        assert_eq!(answer["assignments"], expected);
    }
    // Nothing after the last assign asks for an fsync: only the interval writes its count.
    // The wait is the bound under test (200 ms) plus room for a loaded machine.
    tokio::time::sleep(Duration::from_millis(200 + 800)).await;
    first.kill();

    let second = ServiceProcess::start(&env);
    let listing = get(&client, &second.base, "/pools/p/members").await;
    assert_eq!(listing["members"][0]["member"], "m1");
    assert_eq!(listing["members"][0]["assignments"], 10);
}

/// A service on a fresh directory with every answer fsynced, so each request is a frame of
/// its own: creates a pool, seeds two members, assigns once and stops. Returns the
/// directory and the log's length after each of the three.
async fn three_frames() -> (DataDir, [u64; 3]) {
    let dir = DataDir(fresh_data_dir());
    let mut service = ServiceProcess::start(&on_dir(&dir.0, &[("FSYNC_INTERVAL_MS", "0")]));
    let client = Client::new();
    let base = service.base.clone();
    let log = log_of(&dir.0);
    ok(&client, &base, Method::PUT, "/pools/p", json!({})).await;
    let created = len(&log);
    ok(
        &client,
        &base,
        Method::POST,
        "/pools/p/members",
        json!({"members": ["a", "b"]}),
    )
    .await;
    let seeded = len(&log);
    ok(&client, &base, Method::POST, "/pools/p/assign", json!({})).await;
    let assigned = len(&log);
    terminate(&mut service);
    assert_eq!(len(&log), assigned, "nothing written after the last answer");
    assert!(created < seeded && seeded < assigned);
    (dir, [created, seeded, assigned])
}

fn log_of(dir: &Path) -> PathBuf {
    dir.join("log.000001")
}

fn len(path: &Path) -> u64 {
    std::fs::metadata(path).expect("the log exists").len()
}

/// A copy of `dir` without its lock file.
fn copy_of(dir: &Path) -> DataDir {
    let copy = DataDir(fresh_data_dir());
    std::fs::create_dir_all(&copy.0).expect("a directory");
    for entry in std::fs::read_dir(dir).expect("listed") {
        let entry = entry.expect("an entry");
        if entry.file_name() != "LOCK" {
            std::fs::copy(entry.path(), copy.0.join(entry.file_name())).expect("copied");
        }
    }
    copy
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_cut_at_every_byte_of_its_last_record_starts_cleanly_without_that_record() {
    let (dir, [_, seeded, assigned]) = three_frames().await;
    let client = Client::new();
    for cut in seeded..assigned {
        let copy = copy_of(&dir.0);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(log_of(&copy.0))
            .expect("opened");
        file.set_len(cut).expect("cut");
        drop(file);
        let mut service = ServiceProcess::start(&on_dir(&copy.0, &[]));
        let base = service.base.clone();
        let members = get(&client, &base, "/pools/p/members").await;
        let counts: Vec<(&Value, &Value)> = members["members"]
            .as_array()
            .expect("members")
            .iter()
            .map(|m| (&m["member"], &m["assignments"]))
            .collect();
        assert_eq!(
            counts,
            [(&json!("a"), &json!(0)), (&json!("b"), &json!(0))],
            "cut at {cut}"
        );
        let torn = service.wait_lines("cut short by a crash", usize::from(cut > seeded));
        if cut == seeded {
            assert!(torn.is_empty(), "a whole log is not torn: {torn:?}");
        } else {
            assert_eq!(torn.len(), 1, "cut at {cut}: {:?}", service.all_lines());
            let line: Value = serde_json::from_str(&torn[0]).expect("JSON");
            assert_eq!(line["offset"], json!(seeded), "cut at {cut}");
            assert_eq!(line["dropped_bytes"], json!(cut - seeded), "cut at {cut}");
            assert_eq!(line["level"], json!("WARN"));
        }
        // The torn bytes are gone: new records follow the last whole one and read back.
        if cut == seeded + 1 || cut == assigned - 1 {
            ok(&client, &base, Method::POST, "/pools/p/assign", json!({})).await;
            terminate(&mut service);
            let again = ServiceProcess::start(&on_dir(&copy.0, &[]));
            let members = get(&client, &again.base, "/pools/p/members").await;
            assert_eq!(members["members"][0]["assignments"], json!(0));
            assert_eq!(
                members["members"][1]["assignments"],
                json!(1),
                "cut at {cut}"
            );
            assert!(again.wait_lines("cut short", 1).is_empty());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_in_the_middle_of_the_log_refuses_to_start_naming_the_file_and_offset() {
    let (dir, [created, seeded, _]) = three_frames().await;
    // A byte of the seeding's payload, and a byte of its frame's length.
    for at in [seeded - 3, created + 1] {
        let copy = copy_of(&dir.0);
        let log = log_of(&copy.0);
        let mut bytes = std::fs::read(&log).expect("read");
        bytes[at as usize] ^= 0x01;
        std::fs::write(&log, &bytes).expect("written");
        let (code, lines) = run_to_exit(&on_dir(&copy.0, &[]));
        assert_eq!(code, Some(1), "{lines:?}");
        let refusal = lines
            .iter()
            .find(|line| line.contains("cannot start"))
            .unwrap_or_else(|| panic!("a refusal in {lines:?}"));
        let expected = format!("{} is damaged at byte {created}", log.display());
        assert!(refusal.contains(&expected), "{expected} in {refusal}");
        assert!(
            !lines.iter().any(|line| line.contains("\"listening\"")),
            "{lines:?}"
        );
        // Nothing was changed: the file is as damaged as it was.
        assert_eq!(std::fs::read(&log).expect("read"), bytes);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_on_the_same_data_directory_refuses_to_start() {
    let dir = DataDir(fresh_data_dir());
    let env = on_dir(&dir.0, &[]);
    let first = ServiceProcess::start(&env);
    let client = Client::new();
    ok(&client, &first.base, Method::PUT, "/pools/p", json!({})).await;
    let (code, lines) = run_to_exit(&env);
    assert_eq!(code, Some(1), "{lines:?}");
    let expected = format!("{} is in use by another process (pid ", dir.0.display());
    assert!(
        lines
            .iter()
            .any(|line| line.contains("cannot start") && line.contains(&expected)),
        "{expected} in {lines:?}"
    );
    // The first one goes on undisturbed.
    assert_eq!(
        get(&client, &first.base, "/pools/p").await["pool"],
        json!("p")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_start_up_line_says_whether_the_embedded_store_keeps_anything() {
    let in_memory = ServiceProcess::start(&[]);
    let line = in_memory.wait_lines("using the embedded store", 1);
    assert_eq!(line.len(), 1, "{:?}", in_memory.all_lines());
    assert!(
        line[0].contains("in memory; pools are neither shared with other replicas nor kept across restarts (set DATA_DIR to keep them)"),
        "{}",
        line[0]
    );
    let dir = DataDir(fresh_data_dir());
    let on_disk = ServiceProcess::start(&on_dir(&dir.0, &[("FSYNC_INTERVAL_MS", "250")]));
    let line = on_disk.wait_lines("using the embedded store", 1);
    assert_eq!(line.len(), 1, "{:?}", on_disk.all_lines());
    let line: Value = serde_json::from_str(&line[0]).expect("JSON");
    assert_eq!(line["data_dir"], json!(dir.0.display().to_string()));
    assert_eq!(line["fsync_interval_ms"], json!(250));
    assert!(
        line["message"]
            .as_str()
            .is_some_and(|m| m.contains("kept across restarts"))
    );
}

#[test]
fn a_data_directory_with_a_redis_setting_refuses_to_start() {
    let dir = DataDir(fresh_data_dir());
    let (code, lines) = run_to_exit(&on_dir(&dir.0, &[("REDIS_URL", "redis://127.0.0.1:1")]));
    assert_eq!(code, Some(1), "{lines:?}");
    assert!(
        lines.iter().any(|line| line.contains(
            "DATA_DIR is where the embedded store keeps its state, but a Redis setting is given"
        )),
        "{lines:?}"
    );
    assert!(!dir.0.exists(), "the directory is not even created");
}

/// The commands of the first `console` block after `heading` in `page` (a page of the
/// book), each with the lines it prints.
fn console_block(page: &str, heading: &str) -> Vec<(String, Vec<String>)> {
    let section = &page[page
        .find(heading)
        .unwrap_or_else(|| panic!("{heading} in the page"))..];
    let start = section.find("```console\n").expect("a console block") + "```console\n".len();
    let block = &section[start..];
    let block = &block[..block.find("```").expect("the block's end")];
    let mut commands: Vec<(String, Vec<String>)> = Vec::new();
    for line in block.lines() {
        match line.strip_prefix("$ ") {
            Some(command) => commands.push((command.to_owned(), Vec::new())),
            None => commands
                .last_mut()
                .expect("output after a command")
                .1
                .push(line.to_owned()),
        }
    }
    commands
}

/// Runs one of the book's commands in `cwd` with the walkthrough's variables (its first line,
/// pointed at `base`); the lines it printed.
fn shell(cwd: &Path, variables: &str, base: &str, command: &str) -> Vec<String> {
    let variables = variables.replace("http://127.0.0.1:8080", base);
    let output = std::process::Command::new("bash")
        .args(["-c", &format!("{variables}\n{command}")])
        .current_dir(cwd)
        .output()
        .expect("bash runs (with curl and jq on PATH)");
    assert!(output.status.success(), "{command}: {output:?}");
    String::from_utf8(output.stdout)
        .expect("UTF-8")
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_books_restart_after_the_walkthrough_replays_as_printed() {
    let getting_started = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/src/getting-started.md"
    ))
    .expect("the book's getting started page");
    let operating = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/src/operating.md"
    ))
    .expect("the book's operating page");
    let walkthrough = console_block(&getting_started, "## Operator walkthrough");
    let restart = console_block(&operating, "### The embedded store on disk");
    let (variables, none) = &walkthrough[0];
    assert!(
        variables.starts_with("T=") && none.is_empty(),
        "{variables}"
    );

    let cwd = DataDir(fresh_data_dir());
    std::fs::create_dir_all(&cwd.0).expect("a directory");
    // The book's `DATA_DIR=./data`, relative to where its commands run.
    let start = |line: &str| {
        let (assignments, rest) = line.split_once(" cargo run --release").expect("a start");
        assert_eq!(rest.trim(), "&", "{line}");
        let env: Vec<(&'static str, String)> = assignments
            .split(' ')
            .map(|pair| match pair.split_once('=') {
                Some(("DATA_DIR", "./data")) => {
                    ("DATA_DIR", cwd.0.join("data").display().to_string())
                }
                Some(("ADMIN_TOKEN", token)) => ("ADMIN_TOKEN", token.to_owned()),
                _ => panic!("unexpected {pair} in {line}"),
            })
            .collect();
        ServiceProcess::start(&env)
    };
    let mut service = start("DATA_DIR=./data ADMIN_TOKEN=s3cret cargo run --release &");
    let mut replayed = 0;
    for (command, printed) in walkthrough[1..].iter().chain(&restart) {
        if command.starts_with("kill -TERM %1") {
            terminate(&mut service);
            assert!(printed.is_empty());
        } else if command.starts_with("DATA_DIR=") {
            service = start(command);
            assert!(printed.is_empty());
        } else {
            let output = shell(&cwd.0, variables, &service.base, command);
            assert_eq!(&output, printed, "{command}");
        }
        replayed += 1;
    }
    assert_eq!(replayed, walkthrough.len() - 1 + restart.len());
    assert!(
        restart.len() >= 6,
        "the restart block is there: {restart:?}"
    );
}
