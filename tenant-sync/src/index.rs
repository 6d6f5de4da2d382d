//! The pure, in-memory picture of the cluster that matters to tenant-sync:
//! which tenant each namespace belongs to, and the credentials its Secrets
//! carry. Fed by watch events; knows nothing of HTTP.
//!
//! `Init … InitDone` (a re-list, after a restart or a `410 Gone`) builds a
//! fresh map and swaps it in whole, so objects deleted while the watch was
//! down disappear.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::core::v1::{Namespace, ObjectReference, Secret};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher::Event;
use kube::ResourceExt;
use tenant_proxy::auth::password::Verifier;
use tenant_proxy::config::TenantLimitsOverride;
use tenant_proxy::tenants::{Scope, Scopes, TenantId};

/// How Secrets and Namespaces are read (from the command line).
#[derive(Clone, Debug)]
pub struct Conventions {
    /// With a key, namespaces carrying this label join the tenant named by its
    /// value (namespaces without it are ignored); without, each namespace is
    /// its own tenant.
    pub tenant_label: Option<String>,
    /// Annotation on a Secret listing its scopes, e.g. `logs:write,metrics:write`.
    pub scopes_annotation: String,
    /// Whether a Secret's `username` must end with `@` and its tenant's
    /// id (`grafana@team-a`). Tenant ids hold no `@`, so then no tenant can
    /// take a username that another tenant's Secrets could use (the oldest
    /// Secret keeps a username: without the rule a tenant can claim another
    /// one's name first, or the moment its Secret is deleted and created
    /// again).
    pub usernames_name_their_tenant: bool,
    /// The most a Secret may grant in a Namespace without the
    /// grantable-scopes annotation (`--grantable-scopes`); `None`: no cap.
    /// The annotation, where present, decides instead.
    pub default_grantable: Option<Scopes>,
    /// The most credentials one tenant's Secrets may put in the file
    /// (`--max-credentials-per-tenant`), the oldest Secrets first; `None`:
    /// no cap. Every credential is in every replica's memory and in every
    /// reload, and a plaintext one costs an argon2id hash before the first
    /// file: without a cap, one tenant's flood of Secrets would cost all
    /// tenants.
    pub max_credentials_per_tenant: Option<usize>,
}

pub const SECRET_TYPE: &str = "kubernetes.io/basic-auth";

// === credentials read from Secrets ===

