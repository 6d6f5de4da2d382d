//! The endpoint policy: an explicit table of (method, normalised path) →
//! signal, operation and required scope. Deny by default: a path not in the
//! table is a 404, whatever the upstream would have done with it.
//!
//! Admin and global endpoints (Loki `/flush`, `/config`, `/ring`,
//! `/ingester/*`, `/distributor/*`, `/ruler/ring`, `/memberlist`, the
//! upstream's `/metrics`) are refused simply by not being listed.

use http::Method;

use crate::config::MetricsScoping;
use crate::enforce::alertmanager::AnswerFilter;
use crate::enforce::prometheus::{ResponseFilter, Selectors};
use crate::http::error::ProxyError;
use crate::tenants::Scope;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    Logs,
    Metrics,
    /// Alertmanager: alerts and silences on metrics.
    Alerts,
}

impl Signal {
    pub fn as_str(self) -> &'static str {
        match self {
            Signal::Logs => "logs",
            Signal::Metrics => "metrics",
            Signal::Alerts => "alerts",
        }
    }
}

/// What label mode does with an Alertmanager API call
/// (`enforce::alertmanager`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AlertmanagerCall {
    /// Forwarded, the answer filtered (status, alerts, groups, silences).
    Read(AnswerFilter),
    /// Alerts and groups: the tenant's `filter` added, the answer filtered.
    ReadFiltered(AnswerFilter),
    /// Forwarded as it is (receivers: names only).
    Receivers,
    /// One silence: shown only if it is the tenant's.
    Silence,
    /// A silence created or updated: checked and written again.
    PostSilence,
    /// A silence expired: only the tenant's.
    DeleteSilence,
}

/// What the proxy does with a matched request, beyond authentication.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// Body streamed through untouched, tenant header set.
    Push,
    /// Query parameters forwarded as sent, tenant header set (under a
    /// Loki label policy, read and moved into the URL:
    /// `proxy/label_policy.rs`).
    Read,
    /// WebSocket upgrade passed through, tenant header set.
    Tail,
    /// Label mode: the request is rebuilt with its selectors enforced.
    Enforce(Selectors),
    /// Label mode: answered by the proxy with an empty success.
    EmptyMetadata,
    /// Label mode: forwarded, then the response filtered to the tenant.
    Filter(ResponseFilter),
    /// Label mode: remote-write body rewritten so every series carries the
    /// tenant label.
    RemoteWrite,
    /// OTLP/HTTP push streamed through untouched, tenant header set; its
    /// errors are OTLP `Status` messages.
    OtlpPush,
    /// Label mode: OTLP metrics decoded and every data point and resource
    /// given the tenant label.
    OtlpMetrics,
    /// Label mode: an Alertmanager API call scoped to the tenant.
    Alertmanager(AlertmanagerCall),
    /// Label mode: a rule group posted to Loki's ruler, every rule given
    /// the tenant label (what it records or raises reaches the metrics
    /// backend and the Alertmanager, which scope by that label).
    RuleGroup,
    /// Header mode: a rule group posted to Mimir's or Cortex's ruler,
    /// forwarded as written again once it is known to query no other
    /// tenant (`source_tenants`).
    FederatedRuleGroup,
}

impl Operation {
    /// Carries data in: an unreachable upstream must make the client retry.
    pub const fn is_push(self) -> bool {
        matches!(
            self,
            Operation::Push | Operation::RemoteWrite | Operation::OtlpPush | Operation::OtlpMetrics
        )
    }

    /// Speaks OTLP/HTTP: errors are answered as OTLP `Status` messages.
    pub const fn is_otlp(self) -> bool {
        matches!(self, Operation::OtlpPush | Operation::OtlpMetrics)
    }
}

#[derive(Clone, Debug)]
pub struct Route {
    pub methods: &'static [Method],
    /// Literal segments, or `{}` for exactly one arbitrary segment.
    pub pattern: &'static str,
    pub signal: Signal,
    pub operation: Operation,
    pub scope: Scope,
}

impl Route {
    /// The surface name used in metrics and logs: bounded, never a raw path.
    /// OTLP has surfaces of its own: other clients (Collector, SDKs, Alloy),
    /// another error format, and a rewrite with costs of its own.
    pub fn surface(&self) -> &'static str {
        match (self.signal, self.scope) {
            (Signal::Logs, Scope::RulesRead | Scope::RulesWrite) => return "logs_rules",
            (Signal::Metrics, Scope::RulesRead | Scope::RulesWrite) => return "metrics_rules",
            (_, Scope::AlertsRead | Scope::AlertsWrite) => return "alerts",
            (_, Scope::LogsDelete) => return "logs_delete",
            _ => {}
        }
        match (self.signal, self.operation) {
            (Signal::Logs, Operation::OtlpPush) => "logs_otlp",
            (Signal::Metrics, Operation::OtlpPush | Operation::OtlpMetrics) => "metrics_otlp",
            (Signal::Logs, Operation::Push) => "logs_push",
            (Signal::Logs, Operation::Tail) => "logs_tail",
            (Signal::Logs, _) => "logs_query",
            (Signal::Metrics, Operation::Push | Operation::RemoteWrite) => "metrics_push",
            (Signal::Metrics, _) => "metrics_query",
            (Signal::Alerts, _) => "alerts",
        }
    }

    /// Whether `path` fills this route's pattern (`{}`: one non-empty
    /// segment).
    pub fn matches_path(&self, path: &str) -> bool {
        // Split as bytes: `str::split` looks for each `/` with a searcher set
        // up per segment, which cost more than the comparison on paths this
        // short (callgrind, docs/benchmarks.md).
        let mut want = self.pattern.as_bytes().split(|&b| b == b'/');
        let mut got = path.as_bytes().split(|&b| b == b'/');
        loop {
            match (want.next(), got.next()) {
                (None, None) => return true,
                (Some(b"{}"), Some(seg)) if !seg.is_empty() => {}
                (Some(w), Some(g)) if w == g => {}
                _ => return false,
            }
        }
    }
}

