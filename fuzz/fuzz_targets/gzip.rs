//! The OTLP rewrite's gzip reader (`otlp::gunzip`). Invariants: what it
//! accepts, flate2's multi-member reader (an independent reading, as Go's
//! multistream reader reads) reads to the very same bytes, so nothing is
//! checked in one reading and forwarded in another; what it accepts is
//! never longer than the limit; and a body the reference reads within the
//! limit is never `TooLarge`. (`Malformed` is not held to the reference:
//! zlib refuses reserved header flags that Go's reader ignores.) The first
//! byte picks the limit: 0-254 bytes, or 16 MiB.
#![no_main]

use std::io::Read;

use flate2::read::MultiGzDecoder;
use libfuzzer_sys::fuzz_target;
use tenant_proxy::enforce::otlp::{gunzip, OtlpError};

fuzz_target!(|data: &[u8]| {
    let Some((&first, body)) = data.split_first() else {
        return;
    };
    let limit = if first == 255 {
        16 << 20
    } else {
        u64::from(first)
    };
    let mut reference = Vec::new();
    let read = MultiGzDecoder::new(body)
        .take(32 << 20)
        .read_to_end(&mut reference);
    match gunzip(body, limit) {
        Ok(out) => {
            assert!(
                out.len() as u64 <= limit,
                "{} bytes past {limit}",
                out.len()
            );
            assert!(
                read.is_ok(),
                "accepted what the reference refuses: {read:?}"
            );
            assert_eq!(out, reference, "read otherwise than the reference");
        }
        Err(OtlpError::Malformed(_)) => {}
        Err(OtlpError::TooLarge { limit: said }) => {
            assert_eq!(said, limit);
            if let Ok(n) = read {
                assert!(
                    n as u64 > limit,
                    "TooLarge, but the reference reads {n} bytes"
                );
            }
        }
        Err(other) => panic!("unexpected error: {other:?}"),
    }
});
