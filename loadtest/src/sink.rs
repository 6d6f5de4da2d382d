//! A minimal backend that answers like Loki and Prometheus (and an OTLP
//! traces receiver) with fixed small bodies, so the proxy's own cost can be isolated. It counts the
//! connections it accepts (how well the proxy reuses upstream connections).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tenant_proxy::enforce::protowire::{fields, WireError};
use tokio::net::TcpListener;

#[derive(Clone, Default)]
pub struct SinkStats {
    pub connections: Arc<AtomicU64>,
    pub requests: Arc<AtomicU64>,
}

impl SinkStats {
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }
}

/// Binds 127.0.0.1:0 and serves until the process ends.
pub async fn start() -> std::io::Result<(SocketAddr, SinkStats)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let stats = SinkStats::default();
    let shared = stats.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            shared.connections.fetch_add(1, Ordering::Relaxed);
            let requests = shared.requests.clone();
            let service = service_fn(move |request| answer(requests.clone(), request));
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            tokio::spawn(async move {
                let _ = builder
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok((addr, stats))
}

const LOKI_STREAMS: &str = r#"{"status":"success","data":{"resultType":"streams","result":[]}}"#;
const PROM_MATRIX: &str = r#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#;
const LIST: &str = r#"{"status":"success","data":[]}"#;

async fn answer(
    requests: Arc<AtomicU64>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    requests.fetch_add(1, Ordering::Relaxed);
    let path = request.uri().path().to_owned();
    let remote_write_v2 = request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|t| {
            t.as_bytes()
                .ends_with(b"proto=io.prometheus.write.v2.Request")
        });
    // Read the whole body, as a real backend would.
    let body = request.into_body().collect().await.map(|b| b.to_bytes());
    if remote_write_v2 {
        return Ok(remote_write_v2_written(body.ok()));
    }
    if path == "/v1/traces" || path.ends_with("/otlp/v1/metrics") || path.ends_with("/otlp/v1/logs")
    {
        // An OTLP/HTTP receiver's success: an empty Export…ServiceResponse.
        let mut response = Response::new(Full::new(Bytes::new()));
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            "application/x-protobuf".parse().unwrap(),
        );
        return Ok(response);
    }
    let (status, body) = if path.ends_with("/push") || path.ends_with("/write") {
        (StatusCode::NO_CONTENT, "")
    } else if path.starts_with("/loki/") {
        (StatusCode::OK, LOKI_STREAMS)
    } else if path.ends_with("/query") || path.ends_with("/query_range") {
        (StatusCode::OK, PROM_MATRIX)
    } else {
        (StatusCode::OK, LIST)
    };
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    if !body.is_empty() {
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            "application/json".parse().unwrap(),
        );
    }
    Ok(response)
}

/// What a 2.0 receiver answers: 204 and how many samples, histograms and
/// exemplars it wrote (the proxy refuses a 2xx without them, as
/// Prometheus' sender does); 400 for a body it cannot read. The counts
/// are taken by walking the wire, not decoding every symbol: the sink
/// shares the host's cores with the proxy it measures.
fn remote_write_v2_written(body: Option<Bytes>) -> Response<Full<Bytes>> {
    let counts = body
        .and_then(|b| snap::raw::Decoder::new().decompress_vec(&b).ok())
        .and_then(|raw| remote_write_v2_counts(&raw).ok());
    let mut response = Response::new(Full::new(Bytes::new()));
    let Some([samples, histograms, exemplars]) = counts else {
        *response.status_mut() = StatusCode::BAD_REQUEST;
        return response;
    };
    *response.status_mut() = StatusCode::NO_CONTENT;
    let headers = response.headers_mut();
    headers.insert("x-prometheus-remote-write-samples-written", samples.into());
    headers.insert(
        "x-prometheus-remote-write-histograms-written",
        histograms.into(),
    );
    headers.insert(
        "x-prometheus-remote-write-exemplars-written",
        exemplars.into(),
    );
    response
}

/// Samples, histograms and exemplars in a 2.0 `Request` (its series are
/// field 5; in each, those are fields 2, 3 and 4).
fn remote_write_v2_counts(request: &[u8]) -> Result<[u64; 3], WireError> {
    let mut counts = [0; 3];
    for field in fields(request) {
        let field = field?;
        if field.tag != 5 {
            continue;
        }
        for inner in fields(field.payload) {
            let tag = inner?.tag;
            if (2..=4).contains(&tag) {
                counts[tag as usize - 2] += 1;
            }
        }
    }
    Ok(counts)
}
