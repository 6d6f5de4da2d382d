//! The threads that run argon2, and nothing else: a fixed set, lending
//! each job the working memory they share (`working_memory.rs`: buffers
//! kept for reuse within a budget). Once no buffer has been given back for
//! [`RELEASE_AFTER_IDLE`] (in the proxy), the spare ones are freed, so a
//! proxy whose logins are all cached holds none.

use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::auth::working_memory::WorkingMemory;

/// Long enough that a burst of logins reuses the buffer, short enough that
/// an idle proxy gives the memory back soon after.
pub const RELEASE_AFTER_IDLE: Duration = Duration::from_secs(5);

type Job = Box<dyn FnOnce(&WorkingMemory) + Send>;

pub struct VerifierThreads {
    jobs: SyncSender<Job>,
}

impl VerifierThreads {
    /// Jobs must arrive with a permit of a semaphore sized `threads`, so the
    /// queue never holds more than there are threads to take them.
    pub fn new(threads: usize, release_after_idle: Duration, memory: Arc<WorkingMemory>) -> Self {
        let (jobs, queue) = sync_channel::<Job>(threads);
        let queue = Arc::new(Mutex::new(queue));
        for i in 0..threads {
            let (queue, memory) = (queue.clone(), memory.clone());
            std::thread::Builder::new()
                .name(format!("argon2-verify-{i}"))
                .spawn(move || work(&queue, &memory, release_after_idle))
                .expect("spawning a verifier thread");
        }
        Self { jobs }
    }

    /// Queues `job`; `None` when the queue is full.
    pub fn run<T: Send + 'static>(
        &self,
        job: impl FnOnce(&WorkingMemory) -> T + Send + 'static,
    ) -> Option<oneshot::Receiver<T>> {
        let (tx, rx) = oneshot::channel();
        self.jobs
            .try_send(Box::new(move |memory: &WorkingMemory| {
                let _ = tx.send(job(memory));
            }))
            .ok()?;
        Some(rx)
    }
}

fn work(queue: &Mutex<Receiver<Job>>, memory: &WorkingMemory, release_after_idle: Duration) {
    loop {
        let next = {
            // The lock is held only to take a job, not to run it.
            let queue = queue.lock().unwrap_or_else(|e| e.into_inner());
            // One thread at a time waits for the next job (holding the
            // queue), the others for the queue. The waiting one is often
            // not the one that ran the last job, so it looks after the
            // spare memory, whoever used it, and waits no longer than
            // until the memory may go: an idle proxy wakes one thread per
            // period.
            let until_idle = memory.release_if_idle(release_after_idle);
            queue.recv_timeout(until_idle)
        };
        match next {
            Ok(job) => job(memory),
            Err(RecvTimeoutError::Timeout) => {} // released, if idle, before the next wait
            Err(RecvTimeoutError::Disconnected) => return, // the Authenticator is gone
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::password;

    async fn run<T: Send + 'static>(
        threads: &VerifierThreads,
        job: impl FnOnce(&WorkingMemory) -> T + Send + 'static,
    ) -> T {
        threads.run(job).expect("queue has room").await.unwrap()
    }

    const IDLE: Duration = Duration::from_millis(100);

    /// `count` threads that free idle memory after [`IDLE`], and the memory
    /// they share, after one login.
    async fn after_one_login(count: usize) -> (VerifierThreads, Arc<WorkingMemory>) {
        let memory = Arc::new(WorkingMemory::new(64 << 20, Duration::ZERO));
        let threads = VerifierThreads::new(count, IDLE, memory.clone());
        let hash = password::hash_password("pw").unwrap();
        let verifier = password::Verifier::argon2id(&hash).unwrap();
        let verified = run(&threads, move |memory| verifier.verify_in("pw", memory)).await;
        assert_eq!(verified, Ok(true));
        assert_eq!(
            memory.allocated_blocks(),
            19 * 1024,
            "19 MiB of 1 KiB blocks after a hash"
        );
        (threads, memory)
    }

    #[tokio::test]
    async fn working_memory_is_kept_through_a_burst_and_freed_when_idle() {
        let (threads, memory) = after_one_login(1).await;
        let held = memory.allocated_blocks();
        // The next job comes before the idle period ends: still there.
        run(&threads, |_| ()).await;
        assert_eq!(memory.allocated_blocks(), held);
        // The release is what this test is about, and it is timed by
        // design: wait past it.
        tokio::time::sleep(IDLE * 3).await;
        run(&threads, |_| ()).await;
        assert_eq!(memory.allocated_blocks(), 0);
    }

    /// With more threads than logins (the default: one thread per core),
    /// the thread that waits for the next job is often not the one that
    /// ran the last: it must still give the memory back. A fault drill
    /// found a proxy holding its logins' 38 MiB long after the last one.
    #[tokio::test]
    async fn working_memory_is_freed_when_idle_whichever_thread_waits_for_jobs() {
        let (_threads, memory) = after_one_login(2).await;
        // The release is timed by design; what is asserted is that it
        // comes, well within a bound far past the idle period.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while memory.allocated_blocks() != 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "19 MiB still held 10 s after the only login"
            );
            tokio::time::sleep(IDLE / 4).await;
        }
    }
}
