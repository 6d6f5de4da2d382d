//! Alertmanager's routing tree as label mode shows it to a tenant
//! (`enforce::alertmanager::routing`), read from any configuration text.
//!
//! Invariants, for every text and tenant (the first byte picks one):
//! - what the tenant is shown holds only the keys a tenant may see (the
//!   route tree's selecting and grouping fields, receivers by name, named
//!   time intervals): no global settings, templates, inhibit rules or
//!   receiver settings;
//! - every matcher on the tenant label in it names only the tenant's
//!   values: an equality on an owned value, or a regex matching owned
//!   values and none of a list of others; no `match`/`match_re` on it;
//! - its receivers are receivers of the configuration, the root's among
//!   them, and the receivers list (`…/receivers`) names exactly those;
//! - shown again, it is shown as itself.

#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_yaml_ng::Value;
use tenant_proxy::enforce::alertmanager::{
    closing_quote, go_unquote, tenant_configuration, tenant_receivers, TenantAlerts,
};

#[derive(serde::Deserialize)]
struct Original {
    route: OriginalRoute,
    #[serde(default)]
    receivers: Vec<OriginalReceiver>,
}

#[derive(serde::Deserialize)]
struct OriginalRoute {
    #[serde(default)]
    receiver: Option<String>,
}

#[derive(serde::Deserialize)]
struct OriginalReceiver {
    name: String,
}

const TENANTS: [&[&str]; 3] = [
    &["team-a", "team-a-2"],
    &["team-b"],
    &["a.b", "c|d", "x\"y"],
];

/// Values no tenant above owns, some close to owned ones.
const OTHERS: [&str; 10] = [
    "",
    "team-c",
    "team-a-3",
    "TEAM-A",
    "a",
    "axb",
    "c",
    "d",
    "x",
    "team-a|team-b",
];

const ROUTE_KEYS: [&str; 12] = [
    "receiver",
    "group_by",
    "continue",
    "group_wait",
    "group_interval",
    "repeat_interval",
    "match",
    "match_re",
    "matchers",
    "mute_time_intervals",
    "active_time_intervals",
    "routes",
];

/// The label name a matcher's text starts with, read the way Alertmanager
/// prints one (bare, or Go-quoted).
fn name_of(text: &str) -> Option<String> {
    if text.starts_with('"') {
        return go_unquote(&text[..=closing_quote(text)?]);
    }
    text.find(['=', '!']).map(|end| text[..end].to_owned())
}

fn check_pin(text: &str, owned: &[&str]) {
    if let Some(value) = text.strip_prefix("namespace=\"") {
        let value = go_unquote(&format!("\"{value}")).expect(text);
        assert!(owned.contains(&value.as_str()), "{text} names {value:?}");
        return;
    }
    let value = text.strip_prefix("namespace=~").expect(text);
    let regex = go_unquote(value).expect(text);
    let anchored = regex::Regex::new(&format!("^(?:{regex})$")).expect(text);
    assert!(owned.iter().any(|v| anchored.is_match(v)), "{text}");
    for other in OTHERS.iter().chain(TENANTS.iter().flat_map(|t| t.iter())) {
        if !owned.contains(other) {
            assert!(!anchored.is_match(other), "{text} matches {other:?}");
        }
    }
}

fn check_route(route: &Value, owned: &[&str], receivers: &mut Vec<String>) {
    let map = route.as_mapping().expect("a route is a mapping");
    for key in map.keys() {
        assert!(ROUTE_KEYS.contains(&key.as_str().unwrap()), "{key:?}");
    }
    for key in ["match", "match_re"] {
        if let Some(m) = map.get(key) {
            assert!(m.get("namespace").is_none(), "{key} on the label: {m:?}");
        }
    }
    for text in map
        .get("matchers")
        .and_then(Value::as_sequence)
        .into_iter()
        .flatten()
    {
        let text = text.as_str().unwrap();
        if name_of(text).as_deref() == Some("namespace") {
            check_pin(text, owned);
        }
    }
    if let Some(r) = map.get("receiver").and_then(Value::as_str) {
        receivers.push(r.to_owned());
    }
    for child in map
        .get("routes")
        .and_then(Value::as_sequence)
        .into_iter()
        .flatten()
    {
        check_route(child, owned, receivers);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let owned_values = TENANTS[usize::from(pick) % TENANTS.len()];
    let owned: Vec<String> = owned_values.iter().map(|v| (*v).to_owned()).collect();
    let tenant = TenantAlerts {
        label: "namespace",
        owned: &owned,
    };
    let shown = tenant_configuration(text, &tenant);
    let status = serde_json::json!({"config": {"original": text}}).to_string();
    let listed = tenant_receivers(status.as_bytes(), &tenant);
    if shown.is_empty() {
        return;
    }
    let doc: Value = serde_yaml_ng::from_str(&shown).expect("what is shown is YAML");
    let top = doc.as_mapping().unwrap();
    for key in top.keys() {
        let key = key.as_str().unwrap();
        let allowed = [
            "route",
            "receivers",
            "time_intervals",
            "mute_time_intervals",
        ];
        assert!(allowed.contains(&key), "{key} shown:\n{shown}");
    }
    let mut named = Vec::new();
    check_route(&doc["route"], owned_values, &mut named);
    // Read as the proxy reads it (typed: other keys, repeated or not, are
    // not looked at).
    let original: Original = serde_yaml_ng::from_str(text).expect("read by the proxy");
    let configured: Vec<&str> = original.receivers.iter().map(|r| r.name.as_str()).collect();
    let shown_receivers: Vec<String> = (doc["receivers"].as_sequence().into_iter().flatten())
        .map(|r| {
            let r = r.as_mapping().unwrap();
            assert_eq!(r.len(), 1, "a receiver shown beyond its name: {r:?}");
            r.get("name").and_then(Value::as_str).unwrap().to_owned()
        })
        .collect();
    for r in &shown_receivers {
        assert!(configured.contains(&r.as_str()), "{r} is not configured");
    }
    if let Some(root) = original.route.receiver.as_deref() {
        if configured.contains(&root) {
            assert!(shown_receivers.iter().any(|r| r == root), "{shown}");
        }
    }
    for r in &named {
        if configured.contains(&r.as_str()) {
            assert!(shown_receivers.contains(r), "{r} routed to, not shown");
        }
    }
    let listed: Vec<serde_json::Value> = serde_json::from_slice(&listed.unwrap()).unwrap();
    let listed: Vec<&str> = listed.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(
        listed, shown_receivers,
        "receivers list and status disagree"
    );
    assert_eq!(tenant_configuration(&shown, &tenant), shown, "shown again");
});
