//! The blocking client: one session over a connected UDP socket, several requests in flight.
//!
//! `submit` + `wait` pipeline requests by hand; `read` and `write` split large transfers into
//! datagram-sized requests and keep the session's window full.

use std::collections::VecDeque;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;

use netdam_isa::block::{decode_extents, Extent};
use netdam_isa::control::{decode_stat_answer, NamespaceInfo, RegionInfo};
use netdam_isa::crypto::Seal;
use netdam_isa::extension::reduce::{ReduceOp, REDUCE_MAX_BYTES, REDUCE_OPCODE};
use netdam_isa::limits::{DEFAULT_DATAGRAM_BYTES, MAX_DATAGRAM_BYTES, MAX_LONG_INSTRUCTION_BYTES, MIN_DATAGRAM_BYTES};
use netdam_isa::time::MonotonicClock;
use netdam_isa::wire::{peek_datagram_status, Instruction};
use netdam_isa::{Duration, Instant, LaneType, Opcode, Status};
use netdam_udp::Train;

use crate::error::ClientError;
use crate::hello::close_outcome;
use crate::op::Op;
use crate::reduce::{self, ReduceValue};
use crate::session::{Reply, Session, SessionConfig, SessionStats};
use crate::stamped;
use crate::target_info::{check_byte_range, chunks, crc_result, word_result, TargetInfo};

/// How a client waits for answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClientPoll {
    /// Sleep in the kernel until the socket is readable.
    #[default]
    Blocking,
    /// Spin on the socket: lowest latency, burns a core.
    Busy,
    /// Spin while an answer is due soon, then sleep in the kernel: after each send or answer
    /// the client spins for twice its smoothed round trip, at least `ADAPTIVE_SPIN_MIN` and at
    /// most `ADAPTIVE_SPIN_MAX` (`ADAPTIVE_SPIN_MAX_LOADED` while more than one request is on
    /// the wire). An answer that comes within that finds the client awake, so it pays no wake-up:
    /// on a virtual machine whose idle CPUs halt, waking a sleeping client added 20-40 µs to a
    /// 4 KiB block read (docs/DECISIONS.md). An idle client sleeps, and a slow one spins only
    /// the maximum per request.
    Adaptive,
}

/// The shortest spin of an adaptive client after a send or an answer.
pub const ADAPTIVE_SPIN_MIN: Duration = Duration::from_micros(50);

/// The longest spin of an adaptive client after a send or an answer, with at most one request
/// on the wire: a client waiting on one slow request sleeps through most of it.
pub const ADAPTIVE_SPIN_MAX: Duration = Duration::from_micros(200);

/// The longest spin while more than one request is on the wire. A disk at depth finishes
/// requests in bursts about a round trip apart (~500 µs for 32 random reads on this VM's
/// disk), so a client that slept after 200 µs slept between every burst and woke late to
/// refill its window: a file namespace at depth 32 through the fio engine gave 48k-51k random
/// reads/s with 200 µs against 53k-61k with 1 ms, writes 25k-28k against 27k-31k
/// (docs/DECISIONS.md, "An adaptive client at depth spins up to 1 ms").
pub const ADAPTIVE_SPIN_MAX_LOADED: Duration = Duration::from_millis(1);

/// Client settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClientOptions {
    /// Session settings (window, retransmission).
    pub session: SessionConfig,
    /// How to wait for answers.
    pub poll: ClientPoll,
    /// Local address to send from (the target counts sessions per sender address); `None` lets
    /// the kernel choose.
    pub local_addr: Option<SocketAddr>,
    /// Requests ready at the same moment leave in one train (`netdam_udp::Train`, UDP
    /// segmentation offload); `false` sends each on its own, as the kernel would without it.
    pub request_trains: bool,
}

impl Default for ClientOptions {
    fn default() -> ClientOptions {
        ClientOptions {
            session: SessionConfig::default(),
            poll: ClientPoll::Blocking,
            local_addr: None,
            request_trains: true,
        }
    }
}

/// How long an adaptive client spins for an answer, given its smoothed round trip and the
/// requests it has on the wire: twice the round trip, at least `ADAPTIVE_SPIN_MIN`, at most
/// `ADAPTIVE_SPIN_MAX` with one request on the wire or none, `ADAPTIVE_SPIN_MAX_LOADED` with more.
pub(crate) fn adaptive_spin_for(smoothed_rtt: Option<Duration>, on_wire: usize) -> Duration {
    let rtt = smoothed_rtt.unwrap_or(ADAPTIVE_SPIN_MIN);
    let max = if on_wire > 1 { ADAPTIVE_SPIN_MAX_LOADED } else { ADAPTIVE_SPIN_MAX };
    Duration::from_nanos(rtt.as_nanos().saturating_mul(2)).clamp(ADAPTIVE_SPIN_MIN, max)
}

/// What one [`send_due`] did.
pub(crate) struct Sent {
    /// Datagrams the session handed out (the window held back the rest).
    handed: u64,
    /// Of those, how many no send took.
    failed: u64,
    /// The first failure, if any.
    pub(crate) error: Option<io::Error>,
}

impl Sent {
    /// Whether a datagram went out, so that an answer is due soon.
    pub(crate) fn went_out(&self) -> bool {
        self.handed > self.failed
    }
}

/// Sends what `session` has due at `now` on `socket` (connected to `peer`), for both clients:
/// a lone request at once with `send` (the latency path, without the train's bookkeeping),
/// several as one train (one system call: `netdam_udp::Train`), whose count goes to the session.
pub(crate) fn send_due(
    session: &mut Session,
    socket: &impl std::os::fd::AsFd,
    train: &mut Train,
    peer: SocketAddr,
    now: Instant,
) -> Sent {
    let lone = session.queued() <= 1;
    let mut sent = Sent { handed: 0, failed: 0, error: None };
    while let Some(datagram) = session.poll_transmit(now) {
        sent.handed += 1;
        if lone {
            if let Err(error) = netdam_udp::send(socket, datagram) {
                sent.failed += 1;
                sent.error.get_or_insert(error);
            }
        } else {
            sent.failed += train.push(socket, peer, datagram, now);
        }
    }
    if !lone {
        sent.failed += train.flush(socket);
        session.count_trains(train.take_trains_sent());
        sent.error = train.take_error();
    }
    sent
}

