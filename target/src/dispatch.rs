//! What a worker does with one datagram, apart from the socket: decode, execute every
//! instruction in order, and write the response. Sans-IO: it takes bytes and writes bytes, so
//! tests and the simulator drive it without a network.
//!
//! Datagrams that cannot be attributed (too short, wrong magic, bad CRC, a response) are dropped
//! and counted; a readable datagram that breaks the framing gets a datagram-level status; every
//! instruction of a well-framed request gets its own status, and a failed instruction does not
//! stop the ones after it.

use std::net::SocketAddr;
use std::sync::Arc;

use netdam_auth::HelloAuth;
use netdam_isa::block::{encode_extents, BlockOp, Extent};
use netdam_isa::control::{
    decode_hello_auth, decode_hello_operand, encode_hello_answer, encode_session_limit, HelloRequest, NamespaceEntry,
    SessionLimitKind, StatWriter, COOKIE_LEN, HELLO_AUTH_ENCRYPT, HELLO_AUTH_LEN, HELLO_AUTH_MAC, HELLO_AUTH_NONE,
    SESSION_LIMIT_DETAIL_LEN, TARGET_FLAG_FPGA,
};
use netdam_isa::engine::Engine;
use netdam_isa::extension::{ExtensionRegistry, Permissions, EXTENSION_OPCODES};
use netdam_isa::limits::{
    DEFAULT_DATAGRAM_BYTES, DEFAULT_SESSIONS_PER_ADDRESS, DEFAULT_SESSIONS_PER_WORKER, DEFAULT_SESSION_IDLE_TIMEOUT,
    IN_PROGRESS_NOTICE_INTERVAL, IN_PROGRESS_SCAN_INTERVAL, MAX_BLOCK_STATUS_EXTENTS, MAX_CRYPTO_BYTES,
    MAX_INSTRUCTIONS_PER_DATAGRAM, MIN_DATAGRAM_BYTES, SESSION_SWEEP_INTERVAL, SESSION_SWEEP_SLOTS,
};
use netdam_isa::wire::{
    peek_is_encrypted, peek_is_response, peek_is_sealed, peek_session_sequence, DecodeError, Disposition, Instruction,
    Request, ResponseWriter, HEADER_LEN, MAGIC, RESPONSE_INSTRUCTION_HEADER_LEN,
};
use netdam_isa::{Duration, Instant, Opcode, Status};
use netdam_nvme::{BlockDevice, BlockRequest, BufferIndex, ImmediateRequest};
use netdam_pmem::Durability;

use crate::block::{self, BlockPath, Pending, ReplyTo, RunEntry};
use crate::cookies::{CookieJar, CookieRefusal};
use crate::crypto::KeyRing;
use crate::fpga_engine::EngineState;
use crate::namespaces::NamespaceTable;
use crate::overload::StandingQueue;
use crate::qos::{Shed, UsageTable};
use crate::regions::RegionTable;
use crate::sessions::{Admission, OpenRefusal, RecordTicket, SessionAuth, SessionLimits, SessionTable};
use crate::stats::{Counter, WorkerStats, STATUS_COUNTER_PREFIX};
use crate::tenants::{Grant, QosClass, Tenant, TenantCell, TenantSnapshot};

/// STAT entries that describe the target rather than count events.
pub const TARGET_STAT_ENTRIES: usize = 7;

/// How often at most a worker logs that it refuses HELLOs (with the count since its last line).
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_millis(10_000);

/// How long a datagram waited at the target before it started executing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Wait {
    /// All of it, from the kernel's receipt: part of the service time its answer reports.
    pub total: Duration,
    /// The part spent behind other work (PROTOCOL.md): the queueing its answer reports, what
    /// the endpoint window reacts to and what BUSY judges. The rest is the worker waking up or
    /// getting its core back.
    pub queueing: Duration,
}

impl Wait {
    /// A wait spent entirely behind other work.
    pub fn queued(queueing: Duration) -> Wait {
        Wait { total: queueing, queueing }
    }
}

/// A HELLO whose proof checked out: what the session's keys are derived from once the session
/// has its id.
struct Proven {
    area: HelloAuth,
    key: netdam_auth::TenantKey,
    key_version: u32,
    encrypt: bool,
}

/// Which session's keys seal an answer, once it is finished: it is sealed only if that
/// session (of that sender) still exists then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SealFor {
    /// The session.
    pub session: u32,
    /// Its sender.
    pub peer: SocketAddr,
}

/// The settings a worker's dispatcher applies, from the validated configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DispatchSettings {
    /// Largest datagram received or sent.
    pub max_datagram_bytes: usize,
    /// A request that queued longer than this, while requests have kept queuing that long for as
    /// long again and at least four receive batches of them executed late, is answered BUSY
    /// instead of executed (a standing queue, see `overload`).
    pub busy_threshold: Duration,
    /// Session table size, share per address and idle timeout.
    pub sessions: SessionLimits,
    /// Record the per-opcode counters and latency histograms `/metrics` serves (the STAT
    /// counters are always kept).
    pub metrics: bool,
    /// What every session may do (until tenants exist): extension instructions needing more
    /// are answered `permission_denied`.
    pub session_permissions: Permissions,
    /// Sessions must be opened by a tenant's authenticated HELLO, and every datagram of a
    /// session carries a MAC (`auth = "tenants"`).
    pub auth_required: bool,
}

impl Default for DispatchSettings {
    fn default() -> DispatchSettings {
        DispatchSettings {
            max_datagram_bytes: DEFAULT_DATAGRAM_BYTES,
            busy_threshold: Duration::from_millis(1),
            sessions: SessionLimits {
                slots: DEFAULT_SESSIONS_PER_WORKER,
                per_address: DEFAULT_SESSIONS_PER_ADDRESS,
                idle_timeout: DEFAULT_SESSION_IDLE_TIMEOUT,
            },
            metrics: true,
            session_permissions: Permissions::ALL,
            auth_required: false,
        }
    }
}

/// State every worker of one target shares; read-mostly.
#[derive(Debug)]
pub struct Shared {
    /// The regions served.
    pub regions: Arc<RegionTable>,
    /// The block namespaces served.
    pub namespaces: Arc<NamespaceTable>,
    /// Each worker's counters, by worker index.
    pub stats: Arc<[WorkerStats]>,
    /// What every dispatcher applies.
    pub settings: DispatchSettings,
    /// Distinguishes this run's session ids from an earlier run's (e.g. the start time).
    pub epoch: u64,
    /// Issues and checks HELLO cookies; one secret for every worker, so a cookie one worker
    /// issued is valid at the others (all workers read one clock, see `worker`).
    pub cookies: CookieJar,
    /// The extension instructions served (none unless configured).
    pub extensions: ExtensionRegistry,
    /// The key slots of ENCRYPT and DECRYPT (none unless created with `crypto-key create`).
    pub keys: Arc<KeyRing>,
    /// The tenants in force, replaced whole when the metadata store changes.
    pub tenants: Arc<TenantCell>,
    /// Each tenant's sessions, block I/O in flight, token bucket and shed counts.
    pub usage: Arc<UsageTable>,
    /// Which engine executes now (STAT `engine_fpga`, HELLO's target flags, `/metrics`).
    pub engine: Arc<EngineState>,
}

impl Shared {
    /// State for `workers` workers over `regions` and `namespaces`.
    pub fn new(
        regions: Arc<RegionTable>,
        namespaces: Arc<NamespaceTable>,
        workers: usize,
        settings: DispatchSettings,
        epoch: u64,
        cookies: CookieJar,
    ) -> Shared {
        let stats = (0..workers).map(|_| WorkerStats::default()).collect();
        Shared {
            regions,
            namespaces,
            stats,
            settings,
            epoch,
            cookies,
            extensions: ExtensionRegistry::new(),
            engine: Arc::new(EngineState::software()),
            tenants: Arc::new(TenantCell::default()),
            keys: Arc::new(KeyRing::default()),
            usage: Arc::new(UsageTable::default()),
        }
    }

    /// The same state serving the key slots of `keys`.
    pub fn with_keys(self, keys: Arc<KeyRing>) -> Shared {
        Shared { keys, ..self }
    }

    /// The same state applying the tenants of `cell`.
    pub fn with_tenants(self, cell: Arc<TenantCell>) -> Shared {
        Shared { tenants: cell, ..self }
    }

    /// The same state reporting the engine through `state`.
    pub fn with_engine(self, state: Arc<EngineState>) -> Shared {
        Shared { engine: state, ..self }
    }

    /// The same state serving the extensions of `registry`.
    pub fn with_extensions(self, registry: ExtensionRegistry) -> Shared {
        Shared { extensions: registry, ..self }
    }
}

/// Who sent the datagram being executed, and in which session: what control instructions need.
#[derive(Debug, Clone, Copy)]
struct Context {
    from: SocketAddr,
    session: u32,
    /// Bytes of the request: without a session, no answer may be longer (no amplification).
    request_len: usize,
}

/// Rate limit of the log lines about refused HELLOs.
#[derive(Debug, Default)]
struct RefusalLog {
    last_line: Option<Instant>,
    refused_since: u64,
}

/// What to do with a handled datagram.
#[derive(Debug)]
pub enum Handled<'b> {
    /// Nothing to send (dropped and counted).
    Dropped,
    /// Send this response once finished; then `record` it if a ticket is given.
    Answer {
        /// The response, to be finished with TTL, service time and queue depth.
        response: ResponseWriter<'b>,
        /// Where to record the executed request, and whether its answer must be stored.
        record: Option<(RecordTicket, bool)>,
    },
    /// Send the first `len` bytes of `out` as they are: a stored answer replayed.
    Replay(usize),
    /// Waiting for block I/O in this slot: the driver sends the answer when
    /// [`Dispatcher::poll_block`] hands it over.
    Deferred(u16),
}

/// One worker's datagram handler.
#[derive(Debug)]
pub struct Dispatcher<E> {
    engine: E,
    shared: Arc<Shared>,
    worker: usize,
    sessions: SessionTable,
    block: BlockPath,
    /// When the expiry sweep last looked at a share of the session table.
    last_sweep: Instant,
    /// When `poll_block` next looks for requests due an in-progress notice.
    next_notice_scan: Instant,
    /// Issue time of the last cookie: each new one is later, so no two HELLOs get the same.
    last_cookie: Instant,
    refusals: RefusalLog,
    /// Group commit is on for the receive pass under way (see [`Dispatcher::set_group_commit`]).
    group_commit: bool,
    /// Opcode of the first instruction of the datagram last handled: the datagram's label in the
    /// latency histograms.
    current_opcode: u8,
    /// Whether the per-opcode metrics are recorded.
    metrics: bool,
    /// Whether requests that queued past the BUSY threshold form a standing queue.
    overload: StandingQueue,
    /// Where ENCRYPT and DECRYPT seal and open, [`MAX_CRYPTO_BYTES`] allocated at start.
    crypto_scratch: Box<[u8]>,
    /// The same test at a quarter of the threshold: best-effort tenants are shed there first.
    overload_best_effort: StandingQueue,
    /// The tenants this worker applies, and the generation of the cell they came from.
    tenants: Arc<TenantSnapshot>,
    tenants_generation: u64,
    /// Tenant of the session whose datagram is executing (`None`: unauthenticated target).
    current_tenant: Option<u32>,
    /// The session whose keys seal the answer of the datagram last handled, if any.
    pending_seal: Option<SealFor>,
    /// Where an encrypted request is decrypted (the largest datagram), allocated once.
    plaintext: Box<[u8]>,
    /// The session an authenticated HELLO of the datagram under way opened: its answer's header
    /// names it.
    hello_session: Option<u32>,
}

impl<E: Engine> Dispatcher<E> {
    /// The handler of worker `worker`, executing memory instructions with `engine` and block
    /// instructions on `devices` (this worker's, by namespace id).
    pub fn new(engine: E, shared: Arc<Shared>, worker: usize, devices: Vec<Box<dyn BlockDevice>>) -> Dispatcher<E> {
        assert!(worker < shared.stats.len(), "worker index beyond the stats table");
        let sessions =
            SessionTable::new(worker, shared.epoch, shared.settings.sessions).with_usage(shared.usage.clone());
        let block = BlockPath::new(devices, shared.settings.max_datagram_bytes);
        let plaintext = vec![0u8; shared.settings.max_datagram_bytes].into_boxed_slice();
        let metrics = shared.settings.metrics;
        // A queue over the threshold for as long again, with four batches executed late, is
        // standing (see `overload`).
        let busy = shared.settings.busy_threshold;
        let overload = StandingQueue::new(busy, busy, crate::overload::MIN_STANDING_REQUESTS);
        // Best-effort tenants yield early, to whatever made requests queue: no count.
        let early = Duration::from_nanos(busy.as_nanos() / 4);
        let overload_best_effort = StandingQueue::new(early, early, 0);
        Dispatcher {
            engine,
            shared,
            worker,
            sessions,
            block,
            last_sweep: Instant::ZERO,
            next_notice_scan: Instant::ZERO,
            last_cookie: Instant::ZERO,
            refusals: RefusalLog::default(),
            group_commit: false,
            current_opcode: 0,
            metrics,
            overload,
            crypto_scratch: vec![0u8; MAX_CRYPTO_BYTES].into_boxed_slice(),
            overload_best_effort,
            tenants: Arc::new(TenantSnapshot::default()),
            tenants_generation: 0,
            current_tenant: None,
            pending_seal: None,
            plaintext,
            hello_session: None,
        }
    }

