//! The upstream client's connections: reused while they can be, never once
//! they cannot. The upstream is written by hand so that each test decides
//! exactly what it answers and when it closes, and reports what it saw.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Body as _;
use prometheus_client::metrics::counter::Counter;
use tenant_proxy::http::body;
use tenant_proxy::upstream::answer::AnswerError;
use tenant_proxy::upstream::{self, HttpClient, Reuse, UpstreamError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Notify};

#[derive(Debug, PartialEq, Eq)]
enum Seen {
    /// A connection was accepted (numbered from 1).
    Accepted(usize),
    /// A request head arrived on connection n.
    Request(usize, String),
    /// Connection n was closed by the proxy.
    ClosedByProxy(usize),
    /// The upstream closed connection n after answering.
    ClosedByUpstream(usize),
}

/// When the upstream closes a connection, or how it fails one.
#[derive(Clone)]
enum Close {
    Never,
    AfterAnswer,
    /// When told, between requests (as an idle timeout would).
    WhenTold(Arc<Notify>),
    /// On reading a connection's second request, unanswered: an idle
    /// timeout that fired as the request arrived.
    AtSecondRequest,
    /// On reading a connection's second request, resets it (an RST, as
    /// a restarted upstream or a middlebox sends).
    ResetAtSecondRequest,
    /// Answers a connection's second request with a head no HTTP/1.1
    /// reader accepts, and keeps the connection open.
    GarbledSecondAnswer,
}

/// Answers every request with `answer`, closing or failing connections as
/// `close` says. Requests carry no body.
async fn upstream(
    answer: &'static str,
    close: Close,
) -> (SocketAddr, mpsc::UnboundedReceiver<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (seen, events) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut connections = 0;
        while let Ok((mut stream, _)) = listener.accept().await {
            connections += 1;
            let (n, seen, close) = (connections, seen.clone(), close.clone());
            let _ = seen.send(Seen::Accepted(n));
            tokio::spawn(async move {
                let mut buffer = Vec::new();
                let mut requests = 0;
                loop {
                    let mut chunk = [0; 4096];
                    let read = match &close {
                        Close::WhenTold(told) => tokio::select! {
                            read = stream.read(&mut chunk) => read.unwrap_or(0),
                            () = told.notified() => {
                                drop(stream);
                                let _ = seen.send(Seen::ClosedByUpstream(n));
                                return;
                            }
                        },
                        _ => stream.read(&mut chunk).await.unwrap_or(0),
                    };
                    if read == 0 {
                        let _ = seen.send(Seen::ClosedByProxy(n));
                        return;
                    }
                    buffer.extend_from_slice(&chunk[..read]);
                    while let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head: Vec<u8> = buffer.drain(..end + 4).collect();
                        let _ = seen.send(Seen::Request(n, String::from_utf8(head).unwrap()));
                        requests += 1;
                        match (&close, requests) {
                            (Close::AtSecondRequest | Close::ResetAtSecondRequest, 2) => {
                                if let Close::ResetAtSecondRequest = close {
                                    stream.set_zero_linger().unwrap();
                                }
                                drop(stream);
                                let _ = seen.send(Seen::ClosedByUpstream(n));
                                return;
                            }
                            (Close::GarbledSecondAnswer, 2) => {
                                stream
                                    .write_all(b"HTTP/1.1 200 OK\r\nbad header\r\n\r\n")
                                    .await
                                    .unwrap();
                                continue;
                            }
                            _ => {}
                        }
                        stream.write_all(answer.as_bytes()).await.unwrap();
                        if let Close::AfterAnswer = close {
                            drop(stream);
                            let _ = seen.send(Seen::ClosedByUpstream(n));
                            return;
                        }
                    }
                }
            });
        }
    });
    (addr, events)
}

/// A client that keeps connections as the proxy does by default.
fn client() -> HttpClient {
    let reuse = Reuse::new(Duration::from_secs(50), Counter::default());
    upstream::client(None, reuse, None).unwrap()
}

/// A client that sends a safe request again on a new connection when a
/// connection parked for at least `replay_after_idle` closes under it,
/// and the count of the requests it sent again.
fn client_replaying_after(replay_after_idle: Duration) -> (HttpClient, Counter) {
    let replays = Counter::default();
    let reuse = Reuse {
        replay_after_idle,
        ..Reuse::new(Duration::from_secs(50), replays.clone())
    };
    (upstream::client(None, reuse, None).unwrap(), replays)
}