const GET: &[Method] = &[Method::GET];
const POST: &[Method] = &[Method::POST];
const DELETE: &[Method] = &[Method::DELETE];
const GET_POST: &[Method] = &[Method::GET, Method::POST];

/// A tenant-scoped management API (ruler, delete requests): forwarded with
/// the tenant header, body bounded, under its own scope.
const fn managed(
    signal: Signal,
    methods: &'static [Method],
    pattern: &'static str,
    scope: Scope,
) -> Route {
    Route {
        methods,
        pattern,
        signal,
        operation: Operation::Read,
        scope,
    }
}

const fn logs(methods: &'static [Method], pattern: &'static str, operation: Operation) -> Route {
    let scope = match operation {
        Operation::Push | Operation::OtlpPush => Scope::LogsWrite,
        _ => Scope::LogsRead,
    };
    Route {
        methods,
        pattern,
        signal: Signal::Logs,
        operation,
        scope,
    }
}

const fn metrics(methods: &'static [Method], pattern: &'static str, operation: Operation) -> Route {
    let scope = if operation.is_push() {
        Scope::MetricsWrite
    } else {
        Scope::MetricsRead
    };
    Route {
        methods,
        pattern,
        signal: Signal::Metrics,
        operation,
        scope,
    }
}

/// The Prometheus API as label mode serves it. Header mode serves the same
/// paths, forwarded with the tenant header (`Operation::Read`). Everything
/// else (targets, status other than buildinfo, admin, `/-/*`, remote read,
/// format_query, ...) is refused by absence.
pub const PROMETHEUS_ROUTES: &[Route] = &[
    metrics(
        GET_POST,
        "/api/v1/query",
        Operation::Enforce(Selectors::Query),
    ),
    metrics(
        GET_POST,
        "/api/v1/query_range",
        Operation::Enforce(Selectors::Query),
    ),
    metrics(
        GET_POST,
        "/api/v1/query_exemplars",
        Operation::Enforce(Selectors::Query),
    ),
    metrics(
        GET_POST,
        "/api/v1/series",
        Operation::Enforce(Selectors::Matchers),
    ),
    metrics(
        GET_POST,
        "/api/v1/labels",
        Operation::Enforce(Selectors::Matchers),
    ),
    metrics(
        GET,
        "/api/v1/label/{}/values",
        Operation::Enforce(Selectors::Matchers),
    ),
    metrics(GET, "/federate", Operation::Enforce(Selectors::Matchers)),
    metrics(GET, "/api/v1/metadata", Operation::EmptyMetadata),
    metrics(
        GET,
        "/api/v1/rules",
        Operation::Filter(ResponseFilter::Rules),
    ),
    metrics(
        GET,
        "/api/v1/alerts",
        Operation::Filter(ResponseFilter::Alerts),
    ),
    metrics(GET, "/api/v1/status/buildinfo", Operation::Read),
    metrics(POST, "/api/v1/write", Operation::RemoteWrite),
    // Prometheus' OTLP receiver (3.x, or 2.47+ with the feature flag).
    metrics(POST, "/api/v1/otlp/v1/metrics", Operation::OtlpMetrics),
];

/// What Thanos Query scopes by its tenant header (`--query.enforce-tenancy`:
/// the query's selectors and `match[]`), and the push a Thanos Receive
/// stamps with it: all that header mode serves with a header other than
/// `X-Scope-OrgID`.
const SCOPED_BY_A_QUERY_TENANT_HEADER: &[&str] = &[
    "/api/v1/query",
    "/api/v1/query_range",
    "/api/v1/series",
    "/api/v1/labels",
    "/api/v1/label/{}/values",
    "/api/v1/status/buildinfo",
    "/api/v1/write",
];

/// Header mode also accepts Mimir's and Cortex's push path, and Mimir's
/// OTLP path (Prometheus' `/api/v1/otlp/...` is label mode's only).
const HEADER_MODE_EXTRA_ROUTES: &[Route] = &[
    metrics(POST, "/api/v1/push", Operation::Push),
    metrics(POST, "/otlp/v1/metrics", Operation::OtlpPush),
];

/// Thanos Receive's remote-write path, which stamps every series with the
/// tenant its header names (`tenant_id` by default): served with a header
/// other than `X-Scope-OrgID`.
const THANOS_RECEIVE: Route = metrics(POST, "/api/v1/receive", Operation::Push);

