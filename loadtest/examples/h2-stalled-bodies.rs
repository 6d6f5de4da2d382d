//! Many HTTP/2 streams each holding a push body.
//!
//! Opens CONNECTIONS HTTP/2 connections (prior knowledge) to the proxy as
//! one credential, and on each STREAMS streams, each sending a BODY_BYTES
//! push; then prints the proxy's RSS before and while they are held, with
//! `tenant_proxy_large_body_bytes`. The proxy runs with
//! `limits.max_large_body_bytes_held` at the manifests' 32 MiB, and:
//!
//! - `remote-write` (the default): label mode, each push but its last
//!   byte sent, its upstream a closed port (nothing is ever forwarded);
//! - `loki-stalled`: a Loki push (header mode) sent whole, streamed to a
//!   Loki that takes connections and never reads from them, as an
//!   overloaded one may;
//! - `wrong-password`: the same Loki push with a wrong password of its
//!   own on each stream, each connection from an address of its own
//!   (127.1.x.y), as a guesser with many addresses (none out of failures):
//!   the streams wait for their verification;
//! - `unread-answers`: the same Loki push without a credential, from a
//!   client that gives the answers no window (so a 401's body can never
//!   be sent) and holds them.
//!
//! ```sh
//! cargo run --release -p loadtest --example h2-stalled-bodies -- \
//!     target/release/tenant-proxy 10 200 60000 [MODE]
//! ```
//!
//! `MAX_CONCURRENT_REQUESTS=N` in the environment sets
//! `limits.max_concurrent_requests` (off if unset), `MAX_HTTP2_STREAMS=N`
//! `limits.max_http2_streams` (200 if unset); `HEAD_BYTES=N` pads each
//! request's head with a field of N bytes.
//!
//! Loopback only; every port is a free one; the proxy is killed at the end.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use base64::Engine;
use bytes::Bytes;
use http_body_util::StreamBody;
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::sync::mpsc;

const BOUND: u64 = 32 << 20;
/// examples/proxy/tenants.yaml
const USER: &str = "team-b:team-b-password";

