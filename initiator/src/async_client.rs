//! The async client: cheap to clone, any number of tasks issue requests concurrently, and one I/O
//! task owns the socket and the session and completes each request's future. When the last
//! handle is dropped the I/O task finishes what is in flight, closes the session and ends (if
//! the runtime shuts down first, the session expires on the target instead).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;

use netdam_isa::control::{decode_stat_answer, RegionInfo, NO_COOKIE};
use netdam_isa::limits::{DEFAULT_DATAGRAM_BYTES, MAX_DATAGRAM_BYTES};
use netdam_isa::{LaneType, Status};
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, oneshot};

use crate::client::{connected_socket, fit_window_to_receive_buffer, ClientOptions, CLOSE_WAIT};
use crate::error::ClientError;
use crate::hello::{hello_step, HelloStep, HELLO_ROUNDS};
use crate::op::Op;
use crate::session::{Reply, Session, SessionConfig};
use crate::target_info::{chunks, crc_result, word_result, TargetInfo};

/// Requests waiting for the I/O task beyond the session window: back-pressure to callers.
const COMMAND_QUEUE: usize = 1024;

struct Command {
    ops: Vec<Op>,
    reply: oneshot::Sender<Result<Reply, ClientError>>,
}

/// An async session with one target.
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
        let (establish_sender, establish_receiver) = oneshot::channel();
        tokio::spawn(drive(socket, session, receiver, establish_receiver, addr));
        let mut client = AsyncClient { commands, info: TargetInfo { addr, hello: Default::default() } };
        // The first HELLO gets a cookie proving this socket's address; the one echoing it, a session.
        let mut cookie = NO_COOKIE;
        for _ in 0..HELLO_ROUNDS {
            let reply = client.call(vec![Op::hello(options.session.max_datagram_bytes as u32, cookie)]).await?;
            match hello_step(&reply)? {
                HelloStep::Retry(next) => cookie = next,
                HelloStep::Established(answer) => {
                    let _ = establish_sender.send((answer.session, answer.max_datagram_bytes as usize));
                    client.info.hello = answer;
                    return Ok(client);
                }
            }
        }
        Err(ClientError::HelloRefused(Status::Retry))
    }

    /// What HELLO said about the target.
    pub fn info(&self) -> &TargetInfo {
        &self.info
    }

    /// The region named (or numbered) `name`.
    pub fn region(&self, name: &str) -> Result<&RegionInfo, ClientError> {
        self.info.region(name)
    }

    /// Sends `ops` in one datagram and waits for the answer.
    pub async fn call(&self, ops: Vec<Op>) -> Result<Reply, ClientError> {
        let (reply, answer) = oneshot::channel();
        self.commands.send(Command { ops, reply }).await.map_err(|_| ClientError::Closed)?;
        answer.await.map_err(|_| ClientError::Closed)?
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
            let (reply, answer) = oneshot::channel();
            let command = Command { ops: vec![Op::read(space, at, piece as u32)], reply };
            self.commands.send(command).await.map_err(|_| ClientError::Closed)?;
            answers.push((position, piece, answer));
        }
        for (position, piece, answer) in answers {
            let reply = answer.await.map_err(|_| ClientError::Closed)??;
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
            let (reply, answer) = oneshot::channel();
            let command = Command { ops: vec![Op::write(space, at, &data[position..position + piece])], reply };
            self.commands.send(command).await.map_err(|_| ClientError::Closed)?;
            answers.push(answer);
        }
        for answer in answers {
            answer.await.map_err(|_| ClientError::Closed)??.data(0)?;
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

/// The I/O task: feeds commands into the session as the window allows, sends, receives, fires
/// timeouts, and completes futures. Ends when every client handle is dropped and nothing is in
/// flight.
async fn drive(
    socket: UdpSocket,
    mut session: Session,
    mut commands: mpsc::Receiver<Command>,
    mut establish: oneshot::Receiver<(u32, usize)>,
    addr: SocketAddr,
) {
    let clock = netdam_isa::time::MonotonicClock::new();
    let mut waiting: HashMap<u64, oneshot::Sender<Result<Reply, ClientError>>> = HashMap::new();
    let mut backlog: VecDeque<Command> = VecDeque::new();
    let mut next_token = 0u64;
    let mut buffer = vec![0u8; MAX_DATAGRAM_BYTES];
    let mut open = true;
    loop {
        if let Ok((session_id, max_datagram_bytes)) = establish.try_recv() {
            session.establish(session_id, max_datagram_bytes);
        }
        while session.has_room() {
            let Some(command) = backlog.pop_front() else { break };
            match session.submit(&command.ops, next_token) {
                Ok(()) => {
                    waiting.insert(next_token, command.reply);
                    next_token += 1;
                }
                Err(error) => {
                    let _ = command.reply.send(Err(error));
                }
            }
        }
        let now = clock.now();
        let mut fatal = None;
        while let Some(datagram) = session.poll_transmit(now) {
            if let Err(error) = socket.try_send(datagram) {
                match error.kind() {
                    std::io::ErrorKind::WouldBlock => {}
                    std::io::ErrorKind::ConnectionRefused => fatal = Some(ClientError::NotListening(addr)),
                    _ => fatal = Some(ClientError::Io(error)),
                }
            }
        }
        if let Some(error) = fatal.take() {
            fail_all(&mut waiting, &error);
        }
        if !open && waiting.is_empty() && backlog.is_empty() {
            close_session(&socket, &mut session, &clock, &mut buffer).await;
            return;
        }
        let sleep_until = session
            .poll_timeout()
            .map(|deadline| tokio::time::Instant::now() + deadline.saturating_since(clock.now()).to_std());
        tokio::select! {
            command = commands.recv(), if open && backlog.len() < COMMAND_QUEUE => match command {
                Some(command) => backlog.push_back(command),
                None => open = false,
            },
            received = socket.recv(&mut buffer) => match received {
                Ok(len) => session.handle_datagram(clock.now(), &buffer[..len]),
                Err(error) if error.kind() == std::io::ErrorKind::ConnectionRefused => {
                    fail_all(&mut waiting, &ClientError::NotListening(addr));
                }
                Err(error) => fail_all(&mut waiting, &ClientError::Io(error)),
            },
            () = async {
                match sleep_until {
                    Some(when) => tokio::time::sleep_until(when).await,
                    None => std::future::pending().await,
                }
            } => {}
        }
        session.handle_timeout(clock.now());
        while let Some(completion) = session.poll_completion() {
            if let Some(reply) = waiting.remove(&completion.token) {
                let _ = reply.send(completion.result);
            }
        }
    }
}

/// Sends CLOSE for the session and waits (at most [`CLOSE_WAIT`]) for the target to confirm.
async fn close_session(
    socket: &UdpSocket,
    session: &mut Session,
    clock: &netdam_isa::time::MonotonicClock,
    buffer: &mut [u8],
) {
    const CLOSE_TOKEN: u64 = u64::MAX;
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

/// Fails every waiting request with a copy of `error` (the socket is unusable).
fn fail_all(waiting: &mut HashMap<u64, oneshot::Sender<Result<Reply, ClientError>>>, error: &ClientError) {
    for (_, reply) in waiting.drain() {
        let copy = match error {
            ClientError::NotListening(addr) => ClientError::NotListening(*addr),
            other => ClientError::Io(std::io::Error::other(other.to_string())),
        };
        let _ = reply.send(Err(copy));
    }
}
