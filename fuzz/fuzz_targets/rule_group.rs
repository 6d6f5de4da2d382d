//! Rule groups posted through the proxy: Loki's rewritten in label mode,
//! Mimir's `source_tenants` checked in header mode.
//!
//! Invariants, for every body (the first byte picks the policy and which
//! check runs, the rest is the body):
//! - label mode: the body is refused, or what is forwarded reads back, as
//!   the typed group and as plain YAML (a second, untyped reading), with
//!   every rule's `namespace` label an owned value and any group-level one
//!   too; every other field as the body had it; under `reject` no value
//!   the body set is changed; the counts of pinned rules add up to the
//!   rules that came without an owned value; and rewriting what is
//!   forwarded changes and counts nothing (one reading, one spelling);
//! - header mode: a body that passes is forwarded as YAML that reads
//!   back as the same group the body is, naming no source tenant but the
//!   caller's, and is its own forwarded form (no spelling left to read
//!   apart).
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_yaml_ng::Value;
use tenant_proxy::config::ForeignLabelPolicy;
use tenant_proxy::enforce::rule_group::{federated, rewrite, Pinned, RuleGroup};
use tenant_proxy::enforce::tenant_label::TenantLabel;

fn namespace_of(labels: &Value) -> Option<&str> {
    labels.get("namespace").and_then(Value::as_str)
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, body)) = data.split_first() else {
        return;
    };
    let owned = vec!["team-a".to_string(), "team-a-2".to_string()];
    if mode & 2 != 0 {
        if let Ok(text) = federated(body, "team-a") {
            let sent: Value = serde_yaml_ng::from_slice(body).unwrap();
            let group: Value = serde_yaml_ng::from_str(&text).unwrap();
            assert_eq!(group, sent, "{text}");
            if let Some(Value::Sequence(sources)) = group.get("source_tenants") {
                assert!(
                    sources.iter().all(|s| s.as_str() == Some("team-a")),
                    "{sources:?}"
                );
            }
            assert_eq!(federated(text.as_bytes(), "team-a").as_ref(), Ok(&text));
        }
        return;
    }
    let policy = match mode & 1 {
        0 => ForeignLabelPolicy::Overwrite,
        _ => ForeignLabelPolicy::Reject,
    };
    let tenant = TenantLabel {
        name: "namespace",
        owned: &owned,
        owned_by: "team-a",
        policy,
    };
    let Ok((text, pinned)) = rewrite(body, &tenant) else {
        return;
    };
    let sent: RuleGroup = serde_yaml_ng::from_slice(body).unwrap();
    let forwarded: RuleGroup = serde_yaml_ng::from_str(&text).unwrap();
    let plain: Value = serde_yaml_ng::from_str(&text).unwrap();
    let owns = |v: Option<&str>| v.is_some_and(|v| owned.iter().any(|o| o == v));
    assert_eq!(forwarded.rules.len(), sent.rules.len());
    let mut unpinned = 0;
    for (i, (out, came)) in forwarded.rules.iter().zip(&sent.rules).enumerate() {
        assert!(
            owns(out.labels.get("namespace").map(String::as_str)),
            "{text}"
        );
        assert!(owns(namespace_of(&plain["rules"][i]["labels"])), "{text}");
        let mut others = out.clone();
        others.labels.remove("namespace");
        let mut came_others = came.clone();
        let came_value = came_others.labels.remove("namespace");
        unpinned += u64::from(!owns(came_value.as_deref()));
        assert_eq!(others, came_others, "{text}");
        if policy == ForeignLabelPolicy::Reject {
            if let Some(value) = came_value {
                assert_eq!(out.labels["namespace"], value, "{text}");
            }
        }
    }
    if let Some(value) = forwarded.labels.get("namespace") {
        assert!(
            owns(Some(value)) && owns(namespace_of(&plain["labels"])),
            "{text}"
        );
        unpinned += u64::from(!owns(sent.labels.get("namespace").map(String::as_str)));
    }
    assert_eq!(pinned.added + pinned.overwritten, unpinned, "{text}");
    if policy == ForeignLabelPolicy::Reject {
        assert_eq!(pinned.overwritten, 0, "{text}");
    }
    let without_namespace = |g: &RuleGroup| {
        let mut labels = g.labels.clone();
        labels.remove("namespace");
        (
            g.name.clone(),
            g.interval.clone(),
            g.query_offset.clone(),
            g.limit,
            labels,
        )
    };
    assert_eq!(
        without_namespace(&forwarded),
        without_namespace(&sent),
        "{text}"
    );
    assert_eq!(
        rewrite(text.as_bytes(), &tenant),
        Ok((text.clone(), Pinned::default()))
    );
});
