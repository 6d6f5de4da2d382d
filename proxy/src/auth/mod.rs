//! Basic authentication: header → credential → tenant and scopes.
//!
//! argon2id costs tens of milliseconds, so it never runs per request for a
//! known good credential and never on the async runtime's threads:
//!
//! 1. cache hit: a keyed digest of (username, password) maps to the
//!    fingerprint of the password hash it was verified against; it counts only
//!    while the current tenants file still holds that hash for the user, so a
//!    changed or removed credential stops working on the next request;
//! 2. otherwise, failure counts per username and client address are
//!    checked (429; a username out of failures still takes a few from
//!    addresses that failed nothing: `guessing.rs`), then the hash is
//!    verified on one of a fixed set of verifier threads, behind a
//!    semaphore (503 when no slot frees up in time). An attempt counts as
//!    failed from when its verification starts until it succeeds, so
//!    guesses sent together, or abandoned halfway, get no more argon2 runs
//!    than the failure counts allow. argon2's
//!    working memory is kept for reuse and bounded as a whole
//!    (`auth.verification_memory_bytes`, whatever each hash asks:
//!    `working_memory.rs`), and drops to nothing once logins stop; a hash
//!    that finds no room in time is a 503 too. Unknown usernames are
//!    checked against a decoy costing what the file's credentials cost
//!    (`decoys.rs`), so they take as long as a wrong password;
//! 3. requests presenting the same (username, password) while it is being
//!    verified wait for that one verification instead of starting their
//!    own: a fleet of log shippers sharing one Secret reconnecting after a
//!    restart costs one argon2 run, not one per connection.
//!
//! Requests waiting for a verification, their own or one they share, are
//! bounded (`auth.max_pending_verifications`; beyond it 503 at once): they
//! come before any credential is known, and each holds its request (a head
//! of up to `limits.max_header_bytes`, an HTTP/2 stream's body window)
//! while it waits. Unbounded, a guesser with many addresses, each within
//! its failure count, could have the proxy hold thousands, or take every
//! slot of `limits.max_concurrent_requests` from the tenants whose
//! credentials are cached.

mod basic;
pub mod decoys;
mod failure;
pub mod guessing;
pub mod password;
pub mod throttle;
pub mod verifier_threads;
pub mod working_memory;

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use http::HeaderMap;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::{OnceCell, Semaphore};

pub use self::basic::{parse_basic, BasicCredentials};
pub use self::failure::AuthFailure;
use self::password::{Cost, Verifier};
use crate::auth::guessing::{Attempt, GuessingLimits};
use crate::auth::verifier_threads::{VerifierThreads, RELEASE_AFTER_IDLE};
use crate::auth::working_memory::{OverBudget, WorkingMemory};
use crate::config::AuthConfig;
use crate::http::client_address::counted_as;
use crate::tenants::{Credential, TenantStore};

// === impl Authenticator ===

pub struct Authenticator {
    /// Random per process: cache keys mean nothing outside it.
    digest_key: [u8; 32],
    /// digest(username, password) → fingerprint of the hash it verified against.
    verified: RwLock<HashMap<[u8; 32], [u8; 32], DigestHash>>,
    cache_size: usize,
    verify_slots: Arc<Semaphore>,
    /// Requests waiting for a verification (`auth.max_pending_verifications`).
    pending: Semaphore,
    verifiers: VerifierThreads,
    /// Verifications in progress, keyed by what they verify.
    in_flight: Mutex<HashMap<InFlightKey, Arc<OnceCell<Verdict>>>>,
    verifications: Counter,
    verification_wait: Duration,
    guessing: GuessingLimits,
    decoy: Arc<Verifier>,
}

impl fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authenticator").finish_non_exhaustive()
    }
}

