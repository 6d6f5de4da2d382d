//! A client connection as the server drives it: plain TCP or TLS, marked
//! whenever bytes move either way, so that a connection quiet for too long
//! can be told to finish, and while a write waits for the client, so that
//! one whose client takes nothing is closed sooner than one waiting for an
//! upstream.
//!
//! hyper closes an HTTP/1.1 connection whose request head does not arrive
//! in time (`limits.header_read_timeout`), but nothing else has such a
//! clock: neither a connection that has not yet shown which protocol it
//! speaks (`http/protocol.rs` waits for its first bytes) nor an HTTP/2
//! connection between requests. Left alone, a client could hold
//! either open for ever, one file descriptor each, without credentials.

use std::future::Future;
use std::io;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::server::TlsStream;

/// What a client connected over: one type for both, so the server builds
/// one kind of connection.
pub enum Transport {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// A stream that notes when bytes move, and whether a write waits for the
/// client to take bytes (the server's: `Marked<Transport>`).
pub struct Marked<S> {
    stream: S,
    marks: Arc<Marks>,
}

/// Written and read on the connection's own task, and looked at by its
/// clocks: no ordering with anything else is needed.
#[derive(Default)]
struct Marks {
    moved: AtomicBool,
    write_waits: AtomicBool,
}

/// Tells when a [`Marked`] stream has been quiet for a while. Copies share
/// one mark, which each look clears: one copy at a time may wait.
#[derive(Clone)]
pub struct Quiet(Arc<Marks>);

impl<S> Marked<S> {
    pub fn new(stream: S) -> (Self, Quiet) {
        let marks = Arc::new(Marks::default());
        let quiet = Quiet(marks.clone());
        (Self { stream, marks }, quiet)
    }

    fn note(&self, moved: bool) {
        if moved {
            self.marks.moved.store(true, Ordering::Relaxed);
        }
    }

    /// After a write: it moved bytes, or waits for the client to take some.
    fn note_write(&self, written: &Poll<io::Result<usize>>) {
        self.note(matches!(written, Poll::Ready(Ok(n)) if *n > 0));
        self.note_waiting(written.is_pending());
    }

    /// A write or a flush (TLS: the records a write left to send) that
    /// waits for the client, or none. Stored only when it changes: almost
    /// every write is taken at once.
    fn note_waiting(&self, waits: bool) {
        if self.marks.write_waits.load(Ordering::Relaxed) != waits {
            self.marks.write_waits.store(waits, Ordering::Relaxed);
        }
    }
}

impl Quiet {
    /// Resolves once a whole `period` has passed without a byte read or
    /// written: between one and two periods after the last one (the clock
    /// is looked at once a period, so that moving bytes costs no timer).
    /// While `crowded` says the listener is full, the period is an eighth
    /// as long, so idle connections make room for waiting ones sooner (as
    /// Envoy's overload manager shortens idle timeouts).
    pub async fn for_a_whole(&self, period: Duration, mut crowded: watch::Receiver<bool>) {
        loop {
            let look = if *crowded.borrow_and_update() {
                period / CROWDED_SHARE
            } else {
                period
            };
            tokio::select! {
                () = tokio::time::sleep(look) => {
                    if !self.0.moved.swap(false, Ordering::Relaxed) {
                        return;
                    }
                }
                // Look again with the other period; bytes seen so far
                // still count. (A listener gone: the clock alone.)
                Ok(()) = crowded.changed() => {}
            }
        }
    }

