//! The proxy's configuration file: parsed (unknown keys are errors), then
//! validated, then handed to `serve`. Every field says why it exists.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::header::{HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::Uri;
use serde::Deserialize;

use crate::http::headers;

#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct ConfigError {
    pub path: String,
    pub message: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where tenants' traffic (Grafana, push agents) arrives.
    pub listen: SocketAddr,
    /// `/metrics`, `/healthz`, `/readyz`; kept apart so tenants cannot reach them.
    pub admin_listen: SocketAddr,
    /// The tenants file (written by tenant-sync or by hand). A relative path is
    /// taken from the directory of the config file.
    pub tenants_file: PathBuf,
    /// How often the tenants file is re-read even without a file-system event
    /// (Kubernetes volume updates swap symlinks, which watchers can miss).
    #[serde(default = "defaults::poll_interval", with = "humantime_serde")]
    pub tenants_poll_interval: Duration,
    /// The Loki upstream. Absent: no log routes are served.
    pub logs: Option<LogsConfig>,
    /// The Prometheus/Mimir upstream. Absent: no metric routes are served.
    pub metrics: Option<MetricsConfig>,
    /// An Alertmanager, scoped like the metrics it alerts on: a vanilla one
    /// by `metrics.label` (label mode), Mimir's by `metrics.header` (header
    /// mode). Absent: no Alertmanager routes are served.
    pub alerts: Option<AlertsConfig>,
    #[serde(default)]
    pub limits: Limits,
    /// TLS on the tenant listener; absent: plain HTTP (terminate TLS in
    /// front, or set this).
    pub tls: Option<TlsConfig>,
    /// Per-tenant request rates, concurrency and push bytes: off unless set.
    #[serde(default)]
    pub tenant_limits: TenantLimitsConfig,
    #[serde(default)]
    pub auth: AuthConfig,
    /// OpenTelemetry spans over OTLP/HTTP; absent: none are made.
    pub tracing: Option<TracingConfig>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TracingConfig {
    /// The collector's OTLP/HTTP traces URL, e.g.
    /// `http://otel-collector:4318/v1/traces` (protobuf is sent; https://
    /// trusts the system's CA certificates unless `tls.ca_file` is set).
    pub otlp_endpoint: String,
    /// `service.name` on every span.
    #[serde(default = "defaults::service_name")]
    pub service_name: String,
    /// Share of new traces recorded. A request that arrives with a
    /// `traceparent` follows its sender's sampling decision instead.
    #[serde(default = "defaults::sample_ratio")]
    pub sample_ratio: f64,
    /// How often finished spans are sent to the collector.
    #[serde(default = "defaults::export_interval", with = "humantime_serde")]
    pub export_interval: Duration,
    /// How long one export may take before it is abandoned (the spans are dropped,
    /// requests are never held up by the collector).
    #[serde(default = "defaults::export_timeout", with = "humantime_serde")]
    pub export_timeout: Duration,
    /// TLS to an `https://` collector: a private CA, a client certificate,
    /// a server name; reloaded like an upstream's.
    pub tls: Option<UpstreamTls>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM certificate chain, leaf first. Relative paths start at the
    /// config file's directory, like `tenants_file`.
    pub cert_file: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// PEM CA bundle: when set, clients must present a certificate it
    /// signed (in addition to basic auth).
    pub client_ca_file: Option<PathBuf>,
    /// How often the files are checked for changes.
    #[serde(default = "defaults::tls_reload_interval", with = "humantime_serde")]
    pub reload_interval: Duration,
}

/// What one tenant may do on the shared backends, per kind of request.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantLimitsConfig {
    /// Every tenant's limits, unless overridden.
    #[serde(default)]
    pub default: TenantLimits,
    /// By tenant id; a kind left out keeps the default's. These win over
    /// limits the tenants file carries (from Namespace annotations).
    #[serde(default)]
    pub overrides: std::collections::BTreeMap<String, TenantLimitsOverride>,
    /// Whether each replica enforces the limits whole, or its share of them.
    #[serde(default)]
    pub scope: LimitScope,
}

/// Where a tenant's limits hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LimitScope {
    /// Each replica enforces every limit whole: N replicas admit N times it.
    #[default]
    Replica,
    /// Each replica enforces every rate and concurrency limit divided by the
    /// number of ready replicas, as the tenants file's `replicas` says.
    Global,
}

