//! The one policy for a pushed series' tenant label, shared by remote write
//! and OTLP: what the tenant is, what a series came with, and what happens
//! to it under `metrics.foreign_label`.

use crate::config::ForeignLabelPolicy;

/// The tenant as a pushed series sees it.
#[derive(Debug, Clone, Copy)]
pub struct TenantLabel<'a> {
    pub name: &'a str,
    /// Never empty; the first is used when adding or overwriting.
    pub owned: &'a [String],
    /// The tenant id, for metrics.
    pub owned_by: &'a str,
    pub policy: ForeignLabelPolicy,
}

/// A [`TenantLabel`] of its own, for work that runs away from the request
/// it was borrowed from (on a body worker, `proxy/body_workers.rs`).
#[derive(Debug, Clone)]
pub struct OwnedTenantLabel {
    name: String,
    owned: Vec<String>,
    owned_by: String,
    policy: ForeignLabelPolicy,
}

impl OwnedTenantLabel {
    pub fn of(tenant: &TenantLabel<'_>) -> Self {
        Self {
            name: tenant.name.to_owned(),
            owned: tenant.owned.to_vec(),
            owned_by: tenant.owned_by.to_owned(),
            policy: tenant.policy,
        }
    }

    pub fn view(&self) -> TenantLabel<'_> {
        TenantLabel {
            name: &self.name,
            owned: &self.owned,
            owned_by: &self.owned_by,
            policy: self.policy,
        }
    }
}

impl<'a> TenantLabel<'a> {
    /// The value written when a series has none or a foreign one.
    pub fn default_value(&self) -> &'a [u8] {
        self.owned[0].as_bytes()
    }

    pub fn owns(&self, value: &[u8]) -> bool {
        self.owned.iter().any(|own| own.as_bytes() == value)
    }
}

/// The values of the tenant label a series came with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found<'v> {
    Nothing,
    /// One or more copies, all with this value.
    Same(&'v [u8]),
    /// Copies with different values, or a value that is not a string.
    Mixed,
}

impl<'v> Found<'v> {
    pub fn and(self, value: &'v [u8]) -> Self {
        match self {
            Found::Nothing => Found::Same(value),
            Found::Same(first) if first == value => self,
            _ => Found::Mixed,
        }
    }
}

/// What happens to the tenant label of one series.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision<'v> {
    Keep(&'v [u8]),
    Add,
    Overwrite,
}

/// A series refused under `foreign_label: reject`; the text names it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0} carries a tenant label value this tenant does not own")]
pub struct ForeignLabel(pub String);

/// Applies the policy; `describe` names the series for the error.
pub fn decide<'v>(
    found: Found<'v>,
    tenant: &TenantLabel<'_>,
    describe: impl FnOnce() -> String,
) -> Result<Decision<'v>, ForeignLabel> {
    match found {
        Found::Nothing => Ok(Decision::Add),
        Found::Same(value) if tenant.owns(value) => Ok(Decision::Keep(value)),
        _ => match tenant.policy {
            ForeignLabelPolicy::Overwrite => Ok(Decision::Overwrite),
            ForeignLabelPolicy::Reject => Err(ForeignLabel(describe())),
        },
    }
}

/// Team-a's `namespace` label over `owned`, as the unit tests of every
/// rewrite that applies the policy to `namespace` use it.
#[cfg(test)]
pub fn team_a(owned: &[String], policy: ForeignLabelPolicy) -> TenantLabel<'_> {
    TenantLabel {
        name: "namespace",
        owned,
        owned_by: "team-a",
        policy,
    }
}
