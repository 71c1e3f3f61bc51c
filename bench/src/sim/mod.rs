//! A deterministic simulator: initiators and one target on a virtual clock, over a seeded network.
//!
//! It runs the production state machines, not models of them: each initiator is a
//! `netdam_initiator::session::Session` (sequencing, retransmission, Swift), the target is the
//! `netdam_target::dispatch::Dispatcher` with its session table and the software engine over real
//! (anonymous) regions. Only time, the wire and the target's service time are simulated.
//!
//! The network is a star: every initiator has a link to a switch, and the switch reaches the
//! target over one bottleneck link in each direction. Faults (loss, duplication, reordering) hit
//! the bottleneck. Everything random comes from the scenario's seed, so a seed reproduces a run
//! exactly; a step bound turns a livelock into an error.

pub mod network;
pub mod table;

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;

use netdam_initiator::session::{Completion, Session, SessionConfig};
use netdam_initiator::{ClientError, Op};
use netdam_isa::limits::{DEFAULT_DATAGRAM_BYTES, RECEIVE_BATCH};
use netdam_isa::{Duration, Instant, LaneType};
use netdam_target::block::ReplyTo;
use netdam_target::config::{ByteSize, RegionBackend, RegionConfig};
use netdam_target::cookies::CookieJar;
use netdam_target::dispatch::{DispatchSettings, Dispatcher, Handled, Shared, Wait};
use netdam_target::engine::SoftwareEngine;
use netdam_target::namespaces::NamespaceTable;
use netdam_target::regions::RegionTable;

use netdam_isa::rng::Rng;
use network::Port;

/// The simulated network.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NetworkConfig {
    /// Rate of each initiator's link, Gb/s.
    pub edge_gbps: f64,
    /// Rate of the switch–target link, each direction, Gb/s.
    pub bottleneck_gbps: f64,
    /// One-way propagation delay of each link.
    pub propagation: Duration,
    /// Buffer of the switch port toward the target (and back), bytes.
    pub bottleneck_buffer_bytes: usize,
    /// Probability that a datagram crossing the bottleneck is lost.
    pub loss: f64,
    /// Probability that it is delivered twice.
    pub duplicate: f64,
    /// Probability that it is held back by up to `reorder_delay`, arriving after later ones.
    pub reorder: f64,
    /// Longest hold-back of a reordered datagram.
    pub reorder_delay: Duration,
}

impl Default for NetworkConfig {
    fn default() -> NetworkConfig {
        NetworkConfig {
            edge_gbps: 25.0,
            bottleneck_gbps: 10.0,
            propagation: Duration::from_micros(2),
            bottleneck_buffer_bytes: 256 << 10,
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            reorder_delay: Duration::from_micros(50),
        }
    }
}

/// What the initiators do.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Workload {
    /// Each initiator runs `ops` operations, checked for exactly-once execution: FETCH_ADDs on a
    /// shared counter (every old value must come back exactly once), VADDs on shared lanes, and
    /// WRITE+READ pairs on its own slots (the READ must return what the WRITE wrote).
    Checked { ops: u64 },
    /// Each initiator writes `write_bytes` at a time, as fast as its window allows, for `duration`.
    Incast { write_bytes: usize, duration: Duration },
}

/// One simulation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scenario {
    /// Seed of every random choice.
    pub seed: u64,
    /// Initiators.
    pub initiators: usize,
    /// The network.
    pub network: NetworkConfig,
    /// Each initiator's session settings (congestion control on or off among them).
    pub session: SessionConfig,
    /// What the initiators do.
    pub workload: Workload,
    /// Target time per datagram.
    pub target_service: Duration,
    /// Target time per byte of datagram, ns.
    pub target_ns_per_byte: f64,
    /// Datagrams the target's socket holds before the kernel drops.
    pub target_queue_datagrams: usize,
    /// Queueing past which the target answers BUSY.
    pub busy_threshold: Duration,
    /// Events processed at most: more means a livelock.
    pub step_limit: u64,
}