#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantLimits {
    /// Queries, label and series calls, rules, tails.
    #[serde(default)]
    pub query: RequestLimits,
    /// Loki pushes and remote write.
    #[serde(default)]
    pub push: RequestLimits,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct TenantLimitsOverride {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub query: Option<RequestLimits>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub push: Option<RequestLimits>,
}

impl TenantLimitsOverride {
    /// The strictest of two: per kind and field, the smallest limit that
    /// is set (0 means unlimited, so it yields to any other value).
    pub fn strictest(self, other: Self) -> Self {
        let kind = |a: Option<RequestLimits>, b: Option<RequestLimits>| match (a, b) {
            (Some(a), Some(b)) => Some(a.strictest(b)),
            (a, b) => a.or(b),
        };
        Self {
            query: kind(self.query, other.query),
            push: kind(self.push, other.push),
        }
    }
}

/// Zero means unlimited, for each field on its own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct RequestLimits {
    /// Sustained requests per second (a token bucket).
    #[serde(default)]
    pub requests_per_second: f64,
    /// Requests allowed at once above the rate; default: one second's worth.
    #[serde(default)]
    pub burst: u32,
    /// Requests in flight at once.
    #[serde(default)]
    pub concurrency: u32,
    /// Request body bytes per second (push only); a request may overdraw
    /// the allowance once, and the next waits until it is paid back.
    #[serde(default)]
    pub bytes_per_second: u64,
}

/// An upstream's `tls` needs an https:// URL to apply to, and a client
/// certificate needs its key.
fn check_upstream_tls(section: &str, https: bool, tls: Option<&UpstreamTls>) -> Result<(), String> {
    match tls {
        Some(_) if !https => Err(format!(
            "{section}.tls is set but no {section} upstream is https://"
        )),
        Some(tls) if tls.cert_file.is_some() != tls.key_file.is_some() => {
            Err(format!("{section}.tls: cert_file and key_file go together"))
        }
        _ => Ok(()),
    }
}

impl TracingConfig {
    fn validate(&self) -> Result<(), String> {
        let uri: Uri = self
            .otlp_endpoint
            .parse()
            .map_err(|e| format!("tracing.otlp_endpoint: {e}"))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
            return Err("tracing.otlp_endpoint must be an http:// or https:// URL".into());
        }
        check_upstream_tls(
            "tracing",
            uri.scheme_str() == Some("https"),
            self.tls.as_ref(),
        )?;
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            return Err("tracing.sample_ratio must be between 0 and 1".into());
        }
        if self.export_interval.is_zero() || self.export_timeout.is_zero() {
            return Err("tracing.export_interval and export_timeout must be above zero".into());
        }
        Ok(())
    }
}

impl TenantLimitsConfig {
    /// A tenant's limits, in order of precedence: the config's override,
    /// then `from_file` (the tenants file's, set from Namespace
    /// annotations), then the config's default; per kind of request.
    pub fn for_tenant(
        &self,
        tenant: &str,
        from_file: Option<&TenantLimitsOverride>,
    ) -> TenantLimits {
        let mut limits = self.default;
        for o in from_file.into_iter().chain(self.overrides.get(tenant)) {
            limits.query = o.query.unwrap_or(limits.query);
            limits.push = o.push.unwrap_or(limits.push);
        }
        limits
    }

    fn validate(&self) -> Result<(), String> {
        self.default.validate("tenant_limits.default")?;
        for (tenant, o) in &self.overrides {
            o.validate(&format!("tenant_limits.overrides.{tenant}"))?;
        }
        Ok(())
    }
}

impl TenantLimits {
    fn validate(&self, at: &str) -> Result<(), String> {
        self.query.validate(&format!("{at}.query"), false)?;
        self.push.validate(&format!("{at}.push"), true)
    }
}

impl TenantLimitsOverride {
    /// The checks the config's own limits get; `at` names the place.
    pub fn validate(&self, at: &str) -> Result<(), String> {
        if let Some(query) = &self.query {
            query.validate(&format!("{at}.query"), false)?;
        }
        if let Some(push) = &self.push {
            push.validate(&format!("{at}.push"), true)?;
        }
        Ok(())
    }
}

impl RequestLimits {
    fn strictest(self, other: Self) -> Self {
        fn min_set<T: PartialOrd + Default + Copy>(a: T, b: T) -> T {
            let unset = T::default();
            match (a == unset, b == unset) {
                (true, _) => b,
                (_, true) => a,
                _ if b < a => b,
                _ => a,
            }
        }
        Self {
            requests_per_second: min_set(self.requests_per_second, other.requests_per_second),
            burst: min_set(self.burst, other.burst),
            concurrency: min_set(self.concurrency, other.concurrency),
            bytes_per_second: min_set(self.bytes_per_second, other.bytes_per_second),
        }
    }

