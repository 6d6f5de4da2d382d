//! Tenants and credentials as the hot path sees them: validated, immutable,
//! indexed by username. One `TenantStore` is one generation of the tenants
//! file; reloads replace it whole (see `reload.rs`).

pub mod file;
pub mod reload;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, OnceLock};

use http::HeaderValue;

use crate::auth::decoys::Decoys;
use crate::auth::password::Verifier;
use crate::config::TenantLimitsOverride;
use crate::enforce::promql::{CredentialSelector, TenantMatcher};
use crate::ops::metrics::TenantRequestCounters;

// === impl TenantId ===

/// A tenant id as Loki, Mimir and Cortex accept it in `X-Scope-OrgID`
/// (dskit's tenant rules): 1-150 bytes of `[A-Za-z0-9!-_.*'()]`, not `.` or
/// `..`. Excluding `|` and `:` matters most: `a|b` is a cross-tenant query and
/// `a:x` carries tenant metadata.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantId(String);

pub const MAX_TENANT_ID_LEN: usize = 150;

impl TenantId {
    pub fn parse(value: &str) -> Result<Self, String> {
        if value.is_empty() {
            return Err("tenant id must not be empty".into());
        }
        if value.len() > MAX_TENANT_ID_LEN {
            return Err(format!("tenant id longer than {MAX_TENANT_ID_LEN} bytes"));
        }
        if value == "." || value == ".." {
            return Err("tenant id must not be '.' or '..'".into());
        }
        if let Some(bad) = value.chars().find(|c| !is_tenant_id_char(*c)) {
            return Err(format!(
                "tenant id {value:?} contains {bad:?}; allowed are letters, digits and !-_.*'()"
            ));
        }
        Ok(Self(value.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn header_value(&self) -> HeaderValue {
        HeaderValue::from_str(&self.0).expect("a tenant id's characters are all valid in a header")
    }
}

fn is_tenant_id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '!' | '-' | '_' | '.' | '*' | '\'' | '(' | ')')
}

impl TryFrom<String> for TenantId {
    type Error = String;
    fn try_from(value: String) -> Result<Self, String> {
        Self::parse(&value)
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TenantId({})", self.0)
    }
}

// === impl Scope ===

/// What a credential may do. Routes name the one scope they need.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Deserialize, serde::Serialize)]
pub enum Scope {
    #[serde(rename = "logs:read")]
    LogsRead,
    #[serde(rename = "logs:write")]
    LogsWrite,
    #[serde(rename = "metrics:read")]
    MetricsRead,
    #[serde(rename = "metrics:write")]
    MetricsWrite,
    /// Reading recording and alerting rules (ruler APIs).
    #[serde(rename = "rules:read")]
    RulesRead,
    /// Creating, changing and deleting rule groups.
    #[serde(rename = "rules:write")]
    RulesWrite,
    /// Reading alerts, alert groups, silences (Alertmanager).
    #[serde(rename = "alerts:read")]
    AlertsRead,
    /// Creating, updating and expiring silences.
    #[serde(rename = "alerts:write")]
    AlertsWrite,
    /// Requesting the deletion of the tenant's log lines (Loki).
    #[serde(rename = "logs:delete")]
    LogsDelete,
}

impl Scope {
    pub const ALL: [Scope; 9] = [
        Scope::LogsRead,
        Scope::LogsWrite,
        Scope::MetricsRead,
        Scope::MetricsWrite,
        Scope::RulesRead,
        Scope::RulesWrite,
        Scope::AlertsRead,
        Scope::AlertsWrite,
        Scope::LogsDelete,
    ];

    /// What a credential without a `scopes` list holds: the four it always
    /// held, and reading rules and alerts. New write powers are never
    /// granted by default: `rules:write`, `alerts:write` and `logs:delete`
    /// must be listed.
    pub const DEFAULT: [Scope; 6] = [
        Scope::LogsRead,
        Scope::LogsWrite,
        Scope::MetricsRead,
        Scope::MetricsWrite,
        Scope::RulesRead,
        Scope::AlertsRead,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::LogsRead => "logs:read",
            Scope::LogsWrite => "logs:write",
            Scope::MetricsRead => "metrics:read",
            Scope::MetricsWrite => "metrics:write",
            Scope::RulesRead => "rules:read",
            Scope::RulesWrite => "rules:write",
            Scope::AlertsRead => "alerts:read",
            Scope::AlertsWrite => "alerts:write",
            Scope::LogsDelete => "logs:delete",
        }
    }

