//! A running tenant-sync against the API server stand-in.
#![allow(dead_code)]

pub mod apiserver;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use apiserver::ApiServer;
use tenant_proxy::ops::process::Recheck;
use tenant_sync::controller::{Options, Status, SyncError, Syncer};
use tenant_sync::index::Conventions;
use tenant_sync::metrics::Metrics;
use tokio::sync::{oneshot, watch};

pub fn options(tenants_file: PathBuf) -> Options {
    Options {
        tenants_file,
        conventions: Conventions {
            tenant_label: None,
            scopes_annotation: "tenant-proxy/scopes".into(),
            usernames_name_their_tenant: false,
            default_grantable: None,
            max_credentials_per_tenant: None,
        },
        secret_selector: "tenant-proxy/credentials=true".into(),
        namespace_selector: None,
        secret_namespaces: Vec::new(),
        debounce: Duration::from_millis(50),
        max_delay: Duration::from_secs(5),
        hashing_per_sync: tenant_sync::controller::HASHING_PER_SYNC,
        resync_interval: Duration::from_secs(3600),
        once: false,
        peer_service: None,
        events: true,
        instance: None,
    }
}

pub struct RunningSync {
    pub file: PathBuf,
    pub status: Arc<Status>,
    pub metrics: Arc<Metrics>,
    /// Asks for a resync now, as SIGHUP does.
    pub resync: Recheck,
    writes: watch::Receiver<u64>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<(), SyncError>>>,
    _dir: Option<tempfile::TempDir>,
}

impl RunningSync {
    pub fn start(api: &ApiServer, tweak: impl FnOnce(&mut Options)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut options = options(dir.path().join("tenants.yaml"));
        tweak(&mut options);
        Self::start_with(api, options, Some(dir))
    }

    pub fn start_with(api: &ApiServer, options: Options, dir: Option<tempfile::TempDir>) -> Self {
        let metrics = Arc::new(Metrics::default());
        let status = Arc::new(Status::default());
        let writes = status.writes();
        let file = options.tenants_file.clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let resync = Recheck::default();
        let syncer = Syncer::new(options, metrics.clone(), status.clone())
            .resync_when_asked(resync.subscribe());
        let task = tokio::spawn(syncer.run(api.client(), async {
            let _ = stopped.await;
        }));
        Self {
            file,
            status,
            metrics,
            resync,
            writes,
            stop: Some(stop),
            task: Some(task),
            _dir: dir,
        }
    }

    /// Waits (at most 30 s) for the next write of the file; returns users by tenant.
    pub async fn next_write(&mut self) -> BTreeMap<String, String> {
        self.writes.borrow_and_update();
        tokio::time::timeout(Duration::from_secs(30), self.writes.changed())
            .await
            .expect("tenant-sync wrote the file within 30 s")
            .unwrap();
        self.users()
    }

    /// username → tenant, as the proxy reads the file.
    pub fn users(&self) -> BTreeMap<String, String> {
        let (store, _) = tenant_proxy::tenants::file::load(&self.file, 1).unwrap();
        store
            .credentials_sorted()
            .into_iter()
            .map(|c| (c.username.clone(), c.tenant.id.to_string()))
            .collect()
    }

    pub fn verifies(&self, user: &str, password: &str) -> bool {
        let (store, _) = tenant_proxy::tenants::file::load(&self.file, 1).unwrap();
        store
            .credential(user)
            .is_some_and(|c| c.verifier.verify(password))
    }

    pub async fn stop(&mut self) -> Result<(), SyncError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.take().unwrap().await.unwrap()
    }

    pub async fn finished(&mut self) -> Result<(), SyncError> {
        tokio::time::timeout(Duration::from_secs(30), self.task.take().unwrap())
            .await
            .expect("finished within 30 s")
            .unwrap()
    }
}

pub fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect()
}