    /// `bytes`: whether a byte rate applies (pushes only).
    fn validate(&self, at: &str, bytes: bool) -> Result<(), String> {
        if !(self.requests_per_second.is_finite() && self.requests_per_second >= 0.0) {
            return Err(format!("{at}.requests_per_second must be 0 or more"));
        }
        if !bytes && self.bytes_per_second > 0 {
            return Err(format!("{at}.bytes_per_second applies to push only"));
        }
        Ok(())
    }

    /// This replica's share of a limit that holds across `replicas`: rates
    /// divided; a concurrency or burst rounded up, so a limit never
    /// becomes 0 (which means unlimited) on a replica.
    pub fn share(self, replicas: u32) -> Self {
        let n = replicas.max(1);
        let part = |v: u32| if v == 0 { 0 } else { v.div_ceil(n) };
        Self {
            requests_per_second: self.requests_per_second / f64::from(n),
            burst: part(self.burst),
            concurrency: part(self.concurrency),
            bytes_per_second: self.bytes_per_second.div_ceil(u64::from(n)),
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogsConfig {
    /// Base URL of Loki (or its query frontend/gateway), may carry a path prefix.
    pub upstream: Upstream,
    /// Loki runs with `lbac.enabled: true` (3.7.3 and later, experimental),
    /// so credentials restricted by a `selector` may read logs, enforced by
    /// Loki through `X-Prom-Label-Policy`. Without it such credentials get
    /// 403 on every log route: a Loki that ignores the header would show
    /// them the whole tenant.
    #[serde(default)]
    pub lbac: bool,
    /// For an `https://` upstream.
    pub tls: Option<UpstreamTls>,
}

/// How the proxy connects to an `https://` upstream. Files are re-read
/// when they change (`reload_interval`); new connections use them.
#[derive(Clone, Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct UpstreamTls {
    /// PEM CA bundle to verify the upstream with; default: the system's roots.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate and key, for upstreams that require one.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// The name the upstream's certificate must carry, when it is not the
    /// URL's host (an IP address, or a Service name the certificate lacks).
    pub server_name: Option<String>,
    #[serde(default = "defaults::tls_reload_interval", with = "humantime_serde")]
    pub reload_interval: Duration,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Base URL of Prometheus, Thanos Querier, Mimir or Cortex; may carry a
    /// path prefix such as Mimir's `/prometheus`.
    pub upstream: Upstream,
    /// Base URL for pushes (`/api/v1/write`, `/api/v1/push`) when they go
    /// elsewhere: Mimir answers queries under `/prometheus` but takes
    /// pushes at `/api/v1/push`. Default: `upstream`.
    #[serde(default)]
    pub push_upstream: Option<Upstream>,
    /// `label`: rewrite PromQL and pushed series (Prometheus, Thanos Querier).
    /// `header`: set the tenant header (Mimir, Cortex, Thanos Receive).
    #[serde(default)]
    pub mode: MetricsMode,
    /// The label whose values a tenant owns (its `namespaces`), in label mode.
    #[serde(default = "defaults::tenant_label")]
    pub label: String,
    /// The tenant header in header mode (`THANOS-TENANT` for Thanos).
    #[serde(default = "defaults::tenant_header")]
    pub header: String,
    /// Label mode, remote write: what to do with a pushed series whose tenant
    /// label names a value the tenant does not own.
    #[serde(default)]
    pub foreign_label: ForeignLabelPolicy,
    /// Label mode, OTLP metrics: how a relabelled body is forwarded.
    #[serde(default)]
    pub otlp_forward_encoding: OtlpForwardEncoding,
    /// Label mode: how many enforced queries and selectors are remembered
    /// (with a quarter as many query shapes); 0 remembers none, at most
    /// [`MAX_QUERY_CACHE_SIZE`].
    #[serde(default = "defaults::query_cache_size")]
    pub query_cache_size: usize,
    /// For an `https://` upstream (both `upstream` and `push_upstream`).
    pub tls: Option<UpstreamTls>,
}

/// The largest `metrics.query_cache_size`: at 3 KiB of text per query
/// and per shape (a quarter as many), the memo holds at most 370 MiB.
pub const MAX_QUERY_CACHE_SIZE: usize = 100_000;

/// How label mode forwards an OTLP metrics body it relabelled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OtlpForwardEncoding {
    /// gzip if the client sent gzip (recompressed), else uncompressed.
    #[default]
    AsReceived,
    /// Uncompressed: gzip's recompression is about a third of the proxy's
    /// CPU on this path; the upstream link carries ~5× the bytes.
    Identity,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertsConfig {
    /// Base URL of the Alertmanager (vanilla: its `/api/v2` is under it) or
    /// of Mimir (its Alertmanager at `/alertmanager/api/v2`).
    pub upstream: Upstream,
    /// For an `https://` upstream.
    pub tls: Option<UpstreamTls>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ForeignLabelPolicy {
    /// Replace it with the tenant's first namespace.
    #[default]
    Overwrite,
    /// Refuse the whole request (400) naming the series.
    Reject,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MetricsMode {
    #[default]
    Label,
    Header,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Largest request body forwarded (413 above it). Loki's default push
    /// limit is far lower per stream; 16 MiB covers large agent batches.
    #[serde(default = "defaults::max_body_bytes")]
    pub max_body_bytes: u64,
    /// Largest remote-write body after snappy decompression (413 above it),
    /// checked from the snappy header before anything is allocated.
    #[serde(default = "defaults::max_decompressed_bytes")]
    pub max_decompressed_bytes: u64,
    /// Largest request head (request line and headers) accepted.
    #[serde(default = "defaults::max_header_bytes")]
    pub max_header_bytes: usize,
    /// Most header fields in one request head (431 above it). Grafana,
    /// agents and shippers send a dozen or two; a flood of tiny fields costs
    /// parsing time the byte limit alone does not bound.
    #[serde(default = "defaults::max_header_count")]
    pub max_header_count: usize,
    /// How long a client may take to send its request head (or finish a
    /// TLS handshake); also closes keep-alive connections idle for that
    /// long, and tells any connection without a byte either way for one
    /// to two of these periods to finish (`http/connection.rs`).
    #[serde(default = "defaults::header_read_timeout", with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// How long a client may take to send its whole request body (408
    /// after): a slow sender must not hold a connection and a backend
    /// stream open indefinitely.
    #[serde(default = "defaults::body_read_timeout", with = "humantime_serde")]
    pub body_read_timeout: Duration,
    /// Requests in flight at once across all tenants (503 with Retry-After
    /// beyond); 0: unlimited.
    #[serde(default)]
    pub max_concurrent_requests: usize,
    /// Client connections open at once on a listener. Beyond it, new ones
    /// wait in the kernel's listen backlog until one ends: a flood of
    /// connections (no credentials needed to open one) must not take the
    /// proxy's memory (about 24 KiB an idle HTTP/1.1 connection) or its
    /// file descriptors, which its upstream connections need too.
    #[serde(default = "defaults::max_connections")]
    pub max_connections: usize,
    /// How long the upstream may take to answer with its response head (504 after).
    #[serde(default = "defaults::upstream_timeout", with = "humantime_serde")]
    pub upstream_timeout: Duration,
    /// How long in-flight requests may take to finish after SIGTERM.
    #[serde(default = "defaults::shutdown_grace", with = "humantime_serde")]
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body_bytes: defaults::max_body_bytes(),
            max_decompressed_bytes: defaults::max_decompressed_bytes(),
            max_header_bytes: defaults::max_header_bytes(),
            max_header_count: defaults::max_header_count(),
            header_read_timeout: defaults::header_read_timeout(),
            body_read_timeout: defaults::body_read_timeout(),
            max_concurrent_requests: 0,
            max_connections: defaults::max_connections(),
            upstream_timeout: defaults::upstream_timeout(),
            shutdown_grace: defaults::shutdown_grace(),
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// Verified (username, password) pairs remembered so argon2 runs once per
    /// credential, not per request.
    #[serde(default = "defaults::cache_size")]
    pub cache_size: usize,
    /// argon2 verifications running at once; each takes ~19 MiB and a core
    /// for tens of milliseconds. Default: the number of CPUs.
    #[serde(default = "defaults::max_concurrent_verifications")]
    pub max_concurrent_verifications: usize,
    /// How long a request waits for a verification slot before a 503.
    #[serde(default = "defaults::verification_wait", with = "humantime_serde")]
    pub verification_wait: Duration,
    /// Failed attempts per username within `failure_window` before further
    /// uncached attempts get 429.
    #[serde(default = "defaults::max_failures_per_user")]
    pub max_failures_per_user: u32,
    /// Failed attempts per client address within `failure_window` before 429.
    #[serde(default = "defaults::max_failures_per_client")]
    pub max_failures_per_client: u32,
    #[serde(default = "defaults::failure_window", with = "humantime_serde")]
    pub failure_window: Duration,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            cache_size: defaults::cache_size(),
            max_concurrent_verifications: defaults::max_concurrent_verifications(),
            verification_wait: defaults::verification_wait(),
            max_failures_per_user: defaults::max_failures_per_user(),
            max_failures_per_client: defaults::max_failures_per_client(),
            failure_window: defaults::failure_window(),
        }
    }
}

mod defaults {
    use std::time::Duration;

    pub fn poll_interval() -> Duration {
        Duration::from_secs(5)
    }
    pub fn tenant_label() -> String {
        "namespace".into()
    }
    pub fn tenant_header() -> String {
        "X-Scope-OrgID".into()
    }
    pub fn query_cache_size() -> usize {
        10_000
    }
    pub fn max_body_bytes() -> u64 {
        16 * 1024 * 1024
    }
    pub fn max_decompressed_bytes() -> u64 {
        64 * 1024 * 1024
    }
    pub fn max_header_bytes() -> usize {
        64 * 1024
    }
    pub fn service_name() -> String {
        "tenant-proxy".into()
    }
    pub fn sample_ratio() -> f64 {
        1.0
    }
    pub fn export_interval() -> Duration {
        Duration::from_secs(5)
    }
    pub fn export_timeout() -> Duration {
        Duration::from_secs(10)
    }
    pub fn max_header_count() -> usize {
        100
    }
    pub fn max_connections() -> usize {
        4096
    }
    pub fn header_read_timeout() -> Duration {
        Duration::from_secs(30)
    }
    pub fn tls_reload_interval() -> Duration {
        Duration::from_secs(30)
    }
    pub fn body_read_timeout() -> Duration {
        Duration::from_secs(60)
    }
    pub fn upstream_timeout() -> Duration {
        Duration::from_secs(120)
    }
    pub fn shutdown_grace() -> Duration {
        Duration::from_secs(30)
    }
    pub fn cache_size() -> usize {
        10_000
    }
    pub fn max_concurrent_verifications() -> usize {
        std::thread::available_parallelism().map_or(2, |n| n.get())
    }
    pub fn verification_wait() -> Duration {
        Duration::from_secs(5)
    }
    pub fn max_failures_per_user() -> u32 {
        10
    }
    pub fn max_failures_per_client() -> u32 {
        30
    }
    pub fn failure_window() -> Duration {
        Duration::from_secs(60)
    }
}

// === impl Upstream ===

/// An upstream base URL: `http://host:port[/prefix]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upstream {
    pub scheme: http::uri::Scheme,
    pub authority: http::uri::Authority,
    /// Without a trailing `/`; empty when there is no prefix.
    pub path_prefix: String,
    /// The `Host` header for this upstream, made once instead of per request.
    pub host: Option<HeaderValue>,
}

impl Upstream {
    pub fn parse(raw: &str) -> Result<Self, String> {
        let uri: Uri = raw
            .parse()
            .map_err(|e| format!("invalid URL {raw:?}: {e}"))?;
        let scheme = uri
            .scheme()
            .cloned()
            .ok_or("upstream URL needs http:// or https://")?;
        if scheme != http::uri::Scheme::HTTP && scheme != http::uri::Scheme::HTTPS {
            return Err(format!(
                "upstream {raw:?}: only http:// and https:// are supported"
            ));
        }
        let authority = uri
            .authority()
            .cloned()
            .ok_or("upstream URL needs a host")?;
        if uri.query().is_some() {
            return Err(format!("upstream {raw:?} must not carry a query string"));
        }
        Ok(Self {
            host: headers::host_value(&scheme, &authority),
            scheme,
            authority,
            path_prefix: uri.path().trim_end_matches('/').to_owned(),
        })
    }

