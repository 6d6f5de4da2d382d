//! Tenant-managed rules and deletes on Loki (header mode): each route needs
//! its own scope, write powers only when granted, never for a credential
//! narrowed by a selector; what reaches Loki carries the tenant header.

mod support;

use http::{Method, StatusCode};
use support::loki::LokiStandIn;
use support::{basic, cheap_hash, send, ProxyOptions, RunningProxy};

/// A rule group posted by team-a's `ruler` credential (`rules:write`).
async fn post_as_ruler(
    proxy: &RunningProxy,
    path: &str,
    headers: &[(&str, &str)],
    group: impl Into<bytes::Bytes>,
) -> support::Reply {
    let url = proxy.url(path);
    send(
        Method::POST,
        &url,
        Some(&basic("ruler", "pw")),
        headers,
        group,
    )
    .await
}

/// team-a with one credential per scope set the matrix needs.
fn tenants() -> String {
    let user = |name: &str, extra: &str| {
        format!(
            "      - {{username: {name}, password_hash: \"{}\"{extra}}}\n",
            cheap_hash("pw")
        )
    };
    format!(
        "version: 1\ntenants:\n  - id: team-a\n    users:\n{}{}{}{}{}{}",
        user("default", ""),
        user("ruler", ", scopes: [rules:read, rules:write]"),
        user("silencer", ", scopes: [alerts:read, alerts:write]"),
        user("deleter", ", scopes: [logs:delete]"),
        user(
            "grafana",
            ", scopes: [logs:read, metrics:read, rules:read, rules:write]",
        ),
        user(
            "narrow",
            ", scopes: [logs:read, rules:read, alerts:read], selector: '{app=\"x\"}'"
        ),
    )
}

/// (method, path, body) for every new Loki route, and who may call it.
const ROUTES: &[(Method, &str, &[&str])] = &[
    (Method::GET, "/loki/api/v1/rules", &["default", "ruler"]),
    (Method::GET, "/loki/api/v1/rules/ns", &["default", "ruler"]),
    (
        Method::GET,
        "/loki/api/v1/rules/ns/group",
        &["default", "ruler"],
    ),
    (Method::POST, "/loki/api/v1/rules/ns", &["ruler"]),
    (Method::DELETE, "/loki/api/v1/rules/ns", &["ruler"]),
    (Method::DELETE, "/loki/api/v1/rules/ns/group", &["ruler"]),
    (Method::GET, "/api/prom/rules", &["default", "ruler"]),
    (
        Method::GET,
        "/api/prom/rules/ns/group",
        &["default", "ruler"],
    ),
    (Method::POST, "/api/prom/rules/ns", &["ruler"]),
    (Method::DELETE, "/api/prom/rules/ns/group", &["ruler"]),
    (
        Method::GET,
        "/prometheus/api/v1/rules",
        &["default", "ruler"],
    ),
    (
        Method::GET,
        "/prometheus/api/v1/alerts",
        &["default", "silencer"],
    ),
    (Method::POST, "/loki/api/v1/delete", &["deleter"]),
    (Method::GET, "/loki/api/v1/delete", &["deleter"]),
    (Method::DELETE, "/loki/api/v1/delete", &["deleter"]),
];

