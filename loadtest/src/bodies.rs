//! Request bodies shaped like what real clients send.

use bytes::Bytes;
use prost::Message;
use tenant_proxy::enforce::prompb::{v2, Label, Sample, TimeSeries, WriteRequest};

use crate::scenario::BodyKind;

/// A request ready to send many times.
#[derive(Clone, Debug)]
pub struct Prepared {
    pub method: http::Method,
    pub path: String,
    pub headers: Vec<(&'static str, &'static str)>,
    pub body: Bytes,
}

impl Prepared {
    /// Whether the path or body holds the load's query variable.
    pub fn is_templated(&self) -> bool {
        let variable = crate::load::QUERY_VARIABLE;
        self.path.contains(variable)
            || self
                .body
                .windows(variable.len())
                .any(|w| w == variable.as_bytes())
    }

    /// A copy with `variable` replaced by `value` in the path and the body.
    pub fn with_variable(&self, variable: &str, value: &str) -> Self {
        let body = String::from_utf8_lossy(&self.body).replace(variable, value);
        Self {
            path: self.path.replace(variable, value),
            body: Bytes::from(body),
            ..self.clone()
        }
    }
}

pub fn prepare(method: &str, path: &str, kind: &BodyKind) -> anyhow::Result<Prepared> {
    let (headers, body): (Vec<(&'static str, &'static str)>, Bytes) = match kind {
        BodyKind::None => (vec![], Bytes::new()),
        BodyKind::LokiJson => (vec![("content-type", "application/json")], loki_json()),
        BodyKind::LokiProtobuf => (
            vec![("content-type", "application/x-protobuf")],
            loki_protobuf(),
        ),
        BodyKind::RemoteWrite {
            series,
            labels,
            namespace,
        } => (
            vec![
                ("content-type", "application/x-protobuf"),
                ("content-encoding", "snappy"),
                ("x-prometheus-remote-write-version", "0.1.0"),
            ],
            remote_write(
                *series,
                *labels,
                namespace.as_deref().unwrap_or("someone-else"),
            ),
        ),
        BodyKind::RemoteWriteV2 {
            series,
            labels,
            namespace,
        } => (
            vec![
                (
                    "content-type",
                    "application/x-protobuf;proto=io.prometheus.write.v2.Request",
                ),
                ("content-encoding", "snappy"),
                ("x-prometheus-remote-write-version", "2.0.0"),
            ],
            remote_write_v2(
                *series,
                *labels,
                namespace.as_deref().unwrap_or("someone-else"),
            ),
        ),
        BodyKind::OtlpMetrics {
            series,
            labels,
            namespace,
        } => (
            vec![
                ("content-type", "application/x-protobuf"),
                ("content-encoding", "gzip"),
            ],
            otlp_metrics(
                *series,
                *labels,
                namespace.as_deref().unwrap_or("someone-else"),
            ),
        ),
        BodyKind::Form(text) => (
            vec![("content-type", "application/x-www-form-urlencoded")],
            Bytes::from(text.clone()),
        ),
    };
    Ok(Prepared {
        method: method.parse()?,
        path: path.to_owned(),
        headers,
        body,
    })
}

const NOW_NS: i64 = 1_700_000_000_000_000_000;

fn line(i: usize) -> String {
    format!("level=info ts=2026-11-29T10:00:{:02}Z caller=server.go:{i} msg=\"request served\" method=GET path=/api/items/{i} status=200 duration_ms={}", i % 60, i % 97)
}

fn loki_json() -> Bytes {
    let values: Vec<serde_json::Value> = (0..100)
        .map(|i| serde_json::json!([(NOW_NS + i as i64).to_string(), line(i)]))
        .collect();
    let body = serde_json::json!({"streams": [{"stream": {"app": "api", "level": "info", "pod": "api-7d9f"}, "values": values}]});
    Bytes::from(body.to_string())
}

