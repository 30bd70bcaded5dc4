//! Candidate import: lists filtered by the pool's rules, seeded like members, reported line
//! by line; dry runs; the import's own body limit.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use proxy_allocator::http::MAX_MEMBERS_PER_CALL;
use proxy_allocator::store::Seed;

use crate::for_each_store;
use crate::helpers::{
    ADMIN, Backend, TestApp, assert_error, backend_config, raw_answer, raw_request, read,
    test_config,
};
use crate::spy::spawn_spied;

/// Posts a list to the import route; returns status and body.
async fn import(
    app: &TestApp,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
) -> (StatusCode, Value) {
    let response = app
        .admin(Method::POST, path)
        .header("content-type", content_type)
        .body(body)
        .send()
        .await
        .expect("sent");
    read(response).await
}

pub(crate) async fn import_text(app: &TestApp, path: &str, text: &str) -> (StatusCode, Value) {
    import(
        app,
        path,
        "text/plain; charset=utf-8",
        text.as_bytes().to_vec(),
    )
    .await
}

/// A messy list in CRLF: comments, blank lines, repeats in other spellings, every kind of
/// rejection.
const MESSY_LIST: &str = "# scraped 2026-11-30\r\n\
1.2.3.4:8080\r\n\
http://1.2.3.4:8080/\r\n\
HTTP://1.2.3.4:8080\r\n\
\r\n\
5.6.7.8:3128:alice:s3cret\r\n\
socks5://9.9.9.9:1080\r\n\
10.0.0.5:80\r\n\
127.0.0.1:6379\r\n\
8.8.8.8:6379\r\n\
[2A00:1450:4001::1]:3128\r\n\
  not a proxy  \r\n\
bob:hunter2@10.1.1.1:8080\r\n\
Proxy.Example.com:3128\r\n";

fn messy_list_report(added: u64, existing: u64) -> Value {
    json!({
        "accepted": 4,
        "added": added,
        "existing": existing,
        "duplicates": 2,
        "rejected": {"port_not_allowed": 1, "private_address": 3, "scheme_not_allowed": 1, "unparsable": 1},
        "examples": [
            {"line": 7, "input": "socks5://9.9.9.9:1080", "reason": "scheme_not_allowed", "hint": "add the scheme to rules.schemes to accept it"},
            {"line": 8, "input": "10.0.0.5:80", "reason": "private_address", "hint": "set rules.allow_private to accept private and loopback addresses"},
            {"line": 9, "input": "127.0.0.1:6379", "reason": "private_address", "hint": "set rules.allow_private to accept private and loopback addresses"},
            {"line": 10, "input": "8.8.8.8:6379", "reason": "port_not_allowed", "hint": "change rules.ports (allow, deny) to accept the port"},
            {"line": 12, "input": "not a proxy", "reason": "unparsable"},
            {"line": 13, "input": "bob:***@10.1.1.1:8080", "reason": "private_address", "hint": "set rules.allow_private to accept private and loopback addresses"},
        ],
    })
}

/// Imports [`MESSY_LIST`] into a pool that denies port 6379 and already holds
/// `http://1.2.3.4:8080` at 7, and checks the exact report.
async fn import_the_messy_list(app: &TestApp, query: &str) {
    app.create_pool("p", json!({"rules": {"ports": {"deny": [6379]}}}))
        .await;
    app.seed("p", &["http://1.2.3.4:8080"], Some(7)).await;
    let (status, body) = import_text(app, &format!("/pools/p/import{query}"), MESSY_LIST).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, messy_list_report(3, 1));
}

async fn importing_a_list_reports_what_became_of_every_line(app: TestApp) {
    import_the_messy_list(&app, "").await;
    // New members start at the current minimum, as when seeding; the existing one keeps
    // its count.
    assert_eq!(
        app.counts("p").await,
        [
            ("http://1.2.3.4:8080".into(), 7, "eligible".into()),
            (
                "http://[2a00:1450:4001::1]:3128".into(),
                7,
                "eligible".into()
            ),
            (
                "http://alice:s3cret@5.6.7.8:3128".into(),
                7,
                "eligible".into()
            ),
            ("http://proxy.example.com:3128".into(), 7, "eligible".into()),
        ]
    );
}

