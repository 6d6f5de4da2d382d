//! The open-file limit. Every client connection holds a descriptor, and
//! most hold a second one to the upstream while a request is in flight (a
//! live tail for as long as it streams). The soft limit many hosts start a
//! process with, 1024, runs out long before `limits.max_connections`
//! (4096 by default): accepting then fails with "too many open files" and
//! upstream connections cannot be opened. Go servers raise the soft limit
//! to the hard one at start; so does the proxy, when it is short, and it
//! says so when even the hard limit is too low.

use rlimit::Resource;

/// Descriptors beyond two per connection: the listeners, the tenants
/// file's watcher, TLS files being read, the admin endpoint's connections,
/// idle pooled upstream connections.
const RESERVE: u64 = 256;

/// What `max_connections` client connections can need at most.
pub fn needed(max_connections: usize) -> u64 {
    2 * max_connections as u64 + RESERVE
}

/// The soft limit to set when `(soft, hard)` is in force and `needed` may
/// be used, if it is to change: the hard limit, as far as it goes.
pub fn raise_to(soft: u64, hard: u64, needed: u64) -> Option<u64> {
    if soft >= needed {
        return None;
    }
    // An unlimited hard limit cannot be the soft one on Linux (it is
    // capped by fs.nr_open): ask for what is needed then.
    let target = if hard == rlimit::INFINITY {
        needed
    } else {
        hard
    };
    (target > soft).then_some(target)
}

/// Raises the soft limit to the hard one if it is short of what
/// `max_connections` can need, and warns if it stays short.
pub fn raise_for(max_connections: usize) {
    let needed = needed(max_connections);
    let (soft, hard) = match Resource::NOFILE.get() {
        Ok(limits) => limits,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the open-file limit");
            return;
        }
    };
    let mut in_force = soft;
    if let Some(to) = raise_to(soft, hard, needed) {
        match Resource::NOFILE.set(to, hard) {
            Ok(()) => {
                tracing::info!(from = soft, to, "open-file limit raised");
                in_force = to;
            }
            Err(e) => tracing::warn!(error = %e, to, "cannot raise the open-file limit"),
        }
    }
    if in_force < needed {
        tracing::warn!(
            limit = in_force,
            hard,
            needed,
            max_connections,
            "the open-file limit is below what limits.max_connections can need: \
             connections beyond it fail; raise the hard limit (systemd LimitNOFILE=, \
             ulimit -Hn) or lower limits.max_connections"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_soft_limit_is_raised_to_the_hard_one_as_far_as_it_goes() {
        let needed = needed(4096);
        assert_eq!(needed, 8448);
        assert_eq!(raise_to(1024, 524_288, needed), Some(524_288));
        assert_eq!(
            raise_to(1024, rlimit::INFINITY, needed),
            Some(needed),
            "not to infinity, which Linux refuses"
        );
        assert_eq!(raise_to(1024, 4096, needed), Some(4096), "short still");
        assert_eq!(raise_to(4096, 4096, needed), None, "nothing to raise");
        assert_eq!(raise_to(1 << 20, 1 << 20, needed), None, "enough");
    }
}
