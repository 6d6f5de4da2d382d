//! argon2id hashes for plaintext passwords, computed only when a Secret's
//! password is new or changed: a re-list of thousands of unchanged Secrets
//! costs no hashing at all.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::index::{Desired, Password, SecretKey};

/// Remembers the hash made for each (Secret, password). The password is
/// identified by a keyed digest; the key is random per process.
pub struct HashCache {
    digest_key: [u8; 32],
    hashes: HashMap<(SecretKey, [u8; 32]), String>,
}

impl std::fmt::Debug for HashCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HashCache")
            .field("entries", &self.hashes.len())
            .finish()
    }
}

impl Default for HashCache {
    fn default() -> Self {
        Self {
            digest_key: rand::random(),
            hashes: HashMap::new(),
        }
    }
}

/// What resolving did, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HashStats {
    pub computed: u64,
    pub reused: u64,
}

/// The hash of every desired user whose password has one yet, by the
/// Secret it came from.
#[derive(Debug, Default)]
pub struct Resolved {
    pub hashes: HashMap<SecretKey, String>,
    /// Users whose new password is still to be hashed: left out of this
    /// file, in a later one.
    pub pending: HashSet<SecretKey>,
}

impl HashCache {
    /// The PHC hash of every desired user. New hashes are computed on
    /// blocking threads, one per CPU, for at most `within` (the first on
    /// each thread whatever the time): argon2id takes tens of milliseconds
    /// a password, and a sync waits for it, so a namespace that adds
    /// thousands of Secrets at once would otherwise hold back every other
    /// change, a revocation too, for minutes. The rest are `pending`, taken
    /// namespace by namespace in turn, so one namespace's thousand do not
    /// hold back another's one.
    pub async fn resolve(
        &mut self,
        desired: &Desired,
        within: Option<Duration>,
    ) -> (Resolved, HashStats) {
        let mut resolved = Resolved::default();
        let mut wanted: BTreeMap<&str, Vec<_>> = BTreeMap::new();
        let mut stats = HashStats::default();
        for user in desired.tenants.values().flat_map(|t| &t.users) {
            match &user.credential.password {
                Password::Hashed(phc) => {
                    resolved.hashes.insert(user.source.clone(), phc.clone());
                }
                Password::Plain(plain) => {
                    let key = (user.source.clone(), self.digest(plain));
                    match self.hashes.get(&key) {
                        Some(phc) => {
                            stats.reused += 1;
                            resolved.hashes.insert(user.source.clone(), phc.clone());
                        }
                        None => wanted
                            .entry(user.source.0.as_str())
                            .or_default()
                            .push((key, plain.clone())),
                    }
                }
            }
        }
        let wanted = in_turn(wanted.into_values().collect());
        let deadline = within.map(|within| Instant::now() + within);
        let computed = tokio::task::spawn_blocking(move || hash_all(wanted, deadline))
            .await
            .expect("hashing threads do not panic");
        for (key, phc) in computed {
            match phc {
                Some(phc) => {
                    stats.computed += 1;
                    resolved.hashes.insert(key.0.clone(), phc.clone());
                    self.hashes.insert(key, phc);
                }
                None => {
                    resolved.pending.insert(key.0);
                }
            }
        }
        // Forget Secrets and passwords no longer in use.
        self.hashes
            .retain(|(source, _), phc| resolved.hashes.get(source) == Some(phc));
        (resolved, stats)
    }

    fn digest(&self, password: &str) -> [u8; 32] {
        *blake3::keyed_hash(&self.digest_key, password.as_bytes()).as_bytes()
    }
}

/// One item of each list in turn, then the next of each, and so on.
fn in_turn<T>(lists: Vec<Vec<T>>) -> Vec<T> {
    let mut lists: Vec<_> = lists.into_iter().map(Vec::into_iter).collect();
    let mut all = Vec::new();
    loop {
        let before = all.len();
        all.extend(lists.iter_mut().filter_map(Iterator::next));
        if all.len() == before {
            return all;
        }
    }
}

