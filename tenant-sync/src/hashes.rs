//! argon2id hashes for plaintext passwords, computed only when a Secret's
//! password is new or changed: a re-list of thousands of unchanged Secrets
//! costs no hashing at all.

use std::collections::HashMap;

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

impl HashCache {
    /// The PHC hash of every desired user, by the Secret it came from.
    /// New hashes are computed on blocking threads, one per CPU.
    pub async fn resolve(&mut self, desired: &Desired) -> (HashMap<SecretKey, String>, HashStats) {
        let mut resolved = HashMap::new();
        let mut wanted = Vec::new();
        let mut stats = HashStats::default();
        for user in desired.tenants.values().flat_map(|t| &t.users) {
            match &user.credential.password {
                Password::Hashed(phc) => {
                    resolved.insert(user.source.clone(), phc.clone());
                }
                Password::Plain(plain) => {
                    let key = (user.source.clone(), self.digest(plain));
                    match self.hashes.get(&key) {
                        Some(phc) => {
                            stats.reused += 1;
                            resolved.insert(user.source.clone(), phc.clone());
                        }
                        None => wanted.push((key, plain.clone())),
                    }
                }
            }
        }
        stats.computed = wanted.len() as u64;
        let computed = tokio::task::spawn_blocking(move || hash_all(wanted))
            .await
            .expect("hashing threads do not panic");
        for (key, phc) in computed {
            resolved.insert(key.0.clone(), phc.clone());
            self.hashes.insert(key, phc);
        }
        // Forget Secrets and passwords no longer in use.
        self.hashes
            .retain(|(source, _), phc| resolved.get(source) == Some(phc));
        (resolved, stats)
    }

    fn digest(&self, password: &str) -> [u8; 32] {
        *blake3::keyed_hash(&self.digest_key, password.as_bytes()).as_bytes()
    }
}

fn hash_all<K: Send>(wanted: Vec<(K, String)>) -> Vec<(K, String)> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = wanted.len().div_ceil(threads).max(1);
    let mut wanted = wanted;
    let mut chunks = Vec::new();
    while !wanted.is_empty() {
        let rest = wanted.split_off(chunk.min(wanted.len()));
        chunks.push(std::mem::replace(&mut wanted, rest));
    }
    std::thread::scope(|scope| {
        let handles: Vec<_> = chunks
            .into_iter()
            .map(|chunk| {
                scope.spawn(move || {
                    chunk
                        .into_iter()
                        .map(|(key, plain)| {
                            let phc = tenant_proxy::auth::password::hash_password(&plain)
                                .expect("argon2 hashes any password");
                            (key, phc)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("hashing thread"))
            .collect()
    })
}
