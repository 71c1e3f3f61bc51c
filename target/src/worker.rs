//! A worker: one thread, one socket on the shared port, running every request to completion.
//!
//! Each pass takes at most `RECEIVE_BATCH` datagrams (bounded work per pass), executes each and
//! sends its response before taking the next, except under group commit: once a datagram of the
//! pass has written to a durable region, that write and the ones after it are persisted together
//! at the end of the pass, and the answers given meanwhile wait for that persist. All buffers
//! are allocated before the loop starts; inside it there is no allocation and no lock, and the
//! system calls are receive, send, the persist of a persistent region (`msync`), block I/O's
//! `io_uring_enter` (a read's as it is queued unless it continues the one before, the rest
//! once per pass), in adaptive mode a `sched_yield` when a receive finds nothing, and, at the
//! end of a pass that changes between lone requests and load, a `setsockopt` of the received
//! TTL (`Stamps`).

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use netdam_isa::engine::Engine;
use netdam_isa::limits::RECEIVE_BATCH;
use netdam_isa::time::MonotonicClock;
use netdam_isa::wire::{peek_datagram_status, restamp_response};
use netdam_isa::{Duration, Instant, Status};

use crate::block::ReplyTo;
use crate::config::PollMode;
use crate::dispatch::{Dispatcher, Handled, SealFor, Wait};
use crate::sessions::RecordTicket;
use crate::socket::{self, ReceiveBatch};
use crate::stats::{Counter, WorkerStats};
use netdam_udp::Train;

/// A yield that returns later than this lost the core to a CPU-bound thread: a runnable
/// thread that sends requests (fio, an NBD export) takes microseconds before it blocks again.
const LOST_YIELD: Duration = Duration::from_micros(500);

/// How long an adaptive worker that lost a yield blocks on an empty socket instead of yielding.
const CONTENDED_FOR: Duration = Duration::from_millis(100);

/// How one worker runs.
#[derive(Debug, Clone, Copy)]
pub struct WorkerSettings {
    /// How it waits for datagrams.
    pub poll: PollMode,
    /// In adaptive mode, how long it spins after the last datagram before blocking.
    pub adaptive_spin: Duration,
    /// Largest datagram received or sent.
    pub max_datagram_bytes: usize,
    /// Answers of one pass to one peer leave in trains (`netdam_udp::Train`).
    pub answer_trains: bool,
    /// The clock every worker of the target reads (one origin for all).
    pub clock: MonotonicClock,
}

