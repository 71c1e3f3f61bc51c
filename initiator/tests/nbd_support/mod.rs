//! Shared by the NBD tests: an in-memory backend that checks every call it gets, a server
//! running on its own runtime thread, and a raw NBD client over blocking sockets for sending
//! exactly the bytes a test wants (well-formed or not).

#![allow(dead_code)] // each test binary uses a different part

use std::collections::BTreeSet;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use netdam_initiator::nbd::codec::{
    InfoRequest, OptionHeader, ReplyStyle, RequestHeader, EXTENDED_REPLY_MAGIC, FLAG_C_FIXED_NEWSTYLE,
    FLAG_C_NO_ZEROES, IHAVEOPT, INFO_BLOCK_SIZE, INFO_EXPORT, NBD_MAGIC, OPTION_REPLY_MAGIC, OPT_EXTENDED_HEADERS,
    OPT_GO, OPT_SET_META_CONTEXT, OPT_STRUCTURED_REPLY, REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS,
    REPLY_TYPE_BLOCK_STATUS_EXT, REPLY_TYPE_ERROR, REPLY_TYPE_NONE, REPLY_TYPE_OFFSET_DATA, REP_ACK, REP_INFO,
    REP_META_CONTEXT, SIMPLE_REPLY_MAGIC, STATE_HOLE, STATE_ZERO, STRUCTURED_REPLY_MAGIC,
};
use netdam_initiator::nbd::{serve, BackendError, ExportOptions, Listen, NbdBackend, NbdListener, ServeReport};

/// How many calls of each kind the backend got.
#[derive(Debug, Default)]
pub struct Calls {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub fua_writes: AtomicU64,
    pub flushes: AtomicU64,
    pub trims: AtomicU64,
    pub write_zeroes: AtomicU64,
    pub block_statuses: AtomicU64,
    /// Calls the server should never have made: unaligned, too large or past the end.
    pub bad_calls: AtomicU64,
    /// Largest single call, in bytes.
    pub largest_call_bytes: AtomicU64,
    /// Calls running right now, and the most seen at once.
    pub running: AtomicUsize,
    pub most_running: AtomicUsize,
}

impl Calls {
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::SeqCst)
    }
}

/// A disk in memory: a `Vec<u8>` behind a mutex, with counters and optional delays/failures.
pub struct MemDisk {
    pub data: Mutex<Vec<u8>>,
    block: u32,
    preferred: u32,
    max_request: u32,
    delay: Duration,
    failing_read_offset: Option<u64>,
    panicking_read_offset: Option<u64>,
    /// Trim is a discard that leaves the old data (as some devices do).
    trim_keeps_data: bool,
    /// Per block, its `base:allocation` flags: a hole until written, a hole again when
    /// trimmed, zeroes (allocated) after write-zeroes.
    allocation: Mutex<Vec<u32>>,
    /// Whether the backend reports allocation (`with_allocation`).
    reports_allocation: bool,
    /// Most extents one block-status answer carries (a short answer makes the client ask again).
    max_extents: usize,
    pub calls: Calls,
}

/// A block never written: a hole that reads as zeroes.
const UNWRITTEN: u32 = STATE_HOLE | STATE_ZERO;

impl MemDisk {
    /// A zeroed disk of `size` bytes with `block`-byte blocks and 256 KiB backend calls.
    pub fn new(size: usize, block: u32) -> MemDisk {
        MemDisk {
            data: Mutex::new(vec![0; size]),
            block,
            preferred: 64 * 1024,
            max_request: 256 * 1024,
            delay: Duration::ZERO,
            failing_read_offset: None,
            panicking_read_offset: None,
            trim_keeps_data: false,
            allocation: Mutex::new(vec![UNWRITTEN; size.div_ceil(block as usize)]),
            reports_allocation: false,
            max_extents: 64,
            calls: Calls::default(),
        }
    }

    /// The backend reports allocation (`base:allocation` is offered), at most `max_extents`
    /// extents per answer.
    pub fn with_allocation(mut self, max_extents: usize) -> MemDisk {
        self.reports_allocation = true;
        self.max_extents = max_extents;
        self
    }

