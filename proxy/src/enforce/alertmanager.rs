//! A vanilla Alertmanager (API v2) behind label mode: what a tenant sees
//! and changes is scoped by the tenant label on alerts and silences.
//!
//! - alerts and alert groups: a `filter` matcher pinning the label to the
//!   tenant's values is added to the request, and the answer is filtered
//!   again (an Alertmanager that ignored the parameter would list all);
//! - silences are the tenant's when one of their matchers *pins* the label
//!   to owned values (an equality, or a regex that is an alternation of
//!   owned values written literally): only those are listed or shown;
//! - a silence is created or updated only if it pins the label so, or has
//!   no matcher on the label at all (the pin is then added); an update or
//!   a delete of a silence that is not the tenant's is refused;
//! - status and receivers: the configuration (receivers' URLs and
//!   credentials of every tenant) is replaced by the routes the tenant's
//!   alerts can take and the receivers they name, by name only
//!   (`routing.rs`).
//!
//! Bodies are parsed and written again from what was checked: Go's JSON
//! decoder matches field names case-insensitively and keeps the last of
//! repeated keys, so forwarding the sender's bytes could mean another
//! silence to Alertmanager than the one checked here.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::http::error::ProxyError;

mod routing;

pub use routing::{closing_quote, go_unquote, tenant_configuration, tenant_receivers};

/// The tenant as Alertmanager sees it.
#[derive(Debug, Clone, Copy)]
pub struct TenantAlerts<'a> {
    pub label: &'a str,
    /// Never empty.
    pub owned: &'a [String],
}

/// A [`TenantAlerts`] of its own, for work that runs away from the
/// request it was borrowed from (on a body worker).
#[derive(Debug, Clone)]
pub struct OwnedTenantAlerts {
    label: String,
    owned: Vec<String>,
}

impl OwnedTenantAlerts {
    pub fn of(tenant: &TenantAlerts<'_>) -> Self {
        Self {
            label: tenant.label.to_owned(),
            owned: tenant.owned.to_vec(),
        }
    }

    pub fn view(&self) -> TenantAlerts<'_> {
        TenantAlerts {
            label: &self.label,
            owned: &self.owned,
        }
    }
}

/// One matcher of a silence, as Alertmanager's API v2 defines it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Matcher {
    pub name: String,
    pub value: String,
    #[serde(rename = "isRegex")]
    pub is_regex: bool,
    /// Absent means `true` to Alertmanager.
    #[serde(rename = "isEqual", default = "yes")]
    pub is_equal: bool,
}

fn yes() -> bool {
    true
}

/// `postableSilence`: what a tenant may send, field for field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostableSilence {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub matchers: Vec<Matcher>,
    #[serde(rename = "startsAt")]
    pub starts_at: String,
    #[serde(rename = "endsAt")]
    pub ends_at: String,
    #[serde(rename = "createdBy")]
    pub created_by: String,
    pub comment: String,
}

impl TenantAlerts<'_> {
    fn owns(&self, value: &str) -> bool {
        self.owned.iter().any(|o| o == value)
    }

    /// The values as a regex Alertmanager anchors: literal alternation.
    fn alternation(&self) -> String {
        alternation(self.owned.iter().map(String::as_str))
    }

    /// The `filter` parameter value that keeps the tenant's alerts only.
    pub fn filter(&self) -> String {
        printed_matcher(self.label, "=~", &self.alternation())
    }

    /// The matcher added to a silence that names no tenant label.
    fn pin(&self) -> Matcher {
        match self.owned {
            [only] => Matcher {
                name: self.label.to_owned(),
                value: only.clone(),
                is_regex: false,
                is_equal: true,
            },
            _ => Matcher {
                name: self.label.to_owned(),
                value: self.alternation(),
                is_regex: true,
                is_equal: true,
            },
        }
    }

    /// Whether `m` restricts a silence to owned values of the label.
    fn pins(&self, m: &Matcher) -> bool {
        if m.name != self.label || !m.is_equal {
            return false;
        }
        if !m.is_regex {
            return self.owns(&m.value);
        }
        let literal = |part: &str| {
            part.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        };
        m.value == self.alternation()
            || m.value
                .split('|')
                .all(|part| literal(part) && self.owns(part))
    }

    /// Whether a silence's matchers make it the tenant's.
    pub fn owns_silence(&self, matchers: &[Matcher]) -> bool {
        matchers.iter().any(|m| self.pins(m))
    }

    fn owns_alert(&self, alert: &Value) -> bool {
        alert["labels"][self.label]
            .as_str()
            .is_some_and(|v| self.owns(v))
    }
}

/// `values` as a regex Alertmanager anchors: their literal alternation.
fn alternation<'v>(values: impl IntoIterator<Item = &'v str>) -> String {
    let escaped: Vec<String> = values.into_iter().map(escape_regex).collect();
    escaped.join("|")
}

/// A matcher in Alertmanager's matcher syntax, `label<op>"value"`, the
/// value escaped the OpenMetrics way (`\`, `"`, newline), which its
/// parsers read back.
fn printed_matcher(label: &str, op: &str, value: &str) -> String {
    let escaped = value
        .replace('\\', "\\\\")
        .replace('\n', "\\n")
        .replace('"', "\\\"");
    format!("{label}{op}\"{escaped}\"")
}