#[derive(Clone, PartialEq, prost::Message)]
struct PushRequest {
    #[prost(message, repeated, tag = "1")]
    streams: Vec<StreamAdapter>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct StreamAdapter {
    #[prost(string, tag = "1")]
    labels: String,
    #[prost(message, repeated, tag = "2")]
    entries: Vec<EntryAdapter>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct EntryAdapter {
    #[prost(message, optional, tag = "1")]
    timestamp: Option<Timestamp>,
    #[prost(string, tag = "2")]
    line: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Timestamp {
    #[prost(int64, tag = "1")]
    seconds: i64,
    #[prost(int32, tag = "2")]
    nanos: i32,
}

/// Loki's `logproto.PushRequest`, snappy block format, as Promtail sends it.
fn loki_protobuf() -> Bytes {
    let entries = (0..100)
        .map(|i| EntryAdapter {
            timestamp: Some(Timestamp {
                seconds: 1_700_000_000,
                nanos: i,
            }),
            line: line(i as usize),
        })
        .collect();
    let request = PushRequest {
        streams: vec![StreamAdapter {
            labels: r#"{app="api", level="info", pod="api-7d9f"}"#.into(),
            entries,
        }],
    };
    snappy(&request.encode_to_vec())
}

/// A remote-write 1.0 batch with realistic label sets.
pub fn remote_write(series: usize, labels: usize, namespace: &str) -> Bytes {
    snappy(&remote_write_series(series, labels, namespace).encode_to_vec())
}

/// The series of [`remote_write`] as a 2.0 `Request`, as Prometheus 3's
/// sender builds one: every distinct string once in `symbols`, `""` first,
/// each series' labels as pairs of references.
pub fn remote_write_v2(series: usize, labels: usize, namespace: &str) -> Bytes {
    let request = v2::Request::from_v1(&remote_write_series(series, labels, namespace));
    snappy(&request.encode_to_vec())
}

fn snappy(raw: &[u8]) -> Bytes {
    Bytes::from(snap::raw::Encoder::new().compress_vec(raw).expect("snappy"))
}

fn remote_write_series(series: usize, labels: usize, namespace: &str) -> WriteRequest {
    let timeseries = (0..series)
        .map(|i| {
            let mut set = vec![
                Label {
                    name: "__name__".into(),
                    value: format!("http_server_requests_seconds_bucket_{}", i % 40),
                },
                Label {
                    name: "namespace".into(),
                    value: namespace.into(),
                },
            ];
            for l in 0..labels.saturating_sub(2) {
                set.push(Label {
                    name: format!("label_{l:02}"),
                    value: format!("value-{l}-{}", i % 97),
                });
            }
            set.sort_by(|a, b| a.name.cmp(&b.name));
            TimeSeries {
                labels: set,
                samples: vec![Sample {
                    value: i as f64,
                    timestamp: 1_700_000_000_000,
                }],
                exemplars: vec![],
                histograms: vec![],
            }
        })
        .collect();
    WriteRequest {
        timeseries,
        metadata: vec![],
    }
}

/// The series of [`remote_write`] as OTLP: 40 gauges (the metric names),
/// their data points carrying the other labels as attributes, one resource;
/// gzip-compressed as OTLP exporters send by default.
pub fn otlp_metrics(series: usize, labels: usize, namespace: &str) -> Bytes {
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
    use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
    use opentelemetry_proto::tonic::metrics::v1::{
        metric::Data, number_data_point, Gauge, Metric, NumberDataPoint, ResourceMetrics,
        ScopeMetrics,
    };
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use std::io::Write;

    let kv = |key: String, value: String| KeyValue {
        key,
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value)),
        }),
        ..Default::default()
    };
    let mut metrics: Vec<Metric> = (0..40.min(series))
        .map(|m| Metric {
            name: format!("http_server_requests_seconds_bucket_{m}"),
            data: Some(Data::Gauge(Gauge {
                data_points: Vec::new(),
            })),
            ..Default::default()
        })
        .collect();
    for i in 0..series {
        let mut attributes = vec![kv("namespace".into(), namespace.into())];
        for l in 0..labels.saturating_sub(2) {
            attributes.push(kv(format!("label_{l:02}"), format!("value-{l}-{}", i % 97)));
        }
        let point = NumberDataPoint {
            attributes,
            time_unix_nano: 1_700_000_000_000_000_000,
            value: Some(number_data_point::Value::AsDouble(i as f64)),
            ..Default::default()
        };
        if let Some(Data::Gauge(gauge)) = &mut metrics[i % 40].data {
            gauge.data_points.push(point);
        }
    }
    let raw = ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(Resource {
                attributes: vec![kv("service.name".into(), "checkout".into())],
                ..Default::default()
            }),
            scope_metrics: vec![ScopeMetrics {
                metrics,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&raw).expect("gzip");
    Bytes::from(gz.finish().expect("gzip"))
}
