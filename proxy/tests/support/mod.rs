//! Shared pieces of the end-to-end tests: a Loki stand-in, a running proxy
//! on ephemeral ports, an HTTP client, captured logs.
#![allow(dead_code)]

pub mod alertmanager;
pub mod certs;
pub mod loki;
pub mod loki_push;
pub mod otlp;
pub mod otlp_metrics;
pub mod prometheus;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tenant_proxy::config::Config;
use tenant_proxy::tenants::reload::{ReloadStatus, Tenants};
use tenant_proxy::Proxy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

// === passwords ===

/// argon2id with tiny parameters: the proxy verifies whatever parameters the
/// PHC string names, and tests should not spend 40 ms per hash.
pub fn cheap_hash(password: &str) -> String {
    use argon2::{Algorithm, Argon2, Params, PasswordHasher, Version};
    let params = Params::new(64, 1, 1, None).unwrap();
    Argon2::new(Algorithm::Argon2id, Version::V0x13, params)
        .hash_password(password.as_bytes())
        .unwrap()
        .to_string()
}

pub fn basic(user: &str, password: &str) -> String {
    let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Basic {token}")
}

/// A tenants file. `users` are (username, password, scopes or None for all).
pub struct TenantSpec<'a> {
    pub id: &'a str,
    pub users: &'a [(&'a str, &'a str, Option<&'a str>)],
}

/// Like `tenants_yaml`, with explicit namespaces per tenant.
pub fn tenants_with_namespaces(tenants: &[(TenantSpec<'_>, &[&str])]) -> String {
    let mut out = String::from("version: 1\ntenants:\n");
    for (t, namespaces) in tenants {
        out.push_str(&tenant_entry(t));
        out.push_str(&format!("    namespaces: [{}]\n", namespaces.join(", ")));
    }
    out
}

fn tenant_entry(t: &TenantSpec<'_>) -> String {
    let mut out = format!("  - id: {}\n", t.id);
    if !t.users.is_empty() {
        out.push_str("    users:\n");
    }
    for (user, password, scopes) in t.users {
        out.push_str(&format!(
            "      - username: {user}\n        password_hash: \"{}\"\n",
            cheap_hash(password)
        ));
        if let Some(scopes) = scopes {
            out.push_str(&format!("        scopes: [{scopes}]\n"));
        }
    }
    out
}

pub fn tenants_yaml(tenants: &[TenantSpec<'_>]) -> String {
    let mut out = String::from("version: 1\ntenants:\n");
    for t in tenants {
        out.push_str(&tenant_entry(t));
    }
    out
}

/// Two tenants: alice (team-a, all scopes), bob (team-b, all scopes),
/// reader-a (team-a, logs:read) and pusher-a (team-a, logs:write).
pub fn two_tenants() -> String {
    tenants_yaml(&[
        TenantSpec {
            id: "team-a",
            users: &[
                ("alice", "alice-pw", None),
                ("reader-a", "reader-pw", Some("logs:read")),
                ("pusher-a", "pusher-pw", Some("logs:write")),
            ],
        },
        TenantSpec {
            id: "team-b",
            users: &[("bob", "bob-pw", None)],
        },
    ])
}

/// A `metrics` section for header mode against `upstream` with the tenant
/// in `header` (`THANOS-TENANT`: only what Thanos scopes by it is served).
pub fn header_mode_section(upstream: &str, header: &str) -> String {
    format!("  upstream: {upstream}\n  mode: header\n  header: {header}\n")
}

/// A property test's runner through a running server: `default_cases`, or
/// as many as `PROPTEST_CASES` asks for a longer run; no failure file (the
/// failing case is printed).
pub fn property_runner(default_cases: u32) -> proptest::test_runner::TestRunner {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default_cases);
    proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
        cases,
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    })
}

/// Replaces a file the way tenant-sync and kubelet do: write aside, rename.
pub fn replace_file(path: &Path, content: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, content).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

// === the proxy under test ===

