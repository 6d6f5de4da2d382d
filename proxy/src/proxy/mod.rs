//! The life of one tenant request, in order:
//!
//! 1. normalise the path (400 if ambiguous);
//! 2. classify it against the route table (404/405; deny by default);
//! 3. require a loaded tenants file (503 + Retry-After, so push clients retry);
//! 4. authenticate (401, or 429/503 when throttled or saturated);
//! 5. check the route's scope (403) and admit against the tenant's limits
//!    (429);
//! 6. bound the body (413), enforce the tenant in it (label mode: queries
//!    here, push bodies in `push.rs`, Alertmanager calls in `alerts.rs`)
//!    and rebuild the request for the upstream, with identity headers
//!    stripped and the tenant header set;
//! 7. forward and stream the response back (502/504 on upstream failure;
//!    live tail relayed by `tail.rs`);
//! 8. record metrics and an access log line.
//!
//! What every request shares (targets, limits, the memo) is in `state.rs`.
//! Every failure is a `ProxyError`, turned into a response in `http/error.rs` only.

use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::{Body as _, Incoming};

use crate::admission::{Admitted, Kind};
use crate::enforce::prometheus::{self, ResponseFilter, EMPTY_METADATA};
use crate::enforce::remote_write;
use crate::http::address_text::{AddressText, Peer};
use crate::http::body::{self, ProxyBody};
use crate::http::error::ProxyError;
use crate::http::headers::{self, X_PROM_LABEL_POLICY};
use crate::http::path;
use crate::ops::access_log;
use crate::ops::metrics::{self, ReasonLabels, TenantLabels};
use crate::ops::otel::RequestSpan;
use crate::ops::panics::{self, CaughtBody};
use crate::routes::{self, Operation, Signal};
use crate::tenants::Credential;
use crate::upstream;

mod alerts;
mod body_workers;
mod label_policy;
mod push;
mod rules;
mod state;
mod tail;

pub use self::body_workers::BodyWorkers;
pub use self::state::{AppState, Target};
pub use self::tail::LiveTails;