#[tokio::test]
async fn every_rules_and_delete_route_against_every_scope_set() {
    let loki = LokiStandIn::start().await;
    let mut options = ProxyOptions::new(loki.url());
    options.tenants = Some(tenants());
    let proxy = RunningProxy::start(options).await;
    let group = "name: g\nrules:\n  - alert: HighErrors\n    expr: sum(rate({app=\"x\"} |= \"error\" [5m])) > 1\n";
    for (method, path, allowed) in ROUTES {
        for user in ["default", "ruler", "silencer", "deleter", "narrow"] {
            let before = loki.received().len();
            let (headers, body): (&[(&str, &str)], &str) = if *method == Method::POST {
                (
                    &[
                        ("content-type", "application/yaml"),
                        ("x-scope-orgid", "team-b"),
                    ],
                    group,
                )
            } else {
                (&[("x-scope-orgid", "team-b")], "")
            };
            let reply = send(
                method.clone(),
                &proxy.url(path),
                Some(&basic(user, "pw")),
                headers,
                body,
            )
            .await;
            let seen = loki.received();
            if allowed.contains(&user) {
                assert!(
                    reply.status.is_success(),
                    "{user} {method} {path}: {}",
                    reply.status
                );
                let last = seen.last().unwrap();
                assert_eq!((&last.method, last.path.as_str()), (method, *path));
                assert_eq!(last.org_ids(), ["team-a"], "{method} {path}");
                assert_eq!(last.body, body.as_bytes(), "the rule group as sent");
            } else {
                assert_eq!(
                    reply.status,
                    StatusCode::FORBIDDEN,
                    "{user} {method} {path}"
                );
                assert_eq!(seen.len(), before, "{user} {method} {path} reached Loki");
                // Refused for lacking the scope, or (holding it) for the
                // selector that cannot narrow rules and alerts.
                let why = reply.text();
                assert!(why.contains("selector") || why.contains("lacks"), "{why}");
                if user == "narrow" && *method == Method::GET && !path.contains("delete") {
                    assert!(why.contains("selector"), "{path}: {why}");
                }
            }
        }
    }
    // Loki's own ruler pages stay closed.
    for path in [
        "/ruler/ring",
        "/loki/api/v1/rules/a/b/c",
        "/api/prom/rules/a/b/c",
    ] {
        let reply = send(
            Method::GET,
            &proxy.url(path),
            Some(&basic("ruler", "pw")),
            &[],
            "",
        )
        .await;
        assert_eq!(reply.status, StatusCode::NOT_FOUND, "{path}");
    }
}

/// A proxy with the logs and the metrics (label mode) both at `upstream`.
async fn label_mode_before(upstream: &LokiStandIn) -> RunningProxy {
    let mut options = ProxyOptions::new(upstream.url());
    options.tenants = Some(tenants());
    options.metrics = Some(format!("  upstream: {}\n  mode: label\n", upstream.url()));
    RunningProxy::start(options).await
}

