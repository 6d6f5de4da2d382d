//! HTTP/2 clients: Grafana's Go client speaks it over TLS (ALPN `h2`), and
//! agents may use it with prior knowledge. A request that arrives over
//! HTTP/2 is enforced exactly as over HTTP/1.1, and the upstream gets
//! HTTP/1.1 with a `Host` (an HTTP/2 request carries `:authority`, no
//! `Host`).

mod support;

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use support::certs::Ca;
use support::loki::{LokiStandIn, Received};
use support::{basic, ProxyOptions, Reply, RunningProxy};

/// One request over HTTP/2 with prior knowledge (no upgrade, no TLS).
async fn h2c(
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: &'static [u8],
) -> (Version, Reply) {
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let mut request = Request::builder().method(method).uri(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = client
        .request(request.body(Full::new(Bytes::from_static(body))).unwrap())
        .await
        .expect("the proxy answers HTTP/2");
    let version = response.version();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    let reply = Reply {
        status: parts.status,
        headers: parts.headers,
        body,
    };
    (version, reply)
}

/// What every forwarded request must look like, whatever the client spoke.
fn assert_forwarded_as_http1_for(received: &Received, loki: &LokiStandIn, tenant: &str) {
    assert_eq!(received.org_ids(), [tenant]);
    assert!(!received.headers.contains_key("authorization"));
    assert_eq!(
        received.headers.get("host").map(|h| h.to_str().unwrap()),
        Some(loki.addr.to_string().as_str()),
        "HTTP/1.1 needs a Host; an HTTP/2 request has none of its own"
    );
}

#[tokio::test]
async fn http2_requests_are_scoped_like_http1_ones() {
    support::captured_logs();
    let loki = LokiStandIn::start().await;
    let proxy = RunningProxy::start(ProxyOptions::new(loki.url())).await;
    let alice = basic("alice", "alice-pw");

    let (version, reply) = h2c(
        Method::GET,
        &proxy.url("/loki/api/v1/labels"),
        &[
            ("authorization", &alice),
            ("x-scope-orgid", "team-b"),
            ("X-Scope-OrgID", "team-b|team-a"),
        ],
        b"",
    )
    .await;
    assert_eq!(version, Version::HTTP_2);
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_forwarded_as_http1_for(&loki.last(), &loki, "team-a");

    let line = br#"{"streams":[{"stream":{"app":"x"},"values":[["1","over h2"]]}]}"#;
    let (_, reply) = h2c(
        Method::POST,
        &proxy.url("/loki/api/v1/push"),
        &[
            ("authorization", &alice),
            ("content-type", "application/json"),
        ],
        line,
    )
    .await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.text());
    let pushed = loki.last();
    assert_forwarded_as_http1_for(&pushed, &loki, "team-a");
    assert_eq!(pushed.body, &line[..], "the body byte for byte");

    let before = loki.received().len();
    let (_, reply) = h2c(
        Method::GET,
        &proxy.url("/loki/api/v1/labels"),
        &[("x-scope-orgid", "team-a")],
        b"",
    )
    .await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    let (_, reply) = h2c(
        Method::GET,
        &proxy.url("/ring"),
        &[("authorization", &alice)],
        b"",
    )
    .await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert_eq!(
        loki.received().len(),
        before,
        "nothing refused went upstream"
    );
}

#[tokio::test]
async fn http2_queries_are_enforced_in_label_mode() {
    support::captured_logs();
    // The stand-in records what label mode forwards; it need not answer
    // PromQL for that.
    let upstream = LokiStandIn::start().await;
    let section = format!("  upstream: {}\n  mode: label\n", upstream.url());
    let proxy = RunningProxy::start(ProxyOptions::metrics(support::two_tenants(), section)).await;

    let (version, _) = h2c(
        Method::GET,
        &proxy.url("/api/v1/query?query=up%7Bnamespace%3D%22team-b%22%7D"),
        &[("authorization", &basic("alice", "alice-pw"))],
        b"",
    )
    .await;
    assert_eq!(version, Version::HTTP_2);
    let forwarded = upstream.last();
    assert_eq!(forwarded.path, "/api/v1/query");
    let query: Vec<(String, String)> =
        form_urlencoded::parse(forwarded.query.as_deref().unwrap_or("").as_bytes())
            .into_owned()
            .collect();
    assert_eq!(
        query,
        [(
            "query".to_owned(),
            r#"up{namespace="team-a",namespace="team-b"}"#.to_owned()
        )],
        "the tenant's matcher beside the client's (which then selects nothing)"
    );
    assert!(
        forwarded.org_ids().is_empty(),
        "label mode sets no tenant header"
    );
}

