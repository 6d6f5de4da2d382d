//! Remote write 1.0: `prometheus.WriteRequest`, labels as name and value
//! strings in each series.

use std::cmp::Ordering;

use super::{
    count, name_order, refuse_repeated_name, series_field, unexpected_top_level, NameKey,
    RemoteWriteError, Stats, Version, Written,
};
use crate::enforce::prompb::readings::describe as describe_series;
use crate::enforce::protowire::{self, fields, LEN};
use crate::enforce::tenant_label::{decide, Decision, Found, TenantLabel};

/// The labels of a 1.0 series as text, for an error message.
fn describe(series: &[u8]) -> String {
    let labels = fields(series)
        .filter_map(Result::ok)
        .filter(|f| (f.tag, f.wire_type) == (1, LEN))
        .filter_map(|f| protowire::label_pair(f.payload).ok());
    describe_series(labels)
}

// WriteRequest { repeated TimeSeries timeseries = 1; ... }

/// A label of a series: its name, and where the whole field lies in the series.
type LabelField<'m> = (&'m [u8], std::ops::Range<usize>);

/// Buffers reused for every series of a request: a batch of thousands of
/// series must not allocate per series.
struct V1Scratch<'m> {
    labels: Vec<LabelField<'m>>,
    others: Vec<&'m [u8]>,
    /// The tenant label encoded once per owned value, as a whole `labels`
    /// field of a series.
    encoded: Vec<Vec<u8>>,
}

pub(super) fn rewrite(
    message: &[u8],
    tenant: &TenantLabel<'_>,
    stats: &mut Stats,
    out: &mut Vec<u8>,
) -> Result<Written, RemoteWriteError> {
    let name = tenant.name.as_bytes();
    let encoded = tenant
        .owned
        .iter()
        .map(|value| {
            let mut label = Vec::with_capacity(name.len() + value.len() + 4);
            protowire::write_len_field(&mut label, 1, name);
            protowire::write_len_field(&mut label, 2, value.as_bytes());
            let mut field = Vec::with_capacity(label.len() + 3);
            protowire::write_len_field(&mut field, 1, &label);
            field
        })
        .collect();
    let mut scratch = V1Scratch {
        labels: Vec::with_capacity(32),
        others: Vec::with_capacity(4),
        encoded,
    };
    // Fields go out as they came until one changes: `message[owed..]` up
    // to the field being read is owed to `out`, copied only when a field
    // after it changes (or at the end), so a body that needs no change is
    // never copied.
    let mut owed = 0;
    for field in fields(message) {
        let field = field?;
        match (field.tag, field.wire_type) {
            (1, LEN) => {
                let at = protowire::offset_in(message, field.raw);
                let series = Series {
                    raw: field.raw,
                    payload: field.payload,
                    owed: &message[owed..at],
                };
                if rewrite_series(series, tenant, stats, &mut scratch, out)? == Written::Changed {
                    owed = at + field.raw.len();
                }
            }
            // MetricMetadata: a metric family's type, help and unit; no
            // labels. Goes out as it came.
            (3, LEN) => {}
            _ => return Err(unexpected_top_level(Version::V1, &field)),
        }
    }
    if owed == 0 {
        // Every field went out as it came (a written field ends past 0).
        return Ok(Written::Unchanged);
    }
    out.extend_from_slice(&message[owed..]);
    Ok(Written::Changed)
}

/// A `timeseries` field of the request, and the bytes before it still owed
/// to the output.
#[derive(Clone, Copy)]
struct Series<'m> {
    /// The whole field, key and length included.
    raw: &'m [u8],
    payload: &'m [u8],
    owed: &'m [u8],
}

/// TimeSeries { repeated Label labels = 1; repeated Sample samples = 2; ... }:
/// nothing written if it goes out as it came, else the bytes owed before it
/// and it, rewritten, as a whole `timeseries` field.
fn rewrite_series<'m>(
    series: Series<'m>,
    tenant: &TenantLabel<'_>,
    stats: &mut Stats,
    scratch: &mut V1Scratch<'m>,
    out: &mut Vec<u8>,
) -> Result<Written, RemoteWriteError> {
    stats.series += 1;
    let Some(layout) = EncodersLayout::read(series.payload, tenant.name.as_bytes()) else {
        return rewrite_any_layout(series, tenant, stats, scratch, out);
    };
    #[cfg(test)]
    super::SPLICED.with(|n| n.set(n.get() + 1));
    stats.samples += layout.samples;
    let ours = leaving_label(
        layout.found,
        tenant,
        &scratch.encoded,
        series.payload,
        stats,
    )?;
    let (head, tail) = (
        &series.payload[..layout.splice.start],
        &series.payload[layout.splice.end..],
    );
    let size = head.len() + ours.len() + tail.len();
    // The same label in place, under a key and length written as we would.
    let unchanged = series.payload[layout.splice.clone()] == *ours
        && series.raw.len() == protowire::len_field_size(size);
    #[cfg(debug_assertions)]
    let written_from = out.len() + if unchanged { 0 } else { series.owed.len() };
    if !unchanged {
        out.extend_from_slice(series.owed);
        protowire::write_field_header(out, 1, size);
        out.extend_from_slice(head);
        out.extend_from_slice(ours);
        out.extend_from_slice(tail);
    }
    #[cfg(debug_assertions)]
    {
        // The general rewrite accepts the series and writes the same bytes,
        // or finds nothing to change either (its error is not passed on:
        // that would hide a splice of a series it refuses).
        let mut general = Vec::new();
        let whole = Series {
            owed: &[],
            ..series
        };
        let written =
            rewrite_any_layout(whole, tenant, &mut Stats::default(), scratch, &mut general);
        debug_assert_eq!(written, Ok(Written::of(unchanged)));
        debug_assert_eq!(out[written_from..], general[..]);
    }
    Ok(Written::of(unchanged))
}

