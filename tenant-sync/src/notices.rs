//! Tells a Secret's author why it was left out of the tenants file: a
//! Kubernetes Event on the Secret, which `kubectl events --for
//! secret/<name>` shows (`kubectl describe secret` lists no Events).
//! Tenants cannot read tenant-sync's log or metrics, and without this a
//! skipped Secret only shows as a 401 at the proxy.
//!
//! Events go out one at a time from a task of their own, so a slow or
//! refusing API server never holds a sync back; when too many wait, the
//! newest are dropped (the log and `tenant_sync_skipped_secrets` still
//! count them). `tenant_sync_events_total{outcome}` counts each. A note is a fixed text per reason: nothing from the
//! Secret's data is ever in it.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::Client;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::index::SkipReason;
use crate::metrics::{Metrics, OutcomeLabels};

/// Events waiting to be published, at most.
const QUEUE: usize = 1024;

/// The Event's `reason`, as `kubectl events` lists it.
pub const REASON: &str = "CredentialSkipped";

/// The longest `finish` waits for queued Events.
const FINISH_WITHIN: Duration = Duration::from_secs(10);

/// Publishes skip notices in the background.
#[derive(Debug)]
pub struct Notices {
    queue: mpsc::Sender<(ObjectReference, SkipReason)>,
    task: JoinHandle<()>,
    metrics: Arc<Metrics>,
}

impl Notices {
    /// Starts the publishing task, which ends once `Notices` is dropped and
    /// the queue is empty.
    pub fn start(client: Client, metrics: Arc<Metrics>) -> Self {
        let (queue, mut waiting) = mpsc::channel::<(ObjectReference, SkipReason)>(QUEUE);
        // The instance is the pod's name (its hostname).
        let recorder = Recorder::new(client, Reporter::from("tenant-sync"));
        let counted = metrics.clone();
        let task = tokio::spawn(async move {
            while let Some((secret, reason)) = waiting.recv().await {
                let event = Event {
                    type_: EventType::Warning,
                    reason: REASON.into(),
                    note: Some(note(reason).into()),
                    action: "Sync".into(),
                    secondary: None,
                };
                let published = recorder.publish(&event, &secret).await;
                count(
                    &counted,
                    if published.is_ok() {
                        "published"
                    } else {
                        "failed"
                    },
                );
                if let Err(error) = published {
                    tracing::warn!(
                        namespace = secret.namespace.as_deref().unwrap_or_default(),
                        secret = secret.name.as_deref().unwrap_or_default(),
                        %error,
                        "cannot publish the Event saying why a Secret was skipped"
                    );
                }
            }
        });
        Self {
            queue,
            task,
            metrics,
        }
    }

    /// Publishes what is queued, then stops (`--once` exits right after):
    /// within `FINISH_WITHIN`, so an API server that never answers cannot
    /// hold the exit.
    pub async fn finish(self) {
        drop(self.queue);
        if tokio::time::timeout(FINISH_WITHIN, self.task)
            .await
            .is_err()
        {
            tracing::warn!("gave up publishing the Events still queued");
        }
    }

    /// Queues a notice that `secret` was left out for `reason`.
    pub fn skipped(&self, secret: ObjectReference, reason: SkipReason) {
        if self.queue.try_send((secret, reason)).is_err() {
            count(&self.metrics, "dropped");
            tracing::debug!("skip notice dropped: too many waiting");
        }
    }
}

fn count(metrics: &Metrics, outcome: &'static str) {
    metrics
        .events
        .get_or_create(&OutcomeLabels { outcome })
        .inc();
}

/// What the Secret's author reads: why, and what to change.
pub fn note(reason: SkipReason) -> &'static str {
    match reason {
        SkipReason::WrongType => {
            "left out of tenant-proxy's tenants file: the Secret is not of type kubernetes.io/basic-auth"
        }
        SkipReason::MissingUsername => {
            "left out of tenant-proxy's tenants file: the Secret has no `username` key"
        }
        SkipReason::InvalidUsername => {
            "left out of tenant-proxy's tenants file: `username` is empty, not UTF-8, or holds ':' or a control character"
        }
        SkipReason::MissingPassword => {
            "left out of tenant-proxy's tenants file: the Secret has neither a `password` nor a `password-hash` key"
        }
        SkipReason::InvalidPassword => {
            "left out of tenant-proxy's tenants file: `password` is not UTF-8, so no client could send it"
        }
        SkipReason::InvalidPasswordHash => {
            "left out of tenant-proxy's tenants file: `password-hash` is not an argon2id PHC string (make one with `tenant-proxy hash-password`)"
        }
        SkipReason::InvalidScopes => {
            "left out of tenant-proxy's tenants file: the scopes annotation lists an unknown scope, or none"
        }
        SkipReason::InvalidSelector => {
            "left out of tenant-proxy's tenants file: the tenant-proxy/selector annotation cannot be read, or comes with a scope that writes"
        }
        SkipReason::NamespaceNotATenant => {
            "left out of tenant-proxy's tenants file: this namespace belongs to no tenant"
        }
        SkipReason::ScopeNotGrantable => {
            "left out of tenant-proxy's tenants file: it asks (by its scopes annotation, or by default when it has none) for a scope this Namespace's tenant-proxy/grantable-scopes does not let its Secrets grant"
        }
        SkipReason::DuplicateUsername => {
            "left out of tenant-proxy's tenants file: an older Secret already holds this username; choose another"
        }
    }
}
