//! What every request shares: where each signal goes (`Target`) and the
//! state all connections read (`AppState`), built once from the config.

use std::sync::Arc;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::header::HeaderName;

use super::body_workers::{BodyWorkers, LargeBodyMetrics};
use super::tail::LiveTails;
use crate::admission::Admission;
use crate::auth::Authenticator;
use crate::config::{
    Config, ForeignLabelPolicy, Limits, MetricsConfig, MetricsMode, OtlpForwardEncoding, Upstream,
    UpstreamTls,
};
use crate::enforce::alertmanager::TenantAlerts;
use crate::enforce::promql::{Memo, TenantMatcher};
use crate::enforce::remote_write;
use crate::enforce::tenant_label::TenantLabel;
use crate::http::body::{self, BoxError, ReadError};
use crate::http::client_address::TrustedProxies;
use crate::http::error::ProxyError;
use crate::http::headers::X_SCOPE_ORGID;
use crate::http::large_bodies::LargeBodyBytes;
use crate::http::receive_buffer;
use crate::ops::metrics::{GaugeHeld, Metrics};
use crate::ops::otel::Tracing;
use crate::routes::{
    AlertmanagerCall, Operation, Route, RouteTable, Signal, ALERTMANAGER_DATASOURCE_ROOT,
    ALERTMANAGER_PREFIXES,
};
use crate::tenants::reload::Tenants;
use crate::tenants::{Credential, Tenant};
use crate::upstream::{self, HttpClient};

/// Where one signal's requests go and how the tenant travels there.
#[derive(Debug)]
pub struct Target {
    pub upstream: Upstream,
    /// Where pushes go, if not to `upstream`.
    pub push_upstream: Option<Upstream>,
    /// Set to the tenant id (Loki, and metrics in header mode).
    pub tenant_header: Option<HeaderName>,
    /// The label a tenant's `namespaces` are values of (metrics label mode).
    pub tenant_label: Option<String>,
    /// How label mode's pushes are rewritten (metrics only).
    pub pushes: LabelPushes,
    /// Loki enforces `X-Prom-Label-Policy` (`logs.lbac`).
    pub enforces_label_policy: bool,
    /// This upstream's pooled client; swapped when its TLS files change.
    pub client: Arc<ArcSwap<HttpClient>>,
    /// Its TLS settings, for the reloader.
    pub tls: Option<UpstreamTls>,
}

/// How label mode rewrites a target's pushes (`metrics.*`).
#[derive(Debug, Default)]
pub struct LabelPushes {
    /// What to do with a series' foreign tenant label value.
    pub foreign_label: ForeignLabelPolicy,
    /// How a relabelled OTLP metrics body is forwarded.
    pub otlp_forward: OtlpForwardEncoding,
    /// How a relabelled remote-write body is forwarded.
    pub remote_write_forward: remote_write::Output,
}

impl Target {
    pub(super) fn upstream_for(&self, operation: Operation) -> &Upstream {
        match &self.push_upstream {
            Some(push) if operation.is_push() => push,
            _ => &self.upstream,
        }
    }

