//! Snappy's block format written without compressing: the length, then
//! the body as literal elements of at most 64 KiB. Remote write requires
//! the block format (`Content-Encoding: snappy`), not compression: every
//! decoder reads literals as it reads any element, so the body decodes to
//! the same bytes everywhere, and writing it costs a copy where compressing
//! costs about a third of a relabelled push's CPU
//! (`metrics.remote_write_forward_compression: literal`).
//!
//! 64 KiB is the block Go's and the reference encoders compress at a time,
//! so no literal is longer than one they could have written.

/// The longest literal written.
const LITERAL_BYTES: usize = 1 << 16;

/// `raw` in snappy's block format, uncompressed; `None` past the format's
/// 4 GiB (its length is 32 bits).
pub fn encode(raw: &[u8]) -> Option<Vec<u8>> {
    let mut length = u32::try_from(raw.len()).ok()?;
    // The length's varint (5 bytes at most), then 3 bytes of tag per literal.
    let mut out = Vec::with_capacity(5 + raw.len() + 3 * raw.len().div_ceil(LITERAL_BYTES));
    while length >= 0x80 {
        out.push(length as u8 | 0x80);
        length >>= 7;
    }
    out.push(length as u8);
    for chunk in raw.chunks(LITERAL_BYTES) {
        // A literal's tag holds its length less one: in its upper six bits
        // up to 59; beyond, 60 (one byte follows) or 61 (two, little-endian).
        let stored = chunk.len() - 1;
        match stored {
            0..60 => out.push((stored as u8) << 2),
            60..256 => out.extend_from_slice(&[60 << 2, stored as u8]),
            _ => {
                out.push(61 << 2);
                out.extend_from_slice(&(stored as u16).to_le_bytes());
            }
        }
        out.extend_from_slice(chunk);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn decoded(encoded: &[u8]) -> Vec<u8> {
        snap::raw::Decoder::new().decompress_vec(encoded).unwrap()
    }

    /// Each length where the tag's form changes, and the chunking's edges.
    #[test]
    fn every_literal_form_decodes_to_the_bytes_written() {
        for length in [
            0,
            1,
            59,
            60,
            61,
            255,
            256,
            257,
            LITERAL_BYTES - 1,
            LITERAL_BYTES,
            LITERAL_BYTES + 1,
            LITERAL_BYTES + 60,
            3 * LITERAL_BYTES + 300,
        ] {
            let raw: Vec<u8> = (0..length).map(|i| (i * 7 % 251) as u8).collect();
            let encoded = encode(&raw).unwrap();
            assert_eq!(decoded(&encoded), raw, "{length} bytes");
            assert_eq!(
                snap::raw::decompress_len(&encoded).unwrap(),
                length,
                "the declared length"
            );
        }
    }

    /// The exact bytes for the small forms, as the format spells them.
    #[test]
    fn literal_tags_are_written_as_the_format_defines_them() {
        assert_eq!(encode(b"").unwrap(), [0]);
        assert_eq!(encode(b"ab").unwrap(), [2, 1 << 2, b'a', b'b']);
        let sixty_one = [b'x'; 61];
        assert_eq!(encode(&sixty_one).unwrap()[..3], [61, 60 << 2, 60]);
        let three_hundred = [b'x'; 300];
        assert_eq!(
            encode(&three_hundred).unwrap()[..4],
            [0xac, 0x02, 61 << 2, 43],
            "length 300 as a varint, then the tag and 299 in two bytes"
        );
        assert_eq!(encode(&three_hundred).unwrap()[4..6], [1, b'x']);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Whatever the bytes, they decode back unchanged, and the body
        /// is never more than the few bytes of its tags larger.
        #[test]
        fn any_body_decodes_back_to_itself(raw in prop::collection::vec(any::<u8>(), 0..140_000)) {
            let encoded = encode(&raw).unwrap();
            prop_assert_eq!(decoded(&encoded), raw.clone());
            prop_assert!(encoded.len() <= raw.len() + 5 + 3 * raw.len().div_ceil(LITERAL_BYTES));
        }
    }
}