    /// The absolute URI for a normalised path and an optional query.
    pub fn uri_for(&self, path: &str, query: Option<&str>) -> Result<Uri, http::Error> {
        // Concatenated by hand: `format!`'s machinery was half of this
        // function's cost per request on the Loki path (perf).
        let length = self.path_prefix.len() + path.len() + query.map_or(0, |q| q.len() + 1);
        let mut path_and_query = String::with_capacity(length);
        path_and_query.push_str(&self.path_prefix);
        path_and_query.push_str(path);
        if let Some(q) = query {
            path_and_query.push('?');
            path_and_query.push_str(q);
        }
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(path_and_query)
            .build()
    }

    /// `uri_for`, taking the path and query the client sent (`received`)
    /// as they are when they are exactly what `uri_for` would write: no
    /// prefix, the path unchanged by normalisation, the query not
    /// rewritten. hyper has validated them once already; building them
    /// again cost a second byte-by-byte validation (callgrind,
    /// docs/benchmarks.md).
    pub fn uri_reusing(
        &self,
        path: &str,
        query: Option<&str>,
        received: &Uri,
    ) -> Result<Uri, http::Error> {
        let same = |sent: &PathAndQuery| {
            let rest = sent.as_str().strip_prefix(path);
            match query {
                None => rest == Some(""),
                Some(query) => rest.and_then(|r| r.strip_prefix('?')) == Some(query),
            }
        };
        match received.path_and_query() {
            Some(sent) if self.path_prefix.is_empty() && same(sent) => {
                let mut parts = http::uri::Parts::default();
                parts.scheme = Some(self.scheme.clone());
                parts.authority = Some(self.authority.clone());
                parts.path_and_query = Some(sent.clone());
                Ok(Uri::from_parts(parts)?)
            }
            _ => self.uri_for(path, query),
        }
    }
}

impl<'de> Deserialize<'de> for Upstream {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        Upstream::parse(&raw).map_err(serde::de::Error::custom)
    }
}

