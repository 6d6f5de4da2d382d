//! OTLP metrics in label mode: every series the receiver will create from
//! an `ExportMetricsServiceRequest` carries the tenant's label value.
//!
//! The receiver (Prometheus 3.x's OTLP endpoint) turns data-point
//! attributes into labels after translating their names (`k8s.namespace`
//! → `k8s_namespace`, or kept as UTF-8), resource attributes into
//! `target_info` labels (and, when promoted, labels of every series), and
//! scope attributes into `otel_scope_*` labels. So, per data point and per
//! resource: every attribute whose name translates to the tenant label
//! under any of those readings is removed, and one attribute named exactly
//! like the label is written, with the value the `metrics.foreign_label`
//! policy gives (the remote-write rules: owned → kept, none → added,
//! foreign → overwritten or the request refused). Scope attributes that
//! translate to the label are removed.
//!
//! The body is decoded and re-encoded whole with the OTLP schema's own
//! types: fields the schema does not know are not forwarded, so what leaves
//! is exactly what was checked. gzip in, gzip out.

use std::io::Read;

use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use http::header::{self, HeaderMap, HeaderValue};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;

use super::tenant_label::{decide, Decision, ForeignLabel, Found, TenantLabel};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OtlpError {
    /// 415.
    #[error("unsupported OTLP content: {0}")]
    Unsupported(String),
    /// 413.
    #[error("OTLP body decompresses to more than {limit} bytes")]
    TooLarge { limit: u64 },
    /// 400.
    #[error("cannot decode the OTLP request: {0}")]
    Malformed(String),
    /// 400, under `foreign_label: reject`.
    #[error(transparent)]
    ForeignLabel(#[from] ForeignLabel),
}

/// How the request body is compressed; the forwarded body is the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    Identity,
    Gzip,
}

/// What a rewrite did, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub data_points: u64,
    /// Data points and resources that had no tenant label.
    pub added: u64,
    /// Data points and resources whose label was replaced.
    pub overwritten: u64,
}

/// Reads `Content-Type` (protobuf only: OTLP/JSON is refused with 415 in
/// label mode, because it would need a second decoder to check) and
/// `Content-Encoding` (gzip or identity), both case-insensitive.
pub fn read_headers(headers: &HeaderMap) -> Result<Encoding, OtlpError> {
    let value = |name| {
        headers
            .get(name)
            .map(|v: &HeaderValue| v.to_str().unwrap_or("\u{fffd}").trim())
    };
    match value(header::CONTENT_TYPE) {
        Some(ct) if ct.eq_ignore_ascii_case("application/x-protobuf") => {}
        Some(ct) if ct.to_ascii_lowercase().starts_with("application/json") => {
            return Err(OtlpError::Unsupported(
                "OTLP/JSON metrics are not accepted in label mode; send application/x-protobuf"
                    .into(),
            ))
        }
        other => {
            return Err(OtlpError::Unsupported(format!(
                "content type {other:?}; OTLP metrics are application/x-protobuf"
            )))
        }
    }
    match value(header::CONTENT_ENCODING) {
        None => Ok(Encoding::Identity),
        Some(e) if e.eq_ignore_ascii_case("identity") => Ok(Encoding::Identity),
        Some(e) if e.eq_ignore_ascii_case("gzip") => Ok(Encoding::Gzip),
        Some(e) => Err(OtlpError::Unsupported(format!(
            "content encoding {e:?}; OTLP bodies are gzip or uncompressed"
        ))),
    }
}

/// The headers the receiver decodes by, in the form of what was checked.
pub fn set_upstream_headers(encoding: Encoding, headers: &mut HeaderMap) {
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-protobuf"),
    );
    match encoding {
        Encoding::Gzip => {
            headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        }
        Encoding::Identity => {
            headers.remove(header::CONTENT_ENCODING);
        }
    }
}