impl Scenario {
    /// A scenario with usual settings for `seed`, `initiators` and `workload`.
    pub fn new(seed: u64, initiators: usize, workload: Workload) -> Scenario {
        Scenario {
            seed,
            initiators,
            network: NetworkConfig::default(),
            // Simulated initiators never give up while the network delivers anything: at 10% loss
            // each way an attempt fails one time in five, so 8 attempts would fail an operation
            // in about 400,000, which a thousand seeds reach.
            session: SessionConfig {
                max_in_flight: 32,
                initial_rto: Duration::from_millis(1),
                // Simulated targets do not pause while they open a session (the reason for the
                // 20 ms floor on real ones): no floor of its own, so a HELLO is timed like any
                // other request and lost HELLOs cost what they did in the table's short workloads.
                min_hello_rto: Duration::ZERO,
                max_attempts: 24,
                ..SessionConfig::default()
            },
            workload,
            target_service: Duration::from_nanos(1500),
            target_ns_per_byte: 0.05,
            target_queue_datagrams: 1024,
            busy_threshold: Duration::from_millis(1),
            step_limit: 50_000_000,
        }
    }
}

/// What a simulation measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// Simulated time until the last initiator finished.
    pub elapsed: Duration,
    /// Events processed.
    pub steps: u64,
    /// Operations answered OK.
    pub completed: u64,
    /// Operations that failed, with the first few reasons.
    pub failed: u64,
    /// First failure reasons.
    pub failures: Vec<String>,
    /// Operation latency, submission to completion: median.
    pub latency_p50: Duration,
    /// 99th percentile.
    pub latency_p99: Duration,
    /// Round trip of the transmission that was answered: median.
    pub rtt_p50: Duration,
    /// 99th percentile.
    pub rtt_p99: Duration,
    /// Queueing at the switch port toward the target: median.
    pub bottleneck_queueing_p50: Duration,
    /// 99th percentile.
    pub bottleneck_queueing_p99: Duration,
    /// Maximum.
    pub bottleneck_queueing_max: Duration,
    /// Datagrams dropped by the full bottleneck buffer (both directions).
    pub congestion_drops: u64,
    /// Datagrams dropped by the target's full socket queue.
    pub target_queue_drops: u64,
    /// Datagrams lost, duplicated and reordered by injected faults.
    pub injected: (u64, u64, u64),
    /// Retransmissions, all initiators.
    pub retransmissions: u64,
    /// BUSY answers, all initiators.
    pub busy: u64,
    /// Retransmitted requests the target answered from its replay window.
    pub replayed: u64,
    /// Payload bytes of completed writes per second, Gb/s (incast).
    pub throughput_gbps: f64,
    /// Jain's fairness index over per-initiator completed bytes (1 = perfectly fair).
    pub fairness: f64,
}

/// A summary for people, one figure per line group; `{:?}` still gives every field.
impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let us = |duration: Duration| duration.as_nanos() as f64 / 1000.0;
        let (lost, duplicated, reordered) = self.injected;
        writeln!(
            f,
            "operations: {} completed, {} failed, in {:.3} ms simulated ({} steps)",
            self.completed,
            self.failed,
            us(self.elapsed) / 1000.0,
            self.steps
        )?;
        writeln!(f, "latency: p50 {:.1} µs, p99 {:.1} µs", us(self.latency_p50), us(self.latency_p99))?;
        writeln!(f, "round trip: p50 {:.1} µs, p99 {:.1} µs", us(self.rtt_p50), us(self.rtt_p99))?;
        writeln!(
            f,
            "bottleneck queueing: p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs",
            us(self.bottleneck_queueing_p50),
            us(self.bottleneck_queueing_p99),
            us(self.bottleneck_queueing_max)
        )?;
        writeln!(
            f,
            "drops: {} at the full bottleneck, {} at the target's full socket queue",
            self.congestion_drops, self.target_queue_drops
        )?;
        writeln!(f, "injected faults: {lost} lost, {duplicated} duplicated, {reordered} reordered")?;
        writeln!(
            f,
            "retransmissions: {}, busy answers: {}, answered from the replay window: {}",
            self.retransmissions, self.busy, self.replayed
        )?;
        writeln!(
            f,
            "throughput: {:.2} Gb/s of completed writes, fairness (Jain's index) {:.4}",
            self.throughput_gbps, self.fairness
        )?;
        for failure in &self.failures {
            writeln!(f, "failure: {failure}")?;
        }
        Ok(())
    }
}

