//! The tokio driver of the NBD export: accepts connections, runs each client's handshake
//! through [`Negotiation`], then serves its requests as [`Session::decide`] rules.
//!
//! Per connection, one reader (the connection task) reads requests and spawns one task per
//! request, so requests run concurrently on the backend; one writer task sends each reply as
//! its request completes (possibly out of order, which NBD allows), so reply frames never
//! interleave. Both ends are bounded: at most `max_in_flight_per_connection` requests and
//! `max_in_flight_bytes_per_connection` bytes of data are held, and when either is used up the
//! reader stops reading the socket until replies have gone out.
//!
//! Shutdown: the server stops accepting and closes its listening socket; connections still in
//! the handshake are closed; connections in transmission finish the requests they have read
//! and send the replies, answer every request read after that with `NBD_ESHUTDOWN` (the
//! spec's request to disconnect; nothing is executed but a FLUSH), and close when the client
//! disconnects, or with nothing in flight once `SHUTDOWN_QUIET` has passed since the stop.
//! Connections that have not finished within `drain_timeout` are cut (their backend calls are
//! cancelled).

use std::future::Future;
use std::io::{self, IoSlice};
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinError, JoinSet};

use crate::nbd::backend::{BackendError, NbdBackend};
use crate::nbd::codec::{
    command_name, encode_reply_head, Errno, OptionHeader, ReplyBody, ReplyStyle, RequestHeader, CMD_BLOCK_STATUS,
    CMD_FLUSH, CMD_READ, CMD_TRIM, CMD_WRITE, CMD_WRITE_ZEROES, MAX_REPLY_HEAD_LEN, OPTION_HEADER_LEN, STATE_HOLE,
    STATE_ZERO,
};
use crate::nbd::io::{shutdown, write_all, write_all_vectored, FrameReader};
use crate::nbd::limits::{
    ACCEPT_RETRY_DELAY, DEFAULT_DRAIN_TIMEOUT, DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_IN_FLIGHT_BYTES_PER_CONNECTION, DEFAULT_MAX_IN_FLIGHT_PER_CONNECTION, DEFAULT_MAX_PAYLOAD_BYTES,
    MAX_ADVERTISED_PAYLOAD_BYTES, MAX_IN_FLIGHT_BYTES_PER_CONNECTION, MAX_MIN_BLOCK_BYTES, MAX_STRING_BYTES,
    READ_BUFFER_BYTES, RECENT_ERRORS, REPLY_BATCH_BYTES, REPLY_COPY_LIMIT_BYTES, SHUTDOWN_QUIET, ZERO_BUFFER_BYTES,
};
use crate::nbd::listen::{BoundSocket, NbdListener};
use crate::nbd::negotiate::{ExportInfo, Negotiation, NegotiationError, Step};
use crate::nbd::transmission::{Command, Decision, ProtocolViolation, Session};
use crate::pieces::pieces;

/// How the export is presented and bounded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportOptions {
    /// The export's name (clients asking for the empty name, the default export, get it too).
    pub name: String,
    /// A description shown by `nbdinfo` and `NBD_OPT_LIST`.
    pub description: Option<String>,
    /// Refuse writes (`EPERM`) and advertise the export as read-only.
    pub read_only: bool,
    /// Simultaneous connections; further clients wait in the listen backlog until one ends.
    pub max_connections: usize,
    /// Requests one connection may have in flight; beyond that its socket is not read.
    pub max_in_flight_per_connection: usize,
    /// Bytes of request and reply data one connection may hold; beyond that its socket is not
    /// read. A request larger than the whole budget waits until it has the budget to itself.
    pub max_in_flight_bytes_per_connection: usize,
    /// The maximum payload advertised (`NBD_INFO_BLOCK_SIZE`): the largest read or write a
    /// client may send. It is independent of the backend's `max_request_bytes`: larger
    /// requests are split into backend calls no larger than that. Rounded down to a multiple
    /// of the block size. The default is the 32 MiB every client assumes anyway.
    pub max_payload_bytes: u32,
    /// Time a client has to finish the handshake before it is disconnected.
    pub handshake_timeout: Duration,
    /// Time connections get at shutdown to finish their in-flight requests.
    pub drain_timeout: Duration,
}

impl Default for ExportOptions {
    fn default() -> ExportOptions {
        ExportOptions {
            name: String::new(),
            description: None,
            read_only: false,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_in_flight_per_connection: DEFAULT_MAX_IN_FLIGHT_PER_CONNECTION,
            max_in_flight_bytes_per_connection: DEFAULT_MAX_IN_FLIGHT_BYTES_PER_CONNECTION,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
        }
    }
}

/// What a finished [`serve`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServeReport {
    /// Connections accepted.
    pub connections: u64,
    /// Connections that finished the handshake and entered transmission.
    pub transmissions: u64,
    /// Transmission requests answered (`NBD_CMD_DISC` is not answered and not counted).
    pub requests: u64,
    /// Requests answered with an error.
    pub request_errors: u64,
    /// Of those, requests read after the server began to stop, answered `NBD_ESHUTDOWN`.
    pub refused_at_shutdown: u64,
    /// Connections that ended on a protocol violation, a timeout or an I/O error (a client
    /// that disconnects between requests, or with `NBD_OPT_ABORT`/`NBD_CMD_DISC`, is not one).
    pub connection_errors: u64,
    /// Failed `accept` calls (the server retries after a pause).
    pub accept_errors: u64,
    /// Connections still busy at the end of the drain timeout, closed without their replies.
    pub connections_cut_at_drain: u64,
    /// Backend calls that panicked (a bug in the backend); each was answered with `EIO`.
    pub backend_panics: u64,
    /// Times every connection slot was taken (`max_connections`), so that further clients
    /// waited in the listen backlog; each is logged once, with how many slots there are.
    pub connection_limit_reached: u64,
    /// The latest connection and accept failures, oldest first (at most
    /// [`RECENT_ERRORS`]), each naming the connection.
    pub recent_errors: Vec<String>,
}

impl ServeReport {
    fn note_error(&mut self, error: String) {
        tracing::warn!("{error}");
        if self.recent_errors.len() == RECENT_ERRORS {
            self.recent_errors.remove(0);
        }
        self.recent_errors.push(error);
    }
}

