//! What a pool knows about its members beyond what the operator typed: the exit address an
//! `exit_ip` check reads from an echo target, the members that share one, and the labels
//! a local GeoIP file gives (`geo_country`, `geo_asn`, `geo_org`), on every store.
//!
//! The members are real HTTP proxies on loopback (`proxies.rs`), each listening on its own
//! `127.0.0.x` and leaving for targets from another, so that the echo target sees distinct
//! exit addresses; the GeoIP file is written here (`mmdb.rs`) and maps those addresses.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::gateway::{curl, spawn_on};
use crate::helpers::{Backend, TestApp};
use crate::import::import_text;
use crate::mmdb::{Mmdb, record};
use crate::proxies::{HttpProxy, Server, ip_echo, target};

/// The GeoIP file of these tests: each member's own address and each exit address.
fn database() -> Mmdb {
    Mmdb::default()
        .insert([127, 0, 0, 2], record("DE", 64502, "Member Two GmbH"))
        .insert([127, 0, 0, 3], record("FR", 64503, "Member Three"))
        .insert([127, 0, 0, 4], record("DE", 64504, "Member Four"))
        .insert([127, 0, 0, 12], record("NL", 64512, "Exit Twelve B.V."))
        .insert([127, 0, 0, 14], record("US", 64514, "Exit Fourteen, Inc."))
}

/// A file in a directory of its own, removed with it.
struct GeoFile {
    dir: PathBuf,
}

impl GeoFile {
    fn new(bytes: &[u8]) -> Self {
        let dir = std::env::temp_dir().join(format!("pa-geo-{:016x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).expect("a directory");
        let file = Self { dir };
        file.replace(bytes);
        file
    }

    fn path(&self) -> PathBuf {
        self.dir.join("geo.mmdb")
    }

    /// Replaces the file as an operator should: written aside, then renamed over it.
    fn replace(&self, bytes: &[u8]) {
        let aside = self.dir.join("geo.mmdb.new");
        std::fs::write(&aside, bytes).expect("written");
        std::fs::rename(&aside, self.path()).expect("renamed");
    }
}

impl Drop for GeoFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The service on `backend` with its gateway, and with `geo` as its GeoIP file.
async fn spawn(backend: Backend, geo: Option<&GeoFile>) -> TestApp {
    let path = geo.map(GeoFile::path);
    spawn_on(backend, |config| {
        config.geoip_db = path;
        config.geoip_reload_ms = 100;
    })
    .await
}

/// The three member proxies: `two` and `three` leave from 127.0.0.12, `four` from
/// 127.0.0.14.
struct Members {
    two: Server,
    three: Server,
    four: Server,
}

impl Members {
    async fn start() -> Self {
        let proxy = |listen: [u8; 4], exit: [u8; 4]| {
            HttpProxy {
                listen: Some(IpAddr::from(listen)),
                exit: Some(IpAddr::from(exit)),
                ..HttpProxy::default()
            }
            .start()
        };
        Self {
            two: proxy([127, 0, 0, 2], [127, 0, 0, 12]).await,
            three: proxy([127, 0, 0, 3], [127, 0, 0, 12]).await,
            four: proxy([127, 0, 0, 4], [127, 0, 0, 14]).await,
        }
    }
}

fn id(server: &Server) -> String {
    format!("http://{}", server.addr)
}

const RULES: &str = r#"{"allow_private": true}"#;

fn rules() -> Value {
    serde_json::from_str(RULES).expect("json")
}

/// Turns an `exit_ip` check of `url` on (one round a minute: only the first runs here).
async fn check_exits(app: &TestApp, url: &str) {
    let config = json!({
        "rules": rules(),
        "health": {"check": {"kind": "http", "url": url, "exit_ip": true,
                             "interval_ms": 60000, "timeout_ms": 3000}},
    });
    app.configure("p", &config).await;
}

/// Each member's entry once `done` holds for every one of them.
async fn await_members(app: &TestApp, done: impl Fn(&Value) -> bool) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let members = app.members("p").await;
        if !members.is_empty() && members.iter().all(&done) {
            return members;
        }
        assert!(Instant::now() < deadline, "{members:#?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn entry<'a>(members: &'a [Value], server: &Server) -> &'a Value {
    let id = id(server);
    members
        .iter()
        .find(|m| m["member"] == json!(id))
        .unwrap_or_else(|| panic!("{id} is listed"))
}

/// The members a listing of `query` shows, by id.
async fn listed(app: &TestApp, query: &str) -> (Vec<String>, Value) {
    let (status, body) = app.get(&format!("/pools/p/members?{query}")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let ids = body["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| m["member"].as_str().expect("an id").to_owned())
        .collect();
    (ids, body["next_cursor"].clone())
}

async fn stats(app: &TestApp) -> Value {
    let (status, body) = app.get("/pools/p").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["stats"].clone()
}

/// Runs `test` on the service on `backend`; on the durable store, then checks that its
/// directory recovers the state the test left (exit addresses included).
async fn on(backend: Backend, test: impl AsyncFnOnce(&TestApp)) {
    let geo = GeoFile::new(&database().build());
    let app = spawn(backend, Some(&geo)).await;
    let durable = app.durability_check();
    test(&app).await;
    app.stop().await;
    if let Some(check) = durable {
        check.verify().await;
    }
}

macro_rules! per_store {
    ($($name:ident),* $(,)?) => {
        mod on_redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::on(crate::helpers::Backend::Redis, super::$name).await;
                }
            )*
        }
        mod on_embedded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::on(crate::helpers::Backend::Embedded, super::$name).await;
                }
            )*
        }
        mod on_durable {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::on(crate::helpers::Backend::Durable, super::$name).await;
                }
            )*
        }
    };
}

