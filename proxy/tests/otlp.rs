//! OTLP/HTTP through the proxy: logs to Loki's OTLP endpoint and metrics in
//! header mode streamed untouched with the tenant header; metrics in label
//! mode relabelled so that every series a Prometheus 3 receiver would store
//! carries only the tenant's value (support/otlp_metrics.rs translates).

mod support;

use std::io::{Read, Write};

use http::{Method, StatusCode};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::metrics::v1::{
    metric::Data, number_data_point::Value as Number, Gauge, Histogram, HistogramDataPoint, Metric,
    NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use proptest::prelude::*;
use prost::Message;
use support::loki::LokiStandIn;
use support::otlp_metrics::{self, Sample};
use support::{basic, send, ProxyOptions, Reply, RunningProxy, TenantSpec};
use tenant_proxy::http::error::RpcStatus;

fn kv(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.into())),
        }),
        ..Default::default()
    }
}

fn gzip(raw: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(raw).unwrap();
    gz.finish().unwrap()
}

fn gunzip(body: &[u8]) -> Vec<u8> {
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(body)
        .read_to_end(&mut raw)
        .unwrap();
    raw
}

async fn post(
    proxy: &RunningProxy,
    path: &str,
    auth: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> Reply {
    send(Method::POST, &proxy.url(path), Some(auth), headers, body).await
}

fn logs_request() -> Vec<u8> {
    ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource: Some(Resource {
                attributes: vec![kv("service.name", "checkout")],
                ..Default::default()
            }),
            scope_logs: vec![ScopeLogs {
                log_records: vec![LogRecord {
                    body: Some(AnyValue {
                        value: Some(any_value::Value::StringValue("hello from team-a".into())),
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

#[tokio::test]
async fn otlp_logs_reach_loki_byte_for_byte_under_the_tenant_header_only() {
    let loki = LokiStandIn::start().await;
    let proxy = RunningProxy::start(ProxyOptions::new(loki.url())).await;
    let pusher = basic("pusher-a", "pusher-pw");
    let protobuf = logs_request();
    let json =
        br#"{"resourceLogs":[{"scopeLogs":[{"logRecords":[{"body":{"stringValue":"hi"}}]}]}]}"#
            .to_vec();
    let cases: [(&str, Option<&str>, Vec<u8>); 4] = [
        ("application/x-protobuf", None, protobuf.clone()),
        ("application/x-protobuf", Some("gzip"), gzip(&protobuf)),
        ("application/json", None, json.clone()),
        ("application/json", Some("gzip"), gzip(&json)),
    ];
    for (i, (content_type, encoding, body)) in cases.into_iter().enumerate() {
        let mut headers = vec![("content-type", content_type), ("x-scope-orgid", "team-b")];
        if let Some(e) = encoding {
            headers.push(("content-encoding", e));
        }
        let reply = post(&proxy, "/otlp/v1/logs", &pusher, &headers, body.clone()).await;
        assert_eq!(
            reply.status,
            StatusCode::NO_CONTENT,
            "{content_type} {encoding:?}: {}",
            reply.text()
        );
        let seen = loki.received();
        let seen = &seen[i];
        assert_eq!(seen.path, "/otlp/v1/logs");
        assert_eq!(
            seen.org_ids(),
            ["team-a"],
            "the spoofed header was replaced"
        );
        assert_eq!(seen.body, body, "streamed untouched");
        assert_eq!(seen.headers["content-type"], content_type);
        assert_eq!(
            seen.headers
                .get("content-encoding")
                .map(|v| v.to_str().unwrap()),
            encoding
        );
        assert!(!seen.headers.contains_key("authorization"));
    }
    // Loki refuses what it cannot decode; the sender is told to drop it.
    let bad = post(
        &proxy,
        "/otlp/v1/logs",
        &pusher,
        &[("content-type", "application/x-protobuf")],
        b"\xff\xff".to_vec(),
    )
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    // A reader cannot push, and is told so in OTLP's shape.
    let reader = basic("reader-a", "reader-pw");
    let refused = post(
        &proxy,
        "/otlp/v1/logs",
        &reader,
        &[("content-type", "application/x-protobuf")],
        protobuf,
    )
    .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    let status = RpcStatus::decode(refused.body.as_ref()).unwrap();
    assert_eq!(status.code, 7, "PERMISSION_DENIED");
    assert!(status.message.contains("logs:write"), "{}", status.message);
}

fn header_mode_tenants() -> String {
    support::tenants_yaml(&[TenantSpec {
        id: "team-a",
        users: &[("alice", "alice-pw", None)],
    }])
}

#[tokio::test]
async fn otlp_metrics_in_header_mode_go_to_the_push_upstream_untouched() {
    let queries = LokiStandIn::start().await;
    let pushes = LokiStandIn::start().await;
    let section = format!(
        "  upstream: {}/prometheus\n  push_upstream: {}\n  mode: header\n",
        queries.url(),
        pushes.url()
    );
    let proxy = RunningProxy::start(ProxyOptions::metrics(header_mode_tenants(), section)).await;
    let body = gzip(&metrics_request(&[kv("k8s.namespace.name", "team-b")]).encode_to_vec());
    let headers = [
        ("content-type", "application/x-protobuf"),
        ("content-encoding", "gzip"),
        ("x-scope-orgid", "team-b"),
    ];
    let alice = basic("alice", "alice-pw");
    let reply = post(&proxy, "/otlp/v1/metrics", &alice, &headers, body.clone()).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.text());
    let seen = pushes.last();
    assert_eq!(seen.path, "/otlp/v1/metrics");
    assert_eq!(seen.org_ids(), ["team-a"]);
    assert_eq!(
        seen.body, body,
        "header mode never rewrites: Mimir scopes by the header"
    );
    assert!(queries.received().is_empty());
    // Prometheus' path is label mode's only.
    let other = post(&proxy, "/api/v1/otlp/v1/metrics", &alice, &headers, body).await;
    assert_eq!(other.status, StatusCode::NOT_FOUND);
}

/// One resource claiming team-b, data points of three types claiming it
/// under names that translate to the label, and a scope attribute too.
/// When every data point of [`metrics_request`] was taken, in
/// nanoseconds, and as the receiver stores it, in milliseconds.
const POINT_TIME_NS: u64 = 1_700_000_000_123_456_789;
const POINT_TIME_MS: i64 = 1_700_000_000_123;

fn metrics_request(point_attributes: &[KeyValue]) -> ExportMetricsServiceRequest {
    let number = |value| NumberDataPoint {
        attributes: point_attributes.to_vec(),
        time_unix_nano: POINT_TIME_NS,
        value: Some(value),
        ..Default::default()
    };
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(Resource {
                attributes: vec![
                    kv("service.name", "checkout"),
                    kv("service.instance.id", "pod-1"),
                    kv("k8s.namespace.name", "team-b"),
                ],
                ..Default::default()
            }),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(
                    opentelemetry_proto::tonic::common::v1::InstrumentationScope {
                        name: "lib".into(),
                        attributes: vec![kv("k8s.namespace.name", "team-b")],
                        ..Default::default()
                    },
                ),
                metrics: vec![
                    Metric {
                        name: "queue.depth".into(),
                        data: Some(Data::Gauge(Gauge {
                            data_points: vec![number(Number::AsDouble(7.5))],
                        })),
                        ..Default::default()
                    },
                    Metric {
                        name: "requests".into(),
                        data: Some(Data::Sum(Sum {
                            data_points: vec![number(Number::AsInt(42))],
                            is_monotonic: true,
                            aggregation_temporality: 2,
                        })),
                        ..Default::default()
                    },
                    Metric {
                        name: "latency".into(),
                        data: Some(Data::Histogram(Histogram {
                            data_points: vec![HistogramDataPoint {
                                attributes: point_attributes.to_vec(),
                                time_unix_nano: POINT_TIME_NS,
                                count: 3,
                                sum: Some(1.25),
                                bucket_counts: vec![2, 1],
                                explicit_bounds: vec![0.5],
                                ..Default::default()
                            }],
                            aggregation_temporality: 2,
                        })),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

/// Posts `request` as protobuf to label mode's OTLP path, gzip or not.
async fn post_to_label_mode(
    proxy: &RunningProxy,
    auth: &str,
    request: &ExportMetricsServiceRequest,
    gz: bool,
) -> Reply {
    let raw = request.encode_to_vec();
    let mut headers = vec![("content-type", "application/x-protobuf")];
    let body = if gz {
        headers.push(("content-encoding", "gzip"));
        gzip(&raw)
    } else {
        raw
    };
    post(proxy, "/api/v1/otlp/v1/metrics", auth, &headers, body).await
}

fn label_mode_tenants() -> String {
    support::tenants_with_namespaces(&[(
        TenantSpec {
            id: "team-a",
            users: &[
                ("alice", "alice-pw", None),
                ("reader", "reader-pw", Some("metrics:read")),
            ],
        },
        &["team-a", "team-a-staging"],
    )])
}

async fn label_mode(extra: &str) -> (LokiStandIn, RunningProxy) {
    let prometheus = LokiStandIn::start().await;
    let section = format!(
        "  upstream: {}\n  mode: label\n  label: k8s_namespace_name\n{extra}",
        prometheus.url()
    );
    let proxy = RunningProxy::start(ProxyOptions::metrics(label_mode_tenants(), section)).await;
    (prometheus, proxy)
}

#[tokio::test]
async fn otlp_metrics_in_label_mode_store_only_series_of_the_tenant() {
    let (prometheus, proxy) = label_mode("").await;
    let alice = basic("alice", "alice-pw");
    let claims = [
        kv("k8s.namespace.name", "team-b"),
        kv("k8s-namespace-name", "team-b"),
        kv("route", "/pay"),
    ];
    for gz in [false, true] {
        let reply = post_to_label_mode(&proxy, &alice, &metrics_request(&claims), gz).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        let seen = prometheus.last();
        assert_eq!(seen.path, "/api/v1/otlp/v1/metrics");
        assert_eq!(
            seen.headers.get("content-encoding").is_some(),
            gz,
            "gzip out iff gzip in"
        );
        let forwarded = if gz {
            gunzip(&seen.body)
        } else {
            seen.body.to_vec()
        };
        ExportMetricsServiceRequest::decode(forwarded.as_slice()).expect("forwarded protobuf");
    }
    let series = prometheus.otlp_series();
    // Per request: target_info, a gauge, a counter, a histogram's four.
    assert_eq!(series.len(), 2 * 7, "{series:#?}");
    for s in &series {
        assert_eq!(
            s.get("k8s_namespace_name").map(String::as_str),
            Some("team-a"),
            "{s:?}"
        );
    }
    // The scope attribute is kept under its own name: another label.
    assert!(series
        .iter()
        .any(|s| s.contains_key("otel_scope_k8s_namespace_name")));
    assert!(series
        .iter()
        .any(|s| s["__name__"] == "target_info" && s["job"] == "checkout"));
    assert!(series
        .iter()
        .any(|s| s["__name__"] == "requests_total" && s["route"] == "/pay"));
    // Values and times are stored as they were sent.
    let samples = prometheus.otlp_samples();
    let stored = |name: &str, le: Option<&str>| -> Vec<(Option<f64>, i64)> {
        samples
            .iter()
            .filter(|s| {
                s.labels["__name__"] == name && s.labels.get("le").map(String::as_str) == le
            })
            .map(|s| (s.value, s.timestamp_ms))
            .collect()
    };
    for (name, le, value) in [
        ("queue_depth", None, 7.5),
        ("requests_total", None, 42.0),
        ("latency_bucket", Some("0.5"), 2.0),
        ("latency_bucket", Some("+Inf"), 3.0),
        ("latency_count", None, 3.0),
        ("latency_sum", None, 1.25),
        ("target_info", None, 1.0),
    ] {
        assert_eq!(
            stored(name, le),
            [(Some(value), POINT_TIME_MS); 2],
            "{name} {le:?}"
        );
    }
    let metrics = proxy.metrics().await;
    assert!(
        metrics.contains(r#"tenant_proxy_otlp_data_points_total{tenant="team-a"} 6"#),
        "{metrics}"
    );
    assert!(metrics.contains(r#"tenant_proxy_requests_total{tenant="team-a",surface="metrics_otlp",status_class="2xx"} 2"#), "{metrics}");
    // Both reached Prometheus, and were timed under their surface.
    assert!(
        metrics
            .contains(r#"tenant_proxy_upstream_duration_seconds_count{surface="metrics_otlp"} 2"#),
        "{metrics}"
    );
}

/// A field the OTLP schema does not define (the request's field 31,
/// holding `unread`) leaves with no check having read it: it is dropped,
/// the series are stored without it, and the operator sees it counted.
#[tokio::test]
async fn otlp_fields_the_schema_does_not_define_are_dropped_and_counted() {
    let (prometheus, proxy) = label_mode("").await;
    let headers = [("content-type", "application/x-protobuf")];
    let alice = basic("alice", "alice-pw");
    // A request with nothing to drop leaves no series of zero behind.
    let clean = metrics_request(&[]).encode_to_vec();
    let reply = post(&proxy, "/api/v1/otlp/v1/metrics", &alice, &headers, clean).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let metrics = proxy.metrics().await;
    assert!(metrics.contains("tenant_proxy_otlp_data_points_total{tenant=\"team-a\"}"));
    assert!(
        !metrics.contains("tenant_proxy_otlp_dropped_fields_total{"),
        "{metrics}"
    );

    let mut raw = metrics_request(&[]).encode_to_vec();
    raw.extend_from_slice(&[0xfa, 0x01, 6]);
    raw.extend_from_slice(b"unread");
    let reply = post(&proxy, "/api/v1/otlp/v1/metrics", &alice, &headers, raw).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let forwarded = prometheus.last().body;
    assert!(!forwarded.windows(6).any(|w| w == b"unread"));
    let series = prometheus.otlp_series();
    assert!(!series.is_empty());
    assert!(series
        .iter()
        .all(|s| s.get("k8s_namespace_name").map(String::as_str) == Some("team-a")));
    let metrics = proxy.metrics().await;
    assert!(
        metrics.contains(r#"tenant_proxy_otlp_dropped_fields_total{tenant="team-a"} 1"#),
        "{metrics}"
    );
}

/// `otlp_forward_encoding: identity`: a relabelled gzip body goes out
/// uncompressed (no `Content-Encoding`), relabelled all the same; a body
/// already scoped goes out as it came, gzip and all.
#[tokio::test]
async fn otlp_metrics_relabelled_from_gzip_are_forwarded_uncompressed_when_configured() {
    let (prometheus, proxy) = label_mode("  otlp_forward_encoding: identity\n").await;
    let alice = basic("alice", "alice-pw");
    let headers = [
        ("content-type", "application/x-protobuf"),
        ("content-encoding", "gzip"),
    ];
    let foreign = gzip(&metrics_request(&[kv("k8s.namespace.name", "team-b")]).encode_to_vec());
    let reply = post(&proxy, "/api/v1/otlp/v1/metrics", &alice, &headers, foreign).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let seen = prometheus.last();
    assert_eq!(seen.headers.get("content-encoding"), None);
    assert_eq!(
        seen.headers
            .get("content-length")
            .unwrap()
            .to_str()
            .unwrap(),
        seen.body.len().to_string()
    );
    ExportMetricsServiceRequest::decode(&seen.body[..]).expect("uncompressed protobuf");
    let series = prometheus.otlp_series();
    assert_eq!(series.len(), 7, "{series:#?}");
    assert!(series
        .iter()
        .all(|s| s.get("k8s_namespace_name").map(String::as_str) == Some("team-a")));

    // Relabelled once, the forwarded body is already scoped: sent again
    // gzipped, it is forwarded as it came.
    let scoped = gzip(&seen.body);
    let reply = post(
        &proxy,
        "/api/v1/otlp/v1/metrics",
        &alice,
        &headers,
        scoped.clone(),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let again = prometheus.last();
    assert_eq!(again.headers.get("content-encoding").unwrap(), "gzip");
    assert_eq!(again.body, scoped);
}

/// A gzip export of a few dozen KiB that inflates to megabytes (forty
/// thousand points alike) is checked whole on a body worker, as its work
/// goes by what it inflates to, and arrives whole: every point with the
/// tenant's namespace (under the label's own name, the dotted claim
/// removed). So is the same export in two members, the last of a few
/// bytes: its trailer understates the body, whose check in place stops
/// at the body workers' threshold and goes to a body worker after all,
/// counted once.
#[tokio::test]
async fn a_small_gzip_export_that_inflates_far_is_checked_and_forwarded_whole() {
    let (prometheus, proxy) = label_mode("").await;
    let alice = basic("alice", "alice-pw");
    let point = NumberDataPoint {
        attributes: vec![kv("k8s.namespace.name", "team-b"), kv("pod", "web-1")],
        time_unix_nano: POINT_TIME_NS,
        value: Some(Number::AsDouble(1.0)),
        ..Default::default()
    };
    let mut request = metrics_request(&[]);
    let metric = &mut request.resource_metrics[0].scope_metrics[0].metrics[0];
    metric.data = Some(Data::Gauge(Gauge {
        data_points: vec![point; 40_000],
    }));
    let raw = request.encode_to_vec();
    assert!(raw.len() > 2 << 20, "{} bytes inflated", raw.len());
    let (most, last) = raw.split_at(raw.len() - 10);
    let one_member = gzip(&raw);
    let understated = [gzip(most), gzip(last)].concat();
    let headers = [
        ("content-type", "application/x-protobuf"),
        ("content-encoding", "gzip"),
    ];
    let mut received = 0;
    for (sent, body) in [one_member, understated].into_iter().enumerate() {
        assert!(body.len() < 256 << 10, "{} bytes sent", body.len());
        received += body.len();
        let reply = post(&proxy, "/api/v1/otlp/v1/metrics", &alice, &headers, body).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        let seen = prometheus.last();
        assert_eq!(seen.headers.get("content-encoding").unwrap(), "gzip");
        let forwarded = ExportMetricsServiceRequest::decode(&gunzip(&seen.body)[..]).unwrap();
        let metrics = &forwarded.resource_metrics[0].scope_metrics[0].metrics;
        let Some(Data::Gauge(gauge)) = &metrics[0].data else {
            panic!("{:?}", metrics[0].data);
        };
        assert_eq!(gauge.data_points.len(), 40_000);
        for point in &gauge.data_points {
            assert_eq!(
                point.attributes,
                [kv("pod", "web-1"), kv("k8s_namespace_name", "team-a")]
            );
        }
        let metrics = proxy.metrics().await;
        let counted = [
            format!("tenant_proxy_body_worker_jobs_total {}\n", sent + 1),
            format!("tenant_proxy_otlp_received_bytes_total{{tenant=\"team-a\"}} {received}\n"),
            format!(
                "tenant_proxy_otlp_data_points_total{{tenant=\"team-a\"}} {}\n",
                40_002 * (sent + 1)
            ),
        ];
        for line in counted {
            assert!(metrics.contains(&line), "{line} in {metrics}");
        }
    }
}

#[tokio::test]
async fn otlp_metrics_that_cannot_be_checked_are_refused_in_otlp_shape_and_never_forwarded() {
    let (prometheus, proxy) = label_mode("  foreign_label: reject\n").await;
    let alice = basic("alice", "alice-pw");
    let protobuf = [("content-type", "application/x-protobuf")];
    let foreign = metrics_request(&[kv("k8s.namespace.name", "team-b")]).encode_to_vec();

    let rejected = post(
        &proxy,
        "/api/v1/otlp/v1/metrics",
        &alice,
        &protobuf,
        foreign,
    )
    .await;
    assert_eq!(rejected.status, StatusCode::BAD_REQUEST);
    assert_eq!(rejected.headers["content-type"], "application/x-protobuf");
    let status = RpcStatus::decode(rejected.body.as_ref()).unwrap();
    assert_eq!(status.code, 3, "INVALID_ARGUMENT: {}", status.message);
    assert!(
        status.message.contains("does not own"),
        "{}",
        status.message
    );

    let json = post(
        &proxy,
        "/api/v1/otlp/v1/metrics",
        &alice,
        &[("content-type", "application/json")],
        b"{}".to_vec(),
    )
    .await;
    assert_eq!(json.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(
        json.json()["code"],
        3,
        "an OTLP/JSON Status for a JSON request"
    );
    assert!(json.json()["message"]
        .as_str()
        .unwrap()
        .contains("OTLP/JSON"));

    let garbage = post(
        &proxy,
        "/api/v1/otlp/v1/metrics",
        &alice,
        &protobuf,
        b"\xff\xff\xff".to_vec(),
    )
    .await;
    assert_eq!(garbage.status, StatusCode::BAD_REQUEST);
    let not_gzip = post(
        &proxy,
        "/api/v1/otlp/v1/metrics",
        &alice,
        &[protobuf[0], ("content-encoding", "gzip")],
        b"plain".to_vec(),
    )
    .await;
    assert_eq!(not_gzip.status, StatusCode::BAD_REQUEST);
    // Two codings: which one counts is ambiguous, so neither is picked.
    let two_codings = post(
        &proxy,
        "/api/v1/otlp/v1/metrics",
        &alice,
        &[
            protobuf[0],
            ("content-encoding", "identity"),
            ("content-encoding", "gzip"),
        ],
        metrics_request(&[]).encode_to_vec(),
    )
    .await;
    assert_eq!(two_codings.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let status = RpcStatus::decode(two_codings.body.as_ref()).unwrap();
    assert!(
        status.message.contains("more than one content-encoding"),
        "{}",
        status.message
    );

    let reader = basic("reader", "reader-pw");
    let owned = metrics_request(&[kv("k8s_namespace_name", "team-a")]).encode_to_vec();
    let read_only = post(
        &proxy,
        "/api/v1/otlp/v1/metrics",
        &reader,
        &protobuf,
        owned.clone(),
    )
    .await;
    assert_eq!(read_only.status, StatusCode::FORBIDDEN);
    let wrong = post(
        &proxy,
        "/api/v1/otlp/v1/metrics",
        &basic("alice", "nope"),
        &protobuf,
        owned,
    )
    .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        RpcStatus::decode(wrong.body.as_ref()).unwrap().code,
        16,
        "UNAUTHENTICATED"
    );
    assert!(
        prometheus.received().is_empty(),
        "nothing reached the receiver"
    );
    let metrics = proxy.metrics().await;
    assert!(
        metrics.contains(
            r#"tenant_proxy_otlp_tenant_label_total{tenant="team-a",action="rejected"} 1"#
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"tenant_proxy_otlp_decode_errors_total{tenant="team-a"} 4"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn an_unreachable_receiver_makes_otlp_senders_retry() {
    let (refused, _reserved) = support::refused_port();
    let section =
        format!("  upstream: http://{refused}\n  mode: label\n  label: k8s_namespace_name\n");
    let proxy = RunningProxy::start(ProxyOptions::metrics(label_mode_tenants(), section)).await;
    let body = metrics_request(&[]).encode_to_vec();
    let reply = post(
        &proxy,
        "/api/v1/otlp/v1/metrics",
        &basic("alice", "alice-pw"),
        &[("content-type", "application/x-protobuf")],
        body,
    )
    .await;
    assert_eq!(
        reply.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "OTLP senders retry 503"
    );
    assert!(reply.headers.contains_key("retry-after"));
    assert_eq!(
        RpcStatus::decode(reply.body.as_ref()).unwrap().code,
        14,
        "UNAVAILABLE"
    );
}

/// Attribute keys a sender could use to claim the label
/// `k8s_namespace_name` (spellings the receiver turns into it, and near
/// misses it does not), and others.
const CLAIM_KEYS: &[&str] = &[
    "k8s.namespace.name",
    "k8s-namespace-name",
    "k8s_namespace_name",
    "k8s/namespace/name",
    "K8s.namespace.name",
    "k8s.namespace.name ",
    "route",
    "service.name",
    "service.instance.id",
];

const CLAIM_VALUES: &[&str] = &["team-a", "team-a-staging", "team-b", "", ".*"];

fn attributes_strategy() -> impl Strategy<Value = Vec<KeyValue>> {
    prop::collection::vec(
        (
            prop::sample::select(CLAIM_KEYS),
            prop::sample::select(CLAIM_VALUES),
        )
            .prop_map(|(k, v)| kv(k, v)),
        0..4,
    )
}

/// A request with generated attributes at resource, scope and data-point
/// level, over the gauge, counter and histogram of [`metrics_request`].
fn generated_request(
    resource: Vec<KeyValue>,
    scope: Vec<KeyValue>,
    points: Vec<KeyValue>,
) -> ExportMetricsServiceRequest {
    let mut request = metrics_request(&points);
    let resource_metrics = &mut request.resource_metrics[0];
    resource_metrics.resource.as_mut().unwrap().attributes = resource;
    resource_metrics.scope_metrics[0]
        .scope
        .as_mut()
        .unwrap()
        .attributes = scope;
    request
}

/// Each sample's name, `le`, value and time, sorted; `target_info` left out.
fn readings(samples: &[Sample]) -> Vec<String> {
    let mut out: Vec<String> = samples
        .iter()
        .filter(|s| s.labels["__name__"] != "target_info")
        .map(|s| {
            let (name, le) = (&s.labels["__name__"], s.labels.get("le"));
            format!("{name} {le:?} {:?} {}", s.value, s.timestamp_ms)
        })
        .collect();
    out.sort();
    out
}

/// Through the server, for generated attributes at every level, gzip or
/// not: every series the Prometheus 3 stand-in stores from an accepted
/// request carries `k8s_namespace_name` with one of the tenant's values,
/// and every sample the value and time it was sent with; a refused request
/// stores nothing.
#[test]
fn every_series_stored_from_a_generated_otlp_request_is_the_tenants() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (prometheus, proxy) = runtime.block_on(label_mode(""));
    let alice = basic("alice", "alice-pw");
    let mut runner = support::property_runner(64);
    let accepted = std::cell::Cell::new(0);
    let strategy = (
        attributes_strategy(),
        attributes_strategy(),
        attributes_strategy(),
        any::<bool>(),
    );
    let result = runner.run(&strategy, |(resource, scope, points, gz)| {
        let request = generated_request(resource, scope, points);
        let before = prometheus.otlp_samples().len();
        let reply = runtime.block_on(post_to_label_mode(&proxy, &alice, &request, gz));
        let stored = prometheus.otlp_samples()[before..].to_vec();
        if reply.status != StatusCode::OK {
            prop_assert!(stored.is_empty(), "refused, yet stored: {stored:?}");
            return Ok(());
        }
        accepted.set(accepted.get() + 1);
        prop_assert!(!stored.is_empty(), "accepted, nothing stored");
        for s in &stored {
            let value = s.labels.get("k8s_namespace_name").map(String::as_str);
            prop_assert!(
                matches!(value, Some("team-a" | "team-a-staging")),
                "a series beyond the tenant: {s:?}"
            );
        }
        // target_info aside (its resource may lose the attributes it was
        // made of), every sample is stored with the value and time it was
        // sent with.
        prop_assert_eq!(
            readings(&stored),
            readings(&otlp_metrics::samples(&request))
        );
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    assert!(accepted.get() >= 32, "only {} accepted", accepted.get());
}
