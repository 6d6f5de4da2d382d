//! The upstream client: HTTP/1.1 connections kept open between requests,
//! each driven by the task whose request it carries.
//!
//! Why not hyper-util's pooled client: it runs every upstream connection as
//! a task of its own, so a request crosses between two tasks several times
//! (the request, the answer's head, its body, readiness for the next one)
//! and pays a pool checkout, a spawned return-to-pool future and a connect
//! race besides. Here the task serving the client writes the request, reads
//! the answer and streams its body itself; an idle connection is parked
//! untouched and checked when it is taken again (docs/benchmarks.md, "A
//! client of our own").

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::{Arc, Weak};
use std::task::{ready, Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::header;
use http::{Method, Request, Response, Uri};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http1;
use hyper_rustls::{HttpsConnector, MaybeHttpsStream};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use prometheus_client::metrics::counter::Counter;
use tokio::net::TcpStream;
use tower_service::Service;

use super::plain::{self, PlainBody, PlainError, PlainLink};
use super::pool::{Key, Parkable, Pool};
use crate::http::body::{BoxError, ProxyBody};
use crate::http::headers;
use crate::http::unsent;

type Connection = http1::Connection<MaybeHttpsStream<TokioIo<TcpStream>>, ProxyBody>;

/// A client for the upstreams of one TLS setting. Cloning shares its
/// parked connections.
#[derive(Clone)]
pub struct HttpClient {
    shared: Arc<Shared>,
}

/// How upstream connections are kept between requests.
#[derive(Clone, Debug)]
pub struct Reuse {
    /// How long a parked connection may wait for its next request
    /// (`limits.upstream_idle_timeout`). Below the upstream's own idle
    /// timeout, the proxy, not the upstream, closes it, and no request
    /// meets a connection the upstream is closing.
    pub idle_timeout: Duration,
    /// A safe request through hyper (`HEAD` or `OPTIONS`, or a `GET` to
    /// an `https://` upstream, without a body; or a query posted as a
    /// form, [`ReadWithBody`]) sent on a connection parked
    /// at least this long is sent again on a new connection if that one
    /// closes before any answer: the upstream closed it as idle while the
    /// request was on its way (the race every keep-alive client has; Go's
    /// transport retries the same way). Connections reused sooner than
    /// this are not closed as idle, and the requests they carry are not
    /// copied. A plain `GET` (`plain.rs`) keeps its bytes anyway and is
    /// sent again whenever its reused connection closes so.
    pub replay_after_idle: Duration,
    /// Counts the requests sent again (`tenant_proxy_upstream_replays_total`):
    /// one that keeps rising says an upstream closes idle connections
    /// before the proxy does.
    pub replays: Counter,
}

impl Reuse {
    /// Parked up to `idle_timeout`; a safe request replayed after a second
    /// of idleness: far below any upstream's idle timeout, and above the
    /// microseconds between requests under load.
    pub fn new(idle_timeout: Duration, replays: Counter) -> Self {
        Self {
            idle_timeout,
            replay_after_idle: Duration::from_secs(1),
            replays,
        }
    }
}

struct Shared {
    connector: HttpsConnector<HttpConnector>,
    reuse: Reuse,
    /// Each new plain connection's kernel receive buffer, if fixed
    /// (`limits.upstream_receive_buffer_bytes`; the connector has its own).
    receive_buffer: Option<u32>,
    /// Idle connections driven by hyper's client, per upstream.
    parked: Pool<Box<Link>>,
    /// Idle plain connections of `GET`s read by hand (`plain.rs`).
    plain: Arc<Pool<PlainLink>>,
}

/// Why an upstream exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("upstream URI has no scheme or authority")]
    Uri,
    #[error("cannot connect to the upstream: {0}")]
    Connect(#[source] BoxError),
    #[error("upstream exchange failed: {0}")]
    Http(#[source] hyper::Error),
    #[error(transparent)]
    Plain(#[from] PlainError),
}

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpClient").finish_non_exhaustive()
    }
}

impl HttpClient {
    pub fn new(
        connector: HttpsConnector<HttpConnector>,
        reuse: Reuse,
        receive_buffer: Option<u32>,
    ) -> Self {
        let idle_timeout = reuse.idle_timeout;
        let shared = Arc::new(Shared {
            connector,
            reuse,
            receive_buffer,
            parked: Pool::new(),
            plain: Arc::new(Pool::new()),
        });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(close_expired(Arc::downgrade(&shared), idle_timeout));
        }
        Self { shared }
    }

    /// How this client keeps its connections.
    pub fn reuse(&self) -> Reuse {
        self.shared.reuse.clone()
    }

    /// The kernel receive buffer its connections get, if fixed.
    pub fn receive_buffer(&self) -> Option<u32> {
        self.shared.receive_buffer
    }

    /// Sends `request` (an absolute URI) and returns the answer once its
    /// head has arrived; the body streams from the same connection.
    pub async fn request(
        &self,
        mut request: Request<ProxyBody>,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        let key = Key::of(request.uri()).ok_or(UpstreamError::Uri)?;
        prepare(&mut request, &key);
        // The rare paths are boxed: their futures would otherwise make every
        // request's state, moved around with it, several times larger.
        if request.headers().contains_key(header::UPGRADE) {
            return Box::pin(self.upgrade(&key, request)).await;
        }
        if let Some(head) = plain::request_head(&request, &key) {
            return self.plain(key, head).await;
        }
        // Boxed as well: bodies and TLS are the paths that cost the most
        // anyway, and plain `GET`s (the Loki path) need not carry their state.
        Box::pin(self.through_hyper(key, request)).await
    }

    /// Any other request, over hyper's client: a parked connection, or a
    /// new one.
    async fn through_hyper(
        &self,
        key: Key,
        mut request: Request<ProxyBody>,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        // After a replay, only a new connection: the parked ones are as
        // old as the one the upstream just closed.
        let mut replayed = false;
        loop {
            let parked = match replayed {
                false => self.shared.take(&key),
                true => None,
            };
            let (mut link, idle) = match parked {
                Some((link, idle)) => (link, Some(idle)),
                None => (Box::pin(self.connect(&key)).await?, None),
            };
            let replay = match idle {
                Some(idle) if idle >= self.shared.reuse.replay_after_idle => replay_copy(&request),
                _ => None,
            };
            match link.exchange(request).await {
                Ok(response) => return Ok(self.shared.follow(key, link, response)),
                // A parked connection that closed before the request was
                // written: the request is intact, try it on another one.
                Err(mut failed) if idle.is_some() && failed.message().is_some() => {
                    request = failed.take_message().expect("checked above");
                }
                Err(failed) => match replay {
                    Some(copy) if closed_before_answer(failed.error()) => {
                        self.shared.sending_again(&key);
                        request = copy;
                        replayed = true;
                    }
                    _ => return Err(UpstreamError::Http(failed.into_error())),
                },
            }
        }
    }

    /// A bodiless `GET` over plain HTTP, written and read by hand
    /// (`plain.rs`). A parked connection that closes before a byte of the
    /// answer came (the upstream closed it as idle as the request went
    /// out) gets the request once more, on a new connection: a `GET` is
    /// safe to send again, and its bytes are still at hand.
    async fn plain(
        &self,
        key: Key,
        head: Vec<u8>,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        let mut replayed = false;
        loop {
            let parked = match replayed {
                false => self.shared.plain.take(&key, self.shared.reuse.idle_timeout),
                true => None,
            };
            let reused = parked.is_some();
            let mut link = match parked {
                Some((link, _)) => link,
                None => PlainLink::connect(&key, self.shared.receive_buffer).await?,
            };
            match link.exchange(&head).await {
                Ok((answer, reader)) => {
                    let pool = self.shared.plain.clone();
                    let response = plain::response(answer, link, reader, key, pool);
                    return Ok(response.map(|body| UpstreamBody {
                        kind: Kind::Plain(body),
                    }));
                }
                Err(e) if reused && !replayed && e.closed_before_answer() => {
                    self.shared.sending_again(&key);
                    replayed = true;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    async fn connect(&self, key: &Key) -> Result<Box<Link>, UpstreamError> {
        let (sender, connection) = self.open(key).await?;
        Ok(Box::new(Link {
            sender,
            connection: Some(connection),
        }))
    }

    async fn open(
        &self,
        key: &Key,
    ) -> Result<(http1::SendRequest<ProxyBody>, Connection), UpstreamError> {
        let io = self
            .shared
            .connector
            .clone()
            .call(key.origin())
            .await
            .map_err(UpstreamError::Connect)?;
        // A push the upstream reads slowly waits in the proxy (its body
        // read on only as the upstream takes it), not queued in the kernel.
        let tcp = match &io {
            MaybeHttpsStream::Http(tcp) => tcp.inner(),
            MaybeHttpsStream::Https(tls) => tls.inner().get_ref().0.inner().inner(),
        };
        let _ = unsent::bound(tcp);
        http1::handshake(io).await.map_err(UpstreamError::Http)
    }

    /// A protocol switch (Loki's live tail) takes a connection of its own,
    /// run as a task until the switch hands it over.
    async fn upgrade(
        &self,
        key: &Key,
        request: Request<ProxyBody>,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        let (mut sender, connection) = self.open(key).await?;
        tokio::spawn(async move {
            if let Err(e) = connection.with_upgrades().await {
                tracing::debug!(error = %e, "upstream connection for a protocol switch failed");
            }
        });
        let response = sender
            .send_request(request)
            .await
            .map_err(UpstreamError::Http)?;
        Ok(response.map(|incoming| UpstreamBody {
            kind: Kind::Hyper {
                incoming,
                link: None,
            },
        }))
    }
}

impl Key {
    fn origin(&self) -> Uri {
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query("/")
            .build()
            .expect("scheme and authority came from a URI")
    }
}

/// Puts the request in the form an origin server expects on HTTP/1.1: the
/// path and query on the request line, the authority in `Host` (without
/// the scheme's default port).
fn prepare(request: &mut Request<ProxyBody>, key: &Key) {
    if !request.headers().contains_key(header::HOST) {
        if let Some(host) = headers::host_value(&key.scheme, &key.authority) {
            request.headers_mut().insert(header::HOST, host);
        }
    }
    let path = request.uri().path_and_query().cloned();
    let mut parts = http::uri::Parts::default();
    parts.path_and_query = path;
    if let Ok(uri) = Uri::from_parts(parts) {
        *request.uri_mut() = uri;
    }
}

/// Marks a request whose route only reads although it carries a body (a
/// query posted as a form), with that whole body: the request may be sent
/// again as a bodiless `GET` may. Set by the proxy, never by a client:
/// extensions do not come off the wire.
#[derive(Clone, Debug)]
pub struct ReadWithBody(pub Bytes);

/// A copy of `request` to send again, if it is safe to: a method that
/// reads (RFC 9110 §9.2.1) and no body, or a read whose body is at hand
/// ([`ReadWithBody`]).
fn replay_copy(request: &Request<ProxyBody>) -> Option<Request<ProxyBody>> {
    let body = match request.extensions().get::<ReadWithBody>() {
        Some(ReadWithBody(bytes)) => crate::http::body::full(bytes.clone()),
        None => {
            let safe = matches!(
                *request.method(),
                Method::GET | Method::HEAD | Method::OPTIONS
            );
            if !safe || !request.body().is_end_stream() {
                return None;
            }
            crate::http::body::empty()
        }
    };
    let mut copy = Request::new(body);
    *copy.method_mut() = request.method().clone();
    *copy.uri_mut() = request.uri().clone();
    *copy.version_mut() = request.version();
    *copy.headers_mut() = request.headers().clone();
    Some(copy)
}

/// Whether an exchange failed because the connection closed (or was
/// reset) before the answer's head was read, rather than on what the
/// upstream sent.
fn closed_before_answer(error: &hyper::Error) -> bool {
    if error.is_incomplete_message() {
        return true;
    }
    let mut source = std::error::Error::source(error);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return plain::connection_lost(io);
        }
        source = e.source();
    }
    false
}

impl Shared {
    /// Counts a request about to go again on a new connection, its parked
    /// one having closed before answering.
    fn sending_again(&self, key: &Key) {
        tracing::debug!(
            upstream = %key.authority,
            "upstream closed an idle connection as a request went out; \
             sent again on a new connection"
        );
        self.reuse.replays.inc();
    }

    /// A parked connection to `key` that is still open and ready, if any,
    /// and how long it was parked.
    fn take(&self, key: &Key) -> Option<(Box<Link>, Duration)> {
        self.parked.take(key, self.reuse.idle_timeout)
    }

    /// Parks `link` for the next request to `key`.
    fn park(&self, key: &Key, link: Box<Link>) {
        if link.ended() || link.sender.is_closed() {
            return;
        }
        self.parked.park(key, link);
    }

    /// The answer, its body carrying the connection until it has been read
    /// through; an answer without a body frees the connection at once.
    /// The connection is parked as the last drive left it. That drive took
    /// in all it read (an answer's end, a `Connection: close` and the close
    /// that follows): a frame is only there once a drive has read it. What
    /// is left, turning idle for the next request, the drive that takes
    /// the connection out does (`usable`); driving it here too cost one
    /// drive a request for nothing (docs/benchmarks.md, "three drives
    /// fewer").
    fn follow(
        self: &Arc<Self>,
        key: Key,
        link: Box<Link>,
        response: Response<Incoming>,
    ) -> Response<UpstreamBody> {
        let link = if response.body().is_end_stream() {
            self.park(&key, link);
            None
        } else {
            Some(Following {
                link,
                key,
                shared: Arc::downgrade(self),
            })
        };
        response.map(|incoming| UpstreamBody {
            kind: Kind::Hyper { incoming, link },
        })
    }

    fn close_expired(&self) {
        self.parked.close_expired(self.reuse.idle_timeout);
        self.plain.close_expired(self.reuse.idle_timeout);
    }
}

/// Closes connections parked too long, so that an upstream that went
/// quiet does not keep sockets open; ends with the client.
async fn close_expired(shared: Weak<Shared>, idle_timeout: Duration) {
    let mut every = tokio::time::interval(sweep_period(idle_timeout));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        match shared.upgrade() {
            Some(shared) => shared.close_expired(),
            None => return,
        }
    }
}

/// How often parked connections are checked for expiry: a third of the
/// idle timeout, so none outlives it by more than that; at least a
/// millisecond, since a period of zero panics and the configuration
/// refuses only an idle timeout of zero.
fn sweep_period(idle_timeout: Duration) -> Duration {
    (idle_timeout / 3).max(Duration::from_millis(1))
}

impl Parkable for Box<Link> {
    fn usable(&mut self) -> bool {
        Link::usable(self)
    }
}

/// One upstream connection: where requests go in, and the I/O that moves
/// them, polled by whoever holds it. Boxed wherever it goes: it holds the
/// connection's buffers and state, too large to move by value on every
/// hand-over.
struct Link {
    sender: http1::SendRequest<ProxyBody>,
    /// `None` once the connection has finished (closed or failed): dropped
    /// at once, so that a request still queued on it comes back unsent.
    connection: Option<Connection>,
}

impl Link {
    /// Moves the connection's I/O as far as it can go now.
    fn drive(&mut self, cx: &mut Context<'_>) {
        let Some(connection) = &mut self.connection else {
            return;
        };
        if let Poll::Ready(result) = Pin::new(connection).poll(cx) {
            self.connection = None;
            if let Err(e) = result {
                tracing::debug!(error = %e, "upstream connection failed");
            }
        }
    }

    /// Polls `step`, which only this connection can move on, driving the
    /// connection first. It is driven with the task's waker only when
    /// `step` has to wait, and otherwise with none (see `quiet`).
    fn drive_then<T>(&mut self, cx: &mut Context<'_>, step: impl FnMut() -> Poll<T>) -> Poll<T> {
        self.drive(&mut quiet());
        self.then_drive(cx, step)
    }

    /// `drive_then` for a `step` that the last drive may already have
    /// moved on (an answer's body that came with its head): the step is
    /// polled first, and the connection driven only if it has to wait.
    fn then_drive<T>(
        &mut self,
        cx: &mut Context<'_>,
        mut step: impl FnMut() -> Poll<T>,
    ) -> Poll<T> {
        if let Poll::Ready(value) = step() {
            return Poll::Ready(value);
        }
        self.drive(cx);
        let value = ready!(step());
        self.drive(&mut quiet());
        Poll::Ready(value)
    }

    /// Whether a parked connection can take a request: polling it takes in
    /// the end of the answer it last carried, notices a close or stray
    /// bytes that arrived while it was parked, and lets it say it is ready.
    fn usable(&mut self) -> bool {
        self.drive(&mut quiet());
        !self.ended() && self.sender.is_ready()
    }

    fn ended(&self) -> bool {
        self.connection.is_none()
    }

    /// Writes the request and reads the answer's head. The first drive
    /// writes the request, and the answer cannot have come before it: the
    /// task is about to wait, so that drive is given the task's waker at
    /// once, where `drive_then` would drive once quietly and again to
    /// register the waker.
    async fn exchange(
        &mut self,
        request: Request<ProxyBody>,
    ) -> Result<Response<Incoming>, hyper::client::conn::TrySendError<Request<ProxyBody>>> {
        let mut answer = pin!(self.sender.try_send_request(request));
        let mut written = false;
        poll_fn(|cx| {
            if std::mem::replace(&mut written, true) {
                return self.drive_then(cx, || answer.as_mut().poll(&mut quiet()));
            }
            self.drive(cx);
            answer.as_mut().poll(&mut quiet())
        })
        .await
    }
}

/// The context for polling without a waker. What a connection moves on
/// (the answer's head, its body's channel) is polled with it, since the
/// task polls it again right after driving the connection; and the
/// connection itself is driven with it unless the task is about to wait.
/// Otherwise hyper's wake-ups inside the connection (its body's flow
/// control) would wake the task that is running, which tokio then queues
/// anew and, on a quiet runtime, announces to an idle worker thread: two
/// more system calls and a wake-up per request, for nothing.
fn quiet() -> Context<'static> {
    Context::from_waker(Waker::noop())
}

