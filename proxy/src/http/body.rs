//! The one body type the proxy hands to hyper, in both directions.

use std::future::Future;
use std::pin::{pin, Pin};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Empty, Full};
use hyper::body::Frame;

use super::large_bodies::{AtTheBound, LargeBodyBytes, Uncounted, UncountedShare};
use crate::admission::ByteMeter;
use crate::ops::metrics::GaugeHeld;

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
    /// Its connection's share of bytes held uncounted, if it has bytes.
    share: Option<UncountedShare>,
}

pub fn guarded<B: hyper::body::Body>(
    inner: B,
    timeout: Duration,
    meter: Option<ByteMeter>,
    share: &UncountedShare,
) -> Guarded<B> {
    let has_bytes = !inner.is_end_stream();
    Guarded {
        inner,
        deadline: has_bytes.then(|| Box::pin(tokio::time::sleep(timeout))),
        meter,
        share: has_bytes.then(|| share.clone()),
    }
}

impl<B> Guarded<B> {
    /// Its connection's share of bytes held uncounted, if it has bytes.
    pub fn share(&self) -> Option<&UncountedShare> {
        self.share.as_ref()
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
    /// 503: the large bodies held (`large_bodies.rs`) leave no room for
    /// this one's bytes.
    #[error("too many bytes of large bodies held")]
    LargeBodiesHeld,
}

/// Reads a whole request body, at most `limit` bytes. Its bytes beyond
/// what its connection's `share` covers (none: every byte) are counted in
/// `large` as they arrive, and stay counted until the count returned with
/// it is dropped (a body worker takes it over); what it took of the share
/// is given back once it is read.
pub async fn read_held<B>(
    body: B,
    limit: u64,
    large: &LargeBodyBytes,
    share: Option<&UncountedShare>,
) -> Result<(Bytes, Option<GaugeHeld>), ReadError>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    if body.size_hint().lower() > limit {
        return Err(ReadError::TooLarge { limit });
    }
    let mut body = pin!(body);
    let (mut parts, mut received, mut counted) = (Vec::<Bytes>::new(), 0, None);
    let mut uncounted = Uncounted::of(share);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(broken)?;
        // Trailer fields never pass (`Guarded`).
        let Ok(data) = frame.into_data() else {
            continue;
        };
        received += data.len();
        if received as u64 > limit {
            return Err(ReadError::TooLarge { limit });
        }
        let beyond = received - uncounted.cover(received);
        if beyond > 0 {
            match large.hold_up_to(counted, beyond) {
                Ok(more) => counted = Some(more),
                Err(AtTheBound) => {
                    drop((parts, uncounted));
                    return Err(drained(body, received, limit).await);
                }
            }
        }
        if !data.is_empty() {
            parts.push(data);
        }
    }
    let whole = match parts.len() {
        0 => Bytes::new(),
        1 => parts.swap_remove(0),
        _ => {
            let mut whole = BytesMut::with_capacity(received);
            parts.iter().for_each(|part| whole.extend_from_slice(part));
            whole.freeze()
        }
    };
    Ok((whole, counted))
}

/// Why a body refused for the large bodies held, `received` bytes into
/// it, could not be read: [`ReadError::LargeBodiesHeld`] once the rest of
/// it (within `limit`) has arrived and been thrown away, holding nothing.
/// A refusal sent while the client still sends would end in a connection
/// closed with its bytes unread, which the client's kernel meets with a
/// reset: many clients then see a broken connection, not the 503 that
/// says when to send again. The body's deadline still bounds the wait.
async fn drained<B>(mut body: Pin<&mut B>, mut received: usize, limit: u64) -> ReadError
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => received += frame.data_ref().map_or(0, Bytes::len),
            Err(e) => return broken(e),
        }
        if received as u64 > limit {
            return ReadError::TooLarge { limit };
        }
    }
    ReadError::LargeBodiesHeld
}

