//! The sync loop: watch Namespaces and labelled `kubernetes.io/basic-auth`
//! Secrets, keep the index current, and after a quiet moment render the
//! tenants file and write it if it changed.
//!
//! Level-triggered: every sync renders the complete file from the complete
//! index, so a missed or repeated event cannot leave the file wrong for long.
//! Nothing is written before every watch has finished its initial list.

use std::collections::{BTreeSet, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::stream::{self, BoxStream, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::hashes::HashCache;
use crate::index::{Conventions, Desired, Index, SecretKey, SkipReason};
use crate::metrics::{Metrics, ReasonLabels, ResourceLabels};
use crate::notices::{Notice, Notices};
use crate::render;
use crate::writer;

/// The longest a sync hashes new passwords before it writes the file; the
/// rest follow in the next sync, at once. (The first file waits for all.)
pub const HASHING_PER_SYNC: Duration = Duration::from_secs(1);

#[derive(Clone, Debug)]
pub struct Options {
    pub tenants_file: PathBuf,
    pub conventions: Conventions,
    /// Label selector a Secret must match, e.g. `tenant-proxy/credentials=true`.
    pub secret_selector: String,
    /// Label selector restricting the namespaces considered.
    pub namespace_selector: Option<String>,
    /// Watch Secrets only in these namespaces (RBAC by Role); empty: cluster-wide.
    pub secret_namespaces: Vec<String>,
    /// Quiet time after the last event before rendering.
    pub debounce: Duration,
    /// The longest a change waits for a render however busy the cluster:
    /// events closer together than `debounce` would otherwise put the
    /// render off for as long as they keep coming, and a revoked
    /// credential with it.
    pub max_delay: Duration,
    /// Render from the index this often even without events: a quiet
    /// cluster still proves the file current (the `last_successful_sync`
    /// metric advances, so a stuck sidecar is told from an idle one), and
    /// a file changed behind tenant-sync's back is put right.
    pub resync_interval: Duration,
    /// The longest a sync hashes new passwords before it writes the file
    /// (`HASHING_PER_SYNC`; tests shorten it).
    pub hashing_per_sync: Duration,
    /// Render once after the initial lists, then return.
    pub once: bool,
    /// The proxy's Service, whose ready endpoints are counted as `replicas`.
    pub peer_service: Option<PeerService>,
    /// Publish a Kubernetes Event on each Secret newly left out, saying why
    /// (`crate::notices`).
    pub events: bool,
    /// This replica's pod name: the Events' reporting instance, and with
    /// `peer_service` how a replica knows that it is the one publishing
    /// them (the first ready one by name), so that a Secret gets one Event,
    /// not one per replica. `None`: every replica publishes.
    pub instance: Option<String>,
}

#[derive(Clone, Debug)]
pub struct PeerService {
    pub namespace: String,
    pub name: String,
}

#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("watching {resource} failed: {source}")]
    Watch {
        resource: &'static str,
        #[source]
        source: watcher::Error,
    },
    #[error("the watch streams ended")]
    StreamsEnded,
    #[error("rendering the tenants file: {0}")]
    Render(String),
    #[error("writing {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Readiness (the file on disk matches a complete picture of the cluster),
/// and a count of writes others can wait on.
#[derive(Debug)]
pub struct Status {
    synced_once: AtomicBool,
    writes: tokio::sync::watch::Sender<u64>,
    syncs: tokio::sync::watch::Sender<u64>,
}

impl Default for Status {
    fn default() -> Self {
        Self {
            synced_once: AtomicBool::new(false),
            writes: tokio::sync::watch::Sender::new(0),
            syncs: tokio::sync::watch::Sender::new(0),
        }
    }
}

impl Status {
    pub fn is_ready(&self) -> bool {
        self.synced_once.load(Ordering::Acquire)
    }

    /// Times the tenants file was replaced; changes on every write.
    pub fn writes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.writes.subscribe()
    }

    /// Successful syncs, whether they wrote the file or found it current.
    pub fn syncs(&self) -> tokio::sync::watch::Receiver<u64> {
        self.syncs.subscribe()
    }
}

enum Change {
    Namespace(Result<watcher::Event<Namespace>, watcher::Error>),
    Secret(String, Result<watcher::Event<Secret>, watcher::Error>),
    Peers(Result<watcher::Event<EndpointSlice>, watcher::Error>),
}

pub struct Syncer {
    options: Options,
    index: Index,
    hashes: HashCache,
    metrics: Arc<Metrics>,
    status: Arc<Status>,
    last_skipped: BTreeSet<(SecretKey, SkipReason)>,
    last_invalid_limits: BTreeSet<(String, String)>,
    last_invalid_caps: BTreeSet<(String, String)>,
    /// Set by `run` when `options.events` asks for them.
    notices: Option<Notices>,
    /// Asks for a resync now (SIGHUP), besides the resync clock.
    resync_asked: Option<watch::Receiver<u64>>,
}

impl Syncer {
    pub fn new(options: Options, metrics: Arc<Metrics>, status: Arc<Status>) -> Self {
        let mut index = Index::new(options.conventions.clone(), &secret_scopes(&options));
        if options.peer_service.is_some() {
            index = index.counting_peers();
        }
        Self {
            options,
            index,
            hashes: HashCache::default(),
            metrics,
            status,
            last_skipped: BTreeSet::new(),
            last_invalid_limits: BTreeSet::new(),
            last_invalid_caps: BTreeSet::new(),
            notices: None,
            resync_asked: None,
        }
    }

    /// Resyncs (puts the file right, as at a resync tick) whenever `asks`
    /// changes, not only on the clock: `main` asks on SIGHUP.
    pub fn resync_when_asked(mut self, asks: watch::Receiver<u64>) -> Self {
        self.resync_asked = Some(asks);
        self
    }

    /// Runs until `shutdown` resolves (or, with `once`, after one sync).
    pub async fn run(
        mut self,
        client: Client,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), SyncError> {
        if self.options.events {
            self.notices = Some(Notices::start(
                client.clone(),
                self.metrics.clone(),
                self.options.instance.clone(),
            ));
        }
        let mut changes = watch_streams(client, &self.options);
        tokio::pin!(shutdown);
        let mut due: Option<Instant> = None;
        // When the first change not yet rendered came: `due` is never
        // later than `max_delay` after it.
        let mut pending_since: Option<Instant> = None;
        let mut resync = tokio::time::interval(self.options.resync_interval);
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        resync.reset(); // the first sync follows the initial lists, not this
        let mut asked = self.resync_asked.take();
        loop {
            let resync_asked = async {
                let answered = match &mut asked {
                    Some(asks) => asks.changed().await.is_ok(),
                    None => false,
                };
                if !answered {
                    // Never asked, or no one left to ask: the clock alone.
                    std::future::pending::<()>().await;
                }
            };
            let wait = async {
                match due {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = &mut shutdown => return Ok(()),
                change = changes.next() => {
                    let change = change.ok_or(SyncError::StreamsEnded)?;
                    if let Err(e) = self.apply(change) {
                        if self.options.once {
                            return Err(e);
                        }
                        // The watcher backs off and retries by itself.
                        tracing::warn!(error = %e, "watch error; retrying");
                    }
                    if self.index.is_synced() {
                        let now = Instant::now();
                        let deadline = *pending_since.get_or_insert(now) + self.options.max_delay;
                        due = Some((now + self.options.debounce).min(deadline));
                    }
                }
                _ = resync.tick() => resync_due(&self.index, &mut due),
                _ = resync_asked => resync_due(&self.index, &mut due),
                _ = wait => {
                    due = None;
                    pending_since = None;
                    match self.sync().await {
                        // Passwords left to hash: the next sync at once.
                        Ok(true) => due = Some(Instant::now()),
                        Ok(false) if self.options.once => {
                            if let Some(notices) = self.notices.take() {
                                notices.finish().await;
                            }
                            return Ok(());
                        }
                        Ok(false) => {}
                        Err(e) if self.options.once => return Err(e),
                        Err(e) => {
                            self.metrics.write_errors.inc();
                            tracing::error!(error = %e, "sync failed; the previous tenants file stays in force");
                        }
                    }
                }
            }
        }
    }

    fn apply(&mut self, change: Change) -> Result<(), SyncError> {
        let (resource, result) = match change {
            Change::Namespace(event) => ("namespaces", event.map(|e| self.on_namespace(e))),
            Change::Secret(scope, event) => ("secrets", event.map(|e| self.on_secret(&scope, e))),
            Change::Peers(event) => ("endpointslices", event.map(|e| self.on_peers(e))),
        };
        result.map_err(|source| {
            self.metrics
                .watch_errors
                .get_or_create(&ResourceLabels { resource })
                .inc();
            SyncError::Watch { resource, source }
        })
    }

    fn on_namespace(&mut self, event: watcher::Event<Namespace>) {
        if matches!(event, watcher::Event::Init) {
            self.count_relist("namespaces");
        }
        self.index.namespace_event(event);
    }

    fn on_secret(&mut self, scope: &str, event: watcher::Event<Secret>) {
        if matches!(event, watcher::Event::Init) {
            self.count_relist("secrets");
        }
        self.index.secret_event(scope, event);
    }

    fn on_peers(&mut self, event: watcher::Event<EndpointSlice>) {
        if matches!(event, watcher::Event::Init) {
            self.count_relist("endpointslices");
        }
        self.index.peers_event(event);
    }

    fn count_relist(&self, resource: &'static str) {
        self.metrics
            .relists
            .get_or_create(&ResourceLabels { resource })
            .inc();
    }

    /// Renders the whole file from the index and writes it if it changed;
    /// `true` if passwords are left to hash for the next. The first file,
    /// and the one of `--once`, waits for every hash: never partial.
    pub async fn sync(&mut self) -> Result<bool, SyncError> {
        let desired = self.index.desired();
        let first = !self.status.synced_once.load(Ordering::Acquire);
        let within = (!first && !self.options.once).then_some(self.options.hashing_per_sync);
        let (resolved, stats) = self.hashes.resolve(&desired, within).await;
        self.metrics.hashes_computed.inc_by(stats.computed);
        self.metrics.hashes_reused.inc_by(stats.reused);
        self.metrics
            .hashes_pending
            .set(resolved.pending.len() as i64);
        let text = render::render(&desired, &resolved).map_err(SyncError::Render)?;
        let path = self.options.tenants_file.clone();
        let changed = tokio::task::spawn_blocking(move || writer::write_if_changed(&path, &text))
            .await
            .expect("the write task does not panic")
            .map_err(|source| SyncError::Write {
                path: self.options.tenants_file.display().to_string(),
                source,
            })?;

        // Ready as soon as the file matches the cluster: before anything
        // else reports the sync.
        self.status.synced_once.store(true, Ordering::Release);
        let desired_users: usize = desired.tenants.values().map(|t| t.users.len()).sum();
        let credentials = desired_users - resolved.pending.len();
        // The gauges describe the file before a write is announced.
        self.metrics.tenants.set(desired.tenants.len() as i64);
        self.metrics.credentials.set(credentials as i64);
        if changed {
            self.metrics.writes.inc();
            self.status.writes.send_modify(|n| *n += 1);
            tracing::info!(
                tenants = desired.tenants.len(),
                credentials,
                hashed = stats.computed,
                left_to_hash = resolved.pending.len(),
                "tenants file written"
            );
        }
        self.report_skipped(&desired, &resolved.pending);
        report_invalid(
            &mut self.last_invalid_limits,
            &desired.invalid_limits,
            &self.metrics.invalid_limits,
            "limits annotation skipped",
        );
        report_invalid(
            &mut self.last_invalid_caps,
            &desired.invalid_caps,
            &self.metrics.invalid_caps,
            "grantable-scopes annotation unreadable",
        );
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        self.metrics.last_write.set(now.as_secs_f64());
        self.status.syncs.send_modify(|n| *n += 1);
        Ok(!resolved.pending.is_empty())
    }

    fn tell(&self, key: &SecretKey, notice: Notice) {
        let Some(notices) = &self.notices else {
            return;
        };
        if !self
            .index
            .speaks_for_replicas(self.options.instance.as_deref())
        {
            notices.leave_to_another_replica();
            return;
        }
        if let Some(secret) = self.index.secret_reference(key) {
            notices.tell(secret, notice);
        }
    }

    /// Logs newly skipped Secrets once (not at every sync), at most
    /// [`NAMED_PER_SYNC`] by name, tells their authors with an Event (and
    /// again once such a Secret is in the file: not while its new password
    /// waits for its hash), and sets the gauges.
    fn report_skipped(&mut self, desired: &Desired, pending: &HashSet<SecretKey>) {
        let now: BTreeSet<_> = desired.skipped.iter().cloned().collect();
        let newly: Vec<_> = now.difference(&self.last_skipped).collect();
        name_some(
            &newly,
            |((namespace, name), reason)| {
                let reason = reason.as_str();
                tracing::warn!(%namespace, secret = %name, reason, "Secret skipped")
            },
            |more| {
                tracing::warn!(
                    more,
                    "more Secrets skipped; tenant_sync_skipped_secrets counts them by reason, \
                     and each has an Event saying why"
                )
            },
        );
        for (key, reason) in newly {
            self.tell(key, Notice::Skipped(*reason));
        }
        let desired_users: BTreeSet<&SecretKey> = desired
            .tenants
            .values()
            .flat_map(|t| t.users.iter().map(|u| &u.source))
            .collect();
        let (in_again, awaited) = back_in(&self.last_skipped, &desired_users, pending);
        name_some(
            &in_again,
            |(namespace, name)| tracing::info!(%namespace, secret = %name, "Secret in the file again"),
            |more| tracing::info!(more, "more Secrets in the file again"),
        );
        for key in in_again {
            self.tell(key, Notice::Loaded);
        }
        for reason in self
            .last_skipped
            .iter()
            .chain(&now)
            .map(|(_, r)| *r)
            .collect::<BTreeSet<_>>()
        {
            let count = now.iter().filter(|(_, r)| *r == reason).count();
            self.metrics
                .skipped_secrets
                .get_or_create(&ReasonLabels {
                    reason: reason.as_str(),
                })
                .set(count as i64);
        }
        self.last_skipped = now.into_iter().chain(awaited).collect();
    }
}

/// A resync, once the index holds the whole cluster, and unless a sync is
/// due anyway.
fn resync_due(index: &Index, due: &mut Option<Instant>) {
    if index.is_synced() && due.is_none() {
        *due = Some(Instant::now());
    }
}

/// Secrets named one by one in a sync's log lines of one kind, at most: a
/// namespace that adds thousands at once (over its credential cap, say)
/// must not flood the platform's log. The rest are counted in one line;
/// each still gets its Event, and the gauges count them all.
const NAMED_PER_SYNC: usize = 20;

/// Calls `each` for the first [`NAMED_PER_SYNC`] of `items`, then `rest`
/// with how many are left, if any.
fn name_some<T>(items: &[T], each: impl Fn(&T), rest: impl FnOnce(usize)) {
    items.iter().take(NAMED_PER_SYNC).for_each(each);
    if items.len() > NAMED_PER_SYNC {
        rest(items.len() - NAMED_PER_SYNC);
    }
}

/// Of the Secrets left out before, those whose credential is in the file
/// now (desired and hashed), and those still awaited: desired, but their
/// password waits for its hash, so they are told later, not yet.
fn back_in<'a>(
    last_skipped: &'a BTreeSet<(SecretKey, SkipReason)>,
    desired_users: &BTreeSet<&SecretKey>,
    pending: &HashSet<SecretKey>,
) -> (Vec<&'a SecretKey>, BTreeSet<(SecretKey, SkipReason)>) {
    let mut in_again = Vec::new();
    let mut awaited = BTreeSet::new();
    for entry @ (key, _) in last_skipped {
        if pending.contains(key) {
            awaited.insert(entry.clone());
        } else if desired_users.contains(key) {
            in_again.push(key);
        }
    }
    (in_again, awaited)
}

/// Logs newly invalid Namespace annotations once (not at every sync) and
/// sets their gauge.
fn report_invalid(
    last: &mut BTreeSet<(String, String)>,
    invalid: &[(String, String)],
    gauge: &Gauge,
    message: &str,
) {
    let now: BTreeSet<_> = invalid.iter().cloned().collect();
    for (namespace, why) in now.difference(last) {
        tracing::warn!(%namespace, reason = %why, "{message}");
    }
    gauge.set(now.len() as i64);
    *last = now;
}

fn secret_scopes(options: &Options) -> Vec<String> {
    if options.secret_namespaces.is_empty() {
        vec![String::new()]
    } else {
        options.secret_namespaces.clone()
    }
}

/// One stream of every watch, each with back-off on errors.
fn watch_streams(client: Client, options: &Options) -> BoxStream<'static, Change> {
    let mut namespace_config = watcher::Config::default();
    if let Some(selector) = &options.namespace_selector {
        namespace_config = namespace_config.labels(selector);
    }
    let namespaces = watcher(Api::<Namespace>::all(client.clone()), namespace_config)
        .default_backoff()
        .map(Change::Namespace)
        .boxed();
    let secret_config = watcher::Config::default()
        .labels(&options.secret_selector)
        .fields(&format!("type={}", crate::index::SECRET_TYPE));
    let mut streams = vec![namespaces];
    for scope in secret_scopes(options) {
        let api = if scope.is_empty() {
            Api::<Secret>::all(client.clone())
        } else {
            Api::<Secret>::namespaced(client.clone(), &scope)
        };
        let secrets = watcher(api, secret_config.clone())
            .default_backoff()
            .map(move |event| Change::Secret(scope.clone(), event))
            .boxed();
        streams.push(secrets);
    }
    if let Some(peers) = &options.peer_service {
        // The Service's slices carry its name as this label.
        let config = watcher::Config::default()
            .labels(&format!("kubernetes.io/service-name={}", peers.name));
        let api = Api::<EndpointSlice>::namespaced(client.clone(), &peers.namespace);
        streams.push(
            watcher(api, config)
                .default_backoff()
                .map(Change::Peers)
                .boxed(),
        );
    }
    stream::select_all(streams).boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::tests::conventions;

    fn key(name: &str) -> SecretKey {
        ("ns".to_owned(), name.to_owned())
    }

    /// A resync (the clock's or SIGHUP's) before every initial list has
    /// finished would write a file that leaves out the tenants not listed
    /// yet; once synced it is due now, unless a sync already is.
    #[test]
    fn a_resync_waits_for_the_initial_lists_and_moves_no_sync_already_due() {
        let mut index = Index::new(conventions(None), &[String::new()]);
        let mut due = None;
        resync_due(&index, &mut due);
        assert_eq!(due, None, "nothing listed yet");
        index.namespace_event(watcher::Event::Init);
        index.namespace_event(watcher::Event::InitDone);
        resync_due(&index, &mut due);
        assert_eq!(due, None, "Secrets still listing");
        index.secret_event("", watcher::Event::Init);
        index.secret_event("", watcher::Event::InitDone);
        let before = Instant::now();
        resync_due(&index, &mut due);
        assert!(due.is_some_and(|at| at >= before), "{due:?}");
        let later = Instant::now() + Duration::from_secs(60);
        let mut debounced = Some(later);
        resync_due(&index, &mut debounced);
        assert_eq!(debounced, Some(later));
    }

    /// Both sides of the skipped-Secret log (newly skipped, back in) name
    /// at most [`NAMED_PER_SYNC`] a sync and count the rest in one call;
    /// at the bound or under it, there is no count.
    #[test]
    fn name_some_names_the_first_twenty_and_counts_the_rest() {
        for (items, rest) in [(0, None), (20, None), (21, Some(1)), (25, Some(5))] {
            let all: Vec<usize> = (0..items).collect();
            let named = std::cell::RefCell::new(Vec::new());
            let mut counted = None;
            name_some(
                &all,
                |&i| named.borrow_mut().push(i),
                |more| counted = Some(more),
            );
            assert_eq!(named.into_inner(), all[..items.min(NAMED_PER_SYNC)]);
            assert_eq!(counted, rest, "{items} items");
        }
    }

    /// A Secret left out before is told it is in once its credential is in
    /// the file: not while its password waits for its hash (it stays
    /// awaited), nor when it is gone.
    #[test]
    fn a_secret_is_back_in_once_its_hash_is() {
        let reason = SkipReason::ScopeNotGrantable;
        let last: BTreeSet<_> = ["in", "hashing", "gone"]
            .into_iter()
            .map(|name| (key(name), reason))
            .collect();
        let (in_file, hashing) = (key("in"), key("hashing"));
        let desired = BTreeSet::from([&in_file, &hashing]);
        let pending = HashSet::from([key("hashing")]);
        let (in_again, awaited) = back_in(&last, &desired, &pending);
        assert_eq!(in_again, [&in_file]);
        assert_eq!(awaited, BTreeSet::from([(key("hashing"), reason)]));
        // Hashed at the next sync: told then.
        let (in_again, awaited) = back_in(&awaited, &desired, &HashSet::new());
        assert_eq!(in_again, [&hashing]);
        assert!(awaited.is_empty());
    }
}
