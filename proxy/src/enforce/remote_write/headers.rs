//! The headers a remote-write receiver picks its decoder by: read strictly
//! from the sender, written back canonically for the upstream.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use super::{RemoteWriteError, Version};

const V1_CONTENT_TYPE: &str = "application/x-protobuf";
const V1_PROTO: &str = "prometheus.WriteRequest";
const V2_PROTO: &str = "io.prometheus.write.v2.Request";
pub(super) const V2_CONTENT_TYPE: &str =
    "application/x-protobuf;proto=io.prometheus.write.v2.Request";
const VERSION_HEADER: HeaderName = HeaderName::from_static("x-prometheus-remote-write-version");

/// Reads the headers a receiver picks its decoder by, as one decision: the
/// remote-write version (`Content-Type`) and that the body is snappy
/// (`Content-Encoding`; absent means snappy, as every receiver assumes).
/// Media types and codings are case-insensitive (RFC 9110); parameters are
/// read strictly: exactly `;proto=<message>` or none. Anything else, and a
/// repeated header (receivers differ on which copy they read), is 415.
pub fn read_headers(headers: &HeaderMap) -> Result<Version, RemoteWriteError> {
    let version = version_of(headers)?;
    match single_header(headers, &header::CONTENT_ENCODING)? {
        None => Ok(version),
        Some(coding) if coding.eq_ignore_ascii_case("snappy") => Ok(version),
        Some(coding) => Err(RemoteWriteError::Unsupported(format!(
            "content encoding {coding:?}: remote-write bodies are snappy-compressed (block format)"
        ))),
    }
}

/// The version a `Content-Type` declares. A receiver that reads it
/// differently from us would decode 2.0 as 1.0 (and drop the data while
/// answering 2xx), hence the strict reading of parameters.
fn version_of(headers: &HeaderMap) -> Result<Version, RemoteWriteError> {
    let Some(value) = single_header(headers, &header::CONTENT_TYPE)? else {
        return Ok(Version::V1); // Prometheus 2.x senders before 2.0 support
    };
    let (media, params) = value.split_once(';').unwrap_or((value, ""));
    if !media.eq_ignore_ascii_case(V1_CONTENT_TYPE) {
        return Err(RemoteWriteError::Unsupported(format!(
            "content type {value:?}"
        )));
    }
    match params.strip_prefix("proto=") {
        None if params.is_empty() => Ok(Version::V1),
        Some(V1_PROTO) => Ok(Version::V1),
        Some(V2_PROTO) => Ok(Version::V2),
        _ => Err(RemoteWriteError::Unsupported(format!(
            "content type {value:?}"
        ))),
    }
}

/// Whether the sender meant a 2.0 request, by any spelling of either header
/// that says so: a body passed through unread (header mode) is judged by
/// what its sender will expect of the answer, not by one receiver's reading
/// of the headers.
pub fn sender_expects_v2(headers: &HeaderMap) -> bool {
    let v2 = V2_PROTO.as_bytes();
    let content_type_says = headers.get_all(header::CONTENT_TYPE).iter().any(|value| {
        value
            .as_bytes()
            .windows(v2.len())
            .any(|w| w.eq_ignore_ascii_case(v2))
    });
    let version_says = headers
        .get_all(VERSION_HEADER)
        .iter()
        .any(|value| value.as_bytes().trim_ascii().starts_with(b"2"));
    content_type_says || version_says
}

/// The one value of a header, if any; a repeated one is 415.
fn single_header<'h>(
    headers: &'h HeaderMap,
    name: &HeaderName,
) -> Result<Option<&'h str>, RemoteWriteError> {
    crate::http::headers::single_value(headers, name).map_err(RemoteWriteError::Unsupported)
}

/// Replaces the headers a receiver decodes by with the canonical spelling
/// of what the proxy read and checked: a receiver compares the media type
/// case-sensitively (Prometheus 3 does), or would take a missing coding or
/// version header differently from us.
pub fn set_upstream_headers(version: Version, headers: &mut HeaderMap) {
    let (content_type, protocol) = match version {
        Version::V1 => (V1_CONTENT_TYPE, "0.1.0"),
        Version::V2 => (V2_CONTENT_TYPE, "2.0.0"),
    };
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static("snappy"));
    headers.insert(VERSION_HEADER, HeaderValue::from_static(protocol));
}
