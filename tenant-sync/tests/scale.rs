//! Scale report (not run by default; it measures, it does not assert time):
//!
//! ```sh
//! cargo test --release -p tenant-sync --test scale -- --ignored --nocapture
//! ```
//!
//! 5,000 Secrets over 1,000 namespaces: cold start to the first complete
//! file, with pre-hashed (`password-hash`) and with plaintext passwords.
//! And one namespace flooding 3,000 plaintext Secrets beside 100 quiet
//! tenants: the cold start with the credential cap and without.

mod support;

use std::time::Instant;

use serde_json::json;
use support::apiserver::ApiServer;
use support::RunningSync;

const NAMESPACES: usize = 1_000;
const PER_NAMESPACE: usize = 5;

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

async fn cluster(plaintext_every: usize, hash: &str) -> ApiServer {
    let api = ApiServer::start().await;
    for n in 0..NAMESPACES {
        let ns = format!("team-{n:04}");
        api.namespace(&ns, json!({}));
        for s in 0..PER_NAMESPACE {
            let user = format!("user-{n:04}-{s}");
            let i = n * PER_NAMESPACE + s;
            if plaintext_every > 0 && i % plaintext_every == 0 {
                api.secret(
                    &ns,
                    &format!("cred-{s}"),
                    &[("username", &user), ("password", "a-password")],
                    json!({}),
                );
            } else {
                api.secret(
                    &ns,
                    &format!("cred-{s}"),
                    &[("username", &user), ("password-hash", hash)],
                    json!({}),
                );
            }
        }
    }
    api
}

async fn cold_start(label: &str, api: &ApiServer) {
    let before = rss_kib();
    let started = Instant::now();
    let mut sync = RunningSync::start(api, |_| {});
    let users = sync.next_write().await;
    let elapsed = started.elapsed();
    assert_eq!(users.len(), NAMESPACES * PER_NAMESPACE);
    let file = std::fs::metadata(&sync.file).unwrap().len();
    println!(
        "{label}: {} credentials, cold start {:.2} s, file {} KiB, RSS +{} MiB (stand-in included)",
        users.len(),
        elapsed.as_secs_f64(),
        file / 1024,
        rss_kib().saturating_sub(before) / 1024
    );
    sync.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "a measurement: run with --ignored --release"]
async fn cold_start_with_5000_secrets() {
    let hash = tenant_proxy::auth::password::hash_password("a-password").unwrap();
    let prehashed = cluster(0, &hash).await;
    cold_start("password-hash Secrets", &prehashed).await;
    drop(prehashed);
    // One plaintext Secret in ten: 500 argon2id hashes on a cold start.
    let mixed = cluster(10, &hash).await;
    cold_start("1 in 10 plaintext", &mixed).await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "a measurement: run with --ignored --release"]
async fn cold_start_with_one_namespace_flooding_plaintext_secrets() {
    const FLOOD: usize = 3_000;
    const QUIET: usize = 100;
    let api = ApiServer::start().await;
    api.namespace("flood", json!({}));
    for s in 0..FLOOD {
        api.secret(
            "flood",
            &format!("cred-{s:04}"),
            &[("username", &format!("flood-{s:04}")), ("password", "pw")],
            json!({}),
        );
    }
    let hash = tenant_proxy::auth::password::hash_password("a-password").unwrap();
    for n in 0..QUIET {
        let ns = format!("quiet-{n:03}");
        api.namespace(&ns, json!({}));
        api.secret(
            &ns,
            "cred",
            &[
                ("username", &format!("user-{n:03}")),
                ("password-hash", &hash),
            ],
            json!({}),
        );
    }
    for cap in [Some(1_000), None] {
        let started = Instant::now();
        let mut sync = RunningSync::start(&api, |options| {
            options.conventions.max_credentials_per_tenant = cap;
        });
        let users = sync.next_write().await;
        println!(
            "cap {cap:?}: {} credentials, cold start {:.2} s",
            users.len(),
            started.elapsed().as_secs_f64()
        );
        assert_eq!(users.len(), QUIET + cap.unwrap_or(FLOOD));
        sync.stop().await.unwrap();
    }
}