#[tokio::test]
async fn https_clients_that_offer_http2_get_it() {
    support::captured_logs();
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let section = ca.issue("localhost").write_to(dir.path());
    let loki = LokiStandIn::start().await;
    let mut options = ProxyOptions::new(loki.url());
    options.extra = Box::leak(section.into_boxed_str());
    let proxy = RunningProxy::start(options).await;

    // As Go's client offers it: h2 first, HTTP/1.1 as the fallback.
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(ca.roots())
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let tcp = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(connection);
    let request = Request::get("https://localhost/loki/api/v1/labels")
        .header("authorization", basic("bob", "bob-pw"))
        .header("x-scope-orgid", "team-a")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.version(), Version::HTTP_2);
    assert_eq!(response.status(), StatusCode::OK);
    assert_forwarded_as_http1_for(&loki.last(), &loki, "team-b");
}

/// A proxy whose connections must show a byte every 200 ms.
async fn impatient() -> (LokiStandIn, RunningProxy) {
    impatient_and("").await
}

/// The same, with `more` limits.
async fn impatient_and(more: &str) -> (LokiStandIn, RunningProxy) {
    support::captured_logs();
    let loki = LokiStandIn::start().await;
    let mut options = ProxyOptions::new(loki.url());
    options.limits = format!("  header_read_timeout: 200ms\n{more}").leak();
    (loki, RunningProxy::start(options).await)
}

