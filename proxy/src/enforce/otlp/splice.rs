//! The wire-format rewrite of an `ExportMetricsServiceRequest`: the
//! messages on the way to attribute lists are walked field by field;
//! attribute lists are rebuilt; everything else (values, timestamps,
//! buckets, exemplars) is copied byte for byte.
//!
//! What leaves carries only what was checked: on the way to attributes, a
//! field the schema (opentelemetry-proto 1.x as in `opentelemetry-proto`
//! 0.33) does not define is dropped, never forwarded unread: a receiver
//! with another schema version could find series in it (older collectors
//! still read the removed field 1000 of `ResourceMetrics`). A field of the
//! schema in the wrong wire type is refused, as every decoder refuses it.
//! A resource given twice is refused: a receiver merges the two, and two
//! tenant attributes would reach it.

use super::translate::{may_translate_to, translates_to, Level};
use super::{OtlpError, Stats};
use crate::enforce::protowire::{
    encode_varint, fields, varint_size, write_field_header, write_len_field, write_varint, Field,
    LEN,
};
use crate::enforce::tenant_label::{decide, Decision, Found, TenantLabel};

/// The messages of the OTLP metrics schema that lead to attribute lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Request,
    ResourceMetrics,
    Resource,
    ScopeMetrics,
    Scope,
    Metric,
    Gauge,
    Sum,
    Histogram,
    ExponentialHistogram,
    Summary,
    NumberPoint,
    HistogramPoint,
    ExponentialPoint,
    SummaryPoint,
}

/// What a field of such a message is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    /// In the schema, no attributes inside: copied byte for byte.
    Copy,
    /// A message on the way to attributes.
    Message(Kind),
    /// One attribute (`KeyValue`) of the message's list.
    Attribute,
}

impl Kind {
    /// The role of field `tag`; `None` for a field the schema does not
    /// define (dropped).
    fn part(self, tag: u32) -> Option<Part> {
        use Kind::*;
        use Part::{Attribute, Copy, Message};
        Some(match (self, tag) {
            (Request, 1) => Message(ResourceMetrics),
            (ResourceMetrics, 1) => Message(Resource),
            (ResourceMetrics, 2) => Message(ScopeMetrics),
            (ResourceMetrics, 3) => Copy,
            (Resource, 1) => Attribute,
            (Resource, 2..=3) => Copy, // dropped count, entity refs
            (ScopeMetrics, 1) => Message(Scope),
            (ScopeMetrics, 2) => Message(Metric),
            (ScopeMetrics, 3) => Copy,
            (Scope, 3) => Attribute,
            (Scope, 1 | 2 | 4) => Copy,
            (Metric, 1..=3 | 12) => Copy, // name, description, unit, metadata
            (Metric, 5) => Message(Gauge),
            (Metric, 7) => Message(Sum),
            (Metric, 9) => Message(Histogram),
            (Metric, 10) => Message(ExponentialHistogram),
            (Metric, 11) => Message(Summary),
            (Gauge | Sum, 1) => Message(NumberPoint),
            (Histogram, 1) => Message(HistogramPoint),
            (ExponentialHistogram, 1) => Message(ExponentialPoint),
            (Summary, 1) => Message(SummaryPoint),
            (Sum, 2..=3) | (Histogram | ExponentialHistogram, 2) => Copy,
            (NumberPoint | SummaryPoint, 7) | (HistogramPoint, 9) | (ExponentialPoint, 1) => {
                Attribute
            }
            (NumberPoint | SummaryPoint, 2..=8)
            | (HistogramPoint, 2..=12)
            | (ExponentialPoint, 2..=14) => Copy,
            _ => return None,
        })
    }

    /// The level of the message's attribute list, if it has one.
    fn level(self) -> Option<Level> {
        match self {
            Kind::Resource => Some(Level::Resource),
            Kind::Scope => Some(Level::Scope),
            Kind::NumberPoint
            | Kind::HistogramPoint
            | Kind::ExponentialPoint
            | Kind::SummaryPoint => Some(Level::DataPoint),
            _ => None,
        }
    }

    /// The field number of the attribute list.
    fn attribute_tag(self) -> u32 {
        match self {
            Kind::Resource | Kind::ExponentialPoint => 1,
            Kind::Scope => 3,
            Kind::HistogramPoint => 9,
            _ => 7,
        }
    }
}

/// One attribute as the receiver reads it.
struct Attribute<'a> {
    key: &'a [u8],
    /// The `AnyValue`, if any.
    value: Option<&'a [u8]>,
}

