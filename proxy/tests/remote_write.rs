//! End-to-end remote write: agent-mode Prometheus instances push through the
//! proxy (label mode) into a receiver Prometheus, and the proxy's query path
//! shows each tenant only its own series.

mod support;

use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use http::{Method, StatusCode};
use proptest::prelude::*;
use prost::Message;
use serde_json::Value;
use support::loki::LokiStandIn;
use support::prometheus::{time_series, PrometheusProcess};
use support::{basic, eventually, send, ProxyOptions, Reply, RunningProxy, TenantSpec};
use tenant_proxy::enforce::prompb::{v2, Label, WriteRequest};

fn tenants() -> String {
    support::tenants_with_namespaces(&[
        (
            TenantSpec {
                id: "team-a",
                users: &[("alice", "alice-pw", None)],
            },
            &["team-a"],
        ),
        (
            TenantSpec {
                id: "team-b",
                users: &[("bob", "bob-pw", None)],
            },
            &["team-b"],
        ),
    ])
}

async fn label_mode_proxy(upstream: &str, extra: &str) -> RunningProxy {
    support::captured_logs();
    let section = format!("  upstream: {upstream}\n  mode: label\n{extra}");
    RunningProxy::start(ProxyOptions::metrics(tenants(), section)).await
}

/// Pushes a 1.0 `body`, which must be accepted (204), and returns what the
/// receiver got, decompressed.
async fn accepted_and_forwarded(
    proxy: &RunningProxy,
    receiver: &LokiStandIn,
    body: Vec<u8>,
) -> Vec<u8> {
    let reply = push(proxy, V1_HEADERS, body).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.text());
    snap::raw::Decoder::new()
        .decompress_vec(&receiver.last().body)
        .unwrap()
}

/// An agent scraping itself every second and pushing through the proxy.
async fn agent(
    job: &str,
    user: &str,
    password: &str,
    proxy: SocketAddr,
    stamp: Option<&str>,
) -> PrometheusProcess {
    let external = stamp
        .map(|ns| format!("  external_labels: {{namespace: {ns}}}\n"))
        .unwrap_or_default();
    let url = format!("http://{proxy}/api/v1/write");
    agent_pushing_to(job, user, password, &url, &external, "").await
}

/// An agent scraping itself every second and pushing to `url`; `global`
/// and `remote_write` are more lines of those sections.
async fn agent_pushing_to(
    job: &str,
    user: &str,
    password: &str,
    url: &str,
    global: &str,
    remote_write: &str,
) -> PrometheusProcess {
    let config = format!(
        "global:\n  scrape_interval: 1s\n{global}\
         scrape_configs:\n  - job_name: {job}\n    static_configs: [{{targets: ['@own@']}}]\n\
         remote_write:\n  - url: {url}\n    basic_auth: {{username: {user}, password: {password}}}\n\
         \x20   queue_config: {{batch_send_deadline: 1s, min_backoff: 100ms, max_backoff: 1s}}\n\
         {remote_write}"
    );
    PrometheusProcess::start_agent(move |own| config.replace("@own@", &own.to_string())).await
}

