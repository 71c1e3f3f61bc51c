//! The completion queue between the runtime's I/O tasks (producers) and fio's thread (the one
//! consumer, in `getevents`). Bounded by fio's iodepth: the engine never has more I/Os in flight
//! than that, and each I/O completes exactly once, so the queue never holds more.

use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use crate::settings::Poll;

/// fio's `io_u` for one I/O, handed back untouched: Rust never dereferences it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cookie(pub *mut c_void);

// SAFETY: a cookie is an opaque token. The I/O task only carries it to the completion queue and
// fio's thread is the only one that dereferences it, after reaping it; no other thread reads or
// writes through the pointer.
unsafe impl Send for Cookie {}

/// One finished I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// Which I/O.
    pub cookie: Cookie,
    /// 0, or the errno fio reports for it.
    pub errno: i32,
}

/// Completed I/Os waiting for `getevents`.
#[derive(Debug)]
pub struct Completions {
    queue: Mutex<VecDeque<Completion>>,
    arrived: Condvar,
    /// The queue's length, readable without the lock: what busy polling spins on.
    ready: AtomicUsize,
    capacity: usize,
}

impl Completions {
    /// A queue for at most `capacity` completions (fio's iodepth), allocated now.
    pub fn new(capacity: usize) -> Completions {
        Completions {
            queue: Mutex::new(VecDeque::with_capacity(capacity.max(1))),
            arrived: Condvar::new(),
            ready: AtomicUsize::new(0),
            capacity: capacity.max(1),
        }
    }

    /// Most completions the queue holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    // No code panics while holding the lock; if one ever did, the queue itself is still
    // consistent (every operation on it is a single push or pop), so keep using it.
    fn lock(&self) -> MutexGuard<'_, VecDeque<Completion>> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds a completion and wakes the waiting thread. Never panics: it runs in drop guards,
    /// also while a task unwinds.
    pub fn push(&self, completion: Completion) {
        let mut queue = self.lock();
        // The engine admits at most `capacity` I/Os and each pushes once, so there is room; a
        // completion is never dropped, as fio would wait for it forever.
        debug_assert!(queue.len() < self.capacity || std::thread::panicking(), "completion queue over its bound");
        queue.push_back(completion);
        self.ready.store(queue.len(), Ordering::Release);
        drop(queue);
        self.arrived.notify_one();
    }

    /// Waits until at least `min` completions are queued or `deadline` passes (`None`: no
    /// limit), then hands up to `max` of them to `sink` and returns how many. Busy polling spins
    /// instead of sleeping. The caller makes sure `min` completions are due, or gives a deadline.
    pub fn take(
        &self,
        min: usize,
        max: usize,
        deadline: Option<Instant>,
        poll: Poll,
        mut sink: impl FnMut(Completion),
    ) -> usize {
        let min = min.min(max);
        if poll == Poll::Busy {
            self.spin_until(min, deadline);
        }
        let mut queue = self.lock();
        while queue.len() < min {
            queue = match deadline {
                None => self.arrived.wait(queue).unwrap_or_else(PoisonError::into_inner),
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        break;
                    }
                    self.arrived.wait_timeout(queue, deadline - now).unwrap_or_else(PoisonError::into_inner).0
                }
            };
        }
        let mut taken = 0;
        while taken < max {
            let Some(completion) = queue.pop_front() else { break };
            sink(completion);
            taken += 1;
        }
        self.ready.store(queue.len(), Ordering::Release);
        taken
    }

    /// Spins until `min` completions are queued or `deadline` passes.
    fn spin_until(&self, min: usize, deadline: Option<Instant>) {
        // Reading the clock costs more than a look at the counter: look at it every so often.
        const SPINS_PER_CLOCK_READ: u32 = 256;
        let mut spins = 0u32;
        while self.ready.load(Ordering::Acquire) < min {
            std::hint::spin_loop();
            spins += 1;
            if spins == SPINS_PER_CLOCK_READ {
                spins = 0;
                if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    fn completion(n: usize) -> Completion {
        Completion { cookie: Cookie(n as *mut c_void), errno: n as i32 }
    }

    fn drain(queue: &Completions, min: usize, max: usize, wait: Option<Duration>, poll: Poll) -> Vec<Completion> {
        let mut out = Vec::new();
        let taken = queue.take(min, max, wait.map(|wait| Instant::now() + wait), poll, |c| out.push(c));
        assert_eq!(taken, out.len());
        out
    }

    #[test]
    fn completions_come_out_in_order_and_at_most_max_at_once() {
        for poll in [Poll::Blocking, Poll::Busy] {
            let queue = Completions::new(4);
            (1..=3).for_each(|n| queue.push(completion(n)));
            assert_eq!(drain(&queue, 1, 2, None, poll), vec![completion(1), completion(2)]);
            assert_eq!(drain(&queue, 0, 4, None, poll), vec![completion(3)]);
            assert_eq!(drain(&queue, 0, 4, None, poll), vec![], "min 0 returns at once");
        }
    }

    #[test]
    fn a_wait_ends_at_the_deadline_with_what_there_is() {
        for poll in [Poll::Blocking, Poll::Busy] {
            let queue = Completions::new(4);
            queue.push(completion(1));
            let started = Instant::now();
            assert_eq!(drain(&queue, 2, 4, Some(Duration::from_millis(20)), poll), vec![completion(1)]);
            assert!(started.elapsed() >= Duration::from_millis(20), "{poll:?} returned early");
        }
    }

    #[test]
    fn a_waiting_thread_wakes_for_completions_from_other_threads() {
        for poll in [Poll::Blocking, Poll::Busy] {
            let queue = Arc::new(Completions::new(8));
            let producer = {
                let queue = Arc::clone(&queue);
                std::thread::spawn(move || {
                    for n in 1..=8 {
                        std::thread::sleep(Duration::from_millis(1));
                        queue.push(completion(n));
                    }
                })
            };
            let mut seen = Vec::new();
            while seen.len() < 8 {
                seen.extend(drain(&queue, 1, 8, None, poll));
            }
            producer.join().unwrap();
            assert_eq!(seen, (1..=8).map(completion).collect::<Vec<_>>());
        }
    }
}