/// Runs a worker until `shutdown` is set.
pub fn run<E: Engine>(fd: OwnedFd, mut dispatcher: Dispatcher<E>, settings: WorkerSettings, shutdown: Arc<AtomicBool>) {
    // `/metrics` reads this thread's context switches while it runs, and never after: its id
    // may go to another thread once it ends, however it ends.
    let _thread_id = ThreadIdRecord::new(dispatcher.all_stats(), dispatcher.worker_index());
    let mut batch = ReceiveBatch::new(settings.max_datagram_bytes);
    let mut out = vec![0u8; settings.max_datagram_bytes];
    let mut held = HeldAnswers::new(settings.max_datagram_bytes);
    let mut train = Train::new(&fd, settings.answer_trains);
    let clock = settings.clock;
    // Last datagram received or block answer sent.
    let mut last_datagram = clock.now();
    // Adaptive mode: until when the core counts as contended (a yield lost it for long), so the
    // worker blocks as soon as the socket is empty instead of yielding (see below).
    let mut contended_until = Instant::ZERO;
    // When the worker last finished a pass with datagrams (CLOCK_REALTIME ns, the clock of the
    // kernel's receive timestamps): a datagram that arrived later did not wait behind work.
    let mut free_since_ns = 0u64;
    // How many datagrams the next receive asks for. `recvmmsg` tries the socket once more after
    // the last datagram it returns, and that failed try (another pass through the kernel's
    // receive path) delays every answer of the batch; a lone request that found the worker idle
    // is answered sooner by a receive of one (docs/DECISIONS.md). Any sign of load asks for a
    // whole batch again.
    let mut receive_limit = RECEIVE_BATCH;
    // The received TTL is read unless a busy-polling worker serves lone requests (`Stamps`).
    let mut stamps = Stamps::new(&fd);
    while !shutdown.load(Ordering::Relaxed) {
        let pass_start = clock.now();
        // Session expiry: a bounded share of the table, at most once per sweep interval.
        dispatcher.tick(pass_start);
        // While block I/O is in flight the worker must come back to reap it: it never sleeps.
        let wait = dispatcher.block_pending() == 0
            && match settings.poll {
                PollMode::Busy => false,
                PollMode::Blocking => true,
                PollMode::Adaptive => {
                    pass_start < contended_until || pass_start.saturating_since(last_datagram) > settings.adaptive_spin
                }
            };
        if wait {
            // A worker about to sleep must see how long its wake-up took.
            stamps.turn_on();
        }
        let received =
            if stamps.on() || wait { batch.receive(&fd, wait, receive_limit) } else { batch.receive_unstamped(&fd) };
        let count = match received {
            // Woken by a stop (`Target::stop` shuts the socket's receive side, and every waiting
            // receive returns at once from then on): what it returned is no datagram. Datagrams
            // that arrived meanwhile go unanswered, as they would a moment later.
            Ok(_) if wait && shutdown.load(Ordering::Relaxed) => break,
            Ok(count) => count,
            Err(error) => {
                match error.raw_os_error() {
                    Some(libc::EAGAIN) | Some(libc::EINTR) => {}
                    _ => {
                        dispatcher.count(Counter::ReceiveErrors);
                        tracing::warn!(%error, "receive failed");
                    }
                }
                stamps.found_empty(pass_start);
                if poll_block(&fd, &mut dispatcher, &clock, &mut train) > 0 {
                    last_datagram = clock.now();
                    stamps.busy();
                }
                if !wait {
                    if settings.poll == PollMode::Adaptive {
                        // Spinning on a shared core starves whoever would send the next
                        // request (an NBD export, fio, a client on this machine): give the core
                        // to any runnable thread between empty polls. Measured with `netdam nbd`
                        // at depth 32: 30-36k IOPS and 8-10 ms p99.9 without, 96-111k and 1.7 ms
                        // with (docs/DECISIONS.md). Busy polling keeps its core to itself.
                        // But a yield hands the core to a CPU-bound thread for its whole slice
                        // (milliseconds), and a pinned worker cannot move away: each yield then
                        // adds that slice to the next request's latency. A sleeping worker is
                        // woken by the datagram's arrival instead, ahead of such a thread. So
                        // once a yield comes back late, block whenever the socket is empty for
                        // a while (docs/DECISIONS.md).
                        let yielded_at = clock.now();
                        // SAFETY: sched_yield takes no arguments and cannot fail on Linux.
                        unsafe { libc::sched_yield() };
                        let back = clock.now();
                        if back.saturating_since(yielded_at) > LOST_YIELD {
                            contended_until = back + CONTENDED_FOR;
                            dispatcher.count(Counter::ContendedYields);
                        }
                    }
                    std::hint::spin_loop();
                }
                continue;
            }
        };
        let received_at = clock.now();
        last_datagram = received_at;
        // Unstamped, all the worker knows of the datagram's wait is that it arrived after the
        // last empty poll began; when a pass with datagrams came in between, it may have waited
        // behind that work too.
        let unstamped_wait = stamps.bound(received_at);
        let lone = count == 1
            && match unstamped_wait {
                None => batch.get(0).0.arrived_idle(free_since_ns),
                Some((_, behind_work)) => !behind_work,
            };
        receive_limit = if lone { 1 } else { RECEIVE_BATCH };
        // The kernel's timestamps are read against this clock; unstamped, they are not read.
        let received_at_realtime_ns = if unstamped_wait.is_none() { socket::realtime_ns() } else { 0 };
        stamps.after_receive(lone, received_at);
        // Group commit: the pass's writes to durable regions are persisted once, at its end,
        // and every answer given after the first such write waits for that persist.
        dispatcher.set_group_commit(true);
        // A whole batch means more datagrams wait in the socket: only then can BUSY shed load.
        dispatcher.set_backlog(count == RECEIVE_BATCH);
        for index in 0..count {
            let (received, datagram) = batch.get(index);
            if received.truncated {
                dispatcher.count(Counter::DatagramsReceived);
                dispatcher.count(Counter::DroppedOversized);
                continue;
            }
            // Waited: in the kernel's socket queue, then behind earlier datagrams of this batch;
            // all of it is the target's time (the service time reported). Queueing is the part
            // spent behind other work: the socket wait until the previous pass ended, and the
            // wait in this batch. The rest of the socket wait is the worker waking up or getting
            // its core back (a contended machine); an initiator sending less would not shorten
            // it, so it neither shrinks endpoint windows nor earns a BUSY.
            // The first of the batch starts when the receive returned (one clock read fewer).
            let started = if index == 0 { received_at } else { clock.now() };
            if train.due(started) {
                // The train's first answer has waited long enough for others to join.
                flush_train(&fd, &dispatcher, &mut train);
            }
            let (in_kernel, behind_work) = if received.kernel_realtime_ns == 0 {
                match unstamped_wait {
                    Some((bound, true)) => (bound, bound),
                    Some((bound, false)) => (bound, Duration::ZERO),
                    None => (Duration::ZERO, Duration::ZERO),
                }
            } else {
                let arrived = received.kernel_realtime_ns;
                (
                    Duration::from_nanos(received_at_realtime_ns.saturating_sub(arrived)),
                    Duration::from_nanos(free_since_ns.min(received_at_realtime_ns).saturating_sub(arrived)),
                )
            };
            let in_batch = started.saturating_since(received_at);
            let waited = in_kernel + in_batch;
            let queueing = behind_work + in_batch;
            let Some(peer) = batch.peer(index) else {
                // recvmmsg fills an IP sender for every datagram of a UDP socket.
                dispatcher.count(Counter::DatagramsReceived);
                dispatcher.count(Counter::ReceiveErrors);
                continue;
            };
            let from = ReplyTo { peer, ttl: received.ttl };
            // `executed`: the answer may depend on this pass's writes; a replayed answer (of an
            // earlier pass, so durable) or a refusal (nothing ran) does not wait for them.
            let (len, record, executed) =
                match dispatcher.handle(started, from, Wait { total: waited, queueing }, datagram, &mut out) {
                    Handled::Dropped => continue,
                    Handled::Replay(len) => (len, None, false),
                    Handled::Deferred(_) => continue,
                    Handled::Answer { response, record } => {
                        let held_for = waited + clock.now().saturating_since(started);
                        let service_time_ns = u32::try_from(held_for.as_nanos()).unwrap_or(u32::MAX);
                        // Datagrams of this batch still waiting behind this one: the worker's queue.
                        let queue_depth = (count - 1 - index) as u16;
                        let len = if dispatcher.will_seal() {
                            response.finish_sealed(received.ttl, service_time_ns, queue_depth)
                        } else {
                            response.finish(received.ttl, service_time_ns, queue_depth)
                        };
                        let executed = peek_datagram_status(&out[..len]) == Some(Status::Ok as u8);
                        // A held answer's service time is recorded when it leaves, persist included.
                        if executed && !dispatcher.persist_is_pending() {
                            dispatcher.observe_service(dispatcher.current_opcode(), held_for);
                        }
                        (len, record, executed)
                    }
                };
            // An authenticated session's answer is sealed once it is final: now, or after the
            // group commit restamps it.
            let seal = dispatcher.take_seal();
            if executed && dispatcher.persist_is_pending() {
                if let Some((ticket, _)) = record {
                    dispatcher.hold(ticket);
                }
                // Its service time is restamped when it leaves: the persist is part of it, and
                // an initiator that saw it as network delay would shrink its fabric window.
                let service_from = Instant::from_nanos(started.as_nanos().saturating_sub(waited.as_nanos()));
                let opcode = dispatcher.current_opcode();
                held.push(Held { index, len, service_from, record, opcode, seal }, &out[..len]);
                dispatcher.count(Counter::AnswersHeld);
                continue;
            }
            let len = match seal {
                None => len,
                Some(seal) => match dispatcher.seal(seal, &mut out, len) {
                    Some(sealed) => sealed,
                    // Its session ended in this very datagram (a CLOSE): nothing to answer with.
                    None => continue,
                },
            };
            if let Some((ticket, store_answer)) = record {
                dispatcher.record(ticket, store_answer.then_some(&out[..len]));
            }
            give_answer(&fd, &batch, &dispatcher, &mut train, count, index, &out[..len], started);
        }
        // The pass's answers leave before its persist, which only the held ones wait for.
        flush_train(&fd, &dispatcher, &mut train);
        dispatcher.set_group_commit(false);
        if !held.is_empty() || dispatcher.persist_is_pending() {
            let persisted = dispatcher.persist_pending();
            dispatcher.count(Counter::GroupCommits);
            if persisted.is_err() {
                dispatcher.count(Counter::GroupCommitFailures);
            }
            let now = clock.now();
            for (entry, slot) in held.drain() {
                let service = now.saturating_since(entry.service_from);
                dispatcher.observe_service(entry.opcode, service);
                let service_ns = u32::try_from(service.as_nanos()).unwrap_or(u32::MAX);
                // The writes may not be durable: then nothing held may say it succeeded.
                restamp_response(&mut slot[..entry.len], service_ns, persisted.err().map(|_| Status::IoError));
                let len = match entry.seal {
                    None => entry.len,
                    Some(seal) => match dispatcher.seal(seal, slot, entry.len) {
                        Some(sealed) => sealed,
                        None => continue,
                    },
                };
                let answer = &slot[..len];
                if let Some((ticket, store_answer)) = entry.record {
                    dispatcher.record(ticket, store_answer.then_some(answer));
                }
                give_answer(&fd, &batch, &dispatcher, &mut train, count, entry.index, answer, now);
            }
            flush_train(&fd, &dispatcher, &mut train);
        }
        if poll_block(&fd, &mut dispatcher, &clock, &mut train) > 0 {
            last_datagram = clock.now();
        }
        free_since_ns = socket::realtime_ns();
        // Switches the received TTL on or off where this pass asks for it: after its answers.
        stamps.settle(settings.poll == PollMode::Busy);
    }
}

