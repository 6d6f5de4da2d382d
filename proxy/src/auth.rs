//! Basic authentication: header → credential → tenant and scopes.
//!
//! argon2id costs tens of milliseconds, so it never runs per request for a
//! known good credential and never on the async runtime's threads:
//!
//! 1. cache hit: a keyed digest of (username, password) maps to the
//!    fingerprint of the password hash it was verified against; it counts only
//!    while the current tenants file still holds that hash for the user, so a
//!    changed or removed credential stops working on the next request;
//! 2. otherwise, failure throttles per username and client address are
//!    checked (429), then the hash is verified on one of a fixed set of
//!    verifier threads, behind a semaphore (503 when no slot frees up in
//!    time). A fixed set, because each keeps argon2's working memory for
//!    reuse: memory stays at threads × 19 MiB however many logins arrive.
//!    Unknown usernames are verified against a decoy hash so they cost the
//!    same as a wrong password.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use base64::Engine;
use http::{header, HeaderMap};
use tokio::sync::{oneshot, Semaphore};

use crate::config::AuthConfig;
use crate::error::ProxyError;
use crate::password::{self, Verifier};
use crate::tenants::{Credential, TenantStore};
use crate::throttle::FailureThrottle;

/// What a client presented. `Debug` never prints the password.
pub struct BasicCredentials {
    pub username: String,
    password: String,
}

impl fmt::Debug for BasicCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BasicCredentials")
            .field("username", &self.username)
            .field("password", &"**REDACTED**")
            .finish()
    }
}

/// Why authentication failed; `reason()` is the metric label. Every variant
/// but the last two reaches the client as the same 401.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFailure {
    MissingHeader,
    MalformedHeader,
    UnknownUser,
    WrongPassword,
    Throttled(Duration),
    VerifierBusy,
}

impl AuthFailure {
    pub fn reason(self) -> &'static str {
        match self {
            Self::MissingHeader => "missing",
            Self::MalformedHeader => "malformed",
            Self::UnknownUser => "unknown_user",
            Self::WrongPassword => "wrong_password",
            Self::Throttled(_) => "throttled",
            Self::VerifierBusy => "verifier_busy",
        }
    }

    pub fn into_error(self) -> ProxyError {
        match self {
            Self::Throttled(retry_after) => ProxyError::AuthThrottled { retry_after },
            Self::VerifierBusy => ProxyError::VerifierBusy,
            _ => ProxyError::Unauthenticated,
        }
    }
}

/// Reads `Authorization: Basic base64(user:password)`. Exactly one header.
pub fn parse_basic(headers: &HeaderMap) -> Result<BasicCredentials, AuthFailure> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let value = values.next().ok_or(AuthFailure::MissingHeader)?;
    if values.next().is_some() {
        return Err(AuthFailure::MalformedHeader);
    }
    let value = value.to_str().map_err(|_| AuthFailure::MalformedHeader)?;
    let (scheme, encoded) = value.split_once(' ').ok_or(AuthFailure::MalformedHeader)?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err(AuthFailure::MalformedHeader);
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|_| AuthFailure::MalformedHeader)?;
    let decoded = String::from_utf8(decoded).map_err(|_| AuthFailure::MalformedHeader)?;
    // RFC 7617: the user-id ends at the first ':'; the password may contain ':'.
    let (username, password) = decoded
        .split_once(':')
        .ok_or(AuthFailure::MalformedHeader)?;
    Ok(BasicCredentials {
        username: username.to_owned(),
        password: password.to_owned(),
    })
}

// === impl Authenticator ===

/// Threads that run argon2 and nothing else. Jobs arrive only with a
/// semaphore permit, so the queue never holds more than there are threads.
struct VerifierThreads {
    jobs: std::sync::mpsc::SyncSender<Box<dyn FnOnce() + Send>>,
}

impl VerifierThreads {
    fn new(threads: usize) -> Self {
        let (jobs, queue) = std::sync::mpsc::sync_channel::<Box<dyn FnOnce() + Send>>(threads);
        let queue = Arc::new(std::sync::Mutex::new(queue));
        for i in 0..threads {
            let queue = queue.clone();
            std::thread::Builder::new()
                .name(format!("argon2-verify-{i}"))
                .spawn(move || loop {
                    // The lock is held only to take a job, not to run it.
                    let job = queue.lock().unwrap_or_else(|e| e.into_inner()).recv();
                    match job {
                        Ok(job) => job(),
                        Err(_) => return, // the Authenticator is gone
                    }
                })
                .expect("spawning a verifier thread");
        }
        Self { jobs }
    }

    fn run<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Option<oneshot::Receiver<T>> {
        let (tx, rx) = oneshot::channel();
        self.jobs
            .try_send(Box::new(move || {
                let _ = tx.send(job());
            }))
            .ok()?;
        Some(rx)
    }
}

pub struct Authenticator {
    /// Random per process: cache keys mean nothing outside it.
    digest_key: [u8; 32],
    /// digest(username, password) → fingerprint of the hash it verified against.
    verified: RwLock<HashMap<[u8; 32], [u8; 32]>>,
    cache_size: usize,
    verify_slots: Arc<Semaphore>,
    verifiers: VerifierThreads,
    verification_wait: Duration,
    per_user: FailureThrottle<String>,
    per_client: FailureThrottle<IpAddr>,
    decoy: Arc<Verifier>,
}

impl fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authenticator").finish_non_exhaustive()
    }
}

