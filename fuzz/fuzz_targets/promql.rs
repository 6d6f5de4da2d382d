//! PromQL and series selectors: enforced or refused, never a panic (the
//! parser is bounded first), and an enforced query is a fixed point:
//! enforcing it again changes nothing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tenant_proxy::enforce::promql::{enforce_query, enforce_selector, TenantMatcher};

fuzz_target!(|data: &[u8]| {
    // libfuzzer-sys aborts on any panic, even one the proxy catches:
    // promql::parse turns promql-parser's panics into parse errors on
    // purpose. Back to the default hook (which only prints); a panic that
    // escapes the target still aborts (libfuzzer-sys's catch_unwind).
    static DEFAULT_HOOK: std::sync::Once = std::sync::Once::new();
    DEFAULT_HOOK.call_once(|| drop(std::panic::take_hook()));
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let tenants = [
        TenantMatcher::new("namespace", &["team-a".into()]).unwrap(),
        TenantMatcher::new("namespace", &["team-a".into(), "team.a+2".into()]).unwrap(),
    ];
    for tenant in &tenants {
        if let Ok(enforced) = enforce_query(text, tenant) {
            assert_eq!(enforce_query(&enforced, tenant).as_deref(), Ok(enforced.as_str()), "{text:?}");
        }
        if let Ok(enforced) = enforce_selector(text, tenant) {
            assert_eq!(enforce_selector(&enforced, tenant).as_deref(), Ok(enforced.as_str()), "{text:?}");
        }
    }
});
