//! TLS on the tenant listener: served, reloaded when the files change (a
//! broken file keeps the last good certificate), and client certificates
//! required when a CA bundle is configured. Certificates are made per test
//! with rcgen.

mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rustls::crypto::aws_lc_rs::kx_group::{X25519, X25519MLKEM768};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, NamedGroup, RootCertStore};
use support::certs::{pem_der, provider_with_only, Ca, Leaf};
use support::loki::LokiStandIn;
use support::{basic, replace_file, ProxyOptions, RunningProxy};
use tokio::io::AsyncWriteExt;
use tokio_rustls::TlsConnector;

/// A client trusting `roots`, presenting `client_cert` if given, on
/// `provider`.
fn client_config(
    provider: Arc<CryptoProvider>,
    roots: RootCertStore,
    client_cert: Option<&Leaf>,
) -> ClientConfig {
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    match client_cert {
        None => builder.with_no_client_auth(),
        Some(leaf) => {
            use rustls::pki_types::pem::PemObject;
            let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap();
            builder
                .with_client_auth_cert(vec![pem_der(&leaf.cert_pem)], key)
                .unwrap()
        }
    }
}

/// One HTTPS GET on a fresh connection, with the proxy's own crypto
/// provider; the status and the certificate the server presented, or the
/// error.
async fn https_get(
    proxy: &RunningProxy,
    roots: RootCertStore,
    client_cert: Option<&Leaf>,
    path: &str,
    auth: &str,
) -> Result<(StatusCode, CertificateDer<'static>), String> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = client_config(provider, roots, client_cert);
    let (status, presented, _) = https_get_with(proxy, config, path, auth).await?;
    Ok((status, presented))
}

/// `https_get` with a client of the caller's; also the key exchange group
/// the handshake agreed.
async fn https_get_with(
    proxy: &RunningProxy,
    config: ClientConfig,
    path: &str,
    auth: &str,
) -> Result<(StatusCode, CertificateDer<'static>, NamedGroup), String> {
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let presented = tls.get_ref().1.peer_certificates().unwrap()[0]
        .clone()
        .into_owned();
    let group = tls
        .get_ref()
        .1
        .negotiated_key_exchange_group()
        .unwrap()
        .name();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let request = Request::get(path)
        .header("host", "localhost")
        .header("authorization", auth)
        .body(Empty::<Bytes>::new())
        .unwrap();
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let _ = response.into_body().collect().await;
    Ok((status, presented, group))
}

/// A proxy serving the `tls` section `leaf_section` (from
/// `Leaf::write_to(dir)`), reloaded every 100 ms, requiring client
/// certificates of `dir/clients.crt` with `client_ca`.
async fn start(dir: &Path, leaf_section: &str, client_ca: bool) -> (LokiStandIn, RunningProxy) {
    support::captured_logs();
    let loki = LokiStandIn::start().await;
    let mut options = ProxyOptions::new(loki.url());
    let ca_line = if client_ca {
        format!("  client_ca_file: {}\n", dir.join("clients.crt").display())
    } else {
        String::new()
    };
    let section = format!("{leaf_section}{ca_line}  reload_interval: 100ms\n");
    options.extra = Box::leak(section.into_boxed_str());
    (loki, RunningProxy::start(options).await)
}

const LABELS: &str = "/loki/api/v1/labels";

#[tokio::test]
async fn https_is_served_and_a_rotated_certificate_is_picked_up() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let first = ca.issue("localhost");
    let section = first.write_to(dir.path());
    let (loki, mut proxy) = start(dir.path(), &section, false).await;
    let alice = basic("alice", "alice-pw");

    let (status, presented) = https_get(&proxy, ca.roots(), None, LABELS, &alice)
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(presented, pem_der(&first.cert_pem));
    assert_eq!(loki.last().org_ids(), ["team-a"]);

    let second = ca.issue("localhost");
    let reloads = proxy.tls_reloads.as_mut().unwrap();
    second.write_to(dir.path());
    tokio::time::timeout(Duration::from_secs(10), reloads.wait_for(|n| *n >= 1))
        .await
        .expect("reloaded within 10 s")
        .unwrap();
    let (_, presented) = https_get(&proxy, ca.roots(), None, LABELS, &alice)
        .await
        .unwrap();
    assert_eq!(
        presented,
        pem_der(&second.cert_pem),
        "new connections get the new certificate"
    );

    // A broken certificate file is refused; the last good one stays.
    replace_file(&dir.path().join("tls.crt"), "not a certificate");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !proxy
        .metrics()
        .await
        .contains("tenant_proxy_tls_reload_failures_total 1")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the broken file was noticed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, presented) = https_get(&proxy, ca.roots(), None, LABELS, &alice)
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(presented, pem_der(&second.cert_pem));

    // Plain HTTP on the TLS port gets no answer.
    let (url, auth) = (proxy.url(LABELS), alice.clone());
    let plain = tokio::spawn(async move { support::get(&url, &auth).await });
    let plain = tokio::time::timeout(Duration::from_secs(10), plain).await;
    assert!(matches!(plain, Ok(Err(_))), "plain HTTP is not served");
}

