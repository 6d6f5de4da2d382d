//! OTLP metrics in label mode: every series the receiver will create from
//! an `ExportMetricsServiceRequest` carries the tenant's label value.
//!
//! The receiver (Prometheus 3.x's OTLP endpoint) turns data-point
//! attributes into labels after translating their names (`k8s.namespace`
//! → `k8s_namespace`, or kept as UTF-8), resource attributes into
//! `target_info` labels (and, when promoted, labels of every series), and
//! scope attributes into `otel_scope_*` labels. So, per data point and per
//! resource: every attribute whose name translates to the tenant label
//! under any of those readings (`translate`) is removed, and one attribute
//! named exactly like the label is written, with the value the
//! `metrics.foreign_label` policy gives (owned → kept, none → added,
//! foreign → overwritten or the request refused). Scope attributes that
//! translate to the label are removed.
//!
//! The body is rewritten on the wire format (`splice`), like remote write:
//! only attribute lists are rebuilt, and fields the schema does not know
//! are dropped on the way to them. gzip in (every member, as Go's reader
//! takes them), gzip out; a body every point of which was already scoped
//! leaves as it came.

mod gzip;
mod splice;
mod translate;

use std::cell::RefCell;

use flate2::{Compress, Compression};
use http::header::{self, HeaderMap, HeaderValue};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{metric::Data, Metric};

use super::protowire::WireError;
use super::tenant_label::{ForeignLabel, TenantLabel};
use super::{release_large_scratch, Rewritten};
use crate::http::headers::single_value;
pub use translate::{translates_to, Level};

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
    /// Our failure, not the body's: 503, the sender keeps the data.
    #[error("cannot compress the rewritten body: {0}")]
    Compress(String),
}

impl From<WireError> for OtlpError {
    fn from(e: WireError) -> Self {
        OtlpError::Malformed(e.to_string())
    }
}

/// How a body is compressed: the request's, and the forwarded one's
/// (the same unless `metrics.otlp_forward_encoding: identity`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    Identity,
    Gzip,
}

impl Encoding {
    /// The size `body` says it inflates to, at most `limit`: its own for
    /// identity; for gzip, the last member's trailer (its size modulo
    /// 2^32), which is the sender's word only, and 0 if there is none. A
    /// gzip body may inflate a thousandfold, so what the rewrite inflates
    /// must be bounded by its own limit all the same.
    pub fn inflated_size_hint(self, body: &[u8], limit: u64) -> u64 {
        match self {
            Encoding::Identity => body.len() as u64,
            // A member's header and trailer take 18 bytes.
            Encoding::Gzip if body.len() < 18 => 0,
            Encoding::Gzip => {
                let [.., a, b, c, d] = *body else {
                    unreachable!("at least 18 bytes")
                };
                u64::from(u32::from_le_bytes([a, b, c, d])).min(limit)
            }
        }
    }
}

/// What a rewrite did, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub data_points: u64,
    /// Data points and resources that had no tenant label.
    pub added: u64,
    /// Data points and resources whose label was replaced.
    pub overwritten: u64,
    /// Fields the schema does not define on the way to attributes, not
    /// forwarded.
    pub dropped_fields: u64,
}

