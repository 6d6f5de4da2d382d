//! The load loops. Every loop is bounded by time and by request count, and
//! targets a loopback address only.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::CertificateDer;

use crate::bodies::Prepared;
use crate::scenario::{KeyExchange, Mode, Scenario};

/// What one measured phase produced.
#[derive(Debug)]
pub struct Outcome {
    pub elapsed: Duration,
    pub latency_us: Histogram<u64>,
    pub statuses: BTreeMap<u16, u64>,
    pub transport_errors: u64,
}

impl Outcome {
    pub fn requests(&self) -> u64 {
        self.statuses.values().sum::<u64>() + self.transport_errors
    }
}

/// Where the load goes: a loopback address, spoken to in plain HTTP/1.1,
/// or over TLS with HTTP/2 (ALPN `h2`), as Grafana's and the OpenTelemetry
/// Collector's Go clients speak to an `https://` URL.
#[derive(Clone)]
pub struct Target {
    pub addr: SocketAddr,
    tls: Option<Tls>,
}

/// What a TLS target's connections are made with: the certificates trusted,
/// the key exchange offered, and the client configuration built from them.
#[derive(Clone)]
struct Tls {
    roots: Arc<rustls::RootCertStore>,
    key_exchange: KeyExchange,
    config: Arc<rustls::ClientConfig>,
}

impl Target {
    pub fn plain(addr: SocketAddr) -> Self {
        Self { addr, tls: None }
    }

    /// TLS trusting `certificate` alone, HTTP/2 only, offering the
    /// post-quantum key exchange first (see [`Target::offering`]).
    pub fn https(addr: SocketAddr, certificate: CertificateDer<'static>) -> anyhow::Result<Self> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(certificate)?;
        let roots = Arc::new(roots);
        let key_exchange = KeyExchange::PostQuantum;
        Ok(Self {
            addr,
            tls: Some(Tls {
                config: client_config(roots.clone(), key_exchange),
                roots,
                key_exchange,
            }),
        })
    }

    /// A gateway's: over TLS trusting `certificate` if it serves one, else
    /// plain.
    pub fn of_gateway(
        addr: SocketAddr,
        certificate: Option<&CertificateDer<'static>>,
    ) -> anyhow::Result<Self> {
        match certificate {
            None => Ok(Self::plain(addr)),
            Some(certificate) => Self::https(addr, certificate.clone()),
        }
    }

    /// The same target, its TLS connections offering `key_exchange`; the
    /// configuration is rebuilt only if that changes what they offer.
    pub fn offering(mut self, key_exchange: KeyExchange) -> Self {
        if let Some(tls) = self
            .tls
            .as_mut()
            .filter(|tls| tls.key_exchange != key_exchange)
        {
            tls.config = client_config(tls.roots.clone(), key_exchange);
            tls.key_exchange = key_exchange;
        }
        self
    }
}

/// As Go's clients (Grafana, the Collector, Alloy) speak TLS: 1.2 and 1.3,
/// their order of key exchanges and cipher suites, ALPN `h2` only, and no
/// session resumption (they keep no TLS sessions unless told to, so each
/// new connection pays a full handshake).
fn client_config(
    roots: Arc<rustls::RootCertStore>,
    key_exchange: KeyExchange,
) -> Arc<rustls::ClientConfig> {
    use rustls::crypto::aws_lc_rs::kx_group;
    // Go's order (crypto/tls, 1.24+), and OpenSSL 3.0's without the
    // post-quantum hybrid; rustls's own default puts P-384 before X25519,
    // which a server honouring the client's order (nginx) would agree.
    let classical = [kx_group::X25519, kx_group::SECP256R1, kx_group::SECP384R1];
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    provider.kx_groups = match key_exchange {
        KeyExchange::PostQuantum => [&[kx_group::X25519MLKEM768][..], &classical].concat(),
        KeyExchange::Classical => classical.to_vec(),
    };
    // Go's TLS 1.3 order on AES hardware: AES-128-GCM first (rustls's
    // default starts with AES-256-GCM-SHA384, whose SHA-384 key schedule
    // costs a server more per handshake), and both gateways follow it.
    let aes_128 = rustls::CipherSuite::TLS13_AES_128_GCM_SHA256;
    provider
        .cipher_suites
        .sort_by_key(|suite| suite.suite() != aes_128);
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_safe_default_protocol_versions()
        .expect("aws-lc-rs's default provider supports TLS 1.2 and 1.3")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    config.resumption = rustls::client::Resumption::disabled();
    Arc::new(config)
}