impl Authenticator {
    /// `verifications` counts the argon2 runs (every cache miss, decoys
    /// included).
    pub fn new(config: &AuthConfig, verifications: Counter) -> Self {
        Self {
            digest_key: rand::random(),
            verified: RwLock::new(HashMap::default()),
            cache_size: config.cache_size,
            verify_slots: Arc::new(Semaphore::new(config.max_concurrent_verifications)),
            pending: Semaphore::new(config.max_pending_verifications),
            verifiers: VerifierThreads::new(
                config.max_concurrent_verifications,
                RELEASE_AFTER_IDLE,
                Arc::new(WorkingMemory::new(
                    config.verification_memory_bytes,
                    config.verification_wait,
                )),
            ),
            in_flight: Mutex::new(HashMap::new()),
            verifications,
            verification_wait: config.verification_wait,
            guessing: GuessingLimits::new(config),
            decoy: Arc::new(Verifier::decoy(&Cost::of_this_proxy())),
        }
    }

    pub async fn authenticate(
        &self,
        store: &TenantStore,
        headers: &HeaderMap,
        client: IpAddr,
    ) -> Result<Arc<Credential>, AuthFailure> {
        let presented = parse_basic(headers)?;
        let digest = self.digest(&presented);
        let credential = store.credential(presented.username());
        if let Some(credential) = credential {
            if self.cached_fingerprint(&digest) == Some(credential.fingerprint) {
                return Ok(credential.clone());
            }
        }
        let credential = credential.cloned();

        let attempt = Attempt {
            username: self.username_key(presented.username()),
            client: counted_as(client),
        };
        // Refused here, a throttled client does not queue for a slot; its
        // attempt is counted when its verification starts (`verify`).
        self.guessing
            .admits(&attempt, Instant::now())
            .map_err(AuthFailure::Throttled)?;
        let _pending = self
            .pending
            .try_acquire()
            .map_err(|_| AuthFailure::VerifierBusy)?;

        let key = (digest, credential.as_ref().map(|c| c.fingerprint));
        let against = match &credential {
            Some(credential) => Against::Credential(credential.clone()),
            None => Against::Decoy(
                (store.decoy(decoy_pick(&attempt)))
                    .unwrap_or(&self.decoy)
                    .clone(),
            ),
        };
        let accepted = self
            .verify_once(key, attempt, against, presented.password().to_owned())
            .await?;
        match credential {
            Some(credential) if accepted => {
                self.remember(digest, credential.fingerprint, store);
                Ok(credential)
            }
            Some(_) => Err(AuthFailure::WrongPassword),
            None => Err(AuthFailure::UnknownUser),
        }
    }

    /// Verifies, or waits for the verification of the same password against
    /// the same hash that another request started. If the request running
    /// it goes away, the next waiter takes over.
    async fn verify_once(
        &self,
        key: InFlightKey,
        attempt: Attempt,
        against: Against,
        password: String,
    ) -> Verdict {
        let cell = {
            let mut in_flight = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
            in_flight.entry(key).or_default().clone()
        };
        let _forget = ForgetWhenLast {
            in_flight: &self.in_flight,
            key,
            cell: &cell,
        };
        *cell
            .get_or_init(|| self.verify(attempt, against, password))
            .await
    }

    /// Runs the hash on a verifier thread once a verification slot is free,
    /// counting the attempt as failed until it succeeds: of requests that
    /// arrived together, only as many are verified as the failure counts
    /// allow, and a client that goes away mid-verification has had its
    /// guess. Requests sharing this verification are counted once, under
    /// the one that started it: they add no argon2 run and no guess. They
    /// share its 429 too if its address is out of failures (a rare case
    /// for a shared password, and one a client retries).
    async fn verify(
        &self,
        attempt: Attempt,
        against: Against,
        password: String,
    ) -> Result<bool, AuthFailure> {
        let permit = tokio::time::timeout(
            self.verification_wait,
            self.verify_slots.clone().acquire_owned(),
        )
        .await
        .map_err(|_| AuthFailure::VerifierBusy)?
        .map_err(|_| AuthFailure::VerifierBusy)?;
        let counted = (self.guessing)
            .count(&attempt, Instant::now())
            .map_err(AuthFailure::Throttled)?;
        self.verifications.inc();
        let outcome = self.verifiers.run(move |memory| {
            let _permit = permit;
            match &against {
                Against::Credential(c) => c.verifier.verify_in(&password, memory),
                Against::Decoy(decoy) => decoy.verify_in(&password, memory).map(|_| false),
            }
        });
        let verdict = match outcome {
            Some(outcome) => match outcome.await {
                Ok(Ok(accepted)) => Ok(accepted),
                // No working memory in time is a busy verifier too: 503, retried.
                Ok(Err(OverBudget)) | Err(_) => Err(AuthFailure::VerifierBusy),
            },
            None => Err(AuthFailure::VerifierBusy),
        };
        // Only a wrong password keeps its count; a busy verifier checked
        // nothing.
        if verdict != Ok(false) {
            self.guessing.give_back(&attempt, counted);
        }
        verdict
    }