/// Records the calling thread's id in worker `index`'s stats for as long as it lives (a worker
/// that panics unwinds through its drop too).
struct ThreadIdRecord {
    stats: Arc<[WorkerStats]>,
    index: usize,
}

impl ThreadIdRecord {
    fn new(stats: Arc<[WorkerStats]>, index: usize) -> ThreadIdRecord {
        // SAFETY: gettid takes no arguments and cannot fail; a thread id is positive.
        stats[index].set_thread_id(unsafe { libc::gettid() } as u32);
        ThreadIdRecord { stats, index }
    }
}

impl Drop for ThreadIdRecord {
    fn drop(&mut self) {
        self.stats[self.index].set_thread_id(0);
    }
}

/// Lone requests in a row after which a busy-polling worker stops reading the received TTL.
const LONE_PASSES_TO_UNSTAMP: u32 = 32;

/// How long a worker stays unstamped before it reads TTLs again (a new initiator's hop count,
/// a changed route).
const UNSTAMPED_FOR: Duration = Duration::from_millis(100);

/// Whether the worker reads control messages (the TTL, the kernel's receive timestamp), and
/// what bounds a datagram's wait when it does not.
///
/// The control messages and the `recvmmsg` that reads them cost ~0.4 µs per datagram more than
/// a plain `recvfrom` here, a fifteenth of a small request's round trip (docs/DECISIONS.md,
/// "The median to the floor, second round"). A busy-polling worker serving one request at a
/// time does not need them: a datagram received right after an empty poll arrived after that
/// poll began, which bounds its wait to one poll, and it waited behind no work. So after
/// `LONE_PASSES_TO_UNSTAMP` such passes the worker turns the TTL off and receives with
/// `recvfrom`, which reads no control data; answers then carry TTL 0 ("unknown": initiators
/// keep the last one they saw). Any sign of load (a datagram that may have waited behind
/// work), or `UNSTAMPED_FOR` passing, turns it on again. Only busy polling: an adaptive
/// worker's empty polls include its yields, which would count as the next request's wait.
/// (Timestamps stay on: see `socket::bind_shared`.)
struct Stamps {
    fd: std::os::fd::RawFd,
    ipv4: bool,
    on: bool,
    /// When the last receive that found the socket empty began.
    last_empty_at: Option<Instant>,
    /// Whether the worker did work (datagrams, block answers) since then.
    work_since_empty: bool,
    lone_passes: u32,
    off_since: Instant,
    /// What the last pass asks for: the TTL on (`Some(true)`) or off, at the pass's end.
    wanted: Option<bool>,
    /// When the last pass received.
    pass_at: Instant,
    /// A `setsockopt` was refused: the worker stays as it is, and says so once.
    refused: bool,
}

