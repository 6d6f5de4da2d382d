//! Upstream fault drills: an upstream that drops the connection before
//! answering, in the middle of its response head, or in the middle of its
//! body, or that stalls past the timeout. The proxy answers as documented
//! (502 on queries, 503 on pushes so senders retry, 504 for a stall; a
//! truncated body is never passed off as complete: a query's ends in an
//! error, over HTTP/2 by resetting its stream alone, a push's becomes a
//! 503) and, once the upstream
//! behaves again, serves normally without a restart. A client that hangs
//! up mid-query has its upstream request cancelled. A keep-alive
//! connection the upstream closes as idle just as a request arrives costs
//! a query nothing (sent again, a posted one with its body) and a push a
//! 503 (never sent twice).

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Method, StatusCode};
use http_body_util::BodyExt;
use support::{basic, send, ProxyOptions, RunningProxy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc::UnboundedReceiver;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
enum Fault {
    Healthy,
    CloseBeforeAnswering,
    CloseInHead,
    CloseInBody,
    Stall,
    StallInBody,
    /// A 200 whose body is exactly the 1 MiB a push's answer is read up to.
    AnswerAtPushLimit,
    /// The same, one byte longer.
    AnswerOverPushLimit,
}

/// How much of a push's answer the proxy reads (docs/architecture.md).
const PUSH_ANSWER_LIMIT: usize = 1024 * 1024;

fn answer_of(length: usize) -> Vec<u8> {
    let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n");
    let mut reply = head.into_bytes();
    reply.resize(reply.len() + length, b'x');
    reply
}

/// An upstream whose next connections misbehave as told.
struct FaultyUpstream {
    addr: SocketAddr,
    fault: Arc<AtomicU8>,
}

impl FaultyUpstream {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let fault = Arc::new(AtomicU8::new(Fault::Healthy as u8));
        let shared = fault.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let fault = shared.load(Ordering::SeqCst);
                tokio::spawn(async move {
                    // The request head (and a small body) arrive in one read.
                    let mut buf = vec![0; 64 * 1024];
                    let _ = stream.read(&mut buf).await;
                    let long_answer;
                    let reply: &[u8] = match fault {
                        f if f == Fault::Healthy as u8 => {
                            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
                        }
                        f if f == Fault::AnswerAtPushLimit as u8 => {
                            long_answer = answer_of(PUSH_ANSWER_LIMIT);
                            &long_answer
                        }
                        f if f == Fault::AnswerOverPushLimit as u8 => {
                            long_answer = answer_of(PUSH_ANSWER_LIMIT + 1);
                            &long_answer
                        }
                        f if f == Fault::CloseInHead as u8 => b"HTTP/1.1 200 OK\r\nContent-Le",
                        f if f == Fault::CloseInBody as u8 => {
                            b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nConnection: close\r\n\r\n{\"partial"
                        }
                        f if f == Fault::Stall as u8 => {
                            tokio::time::sleep(Duration::from_secs(30)).await;
                            b""
                        }
                        f if f == Fault::StallInBody as u8 => {
                            let head = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{";
                            let _ = stream.write_all(head).await;
                            tokio::time::sleep(Duration::from_secs(30)).await;
                            b""
                        }
                        _ => b"",
                    };
                    let _ = stream.write_all(reply).await;
                    // Dropping the stream closes the connection.
                });
            }
        });
        Self { addr, fault }
    }

    fn set(&self, fault: Fault) {
        self.fault.store(fault as u8, Ordering::SeqCst);
    }
}

const QUERY: &str = "/loki/api/v1/query_range?query=%7Bapp%3D%22x%22%7D";
const PUSH: &str = "/loki/api/v1/push";

async fn query(proxy: &RunningProxy) -> StatusCode {
    support::get(&proxy.url(QUERY), &basic("alice", "alice-pw"))
        .await
        .status
}

const PUSHED: &str =
    r#"{"streams":[{"stream":{"app":"x"},"values":[["1700000000000000000","line"]]}]}"#;

async fn push(proxy: &RunningProxy) -> StatusCode {
    let credential = basic("pusher-a", "pusher-pw");
    post(proxy, PUSH, &credential, "application/json", PUSHED).await
}

async fn post(
    proxy: &RunningProxy,
    path: &str,
    credential: &str,
    content_type: &str,
    body: &'static str,
) -> StatusCode {
    let headers = [("content-type", content_type)];
    let url = proxy.url(path);
    send(Method::POST, &url, Some(credential), &headers, body)
        .await
        .status
}

/// A query as Grafana posts it: the parameters in a form body.
const POSTED_QUERY: &str = "/loki/api/v1/query_range";
const POSTED_FORM: &str = "query=%7Bapp%3D%22x%22%7D&limit=10";

