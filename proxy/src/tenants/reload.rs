//! Keeps the tenants file in force: load → validate → swap, atomically.
//!
//! Readers take the current generation with one `ArcSwap` load per request
//! and keep it for that request, so a reload never disturbs requests in
//! flight, and the next request (even on the same keep-alive connection)
//! sees the new generation. An invalid file is logged and counted, and the
//! last good generation stays in force. The file is watched (its directory,
//! since Kubernetes volumes and tenant-sync replace it by rename) and also
//! re-read every poll interval as a fallback; unchanged content is skipped.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use notify::{RecursiveMode, Watcher};
use tokio::sync::{mpsc, watch};

use super::file::{self as tenants_file, LoadNotes, TenantsFileError};
use crate::ops::metrics::Metrics;
use crate::tenants::TenantStore;

/// What the last load attempt did; published for readiness and for tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReloadStatus {
    /// Load attempts on new content, successful or not.
    pub attempts: u64,
    /// Generation in force; 0 while none is loaded.
    pub generation: u64,
    /// The error of the last attempt, if it failed.
    pub last_error: Option<String>,
}

/// The tenants in force, shared by every request.
#[derive(Debug)]
pub struct Tenants {
    current: ArcSwapOption<TenantStore>,
    status: watch::Sender<ReloadStatus>,
}

impl Default for Tenants {
    fn default() -> Self {
        Self {
            current: ArcSwapOption::empty(),
            status: watch::Sender::new(ReloadStatus::default()),
        }
    }
}

impl Tenants {
    /// The generation in force, or `None` before the first successful load.
    pub fn current(&self) -> Option<Arc<TenantStore>> {
        self.current.load_full()
    }

    pub fn is_loaded(&self) -> bool {
        self.current.load().is_some()
    }

    pub fn subscribe(&self) -> watch::Receiver<ReloadStatus> {
        self.status.subscribe()
    }
}

// === impl Reloader ===

pub struct Reloader {
    path: PathBuf,
    tenants: Arc<Tenants>,
    metrics: Arc<Metrics>,
    /// Digest of the content last attempted, to skip unchanged files.
    last_seen: Option<blake3::Hash>,
    load_thread: LoadThread,
}

impl Reloader {
    pub fn new(path: PathBuf, tenants: Arc<Tenants>, metrics: Arc<Metrics>) -> Self {
        Self {
            path,
            tenants,
            metrics,
            last_seen: None,
            load_thread: LoadThread::spawn(),
        }
    }

    /// Start-up load. A missing file is not an error (the sidecar may not
    /// have written it yet: the proxy starts unready); an invalid one is.
    pub fn load_initial(&mut self) -> Result<(), TenantsFileError> {
        match std::fs::read(&self.path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                tracing::warn!(path = %self.path.display(), "tenants file not found yet; not ready until it appears");
                Ok(())
            }
            Err(e) => Err(TenantsFileError {
                path: self.path.display().to_string(),
                message: e.to_string(),
            }),
            Ok(bytes) => self.apply(&bytes),
        }
    }

    /// Follows the file (its directory's events, every `poll_interval`,
    /// and whenever `recheck` asks) until `shutdown` resolves.
    pub async fn run(
        mut self,
        poll_interval: Duration,
        shutdown: impl std::future::Future<Output = ()>,
        mut recheck: watch::Receiver<u64>,
    ) {
        let (events_tx, mut events_rx) = mpsc::channel::<()>(1);
        // Keep the watcher alive for as long as we run; without it we still poll.
        let _watcher = watch_directory(&self.path, events_tx)
            .map_err(|e| tracing::warn!(error = %e, "cannot watch the tenants file; polling only"))
            .ok();
        let mut poll = tokio::time::interval(poll_interval);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = poll.tick() => {}
                Some(()) = events_rx.recv() => {}
                Ok(()) = recheck.changed() => {}
            }
            self.check().await;
        }
    }

    async fn check(&mut self) {
        let bytes = match tokio::fs::read(&self.path).await {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if self.tenants.is_loaded() && self.last_seen.take().is_some() {
                    tracing::warn!(path = %self.path.display(), "tenants file disappeared; keeping the last good generation");
                }
                return;
            }
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot read the tenants file");
                return;
            }
        };
        let Some(generation) = self.next_generation(&bytes) else {
            return;
        };
        // A file of 10,000 credentials takes tens of milliseconds to parse:
        // off the async workers, so requests queued behind it do not wait.
        let parsed = self
            .load_thread
            .run(move || parse(&bytes, generation))
            .await
            .unwrap_or_else(|| Err("the tenants-file thread is gone".into()));
        // Errors were logged and counted by `install`.
        let _ = self.install(generation, parsed);
    }

    fn apply(&mut self, bytes: &[u8]) -> Result<(), TenantsFileError> {
        match self.next_generation(bytes) {
            Some(generation) => self.install(generation, parse(bytes, generation)),
            None => Ok(()),
        }
    }

    /// The generation `bytes` would load as, or `None` if this content was
    /// attempted already.
    fn next_generation(&mut self, bytes: &[u8]) -> Option<u64> {
        let digest = blake3::hash(bytes);
        if self.last_seen == Some(digest) {
            return None;
        }
        self.last_seen = Some(digest);
        Some(self.tenants.status.borrow().generation + 1)
    }

    fn install(
        &mut self,
        generation: u64,
        parsed: Result<(TenantStore, LoadNotes), String>,
    ) -> Result<(), TenantsFileError> {
        let result = parsed.map_err(|message| TenantsFileError {
            path: self.path.display().to_string(),
            message,
        });
        self.metrics.record_reload(result.is_ok());
        let outcome = match result {
            Ok((store, notes)) => {
                if notes.plaintext_passwords {
                    tracing::warn!(path = %self.path.display(), "tenants file holds plaintext passwords (k8spin authn.yaml format); prefer argon2id hashes");
                }
                tracing::info!(
                    generation,
                    tenants = store.tenants().len(),
                    credentials = store.credential_count(),
                    "tenants file loaded"
                );
                self.metrics.tenants_generation.set(generation as i64);
                self.metrics
                    .tenants_loaded
                    .set(store.tenants().len() as i64);
                self.metrics
                    .credentials_loaded
                    .set(store.credential_count() as i64);
                let previous = self.tenants.current.swap(Some(Arc::new(store)));
                // Freeing 10,000 credentials takes milliseconds: not on an
                // async worker (a request still holding the previous store
                // frees it there only if it outlives this).
                self.load_thread.drop_there(previous);
                Ok(())
            }
            Err(e) => {
                tracing::error!(error = %e, "tenants file rejected; the previous generation stays in force");
                Err(e)
            }
        };
        self.tenants.status.send_modify(|status| {
            status.attempts += 1;
            match &outcome {
                Ok(()) => {
                    status.generation = generation;
                    status.last_error = None;
                }
                Err(e) => status.last_error = Some(e.message.clone()),
            }
        });
        outcome
    }
}

