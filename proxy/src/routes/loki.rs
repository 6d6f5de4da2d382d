//! Loki's routes, all scoped by `X-Scope-OrgID`: pushes, reads, live
//! tail, its ruler and deletes; and which reads Loki holds to a label
//! policy.

use http::Method;

use super::route::{logs, managed, Operation, Route, Signal, DELETE, GET, GET_POST, POST};
use crate::tenants::Scope;

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
pub(super) const LOKI_LABEL_POLICY_ROUTES: &[&str] = &[
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
pub(super) const LOKI_ROUTES: &[Route] = &[
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

/// Loki's ruler, at both its paths: Grafana's alerting (LotexRuler) uses the
/// legacy `/api/prom/rules`.
pub(super) const LOKI_RULER: [[Route; 6]; 2] = [
    ruler_api!(Signal::Logs, "/loki/api/v1/rules"),
    ruler_api!(Signal::Logs, "/api/prom/rules"),
];
