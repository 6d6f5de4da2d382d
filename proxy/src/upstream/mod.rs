//! The upstream client and the header hygiene of a forwarded request.

pub mod answer;
mod client;
mod plain;
mod pool;
pub mod tls;

pub use client::{HttpClient, ReadWithBody, Reuse, UpstreamBody, UpstreamError};

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::task::Poll;
use std::time::Duration;

use http::header::{self, Entry, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response};
use hyper_rustls::{FixedServerNameResolver, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use rustls_pki_types::ServerName;

use crate::config::UpstreamTls;
use crate::http::address_text::Peer;
use crate::http::body::ProxyBody;
use crate::http::error::ProxyError;
use crate::http::headers::{
    read_as_dashed, IDENTITY_HEADERS, KEEP_ALIVE, PROXY_CONNECTION, TRUSTED_CALLER_HEADERS,
    X_FORWARDED_FOR,
};
use crate::http::timer::{ReusedSleep, Wait};

/// A client for the upstreams: connections are reused across requests and
/// tenants (the tenant travels in a header, not the connection).
/// `http://` upstreams need no `tls`; `https://` ones use it, or the
/// system's roots without it. `receive_buffer` fixes each connection's
/// kernel receive buffer (`limits.upstream_receive_buffer_bytes`; `None`:
/// the kernel's own sizing).
pub fn client(
    tls: Option<&UpstreamTls>,
    reuse: Reuse,
    receive_buffer: Option<u32>,
) -> Result<HttpClient, String> {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.set_recv_buffer_size(receive_buffer.map(|bytes| bytes as usize));
    http.set_connect_timeout(Some(Duration::from_secs(5)));
    http.enforce_http(false);
    let default = UpstreamTls::default();
    let tls = tls.unwrap_or(&default);
    let builder = HttpsConnectorBuilder::new()
        .with_tls_config(tls::client_config(tls)?)
        .https_or_http();
    let builder = match &tls.server_name {
        Some(name) => {
            let name = ServerName::try_from(name.clone())
                .map_err(|e| format!("server_name {name:?}: {e}"))?;
            builder.with_server_name_resolver(FixedServerNameResolver::new(name))
        }
        None => builder,
    };
    let connector = builder.enable_http1().wrap_connector(http);
    Ok(HttpClient::new(connector, reuse, receive_buffer))
}

/// Hop-by-hop headers (RFC 9110 §7.6.1) that never cross the proxy, besides
/// whatever the `Connection` header lists.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    KEEP_ALIVE,
    PROXY_CONNECTION,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Removes hop-by-hop headers, including those the `Connection` header names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most messages carry none (and so no `Connection` either): one look
    // at each name present instead of a removal per hop-by-hop name.
    if !headers.keys().any(|name| HOP_BY_HOP.contains(name)) {
        return;
    }
    let listed: Vec<HeaderName> = crate::http::headers::list(headers, &header::CONNECTION)
        .filter_map(|name| HeaderName::from_bytes(name).ok())
        .collect();
    for name in listed.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(name);
    }
}

/// Makes a client's headers fit to forward, once `strip_hop_by_hop` has
/// removed what was for the proxy alone (before the request was read, so
/// nothing the proxy sets since can be named away): identity headers
/// removed (every copy, any case), and every header whose name has a `_`
/// (see [`read_as_dashed`]), `Host` set to the upstream's `host` (or,
/// without one, left for the client to set from the upstream URI), the
/// client's address appended to `X-Forwarded-For`, and
/// finally the tenant header set (when the target takes one; in label mode
/// the tenant travels in the rewritten query instead). Stripping before setting is what makes a
/// spoofed tenant header impossible to pass through.
pub fn prepare_request_headers(
    headers: &mut HeaderMap,
    peer: &Peer,
    host: Option<&HeaderValue>,
    tenant_header: Option<(&HeaderName, &HeaderValue)>,
    upgrade: Option<HeaderValue>,
) -> Result<(), ProxyError> {
    // Every request brings `Authorization`; the other identity headers, the
    // trusted callers' headers and names with `_` are rare, so one look at
    // each name present instead of a removal (a hash and a probe) per name.
    headers.remove(header::AUTHORIZATION);
    let tenant_name = tenant_header.map(|(name, _)| name);
    let refused = |name: &HeaderName| {
        IDENTITY_HEADERS.contains(name)
            || TRUSTED_CALLER_HEADERS.contains(name)
            || tenant_name == Some(name)
            || read_as_dashed(name)
    };
    if headers.keys().any(refused) {
        let present: Vec<HeaderName> = headers
            .keys()
            .filter(|name| refused(name))
            .cloned()
            .collect();
        for name in present {
            headers.remove(name);
        }
    }
    // Replaced in place: one lookup, not a removal and an insertion.
    match host {
        Some(host) => headers.insert(header::HOST, host.clone()),
        None => headers.remove(header::HOST),
    };

    // One lookup for reading the client's copies and replacing them.
    match headers.entry(X_FORWARDED_FOR) {
        Entry::Vacant(slot) => {
            slot.insert(peer.header.clone());
        }
        Entry::Occupied(mut slot) => {
            let value = forwarded_for(slot.iter(), peer)?;
            slot.insert(value);
        }
    }

    if let Some((name, tenant)) = tenant_header {
        headers.insert(name.clone(), tenant.clone());
    }

    if let Some(protocol) = upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, protocol);
    }
    Ok(())
}

