//! Label mode: a rule group posted to Loki's ruler, checked and written
//! again with the tenant label on every rule (`enforce::rule_group` says
//! why).

use http::header::{self, HeaderValue};
use hyper::body::Incoming;

use super::state::AppState;
use crate::enforce::rule_group::{self, RuleGroupError};
use crate::enforce::tenant_label::TenantLabel;
use crate::http::body::{self, ProxyBody};
use crate::http::error::ProxyError;

/// The rule group to forward in place of the one received.
pub(super) async fn rule_group(
    state: &AppState,
    tenant: &TenantLabel<'_>,
    parts: &mut http::request::Parts,
    body: body::Guarded<Incoming>,
) -> Result<ProxyBody, ProxyError> {
    let identity = |v: &HeaderValue| v.as_bytes().eq_ignore_ascii_case(b"identity");
    if parts
        .headers
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .any(|v| !identity(v))
    {
        return Err(ProxyError::BadData(
            "a compressed rule group is not accepted; send it as YAML".into(),
        ));
    }
    let received = body::read_bounded(body, state.limits.max_body_bytes).await?;
    // Unreadable, or a foreign label under `foreign_label: reject`: 400,
    // as a remote write refused for the same reason.
    let yaml = rule_group::rewrite(&received, tenant)
        .map_err(|e: RuleGroupError| ProxyError::BadData(e.to_string()))?;
    parts.headers.remove(header::CONTENT_ENCODING);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/yaml"),
    );
    parts
        .headers
        .insert(header::CONTENT_LENGTH, HeaderValue::from(yaml.len()));
    Ok(body::full(yaml))
}