/// Largest upstream answer to a push read before answering the sender.
const PUSH_ANSWER_LIMIT: usize = 1024 * 1024;

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
    peer: Peer,
    mut request: Request<Incoming>,
) -> Result<Response<CaughtBody<ProxyBody>>, Infallible> {
    let started = Instant::now();
    // Before anything could print the request: no Debug output or trace shows it.
    if let Some(value) = request.headers_mut().get_mut(header::AUTHORIZATION) {
        value.set_sensitive(true);
    }
    let method = request.method().clone();
    // The TCP peer, or the client a trusted proxy in front names.
    let client = state
        .trusted_proxies
        .client(peer.address.ip(), request.headers());
    let mut outcome = Outcome::default();
    let span = state
        .tracing
        .as_ref()
        .map(|tracing| tracing.start_request(&method, request.headers()));
    let entered = state.admission.enter();
    let result = match &entered {
        Ok(_) => {
            let handled = proxy(
                &state,
                (&peer, client),
                request,
                &mut outcome,
                span.as_ref(),
            );
            panics::caught(handled).await.unwrap_or_else(|| {
                Err(ProxyError::Internal(
                    "the request's handling failed unexpectedly".into(),
                ))
            })
        }
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
            // Per tenant: its data is lost until its sender speaks 1.0.
            if let (ProxyError::RemoteWriteUnconfirmed, Some(tenant)) = (&error, outcome.tenant()) {
                state
                    .metrics
                    .remote_write_unconfirmed
                    .get_or_create(&TenantLabels {
                        tenant: tenant.to_owned(),
                    })
                    .inc();
            }
            if let Some(limit) = error.global_limit() {
                state.metrics.count_limited(None, outcome.surface, limit);
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
        client = %AddressText(client),
        status = status.as_u16(),
        // Whole microseconds: `0.052`, not `0.052364999999999995`.
        duration_ms = started.elapsed().as_micros() as f64 / 1000.0,
    );
    let Some(span) = span else {
        return Ok(response.map(panics::caught_body));
    };
    let span_end = span.record(
        outcome.path.as_deref(),
        outcome.surface,
        outcome.tenant(),
        status,
        failure,
    );
    Ok(response.map(|body| panics::caught_body(body::holding(body, span_end))))
}

/// `(peer, client)`: the TCP peer (appended to `X-Forwarded-For`), and the
/// client it stands for (throttled by address).
async fn proxy(
    state: &AppState,
    (peer, client): (&Peer, IpAddr),
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
    // Kept once, in the outcome, and borrowed from there: every clone of
    // the `Arc` is a write to a count the other workers' requests of the
    // same tenant write too.
    let credential: &Arc<Credential> = outcome
        .credential
        .insert(authenticate(state, &store, &request, client).await?);
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
        Some(selector) if target.enforces_label_policy => {
            if !route.loki_applies_label_policy() {
                return Err(ProxyError::SelectorNotEnforceable);
            }
            Some(headers::label_policy(
                credential.tenant.id.as_str(),
                selector.as_str(),
            ))
        }
        Some(_) if target.tenant_label.is_some() => None,
        Some(_) => return Err(ProxyError::SelectorNotEnforceable),
    };
    if route.operation == Operation::EmptyMetadata {
        return Ok(json_response(EMPTY_METADATA));
    }
    let upgrade = match route.operation {
        Operation::Tail => tail::websocket_upgrade(&request),
        _ => None,
    };
    let client_upgrade = upgrade.as_ref().map(|_| hyper::upgrade::on(&mut request));
    // Hop-by-hop headers, and any the client's `Connection` names, were for
    // this proxy alone (the credential in them is read above): gone before
    // the body is checked by them, so the upstream reads it by the same
    // headers, and so no header set below (Content-Type, Content-Encoding,
    // Content-Length of a rewritten body) can be named away after it is set.
    upstream::strip_hop_by_hop(request.headers_mut());

    let (mut parts, body) = request.into_parts();
    let body = body::guarded(body, state.limits.body_read_timeout, meter, &peer.uncounted);
    if declared_length(&parts.headers).is_some_and(|len| len > state.limits.max_body_bytes) {
        return Err(ProxyError::BodyTooLarge {
            limit: state.limits.max_body_bytes,
        });
    }
    // A remote write the sender meant as 2.0, rewritten or passed through
    // unread (header mode: every metrics push there is a remote write):
    // decides how the answer is judged.
    let mut remote_write_v2 = route.signal == Signal::Metrics
        && route.operation == Operation::Push
        && remote_write::sender_expects_v2(&parts.headers);
    let (query, body) = match route.operation {
        Operation::Enforce(selectors) => {
            let matcher = target.tenant_matcher(credential)?;
            let (received, _) = state.read_whole(body).await?;
            let (query, bytes) = prometheus::rewrite_request(
                &mut parts,
                &received,
                selectors,
                matcher,
                &state.memo,
            )?;
            (Query::Rewritten(query), held_read(&mut parts, bytes))
        }
        Operation::RemoteWrite => {
            let (body, version) =
                push::remote_write(state, target, &credential.tenant, &mut parts, body).await?;
            remote_write_v2 = version == remote_write::Version::V2;
            (Query::AsReceived, body)
        }
        Operation::Alertmanager(call) => {
            let tenant = target.alerts_tenant(&credential.tenant)?;
            // Boxed: its state is the largest of these, and every other
            // request's future would otherwise be as large.
            let (query, body) = Box::pin(alerts::request(
                state, target, call, path, &mut parts, body, &tenant,
            ))
            .await?;
            (Query::Rewritten(query), body)
        }
        Operation::OtlpMetrics => {
            let body =
                push::otlp_metrics(state, target, &credential.tenant, &mut parts, body).await?;
            (Query::AsReceived, body)
        }
        Operation::RuleGroup => {
            // Loki's route, held to the label the metrics are scoped by.
            let metrics = state.metrics_target.as_ref().ok_or_else(|| {
                ProxyError::Internal("a rule group route without label mode".into())
            })?;
            let tenant = metrics.remote_write_label(&credential.tenant)?;
            let body = rules::rule_group(state, &tenant, &mut parts, body).await?;
            (Query::AsReceived, body)
        }
        Operation::FederatedRuleGroup => {
            let tenant = credential.tenant.id.as_str();
            let body = rules::federated_rule_group(state, tenant, &mut parts, body).await?;
            (Query::AsReceived, body)
        }
        _ if label_policy.is_some() => {
            let label_names_of = credential
                .selector
                .as_ref()
                .filter(|_| route.pattern == routes::LOKI_LABEL_NAMES);
            let (received, _) = state.read_whole(body).await?;
            let query = label_policy::parameters_in_url(&mut parts, &received, label_names_of)?;
            (Query::Rewritten(query), held_read(&mut parts, Bytes::new()))
        }
        // Most queries have no body: not boxed, nothing to limit.
        _ if body.is_end_stream() => (Query::AsReceived, body::empty()),
        // A query posted as a form (Grafana's data sources post theirs):
        // read whole, so that it too can be sent again after an idle close.
        _ if route.scope.is_read() => {
            let (bytes, _) = state.read_whole(body).await?;
            (Query::AsReceived, held_read(&mut parts, bytes))
        }
        _ => {
            let limited = Limited::new(body, state.limits.max_body_bytes as usize);
            (
                Query::AsReceived,
                limited.map_err(Into::into).boxed_unsync(),
            )
        }
    };
    if let Operation::Filter(_) | Operation::Alertmanager(_) = route.operation {
        // The response is parsed to be filtered: ask for it uncompressed.
        parts.headers.remove(header::ACCEPT_ENCODING);
    }
    let query = match (route.operation, query) {
        (Operation::Filter(ResponseFilter::Rules), _) => {
            Query::Rewritten(prometheus::unpaged_rules_query(parts.uri.query()))
        }
        (_, query) => query,
    };
    let upstream = target.upstream_for(route.operation);
    let query = match &query {
        Query::AsReceived => parts.uri.query(),
        Query::Rewritten(query) => query.as_deref(),
    };
    parts.uri = upstream
        .uri_reusing(target.upstream_path(route, path), query, &parts.uri)
        .map_err(|e| ProxyError::Internal(format!("cannot build upstream URI: {e}")))?;
    parts.version = http::Version::HTTP_11;
    upstream::prepare_request_headers(
        &mut parts.headers,
        peer,
        upstream.host.as_ref(),
        target
            .tenant_header
            .as_ref()
            .map(|name| (name, credential.tenant.header_value())),
        upgrade,
    )?;
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
        .observe(route.surface(), sent.elapsed().as_secs_f64());

    if let (Some(client_upgrade), StatusCode::SWITCHING_PROTOCOLS) =
        (client_upgrade, response.status())
    {
        // The tail counts against the tenant's concurrency for as long as
        // it streams, not just until its 101.
        let held = outcome.admitted.take();
        let grant = tail::Grant {
            tenants: state.tenants.clone(),
            credential: credential.clone(),
            scope: route.scope,
        };
        tail::splice_upgraded(
            client_upgrade,
            hyper::upgrade::on(&mut response),
            held,
            grant,
            &state.tails,
            state.metrics.clone(),
        );
        let (parts, _) = response.into_parts();
        return Ok(Response::from_parts(parts, body::empty()));
    }

    let (mut parts, body) = response.into_parts();
    upstream::strip_hop_by_hop(&mut parts.headers);
    if remote_write_v2
        && parts.status.is_success()
        && !headers::confirms_remote_write_2(&parts.headers)
    {
        // Per the 2.0 spec the sender should treat this as 415 itself (as
        // Prometheus does); saying so keeps a sender that does not check
        // from counting samples as sent that nothing stored.
        return Err(ProxyError::RemoteWriteUnconfirmed);
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
        let answer = alerts::answer(state, call, &parts.headers, body, &tenant).await?;
        parts.headers.remove(header::CONTENT_LENGTH);
        return Ok(Response::from_parts(parts, body::full(answer)));
    }
    if let (Operation::Filter(filter), StatusCode::OK) = (route.operation, parts.status) {
        prometheus::refuse_compressed(&parts.headers)?;
        let matcher = target.tenant_matcher(credential)?;
        let answer = prometheus::read_filtered_response(body).await?;
        let (matcher, size) = (matcher.clone(), answer.len());
        let step = move || prometheus::filter_document(&answer, filter, &matcher);
        let filtered = state.body_workers.run(size, step).await??;
        parts.headers.remove(header::CONTENT_LENGTH);
        return Ok(Response::from_parts(parts, body::full(filtered)));
    }
    Ok(Response::from_parts(
        parts,
        body.map_err(Into::into).boxed_unsync(),
    ))
}

/// The query string the upstream gets.
enum Query {
    /// The client's, as it stands in the request (unread, not copied).
    AsReceived,
    /// One the proxy wrote (`None`: no query string).
    Rewritten(Option<String>),
}

/// The body of a read the proxy holds whole. A `POST` is marked so that
/// the upstream client may send it again after an idle close, as it does a
/// bodiless `GET` (`upstream::ReadWithBody`); a `GET` needs no mark, and
/// gets none, which would cost it two allocations.
fn held_read(parts: &mut http::request::Parts, bytes: Bytes) -> ProxyBody {
    if parts.method == http::Method::POST {
        parts
            .extensions
            .insert(upstream::ReadWithBody(bytes.clone()));
    }
    body::full(bytes)
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
    client: IpAddr,
) -> Result<Arc<Credential>, ProxyError> {
    state
        .auth
        .authenticate(store, request.headers(), client)
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