impl From<SocketAddr> for Target {
    fn from(addr: SocketAddr) -> Self {
        Self::plain(addr)
    }
}

/// The mix, expanded by weight, and the Authorization values to rotate.
pub struct Workload {
    pub requests: Vec<Prepared>,
    /// Per request: whether it holds [`QUERY_VARIABLE`], decided once
    /// (looking through a 57-230 KB push body on every send slowed the
    /// generator, which shares the cores with the proxy).
    templated: Vec<bool>,
    pub auths: Vec<String>,
    /// Where [`QUERY_VARIABLE`] gets a new value per request; `None`: the
    /// same value in every request (repeated queries).
    fresh: Option<AtomicU64>,
}

/// What a request's path or body may hold to vary per request, as a
/// dashboard variable does: `0` in every request of a plain row, a new
/// number in each of a `first_seen` row (issue #19).
pub const QUERY_VARIABLE: &str = "@n@";

impl Workload {
    pub fn new(scenario: &Scenario, prepared: Vec<Prepared>) -> Self {
        let mut requests = Vec::new();
        for (template, request) in scenario.requests.iter().zip(prepared) {
            for _ in 0..template.weight {
                requests.push(request.clone());
            }
        }
        // Every n-th credential use carries a wrong password.
        let wrong_every = if scenario.wrong_password_share > 0.0 {
            (1.0 / scenario.wrong_password_share).round().max(1.0) as usize
        } else {
            usize::MAX
        };
        // Wrong passwords must not repeat within a run: the proxy lets
        // concurrent requests with the same password share one argon2 run,
        // and an attacker's guesses are all different.
        let slots = if wrong_every == usize::MAX {
            (scenario.users * 10).max(10)
        } else {
            100_000
        };
        let auths = (0..slots)
            .map(|slot| {
                let user = slot % scenario.users;
                let password = if slot % wrong_every == wrong_every - 1 {
                    format!("wrong-{slot}")
                } else {
                    format!("pw-{user}")
                };
                let token = base64::engine::general_purpose::STANDARD
                    .encode(format!("user-{user}:{password}"));
                format!("Basic {token}")
            })
            .collect();
        Self {
            templated: requests.iter().map(Prepared::is_templated).collect(),
            requests,
            auths,
            fresh: None,
        }
    }

    /// The same workload with every query new: [`QUERY_VARIABLE`] counts up.
    pub fn with_fresh_queries(&self) -> Self {
        Self {
            requests: self.requests.clone(),
            templated: self.templated.clone(),
            auths: self.auths.clone(),
            fresh: Some(AtomicU64::new(1)),
        }
    }

    /// Request `n` of the mix, its variable filled in.
    fn request(&self, n: usize) -> std::borrow::Cow<'_, Prepared> {
        let i = n % self.requests.len();
        let request = &self.requests[i];
        if !self.templated[i] {
            return std::borrow::Cow::Borrowed(request);
        }
        let value = self
            .fresh
            .as_ref()
            .map_or(0, |counter| counter.fetch_add(1, Ordering::Relaxed));
        std::borrow::Cow::Owned(request.with_variable(QUERY_VARIABLE, &value.to_string()))
    }
}

/// How long workers may take to finish their last request once a phase
/// has ended: as long as the phase, within these bounds.
const GRACE_MIN: Duration = Duration::from_secs(5);
const GRACE_MAX: Duration = Duration::from_secs(30);

struct Shared {
    recording: AtomicBool,
    stop: AtomicBool,
    measured: AtomicU64,
    max_requests: u64,
    /// A worker's connection is closed after this many requests.
    requests_per_connection: u64,
    results: Mutex<(Histogram<u64>, BTreeMap<u16, u64>, u64)>,
}

