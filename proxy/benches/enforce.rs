//! Cost of the per-request pure work on the query path: PromQL enforcement of
//! typical dashboard queries, `match[]` enforcement, the memo's three ways
//! (a repeat, a new value in a known shape, a new shape), path
//! normalisation and route classification. Run: `cargo bench -p tenant-proxy --bench enforce`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use http::Method;
use std::hint::black_box;
use tenant_proxy::config::MetricsScoping;
use tenant_proxy::enforce::promql::{enforce_query, enforce_selector, Memo, TenantMatcher};
use tenant_proxy::http::path;
use tenant_proxy::routes::RouteTable;

/// Queries as Grafana dashboards (node exporter, kube-state-metrics, RED
/// panels) send them.
const DASHBOARD_QUERIES: &[(&str, &str)] = &[
    (
        "rate",
        r#"sum by (code) (rate(http_requests_total{job="api"}[5m]))"#,
    ),
    (
        "latency_p99",
        r#"histogram_quantile(0.99, sum by (le) (rate(http_request_duration_seconds_bucket{job="api",route=~"/v1/.*"}[5m])))"#,
    ),
    (
        "cpu_ratio",
        r#"sum(rate(container_cpu_usage_seconds_total{container!="",pod=~"web-.*"}[5m])) / sum(kube_pod_container_resource_requests{resource="cpu",pod=~"web-.*"})"#,
    ),
    (
        "join",
        r#"sum by (pod) (rate(container_network_receive_bytes_total[5m])) * on (pod) group_left (node) kube_pod_info{node=~"node-1|node-2"}"#,
    ),
    (
        "subquery",
        r#"max_over_time(rate(http_requests_total{job="api"}[1m])[1h:1m])"#,
    ),
    ("grafana_test", "1+1"),
];

fn tenants() -> [(&'static str, TenantMatcher); 2] {
    [
        (
            "one_namespace",
            TenantMatcher::new("namespace", &["team-a".into()]).unwrap(),
        ),
        (
            "three_namespaces",
            TenantMatcher::new(
                "namespace",
                &[
                    "team-a".into(),
                    "team-a-staging".into(),
                    "team-a-jobs".into(),
                ],
            )
            .unwrap(),
        ),
    ]
}

fn promql(c: &mut Criterion) {
    let mut group = c.benchmark_group("enforce_query");
    for (tenant_name, tenant) in tenants() {
        for (name, query) in DASHBOARD_QUERIES {
            group.bench_with_input(BenchmarkId::new(tenant_name, name), query, |b, query| {
                b.iter(|| enforce_query(black_box(query), &tenant).unwrap())
            });
        }
    }
    group.finish();

    let tenant = TenantMatcher::new("namespace", &["team-a".into()]).unwrap();
    c.bench_function("enforce_selector", |b| {
        b.iter(|| enforce_selector(black_box(r#"{__name__="up",job="api"}"#), &tenant).unwrap())
    });
    c.bench_function("tenant_matcher_three_namespaces", |b| {
        let values = vec![
            "team-a".to_string(),
            "team-a-staging".into(),
            "team-a-jobs".into(),
        ];
        b.iter(|| TenantMatcher::new("namespace", black_box(&values)).unwrap())
    });
}

/// The memo's three ways for one dashboard query (`promql-first-seen`'s
/// third): a repeat (memoised), a new value in a known shape (the template
/// filled, then verified), and a new shape (enforced the full way).
fn memo(c: &mut Criterion) {
    let tenant = TenantMatcher::new("namespace", &["team-a".into()]).unwrap();
    let query = |n: u64| {
        format!(
            r#"sum(rate(container_cpu_usage_seconds_total{{container!="",pod=~"web-{n}-.*"}}[5m])) / sum(kube_pod_container_resource_requests{{resource="cpu",pod=~"web-{n}-.*"}})"#
        )
    };
    let new_shape = |n: u64| {
        format!(
            r#"sum(rate(container_cpu_usage_{n}_seconds_total{{container!="",pod=~"web-1-.*"}}[5m])) / sum(kube_pod_container_resource_requests_{n}{{resource="cpu",pod=~"web-1-.*"}})"#
        )
    };
    let mut group = c.benchmark_group("memo");
    let memo = Memo::new(10_000);
    let repeated = query(0);
    group.bench_function("memoised", |b| {
        b.iter(|| memo.enforce_query(black_box(&repeated), &tenant).unwrap())
    });
    // Each iteration a value not seen before; the texts are made outside the
    // measured loop.
    for (name, make) in [
        ("first_seen", &query as &dyn Fn(u64) -> String),
        ("new_shape", &new_shape),
    ] {
        let memo = Memo::new(10_000);
        let mut n = 0;
        group.bench_function(name, |b| {
            b.iter_batched(
                || {
                    n += 1;
                    make(n)
                },
                |text| memo.enforce_query(black_box(&text), &tenant).unwrap(),
                criterion::BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

fn routing(c: &mut Criterion) {
    let table = RouteTable::new(true, Some(MetricsScoping::Label), false);
    c.bench_function("normalise_and_classify", |b| {
        b.iter(|| {
            let path = path::normalise(black_box("/loki/api/v1/query_range")).unwrap();
            table.classify(&Method::GET, &path).unwrap().surface()
        })
    });
}

criterion_group!(benches, promql, memo, routing);
criterion_main!(benches);
