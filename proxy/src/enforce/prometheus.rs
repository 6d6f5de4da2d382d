//! The Prometheus HTTP API in label mode: requests are rebuilt with every
//! selector enforced (`promql.rs`), `metadata` is answered locally, and the
//! `rules`/`alerts` responses are filtered to the tenant's own entries.

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::request::Parts;
use http::Method;
use http_body_util::{BodyExt, Limited};

use serde_json::Value;

use crate::enforce::params::{Params, MATCH, MAX_PARAMS};
use crate::enforce::promql::{EnforceError, Memo, TenantMatcher, MAX_QUERY_BYTES};
use crate::http::body::BoxError;
use crate::http::error::ProxyError;

/// `metadata` takes no selector, so upstream it would list every tenant's
/// metric names and help texts. Grafana calls it and copes with empty data.
pub const EMPTY_METADATA: &str = r#"{"status":"success","data":{}}"#;

/// Largest `rules`/`alerts` response the proxy will buffer to filter.
pub const MAX_FILTERED_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

/// The most `match[]` selectors one request may carry. Each one the memo
/// has not seen is parsed on the request's worker thread: with no bound
/// but the body's (`limits.max_body_bytes`), one form of distinct
/// selectors held that thread, and every connection it serves, for about
/// a second. Together they may also be no longer than one query
/// ([`MAX_QUERY_BYTES`]). A dashboard's label browser sends a few, a
/// federation scrape tens.
pub const MAX_MATCH_SELECTORS: usize = 1_000;

// One selector over this bound must reach its own refusal, which names
// it, before the bound on all parameters refuses the request.
const _: () = assert!(MAX_MATCH_SELECTORS < MAX_PARAMS);

/// Which parameters of a request carry selectors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Selectors {
    /// `query`, required (query, query_range, query_exemplars).
    Query,
    /// Every `match[]`; one is added when none is given (series, labels,
    /// label values, federate), so nothing is ever listed unfiltered.
    Matchers,
}

impl From<EnforceError> for ProxyError {
    fn from(e: EnforceError) -> Self {
        if e.is_client_error() {
            ProxyError::BadData(e.to_string())
        } else {
            ProxyError::Internal(e.to_string())
        }
    }
}

/// Enforces the parameters in place.
pub fn enforce(
    params: &mut Params,
    selectors: Selectors,
    tenant: &TenantMatcher,
    memo: &Memo,
) -> Result<(), ProxyError> {
    match selectors {
        Selectors::Query => {
            let query = params
                .values_mut("query")
                .next()
                .ok_or_else(|| ProxyError::BadData("parameter \"query\" is required".into()))?;
            *query = memo.enforce_query(query, tenant)?.to_string();
        }
        Selectors::Matchers => {
            let (count, bytes) = params
                .values(MATCH)
                .fold((0, 0), |(count, bytes), s| (count + 1, bytes + s.len()));
            if count > MAX_MATCH_SELECTORS || bytes > MAX_QUERY_BYTES {
                return Err(ProxyError::BadData(format!(
                    "at most {MAX_MATCH_SELECTORS} match[] selectors, of at most \
                     {MAX_QUERY_BYTES} bytes together; this request has {count} of {bytes}"
                )));
            }
            let mut given = false;
            for selector in params.values_mut(MATCH) {
                *selector = memo.enforce_selector(selector, tenant)?.to_string();
                given = true;
            }
            if !given {
                params.push(MATCH, tenant.selector());
            }
        }
    }
    Ok(())
}

/// Reads the request's parameters (URL, and `body` as read), enforces
/// them, and rebuilds the request: GET carries them in the URL, POST in a
/// fresh form body. Returns the new query string and body.
pub fn rewrite_request(
    parts: &mut Parts,
    body: &[u8],
    selectors: Selectors,
    tenant: &TenantMatcher,
    memo: &Memo,
) -> Result<(Option<String>, Bytes), ProxyError> {
    let mut params = Params::from_request(&parts.method, parts.uri.query(), &parts.headers, body)
        .map_err(|e| ProxyError::BadData(e.to_string()))?;
    enforce(&mut params, selectors, tenant, memo)?;
    let encoded = params.encode();
    let headers = &mut parts.headers;
    headers.remove(header::CONTENT_ENCODING);
    if parts.method == Method::POST {
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-www-form-urlencoded"),
        );
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(encoded.len()));
        Ok((None, Bytes::from(encoded)))
    } else {
        headers.remove(header::CONTENT_TYPE);
        headers.remove(header::CONTENT_LENGTH);
        Ok((Some(encoded), Bytes::new()))
    }
}

