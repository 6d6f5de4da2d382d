//! The life of one tenant request, in order:
//!
//! 1. normalise the path (400 if ambiguous);
//! 2. classify it against the route table (404/405; deny by default);
//! 3. require a loaded tenants file (503 + Retry-After, so push clients retry);
//! 4. authenticate (401, or 429/503 when throttled or saturated);
//! 5. check the route's scope (403);
//! 6. bound the body (413) and rebuild the request for the upstream, with
//!    identity headers stripped and the tenant header set;
//! 7. forward and stream the response back (502/504 on upstream failure);
//! 8. record metrics and an access log line.
//!
//! Every failure is a `ProxyError`, turned into a response in `error.rs` only.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use http::header::{self, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use crate::auth::Authenticator;
use crate::body::ProxyBody;
use crate::config::{Config, Limits, Upstream};
use crate::error::ProxyError;
use crate::headers::X_SCOPE_ORGID;
use crate::metrics::{self, Metrics, ReasonLabels, RequestLabels, SurfaceLabels};
use crate::path;
use crate::reload::Tenants;
use crate::routes::{Operation, Route, RouteTable, Signal};
use crate::tenants::Credential;
use crate::upstream::{self, HttpClient};

/// Everything a request needs, shared by all connections.
#[derive(Debug)]
pub struct AppState {
    pub routes: RouteTable,
    pub logs_upstream: Option<Upstream>,
    pub tenants: Arc<Tenants>,
    pub auth: Authenticator,
    pub client: HttpClient,
    pub metrics: Arc<Metrics>,
    pub limits: Limits,
}

impl AppState {
    pub fn new(config: &Config, tenants: Arc<Tenants>, metrics: Arc<Metrics>) -> Self {
        Self {
            routes: RouteTable::new(config.logs.is_some()),
            logs_upstream: config.logs.as_ref().map(|l| l.upstream.clone()),
            tenants,
            auth: Authenticator::new(&config.auth),
            client: upstream::client(),
            metrics,
            limits: config.limits.clone(),
        }
    }

    fn upstream_for(&self, route: &Route) -> Result<(&Upstream, HeaderName), ProxyError> {
        match route.signal {
            Signal::Logs => self
                .logs_upstream
                .as_ref()
                .map(|u| (u, X_SCOPE_ORGID))
                .ok_or_else(|| ProxyError::Internal("logs route without logs upstream".into())),
            Signal::Metrics => Err(ProxyError::Internal(
                "metrics routes are not served yet".into(),
            )),
        }
    }
}

/// What the access log and metrics learn about a request as it progresses.
#[derive(Default)]
struct Outcome {
    path: Option<String>,
    surface: Option<&'static str>,
    tenant: Option<String>,
    username: Option<String>,
}

pub async fn handle(
    state: Arc<AppState>,
    peer: SocketAddr,
    mut request: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let started = Instant::now();
    // Before anything could print the request: no Debug output or trace shows it.
    if let Some(value) = request.headers_mut().get_mut(header::AUTHORIZATION) {
        value.set_sensitive(true);
    }
    let method = request.method().clone();
    let mut outcome = Outcome::default();
    let response = match proxy(&state, peer, request, &mut outcome).await {
        Ok(response) => response,
        Err(error) => {
            state
                .metrics
                .errors
                .get_or_create(&ReasonLabels {
                    reason: error.metric_label(),
                })
                .inc();
            if let ProxyError::UpstreamUnavailable(cause) = &error {
                tracing::warn!(error = %cause, "upstream request failed");
            }
            error.into_response()
        }
    };
    let status = response.status();
    state
        .metrics
        .requests
        .get_or_create(&RequestLabels {
            tenant: outcome.tenant.clone().unwrap_or_default(),
            surface: outcome.surface.unwrap_or("none"),
            status_class: metrics::status_class(status),
        })
        .inc();
    tracing::info!(
        target: "access",
        method = %method,
        path = outcome.path.as_deref().unwrap_or("-"),
        surface = outcome.surface.unwrap_or("none"),
        tenant = outcome.tenant.as_deref().unwrap_or("-"),
        user = outcome.username.as_deref().unwrap_or("-"),
        client = %peer.ip(),
        status = status.as_u16(),
        duration_ms = started.elapsed().as_secs_f64() * 1000.0,
    );
    Ok(response)
}

