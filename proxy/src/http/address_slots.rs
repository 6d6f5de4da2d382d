//! Connections open at once from one client address
//! (`limits.max_connections_per_address`, off unless set).
//!
//! `limits.max_connections` keeps a flood of connections from taking the
//! proxy's memory, but not from taking every slot: one address that opens
//! them all and sends a request every few seconds on each keeps every other
//! client waiting in the listen backlog. With a cap per address, a
//! connection beyond it is closed as soon as it is accepted, before any
//! byte is read, so it holds neither a slot nor a task.
//!
//! The address is the TCP peer's (an IPv6 peer by its /64, as failed logins
//! are counted): `X-Forwarded-For` arrives only with a request, after the
//! connection is taken in. Behind a load balancer or an ingress that does
//! not keep the client's address, every connection has the balancer's
//! address, so the cap is left off there.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use super::client_address::counted_as;

/// Connections open per address, each counted while its [`AddressHeld`]
/// lives.
#[derive(Debug)]
pub struct AddressSlots {
    max: usize,
    /// Only addresses with a connection open: at most as many entries as
    /// the listener has connections.
    open: Mutex<HashMap<IpAddr, usize>>,
}

impl AddressSlots {
    /// `None` when `max` is 0 (no cap).
    pub fn new(max: usize) -> Option<Arc<Self>> {
        (max > 0).then(|| {
            Arc::new(Self {
                max,
                open: Mutex::new(HashMap::new()),
            })
        })
    }

    /// Counts a connection from `peer`, or `None` if its address already
    /// has `max` open.
    pub fn try_hold(self: &Arc<Self>, peer: IpAddr) -> Option<AddressHeld> {
        let address = counted_as(peer);
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(address).or_insert(0);
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(AddressHeld {
            slots: self.clone(),
            address,
        })
    }
}

/// One open connection counted against its address, until dropped.
#[derive(Debug)]
pub struct AddressHeld {
    slots: Arc<AddressSlots>,
    address: IpAddr,
}

impl Drop for AddressHeld {
    fn drop(&mut self) {
        let mut open = self.slots.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.address) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.address);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn no_cap_at_zero() {
        assert!(AddressSlots::new(0).is_none());
    }

    #[test]
    fn each_address_holds_at_most_max_and_gets_them_back() {
        let slots = AddressSlots::new(2).unwrap();
        let first = slots.try_hold(ip("192.0.2.1")).unwrap();
        let _second = slots.try_hold(ip("192.0.2.1")).unwrap();
        assert!(slots.try_hold(ip("192.0.2.1")).is_none());
        assert!(
            slots.try_hold(ip("::ffff:192.0.2.1")).is_none(),
            "the same IPv4 client on a dual-stack socket"
        );
        let _other = slots.try_hold(ip("192.0.2.2")).expect("another address");
        drop(first);
        assert!(slots.try_hold(ip("192.0.2.1")).is_some());
    }

    #[test]
    fn an_ipv6_host_is_counted_by_its_64_and_forgotten_when_closed() {
        let slots = AddressSlots::new(1).unwrap();
        let held = slots.try_hold(ip("2001:db8:0:1::1")).unwrap();
        assert!(slots.try_hold(ip("2001:db8:0:1:ffff::2")).is_none());
        assert!(slots.try_hold(ip("2001:db8:0:2::1")).is_some());
        drop(held);
        assert!(
            slots.open.lock().unwrap().is_empty(),
            "no entry outlives its connections"
        );
    }
}
