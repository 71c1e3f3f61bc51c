//! Per-worker counters and histograms: plain atomics that only their worker writes, summed on
//! demand for STAT and for `/metrics` (see [`crate::metrics`]).
//!
//! Each worker's [`WorkerStats`] is written by that worker's thread alone, so a count is a
//! relaxed load and a relaxed store (no locked instruction), and each worker's block starts on
//! its own cache lines, so no line is written by two threads. Readers sum the workers whenever
//! they like and see recent values, never torn ones.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use netdam_isa::limits::MAX_NAMESPACES;
use netdam_isa::Status;
pub use netdam_metrics::opcodes::{opcode_slot, opcode_slot_name, OPCODE_SLOTS, OTHER_OPCODE_SLOT};
use netdam_metrics::{Cell, HistogramShard};

macro_rules! counters {
    ($($variant:ident => $name:literal: $doc:literal,)*) => {
        /// A named event a worker counts.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Counter {
            $(#[doc = $doc] $variant,)*
        }

        impl Counter {
            /// Every counter, in STAT order.
            pub const ALL: &'static [Counter] = &[$(Counter::$variant,)*];

            /// The name STAT reports it under.
            pub fn name(self) -> &'static str {
                match self {
                    $(Counter::$variant => $name,)*
                }
            }
        }
    };
}

counters! {
    DatagramsReceived => "datagrams_received": "Datagrams taken from the socket.",
    ResponsesSent => "responses_sent": "Answers to datagrams received handed to the kernel (send_errors of them refused); in_progress_notices are not among them.",
    InstructionsExecuted => "instructions_executed": "Instructions answered, whatever their status.",
    DroppedTooShort => "dropped_too_short": "Dropped: shorter than a header.",
    DroppedBadMagic => "dropped_bad_magic": "Dropped: wrong magic.",
    DroppedBadCrc => "dropped_bad_crc": "Dropped: CRC mismatch.",
    DroppedOversized => "dropped_oversized": "Dropped: larger than max_datagram_bytes (truncated by the kernel).",
    DroppedNotRequest => "dropped_not_request": "Dropped: carries the response flag.",
    AnsweredUnsupportedVersion => "answered_unsupported_version": "Answered with datagram status unsupported_version.",
    AnsweredMalformed => "answered_malformed": "Answered with datagram status malformed.",
    AnsweredBusy => "answered_busy": "Answered busy: queued longer than busy_threshold_us, not executed.",
    AnsweredStale => "answered_stale": "Answered stale: older than the replay window, never executed.",
    AnsweredNoSession => "answered_no_session": "Answered no_session: unknown session, another sender's session, or none for an instruction that needs one.",
    SessionsOpened => "sessions_opened": "Sessions opened by HELLO.",
    SessionsClosed => "sessions_closed": "Sessions ended by CLOSE.",
    SessionsExpired => "sessions_expired": "Sessions ended by silence: the idle timeout, or a second without a request after HELLO.",
    SessionsEvicted => "sessions_evicted": "Idle sessions whose slot a new HELLO took (full table, or its address's share full).",
    ClosesIgnored => "closes_ignored": "CLOSEs of an unknown session, of another sender's, or without a session: nothing ended.",
    CookiesSent => "cookies_sent": "HELLOs answered retry with a cookie, having none that was valid.",
    HelloBadCookie => "hello_bad_cookie": "HELLOs whose cookie was not issued to their address and port (forged, mutated or copied).",
    HelloExpiredCookie => "hello_expired_cookie": "HELLOs whose cookie was issued to them over 5 s before.",
    HelloRefusedTableFull => "hello_refused_table_full": "HELLOs refused busy: every slot held, and no session idle.",
    HelloRefusedAddressLimit => "hello_refused_address_limit": "HELLOs refused session_limit: their address holds max_sessions_per_address active sessions.",
    DuplicatesReplayed => "duplicates_replayed": "Retransmissions of non-idempotent requests answered from the replay window.",
    DuplicatesExecutedAgain => "duplicates_executed_again": "Retransmissions of idempotent requests executed again.",
    DuplicatesInProgress => "duplicates_in_progress": "Retransmissions of a request still waiting for block I/O, answered in_progress (not executed again).",
    BlockDatagramsDeferred => "block_datagrams_deferred": "Datagrams with block instructions, answered when their I/O completed.",
    BlockRequestsSubmitted => "block_requests_submitted": "Block requests handed to a namespace's device.",
    BlockFuaWrites => "block_fua_writes": "BWRITEs with FUA handed to a namespace's device: durable before their answer.",
    BusyBlockSlotsFull => "busy_block_slots_full": "Answered busy: every slot for datagrams waiting on block I/O was taken.",
    BusyTenantRate => "busy_tenant_rate": "Answered busy, not executed: the session's tenant had spent its cost_per_second (its token bucket was empty).",
    BusyTenantOverload => "busy_tenant_overload": "Answered busy, not executed: the session's tenant is best-effort and requests had started to queue.",
    BusyTenantInFlight => "busy_tenant_in_flight": "Answered busy, not executed: the session's tenant held its max_in_flight block datagrams.",
    GroupCommits => "group_commits": "Receive passes whose writes to persistent regions were persisted together before their answers left.",
    AnswersHeld => "answers_held": "Answers held for their pass's group commit.",
    AnswerTrains => "answer_trains": "Runs of answers to one initiator sent in one system call (UDP segmentation offload), counted once sent.",
    GroupCommitFailures => "group_commit_failures": "Group commits whose persist failed: their held answers said io_error.",
    ContendedYields => "contended_yields": "Yields of an adaptive worker that lost its core for over 500 µs to another thread; it then blocks on an empty socket for 100 ms instead of yielding.",
    SendErrors => "send_errors": "Responses the kernel refused to send.",
    ReceiveErrors => "receive_errors": "Receive calls that failed other than for lack of data.",
    DroppedBadMac => "dropped_bad_mac": "Dropped: a sealed datagram whose MAC did not match its session's key (forged, altered, or another session's).",
    DroppedUnsealed => "dropped_unsealed": "Dropped: a datagram without a MAC naming an authenticated session.",
    AnsweredUnauthenticated => "answered_unauthenticated": "Answered unauthenticated: a sessionless STAT on a target that requires tenants.",
    HelloUnauthenticated => "hello_unauthenticated": "HELLOs refused unauthenticated: no key, an unknown tenant, a wrong proof or a rotated key.",
    SessionsEndedByTenantChange => "sessions_ended_by_tenant_change": "Sessions ended because their tenant was deleted or its key rotated.",
    InProgressNotices => "in_progress_notices": "In-progress notices sent for requests that had waited 5 ms (and every 5 ms after) for their block I/O (not in responses_sent, which counts answers to datagrams received).",
}