fn broken(e: impl Into<BoxError>) -> ReadError {
    let e: BoxError = e.into();
    if e.is::<BodyTimeout>() {
        ReadError::Timeout
    } else {
        ReadError::Broken(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::large_bodies::COUNTED_FROM_BYTES;
    use futures_util::{poll, stream};
    use http_body_util::StreamBody;
    use prometheus_client::metrics::gauge::Gauge;

    /// A guarded body of a connection of its own, metered by no tenant.
    fn guarded_alone<B: hyper::body::Body>(inner: B, timeout: Duration) -> Guarded<B> {
        guarded(inner, timeout, None, &UncountedShare::default())
    }

    /// Reads a body with no bound on the large bodies held.
    async fn read<B>(body: B, limit: u64) -> Result<Bytes, ReadError>
    where
        B: hyper::body::Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        let unbounded = LargeBodyBytes::new(Gauge::default(), 0);
        Ok(read_held(body, limit, &unbounded, None).await?.0)
    }

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
        assert_eq!(read(body(), 6).await.unwrap(), &b"abcdef"[..]);
        assert_eq!(read(body(), 5).await, Err(ReadError::TooLarge { limit: 5 }));
    }

    #[tokio::test]
    async fn a_broken_body_is_told_apart_from_a_large_or_slow_one() {
        let broken = chunks(vec![Ok(b"abc"), Err("connection reset".into())]);
        assert_eq!(
            read(broken, 100).await,
            Err(ReadError::Broken("connection reset".into()))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_guarded_body_that_stops_arriving_times_out_and_an_empty_one_never_does() {
        let stalled = StreamBody::new(stream::pending::<Result<Frame<Bytes>, BoxError>>());
        let guarded_stalled = guarded_alone(stalled, Duration::from_secs(5));
        // Time is paused and jumps to the next timer: a body without its
        // deadline fails here rather than hanging the test.
        let stalled = tokio::time::timeout(Duration::from_secs(60), read(guarded_stalled, 100));
        assert_eq!(stalled.await, Ok(Err(ReadError::Timeout)));
        let arrived = guarded_alone(chunks(vec![Ok(b"abc")]), Duration::from_secs(5));
        assert_eq!(read(arrived, 100).await.unwrap(), &b"abc"[..]);
        let nothing = guarded_alone(Empty::<Bytes>::new(), Duration::ZERO);
        assert!(hyper::body::Body::is_end_stream(&nothing));
        assert_eq!(read(nothing, 100).await.unwrap(), &b""[..]);
    }

    #[tokio::test]
    async fn a_guarded_body_passes_its_data_and_never_its_trailers() {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("x-scope-orgid", "team-b".parse().unwrap());
        let frames: Vec<Result<Frame<Bytes>, BoxError>> = vec![
            Ok(Frame::data(Bytes::from_static(b"abc"))),
            Ok(Frame::trailers(trailers)),
        ];
        let guarded = guarded_alone(
            StreamBody::new(stream::iter(frames)),
            Duration::from_secs(5),
        );
        let collected = guarded.collect().await.unwrap();
        assert_eq!(collected.trailers(), None);
        assert_eq!(collected.to_bytes(), &b"abc"[..]);
    }

    #[tokio::test]
    async fn a_guarded_body_keeps_the_inner_bodys_length_and_end() {
        let inner = full("abc");
        let guarded = guarded_alone(inner, Duration::from_secs(5));
        assert_eq!(hyper::body::Body::size_hint(&guarded).exact(), Some(3));
        assert!(!hyper::body::Body::is_end_stream(&guarded));
        assert_eq!(read(guarded, 3).await.unwrap(), &b"abc"[..]);
    }

    /// A body whose frames arrive as the test sends them.
    fn arriving() -> (
        tokio::sync::mpsc::UnboundedSender<Bytes>,
        impl hyper::body::Body<Data = Bytes, Error = BoxError>,
    ) {
        let (send, arriving) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
        let frames = stream::unfold(arriving, |mut arriving| async move {
            let data = arriving.recv().await?;
            Some((Ok::<_, BoxError>(Frame::data(data)), arriving))
        });
        (send, StreamBody::new(frames))
    }

    /// A body is counted from the moment its bytes go beyond its
    /// connection's share, while the rest arrives, and until the count
    /// returned with it is dropped; a small one never is. Past the bound, a
    /// body is refused as it arrives: what it held is given back at once,
    /// and the refusal waits for the rest of it, holding nothing, so that
    /// the client can read it.
    #[tokio::test]
    async fn a_body_is_counted_beyond_its_share_while_it_arrives_and_refused_past_the_bound() {
        let share = COUNTED_FROM_BYTES;
        let large = LargeBodyBytes::new(Gauge::default(), 3 * share as u64);
        let (send, body) = arriving();
        let connection = UncountedShare::default();
        let mut first = Box::pin(read_held(body, u64::MAX, &large, Some(&connection)));
        send.send(Bytes::from(vec![0; share])).unwrap();
        assert!(poll!(first.as_mut()).is_pending());
        assert_eq!(large.held(), 0, "within its connection's share");
        send.send(Bytes::from_static(b"a")).unwrap();
        assert!(poll!(first.as_mut()).is_pending());
        assert_eq!(large.held(), 1, "counted beyond it, as it arrives");

        let small = chunks(vec![Ok(&[0; 1000][..])]);
        let (_, counted) = read_held(small, u64::MAX, &large, Some(&UncountedShare::default()))
            .await
            .unwrap();
        assert!(counted.is_none(), "a small body is never counted");
        let two_parts = || {
            chunks(vec![
                Ok(&[1; COUNTED_FROM_BYTES]),
                Ok(&[2; COUNTED_FROM_BYTES]),
            ])
        };
        // No connection's share: every byte counts.
        let second = read_held(two_parts(), u64::MAX, &large, None).await;
        let (bytes, counted) = second.unwrap();
        assert_eq!(bytes.len(), 2 * share, "read whole, in one buffer");
        assert_eq!(bytes[..share], [1; COUNTED_FROM_BYTES]);
        assert_eq!(large.held(), 2 * share as i64 + 1);

        let (send_refused, body) = arriving();
        // Its end comes at the body limit itself, which it may reach.
        let mut refused = Box::pin(read_held(body, 2 * share as u64, &large, None));
        send_refused.send(Bytes::from(vec![0; share])).unwrap();
        assert!(poll!(refused.as_mut()).is_pending(), "the rest awaited");
        assert_eq!(large.held(), 2 * share as i64 + 1, "nothing held");
        send_refused.send(Bytes::from(vec![0; share])).unwrap();
        drop(send_refused);
        assert_eq!(refused.await.unwrap_err(), ReadError::LargeBodiesHeld);
        let over_the_limit = read_held(two_parts(), share as u64 + 1, &large, None);
        let over_the_limit = over_the_limit.await.unwrap_err();
        assert_eq!(
            over_the_limit,
            ReadError::TooLarge {
                limit: share as u64 + 1
            }
        );
        drop(counted);

        send.send(Bytes::from(vec![0; share])).unwrap();
        drop(send);
        let (bytes, counted) = first.await.unwrap();
        assert_eq!(bytes.len(), 2 * share + 1);
        assert_eq!(large.held(), share as i64 + 1);
        drop(counted);
        assert_eq!(large.held(), 0);
    }

    /// The bodies of one connection share what it may hold uncounted
    /// (HTTP/2's streams): the second counts from its first byte while the
    /// first holds the share, and a body read gives its part back.
    #[tokio::test]
    async fn bodies_of_one_connection_share_what_it_holds_uncounted() {
        let large = LargeBodyBytes::new(Gauge::default(), 0);
        let connection = UncountedShare::default();
        let (send, body) = arriving();
        let mut first = Box::pin(read_held(body, u64::MAX, &large, Some(&connection)));
        send.send(Bytes::from(vec![0; COUNTED_FROM_BYTES - 100]))
            .unwrap();
        assert!(poll!(first.as_mut()).is_pending());
        assert_eq!(large.held(), 0);

        let (send_second, body) = arriving();
        let mut second = Box::pin(read_held(body, u64::MAX, &large, Some(&connection)));
        send_second.send(Bytes::from(vec![0; 1000])).unwrap();
        assert!(poll!(second.as_mut()).is_pending());
        assert_eq!(large.held(), 900, "the 100 bytes left uncounted");
        let elsewhere = chunks(vec![Ok(&[0; 1000][..])]);
        let other_connection = UncountedShare::default();
        let (_, counted) = read_held(elsewhere, u64::MAX, &large, Some(&other_connection))
            .await
            .unwrap();
        assert!(counted.is_none(), "another connection has its own");

        drop(send);
        let (_, counted) = first.await.unwrap();
        assert!(counted.is_none());
        send_second.send(Bytes::from(vec![0; 1000])).unwrap();
        drop(send_second);
        let (bytes, counted) = second.await.unwrap();
        assert_eq!(bytes.len(), 2000);
        assert_eq!(large.held(), 900, "the share given back covers the rest");
        drop(counted);
        assert_eq!(large.held(), 0);
        let whole = vec![Ok(&[0; COUNTED_FROM_BYTES][..])];
        let (_, counted) = read_held(chunks(whole), u64::MAX, &large, Some(&connection))
            .await
            .unwrap();
        assert!(counted.is_none(), "all of the share back");
    }
}
