//! Remote write in label mode: every pushed series leaves with the tenant's
//! label value, whatever the sender put there.
//!
//! The body is snappy-compressed protobuf, 1.0 (`prometheus.WriteRequest`) or
//! 2.0 (`io.prometheus.write.v2.Request`, labels as references into a symbols
//! table). The rewrite splices bytes: only the label fields of each series
//! are parsed and rebuilt; samples, exemplars, histograms and metadata are
//! copied verbatim.
//!
//! What is forwarded must mean the same to every receiver, under either
//! schema: a 1.0-only receiver ignores `proto=` and decodes any body as 1.0,
//! a 2.0 one trusts it. So a body may carry, at the top level, only the
//! fields of the version it declares (the other version's series would
//! reach a receiver unchecked: 400); inside a series, a field neither schema
//! defines is dropped, never forwarded unread; inside a 1.0 `Label`, one is
//! refused. The headers a receiver reads to pick its decoder are written
//! back canonically (docs/remote-write.md, "One body, one reading").
//!
//! Per series: no tenant label → the tenant's first namespace is added; one
//! (or several equal) copies with a value the tenant owns → kept once;
//! anything else → overwritten with the first namespace, or the request
//! refused, per `metrics.foreign_label`. Every existing copy is removed
//! first: Prometheus silently drops series with duplicate label names and
//! still answers 2xx. Labels leave sorted by name.

use std::cell::RefCell;
use std::cmp::Ordering;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use super::prompb::readings::describe as describe_series;
use super::tenant_label::{decide, Decision, ForeignLabel, Found, TenantLabel};
use super::{release_large_scratch, Rewritten};
use crate::enforce::protowire::{self, fields, WireError, LEN, VARINT};

mod literal;

pub const V1_CONTENT_TYPE: &str = "application/x-protobuf";
pub const V1_PROTO: &str = "prometheus.WriteRequest";
pub const V2_PROTO: &str = "io.prometheus.write.v2.Request";
const V2_CONTENT_TYPE: &str = "application/x-protobuf;proto=io.prometheus.write.v2.Request";
const VERSION_HEADER: HeaderName = HeaderName::from_static("x-prometheus-remote-write-version");
/// The stream identifier that opens snappy's *framing* format. Remote write
/// uses the block format; a body in the other one could be read
/// differently by a receiver that sniffs for it.
const SNAPPY_FRAMED_STREAM: &[u8] = b"\xff\x06\x00\x00sNaPpY";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RemoteWriteError {
    /// 415: what the 2.0 spec has a receiver answer a message it does not
    /// read (a sender may fall back to 1.0 on it).
    #[error("unsupported remote-write content: {0}")]
    Unsupported(String),
    #[error("remote-write body decompresses to {size} bytes, more than {limit}")]
    TooLarge { size: u64, limit: u64 },
    #[error("cannot decode remote-write body: {0}")]
    Malformed(String),
    #[error("series {0}")]
    ForeignLabel(#[from] ForeignLabel),
    /// Our failure, not the body's: 503, the sender keeps the data.
    #[error("cannot compress the rewritten body: {0}")]
    Compress(String),
    /// 400: receivers disagree on a series naming one label twice
    /// (Prometheus 2.x fails the request with 500, which senders retry
    /// forever; 3.x drops the series and answers 1.0 with 204; Mimir 400),
    /// so no answer passed on could mean the same to every sender.
    #[error("series {series} has the label {name:?} twice")]
    RepeatedLabel { name: String, series: String },
    /// 400: a field the declared schema does not define where a receiver
    /// reading the body as the other version would find series.
    #[error(
        "remote write {declared} {message}: field {tag} (wire type {wire_type}) is not in its schema{other}; \
         refused so that no receiver reading the body as another version finds series the proxy did not check"
    )]
    UnexpectedField {
        declared: &'static str,
        message: &'static str,
        tag: u32,
        wire_type: u8,
        /// What the field is in the other version, if anything.
        other: &'static str,
    },
}