/// Serves `backend` as one NBD export on `listener` until `shutdown` completes, then drains
/// (see the module documentation) and returns what happened.
///
/// Fails at once, before accepting anyone, if the options or the backend's geometry are
/// unusable (the error names the setting); I/O errors of single connections never end the
/// server, they are counted in the report.
pub async fn serve<B: NbdBackend>(
    listener: NbdListener,
    backend: Arc<B>,
    options: ExportOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> io::Result<ServeReport> {
    serve_counting(listener, backend, options, shutdown, &AtomicU64::new(0)).await
}

/// As [`serve`], keeping the number of client connections open in `open_connections` (a gauge
/// for `/metrics`).
pub async fn serve_counting<B: NbdBackend>(
    listener: NbdListener,
    backend: Arc<B>,
    options: ExportOptions,
    shutdown: impl Future<Output = ()> + Send,
    open_connections: &AtomicU64,
) -> io::Result<ServeReport> {
    let shared = Arc::new(Shared::new(backend, &options)?);
    let NbdListener { socket, unix_file } = listener;
    let acceptor = Acceptor::new(socket)?;
    let (stop, stopped) = watch::channel(false);
    let connection_slots = Arc::new(Semaphore::new(options.max_connections));
    let mut connections: JoinSet<ConnectionOutcome> = JoinSet::new();
    let mut report = ServeReport::default();
    let mut free_slot: Option<OwnedSemaphorePermit> = None;
    let mut next_id: u64 = 0;
    tokio::pin!(shutdown);

    loop {
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            Some(done) = connections.join_next(), if !connections.is_empty() => record(&mut report, done),
            // A slot first, so that with every slot taken new clients wait in the backlog.
            slot = connection_slots.clone().acquire_owned(), if free_slot.is_none() => {
                free_slot = Some(slot.map_err(|_| io::Error::other("the connection limit was closed"))?);
            }
            accepted = acceptor.accept(), if free_slot.is_some() => match accepted {
                Ok(accepted) => {
                    next_id += 1;
                    report.connections += 1;
                    tracing::info!(connection = next_id, "NBD client connected");
                    let Some(slot) = free_slot.take() else { unreachable!("accept runs only with a free slot") };
                    spawn_connection(&mut connections, accepted, next_id, shared.clone(), stopped.clone(), slot);
                    if connection_slots.available_permits() == 0 {
                        // A client that connects now waits without a word from us (NBD has no
                        // reply for "busy" before the greeting), so the log says why.
                        report.connection_limit_reached += 1;
                        tracing::warn!(
                            max_connections = options.max_connections,
                            "all {} connection slots are taken: further NBD clients wait, unanswered, until one \
                             disconnects (--max-connections)",
                            options.max_connections
                        );
                    }
                }
                Err(error) => {
                    // Out of descriptors or memory, or a client that gave up in the backlog:
                    // nothing to do but wait a little and carry on.
                    report.accept_errors += 1;
                    report.note_error(format!("accept failed: {error}"));
                    tokio::select! {
                        () = &mut shutdown => break,
                        () = tokio::time::sleep(ACCEPT_RETRY_DELAY) => {}
                    }
                }
            },
        }
        open_connections.store(connections.len() as u64, Ordering::Relaxed);
    }

    // Refuse new clients at once, and tell the connections.
    drop(acceptor);
    drop(unix_file);
    let _ = stop.send(true);
    let drained = tokio::time::timeout(options.drain_timeout, async {
        while let Some(done) = connections.join_next().await {
            record(&mut report, done);
        }
    })
    .await;
    if drained.is_err() {
        report.connections_cut_at_drain += connections.len() as u64;
        report.note_error(format!(
            "{} connection(s) still busy after the {:?} drain timeout were closed",
            connections.len(),
            options.drain_timeout
        ));
        connections.shutdown().await;
    }
    open_connections.store(0, Ordering::Relaxed);
    report.transmissions = shared.transmissions.load(Ordering::Relaxed);
    report.requests = shared.requests.load(Ordering::Relaxed);
    report.request_errors = shared.request_errors.load(Ordering::Relaxed);
    report.refused_at_shutdown = shared.refused_at_shutdown.load(Ordering::Relaxed);
    report.backend_panics = shared.backend_panics.load(Ordering::Relaxed);
    Ok(report)
}

fn record(report: &mut ServeReport, done: Result<ConnectionOutcome, JoinError>) {
    match done {
        Ok(outcome) => {
            tracing::info!(connection = outcome.id, peer = %outcome.peer, "NBD client gone");
            if let Err(error) = outcome.result {
                report.connection_errors += 1;
                report.note_error(format!("connection {} ({}): {error}", outcome.id, outcome.peer));
            }
        }
        Err(error) if error.is_cancelled() => {}
        Err(error) => {
            report.connection_errors += 1;
            report.note_error(format!("a connection task failed: {error}"));
        }
    }
}

/// What every connection shares: the backend, the export, the bounds, the counters.
struct Shared<B> {
    backend: Arc<B>,
    export: ExportInfo,
    /// Largest backend call, a multiple of the block size.
    piece_bytes: u64,
    max_in_flight: usize,
    max_in_flight_bytes: usize,
    handshake_timeout: Duration,
    transmissions: AtomicU64,
    requests: AtomicU64,
    request_errors: AtomicU64,
    refused_at_shutdown: AtomicU64,
    backend_panics: AtomicU64,
    zero_buffer: OnceLock<Box<[u8]>>,
}

impl<B: NbdBackend> Shared<B> {
    fn new(backend: Arc<B>, options: &ExportOptions) -> io::Result<Shared<B>> {
        let (export, piece_bytes) = export_info(&*backend, options)?;
        Ok(Shared {
            backend,
            export,
            piece_bytes,
            max_in_flight: options.max_in_flight_per_connection,
            max_in_flight_bytes: options.max_in_flight_bytes_per_connection,
            handshake_timeout: options.handshake_timeout,
            transmissions: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            request_errors: AtomicU64::new(0),
            refused_at_shutdown: AtomicU64::new(0),
            backend_panics: AtomicU64::new(0),
            zero_buffer: OnceLock::new(),
        })
    }

    /// Zeroes for backends that can neither trim nor write zeroes: a multiple of the block
    /// size, at most one backend call.
    fn zero_buffer(&self) -> &[u8] {
        self.zero_buffer.get_or_init(|| {
            let block = u64::from(self.export.min_block_bytes);
            let len = (ZERO_BUFFER_BYTES as u64).min(self.piece_bytes) / block * block;
            vec![0u8; len.max(block) as usize].into_boxed_slice()
        })
    }
}

