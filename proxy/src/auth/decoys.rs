//! What a password is checked against when its username is unknown: a
//! decoy that costs what the tenants file's own credentials cost, so that
//! an unknown username's 401 takes as long as a known one's wrong password.
//! One decoy for every cost in the file (its plaintext credentials, each
//! set of argon2id parameters), each picked as often as credentials of its
//! cost are there: an unknown username takes the time of some credential
//! in the file, and the same time on every attempt.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::password::{Cost, Verifier};

#[derive(Debug, Default)]
pub struct Decoys {
    /// One decoy per cost, with the running count of credentials up to and
    /// including its cost's: a pick below the first count takes the first.
    by_cost: Vec<(u64, Arc<Verifier>)>,
}

impl Decoys {
    /// Decoys for the costs of `verifiers`, built without hashing.
    pub fn like<'a>(verifiers: impl Iterator<Item = &'a Verifier>) -> Self {
        let mut counts: BTreeMap<&Cost, u64> = BTreeMap::new();
        for verifier in verifiers {
            *counts.entry(verifier.cost()).or_default() += 1;
        }
        let mut running = 0;
        let by_cost = counts
            .into_iter()
            .map(|(cost, count)| {
                running += count;
                (running, Arc::new(Verifier::decoy(cost)))
            })
            .collect();
        Self { by_cost }
    }

    /// The decoy for `pick`, a number the client can neither choose nor
    /// predict and that stays the same for its username (a keyed digest of
    /// it); `None` without credentials.
    pub fn pick(&self, pick: u64) -> Option<&Arc<Verifier>> {
        let (total, _) = self.by_cost.last()?;
        let at = pick % total;
        let index = self.by_cost.partition_point(|(running, _)| *running <= at);
        Some(&self.by_cost[index].1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::password::hash_password;

    #[test]
    fn each_cost_is_picked_as_often_as_credentials_of_it_are_there() {
        let hashed = Verifier::argon2id(&hash_password("pw").unwrap()).unwrap();
        let plain = [
            Verifier::plaintext("a"),
            Verifier::plaintext("b"),
            Verifier::plaintext("c"),
        ];
        let decoys = Decoys::like(plain.iter().chain([&hashed]));
        let picked: Vec<_> = (0..8)
            .map(|pick| decoys.pick(pick).unwrap().cost().clone())
            .collect();
        let (p, h) = (Cost::Plaintext, Cost::of_this_proxy());
        assert_eq!(picked, [&p, &p, &p, &h, &p, &p, &p, &h].map(Clone::clone));
        assert!(decoys.pick(u64::MAX).is_some());
        assert!(Decoys::like([].into_iter()).pick(7).is_none());
    }
}
