//! Every file under examples/ is parsed here, so examples cannot rot; a file
//! no test knows about fails the build until a check is added for it.

use std::path::{Path, PathBuf};

use http::Method;
use tenant_proxy::config::{Config, MetricsConfig};
use tenant_proxy::routes::RouteTable;
use tenant_proxy::tenants::file as tenants_file;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// Checks one example file; `false` when no check knows the file.
fn check(path: &Path) -> bool {
    let name = path
        .strip_prefix(root())
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    if name.starts_with("tenant-sync/")
        || name.starts_with("monitoring/")
        || name == "fluent-bit/sidecar.yaml"
        || name == "prometheus/agent-deployment.yaml"
    {
        // Kubernetes objects, alerts and the dashboard (which name both
        // binaries' metrics): checked by tenant-sync/tests/examples.rs.
        return true;
    }
    match name.as_str() {
        "proxy/config.yaml" => {
            let config = Config::load(path).unwrap();
            assert!(config.logs.is_some() && config.metrics.is_some());
            let (store, _) = tenants_file::load(&config.tenants_file, 1).unwrap();
            assert_eq!(store.tenants().len(), 2);
        }
        "proxy/tenants.yaml" => {
            let (store, notes) = tenants_file::load(path, 1).unwrap();
            assert!(!notes.plaintext_passwords);
            // The passwords the file's comment documents are the real ones.
            for (user, password) in [
                ("grafana-a", "grafana-a-password"),
                ("fluentbit-a", "fluentbit-a-password"),
                ("team-b", "team-b-password"),
            ] {
                assert!(
                    store.credential(user).unwrap().verifier.verify(password),
                    "{user}"
                );
            }
        }
        "proxy/k8spin-authn.yaml" => {
            let (store, notes) = tenants_file::load(path, 1).unwrap();
            assert!(notes.plaintext_passwords);
            assert!(store
                .credential("Grafana")
                .unwrap()
                .verifier
                .verify("example-only-password"));
        }
        "prometheus/remote-write.yml" => promtool_check(path),
        "grafana/datasources.yaml" => {
            let file: serde_yaml_ng::Value = yaml(path);
            let sources = file["datasources"].as_sequence().unwrap();
            for source in sources {
                let (kind, url) = (
                    source["type"].as_str().unwrap(),
                    source["url"].as_str().unwrap(),
                );
                assert_eq!(source["basicAuth"].as_bool(), Some(true));
                let user = source["basicAuthUser"].as_str().unwrap();
                let password = source["secureJsonData"]["basicAuthPassword"]
                    .as_str()
                    .unwrap();
                // What Grafana sends first: Loki's labels, Prometheus' POSTed query.
                let (method, path) = match kind {
                    "loki" => (Method::GET, "/loki/api/v1/labels"),
                    "prometheus" => {
                        assert_eq!(source["jsonData"]["httpMethod"].as_str(), Some("POST"));
                        (Method::POST, "/api/v1/query")
                    }
                    // Grafana's Alertmanager data source ("prometheus"
                    // implementation) checks its health with the status.
                    "alertmanager" => {
                        let implementation = source["jsonData"]["implementation"].as_str();
                        assert_eq!(implementation, Some("prometheus"));
                        (Method::GET, "/api/v2/status")
                    }
                    other => panic!("datasource type {other}"),
                };
                assert_client_reaches(&format!("{url}{path}"), &method, user, password);
            }
            assert_eq!(sources.len(), 3);
        }
        "fluent-bit/fluent-bit.conf" => {
            let text = std::fs::read_to_string(path).unwrap();
            let value = |key: &str| fluent_bit_value(&text, key);
            assert_eq!(
                value("Name").to_lowercase(),
                "tail",
                "the first Name is the input"
            );
            assert!(text.contains("Name         loki"));
            let url = format!("http://{}:{}{}", value("Host"), value("Port"), value("Uri"));
            assert_client_reaches(
                &url,
                &Method::POST,
                value("http_user"),
                value("http_passwd"),
            );
        }
        "otel-collector/config.yaml" => {
            let file: serde_yaml_ng::Value = yaml(path);
            let auth = &file["extensions"]["basicauth/tenant-proxy"]["client_auth"];
            let (user, password) = (
                auth["username"].as_str().unwrap(),
                auth["password"].as_str().unwrap(),
            );
            let exporter = &file["exporters"]["otlphttp/tenant-proxy"];
            assert_eq!(
                exporter["auth"]["authenticator"].as_str(),
                Some("basicauth/tenant-proxy")
            );
            assert_eq!(
                exporter["encoding"].as_str(),
                Some("proto"),
                "label mode refuses JSON metrics"
            );
            for key in ["logs_endpoint", "metrics_endpoint"] {
                assert_client_reaches(
                    exporter[key].as_str().unwrap(),
                    &Method::POST,
                    user,
                    password,
                );
            }
            let pipelines = file["service"]["pipelines"].as_mapping().unwrap();
            assert_eq!(pipelines.len(), 2, "logs and metrics");
        }
        "alloy/otlp.alloy" => {
            let text = std::fs::read_to_string(path).unwrap();
            let value = |key: &str| alloy_value(&text, key);
            assert_eq!(value("encoding"), "proto");
            for key in ["logs_endpoint", "metrics_endpoint"] {
                assert_client_reaches(
                    &value(key),
                    &Method::POST,
                    &value("username"),
                    &value("password"),
                );
            }
        }
        "fluent-bit/opentelemetry.conf" => {
            let text = std::fs::read_to_string(path).unwrap();
            let value = |key: &str| fluent_bit_value(&text, key);
            assert!(text.contains("Name         opentelemetry"));
            for uri in ["Logs_uri", "Metrics_uri"] {
                let url = format!("http://{}:{}{}", value("Host"), value("Port"), value(uri));
                assert_client_reaches(
                    &url,
                    &Method::POST,
                    value("http_user"),
                    value("http_passwd"),
                );
            }
        }
        "promtail/promtail.yaml" => {
            let file: serde_yaml_ng::Value = yaml(path);
            let client = &file["clients"][0];
            assert_client_reaches(
                client["url"].as_str().unwrap(),
                &Method::POST,
                client["basic_auth"]["username"].as_str().unwrap(),
                client["basic_auth"]["password"].as_str().unwrap(),
            );
        }
        "alloy/config.alloy" => {
            // Alloy's syntax has no parser here: read each endpoint block.
            let text = std::fs::read_to_string(path).unwrap();
            let quoted = alloy_value;
            let endpoints: Vec<&str> = text.split("endpoint {").skip(1).collect();
            assert_eq!(endpoints.len(), 2, "loki.write and prometheus.remote_write");
            for block in endpoints {
                let url = quoted(block, "url");
                let (user, password) = (quoted(block, "username"), quoted(block, "password"));
                assert_client_reaches(&url, &Method::POST, &user, &password);
            }
        }
        // Run end to end by .ci/run (`run.sh --check`); here: it is executable
        // and keeps its non-interactive mode.
        "quickstart/run.sh" => {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(path).unwrap().permissions().mode();
            assert!(mode & 0o111 != 0, "run.sh is executable");
            assert!(std::fs::read_to_string(path).unwrap().contains("--check"));
        }
        "quickstart/loki.yaml" => {
            let out = std::process::Command::new("bash")
                .arg(root().join("quickstart/run.sh"))
                .args(["--loki-config", "/tmp/loki-quickstart", "3100", "9095"])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let rendered = String::from_utf8(out.stdout).unwrap();
            assert!(
                !rendered.contains("@LOKI"),
                "every placeholder filled:\n{rendered}"
            );
            loki3::check(&rendered).unwrap_or_else(|e| panic!("quickstart loki.yaml: {e}"));
        }
        _ => return false,
    }
    true
}