/// What a worker records per opcode for `/metrics`.
#[derive(Debug, Default)]
pub struct OpcodeStats {
    /// Instructions answered, whatever their status.
    pub instructions: Cell,
    /// Operand bytes received (write data, atomics' operands, VADD lanes).
    pub bytes_received: Cell,
    /// Data bytes answered (read data, old values, CRCs).
    pub bytes_sent: Cell,
    /// Service time of answered datagrams whose first instruction has this opcode.
    pub service: HistogramShard,
    /// Queueing delay of parsed requests whose first instruction has this opcode.
    pub queueing: HistogramShard,
}

/// Counters of one worker, on their own cache lines so workers never share one.
#[derive(Debug)]
#[repr(align(128))]
pub struct WorkerStats {
    counters: [AtomicU64; Counter::ALL.len()],
    by_status: [AtomicU64; Status::ALL.len()],
    /// Per opcode slot (see [`opcode_slot`]).
    pub opcodes: [OpcodeStats; OPCODE_SLOTS],
    /// Block requests submitted, by namespace id.
    pub block_submitted: [Cell; MAX_NAMESPACES],
    /// Block requests completed, by namespace id.
    pub block_completed: [Cell; MAX_NAMESPACES],
    /// The kernel's id of the worker's thread while it runs (0 before and after), so that
    /// `/metrics` can read the thread's context switches from `/proc` at scrape time.
    thread_id: AtomicU32,
}

impl Default for WorkerStats {
    fn default() -> WorkerStats {
        WorkerStats {
            counters: std::array::from_fn(|_| AtomicU64::new(0)),
            by_status: std::array::from_fn(|_| AtomicU64::new(0)),
            opcodes: std::array::from_fn(|_| OpcodeStats::default()),
            block_submitted: std::array::from_fn(|_| Cell::new()),
            block_completed: std::array::from_fn(|_| Cell::new()),
            thread_id: AtomicU32::new(0),
        }
    }
}

