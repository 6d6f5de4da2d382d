//! Any `X-Forwarded-For` copies behind a trusted peer. Invariant: the
//! client chosen is the peer, or an address written in the header with
//! only trusted proxies' addresses to its right (so nothing a client
//! wrote left of its own untrusted hop is believed); an untrusted peer is
//! always the client, whatever the header says.
#![no_main]

use std::net::{IpAddr, SocketAddr};

use libfuzzer_sys::fuzz_target;
use tenant_proxy::http::client_address::TrustedProxies;

/// An entry as the proxy reads one: an address, bare or with a port.
fn address(entry: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(entry).ok()?.trim();
    text.parse::<IpAddr>()
        .or_else(|_| text.parse::<SocketAddr>().map(|s| s.ip()))
        .ok()
}

fuzz_target!(|data: &[u8]| {
    let trusted =
        TrustedProxies::try_from(vec!["10.0.0.0/8".to_string(), "fd00::/8".to_string()]).unwrap();
    let is_trusted = |ip: IpAddr| {
        let ip = ip.to_canonical();
        match ip {
            IpAddr::V4(v4) => v4.octets()[0] == 10,
            IpAddr::V6(v6) => v6.octets()[0] == 0xfd,
        }
    };
    // Copies of the header separated by 0xff (never valid in a value).
    let mut headers = http::HeaderMap::new();
    let mut copies = Vec::new();
    for copy in data.split(|&b| b == 0xff) {
        let Ok(value) = http::HeaderValue::from_bytes(copy) else {
            return;
        };
        headers.append("x-forwarded-for", value);
        copies.push(copy);
    }
    let outside: IpAddr = "198.51.100.1".parse().unwrap();
    assert_eq!(trusted.client(outside, &headers), outside);

    let peer: IpAddr = "10.9.9.9".parse().unwrap();
    let client = trusted.client(peer, &headers);
    if client == peer {
        return;
    }
    let entries: Vec<Option<IpAddr>> = copies
        .iter()
        .flat_map(|copy| copy.split(|&b| b == b','))
        .map(address)
        .collect();
    let at = entries
        .iter()
        .rposition(|a| a.map(|a| a.to_canonical()) == Some(client))
        .expect("the client chosen is written in the header");
    for right in &entries[at + 1..] {
        assert!(right.is_some_and(is_trusted), "{entries:?} -> {client}");
    }
});