/// Checks the options and the backend's geometry and derives what clients are told, and the
/// largest backend call. Errors name the setting at fault.
fn export_info<B: NbdBackend>(backend: &B, options: &ExportOptions) -> io::Result<(ExportInfo, u64)> {
    let invalid = |message: String| Err(io::Error::new(io::ErrorKind::InvalidInput, message));
    for (what, text) in [("name", Some(&options.name)), ("description", options.description.as_ref())] {
        if let Some(text) = text {
            if text.len() > MAX_STRING_BYTES || text.contains('\0') {
                return invalid(format!("export {what} must be at most {MAX_STRING_BYTES} bytes without NUL"));
            }
        }
    }
    if options.max_connections == 0 {
        return invalid("max_connections must be at least 1".into());
    }
    if options.max_in_flight_per_connection == 0 || options.max_in_flight_per_connection > Semaphore::MAX_PERMITS {
        return invalid(format!(
            "max_in_flight_per_connection must be between 1 and {}, not {}",
            Semaphore::MAX_PERMITS,
            options.max_in_flight_per_connection
        ));
    }
    let budget = options.max_in_flight_bytes_per_connection;
    if budget == 0 || budget > MAX_IN_FLIGHT_BYTES_PER_CONNECTION {
        return invalid(format!(
            "max_in_flight_bytes_per_connection must be between 1 and {MAX_IN_FLIGHT_BYTES_PER_CONNECTION}, not {budget}"
        ));
    }
    if options.handshake_timeout.is_zero() {
        return invalid("handshake_timeout must not be zero".into());
    }
    let block = backend.block_bytes();
    if !block.is_power_of_two() || block > MAX_MIN_BLOCK_BYTES {
        return invalid(format!("the backend's block size {block} is not a power of two up to {MAX_MIN_BLOCK_BYTES}"));
    }
    let piece_bytes = backend.max_request_bytes() / block * block;
    if piece_bytes == 0 {
        return invalid(format!(
            "the backend's max_request_bytes {} is smaller than its block size {block}",
            backend.max_request_bytes()
        ));
    }
    // The spec wants the preferred size to be a power of two of at least 512 and the block
    // size, and the maximum payload at least the preferred size.
    let preferred_floor = block.max(512);
    let max_payload = options.max_payload_bytes / block * block;
    if max_payload < preferred_floor || options.max_payload_bytes > MAX_ADVERTISED_PAYLOAD_BYTES {
        return invalid(format!(
            "max_payload_bytes must be between {preferred_floor} and {MAX_ADVERTISED_PAYLOAD_BYTES}, not {}",
            options.max_payload_bytes
        ));
    }
    let preferred = backend.preferred_bytes();
    let preferred =
        if preferred.is_power_of_two() { preferred } else { preferred.checked_ilog2().map_or(0, |log| 1 << log) };
    let largest_power_in_payload = 1u32 << max_payload.ilog2();
    let preferred = preferred.max(preferred_floor).min(largest_power_in_payload);
    let export = ExportInfo {
        name: options.name.clone(),
        description: options.description.clone(),
        size_bytes: backend.size_bytes(),
        read_only: options.read_only,
        min_block_bytes: block,
        preferred_block_bytes: preferred,
        max_payload_bytes: max_payload,
        trim_reads_zeroes: backend.trim_reads_zeroes(),
        reports_allocation: backend.can_report_allocation(),
    };
    Ok((export, u64::from(piece_bytes)))
}

/// The listening socket, in the runtime.
enum Acceptor {
    Tcp(TcpListener),
    Unix(UnixListener),
}

enum Accepted {
    Tcp(TcpStream, std::net::SocketAddr),
    Unix(UnixStream),
}

impl Acceptor {
    fn new(socket: BoundSocket) -> io::Result<Acceptor> {
        Ok(match socket {
            BoundSocket::Tcp(listener) => {
                listener.set_nonblocking(true)?;
                Acceptor::Tcp(TcpListener::from_std(listener)?)
            }
            BoundSocket::Unix(listener) => {
                listener.set_nonblocking(true)?;
                Acceptor::Unix(UnixListener::from_std(listener)?)
            }
        })
    }

    async fn accept(&self) -> io::Result<Accepted> {
        match self {
            Acceptor::Tcp(listener) => listener.accept().await.map(|(stream, peer)| Accepted::Tcp(stream, peer)),
            Acceptor::Unix(listener) => listener.accept().await.map(|(stream, _)| Accepted::Unix(stream)),
        }
    }
}

fn spawn_connection<B: NbdBackend>(
    connections: &mut JoinSet<ConnectionOutcome>,
    accepted: Accepted,
    id: u64,
    shared: Arc<Shared<B>>,
    stopped: watch::Receiver<bool>,
    slot: OwnedSemaphorePermit,
) {
    match accepted {
        Accepted::Tcp(stream, peer) => {
            // Replies are small and latency matters more than packet count.
            let _ = stream.set_nodelay(true);
            let (reader, writer) = stream.into_split();
            connections.spawn(connection(shared, reader, writer, stopped, slot, id, peer.to_string()));
        }
        Accepted::Unix(stream) => {
            let (reader, writer) = stream.into_split();
            connections.spawn(connection(shared, reader, writer, stopped, slot, id, "unix socket".to_string()));
        }
    }
}

/// How one connection ended.
struct ConnectionOutcome {
    id: u64,
    peer: String,
    result: Result<(), ConnectionError>,
}

