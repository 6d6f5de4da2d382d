//! URL and form parameters: parsed once or refused; what the proxy
//! re-encodes parses back to the same parameters.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tenant_proxy::enforce::params::Params;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let split = rest.len() / 2;
    let (query, body) = rest.split_at(split);
    let Ok(query) = std::str::from_utf8(query) else {
        return;
    };
    let method = if selector % 2 == 0 {
        http::Method::GET
    } else {
        http::Method::POST
    };
    let mut headers = http::HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/x-www-form-urlencoded"),
    );
    if let Ok(params) = Params::from_request(&method, Some(query), &headers, body) {
        let encoded = params.encode();
        let again = Params::from_request(&http::Method::GET, Some(&encoded), &headers, b"")
            .expect("what the proxy encodes parses");
        assert_eq!(again, params);
    }
});