/// The secret half of a credential. `Debug` never prints it.
#[derive(Clone, PartialEq, Eq)]
pub enum Password {
    Plain(String),
    /// A validated argon2id PHC string from the Secret's `password-hash` key.
    Hashed(String),
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Password::Plain(_) => f.write_str("Plain(**REDACTED**)"),
            Password::Hashed(_) => f.write_str("Hashed(**REDACTED**)"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretCredential {
    pub username: String,
    pub password: Password,
    /// `None`: all scopes.
    pub scopes: Option<Vec<Scope>>,
    /// What the credential may read within its tenant (normalised), from
    /// the `tenant-proxy/selector` annotation.
    pub selector: Option<String>,
}

/// The scopes a credential holds: those listed, or the default set.
fn granted(scopes: Option<&[Scope]>) -> Scopes {
    scopes.map_or_else(Scopes::default_set, |s| s.iter().copied().collect())
}

/// The annotation restricting a credential to a selector within its tenant.
pub const SELECTOR_ANNOTATION: &str = "tenant-proxy/selector";

/// The annotation on a Namespace that sets its tenant's limits: a JSON
/// object of the shape of one `tenant_limits.overrides` entry. It is read
/// on Namespaces only: they are the platform's, while tenants write the
/// Secrets in their namespaces.
pub const LIMITS_ANNOTATION: &str = "tenant-proxy/limits";

/// The annotation on a Namespace that caps the scopes its Secrets may
/// grant, e.g. `logs:read,logs:write,metrics:read,metrics:write`. Like the
/// limits, it is read on Namespaces only: whoever may edit Secrets in a
/// namespace otherwise mints any scope for the whole tenant.
pub const GRANTABLE_SCOPES_ANNOTATION: &str = "tenant-proxy/grantable-scopes";

/// The annotation on a Namespace that sets how many credentials its
/// tenant's Secrets may put in the file, in place of
/// `--max-credentials-per-tenant` (`0`: no cap). The platform's, like the
/// limits: a tenant's own Secrets cannot lift the cap that keeps its flood
/// from costing other tenants.
pub const MAX_CREDENTIALS_ANNOTATION: &str = "tenant-proxy/max-credentials";

/// What a Namespace contributes.
#[derive(Debug, Clone, PartialEq)]
pub struct NamespaceEntry {
    pub tenant: Option<TenantId>,
    /// `Err`: the annotation is invalid (why), and left out.
    pub limits: Result<Option<TenantLimitsOverride>, String>,
    /// The most a Secret here may grant; `None`: no cap. `Err`: the
    /// annotation lists no known scope (why), which grants nothing.
    pub grantable: Result<Option<Scopes>, String>,
    /// The tenant's credential cap this Namespace sets (`0`: none); `Err`:
    /// the annotation is not a count (why), and left out.
    pub max_credentials: Result<Option<usize>, String>,
}

/// Reads the limits annotation of a Namespace, checked as the proxy checks
/// its config.
pub fn limits_of(namespace: &Namespace) -> Result<Option<TenantLimitsOverride>, String> {
    let Some(text) = namespace.annotations().get(LIMITS_ANNOTATION) else {
        return Ok(None);
    };
    let limits: TenantLimitsOverride =
        serde_json::from_str(text).map_err(|e| format!("{LIMITS_ANNOTATION}: {e}"))?;
    limits.validate(LIMITS_ANNOTATION)?;
    Ok(Some(limits))
}

/// Reads the max-credentials annotation of a Namespace: a whole number.
/// One that is not is left out, and the tenant keeps the command line's
/// cap: a typo must not lift it.
pub fn max_credentials_of(namespace: &Namespace) -> Result<Option<usize>, String> {
    let Some(text) = namespace.annotations().get(MAX_CREDENTIALS_ANNOTATION) else {
        return Ok(None);
    };
    match text.trim().parse() {
        Ok(count) => Ok(Some(count)),
        Err(_) => Err(format!(
            "{MAX_CREDENTIALS_ANNOTATION}: {text:?} is not a whole number of credentials (0 for no cap); the tenant keeps --max-credentials-per-tenant"
        )),
    }
}

/// The stricter of two credential caps: the smaller, where `0` (no cap)
/// yields to any other.
fn stricter_cap(a: usize, b: usize) -> usize {
    match (a, b) {
        (0, other) | (other, 0) => other,
        (a, b) => a.min(b),
    }
}

/// Reads the grantable-scopes annotation of a Namespace (`None`: it has
/// none, and `--grantable-scopes` caps its Secrets, if given). One that cannot
/// be read is an error, and caps everything: it grants nothing (the
/// platform meant a cap, and a typo must not lift it).
pub fn grantable_of(namespace: &Namespace) -> Result<Option<Scopes>, String> {
    let Some(text) = namespace.annotations().get(GRANTABLE_SCOPES_ANNOTATION) else {
        return Ok(None);
    };
    match parse_scopes(text) {
        Some(scopes) => Ok(Some(scopes.into_iter().collect())),
        None => Err(format!(
            "{GRANTABLE_SCOPES_ANNOTATION}: {text:?} lists no known scope; its Secrets grant nothing"
        )),
    }
}

/// Why a Secret contributes no credential. The label of a metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SkipReason {
    WrongType,
    MissingUsername,
    InvalidUsername,
    MissingPassword,
    /// Not UTF-8: the proxy reads `user:password` as UTF-8, so no client
    /// could ever present it.
    InvalidPassword,
    InvalidPasswordHash,
    InvalidScopes,
    InvalidSelector,
    NamespaceNotATenant,
    /// Asks (by listing, or by default) for a scope its Namespace's
    /// grantable-scopes annotation leaves out.
    ScopeNotGrantable,
    /// With `usernames_name_their_tenant`: the username does not end with
    /// `@` and the Secret's tenant.
    UsernameNotOfTenant,
    DuplicateUsername,
    /// Its tenant already holds as many credentials as its cap allows
    /// (its Namespaces' annotation, or `max_credentials_per_tenant`), from
    /// older Secrets.
    TooManyCredentials,
}

impl SkipReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::WrongType => "wrong_type",
            Self::MissingUsername => "missing_username",
            Self::InvalidUsername => "invalid_username",
            Self::MissingPassword => "missing_password",
            Self::InvalidPassword => "invalid_password",
            Self::InvalidPasswordHash => "invalid_password_hash",
            Self::InvalidScopes => "invalid_scopes",
            Self::InvalidSelector => "invalid_selector",
            Self::NamespaceNotATenant => "namespace_not_a_tenant",
            Self::ScopeNotGrantable => "scope_not_grantable",
            Self::UsernameNotOfTenant => "username_not_of_tenant",
            Self::DuplicateUsername => "duplicate_username",
            Self::TooManyCredentials => "too_many_credentials",
        }
    }
}