    /// What failures are counted under for a username: a keyed digest of
    /// fixed size, so that the throttle's 100,000 keys hold 16 bytes each,
    /// not names of up to a header's size (64 KiB) that a client chose.
    fn username_key(&self, username: &str) -> [u8; 16] {
        let mut hasher = blake3::Hasher::new_keyed(&self.digest_key);
        // Not a (username, password) digest: those hold a colon, and a
        // username read from a credential holds none.
        hasher.update(b"failures of username\0");
        hasher.update(username.as_bytes());
        let mut key = [0; 16];
        key.copy_from_slice(&hasher.finalize().as_bytes()[..16]);
        key
    }

    fn digest(&self, presented: &BasicCredentials) -> [u8; 32] {
        // `user:password`, split at its first colon: one text per pair, so
        // ("ab","c") and ("a","bc") do not meet. `username_key`'s input has
        // no colon, so it never equals one of these. Hashed in one call: a
        // `Hasher` fed in parts cost about a third more (callgrind).
        *blake3::keyed_hash(&self.digest_key, presented.decoded.as_bytes()).as_bytes()
    }

    fn cached_fingerprint(&self, digest: &[u8; 32]) -> Option<[u8; 32]> {
        let verified = self.verified.read().unwrap_or_else(|e| e.into_inner());
        verified.get(digest).copied()
    }

    fn remember(&self, digest: [u8; 32], fingerprint: [u8; 32], store: &TenantStore) {
        let mut verified = self.verified.write().unwrap_or_else(|e| e.into_inner());
        if verified.len() >= self.cache_size {
            // Only successful logins land here: the cache fills with the
            // credentials in use and with those a password change or a
            // removal left behind. The latter go first; only when the ones
            // in use alone fill it does it start over. Starting over at
            // once would send every client in use back to argon2 together,
            // a rush of verifications each time enough passwords changed.
            verified.retain(|_, fingerprint| store.holds_fingerprint(fingerprint));
            if verified.len() >= self.cache_size {
                verified.clear();
            }
        }
        verified.insert(digest, fingerprint);
    }
}

/// Hashes the auth cache's keys by their first eight bytes. The keys are
/// keyed BLAKE3 digests: uniform, and unpredictable without the process's
/// key, so no one can aim collisions at a bucket; hashing them again with
/// SipHash cost more than the rest of the lookup (callgrind).
#[derive(Clone, Copy, Debug, Default)]
struct DigestHash;

impl BuildHasher for DigestHash {
    type Hasher = DigestHasher;
    fn build_hasher(&self) -> DigestHasher {
        DigestHasher(0)
    }
}

struct DigestHasher(u64);

impl Hasher for DigestHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    /// `[u8; 32]` hashes as its length, then its bytes: the length is the
    /// same for every key and the bytes' head is taken as it is.
    fn write(&mut self, bytes: &[u8]) {
        let mut head = [0u8; 8];
        let n = bytes.len().min(8);
        head[..n].copy_from_slice(&bytes[..n]);
        self.0 ^= u64::from_le_bytes(head);
    }
}

/// What a presented password is checked against: its username's
/// credential, or for an unknown username a decoy that costs what a
/// credential in the file costs (`decoys.rs`) and never lets anyone in.
enum Against {
    Credential(Arc<Credential>),
    Decoy(Arc<Verifier>),
}

/// Which decoy an unknown username is checked against: the same on every
/// attempt, and neither chosen nor foreseen by the client (the username's
/// digest is keyed: [`Authenticator::username_key`]).
fn decoy_pick(attempt: &Attempt) -> u64 {
    let head: [u8; 8] = attempt.username[..8].try_into().expect("a 16-byte digest");
    u64::from_le_bytes(head)
}

