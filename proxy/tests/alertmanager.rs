//! A real Alertmanager (Debian's 0.25) behind label mode: two tenants whose
//! alerts share it; through the proxy each sees, silences and expires only
//! its own, at Alertmanager's own paths and under `/alertmanager`.

mod support;

use http::{Method, StatusCode};
use serde_json::{json, Value};
use support::alertmanager::{AlertmanagerProcess, WEBHOOK_SECRET};
use support::{basic, send, tenants_with_namespaces, ProxyOptions, RunningProxy, TenantSpec};

async fn setup() -> (AlertmanagerProcess, RunningProxy) {
    let am = AlertmanagerProcess::start().await;
    am.fire("Down", &["team-a", "team-a-2", "team-b"]).await;
    let tenants = tenants_with_namespaces(&[
        (
            TenantSpec {
                id: "team-a",
                users: &[
                    ("alice", "pw", Some("alerts:read, alerts:write")),
                    ("viewer", "pw", None),
                ],
            },
            &["team-a", "team-a-2"],
        ),
        (
            TenantSpec {
                id: "team-b",
                users: &[("bob", "pw", Some("alerts:read, alerts:write"))],
            },
            &["team-b"],
        ),
    ]);
    // Prometheus is not called here: only the Alertmanager routes are.
    let section = "  upstream: http://127.0.0.1:9\n  mode: label\n".to_owned();
    let mut options = ProxyOptions::metrics(tenants, section);
    let alerts = format!("alerts:\n  upstream: {}\n", am.url);
    options.extra = Box::leak(alerts.into_boxed_str());
    (am, RunningProxy::start(options).await)
}

async fn call(
    proxy: &RunningProxy,
    user: &str,
    method: Method,
    path: &str,
    body: &str,
) -> support::Reply {
    let headers = [("content-type", "application/json")];
    send(
        method,
        &proxy.url(path),
        Some(&basic(user, "pw")),
        &headers,
        body.to_owned(),
    )
    .await
}

fn namespaces_of(alerts: &Value) -> Vec<String> {
    let mut out: Vec<String> = alerts
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["labels"]["namespace"].as_str().unwrap().to_owned())
        .collect();
    out.sort();
    out
}

fn silence(matchers: Value) -> String {
    json!({
        "matchers": matchers,
        "startsAt": "2026-01-01T00:00:00Z",
        "endsAt": "2099-01-01T00:00:00Z",
        "createdBy": "test",
        "comment": "maintenance",
    })
    .to_string()
}

#[tokio::test]
async fn each_tenant_sees_only_its_own_alerts_and_no_configuration() {
    let (am, proxy) = setup().await;
    for base in ["/api/v2", "/alertmanager/api/v2", "/am/api/v2"] {
        let a = call(&proxy, "viewer", Method::GET, &format!("{base}/alerts"), "").await;
        assert_eq!(a.status, StatusCode::OK, "{}", a.text());
        assert_eq!(namespaces_of(&a.json()), ["team-a", "team-a-2"]);
        let b = call(&proxy, "bob", Method::GET, &format!("{base}/alerts"), "").await;
        assert_eq!(namespaces_of(&b.json()), ["team-b"]);
        // The client's own filter narrows further; it never widens.
        let filtered = format!("{base}/alerts?filter=namespace%3D%22team-b%22");
        let none = call(&proxy, "alice", Method::GET, &filtered, "").await;
        assert_eq!(none.json(), json!([]));

        let groups = call(
            &proxy,
            "alice",
            Method::GET,
            &format!("{base}/alerts/groups"),
            "",
        )
        .await;
        assert_eq!(groups.status, StatusCode::OK);
        let mut seen: Vec<String> = Vec::new();
        for group in groups.json().as_array().unwrap() {
            seen.extend(namespaces_of(&group["alerts"]));
        }
        seen.sort();
        assert_eq!(seen, ["team-a", "team-a-2"]);

        let status = call(&proxy, "alice", Method::GET, &format!("{base}/status"), "").await;
        assert_eq!(status.status, StatusCode::OK);
        assert!(!status.text().contains(WEBHOOK_SECRET), "{}", status.text());
        let receivers = call(
            &proxy,
            "alice",
            Method::GET,
            &format!("{base}/receivers"),
            "",
        )
        .await;
        assert_eq!(receivers.json(), json!([{"name": "hook"}]));
    }
    // Straight from Alertmanager, the configuration does carry the secret.
    let direct = am.call(Method::GET, "/api/v2/status", "").await.unwrap();
    assert!(direct.text().contains(WEBHOOK_SECRET));
    // Not served: posting alerts, reloading, anything unlisted.
    for (method, path) in [
        (Method::POST, "/api/v2/alerts"),
        (Method::POST, "/-/reload"),
        (Method::PUT, "/api/v2/silences"),
        (Method::GET, "/alertmanager/-/healthy"),
    ] {
        let reply = call(&proxy, "alice", method.clone(), path, "[]").await;
        assert!(
            matches!(
                reply.status,
                StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED
            ),
            "{method} {path}: {}",
            reply.status
        );
    }
}