/// One Secret as the index keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretEntry {
    /// RFC 3339, for the duplicate-username rule (oldest wins).
    pub created: String,
    /// What an Event about the Secret is attached by.
    pub uid: Option<String>,
    pub credential: Result<SecretCredential, SkipReason>,
}

pub fn read_secret(secret: &Secret, conventions: &Conventions) -> SecretEntry {
    let created = secret
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.to_string())
        .unwrap_or_default();
    SecretEntry {
        created,
        uid: secret.metadata.uid.clone(),
        credential: read_credential(secret, conventions),
    }
}

fn read_credential(
    secret: &Secret,
    conventions: &Conventions,
) -> Result<SecretCredential, SkipReason> {
    if secret.type_.as_deref() != Some(SECRET_TYPE) {
        return Err(SkipReason::WrongType);
    }
    let data = secret.data.clone().unwrap_or_default();
    // None: absent; Some(Err): not UTF-8.
    let text = |key: &str| {
        data.get(key)
            .map(|bytes| String::from_utf8(bytes.0.clone()).ok().ok_or(()))
    };
    let username = match text("username") {
        None => return Err(SkipReason::MissingUsername),
        Some(Err(_)) => return Err(SkipReason::InvalidUsername),
        Some(Ok(u)) => u,
    };
    tenant_proxy::tenants::file::valid_username(&username)
        .map_err(|_| SkipReason::InvalidUsername)?;
    // A pre-hashed password wins: nothing plaintext needs to be kept.
    let password = match (text("password-hash"), text("password")) {
        (Some(Ok(hash)), _) => {
            let hash = hash.trim().to_owned();
            Verifier::argon2id(&hash).map_err(|_| SkipReason::InvalidPasswordHash)?;
            Password::Hashed(hash)
        }
        (Some(Err(_)), _) => return Err(SkipReason::InvalidPasswordHash),
        (None, Some(Ok(plain))) if !plain.is_empty() => Password::Plain(plain),
        (None, Some(Err(_))) => return Err(SkipReason::InvalidPassword),
        (None, _) => return Err(SkipReason::MissingPassword),
    };
    let scopes = match secret.annotations().get(&conventions.scopes_annotation) {
        None => None,
        Some(list) => Some(parse_scopes(list).ok_or(SkipReason::InvalidScopes)?),
    };
    let selector = match secret.annotations().get(SELECTOR_ANNOTATION) {
        None => None,
        Some(text) => {
            let selector =
                tenant_proxy::tenants::file::read_only_selector(text, granted(scopes.as_deref()))
                    .map_err(|_| SkipReason::InvalidSelector)?;
            Some(selector.as_str().to_owned())
        }
    };
    Ok(SecretCredential {
        username,
        password,
        scopes,
        selector,
    })
}

/// Whether `username` is a name followed by `@` and `tenant`.
fn names_tenant(username: &str, tenant: &TenantId) -> bool {
    username
        .rsplit_once('@')
        .is_some_and(|(name, of)| !name.is_empty() && of == tenant.as_str())
}