per_store!(
    checks_record_exit_addresses_and_the_members_sharing_one_are_listed_and_counted,
    the_geoip_file_labels_members_by_their_address_then_by_their_exit_address,
);

async fn checks_record_exit_addresses_and_the_members_sharing_one_are_listed_and_counted(
    app: &TestApp,
) {
    let echo = ip_echo("unused").await;
    let members = Members::start().await;
    app.create_pool("p", json!({"rules": rules()})).await;
    let ids = [id(&members.two), id(&members.three), id(&members.four)];
    app.seed("p", &ids.each_ref().map(String::as_str), Some(0))
        .await;
    assert_eq!(stats(app).await["shared_exit_ips"], json!(0));
    check_exits(app, &format!("http://{}/ip", echo.addr)).await;
    let seen = await_members(app, |m| m.get("exit_ip").is_some()).await;
    let exits: Vec<(&str, &str, bool)> = seen
        .iter()
        .map(|m| {
            (
                m["member"].as_str().expect("an id"),
                m["exit_ip"].as_str().expect("an address"),
                m["exit_ip_at"].as_str().is_some_and(|at| at.ends_with("Z")),
            )
        })
        .collect();
    assert_eq!(
        exits,
        [
            (ids[0].as_str(), "127.0.0.12", true),
            (ids[1].as_str(), "127.0.0.12", true),
            (ids[2].as_str(), "127.0.0.14", true),
        ]
    );
    assert_eq!(stats(app).await["shared_exit_ips"], json!(1));
    assert_eq!(
        listed(app, "shared_exit_ip=true").await,
        (vec![ids[0].clone(), ids[1].clone()], Value::Null)
    );
    // A page at a time, each starting past the members the one before walked; a full
    // page stops before the next member, so the walk's end comes on a page of its own.
    assert_eq!(
        listed(app, "shared_exit_ip=true&limit=1").await,
        (vec![ids[0].clone()], json!("1.0"))
    );
    assert_eq!(
        listed(app, "shared_exit_ip=true&limit=1&cursor=1.0").await,
        (vec![ids[1].clone()], json!("2.0"))
    );
    assert_eq!(
        listed(app, "shared_exit_ip=true&limit=1&cursor=2.0").await,
        (Vec::new(), Value::Null)
    );
    assert_eq!(
        listed(app, "shared_exit_ip=true&state=ineligible").await,
        (Vec::new(), Value::Null)
    );
    let (status, body) = app.get("/pools/p/members?shared_exit_ip=yes").await;
    assert_eq!(
        (status, body["error"]["message"].clone()),
        (
            StatusCode::BAD_REQUEST,
            json!("shared_exit_ip is true or false")
        )
    );
    // A label filter keeps the shared members that carry the labels.
    assert_eq!(
        listed(app, "shared_exit_ip=true&label=tier=a").await,
        (Vec::new(), Value::Null)
    );
    let (status, body) = app
        .post_json(
            "/pools/p/members",
            json!({"members": [{"member": ids[0], "labels": {"tier": "a"}}]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        listed(app, "shared_exit_ip=true&label=tier=a").await,
        (vec![ids[0].clone()], Value::Null)
    );
    // A target gives each shared member its ban for it, as the plain listing does.
    let (status, body) = app
        .get("/pools/p/members?shared_exit_ip=true&target=shop.example.com")
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let bans: Vec<Value> = body["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| m["banned_until"].clone())
        .collect();
    assert_eq!(bans, [Value::Null, Value::Null]);
    assert!(
        body["members"][0]
            .as_object()
            .is_some_and(|m| m.contains_key("banned_until")),
        "{body}"
    );
    // The member that left takes its share with it: nobody shares an address any more.
    let (status, body) = app
        .post_json("/pools/p/members/remove", json!({"members": [ids[1]]}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(stats(app).await["shared_exit_ips"], json!(0));
    assert_eq!(
        listed(app, "shared_exit_ip=true").await,
        (Vec::new(), Value::Null)
    );
}

async fn the_geoip_file_labels_members_by_their_address_then_by_their_exit_address(app: &TestApp) {
    let echo = ip_echo("unused").await;
    let site = target(None).await;
    let members = Members::start().await;
    let ids = [id(&members.two), id(&members.three), id(&members.four)];
    app.create_pool("p", json!({"rules": rules()})).await;
    // Operator labels beside the file's: `DE` is `de` (no mismatch), `three` claims `de`
    // and the file says `fr`.
    let (status, body) = app
        .post_json(
            "/pools/p/members",
            json!({"members": [
                {"member": ids[0], "labels": {"country": "DE"}},
                {"member": ids[1], "labels": {"country": "de"}},
            ], "assignments": 0}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = import_text(app, "/pools/p/import", &ids[2]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let listed = app.members("p").await;
    let geo = |members: &[Value], server: &Server| {
        let entry = entry(members, server);
        (
            entry["labels"].clone(),
            entry["geo_labels"].clone(),
            entry["country_mismatch"].clone(),
        )
    };
    assert_eq!(
        geo(&listed, &members.two),
        (
            json!({"country": "DE"}),
            json!({"geo_asn": "64502", "geo_country": "de", "geo_org": "Member_Two_GmbH"}),
            Value::Null
        )
    );
    assert_eq!(
        geo(&listed, &members.three),
        (
            json!({"country": "de"}),
            json!({"geo_asn": "64503", "geo_country": "fr", "geo_org": "Member_Three"}),
            json!(true)
        )
    );
    assert_eq!(
        geo(&listed, &members.four),
        (
            Value::Null,
            json!({"geo_asn": "64504", "geo_country": "de", "geo_org": "Member_Four"}),
            Value::Null
        )
    );
    assert_eq!(stats(app).await["country_mismatches"], json!(1));

    // Operators cannot set the file's keys; re-labelling leaves the file's labels.
    let (status, body) = app
        .post_json(
            "/pools/p/members",
            json!({"members": [ids[0]], "labels": {"geo_country": "us"}}),
        )
        .await;
    assert_eq!(
        (status, body["error"]["message"].clone()),
        (
            StatusCode::BAD_REQUEST,
            json!(
                "labels: label keys starting with geo_ are given by the service from its GeoIP file"
            )
        )
    );
    let (status, body) = app
        .post_json(
            "/pools/p/members",
            json!({"members": [ids[1]], "labels": {"country": "fr", "tier": "a"}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let listed = app.members("p").await;
    assert_eq!(
        geo(&listed, &members.three),
        (
            json!({"country": "fr", "tier": "a"}),
            json!({"geo_asn": "64503", "geo_country": "fr", "geo_org": "Member_Three"}),
            Value::Null
        )
    );
    assert_eq!(stats(app).await["country_mismatches"], json!(0));

    // Selection by the file's labels: through the API, with one key and with two.
    let pick = |labels: Value| async move {
        let (status, body) = app
            .post_json("/pools/p/assign", json!({ "labels": labels }))
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body["proxy"].as_str().expect("a proxy").to_owned()
    };
    assert_eq!(pick(json!({"geo_country": "fr"})).await, ids[1]);
    assert_eq!(
        pick(json!({"geo_country": "de", "geo_asn": "64504"})).await,
        ids[2]
    );
    let (status, _) = app
        .post_json("/pools/p/assign", json!({"labels": {"geo_country": "us"}}))
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    // ... and through the gateway's user name.
    let url = format!("http://{}/health", site.addr);
    let (code, page) = curl(app, "p-geo_country-fr", &[&url]).await;
    assert_eq!(code, 0, "{page}");
    assert_eq!(
        (
            members.two.seen().len(),
            members.three.seen().len(),
            members.four.seen().len()
        ),
        (0, 1, 0)
    );

    // A check sees the exit addresses: their labels replace those of the members' own
    // addresses, and the operator's `country` now differs for `two` (DE, exits in NL)
    // and `three` (fr, exits in NL).
    check_exits(app, &format!("http://{}/json", echo.addr)).await;
    let listed = await_members(app, |m| m.get("exit_ip").is_some()).await;
    assert_eq!(
        geo(&listed, &members.two),
        (
            json!({"country": "DE"}),
            json!({"geo_asn": "64512", "geo_country": "nl", "geo_org": "Exit_Twelve_B.V."}),
            json!(true)
        )
    );
    assert_eq!(
        entry(&listed, &members.four)["geo_labels"],
        json!({"geo_asn": "64514", "geo_country": "us", "geo_org": "Exit_Fourteen_Inc."})
    );
    assert_eq!(stats(app).await["country_mismatches"], json!(2));
    // Seeding again gives the member's own address's labels only to members without an
    // exit address: `two` keeps NL.
    app.seed("p", &[&ids[0]], None).await;
    assert_eq!(
        entry(&app.members("p").await, &members.two)["geo_labels"]["geo_country"],
        json!("nl")
    );
    // An operator re-labelling a member with an exit address leaves its labels from the
    // file: `two` now claims NL, which is where it exits.
    let (status, body) = app
        .post_json(
            "/pools/p/members",
            json!({"members": [{"member": ids[0], "labels": {"country": "nl"}}]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        geo(&app.members("p").await, &members.two),
        (
            json!({"country": "nl"}),
            json!({"geo_asn": "64512", "geo_country": "nl", "geo_org": "Exit_Twelve_B.V."}),
            Value::Null
        )
    );
    assert_eq!(stats(app).await["country_mismatches"], json!(1));
    assert_eq!(pick(json!({"geo_country": "us"})).await, ids[2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_geoip_file_is_read_again_and_labels_what_is_seeded_after() {
    let geo = GeoFile::new(
        &Mmdb::default()
            .insert([127, 0, 0, 2], record("DE", 64502, "Before"))
            .build(),
    );
    let app = spawn(Backend::Embedded, Some(&geo)).await;
    app.create_pool("p", json!({"rules": rules()})).await;
    let member = "http://127.0.0.2:3128";
    app.seed("p", &[member], None).await;
    let country = |members: Vec<Value>| members[0]["geo_labels"]["geo_country"].clone();
    assert_eq!(country(app.members("p").await), json!("de"));
    geo.replace(
        &Mmdb::default()
            .insert([127, 0, 0, 2], record("AT", 64599, "After the change"))
            .build(),
    );
    // Read again within GEOIP_RELOAD_MS (100 ms here); each seed asks the file anew.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        app.seed("p", &[member], None).await;
        let listed = app.members("p").await;
        if country(listed.clone()) == json!("at") {
            assert_eq!(
                listed[0]["geo_labels"],
                json!({"geo_asn": "64599", "geo_country": "at", "geo_org": "After_the_change"})
            );
            break;
        }
        assert!(Instant::now() < deadline, "{listed:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_or_truncated_geoip_file_leaves_the_service_up_and_labels_nothing() {
    let valid = database().build();
    for (what, bytes) in [
        ("truncated", valid[..valid.len() / 2].to_vec()),
        (
            "garbage",
            b"\xAB\xCD\xEFMaxMind.com\x00\x01 not a map".to_vec(),
        ),
        ("empty", Vec::new()),
    ] {
        let geo = GeoFile::new(&bytes);
        for backend in [Backend::Embedded, Backend::Redis] {
            let app = spawn(backend, Some(&geo)).await;
            let (status, _) = app.probe("/readyz").await;
            assert_eq!(status, StatusCode::OK, "{what}");
            app.create_pool("p", json!({"rules": rules()})).await;
            app.seed("p", &["http://127.0.0.2:3128"], None).await;
            let listed = app.members("p").await;
            assert_eq!(listed[0].get("geo_labels"), None, "{what}: {listed:?}");
            app.stop().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_echo_target_answering_garbage_records_no_exit_address_and_the_check_still_passes() {
    for backend in [Backend::Embedded, Backend::Redis] {
        let app = spawn(backend, None).await;
        let echo = ip_echo("<html>Access denied</html>").await;
        let members = Members::start().await;
        app.create_pool("p", json!({"rules": rules()})).await;
        app.seed("p", &[&id(&members.two)], Some(0)).await;
        check_exits(&app, &format!("http://{}/garbage", echo.addr)).await;
        let listed = await_members(&app, |m| m.get("last_check").is_some()).await;
        assert_eq!(
            (
                listed[0]["last_check"]["result"].clone(),
                listed[0]["state"].clone(),
                listed[0].get("exit_ip"),
            ),
            (json!("ok"), json!("eligible"), None),
            "{backend:?}"
        );
        assert_eq!(stats(&app).await["shared_exit_ips"], json!(0));
        let text = app
            .anonymous(reqwest::Method::GET, "/metrics")
            .send()
            .await
            .expect("sent")
            .text()
            .await
            .expect("text");
        assert!(
            text.lines()
                .any(|line| line.starts_with("pa_exit_ip_unreadable_total ")),
            "{text}"
        );
        app.stop().await;
    }
}