impl From<WireError> for RemoteWriteError {
    fn from(e: WireError) -> Self {
        Self::Malformed(e.to_string())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// Reads the headers a receiver picks its decoder by, as one decision: the
/// remote-write version (`Content-Type`) and that the body is snappy
/// (`Content-Encoding`; absent means snappy, as every receiver assumes).
/// Media types and codings are case-insensitive (RFC 9110); parameters are
/// read strictly: exactly `;proto=<message>` or none. Anything else, and a
/// repeated header (receivers differ on which copy they read), is 415.
pub fn read_headers(headers: &HeaderMap) -> Result<Version, RemoteWriteError> {
    let version = version_of(headers)?;
    match single_header(headers, &header::CONTENT_ENCODING)? {
        None => Ok(version),
        Some(coding) if coding.eq_ignore_ascii_case("snappy") => Ok(version),
        Some(coding) => Err(RemoteWriteError::Unsupported(format!(
            "content encoding {coding:?}: remote-write bodies are snappy-compressed (block format)"
        ))),
    }
}

/// The version a `Content-Type` declares. A receiver that reads it
/// differently from us would decode 2.0 as 1.0 (and drop the data while
/// answering 2xx), hence the strict reading of parameters.
fn version_of(headers: &HeaderMap) -> Result<Version, RemoteWriteError> {
    let Some(value) = single_header(headers, &header::CONTENT_TYPE)? else {
        return Ok(Version::V1); // Prometheus 2.x senders before 2.0 support
    };
    let (media, params) = value.split_once(';').unwrap_or((value, ""));
    if !media.eq_ignore_ascii_case(V1_CONTENT_TYPE) {
        return Err(RemoteWriteError::Unsupported(format!(
            "content type {value:?}"
        )));
    }
    match params.strip_prefix("proto=") {
        None if params.is_empty() => Ok(Version::V1),
        Some(V1_PROTO) => Ok(Version::V1),
        Some(V2_PROTO) => Ok(Version::V2),
        _ => Err(RemoteWriteError::Unsupported(format!(
            "content type {value:?}"
        ))),
    }
}

/// Whether the sender meant a 2.0 request, by any spelling of either header
/// that says so: a body passed through unread (header mode) is judged by
/// what its sender will expect of the answer, not by one receiver's reading
/// of the headers.
pub fn sender_expects_v2(headers: &HeaderMap) -> bool {
    let v2 = V2_PROTO.as_bytes();
    let content_type_says = headers.get_all(header::CONTENT_TYPE).iter().any(|value| {
        value
            .as_bytes()
            .windows(v2.len())
            .any(|w| w.eq_ignore_ascii_case(v2))
    });
    let version_says = headers
        .get_all(VERSION_HEADER)
        .iter()
        .any(|value| value.as_bytes().trim_ascii().starts_with(b"2"));
    content_type_says || version_says
}

/// The one value of a header, if any; a repeated one is 415.
fn single_header<'h>(
    headers: &'h HeaderMap,
    name: &HeaderName,
) -> Result<Option<&'h str>, RemoteWriteError> {
    crate::http::headers::single_value(headers, name).map_err(RemoteWriteError::Unsupported)
}

/// Replaces the headers a receiver decodes by with the canonical spelling
/// of what the proxy read and checked: a receiver compares the media type
/// case-sensitively (Prometheus 3 does), or would take a missing coding or
/// version header differently from us.
pub fn set_upstream_headers(version: Version, headers: &mut HeaderMap) {
    let (content_type, protocol) = match version {
        Version::V1 => (V1_CONTENT_TYPE, "0.1.0"),
        Version::V2 => (V2_CONTENT_TYPE, "2.0.0"),
    };
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static("snappy"));
    headers.insert(VERSION_HEADER, HeaderValue::from_static(protocol));
}

/// What a rewrite did, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub series: u64,
    pub samples: u64,
    pub added: u64,
    pub overwritten: u64,
    /// Fields inside a series that neither schema defines, not forwarded.
    pub dropped_fields: u64,
}

/// Scratch buffers kept per thread: allocating the decompressed and
/// rewritten bodies (hundreds of KiB) per request cost a page fault per
/// 4 KiB, nearly half the proxy's CPU on this path.
struct Scratch {
    decompressed: Vec<u8>,
    rewritten: Vec<u8>,
    /// The encoder's output, sized for the worst case: a fresh zeroed
    /// buffer per request cost more than compressing into it (snappy
    /// writes only into initialised memory).
    recompressed: Vec<u8>,
    /// Keeps its hash table between requests.
    encoder: snap::raw::Encoder,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch {
        decompressed: Vec::new(),
        rewritten: Vec::new(),
        recompressed: Vec::new(),
        encoder: snap::raw::Encoder::new(),
    });
}

/// The size a snappy body declares it decompresses to, which is all its
/// decompression can write (0 if the header is unreadable: the rewrite
/// refuses such a body before any work).
pub fn declared_size(compressed: &[u8]) -> u64 {
    snap::raw::decompress_len(compressed).map_or(0, |size| size as u64)
}

