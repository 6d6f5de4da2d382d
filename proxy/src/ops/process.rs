//! Process plumbing both binaries share: logging set-up and the shutdown
//! signal.

use std::io::IsTerminal;

/// Logs to stderr, `text` or `json`; the level from `RUST_LOG` (default `info`).
pub fn init_logging(format: &str) -> Result<(), String> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only for a person at a terminal: a log pipeline would store
    // the escape codes as text (and writing them is a good part of the
    // access log's cost).
    let ansi = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match format {
        "json" => builder.json().init(),
        "text" => builder.init(),
        other => return Err(format!("unknown log format {other:?} (text or json)")),
    }
    log_panics();
    Ok(())
}

/// Panics become log events (one JSON line in `json` mode) instead of the
/// default hook's free text on stderr, which log pipelines mangle. The
/// proxy survives some on purpose (promql-parser's, answered 400): the
/// message and location are logged, as the default hook would print them,
/// never the request.
fn log_panics() {
    std::panic::set_hook(Box::new(|info| {
        let location = info.location().map(ToString::to_string).unwrap_or_default();
        let payload = info.payload();
        let message = (payload.downcast_ref::<&str>().copied())
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("(not a string)");
        tracing::error!(panic = message, location, "panic");
    }));
}

/// Resolves on SIGTERM (Kubernetes) or SIGINT (a terminal).
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("shutting down; letting in-flight work finish");
}