/// The one thread that parses tenants files and frees old stores. One,
/// not the blocking pool: with glibc, each thread that allocates a store
/// gets its own arena, and a reload every second spread over pool threads
/// grew RSS by 36 MiB in 3 minutes of the soak (flat with one arena).
struct LoadThread {
    jobs: std::sync::mpsc::Sender<Box<dyn FnOnce() + Send>>,
}

impl LoadThread {
    fn spawn() -> Self {
        let (jobs, queue) = std::sync::mpsc::channel::<Box<dyn FnOnce() + Send>>();
        std::thread::Builder::new()
            .name("tenants-load".into())
            .spawn(move || queue.into_iter().for_each(|job| job()))
            .expect("spawning the tenants-file thread");
        Self { jobs }
    }

    async fn run<T: Send + 'static>(&self, job: impl FnOnce() -> T + Send + 'static) -> Option<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.jobs
            .send(Box::new(move || {
                let _ = tx.send(job());
            }))
            .ok()?;
        rx.await.ok()
    }

    /// Frees `value` on this thread (freeing 10,000 credentials takes
    /// milliseconds; a request still holding the store frees it on its own
    /// thread only if it outlives the reload).
    fn drop_there<T: Send + 'static>(&self, value: T) {
        let _ = self.jobs.send(Box::new(move || drop(value)));
    }
}

fn parse(bytes: &[u8], generation: u64) -> Result<(TenantStore, LoadNotes), String> {
    let text =
        std::str::from_utf8(bytes).map_err(|_| "the tenants file is not UTF-8".to_string())?;
    tenants_file::parse(text, generation)
}

/// Whether an event can mean new content. Opening and reading the file (as
/// every check does) raises access events: reacting to those made the
/// reloader re-read the file in a loop, burning a core while idle.
fn may_change_content(kind: &notify::EventKind) -> bool {
    use notify::event::{EventKind, ModifyKind};
    match kind {
        EventKind::Access(_) => false,
        EventKind::Modify(ModifyKind::Metadata(_)) => false,
        EventKind::Any
        | EventKind::Create(_)
        | EventKind::Modify(_)
        | EventKind::Remove(_)
        | EventKind::Other => true,
    }
}