impl<'a> Attribute<'a> {
    /// Reads a `KeyValue { key = 1; value = 2; }`. Anything besides one key
    /// and at most one value is refused: a repeated field reads as its last
    /// (key) or as a merge (value), and the profiles-only `key_strindex`
    /// would name the attribute from elsewhere.
    #[inline]
    fn parse(message: &'a [u8]) -> Result<Self, OtlpError> {
        // The layout every encoder writes, short fields: read in place.
        if let [0x0a, key_len @ 0..=0x7f, rest @ ..] = message {
            if let Some((key, rest)) = rest.split_at_checked(usize::from(*key_len)) {
                match rest {
                    [] => return Ok(Attribute { key, value: None }),
                    [0x12, value_len @ 0..=0x7f, value @ ..]
                        if usize::from(*value_len) == value.len() =>
                    {
                        let value = Some(value);
                        return Ok(Attribute { key, value });
                    }
                    _ => {}
                }
            }
        }
        let (mut key, mut value) = (None, None);
        for field in fields(message) {
            let field = field?;
            let slot = match (field.tag, field.wire_type) {
                (1, LEN) => &mut key,
                (2, LEN) => &mut value,
                _ => return Err(malformed("an attribute with a field besides key and value")),
            };
            if slot.replace(field.payload).is_some() {
                return Err(malformed("an attribute with a repeated key or value"));
            }
        }
        let key = key.unwrap_or_default();
        Ok(Attribute { key, value })
    }

    /// Whether the receiver can make the label of this attribute. A name
    /// that could, and is not UTF-8, is refused: a receiver may read it
    /// differently from any reading here.
    fn translates_to(&self, level: Level, label: &str) -> Result<bool, OtlpError> {
        if !may_translate_to(self.key, level, label) {
            return Ok(false);
        }
        let key = std::str::from_utf8(self.key)
            .map_err(|_| malformed("an attribute name that is not UTF-8"))?;
        Ok(translates_to(key, level, label))
    }

    /// The value when it is exactly `{ string_value = 1 }` in UTF-8; any
    /// other value is never an owned one.
    fn string(&self) -> Option<&'a [u8]> {
        let mut all = fields(self.value?);
        match (all.next(), all.next()) {
            (
                Some(Ok(Field {
                    tag: 1,
                    wire_type: LEN,
                    payload,
                    ..
                })),
                None,
            ) if std::str::from_utf8(payload).is_ok() => Some(payload),
            _ => None,
        }
    }
}

fn malformed(what: &str) -> OtlpError {
    OtlpError::Malformed(what.to_owned())
}

/// The attributes of one resource or data point that translate to the
/// label, as they were met.
struct Hits<'m> {
    found: Found<'m>,
    count: usize,
    /// The last one is named exactly like the label.
    exact: bool,
    /// The first one, and where in the output it would have been.
    first: Option<(usize, &'m [u8])>,
}

impl Hits<'_> {
    const NONE: Self = Hits {
        found: Found::Nothing,
        count: 0,
        exact: false,
        first: None,
    };
}

/// Rewrites `message`, appending to `out`.
pub fn rewrite_into(
    message: &[u8],
    tenant: &TenantLabel<'_>,
    out: &mut Vec<u8>,
) -> Result<Stats, OtlpError> {
    let mut splice = Splice {
        tenant,
        out,
        stats: Stats::default(),
        metric: &[],
    };
    splice.message(Kind::Request, message)?;
    Ok(splice.stats)
}

/// One rewrite: the tenant and the request share a lifetime `'m`.
struct Splice<'m, 'o> {
    tenant: &'m TenantLabel<'m>,
    out: &'o mut Vec<u8>,
    stats: Stats,
    /// The metric being walked, for error messages.
    metric: &'m [u8],
}

