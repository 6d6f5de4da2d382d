//! The proxy's configuration file: parsed (unknown keys are errors), then
//! validated, then handed to `serve`. Every field says why it exists.
//!
//! This file holds the document, its loading and checks, and the proxy's
//! own sections (listener TLS, limits, auth, tracing). The backends'
//! sections, the tenants' limits and every default have a file each.

mod backends;
mod defaults;
mod tenant_limits;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::header::HeaderName;
use http::Uri;
use serde::Deserialize;

use crate::http::client_address::TrustedProxies;

use backends::check_upstream_tls;
pub use backends::{
    AlertsConfig, ForeignLabelPolicy, LogsConfig, MetricsConfig, MetricsMode, MetricsScoping,
    OtlpForwardEncoding, Upstream, UpstreamTls, MAX_QUERY_CACHE_SIZE,
};
pub use tenant_limits::{
    LimitScope, RequestLimits, TenantLimits, TenantLimitsConfig, TenantLimitsOverride,
};

/// Largest `limits.max_header_bytes`: Go's `http.DefaultMaxHeaderBytes`,
/// the limit of every upstream this proxy serves.
pub const MAX_HEADER_BYTES: usize = 1 << 20;
/// Smallest fixed `limits.upstream_receive_buffer_bytes` and
/// `limits.client_receive_buffer_bytes`: 16 KiB a round trip is already a
/// crawl; below, a typo more likely than a choice.
const MIN_RECEIVE_BUFFER: u32 = 16 << 10;

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
    /// The operator's own proxies in front (an ingress, a load balancer):
    /// behind them, the client named in `X-Forwarded-For` is the one
    /// throttled and logged. Empty: the TCP peer is the client.
    #[serde(default)]
    pub trusted_proxies: TrustedProxies,
    /// OpenTelemetry spans over OTLP/HTTP; absent: none are made.
    pub tracing: Option<TracingConfig>,
}

// === loading ===