/// `X-Forwarded-For`: every copy the client sent, in order, as one list (as
/// nginx's `$proxy_add_x_forwarded_for` joins them), then the peer. A copy
/// that is not visible ASCII or is blank adds nothing. Informational only:
/// never trusted.
fn forwarded_for<'a>(
    previous: impl Iterator<Item = &'a HeaderValue>,
    peer: &Peer,
) -> Result<HeaderValue, ProxyError> {
    let mut list = Vec::with_capacity(64);
    let copies = previous
        .filter_map(|v| v.to_str().ok())
        .filter(|v| !v.trim().is_empty());
    for copy in copies {
        list.extend_from_slice(copy.as_bytes());
        list.extend_from_slice(b", ");
    }
    list.extend_from_slice(peer.header.as_bytes());
    HeaderValue::from_bytes(&list)
        .map_err(|_| ProxyError::Internal("unencodable X-Forwarded-For".into()))
}

/// Sends a request and waits for the response head, mapping failures to the
/// party that caused them: an oversized client body is 413, an unreachable
/// or misbehaving upstream 502, a slow one 504.
pub async fn send(
    client: &HttpClient,
    request: Request<ProxyBody>,
    timeout: Duration,
    body_limit: u64,
) -> Result<Response<UpstreamBody>, ProxyError> {
    // `tokio::time::timeout` with a reused timer (http/timer.rs): the
    // answer is polled first, then the deadline.
    let mut deadline = ReusedSleep::until(Wait::Upstream, tokio::time::Instant::now() + timeout);
    let mut answered = pin!(client.request(request));
    let answered = poll_fn(|cx| match answered.as_mut().poll(cx) {
        Poll::Ready(answered) => Poll::Ready(Some(answered)),
        Poll::Pending => Pin::new(&mut deadline).poll(cx).map(|()| None),
    })
    .await;
    match answered {
        None => Err(ProxyError::UpstreamTimeout),
        Some(Ok(response)) => Ok(response),
        Some(Err(e)) => Err(client_body_fault(&e, body_limit)
            .unwrap_or_else(|| ProxyError::UpstreamUnavailable(Box::new(e)))),
    }
}

