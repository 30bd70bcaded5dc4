//! The JSON log line, written straight into the line buffer.
//!
//! `tracing-subscriber`'s own JSON format goes through serde for every field and parses
//! each span's fields back from text for every event; on the assign path that was a fifth
//! of the service's own instructions per request. This writer emits the same kind of flat
//! object — `timestamp`, `level`, `target`, the event's fields (`message` among them) and
//! the `request_id` of the request being served, if any — escaping as it goes.
//!
//! Spans are not written: the service opens none; the request id, which a span used to
//! carry, comes from the request being served ([`super::serving_request`]).

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
        // The line is put together in a String of its own and handed over in one piece:
        // `Writer` is a `dyn fmt::Write`, and a line is some forty small writes.
        let mut line = String::with_capacity(320);
        let meta = event.metadata();
        line.push_str("{\"timestamp\":\"");
        timestamp(&mut line, OffsetDateTime::now_utc());
        line.push_str("\",\"level\":\"");
        line.push_str(meta.level().as_str());
        line.push_str("\",\"target\":");
        string(&mut line, meta.target());
        event.record(&mut Fields { line: &mut line });
        super::with_request_id(|id| {
            line.push_str(",\"request_id\":");
            string(&mut line, id.to_str().unwrap_or_default());
        });
        line.push_str("}\n");
        writer.write_str(&line)
    }
}

/// Appends `,"name":value` for every field of an event.
struct Fields<'a> {
    line: &'a mut String,
}

impl Fields<'_> {
    fn name(&mut self, field: &Field) -> &mut String {
        self.line.push(',');
        string(self.line, field.name());
        self.line.push(':');
        self.line
    }
}

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        string(self.name(field), value);
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.name(field).push_str(itoa::Buffer::new().format(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.name(field).push_str(itoa::Buffer::new().format(value));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        let line = self.name(field);
        // JSON has no NaN or infinity.
        if value.is_finite() {
            line.push_str(ryu::Buffer::new().format_finite(value));
        } else {
            line.push_str("null");
        }
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.name(field)
            .push_str(if value { "true" } else { "false" });
    }

    // Errors arrive here too, as their `Display` text (tracing's default `record_error`).
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let line = self.name(field);
        line.push('"');
        // Writing to a String cannot fail.
        let _ = write!(Escaped(&mut *line), "{value:?}");
        line.push('"');
    }
}

/// A JSON string: quoted and escaped.
fn string(line: &mut String, text: &str) {
    line.push('"');
    // Writing to a String cannot fail.
    let _ = Escaped(&mut *line).write_str(text);
    line.push('"');
}

/// Writes what it is given as the inside of a JSON string.
struct Escaped<W>(W);

impl<W: Write> Write for Escaped<W> {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        // Almost every text needs no escape at all: one quick scan, one write. The scan
        // looks at every byte without stopping at the first hit, which the compiler turns
        // into a few wide compares instead of a branch per byte.
        let needs_escape = text.bytes().fold(false, |seen, b| {
            seen | (b < 0x20) | (b == b'"') | (b == b'\\')
        });
        if !needs_escape {
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
fn timestamp(line: &mut String, at: OffsetDateTime) {
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
    line.push_str(std::str::from_utf8(&text).unwrap_or_default());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn escaped(text: &str) -> String {
        let mut out = String::new();
        string(&mut out, text);
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
    fn an_event_is_one_json_object_with_every_kind_of_field_typed() {
        let text = super::super::tests::captured(JsonLines, || {
            tracing::warn!(
                count = 3_u64,
                delta = -2_i64,
                ratio = 0.25_f64,
                missing = f64::NAN,
                ok = true,
                text = "say \"hi\"",
                list = ?[1, 2],
                cause = &std::io::Error::other("disk \"full\"") as &(dyn std::error::Error + 'static),
                "done"
            );
        });
        assert_eq!(text.matches('\n').count(), 1, "{text}");
        let mut line: serde_json::Value = serde_json::from_str(&text).expect("one JSON object");
        assert!(
            line.as_object_mut()
                .expect("object")
                .remove("timestamp")
                .is_some()
        );
        assert_eq!(
            line,
            serde_json::json!({
                "level": "WARN",
                "target": "proxy_allocator::telemetry::json_lines::tests",
                "message": "done",
                "count": 3,
                "delta": -2,
                "ratio": 0.25,
                "missing": null,
                "ok": true,
                "text": "say \"hi\"",
                "list": "[1, 2]",
                "cause": "disk \"full\"",
            })
        );
    }

    #[test]
    fn timestamps_are_rfc_3339_utc_with_microseconds() {
        let at = OffsetDateTime::from_unix_timestamp_nanos(1_796_031_296_007_008_999)
            .expect("a valid time");
        let mut out = String::new();
        timestamp(&mut out, at);
        assert_eq!(out, "2026-11-30T09:34:56.007008Z");
    }
}