    /// This worker's counters.
    pub fn stats(&self) -> &WorkerStats {
        &self.shared.stats[self.worker]
    }

    /// Every worker's counters, shared (this worker's are at [`Dispatcher::worker_index`]).
    pub fn all_stats(&self) -> Arc<[WorkerStats]> {
        self.shared.stats.clone()
    }

    /// Which worker this dispatcher serves.
    pub fn worker_index(&self) -> usize {
        self.worker
    }

    /// Ends sessions silent past their timeout, a bounded share of the table at a time, and
    /// those of a deleted tenant or a rotated key though they send nothing (else they counted as
    /// open until their next datagram); the driver calls it every loop pass (it does nothing
    /// until the sweep interval has passed).
    pub fn tick(&mut self, now: Instant) {
        let elapsed = now.saturating_since(self.last_sweep);
        if elapsed < SESSION_SWEEP_INTERVAL {
            return;
        }
        self.refresh_tenants();
        // A worker that slept (blocking or adaptive polling) catches up: as many slots as the
        // time since the last sweep calls for, at most the whole table.
        let intervals = elapsed.as_nanos() / SESSION_SWEEP_INTERVAL.as_nanos();
        let slots = usize::try_from(intervals).unwrap_or(usize::MAX).saturating_mul(SESSION_SWEEP_SLOTS);
        self.last_sweep = now;
        let expired = self.sessions.expire(now, slots);
        if expired > 0 {
            self.stats().add(Counter::SessionsExpired, expired);
        }
    }

    /// Takes the tenants in force if the store changed since the last datagram: one atomic load
    /// per datagram; the lock and the sweep only on a change. Sessions whose tenant was deleted
    /// or whose key was rotated end here; revoked grants apply from the next instruction, since
    /// every instruction looks its grant up in the snapshot.
    fn refresh_tenants(&mut self) {
        let cell = &self.shared.tenants;
        if cell.generation() == self.tenants_generation {
            return;
        }
        let (generation, snapshot) = cell.load();
        self.tenants = snapshot;
        self.tenants_generation = generation;
        let tenants = &self.tenants;
        let ended = self.sessions.end_sessions_where(|auth| {
            tenants.tenant(auth.tenant).is_none_or(|tenant| tenant.key_version != auth.key_version)
        });
        if ended > 0 {
            // Also counted as expired, so `sessions_open` stays opened minus ended.
            self.stats().add(Counter::SessionsEndedByTenantChange, ended);
            self.stats().add(Counter::SessionsExpired, ended);
            tracing::info!(
                worker = self.worker,
                ended,
                "ended sessions whose tenant was deleted or whose key was rotated"
            );
        }
    }

    /// Whether the session's tenant must be answered BUSY for this datagram, and the wait to
    /// hint: a best-effort tenant as soon as requests start to queue (a quarter of the BUSY
    /// threshold, standing as long), any tenant whose token bucket cannot pay the datagram's
    /// cost. Latency-critical tenants are shed only by the standing queue all requests face.
    fn shed_for_tenant(&mut self, now: Instant, queueing: Duration, request: &Request<'_>) -> Option<(Shed, Duration)> {
        let id = self.current_tenant?;
        let tenant = self.tenants.tenant(id)?;
        if tenant.class == QosClass::BestEffort && self.overload_best_effort.is_standing(now, queueing) {
            return Some((Shed::Overload, queueing));
        }
        let shapes = &self.block.shapes;
        let block_bytes = |space: u16| shapes.get(usize::from(space)).map_or(1, |shape| u64::from(shape.block_bytes));
        let cost = crate::qos::cost(request.instructions(), block_bytes);
        match self.shared.usage.get(id).take(now.as_nanos(), cost, &tenant.limits) {
            Ok(()) => None,
            Err(wait_ns) => Some((Shed::Rate, Duration::from_nanos(wait_ns))),
        }
    }

    /// Whether the answer of the datagram just handled will be sealed (finish it with
    /// `finish_sealed`: no CRC).
    pub fn will_seal(&self) -> bool {
        self.pending_seal.is_some()
    }

    /// Which session's keys seal the answer of the datagram just handled (taken once); the
    /// driver passes it to [`Dispatcher::seal`] when the answer is finished.
    pub fn take_seal(&mut self) -> Option<SealFor> {
        self.pending_seal.take()
    }

    /// Seals the finished answer `buffer[..len]` for `seal`'s session: returns the sealed
    /// length, or `None` if the session ended meanwhile (the answer is then not sent; the
    /// initiator's retransmission learns `no_session`). `buffer` has room for the trailer: an
    /// answer to be sealed is built `TRAILER_BYTES` short of it.
    pub fn seal(&mut self, seal: SealFor, buffer: &mut [u8], len: usize) -> Option<usize> {
        self.sessions.seal(seal.session, seal.peer, buffer, len)
    }