/// A run that broke an invariant or did not finish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimError {
    /// The seed that reproduces it.
    pub seed: u64,
    /// What went wrong.
    pub message: String,
}

impl std::fmt::Display for SimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SEED={}: {}", self.seed, self.message)
    }
}

const COUNTER_OFFSET: u64 = 0;
const LANES_OFFSET: u64 = 64;
const LANES: usize = 16;
const SLOTS_OFFSET: u64 = 4096;
const SLOTS_PER_INITIATOR: u64 = 64;
const SLOT_BYTES: u64 = 64;
const INCAST_AREA_BYTES: u64 = 64 << 10;
/// The address the target sees initiator `index` send from: a host of its own, so the target's
/// per-address session limit plays no part in the simulated network.
fn initiator_addr(index: usize) -> SocketAddr {
    SocketAddr::from(([127, 1, (index >> 8) as u8, index as u8], 7000))
}

/// The switch is one hop: the target sees TTL 63.
const RECEIVED_TTL: u8 = 63;
/// Target time for an answer that executes nothing.
const NON_EXECUTING_ANSWER: Duration = Duration::from_nanos(300);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpKind {
    FetchAdd,
    WriteRead { slot: u64, stamp: u64 },
    Vadd,
    IncastWrite,
}

#[derive(Debug)]
enum Event {
    /// A datagram from initiator `from` reaches the switch on its way to the target.
    SwitchToTarget { from: usize, bytes: Vec<u8> },
    /// A datagram from the target reaches the switch on its way to initiator `to`.
    SwitchToInitiator { to: usize, bytes: Vec<u8> },
    /// A datagram reaches the target's socket.
    AtTarget { from: usize, bytes: Vec<u8> },
    /// A datagram reaches initiator `i`.
    AtInitiator { initiator: usize, bytes: Vec<u8> },
    /// The target finished the datagram it was serving.
    TargetDone { to: usize, response: Option<Vec<u8>> },
    /// An initiator's timer.
    Wake { initiator: usize, generation: u64 },
}

struct Initiator {
    session: Session,
    established: bool,
    submitted: u64,
    finished: u64,
    next_token: u64,
    pending: BTreeMap<u64, (Instant, OpKind)>,
    wake_generation: u64,
    completed_bytes: u64,
}

struct Target {
    dispatcher: Dispatcher<SoftwareEngine>,
    queue: VecDeque<(Instant, usize, Vec<u8>)>,
    busy: bool,
    out: Vec<u8>,
    drops: u64,
}

struct Sim {
    scenario: Scenario,
    now: Instant,
    events: BTreeMap<(Instant, u64), Event>,
    next_event: u64,
    rng: Rng,
    uplinks: Vec<Port>,
    downlinks: Vec<Port>,
    to_target: Port,
    from_target: Port,
    initiators: Vec<Initiator>,
    target: Target,
    regions: Arc<RegionTable>,
    injected: (u64, u64, u64),
    latencies: Vec<u64>,
    rtts: Vec<u64>,
    bottleneck_queueing: Vec<u64>,
    fetch_add_old_values: Vec<u64>,
    vadds: u64,
    failures: Vec<String>,
    failed: u64,
    completed: u64,
    finished_at: Instant,
    steps: u64,
}

