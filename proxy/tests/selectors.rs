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
use support::{basic, cheap_hash, get, send, ProxyOptions, RunningProxy};

const FORM: (&str, &str) = ("content-type", "application/x-www-form-urlencoded");

/// team-a (namespaces team-a, team-a-2) with an unrestricted user and one
/// restricted to `selector` (reading logs, metrics, rules and alerts);
/// team-b with one user.
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
        scopes: [logs:read, metrics:read, rules:read, alerts:read]
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

/// Loki with `logs.lbac`, behind a proxy whose user `narrow` is restricted
/// to `selector`.
async fn behind_lbac(selector: &str) -> (LokiStandIn, RunningProxy) {
    support::captured_logs();
    let loki = LokiStandIn::start().await;
    let mut options = ProxyOptions::new(format!("{}\n  lbac: true", loki.url()));
    options.tenants = Some(tenants(selector));
    let proxy = RunningProxy::start(options).await;
    (loki, proxy)
}

/// A form-typed request as `narrow`, answered 200; the `query` Loki got,
/// which its label policy (from the URL) and its handlers (from the form)
/// read alike, with an empty body.
async fn query_loki_read(
    (proxy, loki): (&RunningProxy, &LokiStandIn),
    method: Method,
    path: &str,
    body: &str,
) -> Option<String> {
    let narrow = basic("narrow", "narrow-pw");
    let reply = send(
        method.clone(),
        &proxy.url(path),
        Some(&narrow),
        &[FORM],
        body.to_owned(),
    )
    .await;
    let status = reply.status;
    assert_eq!(status, StatusCode::OK, "{method} {path}: {}", reply.text());
    let seen = loki.last();
    assert_eq!(seen.method, method);
    assert!(seen.body.is_empty(), "{method} {path}");
    let query = seen.read_by_label_policy("query");
    assert_eq!(seen.read_by_handler("query"), query, "{method} {path}");
    query
}