    /// Handles one datagram from `from` whose execution starts at `now` after it waited as
    /// `wait` says. `out` must be `max_datagram_bytes` long.
    pub fn handle<'b>(
        &mut self,
        now: Instant,
        from: ReplyTo,
        wait: Wait,
        datagram: &[u8],
        out: &'b mut [u8],
    ) -> Handled<'b> {
        self.stats().add(Counter::DatagramsReceived, 1);
        self.pending_seal = None;
        self.current_tenant = None;
        // Answering a response could start a loop between two targets. Without the magic it is
        // no one's response, whatever its flags say: foreign bytes, dropped as bad magic below.
        if peek_is_response(datagram) && datagram.starts_with(&MAGIC) {
            self.stats().add(Counter::DroppedNotRequest, 1);
            return Handled::Dropped;
        }
        self.refresh_tenants();
        // A sealed datagram is opened (its MAC checked) before anything else reads it: what
        // fails the check is dropped unanswered, since nothing proves who sent it.
        // `room`: how much of `out` the answer may fill; a sealed one leaves room for its trailer.
        let (datagram, room) = if peek_is_sealed(datagram) {
            let Some((session, sequence)) = peek_session_sequence(datagram) else {
                let counter =
                    if datagram.len() < HEADER_LEN { Counter::DroppedTooShort } else { Counter::DroppedBadMagic };
                self.count(counter);
                return Handled::Dropped;
            };
            let auth = match self.sessions.auth(session, from.peer) {
                Some(Some(auth)) => auth,
                // Not (or no longer) a session of this sender: it says HELLO again.
                None => return self.datagram_status(out, session, sequence, Status::NoSession),
                Some(None) => {
                    self.count(Counter::DroppedBadMac);
                    return Handled::Dropped;
                }
            };
            if peek_is_encrypted(datagram) != auth.encrypt {
                // Encrypted in a session that did not ask for it, or the other way round.
                self.count(Counter::DroppedBadMac);
                return Handled::Dropped;
            }
            let tenant = auth.tenant;
            let room = out.len() - netdam_auth::TRAILER_BYTES;
            if auth.encrypt {
                // Decrypted (which checks the tag) into the dispatcher's own buffer, taken out
                // while the request runs so the dispatcher stays free to use.
                if datagram.len() > self.plaintext.len() {
                    self.count(Counter::DroppedOversized);
                    return Handled::Dropped;
                }
                let mut plain = std::mem::take(&mut self.plaintext);
                plain[..datagram.len()].copy_from_slice(datagram);
                let opened = netdam_auth::trailer::open_encrypted(&auth.keys.request, &mut plain[..datagram.len()]);
                let handled = match opened {
                    Ok(len) => {
                        self.current_tenant = Some(tenant);
                        self.pending_seal = Some(SealFor { session, peer: from.peer });
                        self.handle_request(now, from, wait, &plain[..len], out, room)
                    }
                    Err(_) => {
                        self.count(Counter::DroppedBadMac);
                        Handled::Dropped
                    }
                };
                self.plaintext = plain;
                return handled;
            }
            let Ok(len) = netdam_auth::trailer::open(&auth.keys.request, datagram) else {
                self.count(Counter::DroppedBadMac);
                return Handled::Dropped;
            };
            self.current_tenant = Some(tenant);
            self.pending_seal = Some(SealFor { session, peer: from.peer });
            (&datagram[..len], room)
        } else {
            if let Some((session, _)) = peek_session_sequence(datagram) {
                if session != 0 && matches!(self.sessions.auth(session, from.peer), Some(Some(_))) {
                    // An authenticated session's datagrams all carry its MAC.
                    self.count(Counter::DroppedUnsealed);
                    return Handled::Dropped;
                }
            }
            (datagram, out.len())
        };
        self.handle_request(now, from, wait, datagram, out, room)
    }

    /// Handles a request datagram that is plain or has been opened (its MAC checked, its body
    /// decrypted, its trailer cut): from framing on.
    fn handle_request<'b>(
        &mut self,
        now: Instant,
        from: ReplyTo,
        wait: Wait,
        datagram: &[u8],
        out: &'b mut [u8],
        room: usize,
    ) -> Handled<'b> {
        let queueing = wait.queueing;
        let parsed =
            if self.current_tenant.is_some() { Request::parse_opened(datagram) } else { Request::parse(datagram) };
        let request = match parsed {
            Ok(request) => request,
            Err(error) => return self.refuse(datagram, error, &mut out[..room]),
        };
        let header = request.header;
        let queueing_us = queueing_field(queueing);
        self.current_opcode = request.instructions().next().map_or(0, |instruction| instruction.opcode);
        if self.metrics {
            self.stats().opcode(self.current_opcode).queueing.record_ns(queueing.as_nanos());
        }
        if self.overload.is_standing(now, queueing) {
            // Overloaded: the queue is the problem, so do not add to it. The initiator waits about
            // as long as this request waited, then retries; nothing was executed. A backlog that
            // only waited out a pause of the worker executes (`overload`).
            self.count(Counter::AnsweredBusy);
            return busy(&mut out[..room], header.session, header.sequence, queueing_us);
        }
        if let Some((reason, hint)) = self.shed_for_tenant(now, queueing, &request) {
            // The tenant's share is spent, or it is best-effort and requests queue: nothing
            // executes, and the initiator waits `hint` before trying again.
            let tenant = self.current_tenant.unwrap_or(0);
            self.shared.usage.get(tenant).count_shed(reason);
            self.count(reason.busy_counter());
            return busy(&mut out[..room], header.session, header.sequence, queueing_field(hint));
        }
        let mut record = None;
        if header.session != 0 {
            let extensions = &self.shared.extensions;
            let authenticated = self.current_tenant.is_some();
            let idempotent = request.instructions().all(|instruction| {
                if authenticated {
                    // A captured request replayed later must not run again once others have
                    // changed what it changed (a WRITE replayed after a newer WRITE would undo
                    // it): in an authenticated session only what changes nothing runs twice;
                    // every other answer is stored and replayed, never re-executed.
                    return changes_nothing(instruction.opcode);
                }
                // An extension's declaration decides; an unknown opcode counts as not idempotent.
                extensions.is_idempotent(instruction.opcode).unwrap_or_else(|| instruction.is_idempotent())
            });
            match self.sessions.admit(now, header.session, from.peer, header.sequence, idempotent, out) {
                Admission::Execute(ticket) => {
                    // A first execution: it counts toward a standing queue (a resent copy does not).
                    self.overload.executed(queueing);
                    record = Some((ticket, !idempotent));
                }
                Admission::ExecuteAgain => self.count(Counter::DuplicatesExecutedAgain),
                Admission::Replay(len) => {
                    self.count(Counter::DuplicatesReplayed);
                    // Stored as sent, sealed already: the same bytes go out again (into the whole
                    // of `out`: a stored sealed answer may fill it, trailer included).
                    self.pending_seal = None;
                    return Handled::Replay(len);
                }
                Admission::Stale => {
                    return self.datagram_status(&mut out[..room], header.session, header.sequence, Status::Stale)
                }
                Admission::InProgress => {
                    // Its answer is on the way: the initiator is told so, and waits for it
                    // instead of resending again (PROTOCOL.md, "In-progress notices").
                    return self.datagram_status(&mut out[..room], header.session, header.sequence, Status::InProgress);
                }
                Admission::UnknownSession => {
                    // Not this sender's session (or no longer anyone's): a CLOSE ends nothing.
                    self.count_closes_ignored(&request);
                    return self.datagram_status(&mut out[..room], header.session, header.sequence, Status::NoSession);
                }
            }
        } else if !request.instructions().all(|instruction| is_sessionless(instruction.opcode)) {
            // Without a session only HELLO, PING and STAT: anything else needs the replay window.
            self.count_closes_ignored(&request);
            return self.datagram_status(&mut out[..room], 0, header.sequence, Status::NoSession);
        } else if self.shared.settings.auth_required
            && request.instructions().any(|instruction| instruction.opcode == Opcode::Stat as u8)
        {
            // The counters are the target's business: an authenticated session with `admin`.
            return self.datagram_status(&mut out[..room], 0, header.sequence, Status::Unauthenticated);
        }
        let context = Context { from: from.peer, session: header.session, request_len: datagram.len() };
        let serves_blocks = !self.block.devices.is_empty();
        // Block instructions on a device that must be waited for (a disk) defer the datagram;
        // on one that completes at once (a memory region) they run here, like memory
        // instructions, and the answer leaves in this pass (docs/DECISIONS.md). A namespace the
        // FPGA engine holds (or has fenced) takes the queued path, which knows the engine.
        let waits = |instruction: &Instruction<'_>| {
            is_block(instruction.opcode)
                && (!self.block.completes_at_once(instruction.space) || self.engine_holds(instruction.space))
        };
        if serves_blocks && request.instructions().any(|instruction| waits(&instruction)) {
            return self.defer(now, from, wait, datagram, record, &mut out[..room]);
        }
        let mut response = ResponseWriter::new(&mut out[..room], header.session, header.sequence);
        response.set_queueing_us(queueing_us);
        for instruction in request.instructions() {
            if serves_blocks && is_block(instruction.opcode) {
                self.execute_block_now(&instruction, &mut response);
            } else {
                self.execute_into(now, context, &instruction, &mut response);
            }
        }
        if let Some(session) = self.hello_session.take() {
            response.set_session(session);
        }
        self.stats().add(Counter::InstructionsExecuted, u64::from(response.count()));
        Handled::Answer { response, record }
    }

    /// Counts the CLOSEs of a datagram refused as a whole (no session of this sender's).
    fn count_closes_ignored(&self, request: &Request<'_>) {
        let closes = request.instructions().filter(|instruction| instruction.opcode == Opcode::Close as u8).count();
        self.stats().add(Counter::ClosesIgnored, closes as u64);
    }

    /// Executes one memory or control instruction and writes its result.
    fn execute_into(
        &mut self,
        now: Instant,
        context: Context,
        instruction: &Instruction<'_>,
        response: &mut ResponseWriter<'_>,
    ) {
        let mut capacity = response.data_capacity();
        if context.session == 0 {
            // Without a session the sender's address is unproven: the whole answer stays within
            // the request's length, so a forged source gains no amplification. (Only a STAT can
            // reach this bound; a HELLO that opens a session has proven its address.)
            let within_request =
                context.request_len.saturating_sub(response.encoded_len() + RESPONSE_INSTRUCTION_HEADER_LEN);
            if instruction.opcode != Opcode::Hello as u8 {
                capacity = capacity.min(within_request);
            }
        }
        let data = &mut response.data_area()[..capacity];
        let (status, data_len) = if instruction.opcode == Opcode::Hello as u8 && context.session != 0 {
            // HELLO opens a session; sent in one it would seal its answer with the new one's keys.
            (Status::Malformed, 0)
        } else if instruction.opcode == Opcode::Hello as u8 {
            self.hello(now, context, instruction, data)
        } else {
            match self.execute(context, instruction, data) {
                Ok(data_len) => (Status::Ok, data_len),
                Err(status) => (status, 0),
            }
        };
        self.stats().count_status(status);
        if self.metrics {
            let record = self.stats().opcode(instruction.opcode);
            record.instructions.add(1);
            record.bytes_received.add(instruction.operand.len() as u64);
            record.bytes_sent.add(data_len as u64);
        }
        response.commit(instruction.opcode, status, data_len);
    }

    /// Takes a datagram with block instructions into a pending slot and starts executing it.
    fn defer<'b>(
        &mut self,
        now: Instant,
        from: ReplyTo,
        wait: Wait,
        datagram: &[u8],
        record: Option<(RecordTicket, bool)>,
        out: &'b mut [u8],
    ) -> Handled<'b> {
        let (session, sequence) = peek_session_sequence(datagram).expect("a parsed request has a header");
        let queueing_us = queueing_field(wait.queueing);
        if let Some(id) = self.current_tenant {
            let max = self.tenants.tenant(id).map_or(0, |tenant| tenant.limits.max_in_flight);
            if !self.shared.usage.get(id).start_in_flight(max) {
                // The tenant's share of the target's block slots is taken; nothing executed.
                self.shared.usage.get(id).count_shed(Shed::InFlight);
                self.count(Shed::InFlight.busy_counter());
                return busy(out, session, sequence, queueing_us);
            }
        }
        let Some(slot) = self.block.free_slots.pop() else {
            if let Some(id) = self.current_tenant {
                self.shared.usage.get(id).end_in_flight();
            }
            // Nothing was executed: the initiator backs off and sends it again.
            self.count(Counter::BusyBlockSlotsFull);
            return busy(out, session, sequence, queueing_us);
        };
        self.count(Counter::BlockDatagramsDeferred);
        if let Some((ticket, _)) = record {
            self.sessions.mark_in_progress(ticket);
        }
        let pending = &mut self.block.slots[usize::from(slot)];
        pending.request[..datagram.len()].copy_from_slice(datagram);
        pending.request_len = datagram.len();
        pending.seal = self.pending_seal.take();
        pending.tenant = self.current_tenant;
        pending.room = pending.response.len() - if pending.seal.is_some() { netdam_auth::TRAILER_BYTES } else { 0 };
        let room = pending.room;
        let mut response = ResponseWriter::new(&mut pending.response[..room], session, sequence);
        response.set_queueing_us(queueing_us);
        pending.progress = Some(response.suspend());
        pending.next_instruction = 0;
        pending.run_len = 0;
        pending.outstanding = 0;
        pending.record = record;
        pending.reply_to = Some(from);
        pending.waited = wait.total;
        pending.started = now;
        pending.notice_due = Some(now + IN_PROGRESS_NOTICE_INTERVAL);
        pending.opcode = self.current_opcode;
        // A deferred datagram's answer leaves on its own, after block I/O: its memory writes
        // are persisted at once, not with the pass's group commit.
        self.engine.set_group_commit(false);
        self.advance(now, slot);
        self.engine.set_group_commit(self.group_commit);
        Handled::Deferred(slot)
    }

    /// Keeps the kernel's helper threads for this worker's block devices on `cpus` (called from
    /// the worker's thread once it is pinned).
    pub fn place_block_helpers(&mut self, cpus: &[usize]) {
        for device in &mut self.block.devices {
            if let Err(error) = device.place_helpers(cpus) {
                tracing::warn!(worker = self.worker, %error, "cannot place io_uring helper threads");
            }
        }
    }

    /// Whether the datagrams of the receive pass under way have a backlog behind them (the
    /// pass took a whole batch): without one, BUSY would shed nothing (see `overload`).
    pub fn set_backlog(&mut self, backlog: bool) {
        self.overload.set_backlog(backlog);
        self.overload_best_effort.set_backlog(backlog);
    }

    /// Group commit for one receive pass (see [`Engine::set_group_commit`]).
    pub fn set_group_commit(&mut self, on: bool) {
        self.group_commit = on;
        self.engine.set_group_commit(on);
    }

    /// Whether writes of this pass are not yet durable: answers must wait for
    /// [`Dispatcher::persist_pending`].
    pub fn persist_is_pending(&self) -> bool {
        self.engine.persist_is_pending()
    }

    /// Makes the pass's writes durable; on `Err` the answers held for them must not be sent as
    /// they are.
    pub fn persist_pending(&mut self) -> Result<(), Status> {
        self.engine.persist_pending()
    }

    /// Datagrams waiting for block I/O (or to be sent): while any are, the driver must keep
    /// calling [`Dispatcher::poll_block`] rather than sleep.
    pub fn block_pending(&self) -> usize {
        self.block.pending()
    }

    /// Reaps block completions, continues the datagrams they complete, and hands each finished
    /// answer to `send` with where it goes; returns how many were handed over.
    ///
    /// `clock` is read again for each answer: its service time must run until it is handed
    /// over, since the answers of one pass leave one after another (a loopback send takes
    /// microseconds) and an answer stamped at the start of the pass would show its wait behind
    /// the others' sends as network delay, which shrinks the initiator's fabric window.
    pub fn poll_block(&mut self, clock: &dyn Fn() -> Instant, send: &mut dyn FnMut(ReplyTo, &[u8])) -> usize {
        if self.block.pending() == 0 {
            return 0;
        }
        let now = clock();
        self.block.reap(&self.shared.stats[self.worker].block_completed);
        while let Some(slot) = self.block.ready.pop() {
            let mut pending = std::mem::take(&mut self.block.slots[usize::from(slot)]);
            self.write_run_results(&mut pending);
            self.block.slots[usize::from(slot)] = pending;
            self.advance(now, slot);
        }
        let mut sent = 0;
        while let Some(slot) = self.block.finished.pop() {
            let mut pending = std::mem::take(&mut self.block.slots[usize::from(slot)]);
            pending.notice_due = None;
            let progress = pending.progress.take().expect("a finished answer has its progress");
            if let Some(id) = pending.tenant {
                self.shared.usage.get(id).end_in_flight();
            }
            let held = pending.held_for(clock());
            let response = ResponseWriter::resume(&mut pending.response[..pending.room], progress);
            let count = response.count();
            let service_time_ns = u32::try_from(held.as_nanos()).unwrap_or(u32::MAX);
            let depth = u16::try_from(self.block.pending() - 1).unwrap_or(u16::MAX);
            let reply_to = pending.reply_to.expect("defer recorded where the answer goes");
            let mut len = if pending.seal.is_some() {
                response.finish_sealed(reply_to.ttl, service_time_ns, depth)
            } else {
                response.finish(reply_to.ttl, service_time_ns, depth)
            };
            self.stats().add(Counter::InstructionsExecuted, u64::from(count));
            self.observe_service(pending.opcode, held);
            if let Some(seal) = pending.seal.take() {
                match self.sessions.seal(seal.session, seal.peer, &mut pending.response, len) {
                    Some(sealed) => len = sealed,
                    None => {
                        // The session ended while its I/O ran: nobody can check this answer.
                        self.block.slots[usize::from(slot)] = pending;
                        self.block.free_slots.push(slot);
                        continue;
                    }
                }
            }
            if let Some((ticket, store)) = pending.record.take() {
                self.sessions.record(ticket, store.then_some(&pending.response[..len]));
            }
            // Counted before the send, like every answer (see the worker).
            self.count(Counter::ResponsesSent);
            send(reply_to, &pending.response[..len]);
            sent += 1;
            self.block.slots[usize::from(slot)] = pending;
            self.block.free_slots.push(slot);
        }
        if now >= self.next_notice_scan {
            self.next_notice_scan = now + IN_PROGRESS_SCAN_INTERVAL;
            self.send_in_progress_notices(now, send);
        }
        sent
    }

    /// Tells the initiator of each datagram that has waited `IN_PROGRESS_NOTICE_INTERVAL` for its
    /// block I/O since it started (or since its last notice) that it is still executing: a
    /// header-only datagram with status `in_progress` (PROTOCOL.md, "In-progress notices"). A slow
    /// device (a disk stalling for tens of milliseconds) then makes initiators wait, not resend
    /// requests the target still holds, and their congestion control count no loss.
    fn send_in_progress_notices(&mut self, now: Instant, send: &mut dyn FnMut(ReplyTo, &[u8])) {
        let mut notice = [0u8; HEADER_LEN + netdam_auth::TRAILER_BYTES];
        for slot in 0..self.block.slots.len() {
            let pending = &mut self.block.slots[slot];
            let (Some(due), Some(reply_to)) = (pending.notice_due, pending.reply_to) else {
                continue;
            };
            if now < due {
                continue;
            }
            pending.notice_due = Some(now + IN_PROGRESS_NOTICE_INTERVAL);
            let Some((session, sequence)) = peek_session_sequence(&pending.request[..pending.request_len]) else {
                continue;
            };
            let held = pending.held_for(now);
            let service_time_ns = u32::try_from(held.as_nanos()).unwrap_or(u32::MAX);
            let seal = pending.seal;
            let mut response = ResponseWriter::new(&mut notice[..HEADER_LEN], session, sequence);
            response.set_status(Status::InProgress);
            let mut len = if seal.is_some() {
                response.finish_sealed(reply_to.ttl, service_time_ns, 0)
            } else {
                response.finish(reply_to.ttl, service_time_ns, 0)
            };
            if let Some(seal) = seal {
                match self.sessions.seal(seal.session, seal.peer, &mut notice, len) {
                    Some(sealed) => len = sealed,
                    // The session has ended: its answer will not be checked either.
                    None => continue,
                }
            }
            self.count(Counter::InProgressNotices);
            send(reply_to, &notice[..len]);
        }
    }

    /// Executes the datagram in `slot` from its next instruction until it waits for a run of
    /// block requests or is finished.
    fn advance(&mut self, now: Instant, slot: u16) {
        // Taken out of the table so the engine and sessions can be used alongside it; moving the
        // boxes allocates nothing.
        let mut pending = std::mem::take(&mut self.block.slots[usize::from(slot)]);
        let waiting = self.advance_pending(now, slot, &mut pending);
        self.block.slots[usize::from(slot)] = pending;
        if !waiting {
            self.block.finished.push(slot);
        }
    }

    /// Returns whether the datagram now waits for block I/O.
    fn advance_pending(&mut self, now: Instant, slot: u16, pending: &mut Pending) -> bool {
        let Pending {
            request,
            request_len,
            response,
            progress,
            next_instruction,
            run,
            run_len,
            outstanding,
            reply_to,
            room,
            tenant,
            ..
        } = pending;
        self.current_tenant = *tenant;
        let request = parse_accepted(&request[..*request_len]).expect("the datagram was accepted before");
        let from = reply_to.expect("defer recorded where the answer goes").peer;
        let context = Context { from, session: request.header.session, request_len: *request_len };
        let mut response = ResponseWriter::resume(&mut response[..*room], progress.take().expect("a pending answer"));
        let mut instructions = request.instructions().skip(*next_instruction).peekable();
        while let Some(instruction) = instructions.next() {
            *next_instruction += 1;
            if !is_block(instruction.opcode) {
                self.execute_into(now, context, &instruction, &mut response);
                continue;
            }
            // A run: this block instruction and the ones right after it, but a FLUSH (and a
            // BLOCK_STATUS) runs alone so that every write before it has completed when it is
            // submitted.
            *run_len = 0;
            let mut reserved = 0;
            let mut current = instruction;
            loop {
                let room = response.data_capacity().saturating_sub(reserved);
                let entry = self.submit_block(slot, *run_len, &current, room);
                reserved += RESPONSE_INSTRUCTION_HEADER_LEN + entry.data_len;
                run[*run_len] = entry;
                *run_len += 1;
                // BLOCK_STATUS too: it answers when submitted, so the writes and trims before
                // it in the datagram must have completed.
                let runs_alone = |opcode: u8| opcode == Opcode::Flush as u8 || opcode == Opcode::BlockStatus as u8;
                let alone = runs_alone(current.opcode);
                match instructions.peek() {
                    Some(next) if !alone && is_block(next.opcode) && !runs_alone(next.opcode) => {
                        current = instructions.next().expect("peeked");
                        *next_instruction += 1;
                    }
                    _ => break,
                }
            }
            *outstanding = run[..*run_len].iter().filter(|entry| entry.in_flight).count();
            if *outstanding > 0 {
                *progress = Some(response.suspend());
                return true;
            }
            write_results(&mut self.block.devices, &mut self.block.free_buffers, &run[..*run_len], &mut response);
            self.count_run(&run[..*run_len]);
        }
        *progress = Some(response.suspend());
        false
    }

    /// Writes the results of a completed run into the pending answer.
    fn write_run_results(&mut self, pending: &mut Pending) {
        let progress = pending.progress.take().expect("a pending answer");
        let mut response = ResponseWriter::resume(&mut pending.response[..pending.room], progress);
        let run = &pending.run[..pending.run_len];
        write_results(&mut self.block.devices, &mut self.block.free_buffers, run, &mut response);
        self.count_run(run);
        pending.progress = Some(response.suspend());
    }

    fn count_run(&self, run: &[RunEntry]) {
        for entry in run {
            self.stats().count_status(entry.status);
            if self.metrics {
                let record = self.stats().opcode(entry.opcode);
                record.instructions.add(1);
                record.bytes_received.add(entry.request_bytes as u64);
                if entry.status == Status::Ok {
                    record.bytes_sent.add(entry.data_len as u64);
                }
            }
        }
    }

    /// Opcode of the first instruction of the datagram [`Dispatcher::handle`] last parsed: the
    /// label its service time is recorded under.
    pub fn current_opcode(&self) -> u8 {
        self.current_opcode
    }

    /// Records the service time of an executed datagram labelled `opcode` (its first
    /// instruction's): from its arrival in the socket queue until its answer is handed over.
    #[inline]
    pub fn observe_service(&self, opcode: u8, service: Duration) {
        if self.metrics {
            self.stats().opcode(opcode).service.record_ns(service.as_nanos());
        }
    }

    /// Checks one block instruction and submits it; the entry says whether it is in flight or
    /// already answered.
    fn submit_block(&mut self, slot: u16, index: usize, instruction: &Instruction<'_>, room: usize) -> RunEntry {
        let mut entry = run_entry(instruction);
        let (namespace, op) = match self.decode_block(instruction, room) {
            Ok(decoded) => decoded,
            Err(status) => {
                entry.status = status;
                return entry;
            }
        };
        if let BlockOp::Status { offset_blocks, num_blocks, max_extents } = op {
            return self.block_status(namespace, offset_blocks, num_blocks, max_extents, entry);
        }
        let block_bytes = self.block.shapes[namespace].block_bytes as usize;
        if self.execute_on_engine(namespace, block_bytes, op, instruction, &mut entry) {
            return entry;
        }
        let buffer = match op {
            BlockOp::Read { .. } | BlockOp::Write { .. } => match self.block.free_buffers[namespace].pop() {
                Some(buffer) => Some(BufferIndex(buffer)),
                None => {
                    entry.status = Status::Busy;
                    return entry;
                }
            },
            _ => None,
        };
        let device = &mut self.block.devices[namespace];
        let request = match (op, buffer) {
            (BlockOp::Read { offset_blocks, num_blocks }, Some(buffer)) => {
                entry.data_len = num_blocks as usize * block_bytes;
                BlockRequest::Read { offset_blocks, num_blocks, buffer }
            }
            (BlockOp::Write { offset_blocks, data, fua }, Some(buffer)) => {
                if fua {
                    self.shared.stats[self.worker].add(Counter::BlockFuaWrites, 1);
                }
                device.buffer(buffer)[..data.len()].copy_from_slice(data);
                BlockRequest::Write { offset_blocks, num_blocks: (data.len() / block_bytes) as u32, buffer, fua }
            }
            (BlockOp::Flush, _) => BlockRequest::Flush,
            (BlockOp::Trim { offset_blocks, num_blocks }, _) => BlockRequest::Trim { offset_blocks, num_blocks },
            (BlockOp::WriteZeroes { offset_blocks, num_blocks }, _) => {
                BlockRequest::WriteZeroes { offset_blocks, num_blocks }
            }
            (BlockOp::Read { .. } | BlockOp::Write { .. }, None) => unreachable!("transfers took a buffer above"),
            (BlockOp::Status { .. }, _) => unreachable!("BLOCK_STATUS is answered above"),
        };
        match device.submit(block::tag(slot, index), request) {
            Ok(()) => {
                self.count(Counter::BlockRequestsSubmitted);
                // Namespaces are bounded by MAX_NAMESPACES (config), the size of these cells.
                if let Some(cell) = self.stats().block_submitted.get(namespace) {
                    cell.add(1);
                }
                entry.in_flight = true;
                entry.buffer = buffer.map(|buffer| buffer.0);
            }
            Err(error) => {
                if let Some(buffer) = buffer {
                    self.block.free_buffers[namespace].push(buffer.0);
                }
                entry.status = block::failure_status(&error);
                entry.data_len = 0;
            }
        }
        entry
    }

    /// Serves a block instruction on a namespace the engine holds itself (an FPGA's NVMe SSD):
    /// answered at once, a BREAD's blocks kept in a transfer buffer like the target's own
    /// device's. False when the engine does not hold it now (the target's device serves it).
    fn execute_on_engine(
        &mut self,
        namespace: usize,
        block_bytes: usize,
        op: BlockOp<'_>,
        instruction: &Instruction<'_>,
        entry: &mut RunEntry,
    ) -> bool {
        if !self.engine_holds(instruction.space) {
            return false;
        }
        let read_bytes = match op {
            BlockOp::Read { num_blocks, .. } => num_blocks as usize * block_bytes,
            _ => 0,
        };
        let buffer = if read_bytes > 0 {
            let Some(buffer) = self.block.free_buffers[namespace].pop() else {
                entry.status = Status::Busy;
                return true;
            };
            Some(buffer)
        } else {
            None
        };
        let out = match buffer {
            Some(buffer) => &mut self.block.devices[namespace].buffer(BufferIndex(buffer))[..read_bytes],
            None => &mut [][..],
        };
        match self.engine.execute_block(instruction, out) {
            Some(Ok(len)) if len == read_bytes => {
                entry.data_len = len;
                entry.buffer = buffer;
                true
            }
            Some(Ok(_)) => {
                // Fewer (or more) blocks than asked: never a short answer.
                entry.status = Status::IoError;
                if let Some(buffer) = buffer {
                    self.block.free_buffers[namespace].push(buffer);
                }
                true
            }
            Some(Err(status)) => {
                entry.status = status;
                if let Some(buffer) = buffer {
                    self.block.free_buffers[namespace].push(buffer);
                }
                true
            }
            None => {
                // Failed over meanwhile: the target's own device serves it.
                if let Some(buffer) = buffer {
                    self.block.free_buffers[namespace].push(buffer);
                }
                false
            }
        }
    }

    /// Whether the engine serves namespace `space` itself now (an FPGA's NVMe SSD), or answers
    /// it `io_error` because it is fenced.
    fn engine_holds(&self, space: u16) -> bool {
        let engine = &self.shared.engine;
        engine.namespace_on_device(space) || engine.namespace_fenced(space)
    }

    /// Checks a block instruction's grant, namespace and operands against an answer of `room`
    /// bytes: its namespace's index and what it asks for.
    fn decode_block<'i>(&self, instruction: &Instruction<'i>, room: usize) -> Result<(usize, BlockOp<'i>), Status> {
        self.check_grant(instruction)?;
        let shape = self.block.shapes.get(usize::from(instruction.space)).ok_or(Status::NoSuchSpace)?;
        let op = netdam_isa::block::decode(instruction, shape, room)?;
        Ok((usize::from(instruction.space), op))
    }

    /// Executes a block instruction on a namespace whose device completes at once (a memory
    /// region) and that the FPGA engine does not hold, and writes its result: a BREAD's blocks
    /// are read straight into the answer, with no pending slot, transfer buffer or wait for
    /// `reap`.
    fn execute_block_now(&mut self, instruction: &Instruction<'_>, response: &mut ResponseWriter<'_>) {
        let mut entry = run_entry(instruction);
        match self.block_now(instruction, response.data_area()) {
            Ok(data_len) => entry.data_len = data_len,
            Err(status) => entry.status = status,
        }
        response.commit(entry.opcode, entry.status, entry.data_len);
        self.count_run(std::slice::from_ref(&entry));
    }

    /// The work of [`Dispatcher::execute_block_now`]: returns how many bytes of `out` the
    /// answer carries.
    fn block_now(&mut self, instruction: &Instruction<'_>, out: &mut [u8]) -> Result<usize, Status> {
        let (namespace, op) = self.decode_block(instruction, out.len())?;
        let device = &mut self.block.devices[namespace];
        if let BlockOp::Status { offset_blocks, num_blocks, max_extents } = op {
            let mut extents = [Extent::default(); MAX_BLOCK_STATUS_EXTENTS];
            let count = device
                .block_status(offset_blocks, num_blocks, &mut extents[..max_extents])
                .map_err(|error| block::failure_status(&error))?;
            // `decode` checked the room for `max_extents`.
            return Ok(encode_extents(&extents[..count], out));
        }
        let read_bytes = match op {
            BlockOp::Read { num_blocks, .. } => num_blocks as usize * self.block.shapes[namespace].block_bytes as usize,
            _ => 0,
        };
        let request = match op {
            BlockOp::Read { offset_blocks, .. } => {
                ImmediateRequest::Read { offset_blocks, out: &mut out[..read_bytes] }
            }
            BlockOp::Write { offset_blocks, data, fua } => {
                if fua {
                    self.count(Counter::BlockFuaWrites);
                }
                ImmediateRequest::Write { offset_blocks, data, fua }
            }
            BlockOp::Flush => ImmediateRequest::Flush,
            BlockOp::Trim { offset_blocks, num_blocks } => ImmediateRequest::Trim { offset_blocks, num_blocks },
            BlockOp::WriteZeroes { offset_blocks, num_blocks } => {
                ImmediateRequest::WriteZeroes { offset_blocks, num_blocks }
            }
            BlockOp::Status { .. } => unreachable!("BLOCK_STATUS is answered above"),
        };
        self.count(Counter::BlockRequestsSubmitted);
        if let Some(cell) = self.stats().block_submitted.get(namespace) {
            cell.add(1);
        }
        let result = self.block.devices[namespace].execute_now(request);
        if let Some(cell) = self.stats().block_completed.get(namespace) {
            cell.add(1);
        }
        result.map(|()| read_bytes).map_err(|error| block::failure_status(&error))
    }

    /// Answers a BLOCK_STATUS at once: the device finds the extents with a bounded number of
    /// system calls (two `lseek`s per extent on a file) and nothing to wait for. The answer waits
    /// in a transfer buffer, as BREAD data does, until the run's results are written in order.
    fn block_status(
        &mut self,
        namespace: usize,
        offset_blocks: u64,
        num_blocks: u32,
        max_extents: usize,
        mut entry: RunEntry,
    ) -> RunEntry {
        let mut extents = [Extent::default(); MAX_BLOCK_STATUS_EXTENTS];
        let device = &mut self.block.devices[namespace];
        let count = match device.block_status(offset_blocks, num_blocks, &mut extents[..max_extents]) {
            Ok(count) => count,
            Err(error) => {
                entry.status = block::failure_status(&error);
                return entry;
            }
        };
        let Some(buffer) = self.block.free_buffers[namespace].pop() else {
            entry.status = Status::Busy;
            return entry;
        };
        // A buffer holds at least one block of 512 bytes or more: room for every extent (limits).
        entry.data_len = encode_extents(&extents[..count], device.buffer(BufferIndex(buffer)));
        entry.buffer = Some(buffer);
        entry
    }

    /// Records an executed request in its session's replay window; `answer` (the finished
    /// response) is kept when the ticket asked for it.
    pub fn record(&mut self, ticket: RecordTicket, answer: Option<&[u8]>) {
        self.sessions.record(ticket, answer);
    }

    /// Marks an executed request whose answer is held (group commit) as in progress: a
    /// duplicate arriving before [`Dispatcher::record`] is not executed again.
    pub fn hold(&mut self, ticket: RecordTicket) {
        self.sessions.mark_in_progress(ticket);
    }

    fn datagram_status<'b>(&self, out: &'b mut [u8], session: u32, sequence: u64, status: Status) -> Handled<'b> {
        self.count(match status {
            Status::Stale => Counter::AnsweredStale,
            Status::NoSession => Counter::AnsweredNoSession,
            Status::Unauthenticated => Counter::AnsweredUnauthenticated,
            Status::InProgress => Counter::DuplicatesInProgress,
            _ => Counter::AnsweredMalformed,
        });
        let mut response = ResponseWriter::new(out, session, sequence);
        response.set_status(status);
        Handled::Answer { response, record: None }
    }

    fn refuse<'b>(&mut self, datagram: &[u8], error: DecodeError, out: &'b mut [u8]) -> Handled<'b> {
        let counter = match (error, error.disposition()) {
            (DecodeError::TooShort, _) => Counter::DroppedTooShort,
            (DecodeError::BadMagic, _) => Counter::DroppedBadMagic,
            (DecodeError::BadCrc, _) => Counter::DroppedBadCrc,
            (_, Disposition::Drop) => Counter::DroppedNotRequest,
            (DecodeError::UnsupportedVersion(_), Disposition::Answer(_)) => Counter::AnsweredUnsupportedVersion,
            (_, Disposition::Answer(_)) => Counter::AnsweredMalformed,
        };
        self.stats().add(counter, 1);
        let Disposition::Answer(status) = error.disposition() else {
            return Handled::Dropped;
        };
        // A readable header names the request; the answer is no longer than it (no amplification).
        let Some((session, sequence)) = peek_session_sequence(datagram) else {
            return Handled::Dropped;
        };
        let mut response = ResponseWriter::new(out, session, sequence);
        response.set_status(status);
        Handled::Answer { response, record: None }
    }

    fn execute(&mut self, context: Context, instruction: &Instruction<'_>, out: &mut [u8]) -> Result<usize, Status> {
        self.check_grant(instruction)?;
        match Opcode::from_u8(instruction.opcode) {
            Some(Opcode::Ping) => control_fields_empty(instruction).map(|()| 0),
            Some(Opcode::Stat) => {
                // The operand is padding a sessionless STAT carries to make room for its answer.
                let padding = Instruction { operand: &[], ..*instruction };
                control_fields_empty(&padding)?;
                if instruction.operand.iter().any(|&byte| byte != 0) {
                    return Err(Status::Malformed);
                }
                self.stat(out)
            }
            Some(Opcode::Close) => {
                control_fields_empty(instruction)?;
                if self.sessions.close(context.session, context.from) {
                    self.count(Counter::SessionsClosed);
                    Ok(0)
                } else {
                    // Closed already, earlier in this datagram.
                    self.count(Counter::ClosesIgnored);
                    Err(Status::NoSession)
                }
            }
            Some(Opcode::Hello) => unreachable!("execute_into answers HELLO"),
            // Reached only when this target serves no namespace at all.
            Some(opcode) if opcode.is_block() => Err(Status::NoSuchSpace),
            Some(Opcode::Encrypt | Opcode::Decrypt) => self.crypto(instruction, out),
            None if EXTENSION_OPCODES.contains(&instruction.opcode) => self.extension(instruction, out),
            _ => self.engine.execute(instruction, out),
        }
    }

    /// Executes an extension instruction: the registry checks it against its handler's
    /// declaration and the session's permissions, and runs the handler; a range it modified on a
    /// persistent region is persisted at once (extensions are outside group commit).
    fn extension(&mut self, instruction: &Instruction<'_>, out: &mut [u8]) -> Result<usize, Status> {
        let granted = self.session_permissions(instruction.space);
        let shared = &*self.shared;
        if shared.engine.region_on_device(instruction.space) {
            // Handlers read and write host memory; this region's bytes are on the device.
            return Err(Status::NotSupported);
        }
        let outcome = shared.extensions.execute(instruction, &*shared.regions, granted, out)?;
        if let Some(written) = outcome.written {
            persist_now(shared, written.space, written.offset, written.len, "an extension's write")?;
        }
        Ok(outcome.data_len)
    }

    /// What the session whose datagram is executing may do on region `space`: its tenant's grant
    /// there, or without tenants (`auth = "none"`) the target-wide `session_permissions`. One
    /// function, so extensions, ENCRYPT and DECRYPT read permissions from one place.
    fn session_permissions(&self, space: u16) -> Permissions {
        match self.current_tenant {
            None => self.shared.settings.session_permissions,
            Some(tenant) => self
                .tenants
                .tenant(tenant)
                .and_then(|tenant| tenant.region_grant(space))
                .map_or(Permissions::NONE, |grant| grant.permissions),
        }
    }

    /// Executes an ENCRYPT or DECRYPT (see `crypto`); what it wrote on a persistent region is
    /// persisted at once, before the answer (crypto is outside group commit, as extensions are).
    fn crypto(&mut self, instruction: &Instruction<'_>, out: &mut [u8]) -> Result<usize, Status> {
        // A tenant's grant on a destination region (and the ranges) was checked in `check_grant`.
        let granted = self.session_permissions(instruction.space);
        let shared = &*self.shared;
        let destination = netdam_isa::crypto::decode(instruction).ok().and_then(|request| request.destination);
        let on_device = |space: u16| shared.engine.region_on_device(space);
        if on_device(instruction.space) || destination.is_some_and(|to| on_device(to.space)) {
            // Sealing reads and writes host memory; this region's bytes are on the device.
            return Err(Status::NotSupported);
        }
        let outcome = crate::crypto::execute(
            instruction,
            &*shared.regions,
            &shared.keys,
            granted,
            &mut self.crypto_scratch,
            out,
        )?;
        if let Some(written) = outcome.written {
            persist_now(shared, written.space, written.offset, written.len, "a crypto result")?;
        }
        Ok(outcome.data_len)
    }

    /// Answers HELLO: a `retry` with a cookie unless it echoes a valid one, else a session (the
    /// one this cookie opened before, if any) and what the target serves.
    fn hello(
        &mut self,
        now: Instant,
        context: Context,
        instruction: &Instruction<'_>,
        out: &mut [u8],
    ) -> (Status, usize) {
        let plain = Instruction { operand: &[], ..*instruction };
        if let Err(status) = control_fields_empty(&plain) {
            return (status, 0);
        }
        let hello = match decode_hello_operand(instruction.operand) {
            Ok(hello) => hello,
            Err(status) => return (status, 0),
        };
        if (hello.max_datagram_bytes as usize) < MIN_DATAGRAM_BYTES {
            return (Status::Malformed, 0);
        }
        let tag = match self.shared.cookies.check(context.from, now, &hello.cookie) {
            Ok(tag) => tag,
            Err(refusal) => {
                match refusal {
                    CookieRefusal::Missing => {}
                    CookieRefusal::Invalid => self.count(Counter::HelloBadCookie),
                    CookieRefusal::Expired => self.count(Counter::HelloExpiredCookie),
                }
                if out.len() < COOKIE_LEN {
                    return (Status::TooLarge, 0);
                }
                // Strictly later than the last one: two HELLOs from one socket handled at the
                // same instant must not share a cookie (they would share a session).
                let issued = now.max(self.last_cookie + Duration::from_nanos(1));
                self.last_cookie = issued;
                out[..COOKIE_LEN].copy_from_slice(&self.shared.cookies.issue(context.from, issued));
                self.count(Counter::CookiesSent);
                return (Status::Retry, COOKIE_LEN);
            }
        };
        let (method, area) = decode_hello_auth(instruction.operand);
        let auth = if self.shared.settings.auth_required || method != HELLO_AUTH_NONE {
            match self.authenticate_hello(context.from, method, &area, &hello) {
                Ok(auth) => Some(auth),
                Err(status) => return (status, 0),
            }
        } else {
            None
        };
        if let Some(proven) = &auth {
            // A tenant at its share of sessions gets no new one (checked before the table looks
            // for room, so it evicts nobody's idle session; reserved for real below).
            let tenant = proven.area.tenant;
            let max = self.tenants.tenant(tenant).map_or(0, |tenant| tenant.limits.max_sessions);
            let usage = self.shared.usage.get(tenant);
            if usage.sessions.load(std::sync::atomic::Ordering::Relaxed) >= max
                && !self.sessions.is_open_by(context.from, tag)
            {
                usage.sessions_refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                return session_limit(out, SessionLimitKind::Tenant, max);
            }
        }
        let opened = self.sessions.open(now, context.from, tag);
        let expired = match opened {
            Ok(opened) => opened.expired,
            Err(OpenRefusal::TableFull { expired } | OpenRefusal::AddressLimit { expired }) => expired,
        };
        if expired > 0 {
            self.stats().add(Counter::SessionsExpired, expired);
        }
        let (session, existing) = match opened {
            Ok(opened) => {
                if !opened.existing {
                    self.count(Counter::SessionsOpened);
                }
                if opened.evicted {
                    self.count(Counter::SessionsEvicted);
                }
                (opened.id, opened.existing)
            }
            Err(refusal) => return self.refuse_hello(now, context.from, refusal, out),
        };
        let listed_for = auth.as_ref().map(|proven| proven.area.tenant);
        let out = match auth {
            Some(proven) => {
                let tenant = proven.area.tenant;
                let max = self.tenants.tenant(tenant).map_or(0, |tenant| tenant.limits.max_sessions);
                let counted = !existing;
                if counted && !self.shared.usage.get(tenant).open_session(max) {
                    // The tenant holds its share of sessions over the whole target.
                    self.sessions.close(session, context.from);
                    self.count(Counter::SessionsClosed);
                    self.shared.usage.get(tenant).sessions_refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    return session_limit(out, SessionLimitKind::Tenant, max);
                }
                // The keys depend on the session's id, which no other session gets: a HELLO
                // replayed after its session ended opens one with other keys.
                let auth = SessionAuth {
                    keys: proven.area.session_keys(&proven.key, &hello.cookie, session),
                    tenant,
                    key_version: proven.key_version,
                    nonce: proven.area.nonce,
                    sent: 0,
                    counted,
                    encrypt: proven.encrypt,
                };
                if !self.sessions.authenticate(session, context.from, auth) {
                    // Another proof on the cookie of a live session: a live session's keys are
                    // never replaced (its counters would start again under them).
                    if counted {
                        self.shared.usage.get(tenant).close_session();
                    }
                    self.count(Counter::HelloUnauthenticated);
                    return (Status::Unauthenticated, 0);
                }
                // The answer is sealed with the new session's response key, and carries the
                // session's id in its header (the keys need it): the initiator learns that this
                // target holds its tenant's key, and nobody can alter the answer.
                self.pending_seal = Some(SealFor { session, peer: context.from });
                self.hello_session = Some(session);
                let room = out.len().saturating_sub(netdam_auth::TRAILER_BYTES);
                &mut out[..room]
            }
            None => out,
        };
        let negotiated = (hello.max_datagram_bytes as usize).min(self.shared.settings.max_datagram_bytes) as u32;
        // A tenant is told of the spaces it holds a grant on (every one, for an admin): a
        // tenant learns nothing of a space outside its grants, not even that it exists. Without
        // tenants, every space.
        // (A tenant proven but gone from the snapshot is told of nothing: failing closed.)
        let tenant = listed_for.map(|id| self.tenants.tenant(id));
        let usable = |grant: Option<Grant>| grant.is_some_and(|grant| grant.permissions != Permissions::NONE);
        let listed = move |grant_of: &dyn Fn(&Tenant) -> Option<Grant>| match tenant {
            None => true,
            Some(None) => false,
            Some(Some(tenant)) => tenant.admin || usable(grant_of(tenant)),
        };
        let listed_region = move |id: u16| listed(&|tenant: &Tenant| tenant.region_grant(id));
        let listed_namespace = move |id: u16| listed(&|tenant: &Tenant| tenant.namespace_grant(id));
        let regions = self.shared.regions.iter().filter(move |(id, _)| listed_region(*id)).map(|(id, region)| {
            (id, region.name(), region.len() as u64, region.durability() == Durability::Persistent)
        });
        let namespaces =
            self.shared.namespaces.iter().filter(move |(id, _)| listed_namespace(*id)).map(|(id, namespace)| {
                NamespaceEntry {
                    id,
                    name: namespace.name(),
                    block_bytes: namespace.block_bytes(),
                    capacity_blocks: namespace.capacity_blocks(),
                    reports_allocation: namespace.reports_allocation(),
                }
            });
        let target_flags = if self.shared.engine.on_fpga() { TARGET_FLAG_FPGA } else { 0 };
        let max_instructions = MAX_INSTRUCTIONS_PER_DATAGRAM as u16;
        match encode_hello_answer(out, session, negotiated, max_instructions, target_flags, regions, namespaces) {
            Ok(len) => (Status::Ok, len),
            // The session stays unused and expires within a second.
            Err(status) => (status, 0),
        }
    }

    /// Checks a HELLO's proof of its tenant's key (the cookie is its challenge) and derives the
    /// session's keys; `unauthenticated` for no proof, an unknown tenant, a wrong proof or a
    /// key version that is not the tenant's current one.
    fn authenticate_hello(
        &mut self,
        from: SocketAddr,
        method: u8,
        area: &[u8; HELLO_AUTH_LEN],
        hello: &HelloRequest,
    ) -> Result<Proven, Status> {
        let refuse = |dispatcher: &mut Self, why: &'static str, tenant: u32| {
            dispatcher.count(Counter::HelloUnauthenticated);
            tracing::debug!(worker = dispatcher.worker, %from, tenant, why, "HELLO refused unauthenticated");
            Err(Status::Unauthenticated)
        };
        if method != HELLO_AUTH_MAC && method != HELLO_AUTH_ENCRYPT {
            return refuse(self, "no tenant key (the target requires one)", 0);
        }
        let Some(area) = HelloAuth::decode(area) else {
            return Err(Status::Malformed);
        };
        let Some(tenant) = self.tenants.tenant(area.tenant) else {
            return refuse(self, "unknown tenant", area.tenant);
        };
        if area.key_version != tenant.key_version {
            return refuse(self, "the key was rotated: a key file of another version", area.tenant);
        }
        if !area.verify(&tenant.key, &hello.cookie, method, hello.max_datagram_bytes) {
            return refuse(self, "wrong proof (another key)", area.tenant);
        }
        Ok(Proven { area, key: tenant.key, key_version: tenant.key_version, encrypt: method == HELLO_AUTH_ENCRYPT })
    }

    /// Whether the session's tenant may execute `instruction`: it needs a grant on the space
    /// (both spaces of a MEMCPY) with the permissions the opcode needs, over the range it
    /// addresses (PROTOCOL.md, "Authentication"). Without tenants (`auth = "none"`) everything
    /// passes here and `session_permissions` applies to extensions.
    fn check_grant(&self, instruction: &Instruction<'_>) -> Result<(), Status> {
        let Some(tenant) = self.current_tenant else { return Ok(()) };
        let Some(tenant) = self.tenants.tenant(tenant) else { return Err(Status::PermissionDenied) };
        let (space, offset, length) = (instruction.space, instruction.offset, u64::from(instruction.length));
        let region = |needed: Permissions, offset: u64, length: u64| {
            tenant.region_grant(space).is_some_and(|grant| grant.allows(needed, offset, length))
        };
        let allowed = match Opcode::from_u8(instruction.opcode) {
            Some(Opcode::Hello | Opcode::Ping | Opcode::Close) => true,
            Some(Opcode::Stat) => tenant.admin,
            Some(Opcode::Read | Opcode::Crc32) => region(Permissions::READ, offset, length),
            Some(Opcode::Write | Opcode::Fill) => region(Permissions::WRITE, offset, length),
            Some(Opcode::Cas | Opcode::FetchAdd) => region(Permissions::ATOMIC, offset, 8),
            Some(Opcode::Vadd) => region(Permissions::COMPUTE, offset, length),
            Some(Opcode::Encrypt | Opcode::Decrypt) => {
                // The key slot is used, so its use must be granted; the source is read and (in
                // place) written; a destination is written. A malformed operand is the
                // executor's to answer; it touches nothing.
                let request = netdam_isa::crypto::decode(instruction).ok();
                let destination = request.as_ref().and_then(|request| request.destination);
                request.is_none_or(|request| tenant.key_slots.allows(request.slot, request.decrypt))
                    && region(Permissions::READ.union(Permissions::WRITE), offset, length)
                    && destination.is_none_or(|to| {
                        tenant
                            .region_grant(to.space)
                            .is_some_and(|grant| grant.allows(Permissions::WRITE, to.offset, length))
                    })
            }
            Some(Opcode::Memcpy) => {
                let operand = instruction.operand;
                // A malformed operand is the engine's to answer; it touches nothing.
                let source = (operand.len() == 16).then(|| {
                    let space = u16::from_le_bytes([operand[0], operand[1]]);
                    let offset = u64::from_le_bytes(operand[8..16].try_into().expect("8 bytes"));
                    tenant.region_grant(space).is_some_and(|grant| grant.allows(Permissions::READ, offset, length))
                });
                region(Permissions::WRITE, offset, length) && source.unwrap_or(true)
            }
            Some(opcode) if opcode.is_block() => {
                let needed = match opcode {
                    Opcode::BlockRead | Opcode::BlockStatus => Permissions::BLOCK.union(Permissions::READ),
                    Opcode::Flush => Permissions::BLOCK,
                    _ => Permissions::BLOCK.union(Permissions::WRITE),
                };
                let block_bytes = self.block.shapes.get(usize::from(space)).map_or(1, |shape| shape.block_bytes);
                // Saturating, as `Grant::allows` adds: a block range whose bytes overflow lies
                // past every bounded grant and within an unbounded one, so with a grant to the
                // namespace's end it is the namespace's `out_of_range` (checked in `decode`).
                let bytes = |blocks: u64| blocks.saturating_mul(u64::from(block_bytes));
                tenant.namespace_grant(space).is_some_and(|grant| {
                    // FLUSH addresses no range: the block permission on the namespace is enough.
                    if opcode == Opcode::Flush {
                        grant.permissions.contains(needed)
                    } else {
                        grant.allows(needed, bytes(offset), bytes(length))
                    }
                })
            }
            // Extensions: the range here, the permissions by the registry against the handler's
            // declaration (see `extension`).
            None if EXTENSION_OPCODES.contains(&instruction.opcode) => region(Permissions::NONE, offset, length),
            _ => true,
        };
        if allowed {
            Ok(())
        } else {
            Err(Status::PermissionDenied)
        }
    }

    /// Counts and (at most every [`REFUSAL_LOG_INTERVAL`]) logs a HELLO refused for want of a
    /// slot; returns its status.
    fn refuse_hello(
        &mut self,
        now: Instant,
        from: SocketAddr,
        refusal: OpenRefusal,
        out: &mut [u8],
    ) -> (Status, usize) {
        let limits = self.sessions.limits();
        let (counter, answer) = match refusal {
            OpenRefusal::TableFull { .. } => (Counter::HelloRefusedTableFull, (Status::Busy, 0)),
            OpenRefusal::AddressLimit { .. } => {
                let limit = u32::try_from(limits.per_address).unwrap_or(u32::MAX);
                (Counter::HelloRefusedAddressLimit, session_limit(out, SessionLimitKind::Address, limit))
            }
        };
        self.count(counter);
        self.refusals.refused_since += 1;
        let due = self.refusals.last_line.is_none_or(|last| now.saturating_since(last) >= REFUSAL_LOG_INTERVAL);
        if due {
            let refused = self.refusals.refused_since;
            match refusal {
                OpenRefusal::TableFull { .. } => tracing::warn!(
                    worker = self.worker,
                    %from,
                    refused,
                    "refusing HELLO: all {} session slots of this worker are held by active sessions \
                     (raise sessions_per_worker; `netdam stat` shows the counts)",
                    limits.slots
                ),
                OpenRefusal::AddressLimit { .. } => tracing::warn!(
                    worker = self.worker,
                    %from,
                    refused,
                    "refusing HELLO: this address already holds max_sessions_per_address = {} active sessions",
                    limits.per_address
                ),
            }
            self.refusals = RefusalLog { last_line: Some(now), refused_since: 0 };
        }
        answer
    }

    fn stat(&self, out: &mut [u8]) -> Result<usize, Status> {
        // Summed in place: STAT allocates nothing either.
        let workers = &self.shared.stats;
        let mut writer = StatWriter::new(out)?;
        writer.push("workers", self.shared.stats.len() as u64)?;
        writer.push("regions", self.shared.regions.iter().len() as u64)?;
        writer.push("namespaces", self.shared.namespaces.iter().len() as u64)?;
        writer.push("engine_fpga", u64::from(self.shared.engine.on_fpga()))?;
        writer.push("engine_failovers", self.shared.engine.failovers())?;
        writer.push("engine_fpga_block_instructions", self.shared.engine.device_block_instructions())?;
        let sum = |counter| workers.iter().map(|worker| worker.get(counter)).sum::<u64>();
        let ended = sum(Counter::SessionsClosed) + sum(Counter::SessionsExpired) + sum(Counter::SessionsEvicted);
        writer.push("sessions_open", sum(Counter::SessionsOpened).saturating_sub(ended))?;
        for counter in Counter::ALL {
            writer.push(counter.name(), sum(*counter))?;
        }
        for status in Status::ALL {
            let count = workers.iter().map(|worker| worker.status_count(status)).sum();
            writer.push_prefixed(STATUS_COUNTER_PREFIX, status.name(), count)?;
        }
        Ok(writer.finish())
    }
}