/// Runs `scenario` to the end; checks the invariants of its workload.
pub fn run(scenario: &Scenario) -> Result<Report, SimError> {
    let mut sim = Sim::new(scenario).map_err(|message| SimError { seed: scenario.seed, message })?;
    sim.run().map_err(|message| SimError { seed: scenario.seed, message })?;
    sim.check().map_err(|message| SimError { seed: scenario.seed, message })?;
    Ok(sim.report())
}

impl Sim {
    fn new(scenario: &Scenario) -> Result<Sim, String> {
        // Every initiator's Session asserts its window: refuse a bad one as an error first.
        scenario.session.check().map_err(|error| error.to_string())?;
        let network = scenario.network;
        let region_bytes = (SLOTS_OFFSET + INCAST_AREA_BYTES * scenario.initiators as u64).next_multiple_of(4096);
        let regions = vec![RegionConfig {
            name: "sim".to_string(),
            backend: RegionBackend::Mem,
            path: None,
            size: ByteSize(region_bytes),
        }];
        let regions = Arc::new(RegionTable::open(&regions, std::path::Path::new(".")).map_err(|e| e.to_string())?);
        // The simulated target serves memory only: no namespaces, so no block I/O to model.
        let namespaces = Arc::new(NamespaceTable::default());
        let settings = DispatchSettings {
            max_datagram_bytes: DEFAULT_DATAGRAM_BYTES,
            busy_threshold: scenario.busy_threshold,
            ..DispatchSettings::default()
        };
        // The cookie secret comes from the seed like everything else, so a seed replays exactly.
        let mut secret = [0u8; 16];
        let mut secret_rng = Rng::new(scenario.seed ^ 0x636f_6f6b_6965);
        secret[..8].copy_from_slice(&secret_rng.next_u64().to_le_bytes());
        secret[8..].copy_from_slice(&secret_rng.next_u64().to_le_bytes());
        let shared =
            Arc::new(Shared::new(regions.clone(), namespaces, 1, settings, scenario.seed, CookieJar::new(secret)));
        let dispatcher = Dispatcher::new(SoftwareEngine::new(regions.clone()), shared, 0, Vec::new());
        let edge_buffer = 16 << 20;
        let port = |gbps, buffer| Port::new(gbps, network.propagation, buffer);
        let initiators = (0..scenario.initiators)
            .map(|_| Initiator {
                session: Session::new(scenario.session, 0),
                established: false,
                submitted: 0,
                finished: 0,
                next_token: 0,
                pending: BTreeMap::new(),
                wake_generation: 0,
                completed_bytes: 0,
            })
            .collect();
        Ok(Sim {
            scenario: *scenario,
            now: Instant::ZERO,
            events: BTreeMap::new(),
            next_event: 0,
            rng: Rng::new(scenario.seed),
            uplinks: (0..scenario.initiators).map(|_| port(network.edge_gbps, edge_buffer)).collect(),
            downlinks: (0..scenario.initiators).map(|_| port(network.edge_gbps, edge_buffer)).collect(),
            to_target: port(network.bottleneck_gbps, network.bottleneck_buffer_bytes),
            from_target: port(network.bottleneck_gbps, network.bottleneck_buffer_bytes),
            initiators,
            target: Target {
                dispatcher,
                queue: VecDeque::new(),
                busy: false,
                out: vec![0u8; DEFAULT_DATAGRAM_BYTES],
                drops: 0,
            },
            regions,
            injected: (0, 0, 0),
            latencies: Vec::new(),
            rtts: Vec::new(),
            bottleneck_queueing: Vec::new(),
            fetch_add_old_values: Vec::new(),
            vadds: 0,
            failures: Vec::new(),
            failed: 0,
            completed: 0,
            finished_at: Instant::ZERO,
            steps: 0,
        })
    }

