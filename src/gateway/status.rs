//! What every gateway answer says about how it was served: `Proxy-Status` (RFC 9209) with
//! the gateway's own error type and details on its failures, the member that served (its
//! password masked) and how many members were tried.

use hyper::header::{HeaderMap, HeaderName, HeaderValue};

use crate::domain::MemberId;

/// RFC 9209's response header, one list member per intermediary.
pub const PROXY_STATUS: HeaderName = HeaderName::from_static("proxy-status");

/// The member that served the request (or was tried last), its password masked.
pub const SERVED_BY: HeaderName = HeaderName::from_static("x-proxy-allocator-proxy");

/// The tunnel's ticket, for an outcome report about its member (see `crate::tickets`).
pub const TICKET: HeaderName = HeaderName::from_static("x-proxy-allocator-ticket");

/// How many members the request was tried through.
pub const ATTEMPTS: HeaderName = HeaderName::from_static("x-proxy-allocator-attempts");

/// The gateway's name in `Proxy-Status`.
const NAME: &str = "proxy-allocator";

/// Longest `details` text, in bytes: a sentence, never a page.
const MAX_DETAILS: usize = 200;

/// The members one request was tried through: how many, and the last of them.
#[derive(Debug, Default)]
pub struct Tried {
    /// Attempts so far (each a distinct member).
    pub attempts: u32,
    /// The member of the last attempt.
    pub last: Option<MemberId>,
}

impl Tried {
    /// Counts an attempt through `member`.
    pub fn attempt(&mut self, member: &MemberId) {
        self.attempts += 1;
        self.last = Some(member.clone());
    }

    /// Writes `x-proxy-allocator-proxy` (when a member was tried) and
    /// `x-proxy-allocator-attempts` into `headers`, replacing any an upstream sent.
    pub fn write(&self, headers: &mut HeaderMap) {
        headers.remove(SERVED_BY);
        if let Some(member) = &self.last {
            // A member id is visible ASCII (parsed at the edge), so it is always a header
            // value and can never end the header or start another.
            if let Ok(value) = HeaderValue::from_str(&member.masked()) {
                headers.insert(SERVED_BY, value);
            }
        }
        headers.insert(ATTEMPTS, HeaderValue::from(self.attempts));
    }
}

/// `Proxy-Status` of a request the gateway served: its list member, after any an upstream
/// proxy added (with the status received from the next hop, for a forwarded response).
pub fn served(headers: &mut HeaderMap, received_status: Option<u16>) {
    let value = match received_status {
        Some(status) => format!("{NAME}; received-status={status}"),
        None => NAME.to_owned(),
    };
    if let Ok(value) = HeaderValue::from_str(&value) {
        headers.append(PROXY_STATUS, value);
    }
}

/// `Proxy-Status` of an answer of the gateway's own: `error` (an RFC 9209 error type) and
/// `details`, a credential-free sentence.
pub fn failed(headers: &mut HeaderMap, error: &str, details: &str) {
    let value = format!("{NAME}; error={error}; details={}", sf_string(details));
    if let Ok(value) = HeaderValue::from_str(&value) {
        headers.insert(PROXY_STATUS, value);
    }
}

/// `text` as a structured-field string (RFC 8941): quoted, `"` and `\` escaped, anything
/// outside visible ASCII and space replaced by `?`, cut to [`MAX_DETAILS`] bytes.
fn sf_string(text: &str) -> String {
    let mut quoted = String::with_capacity(text.len().min(MAX_DETAILS) + 2);
    quoted.push('"');
    for c in text.chars().take(MAX_DETAILS) {
        match c {
            '"' | '\\' => {
                quoted.push('\\');
                quoted.push(c);
            }
            ' '..='~' => quoted.push(c),
            _ => quoted.push('?'),
        }
    }
    quoted.push('"');
    quoted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn details_are_a_quoted_string_with_quotes_escaped_and_controls_replaced() {
        assert_eq!(
            sf_string("said \"no\" \\ then\r\nX-Injected: 1"),
            r#""said \"no\" \\ then??X-Injected: 1""#
        );
    }

    #[test]
    fn a_failure_names_the_error_type_and_its_details() {
        let mut headers = HeaderMap::new();
        failed(
            &mut headers,
            "connection_refused",
            "connecting to the proxy: refused",
        );
        assert_eq!(
            headers[PROXY_STATUS],
            r#"proxy-allocator; error=connection_refused; details="connecting to the proxy: refused""#
        );
    }

    #[test]
    fn a_served_request_appends_its_member_after_an_upstreams() {
        let mut headers = HeaderMap::new();
        headers.insert(PROXY_STATUS, HeaderValue::from_static("upstream-cache"));
        served(&mut headers, Some(403));
        let values: Vec<&str> = headers
            .get_all(PROXY_STATUS)
            .iter()
            .map(|v| v.to_str().expect("ascii"))
            .collect();
        assert_eq!(
            values,
            ["upstream-cache", "proxy-allocator; received-status=403"]
        );
    }

    #[test]
    fn the_member_is_written_masked_and_an_upstreams_own_header_replaced() {
        let mut headers = HeaderMap::new();
        headers.insert(SERVED_BY, HeaderValue::from_static("spoofed"));
        let mut tried = Tried::default();
        tried.attempt(&MemberId::parse("http://user:secret@p1.example.net:3128").expect("id"));
        tried.attempt(&MemberId::parse("http://user:secret@p2.example.net:3128").expect("id"));
        tried.write(&mut headers);
        assert_eq!(headers[SERVED_BY], "http://***@p2.example.net:3128");
        assert_eq!(headers[ATTEMPTS], "2");
        assert_eq!(headers.get_all(SERVED_BY).iter().count(), 1);
    }
}
