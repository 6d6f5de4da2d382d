//! Every file under examples/tenant-sync/ is parsed into real Kubernetes
//! types and read with tenant-sync's own rules.

#[path = "support/files.rs"]
mod files;

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Namespace, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use serde::Deserialize;
use tenant_sync::index::{self, Conventions, Password};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/tenant-sync")
}

fn documents(name: &str) -> Vec<serde_yaml_ng::Value> {
    let text = std::fs::read_to_string(dir().join(name)).unwrap();
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| serde_yaml_ng::Value::deserialize(doc).unwrap())
        .collect()
}

fn typed<T: serde::de::DeserializeOwned>(value: serde_yaml_ng::Value) -> T {
    serde_yaml_ng::from_value(value).unwrap()
}

/// `stringData` as the API server stores it: merged into `data`.
fn secret(value: serde_yaml_ng::Value) -> Secret {
    let mut secret: Secret = typed(value);
    if let Some(strings) = secret.string_data.take() {
        let data = secret.data.get_or_insert_with(Default::default);
        for (k, v) in strings {
            data.insert(k, k8s_openapi::ByteString(v.into_bytes()));
        }
    }
    secret
}

#[test]
fn every_example_file_is_checked() {
    assert_eq!(
        files::names(&dir()),
        [
            "credentials-secret.yaml",
            "rbac.yaml",
            "tenant-namespaces.yaml"
        ]
    );
}

#[test]
fn namespaces_group_into_one_tenant_with_the_documented_label() {
    let conventions = Conventions {
        tenant_label: Some("tenant-proxy/tenant".into()),
        scopes_annotation: "tenant-proxy/scopes".into(),
        usernames_name_their_tenant: false,
        default_grantable: None,
        max_credentials_per_tenant: None,
    };
    for doc in documents("tenant-namespaces.yaml") {
        let ns: Namespace = typed(doc);
        assert_eq!(
            index::tenant_of(&ns, &conventions).unwrap().as_str(),
            "shop"
        );
    }
}

#[test]
fn example_secrets_are_read_as_valid_credentials() {
    let conventions = Conventions {
        tenant_label: None,
        scopes_annotation: "tenant-proxy/scopes".into(),
        usernames_name_their_tenant: false,
        default_grantable: None,
        max_credentials_per_tenant: None,
    };
    let secrets: Vec<Secret> = documents("credentials-secret.yaml")
        .into_iter()
        .map(secret)
        .collect();
    let grafana = index::read_secret(&secrets[0], &conventions)
        .credential
        .unwrap();
    assert_eq!(grafana.username, "shop-grafana");
    assert!(matches!(grafana.password, Password::Plain(_)));
    assert_eq!(grafana.scopes.unwrap().len(), 2);
    let fluent = index::read_secret(&secrets[1], &conventions)
        .credential
        .unwrap();
    assert!(matches!(fluent.password, Password::Hashed(_)));
}

#[test]
fn rbac_grants_reading_namespaces_and_secrets_and_writing_events_only() {
    let docs = documents("rbac.yaml");
    let _: ServiceAccount = typed(docs[0].clone());
    let role: ClusterRole = typed(docs[1].clone());
    let rules = role.rules.unwrap();
    assert_eq!(rules.len(), 2);
    assert_eq!(rules[0].verbs, ["list", "watch"]);
    assert_eq!(
        rules[0].resources.clone().unwrap(),
        ["namespaces", "secrets"]
    );
    assert_eq!(rules[1].api_groups.clone().unwrap(), ["events.k8s.io"]);
    assert_eq!(rules[1].resources.clone().unwrap(), ["events"]);
    assert_eq!(rules[1].verbs, ["create", "patch"]);
    let binding: ClusterRoleBinding = typed(docs[2].clone());
    assert_eq!(binding.role_ref.name, "tenant-sync");
    // EndpointSlices of the proxy's own namespace, for --peer-service.
    let peers: Role = typed(docs[3].clone());
    let rules = peers.rules.unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].resources.clone().unwrap(), ["endpointslices"]);
    assert_eq!(rules[0].verbs, ["list", "watch"]);
    assert_eq!(peers.metadata.namespace.as_deref(), Some("observability"));
    let peers_binding: RoleBinding = typed(docs[4].clone());
    assert_eq!(peers_binding.role_ref.name, "tenant-sync-peers");
}

#[test]
fn the_limits_annotation_example_is_valid() {
    let limits: Vec<_> = documents("tenant-namespaces.yaml")
        .into_iter()
        .filter_map(|doc| index::limits_of(&typed::<Namespace>(doc)).unwrap())
        .collect();
    assert_eq!(limits.len(), 1);
    let query = limits[0].query.unwrap();
    assert_eq!((query.requests_per_second, query.concurrency), (5.0, 2));
}

#[test]
fn the_credential_cap_example_is_valid() {
    let caps: Vec<_> = documents("tenant-namespaces.yaml")
        .into_iter()
        .map(|doc| index::max_credentials_of(&typed::<Namespace>(doc)).unwrap())
        .collect();
    assert_eq!(caps, [Some(50), None]);
}

#[test]
fn the_grantable_scopes_example_caps_staging_to_the_default_set() {
    use tenant_proxy::tenants::Scopes;
    let caps: Vec<_> = documents("tenant-namespaces.yaml")
        .into_iter()
        .map(|doc| {
            let ns: Namespace = typed(doc);
            (
                ns.metadata.name.clone().unwrap(),
                index::grantable_of(&ns).unwrap(),
            )
        })
        .collect();
    assert_eq!(
        caps,
        [
            ("shop-prod".to_owned(), None),
            ("shop-staging".to_owned(), Some(Scopes::default_set()))
        ]
    );
}