    fn schedule(&mut self, at: Instant, event: Event) {
        self.events.insert((at, self.next_event), event);
        self.next_event += 1;
    }

    fn run(&mut self) -> Result<(), String> {
        for initiator in 0..self.initiators.len() {
            self.initiators[initiator].session.start_hello(DEFAULT_DATAGRAM_BYTES as u32);
            self.flush(initiator);
        }
        let mut steps = 0u64;
        while let Some(((at, _), event)) = self.events.pop_first() {
            steps += 1;
            if steps > self.scenario.step_limit {
                return Err(format!("livelock: no end after {} events at {:?}", self.scenario.step_limit, at));
            }
            self.now = at;
            match event {
                Event::SwitchToTarget { from, bytes } => self.switch_to_target(from, bytes),
                Event::SwitchToInitiator { to, bytes } => {
                    if let Some(departure) = self.downlinks[to].offer(self.now, bytes.len()) {
                        self.schedule(departure.arrival, Event::AtInitiator { initiator: to, bytes });
                    }
                }
                Event::AtTarget { from, bytes } => self.at_target(from, bytes),
                Event::AtInitiator { initiator, bytes } => {
                    self.initiators[initiator].session.handle_datagram(self.now, &bytes);
                    self.progress(initiator)?;
                }
                Event::TargetDone { to, response } => self.target_done(to, response),
                Event::Wake { initiator, generation } => {
                    if generation == self.initiators[initiator].wake_generation {
                        self.initiators[initiator].session.handle_timeout(self.now);
                        self.progress(initiator)?;
                    }
                }
            }
        }
        self.steps = steps;
        for (index, initiator) in self.initiators.iter().enumerate() {
            if initiator.session.in_flight() != 0 || !self.workload_done(initiator) {
                return Err(format!(
                    "initiator {index} stopped with work left at {:?}: no event pending; {} in flight, {} pending, \
                     established {}, timeout {:?}, {:?}",
                    self.now,
                    initiator.session.in_flight(),
                    initiator.pending.len(),
                    initiator.established,
                    initiator.session.poll_timeout(),
                    initiator.session.stats()
                ));
            }
        }
        Ok(())
    }

    fn workload_done(&self, initiator: &Initiator) -> bool {
        match self.scenario.workload {
            Workload::Checked { ops } => initiator.established && initiator.finished == ops,
            Workload::Incast { duration, .. } => {
                initiator.established && self.now >= Instant::ZERO + duration && initiator.pending.is_empty()
            }
        }
    }

    /// Handles completions, submits more work, sends, and sets the timer.
    fn progress(&mut self, index: usize) -> Result<(), String> {
        if let Some(outcome) = self.initiators[index].session.poll_established() {
            outcome.map_err(|e| format!("initiator {index}: HELLO failed: {e}"))?;
            self.initiators[index].established = true;
        }
        while let Some(completion) = self.initiators[index].session.poll_completion() {
            self.complete(index, completion)?;
        }
        self.submit_work(index)?;
        self.flush(index);
        if self.workload_done(&self.initiators[index]) && self.initiators[index].session.in_flight() == 0 {
            self.finished_at = self.finished_at.max(self.now);
        }
        Ok(())
    }

