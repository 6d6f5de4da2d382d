//! Accepting connections and serving them until shutdown, then letting
//! in-flight requests finish within the grace period.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::{Body, Incoming};
use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use tokio_rustls::TlsAcceptor;

use crate::config::Limits;
use crate::http::address_slots::AddressSlots;
use crate::http::address_text::Peer;
use crate::http::body::BoxError;
use crate::http::connection::{until_stopped, Marked, Transport};
use crate::http::protocol::{sniff, Protocol};
use crate::http::receive_buffer;
use crate::http::timer::ReusingTimer;
use crate::http::tls::CurrentTls;
use crate::http::unsent;

/// A shutdown signal many tasks can wait on.
#[derive(Clone, Debug)]
pub struct Shutdown(watch::Receiver<bool>);

impl Shutdown {
    pub fn new(trigger: impl Future<Output = ()> + Send + 'static) -> Self {
        let (tx, rx) = watch::channel(false);
        tokio::spawn(async move {
            trigger.await;
            let _ = tx.send(true);
        });
        Self(rx)
    }

    pub async fn wait(mut self) {
        // An error means the sender is gone, which also means: stop.
        let _ = self.0.wait_for(|stop| *stop).await;
    }
}

/// What a listener counts of its connections.
#[derive(Clone, Debug)]
pub struct ListenerMetrics {
    /// Connections open now.
    pub open: Gauge,
    /// Connections closed on arrival: their address had
    /// `limits.max_connections_per_address` open.
    pub refused_per_address: Counter,
}

/// The tenant listener on `addr`, as `TcpListener::bind` makes one (address
/// reuse, a backlog of 1,024), with `limits.client_receive_buffer_bytes`
/// set before it listens: the size then holds from every handshake on,
/// and every accepted connection inherits it.
pub fn bind(addr: SocketAddr, limits: &Limits) -> io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    if let bytes @ 1.. = limits.client_receive_buffer_bytes {
        receive_buffer::warn_if_capped("limits.client_receive_buffer_bytes", bytes);
        socket.set_recv_buffer_size(bytes)?;
    }
    socket.bind(addr)?;
    socket.listen(1024)
}

