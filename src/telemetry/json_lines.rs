//! The JSON log line, written straight into the line buffer.
//!
//! `tracing-subscriber`'s own JSON format goes through serde for every field and parses
//! each span's fields back from text for every event; on the assign path that was a fifth
//! of the service's own instructions per request. This writer emits the same kind of flat
//! object — `timestamp`, `level`, `target`, the event's fields (`message` among them) and
//! the `request_id` of the request being served, if any — escaping as it goes.
//!
//! Spans are not written: the service opens none; the request id, which a span used to
//! carry, comes from [`super::REQUEST_ID`].

use std::fmt::{self, Write};

use time::OffsetDateTime;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Formats every event as one JSON object on one line.
pub(super) struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        writer.write_str("{\"timestamp\":\"")?;
        timestamp(&mut writer, OffsetDateTime::now_utc())?;
        writer.write_str("\",\"level\":\"")?;
        writer.write_str(meta.level().as_str())?;
        writer.write_str("\",\"target\":")?;
        string(&mut writer, meta.target())?;
        let mut fields = Fields {
            out: &mut writer,
            result: Ok(()),
        };
        event.record(&mut fields);
        fields.result?;
        super::REQUEST_ID
            .try_with(|id| {
                writer.write_str(",\"request_id\":")?;
                string(&mut writer, id.to_str().unwrap_or_default())
            })
            .unwrap_or(Ok(()))?;
        writer.write_str("}\n")
    }
}

/// Appends `,"name":value` for every field of an event.
struct Fields<'a, W> {
    out: &'a mut W,
    result: fmt::Result,
}

impl<W: Write> Fields<'_, W> {
    fn field(&mut self, field: &Field, value: impl FnOnce(&mut W) -> fmt::Result) {
        if self.result.is_ok() {
            self.result = self
                .out
                .write_char(',')
                .and_then(|()| string(self.out, field.name()))
                .and_then(|()| self.out.write_char(':'))
                .and_then(|()| value(self.out));
        }
    }
}

impl<W: Write> Visit for Fields<'_, W> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.field(field, |out| string(out, value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.field(field, |out| write!(out, "{value}"));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.field(field, |out| write!(out, "{value}"));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        // JSON has no NaN or infinity.
        if value.is_finite() {
            self.field(field, |out| write!(out, "{value}"));
        } else {
            self.field(field, |out| out.write_str("null"));
        }
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.field(field, |out| write!(out, "{value}"));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.field(field, |out| {
            out.write_char('"')?;
            write!(Escaped(&mut *out), "{value}")?;
            out.write_char('"')
        });
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.field(field, |out| {
            out.write_char('"')?;
            write!(Escaped(&mut *out), "{value:?}")?;
            out.write_char('"')
        });
    }
}

/// A JSON string: quoted and escaped.
fn string(out: &mut impl Write, text: &str) -> fmt::Result {
    out.write_char('"')?;
    Escaped(&mut *out).write_str(text)?;
    out.write_char('"')
}

/// Writes what it is given as the inside of a JSON string.
struct Escaped<W>(W);

impl<W: Write> Write for Escaped<W> {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        // Almost every text needs no escape at all: one quick scan, one write.
        if !text.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') {
            return self.0.write_str(text);
        }
        let mut clean = 0;
        for (at, byte) in text.bytes().enumerate() {
            let escape = match byte {
                b'"' => "\\\"",
                b'\\' => "\\\\",
                b'\n' => "\\n",
                b'\r' => "\\r",
                b'\t' => "\\t",
                0..=0x1f => "",
                _ => continue,
            };
            self.0.write_str(&text[clean..at])?;
            if escape.is_empty() {
                write!(self.0, "\\u{byte:04x}")?;
            } else {
                self.0.write_str(escape)?;
            }
            clean = at + 1;
        }
        self.0.write_str(&text[clean..])
    }
}

/// RFC 3339 in UTC with microseconds: `2026-11-30T12:34:56.789012Z`.
fn timestamp(out: &mut impl Write, at: OffsetDateTime) -> fmt::Result {
    let mut text = *b"0000-00-00T00:00:00.000000Z";
    let mut put = |from: usize, digits: usize, value: u32| {
        let mut value = value;
        for slot in text[from..from + digits].iter_mut().rev() {
            *slot = b'0' + u8::try_from(value % 10).unwrap_or(0);
            value /= 10;
        }
    };
    put(0, 4, u32::try_from(at.year()).unwrap_or(0));
    put(5, 2, u32::from(u8::from(at.month())));
    put(8, 2, u32::from(at.day()));
    put(11, 2, u32::from(at.hour()));
    put(14, 2, u32::from(at.minute()));
    put(17, 2, u32::from(at.second()));
    put(20, 6, at.microsecond());
    // Only ASCII digits and separators were written.
    out.write_str(std::str::from_utf8(&text).map_err(|_| fmt::Error)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn escaped(text: &str) -> String {
        let mut out = String::new();
        string(&mut out, text).expect("writing to a String");
        out
    }

    #[test]
    fn strings_are_quoted_with_quotes_backslashes_and_control_characters_escaped() {
        assert_eq!(escaped("plain"), r#""plain""#);
        assert_eq!(escaped("a\"b\\c"), r#""a\"b\\c""#);
        assert_eq!(escaped("line\nnext\ttab\r"), r#""line\nnext\ttab\r""#);
        assert_eq!(escaped("bell\u{7}"), r#""bell\u0007""#);
        assert_eq!(escaped("ünïcode ✓"), "\"ünïcode ✓\"");
    }

    #[test]
    fn escaped_strings_parse_back_as_json_to_the_same_text() {
        let text = "\"quoted\" \\ \u{1}\u{1f} \n é";
        let parsed: String = serde_json::from_str(&escaped(text)).expect("valid JSON");
        assert_eq!(parsed, text);
    }

    #[test]
    fn timestamps_are_rfc_3339_utc_with_microseconds() {
        let at = OffsetDateTime::from_unix_timestamp_nanos(1_796_031_296_007_008_999)
            .expect("a valid time");
        let mut out = String::new();
        timestamp(&mut out, at).expect("writing to a String");
        assert_eq!(out, "2026-11-30T09:34:56.007008Z");
    }
}
