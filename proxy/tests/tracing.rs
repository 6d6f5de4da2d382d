//! OpenTelemetry spans, exported to a stand-in collector: what a span says,
//! how the trace continues to the upstream, what is never in a span.

mod support;

use http::{Method, StatusCode};
use support::loki::LokiStandIn;
use support::otlp::{Collector, ExportedSpan};
use support::{basic, send, ProxyOptions, RunningProxy};

const QUERY: &str = "/loki/api/v1/query_range?query=%7Bapp%3D%22x%22%7D&limit=10";
const SERVER: i32 = 2;
const CLIENT: i32 = 3;
const STATUS_ERROR: i32 = 2;

/// A proxy exporting to `collector`. Tests stop it before they end: a
/// tracer dropped without its flush blocks the thread it is dropped on until
/// its exporter gives up.
async fn traced(
    logs_upstream: String,
    collector: &Collector,
    sample_ratio: f64,
    export_interval: &str,
) -> RunningProxy {
    let mut options = ProxyOptions::new(logs_upstream);
    let tracing = format!(
        "tracing:\n  otlp_endpoint: {}\n  service_name: gateway-test\n  \
         sample_ratio: {sample_ratio}\n  export_interval: {export_interval}\n",
        collector.traces_url()
    );
    options.extra = Box::leak(tracing.into_boxed_str());
    RunningProxy::start(options).await
}

async fn query(proxy: &RunningProxy, auth: &str, trace_headers: &[(&str, &str)]) -> StatusCode {
    send(
        Method::GET,
        &proxy.url(QUERY),
        Some(auth),
        trace_headers,
        "",
    )
    .await
    .status
}

/// The span of the request that was answered with `status`.
fn answered<'s>(spans: &'s [ExportedSpan], status: &str) -> &'s ExportedSpan {
    let code = |s: &&ExportedSpan| s.attributes.get("http.response.status_code").cloned();
    spans
        .iter()
        .find(|s| code(s).as_deref() == Some(status))
        .unwrap_or_else(|| panic!("no span answered {status} in {spans:#?}"))
}

fn one(spans: &[ExportedSpan], kind: i32, trace_id: &str) -> ExportedSpan {
    let found: Vec<_> = spans
        .iter()
        .filter(|s| s.kind == kind && s.trace_id == trace_id)
        .collect();
    assert_eq!(found.len(), 1, "one span of kind {kind} in {spans:#?}");
    found[0].clone()
}

#[tokio::test]
async fn a_request_is_a_server_span_and_its_upstream_call_a_client_span_the_upstream_continues() {
    let (loki, collector) = (LokiStandIn::start().await, Collector::start().await);
    let mut proxy = traced(loki.url(), &collector, 1.0, "50ms").await;
    let (trace_id, caller_span) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let traceparent = format!("00-{trace_id}-{caller_span}-01");
    let headers = [
        ("traceparent", traceparent.as_str()),
        ("tracestate", "vendor=x"),
    ];
    let status = query(&proxy, &basic("alice", "alice-pw"), &headers).await;
    assert_eq!(status, StatusCode::OK);

    let spans = collector.wait_for_spans(2).await;
    let server = one(&spans, SERVER, trace_id);
    assert_eq!(
        server.parent_span_id, caller_span,
        "continues the caller's trace"
    );
    assert_eq!(server.name, "GET logs_query");
    assert_eq!(server.service_name, "gateway-test");
    for (key, value) in [
        ("tenant_proxy.tenant", "team-a"),
        ("tenant_proxy.surface", "logs_query"),
        ("url.path", "/loki/api/v1/query_range"),
        ("http.request.method", "GET"),
        ("http.response.status_code", "200"),
    ] {
        assert_eq!(
            server.attributes.get(key).map(String::as_str),
            Some(value),
            "{key}"
        );
    }
    let client = one(&spans, CLIENT, trace_id);
    assert_eq!(client.parent_span_id, server.span_id);
    assert_eq!(client.attributes["http.response.status_code"], "200");

    // Loki's own spans hang below the proxy's upstream call.
    let upstream = loki.last();
    let expected = format!("00-{trace_id}-{}-01", client.span_id);
    assert_eq!(upstream.headers["traceparent"], expected.as_str());
    assert_eq!(upstream.headers["tracestate"], "vendor=x");
    proxy.stop().await;
}

