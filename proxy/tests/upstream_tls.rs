//! TLS to an `https://` upstream: verified against the configured CA (not
//! the system's roots), with a client certificate when the upstream
//! requires one, and a server name when the URL's host is not in the
//! certificate.

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rustls::crypto::aws_lc_rs::kx_group::X25519MLKEM768;
use support::certs::{provider_with_only, server_config, server_config_with, Ca, Leaf};
use support::{basic, get, ProxyOptions, RunningProxy};

/// An HTTPS upstream that records the tenant header of what it serves.
struct HttpsUpstream {
    addr: SocketAddr,
    org_ids: Arc<Mutex<Vec<String>>>,
}

impl HttpsUpstream {
    async fn start(leaf: &Leaf, client_ca: Option<&Ca>) -> Self {
        Self::serving(server_config(leaf, client_ca)).await
    }

    async fn serving(config: rustls::ServerConfig) -> Self {
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let org_ids = Arc::new(Mutex::new(Vec::new()));
        let seen = org_ids.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, seen) = (acceptor.clone(), seen.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return; // a failed handshake is what some tests expect
                    };
                    let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                        let org = request
                            .headers()
                            .get("x-scope-orgid")
                            .map(|v| v.to_str().unwrap().to_owned())
                            .unwrap_or_default();
                        seen.lock().unwrap().push(org);
                        async {
                            Ok::<_, std::convert::Infallible>(Response::new(Full::new(
                                Bytes::from("{}"),
                            )))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Self { addr, org_ids }
    }

    fn served(&self) -> Vec<String> {
        self.org_ids.lock().unwrap().clone()
    }
}

fn write(dir: &Path, name: &str, content: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, content).unwrap();
    path.display().to_string()
}

async fn proxy(upstream_url: String, tls: String) -> RunningProxy {
    support::captured_logs();
    let options = ProxyOptions::new(format!("{upstream_url}\n  tls:\n{tls}"));
    RunningProxy::start(options).await
}

const LABELS: &str = "/loki/api/v1/labels";

#[tokio::test]
async fn an_https_upstream_is_verified_with_the_configured_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let upstream = HttpsUpstream::start(&ca.issue("localhost"), None).await;
    let url = format!("https://localhost:{}", upstream.addr.port());
    let ca_file = write(dir.path(), "ca.crt", &ca.pem());
    let proxy = proxy(url.clone(), format!("    ca_file: {ca_file}\n")).await;
    let reply = get(&proxy.url(LABELS), &basic("alice", "alice-pw")).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(upstream.served(), ["team-a"]);

    // Another CA's certificate at the same place is refused: 502, nothing served.
    let stranger = HttpsUpstream::start(&Ca::new().issue("localhost"), None).await;
    let url = format!("https://localhost:{}", stranger.addr.port());
    let proxy = self::proxy(url, format!("    ca_file: {ca_file}\n")).await;
    let reply = get(&proxy.url(LABELS), &basic("alice", "alice-pw")).await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY);
    assert!(stranger.served().is_empty());
}

#[tokio::test]
async fn a_client_certificate_and_a_server_name_are_presented_when_configured() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let clients = Ca::new();
    // The certificate names the Service, not the address the proxy dials.
    let upstream =
        HttpsUpstream::start(&ca.issue_name_only("loki.logging.svc"), Some(&clients)).await;
    let url = format!("https://127.0.0.1:{}", upstream.addr.port());
    let ca_file = write(dir.path(), "ca.crt", &ca.pem());
    let client = clients.issue("tenant-proxy");
    let cert_file = write(dir.path(), "client.crt", &client.cert_pem);
    let key_file = write(dir.path(), "client.key", &client.key_pem);

    let with_all = format!(
        "    ca_file: {ca_file}\n    cert_file: {cert_file}\n    key_file: {key_file}\n    server_name: loki.logging.svc\n"
    );
    let proxy = proxy(url.clone(), with_all).await;
    let reply = get(&proxy.url(LABELS), &basic("bob", "bob-pw")).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(upstream.served(), ["team-b"]);

    for missing in [
        format!("    ca_file: {ca_file}\n    server_name: loki.logging.svc\n"),
        format!("    ca_file: {ca_file}\n    cert_file: {cert_file}\n    key_file: {key_file}\n"),
    ] {
        let proxy = self::proxy(url.clone(), missing.clone()).await;
        let reply = get(&proxy.url(LABELS), &basic("bob", "bob-pw")).await;
        assert_eq!(reply.status, StatusCode::BAD_GATEWAY, "{missing}");
    }
    assert_eq!(upstream.served(), ["team-b"], "nothing else got through");
}

/// Rotated upstream TLS files are picked up without a restart: an upstream
/// that refused the proxy's client certificate serves once a trusted one
/// is in its place.
#[tokio::test]
async fn rotated_upstream_tls_files_are_picked_up() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, clients) = (Ca::new(), Ca::new());
    let upstream = HttpsUpstream::start(&ca.issue("localhost"), Some(&clients)).await;
    let url = format!("https://localhost:{}", upstream.addr.port());
    let ca_file = write(dir.path(), "ca.crt", &ca.pem());
    let untrusted = Ca::new().issue("tenant-proxy");
    let cert_file = write(dir.path(), "client.crt", &untrusted.cert_pem);
    let key_file = write(dir.path(), "client.key", &untrusted.key_pem);
    let tls = format!(
        "    ca_file: {ca_file}\n    cert_file: {cert_file}\n    key_file: {key_file}\n    reload_interval: 100ms\n"
    );
    let proxy = proxy(url, tls).await;
    let bob = basic("bob", "bob-pw");
    let refused = get(&proxy.url(LABELS), &bob).await;
    assert_eq!(
        refused.status,
        StatusCode::BAD_GATEWAY,
        "an untrusted client"
    );

    // Written one file after the other: a check between the two sees a
    // pair that does not match, and the next one the whole new pair.
    let trusted = clients.issue("tenant-proxy");
    write(dir.path(), "client.key", &trusted.key_pem);
    write(dir.path(), "client.crt", &trusted.cert_pem);
    support::eventually(
        "the new client certificate presented",
        std::time::Duration::from_secs(10),
        async || get(&proxy.url(LABELS), &bob).await.status == StatusCode::OK,
    )
    .await;
    assert_eq!(upstream.served(), ["team-b"], "nothing served before");
}

/// The proxy offers the hybrid post-quantum key exchange to its upstreams,
/// which Loki and Mimir (Go 1.24 and later) agree to when offered: an
/// upstream accepting nothing else is served.
#[tokio::test]
async fn the_upstream_connection_can_agree_a_post_quantum_key_exchange() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let leaf = ca.issue("localhost");
    let upstream = HttpsUpstream::serving(server_config_with(
        provider_with_only(X25519MLKEM768),
        &leaf,
        None,
    ))
    .await;
    let url = format!("https://localhost:{}", upstream.addr.port());
    let ca_file = write(dir.path(), "ca.crt", &ca.pem());
    let proxy = proxy(url, format!("    ca_file: {ca_file}\n")).await;
    let reply = get(&proxy.url(LABELS), &basic("alice", "alice-pw")).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(upstream.served(), ["team-a"]);
}