/// The run entry of a block instruction, before it is executed.
fn run_entry(instruction: &Instruction<'_>) -> RunEntry {
    RunEntry {
        opcode: instruction.opcode,
        namespace: instruction.space,
        request_bytes: instruction.operand.len(),
        ..RunEntry::default()
    }
}

/// Writes a completed run's results in order, copying BREAD data and BLOCK_STATUS extents out
/// of the transfer buffers, and gives the buffers back.
fn write_results(
    devices: &mut [Box<dyn BlockDevice>],
    free_buffers: &mut [Vec<u16>],
    run: &[RunEntry],
    response: &mut ResponseWriter<'_>,
) {
    for entry in run {
        let namespace = usize::from(entry.namespace);
        let mut data_len = 0;
        if let Some(buffer) = entry.buffer {
            if entry.status == Status::Ok && entry.data_len > 0 {
                data_len = entry.data_len;
                let data = &devices[namespace].buffer(BufferIndex(buffer))[..data_len];
                response.data_area()[..data_len].copy_from_slice(data);
            }
            free_buffers[namespace].push(buffer);
        }
        response.commit(entry.opcode, entry.status, data_len);
    }
}

/// The queueing header field: µs, saturating.
/// A BUSY answer: nothing was executed; the initiator waits about `hint_us` and sends it again.
fn busy(out: &mut [u8], session: u32, sequence: u64, hint_us: u16) -> Handled<'_> {
    let mut response = ResponseWriter::new(out, session, sequence);
    response.set_status(Status::Busy);
    response.set_queueing_us(hint_us);
    Handled::Answer { response, record: None }
}