type Chunk = Result<Frame<Bytes>, Infallible>;

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (binary, connections, streams, body_bytes, mode) = match &args[..] {
        [_, b, c, s, n] => (b, c, s, n, "remote-write"),
        [_, b, c, s, n, mode] => (b, c, s, n, mode.as_str()),
        _ => bail!("usage: h2-stalled-bodies PROXY_BINARY CONNECTIONS STREAMS BODY_BYTES [MODE]"),
    };
    let (stalled_loki, wrong_passwords) = match mode {
        "remote-write" => (false, false),
        "loki-stalled" => (true, false),
        "wrong-password" => (true, true),
        "unread-answers" => (true, false),
        other => bail!("unknown mode {other:?}"),
    };
    let unread_answers = mode == "unread-answers";
    let (connections, streams): (usize, usize) = (connections.parse()?, streams.parse()?);
    let body_bytes: usize = body_bytes.parse()?;
    let padding = "p".repeat(match std::env::var("HEAD_BYTES") {
        Ok(n) => n.parse().context("HEAD_BYTES")?,
        Err(_) => 0,
    });
    let max_concurrent_requests: usize = std::env::var("MAX_CONCURRENT_REQUESTS")
        .map_or(Ok(0), |n| n.parse())
        .context("MAX_CONCURRENT_REQUESTS")?;
    let max_http2_streams: u32 = std::env::var("MAX_HTTP2_STREAMS")
        .map_or(Ok(200), |n| n.parse())
        .context("MAX_HTTP2_STREAMS")?;

    let work = tempfile_dir()?;
    let (port, admin, closed) = (free_port()?, free_port()?, free_port()?);
    // Takes connections and never reads: what it was sent stays in the
    // kernel's buffers, then in the proxy's.
    let never_reads = std::net::TcpListener::bind("127.0.0.1:0")?;
    let loki = never_reads.local_addr()?.port();
    let accepted = std::thread::spawn(move || {
        never_reads
            .incoming()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    });
    drop(accepted);
    let repo = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    std::fs::copy(
        format!("{repo}/examples/proxy/tenants.yaml"),
        work.join("tenants.yaml"),
    )?;
    std::fs::write(
        work.join("config.yaml"),
        format!(
            "listen: 127.0.0.1:{port}\nadmin_listen: 127.0.0.1:{admin}\n\
             tenants_file: tenants.yaml\nlogs:\n  upstream: http://127.0.0.1:{loki}\n\
             metrics:\n  upstream: http://127.0.0.1:{closed}\n  \
             mode: label\nlimits:\n  max_large_body_bytes_held: {BOUND}\n  \
             max_concurrent_requests: {max_concurrent_requests}\n  \
             max_http2_streams: {max_http2_streams}\n"
        ),
    )?;
    let proxy = KilledOnDrop(
        std::process::Command::new(binary)
            .arg("--config")
            .arg(work.join("config.yaml"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("starting the proxy")?,
    );
    let pid = proxy.0.id();
    let started = Instant::now();
    while admin_get(admin, "/readyz").await.is_err() {
        if started.elapsed() > Duration::from_secs(10) {
            bail!("the proxy did not get ready");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let auth = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(USER)
    );
    let before = rss_mib(pid)?;

    let path = match stalled_loki {
        true => "/loki/api/v1/push",
        false => "/api/v1/write",
    };
    let mut held: Vec<mpsc::Sender<Chunk>> = Vec::new();
    for _ in 0..connections {
        let socket = tokio::net::TcpSocket::new_v4()?;
        if wrong_passwords {
            // Each connection from an address of its own (127.1.x.y), as
            // a guesser with many addresses: none is out of failures.
            let n = held.len() / streams + 1;
            socket.bind(std::net::SocketAddr::from((
                [127, 1, (n >> 8) as u8, n as u8],
                0,
            )))?;
        }
        let tcp = socket
            .connect(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
            .await?;
        let mut client = hyper::client::conn::http2::Builder::new(TokioExecutor::new());
        if unread_answers {
            // The answers' bodies can never be sent: no window for them.
            client.initial_stream_window_size(0);
        }
        let (sender, connection) = client.handshake(TokioIo::new(tcp)).await?;
        tokio::spawn(connection);
        for stream in 0..streams {
            let auth = match wrong_passwords {
                false => auth.clone(),
                true => format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD
                        .encode(format!("team-b:wrong-{}-{stream}", held.len()))
                ),
            };
            let (send, mut receive) = mpsc::channel::<Chunk>(1);
            let body = StreamBody::new(futures::stream::poll_fn(move |cx| receive.poll_recv(cx)));
            let mut request = http::Request::post(format!("http://127.0.0.1:{port}{path}"));
            if !unread_answers {
                request = request.header("authorization", &auth);
            }
            let request = request
                .header("content-type", "application/x-protobuf")
                .header("content-encoding", "snappy")
                .header("content-length", body_bytes)
                .header("x-padding", &padding)
                .body(body)?;
            let sent = body_bytes - usize::from(!stalled_loki);
            send.send(Ok(Frame::data(Bytes::from(vec![7; sent]))))
                .await?;
            held.push(send);
            let mut sender = sender.clone();
            tokio::spawn(async move {
                if sender.ready().await.is_ok() {
                    let _answer = sender.send_request(request).await;
                    // Held, never read.
                    std::future::pending::<()>().await;
                }
            });
        }
    }
    // The last streams' bytes may still be on their way: read the RSS
    // until it stops moving (ten reads 100 ms apart alike, or 10 s).
    let (mut rss, mut same, started) = (rss_mib(pid)?, 0, Instant::now());
    while same < 10 && started.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = rss_mib(pid)?;
        same = if now == rss { same + 1 } else { 0 };
        rss = now;
    }
    let metrics = admin_get(admin, "/metrics").await?;
    let counted = metrics
        .lines()
        .find_map(|line| line.strip_prefix("tenant_proxy_large_body_bytes "))
        .unwrap_or("?");
    println!(
        "| {binary} | {connections} | {streams} | {body_bytes} | {before} | {rss} | {counted} |"
    );
    drop((proxy, held));
    std::fs::remove_dir_all(work)?;
    Ok(())
}

/// The proxy, stopped by its PID whichever way `main` ends.
struct KilledOnDrop(std::process::Child);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn tempfile_dir() -> Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("h2-stalled-bodies-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn rss_mib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .context("VmRSS")?;
    Ok(kib.parse::<u64>()? / 1024)
}

async fn admin_get(port: u16, path: &str) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let request = format!("GET {path} HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await?;
    if !answer.starts_with("HTTP/1.1 200") {
        bail!("{path}: {}", answer.lines().next().unwrap_or_default());
    }
    Ok(answer)
}