/// `logs:read, metrics:write` → scopes; `None` for anything unknown or empty.
pub fn parse_scopes(list: &str) -> Option<Vec<Scope>> {
    let mut scopes = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let scope = Scope::ALL.into_iter().find(|s| s.as_str() == item)?;
        if !scopes.contains(&scope) {
            scopes.push(scope);
        }
    }
    (!scopes.is_empty()).then_some(scopes)
}

/// The tenant a namespace belongs to, or `None` when it is not a tenant's.
pub fn tenant_of(namespace: &Namespace, conventions: &Conventions) -> Option<TenantId> {
    let value = match &conventions.tenant_label {
        None => namespace.name_any(),
        Some(key) => namespace.labels().get(key)?.clone(),
    };
    match TenantId::parse(&value) {
        Ok(id) => Some(id),
        Err(e) => {
            tracing::warn!(namespace = %namespace.name_any(), error = %e, "namespace names no valid tenant; ignored");
            None
        }
    }
}

// === the index ===

/// `(namespace, name)` of a Secret.
pub type SecretKey = (String, String);

/// One watched resource's objects, with a re-list in progress if any.
#[derive(Debug)]
struct Store<V> {
    current: BTreeMap<String, V>,
    relist: Option<BTreeMap<String, V>>,
    synced: bool,
}

impl<V> Default for Store<V> {
    fn default() -> Self {
        Self {
            current: BTreeMap::new(),
            relist: None,
            synced: false,
        }
    }
}

impl<V> Store<V> {
    /// Applies one event; `read` turns an object into its key and value.
    fn apply<K>(&mut self, event: Event<K>, read: impl Fn(&K) -> (String, V)) {
        match event {
            Event::Init => self.relist = Some(BTreeMap::new()),
            Event::InitApply(object) => {
                let (key, value) = read(&object);
                self.relist
                    .get_or_insert_with(BTreeMap::new)
                    .insert(key, value);
            }
            Event::InitDone => {
                if let Some(fresh) = self.relist.take() {
                    self.current = fresh;
                }
                self.synced = true;
            }
            Event::Apply(object) => {
                let (key, value) = read(&object);
                self.current.insert(key, value);
            }
            Event::Delete(object) => {
                let (key, _) = read(&object);
                self.current.remove(&key);
            }
        }
    }
}

#[derive(Debug)]
pub struct Index {
    conventions: Conventions,
    namespaces: Store<NamespaceEntry>,
    /// One store per Secret watch: `""` for a cluster-wide watch, else the
    /// namespace watched. Each store is keyed `namespace/name`.
    secrets: BTreeMap<String, Store<(SecretKey, SecretEntry)>>,
    /// The proxy Service's EndpointSlices, by name: the ready endpoints of
    /// each (when `--peer-service` is set).
    peers: Option<Store<BTreeSet<String>>>,
}

/// The ready endpoints of a slice, each named by the pod it is (a pod is
/// in two slices on a dual-stack Service) or else its first address.
/// `ready` absent counts as ready, as the EndpointSlice API says.
fn ready_endpoints(slice: &EndpointSlice) -> BTreeSet<String> {
    slice
        .endpoints
        .iter()
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
        .filter_map(|e| {
            let pod = e
                .target_ref
                .as_ref()
                .and_then(|r| r.name.clone().or(r.uid.clone()));
            pod.or_else(|| e.addresses.first().cloned())
        })
        .collect()
}

/// The tenants file's content, before passwords are hashed.
#[derive(Debug, Default, PartialEq)]
pub struct Desired {
    pub tenants: BTreeMap<TenantId, DesiredTenant>,
    /// Secrets left out, with why.
    pub skipped: Vec<(SecretKey, SkipReason)>,
    /// Namespaces whose limits or max-credentials annotation was left
    /// out, with why (one entry per annotation).
    pub invalid_limits: Vec<(String, String)>,
    /// Namespaces whose grantable-scopes annotation cannot be read, with
    /// why: their Secrets grant nothing.
    pub invalid_caps: Vec<(String, String)>,
    /// Ready proxy replicas, when counted.
    pub replicas: Option<u32>,
}

