//! Just enough of the protobuf wire format to splice messages: iterate the
//! fields of a message as raw byte ranges, and write fields back. Fields the
//! proxy does not touch are copied byte for byte, including ones newer
//! senders add that no schema here knows about.

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("malformed protobuf: {0}")]
pub struct WireError(pub &'static str);

pub const VARINT: u8 = 0;
pub const FIXED64: u8 = 1;
pub const LEN: u8 = 2;
pub const FIXED32: u8 = 5;

/// One field of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field<'a> {
    pub tag: u32,
    pub wire_type: u8,
    /// The payload: the bytes of a LEN field without its length prefix, the
    /// varint bytes, or the fixed-size bytes.
    pub payload: &'a [u8],
    /// The whole field, key included, for verbatim copies.
    pub raw: &'a [u8],
}

/// A series' label: its name, its value and the whole field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeriesLabel<'a> {
    pub name: &'a [u8],
    pub value: &'a [u8],
    /// The whole field, key included, for verbatim copies.
    pub raw: &'a [u8],
}

/// Iterates the fields of one message. Yields an error once and stops on
/// malformed input.
pub struct Fields<'a> {
    rest: &'a [u8],
    failed: bool,
}

pub fn fields(message: &[u8]) -> Fields<'_> {
    Fields {
        rest: message,
        failed: false,
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<Field<'a>, WireError>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() || self.failed {
            return None;
        }
        let result = self.read_field();
        self.failed = result.is_err();
        Some(result)
    }
}

impl<'a> Fields<'a> {
    #[inline]
    fn read_field(&mut self) -> Result<Field<'a>, WireError> {
        // Most fields of a batch are short strings and messages (labels,
        // attributes) with a one-byte key and a one-byte length: read
        // those without the general path's varint loops.
        if let [key, len, ref after @ ..] = *self.rest {
            let len = usize::from(len);
            // Bit 7 clear: the key is one byte; wire type LEN; field >= 1.
            if key & 0x87 == LEN && key >= 0x08 && len < 0x80 && after.len() >= len {
                let (raw, rest) = self.rest.split_at(2 + len);
                self.rest = rest;
                return Ok(Field {
                    tag: u32::from(key >> 3),
                    wire_type: LEN,
                    payload: &raw[2..],
                    raw,
                });
            }
        }
        self.read_any_field()
    }

    /// The general path, kept out of line so that the short one above
    /// inlines into the loops that call it.
    #[inline(never)]
    fn read_any_field(&mut self) -> Result<Field<'a>, WireError> {
        let start = self.rest;
        let key = read_varint(&mut self.rest)?;
        let tag = u32::try_from(key >> 3).map_err(|_| WireError("field number out of range"))?;
        if tag == 0 {
            return Err(WireError("field number 0"));
        }
        let wire_type = (key & 7) as u8;
        let payload = match wire_type {
            VARINT => {
                let before = self.rest;
                read_varint(&mut self.rest)?;
                &before[..before.len() - self.rest.len()]
            }
            FIXED64 => self.take(8)?,
            FIXED32 => self.take(4)?,
            LEN => {
                let len = read_varint(&mut self.rest)?;
                let len = usize::try_from(len).map_err(|_| WireError("length out of range"))?;
                self.take(len)?
            }
            _ => return Err(WireError("unsupported wire type")),
        };
        let raw = &start[..start.len() - self.rest.len()];
        Ok(Field {
            tag,
            wire_type,
            payload,
            raw,
        })
    }

    /// The next field if it is a series' label (field 1, a
    /// `Label { name = 1; value = 2; }`) laid out as encoders write it:
    /// `0x0a L 0x0a N name 0x12 V value`, one-byte lengths, L = N + V + 4.
    /// Consumed only then; anything else (a label without a value, a long
    /// one, a repeated name) is left for [`Iterator::next`] and
    /// [`label_pair`]. Remote write's check costs about a third fewer
    /// instructions this way, every check still made on what it returns.
    #[inline]
    pub fn next_short_label(&mut self) -> Option<SeriesLabel<'a>> {
        if self.failed {
            return None;
        }
        let [0x0a, len, 0x0a, name_len, ref after @ ..] = *self.rest else {
            return None;
        };
        let (len, name_len) = (usize::from(len), usize::from(name_len));
        let [0x12, value_len, ref value_after @ ..] = *after.get(name_len..)? else {
            return None;
        };
        let value_len = usize::from(value_len);
        // Below 0x80, the length is one byte; equal to the parts' sum, so are
        // they, and the message ends with the value.
        if len >= 0x80 || len != name_len + value_len + 4 || value_after.len() < value_len {
            return None;
        }
        let (raw, rest) = self.rest.split_at(2 + len);
        self.rest = rest;
        Some(SeriesLabel {
            name: &after[..name_len],
            value: &value_after[..value_len],
            raw,
        })
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.rest.len() < n {
            return Err(WireError("truncated field"));
        }
        let (taken, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(taken)
    }
}

