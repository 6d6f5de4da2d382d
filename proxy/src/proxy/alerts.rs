//! Label mode's Alertmanager calls (a vanilla Alertmanager): the request
//! scoped to the tenant before it is forwarded, the answer after.

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Request, StatusCode};
use hyper::body::Incoming;

use super::state::{AppState, Target};
use crate::enforce::alertmanager::{self, OwnedTenantAlerts, TenantAlerts};
use crate::enforce::prometheus;
use crate::http::body::{self, ProxyBody};
use crate::http::error::ProxyError;
use crate::routes::AlertmanagerCall;
use crate::upstream::{self, UpstreamBody};

/// Label mode's Alertmanager calls, before forwarding: the tenant's
/// `filter` added to alert reads; a posted silence checked and written
/// again; an update or a delete allowed only on the tenant's own silence.
/// Returns the query string and body to forward.
pub(super) async fn request(
    state: &AppState,
    target: &Target,
    call: AlertmanagerCall,
    path: &str,
    parts: &mut http::request::Parts,
    body: body::Guarded<Incoming>,
    tenant: &TenantAlerts<'_>,
) -> Result<(Option<String>, ProxyBody), ProxyError> {
    let query = parts.uri.query().map(str::to_owned);
    match call {
        AlertmanagerCall::ReadFiltered(_) => {
            let filtered = alertmanager::with_filter(query.as_deref(), tenant);
            Ok((Some(filtered), body::empty()))
        }
        AlertmanagerCall::PostSilence => {
            let (received, counted) = state.read_whole(body).await?;
            let (owned, posted) = (OwnedTenantAlerts::of(tenant), received.clone());
            let step = move || alertmanager::rewrite_silence(&posted, &owned.view());
            let workers = &state.body_workers;
            let silence = workers.run_held(received.len(), counted, step).await??;
            if let Some(id) = &silence.id {
                check_silence_owner(state, target, id, tenant).await?;
            }
            let json = serde_json::to_vec(&silence)
                .map_err(|e| ProxyError::Internal(format!("cannot write the silence: {e}")))?;
            parts.headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            parts.headers.remove(header::CONTENT_ENCODING);
            parts
                .headers
                .insert(header::CONTENT_LENGTH, HeaderValue::from(json.len()));
            Ok((None, body::full(json)))
        }
        AlertmanagerCall::DeleteSilence => {
            let id = path.rsplit('/').next().unwrap_or_default();
            check_silence_owner(state, target, id, tenant).await?;
            Ok((None, body::empty()))
        }
        // Asked of the status, which takes no parameters.
        AlertmanagerCall::Receivers => Ok((None, body::empty())),
        AlertmanagerCall::Read(_) | AlertmanagerCall::Silence => Ok((query, body::empty())),
    }
}

/// Refuses a change to silence `id` unless Alertmanager shows it to be the
/// tenant's. A silence that does not exist is refused the same way, so the
/// answer never tells one tenant which ids another has.
async fn check_silence_owner(
    state: &AppState,
    target: &Target,
    id: &str,
    tenant: &TenantAlerts<'_>,
) -> Result<(), ProxyError> {
    alertmanager::check_silence_id(id)?;
    let internal = |e: String| ProxyError::Internal(format!("cannot ask for silence {id:?}: {e}"));
    let uri = target
        .upstream
        .uri_for(&format!("/api/v2/silence/{id}"), None)
        .map_err(|e| internal(e.to_string()))?;
    let request = Request::get(uri)
        .body(body::empty())
        .map_err(|e| internal(e.to_string()))?;
    let timeout = state.limits.upstream_timeout;
    let response = upstream::send(&target.client.load(), request, timeout, 0).await?;
    let status = response.status();
    let answer = prometheus::read_filtered_response(response.into_body()).await?;
    match status {
        StatusCode::OK if alertmanager::silence_is_owned(&answer, tenant)? => Ok(()),
        StatusCode::OK | StatusCode::NOT_FOUND => Err(ProxyError::Foreign(format!(
            "silence {id:?} is not one of this tenant's"
        ))),
        other => Err(ProxyError::UpstreamUnavailable(
            format!("Alertmanager answered {other} when asked for a silence").into(),
        )),
    }
}

/// Label mode's Alertmanager answers (200 only): filtered to the tenant;
/// for one silence, shown only if it is the tenant's; for the receivers
/// (asked of the status), those the tenant's alerts can reach.
pub(super) async fn answer(
    state: &AppState,
    call: AlertmanagerCall,
    headers: &http::HeaderMap,
    body: UpstreamBody,
    tenant: &TenantAlerts<'_>,
) -> Result<Bytes, ProxyError> {
    let read = !matches!(
        call,
        AlertmanagerCall::PostSilence | AlertmanagerCall::DeleteSilence
    );
    if read {
        prometheus::refuse_compressed(headers)?;
    }
    let answer = prometheus::read_filtered_response(body).await?;
    let (owned, size) = (OwnedTenantAlerts::of(tenant), answer.len());
    let step = move || filtered_answer(call, answer, &owned.view());
    state.body_workers.run(size, step).await?
}

/// What [`answer`] makes of the answer read: run on a body worker when it
/// is large (a long list of alerts).
fn filtered_answer(
    call: AlertmanagerCall,
    answer: Bytes,
    tenant: &TenantAlerts<'_>,
) -> Result<Bytes, ProxyError> {
    match call {
        AlertmanagerCall::Read(filter) | AlertmanagerCall::ReadFiltered(filter) => {
            alertmanager::filter_answer(&answer, filter, tenant)
        }
        AlertmanagerCall::Silence if !alertmanager::silence_is_owned(&answer, tenant)? => Err(
            ProxyError::Foreign("that silence is not one of this tenant's".into()),
        ),
        AlertmanagerCall::Receivers => {
            alertmanager::tenant_receivers(&answer, tenant).map(Bytes::from)
        }
        _ => Ok(answer),
    }
}
