//! Prometheus API parameters, parsed once and rebuilt whole.
//!
//! Prometheus reads parameters with Go's `FormValue`, which merges the URL
//! query and the body (body first) and also reads multipart bodies. A proxy
//! that enforces one place and forwards another leaks (peers did). So:
//! GET takes parameters from the URL only and must have no body; POST takes
//! them from an `application/x-www-form-urlencoded` body and the URL together,
//! and the forwarded request carries them in the body only. A key in both
//! places, or repeated (other than `match[]`), is refused as ambiguous.

use http::header::{self, HeaderMap};
use http::Method;

/// The one parameter that may legitimately repeat.
pub const MATCH: &str = "match[]";

/// The most parameters a request may carry, URL and body together: the
/// 1,000 `match[]` selectors `prometheus.rs` allows, and room for every
/// other parameter of the API. The checks for repeats and for keys in
/// both places compare each key with the ones before it, which a form of
/// 40,000 distinct keys (309 KB) made take 1.3 s; and each parameter is a
/// pair of strings held until the request is forwarded.
pub const MAX_PARAMS: usize = 1_100;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParamsError {
    #[error("a GET request must not have a body")]
    BodyOnGet,
    #[error("a POST body must be application/x-www-form-urlencoded")]
    NotAForm,
    #[error("compressed request bodies are not accepted")]
    Compressed,
    #[error("parameter {0:?} appears in both the URL and the body")]
    InUrlAndBody(String),
    #[error("parameter {0:?} appears more than once")]
    Repeated(String),
    #[error("more than {MAX_PARAMS} parameters")]
    TooMany,
}

/// Parameters in the order they came, URL first.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Params(Vec<(String, String)>);

