//! End-to-end: the real proxy on 127.0.0.1:0 in front of a Loki stand-in.

mod support;

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use http::{Method, StatusCode};
use support::loki::LokiStandIn;
use support::loki_push;
use support::{basic, get, send, ProxyOptions, RunningProxy};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;

const PUSH: &str = "/loki/api/v1/push";
const QUERY: &str = "/loki/api/v1/query_range?query=%7Bapp%3D%22x%22%7D&limit=10";

async fn setup() -> (LokiStandIn, RunningProxy) {
    support::captured_logs();
    let loki = LokiStandIn::start().await;
    let proxy = RunningProxy::start(ProxyOptions::new(loki.url())).await;
    (loki, proxy)
}

/// Starts a query that the upstream holds for `stall_ms`, and returns once
/// it has reached the upstream (the request is then surely in flight).
async fn stalled_at_upstream(
    proxy: &RunningProxy,
    loki: &LokiStandIn,
    auth: String,
    stall_ms: &'static str,
) -> tokio::task::JoinHandle<support::Reply> {
    let url = proxy.url(QUERY);
    let before = loki.received().len();
    let in_flight = tokio::spawn(async move {
        send(
            Method::GET,
            &url,
            Some(&auth),
            &[("x-test-stall-ms", stall_ms)],
            "",
        )
        .await
    });
    loki.wait_for_requests(before + 1).await;
    in_flight
}

/// Pushes one line as Loki's JSON.
async fn push(proxy: &RunningProxy, auth: &str, line: &str) -> support::Reply {
    send(
        Method::POST,
        &proxy.url(PUSH),
        Some(auth),
        &[("content-type", "application/json")],
        loki_push::json(line),
    )
    .await
}

/// curl (for large bodies) and some SDKs send `Expect: 100-continue` and
/// hold the body back until told to go on. The proxy says so once it
/// reads the body, and the push lands whole.
#[tokio::test]
async fn a_push_that_waits_for_100_continue_lands() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (loki, proxy) = setup().await;
    let body = loki_push::json("after-continue");
    let mut client = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let head = format!(
        "POST {PUSH} HTTP/1.1\r\nhost: proxy\r\nauthorization: {}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\
         expect: 100-continue\r\nconnection: close\r\n\r\n",
        basic("alice", "alice-pw"),
        body.len()
    );
    client.write_all(head.as_bytes()).await.unwrap();
    let mut interim = [0; 25];
    client.read_exact(&mut interim).await.unwrap();
    assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
    client.write_all(body.as_bytes()).await.unwrap();
    let mut answer = String::new();
    client.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 204"), "{answer}");
    let seen = loki.last();
    assert_eq!(seen.org_ids(), vec!["team-a"]);
    assert_eq!(seen.body, body.as_bytes());
    // Passed on (RFC 9110 §10.1.1): the stand-in (hyper) answered 100 in
    // turn, which the proxy's upstream client read past to the 204.
    assert_eq!(seen.headers["expect"], "100-continue");
}

#[tokio::test]
async fn each_tenant_reads_back_only_what_it_pushed() {
    let (loki, proxy) = setup().await;
    assert_eq!(
        push(&proxy, &basic("alice", "alice-pw"), "line-of-a")
            .await
            .status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        push(&proxy, &basic("bob", "bob-pw"), "line-of-b")
            .await
            .status,
        StatusCode::NO_CONTENT
    );

    let a = get(&proxy.url(QUERY), &basic("alice", "alice-pw")).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.json()["data"]["result"], serde_json::json!(["line-of-a"]));
    let b = get(&proxy.url(QUERY), &basic("bob", "bob-pw")).await;
    assert_eq!(b.json()["data"]["result"], serde_json::json!(["line-of-b"]));

    // The query string reached Loki as sent.
    let last = loki.last();
    assert_eq!(
        last.query.as_deref(),
        Some("query=%7Bapp%3D%22x%22%7D&limit=10")
    );
    assert_eq!(last.org_ids(), vec!["team-b"]);
}

#[tokio::test]
async fn replaces_spoofed_scope_orgid_in_any_case_number_and_spelling() {
    let (loki, proxy) = setup().await;
    let reply = send(
        Method::GET,
        &proxy.url(QUERY),
        Some(&basic("alice", "alice-pw")),
        &[
            ("X-Scope-OrgID", "team-b"),
            ("x-scope-orgid", "team-b|team-a"),
            ("X-SCOPE-ORGID", "team-c"),
            ("X-Prom-Label-Policy", "team-b:%7B%7D"),
            // Some readers take `_` in a name for `-` (CGI and its kin,
            // nginx's `$http_` variables with `underscores_in_headers on`).
            ("X_Scope_OrgID", "team-b"),
            ("X-Scope_OrgID", "team-b"),
            ("X_Prom_Label_Policy", "team-b:%7B%7D"),
            ("X-Query-Tags", "Source=grafana"),
        ],
        "",
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json()["data"]["tenant"], "team-a");
    let seen = loki.last();
    assert_eq!(seen.org_ids(), vec!["team-a"]);
    assert!(!seen.headers.contains_key("x-prom-label-policy"));
    let underscored: Vec<&str> = (seen.headers.keys())
        .map(|name| name.as_str())
        .filter(|name| name.contains('_'))
        .collect();
    assert!(underscored.is_empty(), "{underscored:?} reached Loki");
    assert_eq!(seen.headers["x-query-tags"], "Source=grafana");
    assert!(
        !seen.headers.contains_key("authorization"),
        "Authorization must not be forwarded"
    );
    assert_eq!(seen.headers["x-forwarded-for"], "127.0.0.1");
}

/// Loki takes a push that names a backfill shard or day (a backfill
/// worker's headers) past `reject_old_samples`: a tenant's copies never
/// reach it, and the push lands as a push.
#[tokio::test]
async fn backfill_headers_never_reach_loki() {
    let (loki, proxy) = setup().await;
    let reply = send(
        Method::POST,
        &proxy.url(PUSH),
        Some(&basic("alice", "alice-pw")),
        &[
            ("content-type", "application/json"),
            ("X-Loki-Backfill-Shard", "old"),
            ("x-loki-backfill-day", "2020-01-01"),
        ],
        loki_push::json("a line"),
    )
    .await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT);
    let seen = loki.last();
    assert_eq!(seen.org_ids(), vec!["team-a"]);
    for header in ["x-loki-backfill-shard", "x-loki-backfill-day"] {
        assert!(!seen.headers.contains_key(header), "{header} reached Loki");
    }
}

