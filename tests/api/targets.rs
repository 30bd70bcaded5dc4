//! Targets: a `blocked` report naming the host a worker contacted bans that member for that
//! host only, an assign naming the host skips the members banned for it, and the listing
//! shows each member's ban for a host.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::for_each_store;
use crate::helpers::{TestApp, assert_error, read};

/// An assign with a JSON body; returns status and body (Null on 204).
async fn assign_with(app: &TestApp, pool: &str, body: Value) -> (StatusCode, Value) {
    let response = app
        .anonymous(Method::POST, &format!("/pools/{pool}/assign"))
        .json(&body)
        .send()
        .await
        .expect("request sent");
    read(response).await
}

/// The proxy an assign for `target` hands out.
async fn assigned_for(app: &TestApp, pool: &str, target: &str) -> String {
    let (status, body) = assign_with(app, pool, json!({ "target": target })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["proxy"].as_str().expect("proxy").to_owned()
}

/// Posts a report body; status and answer.
async fn report(app: &TestApp, pool: &str, body: Value) -> (StatusCode, Value) {
    read(
        app.anonymous(Method::POST, &format!("/pools/{pool}/outcomes"))
            .json(&body)
            .send()
            .await
            .expect("sent"),
    )
    .await
}

/// Milliseconds since the epoch on this machine, which the stores' clocks share.
fn now_ms() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH);
    u64::try_from(since.expect("after 1970").as_millis()).expect("fits")
}

/// Milliseconds since the epoch of an RFC 3339 time the service wrote.
fn ms_of(text: &Value) -> u64 {
    let text = text
        .as_str()
        .unwrap_or_else(|| panic!("a time, got {text}"));
    let at = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .expect("RFC 3339");
    u64::try_from(at.unix_timestamp_nanos() / 1_000_000).expect("fits")
}

/// Bans `proxy` for `target` with one `blocked` report: the answer's outcome, and the times
/// on this machine's clock just before and after it.
async fn ban(app: &TestApp, pool: &str, proxy: &str, target: &str) -> (Value, u64, u64) {
    let before = now_ms();
    let (status, body) = report(
        app,
        pool,
        json!({"proxy": proxy, "result": "blocked", "target": target, "status": 403}),
    )
    .await;
    let after = now_ms();
    assert_eq!(status, StatusCode::OK, "{body}");
    (body["outcomes"][0].clone(), before, after)
}

/// Each listed member as (id, banned_until) for `target`.
async fn bans_for(app: &TestApp, pool: &str, target: &str) -> Vec<(String, Value)> {
    let (status, body) = app
        .get(&format!("/pools/{pool}/members?target={target}"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| {
            (
                m["member"].as_str().expect("id").to_owned(),
                m["banned_until"].clone(),
            )
        })
        .collect()
}

/// A pool `pool` with `config` and members a, b, c at 0.
async fn three(app: &TestApp, pool: &str, config: Value) {
    app.create_pool(pool, config).await;
    app.seed(pool, &["a", "b", "c"], Some(0)).await;
}

async fn a_blocked_report_with_a_target_bans_the_member_for_that_target_only(app: TestApp) {
    three(&app, "p", json!({})).await;
    let (outcome, before, after) = ban(&app, "p", "a", "Shop.Example.COM.").await;
    let until = ms_of(&outcome["banned_until"]);
    assert!(
        (before + 600_000..=after + 600_000).contains(&until),
        "{outcome}"
    );
    assert_eq!(
        outcome,
        json!({"proxy": "a", "result": "blocked", "effect": "banned", "consecutive_failures": 0,
               "target": "shop.example.com", "banned_until": outcome["banned_until"]})
    );
    // a has the fewest assignments, yet the site that blocked it never gets it.
    assert_eq!(assigned_for(&app, "p", "shop.example.com").await, "b");
    assert_eq!(assigned_for(&app, "p", "shop.example.com").await, "c");
    assert_eq!(assigned_for(&app, "p", "shop.example.com").await, "b");
    // Other sites, and assigns without a target, still get it.
    assert_eq!(assigned_for(&app, "p", "other.example.org").await, "a");
    assert_eq!(app.assigned("p").await, ("a".to_owned(), 2));
    assert_eq!(
        bans_for(&app, "p", "shop.example.com").await,
        [
            ("c".to_owned(), Value::Null),
            ("a".to_owned(), outcome["banned_until"].clone()),
            ("b".to_owned(), Value::Null),
        ]
    );
    assert_eq!(
        bans_for(&app, "p", "other.example.org").await,
        [
            ("c".to_owned(), Value::Null),
            ("a".to_owned(), Value::Null),
            ("b".to_owned(), Value::Null),
        ]
    );
    // Without a target the listing has no such field; the member stays eligible with no
    // failure counted.
    let listed = app.members("p").await;
    assert!(
        listed.iter().all(|m| m.get("banned_until").is_none()),
        "{listed:?}"
    );
    assert!(
        listed
            .iter()
            .all(|m| m["state"] == json!("eligible") && m["consecutive_failures"] == json!(0)),
        "{listed:?}"
    );
}

async fn a_least_in_flight_pool_skips_banned_members_in_its_order(app: TestApp) {
    three(&app, "p", json!({"policy": "least-in-flight"})).await;
    ban(&app, "p", "a", "example.com").await;
    ban(&app, "p", "b", "example.com").await;
    let (status, body) = assign_with(&app, "p", json!({"target": "example.com"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["proxy"], json!("c"));
    assert_eq!(body["in_flight"], json!(1));
    assert_eq!(assigned_for(&app, "p", "example.com").await, "c");
    assert_eq!(app.assigned("p").await.0, "a");
}

/// An assign with a JSON body that must find nothing: its `Retry-After` and
/// `Retry-After-Ms` (`None` without them), and the times on this machine's clock just
/// before and after it.
async fn nothing_for(app: &TestApp, pool: &str, body: &Value) -> (Option<(u64, u64)>, u64, u64) {
    let before = now_ms();
    let response = app
        .anonymous(Method::POST, &format!("/pools/{pool}/assign"))
        .json(body)
        .send()
        .await
        .expect("request sent");
    let after = now_ms();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().expect("ascii").parse::<u64>().expect("a number"))
    };
    let wait = header("retry-after").zip(header("retry-after-ms"));
    let (status, answer) = read(response).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}: {answer}");
    (wait, before, after)
}