async fn proxy(
    state: &AppState,
    peer: SocketAddr,
    mut request: Request<Incoming>,
    outcome: &mut Outcome,
) -> Result<Response<ProxyBody>, ProxyError> {
    let path = path::normalise(request.uri().path()).map_err(ProxyError::BadPath)?;
    outcome.path = Some(path.clone());
    let route = state.routes.classify(request.method(), &path)?;
    outcome.surface = Some(route.surface());

    let store = state
        .tenants
        .current()
        .ok_or(ProxyError::TenantsNotLoaded)?;
    let credential = authenticate(state, &store, &request, peer).await?;
    outcome.tenant = Some(credential.tenant.id.to_string());
    outcome.username = Some(credential.username.clone());
    if !credential.scopes.contains(route.scope) {
        return Err(ProxyError::MissingScope(route.scope));
    }

    let (upstream, tenant_header) = state.upstream_for(route)?;
    let upgrade = match route.operation {
        Operation::Tail => websocket_upgrade(&request),
        Operation::Push | Operation::Read => None,
    };
    let client_upgrade = upgrade.as_ref().map(|_| hyper::upgrade::on(&mut request));

    let (mut parts, body) = request.into_parts();
    if declared_length(&parts.headers).is_some_and(|len| len > state.limits.max_body_bytes) {
        return Err(ProxyError::BodyTooLarge {
            limit: state.limits.max_body_bytes,
        });
    }
    parts.uri = upstream
        .uri_for(&path, parts.uri.query())
        .map_err(|e| ProxyError::Internal(format!("cannot build upstream URI: {e}")))?;
    parts.version = http::Version::HTTP_11;
    upstream::prepare_request_headers(
        &mut parts.headers,
        peer.ip(),
        &tenant_header,
        credential.tenant.id.as_str(),
        upgrade,
    )?;
    let body = Limited::new(body, state.limits.max_body_bytes as usize)
        .map_err(Into::into)
        .boxed_unsync();

    let sent = Instant::now();
    let mut response = upstream::send(
        &state.client,
        Request::from_parts(parts, body),
        state.limits.upstream_timeout,
        state.limits.max_body_bytes,
    )
    .await?;
    state
        .metrics
        .upstream_duration
        .get_or_create(&SurfaceLabels {
            surface: route.surface(),
        })
        .observe(sent.elapsed().as_secs_f64());

    if let (Some(client_upgrade), StatusCode::SWITCHING_PROTOCOLS) =
        (client_upgrade, response.status())
    {
        splice_upgraded(client_upgrade, hyper::upgrade::on(&mut response));
        let (parts, _) = response.into_parts();
        return Ok(Response::from_parts(parts, crate::body::empty()));
    }

    let (mut parts, body) = response.into_parts();
    upstream::strip_hop_by_hop(&mut parts.headers);
    Ok(Response::from_parts(
        parts,
        body.map_err(Into::into).boxed_unsync(),
    ))
}

async fn authenticate(
    state: &AppState,
    store: &crate::tenants::TenantStore,
    request: &Request<Incoming>,
    peer: SocketAddr,
) -> Result<Arc<Credential>, ProxyError> {
    state
        .auth
        .authenticate(store, request.headers(), peer.ip())
        .await
        .map_err(|failure| {
            state
                .metrics
                .auth_failures
                .get_or_create(&ReasonLabels {
                    reason: failure.reason(),
                })
                .inc();
            failure.into_error()
        })
}

fn declared_length(headers: &http::HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// `Some(protocol)` for a WebSocket upgrade request (live tail).
fn websocket_upgrade(request: &Request<Incoming>) -> Option<HeaderValue> {
    let wants_upgrade = request
        .headers()
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|token| token.trim().eq_ignore_ascii_case("upgrade"));
    let protocol = request.headers().get(header::UPGRADE)?;
    (wants_upgrade && protocol.as_bytes().eq_ignore_ascii_case(b"websocket"))
        .then(|| protocol.clone())
}

/// Once both sides have switched protocols, copies bytes both ways until
/// either closes. The upstream already answered 101 with the tenant header
/// in force, so nothing in the stream can change the tenant.
fn splice_upgraded(client: hyper::upgrade::OnUpgrade, upstream: hyper::upgrade::OnUpgrade) {
    tokio::spawn(async move {
        let (client, upstream) = match tokio::try_join!(client, upstream) {
            Ok(pair) => pair,
            Err(e) => {
                tracing::warn!(error = %e, "websocket upgrade failed");
                return;
            }
        };
        let mut client = TokioIo::new(client);
        let mut upstream = TokioIo::new(upstream);
        if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
            tracing::debug!(error = %e, "websocket stream ended with an error");
        }
    });
}
