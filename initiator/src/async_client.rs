//! The async client: cheap to clone, any number of tasks issue requests concurrently, and one I/O
//! task owns the socket and the session and completes each request's future. When the last
//! handle is dropped the I/O task finishes what is in flight, closes the session and ends (if
//! the runtime shuts down first, the session expires on the target instead).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use netdam_isa::control::{decode_stat_answer, HelloAnswer, RegionInfo};
use netdam_isa::limits::{DEFAULT_DATAGRAM_BYTES, MAX_DATAGRAM_BYTES, MAX_LONG_INSTRUCTION_BYTES};
use netdam_isa::time::MonotonicClock;
use netdam_isa::wire::{HEADER_LEN, INSTRUCTION_HEADER_LEN, RESPONSE_INSTRUCTION_HEADER_LEN};
use netdam_isa::{Duration, Instant, LaneType, Opcode};
use netdam_udp::Train;
use tokio::io::Interest;
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, oneshot, watch};

use crate::client::{
    adaptive_spin_for, connected_socket, fit_window_to_socket_buffers, send_due, send_failure, warn_still_trying,
    ClientOptions, ClientPoll, CLOSE_WAIT, HELLO_PATIENCE_NOTICE,
};
use crate::error::ClientError;
use crate::metrics::SessionMetrics;
use crate::op::Op;
use crate::session::{Reply, Session, SessionConfig};
use crate::stamped;
use crate::target_info::{check_byte_range, chunks, crc_result, word_result, TargetInfo};

/// Requests waiting for the I/O task beyond the session window: back-pressure to callers.
const COMMAND_QUEUE: usize = 1024;

/// Requests in a row, each arriving with nothing else in flight, after which the I/O task
/// spins for the answer of the next (`Driver::spin_for_a_lone_answer`).
const LONE_REQUESTS_TO_SPIN: u32 = 4;

/// Completion token of the I/O task's CLOSE (callers' tokens count up from 0).
const CLOSE_TOKEN: u64 = u64::MAX;

struct Command {
    ops: Vec<Op>,
    reply: oneshot::Sender<Result<Reply, ClientError>>,
}

/// An async session with one target. Dropping the last handle closes the session.
#[derive(Debug, Clone)]
pub struct AsyncClient {
    commands: mpsc::Sender<Command>,
    info: TargetInfo,
    /// Ends (its sender is dropped) when the I/O task has finished.
    finished: watch::Receiver<()>,
    /// Requests its callers have outstanding (shared by a volume's sessions); counted only
    /// where the I/O task may spin for a lone answer, the one reader of the count.
    outstanding: Option<Arc<AtomicUsize>>,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Command").field("ops", &self.ops.len()).finish()
    }
}

/// A request handed to the I/O task, whose answer is still to come.
#[derive(Debug)]
pub struct Pending {
    answer: oneshot::Receiver<Result<Reply, ClientError>>,
    _outstanding: Option<Outstanding>,
}

impl Pending {
    /// Waits for the answer.
    pub async fn wait(self) -> Result<Reply, ClientError> {
        let Pending { answer, _outstanding } = self;
        answer.await.map_err(|_| ClientError::Closed)?
    }
}

/// Counts a caller's request from its submission until its answer is taken or given up, in a
/// count shared by the sessions of one `Volume`: an I/O task reads it to tell a caller that
/// waits for each answer (one request outstanding in all) from a deeper one spread over
/// several sessions.
#[derive(Debug)]
struct Outstanding(Arc<AtomicUsize>);

impl Outstanding {
    fn new(count: &Arc<AtomicUsize>) -> Outstanding {
        count.fetch_add(1, Ordering::Relaxed);
        Outstanding(count.clone())
    }
}

impl Drop for Outstanding {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl AsyncClient {
    /// Connects, starts the I/O task on the current runtime, and says HELLO.
    pub async fn connect(addr: SocketAddr) -> Result<AsyncClient, ClientError> {
        AsyncClient::connect_with(addr, ClientOptions::default()).await
    }

    /// As [`AsyncClient::connect`], with options. The I/O task waits in the runtime; with
    /// `ClientPoll::Adaptive` or `Busy` it also spins for the answer of a caller that sends one
    /// request at a time (`Driver::spin_for_a_lone_answer`), and with `Blocking` it never spins.
    pub async fn connect_with(addr: SocketAddr, options: ClientOptions) -> Result<AsyncClient, ClientError> {
        AsyncClient::connect_observed(addr, options, None).await
    }

    /// As [`AsyncClient::connect_with`], recording every completion and the session's state in
    /// `metrics` (written by this client's I/O task only).
    pub async fn connect_observed(
        addr: SocketAddr,
        options: ClientOptions,
        metrics: Option<Arc<SessionMetrics>>,
    ) -> Result<AsyncClient, ClientError> {
        AsyncClient::connect_sharing(addr, options, metrics, Arc::new(AtomicUsize::new(0))).await
    }

