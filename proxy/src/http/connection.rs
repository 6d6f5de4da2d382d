//! A client connection as the server drives it: plain TCP or TLS, marked
//! whenever bytes move either way, so that a connection quiet for too long
//! can be told to finish.
//!
//! hyper closes an HTTP/1.1 connection whose request head does not arrive
//! in time (`limits.header_read_timeout`), but it has no such clock for a
//! connection that has not yet shown which protocol it speaks (it waits for
//! the first bytes to tell HTTP/2's preface from HTTP/1.1) nor for an
//! HTTP/2 connection between requests. Left alone, a client could hold
//! either open for ever, one file descriptor each, without credentials.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

/// What a client connected over: one type for both, so the server builds
/// one kind of connection.
pub enum Transport {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// A stream that notes when bytes move (the server's: `Marked<Transport>`).
pub struct Marked<S> {
    stream: S,
    moved: Arc<AtomicBool>,
}

/// Tells when a [`Marked`] stream has been quiet for a while.
pub struct Quiet(Arc<AtomicBool>);

impl<S> Marked<S> {
    pub fn new(stream: S) -> (Self, Quiet) {
        let moved = Arc::new(AtomicBool::new(false));
        let quiet = Quiet(moved.clone());
        (Self { stream, moved }, quiet)
    }

    fn note(&self, moved: bool) {
        if moved {
            // Written and read on the connection's own task only: no
            // ordering with anything else is needed.
            self.moved.store(true, Ordering::Relaxed);
        }
    }
}

impl Quiet {
    /// Resolves once a whole `period` has passed without a byte read or
    /// written: between one and two periods after the last one (the clock
    /// is looked at once a period, so that moving bytes costs no timer).
    pub async fn for_a_whole(&self, period: Duration) {
        loop {
            tokio::time::sleep(period).await;
            if !self.0.swap(false, Ordering::Relaxed) {
                return;
            }
        }
    }
}

// === impl AsyncRead, AsyncWrite for Marked ===

impl<S: AsyncRead + Unpin> AsyncRead for Marked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.stream).poll_read(cx, buf);
        self.note(matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() > before);
        read
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Marked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.note(matches!(written, Poll::Ready(Ok(n)) if n > 0));
        written
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.note(matches!(written, Poll::Ready(Ok(n)) if n > 0));
        written
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

// === impl AsyncRead, AsyncWrite for Transport ===

macro_rules! on_transport {
    ($self:expr, $stream:ident => $call:expr) => {
        match $self {
            Transport::Plain($stream) => $call,
            Transport::Tls($stream) => $call,
        }
    };
}

impl AsyncRead for Transport {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        on_transport!(self.get_mut(), s => Pin::new(s).poll_read(cx, buf))
    }
}

impl AsyncWrite for Transport {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        on_transport!(self.get_mut(), s => Pin::new(s).poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        on_transport!(self.get_mut(), s => Pin::new(s).poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        on_transport!(self, s => s.is_write_vectored())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        on_transport!(self.get_mut(), s => Pin::new(s).poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        on_transport!(self.get_mut(), s => Pin::new(s).poll_shutdown(cx))
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
    use tokio::time::Instant;

    use super::*;

    const PERIOD: Duration = Duration::from_secs(30);

    fn pair() -> (Marked<DuplexStream>, Quiet, DuplexStream) {
        let (server, client) = tokio::io::duplex(64);
        let (marked, quiet) = Marked::new(server);
        (marked, quiet, client)
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_connection_is_quiet_after_one_period() {
        let (_marked, quiet, _client) = pair();
        let started = Instant::now();
        quiet.for_a_whole(PERIOD).await;
        assert_eq!(started.elapsed(), PERIOD);
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_either_way_keep_it_from_being_quiet() {
        let (mut marked, quiet, mut client) = pair();
        let started = Instant::now();
        let traffic = async {
            let mut one = [0; 1];
            // In at 20 s (seen by the look at 30 s), out at 50 s (seen at
            // 60 s); nothing after, so quiet at the look at 90 s.
            tokio::time::sleep(Duration::from_secs(20)).await;
            client.write_all(b"x").await.unwrap();
            marked.read_exact(&mut one).await.unwrap();
            tokio::time::sleep(Duration::from_secs(30)).await;
            marked.write_all(b"y").await.unwrap();
            client.read_exact(&mut one).await.unwrap();
        };
        tokio::join!(quiet.for_a_whole(PERIOD), traffic);
        assert_eq!(started.elapsed(), Duration::from_secs(90));
    }
}
