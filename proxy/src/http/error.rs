//! The proxy's error type and the one place that maps it to an HTTP response.
//!
//! Variants are named by cause. Who caused it decides the status: the client
//! (4xx), the upstream (502/504), not-yet-ready state (503), or us (500).

use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Response, StatusCode};

use crate::http::body::{self, ProxyBody, ReadError};
use crate::tenants::Scope;

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// Missing, malformed, unknown user or wrong password: one answer for all,
    /// so a caller cannot tell which.
    #[error("authentication required")]
    Unauthenticated,
    #[error("too many failed authentication attempts; retry later")]
    AuthThrottled { retry_after: Duration },
    #[error("the credential lacks the {0} scope")]
    MissingScope(Scope),
    /// A credential restricted by a selector, on a backend that could not
    /// enforce it (metrics in header mode): refused, never widened.
    #[error("this credential is restricted by a selector, which this endpoint cannot enforce")]
    SelectorNotEnforceable,
    /// A change to something that is not the tenant's (a silence).
    #[error("{0}")]
    Foreign(String),
    #[error("no such endpoint")]
    RouteNotFound,
    /// A known path with another method; `allow` lists the path's methods
    /// (the `Allow` header a 405 must carry, RFC 9110 section 15.5.6).
    #[error("method not allowed on this endpoint")]
    MethodNotAllowed { allow: Vec<Method> },
    #[error("invalid request path: {0}")]
    BadPath(&'static str),
    /// A request the proxy cannot parse or enforce; never forwarded.
    #[error("{0}")]
    BadData(String),
    #[error("request body larger than {limit} bytes")]
    BodyTooLarge { limit: u64 },
    #[error("the request body did not arrive in time")]
    BodyTimeout,
    /// The tenant is over one of its limits (429).
    #[error("tenant over its {} limit; retry later", .0.limit())]
    TenantLimited(crate::admission::Refusal),
    /// The proxy as a whole is at its limit of requests in flight (503).
    #[error("too many requests in flight; retry later")]
    Overloaded,
    /// The large bodies held (arriving, waiting for a body worker or
    /// worked on by one) are at their bound in bytes (503).
    #[error("too many large bodies held to be checked; retry later")]
    LargeBodiesHeld,
    /// The 2.0 spec's answer to a remote write a receiver does not read; a
    /// sender may fall back from 2.0 to 1.0 on it.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// A remote write 2.0 the upstream answered 2xx without confirming what
    /// it stored (a 1.0-only receiver read it as empty): 415, as the 2.0
    /// spec has the sender take it, never a success.
    #[error("the upstream did not confirm a remote-write 2.0 request; it may only speak 1.0")]
    RemoteWriteUnconfirmed,
    #[error("tenants are not loaded yet; retry later")]
    TenantsNotLoaded,
    #[error("too many authentications in progress; retry later")]
    VerifierBusy,
    #[error("upstream unavailable")]
    UpstreamUnavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The same on a push path: 503, so every push client retries the data.
    #[error("upstream unavailable; retry later")]
    PushUpstreamUnavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("upstream timed out")]
    UpstreamTimeout,
    #[error("internal error: {0}")]
    Internal(String),
    /// `Internal` on a push path ([`Self::on_push_path`]; e.g. a compressor
    /// that failed on a body it had checked): 503, so every push client
    /// keeps the data and retries (OTLP senders drop it on 500).
    #[error("internal error; retry later: {0}")]
    PushInternal(String),
}

/// How long a client should wait before retrying a 503 we produced ourselves.
const NOT_READY_RETRY_AFTER: Duration = Duration::from_secs(5);

impl From<ReadError> for ProxyError {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::TooLarge { limit } => Self::BodyTooLarge { limit },
            ReadError::Timeout => Self::BodyTimeout,
            ReadError::LargeBodiesHeld => Self::LargeBodiesHeld,
            broken @ ReadError::Broken(_) => Self::BadData(broken.to_string()),
        }
    }
}