    /// Sets the allocation flags of a byte range (whole blocks).
    fn mark(&self, offset: u64, len: u64, flags: u32) {
        let block = u64::from(self.block);
        self.allocation.lock().unwrap()[(offset / block) as usize..((offset + len) / block) as usize].fill(flags);
    }

    /// Every call first sleeps this long (to keep requests in flight).
    pub fn with_delay(mut self, delay: Duration) -> MemDisk {
        self.delay = delay;
        self
    }

    /// Reads covering `offset` fail with an I/O error.
    pub fn with_failing_read_at(mut self, offset: u64) -> MemDisk {
        self.failing_read_offset = Some(offset);
        self
    }

    /// A read starting at `offset` panics (a backend bug, for the server to survive).
    pub fn with_panicking_read_at(mut self, offset: u64) -> MemDisk {
        self.panicking_read_offset = Some(offset);
        self
    }

    /// Trim leaves the data in place, and the backend says so (`trim_reads_zeroes` is false).
    pub fn with_trim_keeping_data(mut self) -> MemDisk {
        self.trim_keeps_data = true;
        self
    }

    /// The largest call the backend takes.
    pub fn with_max_request(mut self, bytes: u32) -> MemDisk {
        self.max_request = bytes;
        self
    }

    pub fn snapshot(&self) -> Vec<u8> {
        self.data.lock().unwrap().clone()
    }

    pub fn fill(&self, byte: u8) {
        self.data.lock().unwrap().fill(byte);
    }

    fn size(&self) -> u64 {
        self.data.lock().unwrap().len() as u64
    }

    /// Checks what the server promises the backend: aligned, bounded, inside the disk.
    async fn enter(&self, offset: u64, len: u64) -> Result<Running<'_>, BackendError> {
        let running = Running::new(&self.calls);
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        self.calls.largest_call_bytes.fetch_max(len, Ordering::SeqCst);
        let block = u64::from(self.block);
        if !offset.is_multiple_of(block)
            || !len.is_multiple_of(block)
            || len > u64::from(self.max_request)
            || offset + len > self.size()
        {
            self.calls.bad_calls.fetch_add(1, Ordering::SeqCst);
            return Err(BackendError::Invalid(format!("bad call at {offset} of {len} bytes")));
        }
        Ok(running)
    }
}

/// Counts a call as running until dropped.
struct Running<'a>(&'a Calls);