/// Why a connection ended badly.
#[derive(Debug, thiserror::Error)]
enum ConnectionError {
    #[error("{during}: {source}")]
    Io { during: &'static str, source: io::Error },
    #[error("handshake: {0}")]
    Negotiation(#[from] NegotiationError),
    #[error("handshake not finished within {0:?}")]
    HandshakeTimeout(Duration),
    #[error("closed: {0}")]
    Protocol(#[from] ProtocolViolation),
}

fn io_error(during: &'static str) -> impl FnOnce(io::Error) -> ConnectionError {
    move |source| ConnectionError::Io { during, source }
}

async fn connection<B, R, W>(
    shared: Arc<Shared<B>>,
    reader: R,
    mut writer: W,
    mut stopped: watch::Receiver<bool>,
    _slot: OwnedSemaphorePermit,
    id: u64,
    peer: String,
) -> ConnectionOutcome
where
    B: NbdBackend,
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let mut outcome = ConnectionOutcome { id, peer, result: Ok(()) };
    let mut reader = FrameReader::new(reader, READ_BUFFER_BYTES);
    let timeout = shared.handshake_timeout;
    // A client still negotiating at shutdown has nothing in flight: it is simply closed.
    let negotiated = tokio::select! {
        _ = stopped.wait_for(|stop| *stop) => return outcome,
        negotiated = tokio::time::timeout(timeout, handshake(&mut reader, &mut writer, &shared.export, id)) => negotiated,
    };
    let session = match negotiated {
        Err(_) => Err(ConnectionError::HandshakeTimeout(timeout)),
        Ok(Ok(Some(session))) => Ok(session),
        Ok(Ok(None)) => return outcome,
        Ok(Err(error)) => Err(error),
    };
    let session = match session {
        Ok(session) => session,
        Err(error) => {
            // Let the client read an error reply before the close (best effort).
            let _ = shutdown(&mut writer).await;
            outcome.result = Err(error);
            return outcome;
        }
    };
    shared.transmissions.fetch_add(1, Ordering::Relaxed);
    outcome.result = transmission(shared, session, reader, writer, stopped).await;
    outcome
}

/// Runs option haggling for connection `id`; `Ok(None)` if the client ended it with
/// `NBD_OPT_ABORT`.
async fn handshake<R, W>(
    reader: &mut FrameReader<R>,
    writer: &mut W,
    export: &ExportInfo,
    id: u64,
) -> Result<Option<Session>, ConnectionError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut negotiation = Negotiation::new(export);
    let mut out = Vec::with_capacity(512);
    negotiation.greeting(&mut out);
    write_all(writer, &out).await.map_err(io_error("sending the greeting"))?;
    let mut flags = [0u8; 4];
    reader.read_exact(&mut flags).await.map_err(io_error("reading the client flags"))?;
    negotiation.client_flags(u32::from_be_bytes(flags))?;
    let mut header_bytes = [0u8; OPTION_HEADER_LEN];
    let mut data = Vec::new();
    loop {
        reader.read_exact(&mut header_bytes).await.map_err(io_error("reading an option"))?;
        let header = OptionHeader::parse(&header_bytes).map_err(NegotiationError::from)?;
        out.clear();
        if let Err(error) = negotiation.option_header(&header, &mut out) {
            let _ = write_all(writer, &out).await;
            return Err(error.into());
        }
        // Bounded by option_header (MAX_OPTION_BYTES).
        data.resize(header.length as usize, 0);
        reader.read_exact(&mut data).await.map_err(io_error("reading an option's data"))?;
        let step = negotiation.option(&header, &data, &mut out);
        if let Some(name) = negotiation.take_unknown_export() {
            // The client gets NBD_REP_ERR_UNKNOWN and may ask again; whoever runs the export
            // learns why the client then gives up (at most MAX_OPTIONS lines per connection).
            tracing::warn!(
                connection = id,
                "NBD client asked for export {name:?}, which this server does not have (it exports {:?})",
                export.name
            );
        }
        let sent = write_all(writer, &out).await;
        match step {
            // The client may hang up without waiting for the ACK to an ABORT; that is fine.
            Step::Close => return Ok(None),
            Step::Fail(error) => return Err(error.into()),
            Step::Continue => sent.map_err(io_error("sending an option reply"))?,
            Step::Transmission(session) => {
                sent.map_err(io_error("sending the export information"))?;
                return Ok(Some(session));
            }
        }
    }
}

/// A reply on its way to the writer. It holds the request's slot and data budget, so both are
/// released only once the reply has been written (or dropped with a dead connection).
struct Outgoing {
    cookie: u64,
    request_offset: u64,
    body: OutBody,
    _slot: OwnedSemaphorePermit,
    _bytes: Option<OwnedSemaphorePermit>,
}

enum OutBody {
    Done,
    Data { offset: u64, data: Vec<u8> },
    BlockStatus { context_id: u32, extents: Vec<(u64, u32)> },
    Error { errno: Errno, message: String },
}

/// A checked command with its payload, ready for the backend.
enum Job {
    Read { offset: u64, len: usize },
    Write { offset: u64, data: Vec<u8>, fua: bool },
    Flush,
    Trim { offset: u64, len: u64, fua: bool },
    WriteZeroes { offset: u64, len: u64, fua: bool, may_trim: bool, fast: bool },
    BlockStatus { offset: u64, len: u64, one: bool, context_id: u32 },
}

/// How the request loop ended.
enum LoopEnd {
    /// The client sent `NBD_CMD_DISC`, closed between requests, or the server is stopping.
    Clean,
    /// The writer stopped (its error is the connection's).
    WriterGone,
}

async fn transmission<B, R, W>(
    shared: Arc<Shared<B>>,
    session: Session,
    mut reader: FrameReader<R>,
    writer: W,
    mut stopped: watch::Receiver<bool>,
) -> Result<(), ConnectionError>
where
    B: NbdBackend,
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(shared.max_in_flight));
    let budget = Arc::new(Semaphore::new(shared.max_in_flight_bytes));
    // Every queued reply holds a slot, so the queue never holds more than the slots allow.
    let (replies, outbox) = mpsc::channel::<Outgoing>(shared.max_in_flight);
    // In a JoinSet so that the writer is aborted with the connection task (at the drain
    // deadline) instead of outliving it, stuck on a client that reads nothing.
    let mut writer_task: JoinSet<io::Result<()>> = JoinSet::new();
    writer_task.spawn(write_replies(writer, outbox, session.style));
    let mut requests: JoinSet<()> = JoinSet::new();
    let mut header_bytes = vec![0u8; session.request_header_len()];

    // Once the server stops, requests read are answered NBD_ESHUTDOWN (the client is to
    // disconnect; a FLUSH still runs) and the connection closes when the client does, or once
    // its requests are done and SHUTDOWN_QUIET has passed since the stop. That bound does not
    // restart with each request: a client that does not disconnect on ESHUTDOWN (the Linux
    // kernel's fails the I/O and sends more) is not kept for the drain timeout.
    let mut stopping = false;
    let mut quiet_until = tokio::time::Instant::now();
    let ended: Result<LoopEnd, ConnectionError> = loop {
        // With every slot taken the socket is not read: back-pressure on the client.
        let slot = tokio::select! {
            biased;
            _ = stopped.wait_for(|stop| *stop), if !stopping => {
                stopping = true;
                quiet_until = tokio::time::Instant::now() + SHUTDOWN_QUIET;
                continue;
            }
            () = replies.closed() => break Ok(LoopEnd::WriterGone),
            // Reap finished tasks as they come, so the set does not grow.
            Some(_) = requests.join_next(), if !requests.is_empty() => continue,
            slot = slots.clone().acquire_owned() => slot.expect("the slot semaphore is never closed"),
        };
        // Shutdown takes effect here, between requests; a request whose first bytes have
        // arrived before it is read whole and served.
        if reader.buffered() == 0 {
            let filled = tokio::select! {
                biased;
                _ = stopped.wait_for(|stop| *stop), if !stopping => {
                    stopping = true;
                    quiet_until = tokio::time::Instant::now() + SHUTDOWN_QUIET;
                    continue;
                }
                () = replies.closed() => break Ok(LoopEnd::WriterGone),
                () = done_by(&mut requests, quiet_until), if stopping => break Ok(LoopEnd::Clean),
                filled = reader.fill() => filled,
            };
            match filled {
                Ok(0) => break Ok(LoopEnd::Clean),
                Ok(_) => {}
                Err(error) => break Err(io_error("reading a request")(error)),
            }
        }
        if let Err(error) = reader.read_exact(&mut header_bytes).await {
            break Err(io_error("reading a request header")(error));
        }
        let request = match RequestHeader::parse(session.style, &header_bytes) {
            Ok(request) => request,
            Err(error) => break Err(ProtocolViolation::from(error).into()),
        };
        let decision = session.decide(&request);
        let decision = if stopping { decision.at_shutdown() } else { decision };
        let command = match decision {
            Decision::Execute(command) => command,
            Decision::Disconnect => break Ok(LoopEnd::Clean),
            Decision::Violation(violation) => break Err(violation.into()),
            Decision::Refuse { errno, message, discard_bytes } => {
                if let Err(error) = reader.discard(discard_bytes).await {
                    break Err(io_error("skipping a refused request's payload")(error));
                }
                shared.requests.fetch_add(1, Ordering::Relaxed);
                shared.request_errors.fetch_add(1, Ordering::Relaxed);
                if errno == Errno::Shutdown {
                    shared.refused_at_shutdown.fetch_add(1, Ordering::Relaxed);
                }
                let reply = Outgoing {
                    cookie: request.cookie,
                    request_offset: request.offset,
                    body: OutBody::Error { errno, message },
                    _slot: slot,
                    _bytes: None,
                };
                if replies.send(reply).await.is_err() {
                    break Ok(LoopEnd::WriterGone);
                }
                continue;
            }
        };
        // Data held for this request: its payload or its read buffer. Both are bounded by the
        // maximum payload (Session::decide), so the cast cannot truncate.
        let data_bytes = match command {
            Command::Read { len, .. } | Command::Write { len, .. } => len as usize,
            _ => 0,
        };
        let bytes = if data_bytes == 0 {
            None
        } else {
            let permits = data_bytes.min(shared.max_in_flight_bytes) as u32;
            Some(budget.clone().acquire_many_owned(permits).await.expect("the budget semaphore is never closed"))
        };
        let job = match command {
            Command::Read { offset, len } => Job::Read { offset, len: len as usize },
            Command::Write { offset, fua, .. } => {
                let mut data = vec![0u8; data_bytes];
                if let Err(error) = reader.read_exact(&mut data).await {
                    break Err(io_error("reading a write's payload")(error));
                }
                Job::Write { offset, data, fua }
            }
            Command::Flush => Job::Flush,
            Command::Trim { offset, len, fua } => Job::Trim { offset, len, fua },
            Command::WriteZeroes { offset, len, fua, may_trim, fast } => {
                Job::WriteZeroes { offset, len, fua, may_trim, fast }
            }
            Command::BlockStatus { offset, len, one, context_id } => Job::BlockStatus { offset, len, one, context_id },
        };
        let shared = shared.clone();
        let replies = replies.clone();
        requests.spawn(async move {
            let body = match CatchUnwind(Box::pin(execute(&shared, job))).await {
                Ok(body) => body,
                Err(()) => {
                    // The backend's bug; the client still gets an answer, so it never hangs.
                    shared.backend_panics.fetch_add(1, Ordering::Relaxed);
                    OutBody::Error { errno: Errno::Io, message: "the backend panicked (a bug)".into() }
                }
            };
            shared.requests.fetch_add(1, Ordering::Relaxed);
            if matches!(body, OutBody::Error { .. }) {
                shared.request_errors.fetch_add(1, Ordering::Relaxed);
            }
            let reply =
                Outgoing { cookie: request.cookie, request_offset: request.offset, body, _slot: slot, _bytes: bytes };
            // A closed outbox means the client is gone; the request still ran to completion.
            let _ = replies.send(reply).await;
        });
    };

    // Finish what was read: every spawned request runs to completion and queues its reply.
    drop(replies);
    while requests.join_next().await.is_some() {}
    let written = match writer_task.join_next().await {
        Some(Ok(written)) => written,
        Some(Err(error)) => Err(io::Error::other(format!("the reply writer failed: {error}"))),
        None => unreachable!("the writer task was spawned above"),
    };
    match (ended, written) {
        (Err(error), _) => Err(error),
        (Ok(LoopEnd::WriterGone), Err(error)) => Err(io_error("sending a reply")(error)),
        // The client may close its end right after its last reply (it has what it wanted).
        (Ok(_), Err(error)) if is_hang_up(&error) => Ok(()),
        (Ok(_), Err(error)) => Err(io_error("sending a reply")(error)),
        (Ok(_), Ok(())) => Ok(()),
    }
}

