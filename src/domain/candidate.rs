//! `Candidate`: a proxy address taken from a list or a request, parsed and put in the one
//! canonical form `scheme://[user:pass@]host:port` under which it is stored as a member.
//!
//! Lists of free proxies are messy and partly hostile, so the parser is strict where
//! leniency would be dangerous: host names that URL parsers would read as IPv4 numbers
//! (`2130706433`, `0x7f.1`, `127.1`) are refused instead of being passed on as names, and
//! nothing is ever resolved. Credentials are kept byte for byte (never decoded), which is
//! what makes canonicalisation idempotent.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};

use super::member_id::{MAX_MEMBER_ID_LEN, MemberId};

/// A proxy protocol a member may speak.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Scheme {
    /// Plain HTTP proxy (`CONNECT` for TLS targets).
    #[default]
    Http,
    /// HTTP proxy reached over TLS.
    Https,
    /// SOCKS4 (and 4a).
    Socks4,
    /// SOCKS5, names resolved by the client.
    Socks5,
    /// SOCKS5, names resolved by the proxy.
    Socks5h,
}

impl Scheme {
    /// The lower-case name used in member ids and in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Https => "https",
            Self::Socks4 => "socks4",
            Self::Socks5 => "socks5",
            Self::Socks5h => "socks5h",
        }
    }

    /// Reads a scheme name in any letter case.
    pub fn from_name(name: &str) -> Option<Self> {
        [
            Self::Http,
            Self::Https,
            Self::Socks4,
            Self::Socks5,
            Self::Socks5h,
        ]
        .into_iter()
        .find(|scheme| scheme.as_str().eq_ignore_ascii_case(name))
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a candidate was not accepted. The codes are stable: operators count them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, thiserror::Error)]
pub enum Rejection {
    /// Not a proxy address in any accepted form (or not UTF-8, or holding white space).
    #[error("not a proxy address")]
    Unparsable,
    /// The canonical form would be longer than a member id may be.
    #[error("longer than a member id may be")]
    TooLong,
    /// A scheme the pool does not allow, or no proxy scheme at all (`ftp://`).
    #[error("scheme not allowed")]
    SchemeNotAllowed,
    /// A port outside 1–65535 or outside the pool's allowed ranges, or in its deny list.
    #[error("port not allowed")]
    PortNotAllowed,
    /// A loopback, private, link-local, shared, multicast, unspecified, documentation or
    /// otherwise non-public address (or `localhost`), in a pool that does not allow them.
    #[error("private address")]
    PrivateAddress,
    /// A host name in a pool that only takes IP literals.
    #[error("host name not allowed")]
    HostnameNotAllowed,
    /// `user:pass@` in a pool that does not take credentials.
    #[error("credentials not allowed")]
    CredentialsNotAllowed,
    /// The pool has reached its `max_members`.
    #[error("pool full")]
    PoolFull,
}

impl Rejection {
    /// The stable snake_case code reported by the API.
    pub fn code(self) -> &'static str {
        match self {
            Self::Unparsable => "unparsable",
            Self::TooLong => "too_long",
            Self::SchemeNotAllowed => "scheme_not_allowed",
            Self::PortNotAllowed => "port_not_allowed",
            Self::PrivateAddress => "private_address",
            Self::HostnameNotAllowed => "hostname_not_allowed",
            Self::CredentialsNotAllowed => "credentials_not_allowed",
            Self::PoolFull => "pool_full",
        }
    }

    /// What to change for the candidate to be accepted, for the operator who reads the
    /// answer: the rule that refused it. `None` when no setting would accept it (it is not
    /// a proxy address, or too long for an id).
    pub fn hint(self) -> Option<&'static str> {
        match self {
            Self::Unparsable | Self::TooLong => None,
            Self::SchemeNotAllowed => Some("add the scheme to rules.schemes to accept it"),
            Self::PortNotAllowed => Some("change rules.ports (allow, deny) to accept the port"),
            Self::PrivateAddress => {
                Some("set rules.allow_private to accept private and loopback addresses")
            }
            Self::HostnameNotAllowed => Some("set rules.allow_hostnames to accept host names"),
            Self::CredentialsNotAllowed => Some("set rules.allow_credentials to accept user:pass@"),
            Self::PoolFull => Some("raise rules.max_members, or remove members first"),
        }
    }
}

/// Where a candidate proxy listens: an IP literal or a host name (never resolved).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    /// An IPv4 or IPv6 literal.
    Ip(IpAddr),
    /// A lower-case DNS name.
    Name(String),
}