/// Watches the directory holding `path`: editors, tenant-sync and kubelet
/// replace files by rename, which a watch on the file itself would lose.
fn watch_directory(
    path: &Path,
    events: mpsc::Sender<()>,
) -> notify::Result<notify::RecommendedWatcher> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or_else(|| Path::new("."))
        .to_owned();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok_and(|e| may_change_content(&e.kind)) {
            // A full channel already holds a wake-up: nothing is lost.
            let _ = events.try_send(());
        }
    })?;
    watcher.watch(&dir, RecursiveMode::NonRecursive)?;
    Ok(watcher)
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{
        AccessKind, AccessMode, CreateKind, EventKind, MetadataKind, ModifyKind, RenameMode,
    };

    const FILE: &str = "tenants:\n  - id: team-a\n";

    /// A reloader of `path` whose first load succeeded, and its tenants.
    fn loaded(path: &Path) -> (Reloader, Arc<Tenants>) {
        std::fs::write(path, FILE).unwrap();
        let tenants = Arc::new(Tenants::default());
        let mut reloader = Reloader::new(path.to_owned(), tenants.clone(), Arc::default());
        reloader.load_initial().unwrap();
        assert_eq!(tenants.subscribe().borrow().generation, 1);
        (reloader, tenants)
    }

    fn generation(tenants: &Tenants) -> u64 {
        tenants.subscribe().borrow().generation
    }

    #[test]
    fn a_file_not_there_yet_starts_unready_and_an_unreadable_one_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let tenants = Arc::new(Tenants::default());
        let path = dir.path().join("tenants.yaml");
        let mut reloader = Reloader::new(path, tenants.clone(), Arc::default());
        reloader.load_initial().unwrap();
        assert!(!tenants.is_loaded());
        // A directory where the file should be: reading it fails, and not
        // as "not found".
        let mut reloader = Reloader::new(dir.path().to_owned(), tenants, Arc::default());
        let error = reloader.load_initial().unwrap_err();
        assert_eq!(error.path, dir.path().display().to_string());
    }

    /// While the file is gone the last good generation stays in force;
    /// when it returns it is loaded again, unchanged or not, so the log
    /// says "tenants file loaded" after "disappeared".
    #[tokio::test]
    async fn a_file_that_disappears_keeps_its_tenants_and_loads_again_when_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tenants.yaml");
        let (mut reloader, tenants) = loaded(&path);
        reloader.check().await;
        assert_eq!(generation(&tenants), 1, "unchanged content is skipped");

        std::fs::remove_file(&path).unwrap();
        reloader.check().await;
        reloader.check().await;
        assert!(tenants.is_loaded());
        assert_eq!(generation(&tenants), 1);

        std::fs::write(&path, FILE).unwrap();
        reloader.check().await;
        assert_eq!(generation(&tenants), 2);
        assert_eq!(tenants.subscribe().borrow().last_error, None);
    }

    /// A file that is there but cannot be read did not disappear: once it
    /// reads again with the content last loaded, nothing is reloaded.
    #[tokio::test]
    async fn a_file_that_cannot_be_read_for_a_while_is_not_a_new_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tenants.yaml");
        let (mut reloader, tenants) = loaded(&path);
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        reloader.check().await;
        assert!(tenants.is_loaded());

        std::fs::remove_dir(&path).unwrap();
        std::fs::write(&path, FILE).unwrap();
        reloader.check().await;
        assert_eq!(generation(&tenants), 1);
    }

    /// With the poll an hour away, only the watch on the file's directory
    /// can see it replaced (by rename, as tenant-sync and kubelet do).
    #[tokio::test]
    async fn a_file_replaced_by_rename_is_loaded_without_waiting_for_the_poll() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tenants.yaml");
        std::fs::write(&path, FILE).unwrap();
        let tenants = Arc::new(Tenants::default());
        let reloader = Reloader::new(path.clone(), tenants.clone(), Arc::default());
        let mut status = tenants.subscribe();
        let (_stop, stop) = tokio::sync::oneshot::channel::<()>();
        let (_recheck, recheck) = watch::channel(0);
        let hour = Duration::from_secs(3600);
        tokio::spawn(reloader.run(hour, async { stop.await.unwrap_or(()) }, recheck));
        // The poll's first tick, which comes once the watch is set.
        reaches(&mut status, 1).await;
        let next = dir.path().join("next.yaml");
        std::fs::write(&next, "tenants:\n  - id: team-b\n").unwrap();
        std::fs::rename(&next, &path).unwrap();
        reaches(&mut status, 2).await;
    }

    async fn reaches(status: &mut watch::Receiver<ReloadStatus>, generation: u64) {
        let reached = status.wait_for(|s| s.generation == generation);
        tokio::time::timeout(Duration::from_secs(30), reached)
            .await
            .unwrap_or_else(|_| panic!("generation {generation} within 30 s"))
            .unwrap();
    }

    #[test]
    fn reading_the_file_does_not_trigger_a_reload() {
        assert!(!may_change_content(&EventKind::Access(AccessKind::Open(
            AccessMode::Read
        ))));
        assert!(!may_change_content(&EventKind::Access(AccessKind::Close(
            AccessMode::Read
        ))));
        assert!(!may_change_content(&EventKind::Modify(
            ModifyKind::Metadata(MetadataKind::AccessTime)
        )));
    }

    #[test]
    fn writes_renames_and_removals_do() {
        assert!(may_change_content(&EventKind::Create(CreateKind::File)));
        assert!(may_change_content(&EventKind::Modify(ModifyKind::Name(
            RenameMode::To
        ))));
        assert!(may_change_content(&EventKind::Modify(ModifyKind::Data(
            notify::event::DataChange::Content
        ))));
        assert!(may_change_content(&EventKind::Remove(
            notify::event::RemoveKind::File
        )));
    }
}
