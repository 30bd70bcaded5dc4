//! The operator dashboard: `GET /ui`, one page embedded in the binary (HTML, CSS and script
//! inline, nothing fetched from elsewhere), so it works on a machine with no internet; and
//! `GET /`, which points whoever arrives there at it.
//!
//! The route is open: the page holds no data. Its script asks the admin API for everything,
//! with the admin token the operator pastes into the page, which keeps it in the browser's
//! session storage and sends it as a bearer token, never in a URL.

use axum::http::HeaderMap;
use axum::http::StatusCode;
use axum::http::header::{
    ACCEPT, CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, LOCATION, REFERRER_POLICY, VARY,
    X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};
use axum::response::{IntoResponse, Response};

/// The page, with [`NONCE_SLOT`] wherever its inline script and style need the nonce.
const PAGE: &str = include_str!("ui/index.html");

/// Stands for the per-response nonce in [`PAGE`].
const NONCE_SLOT: &str = "__CSP_NONCE__";

/// The policy for one response. Only the page's own inline script and style (the ones
/// carrying `nonce`) run, the script may talk to this origin only, and nothing else loads:
/// an id an attacker planted in a member list cannot become markup that executes.
fn content_security_policy(nonce: &str) -> String {
    format!(
        "default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; \
         connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; \
         frame-ancestors 'none'"
    )
}

/// The dashboard page, with a fresh nonce for its inline script and style.
pub async fn page() -> Response {
    // A new nonce per response, so that a nonce seen once is worth nothing later; hex is
    // valid in both the header and the attribute.
    let nonce = crate::domain::hex(&rand::random::<[u8; 16]>());
    (
        [
            (CONTENT_TYPE, "text/html; charset=utf-8".to_owned()),
            (CONTENT_SECURITY_POLICY, content_security_policy(&nonce)),
            (X_CONTENT_TYPE_OPTIONS, "nosniff".to_owned()),
            (X_FRAME_OPTIONS, "DENY".to_owned()),
            (REFERRER_POLICY, "no-referrer".to_owned()),
            // The nonce changes with every response: a cached copy would carry a stale one.
            (CACHE_CONTROL, "no-store".to_owned()),
        ],
        PAGE.replace(NONCE_SLOT, &nonce),
    )
        .into_response()
}

/// `GET /`: a browser (a request that accepts HTML) is sent on to the dashboard; anything
/// else gets a small JSON index of where to go, so that a first `curl` of the address says
/// more than `not_found`.
pub async fn index(headers: HeaderMap) -> Response {
    let wants_html = headers
        .get_all(ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .any(|value| value.to_ascii_lowercase().contains("text/html"));
    // The answer depends on Accept: a cache must not hand one kind of client the other's.
    if wants_html {
        return (StatusCode::SEE_OTHER, [(LOCATION, "/ui"), (VARY, "accept")]).into_response();
    }
    (
        [(VARY, "accept")],
        axum::Json(serde_json::json!({
            "service": "proxy-allocator",
            "links": {
                "dashboard": "/ui",
                "openapi": "/openapi.yaml",
                "livez": "/livez",
            },
        })),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_has_a_nonce_slot_on_its_script_and_its_style() {
        assert_eq!(PAGE.matches(NONCE_SLOT).count(), 2);
        assert!(PAGE.contains(&format!("<script nonce=\"{NONCE_SLOT}\">")));
        assert!(PAGE.contains(&format!("<style nonce=\"{NONCE_SLOT}\">")));
    }
}
