//! Any Authorization header: parsed or refused, never a panic, never a
//! username with a colon.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tenant_proxy::auth::parse_basic;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = http::HeaderValue::from_bytes(data) else {
        return;
    };
    let mut headers = http::HeaderMap::new();
    headers.insert(http::header::AUTHORIZATION, value);
    if let Ok(credentials) = parse_basic(&headers) {
        assert!(!credentials.username().contains(':'));
    }
});
