//! The proxy's promise as a property: for any generated request (paths with
//! tricks, on query, push, OTLP and rules endpoints; PromQL good and bad,
//! parameters in the URL and the body, spoofed identity headers and the
//! headers of a backend's trusted callers), whatever reaches an upstream
//! carries the authenticated tenant and no other: Loki exactly one
//! `X-Scope-OrgID` with the credential's tenant, Prometheus (label mode)
//! no tenant header and every selector of every query or `match[]` holding
//! the tenant's matcher, Mimir (header mode, with its ruler and
//! Alertmanager paths) exactly the tenant's header; and none of them a
//! header that turns a backend's checks off. Anything else must have been
//! refused.

mod support;

use http::{Method, StatusCode};
use promql_parser::label::MatchOp;
use promql_parser::parser::{self, Expr, VectorSelector};
use proptest::prelude::*;
use support::loki::{LokiStandIn, Received};
use support::{basic, send, ProxyOptions, RunningProxy};

const USERS: &[(&str, &str, &str)] =
    &[("alice", "alice-pw", "team-a"), ("bob", "bob-pw", "team-b")];

const PATHS: &[&str] = &[
    "/loki/api/v1/query",
    "/loki/api/v1/query_range",
    "/loki/api/v1/labels",
    "/loki/api/v1/label/app/values",
    "/loki/api/v1/series",
    "/loki/api/v1/index/volume",
    "/api/v1/query",
    "/api/v1/query_range",
    "/api/v1/series",
    "/api/v1/labels",
    "/api/v1/label/job/values",
    "/api/v1/query_exemplars",
    "/federate",
    "/api/v1/rules",
    "/api/v1/alerts",
    "/api/v1/metadata",
    "/api/v1/status/buildinfo",
    "/api/v1/status/config",
    "/api/v1/admin/tsdb/delete_series",
    "/loki/api/v1/delete",
    "/loki/api/v1/push",
    "/otlp/v1/logs",
    "/loki/api/v1/rules",
    "/loki/api/v1/rules/ns/group",
    "/api/prom/rules/ns",
    "/prometheus/api/v1/rules",
    "/prometheus/api/v1/alerts",
    "/api/v1/write",
    "/api/v1/otlp/v1/metrics",
    "/otlp/v1/metrics",
    "/config/v1/rules",
    "/config/v1/rules/ns",
    "/rules/ns/group",
    "/alertmanager/api/v2/alerts",
    "/alertmanager/api/v2/silences",
];

/// Metrics paths and the parameter Prometheus (and Thanos) reads selectors
/// from there; these endpoints ignore other parameters.
const SELECTING: &[(&str, &str)] = &[
    ("/api/v1/query", "query"),
    ("/api/v1/query_range", "query"),
    ("/api/v1/query_exemplars", "query"),
    ("/api/v1/series", "match[]"),
    ("/api/v1/labels", "match[]"),
    ("/api/v1/label/job/values", "match[]"),
    ("/federate", "match[]"),
];

const QUERIES: &[&str] = &[
    "up",
    r#"up{namespace="team-b"}"#,
    r#"{__name__=~".+"}"#,
    r#"{namespace=~".*"}"#,
    r#"sum(rate(http_requests_total{job="api"}[5m]))"#,
    "topk(scalar(count(up)), up)",
    r#"up or {namespace="team-b"}"#,
    r#"up{a="1" or namespace="team-b"}"#,
    "up offset 5m",
    "up @ 100",
    "rate(up[5m:1m])",
    r#"label_replace(up, "namespace", "team-b", "", "")"#,
    r#"info(up)"#,
    "1 + 1",
    "up{",
    r#"{app="x"} |= "error""#,
];

const PARAMS: &[&str] = &[
    "query",
    "match[]",
    "QUERY",
    "start",
    "step",
    "query ",
    "match%5B%5D",
];

#[derive(Debug, Clone)]
struct Case {
    user: usize,
    post: bool,
    path: String,
    /// (name, value, in the body rather than the URL)
    params: Vec<(String, String, bool)>,
    spoof: Option<(String, String)>,
}

fn path_strategy() -> impl Strategy<Value = String> {
    (prop::sample::select(PATHS), 0..6usize).prop_map(|(path, trick)| match trick {
        0 => format!("/{path}"),
        1 => path.replacen("/v1/", "/./v1/", 1),
        2 => format!("{path}/"),
        3 => format!("/{}", path[1..].replacen('/', "%2F", 1)),
        4 => path.replacen("/api/", "/api/x/../", 1),
        _ => path.to_string(),
    })
}

