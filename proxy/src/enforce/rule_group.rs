//! Label mode: a rule group a tenant posts to Loki's ruler.
//!
//! Loki evaluates the group as the tenant, but what it makes leaves Loki:
//! a recording rule's series are remote-written to the metrics backend,
//! an alert goes to the Alertmanager, and in label mode both are scoped by
//! the tenant label. A rule's result can carry that label with any value
//! (`label_format namespace="team-b"`, or a stream label the tenant pushed
//! itself), so without this a tenant could write series into another
//! tenant's Prometheus data, or raise alerts in its view and on its pager.
//!
//! A rule's own `labels` override the labels of its result (the rules
//! engine of Prometheus, which Loki's ruler runs, sets them last), so every
//! rule gets the tenant label there, under the remote-write policy
//! (`metrics.foreign_label`): none → the tenant's first value; an owned
//! value written literally → kept; anything else (another tenant's value,
//! a template such as `{{ $labels.namespace }}`) → overwritten, or refused.
//!
//! The group is parsed strictly and written again from what was checked:
//! Loki's YAML decoder (gopkg.in/yaml.v3) resolves anchors, aliases and
//! merge keys (`<<`) its own way, so forwarding the client's bytes could
//! mean other labels to Loki than the ones checked here.

use std::collections::BTreeMap;

use serde::de::{Error as _, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use super::tenant_label::{decide, Decision, ForeignLabel, Found, TenantLabel};

mod expansion;

/// `rulefmt.RuleGroup`, as Loki's ruler API decodes it (name, interval,
/// query_offset, limit, rules), and the group-level `labels` of newer
/// Prometheus rule files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleGroup {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query_offset: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    #[serde(
        default,
        deserialize_with = "unique_keys",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub labels: BTreeMap<String, String>,
    pub rules: Vec<Rule>,
}

/// `rulefmt.RuleNode`: an alerting or a recording rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alert: Option<String>,
    pub expr: String,
    #[serde(default, rename = "for", skip_serializing_if = "Option::is_none")]
    pub for_duration: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_firing_for: Option<String>,
    #[serde(
        default,
        deserialize_with = "unique_keys",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub labels: BTreeMap<String, String>,
    #[serde(
        default,
        deserialize_with = "unique_keys",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub annotations: BTreeMap<String, String>,
}

/// A map of strings whose keys are unique, as Loki's decoder demands
/// (yaml.v3 refuses a key defined twice, where a map here would keep one).
fn unique_keys<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    struct Unique;
    impl<'de> Visitor<'de> for Unique {
        type Value = BTreeMap<String, String>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a map of strings")
        }

        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(BTreeMap::new())
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut unique = BTreeMap::new();
            while let Some((key, value)) = map.next_entry::<String, String>()? {
                if unique.contains_key(&key) {
                    return Err(A::Error::custom(format!("{key:?} is defined twice")));
                }
                unique.insert(key, value);
            }
            Ok(unique)
        }
    }
    d.deserialize_map(Unique)
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RuleGroupError {
    #[error("cannot read the rule group: {0}")]
    Unreadable(String),
    #[error(transparent)]
    ForeignLabel(#[from] ForeignLabel),
    /// Header mode: a federated group naming another tenant.
    #[error("a rule group may read only this tenant's data; source_tenants names another")]
    ForeignSourceTenant,
}

/// What pinning did to a group, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pinned {
    /// Rules (and group `labels`) that had no tenant label.
    pub added: u64,
    /// Those whose value was not an owned one written literally.
    pub overwritten: u64,
}

