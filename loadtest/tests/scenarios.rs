//! Every scenario file parses and prepares; the load loop runs against the
//! sink and counts what it sent (a smoke test: no time is asserted).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use loadtest::load::{self, Workload};
use loadtest::scenario::Scenario;
use loadtest::{bodies, sink};

fn scenarios() -> Vec<Scenario> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut all: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    all.sort();
    all.iter().map(|p| Scenario::load(p).unwrap()).collect()
}

/// The scenario's requests, prepared, as the load loop sends them.
fn workload_of(scenario: &Scenario) -> Arc<Workload> {
    let prepared = scenario
        .requests
        .iter()
        .map(|r| bodies::prepare(&r.method, &r.path, &r.body).unwrap())
        .collect();
    Arc::new(Workload::new(scenario, prepared))
}

#[test]
fn every_scenario_parses_and_its_bodies_prepare() {
    let all = scenarios();
    assert!(all.len() >= 8);
    for scenario in all {
        for r in &scenario.requests {
            bodies::prepare(&r.method, &r.path, &r.body).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_and_open_loops_send_bounded_load_to_the_sink() {
    let (addr, stats) = sink::start().await.unwrap();
    for mut scenario in scenarios()
        .into_iter()
        .filter(|s| s.name == "mixed" || s.name == "loki-open-loop")
    {
        scenario.duration = Duration::from_millis(500);
        scenario.warmup = Duration::from_millis(100);
        scenario.max_requests = 300;
        scenario.connections = 4;
        let workload = workload_of(&scenario);
        let mut phases = Vec::new();
        let outcome = load::run(addr, &scenario, workload, |starting| phases.push(starting)).await;
        assert_eq!(phases, [true, false]);
        assert!(
            outcome.requests() > 0 && outcome.requests() <= 300 + 4,
            "{outcome:?}"
        );
        assert_eq!(outcome.transport_errors, 0);
        assert!(
            outcome.statuses.keys().all(|s| (200..300).contains(s)),
            "{:?}",
            outcome.statuses
        );
    }
    assert!(stats.connections() >= 4);
}

#[test]
fn wrong_password_share_marks_that_share_of_credentials() {
    let scenario = scenarios()
        .into_iter()
        .find(|s| s.name == "auth-heavy")
        .unwrap();
    let workload = Workload::new(&scenario, vec![]);
    let wrong = workload
        .auths
        .iter()
        .filter(|a| {
            use base64::Engine;
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(a.trim_start_matches("Basic "))
                .unwrap();
            String::from_utf8(decoded).unwrap().contains(":wrong-")
        })
        .count();
    assert_eq!(wrong * 10, workload.auths.len());
}

/// One request through the relay on a fresh connection: the status, or
/// `None` when the connection failed, broke or gave no answer in 2 s.
async fn through(relay: std::net::SocketAddr) -> Option<u16> {
    let exchange = async {
        let stream = tokio::net::TcpStream::connect(relay).await.ok()?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .ok()?;
        tokio::spawn(connection);
        let request = http::Request::get("/loki/api/v1/labels")
            .header("host", "relay")
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .ok()?;
        let response = sender.send_request(request).await.ok()?;
        let status = response.status().as_u16();
        http_body_util::BodyExt::collect(response.into_body())
            .await
            .ok()?;
        Some(status)
    };
    tokio::time::timeout(Duration::from_secs(2), exchange)
        .await
        .ok()
        .flatten()
}

#[tokio::test]
async fn the_fault_relay_misbehaves_on_command_and_recovers_on_its_port() {
    use loadtest::faults::{Fault, FaultyUpstream};
    let (sink, _) = sink::start().await.unwrap();
    let relay = FaultyUpstream::start(sink).await.unwrap();
    assert_eq!(through(relay.addr).await, Some(200));
    for fault in [
        Fault::Refuse,
        Fault::ResetInHead,
        Fault::ResetInBody,
        Fault::Stall,
    ] {
        relay.set(fault);
        if fault == Fault::Refuse {
            // Wait for the listener to close: the switch is asynchronous.
            let mut refused = false;
            for _ in 0..200 {
                if tokio::net::TcpStream::connect(relay.addr).await.is_err() {
                    refused = true;
                    break;
                }
                tokio::task::yield_now().await;
            }
            assert!(refused, "connections refused");
        }
        assert_eq!(through(relay.addr).await, None, "{fault:?}");
        relay.set(Fault::Healthy);
        let mut recovered = None;
        for _ in 0..200 {
            recovered = through(relay.addr).await;
            if recovered.is_some() {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(recovered, Some(200), "after {fault:?}");
    }
}

/// The nginx reference gateway lets a right `{SHA}` password through to
/// the sink and refuses a wrong one, so its row measures real basic auth.
#[tokio::test]
async fn the_nginx_reference_authenticates_like_the_proxy() {
    if std::process::Command::new("nginx")
        .arg("-v")
        .output()
        .is_err()
    {
        eprintln!("nginx is not installed (Debian package `nginx`): skipped");
        return;
    }
    let (sink, stats) = sink::start().await.unwrap();
    let nginx = loadtest::nginx::NginxProcess::start(sink, 2, false)
        .await
        .unwrap();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let status = |password: &'static str| {
        let client = client.clone();
        let token = base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            format!("user-1:{password}"),
        );
        let request = http::Request::get(format!("http://{}/loki/api/v1/labels", nginx.addr))
            .header("authorization", format!("Basic {token}"))
            .body(http_body_util::Empty::new())
            .unwrap();
        async move { client.request(request).await.unwrap().status() }
    };
    assert_eq!(status("pw-1").await, http::StatusCode::OK);
    assert_eq!(status("pw-0").await, http::StatusCode::UNAUTHORIZED);
    assert_eq!(
        stats.requests.load(std::sync::atomic::Ordering::Relaxed),
        1,
        "only the right one passed"
    );
}

/// An `https` target speaks HTTP/2 over TLS, trusting the certificate it
/// was given: a TLS server offering `h2` and HTTP/1.1 sees every request
/// come as HTTP/2, naming the address as its authority.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_target_gets_http2_over_tls() {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use std::sync::Mutex;

    let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
    let key = rustls_pki_types::PrivateKeyDer::try_from(made.signing_key.serialize_der()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![made.cert.der().clone()], key)
        .unwrap();
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let server_seen = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (acceptor, seen) = (acceptor.clone(), server_seen.clone());
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(stream).await else {
                    return;
                };
                let service = hyper::service::service_fn(move |request: http::Request<_>| {
                    let authority = request.uri().authority().map(|a| a.to_string());
                    seen.lock().unwrap().push((request.version(), authority));
                    async { Ok::<_, std::convert::Infallible>(http::Response::new(String::new())) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });

    let mut scenario = scenarios()
        .into_iter()
        .find(|s| s.name == "loki-query-range-https")
        .unwrap();
    scenario.duration = Duration::from_millis(300);
    scenario.warmup = Duration::ZERO;
    scenario.max_requests = 50;
    scenario.connections = 2;
    let workload = workload_of(&scenario);
    let target = load::Target::https(addr, made.cert.der().clone()).unwrap();
    let outcome = load::run(target, &scenario, workload, |_| {}).await;
    assert_eq!(outcome.transport_errors, 0, "{outcome:?}");
    assert!(
        outcome.statuses.get(&200).is_some_and(|&n| n > 0),
        "{outcome:?}"
    );
    let seen = seen.lock().unwrap();
    assert!(!seen.is_empty());
    let expected = (http::Version::HTTP_2, Some(addr.to_string()));
    assert!(seen.iter().all(|s| *s == expected), "{seen:?}");
}

/// The reference gateway serves plain HTTP/1.1, so a scenario that sends
/// the proxy's rows over TLS and HTTP/2 cannot have it beside them.
#[test]
fn an_https_scenario_with_a_reference_row_is_refused() {
    let path = std::env::temp_dir().join(format!("https-reference-{}.yaml", std::process::id()));
    let scenario = "name: x\ndescription: x\ntransport: https\nreference: nginx\n\
                    requests:\n  - {method: GET, path: /loki/api/v1/labels}\n";
    std::fs::write(&path, scenario).unwrap();
    let loaded = Scenario::load(&path);
    std::fs::remove_file(&path).unwrap();
    let error = loaded.expect_err("refused").to_string();
    assert!(error.contains("plain HTTP only"), "{error}");
    // Without the reference it loads.
    let plain = scenario.replace("reference: nginx\n", "");
    std::fs::write(&path, plain).unwrap();
    let loaded = Scenario::load(&path);
    std::fs::remove_file(&path).unwrap();
    assert!(loaded.is_ok(), "{:?}", loaded.err());
}