pub struct RunningProxy {
    pub addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub tenants_file: PathBuf,
    pub tenants: Arc<Tenants>,
    /// Certificate reloads, when the config has a `tls` section.
    pub tls_reloads: Option<tokio::sync::watch::Receiver<u64>>,
    reloads: tokio::sync::watch::Receiver<ReloadStatus>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

pub struct ProxyOptions {
    /// Written before start; `None` starts without a tenants file.
    pub tenants: Option<String>,
    pub logs_upstream: Option<String>,
    /// The body of the config's `metrics:` section, if any.
    pub metrics: Option<String>,
    /// Appended to the config's `limits:` section.
    pub limits: &'static str,
    pub auth: &'static str,
    /// Appended to the config as is (top-level sections).
    pub extra: &'static str,
}

impl ProxyOptions {
    pub fn new(logs_upstream: impl Into<String>) -> Self {
        Self {
            tenants: Some(two_tenants()),
            logs_upstream: Some(logs_upstream.into()),
            metrics: None,
            limits: "",
            auth: "",
            extra: "",
        }
    }

    /// Metrics only; `section` is the body of `metrics:`.
    pub fn metrics(tenants: String, section: String) -> Self {
        Self {
            tenants: Some(tenants),
            logs_upstream: None,
            metrics: Some(section),
            limits: "",
            auth: "",
            extra: "",
        }
    }
}

impl RunningProxy {
    pub async fn start(options: ProxyOptions) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let tenants_file = dir.path().join("tenants.yaml");
        if let Some(tenants) = &options.tenants {
            std::fs::write(&tenants_file, tenants).unwrap();
        }
        let mut config_text = String::from(
            "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\ntenants_file: tenants.yaml\n\
             tenants_poll_interval: 200ms\n",
        );
        if let Some(logs) = &options.logs_upstream {
            config_text.push_str(&format!("logs:\n  upstream: {logs}\n"));
        }
        if let Some(metrics) = &options.metrics {
            config_text.push_str(&format!("metrics:\n{metrics}"));
        }
        config_text.push_str(&format!(
            "limits:\n  shutdown_grace: 5s\n{}auth:\n  verification_wait: 5s\n{}{}",
            options.limits, options.auth, options.extra
        ));
        let config_path = dir.path().join("config.yaml");
        std::fs::write(&config_path, config_text).unwrap();
        let config = Config::load(&config_path).unwrap();

        let loopback = "127.0.0.1:0".parse().unwrap();
        let listener = tenant_proxy::http::server::bind(loopback, &config.limits).unwrap();
        let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (addr, admin_addr) = (listener.local_addr().unwrap(), admin.local_addr().unwrap());
        let proxy = Proxy::new(config).unwrap();
        let tenants = proxy.tenants();
        let tls_reloads = proxy.tls_reloads();
        let reloads = tenants.subscribe();
        let (tx, rx) = oneshot::channel();
        let task = tokio::spawn(proxy.serve(listener, admin, async {
            let _ = rx.await;
        }));
        Self {
            addr,
            admin_addr,
            tenants_file,
            tenants,
            tls_reloads,
            reloads,
            shutdown: Some(tx),
            task: Some(task),
            _dir: dir,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin_addr)
    }

    /// Writes a new tenants file and waits until the proxy has tried it.
    pub async fn rewrite_tenants(&mut self, content: &str) -> ReloadStatus {
        let before = self.reloads.borrow_and_update().attempts;
        replace_file(&self.tenants_file, content);
        let status = tokio::time::timeout(
            Duration::from_secs(10),
            self.reloads.wait_for(|s| s.attempts > before),
        )
        .await
        .expect("the proxy noticed the tenants file within 10 s")
        .unwrap()
        .clone();
        status
    }

