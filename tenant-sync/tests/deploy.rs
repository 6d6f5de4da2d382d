//! deploy/kustomize, rendered by `kubectl kustomize` and read back as
//! Kubernetes types: the objects a platform team applies are the ones
//! checked here, overlay by overlay.
//!
//! Needs kubectl. Without it the test says so and passes, unless
//! `REQUIRE_KUBECTL=1` (set by .ci/run) makes a missing kubectl a failure.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Deserialize;
use tenant_proxy::config::{Config, LimitScope, MetricsMode};

const OVERLAYS: &[(&str, MetricsMode)] = &[
    ("loki-prometheus", MetricsMode::Label),
    ("loki-mimir", MetricsMode::Header),
];

/// The paths both binaries serve on their admin listeners.
const ADMIN_PATHS: &[&str] = &["/healthz", "/readyz", "/metrics"];

fn kustomize_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kustomize")
}

/// Runs a renderer; `None` (after saying why) when it is not installed and
/// `require` does not name an environment variable that is set.
fn rendered(program: &str, args: &[&str], require: &str) -> Option<Vec<serde_yaml_ng::Value>> {
    let output = match Command::new(program).args(args).output() {
        Ok(output) => output,
        Err(e) if std::env::var_os(require).is_none() => {
            eprintln!("{program} not available ({e}): not rendered");
            return None;
        }
        Err(e) => panic!("{require} is set but {program} cannot run: {e}"),
    };
    assert!(
        output.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).unwrap();
    Some(
        serde_yaml_ng::Deserializer::from_str(&text)
            .map(|doc| serde_yaml_ng::Value::deserialize(doc).unwrap())
            .filter(|doc| !doc.is_null())
            .collect(),
    )
}

/// The rendered objects of one kind.
fn all<T: serde::de::DeserializeOwned>(objects: &[serde_yaml_ng::Value], kind: &str) -> Vec<T> {
    objects
        .iter()
        .filter(|o| o["kind"].as_str() == Some(kind))
        .map(|o| serde_yaml_ng::from_value(o.clone()).unwrap())
        .collect()
}

fn one<T: serde::de::DeserializeOwned>(objects: &[serde_yaml_ng::Value], kind: &str) -> T {
    let mut found = all::<T>(objects, kind);
    assert_eq!(found.len(), 1, "exactly one {kind}");
    found.remove(0)
}

fn container<'d>(deployment: &'d Deployment, name: &str) -> &'d Container {
    let spec = deployment.spec.as_ref().unwrap();
    let pod = spec.template.spec.as_ref().unwrap();
    pod.containers
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("container {name}"))
}

/// `--flag=value` or `--flag value` from a container's args.
fn flag<'c>(container: &'c Container, name: &str) -> Option<&'c str> {
    let args = container.args.as_deref().unwrap_or_default();
    args.iter().enumerate().find_map(|(i, arg)| {
        let rest = arg.strip_prefix(name)?;
        match rest.strip_prefix('=') {
            Some(value) => Some(value),
            None if rest.is_empty() => args.get(i + 1).map(String::as_str),
            None => None,
        }
    })
}

fn port_number(container: &Container, port: &IntOrString) -> i32 {
    match port {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => {
            container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name))
                .unwrap_or_else(|| panic!("{}: no port named {name}", container.name))
                .container_port
        }
    }
}

/// Liveness and readiness probes hit admin paths on the admin port.
fn assert_probes(container: &Container, admin_port: u16) {
    for (kind, probe) in [
        ("liveness", &container.liveness_probe),
        ("readiness", &container.readiness_probe),
    ] {
        let get = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .unwrap_or_else(|| panic!("{}: no {kind} httpGet probe", container.name));
        let path = get.path.as_deref().unwrap_or("/");
        assert!(
            ADMIN_PATHS.contains(&path),
            "{}: {kind} probe on {path}",
            container.name
        );
        assert_eq!(
            port_number(container, &get.port),
            i32::from(admin_port),
            "{}: {kind} probe port",
            container.name
        );
    }
    assert_eq!(
        container
            .readiness_probe
            .as_ref()
            .unwrap()
            .http_get
            .as_ref()
            .unwrap()
            .path
            .as_deref(),
        Some("/readyz"),
        "{}: readiness must mean a tenants file is loaded",
        container.name
    );
}

