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

use super::tenant_label::{Decision, ForeignLabel, TenantLabel};
use super::{release_large_scratch, Rewritten};
use crate::enforce::protowire::{self, WireError};

mod headers;
mod literal;
mod v1;
mod v2;

pub use headers::{read_headers, sender_expects_v2, set_upstream_headers};

#[cfg(test)]
thread_local! {
    /// Series rewritten by a splice (1.0's series as encoders lay them out,
    /// 2.0's references copied in runs): the general path writes the same
    /// bytes, so only this count lets a test see which path a series took
    /// (the splice is what makes the rewrite cheap; losing it would be
    /// silent).
    static SPLICED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

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

/// Whether a rewrite wrote anything: what goes out as it came is not
/// copied (a body that needs no change is forwarded as the sender
/// compressed it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Written {
    Unchanged,
    Changed,
}

impl Written {
    fn of(unchanged: bool) -> Self {
        match unchanged {
            true => Self::Unchanged,
            false => Self::Changed,
        }
    }
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
    let (stats, written) = rewrite_into(
        version,
        &scratch.decompressed[..n],
        tenant,
        &mut scratch.rewritten,
    )?;
    if written == Written::Unchanged {
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
    let (stats, written) = rewrite_into(version, message, tenant, &mut out)?;
    if written == Written::Unchanged {
        out.extend_from_slice(message);
    }
    Ok((out, stats))
}

/// Rewrites a decompressed message, appending to `out` unless it goes out
/// as it came.
fn rewrite_into(
    version: Version,
    message: &[u8],
    tenant: &TenantLabel<'_>,
    out: &mut Vec<u8>,
) -> Result<(Stats, Written), RemoteWriteError> {
    out.reserve(message.len() + message.len() / 8 + 64);
    let mut stats = Stats::default();
    let written = match version {
        Version::V1 => v1::rewrite(message, tenant, &mut stats, out)?,
        Version::V2 => v2::rewrite(message, tenant, &mut stats, out)?,
    };
    Ok((stats, written))
}

fn count(decision: &Decision<'_>, stats: &mut Stats) {
    match decision {
        Decision::Add => stats.added += 1,
        Decision::Overwrite => stats.overwritten += 1,
        Decision::Keep(_) => {}
    }
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

/// The byte order of two label names (`<[u8]>::cmp`), deciding most pairs
/// by their first eight bytes as one integer: the sort check compares every
/// neighbouring pair of every series, and a `memcmp` call per pair was a
/// tenth of the rewrite.
#[inline]
fn name_order(a: &[u8], b: &[u8]) -> Ordering {
    NameKey::of(a).order(&NameKey::of(b))
}

/// A label name and its first eight bytes as one integer, for a name
/// compared more than once ([`name_order`]).
#[derive(Clone, Copy)]
struct NameKey<'n> {
    head: u64,
    name: &'n [u8],
}

impl<'n> NameKey<'n> {
    #[inline]
    fn of(name: &'n [u8]) -> Self {
        // Zero-padded: a name that is a prefix of the other within eight
        // bytes compares equal or less here, and equal goes to the full
        // comparison.
        let head = match name.first_chunk::<8>() {
            Some(eight) => u64::from_be_bytes(*eight),
            None => name
                .iter()
                .enumerate()
                .fold(0, |head, (i, &b)| head | u64::from(b) << (56 - 8 * i)),
        };
        Self { head, name }
    }

    #[inline]
    fn order(&self, other: &Self) -> Ordering {
        self.head
            .cmp(&other.head)
            .then_with(|| self.name.cmp(other.name))
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

#[cfg(test)]
mod tests;