#[tokio::test]
async fn without_trace_context_the_proxy_starts_the_trace() {
    let (loki, collector) = (LokiStandIn::start().await, Collector::start().await);
    let mut proxy = traced(loki.url(), &collector, 1.0, "50ms").await;
    let stale_state = [("tracestate", "vendor=stale")];
    assert_eq!(
        query(&proxy, &basic("bob", "bob-pw"), &stale_state).await,
        StatusCode::OK
    );

    let spans = collector.wait_for_spans(2).await;
    let server = spans.iter().find(|s| s.kind == SERVER).unwrap();
    assert_eq!(server.parent_span_id, "", "a root span");
    assert_eq!(server.attributes["tenant_proxy.tenant"], "team-b");
    let client = one(&spans, CLIENT, &server.trace_id);
    let upstream = loki.last();
    let traceparent = upstream.headers["traceparent"].to_str().unwrap();
    assert_eq!(
        traceparent,
        format!("00-{}-{}-01", server.trace_id, client.span_id)
    );
    assert!(
        upstream.headers.get("tracestate").is_none(),
        "a tracestate without its traceparent is not passed on"
    );
    proxy.stop().await;
}

#[tokio::test]
async fn refusals_and_upstream_failures_are_spans_too_and_no_secret_is_in_any() {
    let collector = Collector::start().await;
    let unreachable = support::closed_port().await;
    // Nothing is exported on a timer: what arrives was flushed at shutdown.
    let mut proxy = traced(format!("http://{unreachable}"), &collector, 1.0, "1h").await;
    let wrong = basic("alice", "not-alices-password");
    assert_eq!(query(&proxy, &wrong, &[]).await, StatusCode::UNAUTHORIZED);
    let right = basic("alice", "alice-pw");
    assert_eq!(query(&proxy, &right, &[]).await, StatusCode::BAD_GATEWAY);
    let brew = Method::from_bytes(b"BREW").unwrap();
    let odd = send(brew, &proxy.url(QUERY), Some(&right), &[], "").await;
    assert_eq!(odd.status, StatusCode::METHOD_NOT_ALLOWED);
    proxy.stop().await;

    let spans = collector.wait_for_spans(4).await;
    let odd = answered(&spans, "405");
    assert_eq!(
        (
            odd.name.as_str(),
            odd.attributes["http.request.method"].as_str()
        ),
        ("_OTHER", "_OTHER"),
        "clients cannot mint span names"
    );
    let refused = answered(&spans, "401");
    assert_eq!(refused.attributes["error.type"], "unauthenticated");
    assert!(!refused.attributes.contains_key("tenant_proxy.tenant"));
    assert_ne!(
        refused.status_code, STATUS_ERROR,
        "a 4xx is the client's error"
    );

    let failed = spans
        .iter()
        .find(|s| s.kind == SERVER && s.attributes.contains_key("tenant_proxy.tenant"))
        .expect("the 502 has a span");
    assert_eq!(failed.attributes["http.response.status_code"], "502");
    assert_eq!(failed.status_code, STATUS_ERROR);
    let call = one(&spans, CLIENT, &failed.trace_id);
    assert_eq!(call.status_code, STATUS_ERROR);
    assert_eq!(
        call.attributes["error.type"],
        failed.attributes["error.type"]
    );

    for body in collector.raw_bodies() {
        let text = String::from_utf8_lossy(&body);
        for secret in ["alice-pw", "not-alices-password", &right[6..], &wrong[6..]] {
            assert!(!text.contains(secret), "a credential in an exported span");
        }
        assert!(!text.to_ascii_lowercase().contains("authorization"));
    }
}

#[tokio::test]
async fn new_traces_are_sampled_at_the_ratio_and_callers_decisions_are_followed() {
    let (loki, collector) = (LokiStandIn::start().await, Collector::start().await);
    let mut proxy = traced(loki.url(), &collector, 0.0, "50ms").await;
    let auth = basic("alice", "alice-pw");
    let unsampled = "00-11111111111111111111111111111111-2222222222222222-00";
    let sampled = "00-33333333333333333333333333333333-4444444444444444-01";
    assert_eq!(query(&proxy, &auth, &[]).await, StatusCode::OK);
    assert_eq!(
        query(&proxy, &auth, &[("traceparent", unsampled)]).await,
        StatusCode::OK
    );
    assert_eq!(
        query(&proxy, &auth, &[("traceparent", sampled)]).await,
        StatusCode::OK
    );

    // Exports are in order of completion: once the sampled request's spans
    // are in, those of the two earlier requests would be too.
    let spans = collector.wait_for_spans(2).await;
    assert!(
        spans.iter().all(|s| s.trace_id == sampled[3..35]),
        "{spans:#?}"
    );
    // An unsampled trace still continues upstream, marked unsampled.
    let upstream = &loki.received()[1];
    let traceparent = upstream.headers["traceparent"].to_str().unwrap();
    assert!(traceparent.starts_with("00-11111111111111111111111111111111-"));
    assert!(traceparent.ends_with("-00"));
    proxy.stop().await;
}

