//! Every file under examples/ is parsed here, so examples cannot rot; a file
//! no test knows about fails the build until a check is added for it.

use std::path::{Path, PathBuf};

use tenant_proxy::config::Config;
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
    if name.starts_with("tenant-sync/") {
        // Kubernetes objects: checked by tenant-sync/tests/examples.rs.
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