fn case_strategy() -> impl Strategy<Value = Case> {
    let param = (
        prop::sample::select(PARAMS),
        prop::sample::select(QUERIES),
        any::<bool>(),
    )
        .prop_map(|(n, v, body)| (n.to_string(), v.to_string(), body));
    let spoof = prop::option::of((
        prop::sample::select(
            &[
                "X-Scope-OrgID",
                "x-scope-orgid",
                "X-SCOPE-ORGID",
                "X-Prom-Label-Policy",
                "THANOS-TENANT",
                "X-Mimir-SkipLabelNameValidation",
                "x-mimir-skiplabelcountvalidation",
                "X-Loki-Backfill-Shard",
                "X-Loki-Backfill-Day",
                "X-Loki-Disable-Pipeline-Wrappers",
                "X-Loki-Query-Limits",
                "X_Scope_OrgID",
                "thanos_tenant",
                "X-Prom-Label_Policy",
            ][..],
        ),
        prop::sample::select(&["team-b", "team-a|team-b", "team-b:%7B%7D", "", "true"][..]),
    ))
    .prop_map(|o| o.map(|(n, v)| (n.to_string(), v.to_string())));
    (
        0..USERS.len(),
        any::<bool>(),
        path_strategy(),
        prop::collection::vec(param, 0..4),
        spoof,
    )
        .prop_map(|(user, post, path, params, spoof)| Case {
            user,
            post,
            path,
            params,
            spoof,
        })
}

fn encode(pairs: &[(String, String, bool)], in_body: bool) -> String {
    let mut out = form_urlencoded::Serializer::new(String::new());
    for (name, value, body) in pairs {
        if *body == in_body {
            out.append_pair(name, value);
        }
    }
    out.finish()
}

async fn send_case(proxy: &RunningProxy, case: &Case) -> StatusCode {
    let (user, password, _) = USERS[case.user];
    let query = encode(&case.params, false);
    let url = if query.is_empty() {
        proxy.url(&case.path)
    } else {
        proxy.url(&format!("{}?{query}", case.path))
    };
    let mut headers = vec![];
    if let Some((name, value)) = &case.spoof {
        headers.push((name.as_str(), value.as_str()));
    }
    let (method, body) = if case.post {
        headers.push(("content-type", "application/x-www-form-urlencoded"));
        (Method::POST, encode(&case.params, true))
    } else {
        (Method::GET, String::new())
    };
    send(method, &url, Some(&basic(user, password)), &headers, body)
        .await
        .status
}

/// Every selector of `expr` carries `namespace="<tenant>"`.
fn every_selector_scoped(expr: &Expr, tenant: &str) -> bool {
    let scoped = |vs: &VectorSelector| {
        vs.matchers.or_matchers.is_empty()
            && vs
                .matchers
                .matchers
                .iter()
                .any(|m| m.name == "namespace" && m.op == MatchOp::Equal && m.value == tenant)
    };
    match expr {
        Expr::VectorSelector(vs) => scoped(vs),
        Expr::MatrixSelector(ms) => scoped(&ms.vs),
        Expr::Aggregate(a) => {
            a.param
                .as_ref()
                .is_none_or(|p| every_selector_scoped(p, tenant))
                && every_selector_scoped(&a.expr, tenant)
        }
        Expr::Unary(u) => every_selector_scoped(&u.expr, tenant),
        Expr::Binary(b) => {
            every_selector_scoped(&b.lhs, tenant) && every_selector_scoped(&b.rhs, tenant)
        }
        Expr::Paren(p) => every_selector_scoped(&p.expr, tenant),
        Expr::Subquery(s) => every_selector_scoped(&s.expr, tenant),
        Expr::Call(c) => {
            c.func.name != "info" && c.args.args.iter().all(|a| every_selector_scoped(a, tenant))
        }
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) => true,
        Expr::Extension(_) => false,
    }
}

/// What must hold of one forwarded request (`by_header`: to Loki, or to
/// Mimir in metrics header mode); `Err` names the violation.
/// `tenant_header`: the header the upstream takes the tenant from, or
/// `None` for label mode (the tenant's matcher on every selector).
fn check_forwarded(
    seen: &Received,
    tenant: &str,
    tenant_header: Option<&str>,
) -> Result<(), String> {
    let values = |name: &str| -> Vec<String> {
        seen.headers
            .get_all(name)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect()
    };
    for identity in [
        "authorization",
        "x-prom-label-policy",
        "thanos-tenant",
        "x-scope-orgid",
    ] {
        if Some(identity) != tenant_header && !values(identity).is_empty() {
            return Err(format!("{identity} forwarded to {}", seen.path));
        }
    }
    // Headers for a backend's trusted callers, which turn its checks off
    // or set them.
    for trusted_callers_header in [
        "x-mimir-skiplabelnamevalidation",
        "x-mimir-skiplabelcountvalidation",
        "x-loki-backfill-shard",
        "x-loki-backfill-day",
        "x-loki-disable-pipeline-wrappers",
        "x-loki-query-limits",
    ] {
        if !values(trusted_callers_header).is_empty() {
            return Err(format!(
                "{trusted_callers_header} forwarded to {}",
                seen.path
            ));
        }
    }
    // Read as the name with `-` by some readers between proxy and backend.
    if let Some(name) = (seen.headers.keys()).find(|name| name.as_str().contains('_')) {
        return Err(format!("{name} forwarded to {}", seen.path));
    }
    if let Some(header) = tenant_header {
        if values(header) != [tenant] {
            return Err(format!("{}: {header} {:?}", seen.path, values(header)));
        }
        return Ok(());
    }
    let Some(&(_, param)) = SELECTING.iter().find(|(path, _)| *path == seen.path) else {
        return Ok(());
    };
    let mut pairs: Vec<(String, String)> =
        form_urlencoded::parse(seen.query.as_deref().unwrap_or("").as_bytes())
            .into_owned()
            .collect();
    pairs.extend(form_urlencoded::parse(&seen.body).into_owned());
    let selectors: Vec<&String> = pairs
        .iter()
        .filter(|(n, _)| n == param)
        .map(|(_, v)| v)
        .collect();
    if param == "match[]" && selectors.is_empty() {
        return Err(format!("{}: no match[] forwarded", seen.path));
    }
    for value in selectors {
        let expr = parser::parse(value)
            .map_err(|e| format!("{}: unparseable {value:?}: {e}", seen.path))?;
        if !every_selector_scoped(&expr, tenant) {
            return Err(format!("{}: unscoped {value:?}", seen.path));
        }
    }
    Ok(())
}