/// Runs warm-up then the measured phase; `on_measure(start)` is called as
/// the measured phase starts (true) and ends (false), to snapshot the proxy.
pub async fn run(
    target: impl Into<Target>,
    scenario: &Scenario,
    workload: Arc<Workload>,
    mut on_measure: impl FnMut(bool),
) -> Outcome {
    let shared = Arc::new(Shared {
        recording: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        measured: AtomicU64::new(0),
        max_requests: scenario.max_requests,
        requests_per_connection: scenario.requests_per_connection.unwrap_or(u64::MAX),
        results: Mutex::new((Histogram::new(3).unwrap(), BTreeMap::new(), 0)),
    });
    let target = target.into().offering(scenario.key_exchange);
    // One worker per request in flight: closed loop, each sends its next
    // request when the last answered. Over HTTP/2 with several streams per
    // connection, the workers of a connection share it; a plain target (the
    // direct row's sink) gets as many requests in flight, each worker on a
    // connection of its own, as HTTP/1.1 carries one request at a time.
    let in_flight = scenario.connections.max(1) * scenario.streams_per_connection.max(1);
    let streams = match target.tls {
        Some(_) => scenario.streams_per_connection.max(1),
        None => 1,
    };
    // Open loop: each worker sends at its share of the rate.
    let interval = match scenario.mode {
        Mode::Closed => None,
        Mode::Open => Some(Duration::from_secs_f64(
            in_flight as f64 / scenario.rate as f64,
        )),
    };
    let shared_connections: Vec<_> = match streams {
        1 => Vec::new(),
        _ => (0..scenario.connections.max(1))
            .map(|_| Arc::new(SharedConnection::default()))
            .collect(),
    };
    let workers: Vec<_> = (0..in_flight)
        .map(|i| {
            // Open loop: worker i starts i/N of an interval in, so the
            // arrivals are evenly spread.
            let offset = interval.map(|step| step.mul_f64(i as f64 / in_flight as f64));
            let schedule = interval.zip(offset);
            tokio::spawn(worker(
                i,
                in_flight,
                shared_connections.get(i / streams).cloned(),
                target.clone(),
                workload.clone(),
                shared.clone(),
                schedule,
            ))
        })
        .collect();
    tokio::time::sleep(scenario.warmup).await;
    on_measure(true);
    let started = Instant::now();
    shared.recording.store(true, Ordering::Release);
    let deadline = started + scenario.duration;
    while Instant::now() < deadline
        && shared.measured.load(Ordering::Relaxed) < scenario.max_requests
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shared.recording.store(false, Ordering::Release);
    let elapsed = started.elapsed();
    on_measure(false);
    shared.stop.store(true, Ordering::Release);
    // A worker finishes the request it is on, but not forever: one whose
    // target never answers is abandoned (its figures with it) once the
    // grace is over, so a hung target cannot hold the run.
    let grace_period = scenario.duration.clamp(GRACE_MIN, GRACE_MAX);
    let grace = tokio::time::Instant::now() + grace_period;
    let mut abandoned = 0;
    for mut worker in workers {
        if tokio::time::timeout_at(grace, &mut worker).await.is_err() {
            worker.abort();
            abandoned += 1;
        }
    }
    if abandoned > 0 {
        eprintln!(
            "{abandoned} of {in_flight} workers still waited for an answer {:?} after the phase \
             ended: abandoned, each counted as a transport error, their other figures lost",
            grace_period
        );
    }
    let (latency_us, statuses, transport_errors) = std::mem::replace(
        &mut *shared.results.lock().unwrap(),
        (Histogram::new(3).unwrap(), BTreeMap::new(), 0),
    );
    let transport_errors = transport_errors + abandoned;
    Outcome {
        elapsed,
        latency_us,
        statuses,
        transport_errors,
    }
}

/// One connection's request sender, in the protocol its target speaks.
enum Sender {
    Http1(http1::SendRequest<Full<Bytes>>),
    Http2(http2::SendRequest<Full<Bytes>>),
}

async fn connect(target: &Target, source: Option<std::net::Ipv4Addr>) -> Option<Sender> {
    let stream = match source {
        None => tokio::net::TcpStream::connect(target.addr).await.ok()?,
        Some(ip) => {
            let socket = tokio::net::TcpSocket::new_v4().ok()?;
            socket.bind(SocketAddr::from((ip, 0))).ok()?;
            socket.connect(target.addr).await.ok()?
        }
    };
    let _ = stream.set_nodelay(true);
    let Some(tls) = &target.tls else {
        let (sender, connection) = http1::handshake(TokioIo::new(stream)).await.ok()?;
        tokio::spawn(connection);
        return Some(Sender::Http1(sender));
    };
    let name = rustls_pki_types::ServerName::IpAddress(target.addr.ip().into());
    let stream = tokio_rustls::TlsConnector::from(tls.config.clone())
        .connect(name, stream)
        .await
        .ok()?;
    let (sender, connection) = http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(connection);
    Some(Sender::Http2(sender))
}