    /// As [`AsyncClient::connect_observed`], counting its callers' outstanding requests in
    /// `outstanding`, which the sessions of one `Volume` share.
    pub(crate) async fn connect_sharing(
        addr: SocketAddr,
        options: ClientOptions,
        metrics: Option<Arc<SessionMetrics>>,
        outstanding: Arc<AtomicUsize>,
    ) -> Result<AsyncClient, ClientError> {
        let prepared = options.session.check().and_then(|()| {
            let socket = connected_socket(addr, options.local_addr)?;
            socket.set_nonblocking(true)?;
            Ok(UdpSocket::from_std(socket)?)
        });
        let socket = match prepared {
            Ok(socket) => socket,
            Err(error) => {
                // No task will own the shard: it must not count as a session kept.
                if let Some(metrics) = &metrics {
                    metrics.ended();
                }
                return Err(error);
            }
        };
        let session_config = fit_window_to_socket_buffers(&socket2::SockRef::from(&socket), options.session);
        let (commands, receiver) = mpsc::channel(COMMAND_QUEUE);
        let mut session =
            Session::new(SessionConfig { max_datagram_bytes: DEFAULT_DATAGRAM_BYTES, ..session_config }, 0);
        session.start_hello(options.session.max_datagram_bytes as u32);
        let (established, answer) = oneshot::channel();
        // Set by the task once the target answers anything while the session opens (refusals
        // for want of a slot, asked again for `session_wait`, included).
        let heard = Arc::new(AtomicBool::new(false));
        let (finishing, finished) = watch::channel(());
        // Only a session that may spin for a lone answer reads the count.
        let outstanding = (options.poll != ClientPoll::Blocking).then_some(outstanding);
        let driver = Driver {
            _finishing: finishing,
            train: Train::new(&socket, options.request_trains).connected_to(addr),
            lone_requests: 0,
            outstanding: outstanding.clone(),
            socket,
            session,
            addr,
            clock: MonotonicClock::new(),
            waiting: HashMap::new(),
            backlog: VecDeque::new(),
            next_token: 0,
            connecting: Some(established),
            connecting_heard: Some(heard.clone()),
            connect_abandoned: false,
            block_bytes: Vec::new(),
            metrics,
            silent_since: None,
        };
        tokio::spawn(driver.run(receiver));
        let mut answer = answer;
        let hello = loop {
            match tokio::time::timeout(HELLO_PATIENCE_NOTICE.to_std(), &mut answer).await {
                Ok(answered) => break answered,
                // Answered, not silent: a session refused a slot waits for one.
                Err(_) if heard.load(Ordering::Relaxed) => continue,
                Err(_) => {
                    // The session keeps trying until its attempts run out; a user waiting on a
                    // silent command learns why.
                    warn_still_trying(addr, false);
                    break answer.await;
                }
            }
        };
        let hello = hello.map_err(|_| ClientError::Closed)??;
        Ok(AsyncClient { commands, info: TargetInfo { addr, hello }, finished, outstanding })
    }

    /// Drops this handle and waits until the session is closed: once every other handle is
    /// dropped too, the I/O task finishes what is in flight, sends CLOSE and ends. A program
    /// that is about to stop its runtime calls this, so the target's slot is freed at once.
    pub async fn close(self) {
        let AsyncClient { commands, mut finished, .. } = self;
        drop(commands);
        // Err once the task has ended and dropped its sender: that is the signal.
        while finished.changed().await.is_ok() {}
    }

    /// What HELLO said about the target.
    pub fn info(&self) -> &TargetInfo {
        &self.info
    }

    /// The region named (or numbered) `name`.
    pub fn region(&self, name: &str) -> Result<&RegionInfo, ClientError> {
        self.info.region(name)
    }

    /// Sends `ops` in one datagram and waits for the answer. If the target lost the session
    /// (it restarted, or the session expired), the session says HELLO again and resends the
    /// request when that is safe (see [`crate::session`]).
    pub async fn call(&self, ops: Vec<Op>) -> Result<Reply, ClientError> {
        self.submit(ops).await?.wait().await
    }

    /// Hands `ops` (one datagram) to the I/O task without waiting for the answer; waits only
    /// while the task's queue is full. Submit several, then wait for each, to keep them in
    /// flight together.
    pub async fn submit(&self, ops: Vec<Op>) -> Result<Pending, ClientError> {
        let outstanding = self.outstanding.as_ref().map(Outstanding::new);
        let (reply, answer) = oneshot::channel();
        self.commands.send(Command { ops, reply }).await.map_err(|_| ClientError::Closed)?;
        Ok(Pending { answer, _outstanding: outstanding })
    }

