//! Live tail: a WebSocket upgrade passed on, then both upgraded
//! connections spliced.

use http::header::{self, HeaderValue};
use http::Request;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use crate::admission::Admitted;

/// `Some(protocol)` for a WebSocket upgrade request (live tail).
pub(super) fn websocket_upgrade(request: &Request<Incoming>) -> Option<HeaderValue> {
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
pub(super) fn splice_upgraded(
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