    /// What `credential` may read, as label matchers (label mode).
    pub(super) fn tenant_matcher<'c>(
        &self,
        credential: &'c Credential,
    ) -> Result<&'c TenantMatcher, ProxyError> {
        credential
            .metrics_matcher(self.label()?)
            .map_err(ProxyError::Internal)
    }

    /// The tenant label (label mode); a label-mode route on a header-mode
    /// target would be a bug in the route table.
    fn label(&self) -> Result<&str, ProxyError> {
        self.tenant_label
            .as_deref()
            .ok_or_else(|| ProxyError::Internal("label enforcement without a label".into()))
    }

    /// The tenant as a label-mode Alertmanager sees it.
    pub(super) fn alerts_tenant<'t>(
        &'t self,
        tenant: &'t Tenant,
    ) -> Result<TenantAlerts<'t>, ProxyError> {
        Ok(TenantAlerts {
            label: self.label()?,
            owned: &tenant.namespaces,
        })
    }

    /// The path upstream: a vanilla Alertmanager (label mode) serves at its
    /// root what the proxy also serves under `/alertmanager` and `/am`;
    /// Mimir (header mode) at its root what the proxy also serves under
    /// `/am`. The route table only has these prefixes as whole segments.
    /// Label mode lists receivers from the routing tree in the status.
    pub(super) fn upstream_path<'p>(&self, route: &Route, path: &'p str) -> &'p str {
        let prefixes: &[&str] = match (route.signal, &self.tenant_label) {
            (Signal::Alerts, Some(_))
                if route.operation == Operation::Alertmanager(AlertmanagerCall::Receivers) =>
            {
                return "/api/v2/status";
            }
            (Signal::Alerts, Some(_)) => &ALERTMANAGER_PREFIXES,
            (Signal::Alerts, None) => &[ALERTMANAGER_DATASOURCE_ROOT],
            _ => return path,
        };
        prefixes
            .iter()
            .find_map(|prefix| {
                path.strip_prefix(prefix)
                    .filter(|rest| rest.starts_with('/'))
            })
            .unwrap_or(path)
    }

    pub(super) fn remote_write_label<'t>(
        &'t self,
        tenant: &'t Tenant,
    ) -> Result<TenantLabel<'t>, ProxyError> {
        Ok(TenantLabel {
            name: self.label()?,
            owned: &tenant.namespaces,
            owned_by: tenant.id.as_str(),
            policy: self.pushes.foreign_label,
        })
    }
}

/// Everything a request needs, shared by all connections.
#[derive(Debug)]
pub struct AppState {
    pub routes: RouteTable,
    pub logs: Option<Target>,
    pub metrics_target: Option<Target>,
    /// Alertmanager, scoped the way metrics are.
    pub alerts_target: Option<Target>,
    pub tenants: Arc<Tenants>,
    pub auth: Authenticator,
    /// Whose `X-Forwarded-For` names the client (throttles, access log).
    pub trusted_proxies: TrustedProxies,
    pub metrics: Arc<Metrics>,
    pub limits: Limits,
    pub admission: Admission,
    /// Enforced queries by (tenant, query): dashboards repeat themselves.
    pub memo: Memo,
    /// Spans, when `tracing` is configured.
    pub tracing: Option<Tracing>,
    /// Live tails, closed with a close frame at shutdown.
    pub tails: Arc<LiveTails>,
    /// The threads that check large push bodies.
    pub body_workers: BodyWorkers,
}

