//! End-to-end: the proxy in label mode in front of a real Prometheus holding
//! series of two tenants, and in header mode in front of a stand-in.

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use http::{Method, StatusCode};
use serde_json::Value;
use support::loki::LokiStandIn;
use support::prometheus::{namespaces, PrometheusProcess};
use support::{basic, send, ProxyOptions, Reply, RunningProxy, TenantSpec};

const FORM: (&str, &str) = ("content-type", "application/x-www-form-urlencoded");

/// Alerting rules for each tenant and a platform recording rule.
const RULES: &str = r#"
groups:
  - name: mixed
    rules:
      - alert: TeamAErrors
        expr: sum(http_requests_total{namespace=~"team-a|team-a-2"}) > 0
        labels: {namespace: team-a}
      - alert: TeamBErrors
        expr: http_requests_total{namespace="team-b"} > 0
        labels: {namespace: team-b}
      - record: platform:global_metric:sum
        expr: sum(global_metric)
"#;

struct Setup {
    prometheus: PrometheusProcess,
    proxy: RunningProxy,
}

fn alice() -> String {
    basic("alice", "alice-pw")
}

fn bob() -> String {
    basic("bob", "bob-pw")
}

/// team-a owns namespaces team-a and team-a-2; team-b owns team-b.
async fn setup() -> Setup {
    setup_with(RULES).await
}

/// [`setup`] with Prometheus loading `rules`.
async fn setup_with(rules: &str) -> Setup {
    support::captured_logs();
    let prometheus = PrometheusProcess::start(rules).await;
    prometheus
        .write(&[
            (
                &[
                    ("__name__", "http_requests_total"),
                    ("namespace", "team-a"),
                    ("job", "api"),
                    ("code", "200"),
                ],
                1.0,
            ),
            (
                &[
                    ("__name__", "http_requests_total"),
                    ("namespace", "team-a-2"),
                    ("job", "api"),
                    ("code", "200"),
                ],
                2.0,
            ),
            (
                &[
                    ("__name__", "http_requests_total"),
                    ("namespace", "team-b"),
                    ("job", "api"),
                    ("code", "500"),
                ],
                3.0,
            ),
            (
                &[
                    ("__name__", "b_only_metric"),
                    ("namespace", "team-b"),
                    ("b_only_label", "secret"),
                ],
                4.0,
            ),
            (&[("__name__", "global_metric"), ("job", "node")], 5.0),
        ])
        .await;
    let tenants = support::tenants_with_namespaces(&[
        (
            TenantSpec {
                id: "team-a",
                users: &[
                    ("alice", "alice-pw", None),
                    ("logs-only", "l-pw", Some("logs:read")),
                ],
            },
            &["team-a", "team-a-2"],
        ),
        (
            TenantSpec {
                id: "team-b",
                users: &[("bob", "bob-pw", None)],
            },
            &["team-b"],
        ),
    ]);
    let section = format!(
        "  upstream: {}\n  mode: label\n  label: namespace\n",
        prometheus.url()
    );
    let proxy = RunningProxy::start(ProxyOptions::metrics(tenants, section)).await;
    Setup { prometheus, proxy }
}

/// A GET straight to Prometheus, past the proxy.
async fn direct(prometheus: &PrometheusProcess, path: &str) -> Reply {
    let url = format!("{}{path}", prometheus.url());
    send(Method::GET, &url, None, &[], "").await
}

/// GET with the parameters in the URL, or POST with them in a form body.
async fn api(proxy: &RunningProxy, method: &Method, path: &str, params: &str, auth: &str) -> Reply {
    if *method == Method::GET {
        let url = proxy.url(&format!("{path}?{params}"));
        send(Method::GET, &url, Some(auth), &[], "").await
    } else {
        send(
            Method::POST,
            &proxy.url(path),
            Some(auth),
            &[FORM],
            params.to_owned(),
        )
        .await
    }
}

