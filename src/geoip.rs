//! The GeoIP file (`GEOIP_DB`): a MaxMind-format database on local disk (GeoLite2 or
//! GeoIP2 Country, City or ASN) that gives members the labels `geo_country`, `geo_asn` and
//! `geo_org`. Nothing here ever asks the network: lookups read the file only.
//!
//! The file is read into memory with the `maxminddb` crate rather than memory-mapped:
//! mapping a file is `unsafe` (another process truncating or rewriting it in place would
//! change memory under the reader, or crash it), and this crate forbids `unsafe`. Reading
//! costs the file's size in memory (about 9 MB for GeoLite2-Country, 10 MB for ASN, 60 MB
//! for City) and makes a replaced file harmless: the old database stays in use until the
//! new one has been read whole and accepted.
//!
//! [`GeoIp::watch`] looks at the file's modification time and size every
//! `GEOIP_RELOAD_MS` (5 s by default) and reads it again when either changed. A file that
//! cannot be read or is not a valid database is logged once per version of the file;
//! until a valid one is read members get no labels from it, and after a valid one the
//! last valid database stays in use.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use serde::Deserialize;

use crate::domain::{Labels, MAX_LABEL_VALUE_LEN, MemberId};

/// The label keys the file gives.
pub const GEO_COUNTRY: &str = "geo_country";
/// The autonomous system number, in decimal digits.
pub const GEO_ASN: &str = "geo_asn";
/// The autonomous system's organisation, made a label value (see [`org_value`]).
pub const GEO_ORG: &str = "geo_org";

/// A handle on the GeoIP file, shared by the import, the sources and the checks; cloning
/// is shallow. Without a file ([`GeoIp::none`]) every lookup answers `None`.
#[derive(Clone, Default)]
pub struct GeoIp {
    inner: Option<Arc<Watched>>,
}

impl std::fmt::Debug for GeoIp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner {
            Some(watched) => write!(f, "GeoIp({})", watched.path.display()),
            None => f.write_str("GeoIp(none)"),
        }
    }
}

/// The file, what was last read from it, and which version of it was last looked at.
struct Watched {
    path: PathBuf,
    db: RwLock<Option<Arc<maxminddb::Reader<Vec<u8>>>>>,
    /// The version last read or refused: a change of either is a new version.
    seen: Mutex<Option<Version>>,
}

/// A version of the file: its modification time and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Version {
    modified: Option<SystemTime>,
    len: u64,
}

/// What one record of the file holds that the labels need; other fields are skipped.
#[derive(Deserialize)]
struct Record<'a> {
    #[serde(borrow, default)]
    country: Option<Country<'a>>,
    #[serde(borrow, default)]
    registered_country: Option<Country<'a>>,
    /// A uint32 in GeoLite2-ASN, and the decoder reads each width only as itself.
    #[serde(default)]
    autonomous_system_number: Option<u32>,
    #[serde(borrow, default)]
    autonomous_system_organization: Option<&'a str>,
}

#[derive(Deserialize)]
struct Country<'a> {
    #[serde(borrow, default)]
    iso_code: Option<&'a str>,
}

impl GeoIp {
    /// No file: members get no labels from one.
    pub fn none() -> Self {
        Self::default()
    }

    /// Reads the file at `path`. A file that cannot be read, or is not a valid database,
    /// is logged (once) and leaves members without labels from it until [`GeoIp::watch`]
    /// finds a valid one: the service starts either way.
    pub fn open(path: &Path) -> Self {
        let watched = Arc::new(Watched {
            path: path.to_owned(),
            db: RwLock::new(None),
            seen: Mutex::new(None),
        });
        watched.reload_if_changed();
        Self {
            inner: Some(watched),
        }
    }

    /// Whether a database is in use.
    pub fn is_loaded(&self) -> bool {
        self.database().is_some()
    }

