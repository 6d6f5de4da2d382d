//! Who the client is, for throttling failed logins and for the access log:
//! the TCP peer, unless the peer is one of the operator's own proxies (an
//! ingress, a load balancer), which name the client in `X-Forwarded-For`.
//!
//! Read as nginx's `real_ip_recursive on` reads it: from the right, every
//! address of a trusted proxy is skipped, and the first other one is the
//! client. Anything to its left was written by the client itself and is
//! never believed. An entry that is not an address (with or without a
//! port) ends the walk at the last trusted hop, as does a list of trusted
//! addresses only.

use std::net::IpAddr;

use http::HeaderMap;
use serde::Deserialize;

use super::headers::X_FORWARDED_FOR;

/// Networks whose peers are believed about the client (`10.0.0.0/8`,
/// `fd00::/8`, or one address). Empty, the default: the TCP peer is the
/// client and `X-Forwarded-For` is never read.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(try_from = "Vec<String>")]
pub struct TrustedProxies {
    networks: Vec<Network>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Network {
    address: IpAddr,
    prefix: u8,
}

impl Network {
    fn parse(text: &str) -> Result<Self, String> {
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text, None),
        };
        let address: IpAddr = address
            .parse()
            .map_err(|_| format!("{text:?}: not an IP address or network"))?;
        let bits = if address.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => bits,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= bits)
                .ok_or_else(|| format!("{text:?}: the prefix must be 0 to {bits}"))?,
        };
        let network = Self { address, prefix };
        if network.masked(address) != address {
            return Err(format!(
                "{text:?}: host bits are set (the network is {}/{prefix})",
                network.masked(address)
            ));
        }
        Ok(network)
    }

    /// `ip` with the bits past the prefix cleared.
    fn masked(&self, ip: IpAddr) -> IpAddr {
        network_of(ip, self.prefix)
    }

    fn contains(&self, ip: IpAddr) -> bool {
        // An IPv4 peer on a dual-stack socket arrives as `::ffff:a.b.c.d`.
        let ip = ip.to_canonical();
        ip.is_ipv4() == self.address.is_ipv4() && self.masked(ip) == self.address
    }
}

/// The key a client is counted under (failed logins, connections open):
/// an IPv6 client's /64, which one host is usually given whole and can
/// walk through address by address (privacy addresses, or on purpose) to
/// start a fresh count with each; an IPv4 client's own address (also when
/// it arrives as `::ffff:a.b.c.d` on a dual-stack socket).
pub fn counted_as(client: IpAddr) -> IpAddr {
    match client.to_canonical() {
        v6 @ IpAddr::V6(_) => network_of(v6, 64),
        v4 => v4,
    }
}

/// `ip` with the bits past the first `prefix` cleared: the network of that
/// size it is in (`prefix` at most the family's 32 or 128 bits).
pub fn network_of(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::from((u32::from(v4) & mask).to_be_bytes())
        }
        IpAddr::V6(v6) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::from((u128::from(v6) & mask).to_be_bytes())
        }
    }
}

impl TryFrom<Vec<String>> for TrustedProxies {
    type Error = String;

    fn try_from(list: Vec<String>) -> Result<Self, String> {
        let networks = list
            .iter()
            .map(|text| Network::parse(text.trim()))
            .collect::<Result<_, _>>()
            .map_err(|e| format!("trusted_proxies: {e}"))?;
        Ok(Self { networks })
    }
}

impl TrustedProxies {
    /// Whether a network in the list spans a whole address family
    /// (`0.0.0.0/0`, `::/0`): then any client is believed about itself.
    pub fn trusts_everyone(&self) -> bool {
        self.networks.iter().any(|n| n.prefix == 0)
    }

    fn trusts(&self, ip: IpAddr) -> bool {
        self.networks.iter().any(|n| n.contains(ip))
    }

    /// The client behind `peer`: `peer` itself unless it is trusted.
    pub fn client(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        if self.networks.is_empty() || !self.trusts(peer) {
            return peer;
        }
        // Later copies of the header were appended later: read right to left.
        let mut entries = headers
            .get_all(X_FORWARDED_FOR)
            .iter()
            .rev()
            .flat_map(|value| value.as_bytes().rsplit(|&b| b == b','));
        let mut client = peer;
        loop {
            let Some(entry) = entries.next() else {
                return client;
            };
            let address = std::str::from_utf8(entry).ok().and_then(address);
            match address {
                Some(address) if self.trusts(address) => client = address,
                Some(address) => return address.to_canonical(),
                None => return client,
            }
        }
    }
}

