//! An address network written as an address or `address/prefix` (`10.0.0.0/8`,
//! `2001:db8::/32`, `192.0.2.7`), as `TRUSTED_CLIENT_NETWORKS` lists them.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// A network of addresses: every address whose first `prefix` bits are those of `base`.
/// An IPv4 network also holds the IPv4-mapped IPv6 forms of its addresses, which is how a
/// dual-stack socket reports an IPv4 client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Network {
    base: IpAddr,
    prefix: u8,
}

/// Why a network did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an address or address/prefix (e.g. 10.0.0.0/8, 2001:db8::/32)")]
pub struct InvalidNetwork(String);

impl Network {
    /// Parses `192.0.2.7`, `10.0.0.0/8`, `2001:db8::/32`. The base may have bits set past
    /// the prefix (`10.1.2.3/8` is `10.0.0.0/8`), as routing tables take it.
    ///
    /// # Errors
    /// [`InvalidNetwork`] when the address does not parse or the prefix is longer than the
    /// address (32 bits, 128 for IPv6).
    pub fn parse(text: &str) -> Result<Self, InvalidNetwork> {
        let invalid = || InvalidNetwork(text.to_owned());
        let (address, prefix) = match text.trim().split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text.trim(), None),
        };
        let base = IpAddr::from_str(address)
            .map_err(|_| invalid())?
            .to_canonical();
        let bits = if base.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(prefix) => prefix
                .parse::<u8>()
                .ok()
                .filter(|prefix| *prefix <= bits)
                .ok_or_else(invalid)?,
            None => bits,
        };
        Ok(Self { base, prefix })
    }

    /// Whether `address` is in the network.
    pub fn contains(&self, address: IpAddr) -> bool {
        match (self.base, address.to_canonical()) {
            (IpAddr::V4(base), IpAddr::V4(address)) => same_prefix(
                u32::from(base).into(),
                u32::from(address).into(),
                32,
                self.prefix,
            ),
            (IpAddr::V6(base), IpAddr::V6(address)) => {
                same_prefix(u128::from(base), u128::from(address), 128, self.prefix)
            }
            _ => false,
        }
    }
}

/// Whether the first `prefix` of the `bits` low bits of `a` and `b` agree.
fn same_prefix(a: u128, b: u128, bits: u8, prefix: u8) -> bool {
    let shift = u32::from(bits - prefix);
    // A shift by the whole width would overflow: a prefix of 0 holds everything.
    a.checked_shr(shift).unwrap_or(0) == b.checked_shr(shift).unwrap_or(0)
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.base, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("an address")
    }

    #[test]
    fn a_network_holds_the_addresses_that_share_its_prefix() {
        let ten = Network::parse("10.0.0.0/8").expect("parses");
        assert!(ten.contains(ip("10.255.1.2")));
        assert!(ten.contains(ip("::ffff:10.1.2.3")), "IPv4-mapped");
        assert!(!ten.contains(ip("11.0.0.1")));
        assert!(
            !ten.contains(ip("::a00:1")),
            "an IPv6 address is not in an IPv4 network"
        );
        let v6 = Network::parse("2001:db8::/32").expect("parses");
        assert!(v6.contains(ip("2001:db8:ffff::1")));
        assert!(!v6.contains(ip("2001:db9::1")));
        let one = Network::parse(" 192.0.2.7 ").expect("parses");
        assert!(one.contains(ip("192.0.2.7")));
        assert!(!one.contains(ip("192.0.2.8")));
        let all = Network::parse("0.0.0.0/0").expect("parses");
        assert!(all.contains(ip("203.0.113.9")));
        assert_eq!(
            Network::parse("10.1.2.3/8").expect("parses").to_string(),
            "10.1.2.3/8"
        );
    }

    #[test]
    fn a_bad_address_or_a_prefix_past_the_address_is_refused() {
        for text in [
            "",
            "10.0.0",
            "10.0.0.0/33",
            "::/129",
            "10.0.0.0/",
            "10.0.0.0/x",
            "host",
        ] {
            assert_eq!(
                Network::parse(text),
                Err(InvalidNetwork(text.to_owned())),
                "{text:?}"
            );
        }
    }
}
