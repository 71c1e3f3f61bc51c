//! The initiator's `/metrics` (`netdam nbd --metrics-listen`): what the application sees.
//!
//! Each session's I/O task is the only writer of its [`SessionMetrics`] shard (relaxed load and
//! store, see `netdam_metrics::shard`): per opcode, end-to-end latency from the moment the task
//! took the request until its completion (waiting for window room included), requests and
//! payload bytes; errors by status; and, from the session's own counters after each pass,
//! retransmissions, timeouts, BUSY answers, the congestion window and the Swift delays. The NBD
//! export adds two gauges, shared by its connection tasks ([`NbdGauges`]). A collector sums it
//! all when scraped. Whether the target answered a retransmission from its replay window is not
//! visible to the initiator (the answer looks the same); the target counts those
//! (`netdam_duplicates_total`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use netdam_isa::{Duration, Status};
use netdam_metrics::family::{self, counters, gauges, histograms, label, no_labels, Labels};
use netdam_metrics::opcodes::{opcode_slot, opcode_slot_name, OPCODE_SLOTS};
use netdam_metrics::{Cell, HistogramShard, HistogramSnapshot};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::{Registry, Unit};

use crate::error::ClientError;
use crate::nbd::{BackendError, NbdBackend};
use crate::session::{Reply, SessionStats};

/// Error labels beyond the statuses: no answer after every attempt, and any other client error.
const EXTRA_ERRORS: [&str; 2] = ["timeout", "client_error"];
const ERROR_SLOTS: usize = Status::ALL.len() + EXTRA_ERRORS.len();

/// One session's shard, written only by its I/O task; on cache lines of its own, so no other
/// session's task writes a line it holds.
#[derive(Debug)]
#[repr(align(128))]
pub struct SessionMetrics {
    /// The `session` label: its index in the process (0, 1, ...).
    index: usize,
    latency: [HistogramShard; OPCODE_SLOTS],
    requests: [Cell; OPCODE_SLOTS],
    bytes: [Cell; OPCODE_SLOTS],
    errors: [Cell; ERROR_SLOTS],
    retransmissions: Cell,
    trains: Cell,
    spun_for: Cell,
    timeouts: Cell,
    busy: Cell,
    in_progress_notices: Cell,
    sessions_lost: Cell,
    /// 1 while the session is open (holds an id from a HELLO), else 0.
    open: Cell,
    /// 1 once the client of the session is gone (`ended`).
    ended: Cell,
    /// f64 bits of the window, in requests.
    window_bits: Cell,
    fabric_target_ns: Cell,
    endpoint_delay_ns: Cell,
    smoothed_rtt_ns: Cell,
}

impl SessionMetrics {
    fn new(index: usize) -> SessionMetrics {
        SessionMetrics {
            index,
            latency: std::array::from_fn(|_| HistogramShard::default()),
            requests: std::array::from_fn(|_| Cell::new()),
            bytes: std::array::from_fn(|_| Cell::new()),
            errors: std::array::from_fn(|_| Cell::new()),
            retransmissions: Cell::new(),
            trains: Cell::new(),
            spun_for: Cell::new(),
            timeouts: Cell::new(),
            busy: Cell::new(),
            in_progress_notices: Cell::new(),
            sessions_lost: Cell::new(),
            open: Cell::new(),
            ended: Cell::new(),
            window_bits: Cell::new(),
            fabric_target_ns: Cell::new(),
            endpoint_delay_ns: Cell::new(),
            smoothed_rtt_ns: Cell::new(),
        }
    }

    /// Records a completed request whose first instruction is `opcode`, taken by the I/O task
    /// `latency` ago, that carried `sent_bytes` of operands.
    pub fn complete(&self, opcode: u8, latency: Duration, sent_bytes: u64, result: &Result<Reply, ClientError>) {
        let slot = opcode_slot(opcode);
        self.latency[slot].record_ns(latency.as_nanos());
        self.requests[slot].add(1);
        let mut bytes = sent_bytes;
        match result {
            Ok(reply) => {
                let response = reply.response();
                if response.status() != Status::Ok {
                    self.errors[response.status() as usize].add(1);
                } else {
                    for result in reply.result_iter() {
                        bytes += result.data.len() as u64;
                        if result.status != Status::Ok {
                            self.errors[result.status as usize].add(1);
                        }
                    }
                }
            }
            Err(ClientError::TimedOut { .. } | ClientError::OutcomeUnknown { .. }) => {
                self.errors[Status::ALL.len()].add(1);
            }
            Err(_) => self.errors[Status::ALL.len() + 1].add(1),
        }
        self.bytes[slot].add(bytes);
    }

