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
//! Every failure is a `ProxyError`, turned into a response in `http/error.rs` only.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use crate::admission::{Admission, Admitted, Kind};
use crate::auth::Authenticator;
use crate::config::{
    Config, ForeignLabelPolicy, Limits, MetricsConfig, MetricsMode, OtlpForwardEncoding, Upstream,
    UpstreamTls,
};
use crate::enforce::alertmanager::{self, TenantAlerts};
use crate::enforce::otlp;
use crate::enforce::prometheus::{self, EMPTY_METADATA};
use crate::enforce::promql::{Memo, TenantMatcher};
use crate::enforce::remote_write::{self, RemoteWriteError};
use crate::enforce::tenant_label::TenantLabel;
use crate::enforce::Rewritten;
use crate::http::body::{self, ProxyBody};
use crate::http::error::ProxyError;
use crate::http::headers::{self, RW_SAMPLES_WRITTEN, X_PROM_LABEL_POLICY, X_SCOPE_ORGID};
use crate::http::path;
use crate::ops::access_log;
use crate::ops::metrics::{
    self, Metrics, ReasonLabels, SurfaceLabels, TenantActionLabels, TenantLabels,
};
use crate::ops::otel::{RequestSpan, Tracing};
use crate::routes::{
    AlertmanagerCall, Operation, Route, RouteTable, Signal, ALERTMANAGER_DATASOURCE_ROOT,
    ALERTMANAGER_PREFIXES,
};
use crate::tenants::reload::Tenants;
use crate::tenants::{Credential, Tenant};
use crate::upstream::{self, HttpClient, UpstreamBody};

/// Where one signal's requests go and how the tenant travels there.
#[derive(Debug)]
pub struct Target {
    pub upstream: Upstream,
    /// Where pushes go, if not to `upstream`.
    pub push_upstream: Option<Upstream>,
    /// Set to the tenant id (Loki, and metrics in header mode).
    pub tenant_header: Option<HeaderName>,
    /// The label a tenant's `namespaces` are values of (metrics label mode).
    pub tenant_label: Option<String>,
    /// Remote write in label mode: what to do with a foreign label value.
    pub foreign_label: ForeignLabelPolicy,
    /// OTLP metrics in label mode: how a relabelled body is forwarded.
    pub otlp_forward: OtlpForwardEncoding,
    /// Loki enforces `X-Prom-Label-Policy` (`logs.lbac`).
    pub enforces_label_policy: bool,
    /// This upstream's pooled client; swapped when its TLS files change.
    pub client: Arc<ArcSwap<HttpClient>>,
    /// Its TLS settings, for the reloader.
    pub tls: Option<UpstreamTls>,
}

impl Target {
    fn upstream_for(&self, operation: Operation) -> &Upstream {
        match &self.push_upstream {
            Some(push) if operation.is_push() => push,
            _ => &self.upstream,
        }
    }

    /// What `credential` may read, as label matchers (label mode).
    fn tenant_matcher<'c>(
        &self,
        credential: &'c Credential,
    ) -> Result<&'c TenantMatcher, ProxyError> {
        credential
            .metrics_matcher(self.label()?)
            .map_err(ProxyError::Internal)
    }

    /// The tenant label (label mode); a label-mode route on a header-mode
    /// target would be a bug in the route table.
    fn label(&self) -> Result<&str, ProxyError> {
        self.tenant_label
            .as_deref()
            .ok_or_else(|| ProxyError::Internal("label enforcement without a label".into()))
    }

    /// The tenant as a label-mode Alertmanager sees it.
    fn alerts_tenant<'t>(&'t self, tenant: &'t Tenant) -> Result<TenantAlerts<'t>, ProxyError> {
        Ok(TenantAlerts {
            label: self.label()?,
            owned: &tenant.namespaces,
        })
    }

    /// The path upstream: a vanilla Alertmanager (label mode) serves at its
    /// root what the proxy also serves under `/alertmanager` and `/am`;
    /// Mimir (header mode) at its root what the proxy also serves under
    /// `/am`. The route table only has these prefixes as whole segments.
    fn upstream_path<'p>(&self, route: &Route, path: &'p str) -> &'p str {
        let prefixes: &[&str] = match (route.signal, &self.tenant_label) {
            (Signal::Alerts, Some(_)) => &ALERTMANAGER_PREFIXES,
            (Signal::Alerts, None) => &[ALERTMANAGER_DATASOURCE_ROOT],
            _ => return path,
        };
        prefixes
            .iter()
            .find_map(|prefix| {
                path.strip_prefix(prefix)
                    .filter(|rest| rest.starts_with('/'))
            })
            .unwrap_or(path)
    }

    fn remote_write_label<'t>(&'t self, tenant: &'t Tenant) -> Result<TenantLabel<'t>, ProxyError> {
        Ok(TenantLabel {
            name: self.label()?,
            owned: &tenant.namespaces,
            owned_by: tenant.id.as_str(),
            policy: self.foreign_label,
        })
    }
}

