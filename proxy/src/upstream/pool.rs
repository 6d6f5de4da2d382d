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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A connection that records its own closing.
    struct Link {
        id: usize,
        usable: bool,
        closed: Arc<Mutex<Vec<usize>>>,
    }

    impl Parkable for Link {
        fn usable(&mut self) -> bool {
            self.usable
        }
    }

    impl Drop for Link {
        fn drop(&mut self) {
            self.closed.lock().unwrap().push(self.id);
        }
    }

    /// Makes links that report to one list when they close.
    #[derive(Default)]
    struct Links(Arc<Mutex<Vec<usize>>>);

    impl Links {
        fn link(&self, id: usize) -> Link {
            Link {
                id,
                usable: true,
                closed: self.0.clone(),
            }
        }

        fn closed(&self) -> Vec<usize> {
            self.0.lock().unwrap().clone()
        }
    }

    fn key(uri: &str) -> Key {
        Key::of(&uri.parse().unwrap()).unwrap()
    }

    const LONG: Duration = Duration::from_secs(3600);

    /// The id of the link `take` hands out, if any; the link is then
    /// closed (dropped) by the test.
    fn taken(pool: &Pool<Link>, key: &Key, idle_timeout: Duration) -> Option<usize> {
        pool.take(key, idle_timeout).map(|(link, _)| link.id)
    }

    #[test]
    fn an_upstream_is_its_scheme_and_authority() {
        assert!(Key::of(&"/path-only".parse().unwrap()).is_none());
        assert!(key("http://loki:3100/a") == key("http://loki:3100/b?c"));
        assert!(key("http://loki:3100/") != key("http://loki:3101/"));
        assert!(key("http://loki:3100/") != key("https://loki:3100/"));
    }

    #[test]
    fn the_newest_link_to_the_same_upstream_is_taken_first() {
        let (links, pool) = (Links::default(), Pool::new());
        let (loki, prometheus) = (key("http://loki:3100"), key("http://prometheus:9090"));
        assert_eq!(taken(&pool, &loki, LONG), None, "nothing parked yet");
        pool.park(&loki, links.link(1));
        pool.park(&prometheus, links.link(2));
        pool.park(&loki, links.link(3));
        let (link, idle) = pool.take(&loki, LONG).unwrap();
        assert_eq!(link.id, 3);
        assert!(idle < LONG);
        drop(link);
        assert_eq!(taken(&pool, &loki, LONG), Some(1));
        assert_eq!(taken(&pool, &loki, LONG), None);
        assert_eq!(taken(&pool, &prometheus, LONG), Some(2));
        assert_eq!(links.closed(), [3, 1, 2], "each closed by its taker");
    }

    #[test]
    fn a_link_no_longer_usable_is_closed_and_the_next_one_taken() {
        let (links, pool) = (Links::default(), Pool::new());
        let loki = key("http://loki:3100");
        pool.park(&loki, links.link(1));
        let mut broken = links.link(2);
        broken.usable = false;
        pool.park(&loki, broken);
        let link = pool.take(&loki, LONG).unwrap().0;
        assert_eq!((link.id, links.closed()), (1, vec![2]));
    }

    #[test]
    fn links_parked_too_long_are_closed_when_one_is_taken() {
        let (links, pool) = (Links::default(), Pool::new());
        let (loki, prometheus) = (key("http://loki:3100"), key("http://prometheus:9090"));
        pool.park(&loki, links.link(1));
        pool.park(&loki, links.link(2));
        pool.park(&prometheus, links.link(3));
        // With no idle time allowed, every parked link has expired.
        assert_eq!(taken(&pool, &loki, Duration::ZERO), None);
        let mut closed = links.closed();
        closed.sort_unstable();
        assert_eq!(closed, [1, 2], "all of that upstream's, no other's");
        assert_eq!(taken(&pool, &loki, LONG), None);
        assert_eq!(taken(&pool, &prometheus, LONG), Some(3));
    }

    #[test]
    fn a_burst_beyond_the_most_kept_closes_the_oldest() {
        let (links, pool) = (Links::default(), Pool::new());
        let loki = key("http://loki:3100");
        for id in 0..MAX_IDLE + 2 {
            pool.park(&loki, links.link(id));
        }
        assert_eq!(links.closed(), [0, 1]);
        let mut kept = 0;
        while let Some(id) = taken(&pool, &loki, LONG) {
            assert_eq!(id, MAX_IDLE + 1 - kept, "newest first");
            kept += 1;
        }
        assert_eq!(kept, MAX_IDLE);
    }

    #[test]
    fn closing_the_expired_keeps_the_younger() {
        let (links, pool) = (Links::default(), Pool::new());
        let loki = key("http://loki:3100");
        pool.park(&loki, links.link(1));
        let between = Instant::now();
        // Ages link 1 by at least this much against link 2: not a wait
        // for anything, the two need different ages.
        std::thread::sleep(Duration::from_millis(50));
        pool.park(&loki, links.link(2));
        pool.close_expired(between.elapsed());
        assert_eq!(links.closed(), [1]);
        pool.close_expired(LONG);
        assert_eq!(links.closed(), [1]);
        assert_eq!(taken(&pool, &loki, LONG), Some(2));
    }
}