/// Escapes RE2's metacharacters only (namespace names carry none, so the
/// usual pin reads as the plain list of values).
fn escape_regex(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The query string of an alerts or alert-groups request with the tenant's
/// `filter` added to the client's (Alertmanager ANDs them all).
pub fn with_filter(query: Option<&str>, tenant: &TenantAlerts<'_>) -> String {
    let mut out = form_urlencoded::Serializer::new(String::new());
    for (key, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        out.append_pair(&key, &value);
    }
    out.append_pair("filter", &tenant.filter());
    out.finish()
}

/// A silence id as Alertmanager makes them (a UUID): it goes into an
/// upstream path, so nothing else is accepted.
pub fn check_silence_id(id: &str) -> Result<(), ProxyError> {
    let fits =
        (1..=64).contains(&id.len()) && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    match fits {
        true => Ok(()),
        false => Err(ProxyError::BadData(
            "a silence id is letters, digits and '-' only".into(),
        )),
    }
}

/// Checks a posted silence and writes it again: matchers on the tenant
/// label must pin it to owned values; with none, the pin is added.
pub fn rewrite_silence(
    body: &[u8],
    tenant: &TenantAlerts<'_>,
) -> Result<PostableSilence, ProxyError> {
    let mut silence: PostableSilence = serde_json::from_slice(body)
        .map_err(|e| ProxyError::BadData(format!("cannot read the silence: {e}")))?;
    if let Some(id) = &silence.id {
        check_silence_id(id)?;
    }
    let on_label: Vec<&Matcher> = silence
        .matchers
        .iter()
        .filter(|m| m.name == tenant.label)
        .collect();
    if on_label.is_empty() {
        silence.matchers.push(tenant.pin());
    } else if !on_label.iter().all(|m| tenant.pins(m)) {
        return Err(ProxyError::Foreign(format!(
            "a silence may only match {} = one of this tenant's values",
            tenant.label
        )));
    }
    Ok(silence)
}

/// Whether a `gettableSilence` (from Alertmanager) is the tenant's.
pub fn silence_is_owned(body: &[u8], tenant: &TenantAlerts<'_>) -> Result<bool, ProxyError> {
    let silence: Value = serde_json::from_slice(body).map_err(|e| unfilterable(e.to_string()))?;
    Ok(owned_silence(&silence, tenant))
}

fn owned_silence(silence: &Value, tenant: &TenantAlerts<'_>) -> bool {
    let matchers: Vec<Matcher> = silence
        .get("matchers")
        .and_then(|m| serde_json::from_value(m.clone()).ok())
        .unwrap_or_default();
    tenant.owns_silence(&matchers)
}

/// Which answer is filtered, and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AnswerFilter {
    /// `[gettableAlert]`: the tenant's only.
    Alerts,
    /// `[alertGroup]`: the tenant's alerts of each group; empty groups go.
    AlertGroups,
    /// `[gettableSilence]`: the tenant's only.
    Silences,
    /// `alertmanagerStatus`: the configuration as the tenant is shown it.
    Status,
}

/// Filters a successful answer. One that cannot be read is refused (502),
/// never passed through.
pub fn filter_answer(
    bytes: &[u8],
    filter: AnswerFilter,
    tenant: &TenantAlerts<'_>,
) -> Result<Bytes, ProxyError> {
    let mut doc: Value = serde_json::from_slice(bytes).map_err(|e| unfilterable(e.to_string()))?;
    match filter {
        AnswerFilter::Alerts => list(&mut doc)?.retain(|a| tenant.owns_alert(a)),
        AnswerFilter::AlertGroups => {
            let groups = list(&mut doc)?;
            for group in groups.iter_mut() {
                let alerts = group
                    .get_mut("alerts")
                    .and_then(Value::as_array_mut)
                    .ok_or_else(|| unfilterable("a group without alerts".into()))?;
                alerts.retain(|a| tenant.owns_alert(a));
            }
            groups.retain(|g| g["alerts"].as_array().is_some_and(|a| !a.is_empty()));
        }
        AnswerFilter::Silences => list(&mut doc)?.retain(|s| owned_silence(s, tenant)),
        AnswerFilter::Status => {
            let config = doc
                .get_mut("config")
                .and_then(Value::as_object_mut)
                .ok_or_else(|| unfilterable("a status without config".into()))?;
            // Receivers' URLs, keys and passwords of every tenant: the
            // tenant's routes and receivers' names in their place.
            let original = config.get("original").and_then(Value::as_str).unwrap_or("");
            let shown = routing::tenant_configuration(original, tenant);
            config.insert("original".into(), Value::String(shown));
        }
    }
    Ok(Bytes::from(doc.to_string()))
}

fn list(doc: &mut Value) -> Result<&mut Vec<Value>, ProxyError> {
    doc.as_array_mut()
        .ok_or_else(|| unfilterable("not a list".into()))
}

fn unfilterable(why: String) -> ProxyError {
    ProxyError::UpstreamUnavailable(format!("cannot filter the Alertmanager answer: {why}").into())
}

#[cfg(test)]
mod tests;
