//! URL and form parameters: parsed once or refused; what the proxy
//! re-encodes parses back to the same parameters. And a `rules` query sent
//! on unpaged: it holds the query's pairs, in order, less the paging ones,
//! written only in bytes every query reader (Go's included) decodes alike.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tenant_proxy::enforce::params::Params;
use tenant_proxy::enforce::prometheus::unpaged_rules_query;

const PAGING: [&str; 2] = ["group_limit", "group_next_token"];

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

    let unpaged = unpaged_rules_query(Some(query)).unwrap_or_default();
    let plain = |b: u8| b.is_ascii_alphanumeric() || b"*-._+%=&".contains(&b);
    assert!(unpaged.bytes().all(plain), "{unpaged:?}");
    let pairs = |text: &str| -> Vec<(String, String)> {
        form_urlencoded::parse(text.as_bytes())
            .into_owned()
            .collect()
    };
    let kept: Vec<_> = (pairs(query).into_iter())
        .filter(|(key, _)| !PAGING.contains(&key.as_str()))
        .collect();
    assert_eq!(pairs(&unpaged), kept);
});