/// Completes once every request of a stopping connection has finished and `until` has passed.
async fn done_by(requests: &mut JoinSet<()>, until: tokio::time::Instant) {
    while requests.join_next().await.is_some() {}
    tokio::time::sleep_until(until).await;
}

/// A future that turns a panic while it is polled into `Err(())` (the panic message still goes
/// to the panic hook, i.e. stderr).
struct CatchUnwind<F>(Pin<Box<F>>);

impl<F: Future> Future for CatchUnwind<F> {
    type Output = Result<F::Output, ()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // AssertUnwindSafe: after a panic the future is never polled again, and the backend's
        // state is the backend's business (its later calls may fail; they are answered too).
        match std::panic::catch_unwind(AssertUnwindSafe(|| self.0.as_mut().poll(cx))) {
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(_) => Poll::Ready(Err(())),
        }
    }
}

fn is_hang_up(error: &io::Error) -> bool {
    matches!(error.kind(), io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset | io::ErrorKind::NotConnected)
}

/// Writes replies as they come, batching small ones into one write, then closes the write
/// side once every sender is gone.
async fn write_replies<W: AsyncWrite + Unpin>(
    mut writer: W,
    mut outbox: mpsc::Receiver<Outgoing>,
    style: ReplyStyle,
) -> io::Result<()> {
    let mut batch = Vec::with_capacity(REPLY_BATCH_BYTES + REPLY_COPY_LIMIT_BYTES + MAX_REPLY_HEAD_LEN);
    while let Some(first) = outbox.recv().await {
        let mut next = Some(first);
        while let Some(reply) = next.take() {
            let body = match &reply.body {
                OutBody::Done => ReplyBody::Done,
                OutBody::Data { offset, data } => ReplyBody::Data { offset: *offset, len: data.len() },
                OutBody::BlockStatus { context_id, extents } => {
                    ReplyBody::BlockStatus { context_id: *context_id, extents }
                }
                OutBody::Error { errno, message } => ReplyBody::Error { errno: *errno, message },
            };
            encode_reply_head(style, reply.cookie, reply.request_offset, body, &mut batch);
            if let OutBody::Data { data, .. } = &reply.body {
                if data.len() >= REPLY_COPY_LIMIT_BYTES {
                    write_all_vectored(&mut writer, &mut [IoSlice::new(&batch), IoSlice::new(data)]).await?;
                    batch.clear();
                } else {
                    batch.extend_from_slice(data);
                }
            }
            drop(reply);
            if batch.len() < REPLY_BATCH_BYTES {
                next = outbox.try_recv().ok();
            }
        }
        if !batch.is_empty() {
            write_all(&mut writer, &batch).await?;
            batch.clear();
        }
    }
    shutdown(&mut writer).await
}