impl Host {
    /// Whether the host is not a public internet address: loopback, private, link-local,
    /// shared (CGNAT), multicast, unspecified, documentation or reserved ranges, IPv6 forms
    /// that embed such an IPv4 address, and the names `localhost` and `*.localhost`, which
    /// always mean loopback (RFC 6761).
    pub fn is_non_public(&self) -> bool {
        match self {
            Self::Ip(IpAddr::V4(v4)) => is_non_public_v4(*v4),
            Self::Ip(IpAddr::V6(v6)) => is_non_public_v6(*v6),
            Self::Name(name) => name == "localhost" || name.ends_with(".localhost"),
        }
    }
}

/// A parsed proxy address and its canonical member id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    scheme: Scheme,
    has_credentials: bool,
    host: Host,
    port: u16,
    id: MemberId,
}

impl Candidate {
    /// Parses one candidate in any accepted form: `host:port`, `scheme://host:port`,
    /// `user:pass@host:port`, `host:port:user:pass` (each with or without a scheme, IPv6 in
    /// brackets). A path, query or fragment is dropped; surrounding white space is ignored.
    /// `default_scheme` applies when the text names none.
    ///
    /// # Errors
    /// [`Rejection::Unparsable`], [`Rejection::SchemeNotAllowed`] for a scheme that is not
    /// a proxy scheme, [`Rejection::PortNotAllowed`] for port 0 or above 65535, and
    /// [`Rejection::TooLong`] when the canonical form exceeds a member id's length. The
    /// pool's own rules are applied afterwards, by `Rules::check`.
    pub fn parse(text: &str, default_scheme: Scheme) -> Result<Self, Rejection> {
        let text = text.trim_ascii();
        if text.is_empty() || !text.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(Rejection::Unparsable);
        }
        let (scheme, rest) = match text.split_once("://") {
            Some((name, rest)) => (parse_scheme(name)?, rest),
            None => (default_scheme, text),
        };
        // The authority ends where a path, query or fragment starts; those are dropped.
        let authority = rest.find(['/', '?', '#']).map_or(rest, |end| &rest[..end]);
        let (userinfo, host_port) = match authority.split_once('@') {
            Some((userinfo, host_port)) => (Some(userinfo), host_port),
            None => (None, authority),
        };
        let (host, tail, bracketed) = split_host(host_port)?;
        // `tail` is `port`, or `port:user:pass` in the form many lists use.
        let (port, trailing_userinfo) = match tail.split_once(':') {
            Some((port, userinfo)) => (port, Some(userinfo)),
            None => (tail, None),
        };
        let credentials = match (userinfo, trailing_userinfo) {
            (Some(_), Some(_)) => return Err(Rejection::Unparsable),
            (given, trailing) => given.or(trailing).map(parse_credentials).transpose()?,
        };
        let port = parse_port(port)?;
        let host = parse_host(host, bracketed)?;
        let id = canonical_id(scheme, credentials, &host, port)?;
        Ok(Self {
            scheme,
            has_credentials: credentials.is_some(),
            host,
            port,
            id,
        })
    }

    /// The proxy scheme.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// Whether the address carries `user:pass@`.
    pub fn has_credentials(&self) -> bool {
        self.has_credentials
    }

    /// The host.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// The port, 1 to 65535.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The canonical member id.
    pub fn member_id(&self) -> &MemberId {
        &self.id
    }

    /// The canonical member id, by value.
    pub fn into_member_id(self) -> MemberId {
        self.id
    }

    /// The canonical form with the password hidden, for logs.
    pub fn masked(&self) -> String {
        mask_credentials(self.id.as_str())
    }
}

/// Whether a member id claims to be a proxy address (and must then parse as one) rather
/// than an opaque name such as `dc-fra-07`: it names a scheme, holds `@`, starts with `[`,
/// is a bare IP literal, or has a port-like number after its first `:`.
///
/// Bare IP literals count as addresses so that `10.0.0.5` cannot slip past the private
/// address rule as an "opaque" id that a proxy client would still dial.
pub fn looks_like_address(text: &str) -> bool {
    text.contains("://")
        || text.contains('@')
        || text.starts_with('[')
        || text.parse::<IpAddr>().is_ok()
        || text
            .split(':')
            .nth(1)
            .is_some_and(|port| !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()))
}