/// The client's fault, if the request failed because its body was too
/// large or too slow while it streamed to the upstream.
fn client_body_fault(error: &(dyn std::error::Error + 'static), limit: u64) -> Option<ProxyError> {
    let mut source = Some(error);
    while let Some(e) = source {
        if e.is::<http_body_util::LengthLimitError>() {
            return Some(ProxyError::BodyTooLarge { limit });
        }
        if e.is::<crate::http::body::BodyTimeout>() {
            return Some(ProxyError::BodyTimeout);
        }
        source = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::headers::X_SCOPE_ORGID;
    use proptest::strategy::Strategy;

    #[test]
    fn strips_spoofed_identity_and_sets_the_tenant_once() {
        let mut h = HeaderMap::new();
        for (name, value) in [
            ("X-Scope-OrgID", "evil"),
            ("x-scope-orgid", "evil2"),
            ("authorization", "Basic abc"),
            ("x-prom-label-policy", "evil:{}"),
            ("THANOS-TENANT", "evil"),
            ("X-Mimir-SkipLabelNameValidation", "true"),
            ("x-mimir-skiplabelcountvalidation", "true"),
            ("X-Loki-Backfill-Shard", "old"),
            ("X-Loki-Backfill-Day", "2020-01-01"),
            ("X-Loki-Disable-Pipeline-Wrappers", "true"),
            ("X-Loki-Query-Limits", r#"{"maxQueryBytesRead":"1B"}"#),
            ("connection", "x-secret, keep-alive"),
            ("x-secret", "1"),
            ("host", "attacker"),
        ] {
            h.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_static(value),
            );
        }
        let peer = Peer::new("127.0.0.2:4711".parse().unwrap());
        strip_hop_by_hop(&mut h);
        prepare_request_headers(
            &mut h,
            &peer,
            None,
            Some((&X_SCOPE_ORGID, &HeaderValue::from_static("team-a"))),
            None,
        )
        .unwrap();
        let orgids: Vec<_> = h.get_all(X_SCOPE_ORGID).iter().collect();
        assert_eq!(orgids, vec![HeaderValue::from_static("team-a")]);
        for gone in [
            "authorization",
            "x-prom-label-policy",
            "thanos-tenant",
            "x-mimir-skiplabelnamevalidation",
            "x-mimir-skiplabelcountvalidation",
            "x-loki-backfill-shard",
            "x-loki-backfill-day",
            "x-loki-disable-pipeline-wrappers",
            "x-loki-query-limits",
            "connection",
            "x-secret",
            "host",
        ] {
            assert!(!h.contains_key(gone), "{gone}");
        }
        assert_eq!(h[X_FORWARDED_FOR], "127.0.0.2");
    }

    /// The look for refused headers is a shortcut: it must see each one
    /// alone, not only beside a spoofed tenant header.
    #[test]
    fn each_refused_header_is_removed_when_it_comes_alone() {
        let peer = Peer::new("127.0.0.1:4711".parse().unwrap());
        let team_a = HeaderValue::from_static("team-a");
        for name in IDENTITY_HEADERS.iter().chain(&TRUSTED_CALLER_HEADERS) {
            // Label mode (no tenant header), then header mode.
            for tenant_header in [None, Some((&X_SCOPE_ORGID, &team_a))] {
                let mut h = HeaderMap::new();
                h.insert(name.clone(), HeaderValue::from_static("spoofed"));
                prepare_request_headers(&mut h, &peer, None, tenant_header, None).unwrap();
                let left: Vec<_> = h.get_all(name).iter().collect();
                let expected: &[&HeaderValue] = match tenant_header {
                    Some((tenant, value)) if tenant == name => &[value],
                    _ => &[],
                };
                assert_eq!(left, expected, "{name} with {tenant_header:?}");
            }
        }
    }

    /// A header whose name has `_` may be read as the one with `-` by a
    /// component between the proxy and the backend: none is forwarded, in
    /// either mode, and the tenant header is the proxy's alone.
    #[test]
    fn no_header_named_with_an_underscore_is_forwarded() {
        let peer = Peer::new("127.0.0.1:4711".parse().unwrap());
        let team_a = HeaderValue::from_static("team-a");
        for tenant_header in [None, Some((&X_SCOPE_ORGID, &team_a))] {
            let mut h = HeaderMap::new();
            for name in [
                "X_Scope_OrgID",
                "x-scope_orgid",
                "THANOS_TENANT",
                "x_loki_backfill_day",
                "content_encoding",
                "x_anything",
            ] {
                h.append(
                    HeaderName::from_bytes(name.as_bytes()).unwrap(),
                    HeaderValue::from_static("team-b"),
                );
            }
            h.insert("x-query-tags", HeaderValue::from_static("source=grafana"));
            prepare_request_headers(&mut h, &peer, None, tenant_header, None).unwrap();
            let mut left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
            left.sort_unstable();
            let expected: &[&str] = match tenant_header {
                None => &["x-forwarded-for", "x-query-tags"],
                Some(_) => &["x-forwarded-for", "x-query-tags", "x-scope-orgid"],
            };
            assert_eq!(left, expected, "{tenant_header:?}");
            if tenant_header.is_some() {
                assert_eq!(h[X_SCOPE_ORGID], "team-a");
            }
        }
    }

    /// A name the proxy removes or sets, as some reader could take `name`:
    /// letter case ignored, `_` read as `-`.
    fn reads_as_protected(name: &str, tenant: Option<&HeaderName>) -> bool {
        let read = name.to_ascii_lowercase().replace('_', "-");
        (IDENTITY_HEADERS.iter().chain(&TRUSTED_CALLER_HEADERS))
            .chain(tenant)
            .any(|protected| protected.as_str() == read)
    }

    proptest::proptest! {
        /// Whatever names and spellings a client sends, what goes on holds
        /// no header some reader could take for one the proxy removes or
        /// sets, and no name with `_`; the tenant header (header mode) is
        /// the proxy's alone; every other header goes on with all its
        /// values, in order (`Host` and `X-Forwarded-For` aside: the
        /// proxy writes those).
        #[test]
        fn what_goes_on_is_the_clients_headers_less_those_a_reader_could_misread(
            sent in proptest::collection::vec(
                (
                    proptest::prop_oneof![
                        proptest::sample::select(vec![
                            "x-scope-orgid", "thanos-tenant", "x-prom-label-policy",
                            "authorization", "x-loki-query-limits",
                            "x-mimir-skiplabelnamevalidation", "x-query-tags",
                            "x-grafana-org-id", "accept", "user-agent",
                        ]).prop_map(str::to_owned),
                        "[a-z][a-z0-9]{0,6}",
                    ],
                    proptest::collection::vec(proptest::bool::ANY, 0..24),
                    proptest::collection::vec(proptest::bool::ANY, 0..24),
                    "[ -~]{0,12}",
                ),
                0..10,
            ),
            header_mode in proptest::bool::ANY,
        ) {
            let peer = Peer::new("127.0.0.1:4711".parse().unwrap());
            let (orgid, team_a) = (X_SCOPE_ORGID, HeaderValue::from_static("team-a"));
            let tenant_header = header_mode.then_some((&orgid, &team_a));
            let mut h = HeaderMap::new();
            for (name, upper, underscore, value) in &sent {
                // Each letter upper-cased and each `-` written `_` by the flags.
                let name: String = (name.chars().enumerate())
                    .map(|(i, c)| match c {
                        '-' if underscore.get(i) == Some(&true) => '_',
                        c if upper.get(i) == Some(&true) => c.to_ascii_uppercase(),
                        c => c,
                    })
                    .collect();
                h.append(
                    HeaderName::from_bytes(name.as_bytes()).unwrap(),
                    HeaderValue::from_str(value).unwrap(),
                );
            }
            let before = h.clone();
            prepare_request_headers(&mut h, &peer, None, tenant_header, None).unwrap();
            for name in h.keys() {
                proptest::prop_assert!(!name.as_str().contains('_'), "{name} went on");
                if Some(name) != tenant_header.map(|(tenant, _)| tenant) {
                    proptest::prop_assert!(
                        !reads_as_protected(name.as_str(), None),
                        "{name} went on"
                    );
                }
            }
            if let Some((tenant, value)) = tenant_header {
                let set: Vec<_> = h.get_all(tenant).iter().collect();
                proptest::prop_assert_eq!(set, vec![value]);
            }
            let tenant = tenant_header.map(|(tenant, _)| tenant);
            for name in before.keys() {
                let written = [header::HOST, X_FORWARDED_FOR].contains(name);
                if written || name.as_str().contains('_') || reads_as_protected(name.as_str(), tenant) {
                    continue;
                }
                let kept: Vec<_> = h.get_all(name).iter().collect();
                let sent: Vec<_> = before.get_all(name).iter().collect();
                proptest::prop_assert_eq!(kept, sent, "{}", name);
            }
        }
    }

    #[test]
    fn the_clients_host_gives_way_to_the_upstreams() {
        let peer = Peer::new("127.0.0.1:4711".parse().unwrap());
        let mut h = HeaderMap::new();
        h.append(header::HOST, HeaderValue::from_static("attacker"));
        h.append(header::HOST, HeaderValue::from_static("attacker-again"));
        let loki = HeaderValue::from_static("loki:3100");
        prepare_request_headers(&mut h, &peer, Some(&loki), None, None).unwrap();
        let hosts: Vec<_> = h.get_all(header::HOST).iter().collect();
        assert_eq!(hosts, [loki]);
    }

    #[test]
    fn appends_to_an_existing_forwarded_for() {
        let mut h = HeaderMap::new();
        h.insert(X_FORWARDED_FOR, HeaderValue::from_static("10.0.0.1"));
        let peer = Peer::new("127.0.0.1:4711".parse().unwrap());
        prepare_request_headers(&mut h, &peer, None, None, None).unwrap();
        assert!(!h.contains_key(X_SCOPE_ORGID));
        assert_eq!(h[X_FORWARDED_FOR], "10.0.0.1, 127.0.0.1");
    }

    #[test]
    fn every_forwarded_for_copy_is_kept_in_order_and_unreadable_ones_add_nothing() {
        let mut h = HeaderMap::new();
        for copy in [
            &b"10.0.0.1, 10.0.0.2"[..],
            b"  ",
            b"caf\xc3\xa9",
            b"10.0.0.3",
        ] {
            h.append(X_FORWARDED_FOR, HeaderValue::from_bytes(copy).unwrap());
        }
        let peer = Peer::new("127.0.0.1:4711".parse().unwrap());
        prepare_request_headers(&mut h, &peer, None, None, None).unwrap();
        let sent: Vec<_> = h.get_all(X_FORWARDED_FOR).iter().collect();
        assert_eq!(sent, ["10.0.0.1, 10.0.0.2, 10.0.0.3, 127.0.0.1"]);
    }
}