    /// Only reads: what a selector-restricted credential may hold. Every
    /// route under such a scope changes nothing upstream, whatever its
    /// method, so a request there is as safe to send twice as a `GET`
    /// (RFC 9110 §9.2.2 judges by the method alone, but a query posted as a
    /// form, as Grafana sends them, is a read).
    pub fn is_read(self) -> bool {
        matches!(
            self,
            Scope::LogsRead | Scope::MetricsRead | Scope::RulesRead | Scope::AlertsRead
        )
    }

    /// Rules and alerting: per tenant, never narrowed by a selector.
    pub fn is_tenant_wide(self) -> bool {
        matches!(
            self,
            Scope::RulesRead
                | Scope::RulesWrite
                | Scope::AlertsRead
                | Scope::AlertsWrite
                | Scope::LogsDelete
        )
    }

    fn bit(self) -> u16 {
        1 << (self as u16)
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A set of scopes as a bit set: the hot path checks one bit.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct Scopes(u16);

impl Scopes {
    /// [`Scope::DEFAULT`]: what a credential without a `scopes` list holds.
    pub fn default_set() -> Self {
        Scope::DEFAULT.into_iter().collect()
    }

    pub fn contains(self, scope: Scope) -> bool {
        self.0 & scope.bit() != 0
    }

    pub fn iter(self) -> impl Iterator<Item = Scope> {
        Scope::ALL.into_iter().filter(move |s| self.contains(*s))
    }
}

impl FromIterator<Scope> for Scopes {
    fn from_iter<I: IntoIterator<Item = Scope>>(iter: I) -> Self {
        Scopes(iter.into_iter().fold(0, |bits, s| bits | s.bit()))
    }
}

impl fmt::Debug for Scopes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

// === impl Tenant, Credential ===

#[derive(Debug)]
pub struct Tenant {
    pub id: TenantId,
    /// Values of the metrics tenant label this tenant owns; never empty.
    pub namespaces: Vec<String>,
    /// Limits the tenants file sets (tenant-sync, from Namespace
    /// annotations); the config's `tenant_limits` decide how they combine.
    pub limits: Option<TenantLimitsOverride>,
    /// Built on first use: a multi-value matcher compiles a regex (~100 µs),
    /// which must not happen per request.
    metrics_matcher: OnceLock<TenantMatcher>,
    /// `id` as the tenant header's value, built on first use: once per
    /// tenant that sends requests, not once per request.
    header_value: OnceLock<HeaderValue>,
    /// This tenant's request counters, once used.
    pub request_counters: TenantRequestCounters,
}

impl Tenant {
    pub fn new(id: TenantId, namespaces: Vec<String>) -> Self {
        Self {
            id,
            namespaces,
            limits: None,
            metrics_matcher: OnceLock::new(),
            header_value: OnceLock::new(),
            request_counters: TenantRequestCounters::default(),
        }
    }

    /// The tenant header's value (`X-Scope-OrgID` and the like).
    pub fn header_value(&self) -> &HeaderValue {
        self.header_value.get_or_init(|| self.id.header_value())
    }

    /// The label-mode matcher for this tenant. `label` is the process-wide
    /// `metrics.label`, the same on every call.
    pub fn metrics_matcher(&self, label: &str) -> Result<&TenantMatcher, String> {
        if let Some(matcher) = self.metrics_matcher.get() {
            return Ok(matcher);
        }
        let matcher = TenantMatcher::new(label, &self.namespaces)?;
        Ok(self.metrics_matcher.get_or_init(|| matcher))
    }
}

/// One username's way in. `Debug` shows no secret (see `Verifier`).
#[derive(Debug)]
pub struct Credential {
    pub username: String,
    pub verifier: Verifier,
    pub tenant: Arc<Tenant>,
    pub scopes: Scopes,
    /// `verifier.fingerprint()`, computed once: the auth cache compares it on
    /// every request to notice a changed password.
    pub fingerprint: [u8; 32],
    /// What this credential may read within its tenant, if restricted.
    pub selector: Option<CredentialSelector>,
    /// The tenant's matcher narrowed by `selector`, built on first use.
    narrowed_matcher: OnceLock<TenantMatcher>,
}

impl Credential {
    pub fn new(username: String, verifier: Verifier, tenant: Arc<Tenant>, scopes: Scopes) -> Self {
        let fingerprint = verifier.fingerprint();
        Self {
            username,
            verifier,
            tenant,
            scopes,
            fingerprint,
            selector: None,
            narrowed_matcher: OnceLock::new(),
        }
    }

    pub fn with_selector(mut self, selector: Option<CredentialSelector>) -> Self {
        self.selector = selector;
        self
    }

    /// The label-mode matcher for what this credential may read: its
    /// tenant's, narrowed by its selector if it has one.
    pub fn metrics_matcher(&self, label: &str) -> Result<&TenantMatcher, String> {
        let tenant = self.tenant.metrics_matcher(label)?;
        match &self.selector {
            None => Ok(tenant),
            Some(selector) => Ok(self
                .narrowed_matcher
                .get_or_init(|| tenant.narrowed(selector))),
        }
    }
}

// === impl TenantStore ===

/// One loaded generation of the tenants file.
#[derive(Debug)]
pub struct TenantStore {
    pub generation: u64,
    tenants: Vec<Arc<Tenant>>,
    credentials: HashMap<String, Arc<Credential>>,
    /// Index of `tenants` by id.
    by_id: HashMap<String, usize>,
    /// Ready proxy replicas as tenant-sync last saw them (`replicas:`);
    /// 1 when the file does not say (see `tenant_limits.scope`).
    pub replicas: u32,
    /// What an unknown username's password is checked against.
    decoys: Decoys,
    /// Every credential's `fingerprint`.
    fingerprints: HashSet<[u8; 32]>,
}

impl TenantStore {
    /// Callers (the tenants file parser) guarantee unique usernames.
    pub fn new(generation: u64, tenants: Vec<Arc<Tenant>>, credentials: Vec<Credential>) -> Self {
        let decoys = Decoys::like(credentials.iter().map(|c| &c.verifier));
        let fingerprints = credentials.iter().map(|c| c.fingerprint).collect();
        let credentials = credentials
            .into_iter()
            .map(|c| (c.username.clone(), Arc::new(c)))
            .collect();
        let by_id = tenants
            .iter()
            .enumerate()
            .map(|(i, t)| (t.id.as_str().to_owned(), i))
            .collect();
        Self {
            generation,
            tenants,
            credentials,
            by_id,
            replicas: 1,
            decoys,
            fingerprints,
        }
    }

    /// A tenant by id.
    pub fn tenant(&self, id: &str) -> Option<&Arc<Tenant>> {
        self.by_id.get(id).map(|&i| &self.tenants[i])
    }

    pub fn credential(&self, username: &str) -> Option<&Arc<Credential>> {
        self.credentials.get(username)
    }

    /// A decoy costing what a credential in this file costs, for an
    /// unknown username whose keyed digest is `pick`; `None` when the file
    /// has no credentials.
    pub fn decoy(&self, pick: u64) -> Option<&Arc<Verifier>> {
        self.decoys.pick(pick)
    }

    /// Whether a credential of this file has the password hash whose
    /// fingerprint this is (`Verifier::fingerprint`).
    pub fn holds_fingerprint(&self, fingerprint: &[u8; 32]) -> bool {
        self.fingerprints.contains(fingerprint)
    }

    pub fn credential_count(&self) -> usize {
        self.credentials.len()
    }

    pub fn tenants(&self) -> &[Arc<Tenant>] {
        &self.tenants
    }

    /// Credentials sorted by username, for summaries.
    pub fn credentials_sorted(&self) -> Vec<&Arc<Credential>> {
        let mut all: Vec<_> = self.credentials.values().collect();
        all.sort_by(|a, b| a.username.cmp(&b.username));
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tenant_id_is_its_own_header_value() {
        let every_allowed: String = (0..=127u8)
            .map(char::from)
            .filter(|c| is_tenant_id_char(*c))
            .collect();
        let tenant = Tenant::new(TenantId::parse(&every_allowed).unwrap(), vec![]);
        assert_eq!(tenant.header_value().as_bytes(), every_allowed.as_bytes());
    }

    #[test]
    fn tenant_id_rejects_multi_tenant_and_metadata_separators() {
        assert!(TenantId::parse("team-a").is_ok());
        assert!(TenantId::parse("a|b").is_err());
        assert!(TenantId::parse("a:b").is_err());
        assert!(TenantId::parse("").is_err());
        assert!(TenantId::parse("..").is_err());
        assert!(TenantId::parse("a b").is_err());
        assert!(TenantId::parse("a\nb").is_err());
        assert!(TenantId::parse(&"x".repeat(150)).is_ok());
        assert!(TenantId::parse(&"x".repeat(151)).is_err());
    }

    /// Errors and logs name a tenant by its id as it is written.
    #[test]
    fn a_tenant_id_prints_as_written() {
        let id = TenantId::parse("team-a").unwrap();
        assert_eq!(id.to_string(), "team-a");
        assert_eq!(format!("{id:?}"), "TenantId(team-a)");
    }

    /// A scope's name (in 403s and `tenant-proxy check-config`) is the one the
    /// tenants file gives it.
    #[test]
    fn a_scope_is_named_as_the_file_writes_it() {
        for scope in Scope::ALL {
            let read: Scope = serde_json::from_value(scope.as_str().into()).unwrap();
            assert_eq!(read, scope);
            assert_eq!(scope.to_string(), scope.as_str());
        }
    }

    /// Which scopes a selector-restricted credential may hold (reads), and
    /// which it never reaches because a selector cannot narrow them.
    #[test]
    fn reads_and_tenant_wide_scopes_are_exactly_these() {
        let of = |test: fn(Scope) -> bool| -> Vec<Scope> {
            Scope::ALL.into_iter().filter(|s| test(*s)).collect()
        };
        use Scope::*;
        assert_eq!(
            of(Scope::is_read),
            [LogsRead, MetricsRead, RulesRead, AlertsRead]
        );
        assert_eq!(
            of(Scope::is_tenant_wide),
            [RulesRead, RulesWrite, AlertsRead, AlertsWrite, LogsDelete]
        );
    }

    /// What the reload log line, the credentials gauge and `check-config`
    /// read.
    #[test]
    fn a_store_counts_its_credentials_and_lists_them_by_username() {
        let tenant = Arc::new(Tenant::new(TenantId::parse("a").unwrap(), vec!["a".into()]));
        let credentials = ["carol", "alice", "bob"].map(|username| {
            let verifier = Verifier::plaintext("pw");
            Credential::new(
                username.into(),
                verifier,
                tenant.clone(),
                Scopes::default_set(),
            )
        });
        let store = TenantStore::new(1, vec![tenant], credentials.into());
        assert_eq!(store.credential_count(), 3);
        let listed: Vec<_> = store
            .credentials_sorted()
            .iter()
            .map(|c| c.username.as_str())
            .collect();
        assert_eq!(listed, ["alice", "bob", "carol"]);
    }

    #[test]
    fn scopes_hold_exactly_what_was_given() {
        let s: Scopes = [Scope::LogsRead, Scope::MetricsRead].into_iter().collect();
        assert!(s.contains(Scope::LogsRead));
        assert!(!s.contains(Scope::LogsWrite));
        assert_eq!(format!("{s:?}"), "[LogsRead, MetricsRead]");
        let twice: Scopes = [Scope::LogsRead, Scope::LogsRead].into_iter().collect();
        assert_eq!(twice.iter().collect::<Vec<_>>(), [Scope::LogsRead]);
        assert_eq!(Scopes::default_set().iter().count(), 6);
        for write in [Scope::RulesWrite, Scope::AlertsWrite, Scope::LogsDelete] {
            assert!(
                !Scopes::default_set().contains(write),
                "{write} is never a default"
            );
        }
    }
}