/// Persists what an instruction outside group commit (an extension, ENCRYPT, DECRYPT) wrote,
/// before its answer; a failure is the instruction's `io_error`.
fn persist_now(shared: &Shared, space: u16, offset: usize, len: usize, what: &str) -> Result<(), Status> {
    let region = shared.regions.get(space).expect("an instruction wrote to a region that exists");
    region.persist(offset, len).map_err(|error| {
        tracing::error!(region = region.name(), offset, len, %error, "persist of {what} failed");
        Status::IoError
    })
}

/// Whether an instruction leaves every region, namespace and session as it found them, so that
/// executing it again (a retransmission, or a replay) cannot undo a later change.
fn changes_nothing(opcode: u8) -> bool {
    matches!(
        Opcode::from_u8(opcode),
        Some(Opcode::Read | Opcode::Crc32 | Opcode::BlockRead | Opcode::BlockStatus | Opcode::Ping | Opcode::Stat)
    )
}

/// Parses a datagram accepted before: sealed ones were opened (their trailer checked and cut).
fn parse_accepted(datagram: &[u8]) -> Result<Request<'_>, DecodeError> {
    if peek_is_sealed(datagram) {
        Request::parse_opened(datagram)
    } else {
        Request::parse(datagram)
    }
}

fn queueing_field(queueing: Duration) -> u16 {
    u16::try_from(queueing.as_nanos() / 1000).unwrap_or(u16::MAX)
}

