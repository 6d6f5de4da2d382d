//! Admission limits end to end: per-tenant request rate, concurrency and
//! push bytes (429 with Retry-After), the global concurrency limit (503),
//! and slow request bodies (408), against the Loki stand-in; connection
//! limits; and what the kernel's buffers hold for a peer that stops
//! reading (read from /proc/net/tcp).

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Method, StatusCode};
use support::loki::LokiStandIn;
use support::{basic, eventually, get, send, ProxyOptions, RunningProxy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{oneshot, Notify};

const QUERY: &str = "/loki/api/v1/query_range?query=%7Bapp%3D%22x%22%7D&limit=10";
const PUSH: &str = "/loki/api/v1/push";

async fn start(limits: &'static str, extra: &'static str) -> (LokiStandIn, RunningProxy) {
    support::captured_logs();
    let loki = LokiStandIn::start().await;
    let mut options = ProxyOptions::new(loki.url());
    options.limits = limits;
    options.extra = extra;
    (loki, RunningProxy::start(options).await)
}

fn retry_after(reply: &support::Reply) -> u64 {
    reply.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// A request the upstream holds for `stall_ms`, returned once it is there.
async fn held_at_upstream(
    proxy: &RunningProxy,
    loki: &LokiStandIn,
    user: (&str, &str),
) -> tokio::task::JoinHandle<support::Reply> {
    let (url, auth) = (proxy.url(QUERY), basic(user.0, user.1));
    let before = loki.received().len();
    let held = tokio::spawn(async move {
        send(
            Method::GET,
            &url,
            Some(&auth),
            &[("x-test-stall-ms", "2000")],
            "",
        )
        .await
    });
    loki.wait_for_requests(before + 1).await;
    held
}

async fn push(proxy: &RunningProxy, auth: &str, body: &str) -> support::Reply {
    let json = [("content-type", "application/json")];
    send(
        Method::POST,
        &proxy.url(PUSH),
        Some(auth),
        &json,
        body.to_owned(),
    )
    .await
}

#[tokio::test]
async fn a_tenant_over_its_query_rate_gets_429_and_others_do_not() {
    let (loki, proxy) = start(
        "",
        "tenant_limits:\n  default:\n    query: {requests_per_second: 0.1, burst: 2}\n",
    )
    .await;
    let alice = basic("alice", "alice-pw");
    for _ in 0..2 {
        assert_eq!(get(&proxy.url(QUERY), &alice).await.status, StatusCode::OK);
    }
    let refused = get(&proxy.url(QUERY), &alice).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        (1..=10).contains(&retry_after(&refused)),
        "{:?}",
        refused.headers
    );
    assert_eq!(refused.json()["errorType"], "unavailable");
    assert!(refused.text().contains("rate limit"), "{}", refused.text());
    assert_eq!(
        get(&proxy.url(QUERY), &basic("bob", "bob-pw")).await.status,
        StatusCode::OK,
        "team-b has its own allowance"
    );
    let team_a = loki
        .received()
        .iter()
        .filter(|r| r.org_ids() == ["team-a"])
        .count();
    assert_eq!(team_a, 2, "the refused query never reached Loki");
    let metrics = proxy.metrics().await;
    assert!(
        metrics.contains(
            r#"tenant_proxy_limited_total{tenant="team-a",surface="logs_query",limit="rate"} 1"#
        ),
        "{metrics}"
    );
}

#[tokio::test]
async fn concurrent_queries_beyond_the_tenant_limit_get_429_until_one_finishes() {
    let (loki, proxy) = start(
        "",
        "tenant_limits:\n  default:\n    query: {concurrency: 1}\n",
    )
    .await;
    let held = held_at_upstream(&proxy, &loki, ("alice", "alice-pw")).await;
    let alice = basic("alice", "alice-pw");
    let refused = get(&proxy.url(QUERY), &alice).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after(&refused), 1);
    assert_eq!(held.await.unwrap().status, StatusCode::OK);
    assert_eq!(get(&proxy.url(QUERY), &alice).await.status, StatusCode::OK);
}

