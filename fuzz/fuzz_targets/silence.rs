//! Silences posted through label mode's Alertmanager API.
//!
//! Invariants (issue #17), for every body:
//! - it is refused, or the silence forwarded pins the tenant label to owned
//!   values (so it is listed back to its tenant);
//! - under Alertmanager's own reading of the forwarded matchers (equality,
//!   or a regex anchored at both ends; `isEqual: false` negates), it can
//!   silence no alert whose tenant label is absent or not an owned value;
//! - what is forwarded reads back as the same silence (one spelling of each
//!   field, nothing else).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tenant_proxy::enforce::alertmanager::{
    rewrite_silence, Matcher, PostableSilence, TenantAlerts,
};

fn matches(m: &Matcher, value: &str) -> bool {
    let hit = if m.is_regex {
        regex::Regex::new(&format!("^(?:{})$", m.value)).is_ok_and(|r| r.is_match(value))
    } else {
        value == m.value
    };
    hit == m.is_equal
}

fuzz_target!(|data: &[u8]| {
    let owned = vec!["team-a".to_string(), "team-a-2".to_string()];
    let tenant = TenantAlerts {
        label: "namespace",
        owned: &owned,
    };
    let Ok(silence) = rewrite_silence(data, &tenant) else {
        return;
    };
    assert!(tenant.owns_silence(&silence.matchers), "{silence:?}");
    let on_label: Vec<&Matcher> = silence
        .matchers
        .iter()
        .filter(|m| m.name == "namespace")
        .collect();
    for foreign in [
        "",
        "team-b",
        "team-a-3",
        "TEAM-A",
        "team-a|team-b",
        "x\nteam-a",
    ] {
        let silenced = on_label.iter().all(|m| matches(m, foreign));
        assert!(!silenced, "{silence:?} silences namespace={foreign:?}");
    }
    let forwarded = serde_json::to_vec(&silence).unwrap();
    let again: PostableSilence = serde_json::from_slice(&forwarded).unwrap();
    assert_eq!(again, silence);
});
