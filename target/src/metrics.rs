//! The target's `/metrics`: a collector that sums every worker's shard when scraped.
//!
//! Workers only ever write their own [`WorkerStats`] (see [`crate::stats`]); this collector reads
//! them all at scrape time and writes the families listed in `docs/METRICS.md`. Nothing here
//! runs on a worker: the endpoint has a thread of its own ([`netdam_metrics::MetricsServer`]).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use netdam_isa::Status;
use netdam_metrics::family::{self, counters, gauges, histograms, label, no_labels, Labels};
use netdam_metrics::HistogramSnapshot;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::{Registry, Unit};

use crate::dispatch::Shared;
use crate::qos::Shed;
use crate::stats::{opcode_slot_name, thread_context_switches, Counter, WorkerStats, OPCODE_SLOTS, OTHER_OPCODE_SLOT};

/// What `netdam_build_info` says about this target.
#[derive(Debug, Clone)]
pub struct BuildInfo {
    /// The crate version.
    pub version: &'static str,
    /// The execution engine.
    pub engine: &'static str,
    /// The workers' poll mode (`busy`, `adaptive`, `blocking`).
    pub poll_mode: String,
}

/// Sums the workers' shards into the target's metric families at each scrape.
#[derive(Debug)]
pub struct TargetCollector {
    shared: Arc<Shared>,
    build: BuildInfo,
}

impl TargetCollector {
    /// A collector over the workers of `shared`.
    pub fn new(shared: Arc<Shared>, build: BuildInfo) -> TargetCollector {
        TargetCollector { shared, build }
    }

    /// A registry holding only this collector.
    pub fn registry(self) -> Registry {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self));
        registry
    }

    fn workers(&self) -> &[WorkerStats] {
        &self.shared.stats
    }

    fn sum(&self, counter: Counter) -> u64 {
        self.workers().iter().map(|worker| worker.get(counter)).sum()
    }

    /// One series per `(label value, counter)`, summed over workers.
    fn by_reason(&self, name: &'static str, pairs: &[(&str, Counter)]) -> Vec<(Labels, u64)> {
        pairs.iter().map(|(value, counter)| (label(name, *value), self.sum(*counter))).collect()
    }

    /// Opcode slots to show: every named opcode, and `other` once something landed there.
    fn shown_slots(&self) -> impl Iterator<Item = usize> + '_ {
        (0..OPCODE_SLOTS).filter(|&slot| {
            slot != OTHER_OPCODE_SLOT || self.workers().iter().any(|worker| worker.opcodes[slot].instructions.get() > 0)
        })
    }

    fn opcode_sum(&self, slot: usize, read: impl Fn(&crate::stats::OpcodeStats) -> u64) -> u64 {
        self.workers().iter().map(|worker| read(&worker.opcodes[slot])).sum()
    }

    /// Per-opcode histograms with at least one value (an opcode's series appear with its first
    /// request, so an idle target's answer stays short).
    fn histogram_series(&self, service: bool) -> Vec<(Labels, HistogramSnapshot)> {
        (0..OPCODE_SLOTS)
            .filter_map(|slot| {
                let mut snapshot = HistogramSnapshot::default();
                for worker in self.workers() {
                    let record = &worker.opcodes[slot];
                    if service { &record.service } else { &record.queueing }.merge_into(&mut snapshot);
                }
                (snapshot.count() > 0).then(|| (label("opcode", opcode_slot_name(slot)), snapshot))
            })
            .collect()
    }
}