/// An upstream whose first answer comes in two halves: the head and the
/// first half at once, the rest once `rest` is notified. Later answers
/// come whole.
async fn first_answer_held_halfway(answer: &'static str) -> (String, Arc<Notify>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let rest = Arc::new(Notify::new());
    let release = rest.clone();
    tokio::spawn(async move {
        let mut first = true;
        while let Ok((mut stream, _)) = listener.accept().await {
            let hold = std::mem::take(&mut first).then(|| release.clone());
            tokio::spawn(async move {
                // The request head arrives in one read.
                let _ = stream.read(&mut [0; 16 * 1024]).await;
                let (half, rest) = answer.split_at(answer.len() / 2);
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{half}",
                    answer.len()
                );
                let _ = stream.write_all(head.as_bytes()).await;
                if let Some(release) = hold {
                    release.notified().await;
                }
                let _ = stream.write_all(rest.as_bytes()).await;
            });
        }
    });
    (url, rest)
}

#[tokio::test]
async fn a_query_holds_its_concurrency_slot_until_its_answer_is_sent() {
    support::captured_logs();
    const ANSWER: &str = r#"{"status":"success","data":{"result":[]}}"#;
    let (upstream, rest) = first_answer_held_halfway(ANSWER).await;
    let mut options = ProxyOptions::new(upstream);
    options.extra = "tenant_limits:\n  default:\n    query: {concurrency: 1}\n";
    let proxy = RunningProxy::start(options).await;
    let alice = basic("alice", "alice-pw");
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let request = http::Request::get(proxy.url(QUERY))
        .header("authorization", &alice)
        .body(http_body_util::Empty::new())
        .unwrap();
    let first = client.request(request).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK, "the head is through");
    assert_eq!(
        get(&proxy.url(QUERY), &alice).await.status,
        StatusCode::TOO_MANY_REQUESTS,
        "the answer still being sent holds the only slot"
    );
    rest.notify_one();
    use http_body_util::BodyExt;
    let body = first.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, ANSWER.as_bytes(), "the answer arrives whole");
    // The slot frees once the proxy is done with the body, which it may
    // notice just after the client has read its end.
    eventually(
        "the slot is released",
        Duration::from_secs(10),
        async || {
            let next = get(&proxy.url(QUERY), &alice).await;
            if next.status == StatusCode::OK {
                assert_eq!(next.text(), ANSWER, "and so does the next");
                return true;
            }
            assert_eq!(next.status, StatusCode::TOO_MANY_REQUESTS);
            false
        },
    )
    .await;
}