/// The sections that carry TLS to an upstream, by name, each `Option`
/// taken `as_ref` or `as_mut`: one list for reading the files (checks) and
/// for resolving their paths (`load`), so no section is left out of one.
macro_rules! upstream_tls_sections {
    ($config:expr, $as:ident) => {
        [
            ("logs", $config.logs.$as().and_then(|s| s.tls.$as())),
            ("metrics", $config.metrics.$as().and_then(|s| s.tls.$as())),
            ("alerts", $config.alerts.$as().and_then(|s| s.tls.$as())),
            ("tracing", $config.tracing.$as().and_then(|s| s.tls.$as())),
        ]
    };
}

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
        for tls in upstream_tls_sections!(config, as_mut)
            .into_iter()
            .filter_map(|(_, tls)| tls)
        {
            for file in [&mut tls.ca_file, &mut tls.cert_file, &mut tls.key_file]
                .into_iter()
                .flatten()
            {
                resolve(file);
            }
        }
        Ok(config)
    }

    /// Every section's TLS to its upstream, named by the section.
    pub fn upstream_tls(&self) -> impl Iterator<Item = (&'static str, &UpstreamTls)> {
        upstream_tls_sections!(self, as_ref)
            .into_iter()
            .filter_map(|(section, tls)| Some((section, tls?)))
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let config: Config = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
        config.validate()?;
        Ok(config)
    }

    /// Rules serde cannot express.
    /// What is allowed but likely wrong: `check-config` prints these and
    /// the proxy logs them at start.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        if let Some(m) = &self.metrics {
            let prefix = &m.upstream.path_prefix;
            if m.mode == MetricsMode::Header && !prefix.is_empty() && m.push_upstream.is_none() {
                warnings.push(format!(
                    "metrics.upstream has the path prefix {prefix:?} and there is no \
                     metrics.push_upstream: pushes go to {prefix}/api/v1/push, where Mimir \
                     and Cortex answer 404 (they take pushes at their root)"
                ));
            }
            if m.scoping() == MetricsScoping::HeaderScopesQueries {
                // The proxy sets and strips this one header; Thanos reading
                // another (or a series label) would take the client's word.
                warnings.push(format!(
                    "metrics.header {:?}: Thanos Query scopes queries by it only when run with \
                     --query.enforce-tenancy and --query.tenant-header naming it (and without \
                     --query.tenant-certificate-field); Thanos Receive files pushes under it \
                     only with --receive.tenant-header naming it and without \
                     --receive.split-tenant-label-name or --receive.tenant-certificate-field. \
                     Otherwise every tenant reads every series, or a client names the tenant \
                     it writes as. Rules, alerts and exemplars, which Query does not scope, \
                     are not served",
                    m.header
                ));
            }
        }
        if self.logs.as_ref().is_some_and(|logs| logs.lbac) {
            // The proxy sends the policy; only Loki can hold a query to it.
            warnings.push(
                "logs.lbac: Loki must run 3.7.3 or later with `lbac: {enabled: true}`, or it \
                 ignores X-Prom-Label-Policy and a credential with a selector reads its whole \
                 tenant. Such credentials are refused live tail, patterns, index stats and \
                 detected labels and fields, which Loki does not hold to the policy"
                    .into(),
            );
        }
        if self.trusted_proxies.trusts_everyone() {
            warnings.push(
                "trusted_proxies holds 0.0.0.0/0 or ::/0: any client is then believed about \
                 the address it writes into X-Forwarded-For, and can start a fresh \
                 auth.max_failures_per_client count with each"
                    .into(),
            );
        }
        warnings
    }

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
            let header = HeaderName::from_bytes(metrics.header.as_bytes())
                .map_err(|_| format!("metrics.header {:?} is not a header name", metrics.header))?;
            // A reader that takes `_` for `-` would find a client's dashed
            // copy under this name, and the proxy removes only this one.
            if crate::http::headers::read_as_dashed(&header) {
                return Err(format!(
                    "metrics.header {:?} has a `_`: some readers take it for `-`, so a \
                     client's copy with `-` could be read as the tenant header",
                    metrics.header
                ));
            }
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
        let scoping = self.metrics.as_ref().map(MetricsConfig::scoping);
        if self.alerts.is_some() && scoping == Some(MetricsScoping::HeaderScopesQueries) {
            return Err(
                "`alerts` with header mode needs metrics.header X-Scope-OrgID (Mimir's \
                 Alertmanager); no Alertmanager scopes by another header: use label mode"
                    .into(),
            );
        }
        for (section, urls, tls) in upstreams.into_iter().flatten() {
            let https = urls.iter().any(|u| u.scheme == http::uri::Scheme::HTTPS);
            check_upstream_tls(section, https, tls)?;
        }
        if !(8 * 1024..=MAX_HEADER_BYTES).contains(&self.limits.max_header_bytes) {
            return Err(format!(
                "limits.max_header_bytes must be between 8192 (hyper's smallest read \
                 buffer) and {MAX_HEADER_BYTES} (what Loki, Prometheus and Mimir accept: \
                 Go's default; a larger head would reach them only to be refused)"
            ));
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
        for (setting, bytes, starved) in [
            (
                "upstream_receive_buffer_bytes",
                self.limits.upstream_receive_buffer_bytes,
                "answer",
            ),
            (
                "client_receive_buffer_bytes",
                self.limits.client_receive_buffer_bytes,
                "request body",
            ),
        ] {
            if bytes != 0 && bytes < MIN_RECEIVE_BUFFER {
                return Err(format!(
                    "limits.{setting} must be 0 (the kernel's) or at least \
                     {MIN_RECEIVE_BUFFER}, not {bytes}: a smaller one starves every {starved}"
                ));
            }
        }
        if self.limits.max_http2_streams == 0 {
            return Err("limits.max_http2_streams must be at least 1".into());
        }
        if self.auth.max_concurrent_verifications == 0 {
            return Err("auth.max_concurrent_verifications must be at least 1".into());
        }
        if self.auth.max_pending_verifications == 0 {
            return Err("auth.max_pending_verifications must be at least 1".into());
        }
        let largest_hash = u64::from(crate::auth::password::MAX_MEMORY_KIB) * 1024;
        if self.auth.verification_memory_bytes < largest_hash {
            return Err(format!(
                "auth.verification_memory_bytes must be at least {largest_hash} (64 MiB, \
                 the most one accepted hash asks for)"
            ));
        }
        self.check_no_zero_durations()?;
        self.tenant_limits.validate()
    }

    /// Durations that zero would break: a clock that follows files cannot
    /// tick every 0 s (tokio panics, and the files would never be read
    /// again), and a zero timeout or window refuses every request or
    /// forgets every failure.
    fn check_no_zero_durations(&self) -> Result<(), String> {
        let fixed = [
            ("tenants_poll_interval", self.tenants_poll_interval),
            (
                "limits.header_read_timeout",
                self.limits.header_read_timeout,
            ),
            ("limits.body_read_timeout", self.limits.body_read_timeout),
            ("limits.upstream_timeout", self.limits.upstream_timeout),
            (
                "limits.upstream_idle_timeout",
                self.limits.upstream_idle_timeout,
            ),
            ("auth.failure_window", self.auth.failure_window),
        ]
        .map(|(name, duration)| (name.to_owned(), duration));
        let listener =
            (self.tls.as_ref()).map(|t| ("tls.reload_interval".to_owned(), t.reload_interval));
        let upstreams = self.upstream_tls().map(|(section, tls)| {
            (
                format!("{section}.tls.reload_interval"),
                tls.reload_interval,
            )
        });
        match fixed
            .into_iter()
            .chain(listener)
            .chain(upstreams)
            .find(|(_, d)| d.is_zero())
        {
            Some((name, _)) => Err(format!("{name} must be above zero")),
            None => Ok(()),
        }
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

// === the proxy's own sections ===

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
    /// Bytes of large bodies (`http/large_bodies.rs`) held at once: still
    /// arriving (from 256 KiB on), waiting for a body worker or being
    /// worked on by one; beyond it 503 with Retry-After, which push
    /// senders retry. A body is taken when nothing else is held, however
    /// large. 0: unbounded, as Mimir's distributor leaves its in-flight
    /// push bytes by default.
    #[serde(default)]
    pub max_large_body_bytes_held: u64,
    /// Client connections open at once on a listener. Beyond it, new ones
    /// wait in the kernel's listen backlog until one ends: a flood of
    /// connections (no credentials needed to open one) must not take the
    /// proxy's memory (about 24 KiB an idle HTTP/1.1 connection) or its
    /// file descriptors, which its upstream connections need too. While it
    /// is reached, the quiet period (`header_read_timeout`) is an eighth
    /// as long, so idle connections make room sooner.
    #[serde(default = "defaults::max_connections")]
    pub max_connections: usize,
    /// Of those, open at once from one client address (the TCP peer's; an
    /// IPv6 one's /64); beyond it a new one is closed on arrival, so one
    /// address cannot take every slot (`http/address_slots.rs`). 0, the
    /// default: no cap, as behind a balancer every connection shares its
    /// address.
    #[serde(default)]
    pub max_connections_per_address: usize,
    /// Requests at once on one HTTP/2 connection (its streams; beyond it
    /// the client waits or opens another connection). Each holds memory
    /// while open, and a client that does not read its answers keeps them
    /// open: the cap times `max_connections` bounds what anyone can hold
    /// that way.
    #[serde(default = "defaults::max_http2_streams")]
    pub max_http2_streams: u32,
    /// How long the upstream may take to answer with its response head (504 after).
    #[serde(default = "defaults::upstream_timeout", with = "humantime_serde")]
    pub upstream_timeout: Duration,
    /// The kernel's receive buffer of each upstream connection, in bytes
    /// (`SO_RCVBUF`). 0, the default: the kernel's, which it grows with
    /// the connection's pace up to `net.ipv4.tcp_rmem`'s maximum (6 MiB by
    /// default). An answer whose client stops reading waits there, and a
    /// cgroup v2 charges it to the pod; a fixed size bounds it, and bounds
    /// an answer's pace to about that much a round trip
    /// (docs/operations.md, "Memory at worst").
    #[serde(default)]
    pub upstream_receive_buffer_bytes: u32,
    /// The kernel's receive buffer of each client connection, in bytes
    /// (`SO_RCVBUF` on the listener). 0, the default: the kernel's, grown
    /// as for upstream connections. What a client sends while the proxy
    /// does not read (pipelined requests while their answers wait; no
    /// credential needed) waits there; a fixed size bounds it, and bounds
    /// an upload's pace to about that much a round trip.
    #[serde(default)]
    pub client_receive_buffer_bytes: u32,
    /// How long an upstream connection is kept open, unused, for the next
    /// request. It must be shorter than the upstream's own idle timeout
    /// and any balancer's on the way, so that the proxy, not they, closes
    /// idle connections (`upstream/client.rs`, `Reuse`).
    #[serde(default = "defaults::upstream_idle_timeout", with = "humantime_serde")]
    pub upstream_idle_timeout: Duration,
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
            max_large_body_bytes_held: 0,
            max_connections: defaults::max_connections(),
            max_connections_per_address: 0,
            max_http2_streams: defaults::max_http2_streams(),
            upstream_timeout: defaults::upstream_timeout(),
            upstream_receive_buffer_bytes: 0,
            client_receive_buffer_bytes: 0,
            upstream_idle_timeout: defaults::upstream_idle_timeout(),
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
    /// How long a request waits for a verification slot before a 503, and
    /// as long again for working memory.
    #[serde(default = "defaults::verification_wait", with = "humantime_serde")]
    pub verification_wait: Duration,
    /// Requests waiting for a verification at once, their own or one
    /// started by a request with the same credential; one more gets 503 at
    /// once. They come before any credential is known, each holding its
    /// request while it waits.
    #[serde(default = "defaults::max_pending_verifications")]
    pub max_pending_verifications: usize,
    /// argon2 working memory held at once, by verifications running and
    /// buffers kept for the next (`auth/working_memory.rs`): a hash's own
    /// parameters decide its share, and a tenant may write them.
    #[serde(default = "defaults::verification_memory_bytes")]
    pub verification_memory_bytes: u64,
    /// Failed attempts per username within `failure_window` before further
    /// uncached attempts get 429.
    #[serde(default = "defaults::max_failures_per_user")]
    pub max_failures_per_user: u32,
    /// Failed attempts a username out of failures may still make within
    /// the window, one from each client address that has failed nothing in
    /// it: so that a guesser from one address cannot keep the username's
    /// real clients out of an uncached login. Needs the per-address count.
    #[serde(default = "defaults::max_failures_per_user_from_fresh_addresses")]
    pub max_failures_per_user_from_fresh_addresses: u32,
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
            max_pending_verifications: defaults::max_pending_verifications(),
            verification_memory_bytes: defaults::verification_memory_bytes(),
            max_failures_per_user: defaults::max_failures_per_user(),
            max_failures_per_user_from_fresh_addresses:
                defaults::max_failures_per_user_from_fresh_addresses(),
            max_failures_per_client: defaults::max_failures_per_client(),
            failure_window: defaults::failure_window(),
        }
    }
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

impl TracingConfig {
    fn validate(&self) -> Result<(), String> {
        backends::refuse_userinfo(&self.otlp_endpoint)
            .map_err(|why| format!("tracing.otlp_endpoint {why}"))?;
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

#[cfg(test)]
mod tests;
