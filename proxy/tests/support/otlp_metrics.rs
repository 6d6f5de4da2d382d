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
//!   `_bucket` (one series per `le`), `_count` and `_sum` for a classic
//!   histogram, the bare name for an exponential histogram (native), the
//!   bare name per `quantile`, `_count` and `_sum` for a summary;
//! - per resource with a data point, `job` or `instance`, and another
//!   attribute, a `target_info` series with those other attributes, valued 1
//!   from the earliest data point's time to the latest, every 2.5 minutes
//!   (half the default lookback) and at the latest;
//! - values (`number_data_points.go`, `helper.go`): a number point's double
//!   or int; a histogram's cumulative `_bucket` counts under `le` (bounds
//!   as Go's `FormatFloat(b, 'f', -1, 64)`, then `+Inf`), `_count`, and
//!   `_sum` when the point has one; a summary's quantiles under `quantile`,
//!   `_count` and `_sum`; the stale marker for a point flagged "no recorded
//!   value"; timestamps in milliseconds (nanoseconds / 10^6);
//! - a sum or histogram whose temporality is not cumulative is skipped (the
//!   delta feature flags are off), as is a metric without data.
//!
//! Skipped: unit suffixes, exemplars, metadata, `_created` series, the
//! native histogram an exponential histogram's point becomes (its series is
//! stored without a value), the UTF-8 modes (the proxy's unit tests cover
//! their name reading), Mimir's differences.

use std::collections::BTreeMap;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value::Value, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::number_data_point::Value as Number;
use opentelemetry_proto::tonic::metrics::v1::{AggregationTemporality, NumberDataPoint};

pub type Series = BTreeMap<String, String>;

/// One sample the receiver would append, with the series it goes to.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub labels: Series,
    /// `None` for an exponential histogram's point (a native histogram
    /// sample, not built here).
    pub value: Option<f64>,
    pub timestamp_ms: i64,
}

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

/// Prometheus's staleness marker, written for a point flagged
/// `FLAG_NO_RECORDED_VALUE`.
const STALE_NAN: u64 = 0x7ff0_0000_0000_0002;

/// `target_info`'s step between the earliest and the latest point: half the
/// default lookback delta of five minutes, in nanoseconds.
const TARGET_INFO_STEP_NS: u64 = 150 * 1_000_000_000;

/// One series a data point becomes, before the point's labels are added:
/// its name, a label of its own (`le`, `quantile`) and its value.
type PointSeries = (String, Option<(&'static str, String)>, Option<f64>);

/// A data point as the translator reads it.
struct Point<'a> {
    attributes: &'a [KeyValue],
    time_unix_nano: u64,
    series: Vec<PointSeries>,
}

fn millis(time_unix_nano: u64) -> i64 {
    time_unix_nano as i64 / 1_000_000
}

/// Go's `strconv.FormatFloat(f, 'f', -1, 64)`: the shortest decimal that
/// reads back the same, never an exponent.
fn go_float(f: f64) -> String {
    match f {
        f64::INFINITY => "+Inf".into(),
        f64::NEG_INFINITY => "-Inf".into(),
        f if f.is_nan() => "NaN".into(),
        f => f.to_string(),
    }
}

fn recorded(flags: u32, value: f64) -> Option<f64> {
    Some(if flags & 1 == 1 {
        f64::from_bits(STALE_NAN)
    } else {
        value
    })
}

fn number_point<'a>(p: &'a NumberDataPoint, name: &str) -> Point<'a> {
    let value = match p.value {
        Some(Number::AsDouble(d)) => d,
        Some(Number::AsInt(i)) => i as f64,
        None => 0.0,
    };
    Point {
        attributes: &p.attributes,
        time_unix_nano: p.time_unix_nano,
        series: vec![(name.to_string(), None, recorded(p.flags, value))],
    }
}

fn cumulative(temporality: i32) -> bool {
    temporality == AggregationTemporality::Cumulative as i32
}

/// Whether the receiver stores `data`: a sum or histogram only when
/// cumulative (the delta feature flags are off).
fn stored(data: &Data) -> bool {
    match data {
        Data::Sum(s) => cumulative(s.aggregation_temporality),
        Data::Histogram(h) => cumulative(h.aggregation_temporality),
        Data::ExponentialHistogram(h) => cumulative(h.aggregation_temporality),
        Data::Gauge(_) | Data::Summary(_) => true,
    }
}

