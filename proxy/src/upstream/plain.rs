//! A bodiless `GET` to an `http://` upstream, written and read by hand:
//! the request is one buffer written at once, the answer is read by
//! `answer.rs` straight from the socket. The Loki path is almost only
//! these, and hyper's client machinery was a third of its cost
//! (docs/benchmarks.md, "A client of our own for plain `GET`s").
//! Everything else (bodies, TLS, protocol switches) goes through hyper.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header;
use http::{Method, Request, Response};
use hyper::body::{Body, Frame, SizeHint};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};

use super::answer::{AnswerError, AnswerReader, Event, Head};
use super::pool::{Key, Parkable, Pool};
use crate::http::body::ProxyBody;
use crate::http::unsent;

/// As hyper's connector had it.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Room kept free in a connection's buffer before each read.
const READ_ROOM: usize = 8 * 1024;

/// Why a plain exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum PlainError {
    #[error("cannot connect to the upstream: {0}")]
    Connect(#[source] io::Error),
    #[error("upstream connection failed: {0}")]
    Io(#[source] io::Error),
    #[error(transparent)]
    Answer(#[from] AnswerError),
}

impl PlainError {
    /// The connection ended before a byte of the answer came: a parked
    /// one the upstream closed as idle while the request was on its way.
    pub fn closed_before_answer(&self) -> bool {
        match self {
            Self::Answer(AnswerError::ClosedBeforeAnswer) => true,
            Self::Io(e) => connection_lost(e),
            _ => false,
        }
    }
}

/// Whether a read or write failed because the peer closed or reset the
/// connection (for hyper's connections too, `client.rs`).
pub fn connection_lost(error: &io::Error) -> bool {
    use io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset};
    matches!(
        error.kind(),
        ConnectionReset | ConnectionAborted | BrokenPipe
    )
}

/// The request as bytes, if it is one for this path: a `GET` without a
/// body to an `http://` upstream, in origin form (`prepare` in
/// `client.rs` has set `Host`). Header values cannot hold CR or LF
/// (`HeaderValue` refuses them), so the head is exactly what it says.
pub fn request_head(request: &Request<ProxyBody>, key: &Key) -> Option<Vec<u8>> {
    let plain = key.scheme == http::uri::Scheme::HTTP
        && request.method() == Method::GET
        && request.body().is_end_stream()
        && !request.headers().contains_key(header::UPGRADE);
    if !plain {
        return None;
    }
    let target = request.uri().path_and_query()?.as_str();
    let mut head = Vec::with_capacity(256 + target.len());
    head.extend_from_slice(b"GET ");
    head.extend_from_slice(target.as_bytes());
    head.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in request.headers() {
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    Some(head)
}

/// A plain connection: the socket, and what was read past the answer's
/// head (nothing, when parked).
pub struct PlainLink {
    stream: TcpStream,
    buf: BytesMut,
}

impl Parkable for PlainLink {
    /// Anything to read on a parked connection (its close, or bytes no
    /// request asked for) ends it; nothing to read is the only good news.
    fn usable(&mut self) -> bool {
        let mut probe = [0; 1];
        matches!(self.stream.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }
}

impl PlainLink {
    /// A new connection to the upstream; `receive_buffer` fixes its
    /// kernel receive buffer (`None`: the kernel sizes it).
    pub async fn connect(key: &Key, receive_buffer: Option<u32>) -> Result<Self, PlainError> {
        let host = key.authority.host();
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port = key.authority.port_u16().unwrap_or(80);
        let connecting = connect_tcp(host, port, receive_buffer);
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, connecting)
            .await
            .map_err(|_| PlainError::Connect(io::ErrorKind::TimedOut.into()))?
            .map_err(PlainError::Connect)?;
        stream.set_nodelay(true).map_err(PlainError::Connect)?;
        unsent::bound(&stream).map_err(PlainError::Connect)?;
        Ok(Self {
            stream,
            buf: BytesMut::with_capacity(READ_ROOM),
        })
    }

    /// Writes `head` and reads the answer's head.
    pub async fn exchange(&mut self, head: &[u8]) -> Result<(Head, AnswerReader), PlainError> {
        self.stream.write_all(head).await.map_err(PlainError::Io)?;
        let mut reader = AnswerReader::new();
        let mut closed = false;
        loop {
            match reader.next(&mut self.buf, closed)? {
                Some(Event::Head(head)) => return Ok((head, reader)),
                Some(_) => unreachable!("the head comes first"),
                None => closed = std::future::poll_fn(|cx| self.poll_fill(cx)).await? == 0,
            }
        }
    }

    /// Reads what the socket has into the buffer; `Ok(0)`: closed.
    /// Through `AsyncRead`, which takes a short read as the socket
    /// drained: the check when the connection is taken again then costs
    /// no system call (`try_read` on a socket not known readable).
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<Result<usize, PlainError>> {
        if self.buf.capacity() - self.buf.len() < READ_ROOM / 2 {
            self.buf.reserve(READ_ROOM);
        }
        tokio_util::io::poll_read_buf(Pin::new(&mut self.stream), cx, &mut self.buf)
            .map_err(PlainError::Io)
    }
}

/// Connects to the first of `host`'s addresses that answers, as
/// `TcpStream::connect` does, with the receive buffer set before the
/// handshake, where the window's scale is agreed.
async fn connect_tcp(host: &str, port: u16, receive_buffer: Option<u32>) -> io::Result<TcpStream> {
    let Some(bytes) = receive_buffer else {
        return TcpStream::connect((host, port)).await;
    };
    let mut failed = None;
    for address in tokio::net::lookup_host((host, port)).await? {
        let socket = match address {
            SocketAddr::V4(_) => TcpSocket::new_v4()?,
            SocketAddr::V6(_) => TcpSocket::new_v6()?,
        };
        socket.set_recv_buffer_size(bytes)?;
        match socket.connect(address).await {
            Ok(stream) => return Ok(stream),
            Err(e) => failed = Some(e),
        }
    }
    Err(failed.unwrap_or_else(|| {
        io::Error::new(io::ErrorKind::NotFound, format!("{host} has no address"))
    }))
}

/// The answer as a response whose body reads on from the connection,
/// which goes back to `pool` once the answer has ended and allows it.
/// The body holds the pool itself, not a `Weak`: upgrading and dropping
/// one are two more writes a request to a count every worker shares. A
/// pool its client has left (a reload) lives until its last body ends,
/// and the connections parked in it meanwhile close with it.
pub fn response(
    head: Head,
    link: PlainLink,
    reader: AnswerReader,
    key: Key,
    pool: Arc<Pool<PlainLink>>,
) -> Response<PlainBody> {
    let mut body = PlainBody {
        link: Some(link),
        reader,
        closed: false,
        key,
        pool,
    };
    // No body at all (204, 304, a length of 0): the server may never ask.
    body.finish_if_read();
    let mut response = Response::new(body);
    *response.status_mut() = head.status;
    *response.version_mut() = head.version;
    *response.headers_mut() = head.headers;
    response
}

pub struct PlainBody {
    /// `None` once the answer has ended (parked or closed).
    link: Option<PlainLink>,
    reader: AnswerReader,
    closed: bool,
    key: Key,
    pool: Arc<Pool<PlainLink>>,
}

impl PlainBody {
    /// Ends the answer if its announced length has been read, parking
    /// the connection if the answer allows.
    fn finish_if_read(&mut self) {
        let Some(link) = self.link.as_mut() else {
            return;
        };
        if !self.reader.has_read_length() {
            return;
        }
        let reusable = matches!(
            self.reader.next(&mut link.buf, false),
            Ok(Some(Event::End { reusable: true }))
        );
        self.end(reusable);
    }

    /// The answer is over: the connection goes back to the pool if it
    /// may carry another request, and is closed otherwise.
    fn end(&mut self, reusable: bool) {
        let link = self.link.take();
        if let (true, Some(link)) = (reusable, link) {
            self.pool.park(&self.key, link);
        }
    }
}

impl Body for PlainBody {
    type Data = Bytes;
    type Error = PlainError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, PlainError>>> {
        let this = self.get_mut();
        loop {
            let Some(link) = this.link.as_mut() else {
                return Poll::Ready(None);
            };
            match this.reader.next(&mut link.buf, this.closed) {
                Ok(Some(Event::Data(data))) => {
                    this.finish_if_read();
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Ok(Some(Event::End { reusable })) => {
                    this.end(reusable);
                    return Poll::Ready(None);
                }
                Ok(Some(Event::Head(_))) => unreachable!("one head an answer"),
                Ok(None) => match std::task::ready!(link.poll_fill(cx)) {
                    Ok(read) => this.closed = read == 0,
                    Err(e) => {
                        this.link = None;
                        return Poll::Ready(Some(Err(e)));
                    }
                },
                Err(e) => {
                    this.link = None;
                    return Poll::Ready(Some(Err(e.into())));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.link.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}