/// Runs one request on the backend and says what to reply.
async fn execute<B: NbdBackend>(shared: &Shared<B>, job: Job) -> OutBody {
    let backend = &*shared.backend;
    let piece_bytes = shared.piece_bytes;
    let result = match job {
        Job::Read { offset, len } => {
            let mut data = vec![0u8; len];
            let mut result = Ok(());
            for (at, _, piece) in pieces(offset, len as u64, piece_bytes) {
                let start = (at - offset) as usize;
                if let Err(error) = backend.read(at, &mut data[start..start + piece as usize]).await {
                    result = Err(failure(CMD_READ, at, piece, error));
                    break;
                }
            }
            return match result {
                Ok(()) => OutBody::Data { offset, data },
                Err(body) => body,
            };
        }
        Job::Write { offset, data, fua } => write_pieces(backend, offset, &data, fua, piece_bytes).await,
        Job::Flush => backend.flush().await.map_err(|error| failure(CMD_FLUSH, 0, 0, error)),
        Job::Trim { offset, len, fua } => match trim(backend, offset, len, piece_bytes).await {
            Ok(trimmed) if trimmed && fua => {
                backend.flush().await.map_err(|error| failure(CMD_TRIM, offset, len, error))
            }
            Ok(_) => Ok(()),
            Err(body) => Err(body),
        },
        Job::WriteZeroes { offset, len, fua, may_trim, fast } => {
            match zero(shared, offset, len, may_trim, fast).await {
                Ok(()) if fua => backend.flush().await.map_err(|error| failure(CMD_WRITE_ZEROES, offset, len, error)),
                other => other,
            }
        }
        Job::BlockStatus { offset, len, one, context_id } => {
            return block_status(shared, offset, len, one, context_id).await;
        }
    };
    match result {
        Ok(()) => OutBody::Done,
        Err(body) => body,
    }
}

async fn write_pieces<B: NbdBackend>(
    backend: &B,
    offset: u64,
    data: &[u8],
    fua: bool,
    piece_bytes: u64,
) -> Result<(), OutBody> {
    for (at, _, piece) in pieces(offset, data.len() as u64, piece_bytes) {
        let start = (at - offset) as usize;
        backend
            .write(at, &data[start..start + piece as usize], fua)
            .await
            .map_err(|error| failure(CMD_WRITE, at, piece, error))?;
    }
    Ok(())
}

/// Trims a range; `Ok(false)` if the backend cannot trim, which for `NBD_CMD_TRIM` (a hint)
/// is still success.
async fn trim<B: NbdBackend>(backend: &B, offset: u64, len: u64, piece_bytes: u64) -> Result<bool, OutBody> {
    for (at, _, piece) in pieces(offset, len, piece_bytes) {
        match backend.trim(at, piece).await {
            Ok(()) => {}
            Err(BackendError::NotSupported(_)) => return Ok(false),
            Err(error) => return Err(failure(CMD_TRIM, at, piece, error)),
        }
    }
    Ok(true)
}

/// Zeroes a range by the cheapest means the client allows: trim (when the backend promises it
/// reads back as zeroes) when holes are allowed, else the backend's write-zeroes, else plain
/// writes of zeroes. A fast-only request never falls back to a slower means: it fails with
/// `ENOTSUP` instead (a request forbidding holes never gets here fast, see
/// [`Session::decide`]).
async fn zero<B: NbdBackend>(
    shared: &Shared<B>,
    offset: u64,
    len: u64,
    may_trim: bool,
    fast: bool,
) -> Result<(), OutBody> {
    let backend = &*shared.backend;
    let piece_bytes = shared.piece_bytes;
    if may_trim {
        match trim(backend, offset, len, piece_bytes).await {
            Ok(true) => return Ok(()),
            Ok(false) if fast => {
                let message = "the backend cannot trim, so zeroing would not be fast".to_string();
                return Err(OutBody::Error { errno: Errno::NotSup, message });
            }
            Ok(false) => {}
            Err(body) => return Err(body),
        }
    }
    let mut supported = true;
    for (at, _, piece) in pieces(offset, len, piece_bytes) {
        match backend.write_zeroes(at, piece).await {
            Ok(()) => {}
            Err(BackendError::NotSupported(_)) => {
                supported = false;
                break;
            }
            Err(error) => return Err(failure(CMD_WRITE_ZEROES, at, piece, error)),
        }
    }
    if supported {
        return Ok(());
    }
    // Without FAST_ZERO the spec forbids ENOTSUP: write the zeroes out.
    let zeroes = shared.zero_buffer();
    for (at, _, piece) in pieces(offset, len, zeroes.len() as u64) {
        backend
            .write(at, &zeroes[..piece as usize], false)
            .await
            .map_err(|error| failure(CMD_WRITE_ZEROES, at, piece, error))?;
    }
    Ok(())
}