/// Every data point of `data` with the series it becomes.
fn points<'a>(data: &'a Data, name: &str) -> Vec<Point<'a>> {
    match data {
        Data::Gauge(g) => g
            .data_points
            .iter()
            .map(|p| number_point(p, name))
            .collect(),
        Data::Sum(s) => {
            let name = if s.is_monotonic {
                format!("{name}_total")
            } else {
                name.to_string()
            };
            s.data_points
                .iter()
                .map(|p| number_point(p, &name))
                .collect()
        }
        Data::Histogram(h) => h
            .data_points
            .iter()
            .map(|p| {
                let mut series = Vec::new();
                if let Some(sum) = p.sum {
                    series.push((format!("{name}_sum"), None, recorded(p.flags, sum)));
                }
                series.push((
                    format!("{name}_count"),
                    None,
                    recorded(p.flags, p.count as f64),
                ));
                let mut below = 0;
                for (bound, count) in p.explicit_bounds.iter().zip(&p.bucket_counts) {
                    below += count;
                    let le = Some(("le", go_float(*bound)));
                    series.push((
                        format!("{name}_bucket"),
                        le,
                        recorded(p.flags, below as f64),
                    ));
                }
                let le = Some(("le", "+Inf".to_string()));
                series.push((
                    format!("{name}_bucket"),
                    le,
                    recorded(p.flags, p.count as f64),
                ));
                Point {
                    attributes: &p.attributes,
                    time_unix_nano: p.time_unix_nano,
                    series,
                }
            })
            .collect(),
        Data::ExponentialHistogram(h) => h
            .data_points
            .iter()
            .map(|p| Point {
                attributes: &p.attributes,
                time_unix_nano: p.time_unix_nano,
                series: vec![(name.to_string(), None, None)],
            })
            .collect(),
        Data::Summary(s) => s
            .data_points
            .iter()
            .map(|p| {
                let mut series = vec![
                    (format!("{name}_sum"), None, recorded(p.flags, p.sum)),
                    (
                        format!("{name}_count"),
                        None,
                        recorded(p.flags, p.count as f64),
                    ),
                ];
                for q in &p.quantile_values {
                    let quantile = Some(("quantile", go_float(q.quantile)));
                    series.push((name.to_string(), quantile, recorded(p.flags, q.value)));
                }
                Point {
                    attributes: &p.attributes,
                    time_unix_nano: p.time_unix_nano,
                    series,
                }
            })
            .collect(),
    }
}

/// `target_info`'s sample times, in milliseconds, for points between
/// `earliest` and `latest` (nanoseconds).
fn target_info_times(earliest: u64, latest: u64) -> Vec<i64> {
    let mut out: Vec<i64> = (earliest..latest)
        .step_by(TARGET_INFO_STEP_NS as usize)
        .map(millis)
        .collect();
    if out.last().is_none_or(|last| *last < millis(latest)) {
        out.push(millis(latest));
    }
    out
}

/// Every sample the receiver would append for `request`.
pub fn samples(request: &ExportMetricsServiceRequest) -> Vec<Sample> {
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
        let mut resource_times = Vec::new();
        for sm in &rm.scope_metrics {
            let scope = sm.scope.clone().unwrap_or_default();
            let mut scope_labels = labels_of(&scope.attributes, "otel_scope_");
            if !scope.name.is_empty() {
                scope_labels.insert("otel_scope_name".into(), scope.name.clone());
                scope_labels.insert("otel_scope_version".into(), scope.version.clone());
            }
            for metric in &sm.metrics {
                let Some(data) = &metric.data else { continue };
                let points = points(data, &sanitise(&metric.name));
                // The receiver finds the resource's earliest and latest
                // point before it checks temporality.
                resource_times.extend(points.iter().map(|p| p.time_unix_nano));
                if !stored(data) {
                    continue;
                }
                for point in points {
                    let mut labels = labels_of(point.attributes, "");
                    for (k, v) in &promoted {
                        labels.entry(k.clone()).or_insert_with(|| v.clone());
                    }
                    labels.extend(scope_labels.clone());
                    identity(&mut labels);
                    for (name, own, value) in point.series {
                        let mut one = labels.clone();
                        one.insert("__name__".into(), name);
                        if let Some((label, label_value)) = own {
                            one.insert(label.into(), label_value);
                        }
                        out.push(Sample {
                            labels: one,
                            value,
                            timestamp_ms: millis(point.time_unix_nano),
                        });
                    }
                }
            }
        }
        let (Some(earliest), Some(latest)) =
            (resource_times.iter().min(), resource_times.iter().max())
        else {
            continue;
        };
        if (job.is_some() || instance.is_some()) && !others.is_empty() {
            let mut target_info = promoted.clone();
            identity(&mut target_info);
            target_info.insert("__name__".into(), "target_info".into());
            for timestamp_ms in target_info_times(*earliest, *latest) {
                out.push(Sample {
                    labels: target_info.clone(),
                    value: Some(1.0),
                    timestamp_ms,
                });
            }
        }
    }
    out
}
