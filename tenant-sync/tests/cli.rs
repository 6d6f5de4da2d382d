//! The `tenant-sync` binary against the API server stand-in, configured the
//! way kubectl is: through a kubeconfig file.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::json;
use support::apiserver::{ApiServer, Kind};
use tenant_proxy::tenants::TenantStore;

const BIN: &str = env!("CARGO_BIN_EXE_tenant-sync");

async fn cluster() -> (ApiServer, tempfile::TempDir) {
    let api = ApiServer::start().await;
    let server = format!("http://{}", api.addr);
    cluster_at(api, &server, "").await
}

/// `api` with one tenant and one credential, and a kubeconfig naming it as
/// `server`, with `cluster_extra` (such as its CA) in its cluster entry.
async fn cluster_at(
    api: ApiServer,
    server: &str,
    cluster_extra: &str,
) -> (ApiServer, tempfile::TempDir) {
    api.namespace("team-a", json!({}));
    api.secret(
        "team-a",
        "s",
        &[("username", "alice"), ("password", "pw")],
        json!({}),
    );
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters: [{{name: test, cluster: {{server: '{server}'{cluster_extra}}}}}]\n\
         users: [{{name: test, user: {{}}}}]\ncontexts: [{{name: test, context: {{cluster: test, user: test}}}}]\n\
         current-context: test\n"
    );
    std::fs::write(dir.path().join("kubeconfig"), kubeconfig).unwrap();
    (api, dir)
}

fn command(dir: &std::path::Path) -> Command {
    let mut command = Command::new(BIN);
    command
        .env("KUBECONFIG", dir.join("kubeconfig"))
        .env_remove("KUBERNETES_SERVICE_HOST")
        .arg("--tenants-file")
        .arg(dir.join("tenants.yaml"));
    command
}

/// Runs `--once` with `args`: what it wrote to stderr, and the tenants
/// file it left, as the proxy loads it. Fails if it did not exit zero.
async fn run_once(dir: &std::path::Path, args: &[&str]) -> (String, TenantStore) {
    let out = tokio::task::spawn_blocking({
        let dir = dir.to_owned();
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        move || command(&dir).arg("--once").args(args).output().unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    let (store, _) = tenant_proxy::tenants::file::load(&dir.join("tenants.yaml"), 1).unwrap();
    (stderr, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_writes_the_file_and_exits_zero() {
    let (_api, dir) = cluster().await;
    let (stderr, store) = run_once(dir.path(), &[]).await;
    assert!(store.credential("alice").unwrap().verifier.verify("pw"));
    assert!(!stderr.contains("pw\""), "no password in logs");
}

/// A real API server serves only HTTPS: the binary's client reaches one
/// through the kubeconfig's CA, on the crypto provider the build links,
/// and agrees the hybrid post-quantum key exchange, the only one this
/// server accepts (Kubernetes 1.33, built with Go 1.24, prefers it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_reaches_an_https_api_server_with_a_post_quantum_key_exchange() {
    use base64::Engine;
    let (ca, leaf, key) = certificate_for("localhost");
    let provider = rustls::crypto::CryptoProvider {
        kx_groups: vec![rustls::crypto::aws_lc_rs::kx_group::X25519MLKEM768],
        ..rustls::crypto::aws_lc_rs::default_provider()
    };
    let server = rustls::ServerConfig::builder_with_provider(provider.into())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![leaf], key)
        .unwrap();
    let ca = base64::engine::general_purpose::STANDARD.encode(ca);
    let extra = format!(", certificate-authority-data: '{ca}'");
    let api = ApiServer::start_tls(server).await;
    let url = format!("https://localhost:{}", api.addr.port());
    let (_api, dir) = cluster_at(api, &url, &extra).await;
    let (_, store) = run_once(dir.path(), &[]).await;
    assert!(store.credential("alice").unwrap().verifier.verify("pw"));
}

/// A CA's certificate (PEM) and a leaf for `name` it signed, with the
/// leaf's key.
fn certificate_for(
    name: &str,
) -> (
    String,
    rustls::pki_types::CertificateDer<'static>,
    rustls::pki_types::PrivateKeyDer<'static>,
) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec![name.to_owned()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let key = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap();
    (ca.pem(), leaf.der().clone(), key)
}

/// `--usernames-name-their-tenant` reaches the rule: `alice` names no
/// tenant and is left out, `alice@team-a` is in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usernames_that_must_name_their_tenant_are_required_from_the_command_line() {
    let (api, dir) = cluster().await;
    api.secret(
        "team-a",
        "named",
        &[("username", "alice@team-a"), ("password", "pw")],
        json!({}),
    );
    let args = ["--usernames-name-their-tenant", "--no-events"];
    let (stderr, store) = run_once(dir.path(), &args).await;
    assert!(store.credential("alice").is_none());
    assert!(store
        .credential("alice@team-a")
        .unwrap()
        .verifier
        .verify("pw"));
    assert!(stderr.contains("username_not_of_tenant"));
}

/// `--grantable-scopes` reaches the rule: the default set asks for more
/// than `logs:read,logs:write`, so `alice` is left out; a Secret asking
/// for `logs:write` alone is in. A list with an unknown scope refuses to
/// start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grantable_scopes_cap_namespaces_from_the_command_line() {
    let (api, dir) = cluster().await;
    api.secret(
        "team-a",
        "pusher",
        &[("username", "pusher"), ("password", "pw")],
        json!({"tenant-proxy/scopes": "logs:write"}),
    );
    let args = ["--grantable-scopes", "logs:read,logs:write", "--no-events"];
    let (stderr, store) = run_once(dir.path(), &args).await;
    assert!(store.credential("alice").is_none());
    assert!(store.credential("pusher").unwrap().verifier.verify("pw"));
    assert!(stderr.contains("scope_not_grantable"), "{stderr}");

    let typo = ["--once", "--grantable-scopes", "logs:read,logs:wirte"];
    refused_at_start(dir.path(), &typo, "--grantable-scopes", "unknown scope");
}