async fn posted_query(proxy: &RunningProxy) -> StatusCode {
    let (credential, form) = (
        basic("alice", "alice-pw"),
        "application/x-www-form-urlencoded",
    );
    post(proxy, POSTED_QUERY, &credential, form, POSTED_FORM).await
}

#[tokio::test]
async fn upstream_faults_get_the_documented_status_and_the_proxy_recovers() {
    support::captured_logs();
    let upstream = FaultyUpstream::start().await;
    let mut options = ProxyOptions::new(format!("http://{}", upstream.addr));
    options.limits = "  upstream_timeout: 300ms\n";
    let proxy = RunningProxy::start(options).await;

    assert_eq!(query(&proxy).await, StatusCode::OK);
    for (fault, query_status, push_status) in [
        (
            Fault::CloseBeforeAnswering,
            StatusCode::BAD_GATEWAY,
            StatusCode::SERVICE_UNAVAILABLE,
        ),
        (
            Fault::CloseInHead,
            StatusCode::BAD_GATEWAY,
            StatusCode::SERVICE_UNAVAILABLE,
        ),
        (
            Fault::Stall,
            StatusCode::GATEWAY_TIMEOUT,
            StatusCode::GATEWAY_TIMEOUT,
        ),
    ] {
        upstream.set(fault);
        assert_eq!(query(&proxy).await, query_status, "{fault:?}, query");
        assert_eq!(push(&proxy).await, push_status, "{fault:?}, push");
        upstream.set(Fault::Healthy);
        assert_eq!(
            query(&proxy).await,
            StatusCode::OK,
            "recovered after {fault:?}"
        );
        assert_eq!(
            push(&proxy).await,
            StatusCode::OK,
            "recovered after {fault:?}"
        );
    }
    // A push answer that stalls after its head: 504 as well. (A query's
    // head is already on its way to the client by then: its body just
    // stops, as the upstream's did.)
    upstream.set(Fault::StallInBody);
    assert_eq!(push(&proxy).await, StatusCode::GATEWAY_TIMEOUT);
    upstream.set(Fault::Healthy);
    assert_eq!(push(&proxy).await, StatusCode::OK);
}

/// A push's answer is read whole, up to 1 MiB: one that long reaches the
/// sender as it came; a longer one is not an answer a push upstream gives,
/// and becomes a 503 the sender retries (never a 2xx cut short).
#[tokio::test]
async fn a_push_answer_is_read_up_to_its_limit_and_refused_beyond() {
    support::captured_logs();
    let upstream = FaultyUpstream::start().await;
    let proxy = RunningProxy::start(ProxyOptions::new(format!("http://{}", upstream.addr))).await;
    let credential = basic("pusher-a", "pusher-pw");
    let headers = [("content-type", "application/json")];

    upstream.set(Fault::AnswerAtPushLimit);
    let answer = send(
        Method::POST,
        &proxy.url(PUSH),
        Some(&credential),
        &headers,
        PUSHED,
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.body.len(), PUSH_ANSWER_LIMIT);

    upstream.set(Fault::AnswerOverPushLimit);
    assert_eq!(push(&proxy).await, StatusCode::SERVICE_UNAVAILABLE);
}

/// An answer that ends in an error within 10 s, before its head or, after
/// a 200 head, in its body: what a client must get when the upstream's
/// answer is cut off, never a short body passed off as complete.
async fn ends_in_an_error(
    answer: impl std::future::Future<Output = hyper::Result<http::Response<hyper::body::Incoming>>>,
) {
    let cut = async {
        let response = answer.await?;
        assert_eq!(response.status(), StatusCode::OK);
        response.into_body().collect().await
    };
    let answer = tokio::time::timeout(Duration::from_secs(10), cut).await;
    assert!(
        matches!(answer, Ok(Err(_))),
        "the cut-off answer ends in an error"
    );
}

#[tokio::test]
async fn an_answer_cut_off_by_the_upstream_is_never_passed_off_as_complete() {
    support::captured_logs();
    let upstream = FaultyUpstream::start().await;
    let proxy = RunningProxy::start(ProxyOptions::new(format!("http://{}", upstream.addr))).await;
    upstream.set(Fault::CloseInBody);

    // The client must see an error, never a short but "complete" body:
    // either the body ends in an error after a forwarded 200 head, or, when
    // the cut arrives with the head, the answer breaks off before its head
    // has left the proxy.
    let stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    let request = http::Request::get(QUERY)
        .header("host", "proxy")
        .header("authorization", basic("alice", "alice-pw"))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    ends_in_an_error(sender.send_request(request)).await;
    // A push's answer is read whole before the sender gets one: a cut-off
    // answer is a 503 it retries, on a connection that stays usable.
    assert_eq!(push(&proxy).await, StatusCode::SERVICE_UNAVAILABLE);

    upstream.set(Fault::Healthy);
    assert_eq!(query(&proxy).await, StatusCode::OK);
    assert_eq!(push(&proxy).await, StatusCode::OK);
}

