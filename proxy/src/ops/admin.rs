//! The admin listener: `/metrics`, `/healthz`, `/readyz`. Kept off the tenant
//! listener so tenants can never reach it. Shared by both binaries: each
//! says what its metrics are and when it is ready.

use std::convert::Infallible;
use std::sync::Arc;

use http::{header, HeaderValue, Request, Response, StatusCode};
use tokio::net::TcpListener;

use crate::config::Limits;
use crate::http::body::{self, ProxyBody};
use crate::http::server::{serve_connections, Shutdown};
use crate::ops::metrics::Metrics;
use crate::tenants::reload::Tenants;

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What an admin listener reports.
pub trait AdminState: Send + Sync + 'static {
    /// The OpenMetrics text for `/metrics`.
    fn metrics(&self) -> String;
    /// `Err(why)` while not ready.
    fn readiness(&self) -> Result<(), &'static str>;
}

/// The proxy's: ready once a tenants file is loaded, since before that every
/// tenant request would get 503.
pub struct ProxyAdmin {
    pub metrics: Arc<Metrics>,
    pub tenants: Arc<Tenants>,
}

impl AdminState for ProxyAdmin {
    fn metrics(&self) -> String {
        self.metrics.encode()
    }

    fn readiness(&self) -> Result<(), &'static str> {
        if self.tenants.is_loaded() {
            Ok(())
        } else {
            Err("tenants file not loaded")
        }
    }
}

pub async fn serve(
    listener: TcpListener,
    state: Arc<dyn AdminState>,
    limits: &Limits,
    shutdown: Shutdown,
) {
    // The admin listener's clients are the platform's own (probes, the
    // scraper): no cap per address, which could fail a probe in a burst.
    let limits = Limits {
        max_connections_per_address: 0,
        ..limits.clone()
    };
    serve_connections(
        listener,
        &limits,
        None,
        move |_, request| handle(state.clone(), request),
        shutdown,
        None,
    )
    .await;
}

/// Answers by the path alone: no admin request carries a body to read.
async fn handle<B>(
    state: Arc<dyn AdminState>,
    request: Request<B>,
) -> Result<Response<ProxyBody>, Infallible> {
    let (status, content_type, text) = match request.uri().path() {
        "/metrics" => (StatusCode::OK, OPENMETRICS, state.metrics()),
        "/healthz" => (StatusCode::OK, "text/plain", "ok\n".to_owned()),
        "/readyz" => match state.readiness() {
            Ok(()) => (StatusCode::OK, "text/plain", "ready\n".to_owned()),
            Err(why) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                format!("{why}\n"),
            ),
        },
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

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    /// A state whose readiness the test sets.
    struct Fixed {
        ready: bool,
    }

    impl AdminState for Fixed {
        fn metrics(&self) -> String {
            "up 1\n# EOF\n".to_owned()
        }

        fn readiness(&self) -> Result<(), &'static str> {
            if self.ready {
                Ok(())
            } else {
                Err("not yet")
            }
        }
    }

    /// Status, content type and text of the answer to `GET path`.
    async fn answer(ready: bool, path: &str) -> (StatusCode, String, String) {
        let request = Request::get(path).body(()).unwrap();
        let response = handle(Arc::new(Fixed { ready }), request).await.unwrap();
        let content_type = response.headers()[header::CONTENT_TYPE].to_str().unwrap();
        let content_type = content_type.to_owned();
        let status = response.status();
        let text = response.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            content_type,
            String::from_utf8(text.to_vec()).unwrap(),
        )
    }

    fn text(status: StatusCode, text: &str) -> (StatusCode, String, String) {
        (status, "text/plain".to_owned(), text.to_owned())
    }

    #[tokio::test]
    async fn each_admin_path_has_its_answer() {
        // The liveness probe of both containers (deploy/): alive even
        // while not ready.
        assert_eq!(
            answer(false, "/healthz").await,
            text(StatusCode::OK, "ok\n")
        );
        assert_eq!(
            answer(true, "/readyz").await,
            text(StatusCode::OK, "ready\n")
        );
        assert_eq!(
            answer(false, "/readyz").await,
            text(StatusCode::SERVICE_UNAVAILABLE, "not yet\n")
        );
        assert_eq!(
            answer(true, "/metrics").await,
            (
                StatusCode::OK,
                OPENMETRICS.to_owned(),
                "up 1\n# EOF\n".to_owned()
            )
        );
        assert_eq!(
            answer(true, "/metrics/").await,
            text(StatusCode::NOT_FOUND, "not found\n")
        );
    }
}