impl Collector for TargetCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        let encoder = &mut encoder;
        family::info(
            encoder,
            "netdam_build",
            "The target's version, execution engine and worker poll mode",
            vec![
                ("version", self.build.version.to_string()),
                ("engine", self.build.engine.to_string()),
                ("poll_mode", self.build.poll_mode.clone()),
            ],
        )?;
        let engine = &self.shared.engine;
        gauges(
            encoder,
            "netdam_engine",
            "1 for the engine executing instructions now (software or fpga), 0 for the other",
            None,
            [("software", !engine.on_fpga()), ("fpga", engine.on_fpga())]
                .into_iter()
                .map(|(name, now)| (label("engine", name), f64::from(u8::from(now)))),
        )?;
        counters(
            encoder,
            "netdam_engine_failovers",
            "Failovers from the FPGA engine to software (a wedged, reset or failed device)",
            None,
            [(no_labels(), engine.failovers())],
        )?;
        gauges(
            encoder,
            "netdam_workers",
            "Worker threads serving the UDP port",
            None,
            [(no_labels(), self.workers().len() as f64)],
        )?;
        histograms(
            encoder,
            "netdam_service_time",
            "Service time of executed datagrams, by the opcode of their first instruction: from arrival in the socket queue until the answer is handed to the kernel (queueing, execution and any group-commit persist), as stamped in the response",
            self.histogram_series(true),
        )?;
        histograms(
            encoder,
            "netdam_queueing_delay",
            "Queueing delay of parsed requests, by the opcode of their first instruction: time in the kernel's socket queue and behind earlier datagrams of the worker's batch",
            self.histogram_series(false),
        )?;
        counters(
            encoder,
            "netdam_instructions",
            "Instructions answered, whatever their status, by opcode",
            None,
            self.shown_slots()
                .map(|slot| (label("opcode", opcode_slot_name(slot)), self.opcode_sum(slot, |r| r.instructions.get()))),
        )?;
        counters(
            encoder,
            "netdam_data",
            "Payload bytes by opcode: received in instructions' operands (write data, atomic operands, VADD lanes) and sent in their results (read data, old values)",
            Some(&Unit::Bytes),
            self.shown_slots().flat_map(|slot| {
                let name = opcode_slot_name(slot);
                [
                    (
                        vec![("opcode", name.to_string()), ("direction", "received".to_string())],
                        self.opcode_sum(slot, |r| r.bytes_received.get()),
                    ),
                    (
                        vec![("opcode", name.to_string()), ("direction", "sent".to_string())],
                        self.opcode_sum(slot, |r| r.bytes_sent.get()),
                    ),
                ]
            }),
        )?;
        counters(
            encoder,
            "netdam_instruction_results",
            "Instructions answered, by status",
            None,
            Status::ALL.iter().map(|status| {
                let count = self.workers().iter().map(|worker| worker.status_count(*status)).sum();
                (label("status", status.name()), count)
            }),
        )?;
        let per_worker = |counter: Counter| {
            self.workers()
                .iter()
                .enumerate()
                .map(move |(index, worker)| (label("worker", index.to_string()), worker.get(counter)))
        };
        counters(
            encoder,
            "netdam_worker_context_switches",
            "Context switches of each worker's thread, from the kernel (/proc): involuntary, the scheduler took the worker's CPU while it could run (another thread or process preempted it; on a busy-polling worker each one stalls the requests it holds, a cause of tail latency the target cannot see in its own queueing), or voluntary, it slept (an adaptive or blocking worker waiting for datagrams)",
            None,
            self.workers().iter().enumerate().flat_map(|(index, worker)| {
                let switches = worker.thread_id().and_then(|thread| thread_context_switches("self", thread));
                switches.into_iter().flat_map(move |(voluntary, involuntary)| {
                    [
                        (vec![("worker", index.to_string()), ("kind", "involuntary".to_string())], involuntary),
                        (vec![("worker", index.to_string()), ("kind", "voluntary".to_string())], voluntary),
                    ]
                })
            }),
        )?;
        counters(
            encoder,
            "netdam_datagrams_received",
            "Datagrams taken from the socket, by worker",
            None,
            per_worker(Counter::DatagramsReceived),
        )?;
        counters(
            encoder,
            "netdam_responses_sent",
            "Answers to datagrams received handed to the kernel (netdam_send_errors_total of them refused), by worker; the in-progress notices sent unasked for slow requests are not counted (netdam_in_progress_notices_total, cause slow)",
            None,
            per_worker(Counter::ResponsesSent),
        )?;
        counters(
            encoder,
            "netdam_datagrams_dropped",
            "Datagrams dropped without an answer, by reason",
            None,
            self.by_reason(
                "reason",
                &[
                    ("too_short", Counter::DroppedTooShort),
                    ("bad_magic", Counter::DroppedBadMagic),
                    ("bad_crc", Counter::DroppedBadCrc),
                    ("oversized", Counter::DroppedOversized),
                    ("not_request", Counter::DroppedNotRequest),
                ],
            ),
        )?;
        counters(
            encoder,
            "netdam_in_progress_notices",
            "In-progress notices sent (status in_progress: the request is still executing, its answer follows), by cause: slow (it had waited 5 ms for block I/O, or 5 ms since its last notice) or duplicate (a retransmission of it arrived)",
            None,
            self.by_reason(
                "cause",
                &[("slow", Counter::InProgressNotices), ("duplicate", Counter::DuplicatesInProgress)],
            ),
        )?;
        counters(
            encoder,
            "netdam_datagrams_refused",
            "Datagrams answered with a datagram-level status and not executed, by that status (busy ones are in netdam_busy_answers_total)",
            None,
            self.by_reason(
                "status",
                &[
                    ("unsupported_version", Counter::AnsweredUnsupportedVersion),
                    ("malformed", Counter::AnsweredMalformed),
                    ("stale", Counter::AnsweredStale),
                    ("no_session", Counter::AnsweredNoSession),
                ],
            ),
        )?;
        counters(
            encoder,
            "netdam_busy_answers",
            "Datagrams answered busy and not executed, by reason: queued longer than busy_threshold_us (queueing), every slot for datagrams waiting on block I/O taken (block_slots_full), or the session's tenant held to its share (tenant_rate, tenant_overload, tenant_in_flight: netdam_tenant_shed_total by tenant)",
            None,
            self.by_reason(
                "reason",
                &[
                    ("queueing", Counter::AnsweredBusy),
                    ("block_slots_full", Counter::BusyBlockSlotsFull),
                    ("tenant_rate", Counter::BusyTenantRate),
                    ("tenant_overload", Counter::BusyTenantOverload),
                    ("tenant_in_flight", Counter::BusyTenantInFlight),
                ],
            ),
        )?;
        counters(
            encoder,
            "netdam_duplicates",
            "Retransmitted requests, by what the target did: answered from the replay window (non-idempotent) or executed again (idempotent); those still waiting on block I/O are answered with an in-progress notice instead (netdam_in_progress_notices_total, cause duplicate)",
            None,
            self.by_reason(
                "outcome",
                &[("replayed", Counter::DuplicatesReplayed), ("executed_again", Counter::DuplicatesExecutedAgain)],
            ),
        )?;
        counters(
            encoder,
            "netdam_sessions_opened",
            "Sessions opened by HELLO",
            None,
            [(no_labels(), self.sum(Counter::SessionsOpened))],
        )?;
        counters(
            encoder,
            "netdam_sessions_ended",
            "Sessions ended, by reason: CLOSE, silence (idle timeout), or evicted by a new HELLO",
            None,
            self.by_reason(
                "reason",
                &[
                    ("closed", Counter::SessionsClosed),
                    ("expired", Counter::SessionsExpired),
                    ("evicted", Counter::SessionsEvicted),
                ],
            ),
        )?;
        let opened = self.sum(Counter::SessionsOpened);
        let ended =
            self.sum(Counter::SessionsClosed) + self.sum(Counter::SessionsExpired) + self.sum(Counter::SessionsEvicted);
        gauges(
            encoder,
            "netdam_sessions_open",
            "Sessions open now",
            None,
            [(no_labels(), opened.saturating_sub(ended) as f64)],
        )?;
        counters(
            encoder,
            "netdam_closes_ignored",
            "CLOSEs that ended nothing (unknown session, another sender's, or none)",
            None,
            [(no_labels(), self.sum(Counter::ClosesIgnored))],
        )?;
        counters(
            encoder,
            "netdam_hello_cookies_sent",
            "HELLOs answered retry with a cookie",
            None,
            [(no_labels(), self.sum(Counter::CookiesSent))],
        )?;
        counters(
            encoder,
            "netdam_hello_refusals",
            "HELLOs refused, by reason: a forged or copied cookie, an expired cookie, every slot held (answered busy), or the address's share of slots held (answered session_limit)",
            None,
            self.by_reason(
                "reason",
                &[
                    ("bad_cookie", Counter::HelloBadCookie),
                    ("expired_cookie", Counter::HelloExpiredCookie),
                    ("table_full", Counter::HelloRefusedTableFull),
                    ("address_limit", Counter::HelloRefusedAddressLimit),
                ],
            ),
        )?;
        counters(
            encoder,
            "netdam_block_datagrams_deferred",
            "Datagrams with block instructions, answered when their I/O completed",
            None,
            [(no_labels(), self.sum(Counter::BlockDatagramsDeferred))],
        )?;
        counters(
            encoder,
            "netdam_block_fua_writes",
            "BWRITEs with FUA (durable before their answer) handed to a namespace's device",
            None,
            [(no_labels(), self.sum(Counter::BlockFuaWrites))],
        )?;
        let namespaces: Vec<(usize, String)> = self
            .shared
            .namespaces
            .iter()
            .map(|(id, namespace)| (usize::from(id), namespace.name().to_string()))
            .collect();
        let block_sum = |id: usize, submitted: bool| -> u64 {
            self.workers()
                .iter()
                .map(|worker| {
                    let cells = if submitted { &worker.block_submitted } else { &worker.block_completed };
                    cells.get(id).map_or(0, |cell| cell.get())
                })
                .sum()
        };
        counters(
            encoder,
            "netdam_block_requests_submitted",
            "Block requests handed to a namespace's device, by namespace",
            None,
            namespaces.iter().map(|(id, name)| (label("namespace", name.clone()), block_sum(*id, true))),
        )?;
        gauges(
            encoder,
            "netdam_block_requests_in_flight",
            "Block requests submitted to a namespace's device and not yet completed, by namespace",
            None,
            namespaces.iter().map(|(id, name)| {
                // Each worker's completions never pass its submissions; the two are read at
                // slightly different times, so the difference is clamped.
                let in_flight = block_sum(*id, true).saturating_sub(block_sum(*id, false));
                (label("namespace", name.clone()), in_flight as f64)
            }),
        )?;
        counters(
            encoder,
            "netdam_group_commits",
            "Receive passes whose writes to persistent regions were persisted together before their answers left",
            None,
            [(no_labels(), self.sum(Counter::GroupCommits))],
        )?;
        counters(
            encoder,
            "netdam_worker_contended_yields",
            "Yields of an adaptive worker that lost its core for over 500 us to another thread (it then blocks on an empty socket for 100 ms)",
            None,
            [(no_labels(), self.sum(Counter::ContendedYields))],
        )?;
        counters(
            encoder,
            "netdam_group_commit_failures",
            "Group commits whose persist failed (their held answers said io_error)",
            None,
            [(no_labels(), self.sum(Counter::GroupCommitFailures))],
        )?;
        counters(
            encoder,
            "netdam_answers_held",
            "Answers held for their receive pass's group commit",
            None,
            [(no_labels(), self.sum(Counter::AnswersHeld))],
        )?;
        counters(
            encoder,
            "netdam_answer_trains",
            "Runs of answers to one initiator sent in one system call (UDP segmentation offload)",
            None,
            [(no_labels(), self.sum(Counter::AnswerTrains))],
        )?;
        counters(
            encoder,
            "netdam_send_errors",
            "Responses the kernel refused to send",
            None,
            [(no_labels(), self.sum(Counter::SendErrors))],
        )?;
        counters(
            encoder,
            "netdam_receive_errors",
            "Receive calls that failed other than for lack of data",
            None,
            [(no_labels(), self.sum(Counter::ReceiveErrors))],
        )?;
        counters(
            encoder,
            "netdam_auth_refusals",
            "Datagrams refused for want of authentication, by reason: bad_mac and unsealed (dropped unanswered), hello (HELLOs answered unauthenticated), stat (sessionless STATs answered unauthenticated)",
            None,
            self.by_reason(
                "reason",
                &[
                    ("bad_mac", Counter::DroppedBadMac),
                    ("unsealed", Counter::DroppedUnsealed),
                    ("hello", Counter::HelloUnauthenticated),
                    ("stat", Counter::AnsweredUnauthenticated),
                ],
            ),
        )?;
        counters(
            encoder,
            "netdam_sessions_ended_by_tenant_change",
            "Sessions ended because their tenant was deleted or its key rotated",
            None,
            [(no_labels(), self.sum(Counter::SessionsEndedByTenantChange))],
        )?;
        // Per tenant, for the tenants in force (read at scrape time, never on the request path).
        let (_, tenants) = self.shared.tenants.load();
        let usage = &self.shared.usage;
        gauges(
            encoder,
            "netdam_tenant_sessions",
            "Sessions open now, by tenant",
            None,
            tenants.iter().map(|tenant| {
                (label("tenant", tenant.name.clone()), f64::from(usage.get(tenant.id).sessions.load(Relaxed)))
            }),
        )?;
        gauges(
            encoder,
            "netdam_tenant_block_in_flight",
            "Block datagrams waiting for I/O at the target now, by tenant (bounded by its max_in_flight)",
            None,
            tenants.iter().map(|tenant| {
                (label("tenant", tenant.name.clone()), f64::from(usage.get(tenant.id).in_flight.load(Relaxed)))
            }),
        )?;
        counters(
            encoder,
            "netdam_tenant_shed",
            "Requests answered busy instead of executed, by tenant and reason: rate (its token bucket was empty), overload (best-effort while requests queued), in_flight (its block I/O limit)",
            None,
            tenants.iter().flat_map(|tenant| {
                Shed::ALL.into_iter().map(move |reason| {
                    let labels = vec![("tenant", tenant.name.clone()), ("reason", reason.name().to_string())];
                    (labels, usage.get(tenant.id).shed(reason))
                })
            }),
        )?;
        counters(
            encoder,
            "netdam_tenant_sessions_refused",
            "HELLOs refused session_limit because the tenant held max_sessions, by tenant",
            None,
            tenants.iter().map(|tenant| {
                (label("tenant", tenant.name.clone()), usage.get(tenant.id).sessions_refused.load(Relaxed))
            }),
        )?;
        Ok(())
    }
}