#[tokio::test]
async fn a_live_tail_counts_against_concurrency_while_it_streams() {
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let (_loki, proxy) = start(
        "",
        "tenant_limits:\n  default:\n    query: {concurrency: 1}\n",
    )
    .await;
    let alice = basic("alice", "alice-pw");
    let url = format!(
        "ws://{}/loki/api/v1/tail?query=%7Bapp%3D%22x%22%7D",
        proxy.addr
    );
    let mut request = url.into_client_request().unwrap();
    request
        .headers_mut()
        .insert("authorization", alice.parse().unwrap());
    let (mut tail, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    assert!(tail.next().await.is_some(), "the tail streams");
    assert_eq!(
        get(&proxy.url(QUERY), &alice).await.status,
        StatusCode::TOO_MANY_REQUESTS,
        "the open tail holds the only slot"
    );
    drop(tail);
    // The slot frees when the proxy notices the closed stream.
    eventually(
        "the slot is released",
        Duration::from_secs(10),
        async || get(&proxy.url(QUERY), &alice).await.status == StatusCode::OK,
    )
    .await;
}

#[tokio::test]
async fn pushes_beyond_the_byte_rate_wait_for_the_overdraft() {
    let (loki, proxy) = start(
        "",
        "tenant_limits:\n  default:\n    push: {bytes_per_second: 1000}\n  overrides:\n    team-b:\n      push: {}\n",
    )
    .await;
    let line = "x".repeat(2900);
    let body = format!(
        r#"{{"streams":[{{"stream":{{"app":"x"}},"values":[["1700000000000000000","{line}"]]}}]}}"#
    );
    let pusher = basic("pusher-a", "pusher-pw");
    let first = push(&proxy, &pusher, &body).await;
    assert_eq!(first.status, StatusCode::NO_CONTENT, "within the allowance");
    let second = push(&proxy, &pusher, &body).await;
    assert_eq!(second.status, StatusCode::TOO_MANY_REQUESTS);
    // About 2,000 bytes of debt at 1,000 bytes per second.
    assert!(
        (2..=3).contains(&retry_after(&second)),
        "{:?}",
        second.headers
    );
    let bob = basic("bob", "bob-pw");
    for _ in 0..3 {
        let reply = push(&proxy, &bob, &body).await;
        assert_eq!(
            reply.status,
            StatusCode::NO_CONTENT,
            "team-b is overridden: unlimited"
        );
    }
    assert_eq!(loki.received().len(), 4);
}

#[tokio::test]
async fn the_global_limit_answers_503_with_retry_after() {
    let (loki, proxy) = start("  max_concurrent_requests: 1\n", "").await;
    let held = held_at_upstream(&proxy, &loki, ("alice", "alice-pw")).await;
    let refused = get(&proxy.url(QUERY), &basic("bob", "bob-pw")).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(retry_after(&refused), 1);
    assert_eq!(held.await.unwrap().status, StatusCode::OK);
    assert_eq!(
        get(&proxy.url(QUERY), &basic("bob", "bob-pw")).await.status,
        StatusCode::OK
    );
    let metrics = proxy.metrics().await;
    assert!(
        metrics.contains(r#"limit="global_concurrency"} 1"#),
        "{metrics}"
    );
}

/// An HTTP/2 connection carries up to 200 requests at once: the global
/// limit counts each of its streams, so one connection holds no more than
/// the limit however many it opens.
#[tokio::test]
async fn the_global_limit_counts_each_stream_of_an_http2_connection() {
    let (loki, proxy) = start("  max_concurrent_requests: 2\n", "").await;
    let tcp = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    let connection = tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let query = |stall_ms: &str| {
        http::Request::get(proxy.url(QUERY))
            .header("authorization", basic("alice", "alice-pw"))
            .header("x-test-stall-ms", stall_ms)
            .body(())
            .unwrap()
    };
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(client.send_request(query("2000"), true).unwrap().0);
        client = client.ready().await.unwrap();
    }
    loki.wait_for_requests(2).await;

    let (refused, _) = client.send_request(query("0"), true).unwrap();
    let refused = refused.await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.headers()["retry-after"], "1");
    assert_eq!(loki.received().len(), 2, "the third never reached Loki");
    let metrics = proxy.metrics().await;
    assert!(
        metrics.contains(r#"limit="global_concurrency"} 1"#),
        "{metrics}"
    );

    for answer in held {
        assert_eq!(answer.await.unwrap().status(), StatusCode::OK);
    }
    // A stream's slot is given back as its answer's end is sent, which
    // the client may see first.
    eventually("a slot given back", Duration::from_secs(5), async || {
        client = client.clone().ready().await.unwrap();
        let (answer, _) = client.send_request(query("0"), true).unwrap();
        answer.await.unwrap().status() == StatusCode::OK
    })
    .await;
    drop(client);
    connection.abort();
}

/// What the proxy answers a client that promises `promised` bytes of body,
/// sends `sent`, then nothing; the proxy must answer and close.
async fn stopped_mid_body(
    proxy: &RunningProxy,
    path: &str,
    content_type: &str,
    promised: usize,
    sent: &str,
) -> String {
    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: {}\r\n\
         Content-Type: {content_type}\r\nContent-Length: {promised}\r\n\r\n{sent}",
        basic("alice", "alice-pw")
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut reply = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut reply)).await;
    assert!(read.is_ok(), "the proxy answered and closed");
    String::from_utf8_lossy(&reply).into_owned()
}

#[tokio::test]
async fn a_body_that_does_not_arrive_in_time_gets_408_and_nothing_reaches_loki() {
    let (loki, proxy) = start("  body_read_timeout: 300ms\n", "").await;
    let form = "application/x-www-form-urlencoded";
    let reply = stopped_mid_body(&proxy, "/loki/api/v1/query_range", form, 100, "query=%7Ba").await;
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(loki.received().is_empty());
}

