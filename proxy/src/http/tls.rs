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
    // The provider named here and for the client-certificate verifier, not
    // the process's default, which rustls cannot pick once a dependency
    // links a second one (it would panic loading a client CA bundle).
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match &config.client_ca_file {
        None => builder.with_no_client_auth(),
        Some(ca_file) => {
            let roots = roots_from(ca_file)?;
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
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

    /// A self-signed certificate and its key, written where `config` says.
    fn write_self_signed(config: &TlsConfig, name: &str) {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec![name.to_string()]).unwrap();
        let cert = params.self_signed(&key).unwrap();
        std::fs::write(&config.cert_file, cert.pem()).unwrap();
        std::fs::write(&config.key_file, key.serialize_pem()).unwrap();
    }

    fn config_in(dir: &Path) -> TlsConfig {
        TlsConfig {
            cert_file: dir.join("tls.crt"),
            key_file: dir.join("tls.key"),
            client_ca_file: None,
            reload_interval: Duration::from_secs(3600),
        }
    }

    #[test]
    fn a_certificate_and_key_load_offering_http2_first() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = config_in(dir.path());
        write_self_signed(&config, "proxy.test");
        let server = load(&config).unwrap();
        assert_eq!(server.alpn_protocols, [&b"h2"[..], b"http/1.1"]);
        // Its own certificate as the client CA: a bundle with a root in it.
        config.client_ca_file = Some(config.cert_file.clone());
        load(&config).expect("a client CA bundle with a root");
    }

    #[test]
    fn each_file_that_cannot_serve_is_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = config_in(dir.path());
        write_self_signed(&config, "proxy.test");
        let cert_file = config.cert_file.display().to_string();
        let key_file = config.key_file.display().to_string();

        config.client_ca_file = Some(dir.path().join("missing-ca.crt"));
        let error = load(&config).unwrap_err();
        assert!(error.starts_with(&format!(
            "{}: ",
            dir.path().join("missing-ca.crt").display()
        )));
        config.client_ca_file = None;

        std::fs::write(&config.key_file, "").unwrap();
        assert!(load(&config)
            .unwrap_err()
            .starts_with(&format!("{key_file}: ")));

        std::fs::write(&config.cert_file, "").unwrap();
        assert_eq!(
            load(&config).unwrap_err(),
            format!("{cert_file}: no certificate")
        );
    }

    #[test]
    fn a_changed_certificate_is_reloaded_and_a_broken_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let config = config_in(dir.path());
        write_self_signed(&config, "first.test");
        let metrics = Arc::new(Metrics::default());
        let mut reloader = TlsReloader::new(config.clone(), metrics.clone()).unwrap();
        let current = reloader.current();
        let reloads = reloader.reloads();
        let first = current.load_full();

        reloader.check();
        assert!(Arc::ptr_eq(&first, &current.load_full()), "unchanged files");
        assert_eq!(*reloads.borrow(), 0);

        write_self_signed(&config, "second.test");
        reloader.check();
        let second = current.load_full();
        assert!(!Arc::ptr_eq(&first, &second), "a new certificate in force");
        assert_eq!(*reloads.borrow(), 1);

        std::fs::write(&config.cert_file, "not a certificate").unwrap();
        reloader.check();
        reloader.check();
        assert!(
            Arc::ptr_eq(&second, &current.load_full()),
            "the last good one stays"
        );
        assert_eq!(*reloads.borrow(), 1);
        assert_eq!(
            metrics.tls_reload_failures.get(),
            1,
            "counted once per change"
        );

        write_self_signed(&config, "third.test");
        reloader.check();
        assert_eq!(*reloads.borrow(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_running_reloader_checks_when_asked_and_stops_at_shutdown() {
        let dir = tempfile::tempdir().unwrap();
        let config = config_in(dir.path());
        write_self_signed(&config, "first.test");
        let reloader = TlsReloader::new(config.clone(), Arc::new(Metrics::default())).unwrap();
        let mut reloads = reloader.reloads();
        let (recheck, (stop, stopped)) = (Recheck::default(), tokio::sync::oneshot::channel());
        let running = tokio::spawn(reloader.run(
            config.reload_interval,
            async move {
                let _ = stopped.await;
            },
            recheck.subscribe(),
        ));
        write_self_signed(&config, "second.test");
        recheck.now();
        // On the paused clock, a check that never came meets this bound at once.
        let hour = Duration::from_secs(3600);
        tokio::time::timeout(hour / 2, reloads.changed())
            .await
            .expect("reloaded when asked")
            .unwrap();
        assert_eq!(*reloads.borrow(), 1);
        stop.send(()).unwrap();
        tokio::time::timeout(hour, running)
            .await
            .expect("stopped at shutdown")
            .unwrap();
    }
}