/// Over HTTP/2 the cut-off answer ends its own stream in an error, and the
/// connection lives on: Grafana's other panel queries, multiplexed on it,
/// are not lost with it. Checked on the same connection, once before
/// (that the connection works) and once after the cut.
#[tokio::test]
async fn over_http2_an_answer_cut_off_resets_its_stream_not_the_connection() {
    support::captured_logs();
    let upstream = FaultyUpstream::start().await;
    let proxy = RunningProxy::start(ProxyOptions::new(format!("http://{}", upstream.addr))).await;
    let stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    let connection = tokio::spawn(connection);
    let request = || {
        http::Request::get(proxy.url(QUERY))
            .header("authorization", basic("alice", "alice-pw"))
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap()
    };
    let whole = async |response: http::Response<hyper::body::Incoming>| {
        (response.status(), response.into_body().collect().await)
    };

    let response = sender.send_request(request()).await.unwrap();
    let (status, body) = whole(response).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body.unwrap().to_bytes(), "{}");

    upstream.set(Fault::CloseInBody);
    ends_in_an_error(sender.send_request(request())).await;

    upstream.set(Fault::Healthy);
    let response = sender.send_request(request()).await.unwrap();
    let (status, body) = whole(response).await;
    assert_eq!(status, StatusCode::OK, "the same connection still serves");
    assert_eq!(body.unwrap().to_bytes(), "{}");
    assert!(!connection.is_finished());
}

/// A client that hangs up while its query waits for the upstream (Grafana
/// cancelling a panel's query): the proxy notices and closes its upstream
/// connection, so the backend can stop working on the query.
#[tokio::test]
async fn a_client_that_hangs_up_mid_query_has_its_upstream_request_cancelled() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (arrived_tx, arrived) = tokio::sync::oneshot::channel();
    let (closed_tx, closed) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut buf = vec![0; 64 * 1024];
        let _ = stream.read(&mut buf).await;
        let _ = arrived_tx.send(());
        // Never answers: the next read ends only when the proxy closes.
        let read = stream.read(&mut buf).await;
        let _ = closed_tx.send(matches!(read, Ok(0) | Err(_)));
    });
    let mut options = ProxyOptions::new(format!("http://{addr}"));
    // Far beyond the test's bounds: a close can only come from the hang-up.
    options.limits = "  upstream_timeout: 300s\n";
    let proxy = RunningProxy::start(options).await;

    let mut client = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let head = format!(
        "GET {QUERY} HTTP/1.1\r\nhost: proxy\r\nauthorization: {}\r\n\r\n",
        basic("alice", "alice-pw")
    );
    client.write_all(head.as_bytes()).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), arrived)
        .await
        .expect("the query reaches the upstream")
        .unwrap();
    drop(client);
    let closed = tokio::time::timeout(Duration::from_secs(10), closed)
        .await
        .expect("the upstream connection is closed once the client has hung up")
        .unwrap();
    assert!(closed, "closed, with nothing more sent");
}

/// A request as an upstream saw it: (connection, request line, body).
type Arrived = (usize, String, String);

/// An upstream that answers the first request of each connection and
/// closes it, unanswered, on the second: an idle timeout firing as the
/// request arrives. Reports every request that arrived.
async fn closing_each_second_request() -> (SocketAddr, UnboundedReceiver<Arrived>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (seen_tx, seen) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut connections = 0;
        while let Ok((mut stream, _)) = listener.accept().await {
            connections += 1;
            let (n, seen_tx) = (connections, seen_tx.clone());
            tokio::spawn(async move {
                // Each request (head and a small body) arrives in one read.
                let mut buf = vec![0; 64 * 1024];
                for request in 1.. {
                    let read = stream.read(&mut buf).await.unwrap_or(0);
                    if read == 0 {
                        return;
                    }
                    let text = String::from_utf8_lossy(&buf[..read]);
                    let line = text.lines().next().unwrap_or_default().to_owned();
                    let body = text.split_once("\r\n\r\n").unwrap_or_default().1;
                    let _ = seen_tx.send((n, line, body.to_owned()));
                    if request == 2 {
                        return; // closed unanswered
                    }
                    let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}";
                    stream.write_all(answer).await.unwrap();
                }
            });
        }
    });
    (addr, seen)
}