impl ProxyError {
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Unauthenticated => StatusCode::UNAUTHORIZED,
            Self::AuthThrottled { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::MissingScope(_) | Self::SelectorNotEnforceable | Self::Foreign(_) => {
                StatusCode::FORBIDDEN
            }
            Self::RouteNotFound => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            Self::BadPath(_) | Self::BadData(_) => StatusCode::BAD_REQUEST,
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Self::TenantLimited(_) => StatusCode::TOO_MANY_REQUESTS,
            Self::Overloaded | Self::LargeBodiesHeld => StatusCode::SERVICE_UNAVAILABLE,
            Self::UnsupportedMediaType(_) | Self::RemoteWriteUnconfirmed => {
                StatusCode::UNSUPPORTED_MEDIA_TYPE
            }
            Self::TenantsNotLoaded
            | Self::VerifierBusy
            | Self::PushUpstreamUnavailable(_)
            | Self::PushInternal(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::UpstreamUnavailable(_) => StatusCode::BAD_GATEWAY,
            Self::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// A bounded label for metrics and logs: never carries user input.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Unauthenticated => "unauthenticated",
            Self::AuthThrottled { .. } => "auth_throttled",
            Self::MissingScope(_) => "missing_scope",
            Self::SelectorNotEnforceable => "selector_not_enforceable",
            Self::Foreign(_) => "foreign",
            Self::RouteNotFound => "route_not_found",
            Self::MethodNotAllowed { .. } => "method_not_allowed",
            Self::BadPath(_) => "bad_path",
            Self::BadData(_) => "bad_data",
            Self::BodyTooLarge { .. } => "body_too_large",
            Self::BodyTimeout => "body_timeout",
            Self::TenantLimited(_) => "tenant_limited",
            Self::Overloaded => "overloaded",
            Self::LargeBodiesHeld => "large_bodies_held",
            Self::UnsupportedMediaType(_) => "unsupported_media_type",
            Self::RemoteWriteUnconfirmed => "remote_write_unconfirmed",
            Self::TenantsNotLoaded => "tenants_not_loaded",
            Self::VerifierBusy => "verifier_busy",
            Self::UpstreamUnavailable(_) | Self::PushUpstreamUnavailable(_) => {
                "upstream_unavailable"
            }
            Self::UpstreamTimeout => "upstream_timeout",
            Self::Internal(_) | Self::PushInternal(_) => "internal",
        }
    }