fn is_block(opcode: u8) -> bool {
    Opcode::from_u8(opcode).is_some_and(Opcode::is_block)
}

/// HELLO, PING and STAT: the opcodes a datagram without a session may carry.
fn is_sessionless(opcode: u8) -> bool {
    matches!(Opcode::from_u8(opcode), Some(Opcode::Hello | Opcode::Ping | Opcode::Stat))
}

/// A HELLO refused `session_limit`, its data saying which limit and its value
/// (`netdam_isa::control::encode_session_limit`), so the initiator can name the setting at fault.
fn session_limit(out: &mut [u8], kind: SessionLimitKind, limit: u32) -> (Status, usize) {
    if out.len() < SESSION_LIMIT_DETAIL_LEN {
        return (Status::SessionLimit, 0);
    }
    (Status::SessionLimit, encode_session_limit(out, kind, limit))
}

/// Control instructions address nothing: every field but the opcode is zero.
fn control_fields_empty(instruction: &Instruction<'_>) -> Result<(), Status> {
    let empty = instruction.flags == 0
        && instruction.space == 0
        && instruction.offset == 0
        && instruction.length == 0
        && instruction.aux == 0
        && instruction.operand.is_empty();
    if empty {
        Ok(())
    } else {
        Err(Status::Malformed)
    }
}