/// Hashes `wanted` in order on one thread per CPU, each taking the next
/// until `deadline` (each does at least one, so every sync makes progress);
/// `None` for a password left for later.
fn hash_all<K: Send + Sync>(
    wanted: Vec<(K, String)>,
    deadline: Option<Instant>,
) -> Vec<(K, Option<String>)> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let next = AtomicUsize::new(0);
    let done: Mutex<Vec<Option<String>>> = Mutex::new(vec![None; wanted.len()]);
    std::thread::scope(|scope| {
        for _ in 0..threads.min(wanted.len()) {
            scope.spawn(|| {
                let mut first = true;
                while first || deadline.is_none_or(|at| Instant::now() < at) {
                    first = false;
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some((_, plain)) = wanted.get(i) else {
                        return;
                    };
                    let phc = tenant_proxy::auth::password::hash_password(plain)
                        .expect("argon2 hashes any password");
                    done.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(phc);
                }
            });
        }
    });
    let done = done.into_inner().unwrap_or_else(|e| e.into_inner());
    wanted
        .into_iter()
        .zip(done)
        .map(|((key, _), phc)| (key, phc))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use tenant_proxy::auth::password::Verifier;
    use tenant_proxy::tenants::TenantId;

    use super::*;
    use crate::index::{DesiredTenant, DesiredUser, SecretCredential};

    /// One tenant, `shop`, with a Secret `s<i>` of plaintext password
    /// `passwords[i]` each.
    fn desired(passwords: &[&str]) -> Desired {
        let users = passwords
            .iter()
            .enumerate()
            .map(|(i, password)| DesiredUser {
                source: secret(i),
                credential: SecretCredential {
                    username: format!("u{i}"),
                    password: Password::Plain(password.to_string()),
                    scopes: None,
                    selector: None,
                },
            })
            .collect();
        let tenant = DesiredTenant {
            namespaces: BTreeSet::from(["shop".to_owned()]),
            limits: None,
            users,
        };
        let mut desired = Desired::default();
        desired
            .tenants
            .insert(TenantId::parse("shop").unwrap(), tenant);
        desired
    }

    fn secret(i: usize) -> SecretKey {
        ("shop".to_owned(), format!("s{i}"))
    }

    fn verifies(phc: &str, password: &str) -> bool {
        Verifier::argon2id(phc).unwrap().verify(password)
    }

    /// A hash is made once per Secret and password: kept while both are,
    /// made anew for a changed password, and the counts say which.
    #[tokio::test]
    async fn a_hash_is_made_once_and_reused_while_the_password_holds() {
        let mut cache = HashCache::default();
        let (first, stats) = cache.resolve(&desired(&["a", "b"]), None).await;
        assert_eq!(
            stats,
            HashStats {
                computed: 2,
                reused: 0
            }
        );
        assert!(first.pending.is_empty());
        assert!(verifies(&first.hashes[&secret(0)], "a"));
        assert!(verifies(&first.hashes[&secret(1)], "b"));

        let (again, stats) = cache.resolve(&desired(&["a", "c"]), None).await;
        assert_eq!(
            stats,
            HashStats {
                computed: 1,
                reused: 1
            }
        );
        assert_eq!(again.hashes[&secret(0)], first.hashes[&secret(0)]);
        assert!(verifies(&again.hashes[&secret(1)], "c"));
        // The old password's hash is forgotten; the cache shows only its
        // size, never a hash.
        let shown = format!("{cache:?}");
        assert_eq!(shown, "HashCache { entries: 2 }");
    }

    /// Given time enough, every new password is hashed in this sync: more
    /// than the threads, which hash one each whatever the time.
    #[tokio::test]
    async fn within_the_time_given_every_new_password_is_hashed() {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let passwords: Vec<String> = (0..threads + 2).map(|i| format!("pw{i}")).collect();
        let passwords: Vec<&str> = passwords.iter().map(String::as_str).collect();
        let mut cache = HashCache::default();
        let within = Some(Duration::from_secs(600));
        let (resolved, stats) = cache.resolve(&desired(&passwords), within).await;
        assert!(resolved.pending.is_empty(), "{:?}", resolved.pending);
        assert_eq!(stats.computed, passwords.len() as u64);
    }

    #[test]
    fn lists_are_taken_in_turn() {
        let lists = vec![vec!["a1", "a2", "a3"], vec!["b1"], vec![], vec!["c1", "c2"]];
        assert_eq!(in_turn(lists), ["a1", "b1", "c1", "a2", "c2", "a3"]);
    }

    /// Past the deadline each thread still hashes one, and leaves the rest.
    #[test]
    fn hashing_stops_at_the_deadline_after_one_each() {
        let wanted: Vec<_> = (0..64).map(|i| (i, format!("pw{i}"))).collect();
        let hashed = hash_all(wanted, Some(Instant::now()));
        let done: Vec<_> = hashed.iter().filter(|(_, phc)| phc.is_some()).collect();
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert!(
            !done.is_empty() && done.len() <= threads.min(64),
            "{}",
            done.len()
        );
        assert!(
            hashed.iter().map(|(i, _)| *i).eq(0..64),
            "in order, each once"
        );
        let all = hash_all(vec![(0, "a".to_owned()), (1, "b".to_owned())], None);
        assert!(all.iter().all(|(_, phc)| phc.is_some()));
    }
}
