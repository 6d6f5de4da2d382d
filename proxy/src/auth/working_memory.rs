//! argon2's working memory for the verifier threads: buffers kept for
//! reuse between hashes, all of them together within a budget
//! (`auth.verification_memory_bytes`).
//!
//! A hash's memory cost comes from its PHC string, and with tenant-sync a
//! tenant writes that string (a Secret's `password-hash`). Counted per
//! thread, a few logins against hashes that ask for the most memory
//! accepted would take the pod past its memory limit, and every tenant's
//! gateway with it. Counted here, a hash that finds no room waits for a
//! running one to give its buffer back, and after `wait` its login gets 503
//! (clients retry).
//!
//! Kept buffers are spare memory: they are freed to make room for a larger
//! one, and all of them once no hash has been computed for a while
//! (`RELEASE_AFTER_IDLE` in `verifier_threads.rs`), so a proxy whose
//! logins are all cached holds none. Allocating per hash made glibc keep
//! hundreds of MiB after a burst of logins.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use argon2::Block;

/// No buffer could be had within the wait: the budget is taken by hashes
/// being computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverBudget;

#[derive(Debug)]
pub struct WorkingMemory {
    /// 1 KiB argon2 blocks, all buffers together.
    budget: usize,
    wait: Duration,
    state: Mutex<Pool>,
    returned: Condvar,
}

#[derive(Debug)]
struct Pool {
    /// Buffers not in use.
    spare: Vec<Vec<Block>>,
    /// Blocks allocated: spare and in use.
    allocated: usize,
    /// Hashes waiting for room.
    waiting: usize,
    last_returned: Instant,
}

impl WorkingMemory {
    pub fn new(budget_bytes: u64, wait: Duration) -> Self {
        let blocks = budget_bytes / std::mem::size_of::<Block>() as u64;
        Self {
            budget: usize::try_from(blocks).unwrap_or(usize::MAX),
            wait,
            state: Mutex::new(Pool {
                spare: Vec::new(),
                allocated: 0,
                waiting: 0,
                last_returned: Instant::now(),
            }),
            returned: Condvar::new(),
        }
    }

    /// Runs `f` with a buffer of at least `blocks`, taken from the spare
    /// ones or allocated within the budget, and kept for reuse after.
    pub fn with<T>(
        &self,
        blocks: usize,
        f: impl FnOnce(&mut [Block]) -> T,
    ) -> Result<T, OverBudget> {
        let mut buffer = self.take(blocks)?;
        let result = f(&mut buffer[..blocks]);
        self.give_back(buffer);
        Ok(result)
    }

