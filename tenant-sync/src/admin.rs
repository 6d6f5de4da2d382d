//! `/metrics`, `/healthz`, `/readyz` (ready once the file matches a complete
//! initial list of the cluster).

use std::convert::Infallible;
use std::sync::Arc;

use http::{header, HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;
use tenant_proxy::body::{self, ProxyBody};
use tenant_proxy::config::Limits;
use tenant_proxy::server::{serve_connections, Shutdown};
use tokio::net::TcpListener;

use crate::controller::Status;
use crate::metrics::Metrics;

pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    status: Arc<Status>,
    shutdown: Shutdown,
) {
    let limits = Limits::default();
    serve_connections(
        listener,
        &limits,
        move |_, request| handle(metrics.clone(), status.clone(), request),
        shutdown,
    )
    .await;
}

async fn handle(
    metrics: Arc<Metrics>,
    status: Arc<Status>,
    request: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let (code, content_type, text) = match request.uri().path() {
        "/metrics" => (
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.encode(),
        ),
        "/healthz" => (StatusCode::OK, "text/plain", "ok\n".to_owned()),
        "/readyz" if status.is_ready() => (StatusCode::OK, "text/plain", "ready\n".to_owned()),
        "/readyz" => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "initial sync not complete\n".to_owned(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found\n".to_owned(),
        ),
    };
    let mut response = Response::new(body::full(text));
    *response.status_mut() = code;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    Ok(response)
}
