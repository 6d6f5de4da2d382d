//! The operator helpers behind `tenant-proxy hash-password`, `check-config`
//! and `rewrite`: plain functions returning text, so tests call them directly.

use std::fmt::Write;

use crate::config::{Config, MetricsMode};
use crate::enforce::promql::{self, TenantMatcher};
use crate::tenants::file as tenants_file;
use crate::tenants::TenantStore;

pub type CliResult = Result<String, Box<dyn std::error::Error + Send + Sync>>;

/// The summary `check-config` prints: tenants, namespaces, users, scopes.
/// Never a hash.
pub fn check_config(config: &Config) -> CliResult {
    let (store, notes) = tenants_file::load(&config.tenants_file, 1)?;
    check_tls_files(config)?;
    let mut out = String::new();
    writeln!(
        out,
        "config ok: listen {}, admin {}",
        config.listen, config.admin_listen
    )?;
    if let Some(metrics) = &config.metrics {
        writeln!(
            out,
            "metrics: {:?} mode, label {:?}",
            metrics.mode, metrics.label
        )?;
    }
    writeln!(
        out,
        "tenants file {}: {} tenant(s)",
        config.tenants_file.display(),
        store.tenants().len()
    )?;
    for warning in config.warnings() {
        writeln!(out, "warning: {warning}")?;
    }
    if notes.plaintext_passwords {
        writeln!(
            out,
            "warning: plaintext passwords (k8spin authn.yaml format)"
        )?;
    }
    for tenant in store.tenants() {
        writeln!(
            out,
            "  tenant {} namespaces [{}]",
            tenant.id,
            tenant.namespaces.join(", ")
        )?;
    }
    for credential in store.credentials_sorted() {
        let scopes: Vec<_> = credential.scopes.iter().map(|s| s.as_str()).collect();
        writeln!(
            out,
            "  user {} -> tenant {} scopes [{}]",
            credential.username,
            credential.tenant.id,
            scopes.join(", ")
        )?;
    }
    Ok(out)
}

/// Loads every certificate, key and CA file the way start-up does, so a
/// config that passes `check-config` does not stop the proxy on a file.
fn check_tls_files(config: &Config) -> Result<(), String> {
    if let Some(tls) = &config.tls {
        crate::http::tls::load(tls).map_err(|e| format!("tls: {e}"))?;
    }
    for (section, tls) in config.upstream_tls() {
        let reuse =
            crate::upstream::Reuse::new(config.limits.upstream_idle_timeout, Default::default());
        crate::upstream::client(Some(tls), reuse, None)
            .map_err(|e| format!("{section}.tls: {e}"))?;
    }
    Ok(())
}

/// Who a query is rewritten for.
#[derive(Debug)]
pub enum Subject {
    User(String),
    Tenant(String),
}

/// The query exactly as label mode would forward it for `subject`.
/// `selector` treats the input as a `match[]` value instead of a query.
pub fn rewrite(config: &Config, subject: &Subject, query: &str, selector: bool) -> CliResult {
    let metrics = config
        .metrics
        .as_ref()
        .ok_or("the config has no `metrics` section")?;
    if metrics.mode != MetricsMode::Label {
        return Err("metrics.mode is header: queries are forwarded unchanged".into());
    }
    let (store, _) = tenants_file::load(&config.tenants_file, 1)?;
    let namespaces = namespaces_of(&store, subject)?;
    let matcher = TenantMatcher::new(&metrics.label, namespaces)?;
    let enforced = if selector {
        promql::enforce_selector(query, &matcher)?
    } else {
        promql::enforce_query(query, &matcher)?
    };
    Ok(format!("{enforced}\n"))
}

fn namespaces_of<'a>(store: &'a TenantStore, subject: &Subject) -> Result<&'a [String], String> {
    let tenant = match subject {
        Subject::User(user) => store
            .credential(user)
            .map(|c| &c.tenant)
            .ok_or_else(|| format!("no user {user:?} in the tenants file"))?,
        Subject::Tenant(id) => store
            .tenants()
            .iter()
            .find(|t| t.id.as_str() == id)
            .ok_or_else(|| format!("no tenant {id:?} in the tenants file"))?,
    };
    Ok(&tenant.namespaces)
}
