//! Counting failed authentications per key (username, client address) in a
//! fixed window, so a password-guessing client cannot keep argon2 busy. An
//! attempt counts as failed from the moment it is made until it succeeds.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Keys tracked at most; attackers choose usernames, so the map is bounded.
const MAX_KEYS: usize = 100_000;

#[derive(Debug)]
pub struct FailureThrottle<K> {
    /// Failures allowed per window; 0 disables the throttle.
    limit: u32,
    window: Duration,
    windows: Mutex<HashMap<K, Window>>,
}

#[derive(Debug, Clone, Copy)]
struct Window {
    started: Instant,
    failures: u32,
}

impl<K: Hash + Eq> FailureThrottle<K> {
    pub fn new(limit: u32, window: Duration) -> Self {
        Self {
            limit,
            window,
            windows: Mutex::new(HashMap::new()),
        }
    }

    /// `Err(retry_after)` when `key` has used up its failures in this window.
    pub fn check<Q>(&self, key: &Q, now: Instant) -> Result<(), Duration>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if self.limit == 0 {
            return Ok(());
        }
        let windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        match windows.get(key) {
            Some(w) if w.failures >= self.limit => {
                let elapsed = now.saturating_duration_since(w.started);
                match self.window.checked_sub(elapsed) {
                    Some(left) if !left.is_zero() => Err(left),
                    _ => Ok(()),
                }
            }
            _ => Ok(()),
        }
    }

    /// Whether `key` has failed nothing in its window (false when the
    /// throttle is off: it keeps no count to tell).
    pub fn is_fresh<Q>(&self, key: &Q, now: Instant) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if self.limit == 0 {
            return false;
        }
        let windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        windows.get(key).is_none_or(|w| {
            w.failures == 0 || now.saturating_duration_since(w.started) >= self.window
        })
    }

    /// Counts an attempt as failed before it is made: `Err(retry_after)`
    /// when `key` has no failures left in this window. Counting up front is
    /// what bounds the attempts: ones made at the same moment, or abandoned
    /// halfway by a client that went away, are all counted. An attempt that
    /// succeeds, or could not be made, gives its count back ([`Self::refund`]).
    pub fn charge(&self, key: K, now: Instant) -> Result<Charge, Duration> {
        if self.limit == 0 {
            return Ok(Charge {
                window: None,
                first: false,
            });
        }
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        if windows.len() >= MAX_KEYS && !windows.contains_key(&key) {
            let window = self.window;
            windows.retain(|_, w| now.saturating_duration_since(w.started) < window);
            if windows.len() >= MAX_KEYS {
                // Still full of live windows: forget them rather than grow.
                windows.clear();
            }
        }
        let w = windows.entry(key).or_insert(Window {
            started: now,
            failures: 0,
        });
        let elapsed = now.saturating_duration_since(w.started);
        if elapsed >= self.window {
            *w = Window {
                started: now,
                failures: 0,
            };
        } else if w.failures >= self.limit {
            return Err(self.window - elapsed);
        }
        w.failures += 1;
        Ok(Charge {
            window: Some(w.started),
            first: w.failures == 1,
        })
    }

    /// Gives back what [`Self::charge`] counted, unless its window has
    /// ended since (a new window starts from nothing). A key left with no
    /// failures is forgotten: only failures take room, so attempts that
    /// never ran (refused under the other key) or succeeded cannot fill the
    /// map and push out the counts of real guessing.
    pub fn refund(&self, key: &K, charge: Charge) {
        let Some(started) = charge.window else {
            return;
        };
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(w) = windows.get_mut(key).filter(|w| w.started == started) {
            w.failures = w.failures.saturating_sub(1);
            if w.failures == 0 {
                windows.remove(key);
            }
        }
    }
}

/// One attempt counted by [`FailureThrottle::charge`]: the window it was
/// counted in (`None` when the throttle is off), and whether it is the
/// key's first failure there.
#[derive(Debug, Clone, Copy)]
#[must_use = "an attempt that succeeds gives its count back"]
pub struct Charge {
    window: Option<Instant>,
    first: bool,
}

