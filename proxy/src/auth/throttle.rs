//! Counting failed authentications per key (username, client address) in a
//! fixed window, so a password-guessing client cannot keep argon2 busy.

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

    pub fn record_failure(&self, key: K, now: Instant) {
        if self.limit == 0 {
            return;
        }
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        if windows.len() >= MAX_KEYS {
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
        if now.saturating_duration_since(w.started) >= self.window {
            *w = Window {
                started: now,
                failures: 0,
            };
        }
        w.failures = w.failures.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_after_limit_until_window_ends() {
        let t = FailureThrottle::new(2, Duration::from_secs(60));
        let start = Instant::now();
        t.record_failure("u", start);
        assert!(t.check(&"u", start).is_ok());
        t.record_failure("u", start);
        let wait = t.check(&"u", start + Duration::from_secs(10)).unwrap_err();
        assert_eq!(wait, Duration::from_secs(50));
        assert!(t.check(&"other", start).is_ok());
        assert!(t.check(&"u", start + Duration::from_secs(60)).is_ok());
    }

    #[test]
    fn zero_limit_disables() {
        let t = FailureThrottle::new(0, Duration::from_secs(60));
        let now = Instant::now();
        t.record_failure("u", now);
        assert!(t.check(&"u", now).is_ok());
    }
}