/// An HTTP/2 connection (prior knowledge) and the task driving it.
async fn h2_connection(
    proxy: &RunningProxy,
) -> (
    hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    tokio::task::JoinHandle<hyper::Result<()>>,
) {
    let tcp = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let (sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    (sender, tokio::spawn(connection))
}

fn labels_request(proxy: &RunningProxy, stall_ms: &str) -> Request<Full<Bytes>> {
    Request::get(proxy.url("/loki/api/v1/labels"))
        .header("authorization", basic("alice", "alice-pw"))
        .header("x-test-stall-ms", stall_ms)
        .body(Full::new(Bytes::new()))
        .unwrap()
}

#[tokio::test]
async fn an_idle_http2_connection_is_closed_with_goaway() {
    let (_loki, proxy) = impatient().await;
    let (mut sender, connection) = h2_connection(&proxy).await;
    let response = sender
        .send_request(labels_request(&proxy, "0"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    // Nothing more: the proxy ends the connection on its own, gracefully
    // (GOAWAY, then close), so the client's connection ends without error.
    let ended = tokio::time::timeout(std::time::Duration::from_secs(10), connection).await;
    let ended = ended.expect("the proxy closed the idle connection");
    ended.unwrap().expect("a graceful close, not a reset");
}

/// A client that never lets an answer through (a stream window of 0, as
/// anyone can ask) cannot hold its connection, and the stream's memory,
/// for ever: told to finish once quiet, the connection is closed once it
/// stays quiet for twice `limits.upstream_timeout` more.
#[tokio::test]
async fn a_connection_whose_answers_cannot_be_sent_is_closed_in_the_end() {
    let (_loki, proxy) = impatient_and("  upstream_timeout: 300ms\n").await;
    let tcp = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let mut client = hyper::client::conn::http2::Builder::new(TokioExecutor::new());
    client.initial_stream_window_size(0);
    let (mut sender, connection) = client.handshake(TokioIo::new(tcp)).await.unwrap();
    let connection = tokio::spawn(connection);
    // No credential: a 401, whose body never gets a window.
    let request = Request::get(proxy.url("/loki/api/v1/labels"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let answer = sender.send_request(request).await.unwrap();
    assert_eq!(answer.status(), StatusCode::UNAUTHORIZED);
    let ended = tokio::time::timeout(std::time::Duration::from_secs(10), connection).await;
    assert!(ended.is_ok(), "the proxy still holds the connection");
    drop(answer);
}

#[tokio::test]
async fn a_request_slower_than_the_quiet_period_still_gets_its_answer() {
    let (loki, proxy) = impatient().await;
    // Over HTTP/2: the connection is told to finish while the upstream
    // holds the request (no byte moves for 1 s), and the stream completes.
    let (mut sender, connection) = h2_connection(&proxy).await;
    let response = sender
        .send_request(labels_request(&proxy, "1000"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert!(!body.is_empty(), "the whole answer");
    connection.await.unwrap().unwrap();
    // Over HTTP/1.1 the same.
    let reply = support::send(
        Method::GET,
        &proxy.url("/loki/api/v1/labels"),
        Some(&basic("alice", "alice-pw")),
        &[("x-test-stall-ms", "1000")],
        "",
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(loki.received().len(), 2);
}

/// Waits (at most 10 s) for the proxy to end `connection` with GOAWAY
/// `ENHANCE_YOUR_CALM`, its answer to a client that misbehaves.
async fn assert_sent_away(connection: tokio::task::JoinHandle<Result<(), h2::Error>>) {
    let ended = tokio::time::timeout(std::time::Duration::from_secs(10), connection)
        .await
        .expect("the proxy ends the connection")
        .unwrap();
    let error = ended.expect_err("sent away, not closed gracefully");
    assert_eq!(
        error.reason(),
        Some(h2::Reason::ENHANCE_YOUR_CALM),
        "{error}"
    );
}

fn labels_by_alice(proxy: &RunningProxy) -> Request<()> {
    Request::get(proxy.url("/loki/api/v1/labels"))
        .header("authorization", basic("alice", "alice-pw"))
        .body(())
        .unwrap()
}

/// An HTTP/2 connection (the `h2` crate's client) that has had one answer:
/// the proxy's settings have arrived by then.
async fn h2_after_one_answer(
    proxy: &RunningProxy,
) -> (
    h2::client::SendRequest<Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
) {
    let tcp = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    let connection = tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let (answer, _) = client.send_request(labels_by_alice(proxy), true).unwrap();
    assert_eq!(answer.await.unwrap().status(), StatusCode::OK);
    (client, connection)
}

/// What one HTTP/2 connection may hold: 200 streams at once, as the
/// proxy's settings tell the client, each sending at most 64 KiB of body
/// ahead of what the proxy has read (a request waiting for its
/// credential's verification reads none); and a client that resets streams
/// faster than they are served (the "rapid reset" flood) is sent away
/// with GOAWAY after 20.
#[tokio::test]
async fn an_http2_connection_is_held_to_its_streams_and_its_resets() {
    let loki = LokiStandIn::start().await;
    let proxy = RunningProxy::start(ProxyOptions::new(loki.url())).await;
    let (mut client, connection) = h2_after_one_answer(&proxy).await;
    let request = || labels_by_alice(&proxy);
    assert_eq!(client.current_max_send_streams(), 200);
    let (_, mut stream) = client.send_request(request(), false).unwrap();
    stream.reserve_capacity(1 << 20);
    let granted = std::future::poll_fn(|cx| stream.poll_capacity(cx)).await;
    assert_eq!(granted.unwrap().unwrap(), 64 << 10, "a stream's window");
    stream.send_reset(h2::Reason::CANCEL);

    // Streams opened and reset before the proxy could serve them: the
    // test's runtime has one thread, so the client's connection task
    // writes them all at once when the test next waits.
    for _ in 0..40 {
        let Ok(ready) = client.clone().ready().await else {
            break;
        };
        client = ready;
        let Ok((_, mut stream)) = client.send_request(request(), false) else {
            break;
        };
        stream.send_reset(h2::Reason::CANCEL);
    }
    assert_sent_away(connection).await;
}

/// `limits.max_http2_streams` is what the proxy's settings offer.
#[tokio::test]
async fn the_streams_a_connection_may_open_are_the_configured_number() {
    let loki = LokiStandIn::start().await;
    let mut options = ProxyOptions::new(loki.url());
    options.limits = "  max_http2_streams: 32\n";
    let proxy = RunningProxy::start(options).await;
    let (client, connection) = h2_after_one_answer(&proxy).await;
    assert_eq!(client.current_max_send_streams(), 32);
    drop(client);
    connection.abort();
}

/// A client that makes the proxy reset its streams, here by sending more
/// body than its `content-length` (the "MadeYouReset" family of floods,
/// CVE-2025-8671: each reset frees the stream's slot, so the limit on
/// streams at once does not stop it), is sent away with GOAWAY after
/// 1,024 such resets on one connection.
#[tokio::test]
async fn an_http2_client_that_makes_its_streams_fail_is_sent_away() {
    let loki = LokiStandIn::start().await;
    let proxy = RunningProxy::start(ProxyOptions::new(loki.url())).await;
    let tcp = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let (mut client, connection) = h2::client::handshake(tcp).await.unwrap();
    let connection = tokio::spawn(connection);
    let mut sent = 0;
    while sent < 2_000 {
        let Ok(ready) = client.clone().ready().await else {
            break;
        };
        client = ready;
        let request = Request::post(proxy.url("/loki/api/v1/push"))
            .header("authorization", basic("alice", "alice-pw"))
            .header("content-length", "1")
            .body(())
            .unwrap();
        let Ok((_, mut stream)) = client.send_request(request, false) else {
            break;
        };
        if stream
            .send_data(Bytes::from_static(b"too long"), true)
            .is_err()
        {
            break;
        }
        sent += 1;
    }
    assert_sent_away(connection).await;
    assert!(sent > 1_024, "{sent}");
}

/// An upstream that answers each request with a chunked `{}` and a trailer
/// field naming another tenant, and sends on the request line of each.
async fn trailing_upstream() -> (
    std::net::SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (seen, requests) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                // The head, then as many body bytes as it announces.
                let mut read = Vec::new();
                let mut buf = [0; 4096];
                let complete = |read: &[u8]| {
                    let text = String::from_utf8_lossy(read).to_ascii_lowercase();
                    let Some(end) = text.find("\r\n\r\n") else {
                        return false;
                    };
                    let length = text[..end]
                        .lines()
                        .find_map(|line| line.strip_prefix("content-length:"))
                        .map_or(0, |n| n.trim().parse::<usize>().unwrap());
                    read.len() >= end + 4 + length
                };
                while !complete(&read) {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => read.extend_from_slice(&buf[..n]),
                    }
                }
                let line = String::from_utf8_lossy(&read);
                let _ = seen.send(line.lines().next().unwrap_or("").to_owned());
                let answer = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                              Transfer-Encoding: chunked\r\nTrailer: X-Scope-OrgID\r\n\
                              Connection: close\r\n\r\n2\r\n{}\r\n0\r\nX-Scope-OrgID: team-b\r\n\r\n";
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    (addr, requests)
}

/// Trailer fields an upstream sends never reach the client, also where
/// hyper's client reads the answer (a query with a body: bodiless `GET`s
/// take the proxy's own reader, which drops them, `upstream::answer`) and
/// the client speaks HTTP/2, where they would pass whatever the answer's
/// head declared.
#[tokio::test]
async fn an_upstreams_trailer_fields_never_reach_the_client() {
    support::captured_logs();
    let (addr, mut requests) = trailing_upstream().await;
    let proxy = RunningProxy::start(ProxyOptions::new(format!("http://{addr}"))).await;
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let request = Request::post(proxy.url("/loki/api/v1/query_range"))
        .header("authorization", basic("alice", "alice-pw"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(Full::new(Bytes::from_static(b"query=%7Bapp%3D%22x%22%7D")))
        .unwrap();
    let response = client.request(request).await.expect("an answer");
    assert_eq!(response.version(), Version::HTTP_2);
    assert_eq!(response.status(), StatusCode::OK);
    let collected = response.into_body().collect().await.expect("the body");
    assert_eq!(collected.trailers(), None);
    assert_eq!(collected.to_bytes(), "{}");
    let line = requests.recv().await.expect("the upstream was asked");
    assert!(line.starts_with("POST /loki/api/v1/query_range"), "{line}");
}