/// Serves HTTP/1.1 (with upgrades, for live tail) and HTTP/2 on `listener`,
/// over TLS when `tls` is set, calling `handler` per request with the
/// connection's peer.
pub async fn serve_connections<H, F, B>(
    listener: TcpListener,
    limits: &Limits,
    tls: Option<CurrentTls>,
    handler: H,
    shutdown: Shutdown,
    metrics: Option<ListenerMetrics>,
) where
    H: Fn(Peer, Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Result<Response<B>, Infallible>> + Send + 'static,
    B: Body<Data = Bytes, Error = BoxError> + Send + 'static,
{
    let protocols = Arc::new(Protocols::new(limits));
    // Each connection holds a receiver: the sender's `closed()` is "every
    // connection has ended".
    let (drain, draining) = watch::channel(false);
    let slots = Slots::new(
        limits.max_connections,
        metrics.as_ref().map(|m| m.open.clone()),
    );
    let per_address = AddressSlots::new(limits.max_connections_per_address);
    // Each logged at most once a minute, not per connection.
    let (mut full_warning, mut address_warning) = (EveryMinute::default(), EveryMinute::default());
    let stop = shutdown.wait();
    tokio::pin!(stop);
    loop {
        let slot = match slots.try_reserve() {
            Some(slot) => slot,
            None => {
                if full_warning.due() {
                    tracing::warn!(
                        max_connections = limits.max_connections,
                        "connection limit reached; new connections wait until one ends, \
                         and connections close after an eighth of the usual quiet time"
                    );
                }
                tokio::select! {
                    _ = &mut stop => break,
                    slot = slots.reserve() => match slot {
                        Some(slot) => slot,
                        None => break, // closed: never, the semaphore is ours
                    },
                }
            }
        };
        let (stream, peer) = tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Out of file descriptors and the like: back off, don't spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let address_held = match &per_address {
            None => None,
            Some(per_address) => match per_address.try_hold(peer.ip()) {
                Some(held) => Some(held),
                None => {
                    // Closed unread: the slot is free again at once.
                    drop(stream);
                    if let Some(metrics) = &metrics {
                        metrics.refused_per_address.inc();
                    }
                    if address_warning.due() {
                        tracing::warn!(
                            client = %peer.ip(),
                            max_connections_per_address = limits.max_connections_per_address,
                            "an address has its most connections open; \
                             further ones from it are closed on arrival"
                        );
                    }
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let _ = unsent::bound(&stream);
        let handler = handler.clone();
        let known_peer = Peer::new(peer);
        let serve = move |request| handler(known_peer.clone(), request);
        let (protocols, mut draining) = (protocols.clone(), draining.clone());
        // The handshake counts against the same clock as a request head, and
        // so does a connection's silence.
        let head_time = limits.header_read_timeout;
        let abandon_after = 2 * limits.upstream_timeout;
        let tls = tls
            .as_ref()
            .map(|current| TlsAcceptor::from(current.load_full()));
        let held = slots.hold(slot);
        let crowded = slots.crowded();
        // The TLS handshake and the serving are boxed, each when it starts:
        // hyper's connection (3 KiB and more) and rustls's handshake would
        // otherwise be in every connection's own state, held by one that
        // has not spoken yet and copied whole each time spawning moves it
        // (docs/benchmarks.md, "Large futures spawned boxed").
        tokio::spawn(async move {
            // The address first: once the open gauge drops, the address has its slot back.
            let _held = (address_held, held);
            let transport = match tls {
                None => Transport::Plain(stream),
                Some(acceptor) => {
                    match tokio::time::timeout(head_time, Box::pin(acceptor.accept(stream))).await {
                        Ok(Ok(stream)) => Transport::Tls(Box::new(stream)),
                        Ok(Err(e)) => {
                            tracing::debug!(error = %e, %peer, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "TLS handshake timed out");
                            return;
                        }
                    }
                }
            };
            let (stream, quiet) = Marked::new(transport);
            // Told to finish, a connection still quiet for twice
            // `upstream_timeout` has nothing left in flight that could
            // still move a byte (a request's answer comes within it, a
            // push's within twice it): it is held by a client that lets no
            // answer through, and is closed. One whose client takes none
            // of what waits to be written needs only one more quiet
            // period to show it: its answers hold their slots and buffers
            // no longer than that.
            let still_quiet = quiet.clone();
            let abandon = move || async move {
                still_quiet
                    .for_a_whole_unless_stuck(abandon_after, head_time)
                    .await;
                tracing::debug!(%peer, "connection still quiet after being told to finish, closed");
            };
            let stop = async move {
                tokio::select! {
                    _ = draining.wait_for(|stop| *stop) => {}
                    () = quiet.for_a_whole(head_time, crowded) => {
                        tracing::debug!(%peer, "connection quiet, told to finish");
                    }
                }
            };
            let mut stop = pin!(stop);
            // Shutting down, or no byte yet for a while: nothing to finish.
            let sniffed = tokio::select! {
                biased;
                sniffed = sniff(stream) => sniffed,
                () = &mut stop => return,
            };
            // Shutting down, or no byte either way for a while: take no new
            // request (HTTP/2: GOAWAY); one in flight still finishes.
            let served = match sniffed {
                Ok(Some((Protocol::Http1, stream))) => {
                    let connection = protocols
                        .http1
                        .serve_connection(TokioIo::new(stream), service_fn(serve))
                        .with_upgrades();
                    let finished =
                        until_stopped(connection, stop, |c| c.graceful_shutdown(), abandon);
                    Box::pin(finished).await
                }
                Ok(Some((Protocol::Http2, stream))) => {
                    // Each request's future boxed on its own (over 4 KiB):
                    // a stream's task then holds it only until the answer's
                    // head, not while its body is sent, which a client that
                    // gives it no window can make last.
                    let service = service_fn(move |request| Box::pin(serve(request)));
                    let connection = protocols
                        .http2
                        .serve_connection(TokioIo::new(stream), service);
                    let finished =
                        until_stopped(connection, stop, |c| c.graceful_shutdown(), abandon);
                    Box::pin(finished).await
                }
                Ok(None) => return,
                Err(e) => {
                    tracing::debug!(error = %e, %peer, "reading a new connection failed");
                    return;
                }
            };
            if let Some(Err(e)) = served {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    drop(draining);
    let _ = drain.send(true);
    if tokio::time::timeout(limits.shutdown_grace, drain.closed())
        .await
        .is_err()
    {
        tracing::warn!("shutdown grace period over; closing remaining connections");
    }
}

/// Spawns each HTTP/2 stream's task with its future boxed: a request's
/// future is over 4 KiB, and spawning would otherwise copy it whole several
/// times.
#[derive(Clone, Copy, Debug)]
struct BoxingExecutor;

impl<F> hyper::rt::Executor<F> for BoxingExecutor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, future: F) {
        tokio::spawn(Box::pin(future));
    }
}

/// How the listener's connections speak each HTTP version; one for all of
/// them.
struct Protocols {
    http1: http1::Builder,
    http2: http2::Builder<BoxingExecutor>,
}

impl Protocols {
    fn new(limits: &Limits) -> Self {
        let mut http1 = http1::Builder::new();
        // `half_close` stays off: hyper then reads once more while a request
        // is in flight, which notices a client that hangs up and cancels its
        // upstream request (tests/faults.rs). That read costs a fresh 8 KiB
        // buffer per request (docs/benchmarks.md); the cancellation is worth
        // it.
        http1
            // Reused timers: hyper arms one per request head (http/timer.rs).
            .timer(ReusingTimer)
            .header_read_timeout(limits.header_read_timeout)
            .max_buf_size(limits.max_header_bytes)
            .max_headers(limits.max_header_count);
        // HTTP/2: hyper's own defaults, written out so that a change of them
        // cannot quietly widen what one connection may hold:
        // `limits.max_http2_streams` at once (200, hyper's); a client that
        // resets more than 20 streams before they were served (the "rapid
        // reset" flood, CVE-2023-44487) gets GOAWAY, and so does one that
        // makes the proxy reset 1,024 of its streams by sending them
        // malformed ("MadeYouReset", CVE-2025-8671). But a
        // stream's window is 64 KiB, not hyper's 1 MiB: a body arrives that
        // far ahead of what the proxy reads, and a request waiting for its
        // credential's verification reads none (Envoy's settings for an
        // edge proxy take the same).
        let mut http2 = http2::Builder::new(BoxingExecutor);
        http2
            .timer(TokioTimer::new())
            .max_concurrent_streams(limits.max_http2_streams)
            .initial_stream_window_size(64 << 10)
            .max_pending_accept_reset_streams(20)
            .max_local_error_reset_streams(1024)
            .max_header_list_size(
                u32::try_from(limits.max_header_bytes).expect("bounded by config validation"),
            );
        Self { http1, http2 }
    }
}

/// A warning's clock: due at the first call, then once a minute at most.
#[derive(Default)]
struct EveryMinute(Option<tokio::time::Instant>);

impl EveryMinute {
    fn due(&mut self) -> bool {
        let now = tokio::time::Instant::now();
        let due = self
            .0
            .is_none_or(|at| now.duration_since(at) >= Duration::from_secs(60));
        if due {
            self.0 = Some(now);
        }
        due
    }
}

/// A listener's connection slots: at most `limits.max_connections`
/// connections open, counted in the open-connections gauge, and whether
/// the listener is full, for its connections' quiet clocks. Full once no
/// slot is left for the next connection, and no longer once a tenth of the
/// slots are free again: the gap keeps a listener that churns at its limit
/// from waking every connection at each accept and each close.
struct Slots {
    free: Arc<Semaphore>,
    open: Option<Gauge>,
    /// Free slots that end being full.
    room: usize,
    full: watch::Sender<bool>,
}

impl Slots {
    fn new(max_connections: usize, open: Option<Gauge>) -> Arc<Self> {
        Arc::new(Self {
            free: Arc::new(Semaphore::new(max_connections)),
            open,
            room: (max_connections / 10).max(1),
            full: watch::Sender::new(false),
        })
    }

    /// A slot for the next connection if one is free; if none is, the
    /// listener is full.
    fn try_reserve(&self) -> Option<OwnedSemaphorePermit> {
        let slot = self.free.clone().try_acquire_owned().ok();
        if slot.is_none() {
            self.full
                .send_if_modified(|full| !std::mem::replace(full, true));
        }
        slot
    }

    /// Waits for a slot to be free (`None`: the semaphore closed, never).
    async fn reserve(&self) -> Option<OwnedSemaphorePermit> {
        self.free.clone().acquire_owned().await.ok()
    }

    /// The slot, held by an accepted connection until its task ends.
    fn hold(self: &Arc<Self>, slot: OwnedSemaphorePermit) -> Held {
        if let Some(open) = &self.open {
            open.inc();
        }
        Held {
            _slot: slot,
            slots: self.clone(),
        }
    }

    fn crowded(&self) -> watch::Receiver<bool> {
        self.full.subscribe()
    }
}

/// An open connection's slot.
struct Held {
    _slot: OwnedSemaphorePermit,
    slots: Arc<Slots>,
}

impl Drop for Held {
    fn drop(&mut self) {
        let slots = &self.slots;
        if let Some(open) = &slots.open {
            open.dec();
        }
        // The slot itself is freed after this runs.
        if slots.free.available_permits() + 1 >= slots.room {
            slots
                .full
                .send_if_modified(|full| std::mem::replace(full, false));
        }
    }
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::ops::panics::{self, test_support::Scripted};

    /// Sends `head` on a new connection and reads until the server closes it.
    async fn exchange(address: std::net::SocketAddr, head: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        stream.write_all(head.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
            .await
            .expect("the server closes the connection")
            .expect("read");
        String::from_utf8(answer).unwrap()
    }

    /// A panic in a response body (caught, `panics::caught_body`) ends that
    /// response without its last chunk: the client can tell it was cut
    /// short. The listener serves on.
    #[tokio::test]
    async fn a_response_body_that_panics_is_cut_short_and_the_listener_serves_on() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let shutdown = Shutdown::new(async move {
            let _ = stopped.await;
        });
        let limits = Limits::default();
        let handler = |_, request: Request<Incoming>| async move {
            let body = Scripted::new(request.uri().path() == "/panics");
            Ok::<_, Infallible>(Response::new(panics::caught_body(body)))
        };
        let server = serve_connections(listener, &limits, None, handler, shutdown, None);
        let client = async {
            let cut = exchange(address, "GET /panics HTTP/1.1\r\nHost: x\r\n\r\n").await;
            let whole = exchange(
                address,
                "GET /fine HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            )
            .await;
            stop.send(()).unwrap();
            (cut, whole)
        };
        let ((), (cut, whole)) = tokio::join!(server, client);
        assert!(whole.starts_with("HTTP/1.1 200"), "{whole}");
        assert!(whole.ends_with("7\r\npartial\r\n0\r\n\r\n"), "{whole}");
        assert!(cut.is_empty() || cut.starts_with("HTTP/1.1 200"), "{cut}");
        assert!(!cut.ends_with("0\r\n\r\n"), "never complete: {cut}");
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_waits_for_its_trigger() {
        let (trigger, triggered) = tokio::sync::oneshot::channel::<()>();
        let shutdown = Shutdown::new(async move {
            let _ = triggered.await;
        });
        let hour = Duration::from_secs(3600);
        let early = tokio::time::timeout(hour, shutdown.clone().wait()).await;
        assert!(early.is_err(), "no shutdown before the trigger");
        trigger.send(()).unwrap();
        tokio::time::timeout(hour, shutdown.wait())
            .await
            .expect("shutdown once triggered");
    }

    #[tokio::test(start_paused = true)]
    async fn a_warning_is_due_at_first_then_once_a_minute() {
        let mut warning = EveryMinute::default();
        assert!(warning.due(), "the first time");
        tokio::time::advance(Duration::from_secs(59)).await;
        assert!(!warning.due(), "within the minute");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(warning.due(), "a minute after the last");
        assert!(!warning.due(), "counted from then");
    }

    #[tokio::test]
    async fn a_listener_is_full_without_a_slot_and_has_room_at_a_tenth_free() {
        let open = Gauge::default();
        let slots = Slots::new(20, Some(open.clone()));
        let mut crowded = slots.crowded();
        let mut held: Vec<Held> = (0..20)
            .map(|_| slots.hold(slots.try_reserve().expect("a free slot")))
            .collect();
        assert_eq!(open.get(), 20);
        assert!(
            !crowded.has_changed().unwrap(),
            "full only when one is refused"
        );
        assert!(slots.try_reserve().is_none());
        assert!(crowded.has_changed().unwrap() && *crowded.borrow_and_update());
        assert!(slots.try_reserve().is_none());
        assert!(!crowded.has_changed().unwrap(), "told once");
        assert!(slots.reserve().now_or_never().is_none(), "waits while full");
        // Two of twenty is a tenth: still full with one free.
        held.pop();
        assert_eq!(open.get(), 19);
        assert!(!crowded.has_changed().unwrap(), "one free is not room");
        held.pop();
        assert!(crowded.has_changed().unwrap() && !*crowded.borrow_and_update());
        held.pop();
        assert!(!crowded.has_changed().unwrap(), "told once");
        assert_eq!(open.get(), 17);
        assert!(slots.reserve().await.is_some(), "a free slot at once");
    }
}
