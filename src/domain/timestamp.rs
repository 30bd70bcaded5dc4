//! `Timestamp`: a point in time as the stores keep it (Unix milliseconds, read from the
//! store's own clock), shown to clients as RFC 3339.

use serde::{Serialize, Serializer};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// Milliseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// The current time of this process's clock. Only the embedded store uses it: the Redis
    /// store reads `TIME` inside its scripts so that replicas never disagree.
    pub fn now() -> Self {
        let nanos = OffsetDateTime::now_utc().unix_timestamp_nanos();
        Self(u64::try_from(nanos / 1_000_000).unwrap_or(0))
    }

    /// RFC 3339 text with millisecond precision, in UTC.
    pub fn to_rfc3339(self) -> String {
        let nanos = i128::from(self.0) * 1_000_000;
        OffsetDateTime::from_unix_timestamp_nanos(nanos)
            .ok()
            .and_then(|t| t.format(&Rfc3339).ok())
            .unwrap_or_default()
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_rfc3339())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_as_rfc3339_in_utc() {
        assert_eq!(
            Timestamp(1_700_000_000_123).to_rfc3339(),
            "2023-11-14T22:13:20.123Z"
        );
        assert_eq!(Timestamp(0).to_rfc3339(), "1970-01-01T00:00:00Z");
    }
}
