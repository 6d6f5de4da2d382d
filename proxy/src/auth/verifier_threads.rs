//! The threads that run argon2, and nothing else: a fixed set, lending
//! each job the working memory they share (`working_memory.rs`: buffers
//! kept for reuse within a budget). A thread that has had no work for a
//! while ([`RELEASE_AFTER_IDLE`] in the proxy) frees the spare buffers if
//! no other thread has used one since, so a proxy whose logins are all
//! cached holds none.

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
    // Whether this thread has run a job (and so given a buffer back to the
    // pool) since it last asked the pool to release idle memory: only then
    // does it wait with a timeout, to ask again.
    let mut worked_since_release = false;
    loop {
        let next = {
            // The lock is held only to take a job, not to run it.
            let queue = queue.lock().unwrap_or_else(|e| e.into_inner());
            if worked_since_release {
                queue.recv_timeout(release_after_idle)
            } else {
                queue.recv().map_err(|_| RecvTimeoutError::Disconnected)
            }
        };
        match next {
            Ok(job) => {
                job(memory);
                worked_since_release = true;
            }
            Err(RecvTimeoutError::Timeout) => {
                memory.release_if_idle(release_after_idle);
                worked_since_release = false;
            }
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

    #[tokio::test]
    async fn working_memory_is_kept_through_a_burst_and_freed_when_idle() {
        let idle = Duration::from_millis(100);
        let memory = Arc::new(WorkingMemory::new(64 << 20, Duration::ZERO));
        let threads = VerifierThreads::new(1, idle, memory.clone());
        let hash = password::hash_password("pw").unwrap();
        let verifier = password::Verifier::argon2id(&hash).unwrap();
        let verified = run(&threads, move |memory| verifier.verify_in("pw", memory)).await;
        assert_eq!(verified, Ok(true));
        let held = memory.allocated_blocks();
        assert_eq!(held, 19 * 1024, "19 MiB of 1 KiB blocks after a hash");
        // The next job comes before the idle period ends: still there.
        run(&threads, |_| ()).await;
        assert_eq!(memory.allocated_blocks(), held);
        // The release is what this test is about, and it is timed by
        // design: wait past it.
        tokio::time::sleep(idle * 3).await;
        run(&threads, |_| ()).await;
        assert_eq!(memory.allocated_blocks(), 0);
    }
}