/// A ruler API at `$base`: the tenant's rule groups listed, by namespace,
/// one group (`rules:read`); a YAML group posted to a namespace, a namespace
/// or a group deleted (`rules:write`).
macro_rules! ruler_api {
    ($signal:expr, $base:literal) => {
        [
            managed($signal, GET, $base, Scope::RulesRead),
            managed($signal, GET, concat!($base, "/{}"), Scope::RulesRead),
            managed($signal, GET, concat!($base, "/{}/{}"), Scope::RulesRead),
            managed($signal, POST, concat!($base, "/{}"), Scope::RulesWrite),
            managed($signal, DELETE, concat!($base, "/{}"), Scope::RulesWrite),
            managed($signal, DELETE, concat!($base, "/{}/{}"), Scope::RulesWrite),
        ]
    };
}

/// A ruler route, a posted rule group handled by `operation` (the other
/// methods read or delete and pass as they are).
fn posting_as(route: &Route, operation: Operation) -> Route {
    match route.methods {
        POST => Route {
            operation,
            ..route.clone()
        },
        _ => route.clone(),
    }
}

/// Loki's ruler, at both its paths: Grafana's alerting (LotexRuler) uses the
/// legacy `/api/prom/rules`.
const LOKI_RULER: [[Route; 6]; 2] = [
    ruler_api!(Signal::Logs, "/loki/api/v1/rules"),
    ruler_api!(Signal::Logs, "/api/prom/rules"),
];

/// Mimir's ruler configuration API, under `metrics.upstream`'s prefix
/// (`<prometheus prefix>/config/v1/rules`), where Grafana's alerting sends a
/// Mimir data source's rule changes (header mode only).
const MIMIR_RULER: [Route; 6] = ruler_api!(Signal::Metrics, "/config/v1/rules");

/// Cortex's ruler API as Grafana reaches it for a Prometheus data source of
/// subtype `cortex` (or none): `<url>/rules…`, so with `metrics.upstream:
/// http://cortex/api/prom` Cortex's `/api/prom/rules…` (header mode only).
const CORTEX_RULER: [Route; 6] = ruler_api!(Signal::Metrics, "/rules");

const fn alerts(
    methods: &'static [Method],
    pattern: &'static str,
    call: AlertmanagerCall,
) -> Route {
    let scope = match call {
        AlertmanagerCall::PostSilence | AlertmanagerCall::DeleteSilence => Scope::AlertsWrite,
        _ => Scope::AlertsRead,
    };
    Route {
        methods,
        pattern,
        signal: Signal::Alerts,
        operation: Operation::Alertmanager(call),
        scope,
    }
}

/// The Alertmanager API v2 at `$base`, as Grafana's Alertmanager data source
/// calls it. Everything else (posting alerts, `/-/reload`, the UI) is
/// refused by absence.
macro_rules! alertmanager_api {
    ($base:literal) => {
        [
            alerts(
                GET,
                concat!($base, "/status"),
                AlertmanagerCall::Read(AnswerFilter::Status),
            ),
            alerts(
                GET,
                concat!($base, "/receivers"),
                AlertmanagerCall::Receivers,
            ),
            alerts(
                GET,
                concat!($base, "/alerts"),
                AlertmanagerCall::ReadFiltered(AnswerFilter::Alerts),
            ),
            alerts(
                GET,
                concat!($base, "/alerts/groups"),
                AlertmanagerCall::ReadFiltered(AnswerFilter::AlertGroups),
            ),
            alerts(
                GET,
                concat!($base, "/silences"),
                AlertmanagerCall::Read(AnswerFilter::Silences),
            ),
            alerts(
                GET,
                concat!($base, "/silence/{}"),
                AlertmanagerCall::Silence,
            ),
            alerts(
                POST,
                concat!($base, "/silences"),
                AlertmanagerCall::PostSilence,
            ),
            alerts(
                DELETE,
                concat!($base, "/silence/{}"),
                AlertmanagerCall::DeleteSilence,
            ),
        ]
    };
}

/// Vanilla Alertmanager (label mode): at its own paths, under
/// `/alertmanager` like Mimir's, and under the data-source root `/am`, so
/// one data source URL fits both backends.
const ALERTMANAGER: [[Route; 8]; 3] = [
    alertmanager_api!("/api/v2"),
    alertmanager_api!("/alertmanager/api/v2"),
    alertmanager_api!("/am/api/v2"),
];

/// The prefixes label mode strips before forwarding to a vanilla
/// Alertmanager (which serves at its root).
pub const ALERTMANAGER_PREFIXES: [&str; 2] = ["/alertmanager", ALERTMANAGER_DATASOURCE_ROOT];

/// The root Grafana's Alertmanager data source points at, whatever the
/// backend: `https://<proxy>/am`, stripped before forwarding. Needed
/// because for Mimir (header mode) Grafana reads the tenant's Alertmanager
/// configuration at `<url>/api/v1/alerts`, which at the proxy's root is the
/// Prometheus-compatible alerts list of the metrics data source.
pub const ALERTMANAGER_DATASOURCE_ROOT: &str = "/am";