    /// Round trip with no work at the target.
    pub async fn ping(&self) -> Result<Reply, ClientError> {
        let reply = self.call(vec![Op::ping()]).await?;
        reply.data(0)?;
        Ok(reply)
    }

    /// The target's counters (through this client's session).
    pub async fn stat(&self) -> Result<Vec<(String, u64)>, ClientError> {
        let reply = self.call(vec![Op::stat()]).await?;
        Ok(decode_stat_answer(reply.data(0)?)?)
    }

    /// Reads `len` bytes at `offset`, every chunk in flight at once (the I/O task bounds them).
    pub async fn read(&self, space: u16, offset: u64, len: usize) -> Result<Vec<u8>, ClientError> {
        // Only a range past 2^64 is refused here (as in the other byte methods): this client's
        // HELLO answer is its first, and a target restarted since may serve the region at
        // another size, so a range past its end is the target's to refuse.
        check_byte_range(Opcode::Read as u8, offset, len, None)?;
        let mut out = vec![0u8; len];
        self.read_into(space, offset, &mut out).await?;
        Ok(out)
    }

    /// Reads `out.len()` bytes at `offset` into `out`, every chunk in flight at once.
    pub async fn read_into(&self, space: u16, offset: u64, out: &mut [u8]) -> Result<(), ClientError> {
        check_byte_range(Opcode::Read as u8, offset, out.len(), None)?;
        let mut answers = Vec::new();
        for (at, position, piece) in chunks(offset, out.len(), self.info.read_chunk_bytes()) {
            answers.push((position, piece, self.submit(vec![Op::read(space, at, piece as u32)]).await?));
        }
        for (position, piece, answer) in answers {
            let reply = answer.wait().await?;
            let data = reply.data(0)?;
            if data.len() != piece {
                return Err(ClientError::MissingResult(0));
            }
            out[position..position + piece].copy_from_slice(data);
        }
        Ok(())
    }

    /// Writes `data` at `offset`, every chunk in flight at once.
    pub async fn write(&self, space: u16, offset: u64, data: &[u8]) -> Result<(), ClientError> {
        check_byte_range(Opcode::Write as u8, offset, data.len(), None)?;
        let mut answers = Vec::new();
        for (at, position, piece) in chunks(offset, data.len(), self.info.write_chunk_bytes()) {
            answers.push(self.submit(vec![Op::write(space, at, &data[position..position + piece])]).await?);
        }
        for answer in answers {
            answer.wait().await?.data(0)?;
        }
        Ok(())
    }

    /// Compare-and-swap; returns the old value.
    pub async fn cas(&self, space: u16, offset: u64, expected: u64, desired: u64) -> Result<u64, ClientError> {
        word_result(&self.call(vec![Op::cas(space, offset, expected, desired)]).await?)
    }

    /// Fetch-and-add; returns the old value.
    pub async fn fetch_add(&self, space: u16, offset: u64, addend: u64) -> Result<u64, ClientError> {
        word_result(&self.call(vec![Op::fetch_add(space, offset, addend)]).await?)
    }

    /// Adds lanes into memory; returns the new values when `return_result`. More lanes than one
    /// VADD may carry go as several VADDs, all in flight at once; each adds atomically, the
    /// whole does not.
    pub async fn vadd(
        &self,
        space: u16,
        offset: u64,
        lane: LaneType,
        lanes: &[u8],
        return_result: bool,
    ) -> Result<Vec<u8>, ClientError> {
        check_byte_range(Opcode::Vadd as u8, offset, lanes.len(), None)?;
        let mut answers = Vec::new();
        for (at, position, piece) in chunks(offset, lanes.len(), self.info.vadd_chunk_bytes(lane, return_result)) {
            let op = Op::vadd(space, at, lane, &lanes[position..position + piece], return_result);
            answers.push((position, piece, self.submit(vec![op]).await?));
        }
        let mut result = vec![0u8; if return_result { lanes.len() } else { 0 }];
        for (position, piece, answer) in answers {
            let reply = answer.wait().await?;
            let data = reply.data(0)?;
            if return_result {
                if data.len() != piece {
                    return Err(ClientError::MissingResult(0));
                }
                result[position..position + piece].copy_from_slice(data);
            }
        }
        Ok(result)
    }