/// How a rewritten body is written back into snappy's block format
/// (`metrics.remote_write_forward_compression`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Output {
    /// Compressed, as senders write it.
    #[default]
    Compressed,
    /// Uncompressed, as literals ([`literal`]): no compression work, about
    /// 4.5× the bytes on the upstream link.
    Literal,
}

/// Decompresses (size checked first), rewrites and writes back in the
/// block format (`output`) a body of the `version` [`read_headers`] found.
pub fn rewrite_body(
    version: Version,
    compressed: &[u8],
    tenant: &TenantLabel<'_>,
    max_decompressed: u64,
    output: Output,
) -> Result<(Rewritten, Stats), RemoteWriteError> {
    if compressed.starts_with(SNAPPY_FRAMED_STREAM) {
        return Err(RemoteWriteError::Malformed(
            "snappy framing format; remote-write bodies use the block format".into(),
        ));
    }
    let size = snap::raw::decompress_len(compressed)
        .map_err(|e| RemoteWriteError::Malformed(format!("snappy: {e}")))? as u64;
    if size > max_decompressed {
        return Err(RemoteWriteError::TooLarge {
            size,
            limit: max_decompressed,
        });
    }
    SCRATCH.with(|scratch| {
        let scratch = &mut *scratch.borrow_mut();
        let result = rewrite_in(version, compressed, size as usize, tenant, output, scratch);
        release_large_scratch([
            &mut scratch.decompressed,
            &mut scratch.rewritten,
            &mut scratch.recompressed,
        ]);
        result
    })
}

fn rewrite_in(
    version: Version,
    compressed: &[u8],
    size: usize,
    tenant: &TenantLabel<'_>,
    output: Output,
    scratch: &mut Scratch,
) -> Result<(Rewritten, Stats), RemoteWriteError> {
    let snappy = |e: snap::Error| RemoteWriteError::Malformed(format!("snappy: {e}"));
    scratch.decompressed.resize(size, 0);
    let n = snap::raw::Decoder::new()
        .decompress(compressed, &mut scratch.decompressed)
        .map_err(snappy)?;
    scratch.rewritten.clear();
    let stats = rewrite_into(
        version,
        &scratch.decompressed[..n],
        tenant,
        &mut scratch.rewritten,
    )?;
    if scratch.rewritten == scratch.decompressed[..n] {
        return Ok((Rewritten::Unchanged, stats));
    }
    if output == Output::Literal {
        let body = literal::encode(&scratch.rewritten).ok_or_else(|| {
            RemoteWriteError::Compress("snappy: past the block format's 4 GiB".into())
        })?;
        return Ok((Rewritten::Body(body), stats));
    }
    let bound = snap::raw::max_compress_len(scratch.rewritten.len());
    if scratch.recompressed.len() < bound {
        scratch.recompressed.resize(bound, 0);
    }
    let n = scratch
        .encoder
        .compress(&scratch.rewritten, &mut scratch.recompressed[..bound])
        .map_err(|e| RemoteWriteError::Compress(format!("snappy: {e}")))?;
    Ok((Rewritten::Body(scratch.recompressed[..n].to_vec()), stats))
}

/// Rewrites a decompressed message.
pub fn rewrite(
    version: Version,
    message: &[u8],
    tenant: &TenantLabel<'_>,
) -> Result<(Vec<u8>, Stats), RemoteWriteError> {
    let mut out = Vec::new();
    let stats = rewrite_into(version, message, tenant, &mut out)?;
    Ok((out, stats))
}

/// Rewrites a decompressed message, appending to `out`.
fn rewrite_into(
    version: Version,
    message: &[u8],
    tenant: &TenantLabel<'_>,
    out: &mut Vec<u8>,
) -> Result<Stats, RemoteWriteError> {
    out.reserve(message.len() + message.len() / 8 + 64);
    let mut stats = Stats::default();
    match version {
        Version::V1 => rewrite_v1(message, tenant, &mut stats, out)?,
        Version::V2 => rewrite_v2(message, tenant, &mut stats, out)?,
    }
    Ok(stats)
}

fn count(decision: &Decision<'_>, stats: &mut Stats) {
    match decision {
        Decision::Add => stats.added += 1,
        Decision::Overwrite => stats.overwritten += 1,
        Decision::Keep(_) => {}
    }
}

