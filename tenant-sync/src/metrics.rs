//! tenant-sync's own metrics (`tenant_sync_*`), with bounded labels.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    /// `namespaces` or `secrets`.
    pub resource: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `published`, `failed`, `dropped` or `left_to_another_replica`.
    pub outcome: &'static str,
}

pub struct Metrics {
    registry: Registry,
    pub tenants: Gauge,
    pub credentials: Gauge,
    pub skipped_secrets: Family<ReasonLabels, Gauge>,
    pub invalid_limits: Gauge,
    pub invalid_caps: Gauge,
    pub writes: Counter,
    pub write_errors: Counter,
    pub last_write: Gauge<f64, AtomicU64>,
    pub relists: Family<ResourceLabels, Counter>,
    pub watch_errors: Family<ResourceLabels, Counter>,
    pub hashes_computed: Counter,
    pub hashes_reused: Counter,
    pub hashes_pending: Gauge,
    pub events: Family<OutcomeLabels, Counter>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("tenant_sync");
        let tenants = Gauge::default();
        registry.register(
            "tenants",
            "Tenants in the last rendered file",
            tenants.clone(),
        );
        let credentials = Gauge::default();
        registry.register(
            "credentials",
            "Credentials in the last rendered file",
            credentials.clone(),
        );
        let skipped_secrets = Family::default();
        registry.register(
            "skipped_secrets",
            "Secrets currently left out of the file, by reason",
            skipped_secrets.clone(),
        );
        let invalid_limits = Gauge::default();
        registry.register(
            "invalid_limit_annotations",
            "Annotations tenant-proxy/limits and tenant-proxy/max-credentials on Namespaces currently left out as invalid",
            invalid_limits.clone(),
        );
        let invalid_caps = Gauge::default();
        registry.register(
            "invalid_scope_caps",
            "Namespaces whose tenant-proxy/grantable-scopes annotation lists no known scope (their Secrets grant nothing)",
            invalid_caps.clone(),
        );
        let writes = Counter::default();
        registry.register(
            "writes",
            "Times the tenants file was replaced",
            writes.clone(),
        );
        let write_errors = Counter::default();
        registry.register(
            "write_errors",
            "Failed renders or writes",
            write_errors.clone(),
        );
        let last_write = Gauge::default();
        registry.register(
            "last_successful_sync_timestamp_seconds",
            "Unix time the file last matched the cluster (written or already current)",
            last_write.clone(),
        );
        let relists = Family::default();
        registry.register(
            "watch_relists",
            "Full re-lists (start, 410 Gone, reconnect)",
            relists.clone(),
        );
        let watch_errors = Family::default();
        registry.register(
            "watch_errors",
            "Watch errors (retried with back-off)",
            watch_errors.clone(),
        );
        let hashes_computed = Counter::default();
        registry.register(
            "hashes_computed",
            "argon2id hashes computed",
            hashes_computed.clone(),
        );
        let hashes_reused = Counter::default();
        registry.register(
            "hashes_reused",
            "Hashes reused for unchanged passwords",
            hashes_reused.clone(),
        );
        let hashes_pending = Gauge::default();
        registry.register(
            "hashes_pending",
            "New passwords not hashed by the last sync (their credentials come in a later one)",
            hashes_pending.clone(),
        );
        let events = Family::default();
        registry.register(
            "events",
            "Events on Secrets left out, by outcome: published, failed (the API server refused or was unreachable; RBAC?), dropped (too many waiting) or left_to_another_replica (the first ready replica publishes)",
            events.clone(),
        );
        Self {
            registry,
            tenants,
            credentials,
            skipped_secrets,
            invalid_limits,
            invalid_caps,
            writes,
            write_errors,
            last_write,
            relists,
            watch_errors,
            hashes_computed,
            hashes_reused,
            hashes_pending,
            events,
        }
    }
}

impl Metrics {
    pub fn encode(&self) -> String {
        tenant_proxy::ops::metrics::encode_registry(&self.registry)
    }
}
