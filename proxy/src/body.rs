//! The one body type the proxy hands to hyper, in both directions.

use bytes::Bytes;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Empty, Full, Limited};

use crate::error::ProxyError;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

pub fn empty() -> ProxyBody {
    Empty::new().map_err(|never| match never {}).boxed_unsync()
}

/// Reads a whole request body, at most `limit` bytes (413 above).
pub async fn read_bounded<B>(body: B, limit: u64) -> Result<Bytes, ProxyError>
where
    B: hyper::body::Body,
    B::Error: Into<BoxError>,
{
    match Limited::new(body, limit as usize).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            Err(ProxyError::BodyTooLarge { limit })
        }
        Err(e) => Err(ProxyError::BadData(format!(
            "cannot read the request body: {e}"
        ))),
    }
}