#[test]
fn nothing_reaches_an_upstream_without_the_authenticated_tenant() {
    nothing_reaches_an_upstream_without_the_tenant_in(MetricsMode::Label);
}

/// The same with Mimir behind metrics header mode, its Alertmanager too:
/// every metrics, rules and alerting request carries exactly the tenant's
/// header.
#[test]
fn nothing_reaches_mimir_without_the_authenticated_tenant() {
    nothing_reaches_an_upstream_without_the_tenant_in(MetricsMode::Header);
}

/// And with Thanos Query (`THANOS-TENANT`): the header, exactly the
/// tenant's, and only on the paths Thanos scopes by it.
#[test]
fn nothing_reaches_thanos_without_the_authenticated_tenant_or_beyond_what_it_scopes() {
    nothing_reaches_an_upstream_without_the_tenant_in(MetricsMode::ThanosHeader);
}

#[derive(Clone, Copy, PartialEq)]
enum MetricsMode {
    Label,
    Header,
    ThanosHeader,
}

impl MetricsMode {
    fn tenant_header(self) -> Option<&'static str> {
        match self {
            MetricsMode::Label => None,
            MetricsMode::Header => Some("x-scope-orgid"),
            MetricsMode::ThanosHeader => Some("thanos-tenant"),
        }
    }
}

/// What Thanos Query scopes by its tenant header, and the pushes.
const THANOS_SCOPED: &[&str] = &[
    "/api/v1/query",
    "/api/v1/query_range",
    "/api/v1/series",
    "/api/v1/labels",
    "/api/v1/status/buildinfo",
    "/api/v1/write",
    "/api/v1/push",
    "/api/v1/receive",
    "/otlp/v1/metrics",
];

fn scoped_by_thanos(path: &str) -> bool {
    THANOS_SCOPED.contains(&path)
        || path
            .strip_prefix("/api/v1/label/")
            .and_then(|rest| rest.strip_suffix("/values"))
            .is_some_and(|name| !name.contains('/'))
}

fn nothing_reaches_an_upstream_without_the_tenant_in(mode: MetricsMode) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (loki, metrics, proxy) = runtime.block_on(async {
        support::captured_logs();
        let loki = LokiStandIn::start().await;
        let metrics = LokiStandIn::start().await;
        let mut options = ProxyOptions::new(loki.url());
        options.metrics = Some(match mode {
            MetricsMode::Label => format!("  upstream: {}\n  mode: label\n", metrics.url()),
            MetricsMode::Header => {
                let alerts = format!("alerts:\n  upstream: {}\n", metrics.url());
                options.extra = Box::leak(alerts.into_boxed_str());
                format!("  upstream: {}\n  mode: header\n", metrics.url())
            }
            MetricsMode::ThanosHeader => {
                support::header_mode_section(&metrics.url(), "THANOS-TENANT")
            }
        });
        let proxy = RunningProxy::start(options).await;
        (loki, metrics, proxy)
    });
    let mut runner = support::property_runner(256);
    let forwarded = std::cell::Cell::new(0);
    let result = runner.run(&case_strategy(), |case| {
        let (before_logs, before_metrics) = (loki.received().len(), metrics.received().len());
        let status = runtime.block_on(send_case(&proxy, &case));
        let tenant = USERS[case.user].2;
        for (stand_in, before, tenant_header) in [
            (&loki, before_logs, Some("x-scope-orgid")),
            (&metrics, before_metrics, mode.tenant_header()),
        ] {
            for seen in &stand_in.received()[before..] {
                forwarded.set(forwarded.get() + 1);
                let beyond_thanos = mode == MetricsMode::ThanosHeader
                    && std::ptr::eq(stand_in, &metrics)
                    && !scoped_by_thanos(&seen.path);
                let checked = if beyond_thanos {
                    Err(format!("{} reached Thanos", seen.path))
                } else {
                    check_forwarded(seen, tenant, tenant_header)
                };
                checked.map_err(|violation| {
                    TestCaseError::fail(format!("{violation} (answered {status}) for {case:?}"))
                })?;
            }
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    // The generator must reach the upstreams, or the property says nothing.
    let forwarded = forwarded.get();
    assert!(forwarded > 50, "only {forwarded} requests were forwarded");
}