impl<E> Dispatcher<E> {
    /// Counts an event the driver saw (oversized datagrams, socket errors).
    pub fn count(&self, counter: Counter) {
        self.shared.stats[self.worker].add(counter, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ByteSize, NamespaceBackend, NamespaceConfig, RegionBackend, RegionConfig};
    use crate::engine::SoftwareEngine;
    use netdam_isa::control::{decode_hello_answer, decode_stat_answer, encode_hello_operand, HelloRequest, NO_COOKIE};
    use netdam_isa::wire::{RequestBuilder, Response};

    fn dispatcher() -> Dispatcher<SoftwareEngine> {
        dispatcher_serving(Arc::new(NamespaceTable::default()), Vec::new())
    }

    /// A dispatcher of one 4 KiB memory region and `namespaces`, on `devices`.
    fn dispatcher_serving(
        namespaces: Arc<NamespaceTable>,
        devices: Vec<Box<dyn BlockDevice>>,
    ) -> Dispatcher<SoftwareEngine> {
        let config = RegionConfig { name: "r".into(), backend: RegionBackend::Mem, path: None, size: ByteSize(4096) };
        let regions = Arc::new(RegionTable::open(&[config], std::path::Path::new(".")).unwrap());
        let shared = Arc::new(Shared::new(
            regions.clone(),
            namespaces,
            1,
            DispatchSettings::default(),
            1,
            CookieJar::new([3; 16]),
        ));
        Dispatcher::new(SoftwareEngine::new(regions), shared, 0, devices)
    }

    fn instruction(opcode: Opcode, length: u32, operand: &[u8]) -> Instruction<'_> {
        Instruction { opcode: opcode as u8, flags: 0, space: 0, offset: 0, length, aux: 0, operand }
    }

    fn peer(port: u16) -> ReplyTo {
        ReplyTo { peer: SocketAddr::from(([127, 0, 0, 1], port)), ttl: 64 }
    }

    const ME: u16 = 4000;

