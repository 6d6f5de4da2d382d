//! The `tenant-sync` binary against the API server stand-in, configured the
//! way kubectl is: through a kubeconfig file.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};

use serde_json::json;
use support::apiserver::ApiServer;

const BIN: &str = env!("CARGO_BIN_EXE_tenant-sync");

async fn cluster() -> (ApiServer, tempfile::TempDir) {
    let api = ApiServer::start().await;
    api.namespace("team-a", json!({}));
    api.secret(
        "team-a",
        "s",
        &[("username", "alice"), ("password", "pw")],
        json!({}),
    );
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters: [{{name: test, cluster: {{server: 'http://{}'}}}}]\n\
         users: [{{name: test, user: {{}}}}]\ncontexts: [{{name: test, context: {{cluster: test, user: test}}}}]\n\
         current-context: test\n",
        api.addr
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_writes_the_file_and_exits_zero() {
    let (_api, dir) = cluster().await;
    let out = tokio::task::spawn_blocking({
        let dir = dir.path().to_owned();
        move || command(&dir).arg("--once").output().unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (store, _) =
        tenant_proxy::tenants::file::load(&dir.path().join("tenants.yaml"), 1).unwrap();
    assert!(store.credential("alice").unwrap().verifier.verify("pw"));
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("pw\""),
        "no password in logs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_readiness_and_stops_on_sigterm() {
    let (_api, dir) = cluster().await;
    let admin = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut child = command(dir.path())
        .args(["--admin-listen", &admin.to_string(), "--log-format", "json"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let outcome = tokio::task::spawn_blocking(move || {
        let mut lines = BufReader::new(stderr).lines();
        // Ready once the first file is written: wait for that log line.
        for line in lines.by_ref() {
            if line.unwrap().contains("tenants file written") {
                break;
            }
        }
        let mut stream = std::net::TcpStream::connect(admin).unwrap();
        stream
            .write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).unwrap();
        let killed = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        let status = child.wait().unwrap();
        let rest: Vec<String> = lines.map_while(Result::ok).collect();
        (reply, killed.success(), status, rest)
    })
    .await
    .unwrap();
    let (reply, killed, status, rest) = outcome;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(killed && status.success(), "exit after SIGTERM: {status}");
    assert!(
        rest.iter().any(|l| l.contains("tenant-sync stopped")),
        "{rest:?}"
    );
}
