//! Credentials restricted by a selector within their tenant: Loki gets the
//! restriction as `X-Prom-Label-Policy`, a Prometheus in label mode as extra
//! matchers on every selector, and a header-mode backend (which could not
//! enforce it) never sees the request.

mod support;

use std::collections::BTreeSet;

use http::{Method, StatusCode};
use serde_json::Value;
use support::loki::LokiStandIn;
use support::prometheus::PrometheusProcess;
use support::{basic, cheap_hash, send, ProxyOptions, RunningProxy};

const FORM: (&str, &str) = ("content-type", "application/x-www-form-urlencoded");

/// team-a (namespaces team-a, team-a-2) with an unrestricted user and one
/// restricted to `selector`; team-b with one user.
fn tenants(selector: &str) -> String {
    format!(
        r#"version: 1
tenants:
  - id: team-a
    namespaces: [team-a, team-a-2]
    users:
      - {{username: alice, password_hash: "{alice}"}}
      - username: narrow
        password_hash: "{narrow}"
        scopes: [logs:read, metrics:read]
        selector: '{selector}'
  - id: team-b
    users:
      - {{username: bob, password_hash: "{bob}"}}
"#,
        alice = cheap_hash("alice-pw"),
        narrow = cheap_hash("narrow-pw"),
        bob = cheap_hash("bob-pw"),
    )
}