    /// CRC32 of `len` bytes; more than [`MAX_LONG_INSTRUCTION_BYTES`] go as several CRC32s
    /// in flight at once, their answers combined (a worker answers nothing else while it runs
    /// one).
    pub async fn crc32(&self, space: u16, offset: u64, len: u32) -> Result<u32, ClientError> {
        if len as usize <= MAX_LONG_INSTRUCTION_BYTES {
            return crc_result(&self.call(vec![Op::crc32(space, offset, len)]).await?);
        }
        check_byte_range(Opcode::Crc32 as u8, offset, len as usize, None)?;
        let mut answers = Vec::new();
        for (at, _, piece) in chunks(offset, len as usize, MAX_LONG_INSTRUCTION_BYTES) {
            answers.push((piece, self.submit(vec![Op::crc32(space, at, piece as u32)]).await?));
        }
        let mut whole = 0;
        for (piece, answer) in answers {
            whole = netdam_isa::memory::crc32_combine(whole, crc_result(&answer.wait().await?)?, piece as u64);
        }
        Ok(whole)
    }
}

/// The I/O task: feeds commands into the session as the window allows, sends, receives, fires
/// timeouts, and completes futures (the session itself says HELLO, and again when the target
/// loses it). Ends when every client handle is dropped and nothing is in flight, closing the
/// session.
struct Driver {
    /// Dropped when the task ends, which tells `AsyncClient::close`.
    _finishing: watch::Sender<()>,
    /// Requests sent together leave in one system call (`netdam_udp::Train`).
    train: Train,
    /// Requests in a row that arrived with nothing else in flight or queued.
    lone_requests: u32,
    /// The callers' outstanding requests, over every session of their volume (`Outstanding`);
    /// `None` for a session that never spins for a lone answer (`spin_for_a_lone_answer`).
    outstanding: Option<Arc<AtomicUsize>>,
    socket: UdpSocket,
    session: Session,
    addr: SocketAddr,
    clock: MonotonicClock,
    /// Callers waiting for their answer, by token.
    waiting: HashMap<u64, Waiters>,
    /// Block size of each namespace, by id, from HELLO: what a BREAD's answer takes.
    block_bytes: Vec<(u16, u32)>,
    /// Commands not yet in the session (its window is full), with when the task took them.
    backlog: VecDeque<(Command, Instant)>,
    next_token: u64,
    /// `connect_with`, waiting for the first session.
    connecting: Option<oneshot::Sender<Result<HelloAnswer, ClientError>>>,
    /// Told, while `connecting`, that the target has answered something.
    connecting_heard: Option<Arc<AtomicBool>>,
    /// Whether the caller stopped waiting for the connect while the HELLO was under way.
    connect_abandoned: bool,
    /// Where completions are recorded, when the process serves `/metrics`.
    metrics: Option<Arc<SessionMetrics>>,
    /// When the target was last heard before a silence the task warned of, until it is heard
    /// again (`note_silence`).
    silent_since: Option<Instant>,
}

/// Instructions one datagram of packed commands carries at most.
const PACK_MAX: usize = 16;

/// What a run of packed commands adds up to.
#[derive(Debug, Clone, Copy)]
struct PackSizes {
    instructions: usize,
    request_bytes: usize,
    answer_bytes: usize,
    /// Commands are packed only with others of the same idempotence, so that packing never
    /// changes how a lost session treats a request (an idempotent one is sent again).
    idempotent: bool,
}

impl PackSizes {
    /// Both in one datagram of at most `max_datagram_bytes`, if they fit.
    fn joined(self, more: PackSizes, max_datagram_bytes: usize) -> Option<PackSizes> {
        let joined = PackSizes {
            instructions: self.instructions + more.instructions,
            // One header for both.
            request_bytes: self.request_bytes + more.request_bytes - HEADER_LEN,
            answer_bytes: self.answer_bytes + more.answer_bytes - HEADER_LEN,
            idempotent: self.idempotent,
        };
        let fits = joined.instructions <= PACK_MAX
            && joined.request_bytes <= max_datagram_bytes
            && joined.answer_bytes <= max_datagram_bytes;
        (fits && more.idempotent == self.idempotent).then_some(joined)
    }
}

/// Who waits for one datagram's answer: one caller, or the callers whose commands were packed
/// into it, in order.
enum Waiters {
    One(Waiter),
    Packed(Vec<Waiter>),
}

/// A caller waiting for its answer, and what its completion is recorded with.
struct Waiter {
    /// Instructions of its command.
    count: usize,
    reply: oneshot::Sender<Result<Reply, ClientError>>,
    /// Opcode of the request's first instruction.
    opcode: u8,
    /// When the I/O task took the request.
    taken: Instant,
    /// Operand bytes the request carries.
    sent_bytes: u64,
}

impl Waiter {
    /// The waiter of `command`, taken by the I/O task at `taken`.
    fn of(command: Command, taken: Instant) -> Waiter {
        Waiter {
            opcode: command.ops.first().map_or(0, |op| op.opcode),
            taken,
            sent_bytes: command.ops.iter().map(|op| op.operand.len() as u64).sum(),
            count: command.ops.len(),
            reply: command.reply,
        }
    }
}

/// What one receive gave the driver (`Driver::take_received`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Received {
    Datagram,
    /// The socket was empty.
    Nothing,
    /// The receive failed; what waits was failed or held for a restarting target.
    Failed,
}

