//! The async client: cheap to clone, any number of tasks issue requests concurrently, and one I/O
//! task owns the socket and the session and completes each request's future. When the last
//! handle is dropped the I/O task finishes what is in flight, closes the session and ends (if
//! the runtime shuts down first, the session expires on the target instead).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;

use netdam_isa::control::{decode_stat_answer, Cookie, HelloAnswer, RegionInfo, NO_COOKIE};
use netdam_isa::limits::{DEFAULT_DATAGRAM_BYTES, MAX_DATAGRAM_BYTES};
use netdam_isa::time::MonotonicClock;
use netdam_isa::{LaneType, Status};
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, oneshot};

use crate::client::{connected_socket, fit_window_to_receive_buffer, ClientOptions, CLOSE_WAIT};
use crate::error::ClientError;
use crate::hello::{hello_step, HelloStep, HELLO_ROUNDS};
use crate::op::Op;
use crate::session::{Completion, Reply, Session, SessionConfig};
use crate::target_info::{chunks, crc_result, word_result, TargetInfo};

/// Requests waiting for the I/O task beyond the session window: back-pressure to callers.
const COMMAND_QUEUE: usize = 1024;

/// Completion tokens of the I/O task's own requests (callers' tokens count up from 0).
const HELLO_TOKEN: u64 = u64::MAX - 1;
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
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Command").field("ops", &self.ops.len()).finish()
    }
}

/// A request handed to the I/O task, whose answer is still to come.
#[derive(Debug)]
pub struct Pending(oneshot::Receiver<Result<Reply, ClientError>>);

impl Pending {
    /// Waits for the answer.
    pub async fn wait(self) -> Result<Reply, ClientError> {
        self.0.await.map_err(|_| ClientError::Closed)?
    }
}

impl AsyncClient {
    /// Connects, starts the I/O task on the current runtime, and says HELLO.
    pub async fn connect(addr: SocketAddr) -> Result<AsyncClient, ClientError> {
        AsyncClient::connect_with(addr, ClientOptions::default()).await
    }

