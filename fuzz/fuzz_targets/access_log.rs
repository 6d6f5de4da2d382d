//! The access lines the proxy writes itself. Invariant: for any field
//! values (any text, any float), the JSON line is byte for byte the line
//! tracing-subscriber's JSON format writes for the same event (timestamps
//! blanked), and it reads back as JSON with the values given; the text
//! line is byte for byte what its default text format writes.
#![no_main]

use std::io::Write;
use std::sync::{Arc, Mutex};

use libfuzzer_sys::fuzz_target;
use tenant_proxy::ops::access_log::{JsonWithFastAccess, TextWithFastAccess, TARGET};

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((float, rest)) = data.split_first_chunk::<8>() else {
        return;
    };
    let duration = f64::from_le_bytes(*float);
    let mut parts = rest.split(|&b| b == 0xff).map(String::from_utf8_lossy);
    let path = parts.next().unwrap_or_default();
    let user = parts.next().unwrap_or_default();
    let client = parts.next().unwrap_or_default();
    let emit = || {
        tracing::info!(
            target: TARGET,
            path = path.as_ref(),
            user = user.as_ref(),
            client = %client,
            debugged = ?client,
            status = 200u16,
            duration_ms = duration,
        );
    };
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
                emit,
            ),
            false => tracing::subscriber::with_default(builder.finish(), emit),
        }
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        let timestamp = value["timestamp"].as_str().unwrap().to_owned();
        (text.replacen(&timestamp, "T", 1), value)
    };
    let ((standard, _), (fast, value)) = (line(false), line(true));
    assert_eq!(fast, standard);
    let fields = &value["fields"];
    assert_eq!(fields["path"], path.as_ref());
    assert_eq!(fields["user"], user.as_ref());
    assert_eq!(fields["client"], client.as_ref());
    assert_eq!(fields["debugged"], format!("{client:?}"));
    let text = |fast: bool| {
        let captured = Captured::default();
        let sink = captured.clone();
        let builder = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || sink.clone());
        match fast {
            true => tracing::subscriber::with_default(
                builder.event_format(TextWithFastAccess::default()).finish(),
                emit,
            ),
            false => tracing::subscriber::with_default(builder.finish(), emit),
        }
        let line = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        assert_eq!(&line[26..27], "Z", "{line}");
        line[27..].to_owned()
    };
    assert_eq!(text(true), text(false));
    // The number as written (serde_json's own float parsing is not exact).
    let written = fast.split("\"duration_ms\":").nth(1).unwrap();
    let written = &written[..written.find([',', '}']).unwrap()];
    match duration.is_finite() {
        true => assert_eq!(written.parse::<f64>(), Ok(duration), "{fast}"),
        false => assert_eq!(written, "null", "{fast}"),
    }
});
