//! The failure counts that bound password guessing: per username, per
//! client address, and a username's reserve for addresses that have failed
//! nothing.
//!
//! A username's count alone would let one guesser lock the username out:
//! ten wrong passwords a minute from one address, and every uncached login
//! of it gets 429, which after a restart or a rollout is every login of its
//! real clients. So once a username is out of failures in a window, it may
//! still fail `max_failures_per_user_from_fresh_addresses` more times
//! there, each from an address whose own count holds no failure in its
//! window: the guesser's address, having failed, cannot take them, and a
//! real client's first try can. Guessers spread over many addresses get
//! at most that many more guesses a window at one username (one per
//! address), and locking it out takes that many fresh addresses a window.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::auth::throttle::{Charge, FailureThrottle};
use crate::config::AuthConfig;

#[derive(Debug)]
pub struct GuessingLimits {
    /// Keyed by a digest of the username (`Authenticator::username_key`):
    /// a client chooses the names it fails with, up to a header's size.
    per_user: FailureThrottle<[u8; 16]>,
    per_client: FailureThrottle<IpAddr>,
    /// A username's failures beyond `per_user`, from fresh addresses;
    /// `None` when there are none (a throttle of 0 counts without limit).
    fresh_reserve: Option<FailureThrottle<[u8; 16]>>,
}

/// Who an attempt is counted under: a username's digest and the client
/// address as counted (an IPv6 client's /64).
#[derive(Clone, Copy, Debug)]
pub struct Attempt {
    pub username: [u8; 16],
    pub client: IpAddr,
}

/// An attempt counted as failed until it succeeds: under its address, and
/// under its username's count or, that spent, the reserve.
#[derive(Clone, Copy, Debug)]
#[must_use = "an attempt that succeeds gives its count back"]
pub struct Counted {
    client: Charge,
    user: Charge,
    from_reserve: bool,
}

impl GuessingLimits {
    pub fn new(config: &AuthConfig) -> Self {
        let window = config.failure_window;
        Self {
            per_user: FailureThrottle::new(config.max_failures_per_user, window),
            per_client: FailureThrottle::new(config.max_failures_per_client, window),
            fresh_reserve: match config.max_failures_per_user_from_fresh_addresses {
                0 => None,
                reserve => Some(FailureThrottle::new(reserve, window)),
            },
        }
    }

    /// A look before the attempt queues for a verifier: `Err(retry_after)`
    /// when it would be refused now. [`Self::count`] decides.
    pub fn admits(&self, attempt: &Attempt, now: Instant) -> Result<(), Duration> {
        self.per_client.check(&attempt.client, now)?;
        self.per_user
            .check(&attempt.username, now)
            .or_else(|retry_after| {
                let reserved = self.per_client.is_fresh(&attempt.client, now)
                    && (self.fresh_reserve.as_ref())
                        .is_some_and(|r| r.check(&attempt.username, now).is_ok());
                if reserved {
                    Ok(())
                } else {
                    Err(retry_after)
                }
            })
    }

    /// Counts `attempt` as failed, or refuses it (`Err(retry_after)`) when
    /// its address, or its username and (for a fresh address) the reserve,
    /// have no failures left.
    pub fn count(&self, attempt: &Attempt, now: Instant) -> Result<Counted, Duration> {
        let client = self.per_client.charge(attempt.client, now)?;
        let user = match self.per_user.charge(attempt.username, now) {
            Ok(user) => Ok((user, false)),
            // Fresh: this is the address's first failure in its window,
            // told under the lock that counted it, so attempts sent at
            // once from one address take one from the reserve at most.
            // Refused, the wait is the username's: its count frees first.
            Err(retry_after) => match &self.fresh_reserve {
                Some(reserve) if client.was_first() => (reserve.charge(attempt.username, now))
                    .map(|user| (user, true))
                    .map_err(|_| retry_after),
                _ => Err(retry_after),
            },
        };
        match user {
            Ok((user, from_reserve)) => Ok(Counted {
                client,
                user,
                from_reserve,
            }),
            Err(retry_after) => {
                self.per_client.refund(&attempt.client, client);
                Err(retry_after)
            }
        }
    }