/// Asks the backend where data lies and shapes its answer into what the protocol promises:
/// contiguous extents of whole blocks with known flags only, together no longer than the
/// request (which keeps structured replies' 32-bit lengths in range), exactly one with
/// `REQ_ONE`. A backend that unexpectedly cannot tell gets the answer the spec allows for
/// that: one extent of allocated data (flags 0, always safe) over the whole range.
async fn block_status<B: NbdBackend>(shared: &Shared<B>, offset: u64, len: u64, one: bool, context_id: u32) -> OutBody {
    let block = u64::from(shared.export.min_block_bytes);
    let answer = match shared.backend.block_status(offset, len).await {
        Ok(answer) => answer,
        Err(BackendError::NotSupported(_)) => vec![(len, 0)],
        Err(error) => return failure(CMD_BLOCK_STATUS, offset, len, error),
    };
    let mut extents = Vec::with_capacity(if one { 1 } else { answer.len() });
    let mut covered = 0u64;
    for (length, flags) in answer {
        // A partial block would put every later extent off its offset: stop after it.
        let whole = length / block * block;
        let kept = whole.min(len - covered);
        if kept == 0 {
            break;
        }
        covered += kept;
        extents.push((kept, flags & (STATE_HOLE | STATE_ZERO)));
        if one || covered == len || whole != length {
            break;
        }
    }
    if extents.is_empty() {
        let message = format!("the backend reported no extent for {len} bytes at offset {offset}");
        return OutBody::Error { errno: Errno::Io, message };
    }
    OutBody::BlockStatus { context_id, extents }
}

/// The reply to a failed backend call, naming the call.
fn failure(command: u16, offset: u64, len: u64, error: BackendError) -> OutBody {
    // What an operator must look into (the device, a grant) is logged, not only answered.
    let io = matches!(error, BackendError::Io(_) | BackendError::NotPermitted(_));
    let errno = match error {
        BackendError::Io(_) => Errno::Io,
        BackendError::NotPermitted(_) => Errno::Perm,
        BackendError::Invalid(_) => Errno::Inval,
        BackendError::NoSpace(_) => Errno::NoSpc,
        BackendError::NotSupported(_) => Errno::NotSup,
    };
    let message = if command == CMD_FLUSH {
        format!("{}: {error}", command_name(command))
    } else {
        format!("{} at offset {offset} of {len} bytes: {error}", command_name(command))
    };
    if io {
        log_io_failure(if errno == Errno::Perm { "EPERM" } else { "EIO" }, &message);
    }
    OutBody::Error { errno, message }
}