/// Mimir's Alertmanager under [`ALERTMANAGER_DATASOURCE_ROOT`]: its API v2
/// and its configuration API. The configuration holds the tenant's receivers
/// with their credentials: reading it needs the scope that may replace it.
const MIMIR_ALERTMANAGER_DATASOURCE: ([Route; 8], Route) = (
    alertmanager_api!("/am/alertmanager/api/v2"),
    managed(
        Signal::Alerts,
        &[Method::GET, Method::POST, Method::DELETE],
        "/am/api/v1/alerts",
        Scope::AlertsWrite,
    ),
);

/// Loki's label names, which a selector narrows in the request too
/// (`proxy/label_policy.rs`).
pub const LOKI_LABEL_NAMES: &str = "/loki/api/v1/labels";

/// The Loki read routes whose answers Loki's label-based access control
/// filters by `X-Prom-Label-Policy`, as wired in Loki 3.7's `setupLBAC`
/// (`pkg/loki/modules_lbac.go`): log and metric queries (the chunk and
/// stream filterers of the ingesters, the store and the new engine), label
/// values (the store and ingester wrappers; label names only from the
/// ingesters, those from the store are not filtered: a gap of Loki's that
/// `proxy/label_policy.rs` closes by asking for the selector's streams'
/// names), series, and volume
/// (its own middleware and answer filter); and the routes that return no
/// log data. Left out, so a credential restricted by a selector is refused
/// there: live tail (the ingester's tailer applies no policy), patterns
/// (the pattern ingester is not wired), `index/stats` and `detected_labels`
/// (ingester and index calls no wrapper covers), and `detected_fields`
/// with its values (its log query is made inside Loki, past the URL
/// rewrite that holds aggregated-metric streams, whose lines carry other
/// streams' labels, to the policy). Refused is the answer a selector gets
/// wherever it cannot be held.
const LOKI_LABEL_POLICY_ROUTES: &[&str] = &[
    "/loki/api/v1/query",
    "/loki/api/v1/query_range",
    LOKI_LABEL_NAMES,
    "/loki/api/v1/label/{}/values",
    "/loki/api/v1/series",
    "/loki/api/v1/index/volume",
    "/loki/api/v1/index/volume_range",
    "/loki/api/v1/format_query",
    "/loki/api/v1/drilldown-limits",
    "/loki/api/v1/status/buildinfo",
];

impl Route {
    /// Whether Loki holds what this route returns to the label policy of
    /// a credential restricted by a selector.
    pub fn loki_applies_label_policy(&self) -> bool {
        self.signal == Signal::Logs && LOKI_LABEL_POLICY_ROUTES.contains(&self.pattern)
    }
}

/// Loki, header mode. Every route here is tenant-scoped by `X-Scope-OrgID`.
pub const LOKI_ROUTES: &[Route] = &[
    logs(POST, "/loki/api/v1/push", Operation::Push),
    logs(POST, "/api/prom/push", Operation::Push),
    // Loki's native OTLP endpoint (3.x).
    logs(POST, "/otlp/v1/logs", Operation::OtlpPush),
    logs(GET_POST, "/loki/api/v1/query", Operation::Read),
    logs(GET_POST, "/loki/api/v1/query_range", Operation::Read),
    logs(GET_POST, LOKI_LABEL_NAMES, Operation::Read),
    logs(GET_POST, "/loki/api/v1/label/{}/values", Operation::Read),
    logs(GET_POST, "/loki/api/v1/series", Operation::Read),
    logs(GET_POST, "/loki/api/v1/index/stats", Operation::Read),
    logs(GET_POST, "/loki/api/v1/index/volume", Operation::Read),
    logs(GET_POST, "/loki/api/v1/index/volume_range", Operation::Read),
    logs(GET_POST, "/loki/api/v1/patterns", Operation::Read),
    logs(GET_POST, "/loki/api/v1/detected_fields", Operation::Read),
    logs(
        GET_POST,
        "/loki/api/v1/detected_field/{}/values",
        Operation::Read,
    ),
    logs(GET_POST, "/loki/api/v1/detected_labels", Operation::Read),
    logs(GET_POST, "/loki/api/v1/format_query", Operation::Read),
    logs(GET, "/loki/api/v1/drilldown-limits", Operation::Read),
    logs(GET, "/loki/api/v1/status/buildinfo", Operation::Read),
    logs(GET, "/loki/api/v1/tail", Operation::Tail),
    // What Grafana reads for a Loki data source's alerting view.
    managed(
        Signal::Logs,
        GET,
        "/prometheus/api/v1/rules",
        Scope::RulesRead,
    ),
    managed(
        Signal::Logs,
        GET,
        "/prometheus/api/v1/alerts",
        Scope::AlertsRead,
    ),
    // Log deletion requests: create, list, cancel.
    managed(
        Signal::Logs,
        &[Method::GET, Method::POST, Method::DELETE],
        "/loki/api/v1/delete",
        Scope::LogsDelete,
    ),
];

/// The routes in force for one configuration.
#[derive(Debug)]
pub struct RouteTable {
    routes: Vec<Route>,
    /// At index `n`, the routes whose pattern has `n` slashes, in table
    /// order (the first match wins): a path is compared only with those.
    by_slashes: Vec<Vec<Candidate>>,
}