/// Prometheus 3.x pages `rules` over every tenant's groups, each page
/// naming the next by a digest of another tenant's group. Grafana asks for
/// pages; in label mode the request goes up unpaged (its other parameters
/// as sent), and the tenant gets all its groups at once, with no token.
#[tokio::test]
async fn rules_are_listed_unpaged_in_label_mode() {
    let prometheus = LokiStandIn::start().await;
    let proxy = label_mode_before(&prometheus).await;
    let query = "type=alert&group_limit=1&rule_name%5B%5D=x&group%5Fnext%5Ftoken=abc&rule_name[]=y";
    let reply = send(
        Method::GET,
        &proxy.url(&format!("/api/v1/rules?{query}")),
        Some(&basic("grafana", "pw")),
        &[],
        "",
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let seen = prometheus.last();
    assert_eq!(seen.path, "/api/v1/rules");
    assert_eq!(
        seen.query.as_deref(),
        Some("type=alert&rule_name%5B%5D=x&rule_name%5B%5D=y")
    );
    let data = &reply.json()["data"];
    let names: Vec<&str> = (data["groups"].as_array().unwrap().iter())
        .map(|group| group["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a-first", "c-also-a"]);
    let fields: Vec<&String> = data.as_object().unwrap().keys().collect();
    assert_eq!(fields, ["groups"], "{data}");

    // The stand-in pages when asked: the request sent on as it came would
    // have come back with one group and a token.
    let paged = send(
        Method::GET,
        &format!("{}/api/v1/rules?group_limit=1", prometheus.url()),
        None,
        &[],
        "",
    )
    .await;
    assert!(
        paged.json()["data"]["groupNextToken"].is_string(),
        "{}",
        paged.text()
    );
}

/// In label mode what a Loki rule records or raises reaches the metrics
/// backend and the Alertmanager, which scope by the tenant label; a rule's
/// result can carry any value of it (`label_format`, a pushed stream
/// label), and its own `labels` win. So every rule that reaches Loki pins
/// the label to the tenant, whatever the group said.
#[tokio::test]
async fn in_label_mode_every_loki_rule_pins_the_tenant_label() {
    let loki = LokiStandIn::start().await;
    let proxy = label_mode_before(&loki).await;
    let group = concat!(
        "name: g\nrules:\n",
        "  - record: errors:rate5m\n",
        "    expr: sum by (namespace) (rate({app=\"x\"} | label_format namespace=\"team-b\" [5m]))\n",
        "  - alert: Paged\n    expr: vector(1)\n",
        "    labels: {namespace: team-b, severity: page}\n",
    );
    let headers = [
        ("content-type", "application/yaml"),
        ("x-scope-orgid", "team-b"),
    ];
    for ruler in ["/loki/api/v1/rules/ns", "/api/prom/rules/ns"] {
        let reply = post_as_ruler(&proxy, ruler, &headers, group).await;
        assert_eq!(
            reply.status,
            StatusCode::ACCEPTED,
            "{ruler}: {}",
            reply.text()
        );
        let seen = loki.received();
        let last = seen.last().unwrap();
        assert_eq!(last.org_ids(), ["team-a"]);
        let stored: serde_yaml_ng::Value = serde_yaml_ng::from_slice(&last.body).unwrap();
        let rules = stored["rules"].as_sequence().unwrap();
        assert_eq!(rules.len(), 2);
        for rule in rules {
            assert_eq!(rule["labels"]["namespace"], "team-a", "{ruler}: {rule:?}");
        }
        assert_eq!(rules[1]["labels"]["severity"], "page");
        assert!(rules[0]["expr"].as_str().unwrap().contains("label_format"));
    }
    // Per post: the recording rule had no label, the alert another's.
    let metrics = proxy.metrics().await;
    for action in ["added", "overwritten"] {
        let line = format!(
            r#"tenant_proxy_rule_tenant_label_total{{tenant="team-a",action="{action}"}} 2"#
        );
        assert!(metrics.contains(&line), "{line} in {metrics}");
    }
    // A group Loki could not read is refused here and never reaches it.
    let before = loki.received().len();
    let reply = post_as_ruler(
        &proxy,
        "/loki/api/v1/rules/ns",
        &headers,
        "name: g\nrules: [\n",
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text());
    assert!(reply.text().contains("rule group"), "{}", reply.text());
    assert_eq!(loki.received().len(), before);

    // Under `reject`, the foreign alert refuses the whole group.
    let mut options = ProxyOptions::new(loki.url());
    options.tenants = Some(tenants());
    options.metrics = Some(format!(
        "  upstream: {}\n  mode: label\n  foreign_label: reject\n",
        loki.url()
    ));
    let strict = RunningProxy::start(options).await;
    let reply = post_as_ruler(&strict, "/loki/api/v1/rules/ns", &headers, group).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text());
    assert!(reply.text().contains("Paged"), "{}", reply.text());
    assert_eq!(loki.received().len(), before);
    assert!(strict
        .metrics()
        .await
        .contains(r#"tenant_proxy_rule_tenant_label_total{tenant="team-a",action="rejected"} 1"#));
}

/// A rule group of hundreds of KiB (read on a body worker, from 256 KiB)
/// is pinned whole: every rule reaches Loki with the tenant's label, in
/// order, the foreign ones overwritten.
#[tokio::test]
async fn a_large_loki_rule_group_is_pinned_whole() {
    let loki = LokiStandIn::start().await;
    let proxy = label_mode_before(&loki).await;
    let rules: String = (0..3_000)
        .map(|i| {
            let namespace = ["team-a", "team-b"][i % 2];
            format!(
                "  - record: large:rule_{i}:rate5m\n    expr: sum(rate({{app=\"a{i}\"}}[5m]))\n    labels: {{namespace: {namespace}}}\n"
            )
        })
        .collect();
    let group = format!("name: large\nrules:\n{rules}");
    assert!(group.len() >= 256 * 1024, "{} bytes", group.len());
    let headers = [("content-type", "application/yaml")];
    let reply = post_as_ruler(&proxy, "/loki/api/v1/rules/ns", &headers, group).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.text());
    let stored: serde_yaml_ng::Value =
        serde_yaml_ng::from_slice(&loki.received().last().unwrap().body).unwrap();
    let rules = stored["rules"].as_sequence().unwrap();
    assert_eq!(rules.len(), 3_000);
    for (i, rule) in rules.iter().enumerate() {
        assert_eq!(rule["record"], format!("large:rule_{i}:rate5m").as_str());
        assert_eq!(rule["labels"]["namespace"], "team-a", "{rule:?}");
    }
}

/// The stand-in refuses the rule groups Loki refuses, each for its own
/// reason, and takes a valid one with 202; posted through the proxy
/// without metrics, so the group reaches it as sent.
#[tokio::test]
async fn the_loki_stand_in_refuses_the_rule_groups_loki_refuses() {
    let loki = LokiStandIn::start().await;
    let mut options = ProxyOptions::new(loki.url());
    options.tenants = Some(tenants());
    let proxy = RunningProxy::start(options).await;
    let rule = |body: &str| format!("name: g\nrules:\n  - {body}\n");
    let cases = [
        ("rules: [\n".to_owned(), "unable to decoded"),
        (
            "name: g\nname: h\nrules: []\n".to_owned(),
            "unable to decoded",
        ),
        ("rules: []\n".to_owned(), "name must not be empty"),
        (rule("expr: vector(1)"), "invalid rule"),
        (
            rule("record: a\n    alert: b\n    expr: vector(1)"),
            "invalid rule",
        ),
        (rule("record: a"), "invalid rule"),
        (rule("record: a-b\n    expr: vector(1)"), "invalid rule"),
        (
            rule("record: a\n    expr: vector(1)\n    for: 5m"),
            "invalid rule",
        ),
        (
            rule("alert: a\n    expr: vector(1)\n    labels: {\"a.b\": x}"),
            "invalid rule",
        ),
        (
            rule("alert: a\n    expr: vector(1)\n    labels: {__name__: x}"),
            "invalid rule",
        ),
    ];
    for (group, why) in cases {
        let reply = post_as_ruler(&proxy, "/loki/api/v1/rules/ns", &[], group.clone()).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{group}");
        assert!(reply.text().contains(why), "{group}: {}", reply.text());
    }
    let valid = rule("alert: a\n    expr: vector(1)\n    for: 5m\n    labels: {severity: page}");
    let reply = post_as_ruler(&proxy, "/loki/api/v1/rules/ns", &[], valid).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.text());

    // Playing Mimir's ruler (asked directly: the proxy refuses these
    // first), `source_tenants` must decode as a list of strings.
    for (sources, status) in [
        ("[team-a, team-b]", StatusCode::ACCEPTED),
        ("team-a", StatusCode::BAD_REQUEST),
        ("[[team-a]]", StatusCode::BAD_REQUEST),
    ] {
        let group = format!("name: g\nsource_tenants: {sources}\nrules: []\n");
        let url = format!("{}/prometheus/config/v1/rules/ns", loki.url());
        let reply = send(
            Method::POST,
            &url,
            None,
            &[("x-scope-orgid", "team-a")],
            group,
        )
        .await;
        assert_eq!(reply.status, status, "{sources}: {}", reply.text());
    }
}

