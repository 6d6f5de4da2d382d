//! Process plumbing both binaries share: logging set-up (panics too:
//! `panics.rs`) and the signals (SIGTERM and SIGINT stop, SIGHUP re-reads
//! files).

use std::future::Future;
use std::io::IsTerminal;

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;
use tracing::Subscriber;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

use crate::ops::access_log::{JsonWithFastAccess, TextWithFastAccess};

/// Logs to stderr, `text` or `json`; the level from `RUST_LOG` (default `info`).
pub fn init_logging(format: &str) -> Result<(), String> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only for a person at a terminal: a log pipeline would store
    // the escape codes as text (and writing them was 40 % of formatting an
    // access-log line).
    let ansi = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty());
    subscriber(format, filter, ansi, std::io::stderr)?
        .try_init()
        .map_err(|e| e.to_string())?;
    crate::ops::panics::log_panics();
    Ok(())
}

/// The log subscriber of both binaries, writing to `writer` (benchmarks
/// give it a sink).
pub fn subscriber<W>(
    format: &str,
    filter: EnvFilter,
    ansi: bool,
    writer: W,
) -> Result<Box<dyn Subscriber + Send + Sync>, String>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(writer);
    match format {
        "json" => Ok(Box::new(
            builder
                .json()
                .event_format(JsonWithFastAccess::default())
                .finish(),
        )),
        "text" => Ok(Box::new(
            builder.event_format(TextWithFastAccess::default()).finish(),
        )),
        other => Err(format!("unknown log format {other:?} (text or json)")),
    }
}

/// Takes over SIGTERM (Kubernetes) and SIGINT (a terminal) now, and
/// returns what resolves on either. Installed before the process says it
/// serves: one that came between that and a first poll would otherwise end
/// the process by the signal's default, with nothing drained.
pub fn shutdown_signal() -> std::io::Result<impl Future<Output = ()>> {
    let mut term = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = interrupt.recv() => {}
        }
        tracing::info!("shutting down; letting in-flight work finish");
    })
}

/// Asks everything that follows files on a clock (the tenants file, TLS
/// certificates) to look at them now. Each still skips content it has
/// seen, so asking costs a read and a digest per file.
#[derive(Clone, Debug)]
pub struct Recheck(watch::Sender<u64>);

impl Default for Recheck {
    fn default() -> Self {
        Self(watch::Sender::new(0))
    }
}

impl Recheck {
    pub fn now(&self) {
        self.0.send_modify(|asked| *asked = asked.wrapping_add(1));
    }

    /// Changes at every later [`Recheck::now`].
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.0.subscribe()
    }
}

/// Takes over SIGHUP now (its default ends the process, which operators
/// used to Prometheus, Alertmanager or nginx send to reload) and returns
/// the loop that turns each one into [`Recheck::now`]; `what` says in the
/// log what that does.
pub fn recheck_on_hangup(
    recheck: Recheck,
    what: &'static str,
) -> std::io::Result<impl Future<Output = ()>> {
    let mut hangups = signal(SignalKind::hangup())?;
    Ok(async move {
        while hangups.recv().await.is_some() {
            tracing::info!("SIGHUP: {what}");
            recheck.now();
        }
    })
}
