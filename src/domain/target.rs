//! `Target`: the host a worker is about to contact through a member, named in assigns and
//! outcome reports so that a site's block applies to that site only.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

/// The longest target accepted, in bytes (the longest DNS name).
pub const MAX_TARGET_LEN: usize = 253;

/// A host name (lower-cased, without its trailing dot) or an IP literal (IPv6 without
/// brackets, in its canonical form), at most [`MAX_TARGET_LEN`] bytes.
///
/// Its text never holds a space, a brace or a control byte, so the Redis store may put it
/// into a key name after the pool's hash tag (see `store/redis/keys.rs`) without escaping.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Target(String);

/// Why a text is not a [`Target`]: answered as 400 `invalid_request` naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{field}: a target is a host name (labels of a-z, 0-9, '-' and '_', at most 253 bytes) \
     or an IP literal, without scheme, port or path"
)]
pub struct InvalidTarget {
    /// The field, as the caller wrote it (`target`, `outcomes[2].target`).
    pub field: String,
}

impl Target {
    /// Parses `text` as the caller wrote it: `Example.COM.` is `example.com`,
    /// `[2001:DB8::1]` is `2001:db8::1`.
    ///
    /// # Errors
    /// [`InvalidTarget`] naming `field` when the text is not a host name or an IP literal.
    pub fn parse(field: &str, text: &str) -> Result<Self, InvalidTarget> {
        let invalid = || InvalidTarget {
            field: field.to_owned(),
        };
        let text = text.strip_suffix('.').unwrap_or(text);
        if text.is_empty() || text.len() > MAX_TARGET_LEN {
            return Err(invalid());
        }
        let unbracketed = text
            .strip_prefix('[')
            .and_then(|t| t.strip_suffix(']'))
            .unwrap_or(text);
        if unbracketed.contains(':') {
            return unbracketed
                .parse::<Ipv6Addr>()
                .map(|v6| Self(v6.to_string()))
                .map_err(|_| invalid());
        }
        if let Ok(v4) = text.parse::<Ipv4Addr>() {
            return Ok(Self(v4.to_string()));
        }
        // Unlike a member's host, a target is never dialled by the service, only named in
        // bans and pacing: a name whose last label is a number (`127.1`) is kept as the
        // name it is rather than refused as another notation of an address. So the set of
        // targets is exactly what the contract's pattern describes.
        let name = text.to_ascii_lowercase();
        if super::candidate::is_dns_name(&name) {
            Ok(Self(name))
        } else {
            Err(invalid())
        }
    }

    /// Parses a JSON value, which must be a string (see [`Target::parse`]).
    ///
    /// # Errors
    /// [`InvalidTarget`] naming `field` for anything else.
    pub fn from_json(field: &str, value: &serde_json::Value) -> Result<Self, InvalidTarget> {
        match value {
            serde_json::Value::String(text) => Self::parse(field, text),
            _ => Err(InvalidTarget {
                field: field.to_owned(),
            }),
        }
    }

    /// The canonical text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A target read back from a store, which only ever holds parsed ones.
    pub fn from_stored(text: String) -> Self {
        Self(text)
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl serde::Serialize for Target {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Result<String, InvalidTarget> {
        Target::parse("target", text).map(|t| t.as_str().to_owned())
    }

    #[test]
    fn host_names_are_lower_cased_and_lose_their_trailing_dot() {
        assert_eq!(parsed("Example.COM."), Ok("example.com".to_owned()));
        assert_eq!(
            parsed("shop_1.example-site.de"),
            Ok("shop_1.example-site.de".to_owned())
        );
        assert_eq!(parsed("localhost"), Ok("localhost".to_owned()));
        // Never dialled, so not read as another notation of an address: a name as written.
        assert_eq!(parsed("127.1"), Ok("127.1".to_owned()));
        assert_eq!(parsed("0"), Ok("0".to_owned()));
    }

    #[test]
    fn ip_literals_are_written_in_their_canonical_form() {
        assert_eq!(parsed("192.0.2.7"), Ok("192.0.2.7".to_owned()));
        assert_eq!(parsed("2001:DB8:0::1"), Ok("2001:db8::1".to_owned()));
        assert_eq!(parsed("[2001:db8::1]"), Ok("2001:db8::1".to_owned()));
    }

    #[test]
    fn a_name_of_253_bytes_is_a_target_and_one_of_254_is_not() {
        let label = "a".repeat(63);
        let longest = format!("{label}.{label}.{label}.{}", "b".repeat(61));
        assert_eq!(longest.len(), 253);
        assert_eq!(parsed(&longest), Ok(longest.clone()));
        assert_eq!(parsed(&format!("{longest}.")), Ok(longest.clone()));
        let field = "outcomes[1].target".to_owned();
        assert_eq!(
            Target::parse(&field, &format!("c{longest}")),
            Err(InvalidTarget { field })
        );
    }

    #[test]
    fn urls_ports_paths_spaces_and_empty_labels_are_refused() {
        for text in [
            "",
            ".",
            "https://example.com",
            "example.com:443",
            "example.com/path",
            "exa mple.com",
            "example..com",
            "-example.com",
            "{pool}.com",
            "exämple.com",
            "exa:mple.com",
            "1.2.3.4:80",
            "[::1",
            ":::",
            "[example.com]",
        ] {
            assert_eq!(
                parsed(text),
                Err(InvalidTarget {
                    field: "target".to_owned()
                }),
                "{text:?}"
            );
        }
    }
}