/// The rule group to forward, every rule's `labels` pinning the tenant
/// label: the YAML it is written as, and what was pinned.
pub fn rewrite(body: &[u8], tenant: &TenantLabel<'_>) -> Result<(String, Pinned), RuleGroupError> {
    expansion::check(body).map_err(RuleGroupError::Unreadable)?;
    let mut group: RuleGroup =
        serde_yaml_ng::from_slice(body).map_err(|e| RuleGroupError::Unreadable(e.to_string()))?;
    let name = group.name.clone();
    let mut pinned = Pinned::default();
    // Rule labels win over the group's, but a reader that applied only
    // the group's must not find another tenant's value there either.
    if group.labels.contains_key(tenant.name) {
        pin(&mut group.labels, tenant, &mut pinned, || {
            format!("rule group {name:?}")
        })?;
    }
    for rule in &mut group.rules {
        let rule_name = rule.alert.as_ref().or(rule.record.as_ref()).cloned();
        pin(&mut rule.labels, tenant, &mut pinned, || {
            format!("rule {:?} of group {name:?}", rule_name.unwrap_or_default())
        })?;
    }
    let yaml =
        serde_yaml_ng::to_string(&group).map_err(|e| RuleGroupError::Unreadable(e.to_string()))?;
    Ok((yaml, pinned))
}

/// Header mode (Mimir, Cortex): a posted rule group may carry
/// `source_tenants`, the tenants a federated group's rules query. Mimir
/// takes any list once `-ruler.tenant-federation.enabled` is set, trusting
/// the gateway to have checked it: only the tenant's own id passes here.
///
/// Returns the group to forward, written again from what was checked, as
/// in label mode: Mimir's decoder (gopkg.in/yaml.v3) then reads the
/// YAML this one wrote, with anchors and aliases already resolved and no
/// construct the two decoders might read apart. What neither writing can
/// carry alike is refused: merge keys (`<<`, which Go's decoder applies
/// and this one keeps as a plain key) and tags. Fields are kept as sent,
/// unknown ones too (Mimir's own fields change between releases).
pub fn federated(body: &[u8], tenant_id: &str) -> Result<String, RuleGroupError> {
    use serde_yaml_ng::Value;
    expansion::check(body).map_err(RuleGroupError::Unreadable)?;
    let group: Value =
        serde_yaml_ng::from_slice(body).map_err(|e| RuleGroupError::Unreadable(e.to_string()))?;
    fn plain(value: &Value) -> Result<(), RuleGroupError> {
        match value {
            Value::Tagged(_) => Err(RuleGroupError::Unreadable("a YAML tag".into())),
            Value::Sequence(items) => items.iter().try_for_each(plain),
            Value::Mapping(map) => map.iter().try_for_each(|(key, value)| {
                if key.as_str() == Some("<<") {
                    return Err(RuleGroupError::Unreadable("a YAML merge key `<<`".into()));
                }
                plain(key).and_then(|()| plain(value))
            }),
            _ => Ok(()),
        }
    }
    if !group.is_mapping() {
        return Err(RuleGroupError::Unreadable(
            "a rule group is a mapping (name, rules, …)".into(),
        ));
    }
    plain(&group)?;
    match group.get("source_tenants") {
        None | Some(Value::Null) => {}
        Some(Value::Sequence(sources)) => {
            if !sources.iter().all(|s| s.as_str() == Some(tenant_id)) {
                return Err(RuleGroupError::ForeignSourceTenant);
            }
        }
        Some(_) => {
            return Err(RuleGroupError::Unreadable(
                "source_tenants is not a list".into(),
            ))
        }
    }
    serde_yaml_ng::to_string(&group).map_err(|e| RuleGroupError::Unreadable(e.to_string()))
}

/// Sets the tenant label in `labels` as the policy decides, and counts it.
fn pin(
    labels: &mut BTreeMap<String, String>,
    tenant: &TenantLabel<'_>,
    pinned: &mut Pinned,
    describe: impl FnOnce() -> String,
) -> Result<(), ForeignLabel> {
    let found = labels
        .get(tenant.name)
        .map_or(Found::Nothing, |value| Found::Same(value.as_bytes()));
    let count = match decide(found, tenant, describe)? {
        Decision::Keep(_) => return Ok(()),
        Decision::Add => &mut pinned.added,
        Decision::Overwrite => &mut pinned.overwritten,
    };
    *count += 1;
    let value = String::from_utf8_lossy(tenant.default_value()).into_owned();
    labels.insert(tenant.name.to_owned(), value);
    Ok(())
}

#[cfg(test)]
mod tests;
