//! The threads that do the work on large bodies read whole, so that the
//! other connections on a runtime worker thread never wait for one.
//!
//! Some bodies are read whole and worked on in one synchronous step: label
//! mode's push bodies checked and rewritten (remote write, OTLP metrics,
//! about 1.5 µs per KiB decompressed), rule groups and silences written
//! again from what was checked, and upstream answers filtered for a tenant
//! (Prometheus' `rules` and `alerts`, Alertmanager's). A usual one takes a
//! fraction of a millisecond and runs in place. The largest the limits
//! allow takes from about 100 ms (a push at `limits.max_decompressed_bytes`)
//! to a second (a YAML rule group at `limits.max_body_bytes`): run in
//! place, every other connection of that worker thread, other tenants'
//! queries among them, waits as long. From [`LARGE_BODY_BYTES`] on (or
//! [`LARGE_INFLATED_BYTES`] for a compressed body that inflates that
//! far), the step runs on one of a fixed set of threads of its own,
//! one per core, and the request waits for it without holding its worker.
//!
//! A fixed set, not tokio's `block_in_place` or its blocking pool: those
//! move the work among threads that come and go, and each thread the work
//! touched kept its buffers and its allocator arena; with glibc the
//! proxy's RSS grew threefold under large pushes (docs/benchmarks.md,
//! "Large pushes beside queries"). Here, as when the steps ran on the
//! runtime's workers, as many threads as cores ever hold them, and at most
//! one step per thread runs at once, which bounds their memory as the
//! worker count did.
//!
//! The large bodies held, still arriving, waiting for a turn or being
//! worked on, are bounded in bytes if `limits.max_large_body_bytes_held`
//! is set (`http/large_bodies.rs`): when large batches arrive faster than
//! the workers check them, the next one is refused at once with a 503 its
//! sender retries after a while, instead of held until the sender gives
//! up on it (Prometheus after `remote_timeout`, 30 s) and sends it again
//! into the same queue.

use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{oneshot, Semaphore};

use crate::http::error::ProxyError;
pub use crate::http::large_bodies::LARGE_BODY_BYTES;
use crate::http::large_bodies::{AtTheBound, LargeBodyBytes};
use crate::ops::metrics::GaugeHeld;
use crate::ops::panics;

/// The size a compressed body inflates to from which its step runs on a
/// body worker, however small it came: the work goes by what the step
/// inflates, and gzip inflates up to about a thousand times, so a body
/// under [`LARGE_BODY_BYTES`] may carry the largest the limits allow.
/// Twice what a body at that threshold usually inflates to (snappy's
/// ratio on remote write is about four), so that the usual batches are
/// judged as before. A step run in place on a body that only says it
/// inflates to less (gzip's trailer) must stop inflating here itself
/// (`push.rs`).
pub const LARGE_INFLATED_BYTES: u64 = 2 * 1024 * 1024;

/// What the body workers judge a body by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BodySize {
    /// As received: what the body holds while it waits.
    pub received: usize,
    /// What it inflates to, as far as can be known before the step: its
    /// size as received if it is not compressed, snappy's declared size
    /// (all its decompression can write), gzip's trailer (the sender's
    /// word).
    pub inflates_to: u64,
}

impl From<usize> for BodySize {
    /// A body the step reads as it came.
    fn from(received: usize) -> Self {
        Self {
            received,
            inflates_to: received as u64,
        }
    }
}

impl BodySize {
    /// Whether its step runs on a body worker.
    pub fn is_large(self) -> bool {
        self.received >= LARGE_BODY_BYTES || self.inflates_to >= LARGE_INFLATED_BYTES
    }
}

type Job = Box<dyn FnOnce() + Send>;

#[derive(Debug)]
pub struct BodyWorkers {
    jobs: SyncSender<Job>,
    /// One per thread: a job is queued only with one, and gives it back
    /// when it has run (not when its request goes away), so the jobs
    /// queued and running never outnumber the threads, and sending one
    /// never waits for room.
    turns: Arc<Semaphore>,
    /// Large bodies waiting for a turn or being worked on
    /// (`tenant_proxy_large_bodies`).
    in_work: Gauge,
    /// The bytes of large bodies held, proxy-wide, and their bound.
    bytes: LargeBodyBytes,
    jobs_run: Counter,
}