    /// The proxy-wide limit this error is the refusal of, if any, as
    /// `tenant_proxy_limited_total` names it.
    pub fn global_limit(&self) -> Option<&'static str> {
        match self {
            Self::Overloaded => Some("global_concurrency"),
            Self::LargeBodiesHeld => Some("large_body_bytes_held"),
            _ => None,
        }
    }

    /// The `errorType` of the Prometheus/Loki JSON error shape.
    fn error_type(&self) -> &'static str {
        match self.status() {
            StatusCode::BAD_REQUEST
            | StatusCode::METHOD_NOT_ALLOWED
            | StatusCode::REQUEST_TIMEOUT
            | StatusCode::PAYLOAD_TOO_LARGE
            | StatusCode::UNSUPPORTED_MEDIA_TYPE => "bad_data",
            StatusCode::UNAUTHORIZED => "unauthorized",
            StatusCode::FORBIDDEN => "forbidden",
            StatusCode::NOT_FOUND => "not_found",
            StatusCode::TOO_MANY_REQUESTS => "unavailable",
            StatusCode::SERVICE_UNAVAILABLE if matches!(self, Self::PushUpstreamUnavailable(_)) => {
                "upstream"
            }
            StatusCode::SERVICE_UNAVAILABLE if matches!(self, Self::PushInternal(_)) => "internal",
            StatusCode::SERVICE_UNAVAILABLE => "unavailable",
            StatusCode::BAD_GATEWAY | StatusCode::GATEWAY_TIMEOUT => "upstream",
            _ => "internal",
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::AuthThrottled { retry_after } => Some(*retry_after),
            Self::TenantLimited(refusal) => Some(refusal.retry_after()),
            Self::Overloaded | Self::LargeBodiesHeld => Some(Duration::from_secs(1)),
            Self::TenantsNotLoaded
            | Self::VerifierBusy
            | Self::PushUpstreamUnavailable(_)
            | Self::PushInternal(_) => Some(NOT_READY_RETRY_AFTER),
            _ => None,
        }
    }

    /// Push clients must retry when the upstream is unreachable or we
    /// failed: 503 there, which every push client retries (OTLP senders
    /// drop the data on 500).
    pub fn on_push_path(self) -> Self {
        match self {
            Self::UpstreamUnavailable(cause) => Self::PushUpstreamUnavailable(cause),
            Self::Internal(why) => Self::PushInternal(why),
            other => other,
        }
    }

    /// The gRPC code OTLP's `Status` carries for this error.
    fn grpc_code(&self) -> i32 {
        match self.status() {
            StatusCode::BAD_REQUEST
            | StatusCode::PAYLOAD_TOO_LARGE
            | StatusCode::UNSUPPORTED_MEDIA_TYPE => 3, // INVALID_ARGUMENT
            StatusCode::REQUEST_TIMEOUT | StatusCode::GATEWAY_TIMEOUT => 4, // DEADLINE_EXCEEDED
            StatusCode::NOT_FOUND => 5,                                     // NOT_FOUND
            StatusCode::FORBIDDEN => 7,                                     // PERMISSION_DENIED
            StatusCode::TOO_MANY_REQUESTS => 8,                             // RESOURCE_EXHAUSTED
            StatusCode::METHOD_NOT_ALLOWED => 12,                           // UNIMPLEMENTED
            StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE => 14, // UNAVAILABLE
            StatusCode::UNAUTHORIZED => 16,                                 // UNAUTHENTICATED
            _ => 13,                                                        // INTERNAL
        }
    }

    /// The same error in OTLP/HTTP's shape: status and `Retry-After` as
    /// [`Self::into_response`], the body a `google.rpc.Status`, protobuf or
    /// JSON as the request was (OTLP senders retry 429/502/503/504 and drop
    /// the rest).
    pub fn into_otlp_response(self, json: bool) -> Response<ProxyBody> {
        let status = RpcStatus {
            code: self.grpc_code(),
            message: self.to_string(),
        };
        let (content_type, payload) = if json {
            let value = serde_json::json!({"code": status.code, "message": status.message});
            ("application/json", Bytes::from(value.to_string()))
        } else {
            (
                "application/x-protobuf",
                Bytes::from(prost::Message::encode_to_vec(&status)),
            )
        };
        let mut response = self.into_response();
        *response.body_mut() = body::full(payload);
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        response
    }

    /// The only place an error becomes a response. The body never contains
    /// anything from the request's credentials.
    pub fn into_response(self) -> Response<ProxyBody> {
        let payload = serde_json::json!({
            "status": "error",
            "errorType": self.error_type(),
            "error": self.to_string(),
        });
        let mut response = Response::new(body::full(Bytes::from(payload.to_string())));
        *response.status_mut() = self.status();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if matches!(self, Self::Unauthenticated) {
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"tenant-proxy\""),
            );
        }
        if let Self::MethodNotAllowed { allow } = &self {
            let names: Vec<&str> = allow.iter().map(Method::as_str).collect();
            if let Ok(value) = HeaderValue::from_str(&names.join(", ")) {
                headers.insert(header::ALLOW, value);
            }
        }
        if let Some(wait) = self.retry_after() {
            // Whole seconds, rounded up: retrying early is refused again.
            let secs = wait.as_secs_f64().ceil().max(1.0) as u64;
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// `google.rpc.Status`, the body of an OTLP/HTTP error (details left out).
#[derive(Clone, PartialEq, prost::Message)]
pub struct RpcStatus {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::Refusal;

    fn cause() -> Box<dyn std::error::Error + Send + Sync> {
        "refused".into()
    }

    /// What a client acts on, for every error: the status (retry on 429
    /// and 5xx, drop on 4xx), the Prometheus/Loki `errorType`, the
    /// `Retry-After` in seconds, and the gRPC code an OTLP sender reads.
    #[tokio::test]
    async fn every_error_answers_with_its_status_type_wait_and_grpc_code() {
        let wait = |secs: u64| Duration::from_millis(secs * 1000 - 500);
        let cases: Vec<(ProxyError, u16, &str, Option<&str>, i32)> = vec![
            (ProxyError::Unauthenticated, 401, "unauthorized", None, 16),
            (
                ProxyError::AuthThrottled {
                    retry_after: wait(7),
                },
                429,
                "unavailable",
                Some("7"),
                8,
            ),
            (
                ProxyError::MissingScope(Scope::LogsWrite),
                403,
                "forbidden",
                None,
                7,
            ),
            (
                ProxyError::SelectorNotEnforceable,
                403,
                "forbidden",
                None,
                7,
            ),
            (ProxyError::Foreign("x".into()), 403, "forbidden", None, 7),
            (ProxyError::RouteNotFound, 404, "not_found", None, 5),
            (
                ProxyError::MethodNotAllowed {
                    allow: vec![Method::GET],
                },
                405,
                "bad_data",
                None,
                12,
            ),
            (ProxyError::BadPath("x"), 400, "bad_data", None, 3),
            (ProxyError::BadData("x".into()), 400, "bad_data", None, 3),
            (
                ProxyError::BodyTooLarge { limit: 1 },
                413,
                "bad_data",
                None,
                3,
            ),
            (ProxyError::BodyTimeout, 408, "bad_data", None, 4),
            (
                ProxyError::TenantLimited(Refusal::Rate(wait(3))),
                429,
                "unavailable",
                Some("3"),
                8,
            ),
            (
                ProxyError::TenantLimited(Refusal::Concurrency),
                429,
                "unavailable",
                Some("1"),
                8,
            ),
            (ProxyError::Overloaded, 503, "unavailable", Some("1"), 14),
            (
                ProxyError::LargeBodiesHeld,
                503,
                "unavailable",
                Some("1"),
                14,
            ),
            (
                ProxyError::UnsupportedMediaType("x".into()),
                415,
                "bad_data",
                None,
                3,
            ),
            (ProxyError::RemoteWriteUnconfirmed, 415, "bad_data", None, 3),
            (
                ProxyError::TenantsNotLoaded,
                503,
                "unavailable",
                Some("5"),
                14,
            ),
            (ProxyError::VerifierBusy, 503, "unavailable", Some("5"), 14),
            (
                ProxyError::UpstreamUnavailable(cause()),
                502,
                "upstream",
                None,
                14,
            ),
            (
                ProxyError::UpstreamUnavailable(cause()).on_push_path(),
                503,
                "upstream",
                Some("5"),
                14,
            ),
            (ProxyError::UpstreamTimeout, 504, "upstream", None, 4),
            (ProxyError::Internal("x".into()), 500, "internal", None, 13),
            (
                ProxyError::Internal("x".into()).on_push_path(),
                503,
                "internal",
                Some("5"),
                14,
            ),
        ];
        for (error, status, error_type, retry_after, grpc) in cases {
            let name = format!("{error:?}");
            let (code, message) = (error.grpc_code(), error.to_string());
            let response = error.into_response();
            assert_eq!(response.status().as_u16(), status, "{name}");
            let wait = response.headers().get(header::RETRY_AFTER);
            assert_eq!(wait.map(|v| v.to_str().unwrap()), retry_after, "{name}");
            assert_eq!(code, grpc, "{name}");
            let body = http_body_util::BodyExt::collect(response.into_body())
                .await
                .unwrap()
                .to_bytes();
            let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(body["errorType"], error_type, "{name}");
            assert_eq!(body["error"], message, "{name}");
        }
    }
}