#[derive(Debug, Default, PartialEq)]
pub struct DesiredTenant {
    pub namespaces: BTreeSet<String>,
    /// The strictest of its namespaces' annotations, if any sets limits.
    pub limits: Option<TenantLimitsOverride>,
    /// Sorted by username.
    pub users: Vec<DesiredUser>,
}

#[derive(Debug, PartialEq, Eq)]
pub struct DesiredUser {
    /// The Secret it came from, for hash reuse.
    pub source: SecretKey,
    pub credential: SecretCredential,
}

impl Index {
    /// `secret_scopes`: the Secret watches that will feed the index (`""`
    /// for one cluster-wide watch); all must finish their initial list.
    pub fn new(conventions: Conventions, secret_scopes: &[String]) -> Self {
        Self {
            conventions,
            namespaces: Store::default(),
            secrets: secret_scopes
                .iter()
                .map(|s| (s.clone(), Store::default()))
                .collect(),
            peers: None,
        }
    }

    /// Also counts the proxy's ready replicas, from its EndpointSlices.
    pub fn counting_peers(mut self) -> Self {
        self.peers = Some(Store::default());
        self
    }

    /// Whether the replica whose pod is `own` publishes what every replica
    /// would (Events): the first of the proxy's ready replicas by pod
    /// name. Any replica does while none is known ready, when the replicas
    /// are not counted, or when `own` is unknown: a notice twice is better
    /// than none.
    pub fn speaks_for_replicas(&self, own: Option<&str>) -> bool {
        let (Some(peers), Some(own)) = (&self.peers, own) else {
            return true;
        };
        let first = peers.current.values().flatten().min();
        first.is_none_or(|first| first == own)
    }

    pub fn peers_event(&mut self, event: Event<EndpointSlice>) {
        if let Some(peers) = &mut self.peers {
            peers.apply(event, |slice| (slice.name_any(), ready_endpoints(slice)));
        }
    }

    pub fn namespace_event(&mut self, event: Event<Namespace>) {
        let conventions = &self.conventions;
        self.namespaces.apply(event, |ns| {
            let entry = NamespaceEntry {
                tenant: tenant_of(ns, conventions),
                limits: limits_of(ns),
                grantable: grantable_of(ns),
                max_credentials: max_credentials_of(ns),
            };
            (ns.name_any(), entry)
        });
    }

    pub fn secret_event(&mut self, scope: &str, event: Event<Secret>) {
        let conventions = &self.conventions;
        let store = self.secrets.entry(scope.to_owned()).or_default();
        store.apply(event, |secret| {
            let key = (secret.namespace().unwrap_or_default(), secret.name_any());
            let joined = format!("{}/{}", key.0, key.1);
            (joined, (key, read_secret(secret, conventions)))
        });
    }

