//! Password hashing and verification. The only module that touches argon2.

//!
//! argon2 allocates its working memory (19 MiB with default parameters) on
//! every call, and glibc does not reuse those large aligned blocks well: a
//! thread verifying 32 passwords in a row grew to 138 MiB. So working
//! buffers are reused: the verifier threads' from a pool within a budget
//! (`working_memory.rs`), any other thread's (hashing for the CLI or for
//! tenant-sync) one of its own.

use std::cell::RefCell;
use std::fmt;

use argon2::password_hash::phc::{Output, ParamsString, Salt};
use argon2::{Algorithm, Argon2, Block, Params, PasswordHash, Version};
use subtle::ConstantTimeEq;

use super::working_memory::{OverBudget, WorkingMemory};

/// Largest argon2 memory cost accepted from a tenants file (KiB). A hash
/// string is a tenant's to write (a Secret's `password-hash`), and each
/// verification against it allocates this much: 64 MiB is what the common
/// tools' strongest defaults ask (RFC 9106's second option, argon2-cffi,
/// Go's `x/crypto` example), three times this proxy's own.
pub const MAX_MEMORY_KIB: u32 = 64 * 1024;

/// Largest memory cost times passes accepted (KiB): what a verification
/// costs in time, 145 ms at the bound against 23 ms at this proxy's own
/// parameters (2-core benchmark machine, release build). Unbounded, one hash
/// could hold a verifier thread for hours, and a few logins against it
/// every thread, so that no other login got through.
pub const MAX_COST_KIB_PASSES: u64 = 4 * MAX_MEMORY_KIB as u64;

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

/// How a credential's password is checked. `Debug` never prints the secret.
pub enum Verifier {
    /// An argon2id PHC string (`$argon2id$v=19$m=...`), the normal case.
    Argon2id { phc: String, cost: Cost },
    /// A plaintext password from a k8spin `authn.yaml`, kept only as a digest so
    /// the comparison is constant-time over fixed-length values.
    Plaintext { digest: [u8; 32] },
}

/// What checking a password costs, as far as its time goes: what an
/// argon2id hash string asks (its version, its parameters, the lengths of
/// its salt and output), or a plaintext comparison.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Cost {
    Plaintext,
    Argon2id {
        version: Option<u32>,
        /// As written: `m=19456,t=2,p=1`.
        params: String,
        salt_bytes: usize,
        output_bytes: usize,
    },
}

