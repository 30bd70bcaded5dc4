//! `Rules`: which candidates a pool accepts as members (`rules` in its configuration).
//!
//! The same rules apply on every path that adds members (import and seeding), so no path
//! bypasses them. Routes that only name existing members (disable, enable, remove) do not
//! apply them: an operator must be able to take out a member that a later, stricter rule
//! would refuse.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::candidate::{Candidate, Host, Rejection, Scheme, looks_like_address};
use super::member_id::MemberId;

/// A pool's eligibility rules. Every field has a default, so `{}` (or no `rules` at all) is
/// a complete set: HTTP(S) proxies on public addresses, any port, names and credentials
/// allowed, no size bound, opaque ids allowed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rules {
    /// Allowed proxy schemes (default `["http", "https"]`).
    #[serde(default = "default_schemes")]
    pub schemes: BTreeSet<Scheme>,
    /// Allowed and denied ports.
    #[serde(default, deserialize_with = "super::object::only")]
    pub ports: PortRules,
    /// Whether non-public addresses (loopback, RFC 1918, RFC 4193, link-local, CGNAT,
    /// multicast, unspecified, documentation, reserved) are accepted (default `false`).
    #[serde(default)]
    pub allow_private: bool,
    /// Whether host names are accepted, or only IP literals (default `true`). Names are
    /// never resolved.
    #[serde(default = "yes")]
    pub allow_hostnames: bool,
    /// Whether `user:pass@` is accepted (default `true`).
    #[serde(default = "yes")]
    pub allow_credentials: bool,
    /// Most members the pool may hold, eligible and ineligible together (default none).
    #[serde(default, deserialize_with = "super::count::optional")]
    pub max_members: Option<u64>,
    /// Whether ids that are not proxy addresses (`dc-fra-07`) are accepted as they are
    /// (default `true`).
    #[serde(default = "yes")]
    pub opaque_ids: bool,
    /// Whether the pool's `sources` may be fetched from non-public addresses, redirects
    /// included (default `false`; shown only when set).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_private_sources: bool,
}

fn default_schemes() -> BTreeSet<Scheme> {
    BTreeSet::from([Scheme::Http, Scheme::Https])
}

fn yes() -> bool {
    true
}

impl Default for Rules {
    fn default() -> Self {
        Self {
            schemes: default_schemes(),
            ports: PortRules::default(),
            allow_private: false,
            allow_hostnames: true,
            allow_credentials: true,
            max_members: None,
            opaque_ids: true,
            allow_private_sources: false,
        }
    }
}

/// Ports a pool accepts: in one of the `allow` ranges and in none of the `deny` ones.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortRules {
    /// Allowed ranges (default `[[1, 65535]]`).
    #[serde(default = "every_port")]
    pub allow: Vec<PortRange>,
    /// Denied ports or ranges, applied after `allow` (default none).
    #[serde(default)]
    pub deny: Vec<PortRange>,
}

fn every_port() -> Vec<PortRange> {
    vec![PortRange {
        first: 1,
        last: u16::MAX,
    }]
}

impl Default for PortRules {
    fn default() -> Self {
        Self {
            allow: every_port(),
            deny: Vec::new(),
        }
    }
}

impl PortRules {
    /// Whether `port` is allowed and not denied.
    pub fn admits(&self, port: u16) -> bool {
        self.allow.iter().any(|range| range.contains(port))
            && !self.deny.iter().any(|range| range.contains(port))
    }
}

/// An inclusive port range. In JSON, `[first, last]` or a single port number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawPortRange", into = "RawPortRange")]
pub struct PortRange {
    first: u16,
    last: u16,
}

impl PortRange {
    /// The range `first..=last`, when `1 <= first <= last`.
    pub fn new(first: u16, last: u16) -> Option<Self> {
        (1 <= first && first <= last).then_some(Self { first, last })
    }

    /// Whether `port` is in the range.
    pub fn contains(self, port: u16) -> bool {
        (self.first..=self.last).contains(&port)
    }
}

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum RawPortRange {
    One(u16),
    Span([u16; 2]),
}

impl TryFrom<RawPortRange> for PortRange {
    type Error = &'static str;

    fn try_from(raw: RawPortRange) -> Result<Self, Self::Error> {
        let (first, last) = match raw {
            RawPortRange::One(port) => (port, port),
            // The two ends name the same set of ports in either order.
            RawPortRange::Span([a, b]) => (a.min(b), a.max(b)),
        };
        Self::new(first, last).ok_or("a port range is [first, last] of ports from 1 to 65535")
    }
}