impl Params {
    pub fn from_request(
        method: &Method,
        query: Option<&str>,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<Self, ParamsError> {
        let url = parse(query.unwrap_or_default().as_bytes(), MAX_PARAMS)?;
        let body = if body.is_empty() {
            Vec::new()
        } else if method == Method::GET {
            return Err(ParamsError::BodyOnGet);
        } else {
            check_form_headers(headers)?;
            parse(body, MAX_PARAMS - url.len())?
        };
        for (key, _) in &body {
            if url.iter().any(|(k, _)| k == key) {
                return Err(ParamsError::InUrlAndBody(key.clone()));
            }
        }
        let params = Params(url.into_iter().chain(body).collect());
        params.check_repeats()?;
        Ok(params)
    }

    fn check_repeats(&self) -> Result<(), ParamsError> {
        for (i, (key, _)) in self.0.iter().enumerate() {
            if key != MATCH && self.0[..i].iter().any(|(k, _)| k == key) {
                return Err(ParamsError::Repeated(key.clone()));
            }
        }
        Ok(())
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn values<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a str> {
        self.0
            .iter()
            .filter(move |(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn values_mut<'a>(&'a mut self, key: &'a str) -> impl Iterator<Item = &'a mut String> {
        self.0
            .iter_mut()
            .filter(move |(k, _)| k == key)
            .map(|(_, v)| v)
    }

    pub fn push(&mut self, key: &str, value: String) {
        self.0.push((key.to_owned(), value));
    }

    /// `application/x-www-form-urlencoded`, as a query string or a body.
    pub fn encode(&self) -> String {
        form_urlencoded::Serializer::new(String::new())
            .extend_pairs(&self.0)
            .finish()
    }
}

/// The pairs of a form, refused past `most` before any more is decoded.
fn parse(bytes: &[u8], most: usize) -> Result<Vec<(String, String)>, ParamsError> {
    let mut pairs = Vec::new();
    for (key, value) in form_urlencoded::parse(bytes) {
        if pairs.len() == most {
            return Err(ParamsError::TooMany);
        }
        pairs.push((key.into_owned(), value.into_owned()));
    }
    Ok(pairs)
}

fn check_form_headers(headers: &HeaderMap) -> Result<(), ParamsError> {
    if !crate::http::headers::identity_coded(headers) {
        return Err(ParamsError::Compressed);
    }
    let media_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(str::trim)
        .unwrap_or_default();
    if media_type.eq_ignore_ascii_case("application/x-www-form-urlencoded") {
        Ok(())
    } else {
        Err(ParamsError::NotAForm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn form() -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-www-form-urlencoded; charset=utf-8"),
        );
        h
    }

    /// At most [`MAX_PARAMS`] parameters, URL and body together; one more
    /// is refused, as is a form of tens of thousands of keys.
    #[test]
    fn parameters_are_bounded_in_number() {
        let keys = |from: usize, n: usize| -> String {
            (from..from + n).map(|i| format!("k{i}=v&")).collect()
        };
        let (url, body) = (keys(0, 100), keys(100, MAX_PARAMS - 100));
        let p = Params::from_request(&Method::POST, Some(&url), &form(), body.as_bytes());
        assert_eq!(p.unwrap().0.len(), MAX_PARAMS);
        let over = keys(100, MAX_PARAMS - 99);
        let p = Params::from_request(&Method::POST, Some(&url), &form(), over.as_bytes());
        assert_eq!(p, Err(ParamsError::TooMany));
        let url_over = keys(0, MAX_PARAMS + 1);
        let p = Params::from_request(&Method::GET, Some(&url_over), &HeaderMap::new(), b"");
        assert_eq!(p, Err(ParamsError::TooMany));
        let flood = keys(0, 40_000);
        let p = Params::from_request(&Method::POST, None, &form(), flood.as_bytes());
        assert_eq!(p, Err(ParamsError::TooMany));
    }

    #[test]
    fn get_reads_the_url_and_refuses_a_body() {
        let p = Params::from_request(
            &Method::GET,
            Some("query=up&time=1"),
            &HeaderMap::new(),
            b"",
        )
        .unwrap();
        assert_eq!(p.get("query"), Some("up"));
        assert_eq!(
            Params::from_request(&Method::GET, None, &form(), b"query=up"),
            Err(ParamsError::BodyOnGet)
        );
    }

    #[test]
    fn post_merges_url_and_form_body_but_refuses_overlap() {
        let p = Params::from_request(
            &Method::POST,
            Some("time=1"),
            &form(),
            b"query=up%7Ba%3D%22b%22%7D",
        )
        .unwrap();
        assert_eq!(p.get("query"), Some(r#"up{a="b"}"#));
        assert_eq!(p.get("time"), Some("1"));
        assert_eq!(
            Params::from_request(&Method::POST, Some("query=up"), &form(), b"query=down"),
            Err(ParamsError::InUrlAndBody("query".into()))
        );
    }

    #[test]
    fn only_match_may_repeat() {
        let p = Params::from_request(
            &Method::GET,
            Some("match[]=a&match%5B%5D=b"),
            &HeaderMap::new(),
            b"",
        )
        .unwrap();
        assert_eq!(p.0.len(), 2);
        assert_eq!(
            Params::from_request(
                &Method::GET,
                Some("query=a&query=b"),
                &HeaderMap::new(),
                b""
            ),
            Err(ParamsError::Repeated("query".into()))
        );
    }

    #[test]
    fn refuses_non_form_and_compressed_bodies() {
        let mut multipart = HeaderMap::new();
        multipart.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("multipart/form-data; boundary=x"),
        );
        assert_eq!(
            Params::from_request(&Method::POST, None, &multipart, b"--x\r\n"),
            Err(ParamsError::NotAForm)
        );
        assert_eq!(
            Params::from_request(&Method::POST, None, &HeaderMap::new(), b"query=up"),
            Err(ParamsError::NotAForm)
        );
        let mut gz = form();
        gz.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        assert_eq!(
            Params::from_request(&Method::POST, None, &gz, b"\x1f\x8b"),
            Err(ParamsError::Compressed)
        );
    }

    #[test]
    fn encode_round_trips() {
        let p = Params::from_request(
            &Method::GET,
            Some("query=a%2Bb+c&match[]=x"),
            &HeaderMap::new(),
            b"",
        )
        .unwrap();
        let again =
            Params::from_request(&Method::GET, Some(&p.encode()), &HeaderMap::new(), b"").unwrap();
        assert_eq!(p, again);
        assert_eq!(again.get("query"), Some("a+b c"));
    }
}