impl Drop for Driver {
    fn drop(&mut self) {
        // The task is over (the session closed, or given up): its metrics shard stays in the
        // registry with its counters, and must not count as an open session.
        if let Some(metrics) = &self.metrics {
            metrics.ended();
        }
    }
}

impl Driver {
    async fn run(mut self, mut commands: mpsc::Receiver<Command>) {
        let mut buffer = vec![0u8; MAX_DATAGRAM_BYTES];
        let mut open = true;
        loop {
            self.submit_what_fits();
            self.send_queued();
            if self.connecting.as_ref().is_some_and(|connecting| connecting.is_closed()) {
                // The caller stopped waiting for the connect (a timeout, a select). The target may
                // already hold the session, or make it from a HELLO still on its way: the task
                // sees the exchange to its end and then closes it, as for a dropped client.
                // (Only then: a client dropped or closed while a restarted target is asked for
                // a new session ends at once, as before, not after the HELLO's attempts.)
                self.connecting = None;
                self.connecting_heard = None;
                self.connect_abandoned = true;
            }
            // A HELLO refused for want of a slot made no session: nothing is left to close,
            // and asking again for `session_wait` would only take a slot nobody will use.
            let hello_pending =
                self.connect_abandoned && self.session.is_establishing() && !self.session.waits_for_a_slot();
            if !open
                && self.waiting.is_empty()
                && self.backlog.is_empty()
                && self.connecting.is_none()
                && !hello_pending
            {
                close_session(&self.socket, &mut self.session, &self.clock, &mut buffer).await;
                return;
            }
            let answered = self.spin_for_a_lone_answer(&commands, &mut buffer).await;
            // The session's next timer when this pass waited for one (not after a spin).
            let mut timer = None;
            if !answered {
                // The wait never begins with something sendable left unsent: a queued request
                // arms no timer, so it would wait for whatever event came next, possibly none.
                // (A datagram the spin read may have queued some: a `no_session` answer from a
                // restarted target queues a HELLO, which once hung an export's NBD client.)
                self.send_queued();
                timer = self.session.poll_timeout();
                let sleep_until = timer
                    .map(|deadline| tokio::time::Instant::now() + deadline.saturating_since(self.clock.now()).to_std());
                tokio::select! {
                    command = commands.recv(), if open && self.backlog.len() < COMMAND_QUEUE => match command {
                        Some(command) => open = self.take_commands(command, &mut commands),
                        None => open = false,
                    },
                    ready = self.socket.readable() => match ready {
                        Ok(()) => self.receive_arrived(&mut buffer),
                        Err(error) => self.receive_failed(error),
                    },
                    () = async {
                        match sleep_until {
                            Some(when) => tokio::time::sleep_until(when).await,
                            None => std::future::pending().await,
                        }
                    } => {}
                }
            }
            // A timer is due: answers already in the socket are read first, so that none is
            // taken for lost (the select above picks among ready branches at random).
            if timer.is_some_and(|deadline| deadline <= self.clock.now()) {
                self.receive_arrived(&mut buffer);
            }
            let now = self.clock.now();
            self.session.handle_timeout(now);
            self.answer_completed(now);
            self.note_silence(now);
            self.publish_stats();
            if let Some(outcome) = self.session.poll_established() {
                if let Ok(answer) = &outcome {
                    self.block_bytes =
                        answer.namespaces.iter().map(|namespace| (namespace.id, namespace.block_bytes)).collect();
                }
                if let Some(connecting) = self.connecting.take() {
                    self.connecting_heard = None;
                    let failed = outcome.is_err();
                    let _ = connecting.send(outcome);
                    if failed {
                        return;
                    }
                }
            }
        }
    }