/// Adds to a counter only its worker writes: a load and a store, no locked instruction.
#[inline]
fn bump(cell: &AtomicU64, count: u64) {
    cell.store(cell.load(Ordering::Relaxed).wrapping_add(count), Ordering::Relaxed);
}

impl WorkerStats {
    /// Adds `count` to `counter`. Only this worker's thread may call it.
    pub fn add(&self, counter: Counter, count: u64) {
        bump(&self.counters[counter as usize], count);
    }

    /// Counts one instruction answered with `status`. Only this worker's thread may call it.
    pub fn count_status(&self, status: Status) {
        bump(&self.by_status[status as usize], 1);
    }

    /// The per-opcode record of an opcode byte.
    #[inline]
    pub fn opcode(&self, opcode: u8) -> &OpcodeStats {
        &self.opcodes[opcode_slot(opcode)]
    }

    /// Current value of `counter`.
    pub fn get(&self, counter: Counter) -> u64 {
        self.counters[counter as usize].load(Ordering::Relaxed)
    }

    /// Instructions answered with `status` so far.
    pub fn status_count(&self, status: Status) -> u64 {
        self.by_status[status as usize].load(Ordering::Relaxed)
    }

    /// Records the calling thread as this worker's (at its start), or none (`0`, at its end).
    pub fn set_thread_id(&self, thread_id: u32) {
        self.thread_id.store(thread_id, Ordering::Relaxed);
    }

    /// The kernel's id of the worker's thread while it runs.
    pub fn thread_id(&self) -> Option<u32> {
        Some(self.thread_id.load(Ordering::Relaxed)).filter(|&id| id != 0)
    }
}

/// How often thread `thread_id` of `process` (a process id, or `"self"`) gave up its CPU so far,
/// from `/proc/PROCESS/task/ID/status`: `(voluntary, involuntary)`. Voluntary: it slept (waited
/// for datagrams); involuntary: the scheduler took the CPU from it while it could still run
/// (another thread or process preempted it). `None` when the thread is gone or the file
/// unreadable.
pub fn thread_context_switches(process: &str, thread_id: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{process}/task/{thread_id}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        status.lines().find_map(|line| line.strip_prefix(name)).and_then(|value| value.trim().parse().ok())
    };
    Some((field("voluntary_ctxt_switches:")?, field("nonvoluntary_ctxt_switches:")?))
}

/// Sums of every worker's counters: a plain snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StatsSnapshot {
    /// Values of [`Counter::ALL`], in order.
    pub counters: Vec<(&'static str, u64)>,
    /// Instructions answered per status, in wire order.
    pub by_status: Vec<(Status, u64)>,
}

impl StatsSnapshot {
    /// Sums `workers`.
    pub fn sum(workers: &[WorkerStats]) -> StatsSnapshot {
        StatsSnapshot {
            counters: Counter::ALL
                .iter()
                .map(|counter| (counter.name(), workers.iter().map(|worker| worker.get(*counter)).sum()))
                .collect(),
            by_status: Status::ALL
                .iter()
                .map(|status| (*status, workers.iter().map(|worker| worker.status_count(*status)).sum()))
                .collect(),
        }
    }

    /// The value of the counter named `name`.
    pub fn get(&self, name: &str) -> Option<u64> {
        self.counters.iter().find(|(counter, _)| *counter == name).map(|(_, value)| *value)
    }
}

/// Prefix of the STAT entries counting instructions per status: `status_` + the status's name.
pub const STATUS_COUNTER_PREFIX: &str = "status_";

// STAT carries every counter, every status and the target-wide entries in one answer.
const _: () = assert!(
    Counter::ALL.len() + Status::ALL.len() + crate::dispatch::TARGET_STAT_ENTRIES
        <= netdam_isa::limits::MAX_STAT_ENTRIES
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_sit_on_their_own_cache_lines() {
        assert_eq!(std::mem::align_of::<WorkerStats>(), 128);
        assert_eq!(std::mem::size_of::<WorkerStats>() % 128, 0);
    }
}