impl AppState {
    pub fn new(
        config: &Config,
        tenants: Arc<Tenants>,
        metrics: Arc<Metrics>,
    ) -> Result<Self, String> {
        let reuse = upstream::Reuse::new(
            config.limits.upstream_idle_timeout,
            metrics.upstream_replays.clone(),
        );
        let receive_buffer = match config.limits.upstream_receive_buffer_bytes {
            0 => None,
            bytes => {
                receive_buffer::warn_if_capped("limits.upstream_receive_buffer_bytes", bytes);
                Some(bytes)
            }
        };
        let client = |tls: Option<&UpstreamTls>| -> Result<_, String> {
            Ok(Arc::new(ArcSwap::from_pointee(upstream::client(
                tls,
                reuse.clone(),
                receive_buffer,
            )?)))
        };
        let logs = match &config.logs {
            None => None,
            Some(l) => Some(Target {
                upstream: l.upstream.clone(),
                push_upstream: None,
                tenant_header: Some(X_SCOPE_ORGID),
                tenant_label: None,
                pushes: LabelPushes::default(),
                enforces_label_policy: l.lbac,
                client: client(l.tls.as_ref())?,
                tls: l.tls.clone(),
            }),
        };
        // Metrics and their Alertmanager are scoped alike: by the label
        // (label mode) or by the tenant header (header mode).
        let scoped_like_metrics = |m: &MetricsConfig| match m.mode {
            MetricsMode::Label => (None, Some(m.label.clone())),
            // Validated as a header name when the config was loaded.
            MetricsMode::Header => (HeaderName::from_bytes(m.header.as_bytes()).ok(), None),
        };
        let metrics_target = match &config.metrics {
            None => None,
            Some(m) => {
                let (tenant_header, tenant_label) = scoped_like_metrics(m);
                Some(Target {
                    upstream: m.upstream.clone(),
                    push_upstream: m.push_upstream.clone(),
                    tenant_header,
                    tenant_label,
                    pushes: LabelPushes {
                        foreign_label: m.foreign_label,
                        otlp_forward: m.otlp_forward_encoding,
                        remote_write_forward: m.remote_write_forward_compression,
                    },
                    enforces_label_policy: false,
                    client: client(m.tls.as_ref())?,
                    tls: m.tls.clone(),
                })
            }
        };
        let alerts_target = match (&config.alerts, &config.metrics) {
            (Some(a), Some(m)) => {
                let (tenant_header, tenant_label) = scoped_like_metrics(m);
                Some(Target {
                    upstream: a.upstream.clone(),
                    push_upstream: None,
                    tenant_header,
                    tenant_label,
                    pushes: LabelPushes::default(),
                    enforces_label_policy: false,
                    client: client(a.tls.as_ref())?,
                    tls: a.tls.clone(),
                })
            }
            _ => None,
        };
        let tracing = (config.tracing.as_ref())
            .map(|tracing| Tracing::new(tracing, reuse, &metrics))
            .transpose()?;
        Ok(Self {
            routes: RouteTable::new(
                logs.is_some(),
                config.metrics.as_ref().map(MetricsConfig::scoping),
                alerts_target.is_some(),
            ),
            logs,
            metrics_target,
            alerts_target,
            tenants,
            auth: Authenticator::new(&config.auth, metrics.password_verifications.clone()),
            trusted_proxies: config.trusted_proxies.clone(),
            limits: config.limits.clone(),
            admission: Admission::new(
                config.limits.max_concurrent_requests,
                config.tenant_limits.clone(),
            )
            .with_metrics(metrics.clone()),
            body_workers: BodyWorkers::per_core(
                LargeBodyBytes::new(
                    metrics.large_body_bytes.clone(),
                    config.limits.max_large_body_bytes_held,
                ),
                LargeBodyMetrics {
                    count: metrics.large_bodies.clone(),
                    jobs: metrics.body_worker_jobs.clone(),
                },
            ),
            metrics,
            memo: Memo::new(config.metrics.as_ref().map_or(0, |m| m.query_cache_size)),
            tracing,
            tails: Arc::default(),
        })
    }

    pub(super) fn target(&self, route: &Route) -> Result<&Target, ProxyError> {
        let target = match route.signal {
            Signal::Logs => self.logs.as_ref(),
            Signal::Metrics => self.metrics_target.as_ref(),
            Signal::Alerts => self.alerts_target.as_ref(),
        };
        target.ok_or_else(|| ProxyError::Internal("route without an upstream".into()))
    }

    /// Reads a request body whole, within `limits.max_body_bytes`. What
    /// its connection's share does not cover is counted among the large
    /// bodies held while it arrives, and for as long as the count returned
    /// with it lives (a body worker takes it over, `BodyWorkers::run_held`).
    pub(super) async fn read_whole<B>(
        &self,
        body: body::Guarded<B>,
    ) -> Result<(Bytes, Option<GaugeHeld>), ReadError>
    where
        B: hyper::body::Body<Data = Bytes> + Unpin,
        B::Error: Into<BoxError>,
    {
        let (large, share) = (self.body_workers.bytes(), body.share().cloned());
        body::read_held(body, self.limits.max_body_bytes, large, share.as_ref()).await
    }
}