/// An HTTP/2 connection the workers of one group send their streams on,
/// as Go's client multiplexes a Grafana's queries to one data source: the
/// first worker to find it missing or closed opens it again.
#[derive(Default)]
struct SharedConnection(tokio::sync::Mutex<Option<http2::SendRequest<Full<Bytes>>>>);

impl SharedConnection {
    async fn sender(&self, target: &Target) -> Option<Sender> {
        let mut slot = self.0.lock().await;
        if slot.as_ref().is_none_or(|sender| sender.is_closed()) {
            *slot = match connect(target, None).await? {
                Sender::Http2(sender) => Some(sender),
                Sender::Http1(_) => None,
            };
        }
        slot.clone().map(Sender::Http2)
    }
}

/// `schedule`: open loop's (interval, first offset); `None` for closed loop.
/// `connection`: the one this worker multiplexes on with others, if any.
async fn worker(
    index: usize,
    workers: usize,
    connection: Option<Arc<SharedConnection>>,
    target: Target,
    workload: Arc<Workload>,
    shared: Arc<Shared>,
    schedule: Option<(Duration, Duration)>,
) {
    let interval = schedule.map(|(step, _)| step);
    let mut histogram = Histogram::<u64>::new(3).unwrap();
    let mut statuses: BTreeMap<u16, u64> = BTreeMap::new();
    let mut transport_errors = 0u64;
    let mut sender: Option<Sender> = None;
    // Requests answered on `sender`'s connection.
    let mut on_connection = 0u64;
    let mut n = index;
    let mut intended = schedule.map(|(_, offset)| Instant::now() + offset);
    while !shared.stop.load(Ordering::Acquire) {
        if let (Some(at), Some(step)) = (intended.as_mut(), interval) {
            let now = Instant::now();
            if *at > now {
                tokio::time::sleep_until((*at).into()).await;
            }
            *at += step;
        }
        let start = match intended {
            // Latency from when the request should have been sent.
            Some(at) => at - interval.unwrap(),
            None => Instant::now(),
        };
        let request = workload.request(n);
        // Workers take turns through the credentials (worker i uses i,
        // i+N, i+2N...): walking them side by side, one step apart, would
        // send each wrong password from many connections at nearly the
        // same moment.
        let auth = &workload.auths[(index + (n - index) * workers) % workload.auths.len()];
        n += 1;
        if sender.is_none() {
            on_connection = 0;
            sender = match &connection {
                Some(connection) => connection.sender(&target).await,
                None => connect(&target, None).await,
            };
            if sender.is_none() {
                // A connection refused at once can fail without the task
                // ever waiting: let the timers that end the phase run.
                tokio::task::yield_now().await;
            }
        }
        let result = match sender.as_mut() {
            None => None,
            Some(s) => send(s, target.addr, &request, auth).await,
        };
        let recording = shared.recording.load(Ordering::Acquire);
        match result {
            Some(status) => {
                if recording {
                    let micros = start.elapsed().as_micros() as u64;
                    let _ = histogram.record(micros.max(1));
                    *statuses.entry(status).or_default() += 1;
                }
                on_connection += 1;
                if on_connection >= shared.requests_per_connection {
                    // Dropping the sender ends its connection.
                    sender = None;
                }
            }
            None => {
                sender = None;
                if recording {
                    transport_errors += 1;
                }
            }
        }
        if recording && shared.measured.fetch_add(1, Ordering::Relaxed) + 1 >= shared.max_requests {
            break;
        }
    }
    let mut results = shared.results.lock().unwrap();
    results.0.add(&histogram).unwrap();
    for (status, count) in statuses {
        *results.1.entry(status).or_default() += count;
    }
    results.2 += transport_errors;
}

async fn send(
    sender: &mut Sender,
    target: SocketAddr,
    request: &Prepared,
    auth: &str,
) -> Option<u16> {
    let mut builder = http::Request::builder()
        .method(request.method.clone())
        .header(http::header::AUTHORIZATION, auth);
    for (name, value) in &request.headers {
        builder = builder.header(*name, *value);
    }
    let body = Full::new(request.body.clone());
    let response = match sender {
        Sender::Http1(sender) => {
            sender.ready().await.ok()?;
            let request = builder
                .uri(&request.path)
                .header(http::header::HOST, target.to_string())
                .body(body)
                .ok()?;
            sender.send_request(request).await.ok()?
        }
        // HTTP/2 names the authority in the request line instead of `Host`.
        Sender::Http2(sender) => {
            sender.ready().await.ok()?;
            let uri = format!("https://{target}{}", request.path);
            sender
                .send_request(builder.uri(uri).body(body).ok()?)
                .await
                .ok()?
        }
    };
    let status = response.status().as_u16();
    response.into_body().collect().await.ok()?;
    Some(status)
}

