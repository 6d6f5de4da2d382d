//! The `tenant-sync` binary: flags → options, a kube client, the admin
//! listener, and the sync loop until SIGTERM (or one sync with `--once`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use tenant_proxy::http::server::Shutdown;
use tenant_proxy::ops::process::{recheck_on_hangup, Recheck};
use tenant_proxy::tenants::{Scope, Scopes};
use tenant_sync::controller::{Options, PeerService, Status, Syncer};
use tenant_sync::index::Conventions;
use tenant_sync::metrics::Metrics;

#[derive(Parser)]
#[command(
    version,
    about = "Renders tenant-proxy's tenants file from Namespaces and Secrets"
)]
struct Cli {
    /// The tenants file to write (shared with the proxy, e.g. an emptyDir).
    #[arg(long, env = "TENANT_SYNC_TENANTS_FILE")]
    tenants_file: PathBuf,
    /// Namespaces carrying this label join the tenant named by its value;
    /// without it, each namespace is its own tenant.
    #[arg(long)]
    tenant_label: Option<String>,
    /// Only namespaces matching this label selector are considered.
    #[arg(long)]
    namespace_selector: Option<String>,
    /// Secrets must carry this label selector.
    #[arg(long, default_value = "tenant-proxy/credentials=true")]
    secret_selector: String,
    /// Annotation on a Secret listing its scopes (`logs:write,metrics:write`).
    #[arg(long, default_value = "tenant-proxy/scopes")]
    scopes_annotation: String,
    /// A Secret's `username` must end with `@` and its tenant
    /// (`grafana@team-a`), so that no tenant can take a username another
    /// tenant's Secrets could use; others are left out
    /// (`username_not_of_tenant`).
    #[arg(long)]
    usernames_name_their_tenant: bool,
    /// The scopes a Secret may grant in a Namespace without the
    /// `tenant-proxy/grantable-scopes` annotation (comma-separated, e.g.
    /// `logs:read,logs:write,metrics:read,metrics:write`); others are left
    /// out (`scope_not_grantable`). Default: no cap there.
    #[arg(long, value_parser = scope_list)]
    grantable_scopes: Option<Scopes>,
    /// The most credentials one tenant's Secrets may put in the file, the
    /// oldest Secrets first; newer ones are left out
    /// (`too_many_credentials`). Every credential is in every proxy
    /// replica's memory, and a plaintext one costs a hash before the
    /// first file. `0`: no cap. A Namespace's `tenant-proxy/max-credentials`
    /// annotation sets its tenant's cap instead.
    #[arg(long, default_value_t = 1000)]
    max_credentials_per_tenant: usize,
    /// Watch Secrets only in these namespaces (comma-separated; RBAC by Role).
    #[arg(long, value_delimiter = ',')]
    secret_namespaces: Vec<String>,
    /// `/metrics`, `/healthz`, `/readyz`.
    #[arg(long, default_value = "0.0.0.0:8082")]
    admin_listen: SocketAddr,
    /// Quiet time after the last change before the file is rendered.
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    debounce: Duration,
    /// The longest a change waits for the file however busy the cluster
    /// (changes closer together than `--debounce` would otherwise put the
    /// render off for as long as they keep coming).
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    max_delay: Duration,
    /// Render from what is known this often even when nothing changes, so
    /// `tenant_sync_last_successful_sync_timestamp_seconds` shows liveness.
    #[arg(long, default_value = "5m", value_parser = above_zero)]
    resync_interval: Duration,
    /// Render once after the initial lists and exit (init containers, CI).
    #[arg(long)]
    once: bool,
    /// The proxy's own Service: its ready endpoints (EndpointSlices) are
    /// written into the file as `replicas`, which `tenant_limits.scope:
    /// global` divides limits by. Absent: no `replicas` is written.
    #[arg(long)]
    peer_service: Option<String>,
    /// The Service's namespace; default the pod's own (`POD_NAMESPACE`, else
    /// the service account's namespace file).
    #[arg(long, env = "POD_NAMESPACE")]
    peer_namespace: Option<String>,
    /// This pod's name (default: the host's name, which Kubernetes sets to
    /// the pod's): the Events' reporting
    /// instance; with `--peer-service`, only the first ready replica by
    /// pod name publishes them.
    #[arg(long, env = "POD_NAME")]
    pod_name: Option<String>,
    /// Publish no Kubernetes Event on a Secret left out of the file (they
    /// need `create` and `patch` on `events.k8s.io` events).
    #[arg(long)]
    no_events: bool,
    /// Log format: `text` or `json`.
    #[arg(long, default_value = "text")]
    log_format: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tenant_proxy::ops::process::init_logging(&cli.log_format).map_err(anyhow::Error::msg)?;
    let options = Options {
        tenants_file: cli.tenants_file,
        conventions: Conventions {
            tenant_label: cli.tenant_label,
            scopes_annotation: cli.scopes_annotation,
            usernames_name_their_tenant: cli.usernames_name_their_tenant,
            default_grantable: cli.grantable_scopes,
            max_credentials_per_tenant: Some(cli.max_credentials_per_tenant).filter(|&cap| cap > 0),
        },
        secret_selector: cli.secret_selector,
        namespace_selector: cli.namespace_selector,
        secret_namespaces: cli.secret_namespaces,
        debounce: cli.debounce,
        max_delay: cli.max_delay,
        hashing_per_sync: tenant_sync::controller::HASHING_PER_SYNC,
        resync_interval: cli.resync_interval,
        once: cli.once,
        events: !cli.no_events,
        instance: cli.pod_name.or_else(tenant_sync::notices::host_name),
        peer_service: match cli.peer_service {
            None => None,
            Some(service) => Some(PeerService {
                namespace: match cli.peer_namespace {
                    Some(namespace) => namespace,
                    None => own_namespace()?,
                },
                name: service,
            }),
        },
    };
    // In-cluster service account, or KUBECONFIG / ~/.kube/config.
    let client = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API")?;
    let metrics = Arc::new(Metrics::default());
    let status = Arc::new(Status::default());
    let shutdown = Shutdown::new(
        tenant_proxy::ops::process::shutdown_signal()
            .context("installing the SIGTERM and SIGINT handlers")?,
    );
    if !options.once {
        let listener = tokio::net::TcpListener::bind(cli.admin_listen)
            .await
            .with_context(|| format!("binding {}", cli.admin_listen))?;
        let admin_state = Arc::new(tenant_sync::admin::SyncAdmin {
            metrics: metrics.clone(),
            status: status.clone(),
        });
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let limits = tenant_proxy::config::Limits::default();
            tenant_proxy::ops::admin::serve(listener, admin_state, &limits, shutdown).await
        });
    }
    tracing::info!(tenants_file = %options.tenants_file.display(), "tenant-sync starting");
    // SIGHUP puts the file right now, as the next resync would.
    let resync = Recheck::default();
    let hangups = recheck_on_hangup(
        resync.clone(),
        "writing the tenants file again if it differs",
    )
    .context("installing a SIGHUP handler")?;
    tokio::spawn(hangups);
    Syncer::new(options, metrics, status)
        .resync_when_asked(resync.subscribe())
        .run(client, shutdown.wait())
        .await?;
    tracing::info!("tenant-sync stopped");
    Ok(())
}