impl Stamps {
    fn new(fd: &OwnedFd) -> Stamps {
        use std::os::fd::AsRawFd;
        let ipv4 = socket::local_addr(fd).map_or(true, |addr| addr.is_ipv4());
        Stamps {
            fd: fd.as_raw_fd(),
            ipv4,
            on: true,
            last_empty_at: None,
            work_since_empty: true,
            lone_passes: 0,
            off_since: Instant::ZERO,
            wanted: None,
            pass_at: Instant::ZERO,
            refused: false,
        }
    }

    fn on(&self) -> bool {
        self.on
    }

    /// A receive that began at `at` found the socket empty.
    fn found_empty(&mut self, at: Instant) {
        self.last_empty_at = Some(at);
        self.work_since_empty = false;
    }

    /// The worker did work outside a receive pass (it sent block answers).
    fn busy(&mut self) {
        self.work_since_empty = true;
    }

    /// Unstamped: the longest the datagram received at `received_at` can have waited, and
    /// whether it may have waited behind work. `None` when stamps are on.
    fn bound(&self, received_at: Instant) -> Option<(Duration, bool)> {
        if self.on {
            return None;
        }
        let bound = self.last_empty_at.map_or(Duration::ZERO, |at| received_at.saturating_since(at));
        Some((bound, self.work_since_empty))
    }