    /// Resolves once a whole `period` has passed without a byte moving, or
    /// sooner, once a whole `stuck` period has, at whose end a write
    /// still waits for the client: a connection whose client takes none of
    /// what it is sent is not waiting for an upstream, and needs no more
    /// than `stuck` to show it (nginx's `send_timeout`, 60 s, is such a
    /// clock). Looked at once every `stuck` (or `period`, if shorter).
    pub async fn for_a_whole_unless_stuck(&self, period: Duration, stuck: Duration) {
        let look = stuck.min(period);
        let mut quiet_for = Duration::ZERO;
        loop {
            tokio::time::sleep(look).await;
            if self.0.moved.swap(false, Ordering::Relaxed) {
                quiet_for = Duration::ZERO;
                continue;
            }
            quiet_for += look;
            if quiet_for >= period || self.0.write_waits.load(Ordering::Relaxed) {
                return;
            }
        }
    }
}

/// How much shorter the quiet period is while the listener is full.
const CROWDED_SHARE: u32 = 8;

/// Drives `connection` to its end; once `stop` resolves (shutdown, or the
/// connection gone quiet), calls `finish` on it and drives it on, until it
/// ends (`Some`) or `abandon` resolves (`None`: the connection is dropped,
/// closed with whatever it still held).
///
/// A finished connection waits for the requests it has in flight, and an
/// HTTP/2 client can keep a stream from ever ending by giving its answer
/// no window (an HTTP/1.1 one by not reading): `abandon` is what frees
/// such a connection, its slot and its streams.
///
/// `stop` is polled only when its own timer or signal wakes the task, not
/// at every wake of the connection: a request wakes it several times, and
/// polling a timer and a channel each time cost about 1.4 % more
/// instructions per request (docs/benchmarks.md). `abandon` is made, and
/// polled, only once `finish` has been called: made at the start, its
/// timer's state in every connection's future cost about 2 % more
/// instructions per new connection.
pub async fn until_stopped<C: Future, A: Future<Output = ()>>(
    connection: C,
    stop: impl Future<Output = ()>,
    finish: impl FnOnce(Pin<&mut C>),
    abandon: impl FnOnce() -> A,
) -> Option<C::Output> {
    let mut connection = pin!(connection);
    let mut stop = pin!(stop);
    // Until the connection is told to finish: how, and the clock to make then.
    let mut finish = Some((finish, abandon));
    let mut abandon = None;
    let mut stop_waker: Option<Arc<StopWaker>> = None;
    std::future::poll_fn(|cx| {
        if finish.is_some() {
            // Made at the first poll, woken then: `stop` registers its wakers.
            let waker = stop_waker.get_or_insert_with(|| {
                Arc::new(StopWaker {
                    woken: AtomicBool::new(true),
                    task: cx.waker().clone(),
                })
            });
            if waker.woken.load(Ordering::Relaxed) {
                waker.woken.store(false, Ordering::Relaxed);
                let own = Waker::from(waker.clone());
                if stop
                    .as_mut()
                    .poll(&mut Context::from_waker(&own))
                    .is_ready()
                {
                    if let Some((finish, make_abandon)) = finish.take() {
                        finish(connection.as_mut());
                        abandon = Some(Box::pin(make_abandon()));
                    }
                }
            }
        }
        if let Some(abandon) = &mut abandon {
            if abandon.as_mut().poll(cx).is_ready() {
                return Poll::Ready(None);
            }
        }
        connection.as_mut().poll(cx).map(Some)
    })
    .await
}

/// Wakes the connection's task for `stop`, and says it was `stop`'s turn.
/// The task's waker is taken once: a spawned task's wakers all wake it.
struct StopWaker {
    woken: AtomicBool,
    task: Waker,
}

impl Wake for StopWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Set before waking: the task reads it when it runs.
        self.woken.store(true, Ordering::Release);
        self.task.wake_by_ref();
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
        self.note_write(&written);
        written
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.note_write(&written);
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let flushed = Pin::new(&mut self.stream).poll_flush(cx);
        self.note_waiting(flushed.is_pending());
        flushed
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

    /// A connection that wakes itself `wakes` times, says when it has
    /// stopped doing so, and ends once told to finish.
    struct Busy {
        wakes: usize,
        polls: usize,
        idle: Option<tokio::sync::oneshot::Sender<()>>,
        told: bool,
    }

