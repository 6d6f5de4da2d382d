//! Parsing and validating the tenants file, the contract between tenant-sync
//! (or an operator) and the proxy. Two formats are read:
//!
//! - the native, versioned format (`tenants:`), with argon2id hashes only;
//! - k8spin's `authn.yaml` (`users: [{username, password, orgid}]`), plaintext,
//!   so users of that proxy can migrate without rewriting their Secret.
//!
//! Everything is checked before a store is built: a file either loads whole
//! or not at all, so the last good generation stays in force.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

use crate::auth::password::Verifier;
use crate::config::TenantLimitsOverride;
use crate::enforce::promql::CredentialSelector;
use crate::tenants::{Credential, Scope, Scopes, Tenant, TenantId, TenantStore};

/// The only version of the native format so far.
pub const CURRENT_VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct TenantsFileError {
    pub path: String,
    pub message: String,
}

/// What a successful parse yields besides the store: facts worth a log line.
#[derive(Debug, Default)]
pub struct LoadNotes {
    /// The file was in k8spin's plaintext format.
    pub plaintext_passwords: bool,
}

// === native format ===

struct NativeFile {
    /// Format version; absent means the current one.
    version: u32,
    tenants: Vec<NativeTenant>,
}

/// `replicas` below 1 (or absent) counts as 1: with the count unknown, each
/// replica enforces the whole limit rather than a share that could leave a
/// tenant with a fraction of what it was given.
fn replicas(declared: Option<u32>) -> u32 {
    declared.unwrap_or(1).max(1)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NativeTenant {
    #[serde(deserialize_with = "tenant_id")]
    id: TenantId,
    /// Label values owned for metrics; absent means `[id]`. Present but empty
    /// is an error: an empty set must never read as "no filter".
    namespaces: Option<Vec<String>>,
    #[serde(default)]
    users: Vec<NativeUser>,
    /// Per-tenant limits, the shape of one `tenant_limits.overrides` entry.
    limits: Option<TenantLimitsOverride>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NativeUser {
    username: String,
    password_hash: String,
    /// Absent means `Scope::DEFAULT` (no write power added since).
    scopes: Option<Vec<Scope>>,
    /// What this credential may read within its tenant (`{app="payments"}`);
    /// read scopes only.
    selector: Option<String>,
}

/// The longest username accepted, in bytes: far beyond any in use, and a
/// bound on what one credential adds to the file every replica loads, when
/// the names come from Secrets a tenant writes (tenant-sync).
pub const MAX_USERNAME_BYTES: usize = 256;

/// The longest selector accepted, in bytes (a list of a hundred apps in
/// one regex fits), for the same reason, and because label mode adds it to
/// every selector of every query the credential sends.
pub const MAX_SELECTOR_BYTES: usize = 4096;

/// A username basic auth can carry: not empty, no `:` (RFC 7617 splits
/// there), no control character, at most [`MAX_USERNAME_BYTES`].
/// (tenant-sync applies it to Secrets.)
pub fn valid_username(username: &str) -> Result<(), String> {
    if username.is_empty() || username.contains(':') || username.chars().any(char::is_control) {
        return Err("username must be non-empty, without ':' or control characters".into());
    }
    if username.len() > MAX_USERNAME_BYTES {
        return Err(format!(
            "username is {} bytes long, above the {MAX_USERNAME_BYTES} accepted",
            username.len()
        ));
    }
    Ok(())
}

/// A selector restricts what a credential reads; nothing could hold a push
/// to it, so a credential with one must not push at all. (tenant-sync
/// applies the same rule to Secrets.)
pub fn read_only_selector(text: &str, scopes: Scopes) -> Result<CredentialSelector, String> {
    if text.len() > MAX_SELECTOR_BYTES {
        return Err(format!(
            "the selector is {} bytes long, above the {MAX_SELECTOR_BYTES} accepted",
            text.len()
        ));
    }
    // A push, a rule, a silence or a delete would reach beyond the selector.
    if let Some(write) = scopes.iter().find(|s| !s.is_read()) {
        return Err(format!(
            "a `selector` restricts reading: give this credential read scopes only \
             (`scopes: [logs:read, metrics:read]`), not {write}"
        ));
    }
    CredentialSelector::parse(text)
}

fn tenant_id<'de, D: serde::Deserializer<'de>>(d: D) -> Result<TenantId, D::Error> {
    let raw = String::deserialize(d)?;
    TenantId::parse(&raw).map_err(serde::de::Error::custom)
}

// === k8spin format ===

struct K8spinFile {
    users: Vec<K8spinUser>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct K8spinUser {
    username: String,
    password: String,
    #[serde(deserialize_with = "tenant_id")]
    orgid: TenantId,
}

// === parsing ===

pub fn load(path: &Path, generation: u64) -> Result<(TenantStore, LoadNotes), TenantsFileError> {
    let text = std::fs::read_to_string(path).map_err(|e| TenantsFileError {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    parse(&text, generation).map_err(|message| TenantsFileError {
        path: path.display().to_string(),
        message,
    })
}

/// Parses either format; errors carry the line and column where serde knows them.
pub fn parse(text: &str, generation: u64) -> Result<(TenantStore, LoadNotes), String> {
    // One typed pass decides the format too: a first pass into a generic
    // YAML value doubled the time and memory of loading a large file.
    // JSON (which is YAML too) goes to a JSON parser, several times faster
    // on the large generated files tenant-sync writes.
    let file: TenantsFile = if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|e| e.to_string())?
    } else {
        serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?
    };
    let declared_replicas = file.replicas;
    let (tenants, credentials, is_k8spin) =
        match file {
            TenantsFile {
                users: Some(users),
                version: None,
                tenants: None,
                replicas: None,
            } => {
                let (tenants, credentials) = from_k8spin(K8spinFile { users })?;
                (tenants, credentials, true)
            }
            TenantsFile { users: Some(_), .. } => return Err(
                "`users` (k8spin's format) cannot be mixed with `version`, `tenants` or `replicas`"
                    .into(),
            ),
            // Most likely a file read while a writer that does not rename
            // had emptied it: loading it would log every tenant out.
            TenantsFile { tenants: None, .. } => {
                return Err(
                    "no `tenants` list (an empty or cut-off file?); write `tenants: []` for none"
                        .into(),
                )
            }
            TenantsFile {
                version,
                tenants: Some(tenants),
                ..
            } => {
                let file = NativeFile {
                    version: version.unwrap_or(CURRENT_VERSION),
                    tenants,
                };
                let (tenants, credentials) = from_native(file)?;
                (tenants, credentials, false)
            }
        };
    let notes = LoadNotes {
        plaintext_passwords: is_k8spin,
    };
    let mut store = TenantStore::new(generation, tenants, credentials);
    store.replicas = replicas(declared_replicas);
    Ok((store, notes))
}

/// Both formats' top-level keys; which are present decides the format.
/// One of `tenants` and `users` must be: an empty document is refused.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
struct TenantsFile {
    version: Option<u32>,
    tenants: Option<Vec<NativeTenant>>,
    users: Option<Vec<K8spinUser>>,
    /// Ready proxy replicas (tenant-sync, from EndpointSlices).
    replicas: Option<u32>,
}

fn from_native(file: NativeFile) -> Result<(Vec<Arc<Tenant>>, Vec<Credential>), String> {
    if file.version != CURRENT_VERSION {
        return Err(format!(
            "unsupported tenants file version {} (this proxy reads version {CURRENT_VERSION})",
            file.version
        ));
    }
    let mut checks = UniquenessChecks::default();
    let mut tenants = Vec::new();
    let mut credentials = Vec::new();
    for t in file.tenants {
        let namespaces = match t.namespaces {
            None => vec![t.id.as_str().to_owned()],
            Some(ns) if ns.is_empty() => {
                return Err(format!("tenant {}: `namespaces` must not be empty", t.id))
            }
            Some(mut ns) => {
                // Listed twice, a namespace is still one value to match.
                let mut seen = HashSet::new();
                ns.retain(|namespace| seen.insert(namespace.clone()));
                ns
            }
        };
        checks.tenant(&t.id, &namespaces)?;
        if let Some(limits) = &t.limits {
            limits.validate(&format!("tenant {}: limits", t.id))?;
        }
        let mut tenant = Tenant::new(t.id, namespaces);
        tenant.limits = t.limits;
        let tenant = Arc::new(tenant);
        for u in t.users {
            let context = format!("tenant {}, user {:?}", tenant.id, u.username);
            checks
                .username(&u.username)
                .map_err(|e| format!("{context}: {e}"))?;
            let verifier =
                Verifier::argon2id(&u.password_hash).map_err(|e| format!("{context}: {e}"))?;
            let scopes = match u.scopes {
                None => Scopes::default_set(),
                Some(list) if list.is_empty() => {
                    return Err(format!("{context}: `scopes` must not be empty"))
                }
                Some(list) => list.into_iter().collect(),
            };
            let selector = u
                .selector
                .map(|text| read_only_selector(&text, scopes))
                .transpose()
                .map_err(|e| format!("{context}: {e}"))?;
            credentials.push(
                Credential::new(u.username, verifier, tenant.clone(), scopes)
                    .with_selector(selector),
            );
        }
        tenants.push(tenant);
    }
    Ok((tenants, credentials))
}

fn from_k8spin(file: K8spinFile) -> Result<(Vec<Arc<Tenant>>, Vec<Credential>), String> {
    let mut checks = UniquenessChecks::default();
    let mut tenants: HashMap<TenantId, Arc<Tenant>> = HashMap::new();
    let mut credentials = Vec::new();
    for u in file.users {
        checks
            .username(&u.username)
            .map_err(|e| format!("user {:?}: {e}", u.username))?;
        if u.password.is_empty() {
            return Err(format!("user {:?}: empty password", u.username));
        }
        let tenant = tenants
            .entry(u.orgid.clone())
            .or_insert_with(|| {
                let namespaces = vec![u.orgid.as_str().to_owned()];
                Arc::new(Tenant::new(u.orgid, namespaces))
            })
            .clone();
        let verifier = Verifier::plaintext(&u.password);
        credentials.push(Credential::new(
            u.username,
            verifier,
            tenant,
            Scopes::default_set(),
        ));
    }
    let mut tenants: Vec<_> = tenants.into_values().collect();
    tenants.sort_by(|a, b| a.id.cmp(&b.id));
    Ok((tenants, credentials))
}

/// Rules that span entries: ids, usernames and namespaces are each owned once.
#[derive(Default)]
struct UniquenessChecks {
    tenant_ids: HashSet<TenantId>,
    usernames: HashSet<String>,
    namespace_owner: HashMap<String, TenantId>,
}

impl UniquenessChecks {
    fn tenant(&mut self, id: &TenantId, namespaces: &[String]) -> Result<(), String> {
        if !self.tenant_ids.insert(id.clone()) {
            return Err(format!("tenant {id} is listed twice"));
        }
        for ns in namespaces {
            if ns.is_empty() || ns.chars().any(char::is_control) {
                return Err(format!("tenant {id}: invalid namespace {ns:?}"));
            }
            if let Some(owner) = self.namespace_owner.insert(ns.clone(), id.clone()) {
                if &owner != id {
                    return Err(format!(
                        "namespace {ns:?} is claimed by tenants {owner} and {id}"
                    ));
                }
            }
        }
        Ok(())
    }

    fn username(&mut self, username: &str) -> Result<(), String> {
        valid_username(username)?;
        if !self.usernames.insert(username.to_owned()) {
            return Err("username is used more than once".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::password::hash_password;

    /// Names and selectors have a bound: with tenant-sync, tenants write
    /// them, and every replica loads the file they make.
    #[test]
    fn a_username_or_a_selector_beyond_its_bound_is_refused() {
        assert!(valid_username(&"u".repeat(MAX_USERNAME_BYTES)).is_ok());
        let long = valid_username(&"u".repeat(MAX_USERNAME_BYTES + 1));
        assert!(long.unwrap_err().contains("257 bytes"));
        for bad in ["", "a:b", "a\nb"] {
            assert!(valid_username(bad).is_err(), "{bad:?}");
        }
        let read = Scopes::from_iter([Scope::LogsRead]);
        let values: Vec<String> = (0..1000).map(|i| format!("app{i:04}")).collect();
        let selector = format!("{{app=~\"{}\"}}", values.join("|"));
        assert!(selector.len() > MAX_SELECTOR_BYTES);
        let refused = read_only_selector(&selector, read).unwrap_err();
        assert!(refused.contains("bytes long"), "{refused}");
        let hundred = format!("{{app=~\"{}\"}}", values[..100].join("|"));
        assert!(read_only_selector(&hundred, read).is_ok());
        let at_the_bound = format!("{{app=\"{}\"}}", "a".repeat(MAX_SELECTOR_BYTES - 8));
        assert_eq!(at_the_bound.len(), MAX_SELECTOR_BYTES);
        assert!(read_only_selector(&at_the_bound, read).is_ok());
    }

    fn native(extra_user_fields: &str) -> String {
        let hash = hash_password("pw").unwrap();
        format!(
            "tenants:\n  - id: team-a\n    users:\n      - username: u1\n        password_hash: \"{hash}\"\n{extra_user_fields}"
        )
    }

    #[test]
    fn native_defaults_namespaces_and_scopes() {
        let (store, notes) = parse(&native(""), 7).unwrap();
        assert_eq!(store.generation, 7);
        assert!(!notes.plaintext_passwords);
        let cred = store.credential("u1").unwrap();
        assert_eq!(cred.tenant.id.as_str(), "team-a");
        assert_eq!(cred.tenant.namespaces, vec!["team-a".to_string()]);
        assert_eq!(cred.scopes, Scopes::default_set());
    }

    #[test]
    fn limits_and_replicas_travel_in_the_file() {
        let text = "replicas: 3\ntenants:\n  - id: team-a\n    limits: {push: {bytes_per_second: 1048576}, query: {requests_per_second: 5, concurrency: 2}}\n  - id: team-b\n";
        let (store, _) = parse(text, 1).unwrap();
        assert_eq!(store.replicas, 3);
        let limits = store.tenant("team-a").unwrap().limits.unwrap();
        assert_eq!(limits.push.unwrap().bytes_per_second, 1_048_576);
        assert_eq!(limits.query.unwrap().concurrency, 2);
        assert_eq!(
            store.tenant("team-b").unwrap().limits,
            None,
            "the config's defaults"
        );

        for (replicas, read) in [("", 1), ("replicas: 0\n", 1)] {
            let (store, _) = parse(&format!("{replicas}tenants: []\n"), 1).unwrap();
            assert_eq!(store.replicas, read, "{replicas:?}");
        }
        for bad in [
            "tenants:\n  - id: a\n    limits: {query: {bytes_per_second: 1}}\n",
            "tenants:\n  - id: a\n    limits: {query: {requests_per_second: -1}}\n",
            "tenants:\n  - id: a\n    limits: {query: {rps: 1}}\n",
            "replicas: 2\nusers: []\n",
        ] {
            assert!(parse(bad, 1).is_err(), "{bad}");
        }
    }

    #[test]
    fn native_reads_explicit_scopes() {
        let (store, _) = parse(&native("        scopes: [logs:read]\n"), 1).unwrap();
        let scopes = store.credential("u1").unwrap().scopes;
        assert!(scopes.contains(Scope::LogsRead));
        assert!(!scopes.contains(Scope::LogsWrite));
    }

    #[test]
    fn errors_name_the_line_of_an_invalid_tenant_id() {
        let err = parse("tenants:\n  - id: \"a|b\"\n", 1).unwrap_err();
        assert!(err.contains("line 2"), "{err}");
        assert!(err.contains('|'), "{err}");
    }

    #[test]
    fn a_selector_needs_read_scopes_only_and_a_plain_label_selector() {
        let read = "        scopes: [logs:read, metrics:read]\n";
        let (store, _) = parse(
            &native(&format!("{read}        selector: '{{app=\"pay\"}}'\n")),
            1,
        )
        .unwrap();
        let selector = store.credential("u1").unwrap().selector.as_ref().unwrap();
        assert_eq!(selector.as_str(), r#"{app="pay"}"#);
        assert!(store.credential("u1").is_some());

        let with_write = native("        selector: '{app=\"pay\"}'\n");
        let err = parse(&with_write, 1).unwrap_err();
        assert!(err.contains("read scopes only"), "{err}");
        for bad in [
            "up",
            "{}",
            "{__name__=\"up\"}",
            "{a=\"b\"} offset 5m",
            "rate(x[5m])",
            "{a=\"b\" or c=\"d\"}",
        ] {
            let text = native(&format!("{read}        selector: '{bad}'\n"));
            assert!(parse(&text, 1).is_err(), "{bad} must be refused");
        }
    }

    #[test]
    fn unknown_keys_are_errors() {
        let err = parse(&native("        admin: true\n"), 1).unwrap_err();
        assert!(err.contains("unknown field `admin`"), "{err}");
    }

    #[test]
    fn empty_namespaces_and_scopes_are_errors() {
        assert!(parse("tenants:\n  - id: a\n    namespaces: []\n", 1).is_err());
        assert!(parse(&native("        scopes: []\n"), 1).is_err());
        for bad in [r#""""#, r#""a\nb""#] {
            let text = format!("tenants:\n  - id: a\n    namespaces: [{bad}]\n");
            let err = parse(&text, 1).unwrap_err();
            assert!(err.contains("invalid namespace"), "{bad}: {err}");
        }
    }

    #[test]
    fn duplicates_are_errors() {
        let hash = hash_password("pw").unwrap();
        let dup_user = format!(
            "tenants:\n- id: a\n  users: [{{username: u, password_hash: \"{hash}\"}}]\n- id: b\n  users: [{{username: u, password_hash: \"{hash}\"}}]\n"
        );
        assert!(parse(&dup_user, 1).unwrap_err().contains("more than once"));
        let twice = parse("tenants:\n- id: a\n  namespaces: [x, y, x]\n", 1)
            .unwrap()
            .0;
        let names: Vec<_> = twice.tenant("a").unwrap().namespaces.clone();
        assert_eq!(names, ["x", "y"], "one owner, one value: listed once");
        let dup_ns = "tenants:\n- id: a\n  namespaces: [x]\n- id: b\n  namespaces: [x]\n";
        assert!(parse(dup_ns, 1).unwrap_err().contains("claimed by"));
        assert!(parse("tenants:\n- id: a\n- id: a\n", 1)
            .unwrap_err()
            .contains("twice"));
    }

    #[test]
    fn a_file_without_a_tenants_list_is_refused_and_an_empty_list_is_not() {
        for text in [
            "",
            "\n",
            "# being written\n",
            "version: 1\n",
            "replicas: 2\n",
            "{}",
        ] {
            let error = parse(text, 1).unwrap_err();
            assert!(
                error.contains("write `tenants: []` for none"),
                "{text:?}: {error}"
            );
        }
        for text in ["tenants: []\n", "{\"version\": 1, \"tenants\": []}"] {
            let (store, _) = parse(text, 1).unwrap();
            assert!(store.tenants().is_empty(), "{text:?}");
        }
    }

    #[test]
    fn rejects_non_argon2id_hashes_and_future_versions() {
        let bad = "tenants:\n- id: a\n  users: [{username: u, password_hash: \"{SHA}abc\"}]\n";
        assert!(parse(bad, 1).unwrap_err().contains("user \"u\""));
        assert!(parse("version: 2\ntenants: []\n", 1)
            .unwrap_err()
            .contains("version 2"));
    }

    #[test]
    fn reads_k8spin_authn_format_as_plaintext() {
        let text = "users:\n  - username: a\n    password: pa\n    orgid: team-a\n  - username: b\n    password: pb\n    orgid: team-a\n";
        let (store, notes) = parse(text, 1).unwrap();
        assert!(notes.plaintext_passwords);
        assert_eq!(store.tenants().len(), 1);
        let cred = store.credential("b").unwrap();
        assert!(cred.verifier.verify("pb"));
        assert!(!cred.verifier.verify("pa"));
        assert_eq!(cred.tenant.id.as_str(), "team-a");
    }

    #[test]
    fn k8spin_orgid_is_validated() {
        let text = "users:\n  - username: a\n    password: pa\n    orgid: \"x|y\"\n";
        let err = parse(text, 1).unwrap_err();
        assert!(err.contains("line 2"), "{err}");
    }
}