/// The labels of a 1.0 series as text, for an error message.
fn describe_v1(series: &[u8]) -> String {
    let labels = fields(series)
        .filter_map(Result::ok)
        .filter(|f| (f.tag, f.wire_type) == (1, LEN))
        .filter_map(|f| protowire::label_pair(f.payload).ok());
    describe_series(labels)
}

// === 1.0: WriteRequest { repeated TimeSeries timeseries = 1; ... } ===

/// A label of a series: its name, and where the whole field lies in the series.
type LabelField<'m> = (&'m [u8], std::ops::Range<usize>);

/// Buffers reused for every series of a request: a batch of thousands of
/// series must not allocate per series.
struct V1Scratch<'m> {
    labels: Vec<LabelField<'m>>,
    others: Vec<&'m [u8]>,
    /// The tenant label encoded once per owned value (`Label` messages).
    encoded: Vec<Vec<u8>>,
}

fn rewrite_v1(
    message: &[u8],
    tenant: &TenantLabel<'_>,
    stats: &mut Stats,
    out: &mut Vec<u8>,
) -> Result<(), RemoteWriteError> {
    let name = tenant.name.as_bytes();
    let encoded = tenant
        .owned
        .iter()
        .map(|value| {
            let mut label = Vec::with_capacity(name.len() + value.len() + 4);
            protowire::write_len_field(&mut label, 1, name);
            protowire::write_len_field(&mut label, 2, value.as_bytes());
            label
        })
        .collect();
    let mut scratch = V1Scratch {
        labels: Vec::with_capacity(32),
        others: Vec::with_capacity(4),
        encoded,
    };
    for field in fields(message) {
        let field = field?;
        match (field.tag, field.wire_type) {
            (1, LEN) => rewrite_series_v1(field.payload, tenant, stats, &mut scratch, out)?,
            // MetricMetadata: a metric family's type, help and unit; no labels.
            (3, LEN) => out.extend_from_slice(field.raw),
            _ => return Err(unexpected_top_level(Version::V1, &field)),
        }
    }
    Ok(())
}

/// A top-level field outside the declared schema: refused, because a
/// receiver reading the body as the other version could find series in it.
fn unexpected_top_level(declared: Version, field: &protowire::Field<'_>) -> RemoteWriteError {
    let (declared, message) = match declared {
        Version::V1 => ("1.0", "WriteRequest"),
        Version::V2 => ("2.0", "Request"),
    };
    let other = match (declared, field.tag) {
        ("1.0", 4) => " (it is 2.0's symbols)",
        ("1.0", 5) => " (it is 2.0's timeseries)",
        ("2.0", 1) => " (it is 1.0's timeseries)",
        ("2.0", 3) => " (it is 1.0's metadata)",
        _ => "",
    };
    RemoteWriteError::UnexpectedField {
        declared,
        message,
        tag: field.tag,
        wire_type: field.wire_type,
        other,
    }
}

/// What happens to a field inside a series, by its place in the schema.
fn series_field(
    message: &'static str,
    known: std::ops::RangeInclusive<u32>,
    field: &protowire::Field<'_>,
    stats: &mut Stats,
) -> Result<(), RemoteWriteError> {
    if known.contains(&field.tag) {
        // A decoder fails on it, or (a lenient one) reads something else.
        return Err(RemoteWriteError::Malformed(format!(
            "{message} field {} has wire type {}, not the schema's",
            field.tag, field.wire_type
        )));
    }
    // Not in this schema: no check has read it, so it is not forwarded.
    stats.dropped_fields += 1;
    Ok(())
}