    /// After receiving a pass's datagrams at `now`: whether it was `lone` (one datagram that
    /// found the worker idle). What it asks for is done by `settle`, after the answers.
    fn after_receive(&mut self, lone: bool, now: Instant) {
        self.work_since_empty = true;
        self.pass_at = now;
        self.lone_passes = if lone { self.lone_passes.saturating_add(1) } else { 0 };
        self.wanted = if self.on {
            (self.lone_passes >= LONE_PASSES_TO_UNSTAMP).then_some(false)
        } else {
            (!lone || now.saturating_since(self.off_since) > UNSTAMPED_FOR).then_some(true)
        };
    }

    /// At the end of a pass: turns the TTL off or on as the pass asked; off only for a worker
    /// that `may_unstamp` (busy polling).
    fn settle(&mut self, may_unstamp: bool) {
        match self.wanted.take() {
            Some(false) if may_unstamp && self.set(false) => self.off_since = self.pass_at,
            Some(true) => self.turn_on(),
            _ => {}
        }
    }

    /// Turns the received TTL on again (if it is off).
    fn turn_on(&mut self) {
        if !self.on {
            self.set(true);
            self.lone_passes = 0;
        }
    }

    /// Sets the received TTL; whether it worked. A refusal leaves it as it was (an unstamped
    /// worker then stays on its bounds) and stops further tries.
    fn set(&mut self, on: bool) -> bool {
        if self.refused {
            return false;
        }
        match socket::set_receive_ttl(self.fd, self.ipv4, on) {
            Ok(()) => {
                self.on = on;
                true
            }
            Err(error) => {
                self.refused = true;
                tracing::warn!(%error, on, "cannot switch the received TTL; leaving it as it is");
                false
            }
        }
    }
}

