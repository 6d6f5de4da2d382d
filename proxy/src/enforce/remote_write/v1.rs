//! Remote write 1.0: `prometheus.WriteRequest`, labels as name and value
//! strings in each series.

use super::{
    count, name_order, refuse_repeated_name, series_field, unexpected_top_level, RemoteWriteError,
    Stats, Version,
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
    /// The tenant label encoded once per owned value (`Label` messages).
    encoded: Vec<Vec<u8>>,
}

pub(super) fn rewrite(
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
            (1, LEN) => rewrite_series(field.payload, tenant, stats, &mut scratch, out)?,
            // MetricMetadata: a metric family's type, help and unit; no labels.
            (3, LEN) => out.extend_from_slice(field.raw),
            _ => return Err(unexpected_top_level(Version::V1, &field)),
        }
    }
    Ok(())
}

/// TimeSeries { repeated Label labels = 1; repeated Sample samples = 2; ... },
/// written to `out` as a whole `timeseries` field.
fn rewrite_series<'m>(
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
    let decision = decide(found, tenant, || describe(series))?;
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
        refuse_repeated_name(scratch.labels.iter().map(|l| l.0), || describe(series))?;
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
