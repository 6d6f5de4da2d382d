//! The JSON access line: tracing-subscriber's JSON format goes through
//! serde and cost twice the text line. The parts are written as serde_json
//! writes them (itoa for integers, zmij for floats, strings escaped as it
//! escapes them).

use std::fmt::{self, Write};

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{self, Format, FormatEvent, FormatFields, Json, Writer};
use tracing_subscriber::fmt::time::SystemTime;
use tracing_subscriber::fmt::FmtContext;
use tracing_subscriber::registry::LookupSpan;

use super::{is_plain_access, push_timestamp, LINE_CAPACITY, TARGET};

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
        if !is_plain_access(ctx, event) {
            return self.standard.format_event(ctx, writer, event);
        }
        let meta = event.metadata();
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
                None => {
                    let _ = write!(self.0, "\\u{byte:04x}");
                }
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
    use super::super::test_support::{access_event, any_access_event, logged, CASES};
    use super::*;

    /// The line `emit` logs, through the standard JSON format and through
    /// this one, timestamps blanked.
    fn both(emit: impl Fn()) -> (String, String) {
        let line = |fast: bool| {
            let text = logged(
                |sink| {
                    let builder = tracing_subscriber::fmt()
                        .with_ansi(false)
                        .with_writer(move || sink.clone())
                        .json();
                    match fast {
                        true => {
                            Box::new(builder.event_format(JsonWithFastAccess::default()).finish())
                        }
                        false => Box::new(builder.finish()),
                    }
                },
                &emit,
            );
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
        for (path, duration) in CASES {
            let (standard, fast) = both(|| access_event(path, duration));
            assert!(
                standard.contains("\"fields\":{\"method\":\"GET\""),
                "{standard}"
            );
            assert_eq!(fast, standard, "path {path:?}, duration {duration}");
        }
    }

    proptest::proptest! {
        /// Any path, user and numbers: the same bytes as the standard line.
        #[test]
        fn any_access_line_is_the_standard_line(
            // Printable ASCII half the time: quotes and backslashes alone.
            path in "[ -~]{0,40}|.*",
            user in proptest::prelude::any::<String>(),
            status in proptest::prelude::any::<u16>(),
            duration in proptest::prelude::any::<f64>(),
            offset in proptest::prelude::any::<i64>(),
        ) {
            let (standard, fast) = both(|| any_access_event(&path, &user, status, duration, offset));
            proptest::prop_assert_eq!(fast, standard);
        }

        /// What needs escaping and what does not, in any order and number:
        /// escaped as serde_json escapes it. The quick look for anything
        /// to escape must miss nothing, not even a string of control
        /// characters and spaces alone: a newline or quote passed through
        /// would let a tenant's path write a line, or fields, of its own.
        #[test]
        fn strings_are_escaped_as_serde_json_escapes_them(
            chars in proptest::collection::vec(
                proptest::sample::select(vec!['"', '\\', '\n', '\u{1}', '\u{1f}', ' ', 'a', '\u{7f}', 'é']),
                0..8,
            ),
        ) {
            let text: String = chars.into_iter().collect();
            let mut escaped = String::new();
            Escaped(&mut escaped).push(&text);
            let quoted = serde_json::to_string(&text).unwrap();
            proptest::prop_assert_eq!(escaped.as_str(), &quoted[1..quoted.len() - 1]);
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
