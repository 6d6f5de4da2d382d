//! TLS to `https://` upstreams: a CA bundle (or the system's roots), an
//! optional client certificate, an optional server name, reloaded when the
//! files change. A file that fails to load keeps the previous client.

use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::PrivateKeyDer;

use super::HttpClient;
use crate::config::UpstreamTls;
use crate::http::tls::{certificates, digest_files, every, file_error, roots_from};
use crate::ops::metrics::Metrics;

/// The rustls client configuration for an `https://` upstream.
pub fn client_config(tls: &UpstreamTls) -> Result<ClientConfig, String> {
    let roots = match &tls.ca_file {
        Some(ca_file) => roots_from(ca_file)?,
        None => {
            // The system's roots; unreadable ones are skipped, as curl does.
            let mut roots = RootCertStore::empty();
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
            roots
        }
    };
    let builder = ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots);
    match (&tls.cert_file, &tls.key_file) {
        (Some(cert_file), Some(key_file)) => {
            let certs = certificates(cert_file)?;
            let key =
                PrivateKeyDer::from_pem_file(key_file).map_err(|e| file_error(key_file, e))?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| format!("{}: {e}", key_file.display()))
        }
        _ => Ok(builder.with_no_client_auth()),
    }
}

/// Rebuilds an upstream's client when its TLS files change.
pub struct UpstreamTlsReloader {
    pub tls: UpstreamTls,
    pub client: Arc<ArcSwap<HttpClient>>,
    pub metrics: Arc<Metrics>,
    seen: blake3::Hash,
}

impl UpstreamTlsReloader {
    pub fn new(tls: UpstreamTls, client: Arc<ArcSwap<HttpClient>>, metrics: Arc<Metrics>) -> Self {
        let seen = upstream_digest(&tls);
        Self {
            tls,
            client,
            metrics,
            seen,
        }
    }

    /// Checks the files every `reload_interval`, and when `recheck` asks,
    /// until `shutdown` resolves.
    pub async fn run(
        mut self,
        shutdown: impl std::future::Future<Output = ()>,
        recheck: tokio::sync::watch::Receiver<u64>,
    ) {
        every(self.tls.reload_interval, shutdown, recheck, || self.check()).await;
    }

    fn check(&mut self) {
        let now = upstream_digest(&self.tls);
        if now == self.seen {
            return;
        }
        self.seen = now;
        // The new client connects as the one it replaces did.
        let current = self.client.load();
        match super::client(Some(&self.tls), current.reuse(), current.receive_buffer()) {
            Ok(client) => {
                self.client.store(Arc::new(client));
                tracing::info!("upstream TLS files reloaded");
            }
            Err(e) => {
                self.metrics.tls_reload_failures.inc();
                tracing::error!(error = %e, "upstream TLS files rejected; the previous ones stay in force");
            }
        }
    }
}

fn upstream_digest(tls: &UpstreamTls) -> blake3::Hash {
    digest_files([
        tls.ca_file.as_ref(),
        tls.cert_file.as_ref(),
        tls.key_file.as_ref(),
    ])
}
