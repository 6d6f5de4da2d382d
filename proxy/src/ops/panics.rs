//! Panics as log events, and the ones the proxy survives.
//!
//! A panic is a bug: logged at error level with where it happened, one log
//! line (one JSON object in `json` mode) rather than the default hook's
//! free text, which log pipelines mangle. Its message is logged only for a
//! panic outside any request: a message may quote what the code was
//! handling (one of `str`'s slicing panics quotes up to 256 bytes of the
//! string), and in a request that is a tenant's input or its credential.
//!
//! Two kinds are caught, so that the proxy carries on:
//! - a panic inside [`survive`], a dependency's on an input a client chose
//!   (promql-parser 0.11 panics on some queries): the client is refused,
//!   and it is a warning, since a tenant should not be able to write error
//!   lines into the platform's log at will;
//! - any other panic in a request's handling, [`caught`] around it: still
//!   an error, but that request is answered (500, 503 on a push path) and
//!   its connection goes on serving. Its response body is polled after
//!   the handling returned, by hyper, so it is caught too ([`CaughtBody`]):
//!   a panic there ends that response as failed (the client sees it cut
//!   short, never complete), and is logged the same way.

use std::cell::Cell;
use std::future::Future;
use std::panic::{AssertUnwindSafe, PanicHookInfo, UnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::body::{Body, Frame, SizeHint};

use crate::http::body::BoxError;

/// What a panic on this thread would unwind into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Catch {
    /// Nothing of ours: the thread or task ends.
    Nothing,
    /// [`caught`]: a request, answered 500.
    Request,
    /// [`survive`]: a call whose panic is expected of a dependency.
    Survive,
}

thread_local! {
    /// Set on this thread while a catching call runs: the panic hook runs
    /// on the panicking thread, before the unwind reaches the catch.
    static CATCH: Cell<Catch> = const { Cell::new(Catch::Nothing) };
}

fn catching<T>(catch: Catch, call: impl FnOnce() -> T + UnwindSafe) -> Option<T> {
    let outer = CATCH.replace(catch);
    let outcome = std::panic::catch_unwind(call);
    CATCH.set(outer);
    outcome.ok()
}

/// Runs `call`, turning its panic into `None`. Only for calls that touch
/// no shared state, so that nothing is left half-changed by the unwind.
pub fn survive<T>(call: impl FnOnce() -> T + UnwindSafe) -> Option<T> {
    catching(Catch::Survive, call)
}

pin_project_lite::pin_project! {
    /// A request's future, its panic turned into `None` ([`caught`]).
    pub struct Caught<F> {
        #[pin]
        work: F,
    }
}

/// Runs a request's `work`, turning a panic in it into `None`. Without it
/// a panic unwinds the task serving the connection: its client gets no
/// answer, and on HTTP/1 the connection closes under whatever it had
/// queued. Asserted unwind-safe: what requests share is counters, permits
/// released on drop, and state behind locks; a lock poisoned by a panic
/// fails the next request to take it just as it did before this catch.
/// A future of its own rather than an `async fn`: one wrapping the work
/// moved the request's 4 KiB future once more per request.
pub fn caught<F: Future>(work: F) -> Caught<F> {
    Caught { work }
}

impl<F: Future> Future for Caught<F> {
    type Output = Option<F::Output>;

    /// Each poll caught, on whichever thread it runs.
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let work = self.project().work;
        match catching(Catch::Request, AssertUnwindSafe(|| work.poll(cx))) {
            Some(Poll::Ready(output)) => Poll::Ready(Some(output)),
            Some(Poll::Pending) => Poll::Pending,
            None => Poll::Ready(None),
        }
    }
}

/// A step of a request's handling run away from its future (on a thread
/// of its own), its panic turned into `None` and logged as [`caught`]
/// logs one: without its message, which may quote the request's data.
pub fn caught_step<T>(step: impl FnOnce() -> T) -> Option<T> {
    catching(Catch::Request, AssertUnwindSafe(step))
}

pin_project_lite::pin_project! {
    /// A response body whose every poll is caught like its request's
    /// handling ([`caught_body`]).
    pub struct CaughtBody<B> {
        #[pin]
        body: B,
    }
}