impl From<PortRange> for RawPortRange {
    fn from(range: PortRange) -> Self {
        if range.first == range.last {
            Self::One(range.first)
        } else {
            Self::Span([range.first, range.last])
        }
    }
}

impl Rules {
    /// Applies the rules to a parsed candidate. When several rules refuse it, the first in
    /// this order is reported: scheme, credentials, host name, private address, port.
    ///
    /// # Errors
    /// The [`Rejection`] of the first rule the candidate breaks.
    pub fn check(&self, candidate: &Candidate) -> Result<(), Rejection> {
        let is_name = matches!(candidate.host(), Host::Name(_));
        if !self.schemes.contains(&candidate.scheme()) {
            Err(Rejection::SchemeNotAllowed)
        } else if candidate.has_credentials() && !self.allow_credentials {
            Err(Rejection::CredentialsNotAllowed)
        } else if is_name && !self.allow_hostnames {
            Err(Rejection::HostnameNotAllowed)
        } else if candidate.host().is_non_public() && !self.allow_private {
            Err(Rejection::PrivateAddress)
        } else if !self.ports.admits(candidate.port()) {
            Err(Rejection::PortNotAllowed)
        } else {
            Ok(())
        }
    }

    /// Parses one line of a list and applies the rules: the member id it would be stored
    /// under.
    ///
    /// # Errors
    /// Why the line is not accepted.
    pub fn admit_line(&self, line: &str, default_scheme: Scheme) -> Result<MemberId, Rejection> {
        let candidate = Candidate::parse(line, default_scheme)?;
        self.check(&candidate)?;
        Ok(candidate.into_member_id())
    }