impl Charge {
    /// The key had failed nothing in this window before (never when the
    /// throttle is off). Told under the lock that counted it, so of
    /// attempts made at once only one is first.
    pub fn was_first(&self) -> bool {
        self.first
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_after_limit_until_window_ends() {
        let t = FailureThrottle::new(2, Duration::from_secs(60));
        let start = Instant::now();
        let _ = t.charge("u", start).unwrap();
        assert!(t.check(&"u", start).is_ok());
        let _ = t.charge("u", start).unwrap();
        let later = start + Duration::from_secs(10);
        assert_eq!(t.check(&"u", later), Err(Duration::from_secs(50)));
        assert_eq!(
            t.charge("u", later).map(|_| ()),
            Err(Duration::from_secs(50)),
            "no failures left to count, and the wait is what is left of the window"
        );
        assert!(t.check(&"other", start).is_ok());
        assert!(t.check(&"u", start + Duration::from_secs(60)).is_ok());
    }

    #[test]
    fn a_key_is_fresh_until_it_fails_in_a_window_and_one_charge_is_first() {
        let t = FailureThrottle::new(3, Duration::from_secs(60));
        let start = Instant::now();
        assert!(t.is_fresh(&"u", start));
        let first = t.charge("u", start).unwrap();
        assert!(first.was_first());
        assert!(!t.is_fresh(&"u", start));
        assert!(!t.charge("u", start).unwrap().was_first());
        t.refund(&"u", first);
        assert!(!t.is_fresh(&"u", start), "one failure still counted");
        let next_window = start + Duration::from_secs(60);
        assert!(t.is_fresh(&"u", next_window));
        assert!(t.charge("u", next_window).unwrap().was_first());

        let off = FailureThrottle::new(0, Duration::from_secs(60));
        assert!(!off.is_fresh(&"u", start), "no count, nothing to tell");
        assert!(!off.charge("u", start).unwrap().was_first());
    }

    #[test]
    fn a_refund_gives_back_its_own_windows_count_only() {
        let t = FailureThrottle::new(1, Duration::from_secs(60));
        let start = Instant::now();
        let charge = t.charge("u", start).unwrap();
        assert!(t.check(&"u", start).is_err());
        t.refund(&"u", charge);
        assert!(t.check(&"u", start).is_ok());
        assert!(t.windows.lock().unwrap().is_empty(), "nothing failed");

        let old = t.charge("u", start).unwrap();
        let next_window = start + Duration::from_secs(60);
        let _ = t.charge("u", next_window).unwrap();
        t.refund(&"u", old);
        assert!(
            t.check(&"u", next_window).is_err(),
            "the new window's failure stands"
        );
    }

    /// At the bound a new key makes room: the ended windows go first, and
    /// all windows if every one is live. A key already counted keeps its
    /// count there: a guesser at the bound cannot wipe its own failures.
    #[test]
    fn a_full_map_makes_room_for_new_keys_only() {
        let t = FailureThrottle::new(1, Duration::from_secs(60));
        let start = Instant::now();
        let later = start + Duration::from_secs(30);
        let half = MAX_KEYS / 2;
        for key in 0..half {
            let _ = t.charge(key, start).unwrap();
        }
        for key in half..MAX_KEYS {
            let _ = t.charge(key, later).unwrap();
        }
        assert!(t.charge(0, later).is_err(), "its count stands at the bound");
        assert_eq!(t.windows.lock().unwrap().len(), MAX_KEYS);

        // The first half's windows end exactly now.
        let after_first_half = start + Duration::from_secs(60);
        let _ = t.charge(MAX_KEYS, after_first_half).unwrap();
        assert_eq!(t.windows.lock().unwrap().len(), half + 1);
        assert!(
            t.charge(half, after_first_half).is_err(),
            "live counts kept"
        );

        let t = FailureThrottle::new(1, Duration::from_secs(60));
        for key in 0..MAX_KEYS {
            let _ = t.charge(key, start).unwrap();
        }
        let _ = t.charge(MAX_KEYS, start).unwrap();
        assert_eq!(
            t.windows.lock().unwrap().len(),
            1,
            "started over, not grown"
        );
    }

    #[test]
    fn zero_limit_disables() {
        let t = FailureThrottle::new(0, Duration::from_secs(60));
        let now = Instant::now();
        for _ in 0..3 {
            let _ = t.charge("u", now).unwrap();
        }
        assert!(t.check(&"u", now).is_ok());
    }
}
