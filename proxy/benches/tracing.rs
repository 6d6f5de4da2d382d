//! The per-request cost of spans when `tracing` is configured: a request's
//! server span with its upstream client span, recorded (ratio 1) and not
//! (ratio 0). Export goes to an address nobody listens on; the batch
//! thread drops what it cannot send, off the request path.
//! Run: `cargo bench -p tenant-proxy --bench tracing`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use http::{HeaderMap, Method, StatusCode};
use tenant_proxy::config::TracingConfig;
use tenant_proxy::ops::otel::Tracing;
use tenant_proxy::ops::process::subscriber;
use tenant_proxy::upstream::Reuse;

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let mut incoming = HeaderMap::new();
    incoming.insert(
        "traceparent",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
            .parse()
            .unwrap(),
    );
    for (name, ratio, headers) in [
        ("span_pair_recorded", 1.0, HeaderMap::new()),
        ("span_pair_unsampled", 0.0, HeaderMap::new()),
        ("span_pair_continued", 0.0, incoming),
    ] {
        let config = TracingConfig {
            otlp_endpoint: "http://127.0.0.1:9/v1/traces".into(),
            service_name: "bench".into(),
            sample_ratio: ratio,
            export_interval: Duration::from_secs(3600),
            export_timeout: Duration::from_millis(100),
            tls: None,
        };
        let metrics = Default::default();
        let tracing = runtime
            .block_on(async {
                Tracing::new(
                    &config,
                    Reuse::new(Duration::from_secs(50), Default::default()),
                    &metrics,
                )
            })
            .unwrap();
        c.bench_function(name, |b| {
            b.iter(|| {
                let span = tracing.start_request(&Method::GET, black_box(&headers));
                let mut upstream = HeaderMap::new();
                let call = span.upstream_call(&mut upstream);
                call.finish(Ok(StatusCode::OK));
                drop(span.record(
                    Some("/loki/api/v1/query_range"),
                    Some("logs_query"),
                    Some("team-a"),
                    StatusCode::OK,
                    None,
                ));
                upstream
            })
        });
    }
}

/// One access-log line as `proxy::handle` logs it, through the proxy's
/// log subscriber (text with and without colour codes, JSON, silenced),
/// written to a sink.
fn access_log(c: &mut Criterion) {
    let peer: std::net::SocketAddr = "10.1.2.3:40000".parse().unwrap();
    let emit = || {
        tracing::info!(
            target: "access",
            method = %Method::GET,
            path = "/loki/api/v1/query_range",
            surface = "logs_query",
            tenant = "team-a",
            user = "grafana-a",
            client = %tenant_proxy::http::address_text::AddressText(peer.ip()),
            status = 200u16,
            duration_ms = black_box(1.234f64),
        );
    };
    for (name, format, ansi, filter) in [
        ("access_log_text_coloured", "text", true, "info"),
        ("access_log_text", "text", false, "info"),
        ("access_log_json", "json", false, "info"),
        ("access_log_off", "text", false, "info,access=off"),
    ] {
        let filter = tracing_subscriber::EnvFilter::new(filter);
        let subscriber = subscriber(format, filter, ansi, std::io::sink).unwrap();
        tracing::subscriber::with_default(subscriber, || c.bench_function(name, |b| b.iter(emit)));
    }
}

criterion_group!(benches, bench, access_log);
criterion_main!(benches);