#[tokio::test]
async fn a_push_streamed_to_loki_that_stops_mid_body_gets_408_and_loki_never_gets_it_whole() {
    let (loki, proxy) = start("  body_read_timeout: 300ms\n", "").await;
    // A push is streamed to Loki as it arrives: Loki has the head and the
    // first bytes when the client stops sending.
    let promised = 200;
    let json = "application/json";
    let reply = stopped_mid_body(&proxy, PUSH, json, promised, r#"{"streams":["#).await;
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    // The stand-in records a request once its body ends, here cut short.
    loki.wait_for_requests(1).await;
    let received = loki.received();
    assert_eq!(received[0].path, PUSH, "the push was streamed");
    assert!(
        received.iter().all(|r| r.body.len() < promised),
        "Loki never read a whole body"
    );
}

/// `two_tenants()` with limits on team-a's and team-b's queries (a burst of
/// `burst`, refilled too slowly to matter here) and `replicas`.
fn tenants_with_limits(replicas: u32, burst_a: u32, burst_b: u32) -> String {
    let limits =
        |burst| format!("    limits: {{query: {{requests_per_second: 0.0001, burst: {burst}}}}}\n");
    support::two_tenants()
        .replacen(
            "tenants:\n",
            &format!("replicas: {replicas}\ntenants:\n"),
            1,
        )
        .replacen(
            "  - id: team-a\n",
            &format!("  - id: team-a\n{}", limits(burst_a)),
            1,
        )
        .replacen(
            "  - id: team-b\n",
            &format!("  - id: team-b\n{}", limits(burst_b)),
            1,
        )
}

async fn admitted(proxy: &RunningProxy, auth: &str, attempts: usize) -> usize {
    let mut ok = 0;
    for _ in 0..attempts {
        match get(&proxy.url(QUERY), auth).await.status {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("unexpected {other}"),
        }
    }
    ok
}

/// Limits from the tenants file (tenant-sync writes them from Namespace
/// annotations), in `global` scope: each of two replicas admits its half
/// of a burst of 10, together the 10; a reload that changes the replica
/// count re-divides, and one that changes a tenant's limits rebuilds that
/// tenant's state only (team-b's spent burst stays spent).
#[tokio::test]
async fn limits_from_the_tenants_file_are_shared_by_the_replicas_and_follow_reloads() {
    let loki = LokiStandIn::start().await;
    let start = || {
        let mut options = ProxyOptions::new(loki.url());
        options.tenants = Some(tenants_with_limits(2, 10, 4));
        options.extra = "tenant_limits:\n  scope: global\n";
        RunningProxy::start(options)
    };
    let (mut one, two) = (start().await, start().await);
    let (alice, bob) = (basic("alice", "alice-pw"), basic("bob", "bob-pw"));
    assert_eq!(admitted(&one, &alice, 8).await, 5);
    assert_eq!(admitted(&two, &alice, 8).await, 5);
    assert_eq!(
        admitted(&one, &bob, 1).await,
        1,
        "team-b: 2 of 4 on this replica"
    );
    let shown = one.metrics().await;
    for line in [
        "tenant_proxy_limit_replicas 2",
        r#"tenant_proxy_tenant_limit{tenant="team-a",kind="query",limit="burst"} 5.0"#,
        r#"tenant_proxy_tenant_limit{tenant="team-b",kind="query",limit="burst"} 2.0"#,
    ] {
        assert!(shown.lines().any(|l| l == line), "{line} in:\n{shown}");
    }

    // One replica left: the whole burst is this replica's, anew.
    let status = one.rewrite_tenants(&tenants_with_limits(1, 10, 4)).await;
    assert_eq!(status.last_error, None);
    assert_eq!(admitted(&one, &alice, 12).await, 10);
    assert_eq!(
        admitted(&one, &bob, 5).await,
        4,
        "team-b re-divided too: a fresh 4"
    );

    // team-a's limit raised: its state is rebuilt, team-b's is kept.
    let status = one.rewrite_tenants(&tenants_with_limits(1, 20, 4)).await;
    assert_eq!(status.last_error, None);
    assert_eq!(admitted(&one, &alice, 25).await, 20);
    assert_eq!(
        admitted(&one, &bob, 3).await,
        0,
        "team-b's bucket is the same, spent"
    );
}

/// Reads until a response head (or the end) has come; `None` if nothing
/// came in time.
async fn answered(stream: &mut tokio::net::TcpStream, within: Duration) -> Option<String> {
    let mut head = vec![0; 4096];
    let n = tokio::time::timeout(within, stream.read(&mut head))
        .await
        .ok()?
        .unwrap();
    Some(String::from_utf8_lossy(&head[..n]).into_owned())
}

/// A query over a connection of its own, answered; the connection is kept
/// open (idle, holding a slot) for the caller.
async fn connection_after_one_query(proxy: &RunningProxy, request: &str) -> tokio::net::TcpStream {
    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let head = answered(&mut stream, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    stream
}

fn query_request() -> String {
    format!(
        "GET {QUERY} HTTP/1.1\r\nHost: p\r\nAuthorization: {}\r\n\r\n",
        basic("alice", "alice-pw")
    )
}

#[tokio::test]
async fn connections_beyond_the_limit_wait_until_one_ends() {
    let (loki, proxy) = start("  max_connections: 2\n", "").await;
    let request = query_request();
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(connection_after_one_query(&proxy, &request).await);
    }
    // The third connects (the kernel's backlog takes it) but is not served.
    let mut third = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    third.write_all(request.as_bytes()).await.unwrap();
    assert_eq!(
        answered(&mut third, Duration::from_millis(500)).await,
        None,
        "not served while two connections are open"
    );
    assert_eq!(loki.received().len(), 2);
    let logs = String::from_utf8_lossy(&support::captured_logs().lock().unwrap()).into_owned();
    assert!(logs.contains("connection limit reached"), "{logs}");
    let metrics = proxy.metrics().await;
    for line in [
        "tenant_proxy_client_connections 2",
        "tenant_proxy_connection_limit 2",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in {metrics}");
    }
    // One ends: the third is taken in and answered.
    drop(held.remove(0));
    let head = answered(&mut third, Duration::from_secs(10)).await.unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(loki.received().len(), 3);
}

/// One address holds at most its cap of connections: one more from it is
/// closed on arrival, unread, while another address is still served; a
/// connection that ends gives the address its slot back.
#[tokio::test]
async fn connections_beyond_the_cap_per_address_are_closed_on_arrival() {
    let (loki, proxy) = start("  max_connections_per_address: 2\n", "").await;
    let request = query_request();
    let mut held = vec![
        connection_after_one_query(&proxy, &request).await,
        connection_after_one_query(&proxy, &request).await,
    ];
    let mut third = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    assert_eq!(
        answered(&mut third, Duration::from_secs(10)).await,
        Some(String::new()),
        "closed on arrival (the end of the stream, no answer)"
    );
    // All of 127.0.0.0/8 is loopback: another address on this host.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let mut other = socket.connect(proxy.addr).await.unwrap();
    other.write_all(request.as_bytes()).await.unwrap();
    let head = answered(&mut other, Duration::from_secs(10)).await.unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "another address: {head}");
    assert_eq!(loki.received().len(), 3, "the refused one reached nothing");
    let metrics = proxy.metrics().await;
    for line in [
        "tenant_proxy_client_connections_refused_total 1",
        "tenant_proxy_client_connections 3",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in {metrics}");
    }
    let logs = String::from_utf8_lossy(&support::captured_logs().lock().unwrap()).into_owned();
    assert!(
        logs.contains("further ones from it are closed on arrival") && logs.contains("127.0.0.1"),
        "{logs}"
    );
    // The admin listener's clients are the platform's probes and scraper:
    // the same address opens more there than its cap, each answered.
    let mut probes = Vec::new();
    for _ in 0..3 {
        let mut probe = tokio::net::TcpStream::connect(proxy.admin_addr)
            .await
            .unwrap();
        probe
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: p\r\n\r\n")
            .await
            .unwrap();
        let head = answered(&mut probe, Duration::from_secs(10)).await.unwrap();
        assert!(head.starts_with("HTTP/1.1 200"), "admin: {head}");
        probes.push(probe);
    }

    // One ends; once the proxy has seen it go (the gauge, which drops after
    // the address's count), the address may open another.
    drop(held.remove(0));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !proxy
        .metrics()
        .await
        .lines()
        .any(|l| l == "tenant_proxy_client_connections 2")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the connection's end was noticed"
        );
        tokio::task::yield_now().await;
    }
    held.push(connection_after_one_query(&proxy, &request).await);
    assert_eq!(loki.received().len(), 4);
}