/// A chunked body may end in trailer fields, which Go's server reads into
/// the request (`r.Trailer`) once the body is read: a second place a
/// reader could look for the tenant. A streamed push's trailers, declared
/// or not, never reach Loki; the push lands under the credential's tenant.
#[tokio::test]
async fn trailers_after_a_streamed_push_never_reach_loki() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (loki, proxy) = setup().await;
    let body = loki_push::json("a line");
    let request = format!(
        "POST {PUSH} HTTP/1.1\r\nHost: proxy\r\nAuthorization: {}\r\n\
         Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\
         Trailer: X-Scope-OrgID, X-Prom-Label-Policy, X-Other\r\nConnection: close\r\n\r\n\
         {:x}\r\n{}\r\n0\r\nX-Scope-OrgID: team-b\r\n\
         X-Prom-Label-Policy: team-b:%7B%7D\r\nX-Other: 1\r\n\r\n",
        basic("alice", "alice-pw"),
        body.len(),
        body,
    );
    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 204"), "{answer}");
    let seen = loki.last();
    assert_eq!(seen.path, PUSH);
    assert_eq!(seen.body, body.as_bytes(), "the body reached Loki as sent");
    assert_eq!(seen.org_ids(), vec!["team-a"]);
    assert!(!seen.headers.contains_key("trailer"));
    assert_eq!(seen.trailers, None, "trailers reached Loki");
}

