//! The access line: one per request, so written directly rather than
//! through tracing-subscriber's formats, in the proxy's two log formats
//! (`json.rs`, `text.rs`). Every other event, and an access event inside a
//! span, goes through the standard format, and for an access event both
//! write the same bytes (the tests compare them, any line). Each line is
//! built whole in a buffer of its own and written once; the writer is
//! reached through `dyn Write`, a call per piece (docs/benchmarks.md, "The
//! JSON access line, written by parts").

mod json;
mod text;

use std::fmt::{self, Write};
use std::time::UNIX_EPOCH;

use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::FmtContext;
use tracing_subscriber::registry::LookupSpan;

pub use json::JsonWithFastAccess;
pub use text::TextWithFastAccess;

/// The target of the per-request access-log event.
pub const TARGET: &str = "access";

/// Whether `event` is an access event outside any span: inside one, the
/// standard line lists the spans too.
fn is_plain_access<S, N>(ctx: &FmtContext<'_, S, N>, event: &Event<'_>) -> bool
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    event.metadata().target() == TARGET
        && event.parent().is_none()
        && ctx.lookup_current().is_none()
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

#[cfg(test)]
mod tests {
    use super::*;

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
}

/// What the tests of both formats share: a writer that keeps what it is
/// given, and the events they compare (the panic hook's tests read its
/// lines with them too).
#[cfg(test)]
pub(crate) mod test_support {
    use std::sync::{Arc, Mutex};

    use tracing::Subscriber;

    use super::TARGET;

    /// Collects what a subscriber writes.
    #[derive(Clone, Default)]
    pub struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What `emit` logs through the subscriber `make` builds around a
    /// capture.
    pub fn logged(
        make: impl FnOnce(Captured) -> Box<dyn Subscriber + Send + Sync>,
        emit: &dyn Fn(),
    ) -> String {
        let captured = Captured::default();
        tracing::subscriber::with_default(make(captured.clone()), emit);
        let bytes = captured.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    /// Paths and durations an access line must write as the standard
    /// format does: escapes (among them a path of nothing but backslashes,
    /// or of control characters and a space), the empty path, floats of
    /// every kind.
    pub const CASES: [(&str, f64); 10] = [
        ("/loki/api/v1/query_range", 1.234),
        ("\\\\", 1.0),
        ("\n \u{1}", 1.0),
        (
            "/a \"quoted\" \\ path\n\t\r\u{8}\u{c}\u{1}\u{1f}\u{7f}é\u{301}",
            1.0,
        ),
        ("/a \"quoted\" path", 2.5),
        ("/a \\ path", 2.5),
        ("", 1e-7),
        ("/x", 1e21),
        ("/x", f64::NAN),
        ("/x", f64::NEG_INFINITY),
    ];

    /// The proxy's access event, with a field of every other kind too.
    pub fn access_event(path: &str, duration: f64) {
        let peer: std::net::IpAddr = "10.1.2.3".parse().unwrap();
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
    }

    /// An access event of arbitrary values, for the property tests.
    pub fn any_access_event(path: &str, user: &str, status: u16, duration: f64, offset: i64) {
        tracing::info!(
            target: TARGET,
            path,
            user = %user,
            status,
            duration_ms = duration,
            offset,
            flag = offset % 2 == 0,
        );
    }
}