/// A full listener shortens the quiet period to an eighth (here 16 s to
/// 2 s): an idle connection is closed within 2-4 s to let a waiting one
/// in, where nothing would close for 16 s otherwise.
#[tokio::test]
async fn a_full_listener_closes_idle_connections_sooner() {
    let (loki, proxy) = start("  max_connections: 2\n  header_read_timeout: 16s\n", "").await;
    let request = query_request();
    let mut held = vec![
        connection_after_one_query(&proxy, &request).await,
        connection_after_one_query(&proxy, &request).await,
    ];
    let mut third = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    third.write_all(request.as_bytes()).await.unwrap();
    let head = answered(&mut third, Duration::from_secs(12))
        .await
        .expect("answered before the whole quiet period passed");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(loki.received().len(), 3);
    // An idle one made room: the proxy closed it (a read sees the end).
    let mut closed = 0;
    for stream in &mut held {
        if answered(stream, Duration::from_millis(100)).await == Some(String::new()) {
            closed += 1;
        }
    }
    assert!(closed >= 1, "an idle connection was closed");
}

/// Answers a client leaves unread wait in the proxy, not in the kernel's
/// buffers: requests without a credential, pipelined, their 401s never
/// read. Unbounded, the proxy's send buffer grows to `tcp_wmem`'s maximum
/// (4 MiB by default) on every such connection, memory a cgroup v2 charges
/// to the pod (docs/operations.md, "Memory at worst").
#[tokio::test]
async fn answers_a_client_does_not_read_queue_little_in_the_kernel() {
    let (_loki, proxy) = start("", "").await;
    let most_queued = pipelined_401s_unread(&proxy, |to_send, _| to_send).await;
    assert_within_the_unsent_bound(most_queued, "the client");
}