    /// The Secret as an Event's `regarding` names it, if it is known.
    pub fn secret_reference(&self, (namespace, name): &SecretKey) -> Option<ObjectReference> {
        let joined = format!("{namespace}/{name}");
        let (_, entry) = self.secrets.values().find_map(|s| s.current.get(&joined))?;
        Some(ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Secret".into()),
            namespace: Some(namespace.clone()),
            name: Some(name.clone()),
            uid: entry.uid.clone(),
            ..ObjectReference::default()
        })
    }

    /// Both initial lists are complete: rendering now cannot publish a
    /// partial file.
    pub fn is_synced(&self) -> bool {
        self.namespaces.synced
            && self.secrets.values().all(|s| s.synced)
            && self.peers.as_ref().is_none_or(|p| p.synced)
    }

    /// Applies the rules: a Secret speaks only for its own namespace's tenant,
    /// with no scope its Namespace does not let it grant; of several Secrets
    /// with one username the oldest wins (then the first by namespace/name);
    /// a tenant holds at most the credentials its Namespaces' cap or
    /// `max_credentials_per_tenant` allows, its oldest Secrets'; invalid
    /// Secrets are skipped with a reason. A Secret skipped holds no
    /// username.
    pub fn desired(&self) -> Desired {
        let mut desired = Desired::default();
        // Per tenant, the cap its Namespaces set, the strictest of them.
        let mut caps: BTreeMap<&TenantId, usize> = BTreeMap::new();
        for (namespace, entry) in &self.namespaces.current {
            let Some(tenant_id) = &entry.tenant else {
                continue;
            };
            match &entry.max_credentials {
                Ok(None) => {}
                Ok(Some(cap)) => {
                    let set = caps.entry(tenant_id).or_insert(*cap);
                    *set = stricter_cap(*set, *cap);
                }
                Err(why) => desired
                    .invalid_limits
                    .push((namespace.clone(), why.clone())),
            }
            let tenant = desired.tenants.entry(tenant_id.clone()).or_default();
            tenant.namespaces.insert(namespace.clone());
            match &entry.limits {
                Ok(None) => {}
                Ok(Some(limits)) => {
                    tenant.limits = Some(match tenant.limits {
                        Some(other) => other.strictest(*limits),
                        None => *limits,
                    });
                }
                Err(why) => desired
                    .invalid_limits
                    .push((namespace.clone(), why.clone())),
            }
            if let Err(why) = &entry.grantable {
                desired.invalid_caps.push((namespace.clone(), why.clone()));
            }
        }
        let mut secrets: Vec<&(SecretKey, SecretEntry)> = self
            .secrets
            .values()
            .flat_map(|s| s.current.values())
            .collect();
        secrets.sort_by(|a, b| (&a.1.created, &a.0).cmp(&(&b.1.created, &b.0)));
        let mut taken = BTreeSet::new();
        for (key, entry) in secrets {
            let credential = match &entry.credential {
                Ok(credential) => credential,
                Err(reason) => {
                    desired.skipped.push((key.clone(), *reason));
                    continue;
                }
            };
            let Some(NamespaceEntry {
                tenant: Some(tenant),
                grantable,
                ..
            }) = self.namespaces.current.get(&key.0)
            else {
                desired
                    .skipped
                    .push((key.clone(), SkipReason::NamespaceNotATenant));
                continue;
            };
            if self.conventions.usernames_name_their_tenant
                && !names_tenant(&credential.username, tenant)
            {
                desired
                    .skipped
                    .push((key.clone(), SkipReason::UsernameNotOfTenant));
                continue;
            }
            let cap = match grantable {
                Ok(Some(cap)) => Some(*cap),
                Ok(None) => self.conventions.default_grantable,
                // An unreadable cap grants nothing.
                Err(_) => Some(Scopes::default()),
            };
            let granted = granted(credential.scopes.as_deref());
            if cap.is_some_and(|cap| !granted.iter().all(|s| cap.contains(s))) {
                desired
                    .skipped
                    .push((key.clone(), SkipReason::ScopeNotGrantable));
                continue;
            }
            if taken.contains(&credential.username) {
                desired
                    .skipped
                    .push((key.clone(), SkipReason::DuplicateUsername));
                continue;
            }
            let users = &mut desired
                .tenants
                .get_mut(tenant)
                .expect("tenant listed above")
                .users;
            // Oldest first (the order above): a Secret created later never
            // pushes out a credential already in the file.
            let cap = match caps.get(tenant) {
                Some(0) => None,
                Some(&cap) => Some(cap),
                None => self.conventions.max_credentials_per_tenant,
            };
            if cap.is_some_and(|cap| users.len() >= cap) {
                desired
                    .skipped
                    .push((key.clone(), SkipReason::TooManyCredentials));
                continue;
            }
            taken.insert(credential.username.clone());
            users.push(DesiredUser {
                source: key.clone(),
                credential: credential.clone(),
            });
        }
        desired.tenants.retain(|_, t| !t.users.is_empty());
        for tenant in desired.tenants.values_mut() {
            tenant
                .users
                .sort_by(|a, b| a.credential.username.cmp(&b.credential.username));
        }
        desired.skipped.sort();
        desired.replicas = self.peers.as_ref().map(|peers| {
            let ready: BTreeSet<&String> = peers.current.values().flatten().collect();
            u32::try_from(ready.len()).unwrap_or(u32::MAX)
        });
        desired
    }
}

#[cfg(test)]
pub(crate) mod tests;