/// A route a path of the right number of slashes may match, and whether
/// its pattern is exact (has no `{}`).
#[derive(Clone, Copy, Debug)]
struct Candidate {
    route: usize,
    exact: bool,
}

fn slashes(path: &str) -> usize {
    path.bytes().filter(|&b| b == b'/').count()
}

impl RouteTable {
    pub fn new(logs_enabled: bool, metrics: Option<MetricsScoping>, alerts_enabled: bool) -> Self {
        let mut routes = Vec::new();
        if logs_enabled {
            routes.extend_from_slice(LOKI_ROUTES);
            let label_mode = metrics == Some(MetricsScoping::Label);
            routes.extend(LOKI_RULER.iter().flatten().map(|r| match label_mode {
                true => posting_as(r, Operation::RuleGroup),
                false => r.clone(),
            }));
        }
        // A route forwarded with the tenant header only.
        let by_header = |r: &Route| Route {
            operation: if r.operation.is_push() {
                Operation::Push
            } else {
                Operation::Read
            },
            ..r.clone()
        };
        match metrics {
            Some(MetricsScoping::Label) => routes.extend_from_slice(PROMETHEUS_ROUTES),
            // Mimir and Cortex scope every one of these by the tenant header.
            Some(MetricsScoping::HeaderScopesEveryApi) => {
                let label_mode_only = |r: &&Route| r.operation != Operation::OtlpMetrics;
                routes.extend(
                    PROMETHEUS_ROUTES
                        .iter()
                        .filter(label_mode_only)
                        .map(by_header),
                );
                routes.extend_from_slice(HEADER_MODE_EXTRA_ROUTES);
                let ruler = MIMIR_RULER.iter().chain(&CORTEX_RULER);
                routes.extend(ruler.map(|r| posting_as(r, Operation::FederatedRuleGroup)));
            }
            // Only what such an upstream scopes by the header; metadata is
            // answered empty, as in label mode; the rest is refused by
            // absence (rules, alerts and exemplars it would answer for
            // every tenant).
            Some(MetricsScoping::HeaderScopesQueries) => {
                routes.extend(PROMETHEUS_ROUTES.iter().filter_map(|r| match r.operation {
                    Operation::EmptyMetadata => Some(r.clone()),
                    _ if SCOPED_BY_A_QUERY_TENANT_HEADER.contains(&r.pattern) => Some(by_header(r)),
                    _ => None,
                }));
                routes.extend_from_slice(HEADER_MODE_EXTRA_ROUTES);
                routes.push(THANOS_RECEIVE);
            }
            None => {}
        }
        match metrics.filter(|_| alerts_enabled) {
            Some(MetricsScoping::Label) => routes.extend(ALERTMANAGER.iter().flatten().cloned()),
            // Mimir's Alertmanager, by the tenant header, at its own paths
            // and under the data-source root.
            Some(MetricsScoping::HeaderScopesEveryApi) => {
                let (api, config) = &MIMIR_ALERTMANAGER_DATASOURCE;
                routes.extend(ALERTMANAGER[1].iter().chain(api).map(|r| Route {
                    operation: Operation::Read,
                    ..r.clone()
                }));
                routes.push(config.clone());
            }
            // No Alertmanager scopes by such a header (the config refuses
            // `alerts` with it).
            Some(MetricsScoping::HeaderScopesQueries) | None => {}
        }
        let mut by_slashes: Vec<Vec<Candidate>> = Vec::new();
        for (index, route) in routes.iter().enumerate() {
            let n = slashes(route.pattern);
            if by_slashes.len() <= n {
                by_slashes.resize_with(n + 1, Vec::new);
            }
            by_slashes[n].push(Candidate {
                route: index,
                exact: !route.pattern.contains("{}"),
            });
        }
        Self { routes, by_slashes }
    }