    impl Future for Busy {
        type Output = usize;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
            self.polls += 1;
            if self.told {
                return Poll::Ready(self.polls);
            }
            if self.wakes > 0 {
                self.wakes -= 1;
                cx.waker().wake_by_ref();
            } else if let Some(idle) = self.idle.take() {
                let _ = idle.send(());
            }
            Poll::Pending
        }
    }

    /// A stop signal fired by hand, counting its polls, that wakes the
    /// task the way it is told to: timers and channels wake by reference
    /// or by value, and `StopWaker` must pass on either.
    #[derive(Clone, Default)]
    struct Signal(Arc<std::sync::Mutex<SignalState>>);

    #[derive(Default)]
    struct SignalState {
        polls: usize,
        fired: bool,
        waker: Option<Waker>,
    }

    impl Signal {
        fn wait(&self) -> impl Future<Output = ()> {
            let signal = self.0.clone();
            std::future::poll_fn(move |cx| {
                let mut state = signal.lock().unwrap();
                state.polls += 1;
                if state.fired {
                    return Poll::Ready(());
                }
                state.waker = Some(cx.waker().clone());
                Poll::Pending
            })
        }

        fn fire(&self, wake: fn(Waker)) {
            let waker = {
                let mut state = self.0.lock().unwrap();
                state.fired = true;
                state.waker.take().expect("the signal was polled")
            };
            wake(waker);
        }

        fn polls(&self) -> usize {
            self.0.lock().unwrap().polls
        }
    }

    /// A busy connection told to stop by a signal that wakes with `wake`.
    async fn busy_then_stopped(wake: fn(Waker)) {
        let (idle, is_idle) = tokio::sync::oneshot::channel();
        let signal = Signal::default();
        let busy = Busy {
            wakes: 100,
            polls: 0,
            idle: Some(idle),
            told: false,
        };
        let served = tokio::spawn(until_stopped(
            busy,
            signal.wait(),
            |busy| busy.get_mut().told = true,
            std::future::pending,
        ));
        is_idle.await.unwrap();
        assert_eq!(signal.polls(), 1, "once, at the start");
        signal.fire(wake);
        // On the paused clock, a task never woken meets this bound at once.
        let polls = tokio::time::timeout(Duration::from_secs(3600), served)
            .await
            .expect("the signal woke the task")
            .unwrap()
            .expect("not abandoned");
        // Polled 101 times before the signal, then once to finish.
        assert_eq!(polls, 102);
        assert_eq!(signal.polls(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn the_stop_signal_is_polled_only_when_it_wakes_the_task() {
        busy_then_stopped(|waker| waker.wake_by_ref()).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_signal_waking_by_value_stops_it_too() {
        busy_then_stopped(Waker::wake).await;
    }

    /// A connection that does not end once told to finish is dropped when
    /// `abandon` resolves, which is not looked at before.
    #[tokio::test(start_paused = true)]
    async fn a_finished_connection_that_never_ends_is_abandoned() {
        let (stop, abandon) = (Signal::default(), Signal::default());
        let told = Arc::new(AtomicBool::new(false));
        let finish = {
            let told = told.clone();
            move |_: Pin<&mut std::future::Pending<()>>| told.store(true, Ordering::Relaxed)
        };
        let served = tokio::spawn(until_stopped(
            std::future::pending::<()>(),
            stop.wait(),
            finish,
            {
                let abandon = abandon.clone();
                move || abandon.wait()
            },
        ));
        tokio::task::yield_now().await;
        assert_eq!(abandon.polls(), 0, "not before the connection is finished");
        stop.fire(Waker::wake);
        tokio::task::yield_now().await;
        assert!(told.load(Ordering::Relaxed));
        assert_eq!(abandon.polls(), 1, "looked at as soon as it is finished");
        abandon.fire(Waker::wake);
        let served = tokio::time::timeout(Duration::from_secs(3600), served)
            .await
            .expect("abandon woke the task");
        assert_eq!(served.unwrap(), None);
    }

    /// `quiet`'s clock of eight periods, or one while a write waits;
    /// bounded, so that a clock that never ends fails the test rather
    /// than holding it (the paused clock would advance for ever).
    async fn abandon_clock(quiet: &Quiet) {
        let clock = quiet.for_a_whole_unless_stuck(8 * PERIOD, PERIOD);
        tokio::time::timeout(100 * PERIOD, clock)
            .await
            .expect("the clock ends");
    }

    /// A connection quiet for eight periods with nothing to write; as
    /// soon as one whole period passes with a write waiting at its end.
    #[tokio::test(start_paused = true)]
    async fn a_write_the_client_takes_none_of_shortens_the_wait() {
        let (_marked, quiet, _client) = pair();
        let started = Instant::now();
        abandon_clock(&quiet).await;
        assert_eq!(
            started.elapsed(),
            8 * PERIOD,
            "nothing waits: the whole period"
        );

        let (mut marked, quiet, _client) = pair();
        let started = Instant::now();
        // 64 bytes fit the pipe (bytes moved, seen by the look at 30 s);
        // the rest waits for ever, seen by the look at 60 s.
        let writing = async {
            let _ = marked.write_all(&[0; 100]).await;
        };
        tokio::select! {
            () = abandon_clock(&quiet) => {}
            () = writing => unreachable!("the client reads nothing"),
        }
        assert_eq!(started.elapsed(), 2 * PERIOD);
    }

    /// A write that waited and was then taken no longer counts as waiting.
    #[tokio::test(start_paused = true)]
    async fn a_write_taken_in_the_end_waits_no_more() {
        let (mut marked, quiet, mut client) = pair();
        let started = Instant::now();
        let traffic = async {
            let mut all = [0; 100];
            let writing = marked.write_all(&[0; 100]);
            // The client takes everything at 10 s.
            let reading = async {
                tokio::time::sleep(Duration::from_secs(10)).await;
                client.read_exact(&mut all).await.unwrap();
            };
            let (written, ()) = tokio::join!(writing, reading);
            written.unwrap();
        };
        tokio::join!(abandon_clock(&quiet), traffic);
        // Bytes seen by the look at 30 s, then eight quiet looks.
        assert_eq!(started.elapsed(), 9 * PERIOD);
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_connection_is_quiet_after_one_period() {
        let (_marked, quiet, _client) = pair();
        assert_quiet_after_one_period(&quiet).await;
    }

    /// `quiet` resolves one period from now, the listener never full.
    async fn assert_quiet_after_one_period(quiet: &Quiet) {
        let started = Instant::now();
        let (_crowding, crowded) = watch::channel(false);
        quiet.for_a_whole(PERIOD, crowded).await;
        assert_eq!(started.elapsed(), PERIOD);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_listener_makes_the_quiet_period_an_eighth_as_long() {
        let (mut marked, quiet, mut client) = pair();
        let (crowding, crowded) = watch::channel(false);
        let started = Instant::now();
        let traffic = async {
            let mut one = [0; 1];
            // A byte at 10 s, the listener full at 20 s: the look 3.75 s
            // later still sees the byte, the next one (at 27.5 s) none.
            tokio::time::sleep(Duration::from_secs(10)).await;
            client.write_all(b"x").await.unwrap();
            marked.read_exact(&mut one).await.unwrap();
            tokio::time::sleep(Duration::from_secs(10)).await;
            crowding.send(true).unwrap();
        };
        tokio::join!(quiet.for_a_whole(PERIOD, crowded), traffic);
        assert_eq!(started.elapsed(), Duration::from_millis(27_500));
    }

    #[tokio::test(start_paused = true)]
    async fn room_again_gives_back_the_whole_period() {
        let (_marked, quiet, _client) = pair();
        let (crowding, crowded) = watch::channel(true);
        let started = Instant::now();
        let room = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            crowding.send(false).unwrap();
        };
        tokio::join!(quiet.for_a_whole(PERIOD, crowded), room);
        assert_eq!(started.elapsed(), Duration::from_secs(31));
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
        let (_crowding, crowded) = watch::channel(false);
        tokio::join!(quiet.for_a_whole(PERIOD, crowded), traffic);
        assert_eq!(started.elapsed(), Duration::from_secs(90));
    }

    #[tokio::test(start_paused = true)]
    async fn the_end_of_the_stream_is_no_byte_moved() {
        let (mut marked, quiet, client) = pair();
        drop(client);
        assert_eq!(marked.read(&mut [0; 1]).await.unwrap(), 0, "the end");
        assert_quiet_after_one_period(&quiet).await;
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_written_vectored_count_too() {
        let (mut marked, quiet, mut client) = pair();
        let started = Instant::now();
        let traffic = async {
            // Out at 20 s, seen by the look at 30 s: quiet at 60 s.
            tokio::time::sleep(Duration::from_secs(20)).await;
            let slices = [io::IoSlice::new(b""), io::IoSlice::new(b"yz")];
            assert_eq!(marked.write_vectored(&slices).await.unwrap(), 2);
            let mut two = [0; 2];
            client.read_exact(&mut two).await.unwrap();
            assert_eq!(&two, b"yz");
        };
        let (_crowding, crowded) = watch::channel(false);
        tokio::join!(quiet.for_a_whole(PERIOD, crowded), traffic);
        assert_eq!(started.elapsed(), Duration::from_secs(60));
    }

    /// hyper writes vectored only when the stream says it can.
    #[test]
    fn whether_writes_are_vectored_is_the_streams_answer() {
        let (duplex, _) = tokio::io::duplex(64);
        assert!(Marked::new(duplex).0.is_write_vectored(), "as DuplexStream");
        assert!(!Marked::new(Unvectored).0.is_write_vectored());
    }

    /// A stream that does not write vectored (tokio's own all do).
    struct Unvectored;

    impl AsyncWrite for Unvectored {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            Poll::Ready(Ok(buf.len()))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// What the stream under it does, a marked stream does: flushing what
    /// it holds, shutting down.
    #[tokio::test(start_paused = true)]
    async fn flush_and_shutdown_reach_the_stream_underneath() {
        let (server, mut client) = tokio::io::duplex(64);
        let (mut marked, _quiet) = Marked::new(tokio::io::BufWriter::new(server));
        let hour = Duration::from_secs(3600);
        let mut one = [0; 1];
        marked.write_all(b"x").await.unwrap();
        marked.flush().await.unwrap();
        tokio::time::timeout(hour, client.read_exact(&mut one))
            .await
            .expect("flushed")
            .unwrap();
        marked.shutdown().await.unwrap();
        let end = tokio::time::timeout(hour, client.read(&mut one)).await;
        assert_eq!(end.expect("shut down").unwrap(), 0);
    }

    /// A TCP connection on loopback: the client's end and the accepted one.
    async fn loopback() -> (TcpStream, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        (client, accepted)
    }

    /// The server's own stack, on a loopback socket: bytes both ways, and
    /// vectored writes offered to hyper as TCP offers them.
    #[tokio::test]
    async fn a_plain_transport_carries_bytes_both_ways() {
        let (mut client, accepted) = loopback().await;
        let (mut server, _quiet) = Marked::new(Transport::Plain(accepted));
        assert!(server.is_write_vectored(), "as TCP is");
        client.write_all(b"ping").await.unwrap();
        let mut four = [0; 4];
        server.read_exact(&mut four).await.unwrap();
        assert_eq!(&four, b"ping");
        let slices = [io::IoSlice::new(b"po"), io::IoSlice::new(b"ng")];
        // Four bytes into an empty socket buffer: written whole.
        assert_eq!(server.write_vectored(&slices).await.unwrap(), 4);
        server.write_all(b"!").await.unwrap();
        server.flush().await.unwrap();
        server.shutdown().await.unwrap();
        let mut answer = Vec::new();
        // A bound, not a wait: the end arrives at once unless shutdown is lost.
        tokio::time::timeout(Duration::from_secs(30), client.read_to_end(&mut answer))
            .await
            .expect("the end of the stream")
            .unwrap();
        assert_eq!(answer, b"pong!");
    }

    /// A server's TLS configuration for `localhost`, signed by a CA of its
    /// own, and a client's trusting that CA.
    fn tls_configs() -> (rustls::ServerConfig, rustls::ClientConfig) {
        use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![leaf.der().clone()],
                rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
            )
            .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.der().clone()).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        (server, client)
    }

    /// What a TLS transport took while the socket was full waits in
    /// rustls, and goes out on flush, not only with the next write or the
    /// shutdown: hyper flushes an answer and then waits for the next
    /// request, so an answer's tail would otherwise wait with it.
    #[tokio::test]
    async fn a_tls_transport_flushes_what_a_full_socket_held_back() {
        use futures_util::FutureExt;
        let (server_config, client_config) = tls_configs();
        let (client, accepted) = loopback().await;
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let (server, client) = tokio::join!(
            tokio_rustls::TlsAcceptor::from(Arc::new(server_config)).accept(accepted),
            tokio_rustls::TlsConnector::from(Arc::new(client_config)).connect(name, client)
        );
        let mut server = Transport::Tls(Box::new(server.unwrap()));
        let mut client = client.unwrap();
        // Written until nothing more is taken: the sockets' buffers are
        // full, and what rustls took last is still in its own.
        let chunk = [7; 16 * 1024];
        let mut sent = 0;
        while let Some(written) = server.write(&chunk).now_or_never() {
            let written = written.unwrap();
            assert!(written > 0, "a write takes bytes or waits");
            sent += written;
            assert!(sent < 1 << 30, "a socket takes less than a GiB unread");
        }
        let read = tokio::spawn(async move {
            let mut received = vec![0; sent];
            client.read_exact(&mut received).await.map(|_| received)
        });
        // No write and no shutdown follow: the flush alone must send it.
        server.flush().await.unwrap();
        // A bound, not a wait: with the flush done, every byte is in the
        // socket and read at once.
        let received = tokio::time::timeout(Duration::from_secs(30), read)
            .await
            .expect("every byte written reaches the client after the flush")
            .unwrap()
            .unwrap();
        assert!(received.iter().all(|&b| b == 7));
        drop(server); // open until the client has read
    }
}
