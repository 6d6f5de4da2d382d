//! A scenario file (loadtest/scenarios/*.yaml): what to send, how hard, for
//! how long. Unknown keys are errors, like every config in this project.

use std::time::Duration;

use serde::Deserialize;
use tenant_proxy::config::MetricsMode;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    pub description: String,
    #[serde(default)]
    pub mode: Mode,
    /// The proxy's `metrics.mode`: `label` (default: PromQL and pushed
    /// series rewritten) or `header` (forwarded untouched, the tenant in a
    /// header: the pass-through reference of issue #19).
    #[serde(default)]
    pub metrics_mode: MetricsMode,
    /// More keys of the proxy's `metrics` section, e.g.
    /// `{otlp_forward_encoding: identity}`.
    #[serde(default)]
    pub metrics_config: std::collections::BTreeMap<String, String>,
    /// Keys of the proxy's `limits` section, e.g.
    /// `{max_large_body_bytes_held: 8388608}`.
    #[serde(default)]
    pub limits_config: std::collections::BTreeMap<String, String>,
    /// Connections (closed loop: one request in flight on each).
    #[serde(default = "defaults::connections")]
    pub connections: usize,
    /// Open loop: requests per second across all connections.
    #[serde(default)]
    pub rate: u64,
    #[serde(default = "defaults::duration", with = "humantime_serde")]
    pub duration: Duration,
    #[serde(default = "defaults::warmup", with = "humantime_serde")]
    pub warmup: Duration,
    /// A hard bound on measured requests, whatever the duration.
    #[serde(default = "defaults::max_requests")]
    pub max_requests: u64,
    /// Distinct credentials used round-robin.
    #[serde(default = "defaults::users")]
    pub users: usize,
    /// Share of requests sent with a wrong password (auth-heavy scenarios).
    #[serde(default)]
    pub wrong_password_share: f64,
    pub requests: Vec<RequestTemplate>,
    /// Password guessing alongside the workload: measured as a third row,
    /// with the proxy's failure throttles on (their defaults).
    #[serde(default)]
    pub guessing: Option<Guessing>,
    /// The tenants file replaced while the workload runs: measured as a
    /// third row, next to the same tenants file left alone.
    #[serde(default)]
    pub reloads: Option<Reloads>,
    /// The proxy exporting OpenTelemetry spans to a second sink: measured
    /// as a third row, next to the same proxy without tracing.
    #[serde(default)]
    pub tracing: Option<Tracing>,
    /// Upstream faults injected while the workload runs: one row per phase,
    /// healthy phases between faults, all through one proxy process.
    #[serde(default)]
    pub faults: Option<Faults>,
    /// A reference gateway measured in the same run, as a row of its own
    /// (issue #19): `nginx`, the Loki chart's gateway shape.
    #[serde(default)]
    pub reference: Option<Reference>,
    /// Queries hold `@n@` (a dashboard variable): the proxy row sends it as
    /// `0` in every request (repeated queries, served from the memo), a
    /// `proxy+first-seen` row a new number in each (issue #19).
    #[serde(default)]
    pub first_seen: bool,
    /// Several proxies in `tenant_limits.scope: global`, the load split
    /// across them: does the sum admitted hold to the limit (issue #18)?
    #[serde(default)]
    pub global_limits: Option<GlobalLimits>,
    /// How clients speak to the proxy: `http` (default, HTTP/1.1) or
    /// `https` (its tenant listener serves TLS with a certificate made for
    /// the run, and the load speaks HTTP/2 over it; so does the reference
    /// gateway's). The direct row stays plain HTTP/1.1, as the sink is.
    #[serde(default)]
    pub transport: Transport,
    /// With `transport: https`: requests in flight on each connection, each
    /// on its own HTTP/2 stream (`connections` × this in flight in all), as
    /// a Grafana multiplexes its panels' queries. Default 1.
    #[serde(default = "defaults::streams_per_connection")]
    pub streams_per_connection: usize,
    /// A worker's connection is closed after this many requests and the
    /// next opened (over `https`, each a full TLS handshake: the load keeps
    /// no TLS sessions, as Go's clients keep none by default). Default:
    /// each connection kept for the whole run.
    #[serde(default)]
    pub requests_per_connection: Option<u64>,
    /// The key exchange the load offers over `https`.
    #[serde(default)]
    pub key_exchange: KeyExchange,
    /// Connections opened to each proxy row's process before its load and
    /// left silent (not a byte sent) through the row: what they hold is
    /// the proxy's RSS once it counts them open, less its RSS before.
    /// At most [`MAX_SILENT_CONNECTIONS`]; the proxy closes them after its
    /// quiet time (30 s), so a longer row loses them.
    #[serde(default)]
    pub silent_connections: usize,
}

/// Below the proxy's default `limits.max_connections` (4,096) with room for
/// the load's own, and within the descriptors the load generator raises
/// itself to.
pub const MAX_SILENT_CONNECTIONS: usize = 3000;