/// TimeSeries { repeated Label labels = 1; repeated Sample samples = 2; ... },
/// written to `out` as a whole `timeseries` field.
fn rewrite_series_v1<'m>(
    series: &'m [u8],
    tenant: &TenantLabel<'_>,
    stats: &mut Stats,
    scratch: &mut V1Scratch<'m>,
    out: &mut Vec<u8>,
) -> Result<(), RemoteWriteError> {
    stats.series += 1;
    scratch.labels.clear();
    scratch.others.clear();
    let name = tenant.name.as_bytes();
    let mut found = Found::Nothing;
    let offset = |raw: &[u8]| raw.as_ptr() as usize - series.as_ptr() as usize;
    let mut on_label = |label: protowire::SeriesLabel<'m>| {
        if label.name == name {
            found = found.and(label.value);
        } else {
            let start = offset(label.raw);
            scratch
                .labels
                .push((label.name, start..start + label.raw.len()));
        }
    };
    let mut fields = fields(series);
    loop {
        // Labels as encoders lay them out are read in one step.
        if let Some(label) = fields.next_short_label() {
            on_label(label);
            continue;
        }
        let Some(field) = fields.next() else { break };
        let field = field?;
        match (field.tag, field.wire_type) {
            (1, LEN) => {
                let label = protowire::label_name(field.payload)?;
                // Only the tenant label's value is ever needed.
                let value = match label == name {
                    true => protowire::label_pair(field.payload)?.1,
                    false => b"",
                };
                on_label(protowire::SeriesLabel {
                    name: label,
                    value,
                    raw: field.raw,
                });
            }
            (2, LEN) => {
                stats.samples += 1;
                scratch.others.push(field.raw);
            }
            // Exemplars (their labels are not the series'), histograms.
            (3 | 4, LEN) => scratch.others.push(field.raw),
            _ => series_field("1.0 TimeSeries", 1..=4, &field, stats)?,
        }
    }
    let decision = decide(found, tenant, || describe_v1(series))?;
    count(&decision, stats);
    let owned_index = match decision {
        Decision::Keep(value) => tenant.owned.iter().position(|o| o.as_bytes() == value),
        Decision::Add | Decision::Overwrite => Some(0),
    }
    .unwrap_or(0);
    let ours: &[u8] = &scratch.encoded[owned_index];

    // Senders sort labels; sort only when one did not (or named a label
    // twice, found once sorted), then insert ours.
    if !scratch
        .labels
        .is_sorted_by(|a, b| name_order(a.0, b.0).is_lt())
    {
        scratch.labels.sort_by(|a, b| name_order(a.0, b.0));
        refuse_repeated_name(scratch.labels.iter().map(|l| l.0), || describe_v1(series))?;
    }
    let at = scratch
        .labels
        .partition_point(|l| name_order(l.0, name).is_lt());

    let size: usize = scratch.labels.iter().map(|l| l.1.len()).sum::<usize>()
        + protowire::len_field_size(ours.len())
        + scratch.others.iter().map(|raw| raw.len()).sum::<usize>();
    protowire::write_field_header(out, 1, size);
    copy_runs(out, series, &scratch.labels[..at]);
    protowire::write_len_field(out, 1, ours);
    copy_runs(out, series, &scratch.labels[at..]);
    for raw in &scratch.others {
        out.extend_from_slice(raw);
    }
    Ok(())
}

/// The byte order of two label names (`<[u8]>::cmp`), deciding most pairs
/// by their first eight bytes as one integer: the sort check compares every
/// neighbouring pair of every series, and a `memcmp` call per pair was a
/// tenth of the rewrite.
#[inline]
fn name_order(a: &[u8], b: &[u8]) -> Ordering {
    // Zero-padded: a name that is a prefix of the other within eight bytes
    // compares equal or less here, and equal goes to the full comparison.
    let head = |name: &[u8]| match name.first_chunk::<8>() {
        Some(eight) => u64::from_be_bytes(*eight),
        None => name
            .iter()
            .enumerate()
            .fold(0, |head, (i, &b)| head | u64::from(b) << (56 - 8 * i)),
    };
    head(a).cmp(&head(b)).then_with(|| a.cmp(b))
}

/// Copies label fields verbatim, adjacent ones in a single copy: a sorted
/// series' labels usually go out in two copies, before and after ours.
fn copy_runs(out: &mut Vec<u8>, series: &[u8], labels: &[LabelField<'_>]) {
    let mut run: Option<std::ops::Range<usize>> = None;
    for (_, range) in labels {
        run = match run {
            Some(r) if r.end == range.start => Some(r.start..range.end),
            Some(r) => {
                out.extend_from_slice(&series[r]);
                Some(range.clone())
            }
            None => Some(range.clone()),
        };
    }
    if let Some(r) = run {
        out.extend_from_slice(&series[r]);
    }
}

// === 2.0: Request { repeated string symbols = 4; repeated TimeSeries timeseries = 5; } ===

/// The symbols table, and the symbols this rewrite appends to it.
struct Symbols<'a> {
    all: Vec<&'a [u8]>,
    sent: usize,
}

impl<'a> Symbols<'a> {
    fn find_or_append(&mut self, symbol: &'a [u8]) -> u32 {
        match self.all.iter().position(|s| *s == symbol) {
            Some(index) => index as u32,
            None => self.append(symbol),
        }
    }

    fn append(&mut self, symbol: &'a [u8]) -> u32 {
        self.all.push(symbol);
        (self.all.len() - 1) as u32
    }

