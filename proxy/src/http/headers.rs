//! Header names the proxy reads, strips or sets, in one place.

use http::header::{HeaderName, HeaderValue};
use http::uri::{Authority, Scheme};
use http::HeaderMap;

/// The tenant header of Loki, Mimir and Cortex. Always stripped from the
/// client's request and set from the authenticated credential.
pub const X_SCOPE_ORGID: HeaderName = HeaderName::from_static("x-scope-orgid");

/// Loki's label-based access control header (Loki >= 3.7, experimental).
/// A client copy would grant itself a policy, so it is always stripped.
pub const X_PROM_LABEL_POLICY: HeaderName = HeaderName::from_static("x-prom-label-policy");

/// Appended with the client's address so the upstream's logs name the real peer.
pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Not in the `http` crate's constants; hop-by-hop per RFC 9110 §7.6.1.
pub const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
pub const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

/// Thanos' tenant header, the default of Receive's `--receive.tenant-header`
/// and Querier's `--query.tenant-header` (read with
/// `--query.enforce-tenancy`): like `X-Scope-OrgID`, never the client's to
/// choose, in any mode, whether or not `metrics.header` names it.
pub const THANOS_TENANT: HeaderName = HeaderName::from_static("thanos-tenant");

/// Headers that identify the caller to a multi-tenant backend. Every client
/// copy of each, in any letter case, is removed before the proxy sets its own.
/// (`http::HeaderMap` stores names lower-cased, so one `remove` drops them all.)
pub const IDENTITY_HEADERS: [HeaderName; 4] = [
    http::header::AUTHORIZATION,
    X_SCOPE_ORGID,
    X_PROM_LABEL_POLICY,
    THANOS_TENANT,
];

/// Headers with which a backend's own components, or callers it trusts,
/// turn its checks off or set them. A tenant's client is not such a
/// caller, so every client copy is removed, in every mode:
/// - Mimir's distributor skips label name checks and the
///   `max_label_names_per_series` limit once
///   `-api.skip-label-name-validation-header-enabled` or
///   `-api.skip-label-count-validation-header-enabled` is set ("allowing
///   this for external clients allows any client to send invalid label
///   names");
/// - Loki's distributor (after 3.7) takes a push with a backfill shard or
///   day, set by a backfill worker, past `reject_old_samples`;
/// - Loki's ingesters and store leave out the pipeline wrapper that a
///   build embedding Loki installs around every query's log lines
///   (`Config.PipelineWrapper`, an embedder's hook) when a request says
///   `X-Loki-Disable-Pipeline-Wrappers: true`; the header is meant for the
///   embedder's own queries. OSS Loki installs no wrapper, so this only
///   keeps a tenant from turning off a hook it cannot see;
/// - Loki's queriers, with `-querier.per-request-limits-enabled`, take
///   limits for the request from `X-Loki-Query-Limits`, which a gateway
///   imposing them sets. They can only be tighter than the tenant's, but a
///   client that sets its own `maxQueryBytesRead` has every query sized
///   against it and refused with the size of all the streams its selector
///   matches, those a label policy hides included (docs/security.md).
pub const TRUSTED_CALLER_HEADERS: [HeaderName; 6] = [
    HeaderName::from_static("x-mimir-skiplabelnamevalidation"),
    HeaderName::from_static("x-mimir-skiplabelcountvalidation"),
    HeaderName::from_static("x-loki-backfill-shard"),
    HeaderName::from_static("x-loki-backfill-day"),
    HeaderName::from_static("x-loki-disable-pipeline-wrappers"),
    HeaderName::from_static("x-loki-query-limits"),
];

/// Whether a header's name holds `_`. Such a header is never forwarded:
/// some readers take `_` for `-` (CGI, WSGI and Rack name both
/// `X_Scope_OrgID` and `X-Scope-OrgID` `HTTP_X_SCOPE_ORGID`; nginx's
/// `$http_x_scope_orgid` finds either once `underscores_in_headers` is on),
/// so a component between the proxy and a backend could read one as a
/// header the proxy removes or sets. No backend's header has a `_`, and
/// nginx drops such headers by default (`underscores_in_headers off`), so
/// dropping them costs no client anything.
pub fn read_as_dashed(name: &HeaderName) -> bool {
    name.as_str().as_bytes().contains(&b'_')
}

