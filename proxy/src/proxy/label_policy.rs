//! A Loki read under a label policy (`logs.lbac`, a credential restricted
//! by a selector): its parameters go to Loki in the URL alone.
//!
//! Loki's label-based access control reads the `query` it rewrites for
//! volume and aggregated-metric requests from the URL (`r.URL.Query()` in
//! `pkg/labelaccess`), while Loki's handlers read the form, where a POST
//! body's values come first (`r.Form`). A `query` in the body would be
//! checked by one reading and answered by the other. So the parameters are
//! read once, by the rules label mode holds Prometheus requests to
//! (`enforce::params`: the URL, or a form body on POST, never a key in both
//! or twice), and forwarded in the URL with an empty body.
//!
//! Loki's policy does not reach label names read from the store (only
//! those from the ingesters), so `labels` would list names of streams the
//! selector excludes. Loki narrows label names to the streams a `query`
//! selects, so that request carries the credential's selector there,
//! joined to the client's own.

use http::header::{self, HeaderValue};
use http::Method;

use crate::enforce::params::Params;
use crate::enforce::promql::CredentialSelector;
use crate::http::error::ProxyError;

/// The parameter holding a request's stream selector.
const QUERY: &str = "query";

/// Reads the request's parameters (URL, and `body` as read) and leaves
/// `parts` with no body headers; returns the query string to forward.
/// With `label_names_of`, a request for label names, its `query` is
/// narrowed to that selector.
pub(super) fn parameters_in_url(
    parts: &mut http::request::Parts,
    body: &[u8],
    label_names_of: Option<&CredentialSelector>,
) -> Result<Option<String>, ProxyError> {
    let mut params = Params::from_request(&parts.method, parts.uri.query(), &parts.headers, body)
        .map_err(|e| ProxyError::BadData(e.to_string()))?;
    if let Some(selector) = label_names_of {
        narrow_label_names(&mut params, selector)?;
    }
    let headers = &mut parts.headers;
    headers.remove(header::CONTENT_TYPE);
    headers.remove(header::CONTENT_ENCODING);
    if parts.method == Method::POST {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(0));
    } else {
        headers.remove(header::CONTENT_LENGTH);
    }
    let query = params.encode();
    Ok((!query.is_empty()).then_some(query))
}

/// `query` of a label-names request: the client's stream selector (read
/// as the credential's own are: matchers alone) with the credential's
/// matchers added, or the credential's selector alone.
fn narrow_label_names(
    params: &mut Params,
    selector: &CredentialSelector,
) -> Result<(), ProxyError> {
    let narrowed = match params.get(QUERY) {
        None => {
            params.push(QUERY, selector.as_str().to_owned());
            return Ok(());
        }
        // Loki reads an empty `query` as none.
        Some("") => selector.clone(),
        Some(client) => CredentialSelector::parse(client)
            .map_err(|e| ProxyError::BadData(format!("`query` of a label names request: {e}")))?
            .and(selector),
    };
    // `Params` holds a key once: this is the one `query`.
    params
        .values_mut(QUERY)
        .for_each(|query| *query = narrowed.as_str().to_owned());
    Ok(())
}