/// A series as every encoder writes it: its labels first, each in the
/// short form ([`protowire::Fields::next_short_label`]) and their names
/// strictly increasing (so the tenant label's at most once), then only
/// samples, exemplars and histograms. Its rewrite is one splice: ours in
/// place of the tenant label, or where its name sorts, and every other byte
/// as it came (the general rewrite writes the same bytes, with more work:
/// every label kept aside, the order checked, the copies joined again).
struct EncodersLayout<'m> {
    /// The bytes ours replaces (none where the series had no tenant label).
    splice: std::ops::Range<usize>,
    found: Found<'m>,
    samples: u64,
}

impl<'m> EncodersLayout<'m> {
    /// `None` for a series laid out any other way, well formed or not: the
    /// general rewrite reads it again, and refuses what is malformed.
    fn read(series: &'m [u8], name: &[u8]) -> Option<Self> {
        let mut fields = fields(series);
        let ours = NameKey::of(name);
        let (mut previous, mut at) = (None::<NameKey>, 0);
        let (mut splice, mut found) = (None, Found::Nothing);
        while let Some(label) = fields.next_short_label() {
            let key = NameKey::of(label.name);
            if previous.is_some_and(|p| !p.order(&key).is_lt()) {
                return None;
            }
            previous = Some(key);
            let end = at + label.raw.len();
            // Once ours has its place, the order check says the rest sort after.
            if splice.is_none() {
                match key.order(&ours) {
                    Ordering::Less => {}
                    Ordering::Equal => (splice, found) = (Some(at..end), Found::Same(label.value)),
                    Ordering::Greater => splice = Some(at..at),
                }
            }
            at = end;
        }
        let mut samples = 0;
        for field in fields {
            match field.ok()? {
                field if field.wire_type != LEN => return None,
                field if field.tag == 2 => samples += 1,
                // Exemplars (their labels are not the series'), histograms.
                field if matches!(field.tag, 3 | 4) => {}
                _ => return None,
            }
        }
        Some(Self {
            splice: splice.unwrap_or(at..at),
            found,
            samples,
        })
    }
}

/// The tenant label a series leaves with, encoded: the policy applied to
/// what it `found` (and counted).
fn leaving_label<'e>(
    found: Found<'_>,
    tenant: &TenantLabel<'_>,
    encoded: &'e [Vec<u8>],
    series: &[u8],
    stats: &mut Stats,
) -> Result<&'e [u8], RemoteWriteError> {
    let decision = decide(found, tenant, || describe(series))?;
    count(&decision, stats);
    let owned_index = match decision {
        Decision::Keep(value) => tenant.owned.iter().position(|o| o.as_bytes() == value),
        Decision::Add | Decision::Overwrite => Some(0),
    }
    .unwrap_or(0);
    Ok(&encoded[owned_index])
}

/// The rewrite of a series laid out in any way: labels anywhere among its
/// other fields, in any order, in any encoding, a name repeated.
fn rewrite_any_layout<'m>(
    series: Series<'m>,
    tenant: &TenantLabel<'_>,
    stats: &mut Stats,
    scratch: &mut V1Scratch<'m>,
    out: &mut Vec<u8>,
) -> Result<Written, RemoteWriteError> {
    let Series {
        raw,
        payload: series,
        owed,
    } = series;
    scratch.labels.clear();
    scratch.others.clear();
    let name = tenant.name.as_bytes();
    let mut found = Found::Nothing;
    let offset = |raw: &[u8]| protowire::offset_in(series, raw);
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
    let ours = leaving_label(found, tenant, &scratch.encoded, series, stats)?;

    // Senders sort labels; sort only when one did not (or named a label
    // twice, found once sorted), then insert ours.
    if !scratch
        .labels
        .is_sorted_by(|a, b| name_order(a.0, b.0).is_lt())
    {
        scratch.labels.sort_by(|a, b| name_order(a.0, b.0));
        refuse_repeated_name(scratch.labels.iter().map(|l| l.0), || describe(series))?;
    }
    let at = scratch
        .labels
        .partition_point(|l| name_order(l.0, name).is_lt());

    let size: usize = scratch.labels.iter().map(|l| l.1.len()).sum::<usize>()
        + ours.len()
        + scratch.others.iter().map(|raw| raw.len()).sum::<usize>();
    let before = out.len();
    out.extend_from_slice(owed);
    let from = out.len();
    protowire::write_field_header(out, 1, size);
    copy_runs(out, series, &scratch.labels[..at]);
    out.extend_from_slice(ours);
    copy_runs(out, series, &scratch.labels[at..]);
    for other in &scratch.others {
        out.extend_from_slice(other);
    }
    // Laid out otherwise, yet written as it came (rare: a field order
    // other than the encoders'): not copied after all.
    if out[from..] == *raw {
        out.truncate(before);
        return Ok(Written::Unchanged);
    }
    Ok(Written::Changed)
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