/// Headers Loki's query path takes from its own gateway: with one, its
/// engine leaves out an embedder's pipeline wrappers (where a Loki build
/// would hold queries to a policy); with the other, its queriers take
/// per-request limits, a size limit among them that would make Loki tell a
/// restricted credential the size of streams its policy hides. A tenant's
/// query carries neither, and is answered as a query.
#[tokio::test]
async fn a_query_never_carries_headers_meant_for_lokis_own_gateway() {
    let (loki, proxy) = setup().await;
    for (name, value) in [
        ("X-Loki-Disable-Pipeline-Wrappers", "true"),
        ("X-Loki-Query-Limits", r#"{"maxQueryBytesRead":"1B"}"#),
    ] {
        let reply = send(
            Method::GET,
            &proxy.url(QUERY),
            Some(&basic("alice", "alice-pw")),
            &[(name, value)],
            "",
        )
        .await;
        assert_eq!(reply.status, StatusCode::OK, "{name}");
        let seen = loki.last();
        assert_eq!(seen.org_ids(), vec!["team-a"]);
        assert!(!seen.headers.contains_key(name), "{name} reached Loki");
    }
}

/// W3C trace context passes through, so a trace started in Grafana or an
/// agent continues in Loki.
#[tokio::test]
async fn trace_context_reaches_the_upstream_untouched() {
    let (loki, proxy) = setup().await;
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let reply = send(
        Method::GET,
        &proxy.url(QUERY),
        Some(&basic("alice", "alice-pw")),
        &[("traceparent", traceparent), ("tracestate", "vendor=x")],
        "",
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    let seen = loki.last();
    assert_eq!(seen.headers["traceparent"], traceparent);
    assert_eq!(seen.headers["tracestate"], "vendor=x");
}

#[tokio::test]
async fn a_tenant_id_with_a_pipe_is_never_loaded_so_never_sent() {
    let (loki, mut proxy) = setup().await;
    let evil = support::tenants_yaml(&[support::TenantSpec {
        id: "team-a|team-b",
        users: &[("mallory", "m-pw", None)],
    }]);
    let status = proxy.rewrite_tenants(&evil).await;
    assert!(status.last_error.unwrap().contains('|'));
    let reply = get(&proxy.url(QUERY), &basic("mallory", "m-pw")).await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    assert!(loki
        .received()
        .iter()
        .all(|r| r.org_ids().iter().all(|id| !id.contains('|'))));
}

#[tokio::test]
async fn scopes_are_enforced_per_route() {
    let (loki, proxy) = setup().await;
    let reader = basic("reader-a", "reader-pw");
    let pusher = basic("pusher-a", "pusher-pw");

    let denied = push(&proxy, &reader, "nope").await;
    assert_eq!(denied.status, StatusCode::FORBIDDEN);
    assert!(denied.json()["error"]
        .as_str()
        .unwrap()
        .contains("logs:write"));
    let denied = get(&proxy.url(QUERY), &pusher).await;
    assert_eq!(denied.status, StatusCode::FORBIDDEN);
    assert!(
        loki.received().is_empty(),
        "refused requests never reach Loki"
    );

    assert_eq!(
        push(&proxy, &pusher, "ok").await.status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(get(&proxy.url(QUERY), &reader).await.status, StatusCode::OK);
    assert_eq!(loki.received().len(), 2);
}

#[tokio::test]
async fn admin_and_unknown_paths_are_refused_with_json_404() {
    let (loki, proxy) = setup().await;
    let alice = basic("alice", "alice-pw");
    for path in [
        "/flush",
        "/config",
        "/ring",
        "/ingester/shutdown",
        "/distributor/ring",
        "/ruler/ring",
        "/memberlist",
        "/metrics",
        "/loki/api/v1/index/shards",
        "/api/v1/query?query=up",
        "/",
    ] {
        for method in [Method::GET, Method::POST] {
            let reply = send(method.clone(), &proxy.url(path), Some(&alice), &[], "").await;
            assert_eq!(reply.status, StatusCode::NOT_FOUND, "{method} {path}");
            assert_eq!(reply.json()["status"], "error");
        }
    }
    let wrong_method = send(
        Method::DELETE,
        &proxy.url("/loki/api/v1/query"),
        Some(&alice),
        &[],
        "",
    )
    .await;
    assert_eq!(wrong_method.status, StatusCode::METHOD_NOT_ALLOWED);
    // What the path does take, and a client's error, not the proxy's.
    assert_eq!(wrong_method.headers["allow"], "GET, POST");
    assert_eq!(wrong_method.json()["errorType"], "bad_data");
    // Deleting logs is a route, but no default credential holds its scope.
    let delete = "/loki/api/v1/delete?query=%7Ba%3D%22b%22%7D";
    let reply = send(Method::POST, &proxy.url(delete), Some(&alice), &[], "").await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    assert!(loki.received().is_empty());
}

#[tokio::test]
async fn path_tricks_are_normalised_before_matching_and_forwarding() {
    let (loki, proxy) = setup().await;
    let alice = basic("alice", "alice-pw");
    let cases = [
        ("/loki/api/v1//push", "/loki/api/v1/push"),
        ("/loki/api/v1/./push", "/loki/api/v1/push"),
        ("/loki/api/v1/x/%2e%2e/push", "/loki/api/v1/push"),
        ("/loki/api/v1/push/", "/loki/api/v1/push"),
    ];
    for (sent, forwarded) in cases {
        let json = [("content-type", "application/json")];
        let reply = send(
            Method::POST,
            &proxy.url(sent),
            Some(&alice),
            &json,
            loki_push::json("x"),
        )
        .await;
        assert_eq!(reply.status, StatusCode::NO_CONTENT, "{sent}");
        assert_eq!(loki.last().path, forwarded, "{sent}");
    }
    let reply = get(&proxy.url("/loki/api/v1/query/"), &alice).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(loki.last().path, "/loki/api/v1/query");

    let before = loki.received().len();
    for refused in [
        "/loki/api/v1/query/%2e%2e/%2e%2e/%2e%2e/%2e%2e/flush",
        "/loki/api/v1/%2e%2e/%2e%2e/%2e%2e/config",
    ] {
        assert_eq!(
            get(&proxy.url(refused), &alice).await.status,
            StatusCode::NOT_FOUND,
            "{refused}"
        );
    }
    for bad in [
        "/loki%2fapi/v1/push",
        "/loki/api/v1/query%00",
        "/%2e%2e/loki/api/v1/query",
    ] {
        assert_eq!(
            get(&proxy.url(bad), &alice).await.status,
            StatusCode::BAD_REQUEST,
            "{bad}"
        );
    }
    assert_eq!(loki.received().len(), before);
}

#[tokio::test]
async fn unauthenticated_requests_all_get_the_same_401() {
    let (loki, proxy) = setup().await;
    let replies = [
        send(Method::GET, &proxy.url(QUERY), None, &[], "").await,
        get(&proxy.url(QUERY), &basic("alice", "wrong")).await,
        get(&proxy.url(QUERY), &basic("nobody", "alice-pw")).await,
        get(&proxy.url(QUERY), "Bearer token").await,
    ];
    for reply in &replies {
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
        assert_eq!(
            reply.headers["www-authenticate"],
            "Basic realm=\"tenant-proxy\""
        );
        assert_eq!(reply.body, replies[0].body);
    }
    assert!(loki.received().is_empty());
}

#[tokio::test]
async fn repeated_failures_from_a_client_are_throttled_with_retry_after() {
    support::captured_logs();
    let loki = LokiStandIn::start().await;
    let mut options = ProxyOptions::new(loki.url());
    options.auth = "  max_failures_per_client: 3\n";
    let proxy = RunningProxy::start(options).await;
    for attempt in 0..3 {
        let reply = get(
            &proxy.url(QUERY),
            &basic("alice", &format!("guess{attempt}")),
        )
        .await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    }
    let throttled = get(&proxy.url(QUERY), &basic("bob", "guess")).await;
    assert_eq!(throttled.status, StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = throttled.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry_after));
    assert!(proxy
        .metrics()
        .await
        .contains("tenant_proxy_auth_failures_total{reason=\"throttled\"} 1"));
}

/// Guesses sent at once from one address are verified only as far as its
/// failure count goes: the rest wait for a verifier slot and are then
/// refused with 429, without an argon2 run, and nothing reaches Loki.
#[tokio::test]
async fn guesses_sent_at_once_get_no_more_verifications_than_the_failure_count() {
    support::captured_logs();
    let loki = LokiStandIn::start().await;
    let mut options = ProxyOptions::new(loki.url());
    options.auth = "  max_failures_per_client: 3\n  max_concurrent_verifications: 1\n";
    let proxy = RunningProxy::start(options).await;
    let url = proxy.url(QUERY);
    let guesses = (0..12).map(|i| {
        let (url, auth) = (&url, basic("alice", &format!("guess{i}")));
        async move { get(url, &auth).await.status }
    });
    let replies = futures_util::future::join_all(guesses).await;
    let count = |status| replies.iter().filter(|&&s| s == status).count();
    assert_eq!(
        (
            count(StatusCode::UNAUTHORIZED),
            count(StatusCode::TOO_MANY_REQUESTS)
        ),
        (3, 9),
        "{replies:?}"
    );
    let metrics = proxy.metrics().await;
    assert!(
        metrics.contains("tenant_proxy_password_verifications_total 3\n"),
        "{metrics}"
    );
    assert!(loki.received().is_empty());
}

/// Behind the operator's ingress every client has its address: with
/// `trusted_proxies`, the client `X-Forwarded-For` names is the one
/// throttled, so one guesser does not lock out everyone behind it; its
/// own entries (left of the ingress's) change nothing. Without, the header
/// is never believed.
#[tokio::test]
async fn behind_a_trusted_proxy_failures_are_counted_per_forwarded_client() {
    support::captured_logs();
    let loki = LokiStandIn::start().await;
    for trusted in [true, false] {
        let mut options = ProxyOptions::new(loki.url());
        options.auth = "  max_failures_per_client: 3\n";
        if trusted {
            options.extra = "trusted_proxies: [127.0.0.0/8]\n";
        }
        let proxy = RunningProxy::start(options).await;
        let from = |forwarded: String, auth: String| {
            let url = proxy.url(QUERY);
            async move {
                let headers = [("x-forwarded-for", forwarded.as_str())];
                send(Method::GET, &url, Some(&auth), &headers, "")
                    .await
                    .status
            }
        };
        for attempt in 0..3 {
            // The guesser varies what it writes itself; the ingress appends
            // the address it saw.
            let forwarded = format!("198.51.100.{attempt}, 203.0.113.1");
            let status = from(forwarded, basic("alice", &format!("guess{attempt}"))).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED);
        }
        let guesser = from("203.0.113.1".into(), basic("bob", "bob-pw")).await;
        assert_eq!(guesser, StatusCode::TOO_MANY_REQUESTS, "trusted: {trusted}");
        let neighbour = from("203.0.113.2".into(), basic("bob", "bob-pw")).await;
        let expected = if trusted {
            StatusCode::OK
        } else {
            StatusCode::TOO_MANY_REQUESTS
        };
        assert_eq!(neighbour, expected, "trusted: {trusted}");
    }
}

/// A guesser at one username from one address does not keep the
/// username's real client out of its first, uncached login (after a
/// restart or a rollout every login is one): a username out of failures
/// still takes one attempt from each address that has failed nothing, up
/// to `max_failures_per_user_from_fresh_addresses`. Set to 0, the guesser
/// locks the username out, as before.
#[tokio::test]
async fn a_guesser_from_one_address_does_not_keep_a_usernames_real_client_out() {
    support::captured_logs();
    let loki = LokiStandIn::start().await;
    let auth = |reserve| match reserve {
        1 => "  max_failures_per_user: 2\n  max_failures_per_user_from_fresh_addresses: 1\n",
        _ => "  max_failures_per_user: 2\n  max_failures_per_user_from_fresh_addresses: 0\n",
    };
    for reserve in [1, 0] {
        let mut options = ProxyOptions::new(loki.url());
        options.auth = auth(reserve);
        options.extra = "trusted_proxies: [127.0.0.0/8]\n";
        let proxy = RunningProxy::start(options).await;
        let from = |address: &'static str, password: &'static str| {
            let url = proxy.url(QUERY);
            async move {
                let headers = [("x-forwarded-for", address)];
                let auth = basic("alice", password);
                send(Method::GET, &url, Some(&auth), &headers, "").await
            }
        };
        for guess in ["guess-1", "guess-2"] {
            let status = from("203.0.113.1", guess).await.status;
            assert_eq!(status, StatusCode::UNAUTHORIZED);
        }
        let guesser = from("203.0.113.1", "guess-3").await.status;
        assert_eq!(guesser, StatusCode::TOO_MANY_REQUESTS, "reserve {reserve}");
        let before = loki.received().len();
        let real = from("203.0.113.2", "alice-pw").await;
        if reserve == 0 {
            assert_eq!(real.status, StatusCode::TOO_MANY_REQUESTS);
            assert_eq!(loki.received().len(), before, "nothing forwarded");
            continue;
        }
        assert_eq!(real.status, StatusCode::OK);
        assert_eq!(loki.last().org_ids(), vec!["team-a"]);
        // Only once an address: another guess from one that has failed is
        // refused, and the reserve (one) is spent by the next fresh one.
        let second = from("203.0.113.3", "guess-4").await.status;
        assert_eq!(second, StatusCode::UNAUTHORIZED);
        for address in ["203.0.113.3", "203.0.113.4"] {
            let status = from(address, "guess-5").await.status;
            assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{address}");
        }
        // Cached now, the real client is never throttled.
        let again = from("203.0.113.2", "alice-pw").await.status;
        assert_eq!(again, StatusCode::OK);
    }
}

/// A live tail as a client holds it.
type Tail =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;
type TailOpened = Result<
    (
        Tail,
        tokio_tungstenite::tungstenite::handshake::client::Response,
    ),
    tokio_tungstenite::tungstenite::Error,
>;

/// Opens a live tail through the proxy as `user`, with `extra` headers.
async fn open_tail(
    addr: std::net::SocketAddr,
    user: &str,
    password: &str,
    extra: &[(&'static str, &str)],
) -> TailOpened {
    let mut request = format!("ws://{addr}/loki/api/v1/tail?query=%7Bapp%3D%22x%22%7D")
        .into_client_request()
        .unwrap();
    let headers = request.headers_mut();
    headers.insert("authorization", basic(user, password).parse().unwrap());
    for (name, value) in extra {
        headers.insert(*name, value.parse().unwrap());
    }
    tokio_tungstenite::connect_async(request).await
}

/// A tail of team-a's opened as `user`, its first message (the stand-in's
/// `tenant=team-a`) read: both sides have switched.
async fn streaming_tail(addr: std::net::SocketAddr, user: &str, password: &str) -> Tail {
    let (mut ws, _) = open_tail(addr, user, password, &[]).await.unwrap();
    assert_eq!(
        ws.next().await.unwrap().unwrap(),
        Message::text("tenant=team-a")
    );
    ws
}

/// The next message of a tail the proxy ends: a close frame with `code`
/// and `reason`, within 10 s.
async fn expect_close<S>(ws: &mut S, code: CloseCode, reason: &str)
where
    S: futures_util::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    let after = tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .expect("the proxy ends the tail");
    let Some(Ok(Message::Close(Some(close)))) = after else {
        panic!("a close frame, got {after:?}");
    };
    assert_eq!(close.code, code);
    assert_eq!(close.reason.as_str(), reason);
}

#[tokio::test]
async fn live_tail_websocket_streams_both_ways_and_closes() {
    let (loki, proxy) = setup().await;
    let spoofed = [("x-scope-orgid", "team-b")];
    let (mut ws, response) = open_tail(proxy.addr, "alice", "alice-pw", &spoofed)
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);

    let first = ws.next().await.unwrap().unwrap();
    assert_eq!(first, Message::text("tenant=team-a"));
    ws.send(Message::text("ping-from-client")).await.unwrap();
    assert_eq!(
        ws.next().await.unwrap().unwrap(),
        Message::text("echo:ping-from-client")
    );
    ws.close(None).await.unwrap();
    // The close handshake completes: the stream ends without an error.
    while let Some(message) = ws.next().await {
        assert!(matches!(message, Ok(Message::Close(_))), "{message:?}");
    }
    let seen = loki.last();
    assert_eq!(seen.path, "/loki/api/v1/tail");
    assert_eq!(seen.org_ids(), vec!["team-a"]);
    assert!(!seen.headers.contains_key("authorization"));
}

/// Reloads the tenants of `support::two_tenants` without reader-a: its
/// credential, and so its tails, are gone.
async fn remove_reader_a(proxy: &mut RunningProxy) {
    let without_reader = support::tenants_yaml(&[support::TenantSpec {
        id: "team-a",
        users: &[("alice", "alice-pw", None)],
    }]);
    assert_eq!(
        proxy.rewrite_tenants(&without_reader).await.last_error,
        None
    );
}

/// A tail streams for as long as Loki lets it (an hour by default): a
/// reload that removes its credential ends it, where one that leaves the
/// credential as it was does not.
#[tokio::test]
async fn a_live_tail_ends_when_its_credential_is_removed() {
    let (_loki, mut proxy) = setup().await;
    let initial = support::two_tenants();
    assert_eq!(proxy.rewrite_tenants(&initial).await.last_error, None);
    let addr = proxy.addr;
    let open = || open_tail(addr, "reader-a", "reader-pw", &[]);
    let (mut ws, _) = open().await.unwrap();
    assert_eq!(
        ws.next().await.unwrap().unwrap(),
        Message::text("tenant=team-a")
    );
    // Counted once both sides switched: the stand-in's first message is
    // sent after that.
    assert!(proxy
        .metrics()
        .await
        .contains("tenant_proxy_live_tails 1\n"));

    // Another tenant added; reader-a's entry (and hash) as it was.
    let team_c = support::tenants_yaml(&[support::TenantSpec {
        id: "team-c",
        users: &[("carol", "carol-pw", None)],
    }]);
    let added = format!("{initial}{}", team_c.split_once("tenants:\n").unwrap().1);
    assert_eq!(proxy.rewrite_tenants(&added).await.last_error, None);
    ws.send(Message::text("still-there")).await.unwrap();
    assert_eq!(
        ws.next().await.unwrap().unwrap(),
        Message::text("echo:still-there"),
        "an unchanged credential keeps its tail"
    );

    remove_reader_a(&mut proxy).await;
    // Told why, in a close frame a client reports, rather than cut off.
    expect_close(&mut ws, CloseCode::Policy, "credential revoked").await;
    let metrics = proxy.metrics().await;
    assert!(metrics.contains("tenant_proxy_live_tails 0\n"), "{metrics}");
    assert!(metrics.contains("tenant_proxy_live_tails_revoked_total 1\n"));
    let Err(tokio_tungstenite::tungstenite::Error::Http(refused)) = open().await else {
        panic!("reconnecting must be refused");
    };
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
}

/// A tail Loki ended itself (its close frame sent, the client's reply not
/// yet come) gets no second close frame when its credential goes (RFC
/// 6455 §5.5.1: one close frame from each side): the proxy drops it.
#[tokio::test]
async fn a_tail_loki_ended_gets_no_second_close_frame_when_revoked() {
    use tokio::io::AsyncReadExt;
    let (_loki, mut proxy) = setup().await;
    let initial = support::two_tenants();
    assert_eq!(proxy.rewrite_tenants(&initial).await.last_error, None);
    let mut ws = streaming_tail(proxy.addr, "reader-a", "reader-pw").await;
    ws.send(Message::text("end")).await.unwrap();
    expect_close(&mut ws, CloseCode::Error, "tail ended").await;

    // tungstenite replies on its next read or write, so the tail is still
    // open: the stand-in waits for that reply.
    remove_reader_a(&mut proxy).await;
    // What follows Loki's close frame, read past tungstenite: nothing.
    let mut rest = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(10), ws.get_mut().read_to_end(&mut rest))
        .await
        .expect("the proxy drops the tail");
    assert!(ended.is_ok(), "{ended:?}");
    assert!(rest.is_empty(), "a second close frame: {rest:?}");
    let metrics = proxy.metrics().await;
    assert!(
        metrics.contains("tenant_proxy_live_tails_revoked_total 1\n"),
        "ended by the revocation, not by Loki: {metrics}"
    );
}

