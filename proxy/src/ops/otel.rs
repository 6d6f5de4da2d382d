//! Optional OpenTelemetry spans, exported over OTLP/HTTP: one server span per
//! request (tenant, surface, status) and, inside it, one client span for the
//! upstream call, whose context the upstream receives as `traceparent`.
//!
//! Off unless `tracing` is configured; then the request path carries a `None`
//! and nothing here runs. Spans never hold a credential, a header value or a
//! query: only the normalised path, the route's surface and the tenant id.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_http::{HeaderExtractor, HeaderInjector, HttpClient, HttpError};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider,
};
use opentelemetry_sdk::Resource;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::config::TracingConfig;
use crate::http::body;
use crate::ops::metrics::{Metrics, OutcomeLabels};
use crate::upstream::{self, HttpClient as UpstreamClient, Reuse};

/// Makes and exports spans; present only when tracing is configured.
#[derive(Debug)]
pub struct Tracing {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    /// The exporter's client, swapped when `tracing.tls` files change.
    pub collector: Arc<ArcSwap<UpstreamClient>>,
}

impl Tracing {
    /// Must be called inside the tokio runtime: exports run on it.
    pub fn new(config: &TracingConfig, reuse: Reuse, metrics: &Metrics) -> Result<Self, String> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| "tracing must start inside the runtime".to_string())?;
        let client = CollectorClient {
            client: Arc::new(ArcSwap::from_pointee(upstream::client(
                config.tls.as_ref(),
                reuse,
                None,
            )?)),
            runtime,
            timeout: config.export_timeout,
            exports: metrics.trace_exports.clone(),
        };
        let collector = client.client.clone();
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(config.otlp_endpoint.clone())
            .with_timeout(config.export_timeout)
            .build()
            .map_err(|e| format!("tracing: {e}"))?;
        let batches = BatchConfigBuilder::default()
            .with_scheduled_delay(config.export_interval)
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(
                BatchSpanProcessor::builder(exporter)
                    .with_batch_config(batches)
                    .build(),
            )
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                config.sample_ratio,
            ))))
            .with_resource(
                Resource::builder()
                    .with_service_name(config.service_name.clone())
                    .build(),
            )
            .build();
        let tracer = provider.tracer("tenant-proxy");
        Ok(Self {
            provider,
            tracer,
            collector,
        })
    }

    /// Starts a request's span, continuing the client's trace when it sent a
    /// valid `traceparent`.
    pub fn start_request(&self, method: &Method, headers: &HeaderMap) -> RequestSpan {
        let parent = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
        let method = known_method(method);
        let span = self
            .tracer
            .span_builder(method)
            .with_kind(SpanKind::Server)
            .with_attributes([KeyValue::new("http.request.method", method)])
            .start_with_context(&self.tracer, &parent);
        RequestSpan {
            tracer: self.tracer.clone(),
            cx: parent.with_span(span),
            method,
        }
    }

    /// Sends the spans still queued. Blocks while the exporter thread sends
    /// them through the runtime, so it runs off the runtime's threads.
    pub fn shutdown(&self) -> impl Future<Output = ()> + Send + 'static {
        let provider = self.provider.clone();
        async move {
            let flushed = tokio::task::spawn_blocking(move || {
                provider.shutdown_with_timeout(Duration::from_secs(5))
            })
            .await;
            if let Ok(Err(e)) = flushed {
                tracing::warn!(error = %e, "spans not exported at shutdown");
            }
        }
    }
}

/// A request's server span, from its arrival to the end of its response body.
pub struct RequestSpan {
    tracer: SdkTracer,
    cx: Context,
    method: &'static str,
}

impl RequestSpan {
    /// Starts the client span for the upstream call and puts its context in
    /// the upstream request's `traceparent` (and `tracestate`), replacing the
    /// client's: the upstream's spans then hang below the proxy's.
    pub fn upstream_call(&self, upstream_headers: &mut HeaderMap) -> UpstreamSpan {
        let span = self
            .tracer
            .span_builder("upstream")
            .with_kind(SpanKind::Client)
            .start_with_context(&self.tracer, &self.cx);
        let cx = self.cx.with_span(span);
        // The client's tracestate belongs to its traceparent; what continues
        // it (if anything) is the state the proxy's span inherited.
        upstream_headers.remove("tracestate");
        TraceContextPropagator::new().inject_context(&cx, &mut HeaderInjector(upstream_headers));
        if upstream_headers
            .get("tracestate")
            .is_some_and(|state| state.is_empty())
        {
            upstream_headers.remove("tracestate");
        }
        UpstreamSpan { cx }
    }