impl<'m> Splice<'m, '_> {
    /// Copies or rewrites one message of `kind`, field by field, in one
    /// pass: attributes that translate to the label are held back and the
    /// tenant's written at the end, per the policy.
    fn message(&mut self, kind: Kind, message: &'m [u8]) -> Result<(), OtlpError> {
        let label = self.tenant.name;
        if kind == Kind::Metric {
            self.metric = message;
        }
        let mut hits = Hits::NONE;
        let mut resources = 0;
        for field in fields(message) {
            let field = field?;
            match kind.part(field.tag) {
                None => self.stats.dropped_fields += 1,
                Some(Part::Copy) => self.out.extend_from_slice(field.raw),
                Some(part) if field.wire_type != LEN => {
                    return Err(OtlpError::Malformed(format!(
                        "field {} of {kind:?} ({part:?}) has wire type {}",
                        field.tag, field.wire_type
                    )))
                }
                Some(Part::Message(inner)) => {
                    if inner == Kind::Resource {
                        resources += 1;
                        if resources > 1 {
                            return Err(malformed(
                                "a ResourceMetrics with two resources (a receiver merges them)",
                            ));
                        }
                    }
                    self.nested(field.tag, field.payload.len(), |s| {
                        s.message(inner, field.payload)
                    })?;
                }
                Some(Part::Attribute) => {
                    let level = kind.level().expect("only owners of attributes have them");
                    let attribute = Attribute::parse(field.payload)?;
                    if !attribute.translates_to(level, label)? {
                        self.out.extend_from_slice(field.raw);
                        continue;
                    }
                    hits.count += 1;
                    hits.exact = attribute.key == label.as_bytes();
                    hits.found = match attribute.string() {
                        Some(value) => hits.found.and(value),
                        None => Found::Mixed,
                    };
                    hits.first.get_or_insert((self.out.len(), field.raw));
                }
            }
        }
        match kind.level() {
            Some(Level::DataPoint) => {
                self.stats.data_points += 1;
                self.settle(kind, hits)?;
            }
            Some(Level::Resource) => self.settle(kind, hits)?,
            // Scope attributes that translate to the label are dropped.
            Some(Level::Scope) => {}
            // A resource created where there was none gets the label too.
            None if kind == Kind::ResourceMetrics && resources == 0 => {
                self.nested(1, 32, |s| s.message(Kind::Resource, &[]))?
            }
            None => {}
        }
        Ok(())
    }

    /// Writes the tenant attribute of a resource or data point once its
    /// fields are copied: the one it came with, back in its place, when it
    /// was alone, named exactly and owned; else the policy's value.
    fn settle(&mut self, kind: Kind, hits: Hits<'m>) -> Result<(), OtlpError> {
        let metric = self.metric;
        let decision = decide(hits.found, self.tenant, || match kind {
            Kind::Resource => "a resource".to_owned(),
            _ => format!("a data point of {:?}", metric_name(metric)),
        })?;
        let value = match decision {
            Decision::Keep(_) if hits.count == 1 && hits.exact => {
                let (at, raw) = hits.first.expect("one hit was met");
                self.out.splice(at..at, raw.iter().copied());
                return Ok(());
            }
            Decision::Keep(value) => value,
            Decision::Add => {
                self.stats.added += 1;
                self.tenant.default_value()
            }
            Decision::Overwrite => {
                self.stats.overwritten += 1;
                self.tenant.default_value()
            }
        };
        self.write_attribute(kind.attribute_tag(), value);
        Ok(())
    }

    /// Writes a length-delimited field whose payload `write` appends. The
    /// length is reserved from `hint` (the input's size, which the rewrite
    /// rarely changes by much) and moved only when it needs another size.
    fn nested(
        &mut self,
        tag: u32,
        hint: usize,
        write: impl FnOnce(&mut Self) -> Result<(), OtlpError>,
    ) -> Result<(), OtlpError> {
        write_varint(self.out, (u64::from(tag) << 3) | u64::from(LEN));
        let start = self.out.len();
        let reserved = varint_size(hint as u64);
        self.out.resize(start + reserved, 0);
        write(self)?;
        let len = self.out.len() - start - reserved;
        let mut prefix = [0; 10];
        let n = encode_varint(len as u64, &mut prefix);
        self.out
            .splice(start..start + reserved, prefix[..n].iter().copied());
        Ok(())
    }

    /// Appends `KeyValue { key: label, value: { string_value: value } }`.
    fn write_attribute(&mut self, tag: u32, value: &[u8]) {
        let label = self.tenant.name.as_bytes();
        let any_len = 1 + varint_size(value.len() as u64) + value.len();
        let kv_len = 1 + varint_size(label.len() as u64) + label.len() + 1;
        let kv_len = kv_len + varint_size(any_len as u64) + any_len;
        write_field_header(self.out, tag, kv_len);
        write_len_field(self.out, 1, label);
        write_field_header(self.out, 2, any_len);
        write_len_field(self.out, 1, value);
    }
}

/// The name of a `Metric` (its last field 1), for error messages.
fn metric_name(metric: &[u8]) -> String {
    let name = fields(metric)
        .filter_map(Result::ok)
        .filter(|f| (f.tag, f.wire_type) == (1, LEN))
        .last()
        .map_or(&[][..], |f| f.payload);
    String::from_utf8_lossy(name).into_owned()
}
