//! Idle upstream connections, parked per upstream between requests: the
//! newest taken first (it is the warmest, and the old ones then expire),
//! each checked before it is handed out.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use http::uri::{Authority, Scheme, Uri};

/// Parked connections kept per upstream; a burst beyond it closes the rest.
const MAX_IDLE: usize = 256;

/// An upstream: scheme and authority.
#[derive(Clone, PartialEq, Eq)]
pub(super) struct Key {
    pub scheme: Scheme,
    pub authority: Authority,
}

impl Key {
    pub fn of(uri: &Uri) -> Option<Self> {
        Some(Self {
            scheme: uri.scheme()?.clone(),
            authority: uri.authority()?.clone(),
        })
    }
}

/// A connection that can wait in a pool.
pub(super) trait Parkable {
    /// Whether it can carry the next request: not closed, nothing unasked
    /// for arrived while it was parked.
    fn usable(&mut self) -> bool;
}

pub(super) struct Pool<L> {
    /// Per upstream; a proxy has a handful, so a list is the cheapest map.
    parked: Mutex<Vec<Parking<L>>>,
}

struct Parking<L> {
    key: Key,
    /// Oldest first; taken from the back.
    links: Vec<(L, Instant)>,
}

impl<L: Parkable> Pool<L> {
    pub fn new() -> Self {
        Self {
            parked: Mutex::new(Vec::new()),
        }
    }

    /// A parked connection to `key` that is still usable, if any, and how
    /// long it was parked. Those parked `idle_timeout` or longer close.
    pub fn take(&self, key: &Key, idle_timeout: Duration) -> Option<(L, Duration)> {
        loop {
            let (mut link, idle) = {
                let mut parked = self.parked.lock().expect("parking lock");
                let parking = parked.iter_mut().find(|p| p.key == *key)?;
                let (link, since) = parking.links.pop()?;
                let idle = since.elapsed();
                if idle >= idle_timeout {
                    // The rest are older still: all of them close, once the
                    // lock is released.
                    let expired = std::mem::take(&mut parking.links);
                    drop(parked);
                    drop((link, expired));
                    return None;
                }
                (link, idle)
            };
            if link.usable() {
                return Some((link, idle));
            }
        }
    }

    /// Parks `link` for the next request to `key`. The key is copied only
    /// the first time it is seen: cloning it clones its authority's bytes,
    /// a count shared with every other request to that upstream.
    pub fn park(&self, key: &Key, link: L) {
        let mut parked = self.parked.lock().expect("parking lock");
        let index = match parked.iter().position(|p| p.key == *key) {
            Some(index) => index,
            None => {
                parked.push(Parking {
                    key: key.clone(),
                    links: Vec::new(),
                });
                parked.len() - 1
            }
        };
        let links = &mut parked[index].links;
        if links.len() >= MAX_IDLE {
            links.remove(0);
        }
        links.push((link, Instant::now()));
    }

    /// Closes the connections parked `idle_timeout` or longer.
    pub fn close_expired(&self, idle_timeout: Duration) {
        let mut expired = Vec::new();
        let mut parked = self.parked.lock().expect("parking lock");
        for parking in parked.iter_mut() {
            // Oldest first: the expired ones are a prefix.
            let stale = parking
                .links
                .partition_point(|(_, since)| since.elapsed() >= idle_timeout);
            expired.extend(parking.links.drain(..stale));
        }
        drop(parked);
        drop(expired);
    }
}