/// Decompresses (bounded), decodes, rewrites and re-encodes a body.
pub fn rewrite_body(
    encoding: Encoding,
    body: &[u8],
    tenant: &TenantLabel<'_>,
    max_decompressed: u64,
) -> Result<(Vec<u8>, Stats), OtlpError> {
    let mut request = match encoding {
        Encoding::Identity => decode(body, max_decompressed)?,
        Encoding::Gzip => {
            let mut raw = Vec::new();
            GzDecoder::new(body)
                .take(max_decompressed + 1)
                .read_to_end(&mut raw)
                .map_err(|e| OtlpError::Malformed(format!("gzip: {e}")))?;
            decode(&raw, max_decompressed)?
        }
    };
    let stats = rewrite(&mut request, tenant)?;
    let encoded = request.encode_to_vec();
    let out = match encoding {
        Encoding::Identity => encoded,
        Encoding::Gzip => {
            use std::io::Write;
            let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gz.write_all(&encoded)
                .and_then(|()| gz.finish())
                .map_err(|e| OtlpError::Malformed(format!("gzip: {e}")))?
        }
    };
    Ok((out, stats))
}

fn decode(raw: &[u8], limit: u64) -> Result<ExportMetricsServiceRequest, OtlpError> {
    if raw.len() as u64 > limit {
        return Err(OtlpError::TooLarge { limit });
    }
    ExportMetricsServiceRequest::decode(raw).map_err(|e| OtlpError::Malformed(e.to_string()))
}

/// Scopes a decoded request to the tenant.
pub fn rewrite(
    request: &mut ExportMetricsServiceRequest,
    tenant: &TenantLabel<'_>,
) -> Result<Stats, OtlpError> {
    let mut stats = Stats::default();
    visit(request, |level, metric, attributes| {
        if level == Level::DataPoint {
            stats.data_points += 1;
        }
        match level {
            Level::Scope => {
                attributes.retain(|kv| !translates_to(&kv.key, Level::Scope, tenant.name));
                Ok(())
            }
            Level::Resource => enforce(attributes, level, tenant, &mut stats, || {
                "a resource".into()
            }),
            Level::DataPoint => enforce(attributes, level, tenant, &mut stats, || {
                format!("a data point of {metric:?}")
            }),
        }
    })?;
    Ok(stats)
}

/// The property the rewrite keeps, for tests and fuzz targets: wherever a
/// receiver can make the tenant label, at resource or data-point level,
/// exactly one attribute does, named exactly `label`, with a value in
/// `owned`; no scope attribute can.
pub fn check_scoped(
    request: &ExportMetricsServiceRequest,
    label: &str,
    owned: &[String],
) -> Result<(), String> {
    let mut request = request.clone();
    let result = visit(&mut request, |level, metric, attributes| {
        let hits: Vec<&KeyValue> = attributes
            .iter()
            .filter(|kv| translates_to(&kv.key, level, label))
            .collect();
        let scoped = match level {
            Level::Scope => hits.is_empty(),
            _ => matches!(hits[..], [kv] if kv.key == label
                && string_value(kv).is_some_and(|v| owned.iter().any(|o| o == v))),
        };
        match scoped {
            true => Ok(()),
            false => Err(OtlpError::Malformed(format!(
                "{level:?} of {metric:?}: {hits:?}"
            ))),
        }
    });
    result.map_err(|e| e.to_string())
}

/// Calls `f` with every attribute list a receiver turns into labels: each
/// resource's (a missing resource is created: it gets the label too), each
/// scope's, and each data point's of every metric type, with the metric's
/// name.
fn visit(
    request: &mut ExportMetricsServiceRequest,
    mut f: impl FnMut(Level, &str, &mut Vec<KeyValue>) -> Result<(), OtlpError>,
) -> Result<(), OtlpError> {
    for resource_metrics in &mut request.resource_metrics {
        let resource = resource_metrics
            .resource
            .get_or_insert_with(Resource::default);
        f(Level::Resource, "", &mut resource.attributes)?;
        for scope_metrics in &mut resource_metrics.scope_metrics {
            if let Some(scope) = &mut scope_metrics.scope {
                f(Level::Scope, "", &mut scope.attributes)?;
            }
            for metric in &mut scope_metrics.metrics {
                let name = metric.name.as_str();
                let mut point =
                    |attributes: &mut Vec<KeyValue>| f(Level::DataPoint, name, attributes);
                match &mut metric.data {
                    Some(Data::Gauge(g)) => g
                        .data_points
                        .iter_mut()
                        .try_for_each(|p| point(&mut p.attributes))?,
                    Some(Data::Sum(s)) => s
                        .data_points
                        .iter_mut()
                        .try_for_each(|p| point(&mut p.attributes))?,
                    Some(Data::Histogram(h)) => h
                        .data_points
                        .iter_mut()
                        .try_for_each(|p| point(&mut p.attributes))?,
                    Some(Data::ExponentialHistogram(h)) => h
                        .data_points
                        .iter_mut()
                        .try_for_each(|p| point(&mut p.attributes))?,
                    Some(Data::Summary(s)) => s
                        .data_points
                        .iter_mut()
                        .try_for_each(|p| point(&mut p.attributes))?,
                    None => {}
                }
            }
        }
    }
    Ok(())
}

