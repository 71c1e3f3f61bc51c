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
//! a queue with a minimum count (the shared one: [`MIN_STANDING_REQUESTS`], four receive
//! batches) is standing only once that many requests have also executed late since it went
//! above the threshold: the first refused is the one after them, and only once the interval
//! has passed too, whichever comes later. A backlog smaller than that is what one initiator's
//! window leaves behind a pause (32 requests at depth 32); the worker drains it in a pass or
//! two, and refusing it would only make that initiator wait about as long again and send it
//! all once more. Only first executions count ([`StandingQueue::executed`], called once the
//! session's replay window has said so): the copies an initiator resends while the worker is away are the same
//! window, not a longer queue. A queue that stands because requests come faster than they
//! execute reaches the count after 64 requests' service; a worker that needs more than
//! interval / 64 per request (15.6 µs at the default 1 ms) sheds later than the interval.

use netdam_isa::limits::RECEIVE_BATCH;
use netdam_isa::{Duration, Instant};

/// Requests that must have executed late (past the threshold, each for the first time) before
/// the shared queue counts as standing: four receive batches (see the module's documentation).
pub const MIN_STANDING_REQUESTS: u32 = 4 * RECEIVE_BATCH as u32;

/// Tells a standing queue from a burst, from the queueing of the requests as they execute.
#[derive(Debug, Clone, Copy)]
pub struct StandingQueue {
    threshold: Duration,
    interval: Duration,
    /// Requests that must have executed late before any is refused.
    min_late: u32,
    /// When requests started to queue longer than the threshold without a break.
    above_since: Option<Instant>,
    /// Requests executed (for the first time) since then, each past the threshold (saturating).
    executed_late: u32,
    /// Whether more requests wait behind the one executing (set per receive pass).
    backlog: bool,
}

impl StandingQueue {
    /// A detector for queueing over `threshold` that lasts `interval`, while at least `min_late`
    /// requests executed late.
    pub fn new(threshold: Duration, interval: Duration, min_late: u32) -> StandingQueue {
        StandingQueue { threshold, interval, min_late, above_since: None, executed_late: 0, backlog: false }
    }

    /// Whether the requests about to execute have others waiting behind them: the worker
    /// says so for each receive pass (a pass that took a whole batch left more in the socket).
    pub fn set_backlog(&mut self, backlog: bool) {
        self.backlog = backlog;
    }

    /// A request is about to execute at `now` after queueing for `queueing`: whether it should
    /// be answered BUSY instead.
    pub fn is_standing(&mut self, now: Instant, queueing: Duration) -> bool {
        if queueing <= self.threshold {
            self.above_since = None;
            self.executed_late = 0;
            return false;
        }
        let since = *self.above_since.get_or_insert(now);
        self.backlog && self.executed_late >= self.min_late && now.saturating_since(since) >= self.interval
    }