    /// Applies the rules to a member id given to `POST /pools/{pool}/members`: a proxy
    /// address is checked and canonicalised exactly as an imported line (with `http` when
    /// it names no scheme); an opaque id is kept as it is when `opaque_ids` allows it.
    ///
    /// # Errors
    /// Why the member is not accepted ([`Rejection::Unparsable`] for an opaque id in a
    /// pool that takes only addresses).
    pub fn admit_member(&self, id: MemberId) -> Result<MemberId, Rejection> {
        if looks_like_address(id.as_str()) {
            self.admit_line(id.as_str(), Scheme::Http)
        } else if self.opaque_ids {
            Ok(id)
        } else {
            Err(Rejection::Unparsable)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strict() -> Rules {
        Rules {
            schemes: BTreeSet::from([Scheme::Socks5]),
            ports: PortRules {
                allow: vec![PortRange::new(1000, 2000).expect("a range")],
                deny: vec![PortRange::new(1080, 1080).expect("a port")],
            },
            allow_private: false,
            allow_hostnames: false,
            allow_credentials: false,
            max_members: Some(3),
            opaque_ids: false,
            allow_private_sources: false,
        }
    }

    fn admitted(rules: &Rules, line: &str, scheme: Scheme) -> Result<String, Rejection> {
        rules
            .admit_line(line, scheme)
            .map(|id| id.as_str().to_owned())
    }

    #[test]
    fn the_defaults_are_the_documented_ones() {
        let parsed: Rules = serde_json::from_str("{}").expect("valid");
        assert_eq!(parsed, Rules::default());
        assert_eq!(
            serde_json::to_value(&parsed).expect("serialises"),
            serde_json::json!({
                "schemes": ["http", "https"],
                "ports": {"allow": [[1, 65535]], "deny": []},
                "allow_private": false,
                "allow_hostnames": true,
                "allow_credentials": true,
                "max_members": null,
                "opaque_ids": true,
            })
        );
    }

    #[test]
    fn port_ranges_read_pairs_and_single_ports_and_refuse_the_rest() {
        let ports: PortRules =
            serde_json::from_str(r#"{"allow": [[80, 90], 3128], "deny": [85]}"#).expect("valid");
        assert!(ports.admits(80) && ports.admits(90) && ports.admits(3128));
        assert!(!ports.admits(79) && !ports.admits(85) && !ports.admits(91));
        assert_eq!(
            serde_json::to_string(&ports).expect("serialises"),
            r#"{"allow":[[80,90],3128],"deny":[85]}"#
        );
        for bad in [
            r#"{"allow": [[0, 10]]}"#,
            r#"{"allow": [65536]}"#,
            r#"{"allow": [[1, 2, 3]]}"#,
            r#"{"deny": ["80"]}"#,
            r#"{"other": []}"#,
        ] {
            assert!(serde_json::from_str::<PortRules>(bad).is_err(), "{bad}");
        }
        let reversed: PortRules =
            serde_json::from_str(r#"{"allow": [[90, 80]]}"#).expect("either order");
        assert!(reversed.admits(80) && reversed.admits(85) && reversed.admits(90));
        assert!(serde_json::from_str::<Rules>(r#"{"schemes": ["ftp"]}"#).is_err());
        assert!(serde_json::from_str::<Rules>(r#"{"allow_privat": true}"#).is_err());
    }

    #[test]
    fn every_rule_rejects_with_its_own_reason() {
        let rules = Rules::default();
        for (line, expected) in [
            ("1.2.3.4:8080", Ok("http://1.2.3.4:8080")),
            (
                "https://u:p@proxy.example:443",
                Ok("https://u:p@proxy.example:443"),
            ),
            ("socks5://1.2.3.4:1080", Err(Rejection::SchemeNotAllowed)),
            ("10.0.0.5:80", Err(Rejection::PrivateAddress)),
            ("127.0.0.1:6379", Err(Rejection::PrivateAddress)),
            ("[::1]:80", Err(Rejection::PrivateAddress)),
            ("[::ffff:192.168.1.1]:80", Err(Rejection::PrivateAddress)),
            ("localhost:3128", Err(Rejection::PrivateAddress)),
            ("172.15.255.255:80", Ok("http://172.15.255.255:80")),
            ("172.16.0.0:80", Err(Rejection::PrivateAddress)),
            ("100.63.255.255:80", Ok("http://100.63.255.255:80")),
            ("100.64.0.0:80", Err(Rejection::PrivateAddress)),
        ] {
            assert_eq!(
                admitted(&rules, line, Scheme::Http),
                expected.map(str::to_owned),
                "{line}"
            );
        }
        let strict = strict();
        for (line, expected) in [
            ("socks5://1.2.3.4:1500", Ok("socks5://1.2.3.4:1500")),
            ("1.2.3.4:1500", Ok("socks5://1.2.3.4:1500")),
            ("http://1.2.3.4:1500", Err(Rejection::SchemeNotAllowed)),
            ("u:p@1.2.3.4:1500", Err(Rejection::CredentialsNotAllowed)),
            ("1.2.3.4:1500:u:p", Err(Rejection::CredentialsNotAllowed)),
            ("proxy.example:1500", Err(Rejection::HostnameNotAllowed)),
            ("10.0.0.1:1500", Err(Rejection::PrivateAddress)),
            ("1.2.3.4:999", Err(Rejection::PortNotAllowed)),
            ("1.2.3.4:2001", Err(Rejection::PortNotAllowed)),
            ("1.2.3.4:1080", Err(Rejection::PortNotAllowed)),
            ("1.2.3.4:0", Err(Rejection::PortNotAllowed)),
            ("1.2.3.4:65536", Err(Rejection::PortNotAllowed)),
            ("not an address", Err(Rejection::Unparsable)),
        ] {
            assert_eq!(
                admitted(&strict, line, Scheme::Socks5),
                expected.map(str::to_owned),
                "{line}"
            );
        }
        let private_ok = Rules {
            allow_private: true,
            ..Rules::default()
        };
        assert_eq!(
            admitted(&private_ok, "127.0.0.1:6379", Scheme::Http),
            Ok("http://127.0.0.1:6379".to_owned())
        );
    }

    #[test]
    fn members_that_are_addresses_follow_the_rules_and_opaque_ids_follow_opaque_ids() {
        let id = |text: &str| MemberId::parse(text).expect("a member id");
        let rules = Rules::default();
        assert_eq!(rules.admit_member(id("dc-fra-07")), Ok(id("dc-fra-07")));
        assert_eq!(
            rules.admit_member(id("HTTP://1.2.3.4:8080/")),
            Ok(id("http://1.2.3.4:8080"))
        );
        assert_eq!(
            rules.admit_member(id("10.0.0.5")),
            Err(Rejection::Unparsable)
        );
        assert_eq!(
            rules.admit_member(id("10.0.0.5:80")),
            Err(Rejection::PrivateAddress)
        );
        let strict = strict();
        assert_eq!(
            strict.admit_member(id("dc-fra-07")),
            Err(Rejection::Unparsable)
        );
    }
}