/// What a TLS client offers to agree its keys.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyExchange {
    /// X25519MLKEM768 first, then X25519 and the NIST curves: what Go 1.24+
    /// (Grafana, the OpenTelemetry Collector, Alloy) offers.
    #[default]
    PostQuantum,
    /// X25519 and the NIST curves only: what a client on OpenSSL before 3.5
    /// (Debian 12's curl) offers, and all that Debian 12's nginx agrees.
    Classical,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    #[default]
    Http,
    Https,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GlobalLimits {
    /// Proxy processes, and the tenants file's `replicas`.
    pub replicas: u32,
    /// Every tenant's push rate across all replicas.
    pub push_requests_per_second: f64,
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Reference {
    Nginx,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tracing {
    /// The proxy's `tracing.sample_ratio`.
    pub sample_ratio: f64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Faults {
    /// How long the load runs in each phase.
    #[serde(with = "humantime_serde")]
    pub phase: Duration,
    /// The proxy's `limits.upstream_timeout` during the drill: a stall ends
    /// in 504 after it.
    #[serde(with = "humantime_serde")]
    pub upstream_timeout: Duration,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reloads {
    /// How often the file is replaced (by rename, as tenant-sync does).
    #[serde(with = "humantime_serde")]
    pub every: Duration,
    /// Credentials in the file besides the scenario's users (one tenant
    /// each, all sharing one hash: parsing, not hashing, is the cost).
    pub extra_credentials: usize,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Guessing {
    /// Wrong-password attempts per second (open loop).
    pub rate: u64,
    #[serde(default = "defaults::guessing_connections")]
    pub connections: usize,
    /// A loopback address other than the legitimate clients' (127.0.0.1).
    pub source: std::net::Ipv4Addr,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// N connections, each sending its next request when the last answered.
    #[default]
    Closed,
    /// A fixed arrival rate; latency counted from the intended send time, so
    /// a stalled server cannot hide its queueing (no coordinated omission).
    Open,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestTemplate {
    #[serde(default = "defaults::weight")]
    pub weight: u32,
    pub method: String,
    pub path: String,
    #[serde(default)]
    pub body: BodyKind,
}

/// In YAML: `body: loki_json`, `body: !remote_write {series: 500, labels: 20}`,
/// `body: !remote_write_v2 {series: 500, labels: 20}`,
/// `body: !otlp_metrics {series: 500, labels: 20}`, `body: !form "query=up"`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BodyKind {
    #[default]
    None,
    /// A Fluent Bit style JSON push: one stream, 100 lines.
    LokiJson,
    /// A Promtail/Alloy style push: snappy protobuf, one stream, 100 lines.
    LokiProtobuf,
    /// Remote write 1.0: `series` series of `labels` labels, one sample
    /// each, every series with `namespace` (default `someone-else`, a value
    /// no tenant owns, so the proxy rewrites every series).
    RemoteWrite {
        series: usize,
        labels: usize,
        #[serde(default)]
        namespace: Option<String>,
    },
    /// Remote write 2.0: the series of `RemoteWrite` through a symbols
    /// table, as Prometheus 3 sends them with `protobuf_message:
    /// io.prometheus.write.v2.Request`.
    RemoteWriteV2 {
        series: usize,
        labels: usize,
        #[serde(default)]
        namespace: Option<String>,
    },
    /// OTLP metrics, gzip protobuf: the same `series` as `RemoteWrite`
    /// (one gauge data point each, `labels` - 1 attributes besides the
    /// metric name, `namespace` among them), as an OTel SDK batches them.
    OtlpMetrics {
        series: usize,
        labels: usize,
        #[serde(default)]
        namespace: Option<String>,
    },
    /// An `application/x-www-form-urlencoded` body, as Grafana POSTs queries.
    Form(String),
}

mod defaults {
    use std::time::Duration;
    pub fn connections() -> usize {
        32
    }
    pub fn duration() -> Duration {
        Duration::from_secs(10)
    }
    pub fn warmup() -> Duration {
        Duration::from_secs(2)
    }
    pub fn max_requests() -> u64 {
        2_000_000
    }
    pub fn users() -> usize {
        1
    }
    pub fn weight() -> u32 {
        1
    }
    pub fn streams_per_connection() -> usize {
        1
    }
    pub fn guessing_connections() -> usize {
        8
    }
}

impl Scenario {
    pub fn load(path: &std::path::Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)?;
        let scenario: Scenario = serde_yaml_ng::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        anyhow::ensure!(
            !scenario.requests.is_empty(),
            "{}: no requests",
            path.display()
        );
        anyhow::ensure!(
            scenario.mode == Mode::Closed || scenario.rate > 0,
            "{}: open mode needs a rate",
            path.display()
        );
        if let Some(g) = &scenario.guessing {
            anyhow::ensure!(
                g.source.is_loopback() && g.rate > 0,
                "{}: guessing needs a loopback source and a rate",
                path.display()
            );
        }
        // HTTP/1.1 carries one request at a time on a connection.
        anyhow::ensure!(
            scenario.streams_per_connection == 1 || scenario.transport == Transport::Https,
            "{}: streams_per_connection needs transport: https (HTTP/2)",
            path.display()
        );
        // A connection the workers share has no one worker's count to close
        // it by.
        anyhow::ensure!(
            scenario.requests_per_connection.is_none() || scenario.streams_per_connection == 1,
            "{}: requests_per_connection needs streams_per_connection: 1",
            path.display()
        );
        anyhow::ensure!(
            scenario.requests_per_connection != Some(0),
            "{}: requests_per_connection is at least 1",
            path.display()
        );
        anyhow::ensure!(
            scenario.streams_per_connection >= 1,
            "{}: streams_per_connection is at least 1",
            path.display()
        );
        anyhow::ensure!(
            scenario.silent_connections <= MAX_SILENT_CONNECTIONS,
            "{}: silent_connections is at most {MAX_SILENT_CONNECTIONS}",
            path.display()
        );
        Ok(scenario)
    }
}