/// The id under which a member named in a request is looked up: the canonical form of a
/// proxy address (with `http` when no scheme is given), or the id unchanged when it is an
/// opaque name or an address that does not parse (so that such ids can still be removed).
pub fn canonical_member_id(id: MemberId) -> MemberId {
    if looks_like_address(id.as_str()) {
        Candidate::parse(id.as_str(), Scheme::Http).map_or(id, Candidate::into_member_id)
    } else {
        id
    }
}

/// Longest text [`mask_credentials`] returns, in characters; longer input is cut.
pub const MASKED_MAX_CHARS: usize = 120;

/// `text` with any password replaced by `***` (the user name is kept: `user:***@host`, or
/// `host:port:user:***`), cut to [`MASKED_MAX_CHARS`] characters. Works on any text,
/// parsable or not, so that report examples and logs never carry a secret.
pub fn mask_credentials(text: &str) -> String {
    let (prefix, rest) = match text.find("://") {
        Some(i) => text.split_at(i + 3),
        None => ("", text),
    };
    let masked = if let Some(at) = rest.rfind('@') {
        let user = rest[..at].split(':').next().unwrap_or("");
        let hidden = if rest[..at].contains(':') {
            format!("{user}:***")
        } else {
            "***".to_owned()
        };
        format!("{prefix}{hidden}{}", &rest[at..])
    } else {
        let host_end = if rest.starts_with('[') {
            rest.find(']').map_or(rest.len(), |i| i + 1)
        } else {
            rest.find(':').unwrap_or(rest.len())
        };
        let (host, tail) = rest.split_at(host_end);
        let parts: Vec<&str> = tail
            .strip_prefix(':')
            .unwrap_or("")
            .splitn(3, ':')
            .collect();
        match parts.as_slice() {
            [port, user, _] if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
                format!("{prefix}{host}:{port}:{user}:***")
            }
            _ => text.to_owned(),
        }
    };
    if masked.chars().count() <= MASKED_MAX_CHARS {
        masked
    } else {
        let mut cut: String = masked.chars().take(MASKED_MAX_CHARS).collect();
        cut.push('…');
        cut
    }
}

fn parse_scheme(name: &str) -> Result<Scheme, Rejection> {
    let well_formed = name.bytes().next().is_some_and(|b| b.is_ascii_alphabetic())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'));
    if !well_formed {
        return Err(Rejection::Unparsable);
    }
    // A well-formed scheme that is not a proxy protocol (`ftp`, `socks`) can never be
    // allowed by any pool, so it is reported as such rather than as unparsable.
    Scheme::from_name(name).ok_or(Rejection::SchemeNotAllowed)
}

/// Splits `host:rest`, where the host may be an IPv6 literal in brackets; says which.
fn split_host(host_port: &str) -> Result<(&str, &str, bool), Rejection> {
    if let Some(bracketed) = host_port.strip_prefix('[') {
        let (host, after) = bracketed.split_once(']').ok_or(Rejection::Unparsable)?;
        let tail = after.strip_prefix(':').ok_or(Rejection::Unparsable)?;
        Ok((host, tail, true))
    } else {
        let (host, tail) = host_port.split_once(':').ok_or(Rejection::Unparsable)?;
        Ok((host, tail, false))
    }
}

fn parse_port(text: &str) -> Result<u16, Rejection> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Rejection::Unparsable);
    }
    // All digits: a number, but perhaps not a port (0, 65536, 99999999999).
    match text.parse::<u16>() {
        Ok(0) | Err(_) => Err(Rejection::PortNotAllowed),
        Ok(port) => Ok(port),
    }
}

/// `user:pass`, both non-empty; the user holds no `:` (the first one separates them).
fn parse_credentials(userinfo: &str) -> Result<(&str, &str), Rejection> {
    match userinfo.split_once(':') {
        Some((user, pass)) if !user.is_empty() && !pass.is_empty() => Ok((user, pass)),
        _ => Err(Rejection::Unparsable),
    }
}

/// Whether every dot-separated label of `name` is 1 to 63 bytes of ASCII letters, digits,
/// `-` and `_`, with no `-` at either end (the length of the whole is the caller's).
pub(super) fn is_dns_name(name: &str) -> bool {
    name.split('.').all(|label| {
        (1..=63).contains(&label.len())
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'))
    })
}