    /// Records what the access log records, minus the user. The span ends
    /// when the returned guard is dropped: held by the response body, so a
    /// streamed response is in the span's duration.
    #[must_use = "the span ends when this is dropped"]
    pub fn record(
        self,
        path: Option<&str>,
        surface: Option<&'static str>,
        tenant: Option<&str>,
        status: StatusCode,
        error: Option<&'static str>,
    ) -> SpanEnd {
        let span = self.cx.span();
        if let Some(surface) = surface {
            span.update_name(format!("{} {surface}", self.method));
            span.set_attribute(KeyValue::new("tenant_proxy.surface", surface));
        }
        if let Some(path) = path {
            span.set_attribute(KeyValue::new("url.path", path.to_owned()));
        }
        if let Some(tenant) = tenant {
            span.set_attribute(KeyValue::new("tenant_proxy.tenant", tenant.to_owned()));
        }
        span.set_attribute(status_attribute(status));
        if let Some(error) = error {
            span.set_attribute(KeyValue::new("error.type", error));
            // A server span is in error for 5xx only: 4xx is the client's.
            if status.is_server_error() {
                span.set_status(Status::error(error));
            }
        }
        SpanEnd(self.cx)
    }
}

/// Ends a request's span when dropped.
pub struct SpanEnd(Context);

impl Drop for SpanEnd {
    fn drop(&mut self) {
        self.0.span().end();
    }
}

/// The upstream call's client span.
pub struct UpstreamSpan {
    cx: Context,
}

impl UpstreamSpan {
    /// Ends the span when the upstream's response head arrived (`Ok`) or the
    /// call failed (`Err` with the reason's metric label).
    pub fn finish(self, outcome: Result<StatusCode, &'static str>) {
        let span = self.cx.span();
        match outcome {
            Ok(status) => {
                span.set_attribute(status_attribute(status));
                if status.is_server_error() {
                    span.set_status(Status::error(status.as_str().to_owned()));
                }
            }
            Err(reason) => {
                span.set_attribute(KeyValue::new("error.type", reason));
                span.set_status(Status::error(reason));
            }
        }
        span.end();
    }
}

/// The method as span name and attribute: the nine the HTTP semantic
/// conventions know, any other `_OTHER`, so clients cannot mint span names.
fn known_method(method: &Method) -> &'static str {
    match *method {
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        _ => "_OTHER",
    }
}

fn status_attribute(status: StatusCode) -> KeyValue {
    KeyValue::new("http.response.status_code", i64::from(status.as_u16()))
}

/// Sends exports with the proxy's own hyper client. The SDK exports from its
/// own thread, outside the runtime, so each send is spawned onto the runtime
/// and awaited from there.
struct CollectorClient {
    client: Arc<ArcSwap<UpstreamClient>>,
    runtime: tokio::runtime::Handle,
    timeout: Duration,
    /// Exports by outcome: spans the SDK gives up on are otherwise invisible.
    exports: Family<OutcomeLabels, Counter>,
}

impl std::fmt::Debug for CollectorClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CollectorClient").finish_non_exhaustive()
    }
}

impl HttpClient for CollectorClient {
    fn send_bytes<'a, 'b>(
        &'a self,
        request: Request<Bytes>,
    ) -> Pin<Box<dyn Future<Output = Result<Response<Bytes>, HttpError>> + Send + 'b>>
    where
        'a: 'b,
        Self: 'b,
    {
        let client = self.client.load_full();
        let timeout = self.timeout;
        let exports = self.exports.clone();
        let sent = self.runtime.spawn(async move {
            let request = request.map(body::full);
            let exchange = async {
                let response = client.request(request).await?;
                let (parts, body) = response.into_parts();
                let body = body.collect().await?.to_bytes();
                Ok::<_, HttpError>(Response::from_parts(parts, body))
            };
            let answered = tokio::time::timeout(timeout, exchange)
                .await
                .map_err(|_| HttpError::from("collector did not answer in time"))
                .and_then(|answer| answer);
            let sent = matches!(&answered, Ok(response) if response.status().is_success());
            exports
                .get_or_create(&OutcomeLabels {
                    outcome: if sent { "sent" } else { "failed" },
                })
                .inc();
            answered
        });
        Box::pin(async move { sent.await? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Span names hold one of the methods the conventions name, never a
    /// client's own word.
    #[test]
    fn a_method_is_named_only_when_the_conventions_know_it() {
        let known = [
            "CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE",
        ];
        for name in known {
            assert_eq!(
                known_method(&Method::from_bytes(name.as_bytes()).unwrap()),
                name
            );
        }
        for other in ["PROPFIND", "PURGE", "get"] {
            let method = Method::from_bytes(other.as_bytes()).unwrap();
            assert_eq!(known_method(&method), "_OTHER", "{other}");
        }
    }
}