    fn resolve(&self, reference: u32) -> &'a [u8] {
        self.all[reference as usize]
    }
}

fn rewrite_v2<'a>(
    message: &'a [u8],
    tenant: &TenantLabel<'a>,
    stats: &mut Stats,
    out: &mut Vec<u8>,
) -> Result<(), RemoteWriteError> {
    // Series may come before symbols on the wire: read all symbols first,
    // and refuse any field 2.0 does not define before writing anything.
    let mut all = Vec::new();
    for field in fields(message) {
        let field = field?;
        match (field.tag, field.wire_type) {
            (4, LEN) => all.push(field.payload),
            (5, LEN) => {}
            _ => return Err(unexpected_top_level(Version::V2, &field)),
        }
    }
    let name = tenant.name.as_bytes();
    // Where each of the sender's symbols sorts against the tenant label's
    // name, found once a request: each label then asks a table, not a
    // comparison of names, whether it is ours or goes after ours.
    let against_ours: Vec<Ordering> = all.iter().map(|s| name_order(s, name)).collect();
    let sent = all.len();
    let mut symbols = Symbols { all, sent };
    // The sender's first symbol of the name, found in the same look.
    let name_ref = match against_ours.iter().position(|o| o.is_eq()) {
        Some(index) => index as u32,
        None => symbols.append(name),
    };

    let mut scratch = V2Scratch {
        against_ours,
        ..V2Scratch::default()
    };
    let mut series_buf = Vec::new();
    for field in fields(message) {
        let field = field?;
        if (field.tag, field.wire_type) == (5, LEN) {
            series_buf.clear();
            rewrite_series_v2(
                field.payload,
                tenant,
                name_ref,
                &mut symbols,
                stats,
                &mut scratch,
                &mut series_buf,
            )?;
            protowire::write_len_field(out, 5, &series_buf);
        } else {
            out.extend_from_slice(field.raw);
        }
    }
    // Appended after every symbol the sender wrote, so existing references
    // (labels, exemplars, metadata) keep their meaning.
    for symbol in &symbols.all[symbols.sent..] {
        protowire::write_len_field(out, 4, symbol);
    }
    Ok(())
}

/// Buffers reused for every series of a 2.0 request, as 1.0's are.
#[derive(Default)]
struct V2Scratch<'m> {
    /// The series' label references, (name, value), as read.
    pairs: Vec<(u32, u32)>,
    /// Where each of `pairs` starts in the one packed field it came from,
    /// read only when the series sent one (a snappy block decompresses to
    /// less than 4 GiB: an offset fits).
    starts: Vec<u32>,
    others: Vec<&'m [u8]>,
    packed: Vec<u8>,
    /// How each of the sender's symbols sorts against the tenant label's
    /// name (equal: it spells it).
    against_ours: Vec<Ordering>,
    /// The symbol of the tenant's first value, once a series needed it:
    /// looked up (or appended) once a request, not once a series.
    default_value: Option<u32>,
}