/// Sends wrong passwords at `rate` per second from `source` until `stop`,
/// counting answers by status. Bounded by `stop` and by `max` attempts.
pub async fn guess(
    target: Target,
    guessing: &crate::scenario::Guessing,
    path: &str,
    stop: Arc<AtomicBool>,
    max: u64,
) -> BTreeMap<u16, u64> {
    let sent = Arc::new(AtomicU64::new(0));
    let connections = guessing.connections.max(1);
    let step = Duration::from_secs_f64(connections as f64 / guessing.rate as f64);
    let tasks: Vec<_> = (0..connections)
        .map(|i| {
            let (stop, sent, path, source, target) = (
                stop.clone(),
                sent.clone(),
                path.to_owned(),
                guessing.source,
                target.clone(),
            );
            tokio::spawn(async move {
                let mut statuses = BTreeMap::new();
                let mut sender = None;
                let mut at = Instant::now() + step.mul_f64(i as f64 / connections as f64);
                let request = Prepared {
                    method: http::Method::GET,
                    path,
                    headers: vec![],
                    body: Bytes::new(),
                };
                let auth = format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(format!("user-0:guess-{i}"))
                );
                while !stop.load(Ordering::Acquire) && sent.fetch_add(1, Ordering::Relaxed) < max {
                    tokio::time::sleep_until(at.into()).await;
                    at += step;
                    // Each attempt bounded, so a hung target cannot hold
                    // the loop past `stop`.
                    let attempt = async {
                        if sender.is_none() {
                            sender = connect(&target, Some(source)).await;
                        }
                        match sender.as_mut() {
                            Some(s) => send(s, target.addr, &request, &auth).await,
                            None => None,
                        }
                    };
                    let status = tokio::time::timeout(GRACE_MAX, attempt)
                        .await
                        .ok()
                        .flatten();
                    match status {
                        Some(status) => *statuses.entry(status).or_insert(0u64) += 1,
                        None => sender = None,
                    }
                }
                statuses
            })
        })
        .collect();
    let mut all = BTreeMap::new();
    for task in tasks {
        for (status, n) in task.await.unwrap_or_default() {
            *all.entry(status).or_insert(0) += n;
        }
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::borrow::Cow;

    fn workload(scenario: &str) -> Workload {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("scenarios")
            .join(scenario);
        let scenario = Scenario::load(&path).unwrap();
        let prepared = scenario
            .requests
            .iter()
            .map(|r| crate::bodies::prepare(&r.method, &r.path, &r.body))
            .collect::<anyhow::Result<Vec<_>>>()
            .unwrap();
        Workload::new(&scenario, prepared)
    }

    /// Every request sent counts once in the rates: each answer of each
    /// status, and each transport error.
    #[test]
    fn an_outcome_counts_answers_and_transport_errors() {
        let outcome = Outcome {
            elapsed: Duration::from_secs(1),
            latency_us: Histogram::new(3).unwrap(),
            statuses: BTreeMap::from([(200, 5), (503, 2)]),
            transport_errors: 3,
        };
        assert_eq!(outcome.requests(), 10);
    }

    /// The variable is filled where a request holds it (`0` when repeated,
    /// a new number each time when fresh), and a request without it is
    /// sent as prepared, not copied.
    #[test]
    fn the_query_variable_is_filled_only_where_it_is() {
        let repeated = workload("promql-first-seen.yaml");
        let fresh = repeated.with_fresh_queries();
        let text = |r: &Prepared| format!("{} {}", r.path, String::from_utf8_lossy(&r.body));
        for n in 0..repeated.requests.len() {
            let (once, twice) = (fresh.request(n), fresh.request(n));
            assert!(!text(&once).contains(QUERY_VARIABLE), "{}", text(&once));
            assert_ne!(text(&once), text(&twice));
            let prepared = text(&repeated.requests[n]);
            assert!(prepared.contains(QUERY_VARIABLE), "{prepared}");
            assert_eq!(
                text(&repeated.request(n)),
                prepared.replace(QUERY_VARIABLE, "0")
            );
        }
        let plain = workload("remote-write.yaml");
        assert!(matches!(plain.request(0), Cow::Borrowed(r) if r.body == plain.requests[0].body));
    }
}
