//! Timers reused across requests instead of built for each.
//!
//! Every request armed two timers: hyper's wait for the next request head
//! on its connection, and the proxy's wait for the upstream's answer. Each
//! was allocated, registered in tokio's timer wheel under the wheel's lock
//! when first polled, and taken out under the lock again when dropped:
//! about 2 % of a Loki request's instructions (callgrind,
//! docs/benchmarks.md). A timer kept aside is pushed to its next deadline
//! in place instead: tokio moves a registered timer later with one atomic
//! update, without the lock.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::runtime::{Handle, Id};
use tokio::time::Sleep;

/// Timers kept aside per thread and kind; one more than this is dropped as
/// before. The spares at any moment are about the requests that just
/// finished.
const MAX_SPARE: usize = 64;

/// What a timer waits for. Each kind has its own spares: within a kind the
/// timeout is the same every time, so a reused timer only ever moves later,
/// which tokio does in place (an earlier deadline takes the wheel's lock).
#[derive(Clone, Copy, Debug)]
pub enum Wait {
    /// The next request head on a client's connection (hyper's timeout).
    RequestHead,
    /// An upstream's answer.
    Upstream,
}

type Spares = Vec<(Id, Pin<Box<Sleep>>)>;

thread_local! {
    /// By `Wait`, each with the runtime it is registered with: a timer only
    /// works in its own runtime, and a thread may outlive one (tests run
    /// several).
    static SPARE: RefCell<[Spares; 2]> = const { RefCell::new([Vec::new(), Vec::new()]) };
}

/// A `tokio::time::Sleep` that goes back to its thread's spares when
/// dropped. Like `tokio::time::sleep_until`, it must be made in a runtime.
pub struct ReusedSleep {
    wait: Wait,
    runtime: Id,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl ReusedSleep {
    pub fn until(wait: Wait, deadline: tokio::time::Instant) -> Self {
        let runtime = Handle::current().id();
        let spare = SPARE
            .try_with(|spare| {
                let spare = &mut spare.borrow_mut()[wait as usize];
                match spare.pop() {
                    Some((id, sleep)) if id == runtime => Some(sleep),
                    Some(_) => {
                        // Another runtime's, and so are the rest.
                        spare.clear();
                        None
                    }
                    None => None,
                }
            })
            .ok()
            .flatten();
        let sleep = match spare {
            Some(mut sleep) => {
                sleep.as_mut().reset(deadline);
                sleep
            }
            None => Box::pin(tokio::time::sleep_until(deadline)),
        };
        Self {
            wait,
            runtime,
            sleep: Some(sleep),
        }
    }

    pub fn reset(&mut self, deadline: tokio::time::Instant) {
        if let Some(sleep) = &mut self.sleep {
            sleep.as_mut().reset(deadline);
        }
    }
}

impl Future for ReusedSleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match &mut self.sleep {
            Some(sleep) => sleep.as_mut().poll(cx),
            None => Poll::Ready(()),
        }
    }
}

impl Drop for ReusedSleep {
    fn drop(&mut self) {
        // A spare keeps the waker of its last poller until it is reused or
        // its deadline passes (then it wakes that task once, for nothing):
        // a bounded few task allocations per thread. Polling it here with a
        // no-op waker would drop that waker, but a poll panics while the
        // runtime shuts down, and a drop must not.
        let Some(sleep) = self.sleep.take() else {
            return;
        };
        let (wait, runtime) = (self.wait, self.runtime);
        let _ = SPARE.try_with(move |spare| {
            let spare = &mut spare.borrow_mut()[wait as usize];
            if spare.len() < MAX_SPARE {
                spare.push((runtime, sleep));
            }
        });
    }
}

/// hyper's timer for HTTP/1 connections, made of `ReusedSleep`s. hyper
/// arms it for nothing but the request-head timeout there.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReusingTimer;

impl hyper::rt::Sleep for ReusedSleep {}