/// A tail outlives its HTTP connection's drain: at shutdown its client is
/// told the proxy is going away, and reconnects to another replica.
#[tokio::test]
async fn a_live_tail_is_told_the_proxy_is_going_away_at_shutdown() {
    let (_loki, mut proxy) = setup().await;
    let mut ws = streaming_tail(proxy.addr, "alice", "alice-pw").await;

    proxy.trigger_shutdown();
    expect_close(&mut ws, CloseCode::Away, "proxy shutting down").await;
    proxy.join().await;
}

/// A tail whose handshake is not a WebSocket one (`Upgrade` alone, or
/// another protocol) is passed on without `Upgrade` and `Connection`,
/// both the proxy's own: Loki refuses it, nothing is upgraded.
#[tokio::test]
async fn a_tail_without_both_handshake_headers_is_passed_on_as_a_plain_request() {
    let (loki, proxy) = setup().await;
    let alice = basic("alice", "alice-pw");
    let key = ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==");
    let version = ("sec-websocket-version", "13");
    for (headers, refusal) in [
        (
            vec![("upgrade", "websocket"), key, version],
            "'upgrade' token not found in 'Connection' header",
        ),
        (
            vec![("connection", "upgrade"), ("upgrade", "h2c"), key, version],
            "'upgrade' token not found in 'Connection' header",
        ),
    ] {
        let url = proxy.url("/loki/api/v1/tail?query=%7Bapp%3D%22x%22%7D");
        let reply = send(Method::GET, &url, Some(&alice), &headers, "").await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{headers:?}");
        assert!(reply.text().contains(refusal), "{}", reply.text());
        let seen = loki.last();
        assert!(seen.headers.get("upgrade").is_none(), "{headers:?}");
        assert!(seen.headers.get("connection").is_none(), "{headers:?}");
        assert_eq!(seen.org_ids(), ["team-a"]);
    }
}

