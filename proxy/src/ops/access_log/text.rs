//! The text access line (the binary's default format; the manifests run
//! JSON), as tracing-subscriber's default format writes it without
//! colours: `<timestamp>  INFO access: name=value …`, a string quoted as
//! its `Debug` quotes it, a `Display` value as it displays. With colours (a
//! terminal) the standard format writes it.

use std::fmt::{self, Write};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::{self, Format, FormatEvent, FormatFields, Full, Writer};
use tracing_subscriber::fmt::time::SystemTime;
use tracing_subscriber::fmt::FmtContext;
use tracing_subscriber::registry::LookupSpan;

use super::{is_plain_access, push_timestamp, LINE_CAPACITY};

/// tracing-subscriber's default text format, with access events written
/// directly when no colours are asked for.
pub struct TextWithFastAccess {
    standard: Format<Full, SystemTime>,
}

impl Default for TextWithFastAccess {
    fn default() -> Self {
        Self {
            standard: format::format(),
        }
    }
}

impl<S, N> FormatEvent<S, N> for TextWithFastAccess
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
        if writer.has_ansi_escapes() || !is_plain_access(ctx, event) {
            return self.standard.format_event(ctx, writer, event);
        }
        let meta = event.metadata();
        let mut line = String::with_capacity(LINE_CAPACITY);
        push_timestamp(&mut line)?;
        line.push(' ');
        line.push_str(padded(meta.level()));
        line.push(' ');
        line.push_str(meta.target());
        line.push_str(": ");
        let mut fields = Fields {
            line: &mut line,
            first: true,
            result: Ok(()),
            unusual: false,
        };
        event.record(&mut fields);
        if fields.unusual {
            return self.standard.format_event(ctx, writer, event);
        }
        fields.result?;
        line.push('\n');
        writer.write_str(&line)
    }
}

/// The level as the standard format writes it without colours: five
/// wide, right-aligned.
fn padded(level: &Level) -> &'static str {
    match *level {
        Level::TRACE => "TRACE",
        Level::DEBUG => "DEBUG",
        Level::INFO => " INFO",
        Level::WARN => " WARN",
        Level::ERROR => "ERROR",
    }
}

/// Writes an event's fields as the standard format does: `name=value`,
/// one space between, every value as its `Debug` writes it.
struct Fields<'a> {
    line: &'a mut String,
    first: bool,
    /// A `Debug` implementation's failure: the line is not written.
    result: fmt::Result,
    /// A field the standard format writes its own way (`message`, `r#`
    /// names, `log.` metadata, errors with their sources): the whole line
    /// is left to it.
    unusual: bool,
}

impl Fields<'_> {
    /// Writes `name=`, after a space unless it is the first; `None` for a
    /// field this writer leaves to the standard format.
    fn name(&mut self, field: &Field) -> Option<&mut String> {
        let name = field.name();
        if name == "message" || name.starts_with("r#") || name.starts_with("log.") {
            self.unusual = true;
        }
        if self.unusual {
            return None;
        }
        if !self.first {
            self.line.push(' ');
        }
        self.first = false;
        self.line.push_str(name);
        self.line.push('=');
        Some(self.line)
    }
}

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        let Some(line) = self.name(field) else { return };
        // `Debug` quotes a string and escapes inside it; visible ASCII
        // other than `"` and `\` it leaves as it is.
        let plain = value.bytes().fold(true, |plain, b| {
            plain & (b' '..=b'~').contains(&b) & (b != b'"') & (b != b'\\')
        });
        if plain {
            line.push('"');
            line.push_str(value);
            line.push('"');
        } else {
            // Writing to a `String` cannot fail.
            let _ = write!(line, "{value:?}");
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let Some(line) = self.name(field) else { return };
        if let Err(e) = write!(line, "{value:?}") {
            self.result = Err(e);
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        let Some(line) = self.name(field) else { return };
        line.push_str(itoa::Buffer::new().format(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        let Some(line) = self.name(field) else { return };
        line.push_str(itoa::Buffer::new().format(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        let Some(line) = self.name(field) else { return };
        line.push_str(if value { "true" } else { "false" });
    }

    fn record_error(&mut self, _field: &Field, _value: &(dyn std::error::Error + 'static)) {
        self.unusual = true;
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{access_event, any_access_event, logged, CASES};
    use super::super::TARGET;
    use super::*;

    /// The line `emit` logs, through the standard text format and through
    /// this one, timestamps blanked.
    fn both(ansi: bool, emit: impl Fn()) -> (String, String) {
        let line = |fast: bool| {
            let text = logged(
                |sink| {
                    let builder = tracing_subscriber::fmt()
                        .with_ansi(ansi)
                        .with_writer(move || sink.clone());
                    match fast {
                        true => {
                            Box::new(builder.event_format(TextWithFastAccess::default()).finish())
                        }
                        false => Box::new(builder.finish()),
                    }
                },
                &emit,
            );
            // `yyyy-mm-ddThh:mm:ss.ffffffZ`, after a colour code with colours.
            let lines = text.split_inclusive('\n').map(|line| {
                let bytes = line.as_bytes();
                let start = (0..bytes.len().saturating_sub(27))
                    .find(|&i| {
                        bytes[i + 4] == b'-' && bytes[i + 10] == b'T' && bytes[i + 26] == b'Z'
                    })
                    .unwrap_or_else(|| panic!("no timestamp in {line:?}"));
                format!("{}{}", &line[..start], &line[start + 27..])
            });
            lines.collect::<String>()
        };
        (line(false), line(true))
    }

    #[test]
    fn an_access_line_is_the_standard_line_byte_for_byte() {
        for (path, duration) in CASES {
            let (standard, fast) = both(false, || access_event(path, duration));
            assert!(
                standard.contains(" INFO access: method=GET path="),
                "{standard}"
            );
            assert_eq!(fast, standard, "path {path:?}, duration {duration}");
        }
    }

    #[test]
    fn unusual_fields_colours_and_spans_take_the_standard_format() {
        let error = std::io::Error::other("broken");
        let (standard, fast) = both(false, || {
            tracing::info!(target: TARGET, status = 200u16, "with a message");
            tracing::info!(target: TARGET, "a message alone");
            tracing::info!(target: TARGET, status = 200u16, log.file = "from-log.rs");
            tracing::info!(target: TARGET, r#type = "raw", status = 200u16);
            tracing::info!(target: TARGET, status = 200u16, error = &error as &dyn std::error::Error);
            tracing::info!(listen = "127.0.0.1:1", "serving");
            let _span = tracing::info_span!("request", id = 7).entered();
            tracing::info!(target: TARGET, status = 200u16);
        });
        assert!(standard.contains("request{id=7}"), "{standard}");
        assert_eq!(fast, standard);
        let (standard, fast) = both(true, || tracing::info!(target: TARGET, path = "/x"));
        assert!(standard.contains('\u{1b}'), "{standard:?}");
        assert_eq!(fast, standard);
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
            let (standard, fast) = both(false, || any_access_event(&path, &user, status, duration, offset));
            proptest::prop_assert_eq!(fast, standard);
        }
    }
}
