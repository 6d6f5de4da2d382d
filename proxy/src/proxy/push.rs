//! Label mode's push bodies (remote write, OTLP metrics): read whole,
//! checked and rewritten for the tenant (a large one on a body worker,
//! `body_workers.rs`), counted, and forwarded with the headers that say
//! what was checked.

use std::sync::Arc;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use hyper::body::Incoming;

use super::body_workers::{BodySize, LARGE_INFLATED_BYTES};
use super::state::{AppState, Target};
use crate::config::OtlpForwardEncoding;
use crate::enforce::otlp;
use crate::enforce::remote_write::{self, RemoteWriteError};
use crate::enforce::tenant_label::{OwnedTenantLabel, TenantLabel};
use crate::enforce::Rewritten;
use crate::http::body::{self, ProxyBody};
use crate::http::error::ProxyError;
use crate::ops::metrics::{Metrics, TenantActionLabels, TenantLabels};
use crate::tenants::Tenant;

/// Remote write: reads the body whole, checks and rewrites it for the
/// tenant, and sets the headers a receiver decodes it by. Returns the body
/// to forward and the version it was checked as.
pub(super) async fn remote_write(
    state: &AppState,
    target: &Target,
    tenant: &Tenant,
    parts: &mut http::request::Parts,
    body: body::Guarded<Incoming>,
) -> Result<(ProxyBody, remote_write::Version), ProxyError> {
    let (compressed, counted) = state.read_whole(body).await?;
    let tenant = OwnedTenantLabel::of(&target.remote_write_label(tenant)?);
    let version = remote_write::read_headers(&parts.headers);
    let (metrics, max) = (state.metrics.clone(), state.limits.max_decompressed_bytes);
    let output = target.pushes.remote_write_forward;
    let received = compressed.clone();
    let size = BodySize {
        received: compressed.len(),
        inflates_to: remote_write::declared_size(&compressed),
    };
    let step =
        move || rewrite_remote_write(&metrics, (max, output), version, &received, &tenant.view());
    let (version, rewritten) = state.body_workers.run_held(size, counted, step).await??;
    let rewritten = match rewritten {
        Rewritten::Unchanged => compressed,
        Rewritten::Body(body) => Bytes::from(body),
    };
    // The receiver decodes by these: they say what was checked.
    remote_write::set_upstream_headers(version, &mut parts.headers);
    set_length(parts, &rewritten);
    Ok((body::full(rewritten), version))
}

/// OTLP metrics: reads the body whole, checks and rewrites it for the
/// tenant, and forwards it in the configured encoding (a body left as it
/// came keeps the sender's).
pub(super) async fn otlp_metrics(
    state: &AppState,
    target: &Target,
    tenant: &Tenant,
    parts: &mut http::request::Parts,
    body: body::Guarded<Incoming>,
) -> Result<ProxyBody, ProxyError> {
    let tenant = Arc::new(OwnedTenantLabel::of(&target.remote_write_label(tenant)?));
    let encoding = otlp::read_headers(&parts.headers)
        .map_err(|e| refused_otlp(&state.metrics, &tenant.view(), e))?;
    let (received, counted) = state.read_whole(body).await?;
    let forward = match target.pushes.otlp_forward {
        OtlpForwardEncoding::AsReceived => encoding,
        OtlpForwardEncoding::Identity => otlp::Encoding::Identity,
    };
    let max = state.limits.max_decompressed_bytes;
    let attempt = |inflate_limit| {
        let (metrics, body, tenant) = (state.metrics.clone(), received.clone(), tenant.clone());
        let limits = (inflate_limit, max);
        move || rewrite_otlp(&metrics, limits, (encoding, forward), &body, &tenant.view())
    };
    let size = BodySize {
        received: received.len(),
        inflates_to: encoding.inflated_size_hint(&received, max),
    };
    // In place, a body inflates at most to the body workers' threshold:
    // the size gzip's trailer gives is only the sender's word, and a body
    // that inflates further is checked on a body worker after all.
    let in_place_limit = if size.is_large() {
        max
    } else {
        max.min(LARGE_INFLATED_BYTES)
    };
    let checked = match state
        .body_workers
        .run_held(size, counted, attempt(in_place_limit))
        .await??
    {
        Some(checked) => checked,
        None => {
            let larger = BodySize {
                inflates_to: max,
                ..size
            };
            (state.body_workers.run(larger, attempt(max)).await??).ok_or_else(|| {
                ProxyError::Internal("an OTLP body inflated past its limit".into())
            })?
        }
    };
    let (rewritten, sent_as) = match checked {
        Rewritten::Unchanged => (received, encoding),
        Rewritten::Body(body) => (Bytes::from(body), forward),
    };
    otlp::set_upstream_headers(sent_as, &mut parts.headers);
    set_length(parts, &rewritten);
    Ok(body::full(rewritten))
}

