//! Process plumbing both binaries share: logging set-up and the shutdown
//! signal.

/// Logs to stderr, `text` or `json`; the level from `RUST_LOG` (default `info`).
pub fn init_logging(format: &str) -> Result<(), String> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        "json" => builder.json().init(),
        "text" => builder.init(),
        other => return Err(format!("unknown log format {other:?} (text or json)")),
    }
    Ok(())
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
