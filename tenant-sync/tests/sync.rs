//! tenant-sync against an API server stand-in: the real kube client lists and
//! watches, and the tenants file follows.

mod support;

use serde_json::json;
use serde_json::Value;
use std::time::Duration;
use support::apiserver::{events, ApiServer, Kind};
use support::{map, RunningSync};

async fn cluster() -> ApiServer {
    let api = ApiServer::start().await;
    api.namespace("team-a", json!({}));
    api.namespace("team-b", json!({}));
    api.secret(
        "team-a",
        "grafana",
        &[("username", "grafana-a"), ("password", "pw-a")],
        json!({"tenant-proxy/scopes": "logs:read"}),
    );
    api
}

#[tokio::test]
async fn the_file_follows_creates_updates_and_deletes() {
    let api = cluster().await;
    let mut sync = RunningSync::start(&api, |_| {});
    assert_eq!(sync.next_write().await, map(&[("grafana-a", "team-a")]));
    assert!(sync.status.is_ready());
    assert!(sync.verifies("grafana-a", "pw-a"));

    api.secret(
        "team-b",
        "push",
        &[("username", "push-b"), ("password", "pw-b")],
        json!({}),
    );
    assert_eq!(
        sync.next_write().await,
        map(&[("grafana-a", "team-a"), ("push-b", "team-b")])
    );

    api.secret(
        "team-a",
        "grafana",
        &[("username", "grafana-a"), ("password", "rotated")],
        json!({}),
    );
    sync.next_write().await;
    assert!(sync.verifies("grafana-a", "rotated"));
    assert!(!sync.verifies("grafana-a", "pw-a"));

    api.delete(Kind::Secret, "team-b/push");
    assert_eq!(sync.next_write().await, map(&[("grafana-a", "team-a")]));
    api.delete(Kind::Namespace, "team-a");
    assert_eq!(sync.next_write().await, map(&[]));

    let text = std::fs::read_to_string(&sync.file).unwrap();
    for secret in ["pw-a", "pw-b", "rotated"] {
        assert!(!text.contains(secret), "no plaintext in the file");
    }
    sync.stop().await.unwrap();
    // Only collections were read (list and watch): the RBAC in deploy/ and
    // examples/ grants exactly those two verbs (and the writing of Events,
    // which no Secret here gave cause for).
    for request in api.requests() {
        let path = request.split('?').next().unwrap();
        assert!(
            path == "/api/v1/namespaces" || path.ends_with("/secrets"),
            "{request}: not a list or watch of a collection"
        );
    }
}

#[tokio::test]
async fn a_quiet_cluster_is_resynced_without_rewriting_and_a_tampered_file_is_restored() {
    let api = cluster().await;
    let mut sync = RunningSync::start(&api, |o| o.resync_interval = Duration::from_millis(100));
    let written = sync.next_write().await;
    let writes = sync.status.writes();
    let mut syncs = sync.status.syncs();
    let first = *syncs.borrow_and_update();
    // Two resyncs with no event from the cluster: the file stays as it is.
    tokio::time::timeout(Duration::from_secs(10), syncs.wait_for(|n| *n >= first + 2))
        .await
        .expect("resyncs within 10 s")
        .unwrap();
    assert_eq!(*writes.borrow(), 1, "an unchanged file is not rewritten");

    std::fs::write(&sync.file, "tenants: []\n").unwrap();
    assert_eq!(
        sync.next_write().await,
        written,
        "the next resync puts it right"
    );
    sync.stop().await.unwrap();
}

/// What SIGHUP does: the resync an hour away happens now.
#[tokio::test]
async fn a_resync_asked_for_restores_a_tampered_file_at_once() {
    let api = cluster().await;
    let mut sync = RunningSync::start(&api, |_| {});
    let written = sync.next_write().await;
    std::fs::write(&sync.file, "tenants: []\n").unwrap();
    sync.resync.now();
    assert_eq!(sync.next_write().await, written, "put right when asked");
    sync.stop().await.unwrap();
}

