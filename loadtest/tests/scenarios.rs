//! Every scenario file parses and prepares; the load loop runs against the
//! sink and counts what it sent (a smoke test: no time is asserted).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use loadtest::load::{self, Workload};
use loadtest::nginx::NginxProcess;
use loadtest::scenario::{Scenario, MAX_SILENT_CONNECTIONS};
use loadtest::sink::SinkStats;
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

/// A phase ends at its request bound when that comes before its duration:
/// the workers stop once that many are measured (each finishing the one
/// it is on), not at the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_loop_stops_at_its_request_bound() {
    let (addr, _stats) = sink::start().await.unwrap();
    let mut scenario = short_scenario("loki-query-range", 4, 1);
    scenario.duration = Duration::from_secs(30);
    scenario.max_requests = 200;
    let outcome = load::run(addr, &scenario, workload_of(&scenario), |_| {}).await;
    let sent = outcome.requests();
    assert!(
        (200..=200 + 4).contains(&sent),
        "{sent} requests: {outcome:?}"
    );
    assert!(outcome.elapsed < scenario.duration, "{outcome:?}");
}

/// An open loop keeps to its rate: 200 requests a second for half a
/// second is about 100, never a burst as fast as the sink answers. (A
/// busy machine can only make it fewer, so only the upper side is held.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_loop_sends_no_more_than_its_rate() {
    let (addr, _stats) = sink::start().await.unwrap();
    let mut scenario = short_scenario("loki-open-loop", 4, 1);
    scenario.rate = 200;
    scenario.duration = Duration::from_millis(500);
    scenario.warmup = Duration::from_millis(100);
    scenario.max_requests = 100_000;
    let outcome = load::run(addr, &scenario, workload_of(&scenario), |_| {}).await;
    assert_eq!(outcome.transport_errors, 0, "{outcome:?}");
    let sent = outcome.requests();
    assert!(sent > 0 && sent <= 150 + 4, "{sent} requests: {outcome:?}");
}

/// Password guessers send at most their bound of attempts, each counted
/// by the status it got (the sink answers 200 to anything).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guessers_send_their_bound_of_attempts_and_count_each_answer() {
    let (addr, stats) = sink::start().await.unwrap();
    let guessing = loadtest::scenario::Guessing {
        rate: 1000,
        connections: 2,
        source: std::net::Ipv4Addr::new(127, 0, 0, 2),
    };
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let path = "/loki/api/v1/labels";
    let statuses = load::guess(addr.into(), &guessing, path, stop, 20).await;
    assert_eq!(statuses, std::collections::BTreeMap::from([(200, 20)]));
    let reached = stats.requests.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(reached, 20);

    // And they keep to their rate: 100 a second, stopped after 300 ms, is
    // about 30 (a busy machine can only make it fewer).
    let guessing = loadtest::scenario::Guessing {
        rate: 100,
        ..guessing
    };
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopping = stop.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        stopping.store(true, std::sync::atomic::Ordering::Release);
    });
    let statuses = load::guess(addr.into(), &guessing, path, stop, 100_000).await;
    let sent: u64 = statuses.values().sum();
    assert!(sent > 0 && sent <= 45 + 2, "{sent} guesses: {statuses:?}");
}

/// A target that takes connections and never answers cannot hold a run:
/// once the phase and its grace (5 s at least) are over, the waiting
/// workers are abandoned and each counted as a transport error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_that_never_answers_cannot_hold_the_run() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let held = Arc::new(std::sync::Mutex::new(Vec::new()));
    let holding = held.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            holding.lock().unwrap().push(stream);
        }
    });
    let scenario = short_scenario("loki-query-range", 2, 1);
    let workload = workload_of(&scenario);
    let run = load::run(addr, &scenario, workload, |_| {});
    let outcome = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("the run ends within its grace");
    assert_eq!(outcome.transport_errors, 2, "{outcome:?}");
    assert!(outcome.statuses.is_empty(), "{outcome:?}");
    assert_eq!(held.lock().unwrap().len(), 2, "both workers had connected");
}

