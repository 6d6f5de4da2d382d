//! Any bytes a server could send on a live tail, in any pieces.
//! Invariant: after each piece, the tracker allows a close frame of the
//! proxy's exactly when a plain reading of the whole stream from its
//! start (header by header, payloads skipped) ends a frame there and has
//! not yet read a close frame's header; how the bytes were split never
//! changes the answer, and malformed or truncated frames never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tenant_proxy::http::websocket::FrameBoundary;

/// `(boundaries, close_read_at)`: every offset where a frame ends (and
/// the start), and the offset where the first close frame's header is
/// complete, read in one pass over the whole stream.
fn reference(stream: &[u8]) -> (Vec<usize>, Option<usize>) {
    let mut boundaries = vec![0];
    let mut close_read_at = None;
    let mut at = 0;
    while at + 2 <= stream.len() {
        let (first, second) = (stream[at], stream[at + 1]);
        let extended = match second & 0x7f {
            126 => 2,
            127 => 8,
            _ => 0,
        };
        let mask = if second & 0x80 != 0 { 4 } else { 0 };
        let header = 2 + extended + mask;
        if at + header > stream.len() {
            break;
        }
        let length = if extended == 0 {
            u64::from(second & 0x7f)
        } else {
            let mut bytes = [0u8; 8];
            bytes[8 - extended..].copy_from_slice(&stream[at + 2..at + 2 + extended]);
            u64::from_be_bytes(bytes)
        };
        if first & 0x0f == 0x8 && close_read_at.is_none() {
            close_read_at = Some(at + header);
        }
        // A length near 2^64 never ends within the stream.
        let Some(end) = ((at + header) as u64).checked_add(length) else {
            break;
        };
        if end > stream.len() as u64 {
            break;
        }
        at = end as usize;
        boundaries.push(at);
    }
    (boundaries, close_read_at)
}

fuzz_target!(|data: &[u8]| {
    // The first byte chooses the piece sizes (1 to 16 bytes, cycling).
    let Some((&sizes, stream)) = data.split_first() else {
        return;
    };
    let (boundaries, close_read_at) = reference(stream);
    let mut tracker = FrameBoundary::default();
    let mut at = 0;
    let mut step = 0usize;
    while at < stream.len() {
        let size = 1 + (usize::from(sizes).wrapping_add(step * 7) % 16);
        let end = (at + size).min(stream.len());
        tracker.advance(&stream[at..end]);
        at = end;
        step += 1;
        let closed = close_read_at.is_some_and(|c| c <= at);
        assert_eq!(
            tracker.may_close(),
            boundaries.contains(&at) && !closed,
            "at byte {at} of {}",
            stream.len()
        );
    }
});
