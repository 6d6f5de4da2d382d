//! An in-process stand-in for an OpenTelemetry Collector's OTLP/HTTP traces
//! receiver (`POST /v1/traces`, protobuf, as the Collector's otlphttp
//! receiver accepts it): it decodes each export and keeps the spans and the
//! raw bodies, so tests assert on what actually left the proxy.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// One exported span, flattened for assertions; ids in lowercase hex.
#[derive(Clone, Debug)]
pub struct ExportedSpan {
    pub name: String,
    /// OTLP's SpanKind: 2 server, 3 client.
    pub kind: i32,
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: String,
    pub attributes: HashMap<String, String>,
    /// OTLP's status code: 0 unset, 2 error.
    pub status_code: i32,
    pub service_name: String,
    pub start_unix_nano: u64,
    pub end_unix_nano: u64,
}

#[derive(Default)]
struct Received {
    spans: Vec<ExportedSpan>,
    bodies: Vec<Bytes>,
}

pub struct Collector {
    pub addr: SocketAddr,
    received: Arc<Mutex<Received>>,
    span_count: tokio::sync::watch::Receiver<usize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Collector {
    pub async fn start() -> Self {
        Self::start_with(None).await
    }

    /// Over TLS (`https://` to `addr`).
    pub async fn start_tls(config: rustls::ServerConfig) -> Self {
        Self::start_with(Some(TlsAcceptor::from(Arc::new(config)))).await
    }

    async fn start_with(tls: Option<TlsAcceptor>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(Mutex::new(Received::default()));
        let (counted, span_count) = tokio::sync::watch::channel(0);
        let counted = Arc::new(counted);
        let shared = received.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (received, counted) = (shared.clone(), counted.clone());
                let service =
                    service_fn(move |request| receive(received.clone(), counted.clone(), request));
                let http = hyper::server::conn::http1::Builder::new();
                let tls = tls.clone();
                tokio::spawn(async move {
                    let _ = match tls {
                        None => http.serve_connection(TokioIo::new(stream), service).await,
                        Some(tls) => match tls.accept(stream).await {
                            Ok(stream) => {
                                http.serve_connection(TokioIo::new(stream), service).await
                            }
                            Err(_) => return, // an untrusted client: nothing received
                        },
                    };
                });
            }
        });
        Self {
            addr,
            received,
            span_count,
            task,
        }
    }

    pub fn traces_url(&self) -> String {
        format!("http://{}/v1/traces", self.addr)
    }

    /// The collector's URL over TLS, by `host` (which must resolve to loopback).
    pub fn https_traces_url(&self, host: &str) -> String {
        format!("https://{host}:{}/v1/traces", self.addr.port())
    }

    /// Waits (at most 10 s) until `count` spans have arrived, and returns all.
    pub async fn wait_for_spans(&self, count: usize) -> Vec<ExportedSpan> {
        let mut arrivals = self.span_count.clone();
        tokio::time::timeout(Duration::from_secs(10), arrivals.wait_for(|n| *n >= count))
            .await
            .unwrap_or_else(|_| panic!("{count} spans exported within 10 s"))
            .unwrap();
        self.received.lock().unwrap().spans.clone()
    }

    /// Every export body as received, for scanning for secrets.
    pub fn raw_bodies(&self) -> Vec<Bytes> {
        self.received.lock().unwrap().bodies.clone()
    }
}

async fn receive(
    received: Arc<Mutex<Received>>,
    counted: Arc<tokio::sync::watch::Sender<usize>>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let proper = request.uri().path() == "/v1/traces"
        && request.headers().get("content-type").map(|v| v.as_bytes())
            == Some(b"application/x-protobuf");
    let body = request.into_body().collect().await.unwrap().to_bytes();
    let Some(export) = ExportTraceServiceRequest::decode(body.clone())
        .ok()
        .filter(|_| proper)
    else {
        let mut refused = Response::new(Full::new(Bytes::from_static(b"bad export")));
        *refused.status_mut() = StatusCode::BAD_REQUEST;
        return Ok(refused);
    };
    let mut spans = Vec::new();
    for resource_spans in export.resource_spans {
        let service_name = resource_spans
            .resource
            .map(|r| attributes(&r.attributes))
            .and_then(|mut a| a.remove("service.name"))
            .unwrap_or_default();
        for span in resource_spans
            .scope_spans
            .into_iter()
            .flat_map(|scope| scope.spans)
        {
            spans.push(ExportedSpan {
                name: span.name,
                kind: span.kind,
                trace_id: hex(&span.trace_id),
                span_id: hex(&span.span_id),
                parent_span_id: hex(&span.parent_span_id),
                attributes: attributes(&span.attributes),
                status_code: span.status.map_or(0, |s| s.code),
                service_name: service_name.clone(),
                start_unix_nano: span.start_time_unix_nano,
                end_unix_nano: span.end_time_unix_nano,
            });
        }
    }
    let mut all = received.lock().unwrap();
    all.bodies.push(body);
    all.spans.extend(spans);
    counted.send_replace(all.spans.len());
    Ok(Response::new(Full::new(Bytes::new())))
}

fn attributes(
    pairs: &[opentelemetry_proto::tonic::common::v1::KeyValue],
) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(s)) => s.clone(),
                Some(Value::IntValue(i)) => i.to_string(),
                Some(Value::BoolValue(b)) => b.to_string(),
                Some(Value::DoubleValue(d)) => d.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), value)
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