#[tokio::test]
async fn loki_gets_the_label_policy_of_a_restricted_credential_and_no_client_copy() {
    let (loki, proxy) = behind_lbac(r#"{app="payments"}"#).await;
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

/// Loki's label-based access control rewrites a volume (or aggregated-
/// metric) query it reads from the URL, where Loki's handlers read a POST
/// body first: under a label policy the parameters reach Loki in the URL
/// alone, so both read the same query, and what could be read two ways is
/// refused. Without a policy the request goes as sent.
#[tokio::test]
async fn under_a_label_policy_loki_gets_the_parameters_in_the_url_alone() {
    let (loki, proxy) = behind_lbac(r#"{app="payments"}"#).await;
    let narrow = basic("narrow", "narrow-pw");
    let volume = "/loki/api/v1/index/volume";
    let asked = r#"{app="ledger"}"#;
    for (method, path, body) in [
        (
            Method::POST,
            volume.to_owned(),
            "query=%7Bapp%3D%22ledger%22%7D&limit=5",
        ),
        (
            Method::POST,
            format!("{volume}?limit=5"),
            "query=%7Bapp%3D%22ledger%22%7D",
        ),
        (
            Method::GET,
            format!("{volume}?query=%7Bapp%3D%22ledger%22%7D&limit=5"),
            "",
        ),
    ] {
        let query = query_loki_read((&proxy, &loki), method, &path, body).await;
        assert_eq!(query.as_deref(), Some(asked));
        let seen = loki.last();
        assert_eq!(seen.read_by_handler("limit").as_deref(), Some("5"));
        assert!(seen.headers.contains_key("x-prom-label-policy"));
    }
    // What could be read two ways is refused, never forwarded.
    let before = loki.received().len();
    for (path, body) in [
        (
            format!("{volume}?query=%7Bapp%3D%22payments%22%7D"),
            "query=%7Bapp%3D%22ledger%22%7D",
        ),
        (
            format!("{volume}?query=%7Ba%3D%22b%22%7D&query=%7Bapp%3D%22ledger%22%7D"),
            "",
        ),
    ] {
        let reply = send(
            Method::POST,
            &proxy.url(&path),
            Some(&narrow),
            &[FORM],
            body,
        )
        .await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{path} {body}");
    }
    let multipart = [("content-type", "multipart/form-data; boundary=x")];
    let reply = send(
        Method::POST,
        &proxy.url(volume),
        Some(&narrow),
        &multipart,
        "--x--\r\n",
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(loki.received().len(), before);

    // An unrestricted credential's request goes as sent.
    let body = "query=%7Bapp%3D%22ledger%22%7D";
    let reply = send(
        Method::POST,
        &proxy.url(volume),
        Some(&basic("alice", "alice-pw")),
        &[FORM],
        body,
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    let seen = loki.last();
    assert_eq!(seen.body, body.as_bytes());
    assert_eq!(seen.query, None);
}

/// Loki's label policy leaves label names read from the store unfiltered,
/// so a restricted credential's request for label names carries its
/// selector as `query`, joined to the client's own, in the URL (where
/// Loki's handlers and its policy read the same value). Label values, which
/// the policy filters, go as asked; a `query` that is not a stream selector
/// is refused. An unrestricted credential's request goes as sent.
#[tokio::test]
async fn a_restricted_credentials_label_names_are_asked_for_its_streams_only() {
    let (loki, proxy) = behind_lbac(r#"{app="payments"}"#).await;
    let narrow = basic("narrow", "narrow-pw");
    let labels = "/loki/api/v1/labels";
    let env_prod = "query=%7Benv%3D%22prod%22%7D";
    let joined = r#"{env="prod", app="payments"}"#;
    for (method, path, body, expected) in [
        (
            Method::GET,
            format!("{labels}?start=1"),
            "",
            Some(r#"{app="payments"}"#),
        ),
        (
            Method::GET,
            format!("{labels}?{env_prod}"),
            "",
            Some(joined),
        ),
        (Method::POST, labels.to_owned(), env_prod, Some(joined)),
        (
            Method::GET,
            format!("{labels}?query="),
            "",
            Some(r#"{app="payments"}"#),
        ),
        (
            Method::GET,
            format!("/loki/api/v1/label/app/values?{env_prod}"),
            "",
            Some(r#"{env="prod"}"#),
        ),
        (
            Method::GET,
            "/loki/api/v1/label/app/values".to_owned(),
            "",
            None,
        ),
    ] {
        let query = query_loki_read((&proxy, &loki), method.clone(), &path, body).await;
        assert_eq!(query.as_deref(), expected, "{method} {path}");
    }
    let before = loki.received().len();
    let not_a_selector = "query=%7Benv%3D%22prod%22%7D%20%7C%3D%20%22x%22";
    let reply = get(&proxy.url(&format!("{labels}?{not_a_selector}")), &narrow).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text());
    assert!(reply.text().contains("label names"), "{}", reply.text());
    assert_eq!(loki.received().len(), before, "nothing forwarded");

    let reply = get(&proxy.url(labels), &basic("alice", "alice-pw")).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(loki.last().query, None, "an unrestricted request as sent");
}

/// Where Loki applies no label policy (live tail, patterns, stats,
/// detected labels and fields), a restricted credential is refused, and an
/// unrestricted one of the same tenant is served.
#[tokio::test]
async fn a_restricted_credential_is_refused_where_loki_applies_no_label_policy() {
    let (loki, proxy) = behind_lbac(r#"{app="payments"}"#).await;
    let selector = "?query=%7Bapp%3D%22payments%22%7D";
    for path in [
        "/loki/api/v1/tail",
        "/loki/api/v1/patterns",
        "/loki/api/v1/index/stats",
        "/loki/api/v1/detected_labels",
        "/loki/api/v1/detected_fields",
        "/loki/api/v1/detected_field/level/values",
    ] {
        let url = proxy.url(&format!("{path}{selector}"));
        let get_as = |user: &'static str| {
            let credential = basic(user, &format!("{user}-pw"));
            let url = url.clone();
            async move { get(&url, &credential).await }
        };
        let before = loki.received().len();
        let reply = get_as("narrow").await;
        assert_eq!(reply.status, StatusCode::FORBIDDEN, "{path}");
        assert!(
            reply.text().contains("selector"),
            "{path}: {}",
            reply.text()
        );
        assert_eq!(loki.received().len(), before, "{path} reached Loki");
        if path.ends_with("/tail") {
            continue; // a WebSocket upgrade, served in tests/loki.rs
        }
        let reply = get_as("alice").await;
        assert_eq!(reply.status, StatusCode::OK, "{path}");
        assert_eq!(loki.received().len(), before + 1, "{path}");
    }
}

/// Rules and alerts are the tenant's whole, which no selector narrows: a
/// restricted credential is refused there though it holds the scope.
#[tokio::test]
async fn a_restricted_credential_never_reaches_what_a_selector_cannot_narrow() {
    let (loki, proxy) = behind_lbac(r#"{app="payments"}"#).await;
    for (path, sent) in [("/loki/api/v1/rules", 1), ("/prometheus/api/v1/alerts", 2)] {
        let url = proxy.url(path);
        let narrow = get(&url, &basic("narrow", "narrow-pw")).await;
        assert_eq!(narrow.status, StatusCode::FORBIDDEN, "{path}");
        assert!(
            narrow.text().contains("selector"),
            "{path}: {}",
            narrow.text()
        );
        assert_eq!(loki.received().len(), sent - 1, "{path} reached Loki");
        let alice = get(&url, &basic("alice", "alice-pw")).await;
        assert_eq!(alice.status, StatusCode::OK, "{path}");
        assert_eq!(loki.received().len(), sent, "{path}");
    }
}

/// In label mode the tenant label scopes an Alertmanager call to the
/// tenant, not to a selector's part of it: a restricted credential never
/// reaches it. (Loki's own rules and alerts are refused twice over: it
/// applies no label policy there either.)
#[tokio::test]
async fn a_restricted_credential_never_reaches_the_tenants_alertmanager() {
    support::captured_logs();
    let alertmanager = LokiStandIn::start().await; // only what reaches it matters
    let prometheus = support::closed_port().await; // not called
    let section = format!("  upstream: http://{prometheus}\n  mode: label\n");
    let mut options = ProxyOptions::metrics(tenants(r#"{app="payments"}"#), section);
    let alerts = format!("alerts:\n  upstream: {}\n", alertmanager.url());
    options.extra = Box::leak(alerts.into_boxed_str());
    let proxy = RunningProxy::start(options).await;
    let url = proxy.url("/api/v2/alerts");
    let narrow = get(&url, &basic("narrow", "narrow-pw")).await;
    assert_eq!(narrow.status, StatusCode::FORBIDDEN);
    assert!(narrow.text().contains("selector"), "{}", narrow.text());
    assert!(alertmanager.received().is_empty());
    get(&url, &basic("alice", "alice-pw")).await;
    assert_eq!(
        alertmanager.received().len(),
        1,
        "alice's call goes through"
    );
}

#[tokio::test]
async fn without_lbac_in_loki_a_restricted_credential_reads_no_logs() {
    support::captured_logs();
    let loki = LokiStandIn::start().await;
    let mut options = ProxyOptions::new(loki.url());
    options.tenants = Some(tenants(r#"{app="payments"}"#));
    let proxy = RunningProxy::start(options).await;
    let query = proxy.url("/loki/api/v1/query_range?query=%7Bapp%3D%22x%22%7D");
    let refused = get(&query, &basic("narrow", "narrow-pw")).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert!(loki.received().is_empty());
    let alice = get(&query, &basic("alice", "alice-pw")).await;
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
                Method::GET => get(&format!("{url}?{body}"), &auth).await,
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
    let series = get(&proxy.url("/api/v1/series?match%5B%5D=requests"), &narrow).await;
    assert_eq!(
        namespaces(&series),
        BTreeSet::from(["team-a-2".to_string()])
    );
    // The rule is labelled namespace=team-a: the tenant's, not the selector's.
    let rules = get(&proxy.url("/api/v1/rules"), &narrow).await;
    assert_eq!(rules.status, StatusCode::OK);
    let groups: Vec<Value> = rules.json()["data"]["groups"].as_array().unwrap().clone();
    assert!(groups.is_empty(), "{groups:?}");
    let rules = get(&proxy.url("/api/v1/rules"), &alice).await;
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
    let reply = get(
        &proxy.url("/api/v1/query?query=up"),
        &basic("narrow", "narrow-pw"),
    )
    .await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    assert!(reply.text().contains("selector"), "{}", reply.text());
    assert!(mimir.received().is_empty());
    let unrestricted = get(
        &proxy.url("/api/v1/query?query=up"),
        &basic("alice", "alice-pw"),
    )
    .await;
    assert_eq!(unrestricted.status, StatusCode::OK);
}