    /// `path` must already be normalised (see `path::normalise`).
    pub fn classify(&self, method: &Method, path: &str) -> Result<&Route, ProxyError> {
        // The methods of every route on this path, for a 405's `Allow`.
        let mut allow: Vec<Method> = Vec::new();
        let candidates = self
            .by_slashes
            .get(slashes(path))
            .map_or(&[][..], Vec::as_slice);
        for candidate in candidates {
            let route = &self.routes[candidate.route];
            // No `{}`: the segments match exactly when the strings do.
            let matches = if candidate.exact {
                route.pattern == path
            } else {
                route.matches_path(path)
            };
            if matches {
                if route.methods.contains(method) {
                    return Ok(route);
                }
                for known in route.methods {
                    if !allow.contains(known) {
                        allow.push(known.clone());
                    }
                }
            }
        }
        Err(if allow.is_empty() {
            ProxyError::RouteNotFound
        } else {
            ProxyError::MethodNotAllowed { allow }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No metrics section, and each way of scoping one.
    const EVERY_METRICS_SCOPING: [Option<MetricsScoping>; 4] = [
        None,
        Some(MetricsScoping::Label),
        Some(MetricsScoping::HeaderScopesEveryApi),
        Some(MetricsScoping::HeaderScopesQueries),
    ];

    /// Each route a label policy is trusted on is one of Loki's reads; the
    /// reads it is not trusted on are the ones the list says why of.
    #[test]
    fn a_label_policy_is_trusted_only_on_lokis_reads_it_filters() {
        for pattern in LOKI_LABEL_POLICY_ROUTES {
            let route = LOKI_ROUTES.iter().find(|r| r.pattern == *pattern);
            let route = route.unwrap_or_else(|| panic!("{pattern} is not a Loki route"));
            assert_eq!(route.scope, Scope::LogsRead, "{pattern}");
            assert!(route.loki_applies_label_policy(), "{pattern}");
        }
        let untrusted: Vec<_> = LOKI_ROUTES
            .iter()
            .filter(|r| r.scope == Scope::LogsRead && !r.loki_applies_label_policy())
            .map(|r| r.pattern)
            .collect();
        assert_eq!(
            untrusted,
            [
                "/loki/api/v1/index/stats",
                "/loki/api/v1/patterns",
                "/loki/api/v1/detected_fields",
                "/loki/api/v1/detected_field/{}/values",
                "/loki/api/v1/detected_labels",
                "/loki/api/v1/tail",
            ]
        );
    }

    fn table() -> &'static RouteTable {
        static TABLE: std::sync::OnceLock<RouteTable> = std::sync::OnceLock::new();
        TABLE.get_or_init(|| RouteTable::new(true, Some(MetricsScoping::Label), true))
    }

    #[test]
    fn classifies_loki_routes_with_their_scope() {
        let push = table()
            .classify(&Method::POST, "/loki/api/v1/push")
            .unwrap();
        assert_eq!(
            (push.operation, push.scope),
            (Operation::Push, Scope::LogsWrite)
        );
        let values = table()
            .classify(&Method::GET, "/loki/api/v1/label/app/values")
            .unwrap();
        assert_eq!(values.scope, Scope::LogsRead);
        let tail = table().classify(&Method::GET, "/loki/api/v1/tail").unwrap();
        assert_eq!(tail.operation, Operation::Tail);
    }

    #[test]
    fn ruler_and_delete_apis_need_their_own_scopes() {
        let scope = |method: Method, path: &str| table().classify(&method, path).map(|r| r.scope);
        assert_eq!(
            scope(Method::GET, "/loki/api/v1/rules/ns/group").unwrap(),
            Scope::RulesRead
        );
        assert_eq!(
            scope(Method::POST, "/loki/api/v1/rules/ns").unwrap(),
            Scope::RulesWrite
        );
        assert_eq!(
            scope(Method::DELETE, "/loki/api/v1/rules/ns/group").unwrap(),
            Scope::RulesWrite
        );
        assert_eq!(
            scope(Method::GET, "/prometheus/api/v1/alerts").unwrap(),
            Scope::AlertsRead
        );
        for method in [Method::GET, Method::POST, Method::DELETE] {
            assert_eq!(
                scope(method, "/loki/api/v1/delete").unwrap(),
                Scope::LogsDelete
            );
        }
        assert!(
            scope(Method::POST, "/loki/api/v1/rules").is_err(),
            "405: a group goes to a namespace"
        );
        assert!(scope(Method::PUT, "/loki/api/v1/delete").is_err());
        let rules = table()
            .classify(&Method::GET, "/loki/api/v1/rules")
            .unwrap();
        assert_eq!(rules.surface(), "logs_rules");
    }

    #[test]
    fn otlp_paths_exist_only_in_the_mode_they_belong_to() {
        let logs = table().classify(&Method::POST, "/otlp/v1/logs").unwrap();
        assert_eq!(
            (logs.operation, logs.scope),
            (Operation::OtlpPush, Scope::LogsWrite)
        );
        assert_eq!(logs.surface(), "logs_otlp");
        let label = table()
            .classify(&Method::POST, "/api/v1/otlp/v1/metrics")
            .unwrap();
        assert_eq!(
            (label.operation, label.scope),
            (Operation::OtlpMetrics, Scope::MetricsWrite)
        );
        assert!(table().classify(&Method::POST, "/otlp/v1/metrics").is_err());
        assert!(table().classify(&Method::GET, "/otlp/v1/logs").is_err());

        let header = RouteTable::new(false, Some(MetricsScoping::HeaderScopesEveryApi), false);
        let mimir = header.classify(&Method::POST, "/otlp/v1/metrics").unwrap();
        assert_eq!(
            (mimir.operation, mimir.scope),
            (Operation::OtlpPush, Scope::MetricsWrite)
        );
        assert_eq!(mimir.surface(), "metrics_otlp");
        assert!(header
            .classify(&Method::POST, "/api/v1/otlp/v1/metrics")
            .is_err());
        assert!(
            header.classify(&Method::POST, "/otlp/v1/logs").is_err(),
            "no logs upstream"
        );
    }

    /// Which route a path matches never depends on the table's order, so
    /// the lookup may visit candidates in any order it likes.
    #[test]
    fn no_path_matches_two_routes_of_one_configuration() {
        let overlap = |a: &str, b: &str| {
            let (a, b): (Vec<_>, Vec<_>) = (a.split('/').collect(), b.split('/').collect());
            a.len() == b.len()
                && a.iter()
                    .zip(&b)
                    .all(|(x, y)| x == y || *x == "{}" || *y == "{}")
        };
        for metrics in EVERY_METRICS_SCOPING {
            let table = RouteTable::new(true, metrics, true);
            for (i, a) in table.routes.iter().enumerate() {
                for b in &table.routes[i + 1..] {
                    let shared_method = a.methods.iter().any(|m| b.methods.contains(m));
                    assert!(
                        !(shared_method && overlap(a.pattern, b.pattern)),
                        "{} and {} ({metrics:?})",
                        a.pattern,
                        b.pattern
                    );
                }
            }
        }
    }

    /// The slash-count index never hides a route: in every configuration,
    /// each route's own path (wildcards filled in) and methods classify to
    /// a route with the same pattern.
    #[test]
    fn every_route_is_reachable_by_its_own_path() {
        for metrics in EVERY_METRICS_SCOPING {
            let table = RouteTable::new(true, metrics, true);
            for route in &table.routes {
                let path = route.pattern.replace("{}", "x-1");
                for method in route.methods {
                    let found = table.classify(method, &path).unwrap();
                    assert_eq!(found.pattern, route.pattern, "{method} {path}");
                }
            }
        }
    }

    #[test]
    fn refuses_admin_and_unknown_paths() {
        for path in [
            "/flush",
            "/config",
            "/ring",
            "/ingester/shutdown",
            "/distributor/ring",
            "/ruler/ring",
            "/loki/api/v1/rules/a/b/c",
            "/memberlist",
            "/metrics",
            "/loki/api/v1/index/shards",
            "/loki/api/v1/label/values",
            "/loki/api/v1/label/a/b/values",
            "/loki/api/v1/push/extra",
        ] {
            for method in [Method::GET, Method::POST] {
                assert!(
                    matches!(
                        table().classify(&method, path),
                        Err(ProxyError::RouteNotFound)
                    ),
                    "{method} {path}"
                );
            }
        }
    }

    #[test]
    fn wrong_method_is_405_not_forwarded_and_names_the_methods_the_path_takes() {
        let allowed = |method: Method, path: &str| match table().classify(&method, path) {
            Err(ProxyError::MethodNotAllowed { allow }) => allow,
            other => panic!("{method} {path}: {other:?}"),
        };
        assert_eq!(allowed(Method::GET, "/loki/api/v1/push"), [Method::POST]);
        assert_eq!(
            allowed(Method::DELETE, "/loki/api/v1/query"),
            [Method::GET, Method::POST]
        );
    }

    #[test]
    fn a_loki_rule_group_is_rewritten_only_where_metrics_are_scoped_by_label() {
        for metrics in EVERY_METRICS_SCOPING {
            let table = RouteTable::new(true, metrics, false);
            for ruler in ["/loki/api/v1/rules/ns", "/api/prom/rules/ns"] {
                let post = table.classify(&Method::POST, ruler).unwrap();
                let expected = match metrics {
                    Some(MetricsScoping::Label) => Operation::RuleGroup,
                    _ => Operation::Read,
                };
                assert_eq!(post.operation, expected, "{metrics:?} {ruler}");
                let get = table.classify(&Method::GET, ruler).unwrap();
                assert_eq!(get.operation, Operation::Read, "{metrics:?} {ruler}");
            }
        }
    }

    #[test]
    fn a_mimir_or_cortex_rule_group_has_its_source_tenants_checked() {
        let table = RouteTable::new(false, Some(MetricsScoping::HeaderScopesEveryApi), false);
        for ruler in ["/config/v1/rules/ns", "/rules/ns"] {
            let post = table.classify(&Method::POST, ruler).unwrap();
            assert_eq!(post.operation, Operation::FederatedRuleGroup, "{ruler}");
            let get = table.classify(&Method::GET, ruler).unwrap();
            assert_eq!(get.operation, Operation::Read, "{ruler}");
        }
    }

    #[test]
    fn disabled_signal_has_no_routes() {
        assert!(RouteTable::new(false, None, false)
            .classify(&Method::POST, "/loki/api/v1/push")
            .is_err());
        assert!(RouteTable::new(true, None, false)
            .classify(&Method::GET, "/api/v1/query")
            .is_err());
    }

    /// Thanos Query scopes queries, series and labels by its tenant header,
    /// not rules, alerts or exemplars: with such a header those are not
    /// served, nor Mimir's and Cortex's own APIs, and metadata is empty.
    #[test]
    fn a_header_that_scopes_queries_only_serves_only_queries() {
        let thanos = RouteTable::new(false, Some(MetricsScoping::HeaderScopesQueries), true);
        for (method, path) in [
            (Method::GET, "/api/v1/query"),
            (Method::POST, "/api/v1/query_range"),
            (Method::GET, "/api/v1/series"),
            (Method::POST, "/api/v1/labels"),
            (Method::GET, "/api/v1/label/job/values"),
            (Method::GET, "/api/v1/status/buildinfo"),
        ] {
            let route = thanos.classify(&method, path).unwrap();
            assert_eq!(
                (route.operation, route.scope),
                (Operation::Read, Scope::MetricsRead),
                "{path}"
            );
        }
        for path in ["/api/v1/write", "/api/v1/receive"] {
            let push = thanos.classify(&Method::POST, path).unwrap();
            assert_eq!(
                (push.operation, push.scope),
                (Operation::Push, Scope::MetricsWrite)
            );
        }
        let metadata = thanos.classify(&Method::GET, "/api/v1/metadata").unwrap();
        assert_eq!(metadata.operation, Operation::EmptyMetadata);
        // Each served for Mimir and Cortex, refused here.
        let mimir = RouteTable::new(false, Some(MetricsScoping::HeaderScopesEveryApi), true);
        for path in [
            "/api/v1/rules",
            "/api/v1/alerts",
            "/api/v1/query_exemplars",
            "/federate",
            "/config/v1/rules",
            "/rules/namespace",
            "/alertmanager/api/v2/silences",
            "/am/alertmanager/api/v2/alerts",
        ] {
            assert!(
                mimir.classify(&Method::GET, path).is_ok(),
                "{path} for Mimir"
            );
            assert!(
                thanos.classify(&Method::GET, path).is_err(),
                "{path} is served"
            );
        }
        assert_eq!(
            mimir
                .classify(&Method::GET, "/api/v1/metadata")
                .unwrap()
                .operation,
            Operation::Read
        );
    }

    #[test]
    fn prometheus_label_mode_enforces_and_header_mode_forwards() {
        let label = table()
            .classify(&Method::POST, "/api/v1/query_range")
            .unwrap();
        assert_eq!(label.operation, Operation::Enforce(Selectors::Query));
        assert_eq!(label.scope, Scope::MetricsRead);
        let header = RouteTable::new(false, Some(MetricsScoping::HeaderScopesEveryApi), false);
        let route = header.classify(&Method::GET, "/api/v1/series").unwrap();
        assert_eq!(route.operation, Operation::Read);
        for path in ["/api/v1/write", "/api/v1/push"] {
            let push = header.classify(&Method::POST, path).unwrap();
            assert_eq!(
                (push.operation, push.scope),
                (Operation::Push, Scope::MetricsWrite)
            );
        }
        let write = table().classify(&Method::POST, "/api/v1/write").unwrap();
        assert_eq!(
            (write.operation, write.scope),
            (Operation::RemoteWrite, Scope::MetricsWrite)
        );
        assert!(table().classify(&Method::POST, "/api/v1/push").is_err());
    }

    #[test]
    fn mimirs_alertmanager_configuration_lives_under_the_data_source_root() {
        let header = RouteTable::new(false, Some(MetricsScoping::HeaderScopesEveryApi), true);
        let list = header.classify(&Method::GET, "/api/v1/alerts").unwrap();
        assert_eq!(
            (list.signal, list.scope),
            (Signal::Metrics, Scope::MetricsRead),
            "the metrics data source's alerts list keeps its path"
        );
        for method in [Method::GET, Method::POST, Method::DELETE] {
            let config = header.classify(&method, "/am/api/v1/alerts").unwrap();
            assert_eq!(
                (config.signal, config.operation, config.scope),
                (Signal::Alerts, Operation::Read, Scope::AlertsWrite),
                "{method}: the configuration holds receivers' credentials"
            );
        }
        let silences = header
            .classify(&Method::GET, "/am/alertmanager/api/v2/silences")
            .unwrap();
        assert_eq!(
            (silences.operation, silences.scope),
            (Operation::Read, Scope::AlertsRead)
        );
        assert!(header.classify(&Method::PUT, "/am/api/v1/alerts").is_err());
        assert!(header
            .classify(&Method::POST, "/am/alertmanager/api/v2/alerts")
            .is_err());
        // Label mode: a vanilla Alertmanager has no configuration API; its
        // API v2 is under the same data-source root.
        assert!(table().classify(&Method::GET, "/am/api/v1/alerts").is_err());
        let vanilla = table()
            .classify(&Method::POST, "/am/api/v2/silences")
            .unwrap();
        assert_eq!(vanilla.scope, Scope::AlertsWrite);
    }

    #[test]
    fn refuses_prometheus_admin_and_global_endpoints() {
        for path in [
            "/api/v1/targets",
            "/api/v1/targets/metadata",
            "/api/v1/status/config",
            "/api/v1/status/flags",
            "/api/v1/status/tsdb",
            "/api/v1/status/runtimeinfo",
            "/api/v1/admin/tsdb/delete_series",
            "/api/v1/admin/tsdb/snapshot",
            "/-/reload",
            "/-/quit",
            "/api/v1/read",
            "/api/v1/alertmanagers",
            "/api/v1/format_query",
            "/graph",
            "/prometheus/api/v1/query",
        ] {
            for method in [Method::GET, Method::POST, Method::PUT] {
                assert!(table().classify(&method, path).is_err(), "{method} {path}");
            }
        }
        // Label values and federate are GET-only upstream.
        assert!(matches!(
            table().classify(&Method::POST, "/api/v1/label/job/values"),
            Err(ProxyError::MethodNotAllowed { .. })
        ));
    }
}