    /// Says in the log when a target heard before goes silent for `HELLO_PATIENCE_NOTICE` with
    /// requests outstanding (a paused host, a restart, a lost path: the requests are retried
    /// meanwhile), and when it is heard again, with how long it was silent. The timers of the
    /// outstanding requests wake the task at least every `max_rto`, so the line comes at most
    /// that late.
    fn note_silence(&mut self, now: Instant) {
        let Some(heard) = self.session.last_heard() else { return };
        let ms = |duration: Duration| duration.as_nanos() / 1_000_000;
        match self.silent_since {
            Some(since) if heard > since => {
                tracing::info!(target = %self.addr, "the target answers again after {} ms of silence", ms(heard.saturating_since(since)));
                self.silent_since = None;
            }
            // Cheap test first; the walk over the window only once the target has not been
            // heard for that long (an export idle for a while has not, yet is not waiting).
            None if self.session.in_flight() > 0 && now.saturating_since(heard) >= HELLO_PATIENCE_NOTICE => {
                // Silent since the last answer or since the oldest request waiting left, if
                // that was later: an idle export's first request has waited only since then.
                let since = self.session.oldest_first_sent().map_or(heard, |sent| sent.max(heard));
                if now.saturating_since(since) >= HELLO_PATIENCE_NOTICE {
                    tracing::warn!(
                        target = %self.addr,
                        requests = self.session.in_flight(),
                        "no answer from the target for {} ms; still trying (a request fails once it has waited out the session's patience)",
                        ms(now.saturating_since(since))
                    );
                    self.silent_since = Some(since);
                }
            }
            _ => {}
        }
    }

    /// Sends what the session has queued, as far as its window lets it. Several due at once (the
    /// commands one wake-up took) leave in one train.
    fn send_queued(&mut self) {
        if !self.session.has_queued() {
            return;
        }
        let now = self.clock.now();
        let sent = send_due(&mut self.session, &self.socket, &mut self.train, self.addr, now);
        if let Some(error) = sent.error.and_then(|error| send_failure(&mut self.session, self.addr, error, now)) {
            self.fail_all(&error);
        }
    }