/// (digest of the presented username and password, fingerprint of the hash
/// they are checked against; `None` for an unknown user).
type InFlightKey = ([u8; 32], Option<[u8; 32]>);

type Verdict = Result<bool, AuthFailure>;

/// Removes a verification from the in-flight map once it has finished (so
/// a later request verifies afresh: a verdict such as "no verifier slot
/// free" must not outlive the requests that waited for it), or when its
/// last waiter was cancelled. The map holds only what is being verified
/// right now.
struct ForgetWhenLast<'a> {
    in_flight: &'a Mutex<HashMap<InFlightKey, Arc<OnceCell<Verdict>>>>,
    key: InFlightKey,
    cell: &'a Arc<OnceCell<Verdict>>,
}

impl Drop for ForgetWhenLast<'_> {
    fn drop(&mut self) {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        let ours = in_flight
            .get(&self.key)
            .is_some_and(|cell| Arc::ptr_eq(cell, self.cell));
        // Two references: the map's and this waiter's.
        if ours && (self.cell.initialized() || Arc::strong_count(self.cell) <= 2) {
            in_flight.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::basic::tests::basic;
    use super::*;
    use crate::tenants::file as tenants_file;
    use crate::tenants::{Scopes, Tenant, TenantId};

    /// Tenant `a` with alice, whose password this is.
    fn store(password: &str, generation: u64) -> TenantStore {
        store_of(&[("alice", password)], generation)
    }

    /// Tenant `a` with these (username, password) pairs.
    fn store_of(users: &[(&str, &str)], generation: u64) -> TenantStore {
        let mut text = String::from("tenants:\n- id: a\n  users:\n");
        for (username, password) in users {
            let hash = password::hash_password(password).unwrap();
            text += &format!("  - {{username: {username}, password_hash: \"{hash}\"}}\n");
        }
        tenants_file::parse(&text, generation).unwrap().0
    }

    const CLIENT: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    #[tokio::test]
    async fn changed_password_invalidates_the_cached_success() {
        let auth = Authenticator::new(&AuthConfig::default(), Counter::default());
        let old = store("old", 1);
        assert!(auth
            .authenticate(&old, &basic("alice", "old"), CLIENT)
            .await
            .is_ok());
        // Cached: a second success must not need the verifier.
        assert!(auth
            .authenticate(&old, &basic("alice", "old"), CLIENT)
            .await
            .is_ok());

        let new = store("new", 2);
        assert_eq!(
            auth.authenticate(&new, &basic("alice", "old"), CLIENT)
                .await
                .unwrap_err(),
            AuthFailure::WrongPassword
        );
        assert!(auth
            .authenticate(&new, &basic("alice", "new"), CLIENT)
            .await
            .is_ok());
    }

    /// A full cache gives up first what a password change left behind, so
    /// the credentials in use stay remembered: starting over would send
    /// them all back to argon2 at once.
    #[tokio::test]
    async fn a_full_cache_drops_what_changed_passwords_left_behind_first() {
        let verifications = Counter::default();
        let config = AuthConfig {
            cache_size: 2,
            ..AuthConfig::default()
        };
        let auth = Authenticator::new(&config, verifications.clone());
        let before = store_of(&[("alice", "old"), ("bob", "bob-pw")], 1);
        let after = store_of(&[("alice", "new"), ("bob", "bob-pw")], 2);
        assert!(auth
            .authenticate(&before, &basic("alice", "old"), CLIENT)
            .await
            .is_ok());
        assert!(auth
            .authenticate(&after, &basic("alice", "new"), CLIENT)
            .await
            .is_ok());
        // Full: alice's old pair is what gives way for bob's.
        assert!(auth
            .authenticate(&after, &basic("bob", "bob-pw"), CLIENT)
            .await
            .is_ok());
        assert_eq!(verifications.get(), 3);
        assert!(auth
            .authenticate(&after, &basic("alice", "new"), CLIENT)
            .await
            .is_ok());
        assert_eq!(
            verifications.get(),
            3,
            "alice's new pair is still remembered"
        );
    }

    /// Full of credentials that are all in use, the cache starts over
    /// rather than growing past its size.
    #[tokio::test]
    async fn the_cache_never_holds_more_than_its_size() {
        let verifications = Counter::default();
        let config = AuthConfig {
            cache_size: 1,
            ..AuthConfig::default()
        };
        let auth = Authenticator::new(&config, verifications.clone());
        let both = store_of(&[("alice", "alice-pw"), ("bob", "bob-pw")], 1);
        for (user, pw) in [
            ("alice", "alice-pw"),
            ("bob", "bob-pw"),
            ("alice", "alice-pw"),
        ] {
            assert!(auth
                .authenticate(&both, &basic(user, pw), CLIENT)
                .await
                .is_ok());
            assert_eq!(auth.verified.read().unwrap().len(), 1, "{user}");
        }
        assert_eq!(verifications.get(), 3, "bob's login took alice's place");
    }

    #[tokio::test]
    async fn concurrent_logins_with_one_password_share_one_verification() {
        let verifications = Counter::default();
        let auth = Authenticator::new(&AuthConfig::default(), verifications.clone());
        let store = store("right", 1);
        let right = basic("alice", "right");
        let logins = (0..50).map(|_| auth.authenticate(&store, &right, CLIENT));
        let results = futures_util::future::join_all(logins).await;
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        assert_eq!(verifications.get(), 1);

        let wrong = basic("alice", "wrong");
        let guesses = (0..50).map(|_| auth.authenticate(&store, &wrong, CLIENT));
        let results = futures_util::future::join_all(guesses).await;
        assert!(
            results
                .iter()
                .all(|r| r.as_ref().unwrap_err() == &AuthFailure::WrongPassword),
            "{results:?}"
        );
        assert_eq!(verifications.get(), 2);
        assert!(auth.in_flight.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_finished_verification_is_not_handed_to_later_requests() {
        let verifications = Counter::default();
        let config = AuthConfig {
            max_failures_per_user: 0,
            max_failures_per_client: 0,
            ..AuthConfig::default()
        };
        let auth = Authenticator::new(&config, verifications.clone());
        let store = store("right", 1);
        let wrong = basic("alice", "wrong");
        let once = Duration::ZERO; // a timeout of zero polls its future once
        let first = auth.authenticate(&store, &wrong, CLIENT);
        let joined = auth.authenticate(&store, &wrong, CLIENT);
        tokio::pin!(first, joined);
        assert!(tokio::time::timeout(once, first.as_mut()).await.is_err());
        assert!(tokio::time::timeout(once, joined.as_mut()).await.is_err());
        assert_eq!(first.await.unwrap_err(), AuthFailure::WrongPassword);
        assert_eq!(verifications.get(), 1);

        // `joined` still holds the finished verdict; a new request must not
        // reuse it (it could be a stale "no verifier slot free").
        let later = auth.authenticate(&store, &wrong, CLIENT).await;
        assert_eq!(later.unwrap_err(), AuthFailure::WrongPassword);
        assert_eq!(verifications.get(), 2);
        assert_eq!(joined.await.unwrap_err(), AuthFailure::WrongPassword);
        assert_eq!(
            verifications.get(),
            2,
            "the joined request shared the first run"
        );
    }

    #[tokio::test]
    async fn an_abandoned_verification_is_forgotten() {
        let verifications = Counter::default();
        let auth = Authenticator::new(&AuthConfig::default(), verifications.clone());
        let store = store("right", 1);
        // Polled once (the verification starts), then dropped, as when the
        // client disconnects.
        let abandoned = tokio::time::timeout(
            Duration::ZERO,
            auth.authenticate(&store, &basic("alice", "right"), CLIENT),
        )
        .await;
        assert!(abandoned.is_err(), "cannot finish in zero time");
        assert!(auth.in_flight.lock().unwrap().is_empty());
        assert!(auth
            .authenticate(&store, &basic("alice", "right"), CLIENT)
            .await
            .is_ok());
        assert_eq!(verifications.get(), 2);
    }

    #[tokio::test]
    async fn repeated_failures_are_throttled_but_cached_successes_are_not() {
        let config = AuthConfig {
            max_failures_per_user: 2,
            ..AuthConfig::default()
        };
        let auth = Authenticator::new(&config, Counter::default());
        let s = store("right", 1);
        assert!(auth
            .authenticate(&s, &basic("alice", "right"), CLIENT)
            .await
            .is_ok());
        for _ in 0..2 {
            assert_eq!(
                auth.authenticate(&s, &basic("alice", "wrong"), CLIENT)
                    .await
                    .unwrap_err(),
                AuthFailure::WrongPassword
            );
        }
        assert!(matches!(
            auth.authenticate(&s, &basic("alice", "wrong"), CLIENT)
                .await,
            Err(AuthFailure::Throttled(_))
        ));
        assert!(auth
            .authenticate(&s, &basic("alice", "right"), CLIENT)
            .await
            .is_ok());
        // Counted per username: another name from the same client has a
        // count of its own.
        assert_eq!(
            auth.authenticate(&s, &basic("bob", "wrong"), CLIENT)
                .await
                .unwrap_err(),
            AuthFailure::UnknownUser
        );
    }

    /// A host walking through its IPv6 /64 keeps one count; another /64,
    /// or an IPv4 client, has its own.
    #[tokio::test]
    async fn an_ipv6_client_is_counted_by_its_64() {
        let config = AuthConfig {
            max_failures_per_user: 0,
            max_failures_per_client: 2,
            ..AuthConfig::default()
        };
        let auth = Authenticator::new(&config, Counter::default());
        let s = store("right", 1);
        let ip = |text: &str| text.parse::<IpAddr>().unwrap();
        for host in ["2001:db8:0:1::1", "2001:db8:0:1:ffff::2"] {
            let failed = auth
                .authenticate(&s, &basic("alice", "wrong"), ip(host))
                .await;
            assert_eq!(failed.unwrap_err(), AuthFailure::WrongPassword);
        }
        let walked = auth
            .authenticate(&s, &basic("alice", "wrong"), ip("2001:db8:0:1:abcd::3"))
            .await;
        assert!(
            matches!(walked, Err(AuthFailure::Throttled(_))),
            "{walked:?}"
        );
        for other in ["2001:db8:0:2::1", "192.0.2.1"] {
            let own_count = auth
                .authenticate(&s, &basic("alice", "wrong"), ip(other))
                .await;
            assert_eq!(
                own_count.unwrap_err(),
                AuthFailure::WrongPassword,
                "{other}"
            );
        }
        assert_eq!(counted_as(ip("::ffff:192.0.2.1")), ip("192.0.2.1"));
    }

    /// A verification that gets no working memory in time is a busy
    /// verifier (503, retried), never a wrong password, and counts as no
    /// failed attempt.
    #[tokio::test]
    async fn no_working_memory_in_time_is_busy_not_a_failure() {
        let config = AuthConfig {
            verification_memory_bytes: 1 << 20, // below one 19 MiB hash
            verification_wait: Duration::from_millis(10),
            max_failures_per_user: 1,
            ..AuthConfig::default()
        };
        let auth = Authenticator::new(&config, Counter::default());
        let s = store("right", 1);
        for _ in 0..3 {
            let refused = auth
                .authenticate(&s, &basic("alice", "right"), CLIENT)
                .await;
            assert_eq!(refused.unwrap_err(), AuthFailure::VerifierBusy);
        }
        let roomy = Authenticator::new(&AuthConfig::default(), Counter::default());
        assert!(roomy
            .authenticate(&s, &basic("alice", "right"), CLIENT)
            .await
            .is_ok());
    }

    /// Guesses sent all at once from one address are verified only as far
    /// as its failure count allows: a guess counts when its verification
    /// starts, not when its answer comes back.
    #[tokio::test]
    async fn concurrent_guesses_get_no_more_verifications_than_the_count_allows() {
        let verifications = Counter::default();
        let config = AuthConfig {
            max_concurrent_verifications: 2,
            verification_wait: Duration::from_secs(60),
            max_failures_per_user: 0,
            max_failures_per_client: 3,
            ..AuthConfig::default()
        };
        let auth = Authenticator::new(&config, verifications.clone());
        let s = store("right", 1);
        let guesses: Vec<_> = (0..20)
            .map(|i| basic("alice", &format!("guess-{i}")))
            .collect();
        let results = futures_util::future::join_all(
            guesses.iter().map(|g| auth.authenticate(&s, g, CLIENT)),
        )
        .await;
        let wrong = results
            .iter()
            .filter(|r| matches!(r, Err(AuthFailure::WrongPassword)))
            .count();
        let throttled = results
            .iter()
            .filter(|r| matches!(r, Err(AuthFailure::Throttled(_))))
            .count();
        assert_eq!((wrong, throttled), (3, 17), "{results:?}");
        assert_eq!(verifications.get(), 3);
    }

    /// Requests waiting for a verification are bounded, those sharing one
    /// included: one more is busy at once, without waiting, and counts no
    /// failure; a cached credential never waits, so it passes all the same.
    #[tokio::test]
    async fn logins_beyond_the_pending_bound_are_busy_at_once() {
        use futures_util::FutureExt;
        let verifications = Counter::default();
        let config = AuthConfig {
            max_concurrent_verifications: 1,
            max_pending_verifications: 2,
            verification_wait: Duration::from_secs(60),
            ..AuthConfig::default()
        };
        let auth = Arc::new(Authenticator::new(&config, verifications.clone()));
        let s = Arc::new(store_of(&[("alice", "right"), ("bob", "bobs")], 1));
        auth.authenticate(&s, &basic("bob", "bobs"), CLIENT)
            .await
            .unwrap();
        // The one verifier slot taken: verifications wait.
        let slot = auth.verify_slots.clone().acquire_owned().await.unwrap();
        let waiting: Vec<_> = ["guess", "guess"]
            .map(|password| {
                let (auth, s) = (auth.clone(), s.clone());
                tokio::spawn(async move {
                    auth.authenticate(&s, &basic("alice", password), CLIENT)
                        .await
                })
            })
            .into();
        for turn in 0.. {
            if auth.pending.available_permits() == 0 {
                break;
            }
            assert!(turn < 10_000, "the two never counted as waiting");
            tokio::task::yield_now().await;
        }
        for login in [basic("alice", "other"), basic("carol", "guess")] {
            let busy = auth.authenticate(&s, &login, CLIENT).now_or_never();
            assert!(
                matches!(busy, Some(Err(AuthFailure::VerifierBusy))),
                "{busy:?}"
            );
        }
        let bob = basic("bob", "bobs");
        let cached = auth.authenticate(&s, &bob, CLIENT).now_or_never();
        assert!(cached.is_some_and(|r| r.is_ok()));

        drop(slot);
        for login in waiting {
            assert_eq!(
                login.await.unwrap().unwrap_err(),
                AuthFailure::WrongPassword
            );
        }
        // bob's, then the two waiting ones' shared verification.
        assert_eq!(verifications.get(), 2);
        assert!(auth
            .authenticate(&s, &basic("alice", "right"), CLIENT)
            .await
            .is_ok());
    }

    /// A client that goes away while its guess is verified has still had
    /// the guess: the argon2 run happens all the same.
    #[tokio::test]
    async fn an_abandoned_guess_counts_as_a_failure() {
        let config = AuthConfig {
            max_failures_per_user: 0,
            max_failures_per_client: 1,
            ..AuthConfig::default()
        };
        let auth = Authenticator::new(&config, Counter::default());
        let s = store("right", 1);
        let abandoned = tokio::time::timeout(
            Duration::ZERO,
            auth.authenticate(&s, &basic("alice", "guess"), CLIENT),
        )
        .await;
        assert!(abandoned.is_err(), "cannot finish in zero time");
        let next = auth
            .authenticate(&s, &basic("alice", "another"), CLIENT)
            .await;
        assert!(matches!(next, Err(AuthFailure::Throttled(_))), "{next:?}");
    }

    /// An unknown username is checked against a decoy costing what the
    /// file's credentials cost. Seen here through argon2's memory budget:
    /// too small for a hash of this proxy's parameters (a busy verifier),
    /// of no concern to a plaintext comparison.
    #[tokio::test]
    async fn an_unknown_user_costs_what_the_files_credentials_cost() {
        let config = AuthConfig {
            verification_memory_bytes: 1 << 20, // below one 19 MiB hash
            verification_wait: Duration::from_millis(10),
            ..AuthConfig::default()
        };
        let auth = Authenticator::new(&config, Counter::default());
        let plaintext = "users:\n  - {username: a, password: pa, orgid: team-a}\n";
        let plaintext = tenants_file::parse(plaintext, 1).unwrap().0;
        let hashed = store("pw", 2);
        for (store, expected) in [
            (&plaintext, AuthFailure::UnknownUser),
            (&hashed, AuthFailure::VerifierBusy),
        ] {
            let unknown = auth
                .authenticate(store, &basic("mallory", "wrong"), CLIENT)
                .await;
            assert_eq!(unknown.unwrap_err(), expected);
        }
    }

    /// Unknown usernames are spread over the decoys by their keyed digest,
    /// and each keeps its decoy. Told apart here as in the test above: with
    /// no memory for argon2, the hashed decoy is busy and the plaintext one
    /// is not.
    #[tokio::test]
    async fn each_unknown_username_keeps_a_decoy_of_its_own() {
        let config = AuthConfig {
            verification_memory_bytes: 1 << 20, // below one 19 MiB hash
            verification_wait: Duration::from_millis(10),
            max_failures_per_user: 0,
            max_failures_per_client: 0,
            ..AuthConfig::default()
        };
        let auth = Authenticator::new(&config, Counter::default());
        let tenant = Arc::new(Tenant::new(TenantId::parse("a").unwrap(), vec!["a".into()]));
        let hashed = Verifier::argon2id(&password::hash_password("pw").unwrap()).unwrap();
        let credentials =
            [("p", Verifier::plaintext("pw")), ("h", hashed)].map(|(user, verifier)| {
                Credential::new(user.into(), verifier, tenant.clone(), Scopes::default_set())
            });
        let mixed = TenantStore::new(1, vec![tenant], credentials.into());
        let mut outcomes = Vec::new();
        for i in 0..64 {
            let name = format!("mallory-{i}");
            let first = auth.authenticate(&mixed, &basic(&name, "x"), CLIENT).await;
            let again = auth.authenticate(&mixed, &basic(&name, "x"), CLIENT).await;
            assert_eq!(
                first.as_ref().unwrap_err(),
                again.as_ref().unwrap_err(),
                "{name}"
            );
            let failure = first.unwrap_err();
            if !outcomes.contains(&failure) {
                outcomes.push(failure);
            }
        }
        assert_eq!(outcomes.len(), 2, "{outcomes:?}");
        for both in [AuthFailure::UnknownUser, AuthFailure::VerifierBusy] {
            assert!(outcomes.contains(&both), "{outcomes:?}");
        }
    }

    /// The auth cache's hasher takes the digests' heads as they are: keys
    /// that differ get hashes that differ.
    #[test]
    fn the_cache_hasher_keeps_digests_apart() {
        let hashes: std::collections::HashSet<u64> = (0..1000u32)
            .map(|i| DigestHash.hash_one(*blake3::hash(&i.to_le_bytes()).as_bytes()))
            .collect();
        assert_eq!(hashes.len(), 1000);
    }

    /// A waiter of a finished verification leaves a newer one under the
    /// same key alone; the last waiter of its own takes it out.
    #[test]
    fn a_waiter_forgets_only_its_own_verification() {
        let in_flight = Mutex::new(HashMap::new());
        let key: InFlightKey = ([7; 32], None);
        let newer = Arc::new(OnceCell::new());
        in_flight.lock().unwrap().insert(key, newer.clone());
        let older = Arc::new(OnceCell::new_with(Some(Ok(false))));
        drop(ForgetWhenLast {
            in_flight: &in_flight,
            key,
            cell: &older,
        });
        assert!(Arc::ptr_eq(&in_flight.lock().unwrap()[&key], &newer));
        drop(ForgetWhenLast {
            in_flight: &in_flight,
            key,
            cell: &newer,
        });
        assert!(in_flight.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn unknown_user_is_reported_as_such_internally() {
        let auth = Authenticator::new(&AuthConfig::default(), Counter::default());
        let s = store("pw", 1);
        assert_eq!(
            auth.authenticate(&s, &basic("mallory", "pw"), CLIENT)
                .await
                .unwrap_err(),
            AuthFailure::UnknownUser
        );
    }
}