/// A target that refuses every connection (its process gone) cannot hold
/// a run either: each refused attempt is a transport error, and the run
/// ends at its duration or its request bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_that_refuses_connections_cannot_hold_the_run() {
    // A port held by a socket that does not listen: connections to it are
    // refused, and no other process can take it meanwhile.
    let held = tokio::net::TcpSocket::new_v4().unwrap();
    held.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = held.local_addr().unwrap();
    let mut scenario = short_scenario("loki-query-range", 4, 1);
    // A warm-up, where failures are not counted toward the bound.
    scenario.warmup = Duration::from_millis(200);
    let workload = workload_of(&scenario);
    let run = load::run(addr, &scenario, workload, |_| {});
    let outcome = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("the run ends");
    assert!(outcome.statuses.is_empty(), "{outcome:?}");
    assert!(outcome.transport_errors > 0, "{outcome:?}");
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

/// The 2.0 scenario's body, posted to the sink as the proxy forwards it:
/// answered as a 2.0 receiver answers, with the counts written (without
/// them the proxy would turn the 204 into 415), and 400 for a body that
/// does not decode.
#[tokio::test]
async fn the_sink_confirms_a_2_0_write_with_its_counts() {
    let (addr, _stats) = sink::start().await.unwrap();
    let scenario = scenarios()
        .into_iter()
        .find(|s| s.name == "remote-write-2.0")
        .unwrap();
    let r = &scenario.requests[0];
    let prepared = bodies::prepare(&r.method, &r.path, &r.body).unwrap();
    let post = |body: bytes::Bytes| {
        let mut request = http::Request::post(prepared.path.as_str()).header("host", "sink");
        for (name, value) in &prepared.headers {
            request = request.header(*name, *value);
        }
        let request = request.body(http_body_util::Full::new(body)).unwrap();
        async move {
            let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                    .await
                    .unwrap();
            tokio::spawn(connection);
            sender.send_request(request).await.unwrap()
        }
    };
    let response = post(prepared.body.clone()).await;
    assert_eq!(response.status(), 204);
    let written = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    assert_eq!(
        written("x-prometheus-remote-write-samples-written").as_deref(),
        Some("500")
    );
    assert_eq!(
        written("x-prometheus-remote-write-histograms-written").as_deref(),
        Some("0")
    );
    assert_eq!(
        written("x-prometheus-remote-write-exemplars-written").as_deref(),
        Some("0")
    );
    let garbled = post(bytes::Bytes::from_static(b"not snappy")).await;
    assert_eq!(garbled.status(), 400);
    assert!(garbled
        .headers()
        .get("x-prometheus-remote-write-samples-written")
        .is_none());
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

/// Whether Debian's nginx is here for the reference gateway's tests; they
/// skip without it, unless `REQUIRE_NGINX=1` (as in `.ci/run`, which
/// installs it) makes its absence a failure.
fn nginx_installed() -> bool {
    let found = std::process::Command::new("nginx")
        .arg("-v")
        .output()
        .is_ok();
    if !found {
        assert!(
            std::env::var("REQUIRE_NGINX").as_deref() != Ok("1"),
            "nginx is not installed (Debian package `nginx`) and REQUIRE_NGINX=1"
        );
        eprintln!("nginx is not installed (Debian package `nginx`): skipped");
    }
    found
}

/// The nginx reference gateway for `users` credentials in front of a sink
/// of its own, over TLS if `https`; `None` where nginx is not installed
/// (and the test skips).
async fn nginx_before_a_sink(users: usize, https: bool) -> Option<(NginxProcess, SinkStats)> {
    if !nginx_installed() {
        return None;
    }
    let (sink, stats) = sink::start().await.unwrap();
    let nginx = NginxProcess::start(sink, users, false, https)
        .await
        .unwrap();
    Some((nginx, stats))
}

/// The nginx reference gateway lets a right `{SHA}` password through to
/// the sink and refuses a wrong one, so its row measures real basic auth.
#[tokio::test]
async fn the_nginx_reference_authenticates_like_the_proxy() {
    let Some((nginx, stats)) = nginx_before_a_sink(2, false).await else {
        return;
    };
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

/// nginx's own count of open connections (`stub_status`, on a port of its
/// own) is what silent connections wait on beside the nginx row: it counts
/// connections that have sent nothing, and not the one asking.
#[tokio::test]
async fn the_nginx_reference_counts_connections_that_say_nothing() {
    let Some((nginx, _)) = nginx_before_a_sink(1, false).await else {
        return;
    };
    assert_eq!(nginx.open_connections().await.unwrap(), 0.0);
    let (held, _) = loadtest::proxy_process::open_silent(nginx.addr, nginx.pid(), 3, || {
        nginx.open_connections()
    })
    .await
    .unwrap();
    assert_eq!(held.len(), 3);
    assert_eq!(nginx.open_connections().await.unwrap(), 3.0);
}

/// What the test TLS server saw of one request.
#[derive(Debug, PartialEq)]
struct Seen {
    connection: usize,
    version: http::Version,
    authority: Option<String>,
    authorization: Option<String>,
    /// Requests in flight on its connection when it arrived, itself too.
    in_flight: usize,
    /// The key exchange its connection agreed.
    group: Option<rustls::NamedGroup>,
    /// Whether its connection's handshake was full or resumed a session.
    handshake: Option<rustls::HandshakeKind>,
    /// The cipher suite its connection agreed.
    suite: Option<rustls::CipherSuite>,
}

/// A TLS server offering `h2` and HTTP/1.1 with a certificate for
/// 127.0.0.1, answering 200 and recording each request. The first `hold`
/// requests of a connection are answered only once `hold` are in flight
/// on it (or after 10 s, and then the test fails on what was recorded), so
/// streams a client multiplexes are seen together.
async fn tls_server(
    hold: usize,
) -> (
    std::net::SocketAddr,
    rustls_pki_types::CertificateDer<'static>,
    Arc<std::sync::Mutex<Vec<Seen>>>,
) {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use std::sync::atomic::{AtomicUsize, Ordering};

    let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
    let key = rustls_pki_types::PrivateKeyDer::try_from(made.signing_key.serialize_der()).unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
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
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let server_seen = seen.clone();
    tokio::spawn(async move {
        let mut connection = 0;
        while let Ok((stream, _)) = listener.accept().await {
            connection += 1;
            let (acceptor, seen) = (acceptor.clone(), server_seen.clone());
            // Per connection: requests arrived, requests in flight, and a
            // wake-up for the held ones.
            let arrived = Arc::new(AtomicUsize::new(0));
            let in_flight = Arc::new(AtomicUsize::new(0));
            let filled = Arc::new(tokio::sync::Notify::new());
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(stream).await else {
                    return;
                };
                let session = stream.get_ref().1;
                let group = session.negotiated_key_exchange_group().map(|g| g.name());
                let handshake = session.handshake_kind();
                let suite = session.negotiated_cipher_suite().map(|s| s.suite());
                let service = hyper::service::service_fn(move |request: http::Request<_>| {
                    let (arrived, in_flight, filled, seen) = (
                        arrived.clone(),
                        in_flight.clone(),
                        filled.clone(),
                        seen.clone(),
                    );
                    async move {
                        // Made before this request counts itself in flight
                        // (`notify_waiters` wakes every `Notified` made
                        // before it, polled or not): the request that fills
                        // the connection may wake the held ones before they
                        // would otherwise have started waiting, and one then
                        // waited out its 10 s and the load abandoned it.
                        let wake = filled.notified();
                        let held = arrived.fetch_add(1, Ordering::SeqCst) < hold;
                        let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                        seen.lock().unwrap().push(Seen {
                            connection,
                            version: request.version(),
                            authority: request.uri().authority().map(|a| a.to_string()),
                            authorization: request
                                .headers()
                                .get("authorization")
                                .map(|v| v.to_str().unwrap().to_owned()),
                            in_flight: now,
                            group,
                            handshake,
                            suite,
                        });
                        if now >= hold {
                            filled.notify_waiters();
                        } else if held {
                            let _ = tokio::time::timeout(Duration::from_secs(10), wake).await;
                        }
                        in_flight.fetch_sub(1, Ordering::SeqCst);
                        Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, made.cert.der().clone(), seen)
}

/// The `https` scenario, bounded for a test.
fn https_scenario(connections: usize, streams: usize) -> Scenario {
    short_scenario("loki-query-range-https", connections, streams)
}

/// Scenario `name`, run for 300 ms (at most 50 requests) with no warm-up.
fn short_scenario(name: &str, connections: usize, streams: usize) -> Scenario {
    let mut scenario = scenarios().into_iter().find(|s| s.name == name).unwrap();
    scenario.duration = Duration::from_millis(300);
    scenario.warmup = Duration::ZERO;
    scenario.max_requests = 50;
    scenario.connections = connections;
    scenario.streams_per_connection = streams;
    scenario
}

/// Runs `scenario` against `target`, which answers without a transport
/// error and with some 200s.
async fn answered(target: impl Into<load::Target>, scenario: &Scenario) {
    let outcome = load::run(target, scenario, workload_of(scenario), |_| {}).await;
    assert_eq!(outcome.transport_errors, 0, "{outcome:?}");
    assert!(
        outcome.statuses.get(&200).is_some_and(|&n| n > 0),
        "{outcome:?}"
    );
}

/// An `https` target speaks HTTP/2 over TLS, trusting the certificate it
/// was given: a TLS server offering `h2` and HTTP/1.1 sees every request
/// come as HTTP/2, naming the address as its authority.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_target_gets_http2_over_tls() {
    let (addr, certificate, seen) = tls_server(1).await;
    let scenario = https_scenario(2, 1);
    answered(load::Target::https(addr, certificate).unwrap(), &scenario).await;
    let seen = seen.lock().unwrap();
    assert!(!seen.is_empty());
    assert!(
        seen.iter().all(|s| s.version == http::Version::HTTP_2
            && s.authority == Some(addr.to_string())
            && s.in_flight == 1),
        "{seen:?}"
    );
}

/// The workers take turns through the credentials: every user of the
/// scenario is sent, not only those one worker's stride reaches; and a
/// wrong password is sent once, never by two workers walking side by side
/// (the proxy would let the second share the first's argon2 run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workers_send_every_credential_and_each_guess_once() {
    let (addr, certificate, seen) = tls_server(1).await;
    let target = load::Target::https(addr, certificate).unwrap();
    let sent = || -> Vec<String> {
        let mut seen = seen.lock().unwrap();
        let sent = seen.iter().map(|s| s.authorization.clone().unwrap());
        let sent = sent.collect();
        seen.clear();
        sent
    };
    // Two workers, two users: each worker's first request already names
    // its own, however few a busy machine lets them send.
    let mut scenario = https_scenario(2, 1);
    scenario.users = 2;
    answered(target.clone(), &scenario).await;
    let users: std::collections::BTreeSet<_> = sent().into_iter().collect();
    let all: std::collections::BTreeSet<_> = workload_of(&scenario).auths.iter().cloned().collect();
    assert_eq!(all.len(), 2);
    assert_eq!(users, all);

    scenario.wrong_password_share = 1.0;
    answered(target, &scenario).await;
    let guesses = sent();
    let distinct: std::collections::BTreeSet<_> = guesses.iter().collect();
    assert!(guesses.len() >= 2, "{guesses:?}");
    assert_eq!(distinct.len(), guesses.len(), "{guesses:?}");
}

/// With `streams_per_connection`, the workers of a connection share it:
/// the server sees only `connections` connections, each with that many
/// requests in flight at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_per_connection_multiplexes_requests_on_each_connection() {
    let (connections, streams) = (2, 4);
    let (addr, certificate, seen) = tls_server(streams).await;
    let scenario = https_scenario(connections, streams);
    answered(load::Target::https(addr, certificate).unwrap(), &scenario).await;
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    for connection in 1..=connections {
        let on_it: Vec<_> = seen.iter().filter(|s| s.connection == connection).collect();
        let most = on_it.iter().map(|s| s.in_flight).max();
        assert_eq!(most, Some(streams), "connection {connection}: {on_it:?}");
    }
    assert!(seen.iter().all(|s| s.connection <= connections), "{seen:?}");

    // The direct row sends the same scenario to the plain HTTP/1.1 sink:
    // as many requests in flight, each on a connection of its own.
    let (sink, stats) = sink::start().await.unwrap();
    answered(sink, &scenario).await;
    assert_eq!(stats.connections(), (connections * streams) as u64);
}

/// Beside `https` proxy rows, the reference gateway serves TLS and HTTP/2
/// too (the load offers only `h2`, so an answer at all is HTTP/2), and
/// still authenticates: right passwords reach the sink, wrong ones get 401.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nginx_reference_serves_https_rows_over_tls_and_http2() {
    let mut scenario = https_scenario(2, 2);
    let Some((nginx, stats)) = nginx_before_a_sink(scenario.users, true).await else {
        return;
    };
    // Right passwords first, then only wrong ones.
    let mut reached = 0;
    for (wrong_share, status) in [(0.0, 200), (1.0, 401)] {
        scenario.wrong_password_share = wrong_share;
        let workload = workload_of(&scenario);
        let outcome = load::run(nginx.target().unwrap(), &scenario, workload, |_| {}).await;
        assert_eq!(outcome.transport_errors, 0, "{outcome:?}");
        let answered = outcome.statuses.get(&status).copied().unwrap_or(0);
        assert!(answered > 0 && outcome.statuses.len() == 1, "{outcome:?}");
        let now = stats.requests.load(std::sync::atomic::Ordering::Relaxed);
        match status {
            200 => assert!(now - reached >= answered, "{now} reached the sink"),
            _ => assert_eq!(now, reached, "no wrong password reached the sink"),
        }
        reached = now;
    }
}

/// Several streams on a connection need HTTP/2: a plain HTTP/1.1 scenario
/// asking for them is refused, not run with one stream each.
#[test]
fn streams_per_connection_without_https_is_refused() {
    let path = std::env::temp_dir().join(format!("streams-http-{}.yaml", std::process::id()));
    let scenario = "name: x\ndescription: x\nstreams_per_connection: 8\n\
                    requests:\n  - {method: GET, path: /loki/api/v1/labels}\n";
    std::fs::write(&path, scenario).unwrap();
    let loaded = Scenario::load(&path);
    let error = loaded.expect_err("refused").to_string();
    assert!(error.contains("needs transport: https"), "{error}");
    std::fs::write(&path, format!("{scenario}transport: https\n")).unwrap();
    let loaded = Scenario::load(&path);
    std::fs::remove_file(&path).unwrap();
    assert_eq!(loaded.map(|s| s.streams_per_connection).ok(), Some(8));
}

/// Silent connections are bounded below the proxy's default connection
/// limit: more would be refused before the run, not left waiting in the
/// proxy's backlog where they hold nothing of it.
#[test]
fn silent_connections_over_their_bound_are_refused() {
    let path = std::env::temp_dir().join(format!("silent-{}.yaml", std::process::id()));
    let scenario = |count: usize| {
        format!(
            "name: x\ndescription: x\nsilent_connections: {count}\n\
             requests:\n  - {{method: GET, path: /loki/api/v1/labels}}\n"
        )
    };
    std::fs::write(&path, scenario(MAX_SILENT_CONNECTIONS + 1)).unwrap();
    let error = Scenario::load(&path).expect_err("refused").to_string();
    assert!(error.contains("silent_connections is at most"), "{error}");
    std::fs::write(&path, scenario(MAX_SILENT_CONNECTIONS)).unwrap();
    let loaded = Scenario::load(&path);
    std::fs::remove_file(&path).unwrap();
    assert_eq!(
        loaded.map(|s| s.silent_connections).ok(),
        Some(MAX_SILENT_CONNECTIONS)
    );
}

/// With `requests_per_connection`, a worker closes its connection after
/// that many requests and opens another: over TLS, each with a full
/// handshake (the load keeps no sessions to resume), so the handshake
/// scenarios measure what they say; over plain HTTP, as many connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_per_connection_opens_a_new_connection_with_a_full_handshake() {
    let (addr, certificate, seen) = tls_server(1).await;
    let mut scenario = https_scenario(2, 1);
    scenario.requests_per_connection = Some(2);
    answered(load::Target::https(addr, certificate).unwrap(), &scenario).await;
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    let mut per_connection = std::collections::BTreeMap::<usize, usize>::new();
    for s in &seen {
        *per_connection.entry(s.connection).or_default() += 1;
    }
    // Each of the two workers' last connections may carry one request.
    assert!(
        per_connection.values().all(|&n| n <= 2),
        "{per_connection:?}"
    );
    assert!(
        per_connection.len() * 2 <= seen.len() + 2,
        "{per_connection:?}"
    );
    assert!(per_connection.len() >= 3, "{per_connection:?}");
    let full = Some(rustls::HandshakeKind::Full);
    assert!(seen.iter().all(|s| s.handshake == full), "{seen:?}");

    let (sink, stats) = sink::start().await.unwrap();
    scenario.requests_per_connection = Some(1);
    answered(sink, &scenario).await;
    let requests = stats.requests.load(std::sync::atomic::Ordering::Relaxed);
    assert!(requests >= 2);
    assert_eq!(stats.connections(), requests);
}

/// The load offers the key exchange its scenario names: by default the
/// post-quantum hybrid first, as Go's clients do, which a server offering
/// it agrees; `classical` leaves it out, and X25519 comes next (rustls's
/// own order would have P-384 agreed). Either way it prefers AES-128-GCM,
/// as Go does on AES hardware.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_load_offers_what_go_clients_offer_and_the_key_exchange_its_scenario_names() {
    use loadtest::scenario::KeyExchange;
    for (key_exchange, agreed) in [
        (KeyExchange::PostQuantum, rustls::NamedGroup::X25519MLKEM768),
        (KeyExchange::Classical, rustls::NamedGroup::X25519),
    ] {
        let (addr, certificate, seen) = tls_server(1).await;
        let mut scenario = https_scenario(1, 1);
        scenario.key_exchange = key_exchange;
        answered(load::Target::https(addr, certificate).unwrap(), &scenario).await;
        let seen = seen.lock().unwrap();
        assert!(!seen.is_empty());
        let suite = Some(rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
        assert!(
            seen.iter()
                .all(|s| s.group == Some(agreed) && s.suite == suite),
            "{seen:?}"
        );
    }
}

/// A connection the workers share has no one worker's count to close it
/// by: `requests_per_connection` with several streams is refused.
#[test]
fn requests_per_connection_with_shared_connections_is_refused() {
    let path = std::env::temp_dir().join(format!("per-connection-{}.yaml", std::process::id()));
    let scenario = "name: x\ndescription: x\ntransport: https\nrequests_per_connection: 1\n\
                    requests:\n  - {method: GET, path: /loki/api/v1/labels}\n";
    std::fs::write(&path, format!("{scenario}streams_per_connection: 4\n")).unwrap();
    let error = Scenario::load(&path).expect_err("refused").to_string();
    assert!(error.contains("needs streams_per_connection: 1"), "{error}");
    std::fs::write(&path, scenario).unwrap();
    let loaded = Scenario::load(&path);
    std::fs::remove_file(&path).unwrap();
    assert_eq!(
        loaded.map(|s| s.requests_per_connection).ok(),
        Some(Some(1))
    );
}
