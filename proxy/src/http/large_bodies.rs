//! The bytes of large request bodies held at once, proxy-wide, bounded by
//! `limits.max_large_body_bytes_held`.
//!
//! A body read whole (a label-mode push, a rule group, a query posted as
//! a form) is counted as its bytes arrive, beyond the first
//! [`COUNTED_FROM_BYTES`] that its connection's bodies hold together
//! ([`UncountedShare`]), and on through its step, on a body worker
//! (`proxy/body_workers.rs`) or in place, until it is dropped. Counting it
//! only once read would leave the bodies still arriving unbounded as a
//! whole: one credential's connections, each trickling a body up to
//! `limits.max_body_bytes`, could hold gigabytes; leaving each body its
//! first 256 KiB (the body workers' threshold) uncounted left a gigabyte
//! over the default connection limit, and each of an HTTP/2 connection's
//! 200 streams its own share would leave 13 MiB a connection. Within the
//! share nothing is counted, so that queries posted as forms and small
//! pushes are never refused because large bodies are held: a connection
//! holds no more of them than a request head may.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use prometheus_client::metrics::gauge::Gauge;

use crate::ops::metrics::GaugeHeld;

/// The size of a body as received from which it is large: counted in the
/// bytes held, and its step run on a body worker. About 1 MiB once
/// snappy-decompressed, a couple of milliseconds of work; a Prometheus
/// batch at its default `max_samples_per_send` (2,000) stays below it.
pub const LARGE_BODY_BYTES: usize = 256 * 1024;

/// The body bytes a connection's requests hold before they count in the
/// bytes held: the default `limits.max_header_bytes`, so that a
/// credential's connections hold no more uncounted than anyone's heads
/// may, and above the query forms Grafana posts (a few KiB).
pub const COUNTED_FROM_BYTES: usize = 64 * 1024;

/// The body bytes a connection's requests may hold uncounted, together:
/// one HTTP/1.1 request at a time has all of [`COUNTED_FROM_BYTES`], the
/// streams of an HTTP/2 connection share it.
#[derive(Clone, Debug)]
pub struct UncountedShare(Arc<AtomicUsize>);

impl Default for UncountedShare {
    fn default() -> Self {
        Self(Arc::new(AtomicUsize::new(COUNTED_FROM_BYTES)))
    }
}

/// What one body took of its connection's share (none: it has no
/// connection's, and every byte counts), given back when dropped, once
/// the body is read or refused.
#[derive(Debug)]
pub struct Uncounted<'a> {
    share: Option<&'a UncountedShare>,
    taken: usize,
}

impl<'a> Uncounted<'a> {
    pub fn of(share: Option<&'a UncountedShare>) -> Self {
        Self { share, taken: 0 }
    }

    /// Of a body's first `received` bytes, how many are not counted: as
    /// many as it took before, and more while the share lasts.
    pub fn cover(&mut self, received: usize) -> usize {
        let Some(share) = self.share else {
            return 0;
        };
        let wanted = received - self.taken;
        // Takes what it wants, or what is left.
        let take = |left: usize| Some(left - left.min(wanted));
        let (Ok(left) | Err(left)) =
            (share.0).fetch_update(Ordering::Relaxed, Ordering::Relaxed, take);
        self.taken += left.min(wanted);
        self.taken
    }
}

impl Drop for Uncounted<'_> {
    fn drop(&mut self) {
        if let Some(share) = self.share {
            share.0.fetch_add(self.taken, Ordering::Relaxed);
        }
    }
}

/// The bytes held and their bound, shared by every request.
#[derive(Clone, Debug)]
pub struct LargeBodyBytes {
    /// `tenant_proxy_large_body_bytes`.
    held: Gauge,
    /// 0: unbounded.
    bound: u64,
}

/// The bound leaves no room for a body's bytes (503, retried).
#[derive(Debug, PartialEq, Eq)]
pub struct AtTheBound;

impl LargeBodyBytes {
    pub fn new(held: Gauge, bound: u64) -> Self {
        Self { held, bound }
    }

    /// Counts a body's bytes up to `total`, of which it holds `counted`
    /// already, if the bound leaves room. A body is taken when nothing
    /// else is held, however large: the bound is there to keep what waits
    /// short, never to refuse one body every time. The bytes stay counted
    /// until what is returned is dropped.
    pub fn hold_up_to(
        &self,
        counted: Option<GaugeHeld>,
        total: usize,
    ) -> Result<GaugeHeld, AtTheBound> {
        let own = counted.as_ref().map_or(0, GaugeHeld::amount);
        let total = i64::try_from(total).unwrap_or(i64::MAX);
        let more = total - own;
        if more <= 0 {
            if let Some(counted) = counted {
                return Ok(counted);
            }
        }
        let bound = i64::try_from(self.bound).unwrap_or(i64::MAX);
        let fits = |held: i64| {
            let after = held.saturating_add(more);
            (bound == 0 || held == own || after <= bound).then_some(after)
        };
        (self.held.inner())
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, fits)
            .map_err(|_| AtTheBound)?;
        Ok(match counted {
            Some(mut counted) => {
                counted.grow(more);
                counted
            }
            None => GaugeHeld::added(&self.held, more),
        })
    }

    #[cfg(test)]
    pub fn held(&self) -> i64 {
        self.held.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Beyond the bound, a body is refused, unless it is alone: a body
    /// counted in parts does not count against itself, and what it held
    /// is given back whole when it is dropped.
    #[test]
    fn bytes_are_held_up_to_the_bound_and_a_body_alone_always() {
        let bytes = LargeBodyBytes::new(Gauge::default(), 100);
        let first = bytes.hold_up_to(None, 60).unwrap();
        let first = bytes.hold_up_to(Some(first), 90).unwrap();
        assert_eq!((first.amount(), bytes.held()), (90, 90));
        assert_eq!(bytes.hold_up_to(None, 20).unwrap_err(), AtTheBound);
        let second = bytes.hold_up_to(None, 10).unwrap();
        assert_eq!(bytes.held(), 100, "at the bound, not beyond");
        let first = bytes.hold_up_to(Some(first), 80).unwrap();
        assert_eq!(first.amount(), 90, "never less than it held");
        drop(second);
        let first = bytes.hold_up_to(Some(first), 500).unwrap();
        assert_eq!(bytes.held(), 500, "alone, past the bound");
        drop(first);
        assert_eq!(bytes.held(), 0);
        let unbounded = LargeBodyBytes::new(Gauge::default(), 0);
        let held = [unbounded.hold_up_to(None, 1 << 40).unwrap()];
        assert!(unbounded.hold_up_to(None, 1 << 40).is_ok());
        assert_eq!(unbounded.held(), 1 << 40, "the second given back");
        drop(held);
    }
}
