//! The dashboard page: served open, as HTML, under a strict content security policy, and
//! self-contained (nothing loaded from another origin).

use reqwest::{Method, StatusCode};

use crate::helpers::{Backend, TestApp};

/// The page and its headers, asked for without a token.
async fn fetch_page(app: &TestApp) -> (reqwest::header::HeaderMap, String) {
    let response = app
        .anonymous(Method::GET, "/ui")
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::OK);
    let headers = response.headers().clone();
    (headers, response.text().await.expect("a body"))
}

fn header<'a>(headers: &'a reqwest::header::HeaderMap, name: &str) -> &'a str {
    headers
        .get(name)
        .unwrap_or_else(|| panic!("a {name} header"))
        .to_str()
        .expect("an ASCII header")
}

/// The value of every `attribute="..."` in `html`.
fn attribute_values<'a>(html: &'a str, attribute: &str) -> Vec<&'a str> {
    let needle = format!("{attribute}=\"");
    html.match_indices(&needle)
        .filter(|(at, _)| {
            // `src=` must be the whole attribute name, not the end of `data-src=`.
            html[..*at]
                .chars()
                .next_back()
                .is_some_and(char::is_whitespace)
        })
        .filter_map(|(at, _)| {
            let rest = &html[at + needle.len()..];
            rest.find('"').map(|end| &rest[..end])
        })
        .collect()
}

#[tokio::test]
async fn the_dashboard_is_served_without_a_token_as_html_under_a_nonce_policy() {
    let app = TestApp::spawn(Backend::Embedded).await;
    let (headers, html) = fetch_page(&app).await;

    assert_eq!(header(&headers, "content-type"), "text/html; charset=utf-8");
    assert_eq!(header(&headers, "x-content-type-options"), "nosniff");
    assert_eq!(header(&headers, "cache-control"), "no-store");
    let policy = header(&headers, "content-security-policy");
    let nonce = policy
        .split("'nonce-")
        .nth(1)
        .and_then(|rest| rest.split('\'').next())
        .expect("a nonce in the policy");
    assert_eq!(nonce.len(), 32, "{policy}");
    assert_eq!(
        policy,
        format!(
            "default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; \
             connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; \
             frame-ancestors 'none'"
        )
    );
    // The one script and the one style carry the nonce the policy names; nothing else runs.
    assert_eq!(html.matches("<script").count(), 1);
    assert_eq!(html.matches("<style").count(), 1);
    assert!(html.contains(&format!("<script nonce=\"{nonce}\">")));
    assert!(html.contains(&format!("<style nonce=\"{nonce}\">")));
    assert!(!html.contains("__CSP_NONCE__"));
    app.stop().await;
}

#[tokio::test]
async fn every_dashboard_response_has_a_new_nonce() {
    let app = TestApp::spawn(Backend::Embedded).await;
    let (first, _) = fetch_page(&app).await;
    let (second, _) = fetch_page(&app).await;
    assert_ne!(
        header(&first, "content-security-policy"),
        header(&second, "content-security-policy")
    );
    app.stop().await;
}

#[tokio::test]
async fn the_dashboard_loads_nothing_from_another_origin() {
    let app = TestApp::spawn(Backend::Embedded).await;
    let (_, html) = fetch_page(&app).await;
    let mut references = Vec::new();
    for attribute in ["src", "href", "action", "srcset", "poster", "data"] {
        references.extend(attribute_values(&html, attribute));
    }
    assert_eq!(
        references,
        ["data:,"],
        "the only reference is the empty icon"
    );
    // Nor from style sheets or scripts: no `@import`, no `url(` but local fragments, and
    // `fetch` only ever gets paths of this origin.
    assert!(!html.contains("@import"));
    for (at, _) in html.match_indices("url(") {
        assert!(html[at..].starts_with("url(#"), "{}", &html[at..at + 40]);
    }
    assert!(!html.contains("fetch('http"));
    assert!(!html.contains("fetch(\"http"));
    app.stop().await;
}

#[tokio::test]
async fn the_root_sends_a_browser_to_the_dashboard_and_answers_others_with_an_index() {
    let app = TestApp::spawn(Backend::Embedded).await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("a client");
    let browser = client
        .get(format!("{}/", app.base))
        .header("accept", "text/html,application/xhtml+xml,*/*;q=0.8")
        .send()
        .await
        .expect("sent");
    assert_eq!(browser.status(), StatusCode::SEE_OTHER);
    assert_eq!(header(browser.headers(), "location"), "/ui");
    assert_eq!(header(browser.headers(), "vary"), "accept");
    for accept in [None, Some("application/json"), Some("*/*")] {
        let mut request = client.get(format!("{}/", app.base));
        if let Some(accept) = accept {
            request = request.header("accept", accept);
        }
        let response = request.send().await.expect("sent");
        assert_eq!(response.status(), StatusCode::OK, "{accept:?}");
        let body: serde_json::Value = response.json().await.expect("JSON");
        assert_eq!(
            body,
            serde_json::json!({"service": "proxy-allocator",
                               "links": {"dashboard": "/ui", "openapi": "/openapi.yaml", "livez": "/livez"}}),
            "{accept:?}"
        );
    }
    app.stop().await;
}
