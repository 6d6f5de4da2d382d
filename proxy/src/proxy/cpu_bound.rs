//! The work on a large body that the proxy reads whole, kept from
//! stalling the other connections that share its worker thread.
//!
//! Some bodies are read whole and worked on in one synchronous step: label
//! mode's push bodies checked and rewritten (remote write, OTLP metrics),
//! rule groups and silences written again from what was checked, and the
//! upstream answers filtered for a tenant (Prometheus' `rules` and
//! `alerts`, Alertmanager's). A usual one takes a fraction of a
//! millisecond and runs in place. The largest the limits allow takes from
//! about 100 ms (a push of `limits.max_decompressed_bytes`) to seconds (a
//! rule group of `limits.max_body_bytes`, YAML being slow to read), and
//! every other connection on that worker thread, other tenants' queries
//! among them, would wait as long. From [`LARGE_BODY_BYTES`] on, the step
//! runs under `block_in_place`: tokio hands the worker's other tasks to
//! another thread while it runs.
//!
//! At most one such step per core runs at once, as many as could when each
//! held a worker thread: each may hold a body decompressed to
//! `limits.max_decompressed_bytes`, and the bound keeps their memory where
//! the worker count kept it. The others wait for a turn without holding a
//! thread.

use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::sync::Semaphore;

/// The size of a body (as received, compressed or not) from which its step
/// leaves its worker thread: a remote write of about 1 MiB once
/// decompressed, a couple of milliseconds of work (JSON about as much, a
/// YAML rule group up to 20 ms). A Prometheus batch at its default
/// `max_samples_per_send` (2,000) stays below it, where handing the
/// worker over would cost more than it spares.
pub const LARGE_BODY_BYTES: usize = 256 * 1024;

#[derive(Debug)]
pub struct CpuBound {
    turns: Semaphore,
}

impl CpuBound {
    /// At most `at_once` large steps running together (at least one).
    pub fn new(at_once: usize) -> Self {
        Self {
            turns: Semaphore::new(at_once.max(1)),
        }
    }

    /// One per core, as tokio counts its default worker threads.
    pub fn per_core() -> Self {
        Self::new(std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    /// Runs `step`, the work on a body of `body_bytes`: in place if the
    /// body is small, else once a turn is free, with the worker's other
    /// tasks handed to another thread. A runtime with one thread for
    /// everything (a test's) has no thread to hand them to: there it runs
    /// in place.
    pub async fn run<T>(&self, body_bytes: usize, step: impl FnOnce() -> T) -> T {
        if body_bytes < LARGE_BODY_BYTES
            || Handle::current().runtime_flavor() != RuntimeFlavor::MultiThread
        {
            return step();
        }
        let _turn = self
            .turns
            .acquire()
            .await
            .expect("the semaphore is never closed");
        tokio::task::block_in_place(step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::pin::{pin, Pin};
    use std::sync::mpsc;
    use std::sync::Arc;
    use std::task::Poll;
    use std::time::Duration;
    use tokio::sync::oneshot;
    use tokio::task::JoinHandle;

    const BOUND: Duration = Duration::from_secs(10);

    /// Polls `future` once.
    async fn poll_once<F: Future>(future: Pin<&mut F>) -> Poll<F::Output> {
        let mut future = Some(future);
        std::future::poll_fn(|cx| Poll::Ready(future.take().unwrap().poll(cx))).await
    }

    /// A large step of one turn of `cpu`'s, started on a task of its
    /// own, which holds its thread until released through the sender
    /// returned (or `BOUND` passes). The task answers whether it was
    /// released.
    async fn held_step(cpu: &Arc<CpuBound>) -> (JoinHandle<bool>, mpsc::Sender<()>) {
        let (started_tx, started) = oneshot::channel();
        let (release, release_rx) = mpsc::channel::<()>();
        let step = tokio::spawn({
            let cpu = cpu.clone();
            async move {
                cpu.run(LARGE_BODY_BYTES, move || {
                    started_tx.send(()).unwrap();
                    release_rx.recv_timeout(BOUND).is_ok()
                })
                .await
            }
        });
        started.await.unwrap();
        (step, release)
    }

    /// With one worker thread, a task spawned while a large step holds
    /// that thread still runs: run in place, the step would keep it from
    /// running until the step ends, which here waits for that task.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_large_step_leaves_its_worker_to_the_other_tasks() {
        let cpu = Arc::new(CpuBound::new(1));
        let (step, release) = held_step(&cpu).await;
        let other = tokio::spawn(async { "ran" });
        let ran = tokio::time::timeout(BOUND, other).await;
        release.send(()).unwrap();
        assert_eq!(ran.expect("the other task ran").unwrap(), "ran");
        assert!(step.await.unwrap(), "the step was released, not timed out");
    }

    /// Large steps take turns: with one turn held, the next waits without
    /// running; a small one runs at once, in place.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn large_steps_take_turns_and_small_ones_never_wait() {
        let cpu = Arc::new(CpuBound::new(1));
        let (first, release) = held_step(&cpu).await;

        let mut second = pin!(cpu.run(LARGE_BODY_BYTES, || "second"));
        assert!(poll_once(second.as_mut()).await.is_pending());
        let mut small = pin!(cpu.run(LARGE_BODY_BYTES - 1, || "small"));
        assert_eq!(poll_once(small.as_mut()).await, Poll::Ready("small"));

        release.send(()).unwrap();
        assert!(first.await.unwrap());
        assert_eq!(second.await, "second");
    }
}
