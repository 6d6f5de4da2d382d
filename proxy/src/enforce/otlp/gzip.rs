//! gzip as the receiver reads it, and one member out.
//!
//! Go's `gzip.Reader` (the receiver's), in its default multistream mode,
//! reads a body of several members as one stream, and refuses a body that
//! ends inside a member, holds anything but another member after one, or
//! fails a member's CRC-32 or length: so does [`inflate_members`], with
//! zlib's gzip mode checking the first member's header and trailer and
//! flate2's reader those of any further one. zlib also refuses a first
//! header with reserved flag bits set, which Go ignores and no sender
//! sets: refused here, never forwarded in another reading.

use std::io::Read;

use flate2::read::MultiGzDecoder;
use flate2::{Compress, Decompress, FlushCompress, FlushDecompress, Status};

use super::OtlpError;

/// Inflates every member of `body` into `out` (cleared first). More than
/// `limit` bytes in all is `TooLarge`, found one byte past the limit: `out`
/// never holds more. The first member is written into `out`'s spare room
/// without zeroing it (a kept buffer of hundreds of KiB would be zeroed on
/// every request); the rare further members go through flate2's reader,
/// which resets one inflater per member where zlib's gzip mode would make
/// a new one (a body of many tiny members would cost twice as much).
pub(super) fn inflate_members(body: &[u8], limit: u64, out: &mut Vec<u8>) -> Result<(), OtlpError> {
    let most = usize::try_from(limit).map_or(usize::MAX, |l| l.saturating_add(1));
    out.clear();
    if out.capacity() > most {
        out.shrink_to(most);
    }
    let mut member = Decompress::new_gzip(15);
    let mut rest = body;
    loop {
        if out.len() >= most {
            return Err(OtlpError::TooLarge { limit });
        }
        if out.len() == out.capacity() {
            // Doubling, but never past the limit's byte.
            out.reserve_exact(out.capacity().max(64 * 1024).min(most - out.len()));
        }
        let (read_before, written_before) = (member.total_in(), out.len());
        let status = member
            .decompress_vec(rest, out, FlushDecompress::None)
            .map_err(gzip_error)?;
        let read = (member.total_in() - read_before) as usize;
        rest = &rest[read..];
        match status {
            Status::StreamEnd => break,
            // Room to write and nothing done: the input ended.
            _ if read == 0 && out.len() == written_before => {
                return Err(gzip_error("the body ends inside a member"))
            }
            _ => {}
        }
    }
    if !rest.is_empty() {
        MultiGzDecoder::new(rest)
            .take((most - out.len()) as u64)
            .read_to_end(out)
            .map_err(gzip_error)?;
    }
    if out.len() >= most {
        return Err(OtlpError::TooLarge { limit });
    }
    Ok(())
}

/// `input` as one gzip member, with a kept compressor.
pub(super) fn deflate_member(gzip: &mut Compress, input: &[u8]) -> Result<Vec<u8>, OtlpError> {
    gzip.reset();
    let mut out = Vec::with_capacity(input.len() / 4 + 64);
    loop {
        let consumed = gzip.total_in() as usize;
        let status = gzip
            .compress_vec(&input[consumed..], &mut out, FlushCompress::Finish)
            .map_err(|e| OtlpError::Compress(format!("gzip: {e}")))?;
        match status {
            Status::StreamEnd => return Ok(out),
            _ => out.reserve(out.capacity().max(4096)),
        }
    }
}