/// Largest upstream answer to a push read before answering the sender.
const PUSH_ANSWER_LIMIT: usize = 1024 * 1024;

/// Everything a request needs, shared by all connections.
#[derive(Debug)]
pub struct AppState {
    pub routes: RouteTable,
    pub logs: Option<Target>,
    pub metrics_target: Option<Target>,
    /// Alertmanager, scoped the way metrics are.
    pub alerts_target: Option<Target>,
    pub tenants: Arc<Tenants>,
    pub auth: Authenticator,
    pub metrics: Arc<Metrics>,
    pub limits: Limits,
    pub admission: Admission,
    /// Enforced queries by (tenant, query): dashboards repeat themselves.
    pub memo: Memo,
    /// Spans, when `tracing` is configured.
    pub tracing: Option<Tracing>,
}

impl AppState {
    pub fn new(
        config: &Config,
        tenants: Arc<Tenants>,
        metrics: Arc<Metrics>,
    ) -> Result<Self, String> {
        let client = |tls: Option<&UpstreamTls>| -> Result<_, String> {
            Ok(Arc::new(ArcSwap::from_pointee(upstream::client(tls)?)))
        };
        let logs = match &config.logs {
            None => None,
            Some(l) => Some(Target {
                upstream: l.upstream.clone(),
                push_upstream: None,
                tenant_header: Some(X_SCOPE_ORGID),
                tenant_label: None,
                foreign_label: ForeignLabelPolicy::default(),
                otlp_forward: OtlpForwardEncoding::default(),
                enforces_label_policy: l.lbac,
                client: client(l.tls.as_ref())?,
                tls: l.tls.clone(),
            }),
        };
        // Metrics and their Alertmanager are scoped alike: by the label
        // (label mode) or by the tenant header (header mode).
        let scoped_like_metrics = |m: &MetricsConfig| match m.mode {
            MetricsMode::Label => (None, Some(m.label.clone())),
            // Validated as a header name when the config was loaded.
            MetricsMode::Header => (HeaderName::from_bytes(m.header.as_bytes()).ok(), None),
        };
        let metrics_target = match &config.metrics {
            None => None,
            Some(m) => {
                let (tenant_header, tenant_label) = scoped_like_metrics(m);
                Some(Target {
                    upstream: m.upstream.clone(),
                    push_upstream: m.push_upstream.clone(),
                    tenant_header,
                    tenant_label,
                    foreign_label: m.foreign_label,
                    otlp_forward: m.otlp_forward_encoding,
                    enforces_label_policy: false,
                    client: client(m.tls.as_ref())?,
                    tls: m.tls.clone(),
                })
            }
        };
        let alerts_target = match (&config.alerts, &config.metrics) {
            (Some(a), Some(m)) => {
                let (tenant_header, tenant_label) = scoped_like_metrics(m);
                Some(Target {
                    upstream: a.upstream.clone(),
                    push_upstream: None,
                    tenant_header,
                    tenant_label,
                    foreign_label: ForeignLabelPolicy::default(),
                    otlp_forward: OtlpForwardEncoding::default(),
                    enforces_label_policy: false,
                    client: client(a.tls.as_ref())?,
                    tls: a.tls.clone(),
                })
            }
            _ => None,
        };
        let tracing = (config.tracing.as_ref())
            .map(|tracing| Tracing::new(tracing, &metrics))
            .transpose()?;
        Ok(Self {
            routes: RouteTable::new(
                logs.is_some(),
                config.metrics.as_ref().map(|m| m.mode),
                alerts_target.is_some(),
            ),
            logs,
            metrics_target,
            alerts_target,
            tenants,
            auth: Authenticator::new(&config.auth, metrics.password_verifications.clone()),
            limits: config.limits.clone(),
            admission: Admission::new(
                config.limits.max_concurrent_requests,
                config.tenant_limits.clone(),
            )
            .with_metrics(metrics.clone()),
            metrics,
            memo: Memo::new(config.metrics.as_ref().map_or(0, |m| m.query_cache_size)),
            tracing,
        })
    }