/// An IPv6 literal when `bracketed` (and only then), else an IPv4 literal or a host name.
/// [`super::Target`] shares its label rule ([`is_dns_name`]) but not its numeric-last-label rule.
pub(super) fn parse_host(text: &str, bracketed: bool) -> Result<Host, Rejection> {
    if bracketed {
        return text
            .parse::<Ipv6Addr>()
            .map(|v6| Host::Ip(IpAddr::V6(v6)))
            .map_err(|_| Rejection::Unparsable);
    }
    // std's parser takes only the strict dotted quad (no `0177.0.0.1`, no `127.1`).
    if let Ok(v4) = text.parse::<Ipv4Addr>() {
        return Ok(Host::Ip(IpAddr::V4(v4)));
    }
    let name = text.to_ascii_lowercase();
    let labels_ok = name.len() <= 253 && is_dns_name(&name);
    // URL parsers read a name whose last label is a number as an IPv4 address in another
    // notation (`2130706433`, `127.1`, `0x7f.1` are all 127.0.0.1): refusing them keeps
    // the private-address rule from being bypassed.
    let last = name.rsplit('.').next().unwrap_or("");
    let numeric_last = last.bytes().all(|b| b.is_ascii_digit())
        || (last.starts_with("0x") && last[2..].bytes().all(|b| b.is_ascii_hexdigit()));
    if labels_ok && !numeric_last {
        Ok(Host::Name(name))
    } else {
        Err(Rejection::Unparsable)
    }
}

fn canonical_id(
    scheme: Scheme,
    credentials: Option<(&str, &str)>,
    host: &Host,
    port: u16,
) -> Result<MemberId, Rejection> {
    use std::fmt::Write;
    let mut id = String::with_capacity(64);
    // Writing to a String cannot fail.
    let _ = write!(id, "{scheme}://");
    if let Some((user, pass)) = credentials {
        let _ = write!(id, "{user}:{pass}@");
    }
    let _ = match host {
        Host::Ip(IpAddr::V6(v6)) => write!(id, "[{v6}]:{port}"),
        Host::Ip(IpAddr::V4(v4)) => write!(id, "{v4}:{port}"),
        Host::Name(name) => write!(id, "{name}:{port}"),
    };
    if id.len() > MAX_MEMBER_ID_LEN {
        return Err(Rejection::TooLong);
    }
    MemberId::parse(&id).map_err(|_| Rejection::Unparsable)
}

/// IPv4 ranges no proxy on the public internet has.
const NON_PUBLIC_V4: [(Ipv4Addr, u8); 14] = [
    (Ipv4Addr::new(0, 0, 0, 0), 8), // "this network", unspecified (RFC 1122)
    (Ipv4Addr::new(10, 0, 0, 0), 8), // private (RFC 1918)
    (Ipv4Addr::new(100, 64, 0, 0), 10), // shared address space, CGNAT (RFC 6598)
    (Ipv4Addr::new(127, 0, 0, 0), 8), // loopback
    (Ipv4Addr::new(169, 254, 0, 0), 16), // link-local
    (Ipv4Addr::new(172, 16, 0, 0), 12), // private (RFC 1918)
    (Ipv4Addr::new(192, 0, 0, 0), 24), // IETF protocol assignments
    (Ipv4Addr::new(192, 0, 2, 0), 24), // documentation, TEST-NET-1
    (Ipv4Addr::new(192, 168, 0, 0), 16), // private (RFC 1918)
    (Ipv4Addr::new(198, 18, 0, 0), 15), // benchmarking (RFC 2544)
    (Ipv4Addr::new(198, 51, 100, 0), 24), // documentation, TEST-NET-2
    (Ipv4Addr::new(203, 0, 113, 0), 24), // documentation, TEST-NET-3
    (Ipv4Addr::new(224, 0, 0, 0), 4), // multicast
    (Ipv4Addr::new(240, 0, 0, 0), 4), // reserved, broadcast included
];

/// IPv6 ranges no proxy on the public internet has.
const NON_PUBLIC_V6: [(Ipv6Addr, u8); 9] = [
    (Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 0), 96), // unspecified, loopback, IPv4-compatible
    (Ipv6Addr::new(0x100, 0, 0, 0, 0, 0, 0, 0), 64), // discard-only (RFC 6666)
    (Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0), 32), // documentation
    (Ipv6Addr::new(0x3fff, 0, 0, 0, 0, 0, 0, 0), 20), // documentation (RFC 9637)
    (Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0), 7), // unique local (RFC 4193)
    (Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0), 10), // link-local
    (Ipv6Addr::new(0xfec0, 0, 0, 0, 0, 0, 0, 0), 10), // site-local (deprecated)
    (Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0), 8), // multicast
    // Teredo tunnels reach an IPv4 host whose address is only obfuscated.
    (Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0), 32),
];

