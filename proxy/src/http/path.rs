//! Request path normalisation. Routing decisions are made on the normalised
//! path and the same normalised path is forwarded, so what was checked is
//! exactly what the upstream sees.

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// Everything but RFC 3986 unreserved characters and `:` `@` is re-encoded.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b':')
    .remove(b'@');

/// Decodes percent-escapes per segment, drops empty and `.` segments,
/// resolves `..`, and re-encodes. Refuses what cannot be made unambiguous:
/// an encoded `/` (it would change the segments an upstream sees), NUL,
/// invalid UTF-8, and `..` above the root.
pub fn normalise(raw: &str) -> Result<String, &'static str> {
    if is_normal(raw) {
        return Ok(raw.to_owned());
    }
    normalise_segments(raw)
}

/// A path the segment walk would return unchanged: every segment non-empty,
/// not `.` or `..`, and made only of characters that need no decoding and
/// no re-encoding. Most requests (a client's own API paths) are; they skip
/// the walk and its per-segment allocations.
fn is_normal(raw: &str) -> bool {
    let Some(rest) = raw.as_bytes().strip_prefix(b"/") else {
        return false;
    };
    if rest.is_empty() {
        return true;
    }
    // Bytes, split by hand and looked up in a table: `str::split` and a
    // search of the allowed set per byte cost more than the walk's own work
    // on paths this short (callgrind, docs/benchmarks.md).
    rest.split(|&b| b == b'/').all(|segment| {
        !matches!(segment, b"" | b"." | b"..")
            && segment.iter().all(|&b| KEPT_AS_IS[usize::from(b)])
    })
}

/// The bytes `SEGMENT` leaves unencoded: ASCII letters and digits and
/// `-._~:@`.
const KEPT_AS_IS: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let byte = b as u8;
        table[b] =
            byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~' | b':' | b'@');
        b += 1;
    }
    table
};

fn normalise_segments(raw: &str) -> Result<String, &'static str> {
    if !raw.starts_with('/') {
        return Err("path must start with '/'");
    }
    let mut segments: Vec<String> = Vec::new();
    for segment in raw.split('/') {
        let decoded = percent_decode_str(segment)
            .decode_utf8()
            .map_err(|_| "path is not valid UTF-8")?;
        if decoded.contains('/') {
            return Err("encoded '/' in path");
        }
        if decoded.contains('\0') {
            return Err("NUL in path");
        }
        match &*decoded {
            "" | "." => {}
            ".." => {
                segments.pop().ok_or("path climbs above the root")?;
            }
            other => segments.push(other.to_owned()),
        }
    }
    let mut out = String::with_capacity(raw.len());
    for segment in &segments {
        out.push('/');
        out.extend(utf8_percent_encode(segment, SEGMENT));
    }
    if out.is_empty() {
        out.push('/');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::{normalise, normalise_segments, KEPT_AS_IS, SEGMENT};
    use percent_encoding::percent_encode;
    use proptest::prelude::*;

    proptest! {
        /// The shortcut for paths already normal answers exactly what the
        /// segment walk answers, for paths built from the segments and
        /// characters that matter to either.
        #[test]
        fn shortcut_agrees_with_the_walk(
            rooted in any::<bool>(),
            segments in prop::collection::vec(
                prop_oneof![Just(String::new()), Just(".".into()), Just("..".into()),
                            "[a-z.%2eEfF0:@~_ -]{1,6}"],
                0..6,
            ),
        ) {
            let raw = format!("{}{}", if rooted { "/" } else { "" }, segments.join("/"));
            prop_assert_eq!(normalise(&raw), normalise_segments(&raw));
        }
    }

    #[test]
    fn the_table_is_the_encode_set_inverted() {
        for b in 0..=255u8 {
            let encoded = percent_encode(&[b], SEGMENT).to_string().len() > 1;
            assert_eq!(KEPT_AS_IS[usize::from(b)], !encoded, "byte {b}");
        }
    }

    #[test]
    fn collapses_slashes_dots_and_trailing_slash() {
        let cases = [
            ("/loki/api/v1//push", "/loki/api/v1/push"),
            ("/loki/api/v1/query/", "/loki/api/v1/query"),
            ("/loki/./api/v1/query", "/loki/api/v1/query"),
            ("/loki/api/v1/x/../query", "/loki/api/v1/query"),
            ("/loki/api/v1/%2e%2e/v1/push", "/loki/api/v1/push"),
            ("/loki/api/v1/%71uery", "/loki/api/v1/query"),
            ("/", "/"),
            ("//", "/"),
        ];
        for (raw, want) in cases {
            assert_eq!(normalise(raw).as_deref(), Ok(want), "{raw}");
        }
    }

    #[test]
    fn re_encodes_what_it_decoded() {
        assert_eq!(
            normalise("/loki/api/v1/label/a%20b/values").unwrap(),
            "/loki/api/v1/label/a%20b/values"
        );
    }

    #[test]
    fn refuses_ambiguous_paths() {
        for raw in ["/loki%2fapi", "/..", "/a/../..", "/a%00", "/%ff", "loki"] {
            assert!(normalise(raw).is_err(), "{raw}");
        }
    }
}