#[tokio::test]
async fn spans_reach_an_https_collector_with_its_ca_a_client_certificate_and_a_server_name() {
    use support::certs::{server_config, Ca};
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, content: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, content).unwrap();
        path.display().to_string()
    };
    let (ca, clients) = (Ca::new(), Ca::new());
    // The certificate names the collector's Service, not the dialled address.
    let leaf = ca.issue_name_only("otel-collector.observability.svc");
    let collector = Collector::start_tls(server_config(&leaf, Some(&clients))).await;
    let client = clients.issue("tenant-proxy");
    let tracing = format!(
        "tracing:\n  otlp_endpoint: {}\n  export_interval: 50ms\n  tls:\n    ca_file: {}\n    \
         cert_file: {}\n    key_file: {}\n    server_name: otel-collector.observability.svc\n",
        collector.https_traces_url("127.0.0.1"),
        write("ca.crt", &ca.pem()),
        write("client.crt", &client.cert_pem),
        write("client.key", &client.key_pem),
    );
    let loki = LokiStandIn::start().await;
    let mut options = ProxyOptions::new(loki.url());
    options.extra = Box::leak(tracing.into_boxed_str());
    let mut proxy = RunningProxy::start(options).await;

    assert_eq!(
        query(&proxy, &basic("alice", "alice-pw"), &[]).await,
        StatusCode::OK
    );
    let spans = collector.wait_for_spans(2).await;
    assert!(spans.iter().any(|s| s.kind == SERVER
        && s.attributes.get("tenant_proxy.tenant").map(String::as_str) == Some("team-a")));
    proxy.stop().await;
}

#[tokio::test]
async fn the_request_span_lasts_until_the_response_body_is_sent() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // An upstream that answers its head at once and its body 300 ms later.
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = upstream.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = upstream.accept().await {
            tokio::spawn(async move {
                let mut request = vec![0; 64 * 1024];
                let _ = stream.read(&mut request).await;
                let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n";
                let _ = stream.write_all(head.as_bytes()).await;
                tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                let _ = stream.write_all(b"{}").await;
            });
        }
    });
    let collector = Collector::start().await;
    let mut proxy = traced(format!("http://{addr}"), &collector, 1.0, "50ms").await;
    assert_eq!(
        query(&proxy, &basic("alice", "alice-pw"), &[]).await,
        StatusCode::OK
    );

    let spans = collector.wait_for_spans(2).await;
    let server = spans.iter().find(|s| s.kind == SERVER).unwrap();
    let call = one(&spans, CLIENT, &server.trace_id);
    // The upstream span ends with the head; the request's with the body.
    let after_head = server.end_unix_nano - call.end_unix_nano;
    assert!(after_head >= 250_000_000, "{after_head} ns after the head");
    proxy.stop().await;
}

/// The value of `tenant_proxy_trace_exports_total{outcome=...}`, 0 if absent.
async fn exports(proxy: &RunningProxy, outcome: &str) -> f64 {
    let prefix = format!("tenant_proxy_trace_exports_total{{outcome=\"{outcome}\"}} ");
    let metrics = proxy.metrics().await;
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&prefix)?.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn exports_are_counted_so_a_collector_that_is_down_shows_in_metrics() {
    let loki = LokiStandIn::start().await;
    let down = support::closed_port().await;
    let collector = Collector::start().await;
    let auth = basic("alice", "alice-pw");
    for (url, outcome) in [
        (format!("http://{down}/v1/traces"), "failed"),
        (collector.traces_url(), "sent"),
    ] {
        let mut options = ProxyOptions::new(loki.url());
        let tracing = format!(
            "tracing:\n  otlp_endpoint: {url}\n  export_interval: 50ms\n  export_timeout: 1s\n"
        );
        options.extra = Box::leak(tracing.into_boxed_str());
        let mut proxy = RunningProxy::start(options).await;
        assert_eq!(query(&proxy, &auth, &[]).await, StatusCode::OK);
        let what = format!("an export {outcome}");
        support::eventually(&what, std::time::Duration::from_secs(10), async || {
            exports(&proxy, outcome).await >= 1.0
        })
        .await;
        let other = if outcome == "sent" { "failed" } else { "sent" };
        assert_eq!(exports(&proxy, other).await, 0.0, "{what}");
        proxy.stop().await;
    }
}