#[tokio::test]
async fn tail_without_upgrade_or_read_scope_is_refused() {
    let (loki, proxy) = setup().await;
    let reply = get(
        &proxy.url("/loki/api/v1/tail?query=x"),
        &basic("pusher-a", "pusher-pw"),
    )
    .await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    assert!(loki.received().is_empty());
}

#[tokio::test]
async fn reload_takes_effect_on_the_next_request_of_a_keep_alive_connection() {
    let (_loki, mut proxy) = setup().await;
    let stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let (mut conn, driver) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(driver);
    let request = |auth: String| {
        http::Request::get(QUERY)
            .header("host", "proxy")
            .header("authorization", auth)
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap()
    };
    let first = conn
        .send_request(request(basic("alice", "alice-pw")))
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    drop(first);

    // alice's password changes; bob is removed.
    let rotated = support::tenants_yaml(&[support::TenantSpec {
        id: "team-a",
        users: &[("alice", "alice-new", None)],
    }]);
    let status = proxy.rewrite_tenants(&rotated).await;
    assert_eq!(status.last_error, None);

    conn.ready()
        .await
        .expect("the same connection is still open");
    let old = conn
        .send_request(request(basic("alice", "alice-pw")))
        .await
        .unwrap();
    assert_eq!(
        old.status(),
        StatusCode::UNAUTHORIZED,
        "a cached old password must stop working"
    );
    drop(old);
    let new = conn
        .send_request(request(basic("alice", "alice-new")))
        .await
        .unwrap();
    assert_eq!(new.status(), StatusCode::OK);
    drop(new);
    let removed = conn
        .send_request(request(basic("bob", "bob-pw")))
        .await
        .unwrap();
    assert_eq!(removed.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn corrupt_tenants_file_keeps_the_last_good_generation() {
    let (_loki, mut proxy) = setup().await;
    let alice = basic("alice", "alice-pw");
    assert_eq!(get(&proxy.url(QUERY), &alice).await.status, StatusCode::OK);
    let metrics = proxy.metrics().await;
    assert!(
        metrics.contains("tenant_proxy_tenants_reload_failures_total 0"),
        "the first load is no failure: {metrics}"
    );
    assert!(metrics.contains("tenant_proxy_tenants_last_reload_success 1"));
    let status = proxy.rewrite_tenants("tenants: [ {id: \n").await;
    assert!(status.last_error.is_some());
    assert_eq!(status.generation, 1);
    assert_eq!(get(&proxy.url(QUERY), &alice).await.status, StatusCode::OK);
    let metrics = proxy.metrics().await;
    assert!(
        metrics.contains("tenant_proxy_tenants_reload_failures_total 1"),
        "{metrics}"
    );
    assert!(metrics.contains("tenant_proxy_tenants_last_reload_success 0"));
    assert!(metrics.contains("tenant_proxy_tenants_generation 1"));
}

/// A writer that truncates before it writes (an editor, `>`) leaves the
/// file empty for a moment: read then, it must not log everyone out.
#[tokio::test]
async fn an_emptied_tenants_file_keeps_the_last_good_generation() {
    let (_loki, mut proxy) = setup().await;
    let alice = basic("alice", "alice-pw");
    let status = proxy.rewrite_tenants("").await;
    let error = status.last_error.expect("the empty file is refused");
    assert!(error.contains("tenants: []"), "{error}");
    assert_eq!(status.generation, 1);
    assert_eq!(get(&proxy.url(QUERY), &alice).await.status, StatusCode::OK);

    // An explicit empty list does log everyone out.
    let status = proxy.rewrite_tenants("tenants: []\n").await;
    assert_eq!((status.generation, status.last_error), (2, None));
    assert_eq!(
        get(&proxy.url(QUERY), &alice).await.status,
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test]
async fn missing_tenants_file_answers_503_until_it_appears() {
    support::captured_logs();
    let loki = LokiStandIn::start().await;
    let mut options = ProxyOptions::new(loki.url());
    options.tenants = None;
    let mut proxy = RunningProxy::start(options).await;
    let alice = basic("alice", "alice-pw");

    let early = push(&proxy, &alice, "early").await;
    assert_eq!(
        early.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "push clients retry on 503, drop on 401"
    );
    assert!(early.headers.contains_key("retry-after"));
    let ready = send(Method::GET, &proxy.admin_url("/readyz"), None, &[], "").await;
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(loki.received().is_empty());

    proxy.rewrite_tenants(&support::two_tenants()).await;
    assert_eq!(
        push(&proxy, &alice, "late").await.status,
        StatusCode::NO_CONTENT
    );
    let ready = send(Method::GET, &proxy.admin_url("/readyz"), None, &[], "").await;
    assert_eq!(ready.status, StatusCode::OK);
}

#[tokio::test]
async fn upstream_down_is_502_for_queries_503_for_pushes_and_slow_upstream_is_504() {
    support::captured_logs();
    let (refused, _reserved) = support::refused_port();
    let down = RunningProxy::start(ProxyOptions::new(format!("http://{refused}"))).await;
    let reply = get(&down.url(QUERY), &basic("alice", "alice-pw")).await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY);
    assert_eq!(reply.json()["errorType"], "upstream");
    // Push clients retry a 503 (Fluent Bit, Promtail, Alloy, Prometheus).
    let reply = push(&down, &basic("alice", "alice-pw"), "x").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.json()["errorType"], "upstream");
    assert!(reply.headers.contains_key("retry-after"));

    let loki = LokiStandIn::start().await;
    let mut options = ProxyOptions::new(loki.url());
    options.limits = "  upstream_timeout: 300ms\n";
    let slow = RunningProxy::start(options).await;
    let reply = send(
        Method::GET,
        &slow.url(QUERY),
        Some(&basic("alice", "alice-pw")),
        &[("x-test-stall-ms", "3000")],
        "",
    )
    .await;
    assert_eq!(reply.status, StatusCode::GATEWAY_TIMEOUT);
}

#[tokio::test]
async fn upstream_429_and_5xx_pass_through_with_retry_after() {
    let (_loki, proxy) = setup().await;
    for code in ["429", "500", "503"] {
        let reply = send(
            Method::POST,
            &proxy.url(PUSH),
            Some(&basic("alice", "alice-pw")),
            &[("x-test-status", code)],
            "x",
        )
        .await;
        assert_eq!(reply.status.as_str(), code);
        assert_eq!(reply.headers["retry-after"], "7");
        assert_eq!(reply.text(), "forced");
    }
}

#[tokio::test]
async fn bodies_over_the_limit_are_413_whether_declared_or_streamed() {
    support::captured_logs();
    let loki = LokiStandIn::start().await;
    let mut options = ProxyOptions::new(loki.url());
    options.limits = "  max_body_bytes: 1024\n";
    let proxy = RunningProxy::start(options).await;
    let alice = basic("alice", "alice-pw");
    // The limit itself is allowed: a body of exactly 1024 bytes lands.
    let padding = 1024 - loki_push::json("").len();
    let at_limit = loki_push::json(&"x".repeat(padding));
    assert_eq!(at_limit.len(), 1024);
    let landed = push(&proxy, &alice, &"x".repeat(padding)).await;
    assert_eq!(landed.status, StatusCode::NO_CONTENT);
    assert_eq!(loki.last().body, at_limit.as_bytes());

    let declared = push(&proxy, &alice, &"x".repeat(2048)).await;
    assert_eq!(declared.status, StatusCode::PAYLOAD_TOO_LARGE);

    // Declared over the limit and held back for `100-continue` (as curl
    // holds a large body): refused by its head, the body never asked for.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut client = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let head = format!(
        "POST {PUSH} HTTP/1.1\r\nhost: proxy\r\nauthorization: {alice}\r\n\
         content-type: application/json\r\ncontent-length: 2048\r\n\
         expect: 100-continue\r\nconnection: close\r\n\r\n",
    );
    client.write_all(head.as_bytes()).await.unwrap();
    let mut status_line = [0; 12];
    client.read_exact(&mut status_line).await.unwrap();
    assert_eq!(&status_line, b"HTTP/1.1 413");

    // A chunked body (no Content-Length) that grows past the limit.
    let chunks = futures_util::stream::iter((0..8).map(|_| {
        Ok::<_, std::io::Error>(hyper::body::Frame::data(bytes::Bytes::from(vec![
            b'y';
            512
        ])))
    }));
    let body = http_body_util::StreamBody::new(chunks);
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let request = http::Request::post(proxy.url(PUSH))
        .header("authorization", &alice)
        .body(body)
        .unwrap();
    let streamed = client.request(request).await.unwrap();
    assert_eq!(streamed.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert!(loki.received().iter().all(|r| r.body.len() <= 1024));
    assert_eq!(
        push(&proxy, &alice, "small").await.status,
        StatusCode::NO_CONTENT
    );
}

#[tokio::test]
async fn upstream_path_prefix_is_prepended() {
    support::captured_logs();
    let loki = LokiStandIn::start().await;
    let proxy =
        RunningProxy::start(ProxyOptions::new(format!("{}/gateway/loki/", loki.url()))).await;
    assert_eq!(
        push(&proxy, &basic("alice", "alice-pw"), "x").await.status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(loki.last().path, "/gateway/loki/loki/api/v1/push");
}

#[tokio::test]
async fn shutdown_lets_in_flight_requests_finish() {
    let (loki, mut proxy) = setup().await;
    let in_flight = stalled_at_upstream(&proxy, &loki, basic("alice", "alice-pw"), "500").await;
    proxy.trigger_shutdown();
    let reply = in_flight.await.unwrap();
    assert_eq!(reply.status, StatusCode::OK);
    proxy.join().await;
    assert!(
        tokio::net::TcpStream::connect(proxy.addr).await.is_err(),
        "listener closed"
    );
}

/// A connection that has not shown which HTTP it speaks has no request to
/// finish: shutdown closes it at once rather than after the grace period
/// (5 s in these tests).
#[tokio::test]
async fn shutdown_closes_connections_that_have_not_spoken_at_once() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (_loki, mut proxy) = setup().await;
    let silent = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let mut half_preface = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    half_preface.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    // Both accepted and being read before the shutdown: a request after
    // them on a third connection has been answered.
    assert_eq!(
        get(&proxy.url(QUERY), &basic("alice", "alice-pw"))
            .await
            .status,
        StatusCode::OK
    );
    proxy.trigger_shutdown();
    tokio::time::timeout(Duration::from_secs(4), proxy.join())
        .await
        .expect("shutdown did not wait for the grace period");
    for (name, mut stream) in [("silent", silent), ("half preface", half_preface)] {
        let mut seen = Vec::new();
        // Closed (a reset would do too): the read ends.
        let _ = tokio::time::timeout(Duration::from_secs(4), stream.read_to_end(&mut seen))
            .await
            .unwrap_or_else(|_| panic!("{name}: still open"));
        assert!(seen.is_empty(), "{name}: closed without an answer");
    }
}

#[tokio::test]
async fn no_secret_reaches_logs_metrics_or_error_bodies() {
    let (_loki, mut proxy) = setup().await;
    let good = basic("alice", "alice-pw");
    let bad = basic("alice", "hunter2-guess");
    let mut bodies = String::new();
    for auth in [&good, &bad] {
        bodies.push_str(&get(&proxy.url(QUERY), auth).await.text());
        bodies.push_str(&push(&proxy, auth, "x").await.text());
    }
    bodies.push_str(&get(&proxy.url("/flush"), &bad).await.text());
    let rotated = support::tenants_yaml(&[support::TenantSpec {
        id: "team-a",
        users: &[("alice", "alice-rotated", None)],
    }]);
    proxy.rewrite_tenants(&rotated).await;
    bodies.push_str(&get(&proxy.url(QUERY), &good).await.text());
    proxy.rewrite_tenants("tenants: [ {id: \n").await;

    let hashes: Vec<String> = std::fs::read_to_string(&proxy.tenants_file)
        .unwrap()
        .lines()
        .chain(rotated.lines())
        .filter_map(|l| l.split('"').nth(1).map(str::to_owned))
        .filter(|h| h.starts_with("$argon2id$"))
        .collect();
    let metrics = proxy.metrics().await;
    proxy.stop().await;
    let logs = String::from_utf8_lossy(&support::captured_logs().lock().unwrap()).into_owned();
    assert!(logs.contains("tenants file loaded"), "logs were captured");
    assert!(
        logs.contains(r#""user":"alice","#) && logs.contains(r#""target":"access"}"#),
        "access lines were captured"
    );
    for line in logs.lines().filter(|l| l.contains(r#""target":"access"}"#)) {
        let line: serde_json::Value = serde_json::from_str(line).unwrap();
        let duration = line["fields"]["duration_ms"].to_string();
        let decimals = duration.split_once('.').map_or(0, |(_, d)| d.len());
        assert!(decimals <= 3, "a duration to the microsecond: {line}");
    }
    let token = |auth: &str| auth.trim_start_matches("Basic ").to_owned();
    let secrets = [
        "alice-pw".to_owned(),
        "hunter2-guess".to_owned(),
        "alice-rotated".to_owned(),
        token(&good),
        token(&bad),
    ];
    for secret in secrets.iter().chain(&hashes) {
        assert!(!logs.contains(secret.as_str()), "log leaks {secret}");
        assert!(!metrics.contains(secret.as_str()), "metrics leak {secret}");
        assert!(
            !bodies.contains(secret.as_str()),
            "error bodies leak {secret}"
        );
    }
    assert!(!metrics.contains("alice"), "no usernames as metric labels");
}

/// Every encoding a Loki client sends, each a body Loki reads (the stand-in
/// refuses what Loki refuses), reaches it byte for byte with its headers.
#[tokio::test]
async fn push_bodies_and_encodings_reach_loki_byte_for_byte() {
    let (loki, proxy) = setup().await;
    let legacy = r#"{"streams":[{"labels":"{app=\"test\"}","entries":[{"ts":"2023-11-14T22:13:20Z","line":"legacy json"}]}]}"#;
    let cases: [(&str, &str, Option<&str>, Vec<u8>); 5] = [
        (
            "/loki/api/v1/push",
            "application/x-protobuf",
            None,
            loki_push::protobuf(&["protobuf", "caf\u{e9} \u{1f600}"]),
        ),
        (
            "/loki/api/v1/push",
            "application/x-protobuf",
            Some("snappy"),
            loki_push::protobuf(&["declared snappy"]),
        ),
        (
            "/loki/api/v1/push",
            "application/json; charset=utf-8",
            Some("gzip"),
            gzip(&loki_push::json("gzipped json")),
        ),
        (
            "/loki/api/v1/push",
            "application/json",
            Some("deflate"),
            deflate(&loki_push::json("deflated json")),
        ),
        (
            "/api/prom/push",
            "application/json",
            None,
            legacy.as_bytes().to_vec(),
        ),
    ];
    for (path, content_type, encoding, body) in cases {
        let mut headers = vec![("content-type", content_type)];
        if let Some(encoding) = encoding {
            headers.push(("content-encoding", encoding));
        }
        let reply = send(
            Method::POST,
            &proxy.url(path),
            Some(&basic("pusher-a", "pusher-pw")),
            &headers,
            body.clone(),
        )
        .await;
        assert_eq!(
            reply.status,
            StatusCode::NO_CONTENT,
            "{path} {content_type} {encoding:?}: {}",
            reply.text()
        );
        let seen = loki.last();
        assert_eq!(seen.path, path);
        assert_eq!(seen.body.as_ref(), body.as_slice());
        assert_eq!(seen.headers["content-type"], content_type);
        assert_eq!(
            seen.headers
                .get("content-encoding")
                .map(|v| v.to_str().unwrap()),
            encoding
        );
    }
    let read = get(&proxy.url(QUERY), &basic("alice", "alice-pw")).await;
    assert_eq!(
        read.json()["data"]["result"],
        serde_json::json!([
            "protobuf",
            "caf\u{e9} \u{1f600}",
            "declared snappy",
            "gzipped json",
            "deflated json",
            "legacy json"
        ]),
        "Loki read every line"
    );
}

fn gzip(text: &str) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), Default::default());
    encoder.write_all(text.as_bytes()).unwrap();
    encoder.finish().unwrap()
}