impl Authenticator {
    pub fn new(config: &AuthConfig) -> Self {
        Self {
            digest_key: rand::random(),
            verified: RwLock::new(HashMap::new()),
            cache_size: config.cache_size,
            verify_slots: Arc::new(Semaphore::new(config.max_concurrent_verifications)),
            verifiers: VerifierThreads::new(config.max_concurrent_verifications),
            verification_wait: config.verification_wait,
            per_user: FailureThrottle::new(config.max_failures_per_user, config.failure_window),
            per_client: FailureThrottle::new(config.max_failures_per_client, config.failure_window),
            decoy: Arc::new(password::decoy_verifier()),
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
        let credential = store.credential(&presented.username).cloned();

        if let Some(credential) = &credential {
            if self.cached_fingerprint(&digest) == Some(credential.fingerprint) {
                return Ok(credential.clone());
            }
        }

        let now = Instant::now();
        self.per_user
            .check(&presented.username, now)
            .and_then(|()| self.per_client.check(&client, now))
            .map_err(AuthFailure::Throttled)?;

        let accepted = self.verify(credential.clone(), presented.password).await?;
        match credential {
            Some(credential) if accepted => {
                self.remember(digest, credential.fingerprint);
                Ok(credential)
            }
            known => {
                let now = Instant::now();
                self.per_user.record_failure(presented.username, now);
                self.per_client.record_failure(client, now);
                Err(if known.is_some() {
                    AuthFailure::WrongPassword
                } else {
                    AuthFailure::UnknownUser
                })
            }
        }
    }

    /// Runs the hash on a verifier thread once a verification slot is free.
    async fn verify(
        &self,
        credential: Option<Arc<Credential>>,
        password: String,
    ) -> Result<bool, AuthFailure> {
        let permit = tokio::time::timeout(
            self.verification_wait,
            self.verify_slots.clone().acquire_owned(),
        )
        .await
        .map_err(|_| AuthFailure::VerifierBusy)?
        .map_err(|_| AuthFailure::VerifierBusy)?;
        let decoy = self.decoy.clone();
        let outcome = self
            .verifiers
            .run(move || {
                let _permit = permit;
                match &credential {
                    Some(c) => c.verifier.verify(&password),
                    None => {
                        decoy.verify(&password);
                        false
                    }
                }
            })
            .ok_or(AuthFailure::VerifierBusy)?;
        outcome.await.map_err(|_| AuthFailure::VerifierBusy)
    }

    fn digest(&self, presented: &BasicCredentials) -> [u8; 32] {
        let mut hasher = blake3::Hasher::new_keyed(&self.digest_key);
        // Length prefix: ("ab","c") and ("a","bc") must not collide.
        hasher.update(&(presented.username.len() as u64).to_le_bytes());
        hasher.update(presented.username.as_bytes());
        hasher.update(presented.password.as_bytes());
        *hasher.finalize().as_bytes()
    }

    fn cached_fingerprint(&self, digest: &[u8; 32]) -> Option<[u8; 32]> {
        let verified = self.verified.read().unwrap_or_else(|e| e.into_inner());
        verified.get(digest).copied()
    }

    fn remember(&self, digest: [u8; 32], fingerprint: [u8; 32]) {
        let mut verified = self.verified.write().unwrap_or_else(|e| e.into_inner());
        if verified.len() >= self.cache_size {
            // Only successful logins land here, so the cache outgrows its
            // bound only with many password changes; starting over is cheap.
            verified.clear();
        }
        verified.insert(digest, fingerprint);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenants_file;
    use http::HeaderValue;

    fn basic(user: &str, pass: &str) -> HeaderMap {
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Basic {token}")).unwrap(),
        );
        h
    }

    fn store(password: &str, generation: u64) -> TenantStore {
        let hash = password::hash_password(password).unwrap();
        let text = format!(
            "tenants:\n- id: a\n  users: [{{username: alice, password_hash: \"{hash}\"}}]\n"
        );
        tenants_file::parse(&text, generation).unwrap().0
    }

    const CLIENT: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    #[test]
    fn parses_basic_with_colon_in_password() {
        let c = parse_basic(&basic("u", "p:w")).unwrap();
        assert_eq!((c.username.as_str(), c.password.as_str()), ("u", "p:w"));
        assert!(!format!("{c:?}").contains("p:w"));
    }

    #[test]
    fn rejects_other_schemes_and_garbage() {
        let mut h = HeaderMap::new();
        assert_eq!(parse_basic(&h).unwrap_err(), AuthFailure::MissingHeader);
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer abc"),
        );
        assert_eq!(parse_basic(&h).unwrap_err(), AuthFailure::MalformedHeader);
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic !!!"));
        assert_eq!(parse_basic(&h).unwrap_err(), AuthFailure::MalformedHeader);
        let mut two = basic("u", "p");
        two.append(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic dTpw"),
        );
        assert_eq!(parse_basic(&two).unwrap_err(), AuthFailure::MalformedHeader);
    }

    #[tokio::test]
    async fn changed_password_invalidates_the_cached_success() {
        let auth = Authenticator::new(&AuthConfig::default());
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

    #[tokio::test]
    async fn repeated_failures_are_throttled_but_cached_successes_are_not() {
        let config = AuthConfig {
            max_failures_per_user: 2,
            ..AuthConfig::default()
        };
        let auth = Authenticator::new(&config);
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
    }

    #[tokio::test]
    async fn unknown_user_is_reported_as_such_internally() {
        let auth = Authenticator::new(&AuthConfig::default());
        let s = store("pw", 1);
        assert_eq!(
            auth.authenticate(&s, &basic("mallory", "pw"), CLIENT)
                .await
                .unwrap_err(),
            AuthFailure::UnknownUser
        );
    }
}