async fn a_dry_run_reports_the_same_and_writes_nothing(app: TestApp) {
    import_the_messy_list(&app, "?dry_run=true").await;
    assert_eq!(
        app.counts("p").await,
        [("http://1.2.3.4:8080".into(), 7, "eligible".into())]
    );
}

async fn a_json_array_is_imported_like_a_list(app: TestApp) {
    app.create_pool("p", json!({})).await;
    let list = json!([
        "1.2.3.4:8080",
        "",
        "# comment",
        "1.2.3.4:8080",
        "10.0.0.1:80",
        "u:p@8.8.8.8:80"
    ]);
    let (status, body) = import(
        &app,
        "/pools/p/import",
        "application/json",
        list.to_string().into_bytes(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"accepted": 2, "added": 2, "existing": 0, "duplicates": 1,
               "rejected": {"private_address": 1},
               "examples": [{"line": 5, "input": "10.0.0.1:80", "reason": "private_address", "hint": "set rules.allow_private to accept private and loopback addresses"}]})
    );
}

async fn lines_without_a_scheme_take_the_default_scheme(app: TestApp) {
    app.create_pool("p", json!({"rules": {"schemes": ["socks5"]}}))
        .await;
    let (_, body) = import_text(
        &app,
        "/pools/p/import?default_scheme=socks5",
        "1.2.3.4:1080\nhttp://1.2.3.4:8080\n",
    )
    .await;
    assert_eq!(body["added"], json!(1));
    assert_eq!(body["rejected"], json!({"scheme_not_allowed": 1}));
    assert_eq!(app.counts("p").await[0].0, "socks5://1.2.3.4:1080");
}

async fn lines_that_are_not_utf8_are_rejected_one_by_one(app: TestApp) {
    app.create_pool("p", json!({})).await;
    let (status, body) = import(
        &app,
        "/pools/p/import",
        "text/plain",
        b"1.2.3.4:80\n\xc3\x28:80\n5.6.7.8:80\n".to_vec(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"accepted": 2, "added": 2, "existing": 0, "duplicates": 0,
               "rejected": {"unparsable": 1},
               "examples": [{"line": 2, "input": "\u{fffd}(:80", "reason": "unparsable"}]})
    );
}

/// `n` distinct public addresses, one per line.
pub(crate) fn public_list(n: usize) -> String {
    (0..n)
        .map(|i| format!("11.{}.{}.1:8080\n", i / 250, i % 250))
        .collect()
}