/// Reads `Content-Type` (protobuf only: OTLP/JSON is refused with 415 in
/// label mode, because it would need a second decoder to check) and
/// `Content-Encoding` (gzip or identity), both case-insensitive. A repeated
/// header is 415, as on remote write: which copy counts is ambiguous, and
/// the sender learns so (upstream gets canonical headers either way).
pub fn read_headers(headers: &HeaderMap) -> Result<Encoding, OtlpError> {
    let value = |name| {
        single_value(headers, &name)
            .map(|v| v.map(str::trim))
            .map_err(OtlpError::Unsupported)
    };
    match value(header::CONTENT_TYPE)? {
        Some(ct) if ct.eq_ignore_ascii_case("application/x-protobuf") => {}
        Some(ct) if ct.to_ascii_lowercase().starts_with("application/json") => {
            return Err(OtlpError::Unsupported(
                "OTLP/JSON metrics are not accepted in label mode; send application/x-protobuf"
                    .into(),
            ))
        }
        Some(other) => {
            return Err(OtlpError::Unsupported(format!(
                "content type {other:?}; OTLP metrics are application/x-protobuf"
            )))
        }
        None => {
            return Err(OtlpError::Unsupported(
                "no content type; OTLP metrics are application/x-protobuf".into(),
            ))
        }
    }
    match value(header::CONTENT_ENCODING)? {
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

/// Scratch buffers kept per thread, as remote write keeps them: a
/// decompressed batch is hundreds of KiB, and allocating it per request
/// costs a page fault per 4 KiB.
struct Scratch {
    decompressed: Vec<u8>,
    rewritten: Vec<u8>,
    /// Reset per body: a new one allocates and zeroes its window and hash
    /// tables every time.
    gzip: Compress,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch {
        decompressed: Vec::new(),
        rewritten: Vec::new(),
        gzip: Compress::new_gzip(Compression::fast(), 15),
    });
}

/// Decompresses (bounded) a body in `encoding`, rewrites it and, if it
/// changed, encodes it in `forward`.
pub fn rewrite_body(
    encoding: Encoding,
    forward: Encoding,
    body: &[u8],
    tenant: &TenantLabel<'_>,
    max_decompressed: u64,
) -> Result<(Rewritten, Stats), OtlpError> {
    SCRATCH.with(|scratch| {
        let scratch = &mut *scratch.borrow_mut();
        let result = rewrite_in(encoding, forward, body, tenant, max_decompressed, scratch);
        release_large_scratch([&mut scratch.decompressed, &mut scratch.rewritten]);
        result
    })
}

fn rewrite_in(
    encoding: Encoding,
    forward: Encoding,
    body: &[u8],
    tenant: &TenantLabel<'_>,
    limit: u64,
    Scratch {
        decompressed,
        rewritten,
        gzip,
    }: &mut Scratch,
) -> Result<(Rewritten, Stats), OtlpError> {
    let message = match encoding {
        Encoding::Identity => body,
        Encoding::Gzip => {
            gzip::inflate_members(body, limit, decompressed)?;
            decompressed.as_slice()
        }
    };
    if message.len() as u64 > limit {
        return Err(OtlpError::TooLarge { limit });
    }
    rewritten.clear();
    rewritten.reserve(message.len() + message.len() / 8 + 64);
    let stats = splice::rewrite_into(message, tenant, rewritten)?;
    if rewritten == message {
        return Ok((Rewritten::Unchanged, stats));
    }
    let out = match forward {
        Encoding::Identity => rewritten.clone(),
        Encoding::Gzip => gzip::deflate_member(gzip, rewritten)?,
    };
    Ok((Rewritten::Body(out), stats))
}

/// Every gzip member of `body`, read as the rewrite reads it (for fuzz
/// targets and tests: the rewrite keeps its buffer per thread).
pub fn gunzip(body: &[u8], limit: u64) -> Result<Vec<u8>, OtlpError> {
    let mut out = Vec::new();
    gzip::inflate_members(body, limit, &mut out).map(|()| out)
}

/// Rewrites a decompressed `ExportMetricsServiceRequest`.
pub fn rewrite(message: &[u8], tenant: &TenantLabel<'_>) -> Result<(Vec<u8>, Stats), OtlpError> {
    let mut out = Vec::new();
    let stats = splice::rewrite_into(message, tenant, &mut out)?;
    Ok((out, stats))
}

/// The property the rewrite keeps, for tests and fuzz targets, checked on
/// the decoded request the receiver would see: wherever a receiver can
/// make the tenant label, at resource or data-point level, exactly one
/// attribute does, named exactly `label`, with a string value in `owned`;
/// no scope attribute can. A missing resource is the receiver's empty one.
pub fn check_scoped(
    request: &ExportMetricsServiceRequest,
    label: &str,
    owned: &[String],
) -> Result<(), String> {
    let check = |level: Level, place: &dyn Fn() -> String, attributes: &[KeyValue]| {
        let hits: Vec<&KeyValue> = attributes
            .iter()
            .filter(|kv| translates_to(&kv.key, level, label))
            .collect();
        let scoped = match level {
            Level::Scope => hits.is_empty(),
            _ => matches!(hits[..], [kv] if kv.key == label
                && owned_string(kv).is_some_and(|v| owned.iter().any(|o| o == v))),
        };
        match scoped {
            true => Ok(()),
            false => Err(format!("{level:?} of {}: {hits:?}", place())),
        }
    };
    for resource_metrics in &request.resource_metrics {
        let resource = resource_metrics.resource.as_ref();
        let attributes = resource.map_or(&[][..], |r| &r.attributes);
        check(Level::Resource, &|| "a resource".into(), attributes)?;
        for scope_metrics in &resource_metrics.scope_metrics {
            if let Some(scope) = &scope_metrics.scope {
                check(Level::Scope, &|| "a scope".into(), &scope.attributes)?;
            }
            for metric in &scope_metrics.metrics {
                for attributes in data_point_attributes(metric) {
                    check(Level::DataPoint, &|| metric.name.clone(), attributes)?;
                }
            }
        }
    }
    Ok(())
}

/// `request` without the attributes a receiver could turn into `label`, at
/// every level, and with a missing resource as the receiver's empty one:
/// all that the rewrite may change. For tests and fuzz targets, beside
/// [`check_scoped`]: what is forwarded, decoded and passed through this, is
/// what came, passed through this (no value, timestamp or bucket lost).
pub fn without_label(
    mut request: ExportMetricsServiceRequest,
    label: &str,
) -> ExportMetricsServiceRequest {
    let strip = |attributes: &mut Vec<KeyValue>, level| {
        attributes.retain(|kv| !translates_to(&kv.key, level, label));
    };
    for resource_metrics in &mut request.resource_metrics {
        let resource = resource_metrics
            .resource
            .get_or_insert_with(Default::default);
        strip(&mut resource.attributes, Level::Resource);
        for scope_metrics in &mut resource_metrics.scope_metrics {
            if let Some(scope) = &mut scope_metrics.scope {
                strip(&mut scope.attributes, Level::Scope);
            }
            for metric in &mut scope_metrics.metrics {
                for_each_data_point(metric, |attributes| strip(attributes, Level::DataPoint));
            }
        }
    }
    request
}

/// Calls `f` with the attribute list of every data point of a metric.
fn for_each_data_point(metric: &mut Metric, mut f: impl FnMut(&mut Vec<KeyValue>)) {
    match &mut metric.data {
        Some(Data::Gauge(g)) => g.data_points.iter_mut().for_each(|p| f(&mut p.attributes)),
        Some(Data::Sum(s)) => s.data_points.iter_mut().for_each(|p| f(&mut p.attributes)),
        Some(Data::Histogram(h)) => h.data_points.iter_mut().for_each(|p| f(&mut p.attributes)),
        Some(Data::ExponentialHistogram(h)) => {
            h.data_points.iter_mut().for_each(|p| f(&mut p.attributes))
        }
        Some(Data::Summary(s)) => s.data_points.iter_mut().for_each(|p| f(&mut p.attributes)),
        None => {}
    }
}

/// The attribute list of every data point of a metric, whatever its type.
fn data_point_attributes(metric: &Metric) -> Vec<&[KeyValue]> {
    fn lists<P>(points: &[P], attributes: fn(&P) -> &[KeyValue]) -> Vec<&[KeyValue]> {
        points.iter().map(attributes).collect()
    }
    match &metric.data {
        Some(Data::Gauge(g)) => lists(&g.data_points, |p| &p.attributes),
        Some(Data::Sum(s)) => lists(&s.data_points, |p| &p.attributes),
        Some(Data::Histogram(h)) => lists(&h.data_points, |p| &p.attributes),
        Some(Data::ExponentialHistogram(h)) => lists(&h.data_points, |p| &p.attributes),
        Some(Data::Summary(s)) => lists(&s.data_points, |p| &p.attributes),
        None => Vec::new(),
    }
}

fn owned_string(kv: &KeyValue) -> Option<&str> {
    match kv.value.as_ref()?.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(s),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
