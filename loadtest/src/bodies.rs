//! Request bodies shaped like what real clients send.

use bytes::Bytes;
use prost::Message;
use tenant_proxy::enforce::prompb::{Label, Sample, TimeSeries, WriteRequest};

use crate::scenario::BodyKind;

/// A request ready to send many times.
#[derive(Clone, Debug)]
pub struct Prepared {
    pub method: http::Method,
    pub path: String,
    pub headers: Vec<(&'static str, &'static str)>,
    pub body: Bytes,
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
    let raw = request.encode_to_vec();
    Bytes::from(
        snap::raw::Encoder::new()
            .compress_vec(&raw)
            .expect("snappy"),
    )
}

/// A remote-write 1.0 batch with realistic label sets.
pub fn remote_write(series: usize, labels: usize, namespace: &str) -> Bytes {
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
    let raw = WriteRequest {
        timeseries,
        metadata: vec![],
    }
    .encode_to_vec();
    Bytes::from(
        snap::raw::Encoder::new()
            .compress_vec(&raw)
            .expect("snappy"),
    )
}