/// The requests such a client sends on while its answers wait are not
/// read either: they wait in the client connection's kernel receive
/// buffer, which `limits.client_receive_buffer_bytes` fixes (unset, the
/// kernel's, about 100 KiB measured here, grown with the pace).
#[tokio::test]
async fn requests_sent_while_answers_wait_queue_in_a_buffer_of_the_configured_size() {
    let (_loki, proxy) = start("  client_receive_buffer_bytes: 16384\n", "").await;
    let most_received = pipelined_401s_unread(&proxy, |_, received| received).await;
    assert!(most_received > 0, "no request waited in the kernel");
    // The kernel doubles what it is given, for its own overhead.
    assert!(
        most_received <= 2 * 16384,
        "{most_received} bytes received from the client and not read, more than twice the buffer"
    );
}

/// Pipelines requests without a credential on a connection whose client
/// reads none of the 401s, until it can send no more, and returns the most
/// `probe` read from the proxy's side of it (bytes to send, bytes received
/// and not read) on the way.
async fn pipelined_401s_unread(proxy: &RunningProxy, probe: fn(u64, u64) -> u64) -> u64 {
    let client = client_reading_nothing(proxy).await;
    let client_port = client.local_addr().unwrap().port();
    let (_unread, mut writer) = client.into_split();
    let written = Arc::new(AtomicU64::new(0));
    let counted = written.clone();
    let sending = tokio::spawn(async move {
        let requests = b"GET /loki/api/v1/labels HTTP/1.1\r\nhost: proxy\r\n\r\n".repeat(100);
        // 40 MB at most, far more than every buffer on the way holds.
        for _ in 0..8_000 {
            if writer.write_all(&requests).await.is_err() {
                return;
            }
            counted.fetch_add(requests.len() as u64, Ordering::Relaxed);
        }
    });
    // Until the client can send no more: the proxy reads no more, its
    // answers waiting.
    let (most, _) = most_until_still(&written, || {
        socket_queues(Some(proxy.addr.port()), client_port)
            .map_or(0, |(to_send, received)| probe(to_send, received))
    })
    .await;
    sending.abort();
    most
}

/// Beyond what the proxy holds itself, an answer whose client stops
/// reading waits in its upstream connection's kernel receive buffer,
/// which the kernel would grow with the answer's pace:
/// `limits.upstream_receive_buffer_bytes` fixes its size, on the
/// connections the proxy reads by hand (a Loki `GET`) and on hyper's (a
/// query posted as a form, in header mode).
#[tokio::test]
async fn an_unread_answer_waits_upstream_in_a_buffer_of_the_configured_size() {
    support::captured_logs();
    let auth = basic("alice", "alice-pw");
    let form = "query=up";
    for (by, request) in [
        ("hand", format!("GET {QUERY} HTTP/1.1\r\nhost: proxy\r\nauthorization: {auth}\r\n\r\n")),
        (
            "hyper",
            format!(
                "POST /api/v1/query HTTP/1.1\r\nhost: proxy\r\nauthorization: {auth}\r\n\
                 content-type: application/x-www-form-urlencoded\r\ncontent-length: {}\r\n\r\n{form}",
                form.len()
            ),
        ),
    ] {
        let (upstream, written) = support::answering_64_mib().await;
        let mut options = match by {
            "hand" => ProxyOptions::new(format!("http://{upstream}")),
            _ => ProxyOptions::metrics(
                support::two_tenants(),
                support::header_mode_section(&format!("http://{upstream}"), "X-Scope-OrgID"),
            ),
        };
        options.limits = "  upstream_receive_buffer_bytes: 16384\n";
        let proxy = RunningProxy::start(options).await;
        let mut client = client_reading_nothing(&proxy).await;
        client.write_all(request.as_bytes()).await.unwrap();
        // Until the upstream can send no more.
        let (most_received, _) = most_until_still(&written, || {
            socket_queues(None, upstream.port()).map_or(0, |(_, received)| received)
        })
        .await;
        assert!(most_received > 0, "{by}: no answer waited in the kernel");
        // The kernel doubles what it is given, for its own overhead.
        assert!(
            most_received <= 2 * 16384,
            "{by}: {most_received} bytes received and not read, more than twice the buffer"
        );
    }
}