// === response filtering ===

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResponseFilter {
    Rules,
    Alerts,
}

/// The parameters with which Prometheus (3.x) pages `rules`, and the
/// answer's field naming the next page.
const RULES_PAGING: [&str; 2] = ["group_limit", "group_next_token"];
const RULES_NEXT_PAGE: &str = "groupNextToken";

/// The query string a `rules` request is forwarded with: the client's
/// parameters, read and written again, but those that page. Prometheus
/// pages the groups of every tenant and names the next page by a digest of
/// its first group's file and name, so a page filtered here would still
/// tell a tenant how many groups the others have and hand it a digest of
/// one of theirs. Unpaged, the whole list comes and is filtered, as from a
/// Prometheus before 3.x, which ignores the parameters; Grafana then asks
/// for no next page.
pub fn unpaged_rules_query(query: Option<&str>) -> Option<String> {
    let mut out = form_urlencoded::Serializer::new(String::new());
    let mut kept = false;
    for (key, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        if !RULES_PAGING.contains(&key.as_ref()) {
            out.append_pair(&key, &value);
            kept = true;
        }
    }
    kept.then(|| out.finish())
}

/// Reads an upstream answer that is to be filtered or checked, whole, up
/// to `MAX_FILTERED_RESPONSE_BYTES` (502 beyond, or if it breaks off).
/// Generic over the body so that the bound can be tested without an
/// upstream.
pub async fn read_filtered_response<B>(body: B) -> Result<Bytes, ProxyError>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    Ok(Limited::new(body, MAX_FILTERED_RESPONSE_BYTES)
        .collect()
        .await
        .map_err(ProxyError::UpstreamUnavailable)?
        .to_bytes())
}

/// An answer to be filtered must come as it was asked for: uncompressed
/// (the request's `Accept-Encoding` was removed).
pub fn refuse_compressed(headers: &http::HeaderMap) -> Result<(), ProxyError> {
    match headers.contains_key(http::header::CONTENT_ENCODING) {
        true => Err(ProxyError::UpstreamUnavailable(
            "upstream compressed a response that must be filtered".into(),
        )),
        false => Ok(()),
    }
}

/// A successful `rules`/`alerts` response (read whole by
/// [`read_filtered_response`]) with only what carries the tenant label
/// with one of the tenant's values: what the tenant's matchers (and a
/// credential's selector) accept. A response that cannot be read or
/// understood is refused (502), never passed through unfiltered.
pub fn filter_document(
    bytes: &[u8],
    filter: ResponseFilter,
    tenant: &TenantMatcher,
) -> Result<Bytes, ProxyError> {
    let mut doc: Value = serde_json::from_slice(bytes).map_err(|e| unfilterable(e.to_string()))?;
    let owned = |labels: &Value| tenant.matches(|name| labels.get(name).and_then(Value::as_str));
    match filter {
        ResponseFilter::Alerts => {
            let alerts = array_at(&mut doc, "/data/alerts")?;
            alerts.retain(|alert| owned(&alert["labels"]));
        }
        ResponseFilter::Rules => {
            let groups = array_at(&mut doc, "/data/groups")?;
            for group in groups.iter_mut() {
                let rules = array_at(group, "/rules")?;
                let all = rules.len();
                rules.retain(|rule| owned(&rule["labels"]));
                for rule in rules.iter_mut() {
                    if let Some(alerts) = rule.get_mut("alerts").and_then(Value::as_array_mut) {
                        alerts.retain(|alert| owned(&alert["labels"]));
                    }
                }
                if rules.len() < all {
                    // A group's evaluation time is its every rule's, so
                    // it would tell what other tenants' rules cost: shown
                    // as the sum of what is kept, as if the group held no
                    // more.
                    let kept: f64 = (rules.iter())
                        .filter_map(|rule| rule["evaluationTime"].as_f64())
                        .sum();
                    if let Some(time) = group.get_mut("evaluationTime") {
                        *time = Value::from(kept);
                    }
                }
            }
            groups.retain(|group| group["rules"].as_array().is_some_and(|r| !r.is_empty()));
            // Unasked for (`unpaged_rules_query`), yet never passed on: it
            // names another tenant's group.
            if let Some(data) = doc.get_mut("data").and_then(Value::as_object_mut) {
                data.remove(RULES_NEXT_PAGE);
            }
        }
    }
    Ok(Bytes::from(doc.to_string()))
}

