//! The metrics backends' routes: the Prometheus API label mode serves,
//! and what header mode adds or leaves out for Mimir, Cortex and Thanos.

use super::route::{managed, metrics, Operation, Route, Signal, DELETE, GET, GET_POST, POST};
use crate::enforce::prometheus::{ResponseFilter, Selectors};
use crate::tenants::Scope;

/// The Prometheus API as label mode serves it. Header mode serves the same
/// paths, forwarded with the tenant header (`Operation::Read`). Everything
/// else (targets, status other than buildinfo, admin, `/-/*`, remote read,
/// format_query, ...) is refused by absence.
pub(super) const PROMETHEUS_ROUTES: &[Route] = &[
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
pub(super) const SCOPED_BY_A_QUERY_TENANT_HEADER: &[&str] = &[
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
pub(super) const HEADER_MODE_EXTRA_ROUTES: &[Route] = &[
    metrics(POST, "/api/v1/push", Operation::Push),
    metrics(POST, "/otlp/v1/metrics", Operation::OtlpPush),
];

/// Thanos Receive's remote-write path, which stamps every series with the
/// tenant its header names (`tenant_id` by default): served with a header
/// other than `X-Scope-OrgID`.
pub(super) const THANOS_RECEIVE: Route = metrics(POST, "/api/v1/receive", Operation::Push);

/// Mimir's ruler configuration API, under `metrics.upstream`'s prefix
/// (`<prometheus prefix>/config/v1/rules`), where Grafana's alerting sends a
/// Mimir data source's rule changes (header mode only).
pub(super) const MIMIR_RULER: [Route; 6] = ruler_api!(Signal::Metrics, "/config/v1/rules");

/// Cortex's ruler API as Grafana reaches it for a Prometheus data source of
/// subtype `cortex` (or none): `<url>/rules…`, so with `metrics.upstream:
/// http://cortex/api/prom` Cortex's `/api/prom/rules…` (header mode only).
pub(super) const CORTEX_RULER: [Route; 6] = ruler_api!(Signal::Metrics, "/rules");