    fn take(&self, blocks: usize) -> Result<Vec<Block>, OverBudget> {
        let deadline = Instant::now() + self.wait;
        let mut pool = self.lock();
        loop {
            // The smallest spare that fits, so large ones stay for large hashes.
            let fitting = (0..pool.spare.len())
                .filter(|&i| pool.spare[i].len() >= blocks)
                .min_by_key(|&i| pool.spare[i].len());
            if let Some(i) = fitting {
                return Ok(pool.spare.swap_remove(i));
            }
            // Spares too small make room for this one.
            while pool.allocated + blocks > self.budget {
                let Some(freed) = pool.spare.pop() else { break };
                pool.allocated -= freed.len();
            }
            if pool.allocated + blocks <= self.budget {
                pool.allocated += blocks;
                drop(pool);
                return Ok(vec![Block::default(); blocks]);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(OverBudget);
            }
            pool.waiting += 1;
            pool = self
                .returned
                .wait_timeout(pool, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            pool.waiting -= 1;
        }
    }

    fn give_back(&self, buffer: Vec<Block>) {
        let mut pool = self.lock();
        pool.spare.push(buffer);
        pool.last_returned = Instant::now();
        drop(pool);
        self.returned.notify_all();
    }

    /// Frees the spare buffers if none has been given back for `idle`, and
    /// answers how long until that will next be so (never zero unless
    /// `idle` is).
    pub fn release_if_idle(&self, idle: Duration) -> Duration {
        let mut pool = self.lock();
        let since = pool.last_returned.elapsed();
        if since < idle {
            return idle - since;
        }
        let spare: usize = pool.spare.iter().map(Vec::len).sum();
        pool.allocated -= spare;
        pool.spare = Vec::new();
        idle
    }

    /// Blocks allocated, spare and in use.
    pub fn allocated_blocks(&self) -> usize {
        self.lock().allocated
    }

    /// Hashes waiting for a buffer to come back.
    pub fn waiting(&self) -> usize {
        self.lock().waiting
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pool> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::sync::Arc;

    const KIB: u64 = 1024;

    #[test]
    fn a_buffer_is_reused_and_spares_make_room_for_a_larger_one() {
        let memory = WorkingMemory::new(100 * KIB, Duration::ZERO);
        memory.with(40, |b| assert_eq!(b.len(), 40)).unwrap();
        memory.with(30, |b| assert_eq!(b.len(), 30)).unwrap();
        assert_eq!(
            memory.allocated_blocks(),
            40,
            "the 40 was reused for the 30"
        );
        memory.with(90, |_| ()).unwrap();
        assert_eq!(memory.allocated_blocks(), 90, "the 40 freed for the 90");
        assert_eq!(memory.with(101, |_| ()), Err(OverBudget), "never fits");
        memory.release_if_idle(Duration::ZERO);
        assert_eq!(memory.allocated_blocks(), 0);
    }

    /// Spares are freed only for room the budget lacks: a hash that fits
    /// beside them exactly leaves them.
    #[test]
    fn a_spare_is_kept_when_a_larger_hash_fits_beside_it() {
        let memory = WorkingMemory::new(100 * KIB, Duration::ZERO);
        memory.with(40, |_| ()).unwrap();
        memory.with(60, |b| assert_eq!(b.len(), 60)).unwrap();
        assert_eq!(memory.allocated_blocks(), 100, "the 40 kept beside the 60");
        memory.with(40, |_| ()).unwrap();
        assert_eq!(memory.allocated_blocks(), 100, "and reused");
    }

    #[test]
    fn spares_are_kept_until_idle() {
        let memory = WorkingMemory::new(100 * KIB, Duration::ZERO);
        memory.with(40, |_| ()).unwrap();
        let hour = Duration::from_secs(3600);
        let until_idle = memory.release_if_idle(hour);
        assert_eq!(memory.allocated_blocks(), 40);
        assert!(
            until_idle <= hour && until_idle > hour - Duration::from_secs(60),
            "ask again when the hour since the buffer came back is over: {until_idle:?}"
        );
    }

    /// A thread using `blocks` of `memory` until told to finish.
    fn holding(
        memory: &Arc<WorkingMemory>,
        blocks: usize,
    ) -> (std::thread::JoinHandle<()>, mpsc::Sender<()>) {
        let (started, running) = mpsc::channel();
        let (finish, finished) = mpsc::channel::<()>();
        let memory = memory.clone();
        let holder = std::thread::spawn(move || {
            memory
                .with(blocks, |_| {
                    started.send(()).unwrap();
                    finished.recv().unwrap();
                })
                .unwrap();
        });
        running.recv().unwrap();
        (holder, finish)
    }

    /// Buffers in use are never freed: a hash that finds no room waits for
    /// one to come back, and gets it.
    #[test]
    fn a_hash_without_room_waits_for_a_buffer_in_use() {
        let memory = Arc::new(WorkingMemory::new(100 * KIB, Duration::from_secs(30)));
        let (holder, finish) = holding(&memory, 80);
        let waiter = {
            let memory = memory.clone();
            std::thread::spawn(move || memory.with(60, |b| b.len()))
        };
        // The buffer comes back only once the waiter waits for it.
        let give_up = Instant::now() + Duration::from_secs(30);
        while memory.waiting() == 0 && !waiter.is_finished() && Instant::now() < give_up {
            std::thread::yield_now();
        }
        assert_eq!(memory.waiting(), 1, "the hash without room waits");
        finish.send(()).unwrap();
        assert_eq!(waiter.join().unwrap(), Ok(60));
        assert_eq!(memory.waiting(), 0, "and, served, waits no more");
        holder.join().unwrap();
        assert!(memory.allocated_blocks() <= 100);
    }

    #[test]
    fn without_a_buffer_back_in_time_a_hash_is_over_budget() {
        let memory = Arc::new(WorkingMemory::new(100 * KIB, Duration::from_millis(50)));
        let (holder, finish) = holding(&memory, 80);
        assert_eq!(memory.with(60, |_| ()), Err(OverBudget));
        finish.send(()).unwrap();
        holder.join().unwrap();
    }
}
