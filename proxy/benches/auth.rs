//! Authentication of a credential already verified once: the hot path of
//! every request (keyed digest, cache lookup, fingerprint check).
//! Run: `cargo bench -p tenant-proxy --bench auth`. Includes driving the
//! async function on a current-thread runtime (well under a microsecond).

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};

use base64::Engine;
use criterion::{criterion_group, criterion_main, Criterion};
use http::{header, HeaderMap, HeaderValue};
use tenant_proxy::auth::password;
use tenant_proxy::auth::Authenticator;
use tenant_proxy::config::AuthConfig;
use tenant_proxy::tenants::file as tenants_file;

fn bench(c: &mut Criterion) {
    let hash = password::hash_password("correct horse").unwrap();
    let text =
        format!("tenants:\n- id: a\n  users: [{{username: grafana, password_hash: \"{hash}\"}}]\n");
    let (store, _) = tenants_file::parse(&text, 1).unwrap();
    let auth = Authenticator::new(&AuthConfig::default(), Default::default());
    let mut headers = HeaderMap::new();
    let token = base64::engine::general_purpose::STANDARD.encode("grafana:correct horse");
    headers.insert(
        header::AUTHORIZATION,
        HeaderValue::from_str(&format!("Basic {token}")).unwrap(),
    );
    let client = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // The first call verifies with argon2 and fills the cache.
    runtime
        .block_on(auth.authenticate(&store, &headers, client))
        .unwrap();
    c.bench_function("authenticate_cached", |b| {
        b.iter(|| {
            runtime
                .block_on(auth.authenticate(black_box(&store), &headers, client))
                .unwrap()
        })
    });
}

/// The work of one reload: parse and validate a tenants file of 10,000
/// credentials (the swap itself is one pointer store).
fn reload(c: &mut Criterion) {
    let hash = password::hash_password("x").unwrap();
    let mut text = String::from("version: 1\ntenants:\n");
    for i in 0..10_000 {
        text.push_str(&format!(
            "  - id: tenant-{i}\n    users:\n      - {{username: user-{i}, password_hash: \"{hash}\"}}\n"
        ));
    }
    let mut group = c.benchmark_group("reload");
    group.sample_size(10);
    group.bench_function("parse_10000_credentials", |b| {
        b.iter(|| tenants_file::parse(black_box(&text), 2).unwrap())
    });
    // The same file as tenant-sync writes it: JSON.
    let tenants: Vec<_> = (0..10_000)
        .map(|i| {
            serde_json::json!({"id": format!("tenant-{i}"),
                "users": [{"username": format!("user-{i}"), "password_hash": hash}]})
        })
        .collect();
    let json = serde_json::json!({"version": 1, "tenants": tenants}).to_string();
    group.bench_function("parse_10000_credentials_json", |b| {
        b.iter(|| tenants_file::parse(black_box(&json), 2).unwrap())
    });
    group.finish();
}

criterion_group!(benches, bench, reload);
criterion_main!(benches);