#[cfg(test)]
thread_local! {
    /// Series whose references [`splice_sorted_refs`] copied: the general
    /// path writes the same bytes, so only this count lets a test see which
    /// path a series took (the splice is what makes 2.0 cheap; losing it
    /// would be silent).
    static SPLICED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How a series wrote its label references: as one packed field with
/// every varint in as few bytes as its value needs (what every encoder
/// writes), or otherwise.
enum RefsLayout<'m> {
    None,
    OnePacked(&'m [u8]),
    Other,
}

/// TimeSeries { repeated uint32 labels_refs = 1 (packed); samples = 2; ... }
fn rewrite_series_v2<'a>(
    series: &'a [u8],
    tenant: &TenantLabel<'a>,
    name_ref: u32,
    symbols: &mut Symbols<'a>,
    stats: &mut Stats,
    scratch: &mut V2Scratch<'a>,
    out: &mut Vec<u8>,
) -> Result<(), RemoteWriteError> {
    stats.series += 1;
    let V2Scratch {
        pairs,
        starts,
        others,
        packed,
        against_ours,
        default_value,
    } = scratch;
    pairs.clear();
    starts.clear();
    others.clear();
    let mut layout = RefsLayout::None;
    // A name whose value is in the next field: a sender may split the
    // references across fields anywhere, even inside a pair.
    let mut name_waiting = None;
    for field in fields(series) {
        let field = field?;
        match (field.tag, field.wire_type) {
            (1, LEN) => {
                let shortest = read_packed_refs(field.payload, &mut name_waiting, pairs, starts)?;
                layout = match layout {
                    RefsLayout::None if shortest => RefsLayout::OnePacked(field.payload),
                    _ => RefsLayout::Other,
                };
            }
            (1, VARINT) => {
                let reference = read_ref(&mut &field.payload[..])?.0;
                match name_waiting.take() {
                    Some(name) => pairs.push((name, reference)),
                    None => name_waiting = Some(reference),
                }
                layout = RefsLayout::Other;
            }
            (2, LEN) => {
                stats.samples += 1;
                others.push(field.raw);
            }
            // Histograms, exemplars (labels of their own, not the
            // series'), metadata, created timestamp.
            (3..=5, LEN) | (6, VARINT) => others.push(field.raw),
            _ => series_field("2.0 TimeSeries", 1..=6, &field, stats)?,
        }
    }
    if name_waiting.is_some() {
        return Err(RemoteWriteError::Malformed(
            "odd number of label references".into(),
        ));
    }
    let sent = symbols.sent as u32;
    if pairs.iter().any(|&(n, v)| n.max(v) >= sent) {
        return Err(RemoteWriteError::Malformed(
            "label reference outside the symbols table".into(),
        ));
    }
    let ours = |(n, _): &(u32, u32)| against_ours[*n as usize].is_eq();
    let found = pairs
        .iter()
        .filter(|p| ours(p))
        .fold(Found::Nothing, |found, (_, v)| {
            found.and(symbols.resolve(*v))
        });
    let describe = |pairs: &[(u32, u32)], symbols: &Symbols<'_>| {
        describe_series(
            pairs
                .iter()
                .map(|(n, v)| (symbols.resolve(*n), symbols.resolve(*v))),
        )
    };
    let decision = decide(found, tenant, || describe(pairs, symbols))?;
    count(&decision, stats);
    let value_ref = match decision {
        // A reference the series already makes to that value.
        Decision::Keep(value) => match pairs
            .iter()
            .find(|p| ours(p) && symbols.resolve(p.1) == value)
        {
            Some(&(_, v)) => v,
            None => symbols.find_or_append(value),
        },
        Decision::Add | Decision::Overwrite => {
            *default_value.get_or_insert_with(|| symbols.find_or_append(tenant.default_value()))
        }
    };
    // Senders sort labels: sort only when one did not (or named a label
    // twice, found once sorted), else put ours in its place.
    let order =
        |a: &(u32, u32), b: &(u32, u32)| name_order(symbols.resolve(a.0), symbols.resolve(b.0));
    let sorted = pairs
        .iter()
        .filter(|p| !ours(p))
        .is_sorted_by(|a, b| order(a, b).is_lt());
    let before_ours = |p: &(u32, u32)| !against_ours[p.0 as usize].is_lt();
    packed.clear();
    match layout {
        // As every encoder writes them: the sender's bytes copied in runs,
        // not each reference written again.
        RefsLayout::OnePacked(payload) if sorted => {
            #[cfg(test)]
            SPLICED.with(|n| n.set(n.get() + 1));
            splice_sorted_refs(
                payload,
                starts,
                pairs,
                ours,
                before_ours,
                (name_ref, value_ref),
                packed,
            );
            #[cfg(debug_assertions)]
            {
                // The splice writes what encoding the sorted pairs writes.
                pairs.retain(|p| !ours(p));
                let at = pairs.partition_point(|p| !before_ours(p));
                pairs.insert(at, (name_ref, value_ref));
                let mut encoded = Vec::new();
                write_refs(pairs, &mut encoded);
                debug_assert_eq!(*packed, encoded);
            }
        }
        _ => {
            pairs.retain(|p| !ours(p));
            if sorted {
                let at = pairs.partition_point(|p| !before_ours(p));
                pairs.insert(at, (name_ref, value_ref));
            } else {
                pairs.push((name_ref, value_ref));
                pairs.sort_by(order);
                refuse_repeated_name(pairs.iter().map(|(n, _)| symbols.resolve(*n)), || {
                    describe(pairs, symbols)
                })?;
            }
            write_refs(pairs, packed);
        }
    }
    protowire::write_len_field(out, 1, packed);
    for raw in others.iter() {
        out.extend_from_slice(raw);
    }
    Ok(())
}

/// Writes label reference pairs as a packed field's payload.
fn write_refs(pairs: &[(u32, u32)], packed: &mut Vec<u8>) {
    for &(n, v) in pairs {
        protowire::write_varint(packed, u64::from(n));
        protowire::write_varint(packed, u64::from(v));
    }
}

