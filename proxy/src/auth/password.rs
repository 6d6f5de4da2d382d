//! Password hashing and verification. The only module that touches argon2.

//!
//! argon2 allocates its working memory (19 MiB with default parameters) on
//! every call, and glibc does not reuse those large aligned blocks well: a
//! thread verifying 32 passwords in a row grew to 138 MiB. So each thread
//! keeps one working buffer and reuses it for every hash it computes.

use std::cell::RefCell;
use std::fmt;

use argon2::password_hash::phc::{Output, ParamsString, Salt};
use argon2::{Algorithm, Argon2, Block, Params, PasswordHash, Version};
use subtle::ConstantTimeEq;

/// Largest argon2 memory cost accepted from a tenants file (KiB): one bad
/// hash string must not make every verification allocate gigabytes.
pub const MAX_MEMORY_KIB: u32 = 256 * 1024;

thread_local! {
    static WORKING_MEMORY: RefCell<Vec<Block>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with this thread's argon2 working memory, grown to `blocks`.
fn with_working_memory<T>(blocks: usize, f: impl FnOnce(&mut [Block]) -> T) -> T {
    WORKING_MEMORY.with(|memory| {
        let mut memory = memory.borrow_mut();
        if memory.len() < blocks {
            memory.resize(blocks, Block::default());
        }
        f(&mut memory[..blocks])
    })
}

/// argon2 blocks (1 KiB each) this thread holds for reuse.
pub fn working_memory_blocks() -> usize {
    WORKING_MEMORY.with(|memory| memory.borrow().len())
}

/// Frees this thread's argon2 working memory.
pub fn release_working_memory() {
    WORKING_MEMORY.with(|memory| *memory.borrow_mut() = Vec::new());
}

/// How a credential's password is checked. `Debug` never prints the secret.
pub enum Verifier {
    /// An argon2id PHC string (`$argon2id$v=19$m=...`), the normal case.
    Argon2id { phc: String },
    /// A plaintext password from a k8spin `authn.yaml`, kept only as a digest so
    /// the comparison is constant-time over fixed-length values.
    Plaintext { digest: [u8; 32] },
}

impl Verifier {
    /// Validates that `phc` is an argon2id hash the verifier can use.
    pub fn argon2id(phc: &str) -> Result<Self, String> {
        let parsed = PasswordHash::new(phc).map_err(|e| format!("not a PHC hash string: {e}"))?;
        if parsed.algorithm.as_str() != "argon2id" {
            return Err(format!(
                "password hash uses {}, only argon2id is accepted",
                parsed.algorithm
            ));
        }
        let params = Params::try_from(&parsed).map_err(|e| format!("argon2 parameters: {e}"))?;
        if params.m_cost() > MAX_MEMORY_KIB {
            return Err(format!(
                "argon2 memory cost {} KiB is above the {MAX_MEMORY_KIB} KiB this proxy accepts",
                params.m_cost()
            ));
        }
        if parsed.salt.is_none() || parsed.hash.is_none() {
            return Err("the hash string has no salt or no hash".into());
        }
        Ok(Self::Argon2id {
            phc: phc.to_owned(),
        })
    }

    pub fn plaintext(password: &str) -> Self {
        Self::Plaintext {
            digest: *blake3::hash(password.as_bytes()).as_bytes(),
        }
    }

    /// Identifies the secret this verifier checks, so a cached success can be
    /// tied to it: a changed password hash gives a different fingerprint.
    pub fn fingerprint(&self) -> [u8; 32] {
        match self {
            Self::Argon2id { phc } => *blake3::hash(phc.as_bytes()).as_bytes(),
            Self::Plaintext { digest } => *blake3::hash(digest).as_bytes(),
        }
    }

    /// Expensive for argon2id (tens of milliseconds): call it off the async
    /// runtime, behind the verification semaphore (see `auth/mod.rs`).
    pub fn verify(&self, password: &str) -> bool {
        match self {
            Self::Argon2id { phc } => verify_argon2id(phc, password.as_bytes()).unwrap_or(false),
            Self::Plaintext { digest } => {
                let given = blake3::hash(password.as_bytes());
                given.as_bytes().ct_eq(digest).into()
            }
        }
    }

    pub fn is_plaintext(&self) -> bool {
        matches!(self, Self::Plaintext { .. })
    }
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Argon2id { .. } => f.write_str("Argon2id(**REDACTED**)"),
            Self::Plaintext { .. } => f.write_str("Plaintext(**REDACTED**)"),
        }
    }
}