    fn database(&self) -> Option<Arc<maxminddb::Reader<Vec<u8>>>> {
        let watched = self.inner.as_ref()?;
        watched
            .db
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The labels the file gives `ip`: `None` when no database is in use (nothing to say
    /// about any address), empty labels when the database does not list it.
    pub fn lookup(&self, ip: IpAddr) -> Option<Labels> {
        let db = self.database()?;
        Some(labels_of(&db, ip))
    }

    /// The labels the file gives a member's own address, when its id names an IP literal
    /// (`http://203.0.113.7:8080`): what it has before a check sees its exit address.
    /// `None` without a database or for a member whose host is a name or absent.
    pub fn lookup_member(&self, member: &MemberId) -> Option<Labels> {
        let db = self.database()?;
        let ip = member_ip(member)?;
        Some(labels_of(&db, ip))
    }

    /// Looks at the file every `every` until `stop` completes, and reads it again when its
    /// modification time or size changed. Does nothing without a file.
    pub async fn watch(self, every: Duration, stop: impl std::future::Future<Output = ()>) {
        let Some(watched) = self.inner else {
            return stop.await;
        };
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        tokio::pin!(stop);
        loop {
            tokio::select! {
                () = &mut stop => return,
                _ = ticks.tick() => {}
            }
            let watched = Arc::clone(&watched);
            // Reading a large file blocks: off the runtime's threads.
            let _ = tokio::task::spawn_blocking(move || watched.reload_if_changed()).await;
        }
    }
}

impl Watched {
    /// Reads the file when its version is not the one last looked at.
    fn reload_if_changed(&self) {
        let path = self.path.display().to_string();
        let version = std::fs::metadata(&self.path).map(|meta| Version {
            modified: meta.modified().ok(),
            len: meta.len(),
        });
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let version = match version {
            Ok(version) => version,
            Err(error) => {
                // A missing file is one version (no time, no size): logged once.
                let missing = Version {
                    modified: None,
                    len: 0,
                };
                if *seen != Some(missing) {
                    *seen = Some(missing);
                    tracing::error!(path, %error,
                        "the GeoIP file cannot be read; members get no labels from it until it can");
                }
                return;
            }
        };
        if *seen == Some(version) {
            return;
        }
        *seen = Some(version);
        let loaded = std::fs::read(&self.path)
            .map_err(maxminddb::MaxMindDbError::from)
            .and_then(maxminddb::Reader::from_source)
            .and_then(|reader| {
                // The search tree is checked now, not at the first lookup: a file cut short
                // is refused here, before it replaces a good one.
                reader.lookup(IpAddr::from([0, 0, 0, 0]))?;
                Ok(reader)
            });
        let mut db = self.db.write().unwrap_or_else(PoisonError::into_inner);
        match loaded {
            Ok(reader) => {
                tracing::info!(
                    path,
                    database_type = reader.metadata().database_type.as_str(),
                    replaced = db.is_some(),
                    "GeoIP file read"
                );
                *db = Some(Arc::new(reader));
            }
            Err(error) => tracing::error!(path, %error, kept_previous = db.is_some(),
                "the GeoIP file is not a valid MaxMind database; it is not used"),
        }
    }
}

/// The labels `db` gives `ip` (empty when it lists nothing for it, or its record cannot
/// be read).
fn labels_of(db: &maxminddb::Reader<Vec<u8>>, ip: IpAddr) -> Labels {
    let Ok(Some(record)) = db.lookup(ip).and_then(|found| found.decode::<Record<'_>>()) else {
        return Labels::default();
    };
    let country = record
        .country
        .and_then(|c| c.iso_code)
        .or_else(|| record.registered_country.and_then(|c| c.iso_code))
        .map(str::to_ascii_lowercase);
    Labels::from_geo(
        [
            (GEO_COUNTRY, country),
            (
                GEO_ASN,
                record.autonomous_system_number.map(|n| n.to_string()),
            ),
            (
                GEO_ORG,
                record.autonomous_system_organization.and_then(org_value),
            ),
        ]
        .into_iter()
        .filter_map(|(key, value)| Some((key, value?))),
    )
}

/// An organisation's name as a label value: each run of characters a value cannot hold
/// (spaces, commas, non-ASCII) becomes one `_`, without one at either end, cut to 64
/// bytes: `Deutsche Telekom AG` gives `Deutsche_Telekom_AG`. `None` when nothing is left.
pub fn org_value(name: &str) -> Option<String> {
    let mut value = String::with_capacity(name.len().min(MAX_LABEL_VALUE_LEN));
    let mut gap = false;
    for c in name.chars() {
        if c.is_ascii_alphanumeric() || matches!(c, '.' | ':' | '-') {
            if gap && !value.is_empty() {
                value.push('_');
            }
            gap = false;
            value.push(c);
        } else {
            gap = true;
        }
        if value.len() >= MAX_LABEL_VALUE_LEN {
            break;
        }
    }
    value.truncate(MAX_LABEL_VALUE_LEN);
    let value = value.trim_end_matches('_').to_owned();
    (!value.is_empty()).then_some(value)
}

/// The IP literal a member's id names as its host, if any: `[scheme://][userinfo@]host:port`
/// as the pools keep ids (canonical, see [`crate::domain::canonical_member_id`]), read
/// without building the canonical form again, which would cost more than the lookup.
fn member_ip(member: &MemberId) -> Option<IpAddr> {
    let text = member.as_str();
    let rest = text.split_once("://").map_or(text, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next()?;
    let host_port = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let host = match host_port.strip_prefix('[') {
        Some(bracketed) => {
            let (host, after) = bracketed.split_once(']')?;
            if !(after.is_empty() || after.starts_with(':')) {
                return None;
            }
            host
        }
        None => host_port
            .rsplit_once(':')
            .map_or(host_port, |(host, _)| host),
    };
    host.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_organisation_becomes_a_label_value() {
        assert_eq!(
            org_value("Deutsche Telekom AG").as_deref(),
            Some("Deutsche_Telekom_AG")
        );
        assert_eq!(
            org_value("  Hetzner Online GmbH, Inc. ").as_deref(),
            Some("Hetzner_Online_GmbH_Inc.")
        );
        assert_eq!(org_value("Ünïcode — Net").as_deref(), Some("n_code_Net"));
        assert_eq!(org_value(" ,;"), None);
        let long = "A".repeat(70);
        assert_eq!(org_value(&long).map(|v| v.len()), Some(64));
    }

    #[test]
    fn only_ip_literals_name_an_address() {
        let ip = |text: &str| member_ip(&MemberId::parse(text).expect("an id"));
        assert_eq!(
            ip("http://user:pw@203.0.113.7:8080"),
            Some(IpAddr::from([203, 0, 113, 7]))
        );
        assert_eq!(
            ip("socks5://[2001:db8::1]:1080"),
            "2001:db8::1".parse().ok()
        );
        assert_eq!(
            ip("203.0.113.8:3128/path?q=1"),
            Some(IpAddr::from([203, 0, 113, 8]))
        );
        assert_eq!(ip("http://proxy.example.com:3128"), None);
        assert_eq!(ip("http://user:p@ss@[::1]x:80"), None);
        assert_eq!(ip("proxy-7"), None);
    }

    #[test]
    fn a_missing_or_broken_file_labels_nothing() {
        let dir = std::env::temp_dir().join(format!("pa-geoip-{:016x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).expect("a directory");
        let broken = dir.join("broken.mmdb");
        std::fs::write(&broken, b"not a database").expect("written");
        for path in [dir.join("missing.mmdb"), broken] {
            let geo = GeoIp::open(&path);
            assert!(!geo.is_loaded());
            assert_eq!(geo.lookup(IpAddr::from([1, 2, 3, 4])), None);
        }
        assert_eq!(GeoIp::none().lookup(IpAddr::from([1, 2, 3, 4])), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