    fn target(&self, route: &Route) -> Result<&Target, ProxyError> {
        let target = match route.signal {
            Signal::Logs => self.logs.as_ref(),
            Signal::Metrics => self.metrics_target.as_ref(),
            Signal::Alerts => self.alerts_target.as_ref(),
        };
        target.ok_or_else(|| ProxyError::Internal("route without an upstream".into()))
    }
}

/// What the access log and metrics learn about a request as it progresses.
#[derive(Default)]
struct Outcome {
    path: Option<String>,
    surface: Option<&'static str>,
    /// Once authenticated: the tenant and the username (shared, not copied).
    credential: Option<Arc<Credential>>,
    /// Counts the request as in flight until its response body is done.
    admitted: Option<Admitted>,
    /// An OTLP route: errors are OTLP `Status` messages, JSON when the
    /// request was JSON (`Some(true)`), protobuf otherwise.
    otlp_json: Option<bool>,
    /// A push route: failures that are not the client's become 503, which
    /// every push client retries.
    push: bool,
}

impl Outcome {
    fn tenant(&self) -> Option<&str> {
        self.credential.as_ref().map(|c| c.tenant.id.as_str())
    }

    fn username(&self) -> Option<&str> {
        self.credential.as_ref().map(|c| c.username.as_str())
    }
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
    let span = state
        .tracing
        .as_ref()
        .map(|tracing| tracing.start_request(&method, request.headers()));
    let entered = state.admission.enter();
    let result = match &entered {
        Ok(_) => proxy(&state, peer, request, &mut outcome, span.as_ref()).await,
        Err(_) => Err(ProxyError::Overloaded),
    };
    let mut failure = None;
    let response = match result {
        Ok(response) => match (entered, outcome.admitted.take()) {
            (Ok(None), None) => response,
            held => response.map(|body| body::holding(body, held)),
        },
        Err(error) => {
            failure = Some(error.metric_label());
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
            if let ProxyError::Internal(why) | ProxyError::PushInternal(why) = &error {
                tracing::error!(error = %why, "internal error");
            }
            if let ProxyError::TenantLimited(refusal) = &error {
                state
                    .metrics
                    .count_limited(outcome.tenant(), outcome.surface, refusal.limit());
            }
            if let ProxyError::Overloaded = &error {
                state
                    .metrics
                    .count_limited(None, outcome.surface, "global_concurrency");
            }
            let error = if outcome.push {
                error.on_push_path()
            } else {
                error
            };
            match outcome.otlp_json {
                Some(json) => error.into_otlp_response(json),
                None => error.into_response(),
            }
        }
    };
    let status = response.status();
    state.metrics.count_request(
        outcome
            .credential
            .as_ref()
            .map(|c| (c.tenant.id.as_str(), &c.tenant.request_counters)),
        outcome.surface.unwrap_or("none"),
        metrics::status_class(status),
    );
    tracing::info!(
        target: access_log::TARGET,
        method = %method,
        path = outcome.path.as_deref().unwrap_or("-"),
        surface = outcome.surface.unwrap_or("none"),
        tenant = outcome.tenant().unwrap_or("-"),
        user = outcome.username().unwrap_or("-"),
        client = %peer.ip(),
        status = status.as_u16(),
        duration_ms = started.elapsed().as_secs_f64() * 1000.0,
    );
    let Some(span) = span else {
        return Ok(response);
    };
    let span_end = span.record(
        outcome.path.as_deref(),
        outcome.surface,
        outcome.tenant(),
        status,
        failure,
    );
    Ok(response.map(|body| body::holding(body, span_end)))
}