    /// Answers the session spun for so far (as last updated from its stats).
    pub fn answers_spun_for(&self) -> u64 {
        self.spun_for.get()
    }

    /// Marks the session ended: not open, whatever its last stats said.
    pub fn ended(&self) {
        self.ended.set(1);
        self.open.set(0);
    }

    /// Copies the session's own counters and controller state.
    pub fn update(&self, stats: &SessionStats) {
        self.retransmissions.set(stats.retransmissions);
        self.trains.set(stats.trains);
        self.spun_for.set(stats.spun_for);
        self.timeouts.set(stats.timeouts);
        self.busy.set(stats.busy);
        self.in_progress_notices.set(stats.in_progress_notices);
        self.sessions_lost.set(stats.sessions_lost);
        self.open.set(u64::from(stats.open && self.ended.get() == 0));
        self.window_bits.set(stats.window.to_bits());
        self.smoothed_rtt_ns.set(stats.smoothed_rtt.as_nanos());
        if let Some(swift) = &stats.swift {
            self.fabric_target_ns.set(swift.fabric_target.as_nanos());
            self.endpoint_delay_ns.set(swift.last_endpoint_delay.as_nanos());
        }
    }
}

/// Gauges of the NBD export, updated by its connection tasks (one shared atomic each: they
/// change once per NBD request or connection, not per datagram).
#[derive(Debug, Default)]
pub struct NbdGauges {
    /// Client connections open.
    pub connections: AtomicU64,
    /// NBD requests (pieces of at most the volume's transfer size) being served.
    pub requests_in_flight: AtomicU64,
}

/// An NBD backend that counts the requests being served in [`NbdGauges::requests_in_flight`].
#[derive(Debug)]
pub struct ObservedBackend<B> {
    inner: Arc<B>,
    metrics: Arc<InitiatorMetrics>,
}

impl<B> ObservedBackend<B> {
    /// `inner`, counted in `metrics`.
    pub fn new(inner: Arc<B>, metrics: Arc<InitiatorMetrics>) -> ObservedBackend<B> {
        ObservedBackend { inner, metrics }
    }

    async fn counted<T>(&self, request: impl std::future::Future<Output = T>) -> T {
        let gauge = &self.metrics.nbd.requests_in_flight;
        gauge.fetch_add(1, Ordering::Relaxed);
        // Decremented however the request ends (even if its future is dropped).
        struct Done<'a>(&'a AtomicU64);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::Relaxed);
            }
        }
        let _done = Done(gauge);
        request.await
    }
}

impl<B: NbdBackend> NbdBackend for ObservedBackend<B> {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn block_bytes(&self) -> u32 {
        self.inner.block_bytes()
    }

    fn preferred_bytes(&self) -> u32 {
        self.inner.preferred_bytes()
    }

    fn max_request_bytes(&self) -> u32 {
        self.inner.max_request_bytes()
    }

    async fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), BackendError> {
        self.counted(self.inner.read(offset, out)).await
    }

    async fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), BackendError> {
        self.counted(self.inner.write(offset, data, fua)).await
    }

    async fn flush(&self) -> Result<(), BackendError> {
        self.counted(self.inner.flush()).await
    }

    async fn trim(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        self.counted(self.inner.trim(offset, len)).await
    }

    async fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        self.counted(self.inner.write_zeroes(offset, len)).await
    }

    fn trim_reads_zeroes(&self) -> bool {
        self.inner.trim_reads_zeroes()
    }

    fn can_report_allocation(&self) -> bool {
        self.inner.can_report_allocation()
    }

    async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<(u64, u32)>, BackendError> {
        self.counted(self.inner.block_status(offset, len)).await
    }
}

/// Every shard of one initiator process.
#[derive(Debug, Default)]
pub struct InitiatorMetrics {
    sessions: Mutex<Vec<Arc<SessionMetrics>>>,
    /// The NBD export's gauges.
    pub nbd: NbdGauges,
}

impl InitiatorMetrics {
    /// A shard for a new session (labelled by its order of creation).
    pub fn new_session(&self) -> Arc<SessionMetrics> {
        let mut sessions = self.sessions.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let shard = Arc::new(SessionMetrics::new(sessions.len()));
        sessions.push(shard.clone());
        shard
    }

    /// A registry whose collector reads `metrics`.
    pub fn registry(metrics: Arc<InitiatorMetrics>) -> Registry {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(InitiatorCollector(metrics)));
        registry
    }

    fn sessions(&self) -> Vec<Arc<SessionMetrics>> {
        self.sessions.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }
}

