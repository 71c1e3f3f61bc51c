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

use netdam_isa::{Duration, Instant};

/// Tells a standing queue from a burst, from the queueing of the requests as they execute.
#[derive(Debug, Clone, Copy)]
pub struct StandingQueue {
    threshold: Duration,
    interval: Duration,
    /// When requests started to queue longer than the threshold without a break.
    above_since: Option<Instant>,
    /// Whether more requests wait behind the one executing (set per receive pass).
    backlog: bool,
}

impl StandingQueue {
    /// A detector for queueing over `threshold` that lasts `interval`.
    pub fn new(threshold: Duration, interval: Duration) -> StandingQueue {
        StandingQueue { threshold, interval, above_since: None, backlog: false }
    }

    /// Whether the requests about to execute have others waiting behind them: the worker
    /// says so for each receive pass (a pass that took a whole batch left more in the socket).
    pub fn set_backlog(&mut self, backlog: bool) {
        self.backlog = backlog;
    }

    /// A request starts executing at `now` after queueing for `queueing`: whether it should be
    /// answered BUSY instead.
    pub fn is_standing(&mut self, now: Instant, queueing: Duration) -> bool {
        if queueing <= self.threshold {
            self.above_since = None;
            return false;
        }
        let since = *self.above_since.get_or_insert(now);
        self.backlog && now.saturating_since(since) >= self.interval
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at_us(us: u64) -> Instant {
        Instant::ZERO + Duration::from_micros(us)
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
            assert!(!queue.is_standing(at_us(10_000 + i * 2), queueing), "request {i} of the backlog");
        }
        // Caught up: fresh requests queue for microseconds.
        assert!(!queue.is_standing(at_us(10_500), Duration::from_micros(4)));
        // A second pause starts a new burst, judged on its own.
        assert!(!queue.is_standing(at_us(20_000), Duration::from_millis(3)));
    }

    #[test]
    fn a_queue_that_stays_long_for_the_interval_is_shed() {
        let mut queue = detector();
        assert!(!queue.is_standing(at_us(0), Duration::from_micros(1_500)));
        assert!(!queue.is_standing(at_us(999), Duration::from_micros(1_600)));
        assert!(queue.is_standing(at_us(1_000), Duration::from_micros(1_700)));
        assert!(queue.is_standing(at_us(5_000), Duration::from_micros(1_100)));
        // One request under the threshold ends it: the queue has drained.
        assert!(!queue.is_standing(at_us(5_001), Duration::from_micros(900)));
        assert!(!queue.is_standing(at_us(5_002), Duration::from_micros(2_000)));
    }

    #[test]
    fn requests_that_wait_alone_execute_however_long_they_waited() {
        let mut queue = detector();
        queue.set_backlog(false);
        // One request at a time, each woken 3 ms late: no queue to shed.
        for i in 0..10u64 {
            assert!(!queue.is_standing(at_us(i * 4_000), Duration::from_millis(3)), "request {i}");
        }
        // A backlog appears while the wait stays long: the queue has been standing all along.
        queue.set_backlog(true);
        assert!(queue.is_standing(at_us(40_000), Duration::from_millis(3)));
    }

    #[test]
    fn a_zero_interval_sheds_at_the_threshold() {
        let mut queue = StandingQueue::new(Duration::from_millis(1), Duration::ZERO);
        queue.set_backlog(true);
        assert!(!queue.is_standing(at_us(0), Duration::from_millis(1)));
        assert!(queue.is_standing(at_us(0), Duration::from_micros(1_001)));
    }
}