/// Sends the answer to datagram `index` of a batch of `count`, counted first, so whoever has
/// received an answer also sees it counted. A lone datagram's answer leaves at once; in a batch
/// it joins the pass's train at `now` (`flush_train` sends what waits). An answer waits there
/// for the pass's later answers, at most `TRAIN_WAIT` and one datagram's execution, which its
/// service time does not include; the train saves each later answer its own walk down the
/// kernel's stack (~2.5 µs of ~3.4 for 4 KiB, docs/DECISIONS.md). With trains off, `push`
/// sends at once, after anything still waiting, so the order holds.
#[allow(clippy::too_many_arguments)]
fn give_answer<E: Engine>(
    fd: &OwnedFd,
    batch: &ReceiveBatch,
    dispatcher: &Dispatcher<E>,
    train: &mut Train,
    count: usize,
    index: usize,
    answer: &[u8],
    now: Instant,
) {
    dispatcher.count(Counter::ResponsesSent);
    let failed = match batch.peer(index) {
        Some(peer) if count > 1 => train.push(fd, peer, answer, now),
        _ => u64::from(batch.reply(fd, index, answer).is_err()),
    };
    if failed > 0 {
        dispatcher.stats().add(Counter::SendErrors, failed);
    }
}

/// Sends the answers waiting in the train, and counts what went (trains `push` sent too).
fn flush_train<E: Engine>(fd: &OwnedFd, dispatcher: &Dispatcher<E>, train: &mut Train) {
    if train.waiting() > 0 {
        let failed = train.flush(fd);
        if failed > 0 {
            dispatcher.stats().add(Counter::SendErrors, failed);
        }
    }
    let trains = train.take_trains_sent();
    if trains > 0 {
        dispatcher.stats().add(Counter::AnswerTrains, trains);
    }
}

/// One answer held for the pass's group commit.
#[derive(Debug, Clone, Copy)]
struct Held {
    /// Its datagram's index in the batch.
    index: usize,
    len: usize,
    /// When its service time began (its arrival in the kernel's queue).
    service_from: Instant,
    record: Option<(RecordTicket, bool)>,
    /// Its datagram's label in the service-time histogram.
    opcode: u8,
    /// The session whose keys seal it after the restamp.
    seal: Option<SealFor>,
}

/// Answers of one receive pass held for its group commit, in a buffer allocated once.
struct HeldAnswers {
    /// `RECEIVE_BATCH` slots of the largest datagram.
    buffer: Vec<u8>,
    slot_bytes: usize,
    entries: [Held; RECEIVE_BATCH],
    len: usize,
}

