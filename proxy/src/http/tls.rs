//! TLS on the tenant listener: certificate and key from PEM files, reloaded
//! when they change (cert-manager and kubelet replace them in place), and
//! optionally client certificates required from a CA bundle (mTLS), in
//! addition to basic auth, never instead of it.
//!
//! A file that fails to load keeps the previous configuration in force;
//! new connections use the newest one, established ones keep theirs. The
//! PEM reading and the reload tick are shared with the upstream client's
//! TLS (`upstream::tls`), which imports them from here.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::sync::watch;

use crate::config::TlsConfig;
use crate::ops::metrics::Metrics;

/// The server configuration in force, swapped on reload.
pub type CurrentTls = Arc<ArcSwap<ServerConfig>>;

/// Loads the files named in `config` into a rustls configuration.
pub fn load(config: &TlsConfig) -> Result<ServerConfig, String> {
    let certs = certificates(&config.cert_file)?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate", config.cert_file.display()));
    }
    let key = PrivateKeyDer::from_pem_file(&config.key_file)
        .map_err(|e| file_error(&config.key_file, e))?;
    let builder =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
    let builder = match &config.client_ca_file {
        None => builder.with_no_client_auth(),
        Some(ca_file) => {
            let roots = roots_from(ca_file)?;
            let verifier = WebPkiClientVerifier::builder(Arc::new(roots))
                .build()
                .map_err(|e| format!("{}: {e}", ca_file.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut server = builder
        .with_single_cert(certs, key)
        .map_err(|e| format!("{}: {e}", config.key_file.display()))?;
    server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(server)
}

pub(crate) fn file_error(path: &Path, e: impl std::fmt::Display) -> String {
    format!("{}: {e}", path.display())
}

/// Every certificate in a PEM file, in order.
pub(crate) fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(path, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| file_error(path, e))
}

/// A PEM CA bundle as a root store.
pub(crate) fn roots_from(path: &Path) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(path)? {
        roots.add(cert).map_err(|e| file_error(path, e))?;
    }
    Ok(roots)
}

/// Calls `check` every `interval`, and whenever `recheck` asks, until
/// `shutdown` resolves.
pub(crate) async fn every(
    interval: Duration,
    shutdown: impl std::future::Future<Output = ()>,
    mut recheck: watch::Receiver<u64>,
    mut check: impl FnMut(),
) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            _ = ticks.tick() => check(),
            Ok(()) = recheck.changed() => check(),
        }
    }
}

/// Follows the certificate files and swaps the configuration in force.
pub struct TlsReloader {
    config: TlsConfig,
    current: CurrentTls,
    seen: Option<blake3::Hash>,
    metrics: Arc<Metrics>,
    /// Successful reloads after the first load, for tests and operators.
    reloads: watch::Sender<u64>,
}

impl TlsReloader {
    /// Loads the files now: a listener without a valid certificate must not
    /// start.
    pub fn new(config: TlsConfig, metrics: Arc<Metrics>) -> Result<Self, String> {
        let current = Arc::new(ArcSwap::from_pointee(load(&config)?));
        let seen = Some(digest(&config));
        Ok(Self {
            config,
            current,
            seen,
            metrics,
            reloads: watch::Sender::new(0),
        })
    }

    pub fn current(&self) -> CurrentTls {
        self.current.clone()
    }

    pub fn reloads(&self) -> watch::Receiver<u64> {
        self.reloads.subscribe()
    }

    /// Checks the files every `interval`, and when `recheck` asks, until
    /// `shutdown` resolves.
    pub async fn run(
        mut self,
        interval: Duration,
        shutdown: impl std::future::Future<Output = ()>,
        recheck: watch::Receiver<u64>,
    ) {
        every(interval, shutdown, recheck, || self.check()).await;
    }

    fn check(&mut self) {
        let now = digest(&self.config);
        if self.seen == Some(now) {
            return;
        }
        self.seen = Some(now);
        match load(&self.config) {
            Ok(server) => {
                self.current.store(Arc::new(server));
                self.reloads.send_modify(|n| *n += 1);
                tracing::info!("TLS certificate reloaded");
            }
            Err(e) => {
                self.metrics.tls_reload_failures.inc();
                tracing::error!(error = %e, "TLS files rejected; the previous certificate stays in force");
            }
        }
    }
}

fn digest(config: &TlsConfig) -> blake3::Hash {
    digest_files([
        Some(&config.cert_file),
        Some(&config.key_file),
        config.client_ca_file.as_ref(),
    ])
}

/// What the files hold now (unreadable files hash as empty: a rename in
/// progress is retried on the next tick).
pub(crate) fn digest_files(files: [Option<&PathBuf>; 3]) -> blake3::Hash {
    let mut hasher = blake3::Hasher::new();
    for path in files.into_iter().flatten() {
        let bytes = std::fs::read(path).unwrap_or_default();
        hasher.update(&(bytes.len() as u64).to_le_bytes());
        hasher.update(&bytes);
    }
    hasher.finalize()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::process::Recheck;
    use tokio::time::Instant;

    /// On tokio's paused clock, a check that waited for the next tick
    /// would come an hour later.
    #[tokio::test(start_paused = true)]
    async fn files_are_checked_at_every_tick_and_whenever_asked() {
        let recheck = Recheck::default();
        let (checked, mut checks) = tokio::sync::mpsc::unbounded_channel();
        let hour = Duration::from_secs(3600);
        tokio::spawn(every(
            hour,
            std::future::pending(),
            recheck.subscribe(),
            move || {
                let _ = checked.send(Instant::now());
            },
        ));
        let start = checks.recv().await.unwrap();
        recheck.now();
        assert_eq!(checks.recv().await.unwrap(), start, "checked when asked");
        assert_eq!(
            checks.recv().await.unwrap(),
            start + hour,
            "and at the tick"
        );
    }
}