#[test]
fn a_selector_with_a_write_scope_is_refused_when_the_file_loads() {
    for write in ["rules:write", "alerts:write", "logs:delete"] {
        let text = format!(
            "version: 1\ntenants:\n  - id: team-a\n    users:\n      - {{username: n, password_hash: \"{}\", scopes: [logs:read, {write}], selector: '{{app=\"x\"}}'}}\n",
            cheap_hash("pw")
        );
        let error = tenant_proxy::tenants::file::parse(&text, 1)
            .unwrap_err()
            .to_string();
        assert!(error.contains(write), "{write}: {error}");
    }
}

/// Grafana's alerting manages a Mimir data source's rules at
/// `<url>/config/v1/rules...` (LotexRuler, subtype mimir); in header mode
/// that lands under `metrics.upstream`'s `/prometheus` prefix, Mimir's
/// ruler configuration API, with the tenant header.
#[tokio::test]
async fn mimirs_ruler_configuration_api_is_served_in_header_mode() {
    let mimir = LokiStandIn::start().await;
    let section = format!("  upstream: {}/prometheus\n  mode: header\n", mimir.url());
    let proxy = RunningProxy::start(ProxyOptions::metrics(tenants(), section)).await;
    let group = "name: g\nrules:\n  - record: x:sum\n    expr: sum(x)\n";
    let cases = [
        (Method::GET, "/config/v1/rules", "default", true),
        (Method::GET, "/config/v1/rules/ns/g", "ruler", true),
        (Method::POST, "/config/v1/rules/ns", "ruler", true),
        (Method::POST, "/config/v1/rules/ns", "default", false),
        (Method::DELETE, "/config/v1/rules/ns/g", "ruler", true),
        (Method::GET, "/config/v1/rules", "narrow", false),
    ];
    for (method, path, user, allowed) in cases {
        let before = mimir.received().len();
        let body = if method == Method::POST { group } else { "" };
        let reply = send(
            method.clone(),
            &proxy.url(path),
            Some(&basic(user, "pw")),
            &[],
            body,
        )
        .await;
        let seen = mimir.received();
        if allowed {
            assert!(
                reply.status.is_success(),
                "{user} {method} {path}: {}",
                reply.text()
            );
            let last = seen.last().unwrap();
            assert_eq!(last.path, format!("/prometheus{path}"));
            assert_eq!(last.org_ids(), ["team-a"]);
            assert_eq!(yaml(&last.body), yaml(body.as_bytes()));
        } else {
            assert_eq!(
                reply.status,
                StatusCode::FORBIDDEN,
                "{user} {method} {path}"
            );
            assert_eq!(seen.len(), before);
        }
    }
    // A federated group (Mimir with `-ruler.tenant-federation.enabled`)
    // queries the tenants it names: only the tenant's own passes.
    let federated = |sources: &str| {
        format!("name: f\nsource_tenants: {sources}\nrules:\n  - record: x:sum\n    expr: sum(x)\n")
    };
    for (sources, status) in [
        ("[team-a]", StatusCode::ACCEPTED),
        ("[team-a, team-b]", StatusCode::FORBIDDEN),
        ("[\"team-a|team-b\"]", StatusCode::FORBIDDEN),
    ] {
        let before = mimir.received().len();
        let body = federated(sources);
        let reply = post_as_ruler(
            &proxy,
            "/config/v1/rules/ns",
            &[("content-type", "application/yaml")],
            body.clone(),
        )
        .await;
        assert_eq!(reply.status, status, "{sources}: {}", reply.text());
        let seen = mimir.received();
        match status {
            StatusCode::ACCEPTED => {
                assert_eq!(yaml(&seen.last().unwrap().body), yaml(body.as_bytes()))
            }
            _ => assert_eq!(seen.len(), before, "{sources} reached Mimir"),
        }
    }
    // Mimir reads what the proxy checked, not the client's spelling of it:
    // an alias leaves resolved.
    let aliased = "mine: &m [team-a]\nname: f\nsource_tenants: *m\nrules:\n  - record: x:sum\n    expr: sum(x)\n";
    let reply = post_as_ruler(&proxy, "/config/v1/rules/ns", &[], aliased).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.text());
    let last = mimir.last();
    assert_eq!(
        last.body,
        "mine:\n- team-a\nname: f\nsource_tenants:\n- team-a\nrules:\n- record: x:sum\n  expr: sum(x)\n"
    );
    assert_eq!(last.headers["content-type"], "application/yaml");
    // A merge key Go's decoder would apply is refused, never forwarded.
    let before = mimir.received().len();
    let merged = "base: &b {source_tenants: [team-b]}\n<<: *b\nname: f\nrules:\n  - record: x:sum\n    expr: sum(x)\n";
    let reply = post_as_ruler(&proxy, "/config/v1/rules/ns", &[], merged).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text());
    assert_eq!(mimir.received().len(), before);
}

