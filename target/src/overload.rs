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
//! The interval is wall time, and a worker paused twice in a row (a host that takes its vCPU
//! back while it drains the first backlog) sees the same old requests on both sides of it. So
//! the interval must also have seen [`MIN_STANDING_DATAGRAMS`] datagrams executed late: four
//! receive batches. A backlog smaller than that is what one initiator's window leaves behind a
//! pause (32 requests at depth 32); the worker drains it in a pass or two, and refusing it
//! would only make that initiator wait about as long again and send it all once more. A queue
//! that stands because requests come faster than they execute passes that count in any
//! interval in which the worker runs at all.

use netdam_isa::limits::RECEIVE_BATCH;
use netdam_isa::{Duration, Instant};

/// Datagrams that must have executed late (past the threshold) within the interval before the
/// queue counts as standing: four receive batches (see the module's documentation).
pub const MIN_STANDING_DATAGRAMS: u32 = 4 * RECEIVE_BATCH as u32;

/// Tells a standing queue from a burst, from the queueing of the requests as they execute.
#[derive(Debug, Clone, Copy)]
pub struct StandingQueue {
    threshold: Duration,
    interval: Duration,
    /// When requests started to queue longer than the threshold without a break.
    above_since: Option<Instant>,
    /// Datagrams judged since then, each past the threshold (saturating).
    late_datagrams: u32,
    /// Whether more requests wait behind the one executing (set per receive pass).
    backlog: bool,
}

impl StandingQueue {
    /// A detector for queueing over `threshold` that lasts `interval`.
    pub fn new(threshold: Duration, interval: Duration) -> StandingQueue {
        StandingQueue { threshold, interval, above_since: None, late_datagrams: 0, backlog: false }
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
            self.late_datagrams = 0;
            return false;
        }
        let since = *self.above_since.get_or_insert(now);
        self.late_datagrams = self.late_datagrams.saturating_add(1);
        self.backlog && self.late_datagrams > MIN_STANDING_DATAGRAMS && now.saturating_since(since) >= self.interval
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

    /// Judges `count` datagrams from `from_us` on, one µs apart, each queued `queueing`: how
    /// many were refused.
    fn judge(queue: &mut StandingQueue, from_us: u64, count: u64, queueing: Duration) -> u64 {
        (0..count).filter(|i| queue.is_standing(at_us(from_us + i), queueing)).count() as u64
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
    fn one_window_left_behind_two_pauses_in_a_row_executes() {
        let mut queue = detector();
        // One initiator at depth 32. The worker is away 2 ms, takes one batch of the 32 that
        // waited, and is away again for 1.5 ms before it takes the other: by wall time the
        // queue stood for the whole interval, but it never held more than one window.
        assert_eq!(judge(&mut queue, 10_000, 16, Duration::from_millis(2)), 0);
        assert_eq!(judge(&mut queue, 11_600, 16, Duration::from_micros(3_500)), 0);
        // The initiator's next window, sent as the answers came, finds the worker away again.
        assert_eq!(judge(&mut queue, 13_000, 32, Duration::from_micros(1_200)), 0);
    }

    #[test]
    fn a_queue_that_stays_long_for_the_interval_is_shed() {
        let mut queue = detector();
        // Four batches past the threshold in the first half of the interval: not yet.
        assert_eq!(judge(&mut queue, 0, u64::from(MIN_STANDING_DATAGRAMS), Duration::from_micros(1_500)), 0);
        assert!(!queue.is_standing(at_us(999), Duration::from_micros(1_600)));
        // Past the threshold for the whole interval, and more than four batches of it.
        assert!(queue.is_standing(at_us(1_000), Duration::from_micros(1_700)));
        assert!(queue.is_standing(at_us(5_000), Duration::from_micros(1_100)));
        // One request under the threshold ends it: the queue has drained.
        assert!(!queue.is_standing(at_us(5_001), Duration::from_micros(900)));
        assert!(!queue.is_standing(at_us(5_002), Duration::from_micros(2_000)));
        assert!(!queue.is_standing(at_us(6_100), Duration::from_micros(2_000)), "the count starts again too");
    }

    #[test]
    fn a_slow_worker_with_a_long_queue_is_shed_once_enough_datagrams_were_late() {
        let mut queue = detector();
        // Passes that take 1 ms each (a long persist), a batch of 16 late datagrams per pass:
        // the interval has passed after the second pass, the count after the fourth.
        let late = Duration::from_micros(1_800);
        for pass in 0..4u64 {
            assert_eq!(judge(&mut queue, pass * 1_000, 16, late), 0, "pass {pass}");
        }
        assert_eq!(judge(&mut queue, 4_000, 16, late), 16);
    }

    #[test]
    fn requests_that_wait_alone_execute_however_long_they_waited() {
        let mut queue = detector();
        queue.set_backlog(false);
        // One request at a time, each woken 3 ms late, five batches' worth: no queue to shed.
        let count = u64::from(MIN_STANDING_DATAGRAMS) + 16;
        for i in 0..count {
            assert!(!queue.is_standing(at_us(i * 4_000), Duration::from_millis(3)), "request {i}");
        }
        // A backlog appears while the wait stays long: the queue has been standing all along.
        queue.set_backlog(true);
        assert!(queue.is_standing(at_us(count * 4_000), Duration::from_millis(3)));
    }

    #[test]
    fn a_zero_interval_sheds_at_the_threshold_once_four_batches_were_late() {
        let mut queue = StandingQueue::new(Duration::from_millis(1), Duration::ZERO);
        queue.set_backlog(true);
        assert!(!queue.is_standing(at_us(0), Duration::from_millis(1)));
        let late = Duration::from_micros(1_001);
        assert_eq!(judge(&mut queue, 0, u64::from(MIN_STANDING_DATAGRAMS), late), 0);
        assert!(queue.is_standing(at_us(100), late));
    }
}
