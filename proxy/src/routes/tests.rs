use http::Method;

use super::loki::{LOKI_LABEL_POLICY_ROUTES, LOKI_ROUTES};
use super::*;
use crate::config::MetricsScoping;
use crate::enforce::prometheus::Selectors;
use crate::http::error::ProxyError;
use crate::tenants::Scope;

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
        // `{}` is one segment that is not empty.
        "/loki/api/v1/rules/",
        "/loki/api/v1/label//values",
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

/// Each surface a route is counted under, by one route of each.
#[test]
fn each_route_is_counted_under_its_surface() {
    let header = RouteTable::new(true, Some(MetricsScoping::HeaderScopesEveryApi), true);
    for (table, method, path, surface) in [
        (table(), Method::POST, "/loki/api/v1/push", "logs_push"),
        (table(), Method::GET, "/loki/api/v1/tail", "logs_tail"),
        (
            table(),
            Method::GET,
            "/loki/api/v1/query_range",
            "logs_query",
        ),
        (table(), Method::GET, "/loki/api/v1/rules", "logs_rules"),
        (
            table(),
            Method::DELETE,
            "/loki/api/v1/delete",
            "logs_delete",
        ),
        (table(), Method::GET, "/prometheus/api/v1/alerts", "alerts"),
        (table(), Method::POST, "/otlp/v1/logs", "logs_otlp"),
        (table(), Method::POST, "/api/v1/write", "metrics_push"),
        (
            table(),
            Method::POST,
            "/api/v1/otlp/v1/metrics",
            "metrics_otlp",
        ),
        (table(), Method::GET, "/api/v1/query", "metrics_query"),
        (table(), Method::GET, "/api/v2/silences", "alerts"),
        (&header, Method::POST, "/api/v1/push", "metrics_push"),
        (&header, Method::GET, "/config/v1/rules", "metrics_rules"),
        (&header, Method::POST, "/otlp/v1/metrics", "metrics_otlp"),
    ] {
        let route = table.classify(&method, path).unwrap();
        assert_eq!(route.surface(), surface, "{method} {path}");
    }
}

/// Pushes are the routes that carry data in (an unreachable upstream
/// must make their clients retry); OTLP routes answer in OTLP's format.
#[test]
fn pushes_and_otlp_routes_are_told_by_their_operation() {
    for metrics in EVERY_METRICS_SCOPING {
        for route in &RouteTable::new(true, metrics, true).routes {
            let pattern = route.pattern;
            let push = matches!(route.scope, Scope::LogsWrite | Scope::MetricsWrite);
            assert_eq!(route.operation.is_push(), push, "{pattern}");
            assert_eq!(
                route.operation.is_otlp(),
                pattern.contains("/otlp/"),
                "{pattern}"
            );
        }
    }
}

/// Every surface a route can have is one the upstream-duration histograms
/// are kept for directly (`ops::metrics::SURFACES`); one missing would
/// still be counted, the slow way.
#[test]
fn every_surface_is_listed_for_the_metrics() {
    for metrics in EVERY_METRICS_SCOPING {
        for table in [true, false].map(|enabled| RouteTable::new(enabled, metrics, enabled)) {
            for route in &table.routes {
                let surface = route.surface();
                assert!(
                    crate::ops::metrics::SURFACES.contains(&surface),
                    "{surface} ({}) is not in SURFACES",
                    route.pattern
                );
            }
        }
    }
}