/// Mimir's Alertmanager (header mode, `alerts.upstream` at Mimir's root):
/// the API v2 Grafana calls under `/alertmanager`, forwarded as sent with
/// the tenant header; silences need `alerts:write`; a selector-restricted
/// credential is refused; posting alerts and `/-/reload` are not served.
#[tokio::test]
async fn mimirs_alertmanager_is_served_in_header_mode_with_the_tenant_header() {
    let mimir = LokiStandIn::start().await;
    let section = format!("  upstream: {}/prometheus\n  mode: header\n", mimir.url());
    let mut options = ProxyOptions::metrics(tenants(), section);
    let alerts = format!("alerts:\n  upstream: {}\n", mimir.url());
    options.extra = Box::leak(alerts.into_boxed_str());
    let proxy = RunningProxy::start(options).await;
    let silence = r#"{"matchers":[{"name":"alertname","value":"X","isRegex":false}]}"#;
    let cases = [
        (
            Method::GET,
            "/alertmanager/api/v2/status",
            "default",
            Some(true),
        ),
        (
            Method::GET,
            "/alertmanager/api/v2/receivers",
            "default",
            Some(true),
        ),
        (
            Method::GET,
            "/alertmanager/api/v2/alerts?active=true",
            "default",
            Some(true),
        ),
        (
            Method::GET,
            "/alertmanager/api/v2/alerts/groups",
            "silencer",
            Some(true),
        ),
        (
            Method::GET,
            "/alertmanager/api/v2/silences",
            "default",
            Some(true),
        ),
        (
            Method::GET,
            "/alertmanager/api/v2/silence/abc",
            "default",
            Some(true),
        ),
        (
            Method::POST,
            "/alertmanager/api/v2/silences",
            "silencer",
            Some(true),
        ),
        (
            Method::DELETE,
            "/alertmanager/api/v2/silence/abc",
            "silencer",
            Some(true),
        ),
        (
            Method::POST,
            "/alertmanager/api/v2/silences",
            "default",
            Some(false),
        ),
        (
            Method::DELETE,
            "/alertmanager/api/v2/silence/abc",
            "ruler",
            Some(false),
        ),
        (
            Method::GET,
            "/alertmanager/api/v2/alerts",
            "narrow",
            Some(false),
        ),
        // The same API under the Alertmanager data source's root.
        (
            Method::GET,
            "/am/alertmanager/api/v2/alerts/groups",
            "default",
            Some(true),
        ),
        (
            Method::POST,
            "/am/alertmanager/api/v2/silences",
            "silencer",
            Some(true),
        ),
        (
            Method::DELETE,
            "/am/alertmanager/api/v2/silence/abc",
            "default",
            Some(false),
        ),
        // Not served: vanilla paths (label mode's), posting alerts, reload.
        (Method::GET, "/api/v2/alerts", "default", None),
        (
            Method::POST,
            "/am/alertmanager/api/v2/alerts",
            "silencer",
            None,
        ),
        (Method::GET, "/am/api/v1/rules", "default", None),
        (
            Method::POST,
            "/alertmanager/api/v2/alerts",
            "silencer",
            None,
        ),
        (Method::POST, "/alertmanager/-/reload", "silencer", None),
    ];
    for (method, path_and_query, user, allowed) in cases {
        let before = mimir.received().len();
        let body = if method == Method::POST { silence } else { "" };
        let reply = send(
            method.clone(),
            &proxy.url(path_and_query),
            Some(&basic(user, "pw")),
            &[],
            body,
        )
        .await;
        let seen = mimir.received();
        let what = format!("{user} {method} {path_and_query}: {}", reply.status);
        match allowed {
            Some(true) => {
                assert!(reply.status.is_success(), "{what}");
                let last = seen.last().unwrap();
                let (path, query) = path_and_query
                    .split_once('?')
                    .map_or((path_and_query, None), |(p, q)| (p, Some(q)));
                let upstream_path = path.strip_prefix("/am").unwrap_or(path);
                assert_eq!(last.path, upstream_path, "{what}");
                assert_eq!(last.query.as_deref(), query, "{what}");
                assert_eq!(last.org_ids(), ["team-a"], "{what}");
                assert_eq!(last.body, body.as_bytes(), "{what}");
            }
            Some(false) => {
                assert_eq!(reply.status, StatusCode::FORBIDDEN, "{what}");
                assert_eq!(seen.len(), before, "{what}");
            }
            None => {
                assert!(
                    matches!(
                        reply.status,
                        StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED
                    ),
                    "{what}"
                );
                assert_eq!(seen.len(), before, "{what}");
            }
        }
    }
}