fn enc(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

fn success(reply: &Reply) -> Value {
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let json = reply.json();
    assert_eq!(json["status"], "success", "{json}");
    json["data"].clone()
}

fn strings(data: &Value) -> BTreeSet<String> {
    data.as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

#[tokio::test]
async fn each_tenant_sees_only_its_own_series_on_every_endpoint_get_and_post() {
    let Setup {
        proxy,
        prometheus: _p,
    } = setup().await;
    let a_ns = set(&["team-a", "team-a-2"]);
    for method in [Method::GET, Method::POST] {
        let q = |query: &str| format!("query={}", enc(query));
        for query in [
            "http_requests_total",
            r#"{__name__=~".+"}"#,
            r#"http_requests_total{namespace=~".+"}"#,
        ] {
            let data = success(&api(&proxy, &method, "/api/v1/query", &q(query), &alice()).await);
            assert_eq!(namespaces(&data), a_ns, "{method} {query}");
        }
        let data = success(
            &api(
                &proxy,
                &method,
                "/api/v1/query",
                &q("http_requests_total"),
                &bob(),
            )
            .await,
        );
        assert_eq!(namespaces(&data), set(&["team-b"]));
        for hidden in [
            "b_only_metric",
            "global_metric",
            r#"{namespace="team-b"}"#,
            "sum(b_only_metric)",
        ] {
            let data = success(&api(&proxy, &method, "/api/v1/query", &q(hidden), &alice()).await);
            assert_eq!(data["result"], serde_json::json!([]), "{method} {hidden}");
        }
        // Narrowing within the tenant works.
        let data = success(
            &api(
                &proxy,
                &method,
                "/api/v1/query",
                &q(r#"http_requests_total{namespace!="team-a"}"#),
                &alice(),
            )
            .await,
        );
        assert_eq!(namespaces(&data), set(&["team-a-2"]));

        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let range = format!(
            "{}&start={}&end={}&step=15",
            q(r#"{__name__=~".+"}"#),
            now - 300,
            now + 60
        );
        let data = success(&api(&proxy, &method, "/api/v1/query_range", &range, &alice()).await);
        assert_eq!(namespaces(&data), a_ns, "{method} query_range");
        let exemplars = format!(
            "{}&start={}&end={}",
            q("http_requests_total"),
            now - 300,
            now + 60
        );
        success(
            &api(
                &proxy,
                &method,
                "/api/v1/query_exemplars",
                &exemplars,
                &alice(),
            )
            .await,
        );

        let data = success(&api(&proxy, &method, "/api/v1/series", "", &alice()).await);
        assert_eq!(namespaces(&data), a_ns, "{method} series without match[]");
        let m = format!("match[]={}", enc("b_only_metric"));
        let data = success(&api(&proxy, &method, "/api/v1/series", &m, &alice()).await);
        assert_eq!(data, serde_json::json!([]));
        let data = success(&api(&proxy, &method, "/api/v1/labels", "", &alice()).await);
        assert!(
            !strings(&data).contains("b_only_label"),
            "{method} labels: {data}"
        );
        assert!(strings(&data).contains("code"));
    }
    let values =
        |name: &str, params: &str| proxy.url(&format!("/api/v1/label/{name}/values?{params}"));
    let data = success(
        &send(
            Method::GET,
            &values("__name__", ""),
            Some(&alice()),
            &[],
            "",
        )
        .await,
    );
    assert_eq!(strings(&data), set(&["http_requests_total"]));
    let data = success(
        &send(
            Method::GET,
            &values("namespace", ""),
            Some(&alice()),
            &[],
            "",
        )
        .await,
    );
    assert_eq!(strings(&data), a_ns);
    let data = success(
        &send(
            Method::GET,
            &values("b_only_label", ""),
            Some(&alice()),
            &[],
            "",
        )
        .await,
    );
    assert_eq!(data, serde_json::json!([]));
    let with_match = values("namespace", &format!("match[]={}", enc(r#"{job="api"}"#)));
    let data = success(&send(Method::GET, &with_match, Some(&bob()), &[], "").await);
    assert_eq!(strings(&data), set(&["team-b"]));

    for params in [
        format!("match[]={}", enc(r#"{__name__=~".+"}"#)),
        String::new(),
    ] {
        let federate = send(
            Method::GET,
            &proxy.url(&format!("/federate?{params}")),
            Some(&alice()),
            &[],
            "",
        )
        .await;
        assert_eq!(federate.status, StatusCode::OK);
        let text = federate.text();
        assert!(
            text.contains(r#"namespace="team-a""#) && text.contains(r#"namespace="team-a-2""#),
            "{text}"
        );
        assert!(
            !text.contains("team-b") && !text.contains("global_metric"),
            "{text}"
        );
    }
}

#[tokio::test]
async fn refused_endpoints_are_404_and_never_reach_prometheus() {
    let Setup { proxy, prometheus } = setup().await;
    for (method, path) in [
        (Method::GET, "/api/v1/targets"),
        (Method::GET, "/api/v1/status/config"),
        (Method::GET, "/api/v1/status/flags"),
        (Method::GET, "/api/v1/status/tsdb"),
        (Method::POST, "/api/v1/admin/tsdb/delete_series?match[]=up"),
        (Method::POST, "/-/reload"),
        (Method::POST, "/-/quit"),
        (Method::PUT, "/-/quit"),
        (Method::POST, "/api/v1/read"),
        (Method::GET, "/api/v1/alertmanagers"),
        (Method::GET, "/graph?g0.expr=up"),
        (Method::GET, "/prometheus/api/v1/query?query=up"),
    ] {
        let reply = send(method.clone(), &proxy.url(path), Some(&alice()), &[], "").await;
        assert_eq!(reply.status, StatusCode::NOT_FOUND, "{method} {path}");
        assert_eq!(reply.json()["status"], "error");
    }
    // Had /-/quit gone through, Prometheus would be gone.
    let ready = direct(&prometheus, "/-/ready").await;
    assert_eq!(ready.status, StatusCode::OK);
    let logs_scope_only = basic("logs-only", "l-pw");
    let reply = api(
        &proxy,
        &Method::GET,
        "/api/v1/query",
        "query=up",
        &logs_scope_only,
    )
    .await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn ambiguous_or_unenforceable_requests_get_400_in_prometheus_shape() {
    let Setup {
        proxy,
        prometheus: _p,
    } = setup().await;
    let url = proxy.url("/api/v1/query");
    let multipart = ("content-type", "multipart/form-data; boundary=xyz");
    let multipart_body = "--xyz\r\nContent-Disposition: form-data; name=\"query\"\r\n\r\nb_only_metric\r\n--xyz--\r\n";
    let cases: Vec<(&str, Reply)> = vec![
        (
            "query in URL and body",
            send(
                Method::POST,
                &format!("{url}?query=up"),
                Some(&alice()),
                &[FORM],
                "query=b_only_metric",
            )
            .await,
        ),
        (
            "repeated query",
            send(
                Method::GET,
                &format!("{url}?query=up&query=b_only_metric"),
                Some(&alice()),
                &[],
                "",
            )
            .await,
        ),
        (
            "multipart body",
            send(
                Method::POST,
                &url,
                Some(&alice()),
                &[multipart],
                multipart_body,
            )
            .await,
        ),
        (
            "body without form type",
            send(
                Method::POST,
                &url,
                Some(&alice()),
                &[],
                "query=b_only_metric",
            )
            .await,
        ),
        (
            "body on GET",
            send(
                Method::GET,
                &format!("{url}?query=up"),
                Some(&alice()),
                &[FORM],
                "query=b_only_metric",
            )
            .await,
        ),
        (
            "unparseable",
            api(
                &proxy,
                &Method::GET,
                "/api/v1/query",
                "query=up%7B",
                &alice(),
            )
            .await,
        ),
        (
            "or in selector",
            api(
                &proxy,
                &Method::POST,
                "/api/v1/query",
                &format!("query={}", enc(r#"up{a="1" or b="2"}"#)),
                &alice(),
            )
            .await,
        ),
        (
            "info()",
            api(
                &proxy,
                &Method::GET,
                "/api/v1/query",
                "query=info(up)",
                &alice(),
            )
            .await,
        ),
        (
            "missing query",
            api(&proxy, &Method::GET, "/api/v1/query", "time=1", &alice()).await,
        ),
        (
            "match[] not a selector",
            api(
                &proxy,
                &Method::GET,
                "/api/v1/series",
                &format!("match[]={}", enc("rate(up[5m])")),
                &alice(),
            )
            .await,
        ),
        (
            "too deep",
            api(
                &proxy,
                &Method::GET,
                "/api/v1/query",
                &format!(
                    "query={}",
                    enc(&format!("{}up{}", "(".repeat(300), ")".repeat(300)))
                ),
                &alice(),
            )
            .await,
        ),
    ];
    for (case, reply) in cases {
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{case}: {}",
            reply.text()
        );
        let json = reply.json();
        assert_eq!(json["status"], "error", "{case}");
        assert_eq!(json["errorType"], "bad_data", "{case}");
        assert!(
            json["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{case}"
        );
    }
}

#[tokio::test]
async fn metadata_is_answered_locally_with_empty_success() {
    let Setup {
        proxy,
        prometheus: _p,
    } = setup().await;
    let reply = send(
        Method::GET,
        &proxy.url("/api/v1/metadata"),
        Some(&alice()),
        &[],
        "",
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.json(),
        serde_json::json!({"status": "success", "data": {}})
    );
}

#[tokio::test]
async fn rules_and_alerts_are_filtered_to_the_tenant() {
    let Setup { proxy, prometheus } = setup().await;
    // Wait (bounded) until both tenants' alerts fire upstream.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let firing = direct(&prometheus, "/api/v1/alerts").await;
        if firing.json()["data"]["alerts"]
            .as_array()
            .map_or(0, Vec::len)
            >= 2
        {
            break;
        }
        if Instant::now() > deadline {
            let rules = direct(&prometheus, "/api/v1/rules").await;
            panic!("alerts did not fire within 30 s: {}", rules.text());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rules = success(
        &send(
            Method::GET,
            &proxy.url("/api/v1/rules"),
            Some(&alice()),
            &[("accept-encoding", "gzip")],
            "",
        )
        .await,
    );
    let names: Vec<&str> = rules["groups"][0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["TeamAErrors"]);
    // The group holds team-b's rule too: its evaluation time is shown as
    // that of team-a's rule alone.
    let group = &rules["groups"][0];
    assert!(group["evaluationTime"].is_f64(), "{group}");
    assert_eq!(group["evaluationTime"], group["rules"][0]["evaluationTime"]);
    let alerts = success(
        &send(
            Method::GET,
            &proxy.url("/api/v1/alerts"),
            Some(&alice()),
            &[],
            "",
        )
        .await,
    );
    let alerts = alerts["alerts"].as_array().unwrap();
    assert_eq!(alerts.len(), 1);
    assert_eq!(alerts[0]["labels"]["alertname"], "TeamAErrors");
    let rules = success(
        &send(
            Method::GET,
            &proxy.url("/api/v1/rules"),
            Some(&bob()),
            &[],
            "",
        )
        .await,
    );
    assert_eq!(rules["groups"][0]["rules"][0]["name"], "TeamBErrors");
}

#[tokio::test]
async fn a_grafana_like_session_succeeds_for_each_tenant() {
    let Setup {
        proxy,
        prometheus: _p,
    } = setup().await;
    for auth in [alice(), bob()] {
        let buildinfo = success(
            &send(
                Method::GET,
                &proxy.url("/api/v1/status/buildinfo"),
                Some(&auth),
                &[],
                "",
            )
            .await,
        );
        assert!(buildinfo["version"].as_str().unwrap().starts_with("2."));
        let test = success(
            &api(
                &proxy,
                &Method::POST,
                "/api/v1/query",
                "query=1%2B1&time=1700000000",
                &auth,
            )
            .await,
        );
        assert_eq!(test["result"][1], "2");
        success(
            &api(
                &proxy,
                &Method::POST,
                "/api/v1/labels",
                "start=0&end=9999999999",
                &auth,
            )
            .await,
        );
        let values = proxy.url(&format!(
            "/api/v1/label/__name__/values?match[]={}",
            enc("{job=\"api\"}")
        ));
        success(&send(Method::GET, &values, Some(&auth), &[], "").await);
        let series = format!("match[]={}&limit=40000", enc("http_requests_total"));
        success(&api(&proxy, &Method::POST, "/api/v1/series", &series, &auth).await);
        let range = format!(
            "query={}&start=1700000000&end=1700000600&step=60",
            enc("sum(rate(http_requests_total[5m]))")
        );
        success(&api(&proxy, &Method::POST, "/api/v1/query_range", &range, &auth).await);
        success(
            &send(
                Method::GET,
                &proxy.url("/api/v1/metadata"),
                Some(&auth),
                &[],
                "",
            )
            .await,
        );
    }
}

#[tokio::test]
async fn header_mode_sets_the_tenant_header_and_forwards_untouched_under_a_prefix() {
    support::captured_logs();
    let mimir = LokiStandIn::start().await;
    let section = format!("  upstream: {}/prometheus\n  mode: header\n", mimir.url());
    let proxy = RunningProxy::start(ProxyOptions::metrics(support::two_tenants(), section)).await;
    let reply = send(
        Method::POST,
        &proxy.url("/api/v1/query_range"),
        Some(&basic("alice", "alice-pw")),
        &[FORM, ("x-scope-orgid", "team-b")],
        "query=up%7Bnamespace%3D%22x%22%7D&step=60",
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    let seen = mimir.last();
    assert_eq!(seen.path, "/prometheus/api/v1/query_range");
    assert_eq!(seen.org_ids(), ["team-a"]);
    assert_eq!(
        seen.body.as_ref(),
        b"query=up%7Bnamespace%3D%22x%22%7D&step=60",
        "body untouched"
    );
    let reply = send(
        Method::GET,
        &proxy.url("/api/v1/metadata"),
        Some(&basic("bob", "bob-pw")),
        &[],
        "",
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(mimir.last().path, "/prometheus/api/v1/metadata");
    assert_eq!(mimir.last().org_ids(), ["team-b"]);
    let refused = send(
        Method::GET,
        &proxy.url("/api/v1/status/config"),
        Some(&basic("bob", "bob-pw")),
        &[],
        "",
    )
    .await;
    assert_eq!(refused.status, StatusCode::NOT_FOUND);
}

/// Thanos Query scopes queries, series and labels by `THANOS-TENANT`, not
/// rules, alerts or exemplars: those never reach it, and metadata is
/// answered empty by the proxy, as in label mode.
#[tokio::test]
async fn header_mode_with_thanos_forwards_only_what_thanos_scopes() {
    support::captured_logs();
    let thanos = LokiStandIn::start().await;
    let section = support::header_mode_section(&thanos.url(), "THANOS-TENANT");
    let proxy = RunningProxy::start(ProxyOptions::metrics(support::two_tenants(), section)).await;
    let alice = basic("alice", "alice-pw");
    let get = |path: &'static str| {
        let url = proxy.url(path);
        let alice = alice.clone();
        async move { send(Method::GET, &url, Some(&alice), &[], "").await }
    };

    // The stand-in answers as Loki would without X-Scope-OrgID (401);
    // what matters is what reached it.
    get("/api/v1/series?match%5B%5D=up").await;
    let seen = thanos.last();
    assert_eq!(seen.path, "/api/v1/series");
    let tenant: Vec<_> = seen.headers.get_all("thanos-tenant").iter().collect();
    assert_eq!(tenant, ["team-a"]);

    let metadata = get("/api/v1/metadata").await;
    assert_eq!(metadata.status, StatusCode::OK);
    assert_eq!(metadata.json()["data"], serde_json::json!({}));
    for path in [
        "/api/v1/rules",
        "/api/v1/alerts",
        "/api/v1/query_exemplars?query=up",
    ] {
        assert_eq!(get(path).await.status, StatusCode::NOT_FOUND, "{path}");
    }
    assert_eq!(
        thanos.received().len(),
        1,
        "only the series request reached Thanos"
    );
}

/// A rules listing of hundreds of KiB (a Prometheus with thousands of
/// rules) is filtered whole: each tenant gets all of its rules, in order,
/// and none of the other's.
#[tokio::test]
async fn a_large_rules_listing_is_filtered_whole() {
    let rules: String = (0..1_500)
        .map(|i| {
            let namespace = ["team-a", "team-b"][i % 2];
            format!("      - record: large_listing_{i}\n        expr: vector({i})\n        labels: {{namespace: {namespace}}}\n")
        })
        .collect();
    let Setup { proxy, prometheus } =
        setup_with(&format!("groups:\n  - name: large\n    rules:\n{rules}")).await;
    let unfiltered = direct(&prometheus, "/api/v1/rules").await;
    assert!(
        unfiltered.body.len() >= 256 * 1024,
        "{} bytes",
        unfiltered.body.len()
    );
    for (auth, namespace, first) in [(alice(), "team-a", 0), (bob(), "team-b", 1)] {
        let listing = success(&api(&proxy, &Method::GET, "/api/v1/rules", "", &auth).await);
        let rules = listing["groups"][0]["rules"].as_array().unwrap();
        let names: Vec<String> = rules
            .iter()
            .map(|r| r["name"].as_str().unwrap().to_owned())
            .collect();
        let expected: Vec<String> = (first..1_500)
            .step_by(2)
            .map(|i| format!("large_listing_{i}"))
            .collect();
        assert_eq!(names, expected);
        assert!(rules.iter().all(|r| r["labels"]["namespace"] == namespace));
    }
}