/// A remote-write 2.0 receiver confirms what it stored with these; a 2xx
/// without any of them means the receiver read the body as 1.0 (and stored
/// nothing).
const RW_WRITTEN: [HeaderName; 3] = [
    HeaderName::from_static("x-prometheus-remote-write-samples-written"),
    HeaderName::from_static("x-prometheus-remote-write-histograms-written"),
    HeaderName::from_static("x-prometheus-remote-write-exemplars-written"),
];

/// Whether an answer confirms a remote-write 2.0 request: one of the
/// written-count headers, not empty, as Prometheus' sender reads them
/// (`ParseWriteResponseStats`: an empty header confirms nothing).
pub fn confirms_remote_write_2(headers: &HeaderMap) -> bool {
    RW_WRITTEN
        .iter()
        .any(|name| headers.get(name).is_some_and(|value| !value.is_empty()))
}

/// Whether a request body is uncompressed: no `Content-Encoding`, or only
/// `identity` (or nothing) in every copy (a reader of another copy must
/// not find a coding the proxy did not see).
pub fn identity_coded(headers: &HeaderMap) -> bool {
    headers
        .get_all(http::header::CONTENT_ENCODING)
        .iter()
        .all(|value| value.is_empty() || value.as_bytes().eq_ignore_ascii_case(b"identity"))
}

/// The comma-separated elements of a header value, trimmed, empty ones
/// kept (RFC 9110 §5.6.1): where framing is concerned, `5,` or `chunked,`
/// is refused, as hyper refuses it, not read as `5`.
pub fn elements(value: &HeaderValue) -> impl Iterator<Item = &[u8]> {
    value
        .as_bytes()
        .split(|&b| b == b',')
        .map(|element| element.trim_ascii())
}

/// The elements of every copy of the list header `name`, empty ones
/// skipped: a list may be split across copies (RFC 9110 §5.3).
pub fn list<'h>(
    headers: &'h HeaderMap,
    name: &HeaderName,
) -> impl Iterator<Item = &'h [u8]> + use<'h> {
    (headers.get_all(name).iter())
        .flat_map(elements)
        .filter(|element| !element.is_empty())
}

/// Whether the list header `name` holds `token` (case-insensitively, as
/// `Connection` options and codings compare).
pub fn lists(headers: &HeaderMap, name: &HeaderName, token: &[u8]) -> bool {
    list(headers, name).any(|element| element.eq_ignore_ascii_case(token))
}

/// The one value of a header a body is decoded by, if any. A repeated
/// header is refused, not read one way: receivers differ on which copy
/// they take (Go's `Header.Get` the first, others the last or all).
pub fn single_value<'h>(
    headers: &'h HeaderMap,
    name: &HeaderName,
) -> Result<Option<&'h str>, String> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(format!("more than one {name} header"));
    }
    value
        .to_str()
        .map(Some)
        .map_err(|_| format!("non-ASCII {name}"))
}

/// Everything but the unreserved characters (RFC 3986) is percent-encoded.
const POLICY_SELECTOR: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// The value of `X-Prom-Label-Policy` restricting `tenant` to `selector`:
/// `<tenant>:<selector, percent-encoded>`, as Loki and Mimir parse it (Go's
/// `url.PathUnescape`, which decodes any `%XX`).
pub fn label_policy(tenant: &str, selector: &str) -> http::HeaderValue {
    let encoded = percent_encoding::utf8_percent_encode(selector, POLICY_SELECTOR);
    // Tenant ids are validated to a header-safe charset; the rest is ASCII.
    http::HeaderValue::from_str(&format!("{tenant}:{encoded}")).expect("an ASCII header value")
}

