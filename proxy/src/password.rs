//! Password hashing and verification. The only module that touches argon2.

use std::fmt;

use argon2::{Argon2, PasswordHash, PasswordHasher, PasswordVerifier};
use subtle::ConstantTimeEq;

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
    /// runtime, behind the verification semaphore (see `auth.rs`).
    pub fn verify(&self, password: &str) -> bool {
        match self {
            Self::Argon2id { phc } => match PasswordHash::new(phc) {
                Ok(hash) => Argon2::default()
                    .verify_password(password.as_bytes(), &hash)
                    .is_ok(),
                Err(_) => false,
            },
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

/// Hashes with argon2id and the crate's default (OWASP) parameters.
pub fn hash_password(password: &str) -> Result<String, String> {
    Argon2::default()
        .hash_password(password.as_bytes())
        .map(|h| h.to_string())
        .map_err(|e| e.to_string())
}

/// A verifier for a password nobody knows, checked for unknown usernames so
/// that they cost the same time as a wrong password for a known one.
pub fn decoy_verifier() -> Verifier {
    let random: [u8; 16] = rand::random();
    let phc = hash_password(&format!("{random:?}")).expect("argon2 hashes a fixed-size input");
    Verifier::Argon2id { phc }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn debug_hides_the_secret() {
        let phc = hash_password("s3cret").unwrap();
        let shown = format!("{:?}", Verifier::argon2id(&phc).unwrap());
        assert!(!shown.contains(&phc));
        assert!(shown.contains("REDACTED"));
    }
}
