//! `Timestamp`: a point in time as the stores keep it (Unix milliseconds, read from the
//! store's own clock), shown to clients as RFC 3339.

use serde::{Serialize, Serializer};
use time::OffsetDateTime;

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

    /// RFC 3339 text in UTC with exactly three fractional digits (`…:20.120Z`, never
    /// `…:20.12Z`): every timestamp of the API has the same width, so they also compare in
    /// time order as text.
    pub fn to_rfc3339(self) -> String {
        let nanos = i128::from(self.0) * 1_000_000;
        OffsetDateTime::from_unix_timestamp_nanos(nanos)
            .map(|t| {
                format!(
                    "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
                    t.year(),
                    u8::from(t.month()),
                    t.day(),
                    t.hour(),
                    t.minute(),
                    t.second(),
                    t.millisecond()
                )
            })
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
    fn renders_as_rfc3339_in_utc_with_three_fractional_digits_always() {
        for (millis, text) in [
            (1_700_000_000_123, "2023-11-14T22:13:20.123Z"),
            (1_700_000_000_120, "2023-11-14T22:13:20.120Z"),
            (1_700_000_000_100, "2023-11-14T22:13:20.100Z"),
            (1_700_000_000_000, "2023-11-14T22:13:20.000Z"),
            (1_700_000_000_007, "2023-11-14T22:13:20.007Z"),
            (0, "1970-01-01T00:00:00.000Z"),
        ] {
            assert_eq!(Timestamp(millis).to_rfc3339(), text);
            // What clients parse back is the same instant.
            let parsed =
                OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
                    .expect("RFC 3339");
            assert_eq!(
                parsed.unix_timestamp_nanos(),
                i128::from(millis) * 1_000_000
            );
        }
    }
}