/// Where `part`, a slice of `message` that [`fields`] handed out (a field
/// or a piece of one), starts in it.
#[inline]
pub fn offset_in(message: &[u8], part: &[u8]) -> usize {
    let at = part.as_ptr() as usize - message.as_ptr() as usize;
    debug_assert!(
        at + part.len() <= message.len(),
        "not a slice of the message"
    );
    at
}

#[inline]
pub fn read_varint(buf: &mut &[u8]) -> Result<u64, WireError> {
    // Keys and label lengths are almost always one byte: keep that inline
    // (a third of the rewrite's time went to the call before).
    if let Some((&byte, rest)) = buf.split_first() {
        if byte < 0x80 {
            *buf = rest;
            return Ok(u64::from(byte));
        }
    }
    read_long_varint(buf)
}

fn read_long_varint(buf: &mut &[u8]) -> Result<u64, WireError> {
    let mut value = 0u64;
    for i in 0..10 {
        let (&byte, rest) = buf.split_first().ok_or(WireError("truncated varint"))?;
        *buf = rest;
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte < 0x80 {
            return Ok(value);
        }
    }
    Err(WireError("varint longer than 10 bytes"))
}

#[inline]
pub fn write_varint(out: &mut Vec<u8>, value: u64) {
    // Most varints written are one byte (lengths of labels, 2.0's first
    // 128 symbol references): a push, inlined into the loops.
    if value < 0x80 {
        out.push(value as u8);
    } else {
        write_long_varint(out, value);
    }
}

fn write_long_varint(out: &mut Vec<u8>, value: u64) {
    let mut buf = [0; 10];
    let n = encode_varint(value, &mut buf);
    out.extend_from_slice(&buf[..n]);
}

/// Encodes `value` into `buf`, returning how many bytes it took.
pub fn encode_varint(mut value: u64, buf: &mut [u8; 10]) -> usize {
    let mut n = 0;
    while value >= 0x80 {
        buf[n] = (value as u8) | 0x80;
        value >>= 7;
        n += 1;
    }
    buf[n] = value as u8;
    n + 1
}

/// Writes a length-delimited field.
pub fn write_len_field(out: &mut Vec<u8>, tag: u32, payload: &[u8]) {
    write_field_header(out, tag, payload.len());
    out.extend_from_slice(payload);
}

/// Writes the key and length of a length-delimited field whose `len` payload
/// bytes the caller writes next.
pub fn write_field_header(out: &mut Vec<u8>, tag: u32, len: usize) {
    write_varint(out, (u64::from(tag) << 3) | u64::from(LEN));
    write_varint(out, len as u64);
}

/// Bytes a length-delimited field of `len` payload bytes takes (tag < 16).
pub fn len_field_size(len: usize) -> usize {
    1 + varint_size(len as u64) + len
}

/// Bytes `value` takes as a varint.
pub fn varint_size(value: u64) -> usize {
    (64 - value.max(1).leading_zeros() as usize).div_ceil(7)
}

/// Field 1 of a `Label { name = 1; value = 2; }`, read cheaply when the
/// message is laid out as every encoder writes it: one name, then at most one
/// value. Anything else goes through [`label_pair`], because a repeated field
/// decodes as its *last* occurrence: `name="foo" name="namespace"` is a
/// `namespace` label to the receiver, and must be one to the proxy too.
#[inline]
pub fn label_name(message: &[u8]) -> Result<&[u8], WireError> {
    if let Some(name) = canonical_label_name(message) {
        return Ok(name);
    }
    label_pair(message).map(|(name, _)| name)
}

#[inline]
fn canonical_label_name(message: &[u8]) -> Option<&[u8]> {
    // Key 0x0a: field 1, length-delimited; key 0x12: field 2, length-delimited.
    let mut rest = message.strip_prefix(&[0x0a])?;
    let len = usize::try_from(read_varint(&mut rest).ok()?).ok()?;
    let (name, mut rest) = (rest.get(..len)?, rest.get(len..)?);
    if !rest.is_empty() {
        rest = rest.strip_prefix(&[0x12])?;
        let len = usize::try_from(read_varint(&mut rest).ok()?).ok()?;
        if rest.len() != len {
            return None;
        }
    }
    Some(name)
}