/// Grafana's Alertmanager data source (implementation Mimir, URL
/// `<proxy>/am`) managing the tenant's Alertmanager configuration as
/// grafana/grafana 12.x's `pkg/services/ngalert/api/lotex_am.go` does:
/// `GET|POST|DELETE <url>/api/v1/alerts`, the configuration as YAML. Each
/// call reaches Mimir's root with the tenant header; tenants see only their
/// own; reading needs `alerts:write` like writing (receivers' credentials);
/// the metrics data source's `/api/v1/alerts` stays the alerts list.
#[tokio::test]
async fn mimirs_alertmanager_configuration_is_managed_per_tenant_under_the_data_source_root() {
    let mimir = LokiStandIn::start().await;
    let section = format!("  upstream: {}/prometheus\n  mode: header\n", mimir.url());
    let two_tenants = format!(
        "{}  - id: team-b\n    users:\n      - {{username: b-silencer, password_hash: \"{}\", scopes: [alerts:read, alerts:write]}}\n",
        tenants(),
        cheap_hash("pw")
    );
    let mut options = ProxyOptions::metrics(two_tenants, section);
    let alerts = format!("alerts:\n  upstream: {}\n", mimir.url());
    options.extra = Box::leak(alerts.into_boxed_str());
    let proxy = RunningProxy::start(options).await;
    let config_url = proxy.url("/am/api/v1/alerts");
    let call = |method: Method, user: &'static str, body: &'static str| {
        let url = config_url.clone();
        async move { send(method, &url, Some(&basic(user, "pw")), &[], body).await }
    };
    // What Grafana posts: yaml.Marshal of ExternalAlertmanagerConfig.
    let posted = "template_files: {}\nalertmanager_config: |\n  route:\n    receiver: team-a-hook\n  receivers:\n    - name: team-a-hook\n      webhook_configs:\n        - url: http://hooks.example/a\n          http_config:\n            basic_auth: {username: a, password: hook-secret}\n";

    assert_eq!(
        call(Method::GET, "silencer", "").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        call(Method::POST, "silencer", posted).await.status,
        StatusCode::CREATED
    );
    let stored = mimir.last();
    assert_eq!(
        (
            stored.method.clone(),
            stored.path.as_str(),
            stored.org_ids()
        ),
        (Method::POST, "/api/v1/alerts", vec!["team-a".to_owned()])
    );
    assert_eq!(stored.body, posted.as_bytes(), "the YAML byte for byte");

    let read = call(Method::GET, "silencer", "").await;
    assert_eq!(read.status, StatusCode::OK);
    assert!(read.text().contains("team-a-hook"), "{}", read.text());
    assert_eq!(
        call(Method::GET, "b-silencer", "").await.status,
        StatusCode::NOT_FOUND,
        "team-b's Alertmanager has no configuration"
    );

    // A reader may not see receivers' credentials; nothing reaches Mimir.
    let before = mimir.received().len();
    for user in ["default", "ruler", "narrow"] {
        for method in [Method::GET, Method::POST, Method::DELETE] {
            let reply = call(method.clone(), user, posted).await;
            assert_eq!(reply.status, StatusCode::FORBIDDEN, "{user} {method}");
            assert!(!reply.text().contains("hook-secret"));
        }
    }
    assert_eq!(mimir.received().len(), before);

    // The metrics data source's alerts list is still the Prometheus API.
    let list = send(
        Method::GET,
        &proxy.url("/api/v1/alerts"),
        Some(&basic("grafana", "pw")),
        &[],
        "",
    )
    .await;
    assert_eq!(list.status, StatusCode::OK);
    assert_eq!(mimir.last().path, "/prometheus/api/v1/alerts");

    assert_eq!(
        call(Method::DELETE, "silencer", "").await.status,
        StatusCode::OK
    );
    assert_eq!(mimir.last().path, "/api/v1/alerts");
    assert_eq!(
        call(Method::GET, "silencer", "").await.status,
        StatusCode::NOT_FOUND
    );
}

