//! When a worker answers BUSY: only for a standing queue, never for a burst that merely waited.
//!
//! A datagram's queueing (kernel receive to execution) is long for two different reasons. Either
//! requests arrive faster than the worker executes them, and the queue stays long however fast
//! the worker runs: shedding load with BUSY is the remedy. Or the worker did not run for a while
//! (the scheduler gave its core to another thread, a page fault, a long `msync`) and everything
//! that arrived meanwhile aged together: the worker drains that backlog in microseconds, and
//! answering it BUSY only makes every initiator wait and send it all again, so a machine whose
//! cores are oversubscribed sees a BUSY storm instead of a short delay.
//!
//! The two look alike in one datagram and apart over time, which is CoDel's observation
//! (Nichols and Jacobson, 2012): a queue that stays above its target for a whole interval is
//! standing; one that drops below it within the interval was a burst. So a request is answered
//! BUSY only when every request executed for at least `interval` queued longer than the
//! threshold, and only while the worker faces a backlog (its last receive took a whole batch):
//! a request that waited alone (its worker was slow to wake on a contended core) sheds nothing
//! by being refused, so it executes. The first request after a pause, and the rest of its
//! backlog, execute.
//!
//! A pause can also fall inside the interval: a worker that loses its core (or blocks in the
//! kernel) while a backlog waits comes back to requests that have aged through the pause, and
//! wall time alone would call that queue standing. So the interval is judged by the worker's
//! own CPU time as well: a queue is standing only if the worker ran for at least half of the
//! interval and still could not bring the queueing under the threshold. The thread's CPU clock
//! is a system call (the monotonic clock is not): it is read only while requests queue past the
//! threshold, once when that begins and once per interval after.

use netdam_isa::{Duration, Instant};

/// Tells a standing queue from a burst, from the queueing of the requests as they execute.
#[derive(Debug, Clone, Copy)]
pub struct StandingQueue {
    threshold: Duration,
    interval: Duration,
    /// Since when (and since which CPU time of the worker, when known) requests have queued
    /// longer than the threshold without a break: reset at each interval's end.
    above_since: Option<(Instant, Option<Duration>)>,
    /// Whether the last whole interval over the threshold found the queue standing.
    standing: bool,
    /// Whether more requests wait behind the one executing (set per receive pass).
    backlog: bool,
}

impl StandingQueue {
    /// A detector for queueing over `threshold` that lasts `interval`.
    pub fn new(threshold: Duration, interval: Duration) -> StandingQueue {
        StandingQueue { threshold, interval, above_since: None, standing: false, backlog: false }
    }

    /// Whether the requests about to execute have others waiting behind them: the worker
    /// says so for each receive pass (a pass that took a whole batch left more in the socket).
    pub fn set_backlog(&mut self, backlog: bool) {
        self.backlog = backlog;
    }

    /// A request starts executing at `now` after queueing for `queueing`: whether it should be
    /// answered BUSY instead. `cpu` reads the worker thread's CPU time (`thread_cpu_time`; `None`
    /// when it cannot be read, and then the worker counts as having run throughout).
    pub fn is_standing(&mut self, now: Instant, queueing: Duration, cpu: impl Fn() -> Option<Duration>) -> bool {
        if queueing <= self.threshold {
            self.above_since = None;
            self.standing = false;
            return false;
        }
        let (since, cpu_since) = *self.above_since.get_or_insert_with(|| (now, cpu()));
        let elapsed = now.saturating_since(since);
        if elapsed >= self.interval {
            let cpu_now = cpu();
            let ran = match (cpu_since, cpu_now) {
                (Some(before), Some(after)) => after.saturating_sub(before),
                _ => elapsed,
            };
            // Over the threshold for a whole interval, and the worker ran for at least half of
            // it: more arrives than it executes. Less, and the queue aged while it was away.
            self.standing = ran.as_nanos().saturating_mul(2) >= elapsed.as_nanos();
            self.above_since = Some((now, cpu_now));
        }
        self.backlog && self.standing
    }
}

