//! examples/monitoring: the alert rules pass promtool's checks and unit
//! tests, and every metric the alerts and the dashboard query is one that
//! tenant-proxy or tenant-sync really exports.

#[path = "support/files.rs"]
mod files;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/monitoring")
}

fn promtool(args: &[&str]) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(dir())
        .output()
        .expect("promtool (Debian package `prometheus`; .ci/run installs it)");
    assert!(
        out.status.success(),
        "promtool {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Series names the two binaries expose, from their own registries
/// (`# TYPE` lines: counters add `_total`, histograms their three series).
/// A labelled family is encoded only once it has a child: each gets one.
fn exported() -> BTreeSet<String> {
    use tenant_proxy::ops::metrics as proxy;
    use tenant_sync::metrics as sync;
    let p = proxy::Metrics::default();
    let tenant = || proxy::TenantLabels { tenant: "t".into() };
    let tenant_action = || proxy::TenantActionLabels {
        tenant: "t".into(),
        action: "added",
    };
    let _ = p.requests.get_or_create(&proxy::RequestLabels {
        tenant: "t".into(),
        surface: "logs_query",
        status_class: "2xx",
    });
    let _ = p
        .auth_failures
        .get_or_create(&proxy::ReasonLabels { reason: "r" });
    let _ = p.errors.get_or_create(&proxy::ReasonLabels { reason: "r" });
    p.count_limited(Some("t"), Some("logs_query"), "rate");
    p.upstream_duration.observe("logs_query", 0.1);
    let _ = p.remote_write_series.get_or_create(&tenant());
    let _ = p.remote_write_samples.get_or_create(&tenant());
    let _ = p.remote_write_bytes.get_or_create(&tenant());
    let _ = p.remote_write_decode_errors.get_or_create(&tenant());
    let _ = p.remote_write_unconfirmed.get_or_create(&tenant());
    let _ = p.remote_write_tenant_label.get_or_create(&tenant_action());
    let _ = p.remote_write_dropped_fields.get_or_create(&tenant());
    let _ = p.otlp_data_points.get_or_create(&tenant());
    let _ = p.otlp_received_bytes.get_or_create(&tenant());
    let _ = p.otlp_decode_errors.get_or_create(&tenant());
    let _ = p.otlp_tenant_label.get_or_create(&tenant_action());
    let _ = p.otlp_dropped_fields.get_or_create(&tenant());
    let _ = p
        .trace_exports
        .get_or_create(&proxy::OutcomeLabels { outcome: "failed" });
    let s = sync::Metrics::default();
    let _ = s
        .skipped_secrets
        .get_or_create(&sync::ReasonLabels { reason: "r" });
    let _ = s
        .relists
        .get_or_create(&sync::ResourceLabels { resource: "r" });
    let _ = s
        .watch_errors
        .get_or_create(&sync::ResourceLabels { resource: "r" });
    let text = p.encode() + &s.encode();
    let mut names = BTreeSet::from(["up".to_string()]);
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = rest.split_once(' ').unwrap();
        match kind {
            "counter" => names.insert(format!("{name}_total")),
            "histogram" => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
                true
            }
            _ => names.insert(name.to_owned()),
        };
    }
    names
}