/// The kernel takes `net.core.rmem_max` for a receive buffer asked above
/// it, without a word; the proxy says so at start, for each setting.
#[tokio::test]
async fn a_receive_buffer_above_what_the_kernel_allows_is_warned_about() {
    let Ok(max) = std::fs::read_to_string("/proc/sys/net/core/rmem_max") else {
        return; // not readable in this network namespace: nothing to compare
    };
    let above = max.trim().parse::<u32>().unwrap() + 1;
    for setting in [
        "upstream_receive_buffer_bytes",
        "client_receive_buffer_bytes",
    ] {
        let limits = format!("  {setting}: {above}\n");
        let (_loki, _proxy) = start(Box::leak(limits.into_boxed_str()), "").await;
        let logs = String::from_utf8_lossy(&support::captured_logs().lock().unwrap()).into_owned();
        let warned = format!(
            "\"setting\":\"limits.{setting}\",\"bytes\":{above},\"rmem_max\":{}",
            max.trim()
        );
        assert!(
            logs.lines()
                .any(|line| line.contains("above net.core.rmem_max") && line.contains(&warned)),
            "no warning naming {setting}, {above} and the kernel's maximum"
        );
    }
}

/// A push its upstream stops reading waits in the proxy and on its
/// client's connection, not queued in the kernel towards the upstream,
/// whose send buffer the kernel grows with the pace the upstream had
/// before (up to `tcp_wmem`'s maximum, 4 MiB by default).
#[tokio::test]
async fn a_push_its_upstream_stops_reading_queues_little_in_the_kernel() {
    support::captured_logs();
    let (upstream, stopped) = reading_4_mib_then_nothing().await;
    let proxy = RunningProxy::start(ProxyOptions::new(format!("http://{upstream}"))).await;
    let client = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let (_answer, mut writer) = client.into_split();
    let (chunk, chunks) = (vec![b' '; 64 << 10], 192); // 12 MiB, below the body limit
    let head = format!(
        "POST {PUSH} HTTP/1.1\r\nhost: proxy\r\nauthorization: {}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n",
        basic("alice", "alice-pw"),
        chunk.len() * chunks
    );
    let written = Arc::new(AtomicU64::new(0));
    let counted = written.clone();
    let sending = tokio::spawn(async move {
        writer.write_all(head.as_bytes()).await.unwrap();
        for _ in 0..chunks {
            writer.write_all(&chunk).await.unwrap();
            counted.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        }
    });
    // While the upstream read, the bytes in flight were in the queue too
    // (up to its window); once it stopped, what stays is what waits
    // unsent. Stillness counts only from then: before, a slow verification
    // holds the client still as well.
    let proxy_port = tokio::time::timeout(Duration::from_secs(10), stopped)
        .await
        .expect("the upstream read its 4 MiB within 10 s")
        .unwrap();
    let (_, queued) = most_until_still(&written, || {
        socket_queues(Some(proxy_port), upstream.port()).map_or(0, |(to_send, _)| to_send)
    })
    .await;
    sending.abort();
    assert_within_the_unsent_bound(queued, "the upstream");
}

/// What the kernel kept queued on a connection: something (the test made
/// bytes wait), and at most the bound and the part of one write the
/// kernel took before it.
fn assert_within_the_unsent_bound(queued: u64, towards: &str) {
    assert!(queued > 0, "nothing waited towards {towards}");
    let bound = u64::from(tenant_proxy::http::unsent::UNSENT_BYTES) + (128 << 10);
    assert!(
        queued <= bound,
        "{queued} bytes queued towards {towards}, more than {bound}"
    );
}

