//! Every file under examples/ is parsed here, so examples cannot rot; a file
//! no test knows about fails the build until a check is added for it.

use std::path::{Path, PathBuf};

use http::Method;
use tenant_proxy::config::Config;
use tenant_proxy::routes::RouteTable;
use tenant_proxy::tenants_file;

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
                    other => panic!("datasource type {other}"),
                };
                assert_client_reaches(&format!("{url}{path}"), &method, user, password);
            }
            assert_eq!(sources.len(), 2);
        }
        "fluent-bit/fluent-bit.conf" => {
            let text = std::fs::read_to_string(path).unwrap();
            let value = |key: &str| {
                text.lines()
                    .map(str::trim)
                    .find_map(|line| line.strip_prefix(key)?.strip_prefix(char::is_whitespace))
                    .map(str::trim)
                    .unwrap_or_else(|| panic!("fluent-bit.conf has no {key}"))
            };
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
            let quoted = |block: &str, key: &str| -> String {
                let line = block
                    .lines()
                    .map(str::trim)
                    .find(|l| l.starts_with(key) && l[key.len()..].trim_start().starts_with('='))
                    .unwrap_or_else(|| panic!("no {key} in {block}"));
                line.split('"').nth(1).unwrap().to_owned()
            };
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
        _ => return false,
    }
    true
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
    let routes = RouteTable::new(true, config.metrics.as_ref().map(|m| m.mode));
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