    fn complete(&mut self, index: usize, completion: Completion) -> Result<(), String> {
        let now = self.now;
        let (submitted_at, kind) =
            self.initiators[index].pending.remove(&completion.token).ok_or("completion for an unknown token")?;
        self.initiators[index].finished += 1;
        if let Ok(reply) = &completion.result {
            self.rtts.push(reply.rtt.as_nanos());
        }
        let outcome = completion.result.and_then(|reply| {
            let results = reply.results()?;
            for result in &results {
                if result.status != netdam_isa::Status::Ok {
                    return Err(ClientError::Refused { opcode: result.opcode, status: result.status });
                }
            }
            Ok(results.iter().map(|result| result.data.to_vec()).collect::<Vec<_>>())
        });
        let data = match outcome {
            Ok(data) => data,
            Err(error) => {
                self.failed += 1;
                if self.failures.len() < 5 {
                    self.failures.push(format!("initiator {index} {kind:?}: {error}"));
                }
                return Ok(());
            }
        };
        self.completed += 1;
        self.latencies.push(now.saturating_since(submitted_at).as_nanos());
        match kind {
            OpKind::FetchAdd => {
                let word: [u8; 8] = data[0].as_slice().try_into().map_err(|_| "FETCH_ADD answered no word")?;
                self.fetch_add_old_values.push(u64::from_le_bytes(word));
            }
            OpKind::WriteRead { slot, stamp } => {
                let expected = slot_pattern(index, slot, stamp);
                if data[1] != expected {
                    return Err(format!("initiator {index} slot {slot}: READ after WRITE returned other bytes"));
                }
            }
            OpKind::Vadd => self.vadds += 1,
            OpKind::IncastWrite => {
                if let Workload::Incast { write_bytes, .. } = self.scenario.workload {
                    self.initiators[index].completed_bytes += write_bytes as u64;
                }
            }
        }
        Ok(())
    }

    fn submit_work(&mut self, index: usize) -> Result<(), String> {
        let now = self.now;
        let workload = self.scenario.workload;
        let initiator = &mut self.initiators[index];
        if !initiator.established {
            return Ok(());
        }
        while initiator.session.has_room() {
            let submitted = initiator.submitted;
            let (ops, kind) = match workload {
                Workload::Checked { ops } => {
                    if submitted >= ops {
                        break;
                    }
                    match submitted % 3 {
                        0 => (vec![Op::fetch_add(0, COUNTER_OFFSET, 1)], OpKind::FetchAdd),
                        1 => {
                            let slot = (submitted / 3) % SLOTS_PER_INITIATOR;
                            let offset = SLOTS_OFFSET + (index as u64 * SLOTS_PER_INITIATOR + slot) * SLOT_BYTES;
                            let pattern = slot_pattern(index, slot, submitted);
                            (
                                vec![Op::write(0, offset, &pattern), Op::read(0, offset, SLOT_BYTES as u32)],
                                OpKind::WriteRead { slot, stamp: submitted },
                            )
                        }
                        _ => {
                            let ones: Vec<u8> = (0..LANES).flat_map(|_| 1i32.to_le_bytes()).collect();
                            (vec![Op::vadd(0, LANES_OFFSET, LaneType::I32, &ones, false)], OpKind::Vadd)
                        }
                    }
                }
                Workload::Incast { write_bytes, duration } => {
                    if now >= Instant::ZERO + duration {
                        break;
                    }
                    let offset = SLOTS_OFFSET + index as u64 * INCAST_AREA_BYTES;
                    (vec![Op::write(0, offset, &vec![index as u8; write_bytes])], OpKind::IncastWrite)
                }
            };
            let token = initiator.next_token;
            initiator.session.submit(&ops, token).map_err(|e| e.to_string())?;
            initiator.next_token += 1;
            initiator.submitted += 1;
            initiator.pending.insert(token, (now, kind));
        }
        Ok(())
    }

    fn flush(&mut self, index: usize) {
        let now = self.now;
        let mut outgoing = Vec::new();
        while let Some(datagram) = self.initiators[index].session.poll_transmit(now) {
            outgoing.push(datagram.to_vec());
        }
        for bytes in outgoing {
            if let Some(departure) = self.uplinks[index].offer(now, bytes.len()) {
                self.schedule(departure.arrival, Event::SwitchToTarget { from: index, bytes });
            }
        }
        let initiator = &mut self.initiators[index];
        initiator.wake_generation += 1;
        if let Some(at) = initiator.session.poll_timeout() {
            let generation = initiator.wake_generation;
            self.schedule(at.max(now), Event::Wake { initiator: index, generation });
        }
    }