/// An `X-Forwarded-For` entry's address: bare, or with a port as some load
/// balancers write it (Azure Application Gateway: `203.0.113.9:4711`,
/// `[2001:db8::1]:4711`).
fn address(entry: &str) -> Option<IpAddr> {
    let entry = entry.trim();
    entry
        .parse::<IpAddr>()
        .or_else(|_| entry.parse::<std::net::SocketAddr>().map(|s| s.ip()))
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use proptest::prelude::*;

    fn trusted(list: &[&str]) -> TrustedProxies {
        TrustedProxies::try_from(list.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    fn forwarded(copies: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for copy in copies {
            headers.append(X_FORWARDED_FOR, HeaderValue::from_str(copy).unwrap());
        }
        headers
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn networks_are_read_strictly() {
        for bad in [
            "10.0.0.0/33",
            "10.0.0.1/8",
            "fd00::/129",
            "fd00::1/8",
            "10.0.0.0/",
            "ingress",
            "10.0.0.0/-1",
        ] {
            let refused = TrustedProxies::try_from(vec![bad.to_string()]);
            assert!(refused.is_err(), "{bad}");
        }
        let t = trusted(&["10.0.0.0/8", "192.168.1.7", "fd00::/8", "0.0.0.0/0"]);
        assert_eq!(t.networks.len(), 4);
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_forwards() {
        let t = trusted(&["10.0.0.0/8"]);
        let headers = forwarded(&["10.1.1.1"]);
        assert_eq!(t.client(ip("203.0.113.9"), &headers), ip("203.0.113.9"));
        let none = TrustedProxies::default();
        assert_eq!(none.client(ip("10.0.0.1"), &headers), ip("10.0.0.1"));
    }

    #[test]
    fn behind_trusted_proxies_the_rightmost_untrusted_address_is_the_client() {
        let t = trusted(&["10.0.0.0/8", "fd00::/8"]);
        let cases: &[(&[&str], &str)] = &[
            // The client's own claim (left) is never believed.
            (&["198.51.100.1, 203.0.113.9"], "203.0.113.9"),
            (&["198.51.100.1, 203.0.113.9, 10.0.0.2"], "203.0.113.9"),
            (&["198.51.100.1", "203.0.113.9, 10.0.0.2"], "203.0.113.9"),
            (&[" 2001:db8::1 ,fd00::5"], "2001:db8::1"),
            // With a port, as some load balancers write it.
            (&["203.0.113.9:4711, 10.0.0.2:80"], "203.0.113.9"),
            (&["[2001:db8::1]:4711"], "2001:db8::1"),
            // Only trusted hops: the leftmost of them.
            (&["10.0.0.3, 10.0.0.2"], "10.0.0.3"),
            // Not an address: the walk ends at the last trusted hop.
            (&["203.0.113.9, unknown, 10.0.0.2"], "10.0.0.2"),
            (&["203.0.113.9, garbage"], "10.0.0.1"),
            // No header: the peer.
            (&[], "10.0.0.1"),
        ];
        for (copies, client) in cases {
            assert_eq!(
                t.client(ip("10.0.0.1"), &forwarded(copies)),
                ip(client),
                "{copies:?}"
            );
        }
    }

    proptest::proptest! {
        /// Whatever a client writes: the address chosen is the peer's or
        /// one in the header, and every entry to its right is a trusted
        /// proxy's, so no address the client wrote before its first
        /// untrusted hop is ever believed.
        #[test]
        fn the_client_is_the_peer_or_left_of_trusted_hops_only(
            entries in proptest::collection::vec(
                proptest::prop_oneof![
                    (0u8..4).prop_map(|n| format!("10.0.0.{n}")),
                    (0u8..4).prop_map(|n| format!("203.0.113.{n}")),
                    proptest::sample::select(vec!["unknown", "", " ", "fd00::1", "2001:db8::7"])
                        .prop_map(str::to_owned),
                ],
                0..6,
            ),
            split in 0usize..6,
            peer_trusted in proptest::bool::ANY,
        ) {
            let t = trusted(&["10.0.0.0/8", "fd00::/8"]);
            let peer = ip(if peer_trusted { "10.9.9.9" } else { "198.51.100.1" });
            let split = split.min(entries.len());
            let copies = [entries[..split].join(","), entries[split..].join(",")];
            let copies: Vec<&str> = copies.iter().map(String::as_str).collect();
            let client = t.client(peer, &forwarded(&copies));
            if !peer_trusted {
                prop_assert_eq!(client, peer);
                return Ok(());
            }
            if client == peer {
                return Ok(());
            }
            let parsed: Vec<Option<IpAddr>> = entries.iter().map(|e| address(e)).collect();
            let at = parsed.iter().rposition(|a| *a == Some(client));
            prop_assert!(at.is_some(), "{client} is not in {entries:?}");
            for right in &parsed[at.unwrap() + 1..] {
                prop_assert!(right.is_some_and(|a| t.trusts(a)), "{entries:?} -> {client}");
            }
        }
    }

    #[test]
    fn an_ipv4_peer_on_a_dual_stack_socket_is_matched_as_ipv4() {
        let t = trusted(&["127.0.0.0/8"]);
        let headers = forwarded(&["::ffff:203.0.113.9"]);
        assert_eq!(
            t.client(ip("::ffff:127.0.0.1"), &headers),
            ip("203.0.113.9")
        );
    }
}