/// Catches a panic in `body`'s polls. hyper polls a response body after the
/// request's future has returned, outside [`caught`]: there a panic would
/// unwind the connection's task (HTTP/1) or the stream's (HTTP/2), with its
/// message logged, and the message may quote the answer being relayed. A
/// panic becomes the body's error instead, which hyper turns into a
/// response cut short (the connection closed, or the stream reset), never
/// into a complete one.
pub fn caught_body<B>(body: B) -> CaughtBody<B> {
    CaughtBody { body }
}

/// What a response body that panicked ends with.
#[derive(Debug, thiserror::Error)]
#[error("the response body failed unexpectedly")]
pub struct BodyPanicked;

impl<B: Body<Error = BoxError>> Body for CaughtBody<B> {
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let body = self.project().body;
        catching(Catch::Request, AssertUnwindSafe(|| body.poll_frame(cx)))
            .unwrap_or_else(|| Poll::Ready(Some(Err(BodyPanicked.into()))))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Whether this thread is inside [`survive`] (for a fuzz target's hook,
/// which prints only the panics that would escape).
pub fn surviving() -> bool {
    CATCH.get() == Catch::Survive
}

/// Makes every panic a log event (`init_logging` calls it once).
pub fn log_panics() {
    std::panic::set_hook(Box::new(report));
}

fn report(info: &PanicHookInfo<'_>) {
    let location = info.location().map(ToString::to_string).unwrap_or_default();
    let payload = info.payload();
    let message = (payload.downcast_ref::<&str>().copied())
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(not a string)");
    log(&location, message);
}

fn log(location: &str, message: &str) {
    match CATCH.get() {
        Catch::Survive => tracing::warn!(location, "panic survived; its request is refused"),
        Catch::Request => tracing::error!(location, "panic in a request's handling"),
        Catch::Nothing => tracing::error!(panic = message, location, "panic"),
    }
}

/// A response body for tests of the catch.
#[cfg(test)]
pub(crate) mod test_support {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use bytes::Bytes;
    use hyper::body::{Body, Frame};

    use super::{Catch, CATCH};
    use crate::http::body::BoxError;

    /// Sends `partial`, then panics (checking that it is polled under a
    /// request's catch), or ends.
    pub struct Scripted {
        first: Option<Bytes>,
        panics: bool,
    }

    impl Scripted {
        pub fn panicking() -> Self {
            Self::new(true)
        }

        pub fn new(panics: bool) -> Self {
            Self {
                first: Some(Bytes::from_static(b"partial")),
                panics,
            }
        }
    }

    impl Body for Scripted {
        type Data = Bytes;
        type Error = BoxError;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            match self.first.take() {
                Some(first) => Poll::Ready(Some(Ok(Frame::data(first)))),
                None if self.panics => {
                    assert_eq!(CATCH.get(), Catch::Request);
                    panic!("the proxy's own bug, quoting `dXNlcjpzZWNyZXQ=`")
                }
                None => Poll::Ready(None),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::pin::pin;

    use http_body_util::BodyExt;
    use tracing_subscriber::EnvFilter;

    use super::test_support::Scripted;
    use super::*;

    /// What `call` logs on this thread, as JSON lines.
    fn logged(call: &dyn Fn()) -> String {
        crate::ops::access_log::test_support::logged(
            |captured| {
                let writer = move || captured.clone();
                crate::ops::process::subscriber("json", EnvFilter::new("debug"), false, writer)
                    .unwrap()
            },
            call,
        )
    }

    #[test]
    fn survive_returns_what_the_call_returned_or_none_after_a_panic() {
        assert_eq!(survive(|| 7), Some(7));
        assert_eq!(survive(|| -> u8 { panic!("a dependency's bug") }), None);
        // Left as it was found, also when calls nest.
        assert!(!surviving());
        assert_eq!(
            survive(|| (surviving(), survive(|| 1))),
            Some((true, Some(1)))
        );
        assert!(!surviving());
    }

    #[tokio::test]
    async fn caught_returns_what_the_work_returned_or_none_after_a_panic() {
        assert_eq!(caught(async { 7 }).await, Some(7));
        // A panic after the first poll: each poll is caught. Between polls
        // the thread is as it was: other tasks' panics are not requests'.
        let late = async {
            assert_eq!(CATCH.get(), Catch::Request);
            tokio::task::yield_now().await;
            // A survived call inside a request leaves it a request.
            assert_eq!(survive(|| CATCH.get()), Some(Catch::Survive));
            assert_eq!(CATCH.get(), Catch::Request);
            panic!("the proxy's own bug");
        };
        let mut late = pin!(caught(late));
        assert!(futures_util::poll!(late.as_mut()).is_pending());
        assert_eq!(CATCH.get(), Catch::Nothing);
        assert_eq!(late.await, None::<u8>);
        assert_eq!(CATCH.get(), Catch::Nothing);
    }

    #[tokio::test]
    async fn a_caught_body_ends_in_an_error_after_a_panic() {
        let mut body = pin!(caught_body(Scripted::panicking()));
        let first = body.frame().await.expect("a frame").expect("data");
        assert_eq!(first.into_data().unwrap(), "partial");
        assert_eq!(CATCH.get(), Catch::Nothing, "between polls");
        let failed = body.frame().await.expect("an error, not the end");
        assert!(failed.unwrap_err().is::<BodyPanicked>());
        assert_eq!(CATCH.get(), Catch::Nothing);
    }

    /// hyper frames a response by its body's end and size (an empty one
    /// as `Content-Length: 0`, or HTTP/2's end of stream on the head):
    /// the catch leaves both as they were.
    #[test]
    fn a_caught_body_tells_the_end_and_size_of_its_body() {
        let empty = caught_body(crate::http::body::empty());
        assert!(empty.is_end_stream());
        assert_eq!(empty.size_hint().exact(), Some(0));
        let full = caught_body(crate::http::body::full("seven b"));
        assert!(!full.is_end_stream());
        assert_eq!(full.size_hint().exact(), Some(7));
    }

    #[test]
    fn a_survived_panic_is_a_warning_without_its_message() {
        let quoting = "byte index 3 is not a char boundary of `secret-query`";
        let warned = logged(&|| {
            survive(|| log("deps/lex.rs:1:1", quoting));
        });
        assert!(warned.contains(r#""level":"WARN""#), "{warned}");
        assert!(warned.contains("deps/lex.rs:1:1"), "{warned}");
        assert!(!warned.contains("secret-query"), "{warned}");

        let bug = logged(&|| log("src/x.rs:1:1", "the proxy's own bug"));
        assert!(bug.contains(r#""level":"ERROR""#), "{bug}");
        assert!(bug.contains("the proxy's own bug"), "{bug}");
    }

    #[test]
    fn a_panic_in_a_request_is_an_error_without_its_message() {
        let quoting = "byte index 3 is not a char boundary of `dXNlcjpzZWNyZXQ=`";
        let request = || async { log("src/proxy/x.rs:1:1", quoting) };
        let error = logged(&|| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            runtime.block_on(caught(request()));
        });
        assert!(error.contains(r#""level":"ERROR""#), "{error}");
        assert!(error.contains("src/proxy/x.rs:1:1"), "{error}");
        assert!(error.contains("panic in a request's handling"), "{error}");
        assert!(!error.contains("dXNlcjpzZWNyZXQ="), "{error}");
    }

    /// A step of a request run on a thread of its own (a body worker's) is
    /// caught and logged as the request's handling is, without its message,
    /// and leaves the thread as it found it.
    #[test]
    fn a_caught_step_returns_its_value_or_none_and_logs_no_message() {
        assert_eq!(caught_step(|| 7), Some(7));
        let quoting = "index out of range for `team-b` in a pushed label";
        let error = logged(&|| {
            let step = || -> u8 {
                log("src/proxy/push.rs:1:1", quoting);
                panic!("{quoting}")
            };
            assert_eq!(caught_step(step), None);
            assert_eq!(CATCH.get(), Catch::Nothing);
        });
        assert!(error.contains("panic in a request's handling"), "{error}");
        assert!(!error.contains("team-b"), "{error}");
    }
}