impl Cost {
    /// This proxy's own hashes' (`hash_password`).
    pub fn of_this_proxy() -> Self {
        Self::Argon2id {
            version: Some(Version::V0x13.into()),
            params: ParamsString::try_from(&Params::default())
                .expect("the default parameters")
                .to_string(),
            salt_bytes: SALT_BYTES,
            output_bytes: Params::DEFAULT_OUTPUT_LEN,
        }
    }
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
        let cost = u64::from(params.m_cost()) * u64::from(params.t_cost());
        if cost > MAX_COST_KIB_PASSES {
            return Err(format!(
                "argon2 cost of {} passes over {} KiB is above the {MAX_COST_KIB_PASSES} \
                 KiB-passes this proxy accepts (at most 4 passes at {MAX_MEMORY_KIB} KiB)",
                params.t_cost(),
                params.m_cost()
            ));
        }
        let (Some(salt), Some(output)) = (&parsed.salt, &parsed.hash) else {
            return Err("the hash string has no salt or no hash".into());
        };
        let cost = Cost::Argon2id {
            version: parsed.version,
            params: parsed.params.to_string(),
            salt_bytes: salt.as_ref().len(),
            output_bytes: output.len(),
        };
        Ok(Self::Argon2id {
            phc: phc.to_owned(),
            cost,
        })
    }

    /// A verifier that takes as long as one of `cost` and accepts nothing a
    /// client could send: the same parameters and lengths, with a random
    /// salt and a random expected hash (a password matches it by chance
    /// only, one in 2^(8 × output bytes)). Checked for an unknown username,
    /// so that its 401 takes as long as a known one's; built without
    /// hashing anything.
    pub fn decoy(cost: &Cost) -> Self {
        match cost {
            Cost::Plaintext => Self::Plaintext {
                digest: rand::random(),
            },
            Cost::Argon2id {
                version,
                params,
                salt_bytes,
                output_bytes,
            } => {
                let random = |n: usize| (0..n).map(|_| rand::random::<u8>()).collect::<Vec<_>>();
                let hash = PasswordHash {
                    algorithm: Algorithm::Argon2id.ident(),
                    version: *version,
                    params: params.parse().expect("parameters read from a valid hash"),
                    salt: Some(
                        Salt::new(&random(*salt_bytes)).expect("a valid hash's salt length"),
                    ),
                    hash: Some(
                        Output::new(&random(*output_bytes)).expect("a valid hash's output length"),
                    ),
                };
                Self::argon2id(&hash.to_string()).expect("a valid hash's parameters")
            }
        }
    }

    /// What checking a password against this verifier costs.
    pub fn cost(&self) -> &Cost {
        match self {
            Self::Argon2id { cost, .. } => cost,
            Self::Plaintext { .. } => &Cost::Plaintext,
        }
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
            Self::Argon2id { phc, .. } => *blake3::hash(phc.as_bytes()).as_bytes(),
            Self::Plaintext { digest } => *blake3::hash(digest).as_bytes(),
        }
    }

    /// Expensive for argon2id (tens of milliseconds), with this thread's
    /// own working memory: for tests and tools. The proxy verifies with
    /// [`Verifier::verify_in`].
    pub fn verify(&self, password: &str) -> bool {
        self.check(password, None) == Ok(true)
    }

    /// [`Verifier::verify`] with argon2's working memory from `memory`, on a
    /// verifier thread (`auth/verifier_threads.rs`).
    pub fn verify_in(&self, password: &str, memory: &WorkingMemory) -> Result<bool, OverBudget> {
        self.check(password, Some(memory))
    }

    fn check(&self, password: &str, memory: Option<&WorkingMemory>) -> Result<bool, OverBudget> {
        match self {
            Self::Argon2id { phc, .. } => verify_argon2id(phc, password.as_bytes(), memory),
            Self::Plaintext { digest } => {
                let given = blake3::hash(password.as_bytes());
                Ok(given.as_bytes().ct_eq(digest).into())
            }
        }
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
/// working memory from `memory` (else this thread's), and compares in
/// constant time. A string argon2 cannot use matches nothing.
fn verify_argon2id(
    phc: &str,
    password: &[u8],
    memory: Option<&WorkingMemory>,
) -> Result<bool, OverBudget> {
    let Ok(hash) = PasswordHash::new(phc) else {
        return Ok(false);
    };
    let (Ok(params), Some(salt), Some(expected)) =
        (Params::try_from(&hash), &hash.salt, &hash.hash)
    else {
        return Ok(false);
    };
    let version = match hash.version.map(Version::try_from) {
        None => Version::default(),
        Some(Ok(version)) => version,
        Some(Err(_)) => return Ok(false),
    };
    let argon2 = Argon2::new(Algorithm::Argon2id, version, params.clone());
    let mut computed = vec![0u8; expected.len()];
    let compute = |buffer: &mut [Block]| {
        argon2.hash_password_into_with_memory(password, salt.as_ref(), &mut computed, buffer)
    };
    let hashed = match memory {
        Some(memory) => memory.with(params.block_count(), compute)?,
        None => with_working_memory(params.block_count(), compute),
    };
    Ok(hashed.is_ok() && bool::from(computed.ct_eq(expected.as_bytes())))
}

/// The salt of this proxy's own hashes.
const SALT_BYTES: usize = 16;

/// Hashes with argon2id and the crate's default (OWASP) parameters.
pub fn hash_password(password: &str) -> Result<String, String> {
    let params = Params::default();
    let salt: [u8; SALT_BYTES] = rand::random();
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

    /// A PHC string of these parameters (salt and hash arbitrary): only
    /// its reading is tested, hashing at the bounds is slow.
    fn phc(m: u32, t: u32, p: u32) -> String {
        format!(
            "$argon2id$v=19$m={m},t={t},p={p}$c29tZXNhbHRzb21lc2FsdA$\
             1RWcgeLQwFjY8DZUsZ7AvjWo4PywF1FuCFRNHq4UizQ"
        )
    }

    /// What the common tools' strongest defaults ask is accepted; more
    /// memory, or more passes over the largest memory, is not: a tenant
    /// writes these parameters, and each login against them pays them.
    #[test]
    fn a_hash_costing_more_than_the_bounds_is_refused() {
        for (m, t, p, tool) in [
            (19456, 2, 1, "this proxy, OWASP"),
            (65536, 3, 4, "argon2-cffi, RFC 9106 second option"),
            (65536, 1, 4, "Go x/crypto's example"),
            (65536, 4, 1, "the bound"),
            (16384, 16, 1, "the bound, as less memory and more passes"),
        ] {
            assert!(Verifier::argon2id(&phc(m, t, p)).is_ok(), "{tool}");
        }
        let refused = Verifier::argon2id(&phc(MAX_MEMORY_KIB + 1024, 1, 1)).unwrap_err();
        assert!(refused.contains("memory cost"), "{refused}");
        for (m, t) in [(65536, 5), (16384, 17), (19456, 1000), (8, u32::MAX)] {
            let refused = Verifier::argon2id(&phc(m, t, 1)).unwrap_err();
            assert!(refused.contains("passes"), "m={m} t={t}: {refused}");
        }
    }

    #[test]
    fn verifying_within_a_budget_is_verifying() {
        let phc = hash_password("pw").unwrap();
        let v = Verifier::argon2id(&phc).unwrap();
        let memory = WorkingMemory::new(64 << 20, std::time::Duration::ZERO);
        assert_eq!(v.verify_in("pw", &memory), Ok(true));
        assert_eq!(v.verify_in("pW", &memory), Ok(false));
        let small = WorkingMemory::new(1 << 20, std::time::Duration::ZERO);
        assert_eq!(
            v.verify_in("pw", &small),
            Err(OverBudget),
            "19 MiB in 1 MiB"
        );
    }

    /// A decoy is checked as its model is (same parameters and lengths:
    /// the same work) and accepts neither the model's password nor any
    /// other: its salt and expected hash are random.
    #[test]
    fn a_decoy_costs_what_its_model_costs_and_accepts_nothing() {
        let ours = Verifier::argon2id(&hash_password("pw").unwrap()).unwrap();
        assert_eq!(ours.cost(), &Cost::of_this_proxy());
        let cheap = {
            use argon2::PasswordHasher;
            let params = Params::new(64, 3, 2, Some(48)).unwrap();
            Argon2::new(Algorithm::Argon2id, Version::V0x10, params)
                .hash_password(b"pw")
                .unwrap()
                .to_string()
        };
        let cheap = Verifier::argon2id(&cheap).unwrap();
        // No version: argon2's own default is read.
        let unversioned = Verifier::argon2id(&phc(64, 1, 1).replace("v=19$", "")).unwrap();
        let plain = Verifier::plaintext("pw");
        for model in [&ours, &cheap, &unversioned, &plain] {
            let decoy = Verifier::decoy(model.cost());
            assert_eq!(decoy.cost(), model.cost());
            assert_ne!(decoy.fingerprint(), model.fingerprint());
            for guess in ["pw", "", "password"] {
                assert!(!decoy.verify(guess), "{:?} took {guess:?}", model.cost());
            }
        }
        let Cost::Argon2id {
            params,
            output_bytes,
            ..
        } = cheap.cost()
        else {
            panic!("argon2id")
        };
        assert_eq!((params.as_str(), *output_bytes), ("m=64,t=3,p=2", 48));
    }

    proptest::proptest! {
        /// Whatever an accepted hash string asks (parameters, version or
        /// none, salt and output lengths), its decoy is built, asks the
        /// same, and is another string.
        #[test]
        fn every_accepted_hash_has_a_decoy_of_its_cost(
            m in 8u32..=MAX_MEMORY_KIB,
            t in 1u32..=4,
            p in 1u32..=8,
            version in proptest::option::of(proptest::sample::select(vec![16u32, 19])),
            salt in proptest::collection::vec(proptest::num::u8::ANY, Salt::MIN_LENGTH..=Salt::MAX_LENGTH),
            output in proptest::collection::vec(proptest::num::u8::ANY, Output::MIN_LENGTH..=Output::MAX_LENGTH),
        ) {
            let hash = PasswordHash {
                algorithm: Algorithm::Argon2id.ident(),
                version,
                params: format!("m={},t={t},p={p}", m.max(8 * p)).parse().unwrap(),
                salt: Some(Salt::new(&salt).unwrap()),
                hash: Some(Output::new(&output).unwrap()),
            };
            let Ok(model) = Verifier::argon2id(&hash.to_string()) else {
                return Ok(()); // beyond the cost bound
            };
            let decoy = Verifier::decoy(model.cost());
            proptest::prop_assert_eq!(decoy.cost(), model.cost());
            proptest::prop_assert_ne!(decoy.fingerprint(), model.fingerprint());
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