/// A bodiless Loki query to `addr`, sent with `method`.
fn query(addr: SocketAddr, method: Method) -> Request<body::ProxyBody> {
    Request::builder()
        .method(method)
        .uri(format!(
            "http://{addr}/loki/api/v1/query_range?query=%7Bapp%3D%22a%22%7D"
        ))
        .body(body::empty())
        .unwrap()
}

async fn get(client: &HttpClient, addr: SocketAddr, method: Method) -> (StatusCode, String) {
    exchange(client, query(addr, method)).await.unwrap()
}

/// The answer's status and body.
async fn exchange(
    client: &HttpClient,
    request: Request<body::ProxyBody>,
) -> Result<(StatusCode, String), UpstreamError> {
    let exchange = async {
        let response = client.request(request).await?;
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        Ok((status, String::from_utf8(body.to_vec()).unwrap()))
    };
    // A lost wake-up shows as a failure, not a test that never ends.
    tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .expect("the exchange completed")
}

/// The events up to and including the one `until` accepts.
async fn events_until(
    events: &mut mpsc::UnboundedReceiver<Seen>,
    until: impl Fn(&Seen) -> bool,
) -> Vec<Seen> {
    let mut seen = Vec::new();
    loop {
        let event = events.recv().await.expect("the upstream is running");
        let done = until(&event);
        seen.push(event);
        if done {
            return seen;
        }
    }
}

/// Everything the upstream reported so far (its reports for a finished
/// exchange are sent before the answer's bytes).
fn drain(events: &mut mpsc::UnboundedReceiver<Seen>) -> Vec<Seen> {
    std::iter::from_fn(|| events.try_recv().ok()).collect()
}

/// How many connections the upstream accepted.
fn connections(seen: &[Seen]) -> usize {
    seen.iter()
        .filter(|e| matches!(e, Seen::Accepted(_)))
        .count()
}

const HELLO: &str = "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello";

/// Sends `count` GETs one after the other to an upstream answering
/// `answer` (a body of `hello`) and never closing; its address and what it
/// saw.
async fn in_turn(answer: &'static str, count: usize) -> (SocketAddr, Vec<Seen>) {
    let (addr, mut events) = upstream(answer, Close::Never).await;
    let client = client();
    for _ in 0..count {
        assert_eq!(
            get(&client, addr, Method::GET).await,
            (StatusCode::OK, "hello".into())
        );
    }
    (addr, drain(&mut events))
}

#[tokio::test]
async fn sequential_requests_share_one_connection_in_origin_form() {
    let (addr, seen) = in_turn(HELLO, 5).await;
    assert_eq!(connections(&seen), 1, "{seen:?}");
    let requests: Vec<&String> = seen
        .iter()
        .filter_map(|e| match e {
            Seen::Request(1, head) => Some(head),
            _ => None,
        })
        .collect();
    assert_eq!(requests.len(), 5, "{seen:?}");
    let head = requests[0].to_ascii_lowercase();
    assert!(
        head.starts_with("get /loki/api/v1/query_range?query=%7bapp%3d%22a%22%7d http/1.1\r\n"),
        "{head}"
    );
    assert!(head.contains(&format!("\r\nhost: {addr}\r\n")), "{head}");
}

#[tokio::test]
async fn an_answer_without_a_body_frees_its_connection_at_once() {
    // GETs are read by hand (upstream/plain.rs), HEADs through hyper: each
    // kind keeps its own connection.
    for method in [Method::GET, Method::HEAD] {
        let (addr, mut events) = upstream("HTTP/1.1 204 No Content\r\n\r\n", Close::Never).await;
        let client = client();
        for _ in 0..3 {
            assert_eq!(
                get(&client, addr, method.clone()).await,
                (StatusCode::NO_CONTENT, String::new())
            );
        }
        let seen = drain(&mut events);
        assert_eq!(connections(&seen), 1, "{method}: {seen:?}");
    }
}