#[derive(Debug)]
struct InitiatorCollector(Arc<InitiatorMetrics>);

impl Collector for InitiatorCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        let encoder = &mut encoder;
        let sessions = self.0.sessions();
        let per_slot = |read: &dyn Fn(&SessionMetrics, usize) -> u64| {
            (0..OPCODE_SLOTS)
                .map(|slot| (slot, sessions.iter().map(|session| read(session, slot)).sum::<u64>()))
                .collect::<Vec<_>>()
        };
        family::info(
            encoder,
            "netdam_initiator_build",
            "The initiator's version",
            vec![("version", env!("CARGO_PKG_VERSION").to_string())],
        )?;
        let latency: Vec<(Labels, HistogramSnapshot)> = (0..OPCODE_SLOTS)
            .filter_map(|slot| {
                let mut snapshot = HistogramSnapshot::default();
                for session in &sessions {
                    session.latency[slot].merge_into(&mut snapshot);
                }
                (snapshot.count() > 0).then(|| (label("opcode", opcode_slot_name(slot)), snapshot))
            })
            .collect();
        histograms(
            encoder,
            "netdam_initiator_latency",
            "End-to-end latency of requests (datagrams) by the opcode of their first instruction, measured by the initiator: from the session's I/O task taking the request (window waits included) to its completion, retransmissions included",
            latency,
        )?;
        let requests = per_slot(&|session, slot| session.requests[slot].get());
        counters(
            encoder,
            "netdam_initiator_requests",
            "Requests (datagrams) completed, by the opcode of their first instruction, whatever the outcome",
            None,
            requests
                .iter()
                .filter(|(_, count)| *count > 0)
                .map(|(slot, count)| (label("opcode", opcode_slot_name(*slot)), *count)),
        )?;
        let bytes = per_slot(&|session, slot| session.bytes[slot].get());
        counters(
            encoder,
            "netdam_initiator_data",
            "Payload bytes of completed requests (operands sent plus result data received), by first opcode",
            Some(&Unit::Bytes),
            bytes
                .iter()
                .filter(|(slot, _)| requests[*slot].1 > 0)
                .map(|(slot, count)| (label("opcode", opcode_slot_name(*slot)), *count)),
        )?;
        let error_names = Status::ALL.iter().map(|status| status.name()).chain(EXTRA_ERRORS);
        counters(
            encoder,
            "netdam_initiator_errors",
            "Failed requests and instructions, by status (an instruction's or the datagram's), or timeout (no answer after every attempt), or client_error",
            None,
            error_names
                .enumerate()
                .filter(|(_, name)| *name != "ok")
                .map(|(index, name)| (label("status", name), sessions.iter().map(|s| s.errors[index].get()).sum())),
        )?;
        let sum = |read: &dyn Fn(&SessionMetrics) -> u64| sessions.iter().map(|session| read(session)).sum::<u64>();
        counters(
            encoder,
            "netdam_initiator_retransmissions",
            "Datagrams sent again after a timeout",
            None,
            [(no_labels(), sum(&|s| s.retransmissions.get()))],
        )?;
        counters(
            encoder,
            "netdam_initiator_trains",
            "Runs of requests sent to the target in one system call (UDP segmentation offload)",
            None,
            [(no_labels(), sum(&|s| s.trains.get()))],
        )?;
        counters(
            encoder,
            "netdam_initiator_answers_spun_for",
            "Answers to a caller sending one request at a time that the session spun for instead of sleeping (poll adaptive)",
            None,
            [(no_labels(), sum(&|s| s.spun_for.get()))],
        )?;
        counters(
            encoder,
            "netdam_initiator_timeouts",
            "Requests that failed after their last attempt",
            None,
            [(no_labels(), sum(&|s| s.timeouts.get()))],
        )?;
        counters(
            encoder,
            "netdam_initiator_busy_answers",
            "BUSY answers received",
            None,
            [(no_labels(), sum(&|s| s.busy.get()))],
        )?;
        counters(
            encoder,
            "netdam_initiator_in_progress_notices",
            "In-progress notices received: a request still executing at the target (block I/O in flight), whose retransmission timer started again",
            None,
            [(no_labels(), sum(&|s| s.in_progress_notices.get()))],
        )?;
        counters(
            encoder,
            "netdam_initiator_sessions_lost",
            "Times the target no longer knew a session and it said HELLO again",
            None,
            [(no_labels(), sum(&|s| s.sessions_lost.get()))],
        )?;
        gauges(
            encoder,
            "netdam_initiator_sessions",
            "Sessions to the target that are open: hold an id from a HELLO the target has not said it lost",
            None,
            [(no_labels(), sum(&|s| s.open.get()) as f64)],
        )?;
        gauges(
            encoder,
            "netdam_initiator_sessions_configured",
            "Sessions this initiator keeps to the target (--sessions), open or not; not those ended (a volume opened again ends its old ones)",
            None,
            [(no_labels(), sessions.iter().filter(|session| session.ended.get() == 0).count() as f64)],
        )?;
        // The state of sessions that are there: an ended one's (a volume opened again) is not
        // shown, while its counters stay in the sums above.
        let per_session = |read: &dyn Fn(&SessionMetrics) -> f64| {
            sessions
                .iter()
                .filter(|session| session.ended.get() == 0)
                .map(|session| (label("session", session.index.to_string()), read(session)))
                .collect::<Vec<_>>()
        };
        gauges(
            encoder,
            "netdam_initiator_window",
            "Congestion window of each session, in requests (Swift's smaller of the fabric and endpoint windows)",
            None,
            per_session(&|s| f64::from_bits(s.window_bits.get())),
        )?;
        gauges(
            encoder,
            "netdam_initiator_target_delay",
            "Swift's fabric target delay of each session (the delay it steers the fabric part of the RTT to)",
            Some(&Unit::Seconds),
            per_session(&|s| s.fabric_target_ns.get() as f64 / 1e9),
        )?;
        gauges(
            encoder,
            "netdam_initiator_endpoint_delay",
            "Last endpoint delay each session saw: the target's service time stamped in its answer",
            Some(&Unit::Seconds),
            per_session(&|s| s.endpoint_delay_ns.get() as f64 / 1e9),
        )?;
        gauges(
            encoder,
            "netdam_initiator_smoothed_rtt",
            "Smoothed round-trip time of each session",
            Some(&Unit::Seconds),
            per_session(&|s| s.smoothed_rtt_ns.get() as f64 / 1e9),
        )?;
        gauges(
            encoder,
            "netdam_nbd_connections",
            "NBD client connections open",
            None,
            [(no_labels(), self.0.nbd.connections.load(Ordering::Relaxed) as f64)],
        )?;
        gauges(
            encoder,
            "netdam_nbd_requests_in_flight",
            "NBD requests (pieces of at most the volume's transfer size) being served",
            None,
            [(no_labels(), self.0.nbd.requests_in_flight.load(Ordering::Relaxed) as f64)],
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netdam_isa::Opcode;

    #[test]
    fn failures_count_by_kind_and_shards_sum_when_scraped() {
        let metrics = Arc::new(InitiatorMetrics::default());
        let first = metrics.new_session();
        let second = metrics.new_session();
        let read = Opcode::BlockRead as u8;
        first.complete(read, Duration::from_micros(30), 0, &Err(ClientError::TimedOut { attempts: 5 }));
        second.complete(read, Duration::from_micros(40), 0, &Err(ClientError::SessionLost));
        second.complete(Opcode::Flush as u8, Duration::from_micros(50), 0, &Err(ClientError::Closed));
        metrics.nbd.connections.store(3, Ordering::Relaxed);
        first.update(&SessionStats { open: true, ..SessionStats::default() });
        let registry = InitiatorMetrics::registry(metrics);
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).unwrap();
        for line in [
            "netdam_initiator_requests_total{opcode=\"bread\"} 2\n",
            "netdam_initiator_requests_total{opcode=\"flush\"} 1\n",
            "netdam_initiator_errors_total{status=\"timeout\"} 1\n",
            "netdam_initiator_errors_total{status=\"client_error\"} 2\n",
            "netdam_initiator_errors_total{status=\"busy\"} 0\n",
            "netdam_initiator_latency_seconds_count{opcode=\"bread\"} 2\n",
            "netdam_initiator_sessions 1.0\n",
            "netdam_initiator_sessions_configured 2.0\n",
            "netdam_initiator_window{session=\"1\"} 0.0\n",
            "netdam_nbd_connections 3.0\n",
        ] {
            assert!(text.contains(line), "{line:?} missing from:\n{text}");
        }
        assert!(!text.contains("status=\"ok\""), "ok is not an error");
        assert!(!text.contains("opcode=\"read\""), "opcodes never used have no series");
    }

    #[test]
    fn a_session_shard_sits_on_its_own_cache_lines() {
        assert_eq!(std::mem::align_of::<SessionMetrics>(), 128);
    }
}
