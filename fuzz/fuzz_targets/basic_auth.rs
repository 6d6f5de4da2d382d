//! Any Authorization header. Invariant: the proxy's reading (as bytes, with
//! its own scan for the scheme and the colon) accepts exactly the headers
//! a plain reading accepts (the value as text, the scheme before the first
//! space compared without case, the rest trimmed and base64-decoded to
//! UTF-8 holding a colon), and takes the same username from them: the text
//! before the first colon, never one with a colon in it. So the user the
//! proxy looks up is the user the header names, however it is written.
#![no_main]

use base64::Engine;
use libfuzzer_sys::fuzz_target;
use tenant_proxy::auth::parse_basic;

/// The plain reading: the username, or `None` for a refusal.
fn username_read_plainly(value: &http::HeaderValue) -> Option<String> {
    let (scheme, encoded) = value.to_str().ok()?.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (username, _password) = decoded.split_once(':')?;
    Some(username.to_owned())
}

fuzz_target!(|data: &[u8]| {
    let Ok(value) = http::HeaderValue::from_bytes(data) else {
        return;
    };
    let mut headers = http::HeaderMap::new();
    headers.insert(http::header::AUTHORIZATION, value.clone());
    let proxy = parse_basic(&headers).ok();
    let proxy = proxy.as_ref().map(|credentials| credentials.username());
    assert_eq!(proxy, username_read_plainly(&value).as_deref());
    assert!(!proxy.is_some_and(|username| username.contains(':')));
});