impl hyper::rt::Timer for ReusingTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(ReusedSleep::until(
            Wait::RequestHead,
            tokio::time::Instant::now() + duration,
        ))
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(ReusedSleep::until(Wait::RequestHead, deadline.into()))
    }

    /// tokio's clock, as hyper-util's `TokioTimer` has it (tests pause it).
    fn now(&self) -> Instant {
        tokio::time::Instant::now().into()
    }

    fn reset(&self, sleep: &mut Pin<Box<dyn hyper::rt::Sleep>>, new_deadline: Instant) {
        match sleep.as_mut().downcast_mut_pin::<ReusedSleep>() {
            Some(reused) => reused.get_mut().reset(new_deadline.into()),
            None => *sleep = self.sleep_until(new_deadline),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_reused_timer_fires_at_its_new_deadline_not_its_old_one() {
        let start = tokio::time::Instant::now();
        let first = ReusedSleep::until(Wait::Upstream, start + Duration::from_secs(1));
        let beside = ReusedSleep::until(Wait::Upstream, start + Duration::from_secs(1));
        tokio::join!(first, beside);
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        // A spare comes back for the next timer, which must wait its own
        // time: from now, 5 s, not the 1 s the spare was made for. (The
        // other spare stays: only another runtime's are thrown away.)
        let spare = SPARE.with(|spare| {
            let spares = &spare.borrow()[Wait::Upstream as usize];
            let (_, last) = spares.last().expect("the first timers kept");
            (spares.len(), &**last as *const Sleep)
        });
        assert_eq!(spare.0, 2);
        let second = ReusedSleep::until(
            Wait::Upstream,
            tokio::time::Instant::now() + Duration::from_secs(5),
        );
        assert_eq!(
            SPARE.with(|spare| spare.borrow()[Wait::Upstream as usize].len()),
            spare.0 - 1
        );
        let reused = second.sleep.as_ref().expect("a timer");
        assert_eq!(&**reused as *const Sleep, spare.1, "the same timer");
        second.await;
        assert_eq!(start.elapsed(), Duration::from_secs(6));
    }

    #[tokio::test(start_paused = true)]
    async fn a_timer_dropped_before_its_deadline_does_not_fire_later() {
        let start = tokio::time::Instant::now();
        drop(ReusedSleep::until(
            Wait::Upstream,
            start + Duration::from_millis(10),
        ));
        // Reused for a later deadline: waiting past the first one must not
        // end it early.
        let later = ReusedSleep::until(Wait::Upstream, start + Duration::from_secs(3));
        later.await;
        assert_eq!(start.elapsed(), Duration::from_secs(3));
    }

    /// hyper's request-head clock: each sleep waits its own duration, and a
    /// reset moves it to its new deadline.
    #[tokio::test(start_paused = true)]
    async fn hypers_timer_waits_its_duration_and_moves_when_reset() {
        use hyper::rt::Timer;
        let start = tokio::time::Instant::now();
        ReusingTimer.sleep(Duration::from_secs(2)).await;
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        let mut sleep = ReusingTimer.sleep_until(ReusingTimer.now() + Duration::from_secs(1));
        ReusingTimer.reset(&mut sleep, ReusingTimer.now() + Duration::from_secs(3));
        sleep.await;
        assert_eq!(start.elapsed(), Duration::from_secs(5));
    }

    /// A burst's timers are kept only up to the bound.
    #[tokio::test(start_paused = true)]
    async fn at_most_max_spare_timers_are_kept() {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
        let burst: Vec<_> = (0..MAX_SPARE + 1)
            .map(|_| ReusedSleep::until(Wait::RequestHead, deadline))
            .collect();
        drop(burst);
        let kept = SPARE.with(|spare| spare.borrow()[Wait::RequestHead as usize].len());
        assert_eq!(kept, MAX_SPARE);
    }

    #[test]
    fn spares_of_a_runtime_that_is_gone_are_not_reused() {
        let runtime = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap()
        };
        runtime().block_on(async {
            ReusedSleep::until(
                Wait::Upstream,
                tokio::time::Instant::now() + Duration::from_secs(1),
            )
            .await;
        });
        assert_eq!(
            SPARE.with(|spare| spare.borrow()[Wait::Upstream as usize].len()),
            1
        );
        // A second runtime on the same thread: polling the first one's
        // timer would panic (its driver is shut down).
        runtime().block_on(async {
            let start = tokio::time::Instant::now();
            ReusedSleep::until(Wait::Upstream, start + Duration::from_secs(2)).await;
            assert_eq!(start.elapsed(), Duration::from_secs(2));
        });
    }
}