fn deflate(text: &str) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::DeflateEncoder::new(Vec::new(), Default::default());
    encoder.write_all(text.as_bytes()).unwrap();
    encoder.finish().unwrap()
}

/// Headers of a push.
type Headers = &'static [(&'static str, &'static str)];

/// What real Loki refuses, the stand-in refuses, so no test here passes on
/// a push only a lenient stand-in would take; the proxy forwards each as
/// it came and passes Loki's 400 on (the client drops the batch).
#[tokio::test]
async fn the_loki_stand_in_refuses_the_pushes_loki_refuses() {
    let (loki, proxy) = setup().await;
    let json: Headers = &[("content-type", "application/json")];
    // Each refused for its own reason, in Loki's words where it has them.
    let cases: [(Headers, Vec<u8>, &str); 6] = [
        (
            &[],
            loki_push::json("no content type").into_bytes(),
            "mime: no media type",
        ),
        (json, b"line".to_vec(), "expected value"),
        (
            &[("content-type", "application/x-protobuf")],
            b"not snappy".to_vec(),
            "snappy",
        ),
        (
            &[
                ("content-type", "application/json"),
                ("content-encoding", "GZIP"),
            ],
            loki_push::json("coding compared exactly").into_bytes(),
            "Content-Encoding \"GZIP\" not supported",
        ),
        (
            &[
                ("content-type", "application/json"),
                ("content-encoding", "gzip"),
            ],
            loki_push::json("not gzipped").into_bytes(),
            "gzip",
        ),
        (
            json,
            br#"{"streams":[{"stream":{},"values":[["1","unlabelled"]]}]}"#.to_vec(),
            "at least one label pair is required per stream",
        ),
    ];
    for (headers, body, why) in cases {
        let reply = send(
            Method::POST,
            &proxy.url(PUSH),
            Some(&basic("alice", "alice-pw")),
            headers,
            body.clone(),
        )
        .await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{headers:?}");
        assert!(reply.text().contains(why), "{headers:?}: {}", reply.text());
        assert_eq!(loki.last().body.as_ref(), body.as_slice());
    }
    let read = get(&proxy.url(QUERY), &basic("alice", "alice-pw")).await;
    assert_eq!(read.json()["data"]["result"], serde_json::json!([]));
}