#[tokio::test]
async fn a_connection_the_upstream_closes_is_not_used_again() {
    // Announced: `connection: close`.
    let (addr, mut events) = upstream(
        "HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello",
        Close::AfterAnswer,
    )
    .await;
    let client = client();
    for _ in 0..3 {
        assert_eq!(
            get(&client, addr, Method::GET).await,
            (StatusCode::OK, "hello".into())
        );
    }
    let seen = drain(&mut events);
    assert_eq!(connections(&seen), 3, "{seen:?}");

    // Unannounced, while the connection is parked (an upstream's idle
    // timeout). A round trip to another upstream lets the proxy's event
    // loop take in the close before the next request is sent. The close
    // is then seen before the request goes out, so nothing is sent again:
    // a GET's connection (read by hand) is checked as it is taken, an
    // OPTIONS's (through hyper) as it is taken or when hyper hands the
    // request back unsent.
    for method in [Method::GET, Method::OPTIONS] {
        let (client, replays) = client_replaying_after(Duration::from_secs(3600));
        let idle_timeout = Arc::new(Notify::new());
        let (addr, mut events) = upstream(HELLO, Close::WhenTold(idle_timeout.clone())).await;
        let (elsewhere, _) = upstream(HELLO, Close::Never).await;
        assert_eq!(
            get(&client, addr, method.clone()).await,
            (StatusCode::OK, "hello".into())
        );
        idle_timeout.notify_one();
        events_until(&mut events, |e| *e == Seen::ClosedByUpstream(1)).await;
        assert_eq!(
            get(&client, elsewhere, method.clone()).await,
            (StatusCode::OK, "hello".into())
        );
        assert_eq!(
            get(&client, addr, method.clone()).await,
            (StatusCode::OK, "hello".into()),
            "{method}"
        );
        let seen = drain(&mut events);
        assert!(seen.contains(&Seen::Accepted(2)), "{method}: {seen:?}");
        assert_eq!(replays.get(), 0, "{method}");
    }
}

#[tokio::test]
async fn an_answer_that_ends_its_connection_closes_it_at_once() {
    // The upstream says so and keeps reading: only the proxy closes.
    for (answer, body) in [
        (
            "HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello",
            "hello",
        ),
        ("HTTP/1.1 204 No Content\r\nconnection: Close\r\n\r\n", ""),
        ("HTTP/1.0 200 OK\r\ncontent-length: 5\r\n\r\nhello", "hello"),
    ] {
        let (addr, mut events) = upstream(answer, Close::Never).await;
        let client = client();
        let (_, got) = get(&client, addr, Method::GET).await;
        assert_eq!(got, body);
        let closed = events_until(&mut events, |e| *e == Seen::ClosedByProxy(1));
        let seen = tokio::time::timeout(Duration::from_secs(10), closed)
            .await
            .unwrap_or_else(|_| panic!("{answer:?}: the connection was left open"));
        assert_eq!(connections(&seen), 1, "{seen:?}");
    }
}

#[tokio::test]
async fn a_keep_alive_answer_keeps_its_connection_open() {
    for answer in [
        "HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: keep-alive\r\n\r\nhello",
        "HTTP/1.0 200 OK\r\ncontent-length: 5\r\nconnection: keep-alive\r\n\r\nhello",
    ] {
        let (_, seen) = in_turn(answer, 3).await;
        assert_eq!(connections(&seen), 1, "{answer:?}: {seen:?}");
    }
}

#[tokio::test]
async fn an_answer_dropped_before_its_end_closes_its_connection() {
    let (addr, mut events) = upstream(
        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n",
        Close::Never,
    )
    .await;
    let client = client();
    let request = Request::get(format!("http://{addr}/"))
        .body(body::empty())
        .unwrap();
    let response = client.request(request).await.unwrap();
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(&first[..], b"hello");
    // The rest of the answer never came: the connection cannot carry
    // another request, and dropping the body closes it.
    drop(body);
    let seen = events_until(&mut events, |e| *e == Seen::ClosedByProxy(1)).await;
    assert!(seen.contains(&Seen::Accepted(1)), "{seen:?}");
}

#[tokio::test]
async fn an_answer_whose_rest_comes_later_wakes_its_reader() {
    // Half the body, then the rest only once the reader has the first half:
    // the reader must be woken by the connection it waits on.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let first_half_read = Arc::new(Notify::new());
    let told = first_half_read.clone();
    let (seen, mut events) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut connections = 0;
        while let Ok((mut stream, _)) = listener.accept().await {
            connections += 1;
            let _ = seen.send(Seen::Accepted(connections));
            let mut head = [0; 4096];
            while stream.read(&mut head).await.unwrap_or(0) > 0 {
                stream
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n6\r\nhello \r\n",
                    )
                    .await
                    .unwrap();
                told.notified().await;
                stream.write_all(b"5\r\nworld\r\n0\r\n\r\n").await.unwrap();
            }
        }
    });
    let client = client();
    for _ in 0..2 {
        let request = Request::get(format!("http://{addr}/"))
            .body(body::empty())
            .unwrap();
        let mut body = client.request(request).await.unwrap().into_body();
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&first[..], b"hello ");
        first_half_read.notify_one();
        let rest = tokio::time::timeout(Duration::from_secs(10), body.collect())
            .await
            .expect("the reader was woken for the rest")
            .unwrap()
            .to_bytes();
        assert_eq!(&rest[..], b"world");
    }
    assert_eq!(drain(&mut events), vec![Seen::Accepted(1)]);
}