    /// Hands one request from port `from` to the dispatcher at `now`, after it queued for
    /// `queued`; returns the finished answer and whether the request was recorded as executed.
    fn exchange_at(
        dispatcher: &mut Dispatcher<SoftwareEngine>,
        now: Instant,
        from: u16,
        session: u32,
        queued: Duration,
        ops: &[Instruction<'_>],
    ) -> (Vec<u8>, bool) {
        exchange_numbered(dispatcher, now, from, session, 1, queued, ops)
    }

    /// As [`exchange_at`], with the request's sequence number.
    fn exchange_numbered(
        dispatcher: &mut Dispatcher<SoftwareEngine>,
        now: Instant,
        from: u16,
        session: u32,
        sequence: u64,
        queued: Duration,
        ops: &[Instruction<'_>],
    ) -> (Vec<u8>, bool) {
        let mut request = vec![0u8; 8192];
        let mut builder = RequestBuilder::new(&mut request, session, sequence).unwrap();
        for op in ops {
            builder.push(op).unwrap();
        }
        let len = builder.finish();
        let mut out = vec![0u8; 9000];
        match dispatcher.handle(now, peer(from), Wait::queued(queued), &request[..len], &mut out) {
            Handled::Answer { response, record } => {
                let len = response.finish(64, 0, 0);
                if let Some((ticket, store)) = record {
                    dispatcher.record(ticket, store.then_some(&out[..len]));
                }
                (out[..len].to_vec(), record.is_some())
            }
            other => panic!("expected an answer, got {other:?}"),
        }
    }

    fn exchange(
        dispatcher: &mut Dispatcher<SoftwareEngine>,
        session: u32,
        queued: Duration,
        op: Instruction<'_>,
    ) -> (Vec<u8>, bool) {
        exchange_at(dispatcher, Instant::ZERO, ME, session, queued, &[op])
    }

    /// The first result of an answer: its status and data.
    fn first_result(answer: &[u8]) -> (Status, Vec<u8>) {
        let response = Response::parse(answer).unwrap();
        let result = response.results().next().expect("a result");
        (result.status, result.data.to_vec())
    }

    /// Runs the two-step HELLO from `from` at `now`; returns the session id.
    fn open_session(dispatcher: &mut Dispatcher<SoftwareEngine>, now: Instant, from: u16) -> u32 {
        let first = encode_hello_operand(&HelloRequest { max_datagram_bytes: 9000, cookie: NO_COOKIE });
        let (answer, _) =
            exchange_at(dispatcher, now, from, 0, Duration::ZERO, &[instruction(Opcode::Hello, 0, &first)]);
        let (status, cookie) = first_result(&answer);
        assert_eq!((status, cookie.len()), (Status::Retry, COOKIE_LEN), "a first HELLO gets a cookie");
        let second =
            encode_hello_operand(&HelloRequest { max_datagram_bytes: 9000, cookie: cookie.try_into().unwrap() });
        let (answer, _) =
            exchange_at(dispatcher, now, from, 0, Duration::ZERO, &[instruction(Opcode::Hello, 0, &second)]);
        let (status, data) = first_result(&answer);
        assert_eq!(status, Status::Ok);
        decode_hello_answer(&data).unwrap().session
    }

    /// Namespaces of 1 MiB in 4 KiB blocks in `dir`, one per (name, backend), and one worker's
    /// devices on them.
    fn open_namespaces(
        dir: &std::path::Path,
        namespaces: &[(&str, NamespaceBackend)],
    ) -> (Arc<NamespaceTable>, Vec<Box<dyn BlockDevice>>) {
        let configs: Vec<NamespaceConfig> = namespaces
            .iter()
            .map(|&(name, backend)| NamespaceConfig {
                name: name.into(),
                backend,
                path: format!("{name}.img").into(),
                size: Some(ByteSize(1 << 20)),
                block_size: 4096,
            })
            .collect();
        let table = Arc::new(NamespaceTable::open(&configs, dir).unwrap());
        let devices = table.open_devices(9000, netdam_nvme::Submission::Inline).unwrap();
        (table, devices)
    }

    /// Block instructions on a memory region's namespace run in the pass that received them:
    /// the datagram is answered by `handle` itself, in order (a write, then a read of it), with
    /// errors per instruction, and the namespace's request counters move as for queued I/O.
    #[test]
    fn block_instructions_on_a_region_namespace_are_answered_at_once() {
        use netdam_isa::opcode::BWRITE_FLAG_FUA;
        let dir = tempfile::tempdir().unwrap();
        let (namespaces, devices) = open_namespaces(dir.path(), &[("n", NamespaceBackend::Pmem)]);
        let mut dispatcher = dispatcher_serving(namespaces, devices);
        let session = open_session(&mut dispatcher, Instant::ZERO, ME);
        let block = |opcode: Opcode, offset: u64, length: u32, operand: &'static [u8]| Instruction {
            offset,
            length,
            ..instruction(opcode, length, operand)
        };
        static DATA: [u8; 4096] = [0x5A; 4096];
        let write = Instruction { flags: BWRITE_FLAG_FUA, ..block(Opcode::BlockWrite, 3, 1, &DATA) };
        let ops = [
            write,
            block(Opcode::BlockRead, 3, 1, &[]),
            block(Opcode::BlockRead, 256, 1, &[]),
            block(Opcode::BlockRead, 4, 1, &[]),
        ];
        // `exchange_numbered` fails the test unless `handle` answers: nothing was deferred.
        let (answer, _) = exchange_numbered(&mut dispatcher, Instant::ZERO, ME, session, 1, Duration::ZERO, &ops);
        let response = Response::parse(&answer).unwrap();
        let results: Vec<(Status, Vec<u8>)> =
            response.results().map(|result| (result.status, result.data.to_vec())).collect();
        assert_eq!(results[0], (Status::Ok, Vec::new()));
        assert_eq!(results[1], (Status::Ok, DATA.to_vec()), "the read sees the write before it");
        assert_eq!(results[2], (Status::OutOfRange, Vec::new()), "block 256 is past the 1 MiB namespace");
        assert_eq!(results[3], (Status::Ok, vec![0; 4096]));
        assert_eq!(dispatcher.block_pending(), 0);
        assert_eq!(dispatcher.stats().get(Counter::BlockDatagramsDeferred), 0);
        // The refused read never reached the device.
        assert_eq!(dispatcher.stats().get(Counter::BlockRequestsSubmitted), 3);
        let stats = dispatcher.stats();
        assert_eq!((stats.block_submitted[0].get(), stats.block_completed[0].get()), (3, 3));
    }

    /// A datagram that names a namespace that must be waited for (a file) waits as a whole, its
    /// region namespace's instructions included, and is answered in order by `poll_block`.
    #[test]
    fn a_datagram_naming_a_file_namespace_too_waits_as_a_whole() {
        let dir = tempfile::tempdir().unwrap();
        let (namespaces, devices) =
            open_namespaces(dir.path(), &[("mem", NamespaceBackend::Pmem), ("disk", NamespaceBackend::File)]);
        let mut dispatcher = dispatcher_serving(namespaces, devices);
        let session = open_session(&mut dispatcher, Instant::ZERO, ME);
        let read = |space: u16| Instruction { space, offset: 1, length: 1, ..instruction(Opcode::BlockRead, 1, &[]) };
        let mut request = vec![0u8; 256];
        let mut builder = RequestBuilder::new(&mut request, session, 1).unwrap();
        builder.push(&read(0)).unwrap();
        builder.push(&read(1)).unwrap();
        let len = builder.finish();
        let mut out = vec![0u8; 9000];
        let handled =
            dispatcher.handle(Instant::ZERO, peer(ME), Wait::queued(Duration::ZERO), &request[..len], &mut out);
        assert!(matches!(handled, Handled::Deferred(_)), "the file's read must be waited for: {handled:?}");
        assert_eq!(dispatcher.stats().get(Counter::BlockDatagramsDeferred), 1);
        let mut answers = Vec::new();
        for _ in 0..1_000_000 {
            dispatcher.poll_block(&|| Instant::ZERO, &mut |_, answer| answers.push(answer.to_vec()));
            if !answers.is_empty() {
                break;
            }
            std::hint::spin_loop();
        }
        let response = Response::parse(&answers[0]).expect("the datagram was answered");
        let results: Vec<(Status, usize)> =
            response.results().map(|result| (result.status, result.data.len())).collect();
        assert_eq!(results, [(Status::Ok, 4096), (Status::Ok, 4096)]);
    }

    /// A device that queues every request, whatever the one inside it could do at once.
    struct Queued(Box<dyn BlockDevice>);

    impl BlockDevice for Queued {
        fn geometry(&self) -> netdam_nvme::Geometry {
            self.0.geometry()
        }
        fn submit(&mut self, tag: u64, request: BlockRequest) -> Result<(), netdam_nvme::BlockError> {
            self.0.submit(tag, request)
        }
        fn reap(&mut self, on_completion: &mut dyn FnMut(netdam_nvme::Completion)) -> usize {
            self.0.reap(on_completion)
        }
        fn in_flight(&self) -> usize {
            self.0.in_flight()
        }
        fn buffer(&mut self, index: BufferIndex) -> &mut [u8] {
            self.0.buffer(index)
        }
    }

    #[test]
    fn block_answers_of_one_pass_each_report_their_time_until_their_own_hand_over() {
        let dir = tempfile::tempdir().unwrap();
        let (namespaces, devices) = open_namespaces(dir.path(), &[("n", NamespaceBackend::Pmem)]);
        // The region's device, seen as one that queues: its reads wait for `poll_block`.
        let devices = devices.into_iter().map(|device| Box::new(Queued(device)) as Box<dyn BlockDevice>).collect();
        let mut dispatcher = dispatcher_serving(namespaces, devices);
        let session = open_session(&mut dispatcher, Instant::ZERO, ME);
        // Three BREADs, each in a datagram of its own, all waiting for block I/O.
        for sequence in 1..=3u64 {
            let mut request = vec![0u8; 256];
            let mut builder = RequestBuilder::new(&mut request, session, sequence).unwrap();
            builder
                .push(&Instruction { space: 0, offset: sequence, length: 1, ..instruction(Opcode::BlockRead, 1, &[]) })
                .unwrap();
            let len = builder.finish();
            let mut out = vec![0u8; 9000];
            let handled =
                dispatcher.handle(Instant::ZERO, peer(ME), Wait::queued(Duration::ZERO), &request[..len], &mut out);
            assert!(matches!(handled, Handled::Deferred(_)), "a block instruction waits for its device: {handled:?}");
        }
        // The pass starts at 1 ms, and each read of the clock finds it 10 µs later: the answers
        // leave one after another, and each one's service time runs until it is handed over.
        let ticks = std::cell::Cell::new(0u64);
        let clock = || {
            ticks.set(ticks.get() + 1);
            Instant::ZERO + Duration::from_micros(1_000 + 10 * ticks.get())
        };
        let mut service_ns = Vec::new();
        while service_ns.len() < 3 {
            dispatcher.poll_block(&clock, &mut |_, answer| {
                let response = Response::parse(answer).unwrap();
                assert_eq!(response.status(), Status::Ok);
                service_ns.push(response.header.service_time_ns);
            });
            assert!(ticks.get() < 1_000, "the device answers at once");
        }
        let stamped_at_hand_over = service_ns.windows(2).all(|pair| pair[1] > pair[0]);
        assert!(stamped_at_hand_over, "each answer's service time runs to its own send: {service_ns:?}");
        assert!(service_ns[0] > 1_000_000, "and counts from the request's arrival: {service_ns:?}");
    }

    #[test]
    fn a_standing_queue_is_answered_busy_and_not_executed() {
        let mut dispatcher = dispatcher();
        let session = open_session(&mut dispatcher, Instant::ZERO, ME);
        dispatcher.set_backlog(true);
        let add = 1u64.to_le_bytes();
        let fetch_add = |dispatcher: &mut Dispatcher<SoftwareEngine>, at_us: u64, queued_us: u64| {
            let at = Instant::ZERO + Duration::from_micros(at_us);
            let (answer, executed) = exchange_numbered(
                dispatcher,
                at,
                ME,
                session,
                at_us,
                Duration::from_micros(queued_us),
                &[instruction(Opcode::FetchAdd, 8, &add)],
            );
            let answer = Response::parse(&answer).unwrap();
            (answer.status(), answer.header.count, answer.header.queueing_us, executed)
        };

        // The first request past the threshold (1 ms) is a backlog left by a pause: it executes.
        assert_eq!(fetch_add(&mut dispatcher, 10_000, 2_500), (Status::Ok, 1, 2_500, true));
        // Requests have queued past it for the threshold's length, but fewer than four batches
        // of them executed late: the backlog of one window or two, still executed.
        let standing_at = 11_000 + u64::from(crate::overload::MIN_STANDING_REQUESTS) - 1;
        for at_us in 11_000..standing_at {
            assert_eq!(fetch_add(&mut dispatcher, at_us, 2_400), (Status::Ok, 1, 2_400, true), "at {at_us} µs");
        }
        // Four batches executed late over the interval: a standing queue.
        let (status, count, queueing_us, executed) = fetch_add(&mut dispatcher, standing_at, 2_400);
        assert_eq!((status, count, queueing_us), (Status::Busy, 0, 2_400));
        assert!(!executed, "a BUSY answer executes nothing");

        // Once the queue has drained, the same request executes: BUSY left no trace.
        let (status, _, queueing_us, executed) = fetch_add(&mut dispatcher, 11_100, 20);
        assert!(executed);
        assert_eq!((status, queueing_us), (Status::Ok, 20), "the answer reports the queueing it saw");
        assert_eq!(dispatcher.stats().get(Counter::AnsweredBusy), 1);
    }

    #[test]
    fn a_cookie_opens_a_session_only_for_its_own_sender() {
        let mut dispatcher = dispatcher();
        let first = encode_hello_operand(&HelloRequest { max_datagram_bytes: 9000, cookie: NO_COOKIE });
        let (answer, _) = exchange_at(
            &mut dispatcher,
            Instant::ZERO,
            ME,
            0,
            Duration::ZERO,
            &[instruction(Opcode::Hello, 0, &first)],
        );
        let (_, cookie) = first_result(&answer);
        let echoed =
            encode_hello_operand(&HelloRequest { max_datagram_bytes: 9000, cookie: cookie.try_into().unwrap() });
        let hello = [instruction(Opcode::Hello, 0, &echoed)];
        // Replayed from another port: a new cookie for that port, no session.
        let (answer, _) = exchange_at(&mut dispatcher, Instant::ZERO, ME + 1, 0, Duration::ZERO, &hello);
        assert_eq!(first_result(&answer).0, Status::Retry);
        assert_eq!(dispatcher.stats().get(Counter::HelloBadCookie), 1);
        // Too late: a new cookie.
        let late = Instant::ZERO + netdam_isa::limits::COOKIE_LIFETIME + Duration::from_millis(1);
        let (answer, _) = exchange_at(&mut dispatcher, late, ME, 0, Duration::ZERO, &hello);
        assert_eq!(first_result(&answer).0, Status::Retry);
        assert_eq!(dispatcher.stats().get(Counter::HelloExpiredCookie), 1);
        // In time, twice (a retransmission): one session.
        let (one, _) = exchange_at(&mut dispatcher, Instant::ZERO, ME, 0, Duration::ZERO, &hello);
        let (two, _) = exchange_at(&mut dispatcher, Instant::ZERO, ME, 0, Duration::ZERO, &hello);
        let session = |answer: &[u8]| decode_hello_answer(&first_result(answer).1).unwrap().session;
        assert_eq!(session(&one), session(&two));
        assert_eq!(dispatcher.stats().get(Counter::SessionsOpened), 1);
        assert_eq!(dispatcher.stats().get(Counter::CookiesSent), 3);
        // The cookie answer is shorter than the HELLO it answers: no amplification.
        let mut request = vec![0u8; 512];
        let mut builder = RequestBuilder::new(&mut request, 0, 1).unwrap();
        builder.push(&instruction(Opcode::Hello, 0, &first)).unwrap();
        assert!(answer.len() < builder.finish(), "{} bytes answer a HELLO", answer.len());
    }

    #[test]
    fn close_ends_only_the_senders_own_session() {
        let mut dispatcher = dispatcher();
        let session = open_session(&mut dispatcher, Instant::ZERO, ME);
        let close = [instruction(Opcode::Close, 0, &[])];
        let (answer, _) = exchange_at(&mut dispatcher, Instant::ZERO, ME + 1, session, Duration::ZERO, &close);
        assert_eq!(Response::parse(&answer).unwrap().status(), Status::NoSession, "not that sender's session");
        assert_eq!(dispatcher.stats().get(Counter::ClosesIgnored), 1);
        let (answer, _) = exchange_at(&mut dispatcher, Instant::ZERO, 0, 0, Duration::ZERO, &close);
        assert_eq!(Response::parse(&answer).unwrap().status(), Status::NoSession, "no session to close");
        assert_eq!(dispatcher.stats().get(Counter::ClosesIgnored), 2);
        let (answer, _) = exchange_at(&mut dispatcher, Instant::ZERO, ME, session, Duration::ZERO, &close);
        assert_eq!(first_result(&answer), (Status::Ok, Vec::new()));
        assert_eq!(dispatcher.stats().get(Counter::SessionsClosed), 1);
        let read = [instruction(Opcode::Read, 8, &[])];
        let (answer, _) = exchange_at(&mut dispatcher, Instant::ZERO, ME, session, Duration::ZERO, &read);
        assert_eq!(Response::parse(&answer).unwrap().status(), Status::NoSession, "closed");
    }

    #[test]
    fn a_sessionless_answer_is_never_longer_than_its_request() {
        let mut dispatcher = dispatcher();
        let (answer, _) = exchange(&mut dispatcher, 0, Duration::ZERO, instruction(Opcode::Stat, 0, &[]));
        assert_eq!(first_result(&answer), (Status::TooLarge, Vec::new()), "an unpadded STAT would amplify");
        let padding = vec![0u8; 4096 - 56];
        let (answer, _) = exchange(&mut dispatcher, 0, Duration::ZERO, instruction(Opcode::Stat, 0, &padding));
        assert!(answer.len() <= 4096);
        let (status, data) = first_result(&answer);
        assert_eq!(status, Status::Ok);
        let entries = decode_stat_answer(&data).unwrap();
        assert!(entries.iter().any(|(name, _)| name == "sessions_open"));
        let mut dirty = padding.clone();
        dirty[7] = 1;
        let (answer, _) = exchange(&mut dispatcher, 0, Duration::ZERO, instruction(Opcode::Stat, 0, &dirty));
        assert_eq!(first_result(&answer).0, Status::Malformed, "padding is zeroes");
        // In a session the address is proven: no padding needed.
        let session = open_session(&mut dispatcher, Instant::ZERO, ME);
        let (answer, _) = exchange(&mut dispatcher, session, Duration::ZERO, instruction(Opcode::Stat, 0, &[]));
        assert_eq!(first_result(&answer).0, Status::Ok);
    }

    #[test]
    fn stat_counts_sessions_open_opened_closed_and_expired() {
        let mut dispatcher = dispatcher();
        let a = open_session(&mut dispatcher, Instant::ZERO, ME);
        let _b = open_session(&mut dispatcher, Instant::ZERO, ME + 1);
        let close = [instruction(Opcode::Close, 0, &[])];
        exchange_at(&mut dispatcher, Instant::ZERO, ME, a, Duration::ZERO, &close);
        // Session b sent nothing after HELLO: gone within about a second, by the sweep.
        let mut now = Instant::ZERO;
        for _ in 0..2_000 {
            now = now + Duration::from_millis(1);
            dispatcher.tick(now);
        }
        let (answer, _) =
            exchange_at(&mut dispatcher, now, ME, 0, Duration::ZERO, &[instruction(Opcode::Stat, 0, &vec![0; 4000])]);
        let entries = decode_stat_answer(&first_result(&answer).1).unwrap();
        assert_eq!(
            entries.len(),
            TARGET_STAT_ENTRIES + Counter::ALL.len() + Status::ALL.len(),
            "TARGET_STAT_ENTRIES counts what `stat` writes besides counters and statuses (stats.rs asserts the sum fits)"
        );
        let get = |name: &str| entries.iter().find(|(entry, _)| entry == name).map(|(_, value)| *value);
        assert_eq!(get("sessions_opened"), Some(2));
        assert_eq!(get("sessions_closed"), Some(1));
        assert_eq!(get("sessions_expired"), Some(1));
        assert_eq!(get("sessions_open"), Some(0));
        assert_eq!(get("cookies_sent"), Some(2));
    }
}
