//! Path normalisation is idempotent and classification never panics: what
//! is checked is what is forwarded.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tenant_proxy::config::MetricsMode;
use tenant_proxy::http::path::normalise;
use tenant_proxy::routes::RouteTable;

fuzz_target!(|data: &[u8]| {
    let Ok(raw) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(path) = normalise(raw) else {
        return;
    };
    assert!(path.starts_with('/'), "{raw:?} -> {path:?}");
    assert_eq!(normalise(&path).as_deref(), Ok(path.as_str()), "{raw:?}");
    for mode in [MetricsMode::Label, MetricsMode::Header] {
        let table = RouteTable::new(true, Some(mode), true);
        for method in [http::Method::GET, http::Method::POST] {
            let _ = table.classify(&method, &path);
        }
    }
});
