//! How Prometheus 3.x's OTLP receiver (`/api/v1/otlp/v1/metrics`) turns an
//! `ExportMetricsServiceRequest` into series, after
//! `storage/remote/otlptranslator/prometheusremotewrite` (`createAttributes`,
//! `addResourceTargetInfo`, read at v3.2-v3.5), in its default
//! `UnderscoreEscapingWithSuffixes` mode, with `promote_all_resource_attributes`
//! and `promote_scope_metadata` on (the settings that put the most
//! attributes on series, so the widest reading):
//!
//! - data-point attributes, sorted by key, become labels with sanitised
//!   names (characters outside `[a-zA-Z0-9_]` → `_`, `key_` before a leading
//!   digit, `key` before a single leading `_`); two keys that sanitise to one
//!   name are joined with `;`;
//! - `job` from `service.namespace/service.name`, `instance` from
//!   `service.instance.id`; every other resource attribute is promoted onto
//!   the series unless the data point already has that label;
//! - `otel_scope_name`, `otel_scope_version` and `otel_scope_<attribute>`;
//! - `__name__`: the sanitised metric name, `_total` for a monotonic sum,
//!   `_bucket`/`_count`/`_sum` for a classic histogram (one `_bucket` series
//!   stands for all `le` values), the bare name for an exponential histogram
//!   (native), quantile series for a summary;
//! - per resource with `job` or `instance`, one `target_info` series with
//!   the resource's other attributes.
//!
//! Skipped: unit suffixes, exemplars, metadata, timestamps and values, the
//! UTF-8 modes (the proxy's unit tests cover their name reading), Mimir's
//! differences. It stores label sets only.

use std::collections::BTreeMap;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value::Value, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::metric::Data;

pub type Series = BTreeMap<String, String>;

fn sanitise(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert_str(0, "key_");
    } else if out.starts_with('_') && !out.starts_with("__") {
        out.insert_str(0, "key");
    }
    out
}

fn as_string(kv: &KeyValue) -> String {
    match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        _ => String::new(),
    }
}

/// Attributes as labels: sorted by key, sanitised, collisions joined.
fn labels_of(attributes: &[KeyValue], prefix: &str) -> Series {
    let mut sorted: Vec<&KeyValue> = attributes.iter().collect();
    sorted.sort_by(|a, b| a.key.cmp(&b.key));
    let mut out = Series::new();
    for kv in sorted {
        let name = sanitise(&format!("{prefix}{}", kv.key));
        let value = as_string(kv);
        out.entry(name)
            .and_modify(|existing| {
                if *existing != value {
                    *existing = format!("{existing};{value}");
                }
            })
            .or_insert(value);
    }
    out
}

const IDENTIFYING: [&str; 3] = ["service.name", "service.namespace", "service.instance.id"];

/// Every series the receiver would store for `request`.
pub fn series(request: &ExportMetricsServiceRequest) -> Vec<Series> {
    let mut out = Vec::new();
    for rm in &request.resource_metrics {
        let resource = rm.resource.clone().unwrap_or_default().attributes;
        let get = |key: &str| resource.iter().find(|kv| kv.key == key).map(as_string);
        let job = match (get("service.namespace"), get("service.name")) {
            (Some(ns), Some(name)) => Some(format!("{ns}/{name}")),
            (None, Some(name)) => Some(name),
            _ => None,
        };
        let instance = get("service.instance.id");
        let others: Vec<KeyValue> = resource
            .iter()
            .filter(|kv| !IDENTIFYING.contains(&kv.key.as_str()))
            .cloned()
            .collect();
        let promoted = labels_of(&others, "");
        let identity = |labels: &mut Series| {
            if let Some(job) = &job {
                labels.insert("job".into(), job.clone());
            }
            if let Some(instance) = &instance {
                labels.insert("instance".into(), instance.clone());
            }
        };
        if job.is_some() || instance.is_some() {
            let mut target_info = promoted.clone();
            identity(&mut target_info);
            target_info.insert("__name__".into(), "target_info".into());
            out.push(target_info);
        }
        for sm in &rm.scope_metrics {
            let scope = sm.scope.clone().unwrap_or_default();
            let mut scope_labels = labels_of(&scope.attributes, "otel_scope_");
            if !scope.name.is_empty() {
                scope_labels.insert("otel_scope_name".into(), scope.name.clone());
                scope_labels.insert("otel_scope_version".into(), scope.version.clone());
            }
            for metric in &sm.metrics {
                let name = sanitise(&metric.name);
                let (points, names): (Vec<&[KeyValue]>, Vec<String>) = match &metric.data {
                    Some(Data::Gauge(g)) => (
                        g.data_points
                            .iter()
                            .map(|p| p.attributes.as_slice())
                            .collect(),
                        vec![name.clone()],
                    ),
                    Some(Data::Sum(s)) => (
                        s.data_points
                            .iter()
                            .map(|p| p.attributes.as_slice())
                            .collect(),
                        vec![if s.is_monotonic {
                            format!("{name}_total")
                        } else {
                            name.clone()
                        }],
                    ),
                    Some(Data::Histogram(h)) => (
                        h.data_points
                            .iter()
                            .map(|p| p.attributes.as_slice())
                            .collect(),
                        ["_bucket", "_count", "_sum"]
                            .map(|s| format!("{name}{s}"))
                            .to_vec(),
                    ),
                    Some(Data::ExponentialHistogram(h)) => (
                        h.data_points
                            .iter()
                            .map(|p| p.attributes.as_slice())
                            .collect(),
                        vec![name.clone()],
                    ),
                    Some(Data::Summary(s)) => (
                        s.data_points
                            .iter()
                            .map(|p| p.attributes.as_slice())
                            .collect(),
                        vec![name.clone(), format!("{name}_count"), format!("{name}_sum")],
                    ),
                    None => (vec![], vec![]),
                };
                for attributes in points {
                    let mut labels = labels_of(attributes, "");
                    for (k, v) in &promoted {
                        labels.entry(k.clone()).or_insert_with(|| v.clone());
                    }
                    labels.extend(scope_labels.clone());
                    identity(&mut labels);
                    for series_name in &names {
                        let mut one = labels.clone();
                        one.insert("__name__".into(), series_name.clone());
                        out.push(one);
                    }
                }
            }
        }
    }
    out
}
