//! Reading `Authorization: Basic`: the header's bytes to a username and a
//! password, and nothing more (the authenticator checks them: `mod.rs`).

use std::fmt;

use base64::Engine;
use http::{header, HeaderMap};

use super::failure::AuthFailure;

/// What a client presented: the decoded `user:password`, split at the
/// first `:`. `Debug` never prints the password.
pub struct BasicCredentials {
    /// Read directly by the authenticator's cache digest, one update.
    pub(super) decoded: String,
    pub(super) colon: usize,
}

impl BasicCredentials {
    pub fn username(&self) -> &str {
        &self.decoded[..self.colon]
    }

    pub(super) fn password(&self) -> &str {
        &self.decoded[self.colon + 1..]
    }
}

impl fmt::Debug for BasicCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BasicCredentials")
            .field("username", &self.username())
            .field("password", &"**REDACTED**")
            .finish()
    }
}

/// Reads `Authorization: Basic base64(user:password)`. Exactly one header.
pub fn parse_basic(headers: &HeaderMap) -> Result<BasicCredentials, AuthFailure> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let value = values.next().ok_or(AuthFailure::MissingHeader)?;
    if values.next().is_some() {
        return Err(AuthFailure::MalformedHeader);
    }
    // Read as bytes: what is not visible ASCII fails the scheme's
    // comparison or the base64 alphabet all the same, and a searcher set up
    // per `split_once`/`find` cost more than the scan (callgrind).
    let value = value.as_bytes();
    let space = value
        .iter()
        .position(|&b| b == b' ')
        .ok_or(AuthFailure::MalformedHeader)?;
    let (scheme, encoded) = (&value[..space], &value[space + 1..]);
    if !scheme.eq_ignore_ascii_case(b"basic") {
        return Err(AuthFailure::MalformedHeader);
    }
    let decoded = decode(encoded.trim_ascii())?;
    let decoded = String::from_utf8(decoded).map_err(|_| AuthFailure::MalformedHeader)?;
    // RFC 7617: the user-id ends at the first ':'; the password may contain ':'.
    let colon = decoded
        .bytes()
        .position(|b| b == b':')
        .ok_or(AuthFailure::MalformedHeader)?;
    Ok(BasicCredentials { decoded, colon })
}

/// Standard base64, padded. A credential of usual length is decoded on
/// the stack and copied out: `Engine::decode` asks for zeroed memory, a
/// `calloc` that cost more than the decoding (callgrind,
/// docs/benchmarks.md). A longer one is decoded as before.
fn decode(encoded: &[u8]) -> Result<Vec<u8>, AuthFailure> {
    use base64::DecodeSliceError;
    let engine = &base64::engine::general_purpose::STANDARD;
    let mut room = [0; 192];
    match engine.decode_slice(encoded, &mut room) {
        Ok(len) => Ok(room[..len].to_vec()),
        Err(DecodeSliceError::OutputSliceTooSmall) => engine
            .decode(encoded)
            .map_err(|_| AuthFailure::MalformedHeader),
        Err(DecodeSliceError::DecodeError(_)) => Err(AuthFailure::MalformedHeader),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use http::HeaderValue;
    use proptest::strategy::Strategy;

    /// The header a client sends for `user` and `pass`.
    pub(in crate::auth) fn basic(user: &str, pass: &str) -> HeaderMap {
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Basic {token}")).unwrap(),
        );
        h
    }

    /// `parse_basic` as it read the header before, as text: the reference
    /// for reading it as bytes.
    fn parse_basic_as_text(value: &HeaderValue) -> Result<(String, usize), AuthFailure> {
        let value = value.to_str().map_err(|_| AuthFailure::MalformedHeader)?;
        let (scheme, encoded) = value.split_once(' ').ok_or(AuthFailure::MalformedHeader)?;
        if !scheme.eq_ignore_ascii_case("basic") {
            return Err(AuthFailure::MalformedHeader);
        }
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .map_err(|_| AuthFailure::MalformedHeader)?;
        let decoded = String::from_utf8(decoded).map_err(|_| AuthFailure::MalformedHeader)?;
        let colon = decoded.find(':').ok_or(AuthFailure::MalformedHeader)?;
        Ok((decoded, colon))
    }

    proptest::proptest! {
        #[test]
        fn reading_the_header_as_bytes_agrees_with_reading_it_as_text(
            scheme in proptest::prop_oneof![
                proptest::strategy::Just("Basic".to_owned()),
                proptest::strategy::Just("bASIC".to_owned()),
                "[BbAaSsIiCcx\u{e9}]{0,6}",
            ],
            gap in "[ \t]{0,2}",
            secret in proptest::prop_oneof![
                proptest::collection::vec(proptest::num::u8::ANY, 0..12),
                "[a:\u{e9}]{0,8}".prop_map(String::into_bytes),
            ],
            pad in "[ \t=]{0,2}",
            junk in proptest::collection::vec(proptest::num::u8::ANY, 0..2),
        ) {
            let mut raw = scheme.into_bytes();
            raw.extend(gap.bytes());
            raw.extend(base64::engine::general_purpose::STANDARD.encode(&secret).bytes());
            raw.extend(pad.bytes());
            raw.extend(junk);
            if let Ok(value) = HeaderValue::from_bytes(&raw) {
                let mut headers = HeaderMap::new();
                headers.insert(header::AUTHORIZATION, value.clone());
                let as_bytes = parse_basic(&headers).map(|c| (c.decoded.clone(), c.colon));
                proptest::prop_assert_eq!(as_bytes, parse_basic_as_text(&value));
            }
        }
    }

    proptest::proptest! {
        /// On either side of the stack's room (192 bytes decoded), valid or
        /// not: what the engine's own `decode` gives.
        #[test]
        fn decoding_agrees_with_the_engine(
            secret in proptest::collection::vec(proptest::num::u8::ANY, 140..260),
            cut in 0usize..4,
            junk in "[A-Za-z0-9+/=]{0,3}",
        ) {
            let engine = &base64::engine::general_purpose::STANDARD;
            let mut text = engine.encode(&secret).into_bytes();
            text.truncate(text.len() - cut);
            text.extend(junk.bytes());
            proptest::prop_assert_eq!(decode(&text).ok(), engine.decode(&text).ok());
        }
    }

    #[test]
    fn parses_basic_with_colon_in_password() {
        let c = parse_basic(&basic("u", "p:w")).unwrap();
        assert_eq!((c.username(), c.password()), ("u", "p:w"));
        // Logged as who it is, never what proves it.
        let logged = format!("{c:?}");
        assert!(!logged.contains("p:w"), "{logged}");
        assert!(
            logged.contains(r#"username: "u""#) && logged.contains("REDACTED"),
            "{logged}"
        );
    }

    #[test]
    fn rejects_other_schemes_and_garbage() {
        let mut h = HeaderMap::new();
        assert_eq!(parse_basic(&h).unwrap_err(), AuthFailure::MissingHeader);
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer abc"),
        );
        assert_eq!(parse_basic(&h).unwrap_err(), AuthFailure::MalformedHeader);
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic !!!"));
        assert_eq!(parse_basic(&h).unwrap_err(), AuthFailure::MalformedHeader);
        let mut two = basic("u", "p");
        two.append(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic dTpw"),
        );
        assert_eq!(parse_basic(&two).unwrap_err(), AuthFailure::MalformedHeader);
    }
}