/// A cluster whose Namespaces change more often than the debounce (a
/// controller annotating them, say) must not hold a new or revoked
/// credential back for as long as it keeps changing.
#[tokio::test]
async fn a_busy_cluster_still_gets_its_changes_written_within_the_max_delay() {
    let api = cluster().await;
    let mut sync = RunningSync::start(&api, |o| {
        o.debounce = Duration::from_millis(300);
        o.max_delay = Duration::from_millis(900);
    });
    sync.next_write().await;
    api.secret(
        "team-b",
        "push",
        &[("username", "push-b"), ("password", "pw-b")],
        json!({}),
    );
    // An unrelated change every 50 ms, six times within each debounce;
    // bounded at 20 s, long after the 900 ms the write may take.
    let churn = async {
        for round in 0..400 {
            api.namespace("team-a", json!({"churn": round.to_string()}));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::select! {
        users = sync.next_write() => assert_eq!(
            users,
            map(&[("grafana-a", "team-a"), ("push-b", "team-b")])
        ),
        () = churn => panic!("nothing was written while the cluster kept changing"),
    }
    sync.stop().await.unwrap();
}

/// `per_thread` Secrets per hashing thread and as many more, in
/// `namespace`, each with its own username (`{prefix}-{n}`, password
/// `pw`): more passwords than one sync without hashing time hashes.
fn many_secrets(api: &ApiServer, namespace: &str, prefix: &str, per_thread: usize) -> Vec<String> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let users: Vec<String> = (0..per_thread * (threads + 1))
        .map(|i| format!("{prefix}-{i}"))
        .collect();
    for user in &users {
        api.secret(
            namespace,
            user,
            &[("username", user), ("password", "pw")],
            json!({}),
        );
    }
    users
}

/// New passwords are hashed for a bounded time per sync, namespace by
/// namespace in turn (here one per thread per sync): a namespace that adds
/// many Secrets at once holds back neither another tenant's revocation nor
/// its new credential, and its own arrive in the syncs right after.
#[tokio::test]
async fn a_flood_of_new_secrets_holds_back_no_other_change() {
    let api = cluster().await;
    api.namespace("team-flood", json!({}));
    let mut sync = RunningSync::start(&api, |o| o.hashing_per_sync = Duration::ZERO);
    assert_eq!(sync.next_write().await, map(&[("grafana-a", "team-a")]));
    let flood = many_secrets(&api, "team-flood", "flood", 4);
    api.delete(Kind::Secret, "team-a/grafana");
    api.secret(
        "team-b",
        "push",
        &[("username", "push-b"), ("password", "pw-b")],
        json!({}),
    );
    // Bounded: each write hashes at least one more flood password.
    let mut written = sync.next_write().await;
    for _ in 0..flood.len() {
        if written.contains_key("push-b") {
            break;
        }
        written = sync.next_write().await;
    }
    assert!(!written.contains_key("grafana-a"), "revoked: {written:?}");
    let flooded = flood.iter().filter(|u| written.contains_key(*u)).count();
    assert!(
        flooded < flood.len(),
        "team-b's credential came before all of team-flood's: {written:?}"
    );
    assert_eq!(
        sync.metrics.credentials.get(),
        written.len() as i64,
        "the credentials in the file, not those still hashing"
    );
    for _ in 0..flood.len() {
        if flood.iter().all(|u| written.contains_key(u)) {
            break;
        }
        written = sync.next_write().await;
    }
    assert!(flood.iter().all(|u| written.contains_key(u)), "{written:?}");
    assert!(sync.verifies("flood-0", "pw") && sync.verifies("push-b", "pw-b"));
    sync.stop().await.unwrap();
}

/// However short the hashing time per sync, the first file waits for every
/// hash: a first file that left some out would refuse those tenants until
/// the next sync.
#[tokio::test]
async fn the_first_file_waits_for_every_hash() {
    let api = cluster().await;
    let users = many_secrets(&api, "team-b", "push", 2);
    let mut sync = RunningSync::start(&api, |o| o.hashing_per_sync = Duration::ZERO);
    let written = sync.next_write().await;
    assert!(users.iter().all(|u| written.contains_key(u)), "{written:?}");
    assert_eq!(written.len(), users.len() + 1, "{written:?}");
    assert_eq!(sync.metrics.credentials.get(), written.len() as i64);
    sync.stop().await.unwrap();
}

#[tokio::test]
async fn a_selector_annotation_reaches_the_proxy() {
    let api = cluster().await;
    api.secret(
        "team-a",
        "narrow",
        &[("username", "narrow-a"), ("password", "pw-n")],
        json!({"tenant-proxy/scopes": "logs:read,metrics:read", "tenant-proxy/selector": "{app='pay'}"}),
    );
    let mut sync = RunningSync::start(&api, |_| {});
    sync.next_write().await;
    let text = std::fs::read_to_string(&sync.file).unwrap();
    let (store, _) = tenant_proxy::tenants::file::parse(&text, 1).unwrap();
    let narrow = store.credential("narrow-a").unwrap();
    assert_eq!(narrow.selector.as_ref().unwrap().as_str(), r#"{app="pay"}"#);
    assert!(store.credential("grafana-a").unwrap().selector.is_none());
    sync.stop().await.unwrap();
}

#[tokio::test]
async fn a_secret_cannot_claim_another_namespace_and_relabelling_moves_it() {
    let api = ApiServer::start().await;
    api.namespace("shop-prod", json!({"tenant": "shop"}));
    api.namespace("blog", json!({"tenant": "blog"}));
    api.secret(
        "shop-prod",
        "s",
        &[("username", "shop-user"), ("password", "p")],
        json!({}),
    );
    let mut sync = RunningSync::start(&api, |o| o.conventions.tenant_label = Some("tenant".into()));
    assert_eq!(sync.next_write().await, map(&[("shop-user", "shop")]));
    api.namespace("shop-prod", json!({"tenant": "blog"}));
    assert_eq!(sync.next_write().await, map(&[("shop-user", "blog")]));
    sync.stop().await.unwrap();
}

#[tokio::test]
async fn a_missed_delete_is_caught_by_the_relist_after_410_gone() {
    let api = cluster().await;
    api.secret(
        "team-b",
        "push",
        &[("username", "push-b"), ("password", "pw-b")],
        json!({}),
    );
    let mut sync = RunningSync::start(&api, |_| {});
    assert_eq!(
        sync.next_write().await,
        map(&[("grafana-a", "team-a"), ("push-b", "team-b")])
    );

    // The watch is cut and held off, the Secret deleted while nobody
    // watches, the event log compacted: the reconnecting watch gets 410 and
    // must re-list to notice.
    api.hold_watches(Kind::Secret);
    api.cut_watches();
    api.wait_for_requests("/api/v1/secrets?&watch=true", 2)
        .await;
    api.delete(Kind::Secret, "team-b/push");
    api.compact();
    api.release();
    assert_eq!(sync.next_write().await, map(&[("grafana-a", "team-a")]));
    let metrics = sync.metrics.encode();
    assert!(
        metrics.contains("tenant_sync_watch_relists_total{resource=\"secrets\"} 2"),
        "{metrics}"
    );
    assert!(api
        .requests()
        .iter()
        .any(|r| r.contains("allowWatchBookmarks=true")));
    sync.stop().await.unwrap();
}

#[tokio::test]
async fn nothing_is_written_before_every_initial_list_completes() {
    let api = cluster().await;
    api.hold_lists(Kind::Secret);
    let mut sync = RunningSync::start(&api, |_| {});
    api.wait_for_request("/api/v1/secrets?").await;
    api.wait_for_request("/api/v1/namespaces?").await;
    assert!(
        !sync.file.exists(),
        "no partial file while Secrets are still listing"
    );
    assert!(!sync.status.is_ready());
    api.release();
    assert_eq!(sync.next_write().await, map(&[("grafana-a", "team-a")]));
    sync.stop().await.unwrap();
}

#[tokio::test]
async fn once_renders_after_the_initial_lists_and_exits() {
    let api = cluster().await;
    api.secret("team-b", "empty", &[("username", "empty-b")], json!({}));
    let mut sync = RunningSync::start(&api, |o| o.once = true);
    sync.finished().await.unwrap();
    assert_eq!(sync.users(), map(&[("grafana-a", "team-a")]));
    // The Event for the Secret left out went out before the exit.
    let events = api.events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["regarding"]["name"], "empty");
    let metrics = sync.metrics.encode();
    let published = r#"tenant_sync_events_total{outcome="published"} 1"#;
    assert!(metrics.contains(published), "{metrics}");
}

/// `--namespace-selector` as the API server reads it (`!=` also picks a
/// namespace without the label): the others' Secrets make no credential.
/// A selector the server refuses makes `--once` fail, never write.
#[tokio::test]
async fn only_namespaces_the_selector_picks_are_tenants() {
    let api = ApiServer::start().await;
    api.namespace("team-a", json!({"env": "dev"}));
    api.namespace("team-b", json!({"env": "prod"}));
    api.namespace("team-c", json!({}));
    for namespace in ["team-a", "team-b", "team-c"] {
        let username = format!("push-{namespace}");
        api.secret(
            namespace,
            "push",
            &[("username", &username), ("password", "pw")],
            json!({}),
        );
    }
    let mut sync = RunningSync::start(&api, |o| {
        o.namespace_selector = Some("env!=prod".into());
    });
    assert_eq!(
        sync.next_write().await,
        map(&[("push-team-a", "team-a"), ("push-team-c", "team-c")])
    );
    sync.stop().await.unwrap();

    let mut refused = RunningSync::start(&api, |o| {
        o.namespace_selector = Some("=prod".into());
        o.once = true;
    });
    let error = refused.finished().await.unwrap_err();
    assert!(error.to_string().contains("namespaces"), "{error}");
    assert!(!refused.file.exists(), "nothing written");
}

#[tokio::test]
async fn skipped_secrets_are_counted_by_reason() {
    let api = cluster().await;
    api.secret(
        "team-b",
        "dup",
        &[("username", "grafana-a"), ("password", "x")],
        json!({}),
    );
    api.secret("team-b", "broken", &[("password", "x")], json!({}));
    let mut sync = RunningSync::start(&api, |_| {});
    // Same creation time: the first by namespace/name wins, team-a/grafana.
    assert_eq!(sync.next_write().await, map(&[("grafana-a", "team-a")]));
    let metrics = sync.metrics.encode();
    assert!(
        metrics.contains("tenant_sync_skipped_secrets{reason=\"duplicate_username\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tenant_sync_skipped_secrets{reason=\"missing_username\"} 1"),
        "{metrics}"
    );
    sync.stop().await.unwrap();
}

#[tokio::test]
async fn secret_namespaces_watch_only_those_namespaces() {
    let api = cluster().await;
    api.secret(
        "team-b",
        "push",
        &[("username", "push-b"), ("password", "pw-b")],
        json!({}),
    );
    let mut sync = RunningSync::start(&api, |o| o.secret_namespaces = vec!["team-b".into()]);
    // team-a's Secret exists but is outside the watched namespaces.
    assert_eq!(sync.next_write().await, map(&[("push-b", "team-b")]));
    assert!(api
        .requests()
        .iter()
        .any(|r| r.starts_with("/api/v1/namespaces/team-b/secrets?")));
    assert!(
        !api.requests()
            .iter()
            .any(|r| r.starts_with("/api/v1/secrets?")),
        "no cluster-wide Secret list"
    );
    sync.stop().await.unwrap();
}

/// A Secret left out gets one Event saying why, on the Secret itself
/// (`kubectl events --for secret/<name>` shows it), naming nothing from
/// its data; a resync does not repeat it.
#[tokio::test]
async fn a_skipped_secret_gets_one_event_saying_why_and_nothing_secret() {
    let api = cluster().await;
    api.secret(
        "team-b",
        "typo",
        &[("username", "push-b"), ("password", "s3cret-typo-pw")],
        json!({"tenant-proxy/scopes": "logs:wrtie"}),
    );
    api.secret(
        "team-b",
        "taken",
        &[("username", "grafana-a"), ("password", "s3cret-taken-pw")],
        json!({}),
    );
    let mut sync = RunningSync::start(&api, |_| {});
    assert_eq!(sync.next_write().await, map(&[("grafana-a", "team-a")]));
    api.wait_for_event_writes(2).await;

    // A resync finds the same two skipped: no Event again. A third Secret
    // skipped after it is the next Event written (they go out in order).
    let mut syncs = sync.status.syncs();
    let before = *syncs.borrow_and_update();
    sync.resync.now();
    syncs.wait_for(|n| *n > before).await.unwrap();
    api.secret("team-b", "empty", &[("username", "empty-b")], json!({}));
    api.wait_for_event_writes(3).await;

    let events = api.events();
    let mut seen: Vec<(&str, &str)> = events
        .iter()
        .map(|e| {
            assert_eq!(e["type"], "Warning");
            assert_eq!(e["reason"], "CredentialSkipped");
            assert_eq!(e["reportingController"], "tenant-sync");
            assert_eq!(e["metadata"]["namespace"], "team-b");
            assert!(e["series"].is_null(), "never sent twice: {e}");
            let regarding = &e["regarding"];
            // Event lists may select on the object's apiVersion as well
            // as its kind and name (`involvedObject.apiVersion`).
            assert_eq!(regarding["apiVersion"], "v1");
            assert_eq!(regarding["kind"], "Secret");
            assert_eq!(regarding["namespace"], "team-b");
            let name = regarding["name"].as_str().unwrap();
            assert_eq!(regarding["uid"], format!("uid-team-b/{name}"));
            (name, e["note"].as_str().unwrap())
        })
        .collect();
    seen.sort();
    assert_eq!(seen.len(), 3, "{events:?}");
    assert_eq!(seen[0].0, "empty");
    assert!(seen[0].1.contains("neither a `password`"), "{}", seen[0].1);
    assert_eq!(seen[1].0, "taken");
    assert!(
        seen[1].1.contains("already holds this username"),
        "{}",
        seen[1].1
    );
    assert_eq!(seen[2].0, "typo");
    assert!(seen[2].1.contains("unknown scope"), "{}", seen[2].1);
    let text = serde_json::to_string(&events).unwrap();
    for secret in ["s3cret", "push-b", "logs:wrtie"] {
        assert!(!text.contains(secret), "{secret} in {text}");
    }
    sync.stop().await.unwrap();
}

/// An API server that refuses Events (a role without the Event rule) costs
/// a warning and a count, never a sync.
#[tokio::test]
async fn refused_events_are_counted_and_hold_no_sync_back() {
    let api = cluster().await;
    api.forbid_events(true);
    api.secret("team-b", "empty", &[("username", "empty-b")], json!({}));
    let mut sync = RunningSync::start(&api, |_| {});
    assert_eq!(sync.next_write().await, map(&[("grafana-a", "team-a")]));
    api.wait_for_request("/apis/events.k8s.io/").await;
    api.secret(
        "team-b",
        "push",
        &[("username", "push-b"), ("password", "pw-b")],
        json!({}),
    );
    assert_eq!(
        sync.next_write().await,
        map(&[("grafana-a", "team-a"), ("push-b", "team-b")])
    );
    // Taken again: the next Secret's Event is stored. One task publishes
    // them in order, so the refused one has been counted by then.
    api.forbid_events(false);
    api.secret("team-b", "empty-2", &[("username", "empty-c")], json!({}));
    api.wait_for_event_writes(1).await;
    assert_eq!(api.events()[0]["regarding"]["name"], "empty-2");
    let metrics = sync.metrics.encode();
    let failed = r#"tenant_sync_events_total{outcome="failed"} 1"#;
    assert!(metrics.contains(failed), "{metrics}");
    sync.stop().await.unwrap();
}

/// A Namespace's `tenant-proxy/grantable-scopes` keeps out a Secret that
/// asks for more; the platform lifting it (a Namespace event, no Secret
/// changed) brings the credential in.
#[tokio::test]
async fn a_secret_beyond_its_namespaces_grantable_scopes_stays_out_of_the_file() {
    let api = cluster().await;
    let cap = json!({"tenant-proxy/grantable-scopes": "metrics:write"});
    api.annotated_namespace("team-b", json!({}), cap);
    api.secret(
        "team-b",
        "push",
        &[("username", "push-b"), ("password", "pw-b")],
        json!({"tenant-proxy/scopes": "metrics:write"}),
    );
    api.secret(
        "team-b",
        "cleaner",
        &[("username", "cleaner-b"), ("password", "pw-c")],
        json!({"tenant-proxy/scopes": "logs:read,logs:delete"}),
    );
    let mut sync = RunningSync::start(&api, |_| {});
    assert_eq!(
        sync.next_write().await,
        map(&[("grafana-a", "team-a"), ("push-b", "team-b")])
    );
    let metrics = sync.metrics.encode();
    assert!(
        metrics.contains("tenant_sync_skipped_secrets{reason=\"scope_not_grantable\"} 1"),
        "{metrics}"
    );

    api.namespace("team-b", json!({}));
    assert_eq!(
        sync.next_write().await,
        map(&[
            ("cleaner-b", "team-b"),
            ("grafana-a", "team-a"),
            ("push-b", "team-b")
        ])
    );
    assert!(sync.verifies("cleaner-b", "pw-c"));
    // Its author read why it was left out, and then that it is in.
    api.wait_for_event_writes(2).await;
    let mut told: Vec<String> = api
        .events()
        .iter()
        .map(|e| format!("{} {} {}", e["regarding"]["name"], e["type"], e["reason"]))
        .collect();
    told.sort();
    assert_eq!(
        told,
        [
            r#""cleaner" "Normal" "CredentialLoaded""#,
            r#""cleaner" "Warning" "CredentialSkipped""#,
        ]
    );
    sync.stop().await.unwrap();
}

/// Limits from Namespace annotations and the proxy's ready replicas from
/// its Service's EndpointSlices reach the file; a change that alters
/// neither does not rewrite it; only the Service's own slices count, each
/// pod once (dual-stack Services list a pod in two slices).
#[tokio::test]
async fn namespace_limits_and_the_proxys_ready_replicas_reach_the_file() {
    let api = cluster().await;
    let limits = r#"{"query": {"requests_per_second": 5, "concurrency": 2}}"#;
    api.annotated_namespace("team-a", json!({}), json!({"tenant-proxy/limits": limits}));
    api.annotated_namespace(
        "team-b",
        json!({}),
        json!({"tenant-proxy/limits": "not json"}),
    );
    let ready = |pods: &[&'static str]| -> Vec<(&'static str, Option<bool>)> {
        pods.iter().map(|p| (*p, Some(true))).collect()
    };
    let mut v4 = ready(&["proxy-1", "proxy-2"]);
    v4.push(("proxy-3", Some(false)));
    api.endpoint_slice("observability", "tenant-proxy-v4", "tenant-proxy", &v4);
    api.endpoint_slice(
        "observability",
        "tenant-proxy-v6",
        "tenant-proxy",
        &[("proxy-1", None), ("proxy-2", Some(true))],
    );
    api.endpoint_slice(
        "observability",
        "other-x",
        "other",
        &ready(&["o-1", "o-2", "o-3"]),
    );
    api.endpoint_slice(
        "elsewhere",
        "tenant-proxy-x",
        "tenant-proxy",
        &ready(&["e-1"]),
    );

    let mut sync = RunningSync::start(&api, |o| {
        o.peer_service = Some(tenant_sync::controller::PeerService {
            namespace: "observability".into(),
            name: "tenant-proxy".into(),
        });
    });
    sync.next_write().await;
    let load = |sync: &RunningSync| {
        let text = std::fs::read_to_string(&sync.file).unwrap();
        tenant_proxy::tenants::file::parse(&text, 1).unwrap().0
    };
    let store = load(&sync);
    assert_eq!(store.replicas, 2);
    let query = store
        .tenant("team-a")
        .unwrap()
        .limits
        .unwrap()
        .query
        .unwrap();
    assert_eq!((query.requests_per_second, query.concurrency), (5.0, 2));
    let team_b = store.tenant("team-b");
    assert!(
        team_b.is_none_or(|t| t.limits.is_none()),
        "invalid: left out"
    );
    assert_eq!(sync.metrics.invalid_limits.get(), 1);

    // A third replica becomes ready: the count follows.
    let mut v4 = ready(&["proxy-1", "proxy-2", "proxy-3"]);
    api.endpoint_slice("observability", "tenant-proxy-v4", "tenant-proxy", &v4);
    sync.next_write().await;
    assert_eq!(load(&sync).replicas, 3);

    // A pod that is not ready joins: the count, and the file, stay.
    let writes = sync.status.writes();
    let before = *writes.borrow();
    let mut syncs = sync.status.syncs();
    let synced = *syncs.borrow_and_update();
    v4.push(("proxy-4", Some(false)));
    api.endpoint_slice("observability", "tenant-proxy-v4", "tenant-proxy", &v4);
    tokio::time::timeout(Duration::from_secs(10), syncs.wait_for(|n| *n > synced))
        .await
        .expect("a sync within 10 s")
        .unwrap();
    assert_eq!(*writes.borrow(), before, "unchanged: not rewritten");

    // The slice goes: only the v6 one's two pods are left.
    api.delete(Kind::EndpointSlice, "observability/tenant-proxy-v4");
    sync.next_write().await;
    assert_eq!(load(&sync).replicas, 2);
    sync.stop().await.unwrap();
    // EndpointSlices were only listed and watched in the peer namespace.
    for request in api.requests() {
        if request.contains("endpointslices") {
            let path = request.split('?').next().unwrap();
            assert_eq!(
                path,
                "/apis/discovery.k8s.io/v1/namespaces/observability/endpointslices"
            );
        }
    }
}

/// One tenant-sync beside each proxy replica: a Secret left out gets one
/// Event, from the first ready replica by pod name, not one from each;
/// once that replica is not ready, the next one publishes.
#[tokio::test]
async fn the_first_ready_replica_alone_publishes_events() {
    let api = cluster().await;
    let slice = |pods: &[(&'static str, Option<bool>)]| {
        api.endpoint_slice("observability", "tenant-proxy-x", "tenant-proxy", pods);
    };
    slice(&[("proxy-b", Some(true)), ("proxy-a", Some(true))]);
    let start = |pod: &str| {
        let pod = pod.to_owned();
        RunningSync::start(&api, move |o| {
            o.peer_service = Some(tenant_sync::controller::PeerService {
                namespace: "observability".into(),
                name: "tenant-proxy".into(),
            });
            o.instance = Some(pod);
        })
    };
    let (mut a, mut b) = (start("proxy-a"), start("proxy-b"));
    // Either may write first: each one's count of writes, not its next.
    let written = |sync: &RunningSync, count: u64| {
        let mut writes = sync.status.writes();
        async move {
            let wait = writes.wait_for(|n| *n >= count);
            let waited = tokio::time::timeout(Duration::from_secs(30), wait).await;
            waited.expect("a write within 30 s").unwrap();
        }
    };
    written(&a, 1).await;
    written(&b, 1).await;

    api.secret("team-b", "empty", &[("username", "empty-b")], json!({}));
    api.wait_for_event_writes(1).await;
    left_to_another_replica(&b, 1).await;
    // proxy-a stops being ready: both see one replica left (the file says
    // so) before the next Secret is left out.
    slice(&[("proxy-b", Some(true)), ("proxy-a", Some(false))]);
    written(&a, 2).await;
    written(&b, 2).await;
    api.secret("team-b", "empty-2", &[("username", "empty-2b")], json!({}));
    api.wait_for_event_writes(2).await;
    left_to_another_replica(&a, 1).await;

    let events = api.events();
    let mut by: Vec<(&str, &str)> = events
        .iter()
        .map(|e| {
            let secret = e["regarding"]["name"].as_str().unwrap();
            (secret, e["reportingInstance"].as_str().unwrap())
        })
        .collect();
    by.sort();
    assert_eq!(by, [("empty", "proxy-a"), ("empty-2", "proxy-b")]);
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

/// Waits until `sync` has left `count` Events to another replica.
async fn left_to_another_replica(sync: &RunningSync, count: u64) {
    let labels = tenant_sync::metrics::OutcomeLabels {
        outcome: "left_to_another_replica",
    };
    let counted = || sync.metrics.events.get_or_create(&labels).get();
    let mut syncs = sync.status.syncs();
    let waited = tokio::time::timeout(Duration::from_secs(10), async {
        while counted() < count {
            syncs.changed().await.unwrap();
        }
    });
    waited.await.expect("the other replica's sync within 10 s");
    assert_eq!(counted(), count);
}

/// The stand-in's Event checks refuse what Kubernetes 1.33 refuses.
#[test]
fn the_api_stand_in_checks_events_as_the_api_server_does() {
    let good = json!({
        "metadata": {"name": "push.1869f", "namespace": "team-b"},
        "eventTime": "2026-12-02T18:00:00.000000Z",
        "regarding": {"kind": "Secret", "namespace": "team-b", "name": "push"},
        "reportingController": "tenant-sync", "reportingInstance": "pod-1",
        "action": "Sync", "reason": "CredentialSkipped", "type": "Warning", "note": "why",
    });
    assert_eq!(
        events::validate_create("team-b", &good),
        Vec::<String>::new()
    );
    let broken = |field: &str, value: Value| {
        let mut event = good.clone();
        event[field] = value;
        events::validate_create("team-b", &event)
    };
    assert_eq!(broken("eventTime", Value::Null).len(), 1);
    assert_eq!(broken("type", json!("Error")).len(), 1);
    assert_eq!(broken("note", json!("x".repeat(1025))).len(), 1);
    assert_eq!(broken("reportingController", json!("")).len(), 1);
    assert_eq!(broken("action", json!("")).len(), 1);
    assert_eq!(broken("deprecatedCount", json!(1)).len(), 1);
    assert_eq!(broken("series", json!({"count": 1})).len(), 2);
    let mut renamed = good.clone();
    renamed["metadata"]["name"] = json!("Push_1");
    assert_eq!(events::validate_create("team-b", &renamed).len(), 1);
    let mut counted = good.clone();
    counted["series"] = json!({"count": 2, "lastObservedTime": "2026-12-02T18:01:00.000000Z"});
    assert_eq!(
        events::validate_update(&counted, &good),
        Vec::<String>::new()
    );
    counted["note"] = json!("another");
    assert_eq!(events::validate_update(&counted, &good).len(), 1);
}