    /// Takes `first`, just received, and every command already queued behind it, so that the
    /// ones submitted together (an NBD client's requests read in one go) can share datagrams,
    /// and one wake-up serves them all. Returns whether the command channel is still open.
    fn take_commands(&mut self, first: Command, commands: &mut mpsc::Receiver<Command>) -> bool {
        let now = self.clock.now();
        // A caller that waits for each answer before its next request: this one is all its
        // callers have outstanding, over every session.
        let alone = self.waiting.is_empty() && self.backlog.is_empty() && self.callers_outstanding() <= 1;
        self.backlog.push_back((first, now));
        let mut open = true;
        while self.backlog.len() < COMMAND_QUEUE {
            match commands.try_recv() {
                Ok(command) => self.backlog.push_back((command, now)),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        self.lone_requests = if alone && self.backlog.len() == 1 { self.lone_requests.saturating_add(1) } else { 0 };
        open
    }

    /// Receives every answer that has arrived, without waking again, each with how long it
    /// waited in the socket (`stamped`); the socket's readiness is cleared once it is empty.
    fn receive_arrived(&mut self, buffer: &mut [u8]) {
        let fd = self.socket.as_raw_fd();
        loop {
            let received = self.socket.try_io(Interest::READABLE, || stamped::recv(fd, buffer));
            if self.take_received(received, buffer) != Received::Datagram {
                return;
            }
        }
    }

    /// Hands the session what a receive into `buffer` gave: a datagram (with how long it
    /// waited in the socket, when known), nothing (the socket was empty), or an error, which
    /// fails or holds what waits (`receive_failed`).
    fn take_received(&mut self, received: std::io::Result<(usize, Option<Duration>)>, buffer: &[u8]) -> Received {
        match received {
            Ok((len, waited)) => {
                self.session.handle_datagram_waited(self.clock.now(), waited.unwrap_or(Duration::ZERO), &buffer[..len]);
                if let Some(heard) = &self.connecting_heard {
                    if self.session.last_heard().is_some() {
                        heard.store(true, Ordering::Relaxed);
                    }
                }
                Received::Datagram
            }
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => Received::Nothing,
            Err(error) => {
                self.receive_failed(error);
                Received::Failed
            }
        }
    }

    /// Gives every finished request's outcome to its caller (each caller its share of a packed
    /// answer).
    fn answer_completed(&mut self, now: Instant) {
        while let Some(completion) = self.session.poll_completion() {
            match self.waiting.remove(&completion.token) {
                Some(Waiters::One(waiter)) => self.answer(waiter, completion.result, now),
                Some(Waiters::Packed(waiters)) => {
                    let counts: Vec<usize> = waiters.iter().map(|waiter| waiter.count).collect();
                    match completion.result {
                        Ok(reply) => {
                            for (waiter, share) in waiters.into_iter().zip(reply.split(&counts)) {
                                self.answer(waiter, Ok(share), now);
                            }
                        }
                        Err(error) => {
                            for waiter in waiters {
                                self.answer(waiter, Err(error.duplicate()), now);
                            }
                        }
                    }
                }
                None => {}
            }
        }
    }

    /// Hands the session commands while its window has room (before the session exists they
    /// wait inside it for the session). Consecutive commands of block or byte reads and writes
    /// share a datagram while their instructions and answers fit.
    fn submit_what_fits(&mut self) {
        while self.session.has_room() {
            let Some((command, taken)) = self.backlog.pop_front() else { break };
            let packed = self.take_packable_after(&command.ops);
            let token = self.next_token;
            let submitted = if packed.is_empty() {
                self.session.submit(&command.ops, token)
            } else {
                let ops: Vec<&Op> =
                    command.ops.iter().chain(packed.iter().flat_map(|(command, _)| command.ops.iter())).collect();
                self.session.submit_with(ops.len(), |index| ops[index].as_instruction(), token)
            };
            match submitted {
                Ok(()) => {
                    let waiters = if packed.is_empty() {
                        Waiters::One(Waiter::of(command, taken))
                    } else {
                        let first = Waiter::of(command, taken);
                        let rest = packed.into_iter().map(|(command, taken)| Waiter::of(command, taken));
                        Waiters::Packed(std::iter::once(first).chain(rest).collect())
                    };
                    self.waiting.insert(token, waiters);
                    self.next_token += 1;
                }
                Err(error) => {
                    let now = self.clock.now();
                    for (command, taken) in std::iter::once((command, taken)).chain(packed) {
                        self.answer(Waiter::of(command, taken), Err(error.duplicate()), now);
                    }
                }
            }
        }
    }

    /// Takes from the backlog the commands that may share a datagram with `ops` (which were
    /// taken already): consecutive ones, while everything fits.
    fn take_packable_after(&mut self, ops: &[Op]) -> Vec<(Command, Instant)> {
        let mut packed = Vec::new();
        let Some(mut sizes) = self.packable(ops) else { return packed };
        let max_datagram_bytes = self.session.config().max_datagram_bytes;
        while let Some(more) = self.backlog.front().and_then(|(next, _)| self.packable(&next.ops)) {
            match sizes.joined(more, max_datagram_bytes) {
                Some(joined) => sizes = joined,
                None => break,
            }
            packed.push(self.backlog.pop_front().expect("front was just seen"));
        }
        packed
    }

    /// What `ops` add to a datagram, if they may share one with other callers' ops: only
    /// block and byte reads and writes, whose answers each caller reads from its own results.
    fn packable(&self, ops: &[Op]) -> Option<PackSizes> {
        let mut sizes = PackSizes { instructions: ops.len(), request_bytes: 0, answer_bytes: 0, idempotent: true };
        for op in ops {
            let answer_data = match Opcode::from_u8(op.opcode)? {
                Opcode::Read => op.length as usize,
                Opcode::BlockRead => {
                    let block = self.block_bytes.iter().find(|(id, _)| *id == op.space)?.1;
                    (op.length as usize).checked_mul(block as usize)?
                }
                Opcode::Write | Opcode::BlockWrite => 0,
                _ => return None,
            };
            sizes.request_bytes += INSTRUCTION_HEADER_LEN + op.operand.len();
            sizes.answer_bytes += RESPONSE_INSTRUCTION_HEADER_LEN + answer_data;
            sizes.idempotent &= op.is_idempotent();
        }
        sizes.request_bytes += HEADER_LEN;
        sizes.answer_bytes += HEADER_LEN;
        Some(sizes)
    }

    /// Answers one caller and records its completion.
    fn answer(&self, waiter: Waiter, result: Result<Reply, ClientError>, now: Instant) {
        if let Some(metrics) = &self.metrics {
            let latency = now.saturating_since(waiter.taken);
            metrics.complete(waiter.opcode, latency, waiter.sent_bytes, &result);
        }
        let _ = waiter.reply.send(result);
    }

    /// A caller that sends one request at a time (`LONE_REQUESTS_TO_SPIN` in a row arrived
    /// with nothing else in flight) and one request in flight: its answer is a round trip away,
    /// and waiting for it in epoll puts the thread to sleep, whose wake-up on a VM with halting
    /// idle CPUs costs more than the round trip. Spins for it instead, at most twice the
    /// smoothed round trip (`ADAPTIVE_SPIN_MIN`..`ADAPTIVE_SPIN_MAX`), yielding to the runtime
    /// between tries. Returns whether an answer (or a receive error) came. Not for deeper
    /// callers: there the spinning thread would take the core their own thread needs (an NBD
    /// client on the same machine), which measured slower at depth 4.
    async fn spin_for_a_lone_answer(&mut self, commands: &mpsc::Receiver<Command>, buffer: &mut [u8]) -> bool {
        if self.outstanding.is_none()
            || self.lone_requests < LONE_REQUESTS_TO_SPIN
            || self.callers_outstanding() > 1
            || self.waiting.len() != 1
            || !self.backlog.is_empty()
            || !commands.is_empty()
        {
            return false;
        }
        let started = self.clock.now();
        let spin = adaptive_spin_for(self.session.smoothed_rtt(), self.session.on_wire());
        let fd = self.socket.as_raw_fd();
        loop {
            let in_flight = self.session.in_flight();
            match self.take_received(stamped::recv(fd, buffer), buffer) {
                // The answer (not a duplicate, nor a BUSY that holds the request).
                Received::Datagram if self.session.in_flight() < in_flight => {
                    self.session.count_spun_for();
                    tokio::task::consume_budget().await;
                    return true;
                }
                Received::Datagram | Received::Nothing => {}
                Received::Failed => return true,
            }
            if self.clock.now().saturating_since(started) > spin || !commands.is_empty() {
                return false;
            }
            // The runtime polls its I/O driver before it resumes this task, so other tasks (a
            // connection with a new request) run in between.
            tokio::task::yield_now().await;
        }
    }

    /// Requests the callers have outstanding over every session of their volume (0 where
    /// they are not counted: a session that never spins).
    fn callers_outstanding(&self) -> usize {
        self.outstanding.as_ref().map_or(0, |count| count.load(Ordering::Relaxed))
    }

    /// Copies the session's counters and state into its metrics, if it has them.
    fn publish_stats(&self) {
        if let Some(metrics) = &self.metrics {
            metrics.update(&self.session.stats());
        }
    }

    /// A receive failed: nothing listens at the target's address, or the socket is unusable.
    fn receive_failed(&mut self, error: std::io::Error) {
        if error.kind() == std::io::ErrorKind::ConnectionRefused {
            // A target that is restarting: what waits is retried by its timeouts.
            if self.session.handle_refused(self.clock.now()) {
                return;
            }
            self.fail_all(&ClientError::NotListening(self.addr));
        } else {
            self.fail_all(&ClientError::Io(error));
        }
    }

    /// Fails every request, waiting or queued, with a copy of `error` (the socket is unusable),
    /// each counted in the metrics as an answered one is (an export's failures for want of a
    /// listening target went uncounted, and its error-ratio alert with them).
    fn fail_all(&mut self, error: &ClientError) {
        // What the session's stats say now reaches its metrics even if nothing else happens
        // before the client is dropped (a refusal from the target's port has made the session
        // not open).
        self.publish_stats();
        let now = self.clock.now();
        let waiting: Vec<Waiters> = self.waiting.drain().map(|(_, waiters)| waiters).collect();
        for waiters in waiting {
            match waiters {
                Waiters::One(waiter) => self.answer(waiter, Err(error.duplicate()), now),
                Waiters::Packed(waiters) => {
                    for waiter in waiters {
                        self.answer(waiter, Err(error.duplicate()), now);
                    }
                }
            }
        }
        let backlog: Vec<(Command, Instant)> = self.backlog.drain(..).collect();
        for (command, taken) in backlog {
            self.answer(Waiter::of(command, taken), Err(error.duplicate()), now);
        }
        if let Some(connecting) = self.connecting.take() {
            let _ = connecting.send(Err(error.duplicate()));
        }
        // Nothing listens, or the socket is unusable: an abandoned connect's HELLO has no
        // session to close, so its task need not see the exchange out.
        self.connect_abandoned = false;
    }
}

/// Sends CLOSE for the session and waits (at most [`CLOSE_WAIT`]) for the target to confirm.
async fn close_session(socket: &UdpSocket, session: &mut Session, clock: &MonotonicClock, buffer: &mut [u8]) {
    if session.id() == 0 || session.submit(&[Op::close()], CLOSE_TOKEN).is_err() {
        return;
    }
    let deadline = tokio::time::Instant::now() + CLOSE_WAIT.to_std();
    loop {
        let now = clock.now();
        while let Some(datagram) = session.poll_transmit(now) {
            // A lost CLOSE is retransmitted; a failed send leaves the session to expire.
            let _ = socket.try_send(datagram);
        }
        while let Some(completion) = session.poll_completion() {
            if completion.token == CLOSE_TOKEN {
                // Whatever the answer, nobody is left to tell: a CLOSE the target refused
                // leaves the session to expire there.
                return;
            }
        }
        let retransmit = session
            .poll_timeout()
            .map(|when| tokio::time::Instant::now() + when.saturating_since(clock.now()).to_std());
        let wake = retransmit.map_or(deadline, |when| when.min(deadline));
        if tokio::time::Instant::now() >= deadline {
            return;
        }
        tokio::select! {
            received = socket.recv(buffer) => match received {
                Ok(len) => session.handle_datagram(clock.now(), &buffer[..len]),
                Err(_) => return,
            },
            () = tokio::time::sleep_until(wake) => {}
        }
        session.handle_timeout(clock.now());
    }
}
