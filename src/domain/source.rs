//! `Source`: a proxy list a pool fetches on a schedule (`sources` in its configuration) and
//! imports through its rules, as `POST /pools/{pool}/import` does.

use std::collections::HashSet;

use serde::{Deserialize, Deserializer, Serialize};

use super::candidate::Scheme;
use super::health::is_target_url;

/// Most sources one pool may have.
pub const MAX_SOURCES: usize = 16;

/// The shortest `interval_ms` a source may have unless the operator lowers it
/// (`SOURCE_MIN_INTERVAL_MS`): public lists change slowly and their hosts should not be
/// hammered.
pub const DEFAULT_SOURCE_MIN_INTERVAL_MS: u64 = 60_000;

/// The lowest minimum an operator may set, and so the shortest interval the domain accepts
/// at all; the stored configuration is read back with this bound, not the operator's, so
/// that lowering or raising the option never makes a stored pool unreadable.
pub const SOURCE_INTERVAL_FLOOR_MS: u64 = 1_000;

/// The longest `interval_ms` of a source: a week.
pub const MAX_SOURCE_INTERVAL_MS: u64 = 7 * 24 * 3_600_000;

/// How a source's list is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceFormat {
    /// One candidate per line, as a `text/plain` import.
    #[default]
    Lines,
    /// A JSON array of strings, as an `application/json` import.
    Json,
}

impl SourceFormat {
    /// The name used in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Lines => "lines",
            Self::Json => "json",
        }
    }
}

/// One list a pool fetches every `interval_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "super::object::Object<RawSource>")]
pub struct Source {
    /// The `http://` or `https://` URL of the list (at most 2,048 bytes). It must resolve to
    /// a public address unless the pool's `rules.allow_private_sources` is set.
    pub url: String,
    /// Time between fetches, in milliseconds (at least `SOURCE_MIN_INTERVAL_MS`, by default
    /// 60,000; at most a week).
    pub interval_ms: u64,
    /// How the list is written (default `lines`).
    pub format: SourceFormat,
    /// Scheme of the lines that name none (default `http`).
    pub default_scheme: Scheme,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSource {
    url: String,
    interval_ms: u64,
    #[serde(default)]
    format: SourceFormat,
    #[serde(default)]
    default_scheme: Scheme,
}

/// Why a source was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidSource(&'static str);

impl TryFrom<super::object::Object<RawSource>> for Source {
    type Error = InvalidSource;

    fn try_from(
        super::object::Object(raw): super::object::Object<RawSource>,
    ) -> Result<Self, InvalidSource> {
        if !is_target_url(&raw.url) {
            return Err(InvalidSource(
                "sources[].url is an http:// or https:// URL with a host, of at most 2048 bytes",
            ));
        }
        if !(SOURCE_INTERVAL_FLOOR_MS..=MAX_SOURCE_INTERVAL_MS).contains(&raw.interval_ms) {
            return Err(InvalidSource(
                "sources[].interval_ms is 1000 to 604800000 (and at least the service's SOURCE_MIN_INTERVAL_MS)",
            ));
        }
        Ok(Self {
            url: raw.url,
            interval_ms: raw.interval_ms,
            format: raw.format,
            default_scheme: raw.default_scheme,
        })
    }
}

/// Reads a pool's `sources`: at most [`MAX_SOURCES`], each URL once (a source's schedule
/// and last fetch are kept by its URL).
///
/// # Errors
/// When there are more than [`MAX_SOURCES`] or a URL repeats.
pub fn sources<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<Source>, D::Error> {
    let sources = Vec::<Source>::deserialize(deserializer)?;
    if sources.len() > MAX_SOURCES {
        return Err(serde::de::Error::custom(format!(
            "a pool has at most {MAX_SOURCES} sources"
        )));
    }
    let mut urls = HashSet::new();
    if !sources
        .iter()
        .all(|source| urls.insert(source.url.as_str()))
    {
        return Err(serde::de::Error::custom(
            "each source url appears once in a pool",
        ));
    }
    Ok(sources)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    struct Holder {
        #[serde(deserialize_with = "sources")]
        sources: Vec<Source>,
    }

    fn parse(json: serde_json::Value) -> Result<Vec<Source>, String> {
        serde_json::from_value::<Holder>(json!({ "sources": json }))
            .map(|holder| holder.sources)
            .map_err(|error| error.to_string())
    }

    use serde_json::json;

    #[test]
    fn a_source_takes_lines_and_http_by_default() {
        let parsed = parse(json!([{"url": "https://lists.example/p.txt", "interval_ms": 60000}]));
        assert_eq!(
            parsed,
            Ok(vec![Source {
                url: "https://lists.example/p.txt".to_owned(),
                interval_ms: 60_000,
                format: SourceFormat::Lines,
                default_scheme: Scheme::Http,
            }])
        );
    }

    #[test]
    fn bad_urls_intervals_repeats_and_too_many_sources_are_refused() {
        let one = |url: &str, interval: u64| json!({"url": url, "interval_ms": interval});
        assert!(parse(json!([one("ftp://lists.example/p", 60000)])).is_err());
        assert!(parse(json!([["https://lists.example/p", 60000, "lines", "http"]])).is_err());
        assert!(parse(json!([one("https:///p", 60000)])).is_err());
        // Hosts as the API documents them: the URL parser alone would take these.
        assert!(parse(json!([one("https://lists.example*/p", 60000)])).is_err());
        assert!(parse(json!([one("https://under_score.example/p", 60000)])).is_err());
        assert!(parse(json!([one("https://lists.example/p", 999)])).is_err());
        assert!(
            parse(json!([one(
                "https://lists.example/p",
                MAX_SOURCE_INTERVAL_MS + 1
            )]))
            .is_err()
        );
        assert!(
            parse(json!([
                one("https://a.example/p", 60000),
                one("https://a.example/p", 90000)
            ]))
            .is_err()
        );
        let many: Vec<_> = (0..=MAX_SOURCES)
            .map(|i| one(&format!("https://a.example/{i}"), 60000))
            .collect();
        assert!(parse(json!(many)).is_err());
        assert_eq!(
            parse(json!(many[..MAX_SOURCES])).map(|s| s.len()),
            Ok(MAX_SOURCES)
        );
    }
}
