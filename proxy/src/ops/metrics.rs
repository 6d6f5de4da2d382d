//! The proxy's own metrics, served on the admin listener. Names are
//! `tenant_proxy_*`; labels are bounded (tenant, surface, status class,
//! reason, kind): never a username, path or query.

use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// Empty before authentication succeeded.
    pub tenant: String,
    /// `logs_push`, `logs_query`, ... or `none` when no route matched.
    pub surface: &'static str,
    /// `2xx`, `4xx`, ...
    pub status_class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SurfaceLabels {
    pub surface: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLimitLabels {
    pub tenant: String,
    /// `query` or `push`.
    pub kind: &'static str,
    /// `requests_per_second`, `burst`, `concurrency`, `bytes_per_second`.
    pub limit: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabels {
    pub tenant: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantActionLabels {
    pub tenant: String,
    /// `added`, `overwritten` or `rejected`.
    pub action: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitedLabels {
    /// Empty for the global limit (before authentication).
    pub tenant: String,
    pub surface: &'static str,
    /// `rate`, `concurrency`, `bytes` or `global_concurrency`.
    pub limit: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `sent` or `failed`.
    pub outcome: &'static str,
}

#[derive(Clone)]
pub struct LatencyHistogram;

impl MetricConstructor<Histogram> for LatencyHistogram {
    fn new_metric(&self) -> Histogram {
        // 1 ms .. ~65 s
        Histogram::new(exponential_buckets(0.001, 2.0, 17))
    }
}

/// Every surface a route has (`Route::surface`), the most requested first.
pub const SURFACES: [&str; 11] = [
    "logs_query",
    "metrics_query",
    "logs_push",
    "metrics_push",
    "logs_otlp",
    "metrics_otlp",
    "logs_tail",
    "logs_rules",
    "metrics_rules",
    "alerts",
    "logs_delete",
];

/// `upstream_duration_seconds`, each surface's histogram taken from the
/// family once: the family keeps them in a map behind a lock, hashed with
/// SipHash, which cost every request a hash and two writes to a lock the
/// other workers write too (docs/benchmarks.md).
pub struct UpstreamDurations {
    family: Family<SurfaceLabels, Histogram, LatencyHistogram>,
    by_surface: [OnceLock<Histogram>; SURFACES.len()],
}

impl UpstreamDurations {
    fn new(family: Family<SurfaceLabels, Histogram, LatencyHistogram>) -> Self {
        Self {
            family,
            by_surface: Default::default(),
        }
    }

    pub fn observe(&self, surface: &'static str, seconds: f64) {
        let labels = || SurfaceLabels { surface };
        match SURFACES.iter().position(|known| *known == surface) {
            Some(index) => self.by_surface[index]
                .get_or_init(|| self.family.get_or_create_owned(&labels()))
                .observe(seconds),
            // Not listed (a test keeps this from happening): the slow way.
            None => self.family.get_or_create(&labels()).observe(seconds),
        }
    }
}

/// An amount in `gauge` for as long as it lives (a live tail, a large
/// body in a body worker's care, its bytes): taken out again on every path
/// out, an early return or a cancelled future among them.
#[derive(Debug)]
pub struct GaugeHeld {
    gauge: Gauge,
    amount: i64,
}

impl GaugeHeld {
    /// One, added now.
    pub fn new(gauge: &Gauge) -> Self {
        gauge.inc();
        Self::added(gauge, 1)
    }

    /// `amount`, already added to `gauge` (as a bound was checked).
    pub fn added(gauge: &Gauge, amount: i64) -> Self {
        Self {
            gauge: gauge.clone(),
            amount,
        }
    }

    /// What it holds.
    pub fn amount(&self) -> i64 {
        self.amount
    }

    /// Holds `more`, already added to the gauge (as a bound was checked).
    pub fn grow(&mut self, more: i64) {
        self.amount += more;
    }
}

impl Drop for GaugeHeld {
    fn drop(&mut self) {
        self.gauge.dec_by(self.amount);
    }
}

pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub auth_failures: Family<ReasonLabels, Counter>,
    pub password_verifications: Counter,
    pub limited: Family<LimitedLabels, Counter>,
    /// Each tenant's limits as this replica enforces them (its share in
    /// `global` scope; 0 is unlimited), once the tenant has been seen.
    pub tenant_limit: Family<TenantLimitLabels, Gauge<f64, AtomicU64>>,
    /// What this replica divides limits by: the tenants file's `replicas`
    /// in `global` scope, 1 in `replica` scope.
    pub limit_replicas: Gauge,
    /// Client connections open on the tenant listener, against
    /// `connection_limit` (`limits.max_connections`).
    pub client_connections: Gauge,
    pub connection_limit: Gauge,
    /// Client connections closed on arrival: their address had
    /// `limits.max_connections_per_address` open.
    pub client_connections_refused: Counter,
    pub errors: Family<ReasonLabels, Counter>,
    pub upstream_duration: UpstreamDurations,
    pub tenants_generation: Gauge,
    pub tenants_loaded: Gauge,
    pub credentials_loaded: Gauge,
    pub reload_failures: Counter,
    pub tls_reload_failures: Counter,
    pub upstream_replays: Counter,
    pub last_reload_success: Gauge,
    pub last_reload_timestamp: Gauge<f64, AtomicU64>,
    pub remote_write_series: Family<TenantLabels, Counter>,
    pub remote_write_samples: Family<TenantLabels, Counter>,
    pub remote_write_bytes: Family<TenantLabels, Counter>,
    pub remote_write_tenant_label: Family<TenantActionLabels, Counter>,
    pub remote_write_decode_errors: Family<TenantLabels, Counter>,
    pub remote_write_dropped_fields: Family<TenantLabels, Counter>,
    pub remote_write_unconfirmed: Family<TenantLabels, Counter>,
    pub otlp_data_points: Family<TenantLabels, Counter>,
    pub otlp_received_bytes: Family<TenantLabels, Counter>,
    pub otlp_tenant_label: Family<TenantActionLabels, Counter>,
    pub otlp_decode_errors: Family<TenantLabels, Counter>,
    pub otlp_dropped_fields: Family<TenantLabels, Counter>,
    pub rule_tenant_label: Family<TenantActionLabels, Counter>,
    pub trace_exports: Family<OutcomeLabels, Counter>,
    /// Live tails spliced to Loki now, and those closed because the
    /// tenants file no longer granted their credential.
    pub live_tails: Gauge,
    pub live_tails_revoked: Counter,
    /// Large bodies in the body workers' care, and the bytes of large
    /// bodies held (arriving too).
    pub large_bodies: Gauge,
    pub large_body_bytes: Gauge,
    pub body_worker_jobs: Counter,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("tenant_proxy");
        let requests = Family::default();
        registry.register(
            "requests",
            "Requests answered, by tenant, surface and status class",
            requests.clone(),
        );
        let auth_failures = Family::default();
        registry.register(
            "auth_failures",
            "Failed authentications by reason",
            auth_failures.clone(),
        );
        let password_verifications = Counter::default();
        registry.register(
            "password_verifications",
            "argon2 verifications run (authentications the cache could not answer)",
            password_verifications.clone(),
        );
        let limited = Family::default();
        registry.register(
            "limited",
            "Requests refused by a tenant limit or the global concurrency limit",
            limited.clone(),
        );
        let tenant_limit = Family::default();
        registry.register(
            "tenant_limit",
            "A tenant's limit as this replica enforces it (0: unlimited)",
            tenant_limit.clone(),
        );
        let limit_replicas = Gauge::default();
        registry.register(
            "limit_replicas",
            "Replicas this one divides tenant limits by (tenant_limits.scope: global), else 1",
            limit_replicas.clone(),
        );
        let client_connections = Gauge::default();
        registry.register(
            "client_connections",
            "Client connections open on the tenant listener",
            client_connections.clone(),
        );
        let connection_limit = Gauge::default();
        registry.register(
            "connection_limit",
            "Client connections the tenant listener keeps open at most (limits.max_connections)",
            connection_limit.clone(),
        );
        let client_connections_refused = Counter::default();
        registry.register(
            "client_connections_refused",
            "Client connections closed on arrival because their address had \
             limits.max_connections_per_address open",
            client_connections_refused.clone(),
        );
        let errors = Family::default();
        registry.register(
            "errors",
            "Requests the proxy answered with an error of its own, by kind",
            errors.clone(),
        );
        let upstream_duration = Family::new_with_constructor(LatencyHistogram);
        registry.register(
            "upstream_duration_seconds",
            "Time until the upstream's response head, by surface",
            upstream_duration.clone(),
        );
        let upstream_duration = UpstreamDurations::new(upstream_duration);
        let tenants_generation = Gauge::default();
        registry.register(
            "tenants_generation",
            "Generation of the tenants file in force (0: none loaded)",
            tenants_generation.clone(),
        );
        let tenants_loaded = Gauge::default();
        registry.register("tenants", "Tenants in force", tenants_loaded.clone());
        let credentials_loaded = Gauge::default();
        registry.register(
            "credentials",
            "Credentials in force",
            credentials_loaded.clone(),
        );
        let reload_failures = Counter::default();
        registry.register(
            "tenants_reload_failures",
            "Tenants file loads that failed (the previous generation stayed in force)",
            reload_failures.clone(),
        );
        let tls_reload_failures = Counter::default();
        registry.register(
            "tls_reload_failures",
            "Changed TLS files that failed to load (the previous certificate stayed in force)",
            tls_reload_failures.clone(),
        );
        let upstream_replays = Counter::default();
        registry.register(
            "upstream_replays",
            "Safe requests sent again on a new upstream connection: the one they went out on \
             had been idle and the upstream closed it before answering",
            upstream_replays.clone(),
        );
        let last_reload_success = Gauge::default();
        registry.register(
            "tenants_last_reload_success",
            "1 if the last tenants file load succeeded, else 0",
            last_reload_success.clone(),
        );
        let last_reload_timestamp = Gauge::default();
        registry.register(
            "tenants_last_reload_timestamp_seconds",
            "Unix time of the last tenants file load attempt",
            last_reload_timestamp.clone(),
        );
        let remote_write_series = Family::default();
        registry.register(
            "remote_write_series",
            "Series received on remote write, by tenant",
            remote_write_series.clone(),
        );
        let remote_write_samples = Family::default();
        registry.register(
            "remote_write_samples",
            "Float samples received on remote write, by tenant",
            remote_write_samples.clone(),
        );
        let remote_write_bytes = Family::default();
        registry.register(
            "remote_write_received_bytes",
            "Compressed remote-write bytes received, by tenant",
            remote_write_bytes.clone(),
        );
        let remote_write_tenant_label = Family::default();
        registry.register(
            "remote_write_tenant_label",
            "Series whose tenant label the proxy added, overwrote or rejected",
            remote_write_tenant_label.clone(),
        );
        let remote_write_decode_errors = Family::default();
        registry.register(
            "remote_write_decode_errors",
            "Remote-write bodies refused as undecodable, oversized or unsupported",
            remote_write_decode_errors.clone(),
        );
        let remote_write_dropped_fields = Family::default();
        registry.register(
            "remote_write_dropped_fields",
            "Fields inside remote-write series that no schema defines, removed before forwarding",
            remote_write_dropped_fields.clone(),
        );
        let remote_write_unconfirmed = Family::default();
        registry.register(
            "remote_write_unconfirmed",
            "Remote writes 2.0 the upstream answered 2xx without confirming what it stored, answered 415",
            remote_write_unconfirmed.clone(),
        );
        let otlp_data_points = Family::default();
        registry.register(
            "otlp_data_points",
            "OTLP metric data points relabelled for a tenant (label mode)",
            otlp_data_points.clone(),
        );
        let otlp_received_bytes = Family::default();
        registry.register(
            "otlp_received_bytes",
            "OTLP metrics request bytes as received, compressed or not (label mode)",
            otlp_received_bytes.clone(),
        );
        let otlp_tenant_label = Family::default();
        registry.register(
            "otlp_tenant_label",
            "OTLP data points and resources whose tenant label the proxy added, overwrote or rejected",
            otlp_tenant_label.clone(),
        );
        let otlp_decode_errors = Family::default();
        registry.register(
            "otlp_decode_errors",
            "OTLP metrics requests refused as undecodable, oversized or unsupported",
            otlp_decode_errors.clone(),
        );
        let otlp_dropped_fields = Family::default();
        registry.register(
            "otlp_dropped_fields",
            "Fields on the way to OTLP attributes that the schema does not define, removed before forwarding",
            otlp_dropped_fields.clone(),
        );
        let rule_tenant_label = Family::default();
        registry.register(
            "rule_tenant_label",
            "Loki rules (and group labels) whose tenant label the proxy added, overwrote or rejected (label mode)",
            rule_tenant_label.clone(),
        );
        let trace_exports = Family::default();
        registry.register(
            "trace_exports",
            "OTLP span exports sent to the collector (2xx) or failed (error, timeout, non-2xx)",
            trace_exports.clone(),
        );
        let live_tails = Gauge::default();
        registry.register(
            "live_tails",
            "Live tails (WebSockets) spliced to Loki now",
            live_tails.clone(),
        );
        let live_tails_revoked = Counter::default();
        registry.register(
            "live_tails_revoked",
            "Live tails closed because the tenants file no longer grants their credential",
            live_tails_revoked.clone(),
        );
        let large_bodies = Gauge::default();
        registry.register(
            "large_bodies",
            "Bodies read whole of 256 KiB or more (or inflating to 2 MiB or more), waiting for a body worker or being worked on by one",
            large_bodies.clone(),
        );
        let large_body_bytes = Gauge::default();
        registry.register(
            "large_body_bytes",
            "Bytes of bodies read whole held: requests' beyond the first 64 KiB of each connection's, as they arrive and until checked, and those counted in tenant_proxy_large_bodies; limits.max_large_body_bytes_held bounds them",
            large_body_bytes.clone(),
        );
        let body_worker_jobs = Counter::default();
        registry.register(
            "body_worker_jobs",
            "Steps on large bodies handed to a body worker",
            body_worker_jobs.clone(),
        );
        Self {
            registry,
            requests,
            auth_failures,
            password_verifications,
            limited,
            tenant_limit,
            limit_replicas,
            client_connections,
            connection_limit,
            client_connections_refused,
            errors,
            upstream_duration,
            tenants_generation,
            tenants_loaded,
            credentials_loaded,
            reload_failures,
            tls_reload_failures,
            upstream_replays,
            last_reload_success,
            last_reload_timestamp,
            remote_write_series,
            remote_write_samples,
            remote_write_bytes,
            remote_write_tenant_label,
            remote_write_decode_errors,
            remote_write_dropped_fields,
            remote_write_unconfirmed,
            otlp_data_points,
            otlp_received_bytes,
            otlp_tenant_label,
            otlp_decode_errors,
            otlp_dropped_fields,
            rule_tenant_label,
            trace_exports,
            live_tails,
            live_tails_revoked,
            large_bodies,
            large_body_bytes,
            body_worker_jobs,
        }
    }
}

/// One tenant's series of `requests`, by surface and status class, kept
/// once used (with the tenant, `Tenant::request_counters`). Looking the
/// label set up in the family hashes the tenant's name on every request,
/// about 1.5 % of a Loki request's instructions (callgrind); the family
/// never drops a series, so a kept counter is the one exported.
#[derive(Debug, Default)]
pub struct TenantRequestCounters(Mutex<Vec<(&'static str, &'static str, Counter)>>);

impl Metrics {
    /// Counts a finished request; `tenant` once it was authenticated.
    pub fn count_request(
        &self,
        tenant: Option<(&str, &TenantRequestCounters)>,
        surface: &'static str,
        status_class: &'static str,
    ) {
        let labels = |tenant: &str| RequestLabels {
            tenant: tenant.to_owned(),
            surface,
            status_class,
        };
        let Some((tenant, kept)) = tenant else {
            self.requests.get_or_create(&labels("")).inc();
            return;
        };
        let mut kept = kept.0.lock().unwrap_or_else(|e| e.into_inner());
        match kept
            .iter()
            .find(|(s, c, _)| *s == surface && *c == status_class)
        {
            Some((_, _, counter)) => {
                counter.inc();
            }
            None => {
                let counter = self.requests.get_or_create(&labels(tenant)).clone();
                counter.inc();
                kept.push((surface, status_class, counter));
            }
        }
    }

    pub fn count_limited(
        &self,
        tenant: Option<&str>,
        surface: Option<&'static str>,
        limit: &'static str,
    ) {
        let labels = LimitedLabels {
            tenant: tenant.unwrap_or_default().to_owned(),
            surface: surface.unwrap_or("none"),
            limit,
        };
        self.limited.get_or_create(&labels).inc();
    }

    pub fn encode(&self) -> String {
        encode_registry(&self.registry)
    }

    pub fn record_reload(&self, success: bool) {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        self.last_reload_timestamp.set(now.as_secs_f64());
        self.last_reload_success.set(i64::from(success));
        if !success {
            self.reload_failures.inc();
        }
    }
}

/// OpenMetrics text of a registry (both binaries' `/metrics`).
pub fn encode_registry(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry)
        .expect("writing to a String cannot fail");
    out
}

pub fn status_class(status: http::StatusCode) -> &'static str {
    match status.as_u16() {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenants_kept_counters_count_into_the_exported_series() {
        let metrics = Metrics::default();
        let (a, b) = (
            TenantRequestCounters::default(),
            TenantRequestCounters::default(),
        );
        for _ in 0..3 {
            metrics.count_request(Some(("team-a", &a)), "logs_query", "2xx");
        }
        metrics.count_request(Some(("team-a", &a)), "logs_query", "5xx");
        metrics.count_request(Some(("team-a", &a)), "metrics_query", "2xx");
        metrics.count_request(Some(("team-b", &b)), "logs_query", "2xx");
        metrics.count_request(None, "none", "4xx");
        let text = metrics.encode();
        for series in [
            r#"tenant_proxy_requests_total{tenant="team-a",surface="logs_query",status_class="2xx"} 3"#,
            r#"tenant_proxy_requests_total{tenant="team-a",surface="logs_query",status_class="5xx"} 1"#,
            r#"tenant_proxy_requests_total{tenant="team-a",surface="metrics_query",status_class="2xx"} 1"#,
            r#"tenant_proxy_requests_total{tenant="team-b",surface="logs_query",status_class="2xx"} 1"#,
            r#"tenant_proxy_requests_total{tenant="",surface="none",status_class="4xx"} 1"#,
        ] {
            assert!(text.contains(series), "{series} in\n{text}");
        }
    }

    #[test]
    fn statuses_are_counted_by_their_class() {
        for (status, class) in [
            (100, "1xx"),
            (101, "1xx"),
            (199, "1xx"),
            (200, "2xx"),
            (299, "2xx"),
            (300, "3xx"),
            (399, "3xx"),
            (400, "4xx"),
            (499, "4xx"),
            (500, "5xx"),
            (599, "5xx"),
            (999, "5xx"),
        ] {
            let status = http::StatusCode::from_u16(status).unwrap();
            assert_eq!(status_class(status), class, "{status}");
        }
    }

    #[test]
    fn upstream_durations_are_observed_under_their_own_surface() {
        let metrics = Metrics::default();
        metrics.upstream_duration.observe("metrics_push", 0.0015);
        metrics.upstream_duration.observe("metrics_push", 3.0);
        metrics.upstream_duration.observe("logs_query", 0.0005);
        // Not in `SURFACES`: the slow way, still under its own name.
        metrics.upstream_duration.observe("unlisted", 0.25);
        let text = metrics.encode();
        for series in [
            r#"tenant_proxy_upstream_duration_seconds_count{surface="metrics_push"} 2"#,
            r#"tenant_proxy_upstream_duration_seconds_sum{surface="metrics_push"} 3.0015"#,
            r#"tenant_proxy_upstream_duration_seconds_bucket{le="0.002",surface="metrics_push"} 1"#,
            r#"tenant_proxy_upstream_duration_seconds_bucket{le="4.096",surface="metrics_push"} 2"#,
            r#"tenant_proxy_upstream_duration_seconds_count{surface="logs_query"} 1"#,
            r#"tenant_proxy_upstream_duration_seconds_bucket{le="0.001",surface="logs_query"} 1"#,
            r#"tenant_proxy_upstream_duration_seconds_count{surface="unlisted"} 1"#,
        ] {
            assert!(text.contains(series), "{series} in\n{text}");
        }
        assert_eq!(
            text.matches("tenant_proxy_upstream_duration_seconds_count{")
                .count(),
            3,
            "no other surface observed: {text}"
        );
    }
}