/// Grafana's calls for data sources with "Manage alerts via Alerting UI",
/// in the order its alerting UI makes them when a rule group is listed,
/// created, read back and deleted (grafana/grafana 12.x,
/// `pkg/services/ngalert/api/lotex_ruler.go`: the ruler prefix per data
/// source type and subtype, namespace and group path-escaped, Grafana's own
/// query string, `subtype=…`, kept), replayed through the proxy with a
/// Grafana's credential (reads, `rules:read`, `rules:write`): each reaches the
/// backend at the path Grafana meant, with the tenant header and the rule
/// group Grafana sent.
#[tokio::test]
async fn grafanas_rule_management_calls_are_replayed_for_loki_mimir_and_cortex() {
    let group = "name: disk\nrules:\n    - alert: DiskFull\n      expr: sum(x) > 1\n";
    // (data source, proxy config upstream prefix, ruler prefix, state path)
    let backends = [
        (
            "loki",
            "",
            "/api/prom/rules",
            "/prometheus/api/v1/rules",
            "",
        ),
        (
            "mimir",
            "/prometheus",
            "/config/v1/rules",
            "/api/v1/rules",
            "?subtype=mimir",
        ),
        (
            "cortex",
            "/api/prom",
            "/rules",
            "/api/v1/rules",
            "?subtype=cortex",
        ),
    ];
    for (kind, prefix, ruler, state, query) in backends {
        let backend = LokiStandIn::start().await;
        let options = if kind == "loki" {
            let mut options = ProxyOptions::new(backend.url());
            options.tenants = Some(tenants());
            options
        } else {
            let section = format!("  upstream: {}{prefix}\n  mode: header\n", backend.url());
            ProxyOptions::metrics(tenants(), section)
        };
        let proxy = RunningProxy::start(options).await;
        let calls = [
            (Method::GET, format!("{ruler}{query}"), ""),
            (Method::GET, state.to_owned(), ""),
            (Method::POST, format!("{ruler}/team%20ops{query}"), group),
            (Method::GET, format!("{ruler}/team%20ops/disk{query}"), ""),
            (
                Method::DELETE,
                format!("{ruler}/team%20ops/disk{query}"),
                "",
            ),
            (Method::DELETE, format!("{ruler}/team%20ops{query}"), ""),
        ];
        for (method, path_and_query, body) in calls {
            let reply = send(
                method.clone(),
                &proxy.url(&path_and_query),
                Some(&basic("grafana", "pw")),
                &[("content-type", "application/yaml")],
                body,
            )
            .await;
            let what = format!("{kind}: {method} {path_and_query}: {}", reply.status);
            assert!(reply.status.is_success(), "{what} {}", reply.text());
            let seen = backend.received();
            let last = seen.last().unwrap();
            let (path, query) = path_and_query
                .split_once('?')
                .map_or((path_and_query.as_str(), None), |(p, q)| (p, Some(q)));
            assert_eq!(last.method, method, "{what}");
            assert_eq!(last.path, format!("{prefix}{path}"), "{what}");
            assert_eq!(last.query.as_deref(), query, "{what}");
            assert_eq!(last.org_ids(), ["team-a"], "{what}");
            match kind {
                // Loki's rules, metrics unscoped: forwarded as sent.
                "loki" => assert_eq!(last.body, body.as_bytes(), "{what}"),
                // Mimir's and Cortex's: written again from what was
                // checked, the same group.
                _ => assert_eq!(yaml(&last.body), yaml(body.as_bytes()), "{what}"),
            }
        }
    }
}

/// A body as YAML reads it: the same group, whatever its spelling.
fn yaml(body: &[u8]) -> serde_yaml_ng::Value {
    serde_yaml_ng::from_slice(body).expect("the body is YAML")
}
