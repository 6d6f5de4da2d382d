//! The JSON line of an access event, written directly. tracing-subscriber's
//! JSON format goes through serde and costs twice the text line
//! (`benches/tracing.rs`); the access log is a line per request, and JSON
//! is what the manifests run. Every other event, and an access event inside
//! a span, goes through the standard format, and both write the same bytes
//! (the tests compare them). The parts are written as serde_json writes
//! them (itoa for integers, zmij for floats) and the timestamp as
//! tracing-subscriber writes it, each without the `fmt` machinery per part
//! (docs/benchmarks.md, "The JSON access line, written by parts").

use std::fmt::{self, Write};
use std::time::UNIX_EPOCH;

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{self, Format, FormatEvent, FormatFields, Json, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::FmtContext;
use tracing_subscriber::registry::LookupSpan;

/// The target of the per-request access-log event.
pub const TARGET: &str = "access";

/// tracing-subscriber's JSON format, with access events written directly.
pub struct JsonWithFastAccess {
    standard: Format<Json, SystemTime>,
}

impl Default for JsonWithFastAccess {
    fn default() -> Self {
        Self {
            standard: format::format().json(),
        }
    }
}

impl<S, N> FormatEvent<S, N> for JsonWithFastAccess
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        // Inside a span the standard line lists the spans too.
        let in_span = event.parent().is_some() || ctx.lookup_current().is_some();
        if meta.target() != TARGET || in_span {
            return self.standard.format_event(ctx, writer, event);
        }
        // Built whole in a buffer of its own, then written once: the
        // writer is reached through `dyn Write`, a call per piece.
        let mut line = String::with_capacity(LINE_CAPACITY);
        line.push_str("{\"timestamp\":\"");
        push_timestamp(&mut line)?;
        line.push_str("\",\"level\":\"");
        line.push_str(meta.level().as_str());
        line.push_str("\",\"fields\":{");
        let mut fields = Fields {
            line: &mut line,
            first: true,
            result: Ok(()),
        };
        event.record(&mut fields);
        fields.result?;
        line.push_str("},\"target\":\"");
        line.push_str(TARGET);
        line.push_str("\"}\n");
        writer.write_str(&line)
    }
}

/// Room for an access line with a long path, so that the buffer is
/// allocated once.
const LINE_CAPACITY: usize = 512;

/// The time now, as tracing-subscriber's `SystemTime` writes it
/// (`2026-12-03T04:05:06.123456Z`), built in one buffer where it can be.
fn push_timestamp(line: &mut String) -> fmt::Result {
    match humantime_form(std::time::SystemTime::now()) {
        Some(timestamp) => write!(line, "{timestamp}"),
        None => SystemTime.format_time(&mut Writer::new(line)),
    }
}

/// humantime's RFC 3339 form with microseconds: the text
/// tracing-subscriber writes, for the years humantime writes (1970 to
/// 9999; before, it would panic, after, fail).
fn humantime_form(time: std::time::SystemTime) -> Option<humantime::Rfc3339Timestamp> {
    /// 10000-01-01T00:00:00Z.
    const YEAR_10000: u64 = 253_402_300_800;
    let since = time.duration_since(UNIX_EPOCH).ok()?;
    (since.as_secs() < YEAR_10000).then(|| humantime::format_rfc3339_micros(time))
}

/// Writes an event's fields as JSON object entries, as tracing-serde does:
/// numbers and booleans as such, a non-finite float as `null`, everything
/// else (`Debug` and `Display` values) as a string.
struct Fields<'a> {
    line: &'a mut String,
    first: bool,
    /// A `Debug` implementation's failure: the line is not written.
    result: fmt::Result,
}

impl Fields<'_> {
    /// Writes `"name":`, after a comma unless it is the first.
    fn name(&mut self, field: &Field) -> &mut String {
        if !self.first {
            self.line.push(',');
        }
        self.first = false;
        push_string(self.line, field.name());
        self.line.push(':');
        self.line
    }
}

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        push_string(self.name(field), value);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let line = self.name(field);
        line.push('"');
        let written = write!(Escaped(line), "{value:?}");
        line.push('"');
        if written.is_err() {
            self.result = written;
        }
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        let mut buffer = zmij::Buffer::new();
        let number = match value.is_finite() {
            true => buffer.format_finite(value),
            false => "null",
        };
        self.name(field).push_str(number);
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.name(field).push_str(itoa::Buffer::new().format(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.name(field).push_str(itoa::Buffer::new().format(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.name(field)
            .push_str(if value { "true" } else { "false" });
    }
}

fn push_string(line: &mut String, value: &str) {
    line.push('"');
    Escaped(line).push(value);
    line.push('"');
}

/// Escapes what passes through as serde_json does inside a string: quote,
/// backslash and control characters; everything else as it is.
struct Escaped<'a>(&'a mut String);

impl Escaped<'_> {
    fn push(&mut self, text: &str) {
        // Almost always nothing to escape: one look at every byte (a loop
        // the compiler vectorises, having no early exit), one copy.
        let escapes = text.bytes().fold(false, |found, b| {
            found | (b < 0x20) | (b == b'"') | (b == b'\\')
        });
        if !escapes {
            return self.0.push_str(text);
        }
        let mut plain = 0;
        for (at, byte) in text.bytes().enumerate() {
            let short = match byte {
                b'"' => Some("\\\""),
                b'\\' => Some("\\\\"),
                b'\n' => Some("\\n"),
                b'\r' => Some("\\r"),
                b'\t' => Some("\\t"),
                0x08 => Some("\\b"),
                0x0c => Some("\\f"),
                0x00..=0x1f => None,
                _ => continue,
            };
            self.0.push_str(&text[plain..at]);
            match short {
                Some(escape) => self.0.push_str(escape),
                // Writing to a `String` cannot fail.
                None => drop(write!(self.0, "\\u{byte:04x}")),
            }
            plain = at + 1;
        }
        self.0.push_str(&text[plain..]);
    }
}

