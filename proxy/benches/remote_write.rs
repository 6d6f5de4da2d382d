//! Cost of rewriting remote-write bodies, per request and per sample.
//! Run: `cargo bench -p tenant-proxy --bench remote_write`.
//!
//! Batches as Prometheus sends them (`max_samples_per_send` 2,000), series
//! with 20 labels each. The reference is a plain prost decode + encode of the
//! same body (what a rewrite through generated structs would cost at least).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use prost::Message;
use std::hint::black_box;
use tenant_proxy::config::ForeignLabelPolicy;
use tenant_proxy::enforce::prompb::{v2, Label, Sample, TimeSeries, WriteRequest};
use tenant_proxy::enforce::remote_write::{rewrite, rewrite_body, Output, Version};
use tenant_proxy::enforce::tenant_label::TenantLabel;

/// `series` series of 20 labels (one of them `namespace`), one sample each.
fn batch(series: usize, namespace: &str) -> WriteRequest {
    let timeseries = (0..series)
        .map(|i| {
            let mut labels = vec![
                Label {
                    name: "__name__".into(),
                    value: format!("http_server_requests_seconds_bucket_{}", i % 50),
                },
                Label {
                    name: "namespace".into(),
                    value: namespace.into(),
                },
            ];
            for l in 0..18 {
                labels.push(Label {
                    name: format!("label_{l:02}"),
                    value: format!("value-{}-{}", l, i % 97),
                });
            }
            labels.sort_by(|a, b| a.name.cmp(&b.name));
            TimeSeries {
                labels,
                samples: vec![Sample {
                    value: i as f64,
                    timestamp: 1_700_000_000_000 + i as i64,
                }],
                exemplars: vec![],
                histograms: vec![],
            }
        })
        .collect();
    WriteRequest {
        timeseries,
        metadata: vec![],
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

    let mut group = c.benchmark_group("remote_write");
    for series in [500, 2_000] {
        let raw = batch(series, "someone-else").encode_to_vec();
        let compressed = snap::raw::Encoder::new().compress_vec(&raw).unwrap();
        group.throughput(Throughput::Elements(series as u64));
        // The sender's scrape config set the tenant's own namespace already.
        let labelled = snap::raw::Encoder::new()
            .compress_vec(&batch(series, "team-a").encode_to_vec())
            .unwrap();
        for (name, body, output) in [
            ("rewrite_body_snappy", &compressed, Output::Compressed),
            // Written back as literals (`remote_write_forward_compression: literal`).
            ("rewrite_body_literal", &compressed, Output::Literal),
            (
                "rewrite_body_snappy_already_labelled",
                &labelled,
                Output::Compressed,
            ),
        ] {
            group.bench_with_input(BenchmarkId::new(name, series), body, |b, body| {
                b.iter(|| {
                    rewrite_body(Version::V1, black_box(body), &tenant, 1 << 30, output).unwrap()
                })
            });
        }
        group.bench_with_input(
            BenchmarkId::new("rewrite_decompressed", series),
            &raw,
            |b, raw| b.iter(|| rewrite(Version::V1, black_box(raw), &tenant).unwrap()),
        );
        // 2.0: the same series, every distinct string once in the symbols
        // table, labels as pairs of references.
        for (name, namespace) in [
            ("rewrite_decompressed_v2", "someone-else"),
            ("rewrite_decompressed_v2_already_labelled", "team-a"),
        ] {
            let raw = v2::Request::from_v1(&batch(series, namespace)).encode_to_vec();
            group.bench_with_input(BenchmarkId::new(name, series), &raw, |b, raw| {
                b.iter(|| rewrite(Version::V2, black_box(raw), &tenant).unwrap())
            });
        }
        group.bench_with_input(
            BenchmarkId::new("reference_prost_decode_encode", series),
            &raw,
            |b, raw| {
                b.iter(|| {
                    WriteRequest::decode(black_box(raw.as_slice()))
                        .unwrap()
                        .encode_to_vec()
                })
            },
        );
        group.bench_with_input(
            BenchmarkId::new("reference_snappy_round_trip", series),
            &compressed,
            |b, body| {
                b.iter(|| {
                    let raw = snap::raw::Decoder::new()
                        .decompress_vec(black_box(body))
                        .unwrap();
                    snap::raw::Encoder::new().compress_vec(&raw).unwrap()
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
