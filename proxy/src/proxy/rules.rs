//! Rule groups posted through the proxy (`enforce::rule_group` says why):
//! in label mode Loki's, checked and written again with the tenant label on
//! every rule; in header mode Mimir's and Cortex's, once they query no
//! other tenant, written again from what was checked. A large one (YAML is
//! slow to read) on a body worker, `body_workers.rs`.

use bytes::Bytes;
use http::header::{self, HeaderValue};
use hyper::body::Incoming;

use super::state::AppState;
use crate::enforce::rule_group::{self, RuleGroupError};
use crate::enforce::tenant_label::{OwnedTenantLabel, TenantLabel};
use crate::http::body::{self, ProxyBody};
use crate::http::error::ProxyError;
use crate::http::headers;
use crate::ops::metrics::{GaugeHeld, TenantActionLabels};

/// The rule group to forward in place of the one received (label mode,
/// Loki).
pub(super) async fn rule_group(
    state: &AppState,
    tenant: &TenantLabel<'_>,
    parts: &mut http::request::Parts,
    body: body::Guarded<Incoming>,
) -> Result<ProxyBody, ProxyError> {
    let (received, counted) = read_uncompressed(state, parts, body).await?;
    let (owned, group) = (OwnedTenantLabel::of(tenant), received.clone());
    let step = move || rule_group::rewrite(&group, &owned.view());
    let workers = &state.body_workers;
    let rewritten = workers.run_held(received.len(), counted, step).await?;
    let (yaml, pinned) = rewritten.map_err(|error| {
        if let RuleGroupError::ForeignLabel(_) = error {
            count_pinned(state, tenant, "rejected", 1);
        }
        refusal(error)
    })?;
    count_pinned(state, tenant, "added", pinned.added);
    count_pinned(state, tenant, "overwritten", pinned.overwritten);
    Ok(yaml_body(parts, yaml))
}

/// The rule group to forward, once it reads no other tenant's data
/// (header mode, Mimir or Cortex).
pub(super) async fn federated_rule_group(
    state: &AppState,
    tenant_id: &str,
    parts: &mut http::request::Parts,
    body: body::Guarded<Incoming>,
) -> Result<ProxyBody, ProxyError> {
    let (received, counted) = read_uncompressed(state, parts, body).await?;
    let (tenant_id, group) = (tenant_id.to_owned(), received.clone());
    let step = move || rule_group::federated(&group, &tenant_id);
    let yaml = state
        .body_workers
        .run_held(received.len(), counted, step)
        .await?
        .map_err(refusal)?;
    Ok(yaml_body(parts, yaml))
}

/// The body, bounded, and its count if it is large; a compressed one is
/// refused (the checks read YAML).
async fn read_uncompressed(
    state: &AppState,
    parts: &mut http::request::Parts,
    body: body::Guarded<Incoming>,
) -> Result<(Bytes, Option<GaugeHeld>), ProxyError> {
    if !headers::identity_coded(&parts.headers) {
        return Err(ProxyError::BadData(
            "a compressed rule group is not accepted; send it as YAML".into(),
        ));
    }
    parts.headers.remove(header::CONTENT_ENCODING);
    Ok(state.read_whole(body).await?)
}

fn count_pinned(state: &AppState, tenant: &TenantLabel<'_>, action: &'static str, rules: u64) {
    let labels = TenantActionLabels {
        tenant: tenant.owned_by.to_owned(),
        action,
    };
    state
        .metrics
        .rule_tenant_label
        .get_or_create(&labels)
        .inc_by(rules);
}

/// A group that does not read is 400, as is a foreign label under
/// `foreign_label: reject` (as for a remote write); another tenant's data
/// named as a source is 403.
fn refusal(error: RuleGroupError) -> ProxyError {
    match error {
        RuleGroupError::ForeignSourceTenant => ProxyError::Foreign(error.to_string()),
        RuleGroupError::Unreadable(_) | RuleGroupError::ForeignLabel(_) => {
            ProxyError::BadData(error.to_string())
        }
    }
}

/// The group as written here, whatever the client declared (JSON is YAML
/// to both readers), with its headers.
fn yaml_body(parts: &mut http::request::Parts, yaml: String) -> ProxyBody {
    let headers = &mut parts.headers;
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/yaml"),
    );
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(yaml.len()));
    body::full(yaml)
}