/// An upstream answer's body. While it streams it reads from the
/// connection it arrives on; read through, it parks that connection for
/// the next request, dropped early, it closes it.
pub struct UpstreamBody {
    kind: Kind,
}

enum Kind {
    /// Through hyper's client: the connection is driven as the body is
    /// read.
    Hyper {
        incoming: Incoming,
        link: Option<Following>,
    },
    /// A plain `GET`'s answer, read by hand.
    Plain(PlainBody),
}

struct Following {
    link: Box<Link>,
    key: Key,
    shared: Weak<Shared>,
}

impl Following {
    fn finished(self) {
        if let Some(shared) = self.shared.upgrade() {
            shared.park(&self.key, self.link);
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let (incoming, link) = match &mut self.get_mut().kind {
            Kind::Plain(body) => return Pin::new(body).poll_frame(cx).map_err(Into::into),
            Kind::Hyper { incoming, link } => (incoming, link),
        };
        loop {
            let frame = match link {
                // The head's drive usually brought the body too.
                Some(following) => ready!(following
                    .link
                    .then_drive(cx, || Pin::new(&mut *incoming).poll_frame(&mut quiet()))),
                // The connection runs as a task of its own (a protocol
                // switch), or the answer is complete.
                None => ready!(Pin::new(&mut *incoming).poll_frame(cx)),
            };
            match &frame {
                None => link.take().map_or((), Following::finished),
                Some(Err(_)) => *link = None,
                // A reader that knows the length stops at the last byte
                // and never asks for the end: finish there.
                Some(Ok(_)) if incoming.is_end_stream() => {
                    link.take().map_or((), Following::finished)
                }
                Some(Ok(_)) => {}
            }
            // Trailer fields end here, as on the plain path (`answer.rs`
            // reads and drops them): no API behind the proxy sends any a
            // client needs, and an HTTP/2 client would get them whatever
            // the answer's head declared. What follows them is the end.
            if matches!(&frame, Some(Ok(frame)) if frame.is_trailers()) {
                continue;
            }
            return Poll::Ready(frame.map(|frame| frame.map_err(Into::into)));
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Hyper { incoming, .. } => incoming.is_end_stream(),
            Kind::Plain(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Hyper { incoming, .. } => incoming.size_hint(),
            Kind::Plain(body) => body.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parked_connections_are_swept_three_times_an_idle_timeout_and_never_every_zero_seconds() {
        assert_eq!(
            sweep_period(Duration::from_secs(51)),
            Duration::from_secs(17)
        );
        assert_eq!(
            sweep_period(Duration::from_nanos(1)),
            Duration::from_millis(1)
        );
    }
}