impl<'a> Running<'a> {
    fn new(calls: &'a Calls) -> Running<'a> {
        let now = calls.running.fetch_add(1, Ordering::SeqCst) + 1;
        calls.most_running.fetch_max(now, Ordering::SeqCst);
        Running(calls)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

impl NbdBackend for MemDisk {
    fn size_bytes(&self) -> u64 {
        self.size()
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

    async fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), BackendError> {
        let _running = self.enter(offset, out.len() as u64).await?;
        self.calls.reads.fetch_add(1, Ordering::SeqCst);
        if self.panicking_read_offset == Some(offset) {
            panic!("injected backend panic at offset {offset} (the test expects this message)");
        }
        if let Some(bad) = self.failing_read_offset {
            if (offset..offset + out.len() as u64).contains(&bad) {
                return Err(BackendError::Io(format!("medium error at {bad}")));
            }
        }
        let start = offset as usize;
        out.copy_from_slice(&self.data.lock().unwrap()[start..start + out.len()]);
        Ok(())
    }

    async fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), BackendError> {
        let _running = self.enter(offset, data.len() as u64).await?;
        self.calls.writes.fetch_add(1, Ordering::SeqCst);
        if fua {
            self.calls.fua_writes.fetch_add(1, Ordering::SeqCst);
        }
        let start = offset as usize;
        self.data.lock().unwrap()[start..start + data.len()].copy_from_slice(data);
        self.mark(offset, data.len() as u64, 0);
        Ok(())
    }

    async fn flush(&self) -> Result<(), BackendError> {
        let _running = self.enter(0, 0).await?;
        self.calls.flushes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn trim(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        let _running = self.enter(offset, len).await?;
        self.calls.trims.fetch_add(1, Ordering::SeqCst);
        if !self.trim_keeps_data {
            self.data.lock().unwrap()[offset as usize..(offset + len) as usize].fill(0);
            self.mark(offset, len, STATE_HOLE | STATE_ZERO);
        }
        Ok(())
    }

    async fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), BackendError> {
        let _running = self.enter(offset, len).await?;
        self.calls.write_zeroes.fetch_add(1, Ordering::SeqCst);
        self.data.lock().unwrap()[offset as usize..(offset + len) as usize].fill(0);
        self.mark(offset, len, STATE_ZERO);
        Ok(())
    }

    fn trim_reads_zeroes(&self) -> bool {
        !self.trim_keeps_data
    }

    fn can_report_allocation(&self) -> bool {
        self.reports_allocation
    }

    async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<(u64, u32)>, BackendError> {
        // Block status carries no data, so any whole-block range inside the disk is a fine
        // call, unlike the transfer size `enter` bounds.
        let _running = Running::new(&self.calls);
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        let block = u64::from(self.block);
        if len == 0 || !offset.is_multiple_of(block) || !len.is_multiple_of(block) || offset + len > self.size() {
            self.calls.bad_calls.fetch_add(1, Ordering::SeqCst);
            return Err(BackendError::Invalid(format!("bad block status at {offset} of {len} bytes")));
        }
        self.calls.block_statuses.fetch_add(1, Ordering::SeqCst);
        let allocation = self.allocation.lock().unwrap();
        let mut extents: Vec<(u64, u32)> = Vec::new();
        for &flags in &allocation[(offset / block) as usize..((offset + len) / block) as usize] {
            if let Some(last) = extents.last_mut().filter(|last| last.1 == flags) {
                last.0 += block;
            } else if extents.len() == self.max_extents {
                break;
            } else {
                extents.push((block, flags));
            }
        }
        Ok(extents)
    }
}

static NEXT_PATH: AtomicU64 = AtomicU64::new(0);

/// A fresh unix socket path in the temporary directory.
pub fn socket_path(tag: &str) -> PathBuf {
    let n = NEXT_PATH.fetch_add(1, Ordering::SeqCst);
    std::env::temp_dir().join(format!("netdam-nbd-{tag}-{}-{n}.sock", std::process::id()))
}

/// A fresh scratch file path in the temporary directory, removed when dropped (even when the
/// test fails).
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        let n = NEXT_PATH.fetch_add(1, Ordering::SeqCst);
        Scratch(std::env::temp_dir().join(format!("netdam-nbd-{tag}-{}-{n}", std::process::id())))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A server on its own runtime thread; [`TestServer::stop`] shuts it down and returns its
/// report.
pub struct TestServer {
    pub endpoint: Listen,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<io::Result<ServeReport>>>,
}

impl TestServer {
    pub fn start(listen: Listen, backend: Arc<MemDisk>, options: ExportOptions) -> TestServer {
        let listener = NbdListener::bind(&listen).expect("bind");
        let endpoint = listener.endpoint().expect("a bound endpoint");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
            runtime.block_on(serve(listener, backend, options, async {
                let _ = stopped.await;
            }))
        });
        TestServer { endpoint, stop: Some(stop), thread: Some(thread) }
    }

    /// On a fresh unix socket.
    pub fn unix(backend: Arc<MemDisk>, options: ExportOptions) -> TestServer {
        TestServer::start(Listen::Unix(socket_path("srv")), backend, options)
    }

    /// On 127.0.0.1, any port.
    pub fn tcp(backend: Arc<MemDisk>, options: ExportOptions) -> TestServer {
        TestServer::start(Listen::Tcp("127.0.0.1:0".parse().unwrap()), backend, options)
    }

    /// The NBD URI of the default export.
    pub fn uri(&self) -> String {
        self.uri_of("")
    }

    /// The NBD URI of a named export.
    pub fn uri_of(&self, name: &str) -> String {
        match &self.endpoint {
            Listen::Unix(path) => format!("nbd+unix:///{name}?socket={}", path.display()),
            Listen::Tcp(address) => format!("nbd://{address}/{name}"),
        }
    }

    /// Shuts the server down (drain included) and returns its report.
    pub fn stop(mut self) -> ServeReport {
        self.stop_inner().expect("serve returned an error")
    }