/// What a failed send means for the requests: a full socket buffer (`EAGAIN`, `ENOBUFS`) is a
/// lost datagram, which retransmission recovers, and so is a refusal while the target restarts
/// (see `Session::handle_refused`); otherwise the error they fail with.
pub(crate) fn send_failure(
    session: &mut Session,
    peer: SocketAddr,
    error: io::Error,
    now: Instant,
) -> Option<ClientError> {
    if netdam_udp::is_full(&error) {
        return None;
    }
    match error.kind() {
        io::ErrorKind::ConnectionRefused if session.handle_refused(now) => None,
        io::ErrorKind::ConnectionRefused => Some(ClientError::NotListening(peer)),
        _ => Some(ClientError::Io(error)),
    }
}

/// How long closing a session waits for the target to confirm: a target that is gone must not
/// hold a program up on its way out (the session then expires on the target by itself).
pub(crate) const CLOSE_WAIT: Duration = Duration::from_millis(100);

/// A UDP socket connected to `addr`, bound to `local` when given.
pub(crate) fn connected_socket(addr: SocketAddr, local: Option<SocketAddr>) -> io::Result<UdpSocket> {
    let any: SocketAddr = if addr.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }.parse().expect("valid literal");
    let socket = UdpSocket::bind(local.unwrap_or(any))?;
    socket.connect(addr)?;
    // Unstamped answers still work (they count as read on arrival), so a refusal is no error.
    let _ = stamped::enable(socket.as_raw_fd());
    Ok(socket)
}

/// How recent a spinning client's last empty poll must be for an answer read now to go without
/// its kernel timestamp: the answer arrived after that poll began, so its wait is known to
/// within this much (`Client::progress`).
const TIGHT_SPIN: Duration = Duration::from_micros(5);

/// How long the target may be silent to a waiting client before it says that it is still
/// trying (a request's attempts, the HELLO's included, last `SessionConfig::min_patience`: 5 s
/// and the back-off after it by default, half a minute for `netdam`'s commands).
pub(crate) const HELLO_PATIENCE_NOTICE: Duration = Duration::from_millis(2_000);

/// Says that the target at `addr` has not answered yet, and what to check: whether anything
/// answers there at all, or, once it has answered in this session (`heard`), what may have
/// happened since (the command line once asked "is netdam-target running?" of a target that
/// had answered and was busy with one 4 GiB FILL; the target now refuses an instruction that
/// long, so a target that answered and went quiet stopped, became unreachable or stalled).
pub(crate) fn warn_still_trying(addr: SocketAddr, heard: bool) {
    let ms = HELLO_PATIENCE_NOTICE.as_nanos() / 1_000_000;
    if heard {
        tracing::warn!(
            target = %addr,
            "the target answered this session but has said nothing for {ms} ms since; still trying (has \
             netdam-target stopped or become unreachable, or is it stalled, by a slow disk for example?)"
        );
    } else {
        tracing::warn!(
            target = %addr,
            "no answer from the target yet after {ms} ms; still trying (is netdam-target running at that address, \
             reachable, and speaking this protocol?)"
        );
    }
}

/// A request submitted and not yet waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ticket(u64);

/// A request that finished: its ticket and its outcome.
pub type Finished = (Ticket, Result<Reply, ClientError>);

/// A blocking session with one target. Dropping it closes the session.
#[derive(Debug)]
pub struct Client {
    socket: UdpSocket,
    session: Session,
    info: TargetInfo,
    poll: ClientPoll,
    clock: MonotonicClock,
    receive_buffer: Vec<u8>,
    next_token: u64,
    /// Answered requests not yet taken, oldest first: a handful at a time (at most the window).
    finished: VecDeque<(u64, Result<Reply, ClientError>)>,
    requested_datagram_bytes: u32,
    /// Why the last HELLO exchange failed, until `hello` reports it.
    hello_failure: Option<ClientError>,
    /// A send of a submitted request failed, until the next wait or `progress` reports it.
    send_failure: Option<ClientError>,
    /// When a receive last found the socket empty (at the latest: its call began no later). An
    /// answer read later arrived after it, so the time since bounds how long the answer waited
    /// for this client.
    polled_empty_at: Option<Instant>,
    /// An adaptive client spins until then, and sleeps in the kernel after it.
    spin_until: Instant,
    /// Whether it said already that the target has not answered yet (`HELLO_PATIENCE_NOTICE`).
    silence_noticed: bool,
    /// Requests sent together leave in one system call (`netdam_udp::Train`).
    train: Train,
}

/// Receive and send buffers asked for; the kernel caps them at net.core.rmem_max and wmem_max.
const SOCKET_BUFFER_BYTES: usize = 4 << 20;

/// Asks for deep receive and send buffers, then bounds the session's window by what the kernel
/// granted: answers in flight beyond the receive buffer would be dropped, and requests beyond
/// the send buffer refused (on loopback a sent datagram is charged to its sender until the
/// target has read it), each then waiting out a retransmission timeout. The kernel accounts a
/// datagram at about twice its payload.
pub(crate) fn fit_window_to_socket_buffers(socket: &socket2::SockRef<'_>, config: SessionConfig) -> SessionConfig {
    let _ = socket.set_recv_buffer_size(SOCKET_BUFFER_BYTES);
    let _ = socket.set_send_buffer_size(SOCKET_BUFFER_BYTES);
    let granted = socket.recv_buffer_size().unwrap_or(0).min(socket.send_buffer_size().unwrap_or(0));
    let fits = (granted / (2 * config.max_datagram_bytes.max(1))).max(1);
    SessionConfig { max_in_flight: config.max_in_flight.min(fits), ..config }
}

impl Client {
    /// Connects with default options and says HELLO.
    pub fn connect(addr: SocketAddr) -> Result<Client, ClientError> {
        Client::connect_with(addr, ClientOptions::default())
    }

    /// Connects with `options` and says HELLO.
    pub fn connect_with(addr: SocketAddr, options: ClientOptions) -> Result<Client, ClientError> {
        options.session.check()?;
        let mut client = Client::unestablished(addr, options)?;
        client.hello()?;
        Ok(client)
    }

    /// A client without a session: it may only `ping` and `stat` (session 0), holds no slot
    /// at the target, and works even when the target's session table is full.
    pub fn sessionless(addr: SocketAddr) -> Result<Client, ClientError> {
        Client::unestablished(addr, ClientOptions::default())
    }

    /// As [`Client::sessionless`], with `options` (its patience, its polling).
    pub fn sessionless_with(addr: SocketAddr, options: ClientOptions) -> Result<Client, ClientError> {
        Client::unestablished(addr, options)
    }

