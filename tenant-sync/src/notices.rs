//! Tells a Secret's author why it was left out of the tenants file, and
//! when it is in again: a Kubernetes Event on the Secret, which `kubectl
//! events --for secret/<name>` shows (`kubectl describe secret` lists no
//! Events). Tenants cannot read tenant-sync's log or metrics, and without
//! this a skipped Secret only shows as a 401 at the proxy.
//!
//! Events go out one at a time from a task of their own, so a slow or
//! refusing API server never holds a sync back; when too many wait, the
//! newest are dropped (the log and `tenant_sync_skipped_secrets` still
//! count them). With several replicas (the proxy's and so tenant-sync's),
//! the first ready one by pod name publishes, so that a Secret gets one
//! Event, not one per replica (`Index::speaks_for_replicas`).
//! `tenant_sync_events_total{outcome}` counts each. A note is
//! a fixed text per reason: nothing from the Secret's data is ever in it.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::Client;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::index::SkipReason;
use crate::metrics::{Metrics, OutcomeLabels};

/// The Events' reporting controller.
const CONTROLLER: &str = "tenant-sync";

/// This host's name, as Events name their instance without a pod name
/// given: Kubernetes names a pod's host after the pod.
pub fn host_name() -> Option<String> {
    Reporter::from(CONTROLLER).instance
}

/// Events waiting to be published, at most.
const QUEUE: usize = 1024;

/// What an Event says about a Secret.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Notice {
    /// Left out of the file (a `Warning`, reason `CredentialSkipped`).
    Skipped(SkipReason),
    /// In the file again after it was left out (`Normal`,
    /// `CredentialLoaded`), so the old warning is not the last word.
    Loaded,
}

/// The longest `finish` waits for queued Events.
const FINISH_WITHIN: Duration = Duration::from_secs(10);

/// Publishes notices in the background.
#[derive(Debug)]
pub struct Notices {
    queue: mpsc::Sender<(ObjectReference, Notice)>,
    task: JoinHandle<()>,
    metrics: Arc<Metrics>,
}

impl Notices {
    /// Starts the publishing task, which ends once `Notices` is dropped and
    /// the queue is empty. Its Events name `instance`, or the host.
    pub fn start(client: Client, metrics: Arc<Metrics>, instance: Option<String>) -> Self {
        let (queue, mut waiting) = mpsc::channel::<(ObjectReference, Notice)>(QUEUE);
        let reporter = Reporter {
            controller: CONTROLLER.into(),
            instance: instance.or_else(host_name),
        };
        let recorder = Recorder::new(client, reporter);
        let counted = metrics.clone();
        let task = tokio::spawn(async move {
            while let Some((secret, notice)) = waiting.recv().await {
                let (type_, reason) = match notice {
                    Notice::Skipped(_) => (EventType::Warning, "CredentialSkipped"),
                    Notice::Loaded => (EventType::Normal, "CredentialLoaded"),
                };
                let event = Event {
                    type_,
                    reason: reason.into(),
                    note: Some(note(notice)),
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
                        "cannot publish an Event on a Secret"
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

    /// Counts a notice another replica publishes (the first ready one).
    pub fn leave_to_another_replica(&self) {
        count(&self.metrics, "left_to_another_replica");
    }

    /// Queues `notice` about `secret`.
    pub fn tell(&self, secret: ObjectReference, notice: Notice) {
        if self.queue.try_send((secret, notice)).is_err() {
            count(&self.metrics, "dropped");
            tracing::debug!("Secret notice dropped: too many waiting");
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
pub fn note(notice: Notice) -> String {
    let Notice::Skipped(reason) = notice else {
        return "in tenant-proxy's tenants file: its credential works at the proxy".into();
    };
    format!("left out of tenant-proxy's tenants file: {}", why(reason))
}

fn why(reason: SkipReason) -> &'static str {
    match reason {
        SkipReason::WrongType => "the Secret is not of type kubernetes.io/basic-auth",
        SkipReason::MissingUsername => "the Secret has no `username` key",
        SkipReason::InvalidUsername => {
            "`username` is empty, not UTF-8, or holds ':' or a control character"
        }
        SkipReason::MissingPassword => {
            "the Secret has neither a `password` nor a `password-hash` key"
        }
        SkipReason::InvalidPassword => "`password` is not UTF-8, so no client could send it",
        SkipReason::InvalidPasswordHash => {
            "`password-hash` is not an argon2id PHC string (make one with `tenant-proxy hash-password`)"
        }
        SkipReason::InvalidScopes => "the scopes annotation lists an unknown scope, or none",
        SkipReason::InvalidSelector => {
            "the tenant-proxy/selector annotation cannot be read, or comes with a scope that writes"
        }
        SkipReason::NamespaceNotATenant => "this namespace belongs to no tenant",
        SkipReason::ScopeNotGrantable => {
            "it asks (by its scopes annotation, or by default when it has none) for a scope this Namespace's tenant-proxy/grantable-scopes (or, without it, tenant-sync's --grantable-scopes) does not let its Secrets grant"
        }
        SkipReason::UsernameNotOfTenant => {
            "`username` must end with '@' and this namespace's tenant (the namespace's name, or its tenant label's value), as `grafana@team-a`"
        }
        SkipReason::DuplicateUsername => {
            "an older Secret already holds this username; choose another"
        }
        SkipReason::TooManyCredentials => {
            "this namespace's tenant already holds as many credentials as its cap allows (the Namespace annotation tenant-proxy/max-credentials, or tenant-sync's --max-credentials-per-tenant), from older Secrets; delete a credential Secret the tenant no longer uses"
        }
    }
}

#[cfg(test)]
mod tests {
    /// Without `--pod-name`, the host's name (a pod's, in Kubernetes) is
    /// the replica's name: the one its Events carry and by which the first
    /// ready replica is chosen to publish them.
    #[test]
    fn the_instance_falls_back_to_the_kernels_host_name() {
        let kernel = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
        assert_eq!(super::host_name().as_deref(), Some(kernel.trim()));
    }
}