/// A list of scopes, every item known: a typo refuses to start rather
/// than cap more, or less, than meant.
fn scope_list(text: &str) -> Result<Scopes, String> {
    let known = || Scope::ALL.map(Scope::as_str).join(", ");
    tenant_sync::index::parse_scopes(text)
        .map(|scopes| scopes.into_iter().collect())
        .ok_or_else(|| format!("lists an unknown scope or none; known: {}", known()))
}

/// A duration a clock ticks by: zero would panic it (tokio's interval).
fn above_zero(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(d) if d.is_zero() => Err("must be above zero".into()),
        parsed => parsed.map_err(|e| e.to_string()),
    }
}

/// The namespace this pod runs in, from its service account.
fn own_namespace() -> anyhow::Result<String> {
    namespace_in(std::path::Path::new(
        "/var/run/secrets/kubernetes.io/serviceaccount/namespace",
    ))
}

fn namespace_in(file: &std::path::Path) -> anyhow::Result<String> {
    let namespace = std::fs::read_to_string(file).with_context(|| {
        format!(
            "--peer-namespace not given and {} unreadable",
            file.display()
        )
    })?;
    Ok(namespace.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::namespace_in;

    /// The service account's file, as a pod has it; without it, a clear
    /// refusal naming the flag that would do instead.
    #[test]
    fn the_peer_namespace_defaults_to_the_pods_own() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("namespace");
        std::fs::write(&file, "tenant-proxy\n").unwrap();
        assert_eq!(namespace_in(&file).unwrap(), "tenant-proxy");
        let missing = namespace_in(&dir.path().join("none")).unwrap_err();
        assert!(
            missing.to_string().contains("--peer-namespace not given"),
            "{missing}"
        );
    }
}