fn set_length(parts: &mut http::request::Parts, body: &[u8]) {
    parts
        .headers
        .insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
}

/// Rewrites a remote-write body of the `version` its request declares
/// for the tenant and counts what happened. `(max, output)`: how far the
/// body may decompress, and how the rewritten one is written.
fn rewrite_remote_write(
    metrics: &Metrics,
    (max, output): (u64, remote_write::Output),
    version: Result<remote_write::Version, RemoteWriteError>,
    compressed: &[u8],
    tenant: &TenantLabel<'_>,
) -> Result<(remote_write::Version, Rewritten), ProxyError> {
    let tenant_id = || TenantLabels {
        tenant: tenant.owned_by.to_owned(),
    };
    metrics
        .remote_write_bytes
        .get_or_create(&tenant_id())
        .inc_by(compressed.len() as u64);
    let rewritten = version.and_then(|version| {
        let (body, stats) = remote_write::rewrite_body(version, compressed, tenant, max, output)?;
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
/// `(inflate_limit, max)`: how far the body may inflate here, and the
/// limit's own bound; a body that inflates past the first while the limit
/// allows more is `None`, counted nowhere yet, to be checked where it can
/// take longer. `(received, forward)`: the request's encoding, and a
/// rewritten body's.
fn rewrite_otlp(
    metrics: &Metrics,
    (inflate_limit, max): (u64, u64),
    (encoding, forward): (otlp::Encoding, otlp::Encoding),
    received: &[u8],
    tenant: &TenantLabel<'_>,
) -> Result<Option<Rewritten>, ProxyError> {
    let rewritten = otlp::rewrite_body(encoding, forward, received, tenant, inflate_limit);
    if let Err(otlp::OtlpError::TooLarge { limit }) = rewritten {
        if limit < max {
            return Ok(None);
        }
    }
    let tenant_id = TenantLabels {
        tenant: tenant.owned_by.to_owned(),
    };
    metrics
        .otlp_received_bytes
        .get_or_create(&tenant_id)
        .inc_by(received.len() as u64);
    let (body, stats) = rewritten.map_err(|e| refused_otlp(metrics, tenant, e))?;
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
    if stats.dropped_fields > 0 {
        metrics
            .otlp_dropped_fields
            .get_or_create(&tenant_id)
            .inc_by(stats.dropped_fields);
    }
    Ok(Some(body))
}

/// Counts a refused OTLP metrics request and says why.
fn refused_otlp(metrics: &Metrics, tenant: &TenantLabel<'_>, error: otlp::OtlpError) -> ProxyError {
    let tenant = tenant.owned_by.to_owned();
    match &error {
        otlp::OtlpError::ForeignLabel(_) => {
            let labels = TenantActionLabels {
                tenant,
                action: "rejected",
            };
            metrics.otlp_tenant_label.get_or_create(&labels).inc();
        }
        // Counted by the error's own label, not as the sender's.
        otlp::OtlpError::Compress(_) => {}
        _ => {
            let labels = TenantLabels { tenant };
            metrics.otlp_decode_errors.get_or_create(&labels).inc();
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

#[cfg(test)]
mod tests {
    use http::StatusCode;

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