    fn unestablished(addr: SocketAddr, options: ClientOptions) -> Result<Client, ClientError> {
        options.session.check_window()?;
        let socket = connected_socket(addr, options.local_addr)?;
        socket.set_nonblocking(true)?;
        let session_config = fit_window_to_socket_buffers(&socket2::SockRef::from(&socket), options.session);
        Ok(Client {
            train: Train::new(&socket, options.request_trains).connected_to(addr),
            socket,
            // Until HELLO answers, use the default size: every target accepts it.
            session: Session::new(SessionConfig { max_datagram_bytes: DEFAULT_DATAGRAM_BYTES, ..session_config }, 0),
            info: TargetInfo { addr, hello: Default::default() },
            poll: options.poll,
            clock: MonotonicClock::new(),
            receive_buffer: vec![0u8; MAX_DATAGRAM_BYTES],
            next_token: 0,
            finished: VecDeque::new(),
            requested_datagram_bytes: options.session.max_datagram_bytes as u32,
            hello_failure: None,
            send_failure: None,
            polled_empty_at: None,
            spin_until: Instant::ZERO,
            silence_noticed: false,
        })
    }

    /// Says HELLO and waits for the session: the first answer is a cookie that proves this
    /// client's address, echoed in the next HELLO (the session core runs the exchange).
    fn hello(&mut self) -> Result<(), ClientError> {
        self.session.start_hello(self.requested_datagram_bytes);
        let notice_at = self.clock.now() + HELLO_PATIENCE_NOTICE;
        loop {
            self.pump_noticing_silence(Some(notice_at))?;
            if let Some(error) = self.hello_failure.take() {
                return Err(error);
            }
            if !self.session.is_establishing() {
                return Ok(());
            }
        }
    }

    /// As `pump`, waking at `notice_at` (if given) to say once that the target has not
    /// answered yet: a command that waits on a silent address says why. Not while the target
    /// is heard from: a request it is slow to answer (a device it says it still works on) is
    /// no silence, so the notice waits for `HELLO_PATIENCE_NOTICE` after the last datagram.
    fn pump_noticing_silence(&mut self, notice_at: Option<Instant>) -> Result<(), ClientError> {
        let heard_until = |client: &Client| client.session.last_heard().map(|heard| heard + HELLO_PATIENCE_NOTICE);
        let due =
            notice_at.filter(|_| !self.silence_noticed).map(|at| heard_until(self).map_or(at, |until| at.max(until)));
        self.pump_within(due)?;
        // No clock read without a notice due: this runs once per poll of every wait.
        let Some(due) = due else { return Ok(()) };
        let now = self.clock.now();
        if now >= due && heard_until(self).is_none_or(|until| now >= until) {
            self.silence_noticed = true;
            warn_still_trying(self.info.addr, self.session.last_heard().is_some());
        }
        Ok(())
    }

    /// Closes the session and says whether the target confirmed it within a short wait
    /// (dropping the client does the same, and ignores the outcome).
    pub fn close(mut self) -> Result<(), ClientError> {
        self.close_session()
    }

    fn close_session(&mut self) -> Result<(), ClientError> {
        if self.session.id() == 0 {
            return Ok(());
        }
        if !self.session.has_room() {
            // No room to send it; the target's idle timeout ends the session.
            self.session.forget();
            return Err(ClientError::CloseUnconfirmed { waited_ms: 0 });
        }
        let token = self.next_token;
        self.next_token += 1;
        let submitted = self.session.submit(&[Op::close()], token).and_then(|()| self.flush());
        let deadline = self.clock.now() + CLOSE_WAIT;
        let outcome = submitted.and_then(|()| loop {
            if let Some(result) = self.take_token(token) {
                break close_outcome(result);
            }
            if self.clock.now() >= deadline {
                break Err(ClientError::CloseUnconfirmed { waited_ms: CLOSE_WAIT.as_nanos() / 1_000_000 });
            }
            self.pump_within(Some(deadline))?;
        });
        self.session.forget();
        outcome
    }

    /// What HELLO said about the target.
    pub fn info(&self) -> &TargetInfo {
        &self.info
    }

    /// The region named (or numbered) `name`.
    pub fn region(&self, name: &str) -> Result<&RegionInfo, ClientError> {
        self.info.region(name)
    }

    /// Session counters (transmissions, retransmissions, timeouts).
    pub fn session_stats(&self) -> SessionStats {
        self.session.stats()
    }

    /// Sends one datagram carrying `ops` without waiting; waits first if the window is full.
    /// Fails only when the request was not taken (it cannot be encoded, or waiting for room
    /// failed): once taken it has a ticket, and a failure to send it (nothing listening) is
    /// reported by the next wait or [`Client::progress`], while the session goes on trying.
    pub fn submit(&mut self, ops: &[Op]) -> Result<Ticket, ClientError> {
        self.submit_with(ops.len(), |index| ops[index].as_instruction())
    }