/// Where an attribute sits, which decides the labels it can become.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Resource,
    Scope,
    DataPoint,
}

/// Sets the tenant label in one attribute list, per the policy.
fn enforce(
    attributes: &mut Vec<KeyValue>,
    level: Level,
    tenant: &TenantLabel<'_>,
    stats: &mut Stats,
    describe: impl FnOnce() -> String,
) -> Result<(), OtlpError> {
    let mut found = Found::Nothing;
    for kv in attributes
        .iter()
        .filter(|kv| translates_to(&kv.key, level, tenant.name))
    {
        found = match string_value(kv) {
            Some(value) => found.and(value.as_bytes()),
            // A number or a list also becomes a label value: never ours.
            None => Found::Mixed,
        };
    }
    let value = match decide(found, tenant, describe)? {
        Decision::Keep(value) => String::from_utf8_lossy(value).into_owned(),
        decision => {
            match decision {
                Decision::Add => stats.added += 1,
                _ => stats.overwritten += 1,
            }
            tenant.owned[0].clone()
        }
    };
    attributes.retain(|kv| !translates_to(&kv.key, level, tenant.name));
    attributes.push(KeyValue {
        key: tenant.name.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value)),
        }),
        ..Default::default()
    });
    Ok(())
}

fn string_value(kv: &KeyValue) -> Option<&str> {
    match kv.value.as_ref()?.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(s),
        _ => None,
    }
}

/// Whether an attribute named `key` can become the label `label` at the
/// receiver, under any of its name translations: kept as UTF-8, or
/// sanitised to `[a-zA-Z0-9_]` (each other character to `_`, `key_` before
/// a leading digit, `key` before a single leading `_`), with or without runs
/// of `_` collapsed; at resource level also `service.name` and
/// `service.namespace` (→ `job`) and `service.instance.id` (→ `instance`);
/// at scope level with the `otel_scope_` prefix. Erring wide only removes an
/// attribute that might have collided.
pub fn translates_to(key: &str, level: Level, label: &str) -> bool {
    match level {
        Level::Scope => return translates(&format!("otel_scope_{key}"), label),
        Level::Resource => {
            let derived = match key {
                "service.name" | "service.namespace" => Some("job"),
                "service.instance.id" => Some("instance"),
                _ => None,
            };
            if derived == Some(label) {
                return true;
            }
        }
        Level::DataPoint => {}
    }
    translates(key, label)
}

fn translates(key: &str, label: &str) -> bool {
    if key == label {
        return true;
    }
    // Compared character by character: this runs for every attribute of
    // every data point, twice, and must not allocate.
    let sanitised = || {
        key.chars().map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
    };
    let mut head = sanitised();
    let prefix = match (head.next(), head.next()) {
        (Some(c), _) if c.is_ascii_digit() => "key_",
        (Some('_'), second) if second != Some('_') => "key",
        _ => "",
    };
    let full = || prefix.chars().chain(sanitised());
    if full().eq(label.chars()) {
        return true;
    }
    let mut previous = None;
    let collapsed = full().filter(move |&c| {
        let repeat = c == '_' && previous == Some('_');
        previous = Some(c);
        !repeat
    });
    collapsed.eq(label.chars())
}

#[cfg(test)]
mod tests;