    /// As [`AsyncClient::connect`], with options (the poll mode is the runtime's business).
    pub async fn connect_with(addr: SocketAddr, options: ClientOptions) -> Result<AsyncClient, ClientError> {
        let socket = connected_socket(addr, options.local_addr)?;
        socket.set_nonblocking(true)?;
        let socket = UdpSocket::from_std(socket)?;
        let session_config = fit_window_to_receive_buffer(&socket2::SockRef::from(&socket), options.session);
        let (commands, receiver) = mpsc::channel(COMMAND_QUEUE);
        let session = Session::new(SessionConfig { max_datagram_bytes: DEFAULT_DATAGRAM_BYTES, ..session_config }, 0);
        let (established, answer) = oneshot::channel();
        let driver = Driver {
            socket,
            session,
            addr,
            clock: MonotonicClock::new(),
            requested_datagram_bytes: options.session.max_datagram_bytes as u32,
            waiting: HashMap::new(),
            backlog: VecDeque::new(),
            next_token: 0,
            hello: Some(HelloState::new(Some(established))),
        };
        tokio::spawn(driver.run(receiver));
        let hello = answer.await.map_err(|_| ClientError::Closed)??;
        Ok(AsyncClient { commands, info: TargetInfo { addr, hello } })
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
    /// (it restarted, or the session expired), the I/O task says HELLO again and resends the
    /// request when that is safe (as [`crate::Client::call`] does).
    pub async fn call(&self, ops: Vec<Op>) -> Result<Reply, ClientError> {
        self.submit(ops).await?.wait().await
    }

    /// Hands `ops` (one datagram) to the I/O task without waiting for the answer; waits only
    /// while the task's queue is full. Submit several, then wait for each, to keep them in
    /// flight together.
    pub async fn submit(&self, ops: Vec<Op>) -> Result<Pending, ClientError> {
        let (reply, answer) = oneshot::channel();
        self.commands.send(Command { ops, reply }).await.map_err(|_| ClientError::Closed)?;
        Ok(Pending(answer))
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
        let mut out = vec![0u8; len];
        let mut answers = Vec::new();
        for (at, position, piece) in chunks(offset, len, self.info.read_chunk_bytes()) {
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
        Ok(out)
    }

    /// Writes `data` at `offset`, every chunk in flight at once.
    pub async fn write(&self, space: u16, offset: u64, data: &[u8]) -> Result<(), ClientError> {
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

    /// Adds lanes into memory; returns the new values when `return_result`.
    pub async fn vadd(
        &self,
        space: u16,
        offset: u64,
        lane: LaneType,
        lanes: &[u8],
        return_result: bool,
    ) -> Result<Vec<u8>, ClientError> {
        Ok(self.call(vec![Op::vadd(space, offset, lane, lanes, return_result)]).await?.data(0)?.to_vec())
    }

    /// CRC32 of `len` bytes.
    pub async fn crc32(&self, space: u16, offset: u64, len: u32) -> Result<u32, ClientError> {
        crc_result(&self.call(vec![Op::crc32(space, offset, len)]).await?)
    }
}

/// The HELLO exchange under way: at start, or after the target lost the session.
struct HelloState {
    cookie: Cookie,
    rounds: usize,
    /// The current HELLO has been handed to the session (it waits for room otherwise).
    submitted: bool,
    /// Who waits for the first session: `connect_with`.
    notify: Option<oneshot::Sender<Result<HelloAnswer, ClientError>>>,
}

impl HelloState {
    fn new(notify: Option<oneshot::Sender<Result<HelloAnswer, ClientError>>>) -> HelloState {
        HelloState { cookie: NO_COOKIE, rounds: 0, submitted: false, notify }
    }
}

/// The I/O task: says HELLO, feeds commands into the session as the window allows, sends,
/// receives, fires timeouts, and completes futures. When the target answers `no_session`, it
/// says HELLO again and resends what is safe to resend. Ends when every client handle is
/// dropped and nothing is in flight, closing the session.
struct Driver {
    socket: UdpSocket,
    session: Session,
    addr: SocketAddr,
    clock: MonotonicClock,
    requested_datagram_bytes: u32,
    /// Commands in the session, by token: kept whole, so one may be sent again in a new session.
    waiting: HashMap<u64, Command>,
    /// Commands not yet in the session (window full, or no session yet).
    backlog: VecDeque<Command>,
    next_token: u64,
    hello: Option<HelloState>,
}

impl Driver {
    async fn run(mut self, mut commands: mpsc::Receiver<Command>) {
        let mut buffer = vec![0u8; MAX_DATAGRAM_BYTES];
        let mut open = true;
        loop {
            self.submit_what_fits();
            let mut fatal = None;
            let now = self.clock.now();
            while let Some(datagram) = self.session.poll_transmit(now) {
                if let Err(error) = self.socket.try_send(datagram) {
                    match error.kind() {
                        std::io::ErrorKind::WouldBlock => {}
                        std::io::ErrorKind::ConnectionRefused => fatal = Some(ClientError::NotListening(self.addr)),
                        _ => fatal = Some(ClientError::Io(error)),
                    }
                }
            }
            if let Some(error) = fatal.take() {
                self.fail_all(&error);
            }
            if !open && self.waiting.is_empty() && self.backlog.is_empty() && self.hello.is_none() {
                close_session(&self.socket, &mut self.session, &self.clock, &mut buffer).await;
                return;
            }
            let sleep_until = self
                .session
                .poll_timeout()
                .map(|deadline| tokio::time::Instant::now() + deadline.saturating_since(self.clock.now()).to_std());
            tokio::select! {
                command = commands.recv(), if open && self.backlog.len() < COMMAND_QUEUE => match command {
                    Some(command) => self.backlog.push_back(command),
                    None => open = false,
                },
                received = self.socket.recv(&mut buffer) => match received {
                    Ok(len) => self.session.handle_datagram(self.clock.now(), &buffer[..len]),
                    Err(error) if error.kind() == std::io::ErrorKind::ConnectionRefused => {
                        self.fail_all(&ClientError::NotListening(self.addr));
                    }
                    Err(error) => self.fail_all(&ClientError::Io(error)),
                },
                () = async {
                    match sleep_until {
                        Some(when) => tokio::time::sleep_until(when).await,
                        None => std::future::pending().await,
                    }
                } => {}
            }
            self.session.handle_timeout(self.clock.now());
            while let Some(completion) = self.session.poll_completion() {
                self.complete(completion);
            }
        }
    }

    /// Hands the session the pending HELLO, or commands while there is a session and room.
    fn submit_what_fits(&mut self) {
        if let Some(hello) = &mut self.hello {
            if !hello.submitted && self.session.has_room() {
                let op = Op::hello(self.requested_datagram_bytes, hello.cookie);
                match self.session.submit(&[op], HELLO_TOKEN) {
                    Ok(()) => hello.submitted = true,
                    Err(error) => self.end_hello(Err(error)),
                }
            }
            return;
        }
        while self.session.has_room() {
            let Some(command) = self.backlog.pop_front() else { break };
            match self.session.submit(&command.ops, self.next_token) {
                Ok(()) => {
                    self.waiting.insert(self.next_token, command);
                    self.next_token += 1;
                }
                Err(error) => {
                    let _ = command.reply.send(Err(error));
                }
            }
        }
    }

    fn complete(&mut self, completion: Completion) {
        if completion.token == HELLO_TOKEN {
            let step = completion.result.and_then(|reply| hello_step(&reply));
            match step {
                Ok(HelloStep::Retry(cookie)) => {
                    let hello = self.hello.as_mut().expect("a HELLO answer while saying HELLO");
                    hello.rounds += 1;
                    if hello.rounds >= HELLO_ROUNDS {
                        self.end_hello(Err(ClientError::HelloRefused(Status::Retry)));
                    } else {
                        hello.cookie = cookie;
                        hello.submitted = false;
                    }
                }
                Ok(HelloStep::Established(answer)) => self.end_hello(Ok(answer)),
                Err(error) => self.end_hello(Err(error)),
            }
            return;
        }
        let Some(command) = self.waiting.remove(&completion.token) else { return };
        let lost_session = match &completion.result {
            Ok(reply) => {
                let header = reply.response().header;
                reply.response().status() == Status::NoSession && header.session != 0
            }
            Err(_) => false,
        };
        if !lost_session {
            let _ = command.reply.send(completion.result);
            return;
        }
        // The target no longer knows the session. The request did not run in this
        // transmission; if it was its only one, or it is idempotent, it may go again.
        let attempts = completion.result.as_ref().map(|reply| reply.attempts).unwrap_or(0);
        if attempts == 1 || command.ops.iter().all(Op::is_idempotent) {
            self.backlog.push_front(command);
        } else {
            let _ = command.reply.send(Err(ClientError::SessionLost));
        }
        if self.hello.is_none() {
            self.session.forget();
            self.hello = Some(HelloState::new(None));
        }
    }

    /// Ends a HELLO exchange: adopts the session, or fails whoever waits for one.
    fn end_hello(&mut self, outcome: Result<HelloAnswer, ClientError>) {
        let Some(hello) = self.hello.take() else { return };
        match outcome {
            Ok(answer) => {
                self.session.establish(answer.session, answer.max_datagram_bytes as usize);
                if let Some(notify) = hello.notify {
                    let _ = notify.send(Ok(answer));
                }
            }
            Err(error) => {
                for command in self.backlog.drain(..) {
                    let _ = command.reply.send(Err(copy_error(&error)));
                }
                if let Some(notify) = hello.notify {
                    let _ = notify.send(Err(error));
                }
            }
        }
    }

    /// Fails every request, waiting or queued, with a copy of `error` (the socket is unusable).
    fn fail_all(&mut self, error: &ClientError) {
        for (_, command) in self.waiting.drain() {
            let _ = command.reply.send(Err(copy_error(error)));
        }
        for command in self.backlog.drain(..) {
            let _ = command.reply.send(Err(copy_error(error)));
        }
        if self.hello.is_some() {
            self.end_hello(Err(copy_error(error)));
        }
    }
}

/// A copy of `error` for each of several waiting callers (io::Error is not Clone).
fn copy_error(error: &ClientError) -> ClientError {
    match error {
        ClientError::NotListening(addr) => ClientError::NotListening(*addr),
        ClientError::SessionLost => ClientError::SessionLost,
        ClientError::HelloRefused(status) => ClientError::HelloRefused(*status),
        ClientError::TimedOut { attempts } => ClientError::TimedOut { attempts: *attempts },
        other => ClientError::Io(std::io::Error::other(other.to_string())),
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
