//! The one body type the proxy hands to hyper, in both directions.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Empty, Full, Limited};
use hyper::body::Frame;

use crate::admission::ByteMeter;

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

/// A request body as the proxy lets it in: it must arrive in full before
/// `deadline` (a slow sender must not hold a connection and a backend
/// stream open), its bytes are charged to the tenant's push allowance
/// as they pass, if one applies, and trailer fields never pass: a reader
/// could take one for a header (Go's server hands them to the handler, in
/// `Request.Trailer`), and no API behind the proxy reads them.
pub struct Guarded<B> {
    inner: B,
    /// `None` for a body known to be empty (most queries): nothing to wait
    /// for, so no timer is set up and torn down for it.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    meter: Option<ByteMeter>,
}

pub fn guarded<B: hyper::body::Body>(
    inner: B,
    timeout: Duration,
    meter: Option<ByteMeter>,
) -> Guarded<B> {
    let deadline = (!inner.is_end_stream()).then(|| Box::pin(tokio::time::sleep(timeout)));
    Guarded {
        inner,
        deadline,
        meter,
    }
}

/// The body did not arrive in time.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive in time")]
pub struct BodyTimeout;

impl<B> hyper::body::Body for Guarded<B>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(deadline) = &mut this.deadline {
            if deadline.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Some(Err(Box::new(BodyTimeout))));
            }
        }
        loop {
            let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
            if let Some(Ok(frame)) = &frame {
                if frame.is_trailers() {
                    continue;
                }
                if let (Some(meter), Some(data)) = (&this.meter, frame.data_ref()) {
                    meter.charge(data.len());
                }
            }
            return Poll::Ready(frame.map(|result| result.map_err(Into::into)));
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// `body`, keeping `guard` alive until the body is done with (sent in full
/// or dropped).
pub fn holding<T: Send + 'static>(body: ProxyBody, guard: T) -> ProxyBody {
    body.map_frame(move |frame| {
        let _held = &guard;
        frame
    })
    .boxed_unsync()
}

/// Why a request body could not be read whole; `http::error` turns each
/// into its status (this module owns the body, that one the answers).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReadError {
    /// 413.
    #[error("request body over {limit} bytes")]
    TooLarge { limit: u64 },
    /// 408: the client stopped sending.
    #[error("request body not received in time")]
    Timeout,
    /// 400.
    #[error("cannot read the request body: {0}")]
    Broken(String),
}

/// Reads a whole request body, at most `limit` bytes.
pub async fn read_bounded<B>(body: B, limit: u64) -> Result<Bytes, ReadError>
where
    B: hyper::body::Body,
    B::Error: Into<BoxError>,
{
    match Limited::new(body, limit as usize).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(ReadError::TooLarge { limit }),
        Err(e) if e.is::<BodyTimeout>() => Err(ReadError::Timeout),
        Err(e) => Err(ReadError::Broken(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::stream;
    use http_body_util::StreamBody;

    fn chunks(
        parts: Vec<Result<&'static [u8], BoxError>>,
    ) -> impl hyper::body::Body<Data = Bytes, Error = BoxError> + Unpin {
        StreamBody::new(stream::iter(
            parts
                .into_iter()
                .map(|part| part.map(|bytes| Frame::data(Bytes::from_static(bytes)))),
        ))
    }

    #[tokio::test]
    async fn a_body_is_read_whole_up_to_its_limit_and_refused_beyond() {
        let body = || chunks(vec![Ok(b"abc"), Ok(b"def")]);
        assert_eq!(read_bounded(body(), 6).await.unwrap(), &b"abcdef"[..]);
        assert_eq!(
            read_bounded(body(), 5).await,
            Err(ReadError::TooLarge { limit: 5 })
        );
    }

    #[tokio::test]
    async fn a_broken_body_is_told_apart_from_a_large_or_slow_one() {
        let broken = chunks(vec![Ok(b"abc"), Err("connection reset".into())]);
        assert_eq!(
            read_bounded(broken, 100).await,
            Err(ReadError::Broken("connection reset".into()))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_guarded_body_that_stops_arriving_times_out_and_an_empty_one_never_does() {
        let stalled = StreamBody::new(stream::pending::<Result<Frame<Bytes>, BoxError>>());
        let guarded_stalled = guarded(stalled, Duration::from_secs(5), None);
        // Time is paused and jumps to the next timer: a body without its
        // deadline fails here rather than hanging the test.
        let read =
            tokio::time::timeout(Duration::from_secs(60), read_bounded(guarded_stalled, 100));
        assert_eq!(read.await, Ok(Err(ReadError::Timeout)));
        let arrived = guarded(chunks(vec![Ok(b"abc")]), Duration::from_secs(5), None);
        assert_eq!(read_bounded(arrived, 100).await.unwrap(), &b"abc"[..]);
        let nothing = guarded(Empty::<Bytes>::new(), Duration::ZERO, None);
        assert!(hyper::body::Body::is_end_stream(&nothing));
        assert_eq!(read_bounded(nothing, 100).await.unwrap(), &b""[..]);
    }

    #[tokio::test]
    async fn a_guarded_body_passes_its_data_and_never_its_trailers() {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("x-scope-orgid", "team-b".parse().unwrap());
        let frames: Vec<Result<Frame<Bytes>, BoxError>> = vec![
            Ok(Frame::data(Bytes::from_static(b"abc"))),
            Ok(Frame::trailers(trailers)),
        ];
        let guarded = guarded(
            StreamBody::new(stream::iter(frames)),
            Duration::from_secs(5),
            None,
        );
        let collected = guarded.collect().await.unwrap();
        assert_eq!(collected.trailers(), None);
        assert_eq!(collected.to_bytes(), &b"abc"[..]);
    }

    #[tokio::test]
    async fn a_guarded_body_keeps_the_inner_bodys_length_and_end() {
        let inner = full("abc");
        let guarded = guarded(inner, Duration::from_secs(5), None);
        assert_eq!(hyper::body::Body::size_hint(&guarded).exact(), Some(3));
        assert!(!hyper::body::Body::is_end_stream(&guarded));
        assert_eq!(read_bounded(guarded, 3).await.unwrap(), &b"abc"[..]);
    }
}