/// What the body workers count the large bodies in their care in.
#[derive(Clone, Debug, Default)]
pub struct LargeBodyMetrics {
    pub count: Gauge,
    /// Steps handed to a body worker (`tenant_proxy_body_worker_jobs_total`).
    pub jobs: Counter,
}

impl BodyWorkers {
    /// `threads` threads (at least one), named `body-worker-<i>`, holding
    /// large bodies as far as `bytes` leaves room, counted in `metrics`.
    pub fn new(threads: usize, bytes: LargeBodyBytes, metrics: LargeBodyMetrics) -> Self {
        let threads = threads.max(1);
        let (jobs, queue) = sync_channel::<Job>(threads);
        let queue = Arc::new(Mutex::new(queue));
        for i in 0..threads {
            let queue = queue.clone();
            std::thread::Builder::new()
                .name(format!("body-worker-{i}"))
                .spawn(move || work(&queue))
                .expect("spawning a body worker thread");
        }
        Self {
            jobs,
            turns: Arc::new(Semaphore::new(threads)),
            in_work: metrics.count,
            bytes,
            jobs_run: metrics.jobs,
        }
    }

    /// One per core, as tokio counts its default worker threads.
    pub fn per_core(bytes: LargeBodyBytes, metrics: LargeBodyMetrics) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::new(cores, bytes, metrics)
    }

    /// The bytes of large bodies held, which bodies being read count in
    /// too.
    pub fn bytes(&self) -> &LargeBodyBytes {
        &self.bytes
    }

    /// Runs `step`, the work on a body of `size` (its bytes as received, or
    /// a [`BodySize`]): in place if the body is small, else on a body
    /// worker once one is free, or not at all if the large bodies held
    /// already come to the bound (503, retried). A step that panics there
    /// is an internal error, logged as a panic in a request's handling is
    /// (without its message), and its thread goes on to the next; in
    /// place, the request's own catch takes it.
    pub async fn run<T: Send + 'static>(
        &self,
        size: impl Into<BodySize>,
        step: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, ProxyError> {
        self.run_held(size, None, step).await
    }

    /// [`run`](Self::run) for a body whose bytes are `counted` already,
    /// as they arrived (`http::body::read_held`): held on, not counted
    /// again.
    pub async fn run_held<T: Send + 'static>(
        &self,
        size: impl Into<BodySize>,
        counted: Option<GaugeHeld>,
        step: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, ProxyError> {
        let size = size.into();
        if !size.is_large() {
            return Ok(step());
        }
        // Counted from now (or from its arrival) until the step has run,
        // or until its request goes away before the step was handed over.
        let counted = self.hold(counted, size.received)?;
        let turn =
            (self.turns.clone().acquire_owned().await).expect("the semaphore is never closed");
        let (done, result) = oneshot::channel();
        let job: Job = Box::new(move || {
            let value = panics::caught_step(step);
            // Given back before the answer, so that a request that has its
            // answer finds the turn free again.
            drop((turn, counted));
            if let Some(value) = value {
                let _ = done.send(value);
            }
        });
        self.jobs.try_send(job).map_err(|e| {
            ProxyError::Internal(match e {
                TrySendError::Full(_) => "no room for a body worker's job".into(),
                TrySendError::Disconnected(_) => "the body workers are gone".into(),
            })
        })?;
        self.jobs_run.inc();
        result
            .await
            .map_err(|_| ProxyError::Internal("the request's handling failed unexpectedly".into()))
    }

    /// Counts a large body as held, with its bytes, if the bound leaves
    /// room for them (`LargeBodyBytes::hold_up_to`). The body and its
    /// bytes stay counted until both are dropped.
    fn hold(
        &self,
        counted: Option<GaugeHeld>,
        received: usize,
    ) -> Result<(GaugeHeld, GaugeHeld), ProxyError> {
        let bytes = (self.bytes.hold_up_to(counted, received))
            .map_err(|AtTheBound| ProxyError::LargeBodiesHeld)?;
        Ok((GaugeHeld::new(&self.in_work), bytes))
    }
}