impl Write for Escaped<'_> {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        self.push(text);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Collects what a subscriber writes.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The line `emit` logs, through the standard JSON format and through
    /// this one, timestamps blanked.
    fn both(emit: impl Fn()) -> (String, String) {
        let line = |fast: bool| {
            let captured = Captured::default();
            let sink = captured.clone();
            let builder = tracing_subscriber::fmt()
                .with_ansi(false)
                .with_writer(move || sink.clone())
                .json();
            match fast {
                true => tracing::subscriber::with_default(
                    builder.event_format(JsonWithFastAccess::default()).finish(),
                    &emit,
                ),
                false => tracing::subscriber::with_default(builder.finish(), &emit),
            }
            let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
            let value: serde_json::Value = serde_json::from_str(&text).unwrap();
            let timestamp = value["timestamp"].as_str().unwrap().to_owned();
            assert!(
                timestamp.ends_with('Z') && timestamp.len() == 27,
                "{timestamp}"
            );
            text.replace(&timestamp, "T")
        };
        (line(false), line(true))
    }

    #[test]
    fn an_access_line_is_the_standard_line_byte_for_byte() {
        let peer: std::net::IpAddr = "10.1.2.3".parse().unwrap();
        for (path, duration) in [
            ("/loki/api/v1/query_range", 1.234),
            (
                "/a \"quoted\" \\ path\n\t\r\u{8}\u{c}\u{1}\u{1f}\u{7f}é",
                1.0,
            ),
            ("", 1e-7),
            ("/x", 1e21),
            ("/x", f64::NAN),
            ("/x", f64::INFINITY),
        ] {
            let (standard, fast) = both(|| {
                tracing::info!(
                    target: TARGET,
                    method = %http::Method::GET,
                    path,
                    surface = "logs_query",
                    tenant = "team-a",
                    user = "grafana-a",
                    client = %peer,
                    status = 200u16,
                    duration_ms = duration,
                    negative = -3i64,
                    flag = true,
                    debugged = ?Some("a\"b"),
                );
            });
            assert_eq!(fast, standard, "path {path:?}, duration {duration}");
        }
    }

    /// tracing-subscriber's own cases (`fmt/time/datetime.rs`) within
    /// humantime's years, and what is left to tracing-subscriber.
    #[test]
    fn timestamps_are_written_as_tracing_subscriber_writes_them() {
        use std::time::Duration;
        let at = |secs: u64, micros: u32| UNIX_EPOCH + Duration::new(secs, micros * 1_000);
        for (expected, secs, micros) in [
            ("1970-01-01T00:00:00.000000Z", 0, 0),
            ("1970-01-01T00:00:00.000001Z", 0, 1),
            ("1970-01-01T00:00:00.500000Z", 0, 500_000),
            ("1970-01-01T00:01:01.000001Z", 61, 1),
            ("1970-01-02T01:01:01.000001Z", 24 * 3600 + 3661, 1),
            ("2000-02-29T23:59:59.999999Z", 951_868_799, 999_999),
            ("2038-01-19T03:14:07.000000Z", i32::MAX as u64, 0),
            ("2038-01-19T03:14:08.000000Z", i32::MAX as u64 + 1, 0),
            ("2345-06-07T08:09:01.000000Z", 11_847_456_541, 0),
            ("9999-12-31T23:59:59.999999Z", 253_402_300_799, 999_999),
        ] {
            let written = humantime_form(at(secs, micros)).map(|t| t.to_string());
            assert_eq!(written.as_deref(), Some(expected), "{secs} s {micros} µs");
        }
        assert!(humantime_form(at(253_402_300_800, 0)).is_none());
        assert!(humantime_form(UNIX_EPOCH - Duration::from_secs(1)).is_none());

        // And now, against tracing-subscriber itself: read a moment apart,
        // so equal to the second unless a second turned in between.
        let turned = (0..100).all(|_| {
            let (mut standard, mut fast) = (String::new(), String::new());
            SystemTime
                .format_time(&mut Writer::new(&mut standard))
                .unwrap();
            push_timestamp(&mut fast).unwrap();
            assert_eq!(
                (fast.len(), &fast[19..20], &fast[26..]),
                (27, ".", "Z"),
                "{fast}"
            );
            standard[..19] != fast[..19]
        });
        assert!(
            !turned,
            "a second turned between the two readings 100 times"
        );
    }

    proptest::proptest! {
        /// Any path, user and numbers: the same bytes as the standard line.
        #[test]
        fn any_access_line_is_the_standard_line(
            path in ".*",
            user in proptest::prelude::any::<String>(),
            status in proptest::prelude::any::<u16>(),
            duration in proptest::prelude::any::<f64>(),
            offset in proptest::prelude::any::<i64>(),
        ) {
            let (standard, fast) = both(|| {
                tracing::info!(
                    target: TARGET,
                    path = path.as_str(),
                    user = %user,
                    status,
                    duration_ms = duration,
                    offset,
                );
            });
            proptest::prop_assert_eq!(fast, standard);
        }
    }

    #[test]
    fn other_events_and_access_events_in_a_span_take_the_standard_format() {
        let (standard, fast) = both(|| tracing::info!(listen = "127.0.0.1:1", "serving"));
        assert_eq!(fast, standard);
        let (standard, fast) = both(|| {
            let _span = tracing::info_span!("request", id = 7).entered();
            tracing::info!(target: TARGET, status = 200u16);
        });
        assert!(standard.contains("\"spans\""), "{standard}");
        assert_eq!(fast, standard);
    }
}