/// `--max-credentials-per-tenant` reaches the rule: with a cap of 1 the
/// tenant keeps its first Secret's credential (by age, then name) and the
/// next is left out (`too_many_credentials`); by default (1,000) and with
/// `0` (no cap) both are in. A value that is not a count refuses to start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_credentials_a_tenant_may_hold_are_capped_from_the_command_line() {
    let (api, dir) = cluster().await;
    api.secret(
        "team-a",
        "t",
        &[("username", "bob"), ("password", "pw")],
        json!({}),
    );
    let (stderr, store) = run_once(dir.path(), &["--max-credentials-per-tenant", "1"]).await;
    assert!(store.credential("alice").unwrap().verifier.verify("pw"));
    assert!(store.credential("bob").is_none());
    assert!(stderr.contains("too_many_credentials"), "{stderr}");

    for args in [&[][..], &["--max-credentials-per-tenant", "0"]] {
        let (stderr, store) = run_once(dir.path(), args).await;
        assert!(store.credential("alice").is_some(), "{args:?}");
        assert!(store.credential("bob").is_some(), "{args:?}");
        assert!(!stderr.contains("too_many_credentials"), "{stderr}");
    }

    let words = ["--once", "--max-credentials-per-tenant", "many"];
    refused_at_start(
        dir.path(),
        &words,
        "--max-credentials-per-tenant",
        "invalid value",
    );
}

/// A namespace that adds many Secrets tenant-sync must leave out, at once,
/// gets the first 20 named in the log and the rest counted in one line,
/// not a line each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_skipped_secrets_are_named_twenty_at_a_time() {
    let (api, dir) = cluster().await;
    for i in 0..25 {
        let username = format!("user-{i}");
        api.secret(
            "team-a",
            &format!("no-password-{i:02}"),
            &[("username", username.as_str())],
            json!({}),
        );
    }
    let (stderr, store) = run_once(dir.path(), &[]).await;
    assert!(store.credential("alice").is_some());
    assert!(store.credential("user-0").is_none());
    let lines = |text: &str| stderr.lines().filter(|l| l.contains(text)).count();
    assert_eq!(lines("Secret skipped"), 20, "{stderr}");
    assert_eq!(lines("missing_password"), 20, "{stderr}");
    let summary: Vec<_> = stderr
        .lines()
        .filter(|l| l.contains("more Secrets skipped"))
        .collect();
    assert_eq!(summary.len(), 1, "{stderr}");
    assert!(summary[0].contains("more=5"), "{stderr}");
}

/// Starts tenant-sync with `args`, which it must refuse: it exits with an
/// error naming `flag` and saying `why`.
fn refused_at_start(dir: &std::path::Path, args: &[&str], flag: &str, why: &str) {
    let out = command(dir).args(args).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(flag) && stderr.contains(why), "{stderr}");
}

/// The sidecar's log lines, read on a thread of their own so that waiting
/// for one can give up.
fn log_lines(child: &mut std::process::Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// Waits (at most 10 s) for a log line containing `text`.
fn wait_for_log(lines: &mpsc::Receiver<String>, text: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line.contains(text) => return,
            Ok(_) => {}
            Err(e) => panic!("no log line with {text:?}: {e}"),
        }
    }
}

fn signal(child: &std::process::Child, name: &str) {
    let sent = Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
}

const PUBLISHED: &str = "tenant_sync_events_total{outcome=\"published\"} 1";

