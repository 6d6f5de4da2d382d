//! tenant-proxy: a multi-tenant authenticating gateway for Loki and Prometheus.
//!
//! The folders follow the life of a request (see `proxy/mod.rs` and
//! docs/architecture.md): `http` speaks to clients (path, body, errors,
//! listener TLS), `routes` classifies a request, `auth` authenticates it
//! against the tenants in force (`tenants`), `admission` applies limits,
//! `enforce` scopes label-mode queries and pushes, `upstream` forwards it,
//! `ops` reports (metrics, spans, admin endpoints).

pub mod admission;
pub mod auth;
pub mod cli;
pub mod config;
pub mod enforce;
pub mod http;
pub mod ops;
pub mod proxy;
pub mod routes;
pub mod tenants;
pub mod upstream;

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::config::Config;
use crate::http::server::{serve_connections, ListenerMetrics, Shutdown};
use crate::http::tls::TlsReloader;
use crate::ops::admin;
use crate::ops::metrics::Metrics;
use crate::ops::process::Recheck;
use crate::proxy::AppState;
use crate::tenants::file::TenantsFileError;
use crate::tenants::reload::{Reloader, Tenants};
use crate::upstream::tls::UpstreamTlsReloader;

/// A configured proxy, its tenants file loaded (or found missing), not yet serving.
pub struct Proxy {
    config: Config,
    state: Arc<AppState>,
    reloader: Reloader,
    tls: Option<TlsReloader>,
    recheck: Recheck,
}

/// Why a proxy cannot start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    TenantsFile(#[from] TenantsFileError),
    #[error("TLS: {0}")]
    Tls(String),
    /// An upstream's or the trace collector's client (its TLS files).
    #[error("client: {0}")]
    Client(String),
}

impl Proxy {
    /// Fails when the tenants file exists but is invalid; a missing one is
    /// fine (the proxy starts unready and answers 503 until it appears).
    pub fn new(config: Config) -> Result<Self, StartError> {
        let tenants = Arc::new(Tenants::default());
        let metrics = Arc::new(Metrics::default());
        let mut reloader = Reloader::new(
            config.tenants_file.clone(),
            tenants.clone(),
            metrics.clone(),
        );
        reloader.load_initial()?;
        let tls = config
            .tls
            .clone()
            .map(|tls| TlsReloader::new(tls, metrics.clone()))
            .transpose()
            .map_err(StartError::Tls)?;
        let state = Arc::new(AppState::new(&config, tenants, metrics).map_err(StartError::Client)?);
        Ok(Self {
            config,
            state,
            reloader,
            tls,
            recheck: Recheck::default(),
        })
    }

    pub fn tenants(&self) -> Arc<Tenants> {
        self.state.tenants.clone()
    }

    /// Makes the tenants file and every TLS file be looked at now rather
    /// than at their next tick (`main` calls it on SIGHUP).
    pub fn recheck_files(&self) -> Recheck {
        self.recheck.clone()
    }

    /// Counts certificate reloads (TLS configured only).
    pub fn tls_reloads(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.tls.as_ref().map(TlsReloader::reloads)
    }

    /// Serves tenant traffic on `listener` and the admin endpoints on
    /// `admin`, and follows the tenants file, until `shutdown` resolves; then
    /// waits for in-flight requests (up to `limits.shutdown_grace`) and for
    /// live tails to take their close frames (about a second at most).
    pub async fn serve(
        self,
        listener: TcpListener,
        admin: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) {
        let shutdown = Shutdown::new(shutdown);
        let Self {
            config,
            state,
            reloader,
            tls,
            recheck,
        } = self;

        let reload = tokio::spawn(reloader.run(
            config.tenants_poll_interval,
            shutdown.clone().wait(),
            recheck.subscribe(),
        ));
        let current_tls = tls.as_ref().map(TlsReloader::current);
        if let (Some(tls), Some(settings)) = (tls, &config.tls) {
            tokio::spawn(tls.run(
                settings.reload_interval,
                shutdown.clone().wait(),
                recheck.subscribe(),
            ));
        }
        let upstream_clients = [&state.logs, &state.metrics_target, &state.alerts_target]
            .into_iter()
            .flatten()
            .map(|target| (&target.tls, &target.client));
        let collector = config.tracing.as_ref().zip(state.tracing.as_ref());
        let collector_client = collector.map(|(config, tracing)| (&config.tls, &tracing.collector));
        for (tls, client) in upstream_clients.chain(collector_client) {
            if let Some(tls) = tls {
                let reloader =
                    UpstreamTlsReloader::new(tls.clone(), client.clone(), state.metrics.clone());
                tokio::spawn(reloader.run(shutdown.clone().wait(), recheck.subscribe()));
            }
        }

        // Taken before `state` moves into the handler: runs once serving stopped.
        let flush_spans = state.tracing.as_ref().map(|tracing| tracing.shutdown());
        let admin_state = Arc::new(admin::ProxyAdmin {
            metrics: state.metrics.clone(),
            tenants: state.tenants.clone(),
        });
        let admin_server = admin::serve(admin, admin_state, &config.limits, shutdown.clone());
        // Tails outlive their connections' drain: told to close at the
        // signal, so their clients reconnect elsewhere while requests drain.
        let tails = state.tails.clone();
        let stopping = shutdown.clone();
        let close_tails = async move {
            stopping.wait().await;
            tails.close_all().await;
        };
        let listener_metrics = ListenerMetrics {
            open: state.metrics.client_connections.clone(),
            refused_per_address: state.metrics.client_connections_refused.clone(),
        };
        state
            .metrics
            .connection_limit
            .set(i64::try_from(config.limits.max_connections).unwrap_or(i64::MAX));
        let tenant_server = serve_connections(
            listener,
            &config.limits,
            current_tls,
            move |peer, request| proxy::handle(state.clone(), peer, request),
            shutdown,
            Some(listener_metrics),
        );
        tokio::join!(admin_server, tenant_server, close_tails);
        let _ = reload.await;
        if let Some(flush) = flush_spans {
            flush.await;
        }
    }
}
