//! The operator commands of the binary (`pools ...`, `members ...`) against a running
//! service: what they print, and their exit codes.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use reqwest::{Method, StatusCode};

use crate::helpers::{ADMIN, Backend, TestApp, read};

/// What one run of the binary did.
#[derive(Debug, PartialEq, Eq)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn ok(stdout: &str) -> Self {
        Self {
            code: 0,
            stdout: stdout.to_owned(),
            stderr: String::new(),
        }
    }

    fn failed(code: i32, stderr: &str) -> Self {
        Self {
            code,
            stdout: String::new(),
            stderr: stderr.to_owned(),
        }
    }
}

/// Runs the binary with `args` against `base`, with the admin token in the environment
/// unless `env` says otherwise, and `stdin` as standard input.
async fn run_with(base: &str, args: &[&str], env: &[(&str, &str)], stdin: &[u8]) -> Run {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_proxy-allocator"));
    cmd.args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("PROXY_ALLOCATOR_URL", base)
        .env("ADMIN_TOKEN", ADMIN)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("the binary starts");
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(stdin).await.expect("stdin written");
    drop(input);
    let output = child.wait_with_output().await.expect("the binary ends");
    Run {
        code: output.status.code().expect("an exit code"),
        stdout: String::from_utf8(output.stdout).expect("UTF-8 output"),
        stderr: String::from_utf8(output.stderr).expect("UTF-8 errors"),
    }
}

async fn run(app: &TestApp, args: &[&str]) -> Run {
    run_with(&app.base, args, &[], b"").await
}