/// The proxy's memory limit holds what clients can make it hold at once:
/// anyone, without a credential, a request head of the largest size
/// arriving on every connection (about the head and 16 KiB more each:
/// `loadtest/partial-heads.py` measured 74 KiB at 60 KB) and argon2's
/// working memory (logins with wrong passwords fill it); tenants, the
/// requests in flight and the bodies' bound; and the process itself
/// (docs/operations.md, "Memory at worst").
fn assert_memory_holds_what_clients_can_make_the_proxy_hold(
    overlay: &str,
    proxy: &Container,
    config: &Config,
) {
    let limits = proxy.resources.as_ref().and_then(|r| r.limits.as_ref());
    let memory = limits
        .and_then(|l| l.get("memory"))
        .expect("a memory limit");
    let mebibytes: u64 = (memory.0.strip_suffix("Mi"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{overlay}: memory limit {memory:?} not in Mi"));
    // On every connection, without a credential: a request head arriving,
    // or HTTP/2 streams whose answers the client never reads (about 1.5
    // KiB each, kept open until the connection is closed, with the
    // connection's own 18 KiB), whichever holds more.
    let per_connection = (config.limits.max_header_bytes as u64 + (16 << 10))
        .max((18 << 10) + u64::from(config.limits.max_http2_streams) * 1536);
    // Beside them, requests in flight (up to 200 on one HTTP/2
    // connection, those waiting for a verification among them): each
    // holds its head (twice, as HTTP/2 decodes it), its state, and 64 KiB
    // of body (an HTTP/2 stream's window, or its connection's share read
    // uncounted), or an upstream connection awaiting the answer
    // (docs/benchmarks.md). Unbounded unless the config bounds them.
    let in_flight = config.limits.max_concurrent_requests as u64;
    assert!(in_flight > 0, "{overlay}: requests in flight unbounded");
    // An answer whose client stops reading also waits in its upstream
    // connection's kernel receive buffer, charged to the pod, which the
    // kernel grows to 6 MiB unless the config fixes it. (The kernel's
    // buffers are not in the sum below: operations.md, "Memory at worst".)
    let receive_buffer = config.limits.upstream_receive_buffer_bytes;
    assert!(
        receive_buffer > 0 && receive_buffer <= 256 << 10,
        "{overlay}: upstream receive buffers unbounded or over 256 KiB: {receive_buffer}"
    );
    let per_request = 2 * config.limits.max_header_bytes as u64 + (80 << 10);
    let at_worst = config.limits.max_connections as u64 * per_connection
        + in_flight * per_request
        + config.auth.verification_memory_bytes
        + config.limits.max_large_body_bytes_held
        + (16 << 20);
    assert!(
        at_worst <= mebibytes << 20,
        "{overlay}: {} MiB at worst within a {memory:?} limit",
        at_worst >> 20
    );
}

fn assert_locked_down(container: &Container) {
    let security = container.security_context.as_ref().unwrap();
    assert_eq!(
        security.allow_privilege_escalation,
        Some(false),
        "{}",
        container.name
    );
    assert_eq!(
        security.read_only_root_filesystem,
        Some(true),
        "{}",
        container.name
    );
    let dropped = security.capabilities.as_ref().and_then(|c| c.drop.clone());
    assert_eq!(dropped, Some(vec!["ALL".to_string()]), "{}", container.name);
    let resources = container.resources.as_ref().unwrap();
    assert!(resources
        .requests
        .as_ref()
        .is_some_and(|r| r.contains_key("cpu") && r.contains_key("memory")));
}

/// Where a container mounts `volume`.
fn mount_path<'c>(container: &'c Container, volume: &str) -> &'c str {
    container
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == volume)
        .unwrap_or_else(|| panic!("{} does not mount {volume}", container.name))
        .mount_path
        .as_str()
}

fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// What every rendering must hold, whatever produced it.
fn check_rendered(overlay: &str, mode: MetricsMode, objects: &[serde_yaml_ng::Value]) {
    let kinds: std::collections::BTreeSet<&str> =
        objects.iter().filter_map(|o| o["kind"].as_str()).collect();
    for kind in [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
    ] {
        assert!(kinds.contains(kind), "{overlay}: no {kind}");
    }

    // The proxy's config is a valid config for this overlay's mode.
    let config_map: ConfigMap = one(objects, "ConfigMap");
    let text = &config_map.data.as_ref().unwrap()["config.yaml"];
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.yaml"), text).unwrap();
    let config = Config::load(&dir.path().join("config.yaml"))
        .unwrap_or_else(|e| panic!("{overlay}: config.yaml: {e}"));
    assert_eq!(config.metrics.as_ref().unwrap().mode, mode, "{overlay}");
    assert!(config.logs.is_some(), "{overlay}: Loki upstream");
    assert_eq!(
        config.limits.max_large_body_bytes_held,
        32 << 20,
        "{overlay}: large bodies held, sized for the 768Mi memory limit"
    );

    let deployment: Deployment = one(objects, "Deployment");
    let spec = deployment.spec.as_ref().unwrap();
    let pod = spec.template.spec.as_ref().unwrap();
    let pod_labels = spec
        .template
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .clone()
        .unwrap();
    let pod_security = pod.security_context.as_ref().unwrap();
    assert_eq!(pod_security.run_as_non_root, Some(true));
    assert_eq!(
        pod_security
            .seccomp_profile
            .as_ref()
            .map(|p| p.type_.as_str()),
        Some("RuntimeDefault")
    );

    let proxy = container(&deployment, "tenant-proxy");
    let sync = container(&deployment, "tenant-sync");
    assert_probes(proxy, config.admin_listen.port());
    let sync_admin: std::net::SocketAddr = flag(sync, "--admin-listen").unwrap().parse().unwrap();
    assert_probes(sync, sync_admin.port());
    assert_locked_down(proxy);
    assert_locked_down(sync);
    assert_memory_holds_what_clients_can_make_the_proxy_hold(overlay, proxy, &config);

    // The proxy reads the file tenant-sync writes: same path, same volume.
    let written = Path::new(flag(sync, "--tenants-file").expect("--tenants-file"));
    assert_eq!(config.tenants_file, written, "{overlay}: tenants file path");
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.empty_dir.is_some())
        .expect("an emptyDir for the tenants file");
    let dir_of = written.parent().unwrap().to_str().unwrap();
    assert_eq!(mount_path(sync, &volume.name), dir_of);
    assert_eq!(mount_path(proxy, &volume.name), dir_of);
    // The config volume is the rendered ConfigMap (its hashed name).
    let config_volume = pod
        .volumes
        .iter()
        .flatten()
        .find_map(|v| v.config_map.as_ref());
    assert_eq!(
        config_volume.map(|c| c.name.as_str()),
        config_map.metadata.name.as_deref()
    );

    // Services and the disruption budget select these pods.
    for service in all::<Service>(objects, "Service") {
        let selector = service.spec.unwrap().selector.unwrap_or_default();
        assert!(
            selects(&selector, &pod_labels),
            "{overlay}: Service selector"
        );
    }
    let pdb: PodDisruptionBudget = one(objects, "PodDisruptionBudget");
    let pdb_selector = pdb
        .spec
        .unwrap()
        .selector
        .unwrap()
        .match_labels
        .unwrap_or_default();
    assert!(
        selects(&pdb_selector, &pod_labels),
        "{overlay}: PDB selector"
    );

    // The pod runs as the ServiceAccount the role is bound to.
    let account: ServiceAccount = one(objects, "ServiceAccount");
    let binding: ClusterRoleBinding = one(objects, "ClusterRoleBinding");
    let subjects = binding.subjects.unwrap();
    assert_eq!(pod.service_account_name, account.metadata.name);
    assert_eq!(subjects[0].name, account.metadata.name.clone().unwrap());
    assert_eq!(subjects[0].namespace, account.metadata.namespace);

    // tenant-sync may list and watch Namespaces and Secrets, and write the
    // Events that say why a Secret was left out; nothing else.
    let role: ClusterRole = one(objects, "ClusterRole");
    assert_eq!(binding.role_ref.name, role.metadata.name.unwrap());
    let rules = role.rules.unwrap();
    assert_eq!(rules.len(), 2);
    assert_eq!(rules[0].verbs, ["list", "watch"]);
    assert_eq!(
        rules[0].resources.as_deref().unwrap(),
        ["namespaces", "secrets"]
    );
    assert_eq!(rules[1].api_groups.as_deref().unwrap(), ["events.k8s.io"]);
    assert_eq!(rules[1].resources.as_deref().unwrap(), ["events"]);
    assert_eq!(rules[1].verbs, ["create", "patch"]);

    // And the proxy's own EndpointSlices, in its namespace only, to count
    // the replicas global limits are divided by.
    let peers: Role = one(objects, "Role");
    let peers_binding: RoleBinding = one(objects, "RoleBinding");
    assert_eq!(
        peers_binding.role_ref.name,
        peers.metadata.name.clone().unwrap()
    );
    let peer_subjects = peers_binding.subjects.unwrap();
    assert_eq!(
        peer_subjects[0].name,
        account.metadata.name.clone().unwrap()
    );
    assert_eq!(peers.metadata.namespace, account.metadata.namespace);
    let peer_rules = peers.rules.unwrap();
    assert_eq!(peer_rules.len(), 1);
    assert_eq!(
        peer_rules[0].api_groups.as_deref().unwrap(),
        ["discovery.k8s.io"]
    );
    assert_eq!(
        peer_rules[0].resources.as_deref().unwrap(),
        ["endpointslices"]
    );
    assert_eq!(peer_rules[0].verbs, ["list", "watch"]);
    let peer_service = flag(sync, "--peer-service");
    let services = all::<Service>(objects, "Service");
    assert!(
        services
            .iter()
            .any(|s| s.metadata.name.as_deref() == peer_service),
        "{overlay}: --peer-service {peer_service:?} names no Service"
    );
    let pod_namespace = sync
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "POD_NAMESPACE")
        .and_then(|e| e.value_from.as_ref()?.field_ref.as_ref())
        .map(|f| f.field_path.as_str());
    assert_eq!(pod_namespace, Some("metadata.namespace"), "{overlay}");
    assert_eq!(config.tenant_limits.scope, LimitScope::Global, "{overlay}");
    for hpa in all::<HorizontalPodAutoscaler>(objects, "HorizontalPodAutoscaler") {
        let target = hpa.spec.unwrap().scale_target_ref;
        assert_eq!(
            Some(target.name),
            deployment.metadata.name.clone(),
            "{overlay}"
        );
        assert_eq!(target.kind, "Deployment");
    }
}