    /// A request that `is_standing` has just let through executes for the first time (not a
    /// resent copy of one that did) after queueing for `queueing`. Past the threshold,
    /// `is_standing` has started the queue's time already.
    pub fn executed(&mut self, queueing: Duration) {
        if queueing > self.threshold {
            self.executed_late = self.executed_late.saturating_add(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at_us(us: u64) -> Instant {
        Instant::ZERO + Duration::from_micros(us)
    }

    fn detector() -> StandingQueue {
        let mut queue = StandingQueue::new(Duration::from_millis(1), Duration::from_millis(1), MIN_STANDING_REQUESTS);
        queue.set_backlog(true);
        queue
    }

    /// Judges `count` requests from `from_us` on, one µs apart, each queued `queueing`, as the
    /// dispatcher does (those let through execute for the first time): how many were refused.
    fn judge(queue: &mut StandingQueue, from_us: u64, count: u64, queueing: Duration) -> u64 {
        let mut refused = 0;
        for i in 0..count {
            if queue.is_standing(at_us(from_us + i), queueing) {
                refused += 1;
            } else {
                queue.executed(queueing);
            }
        }
        refused
    }

    const MIN: u64 = MIN_STANDING_REQUESTS as u64;

    #[test]
    fn a_backlog_left_by_a_pause_executes() {
        let mut queue = detector();
        // The worker was away for 5 ms; 200 requests waited and it drains them in 400 µs.
        for i in 0..200u64 {
            let queueing = Duration::from_micros(5_000 - i * 23);
            assert!(!queue.is_standing(at_us(10_000 + i * 2), queueing), "request {i} of the backlog");
            queue.executed(queueing);
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
        // The initiator's next window, sent as the answers came, finds the worker away again:
        // 64 executed late in all, the count the queue needs before it refuses one.
        assert_eq!(judge(&mut queue, 13_000, 32, Duration::from_micros(1_200)), 0);
    }

    #[test]
    fn resent_copies_of_one_window_do_not_count() {
        let mut queue = detector();
        // The 32 requests of one window arrive three times over (the initiator resent them
        // while the worker was away); only the first copies execute, the others are found in
        // the replay window and not counted.
        assert_eq!(judge(&mut queue, 10_000, 32, Duration::from_millis(3)), 0);
        for i in 0..64u64 {
            assert!(!queue.is_standing(at_us(11_500 + i), Duration::from_millis(2)), "copy {i}");
        }
        assert_eq!(judge(&mut queue, 11_600, 31, Duration::from_millis(2)), 0);
    }

    #[test]
    fn a_queue_that_stays_long_for_the_interval_is_shed() {
        let mut queue = detector();
        // Four batches executed past the threshold within the first 64 µs: not yet standing.
        assert_eq!(judge(&mut queue, 0, MIN, Duration::from_micros(1_500)), 0);
        assert!(!queue.is_standing(at_us(999), Duration::from_micros(1_600)));
        queue.executed(Duration::from_micros(1_600));
        // Past the threshold for the whole interval, with more than four batches of it.
        assert!(queue.is_standing(at_us(1_000), Duration::from_micros(1_700)));
        assert!(queue.is_standing(at_us(5_000), Duration::from_micros(1_100)));
        // One request under the threshold ends it: the queue has drained.
        let late = Duration::from_micros(2_000);
        assert!(!queue.is_standing(at_us(5_001), Duration::from_micros(900)));
        // The count starts again: the interval passes with one request late.
        assert_eq!(judge(&mut queue, 5_002, 1, late), 0);
        assert!(!queue.is_standing(at_us(6_100), late), "one request late is no standing queue");
        // And so does the time: after the next drain, 65 late within 65 µs all execute.
        assert!(!queue.is_standing(at_us(6_101), Duration::from_micros(900)));
        assert_eq!(judge(&mut queue, 6_102, MIN + 1, late), 0);
        assert!(queue.is_standing(at_us(7_102), late));
    }

    #[test]
    fn a_slow_worker_with_a_long_queue_is_shed_once_enough_requests_were_late() {
        let mut queue = detector();
        // Passes that take 1 ms each (a long persist), a batch of 16 late requests per pass:
        // the interval has passed at the first request of the second pass, the count once the
        // fourth pass has executed.
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
        let count = MIN + 16;
        assert_eq!(judge(&mut queue, 0, count, Duration::from_millis(3)), 0);
        // A backlog appears while the wait stays long: the queue has been standing all along.
        queue.set_backlog(true);
        assert!(queue.is_standing(at_us(count * 4_000), Duration::from_millis(3)));
    }

    #[test]
    fn without_a_count_the_interval_alone_decides() {
        // The best-effort tenants' queue: shed as soon as it has stood for the interval.
        let mut queue = StandingQueue::new(Duration::from_micros(250), Duration::from_micros(250), 0);
        queue.set_backlog(true);
        assert!(!queue.is_standing(at_us(0), Duration::from_micros(400)));
        assert!(!queue.is_standing(at_us(249), Duration::from_micros(400)));
        assert!(queue.is_standing(at_us(250), Duration::from_micros(400)));
    }

    #[test]
    fn a_zero_interval_sheds_at_the_threshold_once_four_batches_were_late() {
        let mut queue = StandingQueue::new(Duration::from_millis(1), Duration::ZERO, MIN_STANDING_REQUESTS);
        queue.set_backlog(true);
        assert!(!queue.is_standing(at_us(0), Duration::from_millis(1)));
        let late = Duration::from_micros(1_001);
        assert_eq!(judge(&mut queue, 0, MIN, late), 0);
        assert!(queue.is_standing(at_us(100), late));
    }
}