    fn stop_inner(&mut self) -> io::Result<ServeReport> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.thread.take() {
            Some(thread) => thread.join().expect("the server thread panicked"),
            None => Ok(ServeReport::default()),
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if self.thread.is_some() {
            let _ = self.stop_inner();
        }
    }
}

/// A blocking socket of either kind.
pub enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    fn set_read_timeout(&self, timeout: Option<Duration>) {
        match self {
            Stream::Unix(stream) => stream.set_read_timeout(timeout).unwrap(),
            Stream::Tcp(stream) => stream.set_read_timeout(timeout).unwrap(),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(stream) => stream.read(buf),
            Stream::Tcp(stream) => stream.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(stream) => stream.write(buf),
            Stream::Tcp(stream) => stream.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// One reply as the raw client parsed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub cookie: u64,
    /// 0 on success.
    pub error: u32,
    /// Read data (empty otherwise).
    pub data: Vec<u8>,
    /// The error message of a chunked error reply.
    pub message: String,
    /// A block status reply: the context id and its extents (length, flags).
    pub status: Option<(u32, Vec<(u64, u32)>)>,
}

impl Reply {
    fn new(cookie: u64, error: u32, data: Vec<u8>, message: String) -> Reply {
        Reply { cookie, error, data, message, status: None }
    }
}

/// A hand-driven NBD client.
pub struct RawClient {
    pub stream: Stream,
    pub style: ReplyStyle,
}

pub const TIMEOUT: Duration = Duration::from_secs(5);

impl RawClient {
    pub fn connect(endpoint: &Listen) -> RawClient {
        let stream = match endpoint {
            Listen::Unix(path) => {
                let stream = UnixStream::connect(path).expect("connect");
                stream.set_read_timeout(Some(TIMEOUT)).unwrap();
                stream.set_write_timeout(Some(TIMEOUT)).unwrap();
                Stream::Unix(stream)
            }
            Listen::Tcp(address) => {
                let stream = TcpStream::connect(address).expect("connect");
                stream.set_read_timeout(Some(TIMEOUT)).unwrap();
                stream.set_write_timeout(Some(TIMEOUT)).unwrap();
                Stream::Tcp(stream)
            }
        };
        RawClient { stream, style: ReplyStyle::Simple }
    }

    /// Connects and negotiates `style`, then GO with a block-size request. Returns the client,
    /// the export size and the transmission flags.
    pub fn negotiated(endpoint: &Listen, style: ReplyStyle) -> (RawClient, u64, u16) {
        RawClient::negotiated_with_contexts(endpoint, style, &[]).0
    }

    /// As [`RawClient::negotiated`], selecting the metadata contexts `queries` name before GO
    /// (when any); also returns the contexts selected.
    pub fn negotiated_with_contexts(
        endpoint: &Listen,
        style: ReplyStyle,
        queries: &[&str],
    ) -> ((RawClient, u64, u16), Vec<(u32, String)>) {
        let mut client = RawClient::connect(endpoint);
        client.greeting();
        client.send(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes());
        let option = match style {
            ReplyStyle::Simple => None,
            ReplyStyle::Structured => Some(OPT_STRUCTURED_REPLY),
            ReplyStyle::Extended => Some(OPT_EXTENDED_HEADERS),
        };
        if let Some(option) = option {
            client.option(option, &[]);
            assert_eq!(client.option_reply().1, REP_ACK);
        }
        let selected = if queries.is_empty() { Vec::new() } else { client.set_meta_context(queries) };
        let (size, flags) = client.go(b"", &[INFO_BLOCK_SIZE]).expect("GO succeeds");
        client.style = style;
        ((client, size, flags), selected)
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("send");
    }

    pub fn receive(&mut self, len: usize) -> Vec<u8> {
        let mut bytes = vec![0; len];
        self.stream.read_exact(&mut bytes).expect("receive");
        bytes
    }

    /// Whether nothing arrives for `wait` (the connection stays open and silent).
    pub fn nothing_within(&mut self, wait: Duration) -> bool {
        let mut byte = [0u8; 1];
        self.stream.set_read_timeout(Some(wait));
        let silent = matches!(
            self.stream.read(&mut byte),
            Err(error) if matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
        );
        self.stream.set_read_timeout(Some(TIMEOUT));
        silent
    }

    /// Reads the greeting and returns the handshake flags.
    pub fn greeting(&mut self) -> u16 {
        let greeting = self.receive(18);
        assert_eq!(greeting[..8], NBD_MAGIC.to_be_bytes());
        assert_eq!(greeting[8..16], IHAVEOPT.to_be_bytes());
        u16::from_be_bytes([greeting[16], greeting[17]])
    }

    pub fn option(&mut self, option: u32, data: &[u8]) {
        let mut bytes = Vec::new();
        OptionHeader { option, length: data.len() as u32 }.encode(&mut bytes);
        bytes.extend_from_slice(data);
        self.send(&bytes);
    }

    /// Reads one option reply: (option, reply type, payload).
    pub fn option_reply(&mut self) -> (u32, u32, Vec<u8>) {
        let head = self.receive(20);
        assert_eq!(head[..8], OPTION_REPLY_MAGIC.to_be_bytes());
        let option = u32::from_be_bytes(head[8..12].try_into().unwrap());
        let kind = u32::from_be_bytes(head[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(head[16..20].try_into().unwrap()) as usize;
        (option, kind, self.receive(len))
    }

    /// Sends `NBD_OPT_SET_META_CONTEXT` for the default export with `queries`; returns the
    /// contexts selected, as (id, name), once the server has acknowledged.
    pub fn set_meta_context(&mut self, queries: &[&str]) -> Vec<(u32, String)> {
        let mut data = 0u32.to_be_bytes().to_vec();
        data.extend((queries.len() as u32).to_be_bytes());
        for query in queries {
            data.extend((query.len() as u32).to_be_bytes());
            data.extend(query.as_bytes());
        }
        self.option(OPT_SET_META_CONTEXT, &data);
        let mut selected = Vec::new();
        loop {
            let (option, kind, payload) = self.option_reply();
            assert_eq!(option, OPT_SET_META_CONTEXT);
            match kind {
                REP_META_CONTEXT => {
                    let id = u32::from_be_bytes(payload[..4].try_into().unwrap());
                    selected.push((id, String::from_utf8(payload[4..].to_vec()).unwrap()));
                }
                REP_ACK => return selected,
                error => panic!("NBD_OPT_SET_META_CONTEXT failed with 0x{error:08x}"),
            }
        }
    }

    /// Sends GO and reads the replies: `Ok((size, flags))` on ACK, `Err(reply type)` otherwise.
    pub fn go(&mut self, name: &[u8], info: &[u16]) -> Result<(u64, u16), u32> {
        let mut data = Vec::new();
        InfoRequest { name, info_types: info.to_vec() }.encode(&mut data);
        self.option(OPT_GO, &data);
        let mut export = None;
        loop {
            let (option, kind, payload) = self.option_reply();
            assert_eq!(option, OPT_GO);
            match kind {
                REP_INFO if payload[..2] == INFO_EXPORT.to_be_bytes() => {
                    let size = u64::from_be_bytes(payload[2..10].try_into().unwrap());
                    let flags = u16::from_be_bytes(payload[10..12].try_into().unwrap());
                    export = Some((size, flags));
                }
                REP_INFO => {}
                REP_ACK => return Ok(export.expect("NBD_INFO_EXPORT before ACK")),
                error => return Err(error),
            }
        }
    }

    /// Sends one request (header and payload).
    pub fn request(&mut self, command: u16, flags: u16, cookie: u64, offset: u64, length: u64, payload: &[u8]) {
        let mut bytes = Vec::new();
        RequestHeader { flags, command, cookie, offset, length }.encode(self.style, &mut bytes);
        bytes.extend_from_slice(payload);
        self.send(&bytes);
    }

    /// Reads one reply. `read_len` is the data a successful simple reply carries (simple
    /// replies do not say).
    pub fn reply(&mut self, read_len: usize) -> Reply {
        let magic = u32::from_be_bytes(self.receive(4).try_into().unwrap());
        match magic {
            SIMPLE_REPLY_MAGIC => {
                assert_ne!(self.style, ReplyStyle::Extended, "no simple replies with extended headers");
                let rest = self.receive(12);
                let error = u32::from_be_bytes(rest[..4].try_into().unwrap());
                let cookie = u64::from_be_bytes(rest[4..12].try_into().unwrap());
                let data = if error == 0 { self.receive(read_len) } else { Vec::new() };
                Reply::new(cookie, error, data, String::new())
            }
            STRUCTURED_REPLY_MAGIC | EXTENDED_REPLY_MAGIC => {
                let extended = magic == EXTENDED_REPLY_MAGIC;
                assert_eq!(extended, self.style == ReplyStyle::Extended, "reply magic 0x{magic:08x}");
                let head = self.receive(if extended { 28 } else { 16 });
                let flags = u16::from_be_bytes([head[0], head[1]]);
                assert_eq!(flags & REPLY_FLAG_DONE, REPLY_FLAG_DONE, "each reply is one chunk");
                let kind = u16::from_be_bytes([head[2], head[3]]);
                let cookie = u64::from_be_bytes(head[4..12].try_into().unwrap());
                let len = if extended {
                    u64::from_be_bytes(head[20..28].try_into().unwrap()) as usize
                } else {
                    u32::from_be_bytes(head[12..16].try_into().unwrap()) as usize
                };
                let payload = self.receive(len);
                match kind {
                    REPLY_TYPE_NONE => Reply::new(cookie, 0, Vec::new(), String::new()),
                    REPLY_TYPE_OFFSET_DATA => Reply::new(cookie, 0, payload[8..].to_vec(), String::new()),
                    REPLY_TYPE_BLOCK_STATUS | REPLY_TYPE_BLOCK_STATUS_EXT => {
                        assert_eq!(kind == REPLY_TYPE_BLOCK_STATUS_EXT, extended, "the chunk type follows the style");
                        let context = u32::from_be_bytes(payload[..4].try_into().unwrap());
                        let extents: Vec<(u64, u32)> = if extended {
                            let count = u32::from_be_bytes(payload[4..8].try_into().unwrap()) as usize;
                            assert_eq!(payload.len(), 8 + 16 * count, "descriptor count matches the length");
                            payload[8..]
                                .chunks_exact(16)
                                .map(|d| {
                                    let flags = u64::from_be_bytes(d[8..16].try_into().unwrap());
                                    assert_eq!(flags >> 32, 0, "base:allocation flags fit 32 bits");
                                    (u64::from_be_bytes(d[..8].try_into().unwrap()), flags as u32)
                                })
                                .collect()
                        } else {
                            assert_eq!((payload.len() - 4) % 8, 0);
                            payload[4..]
                                .chunks_exact(8)
                                .map(|d| {
                                    let len = u32::from_be_bytes(d[..4].try_into().unwrap());
                                    (u64::from(len), u32::from_be_bytes(d[4..8].try_into().unwrap()))
                                })
                                .collect()
                        };
                        assert!(!extents.is_empty() && extents.iter().all(|e| e.0 > 0), "{extents:?}");
                        Reply { status: Some((context, extents)), ..Reply::new(cookie, 0, Vec::new(), String::new()) }
                    }
                    REPLY_TYPE_ERROR => {
                        let error = u32::from_be_bytes(payload[..4].try_into().unwrap());
                        let message_len = u16::from_be_bytes([payload[4], payload[5]]) as usize;
                        let message = String::from_utf8(payload[6..6 + message_len].to_vec()).unwrap();
                        Reply::new(cookie, error, Vec::new(), message)
                    }
                    other => panic!("unexpected chunk type {other}"),
                }
            }
            other => panic!("bad reply magic 0x{other:08x}"),
        }
    }

    /// Whether the server has closed the connection (end of stream or reset) — waits up to the
    /// read timeout.
    pub fn is_closed(&mut self) -> bool {
        let mut byte = [0u8; 1];
        match self.stream.read(&mut byte) {
            Ok(0) => true,
            Ok(_) => false,
            Err(error) => matches!(error.kind(), io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe),
        }
    }
}

/// Cookies of a set of replies, for order-independent checks.
pub fn cookies(replies: &[Reply]) -> BTreeSet<u64> {
    replies.iter().map(|reply| reply.cookie).collect()
}

/// A deterministic pseudo-random byte stream (xorshift), so failures reproduce.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(len);
    out
}