async fn proxy(
    state: &AppState,
    peer: SocketAddr,
    mut request: Request<Incoming>,
    outcome: &mut Outcome,
    span: Option<&RequestSpan>,
) -> Result<Response<ProxyBody>, ProxyError> {
    // Kept once, in the outcome (for the access log), and borrowed from there.
    let path: &str = outcome
        .path
        .insert(path::normalise(request.uri().path()).map_err(ProxyError::BadPath)?);
    let route = state.routes.classify(request.method(), path)?;
    outcome.surface = Some(route.surface());
    outcome.push = route.operation.is_push();
    if route.operation.is_otlp() {
        let content_type = request.headers().get(header::CONTENT_TYPE);
        let json = content_type.is_some_and(|ct| {
            ct.as_bytes()
                .to_ascii_lowercase()
                .starts_with(b"application/json")
        });
        outcome.otlp_json = Some(json);
    }

    let store = state
        .tenants
        .current()
        .ok_or(ProxyError::TenantsNotLoaded)?;
    let credential = authenticate(state, &store, &request, peer).await?;
    outcome.credential = Some(credential.clone());
    if !credential.scopes.contains(route.scope) {
        return Err(ProxyError::MissingScope(route.scope));
    }
    let kind = if route.operation.is_push() {
        Kind::Push
    } else {
        Kind::Query
    };
    let admitted = state
        .admission
        .admit(&store, credential.tenant.id.as_str(), kind)
        .map_err(ProxyError::TenantLimited)?;
    let meter = admitted.bytes.clone();
    outcome.admitted = admitted.holds_anything().then_some(admitted);

    let target = state.target(route)?;
    // Rules, alerts and deletes are the tenant's whole: a selector cannot
    // narrow them, so a restricted credential never reaches them.
    if credential.selector.is_some() && route.scope.is_tenant_wide() {
        return Err(ProxyError::SelectorNotEnforceable);
    }
    // A selector is enforced by label matchers (label mode) or by a Loki
    // that enforces the label policy header; anything else is refused.
    let label_policy = match &credential.selector {
        None => None,
        Some(selector) if target.enforces_label_policy => Some(headers::label_policy(
            credential.tenant.id.as_str(),
            selector.as_str(),
        )),
        Some(_) if target.tenant_label.is_some() => None,
        Some(_) => return Err(ProxyError::SelectorNotEnforceable),
    };
    if route.operation == Operation::EmptyMetadata {
        return Ok(json_response(EMPTY_METADATA));
    }
    let upgrade = match route.operation {
        Operation::Tail => websocket_upgrade(&request),
        _ => None,
    };
    let client_upgrade = upgrade.as_ref().map(|_| hyper::upgrade::on(&mut request));

    let (mut parts, body) = request.into_parts();
    let body = body::guarded(body, state.limits.body_read_timeout, meter);
    if declared_length(&parts.headers).is_some_and(|len| len > state.limits.max_body_bytes) {
        return Err(ProxyError::BodyTooLarge {
            limit: state.limits.max_body_bytes,
        });
    }
    // Set by a remote write: decides how the answer is judged.
    let mut remote_write_v2 = false;
    let (query, body) = match route.operation {
        Operation::Enforce(selectors) => {
            let matcher = target.tenant_matcher(&credential)?;
            let limit = state.limits.max_body_bytes;
            let (query, bytes) = prometheus::rewrite_request(
                &mut parts,
                body,
                limit,
                selectors,
                matcher,
                &state.memo,
            )
            .await?;
            (query, body::full(bytes))
        }
        Operation::RemoteWrite => {
            let compressed = body::read_bounded(body, state.limits.max_body_bytes).await?;
            let tenant = target.remote_write_label(&credential.tenant)?;
            let (version, rewritten) =
                rewrite_remote_write(state, &parts.headers, &compressed, &tenant)?;
            let rewritten = match rewritten {
                Rewritten::Unchanged => compressed,
                Rewritten::Body(body) => Bytes::from(body),
            };
            remote_write_v2 = version == remote_write::Version::V2;
            // The receiver decodes by these: they say what was checked.
            remote_write::set_upstream_headers(version, &mut parts.headers);
            parts
                .headers
                .insert(header::CONTENT_LENGTH, HeaderValue::from(rewritten.len()));
            (parts.uri.query().map(str::to_owned), body::full(rewritten))
        }
        Operation::Alertmanager(call) => {
            let tenant = target.alerts_tenant(&credential.tenant)?;
            alertmanager_request(state, target, call, path, &mut parts, body, &tenant).await?
        }
        Operation::OtlpMetrics => {
            let tenant = target.remote_write_label(&credential.tenant)?;
            let encoding =
                otlp::read_headers(&parts.headers).map_err(|e| refused_otlp(state, &tenant, e))?;
            let received = body::read_bounded(body, state.limits.max_body_bytes).await?;
            let forward = match target.otlp_forward {
                OtlpForwardEncoding::AsReceived => encoding,
                OtlpForwardEncoding::Identity => otlp::Encoding::Identity,
            };
            let (rewritten, sent_as) =
                match rewrite_otlp(state, (encoding, forward), &received, &tenant)? {
                    Rewritten::Unchanged => (received, encoding),
                    Rewritten::Body(body) => (Bytes::from(body), forward),
                };
            otlp::set_upstream_headers(sent_as, &mut parts.headers);
            parts
                .headers
                .insert(header::CONTENT_LENGTH, HeaderValue::from(rewritten.len()));
            (parts.uri.query().map(str::to_owned), body::full(rewritten))
        }
        _ => {
            let limited = Limited::new(body, state.limits.max_body_bytes as usize);
            let query = parts.uri.query().map(str::to_owned);
            (query, limited.map_err(Into::into).boxed_unsync())
        }
    };
    if let Operation::Filter(_) | Operation::Alertmanager(_) = route.operation {
        // The response is parsed to be filtered: ask for it uncompressed.
        parts.headers.remove(header::ACCEPT_ENCODING);
    }
    let upstream = target.upstream_for(route.operation);
    parts.uri = upstream
        .uri_reusing(
            target.upstream_path(route, path),
            query.as_deref(),
            &parts.uri,
        )
        .map_err(|e| ProxyError::Internal(format!("cannot build upstream URI: {e}")))?;
    parts.version = http::Version::HTTP_11;
    upstream::prepare_request_headers(
        &mut parts.headers,
        peer.ip(),
        target
            .tenant_header
            .as_ref()
            .map(|name| (name, credential.tenant.header_value())),
        upgrade,
    )?;
    if let Some(host) = &upstream.host {
        parts.headers.insert(header::HOST, host.clone());
    }
    if let Some(policy) = label_policy {
        parts.headers.insert(X_PROM_LABEL_POLICY, policy);
    }

    let upstream_span = span.map(|span| span.upstream_call(&mut parts.headers));
    let sent = Instant::now();
    let answered = upstream::send(
        &target.client.load(),
        Request::from_parts(parts, body),
        state.limits.upstream_timeout,
        state.limits.max_body_bytes,
    )
    .await;
    if let Some(upstream_span) = upstream_span {
        upstream_span.finish(
            answered
                .as_ref()
                .map(Response::status)
                .map_err(ProxyError::metric_label),
        );
    }
    let mut response = answered?;
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
        // The tail counts against the tenant's concurrency for as long as
        // it streams, not just until its 101.
        let held = outcome.admitted.take();
        splice_upgraded(client_upgrade, hyper::upgrade::on(&mut response), held);
        let (parts, _) = response.into_parts();
        return Ok(Response::from_parts(parts, body::empty()));
    }

    let (mut parts, body) = response.into_parts();
    upstream::strip_hop_by_hop(&mut parts.headers);
    if remote_write_v2
        && parts.status.is_success()
        && !parts.headers.contains_key(RW_SAMPLES_WRITTEN)
    {
        // Per the 2.0 spec the sender should treat this as 415 itself; saying
        // so makes every sender fall back to 1.0 and resend, losing nothing.
        return Err(ProxyError::UnsupportedMediaType(
            "the upstream did not confirm a remote-write 2.0 request; it may only speak 1.0".into(),
        ));
    }
    if route.operation.is_push() {
        // A push's answer is small (204, or an error text): read it whole,
        // so an upstream lost mid-answer becomes a 503 the sender retries,
        // not a 2xx whose body breaks off; one that stalls there, a 504.
        let answer = tokio::time::timeout(
            state.limits.upstream_timeout,
            Limited::new(body, PUSH_ANSWER_LIMIT).collect(),
        )
        .await
        .map_err(|_| ProxyError::UpstreamTimeout)?
        .map_err(ProxyError::PushUpstreamUnavailable)?;
        return Ok(Response::from_parts(parts, body::full(answer.to_bytes())));
    }
    if let (Operation::Alertmanager(call), StatusCode::OK) = (route.operation, parts.status) {
        let tenant = target.alerts_tenant(&credential.tenant)?;
        let answer = alertmanager_answer(call, &parts.headers, body, &tenant).await?;
        parts.headers.remove(header::CONTENT_LENGTH);
        return Ok(Response::from_parts(parts, body::full(answer)));
    }
    if let (Operation::Filter(filter), StatusCode::OK) = (route.operation, parts.status) {
        refuse_compressed(&parts.headers)?;
        let matcher = target.tenant_matcher(&credential)?;
        let filtered = prometheus::filter_response(body, filter, matcher).await?;
        parts.headers.remove(header::CONTENT_LENGTH);
        return Ok(Response::from_parts(parts, body::full(filtered)));
    }
    Ok(Response::from_parts(
        parts,
        body.map_err(Into::into).boxed_unsync(),
    ))
}