#[test]
fn every_kustomize_overlay_renders_a_complete_locked_down_deployment() {
    for &(overlay, mode) in OVERLAYS {
        let dir = kustomize_dir().join("overlays").join(overlay);
        let args = ["kustomize", dir.to_str().unwrap()];
        let Some(objects) = rendered("kubectl", &args, "REQUIRE_KUBECTL") else {
            return;
        };
        check_rendered(overlay, mode, &objects);
    }
}

fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/helm/tenant-proxy")
}

#[test]
fn the_helm_chart_renders_the_same_deployment_in_both_modes() {
    let chart = chart_dir();
    let modes: &[(&str, MetricsMode, &[&str])] = &[
        ("helm, label mode", MetricsMode::Label, &[]),
        (
            "helm, header mode",
            MetricsMode::Header,
            &[
                "--set=metrics.mode=header",
                "--set=metrics.upstream=http://mimir:8080/prometheus",
                "--set=metrics.pushUpstream=http://mimir:8080",
                "--set=alerts.upstream=http://mimir:8080",
            ],
        ),
    ];
    for &(name, mode, sets) in modes {
        let mut args = vec!["template", "tenant-proxy", chart.to_str().unwrap()];
        args.extend(["--namespace", "observability"]);
        args.extend(sets);
        let Some(objects) = rendered("helm", &args, "REQUIRE_HELM") else {
            return;
        };
        check_rendered(name, mode, &objects);
    }
}

/// Without helm, at least: every `.Values.x.y` a template uses is defined
/// in values.yaml, and every top-level value is documented in the README.
#[test]
fn the_helm_chart_uses_only_defined_and_documented_values() {
    let chart = chart_dir();
    let values: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(chart.join("values.yaml")).unwrap())
            .unwrap();
    let readme = std::fs::read_to_string(chart.join("README.md")).unwrap();
    let mut used = 0;
    for entry in std::fs::read_dir(chart.join("templates")).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        for (at, _) in text.match_indices(".Values.") {
            let reference: String = text[at + ".Values.".len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '.')
                .collect();
            let mut node = &values;
            for key in reference.split('.').filter(|k| !k.is_empty()) {
                node = node.get(key).unwrap_or_else(|| {
                    panic!(
                        "{}: .Values.{reference} is not in values.yaml",
                        path.display()
                    )
                });
            }
            used += 1;
        }
    }
    assert!(used > 20, "the scan found the templates' values ({used})");
    for key in values.as_mapping().unwrap().keys() {
        let key = key.as_str().unwrap();
        assert!(
            readme.contains(&format!("`{key}")),
            "README does not document {key}"
        );
    }
}