// === loading ===

impl Config {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let error = |message: String| ConfigError {
            path: path.display().to_string(),
            message,
        };
        let text = std::fs::read_to_string(path).map_err(|e| error(e.to_string()))?;
        let mut config = Self::parse(&text).map_err(error)?;
        let base = path.parent().unwrap_or_else(|| Path::new("."));
        let resolve = |file: &mut PathBuf| {
            if file.is_relative() {
                *file = base.join(&*file);
            }
        };
        resolve(&mut config.tenants_file);
        if let Some(tls) = &mut config.tls {
            resolve(&mut tls.cert_file);
            resolve(&mut tls.key_file);
            if let Some(ca) = &mut tls.client_ca_file {
                resolve(ca);
            }
        }
        let upstream_tls = [
            config.logs.as_mut().and_then(|l| l.tls.as_mut()),
            config.metrics.as_mut().and_then(|m| m.tls.as_mut()),
            config.tracing.as_mut().and_then(|t| t.tls.as_mut()),
        ];
        for tls in upstream_tls.into_iter().flatten() {
            for file in [&mut tls.ca_file, &mut tls.cert_file, &mut tls.key_file]
                .into_iter()
                .flatten()
            {
                resolve(file);
            }
        }
        Ok(config)
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let config: Config = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
        config.validate()?;
        Ok(config)
    }

    /// Rules serde cannot express.
    fn validate(&self) -> Result<(), String> {
        if self.logs.is_none() && self.metrics.is_none() {
            return Err("configure at least one of `logs` and `metrics`".into());
        }
        if self.listen == self.admin_listen && self.listen.port() != 0 {
            return Err("`listen` and `admin_listen` must differ".into());
        }
        if let Some(metrics) = &self.metrics {
            if !is_label_name(&metrics.label) {
                return Err(format!(
                    "metrics.label {:?} is not a valid label name",
                    metrics.label
                ));
            }
            // Prometheus reserves `__` names for itself (`__name__`), and
            // an OTLP receiver passes `__…__` attribute names through
            // its own rules.
            if metrics.label.starts_with("__") {
                return Err(format!(
                    "metrics.label {:?} starts with `__`, which Prometheus reserves",
                    metrics.label
                ));
            }
            if SET_BY_THE_RECEIVER.contains(&metrics.label.as_str()) {
                return Err(format!(
                    "metrics.label {:?} is a label Prometheus sets itself (histogram \
                     buckets, summary quantiles, OTLP scope fields), which a tenant could \
                     not be held to",
                    metrics.label
                ));
            }
            HeaderName::from_bytes(metrics.header.as_bytes())
                .map_err(|_| format!("metrics.header {:?} is not a header name", metrics.header))?;
            // The memo's byte bounds grow with it: a slip of a few zeros
            // would let it hold gigabytes.
            if metrics.query_cache_size > MAX_QUERY_CACHE_SIZE {
                return Err(format!(
                    "metrics.query_cache_size must be at most {MAX_QUERY_CACHE_SIZE} \
                     (the memo may then hold about 370 MiB of text)"
                ));
            }
        }
        let upstreams = [
            self.logs
                .as_ref()
                .map(|l| ("logs", vec![&l.upstream], l.tls.as_ref())),
            self.metrics.as_ref().map(|m| {
                let all = std::iter::once(&m.upstream)
                    .chain(&m.push_upstream)
                    .collect();
                ("metrics", all, m.tls.as_ref())
            }),
            self.alerts
                .as_ref()
                .map(|a| ("alerts", vec![&a.upstream], a.tls.as_ref())),
        ];
        if self.alerts.is_some() && self.metrics.is_none() {
            return Err("`alerts` is scoped like `metrics`: configure `metrics` too".into());
        }
        for (section, urls, tls) in upstreams.into_iter().flatten() {
            let https = urls.iter().any(|u| u.scheme == http::uri::Scheme::HTTPS);
            check_upstream_tls(section, https, tls)?;
        }
        if self.limits.max_header_bytes < 8 * 1024 {
            return Err("limits.max_header_bytes must be at least 8192".into());
        }
        if let Some(tracing) = &self.tracing {
            tracing.validate()?;
        }
        if self.limits.max_header_count < 32 {
            return Err("limits.max_header_count must be at least 32".into());
        }
        if self.limits.max_connections == 0 {
            return Err("limits.max_connections must be at least 1".into());
        }
        if self.auth.max_concurrent_verifications == 0 {
            return Err("auth.max_concurrent_verifications must be at least 1".into());
        }
        self.tenant_limits.validate()
    }
}