/// What this project's Loki configs may say, modelled on Loki 3.x's config
/// structs (`pkg/loki/loki.go`, `pkg/loki/common/common.go`, dskit's server
/// and memberlist configs, read at v3.5): the keys the examples use, each
/// level refusing unknown keys as Loki does (`-config.expand-env` aside).
/// Real Loki cannot be installed here, so this is what stands between a
/// config and a user: it refused the quickstart's config that hung (#14).
// Fields not checked below are still parsed, so a misspelt key is refused.
#[allow(dead_code)]
mod loki3 {
    use serde::Deserialize;

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Config {
        auth_enabled: bool,
        server: Server,
        common: Common,
        #[serde(default)]
        memberlist: Option<Memberlist>,
        schema_config: SchemaConfig,
        #[serde(default)]
        analytics: Option<Analytics>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Server {
        http_listen_address: Option<String>,
        http_listen_port: u16,
        grpc_listen_address: Option<String>,
        grpc_listen_port: u16,
        log_level: Option<String>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Common {
        path_prefix: String,
        replication_factor: u32,
        instance_addr: Option<String>,
        instance_interface_names: Option<Vec<String>>,
        ring: Ring,
        storage: Storage,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Ring {
        instance_addr: Option<String>,
        kvstore: KvStore,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct KvStore {
        store: String,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Storage {
        filesystem: Filesystem,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Filesystem {
        chunks_directory: String,
        rules_directory: String,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Memberlist {
        bind_addr: Vec<String>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct SchemaConfig {
        configs: Vec<PeriodConfig>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct PeriodConfig {
        from: String,
        store: String,
        object_store: String,
        schema: String,
        index: Index,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Index {
        prefix: String,
        period: String,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Analytics {
        reporting_enabled: bool,
    }

    fn loopback(addr: &str) -> bool {
        addr.parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
    }

    /// Parses `yaml` as a single-binary Loki 3.x config and checks what
    /// the project needs of it, beyond the keys being Loki's.
    pub fn check(yaml: &str) -> Result<(), String> {
        let config: Config = serde_yaml_ng::from_str(yaml).map_err(|e| e.to_string())?;
        let Config { server, common, .. } = &config;
        if !config.auth_enabled {
            return Err("auth_enabled must be true: Loki ignores X-Scope-OrgID otherwise".into());
        }
        if server.http_listen_port == 0 || server.grpc_listen_port == 0 {
            return Err("listen ports must be set".into());
        }
        let listens_on_loopback = [&server.http_listen_address, &server.grpc_listen_address]
            .iter()
            .any(|a| a.as_deref().is_some_and(loopback));
        // Only common.instance_addr reaches the query frontend's advertised
        // address (applyInstanceConfigs in pkg/loki/config_wrapper.go);
        // without it the frontend advertises the interface address, the
        // querier cannot answer it there, and every query hangs.
        if listens_on_loopback && !common.instance_addr.as_deref().is_some_and(loopback) {
            return Err(format!(
                "listening on loopback needs common.instance_addr on loopback too \
                 (common.ring.instance_addr = {:?} does not reach the query frontend)",
                common.ring.instance_addr
            ));
        }
        if let Some(memberlist) = &config.memberlist {
            if listens_on_loopback && !memberlist.bind_addr.iter().all(|a| loopback(a)) {
                return Err("memberlist.bind_addr must be loopback like the listeners".into());
            }
        }
        if common.replication_factor != 1 || common.ring.kvstore.store != "inmemory" {
            return Err("a single binary needs replication_factor 1 and an inmemory ring".into());
        }
        if common.path_prefix.is_empty()
            || common.storage.filesystem.chunks_directory.is_empty()
            || common.storage.filesystem.rules_directory.is_empty()
        {
            return Err("path_prefix and filesystem directories must be set".into());
        }
        // Structured metadata (OTLP logs) needs tsdb and schema v13.
        for period in &config.schema_config.configs {
            if (
                period.store.as_str(),
                period.schema.as_str(),
                period.object_store.as_str(),
            ) != ("tsdb", "v13", "filesystem")
                || period.index.period != "24h"
            {
                return Err(format!(
                    "schema period {}/{}/{}: Loki 3.x wants tsdb, v13, 24h",
                    period.store, period.schema, period.index.period
                ));
            }
        }
        Ok(())
    }

    #[test]
    fn the_config_that_hung_is_refused() {
        let hung = include_str!("../../examples/quickstart/loki.yaml")
            .replace("@LOKI_DIR@", "/tmp/l")
            .replace("@LOKI_PORT@", "3100")
            .replace("@LOKI_GRPC_PORT@", "9095")
            .replace(
                "  instance_addr: 127.0.0.1\n  ring:\n",
                "  ring:\n    instance_addr: 127.0.0.1\n",
            );
        assert!(
            hung.contains("    instance_addr: 127.0.0.1"),
            "the #14 shape: {hung}"
        );
        let error = check(&hung).unwrap_err();
        assert!(error.contains("common.instance_addr"), "{error}");
        let typo = hung.replace("auth_enabled", "auth_enable");
        assert!(check(&typo).unwrap_err().contains("unknown field"));
    }
}

/// `Key  value` in a Fluent Bit classic config: the first line with `key`.
fn fluent_bit_value<'t>(text: &'t str, key: &str) -> &'t str {
    text.lines()
        .map(str::trim)
        .find_map(|line| line.strip_prefix(key)?.strip_prefix(char::is_whitespace))
        .map(str::trim)
        .unwrap_or_else(|| panic!("no {key} in the Fluent Bit config"))
}

/// `key = "value"` in Alloy's syntax (no parser here): the first one in `block`.
fn alloy_value(block: &str, key: &str) -> String {
    let line = block
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with(key) && l[key.len()..].trim_start().starts_with('='))
        .unwrap_or_else(|| panic!("no {key} in {block}"));
    line.split('"').nth(1).unwrap().to_owned()
}

fn yaml<T: serde::de::DeserializeOwned>(path: &Path) -> T {
    serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A client configured with `url` and this credential reaches a route of the
/// example proxy (examples/proxy/config.yaml) and is let through: the
/// password verifies against the example tenants file and the credential
/// holds the route's scope.
fn assert_client_reaches(url: &str, method: &Method, user: &str, password: &str) {
    let config = Config::load(&root().join("proxy/config.yaml")).unwrap();
    let (store, _) = tenants_file::load(&config.tenants_file, 1).unwrap();
    let uri: http::Uri = url.parse().unwrap();
    let authority = uri.authority().unwrap().as_str();
    assert_eq!(
        authority,
        config.listen.to_string(),
        "{url}: the example proxy"
    );
    let routes = RouteTable::new(
        true,
        config.metrics.as_ref().map(MetricsConfig::scoping),
        config.alerts.is_some(),
    );
    let route = routes
        .classify(method, uri.path())
        .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    let credential = store
        .credential(user)
        .unwrap_or_else(|| panic!("no user {user}"));
    assert!(
        credential.verifier.verify(password),
        "{user}: wrong password"
    );
    assert!(
        credential.scopes.contains(route.scope),
        "{user} lacks {:?} for {method} {url}",
        route.scope
    );
}

/// Prometheus' own validator, from the same Debian package the tests use.
fn promtool_check(path: &Path) {
    let out = std::process::Command::new("promtool")
        .args(["check", "config"])
        .arg(path)
        .output()
        .expect("promtool (Debian package `prometheus`; .ci/run installs it)");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn every_example_file_is_checked() {
    let unknown: Vec<_> = files_under(&root())
        .into_iter()
        .filter(|p| !check(p))
        .collect();
    assert!(
        unknown.is_empty(),
        "example files no test checks: {unknown:?}"
    );
}