#[tokio::test]
async fn with_a_client_ca_a_client_certificate_is_required_besides_basic_auth() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let section = ca.issue("localhost").write_to(dir.path());
    let clients = Ca::new();
    std::fs::write(dir.path().join("clients.crt"), clients.pem()).unwrap();
    let (loki, proxy) = start(dir.path(), &section, true).await;
    let alice = basic("alice", "alice-pw");

    let good = clients.issue("grafana");
    let (status, _) = https_get(&proxy, ca.roots(), Some(&good), LABELS, &alice)
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);

    let (status, _) = https_get(
        &proxy,
        ca.roots(),
        Some(&good),
        LABELS,
        &basic("alice", "wrong"),
    )
    .await
    .unwrap();
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "the certificate does not replace basic auth"
    );

    let stranger = Ca::new().issue("grafana");
    for client in [None, Some(&stranger)] {
        let refused = https_get(&proxy, ca.roots(), client, LABELS, &alice).await;
        assert!(refused.is_err(), "{:?}", refused.map(|r| r.0));
    }
    assert_eq!(
        loki.received().len(),
        1,
        "only the good client's request got through"
    );
}

/// Go 1.24 and later (Grafana, Alloy, the Collector, Prometheus 3) offer
/// the hybrid post-quantum key exchange X25519MLKEM768 first: the listener
/// agrees to it, so recorded traffic stays secret from a later quantum
/// computer. A client offering only X25519 (older Go, Debian's curl and
/// Prometheus 2.42 in other tests) still gets it.
#[tokio::test]
async fn the_listener_agrees_a_post_quantum_key_exchange_and_still_a_classical_one() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let section = ca.issue("localhost").write_to(dir.path());
    let (loki, proxy) = start(dir.path(), &section, false).await;
    let alice = basic("alice", "alice-pw");

    for group in [X25519MLKEM768, X25519] {
        let config = client_config(provider_with_only(group), ca.roots(), None);
        let (status, _, agreed) = https_get_with(&proxy, config, LABELS, &alice)
            .await
            .unwrap();
        assert_eq!(status, StatusCode::OK);
        assert_eq!(agreed, group.name());
    }
    assert_eq!(loki.received().len(), 2);
}

/// Over TLS too, a client that takes none of its answer holds its
/// connection for two quiet periods once the answer stops moving, not for
/// twice `upstream_timeout`: the writes that wait for it are rustls's
/// (once its buffer is full) and its flushes.
#[tokio::test]
async fn over_tls_a_client_that_takes_none_of_its_answer_is_closed_soon() {
    support::captured_logs();
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let section = ca.issue("localhost").write_to(dir.path());
    let (upstream, _written) = support::answering_64_mib().await;
    let mut options = ProxyOptions::new(format!("http://{upstream}"));
    options.limits = "  header_read_timeout: 200ms\n  upstream_timeout: 10m\n";
    options.extra = Box::leak(section.into_boxed_str());
    let proxy = RunningProxy::start(options).await;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let connector = TlsConnector::from(Arc::new(client_config(provider, ca.roots(), None)));
    let tcp = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let mut tls = connector.connect(name, tcp).await.unwrap();
    let request = format!(
        "GET {LABELS} HTTP/1.1\r\nhost: localhost\r\nauthorization: {}\r\n\r\n",
        basic("alice", "alice-pw")
    );
    tls.write_all(request.as_bytes()).await.unwrap();
    tls.flush().await.unwrap();
    proxy.assert_its_one_connection_closed().await;
}