#[tokio::test]
async fn loki_gets_the_label_policy_of_a_restricted_credential_and_no_client_copy() {
    support::captured_logs();
    let loki = LokiStandIn::start().await;
    let mut options = ProxyOptions::new(format!("{}\n  lbac: true", loki.url()));
    options.tenants = Some(tenants(r#"{app="payments"}"#));
    let proxy = RunningProxy::start(options).await;
    let query = "/loki/api/v1/query_range?query=%7Bapp%3D%22x%22%7D";
    let spoofed = [("x-prom-label-policy", "team-a:%7Bapp%3D~%22.%2A%22%7D")];
    for (user, password, expected) in [
        (
            "narrow",
            "narrow-pw",
            Some("team-a:%7Bapp%3D%22payments%22%7D"),
        ),
        ("alice", "alice-pw", None),
    ] {
        let reply = send(
            Method::GET,
            &proxy.url(query),
            Some(&basic(user, password)),
            &spoofed,
            "",
        )
        .await;
        assert_eq!(reply.status, StatusCode::OK, "{user}");
        let seen = loki.last();
        let policies: Vec<_> = seen
            .headers
            .get_all("x-prom-label-policy")
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect();
        assert_eq!(policies, expected.into_iter().collect::<Vec<_>>(), "{user}");
        assert_eq!(seen.org_ids(), ["team-a"]);
    }
}

#[tokio::test]
async fn without_lbac_in_loki_a_restricted_credential_reads_no_logs() {
    support::captured_logs();
    let loki = LokiStandIn::start().await;
    let mut options = ProxyOptions::new(loki.url());
    options.tenants = Some(tenants(r#"{app="payments"}"#));
    let proxy = RunningProxy::start(options).await;
    let query = proxy.url("/loki/api/v1/query_range?query=%7Bapp%3D%22x%22%7D");
    let refused = send(
        Method::GET,
        &query,
        Some(&basic("narrow", "narrow-pw")),
        &[],
        "",
    )
    .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert!(loki.received().is_empty());
    let alice = send(
        Method::GET,
        &query,
        Some(&basic("alice", "alice-pw")),
        &[],
        "",
    )
    .await;
    assert_eq!(alice.status, StatusCode::OK);
}

/// The `namespace` of every series in a successful answer.
fn namespaces(reply: &support::Reply) -> BTreeSet<String> {
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    support::prometheus::namespaces(&reply.json()["data"])
}

#[tokio::test]
async fn in_label_mode_a_selector_narrows_every_query_within_the_tenant() {
    support::captured_logs();
    let prometheus = PrometheusProcess::start(
        "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up > 0\n        labels: {namespace: team-a}\n",
    )
    .await;
    prometheus
        .write(&[
            (&[("__name__", "requests"), ("namespace", "team-a")], 1.0),
            (&[("__name__", "requests"), ("namespace", "team-a-2")], 2.0),
            (&[("__name__", "requests"), ("namespace", "team-b")], 3.0),
        ])
        .await;
    let section = format!("  upstream: {}\n  mode: label\n", prometheus.url());
    let proxy = RunningProxy::start(ProxyOptions::metrics(
        tenants(r#"{namespace="team-a-2"}"#),
        section,
    ))
    .await;
    let (narrow, alice) = (basic("narrow", "narrow-pw"), basic("alice", "alice-pw"));
    let query = |auth: &str, method: Method, q: &str| {
        let (url, auth, q) = (proxy.url("/api/v1/query"), auth.to_owned(), q.to_owned());
        async move {
            let body: String = form_urlencoded::Serializer::new(String::new())
                .append_pair("query", &q)
                .finish();
            match method {
                Method::GET => {
                    send(Method::GET, &format!("{url}?{body}"), Some(&auth), &[], "").await
                }
                _ => send(Method::POST, &url, Some(&auth), &[FORM], body).await,
            }
        }
    };
    for method in [Method::GET, Method::POST] {
        let all = query(&alice, method.clone(), "requests").await;
        assert_eq!(
            namespaces(&all),
            BTreeSet::from(["team-a".into(), "team-a-2".into()])
        );
        let narrowed = query(&narrow, method.clone(), "requests").await;
        assert_eq!(
            namespaces(&narrowed),
            BTreeSet::from(["team-a-2".to_string()])
        );
        // Asking for more than the selector allows yields nothing, not more.
        let outside = query(&narrow, method.clone(), r#"requests{namespace="team-a"}"#).await;
        assert!(namespaces(&outside).is_empty());
    }
    let series = send(
        Method::GET,
        &proxy.url("/api/v1/series?match%5B%5D=requests"),
        Some(&narrow),
        &[],
        "",
    )
    .await;
    assert_eq!(
        namespaces(&series),
        BTreeSet::from(["team-a-2".to_string()])
    );
    // The rule is labelled namespace=team-a: the tenant's, not the selector's.
    let rules = send(
        Method::GET,
        &proxy.url("/api/v1/rules"),
        Some(&narrow),
        &[],
        "",
    )
    .await;
    assert_eq!(rules.status, StatusCode::OK);
    let groups: Vec<Value> = rules.json()["data"]["groups"].as_array().unwrap().clone();
    assert!(groups.is_empty(), "{groups:?}");
    let rules = send(
        Method::GET,
        &proxy.url("/api/v1/rules"),
        Some(&alice),
        &[],
        "",
    )
    .await;
    assert_eq!(rules.json()["data"]["groups"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn a_header_mode_backend_never_sees_a_restricted_credential() {
    support::captured_logs();
    let mimir = LokiStandIn::start().await;
    let section = format!("  upstream: {}/prometheus\n  mode: header\n", mimir.url());
    let proxy = RunningProxy::start(ProxyOptions::metrics(
        tenants(r#"{app="payments"}"#),
        section,
    ))
    .await;
    let reply = send(
        Method::GET,
        &proxy.url("/api/v1/query?query=up"),
        Some(&basic("narrow", "narrow-pw")),
        &[],
        "",
    )
    .await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    assert!(reply.text().contains("selector"), "{}", reply.text());
    assert!(mimir.received().is_empty());
    let unrestricted = send(
        Method::GET,
        &proxy.url("/api/v1/query?query=up"),
        Some(&basic("alice", "alice-pw")),
        &[],
        "",
    )
    .await;
    assert_eq!(unrestricted.status, StatusCode::OK);
}