/// The CPU time the calling thread has used (`CLOCK_THREAD_CPUTIME_ID`); `None` if the kernel
/// does not say (the clock then reads zero).
pub fn thread_cpu_time() -> Option<Duration> {
    let nanos = netdam_isa::time::clock_ns(libc::CLOCK_THREAD_CPUTIME_ID);
    (nanos != 0).then(|| Duration::from_nanos(nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at_us(us: u64) -> Instant {
        Instant::ZERO + Duration::from_micros(us)
    }

    /// `is_standing` for a worker that has had its core throughout (its CPU time is the time).
    fn running(queue: &mut StandingQueue, us: u64, queueing: Duration) -> bool {
        queue.is_standing(at_us(us), queueing, || Some(Duration::from_micros(us)))
    }

    fn detector() -> StandingQueue {
        let mut queue = StandingQueue::new(Duration::from_millis(1), Duration::from_millis(1));
        queue.set_backlog(true);
        queue
    }

    #[test]
    fn a_backlog_left_by_a_pause_executes() {
        let mut queue = detector();
        // The worker was away for 5 ms; 200 requests waited and it drains them in 400 µs.
        for i in 0..200u64 {
            let queueing = Duration::from_micros(5_000 - i * 23);
            assert!(!running(&mut queue, 10_000 + i * 2, queueing), "request {i} of the backlog");
        }
        // Caught up: fresh requests queue for microseconds.
        assert!(!running(&mut queue, 10_500, Duration::from_micros(4)));
        // A second pause starts a new burst, judged on its own.
        assert!(!running(&mut queue, 20_000, Duration::from_millis(3)));
    }

    #[test]
    fn a_queue_that_stays_long_for_the_interval_is_shed() {
        let mut queue = detector();
        assert!(!running(&mut queue, 0, Duration::from_micros(1_500)));
        assert!(!running(&mut queue, 999, Duration::from_micros(1_600)));
        assert!(running(&mut queue, 1_000, Duration::from_micros(1_700)));
        assert!(running(&mut queue, 5_000, Duration::from_micros(1_100)));
        // One request under the threshold ends it: the queue has drained.
        assert!(!running(&mut queue, 5_001, Duration::from_micros(900)));
        assert!(!running(&mut queue, 5_002, Duration::from_micros(2_000)));
    }

    #[test]
    fn requests_that_wait_alone_execute_however_long_they_waited() {
        let mut queue = detector();
        queue.set_backlog(false);
        // One request at a time, each woken 3 ms late: no queue to shed.
        for i in 0..10u64 {
            assert!(!running(&mut queue, i * 4_000, Duration::from_millis(3)), "request {i}");
        }
        // A backlog appears while the wait stays long: the queue has been standing all along.
        queue.set_backlog(true);
        assert!(running(&mut queue, 40_000, Duration::from_millis(3)));
    }

    #[test]
    fn a_queue_that_aged_while_the_worker_was_away_is_not_shed() {
        let mut queue = detector();
        // The worker runs a fifth of the time (a vCPU the host takes away, a worker blocked in
        // the kernel): its backlog stays over the threshold, but it was not given the time.
        let away = |us: u64| move || Some(Duration::from_micros(us / 5));
        for i in 0..10u64 {
            let us = i * 400;
            assert!(!queue.is_standing(at_us(us), Duration::from_millis(2), away(us)), "at {us} µs");
        }
        // It gets its core back and the queue stays long for a whole interval: standing.
        let back_at = 4_000;
        let cpu_at_return = back_at / 5;
        let running_since_return = |us: u64| move || Some(Duration::from_micros(cpu_at_return + us - back_at));
        assert!(!queue.is_standing(at_us(back_at), Duration::from_millis(2), running_since_return(back_at)));
        assert!(queue.is_standing(at_us(5_000), Duration::from_millis(2), running_since_return(5_000)));
        // Without a CPU clock the worker counts as having run: wall time decides, as before.
        let mut unknown = detector();
        assert!(!unknown.is_standing(at_us(0), Duration::from_millis(2), || None));
        assert!(unknown.is_standing(at_us(1_000), Duration::from_millis(2), || None));
    }

    #[test]
    fn a_zero_interval_sheds_at_the_threshold() {
        let mut queue = StandingQueue::new(Duration::from_millis(1), Duration::ZERO);
        queue.set_backlog(true);
        assert!(!running(&mut queue, 0, Duration::from_millis(1)));
        assert!(running(&mut queue, 0, Duration::from_micros(1_001)));
    }
}