fn array_at<'a>(doc: &'a mut Value, pointer: &str) -> Result<&'a mut Vec<Value>, ProxyError> {
    doc.pointer_mut(pointer)
        .and_then(Value::as_array_mut)
        .ok_or_else(|| unfilterable(format!("no array at {pointer}")))
}

fn unfilterable(why: String) -> ProxyError {
    ProxyError::UpstreamUnavailable(format!("cannot filter the upstream response: {why}").into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant() -> TenantMatcher {
        TenantMatcher::new("namespace", &["a".into()]).unwrap()
    }

    fn params(query: &str) -> Params {
        Params::from_request(&Method::GET, Some(query), &http::HeaderMap::new(), b"").unwrap()
    }

    #[test]
    fn query_is_required_and_enforced() {
        let mut p = params("query=up&time=1");
        enforce(&mut p, Selectors::Query, &tenant(), &Memo::new(0)).unwrap();
        assert_eq!(p.get("query"), Some(r#"up{namespace="a"}"#));
        assert_eq!(p.get("time"), Some("1"));
        let mut missing = params("time=1");
        assert!(matches!(
            enforce(&mut missing, Selectors::Query, &tenant(), &Memo::new(0)),
            Err(ProxyError::BadData(_))
        ));
    }

    #[test]
    fn every_match_is_enforced_and_one_is_added_when_none() {
        let mut p = params("match[]=up&match[]={job=\"x\"}");
        enforce(&mut p, Selectors::Matchers, &tenant(), &Memo::new(0)).unwrap();
        let all: Vec<_> = p.values(MATCH).collect();
        assert_eq!(all, [r#"up{namespace="a"}"#, r#"{job="x",namespace="a"}"#]);
        let mut none = params("start=1");
        enforce(&mut none, Selectors::Matchers, &tenant(), &Memo::new(0)).unwrap();
        assert_eq!(none.get(MATCH), Some(r#"{namespace="a"}"#));
    }

    /// `match[]` selectors are bounded together: in count, and in bytes as
    /// one query is; at each bound they pass, one more is refused (400).
    #[test]
    fn match_selectors_are_bounded_in_count_and_bytes_together() {
        let query = |selectors: &[String]| {
            let pairs = selectors.iter().map(|s| (MATCH, s.as_str()));
            let query = form_urlencoded::Serializer::new(String::new())
                .extend_pairs(pairs)
                .finish();
            params(&query)
        };
        let many: Vec<String> = (0..=MAX_MATCH_SELECTORS)
            .map(|i| format!("up{{job=\"{i}\"}}"))
            .collect();
        let long: Vec<String> = [MAX_QUERY_BYTES / 2 - 10; 2]
            .iter()
            .map(|&n| format!("up{{job=\"{}\"}}", "x".repeat(n)))
            .collect();
        assert_eq!(long[0].len() + long[1].len(), MAX_QUERY_BYTES);
        let longer = [long[0].clone(), format!("{}x", long[1])];
        let memo = Memo::new(0);
        for (selectors, allowed) in [
            (&many[..MAX_MATCH_SELECTORS], true),
            (&many[..], false),
            (&long[..], true),
            (&longer[..], false),
        ] {
            let result = enforce(&mut query(selectors), Selectors::Matchers, &tenant(), &memo);
            match allowed {
                true => assert!(result.is_ok(), "{} selectors: {result:?}", selectors.len()),
                false => assert!(
                    matches!(&result, Err(ProxyError::BadData(m)) if m.contains("match[]")),
                    "{result:?}"
                ),
            }
        }
    }

    /// `rewrite_request` on a request of `method` to `uri` with `headers`
    /// and `body`: the request's head after it, and what it returned.
    fn rewritten(
        method: Method,
        uri: &str,
        headers: &[(header::HeaderName, &str)],
        body: &str,
    ) -> (Parts, Option<String>, Bytes) {
        let mut request = http::Request::builder().method(method).uri(uri);
        for (name, value) in headers {
            request = request.header(name, *value);
        }
        let (mut parts, ()) = request.body(()).unwrap().into_parts();
        let memo = Memo::new(0);
        let selectors = Selectors::Query;
        let (query, body) =
            rewrite_request(&mut parts, body.as_bytes(), selectors, &tenant(), &memo).unwrap();
        (parts, query, body)
    }

    fn pairs(form: &[u8]) -> Vec<(String, String)> {
        form_urlencoded::parse(form).into_owned().collect()
    }

    #[test]
    fn a_post_leaves_with_every_parameter_in_a_form_its_headers_describe() {
        let (parts, query, body) = rewritten(
            Method::POST,
            "/api/v1/query?time=1",
            &[
                (
                    header::CONTENT_TYPE,
                    "application/x-www-form-urlencoded; charset=utf-8",
                ),
                (header::CONTENT_ENCODING, "identity"),
                (header::CONTENT_LENGTH, "8"),
            ],
            "query=up",
        );
        assert_eq!(query, None);
        assert_eq!(
            pairs(&body),
            [
                ("time".to_string(), "1".to_string()),
                ("query".to_string(), r#"up{namespace="a"}"#.to_string())
            ]
        );
        let headers = &parts.headers;
        assert_eq!(
            headers[header::CONTENT_TYPE],
            "application/x-www-form-urlencoded"
        );
        assert_eq!(
            headers[header::CONTENT_LENGTH],
            body.len().to_string().as_str()
        );
        assert!(!headers.contains_key(header::CONTENT_ENCODING));
    }

    #[test]
    fn a_get_leaves_with_its_parameters_in_the_url_and_no_body_headers() {
        let (parts, query, body) = rewritten(
            Method::GET,
            "/api/v1/query?query=up&time=1",
            &[
                (header::CONTENT_TYPE, "text/plain"),
                (header::CONTENT_LENGTH, "0"),
                (header::CONTENT_ENCODING, "identity"),
            ],
            "",
        );
        assert_eq!(
            pairs(query.unwrap().as_bytes()),
            [
                ("query".to_string(), r#"up{namespace="a"}"#.to_string()),
                ("time".to_string(), "1".to_string())
            ]
        );
        assert!(body.is_empty());
        for gone in [
            header::CONTENT_TYPE,
            header::CONTENT_LENGTH,
            header::CONTENT_ENCODING,
        ] {
            assert!(!parts.headers.contains_key(&gone), "{gone}");
        }
    }

    #[tokio::test]
    async fn a_response_to_filter_is_read_up_to_64_mib_and_refused_beyond() {
        // The bound docs/promql-enforcement.md states.
        let bound = 64 << 20;
        let body = |size: usize| http_body_util::Full::new(Bytes::from(vec![b' '; size]));
        assert_eq!(
            read_filtered_response(body(bound)).await.unwrap().len(),
            bound
        );
        assert!(matches!(
            read_filtered_response(body(bound + 1)).await,
            Err(ProxyError::UpstreamUnavailable(_))
        ));
    }

    #[test]
    fn an_answer_to_filter_must_come_uncompressed() {
        let mut headers = http::HeaderMap::new();
        assert!(refuse_compressed(&headers).is_ok());
        headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        assert!(matches!(
            refuse_compressed(&headers),
            Err(ProxyError::UpstreamUnavailable(e)) if e.to_string().contains("compressed")
        ));
    }

    #[test]
    fn rules_keep_only_the_tenants_rules_and_alerts() {
        let doc = serde_json::json!({"status": "success", "data": {"groups": [
            {"name": "mixed", "evaluationTime": 0.75, "rules": [
                {"name": "A", "labels": {"namespace": "a"}, "evaluationTime": 0.25, "alerts": [
                    {"labels": {"namespace": "a"}}, {"labels": {"namespace": "b"}}]},
                {"name": "B", "labels": {"namespace": "b"}, "evaluationTime": 0.5, "alerts": []},
                {"name": "global", "labels": {}},
            ]},
            {"name": "only-b", "rules": [{"name": "B2", "labels": {"namespace": "b"}}]},
            {"name": "only-a", "evaluationTime": 0.125, "rules": [
                {"name": "A2", "labels": {"namespace": "a"}, "evaluationTime": 0.0625}]},
        ], "groupNextToken": "digest-of-a-group-of-b"}});
        let out =
            filter_document(doc.to_string().as_bytes(), ResponseFilter::Rules, &tenant()).unwrap();
        let out: Value = serde_json::from_slice(&out).unwrap();
        let groups = out["data"]["groups"].as_array().unwrap();
        assert_eq!(groups.len(), 2);
        let rules = groups[0]["rules"].as_array().unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0]["name"], "A");
        assert_eq!(rules[0]["alerts"].as_array().unwrap().len(), 1);
        // What the group's other rules cost is not shown; a group left
        // whole keeps its own figure (which also counts the time between
        // rules).
        assert_eq!(groups[0]["evaluationTime"], 0.25);
        assert_eq!(groups[1]["evaluationTime"], 0.125);
        let fields: Vec<&String> = out["data"].as_object().unwrap().keys().collect();
        assert_eq!(fields, ["groups"]);
    }

    #[test]
    fn rules_are_asked_for_unpaged_with_the_other_parameters_as_sent() {
        let unpaged = |query| unpaged_rules_query(Some(query));
        assert_eq!(
            unpaged("type=alert&group_limit=1&rule_name[]=a+b&group%5Fnext%5Ftoken=x&file[]=f"),
            Some("type=alert&rule_name%5B%5D=a+b&file%5B%5D=f".to_owned())
        );
        assert_eq!(unpaged("group_limit=1&group_next_token=x"), None);
        assert_eq!(unpaged_rules_query(None), None);
        // Read as Go reads a query: a `;` is not a separator, the pair is
        // one (that Go's parser drops).
        assert_eq!(
            unpaged("a=1;group_limit=1"),
            Some("a=1%3Bgroup_limit%3D1".to_owned())
        );
    }

    #[test]
    fn a_credential_selector_narrows_alerts_further() {
        let doc = r#"{"status":"success","data":{"alerts":[
            {"labels":{"namespace":"a","app":"payments"}},
            {"labels":{"namespace":"a","app":"shop"}},
            {"labels":{"namespace":"b","app":"payments"}}]}}"#;
        let selector =
            crate::enforce::promql::CredentialSelector::parse(r#"{app="payments"}"#).unwrap();
        let out = filter_document(
            doc.as_bytes(),
            ResponseFilter::Alerts,
            &tenant().narrowed(&selector),
        )
        .unwrap();
        let out: Value = serde_json::from_slice(&out).unwrap();
        let alerts = out["data"]["alerts"].as_array().unwrap();
        assert_eq!(alerts.len(), 1);
        assert_eq!(alerts[0]["labels"]["app"], "payments");
        assert_eq!(alerts[0]["labels"]["namespace"], "a");
    }

    #[test]
    fn alerts_keep_only_the_tenants_and_odd_shapes_are_refused() {
        let doc = r#"{"status":"success","data":{"alerts":[{"labels":{"namespace":"a"}},{"labels":{"namespace":"b"}},{"labels":{}}]}}"#;
        let out = filter_document(doc.as_bytes(), ResponseFilter::Alerts, &tenant()).unwrap();
        let out: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(out["data"]["alerts"].as_array().unwrap().len(), 1);
        for odd in ["not json", r#"{"data":{}}"#, r#"{"data":{"alerts":{}}}"#] {
            assert!(filter_document(odd.as_bytes(), ResponseFilter::Alerts, &tenant()).is_err());
        }
    }
}
