//! The backends' sections (Loki, Prometheus or Mimir, Alertmanager): where
//! requests go, how the metrics tenant is enforced, and TLS to them.

use std::path::PathBuf;
use std::time::Duration;

use http::header::HeaderValue;
use http::uri::PathAndQuery;
use http::Uri;
use serde::Deserialize;

use super::defaults;
use crate::enforce::remote_write;
use crate::http::headers;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogsConfig {
    /// Base URL of Loki (or its query frontend/gateway), may carry a path prefix.
    pub upstream: Upstream,
    /// Loki runs with `lbac.enabled: true` (3.7.3 and later, experimental),
    /// so credentials restricted by a `selector` may read logs, enforced by
    /// Loki through `X-Prom-Label-Policy`, on the reads Loki holds to it
    /// (`routes::LOKI_LABEL_POLICY_ROUTES`). Without it such credentials get
    /// 403 on every log route: a Loki that ignores the header would show
    /// them the whole tenant.
    #[serde(default)]
    pub lbac: bool,
    /// For an `https://` upstream.
    pub tls: Option<UpstreamTls>,
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
    /// The tenant header in header mode (`THANOS-TENANT` for Thanos, which
    /// scopes less by it: see [`MetricsScoping`]).
    #[serde(default = "defaults::tenant_header")]
    pub header: String,
    /// Label mode, remote write: what to do with a pushed series whose tenant
    /// label names a value the tenant does not own.
    #[serde(default)]
    pub foreign_label: ForeignLabelPolicy,
    /// Label mode, OTLP metrics: how a relabelled body is forwarded.
    #[serde(default)]
    pub otlp_forward_encoding: OtlpForwardEncoding,
    /// Label mode, remote write: how a relabelled body is forwarded, in
    /// snappy's block format either way (`compressed`, or `literal`: no
    /// compression work, more bytes to the receiver).
    #[serde(default)]
    pub remote_write_forward_compression: remote_write::Output,
    /// Label mode: how many enforced queries and selectors are remembered
    /// (with a quarter as many query shapes); 0 remembers none, at most
    /// [`MAX_QUERY_CACHE_SIZE`].
    #[serde(default = "defaults::query_cache_size")]
    pub query_cache_size: usize,
    /// For an `https://` upstream (both `upstream` and `push_upstream`).
    pub tls: Option<UpstreamTls>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MetricsMode {
    #[default]
    Label,
    Header,
}

/// What the metrics upstream answers for the tenant alone, which decides
/// what the proxy serves there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricsScoping {
    /// Label mode: the proxy enforces the tenant label itself.
    Label,
    /// Header mode with `X-Scope-OrgID` (Mimir, Cortex): every API, rules,
    /// alerts and metadata included, is the tenant's alone.
    HeaderScopesEveryApi,
    /// Header mode with another header, as Thanos' `THANOS-TENANT`: Thanos
    /// Query scopes queries, series, label names and values by it (with
    /// `--query.enforce-tenancy`), and Thanos Receive stamps pushed series
    /// with it; rules, alerts, metadata and exemplars it does not scope.
    HeaderScopesQueries,
}

impl MetricsConfig {
    pub fn scoping(&self) -> MetricsScoping {
        match self.mode {
            MetricsMode::Label => MetricsScoping::Label,
            MetricsMode::Header if self.header.eq_ignore_ascii_case("x-scope-orgid") => {
                MetricsScoping::HeaderScopesEveryApi
            }
            MetricsMode::Header => MetricsScoping::HeaderScopesQueries,
        }
    }
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

/// The largest `metrics.query_cache_size`: at 3 KiB of text per query
/// and per shape (a quarter as many), the memo holds at most 370 MiB.
pub const MAX_QUERY_CACHE_SIZE: usize = 100_000;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertsConfig {
    /// Base URL of the Alertmanager (vanilla: its `/api/v2` is under it) or
    /// of Mimir (its Alertmanager at `/alertmanager/api/v2`).
    pub upstream: Upstream,
    /// For an `https://` upstream.
    pub tls: Option<UpstreamTls>,
}

// === upstreams: URLs and TLS ===

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

/// Refuses `user:password@` in a URL the proxy sends requests to. The
/// proxy authenticates to no upstream that way: ignored, the credential
/// would go out in the `Host` header (the authority, userinfo and all)
/// and the upstream would see none. Checked before any message that
/// quotes the URL, so that no error shows the password.
pub(super) fn refuse_userinfo(raw: &str) -> Result<(), String> {
    let authority = raw.split_once("://").map_or(raw, |(_, rest)| rest);
    let authority = authority.split(['/', '?', '#']).next().unwrap_or_default();
    match authority.contains('@') {
        true => Err(
            "must not carry credentials (user:password@): the proxy does not \
                     authenticate to its upstreams with them; use tls.cert_file/key_file for \
                     a client certificate"
                .into(),
        ),
        false => Ok(()),
    }
}

impl Upstream {
    pub fn parse(raw: &str) -> Result<Self, String> {
        refuse_userinfo(raw).map_err(|why| format!("upstream URL {why}"))?;
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

/// An upstream's `tls` needs an https:// URL to apply to, and a client
/// certificate needs its key.
pub(super) fn check_upstream_tls(
    section: &str,
    https: bool,
    tls: Option<&UpstreamTls>,
) -> Result<(), String> {
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
