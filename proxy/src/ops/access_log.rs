//! The JSON line of an access event, written directly. tracing-subscriber's
//! JSON format goes through serde and costs twice the text line
//! (`benches/tracing.rs`); the access log is a line per request, and JSON
//! is what the manifests run. Every other event, and an access event inside
//! a span, goes through the standard format, and both write the same bytes
//! (the tests compare them).

use std::fmt::{self, Write};

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
        writer.write_str("{\"timestamp\":\"")?;
        SystemTime.format_time(&mut writer)?;
        write!(writer, "\",\"level\":\"{}\",\"fields\":{{", meta.level())?;
        let mut fields = Fields {
            writer: &mut writer,
            first: true,
            result: Ok(()),
        };
        event.record(&mut fields);
        fields.result?;
        writeln!(writer, "}},\"target\":\"{TARGET}\"}}")
    }
}

/// Writes an event's fields as JSON object entries, as tracing-serde does:
/// numbers and booleans as such, a non-finite float as `null`, everything
/// else (`Debug` and `Display` values) as a string.
struct Fields<'a, 'w> {
    writer: &'a mut Writer<'w>,
    first: bool,
    result: fmt::Result,
}

impl Fields<'_, '_> {
    /// Writes `"name":value`, after a comma unless it is the first; once a
    /// write failed, nothing more (`Visit` cannot return the error).
    fn entry(&mut self, field: &Field, value: impl FnOnce(&mut Writer<'_>) -> fmt::Result) {
        if self.result.is_ok() {
            self.result = self.write_entry(field, value);
        }
    }

    fn write_entry(
        &mut self,
        field: &Field,
        value: impl FnOnce(&mut Writer<'_>) -> fmt::Result,
    ) -> fmt::Result {
        if !self.first {
            self.writer.write_char(',')?;
        }
        self.first = false;
        write_string(self.writer, field.name())?;
        self.writer.write_char(':')?;
        value(self.writer)
    }
}

impl Visit for Fields<'_, '_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.entry(field, |w| write_string(w, value));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.entry(field, |w| {
            w.write_char('"')?;
            write!(Escaped(w), "{value:?}")?;
            w.write_char('"')
        });
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.entry(field, |w| match serde_json::Number::from_f64(value) {
            Some(number) => write!(w, "{number}"),
            None => w.write_str("null"),
        });
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.entry(field, |w| write!(w, "{value}"));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.entry(field, |w| write!(w, "{value}"));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.entry(field, |w| write!(w, "{value}"));
    }
}

fn write_string(w: &mut Writer<'_>, value: &str) -> fmt::Result {
    w.write_char('"')?;
    Escaped(w).write_str(value)?;
    w.write_char('"')
}

/// Escapes what passes through as serde_json does inside a string: quote,
/// backslash and control characters; everything else as it is.
struct Escaped<'a, 'w>(&'a mut Writer<'w>);

impl Write for Escaped<'_, '_> {
    fn write_str(&mut self, text: &str) -> fmt::Result {
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
            self.0.write_str(&text[plain..at])?;
            match short {
                Some(escape) => self.0.write_str(escape)?,
                None => write!(self.0, "\\u{byte:04x}")?,
            }
            plain = at + 1;
        }
        self.0.write_str(&text[plain..])
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
