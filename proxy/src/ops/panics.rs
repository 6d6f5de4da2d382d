//! Panics as log events, and the few the proxy survives on purpose.
//!
//! A panic is a bug: logged at error level with its message and where it
//! happened, one log line (one JSON object in `json` mode) rather than the
//! default hook's free text, which log pipelines mangle. A panic inside
//! [`survive`] is a dependency's, on an input a client chose
//! (promql-parser 0.11 panics on some queries): the client is refused and
//! the proxy carries on, so it is a warning, and its message is left out.
//! A message may quote the input (one of `str`'s slicing panics quotes up
//! to 256 bytes of the string), and the input is a tenant's; nor should a
//! tenant be able to write error lines into the platform's log at will.
//! A panic anywhere else in a request's handling is [`caught`] around it:
//! still logged as the bug it is, but that request is answered (500, 503 on
//! a push path) and its connection goes on serving.

use std::cell::Cell;
use std::future::Future;
use std::panic::{AssertUnwindSafe, PanicHookInfo, UnwindSafe};

use futures_util::FutureExt as _;

thread_local! {
    /// Set on this thread while [`survive`] runs a call: the panic hook
    /// runs on the panicking thread, before the unwind reaches the catch.
    static SURVIVING: Cell<bool> = const { Cell::new(false) };
}

/// Runs `call`, turning its panic into `None`. Only for calls that touch
/// no shared state, so that nothing is left half-changed by the unwind.
pub fn survive<T>(call: impl FnOnce() -> T + UnwindSafe) -> Option<T> {
    let outer = SURVIVING.replace(true);
    let outcome = std::panic::catch_unwind(call);
    SURVIVING.set(outer);
    outcome.ok()
}

/// Runs `work`, turning a panic in it into `None`. Without it a panic
/// unwinds the task serving the connection: its client gets no answer, and
/// on HTTP/1 the connection closes under whatever it had queued. Asserted
/// unwind-safe: what requests share is counters, permits released on drop,
/// and state behind locks; a lock poisoned by a panic fails the next
/// request to take it just as it did before this catch.
pub async fn caught<F: Future>(work: F) -> Option<F::Output> {
    AssertUnwindSafe(work).catch_unwind().await.ok()
}

/// Whether this thread is inside [`survive`] (for a fuzz target's hook,
/// which prints only the panics that would escape).
pub fn surviving() -> bool {
    SURVIVING.get()
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
    if surviving() {
        tracing::warn!(location, "panic survived; its request is refused");
    } else {
        tracing::error!(panic = message, location, "panic");
    }
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::EnvFilter;

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
        assert!(!SURVIVING.get());
        assert_eq!(
            survive(|| (SURVIVING.get(), survive(|| 1))),
            Some((true, Some(1)))
        );
        assert!(!SURVIVING.get());
    }

    #[tokio::test]
    async fn caught_returns_what_the_work_returned_or_none_after_a_panic() {
        assert_eq!(caught(async { 7 }).await, Some(7));
        // A panic after the first poll: the catch holds across awaits.
        let late = async {
            tokio::task::yield_now().await;
            panic!("the proxy's own bug");
        };
        assert_eq!(caught::<_>(late).await, None::<u8>);
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
}