async fn query(url: &str, auth: Option<&str>, promql: &str) -> Vec<Value> {
    let body = format!(
        "query={}",
        form_urlencoded::byte_serialize(promql.as_bytes()).collect::<String>()
    );
    let reply = send(
        Method::POST,
        url,
        auth,
        &[("content-type", "application/x-www-form-urlencoded")],
        body,
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    reply.json()["data"]["result"].as_array().unwrap().clone()
}

// Several threads: stopping an agent blocks one while the proxy serves its flush.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_push_through_the_proxy_and_each_tenant_sees_only_its_own_series() {
    let receiver = PrometheusProcess::start("groups: []\n").await;
    let proxy = label_mode_proxy(&receiver.url(), "").await;
    // Agent A claims team-b's namespace; agent B sets none.
    let _a = agent("agent-a", "alice", "alice-pw", proxy.addr, Some("team-b")).await;
    let _b = agent("agent-b", "bob", "bob-pw", proxy.addr, None).await;

    let url = proxy.url("/api/v1/query");
    let (alice, bob) = (basic("alice", "alice-pw"), basic("bob", "bob-pw"));
    eventually(
        "both agents' series arrive",
        Duration::from_secs(60),
        async || {
            !query(&url, Some(&alice), "up").await.is_empty()
                && !query(&url, Some(&bob), "up").await.is_empty()
        },
    )
    .await;

    for (auth, own_job, own_ns, other_job) in [
        (&alice, "agent-a", "team-a", "agent-b"),
        (&bob, "agent-b", "team-b", "agent-a"),
    ] {
        let series = query(
            &url,
            Some(auth),
            r#"{__name__=~"up|prometheus_build_info"}"#,
        )
        .await;
        assert!(!series.is_empty());
        for s in &series {
            assert_eq!(s["metric"]["job"], own_job, "{s}");
            assert_eq!(s["metric"]["namespace"], own_ns, "{s}");
        }
        assert!(
            query(&url, Some(auth), &format!("up{{job=\"{other_job}\"}}"))
                .await
                .is_empty()
        );
    }
    // Straight from the receiver: A's attempt to write as team-b was stored as team-a.
    let direct = format!("{}/api/v1/query", receiver.url());
    assert!(
        query(&direct, None, r#"up{job="agent-a",namespace="team-b"}"#)
            .await
            .is_empty()
    );
    assert!(
        !query(&direct, None, r#"up{job="agent-a",namespace="team-a"}"#)
            .await
            .is_empty()
    );

    let metrics = proxy.metrics().await;
    assert!(
        metrics.contains(
            r#"tenant_proxy_remote_write_tenant_label_total{tenant="team-a",action="overwritten"}"#
        ),
        "{metrics}"
    );
    assert!(metrics.contains(
        r#"tenant_proxy_remote_write_tenant_label_total{tenant="team-b",action="added"}"#
    ));
    assert!(metrics.contains(r#"tenant_proxy_remote_write_samples_total{tenant="team-a"}"#));
}

// Several threads: stopping an agent blocks one while the proxy serves its flush.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_sample_is_lost_while_the_receiver_is_down() {
    let mut receiver = PrometheusProcess::start("groups: []\n").await;
    let proxy = label_mode_proxy(&receiver.url(), "").await;
    let _agent = agent("agent-a", "alice", "alice-pw", proxy.addr, None).await;
    let direct = format!("{}/api/v1/query", receiver.url());
    eventually(
        "three samples arrive",
        Duration::from_secs(60),
        async || {
            let count = query(&direct, None, r#"count_over_time(up{job="agent-a"}[1m])"#).await;
            count
                .first()
                .is_some_and(|s| s["value"][1].as_str().unwrap().parse::<f64>().unwrap() >= 3.0)
        },
    )
    .await;

    let outage_start = SystemTime::now();
    receiver.stop();
    // The outage itself: the agent keeps scraping and its pushes fail meanwhile.
    tokio::time::sleep(Duration::from_secs(5)).await;
    receiver.restart().await;
    let restarted = SystemTime::now();

    // Wait until samples scraped after the restart have arrived: by then the
    // backlog (sent in order) has too.
    let settled = restarted
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        + 3.0;
    eventually(
        "the backlog is delivered",
        Duration::from_secs(60),
        async || {
            let latest = query(&direct, None, r#"timestamp(up{job="agent-a"})"#).await;
            latest
                .first()
                .is_some_and(|s| s["value"][1].as_str().unwrap().parse::<f64>().unwrap() > settled)
        },
    )
    .await;

    // Every scrape from before the outage to after it is stored: no gap.
    let window = restarted.duration_since(outage_start).unwrap().as_secs() + 20;
    let raw = query(&direct, None, &format!(r#"up{{job="agent-a"}}[{window}s]"#)).await;
    let stamps: Vec<f64> = raw[0]["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v[0].as_f64().unwrap())
        .collect();
    let outage = outage_start
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        stamps.first().unwrap() < &(outage - 1.0),
        "the window starts before the outage ({outage}): {stamps:?}"
    );
    let widest = stamps.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max);
    assert!(
        widest < 2.5,
        "a gap of {widest} s in samples scraped every 1 s: {stamps:?}"
    );

    let metrics = proxy.metrics().await;
    assert!(
        metrics.contains(r#"tenant_proxy_errors_total{reason="upstream_unavailable"}"#),
        "the proxy saw the outage: {metrics}"
    );
}

/// A message as remote write sends it: protobuf, snappy block format.
fn snappy(message: &impl Message) -> Vec<u8> {
    snap::raw::Encoder::new()
        .compress_vec(&message.encode_to_vec())
        .unwrap()
}

fn v1_body(series: &[(&[(&str, &str)], f64)]) -> Vec<u8> {
    let request = WriteRequest {
        timeseries: series
            .iter()
            .map(|(l, v)| time_series(l, *v, 1_700_000_000_000))
            .collect(),
        metadata: vec![],
    };
    snappy(&request)
}

/// A 2.0 request of one series, `metric`, with one sample.
fn v2_series(metric: &str) -> v2::Request {
    v2::Request {
        symbols: vec!["".into(), "__name__".into(), metric.into()],
        timeseries: vec![v2::TimeSeries {
            labels_refs: vec![1, 2],
            samples: vec![v2::Sample {
                value: 1.0,
                timestamp: 1,
            }],
            ..Default::default()
        }],
    }
}

const V1_HEADERS: &[(&str, &str)] = &[
    ("content-type", "application/x-protobuf"),
    ("content-encoding", "snappy"),
    ("x-prometheus-remote-write-version", "0.1.0"),
];
const V2_CT: &str = "application/x-protobuf;proto=io.prometheus.write.v2.Request";

/// A push to label mode's remote-write path, as alice (tenant team-a).
async fn push(proxy: &RunningProxy, headers: &[(&str, &str)], body: Vec<u8>) -> Reply {
    push_to(proxy, "/api/v1/write", headers, body).await
}

/// A push to `path`, as alice (tenant team-a).
async fn push_to(
    proxy: &RunningProxy,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> Reply {
    send(
        Method::POST,
        &proxy.url(path),
        Some(&basic("alice", "alice-pw")),
        headers,
        body,
    )
    .await
}

#[tokio::test]
async fn remote_write_2_0_is_rewritten_and_confirmed_by_a_2_0_receiver() {
    let receiver = LokiStandIn::start().await;
    let proxy = label_mode_proxy(&receiver.url(), "").await;
    let request = v2::Request {
        symbols: vec![
            "".into(),
            "__name__".into(),
            "up".into(),
            "namespace".into(),
            "team-b".into(),
        ],
        timeseries: vec![v2::TimeSeries {
            labels_refs: vec![1, 2, 3, 4],
            samples: vec![v2::Sample {
                value: 1.0,
                timestamp: 1,
            }],
            ..Default::default()
        }],
    };
    let body = snappy(&request);
    // Spelled in capitals, which RFC 9110 allows and Prometheus 3 refuses
    // (415): the proxy forwards the canonical spelling of what it read.
    let headers = [
        (
            "content-type",
            "Application/X-Protobuf;proto=io.prometheus.write.v2.Request",
        ),
        ("content-encoding", "SNAPPY"),
        ("x-prometheus-remote-write-version", "2.0.0"),
    ];
    let reply = push(&proxy, &headers, body).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT);
    assert_eq!(
        reply.headers["x-prometheus-remote-write-samples-written"],
        "1"
    );

    let seen = receiver.last();
    assert_eq!(
        seen.headers["content-type"], V2_CT,
        "canonical Content-Type"
    );
    assert_eq!(seen.headers["content-encoding"], "snappy");
    assert_eq!(seen.headers["x-prometheus-remote-write-version"], "2.0.0");
    assert!(!seen.headers.contains_key("authorization"));
    let raw = snap::raw::Decoder::new()
        .decompress_vec(&seen.body)
        .unwrap();
    let got = v2::Request::decode(raw.as_slice()).unwrap();
    let labels: Vec<&str> = got.timeseries[0]
        .labels_refs
        .iter()
        .map(|r| got.symbols[*r as usize].as_str())
        .collect();
    assert_eq!(labels, ["__name__", "up", "namespace", "team-a"]);
}

#[tokio::test]
async fn remote_write_2_0_to_a_1_0_receiver_is_415_not_a_success() {
    let receiver = PrometheusProcess::start("groups: []\n").await;
    let proxy = label_mode_proxy(&receiver.url(), "").await;
    let request = v2_series("v2_only_metric");
    let body = snappy(&request);
    let reply = push(
        &proxy,
        &[("content-type", V2_CT), ("content-encoding", "snappy")],
        body,
    )
    .await;
    assert_eq!(
        reply.status,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "{}",
        reply.text()
    );
    let metrics = proxy.metrics().await;
    assert!(
        metrics.contains(r#"tenant_proxy_remote_write_unconfirmed_total{tenant="team-a"} 1"#),
        "{metrics}"
    );
    // And 1.0 works.
    let reply = push(
        &proxy,
        V1_HEADERS,
        v1_body(&[(&[("__name__", "v1_metric")], 1.0)]),
    )
    .await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.text());
}

#[tokio::test]
async fn bad_remote_write_requests_are_refused_and_never_forwarded() {
    let receiver = LokiStandIn::start().await;
    let proxy = label_mode_proxy(&receiver.url(), "  foreign_label: reject\n").await;
    let good = v1_body(&[(&[("__name__", "up")], 1.0)]);

    let cases: Vec<(&str, Reply, StatusCode)> = vec![
        (
            "json body",
            push(
                &proxy,
                &[("content-type", "application/json")],
                b"{}".to_vec(),
            )
            .await,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ),
        (
            "unknown proto",
            push(
                &proxy,
                &[
                    ("content-type", "application/x-protobuf;proto=x.Y"),
                    ("content-encoding", "snappy"),
                ],
                good.clone(),
            )
            .await,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ),
        (
            "gzip",
            push(
                &proxy,
                &[
                    ("content-type", "application/x-protobuf"),
                    ("content-encoding", "gzip"),
                ],
                good.clone(),
            )
            .await,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ),
        (
            "identity",
            push(
                &proxy,
                &[
                    ("content-type", "application/x-protobuf"),
                    ("content-encoding", "identity"),
                ],
                good.clone(),
            )
            .await,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ),
        (
            "garbage",
            push(&proxy, V1_HEADERS, b"not snappy at all".to_vec()).await,
            StatusCode::BAD_REQUEST,
        ),
        (
            "truncated snappy",
            push(&proxy, V1_HEADERS, good[..good.len() - 3].to_vec()).await,
            StatusCode::BAD_REQUEST,
        ),
        (
            "foreign label, reject policy",
            push(
                &proxy,
                V1_HEADERS,
                v1_body(&[(&[("__name__", "stolen"), ("namespace", "team-b")], 1.0)]),
            )
            .await,
            StatusCode::BAD_REQUEST,
        ),
        (
            "snappy bomb",
            push(&proxy, V1_HEADERS, vec![0xff, 0xff, 0xff, 0xff, 0x0f, 0x00]).await,
            StatusCode::PAYLOAD_TOO_LARGE,
        ),
    ];
    for (case, reply, status) in &cases {
        assert_eq!(reply.status, *status, "{case}: {}", reply.text());
        assert_eq!(reply.json()["status"], "error", "{case}");
    }
    assert!(
        cases[6].1.text().contains("stolen"),
        "the refused series is named"
    );
    for coding in &cases[2..4] {
        assert!(
            coding.1.text().contains("snappy-compressed"),
            "{}: the reason names what is expected: {}",
            coding.0,
            coding.1.text()
        );
    }
    assert!(
        receiver.received().is_empty(),
        "nothing reached the receiver"
    );
    let metrics = proxy.metrics().await;
    assert!(
        metrics.contains(
            r#"tenant_proxy_remote_write_tenant_label_total{tenant="team-a",action="rejected"} 1"#
        ),
        "{metrics}"
    );

    let reply = push(&proxy, V1_HEADERS, good).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT);
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Headers a client's `Connection` names are for the proxy alone: they are
/// gone before the body is read, so the proxy never checks a body by a
/// header the receiver will not see, and the headers it sets for the body
/// it forwards cannot be named away. Before, a 2.0 body was checked as 2.0
/// and forwarded without its Content-Type, which a receiver reads as 1.0.
#[tokio::test]
async fn headers_named_in_connection_never_decide_how_a_push_is_read() {
    let receiver = LokiStandIn::start().await;
    let proxy = label_mode_proxy(&receiver.url(), "").await;
    let named = "content-type, content-encoding, x-prometheus-remote-write-version";

    let mut headers = V1_HEADERS.to_vec();
    headers.push(("connection", named));
    let reply = push(&proxy, &headers, v1_body(&[(&[("__name__", "up")], 1.0)])).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT);
    let seen = receiver.last();
    assert_eq!(seen.headers["content-type"], "application/x-protobuf");
    assert_eq!(seen.headers["content-encoding"], "snappy");
    assert_eq!(seen.headers["x-prometheus-remote-write-version"], "0.1.0");
    assert!(!seen.headers.contains_key("connection"));

    // A 2.0 body whose Content-Type was for the proxy alone is read as
    // 1.0 (as a receiver without the header would), where it is no
    // WriteRequest: refused, never forwarded.
    let forwarded = receiver.received().len();
    let request = v2_series("up");
    let headers = [
        ("content-type", V2_CT),
        ("content-encoding", "snappy"),
        ("x-prometheus-remote-write-version", "2.0.0"),
        ("connection", "content-type"),
    ];
    let reply = push(&proxy, &headers, snappy(&request)).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text());
    assert_eq!(receiver.received().len(), forwarded, "nothing forwarded");
}

/// A compressed 1.0 body of one series stamped with team-b's namespace.
fn v1_for_team_b(metric: &str) -> Vec<u8> {
    let request = WriteRequest {
        timeseries: vec![time_series(
            &[("__name__", metric), ("namespace", "team-b")],
            1.0,
            now_ms(),
        )],
        metadata: vec![],
    };
    snappy(&request)
}

/// Issue #13: a 1.0 body declared 2.0 was forwarded, and a real 1.0
/// receiver (which ignores `proto=`) stored it under team-b.
#[tokio::test]
async fn a_body_of_one_version_declared_as_the_other_never_reaches_the_receiver() {
    let receiver = PrometheusProcess::start("groups: []\n").await;
    let proxy = label_mode_proxy(&receiver.url(), "").await;

    let confusion = push(
        &proxy,
        &[("content-type", V2_CT), ("content-encoding", "snappy")],
        v1_for_team_b("escape_marker"),
    )
    .await;
    assert_eq!(
        confusion.status,
        StatusCode::BAD_REQUEST,
        "{}",
        confusion.text()
    );
    assert!(
        confusion.text().contains("1.0's timeseries"),
        "the error says what was wrong: {}",
        confusion.text()
    );
    let v2_bytes = v2::Request {
        symbols: ["", "__name__", "escape_marker_v2", "namespace", "team-b"]
            .map(String::from)
            .to_vec(),
        timeseries: vec![v2::TimeSeries {
            labels_refs: vec![1, 2, 3, 4],
            samples: vec![v2::Sample {
                value: 1.0,
                timestamp: now_ms(),
            }],
            ..Default::default()
        }],
    };
    let mut mixed = WriteRequest {
        timeseries: vec![time_series(&[("__name__", "mixed_ok")], 1.0, now_ms())],
        metadata: vec![],
    }
    .encode_to_vec();
    mixed.extend(v2_bytes.encode_to_vec());
    let reverse = push(
        &proxy,
        V1_HEADERS,
        snap::raw::Encoder::new().compress_vec(&mixed).unwrap(),
    )
    .await;
    assert_eq!(
        reverse.status,
        StatusCode::BAD_REQUEST,
        "{}",
        reverse.text()
    );

    // A control push in unusual but valid spelling lands, under team-a:
    // the receiver stores a push before it answers, so the query below
    // would see the refused ones had they been forwarded.
    let control = push(
        &proxy,
        &[
            ("content-type", "Application/X-Protobuf"),
            ("content-encoding", "SNAPPY"),
        ],
        v1_for_team_b("control_marker"),
    )
    .await;
    assert_eq!(control.status, StatusCode::NO_CONTENT, "{}", control.text());

    let direct = format!("{}/api/v1/query", receiver.url());
    let stored = |promql| query(&direct, None, promql);
    let control = stored("control_marker").await;
    assert_eq!(control.len(), 1, "{control:?}");
    assert_eq!(control[0]["metric"]["namespace"], "team-a");
    assert_eq!(
        stored(r#"{__name__=~"escape_marker.*|mixed_ok"}"#).await,
        Vec::<Value>::new(),
        "nothing of a refused push is stored, under any namespace"
    );
    let metrics = proxy.metrics().await;
    assert!(
        metrics.contains(r#"tenant_proxy_remote_write_decode_errors_total{tenant="team-a"} 2"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn upstream_errors_reach_the_sender_so_it_retries_or_drops_correctly() {
    let receiver = LokiStandIn::start().await;
    let proxy = label_mode_proxy(&receiver.url(), "").await;
    let body = v1_body(&[(&[("__name__", "up")], 1.0)]);
    for code in ["500", "503", "429", "400"] {
        let mut headers = V1_HEADERS.to_vec();
        headers.push(("x-test-status", code));
        let reply = push(&proxy, &headers, body.clone()).await;
        assert_eq!(reply.status.as_str(), code);
        assert_eq!(reply.headers["retry-after"], "7");
    }
    let (refused, _reserved) = support::refused_port();
    let down = label_mode_proxy(&format!("http://{refused}"), "").await;
    let reply = push(&down, V1_HEADERS, body).await;
    assert_eq!(
        reply.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "unreachable upstream: the sender retries"
    );
}

/// A field inside a series that 1.0 does not define (number 7, holding
/// `unread`) leaves with no check having read it: it is dropped, the
/// series lands without it, and the operator sees it counted.
#[tokio::test]
async fn fields_no_schema_defines_are_dropped_and_counted() {
    let receiver = LokiStandIn::start().await;
    let proxy = label_mode_proxy(&receiver.url(), "").await;
    // A push with nothing to drop leaves no series of zero behind: the
    // count exists only for the tenants whose senders are newer.
    let clean = v1_body(&[(&[("__name__", "up")], 1.0)]);
    assert_eq!(
        push(&proxy, V1_HEADERS, clean).await.status,
        StatusCode::NO_CONTENT
    );
    let metrics = proxy.metrics().await;
    assert!(metrics.contains("tenant_proxy_remote_write_series_total{tenant=\"team-a\"} 1"));
    assert!(
        !metrics.contains("tenant_proxy_remote_write_dropped_fields_total{"),
        "{metrics}"
    );

    let mut series = time_series(&[("__name__", "up")], 1.0, now_ms()).encode_to_vec();
    series.extend_from_slice(&[7 << 3 | 2, 6]);
    series.extend_from_slice(b"unread");
    // A length below 128 is one varint byte.
    assert!(series.len() < 128);
    let mut request = vec![1 << 3 | 2, series.len() as u8];
    request.extend_from_slice(&series);
    let body = snap::raw::Encoder::new().compress_vec(&request).unwrap();

    let forwarded = accepted_and_forwarded(&proxy, &receiver, body).await;
    assert!(!forwarded.windows(6).any(|w| w == b"unread"));
    let stored = WriteRequest::decode(forwarded.as_slice()).unwrap();
    let labels: Vec<_> = stored.timeseries[0]
        .labels
        .iter()
        .map(|l| (l.name.as_str(), l.value.as_str()))
        .collect();
    assert_eq!(labels, [("__name__", "up"), ("namespace", "team-a")]);
    let metrics = proxy.metrics().await;
    assert!(
        metrics.contains(r#"tenant_proxy_remote_write_dropped_fields_total{tenant="team-a"} 1"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn header_mode_streams_the_push_untouched_with_the_tenant_header() {
    support::captured_logs();
    let mimir = LokiStandIn::start().await;
    let section = format!("  upstream: {}\n  mode: header\n", mimir.url());
    let proxy = RunningProxy::start(ProxyOptions::metrics(tenants(), section)).await;
    let body = v1_body(&[(&[("__name__", "up"), ("namespace", "team-b")], 1.0)]);
    // Mimir skips its series checks for these where an operator let it,
    // for trusted callers only: a tenant's never reach it.
    let mut headers = V1_HEADERS.to_vec();
    headers.extend([
        ("X-Mimir-SkipLabelNameValidation", "true"),
        ("X-Mimir-SkipLabelCountValidation", "true"),
    ]);
    let reply = push_to(&proxy, "/api/v1/push", &headers, body.clone()).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT);
    let seen = mimir.last();
    assert_eq!(seen.path, "/api/v1/push");
    assert_eq!(seen.org_ids(), ["team-a"]);
    for skip in [
        "x-mimir-skiplabelnamevalidation",
        "x-mimir-skiplabelcountvalidation",
    ] {
        assert!(!seen.headers.contains_key(skip), "{skip} reached Mimir");
    }
    assert_eq!(
        seen.body.as_ref(),
        body.as_slice(),
        "header mode does not rewrite"
    );
    // Mimir reads what it is sent: a body that is no snappy WriteRequest
    // is refused there (400, passed on: the sender drops it).
    let reply = push_to(&proxy, "/api/v1/push", V1_HEADERS, b"not snappy".to_vec()).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(mimir.last().body.as_ref(), b"not snappy");
}

/// Header mode for Thanos (`metrics.header: THANOS-TENANT`): the client's
/// copies of either tenant header never reach it, and the tenant is set
/// once, from the credential.
#[tokio::test]
async fn a_thanos_tenant_header_is_set_once_from_the_credential() {
    support::captured_logs();
    let thanos = LokiStandIn::start().await;
    let section = support::header_mode_section(&thanos.url(), "THANOS-TENANT");
    let proxy = RunningProxy::start(ProxyOptions::metrics(tenants(), section)).await;
    let mut headers = V1_HEADERS.to_vec();
    headers.extend([
        ("THANOS-TENANT", "team-b"),
        ("thanos-tenant", "team-c"),
        ("X-Scope-OrgID", "team-b"),
    ]);
    let reply = push(&proxy, &headers, v1_body(&[(&[("__name__", "up")], 1.0)])).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.text());
    let seen = thanos.last();
    let tenant: Vec<_> = seen.headers.get_all("thanos-tenant").iter().collect();
    assert_eq!(tenant, ["team-a"]);
    assert!(!seen.headers.contains_key("x-scope-orgid"));

    // Thanos Receive's own path, which stamps the series with the header's
    // tenant: the body as sent, the tenant from the credential.
    let body = v1_body(&[(&[("__name__", "up")], 1.0)]);
    let received = push_to(&proxy, "/api/v1/receive", &headers, body.clone()).await;
    assert_eq!(received.status, StatusCode::OK, "{}", received.text());
    let seen = thanos.last();
    assert_eq!(seen.path, "/api/v1/receive");
    assert_eq!(seen.body.as_ref(), body.as_slice(), "streamed untouched");
    let tenant: Vec<_> = seen.headers.get_all("thanos-tenant").iter().collect();
    assert_eq!(tenant, ["team-a"]);
}

/// Header mode streams a push unread, so a 1.0-only receiver (Thanos
/// Receive; Mimir before 2.17) decodes a 2.0 body as an empty 1.0 request
/// and answers 2xx. However the sender spelled "2.0", an answer that does
/// not confirm the samples becomes 415, never a success the sender counts
/// as stored; a receiver that confirms them is passed through.
#[tokio::test]
async fn header_mode_turns_an_unconfirmed_2_0_push_into_415() {
    support::captured_logs();
    let upstream = LokiStandIn::start().await;
    let v2_body = snappy(&v2_series("v2_only_metric"));
    let spellings: [&[(&str, &str)]; 4] = [
        &[("content-type", V2_CT)],
        &[(
            "content-type",
            "application/x-protobuf; PROTO=IO.PROMETHEUS.WRITE.V2.REQUEST",
        )],
        &[
            ("content-type", "application/x-protobuf"),
            ("x-prometheus-remote-write-version", "2.0.0"),
        ],
        &[
            ("content-type", V2_CT),
            ("content-type", "application/x-protobuf"),
        ],
    ];
    // Thanos Receive, and Mimir's push.
    for (header, path) in [
        ("THANOS-TENANT", "/api/v1/receive"),
        ("X-Scope-OrgID", "/api/v1/push"),
    ] {
        let section = support::header_mode_section(&upstream.url(), header);
        let proxy = RunningProxy::start(ProxyOptions::metrics(tenants(), section)).await;
        for headers in spellings {
            let before = upstream.received().len();
            let reply = push_to(&proxy, path, headers, v2_body.clone()).await;
            assert_eq!(
                reply.status,
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "{path} {headers:?}: {}",
                reply.text()
            );
            assert!(reply.text().contains("did not confirm"), "{}", reply.text());
            let seen = upstream.received();
            assert_eq!(seen.len(), before + 1, "header mode forwards it unread");
            assert_eq!(seen.last().unwrap().body.as_ref(), v2_body.as_slice());
        }
        if path == "/api/v1/receive" {
            // Receive read each as a request without series: nothing stored.
            let stored = send(
                Method::GET,
                &format!("{}/loki/api/v1/query", upstream.url()),
                None,
                &[("X-Scope-OrgID", "team-a")],
                "",
            )
            .await;
            assert_eq!(stored.json()["data"]["result"], serde_json::json!([]));
        }
        // Counted for the operator: the tenant's sender is losing data.
        let metrics = proxy.metrics().await;
        for counted in [
            r#"tenant_proxy_remote_write_unconfirmed_total{tenant="team-a"} 4"#,
            r#"tenant_proxy_errors_total{reason="remote_write_unconfirmed"} 4"#,
        ] {
            assert!(metrics.contains(counted), "{counted}: {metrics}");
        }
        // 1.0 is not judged by the 2.0 rule.
        let reply = push_to(
            &proxy,
            path,
            V1_HEADERS,
            v1_body(&[(&[("__name__", "up")], 1.0)]),
        )
        .await;
        assert!(reply.status.is_success(), "{path}: {}", reply.text());
        // A 2.0 receiver's confirmation is passed through with its 2xx.
        let reply = push(
            &proxy,
            &[("content-type", V2_CT), ("content-encoding", "snappy")],
            v2_body.clone(),
        )
        .await;
        assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.text());
        assert_eq!(
            reply.headers["x-prometheus-remote-write-samples-written"],
            "1"
        );
    }
}

/// Mimir: queries under `/prometheus`, pushes at the root.
#[tokio::test]
async fn pushes_go_to_the_push_upstream_when_one_is_set() {
    support::captured_logs();
    let queries = LokiStandIn::start().await;
    let pushes = LokiStandIn::start().await;
    let section = format!(
        "  upstream: {}/prometheus\n  push_upstream: {}\n  mode: header\n",
        queries.url(),
        pushes.url()
    );
    let proxy = RunningProxy::start(ProxyOptions::metrics(tenants(), section)).await;
    let body = v1_body(&[(&[("__name__", "up")], 1.0)]);
    for path in ["/api/v1/push", "/api/v1/write"] {
        let reply = push_to(&proxy, path, V1_HEADERS, body.clone()).await;
        assert_eq!(reply.status, StatusCode::NO_CONTENT, "{path}");
        let seen = pushes.last();
        assert_eq!(seen.path, path);
        assert_eq!(seen.org_ids(), ["team-a"]);
    }
    assert!(
        queries.received().is_empty(),
        "no push reached the query upstream"
    );
    // And reads still go to the query upstream, never to the push one.
    let pushed = pushes.received().len();
    let alice = basic("alice", "alice-pw");
    support::get(&proxy.url("/api/v1/query?query=up"), &alice).await;
    let seen = queries.last();
    assert_eq!(seen.path, "/prometheus/api/v1/query");
    assert_eq!(seen.org_ids(), ["team-a"]);
    assert_eq!(
        pushes.received().len(),
        pushed,
        "no read at the push upstream"
    );
}

// Several threads: stopping an agent blocks one while the proxy serves its flush.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_remote_write_config_works_as_given() {
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let receiver = PrometheusProcess::start("groups: []\n").await;
    let tenants = std::fs::read_to_string(examples.join("proxy/tenants.yaml")).unwrap();
    let section = format!("  upstream: {}\n  mode: label\n", receiver.url());
    support::captured_logs();
    let proxy = RunningProxy::start(ProxyOptions::metrics(tenants, section)).await;
    let example = std::fs::read_to_string(examples.join("prometheus/remote-write.yml")).unwrap();
    // Only the addresses change: the test runs on free ports.
    let _agent = PrometheusProcess::start_agent(|own| {
        example
            .replace("127.0.0.1:8080", &proxy.addr.to_string())
            .replace("127.0.0.1:9090", &own.to_string())
    })
    .await;
    let direct = format!("{}/api/v1/query", receiver.url());
    eventually(
        "the example agent's series arrive",
        Duration::from_secs(60),
        async || !query(&direct, None, r#"up{job="self"}"#).await.is_empty(),
    )
    .await;
    for series in query(&direct, None, r#"{job="self"}"#).await {
        assert_eq!(series["metric"]["namespace"], "team-a", "{series}");
    }
}

/// Go's TLS client, as Prometheus and every Go shipper push to an
/// `https://` gateway: an agent with remote write's default HTTP/1.1 and
/// one with `enable_http2` (Go then offers `h2` by ALPN too, which the
/// proxy prefers) both reach the receiver through the proxy's own TLS
/// listener, each tenant's series scoped to it. The version spoken is not
/// observed here, what is stored is; against nginx logging
/// `$server_protocol`, the same two agents pushed as `HTTP/1.1` and
/// `HTTP/2.0` (docs/testing.md).
// Several threads: stopping an agent blocks one while the proxy serves its flush.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_push_over_tls_with_and_without_enable_http2() {
    let dir = tempfile::tempdir().unwrap();
    let ca = support::certs::Ca::new();
    let tls = ca.issue("localhost").write_to(dir.path());
    let ca_file = dir.path().join("ca.crt");
    support::replace_file(&ca_file, &ca.pem());
    let receiver = PrometheusProcess::start("groups: []\n").await;
    support::captured_logs();
    let mut options = ProxyOptions::metrics(
        tenants(),
        format!("  upstream: {}\n  mode: label\n", receiver.url()),
    );
    options.extra = Box::leak(tls.into_boxed_str());
    let proxy = RunningProxy::start(options).await;

    let url = format!("https://{}/api/v1/write", proxy.addr);
    let tls_config = |http2: bool| {
        format!(
            "    tls_config: {{ca_file: {}, server_name: localhost}}\n    enable_http2: {http2}\n",
            ca_file.display()
        )
    };
    let _h1 = agent_pushing_to(
        "agent-h1",
        "alice",
        "alice-pw",
        &url,
        "",
        &tls_config(false),
    )
    .await;
    let _h2 = agent_pushing_to("agent-h2", "bob", "bob-pw", &url, "", &tls_config(true)).await;

    let direct = format!("{}/api/v1/query", receiver.url());
    eventually(
        "both agents' series arrive over TLS",
        Duration::from_secs(60),
        async || {
            !query(&direct, None, r#"up{job="agent-h1"}"#)
                .await
                .is_empty()
                && !query(&direct, None, r#"up{job="agent-h2"}"#)
                    .await
                    .is_empty()
        },
    )
    .await;
    for (job, namespace) in [("agent-h1", "team-a"), ("agent-h2", "team-b")] {
        let series = query(&direct, None, &format!(r#"{{job="{job}"}}"#)).await;
        assert!(!series.is_empty());
        for s in &series {
            assert_eq!(s["metric"]["namespace"], namespace, "{s}");
        }
    }
}

/// Label names a pushed series could carry: the tenant label, spellings
/// near it, and others.
const PUSHED_NAMES: &[&str] = &["namespace", "namespace", "Namespace", "job", "a", "zz"];
const PUSHED_VALUES: &[&str] = &["team-a", "team-b", "", "team-a,team-b", "x"];

/// One series' labels as generated: unsorted, possibly repeating a name.
fn pushed_labels() -> impl Strategy<Value = Vec<(&'static str, &'static str)>> {
    prop::collection::vec(
        (
            prop::sample::select(PUSHED_NAMES),
            prop::sample::select(PUSHED_VALUES),
        ),
        0..5,
    )
}

/// The real Prometheus 2.42 behind label mode, as a property: whatever
/// labels team-a's series carry (the tenant label owned, foreign, empty,
/// repeated, unsorted among others), every series Prometheus then holds
/// under the pushed metric name carries `namespace="team-a"`; a push the
/// proxy accepts stores something, and one it refuses (400: another label
/// named twice, which Prometheus 2.42 would answer with 500, retried
/// forever) stores nothing.
#[test]
fn every_series_a_real_prometheus_stores_from_a_generated_push_is_the_tenants() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (prometheus, proxy) = runtime.block_on(async {
        let prometheus = PrometheusProcess::start("").await;
        let proxy = label_mode_proxy(&prometheus.url(), "").await;
        (prometheus, proxy)
    });
    let mut runner = support::property_runner(64);
    let (case, accepted) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
    let strategy = prop::collection::vec(pushed_labels(), 1..4);
    let result = runner.run(&strategy, |series| {
        case.set(case.get() + 1);
        let metric = format!("generated_{}", case.get());
        let now = now_ms();
        let request = WriteRequest {
            timeseries: series
                .iter()
                .enumerate()
                .map(|(i, labels)| {
                    let mut ts = time_series(&[("__name__", &metric)], i as f64, now);
                    ts.labels.extend(labels.iter().map(|(name, value)| Label {
                        name: (*name).into(),
                        value: (*value).into(),
                    }));
                    ts
                })
                .collect(),
            metadata: vec![],
        };
        let body = snappy(&request);
        let reply = runtime.block_on(push(&proxy, V1_HEADERS, body));
        let selector = format!("{{__name__=\"{metric}\"}}");
        let stored = runtime.block_on(send(
            Method::GET,
            &format!(
                "{}/api/v1/series?match[]={}",
                prometheus.url(),
                form_urlencoded::byte_serialize(selector.as_bytes()).collect::<String>()
            ),
            None,
            &[],
            Vec::new(),
        ));
        let stored = stored.json()["data"].as_array().unwrap().clone();
        for s in &stored {
            prop_assert_eq!(&s["namespace"], "team-a", "stored: {}", s);
        }
        match reply.status {
            StatusCode::NO_CONTENT => {
                accepted.set(accepted.get() + 1);
                prop_assert!(!stored.is_empty(), "accepted, nothing stored");
            }
            // Refused by the proxy (a label named twice): never forwarded.
            status => {
                prop_assert_eq!(status, StatusCode::BAD_REQUEST, "{}", reply.text());
                prop_assert!(stored.is_empty(), "refused, yet stored: {:?}", stored);
            }
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    assert!(accepted.get() >= 16, "only {} accepted", accepted.get());
}

/// A push of hundreds of KiB sent (ten times Prometheus' usual batch):
/// 4,000 series (see [`push_of`]).
/// A forwarded 1.0 message holds `series` series, each labelled team-a's.
fn assert_all_team_as(forwarded: &[u8], series: usize) {
    let stored = WriteRequest::decode(forwarded).unwrap();
    assert_eq!(stored.timeseries.len(), series);
    assert!(stored.timeseries.iter().all(|series| series
        .labels
        .iter()
        .any(|l| l.name == "namespace" && l.value == "team-a")));
}

fn large_push() -> (Vec<Vec<(String, String)>>, Vec<u8>) {
    let (values, body) = push_of(4_000);
    assert!(body.len() >= 256 * 1024, "{} bytes", body.len());
    (values, body)
}

/// A push of `series` series, half claiming team-b, their values of
/// little repetition so that snappy does not shrink the body much (about
/// 160 bytes a series sent). Returns each series' labels, sorted, and the
/// body.
fn push_of(series: usize) -> (Vec<Vec<(String, String)>>, Vec<u8>) {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut noise = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        format!("{state:016x}")
    };
    let values: Vec<Vec<(String, String)>> = (0..series)
        .map(|i| {
            let claimed = if i % 2 == 0 { "team-b" } else { "team-a" };
            let mut labels = vec![
                ("__name__".to_owned(), format!("large_push_{}", i % 7)),
                ("namespace".to_owned(), claimed.to_owned()),
            ];
            labels.extend((0..8).map(|l| (format!("label_{l}"), noise())));
            labels.sort();
            labels
        })
        .collect();
    let request = WriteRequest {
        timeseries: values
            .iter()
            .map(|labels| {
                let labels: Vec<(&str, &str)> = labels
                    .iter()
                    .map(|(n, v)| (n.as_str(), v.as_str()))
                    .collect();
                time_series(&labels, 1.0, now_ms())
            })
            .collect(),
        metadata: vec![],
    };
    (values, snappy(&request))
}

/// A push of hundreds of KiB sent (ten times Prometheus' usual batch)
/// arrives whole: every series, each with the tenant's namespace, the
/// foreign claims overwritten. The large bodies held are bounded to a
/// byte, far below this one: a body alone is taken all the same, and no
/// longer counted once checked.
#[tokio::test]
async fn a_large_push_is_checked_and_forwarded_whole() {
    let receiver = LokiStandIn::start().await;
    support::captured_logs();
    let section = format!("  upstream: {}\n  mode: label\n", receiver.url());
    let proxy = RunningProxy::start(ProxyOptions {
        limits: "  max_large_body_bytes_held: 1\n",
        ..ProxyOptions::metrics(tenants(), section)
    })
    .await;
    let (values, body) = large_push();

    let forwarded = accepted_and_forwarded(&proxy, &receiver, body).await;
    let stored = WriteRequest::decode(forwarded.as_slice()).unwrap();
    assert_eq!(stored.timeseries.len(), 4_000);
    for (series, sent) in stored.timeseries.iter().zip(&values) {
        let labels: Vec<(&str, &str)> = series
            .labels
            .iter()
            .map(|l| (l.name.as_str(), l.value.as_str()))
            .collect();
        let expected: Vec<(&str, &str)> = sent
            .iter()
            .map(|(n, v)| match n.as_str() {
                "namespace" => (n.as_str(), "team-a"),
                _ => (n.as_str(), v.as_str()),
            })
            .collect();
        assert_eq!(labels, expected);
    }
    let metrics = proxy.metrics().await;
    assert!(
        metrics.contains("tenant_proxy_large_body_bytes 0\n")
            && metrics.contains("tenant_proxy_large_bodies 0\n")
            && metrics.contains("tenant_proxy_body_worker_jobs_total 1\n"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("limit=\"large_body_bytes_held\""),
        "{metrics}"
    );
}

/// `remote_write_forward_compression: literal`: a relabelled push leaves in
/// snappy's block format without compression (as large as the message it
/// holds), declared snappy, decoding to the message compression would have
/// sent; a push that needs no change still leaves as it came.
#[tokio::test]
async fn a_relabelled_push_forwarded_as_literals_is_uncompressed_snappy() {
    let receiver = LokiStandIn::start().await;
    let proxy = label_mode_proxy(
        &receiver.url(),
        "  remote_write_forward_compression: literal\n",
    )
    .await;
    let (_, body) = large_push();

    let forwarded = accepted_and_forwarded(&proxy, &receiver, body).await;
    let sent = receiver.last();
    assert_eq!(sent.headers["content-encoding"], "snappy");
    assert_eq!(
        sent.headers["content-length"],
        sent.body.len().to_string().as_str()
    );
    // Compression would have made it smaller than the message; literals
    // add a few bytes of tags.
    assert!(
        sent.body.len() > forwarded.len(),
        "{} bytes forwarded for a message of {}",
        sent.body.len(),
        forwarded.len()
    );
    assert_all_team_as(&forwarded, 4_000);

    let scoped = v1_body(&[(&[("__name__", "up"), ("namespace", "team-a")], 1.0)]);
    accepted_and_forwarded(&proxy, &receiver, scoped.clone()).await;
    assert_eq!(receiver.last().body, scoped, "forwarded as it came");
}

/// The real Prometheus 2.42 (Go's snappy decoder) stores a relabelled
/// push forwarded as literals, every series under the tenant's namespace:
/// 4,000 series, a message of several 64 KiB literals.
#[tokio::test]
async fn a_real_prometheus_stores_a_push_forwarded_as_literals() {
    let receiver = PrometheusProcess::start("groups: []\n").await;
    let proxy = label_mode_proxy(
        &receiver.url(),
        "  remote_write_forward_compression: literal\n",
    )
    .await;
    let (_, body) = large_push();
    let reply = push(&proxy, V1_HEADERS, body).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.text());

    let direct = format!("{}/api/v1/query", receiver.url());
    let count = async |promql: &str| {
        let result = query(&direct, None, promql).await;
        result
            .first()
            .map(|sample| sample["value"][1].as_str().unwrap().to_owned())
    };
    assert_eq!(
        count(r#"count({__name__=~"large_push_.*", namespace="team-a"})"#).await,
        Some("4000".to_owned())
    );
    assert_eq!(
        count(r#"count({__name__=~"large_push_.*", namespace!="team-a"})"#).await,
        None,
        "no series under another namespace"
    );
}

/// A large push is counted among the large bodies held while it is still
/// arriving, not only once read: with one trickling in, holding all but
/// its last byte, the next large push is refused at once (503 with
/// `Retry-After`, which senders retry) and never forwarded, while a small
/// one passes. The first, once whole, is checked and forwarded.
#[tokio::test]
async fn a_large_push_still_arriving_counts_against_the_bound() {
    counted_while_arriving(large_push()).await;
}

/// The same for a push under the body workers' threshold but over 64 KiB,
/// checked in place: such pushes are counted as they arrive too, or each
/// connection could hold up to 256 KiB uncounted.
#[tokio::test]
async fn a_push_of_a_hundred_kib_still_arriving_counts_against_the_bound() {
    let (values, body) = push_of(700);
    assert!(
        (64 * 1024..256 * 1024).contains(&body.len()),
        "{} bytes",
        body.len()
    );
    counted_while_arriving((values, body)).await;
}

/// What a connection's bodies may hold uncounted (`large_bodies.rs`).
const UNCOUNTED: usize = 64 * 1024;

/// Waits until the proxy counts `bytes` of bodies held.
async fn large_body_bytes_come_to(proxy: &RunningProxy, bytes: usize) {
    let line = format!("tenant_proxy_large_body_bytes {bytes}\n");
    eventually(
        &format!("{bytes} bytes of bodies counted"),
        Duration::from_secs(10),
        async || proxy.metrics().await.contains(&line),
    )
    .await;
}

async fn counted_while_arriving((values, body): (Vec<Vec<(String, String)>>, Vec<u8>)) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let receiver = LokiStandIn::start().await;
    support::captured_logs();
    let section = format!("  upstream: {}\n  mode: label\n", receiver.url());
    // Room for one such push beyond its connection's share, not two.
    let bound = body.len() - UNCOUNTED + 1000;
    let limits = format!("  max_large_body_bytes_held: {bound}\n");
    let proxy = RunningProxy::start(ProxyOptions {
        limits: Box::leak(limits.into_boxed_str()),
        ..ProxyOptions::metrics(tenants(), section)
    })
    .await;
    let mut trickling = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let head = format!(
        "POST /api/v1/write HTTP/1.1\r\nhost: proxy\r\nauthorization: {}\r\n\
         content-type: application/x-protobuf\r\ncontent-encoding: snappy\r\n\
         x-prometheus-remote-write-version: 0.1.0\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n",
        basic("alice", "alice-pw"),
        body.len()
    );
    let (all_but_last, last) = body.split_at(body.len() - 1);
    trickling.write_all(head.as_bytes()).await.unwrap();
    trickling.write_all(all_but_last).await.unwrap();
    large_body_bytes_come_to(&proxy, all_but_last.len() - UNCOUNTED).await;

    let refused = push(&proxy, V1_HEADERS, body.clone()).await;
    assert_eq!(
        refused.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        refused.text()
    );
    assert_eq!(refused.headers["retry-after"], "1");
    let small = push(&proxy, V1_HEADERS, v1_body(&[(&[("__name__", "up")], 1.0)])).await;
    assert_eq!(small.status, StatusCode::NO_CONTENT, "{}", small.text());
    assert_eq!(
        receiver.received().len(),
        1,
        "only the small push forwarded"
    );

    trickling.write_all(last).await.unwrap();
    let mut answer = String::new();
    trickling.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 204"), "{answer}");
    let forwarded = snap::raw::Decoder::new()
        .decompress_vec(&receiver.last().body)
        .unwrap();
    let stored = WriteRequest::decode(forwarded.as_slice()).unwrap();
    assert_eq!(stored.timeseries.len(), values.len());
    let metrics = proxy.metrics().await;
    assert!(
        metrics.contains("tenant_proxy_large_body_bytes 0\n")
            && metrics.contains("surface=\"metrics_push\",limit=\"large_body_bytes_held\"} 1\n"),
        "{metrics}"
    );
}

/// HTTP/2's streams share what their connection may hold of bodies
/// uncounted (64 KiB), or each of 200 streams could hold that much: four
/// pushes of 40 KB held but for their last byte on one connection count,
/// together, all they hold beyond it, and nothing once they are reset.
#[tokio::test]
async fn the_streams_of_one_http2_connection_share_what_it_holds_uncounted() {
    const STREAMS: usize = 4;
    const BODY: usize = 40_000;
    let receiver = LokiStandIn::start().await;
    let proxy = label_mode_proxy(&receiver.url(), "").await;
    let tcp = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    let connection = tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let mut streams = Vec::new();
    for _ in 0..STREAMS {
        let request = http::Request::post(proxy.url("/api/v1/write"))
            .header("authorization", basic("alice", "alice-pw"))
            .header("content-type", "application/x-protobuf")
            .header("content-encoding", "snappy")
            .header("content-length", BODY)
            .body(())
            .unwrap();
        let (answer, mut stream) = client.send_request(request, false).unwrap();
        stream
            .send_data(bytes::Bytes::from(vec![7; BODY - 1]), false)
            .unwrap();
        streams.push((answer, stream));
        client = client.ready().await.unwrap();
    }
    // The bodies beyond the connection's share.
    large_body_bytes_come_to(&proxy, STREAMS * (BODY - 1) - UNCOUNTED).await;

    for (_, stream) in &mut streams {
        stream.send_reset(h2::Reason::CANCEL);
    }
    // Nothing once they are reset.
    large_body_bytes_come_to(&proxy, 0).await;
    assert!(receiver.received().is_empty(), "nothing forwarded");
    drop((streams, client));
    connection.abort();
}

/// A batch under the body workers' threshold as sent whose snappy header
/// declares megabytes (series alike, which snappy shrinks twentyfold) is
/// checked on a body worker too, and arrives whole.
#[tokio::test]
async fn a_small_push_that_decompresses_far_is_checked_on_a_body_worker() {
    let receiver = LokiStandIn::start().await;
    let proxy = label_mode_proxy(&receiver.url(), "").await;
    let labels = [
        ("__name__", "alike"),
        ("namespace", "team-b"),
        ("pod", "web-1"),
    ];
    let request = WriteRequest {
        timeseries: vec![time_series(&labels, 1.0, now_ms()); 60_000],
        metadata: vec![],
    };
    let body = snappy(&request);
    let declared = request.encoded_len();
    assert!(declared > 2 << 20, "{declared} bytes declared");
    assert!(body.len() < 256 << 10, "{} bytes sent", body.len());

    let forwarded = accepted_and_forwarded(&proxy, &receiver, body).await;
    assert_all_team_as(&forwarded, 60_000);
    let metrics = proxy.metrics().await;
    assert!(
        metrics.contains("tenant_proxy_body_worker_jobs_total 1\n"),
        "{metrics}"
    );
}