/// Labels a Prometheus receiver writes from a series' own fields rather
/// than from what the pusher labels: `le` and `quantile` on histogram
/// buckets and summary quantiles, and the OTLP scope's name, version and
/// schema URL (`promote_scope_metadata`), none of which the label rule
/// rewrites.
const SET_BY_THE_RECEIVER: [&str; 5] = [
    "le",
    "quantile",
    "otel_scope_name",
    "otel_scope_version",
    "otel_scope_schema_url",
];

pub(crate) fn is_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = "listen: 127.0.0.1:8080\nadmin_listen: 127.0.0.1:8081\ntenants_file: t.yaml\nlogs:\n  upstream: http://127.0.0.1:3100\n";

    #[test]
    fn minimal_config_gets_defaults() {
        let c = Config::parse(MINIMAL).unwrap();
        assert_eq!(c.limits.max_body_bytes, 16 * 1024 * 1024);
        assert_eq!(c.tenants_poll_interval, Duration::from_secs(5));
        assert_eq!(c.limits.max_connections, 4096);
        assert!(c.metrics.is_none());
    }

    #[test]
    fn a_listener_takes_at_least_one_connection() {
        let err = Config::parse(&format!("{MINIMAL}limits:\n  max_connections: 0\n")).unwrap_err();
        assert!(
            err.contains("limits.max_connections must be at least 1"),
            "{err}"
        );
        let c = Config::parse(&format!("{MINIMAL}limits:\n  max_connections: 1\n")).unwrap();
        assert_eq!(c.limits.max_connections, 1);
    }

    #[test]
    fn unknown_keys_name_their_line() {
        let err = Config::parse(&format!("{MINIMAL}colour: blue\n")).unwrap_err();
        assert!(
            err.contains("unknown field `colour`") && err.contains("line 6"),
            "{err}"
        );
    }

    proptest::proptest! {
        /// Taking the client's path and query as they came gives exactly
        /// the URI that building it gives, whether or not they match.
        #[test]
        fn reusing_the_received_uri_agrees_with_building_it(
            prefixed in proptest::bool::ANY,
            received in "/[a/?=]{0,8}",
            path in "/[a/]{0,4}",
            query in proptest::option::of("[a/?=]{0,4}"),
        ) {
            let upstream = Upstream::parse(if prefixed { "http://u:1/p" } else { "http://u:1" }).unwrap();
            let received: Uri = received.parse().unwrap();
            let reused = upstream.uri_reusing(&path, query.as_deref(), &received).unwrap();
            let built = upstream.uri_for(&path, query.as_deref()).unwrap();
            proptest::prop_assert_eq!(reused.to_string(), built.to_string());
        }
    }

    #[test]
    fn upstream_prefix_is_kept_without_trailing_slash() {
        let u = Upstream::parse("http://mimir:8080/prometheus/").unwrap();
        assert_eq!(u.path_prefix, "/prometheus");
        let uri = u.uri_for("/api/v1/query", Some("query=up")).unwrap();
        assert_eq!(
            uri.to_string(),
            "http://mimir:8080/prometheus/api/v1/query?query=up"
        );
        assert!(Upstream::parse("https://x").is_ok());
        assert!(Upstream::parse("ftp://x").is_err());
        assert!(Upstream::parse("x:3100").is_err());
        // tls only with an https upstream, cert and key together.
        let base = MINIMAL.replace("http://127.0.0.1:3100", "http://x");
        let tls_on_http = format!("{base}  tls: {{ca_file: ca.crt}}\n");
        assert!(Config::parse(&tls_on_http).unwrap_err().contains("https"));
        let https = MINIMAL.replace("http://127.0.0.1:3100", "https://x");
        let half = format!("{https}  tls: {{cert_file: c.crt}}\n");
        assert!(Config::parse(&half).unwrap_err().contains("together"));
    }

    #[test]
    fn metrics_section_is_validated() {
        let label = |name: &str| {
            Config::parse(&format!(
                "{MINIMAL}metrics:\n  upstream: http://127.0.0.1:9090\n  label: \"{name}\"\n"
            ))
        };
        assert!(label("1x").unwrap_err().contains("not a valid label name"));
        for reserved in ["__name__", "__tenant"] {
            assert!(
                label(reserved).unwrap_err().contains("reserves"),
                "{reserved}"
            );
        }
        for own in ["le", "quantile", "otel_scope_name"] {
            assert!(label(own).unwrap_err().contains("sets itself"), "{own}");
        }
        assert_eq!(label("_tenant").unwrap().metrics.unwrap().label, "_tenant");
        assert_eq!(
            label("namespace")
                .unwrap()
                .metrics
                .unwrap()
                .query_cache_size,
            10_000
        );
        let no_cache = format!(
            "{MINIMAL}metrics:\n  upstream: http://127.0.0.1:9090\n  query_cache_size: 0\n"
        );
        let metrics = Config::parse(&no_cache).unwrap().metrics.unwrap();
        assert_eq!(metrics.query_cache_size, 0);
        let cache = |n: usize| {
            Config::parse(&format!(
                "{MINIMAL}metrics:\n  upstream: http://127.0.0.1:9090\n  query_cache_size: {n}\n"
            ))
        };
        assert_eq!(
            cache(MAX_QUERY_CACHE_SIZE)
                .unwrap()
                .metrics
                .unwrap()
                .query_cache_size,
            MAX_QUERY_CACHE_SIZE
        );
        assert!(cache(MAX_QUERY_CACHE_SIZE + 1)
            .unwrap_err()
            .contains("query_cache_size must be at most 100000"));
        let header = format!("{MINIMAL}metrics:\n  upstream: http://127.0.0.1:9090\n  mode: header\n  header: THANOS-TENANT\n");
        assert_eq!(
            Config::parse(&header).unwrap().metrics.unwrap().mode,
            MetricsMode::Header
        );
        let durations = format!("{MINIMAL}limits:\n  upstream_timeout: 1m 30s\n");
        assert_eq!(
            Config::parse(&durations).unwrap().limits.upstream_timeout,
            Duration::from_secs(90)
        );
    }

    #[test]
    fn tracing_is_off_unless_configured_and_is_validated() {
        assert!(Config::parse(MINIMAL).unwrap().tracing.is_none());
        let on = format!("{MINIMAL}tracing:\n  otlp_endpoint: http://127.0.0.1:4318/v1/traces\n");
        let tracing = Config::parse(&on).unwrap().tracing.unwrap();
        assert_eq!(
            (tracing.service_name.as_str(), tracing.sample_ratio),
            ("tenant-proxy", 1.0)
        );
        for (bad, complaint) in [
            ("otlp_endpoint: 127.0.0.1:4318", "http://"),
            (
                "otlp_endpoint: http://c:4318\n  sample_ratio: 1.5",
                "sample_ratio",
            ),
            (
                "otlp_endpoint: http://c:4318\n  export_interval: 0s",
                "above zero",
            ),
            (
                "otlp_endpoint: http://c:4318\n  tls: {ca_file: ca.crt}",
                "https://",
            ),
            (
                "otlp_endpoint: https://c:4318\n  tls: {key_file: k}",
                "go together",
            ),
        ] {
            let text = format!("{MINIMAL}tracing:\n  {bad}\n");
            let error = Config::parse(&text).unwrap_err();
            assert!(error.contains(complaint), "{bad}: {error}");
        }
    }
}