/// An answer to be filtered must come as it was asked for: uncompressed
/// (the request's `Accept-Encoding` was removed).
fn refuse_compressed(headers: &http::HeaderMap) -> Result<(), ProxyError> {
    match headers.contains_key(header::CONTENT_ENCODING) {
        true => Err(ProxyError::UpstreamUnavailable(
            "upstream compressed a response that must be filtered".into(),
        )),
        false => Ok(()),
    }
}

/// Label mode's Alertmanager calls, before forwarding: the tenant's
/// `filter` added to alert reads; a posted silence checked and written
/// again; an update or a delete allowed only on the tenant's own silence.
/// Returns the query string and body to forward.
async fn alertmanager_request(
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
            let received = body::read_bounded(body, state.limits.max_body_bytes).await?;
            let silence = alertmanager::rewrite_silence(&received, tenant)?;
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
        AlertmanagerCall::Read(_) | AlertmanagerCall::Receivers | AlertmanagerCall::Silence => {
            Ok((query, body::empty()))
        }
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

/// Label mode's Alertmanager answers (200 only): filtered to the tenant,
/// or, for one silence, shown only if it is the tenant's.
async fn alertmanager_answer(
    call: AlertmanagerCall,
    headers: &http::HeaderMap,
    body: UpstreamBody,
    tenant: &TenantAlerts<'_>,
) -> Result<Bytes, ProxyError> {
    let filtered = matches!(
        call,
        AlertmanagerCall::Read(_) | AlertmanagerCall::ReadFiltered(_) | AlertmanagerCall::Silence
    );
    if filtered {
        refuse_compressed(headers)?;
    }
    let answer = prometheus::read_filtered_response(body).await?;
    match call {
        AlertmanagerCall::Read(filter) | AlertmanagerCall::ReadFiltered(filter) => {
            alertmanager::filter_answer(&answer, filter, tenant)
        }
        AlertmanagerCall::Silence if !alertmanager::silence_is_owned(&answer, tenant)? => Err(
            ProxyError::Foreign("that silence is not one of this tenant's".into()),
        ),
        _ => Ok(answer),
    }
}

/// Reads the version a remote-write request declares, rewrites its body
/// for the tenant and counts what happened.
fn rewrite_remote_write(
    state: &AppState,
    headers: &http::HeaderMap,
    compressed: &[u8],
    tenant: &TenantLabel<'_>,
) -> Result<(remote_write::Version, Rewritten), ProxyError> {
    let metrics = &state.metrics;
    let tenant_id = || TenantLabels {
        tenant: tenant.owned_by.to_owned(),
    };
    metrics
        .remote_write_bytes
        .get_or_create(&tenant_id())
        .inc_by(compressed.len() as u64);
    let max = state.limits.max_decompressed_bytes;
    let rewritten = remote_write::read_headers(headers).and_then(|version| {
        let (body, stats) = remote_write::rewrite_body(version, compressed, tenant, max)?;
        Ok((version, body, stats))
    });
    match rewritten {
        Ok((version, body, stats)) => {
            metrics
                .remote_write_series
                .get_or_create(&tenant_id())
                .inc_by(stats.series);
            metrics
                .remote_write_samples
                .get_or_create(&tenant_id())
                .inc_by(stats.samples);
            for (action, n) in [("added", stats.added), ("overwritten", stats.overwritten)] {
                let labels = TenantActionLabels {
                    tenant: tenant.owned_by.to_owned(),
                    action,
                };
                metrics
                    .remote_write_tenant_label
                    .get_or_create(&labels)
                    .inc_by(n);
            }
            if stats.dropped_fields > 0 {
                metrics
                    .remote_write_dropped_fields
                    .get_or_create(&tenant_id())
                    .inc_by(stats.dropped_fields);
            }
            Ok((version, body))
        }
        Err(error) => {
            match error {
                RemoteWriteError::ForeignLabel(_) => {
                    let labels = TenantActionLabels {
                        tenant: tenant.owned_by.to_owned(),
                        action: "rejected",
                    };
                    metrics
                        .remote_write_tenant_label
                        .get_or_create(&labels)
                        .inc();
                }
                // Counted by the error's own label, not as the sender's.
                RemoteWriteError::Compress(_) => {}
                _ => {
                    metrics
                        .remote_write_decode_errors
                        .get_or_create(&tenant_id())
                        .inc();
                }
            }
            Err(remote_write_refusal(error))
        }
    }
}

/// Rewrites an OTLP metrics body for the tenant and counts what happened.
/// `(received, forward)`: the request's encoding, and a rewritten body's.
fn rewrite_otlp(
    state: &AppState,
    (encoding, forward): (otlp::Encoding, otlp::Encoding),
    received: &[u8],
    tenant: &TenantLabel<'_>,
) -> Result<Rewritten, ProxyError> {
    let metrics = &state.metrics;
    let tenant_id = TenantLabels {
        tenant: tenant.owned_by.to_owned(),
    };
    metrics
        .otlp_received_bytes
        .get_or_create(&tenant_id)
        .inc_by(received.len() as u64);
    let max = state.limits.max_decompressed_bytes;
    let (body, stats) = otlp::rewrite_body(encoding, forward, received, tenant, max)
        .map_err(|e| refused_otlp(state, tenant, e))?;
    metrics
        .otlp_data_points
        .get_or_create(&tenant_id)
        .inc_by(stats.data_points);
    for (action, n) in [("added", stats.added), ("overwritten", stats.overwritten)] {
        let labels = TenantActionLabels {
            tenant: tenant.owned_by.to_owned(),
            action,
        };
        metrics.otlp_tenant_label.get_or_create(&labels).inc_by(n);
    }
    Ok(body)
}

/// Counts a refused OTLP metrics request and says why.
fn refused_otlp(state: &AppState, tenant: &TenantLabel<'_>, error: otlp::OtlpError) -> ProxyError {
    let tenant = tenant.owned_by.to_owned();
    match &error {
        otlp::OtlpError::ForeignLabel(_) => {
            let labels = TenantActionLabels {
                tenant,
                action: "rejected",
            };
            state.metrics.otlp_tenant_label.get_or_create(&labels).inc();
        }
        // Counted by the error's own label, not as the sender's.
        otlp::OtlpError::Compress(_) => {}
        _ => {
            let labels = TenantLabels { tenant };
            state
                .metrics
                .otlp_decode_errors
                .get_or_create(&labels)
                .inc();
        }
    }
    otlp_refusal(error)
}

/// What a sender is told of an OTLP body the proxy did not forward.
fn otlp_refusal(error: otlp::OtlpError) -> ProxyError {
    match error {
        otlp::OtlpError::Unsupported(m) => ProxyError::UnsupportedMediaType(m),
        otlp::OtlpError::TooLarge { limit } => ProxyError::BodyTooLarge { limit },
        otlp::OtlpError::Compress(_) => ProxyError::Internal(error.to_string()),
        other => ProxyError::BadData(other.to_string()),
    }
}

/// What a sender is told of a remote-write body the proxy did not forward.
fn remote_write_refusal(error: RemoteWriteError) -> ProxyError {
    match error {
        RemoteWriteError::Unsupported(m) => ProxyError::UnsupportedMediaType(m),
        RemoteWriteError::TooLarge { limit, .. } => ProxyError::BodyTooLarge { limit },
        RemoteWriteError::Compress(_) => ProxyError::Internal(error.to_string()),
        other => ProxyError::BadData(other.to_string()),
    }
}

fn json_response(text: &'static str) -> Response<ProxyBody> {
    let mut response = Response::new(body::full(text));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
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
fn splice_upgraded(
    client: hyper::upgrade::OnUpgrade,
    upstream: hyper::upgrade::OnUpgrade,
    held: Option<Admitted>,
) {
    tokio::spawn(async move {
        let _held = held;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A body the proxy checked but could not compress again is our
    /// failure: on a push route (where `handle` maps every error through
    /// `on_push_path`) every client must keep it and retry (OTLP senders
    /// retry 503, never 500), where a body it cannot read is dropped (400).
    #[test]
    fn a_compressor_failure_makes_push_clients_retry() {
        let ours = [
            remote_write_refusal(RemoteWriteError::Compress("snappy: too big".into()))
                .on_push_path(),
            otlp_refusal(otlp::OtlpError::Compress("gzip: stream error".into())).on_push_path(),
        ];
        for error in ours {
            assert_eq!(error.metric_label(), "internal");
            let response = error.into_response();
            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert!(response.headers().contains_key(header::RETRY_AFTER));
        }
        let otlp = otlp_refusal(otlp::OtlpError::Compress("gzip: stream error".into()))
            .on_push_path()
            .into_otlp_response(true);
        assert_eq!(otlp.status(), StatusCode::SERVICE_UNAVAILABLE);
        // Any other failure of ours on a push path too.
        let other = ProxyError::Internal("route without an upstream".into()).on_push_path();
        assert_eq!(other.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(other.metric_label(), "internal");
        let theirs = [
            remote_write_refusal(RemoteWriteError::Malformed("snappy: corrupt".into()))
                .on_push_path(),
            otlp_refusal(otlp::OtlpError::Malformed("gzip: corrupt".into())).on_push_path(),
        ];
        for error in theirs {
            let response = error.into_response();
            assert_eq!(response.status(), StatusCode::BAD_REQUEST);
            assert!(!response.headers().contains_key(header::RETRY_AFTER));
        }
    }
}