impl HeldAnswers {
    fn new(slot_bytes: usize) -> HeldAnswers {
        let empty = Held { index: 0, len: 0, service_from: Instant::ZERO, record: None, opcode: 0, seal: None };
        HeldAnswers {
            buffer: vec![0u8; slot_bytes * RECEIVE_BATCH],
            slot_bytes,
            entries: [empty; RECEIVE_BATCH],
            len: 0,
        }
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Keeps a copy of an answer; a pass has at most `RECEIVE_BATCH` datagrams, so there is room.
    fn push(&mut self, entry: Held, answer: &[u8]) {
        let start = self.len * self.slot_bytes;
        self.buffer[start..start + answer.len()].copy_from_slice(answer);
        self.entries[self.len] = entry;
        self.len += 1;
    }

    /// The held answers in the order they were given, each with its whole slot (the answer is
    /// its first `len` bytes; the rest is room for a trailer); empties the list.
    fn drain(&mut self) -> impl Iterator<Item = (Held, &mut [u8])> {
        let len = std::mem::take(&mut self.len);
        let entries = &self.entries[..len];
        self.buffer.chunks_mut(self.slot_bytes).zip(entries).map(|(slot, &entry)| (entry, slot))
    }
}

/// Reaps block completions and sends the answers they finish; returns how many it sent. An
/// answer counts as activity for adaptive polling: the initiator's next request usually follows
/// it within the spin time, and a sleeping worker would add a wake-up to it.
fn poll_block<E: Engine>(
    fd: &OwnedFd,
    dispatcher: &mut Dispatcher<E>,
    clock: &MonotonicClock,
    train: &mut Train,
) -> usize {
    if dispatcher.block_pending() == 0 {
        return 0;
    }
    let mut failed = 0;
    // The answers a reap finishes leave together, in trains to each initiator (none waiting
    // longer than `TRAIN_WAIT` for the others).
    let sent = dispatcher.poll_block(&|| clock.now(), &mut |reply_to, answer| {
        let now = clock.now();
        if train.due(now) {
            failed += train.flush(fd);
        }
        failed += train.push(fd, reply_to.peer, answer, now);
    });
    if failed > 0 {
        dispatcher.stats().add(Counter::SendErrors, failed);
    }
    flush_train(fd, dispatcher, train);
    sent
}

/// The CPUs this process may run on, in order.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is a plain bit set; sched_getaffinity fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return Vec::new();
    }
    (0..libc::CPU_SETSIZE as usize).filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) }).collect()
}

/// The CPU worker `index` is pinned to among the `allowed` CPUs (with `pin_workers`): counted
/// from the last, wrapping (docs/DECISIONS.md, "Workers are pinned"). `None` when no CPU is
/// allowed.
pub fn worker_cpu(allowed: &[usize], index: usize) -> Option<usize> {
    (!allowed.is_empty()).then(|| allowed[allowed.len() - 1 - index % allowed.len()])
}

/// The `allowed` CPUs but the one worker `index` is pinned to (`worker_cpu`): where its block
/// helpers, or a client beside a target, keep off its core. Empty when it has the only one.
pub fn cpus_beside_worker(allowed: &[usize], index: usize) -> Vec<usize> {
    let worker = worker_cpu(allowed, index);
    allowed.iter().copied().filter(|&cpu| Some(cpu) != worker).collect()
}

