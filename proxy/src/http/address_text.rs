//! An IP address as text, exactly as `Display` writes it. Every request
//! writes its client's address twice (`X-Forwarded-For` and the access
//! line), and for IPv4, the usual client, `Display` runs the formatting
//! machinery once per octet: it cost more than the rest of the header
//! work. IPv4 is written by hand here; IPv6 goes through `Display`.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use http::HeaderValue;

use super::large_bodies::UncountedShare;

/// A client connection's peer, handed to each of its requests: one
/// reference counted, so that a request's copy costs one count.
#[derive(Clone, Debug)]
pub struct Peer(Arc<PeerInfo>);

/// What a [`Peer`] holds.
#[derive(Debug)]
pub struct PeerInfo {
    pub address: SocketAddr,
    /// The address as text in a header value (`X-Forwarded-For`), written
    /// once per connection instead of once per request.
    pub header: HeaderValue,
    /// The body bytes its requests may hold uncounted, together.
    pub uncounted: UncountedShare,
}

impl Peer {
    pub fn new(address: SocketAddr) -> Self {
        let mut text = String::with_capacity(45);
        push_address(&mut text, address.ip());
        let header = HeaderValue::from_str(&text).expect("an address is written in visible ASCII");
        Self(Arc::new(PeerInfo {
            address,
            header,
            uncounted: UncountedShare::default(),
        }))
    }
}

impl std::ops::Deref for Peer {
    type Target = PeerInfo;

    fn deref(&self) -> &PeerInfo {
        &self.0
    }
}

/// Shows its address as `IpAddr`'s `Display` does, padding included.
pub struct AddressText(pub IpAddr);

impl fmt::Display for AddressText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            IpAddr::V4(v4) => f.pad(v4_text(v4, &mut [0; 15])),
            IpAddr::V6(_) => fmt::Display::fmt(&self.0, f),
        }
    }
}

/// Appends `ip` as `Display` writes it.
pub fn push_address(out: &mut String, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => out.push_str(v4_text(v4, &mut [0; 15])),
        IpAddr::V6(_) => out.push_str(&ip.to_string()),
    }
}

/// Dotted decimal, no leading zeros, written into `buf` (the longest,
/// `255.255.255.255`, is 15 bytes).
fn v4_text(v4: Ipv4Addr, buf: &mut [u8; 15]) -> &str {
    let mut len = 0;
    for (i, octet) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            buf[len] = b'.';
            len += 1;
        }
        let digits = [octet / 100, octet / 10 % 10, octet % 10];
        let first = match octet {
            100.. => 0,
            10..=99 => 1,
            _ => 2,
        };
        for digit in &digits[first..] {
            buf[len] = b'0' + digit;
            len += 1;
        }
    }
    std::str::from_utf8(&buf[..len]).expect("digits and dots are ASCII")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The hand-written address is what `Display` writes, padded or not.
        #[test]
        fn addresses_are_written_as_display_writes_them(bits in any::<u32>(), v6 in any::<u128>()) {
            for ip in [IpAddr::from(bits.to_be_bytes()), IpAddr::from(v6.to_be_bytes())] {
                let mut out = String::from("x");
                push_address(&mut out, ip);
                prop_assert_eq!(out, format!("x{ip}"));
                prop_assert_eq!(AddressText(ip).to_string(), ip.to_string());
                prop_assert_eq!(format!("{:>20}", AddressText(ip)), format!("{ip:>20}"));
            }
        }
    }

    #[test]
    fn a_peer_header_is_its_address_as_display_writes_it() {
        for text in ["10.0.100.9", "::1", "fe80::1", "::ffff:1.2.3.4"] {
            let ip: IpAddr = text.parse().unwrap();
            let peer = Peer::new(SocketAddr::new(ip, 4711));
            assert_eq!(peer.header, ip.to_string().as_str());
        }
    }

    #[test]
    fn the_extremes_of_ipv4() {
        for text in ["0.0.0.0", "255.255.255.255", "10.0.100.9", "1.22.133.4"] {
            let ip: IpAddr = text.parse().unwrap();
            assert_eq!(AddressText(ip).to_string(), text);
        }
    }
}