/// The string fields 1 and 2 of a `Label { name = 1; value = 2; }`.
///
/// Any other field is an error: the label is forwarded as it came, and a
/// field no check has read must not reach a receiver that might read it as
/// part of a name or value.
pub fn label_pair(message: &[u8]) -> Result<(&[u8], &[u8]), WireError> {
    let (mut name, mut value): (&[u8], &[u8]) = (b"", b"");
    for field in fields(message) {
        let field = field?;
        match (field.tag, field.wire_type) {
            (1, LEN) => name = field.payload,
            (2, LEN) => value = field.payload,
            _ => return Err(WireError("a Label field other than name (1) and value (2)")),
        }
    }
    Ok((name, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip_and_sizes_match() {
        for value in [
            0u64,
            1,
            127,
            128,
            300,
            16_383,
            16_384,
            u32::MAX as u64,
            u64::MAX,
        ] {
            let mut out = Vec::new();
            write_varint(&mut out, value);
            assert_eq!(out.len(), varint_size(value), "{value}");
            assert_eq!(read_varint(&mut out.as_slice()), Ok(value));
        }
    }

    #[test]
    fn iterates_fields_and_refuses_truncation() {
        let mut msg = Vec::new();
        write_len_field(&mut msg, 1, b"name");
        write_varint(&mut msg, (3 << 3) | u64::from(VARINT));
        write_varint(&mut msg, 150);
        let fixed = msg.len();
        write_varint(&mut msg, (4 << 3) | u64::from(FIXED64));
        msg.extend_from_slice(&1.5f64.to_le_bytes());
        write_varint(&mut msg, (5 << 3) | u64::from(FIXED32));
        msg.extend_from_slice(&7u32.to_le_bytes());
        let all: Vec<_> = fields(&msg).collect::<Result<_, _>>().unwrap();
        assert_eq!(all.len(), 4);
        assert_eq!((all[0].tag, all[0].payload), (1, &b"name"[..]));
        assert_eq!(all[1].raw, &msg[6..fixed]);
        assert_eq!((all[1].tag, all[1].payload), (3, &[0x96, 0x01][..]));
        assert_eq!((all[2].tag, all[2].payload), (4, &1.5f64.to_le_bytes()[..]));
        assert_eq!((all[3].tag, all[3].payload), (5, &7u32.to_le_bytes()[..]));
        assert_eq!(all[3].raw, &msg[fixed + 9..]);
        assert!(fields(&msg[..msg.len() - 1]).any(|f| f.is_err()));
        assert!(fields(&[0x0b]).any(|f| f.is_err()), "wire type 3 (groups)");
        assert_eq!(len_field_size(4), 6);
    }

    #[test]
    fn a_repeated_label_name_reads_as_its_last_occurrence() {
        let label = |fields: &[(u32, &[u8])]| {
            let mut msg = Vec::new();
            for (tag, payload) in fields {
                write_len_field(&mut msg, *tag, payload);
            }
            msg
        };
        let canonical = label(&[(1, b"namespace"), (2, b"team-a")]);
        assert_eq!(label_name(&canonical), Ok(&b"namespace"[..]));
        assert_eq!(label_name(&label(&[(1, b"job")])), Ok(&b"job"[..]));
        // A protobuf decoder keeps the last name: so must we.
        let smuggled = label(&[(1, b"foo"), (1, b"namespace"), (2, b"victim")]);
        assert_eq!(label_name(&smuggled), Ok(&b"namespace"[..]));
        let trailing = label(&[(1, b"foo"), (2, b"x"), (1, b"namespace")]);
        assert_eq!(label_name(&trailing), Ok(&b"namespace"[..]));
        let value_first = label(&[(2, b"v"), (1, b"namespace")]);
        assert_eq!(label_name(&value_first), Ok(&b"namespace"[..]));
    }

    /// The fields of `message` as the general path alone reads them.
    fn read_the_long_way(message: &[u8]) -> Vec<Result<Field<'_>, WireError>> {
        let mut fields = fields(message);
        let mut read = Vec::new();
        while !fields.rest.is_empty() {
            let field = fields.read_any_field();
            let failed = field.is_err();
            read.push(field);
            if failed {
                break;
            }
        }
        read
    }

    /// Bytes that are mostly fields, short and long, with some noise: the
    /// short path's edges (field 0, a key of two bytes, a length of 127 or
    /// 128, a payload a byte short) come up often.
    fn message_like() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        let key = prop_oneof![
            Just(0x02u8), // field 0
            Just(0x0a),
            Just(0x7a), // field 15, the last one-byte key
            Just(0x82), // the first byte of a two-byte key
            0x08..0x80u8,
            any::<u8>(),
        ];
        let len = prop_oneof![0..0x80u8, Just(0x7f), Just(0x80), Just(0x81), any::<u8>()];
        let field = (key, len, -2i16..=2, any::<u8>()).prop_map(|(key, len, slack, fill)| {
            let payload = (i16::from(len & 0x7f) + slack).max(0) as usize;
            [vec![key, len], vec![fill; payload]].concat()
        });
        prop::collection::vec(field, 0..6).prop_map(|fields| fields.concat())
    }

    /// Every pair of first two bytes, with the payload the second names
    /// and one byte short: the short path's guard is a mask over the very
    /// bytes a random message rarely hits (a key of two bytes whose first
    /// looks like a short key, 0x85 or 0x8a, say).
    #[test]
    fn the_short_path_agrees_on_every_first_two_bytes() {
        for key in 0..=u8::MAX {
            for len in 0..=u8::MAX {
                let full = usize::from(len & 0x7f);
                for payload in [full, full.saturating_sub(1)] {
                    let message = [vec![key, len], vec![0x01; payload]].concat();
                    let short: Vec<_> = fields(&message).collect();
                    assert_eq!(short, read_the_long_way(&message), "{key:#04x} {len:#04x}");
                }
            }
        }
    }

    /// What [`Fields::next_short_label`] must agree with: the field the
    /// general path reads, and its name and value as [`label_pair`] reads
    /// them; `None` when it is no label of field 1.
    fn label_the_long_way(message: &[u8]) -> Option<SeriesLabel<'_>> {
        let field = fields(message).next()?.ok()?;
        if (field.tag, field.wire_type) != (1, LEN) {
            return None;
        }
        let (name, value) = label_pair(field.payload).ok()?;
        Some(SeriesLabel {
            name,
            value,
            raw: field.raw,
        })
    }

    /// Reads `message`'s first field as a short label; checks it against
    /// the long way, and that nothing was consumed when it declined.
    fn check_short_label(message: &[u8]) -> Result<(), String> {
        let mut short = fields(message);
        match short.next_short_label() {
            Some(label) => {
                if label_the_long_way(message) != Some(label) {
                    return Err(format!(
                        "{label:?} against {:?}",
                        label_the_long_way(message)
                    ));
                }
                if short.rest.len() != message.len() - label.raw.len() {
                    return Err("consumed other than the field".into());
                }
            }
            None if short.rest.len() != message.len() => {
                return Err("declined, but consumed".into())
            }
            None => {}
        }
        Ok(())
    }

    /// Labels laid out the short way, and each byte of the layout's
    /// header (and one byte too few or many) moved off it.
    fn label_like() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        let part = |max: usize| prop::collection::vec(any::<u8>(), 0..max);
        let header = prop_oneof![Just(None), (0..5usize, any::<u8>()).prop_map(Some)];
        (part(70), part(70), header, -1i8..=1, part(4)).prop_map(
            |(name, value, changed, slack, after)| {
                let len = name.len() + value.len() + 4;
                let mut label = vec![0x0a, len as u8, 0x0a, name.len() as u8];
                label.extend_from_slice(&name);
                label.extend_from_slice(&[0x12, value.len() as u8]);
                label.extend_from_slice(&value);
                let end = (label.len() as isize + isize::from(slack)).max(0) as usize;
                label.resize(end, 0x01);
                if let Some((at, byte)) = changed {
                    let at = [0, 1, 2, 3, 4 + name.len()][at];
                    if let Some(b) = label.get_mut(at) {
                        *b = byte;
                    }
                }
                label.extend_from_slice(&after);
                label
            },
        )
    }

    #[test]
    fn a_short_label_is_read_as_the_general_path_reads_it() {
        let mut message = Vec::new();
        let mut label = Vec::new();
        write_len_field(&mut label, 1, b"namespace");
        write_len_field(&mut label, 2, b"team-a");
        write_len_field(&mut message, 1, &label);
        let mut fields = fields(&message);
        let read = fields.next_short_label().expect("the usual layout");
        assert_eq!((read.name, read.value), (&b"namespace"[..], &b"team-a"[..]));
        assert_eq!(read.raw, &message[..]);
        assert!(fields.next().is_none());
        // A name repeated (the receiver keeps the last): not the short way.
        let smuggled = [&[
            0x0a, 0x09, 0x0a, 0x01, b'x', 0x0a, 0x01, b'y', 0x12, 0x01, b'v',
        ][..]]
        .concat();
        assert_eq!(super::fields(&smuggled).next_short_label(), None);
        assert_eq!(check_short_label(&smuggled), Ok(()));
    }

    proptest::proptest! {
        #[test]
        fn the_short_path_reads_what_the_general_path_reads(message in message_like()) {
            let short: Vec<_> = fields(&message).collect();
            proptest::prop_assert_eq!(short, read_the_long_way(&message));
        }

        #[test]
        fn a_short_label_agrees_with_the_general_path(message in label_like()) {
            proptest::prop_assert_eq!(check_short_label(&message), Ok(()));
        }

        #[test]
        fn any_bytes_read_as_a_short_label_agree_with_the_general_path(message in message_like()) {
            proptest::prop_assert_eq!(check_short_label(&message), Ok(()));
        }
    }
}