/// A body gzip cannot read.
fn gzip_error(why: impl std::fmt::Display) -> OtlpError {
    OtlpError::Malformed(format!("gzip: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::write::GzEncoder;
    use flate2::Compression;
    use std::io::Write;

    fn member(raw: &[u8]) -> Vec<u8> {
        let mut gz = GzEncoder::new(Vec::new(), Compression::default());
        gz.write_all(raw).unwrap();
        gz.finish().unwrap()
    }

    fn inflated(body: &[u8], limit: u64) -> Result<Vec<u8>, OtlpError> {
        super::super::gunzip(body, limit)
    }

    fn malformed(result: Result<Vec<u8>, OtlpError>) -> bool {
        matches!(result, Err(OtlpError::Malformed(_)))
    }

    #[test]
    fn every_member_is_read_and_checked_as_go_reads_them() {
        let one = member(b"first ");
        let two = member(b"second");
        assert_eq!(inflated(&one, 100).unwrap(), b"first ");
        assert_eq!(
            inflated(&[one.clone(), two].concat(), 100).unwrap(),
            b"first second"
        );
        // Go's reader: io.EOF, io.ErrUnexpectedEOF, ErrHeader, ErrChecksum.
        assert!(malformed(inflated(b"", 100)), "empty");
        assert!(malformed(inflated(&one[..one.len() - 1], 100)), "cut short");
        assert!(malformed(inflated(&one[..10], 100)), "a header alone");
        assert!(
            malformed(inflated(&[&one[..], b"\0"].concat(), 100)),
            "trailing byte"
        );
        assert!(
            malformed(inflated(&[&one[..], b"x"].concat(), 100)),
            "trailing text"
        );
        let mut crc = one.clone();
        let at = crc.len() - 8;
        crc[at] ^= 1;
        assert!(malformed(inflated(&crc, 100)), "CRC-32");
        let mut length = one.clone();
        let at = length.len() - 4;
        length[at] ^= 1;
        assert!(malformed(inflated(&length, 100)), "length");
        assert!(malformed(inflated(b"not gzip at all", 100)), "no header");
        // The same in a second member, read the other way.
        let second = |broken: &[u8]| inflated(&[&one[..], broken].concat(), 100);
        assert!(malformed(second(&one[..one.len() - 1])), "second cut short");
        assert!(malformed(second(&crc)), "second CRC-32");
        assert!(malformed(second(&length)), "second length");
        assert!(malformed(second(&one[..10])), "second header alone");
    }

    #[test]
    fn the_limit_is_found_one_byte_past_it() {
        let body = member(&[7u8; 1000]);
        assert_eq!(inflated(&body, 1000).unwrap().len(), 1000);
        assert_eq!(
            inflated(&body, 999),
            Err(OtlpError::TooLarge { limit: 999 })
        );
        // Across members too, and before a later member is inflated.
        let two = [member(&[1u8; 600]), member(&[2u8; 600])].concat();
        assert_eq!(inflated(&two, 1200).unwrap().len(), 1200);
        assert_eq!(
            inflated(&two, 1199),
            Err(OtlpError::TooLarge { limit: 1199 })
        );
        // A bomb stops at the limit: what was written stays one byte past it.
        let bomb = member(&vec![0u8; 8 << 20]);
        let mut out = Vec::new();
        let limit = 1 << 20;
        assert_eq!(
            inflate_members(&bomb, limit, &mut out),
            Err(OtlpError::TooLarge { limit })
        );
        assert_eq!(out.len(), (1 << 20) + 1);
        // So it does in a buffer kept from a larger limit: the spare room
        // is given back first, not filled.
        let mut kept = Vec::with_capacity(8 << 20);
        let limit = 1000;
        assert_eq!(
            inflate_members(&bomb, limit, &mut kept),
            Err(OtlpError::TooLarge { limit })
        );
        assert_eq!(kept.len(), 1001);
        // And in a bomb that comes as a later member.
        let later = [member(&[1u8; 600]), bomb].concat();
        assert_eq!(
            inflate_members(&later, limit, &mut kept),
            Err(OtlpError::TooLarge { limit })
        );
        assert_eq!(kept.len(), 1001);
    }

    #[test]
    fn a_member_out_reads_back() {
        let mut gzip = Compress::new_gzip(flate2::Compression::fast(), 15);
        for raw in [&b""[..], b"a body", &[9u8; 100_000][..]] {
            let body = deflate_member(&mut gzip, raw).unwrap();
            assert_eq!(inflated(&body, 1 << 20).unwrap(), raw);
        }
    }
}