/// A sorted series' packed references, copied from the sender's bytes in
/// runs: its pairs of the tenant label left out, `new` written before the
/// first other pair `before_ours` holds for (or at the end). The sender's
/// varints are each in their shortest form (checked by the caller), so
/// this writes the bytes [`write_refs`] would write for the same pairs.
fn splice_sorted_refs(
    payload: &[u8],
    starts: &[u32],
    pairs: &[(u32, u32)],
    ours: impl Fn(&(u32, u32)) -> bool,
    before_ours: impl Fn(&(u32, u32)) -> bool,
    new: (u32, u32),
    packed: &mut Vec<u8>,
) {
    let start_of = |i: usize| starts.get(i).map_or(payload.len(), |s| *s as usize);
    let (mut run, mut written) = (0, false);
    for (i, pair) in pairs.iter().enumerate() {
        if ours(pair) {
            packed.extend_from_slice(&payload[run..start_of(i)]);
            run = start_of(i + 1);
        } else if !written && before_ours(pair) {
            packed.extend_from_slice(&payload[run..start_of(i)]);
            run = start_of(i);
            write_refs(&[new], packed);
            written = true;
        }
    }
    packed.extend_from_slice(&payload[run..]);
    if !written {
        write_refs(&[new], packed);
    }
}

/// Refuses a series whose `names`, sorted, hold one name twice (the
/// tenant label's repeats are resolved before: it leaves once).
fn refuse_repeated_name<'n>(
    mut names: impl Iterator<Item = &'n [u8]>,
    describe: impl FnOnce() -> String,
) -> Result<(), RemoteWriteError> {
    let Some(mut previous) = names.next() else {
        return Ok(());
    };
    for name in names {
        if name == previous {
            return Err(RemoteWriteError::RepeatedLabel {
                name: String::from_utf8_lossy(name).into_owned(),
                series: describe(),
            });
        }
        previous = name;
    }
    Ok(())
}

/// Reads a packed field's label references into `pairs`, completing a
/// pair whose name came before (`name_waiting`, left holding a name the
/// field ends on), and where each pair starts into `starts`; whether every
/// varint took as few bytes as its value needs.
fn read_packed_refs(
    payload: &[u8],
    name_waiting: &mut Option<u32>,
    pairs: &mut Vec<(u32, u32)>,
    starts: &mut Vec<u32>,
) -> Result<bool, RemoteWriteError> {
    let mut shortest = true;
    let mut at = 0;
    if let Some(name) = name_waiting.take_if(|_| !payload.is_empty()) {
        pairs.push((name, read_packed_ref(payload, &mut at, &mut shortest)?));
    }
    while at < payload.len() {
        let start = at as u32;
        let name = read_packed_ref(payload, &mut at, &mut shortest)?;
        if at == payload.len() {
            *name_waiting = Some(name);
            break;
        }
        starts.push(start);
        pairs.push((name, read_packed_ref(payload, &mut at, &mut shortest)?));
    }
    Ok(shortest)
}

/// The reference at `payload[*at..]`, `at` moved past it; one or two bytes
/// (the first 16,384 symbols) read inline.
#[inline(always)]
fn read_packed_ref(
    payload: &[u8],
    at: &mut usize,
    shortest: &mut bool,
) -> Result<u32, RemoteWriteError> {
    match payload[*at..] {
        [a, ..] if a < 0x80 => {
            *at += 1;
            Ok(u32::from(a))
        }
        [a, b, ..] if b < 0x80 => {
            *shortest &= b != 0;
            *at += 2;
            Ok(u32::from(a & 0x7f) | u32::from(b) << 7)
        }
        _ => {
            let mut rest = &payload[*at..];
            let (reference, short) = read_ref(&mut rest)?;
            *shortest &= short;
            *at = payload.len() - rest.len();
            Ok(reference)
        }
    }
}

/// A label reference, and whether its varint was in its shortest form.
fn read_ref(buf: &mut &[u8]) -> Result<(u32, bool), RemoteWriteError> {
    let before = buf.len();
    let value = protowire::read_varint(buf)?;
    let value = u32::try_from(value)
        .map_err(|_| RemoteWriteError::Malformed("label reference too large".into()))?;
    let shortest = before - buf.len() == protowire::varint_size(u64::from(value));
    Ok((value, shortest))
}

#[cfg(test)]
mod tests;
