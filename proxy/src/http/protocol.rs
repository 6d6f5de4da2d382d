//! Which HTTP a client speaks, told from its first bytes: HTTP/2 opens
//! with a fixed preface (RFC 9113, 3.4), anything else is HTTP/1.1.
//!
//! hyper-util's `auto` connection tells them apart the same way, but reads
//! at most the preface's 24 bytes and hands hyper those alone: hyper's
//! first read then ends inside the request head, and the next one grows
//! its 8 KiB buffer by reallocating it (about a tenth of what a new
//! connection costs the proxy in user space, docs/benchmarks.md). Here the
//! first read takes what has arrived, up to `FIRST_READ`, and hyper's
//! first read gets all of it: a request head that came in one segment is
//! parsed from one read.

use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What an HTTP/2 connection opens with.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The most the first read takes: beyond a request head, less than
/// hyper's first buffer (8 KiB), so hyper takes it in one read. It lands
/// on the stack and only what came is kept, so a connection that has not
/// spoken holds no buffer (a client can open many and say nothing).
const FIRST_READ: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Http1,
    Http2,
}

/// Reads until the protocol is known: the preface whole (HTTP/2), or a
/// byte that departs from it (HTTP/1.1; so does a connection closed
/// inside the preface, whose few bytes hyper then refuses). `None`: the
/// client closed the connection without sending a byte.
pub async fn sniff<S: AsyncRead + Unpin>(
    mut stream: S,
) -> io::Result<Option<(Protocol, Prefixed<S>)>> {
    let mut first = BytesMut::new();
    let protocol = loop {
        if read_kept(&mut stream, &mut first).await? == 0 {
            if first.is_empty() {
                return Ok(None);
            }
            break Protocol::Http1;
        }
        let seen = first.len().min(PREFACE.len());
        if first[..seen] != PREFACE[..seen] {
            break Protocol::Http1;
        }
        if seen == PREFACE.len() {
            break Protocol::Http2;
        }
    };
    Ok(Some((protocol, Prefixed { first, stream })))
}

/// One read of up to [`FIRST_READ`] bytes into a buffer on the stack, which
/// lives only while the stream is polled; `kept` grows by what came. While
/// the client says nothing, the waiting holds no memory of its own.
async fn read_kept<S: AsyncRead + Unpin>(stream: &mut S, kept: &mut BytesMut) -> io::Result<usize> {
    std::future::poll_fn(|cx| {
        let mut landing = [MaybeUninit::<u8>::uninit(); FIRST_READ];
        let mut read = ReadBuf::uninit(&mut landing);
        let polled = Pin::new(&mut *stream).poll_read(cx, &mut read);
        let came = read.filled();
        // Bytes that came are kept whatever the poll answered (a stream
        // that fills and says `Pending` breaks its contract; one that fills
        // and fails says so again on the next read).
        if !came.is_empty() {
            kept.extend_from_slice(came);
            return Poll::Ready(Ok(came.len()));
        }
        polled.map_ok(|()| 0)
    })
    .await
}

/// A stream whose reads yield the bytes the sniff read first, then the
/// stream's own. Writes go straight to the stream.
pub struct Prefixed<S> {
    /// Empty once read (its memory freed then: a connection may live long).
    first: BytesMut,
    stream: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.first.is_empty() {
            return Pin::new(&mut self.stream).poll_read(cx, buf);
        }
        let given = self.first.len().min(buf.remaining());
        buf.put_slice(&self.first[..given]);
        self.first.advance(given);
        if self.first.is_empty() {
            self.first = BytesMut::new();
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use tokio::io::AsyncReadExt;

    use super::*;

    /// A stream that yields one chunk a read, as a client's segments
    /// arrive, then the end (or, `waiting`, nothing more for ever, as a
    /// client waiting for its answer).
    struct Segments {
        chunks: VecDeque<&'static [u8]>,
        waiting: bool,
    }

    impl AsyncRead for Segments {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            match self.chunks.pop_front() {
                Some(segment) => {
                    let given = segment.len().min(buf.remaining());
                    buf.put_slice(&segment[..given]);
                    if given < segment.len() {
                        self.chunks.push_front(&segment[given..]);
                    }
                }
                None if self.waiting => return Poll::Pending,
                None => {}
            }
            Poll::Ready(Ok(()))
        }
    }