/// Every assign path for `target` on a capped least-in-flight pool whose members carry
/// `country=de`: one member, `count`, a label filter, a session.
fn every_path_for(target: &str) -> [Value; 4] {
    [
        json!({"target": target}),
        json!({"target": target, "count": 2}),
        json!({"target": target, "labels": {"country": "de"}}),
        json!({"target": target, "session": "s"}),
    ]
}

/// A least-in-flight pool `pool` capped at one lease per member, with members a and b at 0,
/// both labelled `country=de`.
async fn capped_at_one(app: &TestApp, pool: &str) {
    app.create_pool(
        pool,
        json!({"policy": "least-in-flight", "max_in_flight": 1}),
    )
    .await;
    let (status, body) = app
        .post_json(
            &format!("/pools/{pool}/members"),
            json!({"members": ["a", "b"], "labels": {"country": "de"}, "assignments": 0}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

async fn a_204_at_the_cap_waits_for_a_banned_member_that_holds_no_lease(app: TestApp) {
    capped_at_one(&app, "p").await;
    let (outcome, ..) = ban(&app, "p", "a", "shop.example.com").await;
    let until = ms_of(&outcome["banned_until"]);
    assert_eq!(assigned_for(&app, "p", "shop.example.com").await, "b");
    // b is at its cap and a is banned: a's ban ends with a below its cap, so every path
    // says when.
    for body in every_path_for("shop.example.com") {
        let (wait, before, after) = nothing_for(&app, "p", &body).await;
        let (seconds, ms) = wait.unwrap_or_else(|| panic!("{body}: no Retry-After"));
        assert!(
            (until - after..=until - before).contains(&ms),
            "{body}: {ms}"
        );
        assert_eq!(seconds, ms.div_ceil(1000), "{body}");
        assert_eq!(seconds, 600, "{body}");
    }
}

async fn a_204_at_the_cap_does_not_wait_for_a_banned_member_that_is_at_the_cap_too(app: TestApp) {
    capped_at_one(&app, "p").await;
    assert_eq!(app.assigned("p").await.0, "a");
    assert_eq!(app.assigned("p").await.0, "b");
    ban(&app, "p", "a", "shop.example.com").await;
    // When a's ban ends a still holds its lease: nothing becomes eligible by itself.
    for body in every_path_for("shop.example.com") {
        let (wait, ..) = nothing_for(&app, "p", &body).await;
        assert_eq!(wait, None, "{body}");
    }
}

async fn a_banned_member_that_is_taken_out_and_back_stays_banned(app: TestApp) {
    three(&app, "p", json!({})).await;
    let (outcome, ..) = ban(&app, "p", "a", "example.com").await;
    for action in ["disable", "enable"] {
        let (status, body) = app
            .post_json(
                &format!("/pools/p/members/{action}"),
                json!({"members": ["a"]}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    assert_eq!(
        bans_for(&app, "p", "example.com").await[0],
        ("a".to_owned(), outcome["banned_until"].clone())
    );
    assert_eq!(assigned_for(&app, "p", "example.com").await, "b");
}

async fn an_assign_with_labels_and_a_target_skips_the_labelled_members_banned_for_it(app: TestApp) {
    app.create_pool("p", json!({})).await;
    let (status, body) = app
        .post_json(
            "/pools/p/members",
            json!({"members": ["de-1", "de-2", "fr-1"], "labels": {"country": "de"},
                   "assignments": 0}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    app.post_json(
        "/pools/p/members",
        json!({"members": [{"member": "fr-1", "labels": {"country": "fr"}}]}),
    )
    .await;
    ban(&app, "p", "de-1", "example.com").await;
    for (labels, expected) in [
        (json!({"country": "de"}), "de-2"),
        (json!({"country": ["de", "fr"]}), "fr-1"),
        (json!({"country": "de", "missing": ["x", "y"]}), ""),
    ] {
        let (status, body) = assign_with(
            &app,
            "p",
            json!({"labels": labels, "target": "example.com"}),
        )
        .await;
        if expected.is_empty() {
            assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
        } else {
            assert_eq!(status, StatusCode::OK, "{body}");
            assert_eq!(body["proxy"], json!(expected), "{labels}");
        }
    }
    // The same filter for another host still gets the least-used of all.
    let (_, body) = assign_with(
        &app,
        "p",
        json!({"labels": {"country": "de"}, "target": "example.org"}),
    )
    .await;
    assert_eq!(body["proxy"], json!("de-1"));
}

async fn an_assign_checks_at_most_two_thousand_banned_members_then_waits_for_the_first_ban(
    app: TestApp,
) {
    app.create_pool("p", json!({"health": {"target_ban_ms": 60000}}))
        .await;
    let banned: Vec<String> = (0..2_000).map(|n| format!("m{n:04}")).collect();
    let names: Vec<&str> = banned.iter().map(String::as_str).collect();
    app.seed("p", &names, Some(0)).await;
    // The one member not banned sorts after all of them: it is the 2,001st candidate.
    app.seed("p", &["z-free"], Some(1)).await;
    let reports: Vec<Value> = names
        .iter()
        .map(|m| json!({"proxy": m, "result": "blocked", "target": "example.com"}))
        .collect();
    let before = now_ms();
    let (status, body) = report(&app, "p", Value::Array(reports)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let first_end = ms_of(&body["outcomes"][0]["banned_until"]);
    let response = app
        .anonymous(Method::POST, "/pools/p/assign")
        .json(&json!({"target": "example.com"}))
        .send()
        .await
        .expect("sent");
    let asked = now_ms();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    let wait: u64 = response.headers()["retry-after"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    // The wait is until the first ban skipped ends, rounded up to seconds.
    assert!(first_end >= before + 60_000, "{first_end}");
    let soonest = (first_end - asked).div_ceil(1000);
    let latest = (first_end - before).div_ceil(1000);
    assert!(
        (soonest..=latest).contains(&wait),
        "{wait} s, ban ends {first_end}, asked {asked}"
    );
    // Without the target the pool hands out its least-used member as ever.
    assert_eq!(app.assigned("p").await, ("m0000".to_owned(), 1));
}

/// An assign's 204 and its waits: `(Retry-After, Retry-After-Ms)`, each `None` when absent.
async fn empty_assign(app: &TestApp, pool: &str, body: Value) -> (Option<u64>, Option<u64>) {
    let response = app
        .anonymous(Method::POST, &format!("/pools/{pool}/assign"))
        .json(&body)
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    let header = |name: &str| {
        response.headers().get(name).map(|value| {
            value
                .to_str()
                .expect("ascii")
                .parse::<u64>()
                .expect("a number")
        })
    };
    (header("retry-after"), header("retry-after-ms"))
}

/// Asserts a 204's waits: the exact one within `(longest - elapsed)..=longest` ms, and
/// `Retry-After` its whole seconds rounded up.
fn assert_wait(waits: (Option<u64>, Option<u64>), longest: u64, elapsed: u64) {
    let (seconds, ms) = waits;
    let ms = ms.expect("Retry-After-Ms");
    assert!(
        (longest.saturating_sub(elapsed)..=longest).contains(&ms),
        "{ms} of {longest}"
    );
    assert_eq!(seconds, Some(ms.div_ceil(1000).max(1)));
}

async fn a_204_for_a_target_waits_for_the_first_ban_or_cooldown_to_end(app: TestApp) {
    let health = json!({"max_consecutive_failures": 1, "cooldown_ms": 60000, "jitter_percent": 0,
                        "target_ban_ms": 30000});
    app.create_pool("p", json!({ "health": health })).await;
    app.seed("p", &["a", "b"], Some(0)).await;
    let started = now_ms();
    ban(&app, "p", "a", "example.com").await;
    let (status, body) = report(&app, "p", json!({"proxy": "b", "result": "failed"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // a's ban ends before b comes back.
    let waits = empty_assign(&app, "p", json!({"target": "example.com"})).await;
    assert_wait(waits, 30_000, now_ms() - started);
    assert_eq!(assigned_for(&app, "p", "example.org").await, "a");
    // b comes back before a longer ban for another host ends.
    let mut longer = health.clone();
    longer["target_ban_ms"] = json!(120000);
    app.configure("p", &json!({ "health": longer })).await;
    ban(&app, "p", "a", "example.net").await;
    let waits = empty_assign(&app, "p", json!({"target": "example.net"})).await;
    assert_wait(waits, 60_000, now_ms() - started);
    // Without a target only the cooldown counts, as before bans.
    app.post_json("/pools/p/members/disable", json!({"members": ["a"]}))
        .await;
    let waits = empty_assign(&app, "p", json!({})).await;
    assert_wait(waits, 60_000, now_ms() - started);
}

async fn a_204_for_a_label_filter_waits_only_for_a_member_carrying_the_labels(app: TestApp) {
    let health = json!({"max_consecutive_failures": 1, "cooldown_ms": 60000, "jitter_percent": 0});
    app.create_pool("p", json!({ "health": health })).await;
    let (status, body) = app
        .post_json(
            "/pools/p/members",
            json!({"members": [{"member": "de-1", "labels": {"country": "de"}},
                               {"member": "fr-1", "labels": {"country": "fr"}}]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let started = now_ms();
    report(&app, "p", json!({"proxy": "de-1", "result": "failed"})).await;
    app.post_json("/pools/p/members/disable", json!({"members": ["fr-1"]}))
        .await;
    let waits = empty_assign(&app, "p", json!({"labels": {"country": "de"}})).await;
    assert_wait(waits, 60_000, now_ms() - started);
    // The member cooling down does not carry `fr`, and fr-1 was taken out by an operator:
    // nothing comes back by itself.
    assert_eq!(
        empty_assign(&app, "p", json!({"labels": {"country": "fr"}})).await,
        (None, None)
    );
}

async fn a_ban_reported_again_while_it_lasts_changes_nothing(app: TestApp) {
    three(
        &app,
        "p",
        json!({"health": {"max_consecutive_failures": 1}}),
    )
    .await;
    let block = json!({"proxy": "a", "result": "blocked", "target": "example.com"});
    let (status, body) = report(&app, "p", json!([block, block])).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let first = &body["outcomes"][0];
    assert_eq!(first["effect"], json!("banned"));
    assert_eq!(
        body["outcomes"][1],
        json!({"proxy": "a", "result": "blocked", "effect": "ignored", "consecutive_failures": 0,
               "target": "example.com", "banned_until": first["banned_until"]})
    );
    // Not even a pool that trips on the first failure takes it out.
    let (_, pool) = app.get("/pools/p").await;
    assert_eq!(pool["stats"]["tripped"], json!(0), "{pool}");
}

async fn a_repeat_ban_doubles_up_to_the_longest_cooldown(app: TestApp) {
    three(
        &app,
        "p",
        json!({"health": {"target_ban_ms": 200, "max_cooldown_ms": 700}}),
    )
    .await;
    let mut lengths = Vec::new();
    for _ in 0..3 {
        let (outcome, before, after) = ban(&app, "p", "a", "example.com").await;
        assert_eq!(outcome["effect"], json!("banned"), "{outcome}");
        let until = ms_of(&outcome["banned_until"]);
        lengths.push((until - after, until - before));
        // The next ban comes as soon as this one has ended.
        let deadline = Instant::now() + Duration::from_secs(10);
        while bans_for(&app, "p", "example.com").await[0].1 != Value::Null {
            assert!(Instant::now() < deadline, "the ban never ended");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    for ((shortest, longest), expected) in lengths.iter().zip([200, 400, 700]) {
        assert!(
            (*shortest..=*longest).contains(&expected),
            "{lengths:?}: expected {expected}"
        );
    }
}

async fn failed_reports_and_blocks_without_a_target_count_pool_wide_as_before(app: TestApp) {
    three(
        &app,
        "p",
        json!({"health": {"max_consecutive_failures": 2}}),
    )
    .await;
    let (status, body) = report(
        &app,
        "p",
        json!([
            {"proxy": "a", "result": "failed", "target": "example.com"},
            {"proxy": "a", "result": "blocked"},
        ]),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["outcomes"],
        json!([
            {"proxy": "a", "result": "failed", "effect": "counted", "consecutive_failures": 1,
             "target": "example.com"},
            {"proxy": "a", "result": "blocked", "effect": "tripped", "consecutive_failures": 2},
        ])
    );
    assert_eq!(
        bans_for(&app, "p", "example.com").await,
        [
            ("a".to_owned(), Value::Null),
            ("b".to_owned(), Value::Null),
            ("c".to_owned(), Value::Null),
        ]
    );
}

async fn a_pool_created_again_under_its_id_has_no_bans(app: TestApp) {
    three(&app, "p", json!({})).await;
    ban(&app, "p", "a", "example.com").await;
    let response = app
        .admin(Method::DELETE, "/pools/p")
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    three(&app, "p", json!({})).await;
    assert_eq!(assigned_for(&app, "p", "example.com").await, "a");
    assert_eq!(
        bans_for(&app, "p", "example.com").await,
        [
            ("b".to_owned(), Value::Null),
            ("c".to_owned(), Value::Null),
            ("a".to_owned(), Value::Null),
        ]
    );
}

async fn reports_about_unknown_members_ban_nothing(app: TestApp) {
    three(&app, "p", json!({})).await;
    let (status, body) = report(
        &app,
        "p",
        json!({"proxy": "z", "result": "blocked", "target": "example.com"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["outcomes"], json!([]));
    assert_eq!(body["unknown"], json!(["z"]));
}

async fn an_invalid_target_is_refused_naming_the_field(app: TestApp) {
    three(&app, "p", json!({})).await;
    for bad in [
        json!("https://example.com/"),
        json!("example.com:443"),
        json!(""),
        json!(7),
    ] {
        let (status, body) = assign_with(&app, "p", json!({"target": bad})).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_request");
        let message = body["error"]["message"].as_str().expect("message");
        assert!(message.contains("target"), "{message}");
    }
    let long = format!("{}.com", "a.".repeat(125));
    assert_eq!(long.len(), 254);
    let (status, body) = assign_with(&app, "p", json!({"target": long})).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_request");
    let (status, body) = report(
        &app,
        "p",
        json!([
            {"proxy": "a", "result": "blocked", "target": "example.com"},
            {"proxy": "a", "result": "blocked", "target": "exa mple.com"},
        ]),
    )
    .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_request");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("[1].target: ")),
        "{body}"
    );
    // Nothing of a refused batch is applied.
    assert_eq!(bans_for(&app, "p", "example.com").await[0].1, Value::Null);
    let (status, body) = app.get("/pools/p/members?target=a%20b").await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_query");
    let refused = app
        .admin(Method::PUT, "/pools/q")
        .json(&json!({"health": {"target_ban_ms": 50}}))
        .send()
        .await
        .expect("sent");
    let (status, body) = read(refused).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_json");
    assert_eq!(
        body["error"]["message"],
        json!("health: target_ban_ms is 100 to 604800000")
    );
}

for_each_store!(
    a_blocked_report_with_a_target_bans_the_member_for_that_target_only,
    a_204_for_a_target_waits_for_the_first_ban_or_cooldown_to_end,
    a_204_for_a_label_filter_waits_only_for_a_member_carrying_the_labels,
    an_assign_with_labels_and_a_target_skips_the_labelled_members_banned_for_it,
    an_assign_checks_at_most_two_thousand_banned_members_then_waits_for_the_first_ban,
    a_least_in_flight_pool_skips_banned_members_in_its_order,
    a_204_at_the_cap_waits_for_a_banned_member_that_holds_no_lease,
    a_204_at_the_cap_does_not_wait_for_a_banned_member_that_is_at_the_cap_too,
    a_banned_member_that_is_taken_out_and_back_stays_banned,
    a_ban_reported_again_while_it_lasts_changes_nothing,
    a_repeat_ban_doubles_up_to_the_longest_cooldown,
    failed_reports_and_blocks_without_a_target_count_pool_wide_as_before,
    a_pool_created_again_under_its_id_has_no_bans,
    reports_about_unknown_members_ban_nothing,
    an_invalid_target_is_refused_naming_the_field,
);