    /// As [`Client::submit`], for `count` instructions built by `instruction(index)` from
    /// borrowed operands (the caller's buffers), so that nothing is copied but into the
    /// datagram: for drivers that keep their own buffers (the fio engine).
    pub fn submit_with<'a>(
        &mut self,
        count: usize,
        instruction: impl Fn(usize) -> Instruction<'a>,
    ) -> Result<Ticket, ClientError> {
        let ticket = self.enqueue_with(count, instruction)?;
        self.send_enqueued();
        Ok(ticket)
    }

    /// As [`Client::submit_with`], but the request waits to be sent until
    /// [`Client::send_enqueued`] (or any wait): requests enqueued together leave in one train,
    /// one system call for all of them (`netdam_udp::Train`). Like `submit_with` it waits for
    /// room in the window first, and that wait sends what was enqueued before.
    pub fn enqueue_with<'a>(
        &mut self,
        count: usize,
        instruction: impl Fn(usize) -> Instruction<'a>,
    ) -> Result<Ticket, ClientError> {
        while !self.session.has_room() {
            self.pump()?;
        }
        let token = self.next_token;
        self.next_token += 1;
        self.session.submit_with(count, instruction, token)?;
        Ok(Ticket(token))
    }

    /// Sends the requests enqueued (as the window allows); a failure is reported by the next
    /// wait or [`Client::progress`].
    pub fn send_enqueued(&mut self) {
        if let Err(error) = self.flush() {
            // The first failure not yet reported stands.
            self.send_failure.get_or_insert(error);
        }
    }

    /// Waits for the answer to `ticket`. A target silent for `HELLO_PATIENCE_NOTICE` (not
    /// heard from at all, or not since a pause of its host) gets a warning that the client
    /// still waits, once per client. Without a session (PING, STAT) the wait for the notice
    /// starts at once; in a session, at its first retransmission during this wait, so that a
    /// request answered in time (the request path) pays no clock read for it.
    pub fn wait(&mut self, ticket: Ticket) -> Result<Reply, ClientError> {
        let mut notice_at = (self.session.id() == 0).then(|| self.clock.now() + HELLO_PATIENCE_NOTICE);
        let retransmissions = self.session.retransmissions();
        loop {
            if let Some(result) = self.take_token(ticket.0) {
                return result;
            }
            if notice_at.is_none() && self.session.retransmissions() != retransmissions {
                notice_at = Some(self.clock.now() + HELLO_PATIENCE_NOTICE);
            }
            self.pump_noticing_silence(notice_at)?;
        }
    }

    /// Waits for the answer to whichever submitted request finishes first; `None` when nothing
    /// is outstanding. For drivers that keep many requests in flight and time each one.
    pub fn wait_any(&mut self) -> Result<Option<Finished>, ClientError> {
        loop {
            if let Some((token, result)) = self.finished.pop_front() {
                return Ok(Some((Ticket(token), result)));
            }
            if self.session.in_flight() == 0 {
                return Ok(None);
            }
            self.pump()?;
        }
    }

    /// Sends `ops` in one datagram and waits for the answer. If the target no longer knows the
    /// session (it restarted, or the session expired), the session says HELLO again and resends
    /// the request when that is safe: when it is idempotent, or when its only transmission was
    /// the one answered `no_session` (so it never executed). Otherwise it fails with
    /// `SessionLost`, since an earlier transmission may have run before the session was lost.
    /// The same holds for every request, pipelined ones included.
    // Never inlined (a call costs nothing beside a round trip): profiles and
    // `ops/client-instructions.sh` find the client's share of a round trip under this name.
    #[inline(never)]
    pub fn call(&mut self, ops: &[Op]) -> Result<Reply, ClientError> {
        let ticket = self.submit(ops)?;
        self.wait(ticket)
    }

    /// Runs one instruction per request, keeping the window full; hands each reply to `on_reply`
    /// with the op's index, in submission order.
    pub fn pipeline(
        &mut self,
        ops: impl IntoIterator<Item = Op>,
        mut on_reply: impl FnMut(usize, Reply) -> Result<(), ClientError>,
    ) -> Result<(), ClientError> {
        let mut pending = VecDeque::new();
        let mut ops = ops.into_iter().enumerate();
        loop {
            // The requests that fill the window leave together, in trains.
            while self.session.has_room() {
                let Some((index, op)) = ops.next() else { break };
                match self.enqueue_with(1, |_| op.as_instruction()) {
                    Ok(ticket) => pending.push_back((index, ticket)),
                    Err(error) => {
                        // Those enqueued before it go as they would have.
                        self.send_enqueued();
                        return Err(error);
                    }
                }
            }
            self.send_enqueued();
            let Some((index, ticket)) = pending.pop_front() else {
                return Ok(());
            };
            on_reply(index, self.wait(ticket)?)?;
        }
    }

    /// Round trip with no work at the target.
    pub fn ping(&mut self) -> Result<Reply, ClientError> {
        let reply = self.call(&[Op::ping()])?;
        reply.data(0)?;
        Ok(reply)
    }

    /// The target's counters.
    pub fn stat(&mut self) -> Result<Vec<(String, u64)>, ClientError> {
        // Without a session the answer may not be longer than the request: pad it.
        let op = if self.session.id() == 0 { Op::stat_padded(MIN_DATAGRAM_BYTES) } else { Op::stat() };
        let reply = self.call(&[op])?;
        Ok(decode_stat_answer(reply.data(0)?)?)
    }

    /// Reads `out.len()` bytes at `offset` of region `space`.
    pub fn read(&mut self, space: u16, offset: u64, out: &mut [u8]) -> Result<(), ClientError> {
        check_byte_range(Opcode::Read as u8, offset, out.len(), self.info.region_size(space))?;
        let pieces: Vec<_> = chunks(offset, out.len(), self.info.read_chunk_bytes()).collect();
        let ops = pieces.iter().map(|(at, _, len)| Op::read(space, *at, *len as u32));
        self.pipeline(ops, |index, reply| {
            let (_, position, len) = pieces[index];
            let data = reply.data(0)?;
            if data.len() != len {
                return Err(ClientError::MissingResult(0));
            }
            out[position..position + len].copy_from_slice(data);
            Ok(())
        })
    }

    /// Writes `data` at `offset` of region `space`.
    pub fn write(&mut self, space: u16, offset: u64, data: &[u8]) -> Result<(), ClientError> {
        check_byte_range(Opcode::Write as u8, offset, data.len(), self.info.region_size(space))?;
        let ops = chunks(offset, data.len(), self.info.write_chunk_bytes())
            .map(|(at, position, len)| Op::write(space, at, &data[position..position + len]));
        self.pipeline(ops, |_, reply| reply.data(0).map(|_| ()))
    }

    /// The namespace named `name` (or with id `name`), as HELLO listed it.
    pub fn namespace(&self, name: &str) -> Result<&NamespaceInfo, ClientError> {
        self.info.namespace(name)
    }

    /// Reads whole blocks from `offset_blocks` of `namespace` into `out` (a multiple of the
    /// block size), in as many pipelined BREADs as the datagram size requires.
    pub fn block_read(
        &mut self,
        namespace: &NamespaceInfo,
        offset_blocks: u64,
        out: &mut [u8],
    ) -> Result<(), ClientError> {
        let block_bytes = namespace.block_bytes;
        let pieces = self.block_pieces(namespace, offset_blocks, out.len())?;
        let ops = pieces.iter().map(|(at, _, blocks)| Op::block_read(namespace.id, *at, *blocks));
        self.pipeline(ops, |index, reply| {
            let (_, position, blocks) = pieces[index];
            let len = blocks as usize * block_bytes as usize;
            let data = reply.data(0)?;
            if data.len() != len {
                return Err(ClientError::MissingResult(0));
            }
            out[position..position + len].copy_from_slice(data);
            Ok(())
        })
    }

    /// Writes whole blocks at `offset_blocks` of `namespace`; with `fua` every block is durable
    /// when this returns.
    pub fn block_write(
        &mut self,
        namespace: &NamespaceInfo,
        offset_blocks: u64,
        data: &[u8],
        fua: bool,
    ) -> Result<(), ClientError> {
        let block_bytes = namespace.block_bytes;
        let pieces = self.block_pieces(namespace, offset_blocks, data.len())?;
        let ops = pieces.iter().map(|(at, position, blocks)| {
            let len = *blocks as usize * block_bytes as usize;
            Op::block_write(namespace.id, *at, block_bytes, &data[*position..*position + len], fua)
        });
        self.pipeline(ops, |_, reply| reply.data(0).map(|_| ()))
    }

    /// Makes every block write answered before it durable.
    pub fn block_flush(&mut self, namespace: &NamespaceInfo) -> Result<(), ClientError> {
        self.call(&[Op::flush(namespace.id)])?.data(0).map(|_| ())
    }

    /// Deallocates `num_blocks` from `offset_blocks`: they read as zeroes afterwards.
    pub fn trim(&mut self, namespace: &NamespaceInfo, offset_blocks: u64, num_blocks: u32) -> Result<(), ClientError> {
        self.call(&[Op::trim(namespace.id, offset_blocks, num_blocks)])?.data(0).map(|_| ())
    }

    /// Writes zeroes over `num_blocks` from `offset_blocks`.
    pub fn write_zeroes(
        &mut self,
        namespace: &NamespaceInfo,
        offset_blocks: u64,
        num_blocks: u32,
    ) -> Result<(), ClientError> {
        self.call(&[Op::write_zeroes(namespace.id, offset_blocks, num_blocks)])?.data(0).map(|_| ())
    }

    /// Where data lies from `offset_blocks` of `namespace`: contiguous extents from that block,
    /// at least one, covering at most `num_blocks` (the target may stop short; ask again from
    /// where it stopped). A namespace that cannot tell (HELLO says so in
    /// [`NamespaceInfo::reports_allocation`]) refuses with `not_supported`.
    pub fn block_status(
        &mut self,
        namespace: &NamespaceInfo,
        offset_blocks: u64,
        num_blocks: u32,
    ) -> Result<Vec<Extent>, ClientError> {
        let reply = self.call(&[Op::block_status(namespace.id, offset_blocks, num_blocks)])?;
        Ok(decode_extents(reply.data(0)?, num_blocks)?)
    }

    /// Splits a transfer of `len` bytes into (first block, byte position, blocks) pieces that
    /// fit one datagram each.
    fn block_pieces(
        &self,
        namespace: &NamespaceInfo,
        offset_blocks: u64,
        len: usize,
    ) -> Result<Vec<(u64, usize, u32)>, ClientError> {
        let block_bytes = namespace.block_bytes;
        if !len.is_multiple_of(block_bytes as usize) {
            return Err(ClientError::PartialBlock { len, block_bytes });
        }
        let per_transfer = self.info.blocks_per_transfer(block_bytes).max(1);
        let blocks = (len / block_bytes as usize) as u64;
        Ok((0..blocks)
            .step_by(per_transfer as usize)
            .map(|first| {
                let count = (blocks - first).min(u64::from(per_transfer)) as u32;
                (offset_blocks + first, first as usize * block_bytes as usize, count)
            })
            .collect())
    }

    /// Compare-and-swap; returns the old value (swapped if it equals `expected`).
    pub fn cas(&mut self, space: u16, offset: u64, expected: u64, desired: u64) -> Result<u64, ClientError> {
        word_result(&self.call(&[Op::cas(space, offset, expected, desired)])?)
    }

    /// Fetch-and-add; returns the old value.
    pub fn fetch_add(&mut self, space: u16, offset: u64, addend: u64) -> Result<u64, ClientError> {
        word_result(&self.call(&[Op::fetch_add(space, offset, addend)])?)
    }

    /// Copies `len` bytes within the target, as `memmove` would. More than
    /// [`MAX_LONG_INSTRUCTION_BYTES`] go as several MEMCPYs: pipelined between ranges apart;
    /// between overlapping ranges one at a time, each after the answer to the one before, in
    /// the order that reads every source byte before a piece overwrites it (a piece resent late
    /// could otherwise copy bytes a later piece had already overwritten). Not atomic: in a
    /// session without authentication, a duplicate of a piece delayed in the network past the
    /// next piece is executed again (PROTOCOL.md, "Memory").
    pub fn memcpy(
        &mut self,
        space: u16,
        offset: u64,
        source_space: u16,
        source_offset: u64,
        len: u32,
    ) -> Result<(), ClientError> {
        let copy =
            |at, position: usize, piece| Op::memcpy(space, at, source_space, source_offset + position as u64, piece);
        if len as usize <= MAX_LONG_INSTRUCTION_BYTES {
            return self.call(&[copy(offset, 0, len)])?.data(0).map(|_| ());
        }
        check_byte_range(Opcode::Memcpy as u8, source_offset, len as usize, self.info.region_size(source_space))?;
        let apart = space != source_space
            || offset.saturating_add(u64::from(len)) <= source_offset
            || source_offset.saturating_add(u64::from(len)) <= offset;
        if apart {
            return self.in_pieces(Opcode::Memcpy, space, offset, len, copy, |_, reply| reply.data(0).map(|_| ()));
        }
        check_byte_range(Opcode::Memcpy as u8, offset, len as usize, self.info.region_size(space))?;
        let pieces: Vec<_> = chunks(offset, len as usize, MAX_LONG_INSTRUCTION_BYTES).collect();
        // A destination below its source is copied from the start, one above it from the end.
        let from_the_start = offset <= source_offset;
        for index in 0..pieces.len() {
            let (at, position, piece) = pieces[if from_the_start { index } else { pieces.len() - 1 - index }];
            self.call(&[copy(at, position, piece as u32)])?.data(0)?;
        }
        Ok(())
    }

    /// Sets `len` bytes to `value`; more than [`MAX_LONG_INSTRUCTION_BYTES`] go as several
    /// pipelined FILLs.
    pub fn fill(&mut self, space: u16, offset: u64, len: u32, value: u8) -> Result<(), ClientError> {
        let fill = |at, _, piece| Op::fill(space, at, piece, value);
        self.in_pieces(Opcode::Fill, space, offset, len, fill, |_, reply| reply.data(0).map(|_| ()))
    }

    /// Runs one instruction over `len` bytes at `offset` of `space`, or, over more than
    /// [`MAX_LONG_INSTRUCTION_BYTES`], pipelined pieces of at most that (a worker answers
    /// nothing else while it runs one), the range checked first: `op(at, position, piece_len)`
    /// makes each (`position` counted from `offset`), `on_reply(index, reply)` takes each answer
    /// in order.
    fn in_pieces(
        &mut self,
        opcode: Opcode,
        space: u16,
        offset: u64,
        len: u32,
        op: impl Fn(u64, usize, u32) -> Op,
        on_reply: impl FnMut(usize, Reply) -> Result<(), ClientError>,
    ) -> Result<(), ClientError> {
        if len as usize <= MAX_LONG_INSTRUCTION_BYTES {
            let mut on_reply = on_reply;
            return on_reply(0, self.call(&[op(offset, 0, len)])?);
        }
        check_byte_range(opcode as u8, offset, len as usize, self.info.region_size(space))?;
        let pieces = chunks(offset, len as usize, MAX_LONG_INSTRUCTION_BYTES)
            .map(|(at, position, piece)| op(at, position, piece as u32));
        self.pipeline(pieces, on_reply)
    }

    /// Adds `lanes` into memory lane by lane; returns the new values when `return_result`.
    /// More lanes than one VADD may carry (2048 f32, or fewer in a smaller negotiated datagram)
    /// go as several pipelined VADDs; each adds atomically, the whole does not.
    pub fn vadd(
        &mut self,
        space: u16,
        offset: u64,
        lane: LaneType,
        lanes: &[u8],
        return_result: bool,
    ) -> Result<Vec<u8>, ClientError> {
        check_byte_range(Opcode::Vadd as u8, offset, lanes.len(), self.info.region_size(space))?;
        let pieces: Vec<_> = chunks(offset, lanes.len(), self.info.vadd_chunk_bytes(lane, return_result)).collect();
        let ops = pieces
            .iter()
            .map(|(at, position, len)| Op::vadd(space, *at, lane, &lanes[*position..*position + *len], return_result));
        let mut result = vec![0u8; if return_result { lanes.len() } else { 0 }];
        self.pipeline(ops, |index, reply| {
            let data = reply.data(0)?;
            if return_result {
                let (_, position, len) = pieces[index];
                if data.len() != len {
                    return Err(ClientError::MissingResult(0));
                }
                result[position..position + len].copy_from_slice(data);
            }
            Ok(())
        })?;
        Ok(result)
    }

    /// `op` over the `lane` lanes of `len` bytes at `offset`, computed by the target's `reduce`
    /// extension (a target without it answers `unknown_opcode`). A range longer than one REDUCE
    /// may address goes as several pipelined ones, combined here in range order.
    pub fn reduce(
        &mut self,
        space: u16,
        offset: u64,
        len: u64,
        lane: LaneType,
        op: ReduceOp,
    ) -> Result<ReduceValue, ClientError> {
        let refused = |status| ClientError::Refused { opcode: REDUCE_OPCODE, status };
        let len = usize::try_from(len).map_err(|_| refused(Status::TooLarge))?;
        if len == 0 {
            // No lanes: nothing to reduce, and the target refuses an empty range as malformed.
            return Err(refused(Status::Malformed));
        }
        check_byte_range(REDUCE_OPCODE, offset, len, self.info.region_size(space))?;
        let ops =
            chunks(offset, len, REDUCE_MAX_BYTES).map(|(at, _, piece)| Op::reduce(space, at, piece as u32, lane, op));
        let mut total: Option<ReduceValue> = None;
        self.pipeline(ops, |_, reply| {
            let value = reduce::decode(lane, reply.data(0)?)?;
            total = Some(total.map_or(value, |earlier| reduce::combine(op, earlier, value)));
            Ok(())
        })?;
        total.ok_or(ClientError::MissingResult(0))
    }

    /// ENCRYPT `len` bytes at `offset` under key slot `slot` (AES-256-GCM), in place or into
    /// `destination` (region, offset), binding `aad`; returns the seal (nonce and tag) that
    /// [`Client::decrypt`] needs. Not idempotent: a retransmission gets the stored answer.
    pub fn encrypt(
        &mut self,
        space: u16,
        offset: u64,
        len: u32,
        slot: u32,
        destination: Option<(u16, u64)>,
        aad: &[u8],
    ) -> Result<Seal, ClientError> {
        let reply = self.call(&[Op::encrypt(space, offset, len, slot, destination, aad)])?;
        let data = reply.data(0)?;
        Seal::from_bytes(data).ok_or(ClientError::MissingResult(0))
    }

    /// DECRYPT `len` bytes at `offset` that ENCRYPT sealed as `seal`, under key slot `slot` and
    /// with the same `aad`, in place or into `destination`. A tampered range, seal or `aad` is
    /// refused with `auth_failed`, and nothing is written.
    #[allow(clippy::too_many_arguments)] // the instruction's own fields
    pub fn decrypt(
        &mut self,
        space: u16,
        offset: u64,
        len: u32,
        slot: u32,
        seal: &Seal,
        destination: Option<(u16, u64)>,
        aad: &[u8],
    ) -> Result<(), ClientError> {
        self.call(&[Op::decrypt(space, offset, len, slot, seal, destination, aad)])?.data(0).map(|_| ())
    }

    /// CRC32 of `len` bytes.
    pub fn crc32(&mut self, space: u16, offset: u64, len: u32) -> Result<u32, ClientError> {
        let mut whole = 0;
        let crc = |at, _, piece| Op::crc32(space, at, piece);
        self.in_pieces(Opcode::Crc32, space, offset, len, crc, |index, reply| {
            // Every piece but the last is a whole one.
            let piece = (len as usize - index * MAX_LONG_INSTRUCTION_BYTES).min(MAX_LONG_INSTRUCTION_BYTES);
            whole = netdam_isa::memory::crc32_combine(whole, crc_result(&reply)?, piece as u64);
            Ok(())
        })?;
        Ok(whole)
    }

    fn flush(&mut self) -> Result<(), ClientError> {
        if !self.session.has_queued() {
            // The common case of a spinning wait: no clock read for nothing to send.
            return Ok(());
        }
        let now = self.clock.now();
        let sent = send_due(&mut self.session, &self.socket, &mut self.train, self.info.addr, now);
        // Only a datagram that went out brings an answer soon: requests held back by the
        // window, or lost to a failed send, do not keep an adaptive client spinning.
        if sent.went_out() {
            self.keep_spinning(now);
        }
        match sent.error.and_then(|error| send_failure(&mut self.session, self.info.addr, error, now)) {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// One round of I/O: wait (bounded by the next retransmission deadline) for answers, take
    /// them, handle timeouts, send what is due.
    fn pump(&mut self) -> Result<(), ClientError> {
        self.pump_within(None)
    }

    /// As `pump`, waiting no later than `limit`.
    fn pump_within(&mut self, limit: Option<Instant>) -> Result<(), ClientError> {
        self.flush()?;
        let sleeps = match self.poll {
            ClientPoll::Blocking => true,
            ClientPoll::Busy => false,
            ClientPoll::Adaptive => self.clock.now() >= self.spin_until,
        };
        if sleeps {
            let deadline = match (self.session.poll_timeout(), limit) {
                (Some(deadline), Some(limit)) => Some(deadline.min(limit)),
                (deadline, limit) => deadline.or(limit),
            };
            if let Some(deadline) = deadline {
                let wait = deadline.saturating_since(self.clock.now());
                let wait_ms = wait.as_nanos().div_ceil(1_000_000).min(i32::MAX as u64) as i32;
                let mut poll = libc::pollfd { fd: self.socket.as_raw_fd(), events: libc::POLLIN, revents: 0 };
                // SAFETY: one valid pollfd.
                unsafe { libc::poll(&mut poll, 1, wait_ms) };
            }
        }
        self.progress()
    }

    /// The smoothed round trip of this client's answers, once there is one.
    pub fn smoothed_rtt(&self) -> Option<Duration> {
        self.session.smoothed_rtt()
    }

    /// How long an adaptive client spins after a send or an answer: twice the smoothed round
    /// trip, within `ADAPTIVE_SPIN_MIN` and `ADAPTIVE_SPIN_MAX`, or `ADAPTIVE_SPIN_MAX_LOADED`
    /// while more than one request is on the wire (sent and not answered: requests the window
    /// holds back, or a BUSY answer holds, are no answer due soon).
    pub fn adaptive_spin(&self) -> Duration {
        adaptive_spin_for(self.session.smoothed_rtt(), self.session.on_wire())
    }

    /// After a send or an answer at `now`: an adaptive client spins for a while longer.
    fn keep_spinning(&mut self, now: Instant) {
        if self.poll == ClientPoll::Adaptive {
            self.spin_until = now + self.adaptive_spin();
        }
    }

    /// Whether a request submitted now goes out at once: `submit` waits otherwise.
    pub fn has_room(&self) -> bool {
        self.session.has_room()
    }

    /// Whether requests wait in the session to be sent: ones its congestion window holds back,
    /// or ones parked while it says HELLO again. Only [`Client::progress`] sends them, as
    /// answers arrive or timers fire.
    pub fn has_queued(&self) -> bool {
        self.session.has_queued()
    }

    /// Does what is due without waiting: takes the answers that have arrived, handles timeouts
    /// (retransmissions, BUSY holds, a HELLO again), and sends what the window allows. For a
    /// driver that runs several clients on one thread and waits on their sockets itself (the
    /// fio engine): it calls this when a socket is readable or [`Client::time_to_deadline`]
    /// has passed, then collects answers with [`Client::take_finished`].
    pub fn progress(&mut self) -> Result<(), ClientError> {
        if let Some(error) = self.send_failure.take() {
            return Err(error);
        }
        // One clock read per call (a spinning wait calls this in a loop) and one per answer.
        let started = self.clock.now();
        // A spinning client that found the socket empty moments ago knows how long the next
        // answer waited to within those moments: it reads that one with a plain `recv`, without
        // the kernel's timestamp (`recvmsg` and its control message cost ~0.2 µs more here,
        // docs/DECISIONS.md). Later answers of the same call, and a client that was away, read
        // the timestamp.
        let mut bound_from = match (self.poll, self.polled_empty_at) {
            (ClientPoll::Busy | ClientPoll::Adaptive, Some(at)) if started.saturating_since(at) <= TIGHT_SPIN => {
                Some(at)
            }
            _ => None,
        };
        let mut last_read = None;
        // Whether an answer (not an in-progress notice) came: only an answer frees the window
        // for more, so only an answer keeps an adaptive client spinning.
        let mut answered = false;
        let mut found_empty = false;
        loop {
            let received = if bound_from.is_some() {
                stamped::recv_unstamped(self.socket.as_raw_fd(), &mut self.receive_buffer).map(|len| (len, None))
            } else {
                stamped::recv(self.socket.as_raw_fd(), &mut self.receive_buffer)
            };
            match received {
                Ok((len, stamp)) => {
                    let now = self.clock.now();
                    last_read = Some(now);
                    let waited = match (bound_from.take(), stamp) {
                        (Some(at), _) => now.saturating_since(at),
                        (None, Some(waited)) => waited,
                        // No timestamp from the kernel: counted as read on arrival.
                        (None, None) => Duration::ZERO,
                    };
                    let datagram = &self.receive_buffer[..len];
                    answered |= peek_datagram_status(datagram) != Some(Status::InProgress as u8);
                    self.session.handle_datagram_waited(now, waited, datagram);
                    if self.session.in_flight() == 0 {
                        // Nothing else is awaited: a caller of one request at a time gets its
                        // answer without a receive that finds the socket empty (a system call
                        // on its latency path). A stray duplicate left in the socket is taken
                        // by the next call.
                        break;
                    }
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                    found_empty = true;
                    break;
                }
                Err(error) if error.kind() == io::ErrorKind::ConnectionRefused => {
                    if !self.session.handle_refused(self.clock.now()) {
                        return Err(ClientError::NotListening(self.info.addr));
                    }
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error.into()),
            }
        }
        let now = last_read.unwrap_or(started);
        if answered {
            self.keep_spinning(now);
        }
        if found_empty {
            // The empty receive began after the last answer was read, or after `started`.
            self.polled_empty_at = Some(now);
        }
        self.session.handle_timeout(now);
        while let Some(completion) = self.session.poll_completion() {
            self.finished.push_back((completion.token, completion.result));
        }
        match self.session.poll_established() {
            // A new session (after the target lost the old one) describes the target afresh.
            Some(Ok(answer)) => self.info.hello = answer,
            Some(Err(error)) => self.hello_failure = Some(error),
            None => {}
        }
        self.flush()
    }

    /// A request that has finished (after [`Client::progress`]), if any, oldest answer first.
    pub fn take_finished(&mut self) -> Option<Finished> {
        let (token, result) = self.finished.pop_front()?;
        Some((Ticket(token), result))
    }

    /// Gives a reply's buffer back to the session once its data has been taken, so that
    /// requests in steady state allocate nothing (optional: a dropped reply is just freed).
    pub fn recycle(&mut self, reply: Reply) {
        self.session.recycle(reply);
    }

    /// The answer of `token`, if it has arrived.
    fn take_token(&mut self, token: u64) -> Option<Result<Reply, ClientError>> {
        // The common case, one request at a time: it is the only one, at the front.
        if self.finished.front().is_some_and(|(finished, _)| *finished == token) {
            return self.finished.pop_front().map(|(_, result)| result);
        }
        let index = self.finished.iter().position(|(finished, _)| *finished == token)?;
        self.finished.remove(index).map(|(_, result)| result)
    }

    /// How long until [`Client::progress`] must run even if nothing arrives (a retransmission
    /// or a BUSY hold is due); `None` when nothing is timed.
    pub fn time_to_deadline(&self) -> Option<std::time::Duration> {
        let deadline = self.session.poll_timeout()?;
        Some(deadline.saturating_since(self.clock.now()).to_std())
    }
}

impl AsRawFd for Client {
    /// The socket: readable when answers have arrived.
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.socket.as_raw_fd()
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        // Frees the target's slot at once; a target that does not answer soon lets the session
        // expire instead.
        let _ = self.close_session();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Encryption without a key is refused before anything is sent, by the blocking client and
    /// the asynchronous one alike (it would otherwise go on in the clear).
    #[test]
    fn encryption_without_a_key_is_refused() {
        let mut options = ClientOptions::default();
        options.session.encrypt = true;
        let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let says_why = |refused: Option<ClientError>| matches!(&refused, Some(ClientError::Setting(message)) if message.contains("needs a tenant key"));
        assert!(says_why(Client::connect_with(addr, options).err()));
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        assert!(says_why(runtime.block_on(crate::async_client::AsyncClient::connect_with(addr, options)).err()));
    }

    /// A window out of range is an error naming max_in_flight and its range, not a panic.
    #[test]
    fn a_window_out_of_range_is_refused() {
        use netdam_isa::limits::MAX_IN_FLIGHT;
        let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
        for max_in_flight in [0, MAX_IN_FLIGHT + 1] {
            let mut options = ClientOptions::default();
            options.session.max_in_flight = max_in_flight;
            let names_it = |refused: Option<ClientError>| {
                matches!(&refused, Some(ClientError::Setting(message))
                    if message.contains(&format!("max_in_flight is {max_in_flight}")) && message.contains("1 to 256"))
            };
            assert!(names_it(Client::connect_with(addr, options).err()), "{max_in_flight}");
            assert!(names_it(Client::sessionless_with(addr, options).err()), "{max_in_flight}");
        }
        for max_in_flight in [1, MAX_IN_FLIGHT] {
            let session = SessionConfig { max_in_flight, ..SessionConfig::default() };
            assert!(session.check().is_ok(), "{max_in_flight}");
        }
    }

    /// An adaptive client spins twice its round trip; with one request on the wire or none at
    /// most `ADAPTIVE_SPIN_MAX`, so that a slow lone request is slept through, and with more
    /// at most `ADAPTIVE_SPIN_MAX_LOADED`, so that a disk's bursts of answers at depth find it
    /// awake.
    #[test]
    fn an_adaptive_spin_is_bounded_by_what_is_on_the_wire() {
        let micros = Duration::from_micros;
        // No round trip known yet: it takes the least spin for one.
        assert_eq!(adaptive_spin_for(None, 0), micros(100));
        assert_eq!(adaptive_spin_for(None, 32), micros(100));
        // Quick answers: twice the round trip, whatever is in flight.
        assert_eq!(adaptive_spin_for(Some(micros(10)), 1), ADAPTIVE_SPIN_MIN);
        assert_eq!(adaptive_spin_for(Some(micros(60)), 1), micros(120));
        assert_eq!(adaptive_spin_for(Some(micros(60)), 32), micros(120));
        // A disk's round trip at depth: one request is slept through after 200 µs, many are not.
        assert_eq!(adaptive_spin_for(Some(micros(500)), 0), ADAPTIVE_SPIN_MAX);
        assert_eq!(adaptive_spin_for(Some(micros(500)), 1), ADAPTIVE_SPIN_MAX);
        assert_eq!(adaptive_spin_for(Some(micros(500)), 2), micros(1_000));
        assert_eq!(adaptive_spin_for(Some(micros(400)), 32), micros(800));
        // A slow device at depth: still bounded.
        assert_eq!(adaptive_spin_for(Some(Duration::from_millis(15)), 32), ADAPTIVE_SPIN_MAX_LOADED);
    }

    /// A train refused because nothing listens at the peer any more is the send's error, and
    /// means `NotListening` to a session that does not wait for a restart. (The kernel reports
    /// the ICMP port-unreachable an earlier send drew on the socket's next call: here the
    /// train's `sendmsg`.)
    #[test]
    fn a_refused_train_is_reported_and_means_not_listening() {
        let closed = UdpSocket::bind("127.0.0.1:0").unwrap();
        let peer = closed.local_addr().unwrap();
        drop(closed);
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        socket.connect(peer).unwrap();
        socket.send(b"draws the port-unreachable").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));

        let config = SessionConfig { congestion: None, reconnect_patience: Duration::ZERO, ..SessionConfig::default() };
        let mut session = Session::new(config, 1);
        for token in 0..3 {
            session.submit(&[Op::ping()], token).unwrap();
        }
        // As the clients have it: the socket is connected, so the train names no address.
        let mut train = Train::new(&socket, true).connected_to(peer);
        let sent = send_due(&mut session, &socket, &mut train, peer, Instant::ZERO);
        // Three due at once go the train's way (a lone one would be sent on its own).
        assert_eq!(session.stats().transmissions, 3);
        let error = sent.error.expect("the refusal is reported");
        assert_eq!(error.kind(), io::ErrorKind::ConnectionRefused, "{error}");
        match send_failure(&mut session, peer, error, Instant::ZERO) {
            Some(ClientError::NotListening(addr)) => assert_eq!(addr, peer),
            other => panic!("expected NotListening, got {other:?}"),
        }
    }
}