#[tokio::test]
async fn silences_are_created_listed_and_expired_only_by_their_tenant() {
    let (am, proxy) = setup().await;
    let post = |user: &'static str, body: String| {
        let proxy = &proxy;
        async move { call(proxy, user, Method::POST, "/api/v2/silences", &body).await }
    };

    // No matcher on the label: the tenant's pin is added.
    let created = post(
        "alice",
        silence(json!([{"name": "alertname", "value": "Down", "isRegex": false}])),
    )
    .await;
    assert_eq!(created.status, StatusCode::OK, "{}", created.text());
    let a_id = created.json()["silenceID"].as_str().unwrap().to_owned();
    let stored = am
        .call(Method::GET, &format!("/api/v2/silence/{a_id}"), "")
        .await
        .unwrap();
    let matchers = stored.json()["matchers"].clone();
    assert!(
        matchers
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["name"] == "namespace"
                && m["value"] == "team-a|team-a-2"
                && m["isRegex"] == true),
        "{matchers}"
    );
    // Alertmanager silences team-a's alerts with it, and not team-b's.
    let silenced = am
        .call(Method::GET, "/api/v2/alerts?silenced=true&active=false", "")
        .await
        .unwrap();
    assert_eq!(namespaces_of(&silenced.json()), ["team-a", "team-a-2"]);

    // A silence matching another tenant's value is refused and never stored.
    let before = am
        .call(Method::GET, "/api/v2/silences", "")
        .await
        .unwrap()
        .json();
    let foreign = post(
        "alice",
        silence(json!([{"name": "namespace", "value": "team-b", "isRegex": false}])),
    )
    .await;
    assert_eq!(foreign.status, StatusCode::FORBIDDEN, "{}", foreign.text());
    let wide = post(
        "alice",
        silence(json!([{"name": "namespace", "value": "team-.*", "isRegex": true}])),
    )
    .await;
    assert_eq!(wide.status, StatusCode::FORBIDDEN);
    let after = am
        .call(Method::GET, "/api/v2/silences", "")
        .await
        .unwrap()
        .json();
    assert_eq!(before, after);

    // team-b's own silence; listings show each tenant its own only.
    let b = post(
        "bob",
        silence(json!([{"name": "namespace", "value": "team-b", "isRegex": false}])),
    )
    .await;
    assert_eq!(b.status, StatusCode::OK, "{}", b.text());
    let b_id = b.json()["silenceID"].as_str().unwrap().to_owned();
    for (user, id) in [("alice", &a_id), ("bob", &b_id)] {
        let listed = call(
            &proxy,
            user,
            Method::GET,
            "/alertmanager/api/v2/silences",
            "",
        )
        .await;
        let listed = listed.json();
        let ids: Vec<&str> = listed
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, [id.as_str()], "{user}");
    }
    let peek = call(
        &proxy,
        "alice",
        Method::GET,
        &format!("/api/v2/silence/{b_id}"),
        "",
    )
    .await;
    assert_eq!(peek.status, StatusCode::FORBIDDEN);

    // team-a can neither expire nor take over team-b's silence.
    let expire = call(
        &proxy,
        "alice",
        Method::DELETE,
        &format!("/api/v2/silence/{b_id}"),
        "",
    )
    .await;
    assert_eq!(expire.status, StatusCode::FORBIDDEN);
    let mut takeover: Value = serde_json::from_str(&silence(json!([
        {"name": "namespace", "value": "team-a", "isRegex": false}
    ])))
    .unwrap();
    takeover["id"] = Value::from(b_id.clone());
    let takeover = post("alice", takeover.to_string()).await;
    assert_eq!(takeover.status, StatusCode::FORBIDDEN);
    let still = am
        .call(Method::GET, &format!("/api/v2/silence/{b_id}"), "")
        .await
        .unwrap()
        .json();
    assert_eq!(still["status"]["state"], "active");
    assert_eq!(still["matchers"][0]["value"], "team-b");

    // A reader cannot change silences; the owner can expire its own.
    let viewer = call(
        &proxy,
        "viewer",
        Method::DELETE,
        &format!("/api/v2/silence/{a_id}"),
        "",
    )
    .await;
    assert_eq!(viewer.status, StatusCode::FORBIDDEN);
    let own = call(
        &proxy,
        "alice",
        Method::DELETE,
        &format!("/alertmanager/api/v2/silence/{a_id}"),
        "",
    )
    .await;
    assert_eq!(own.status, StatusCode::OK, "{}", own.text());
    let expired = am
        .call(Method::GET, &format!("/api/v2/silence/{a_id}"), "")
        .await
        .unwrap()
        .json();
    assert_eq!(expired["status"]["state"], "expired");
}
