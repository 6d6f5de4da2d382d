//! tenant-sync and tenant-proxy together: a Secret created, rotated and
//! deleted in the (stand-in) cluster changes who the proxy lets in, while
//! another tenant's traffic carries on without a single failure.

mod support;

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::json;
use support::apiserver::{ApiServer, Kind};
use support::RunningSync;
use tenant_proxy::config::Config;
use tenant_proxy::tenants::reload::ReloadStatus;
use tenant_proxy::Proxy;
use tokio::net::TcpListener;

/// An upstream that accepts everything (204): only the proxy's answer matters.
async fn accepting_upstream() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service =
                hyper::service::service_fn(|_req: Request<hyper::body::Incoming>| async {
                    let mut response = Response::new(Empty::<Bytes>::new());
                    *response.status_mut() = StatusCode::NO_CONTENT;
                    Ok::<_, Infallible>(response)
                });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service),
            );
        }
    });
    addr
}

async fn status_for(proxy: std::net::SocketAddr, user: &str, password: &str) -> StatusCode {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    let request = Request::get(format!("http://{proxy}/loki/api/v1/labels"))
        .header("authorization", format!("Basic {token}"))
        .body(Empty::new())
        .unwrap();
    let response = client.request(request).await.unwrap();
    let status = response.status();
    let _ = response.into_body().collect().await;
    status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_drive_who_the_proxy_lets_in_without_disturbing_other_tenants() {
    let api = ApiServer::start().await;
    api.namespace("team-a", json!({}));
    api.namespace("team-b", json!({}));
    api.secret(
        "team-b",
        "steady",
        &[("username", "steady-b"), ("password", "steady-pw")],
        json!({}),
    );
    let mut sync = RunningSync::start(&api, |_| {});
    sync.next_write().await;

    let upstream = accepting_upstream().await;
    let config = Config::parse(&format!(
        "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\ntenants_file: {}\ntenants_poll_interval: 200ms\nlogs:\n  upstream: http://{upstream}\n",
        sync.file.display()
    ))
    .unwrap();
    let proxy = Proxy::new(config).unwrap();
    let mut reloads = proxy.tenants().subscribe();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(proxy.serve(listener, admin, async {
        let _ = stop_rx.await;
    }));

    // Another tenant's traffic, bounded in count and time, for the whole test.
    let done = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let steady = {
        let (done, ok, failed) = (done.clone(), ok.clone(), failed.clone());
        tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(120);
            for _ in 0..20_000 {
                if done.load(Ordering::Relaxed) || Instant::now() > deadline {
                    break;
                }
                match status_for(addr, "steady-b", "steady-pw").await {
                    StatusCode::NO_CONTENT => ok.fetch_add(1, Ordering::Relaxed),
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };

    // After tenant-sync writes, wait for the proxy to load that content.
    async fn applied(
        sync: &mut RunningSync,
        reloads: &mut tokio::sync::watch::Receiver<ReloadStatus>,
    ) {
        let before = reloads.borrow_and_update().generation;
        sync.next_write().await;
        tokio::time::timeout(
            Duration::from_secs(30),
            reloads.wait_for(|s| s.generation > before),
        )
        .await
        .expect("the proxy loaded the new file within 30 s")
        .unwrap();
    }

    let started = Instant::now();
    api.secret(
        "team-a",
        "grafana",
        &[("username", "alice"), ("password", "first")],
        json!({}),
    );
    applied(&mut sync, &mut reloads).await;
    assert_eq!(
        status_for(addr, "alice", "first").await,
        StatusCode::NO_CONTENT
    );

    api.secret(
        "team-a",
        "grafana",
        &[("username", "alice"), ("password", "second")],
        json!({}),
    );
    applied(&mut sync, &mut reloads).await;
    assert_eq!(
        status_for(addr, "alice", "first").await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        status_for(addr, "alice", "second").await,
        StatusCode::NO_CONTENT
    );

    api.delete(Kind::Secret, "team-a/grafana");
    applied(&mut sync, &mut reloads).await;
    assert_eq!(
        status_for(addr, "alice", "second").await,
        StatusCode::UNAUTHORIZED
    );
    let elapsed = started.elapsed();

    done.store(true, Ordering::Relaxed);
    steady.await.unwrap();
    assert!(ok.load(Ordering::Relaxed) > 0, "the steady client ran");
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "no failed request for the other tenant"
    );
    eprintln!(
        "create, rotate, delete applied end to end in {elapsed:?}; steady requests: {}",
        ok.load(Ordering::Relaxed)
    );

    let _ = stop_tx.send(());
    served.await.unwrap();
    sync.stop().await.unwrap();
}