const P1: &str = "http://p1.example.net:3128";
const P2: &str = "http://p2.example.net:3128";
const P3: &str = "http://p3.example.net:3128";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_create_show_list_and_delete_print_what_they_did_and_exit_zero() {
    let app = TestApp::spawn(Backend::Embedded).await;
    assert_eq!(
        run(&app, &["pools", "create", "web", "--restore", "history"]).await,
        Run::ok(
            "created pool web\n\
             policy                           least-used\n\
             restore                          history\n\
             start_assignments                -\n\
             lease_ttl_ms                     30000\n\
             max_in_flight                    -\n\
             health.backoff                   2\n\
             health.check                     -\n\
             health.cooldown_ms               60000\n\
             health.jitter_percent            10\n\
             health.max_consecutive_failures  3\n\
             health.max_cooldown_ms           3600000\n\
             health.target_ban_ms             600000\n\
             rules.allow_credentials          true\n\
             rules.allow_hostnames            true\n\
             rules.allow_private              false\n\
             rules.max_members                -\n\
             rules.opaque_ids                 true\n\
             rules.ports.allow                [[1,65535]]\n\
             rules.ports.deny                 []\n\
             rules.schemes                    [\"http\",\"https\"]\n\
             session_ttl_ms                   600000\n"
        )
    );
    let replace = [
        "pools",
        "create",
        "web",
        "--policy",
        "least-in-flight",
        "--max-in-flight",
        "1",
        "--lease-ttl-ms",
        "60000",
    ];
    assert_eq!(
        run(&app, &replace).await,
        Run::ok(
            "replaced the configuration of pool web\n\
             policy                           least-in-flight\n\
             restore                          minimum\n\
             start_assignments                -\n\
             lease_ttl_ms                     60000\n\
             max_in_flight                    1\n\
             health.backoff                   2\n\
             health.check                     -\n\
             health.cooldown_ms               60000\n\
             health.jitter_percent            10\n\
             health.max_consecutive_failures  3\n\
             health.max_cooldown_ms           3600000\n\
             health.target_ban_ms             600000\n\
             rules.allow_credentials          true\n\
             rules.allow_hostnames            true\n\
             rules.allow_private              false\n\
             rules.max_members                -\n\
             rules.opaque_ids                 true\n\
             rules.ports.allow                [[1,65535]]\n\
             rules.ports.deny                 []\n\
             rules.schemes                    [\"http\",\"https\"]\n\
             session_ttl_ms                   600000\n"
        )
    );
    app.seed("web", &[P1, P2], Some(7)).await;
    let (_, info) = app.get("/pools/web").await;
    let created_at = info["created_at"].as_str().expect("created_at");
    assert_eq!(
        run(&app, &["pools", "show", "web"]).await,
        Run::ok(&format!(
            "pool                             web\n\
             policy                           least-in-flight\n\
             restore                          minimum\n\
             start_assignments                -\n\
             lease_ttl_ms                     60000\n\
             max_in_flight                    1\n\
             health.backoff                   2\n\
             health.check                     -\n\
             health.cooldown_ms               60000\n\
             health.jitter_percent            10\n\
             health.max_consecutive_failures  3\n\
             health.max_cooldown_ms           3600000\n\
             health.target_ban_ms             600000\n\
             rules.allow_credentials          true\n\
             rules.allow_hostnames            true\n\
             rules.allow_private              false\n\
             rules.max_members                -\n\
             rules.opaque_ids                 true\n\
             rules.ports.allow                [[1,65535]]\n\
             rules.ports.deny                 []\n\
             rules.schemes                    [\"http\",\"https\"]\n\
             session_ttl_ms                   600000\n\
             created_at                       {created_at}\n\
             eligible                         2\n\
             ineligible                       0\n\
             in_flight                        0\n\
             min_assignments                  7\n\
             max_assignments                  7\n\
             total_assignments                0\n\
             abandoned                        0\n\
             country_mismatches               0\n\
             pruned                           0\n\
             recovered                        0\n\
             shared_exit_ips                  0\n\
             tripped                          0\n"
        ))
    );
    app.create_pool("api", json!({})).await;
    assert_eq!(
        run(&app, &["pools", "list"]).await,
        Run::ok(
            "POOL  POLICY           ELIGIBLE  INELIGIBLE  IN_FLIGHT  MIN  MAX  TOTAL\n\
             api   least-used              0           0          0    -    -      0\n\
             web   least-in-flight         2           0          0    7    7      0\n"
        )
    );
    assert_eq!(
        run(&app, &["pools", "delete", "web"]).await,
        Run::ok("deleted pool web\n")
    );
    assert_eq!(
        run(&app, &["pools", "delete", "api"]).await,
        Run::ok("deleted pool api\n")
    );
    assert_eq!(run(&app, &["pools", "list"]).await, Run::ok("no pools\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_add_and_list_take_labels_and_the_listing_shows_them() {
    let app = TestApp::spawn(Backend::Embedded).await;
    app.create_pool("web", json!({})).await;
    let added = run(
        &app,
        &[
            "members",
            "add",
            "web",
            P1,
            P2,
            "--label",
            "country=de",
            "--label",
            "tier=a",
        ],
    )
    .await;
    assert_eq!(added.code, 0, "{added:?}");
    run(&app, &["members", "add", "web", P3]).await;
    assert_eq!(
        run(&app, &["members", "list", "web", "--label", "country=de"]).await,
        Run::ok(&format!(
            "MEMBER                      STATE     ASSIGNMENTS  IN_FLIGHT  REASON  SINCE  LABELS\n\
             {P1}  eligible            0          0       -      -  country=de,tier=a\n\
             {P2}  eligible            0          0       -      -  country=de,tier=a\n"
        ))
    );
    let refused = run(
        &app,
        &["members", "add", "web", P3, "--label", "Country=de"],
    )
    .await;
    assert_ne!(refused.code, 0, "{refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_list_with_a_target_shows_each_member_s_ban_for_it() {
    let app = TestApp::spawn(Backend::Embedded).await;
    app.create_pool("web", json!({})).await;
    app.seed("web", &[P1, P2], Some(0)).await;
    let (status, body) = read(
        app.anonymous(Method::POST, "/pools/web/outcomes")
            .json(&json!({"proxy": P2, "result": "blocked", "target": "shop.example.com"}))
            .send()
            .await
            .expect("sent"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let until = body["outcomes"][0]["banned_until"]
        .as_str()
        .expect("banned");
    assert_eq!(
        run(
            &app,
            &["members", "list", "web", "--target", "shop.example.com"]
        )
        .await,
        Run::ok(&format!(
            "MEMBER                      STATE     ASSIGNMENTS  IN_FLIGHT  REASON  SINCE  BANNED_UNTIL\n\
             {P1}  eligible            0          0       -      -  -\n\
             {P2}  eligible            0          0       -      -  {until}\n"
        ))
    );
    let refused = run(&app, &["members", "list", "web", "--target", "a b"]).await;
    assert_ne!(refused.code, 0, "{refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_add_disable_list_and_enable_report_each_member_and_exit_zero() {
    let app = TestApp::spawn(Backend::Embedded).await;
    app.create_pool("web", json!({})).await;
    assert_eq!(
        run(&app, &["members", "add", "web", P1, P2, P3]).await,
        Run::ok(&format!(
            "MEMBER                      RESULT\n\
             {P1}  added\n\
             {P2}  added\n\
             {P3}  added\n\
             3 added, 0 existing, 0 rejected\n\
             new members start at 0 assignments\n"
        ))
    );
    assert_eq!(
        run(&app, &["members", "add", "web", P1, "--assignments", "9"]).await,
        Run::ok(&format!(
            "MEMBER                      RESULT\n\
             {P1}  existing\n\
             0 added, 1 existing, 0 rejected\n"
        ))
    );
    for _ in 0..6 {
        app.assigned("web").await;
    }
    assert_eq!(
        run(
            &app,
            &["members", "disable", "web", P3, "--reason", "timeouts"]
        )
        .await,
        Run::ok(&format!(
            "MEMBER                      RESULT\n\
             {P3}  disabled\n\
             1 disabled, 0 already ineligible, 0 unknown, 0 rejected\n"
        ))
    );
    app.assigned("web").await;
    let members = app.members("web").await;
    let since = members[1]["since"].as_str().expect("since");
    // Equal counts list in id order, whatever the state.
    assert_eq!(
        run(&app, &["members", "list", "web"]).await,
        Run::ok(&format!(
            "MEMBER                      STATE       ASSIGNMENTS  IN_FLIGHT  REASON    SINCE\n\
             {P2}  eligible              2          0  -         -\n\
             {P3}  ineligible            2          0  timeouts  {since}\n\
             {P1}  eligible              3          0  -         -\n"
        ))
    );
    assert_eq!(
        run(&app, &["members", "list", "web", "--state", "ineligible"]).await,
        Run::ok(&format!(
            "MEMBER                      STATE       ASSIGNMENTS  IN_FLIGHT  REASON    SINCE\n\
             {P3}  ineligible            2          0  timeouts  {since}\n"
        ))
    );
    assert_eq!(
        run(
            &app,
            &["members", "enable", "web", P3, P1, "--restore", "zero"]
        )
        .await,
        Run::ok(&format!(
            "MEMBER                      RESULT\n\
             {P3}  enabled at 0 (kept 2)\n\
             {P1}  already eligible\n\
             1 enabled, 1 already eligible, 0 unknown, 0 rejected\n\
             restore policy: zero\n"
        ))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_naming_unknown_or_invalid_members_applies_the_rest_and_exits_4() {
    let app = TestApp::spawn(Backend::Embedded).await;
    app.create_pool("web", json!({})).await;
    app.seed("web", &[P1], None).await;
    let disable = [
        "members", "disable", "web", P1, P2, "bad id", "--reason", "ban",
    ];
    assert_eq!(
        run(&app, &disable).await,
        Run {
            code: 4,
            stdout: format!(
                "MEMBER                      RESULT\n\
                 {P1}  disabled\n\
                 {P2}  unknown\n\
                 bad id                      rejected: invalid_characters\n\
                 1 disabled, 0 already ineligible, 1 unknown, 1 rejected\n"
            ),
            stderr: "error: 1 unknown and 1 rejected of the members named; the others were \
                     applied\n"
                .to_owned(),
        }
    );
    assert_eq!(
        app.counts("web").await,
        [(P1.to_owned(), 0, "ineligible".to_owned())]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_disable_without_a_reason_records_the_services_default_like_the_api() {
    let app = TestApp::spawn(Backend::Embedded).await;
    app.create_pool("web", json!({})).await;
    app.seed("web", &[P1], None).await;
    assert_eq!(
        run(&app, &["members", "disable", "web", P1]).await,
        Run::ok(&format!(
            "MEMBER                      RESULT\n\
             {P1}  disabled\n\
             1 disabled, 0 already ineligible, 0 unknown, 0 rejected\n"
        ))
    );
    assert_eq!(app.members("web").await[0]["reason"], json!("disabled"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_whose_every_member_is_unknown_exits_4_and_says_nothing_was_applied() {
    let app = TestApp::spawn(Backend::Embedded).await;
    app.create_pool("web", json!({})).await;
    assert_eq!(
        run(&app, &["members", "enable", "web", P2]).await,
        Run {
            code: 4,
            stdout: format!(
                "MEMBER                      RESULT\n\
                 {P2}  unknown\n\
                 0 enabled, 0 already eligible, 1 unknown, 0 rejected\n"
            ),
            stderr: "error: 1 unknown of the members named; nothing was applied\n".to_owned(),
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_changed_no_member_names_neither_new_members_nor_a_restore() {
    let app = TestApp::spawn(Backend::Embedded).await;
    app.create_pool("web", json!({})).await;
    app.seed("web", &[P1], None).await;
    assert_eq!(
        run(&app, &["members", "add", "web", P1, "bad id"]).await,
        Run {
            code: 4,
            stdout: format!(
                "MEMBER                      RESULT\n\
                 {P1}  existing\n\
                 bad id                      rejected: invalid_characters\n\
                 0 added, 1 existing, 1 rejected\n"
            ),
            stderr: "error: 1 rejected of the members named; the others needed no change\n"
                .to_owned(),
        }
    );
    assert_eq!(
        run(&app, &["members", "enable", "web", P1, P2]).await,
        Run {
            code: 4,
            stdout: format!(
                "MEMBER                      RESULT\n\
                 {P1}  already eligible\n\
                 {P2}  unknown\n\
                 0 enabled, 1 already eligible, 1 unknown, 0 rejected\n"
            ),
            stderr: "error: 1 unknown of the members named; the others needed no change\n"
                .to_owned(),
        }
    );
}

/// With the token and the URL in the environment (as the book's operator commands set them),
/// a usage error shows the command's own usage line, not `--admin-token` and `--url` as if
/// required.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_errors_do_not_show_options_given_through_the_environment_as_required() {
    let run = run_with("http://127.0.0.1:9", &["members", "add", "web"], &[], b"").await;
    assert_eq!(
        run,
        Run::failed(
            2,
            "error: the following required arguments were not provided:\n  \
             <MEMBERS>...\n\n\
             Usage: proxy-allocator members add [OPTIONS] <POOL> <MEMBERS>...\n\n\
             For more information, try '--help'.\n"
        )
    );
}

/// The operator options belong to `pools` and `members`: given before them, they are
/// refused, with clap's pointer to where they go (the book's getting started page says so
/// too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_options_before_the_command_are_refused_with_a_pointer_to_their_place() {
    let run = run_with(
        "http://127.0.0.1:9",
        &["--url", "http://127.0.0.1:9", "pools", "list"],
        &[],
        b"",
    )
    .await;
    assert_eq!(run.code, 2);
    assert!(
        run.stderr.starts_with(
            "error: unexpected argument '--url' found\n\n  tip: 'pools --url' exists\n"
        ),
        "{}",
        run.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_end_ends_a_live_session_once_and_escapes_its_id() {
    let app = TestApp::spawn(Backend::Embedded).await;
    app.create_pool("web", json!({})).await;
    app.seed("web", &[P1, P2], Some(0)).await;
    let (status, body) = app
        .post_json("/pools/web/assign", json!({"session": "user/42?x=%"}))
        .await;
    assert_eq!(status, reqwest::StatusCode::OK, "{body}");
    assert_eq!(
        run(&app, &["sessions", "end", "web", "user/42?x=%"]).await,
        Run::ok("ended session user/42?x=% of pool web\n")
    );
    assert_eq!(
        run(&app, &["sessions", "end", "web", "user/42?x=%"]).await,
        Run::failed(
            1,
            "error: no such live session in this pool (session_not_found, HTTP 404)\n"
        )
    );
    let json = run(&app, &["sessions", "end", "web", "gone", "--json"]).await;
    assert_eq!(json.code, 1, "{json:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_create_list_show_rotate_and_delete_print_what_they_did() {
    let app = TestApp::spawn(Backend::Embedded).await;
    let created = run(
        &app,
        &[
            "clients", "create", "team-a", "--pool", "web", "--pool", "eu-*",
        ],
    )
    .await;
    assert_eq!(created.code, 0, "{created:?}");
    let token = created
        .stdout
        .strip_prefix("client team-a: token ")
        .and_then(|rest| rest.split_once('\n'))
        .map(|(token, _)| token.to_owned())
        .expect("the token line");
    assert_eq!(token.len(), 43);
    assert_eq!(
        created.stdout,
        format!(
            "client team-a: token {token}\n(shown this once: the service keeps only its hash)\n"
        )
    );
    assert_eq!(
        run(&app, &["clients", "create", "team-a", "--pool", "web"]).await,
        Run::ok("client team-a: configuration replaced, token kept\n")
    );
    assert_eq!(
        run(&app, &["clients", "list"]).await,
        Run::ok("team-a\tweb\n")
    );
    let limited = [
        "clients",
        "create",
        "team-a",
        "--pool",
        "web",
        "--rate-per-second",
        "50",
        "--burst",
        "100",
    ];
    assert_eq!(
        run(&app, &limited).await,
        Run::ok("client team-a: configuration replaced, token kept\n")
    );
    assert_eq!(
        run(&app, &["clients", "show", "team-a"]).await,
        Run::ok("team-a\tweb\t50/s burst 100\n")
    );
    let hostile = [
        "clients",
        "create",
        "team-a",
        "--pool",
        "web",
        "--rate-per-second",
        "0",
    ];
    assert_eq!(
        run(&app, &hostile).await,
        Run::failed(
            1,
            "error: rate_per_second: a whole number from 1 to 100000 (invalid_request, HTTP 400)\n"
        )
    );
    let rotated = run(&app, &["clients", "rotate", "team-a", "--json"]).await;
    assert_eq!(rotated.code, 0, "{rotated:?}");
    let answer: Value = serde_json::from_str(&rotated.stdout).expect("JSON");
    assert_eq!(answer["client"], json!("team-a"));
    assert_ne!(answer["token"], json!(token));
    assert_eq!(
        run(&app, &["clients", "delete", "team-a"]).await,
        Run::ok("deleted client team-a\n")
    );
    assert_eq!(
        run(&app, &["clients", "show", "team-a"]).await,
        Run::failed(1, "error: client not found (client_not_found, HTTP 404)\n")
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_exit_non_zero_with_the_services_message_on_stderr() {
    let app = TestApp::spawn(Backend::Embedded).await;
    assert_eq!(
        run(&app, &["pools", "show", "nowhere"]).await,
        Run::failed(1, "error: pool not found (pool_not_found, HTTP 404)\n")
    );
    assert_eq!(
        run(&app, &["members", "add", "nowhere", P1]).await,
        Run::failed(1, "error: pool not found (pool_not_found, HTTP 404)\n")
    );
    assert_eq!(
        run_with(
            &app.base,
            &["pools", "list"],
            &[("ADMIN_TOKEN", "wrong")],
            b""
        )
        .await,
        Run::failed(
            1,
            "error: a valid bearer token is required (unauthorized, HTTP 401)\n"
        )
    );
    assert_eq!(
        run_with(&app.base, &["pools", "list"], &[("ADMIN_TOKEN", "")], b"").await,
        Run::failed(
            2,
            "error: no admin token: set ADMIN_TOKEN or ADMIN_TOKEN_FILE (or pass --admin-token)\n"
        )
    );
    let bad_id = run(&app, &["pools", "show", "../livez"]).await;
    assert_eq!(bad_id.code, 2, "{bad_id:?}");
    assert!(
        bad_id.stderr.contains("a pool id is 1 to 64 characters"),
        "{bad_id:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_that_does_not_answer_exits_3() {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    let base = format!("http://127.0.0.1:{port}");
    let run = run_with(&base, &["pools", "list"], &[], b"").await;
    assert_eq!((run.code, run.stdout.as_str()), (3, ""), "{run:?}");
    assert!(
        run.stderr
            .starts_with(&format!("error: cannot reach {base}: ")),
        "{run:?}"
    );
    assert!(run.stderr.contains("Connection refused"), "{run:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_prints_the_services_answer_and_a_listing_follows_every_page() {
    let app = TestApp::spawn(Backend::Embedded).await;
    app.create_pool("web", json!({})).await;
    let (_, info) = app.get("/pools/web").await;
    let shown = run(&app, &["pools", "show", "web", "--json"]).await;
    assert_eq!((shown.code, shown.stderr.as_str()), (0, ""));
    assert_eq!(
        serde_json::from_str::<Value>(&shown.stdout).expect("JSON"),
        info
    );

    // More members than one page of the service's listing holds.
    let ids: Vec<String> = (0..1_001)
        .map(|i| format!("http://p{i:04}.example.net:3128"))
        .collect();
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    app.seed("web", &refs, None).await;
    let listed = run(&app, &["members", "list", "web", "--json"]).await;
    assert_eq!((listed.code, listed.stderr.as_str()), (0, ""));
    let listed: Value = serde_json::from_str(&listed.stdout).expect("JSON");
    let members = listed["members"].as_array().expect("members");
    assert_eq!(listed["pool"], json!("web"));
    assert_eq!(members.len(), 1_001);
    assert_eq!(
        members[1_000]["member"],
        json!("http://p1000.example.net:3128")
    );

    let created = run(&app, &["pools", "create", "api", "--json"]).await;
    assert_eq!(
        serde_json::from_str::<Value>(&created.stdout).expect("JSON"),
        json!({
            "pool": "api",
            "created": true,
            "config": {
                "policy": "least-used",
                "restore": "minimum",
                "start_assignments": null,
                "lease_ttl_ms": 30000,
                "max_in_flight": null,
                "session_ttl_ms": 600000,
                "rules": serde_json::to_value(proxy_allocator::domain::Rules::default()).expect("JSON"),
                "health": serde_json::to_value(proxy_allocator::domain::HealthConfig::default()).expect("JSON"),
            },
        })
    );
    let deleted = run(&app, &["pools", "delete", "api", "--json"]).await;
    assert_eq!(
        serde_json::from_str::<Value>(&deleted.stdout).expect("JSON"),
        json!({ "pool": "api", "deleted": true })
    );
}

/// A one-request HTTP server that records the request and answers `answer` (JSON, 200):
/// for routes the service in this tree does not serve yet.
fn fake_service(answer: Value) -> (String, std::thread::JoinHandle<(String, Vec<u8>)>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
    let base = format!("http://{}", listener.local_addr().expect("an address"));
    let handle = std::thread::spawn(move || {
        let (stream, _) = listener.accept().expect("a connection");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("a timeout");
        let mut reader = BufReader::new(stream);
        let mut head = String::new();
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).expect("a header line");
            if line == "\r\n" || line.is_empty() {
                break;
            }
            head.push_str(&line);
        }
        let length: usize = head
            .lines()
            .find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse().ok())?
            })
            .unwrap_or(0);
        let mut body = vec![0; length];
        reader.read_exact(&mut body).expect("the body");
        let answer = answer.to_string();
        let mut stream = reader.into_inner();
        write!(
            stream,
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
             connection: close\r\n\r\n{answer}",
            answer.len()
        )
        .expect("answered");
        (head, body)
    });
    (base, handle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_import_sends_the_list_as_text_and_prints_the_report() {
    let report = json!({
        "accepted": 2, "added": 1, "existing": 1, "duplicates": 1,
        "rejected": {"private_address": 1},
        "examples": [{"line": 4, "input": "10.0.0.5:80", "reason": "private_address"}],
    });
    let list = b"# free proxies\n1.2.3.4:8080\nhttp://1.2.3.4:8080\n10.0.0.5:80\n5.6.7.8:3128\n";

    let (base, fake) = fake_service(report.clone());
    let args = ["members", "import", "web", "-", "--dry-run"];
    assert_eq!(
        run_with(&base, &args, &[], list).await,
        Run::ok(
            "dry run: nothing was written\n\
             accepted    2 (1 added, 1 existing)\n\
             duplicates  1\n\
             rejected    1 (private_address 1)\n\
             LINE  REASON           INPUT\n\
             \x20  4  private_address  10.0.0.5:80\n"
        )
    );
    let (head, body) = fake.join().expect("the fake ran");
    let head = head.to_ascii_lowercase();
    assert!(
        head.starts_with("post /pools/web/import?dry_run=true http/1.1\r\n"),
        "{head}"
    );
    assert!(
        head.contains("content-type: text/plain; charset=utf-8\r\n"),
        "{head}"
    );
    assert!(
        head.contains(&format!("authorization: bearer {ADMIN}\r\n")),
        "{head}"
    );
    assert_eq!(body, list);

    // From a file, with a scheme, for real, as JSON.
    let file = std::env::temp_dir().join(format!("pa-import-{}.txt", std::process::id()));
    std::fs::write(&file, list).expect("the list is written");
    let (base, fake) = fake_service(report.clone());
    let path = file.to_str().expect("a UTF-8 path");
    let args = [
        "members",
        "import",
        "web",
        path,
        "--default-scheme",
        "socks5",
        "--json",
    ];
    let imported = run_with(&base, &args, &[], b"").await;
    let _ = std::fs::remove_file(&file);
    assert_eq!((imported.code, imported.stderr.as_str()), (0, ""));
    assert_eq!(
        serde_json::from_str::<Value>(&imported.stdout).expect("JSON"),
        report
    );
    let (head, body) = fake.join().expect("the fake ran");
    assert!(
        head.starts_with("POST /pools/web/import?default_scheme=socks5 HTTP/1.1\r\n"),
        "{head}"
    );
    assert_eq!(body, list);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_import_of_a_missing_file_exits_2_before_sending() {
    let app = TestApp::spawn(Backend::Embedded).await;
    assert_eq!(
        run(&app, &["members", "import", "web", "/nonexistent/list.txt"]).await,
        Run::failed(
            2,
            "error: cannot read /nonexistent/list.txt: No such file or directory (os error 2)\n"
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_runs_the_service_that_the_operator_commands_reach() {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_proxy-allocator"))
        .args(["serve", "--listen", "127.0.0.1:0", "--log-format", "json"])
        .env_clear()
        .env("ADMIN_TOKEN", ADMIN)
        .env("RUST_LOG", "warn,proxy_allocator::startup=info")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the binary starts");
    let stdout = child.stdout.take().expect("stdout");
    let addr = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find(|line| line.contains("\"listening\""))
            .and_then(|line| {
                let value: Value = serde_json::from_str(&line).ok()?;
                value["addr"].as_str().map(str::to_owned)
            })
    })
    .await
    .expect("the log was read")
    .expect("the service logs its address");
    let base = format!("http://{addr}");
    let listed = run_with(&base, &["pools", "list"], &[], b"").await;
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(listed, Run::ok("no pools\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn help_names_every_operator_option_with_its_environment_variable_and_default() {
    let help = run_with("http://unused", &["members", "list", "--help"], &[], b"").await;
    assert_eq!(help.code, 0);
    for expected in [
        "--url <URL>",
        "[env: PROXY_ALLOCATOR_URL=http://unused] [default: http://127.0.0.1:8080]",
        "--admin-token <ADMIN_TOKEN>",
        "[env: ADMIN_TOKEN]",
        "--admin-token-file <ADMIN_TOKEN_FILE>",
        "[env: ADMIN_TOKEN_FILE=]",
        "--timeout-ms <TIMEOUT_MS>",
        "[env: PROXY_ALLOCATOR_TIMEOUT_MS=] [default: 10000]",
        "--state <STATE>",
        "[default: all] [possible values: all, eligible, ineligible]",
        "--json",
    ] {
        assert!(
            help.stdout.contains(expected),
            "{expected:?} in {}",
            help.stdout
        );
    }
}

#[tokio::test]
async fn healthcheck_exits_zero_on_a_live_service_and_one_otherwise() {
    let app = TestApp::spawn(crate::helpers::Backend::Embedded).await;
    let live = format!("{}/livez", app.base);
    let run = run_with(&app.base, &["healthcheck", "--url", &live], &[], b"").await;
    assert_eq!((run.code, run.stdout.as_str()), (0, ""));
    let missing = format!("{}/nope", app.base);
    let run = run_with(&app.base, &["healthcheck", "--url", &missing], &[], b"").await;
    assert_eq!(run.code, 1);
    assert!(run.stderr.contains("404"), "{}", run.stderr);
    let closed = "http://127.0.0.1:9/livez";
    let run = run_with(
        &app.base,
        &["healthcheck", "--url", closed, "--timeout-ms", "500"],
        &[],
        b"",
    )
    .await;
    assert_eq!(run.code, 1);
}

#[tokio::test]
async fn members_import_against_the_service_dry_runs_then_imports() {
    let app = TestApp::spawn(Backend::Embedded).await;
    app.create_pool("web", json!({})).await;
    let list = b"# free proxies\n1.2.3.4:8080\nhttp://1.2.3.4:8080\n10.0.0.5:80\n5.6.7.8:3128\n";
    let dry = run_with(
        &app.base,
        &["members", "import", "web", "-", "--dry-run"],
        &[],
        list,
    )
    .await;
    assert_eq!(
        dry,
        Run::ok(
            "dry run: nothing was written\n\
             accepted    2 (2 added, 0 existing)\n\
             duplicates  1\n\
             rejected    1 (private_address 1)\n\
             LINE  REASON           INPUT\n\
             \x20  4  private_address  10.0.0.5:80\n\
             hint (private_address): set rules.allow_private to accept private and loopback addresses\n"
        )
    );
    assert_eq!(app.counts("web").await, []);
    let real = run_with(&app.base, &["members", "import", "web", "-"], &[], list).await;
    assert_eq!((real.code, real.stderr.as_str()), (0, ""));
    assert!(
        real.stdout
            .starts_with("accepted    2 (2 added, 0 existing)\n"),
        "{}",
        real.stdout
    );
    assert_eq!(
        app.counts("web").await,
        [
            ("http://1.2.3.4:8080".to_owned(), 0, "eligible".to_owned()),
            ("http://5.6.7.8:3128".to_owned(), 0, "eligible".to_owned()),
        ]
    );
}

#[tokio::test]
async fn serve_help_names_every_service_option_with_its_environment_variable_and_default() {
    use clap::CommandFactory;
    let help = run_with("http://unused", &["serve", "--help"], &[], b"").await;
    assert_eq!(help.code, 0);
    let command = proxy_allocator::config::Config::command();
    let mut checked = 0;
    // Hidden arguments are not options: they only refuse former names with a pointer to
    // the new ones.
    let options = command
        .get_arguments()
        .filter(|a| a.get_long().is_some() && !a.is_hide_set());
    for arg in options {
        let long = format!("--{}", arg.get_long().expect("a long flag"));
        assert!(help.stdout.contains(&long), "{long} in {}", help.stdout);
        if let Some(env) = arg.get_env() {
            let env = format!("[env: {}", env.to_string_lossy());
            assert!(help.stdout.contains(&env), "{env} in {}", help.stdout);
        }
        if let Some(default) = arg.get_default_values().first() {
            let default = format!("[default: {}]", default.to_string_lossy());
            assert!(help.stdout.contains(&default), "{default} for {long}");
        }
        checked += 1;
    }
    assert!(
        checked >= 15,
        "only {checked} options: the loop must not be vacuous"
    );
    assert!(
        help.stdout
            .contains("[env: LISTEN_ADDR=]\n          [default: 127.0.0.1:8080]"),
        "{}",
        help.stdout
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_list_follows_every_page_of_the_pool_listing() {
    let app = TestApp::spawn(Backend::Embedded).await;
    // More pools than one page of the service's listing holds.
    for i in 0..1_001 {
        app.create_pool(&format!("p{i:04}"), json!({})).await;
    }
    let listed = run(&app, &["pools", "list", "--json"]).await;
    assert_eq!((listed.code, listed.stderr.as_str()), (0, ""));
    let listed: Value = serde_json::from_str(&listed.stdout).expect("JSON");
    let pools = listed["pools"].as_array().expect("pools");
    assert_eq!(pools.len(), 1_001);
    assert_eq!(pools[1_000]["pool"], json!("p1000"));
    let text = run(&app, &["pools", "list"]).await;
    assert_eq!(
        text.stdout.lines().count(),
        1 + 1_001,
        "a header and a line a pool"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_create_takes_sources_and_prune_flags_and_pools_sources_shows_the_last_fetch() {
    let app = TestApp::spawn(Backend::Embedded).await;
    let server = crate::sources::ListServer::start("p1.example.net:3128\nnot a proxy\n").await;
    let created = run(
        &app,
        &[
            "pools",
            "create",
            "listed",
            "--source",
            &server.url,
            "--source-interval-ms",
            "60000",
            "--allow-private-sources",
            "--prune-absent-from-source-fetches",
            "3",
        ],
    )
    .await;
    assert_eq!((created.code, created.stderr.as_str()), (0, ""));
    let (_, info) = app.get("/pools/listed").await;
    assert_eq!(
        (
            &info["config"]["sources"],
            &info["config"]["prune"],
            &info["config"]["rules"]["allow_private_sources"]
        ),
        (
            &json!([{"url": server.url, "interval_ms": 60000, "format": "lines", "default_scheme": "http"}]),
            &json!({"absent_from_source_fetches": 3, "manual": false}),
            &json!(true)
        )
    );
    let fetched = crate::sources::await_source(&app, "listed", crate::sources::fetched(1)).await;
    let at = fetched["last_fetch"]["at"].as_str().expect("a time");
    let shown = run(&app, &["pools", "sources", "listed"]).await;
    assert_eq!((shown.code, shown.stderr.as_str()), (0, ""));
    let cells: Vec<Vec<&str>> = shown
        .stdout
        .lines()
        .map(|line| line.split_whitespace().collect())
        .collect();
    assert_eq!(
        cells,
        [
            vec![
                "URL",
                "INTERVAL_MS",
                "FETCHED",
                "FAILURES",
                "LAST_FETCH",
                "OUTCOME",
                "ADDED",
                "EXISTING",
                "REJECTED",
                "ERROR"
            ],
            vec![
                server.url.as_str(),
                "60000",
                "1",
                "0",
                at,
                "ok",
                "1",
                "0",
                "1",
                "-"
            ],
        ]
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_create_with_allow_private_takes_a_local_proxy() {
    let app = TestApp::spawn(Backend::Embedded).await;
    let created = run(&app, &["pools", "create", "local", "--allow-private"]).await;
    assert_eq!((created.code, created.stderr.as_str()), (0, ""));
    assert!(
        created
            .stdout
            .contains("\nrules.allow_private              true\n"),
        "{}",
        created.stdout
    );
    assert_eq!(
        run(&app, &["members", "add", "local", "127.0.0.1:8101"]).await,
        Run::ok(
            "MEMBER                 RESULT\n\
             http://127.0.0.1:8101  added\n\
             1 added, 0 existing, 0 rejected\n\
             new members start at 0 assignments\n"
        )
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_set_changes_only_the_settings_it_names_and_prints_the_whole_configuration() {
    let app = TestApp::spawn(Backend::Embedded).await;
    app.create_pool(
        "web",
        json!({"restore": "history", "start_assignments": 4, "rules": {"max_members": 9, "ports": {"deny": [25]}}}),
    )
    .await;
    assert_eq!(
        run(&app, &["pools", "set", "web", "--allow-private"]).await,
        Run::ok(
            "changed pool web\n\
             policy                           least-used\n\
             restore                          history\n\
             start_assignments                4\n\
             lease_ttl_ms                     30000\n\
             max_in_flight                    -\n\
             health.backoff                   2\n\
             health.check                     -\n\
             health.cooldown_ms               60000\n\
             health.jitter_percent            10\n\
             health.max_consecutive_failures  3\n\
             health.max_cooldown_ms           3600000\n\
             health.target_ban_ms             600000\n\
             rules.allow_credentials          true\n\
             rules.allow_hostnames            true\n\
             rules.allow_private              true\n\
             rules.max_members                9\n\
             rules.opaque_ids                 true\n\
             rules.ports.allow                [[1,65535]]\n\
             rules.ports.deny                 [25]\n\
             rules.schemes                    [\"http\",\"https\"]\n\
             session_ttl_ms                   600000\n"
        )
    );
    let set = run(
        &app,
        &[
            "pools",
            "set",
            "web",
            "--allow-private=false",
            "--default",
            "rules.max_members",
            "--default",
            "start_assignments",
            "--restore",
            "zero",
            "--json",
        ],
    )
    .await;
    assert_eq!((set.code, set.stderr.as_str()), (0, ""));
    let answer: Value = serde_json::from_str(&set.stdout).expect("JSON");
    let config = &answer["config"];
    assert_eq!(
        (
            &config["restore"],
            &config["start_assignments"],
            &config["rules"]["allow_private"],
            &config["rules"]["max_members"],
            &config["rules"]["ports"]["deny"]
        ),
        (
            &json!("zero"),
            &Value::Null,
            &json!(false),
            &Value::Null,
            &json!([25])
        )
    );
    let (_, info) = app.get("/pools/web").await;
    assert_eq!(&info["config"], config);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_set_refuses_what_the_service_refuses_and_never_creates_a_pool() {
    let app = TestApp::spawn(Backend::Embedded).await;
    assert_eq!(
        run(&app, &["pools", "set", "never", "--allow-private"]).await,
        Run::failed(1, "error: pool not found (pool_not_found, HTTP 404)\n")
    );
    app.create_pool("web", json!({})).await;
    assert_eq!(
        run(&app, &["pools", "set", "web", "--max-in-flight", "2"]).await,
        Run::failed(
            1,
            "error: max_in_flight applies to least-in-flight pools only (invalid_request, HTTP 400)\n"
        )
    );
    assert_eq!(
        run(&app, &["pools", "set", "web"]).await,
        Run::failed(
            2,
            "error: name at least one setting to change (see pools set --help)\n"
        )
    );
    assert_eq!(
        run(
            &app,
            &[
                "pools",
                "set",
                "web",
                "--default",
                "rules",
                "--allow-private"
            ]
        )
        .await,
        Run::failed(
            2,
            "error: rules.allow_private is named twice, or inside another setting\n"
        )
    );
    let (status, _) = app.get("/pools/never").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_add_of_a_refused_address_says_which_rule_to_change_once_per_reason() {
    let app = TestApp::spawn(Backend::Embedded).await;
    app.create_pool("local", json!({})).await;
    let args = [
        "members",
        "add",
        "local",
        "127.0.0.1:8101",
        "127.0.0.1:8102",
        "not a proxy",
        "socks5://8.8.8.8:1080",
    ];
    assert_eq!(
        run(&app, &args).await,
        Run {
            code: 4,
            stdout: "MEMBER                 RESULT\n\
                     127.0.0.1:8101         rejected: private_address\n\
                     127.0.0.1:8102         rejected: private_address\n\
                     not a proxy            rejected: invalid_characters\n\
                     socks5://8.8.8.8:1080  rejected: scheme_not_allowed\n\
                     0 added, 0 existing, 4 rejected\n\
                     hint (private_address): set rules.allow_private to accept private and loopback addresses\n\
                     hint (scheme_not_allowed): add the scheme to rules.schemes to accept it\n"
                .to_owned(),
            stderr: "error: 4 rejected of the members named; nothing was applied\n".to_owned(),
        }
    );
    app.stop().await;
}