    /// The switch forwards over the bottleneck toward the target, where faults strike.
    fn switch_to_target(&mut self, from: usize, bytes: Vec<u8>) {
        let network = self.scenario.network;
        if self.rng.chance(network.loss) {
            self.injected.0 += 1;
            return;
        }
        let copies = if self.rng.chance(network.duplicate) {
            self.injected.1 += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let Some(departure) = self.to_target.offer(self.now, bytes.len()) else { continue };
            self.bottleneck_queueing.push(departure.queueing.as_nanos());
            let delay = self.reorder_delay();
            self.schedule(departure.arrival + delay, Event::AtTarget { from, bytes: bytes.clone() });
        }
    }

    fn reorder_delay(&mut self) -> Duration {
        let network = self.scenario.network;
        if self.rng.chance(network.reorder) {
            self.injected.2 += 1;
            Duration::from_nanos(self.rng.next_u64() % network.reorder_delay.as_nanos().max(1))
        } else {
            Duration::ZERO
        }
    }

    fn at_target(&mut self, from: usize, bytes: Vec<u8>) {
        if self.target.queue.len() >= self.scenario.target_queue_datagrams {
            self.target.drops += 1;
            return;
        }
        self.target.queue.push_back((self.now, from, bytes));
        if !self.target.busy {
            self.serve();
        }
    }

    fn serve(&mut self) {
        let Some((arrived, from_index, bytes)) = self.target.queue.pop_front() else { return };
        self.target.busy = true;
        let queueing = self.now.saturating_since(arrived);
        let execution = self.scenario.target_service
            + Duration::from_nanos((bytes.len() as f64 * self.scenario.target_ns_per_byte) as u64);
        let depth = self.target.queue.len().min(u16::MAX as usize) as u16;
        let target = &mut self.target;
        target.dispatcher.tick(self.now);
        // As a worker whose receive took a whole batch: more datagrams wait behind this one.
        target.dispatcher.set_backlog(usize::from(depth) + 1 >= RECEIVE_BATCH);
        let from = ReplyTo { peer: initiator_addr(from_index), ttl: RECEIVED_TTL };
        // An answer that executes nothing (BUSY, stale, no session, a replay) costs the target a
        // decode and a send, not an execution.
        let (response, spent) =
            match target.dispatcher.handle(self.now, from, Wait::queued(queueing), &bytes, &mut target.out) {
                Handled::Dropped => (None, NON_EXECUTING_ANSWER),
                Handled::Replay(len) => (Some(target.out[..len].to_vec()), NON_EXECUTING_ANSWER),
                Handled::Deferred(_) => unreachable!("the simulated target has no namespaces"),
                Handled::Answer { response, record } => {
                    let spent = if response.count() == 0 { NON_EXECUTING_ANSWER } else { execution };
                    let service = u32::try_from((queueing + spent).as_nanos()).unwrap_or(u32::MAX);
                    let len = response.finish(RECEIVED_TTL, service, depth);
                    if let Some((ticket, store)) = record {
                        target.dispatcher.record(ticket, store.then_some(&target.out[..len]));
                    }
                    (Some(target.out[..len].to_vec()), spent)
                }
            };
        self.schedule(self.now + spent, Event::TargetDone { to: from_index, response });
    }

    fn target_done(&mut self, to: usize, response: Option<Vec<u8>>) {
        if let Some(bytes) = response {
            if self.rng.chance(self.scenario.network.loss) {
                self.injected.0 += 1;
            } else if let Some(departure) = self.from_target.offer(self.now, bytes.len()) {
                let delay = self.reorder_delay();
                self.schedule(departure.arrival + delay, Event::SwitchToInitiator { to, bytes });
            }
        }
        self.target.busy = false;
        self.serve();
    }

