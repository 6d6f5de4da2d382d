//! Remote write 2.0: `io.prometheus.write.v2.Request`, labels as
//! references into the request's symbols table.

use std::cmp::Ordering;

use super::{
    count, name_order, refuse_repeated_name, series_field, unexpected_top_level, RemoteWriteError,
    Stats, Version, Written,
};
use crate::enforce::prompb::readings::describe as describe_series;
use crate::enforce::protowire::{self, fields, LEN, VARINT};
use crate::enforce::tenant_label::{decide, Decision, Found, TenantLabel};

// Request { repeated string symbols = 4; repeated TimeSeries timeseries = 5; }

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

pub(super) fn rewrite<'a>(
    message: &'a [u8],
    tenant: &TenantLabel<'a>,
    stats: &mut Stats,
    out: &mut Vec<u8>,
) -> Result<Written, RemoteWriteError> {
    // Series may come before symbols on the wire: read all symbols first,
    // and refuse any field 2.0 does not define before writing anything.
    let mut all = Vec::new();
    let mut any_series = false;
    for field in fields(message) {
        let field = field?;
        match (field.tag, field.wire_type) {
            (4, LEN) => all.push(field.payload),
            (5, LEN) => any_series = true,
            _ => return Err(unexpected_top_level(Version::V2, &field)),
        }
    }
    if !any_series {
        // Symbols alone make no series: nothing to scope, and no symbol of
        // ours to add that nothing would refer to.
        return Ok(Written::Unchanged);
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
    // As in 1.0, `message[owed..]` up to the field being read goes out as
    // it came, copied only when a series after it changes (or at the end).
    let mut owed = 0;
    let mut series_buf = Vec::new();
    for field in fields(message) {
        let field = field?;
        if (field.tag, field.wire_type) != (5, LEN) {
            continue; // a symbol: goes out as it came
        }
        series_buf.clear();
        rewrite_series(
            field.payload,
            tenant,
            name_ref,
            &mut symbols,
            stats,
            &mut scratch,
            &mut series_buf,
        )?;
        // The same series under a key and length written as we would.
        if series_buf == field.payload
            && field.raw.len() == protowire::len_field_size(series_buf.len())
        {
            continue;
        }
        let at = protowire::offset_in(message, field.raw);
        out.extend_from_slice(&message[owed..at]);
        protowire::write_len_field(out, 5, &series_buf);
        owed = at + field.raw.len();
    }
    let appended = &symbols.all[symbols.sent..];
    if owed == 0 && appended.is_empty() {
        return Ok(Written::Unchanged);
    }
    out.extend_from_slice(&message[owed..]);
    // Appended after every symbol the sender wrote, so existing references
    // (labels, exemplars, metadata) keep their meaning.
    for symbol in appended {
        protowire::write_len_field(out, 4, symbol);
    }
    Ok(Written::Changed)
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

/// How a series wrote its label references: as one packed field with
/// every varint in as few bytes as its value needs (what every encoder
/// writes), or otherwise.
enum RefsLayout<'m> {
    None,
    OnePacked(&'m [u8]),
    Other,
}

/// TimeSeries { repeated uint32 labels_refs = 1 (packed); samples = 2; ... }
fn rewrite_series<'a>(
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
            super::SPLICED.with(|n| n.set(n.get() + 1));
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
