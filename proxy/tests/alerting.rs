//! Tenant-managed rules and deletes on Loki (header mode): each route needs
//! its own scope, write powers only when granted, never for a credential
//! narrowed by a selector; what reaches Loki carries the tenant header.

mod support;

use http::{Method, StatusCode};
use support::loki::LokiStandIn;
use support::{basic, cheap_hash, send, ProxyOptions, RunningProxy};

/// team-a with one credential per scope set the matrix needs.
fn tenants() -> String {
    let user = |name: &str, extra: &str| {
        format!(
            "      - {{username: {name}, password_hash: \"{}\"{extra}}}\n",
            cheap_hash("pw")
        )
    };
    format!(
        "version: 1\ntenants:\n  - id: team-a\n    users:\n{}{}{}{}{}",
        user("default", ""),
        user("ruler", ", scopes: [rules:read, rules:write]"),
        user("silencer", ", scopes: [alerts:read, alerts:write]"),
        user("deleter", ", scopes: [logs:delete]"),
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
    for path in ["/ruler/ring", "/loki/api/v1/rules/a/b/c", "/api/prom/rules"] {
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
