//! The Kubernetes manifests for clients in tenant namespaces
//! (examples/fluent-bit/sidecar.yaml, examples/prometheus/agent-deployment.yaml):
//! real Kubernetes types, a credential Secret tenant-sync accepts, and a
//! client pointed at the proxy's Service from deploy/ with that credential.

use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec, Secret};
use serde::Deserialize;
use tenant_proxy::tenants::Scope;
use tenant_sync::index::{self, Conventions};

/// The proxy's in-cluster address, as deploy/ names its Service.
const PROXY: &str = "tenant-proxy.observability.svc:8080";

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

fn objects(name: &str) -> Vec<serde_yaml_ng::Value> {
    let text = std::fs::read_to_string(examples().join(name)).unwrap();
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| serde_yaml_ng::Value::deserialize(doc).unwrap())
        .collect()
}

fn one<T: serde::de::DeserializeOwned>(objects: &[serde_yaml_ng::Value], kind: &str) -> T {
    let found: Vec<_> = objects.iter().filter(|o| o["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "one {kind}");
    serde_yaml_ng::from_value(found[0].clone()).unwrap()
}

/// The Secret as tenant-sync reads it: a credential of its namespace's
/// tenant with exactly `scopes`. Returns its username.
fn credential_secret(objects: &[serde_yaml_ng::Value], scopes: &[Scope]) -> (Secret, String) {
    let mut secret: Secret = one(objects, "Secret");
    let strings = secret.string_data.take().unwrap();
    secret.data = Some(
        strings
            .into_iter()
            .map(|(k, v)| (k, k8s_openapi::ByteString(v.into_bytes())))
            .collect(),
    );
    let conventions = Conventions {
        tenant_label: None,
        scopes_annotation: "tenant-proxy/scopes".into(),
        usernames_name_their_tenant: false,
        default_grantable: None,
        max_credentials_per_tenant: None,
    };
    let read = index::read_secret(&secret, &conventions);
    let credential = read.credential.expect("tenant-sync accepts the Secret");
    assert_eq!(credential.scopes.unwrap(), scopes);
    (secret, credential.username)
}

fn pod(deployment: &Deployment) -> &PodSpec {
    deployment
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
}

fn container<'p>(pod: &'p PodSpec, name: &str) -> &'p Container {
    pod.containers.iter().find(|c| c.name == name).unwrap()
}

#[test]
fn fluent_bit_sidecar_pushes_with_the_secret_tenant_sync_reads() {
    let objects = objects("fluent-bit/sidecar.yaml");
    let (secret, _) = credential_secret(&objects, &[Scope::LogsWrite]);
    let config: ConfigMap = one(&objects, "ConfigMap");
    let conf = &config.data.unwrap()["fluent-bit.conf"];
    let setting = |key: &str| {
        conf.lines()
            .map(str::trim)
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(char::is_whitespace))
            .map(str::trim)
            .unwrap_or_else(|| panic!("no {key}"))
    };
    assert_eq!(format!("{}:{}", setting("Host"), setting("Port")), PROXY);
    assert_eq!(setting("Uri"), "/loki/api/v1/push");

    // The credential reaches Fluent Bit through environment variables
    // taken from that very Secret.
    let deployment: Deployment = one(&objects, "Deployment");
    let fluent_bit = container(pod(&deployment), "fluent-bit");
    for (key, variable) in [
        ("username", setting("http_user")),
        ("password", setting("http_passwd")),
    ] {
        let name = variable.trim_start_matches("${").trim_end_matches('}');
        let env = fluent_bit
            .env
            .iter()
            .flatten()
            .find(|e| e.name == name)
            .unwrap();
        let from = env
            .value_from
            .as_ref()
            .unwrap()
            .secret_key_ref
            .as_ref()
            .unwrap();
        assert_eq!(
            (from.name.as_str(), from.key.as_str()),
            (secret.metadata.name.as_deref().unwrap(), key)
        );
    }
}

#[test]
fn prometheus_agent_pushes_with_the_secret_tenant_sync_reads() {
    let objects = objects("prometheus/agent-deployment.yaml");
    let (secret, username) = credential_secret(&objects, &[Scope::MetricsWrite]);
    let config: ConfigMap = one(&objects, "ConfigMap");
    let prometheus: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&config.data.unwrap()["prometheus.yml"]).unwrap();
    let remote = &prometheus["remote_write"][0];
    assert_eq!(
        remote["url"].as_str(),
        Some(format!("http://{PROXY}/api/v1/write").as_str())
    );
    assert_eq!(
        remote["basic_auth"]["username"].as_str(),
        Some(username.as_str())
    );
    assert_eq!(
        remote["queue_config"]["retry_on_http_429"].as_bool(),
        Some(true)
    );

    // password_file is the Secret's `password` key, mounted.
    let password_file = Path::new(remote["basic_auth"]["password_file"].as_str().unwrap());
    let deployment: Deployment = one(&objects, "Deployment");
    let pod = pod(&deployment);
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| {
            v.secret.as_ref().and_then(|s| s.secret_name.as_deref())
                == secret.metadata.name.as_deref()
        })
        .expect("the Secret is mounted");
    let mount = container(pod, "prometheus")
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == volume.name)
        .unwrap();
    assert_eq!(password_file, Path::new(&mount.mount_path).join("password"));
    let args = container(pod, "prometheus").args.clone().unwrap();
    assert!(args.contains(&"--enable-feature=agent".to_string()));
}