/// Recomputes the hash with the PHC string's own parameters and salt, in
/// this thread's working memory, and compares in constant time.
fn verify_argon2id(phc: &str, password: &[u8]) -> Result<bool, argon2::Error> {
    let hash = PasswordHash::new(phc).map_err(|_| argon2::Error::AlgorithmInvalid)?;
    let params = Params::try_from(&hash).map_err(|_| argon2::Error::AlgorithmInvalid)?;
    let version = match hash.version {
        Some(v) => Version::try_from(v)?,
        None => Version::default(),
    };
    let (Some(salt), Some(expected)) = (&hash.salt, &hash.hash) else {
        return Ok(false);
    };
    let argon2 = Argon2::new(Algorithm::Argon2id, version, params.clone());
    let mut computed = vec![0u8; expected.len()];
    with_working_memory(params.block_count(), |memory| {
        argon2.hash_password_into_with_memory(password, salt.as_ref(), &mut computed, memory)
    })?;
    Ok(computed.ct_eq(expected.as_bytes()).into())
}

/// Hashes with argon2id and the crate's default (OWASP) parameters.
pub fn hash_password(password: &str) -> Result<String, String> {
    let params = Params::default();
    let salt: [u8; 16] = rand::random();
    let argon2 = Argon2::new(Algorithm::Argon2id, Version::V0x13, params.clone());
    let mut output = [0u8; Params::DEFAULT_OUTPUT_LEN];
    with_working_memory(params.block_count(), |memory| {
        argon2.hash_password_into_with_memory(password.as_bytes(), &salt, &mut output, memory)
    })
    .map_err(|e| e.to_string())?;
    let hash = PasswordHash {
        algorithm: Algorithm::Argon2id.ident(),
        version: Some(Version::V0x13.into()),
        params: ParamsString::try_from(&params).map_err(|e| e.to_string())?,
        salt: Some(Salt::new(&salt).map_err(|e| e.to_string())?),
        hash: Some(Output::new(&output).map_err(|e| e.to_string())?),
    };
    Ok(hash.to_string())
}

/// A verifier checked for unknown usernames so that they cost the same time
/// as a wrong password for a known one. Its password was random and is
/// thrown away; the result is ignored anyway (an unknown user never gets
/// in). A constant: hashing one at start-up would leave a 19 MiB working
/// buffer on the main thread for good.
pub fn decoy_verifier() -> Verifier {
    Verifier::Argon2id {
        phc: DECOY_PHC.to_owned(),
    }
}

const DECOY_PHC: &str = "$argon2id$v=19$m=19456,t=2,p=1$v/ydbRDBMWO8PkaXFys2dg$1RWcgeLQwFjY8DZUsZ7AvjWo4PywF1FuCFRNHq4UizQ";

#[cfg(test)]
mod tests {
    use super::*;
    use argon2::PasswordVerifier;

    #[test]
    fn verifies_the_right_password_only() {
        let phc = hash_password("s3cret").unwrap();
        let v = Verifier::argon2id(&phc).unwrap();
        assert!(v.verify("s3cret"));
        assert!(!v.verify("s3cret "));
        assert!(!v.verify(""));
    }

    #[test]
    fn plaintext_verifier_compares_exactly() {
        let v = Verifier::plaintext("pw");
        assert!(v.verify("pw"));
        assert!(!v.verify("pw2"));
    }

    #[test]
    fn rejects_hashes_other_than_argon2id() {
        assert!(Verifier::argon2id("$2b$05$abcdefghijklmnopqrstuu").is_err());
        assert!(Verifier::argon2id("plain").is_err());
    }

    #[test]
    fn verifies_hashes_made_elsewhere_with_other_parameters() {
        // From the reference implementation's defaults and from cheap test params.
        use argon2::PasswordHasher;
        let cheap = Argon2::new(
            Algorithm::Argon2id,
            Version::V0x13,
            Params::new(64, 1, 1, None).unwrap(),
        )
        .hash_password(b"elsewhere")
        .unwrap()
        .to_string();
        let v = Verifier::argon2id(&cheap).unwrap();
        assert!(v.verify("elsewhere") && !v.verify("Elsewhere"));
        let ours = hash_password("pw").unwrap();
        assert!(
            ours.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"),
            "{ours}"
        );
        assert!(Argon2::default()
            .verify_password(b"pw", &PasswordHash::new(&ours).unwrap())
            .is_ok());
    }

    #[test]
    fn refuses_hashes_asking_for_too_much_memory() {
        use argon2::PasswordHasher;
        let greedy = Argon2::new(
            Algorithm::Argon2id,
            Version::V0x13,
            Params::new(MAX_MEMORY_KIB + 8, 1, 1, None).unwrap(),
        );
        let phc = greedy.hash_password(b"x").unwrap().to_string();
        assert!(Verifier::argon2id(&phc)
            .unwrap_err()
            .contains("memory cost"));
    }

    #[test]
    fn the_decoy_is_a_valid_hash_that_matches_nothing_guessable() {
        assert!(Verifier::argon2id(DECOY_PHC).is_ok());
        for guess in ["", "password", "admin"] {
            assert!(!decoy_verifier().verify(guess));
        }
    }

    #[test]
    fn debug_hides_the_secret() {
        let phc = hash_password("s3cret").unwrap();
        let shown = format!("{:?}", Verifier::argon2id(&phc).unwrap());
        assert!(!shown.contains(&phc));
        assert!(shown.contains("REDACTED"));
    }
}