/// The `Host` an origin server expects for `scheme://authority`: the
/// authority without the scheme's default port. `None` if it cannot be a
/// header value.
pub fn host_value(scheme: &Scheme, authority: &Authority) -> Option<HeaderValue> {
    let default_port = if *scheme == Scheme::HTTPS { 443 } else { 80 };
    let host = match authority.port_u16() {
        Some(port) if port != default_port => authority.as_str(),
        _ => authority.host(),
    };
    HeaderValue::from_str(host).ok()
}

#[cfg(test)]
mod tests {
    use http::header::{HeaderMap, HeaderValue, CONNECTION};

    #[test]
    fn a_list_is_read_across_every_copy_trimmed_without_empty_elements() {
        let mut headers = HeaderMap::new();
        for value in [&b" Keep-Alive ,, X-Hop"[..], b"", b"UPGRADE,\xe9t\xe9"] {
            headers.append(CONNECTION, HeaderValue::from_bytes(value).unwrap());
        }
        let listed: Vec<&[u8]> = super::list(&headers, &CONNECTION).collect();
        assert_eq!(
            listed,
            [&b"Keep-Alive"[..], b"X-Hop", b"UPGRADE", b"\xe9t\xe9"]
        );
        assert!(super::lists(&headers, &CONNECTION, b"upgrade"));
        assert!(super::lists(&headers, &CONNECTION, b"keep-alive"));
        assert!(!super::lists(&headers, &CONNECTION, b"close"));
        assert!(!super::lists(&headers, &CONNECTION, b""));
    }

    #[test]
    fn host_drops_only_the_schemes_default_port() {
        let host = |uri: &str| {
            let uri: http::Uri = uri.parse().unwrap();
            super::host_value(uri.scheme().unwrap(), uri.authority().unwrap()).unwrap()
        };
        assert_eq!(host("http://loki:80/"), "loki");
        assert_eq!(host("http://loki/"), "loki");
        assert_eq!(host("http://loki:3100/"), "loki:3100");
        assert_eq!(host("https://loki:443/"), "loki");
        assert_eq!(host("https://loki:80/"), "loki:80");
        assert_eq!(host("http://[::1]:3100/"), "[::1]:3100");
    }

    #[test]
    fn label_policy_is_tenant_colon_percent_encoded_selector() {
        let value = super::label_policy("team-a", r#"{app="pay ments", env=~"a|b"}"#);
        assert_eq!(
            value.to_str().unwrap(),
            "team-a:%7Bapp%3D%22pay%20ments%22%2C%20env%3D~%22a%7Cb%22%7D"
        );
    }

    #[test]
    fn only_identity_in_every_copy_is_uncompressed() {
        let coded = |values: &[&'static str]| {
            let mut headers = http::HeaderMap::new();
            for value in values {
                headers.append("content-encoding", http::HeaderValue::from_static(value));
            }
            super::identity_coded(&headers)
        };
        assert!(coded(&[]) && coded(&[""]));
        assert!(coded(&["identity"]) && coded(&["IDENTITY", "identity"]));
        assert!(!coded(&["gzip"]) && !coded(&["identity", "gzip"]));
    }

    #[test]
    fn any_written_count_confirms_a_2_0_write_and_an_empty_one_does_not() {
        let confirms = |pairs: &[(&'static str, &'static str)]| {
            let mut headers = http::HeaderMap::new();
            for (name, value) in pairs {
                headers.insert(*name, http::HeaderValue::from_static(value));
            }
            super::confirms_remote_write_2(&headers)
        };
        assert!(confirms(&[(
            "x-prometheus-remote-write-samples-written",
            "3"
        )]));
        assert!(confirms(&[(
            "x-prometheus-remote-write-histograms-written",
            "0"
        )]));
        assert!(confirms(&[(
            "X-Prometheus-Remote-Write-Exemplars-Written",
            "1"
        )]));
        assert!(!confirms(&[]));
        assert!(!confirms(&[(
            "x-prometheus-remote-write-samples-written",
            ""
        )]));
        assert!(!confirms(&[("x-prometheus-remote-write-version", "2.0.0")]));
    }
}