fn work(queue: &Mutex<Receiver<Job>>) {
    loop {
        // The lock is held only to take a job, not to run it.
        let next = queue.lock().unwrap_or_else(|e| e.into_inner()).recv();
        match next {
            Ok(job) => job(),
            Err(_) => return, // the workers' owner is gone
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::pin::{pin, Pin};
    use std::sync::mpsc;
    use std::task::Poll;
    use std::time::Duration;
    use tokio::task::JoinHandle;

    const BOUND: Duration = Duration::from_secs(10);

    /// One body worker, holding at most `max_bytes_held` (0: unbounded).
    fn one_thread(max_bytes_held: u64) -> BodyWorkers {
        let bytes = LargeBodyBytes::new(Gauge::default(), max_bytes_held);
        BodyWorkers::new(1, bytes, LargeBodyMetrics::default())
    }

    fn thread_name() -> Option<String> {
        std::thread::current().name().map(str::to_owned)
    }

    /// Polls `future` once.
    async fn poll_once<F: Future>(future: Pin<&mut F>) -> Poll<F::Output> {
        let mut future = Some(future);
        std::future::poll_fn(|cx| Poll::Ready(future.take().unwrap().poll(cx))).await
    }

    /// A large step, started on a task of its own, which holds its body
    /// worker until released through the sender returned (or `BOUND`
    /// passes). The task answers whether it was released.
    async fn held_step(
        workers: &Arc<BodyWorkers>,
    ) -> (JoinHandle<Result<bool, ProxyError>>, mpsc::Sender<()>) {
        let (started_tx, started) = oneshot::channel();
        let (release, release_rx) = mpsc::channel::<()>();
        let step = tokio::spawn({
            let workers = workers.clone();
            async move {
                let step = move || {
                    started_tx.send(()).unwrap();
                    release_rx.recv_timeout(BOUND).is_ok()
                };
                workers.run(LARGE_BODY_BYTES, step).await
            }
        });
        started.await.unwrap();
        (step, release)
    }

    /// A large step runs on a body worker, a smaller one where it was
    /// asked for.
    #[tokio::test]
    async fn large_steps_run_on_a_body_worker_and_small_ones_in_place() {
        let workers = one_thread(0);
        let here = thread_name();
        let small = workers.run(LARGE_BODY_BYTES - 1, thread_name).await;
        assert_eq!(small.unwrap(), here);
        assert_eq!(workers.jobs_run.get(), 0);
        let large = workers.run(LARGE_BODY_BYTES, thread_name).await;
        assert_eq!(large.unwrap().as_deref(), Some("body-worker-0"));
        assert_eq!(workers.jobs_run.get(), 1, "counted as a job");
    }

    /// With one runtime thread, a task spawned while a large step runs
    /// still runs: in place, the step would keep it from running until
    /// the step ends, which here waits for that task.
    #[tokio::test(flavor = "current_thread")]
    async fn a_large_step_leaves_the_runtime_thread_to_the_other_tasks() {
        let workers = Arc::new(one_thread(0));
        let (step, release) = held_step(&workers).await;
        let other = tokio::spawn(async { "ran" });
        let ran = tokio::time::timeout(BOUND, other).await;
        release.send(()).unwrap();
        assert_eq!(ran.expect("the other task ran").unwrap(), "ran");
        assert!(step.await.unwrap().unwrap(), "released, not timed out");
    }

    /// Large steps take turns, one per thread: with the one thread busy
    /// the next ones wait, without blocking the runtime thread on a full
    /// queue, and run once it is free.
    #[tokio::test]
    async fn large_steps_take_turns_one_per_thread() {
        let workers = Arc::new(one_thread(0));
        let (first, release) = held_step(&workers).await;
        let mut second = pin!(workers.run(LARGE_BODY_BYTES, || "second"));
        let mut third = pin!(workers.run(LARGE_BODY_BYTES, || "third"));
        assert!(poll_once(second.as_mut()).await.is_pending());
        assert!(poll_once(third.as_mut()).await.is_pending());
        assert_eq!(workers.in_work.get(), 3, "one worked on, two waiting");
        release.send(()).unwrap();
        assert!(first.await.unwrap().unwrap(), "released, not timed out");
        assert_eq!(second.await.unwrap(), "second");
        assert_eq!(third.await.unwrap(), "third");
        assert_eq!(workers.in_work.get(), 0);
    }

    /// A request that goes away while its step runs leaves the turn with
    /// the step until it has run, so that the jobs never outnumber the
    /// threads (a queue full of orphans would have made a send wait).
    #[tokio::test]
    async fn a_step_keeps_its_turn_until_it_has_run_if_its_request_goes_away() {
        let workers = Arc::new(one_thread(0));
        let (first, release) = held_step(&workers).await;
        first.abort();
        assert!(first.await.unwrap_err().is_cancelled());
        assert_eq!(workers.turns.available_permits(), 0, "the step still runs");
        assert_eq!(workers.in_work.get(), 1);
        release.send(()).unwrap();
        assert_eq!(
            workers.run(LARGE_BODY_BYTES, || "next").await.unwrap(),
            "next"
        );
        assert_eq!(workers.turns.available_permits(), 1);
        assert_eq!(workers.in_work.get(), 0);
    }

    /// A small body that inflates to [`LARGE_INFLATED_BYTES`] or more is
    /// large: the work goes by what its step inflates.
    #[tokio::test]
    async fn a_small_body_that_inflates_far_is_large() {
        let workers = one_thread(0);
        let here = thread_name();
        let size = |inflates_to| BodySize {
            received: 1024,
            inflates_to,
        };
        let below = workers.run(size(LARGE_INFLATED_BYTES - 1), thread_name);
        assert_eq!(below.await.unwrap(), here);
        let at = workers.run(size(LARGE_INFLATED_BYTES), thread_name).await;
        assert_eq!(at.unwrap().as_deref(), Some("body-worker-0"));
    }

    /// Beyond the bound, a large body is refused at once (a request that
    /// waited would hold its body); one whose request went away while
    /// waiting makes room again; and a body is taken when nothing else is
    /// held, however large.
    #[tokio::test]
    async fn the_bytes_held_are_bounded_but_a_body_alone_is_always_taken() {
        let large = LARGE_BODY_BYTES as u64;
        let workers = Arc::new(one_thread(2 * large));
        let (first, release) = held_step(&workers).await;
        // Boxed, so that dropping it drops the request.
        let mut second = Box::pin(workers.run(LARGE_BODY_BYTES, || "second"));
        assert!(poll_once(second.as_mut()).await.is_pending());
        assert_eq!(workers.bytes.held(), 2 * large as i64, "at the bound");
        let third = workers.run(1, || "third").await;
        assert_eq!(third.unwrap(), "third", "a small body is not held");
        let mut fourth = pin!(workers.run(LARGE_BODY_BYTES, || "fourth"));
        let refused = poll_once(fourth.as_mut()).await;
        assert!(
            matches!(refused, Poll::Ready(Err(ProxyError::LargeBodiesHeld))),
            "{refused:?}"
        );
        assert_eq!(workers.in_work.get(), 2, "the refused one is not counted");
        assert_eq!(workers.jobs_run.get(), 1, "nor made a job");
        drop(second);
        assert_eq!(workers.bytes.held(), large as i64, "room made again");
        let mut fifth = pin!(workers.run(LARGE_BODY_BYTES, || "fifth"));
        assert!(poll_once(fifth.as_mut()).await.is_pending(), "waits again");
        release.send(()).unwrap();
        assert!(first.await.unwrap().unwrap(), "released, not timed out");
        assert_eq!(fifth.await.unwrap(), "fifth");
        assert_eq!(workers.bytes.held(), 0);
        assert_eq!(workers.in_work.get(), 0);
        let alone = workers.run(3 * LARGE_BODY_BYTES, || "alone").await;
        assert_eq!(alone.unwrap(), "alone", "over the bound, but alone");
        assert_eq!(workers.bytes.held(), 0);
    }

    /// A step that panics is an internal error, and its thread takes the
    /// next step.
    #[tokio::test]
    async fn a_panicking_step_is_an_internal_error_and_the_thread_goes_on() {
        let workers = one_thread(0);
        let panicked = workers
            .run(LARGE_BODY_BYTES, || -> u8 { panic!("a broken step") })
            .await;
        assert!(
            matches!(panicked, Err(ProxyError::Internal(_))),
            "{panicked:?}"
        );
        assert_eq!(workers.run(LARGE_BODY_BYTES, || 7).await.unwrap(), 7);
    }
}