/// An upstream that closes an idle connection just as a request arrives on
/// it: a safe request is sent again on a new connection, once the
/// connection had been parked long enough to have been closed as idle.
#[tokio::test]
async fn a_safe_request_meeting_an_idle_close_is_sent_again_on_a_new_connection() {
    let (addr, mut events) = upstream(HELLO, Close::AtSecondRequest).await;
    let (client, replays) = client_replaying_after(Duration::ZERO);
    for _ in 0..2 {
        assert_eq!(
            get(&client, addr, Method::GET).await,
            (StatusCode::OK, "hello".into())
        );
    }
    let seen = events_until(&mut events, |e| matches!(e, Seen::Request(2, _))).await;
    let requests: Vec<usize> = seen
        .iter()
        .filter_map(|e| match e {
            Seen::Request(n, head) if head.starts_with("GET /loki/api/v1/query_range?") => Some(*n),
            _ => None,
        })
        .collect();
    assert_eq!(requests, [1, 1, 2], "{seen:?}");
    assert!(seen.contains(&Seen::ClosedByUpstream(1)), "{seen:?}");
    assert_eq!(replays.get(), 1);
}

/// What cannot be sent again safely is not: a request with a body (a
/// push) or a method that writes (a silence's deletion, bodiless), or any
/// request on a connection reused too soon to have been closed as idle.
/// The caller gets the failure (a 502 or 503).
#[tokio::test]
async fn a_push_or_a_request_on_a_busy_connection_is_not_sent_again() {
    let push = |addr: SocketAddr| {
        Request::post(format!("http://{addr}/loki/api/v1/push"))
            .header("content-length", "5")
            .body(body::full(bytes::Bytes::from_static(b"lines")))
            .unwrap()
    };
    let delete = |addr: SocketAddr| {
        Request::delete(format!("http://{addr}/api/v2/silence/1"))
            .body(body::empty())
            .unwrap()
    };
    let (replaying, replays) = client_replaying_after(Duration::ZERO);
    let mut upstreams = Vec::new();
    for request in [push, delete] {
        let (addr, events) = upstream(HELLO, Close::AtSecondRequest).await;
        assert_eq!(
            exchange(&replaying, request(addr)).await.unwrap(),
            (StatusCode::OK, "hello".into())
        );
        let failed = exchange(&replaying, request(addr)).await;
        assert!(matches!(failed, Err(UpstreamError::Http(_))), "{failed:?}");
        upstreams.push(events);
    }

    let (busy_addr, busy_events) = upstream(HELLO, Close::AtSecondRequest).await;
    let (not_yet, not_yet_replays) = client_replaying_after(Duration::from_secs(3600));
    assert_eq!(
        get(&not_yet, busy_addr, Method::OPTIONS).await,
        (StatusCode::OK, "hello".into())
    );
    // Through hyper (an OPTIONS; a GET is read by hand and replayed from
    // the bytes it keeps, whenever its connection was reused).
    let request = Request::options(format!("http://{busy_addr}/")).body(body::empty());
    let failed = exchange(&not_yet, request.unwrap()).await;
    assert!(matches!(failed, Err(UpstreamError::Http(_))), "{failed:?}");

    upstreams.push(busy_events);
    for events in &mut upstreams {
        let seen = events_until(events, |e| *e == Seen::ClosedByUpstream(1)).await;
        let requests = seen
            .iter()
            .filter(|e| matches!(e, Seen::Request(..)))
            .count();
        assert_eq!(requests, 2, "{seen:?}");
        assert_eq!(connections(&drain(events)) + connections(&seen), 1);
    }
    assert_eq!((replays.get(), not_yet_replays.get()), (0, 0));
}