/// Between the first chunk and the next, every member the first chunk wrote is moved up to
/// 50, as if many assignments had gone by meanwhile: the later chunks still start their new
/// members at the 3 the first chunk used, not at the minimum they would find themselves.
async fn a_large_list_is_written_in_chunks_with_one_starting_count(backend: Backend) {
    let (app, spy) = spawn_spied(backend_config(backend)).await;
    app.create_pool("p", json!({})).await;
    app.seed("p", &["http://11.0.0.1:8080"], Some(3)).await;
    spy.after_next_seed(|first_chunk| {
        assert_eq!(
            (first_chunk.added.len(), first_chunk.start_assignments),
            (MAX_MEMBERS_PER_CALL - 1, 3)
        );
        let written = [first_chunk.added.clone(), first_chunk.existing.clone()].concat();
        Seed {
            assignments: Some(50),
            reset: true,
            ..Seed::new(written)
        }
    });
    let (status, body) = import_text(&app, "/pools/p/import", &public_list(25_000)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body,
        json!({"accepted": 25_000, "added": 24_999, "existing": 1, "duplicates": 0,
               "rejected": {}, "examples": []})
    );
    let (_, info) = app.get("/pools/p").await;
    assert_eq!(
        info["stats"],
        json!({"eligible": 25_000, "ineligible": 0, "min_assignments": 3, "max_assignments": 50,
               "total_assignments": 0, "in_flight": 0, "abandoned": 0, "tripped": 0, "recovered": 0, "pruned": 0,
               "shared_exit_ips": 0, "country_mismatches": 0})
    );
    // Listed by assignments: the 15,000 members of the second and third chunks at 3, then
    // the first chunk's 10,000 at 50.
    let (_, page) = app.get("/pools/p/members?limit=2&cursor=14999.0").await;
    let counts: Vec<&Value> = page["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| &m["assignments"])
        .collect();
    assert_eq!(counts, [&json!(3), &json!(50)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_list_is_written_in_chunks_with_one_starting_count_on_redis() {
    a_large_list_is_written_in_chunks_with_one_starting_count(Backend::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_list_is_written_in_chunks_with_one_starting_count_on_embedded() {
    a_large_list_is_written_in_chunks_with_one_starting_count(Backend::Embedded).await;
}

/// Three batches written in 1.5 s in all, more than the 1 s the list may take to arrive,
/// before the list's last line is sent: the service waited for the list well under 1 s,
/// and the time it spent writing is not the client's.
#[tokio::test]
async fn the_import_read_timeout_counts_the_wait_for_the_list_not_the_time_spent_writing_it() {
    use tokio::io::AsyncWriteExt;
    let mut config = test_config(None);
    config.import_body_read_timeout_ms = 1_000;
    let (app, spy) = spawn_spied(config).await;
    app.create_pool("p", json!({})).await;
    spy.slow_seeds_by(std::time::Duration::from_millis(500));
    let seeded = spy.seeds.mark();
    let (first, last) = (public_list(3 * MAX_MEMBERS_PER_CALL), "12.0.0.1:8080\n");
    let stream = tokio::net::TcpStream::connect(app.base.trim_start_matches("http://"))
        .await
        .expect("connected");
    let (mut reader, mut stream) = stream.into_split();
    let mut answer = tokio::spawn(async move { raw_answer(&mut reader).await });
    let head = format!(
        "POST /pools/p/import HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {ADMIN}\r\n\
         content-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        first.len() + last.len()
    );
    stream.write_all(head.as_bytes()).await.expect("sent");
    stream.write_all(first.as_bytes()).await.expect("sent");
    tokio::select! {
        () = spy.seeds.await_one_after(seeded + 2, "third batch of the import") => {}
        early = &mut answer => panic!("answered before the list was whole: {early:?}"),
    }
    stream.write_all(last.as_bytes()).await.expect("sent");
    let (status, body) = answer.await.expect("read");
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"accepted": 30_001, "added": 30_001, "existing": 0, "duplicates": 0,
               "rejected": {}, "examples": []})
    );
    app.stop().await;
}

async fn candidates_beyond_max_members_are_rejected_as_pool_full_in_dry_runs_too(app: TestApp) {
    app.create_pool("p", json!({"rules": {"max_members": 15_000}}))
        .await;
    let list = public_list(25_000);
    let expected = json!({
        "accepted": 15_000, "added": 15_000, "existing": 0, "duplicates": 0,
        "rejected": {"pool_full": 10_000},
        "examples": (15_001..=15_020)
            .map(|line| json!({"line": line, "input": format!("11.{}.{}.1:8080", (line - 1) / 250, (line - 1) % 250), "reason": "pool_full", "hint": "raise rules.max_members, or remove members first"}))
            .collect::<Vec<_>>(),
    });
    let (_, dry) = import_text(&app, "/pools/p/import?dry_run=true", &list).await;
    assert_eq!(dry, expected);
    let (_, info) = app.get("/pools/p").await;
    assert_eq!(info["stats"]["eligible"], json!(0));
    let (_, real) = import_text(&app, "/pools/p/import", &list).await;
    assert_eq!(real, expected);
    let (_, info) = app.get("/pools/p").await;
    assert_eq!(info["stats"]["eligible"], json!(15_000));
    // Importing again: the members already in keep their place, the rest stay refused.
    let (_, again) = import_text(&app, "/pools/p/import", &list).await;
    assert_eq!(again["existing"], json!(15_000));
    assert_eq!(again["rejected"], json!({"pool_full": 10_000}));
}

async fn examples_are_the_first_rejected_lines_whatever_their_reason(app: TestApp) {
    app.create_pool("p", json!({"rules": {"max_members": 1}}))
        .await;
    let garbage: String = (3..=30).map(|i| format!("garbage {i}\n")).collect();
    let list = format!("1.2.3.4:80\n5.6.7.8:80\n{garbage}");
    let (_, body) = import_text(&app, "/pools/p/import", &list).await;
    assert_eq!(body["rejected"], json!({"pool_full": 1, "unparsable": 28}));
    let mut expected = vec![
        json!({"line": 2, "input": "5.6.7.8:80", "reason": "pool_full", "hint": "raise rules.max_members, or remove members first"}),
    ];
    expected.extend(
        (3..=21)
            .map(|i| json!({"line": i, "input": format!("garbage {i}"), "reason": "unparsable"})),
    );
    assert_eq!(body["examples"], json!(expected));
}

async fn malformed_import_requests_answer_in_the_error_shape(app: TestApp) {
    let (status, body) = import_text(&app, "/pools/nope/import", "1.2.3.4:80\n").await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "pool_not_found");
    app.create_pool("p", json!({})).await;
    for query in ["default_scheme=ftp", "dry_run=perhaps", "other=1"] {
        let (status, body) =
            import_text(&app, &format!("/pools/p/import?{query}"), "1.2.3.4:80\n").await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_query");
    }
    let (status, body) = import(&app, "/pools/p/import", "text/csv", b"1.2.3.4:80".to_vec()).await;
    assert_error(
        status,
        &body,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
    );
    for json_body in ["{\"a\": 1}", "[1, 2]", "[\"1.2.3.4:80\""] {
        let (status, body) = import(
            &app,
            "/pools/p/import",
            "application/json",
            json_body.as_bytes().to_vec(),
        )
        .await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_json");
    }
    assert_eq!(app.counts("p").await, []);
}

for_each_store!(
    importing_a_list_reports_what_became_of_every_line,
    a_dry_run_reports_the_same_and_writes_nothing,
    a_json_array_is_imported_like_a_list,
    lines_without_a_scheme_take_the_default_scheme,
    lines_that_are_not_utf8_are_rejected_one_by_one,
    candidates_beyond_max_members_are_rejected_as_pool_full_in_dry_runs_too,
    examples_are_the_first_rejected_lines_whatever_their_reason,
    malformed_import_requests_answer_in_the_error_shape,
);

#[tokio::test]
async fn a_list_over_the_import_limit_answers_413_while_other_routes_keep_their_small_limit() {
    let mut config = test_config(None);
    config.body_limit_bytes = 1024;
    config.import_body_limit_bytes = 64 * 1024;
    let app = TestApp::spawn_with(config).await;
    app.create_pool("p", json!({})).await;
    // 8 KiB: over the small limit, under the import limit.
    let list = public_list(500);
    assert!(list.len() > 1024 && list.len() < 64 * 1024);
    let (status, body) = import_text(&app, "/pools/p/import", &list).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["added"], json!(500));
    let too_large = |(status, body): (StatusCode, Value), limit: usize| {
        assert_error(
            status,
            &body,
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
        );
        let message = format!("request body is larger than {limit} bytes");
        assert_eq!(body["error"]["message"], json!(message));
    };
    too_large(
        import_text(&app, "/pools/p/import", &public_list(5_000)).await,
        64 * 1024,
    );
    let list: Vec<String> = public_list(500).lines().map(str::to_owned).collect();
    too_large(
        app.post_json("/pools/p/members", json!({ "members": list }))
            .await,
        1024,
    );
    app.stop().await;
}

#[tokio::test]
async fn a_list_sent_without_a_length_is_cut_off_at_the_import_limit_with_413() {
    let mut config = test_config(None);
    config.import_body_limit_bytes = 64 * 1024;
    let app = TestApp::spawn_with(config).await;
    app.create_pool("p", json!({})).await;
    // Chunked: the service learns the size only as the list arrives, and stops reading
    // once it is past the limit.
    let list = public_list(5_000);
    assert!(list.len() > 64 * 1024);
    let chunks: String = list
        .as_bytes()
        .chunks(4096)
        .map(|chunk| {
            format!(
                "{:x}\r\n{}\r\n",
                chunk.len(),
                String::from_utf8_lossy(chunk)
            )
        })
        .collect();
    let request = format!(
        "POST /pools/p/import HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {ADMIN}\r\n\
         content-type: text/plain\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n\
         {chunks}0\r\n\r\n"
    );
    let (status, body) = raw_request(&app.base, &request).await;
    assert_error(
        status,
        &body,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
    );
    assert_eq!(
        body["error"]["message"],
        json!(format!("request body is larger than {} bytes", 64 * 1024))
    );
    app.stop().await;
}