#[tokio::test]
async fn in_flight_requests_survive_a_reload_that_removes_their_user() {
    let (loki, mut proxy) = setup().await;
    let in_flight = stalled_at_upstream(&proxy, &loki, basic("bob", "bob-pw"), "300").await;
    let without_bob = support::tenants_yaml(&[support::TenantSpec {
        id: "team-a",
        users: &[("alice", "alice-pw", None)],
    }]);
    assert_eq!(proxy.rewrite_tenants(&without_bob).await.last_error, None);
    let reply = in_flight.await.unwrap();
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json()["data"]["tenant"], "team-b");
    assert_eq!(
        get(&proxy.url(QUERY), &basic("bob", "bob-pw")).await.status,
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test]
async fn idle_slow_and_silent_connections_are_closed_after_the_header_read_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    support::captured_logs();
    let loki = LokiStandIn::start().await;
    let mut options = ProxyOptions::new(loki.url());
    options.limits = "  header_read_timeout: 200ms\n";
    let proxy = RunningProxy::start(options).await;

    // Idle keep-alive: one request, then silence until the proxy hangs up.
    let mut idle = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let request = format!(
        "GET /loki/api/v1/labels HTTP/1.1\r\nHost: p\r\nAuthorization: {}\r\n\r\n",
        basic("alice", "alice-pw")
    );
    idle.write_all(request.as_bytes()).await.unwrap();
    // Slow client: half a request head, never finished.
    let mut slow = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    slow.write_all(b"GET /loki/api/v1/labels HTTP/1.1\r\nHost:")
        .await
        .unwrap();
    // Silent: connected, never a byte (hyper waits for the first bytes to
    // tell HTTP/2 from HTTP/1.1, with no clock of its own).
    let mut silent = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    // Half of HTTP/2's preface, the rest never sent.
    let mut half_preface = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    half_preface.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();

    for (name, stream) in [
        ("idle", &mut idle),
        ("slow", &mut slow),
        ("silent", &mut silent),
        ("half preface", &mut half_preface),
    ] {
        let mut seen = Vec::new();
        let closed =
            tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut seen)).await;
        assert!(closed.is_ok(), "{name} connection closed by the proxy");
        if name == "idle" {
            assert!(String::from_utf8_lossy(&seen).starts_with("HTTP/1.1 200"));
        }
    }
}

#[tokio::test]
async fn request_heads_over_the_count_or_size_limit_get_431_and_never_reach_loki() {
    let loki = LokiStandIn::start().await;
    let mut options = ProxyOptions::new(loki.url());
    options.limits = "  max_header_bytes: 8192\n  max_header_count: 40\n";
    let proxy = RunningProxy::start(options).await;
    let auth = basic("alice", "alice-pw");

    let names: Vec<String> = (0..50).map(|i| format!("x-field-{i}")).collect();
    let many: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "1")).collect();
    let big_value = "v".repeat(9 * 1024);
    for (what, headers) in [
        ("50 fields", many),
        ("a 9 KiB field", vec![("x-big", big_value.as_str())]),
    ] {
        let reply = send(Method::GET, &proxy.url(QUERY), Some(&auth), &headers, "").await;
        assert_eq!(
            reply.status,
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "{what}"
        );
    }
    // Under both limits the same request is served.
    let few: Vec<(&str, &str)> = names[..20].iter().map(|n| (n.as_str(), "1")).collect();
    let reply = send(Method::GET, &proxy.url(QUERY), Some(&auth), &few, "").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(loki.received().len(), 1, "only the request within limits");
}