    /// Stops the proxy and waits for it (and its in-flight requests).
    pub async fn stop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap();
        }
    }

    pub fn trigger_shutdown(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }

    pub async fn join(&mut self) {
        if let Some(task) = self.task.take() {
            task.await.unwrap();
        }
    }

    pub async fn metrics(&self) -> String {
        let r = send(Method::GET, &self.admin_url("/metrics"), None, &[], "").await;
        assert_eq!(r.status, StatusCode::OK);
        r.text()
    }

    /// Waits (at most 10 s each) until the proxy counts one client
    /// connection open, then none: the test's one connection came and was
    /// closed by the proxy.
    pub async fn assert_its_one_connection_closed(&self) {
        for (count, what) in [(1, "the connection counted"), (0, "the connection closed")] {
            let line = format!("tenant_proxy_client_connections {count}");
            eventually(what, Duration::from_secs(10), async || {
                self.metrics().await.lines().any(|l| l == line)
            })
            .await;
        }
    }
}

// === HTTP client ===

pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
}

/// One request on a fresh pooled client; `auth` is a full Authorization value.
pub async fn send(
    method: Method,
    url: &str,
    auth: Option<&str>,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Reply {
    try_send(method, url, auth, headers, body)
        .await
        .expect("proxy answered")
}

/// Like `send`; `None` when nothing answered.
pub async fn try_send(
    method: Method,
    url: &str,
    auth: Option<&str>,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Option<Reply> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut request = Request::builder().method(method).uri(url);
    if let Some(auth) = auth {
        request = request.header(http::header::AUTHORIZATION, auth);
    }
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(Full::new(body.into())).unwrap();
    let response = client.request(request).await.ok()?;
    let (parts, body) = response.into_parts();
    Some(Reply {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.ok()?.to_bytes(),
    })
}

pub async fn get(url: &str, auth: &str) -> Reply {
    send(Method::GET, url, Some(auth), &[], "").await
}

/// Polls (bounded), for what happens in the background and gives no
/// signal: a remote-write agent's sends, a span export's outcome.
pub async fn eventually(
    what: &str,
    timeout: std::time::Duration,
    mut check: impl AsyncFnMut() -> bool,
) {
    let deadline = std::time::Instant::now() + timeout;
    while !check().await {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not within {timeout:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// An upstream answering its first request with 64 MiB, written as fast as
/// the proxy takes them, and the count of the bytes written so far.
pub async fn answering_64_mib() -> (SocketAddr, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let written = Arc::new(AtomicU64::new(0));
    let counted = written.clone();
    tokio::spawn(async move {
        let (mut connection, _) = listener.accept().await.unwrap();
        let (mut head, mut buf) = (Vec::new(), [0; 4096]);
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match connection.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
        let (chunk, chunks) = (vec![b' '; 64 << 10], 1024);
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            chunk.len() * chunks
        );
        if connection.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
        for _ in 0..chunks {
            if connection.write_all(&chunk).await.is_err() {
                return;
            }
            counted.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        }
    });
    (address, written)
}

// === captured logs ===

/// Everything every test in this binary logged, at TRACE level, so a test can
/// prove that no secret ever reaches a log line.
pub fn captured_logs() -> &'static Mutex<Vec<u8>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let writer = CaptureWriter(buffer.clone());
        // The binaries' own subscriber, in the manifests' format (JSON,
        // whose access lines are written by the proxy's own code).
        let subscriber = tenant_proxy::ops::process::subscriber(
            "json",
            tracing_subscriber::EnvFilter::new("trace"),
            false,
            move || writer.clone(),
        )
        .unwrap();
        tracing::subscriber::set_global_default(subscriber).unwrap();
        buffer
    })
}

#[derive(Clone)]
struct CaptureWriter(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for CaptureWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A free port for a process that binds it itself: bound, then released
/// (another process could take it meanwhile; use only where unavoidable).
pub async fn closed_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}

/// An address that refuses connections for as long as the returned socket
/// lives: bound but never listening, so no other test can take the port.
pub fn refused_port() -> (SocketAddr, tokio::net::TcpSocket) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    (socket.local_addr().unwrap(), socket)
}
