//! Path normalisation is idempotent and yields an absolute path. Under
//! every metrics scoping, a normalised path is routed only to a route whose
//! pattern it fills and whose methods hold the request's, so the route
//! checked is the one the forwarded path means; a 405 names only methods
//! that path is routed for, never the one refused.
#![no_main]

use std::sync::OnceLock;

use http::Method;
use libfuzzer_sys::fuzz_target;
use tenant_proxy::config::MetricsScoping;
use tenant_proxy::http::error::ProxyError;
use tenant_proxy::http::path::normalise;
use tenant_proxy::routes::RouteTable;

/// No metrics section, and each way of scoping one; logs and alerts on.
fn tables() -> &'static [RouteTable] {
    static TABLES: OnceLock<Vec<RouteTable>> = OnceLock::new();
    TABLES.get_or_init(|| {
        [
            None,
            Some(MetricsScoping::Label),
            Some(MetricsScoping::HeaderScopesEveryApi),
            Some(MetricsScoping::HeaderScopesQueries),
        ]
        .into_iter()
        .map(|metrics| RouteTable::new(true, metrics, true))
        .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(raw) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(path) = normalise(raw) else {
        return;
    };
    assert!(path.starts_with('/'), "{raw:?} -> {path:?}");
    assert_eq!(normalise(&path).as_deref(), Ok(path.as_str()), "{raw:?}");
    for table in tables() {
        for method in [Method::GET, Method::POST, Method::PUT, Method::DELETE] {
            match table.classify(&method, &path) {
                Ok(route) => {
                    assert!(route.methods.contains(&method), "{method} {path}");
                    assert!(route.matches_path(&path), "{path} in {}", route.pattern);
                }
                Err(ProxyError::MethodNotAllowed { allow }) => {
                    assert!(
                        !allow.is_empty() && !allow.contains(&method),
                        "{method} {path}"
                    );
                    for other in &allow {
                        assert!(table.classify(other, &path).is_ok(), "{other} {path}");
                    }
                }
                Err(ProxyError::RouteNotFound) => {}
                Err(other) => panic!("{method} {path}: {other}"),
            }
        }
    }
});