fn in_v4(addr: Ipv4Addr, (net, prefix): (Ipv4Addr, u8)) -> bool {
    let shift = 32 - u32::from(prefix);
    u32::from(addr) >> shift == u32::from(net) >> shift
}

fn in_v6(addr: Ipv6Addr, (net, prefix): (Ipv6Addr, u8)) -> bool {
    let shift = 128 - u32::from(prefix);
    u128::from(addr) >> shift == u128::from(net) >> shift
}

fn is_non_public_v4(addr: Ipv4Addr) -> bool {
    NON_PUBLIC_V4.iter().any(|range| in_v4(addr, *range))
}

fn is_non_public_v6(addr: Ipv6Addr) -> bool {
    if NON_PUBLIC_V6.iter().any(|range| in_v6(addr, *range)) {
        return true;
    }
    // Forms that carry an IPv4 address reach that address: IPv4-mapped (::ffff:0:0/96),
    // NAT64 (64:ff9b::/96) in the low 32 bits, and 6to4 (2002::/16) in bits 16 to 48.
    let bits = u128::from(addr);
    let low = Ipv4Addr::from((bits & 0xffff_ffff) as u32);
    let mapped = in_v6(addr, (Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0), 96));
    let nat64 = in_v6(addr, (Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0), 96));
    let six_to_four = in_v6(addr, (Ipv6Addr::new(0x2002, 0, 0, 0, 0, 0, 0, 0), 16));
    ((mapped || nat64) && is_non_public_v4(low))
        || (six_to_four && is_non_public_v4(Ipv4Addr::from(((bits >> 80) & 0xffff_ffff) as u32)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canonical(text: &str) -> Result<String, Rejection> {
        Candidate::parse(text, Scheme::Http).map(|c| c.member_id().as_str().to_owned())
    }

    #[test]
    fn every_accepted_form_becomes_the_one_canonical_id() {
        for (input, expected) in [
            ("1.2.3.4:8080", "http://1.2.3.4:8080"),
            ("http://1.2.3.4:8080", "http://1.2.3.4:8080"),
            ("http://1.2.3.4:8080/", "http://1.2.3.4:8080"),
            ("HTTP://1.2.3.4:8080", "http://1.2.3.4:8080"),
            ("https://1.2.3.4:443/path?q=1#frag", "https://1.2.3.4:443"),
            ("socks4://1.2.3.4:1080", "socks4://1.2.3.4:1080"),
            ("SOCKS5://1.2.3.4:1080", "socks5://1.2.3.4:1080"),
            (
                "socks5h://Proxy.Example.NET:1080",
                "socks5h://proxy.example.net:1080",
            ),
            ("user:pass@1.2.3.4:3128", "http://user:pass@1.2.3.4:3128"),
            (
                "http://User:PaSs@Host.example:3128",
                "http://User:PaSs@host.example:3128",
            ),
            ("1.2.3.4:3128:user:pass", "http://user:pass@1.2.3.4:3128"),
            (
                "https://1.2.3.4:3128:user:p:a:ss",
                "https://user:p:a:ss@1.2.3.4:3128",
            ),
            ("u:p%40ss@1.2.3.4:1", "http://u:p%40ss@1.2.3.4:1"),
            (
                "[2a00:1450:4001::1]:8080",
                "http://[2a00:1450:4001::1]:8080",
            ),
            (
                "[2A00:1450:4001:0:0:0:0:1]:8080",
                "http://[2a00:1450:4001::1]:8080",
            ),
            (
                "[2a00:1450::1]:80:user:pass",
                "http://user:pass@[2a00:1450::1]:80",
            ),
            ("u:p@[2a00:1450::1]:80", "http://u:p@[2a00:1450::1]:80"),
            ("  1.2.3.4:8080  ", "http://1.2.3.4:8080"),
            ("1.2.3.4:8080\r", "http://1.2.3.4:8080"),
            ("\t1.2.3.4:65535", "http://1.2.3.4:65535"),
            ("1.2.3.4:1", "http://1.2.3.4:1"),
            (
                "proxy-1.example.com:3128",
                "http://proxy-1.example.com:3128",
            ),
            ("dc-fra-07:3128", "http://dc-fra-07:3128"),
            ("[::ffff:1.2.3.4]:80", "http://[::ffff:1.2.3.4]:80"),
        ] {
            assert_eq!(canonical(input), Ok(expected.to_owned()), "{input:?}");
        }
    }

    #[test]
    fn a_line_without_a_scheme_takes_the_default_scheme() {
        let candidate = Candidate::parse("1.2.3.4:1080", Scheme::Socks5).expect("parses");
        assert_eq!(candidate.member_id().as_str(), "socks5://1.2.3.4:1080");
        let candidate = Candidate::parse("http://1.2.3.4:1080", Scheme::Socks5).expect("parses");
        assert_eq!(candidate.member_id().as_str(), "http://1.2.3.4:1080");
    }

    #[test]
    fn malformed_candidates_are_rejected_with_their_reason() {
        let long_host = format!("{}.example:80", "a".repeat(64));
        let long_credentials = format!("u:{}@1.2.3.4:80", "p".repeat(600));
        let megabyte = "a".repeat(1 << 20);
        let megabyte_of_credentials = format!("u:{}@1.2.3.4:80", "p".repeat(1 << 20));
        let megabyte_path = format!("http://1.2.3.4:80/{}", "p".repeat(1 << 20));
        for (input, expected) in [
            ("", Rejection::Unparsable),
            ("   ", Rejection::Unparsable),
            ("1.2.3.4", Rejection::Unparsable),
            ("1.2.3.4:", Rejection::Unparsable),
            ("1.2.3.4:80a", Rejection::Unparsable),
            ("1.2.3.4 :80", Rejection::Unparsable),
            ("1.2.3.4:80 # fast", Rejection::Unparsable),
            ("http://", Rejection::Unparsable),
            ("://1.2.3.4:80", Rejection::Unparsable),
            ("1http://1.2.3.4:80", Rejection::Unparsable),
            ("dc-fra-07", Rejection::Unparsable),
            ("http://1.2.3.4", Rejection::Unparsable),
            ("::1:80", Rejection::Unparsable),
            ("[::1:80", Rejection::Unparsable),
            ("[::1]80", Rejection::Unparsable),
            ("[::1%eth0]:80", Rejection::Unparsable),
            ("[1.2.3.4]:80", Rejection::Unparsable),
            ("@1.2.3.4:80", Rejection::Unparsable),
            (":pass@1.2.3.4:80", Rejection::Unparsable),
            ("user@1.2.3.4:80", Rejection::Unparsable),
            ("user:@1.2.3.4:80", Rejection::Unparsable),
            ("u:p@1.2.3.4:80:v:q", Rejection::Unparsable),
            ("1.2.3.4:80:user", Rejection::Unparsable),
            ("1.2.3.4:80:user:", Rejection::Unparsable),
            ("a@b@1.2.3.4:80", Rejection::Unparsable),
            ("-bad.example:80", Rejection::Unparsable),
            ("bad-.example:80", Rejection::Unparsable),
            ("bad..example:80", Rejection::Unparsable),
            ("bad.example.:80", Rejection::Unparsable),
            ("exa mple.com:80", Rejection::Unparsable),
            ("exämple.com:80", Rejection::Unparsable),
            ("2130706433:80", Rejection::Unparsable),
            ("127.1:80", Rejection::Unparsable),
            ("0x7f.0.0.1:80", Rejection::Unparsable),
            ("0177.0.0.1:80", Rejection::Unparsable),
            ("1.2.3.256:80", Rejection::Unparsable),
            (&long_host, Rejection::Unparsable),
            (&megabyte, Rejection::Unparsable),
            ("1.2.3.4:0", Rejection::PortNotAllowed),
            ("1.2.3.4:65536", Rejection::PortNotAllowed),
            ("1.2.3.4:99999999999999999999", Rejection::PortNotAllowed),
            ("ftp://1.2.3.4:21", Rejection::SchemeNotAllowed),
            ("socks://1.2.3.4:1080", Rejection::SchemeNotAllowed),
            (&long_credentials, Rejection::TooLong),
            (&megabyte_of_credentials, Rejection::TooLong),
        ] {
            assert_eq!(
                canonical(input),
                Err(expected),
                "{:?}",
                &input[..input.len().min(40)]
            );
        }
        assert_eq!(
            canonical(&megabyte_path),
            Ok("http://1.2.3.4:80".to_owned())
        );
    }

    #[test]
    fn the_boundaries_of_every_non_public_range_are_exact() {
        let cases = [
            ("0.0.0.0", true),
            ("0.255.255.255", true),
            ("1.0.0.0", false),
            ("9.255.255.255", false),
            ("10.0.0.0", true),
            ("10.255.255.255", true),
            ("11.0.0.0", false),
            ("100.63.255.255", false),
            ("100.64.0.0", true),
            ("100.127.255.255", true),
            ("100.128.0.0", false),
            ("126.255.255.255", false),
            ("127.0.0.1", true),
            ("127.255.255.255", true),
            ("128.0.0.0", false),
            ("169.253.255.255", false),
            ("169.254.0.0", true),
            ("169.254.255.255", true),
            ("169.255.0.0", false),
            ("172.15.255.255", false),
            ("172.16.0.0", true),
            ("172.31.255.255", true),
            ("172.32.0.0", false),
            ("192.0.0.0", true),
            ("192.0.1.255", false),
            ("192.0.2.0", true),
            ("192.0.2.255", true),
            ("192.0.3.0", false),
            ("192.167.255.255", false),
            ("192.168.0.0", true),
            ("192.168.255.255", true),
            ("192.169.0.0", false),
            ("198.17.255.255", false),
            ("198.18.0.0", true),
            ("198.19.255.255", true),
            ("198.20.0.0", false),
            ("198.51.99.255", false),
            ("198.51.100.0", true),
            ("198.51.100.255", true),
            ("198.51.101.0", false),
            ("203.0.112.255", false),
            ("203.0.113.0", true),
            ("203.0.113.255", true),
            ("203.0.114.0", false),
            ("223.255.255.255", false),
            ("224.0.0.0", true),
            ("239.255.255.255", true),
            ("240.0.0.0", true),
            ("255.255.255.255", true),
            ("8.8.8.8", false),
            ("::", true),
            ("::1", true),
            ("::2", true),
            ("::1:0:0", false),
            ("fbff:ffff::", false),
            ("fc00::", true),
            ("fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", true),
            ("fe00::", false),
            ("fe80::", true),
            ("febf:ffff::", true),
            ("fec0::1", true),
            ("ff00::", true),
            ("ff02::1", true),
            ("2001:db7:ffff::", false),
            ("2001:db8::", true),
            ("2001:db8:ffff:ffff::", true),
            ("2001:db9::", false),
            ("2001::1", true),
            ("2001:1::1", false),
            ("3fff::1", true),
            ("3fff:1000::", false),
            ("100::1", true),
            ("2a00:1450:4001::1", false),
            ("::ffff:127.0.0.1", true),
            ("::ffff:10.0.0.5", true),
            ("::ffff:172.15.255.255", false),
            ("::ffff:8.8.8.8", false),
            ("64:ff9b::7f00:1", true),
            ("64:ff9b::808:808", false),
            ("2002:7f00:1::", true),
            ("2002:808:808::", false),
        ];
        for (ip, non_public) in cases {
            let host = Host::Ip(ip.parse().expect("an IP literal"));
            assert_eq!(host.is_non_public(), non_public, "{ip}");
        }
        for (name, non_public) in [
            ("localhost", true),
            ("db.localhost", true),
            ("localhost.example", false),
            ("example.com", false),
        ] {
            assert_eq!(
                Host::Name(name.to_owned()).is_non_public(),
                non_public,
                "{name}"
            );
        }
    }

    #[test]
    fn canonicalisation_is_idempotent_over_generated_candidates() {
        use rand::Rng;
        use rand::seq::IndexedRandom;
        let mut rng = rand::rng();
        let schemes = [
            "",
            "http://",
            "HTTPS://",
            "socks5h://",
            "Socks4://",
            "ftp://",
        ];
        let hosts = [
            "1.2.3.4",
            "8.8.8.8",
            "10.0.0.5",
            "Proxy.Example.COM",
            "[2A00:1450::1]",
            "[::ffff:8.8.8.8]",
            "[::1]",
            "a_b.example",
            "xn--bcher-kva.example",
        ];
        let credentials = ["", "u:p@", "User:P%40ss@", "a:b:c@"];
        let tails = ["", "/", "/path?q=1", "#x", "?a"];
        for _ in 0..5_000 {
            let port = rng.random_range(0..=70_000u32);
            let text = if rng.random_bool(0.2) {
                format!(
                    "{}{}:{port}:user{}:pa:ss{}",
                    schemes.choose(&mut rng).copied().unwrap_or_default(),
                    hosts.choose(&mut rng).copied().unwrap_or_default(),
                    rng.random_range(0..9),
                    tails.choose(&mut rng).copied().unwrap_or_default(),
                )
            } else {
                format!(
                    "{}{}{}:{port}{}",
                    schemes.choose(&mut rng).copied().unwrap_or_default(),
                    credentials.choose(&mut rng).copied().unwrap_or_default(),
                    hosts.choose(&mut rng).copied().unwrap_or_default(),
                    tails.choose(&mut rng).copied().unwrap_or_default(),
                )
            };
            let Ok(once) = Candidate::parse(&text, Scheme::Http) else {
                continue;
            };
            let twice = Candidate::parse(once.member_id().as_str(), Scheme::Socks4)
                .unwrap_or_else(|e| panic!("{text:?} -> {once:?} does not parse again: {e}"));
            assert_eq!(twice, once, "{text:?}");
            assert!(looks_like_address(once.member_id().as_str()), "{text:?}");
        }
    }

    #[test]
    fn canonicalisation_is_idempotent_over_random_bytes() {
        use rand::Rng;
        use rand::seq::IndexedRandom;
        let alphabet: Vec<char> = "abcXYZ019:@/[].-_%#?".chars().collect();
        let mut rng = rand::rng();
        for _ in 0..20_000 {
            let len = rng.random_range(1..24);
            let text: String = (0..len)
                .map(|_| alphabet.choose(&mut rng).copied().unwrap_or('a'))
                .collect();
            if let Ok(once) = Candidate::parse(&text, Scheme::Http) {
                let twice = Candidate::parse(once.member_id().as_str(), Scheme::Http);
                assert_eq!(twice.as_ref(), Ok(&once), "{text:?}");
            }
        }
    }

    #[test]
    fn opaque_names_stay_opaque_and_addresses_are_recognised() {
        for opaque in [
            "a",
            "proxy-1",
            "dc-fra-07",
            "redis.call('DEL','k')",
            "*3$3DEL",
            "~",
            "a:b",
        ] {
            assert!(!looks_like_address(opaque), "{opaque}");
        }
        for address in [
            "1.2.3.4:8080",
            "10.0.0.5",
            "2001:db8::1",
            "http://x",
            "u:p@x",
            "[::1]:80",
            "h:0",
            "h:80:u:p",
        ] {
            assert!(looks_like_address(address), "{address}");
        }
    }

    #[test]
    fn lookups_canonicalise_addresses_and_leave_everything_else_alone() {
        let lookup = |text: &str| {
            canonical_member_id(MemberId::parse(text).expect("a member id"))
                .as_str()
                .to_owned()
        };
        assert_eq!(lookup("1.2.3.4:8080"), "http://1.2.3.4:8080");
        assert_eq!(lookup("HTTP://1.2.3.4:8080/"), "http://1.2.3.4:8080");
        assert_eq!(lookup("10.0.0.5:80"), "http://10.0.0.5:80");
        assert_eq!(lookup("dc-fra-07"), "dc-fra-07");
        assert_eq!(lookup("http://[oops"), "http://[oops");
    }

    #[test]
    fn masking_hides_passwords_in_every_form_and_cuts_long_text() {
        for (input, masked) in [
            (
                "http://user:secret@1.2.3.4:80",
                "http://user:***@1.2.3.4:80",
            ),
            ("user:secret@1.2.3.4:80", "user:***@1.2.3.4:80"),
            ("token@1.2.3.4:80", "***@1.2.3.4:80"),
            ("1.2.3.4:80:user:secret", "1.2.3.4:80:user:***"),
            (
                "socks5://1.2.3.4:80:user:se:cret",
                "socks5://1.2.3.4:80:user:***",
            ),
            ("[::1]:80:user:secret", "[::1]:80:user:***"),
            ("garbage u:secret@x", "garbage u:***@x"),
            ("1.2.3.4:80", "1.2.3.4:80"),
            ("dc-fra-07", "dc-fra-07"),
        ] {
            assert_eq!(mask_credentials(input), masked, "{input}");
        }
        let long = format!("u:{}@1.2.3.4:80{}", "s".repeat(50), "x".repeat(500));
        let masked = mask_credentials(&long);
        assert_eq!(masked.chars().count(), MASKED_MAX_CHARS + 1);
        assert!(masked.starts_with("u:***@1.2.3.4:80xxx"), "{masked}");
        assert!(masked.ends_with('…'));
        let candidate = Candidate::parse("1.2.3.4:80:me:secret", Scheme::Http).expect("parses");
        assert_eq!(candidate.masked(), "http://me:***@1.2.3.4:80");
    }
}