/// Lets the calling thread (and the threads it starts later) run on `cpus` only. It allocates
/// nothing and takes no lock, so a child process may call it between `fork` and `exec`.
pub fn set_affinity(cpus: &[usize]) -> std::io::Result<()> {
    // SAFETY: as above; the set names the CPUs given (those past CPU_SETSIZE are left out).
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus.iter().filter(|&&cpu| cpu < libc::CPU_SETSIZE as usize) {
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Pins the calling thread (worker `index`) to `cpu`; logs and goes on unpinned if refused.
pub fn pin_to_cpu(index: usize, cpu: usize) {
    match set_affinity(&[cpu]) {
        Err(error) => tracing::warn!(worker = index, cpu, %error, "cannot pin worker to its CPU; it runs unpinned"),
        Ok(()) => tracing::debug!(worker = index, cpu, "worker pinned"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the socket delivers the received TTL now.
    fn receives_ttl(fd: &OwnedFd) -> bool {
        use std::os::fd::AsRawFd;
        netdam_udp::int_option(fd.as_raw_fd(), libc::IPPROTO_IP, libc::IP_RECVTTL).expect("the option reads") != 0
    }

    fn at_us(us: u64) -> Instant {
        Instant::from_nanos(us * 1_000)
    }

    #[test]
    fn workers_are_placed_from_the_last_allowed_cpu_backwards() {
        assert_eq!(worker_cpu(&[], 0), None);
        assert_eq!(worker_cpu(&[0, 1], 0), Some(1));
        assert_eq!(worker_cpu(&[0, 1], 1), Some(0));
        assert_eq!(worker_cpu(&[0, 1], 2), Some(1));
        assert_eq!(worker_cpu(&[2, 5, 7], 1), Some(5));
        assert_eq!(cpus_beside_worker(&[0, 1], 0), vec![0]);
        assert_eq!(cpus_beside_worker(&[2, 5, 7], 1), vec![2, 7]);
        assert_eq!(cpus_beside_worker(&[3], 0), Vec::<usize>::new());
    }

    #[test]
    fn lone_requests_turn_the_ttl_off_and_load_or_time_turns_it_on_again() {
        let fd = socket::bind_shared("127.0.0.1:0".parse().unwrap()).unwrap();
        let mut stamps = Stamps::new(&fd);
        assert!(stamps.on() && receives_ttl(&fd));
        assert_eq!(stamps.bound(at_us(1)), None, "stamped: the kernel's stamps tell the wait");
        let mut now = 10;
        for pass in 0..LONE_PASSES_TO_UNSTAMP {
            assert!(stamps.on(), "still on after {pass} lone passes");
            stamps.found_empty(at_us(now));
            now += 2;
            stamps.after_receive(true, at_us(now));
            stamps.settle(true);
        }
        assert!(!stamps.on() && !receives_ttl(&fd), "{LONE_PASSES_TO_UNSTAMP} lone passes turn it off");

        // A datagram right after an empty poll waited at most since that poll began, behind nothing.
        stamps.found_empty(at_us(now));
        assert_eq!(stamps.bound(at_us(now + 3)), Some((Duration::from_micros(3), false)));
        stamps.after_receive(true, at_us(now + 3));
        stamps.settle(true);
        // The next one came without an empty poll between: it may have waited behind that work.
        assert_eq!(stamps.bound(at_us(now + 5)), Some((Duration::from_micros(5), true)));
        stamps.after_receive(false, at_us(now + 5));
        assert!(!stamps.on(), "switched only at the end of the pass");
        stamps.settle(true);
        assert!(stamps.on() && receives_ttl(&fd), "load turns it on again");

        // Block answers sent after an empty poll count as work too.
        stamps.found_empty(at_us(now));
        stamps.busy();
        stamps.set(false);
        assert_eq!(stamps.bound(at_us(now + 1)).map(|(_, behind)| behind), Some(true));

        // Unstamped for longer than UNSTAMPED_FOR: on again, to read a new initiator's TTL.
        let mut stamps = Stamps::new(&fd);
        for _ in 0..LONE_PASSES_TO_UNSTAMP {
            stamps.found_empty(at_us(now));
            stamps.after_receive(true, at_us(now));
            stamps.settle(true);
        }
        assert!(!stamps.on());
        stamps.found_empty(at_us(now));
        stamps.after_receive(true, at_us(now) + UNSTAMPED_FOR + Duration::from_micros(1));
        stamps.settle(true);
        assert!(stamps.on() && receives_ttl(&fd));

        // A worker that does not busy-poll never goes unstamped; one about to sleep turns it on.
        let mut stamps = Stamps::new(&fd);
        for _ in 0..2 * LONE_PASSES_TO_UNSTAMP {
            stamps.found_empty(at_us(now));
            stamps.after_receive(true, at_us(now));
            stamps.settle(false);
        }
        assert!(stamps.on());
        stamps.found_empty(at_us(now));
        stamps.after_receive(true, at_us(now));
        stamps.settle(true);
        assert!(!stamps.on());
        stamps.turn_on();
        assert!(stamps.on() && receives_ttl(&fd));
    }
}