/// An upstream that reads the first 4 MiB of its first connection as fast
/// as they come, then nothing more, holding the connection open; it says
/// when it stops reading, with the proxy's port of that connection. Its
/// receive buffer is fixed small: grown with the pace (up to `tcp_rmem`'s
/// maximum, 32 MiB on some hosts), it could take the rest of a push whole,
/// and nothing would wait on the proxy's side.
async fn reading_4_mib_then_nothing() -> (std::net::SocketAddr, oneshot::Receiver<u16>) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(64 << 10).unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(16).unwrap();
    let address = listener.local_addr().unwrap();
    let (stopped, stopped_rx) = oneshot::channel();
    tokio::spawn(async move {
        let (mut connection, proxy) = listener.accept().await.unwrap();
        let (mut read, mut buf) = (0, vec![0; 64 << 10]);
        while read < 4 << 20 {
            match connection.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => read += n,
            }
        }
        let _ = stopped.send(proxy.port());
        std::future::pending::<()>().await;
        drop(connection);
    });
    (address, stopped_rx)
}

/// A client that takes none of its answer holds its connection (and with
/// it the request's slot, an upstream connection and their buffers) for
/// two quiet periods once the answer stops moving, not for twice
/// `upstream_timeout`: a write waiting for the client is not an upstream
/// still at work.
#[tokio::test]
async fn a_connection_whose_client_takes_none_of_its_answer_is_closed_soon() {
    support::captured_logs();
    let (upstream, _written) = support::answering_64_mib().await;
    let mut options = ProxyOptions::new(format!("http://{upstream}"));
    options.limits = "  header_read_timeout: 200ms\n  upstream_timeout: 10m\n";
    let proxy = RunningProxy::start(options).await;
    let mut client = client_reading_nothing(&proxy).await;
    let request = format!(
        "GET {QUERY} HTTP/1.1\r\nhost: proxy\r\nauthorization: {}\r\n\r\n",
        basic("alice", "alice-pw")
    );
    client.write_all(request.as_bytes()).await.unwrap();
    proxy.assert_its_one_connection_closed().await;
}

/// A client connected to the proxy whose own receive buffer is small, so
/// that what waits for it is on the proxy's side.
async fn client_reading_nothing(proxy: &RunningProxy) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.connect(proxy.addr).await.unwrap()
}

/// Reads `probe` every 5 ms until `progress`, once begun, has not moved
/// for 100 reads in a row (everything on the way is full), and returns the
/// most it read and what it reads then; fails if that does not happen
/// within 10 s.
async fn most_until_still(progress: &AtomicU64, probe: impl Fn() -> u64) -> (u64, u64) {
    let (mut last, mut unchanged, mut most) = (0, 0, 0);
    for _ in 0..2_000 {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let read = probe();
        most = most.max(read);
        let now = progress.load(Ordering::Relaxed);
        (unchanged, last) = if now == last && now > 0 {
            (unchanged + 1, now)
        } else {
            (0, now)
        };
        if unchanged == 100 {
            return (most, read);
        }
    }
    panic!("still moving after 10 s: {last} bytes");
}

/// The bytes the kernel holds on an established loopback IPv4 socket to
/// port `remote` (from port `local`, if given; else from any, the one
/// holding most): to send, unsent or unacknowledged, and received, not
/// yet read (`tx_queue` and `rx_queue` in /proc/net/tcp). Another test's
/// connection to a listener that had the same port may still be in the
/// table, in `TIME_WAIT` or held open by its task, its queues empty.
fn socket_queues(local: Option<u16>, remote: u16) -> Option<(u64, u64)> {
    const ESTABLISHED: &str = "01";
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let address = |port: u16| format!("0100007F:{port:04X}");
    let remote = address(remote);
    let local = local.map(address);
    table
        .lines()
        .skip(1)
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .filter(|fields| {
            fields[2] == remote
                && fields[3] == ESTABLISHED
                && local.as_ref().is_none_or(|l| fields[1] == *l)
        })
        .map(|fields| {
            let (to_send, received) = fields[4].split_once(':').unwrap();
            let hex = |queue| u64::from_str_radix(queue, 16).unwrap();
            (hex(to_send), hex(received))
        })
        .max_by_key(|(to_send, received)| to_send + received)
}