/// Logs a request answered with an I/O error (the target silent past the reconnect timeout, or
/// down, or its device failing) or refused for want of a grant (EPERM): at most one line a
/// second, with how many such answers there were since the line before, so an operator sees why
/// clients fail without a line per request. Refusals of a client's own mistakes (unaligned,
/// beyond the end) are not logged.
fn log_io_failure(errno: &str, message: &str) {
    static LAST_SECOND: AtomicU64 = AtomicU64::new(u64::MAX);
    static SINCE_LAST_LINE: AtomicU64 = AtomicU64::new(0);
    let second = netdam_isa::time::clock_ns(libc::CLOCK_MONOTONIC) / 1_000_000_000;
    let failed = SINCE_LAST_LINE.fetch_add(1, Ordering::Relaxed) + 1;
    if LAST_SECOND.swap(second, Ordering::Relaxed) != second {
        SINCE_LAST_LINE.fetch_sub(failed, Ordering::Relaxed);
        tracing::warn!(requests_failed = failed, "answering an NBD client with {errno}: {message}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend of a given geometry that stores nothing; with `allocation`, it reports that
    /// block status answer (or error) for any range.
    struct Geometry {
        size: u64,
        block: u32,
        preferred: u32,
        max_request: u32,
        allocation: Option<Result<Vec<(u64, u32)>, BackendError>>,
    }

    impl NbdBackend for Geometry {
        fn size_bytes(&self) -> u64 {
            self.size
        }
        fn block_bytes(&self) -> u32 {
            self.block
        }
        fn preferred_bytes(&self) -> u32 {
            self.preferred
        }
        fn max_request_bytes(&self) -> u32 {
            self.max_request
        }
        async fn read(&self, _: u64, _: &mut [u8]) -> Result<(), BackendError> {
            Ok(())
        }
        async fn write(&self, _: u64, _: &[u8], _: bool) -> Result<(), BackendError> {
            Ok(())
        }
        async fn flush(&self) -> Result<(), BackendError> {
            Ok(())
        }
        async fn trim(&self, _: u64, _: u64) -> Result<(), BackendError> {
            Ok(())
        }
        async fn write_zeroes(&self, _: u64, _: u64) -> Result<(), BackendError> {
            Ok(())
        }
        fn can_report_allocation(&self) -> bool {
            self.allocation.is_some()
        }
        async fn block_status(&self, _: u64, _: u64) -> Result<Vec<(u64, u32)>, BackendError> {
            self.allocation.clone().unwrap_or_else(|| Err(BackendError::NotSupported("no allocation".into())))
        }
    }

    fn geometry(block: u32, preferred: u32, max_request: u32) -> Geometry {
        Geometry { size: 1 << 30, block, preferred, max_request, allocation: None }
    }

    #[test]
    fn export_geometry_follows_the_backend() {
        let (export, piece) = export_info(&geometry(4096, 65536, 4 << 20), &ExportOptions::default()).unwrap();
        assert_eq!(export.min_block_bytes, 4096);
        assert_eq!(export.preferred_block_bytes, 65536);
        assert_eq!(export.max_payload_bytes, DEFAULT_MAX_PAYLOAD_BYTES);
        assert_eq!(piece, 4 << 20);
    }

    #[test]
    fn preferred_sizes_are_fixed_up_to_what_the_spec_allows() {
        let options = ExportOptions { max_payload_bytes: 1 << 20, ..ExportOptions::default() };
        // Not a power of two: rounded down.
        let (export, _) = export_info(&geometry(512, 3000, 1 << 20), &options).unwrap();
        assert_eq!(export.preferred_block_bytes, 2048);
        // Below 512: raised.
        let (export, _) = export_info(&geometry(1, 1, 1 << 20), &options).unwrap();
        assert_eq!(export.preferred_block_bytes, 512);
        // Above the maximum payload: lowered.
        let (export, _) = export_info(&geometry(512, 1 << 24, 1 << 20), &options).unwrap();
        assert_eq!(export.preferred_block_bytes, 1 << 20);
        // Backend calls are whole blocks.
        let (_, piece) = export_info(&geometry(4096, 4096, 10_000), &options).unwrap();
        assert_eq!(piece, 8192);
    }

    #[test]
    fn unusable_settings_are_refused_by_name() {
        let options = ExportOptions::default();
        let cases: Vec<(Geometry, ExportOptions, &str)> = vec![
            (geometry(3000, 4096, 1 << 20), options.clone(), "block size 3000"),
            (geometry(1 << 17, 1 << 17, 1 << 20), options.clone(), "block size 131072"),
            (geometry(4096, 4096, 100), options.clone(), "max_request_bytes 100"),
            (geometry(512, 4096, 1 << 20), ExportOptions { max_connections: 0, ..options.clone() }, "max_connections"),
            (
                geometry(512, 4096, 1 << 20),
                ExportOptions { max_in_flight_per_connection: 0, ..options.clone() },
                "max_in_flight_per_connection",
            ),
            (
                geometry(512, 4096, 1 << 20),
                ExportOptions { max_in_flight_bytes_per_connection: 0, ..options.clone() },
                "max_in_flight_bytes_per_connection",
            ),
            (
                geometry(512, 4096, 1 << 20),
                ExportOptions { max_payload_bytes: 100, ..options.clone() },
                "max_payload_bytes",
            ),
            (
                geometry(512, 4096, 1 << 20),
                ExportOptions { max_payload_bytes: u32::MAX, ..options.clone() },
                "max_payload_bytes",
            ),
            (geometry(512, 4096, 1 << 20), ExportOptions { name: "a\0b".into(), ..options.clone() }, "name"),
            (
                geometry(512, 4096, 1 << 20),
                ExportOptions { description: Some("x".repeat(5000)), ..options.clone() },
                "description",
            ),
            (
                geometry(512, 4096, 1 << 20),
                ExportOptions { handshake_timeout: Duration::ZERO, ..options.clone() },
                "handshake_timeout",
            ),
        ];
        for (backend, options, expected) in cases {
            let error = export_info(&backend, &options).unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
            assert!(error.to_string().contains(expected), "{error} should mention {expected}");
        }
    }

    #[test]
    fn the_serve_future_can_be_spawned() {
        fn assert_send_static<T: Send + 'static>(_: &T) {}
        let listener = NbdListener::bind(&crate::nbd::Listen::Tcp("127.0.0.1:0".parse().unwrap())).unwrap();
        let backend = Arc::new(geometry(512, 4096, 1 << 20));
        let future = serve(listener, backend, ExportOptions::default(), std::future::pending());
        assert_send_static(&future);
    }

    fn status_of(answer: Vec<(u64, u32)>, error: Option<BackendError>, len: u64, one: bool) -> OutBody {
        let backend =
            Geometry { size: 1 << 20, allocation: Some(error.map_or(Ok(answer), Err)), ..geometry(512, 4096, 1 << 20) };
        let shared = Shared::new(Arc::new(backend), &ExportOptions::default()).unwrap();
        assert!(shared.export.reports_allocation);
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(block_status(&shared, 0, len, one, 3))
    }

    #[test]
    fn block_status_answers_are_kept_to_what_the_protocol_promises() {
        let extents = |body: OutBody| match body {
            OutBody::BlockStatus { context_id: 3, extents } => extents,
            _ => panic!("expected block status"),
        };
        let answer = vec![(1024, STATE_HOLE | STATE_ZERO | 0x80), (2048, 0), (4096, STATE_ZERO)];
        assert_eq!(extents(status_of(answer.clone(), None, 8192, false)), [(1024, 3), (2048, 0), (4096, 2)]);
        assert_eq!(extents(status_of(answer.clone(), None, 2048, false)), [(1024, 3), (1024, 0)], "cut at the request");
        assert_eq!(extents(status_of(answer, None, 8192, true)), [(1024, 3)], "REQ_ONE: one extent");
        assert_eq!(extents(status_of(vec![(1000, 1), (512, 0)], None, 4096, false)), [(512, 1)], "whole blocks only");
        let unsupported = Some(BackendError::NotSupported("no".into()));
        assert_eq!(extents(status_of(vec![], unsupported, 4096, false)), [(4096, 0)], "cannot tell: allocated");
        let OutBody::Error { errno: Errno::Io, .. } = status_of(vec![], Some(BackendError::Io("x".into())), 512, false)
        else {
            panic!("an I/O error is reported")
        };
        let OutBody::Error { errno: Errno::Io, .. } = status_of(vec![(100, 0)], None, 512, false) else {
            panic!("no whole extent is an error")
        };
    }

    #[test]
    fn backend_errors_map_to_nbd_errors() {
        let cases = [
            (BackendError::Io("disk".into()), Errno::Io),
            (BackendError::Invalid("x".into()), Errno::Inval),
            (BackendError::NoSpace("full".into()), Errno::NoSpc),
            (BackendError::NotSupported("no".into()), Errno::NotSup),
            (BackendError::NotPermitted("no grant".into()), Errno::Perm),
        ];
        for (error, expected) in cases {
            let OutBody::Error { errno, message } = failure(CMD_WRITE, 4096, 512, error) else {
                panic!("an error body")
            };
            assert_eq!(errno, expected);
            assert!(message.contains("NBD_CMD_WRITE at offset 4096 of 512 bytes"), "{message}");
        }
    }
}