/// One plain HTTP/1.1 GET to the admin listener: the whole reply.
fn admin_get(admin: std::net::SocketAddr, path: &str) -> String {
    let mut stream = std::net::TcpStream::connect(admin).unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    reply
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_readiness_and_metrics_resyncs_on_sighup_and_stops_on_sigterm() {
    let (api, dir) = cluster().await;
    // Left out of the file: told with an Event, which the binary publishes
    // unless `--no-events`.
    api.secret("team-a", "unfinished", &[("username", "bob")], json!({}));
    api.hold_lists(Kind::Secret);
    let admin = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let file = dir.path().join("tenants.yaml");
    let mut child = command(dir.path())
        .args(["--admin-listen", &admin.to_string(), "--log-format", "json"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The admin listener is bound before the watches start.
    api.wait_for_request("/api/v1/secrets?").await;
    let unready = tokio::task::block_in_place(|| admin_get(admin, "/readyz"));
    assert!(
        unready.starts_with("HTTP/1.1 503") && unready.ends_with("initial sync not complete\n"),
        "{unready}"
    );
    api.release();
    api.wait_for_event_writes(1).await;
    let outcome = tokio::task::spawn_blocking(move || {
        let lines = log_lines(&mut child);
        // Ready once the first file is written: wait for that log line.
        wait_for_log(&lines, "tenants file written");
        let written = std::fs::read_to_string(&file).unwrap();
        // Changed behind its back, the file is put right at SIGHUP, not at
        // the resync five minutes away; the sidecar runs on.
        std::fs::write(&file, "tenants: []\n").unwrap();
        signal(&child, "HUP");
        wait_for_log(&lines, "tenants file written");
        let restored = std::fs::read_to_string(&file).unwrap();
        let ready = admin_get(admin, "/readyz");
        // The Event's count follows the API server's answer, on a task of
        // its own: read until it is there (10 s at most).
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut metrics = admin_get(admin, "/metrics");
        while !metrics.contains(PUBLISHED) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
            metrics = admin_get(admin, "/metrics");
        }
        signal(&child, "TERM");
        let status = child.wait().unwrap();
        let rest: Vec<String> = lines.iter().collect();
        (written == restored, ready, metrics, status, rest)
    })
    .await
    .unwrap();
    let (restored, ready, metrics, status, rest) = outcome;
    assert!(restored, "the file as it was written first");
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    for line in [
        "tenant_sync_writes_total 2",
        "tenant_sync_credentials 1",
        "tenant_sync_skipped_secrets{reason=\"missing_password\"} 1",
        PUBLISHED,
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line}: {metrics}");
    }
    assert!(status.success(), "exit after SIGTERM: {status}");
    assert!(
        rest.iter().any(|l| l.contains("tenant-sync stopped")),
        "{rest:?}"
    );
}

#[test]
fn a_zero_resync_interval_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--resync-interval", "0s"];
    refused_at_start(dir.path(), &args, "--resync-interval", "must be above zero");
}

/// docs/tenant-sync.md's table of flags is the binary's: every flag
/// `--help` lists has a row and every row names a flag it lists, and a
/// flag with a default shows that default in its row.
#[test]
fn the_flags_table_in_the_docs_is_the_binarys() {
    let help = Command::new(BIN).arg("--help").output().unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    // (flag, default) from each option's first line and its description.
    let mut flags: Vec<(String, Option<String>)> = Vec::new();
    for line in help.lines().map(str::trim_start) {
        if let Some(rest) = line.strip_prefix("--") {
            let name = rest.split_whitespace().next().unwrap();
            flags.push((format!("--{name}"), None));
        } else if let Some((_, default)) = line.rsplit_once("[default: ") {
            let default = default.split(']').next().unwrap();
            flags.last_mut().unwrap().1 = Some(default.to_owned());
        }
    }
    flags.retain(|(name, _)| !matches!(name.as_str(), "--help" | "--version"));
    assert!(flags.len() > 10, "{help}");

    let docs = include_str!("../../docs/tenant-sync.md");
    let table = docs
        .split("## Flags")
        .nth(1)
        .unwrap()
        .split("\n## ")
        .next()
        .unwrap();
    let rows: Vec<(&str, &str)> = table
        .lines()
        .filter_map(|row| row.strip_prefix("| `--"))
        .map(|row| {
            let name = row.split([' ', '`']).next().unwrap();
            let default = row.split(" | ").nth(1).unwrap_or_default();
            (name, default)
        })
        .collect();
    for (name, default) in &flags {
        let row = rows.iter().find(|(n, _)| format!("--{n}") == *name);
        let Some((_, documented)) = row else {
            panic!("{name} has no row in docs/tenant-sync.md's flags table");
        };
        if let Some(default) = default {
            assert!(
                documented.contains(&format!("`{default}`")),
                "{name}: the docs give {documented:?}, the binary {default:?}"
            );
        }
    }
    for (name, _) in &rows {
        let name = format!("--{name}");
        assert!(
            flags.iter().any(|(flag, _)| *flag == name),
            "docs/tenant-sync.md documents {name}, which the binary does not have"
        );
    }
}