    fn check(&self) -> Result<(), String> {
        if let Workload::Checked { .. } = self.scenario.workload {
            if self.failed > 0 {
                return Err(format!("{} operations failed: {:?}", self.failed, self.failures));
            }
            let memory = self.regions.get(0).expect("the simulator's region").memory();
            let mut counter = [0u8; 8];
            memory.read(COUNTER_OFFSET as usize, &mut counter);
            let total = self.fetch_add_old_values.len() as u64;
            if u64::from_le_bytes(counter) != total {
                return Err(format!("counter is {} after {total} FETCH_ADDs", u64::from_le_bytes(counter)));
            }
            let mut old_values = self.fetch_add_old_values.clone();
            old_values.sort_unstable();
            if old_values.iter().enumerate().any(|(index, value)| *value != index as u64) {
                return Err("FETCH_ADD old values are not 0..n each exactly once: one ran twice or was lost".into());
            }
            let mut lanes = vec![0u8; LANES * 4];
            memory.read(LANES_OFFSET as usize, &mut lanes);
            for lane in lanes.chunks_exact(4) {
                let value = i32::from_le_bytes([lane[0], lane[1], lane[2], lane[3]]);
                if value as u64 != self.vadds {
                    return Err(format!("VADD lane holds {value} after {} VADDs", self.vadds));
                }
            }
        }
        Ok(())
    }

    fn report(&self) -> Report {
        let quantile = |samples: &[u64], q: f64| -> Duration {
            if samples.is_empty() {
                return Duration::ZERO;
            }
            let mut sorted = samples.to_vec();
            sorted.sort_unstable();
            Duration::from_nanos(sorted[((sorted.len() - 1) as f64 * q).round() as usize])
        };
        let bytes: Vec<f64> = self.initiators.iter().map(|initiator| initiator.completed_bytes as f64).collect();
        let sum: f64 = bytes.iter().sum();
        let squares: f64 = bytes.iter().map(|b| b * b).sum();
        let fairness = if squares > 0.0 { sum * sum / (bytes.len() as f64 * squares) } else { 1.0 };
        let elapsed = self.finished_at.saturating_since(Instant::ZERO);
        let throughput_gbps = match self.scenario.workload {
            Workload::Incast { .. } => sum * 8.0 / elapsed.as_nanos().max(1) as f64,
            Workload::Checked { .. } => 0.0,
        };
        let sessions: Vec<_> = self.initiators.iter().map(|initiator| initiator.session.stats()).collect();
        Report {
            seed: self.scenario.seed,
            elapsed,
            steps: self.steps,
            completed: self.completed,
            failed: self.failed,
            failures: self.failures.clone(),
            latency_p50: quantile(&self.latencies, 0.5),
            latency_p99: quantile(&self.latencies, 0.99),
            rtt_p50: quantile(&self.rtts, 0.5),
            rtt_p99: quantile(&self.rtts, 0.99),
            bottleneck_queueing_p50: quantile(&self.bottleneck_queueing, 0.5),
            bottleneck_queueing_p99: quantile(&self.bottleneck_queueing, 0.99),
            bottleneck_queueing_max: Duration::from_nanos(self.bottleneck_queueing.iter().copied().max().unwrap_or(0)),
            congestion_drops: self.to_target.drops + self.from_target.drops,
            target_queue_drops: self.target.drops,
            injected: self.injected,
            retransmissions: sessions.iter().map(|s| s.retransmissions).sum(),
            busy: sessions.iter().map(|s| s.busy).sum(),
            replayed: self.target.dispatcher.stats().get(netdam_target::stats::Counter::DuplicatesReplayed),
            throughput_gbps,
            fairness,
        }
    }
}

/// What initiator `initiator` writes into `slot` for operation `stamp`.
fn slot_pattern(initiator: usize, slot: u64, stamp: u64) -> Vec<u8> {
    let seed = (initiator as u64) << 48 ^ slot << 32 ^ stamp;
    (0..SLOT_BYTES)
        .map(|index| (seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(index as u32) >> 56) as u8)
        .collect()
}
