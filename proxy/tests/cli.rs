//! The `tenant-proxy` binary: helpers, start-up errors, and a real run
//! stopped by SIGTERM.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_tenant-proxy");

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/proxy")
}

fn run(args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .env_remove("TENANT_PROXY_CONFIG")
        .output()
        .unwrap()
}

#[test]
fn hash_password_prints_a_verifiable_argon2id_hash() {
    let mut child = Command::new(BIN)
        .arg("hash-password")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"s3cret\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let hash = String::from_utf8(out.stdout).unwrap();
    assert!(hash.starts_with("$argon2id$v=19$"), "{hash}");
    let verifier = tenant_proxy::password::Verifier::argon2id(hash.trim()).unwrap();
    assert!(
        verifier.verify("s3cret"),
        "the trailing newline is not part of the password"
    );
}

#[test]
fn check_config_summarises_tenants_without_secrets() {
    let config = examples().join("config.yaml");
    let out = run(&["check-config", "--config", config.to_str().unwrap()]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("2 tenant(s)"), "{stdout}");
    assert!(
        stdout.contains("user grafana-a -> tenant team-a scopes [logs:read, metrics:read]"),
        "{stdout}"
    );
    assert!(
        stdout.contains("tenant team-a namespaces [team-a, team-a-staging]"),
        "{stdout}"
    );
    assert!(!stdout.contains("argon2id"), "no hash in the summary");
}

#[test]
fn invalid_config_exits_non_zero_naming_file_line_and_problem() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.yaml");
    std::fs::write(
        &config,
        "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\ntenants_file: t.yaml\nlogz: {}\n",
    )
    .unwrap();
    let out = run(&["--config", config.to_str().unwrap()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("bad.yaml") && stderr.contains("line 4") && stderr.contains("logz"),
        "{stderr}"
    );
}

#[test]
fn invalid_tenants_file_at_start_up_exits_non_zero() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.yaml"), "tenants:\n  - id: \"a|b\"\n").unwrap();
    let config = dir.path().join("c.yaml");
    std::fs::write(&config, "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\ntenants_file: t.yaml\nlogs:\n  upstream: http://127.0.0.1:1\n").unwrap();
    let out = run(&["--config", config.to_str().unwrap()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("t.yaml") && stderr.contains("line 2"),
        "{stderr}"
    );
}

#[test]
fn missing_config_flag_is_a_clear_error() {
    let out = run(&[]);
    assert!(!out.status.success());
    assert!(String::from_utf8(out.stderr).unwrap().contains("--config"));
}

#[test]
fn runs_until_sigterm_then_exits_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        examples().join("tenants.yaml"),
        dir.path().join("tenants.yaml"),
    )
    .unwrap();
    let config = dir.path().join("c.yaml");
    std::fs::write(&config, "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\ntenants_file: tenants.yaml\nlogs:\n  upstream: http://127.0.0.1:1\n").unwrap();
    let mut child = Command::new(BIN)
        .args(["--config", config.to_str().unwrap(), "--log-format", "json"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let admin = loop {
        let line = lines
            .next()
            .expect("the proxy logs that it serves")
            .unwrap();
        let entry: serde_json::Value = serde_json::from_str(&line).unwrap();
        if entry["fields"]["message"] == "tenant-proxy serving" {
            break entry["fields"]["admin"].as_str().unwrap().to_owned();
        }
    };
    let mut stream = std::net::TcpStream::connect(&admin).unwrap();
    stream
        .write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut reply = String::new();
    std::io::Read::read_to_string(&mut stream, &mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");

    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = child.wait().unwrap();
    assert!(status.success(), "exit after SIGTERM: {status}");
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(
        rest.iter().any(|l| l.contains("tenant-proxy stopped")),
        "{rest:?}"
    );
}

#[test]
fn rewrite_prints_the_enforced_query_for_a_user_or_tenant() {
    let config = examples().join("config.yaml");
    let config = config.to_str().unwrap();
    let out = run(&[
        "rewrite",
        "--config",
        config,
        "--user",
        "grafana-a",
        "sum(rate(http_requests_total[5m]))",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "sum(rate(http_requests_total{namespace=~\"team-a|team-a-staging\"}[5m]))\n"
    );
    let out = run(&[
        "rewrite",
        "--config",
        config,
        "--tenant",
        "team-b",
        "--selector",
        "{job=\"api\"}",
    ]);
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "{job=\"api\",namespace=\"team-b\"}\n"
    );
    let out = run(&[
        "rewrite",
        "--config",
        config,
        "--tenant",
        "team-b",
        "up{a=\"1\" or b=\"2\"}",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8(out.stderr)
        .unwrap()
        .contains("`or` inside a label selector"));
    let out = run(&["rewrite", "--config", config, "--user", "nobody", "up"]);
    assert!(!out.status.success());
}