/// The first `count` requests the upstream reports.
async fn arrived(seen: &mut UnboundedReceiver<Arrived>, count: usize) -> Vec<Arrived> {
    let mut requests = Vec::new();
    while requests.len() < count {
        let next = tokio::time::timeout(Duration::from_secs(10), seen.recv()).await;
        let next = next.unwrap_or_else(|_| panic!("the upstream saw only {requests:?}"));
        requests.push(next.unwrap());
    }
    requests
}

/// hyper's client sends a request again only on a connection idle for a
/// second or more (`upstream::Reuse`): a connection is left that long
/// before its second request. Not a wait for anything to happen.
async fn idle() {
    tokio::time::sleep(Duration::from_millis(1100)).await;
}

/// An upstream that closes a keep-alive connection as idle just when the
/// proxy sends the next request on it (the upstream's idle timeout, or an
/// nginx's in front of it, firing as the request travels): a query is sent
/// again on a new connection and answered, a query posted as a form too
/// (with its body), a push is not sent twice and gets 503, which its
/// sender retries.
#[tokio::test]
async fn a_query_meeting_an_idle_close_is_answered_and_a_push_is_not_sent_twice() {
    let (addr, mut seen) = closing_each_second_request().await;
    let proxy = RunningProxy::start(ProxyOptions::new(format!("http://{addr}"))).await;

    // Queries and pushes travel on connections of their own (a bodiless
    // GET is written by hand, upstream/plain.rs; the push through hyper).
    assert_eq!(query(&proxy).await, StatusCode::OK);
    assert_eq!(query(&proxy).await, StatusCode::OK, "sent again");
    assert_eq!(push(&proxy).await, StatusCode::OK);
    idle().await;
    assert_eq!(push(&proxy).await, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(query(&proxy).await, StatusCode::OK, "sent again");
    // Grafana posts its queries as forms: through hyper's client, as the
    // push went, so once more after a second of idleness.
    assert_eq!(posted_query(&proxy).await, StatusCode::OK);
    idle().await;
    assert_eq!(posted_query(&proxy).await, StatusCode::OK, "sent again");

    let requests = arrived(&mut seen, 10).await;
    let query_line = format!("GET {QUERY} HTTP/1.1");
    let push_line = format!("POST {PUSH} HTTP/1.1");
    let posted_line = format!("POST {POSTED_QUERY} HTTP/1.1");
    let expected = [
        (1, &query_line, ""),
        (1, &query_line, ""), // closed unanswered
        (2, &query_line, ""), // the same query, on a new connection
        (3, &push_line, PUSHED),
        (3, &push_line, PUSHED), // closed unanswered: not sent again
        (2, &query_line, ""),    // closed unanswered
        (4, &query_line, ""),    // sent again
        (5, &posted_line, POSTED_FORM),
        (5, &posted_line, POSTED_FORM), // closed unanswered
        (6, &posted_line, POSTED_FORM), // sent again, body and all
    ];
    let requests: Vec<(usize, &String, &str)> = requests
        .iter()
        .map(|(n, l, b)| (*n, l, b.as_str()))
        .collect();
    assert_eq!(requests, expected);
    let metrics = proxy.metrics().await;
    assert!(
        metrics.contains("tenant_proxy_upstream_replays_total 3\n"),
        "{metrics}"
    );
}

/// Label mode: a PromQL query posted as a form is rewritten, and what
/// meets an idle close is sent again as rewritten, body and all.
#[tokio::test]
async fn a_posted_query_rewritten_in_label_mode_is_sent_again_as_rewritten() {
    let (addr, mut seen) = closing_each_second_request().await;
    let section = format!("  upstream: http://{addr}\n  mode: label\n");
    let proxy = RunningProxy::start(ProxyOptions::metrics(support::two_tenants(), section)).await;
    let (credential, form) = (
        basic("alice", "alice-pw"),
        "application/x-www-form-urlencoded",
    );
    let posted = || post(&proxy, "/api/v1/query", &credential, form, "query=up");
    assert_eq!(posted().await, StatusCode::OK);
    idle().await;
    assert_eq!(posted().await, StatusCode::OK, "sent again");

    let requests = arrived(&mut seen, 3).await;
    let connections: Vec<usize> = requests.iter().map(|(n, _, _)| *n).collect();
    assert_eq!(connections, [1, 1, 2], "{requests:?}");
    let line = "POST /api/v1/query HTTP/1.1";
    for (_, request_line, body) in &requests {
        assert_eq!(request_line, line);
        assert_eq!(
            body, &requests[0].2,
            "every copy carries the rewritten body"
        );
    }
    assert!(requests[0].2.contains("team-a"), "{requests:?}");
    assert!(
        proxy
            .metrics()
            .await
            .contains("tenant_proxy_upstream_replays_total 1\n"),
        "one request sent again"
    );
}