    /// Gives back what [`Self::count`] counted: the attempt succeeded, or
    /// checked nothing.
    pub fn give_back(&self, attempt: &Attempt, counted: Counted) {
        let user = match (counted.from_reserve, &self.fresh_reserve) {
            (true, Some(reserve)) => reserve,
            _ => &self.per_user,
        };
        user.refund(&attempt.username, counted.user);
        self.per_client.refund(&attempt.client, counted.client);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(per_user: u32, reserve: u32, per_client: u32) -> GuessingLimits {
        GuessingLimits::new(&AuthConfig {
            max_failures_per_user: per_user,
            max_failures_per_user_from_fresh_addresses: reserve,
            max_failures_per_client: per_client,
            ..AuthConfig::default()
        })
    }

    fn from(client: u8) -> Attempt {
        Attempt {
            username: [7; 16],
            client: IpAddr::from([192, 0, 2, client]),
        }
    }

    #[test]
    fn a_username_out_of_failures_takes_one_more_from_each_fresh_address_up_to_the_reserve() {
        let l = limits(2, 2, 30);
        let now = Instant::now();
        let guesser = from(1);
        for _ in 0..2 {
            let _ = l.count(&guesser, now).unwrap();
        }
        assert!(l.admits(&guesser, now).is_err());
        assert!(l.count(&guesser, now).is_err(), "its address has failed");

        // A fresh address gets in; once it has failed, it is not fresh.
        let real = from(2);
        assert!(l.admits(&real, now).is_ok());
        let counted = l.count(&real, now).unwrap();
        assert!(counted.from_reserve);
        assert!(l.admits(&real, now).is_err());
        assert!(l.count(&real, now).is_err());
        // It succeeded: its count is given back, and it is fresh again.
        l.give_back(&real, counted);
        assert!(l.admits(&real, now).is_ok());

        let _ = l.count(&from(3), now).unwrap();
        let _ = l.count(&from(4), now).unwrap();
        let refused = l.count(&from(5), now).map(|_| ());
        assert_eq!(refused, Err(l.per_user.check(&[7; 16], now).unwrap_err()));
        assert!(l.admits(&from(5), now).is_err(), "the reserve is spent");
        assert!(
            l.per_client.is_fresh(&from(5).client, now),
            "a refused attempt is not counted against its address"
        );

        let next_window = now + AuthConfig::default().failure_window;
        assert!(!l.count(&guesser, next_window).unwrap().from_reserve);
    }

    /// What the counts must decide, written plainly: within one window, an
    /// attempt is let through while its address has failures left, and its
    /// username has, or the reserve has and the address has failed nothing.
    /// A success gives its count back; a failure keeps it.
    #[derive(Default)]
    struct Model {
        failed_per_address: [u32; 6],
        failed_under_username: u32,
        failed_from_reserve: u32,
    }

    impl Model {
        /// `None` when refused, else whether the reserve counts it.
        fn lets_through(&self, address: usize, limits: (u32, u32, u32)) -> Option<bool> {
            let (per_user, reserve, per_client) = limits;
            let failed = self.failed_per_address[address];
            let address_ok = per_client == 0 || failed < per_client;
            let username_ok = per_user == 0 || self.failed_under_username < per_user;
            let reserve_ok = per_client > 0 && failed == 0 && self.failed_from_reserve < reserve;
            match (address_ok, username_ok, reserve_ok) {
                (false, _, _) | (true, false, false) => None,
                (true, true, _) => Some(false),
                (true, false, true) => Some(true),
            }
        }
    }

    proptest::proptest! {
        /// Any run of attempts from six addresses at one username, within
        /// one window, is let through or refused exactly as the model says,
        /// and the look before (`admits`) says the same as the count.
        #[test]
        fn the_counts_decide_as_the_model(
            limits_given in (0u32..4, 0u32..4, 0u32..5),
            attempts in proptest::collection::vec((0usize..6, proptest::bool::ANY), 0..40),
        ) {
            let (per_user, reserve, per_client) = limits_given;
            let l = limits(per_user, reserve, per_client);
            let now = Instant::now();
            let mut model = Model::default();
            for (address, succeeds) in attempts {
                let attempt = from(address as u8);
                let expected = model.lets_through(address, limits_given);
                proptest::prop_assert_eq!(l.admits(&attempt, now).is_ok(), expected.is_some());
                let counted = l.count(&attempt, now).ok();
                proptest::prop_assert_eq!(counted.map(|c| c.from_reserve), expected);
                match (counted, expected) {
                    (Some(counted), _) if succeeds => l.give_back(&attempt, counted),
                    (_, Some(from_reserve)) => {
                        model.failed_per_address[address] += 1;
                        match from_reserve {
                            true => model.failed_from_reserve += 1,
                            false => model.failed_under_username += 1,
                        }
                    }
                    (_, None) => {}
                }
            }
        }
    }

    #[test]
    fn no_reserve_without_one_or_without_counts_per_address() {
        let now = Instant::now();
        for l in [limits(1, 0, 30), limits(1, 5, 0)] {
            let _ = l.count(&from(1), now).unwrap();
            assert!(l.admits(&from(2), now).is_err());
            assert!(l.count(&from(2), now).is_err());
        }
    }
}