    fn segments(chunks: &[&'static [u8]]) -> Segments {
        Segments {
            chunks: chunks.iter().copied().collect(),
            waiting: false,
        }
    }

    async fn sniffed(chunks: &[&'static [u8]]) -> Option<(Protocol, Prefixed<Segments>)> {
        sniff(segments(chunks)).await.unwrap()
    }

    /// Everything the stream yields after the sniff.
    async fn rest(mut stream: Prefixed<Segments>) -> Vec<u8> {
        let mut all = Vec::new();
        stream.read_to_end(&mut all).await.unwrap();
        all
    }

    const HEAD: &[u8] = b"GET /loki/api/v1/labels HTTP/1.1\r\nHost: p\r\n\r\n";

    #[tokio::test]
    async fn a_request_head_is_http1_and_reaches_hyper_in_one_read() {
        let (protocol, mut stream) = sniffed(&[HEAD, b"next"]).await.unwrap();
        assert_eq!(protocol, Protocol::Http1);
        // hyper's first read, into its 8 KiB buffer: the whole head.
        let mut buffer = [0; 8192];
        let mut read = ReadBuf::new(&mut buffer);
        std::future::poll_fn(|cx| Pin::new(&mut stream).poll_read(cx, &mut read))
            .await
            .unwrap();
        assert_eq!(read.filled(), HEAD);
        assert_eq!(rest(stream).await, b"next");
    }

    #[test]
    fn waiting_for_the_first_byte_holds_no_buffer() {
        use futures_util::FutureExt;
        let mut waiting = Box::pin(sniff(Segments {
            waiting: true,
            ..segments(&[])
        }));
        assert!((&mut waiting).now_or_never().is_none(), "still waiting");
        // Neither a buffer in the waiting future itself ...
        let held = std::mem::size_of_val(&*waiting);
        assert!(held < FIRST_READ / 8, "the future holds {held} bytes");
        // ... nor one taken before the bytes came (next test).
    }

    #[tokio::test]
    async fn what_is_kept_is_what_came_not_a_whole_first_read() {
        let (_, stream) = sniffed(&[HEAD]).await.unwrap();
        assert_eq!(stream.first, HEAD);
        let capacity = stream.first.capacity();
        assert!(
            capacity < FIRST_READ / 8,
            "{capacity} bytes kept for {}",
            HEAD.len()
        );
    }

    #[tokio::test]
    async fn the_preface_in_pieces_is_http2_with_every_byte_kept() {
        let (protocol, stream) = sniffed(&[b"P", b"RI * HTTP/2.0\r", b"\n\r\nSM\r\n\r\n\0\0"])
            .await
            .unwrap();
        assert_eq!(protocol, Protocol::Http2);
        assert_eq!(rest(stream).await, [PREFACE, b"\0\0"].concat());
    }

    #[tokio::test]
    async fn bytes_that_leave_the_preface_are_http1() {
        for segments in [
            &[b"PRI * HTTP/1.1\r\n\r\n" as &[u8]][..],
            &[b"PRI", b" * HTTP/1.1\r\n\r\n"],
            &[b"G", b"ET / HTTP/1.1\r\n\r\n"],
        ] {
            let (protocol, stream) = sniffed(segments).await.unwrap();
            assert_eq!(protocol, Protocol::Http1, "{segments:?}");
            assert_eq!(rest(stream).await, segments.concat());
        }
    }

    #[test]
    fn a_head_shorter_than_the_preface_is_http1_without_waiting_for_more() {
        use futures_util::FutureExt;
        let short = b"GET / HTTP/1.1\r\n\r\n";
        assert!(short.len() < PREFACE.len());
        let waiting = Segments {
            waiting: true,
            ..segments(&[short])
        };
        let (protocol, _) = sniff(waiting)
            .now_or_never()
            .expect("told from the bytes that came")
            .unwrap()
            .unwrap();
        assert_eq!(protocol, Protocol::Http1);
    }

    #[tokio::test]
    async fn a_connection_closed_inside_the_preface_is_handed_on_as_http1() {
        let (protocol, stream) = sniffed(&[b"PRI * HTTP/2.0\r\n"]).await.unwrap();
        assert_eq!(protocol, Protocol::Http1);
        assert_eq!(rest(stream).await, b"PRI * HTTP/2.0\r\n");
    }

    #[tokio::test]
    async fn a_connection_closed_unspoken_is_nothing() {
        assert!(sniffed(&[]).await.is_none());
    }

    /// A stream that keeps its writes until flushed, as rustls keeps the
    /// records a full socket would not take.
    #[derive(Default)]
    struct Buffering {
        kept: Vec<u8>,
        flushed: Vec<u8>,
    }

    impl AsyncWrite for Buffering {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.kept.extend_from_slice(buf);
            Poll::Ready(Ok(buf.len()))
        }

        fn poll_flush(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            let kept = std::mem::take(&mut self.kept);
            self.flushed.extend_from_slice(&kept);
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// Over TLS a flush is what sends the end of an answer whose last
    /// write met a full socket; an in-memory pipe, which keeps nothing,
    /// cannot tell.
    #[tokio::test]
    async fn a_flush_reaches_a_stream_that_keeps_its_writes() {
        use tokio::io::AsyncWriteExt;
        let mut stream = Prefixed {
            first: BytesMut::new(),
            stream: Buffering::default(),
        };
        stream.write_all(b"the end of an answer").await.unwrap();
        assert!(stream.stream.flushed.is_empty());
        stream.flush().await.unwrap();
        assert_eq!(stream.stream.flushed, b"the end of an answer");
    }

    #[tokio::test]
    async fn writes_flushes_and_the_shutdown_reach_the_stream() {
        use tokio::io::AsyncWriteExt;
        let (server, mut client) = tokio::io::duplex(1024);
        client.write_all(HEAD).await.unwrap();
        let vectored = server.is_write_vectored();
        let (_, mut stream) = sniff(server).await.unwrap().unwrap();
        assert_eq!(stream.is_write_vectored(), vectored, "as the stream says");
        stream.write_all(b"HTTP/1.1 200 OK\r\n").await.unwrap();
        let parts = [io::IoSlice::new(b"a: b\r\n"), io::IoSlice::new(b"\r\n")];
        let written = stream.write_vectored(&parts).await.unwrap();
        assert!(written > 0);
        stream.flush().await.unwrap();
        stream.shutdown().await.unwrap();
        let mut seen = Vec::new();
        client.read_to_end(&mut seen).await.unwrap();
        assert_eq!(seen, b"HTTP/1.1 200 OK\r\na: b\r\n\r\n"[..17 + written]);
    }

    #[tokio::test]
    async fn the_first_read_is_bounded_and_the_rest_follows_in_order() {
        static LARGE: [u8; 3 * FIRST_READ] = {
            let mut bytes = [b'x'; 3 * FIRST_READ];
            bytes[3 * FIRST_READ - 1] = b'!';
            bytes
        };
        let (_, stream) = sniffed(&[&LARGE]).await.unwrap();
        assert_eq!(stream.first.len(), FIRST_READ);
        assert_eq!(rest(stream).await, LARGE);
    }
}