/// Metric names a PromQL expression selects.
fn selected(expr: &str) -> Vec<String> {
    let expr = expr.replace("$__rate_interval", "5m");
    let ast = promql_parser::parser::parse(&expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
    let mut names = Vec::new();
    collect(&ast, &mut names);
    assert!(!names.is_empty(), "{expr} selects no metric");
    names
}

fn collect(expr: &promql_parser::parser::Expr, out: &mut Vec<String>) {
    use promql_parser::parser::Expr;
    match expr {
        Expr::VectorSelector(v) => out.extend(v.name.clone()),
        Expr::MatrixSelector(m) => out.extend(m.vs.name.clone()),
        Expr::Aggregate(a) => {
            collect(&a.expr, out);
            if let Some(p) = &a.param {
                collect(p, out);
            }
        }
        Expr::Unary(u) => collect(&u.expr, out),
        Expr::Binary(b) => {
            collect(&b.lhs, out);
            collect(&b.rhs, out);
        }
        Expr::Paren(p) => collect(&p.expr, out),
        Expr::Subquery(s) => collect(&s.expr, out),
        Expr::Call(c) => c.args.args.iter().for_each(|a| collect(a, out)),
        _ => {}
    }
}

#[test]
fn alert_rules_pass_promtool_and_their_unit_tests() {
    promtool(&["check", "rules", "tenant-proxy-alerts.yml"]);
    promtool(&["test", "rules", "tenant-proxy-alerts.test.yml"]);
}

#[test]
fn alerts_and_dashboard_query_only_exported_metrics() {
    let exported = exported();
    let mut exprs = of_each_rule("expr");
    exprs.extend(dashboard_exprs());
    assert!(exprs.len() >= 15);
    for expr in &exprs {
        for name in selected(expr) {
            assert!(
                exported.contains(&name),
                "{name} (in {expr}) is not exported"
            );
        }
    }
}

/// `key` (`alert`, `expr`) of every rule of the example alert rules.
fn of_each_rule(key: &str) -> Vec<String> {
    let rules: serde_yaml_ng::Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(dir().join("tenant-proxy-alerts.yml")).unwrap(),
    )
    .unwrap();
    let mut values = Vec::new();
    for group in rules["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            values.push(rule[key].as_str().unwrap().to_owned());
        }
    }
    values
}

/// The PromQL of every panel of the example dashboard.
fn dashboard_exprs() -> Vec<String> {
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir().join("tenant-proxy-dashboard.json")).unwrap(),
    )
    .unwrap();
    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            exprs.push(target["expr"].as_str().unwrap().to_owned());
        }
    }
    exprs
}

/// docs/remote-write.md and docs/otlp.md say "the example dashboard plots
/// them" under their tables of metrics: each metric in those tables is one
/// a panel selects.
#[test]
fn the_dashboard_plots_every_push_metric_the_docs_list() {
    let plotted: BTreeSet<String> = dashboard_exprs().iter().flat_map(|e| selected(e)).collect();
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs");
    let mut listed = Vec::new();
    for doc in ["remote-write.md", "otlp.md"] {
        let text = std::fs::read_to_string(docs.join(doc)).unwrap();
        assert!(text.contains("The example dashboard plots them"), "{doc}");
        for row in text
            .lines()
            .filter_map(|l| l.strip_prefix("| `tenant_proxy_"))
        {
            let name = row.split(['`', '{']).next().unwrap();
            listed.push(format!("tenant_proxy_{name}"));
        }
    }
    assert!(listed.len() >= 12, "{listed:?}");
    for name in &listed {
        assert!(
            plotted.contains(name),
            "{name} is listed but no panel plots it"
        );
    }
}

/// docs/operations.md has a row for each alert, saying what it means and
/// where to look first, and none for an alert that no longer exists.
#[test]
fn every_alert_has_its_row_in_the_operations_guide() {
    let mut alerts = of_each_rule("alert");
    let guide = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operations.md"),
    )
    .unwrap();
    let rows: Vec<String> = guide
        .lines()
        .filter_map(|l| l.strip_prefix("| `Tenant"))
        .map(|rest| format!("Tenant{}", rest.split('`').next().unwrap()))
        .collect();
    alerts.sort();
    let mut listed = rows.clone();
    listed.sort();
    assert!(alerts.len() >= 15, "{alerts:?}");
    assert_eq!(listed, alerts);
}

#[test]
fn every_monitoring_file_is_checked() {
    assert_eq!(
        files::names(&dir()),
        [
            "tenant-proxy-alerts.test.yml",
            "tenant-proxy-alerts.yml",
            "tenant-proxy-dashboard.json"
        ]
    );
}
