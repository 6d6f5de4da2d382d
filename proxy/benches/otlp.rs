//! Cost of relabelling an OTLP metrics request in label mode, step by step:
//! gunzip, the wire-format rewrite, gzip, and the whole.
//! Run: `cargo bench -p tenant-proxy --bench otlp`.
//!
//! The batch is the remote_write bench's: 500 series of 20 labels, here as
//! gauge data points of 40 metrics with 19 attributes each, every point
//! carrying another tenant's `namespace` (so every one is relabelled).

use criterion::{criterion_group, criterion_main, Criterion};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{
    metric::Data, number_data_point, Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics,
};
use prost::Message;
use std::hint::black_box;
use std::io::{Read, Write};
use tenant_proxy::config::ForeignLabelPolicy;
use tenant_proxy::enforce::otlp::{rewrite, rewrite_body, Encoding};
use tenant_proxy::enforce::tenant_label::TenantLabel;

fn batch() -> ExportMetricsServiceRequest {
    let kv = |key: String, value: String| KeyValue {
        key,
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value)),
        }),
        ..Default::default()
    };
    let mut metrics: Vec<Metric> = (0..40)
        .map(|m| Metric {
            name: format!("http_server_requests_seconds_bucket_{m}"),
            data: Some(Data::Gauge(Gauge::default())),
            ..Default::default()
        })
        .collect();
    for i in 0..500 {
        let mut attributes = vec![kv("namespace".into(), "someone-else".into())];
        for l in 0..18 {
            attributes.push(kv(format!("label_{l:02}"), format!("value-{l}-{}", i % 97)));
        }
        if let Some(Data::Gauge(g)) = &mut metrics[i % 40].data {
            g.data_points.push(NumberDataPoint {
                attributes,
                value: Some(number_data_point::Value::AsDouble(i as f64)),
                ..Default::default()
            });
        }
    }
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            scope_metrics: vec![ScopeMetrics {
                metrics,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

fn bench(c: &mut Criterion) {
    let owned = vec!["team-a".to_string()];
    let tenant = TenantLabel {
        name: "namespace",
        owned: &owned,
        owned_by: "team-a",
        policy: ForeignLabelPolicy::Overwrite,
    };
    let request = batch();
    let raw = request.encode_to_vec();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&raw).unwrap();
    let gzipped = gz.finish().unwrap();

    let mut group = c.benchmark_group("otlp_500x20");
    group.bench_function("gunzip", |b| {
        b.iter(|| {
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(black_box(gzipped.as_slice()))
                .read_to_end(&mut out)
                .unwrap();
            out
        })
    });
    group.bench_function("rewrite_decompressed", |b| {
        b.iter(|| rewrite(black_box(&raw), &tenant).unwrap())
    });
    group.bench_function("gzip_fast", |b| {
        b.iter(|| {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gz.write_all(black_box(&raw)).unwrap();
            gz.finish().unwrap()
        })
    });
    // What gzip out could cost instead (issue #16): zlib-rs's other
    // settings. Level 0 is stored blocks (gzip in name only), for scale.
    for (name, level, window_bits) in [
        ("gzip_level0_stored", 0, 15),
        ("gzip_level1", 1, 15),
        ("gzip_level1_window4k", 1, 12),
        ("gzip_level2", 2, 15),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| gzip_with(black_box(&raw), level, window_bits))
        });
        let size = gzip_with(&raw, level, window_bits).len();
        println!("{name}: {size} bytes");
    }
    group.bench_function("rewrite_body_gzip", |b| {
        b.iter(|| {
            rewrite_body(
                Encoding::Gzip,
                Encoding::Gzip,
                black_box(&gzipped),
                &tenant,
                1 << 26,
            )
            .unwrap()
        })
    });
    group.bench_function("rewrite_body_identity", |b| {
        b.iter(|| {
            rewrite_body(
                Encoding::Identity,
                Encoding::Identity,
                black_box(&raw),
                &tenant,
                1 << 26,
            )
            .unwrap()
        })
    });
    let labelled = rewrite(&raw, &tenant).unwrap().0;
    group.bench_function("rewrite_body_identity_already_scoped", |b| {
        b.iter(|| {
            rewrite_body(
                Encoding::Identity,
                Encoding::Identity,
                black_box(&labelled),
                &tenant,
                1 << 26,
            )
            .unwrap()
        })
    });
    group.finish();
    println!("raw {} bytes, gzip {} bytes", raw.len(), gzipped.len());
}

/// One gzip member of `raw` at `level` with a window of 2^`window_bits`.
fn gzip_with(raw: &[u8], level: u32, window_bits: u8) -> Vec<u8> {
    let mut gzip = flate2::Compress::new_gzip(flate2::Compression::new(level), window_bits);
    let mut out = Vec::with_capacity(raw.len() + 1024);
    let status = gzip
        .compress_vec(raw, &mut out, flate2::FlushCompress::Finish)
        .unwrap();
    assert_eq!(status, flate2::Status::StreamEnd, "output buffer too small");
    out
}

criterion_group!(benches, bench);
criterion_main!(benches);