/// A reset is a close too: a safe request whose parked connection the
/// upstream resets as the request arrives is sent again on a new one, read
/// by hand (a GET) or through hyper (an OPTIONS).
#[tokio::test]
async fn a_safe_request_meeting_a_reset_is_sent_again_on_a_new_connection() {
    for method in [Method::GET, Method::OPTIONS] {
        let (addr, mut events) = upstream(HELLO, Close::ResetAtSecondRequest).await;
        let (client, replays) = client_replaying_after(Duration::ZERO);
        for _ in 0..2 {
            assert_eq!(
                get(&client, addr, method.clone()).await,
                (StatusCode::OK, "hello".into()),
                "{method}"
            );
        }
        let seen = events_until(&mut events, |e| matches!(e, Seen::Request(2, _))).await;
        assert!(
            seen.contains(&Seen::ClosedByUpstream(1)),
            "{method}: {seen:?}"
        );
        assert_eq!(connections(&seen), 2, "{method}: {seen:?}");
        assert_eq!(replays.get(), 1, "{method}");
    }
}

/// Only a close before any answer is sent again: an answer the proxy
/// cannot read is the upstream's answer, and the caller gets the failure
/// (a 502) after the one request, read by hand (a GET) or through hyper
/// (an OPTIONS).
#[tokio::test]
async fn a_request_answered_with_garbage_is_not_sent_again() {
    for method in [Method::GET, Method::OPTIONS] {
        let (addr, mut events) = upstream(HELLO, Close::GarbledSecondAnswer).await;
        let (client, replays) = client_replaying_after(Duration::ZERO);
        assert_eq!(
            get(&client, addr, method.clone()).await,
            (StatusCode::OK, "hello".into())
        );
        match exchange(&client, query(addr, method.clone())).await {
            Err(e @ UpstreamError::Plain(_)) if method == Method::GET => {
                assert_eq!(e.to_string(), AnswerError::MalformedHead.to_string());
            }
            Err(UpstreamError::Http(e)) if method == Method::OPTIONS => {
                assert!(e.is_parse(), "{e:?}");
            }
            other => panic!("{method}: {other:?}"),
        }
        // The proxy closes the connection it could not read; nothing else
        // reached the upstream.
        let seen = events_until(&mut events, |e| *e == Seen::ClosedByProxy(1)).await;
        let requests = seen
            .iter()
            .filter(|e| matches!(e, Seen::Request(..)))
            .count();
        assert_eq!((connections(&seen), requests), (1, 2), "{method}: {seen:?}");
        assert_eq!(replays.get(), 0, "{method}");
    }
}

/// A connection parked past `limits.upstream_idle_timeout` is closed by
/// the proxy with no request to notice it, for GETs (read by hand) and
/// other requests (through hyper) alike: an upstream that went quiet does
/// not keep sockets open.
#[tokio::test]
async fn a_connection_parked_past_the_idle_timeout_is_closed_unasked() {
    for method in [Method::GET, Method::OPTIONS] {
        let (addr, mut events) = upstream(HELLO, Close::Never).await;
        let reuse = Reuse::new(Duration::from_millis(30), Counter::default());
        let client = upstream::client(None, reuse, None).unwrap();
        assert_eq!(
            get(&client, addr, method.clone()).await,
            (StatusCode::OK, "hello".into())
        );
        let closed = events_until(&mut events, |e| *e == Seen::ClosedByProxy(1));
        tokio::time::timeout(Duration::from_secs(10), closed)
            .await
            .unwrap_or_else(|_| panic!("{method}: the idle connection was left open"));
    }
}

/// A server that knows an answer's length (hyper's, from
/// `Content-Length`) stops reading at its last byte and never asks for
/// the end, and never reads a 204's body at all. The connection must be
/// free for the next request all the same.
#[tokio::test]
async fn an_answer_read_to_its_length_frees_its_connection_unasked() {
    for (answer, length) in [(HELLO, 5), ("HTTP/1.1 204 No Content\r\n\r\n", 0)] {
        for method in [Method::GET, Method::OPTIONS] {
            let (addr, mut events) = upstream(answer, Close::Never).await;
            let client = client();
            for _ in 0..3 {
                let request = query(addr, method.clone());
                let mut body = client.request(request).await.unwrap().into_body();
                let mut read = 0;
                while read < length {
                    let frame = body.frame().await.unwrap().unwrap();
                    read += frame.into_data().unwrap().len();
                }
                assert!(body.is_end_stream(), "{method} {answer:?}");
            }
            let seen = drain(&mut events);
            assert_eq!(connections(&seen), 1, "{method} {answer:?}: {seen:?}");
        }
    }
}
