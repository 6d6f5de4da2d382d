//! The admin listener: `/metrics`, `/healthz`, `/readyz`. Kept off the tenant
//! listener so tenants can never reach it.

use std::convert::Infallible;
use std::sync::Arc;

use http::{header, HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;

use crate::body::{self, ProxyBody};
use crate::metrics::Metrics;
use crate::reload::Tenants;

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

pub async fn handle(
    metrics: Arc<Metrics>,
    tenants: Arc<Tenants>,
    request: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let (status, content_type, text) = match request.uri().path() {
        "/metrics" => (StatusCode::OK, OPENMETRICS, metrics.encode()),
        "/healthz" => (StatusCode::OK, "text/plain", "ok\n".to_owned()),
        // Ready once a tenants file is loaded: before that every tenant
        // request would get 503.
        "/readyz" if tenants.is_loaded() => (StatusCode::OK, "text/plain", "ready\n".to_owned()),
        "/readyz" => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "tenants file not loaded\n".to_owned(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found\n".to_owned(),
        ),
    };
    let mut response = Response::new(body::full(text));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    Ok(response)
}
